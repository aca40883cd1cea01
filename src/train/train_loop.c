/*
 * train_loop.c: one fine-tuning run (finetune.h): split, pack, schedule,
 * steps, evals, checkpoints, the adapter and its loss curve. Everything a
 * step does is a function of (seed, step) and the adapter's state, so a
 * resumed run matches an uninterrupted one bit for bit.
 */
#include "finetune.h"

#include "../os/os.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void cm_finetune_opts_default(cm_finetune_opts *o) {
    memset(o, 0, sizeof *o);
    o->rank = 8;
    o->alpha = 16;
    o->targets = CM_TRAIN_TARGETS_ALL;
    o->lr = 1e-3f;
    o->lr_min = 0.1f;
    o->warmup = -1;
    o->weight_decay = 0.01f;
    o->batch = 4;
    o->grad_accum = 1;
    o->n_ctx = 256;
    o->epochs = 0; /* auto: 3 epochs, at least 50 steps */
    o->seed = 42;
    o->val_split = 0.1f;
    o->n_threads = 1;
}

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

typedef struct run {
    const cm_model *m;
    const cm_tdata *d;
    const cm_finetune_opts *o;
    cm_tadapter *ad;
    cm_trainer *tr;
    cm_twin *win, *val;
    int n_win, n_val;
    int *perm, perm_epoch;
    int32_t *tok, *tgt;
    float *hist;
    int64_t n_hist, cap_hist;
    int64_t steps;
    int warmup;
    const cm_train_exec *ex;
} run;

/* This machine as a cm_train_exec: the run's own trainer and adapter. */
static int local_load(void *user, const cm_tadapter *ad, char *err, size_t errlen) {
    (void)user, (void)ad, (void)err, (void)errlen;
    return 0;
}
static int local_window(void *user, const int32_t *tokens, const int32_t *target, int T, bool backward, float weight,
                        float dropout, uint64_t drop_key, double *loss, int *n_targets, char *err, size_t errlen) {
    (void)err, (void)errlen;
    *loss = cm_train_window(((run *)user)->tr, tokens, target, T, backward, weight, dropout, drop_key, n_targets);
    return 0;
}
static int local_step(void *user, float lr, float beta1, float beta2, float eps, float wd, char *err, size_t errlen) {
    (void)err, (void)errlen;
    cm_tadapter_adamw(((run *)user)->ad, lr, beta1, beta2, eps, wd);
    return 0;
}
static int local_gather(void *user, cm_tadapter *ad, char *err, size_t errlen) {
    (void)user, (void)ad, (void)err, (void)errlen;
    return 0;
}

/* The k-th window of training: epoch k / n_win, shuffled per epoch by seed. */
static cm_twin window_at(run *r, int64_t k, int *epoch) {
    const int e = (int)(k / r->n_win);
    if (e != r->perm_epoch) {
        cm_rng rng;
        cm_rng_seed(&rng, mix(r->o->seed ^ 0x65706f6368ull) + (uint64_t)e);
        for (int i = 0; i < r->n_win; i++) r->perm[i] = i;
        for (int i = r->n_win - 1; i > 0; i--) {
            int j = (int)(cm_rng_next(&rng) % (uint64_t)(i + 1)), t = r->perm[i];
            r->perm[i] = r->perm[j];
            r->perm[j] = t;
        }
        r->perm_epoch = e;
    }
    *epoch = e;
    return r->win[r->perm[k % r->n_win]];
}

static float lr_at(const run *r, int64_t step) {
    const cm_finetune_opts *o = r->o;
    if (step < r->warmup) return o->lr * (float)(step + 1) / (float)r->warmup;
    const double p = r->steps > r->warmup ? (double)(step - r->warmup) / (double)(r->steps - r->warmup) : 1.0;
    return (float)(o->lr * (o->lr_min + (1.0 - o->lr_min) * 0.5 * (1.0 + cos(M_PI * p))));
}

static int eval_loss(run *r, double *out, char *err, size_t errlen) {
    double s = 0;
    int64_t n = 0;
    for (int i = 0; i < r->n_val; i++) {
        int nt, T = cm_twin_fill(r->d, r->val[i], r->tok, r->tgt);
        double l;
        int rc = r->ex->window(r->ex->user, r->tok, r->tgt, T, false, 1.0f, 0.0f, 0, &l, &nt, err, errlen);
        if (rc) return rc;
        s += l;
        n += nt;
    }
    *out = n ? s / (double)n : NAN;
    return 0;
}

