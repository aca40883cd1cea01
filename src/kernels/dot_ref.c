/*
 * dot_ref.c: the scalar reference (the spec) for every weight type's dot
 * product with activations in its vec_dot_type. No allocation, no state.
 *
 * The integer part is ggml's exactly: per block, int8 x int8 products summed
 * in int32 (for K-quants: per sub-block sums weighted by the integer scales,
 * and the min correction taken from Q8_K's bsums), then one float scale per
 * block. Only the float accumulation across blocks differs from llama.cpp's
 * SIMD paths (they keep 8 or 16 partial sums), which moves results by a few
 * ulps, far below anything a logit comparison can see.
 * F32/F16/BF16 products are exact in float (F16 x F16 and BF16 x BF16 fit a
 * float mantissa); we sum them in double, so our sum is at least as close to
 * the exact one as ggml's float lanes.
 */
#include "isa.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

void cm_ref_vec_dot_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * (double)y[i];
    *s = (float)sum;
}

void cm_ref_vec_dot_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_f16 *x = vx, *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(cm_f16_to_f32(x[i]) * cm_f16_to_f32(y[i]));
    *s = (float)sum;
}

void cm_ref_vec_dot_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_bf16 *x = vx, *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(cm_bf16_to_f32(x[i]) * cm_bf16_to_f32(y[i]));
    *s = (float)sum;
}

void cm_ref_vec_dot_q4_0(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q4_0 *x = vx;
    const cm_block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK4_0; b++) {
        int sumi = 0;
        for (int j = 0; j < CM_QK4_0 / 2; j++) {
            sumi += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
            sumi += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + CM_QK4_0 / 2];
        }
        sumf += sumi * (cm_f16_to_f32(x[b].d) * cm_f16_to_f32(y[b].d));
    }
    *s = sumf;
}

/* Q4_1/Q5_1 x Q8_1: sum_j (d_x q_j + m)(d_y p_j) = d_x d_y sum q p + m * (d_y sum p),
 * and Q8_1 stores d_y * sum p as s. */
static inline uint32_t rd_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
}

/* q5_0 and q5_1 in llama.cpp's x86 order, which is also x86_tiles.h's
 * TILE32_CHAIN (so the scalar, AVX2 and AVX-512 builds give one set of
 * bits): 8 lanes, lane k summing elements 4k..4k+3 of each block exactly,
 * times the block's float scale into one FMA chain per lane, blocks in
 * order; then the lanes folded as hsum8 does. q5_1's min terms form their
 * own chain, added last. */
static float fold8(const float a[8]) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

/* q4_1 in the order of x86_tiles.h's TILE32, the x86 tables' (so the
 * scalar, AVX2 and AVX-512 tables give one set of bits): lanes as above,
 * even blocks into one FMA chain per lane and odd blocks into another, the
 * min terms likewise in two chains; the two lane sets added, folded as
 * hsum8 does, plus the two min chains' sum. (Summing each block whole into
 * one float chain, as before, parted CUMULO_ISA=scalar from llama.cpp at a
 * near tie in test_synth_golden's gemma3-q4_1: 5.5e-3 at case 1 positions
 * 6-7 that no single rounding flip explains. llama.cpp's own x86 order,
 * TILE32_CHAIN, is what q5_0/q5_1 use; on q4_1 it was reverted from the x86
 * tables, 873c918, since real_models' SmolLM2 Q4_1 then failed.) */
void cm_ref_vec_dot_q4_1(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q4_1 *x = vx;
    const cm_block_q8_1 *y = vy;
    float acc[2][8] = {{0}}, m[2] = {0};
    for (int64_t b = 0; b < n / CM_QK4_1; b++) {
        int lane[8] = {0};
        for (int j = 0; j < CM_QK4_1 / 2; j++) {
            lane[j / 4] += (x[b].qs[j] & 0xF) * y[b].qs[j];
            lane[(j + CM_QK4_1 / 2) / 4] += (x[b].qs[j] >> 4) * y[b].qs[j + CM_QK4_1 / 2];
        }
        const float d = cm_f16_to_f32(x[b].d) * cm_f16_to_f32(y[b].d);
        for (int k = 0; k < 8; k++) acc[b & 1][k] = fmaf((float)lane[k], d, acc[b & 1][k]);
        m[b & 1] += cm_f16_to_f32(x[b].m) * cm_f16_to_f32(y[b].s);
    }
    float a[8];
    for (int k = 0; k < 8; k++) a[k] = acc[0][k] + acc[1][k];
    *s = fold8(a) + (m[0] + m[1]);
}

