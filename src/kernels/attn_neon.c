/*
 * attn_neon.c: attention's value side (kernels.h, cm_attn_v_fn) with NEON:
 * 4 accumulator elements per register while the tile's V rows stream past
 * (j order per element, fused multiply-adds: the last bits may differ from
 * attn_ref.c). F32, F16 and Q8_0; Q4_0 stays the reference. Compiled for
 * aarch64 only.
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
        for (int j = 0; j < n; j++) acc[i] = fmaf(w[j], ((const float *)((const char *)v + (size_t)j * v_row))[i], acc[i]);
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

void cm_kernels_fill_attn_neon(cm_kernels *k) {
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
}
