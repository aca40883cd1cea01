/*
 * x86_krepack.h: what the AVX2 and AVX-512 gemvs over "q4_k lanes" and
 * "q5_k lanes" rows (repack.c; the AVX2 table's "pairs" have the same group
 * header) share: a group's header unpacked with 128-bit
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

#ifdef __AVX512F__
/* ---- q5_k's "z5" float order on AVX-512 (avx512_krepack.h's vec_dot and
 * rows, gemv_kd_avx512.c's decode gemvs): super-blocks' exact sums S_b, M_b
 * gathered 4 at a time ---- */
/* Four super-blocks' lanes s[i] (8 each), m[i] (4 each) -> lane i of *S4 /
 * *M4: their exact sums S_b, M_b. */
AI void rk5_quad(const __m256i s[4], const __m128i m[4], __m128i *S4, __m128i *M4) {
    __m128i h[4];
    for (int i = 0; i < 4; i++) h[i] = _mm_add_epi32(_mm256_castsi256_si128(s[i]), _mm256_extracti128_si256(s[i], 1));
    /* 4 x 4 transpose-adds: lane i = the sum of x[i]'s 4 lanes */
    const __m128i a0 = _mm_add_epi32(_mm_unpacklo_epi32(h[0], h[1]), _mm_unpackhi_epi32(h[0], h[1]));
    const __m128i a1 = _mm_add_epi32(_mm_unpacklo_epi32(h[2], h[3]), _mm_unpackhi_epi32(h[2], h[3]));
    *S4 = _mm_add_epi32(_mm_unpacklo_epi64(a0, a1), _mm_unpackhi_epi64(a0, a1));
    const __m128i b0 = _mm_add_epi32(_mm_unpacklo_epi32(m[0], m[1]), _mm_unpackhi_epi32(m[0], m[1]));
    const __m128i b1 = _mm_add_epi32(_mm_unpacklo_epi32(m[2], m[3]), _mm_unpackhi_epi32(m[2], m[3]));
    *M4 = _mm_add_epi32(_mm_unpacklo_epi64(b0, b1), _mm_unpackhi_epi64(b0, b1));
}

/* z5's state for a row: 16 lanes of S_b, M_b, d * dy, -(dmin * dy) gathered
 * 4 super-blocks at a time (128-bit lane k), then one conversion and two
 * FMAs per 16 super-blocks (lanes not filled are zero: no change). */
typedef struct {
    __m512 acc, dv, mv;
    __m512i sv, nv;
    int k;
} rk5_acc;

AI void rk5_put(rk5_acc *a, __m128i S4, __m128i M4, __m128 d4, __m128 nm4) {
    const __mmask16 msk = (__mmask16)(0xfu << (4 * a->k));
    a->sv = _mm512_mask_broadcast_i32x4(a->sv, msk, S4);
    a->nv = _mm512_mask_broadcast_i32x4(a->nv, msk, M4);
    a->dv = _mm512_mask_broadcast_f32x4(a->dv, msk, d4);
    a->mv = _mm512_mask_broadcast_f32x4(a->mv, msk, nm4);
    if (++a->k == 4) {
        a->acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a->sv), a->dv, a->acc);
        a->acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a->nv), a->mv, a->acc);
        a->sv = a->nv = _mm512_setzero_si512();
        a->dv = a->mv = _mm512_setzero_ps();
        a->k = 0;
    }
}

AI float rk5_end(rk5_acc *a) {
    if (a->k) {
        a->acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a->sv), a->dv, a->acc);
        a->acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a->nv), a->mv, a->acc);
    }
    return _mm512_reduce_add_ps(a->acc);
}

#endif

#endif
