/*
 * node.c: the `cumulo node` daemon. It listens, authenticates every peer
 * (cluster key, or --insecure on both ends), and serves each connection on
 * its own thread:
 *   - from the coordinator: PING (link measurement), LINKS_REQ (measure our
 *     links to the peers it names and report them), ASSIGN (load a stage),
 *     WEIGHTS_CHUNK (streamed weights), BYE/close (drop the assignment);
 *   - from the previous stage (or the coordinator as stage 0): FORWARD
 *     micro-batches, SEQ_START and SEQ_FREE, in order. A middle stage runs its
 *     layers and sends the hidden states straight to the next stage; the last
 *     stage applies the output head, samples with the sequence's sampler and
 *     sends only TOKENs (ids + logprobs) to the coordinator;
 *   - TRAIN (LoRA fine-tuning, node_train.c): SETUP, SLICE, FETCH, STEP from
 *     the coordinator; a window's FWD from the previous stage, computed and
 *     sent on, its BWD back on the same link (read by node_train.c's thread
 *     on the link to the next stage).
 * Tensor parallel (ASSIGN with tp_size > 1): the node is one member of a
 * group that computes the same layers on slices (KV heads, FFN rows). At
 * ASSIGN it dials every lower-ranked member but rank 0 (the coordinator,
 * which has no listener, dials every node itself) and greets it with its
 * rank; the accept loop hands connections that greet (cm_coll_mesh_rank_of)
 * to node.tp_in[rank], where the assignment collects them. The thread that
 * serves the coordinator's connection runs cm_forward with the all-reduce
 * over those connections (it owns them); FORWARDs of token ids come from the
 * coordinator to every member, and only rank 0 (the coordinator) samples.
 * Hybrid (ASSIGN with tp_size > 1 of a later stage): rank 0 is a node; every
 * rank dials all lower ones, and rank 0 also dials a data connection to each
 * member, on which it relays every FORWARD (the rows it decoded) and SEQ_FREE
 * before computing; members compute and stop; rank 0 sends the hidden state to
 * the next group's rank 0, or samples when its group is the last.
 * It never runs anything a peer sends but its own forward pass over the
 * assigned layers, with shapes checked against the model it loaded; it never
 * allocates in the token loop (buffers are sized at ASSIGN).
 * Liveness (issue 7): a heartbeat thread sends a HEARTBEAT every
 * CM_PIPE_HB_MS on every coordinator connection that speaks them, whatever
 * the compute threads are doing (a long forward pass, an all-reduce waiting
 * on a frozen member, a send stalled on a frozen next stage), so that only a
 * node that is really stopped, dead or cut off falls silent. Sends on
 * connections to a coordinator take csend_mu, never mu, for that reason.
 * Limits (node_guard.h): at most CM_NODE_MAX_CONNS connection threads,
 * CM_NODE_MAX_UNAUTH of them still in their handshake (4 per source address,
 * and CM_NODE_HANDSHAKE_MS to finish it): a flood of idle or junk connections is
 * refused (logged with the address) instead of costing a thread each, and
 * one flooding address cannot take the slots a coordinator needs.
 * Ownership (issue 19, node_lease.c): one coordinator at a time, under a lease.
 * Loading a stage for an ASSIGN (finding or fetching the weights, the model,
 * its buffers and the group's links) is node_stage.c's.
 */
#include "cluster/mdns.h"
#include "cluster/node_impl.h"
#include "model/lora.h"

#include "os/os.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NODE_RECV_MS 500

/* One connection thread. Joinable: the node's state lives on cm_node_run's
 * stack, so cm_node_run joins every one before it returns. */
typedef struct conn_job {
    node *n;
    cm_conn *c;
    int src; /* index into n->src */
    pthread_t th;
    atomic_bool done;
    struct conn_job *next;
} conn_job;

/* Expert parallelism (model.h's cm_expert_gather_fn): rank r's rows are the
 * run of its experts [bounds[r], bounds[r+1]) (rows are grouped by expert,
 * ranges follow the ranks), so the exchange is an all-gather of runs. */
static int ep_gather(void *user, float *y, int64_t row_len, const int32_t *rows, int n_expert) {
    stage *s = user;
    if (s->holders) /* replicated experts: this rank's runs, packed (ep_gather.c) */
        return cm_ep_gather_holders(s->coll, s->as.tp_rank, s->as.tp_size, s->holders, y, row_len, rows, n_expert,
                                    &s->pack, NULL, 0);
    int64_t part[CM_COLL_MAX_MEMBERS + 1];
    for (int r = 0; r <= (int)s->as.tp_size; r++) {
        int e = s->as.expert_bounds[r];
        if (e > n_expert) return CM_EINVAL; /* checked at ASSIGN */
        part[r] = (int64_t)rows[e] * row_len;
    }
    return cm_coll_allgather(s->coll, y, part, NULL, 0);
}

/* A split output head (CM_ASSIGN_F_HEAD; model.h's cm_head_gather_fn): our
 * vocabulary rows of each logits row go to rank 0, one gather per row. We
 * know only our own range; the parts before it are empty to us. */
