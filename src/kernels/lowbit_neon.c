/*
 * lowbit_neon.c: NEON (ARMv8.2 dotprod) dot products of the low-bit weight
 * types (Q2_K, Q3_K, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ1_S against Q8_K; IQ4_NL,
 * MXFP4 against Q8_0). Grid entries are read in the host's (little-endian)
 * byte order, as on every arm64 we build for.
 *
 * Compiled with the NEON flags only and registered by dispatch.c into the
 * neon table (cm_kernels_fill_lowbit_neon). Same contract as lowbit_avx2.c:
 * the super-block types compute the reference's integer sum exactly and its
 * float expression in its order (bit-identical to quants_lowbit.c); the
 * 32-element types keep four float lanes across blocks. gemm runs vec_dot per
 * (row, token), so batch invariance holds by construction. Never allocates.
 */
#include "isa.h"

#include <arm_neon.h>

/* 16 packed nibbles -> table values of elements 0..15 (lo) and 16..31 (hi). */
static inline void nibbles_to_values(const uint8_t *qs, int8x16_t table, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t q = vld1q_u8(qs);
    *lo = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0F)));
    *hi = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
}

/* 2-bit field at bit `shift` of each byte (shift = 0, 2, 4, 6). */
static inline uint8x16_t field2(uint8x16_t q, int shift) {
    return vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)-shift)), vdupq_n_u8(3));
}

/* acc + d x (the table values of qs's 32 nibbles . the 32 int8s at yq): one
 * IQ4_NL or MXFP4 block against its Q8_0 block. */
static inline float32x4_t dot_nl32(float32x4_t acc, const uint8_t *qs, int8x16_t table, const int8_t *yq, float d) {
    int8x16_t lo, hi;
    nibbles_to_values(qs, table, &lo, &hi);
    int32x4_t p = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(yq));
    p = vdotq_s32(p, hi, vld1q_s8(yq + 16));
    return vfmaq_n_f32(acc, vcvtq_f32_s32(p), d);
}

static void vec_dot_iq4_nl(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq4_nl *x = vx;
    const cm_block_q8_0 *y = vy;
    const int8x16_t table = vld1q_s8(cm_kvalues_iq4nl);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t b = 0; b < n / CM_QK4_NL; b++) {
        acc = dot_nl32(acc, x[b].qs, table, y[b].qs, cm_f16_to_f32(y[b].d) * cm_f16_to_f32(x[b].d));
    }
    *s = vaddvq_f32(acc);
}

static void vec_dot_mxfp4(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_mxfp4 *x = vx;
    const cm_block_q8_0 *y = vy;
    const int8x16_t table = vld1q_s8(cm_kvalues_mxfp4);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t b = 0; b < n / CM_QK_MXFP4; b++) {
        acc = dot_nl32(acc, x[b].qs, table, y[b].qs, cm_f16_to_f32(y[b].d) * cm_e8m0_to_f32_half(x[b].e));
    }
    *s = vaddvq_f32(acc);
}

static void vec_dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq4_xs *x = vx;
    const cm_block_q8_k *y = vy;
    const int8x16_t table = vld1q_s8(cm_kvalues_iq4nl);
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        int32x4_t acc = vdupq_n_s32(0);
        for (int i = 0; i < 8; i++) {
            const int ls =
                (((x[b].scales_l[i / 2] >> (4 * (i % 2))) & 0xF) | (((x[b].scales_h >> (2 * i)) & 3) << 4)) - 32;
            int8x16_t lo, hi;
            nibbles_to_values(x[b].qs + 16 * i, table, &lo, &hi);
            int32x4_t p = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(y[b].qs + 32 * i));
            p = vdotq_s32(p, hi, vld1q_s8(y[b].qs + 32 * i + 16));
            acc = vmlaq_n_s32(acc, p, ls);
        }
        sumf += (cm_f16_to_f32(x[b].d) * y[b].d) * vaddvq_s32(acc);
    }
    *s = sumf;
}

