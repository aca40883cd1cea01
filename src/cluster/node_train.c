/*
 * node_train.c: a node's part of pipeline-parallel LoRA training (TRAIN,
 * docs/PROTOCOL.md; issue 17). The coordinator gives the stage SETUP (rank,
 * targets, alpha, window size, windows in flight) and the state of its
 * adapter slice (SLICE: the parameters and AdamW moments of the stage's
 * layers, the whole adapter's elements laid out the same way), on its
 * control connection. The windows then flow stage to stage on the links the
 * inference pipeline opened: a FWD (the previous stage's output rows, the
 * targets riding along for the last stage) comes from the previous stage
 * (or the coordinator's data link), is computed, and goes on to the next
 * stage; the last stage computes the loss and, for a training window, its
 * backward at once and sends the BWD (the gradient of its input, the loss)
 * back on the link the FWD came; each middle stage reads BWDs from the next
 * stage on its own thread (brx), runs the backward of that window from the
 * state it kept and sends its BWD back in turn. Up to SETUP's windows in
 * flight are kept (their forward state, cm_train_saved), so the coordinator
 * can run a 1F1B schedule. An eval window ends at the last stage with ROWS
 * to the coordinator. STEP runs AdamW on the slice; FETCH sends a part of
 * the slice back (checkpoints, the end; data parallelism fetches the
 * gradients G after each window, and a FETCH of G clears them). The math is
 * train.h's stage pieces and the floats travel unchanged, so the adapter
 * equals one machine's bit for bit.
 *
 * Locks: compute under n->mu; rows go out with n->mu released (a FWD to the
 * next stage under s->fsend_mu, a BWD back under n->bsend_mu), so a stage
 * whose sends wait never keeps its other direction from being read. Never
 * trusts a count: rows, dims, windows and slice ranges are checked against
 * what SETUP sized; buffers are sized at SETUP, nothing allocates per
 * window. Only a pipeline stage trains (no tensor-parallel group). Only FWD
 * comes from a peer that is not the coordinator, and BWD only from the next
 * stage's link.
 */
#include "cluster/node_impl.h"

#include "os/os.h"
#include "train/train.h"

#include <stdio.h>
#include <string.h>

struct cm_node_train {
    cm_tadapter *ad; /* the slice: layers [layer_begin, layer_end) */
    cm_trainer *tr;
    int n_ctx, inflight;
    int64_t E;
    float *in, *fout;   /* [n_ctx][E]: a FWD's rows in (under n->mu) and on to the next stage (under fsend_mu) */
    float *gin, *bout;  /* [n_ctx][E]: a BWD's rows in (brx) and back (under bsend_mu) */
    int32_t *tgt;       /* [n_ctx] */
    cm_train_saved *sv; /* [inflight]: the forward state of window win[i], when busy[i] */
    uint64_t *win;
    bool *busy;
};

void cm_node_train_free(struct cm_node_train *t) {
    if (!t) return;
    cm_trainer_free(t->tr);
    cm_tadapter_free(t->ad);
    for (int i = 0; t->sv && i < t->inflight; i++) cm_free(t->sv[i].xs);
    cm_free(t->sv);
    cm_free(t->win);
    cm_free(t->busy);
    cm_free(t->in);
    cm_free(t->fout);
    cm_free(t->gin);
    cm_free(t->bout);
    cm_free(t->tgt);
    cm_free(t);
}

static float *vec_of(cm_tadapter *ad, unsigned v) {
    return v == CM_TRAIN_VEC_W ? ad->w : v == CM_TRAIN_VEC_M1 ? ad->m1 : v == CM_TRAIN_VEC_M2 ? ad->m2 : ad->g;
}

static int reply(stage *s, const cm_msg *m, char *err, size_t errlen) {
    pthread_mutex_lock(s->csend_mu);
    int rc = cm_conn_send(s->coord, m, CM_PIPE_DATA_MS, err, errlen);
    pthread_mutex_unlock(s->csend_mu);
    return rc;
}