static int head_gather(void *user, float *logits, int n_out) {
    stage *s = user;
    int k = (int)s->as.tp_size, r = (int)s->as.tp_rank, v0, v1;
    cm_slice_head_rows(&s->m, s->slice, &v0, &v1);
    int64_t part[CM_COLL_MAX_MEMBERS + 1];
    for (int j = 0; j <= k; j++) part[j] = j == 0 ? 0 : j <= r ? v0 : v1;
    for (int i = 0; i < n_out; i++) {
        int rc = cm_coll_gather(s->coll, logits + (size_t)i * (size_t)s->m.hp.n_vocab, part, 0, NULL, 0);
        if (rc) return rc;
    }
    return 0;
}

void cm_node_report_error(stage *s, int code, const char *text) {
    cm_msg m = {.type = CM_MSG_ERROR};
    m.u.error.code = code < 0 ? code : CM_EIO;
    snprintf(m.u.error.text, sizeof m.u.error.text, "%s", text);
    char e[200];
    pthread_mutex_lock(s->csend_mu);
    cm_conn_send(s->coord, &m, 5000, e, sizeof e);
    pthread_mutex_unlock(s->csend_mu);
}

/* FORWARD on a stage (n->mu held). */
static int on_forward(stage *s, const cm_msg_forward *f, char *err, size_t errlen) {
    const cm_hparams *hp = &s->m.hp;
    bool last = s->as.flags & CM_ASSIGN_F_OUTPUT;
    if (f->epoch != s->as.epoch)
        return cm_errf(err, errlen, CM_ESTATE, "FORWARD of epoch %llu (current %llu)", (unsigned long long)f->epoch,
                       (unsigned long long)s->as.epoch);
    bool embed = s->as.flags & CM_ASSIGN_F_EMBED;
    if (embed != (f->dtype == CM_HIDDEN_TOKENS) || (!embed && (int)f->dim != hp->n_embd) || f->n_tokens > CM_BATCH_MAX)
        return cm_errf(err, errlen, CM_EINVAL,
                       "FORWARD of %u x %u (dtype %u) does not fit this stage (dim %d, batch %d)", f->n_tokens, f->dim,
                       f->dtype, hp->n_embd, CM_BATCH_MAX);
    int n = (int)f->n_tokens, n_want = 0;
    for (int i = 0; i < n; i++) {
        s->pos[i] = cm_msg_forward_pos(f, (uint32_t)i);
        s->seq[i] = cm_msg_forward_seq(f, (uint32_t)i);
        s->want[i] = (int8_t)cm_msg_forward_want(f, (uint32_t)i);
        s->want_u8[i] = (uint8_t)s->want[i];
        n_want += s->want[i];
        if (s->seq[i] >= s->n_seq) return cm_errf(err, errlen, CM_EINVAL, "sequence %d out of %d", s->seq[i], s->n_seq);
        if (s->pos[i] >= s->kv[s->seq[i]].n_ctx)
            return cm_errf(err, errlen, CM_ENOSPACE, "position %d past the context", s->pos[i]);
        if (embed) {
            s->tok[i] = cm_msg_forward_token(f, (uint32_t)i);
            if (s->tok[i] < 0 || s->tok[i] >= hp->n_vocab)
                return cm_errf(err, errlen, CM_EINVAL, "token id %d", s->tok[i]);
        } else cm_msg_forward_row(f, (uint32_t)i, s->in + (size_t)i * (size_t)hp->n_embd);
    }
    if (s->as.tp_rank != 0) last = false; /* the group's rank 0 applies the head and samples */
    /* A member of a group that splits the head: our rows of it, for rank 0 */
    bool head_part = (s->as.flags & CM_ASSIGN_F_HEAD) && s->as.tp_rank != 0 && s->coll;
    if (s->relay[1]) { /* hybrid: rank 0 relays the hidden states to its members (same floats) */
        cm_msg m = {.type = CM_MSG_FORWARD};
        m.u.forward = (cm_msg_forward){.epoch = f->epoch,
                                       .request_id = f->request_id,
                                       .n_tokens = f->n_tokens,
                                       .dim = (uint32_t)hp->n_embd,
                                       .dtype = CM_HIDDEN_F32,
                                       .pos = s->pos,
                                       .seq = s->seq,
                                       .want = s->want_u8,
                                       .hidden = s->in};
        char e2[300];
        for (int j = 1; j < (int)s->as.tp_size; j++) {
            int rc = cm_conn_send(s->relay[j], &m, 30000, e2, sizeof e2);
            if (rc) return cm_errf(err, errlen, rc, "to rank %d of this group: %s", j, e2);
        }
    }
    /* Rows of the head: sampled (TOKEN) or sent back as logits (OUTPUT); hidden rows go back as they are. */
    int8_t head[CM_BATCH_MAX];
    bool any_hidden = false;
    for (int i = 0; i < n; i++) {
        head[i] = (int8_t)(s->want[i] == CM_WANT_TOKEN || s->want[i] == CM_WANT_LOGITS);
        any_hidden |= s->want[i] == CM_WANT_HIDDEN;
        if (last && s->want[i] == CM_WANT_TOKEN && !s->smp[s->seq[i]])
            return cm_errf(err, errlen, CM_ESTATE, "sequence %d samples before its SEQ_START", s->seq[i]);
    }
    /* A sequence's first position in the batch may go back (prefix reuse on
     * the coordinator): drop the tail of its cache. */
    for (int i = 0; i < n; i++) {
        bool first = true;
        for (int j = 0; j < i; j++)
            if (s->seq[j] == s->seq[i]) first = false;
        if (!first) continue;
        cm_kv *kv = &s->kv[s->seq[i]];
        if (s->pos[i] < kv->n_past) cm_kv_truncate(kv, s->pos[i]);
        if (s->pos[i] != kv->n_past)
            return cm_errf(err, errlen, CM_EINVAL, "sequence %d jumps from position %d to %d", s->seq[i], kv->n_past,
                           s->pos[i]);
    }
    cm_batch b = {.n = n,
                  .embd = embed ? NULL : s->in,
                  .tokens = embed ? s->tok : NULL,
                  .pos = s->pos,
                  .seq = s->seq,
                  .logits = head};
    cm_forward_args fa = {.layer_first = (int)s->as.layer_begin,
                          .layer_last = (int)s->as.layer_end,
                          .slice = s->slice,
                          .kvs = s->kvp,
                          .n_kvs = s->n_seq,
                          .allreduce = s->coll ? cm_coll_allreduce_cb : NULL,
                          .allreduce_user = s->coll,
                          .experts = s->experts,
                          .expert_gather = s->coll ? ep_gather : NULL,
                          .expert_gather_user = s,
                          .expert_holders = s->holders,
                          .expert_rank = s->as.tp_rank,
                          .out_hidden =
                              (last && any_hidden) || (!last && s->as.tp_rank == 0 && s->next) ? s->out : NULL,
                          .out_logits = (last || head_part) && n_want ? s->logits : NULL,
                          .head_gather = head_part ? head_gather : NULL,
                          .head_gather_user = s,
                          .lora_scales = s->lora_row};
    if (head_part) cm_slice_head_rows(&s->m, s->slice, &fa.head_v0, &fa.head_v1);
    char e[300];
    int rc = cm_forward(s->ctx, &b, &fa, e, sizeof e);
    if (rc && s->coll && *cm_coll_error(s->coll))
        return cm_errf(err, errlen, rc, "forward pass: %s (all-reduce: %s)", e, cm_coll_error(s->coll));
    if (rc) return cm_errf(err, errlen, rc, "forward pass: %s", e);
    s->rows += (uint64_t)n;
    if (s->as.tp_rank != 0) return 0; /* a TP member: its group's rank 0 goes on */
    if (!last) {
        cm_msg m = {.type = CM_MSG_FORWARD};
        m.u.forward = (cm_msg_forward){.epoch = f->epoch,
                                       .request_id = f->request_id,
                                       .n_tokens = f->n_tokens,
                                       .dim = f->dim,
                                       .dtype = s->as.hidden_dtype,
                                       .pos = s->pos,
                                       .seq = s->seq,
                                       .want = s->want_u8,
                                       .hidden = s->out};
        rc = cm_conn_send(s->next, &m, 30000, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "to the next stage: %s", e);
        return 0;
    }
    if (any_hidden && (rc = cm_node_send_hidden(s->coord, s->csend_mu, f, s->want, s->pos, s->seq, s->out, n,
                                                hp->n_embd, e, sizeof e)))
        return cm_errf(err, errlen, rc, "to the coordinator: %s", e);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!head[i]) continue;
        if (s->want[i] == CM_WANT_LOGITS) { /* the coordinator samples (under a grammar) */
            cm_msg m = {.type = CM_MSG_OUTPUT};
            m.u.output = (cm_msg_output){.epoch = f->epoch,
                                         .request_id = f->request_id,
                                         .seq = s->seq[i],
                                         .kind = CM_OUTPUT_LOGITS,
                                         .n_rows = 1,
                                         .dim = (uint32_t)hp->n_vocab,
                                         .pos = &s->pos[i],
                                         .data = s->logits + (size_t)k++ * (size_t)hp->n_vocab};
            pthread_mutex_lock(s->csend_mu);
            rc = cm_conn_send(s->coord, &m, 30000, e, sizeof e);
            pthread_mutex_unlock(s->csend_mu);
            if (rc) return cm_errf(err, errlen, rc, "to the coordinator: %s", e);
            continue;
        }
        cm_sampler *smp = s->smp[s->seq[i]];
        cm_sample_info info;
        int32_t id = cm_sampler_sample(smp, s->logits + (size_t)k++ * (size_t)hp->n_vocab, &info);
        cm_sampler_accept(smp, id);
        cm_msg m = {.type = CM_MSG_TOKEN};
        cm_msg_token *t = &m.u.token;
        t->epoch = f->epoch;
        t->request_id = f->request_id;
        t->seq = s->seq[i];
        t->pos = s->pos[i];
        t->token = id;
        t->logprob = info.logprob <= 0 ? info.logprob : 0;
        int nt = info.n_top < CM_MSG_MAX_TOP ? info.n_top : CM_MSG_MAX_TOP;
        t->n_top = (uint8_t)(nt > 0 ? nt : 0);
        for (int j = 0; j < t->n_top; j++) {
            t->top_token[j] = info.top[j].id;
            t->top_logprob[j] = info.top[j].logprob <= 0 ? info.top[j].logprob : 0;
        }
        pthread_mutex_lock(s->csend_mu);
        rc = cm_conn_send(s->coord, &m, 30000, e, sizeof e);
        pthread_mutex_unlock(s->csend_mu);
        if (rc) return cm_errf(err, errlen, rc, "to the coordinator: %s", e);
    }
    return 0;
}

