/*
 * forward.c: the forward pass over a batch, a layer range and a slice (its
 * context is ctx.c's, the KV cache kv.c's, a slice's repacked views load.c's).
 *
 * Each layer is two pool runs: attention up to attn_output's partial sum,
 * then (after the caller-thread all-reduce) the FFN up to ffn_down's partial
 * sum (all-reduced again). Inside a run the threads step through the ops
 * with barriers: matmul rows, token rows and (token, head) pairs are split
 * across threads. The all-reduce runs on the caller's thread between pool
 * runs, so compute threads never wait on a socket.
 * The attention run is attn_layer.c's (forward_ctx.h holds the shared state).
 *
 * The arithmetic mirrors ggml's CPU ops (see model.h) because the golden
 * tests compare probabilities with llama.cpp at 1e-4. This file must never
 * allocate in cm_forward(): all scratch lives in cm_ctx.
 */
#include "forward_ctx.h"
#include "gptoss.h"

#include <math.h>
#include <string.h>

/* Convert n floats to vdt and show them to the test hook, if any. */
static void convert(cm_ctx *c, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt, const float *x, void *xq,
                    int64_t n) {
    c->k->from_float[vdt](x, xq, n);
    if (c->hook)
        c->hook(c->hook_user, site == CM_ACT_OUTPUT ? c->m->hp.n_layer : c->il, site, row, col0, vdt, x, xq, n);
}

/* ---------------- ops (each called by every thread) ---------------- */

/* ggml_compute_forward_rms_norm_f32 then ggml_mul: double sum of float
 * squares, scale = 1/sqrtf(mean + eps), y = (x * scale) * w. */
static void rms_norm_row(const float *x, const float *w, float *y, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) {
        float t = x[i] * scale;
        y[i] = t * w[i];
    }
}

/* Convert n_tok rows of ld floats (ncols used) to W's vec_dot_type. Returns
 * the activation pointer and its row stride; F32 needs no conversion. */
static const void *prep_act(cm_ctx *c, enum cm_act_site site, const cm_tensor *w, const float *x, int64_t ld,
                            int64_t ncols, int n_tok, size_t *stride, int ith, int nth) {
    enum cm_type vdt = cm_type_traits_of(w->type)->vec_dot_type;
    if (vdt == CM_TYPE_F32) {
        *stride = (size_t)ld * sizeof(float);
        return x;
    }
    size_t rs = cm_row_size(vdt, ncols);
    *stride = rs;
    int64_t t0, t1;
    cm_split_range(n_tok, ith, nth, &t0, &t1);
    for (int64_t j = t0; j < t1; j++) convert(c, site, (int)j, 0, vdt, x + j * ld, c->xq + (size_t)j * rs, ncols);
    cm_pool_barrier(c->pool);
    return c->xq;
}

/* LoRA (lora.h): add the adapters' B (A x) to rows [r0, r1) of w's output y,
 * from w's float input (still whole in scratch when its matmul runs). */
static void lora_mm(cm_ctx *c, const cm_tensor *w, float *y, int64_t ldy, int n_tok, int64_t r0, int64_t r1) {
    const cm_hparams *hp = &c->m->hp;
    const cm_slice s = c->a->slice;
    const int64_t E = hp->n_embd, D = hp->head_dim, rep = hp->n_head / hp->n_head_kv, QS = (s.h1 - s.h0) * rep * D;
    const int64_t q0 = s.h0 * rep * D, FS = s.f1 - s.f0;
    const cm_lora *l = c->lora;
    const float *const *u = c->lrows ? c->lrow : NULL; /* per-row scales: batch rows, or the head's rows */
    if (w == &c->wq) cm_lora_apply_rows(l, c->il, CM_LORA_Q, c->xn, E, 0, E, n_tok, y, ldy, q0, r0, r1, u);
    else if (w == &c->wk) cm_lora_apply_rows(l, c->il, CM_LORA_K, c->xn, E, 0, E, n_tok, y, ldy, s.h0 * D, r0, r1, u);
    else if (w == &c->wv) cm_lora_apply_rows(l, c->il, CM_LORA_V, c->xn, E, 0, E, n_tok, y, ldy, s.h0 * D, r0, r1, u);
    else if (w == &c->wo) cm_lora_apply_rows(l, c->il, CM_LORA_O, c->att, QS, q0, QS, n_tok, y, ldy, 0, r0, r1, u);
    else if (w == &c->gt) cm_lora_apply_rows(l, c->il, CM_LORA_GATE, c->xn, E, 0, E, n_tok, y, ldy, s.f0, r0, r1, u);
    else if (w == &c->up_w) cm_lora_apply_rows(l, c->il, CM_LORA_UP, c->xn, E, 0, E, n_tok, y, ldy, s.f0, r0, r1, u);
    else if (w == &c->dn)
        cm_lora_apply_rows(l, c->il, CM_LORA_DOWN, c->gate, FS, s.f0, FS, n_tok, y, ldy, 0, r0, r1, u);
    else if (w == &c->m->output)
        cm_lora_apply_rows(l, 0, CM_LORA_OUTPUT, c->xn, E, 0, E, n_tok, y, ldy, 0, r0, r1,
                           c->lrows ? c->lrow_out : NULL);
}

