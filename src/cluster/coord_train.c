/*
 * coord_train.c: the coordinator's side of pipeline-parallel LoRA training
 * (train_pipe.h; TRAIN in docs/PROTOCOL.md). One request at a time: the
 * caller names the buffer the answer goes to, sends, and waits; the
 * receiver thread of the node (coord.c) hands a ROWS or SLICE whose id is
 * the one awaited to cm_coord_on_train, which copies it under p->mu. The
 * waits are the pipe's: a node lost, a node's ERROR or the deadline fail
 * the pipe and the run with the reason. Never allocates per window.
 */
#include "cluster/coord_impl.h"
#include "cluster/train_pipe.h"

#include <stdio.h>
#include <string.h>

typedef struct twin {
    int32_t *tok, *tgt; /* [n_ctx] */
    int T;
    float weight, dropout;
    uint64_t key;
} twin;

struct cm_train_pipe {
    cm_pipe *p;
    const cm_model *m;
    int n_ctx, n_stages;
    int64_t E;
    int first[CM_PLAN_MAX_NODES], last[CM_PLAN_MAX_NODES]; /* stage s: layers [first, last) */
    remote *node[CM_PLAN_MAX_NODES];                       /* stage s >= 1 */
    size_t off[CM_PLAN_MAX_NODES], n[CM_PLAN_MAX_NODES];   /* stage s's span in the whole adapter */
    cm_pool *pool;
    cm_tadapter *ad0; /* this machine's slice, layers [0, last[0]) */
    cm_trainer *tr0;
    float *x; /* [n_ctx][E]: rows on their way down or up */
    cm_train_exec ex;
    twin *q; /* the step's backward windows, queued until the flush */
    int n_q, cap_q;
    cm_train_saved sv[2]; /* stage 0's state of this window and of the next */
    uint64_t next_id;
    uint64_t sent, received;
    /* the answer awaited, under p->mu */
    uint64_t want_id;
    float *buf;
    size_t cap;
    bool got;
    uint32_t rows, nt;
    double loss;
    uint64_t key;
};

void cm_coord_on_train(cm_pipe *p, remote *r, const cm_msg_train *q) {
    if (q->epoch != atomic_load(&p->epoch)) return;
    pthread_mutex_lock(&p->mu);
    cm_train_pipe *t = p->train;
    const size_t n = (size_t)q->n_rows * q->dim;
    if (!t || !t->want_id || q->id != t->want_id || t->got) {
        pthread_mutex_unlock(&p->mu);
        CM_LOGW("TRAIN answer %llu from %s that nobody awaits: dropped", (unsigned long long)q->id, r->addr);
        return;
    }
    if ((q->op != CM_TRAIN_ROWS && q->op != CM_TRAIN_SLICE) || n > t->cap) {
        pthread_mutex_unlock(&p->mu);
        cm_coord_fatal(p, CM_EPROTO, "node %s answered training with op %u of %zu floats (room for %zu)", r->addr,
                       q->op, n, t->cap);
        return;
    }
    cm_msg_train_get(q, t->buf);
    t->rows = q->n_rows;
    t->nt = q->n_targets;
    t->loss = q->loss;
    t->key = q->key;
    t->received += n * 4;
    t->got = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Send q to stage s's node; with buf, wait for its answer (into buf, up to
 * cap floats), calling meanwhile (when not NULL) once it is sent. A
 * failure fails the pipe. */
