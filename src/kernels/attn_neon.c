/*
 * attn_neon.c: attention's value side (kernels.h, cm_attn_v_fn) with NEON:
 * 4 accumulator elements per register while the tile's V rows stream past
 * (j order per element, fused multiply-adds: the last bits may differ from
 * attn_ref.c). F32, F16 and Q8_0; Q4_0 stays the reference. Compiled for
 * aarch64 only.
 *
 * The multi-query decode ops (attn_qk, attn_vm, attn_exp; kernels.h) for
 * F32, F16, Q8_0 and Q4_0 rows, shaped as attn_avx512.c's in 4 lanes: a K
 * row widened to floats 16 elements at a time for up to four queries, each
 * (query, position) dot a 4-lane partial, 4 positions' partials summed by
 * two pairwise adds (a partial group at the end of a tile runs the same code
 * with zero partials); the V side keeps four queries' accumulators of 16
 * elements in registers; exp is the same degree-7 polynomial, 2^n built in
 * two exponent-field halves (n goes below the normal range).
 */
#include "isa.h"

#include <arm_neon.h>
#include <math.h>

static void attn_v_f32(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 4 <= D; i += 4) {
        float32x4_t a = vld1q_f32(acc + i);
        const char *r = (const char *)v + (size_t)i * 4;
        for (int j = 0; j < n; j++, r += v_row) a = vfmaq_n_f32(a, vld1q_f32((const float *)r), w[j]);
        vst1q_f32(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], ((const float *)((const char *)v + (size_t)j * v_row))[i], acc[i]);
}

static void attn_v_f16(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 4 <= D; i += 4) {
        float32x4_t a = vld1q_f32(acc + i);
        const char *r = (const char *)v + (size_t)i * 2;
        for (int j = 0; j < n; j++, r += v_row)
            a = vfmaq_n_f32(a, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)r))), w[j]);
        vst1q_f32(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], cm_f16_to_f32(((const cm_f16 *)((const char *)v + (size_t)j * v_row))[i]), acc[i]);
}

static void attn_v_q8_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int64_t b = 0; b < D / 32; b++) {
        float32x4_t a[8];
        for (int h = 0; h < 8; h++) a[h] = vld1q_f32(acc + b * 32 + h * 4);
        const char *r = (const char *)v + (size_t)b * sizeof(cm_block_q8_0);
        for (int j = 0; j < n; j++, r += v_row) {
            const cm_block_q8_0 *blk = (const cm_block_q8_0 *)r;
            const float d = cm_f16_to_f32(blk->d);
            for (int h = 0; h < 2; h++) {
                const int8x16_t q = vld1q_s8(blk->qs + h * 16);
                const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
                const int32x4_t s[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)),
                                        vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi))};
                for (int u = 0; u < 4; u++)
                    a[h * 4 + u] = vfmaq_n_f32(a[h * 4 + u], vmulq_n_f32(vcvtq_f32_s32(s[u]), d), w[j]);
            }
        }
        for (int h = 0; h < 8; h++) vst1q_f32(acc + b * 32 + h * 4, a[h]);
    }
}

#define AI static inline __attribute__((always_inline))

static inline float32x4_t widen_lo(int16x8_t x) { return vcvtq_f32_s32(vmovl_s16(vget_low_s16(x))); }
static inline float32x4_t widen_hi(int16x8_t x) { return vcvtq_f32_s32(vmovl_s16(vget_high_s16(x))); }

/* Elements [i, i + 16) of a KV row of type T (i a multiple of 16) as four
 * 4-lane quarters; Q8_0/Q4_0 give the unscaled quants and *d the block scale. */
AI void row16(enum cm_type T, const char *r, int64_t i, float32x4_t *x, float *d) {
    if (T == CM_TYPE_F32) {
        *d = 1.0f;
        for (int u = 0; u < 4; u++) x[u] = vld1q_f32((const float *)r + i + 4 * u);
        return;
    }
    if (T == CM_TYPE_F16) {
        *d = 1.0f;
        for (int u = 0; u < 4; u++)
            x[u] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)((const cm_f16 *)r + i + 4 * u))));
        return;
    }
    int8x16_t q;
    if (T == CM_TYPE_Q8_0) {
        const cm_block_q8_0 *b = (const cm_block_q8_0 *)r + i / 32;
        *d = cm_f16_to_f32(b->d);
        q = vld1q_s8(b->qs + (i & 16));
    } else {
        const cm_block_q4_0 *b = (const cm_block_q4_0 *)r + i / 32;
        *d = cm_f16_to_f32(b->d);
        uint8x16_t u = vld1q_u8(b->qs);
        u = (i & 16) ? vshrq_n_u8(u, 4) : vandq_u8(u, vdupq_n_u8(15));
        q = vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(8));
    }
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
    x[0] = widen_lo(lo);
    x[1] = widen_hi(lo);
    x[2] = widen_lo(hi);
    x[3] = widen_hi(hi);
}

/* Up to four queries against 4 positions per step, each K row widened once
 * for all of them; lane L of the step's result is position L's dot. */