static int on_seq_start(stage *s, const cm_msg *msg, char *err, size_t errlen) {
    const cm_msg_seq_start *q = &msg->u.seq_start;
    if (q->epoch != s->as.epoch) return 0; /* stale: ignore */
    if (q->seq >= s->n_seq) return cm_errf(err, errlen, CM_EINVAL, "sequence %d out of %d", q->seq, s->n_seq);
    if (s->as.tp_rank != 0) return 0; /* TP member: its group's rank 0 samples */
    if (!(s->as.flags & CM_ASSIGN_F_OUTPUT)) {
        char e[200];
        int rc = cm_conn_send(s->next, msg, 30000, e, sizeof e);
        return rc ? cm_errf(err, errlen, rc, "to the next stage: %s", e) : 0;
    }
    cm_sampler_params p;
    cm_sampler_params_default(&p);
    p.temperature = q->temperature;
    p.top_k = q->top_k;
    p.top_p = q->top_p;
    p.min_p = q->min_p;
    p.repeat_penalty = q->repeat_penalty;
    p.repeat_last_n = q->repeat_last_n;
    p.presence_penalty = q->presence_penalty;
    p.frequency_penalty = q->frequency_penalty;
    p.seed = q->seed;
    p.n_probs = q->n_probs;
    char e[200];
    if (cm_sampler_params_check(&p, e, sizeof e)) return cm_errf(err, errlen, CM_EINVAL, "SEQ_START: %s", e);
    /* NEEDSWORK: this allocates per request (the sampler); a pool of samplers
     * sized at ASSIGN would avoid it. */
    cm_sampler *smp = cm_sampler_new(&p, s->m.hp.n_vocab, e, sizeof e);
    if (!smp) return cm_errf(err, errlen, CM_ENOMEM, "sampler: %s", e);
    for (uint32_t i = 0; i < q->n_hist; i++) cm_sampler_accept(smp, cm_msg_seq_start_hist(q, i));
    /* A restart after a re-plan: draw on from where the lost last stage was
     * (the draws are counter-based), so a seeded stream continues as if
     * nothing had happened. */
    cm_sampler_set_pos(smp, q->n_sampled);
    cm_sampler_free(s->smp[q->seq]);
    s->smp[q->seq] = smp;
    return 0;
}