static int ask_ex(cm_train_pipe *t, int s, cm_msg *m, float *buf, size_t cap, void (*meanwhile)(void *), void *ctx,
                  char *err, size_t errlen) {
    cm_pipe *p = t->p;
    remote *r = t->node[s];
    m->u.train.epoch = atomic_load(&p->epoch);
    m->u.train.id = ++t->next_id;
    pthread_mutex_lock(&p->mu);
    int rc = p->fatal ? cm_errf(err, errlen, p->fatal, "%s", p->fatal_text) : 0;
    t->want_id = buf ? m->u.train.id : 0;
    t->buf = buf;
    t->cap = cap;
    t->got = false;
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    pthread_mutex_lock(&p->send_mu);
    rc = cm_conn_send(r->ctl, m, CM_PIPE_DATA_MS, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    if (rc) {
        cm_coord_fatal(p, rc, "node %s: %s", r->addr, err);
        return rc;
    }
    t->sent += (uint64_t)m->u.train.n_rows * m->u.train.dim * 4;
    if (!buf) return 0;
    if (meanwhile) meanwhile(ctx);
    /* A node's stage of a big model may compute for long; its heartbeats
     * show it alive meanwhile, so the bound is the loading one. */
    const uint64_t deadline = cm_now_ns() + (uint64_t)CM_PIPE_LOAD_MS * 1000000ull;
    pthread_mutex_lock(&p->mu);
    while (!rc && !t->got) rc = cm_coord_wait_data(p, deadline, "training rows", err, errlen);
    t->want_id = 0;
    t->buf = NULL;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static int ask(cm_train_pipe *t, int s, cm_msg *m, float *buf, size_t cap, char *err, size_t errlen) {
    return ask_ex(t, s, m, buf, cap, NULL, NULL, err, errlen);
}

enum { N_STATE = CM_TRAIN_VEC_G }; /* the vectors a slice's state is: W, M1, M2 */

static float *vec_of(const cm_tadapter *ad, unsigned v) {
    return v == CM_TRAIN_VEC_W ? ad->w : v == CM_TRAIN_VEC_M1 ? ad->m1 : v == CM_TRAIN_VEC_M2 ? ad->m2 : ad->g;
}

static int tp_load(void *user, const cm_tadapter *ad, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    for (int s = 0; s < t->n_stages; s++) cm_tadapter_span(ad, t->first[s], t->last[s], &t->off[s], &t->n[s]);
    if (!t->ad0) {
        int rc = cm_tadapter_new_range(&t->ad0, t->m, ad->rank, ad->alpha, ad->targets, 0, t->last[0], err, errlen);
        if (!rc) rc = cm_trainer_new_range(&t->tr0, t->m, t->ad0, 0, t->last[0], t->n_ctx, t->pool, err, errlen);
        for (int i = 0; !rc && i < 2; i++)
            if (!(t->sv[i].xs = cm_malloc(cm_train_saved_floats(t->tr0) * sizeof(float))))
                rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        if (rc) return rc;
    }
    CM_ASSERT(t->ad0->n_params == t->n[0] && t->off[0] == 0);
    for (unsigned v = 0; v < N_STATE; v++) memcpy(vec_of(t->ad0, v), vec_of(ad, v), t->n[0] * sizeof(float));
    t->ad0->step = ad->step;
    for (int s = 1; s < t->n_stages; s++) {
        cm_msg m = {.type = CM_MSG_TRAIN};
        m.u.train = (cm_msg_train){.op = CM_TRAIN_SETUP,
                                   .rank = (uint32_t)ad->rank,
                                   .targets = ad->targets,
                                   .n_ctx = (uint32_t)t->n_ctx,
                                   .key = (uint64_t)ad->step};
        m.u.train.f[0] = ad->alpha;
        int rc = ask(t, s, &m, NULL, 0, err, errlen);
        for (unsigned v = 0; !rc && v < N_STATE; v++)
            for (size_t o = 0; !rc && o < t->n[s]; o += CM_MSG_MAX_TRAIN_SLICE) {
                const size_t k = t->n[s] - o < CM_MSG_MAX_TRAIN_SLICE ? t->n[s] - o : CM_MSG_MAX_TRAIN_SLICE;
                m.u.train = (cm_msg_train){.op = CM_TRAIN_SLICE,
                                           .vec = (uint8_t)v,
                                           .n_rows = 1,
                                           .dim = (uint32_t)k,
                                           .offset = o,
                                           .key = (uint64_t)ad->step,
                                           .data = vec_of(ad, v) + t->off[s] + o};
                rc = ask(t, s, &m, NULL, 0, err, errlen);
            }
        if (rc) return rc;
    }
    return 0;
}

static int tp_gather(void *user, cm_tadapter *ad, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    for (unsigned v = 0; v < N_STATE; v++) memcpy(vec_of(ad, v), vec_of(t->ad0, v), t->n[0] * sizeof(float));
    ad->step = t->ad0->step;
    for (int s = 1; s < t->n_stages; s++)
        for (unsigned v = 0; v < N_STATE; v++)
            for (size_t o = 0; o < t->n[s]; o += CM_MSG_MAX_TRAIN_SLICE) {
                const size_t k = t->n[s] - o < CM_MSG_MAX_TRAIN_SLICE ? t->n[s] - o : CM_MSG_MAX_TRAIN_SLICE;
                cm_msg m = {.type = CM_MSG_TRAIN};
                m.u.train = (cm_msg_train){.op = CM_TRAIN_FETCH, .vec = (uint8_t)v, .dim = (uint32_t)k, .offset = o};
                int rc = ask(t, s, &m, vec_of(ad, v) + t->off[s] + o, k, err, errlen);
                if (rc) return rc;
                if (t->rows != 1 || t->key != (uint64_t)ad->step)
                    return cm_errf(err, errlen, CM_EPROTO, "stage %d's slice is at step %llu, this machine's at %lld",
                                   s, (unsigned long long)t->key, (long long)ad->step);
            }
    return 0;
}

/* Stage 0, while the nodes work on this window: the next window's forward,
 * kept in sv[1] (this one's state goes back into the trainer). */
typedef struct ahead {
    cm_train_pipe *t;
    const twin *next;
} ahead;

static void fwd_ahead(void *ctx) {
    const ahead *a = ctx;
    cm_train_pipe *t = a->t;
    cm_train_save(t->tr0, &t->sv[0]);
    cm_train_fwd(t->tr0, a->next->tok, NULL, a->next->T, a->next->dropout, a->next->key);
    cm_train_save(t->tr0, &t->sv[1]);
    cm_train_restore(t->tr0, &t->sv[0]);
}

/* One window down the stages and back; fwd_done: stage 0's forward is in
 * the trainer already; next (or NULL): the window whose stage-0 forward to
 * compute while the nodes work on this one. */
static int run_window(cm_train_pipe *t, const int32_t *tokens, const int32_t *target, int T, bool backward,
                      float weight, float dropout, uint64_t drop_key, bool fwd_done, const twin *next, double *loss,
                      int *n_targets, char *err, size_t errlen) {
    const size_t cap = (size_t)t->n_ctx * (size_t)t->E, rows = (size_t)T * (size_t)t->E;
    CM_ASSERT(T >= 1 && T <= t->n_ctx);
    if (!fwd_done) cm_train_fwd(t->tr0, tokens, NULL, T, dropout, drop_key);
    memcpy(t->x, cm_train_out(t->tr0), rows * sizeof(float));
    ahead ah = {t, next};
    int rc = 0;
    for (int s = 1; !rc && s < t->n_stages; s++) { /* down: each stage's output is the next one's input */
        const bool last = s == t->n_stages - 1;
        cm_msg m = {.type = CM_MSG_TRAIN};
        m.u.train = (cm_msg_train){
            .op = CM_TRAIN_FWD, .n_rows = (uint32_t)T, .dim = (uint32_t)t->E, .key = drop_key, .data = t->x};
        m.u.train.f[0] = weight;
        m.u.train.f[1] = dropout;
        if (last) {
            m.u.train.flags = CM_TRAIN_F_TARGETS | (backward ? CM_TRAIN_F_BACKWARD : 0);
            m.u.train.target = target;
        }
        rc = ask_ex(t, s, &m, t->x, cap, s == 1 && next ? fwd_ahead : NULL, &ah, err, errlen);
        if (!rc && t->rows != (last && !backward ? 0u : (uint32_t)T))
            rc = cm_errf(err, errlen, CM_EPROTO, "stage %d answered %u rows for %d", s, t->rows, T);
    }
    if (rc) return rc;
    *loss = t->loss;
    *n_targets = (int)t->nt;
    if (!backward) return 0;
    for (int s = t->n_stages - 2; !rc && s >= 1; s--) { /* up: the gradient of each stage's input */
        cm_msg m = {.type = CM_MSG_TRAIN};
        m.u.train = (cm_msg_train){.op = CM_TRAIN_BWD, .n_rows = (uint32_t)T, .dim = (uint32_t)t->E, .data = t->x};
        rc = ask(t, s, &m, t->x, cap, err, errlen);
        if (!rc && t->rows != (uint32_t)T)
            rc = cm_errf(err, errlen, CM_EPROTO, "stage %d answered %u rows for %d", s, t->rows, T);
    }
    if (!rc) cm_train_back(t->tr0, t->x, NULL);
    return rc;
}

/* An eval runs at once; a backward window waits in the queue for tp_flush. */
static int tp_window(void *user, const int32_t *tokens, const int32_t *target, int T, bool backward, float weight,
                     float dropout, uint64_t drop_key, double *loss, int *n_targets, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    if (!backward)
        return run_window(t, tokens, target, T, false, weight, dropout, drop_key, false, NULL, loss, n_targets, err,
                          errlen);
    if (t->n_q == t->cap_q) {
        const int cap = t->cap_q ? 2 * t->cap_q : 8;
        twin *nq = cm_realloc(t->q, (size_t)cap * sizeof *nq);
        if (!nq) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        t->q = nq;
        for (int i = t->cap_q; i < cap; i++) {
            twin *w = &t->q[i];
            *w = (twin){0};
            w->tok = cm_malloc((size_t)t->n_ctx * sizeof(int32_t));
            w->tgt = cm_malloc((size_t)t->n_ctx * sizeof(int32_t));
            t->cap_q = i + 1;
            if (!w->tok || !w->tgt) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        }
    }
    CM_ASSERT(T >= 1 && T <= t->n_ctx);
    twin *w = &t->q[t->n_q++];
    memcpy(w->tok, tokens, (size_t)T * sizeof(int32_t));
    memcpy(w->tgt, target, (size_t)T * sizeof(int32_t));
    *w = (twin){w->tok, w->tgt, T, weight, dropout, drop_key};
    *loss = 0;
    *n_targets = 0;
    return 0;
}

/* The queued windows in order, stage 0 one window ahead of the nodes:
 * the same operations on the same values as one at a time (the gradients
 * join in window order), so the same bits. */
static int tp_flush(void *user, double *loss, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    double sum = 0;
    int rc = 0;
    for (int i = 0; !rc && i < t->n_q; i++) {
        const twin *w = &t->q[i];
        if (i > 0) cm_train_restore(t->tr0, &t->sv[1]); /* computed during window i - 1 */
        double l = 0;
        int nt;
        rc = run_window(t, w->tok, w->tgt, w->T, true, w->weight, w->dropout, w->key, i > 0,
                        i + 1 < t->n_q ? &t->q[i + 1] : NULL, &l, &nt, err, errlen);
        sum += l;
    }
    t->n_q = 0;
    if (!rc) *loss += sum;
    return rc;
}

static int tp_step(void *user, float lr, float beta1, float beta2, float eps, float wd, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    for (int s = 1; s < t->n_stages; s++) {
        cm_msg m = {.type = CM_MSG_TRAIN};
        m.u.train = (cm_msg_train){.op = CM_TRAIN_STEP, .f = {lr, beta1, beta2, eps, wd}};
        int rc = ask(t, s, &m, NULL, 0, err, errlen);
        if (rc) return rc;
    }
    cm_tadapter_adamw(t->ad0, lr, beta1, beta2, eps, wd);
    return 0;
}

/* Vector v of stage s's slice, dim-floats pieces: from src to the node
 * (SLICE) or, with dst, from the node into dst (FETCH). */
static int move_vec(cm_train_pipe *t, int s, unsigned v, int64_t step, const float *src, float *dst, char *err,
                    size_t errlen) {
    for (size_t o = 0; o < t->n[s]; o += CM_MSG_MAX_TRAIN_SLICE) {
        const size_t k = t->n[s] - o < CM_MSG_MAX_TRAIN_SLICE ? t->n[s] - o : CM_MSG_MAX_TRAIN_SLICE;
        cm_msg m = {.type = CM_MSG_TRAIN};
        m.u.train = (cm_msg_train){.op = dst ? CM_TRAIN_FETCH : CM_TRAIN_SLICE,
                                   .vec = (uint8_t)v,
                                   .n_rows = dst ? 0 : 1,
                                   .dim = (uint32_t)k,
                                   .offset = o,
                                   .key = (uint64_t)step,
                                   .data = dst ? NULL : src + o};
        int rc = ask(t, s, &m, dst ? dst + o : NULL, k, err, errlen);
        if (rc) return rc;
        if (dst && t->rows != 1)
            return cm_errf(err, errlen, CM_EPROTO, "stage %d answered a FETCH with %u rows", s, t->rows);
    }
    return 0;
}

int cm_train_pipe_take_grad(cm_train_pipe *t, float *g, char *err, size_t errlen) {
    memcpy(g, t->ad0->g, t->n[0] * sizeof(float));
    memset(t->ad0->g, 0, t->n[0] * sizeof(float));
    for (int s = 1; s < t->n_stages; s++) {
        int rc = move_vec(t, s, CM_TRAIN_VEC_G, t->ad0->step, NULL, g + t->off[s], err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int cm_train_pipe_set_params(cm_train_pipe *t, const cm_tadapter *ad, char *err, size_t errlen) {
    memcpy(t->ad0->w, ad->w, t->n[0] * sizeof(float));
    t->ad0->step = ad->step;
    for (int s = 1; s < t->n_stages; s++) {
        int rc = move_vec(t, s, CM_TRAIN_VEC_W, ad->step, ad->w + t->off[s], NULL, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int cm_train_pipe_new(cm_train_pipe **out, cm_pipe *p, const cm_model *m, int n_ctx, int n_threads, char *err,
                      size_t errlen) {
    *out = NULL;
    const cm_plan *pl = &p->plan;
    if (p->train) return cm_errf(err, errlen, CM_ESTATE, "the pipe already trains");
    for (int s = 0; s < pl->n_stages; s++)
        if (pl->stages[s].n_members != 1)
            return cm_errf(err, errlen, CM_EUNSUPPORTED,
                           "training runs on a pipeline plan: stage %d is a group of %d machines (use --parallel pp)",
                           s, pl->stages[s].n_members);
    if (pl->n_stages < 2) return cm_errf(err, errlen, CM_EINVAL, "a pipeline of %d stage", pl->n_stages);
    if (n_ctx < 2 || n_ctx > 65536) return cm_errf(err, errlen, CM_EINVAL, "window of %d tokens", n_ctx);
    cm_train_pipe *t = cm_calloc(1, sizeof *t);
    if (!t) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    t->p = p;
    t->m = m;
    t->n_ctx = n_ctx;
    t->E = m->hp.n_embd;
    t->n_stages = pl->n_stages;
    for (int s = 0; s < pl->n_stages; s++) {
        t->first[s] = pl->stages[s].first_layer;
        t->last[s] = pl->stages[s].last_layer;
        t->node[s] = cm_coord_member(p, s, 0);
    }
    t->pool = n_threads > 1 ? cm_pool_new(n_threads) : NULL;
    t->x = cm_malloc((size_t)n_ctx * (size_t)t->E * sizeof(float));
    if (!t->x || (n_threads > 1 && !t->pool)) {
        cm_train_pipe_free(t);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    t->ex = (cm_train_exec){t, tp_load, tp_window, tp_step, tp_gather, tp_flush};
    pthread_mutex_lock(&p->mu);
    p->train = t;
    pthread_mutex_unlock(&p->mu);
    *out = t;
    return 0;
}

void cm_train_pipe_free(cm_train_pipe *t) {
    if (!t) return;
    pthread_mutex_lock(&t->p->mu);
    if (t->p->train == t) t->p->train = NULL;
    pthread_mutex_unlock(&t->p->mu);
    for (int i = 0; i < t->cap_q; i++) {
        cm_free(t->q[i].tok);
        cm_free(t->q[i].tgt);
    }
    cm_free(t->q);
    cm_free(t->sv[0].xs);
    cm_free(t->sv[1].xs);
    cm_trainer_free(t->tr0);
    cm_tadapter_free(t->ad0);
    cm_pool_free(t->pool);
    cm_free(t->x);
    cm_free(t);
}

const cm_train_exec *cm_train_pipe_exec(cm_train_pipe *t) { return &t->ex; }

int cm_train_pipe_local_last(const cm_train_pipe *t) { return t->last[0]; }

void cm_train_pipe_stats(const cm_train_pipe *t, uint64_t *sent, uint64_t *received) {
    *sent = t->sent;
    *received = t->received;
}