/* Rows per unit of a decode matmul's shared loop (cm_pool_loop): 8-row
 * multiples of at least 32 KiB, so a unit taken from another thread's part
 * is worth its kernel call (which packs the token again). */
static int64_t mm_grain(const cm_tensor *w) {
    const int64_t rb = (int64_t)cm_row_size(w->type, w->ne[0]);
    return CM_MAX(8, ((32768 + rb - 1) / rb + 7) & ~(int64_t)7);
}

/* Rows per unit of a batch matmul's shared loop: the AVX2 q8_0 gemm's row
 * block (lane_avx2.c L8G_RB), half the q4_k / q5_k gemm's (AKG_RB). */
enum { MM_BATCH_GRAIN = 64 };

/* A shared loop over row units (cm_pool_loop), so that a thread that runs
 * slower than the other (a busy core, a vCPU its host shares, its pages
 * farther away) hands over the end of its part instead of making the
 * others wait at the next barrier. Every row is the same kernel's on the
 * same data whichever thread computes it (kernels.h: any row slice gives
 * the same bits). Decode (one token): units of mm_grain rows; a gemv over
 * repacked rows (gemv_packed) keeps cm_split_range's parts (a NULL pool in
 * cm_pool_loop_begin): its token packing per call (q4_0's: gathers) made the
 * shared loop 2-4% slower on the 1B q4_0 model (session 19). A batch: units
 * of MM_BATCH_GRAIN rows; the owner takes 3/4 of its part in one call and
 * then halves (pool.c), so its gemm packs the tokens a few times per
 * matmul, not once (the same CPU time on the 1B q8_0 / q4_k_m prompts).
 * Session 23 (zen-p2): static parts did equal CPU work within 1% at 2
 * threads on Zen 1 and still scaled 1.54-1.75x by wall (llama.cpp's shared
 * chunks 1.98x): the loss is in waiting, not in work. */
static void matmul(cm_ctx *c, const cm_tensor *w, const void *xq, size_t xs, int n_tok, float *y, int64_t ldy, int ith,
                   int nth) {
    int64_t r0, r1;
    if (nth > 1) {
        const int64_t g = n_tok == 1 ? mm_grain(w) : MM_BATCH_GRAIN, nu = (w->ne[1] + g - 1) / g;
        const cm_gemv_plan pl = n_tok == 1 ? cm_gemv_plan_of(c->k, w) : (cm_gemv_plan){0};
        cm_pool_loop l;
        int64_t u0, u1;
        cm_pool_loop_begin(&l, pl.packed ? NULL : c->pool, nu, ith, nth);
        while (cm_pool_loop_next(&l, &u0, &u1)) {
            r0 = u0 * g;
            r1 = CM_MIN(w->ne[1], u1 * g);
            if (n_tok == 1) cm_gemv_plan_rows(&pl, xq, xs, y, ldy, r0, r1);
            else cm_matmul_rows(c->k, w, xq, xs, n_tok, y, ldy, r0, r1);
            if (c->lora) lora_mm(c, w, y, ldy, n_tok, r0, r1);
        }
        return;
    }
    cm_split_range(w->ne[1], ith, nth, &r0, &r1);
    if (r1 > r0) cm_matmul_rows(c->k, w, xq, xs, n_tok, y, ldy, r0, r1);
    if (c->lora && r1 > r0) lora_mm(c, w, y, ldy, n_tok, r0, r1);
}

void cm_model_rope_cache(const cm_model *m, float p, bool swa, float *cache) {
    const cm_hparams *hp = &m->hp;
    if (hp->arch == CM_ARCH_DEEPSEEK2) { /* its q_pe / k_pe rotation (mla.c; the GPU's too) */
        cm_mla_rope_cache(hp, p, cache);
        return;
    }
    if (hp->yarn_ext_factor != 0.0f || (hp->yarn_attn_factor != 0.0f && hp->yarn_attn_factor != 1.0f)) {
        /* gpt-oss (gptoss.c): YaRN on every layer, the sliding ones with their own base */
        cm_yarn_rope_cache(hp, p, swa ? hp->rope_base_swa : hp->rope_base, hp->rope_freq_scale, m->rope_freqs.data,
                           cache);
        return;
    }
    cm_rope_cache(swa ? NULL : &hp->rope_scaling, hp->n_rot, swa ? hp->rope_base_swa : hp->rope_base,
                  m->rope_freqs.data, p, cache);
}

