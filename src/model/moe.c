/*
 * moe.c: mixture-of-experts FFN layers (see moe.h for the arithmetic and
 * the order in which expert outputs are combined).
 *
 * Loading (hyper-parameters, tensor binding, slice checks) is in
 * moe_load.c; this file is the compute. One pool run per layer, in steps
 * separated by barriers: (1) inputs converted for weights whose vec_dot_type differs from
 * the experts' gate, (2) router logits, (3) softmax, top-k, weights and the
 * grouping of (token, slot) assignments by expert (thread 0; one token:
 * every thread into its own scratch, no barrier), (4) each
 * expert's tokens gathered into contiguous rows (batches of 2+), (5) gate
 * and up of every active expert as one GEMM over its tokens (rows of all
 * experts split across threads by cost), then silu(gate) * up converted for
 * down by the same thread, (6) down GEMMs, (7) the weighted sum per token in
 * top-k order. Only the chosen experts' rows are read. Expert parallelism
 * (cm_moe_run.ep): steps 4-6 run only the experts [e0, e1), whose
 * assignments are one contiguous run of rows (they are grouped by expert),
 * and step 7 waits for the caller's gather of the other members' rows
 * (cm_moe_combine), so the sum is the same chain. It must never allocate in
 * cm_moe_ffn(): scratch is sized by
 * cm_moe_new().
 */
#include "moe.h"
#include "gptoss.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ---------------- scratch ---------------- */

/* One batch's routing: written by route(), read by the later steps. */
typedef struct moe_route {
    float *probs;             /* [B][n_expert] probabilities */
    float *shg;               /* [B] the shared expert's gate, sigmoid(logit) */
    int32_t *sel;             /* [B][k] chosen experts, top-k order */
    float *w;                 /* [B][k] their weights */
    int32_t *cnt, *off, *act; /* per expert: tokens, first assignment; active experts ascending */
    int n_act;
    int32_t *tok, *slot, *aof; /* assignment a -> token, slot; (token, slot) -> a */
    uint8_t *mark;             /* [n_expert] top-k selection marks */
} moe_route;

struct cm_moe {
    int max_batch, n_expert, k, n_threads;
    float *logits;                /* [B][n_expert] router logits */
    float *shl;                   /* [B] shared-expert gate logits */
    moe_route rt;                 /* a batch's routing (thread 0 routes, a barrier publishes it) */
    moe_route *tl;                /* [n_threads] one token's routing, each thread its own (no barrier) */
    _Atomic uint64_t *hits;       /* [n_layer][n_expert] routed assignments since cm_moe_new (any thread reads) */
    int n_layer;                  /* hits' rows */
    uint8_t *xr, *xu, *xsg, *xsu; /* [B] inputs converted for router / up_exps / shexp gate / shexp up */
    uint8_t *xg, *xgu;            /* [A] gathered gate (and up) inputs */
    float *g, *u;                 /* [A][F] */
    uint8_t *dq;                  /* [A] down inputs */
    float *y;                     /* [A][E] expert outputs */
    float *gs, *us, *ys;          /* shared expert [B][FS], [B][FS], [B][E] */
    uint8_t *dqs;                 /* [B] its down inputs */
    size_t rs_e, rs_f, rs_fs;     /* bytes per converted row of E, F, FS floats (any type fits) */
};

static void *zalloc(size_t n) {
    void *p = cm_aligned_alloc(n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}

static void route_free(moe_route *t) {
    void *ps[] = {t->probs, t->shg, t->sel, t->w, t->cnt, t->off, t->act, t->tok, t->slot, t->aof, t->mark};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++) cm_aligned_free(ps[i]);
}

static bool route_alloc(moe_route *t, size_t B, size_t X, size_t K) {
    const size_t A = B * K;
    t->probs = zalloc((B + 1) * X * 4); /* + one row of selection scores */
    t->shg = zalloc(B * 4);
    t->sel = zalloc(A * 4);
    t->w = zalloc(A * 4);
    t->cnt = zalloc(X * 4);
    t->off = zalloc((X + 1) * 4);
    t->act = zalloc(X * 4);
    t->tok = zalloc(A * 4);
    t->slot = zalloc(A * 4);
    t->aof = zalloc(A * 4);
    t->mark = zalloc(X);
    return t->probs && t->shg && t->sel && t->w && t->cnt && t->off && t->act && t->tok && t->slot && t->aof && t->mark;
}