void cm_ref_vec_dot_q5_0(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q5_0 *x = vx;
    const cm_block_q8_0 *y = vy;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / CM_QK5_0; b++) {
        const uint32_t qh = rd_qh(x[b].qh);
        int lane[8] = {0};
        for (int j = 0; j < CM_QK5_0 / 2; j++) {
            const int lo = ((x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16;
            const int hi = ((x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            lane[j / 4] += lo * y[b].qs[j];
            lane[(j + CM_QK5_0 / 2) / 4] += hi * y[b].qs[j + CM_QK5_0 / 2];
        }
        const float d = cm_f16_to_f32(x[b].d) * cm_f16_to_f32(y[b].d);
        for (int k = 0; k < 8; k++) acc[k] = fmaf((float)lane[k], d, acc[k]);
    }
    *s = fold8(acc);
}

void cm_ref_vec_dot_q5_1(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q5_1 *x = vx;
    const cm_block_q8_1 *y = vy;
    float acc[8] = {0}, m = 0;
    for (int64_t b = 0; b < n / CM_QK5_1; b++) {
        const uint32_t qh = rd_qh(x[b].qh);
        int lane[8] = {0};
        for (int j = 0; j < CM_QK5_1 / 2; j++) {
            const int lo = (x[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int hi = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            lane[j / 4] += lo * y[b].qs[j];
            lane[(j + CM_QK5_1 / 2) / 4] += hi * y[b].qs[j + CM_QK5_1 / 2];
        }
        const float d = cm_f16_to_f32(x[b].d) * cm_f16_to_f32(y[b].d);
        for (int k = 0; k < 8; k++) acc[k] = fmaf((float)lane[k], d, acc[k]);
        m += cm_f16_to_f32(x[b].m) * cm_f16_to_f32(y[b].s);
    }
    *s = fold8(acc) + m;
}

void cm_ref_vec_dot_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q8_0 *x = vx;
    const cm_block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < CM_QK8_0; j++) sumi += x[b].qs[j] * y[b].qs[j];
        sumf += sumi * (cm_f16_to_f32(x[b].d) * cm_f16_to_f32(y[b].d));
    }
    *s = sumf;
}

/* Q4_K/Q5_K x Q8_K: element = d*sc_s*q - dmin*m_s, so per super-block
 *   dot = d*dy * sum_s sc_s * (sum_{l in s} q_l p_l) - dmin*dy * sum_s m_s * (sum_{l in s} p_l)
 * where the second sum comes from bsums (two 16-element groups per sub-block). */
static inline int k4_min_correction(const uint8_t *scales, const int16_t *bsums) {
    int summ = 0;
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        cm_k4_scale_min(s, scales, &sc, &m);
        summ += m * (bsums[2 * s] + bsums[2 * s + 1]);
    }
    return summ;
}

void cm_ref_vec_dot_q4_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q4_k *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *q = x[b].qs;
        const int8_t *p = y[b].qs;
        int sumi = 0;
        for (int s2 = 0; s2 < 8; s2 += 2, q += 32, p += 64) {
            uint8_t sc1, sc2, m;
            cm_k4_scale_min(s2, x[b].scales, &sc1, &m);
            cm_k4_scale_min(s2 + 1, x[b].scales, &sc2, &m);
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += (q[l] & 0xF) * p[l];
                hi += (q[l] >> 4) * p[l + 32];
            }
            sumi += sc1 * lo + sc2 * hi;
        }
        const int summ = k4_min_correction(x[b].scales, y[b].bsums);
        const float d = cm_f16_to_f32(x[b].d) * y[b].d;
        const float dmin = cm_f16_to_f32(x[b].dmin) * y[b].d;
        sumf += d * sumi - dmin * summ;
    }
    *s = sumf;
}

void cm_ref_vec_dot_q5_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q5_k *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *ql = x[b].qs, *qh = x[b].qh;
        const int8_t *p = y[b].qs;
        int sumi = 0;
        for (int s2 = 0; s2 < 8; s2 += 2, ql += 32, p += 64) {
            uint8_t sc1, sc2, m;
            cm_k4_scale_min(s2, x[b].scales, &sc1, &m);
            cm_k4_scale_min(s2 + 1, x[b].scales, &sc2, &m);
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += ((ql[l] & 0xF) | (((qh[l] >> s2) & 1) << 4)) * p[l];
                hi += ((ql[l] >> 4) | (((qh[l] >> (s2 + 1)) & 1) << 4)) * p[l + 32];
            }
            sumi += sc1 * lo + sc2 * hi;
        }
        const int summ = k4_min_correction(x[b].scales, y[b].bsums);
        const float d = cm_f16_to_f32(x[b].d) * y[b].d;
        const float dmin = cm_f16_to_f32(x[b].dmin) * y[b].d;
        sumf += d * sumi - dmin * summ;
    }
    *s = sumf;
}

/* Q6_K x Q8_K: sum over 16 sub-blocks of scale_s * sum (q - 32) * p; the
 * element layout is the one cm_ref_to_float_q6_k documents. */
void cm_ref_vec_dot_q6_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q6_k *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *p = y[b].qs, *sc = x[b].scales;
        int sumi = 0;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, p += 128, sc += 8) {
            int part[8] = {0}; /* per 16-element sub-block of this half */
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                part[is + 0] += q1 * p[l];
                part[is + 2] += q2 * p[l + 32];
                part[is + 4] += q3 * p[l + 64];
                part[is + 6] += q4 * p[l + 96];
            }
            for (int k = 0; k < 8; k++) sumi += sc[k] * part[k];
        }
        sumf += (cm_f16_to_f32(x[b].d) * y[b].d) * sumi;
    }
    *s = sumf;
}