static void phase_embed(cm_ctx *c, int ith, int nth) {
    const cm_model *m = c->m;
    const cm_batch *b = c->b;
    const int E = m->hp.n_embd;
    int64_t t0, t1;
    cm_split_range(b->n, ith, nth, &t0, &t1);
    for (int64_t j = t0; j < t1; j++) {
        if (b->tokens) {
            int32_t id = b->tokens[j];
            c->k->to_float[m->tok_embd.type](cm_tensor_row(&m->tok_embd, id), c->x + j * E, E);
            if (m->hp.arch == CM_ARCH_GEMMA3) { /* ggml_scale by sqrtf(n_embd) */
                const float es = sqrtf((float)E);
                for (int i = 0; i < E; i++) c->x[j * E + i] *= es;
            }
        } else {
            memcpy(c->x + j * E, b->embd + j * E, (size_t)E * sizeof(float));
        }
        cm_model_rope_cache(m, (float)b->pos[j], false, c->rope + j * m->hp.n_rot);
        if (m->hp.n_swa) cm_model_rope_cache(m, (float)b->pos[j], true, c->rope_swa + j * m->hp.n_rot);
    }
}

static void add_pending(cm_ctx *c, int ith, int nth) {
    if (!c->pending) return;
    if (c->pending_norm || c->pending_bias) { /* gemma3: x += rms_norm(part) * w; gpt-oss: x += part + b; by rows */
        const int E = c->m->hp.n_embd;
        int64_t t0, t1;
        cm_split_range(c->b->n, ith, nth, &t0, &t1);
        for (int64_t j = t0; j < t1; j++) {
            float *x = c->x + j * E, *pt = c->part + j * E;
            if (c->pending_norm) rms_norm_row(pt, c->pending_norm, pt, E, c->m->hp.rms_eps);
            if (c->pending_bias)
                for (int i = 0; i < E; i++) pt[i] = pt[i] + c->pending_bias[i];
            for (int i = 0; i < E; i++) x[i] = x[i] + pt[i];
        }
        cm_pool_barrier(c->pool);
        return;
    }
    int64_t n = (int64_t)c->b->n * c->m->hp.n_embd, i0, i1;
    cm_split_range(n, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) c->x[i] = c->x[i] + c->part[i];
    cm_pool_barrier(c->pool);
}

static void zero_part(cm_ctx *c, int ith, int nth) {
    int64_t n = (int64_t)c->b->n * c->m->hp.n_embd, i0, i1;
    cm_split_range(n, ith, nth, &i0, &i1);
    if (i1 > i0) memset(c->part + i0, 0, (size_t)(i1 - i0) * sizeof(float));
}

/* For this thread's tokens: add the pending (all-reduced) output into the
 * residual, RMS-norm the row and convert it to W's vec_dot_type; then one
 * barrier. Each row needs only itself, so the three steps need no barrier
 * between them (add_pending + norm_rows + prep_act cost three per use).
 * Same arithmetic, same order: results are unchanged. */
static const void *add_norm_prep(cm_ctx *c, enum cm_act_site site, const cm_tensor *normw, const cm_tensor *w,
                                 size_t *stride, int ith, int nth) {
    const int E = c->m->hp.n_embd;
    const enum cm_type vdt = cm_type_traits_of(w->type)->vec_dot_type;
    const size_t rs = vdt == CM_TYPE_F32 ? (size_t)E * sizeof(float) : cm_row_size(vdt, E);
    int64_t t0, t1;
    cm_split_range(c->b->n, ith, nth, &t0, &t1);
    for (int64_t j = t0; j < t1; j++) {
        float *x = c->x + j * E, *xn = c->xn + j * E;
        if (c->pending) {
            float *pt = c->part + j * E;
            if (c->pending_norm) rms_norm_row(pt, c->pending_norm, pt, E, c->m->hp.rms_eps); /* gemma3 */
            if (c->pending_bias)
                for (int i = 0; i < E; i++) pt[i] = pt[i] + c->pending_bias[i]; /* gpt-oss */
            for (int i = 0; i < E; i++) x[i] = x[i] + pt[i];
        }
        rms_norm_row(x, normw->data, xn, E, c->m->hp.rms_eps);
        if (vdt != CM_TYPE_F32) convert(c, site, (int)j, 0, vdt, xn, c->xq + (size_t)j * rs, E);
    }
    cm_pool_barrier(c->pool);
    *stride = rs;
    return vdt == CM_TYPE_F32 ? (const void *)c->xn : (const void *)c->xq;
}

/* gate = silu(gate) * up and its conversion to W's (ffn_down's)
 * vec_dot_type, split across threads by activation blocks (conversions are
 * per block, so converting a row piecewise gives the same bytes), then one
 * barrier; even a single token's row is shared by all threads. */
static size_t xq_bytes(const cm_ctx *c) { return c->xq_size; }