void cm_moe_free(cm_moe *s) {
    if (!s) return;
    route_free(&s->rt);
    for (int i = 0; s->tl && i < s->n_threads; i++) route_free(&s->tl[i]);
    cm_free(s->tl);
    cm_free((void *)s->hits);
    void *ps[] = {s->logits, s->shl, s->xr, s->xu, s->xsg, s->xsu, s->xg, s->xgu,
                  s->g,      s->u,   s->dq, s->y,  s->gs,  s->us,  s->ys, s->dqs};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++) cm_aligned_free(ps[i]);
    cm_free(s);
}

/* F32 is the widest activation type: 4 bytes per element bound any row. */
static size_t row_bound(int64_t n) { return ((size_t)n * 4 + 63) & ~(size_t)63; }

cm_moe *cm_moe_new(const cm_model *m, int max_batch, int n_threads) {
    const cm_hparams *hp = &m->hp;
    cm_moe *s = cm_calloc(1, sizeof *s);
    if (!s) return NULL;
    const size_t B = (size_t)max_batch, X
    = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, A = B * K;
    const size_t E = (size_t)hp->n_embd, F = (size_t)hp->n_ff_exp, FS = (size_t)hp->n_ff_shexp;
    s->max_batch = max_batch;
    s->n_expert = hp->n_expert;
    s->k = hp->n_expert_used;
    s->n_threads = n_threads < 1 ? 1 : n_threads;
    s->rs_e = row_bound((int64_t)E);
    s->rs_f = row_bound((int64_t)F);
    s->rs_fs = row_bound((int64_t)FS);
    s->logits = zalloc(B * X * 4);
    s->shl = zalloc(B * 4);
    s->xr = zalloc(B * s->rs_e);
    s->xu = zalloc(B * s->rs_e);
    s->xsg = zalloc(B * s->rs_e);
    s->xsu = zalloc(B * s->rs_e);
    s->xg = zalloc(A * s->rs_e);
    s->xgu = zalloc(A * s->rs_e);
    s->g = zalloc(A * F * 4);
    s->u = zalloc(A * F * 4);
    s->dq = zalloc(A * s->rs_f);
    s->y = zalloc(A * E * 4);
    s->gs = zalloc(B * FS * 4);
    s->us = zalloc(B * FS * 4);
    s->ys = zalloc(B * E * 4);
    s->dqs = zalloc(B * s->rs_fs);
    s->tl = cm_calloc((size_t)s->n_threads, sizeof *s->tl);
    s->n_layer = hp->n_layer;
    s->hits = cm_calloc(X * (size_t)hp->n_layer, sizeof *s->hits);
    bool ok = s->tl && s->hits && route_alloc(&s->rt, B, X, K);
    for (int i = 0; ok && i < s->n_threads; i++) ok = route_alloc(&s->tl[i], 1, X, K);
    void *ps[] = {s->logits, s->shl, s->xr, s->xu, s->xsg, s->xsu, s->xg, s->xgu,
                  s->g,      s->u,   s->dq, s->y,  s->gs,  s->us,  s->ys, s->dqs};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++) ok = ok && ps[i];
    if (!ok) {
        cm_moe_free(s);
        return NULL;
    }
    return s;
}

/* ---------------- compute ---------------- */

static void convert(const cm_moe_run *r, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt, const float *x,
                    void *xq, int64_t n) {
    r->k->from_float[vdt](x, xq, n);
    if (r->hook) r->hook(r->hook_user, r->il, site, row, col0, vdt, x, xq, n);
}

static enum cm_type vdt_of(const cm_tensor *w) { return cm_type_traits_of(w->type)->vec_dot_type; }

static size_t act_row_size(enum cm_type vdt, int64_t n) {
    return vdt == CM_TYPE_F32 ? (size_t)n * sizeof(float) : cm_row_size(vdt, n);
}

/* The activations of all n tokens for weight w: the caller's converted rows
 * when w's vec_dot_type is the experts' gate's, the floats for F32, else buf
 * (*need: the caller must convert into buf first). */
