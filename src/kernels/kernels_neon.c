/*
 * kernels_neon.c: arm64 NEON with dotprod (Apple M-series, Graviton 2+,
 * Cortex-A76 and later) versions of the dot products, activation converters
 * and prefill gemm.
 *
 * Compiled with this ISA's flags only (Makefile: armv8.2-a+dotprod+fp16) and
 * called only when cm_cpu_features_get() reports dotprod and fp16
 * (dispatch.c); a CPU without them runs the scalar reference. It mirrors
 * x86_tiles.h: every quantized kernel is a tile that walks one weight row once
 * and dots each block against T activation rows (T = 1 for vec_dot, up to 4
 * for gemm), with vdotq_s32 for the byte products; the blocking around the
 * tiles is the same code (tiles.h). Integer sums equal the
 * reference's (every int32 lane stays below 2^24, so its conversion to float
 * is exact); only the float accumulation order differs. Activation converters
 * produce the reference's bytes (vcvtnq rounds ties to even like the x86 path
 * the reference follows). Tested against the reference under qemu-aarch64
 * (make neon-test). Never allocates.
 *
 * NEEDSWORK: arm64 CPUs without dotprod (Cortex-A72/A53, Raspberry Pi 4) get
 * the scalar table; a vmull_s8/vpadalq fallback table would serve them.
 * Speed on real Apple/Graviton cores is unmeasured (qemu only checks results).
 */
#include "tiles.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

AI float f16f(cm_f16 h) {
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}
AI int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

/* 16 bytes of nibbles -> elements 0..15 (low) and 16..31 (high). */
AI void nibbles(const uint8_t *q, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(q);
    *lo = vandq_u8(v, vdupq_n_u8(0x0f));
    *hi = vshrq_n_u8(v, 4);
}
/* 32 bits -> 32 bytes (two vectors): 0xff where bit i is set. */
AI void bits32(const uint8_t *p, uint8x16_t *b0, uint8x16_t *b1) {
    static const uint8_t mask[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(mask);
    *b0 = vtstq_u8(vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1])), m);
    *b1 = vtstq_u8(vcombine_u8(vdup_n_u8(p[2]), vdup_n_u8(p[3])), m);
}
#define S8(v) vreinterpretq_s8_u8(v)

/* ---- 32-element block types: BODY(b, acc, m) adds block b for every token ---- */
#define TILE32(NAME, XB, YB, BODY)                                                                      \
    AI void tile_##NAME(int64_t nb, const XB *x, const YB *const *yv, int T, float *out) {              \
        float32x4_t acc0[TMAX], acc1[TMAX];                                                             \
        float m0[TMAX], m1[TMAX];                                                                       \
        for (int t = 0; t < T; t++) {                                                                   \
            acc0[t] = acc1[t] = vdupq_n_f32(0.0f);                                                      \
            m0[t] = m1[t] = 0.0f;                                                                       \
        }                                                                                               \
        int64_t b = 0;                                                                                  \
        for (; b + 1 < nb; b += 2) {                                                                    \
            BODY(b, acc0, m0);                                                                          \
            BODY(b + 1, acc1, m1);                                                                      \
        }                                                                                               \
        if (b < nb) BODY(b, acc0, m0);                                                                  \
        for (int t = 0; t < T; t++) out[t] = vaddvq_f32(vaddq_f32(acc0[t], acc1[t])) + (m0[t] + m1[t]); \
    }

/* acc += float(dot(x0:x1, y)) * scale */
#define DOT_BLOCK(ACC, X0, X1, YQ, SCALE)                                                                          \
    ACC = vfmaq_n_f32(ACC, vcvtq_f32_s32(dot16(dot16(vdupq_n_s32(0), X0, vld1q_s8(YQ)), X1, vld1q_s8((YQ) + 16))), \
                      SCALE)

#define BODY_Q4_0(B, ACC, M)                                                                        \
    do {                                                                                            \
        uint8x16_t lo, hi;                                                                          \
        nibbles(x[B].qs, &lo, &hi);                                                                 \
        const int8x16_t x0 = vsubq_s8(S8(lo), vdupq_n_s8(8)), x1 = vsubq_s8(S8(hi), vdupq_n_s8(8)); \
        const float dx = f16f(x[B].d);                                                              \
        for (int t = 0; t < T; t++) DOT_BLOCK(ACC[t], x0, x1, yv[t][B].qs, dx *f16f(yv[t][B].d));   \
    } while (0)
TILE32(q4_0, cm_block_q4_0, cm_block_q8_0, BODY_Q4_0)