/* ggml_vec_geglu_f32's GELU with GGML_GELU_FP16 (its CPU build): the tanh
 * form looked up in an F16 table, i.e. x rounded to F16, gelu in float, the
 * result rounded to F16; x <= -10 gives 0 and x >= 10 gives x. The table's
 * 1 + 0.044715 x^2 is one fused multiply-add in llama.cpp's FMA builds (the
 * compiler contracts it; every x86 build with FMA and ARM): fmaf does the
 * same here, where C11 does not contract. Measured against node-llama-cpp's
 * table: without it one entry of 65536 differs, x = -1.99902 (0xbfff), whose
 * gelu -0.0454864 sits at the F16 tie between 0xa9d2 and 0xa9d3. */
static float gelu_of_f16(uint16_t h) {
    const float v = cm_f16_to_f32(h);
    const float g = 0.5f * v * (1.0f + tanhf(0.79788456080286535587989211986876f * v * fmaf(0.044715f * v, v, 1.0f)));
    return cm_f16_to_f32(cm_f32_to_f16(g));
}
static float gelu_f16_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return gelu_of_f16(cm_f32_to_f16(x));
}

/* The same for g[i0, i1) of row j, with the F16 roundings shown to the test
 * hook (which may round one the other way) before the lookup. */
static void geglu_hooked(cm_ctx *c, int j, float *g, const float *up, int64_t i0, int64_t i1) {
    uint16_t h[256];
    for (int64_t a = i0; a < i1; a += 256) {
        const int64_t n = CM_MIN(256, i1 - a);
        c->k->from_float[CM_TYPE_F16](g + a, h, n);
        c->hook(c->hook_user, c->il, CM_ACT_GELU_IN, j, a, CM_TYPE_F16, g + a, h, n);
        for (int64_t i = 0; i < n; i++) {
            const float x = g[a + i];
            g[a + i] = (x <= -10.0f ? 0.0f : x >= 10.0f ? x : gelu_of_f16(h[i])) * up[a + i];
        }
    }
}

/* silu(gate) * up (gemma3: gelu(gate) * up) and its conversion for units
 * [u0, u1) of (token, block of ffn_down's vec_dot_type) pairs. */
static void silu_blocks(cm_ctx *c, enum cm_type vdt, int FS, int64_t u0, int64_t u1, uint8_t *out) {
    const int bs = cm_type_traits_of(vdt)->block_size;
    const size_t rs = vdt == CM_TYPE_F32 ? (size_t)FS * sizeof(float) : cm_row_size(vdt, FS);
    const int64_t nbr = FS / bs; /* FS is a multiple of the block size (cm_slice_check) */
    for (int64_t u = u0; u < u1;) {
        const int64_t j = u / nbr, b0 = u % nbr, b1 = CM_MIN(nbr, b0 + (u1 - u));
        float *g = c->gate + j * FS;
        const float *up = c->up + j * FS;
        if (c->m->hp.arch == CM_ARCH_GEMMA3 && c->hook) {
            geglu_hooked(c, (int)j, g, up, b0 * bs, b1 * bs);
        } else if (c->m->hp.arch == CM_ARCH_GEMMA3) {
            for (int64_t i = b0 * bs; i < b1 * bs; i++) g[i] = gelu_f16_table(g[i]) * up[i];
        } else {
            for (int64_t i = b0 * bs; i < b1 * bs; i++) {
                float v = g[i];
                v = v / (1.0f + expf(-v)); /* ggml_silu_f32 */
                g[i] = v * up[i];
            }
        }
        if (vdt != CM_TYPE_F32)
            convert(c, CM_ACT_FFN_DOWN, (int)j, b0 * bs, vdt, g + b0 * bs,
                    out + (size_t)j * rs + cm_row_size(vdt, b0 * bs), (b1 - b0) * bs);
        u += b1 - b0;
    }
}

static const void *silu_prep(cm_ctx *c, const cm_tensor *w, int n, int FS, size_t *stride, int ith, int nth) {
    const enum cm_type vdt = cm_type_traits_of(w->type)->vec_dot_type;
    const int bs = cm_type_traits_of(vdt)->block_size;
    int64_t u0, u1;
    cm_split_range((int64_t)n * (FS / bs), ith, nth, &u0, &u1);
    silu_blocks(c, vdt, FS, u0, u1, c->xq);
    cm_pool_barrier(c->pool);
    *stride = vdt == CM_TYPE_F32 ? (size_t)FS * sizeof(float) : cm_row_size(vdt, FS);
    return vdt == CM_TYPE_F32 ? (const void *)c->gate : (const void *)c->xq;
}

/* ---------------- the ops attn_layer.c shares (forward_ctx.h) ---------------- */

