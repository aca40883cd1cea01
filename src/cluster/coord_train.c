/*
 * coord_train.c: the coordinator's side of pipeline-parallel LoRA training
 * (train_pipe.h; TRAIN in docs/PROTOCOL.md). Control requests (SETUP,
 * SLICE, FETCH, STEP) go one at a time on a node's control connection: the
 * caller names the buffer the answer goes to, sends, and waits; the
 * receiver thread of the node (coord.c) hands a ROWS or SLICE whose id is
 * the one awaited to cm_coord_on_train, which copies it under p->mu. The
 * windows go down the stages node to node: this machine sends its output
 * (FWD) to stage 1 on the data link, and a reader thread of that link (drx)
 * takes stage 1's BWDs (the gradient of this machine's output, the loss)
 * into the slot of their window. The waits are the pipe's: a node lost, a
 * node's ERROR or the deadline fail the pipe and the run with the reason.
 * Never allocates per window.
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
    int n_ctx, n_stages, inflight;
    int64_t E;
    int first[CM_PLAN_MAX_NODES], last[CM_PLAN_MAX_NODES]; /* stage s: layers [first, last) */
    remote *node[CM_PLAN_MAX_NODES];                       /* stage s >= 1 */
    size_t off[CM_PLAN_MAX_NODES], n[CM_PLAN_MAX_NODES];   /* stage s's span in the whole adapter */
    cm_pool *pool;
    cm_tadapter *ad0; /* this machine's slice, layers [0, last[0]) */
    cm_trainer *tr0;
    float *x; /* [n_ctx][E]: an eval's (empty) answer */
    cm_train_exec ex;
    twin *q; /* the step's backward windows, queued until the flush */
    int n_q, cap_q;
    uint64_t next_id, next_win;
    uint64_t sent, received;
    cm_conn *data; /* the pipe's link to stage 1 (not owned) */
    pthread_t drx;
    bool drx_on;
    atomic_bool drx_stop;
    /* windows in flight, slot k = window % inflight: stage 0's forward state,
     * and (under p->mu) the window awaited there, its gradient, its loss */
    cm_train_saved *sv;
    float **gb;   /* [inflight][n_ctx * E] */
    bool *expect; /* [inflight] */
    bool *got;
    uint64_t *win;
    int *wT;
    double *wloss;
    /* the control answer awaited, under p->mu */
    uint64_t want_id;
    float *buf;
    size_t cap;
    bool got_ans;
    uint32_t rows, nt;
    double loss;
    uint64_t key;
};