/* Pass a sequence message on: to this group's members (hybrid: rank 0 relays) and the next stage. */
static int pass_on(stage *s, const cm_msg *msg, char *err, size_t errlen) {
    char e[200];
    int rc;
    for (int j = 1; j < CM_COLL_MAX_MEMBERS; j++)
        if (s->relay[j] && (rc = cm_conn_send(s->relay[j], msg, 30000, e, sizeof e)))
            return cm_errf(err, errlen, rc, "to rank %d of this group: %s", j, e);
    if (s->next && (rc = cm_conn_send(s->next, msg, 30000, e, sizeof e)))
        return cm_errf(err, errlen, rc, "to the next stage: %s", e);
    return 0;
}

/* SEQ_LORA: the sequence's LoRA scales for its rows from now on (every
 * stage: each applies them to its layers' parts; lora.h cm_lora_apply_rows). */
static int on_seq_lora(stage *s, const cm_msg *msg, char *err, size_t errlen) {
    const cm_msg_seq_lora *q = &msg->u.seq_lora;
    if (q->epoch != s->as.epoch) return 0; /* stale: ignore */
    if (q->seq >= s->n_seq) return cm_errf(err, errlen, CM_EINVAL, "sequence %d out of %d", q->seq, s->n_seq);
    const int na = cm_lora_count(s->lora);
    if ((int)q->n != na) return cm_errf(err, errlen, CM_EINVAL, "SEQ_LORA of %u scales for %d adapters", q->n, na);
    if (na && !cm_lora_rows_ok(s->lora))
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "SEQ_LORA: this stage's LoRA parts carry final scales only");
    if (na && !s->lora_sc) { /* once per stage, at its first per-request adapters */
        s->lora_sc = cm_calloc((size_t)s->n_seq * (size_t)na, sizeof *s->lora_sc);
        s->lora_row = cm_calloc((size_t)s->n_seq, sizeof *s->lora_row);
        if (!s->lora_sc || !s->lora_row) {
            cm_free(s->lora_sc);
            cm_free((void *)s->lora_row);
            s->lora_sc = NULL;
            s->lora_row = NULL;
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        }
    }
    if (na) {
        float *row = s->lora_sc + (size_t)q->seq * (size_t)na;
        memcpy(row, q->scale, (size_t)na * sizeof *row);
        s->lora_row[q->seq] = row;
    }
    return pass_on(s, msg, err, errlen);
}