static const uint8_t *input_for(const cm_moe_run *r, const cm_tensor *w, uint8_t *buf, size_t *stride, bool *need) {
    const enum cm_type vdt = vdt_of(w);
    const cm_layer *L = &r->m->layers[r->il];
    *need = false;
    if (vdt == vdt_of(&L->ffn_gate_exps)) {
        *stride = r->xq_stride;
        return r->xq;
    }
    if (vdt == CM_TYPE_F32) {
        *stride = (size_t)r->m->hp.n_embd * sizeof(float);
        return (const uint8_t *)r->xn;
    }
    *stride = act_row_size(vdt, r->m->hp.n_embd);
    *need = true;
    return buf;
}

/* Expert e of a stacked [ne0, ne1, n_expert] tensor as a 2-D view. */
static cm_tensor expert_view(const cm_tensor *w, int e) {
    cm_tensor t = *w;
    t.data = (char *)w->data + (size_t)e * w->nb[2];
    t.ne[2] = 1;
    t.n_dims = 2;
    return t;
}

/* Rows [r0, r1) of expert weights w times its c tokens' inputs x (row
 * stride xs) into y (ldy). A prefill spreads n * k
 * assignments over the experts: ~8 tokens each for 128 tokens, top 8 of
 * 128. The kernels pick their path for such small batches themselves (the
 * AMX gemm over repacked q4_0 rows from a few tokens, gemm_amx.c's
 * ax_mintok; session 20 padded batches to 24 tokens here instead). */
static void expert_mm(const cm_kernels *kt, const cm_tensor *w, const void *x, size_t xs, int c, float *y, int64_t ldy,
                      int64_t r0, int64_t r1) {
    cm_matmul_rows(kt, w, x, xs, c, y, ldy, r0, r1);
}

/* The k largest of v[0, n) in descending order (ggml_argsort_top_k: ties
 * by lower id), marked in mark[0, n) and, unless sel is NULL, into sel. */
static void top_k(const float *v, int n, int k, uint8_t *mark, int32_t *sel) {
    memset(mark, 0, (size_t)n);
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!mark[e] && (best < 0 || v[e] > v[best])) best = e;
        mark[best] = 1;
        if (sel) sel[i] = best;
    }
}

/* gpt-oss's gating (llama.cpp's SOFTMAX_WEIGHT): p = logits + router bias
 * (ggml_add), the top k of p (descending, ties: lower id), their weights
 * the softmax of the k chosen values (max, expf, double sum, times the
 * float 1/sum). */
static void route_oai(moe_route *t, const cm_moe_run *r, const float *lg, float *p, int j) {
    const cm_hparams *hp = &r->m->hp;
    const int X
    = hp->n_expert, K = hp->n_expert_used;
    const float *bias = r->m->layers[r->il].ffn_gate_inp_b.data;
    for (int e = 0; e < X; e++) p[e] = lg[e] + bias[e];
    int32_t *sel = t->sel + (size_t)j * K;
    float *w = t->w + (size_t)j * K;
    top_k(p, X, K, t->mark, sel);
    for (int k = 0; k < K; k++) w[k] = p[sel[k]];
    float mx = -INFINITY;
    for (int k = 0; k < K; k++) mx = w[k] > mx ? w[k] : mx;
    double sum = 0;
    for (int k = 0; k < K; k++) {
        w[k] = expf(w[k] - mx);
        sum += (double)w[k];
    }
    const float inv = (float)(1.0 / sum);
    for (int k = 0; k < K; k++) w[k] *= inv;
}

/* Step 3: softmax over the experts, top k, weights, and the grouping of the
 * n * k (token, slot) assignments by expert, into t (thread 0 for a batch;
 * for one token every thread into its own t, the same numbers). */