void cm_fwd_convert(cm_ctx *c, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt, const float *x, void *xq,
                    int64_t n) {
    convert(c, site, row, col0, vdt, x, xq, n);
}
void cm_fwd_rms_norm_row(const float *x, const float *w, float *y, int n, float eps) { rms_norm_row(x, w, y, n, eps); }
const void *cm_fwd_prep_act(cm_ctx *c, enum cm_act_site site, const cm_tensor *w, const float *x, int64_t ld,
                            int64_t ncols, int n_tok, size_t *stride, int ith, int nth) {
    return prep_act(c, site, w, x, ld, ncols, n_tok, stride, ith, nth);
}
void cm_fwd_matmul(cm_ctx *c, const cm_tensor *w, const void *xq, size_t xs, int n_tok, float *y, int64_t ldy, int ith,
                   int nth) {
    matmul(c, w, xq, xs, n_tok, y, ldy, ith, nth);
}
void cm_fwd_add_pending(cm_ctx *c, int ith, int nth) { add_pending(c, ith, nth); }
void cm_fwd_zero_part(cm_ctx *c, int ith, int nth) { zero_part(c, ith, nth); }
const void *cm_fwd_add_norm_prep(cm_ctx *c, enum cm_act_site site, const cm_tensor *normw, const cm_tensor *w,
                                 size_t *stride, int ith, int nth) {
    return add_norm_prep(c, site, normw, w, stride, ith, nth);
}

static void phase_ffn(cm_ctx *c, int ith, int nth) {
    const cm_model *m = c->m;
    const cm_layer *L = &m->layers[c->il];
    const int E = m->hp.n_embd, n = c->b->n;
    const int FS = c->a->slice.f1 - c->a->slice.f0;
    if (c->moe && L->ffn_gate_inp.data) { /* experts (moe.c): the normed input converted for ffn_gate_exps */
        size_t xs;
        const void *xq = add_norm_prep(c, CM_ACT_FFN_IN, &L->ffn_norm, &L->ffn_gate_exps, &xs, ith, nth);
        const cm_expert_slice *ex = &c->a->experts;
        const cm_moe_run r = {.m = m,
                              .k = c->k,
                              .pool = c->pool,
                              .il = c->il,
                              .n = n,
                              .xn = c->xn,
                              .xq = xq,
                              .xq_stride = xs,
                              .out = c->part,
                              .hook = c->hook,
                              .hook_user = c->hook_user,
                              .ep = ex->ep,
                              .defer_combine = c->ep_gather,
                              .e0 = ex->e0,
                              .e1 = ex->e1,
                              .holders = c->a->expert_holders,
                              .rank = c->a->expert_rank};
        cm_moe_ffn(c->moe, &r, ith, nth);
        return;
    }
    if (FS == 0) {
        add_pending(c, ith, nth);
        zero_part(c, ith, nth);
        return;
    }
    size_t xs;
    const void *xq = add_norm_prep(c, CM_ACT_FFN_IN, &L->ffn_norm, &c->gt, &xs, ith, nth);
    /* Decode: each thread computes gate and up for the same rows (whole
     * blocks of ffn_down's activation type, units of a shared loop as in
     * matmul), applies silu and converts those blocks itself, into xq past the FFN input row that the other threads
     * may still be reading: one barrier before ffn_down instead of two. Same
     * per-row products, same elementwise ops: results are unchanged. */
    const enum cm_type vdn = cm_type_traits_of(c->dn.type)->vec_dot_type;
    const size_t dn_off = (xs + 63) & ~(size_t)63;
    const size_t dn_rs = vdn == CM_TYPE_F32 ? (size_t)FS * sizeof(float) : cm_row_size(vdn, FS);
    if (n == 1 && cm_type_traits_of(c->up_w.type)->vec_dot_type == cm_type_traits_of(c->gt.type)->vec_dot_type &&
        dn_off + dn_rs <= xq_bytes(c)) {
        const int bs = cm_type_traits_of(vdn)->block_size;
        const int64_t g = CM_MAX(1, mm_grain(&c->gt) / bs); /* blocks per unit of the shared loop */
        const cm_gemv_plan pg = cm_gemv_plan_of(c->k, &c->gt), pu = cm_gemv_plan_of(c->k, &c->up_w);
        cm_pool_loop l;
        int64_t v0, v1;
        cm_pool_loop_begin(&l, pg.packed || pu.packed ? NULL : c->pool, (FS / bs + g - 1) / g, ith, nth);
        while (cm_pool_loop_next(&l, &v0, &v1)) {
            const int64_t u0 = v0 * g, u1 = CM_MIN(FS / bs, v1 * g);
            cm_gemv_plan_rows(&pg, xq, xs, c->gate, FS, u0 * bs, u1 * bs);
            cm_gemv_plan_rows(&pu, xq, xs, c->up, FS, u0 * bs, u1 * bs);
            if (c->lora) lora_mm(c, &c->gt, c->gate, FS, 1, u0 * bs, u1 * bs);
            if (c->lora) lora_mm(c, &c->up_w, c->up, FS, 1, u0 * bs, u1 * bs);
            silu_blocks(c, vdn, FS, u0, u1, c->xq + dn_off);
        }
        cm_pool_barrier(c->pool);
        xq = vdn == CM_TYPE_F32 ? (const void *)c->gate : (const void *)(c->xq + dn_off);
        matmul(c, &c->dn, xq, dn_rs, n, c->part, E, ith, nth);
        return;
    }
    matmul(c, &c->gt, xq, xs, n, c->gate, FS, ith, nth);
    if (cm_type_traits_of(c->up_w.type)->vec_dot_type != cm_type_traits_of(c->gt.type)->vec_dot_type) {
        cm_pool_barrier(c->pool);
        xq = prep_act(c, CM_ACT_UP_IN, &c->up_w, c->xn, E, E, n, &xs, ith, nth);
    }
    matmul(c, &c->up_w, xq, xs, n, c->up, FS, ith, nth);
    cm_pool_barrier(c->pool);
    xq = silu_prep(c, &c->dn, n, FS, &xs, ith, nth);
    matmul(c, &c->dn, xq, xs, n, c->part, E, ith, nth);
}