static int on_seq_free(stage *s, const cm_msg *msg, char *err, size_t errlen) {
    const cm_msg_seq_free *q = &msg->u.seq_free;
    int rc0;
    if (q->epoch != s->as.epoch || q->seq >= s->n_seq) return 0;
    cm_kv_truncate(&s->kv[q->seq], 0);
    cm_sampler_free(s->smp[q->seq]);
    s->smp[q->seq] = NULL;
    if (s->lora_row) s->lora_row[q->seq] = NULL; /* back to the loaded scales */
    char e[200];
    for (int j = 1; j < CM_COLL_MAX_MEMBERS; j++) /* hybrid: this group's members */
        if (s->relay[j] && (rc0 = cm_conn_send(s->relay[j], msg, 30000, e, sizeof e)))
            return cm_errf(err, errlen, rc0, "to rank %d of this group: %s", j, e);
    if (s->next) {
        int rc = cm_conn_send(s->next, msg, 30000, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "to the next stage: %s", e);
    }
    return 0;
}

/* The lease (node_lease.c) decides whether coordinator peer may assign:
 * false after a refusal (READY with CM_EBUSY and the reason). When it takes
 * the node over from another coordinator, that one's stage goes at once (its
 * coordinator was told and re-plans). */
static bool lease_assign(node *n, cm_conn *c, const cm_msg_hello *peer, const cm_msg_assign *a) {
    char why[CM_MSG_TEXT_MAX + 1];
    bool took = false;
    if (cm_node_lease_assign(&n->lease, &n->hello, peer, c, a, &took, why, sizeof why)) {
        fprintf(stderr, "cumulo node '%s': refused coordinator '%s' (%s): %s\n", n->hello.name, peer->name,
                cm_conn_peer(c), why);
        cm_node_send_ready(n, c, a->epoch, CM_EBUSY, 0, why);
        return false;
    }
    if (took) {
        pthread_mutex_lock(&n->mu);
        stage *old = n->st;
        n->st = NULL;
        atomic_store(&n->epoch, 0);
        pthread_mutex_unlock(&n->mu);
        cm_node_stage_free(old);
    }
    return true;
}

/* This thread's CPU time (CUMULO_TP_TRACE's breakdown); 0 where there is none. */
/* Test hook (CUMULO_TEST_OPEN_FAIL, tests/sh/cluster_open.sh): at its first
 * ASSIGN this node exits (as kill -9 would) or stops itself (as SIGSTOP
 * would), so that a test loses it while the cluster opens, at that point,
 * without timing a kill. */