AI void qk_multi(enum cm_type T, int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                 float *s, int ld) {
    for (int h0 = 0; h0 < nq; h0 += 4) {
        const int nh = nq - h0 < 4 ? nq - h0 : 4;
        const float *qh = q + (size_t)h0 * D;
        for (int j = 0; j < n; j += 4) {
            const int nt = n - j < 4 ? n - j : 4;
            float32x4_t v[4][4];
            for (int t = 0; t < 4; t++) {
                float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
                const char *r = (const char *)k + (size_t)(j + t) * k_row;
                if (t < nt && (T == CM_TYPE_F32 || T == CM_TYPE_F16)) {
                    for (int64_t i = 0; i < D; i += 16) {
                        float32x4_t x[4];
                        float d;
                        row16(T, r, i, x, &d);
                        for (int h = 0; h < nh; h++)
                            for (int u = 0; u < 4; u++) a[h] = vfmaq_f32(a[h], x[u], vld1q_f32(qh + h * D + i + 4 * u));
                    }
                } else if (t < nt) {
                    for (int64_t i = 0; i < D; i += 32) {
                        float32x4_t x[8];
                        float d;
                        row16(T, r, i, x, &d);
                        row16(T, r, i + 16, x + 4, &d);
                        for (int h = 0; h < nh; h++) {
                            const float *qi = qh + h * D + i;
                            float32x4_t u = vmulq_f32(x[0], vld1q_f32(qi));
                            for (int e = 1; e < 8; e++) u = vfmaq_f32(u, x[e], vld1q_f32(qi + 4 * e));
                            a[h] = vfmaq_n_f32(a[h], u, d);
                        }
                    }
                }
                for (int h = 0; h < nh; h++) v[h][t] = a[h];
            }
            for (int h = 0; h < nh; h++) {
                const float32x4_t o =
                    vmulq_n_f32(vpaddq_f32(vpaddq_f32(v[h][0], v[h][1]), vpaddq_f32(v[h][2], v[h][3])), scale);
                float *dst = s + (h0 + h) * ld + j;
                if (nt == 4) {
                    vst1q_f32(dst, o);
                } else {
                    float tmp[4];
                    vst1q_f32(tmp, o);
                    for (int t = 0; t < nt; t++) dst[t] = tmp[t];
                }
            }
        }
    }
}

/* 16 elements of up to four queries' accumulators stay in registers while
 * the rows stream past. */
AI void vm_multi(enum cm_type T, int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                 float *acc) {
    for (int64_t i = 0; i < D; i += 16)
        for (int h0 = 0; h0 < nq; h0 += 4) {
            const int nh = nq - h0 < 4 ? nq - h0 : 4;
            float32x4_t a[4][4];
            for (int h = 0; h < nh; h++)
                for (int u = 0; u < 4; u++) a[h][u] = vld1q_f32(acc + (h0 + h) * D + i + 4 * u);
            const char *r = (const char *)v;
            for (int j = 0; j < n; j++, r += v_row) {
                float32x4_t x[4];
                float d;
                row16(T, r, i, x, &d);
                if (T == CM_TYPE_Q8_0 || T == CM_TYPE_Q4_0)
                    for (int u = 0; u < 4; u++) x[u] = vmulq_n_f32(x[u], d);
                for (int h = 0; h < nh; h++) {
                    const float wj = w[(h0 + h) * ld + j];
                    for (int u = 0; u < 4; u++) a[h][u] = vfmaq_n_f32(a[h][u], x[u], wj);
                }
            }
            for (int h = 0; h < nh; h++)
                for (int u = 0; u < 4; u++) vst1q_f32(acc + (h0 + h) * D + i + 4 * u, a[h][u]);
        }
}

CM_ATTN_MULTI_DEFINE()

/* e^x = 2^n e^r as attn_avx512.c's exp512; 2^n = 2^(n/2) 2^(n - n/2), each
 * factor a normal float, since n reaches -150. */
AI float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-104.0f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
    r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187045e-06f));
    static const float c[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    float32x4_t p = vdupq_n_f32(1.0f / 5040);
    for (int i = 0; i < 7; i++) p = vfmaq_f32(vdupq_n_f32(c[i]), p, r);
    const int32x4_t ni = vcvtq_s32_f32(n), n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    const float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
    const float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, f1), f2);
}

static float attn_exp(int n, float *s, float m) {
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t sum = vdupq_n_f32(0.0f);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(s + j), vm));
        vst1q_f32(s + j, e);
        sum = vaddq_f32(sum, e);
    }
    float total = vaddvq_f32(sum);
    if (j < n) {
        float t[4];
        for (int i = 0; i < 4; i++) t[i] = j + i < n ? s[j + i] : m;
        vst1q_f32(t, exp4(vsubq_f32(vld1q_f32(t), vm)));
        for (int i = 0; j + i < n; i++) {
            s[j + i] = t[i];
            total += t[i];
        }
    }
    return total;
}

void cm_kernels_fill_attn_neon(cm_kernels *k) {
    CM_ATTN_MULTI_FILL(k);
    k->attn_exp = attn_exp;
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
}
