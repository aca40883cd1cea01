/*
 * attn_layer.c: one layer's attention inside the forward pass (forward.c's
 * PH_ATTN pool run): the Q/K/V products, biases, Q/K norms and RoPE, the
 * store of K and V into each token's sequence cache, attention itself (the
 * two-pass softmax over the transposed cache here, or attn.c's tiled online
 * softmax over a rows-layout cache, with sliding windows and gpt-oss's sinks)
 * and attn_output's partial sum; deepseek2 hands the whole layer to mla.c.
 *
 * Every function is called by every thread of the pool run and splits its
 * work by (token, head); the arithmetic mirrors ggml's CPU ops because the
 * golden tests compare with llama.cpp at 1e-4. Nothing here allocates: all
 * scratch lives in cm_ctx (forward_ctx.h).
 */
#include "forward_ctx.h"

#include <math.h>
#include <string.h>

static inline size_t kv_off(const cm_kv *kv, int il, int hk) {
    return ((size_t)(il - kv->layer_first) * (size_t)(kv->h1 - kv->h0) + (size_t)(hk - kv->h0)) * (size_t)kv->n_ctx *
           (size_t)kv->head_dim;
}

static void rope_apply(const cm_hparams *hp, const float *cache, float *v) {
    cm_rope_apply(hp->rope_type, hp->n_rot, cache, v);
}

/* Bias, Q norm and RoPE of q head h (of this slice) of token j. */
static void rope_q_task(cm_ctx *c, int j, int h) {
    const cm_hparams *hp = &c->m->hp;
    const cm_layer *L = &c->m->layers[c->il];
    const int D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    const int nq = (c->a->slice.h1 - c->a->slice.h0) * rep, QS = nq * D;
    const float *rc = (cm_layer_is_swa(hp, c->il) ? c->rope_swa : c->rope) + (size_t)j * hp->n_rot;
    float *qv = c->q + (size_t)j * QS + (size_t)h * D;
    int hg = c->a->slice.h0 * rep + h; /* global q head */
    if (L->bq.data)
        for (int i = 0; i < D; i++) qv[i] += ((const float *)L->bq.data)[hg * D + i];
    if (L->q_norm.data) cm_fwd_rms_norm_row(qv, L->q_norm.data, qv, D, hp->rms_eps);
    rope_apply(hp, rc, qv);
    if (hp->attn_q_scale != 0.0f) /* gemma3: ggml_scale on q, softmax scale 1 */
        for (int i = 0; i < D; i++) qv[i] *= hp->attn_q_scale;
}

/* Bias, K norm and RoPE of kv head hl (of this slice) of token j; K and V
 * into the token's sequence cache. */
static void rope_kv_task(cm_ctx *c, int j, int hl) {
    const cm_hparams *hp = &c->m->hp;
    const cm_layer *L = &c->m->layers[c->il];
    const cm_batch *b = c->b;
    const int D = hp->head_dim, KS = (c->a->slice.h1 - c->a->slice.h0) * D, hk = c->a->slice.h0 + hl;
    const float *rc = (cm_layer_is_swa(hp, c->il) ? c->rope_swa : c->rope) + (size_t)j * hp->n_rot;
    float *kv_k = c->kc + (size_t)j * KS + (size_t)hl * D;
    float *kv_v = c->vc + (size_t)j * KS + (size_t)hl * D;
    if (L->bk.data)
        for (int i = 0; i < D; i++) kv_k[i] += ((const float *)L->bk.data)[hk * D + i];
    if (L->bv.data)
        for (int i = 0; i < D; i++) kv_v[i] += ((const float *)L->bv.data)[hk * D + i];
    if (L->k_norm.data) cm_fwd_rms_norm_row(kv_k, L->k_norm.data, kv_k, D, hp->rms_eps);
    rope_apply(hp, rc, kv_k);
    cm_kv_store(c->k, c->a->kvs[b->seq[j]], c->il, hk, b->pos[j], kv_k, kv_v); /* attn.c */
}

