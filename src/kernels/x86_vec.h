/*
 * x86_vec.h: the small 256-bit helpers every x86 kernel file uses (horizontal
 * sums in one fixed tree, fp16 conversion, nibble unpacking). Included under
 * each file's own ISA flags (x86_tiles.h, lane_avx2.c); hsum8's tree is part
 * of the kernels' bits (kernels.h), so there is one copy of it.
 */
#ifndef CM_X86_VEC_H
#define CM_X86_VEC_H

#include "base/base.h"

#include <immintrin.h>
#include <stdint.h>

#ifndef AI
#define AI static inline __attribute__((always_inline))
#endif

AI float f16f(cm_f16 h) { return _cvtsh_ss(h); }

AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
AI float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
AI int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

AI __m256i ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of nibbles -> 32 bytes: low nibbles are elements 0..15, high 16..31. */
AI __m256i nibbles32(const uint8_t *q) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

#endif
