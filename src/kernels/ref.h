/*
 * ref.h: private declarations of the scalar reference kernels, so that ISA
 * files can fall back to them (tails, rarely used types) and tests can name
 * them. Not part of the kernels API. Also the two integer helpers every
 * K-quant routine shares, as ggml defines them.
 */
#ifndef CM_KERNELS_REF_H
#define CM_KERNELS_REF_H

#include "kernels.h"

#include <string.h>

/* Round to nearest, ties to even, for |f| <= 2^22: adding 1.5 * 2^23 leaves
 * the integer in the low mantissa bits. This is ggml's nearest_int; K-quant
 * files and Q8_K activations depend on its exact tie-breaking. */
static inline int cm_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block:
 * sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scale) and 4-7
 * (min); sub-blocks 4-7 keep the low 4 bits in bytes 8-11 and the top 2 bits
 * in the spare high bits of bytes 0-3 (scale) and 4-7 (min). */
static inline void cm_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All 8 at once, 4 bytes per step (what cm_k4_scale_min gives for j = 0..7):
 * sc[j] and mn[j]. The one copy the ISA files' tiles and gemms share. */
static inline void cm_k4_scales8(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t a, b, c, w[4];
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    w[0] = a & 0x3f3f3f3f;                                           /* sc 0..3 */
    w[1] = (c & 0x0f0f0f0f) | (((a >> 6) & 0x03030303) << 4);        /* sc 4..7 */
    w[2] = b & 0x3f3f3f3f;                                           /* mn 0..3 */
    w[3] = ((c >> 4) & 0x0f0f0f0f) | (((b >> 6) & 0x03030303) << 4); /* mn 4..7 */
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

/* Dequantizers (cm_to_float_fn). */
void cm_ref_to_float_f32(const void *x, float *y, int64_t n);
void cm_ref_to_float_f16(const void *x, float *y, int64_t n);
void cm_ref_to_float_bf16(const void *x, float *y, int64_t n);
void cm_ref_to_float_q4_0(const void *x, float *y, int64_t n);
void cm_ref_to_float_q4_1(const void *x, float *y, int64_t n);
void cm_ref_to_float_q5_0(const void *x, float *y, int64_t n);
void cm_ref_to_float_q5_1(const void *x, float *y, int64_t n);
void cm_ref_to_float_q8_0(const void *x, float *y, int64_t n);
void cm_ref_to_float_q8_1(const void *x, float *y, int64_t n);
void cm_ref_to_float_q4_k(const void *x, float *y, int64_t n);
void cm_ref_to_float_q5_k(const void *x, float *y, int64_t n);
void cm_ref_to_float_q6_k(const void *x, float *y, int64_t n);
void cm_ref_to_float_q8_k(const void *x, float *y, int64_t n);

/* Activation converters (cm_from_float_fn): llama.cpp's x86 arithmetic. */
void cm_ref_from_float_f32(const float *x, void *y, int64_t n);
void cm_ref_from_float_f16(const float *x, void *y, int64_t n);
void cm_ref_from_float_bf16(const float *x, void *y, int64_t n);
void cm_ref_from_float_q8_0(const float *x, void *y, int64_t n);
void cm_ref_from_float_q8_1(const float *x, void *y, int64_t n);
void cm_ref_from_float_q8_k(const float *x, void *y, int64_t n);

/* Dot products (cm_vec_dot_fn): x in the weight type, y in its vec_dot_type. */
void cm_ref_vec_dot_f32(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_f16(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_bf16(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q4_0(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q4_1(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q5_0(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q5_1(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q8_0(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q4_k(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q5_k(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q6_k(int64_t n, float *s, const void *x, const void *y);

/* The low-bit types (quants_lowbit.c): dequantizers and dot products. */
void cm_ref_to_float_q2_k(const void *x, float *y, int64_t n);
void cm_ref_to_float_q3_k(const void *x, float *y, int64_t n);
void cm_ref_to_float_iq4_nl(const void *x, float *y, int64_t n);
void cm_ref_to_float_iq4_xs(const void *x, float *y, int64_t n);
void cm_ref_to_float_mxfp4(const void *x, float *y, int64_t n);
void cm_ref_vec_dot_q2_k(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_q3_k(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_iq4_nl(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_iq4_xs(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_mxfp4(int64_t n, float *s, const void *x, const void *y);
/* The 16 signed scales (stored value - 32) of a Q3_K block's 12 scale bytes:
 * low nibbles in bytes 0-7 (sub-blocks 0-7 low, 8-15 high nibble), top 2
 * bits at bits 2(j/4).. of byte 8 + j%4. */
static inline void cm_q3_k_scales(const uint8_t sc[12], int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int low = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
        const int top = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((low | (top << 4)) - 32);
    }
}
/* Registers the entries above in a table (called by cm_kernels_fill_ref). */
void cm_kernels_fill_lowbit_ref(cm_kernels *k);

/* The IQ formats (quants_iq.c, grids in iq_grids.c: entry i holds point i's
 * byte values, element j in bits 8j..8j+7). */
extern const uint64_t cm_iq2xxs_grid[256];
extern const uint32_t cm_iq3xxs_grid[256];
extern const uint64_t cm_iq1s_grid[2048];
/* ggml's ksigns_iq2xs: 7 sign bits and their parity as the 8th. */
static inline uint8_t cm_iq_signs(unsigned i7) {
    unsigned p = i7 ^ (i7 >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return (uint8_t)(i7 | ((p & 1u) << 7));
}
void cm_ref_to_float_iq2_xxs(const void *x, float *y, int64_t n);
void cm_ref_to_float_iq3_xxs(const void *x, float *y, int64_t n);
void cm_ref_to_float_iq1_s(const void *x, float *y, int64_t n);
void cm_ref_vec_dot_iq2_xxs(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_iq3_xxs(int64_t n, float *s, const void *x, const void *y);
void cm_ref_vec_dot_iq1_s(int64_t n, float *s, const void *x, const void *y);
void cm_kernels_fill_iq_ref(cm_kernels *k); /* registers the three above */

/* Weight quantizers shared by quantize.c and quantize_lowbit.c. */
/* ggml's make_qkx2_quants: x ~ scale * L + min, L in 0..nmax, min <= 0, weighted
 * squared (or, use_mad, absolute) error; returns scale, stores -min. */
float cm_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, float rmin,
                       float rdelta, int nstep, bool use_mad);
/* Rows of the low-bit types (quantize_lowbit.c); NULL for other types. */
typedef void (*cm_quantize_row_fn)(const float *x, void *y, int64_t n);
cm_quantize_row_fn cm_quantize_row_lowbit(enum cm_type t);

#endif