/* Attention of q head h (of this slice) of token j: scores over [0, pos],
 * softmax as ggml_soft_max_ext (scale, max, expf, double sum), then V^T
 * rows. The dot products go through the kernel table (SIMD where the CPU
 * has it): a plain loop here is one serial add chain per dot, the costliest
 * part of a long prompt outside the matmuls. The F16 dot takes both sides as
 * F16 like ggml's, i.e. the same roundings as converting q and the weights
 * to F16 first. */
static void attn_task(cm_ctx *c, int j, int h, int ith) {
    const cm_hparams *hp = &c->m->hp;
    const cm_batch *b = c->b;
    const int D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    const int nq = (c->a->slice.h1 - c->a->slice.h0) * rep, QS = nq * D;
    const float scale = hp->attn_q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)D);
    float *sc = c->scores + (size_t)ith * cm_fwd_scores_stride(c->max_ctx, D);
    cm_f16 *qh = (cm_f16 *)(sc + c->max_ctx); /* the query rounded to F16 (F16 cache) */
    cm_f16 *sch = qh + D;                     /* the weights rounded to F16 (F16 cache) */
    const cm_vec_dot_fn dot_f32 = c->k->vec_dot[CM_TYPE_F32], dot_f16 = c->k->vec_dot[CM_TYPE_F16];
    const cm_from_float_fn to_f16 = c->k->from_float[CM_TYPE_F16];
    int hk = c->a->slice.h0 + h / rep;
    const cm_kv *kv = c->a->kvs[b->seq[j]];
    const bool f16 = kv->type == CM_TYPE_F16;
    const float *qv = c->q + (size_t)j * QS + (size_t)h * D;
    int np = b->pos[j] + 1;
    /* gemma3's sliding-window layers see positions > pos - n_swa (llama.cpp's
     * LLAMA_SWA_TYPE_STANDARD mask); masked scores are -inf, weights 0. */
    const int p_lo = cm_layer_is_swa(hp, c->il) ? CM_MAX(0, np - hp->n_swa) : 0;
    if (kv->v_rows) { /* tiled, online softmax (attn.c); gpt-oss's sink as below */
        const cm_attn_kv av = cm_attn_kv_of(kv, c->il, hk);
        const float *snk = c->m->layers[c->il].attn_sinks.data;
        const cm_attn_query aq = {
            .q = qv, .p_lo = p_lo, .p_hi = np, .scale = scale, .sink = snk ? snk[c->a->slice.h0 * rep + h] : NAN};
        cm_attn_flash(c->k, &av, D, &aq, sc, c->att + (size_t)j * QS + (size_t)h * D);
        return;
    }
    const size_t off = kv_off(kv, c->il, hk);
    for (int p = 0; p < p_lo; p++) sc[p] = -INFINITY;
    float mx = -INFINITY;
    if (f16) {
        const cm_f16 *kk = (const cm_f16 *)kv->k + off;
        to_f16(qv, qh, D);
        for (int p = p_lo; p < np; p++) {
            float d;
            dot_f16(D, &d, kk + (size_t)p * D, qh);
            sc[p] = d * scale;
            if (sc[p] > mx) mx = sc[p];
        }
    } else {
        const float *kk = (const float *)kv->k + off;
        for (int p = p_lo; p < np; p++) {
            float d;
            dot_f32(D, &d, kk + (size_t)p * D, qv);
            sc[p] = d * scale;
            if (sc[p] > mx) mx = sc[p];
        }
    }
    /* gpt-oss: the head's sink logit joins the max and the sum (ggml_soft_max_ext's sinks) */
    const float *sinks = c->m->layers[c->il].attn_sinks.data;
    const float sink = sinks ? sinks[c->a->slice.h0 * rep + h] : 0.0f;
    if (sinks && sink > mx) mx = sink;
    double sum = 0.0;
    for (int p = 0; p < np; p++) {
        float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += (double)e;
    }
    if (sinks) sum += (double)expf(sink - mx);
    const float inv = (float)(1.0 / sum);
    for (int p = 0; p < np; p++) sc[p] *= inv;
    float *o = c->att + (size_t)j * QS + (size_t)h * D;
    if (f16) {
        const cm_f16 *vt = (const cm_f16 *)kv->v + off;
        to_f16(sc, sch, np);
        for (int i = 0; i < D; i++) dot_f16(np, &o[i], vt + (size_t)i * kv->n_ctx, sch);
    } else {
        const float *vt = (const float *)kv->v + off;
        for (int i = 0; i < D; i++) dot_f32(np, &o[i], vt + (size_t)i * kv->n_ctx, sc);
    }
}