static void open_fail_hook(node *n) {
    static atomic_bool fired;
    const char *how = cm_config_get()->test_open_fail;
    if (!how || atomic_exchange(&fired, true)) return;
    bool stop = !strcmp(how, "stop");
    fprintf(stderr, "cumulo node '%s': test hook: %s at the first ASSIGN\n", n->hello.name,
            stop ? "stopping (SIGSTOP)" : "exiting");
    fflush(NULL);
    if (stop) raise(SIGSTOP);
    else _exit(9);
}

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void conn_serve(node *n, cm_conn *c, int src) {
    char err[512];
    cm_msg_hello peer, mine = n->hello;
    cm_node_lease_hello(&n->lease, &mine); /* a coordinator sees whom this node serves before it plans */
    int rc = cm_conn_handshake(c, false, &n->cfg, &mine, &peer, err, sizeof err);
    cm_node_limits_authenticated(&n->lim, src);
    if (rc) {
        CM_LOGW("refused %s: %s", cm_conn_peer(c), err);
        cm_conn_close(c, NULL);
        return;
    }
    bool is_coord = peer.roles & CM_ROLE_COORDINATOR;
    CM_LOGI("%s '%s' connected from %s", is_coord ? "coordinator" : "peer", peer.name, cm_conn_peer(c));
    bool assigned_here = false;
    uint8_t *pong = NULL;
    uint64_t spin_ns = (uint64_t)cm_coll_link_spin_us(c) * 1000u, spin_until = 0;
    while (!atomic_load(n->stop)) {
        cm_msg m;
        /* A tensor-parallel member on a fast link: rank 0's next FORWARD
         * follows its sampling by well under a millisecond; polling for it
         * saves a scheduler wake-up per token (cm_coll_link_spin_us). */
        while (spin_until && cm_now_ns() < spin_until && cm_fd_wait_readable(cm_conn_fd(c), 0) <= 0) cm_thread_yield();
        spin_until = 0;
        /* Idle waits are short (to notice the stop flag); once a frame
         * starts, a slow link gets a generous deadline for the rest. */
        if (cm_fd_wait_readable(cm_conn_fd(c), NODE_RECV_MS) <= 0) continue;
        rc = cm_conn_recv(c, &m, CM_PIPE_DATA_MS, err, sizeof err);
        if (rc == CM_ETIMEDOUT) continue;
        if (rc) break;
        if (m.type == CM_MSG_BYE) break;
        if (is_coord) cm_node_lease_renew(&n->lease, &peer);
        switch (m.type) {
        case CM_MSG_PING: {
            int tr = cm_coll_mesh_rank_of(&m);
            if (tr >= 0) {
                /* A TP member greets, then names the plan's epoch (so an
                 * assignment of an older plan, still waiting, cannot take
                 * it): the connection now belongs to the assignment of that
                 * epoch (tp_connect takes it); this thread leaves. */
                cm_msg em;
                rc = cm_conn_recv(c, &em, 10000, err, sizeof err);
                if (!rc && (em.type != CM_MSG_PING || em.u.ping.data_len))
                    rc = cm_errf(err, sizeof err, CM_EPROTO, "%s after the tensor-parallel greeting",
                                 cm_msg_type_name(em.type));
                if (rc) {
                    CM_LOGW("tensor-parallel peer %s: %s", cm_conn_peer(c), err);
                    break;
                }
                /* Logged while c is still ours: once in tp_in, a stage may
                 * take it and close it (free its peer name) at any time. */
                CM_LOGI("tensor-parallel rank %d connected from %s", tr, cm_conn_peer(c));
                pthread_mutex_lock(&n->mu);
                cm_conn *old = n->tp_in[tr];
                n->tp_in[tr] = c;
                n->tp_in_epoch[tr] = em.u.ping.id;
                pthread_mutex_unlock(&n->mu);
                if (old) cm_conn_close(old, "replaced by a newer tensor-parallel connection");
                cm_free(pong);
                return;
            }
            cm_msg r = {.type = CM_MSG_PONG};
            r.u.ping.id = m.u.ping.id;
            r.u.ping.sent_ns = m.u.ping.sent_ns;
            r.u.ping.data_len = m.u.ping.reply_len;
            if (m.u.ping.reply_len) {
                cm_free(pong);
                pong = cm_calloc(1, m.u.ping.reply_len);
                if (!pong) r.u.ping.data_len = 0;
            }
            r.u.ping.data = pong;
            pthread_mutex_lock(&n->csend_mu);
            rc = cm_conn_send(c, &r, 30000, err, sizeof err);
            pthread_mutex_unlock(&n->csend_mu);
            break;
        }
        case CM_MSG_HEARTBEAT: {
            /* Echo: the coordinator declares a silent node lost (coord.c).
             * A peer that sends heartbeats gets ours from now on too. */
            if (is_coord) cm_node_hb_add(&n->hb, c);
            cm_msg r = {.type = CM_MSG_HEARTBEAT};
            r.u.heartbeat = m.u.heartbeat;
            r.u.heartbeat.epoch = atomic_load(&n->epoch);
            pthread_mutex_lock(&n->csend_mu);
            rc = cm_conn_send(c, &r, 5000, err, sizeof err);
            pthread_mutex_unlock(&n->csend_mu);
            break;
        }
        case CM_MSG_LINKS_REQ: {
            /* Measure our links to the peers named (bounded by the
             * request's deadline) and report them: the coordinator plans
             * with node to node links, `cumulo nodes` shows them. Any
             * authenticated peer may ask; it costs a few pings. */
            cm_msg r = {.type = CM_MSG_LINKS};
            cm_cluster_links_measure(&n->cfg, &n->hello, &m.u.links_req, &r.u.links);
            pthread_mutex_lock(&n->csend_mu);
            rc = cm_conn_send(c, &r, 5000, err, sizeof err);
            pthread_mutex_unlock(&n->csend_mu);
            break;
        }
        case CM_MSG_ASSIGN:
            if (!is_coord) {
                CM_LOGW("ASSIGN from %s, which is not a coordinator: ignored", cm_conn_peer(c));
                break;
            }
            if (!lease_assign(n, c, &peer, &m.u.assign)) break; /* another coordinator's node: refused */
            open_fail_hook(n);
            /* Our own heartbeats start now, not at the coordinator's first
             * one: that can wait behind a busy data path, and a member whose
             * only traffic is tokens would fall silent with its group. */
            cm_node_hb_add(&n->hb, c);
            cm_node_on_assign(n, c, &m.u.assign);
            cm_node_lease_loaded(&n->lease);
            assigned_here = true;
            break;
        case CM_MSG_TRAIN: cm_node_on_train(n, c, is_coord, &m.u.train); break; /* node_train.c */
        case CM_MSG_FORWARD:
        case CM_MSG_SEQ_START:
        case CM_MSG_SEQ_LORA:
        case CM_MSG_SEQ_FREE: {
            pthread_mutex_lock(&n->mu);
            stage *s = n->st;
            int r2 = 0;
            err[0] = 0;
            if (!s) r2 = cm_errf(err, sizeof err, CM_ESTATE, "%s without an assignment", cm_msg_type_name(m.type));
            else if (m.type == CM_MSG_FORWARD && m.u.forward.epoch != s->as.epoch) {
                /* A stale plan's traffic: dropped, and not reported to the
                 * current coordinator (it is not about its sequences). */
                CM_LOGW("FORWARD of epoch %llu from %s dropped (current epoch %llu)",
                        (unsigned long long)m.u.forward.epoch, cm_conn_peer(c), (unsigned long long)s->as.epoch);
            } else if (m.type == CM_MSG_FORWARD) {
                uint64_t t0 = cm_now_ns(), c0 = thread_cpu_ns();
                if (m.u.forward.n_tokens == 1 && s->fwd1_end_ns) s->gap1_ns += t0 - s->fwd1_end_ns, s->n_gap1++;
                s->fwd1_end_ns = 0;
                r2 = on_forward(s, &m.u.forward, err, sizeof err);
                if (!r2) { /* telemetry: the heartbeats report rows/s and time per row */
                    uint64_t dt = cm_now_ns() - t0;
                    atomic_fetch_add(&n->hb.rows, m.u.forward.n_tokens);
                    atomic_fetch_add(&n->hb.busy_ns, dt);
                    s->fwd_ns += dt;
                    if (m.u.forward.n_tokens == 1)
                        s->fwd1_ns += dt, s->n_fwd1++, s->fwd1_cpu_ns += thread_cpu_ns() - c0,
                            s->fwd1_end_ns = cm_now_ns();
                    if (s->coll && spin_ns) spin_until = cm_now_ns() + spin_ns;
                    cm_node_expert_report(s); /* a later stage's routing, for the coordinator (node_ep.c) */
                }
            } else if (m.type == CM_MSG_SEQ_START) r2 = on_seq_start(s, &m, err, sizeof err);
            else if (m.type == CM_MSG_SEQ_LORA) r2 = on_seq_lora(s, &m, err, sizeof err);
            else r2 = on_seq_free(s, &m, err, sizeof err);
            if (r2) {
                CM_LOGW("%s from %s failed: %s", cm_msg_type_name(m.type), cm_conn_peer(c), err);
                if (m.type == CM_MSG_FORWARD) cm_node_gpu_after_error(n); /* a lost GPU: no report, the node leaves */
                if (s) cm_node_report_error(s, r2, err);
            }
            pthread_mutex_unlock(&n->mu);
            break;
        }
        default: CM_LOGW("unexpected %s from %s: ignored", cm_msg_type_name(m.type), cm_conn_peer(c)); break;
        }
        if (rc) break;
    }
    cm_free(pong);
    cm_node_lease_conn_end(&n->lease, c); /* at once: a coordinator that starts right after may dial now */
    if (assigned_here) {
        /* The coordinator is gone: the plan it made is over. */
        pthread_mutex_lock(&n->mu);
        stage *s = n->st;
        if (s && s->coord == c) {
            n->st = NULL;
            atomic_store(&n->epoch, 0);
        } else s = NULL;
        pthread_mutex_unlock(&n->mu);
        if (s) CM_LOGI("coordinator left: dropping stage of epoch %llu", (unsigned long long)s->as.epoch);
        cm_node_stage_free(s);
    }
    pthread_mutex_lock(&n->bsend_mu); /* no training BWD goes back on c from now on (node_train.c) */
    if (n->bwd_to == c) n->bwd_to = NULL;
    pthread_mutex_unlock(&n->bsend_mu);
    CM_LOGI("%s disconnected", cm_conn_peer(c));
    cm_node_hb_remove(&n->hb, c);
    cm_conn_close(c, atomic_load(n->stop) ? "node shutting down" : NULL);
}

