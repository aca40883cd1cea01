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

/* F16 accumulator step: 8 lanes, fused, rounded to F16 nearest-even. */
static void attn_f16_step(int64_t D, void *accv, const void *vv, float ms, float w) {
    cm_f16 *acc = accv;
    const cm_f16 *v = vv;
    int64_t i = 0;
    const __m256 vm = _mm256_set1_ps(ms), vw = _mm256_set1_ps(w);
    for (; i + 8 <= D; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        if (ms != 1.0f) a = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a, vm), _MM_FROUND_TO_NEAREST_INT));
        a = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), vw, a);
        _mm_storeu_si128((__m128i *)(acc + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < D; i++) {
        if (ms != 1.0f) acc[i] = cm_f32_to_f16(cm_f16_to_f32(acc[i]) * ms);
        acc[i] = cm_f32_to_f16(fmaf(cm_f16_to_f32(v[i]), w, cm_f16_to_f32(acc[i])));
    }
}

/* The lane order of ggml's AVX-512 F16 dot (kernels.h) in 8 x 8 lanes. */
static void attn_f16_dot(int64_t D, float *s, const void *xv, const void *yv) {
    const cm_f16 *x = xv, *y = yv;
    __m256 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    const int64_t np = D & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 8; j++)
            a[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * j))),
                                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * j))), a[j]);
    for (int j = 0; j < 4; j++) a[j] = _mm256_add_ps(a[j], a[j + 4]); /* l + l+32 */
    a[0] = _mm256_add_ps(a[0], a[2]);                                   /* l + l+16 */
    a[1] = _mm256_add_ps(a[1], a[3]);
    float t[16];
    _mm256_storeu_ps(t, a[0]);
    _mm256_storeu_ps(t + 8, a[1]);
    for (int w = 8; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    double sum = t[0];
    for (int64_t i = np; i < D; i++) sum += (double)(cm_f16_to_f32(x[i]) * cm_f16_to_f32(y[i]));
    *s = (float)sum;
}

void cm_kernels_fill_attn_avx2(cm_kernels *k) {
    k->attn_f16_step = attn_f16_step;
    k->attn_f16_dot = attn_f16_dot;
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
}