/* Decode (one token) with at least as many kv heads as threads: each thread
 * takes whole kv heads, ropes their K/V and their q heads, attends with
 * them and converts its part of the output row for attn_output, so only one
 * barrier separates the QKV products from attn_output (instead of three).
 * Same ops on the same data as the general path: results are unchanged.
 * Conversion is per activation block, so piecewise conversion gives the
 * same bytes when each thread's columns start and end on block boundaries;
 * otherwise thread 0 converts the whole row after a barrier. */
static const void *attn_decode(cm_ctx *c, size_t *stride, int ith, int nth) {
    const cm_hparams *hp = &c->m->hp;
    const int D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    const int nkv = c->a->slice.h1 - c->a->slice.h0, QS = nkv * rep * D;
    const enum cm_type vdt = cm_type_traits_of(c->wo.type)->vec_dot_type;
    const int bs = cm_type_traits_of(vdt)->block_size;
    int64_t k0, k1;
    cm_split_range(nkv, ith, nth, &k0, &k1);
    for (int64_t hl = k0; hl < k1; hl++) rope_kv_task(c, 0, (int)hl);
    for (int64_t h = k0 * rep; h < k1 * rep; h++) {
        rope_q_task(c, 0, (int)h);
        attn_task(c, 0, (int)h, ith);
    }
    if (vdt == CM_TYPE_F32) {
        cm_pool_barrier(c->pool);
        *stride = (size_t)QS * sizeof(float);
        return c->att;
    }
    if (((int64_t)rep * D) % bs == 0) {
        const int64_t c0 = k0 * rep * D, c1 = k1 * rep * D;
        if (c1 > c0) cm_fwd_convert(c, CM_ACT_ATTN_OUT, 0, c0, vdt, c->att + c0, c->xq + cm_row_size(vdt, c0), c1 - c0);
        cm_pool_barrier(c->pool);
        *stride = cm_row_size(vdt, QS);
        return c->xq;
    }
    cm_pool_barrier(c->pool);
    return cm_fwd_prep_act(c, CM_ACT_ATTN_OUT, &c->wo, c->att, QS, QS, 1, stride, ith, nth);
}

/* A batch of decode tokens of distinct sequences (a batched decode step),
 * attn_decode's shape for n tokens: each thread takes whole (token, kv head)
 * tasks, ropes that head's K/V and its q heads, attends with them and
 * converts that part of the token's output row for attn_output, so one
 * barrier separates the QKV products from attn_output instead of three.
 * Every token's attention reads only its own sequence's cache, whose new
 * row its own task stored just before; the ops are the general path's, so
 * no bit changes (the caller rules out batches the multi-query tiles
 * take). */
static const void *attn_decode_many(cm_ctx *c, size_t *stride, int ith, int nth) {
    const cm_hparams *hp = &c->m->hp;
    const int D = hp->head_dim, rep = hp->n_head / hp->n_head_kv, n = c->b->n;
    const int nkv = c->a->slice.h1 - c->a->slice.h0, QS = nkv * rep * D;
    const enum cm_type vdt = cm_type_traits_of(c->wo.type)->vec_dot_type;
    const bool piece = vdt != CM_TYPE_F32 && ((int64_t)rep * D) % cm_type_traits_of(vdt)->block_size == 0;
    const size_t rs = vdt == CM_TYPE_F32 ? 0 : cm_row_size(vdt, QS);
    int64_t t0, t1;
    cm_split_range((int64_t)n * nkv, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const int j = (int)(t / nkv), hl = (int)(t % nkv);
        rope_kv_task(c, j, hl);
        for (int h = hl * rep; h < (hl + 1) * rep; h++) {
            rope_q_task(c, j, h);
            attn_task(c, j, h, ith);
        }
        if (piece) {
            const int64_t c0 = (int64_t)hl * rep * D;
            cm_fwd_convert(c, CM_ACT_ATTN_OUT, j, c0, vdt, c->att + (size_t)j * QS + c0,
                           c->xq + (size_t)j * rs + cm_row_size(vdt, c0), (int64_t)rep * D);
        }
    }
    cm_pool_barrier(c->pool);
    if (vdt == CM_TYPE_F32) {
        *stride = (size_t)QS * sizeof(float);
        return c->att;
    }
    if (piece) {
        *stride = rs;
        return c->xq;
    }
    return cm_fwd_prep_act(c, CM_ACT_ATTN_OUT, &c->wo, c->att, QS, QS, n, stride, ith, nth);
}