static void phase_final(cm_ctx *c, int ith, int nth) {
    const cm_model *m = c->m;
    const int E = m->hp.n_embd;
    add_pending(c, ith, nth);
    if (c->a->out_hidden) {
        int64_t t0, t1;
        cm_split_range(c->b->n, ith, nth, &t0, &t1);
        if (t1 > t0) memcpy(c->a->out_hidden + t0 * E, c->x + t0 * E, (size_t)(t1 - t0) * E * sizeof(float));
    }
    if (!c->a->out_logits || c->n_out == 0) return;
    int64_t t0, t1;
    cm_split_range(c->n_out, ith, nth, &t0, &t1);
    for (int64_t r = t0; r < t1; r++)
        rms_norm_row(c->x + (size_t)c->out_rows[r] * E, m->output_norm.data, c->xn + r * E, E, m->hp.rms_eps);
    cm_pool_barrier(c->pool);
    size_t xs;
    const cm_forward_args *a = c->a;
    /* A split head (tensor parallelism): our vocabulary rows only (LoRA's
     * output adapter on them: below). */
    const cm_tensor hv =
        cm_tensor_rows(&m->output, a->head_gather ? a->head_v0 : 0, a->head_gather ? a->head_v1 : m->output.ne[1]);
    const cm_tensor *W = a->head_gather ? &hv : &m->output;
    float *y = a->out_logits + (a->head_gather ? a->head_v0 : 0);
    const void *xq = prep_act(c, CM_ACT_OUTPUT, W, c->xn, E, E, c->n_out, &xs, ith, nth);
    matmul(c, W, xq, xs, c->n_out, y, m->hp.n_vocab, ith, nth);
    if (c->lora && a->head_gather) { /* matmul knows only the whole head's adapter: our rows of it, same split */
        int64_t r0, r1;
        cm_split_range(W->ne[1], ith, nth, &r0, &r1);
        cm_lora_apply_rows(c->lora, 0, CM_LORA_OUTPUT, c->xn, E, 0, E, c->n_out, y, m->hp.n_vocab, a->head_v0, r0, r1,
                           c->lrows ? c->lrow_out : NULL);
    }
}

static void run_phase(void *ctx, int ith, int nth) {
    cm_ctx *c = ctx;
    switch (c->ph) {
    case PH_EMBED: phase_embed(c, ith, nth); break;
    case PH_ATTN: cm_fwd_attn(c, ith, nth); break;
    case PH_FFN: phase_ffn(c, ith, nth); break;
    case PH_MOE_COMBINE: { /* expert parallelism: step 8 after the gather */
        const cm_moe_run r = {.m = c->m, .k = c->k, .pool = c->pool, .il = c->il, .n = c->b->n, .out = c->part};
        cm_moe_combine(c->moe, &r, ith, nth);
        break;
    }
    case PH_FINAL: phase_final(c, ith, nth); break;
    }
}

/* ---------------- driver ---------------- */