static void vec_dot_q2_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q2_k *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *sc = x[b].scales;
        int summ = 0;
        for (int j = 0; j < 16; j++) summ += y[b].bsums[j] * (sc[j] >> 4);
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(x[b].qs + 32 * h), q1 = vld1q_u8(x[b].qs + 32 * h + 16);
            for (int k = 0; k < 4; k++) {
                const int8_t *p = y[b].qs + 128 * h + 32 * k;
                const int is = 8 * h + 2 * k;
                const int32x4_t d0 = vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(field2(q0, 2 * k)), vld1q_s8(p));
                const int32x4_t d1 =
                    vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(field2(q1, 2 * k)), vld1q_s8(p + 16));
                acc = vmlaq_n_s32(acc, d0, sc[is] & 0xF);
                acc = vmlaq_n_s32(acc, d1, sc[is + 1] & 0xF);
            }
        }
        const float dall = y[b].d * cm_f16_to_f32(x[b].d);
        const float dmin = y[b].d * cm_f16_to_f32(x[b].dmin);
        sumf += dall * vaddvq_s32(acc) - dmin * summ;
    }
    *s = sumf;
}

static void vec_dot_q3_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q3_k *x = vx;
    const cm_block_q8_k *y = vy;
    const uint8x16_t one = vdupq_n_u8(1);
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        int8_t sc[16];
        cm_q3_k_scales(x[b].scales, sc);
        const uint8x16_t hm0 = vld1q_u8(x[b].hmask), hm1 = vld1q_u8(x[b].hmask + 16);
        int32x4_t acc = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(x[b].qs + 32 * h), q1 = vld1q_u8(x[b].qs + 32 * h + 16);
            for (int k = 0; k < 4; k++) {
                const int8x16_t sh = vdupq_n_s8((int8_t) - (4 * h + k));
                /* value = low - 4 where the high bit is clear (mod 256: -4..3 as int8) */
                const uint8x16_t c0 = vshlq_n_u8(veorq_u8(vandq_u8(vshlq_u8(hm0, sh), one), one), 2);
                const uint8x16_t c1 = vshlq_n_u8(veorq_u8(vandq_u8(vshlq_u8(hm1, sh), one), one), 2);
                const int8x16_t v0 = vreinterpretq_s8_u8(vsubq_u8(field2(q0, 2 * k), c0));
                const int8x16_t v1 = vreinterpretq_s8_u8(vsubq_u8(field2(q1, 2 * k), c1));
                const int8_t *p = y[b].qs + 128 * h + 32 * k;
                const int is = 8 * h + 2 * k;
                acc = vmlaq_n_s32(acc, vdotq_s32(vdupq_n_s32(0), v0, vld1q_s8(p)), sc[is]);
                acc = vmlaq_n_s32(acc, vdotq_s32(vdupq_n_s32(0), v1, vld1q_s8(p + 16)), sc[is + 1]);
            }
        }
        sumf += (cm_f16_to_f32(x[b].d) * y[b].d) * vaddvq_s32(acc);
    }
    *s = sumf;
}

/* ---- grid types against Q8_K ---- */

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* y (16 bytes) with the sign flipped where bit j % 8 of s_lo (j < 8) or s_hi is set. */
static inline int8x16_t apply_signs(int8x16_t y, uint8_t s_lo, uint8_t s_hi) {
    static const uint8_t kbits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vtstq_u8(vcombine_u8(vdup_n_u8(s_lo), vdup_n_u8(s_hi)), vld1q_u8(kbits));
    const int8x16_t ms = vreinterpretq_s8_u8(m);
    return vsubq_s8(veorq_s8(y, ms), ms);
}

/* One 32-element group: grid bytes g0 (elements 0..15), g1 (16..31), the
 * 28 sign bits of aux; returns the int32 lanes of sum g * (+-y). */
static inline int32x4_t iq_group(int8x16_t g0, int8x16_t g1, uint32_t aux, const int8_t *p) {
    const int8x16_t y0 = apply_signs(vld1q_s8(p), cm_iq_signs(aux & 127), cm_iq_signs((aux >> 7) & 127));
    const int8x16_t y1 = apply_signs(vld1q_s8(p + 16), cm_iq_signs((aux >> 14) & 127), cm_iq_signs((aux >> 21) & 127));
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), g0, y0), g1, y1);
}

static inline int8x16_t grid64x2(uint64_t a, uint64_t b) {
    return vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(a), vcreate_u64(b)));
}