/* A failure, to the log and to the coordinator as ERROR (n->mu held, s current). */
static void report(stage *s, const char *from, int code, const char *text) {
    CM_LOGW("TRAIN from %s failed: %s", from, text);
    cm_node_report_error(s, code, text);
}

/* The training buffers are freed only with both send locks held: a send
 * in flight reads them with n->mu released. */
static void drop_train(stage *s) {
    pthread_mutex_lock(&s->fsend_mu);
    pthread_mutex_lock(&s->node->bsend_mu);
    cm_node_train_free(s->train);
    s->train = NULL;
    pthread_mutex_unlock(&s->node->bsend_mu);
    pthread_mutex_unlock(&s->fsend_mu);
}

static void *brx_main(void *arg);

static int setup(stage *s, const cm_msg_train *q, char *err, size_t errlen) {
    if (s->as.tp_size > 1) return cm_errf(err, errlen, CM_EUNSUPPORTED, "training in a tensor-parallel group");
    drop_train(s);
    struct cm_node_train *t = cm_calloc(1, sizeof *t);
    if (!t) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    const int l0 = (int)s->as.layer_begin, l1 = (int)s->as.layer_end;
    t->n_ctx = (int)q->n_ctx;
    t->inflight = (int)q->offset; /* 1..CM_MSG_MAX_TRAIN_INFLIGHT (the decoder checked) */
    t->E = s->m.hp.n_embd;
    int rc = cm_tadapter_new_range(&t->ad, &s->m, (int)q->rank, q->f[0], q->targets, l0, l1, err, errlen);
    if (!rc) rc = cm_trainer_new_range(&t->tr, &s->m, t->ad, l0, l1, t->n_ctx, s->pool, err, errlen);
    if (!rc) {
        const size_t rows = (size_t)t->n_ctx * (size_t)t->E * sizeof(float);
        t->in = cm_malloc(rows);
        t->fout = cm_malloc(rows);
        t->gin = cm_malloc(rows);
        t->bout = cm_malloc(rows);
        t->tgt = cm_malloc((size_t)t->n_ctx * sizeof(int32_t));
        t->sv = cm_calloc((size_t)t->inflight, sizeof *t->sv);
        t->win = cm_calloc((size_t)t->inflight, sizeof *t->win);
        t->busy = cm_calloc((size_t)t->inflight, sizeof *t->busy);
        bool ok = t->in && t->fout && t->gin && t->bout && t->tgt && t->sv && t->win && t->busy;
        for (int i = 0; ok && i < t->inflight; i++)
            ok = (t->sv[i].xs = cm_malloc(cm_train_saved_floats(t->tr) * sizeof(float))) != NULL;
        if (!ok) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory for %d windows in flight", t->inflight);
    }
    const bool last = s->as.flags & CM_ASSIGN_F_OUTPUT;
    if (!rc && !last && !s->next) rc = cm_errf(err, errlen, CM_ESTATE, "a middle stage without a next stage");
    if (!rc && !last && !s->brx_on) { /* the BWDs of the next stage come back on s->next */
        atomic_store(&s->brx_stop, false);
        if (cm_thread_create(&s->brx, brx_main, s)) rc = cm_errf(err, errlen, CM_ENOMEM, "cannot start a thread");
        else s->brx_on = true;
    }
    if (rc) {
        cm_node_train_free(t);
        return rc;
    }
    t->ad->step = (int64_t)q->key;
    s->train = t;
    CM_LOGI("training layers [%d, %d): %zu adapter parameters, rank %u, windows of %d, %d in flight", l0, l1,
            t->ad->n_params, q->rank, t->n_ctx, t->inflight);
    return 0;
}

/* The rows of a FWD / BWD: T = n_rows within the window size, n_embd wide. */
static int rows_ok(struct cm_node_train *t, const cm_msg_train *q, char *err, size_t errlen) {
    if ((int64_t)q->dim != t->E || q->n_rows < 1 || (int)q->n_rows > t->n_ctx)
        return cm_errf(err, errlen, CM_EINVAL, "%s of %u x %u rows does not fit this stage (n_embd %lld, window %d)",
                       q->op == CM_TRAIN_FWD ? "FWD" : "BWD", q->n_rows, q->dim, (long long)t->E, t->n_ctx);
    return 0;
}