static int check_args(cm_ctx *c, const cm_batch *b, const cm_forward_args *a, char *err, size_t errlen) {
    const cm_model *m = c->m;
    const cm_hparams *hp = &m->hp;
    if (b->n < 1 || b->n > c->max_batch)
        return cm_errf(err, errlen, CM_EINVAL, "batch of %d tokens (context allows 1..%d)", b->n, c->max_batch);
    if (a->layer_first < 0 || a->layer_last > hp->n_layer || a->layer_first >= a->layer_last)
        return cm_errf(err, errlen, CM_EINVAL, "layer range [%d, %d) is out of [0, %d)", a->layer_first, a->layer_last,
                       hp->n_layer);
    int rc = cm_slice_check(m, a->slice, err, errlen);
    if (!rc) rc = cm_moe_check_experts(m, a->slice, a->experts, err, errlen);
    if (rc) return rc;
    if (!b->pos || !b->seq || !a->kvs) return cm_errf(err, errlen, CM_EINVAL, "batch without positions or sequences");
    if (b->tokens ? a->layer_first != 0 : !b->embd)
        return cm_errf(err, errlen, CM_EINVAL, "%s",
                       b->tokens ? "token ids given to a stage that does not start at layer 0"
                                 : "batch without token ids or hidden states");
    if (a->head_gather && (a->head_v0 < 0 || a->head_v0 > a->head_v1 || a->head_v1 > hp->n_vocab))
        return cm_errf(err, errlen, CM_EINVAL, "output head rows [%d, %d) are out of [0, %d)", a->head_v0, a->head_v1,
                       hp->n_vocab);
    if (a->out_logits && a->layer_last != hp->n_layer)
        return cm_errf(err, errlen, CM_EINVAL, "logits requested from a stage that ends at layer %d of %d",
                       a->layer_last, hp->n_layer);
    for (int j = 0; j < b->n; j++) {
        if (b->tokens && (b->tokens[j] < 0 || b->tokens[j] >= hp->n_vocab))
            return cm_errf(err, errlen, CM_EINVAL, "token id %d is out of the vocabulary [0, %d)", b->tokens[j],
                           hp->n_vocab);
        if (b->seq[j] < 0 || b->seq[j] >= a->n_kvs || !a->kvs[b->seq[j]])
            return cm_errf(err, errlen, CM_EINVAL, "token %d has sequence %d of %d", j, b->seq[j], a->n_kvs);
        const cm_kv *kv = a->kvs[b->seq[j]];
        if (kv->layer_first > a->layer_first || kv->layer_last < a->layer_last || kv->h0 != a->slice.h0 ||
            kv->h1 != a->slice.h1 || kv->head_dim != hp->head_dim)
            return cm_errf(err, errlen, CM_EINVAL, "kv cache of sequence %d does not match the layer range / slice",
                           b->seq[j]);
        if (kv->n_ctx > c->max_ctx)
            return cm_errf(err, errlen, CM_EINVAL, "kv cache of %d positions exceeds the context's %d", kv->n_ctx,
                           c->max_ctx);
        int before = 0;
        for (int i = 0; i < j; i++) before += b->seq[i] == b->seq[j];
        int want = kv->n_past + before;
        if (b->pos[j] != want)
            return cm_errf(err, errlen, CM_EINVAL, "token %d of sequence %d is at position %d, expected %d", j,
                           b->seq[j], b->pos[j], want);
        if (want >= kv->n_ctx)
            return cm_errf(err, errlen, CM_ENOSPACE, "sequence %d is full (context %d)", b->seq[j], kv->n_ctx);
    }
    return 0;
}

