/*
 * attn_q8_avx512.h: the query side of Q8_0 K by VNNI, shared by the decode
 * kernel (attn_avx512.c) and prefill's many-query one (attn_tile_avx512.c),
 * which must give the same bits: one definition of how a query becomes int8
 * values, bias starts and scales. Included by AVX-512 files only.
 */
#ifndef CM_ATTN_Q8_AVX512_H
#define CM_ATTN_Q8_AVX512_H

#include "../tensor/tensor.h"

#include <immintrin.h>
#include <stdint.h>

/* Q8_0 K with D a multiple of 64: the queries, which attn_split.c rounds
 * through Q8_0 (kernels.h: K's vec_dot_type), are their blocks' int8 values
 * times the block's F16 scale, so they are re-quantized exactly here (the
 * scale is the block's largest |q| / 127, exact for such a query) and dotted
 * in int32 by VNNI, two blocks per step: (k + 128) unsigned times q signed,
 * each lane started from -128 x its four q, so its four products sum exactly;
 * then times d_k d_q into the lane's float partial (as ggml's q8_0 x q8_0
 * dot scales an exact integer sum). Per query, nothing depends on the other
 * queries of the call (batch invariance). */
enum { QK8_MAXD = 1024 };

/* Per query, once per call: the int8 values (qi), per lane -128 x its four
 * values (qc, the start of each VNNI sum) and the lanes' block scales (qd). */
static inline void q8_prep(int64_t D, const float *q, int8_t *qi, int32_t *qc, float *qd) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t c = 0; c < D / 64; c++) {
        float d[2];
        for (int h = 0; h < 2; h++) {
            const float *x = q + c * 64 + h * 32;
            const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            d[h] = amax / 127.0f;
            const __m512 id = _mm512_set1_ps(d[h] != 0.0f ? 1.0f / d[h] : 0.0f);
            _mm_storeu_si128((__m128i *)(qi + c * 64 + h * 32),
                             _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id))));
            _mm_storeu_si128((__m128i *)(qi + c * 64 + h * 32 + 16),
                             _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id))));
        }
        const __m512i sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(qi + c * 64));
        _mm512_store_si512(qc + c * 16, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum4, 7)));
        _mm512_store_ps(qd + c * 16, _mm512_insertf32x8(_mm512_set1_ps(d[0]), _mm256_set1_ps(d[1]), 1));
    }
}

#endif
