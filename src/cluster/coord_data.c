/*
 * coord_data.c: the coordinator's data path once a plan runs. Sequence
 * messages (SEQ_START, FORWARD, SEQ_FREE) about one sequence travel down
 * one chain of connections, so every stage sees them in the order they
 * were sent: to stage 1 on the data connection (stages pass hidden states on
 * directly) and, when this machine's stage is a group, to its other members
 * on their control connections (token ids: each embeds them itself, then
 * the members meet in the all-reduces). The token the last stage sampled
 * comes back on its control connection (coord.c's receiver thread) into the
 * sequence's slot. Nothing here allocates per token or waits without a
 * deadline; it reads the running plan (p->plan) only under send_mu or while
 * the caller is the pipe's only user.
 */
#include "cluster/coord_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cm_pipe_seq_acquire(cm_pipe *p, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    int got = CM_EBUSY;
    for (int i = 0; i < p->n_seq; i++)
        if (!p->slots[i].used) {
            p->slots[i] = (slot){.used = true};
            got = i;
            break;
        }
    pthread_mutex_unlock(&p->mu);
    if (got < 0) cm_errf(err, errlen, CM_EBUSY, "all %d cluster sequences are in use", p->n_seq);
    return got;
}

int cm_coord_send_data(cm_pipe *p, const cm_msg *m, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    int fatal = p->fatal;
    if (fatal) cm_errf(err, errlen, fatal, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    if (fatal) return fatal;
    /* Every member of the group gets every sequence message; nodes that are
     * connected but not in it (back or joined, a re-plan not taken) none. */
    if (p->plan.n_stages == 1) return cm_coord_send_group0(p, m, err, errlen); /* one group of every machine */
    if (m->type == CM_MSG_SEQ_FREE ||
        m->type == CM_MSG_SEQ_LORA) { /* hybrid: stage 0's members hold the sequence too */
        int rc = cm_coord_send_group0(p, m, err, errlen);
        if (rc) return rc;
    }
    int rc = cm_conn_send(p->data, m, p->timeout_ms, err, errlen);
    if (rc) cm_coord_fatal(p, rc, "stage 1: %s", err);
    return rc;
}

void cm_pipe_seq_release(cm_pipe *p, int slot_i) {
    if (slot_i < 0 || slot_i >= p->n_seq) return;
    cm_msg m = {.type = CM_MSG_SEQ_FREE};
    m.u.seq_free = (cm_msg_seq_free){.epoch = p->epoch, .request_id = 0, .seq = slot_i};
    char e[300];
    pthread_mutex_lock(&p->send_mu);
    cm_coord_send_data(p, &m, e, sizeof e);
    pthread_mutex_unlock(&p->send_mu);
    pthread_mutex_lock(&p->mu);
    p->slots[slot_i].used = false;
    pthread_mutex_unlock(&p->mu);
}

int cm_pipe_seq_start(cm_pipe *p, int slot_i, const cm_sampler_params *sp, const int32_t *hist, int n_hist,
                      uint64_t n_sampled, char *err, size_t errlen) {
    cm_msg m = {.type = CM_MSG_SEQ_START};
    cm_msg_seq_start *q = &m.u.seq_start;
    int keep = sp->repeat_last_n > 0 ? CM_MIN(sp->repeat_last_n, (int)CM_MSG_MAX_HIST) : 0;
    if (n_hist > keep) {
        hist += n_hist - keep;
        n_hist = keep;
    }
    *q = (cm_msg_seq_start){.epoch = p->epoch,
                            .seq = slot_i,
                            .temperature = sp->temperature,
                            .top_k = sp->top_k,
                            .top_p = sp->top_p,
                            .min_p = sp->min_p,
                            .repeat_penalty = sp->repeat_penalty,
                            .repeat_last_n = sp->repeat_last_n,
                            .presence_penalty = sp->presence_penalty,
                            .frequency_penalty = sp->frequency_penalty,
                            .seed = sp->seed,
                            .n_sampled = n_sampled,
                            .n_probs = (uint8_t)CM_MIN(sp->n_probs > 0 ? sp->n_probs : 0, CM_MSG_MAX_TOP),
                            .n_hist = (uint32_t)n_hist,
                            .hist = hist};
    pthread_mutex_lock(&p->send_mu);
    int rc = cm_coord_send_data(p, &m, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

/* One FORWARD of n rows down the pipe (the caller holds send_mu). */
static int send_forward(cm_pipe *p, const int32_t *seq, const uint8_t *want, const float *hidden, const int32_t *pos,
                        int n, char *err, size_t errlen) {
    cm_msg m = {.type = CM_MSG_FORWARD};
    m.u.forward = (cm_msg_forward){.epoch = p->epoch,
                                   .request_id = ++p->next_req,
                                   .n_tokens = (uint32_t)n,
                                   .dim = (uint32_t)p->m->hp.n_embd,
                                   .dtype = CM_HIDDEN_F32,
                                   .pos = pos,
                                   .seq = seq,
                                   .want = want,
                                   .hidden = hidden};
    int rc = cm_coord_send_data(p, &m, err, errlen);
    if (!rc) p->rows_sent += (uint64_t)n;
    return rc;
}

int cm_pipe_send(cm_pipe *p, int slot_i, const float *hidden, const int32_t *pos, int n, int want, char *err,
                 size_t errlen) {
    if (n < 1 || n > (int)sizeof p->wantbuf) return cm_errf(err, errlen, CM_EINVAL, "micro-batch of %d rows", n);
    pthread_mutex_lock(&p->send_mu);
    for (int i = 0; i < n; i++) {
        p->seqbuf[i] = slot_i;
        p->wantbuf[i] = (uint8_t)(want == CM_WANT_HIDDEN || i == n - 1 ? want : CM_WANT_NONE);
    }
    if (want == CM_WANT_TOKEN) {
        pthread_mutex_lock(&p->mu);
        p->slots[slot_i].asked++;
        pthread_mutex_unlock(&p->mu);
    }
    int rc = send_forward(p, p->seqbuf, p->wantbuf, hidden, pos, n, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

int cm_pipe_send_rows(cm_pipe *p, const int32_t *slots, const float *hidden, const int32_t *pos, const uint8_t *want,
                      int n, char *err, size_t errlen) {
    if (n < 1 || n > (int)sizeof p->wantbuf) return cm_errf(err, errlen, CM_EINVAL, "micro-batch of %d rows", n);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= p->n_seq || want[i] >= CM_WANT_COUNT)
            return cm_errf(err, errlen, CM_EINVAL, "row %d: slot %d, want %u", i, slots[i], want[i]);
    pthread_mutex_lock(&p->send_mu);
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < n; i++)
        if (want[i] == CM_WANT_TOKEN) p->slots[slots[i]].asked++;
    pthread_mutex_unlock(&p->mu);
    int rc = send_forward(p, slots, want, hidden, pos, n, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

/* One turn of a wait for the last stage's data, p->mu held: the pipe's
 * failure, or past the deadline a failure of the pipe itself (what: "token",
 * "rows"), or up to 50 ms of waiting for a broadcast. 0: look again. */
int cm_coord_wait_data(cm_pipe *p, uint64_t deadline, const char *what, char *err, size_t errlen) {
    if (p->fatal) return cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
    if (cm_now_ns() > deadline) {
        /* Every node answers its heartbeats, yet nothing comes: a link
         * between two stages is cut (TCP retries it for many minutes and
         * nobody notices) or a stage is stuck. Fail the pipe, so that
         * the caller re-plans (fresh connections everywhere) or ends its
         * requests with this reason, instead of each waiting in turn. */
        pthread_mutex_unlock(&p->mu);
        cm_coord_fatal(p, CM_ETIMEDOUT, "no %s from the last stage within %d ms (a link between stages may be cut)",
                       what, p->timeout_ms);
        pthread_mutex_lock(&p->mu);
        return cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
    }
    cm_coord_wait_tick(p);
    return 0;
}

void cm_coord_wait_tick(cm_pipe *p) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
}

int cm_pipe_recv_token(cm_pipe *p, int slot_i, int32_t *token, float *logprob, char *err, size_t errlen) {
    uint64_t deadline = cm_now_ns() + (uint64_t)p->timeout_ms * 1000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    slot *s = &p->slots[slot_i];
    while (!rc && s->got < s->asked) rc = cm_coord_wait_data(p, deadline, "token", err, errlen);
    if (!rc) {
        *token = s->token;
        if (logprob) *logprob = s->logprob;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int cm_pipe_members(const cm_pipe *p, cm_cluster_member *out, int max) {
    cm_pipe *q = (cm_pipe *)p; /* the lock, not the record, changes */
    pthread_mutex_lock(&q->info_mu);
    int n = p->n_members;
    uint64_t now = cm_now_ns();
    for (int i = 0; i < n && i < max; i++) {
        out[i] = p->members[i];
        cm_cluster_member *mb = &out[i];
        if (mb->local) continue;
        for (int k = 0; k < p->n_remote; k++) { /* the node's live telemetry (its latest heartbeat) */
            const remote *r = &p->r[k];
            if (strcmp(r->addr, mb->addr)) continue;
            snprintf(mb->host, sizeof mb->host, "%s", r->hello.host);
            if (!r->stats_ns || now - r->stats_ns > 5000000000ull) break;
            mb->live = true;
            mb->live_age_s = (double)(now - r->stats_ns) / 1e9;
            mb->live_mem_used = r->stats.mem_used;
            mb->live_cpu_load = r->stats.cpu_load;
            mb->live_power_w = r->stats.power_w;
            snprintf(mb->live_power_source, sizeof mb->live_power_source, "%s", cm_power_src_name(r->stats.power_src));
            mb->live_tok_s = r->stats.tok_s;
            mb->live_ms_per_tok = r->stats.ms_per_tok;
            break;
        }
    }
    pthread_mutex_unlock(&q->info_mu);
    return n;
}

void cm_pipe_hop_stats(const cm_pipe *p, uint64_t *bytes, uint64_t *frames, uint64_t *rows) {
    cm_conn_stats st = {0};
    if (!p->data) {
        *bytes = *frames = 0;
        *rows = p->rows_sent;
        return;
    }
    cm_conn_get_stats(p->data, CM_MSG_FORWARD, &st);
    *bytes = st.tx_bytes;
    *frames = st.tx_frames;
    *rows = p->rows_sent;
}

int cm_coord_send_group0(cm_pipe *p, const cm_msg *m, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    int fatal = p->fatal;
    if (fatal) cm_errf(err, errlen, fatal, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    if (fatal) return fatal;
    for (int k = 1; k < p->plan.stages[0].n_members; k++) {
        remote *rm = cm_coord_member(p, 0, k);
        int rc = cm_conn_send(rm->ctl, m, p->timeout_ms, err, errlen);
        if (rc) {
            cm_coord_fatal(p, rc, "node %s: %s", rm->addr, err);
            return rc;
        }
    }
    return 0;
}

int cm_pipe_last_top(cm_pipe *p, int slot_i, int32_t *ids, float *logprobs, int max) {
    if (slot_i < 0 || slot_i >= p->n_seq) return 0;
    pthread_mutex_lock(&p->mu);
    int n = CM_MIN(p->slots[slot_i].n_top, max);
    for (int i = 0; i < n; i++) {
        ids[i] = p->slots[slot_i].top_id[i];
        logprobs[i] = p->slots[slot_i].top_lp[i];
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

bool cm_pipe_samples_here(const cm_pipe *p) { return p && p->samples_here; }
int cm_pipe_tp_size(const cm_pipe *p) { return p->plan.stages[0].n_members; }
cm_slice cm_pipe_tp_slice(const cm_pipe *p) {
    const cm_plan_member *m0 = &p->plan.stages[0].members[0];
    return (cm_slice){m0->kv_head_begin, m0->kv_head_end, m0->ffn_begin, m0->ffn_end};
}

static cm_expert_slice pipe_ep_experts(const cm_pipe *p) {
    const cm_plan_stage *st0 = &p->plan.stages[0];
    cm_expert_slice x = {false, 0, 0};
    if (st0->ep && st0->n_members > 1) { /* expert group: whole layers, our experts */
        x.ep = true;
        x.e0 = st0->members[0].expert_begin;
        x.e1 = st0->members[0].expert_end;
    }
    return x;
}

/* Expert parallelism (model.h's cm_expert_gather_fn): the rows of member k's
 * experts are one contiguous run (experts are ranges in member order and
 * rows are grouped by expert), so the exchange is an all-gather of runs. */
static int pipe_ep_exchange(cm_pipe *p, float *y, int64_t row_len, const int32_t *rows, int n_expert) {
    const cm_plan_stage *st0 = &p->plan.stages[0];
    char e[300];
    if (p->ep_holders && cm_coord_ep_holders(p)) { /* replicated experts: our runs, packed (ep_gather.c) */
        int rc = cm_ep_gather_holders(p->coll, 0, st0->n_members, p->ep_holders, y, row_len, rows, n_expert,
                                      &p->ep_pack, e, sizeof e);
        if (rc) cm_coord_fatal(p, rc, "expert exchange of this machine's group: %s", e);
        return rc;
    }
    int64_t part[CM_COLL_MAX_MEMBERS + 1];
    part[0] = 0;
    for (int k = 0; k < st0->n_members; k++) {
        int e1 = st0->members[k].expert_end;
        if (e1 > n_expert || (k && st0->members[k].expert_begin != st0->members[k - 1].expert_end)) {
            cm_coord_fatal(p, CM_EINVAL, "expert ranges of the plan do not tile the model's %d experts", n_expert);
            return CM_EINVAL;
        }
        part[k + 1] = (int64_t)rows[e1] * row_len;
    }
    int rc = cm_coll_allgather(p->coll, y, part, e, sizeof e);
    if (rc) cm_coord_fatal(p, rc, "expert exchange of this machine's group: %s", e);
    return rc;
}
/* The exchange, counted over every plan for /metrics (what the collective
 * itself counted as sent: its stats go with it at a plan change). */
static int pipe_ep_gather(void *user, float *y, int64_t row_len, const int32_t *rows, int n_expert) {
    cm_pipe *p = user;
    cm_coll_stats before, after;
    cm_coll_stats_get(p->coll, &before);
    int rc = pipe_ep_exchange(p, y, row_len, rows, n_expert);
    cm_coll_stats_get(p->coll, &after);
    atomic_fetch_add(&p->ep_sent, after.gather_data_sent - before.gather_data_sent);
    return rc;
}
/* A failed all-reduce (a member lost mid-operation) fails the pipe at once,
 * so that the caller sees cm_pipe_failed and re-plans, rather than racing the
 * receiver thread that notices the closed connection. */
static int tp_allreduce(void *user, float *x, int64_t n) {
    cm_pipe *p = user;
    int rc = cm_coll_allreduce_cb(p->coll, x, n);
    if (rc) cm_coord_fatal(p, rc, "all-reduce of this machine's group: %s", cm_coll_error(p->coll));
    return rc;
}

bool cm_pipe_plan_head_split(const cm_plan *plan) {
    /* CUMULO_TP_HEAD_SPLIT=0: rank 0 computes the whole head (a benchmark's baseline) */
    const bool off = cm_config_get()->tp_head_split_off;
    const cm_plan_stage *st = &plan->stages[0];
    return !off && plan->n_stages == 1 && st->n_members > 1 && !st->ep;
}

/* The split head (model.h's cm_head_gather_fn): member k's logits of each
 * row are vocabulary rows [v_k, v_k+1) (cm_slice_head_rows of its slice);
 * rank 0 receives them, one gather per row. */
static int tp_head_gather(void *user, float *logits, int n_out) {
    cm_pipe *p = user;
    const cm_plan_stage *st0 = &p->plan.stages[0];
    int64_t part[CM_COLL_MAX_MEMBERS + 1];
    part[0] = 0;
    for (int k = 0; k < st0->n_members; k++) {
        const cm_plan_member *mb = &st0->members[k];
        int v0, v1;
        cm_slice_head_rows(p->m, (cm_slice){mb->kv_head_begin, mb->kv_head_end, mb->ffn_begin, mb->ffn_end}, &v0, &v1);
        part[k + 1] = v1;
    }
    char e[300];
    for (int r = 0; r < n_out; r++) {
        int rc = cm_coll_gather(p->coll, logits + (size_t)r * (size_t)p->m->hp.n_vocab, part, 0, e, sizeof e);
        if (rc) {
            cm_coord_fatal(p, rc, "output head exchange of this machine's group: %s", e);
            return rc;
        }
    }
    if (n_out == 1) p->tr_gather_end_ns = cm_now_ns();
    return 0;
}

/* Send n token ids at pos[], sequence slots seq[], to the other members of
 * this machine's group; with a split head, rows whose logits we need
 * (logits[], NULL: the last row) are marked CM_WANT_LOGITS. */
static int tp_send(cm_pipe *p, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n, bool head,
                   const int8_t *logits, char *err, size_t errlen) {
    if (n < 1 || n > (int)sizeof p->wantbuf) return cm_errf(err, errlen, CM_EINVAL, "micro-batch of %d rows", n);
    pthread_mutex_lock(&p->send_mu);
    memset(p->wantbuf, 0, (size_t)n);
    for (int i = 0; head && i < n; i++) p->wantbuf[i] = (logits ? logits[i] : i == n - 1) ? CM_WANT_LOGITS : 0;
    cm_msg m = {.type = CM_MSG_FORWARD};
    m.u.forward = (cm_msg_forward){.epoch = p->epoch,
                                   .request_id = ++p->next_req,
                                   .n_tokens = (uint32_t)n,
                                   .dim = 0,
                                   .dtype = CM_HIDDEN_TOKENS,
                                   .pos = pos,
                                   .seq = seq,
                                   .want = p->wantbuf,
                                   .tokens = tokens};
    int rc = cm_coord_send_group0(p, &m, err, errlen);
    if (!rc && n == 1 && p->tr_gather_end_ns) p->tr_turn_ns += cm_now_ns() - p->tr_gather_end_ns, p->tr_turns++;
    p->tr_gather_end_ns = 0;
    if (!rc && p->plan.n_stages == 1)
        p->rows_sent += (uint64_t)n; /* hybrid: rows_sent counts the hidden rows to stage 1 */
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

int cm_pipe_stage0(cm_pipe *p, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                   const int8_t *logits, cm_forward_args *a, char *err, size_t errlen) {
    int k = p->plan.stages[0].n_members;
    a->allreduce = NULL;
    a->allreduce_user = NULL;
    a->experts = (cm_expert_slice){false, 0, 0};
    a->expert_gather = NULL;
    a->expert_gather_user = NULL;
    a->expert_holders = NULL;
    a->head_gather = NULL;
    a->head_gather_user = NULL;
    if (k == 1 && p->plan.n_stages > 1) return 0; /* a pipeline's stage 0: whole layers, alone */
    bool head = a->out_logits && cm_pipe_plan_head_split(&p->plan);
    int rc = tp_send(p, tokens, pos, slots, n, head, logits, err, errlen);
    if (rc || k == 1) return rc; /* (one group, every member lost: every slice here) */
    a->allreduce = tp_allreduce;
    a->allreduce_user = p;
    if (head) { /* our rows of the head; the members send theirs (cm_forward calls the gather) */
        cm_slice_head_rows(p->m, cm_pipe_tp_slice(p), &a->head_v0, &a->head_v1);
        a->head_gather = tp_head_gather;
        a->head_gather_user = p;
    }
    a->experts = pipe_ep_experts(p); /* an expert group: our experts, and the gather */
    if (a->experts.ep) atomic_fetch_add(&p->ep_rows, (uint64_t)n);
    a->expert_gather = pipe_ep_gather;
    a->expert_gather_user = p;
    a->expert_holders = a->experts.ep ? cm_coord_ep_holders(p) : NULL; /* hot-expert replicas (coord_ep.c) */
    a->expert_rank = 0;
    return 0;
}

void cm_pipe_tp_stats(const cm_pipe *p, uint64_t *data_sent, uint64_t *wire_sent, uint64_t *ops, uint64_t *rows) {
    cm_coll_stats st = {0};
    if (p->coll) cm_coll_stats_get(p->coll, &st);
    *data_sent = st.total.data_sent;
    *wire_sent = st.total.wire_sent;
    *ops = st.ops;
    *rows = p->rows_sent;
}