enum { TO_NONE, TO_NEXT, TO_BACK };

/* A FWD from c (n->mu held): computed; *to says where *r goes (with n->mu
 * released): on to the next stage or, from the last stage, the BWD back. */
static int fwd(node *n, stage *s, cm_conn *c, const cm_msg_train *q, cm_msg *r, int *to, char *err, size_t errlen) {
    struct cm_node_train *t = s->train;
    const bool last = s->as.flags & CM_ASSIGN_F_OUTPUT, back = q->flags & CM_TRAIN_F_BACKWARD;
    int rc = rows_ok(t, q, err, errlen);
    if (rc) return rc;
    const int T = (int)q->n_rows, k = (int)(q->offset % (uint64_t)t->inflight);
    if (!last && back && t->busy[k])
        return cm_errf(err, errlen, CM_ESTATE, "window %llu while window %llu holds its place (%d in flight)",
                       (unsigned long long)q->offset, (unsigned long long)t->win[k], t->inflight);
    if (last && !(q->flags & CM_TRAIN_F_TARGETS))
        return cm_errf(err, errlen, CM_EINVAL, "FWD to the last stage without targets");
    cm_msg_train_get(q, t->in);
    cm_train_fwd(t->tr, NULL, t->in, T, q->f[1], q->key);
    cm_msg_train *a = &r->u.train;
    *a = *q; /* epoch, id, window, key, weight, dropout, flags and the targets' view ride along */
    a->data = NULL;
    a->data_le = NULL;
    if (!last) {
        if (back) {
            cm_train_save(t->tr, &t->sv[k]);
            t->busy[k] = true;
            t->win[k] = q->offset;
        }
        memcpy(t->fout, cm_train_out(t->tr), (size_t)T * (size_t)t->E * sizeof(float));
        a->data = t->fout;
    } else {
        for (int j = 0; j < T; j++) t->tgt[j] = cm_msg_train_target(q, (uint32_t)j);
        int nt = 0;
        const double loss = cm_train_head(t->tr, t->tgt, back, q->f[0], &nt);
        *a = (cm_msg_train){
            .epoch = q->epoch, .id = q->id, .offset = q->offset, .loss = loss, .n_targets = (uint32_t)nt};
        if (!back) { /* an eval: the loss to the coordinator */
            a->op = CM_TRAIN_ROWS;
            *to = TO_NONE;
            return reply(s, r, err, errlen);
        }
        cm_train_back(t->tr, NULL, t->bout);
        a->op = CM_TRAIN_BWD;
        a->n_rows = (uint32_t)T;
        a->dim = (uint32_t)t->E;
        a->data = t->bout;
    }
    pthread_mutex_lock(&n->bsend_mu); /* BWDs of this window go back where it came from */
    n->bwd_to = c;
    pthread_mutex_unlock(&n->bsend_mu);
    *to = last ? TO_BACK : TO_NEXT;
    return 0;
}

/* Send r with n->mu released (held on entry, not on return), to the next
 * stage or back; a failure is reported if s is still the stage. */
static void send_out(node *n, stage *s, const cm_msg *r, int to) {
    char err[400];
    int rc;
    pthread_mutex_t *mu = to == TO_NEXT ? &s->fsend_mu : &n->bsend_mu;
    pthread_mutex_lock(mu);
    pthread_mutex_unlock(&n->mu);
    if (to == TO_NEXT) rc = cm_conn_send(s->next, r, CM_PIPE_DATA_MS, err, sizeof err);
    else if (n->bwd_to) rc = cm_conn_send(n->bwd_to, r, CM_PIPE_DATA_MS, err, sizeof err);
    else rc = cm_errf(err, sizeof err, CM_ESTATE, "the link the window came on is closed");
    pthread_mutex_unlock(mu);
    if (!rc) return;
    char text[460];
    snprintf(text, sizeof text, "%s: %s", to == TO_NEXT ? "to the next stage" : "back to the previous stage", err);
    pthread_mutex_lock(&n->mu);
    if (n->st == s) report(s, to == TO_NEXT ? "the previous stage" : "the next stage", rc, text);
    pthread_mutex_unlock(&n->mu);
}

