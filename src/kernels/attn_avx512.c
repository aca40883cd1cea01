/*
 * attn_avx512.c: attention's value side (kernels.h, cm_attn_v_fn) with
 * AVX-512: 16 elements of the accumulator stay in a register while the
 * tile's V rows stream past (each element still sums its rows in j order,
 * with fused multiply-adds: the last bits may differ from attn_ref.c, whose
 * multiply and add round apart). F32, F16 (F16C) and Q8_0; Q4_0 stays the
 * reference. Compiled with the AVX-512 flags only.
 */
#include "isa.h"

#include <immintrin.h>
#include <math.h>

static void attn_v_f32(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        __m512 a = _mm512_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 4;
        for (int j = 0; j < n; j++, r += v_row) a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_loadu_ps((const float *)r), a);
        _mm512_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++) acc[i] = fmaf(w[j], ((const float *)((const char *)v + (size_t)j * v_row))[i], acc[i]);
}

static void attn_v_f16(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        __m512 a = _mm512_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 2;
        for (int j = 0; j < n; j++, r += v_row)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r)), a);
        _mm512_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], cm_f16_to_f32(((const cm_f16 *)((const char *)v + (size_t)j * v_row))[i]), acc[i]);
}

/* Q8_0: element = d * q (rounded as to_float does), then the fused add. */
static void attn_v_q8_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int64_t b = 0; b < D / 32; b++) {
        __m512 a0 = _mm512_loadu_ps(acc + b * 32), a1 = _mm512_loadu_ps(acc + b * 32 + 16);
        const char *r = (const char *)v + (size_t)b * sizeof(cm_block_q8_0);
        for (int j = 0; j < n; j++, r += v_row) {
            const cm_block_q8_0 *blk = (const cm_block_q8_0 *)r;
            const __m512 d = _mm512_set1_ps(cm_f16_to_f32(blk->d)), wj = _mm512_set1_ps(w[j]);
            const __m128i q0 = _mm_loadu_si128((const __m128i *)blk->qs), q1 = _mm_loadu_si128((const __m128i *)(blk->qs + 16));
            const __m512 x0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
            const __m512 x1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
            a0 = _mm512_fmadd_ps(wj, x0, a0);
            a1 = _mm512_fmadd_ps(wj, x1, a1);
        }
        _mm512_storeu_ps(acc + b * 32, a0);
        _mm512_storeu_ps(acc + b * 32 + 16, a1);
    }
}

/* F16 accumulator step: 16 lanes, fused, rounded to F16 nearest-even. */
static void attn_f16_step(int64_t D, void *accv, const void *vv, float ms, float w) {
    cm_f16 *acc = accv;
    const cm_f16 *v = vv;
    int64_t i = 0;
    const __m512 vm = _mm512_set1_ps(ms), vw = _mm512_set1_ps(w);
    for (; i + 16 <= D; i += 16) {
        __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(acc + i)));
        if (ms != 1.0f) a = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(a, vm), _MM_FROUND_TO_NEAREST_INT));
        a = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + i))), vw, a);
        _mm256_storeu_si256((__m256i *)(acc + i), _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < D; i++) {
        if (ms != 1.0f) acc[i] = cm_f32_to_f16(cm_f16_to_f32(acc[i]) * ms);
        acc[i] = cm_f32_to_f16(fmaf(cm_f16_to_f32(v[i]), w, cm_f16_to_f32(acc[i])));
    }
}

/* ggml's AVX-512 F16 dot: 4 x 16 lanes, (0+2, 1+3), then 0+1, then the
 * 16-lane halving tree (256-bit halves, 128-bit halves, pairs, lanes). */
static void attn_f16_dot(int64_t D, float *s, const void *xv, const void *yv) {
    const cm_f16 *x = xv, *y = yv;
    __m512 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm512_setzero_ps();
    const int64_t np = D & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16 * j))),
                                   _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16 * j))), a[j]);
    a[0] = _mm512_add_ps(a[0], a[2]);
    a[1] = _mm512_add_ps(a[1], a[3]);
    a[0] = _mm512_add_ps(a[0], a[1]);
    float t[16];
    _mm512_storeu_ps(t, a[0]);
    for (int w = 8; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    double sum = t[0];
    for (int64_t i = np; i < D; i++) sum += (double)(cm_f16_to_f32(x[i]) * cm_f16_to_f32(y[i]));
    *s = (float)sum;
}

void cm_kernels_fill_attn_avx512(cm_kernels *k) {
    k->attn_f16_step = attn_f16_step;
    k->attn_f16_dot = attn_f16_dot;
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
}