static void route(const cm_moe *s, moe_route *t, const cm_moe_run *r) {
    const cm_hparams *hp = &r->m->hp;
    const int X
    = hp->n_expert, K = hp->n_expert_used, n = r->n;
    const cm_layer *L = &r->m->layers[r->il];
    const bool sh = L->ffn_gate_inp_shexp.data != NULL;
    const bool oai = hp->arch == CM_ARCH_GPTOSS;
    const float *bias = L->ffn_exp_probs_b.data;
    float *selp = t->probs + (size_t)n * X; /* selection scores (deepseek2: biased, group-masked) */
    for (int j = 0; j < n; j++) {
        const float *lg = s->logits + (size_t)j * X;
        float *p = t->probs + (size_t)j * X;
        if (oai) { /* gpt-oss: top k of the biased logits, softmax over them */
            route_oai(t, r, lg, p, j);
            continue;
        }
        if (hp->expert_sigmoid) { /* ggml_sigmoid */
            for (int e = 0; e < X; e++) p[e] = 1.0f / (1.0f + expf(-lg[e]));
        } else {
            /* ggml_soft_max_f32: max, expf, double sum, times the float 1/sum */
            float mx = -INFINITY;
            for (int e = 0; e < X; e++) mx = lg[e] > mx ? lg[e] : mx;
            double sum = 0;
            for (int e = 0; e < X; e++) {
                p[e] = expf(lg[e] - mx);
                sum += (double)p[e];
            }
            const float inv = (float)(1.0 / sum);
            for (int e = 0; e < X; e++) p[e] *= inv;
        }
        /* deepseek2: selection by probs + exp_probs_b (the weights stay unbiased) */
        const float *q = p;
        if (bias || hp->n_expert_groups > 1) {
            for (int e = 0; e < X; e++) selp[e] = bias ? p[e] + bias[e] : p[e];
            q = selp;
        }
        if (hp->n_expert_groups > 1) {
            /* each group scored by the (double) sum of its top two; the best
             * n_group_used groups stay, the others' experts are masked */
            const int G = hp->n_expert_groups, per = X
            / G;
            float gs[1024];
            for (int g = 0; g < G; g++) {
                const float *v = selp + (size_t)g * per;
                int b0 = 0;
                for (int e = 1; e < per; e++)
                    if (v[e] > v[b0]) b0 = e;
                int b1 = b0 == 0 ? 1 : 0;
                for (int e = 0; e < per; e++)
                    if (e != b0 && v[e] > v[b1]) b1 = e;
                gs[g] = (float)((double)v[b0] + (double)v[b1]);
            }
            top_k(gs, G, hp->n_group_used, t->mark, NULL);
            for (int g = 0; g < G; g++)
                if (!t->mark[g])
                    for (int e = 0; e < per; e++) selp[(size_t)g * per + e] = -INFINITY;
        }
        /* ggml_argsort_top_k: descending; ties by lower id */
        int32_t *sel = t->sel + (size_t)j * K;
        float *w = t->w + (size_t)j * K;
        top_k(q, X, K, t->mark, sel);
        for (int k = 0; k < K; k++) w[k] = p[sel[k]];
        if (hp->expert_norm) { /* ggml_sum_rows (double sum), clamp to the F16 minimum, ggml_div */
            double ws = 0;
            for (int k = 0; k < K; k++) ws += (double)w[k];
            float wsf = (float)ws;
            if (wsf < 6.103515625e-5f) wsf = 6.103515625e-5f;
            for (int k = 0; k < K; k++) w[k] = w[k] / wsf;
        }
        if (hp->expert_scale != 0.0f && hp->expert_scale != 1.0f) /* ggml_scale */
            for (int k = 0; k < K; k++) w[k] = w[k] * hp->expert_scale;
        if (sh) { /* llama.cpp's sigmoid: silu(v) / v */
            const float v = s->shl[j];
            const float si = v / (1.0f + expf(-v));
            t->shg[j] = si / v;
        }
    }
    memset(t->cnt, 0, (size_t)X * sizeof(int32_t));
    for (int i = 0; i < n * K; i++) t->cnt[t->sel[i]]++;
    t->n_act = 0;
    t->off[0] = 0;
    for (int e = 0; e < X; e++) {
        t->off[e + 1] = t->off[e] + t->cnt[e];
        if (t->cnt[e]) t->act[t->n_act++] = e;
        t->cnt[e] = 0; /* reused as the fill cursor, restored below */
    }
    for (int j = 0; j < n; j++)
        for (int k = 0; k < K; k++) {
            const int e = t->sel[(size_t)j * K + k];
            const int a = t->off[e] + t->cnt[e]++;
            t->tok[a] = j;
            t->slot[a] = k;
            t->aof[(size_t)j * K + k] = a;
        }
}

/* Rows [0, n_act * R + R_extra) of the active experts' weights, R per
 * expert, then R_extra of the shared expert's: a row of expert act[i] costs
 * its token count, a shared row n. Thread ith of nth gets [*b0, *b1) so that
 * the costs, not the rows, are split evenly (a prefill whose tokens crowd one
 * expert would otherwise leave threads idle). Same rows, same arithmetic per
 * row whatever the split: results do not depend on it. */