/* A BWD from the next stage (n->mu held): window q->offset's backward from
 * the state its FWD kept; *r the BWD back. */
static int bwd(stage *s, const cm_msg_train *q, cm_msg *r, char *err, size_t errlen) {
    struct cm_node_train *t = s->train;
    if (q->epoch != s->as.epoch)
        return cm_errf(err, errlen, CM_ESTATE, "BWD of epoch %llu (current %llu)", (unsigned long long)q->epoch,
                       (unsigned long long)s->as.epoch);
    if (!t) return cm_errf(err, errlen, CM_ESTATE, "BWD before its SETUP");
    if (q->op != CM_TRAIN_BWD)
        return cm_errf(err, errlen, CM_EPROTO, "TRAIN op %u from the next stage (only BWD comes back)", q->op);
    int rc = rows_ok(t, q, err, errlen);
    if (rc) return rc;
    const int k = (int)(q->offset % (uint64_t)t->inflight);
    if (!t->busy[k] || t->win[k] != q->offset || t->sv[k].T != (int)q->n_rows)
        return cm_errf(err, errlen, CM_ESTATE, "BWD of window %llu (%u rows), which this stage does not hold",
                       (unsigned long long)q->offset, q->n_rows);
    cm_msg_train_get(q, t->gin);
    cm_train_restore(t->tr, &t->sv[k]);
    cm_train_back(t->tr, t->gin, t->bout);
    t->busy[k] = false;
    cm_msg_train *a = &r->u.train;
    *a = (cm_msg_train){.epoch = q->epoch,
                        .id = q->id,
                        .op = CM_TRAIN_BWD,
                        .offset = q->offset,
                        .loss = q->loss,
                        .n_targets = q->n_targets,
                        .n_rows = q->n_rows,
                        .dim = q->dim,
                        .data = t->bout};
    return 0;
}

/* The reader of the next stage's BWDs (one per stage, from the first SETUP). */
static void *brx_main(void *arg) {
    stage *s = arg;
    node *n = s->node;
    char err[400];
    while (!atomic_load(&s->brx_stop)) {
        if (cm_fd_wait_readable(cm_conn_fd(s->next), 200) <= 0) continue;
        cm_msg m;
        int rc = cm_conn_recv(s->next, &m, CM_PIPE_DATA_MS, err, sizeof err);
        if (rc == CM_ETIMEDOUT) continue;
        pthread_mutex_lock(&n->mu);
        if (n->st != s || atomic_load(&s->brx_stop)) {
            pthread_mutex_unlock(&n->mu);
            break;
        }
        if (rc) {
            char text[460];
            snprintf(text, sizeof text, "the link to the next stage: %s", err);
            report(s, "the next stage", rc, text);
            pthread_mutex_unlock(&n->mu);
            break;
        }
        cm_msg r = {.type = CM_MSG_TRAIN};
        if (m.type != CM_MSG_TRAIN)
            rc = cm_errf(err, sizeof err, CM_EPROTO, "%s from the next stage", cm_msg_type_name(m.type));
        else rc = bwd(s, &m.u.train, &r, err, sizeof err);
        if (rc) {
            report(s, "the next stage", rc, err);
            pthread_mutex_unlock(&n->mu);
            continue;
        }
        send_out(n, s, &r, TO_BACK); /* releases n->mu */
    }
    return NULL;
}

void cm_node_train_stop(stage *s) {
    if (s->brx_on) {
        atomic_store(&s->brx_stop, true);
        pthread_join(s->brx, NULL);
        s->brx_on = false;
    }
    if (s->node) drop_train(s);
    else cm_node_train_free(s->train);
    s->train = NULL;
}