#define BODY_Q4_1(B, ACC, M)                                                      \
    do {                                                                          \
        uint8x16_t lo, hi;                                                        \
        nibbles(x[B].qs, &lo, &hi);                                               \
        const float dx = f16f(x[B].d), mx = f16f(x[B].m);                         \
        for (int t = 0; t < T; t++) {                                             \
            DOT_BLOCK(ACC[t], S8(lo), S8(hi), yv[t][B].qs, dx *f16f(yv[t][B].d)); \
            M[t] += mx * f16f(yv[t][B].s);                                        \
        }                                                                         \
    } while (0)
TILE32(q4_1, cm_block_q4_1, cm_block_q8_1, BODY_Q4_1)

/* q5_0: fifth bit clear means value - 16, i.e. the signed byte 0xf0 | nibble. */
#define BODY_Q5_0(B, ACC, M)                                                                      \
    do {                                                                                          \
        uint8x16_t lo, hi, b0, b1;                                                                \
        nibbles(x[B].qs, &lo, &hi);                                                               \
        bits32(x[B].qh, &b0, &b1);                                                                \
        const int8x16_t x0 = S8(vorrq_u8(lo, vbicq_u8(vdupq_n_u8(0xf0), b0)));                    \
        const int8x16_t x1 = S8(vorrq_u8(hi, vbicq_u8(vdupq_n_u8(0xf0), b1)));                    \
        const float dx = f16f(x[B].d);                                                            \
        for (int t = 0; t < T; t++) DOT_BLOCK(ACC[t], x0, x1, yv[t][B].qs, dx *f16f(yv[t][B].d)); \
    } while (0)
TILE32(q5_0, cm_block_q5_0, cm_block_q8_0, BODY_Q5_0)

#define BODY_Q5_1(B, ACC, M)                                                   \
    do {                                                                       \
        uint8x16_t lo, hi, b0, b1;                                             \
        nibbles(x[B].qs, &lo, &hi);                                            \
        bits32(x[B].qh, &b0, &b1);                                             \
        const int8x16_t x0 = S8(vorrq_u8(lo, vandq_u8(b0, vdupq_n_u8(0x10)))); \
        const int8x16_t x1 = S8(vorrq_u8(hi, vandq_u8(b1, vdupq_n_u8(0x10)))); \
        const float dx = f16f(x[B].d), mx = f16f(x[B].m);                      \
        for (int t = 0; t < T; t++) {                                          \
            DOT_BLOCK(ACC[t], x0, x1, yv[t][B].qs, dx *f16f(yv[t][B].d));      \
            M[t] += mx * f16f(yv[t][B].s);                                     \
        }                                                                      \
    } while (0)
TILE32(q5_1, cm_block_q5_1, cm_block_q8_1, BODY_Q5_1)

#define BODY_Q8_0(B, ACC, M)                                                                      \
    do {                                                                                          \
        const int8x16_t x0 = vld1q_s8(x[B].qs), x1 = vld1q_s8(x[B].qs + 16);                      \
        const float dx = f16f(x[B].d);                                                            \
        for (int t = 0; t < T; t++) DOT_BLOCK(ACC[t], x0, x1, yv[t][B].qs, dx *f16f(yv[t][B].d)); \
    } while (0)
TILE32(q8_0, cm_block_q8_0, cm_block_q8_0, BODY_Q8_0)

/* ---- K-quants ---- */

/* sum over sub-blocks j of mn[j] * (bsums[2j] + bsums[2j+1]) */
AI int32_t kmins(const uint8_t mn[8], const int16_t *bsums) {
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vaddvq_s32(vaddq_s32(vmull_s16(vget_low_s16(pairs), vget_low_s16(m)), vmull_high_s16(pairs, m)));
}

