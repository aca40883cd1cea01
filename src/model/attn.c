/*
 * attn.c: the KV cache's element types and the tiled attention with online
 * softmax ("flash" attention) over it.
 *
 * A cache holds K and V of one sequence for a layer range and a KV-head
 * range. Two layouts:
 *   - the transposed one (ggml's non-flash layout, model.h): K rows
 *     [n_ctx][D], V as [D][n_ctx], F32 or F16 only; attention then runs
 *     forward.c's two-pass softmax, the numbers of llama.cpp without flash
 *     attention;
 *   - rows (v_rows): K and V both [n_ctx] rows of D elements, each row in
 *     its type's blocks (F32, F16, Q8_0, Q4_0: llama.cpp's -ctk/-ctv; a
 *     quantized V needs this layout, as it needs flash attention in
 *     llama.cpp). Attention then runs cm_attn_flash below. A quantized
 *     type's rows are rotated as llama.cpp's are (cm_kv_rot_k/v).
 *
 * cm_attn_flash is written against a narrow view (rows of K and V, a range
 * of positions, a scale, an optional sink logit) so that sliding windows
 * (p_lo > 0) and attention sinks pass through it unchanged. It never
 * allocates: the caller gives scratch of cm_attn_scratch_bytes().
 */
#include "model.h"

#include <math.h>
#include <string.h>

bool cm_kv_type_ok(enum cm_type t) {
    return t == CM_TYPE_F32 || t == CM_TYPE_F16 || t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0;
}

int cm_kv_type_parse(const char *s, enum cm_type *t) {
    if (!s) return CM_EINVAL;
    int v = cm_type_from_name(s);
    if (v < 0 || !cm_kv_type_ok((enum cm_type)v)) return CM_EINVAL;
    *t = (enum cm_type)v;
    return 0;
}

uint64_t cm_kv_bytes_types(const cm_model *m, int layer_first, int layer_last, int h0, int h1, int n_ctx,
                           enum cm_type type_k, enum cm_type type_v) {
    const uint64_t rows = (uint64_t)(layer_last - layer_first) * (uint64_t)(h1 - h0) * (uint64_t)n_ctx;
    if (m->hp.arch == CM_ARCH_DEEPSEEK2) /* the latent rows only (mla.h), whatever the heads */
        return (uint64_t)(layer_last - layer_first) * (uint64_t)n_ctx * (uint64_t)cm_row_size(type_k, m->hp.head_dim);
    return rows * (uint64_t)(cm_row_size(type_k, m->hp.head_dim) + cm_row_size(type_v, m->hp.head_dim));
}

int cm_kv_init_types(cm_kv *kv, const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx,
                     enum cm_type type_k, enum cm_type type_v, bool rows, char *err, size_t errlen) {
    memset(kv, 0, sizeof *kv);
    if (!cm_kv_type_ok(type_k) || !cm_kv_type_ok(type_v))
        return cm_errf(err, errlen, CM_EINVAL, "kv cache types %s/%s are not supported (f32, f16, q8_0, q4_0)",
                       cm_type_name(type_k), cm_type_name(type_v));
    const int D = m->hp.head_dim;
    if (!cm_row_size(type_k, D) || !cm_row_size(type_v, D))
        return cm_errf(err, errlen, CM_EINVAL, "head size %d is not a multiple of the %s kv cache's block of 32", D,
                       cm_row_size(type_k, D) ? cm_type_name(type_v) : cm_type_name(type_k));
    /* the transposed layout only for the two float types, the same one for K and V */
    if (!rows && (type_k != type_v || (type_k != CM_TYPE_F32 && type_k != CM_TYPE_F16))) rows = true;
    if (m->hp.arch == CM_ARCH_DEEPSEEK2 && rows) /* mla.c attends its latent rows itself */
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "deepseek2 keeps its latent cache in f32 or f16 (-ctk f16), not %s/%s or with --flash-attn",
                       cm_type_name(type_k), cm_type_name(type_v));
    if (!rows) return cm_kv_init_type(kv, m, layer_first, layer_last, s, n_ctx, type_k, err, errlen);
    int rc = cm_kv_check(m, layer_first, layer_last, s, n_ctx, err, errlen);
    if (rc) return rc;
    const uint64_t n = (uint64_t)(layer_last - layer_first) * (uint64_t)(s.h1 - s.h0) * (uint64_t)n_ctx;
    const uint64_t kb = n * cm_row_size(type_k, D), vb = n * cm_row_size(type_v, D);
    if (kb > SIZE_MAX / 4 || vb > SIZE_MAX / 4)
        return cm_errf(err, errlen, CM_ENOMEM, "kv cache of %llu bytes is too large", (unsigned long long)(kb + vb));
    /* reserved address space: untouched context costs no memory (kv_mem.c) */
    kv->k = cm_kv_mem_map((size_t)kb + sizeof(float), &kv->k_map);
    kv->v = cm_kv_mem_map((size_t)vb + sizeof(float), &kv->v_map);
    if (!kv->k || !kv->v) {
        cm_kv_release(kv);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for a kv cache of %llu bytes",
                       (unsigned long long)(kb + vb));
    }
    kv->layer_first = layer_first;
    kv->layer_last = layer_last;
    kv->h0 = s.h0;
    kv->h1 = s.h1;
    kv->n_ctx = n_ctx;
    kv->head_dim = D;
    kv->type = type_k;
    kv->type_v = type_v;
    kv->v_rows = rows;
    kv->k_row = cm_row_size(type_k, D);
    kv->v_row = cm_row_size(type_v, D);
    return 0;
}