void cm_coord_on_train(cm_pipe *p, remote *r, const cm_msg_train *q) {
    if (q->epoch != atomic_load(&p->epoch)) return;
    pthread_mutex_lock(&p->mu);
    cm_train_pipe *t = p->train;
    const size_t n = (size_t)q->n_rows * q->dim;
    if (!t || !t->want_id || q->id != t->want_id || t->got_ans) {
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
    t->got_ans = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Send q to stage s's node; with buf, wait for its answer (into buf, up to
 * cap floats). A failure fails the pipe. */
static int ask(cm_train_pipe *t, int s, cm_msg *m, float *buf, size_t cap, char *err, size_t errlen) {
    cm_pipe *p = t->p;
    remote *r = t->node[s];
    m->u.train.epoch = atomic_load(&p->epoch);
    m->u.train.id = ++t->next_id;
    pthread_mutex_lock(&p->mu);
    int rc = p->fatal ? cm_errf(err, errlen, p->fatal, "%s", p->fatal_text) : 0;
    t->want_id = buf ? m->u.train.id : 0;
    t->buf = buf;
    t->cap = cap;
    t->got_ans = false;
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
    /* A node's stage of a big model may compute for long; its heartbeats
     * show it alive meanwhile, so the bound is the loading one. */
    const uint64_t deadline = cm_now_ns() + (uint64_t)CM_PIPE_LOAD_MS * 1000000ull;
    pthread_mutex_lock(&p->mu);
    while (!rc && !t->got_ans) rc = cm_coord_wait_data(p, deadline, "training rows", err, errlen);
    t->want_id = 0;
    t->buf = NULL;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

enum { N_STATE = CM_TRAIN_VEC_G }; /* the vectors a slice's state is: W, M1, M2 */

static float *vec_of(const cm_tadapter *ad, unsigned v) {
    return v == CM_TRAIN_VEC_W ? ad->w : v == CM_TRAIN_VEC_M1 ? ad->m1 : v == CM_TRAIN_VEC_M2 ? ad->m2 : ad->g;
}

/* The windows go on the data links, SETUP, SLICE and STEP on the control
 * connections: a node may read the two in any order. So after those, a
 * FETCH of one parameter from every node, answered on its control
 * connection once everything before it there is done, and only then the
 * next FWD. */
static int barrier(cm_train_pipe *t, char *err, size_t errlen) {
    for (int s = 1; s < t->n_stages; s++) {
        if (!t->n[s]) continue;
        float one;
        cm_msg m = {.type = CM_MSG_TRAIN};
        m.u.train = (cm_msg_train){.op = CM_TRAIN_FETCH, .vec = CM_TRAIN_VEC_W, .dim = 1};
        int rc = ask(t, s, &m, &one, 1, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

static int tp_load(void *user, const cm_tadapter *ad, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    for (int s = 0; s < t->n_stages; s++) cm_tadapter_span(ad, t->first[s], t->last[s], &t->off[s], &t->n[s]);
    if (!t->ad0) {
        int rc = cm_tadapter_new_range(&t->ad0, t->m, ad->rank, ad->alpha, ad->targets, 0, t->last[0], err, errlen);
        if (!rc) rc = cm_trainer_new_range(&t->tr0, t->m, t->ad0, 0, t->last[0], t->n_ctx, t->pool, err, errlen);
        for (int i = 0; !rc && i < t->inflight; i++)
            if (!(t->sv[i].xs = cm_malloc(cm_train_saved_floats(t->tr0) * sizeof(float))))
                rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory for %d windows in flight", t->inflight);
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
                                   .offset = (uint64_t)t->inflight,
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
    return barrier(t, err, errlen);
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

/* The data link's reader: BWDs of stage 1 (the gradient of this machine's
 * output, the last stage's loss) into the slot of their window. Anything
 * else, or a window not awaited, fails the pipe. */
static void *drx_main(void *arg) {
    cm_train_pipe *t = arg;
    cm_pipe *p = t->p;
    char err[400];
    while (!atomic_load(&t->drx_stop)) {
        if (cm_fd_wait_readable(cm_conn_fd(t->data), 100) <= 0) continue;
        cm_msg m;
        int rc = cm_conn_recv(t->data, &m, CM_PIPE_DATA_MS, err, sizeof err);
        if (rc == CM_ETIMEDOUT) continue;
        if (atomic_load(&t->drx_stop)) break;
        if (rc) {
            cm_coord_fatal(p, rc, "stage 1's data link: %s", err);
            break;
        }
        const cm_msg_train *q = &m.u.train;
        if (m.type != CM_MSG_TRAIN || q->op != CM_TRAIN_BWD) {
            cm_coord_fatal(p, CM_EPROTO, "stage 1 sent %s (op %u) on the data link while training",
                           cm_msg_type_name(m.type), m.type == CM_MSG_TRAIN ? q->op : 0u);
            break;
        }
        if (q->epoch != atomic_load(&p->epoch)) continue; /* a stale plan's */
        const int k = (int)(q->offset % (uint64_t)t->inflight);
        pthread_mutex_lock(&p->mu);
        const bool ok =
            t->expect[k] && !t->got[k] && t->win[k] == q->offset && q->n_rows == (uint32_t)t->wT[k] && q->dim == t->E;
        if (ok) {
            cm_msg_train_get(q, t->gb[k]);
            t->wloss[k] = q->loss;
            t->received += (uint64_t)q->n_rows * q->dim * 4;
            t->got[k] = true;
            pthread_cond_broadcast(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
        if (!ok) {
            cm_coord_fatal(p, CM_EPROTO, "stage 1 sent the BWD of window %llu (%u x %u) that is not awaited",
                           (unsigned long long)q->offset, q->n_rows, q->dim);
            break;
        }
    }
    return NULL;
}

/* A FWD of this machine's output rows (in the trainer) to stage 1 on the
 * data link: window win, targets riding along to the last stage. */
static int send_fwd(cm_train_pipe *t, uint64_t win, uint64_t id, const int32_t *target, int T, bool backward,
                    float weight, float dropout, uint64_t drop_key, char *err, size_t errlen) {
    cm_pipe *p = t->p;
    cm_msg m = {.type = CM_MSG_TRAIN};
    m.u.train = (cm_msg_train){.epoch = atomic_load(&p->epoch),
                               .id = id,
                               .op = CM_TRAIN_FWD,
                               .flags = CM_TRAIN_F_TARGETS | (backward ? CM_TRAIN_F_BACKWARD : 0),
                               .n_rows = (uint32_t)T,
                               .dim = (uint32_t)t->E,
                               .offset = win,
                               .key = drop_key,
                               .target = target,
                               .data = cm_train_out(t->tr0)};
    m.u.train.f[0] = weight;
    m.u.train.f[1] = dropout;
    pthread_mutex_lock(&p->mu);
    int rc = p->fatal ? cm_errf(err, errlen, p->fatal, "%s", p->fatal_text) : 0;
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    pthread_mutex_lock(&p->send_mu);
    rc = cm_conn_send(t->data, &m, CM_PIPE_DATA_MS, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    if (rc) {
        cm_coord_fatal(p, rc, "stage 1: %s", err);
        return rc;
    }
    t->sent += (uint64_t)T * (uint64_t)t->E * 4;
    return 0;
}

/* An eval window at once: down the stages, the loss back from the last
 * stage (ROWS on its control connection, by id). */
static int eval_window(cm_train_pipe *t, const int32_t *tokens, const int32_t *target, int T, float weight,
                       float dropout, uint64_t drop_key, double *loss, int *n_targets, char *err, size_t errlen) {
    cm_pipe *p = t->p;
    CM_ASSERT(T >= 1 && T <= t->n_ctx);
    cm_train_fwd(t->tr0, tokens, NULL, T, dropout, drop_key);
    const uint64_t id = ++t->next_id;
    pthread_mutex_lock(&p->mu);
    t->want_id = id;
    t->buf = t->x;
    t->cap = 0;
    t->got_ans = false;
    pthread_mutex_unlock(&p->mu);
    int rc = send_fwd(t, t->next_win++, id, target, T, false, weight, dropout, drop_key, err, errlen);
    const uint64_t deadline = cm_now_ns() + (uint64_t)CM_PIPE_LOAD_MS * 1000000ull;
    pthread_mutex_lock(&p->mu);
    while (!rc && !t->got_ans) rc = cm_coord_wait_data(p, deadline, "the eval loss", err, errlen);
    t->want_id = 0;
    t->buf = NULL;
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    *loss = t->loss;
    *n_targets = (int)t->nt;
    return 0;
}

/* An eval runs at once; a backward window waits in the queue for tp_flush. */
static int tp_window(void *user, const int32_t *tokens, const int32_t *target, int T, bool backward, float weight,
                     float dropout, uint64_t drop_key, double *loss, int *n_targets, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    if (!backward) return eval_window(t, tokens, target, T, weight, dropout, drop_key, loss, n_targets, err, errlen);
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

/* The queued windows in a 1F1B schedule: up to inflight windows are down
 * the stages at once; this machine computes a window's forward and sends
 * it, and once the windows in flight are full, takes the oldest one's
 * gradient back (its BWD from stage 1) and runs its backward, then the next
 * window's forward. Every stage runs the backwards in window order and the
 * floats cross the links unchanged: the same operations on the same values
 * as one window at a time (the gradients and losses join in window order),
 * so the same bits. */
static int tp_flush(void *user, double *loss, char *err, size_t errlen) {
    cm_train_pipe *t = user;
    cm_pipe *p = t->p;
    const int n = t->n_q, N = t->inflight;
    const uint64_t base = t->next_win;
    double sum = 0;
    int rc = 0, sent = 0;
    for (int done = 0; !rc && done < n; done++) {
        for (; !rc && sent < n && sent - done < N; sent++) {
            const twin *w = &t->q[sent];
            const uint64_t win = base + (uint64_t)sent;
            const int k = (int)(win % (uint64_t)N);
            cm_train_fwd(t->tr0, w->tok, NULL, w->T, w->dropout, w->key);
            cm_train_save(t->tr0, &t->sv[k]);
            pthread_mutex_lock(&p->mu);
            t->expect[k] = true;
            t->got[k] = false;
            t->win[k] = win;
            t->wT[k] = w->T;
            pthread_mutex_unlock(&p->mu);
            rc = send_fwd(t, win, 0, w->tgt, w->T, true, w->weight, w->dropout, w->key, err, errlen);
        }
        if (rc) break;
        const int k = (int)((base + (uint64_t)done) % (uint64_t)N);
        const uint64_t deadline = cm_now_ns() + (uint64_t)CM_PIPE_LOAD_MS * 1000000ull;
        pthread_mutex_lock(&p->mu);
        while (!rc && !t->got[k]) rc = cm_coord_wait_data(p, deadline, "training gradients", err, errlen);
        t->expect[k] = false;
        pthread_mutex_unlock(&p->mu);
        if (rc) break;
        cm_train_restore(t->tr0, &t->sv[k]);
        cm_train_back(t->tr0, t->gb[k], NULL);
        sum += t->wloss[k];
    }
    pthread_mutex_lock(&p->mu);
    for (int k = 0; k < N; k++) t->expect[k] = false;
    pthread_mutex_unlock(&p->mu);
    t->next_win = base + (uint64_t)n;
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
    return barrier(t, err, errlen);
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
    return barrier(t, err, errlen);
}

int cm_train_pipe_new(cm_train_pipe **out, cm_pipe *p, const cm_model *m, int n_ctx, int n_threads, int inflight,
                      char *err, size_t errlen) {
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
    if (inflight == 0) inflight = pl->n_stages;
    if (inflight < 1 || inflight > (int)CM_MSG_MAX_TRAIN_INFLIGHT)
        return cm_errf(err, errlen, CM_EINVAL, "%d windows in flight (1..%u)", inflight, CM_MSG_MAX_TRAIN_INFLIGHT);
    if (!p->data) return cm_errf(err, errlen, CM_ESTATE, "no link to stage 1");
    cm_train_pipe *t = cm_calloc(1, sizeof *t);
    if (!t) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    t->p = p;
    t->m = m;
    t->n_ctx = n_ctx;
    t->E = m->hp.n_embd;
    t->n_stages = pl->n_stages;
    t->inflight = inflight;
    t->data = p->data;
    for (int s = 0; s < pl->n_stages; s++) {
        t->first[s] = pl->stages[s].first_layer;
        t->last[s] = pl->stages[s].last_layer;
        t->node[s] = cm_coord_member(p, s, 0);
    }
    t->pool = n_threads > 1 ? cm_pool_new(n_threads) : NULL;
    const size_t rows = (size_t)n_ctx * (size_t)t->E * sizeof(float);
    t->x = cm_malloc(rows);
    t->sv = cm_calloc((size_t)inflight, sizeof *t->sv);
    t->gb = cm_calloc((size_t)inflight, sizeof *t->gb);
    t->expect = cm_calloc((size_t)inflight, sizeof *t->expect);
    t->got = cm_calloc((size_t)inflight, sizeof *t->got);
    t->win = cm_calloc((size_t)inflight, sizeof *t->win);
    t->wT = cm_calloc((size_t)inflight, sizeof *t->wT);
    t->wloss = cm_calloc((size_t)inflight, sizeof *t->wloss);
    bool ok =
        t->x && (n_threads <= 1 || t->pool) && t->sv && t->gb && t->expect && t->got && t->win && t->wT && t->wloss;
    for (int i = 0; ok && i < inflight; i++) ok = (t->gb[i] = cm_malloc(rows)) != NULL;
    if (!ok) {
        cm_train_pipe_free(t);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    atomic_store(&t->drx_stop, false);
    if (cm_thread_create(&t->drx, drx_main, t)) {
        cm_train_pipe_free(t);
        return cm_errf(err, errlen, CM_ENOMEM, "cannot start a thread");
    }
    t->drx_on = true;
    t->ex = (cm_train_exec){t, tp_load, tp_window, tp_step, tp_gather, tp_flush};
    pthread_mutex_lock(&p->mu);
    p->train = t;
    pthread_mutex_unlock(&p->mu);
    *out = t;
    return 0;
}

void cm_train_pipe_free(cm_train_pipe *t) {
    if (!t) return;
    if (t->drx_on) {
        atomic_store(&t->drx_stop, true);
        pthread_join(t->drx, NULL);
    }
    pthread_mutex_lock(&t->p->mu);
    if (t->p->train == t) t->p->train = NULL;
    pthread_mutex_unlock(&t->p->mu);
    for (int i = 0; i < t->cap_q; i++) {
        cm_free(t->q[i].tok);
        cm_free(t->q[i].tgt);
    }
    cm_free(t->q);
    for (int i = 0; i < t->inflight; i++) {
        if (t->sv) cm_free(t->sv[i].xs);
        if (t->gb) cm_free(t->gb[i]);
    }
    cm_free(t->sv);
    cm_free(t->gb);
    cm_free(t->expect);
    cm_free(t->got);
    cm_free(t->win);
    cm_free(t->wT);
    cm_free(t->wloss);
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