#define TILE_K45(NAME, XB, HAS_QH)                                                                                    \
    AI void tile_##NAME(int64_t nb, const XB *x, const cm_block_q8_k *const *yv, int T, float *out) {                 \
        float32x4_t acc[TMAX];                                                                                        \
        float accm[TMAX];                                                                                             \
        for (int t = 0; t < T; t++) {                                                                                 \
            acc[t] = vdupq_n_f32(0.0f);                                                                               \
            accm[t] = 0.0f;                                                                                           \
        }                                                                                                             \
        const uint8x16_t m4 = vdupq_n_u8(0x0f), one = vdupq_n_u8(1);                                                  \
        for (int64_t b = 0; b < nb; b++) {                                                                            \
            uint8_t sc[8], mn[8];                                                                                     \
            cm_k4_scales8(x[b].scales, sc, mn);                                                                       \
            int32x4_t sumi[TMAX];                                                                                     \
            for (int t = 0; t < T; t++) sumi[t] = vdupq_n_s32(0);                                                     \
            uint8x16_t qh0 = one, qh1 = one;                                                                          \
            if (HAS_QH) {                                                                                             \
                const uint8_t *qh = ((const cm_block_q5_k *)(const void *)&x[b])->qh;                                 \
                qh0 = vld1q_u8(qh);                                                                                   \
                qh1 = vld1q_u8(qh + 16);                                                                              \
            }                                                                                                         \
            for (int j = 0; j < 4; j++) {                                                                             \
                const uint8x16_t q0 = vld1q_u8(x[b].qs + 32 * j), q1 = vld1q_u8(x[b].qs + 32 * j + 16);               \
                uint8x16_t l0 = vandq_u8(q0, m4), l1 = vandq_u8(q1, m4);                                              \
                uint8x16_t h0 = vshrq_n_u8(q0, 4), h1 = vshrq_n_u8(q1, 4);                                            \
                if (HAS_QH) {                                                                                         \
                    l0 = vorrq_u8(l0, vshlq_n_u8(vandq_u8(qh0, one), 4));                                             \
                    l1 = vorrq_u8(l1, vshlq_n_u8(vandq_u8(qh1, one), 4));                                             \
                    h0 = vorrq_u8(h0, vshlq_n_u8(vandq_u8(vshrq_n_u8(qh0, 1), one), 4));                              \
                    h1 = vorrq_u8(h1, vshlq_n_u8(vandq_u8(vshrq_n_u8(qh1, 1), one), 4));                              \
                    qh0 = vshrq_n_u8(qh0, 2);                                                                         \
                    qh1 = vshrq_n_u8(qh1, 2);                                                                         \
                }                                                                                                     \
                for (int t = 0; t < T; t++) {                                                                         \
                    const int8_t *y = yv[t][b].qs + 64 * j;                                                           \
                    const int32x4_t pl = dot16(dot16(vdupq_n_s32(0), S8(l0), vld1q_s8(y)), S8(l1), vld1q_s8(y + 16)); \
                    const int32x4_t ph =                                                                              \
                        dot16(dot16(vdupq_n_s32(0), S8(h0), vld1q_s8(y + 32)), S8(h1), vld1q_s8(y + 48));             \
                    sumi[t] = vmlaq_n_s32(vmlaq_n_s32(sumi[t], pl, sc[2 * j]), ph, sc[2 * j + 1]);                    \
                }                                                                                                     \
            }                                                                                                         \
            const float d = f16f(x[b].d), dmin = f16f(x[b].dmin);                                                     \
            for (int t = 0; t < T; t++) {                                                                             \
                acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(sumi[t]), d * yv[t][b].d);                                 \
                accm[t] += dmin * yv[t][b].d * (float)kmins(mn, yv[t][b].bsums);                                      \
            }                                                                                                         \
        }                                                                                                             \
        for (int t = 0; t < T; t++) out[t] = vaddvq_f32(acc[t]) - accm[t];                                            \
    }
TILE_K45(q4_k, cm_block_q4_k, 0)
TILE_K45(q5_k, cm_block_q5_k, 1)

/* q6_k: values (q - 32) in [-32, 31]; two int32 accumulators (chunk 0 and 1)
 * keep every lane below 2^24: 8 groups * 4 * 32 * 127 * 128. */
AI void tile_q6_k(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *const *yv, int T, float *out) {
    float32x4_t acc[TMAX];
    for (int t = 0; t < T; t++) acc[t] = vdupq_n_f32(0.0f);
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x03);
    const int8x16_t k32 = vdupq_n_s8(32);
    for (int64_t b = 0; b < nb; b++) {
        float32x4_t part[TMAX];
        for (int t = 0; t < T; t++) part[t] = vdupq_n_f32(0.0f);
        for (int c = 0; c < 2; c++) {
            int32x4_t sumi[TMAX];
            for (int t = 0; t < T; t++) sumi[t] = vdupq_n_s32(0);
            const uint8_t *ql = x[b].ql + 64 * c, *qh = x[b].qh + 32 * c;
            for (int h = 0; h < 2; h++) { /* 16-byte halves of each 32-element run */
                const uint8x16_t l0 = vld1q_u8(ql + 16 * h), l1 = vld1q_u8(ql + 32 + 16 * h);
                const uint8x16_t hh = vld1q_u8(qh + 16 * h);
                int8x16_t q[4];
                q[0] = vsubq_s8(S8(vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(hh, m3), 4))), k32);
                q[1] = vsubq_s8(S8(vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hh, 2), m3), 4))), k32);
                q[2] = vsubq_s8(S8(vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hh, 4), m3), 4))), k32);
                q[3] = vsubq_s8(S8(vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hh, 6), 4))), k32);
                for (int k = 0; k < 4; k++) {
                    const int s = x[b].scales[8 * c + 2 * k + h];
                    for (int t = 0; t < T; t++) {
                        const int32x4_t p =
                            dot16(vdupq_n_s32(0), q[k], vld1q_s8(yv[t][b].qs + 128 * c + 32 * k + 16 * h));
                        sumi[t] = vmlaq_n_s32(sumi[t], p, s);
                    }
                }
            }
            for (int t = 0; t < T; t++) part[t] = vaddq_f32(part[t], vcvtq_f32_s32(sumi[t]));
        }
        const float d = f16f(x[b].d);
        for (int t = 0; t < T; t++) acc[t] = vfmaq_n_f32(acc[t], part[t], d * yv[t][b].d);
    }
    for (int t = 0; t < T; t++) out[t] = vaddvq_f32(acc[t]);
}