/* Every token of the batch from a different sequence (a decode step). */
static bool distinct_seqs(const cm_batch *b) {
    for (int j = 1; j < b->n; j++)
        for (int i = 0; i < j; i++)
            if (b->seq[i] == b->seq[j]) return false;
    return true;
}

/* Decode (one token) past SPLIT_MIN positions, over either layout:
 * threads take whole kv heads for RoPE and the K/V store, then (kv head,
 * block of CM_ATTN_BLOCK positions) tasks (attn_split.c), then query heads
 * for the merge in block order and their part of attn_output's input. The
 * blocks are fixed by position, so the bits do not depend on nth. */
enum { SPLIT_MIN = 2 * CM_ATTN_BLOCK, MULTI_TOK = 32 /* tokens per prefill task (cm_attn_multi) */ };

static size_t split_nbmax(int max_ctx) { return (size_t)max_ctx / CM_ATTN_BLOCK + 2; }
static size_t split_scr(int rep, int D) { return cm_attn_multi_scratch_floats(rep * MULTI_TOK, D); }

/* Per thread: scratch, then the partials of all query heads (decode), then
 * per thread the partials of MULTI_TOK tokens' query heads of one kv head
 * (prefill, cm_attn_multi). */
size_t cm_fwd_split_floats(const cm_model *m, int max_ctx, int n_threads) {
    const int D = m->hp.head_dim, rep = m->hp.n_head / CM_MAX(1, m->hp.n_head_kv);
    const size_t part = split_nbmax(max_ctx) * ((size_t)D + 2);
    return (size_t)n_threads * (split_scr(rep, D) + (size_t)MULTI_TOK * rep * part) + (size_t)m->hp.n_head * part;
}

/* The view attn_split.c reads of (layer il, kv head hk): a rows-layout
 * cache's (attn.c), or the transposed one's K rows and V element rows. */
static cm_attn_kv split_view(const cm_kv *kv, int il, int hk) {
    if (kv->v_rows) return cm_attn_kv_of(kv, il, hk);
    const size_t es = kv->type == CM_TYPE_F16 ? sizeof(cm_f16) : sizeof(float), off = kv_off(kv, il, hk) * es;
    const cm_attn_kv v = {.k = (const uint8_t *)kv->k + off,
                          .v = (const uint8_t *)kv->v + off,
                          .k_row = (size_t)kv->head_dim * es,
                          .v_row = es,
                          .k_type = kv->type,
                          .v_type = kv->type,
                          .v_tstride = (size_t)kv->n_ctx * es};
    return v;
}

void cm_ctx_set_attn_split(cm_ctx *c, bool on) { c->split_off = !on; }

static bool use_split(const cm_ctx *c) {
    const cm_kv *kv = c->a->kvs[c->b->seq[0]];
    if (c->b->n != 1 || !c->split || c->split_off || c->b->pos[0] + 1 <= SPLIT_MIN) return false;
    const cm_attn_kv av = split_view(kv, c->il, c->a->slice.h0);
    return cm_attn_split_ok(c->k, &av, c->m->hp.head_dim);
}

