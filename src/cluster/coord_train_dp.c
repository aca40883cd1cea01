/*
 * coord_train_dp.c: data-parallel LoRA training (train_pipe.h, issue 17):
 * n replicas, each a pipeline (this machine's first stage and its own
 * nodes), run a step's windows side by side, replica r a contiguous share.
 * The training loop (finetune.h) queues the step's backward windows here
 * and flushes them before the step: one thread per replica runs its share
 * window by window and takes each window's gradients out of its slices;
 * then this machine adds the windows' losses and gradients in window order
 * into its whole adapter (the sums one machine makes), runs AdamW on it and
 * sends the new parameters to every replica. The adapter is therefore one
 * machine's bit for bit; the moments live here only.
 *
 * NEEDSWORK: every window's gradients cross the link (n_params floats a
 * window); a fixed summation tree over the windows would let a replica send
 * one partial sum per step. The replicas share this machine's CPUs for
 * their first stages.
 */
#include "cluster/coord_impl.h"
#include "cluster/train_pipe.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct job {
    int32_t *tok, *tgt; /* [n_ctx] */
    int T;
    float weight, dropout;
    uint64_t key;
    double loss;
    float *g; /* [n_params]: the window's gradients */
} job;

typedef struct rep_run {
    cm_train_dp *d;
    int r, j0, j1, rc;
    char err[600];
} rep_run;

struct cm_train_dp {
    cm_train_pipe *rep[CM_PLAN_MAX_NODES];
    int n;
    const cm_model *m;
    int n_ctx;
    cm_tadapter *ad; /* the whole adapter: parameters, moments, the step's gradients */
    job *jobs;
    int n_jobs, cap_jobs;
    cm_train_exec ex;
};

static int dp_load(void *user, const cm_tadapter *ad, char *err, size_t errlen) {
    cm_train_dp *d = user;
    int rc = 0;
    if (!d->ad)
        rc = cm_tadapter_new_range(&d->ad, d->m, ad->rank, ad->alpha, ad->targets, 0, d->m->hp.n_layer, err, errlen);
    if (rc) return rc;
    CM_ASSERT(d->ad->n_params == ad->n_params);
    memcpy(d->ad->w, ad->w, ad->n_params * sizeof(float));
    memcpy(d->ad->m1, ad->m1, ad->n_params * sizeof(float));
    memcpy(d->ad->m2, ad->m2, ad->n_params * sizeof(float));
    memset(d->ad->g, 0, ad->n_params * sizeof(float));
    d->ad->step = ad->step;
    for (int r = 0; !rc && r < d->n; r++) {
        const cm_train_exec *e = cm_train_pipe_exec(d->rep[r]);
        rc = e->load(e->user, ad, err, errlen);
    }
    return rc;
}

static int dp_window(void *user, const int32_t *tokens, const int32_t *target, int T, bool backward, float weight,
                     float dropout, uint64_t drop_key, double *loss, int *n_targets, char *err, size_t errlen) {
    cm_train_dp *d = user;
    if (!backward) { /* an eval: replica 0 */
        const cm_train_exec *e = cm_train_pipe_exec(d->rep[0]);
        return e->window(e->user, tokens, target, T, false, weight, dropout, drop_key, loss, n_targets, err, errlen);
    }
    if (d->n_jobs == d->cap_jobs) {
        const int cap = d->cap_jobs ? 2 * d->cap_jobs : 8;
        job *nj = cm_realloc(d->jobs, (size_t)cap * sizeof *nj);
        if (!nj) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        d->jobs = nj;
        for (int i = d->cap_jobs; i < cap; i++) {
            job *j = &d->jobs[i];
            *j = (job){0};
            j->tok = cm_malloc((size_t)d->n_ctx * sizeof(int32_t));
            j->tgt = cm_malloc((size_t)d->n_ctx * sizeof(int32_t));
            j->g = cm_malloc(d->ad->n_params * sizeof(float) + 1);
            d->cap_jobs = i + 1;
            if (!j->tok || !j->tgt || !j->g) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        }
    }
    job *j = &d->jobs[d->n_jobs++];
    CM_ASSERT(T >= 1 && T <= d->n_ctx);
    memcpy(j->tok, tokens, (size_t)T * sizeof(int32_t));
    memcpy(j->tgt, target, (size_t)T * sizeof(int32_t));
    j->T = T;
    j->weight = weight;
    j->dropout = dropout;
    j->key = drop_key;
    *loss = 0;
    *n_targets = 0;
    return 0;
}

