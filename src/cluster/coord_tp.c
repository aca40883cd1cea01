/*
 * coord_tp.c: the coordinator's side of one tensor-parallel group of every
 * machine (issue 5). This machine is rank 0: it assigns each node its rank
 * and slice of every layer, dials each node's rank connection, waits for
 * READY and builds the all-reduce. Afterwards every micro-batch is sent to
 * every member as token ids (each member embeds them itself) and the
 * members meet in the all-reduces.
 */
#include "cluster/coord_impl.h"

#include <stdio.h>
#include <string.h>

/* One TP group of every machine, this machine rank 0 (members[0]): ASSIGN
 * each node its rank and slice, dial and greet every node, wait for READY,
 * make the all-reduce. */
int cm_coord_tp_open(cm_pipe *p, const cm_plan *plan, char *err, size_t errlen) {
    const cm_plan_stage *st = &plan->stages[0];
    const cm_hparams *hp = &p->m->hp;
    int k = st->n_members;
    if (st->members[0].node != 0 || k > CM_COLL_MAX_MEMBERS || k > (int)CM_MSG_MAX_TP)
        return cm_errf(err, errlen, CM_EINVAL, "the tensor-parallel group must start on this machine (and have at most %d members)",
                       CM_COLL_MAX_MEMBERS);
    p->tp = true;
    p->tp_size = k;
    const cm_plan_member *m0 = &st->members[0];
    p->tp_slice = (cm_slice){m0->kv_head_begin, m0->kv_head_end, m0->ffn_begin, m0->ffn_end};
    cm_coord_start_rx(p);
    for (int r = 1; r < k; r++) {
        const cm_plan_member *mb = &st->members[r];
        remote *rm = &p->r[mb->node - 1];
        cm_msg msg = {.type = CM_MSG_ASSIGN};
        cm_msg_assign *a = &msg.u.assign;
        a->epoch = p->epoch;
        memcpy(a->model_sha256, p->sha, 32);
        const char *base = strrchr(p->model_path, '/');
        snprintf(a->model_name, sizeof a->model_name, "%.63s", base ? base + 1 : p->model_path);
        a->n_layers = (uint32_t)hp->n_layer;
        a->layer_begin = 0;
        a->layer_end = (uint32_t)hp->n_layer;
        a->flags = CM_ASSIGN_F_EMBED | CM_ASSIGN_F_OUTPUT;
        a->head_begin = (uint32_t)mb->kv_head_begin;
        a->head_end = (uint32_t)mb->kv_head_end;
        a->ffn_begin = (uint32_t)mb->ffn_begin;
        a->ffn_end = (uint32_t)mb->ffn_end;
        a->n_ctx = (uint32_t)p->n_ctx;
        a->n_seq_max = (uint32_t)p->n_seq;
        a->stage = 0;
        a->n_stages = 1;
        a->hidden_dtype = CM_HIDDEN_F32;
        a->tp_rank = (uint8_t)r;
        a->tp_size = (uint8_t)k;
        snprintf(a->tp_peers[0], sizeof a->tp_peers[0], "%s", "coordinator");
        for (int j = 1; j < k; j++)
            snprintf(a->tp_peers[j], sizeof a->tp_peers[j], "%.63s", p->r[st->members[j].node - 1].addr);
        pthread_mutex_lock(&p->send_mu);
        int rc = cm_conn_send(rm->ctl, &msg, 10000, err, errlen);
        pthread_mutex_unlock(&p->send_mu);
        if (rc) return rc;
    }
    for (int r = 1; r < k; r++) {
        remote *rm = &p->r[st->members[r].node - 1];
        char e[400];
        cm_msg_hello peer;
        int rc = cm_cluster_dial(rm->addr, &p->cfg, &p->hello, &p->tp_conn[r], &peer, e, sizeof e);
        if (!rc) rc = cm_coll_mesh_greet(p->tp_conn[r], 0, 10000, e, sizeof e);
        if (!rc) rc = cm_tp_greet_epoch(p->tp_conn[r], p->epoch, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "tensor-parallel rank %d at %s: %s", r, rm->addr, e);
    }
    uint64_t deadline = cm_now_ns() + 600ull * 1000000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int waiting = 0;
        for (int r = 1; r < k; r++) {
            remote *rm = &p->r[st->members[r].node - 1];
            if (!rm->ready) waiting++;
            else if (rm->ready_status && !rc)
                rc = cm_errf(err, errlen, rm->ready_status, "node %s ('%s') cannot take rank %d: %s", rm->addr,
                             rm->hello.name, r, rm->ready_text);
        }
        if (p->fatal && !rc) rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
        if (rc || !waiting) break;
        if (cm_now_ns() > deadline) { rc = cm_errf(err, errlen, CM_ETIMEDOUT, "nodes were not ready within 600 s"); break; }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    cm_coll_cfg cc = {.rank = 0, .size = k, .max_n = (int64_t)p->max_batch * hp->n_embd, .timeout_ms = 60000,
                      .epoch = p->epoch};
    for (int r = 1; r < k; r++) cc.peers[r] = p->tp_conn[r];
    char e[300];
    rc = cm_coll_new(&cc, &p->coll, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "all-reduce: %s", e);
    cm_coord_log(p, "tensor parallel: %d members, this machine rank 0 with KV heads [%d, %d) and FFN rows [%d, %d)", k,
         p->tp_slice.h0, p->tp_slice.h1, p->tp_slice.f0, p->tp_slice.f1);
    return 0;
}

bool cm_pipe_is_tp(const cm_pipe *p) { return p && p->tp; }
int cm_pipe_tp_size(const cm_pipe *p) { return p->tp ? p->tp_size : 1; }
cm_slice cm_pipe_tp_slice(const cm_pipe *p) { return p->tp_slice; }
void *cm_pipe_tp_coll(const cm_pipe *p) { return p->coll; }
int cm_pipe_tp_allreduce(void *coll, float *x, int64_t n) { return cm_coll_allreduce_cb(coll, x, n); }

int cm_pipe_tp_send(cm_pipe *p, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n, char *err,
                    size_t errlen) {
    if (n < 1 || n > (int)sizeof p->wantbuf) return cm_errf(err, errlen, CM_EINVAL, "micro-batch of %d rows", n);
    pthread_mutex_lock(&p->send_mu);
    memset(p->wantbuf, 0, (size_t)n);
    cm_msg m = {.type = CM_MSG_FORWARD};
    m.u.forward = (cm_msg_forward){.epoch = p->epoch, .request_id = ++p->next_req, .n_tokens = (uint32_t)n, .dim = 0,
                                   .dtype = CM_HIDDEN_TOKENS, .pos = pos, .seq = seq, .want = p->wantbuf,
                                   .tokens = tokens};
    int rc = cm_coord_send_data(p, &m, err, errlen);
    if (!rc) p->rows_sent += (uint64_t)n;
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

void cm_pipe_tp_stats(const cm_pipe *p, uint64_t *data_sent, uint64_t *wire_sent, uint64_t *ops, uint64_t *rows) {
    cm_coll_stats st = {0};
    if (p->coll) cm_coll_stats_get(p->coll, &st);
    *data_sent = st.total.data_sent;
    *wire_sent = st.total.wire_sent;
    *ops = st.ops;
    *rows = p->rows_sent;
}

