/*
 * quants_ref.c: the scalar reference (the spec) for dequantizing every type
 * and for converting activations into the types dot products consume, plus
 * the reference table. Pure functions over caller buffers: no allocation,
 * no state. Callers pass n as a multiple of the type's block size.
 *
 * Dequantizers evaluate exactly ggml's expressions (same operand order, e.g.
 * Q6_K is (d * scale) * q), so a dequantized embedding row is bit-identical
 * to llama.cpp's.
 *
 * Activation converters reproduce what llama.cpp computes on x86-64 (the
 * machines our references come from), which is NOT always ggml's *_ref:
 * - Q8_0, Q8_1: ggml-cpu/arch/x86/quants.c (AVX/AVX2 path) takes
 *   d = amax / 127 and multiplies by id = 127 / amax (the _ref multiplies by
 *   1 / d, which can differ in the last bit), then rounds with
 *   _mm256_round_ps(_MM_ROUND_NEAREST), i.e. ties to even (the _ref uses
 *   roundf, ties away from zero). Q8_1's s is fp16(d * sum(q)) as there.
 *   We follow the x86 path: one different rounding flips a q by 1 and the
 *   logits move by ~1e-6, enough to flip a greedy tie on random models.
 * - Q8_K: x86 has no SIMD version; it calls quantize_row_q8_K_ref: scale
 *   -127 / (the signed value of largest magnitude), ggml's nearest_int
 *   (ties to even), clamp at 127, d = 1 / scale, bsums over 16-element groups.
 * - F16: F16C's _mm256_cvtps_ph(x, 0), round to nearest even = cm_f32_to_f16.
 * - BF16: round to nearest even, NaN kept quiet (ggml's scalar conversion).
 *   NEEDSWORK: llama.cpp's AVX512-BF16 build converts whole 32-element runs
 *   with vcvtne2ps2bf16, which flushes subnormal inputs (|x| < 2^-126) to
 *   zero; activations that small do not occur in practice, so we do not.
 */
#include "isa.h"

#include <math.h>

/* clang contracts a*b+c into fma by default; ggml's reference numbers are
 * plain multiply-then-add (GCC in ISO C mode does not contract). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- dequantizers ---- */

