/*
 * train_model.c: the training forward and backward pass of one window of
 * tokens through a dense llama-family model with LoRA (train.h).
 *
 * Plain F32 loops over weight rows dequantized on the fly (the model's
 * to_float kernels), so any weight type trains; the math follows the
 * inference forward (model.h): RMS norm with a double sum of squares, RoPE
 * from rope.c (its transpose, a rotation by minus the angle, in backward),
 * qwen3's per-head q/k norms, causal softmax attention with grouped KV
 * heads, SiLU-gated FFN. Layer inputs are kept; each layer's intermediates
 * are recomputed from its input during backward. Never allocates inside
 * cm_train_window: the workspace is sized by cm_trainer_new.
 */
#include "train.h"

#include "../kernels/kernels.h"
#include "../os/os.h"

#include <math.h>
#include <string.h>

enum { ROWS = 64 }; /* weight rows dequantized per block */

struct cm_trainer {
    const cm_model *m;
    cm_tadapter *ad;
    const cm_kernels *k;
    int n_ctx;
    int l0, l1; /* the layers this trainer runs: [l0, l1) */
    int64_t E, Q, KV, F, V, H, HKV, D;
    float *rope; /* [n_ctx][n_rot] cos/sin cache */
    float *xs;   /* [l1 - l0 + 1][T][E] layer inputs (last: the output of layer l1 - 1) */
    /* one layer's intermediates */
    float *xn, *rinv1, *qraw, *kraw, *q, *k_, *v, *qri, *kri, *P, *ao, *h, *hn, *rinv2, *g, *u, *a;
    /* gradients */
    float *dx, *dxn, *dq, *dk, *dv, *dao, *da, *dg, *du, *dhn, *dtmp;
    float *xd, *ax, *dax; /* LoRA: dropped input [T][max_in], A x and its gradient [T][rank] */
    float *wrow, *wt;     /* per thread: ROWS dequantized rows, and transposed (wrow_n floats each) */
    size_t wrow_n;
    cm_pool *pool;     /* NULL: the caller's thread only */
    float *mtmp;       /* [T][max n_in]: one block's share of W^T dy */
    float *logits;     /* [T][V] */
    float *gw;         /* [ad->n_params]: one window's gradients (cm_train_back), added to ad->g at its end */
    size_t g_off, g_n; /* the span of layers [l0, l1)'s pairs in ad's vectors */
    /* the current window's dropout */
    float drop;
    uint64_t drop_key, win_key; /* win_key: the window's key, drop_key the layer's */
    int T;                      /* the current window's tokens (cm_train_fwd) */
};

/* ---------------- small vector ops ---------------- */