static int64_t row_at_cost(const moe_route *t, int lo, int hi, int64_t R, int64_t r_extra, int n, int64_t cost) {
    int64_t row = 0;
    for (int i = lo; i < hi; i++) {
        const int64_t c = t->off[t->act[i] + 1] - t->off[t->act[i]];
        if (cost < c * R) return row + (cost + c - 1) / c;
        cost -= c * R;
        row += R;
    }
    return row + CM_MIN(r_extra, (cost + n - 1) / n);
}

/* The active experts act[lo, hi) (all of them, or an expert group member's
 * run) carry n_assign of the n * k assignments. */
static void split_rows(const moe_route *t, int lo, int hi, int64_t n_assign, int64_t R, int64_t r_extra, int n, int ith,
                       int nth, int64_t *b0, int64_t *b1) {
    const int64_t total = n_assign * R + (int64_t)n * r_extra; /* each assignment R rows */
    *b0 = row_at_cost(t, lo, hi, R, r_extra, n, total * ith / nth);
    *b1 = ith == nth - 1 ? (int64_t)(hi - lo) * R + r_extra
                         : row_at_cost(t, lo, hi, R, r_extra, n, total * (ith + 1) / nth);
}

/* Round a row boundary of the gate/up range up to a block of its segment's
 * down activation type (bs for the experts, bss for the shared expert),
 * relative to the segment's start, so each thread converts whole blocks. */
static int64_t align_row(int n_act, int64_t F, int bs, int bss, int64_t u) {
    const int64_t ex = (int64_t)n_act * F;
    if (u < ex) {
        const int64_t seg = u / F * F;
        return CM_MIN(seg + F, seg + (u - seg + bs - 1) / bs * bs);
    }
    return ex + (u - ex + bss - 1) / bss * bss; /* at most ex + FS: FS is a multiple of bss */
}

/* silu(g) * u for blocks [b0, b1) of one row and its conversion (or none for F32). */
static void swiglu_blocks(const cm_moe_run *r, enum cm_act_site site, int row, int64_t col_base, enum cm_type vdt,
                          float *g, const float *u, uint8_t *dst, int bs, int64_t b0, int64_t b1, const float *bg,
                          const float *bu) {
    if (bg) { /* gpt-oss: gate + its bias, up + its bias (ggml_add_id), clamped SwiGLU */
        for (int64_t i = b0 * bs; i < b1 * bs; i++) g[i] = cm_swiglu_oai(g[i] + bg[i], u[i] + bu[i]);
    } else {
        for (int64_t i = b0 * bs; i < b1 * bs; i++) {
            float v = g[i];
            v = v / (1.0f + expf(-v)); /* ggml_silu_f32 */
            g[i] = v * u[i];
        }
    }
    if (vdt != CM_TYPE_F32)
        convert(r, site, row, col_base + b0 * bs, vdt, g + b0 * bs, dst + cm_row_size(vdt, b0 * bs), (b1 - b0) * bs);
}

void cm_expert_share(uint32_t holders, int rank, int c, int *lo, int *hi) {
    *lo = *hi = 0;
    if (rank < 0 || rank > 31 || !(holders >> rank & 1u)) return;
    int n_h = 0, j = 0;
    for (int b = 0; b < 32; b++)
        if (holders >> b & 1u) {
            if (b < rank) j++;
            n_h++;
        }
    *lo = (int)((int64_t)c * j / n_h);
    *hi = (int)((int64_t)c * (j + 1) / n_h);
}

/* Narrow expert e's assignment run [o, o + c) to this member's share;
 * false when it is empty. */
static bool my_rows(const cm_moe_run *r, int e, int *o, int *c) {
    int lo, hi;
    cm_expert_share(r->holders[e], r->rank, *c, &lo, &hi);
    *o += lo;
    *c = hi - lo;
    return *c > 0;
}

void cm_moe_hits(const cm_moe *s, int il, uint64_t *hits, int n) {
    for (int e = 0; e < n && e < s->n_expert; e++) {
        uint64_t h = 0;
        for (int l = il < 0 ? 0 : il; l < (il < 0 ? s->n_layer : il + 1) && l < s->n_layer; l++)
            h += atomic_load_explicit(&s->hits[(size_t)l * (size_t)s->n_expert + (size_t)e], memory_order_relaxed);
        hits[e] = h;
    }
}