void cm_ref_to_float_f32(const void *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

void cm_ref_to_float_f16(const void *x, float *y, int64_t n) {
    const cm_f16 *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = cm_f16_to_f32(h[i]);
}

void cm_ref_to_float_bf16(const void *x, float *y, int64_t n) {
    const cm_bf16 *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = cm_bf16_to_f32(h[i]);
}

void cm_ref_to_float_q4_0(const void *vx, float *y, int64_t n) {
    const cm_block_q4_0 *x = vx;
    for (int64_t b = 0; b < n / CM_QK4_0; b++, y += CM_QK4_0) {
        const float d = cm_f16_to_f32(x[b].d);
        for (int j = 0; j < CM_QK4_0 / 2; j++) {
            y[j] = ((x[b].qs[j] & 0xF) - 8) * d;
            y[j + CM_QK4_0 / 2] = ((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

void cm_ref_to_float_q4_1(const void *vx, float *y, int64_t n) {
    const cm_block_q4_1 *x = vx;
    for (int64_t b = 0; b < n / CM_QK4_1; b++, y += CM_QK4_1) {
        const float d = cm_f16_to_f32(x[b].d), m = cm_f16_to_f32(x[b].m);
        for (int j = 0; j < CM_QK4_1 / 2; j++) {
            y[j] = (x[b].qs[j] & 0xF) * d + m;
            y[j + CM_QK4_1 / 2] = (x[b].qs[j] >> 4) * d + m;
        }
    }
}

/* Q5 blocks keep the 5th bit of element j in bit j of the 32-bit qh. */
static inline uint32_t rd_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
}

void cm_ref_to_float_q5_0(const void *vx, float *y, int64_t n) {
    const cm_block_q5_0 *x = vx;
    for (int64_t b = 0; b < n / CM_QK5_0; b++, y += CM_QK5_0) {
        const float d = cm_f16_to_f32(x[b].d);
        const uint32_t qh = rd_qh(x[b].qh);
        for (int j = 0; j < CM_QK5_0 / 2; j++) {
            const int lo = (x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int hi = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (lo - 16) * d;
            y[j + CM_QK5_0 / 2] = (hi - 16) * d;
        }
    }
}

void cm_ref_to_float_q5_1(const void *vx, float *y, int64_t n) {
    const cm_block_q5_1 *x = vx;
    for (int64_t b = 0; b < n / CM_QK5_1; b++, y += CM_QK5_1) {
        const float d = cm_f16_to_f32(x[b].d), m = cm_f16_to_f32(x[b].m);
        const uint32_t qh = rd_qh(x[b].qh);
        for (int j = 0; j < CM_QK5_1 / 2; j++) {
            const int lo = (x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int hi = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = lo * d + m;
            y[j + CM_QK5_1 / 2] = hi * d + m;
        }
    }
}

void cm_ref_to_float_q8_0(const void *vx, float *y, int64_t n) {
    const cm_block_q8_0 *x = vx;
    for (int64_t b = 0; b < n / CM_QK8_0; b++, y += CM_QK8_0) {
        const float d = cm_f16_to_f32(x[b].d);
        for (int j = 0; j < CM_QK8_0; j++) y[j] = x[b].qs[j] * d;
    }
}

void cm_ref_to_float_q8_1(const void *vx, float *y, int64_t n) {
    const cm_block_q8_1 *x = vx;
    for (int64_t b = 0; b < n / CM_QK8_1; b++, y += CM_QK8_1) {
        const float d = cm_f16_to_f32(x[b].d);
        for (int j = 0; j < CM_QK8_1; j++) y[j] = x[b].qs[j] * d;
    }
}

/* Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins; element values
 * d*sc*q - dmin*m. Bytes qs[32k..32k+31] hold sub-block 2k in their low
 * nibbles and sub-block 2k+1 in their high nibbles. */
void cm_ref_to_float_q4_k(const void *vx, float *y, int64_t n) {
    const cm_block_q4_k *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d), dmin = cm_f16_to_f32(x[b].dmin);
        const uint8_t *q = x[b].qs;
        for (int s = 0; s < 8; s += 2, q += 32) {
            uint8_t sc, m;
            cm_k4_scale_min(s, x[b].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            cm_k4_scale_min(s + 1, x[b].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* Q5_K: Q4_K plus a 5th bit: element l of sub-block s has it in bit s of qh[l]. */
void cm_ref_to_float_q5_k(const void *vx, float *y, int64_t n) {
    const cm_block_q5_k *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d), dmin = cm_f16_to_f32(x[b].dmin);
        const uint8_t *ql = x[b].qs, *qh = x[b].qh;
        for (int s = 0; s < 8; s += 2, ql += 32) {
            uint8_t sc, m;
            cm_k4_scale_min(s, x[b].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            cm_k4_scale_min(s + 1, x[b].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + ((qh[l] >> s) & 1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + ((qh[l] >> (s + 1)) & 1 ? 16 : 0)) - m2;
        }
    }
}

/* Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; 6-bit values offset by
 * 32. Each half (128 elements) keeps 64 bytes of low nibbles and 32 bytes of
 * 2-bit high parts: element l + 32*k of the half takes its low nibble from
 * ql[l + 32*(k&1)] (low nibble for k < 2, high for k >= 2) and its high bits
 * from bits 2k..2k+1 of qh[l]. */
void cm_ref_to_float_q6_k(const void *vx, float *y, int64_t n) {
    const cm_block_q6_k *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales;
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

void cm_ref_to_float_q8_k(const void *vx, float *y, int64_t n) {
    const cm_block_q8_k *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++, y += CM_QK_K)
        for (int j = 0; j < CM_QK_K; j++) y[j] = x[b].d * x[b].qs[j];
}

/* ---- activation converters (see the file comment for whose arithmetic) ---- */

void cm_ref_from_float_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

void cm_ref_from_float_f16(const float *x, void *vy, int64_t n) {
    cm_f16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = cm_f32_to_f16(x[i]);
}

void cm_ref_from_float_bf16(const float *x, void *vy, int64_t n) {
    cm_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = cm_f32_to_bf16(x[i]);
}

/* One 32-element block the way llama.cpp's AVX path does it; returns d and
 * the sum of the quants (for Q8_1). rintf rounds ties to even in the default
 * rounding mode, as _mm256_round_ps(_MM_ROUND_NEAREST) does. */
static float q8_block_x86(const float *x, int8_t *q, int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        const int v = (int)rintf(x[j] * id);
        q[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v); /* packs saturate */
        s += q[j];
    }
    *sum = s;
    return d;
}

void cm_ref_from_float_q8_0(const float *x, void *vy, int64_t n) {
    cm_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / CM_QK8_0; b++, x += CM_QK8_0) {
        int sum;
        y[b].d = cm_f32_to_f16(q8_block_x86(x, y[b].qs, &sum));
    }
}

void cm_ref_from_float_q8_1(const float *x, void *vy, int64_t n) {
    cm_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / CM_QK8_1; b++, x += CM_QK8_1) {
        int sum;
        const float d = q8_block_x86(x, y[b].qs, &sum);
        y[b].d = cm_f32_to_f16(d);
        y[b].s = cm_f32_to_f16(d * (float)sum);
    }
}

void cm_ref_from_float_q8_k(const float *x, void *vy, int64_t n) {
    cm_block_q8_k *y = vy;
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        float max = 0, amax = 0; /* the signed value of largest magnitude, first wins */
        for (int j = 0; j < CM_QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < CM_QK_K; j++) {
            const int v = cm_nearest_int(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < CM_QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[b].qs[16 * g + j];
            y[b].bsums[g] = (int16_t)s;
        }
        y[b].d = 1 / iscale;
    }
}

/* ---- the table ---- */

void cm_kernels_fill_ref(cm_kernels *k) {
    memset(k, 0, sizeof *k);
    k->name = "scalar";
#define TO(T, t) k->to_float[CM_TYPE_##T] = cm_ref_to_float_##t
    TO(F32, f32);
    TO(F16, f16);
    TO(BF16, bf16);
    TO(Q4_0, q4_0);
    TO(Q4_1, q4_1);
    TO(Q5_0, q5_0);
    TO(Q5_1, q5_1);
    TO(Q8_0, q8_0);
    TO(Q8_1, q8_1);
    TO(Q4_K, q4_k);
    TO(Q5_K, q5_k);
    TO(Q6_K, q6_k);
    TO(Q8_K, q8_k);
#undef TO
#define FROM(T, t) k->from_float[CM_TYPE_##T] = cm_ref_from_float_##t
    FROM(F32, f32);
    FROM(F16, f16);
    FROM(BF16, bf16);
    FROM(Q8_0, q8_0);
    FROM(Q8_1, q8_1);
    FROM(Q8_K, q8_k);
#undef FROM
#define DOT(T, t) k->vec_dot[CM_TYPE_##T] = cm_ref_vec_dot_##t
    DOT(F32, f32);
    DOT(F16, f16);
    DOT(BF16, bf16);
    DOT(Q4_0, q4_0);
    DOT(Q4_1, q4_1);
    DOT(Q5_0, q5_0);
    DOT(Q5_1, q5_1);
    DOT(Q8_0, q8_0);
    DOT(Q4_K, q4_k);
    DOT(Q5_K, q5_k);
    DOT(Q6_K, q6_k);
#undef DOT
    cm_kernels_fill_lowbit_ref(k);
}