static void *rep_main(void *arg) {
    rep_run *q = arg;
    cm_train_dp *d = q->d;
    const cm_train_exec *e = cm_train_pipe_exec(d->rep[q->r]);
    for (int i = q->j0; !q->rc && i < q->j1; i++) {
        job *j = &d->jobs[i];
        int nt;
        q->rc = e->window(e->user, j->tok, j->tgt, j->T, true, j->weight, j->dropout, j->key, &j->loss, &nt, q->err,
                          sizeof q->err);
        if (!q->rc && e->flush) q->rc = e->flush(e->user, &j->loss, q->err, sizeof q->err); /* just this window */
        if (!q->rc) q->rc = cm_train_pipe_take_grad(d->rep[q->r], j->g, q->err, sizeof q->err);
    }
    return NULL;
}

static int dp_flush(void *user, double *loss, char *err, size_t errlen) {
    cm_train_dp *d = user;
    rep_run q[CM_PLAN_MAX_NODES];
    pthread_t th[CM_PLAN_MAX_NODES];
    bool started[CM_PLAN_MAX_NODES] = {0};
    for (int r = 0; r < d->n; r++) {
        q[r] = (rep_run){.d = d, .r = r, .j0 = r * d->n_jobs / d->n, .j1 = (r + 1) * d->n_jobs / d->n};
        if (r > 0) started[r] = pthread_create(&th[r], NULL, rep_main, &q[r]) == 0;
        if (r > 0 && !started[r]) q[r].rc = cm_errf(q[r].err, sizeof q[r].err, CM_ENOMEM, "cannot start a thread");
    }
    rep_main(&q[0]);
    int rc = 0;
    for (int r = 0; r < d->n; r++) {
        if (started[r]) pthread_join(th[r], NULL);
        if (!rc && q[r].rc) rc = cm_errf(err, errlen, q[r].rc, "replica %d: %s", r, q[r].err);
    }
    const int n_jobs = d->n_jobs;
    d->n_jobs = 0;
    if (rc) return rc;
    double s = 0;
    float *g = d->ad->g;
    for (int i = 0; i < n_jobs; i++) { /* window order: one machine's sums */
        s += d->jobs[i].loss;
        const float *gj = d->jobs[i].g;
        for (size_t k = 0; k < d->ad->n_params; k++) g[k] += gj[k];
    }
    *loss += s;
    return 0;
}

static int dp_step(void *user, float lr, float beta1, float beta2, float eps, float wd, char *err, size_t errlen) {
    cm_train_dp *d = user;
    if (d->n_jobs) return cm_errf(err, errlen, CM_ESTATE, "a step with %d windows not flushed", d->n_jobs);
    cm_tadapter_adamw(d->ad, lr, beta1, beta2, eps, wd);
    for (int r = 0; r < d->n; r++) {
        int rc = cm_train_pipe_set_params(d->rep[r], d->ad, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

static int dp_gather(void *user, cm_tadapter *ad, char *err, size_t errlen) {
    cm_train_dp *d = user;
    (void)err, (void)errlen;
    memcpy(ad->w, d->ad->w, ad->n_params * sizeof(float));
    memcpy(ad->m1, d->ad->m1, ad->n_params * sizeof(float));
    memcpy(ad->m2, d->ad->m2, ad->n_params * sizeof(float));
    ad->step = d->ad->step;
    return 0;
}

int cm_train_dp_new(cm_train_dp **out, cm_train_pipe *const *reps, int n, const cm_model *m, int n_ctx, char *err,
                    size_t errlen) {
    *out = NULL;
    if (n < 1 || n > CM_PLAN_MAX_NODES) return cm_errf(err, errlen, CM_EINVAL, "%d replicas", n);
    cm_train_dp *d = cm_calloc(1, sizeof *d);
    if (!d) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    memcpy(d->rep, reps, (size_t)n * sizeof *reps);
    d->n = n;
    d->m = m;
    d->n_ctx = n_ctx;
    d->ex = (cm_train_exec){d, dp_load, dp_window, dp_step, dp_gather, dp_flush};
    *out = d;
    return 0;
}

void cm_train_dp_free(cm_train_dp *d) {
    if (!d) return;
    for (int i = 0; i < d->cap_jobs; i++) {
        cm_free(d->jobs[i].tok);
        cm_free(d->jobs[i].tgt);
        cm_free(d->jobs[i].g);
    }
    cm_free(d->jobs);
    cm_tadapter_free(d->ad);
    cm_free(d);
}

const cm_train_exec *cm_train_dp_exec(cm_train_dp *d) { return &d->ex; }