int cm_forward(cm_ctx *c, const cm_batch *b, const cm_forward_args *a, char *err, size_t errlen) {
    int rc = check_args(c, b, a, err, errlen);
    if (rc) return rc;
    const cm_model *m = c->m;
    const cm_hparams *hp = &m->hp;
    const int rep = hp->n_head / hp->n_head_kv, D = hp->head_dim;
    const cm_slice s = a->slice;
    c->b = b;
    c->a = a;
    c->n_out = 0;
    for (int j = 0; j < b->n; j++)
        if (b->logits ? b->logits[j] : j == b->n - 1) c->out_rows[c->n_out++] = j;
    c->lrows = c->lora && a->lora_scales;
    for (int j = 0; c->lrows && j < b->n; j++) c->lrow[j] = a->lora_scales[b->seq[j]];
    for (int r = 0; c->lrows && r < c->n_out; r++) c->lrow_out[r] = c->lrow[c->out_rows[r]];
    c->pending = false;
    c->pending_norm = NULL;
    c->pending_bias = NULL;
    c->ph = PH_EMBED;
    cm_pool_run(c->pool, run_phase, c);
    const int64_t red = (int64_t)b->n * hp->n_embd;
    /* An expert slice replaces both all-reduces (attention is whole on every
     * member) by one gather of expert outputs per MoE layer; deepseek2's may
     * come with a slice of heads and dense FFN rows, whose partial sums are
     * all-reduced as usual (the MoE layers' FFN output is whole after the
     * gather: no all-reduce there). In such a group every member's slice is
     * partial (the planner's), so all of them all-reduce. */
    const cm_expert_slice ex = a->experts;
    const cm_slice whole = cm_slice_full(m);
    const bool sliced = s.h0 != whole.h0 || s.h1 != whole.h1 || s.f0 != whole.f0 || s.f1 != whole.f1;
    const cm_allreduce_fn allreduce = ex.ep && !sliced ? NULL : a->allreduce;
    /* Every member of a group gathers (one holding every expert too, so no
     * peer waits for it); alone, a slice of every expert needs none. */
    c->ep_gather = ex.ep && c->moe && a->expert_gather;
    if (ex.ep && c->moe && !a->expert_gather && !(ex.e0 == 0 && ex.e1 == hp->n_expert))
        return cm_errf(err, errlen, CM_EINVAL, "an expert slice [%d, %d) of %d experts without an expert gather", ex.e0,
                       ex.e1, hp->n_expert);
    if (a->expert_holders && (!ex.ep || !c->moe || a->expert_rank < 0 || a->expert_rank > 31))
        return cm_errf(err, errlen, CM_EINVAL, "expert holders need an expert slice and a member rank in [0, 32)");
    int il0 = a->layer_first; /* the offloaded layers first, when they take this batch */
    if (c->offload && !c->lora && !c->hook && (rc = c->offload(c->offload_user, b, a, c->x, c->rope, err, errlen))) {
        if (rc < 0) return rc;
        il0 += rc;
    }
    for (int il = il0; il < a->layer_last; il++) {
        const cm_layer *L = &m->layers[il];
        c->il = il;
        if (!c->mla) { /* deepseek2's attention has its own tensors (mla.c) */
            c->wq = cm_tensor_rows(&L->wq, (int64_t)s.h0 * rep * D, (int64_t)s.h1 * rep * D);
            c->wk = cm_tensor_rows(&L->wk, (int64_t)s.h0 * D, (int64_t)s.h1 * D);
            c->wv = cm_tensor_rows(&L->wv, (int64_t)s.h0 * D, (int64_t)s.h1 * D);
            c->wo = cm_tensor_cols(&L->wo, (int64_t)s.h0 * rep * D, (int64_t)s.h1 * rep * D);
        }
        if (!L->ffn_gate_inp.data) { /* a dense FFN (deepseek2: its leading dense layers) */
            c->gt = cm_tensor_rows(&L->ffn_gate, s.f0, s.f1);
            c->up_w = cm_tensor_rows(&L->ffn_up, s.f0, s.f1);
            c->dn = cm_tensor_cols(&L->ffn_down, s.f0, s.f1);
        }
        c->ph = PH_ATTN;
        cm_pool_run(c->pool, run_phase, c);
        if (allreduce && (rc = allreduce(a->allreduce_user, c->part, red)))
            return cm_errf(err, errlen, rc, "all-reduce after attention of layer %d failed: %s", il, cm_strerror(rc));
        c->pending = true;
        c->pending_norm = L->attn_post_norm.data;
        c->pending_bias = L->bo.data;
        c->ph = PH_FFN;
        cm_pool_run(c->pool, run_phase, c);
        c->pending_norm = L->ffn_post_norm.data;
        c->pending_bias = NULL;
        if (c->ep_gather &&
            L->ffn_gate_inp.data) { /* expert parallelism: the other members' expert rows, then the fixed-order sum */
            float *y;
            const int32_t *rows;
            cm_moe_rows(c->moe, b->n, &y, &rows);
            if ((rc = a->expert_gather(a->expert_gather_user, y, hp->n_embd, rows, hp->n_expert)))
                return cm_errf(err, errlen, rc, "expert exchange of layer %d failed: %s", il, cm_strerror(rc));
            c->ph = PH_MOE_COMBINE;
            cm_pool_run(c->pool, run_phase, c);
        }
        if (allreduce && !(ex.ep && L->ffn_gate_inp.data) && (rc = allreduce(a->allreduce_user, c->part, red)))
            return cm_errf(err, errlen, rc, "all-reduce after the ffn of layer %d failed: %s", il, cm_strerror(rc));
        if (a->between_layers && il + 1 < a->layer_last) a->between_layers(a->between_layers_user, il);
    }
    c->ph = PH_FINAL;
    cm_pool_run(c->pool, run_phase, c);
    if (a->head_gather && a->out_logits && c->n_out > 0 &&
        (rc = a->head_gather(a->head_gather_user, a->out_logits, c->n_out)))
        return cm_errf(err, errlen, rc, "output head exchange failed: %s", cm_strerror(rc));
    for (int j = 0; j < b->n; j++) a->kvs[b->seq[j]]->n_past++;
    return 0;
}

int cm_forward_simple(cm_ctx *c, cm_kv *kv, const int32_t *tokens, int n, float *out_logits, char *err, size_t errlen) {
    /* Positions and sequence ids come from small stack chunks so that long
     * prompts are fed in batches of at most max_batch tokens. */
    enum { CHUNK = 64 };
    int32_t pos[CHUNK], seq[CHUNK];
    int bmax = CM_MIN(c->max_batch, CHUNK);
    for (int i = 0; i < CHUNK; i++) seq[i] = 0;
    for (int done = 0; done < n;) {
        int nb = CM_MIN(bmax, n - done);
        for (int i = 0; i < nb; i++) pos[i] = kv->n_past + i;
        cm_batch b = {.n = nb, .tokens = tokens + done, .pos = pos, .seq = seq};
        cm_kv *kvs[1] = {kv};
        bool last = done + nb == n;
        cm_forward_args a = {.layer_first = 0,
                             .layer_last = c->m->hp.n_layer,
                             .slice = cm_slice_full(c->m),
                             .kvs = kvs,
                             .n_kvs = 1,
                             .out_logits = last ? out_logits : NULL};
        int rc = cm_forward(c, &b, &a, err, errlen);
        if (rc) return rc;
        done += nb;
    }
    return 0;
}
