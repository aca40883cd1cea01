/*
 * attn_ref.c: the scalar reference of attention's value side (kernels.h,
 * cm_attn_v_fn): acc += w[j] * V_j over a tile of KV-cache rows, for the KV
 * cache types F32, F16, Q8_0 and Q4_0. Each row is dequantized with the
 * type's to_float (ggml's rounding) and added in row order with a separate
 * multiply and add. Never allocates (rows are dequantized in 32-element
 * blocks on the stack). Also the reference of the multi-query decode ops
 * (attn_qk, attn_vm, attn_exp): a K row dequantized the same way, products
 * and sums in float in element order, expf.
 */
#include "isa.h"

#include <math.h>

static void attn_v_f32(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int j = 0; j < n; j++) {
        const float *r = (const float *)((const char *)v + (size_t)j * v_row);
        for (int64_t i = 0; i < D; i++) acc[i] += w[j] * r[i];
    }
}

/* Dequantize 32 elements at a time through the reference to_float. */
static void attn_v_blocks(cm_to_float_fn to_float, size_t block_bytes, int64_t D, const void *v, size_t v_row,
                          const float *w, int n, float *acc) {
    float tmp[32];
    for (int j = 0; j < n; j++) {
        const char *r = (const char *)v + (size_t)j * v_row;
        for (int64_t b = 0; b < D / 32; b++) {
            to_float(r + (size_t)b * block_bytes, tmp, 32);
            for (int i = 0; i < 32; i++) acc[b * 32 + i] += w[j] * tmp[i];
        }
    }
}

static void attn_v_f16(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int j = 0; j < n; j++) {
        const cm_f16 *r = (const cm_f16 *)((const char *)v + (size_t)j * v_row);
        for (int64_t i = 0; i < D; i++) acc[i] += w[j] * cm_f16_to_f32(r[i]);
    }
}

static void attn_v_q8_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    attn_v_blocks(cm_ref_to_float_q8_0, sizeof(cm_block_q8_0), D, v, v_row, w, n, acc);
}

static void attn_v_q4_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    attn_v_blocks(cm_ref_to_float_q4_0, sizeof(cm_block_q4_0), D, v, v_row, w, n, acc);
}

static void attn_f16_step(int64_t D, void *accv, const void *vv, float ms, float w) {
    cm_f16 *acc = accv;
    const cm_f16 *v = vv;
    if (ms != 1.0f)
        for (int64_t i = 0; i < D; i++) acc[i] = cm_f32_to_f16(cm_f16_to_f32(acc[i]) * ms);
    for (int64_t i = 0; i < D; i++) acc[i] = cm_f32_to_f16(fmaf(cm_f16_to_f32(v[i]), w, cm_f16_to_f32(acc[i])));
}

static void attn_f16_dot(int64_t D, float *s, const void *xv, const void *yv) {
    const cm_f16 *x = xv, *y = yv;
    float a[64];
    for (int l = 0; l < 64; l++) a[l] = 0.0f;
    const int64_t np = D & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int l = 0; l < 64; l++) a[l] = fmaf(cm_f16_to_f32(x[i + l]), cm_f16_to_f32(y[i + l]), a[l]);
    for (int l = 0; l < 32; l++) a[l] += a[l + 32];
    for (int w = 16; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++) a[l] += a[l + w];
    double sum = a[0];
    for (int64_t i = np; i < D; i++) sum += (double)(cm_f16_to_f32(x[i]) * cm_f16_to_f32(y[i]));
    *s = (float)sum;
}

/* Row j of a KV cache of type t as floats, 32 elements at a time. */
static void row_to_float(enum cm_type t, const void *row, float *y, int64_t D) {
    if (t == CM_TYPE_F32) {
        for (int64_t i = 0; i < D; i++) y[i] = ((const float *)row)[i];
    } else if (t == CM_TYPE_F16) {
        for (int64_t i = 0; i < D; i++) y[i] = cm_f16_to_f32(((const cm_f16 *)row)[i]);
    } else if (t == CM_TYPE_Q8_0) {
        cm_ref_to_float_q8_0(row, y, D);
    } else {
        cm_ref_to_float_q4_0(row, y, D);
    }
}

#define ATTN_MULTI_REF(T, NAME)                                                                                    \
    static void attn_qk_##NAME(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale, \
                               float *s, int ld) {                                                                 \
        float kf[32];                                                                                              \
        for (int j = 0; j < n; j++) {                                                                              \
            const char *r = (const char *)k + (size_t)j * k_row;                                                   \
            for (int h = 0; h < nq; h++) s[h * ld + j] = 0.0f;                                                     \
            for (int64_t b = 0; b < D; b += 32) { /* D is a multiple of 32 for the block types (attn_split.c) */   \
                const int64_t nb = D - b < 32 ? D - b : 32;                                                        \
                row_to_float(T, r + cm_row_size(T, b), kf, nb);                                                    \
                for (int h = 0; h < nq; h++)                                                                       \
                    for (int64_t i = 0; i < nb; i++) s[h * ld + j] += kf[i] * q[h * D + b + i];                    \
            }                                                                                                      \
            for (int h = 0; h < nq; h++) s[h * ld + j] *= scale;                                                   \
        }                                                                                                          \
    }                                                                                                              \
    static void attn_vm_##NAME(int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,      \
                               float *acc) {                                                                       \
        float vf[32];                                                                                              \
        for (int j = 0; j < n; j++) {                                                                              \
            const char *r = (const char *)v + (size_t)j * v_row;                                                   \
            for (int64_t b = 0; b < D; b += 32) {                                                                  \
                const int64_t nb = D - b < 32 ? D - b : 32;                                                        \
                row_to_float(T, r + cm_row_size(T, b), vf, nb);                                                    \
                for (int h = 0; h < nq; h++)                                                                       \
                    for (int64_t i = 0; i < nb; i++) acc[h * D + b + i] += w[h * ld + j] * vf[i];                  \
            }                                                                                                      \
        }                                                                                                          \
    }
ATTN_MULTI_REF(CM_TYPE_F32, f32)
ATTN_MULTI_REF(CM_TYPE_F16, f16)
ATTN_MULTI_REF(CM_TYPE_Q8_0, q8_0)
ATTN_MULTI_REF(CM_TYPE_Q4_0, q4_0)

static float attn_exp(int n, float *s, float m) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    return sum;
}

void cm_kernels_fill_attn_ref(cm_kernels *k) {
    k->attn_f16_step = attn_f16_step;
    k->attn_f16_dot = attn_f16_dot;
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
    k->attn_v[CM_TYPE_Q4_0] = attn_v_q4_0;
    k->attn_qk[CM_TYPE_F32] = attn_qk_f32;
    k->attn_qk[CM_TYPE_F16] = attn_qk_f16;
    k->attn_qk[CM_TYPE_Q8_0] = attn_qk_q8_0;
    k->attn_qk[CM_TYPE_Q4_0] = attn_qk_q4_0;
    k->attn_vm[CM_TYPE_F32] = attn_vm_f32;
    k->attn_vm[CM_TYPE_F16] = attn_vm_f16;
    k->attn_vm[CM_TYPE_Q8_0] = attn_vm_q8_0;
    k->attn_vm[CM_TYPE_Q4_0] = attn_vm_q4_0;
    k->attn_exp = attn_exp;
}