static const void *attn_decode_split(cm_ctx *c, size_t *stride, int ith, int nth) {
    const cm_hparams *hp = &c->m->hp;
    const int D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    const int nkv = c->a->slice.h1 - c->a->slice.h0, nq = nkv * rep, QS = nq * D;
    const float scale = hp->attn_q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)D);
    const cm_kv *kv = c->a->kvs[c->b->seq[0]];
    const int np = c->b->pos[0] + 1, p_lo = cm_layer_is_swa(hp, c->il) ? CM_MAX(0, np - hp->n_swa) : 0;
    const int bl0 = p_lo / CM_ATTN_BLOCK, nb = (np - 1) / CM_ATTN_BLOCK + 1 - bl0;
    const size_t scr_n = split_scr(rep, D), nbmax = split_nbmax(c->max_ctx);
    const size_t pstride = nbmax * ((size_t)D + 2); /* between query heads' partials */
    float *parts = c->split + (size_t)c->n_threads * scr_n;
    int64_t k0, k1;
    cm_split_range(nkv, ith, nth, &k0, &k1);
    for (int64_t hl = k0; hl < k1; hl++) rope_kv_task(c, 0, (int)hl);
    for (int64_t h = k0 * rep; h < k1 * rep; h++) rope_q_task(c, 0, (int)h);
    cm_pool_barrier(c->pool);
    int64_t t0, t1;
    cm_split_range((int64_t)nkv * nb, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const int hl = (int)(t / nb), bi = (int)(t % nb), b = bl0 + bi;
        const cm_attn_kv av = split_view(kv, c->il, c->a->slice.h0 + hl);
        const int p0 = CM_MAX(p_lo, b * CM_ATTN_BLOCK), p1 = CM_MIN(np, (b + 1) * CM_ATTN_BLOCK);
        cm_attn_split_block(c->k, &av, D, rep, c->q + (size_t)hl * rep * D, p0, p1, scale,
                            c->split + (size_t)ith * scr_n, parts + (size_t)hl * rep * pstride + (size_t)bi * (D + 2),
                            pstride);
    }
    cm_pool_barrier(c->pool);
    const float *sinks = c->m->layers[c->il].attn_sinks.data;
    const cm_attn_kv av = split_view(kv, c->il, c->a->slice.h0);
    int64_t h0, h1;
    cm_split_range(nq, ith, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++)
        cm_attn_split_merge(parts + (size_t)h * pstride, nb, D, sinks ? sinks[c->a->slice.h0 * rep + h] : NAN, av.rot_v,
                            c->att + (size_t)h * D);
    const enum cm_type vdt = cm_type_traits_of(c->wo.type)->vec_dot_type;
    if (vdt == CM_TYPE_F32) {
        cm_pool_barrier(c->pool);
        *stride = (size_t)QS * sizeof(float);
        return c->att;
    }
    if (D % cm_type_traits_of(vdt)->block_size == 0) {
        const int64_t c0 = h0 * D, c1 = h1 * D;
        if (c1 > c0) cm_fwd_convert(c, CM_ACT_ATTN_OUT, 0, c0, vdt, c->att + c0, c->xq + cm_row_size(vdt, c0), c1 - c0);
        cm_pool_barrier(c->pool);
        *stride = cm_row_size(vdt, QS);
        return c->xq;
    }
    cm_pool_barrier(c->pool);
    return cm_fwd_prep_act(c, CM_ACT_ATTN_OUT, &c->wo, c->att, QS, QS, 1, stride, ith, nth);
}

/* A batch that reaches past SPLIT_MIN positions: (kv head, group of
 * MULTI_TOK batch tokens) tasks; in a group, each run of tokens of one
 * sequence whose positions reach past SPLIT_MIN goes through cm_attn_multi
 * (their query heads share K/V tiles; each query gets the bits of the
 * decode's blocks and merge, so a prompt chunked into decode steps and B
 * sequences decoded together give the bits of each alone), any other token
 * through attn_task as before. */
static bool use_multi(const cm_ctx *c) {
    const cm_batch *b = c->b;
    if (b->n < 2 || !c->split || c->split_off) return false;
    int pmax = 0;
    for (int j = 0; j < b->n; j++) pmax = CM_MAX(pmax, b->pos[j] + 1);
    const cm_attn_kv av = split_view(c->a->kvs[b->seq[0]], c->il, c->a->slice.h0);
    return pmax > SPLIT_MIN && cm_attn_split_ok(c->k, &av, c->m->hp.head_dim);
}