void cm_moe_ffn(cm_moe *s, const cm_moe_run *r, int ith, int nth) {
    const cm_model *m = r->m;
    const cm_hparams *hp = &m->hp;
    const cm_layer *L = &m->layers[r->il];
    const cm_kernels *kt = r->k;
    const int n = r->n, X
    = hp->n_expert;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, FS = hp->n_ff_shexp;
    const bool sh = L->ffn_gate_shexp.data != NULL, shg = L->ffn_gate_inp_shexp.data != NULL;
    int64_t t0, t1;

    /* 1. inputs for weights of another vec_dot_type than the experts' gate */
    size_t rs_r, rs_u, rs_sg = 0, rs_su = 0;
    bool need_r, need_u, need_sg = false, need_su = false;
    const uint8_t *xr = input_for(r, &L->ffn_gate_inp, s->xr, &rs_r, &need_r);
    const uint8_t *xu = input_for(r, &L->ffn_up_exps, s->xu, &rs_u, &need_u);
    const uint8_t *xsg = NULL, *xsu = NULL;
    if (sh) {
        xsg = input_for(r, &L->ffn_gate_shexp, s->xsg, &rs_sg, &need_sg);
        xsu = input_for(r, &L->ffn_up_shexp, s->xsu, &rs_su, &need_su);
        if (need_su && vdt_of(&L->ffn_up_shexp) == vdt_of(&L->ffn_gate_shexp))
            xsu = xsg, rs_su = rs_sg, need_su = false;
    }
    if (need_u && vdt_of(&L->ffn_up_exps) == vdt_of(&L->ffn_gate_inp) && need_r) xu = xr, need_u = false;
    if (need_r || need_u || need_sg || need_su) {
        cm_split_range(n, ith, nth, &t0, &t1);
        for (int64_t j = t0; j < t1; j++) {
            const float *x = r->xn + j * E;
            if (need_r) convert(r, CM_ACT_ROUTER_IN, (int)j, 0, vdt_of(&L->ffn_gate_inp), x, s->xr + j * rs_r, E);
            if (need_u) convert(r, CM_ACT_UP_IN, (int)j, 0, vdt_of(&L->ffn_up_exps), x, s->xu + j * rs_u, E);
            if (need_sg) convert(r, CM_ACT_SHEXP_IN, (int)j, 0, vdt_of(&L->ffn_gate_shexp), x, s->xsg + j * rs_sg, E);
            if (need_su) convert(r, CM_ACT_SHEXP_IN, (int)j, E, vdt_of(&L->ffn_up_shexp), x, s->xsu + j * rs_su, E);
        }
        cm_pool_barrier(r->pool);
    }

    /* 2. router logits (and the shared expert's gate logit as one more row) */
    cm_split_range(X + (shg ? 1 : 0), ith, nth, &t0, &t1);
    if (t1 > t0) {
        const int64_t r1 = CM_MIN(t1, X);
        if (r1 > t0) cm_matmul_rows(kt, &L->ffn_gate_inp, xr, rs_r, n, s->logits, X, t0, r1);
        if (t1 > X) cm_matmul_rows(kt, &L->ffn_gate_inp_shexp, r->xn, (size_t)E * sizeof(float), n, s->shl, 1, 0, 1);
    }
    cm_pool_barrier(r->pool);

    /* 3. top-k and grouping: thread 0 for a batch; for one token each
     * thread routes it itself (cheaper than a barrier) */
    moe_route *t = n == 1 ? &s->tl[ith] : &s->rt;
    if (n == 1) route(s, t, r);
    else {
        if (ith == 0) route(s, t, r);
        cm_pool_barrier(r->pool);
    }

    if (ith == 0) /* thread 0's route is the batch's (or the same one token's) */
        for (int i = 0; i < t->n_act; i++)
            atomic_fetch_add_explicit(&s->hits[(size_t)r->il * (size_t)X + (size_t)t->act[i]],
                                      (uint64_t)(t->off[t->act[i] + 1] - t->off[t->act[i]]), memory_order_relaxed);

    /* Expert parallelism: only the active experts in [e0, e1) run here: the
     * assignments [off[e0], off[e1]) and the active list's matching run.
     * Replicated experts (holders): every active expert's run, of which
     * steps 5-6 compute this member's share (cm_expert_share). */
    const bool rep = r->ep && r->holders;
    const int e_lo = r->ep && !rep ? r->e0 : 0, e_hi = r->ep && !rep ? r->e1 : X;
    int act_lo = 0, act_hi = t->n_act;
    while (act_lo < act_hi && t->act[act_lo] < e_lo) act_lo++;
    while (act_hi > act_lo && t->act[act_hi - 1] >= e_hi) act_hi--;
    const int a_lo = t->off[e_lo], a_hi = t->off[e_hi];

    /* 4. gather each expert's input rows, in assignment order (one token:
     * every expert reads row 0 in place, no gather and no barrier) */
    const size_t rs_g = r->xq_stride;
    const size_t gb = act_row_size(vdt_of(&L->ffn_gate_exps), E), ub = act_row_size(vdt_of(&L->ffn_up_exps), E);
    const bool sep_up = xu != r->xq;
    if (n > 1) {
        cm_split_range(a_hi - a_lo, ith, nth, &t0, &t1);
        for (int64_t a = a_lo + t0; a < a_lo + t1; a++) {
            memcpy(s->xg + a * s->rs_e, (const uint8_t *)r->xq + (size_t)t->tok[a] * rs_g, gb);
            if (sep_up) memcpy(s->xgu + a * s->rs_e, xu + (size_t)t->tok[a] * rs_u, ub);
        }
        cm_pool_barrier(r->pool);
    }

    /* 5. gate and up: the rows of every active expert (then the shared
     * expert's) as one range split across threads by cost and on blocks of
     * down's activation type; each piece is one GEMM over that expert's
     * tokens, then the same thread applies silu(gate) * up to its rows and
     * converts them for down (whole blocks: the bytes of a whole-row
     * conversion), so no barrier separates the two. */
    const int n_act = act_hi - act_lo;
    const uint8_t *xup = sep_up ? s->xgu : s->xg;
    const enum cm_type vd = vdt_of(&L->ffn_down_exps), vds = sh ? vdt_of(&L->ffn_down_shexp) : CM_TYPE_F32;
    const int bs = cm_type_traits_of(vd)->block_size, bss = cm_type_traits_of(vds)->block_size;
    split_rows(t, act_lo, act_hi, a_hi - a_lo, F, sh ? FS : 0, n, ith, nth, &t0, &t1);
    t0 = align_row(n_act, F, bs, bss, t0);
    t1 = ith == nth - 1 ? t1 : align_row(n_act, F, bs, bss, t1);
    for (int64_t u = t0; u < t1;) {
        if (u < (int64_t)n_act * F) {
            const int e = t->act[act_lo + u / F];
            const int64_t r0 = u % F, r1 = CM_MIN(F, r0 + (t1 - u));
            int o = t->off[e], c = t->off[e + 1] - o;
            if (rep && !my_rows(r, e, &o, &c)) {
                u += r1 - r0;
                continue;
            }
            cm_tensor wg = expert_view(&L->ffn_gate_exps, e), wu = expert_view(&L->ffn_up_exps, e);
            const uint8_t *xg = n == 1 ? (const uint8_t *)r->xq : s->xg + (size_t)o * s->rs_e;
            const uint8_t *xv = n == 1 ? xu : xup + (size_t)o * s->rs_e;
            expert_mm(kt, &wg, xg, s->rs_e, c, s->g + (size_t)o * F, F, r0, r1);
            expert_mm(kt, &wu, xv, s->rs_e, c, s->u + (size_t)o * F, F, r0, r1);
            const float *bg = L->ffn_gate_exps_b.data ? (const float *)L->ffn_gate_exps_b.data + (size_t)e * F : NULL;
            const float *bu = L->ffn_up_exps_b.data ? (const float *)L->ffn_up_exps_b.data + (size_t)e * F : NULL;
            for (int a = o; a < o + c; a++)
                swiglu_blocks(r, CM_ACT_EXP_DOWN, t->tok[a], (int64_t)t->slot[a] * F, vd, s->g + (size_t)a * F,
                              s->u + (size_t)a * F, s->dq + (size_t)a * s->rs_f, bs, r0 / bs, r1 / bs, bg, bu);
            u += r1 - r0;
        } else {
            const int64_t r0 = u - (int64_t)n_act * F, r1 = CM_MIN(FS, r0 + (t1 - u));
            cm_matmul_rows(kt, &L->ffn_gate_shexp, xsg, rs_sg, n, s->gs, FS, r0, r1);
            cm_matmul_rows(kt, &L->ffn_up_shexp, xsu, rs_su, n, s->us, FS, r0, r1);
            for (int j = 0; j < n; j++)
                swiglu_blocks(r, CM_ACT_SHEXP_DOWN, j, 0, vds, s->gs + (size_t)j * FS, s->us + (size_t)j * FS,
                              s->dqs + (size_t)j * s->rs_fs, bss, r0 / bss, r1 / bss, NULL, NULL);
            u += r1 - r0;
        }
    }
    cm_pool_barrier(r->pool);

    /* 6. down: E rows per active expert (then the shared expert's) */
    const bool f32d = vd == CM_TYPE_F32, f32ds = vds == CM_TYPE_F32;
    split_rows(t, act_lo, act_hi, a_hi - a_lo, E, sh ? E : 0, n, ith, nth, &t0, &t1);
    for (int64_t u = t0; u < t1;) {
        if (u < (int64_t)n_act * E) {
            const int e = t->act[act_lo + u / E];
            const int64_t r0 = u % E, r1 = CM_MIN(E, r0 + (t1 - u));
            int o = t->off[e], c = t->off[e + 1] - o;
            if (rep && !my_rows(r, e, &o, &c)) {
                u += r1 - r0;
                continue;
            }
            cm_tensor wd = expert_view(&L->ffn_down_exps, e);
            const void *x = f32d ? (const void *)(s->g + (size_t)o * F) : (const void *)(s->dq + (size_t)o * s->rs_f);
            expert_mm(kt, &wd, x, f32d ? (size_t)F * sizeof(float) : s->rs_f, c, s->y + (size_t)o * E, E, r0, r1);
            if (L->ffn_down_exps_b.data) { /* gpt-oss: + the expert's down bias (ggml_add_id) */
                const float *bd = (const float *)L->ffn_down_exps_b.data + (size_t)e * E;
                for (int a = o; a < o + c; a++)
                    for (int64_t i = r0; i < r1; i++) s->y[(size_t)a * E + i] += bd[i];
            }
            u += r1 - r0;
        } else {
            const int64_t r0 = u - (int64_t)n_act * E, r1 = CM_MIN(E, r0 + (t1 - u));
            const void *x = f32ds ? (const void *)s->gs : (const void *)s->dqs;
            cm_matmul_rows(kt, &L->ffn_down_shexp, x, f32ds ? (size_t)FS * sizeof(float) : s->rs_fs, n, s->ys, E, r0,
                           r1);
            u += r1 - r0;
        }
    }
    if (r->defer_combine) return; /* the caller gathers the other members' rows, then cm_moe_combine */
    cm_pool_barrier(r->pool);
    cm_moe_combine(s, r, ith, nth);
}

