/*
 * node_train.c: a node's part of pipeline-parallel LoRA training (TRAIN,
 * docs/PROTOCOL.md; issue 17). The coordinator gives the stage SETUP (rank,
 * targets, alpha, window size) and the state of its adapter slice (SLICE:
 * the parameters and AdamW moments of the stage's layers, the whole
 * adapter's elements laid out the same way); then, per window, FWD (the
 * previous stage's output rows; the last stage also gets the targets and
 * answers with the loss) and BWD (the gradient of this stage's output),
 * each answered with ROWS; STEP runs AdamW on the slice; FETCH sends a part
 * of the slice back (checkpoints, the end; data parallelism fetches the
 * gradients G after each window, and a FETCH of G clears them). The math is train.h's stage
 * pieces, so the adapter equals one machine's bit for bit.
 *
 * Runs on the coordinator's connection thread with n->mu held (node.c),
 * like FORWARD. Never trusts a count: rows, dims and slice ranges are
 * checked against what SETUP sized; buffers are sized at SETUP, nothing
 * allocates per window. Only a pipeline stage trains (no tensor-parallel
 * group: the coordinator refuses such plans before it gets here).
 */
#include "cluster/node_impl.h"

#include "train/train.h"

#include <stdio.h>
#include <string.h>

struct cm_node_train {
    cm_tadapter *ad; /* the slice: layers [layer_begin, layer_end) */
    cm_trainer *tr;
    int n_ctx;
    int64_t E;
    float *in, *out; /* [n_ctx][E] */
    int32_t *tgt;    /* [n_ctx] */
    int T;           /* tokens of the window the trainer holds (0: none) */
};

void cm_node_train_free(struct cm_node_train *t) {
    if (!t) return;
    cm_trainer_free(t->tr);
    cm_tadapter_free(t->ad);
    cm_free(t->in);
    cm_free(t->out);
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

static int setup(stage *s, const cm_msg_train *q, char *err, size_t errlen) {
    if (s->as.tp_size > 1) return cm_errf(err, errlen, CM_EUNSUPPORTED, "training in a tensor-parallel group");
    cm_node_train_free(s->train);
    s->train = NULL;
    struct cm_node_train *t = cm_calloc(1, sizeof *t);
    if (!t) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    const int l0 = (int)s->as.layer_begin, l1 = (int)s->as.layer_end;
    t->n_ctx = (int)q->n_ctx;
    t->E = s->m.hp.n_embd;
    int rc = cm_tadapter_new_range(&t->ad, &s->m, (int)q->rank, q->f[0], q->targets, l0, l1, err, errlen);
    if (!rc) rc = cm_trainer_new_range(&t->tr, &s->m, t->ad, l0, l1, t->n_ctx, s->pool, err, errlen);
    if (!rc) {
        t->in = cm_malloc((size_t)t->n_ctx * (size_t)t->E * sizeof(float));
        t->out = cm_malloc((size_t)t->n_ctx * (size_t)t->E * sizeof(float));
        t->tgt = cm_malloc((size_t)t->n_ctx * sizeof(int32_t));
        if (!t->in || !t->out || !t->tgt) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory for training rows");
    }
    if (rc) {
        cm_node_train_free(t);
        return rc;
    }
    t->ad->step = (int64_t)q->key;
    s->train = t;
    CM_LOGI("training layers [%d, %d): %zu adapter parameters, rank %u, windows of %d", l0, l1, t->ad->n_params,
            q->rank, t->n_ctx);
    return 0;
}

/* The rows of a FWD / BWD: T = n_rows within the window size, n_embd wide. */
static int rows_in(struct cm_node_train *t, const cm_msg_train *q, char *err, size_t errlen) {
    if ((int64_t)q->dim != t->E || q->n_rows < 1 || (int)q->n_rows > t->n_ctx)
        return cm_errf(err, errlen, CM_EINVAL, "%s of %u x %u rows does not fit this stage (n_embd %lld, window %d)",
                       q->op == CM_TRAIN_FWD ? "FWD" : "BWD", q->n_rows, q->dim, (long long)t->E, t->n_ctx);
    cm_msg_train_get(q, t->in);
    return 0;
}

int cm_node_on_train(stage *s, const cm_msg_train *q, char *err, size_t errlen) {
    if (q->epoch != s->as.epoch)
        return cm_errf(err, errlen, CM_ESTATE, "TRAIN of epoch %llu (current %llu)", (unsigned long long)q->epoch,
                       (unsigned long long)s->as.epoch);
    if (q->op == CM_TRAIN_SETUP) return setup(s, q, err, errlen);
    struct cm_node_train *t = s->train;
    if (!t) return cm_errf(err, errlen, CM_ESTATE, "TRAIN before its SETUP");
    const bool last = s->as.flags & CM_ASSIGN_F_OUTPUT;
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
    case CM_TRAIN_FWD: {
        if ((rc = rows_in(t, q, err, errlen))) return rc;
        const int T = (int)q->n_rows;
        t->T = 0;
        cm_train_fwd(t->tr, NULL, t->in, T, q->f[1], q->key);
        t->T = T;
        if (!last) {
            a->n_rows = (uint32_t)T;
            a->dim = (uint32_t)t->E;
            a->data = cm_train_out(t->tr);
            return reply(s, &r, err, errlen);
        }
        if (!(q->flags & CM_TRAIN_F_TARGETS))
            return cm_errf(err, errlen, CM_EINVAL, "FWD to the last stage without targets");
        for (int j = 0; j < T; j++) t->tgt[j] = cm_msg_train_target(q, (uint32_t)j);
        int nt = 0;
        const bool back = q->flags & CM_TRAIN_F_BACKWARD;
        a->loss = cm_train_head(t->tr, t->tgt, back, q->f[0], &nt);
        a->n_targets = (uint32_t)nt;
        if (back) {
            cm_train_back(t->tr, NULL, t->out);
            a->n_rows = (uint32_t)T;
            a->dim = (uint32_t)t->E;
            a->data = t->out;
        }
        return reply(s, &r, err, errlen);
    }
    case CM_TRAIN_BWD:
        if (last) return cm_errf(err, errlen, CM_EINVAL, "BWD to the last stage (its FWD runs its backward)");
        if ((rc = rows_in(t, q, err, errlen))) return rc;
        if ((int)q->n_rows != t->T)
            return cm_errf(err, errlen, CM_ESTATE, "BWD of %u rows after a FWD of %d", q->n_rows, t->T);
        cm_train_back(t->tr, t->in, t->out);
        a->n_rows = q->n_rows;
        a->dim = (uint32_t)t->E;
        a->data = t->out;
        return reply(s, &r, err, errlen);
    case CM_TRAIN_STEP: cm_tadapter_adamw(t->ad, q->f[0], q->f[1], q->f[2], q->f[3], q->f[4]); return 0;
    default: return cm_errf(err, errlen, CM_EPROTO, "TRAIN op %u from the coordinator", q->op);
    }
}