static void attn_prefill_multi(cm_ctx *c, int ith, int nth) {
    const cm_hparams *hp = &c->m->hp;
    const cm_batch *b = c->b;
    const int D = hp->head_dim, rep = hp->n_head / hp->n_head_kv, h0 = c->a->slice.h0;
    const int nkv = c->a->slice.h1 - h0, ng = (b->n + MULTI_TOK - 1) / MULTI_TOK;
    const float scale = hp->attn_q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)D);
    const size_t scr_n = split_scr(rep, D), ps = split_nbmax(c->max_ctx) * ((size_t)D + 2);
    const size_t QS = (size_t)nkv * rep * D; /* between batch tokens' q and att rows */
    const float *sinks = c->m->layers[c->il].attn_sinks.data;
    float *scratch = c->split + (size_t)ith * scr_n;
    float *parts =
        c->split + (size_t)c->n_threads * scr_n + (size_t)hp->n_head * ps + (size_t)ith * MULTI_TOK * rep * ps;
    int64_t t0, t1;
    cm_split_range((int64_t)nkv * ng, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const int hl = (int)(t / ng), j1 = CM_MIN(b->n, (int)(t % ng) * MULTI_TOK + MULTI_TOK);
        for (int ja = (int)(t % ng) * MULTI_TOK, jb; ja < j1; ja = jb) { /* runs of one sequence */
            int lo[MULTI_TOK], hi[MULTI_TOK], pmax = 0;
            for (jb = ja; jb < j1 && b->seq[jb] == b->seq[ja]; jb++) {
                hi[jb - ja] = b->pos[jb] + 1;
                lo[jb - ja] = cm_layer_is_swa(hp, c->il) ? CM_MAX(0, hi[jb - ja] - hp->n_swa) : 0;
                pmax = CM_MAX(pmax, hi[jb - ja]);
            }
            const cm_attn_kv av = split_view(c->a->kvs[b->seq[ja]], c->il, h0 + hl);
            const bool split_ok = pmax > SPLIT_MIN && cm_attn_split_ok(c->k, &av, D);
            /* Batch invariance: each token gets the bits it would get
             * decoded alone (past SPLIT_MIN: decode's blocks and merge, which
             * cm_attn_multi keeps per query while the tokens share K/V tiles;
             * below: attn_task). */
            for (int j = ja, je; j < jb; j = je) {
                if (!split_ok || hi[j - ja] <= SPLIT_MIN) {
                    for (int r = 0; r < rep; r++) attn_task(c, j, hl * rep + r, ith);
                    je = j + 1;
                    continue;
                }
                for (je = j + 1; je < jb && hi[je - ja] > SPLIT_MIN;) je++;
                const size_t off = (size_t)j * QS + (size_t)hl * rep * D;
                cm_attn_multi(c->k, &av, D, je - j, rep, c->q + off, QS, lo + (j - ja), hi + (j - ja), scale,
                              sinks ? sinks + (size_t)(h0 + hl) * rep : NULL, scratch, parts, ps, c->att + off, QS);
            }
        }
    }
}