/* Byte offset of position 0 of (layer il, kv head hk) in a rows-layout cache. */
static size_t rows_off(const cm_kv *kv, int il, int hk, size_t row) {
    return ((size_t)(il - kv->layer_first) * (size_t)(kv->h1 - kv->h0) + (size_t)(hk - kv->h0)) * (size_t)kv->n_ctx *
           row;
}

/* F16 as the activation converter; Q8_0 and Q4_0 with ggml's reference
 * quantizers (cm_quantize_rows). The rows arrive rotated (cm_kv_store_rows). */
static void store_row(const cm_kernels *k, enum cm_type t, const float *x, uint8_t *dst, int D) {
    if (t == CM_TYPE_F32) memcpy(dst, x, (size_t)D * sizeof(float));
    else if (t == CM_TYPE_F16) k->from_float[t](x, dst, D);
    else cm_quantize_rows(t, x, dst, 1, D);
}

static bool is_quant(enum cm_type t) { return t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0; }

int cm_kv_rot_k(enum cm_type t, int head_dim) {
    if (!is_quant(t) || head_dim <= 0 || head_dim % 64) return 0;
    int n = 64;
    while (head_dim % (2 * n) == 0) n *= 2;
    return n;
}

int cm_kv_rot_v(enum cm_type t, int head_dim) { return is_quant(t) && head_dim > 0 && head_dim % 64 == 0 ? 64 : 0; }

void cm_fwht_rows(float *x, int D, int n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int c = 0; c < D; c += n) {
        float *r = x + c;
        for (int i = 0; i < n; i++) r[i] *= scale;
        for (int len = 1; len < n; len <<= 1)
            for (int i = 0; i < n; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    const float u = r[j], v = r[j + len];
                    r[j] = u + v;
                    r[j + len] = u - v;
                }
    }
}

enum { ROT_MAX_D = 1024 }; /* heads wider than this are stored unrotated (none known) */

void cm_kv_store_rows(const cm_kernels *k, cm_kv *kv, int il, int hk, int pos, const float *kr, const float *vr) {
    const int D = kv->head_dim;
    uint8_t *kd = (uint8_t *)kv->k + rows_off(kv, il, hk, kv->k_row) + (size_t)pos * kv->k_row;
    uint8_t *vd = (uint8_t *)kv->v + rows_off(kv, il, hk, kv->v_row) + (size_t)pos * kv->v_row;
    const int rk = D <= ROT_MAX_D ? cm_kv_rot_k(kv->type, D) : 0, rv = D <= ROT_MAX_D ? cm_kv_rot_v(kv->type_v, D) : 0;
    float tmp[ROT_MAX_D];
    if (rk) {
        memcpy(tmp, kr, (size_t)D * sizeof(float));
        cm_fwht_rows(tmp, D, rk);
        kr = tmp;
    }
    store_row(k, kv->type, kr, kd, D);
    if (rv) {
        memcpy(tmp, vr, (size_t)D * sizeof(float));
        cm_fwht_rows(tmp, D, rv);
        vr = tmp;
    }
    store_row(k, kv->type_v, vr, vd, D);
}