static int hist_add(run *r, float step, float loss, float val) {
    if (r->n_hist == r->cap_hist) {
        int64_t cap = r->cap_hist ? r->cap_hist * 2 : 256;
        float *h = cm_realloc(r->hist, (size_t)(3 * cap) * sizeof(float));
        if (!h) return CM_ENOMEM;
        r->hist = h;
        r->cap_hist = cap;
    }
    float *e = r->hist + 3 * r->n_hist++;
    e[0] = step, e[1] = loss, e[2] = val;
    return 0;
}

static int write_svg(const run *r, char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s.svg", r->o->out);
    cm_buf b;
    cm_buf_init(&b);
    cm_finetune_svg(r->hist, r->n_hist, &b);
    int rc = b.data ? cm_file_write_atomic(path, b.data, b.len, 0644, err, errlen)
                    : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    cm_buf_release(&b);
    return rc;
}

/* Split the examples, pack both sides, hash what the run trains on. */
static int prepare(run *r, uint64_t *data_id, char *err, size_t errlen) {
    const cm_tdata *d = r->d;
    int *tr_ex = cm_malloc((size_t)d->n_ex * sizeof(int)), *va_ex = cm_malloc((size_t)d->n_ex * sizeof(int));
    if (!tr_ex || !va_ex) {
        cm_free(tr_ex);
        cm_free(va_ex);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    int nt = 0, nv = 0;
    const uint64_t thr = (uint64_t)((double)r->o->val_split * 18446744073709551615.0);
    for (int i = 0; i < d->n_ex; i++) {
        if (r->o->val_split > 0 && mix(r->o->seed * 0x51ull + (uint64_t)i) < thr) va_ex[nv++] = i;
        else tr_ex[nt++] = i;
    }
    if (nt == 0) { /* a split that takes everything leaves nothing to train: no validation then */
        memcpy(tr_ex, va_ex, (size_t)nv * sizeof(int));
        nt = nv;
        nv = 0;
    }
    int rc = cm_tdata_pack(d, tr_ex, nt, r->o->n_ctx, &r->win, &r->n_win, err, errlen);
    if (!rc) rc = cm_tdata_pack(d, va_ex, nv, r->o->n_ctx, &r->val, &r->n_val, err, errlen);
    uint64_t h = fnv(0xcbf29ce484222325ull, d->tok, (size_t)d->n_tok * sizeof(int32_t));
    h = fnv(h, d->loss, (size_t)d->n_tok);
    h = fnv(h, va_ex, (size_t)nv * sizeof(int));
    h = fnv(h, &r->o->n_ctx, sizeof r->o->n_ctx);
    *data_id = h;
    cm_free(tr_ex);
    cm_free(va_ex);
    if (!rc && r->n_win == 0) rc = cm_errf(err, errlen, CM_EINVAL, "no training example has a token to learn");
    return rc;
}

int cm_finetune_run(const cm_model *m, const cm_tdata *d, const cm_finetune_opts *o, char *err, size_t errlen) {
    run r = {.m = m, .d = d, .o = o, .perm_epoch = -1};
    if (o->batch < 1 || o->grad_accum < 1 || o->n_ctx < 2 || o->steps < 0 || o->epochs < 0 || !(o->lr > 0) ||
        !(o->dropout >= 0 && o->dropout < 1) || !(o->val_split >= 0 && o->val_split < 1) || !o->out)
        return cm_errf(err, errlen, CM_EINVAL, "bad fine-tuning options");
    uint64_t data_id = 0;
    int rc = prepare(&r, &data_id, err, errlen);
    const int64_t per_step = (int64_t)o->batch * o->grad_accum;
    r.steps = o->steps ? o->steps : ((int64_t)(o->epochs ? o->epochs : 3) * r.n_win + per_step - 1) / per_step;
    if (!o->steps && !o->epochs && r.steps < 50) r.steps = 50; /* a small dataset still gets enough steps to learn */
    r.warmup = o->warmup >= 0 ? o->warmup : (int)(r.steps / 20);
    if (!rc) rc = cm_tadapter_new(&r.ad, m, o->rank, o->alpha, o->targets, o->seed, err, errlen);
    const cm_train_exec local = {&r, local_load, local_window, local_step, local_gather, NULL};
    r.ex = o->exec ? o->exec : &local;
    cm_pool *pool = !o->exec && o->n_threads > 1 ? cm_pool_new(o->n_threads) : NULL;
    if (!rc && !o->exec && o->n_threads > 1 && !pool)
        rc = cm_errf(err, errlen, CM_ENOMEM, "cannot start %d threads", o->n_threads);
    if (!rc && !o->exec) rc = cm_trainer_new(&r.tr, m, r.ad, o->n_ctx, pool, err, errlen);
    r.perm = cm_malloc((size_t)(r.n_win + 1) * sizeof(int));
    r.tok = cm_malloc((size_t)o->n_ctx * sizeof(int32_t));
    r.tgt = cm_malloc((size_t)o->n_ctx * sizeof(int32_t));
    if (!rc && (!r.perm || !r.tok || !r.tgt)) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    cm_train_ckpt ck = {.seed = o->seed, .data_id = data_id};
    if (!rc && o->resume) {
        rc = cm_train_ckpt_load(r.ad, &ck, o->resume, err, errlen);
        if (!rc) {
            r.hist = ck.hist;
            r.n_hist = r.cap_hist = ck.n_hist;
            if (r.ad->step > r.steps)
                rc = cm_errf(err, errlen, CM_EINVAL, "checkpoint '%s' is at step %lld, past this run's %lld steps",
                             o->resume, (long long)r.ad->step, (long long)r.steps);
        }
    }
    if (!rc) rc = r.ex->load(r.ex->user, r.ad, err, errlen);
    const int eval_every = o->eval_every > 0 ? o->eval_every : (int)(r.steps / 10 > 0 ? r.steps / 10 : 1);
    cm_finetune_status st = {.steps = r.steps, .val_loss = NAN, .n_train_win = r.n_win, .n_val_win = r.n_val};
    for (int i = 0; i < r.n_win; i++) st.n_train_tok += r.win[i].len - 1;
    const double t0 = cm_now_s();
    const int64_t step0 = r.ad ? r.ad->step : 0;
    int64_t tokens = 0;
    for (int64_t step = step0; !rc && step < r.steps; step++) {
        const float lr = lr_at(&r, step);
        int64_t nt = 0, k0 = step * per_step;
        for (int64_t k = k0; k < k0 + per_step; k++) { /* targets in the step: the loss is their mean */
            cm_twin w = window_at(&r, k, &st.epoch);
            for (int j = 1; j < w.len; j++) nt += d->loss[w.off + j];
        }
        double loss = 0;
        for (int64_t k = k0; !rc && k < k0 + per_step; k++) {
            int n_t, T = cm_twin_fill(d, window_at(&r, k, &st.epoch), r.tok, r.tgt);
            double l = 0;
            rc = r.ex->window(r.ex->user, r.tok, r.tgt, T, true, 1.0f / (float)nt, o->dropout,
                              mix(o->seed ^ ((uint64_t)k << 1)), &l, &n_t, err, errlen);
            loss += l;
            tokens += T;
        }
        if (!rc && r.ex->flush) {
            double l = 0;
            rc = r.ex->flush(r.ex->user, &l, err, errlen);
            loss += l;
        }
        st.epoch = (int)(k0 / r.n_win);
        if (!rc) rc = r.ex->step(r.ex->user, lr, 0.9f, 0.999f, 1e-8f, o->weight_decay, err, errlen);
        const bool last = step + 1 == r.steps, save = o->save_every > 0 && (step + 1) % o->save_every == 0;
        float val = NAN;
        if (!rc && r.n_val > 0 && ((step + 1) % eval_every == 0 || last || save)) {
            double v = NAN;
            rc = eval_loss(&r, &v, err, errlen);
            st.val_loss = val = (float)v;
        }
        if (hist_add(&r, (float)(step + 1), (float)(loss / (double)nt), val))
            rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        char ckpath[4200];
        st.saved = NULL;
        if (!rc && save) rc = r.ex->gather(r.ex->user, r.ad, err, errlen);
        if (!rc && save) {
            snprintf(ckpath, sizeof ckpath, "%s.ckpt-%lld.gguf", o->out, (long long)(step + 1));
            cm_train_ckpt c = {.seed = o->seed, .data_id = data_id, .n_hist = r.n_hist, .hist = r.hist};
            rc = cm_train_ckpt_save(r.ad, &c, ckpath, err, errlen);
            if (!rc) rc = cm_tadapter_write(r.ad, o->out, NULL, err, errlen);
            st.saved = ckpath;
        }
        const double el = cm_now_s() - t0;
        st.step = step + 1;
        st.lr = lr;
        st.loss = loss / (double)nt;
        st.tok_per_s = el > 0 ? (double)tokens / el : 0;
        st.eta_s = el / (double)(step + 1 - step0) * (double)(r.steps - step - 1);
        if (!rc && o->progress) o->progress(o->progress_user, &st);
    }
    if (!rc) rc = r.ex->gather(r.ex->user, r.ad, err, errlen);
    if (!rc) rc = cm_tadapter_write(r.ad, o->out, NULL, err, errlen);
    if (!rc) rc = write_svg(&r, err, errlen);
    cm_free(r.win);
    cm_free(r.val);
    cm_free(r.perm);
    cm_free(r.tok);
    cm_free(r.tgt);
    cm_free(r.hist);
    cm_trainer_free(r.tr);
    cm_pool_free(pool);
    cm_tadapter_free(r.ad);
    return rc;
}