static void *conn_main(void *arg) {
    conn_job *j = arg;
    conn_serve(j->n, j->c, j->src);
    cm_node_limits_put(&j->n->lim, j->src);
    atomic_store(&j->done, true);
    return NULL;
}

/* Join the connection threads that ended (all: every one, waiting for those
 * still running; they leave within a receive deadline of the stop flag). */
static void reap_jobs(node *n, bool all) {
    for (conn_job **pj = &n->jobs; *pj;) {
        conn_job *j = *pj;
        if (!all && !atomic_load(&j->done)) {
            pj = &j->next;
            continue;
        }
        pthread_join(j->th, NULL);
        *pj = j->next;
        cm_free(j);
    }
}

static void join_peers(node *n) {
    for (int i = 0; i < n->o->n_join; i++) {
        cm_conn *c;
        cm_msg_hello peer;
        char err[300];
        double rtt = 0, bw = 0;
        int rc = cm_cluster_dial(n->o->join[i], &n->cfg, &n->hello, &c, &peer, err, sizeof err);
        if (!rc) {
            rc = cm_cluster_measure(c, CM_LINKS_PROBE_BYTES, &rtt, &bw, err, sizeof err);
            cm_conn_close(c, "link check done");
        }
        if (rc) CM_LOGW("peer %s: %s", n->o->join[i], err);
        else CM_LOGI("peer %s ('%s'): rtt %.3f ms, %.1f MB/s", n->o->join[i], peer.name, rtt * 1e3, bw / 1e6);
    }
}

/* The heartbeat thread's beat: the expert counts a stage routed since its
 * last FORWARD's report (idle now), unless a FORWARD holds the stage. */
static void hb_tick(void *user) {
    node *n = user;
    if (pthread_mutex_trylock(&n->mu)) return;
    if (n->st) cm_node_expert_report(n->st);
    pthread_mutex_unlock(&n->mu);
}