void cm_kv_store(const cm_kernels *k, cm_kv *kv, int il, int hk, int pos, const float *kr, const float *vr) {
    if (kv->v_rows) {
        cm_kv_store_rows(k, kv, il, hk, pos, kr, vr);
        return;
    }
    const int D = kv->head_dim;
    const size_t off = ((size_t)(il - kv->layer_first) * (size_t)(kv->h1 - kv->h0) + (size_t)(hk - kv->h0)) *
                       (size_t)kv->n_ctx * (size_t)D;
    if (kv->type == CM_TYPE_F16) {
        cm_f16 *kd = (cm_f16 *)kv->k + off + (size_t)pos * D, *vt = (cm_f16 *)kv->v + off;
        for (int i = 0; i < D; i++) kd[i] = cm_f32_to_f16(kr[i]);
        for (int i = 0; i < D; i++) vt[(size_t)i * kv->n_ctx + pos] = cm_f32_to_f16(vr[i]);
    } else {
        memcpy((float *)kv->k + off + (size_t)pos * D, kr, (size_t)D * sizeof(float));
        float *vt = (float *)kv->v + off;
        for (int i = 0; i < D; i++) vt[(size_t)i * kv->n_ctx + pos] = vr[i];
    }
}

cm_attn_kv cm_attn_kv_of(const cm_kv *kv, int il, int hk) {
    cm_attn_kv v = {.k = (const uint8_t *)kv->k + rows_off(kv, il, hk, kv->k_row),
                    .v = (const uint8_t *)kv->v + rows_off(kv, il, hk, kv->v_row),
                    .k_row = kv->k_row,
                    .v_row = kv->v_row,
                    .k_type = kv->type,
                    .v_type = kv->type_v,
                    .rot_k = kv->head_dim <= ROT_MAX_D ? cm_kv_rot_k(kv->type, kv->head_dim) : 0,
                    .rot_v = kv->head_dim <= ROT_MAX_D ? cm_kv_rot_v(kv->type_v, kv->head_dim) : 0};
    return v;
}

size_t cm_attn_scratch_bytes(int head_dim) {
    /* the query in K's vec_dot type (<= F32), a tile of scores, one V row in
     * floats, the accumulator, the rotated query */
    return (size_t)head_dim * 4 + 64 + CM_ATTN_TILE * 4 + (size_t)head_dim * 8 + 64 + (size_t)head_dim * 4 + 64;
}

/* An F16 V cache, as ggml's flash attention takes it for a batch of fewer
 * than 64 queries: position by position, a new maximum rescales the
 * accumulator at once, and the accumulator itself is F16 (each step
 * y = f16(fma(v, w, y)), each rescale y = f16(y * ms)); then floats. With
 * the F32 accumulator of the other types, the F16-cache models were up to
 * 1.5e-2 off llama.cpp (measured). qx: the query in F16. */
static void flash_f16v(const cm_kernels *k, const cm_attn_kv *kv, int D, const cm_attn_query *aq, const void *qx,
                       cm_f16 *acc16, float *out) {
    const cm_vec_dot_fn dot = kv->k_type == CM_TYPE_F16 ? k->attn_f16_dot : k->vec_dot[kv->k_type];
    const cm_attn_f16_step_fn step = k->attn_f16_step;
    float M = -INFINITY, S = 0.0f;
    memset(acc16, 0, (size_t)D * sizeof(cm_f16)); /* F16 zero is all zero bits */
    /* A tile of positions at a time: their scores (independent of each
     * other), then the running maximum and sum in position order, then the
     * steps in position order: each operation as position by position, only
     * grouped (the dots no longer wait on the previous step). */
    float sc[CM_ATTN_TILE], msc[CM_ATTN_TILE];
    for (int p0 = aq->p_lo; p0 < aq->p_hi; p0 += CM_ATTN_TILE) {
        const int nt = CM_MIN(CM_ATTN_TILE, aq->p_hi - p0);
        for (int j = 0; j < nt; j++) {
            float s;
            dot(D, &s, kv->k + (size_t)(p0 + j) * kv->k_row, qx);
            sc[j] = s * aq->scale;
        }
        for (int j = 0; j < nt; j++) {
            const float s = sc[j];
            float ms = 1.0f, vs = 1.0f;
            if (s > M) {
                const float Mold = M;
                M = s;
                ms = expf(Mold - M);
            } else {
                vs = expf(s - M);
            }
            S = S * ms + vs;
            msc[j] = ms;
            sc[j] = vs;
        }
        for (int j = 0; j < nt; j++) step(D, acc16, kv->v + (size_t)(p0 + j) * kv->v_row, msc[j], sc[j]);
    }
    for (int i = 0; i < D; i++) out[i] = cm_f16_to_f32(acc16[i]);
    if (!isnan(aq->sink)) {
        float ms = 1.0f, vs = 1.0f;
        if (aq->sink > M) {
            ms = expf(M - aq->sink);
            M = aq->sink;
            for (int i = 0; i < D; i++) out[i] *= ms;
        } else {
            vs = expf(aq->sink - M);
        }
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < D; i++) out[i] *= inv;
}

