/*
 * attn_avx2.c: attention's value side (kernels.h, cm_attn_v_fn) with AVX2,
 * FMA and F16C: 8 accumulator elements per register while the tile's V
 * rows stream past (j order per element, fused multiply-adds: the last bits
 * may differ from attn_ref.c). F32, F16 and Q8_0; Q4_0 stays the
 * reference. Compiled with the AVX2 flags only.
 */
#include "isa.h"

#include <immintrin.h>
#include <math.h>

static void attn_v_f32(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 4;
        for (int j = 0; j < n; j++, r += v_row) a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps((const float *)r), a);
        _mm256_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++) acc[i] = fmaf(w[j], ((const float *)((const char *)v + (size_t)j * v_row))[i], acc[i]);
}

static void attn_v_f16(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 2;
        for (int j = 0; j < n; j++, r += v_row)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r)), a);
        _mm256_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], cm_f16_to_f32(((const cm_f16 *)((const char *)v + (size_t)j * v_row))[i]), acc[i]);
}

static void attn_v_q8_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int64_t b = 0; b < D / 32; b++) {
        __m256 a[4];
        for (int h = 0; h < 4; h++) a[h] = _mm256_loadu_ps(acc + b * 32 + h * 8);
        const char *r = (const char *)v + (size_t)b * sizeof(cm_block_q8_0);
        for (int j = 0; j < n; j++, r += v_row) {
            const cm_block_q8_0 *blk = (const cm_block_q8_0 *)r;
            const __m256 d = _mm256_set1_ps(cm_f16_to_f32(blk->d)), wj = _mm256_set1_ps(w[j]);
            for (int h = 0; h < 4; h++) {
                const __m128i q = _mm_loadl_epi64((const __m128i *)(blk->qs + h * 8));
                const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
                a[h] = _mm256_fmadd_ps(wj, x, a[h]);
            }
        }
        for (int h = 0; h < 4; h++) _mm256_storeu_ps(acc + b * 32 + h * 8, a[h]);
    }
}

void cm_kernels_fill_attn_avx2(cm_kernels *k) {
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
}