static void vec_dot_iq2_xxs(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *blk = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0.f;
    for (int64_t b = 0; b < n / CM_QK_K; b++, blk += sizeof(cm_block_iq2_xxs)) {
        const float d = cm_f16_to_f32((cm_f16)(blk[0] | (blk[1] << 8))) * y[b].d;
        int32x4_t acc = vdupq_n_s32(0);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = blk + 2 + 8 * ib;
            const uint32_t aux = rd32(q + 4);
            const int8x16_t g0 = grid64x2(cm_iq2xxs_grid[q[0]], cm_iq2xxs_grid[q[1]]);
            const int8x16_t g1 = grid64x2(cm_iq2xxs_grid[q[2]], cm_iq2xxs_grid[q[3]]);
            acc = vmlaq_n_s32(acc, iq_group(g0, g1, aux, y[b].qs + 32 * ib), (int32_t)(2 * (aux >> 28) + 1));
        }
        sumf += d * vaddvq_s32(acc);
    }
    *s = 0.125f * sumf;
}

static void vec_dot_iq3_xxs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq3_xxs *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0.f;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d) * y[b].d;
        int32x4_t acc = vdupq_n_s32(0);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x[b].qs + 8 * ib;
            const uint32_t aux = rd32(x[b].qs + CM_QK_K / 4 + 4 * ib);
            const uint32_t g[8] = {cm_iq3xxs_grid[q[0]], cm_iq3xxs_grid[q[1]], cm_iq3xxs_grid[q[2]],
                                   cm_iq3xxs_grid[q[3]], cm_iq3xxs_grid[q[4]], cm_iq3xxs_grid[q[5]],
                                   cm_iq3xxs_grid[q[6]], cm_iq3xxs_grid[q[7]]};
            const int8x16_t g0 = vreinterpretq_s8_u32(vld1q_u32(g)), g1 = vreinterpretq_s8_u32(vld1q_u32(g + 4));
            acc = vmlaq_n_s32(acc, iq_group(g0, g1, aux, y[b].qs + 32 * ib), (int32_t)(2 * (aux >> 28) + 1));
        }
        sumf += d * vaddvq_s32(acc);
    }
    *s = 0.25f * sumf;
}

static void vec_dot_iq1_s(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq1_s *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        int32x4_t acc = vdupq_n_s32(0);
        int sumi1 = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = x[b].qh[ib];
            const uint8_t *q = x[b].qs + 4 * ib;
            const int ls = 2 * ((qh >> 12) & 7) + 1;
            const int8x16_t g0 =
                grid64x2(cm_iq1s_grid[q[0] | ((qh & 7) << 8)], cm_iq1s_grid[q[1] | (((qh >> 3) & 7) << 8)]);
            const int8x16_t g1 =
                grid64x2(cm_iq1s_grid[q[2] | (((qh >> 6) & 7) << 8)], cm_iq1s_grid[q[3] | (((qh >> 9) & 7) << 8)]);
            const int8_t *p = y[b].qs + 32 * ib;
            const int32x4_t d = vdotq_s32(vdotq_s32(vdupq_n_s32(0), g0, vld1q_s8(p)), g1, vld1q_s8(p + 16));
            acc = vmlaq_n_s32(acc, d, ls);
            sumi1 += ls * (qh & 0x8000 ? -1 : 1) * (y[b].bsums[2 * ib] + y[b].bsums[2 * ib + 1]);
        }
        sumf += cm_f16_to_f32(x[b].d) * y[b].d * (vaddvq_s32(acc) + 0.125f * sumi1);
    }
    *s = sumf;
}

/* gemm = this file's vec_dot for every (row, token), row-major (isa.h). */
#define ROW_GEMM(T, t) CM_ROW_GEMM(t)
CM_LOWBIT_TYPES(ROW_GEMM)
#undef ROW_GEMM

void cm_kernels_fill_lowbit_neon(cm_kernels *k) {
#define REG(T, t) k->vec_dot[CM_TYPE_##T] = vec_dot_##t, k->gemm[CM_TYPE_##T] = gemm_##t;
    CM_LOWBIT_TYPES(REG)
#undef REG
}