void cm_attn_flash(const cm_kernels *k, const cm_attn_kv *kv, int D, const cm_attn_query *aq, void *scratch,
                   float *out) {
    const enum cm_type qt = cm_type_traits_of(kv->k_type)->vec_dot_type;
    uint8_t *qc = scratch;
    float *sc = (float *)(qc + (((size_t)D * 4 + 63) & ~(size_t)63));
    float *vrow = sc + CM_ATTN_TILE;
    float *acc = vrow + D;
    const float *qf = aq->q;
    if (kv->rot_k) { /* the keys were stored rotated: rotate the query alike */
        float *qr = acc + D;
        memcpy(qr, aq->q, (size_t)D * sizeof(float));
        cm_fwht_rows(qr, D, kv->rot_k);
        qf = qr;
    }
    const void *qx = qf;
    if (qt != CM_TYPE_F32) {
        k->from_float[qt](qf, qc, D);
        qx = qc;
    }
    if (kv->v_type == CM_TYPE_F16 && qt == CM_TYPE_F16) {
        flash_f16v(k, kv, D, aq, qx, (cm_f16 *)acc, out);
        return;
    }
    const cm_vec_dot_fn dot = k->vec_dot[kv->k_type];
    const cm_to_float_fn v_to_float = k->to_float[kv->v_type];
    const cm_attn_v_fn v_acc = k->attn_v[kv->v_type];
    float M = -INFINITY, S = 0.0f;
    for (int i = 0; i < D; i++) acc[i] = 0.0f;
    for (int p0 = aq->p_lo; p0 < aq->p_hi; p0 += CM_ATTN_TILE) {
        const int nt = CM_MIN(CM_ATTN_TILE, aq->p_hi - p0);
        float mt = -INFINITY;
        for (int j = 0; j < nt; j++) {
            float s;
            dot(D, &s, kv->k + (size_t)(p0 + j) * kv->k_row, qx);
            sc[j] = s * aq->scale;
            if (sc[j] > mt) mt = sc[j];
        }
        if (mt > M) { /* a new maximum: rescale what came before */
            const float ms = expf(M - mt);
            for (int i = 0; i < D; i++) acc[i] *= ms;
            S *= ms;
            M = mt;
        }
        for (int j = 0; j < nt; j++) {
            sc[j] = expf(sc[j] - M);
            S += sc[j];
        }
        if (v_acc) { /* the table's kernel (kernels.h; SIMD per ISA) */
            v_acc(D, kv->v + (size_t)p0 * kv->v_row, kv->v_row, sc, nt, acc);
            continue;
        }
        for (int j = 0; j < nt; j++) {
            const float w = sc[j];
            const float *vr;
            if (kv->v_type == CM_TYPE_F32) {
                vr = (const float *)(kv->v + (size_t)(p0 + j) * kv->v_row);
            } else {
                v_to_float(kv->v + (size_t)(p0 + j) * kv->v_row, vrow, D);
                vr = vrow;
            }
            for (int i = 0; i < D; i++) acc[i] += w * vr[i];
        }
    }
    if (!isnan(aq->sink)) { /* a logit with no value: only the denominator grows */
        if (aq->sink > M) {
            const float ms = expf(M - aq->sink);
            for (int i = 0; i < D; i++) acc[i] *= ms;
            S *= ms;
            M = aq->sink;
        }
        S += expf(aq->sink - M);
    }
    const float inv = S > 0.0f ? 1.0f / S : 0.0f;
    for (int i = 0; i < D; i++) out[i] = acc[i] * inv;
    if (kv->rot_v) cm_fwht_rows(out, D, kv->rot_v); /* back from the values' rotation */
}