void cm_moe_rows(cm_moe *s, int n, float **y, const int32_t **rows) {
    *y = s->y;
    *rows = n == 1 ? s->tl[0].off : s->rt.off; /* one token: every thread's route is the same */
}

void cm_moe_combine(cm_moe *s, const cm_moe_run *r, int ith, int nth) {
    const cm_hparams *hp = &r->m->hp;
    const int n = r->n, K = hp->n_expert_used;
    const int64_t E = hp->n_embd;
    const bool sh = r->m->layers[r->il].ffn_gate_shexp.data != NULL;
    const bool shg = r->m->layers[r->il].ffn_gate_inp_shexp.data != NULL;
    const moe_route *t = n == 1 ? &s->tl[ith] : &s->rt;
    int64_t t0, t1;
    /* 7. per token: weighted expert outputs added in top-k order, then the
     * gated shared expert (llama.cpp: ggml_mul, then the ggml_add chain) */
    cm_split_range((int64_t)n * E, ith, nth, &t0, &t1);
    for (int64_t idx = t0; idx < t1; idx++) {
        const int64_t j = idx / E, i = idx % E;
        const int32_t *aof = t->aof + j * K;
        const float *w = t->w + j * K;
        float acc = s->y[(size_t)aof[0] * E + i] * w[0];
        for (int k = 1; k < K; k++) {
            const float yw = s->y[(size_t)aof[k] * E + i] * w[k];
            acc = acc + yw;
        }
        if (sh) { /* deepseek2's shared experts are ungated (ggml_add of the two FFNs) */
            const float yg = shg ? s->ys[j * E + i] * t->shg[j] : s->ys[j * E + i];
            acc = acc + yg;
        }
        r->out[idx] = acc;
    }
}