static float dotf(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static void axpy(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---------------- frozen weights ---------------- */

/* Rows [r0, r0 + n) of w as floats into out (F32 weights are pointed at). */
static const float *rows_of(const cm_trainer *tr, const cm_tensor *w, int64_t r0, int64_t n, float *out) {
    if (w->type == CM_TYPE_F32) return (const float *)w->data + r0 * w->ne[0];
    const size_t rs = cm_row_size(w->type, w->ne[0]);
    for (int64_t r = 0; r < n; r++)
        tr->k->to_float[w->type]((const char *)w->data + (size_t)(r0 + r) * rs, out + r * w->ne[0], w->ne[0]);
    return out;
}

/* One matmul handed to the pool: y = W x (forward) or dx += W^T dy. */
typedef struct mm_job {
    cm_trainer *tr;
    const cm_tensor *w;
    const float *x; /* x, or dy */
    float *y;       /* y, or dx */
    int T;
} mm_job;

/* y[T][n_out] = W x (x [T][n_in]): blocks of ROWS rows as floats through
 * the kernels' F32 gemm (or vec_dot). Thread ith takes every nth block, so
 * each output has one owner and the same sums for any thread count. */
static void mm_task(void *ctx, int ith, int nth) {
    const mm_job *j = ctx;
    cm_trainer *tr = j->tr;
    const cm_tensor *w = j->w;
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    const cm_gemm_fn gemm = tr->k->gemm[CM_TYPE_F32];
    const size_t xs = (size_t)n_in * sizeof(float);
    float *buf = tr->wrow + (size_t)ith * tr->wrow_n;
    for (int64_t r0 = (int64_t)ith * ROWS; r0 < n_out; r0 += (int64_t)nth * ROWS) {
        const int64_t nr = n_out - r0 < ROWS ? n_out - r0 : ROWS;
        const float *wr = rows_of(tr, w, r0, nr, buf);
        if (gemm && j->T > 1) {
            gemm(n_in, wr, xs, j->x, xs, j->y + r0, n_out, 0, nr, j->T);
            continue;
        }
        for (int t = 0; t < j->T; t++)
            for (int64_t r = 0; r < nr; r++)
                tr->k->vec_dot[CM_TYPE_F32](n_in, &j->y[(int64_t)t * n_out + r0 + r], wr + r * n_in,
                                            j->x + (int64_t)t * n_in);
    }
}

/* dx[T][n_in] += W^T dy: per block of ROWS rows, thread ith takes the
 * columns [i0, i1) of W: transposed, they are the rows of a gemm with the
 * block's share of dy as the activations; dx's columns have one owner and
 * sum the blocks in order. */
static void mm_back_task(void *ctx, int ith, int nth) {
    const mm_job *j = ctx;
    cm_trainer *tr = j->tr;
    const cm_tensor *w = j->w;
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    const cm_gemm_fn gemm = tr->k->gemm[CM_TYPE_F32];
    int64_t i0, i1;
    cm_split_range(n_in, ith, nth, &i0, &i1);
    if (i1 <= i0) return;
    float *buf = tr->wrow + (size_t)ith * tr->wrow_n, *wt = tr->wt + (size_t)ith * tr->wrow_n;
    const int T = j->T;
    for (int64_t r0 = 0; r0 < n_out; r0 += ROWS) {
        const int64_t nr = n_out - r0 < ROWS ? n_out - r0 : ROWS;
        const float *wr = rows_of(tr, w, r0, nr, buf);
        for (int64_t r = 0; r < nr; r++) /* wt[i - i0][r] = W[r0 + r][i] */
            for (int64_t i = i0; i < i1; i++) wt[(i - i0) * nr + r] = wr[r * n_in + i];
        const float *dy = j->x + r0;
        if (gemm && T > 1)
            gemm(nr, wt, (size_t)nr * sizeof(float), dy, (size_t)n_out * sizeof(float), tr->mtmp + i0, n_in, 0, i1 - i0,
                 T);
        else
            for (int t = 0; t < T; t++)
                for (int64_t i = i0; i < i1; i++)
                    tr->k->vec_dot[CM_TYPE_F32](nr, &tr->mtmp[(int64_t)t * n_in + i], wt + (i - i0) * nr,
                                                dy + (int64_t)t * n_out);
        for (int t = 0; t < T; t++)
            for (int64_t i = i0; i < i1; i++) j->y[(int64_t)t * n_in + i] += tr->mtmp[(int64_t)t * n_in + i];
    }
}

static void mm(cm_trainer *tr, const cm_tensor *w, const float *x, int T, float *y) {
    mm_job j = {tr, w, x, y, T};
    if (tr->pool) cm_pool_run(tr->pool, mm_task, &j);
    else mm_task(&j, 0, 1);
}

static void mm_back(cm_trainer *tr, const cm_tensor *w, const float *dy, int T, float *dx) {
    mm_job j = {tr, w, dy, dx, T};
    if (tr->pool) cm_pool_run(tr->pool, mm_back_task, &j);
    else mm_back_task(&j, 0, 1);
}

/* ---------------- LoRA ---------------- */

/* Is element i of pair p's input dropped in this window? */
static bool dropped(const cm_trainer *tr, int p, int64_t i) {
    const uint64_t thr = (uint64_t)((double)tr->drop * 18446744073709551616.0);
    const uint64_t pg = (uint64_t)(tr->ad->pair0 + p); /* the whole adapter's pair: a slice drops the same */
    return mix64(mix64(tr->drop_key ^ (pg * 0x9e3779b97f4a7c15ull)) + (uint64_t)i) < thr;
}

/* x with the pair's dropout applied (or x itself). */
static const float *lora_input(cm_trainer *tr, int p, const float *x, int T) {
    if (tr->drop <= 0.0f) return x;
    const int64_t n = tr->ad->pairs[p].n_in;
    const float keep = 1.0f / (1.0f - tr->drop);
    for (int64_t i = 0; i < (int64_t)T * n; i++) tr->xd[i] = dropped(tr, p, i) ? 0.0f : x[i] * keep;
    return tr->xd;
}

static void lora_fwd(cm_trainer *tr, int il, enum cm_lora_target t, const float *x, int T, float *y) {
    const cm_tadapter *ad = tr->ad;
    const int p = ad->slot[il * CM_LORA_OUTPUT + t];
    if (p < 0) return;
    const cm_tpair *pr = &ad->pairs[p];
    const int R = ad->rank;
    const float *A = ad->w + pr->a, *B = ad->w + pr->b, *xi = lora_input(tr, p, x, T);
    for (int j = 0; j < T; j++) {
        float *ax = tr->ax + (int64_t)j * R;
        for (int r = 0; r < R; r++) ax[r] = dotf(A + (int64_t)r * pr->n_in, xi + (int64_t)j * pr->n_in, pr->n_in);
        float *yj = y + (int64_t)j * pr->n_out;
        for (int64_t o = 0; o < pr->n_out; o++) yj[o] += ad->scale * dotf(B + o * R, ax, R);
    }
}

/* Gradients of A and B (times weight) from dy, and dx += the input gradient. */
static void lora_back(cm_trainer *tr, int il, enum cm_lora_target t, const float *x, const float *dy, int T,
                      float weight, float *dx) {
    cm_tadapter *ad = tr->ad;
    const int p = ad->slot[il * CM_LORA_OUTPUT + t];
    if (p < 0) return;
    const cm_tpair *pr = &ad->pairs[p];
    const int R = ad->rank;
    const int64_t n_in = pr->n_in, n_out = pr->n_out;
    const float *A = ad->w + pr->a, *B = ad->w + pr->b, *xi = lora_input(tr, p, x, T);
    float *gA = ad->g + pr->a, *gB = ad->g + pr->b;
    const float s = ad->scale;
    for (int j = 0; j < T; j++) {
        float *ax = tr->ax, *dax = tr->dax;
        const float *xj = xi + (int64_t)j * n_in, *dyj = dy + (int64_t)j * n_out;
        for (int r = 0; r < R; r++) ax[r] = dotf(A + (int64_t)r * n_in, xj, n_in);
        for (int r = 0; r < R; r++) dax[r] = 0.0f;
        for (int64_t o = 0; o < n_out; o++) {
            const float d = s * dyj[o];
            axpy(weight * d, ax, gB + o * R, R);
            axpy(d, B + o * R, dax, R);
        }
        for (int r = 0; r < R; r++) axpy(weight * dax[r], xj, gA + (int64_t)r * n_in, n_in);
        if (!dx) continue;
        /* the input gradient goes through the dropout mask (x_i kept: scaled by 1/(1-p)) */
        float *dxj = dx + (int64_t)j * n_in;
        if (tr->drop <= 0.0f) {
            for (int r = 0; r < R; r++) axpy(dax[r], A + (int64_t)r * n_in, dxj, n_in);
        } else {
            for (int64_t i = 0; i < n_in; i++) {
                if (dropped(tr, p, (int64_t)j * n_in + i)) continue;
                float acc = 0.0f;
                for (int r = 0; r < R; r++) acc += dax[r] * A[(int64_t)r * n_in + i];
                dxj[i] += acc / (1.0f - tr->drop);
            }
        }
    }
}

/* y = W x + LoRA (+ bias). */
static void proj(cm_trainer *tr, int il, enum cm_lora_target t, const cm_tensor *w, const cm_tensor *bias,
                 const float *x, int T, float *y) {
    mm(tr, w, x, T, y);
    lora_fwd(tr, il, t, x, T, y);
    if (bias && bias->data)
        for (int j = 0; j < T; j++) axpy(1.0f, bias->data, y + (int64_t)j * w->ne[1], w->ne[1]);
}

static void proj_back(cm_trainer *tr, int il, enum cm_lora_target t, const cm_tensor *w, const float *x,
                      const float *dy, int T, float weight, float *dx) {
    if (dx) mm_back(tr, w, dy, T, dx);
    lora_back(tr, il, t, x, dy, T, weight, dx);
}

/* ---------------- norms, RoPE, attention ---------------- */

static float rms_fwd(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float ri = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * ri * w[i];
    return ri;
}

/* dx += d/dx of y = x ri w, given dy. */
static void rms_back(const float *x, const float *w, float ri, const float *dy, float *dx, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)(dy[i] * w[i] * x[i]);
    const float c = (float)(s / (double)n) * ri * ri * ri;
    for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * w[i] * ri - c * x[i];
}

/* RoPE of each head of rows [T][nh * D] in place; inverse: the transpose. */
static void rope_rows(const cm_trainer *tr, float *x, int T, int64_t nh, bool inverse) {
    const cm_hparams *hp = &tr->m->hp;
    const int nr = hp->n_rot;
    float c[1024];
    for (int j = 0; j < T; j++) {
        const float *cache = tr->rope + (int64_t)j * nr;
        if (inverse) {
            for (int i = 0; i < nr; i += 2) {
                c[i] = cache[i];
                c[i + 1] = -cache[i + 1];
            }
            cache = c;
        }
        for (int64_t h = 0; h < nh; h++) cm_rope_apply(hp->rope_type, nr, cache, x + ((int64_t)j * nh + h) * tr->D);
    }
}

/* P[h][i][j] and ao from q, k, v (causal, GQA). */
static void attn_fwd(cm_trainer *tr, int T) {
    const int64_t D = tr->D, H = tr->H, rep = tr->H / tr->HKV;
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t h = 0; h < H; h++) {
        const int64_t g = h / rep;
        for (int i = 0; i < T; i++) {
            float *p = tr->P + (h * T + i) * T;
            const float *qi = tr->q + ((int64_t)i * H + h) * D;
            float mx = -INFINITY;
            for (int j = 0; j <= i; j++) {
                p[j] = scale * dotf(qi, tr->k_ + ((int64_t)j * tr->HKV + g) * D, D);
                if (p[j] > mx) mx = p[j];
            }
            double sum = 0.0;
            for (int j = 0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
            const float inv = (float)(1.0 / sum);
            float *o = tr->ao + ((int64_t)i * H + h) * D;
            memset(o, 0, (size_t)D * sizeof(float));
            for (int j = 0; j <= i; j++) {
                p[j] *= inv;
                axpy(p[j], tr->v + ((int64_t)j * tr->HKV + g) * D, o, D);
            }
        }
    }
}

/* dq, dk, dv (zeroed here) from dao. */
static void attn_back(cm_trainer *tr, int T) {
    const int64_t D = tr->D, H = tr->H, HKV = tr->HKV, rep = H / HKV;
    const float scale = 1.0f / sqrtf((float)D);
    memset(tr->dq, 0, (size_t)(T * tr->Q) * sizeof(float));
    memset(tr->dk, 0, (size_t)(T * tr->KV) * sizeof(float));
    memset(tr->dv, 0, (size_t)(T * tr->KV) * sizeof(float));
    float *dp = tr->dtmp; /* [T] */
    for (int64_t h = 0; h < H; h++) {
        const int64_t g = h / rep;
        for (int i = 0; i < T; i++) {
            const float *p = tr->P + (h * T + i) * T, *doi = tr->dao + ((int64_t)i * H + h) * D;
            const float *qi = tr->q + ((int64_t)i * H + h) * D;
            float *dqi = tr->dq + ((int64_t)i * H + h) * D;
            double dot = 0.0;
            for (int j = 0; j <= i; j++) {
                dp[j] = dotf(doi, tr->v + ((int64_t)j * HKV + g) * D, D);
                dot += (double)(p[j] * dp[j]);
                axpy(p[j], doi, tr->dv + ((int64_t)j * HKV + g) * D, D);
            }
            for (int j = 0; j <= i; j++) {
                const float ds = p[j] * (dp[j] - (float)dot) * scale;
                axpy(ds, tr->k_ + ((int64_t)j * HKV + g) * D, dqi, D);
                axpy(ds, qi, tr->dk + ((int64_t)j * HKV + g) * D, D);
            }
        }
    }
}

/* ---------------- one layer ---------------- */

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* Forward of layer il from x (T rows); fills the intermediates and xout. */
static void layer_fwd(cm_trainer *tr, int il, const float *x, int T, float *xout) {
    const cm_layer *L = &tr->m->layers[il];
    const float eps = tr->m->hp.rms_eps;
    const int64_t E = tr->E, F = tr->F, D = tr->D;
    for (int j = 0; j < T; j++) tr->rinv1[j] = rms_fwd(x + j * E, L->attn_norm.data, tr->xn + j * E, E, eps);
    proj(tr, il, CM_LORA_Q, &L->wq, &L->bq, tr->xn, T, tr->qraw);
    proj(tr, il, CM_LORA_K, &L->wk, &L->bk, tr->xn, T, tr->kraw);
    proj(tr, il, CM_LORA_V, &L->wv, &L->bv, tr->xn, T, tr->v);
    memcpy(tr->q, tr->qraw, (size_t)(T * tr->Q) * sizeof(float));
    memcpy(tr->k_, tr->kraw, (size_t)(T * tr->KV) * sizeof(float));
    if (L->q_norm.data)
        for (int64_t i = 0; i < T * tr->H; i++)
            tr->qri[i] = rms_fwd(tr->qraw + i * D, L->q_norm.data, tr->q + i * D, D, eps);
    if (L->k_norm.data)
        for (int64_t i = 0; i < T * tr->HKV; i++)
            tr->kri[i] = rms_fwd(tr->kraw + i * D, L->k_norm.data, tr->k_ + i * D, D, eps);
    rope_rows(tr, tr->q, T, tr->H, false);
    rope_rows(tr, tr->k_, T, tr->HKV, false);
    attn_fwd(tr, T);
    proj(tr, il, CM_LORA_O, &L->wo, NULL, tr->ao, T, tr->h);
    for (int64_t i = 0; i < T * E; i++) tr->h[i] += x[i];
    for (int j = 0; j < T; j++) tr->rinv2[j] = rms_fwd(tr->h + j * E, L->ffn_norm.data, tr->hn + j * E, E, eps);
    proj(tr, il, CM_LORA_GATE, &L->ffn_gate, NULL, tr->hn, T, tr->g);
    proj(tr, il, CM_LORA_UP, &L->ffn_up, NULL, tr->hn, T, tr->u);
    for (int64_t i = 0; i < T * F; i++) tr->a[i] = silu(tr->g[i]) * tr->u[i];
    proj(tr, il, CM_LORA_DOWN, &L->ffn_down, NULL, tr->a, T, xout);
    for (int64_t i = 0; i < T * E; i++) xout[i] += tr->h[i];
}

/* Backward of layer il (intermediates from layer_fwd): tr->dx holds the
 * output's gradient on entry and the input's on return. */
static void layer_back(cm_trainer *tr, int il, const float *x, int T, float w) {
    const cm_layer *L = &tr->m->layers[il];
    const int64_t E = tr->E, F = tr->F, D = tr->D;
    const bool need_dx = il > 0;
    /* FFN: dh = dx (residual) + through ffn_down, gate/up, ffn_norm */
    memset(tr->da, 0, (size_t)(T * F) * sizeof(float));
    proj_back(tr, il, CM_LORA_DOWN, &L->ffn_down, tr->a, tr->dx, T, w, tr->da);
    for (int64_t i = 0; i < T * F; i++) {
        const float sg = 1.0f / (1.0f + expf(-tr->g[i]));
        tr->du[i] = tr->da[i] * tr->g[i] * sg;
        tr->dg[i] = tr->da[i] * tr->u[i] * sg * (1.0f + tr->g[i] * (1.0f - sg));
    }
    memset(tr->dhn, 0, (size_t)(T * E) * sizeof(float));
    proj_back(tr, il, CM_LORA_GATE, &L->ffn_gate, tr->hn, tr->dg, T, w, tr->dhn);
    proj_back(tr, il, CM_LORA_UP, &L->ffn_up, tr->hn, tr->du, T, w, tr->dhn);
    for (int j = 0; j < T; j++)
        rms_back(tr->h + j * E, L->ffn_norm.data, tr->rinv2[j], tr->dhn + j * E, tr->dx + j * E, E);
    /* attention: dx now is dh */
    memset(tr->dao, 0, (size_t)(T * tr->Q) * sizeof(float));
    proj_back(tr, il, CM_LORA_O, &L->wo, tr->ao, tr->dx, T, w, tr->dao);
    attn_back(tr, T);
    rope_rows(tr, tr->dq, T, tr->H, true);
    rope_rows(tr, tr->dk, T, tr->HKV, true);
    if (L->q_norm.data) { /* dq is the gradient of the normed q: through the norm (dao as scratch) */
        memset(tr->dao, 0, (size_t)(T * tr->Q) * sizeof(float));
        for (int64_t i = 0; i < T * tr->H; i++)
            rms_back(tr->qraw + i * D, L->q_norm.data, tr->qri[i], tr->dq + i * D, tr->dao + i * D, D);
        memcpy(tr->dq, tr->dao, (size_t)(T * tr->Q) * sizeof(float));
    }
    if (L->k_norm.data) {
        memset(tr->dao, 0, (size_t)(T * tr->KV) * sizeof(float));
        for (int64_t i = 0; i < T * tr->HKV; i++)
            rms_back(tr->kraw + i * D, L->k_norm.data, tr->kri[i], tr->dk + i * D, tr->dao + i * D, D);
        memcpy(tr->dk, tr->dao, (size_t)(T * tr->KV) * sizeof(float));
    }
    float *dxn = need_dx ? tr->dxn : NULL;
    if (dxn) memset(dxn, 0, (size_t)(T * E) * sizeof(float));
    proj_back(tr, il, CM_LORA_Q, &L->wq, tr->xn, tr->dq, T, w, dxn);
    proj_back(tr, il, CM_LORA_K, &L->wk, tr->xn, tr->dk, T, w, dxn);
    proj_back(tr, il, CM_LORA_V, &L->wv, tr->xn, tr->dv, T, w, dxn);
    if (need_dx)
        for (int j = 0; j < T; j++)
            rms_back(x + j * E, L->attn_norm.data, tr->rinv1[j], dxn + j * E, tr->dx + j * E, E);
}

/* ---------------- window ---------------- */

/* The window's stage pieces (train.h): layer inputs kept in xs, slot il - l0. */
static float *xs_at(const cm_trainer *tr, int il) { return tr->xs + (int64_t)(il - tr->l0) * tr->T * tr->E; }

void cm_train_fwd(cm_trainer *tr, const int32_t *tokens, const float *x_in, int T, float dropout, uint64_t drop_key) {
    const cm_model *m = tr->m;
    const int64_t E = tr->E;
    CM_ASSERT(T >= 1 && T <= tr->n_ctx && (tr->l0 == 0 ? tokens != NULL : x_in != NULL));
    tr->T = T;
    tr->drop = dropout;
    tr->win_key = drop_key;
    if (tr->l0 == 0) {
        for (int j = 0; j < T; j++) {
            const float *r = rows_of(tr, &m->tok_embd, tokens[j], 1, tr->xs + j * E);
            if (r != tr->xs + j * E) memcpy(tr->xs + j * E, r, (size_t)E * sizeof(float));
        }
    } else memcpy(tr->xs, x_in, (size_t)(T * E) * sizeof(float));
    for (int il = tr->l0; il < tr->l1; il++) {
        tr->drop_key = mix64(drop_key + (uint64_t)il);
        layer_fwd(tr, il, xs_at(tr, il), T, xs_at(tr, il + 1));
    }
}

const float *cm_train_out(const cm_trainer *tr) { return xs_at(tr, tr->l1); }

double cm_train_head(cm_trainer *tr, const int32_t *target, bool backward, float weight, int *n_targets) {
    const cm_model *m = tr->m;
    const int T = tr->T;
    const int64_t E = tr->E, V = tr->V;
    CM_ASSERT(tr->l1 == m->hp.n_layer);
    /* head: final norm (hn as scratch), logits, cross-entropy and its gradient */
    const float *xl = xs_at(tr, tr->l1);
    for (int j = 0; j < T; j++)
        tr->rinv2[j] = rms_fwd(xl + j * E, m->output_norm.data, tr->hn + j * E, E, m->hp.rms_eps);
    mm(tr, &m->output, tr->hn, T, tr->logits);
    double loss = 0.0;
    int nt = 0;
    for (int j = 0; j < T; j++) {
        float *lg = tr->logits + (int64_t)j * V;
        if (target[j] < 0 || target[j] >= V) {
            memset(lg, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
        for (int64_t i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < V; i++) sum += exp((double)(lg[i] - mx));
        loss += log(sum) + (double)mx - (double)lg[target[j]];
        nt++;
        for (int64_t i = 0; i < V; i++) lg[i] = weight * (float)(exp((double)(lg[i] - mx)) / sum);
        lg[target[j]] -= weight;
    }
    *n_targets = nt;
    if (!backward) return loss;
    /* dlogits -> d hidden: weight is already in the logits' gradient, so LoRA grads take 1 */
    memset(tr->dhn, 0, (size_t)(T * E) * sizeof(float));
    mm_back(tr, &m->output, tr->logits, T, tr->dhn);
    memset(tr->dx, 0, (size_t)(T * E) * sizeof(float));
    for (int j = 0; j < T; j++)
        rms_back(xl + j * E, m->output_norm.data, tr->rinv2[j], tr->dhn + j * E, tr->dx + j * E, E);
    return loss;
}

void cm_train_back(cm_trainer *tr, const float *dy, float *dx) {
    const int T = tr->T;
    const int64_t E = tr->E;
    if (dy) memcpy(tr->dx, dy, (size_t)(T * E) * sizeof(float));
    /* The window's gradients start from 0 and join ad->g at the end: the
     * step's sum is then over whole windows in window order, which replicas
     * that each compute some of the windows can reproduce (train_pipe.h). */
    float *g = tr->ad->g;
    memset(tr->gw + tr->g_off, 0, tr->g_n * sizeof(float));
    tr->ad->g = tr->gw;
    for (int il = tr->l1 - 1; il >= tr->l0; il--) {
        tr->drop_key = mix64(tr->win_key + (uint64_t)il);
        const float *x = xs_at(tr, il);
        layer_fwd(tr, il, x, T, tr->dtmp + T); /* recompute; the output itself is not needed */
        layer_back(tr, il, x, T, 1.0f);
    }
    tr->ad->g = g;
    for (size_t i = tr->g_off; i < tr->g_off + tr->g_n; i++) g[i] += tr->gw[i];
    if (dx && tr->l0 > 0) memcpy(dx, tr->dx, (size_t)(T * E) * sizeof(float));
}

size_t cm_train_saved_floats(const cm_trainer *tr) { return (size_t)(tr->l1 - tr->l0 + 1) * tr->n_ctx * tr->E; }

void cm_train_save(const cm_trainer *tr, cm_train_saved *s) {
    memcpy(s->xs, tr->xs, (size_t)(tr->l1 - tr->l0 + 1) * tr->T * tr->E * sizeof(float));
    s->T = tr->T, s->drop = tr->drop, s->key = tr->win_key;
}

void cm_train_restore(cm_trainer *tr, const cm_train_saved *s) {
    tr->T = s->T, tr->drop = s->drop, tr->win_key = s->key;
    memcpy(tr->xs, s->xs, (size_t)(tr->l1 - tr->l0 + 1) * tr->T * tr->E * sizeof(float));
}

double cm_train_window(cm_trainer *tr, const int32_t *tokens, const int32_t *target, int T, bool backward, float weight,
                       float dropout, uint64_t drop_key, int *n_targets) {
    CM_ASSERT(tr->l0 == 0 && tr->l1 == tr->m->hp.n_layer);
    cm_train_fwd(tr, tokens, NULL, T, dropout, drop_key);
    const double loss = cm_train_head(tr, target, backward, weight, n_targets);
    if (backward) cm_train_back(tr, NULL, NULL);
    return loss;
}

/* ---------------- workspace ---------------- */

int cm_trainer_new(cm_trainer **out, const cm_model *m, cm_tadapter *ad, int n_ctx, cm_pool *pool, char *err,
                   size_t errlen) {
    return cm_trainer_new_range(out, m, ad, 0, m->hp.n_layer, n_ctx, pool, err, errlen);
}

int cm_trainer_new_range(cm_trainer **out, const cm_model *m, cm_tadapter *ad, int l0, int l1, int n_ctx, cm_pool *pool,
                         char *err, size_t errlen) {
    *out = NULL;
    if (l0 < 0 || l1 <= l0 || l1 > m->hp.n_layer)
        return cm_errf(err, errlen, CM_EINVAL, "layers [%d, %d) of %d", l0, l1, m->hp.n_layer);
    int rc = cm_train_check_model(m, err, errlen);
    if (rc) return rc;
    if (n_ctx < 1 || n_ctx > 1 << 16) return cm_errf(err, errlen, CM_EINVAL, "context %d is out of [1, 65536]", n_ctx);
    if (m->hp.n_rot > 1024) return cm_errf(err, errlen, CM_EUNSUPPORTED, "rope dimension %d is too large", m->hp.n_rot);
    cm_trainer *tr = cm_calloc(1, sizeof *tr);
    if (!tr) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    const cm_hparams *hp = &m->hp;
    tr->m = m;
    tr->ad = ad;
    tr->k = cm_kernels_get();
    tr->n_ctx = n_ctx;
    tr->l0 = l0;
    tr->l1 = l1;
    tr->E = hp->n_embd;
    tr->H = hp->n_head;
    tr->HKV = hp->n_head_kv;
    tr->D = hp->head_dim;
    tr->Q = tr->H * tr->D;
    tr->KV = tr->HKV * tr->D;
    tr->F = hp->n_ff;
    tr->V = hp->n_vocab;
    const int64_t T = n_ctx, E = tr->E, Q = tr->Q, KV = tr->KV, F = tr->F;
    int64_t mx = E > Q ? E : Q;
    mx = mx > F ? mx : F;
    const int64_t nth = pool ? cm_pool_size(pool) : 1;
    tr->pool = pool;
    tr->wrow_n = (size_t)(ROWS * mx);
    // clang-format off
    struct {
        float **p;
        int64_t n;
    } bufs[] = {
        {&tr->rope, T * hp->n_rot}, {&tr->xs, (int64_t)(l1 - l0 + 1) * T * E},
        {&tr->xn, T * E}, {&tr->rinv1, T}, {&tr->qraw, T * Q}, {&tr->kraw, T * KV}, {&tr->q, T * Q},
        {&tr->k_, T * KV}, {&tr->v, T * KV}, {&tr->qri, T * tr->H}, {&tr->kri, T * tr->HKV},
        {&tr->P, tr->H * T * T}, {&tr->ao, T * Q}, {&tr->h, T * E}, {&tr->hn, T * E}, {&tr->rinv2, T},
        {&tr->g, T * F}, {&tr->u, T * F}, {&tr->a, T * F},
        {&tr->dx, T * E}, {&tr->dxn, T * E}, {&tr->dq, T * Q}, {&tr->dk, T * KV}, {&tr->dv, T * KV},
        {&tr->dao, T * (Q > KV ? Q : KV)}, {&tr->da, T * F}, {&tr->dg, T * F}, {&tr->du, T * F}, {&tr->dhn, T * E},
        {&tr->dtmp, T + T * E}, {&tr->xd, T * mx}, {&tr->ax, T * ad->rank}, {&tr->dax, ad->rank},
        {&tr->wrow, nth * ROWS * mx}, {&tr->wt, nth * ROWS * mx}, {&tr->mtmp, T * mx},
        {&tr->logits, l1 == hp->n_layer ? T * tr->V : 1}, {&tr->gw, (int64_t)ad->n_params + 1},
    };
    // clang-format on
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = cm_malloc((size_t)bufs[i].n * sizeof(float));
        if (!*bufs[i].p) {
            cm_trainer_free(tr);
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory for the training workspace (context %d)", n_ctx);
        }
    }
    cm_tadapter_span(ad, l0, l1, &tr->g_off, &tr->g_n);
    for (int j = 0; j < n_ctx; j++)
        cm_rope_cache(&hp->rope_scaling, hp->n_rot, hp->rope_base, m->rope_freqs.data, (float)j,
                      tr->rope + (int64_t)j * hp->n_rot);
    *out = tr;
    return 0;
}

void cm_trainer_free(cm_trainer *tr) {
    if (!tr) return;
    float *bufs[] = {tr->rope, tr->xs, tr->xn,  tr->rinv1, tr->qraw, tr->kraw,  tr->q,      tr->k_, tr->v,   tr->qri,
                     tr->kri,  tr->P,  tr->ao,  tr->h,     tr->hn,   tr->rinv2, tr->g,      tr->u,  tr->a,   tr->dx,
                     tr->dxn,  tr->dq, tr->dk,  tr->dv,    tr->dao,  tr->da,    tr->dg,     tr->du, tr->dhn, tr->dtmp,
                     tr->xd,   tr->ax, tr->dax, tr->wrow,  tr->wt,   tr->mtmp,  tr->logits, tr->gw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cm_free(bufs[i]);
    cm_free(tr);
}