int cm_node_run(const cm_node_opts *o, atomic_int *stop, char *err, size_t errlen) {
    node n = {.o = o, .stop = stop};
    pthread_mutex_init(&n.mu, NULL);
    int rc = cm_cluster_net_cfg(&n.cfg, o->insecure, o->key_file, err, errlen);
    if (rc) {
        pthread_mutex_destroy(&n.mu);
        return rc;
    }
    n.cfg.handshake_ms = CM_NODE_HANDSHAKE_MS; /* an idle (slowloris) connection holds its slot this long at most */
    pthread_mutex_init(&n.csend_mu, NULL);
    pthread_mutex_init(&n.bsend_mu, NULL);
    cm_node_limits_init(&n.lim);
    cm_node_lease_init(&n.lease, &n.csend_mu);
    if (o->cache_dir && *o->cache_dir) snprintf(n.cache_dir, sizeof n.cache_dir, "%s", o->cache_dir);
    else {
        const char *home = cm_config_get()->home;
        snprintf(n.cache_dir, sizeof n.cache_dir, "%s/.cache/cumulo", home ? home : ".");
    }
    cm_listener *l;
    rc = cm_net_listen(o->bind, o->port, &l, err, errlen);
    if (rc) return rc;
    uint16_t port = cm_listener_port(l);
    cm_cluster_hello(&n.hello, o->name, port, CM_ROLE_NODE);
    cm_node_gpu_open(&n); /* --gpu: the device, measured, in the HELLO */
    cm_node_caps caps;
    cm_node_caps_get(&caps);

    fprintf(
        stderr,
        "cumulo node '%s' listening on port %u (%s; %d cores, %s, %.1f GFLOP/s, %.1f GB/s%s, %.1f of %.1f GiB free)\n",
        n.hello.name, port, cm_sec_mode_name(n.cfg.mode), caps.cores, caps.isa, caps.gflops, caps.mem_bw / 1e9,
        caps.declared ? " declared" : "", (double)caps.mem_free / (1 << 30), (double)caps.mem_total / (1 << 30));
    if (o->port_file && *o->port_file) {
        char buf[16];
        int k = snprintf(buf, sizeof buf, "%u\n", port);
        if (cm_file_write_atomic(o->port_file, buf, (size_t)k, 0644, err, errlen)) CM_LOGW("%s", err);
    }
    join_peers(&n);
    n.hb.send_mu = &n.csend_mu;
    n.hb.tick = hb_tick;
    n.hb.tick_user = &n;
    n.hb.epoch = &n.epoch;
    n.hb.stop = stop;
    if (cm_node_hb_start(&n.hb))
        CM_LOGW("cannot start the heartbeat thread: coordinators will see this node only while it is idle");
    cm_mdns *md = NULL;
    if (o->mdns) {
        char id[2 * CM_NODE_ID_BYTES + 1], caps_txt[4][160];
        for (int i = 0; i < CM_NODE_ID_BYTES; i++) snprintf(id + 2 * i, 3, "%02x", n.hello.node_id[i]);
        snprintf(caps_txt[0], sizeof caps_txt[0], "cores=%d", caps.cores);
        snprintf(caps_txt[1], sizeof caps_txt[1], "mem=%llu", (unsigned long long)caps.mem_free);
        snprintf(caps_txt[2], sizeof caps_txt[2], "isa=%s", caps.isa);
        snprintf(caps_txt[3], sizeof caps_txt[3], "sec=%s", n.cfg.mode == CM_SEC_INSECURE ? "insecure" : "key");
        cm_mdns_service svc = {.name = n.hello.name,
                               .port = port,
                               .node_id = id,
                               .proto_version = CM_PROTO_VERSION,
                               .txt_extra = {caps_txt[0], caps_txt[1], caps_txt[2], caps_txt[3]},
                               .n_txt_extra = 4};
        char e[300];
        if (cm_mdns_open(&md, NULL, e, sizeof e) || cm_mdns_announce(md, &svc, e, sizeof e)) {
            CM_LOGW("mDNS announcement off: %s", e);
            cm_mdns_close(md);
            md = NULL;
        }
    }
    while (!atomic_load(stop)) {
        reap_jobs(&n, false);
        if (md) cm_mdns_step(md, 0);
        cm_conn *c;
        char e[300];
        rc = cm_listener_accept(l, md ? 100 : 250, &c, e, sizeof e);
        if (rc == CM_ETIMEDOUT) continue;
        if (rc) {
            CM_LOGW("accept: %s", e);
            cm_sleep_ms(50);
            continue;
        }
        char host[64], why[160];
        cm_conn_peer_host(c, host, sizeof host);
        int src = cm_node_limits_take(&n.lim, host, why, sizeof why);
        if (src < 0) {
            cm_node_limits_refused(&n.lim, cm_conn_peer(c), why);
            cm_conn_close(c, NULL);
            continue;
        }
        conn_job *j = cm_calloc(1, sizeof *j);
        if (j) {
            j->n = &n;
            j->c = c;
            j->src = src;
        }
        if (!j || cm_thread_create(&j->th, conn_main, j)) {
            cm_free(j);
            cm_node_limits_authenticated(&n.lim, src);
            cm_node_limits_put(&n.lim, src);
            cm_node_limits_refused(&n.lim, cm_conn_peer(c), "cannot start a thread");
            cm_conn_close(c, NULL);
            continue;
        }
        j->next = n.jobs;
        n.jobs = j;
    }
    /* Every connection thread sees the stop flag and leaves (each waits at
     * most one receive deadline); none may outlive the state on this stack. */
    reap_jobs(&n, true);
    cm_node_hb_join(&n.hb);
    cm_mdns_close(md);
    cm_listener_close(l);
    pthread_mutex_lock(&n.mu);
    stage *s = n.st;
    n.st = NULL;
    pthread_mutex_unlock(&n.mu);
    cm_node_stage_free(s);
    cm_node_gpu_close(&n);
    cm_coll_mesh_close(n.tp_in, CM_COLL_MAX_MEMBERS);
    pthread_mutex_destroy(&n.mu);
    pthread_mutex_destroy(&n.csend_mu);
    pthread_mutex_destroy(&n.bsend_mu);
    cm_node_limits_release(&n.lim);
    cm_node_lease_release(&n.lease);
    return 0;
}
