/*
 * x86_krepack.h: what the AVX2 and AVX-512 gemvs over "q4_k lanes" and
 * "q5_k lanes" rows (repack.c) share: a group's header unpacked with 128-bit
 * operations, the token's bsums pair sums. Included only by avx2_krepack.h and avx512_krepack.h (each in
 * its own ISA file, after x86_tiles.h). Never allocates.
 */
#ifndef CM_X86_KREPACK_H
#define CM_X86_KREPACK_H

enum { RK4_GROUP = 4 * (int)sizeof(cm_block_q4_k), RK4_MAXB = CM_REPACK_MAX_K / CM_QK_K };

/* A group's header (repack.c: 8 fp16, then the scale dwords a, b, c of 4
 * blocks): dd = d[0..3], dmin[0..3]; sc03/sc47: dword j = block j's scales
 * 0-3 / 4-7 (cm_k4_scales8's bit arithmetic on 4 blocks at once); mn16[j]: block
 * j's mins as words. */
AI void rk_header(const uint8_t *x, float dd[8], __m128i *sc03, __m128i *sc47, __m128i mn16[4]) {
    const __m128i m3f = _mm_set1_epi32(0x3f3f3f3f), m0f = _mm_set1_epi32(0x0f0f0f0f), m03 = _mm_set1_epi32(0x03030303);
    _mm256_storeu_ps(dd, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)x)));
    const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(x + 16));
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(x + 32));
    const __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(x + 48));
    *sc03 = _mm_and_si128(a, m3f);
    *sc47 = _mm_or_si128(_mm_and_si128(c, m0f), _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(a, 6), m03), 4));
    const __m128i mn03 = _mm_and_si128(b, m3f);
    const __m128i mn47 = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(c, 4), m0f),
                                      _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(b, 6), m03), 4));
    const __m128i mlo = _mm_unpacklo_epi32(mn03, mn47), mhi = _mm_unpackhi_epi32(mn03, mn47);
    mn16[0] = _mm_cvtepu8_epi16(mlo);
    mn16[1] = _mm_cvtepu8_epi16(_mm_srli_si128(mlo, 8));
    mn16[2] = _mm_cvtepu8_epi16(mhi);
    mn16[3] = _mm_cvtepu8_epi16(_mm_srli_si128(mhi, 8));
}

/* The token's bsums pair sums, as kmins forms them. */
AI void rk_pairs(int64_t nb, const cm_block_q8_k *y, __m128i *pairs) {
    for (int64_t b = 0; b < nb; b++) {
        const __m256i bs = ld256(y[b].bsums);
        pairs[b] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    }
}

#endif