/* ---- float types: 8 elements per step, two accumulators per token ---- */
AI float32x4_t ld_f32(const void *p, int64_t i) { return vld1q_f32((const float *)p + i); }
AI float32x4_t ld_f16(const void *p, int64_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
}
AI float32x4_t ld_bf16(const void *p, int64_t i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
}
/* acc + a * b, and the sum of the lanes of a + b (tiles.h's CM_TILE_FLOAT) */
#define FMA4(acc, a, b) vfmaq_f32(acc, a, b)
#define HSUM4X2(a, b) vaddvq_f32(vaddq_f32(a, b))
CM_TILE_FLOAT(tile_f32, ld_f32, sc_f32, float32x4_t, 4, vdupq_n_f32(0.0f), FMA4, HSUM4X2)
CM_TILE_FLOAT(tile_f16, ld_f16, sc_f16, float32x4_t, 4, vdupq_n_f32(0.0f), FMA4, HSUM4X2)
CM_TILE_FLOAT(tile_bf16, ld_bf16, sc_bf16, float32x4_t, 4, vdupq_n_f32(0.0f), FMA4, HSUM4X2)

/* vec_dot and gemm (tiles.h) */
CM_VEC_DOT_TYPES()

/* ---- activation converters (byte-identical to quants_ref.c) ---- */

/* Round x[0..31] * id to nearest-even int8 into q; returns the sum. */
AI int q8_round32(const float *x, float id, int8_t *q) {
    int32x4_t sum = vdupq_n_s32(0);
    for (int k = 0; k < 32; k += 8) {
        const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + k), id));
        const int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + k + 4), id));
        sum = vaddq_s32(sum, vaddq_s32(a, b));
        vst1_s8(q + k, vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))));
    }
    return vaddvq_s32(sum);
}
AI float amax_n(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int k = 0; k < n; k += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + k)));
    return vmaxvq_f32(m);
}

static void from_float_q8_0(const float *x, void *vy, int64_t n) {
    cm_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / CM_QK8_0; b++, x += CM_QK8_0) {
        const float amax = amax_n(x, 32);
        y[b].d = cm_f32_to_f16(amax / 127.0f);
        (void)q8_round32(x, amax != 0.0f ? 127.0f / amax : 0.0f, y[b].qs);
    }
}

static void from_float_q8_1(const float *x, void *vy, int64_t n) {
    cm_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / CM_QK8_1; b++, x += CM_QK8_1) {
        const float amax = amax_n(x, 32), d = amax / 127.0f;
        y[b].d = cm_f32_to_f16(d);
        const int sum = q8_round32(x, amax != 0.0f ? 127.0f / amax : 0.0f, y[b].qs);
        y[b].s = cm_f32_to_f16(d * (float)sum);
    }
}

static void from_float_q8_k(const float *x, void *vy, int64_t n) {
    cm_block_q8_k *y = vy;
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        const float amax = amax_n(x, CM_QK_K);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        int first = 0; /* the first value of largest magnitude decides the sign */
        while (fabsf(x[first]) != amax) first++;
        const float iscale = -127.f / x[first];
        const int32x4_t k127 = vdupq_n_s32(127);
        for (int g = 0; g < CM_QK_K / 16; g++) {
            int32x4_t v[4];
            for (int k = 0; k < 4; k++)
                v[k] = vminq_s32(k127, vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 16 * g + 4 * k), iscale)));
            y[b].bsums[g] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3])));
            const int8x8_t lo = vqmovn_s16(vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1])));
            const int8x8_t hi = vqmovn_s16(vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3])));
            vst1q_s8(y[b].qs + 16 * g, vcombine_s8(lo, hi));
        }
        y[b].d = 1 / iscale;
    }
}

static void from_float_f16(const float *x, void *vy, int64_t n) {
    cm_f16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = cm_f32_to_f16(x[i]);
}

void cm_kernels_fill_neon(cm_kernels *k) { CM_TILES_FILL(k); }