void cm_fwd_attn(cm_ctx *c, int ith, int nth) {
    const cm_model *m = c->m;
    const cm_hparams *hp = &m->hp;
    const cm_layer *L = &m->layers[c->il];
    const cm_batch *b = c->b;
    const cm_slice s = c->a->slice;
    const int E = hp->n_embd, D = hp->head_dim, n = b->n;
    const int rep = hp->n_head / hp->n_head_kv;
    const int nkv = s.h1 - s.h0, nq = nkv * rep; /* heads in this slice */
    const int QS = nq * D, KS = nkv * D;         /* row widths of q and k/v in this slice */

    if (c->mla) { /* deepseek2: multi-head latent attention (mla.c) */
        size_t xs;
        const void *xq =
            cm_fwd_add_norm_prep(c, CM_ACT_ATTN_IN, &L->attn_norm, hp->mla.q_lora ? &L->wq_a : &L->wq, &xs, ith, nth);
        const cm_mla_run r = {.m = m,
                              .k = c->k,
                              .pool = c->pool,
                              .il = c->il,
                              .b = b,
                              .kvs = c->a->kvs,
                              .xn = c->xn,
                              .xq = xq,
                              .xq_stride = xs,
                              .out = c->part,
                              .h0 = s.h0,
                              .h1 = s.h1, /* query heads */
                              .hook = c->hook,
                              .hook_user = c->hook_user};
        cm_mla_attn(c->mla, &r, ith, nth);
        return;
    }
    if (nkv == 0) { /* a member with FFN rows only: contributes nothing here */
        cm_fwd_add_pending(c, ith, nth);
        cm_fwd_zero_part(c, ith, nth);
        return;
    }

    /* Q, K, V: the activations are converted once per distinct vec_dot_type. */
    size_t xs;
    const void *xq = cm_fwd_add_norm_prep(c, CM_ACT_ATTN_IN, &L->attn_norm, &c->wq, &xs, ith, nth);
    cm_fwd_matmul(c, &c->wq, xq, xs, n, c->q, QS, ith, nth);
    enum cm_type vq = cm_type_traits_of(c->wq.type)->vec_dot_type;
    if (cm_type_traits_of(c->wk.type)->vec_dot_type != vq) {
        cm_pool_barrier(c->pool);
        xq = cm_fwd_prep_act(c, CM_ACT_K_IN, &c->wk, c->xn, E, E, n, &xs, ith, nth);
    }
    cm_fwd_matmul(c, &c->wk, xq, xs, n, c->kc, KS, ith, nth);
    if (cm_type_traits_of(c->wv.type)->vec_dot_type != cm_type_traits_of(c->wk.type)->vec_dot_type) {
        cm_pool_barrier(c->pool);
        xq = cm_fwd_prep_act(c, CM_ACT_V_IN, &c->wv, c->xn, E, E, n, &xs, ith, nth);
    }
    cm_fwd_matmul(c, &c->wv, xq, xs, n, c->vc, KS, ith, nth);
    cm_pool_barrier(c->pool);

    if (use_split(c)) {
        xq = attn_decode_split(c, &xs, ith, nth);
        cm_fwd_matmul(c, &c->wo, xq, xs, n, c->part, E, ith, nth);
        return;
    }
    if (n == 1 && nkv >= nth) {
        xq = attn_decode(c, &xs, ith, nth);
        cm_fwd_matmul(c, &c->wo, xq, xs, n, c->part, E, ith, nth);
        return;
    }

    if (n > 1 && distinct_seqs(b) && !use_multi(c)) {
        xq = attn_decode_many(c, &xs, ith, nth);
        cm_fwd_matmul(c, &c->wo, xq, xs, n, c->part, E, ith, nth);
        return;
    }

    /* One task per (token, head), q heads first. */
    {
        int64_t tasks = (int64_t)n * (nq + nkv), t0, t1;
        cm_split_range(tasks, ith, nth, &t0, &t1);
        for (int64_t t = t0; t < t1; t++) {
            int j = (int)(t / (nq + nkv)), h = (int)(t % (nq + nkv));
            if (h < nq) rope_q_task(c, j, h);
            else rope_kv_task(c, j, h - nq);
        }
    }
    cm_pool_barrier(c->pool);

    /* Attention, one task per (token, q head) (or the tiles above past SPLIT_MIN). */
    if (use_multi(c)) {
        attn_prefill_multi(c, ith, nth);
    } else {
        /* Every nth task, not a contiguous part: a causal prompt's later
         * tokens attend to more positions, and contiguous parts gave the
         * last thread ~3x the first's work at 2 threads. Each task writes
         * its own output: which thread runs it changes no bits. */
        const int64_t tasks = (int64_t)n * nq;
        for (int64_t t = ith; t < tasks; t += nth) attn_task(c, (int)(t / nq), (int)(t % nq), ith);
    }
    cm_pool_barrier(c->pool);

    xq = cm_fwd_prep_act(c, CM_ACT_ATTN_OUT, &c->wo, c->att, QS, QS, n, &xs, ith, nth);
    cm_fwd_matmul(c, &c->wo, xq, xs, n, c->part, E, ith, nth);
}