/* SETUP, SLICE, FETCH, STEP (the coordinator's), n->mu held. */
static int control(stage *s, const cm_msg_train *q, char *err, size_t errlen) {
    if (q->op == CM_TRAIN_SETUP) return setup(s, q, err, errlen);
    struct cm_node_train *t = s->train;
    if (!t) return cm_errf(err, errlen, CM_ESTATE, "TRAIN before its SETUP");
    cm_msg r = {.type = CM_MSG_TRAIN};
    cm_msg_train *a = &r.u.train;
    *a = (cm_msg_train){.epoch = q->epoch, .id = q->id, .op = CM_TRAIN_ROWS};
    int rc;
    switch (q->op) {
    case CM_TRAIN_SLICE:
    case CM_TRAIN_FETCH:
        if (q->offset > t->ad->n_params || q->dim > t->ad->n_params - q->offset)
            return cm_errf(err, errlen, CM_EINVAL, "slice [%llu, +%u) past the stage's %zu parameters",
                           (unsigned long long)q->offset, q->dim, t->ad->n_params);
        if (q->op == CM_TRAIN_SLICE) {
            cm_msg_train_get(q, vec_of(t->ad, q->vec) + q->offset);
            t->ad->step = (int64_t)q->key;
            return 0;
        }
        a->op = CM_TRAIN_SLICE;
        a->vec = q->vec;
        a->offset = q->offset;
        a->n_rows = 1;
        a->dim = q->dim;
        a->key = (uint64_t)t->ad->step;
        a->data = vec_of(t->ad, q->vec) + q->offset;
        rc = reply(s, &r, err, errlen);
        if (!rc && q->vec == CM_TRAIN_VEC_G) memset(t->ad->g + q->offset, 0, q->dim * sizeof(float));
        return rc;
    case CM_TRAIN_STEP: cm_tadapter_adamw(t->ad, q->f[0], q->f[1], q->f[2], q->f[3], q->f[4]); return 0;
    default: return cm_errf(err, errlen, CM_EPROTO, "TRAIN op %u on the coordinator's connection", q->op);
    }
}

void cm_node_on_train(node *n, cm_conn *c, bool is_coord, const cm_msg_train *q) {
    char err[400] = "";
    int rc = 0, to = TO_NONE;
    bool tell = false; /* the coordinator hears of a failure of its run, not of a stray peer's message */
    cm_msg r = {.type = CM_MSG_TRAIN};
    pthread_mutex_lock(&n->mu);
    stage *s = n->st;
    if (q->op == CM_TRAIN_BWD)
        rc = cm_errf(err, sizeof err, CM_EPROTO,
                     "BWD on a connection from a peer: BWDs come back only on the link "
                     "to the next stage");
    else if (!is_coord && q->op != CM_TRAIN_FWD)
        rc = cm_errf(err, sizeof err, CM_EPROTO, "TRAIN op %u from a peer that is not the coordinator", q->op);
    else if (!s) rc = cm_errf(err, sizeof err, CM_ESTATE, "TRAIN without an assignment");
    else if (q->epoch != s->as.epoch) /* a stale plan's, or a stray peer's */
        rc = cm_errf(err, sizeof err, CM_ESTATE, "TRAIN of epoch %llu (current %llu)", (unsigned long long)q->epoch,
                     (unsigned long long)s->as.epoch);
    else {
        tell = true;
        if (q->op == CM_TRAIN_FWD)
            rc = s->train ? fwd(n, s, c, q, &r, &to, err, sizeof err)
                          : cm_errf(err, sizeof err, CM_ESTATE, "TRAIN before its SETUP");
        else rc = control(s, q, err, sizeof err);
    }
    if (rc && tell) report(s, cm_conn_peer(c), rc, err);
    else if (rc) CM_LOGW("TRAIN from %s refused: %s", cm_conn_peer(c), err);
    if (!rc && to != TO_NONE) {
        send_out(n, s, &r, to); /* releases n->mu */
        return;
    }
    pthread_mutex_unlock(&n->mu);
}
