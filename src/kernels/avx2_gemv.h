/*
 * avx2_gemv.h: the AVX2 table's own decode gemvs (one token), over the
 * file's bytes. Not a header in the usual sense: kernels_avx2.c includes it
 * once, after x86_tiles.h, under the AVX2 flags; it registers them in the
 * avx2 table only (the avx512 table has its own vec_dots, which these would
 * not match). Nothing else may include it. Never allocates.
 *
 * gemv_a6_k: each row bit for bit tile_q6_k's (x86_tiles.h) for one token.
 * The tile's integer lanes are exact, so they may be computed another way:
 * per 32 values, maddubs of the unsigned 6-bit values q (0..63) against the
 * token's bytes y, minus maddubs(32, y) (the offset, once per call for the
 * token), is sum (q - 32) * y per pair, as the tile's sign trick gives it
 * (|pair| <= 2 * 63 * 127 before the subtraction, so nothing saturates); the
 * pair scales come from one sign extension of the 16 scales and a byte
 * shuffle per 32 values instead of two broadcasts. Then the tile's float
 * steps: one FMA per super-block into one chain, hsum8. About 8 vector
 * operations per 32 weights instead of 14.
 */

enum { A6_MAXB = CM_REPACK_MAX_K / CM_QK_K, A6_PF = 4 };

/* Pair offsets of the token: off[8 * b + 4 * c + k] = maddubs(32, y_b's bytes 128c + 32k..). */
AI void a6_offsets(int64_t nb, const cm_block_q8_k *y, __m256i *off) {
    const __m256i k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++)
        for (int g = 0; g < 8; g++) off[8 * b + g] = _mm256_maddubs_epi16(k32, ld256(y[b].qs + 32 * g));
}

AI float a6_row(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *y, const __m256i *off) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    /* within each 128-bit half of a scale vector (8 words: scales 8c..8c+7),
     * the low half picks scale 2k's word, the high half scale 2k + 1's */
    const __m256i pick[4] = {_mm256_set_m128i(_mm_set1_epi16(0x0302), _mm_set1_epi16(0x0100)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0706), _mm_set1_epi16(0x0504)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0b0a), _mm_set1_epi16(0x0908)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0f0e), _mm_set1_epi16(0x0d0c))};
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x[b].scales));
        const __m256i scs[2] = {_mm256_permute2x128_si256(s16, s16, 0x00), _mm256_permute2x128_si256(s16, s16, 0x11)};
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i sc = scs[c];
            const __m256i l0 = ld256(x[b].ql + 64 * c), l1 = ld256(x[b].ql + 64 * c + 32);
            const __m256i h = ld256(x[b].qh + 32 * c);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            for (int k = 0; k < 4; k++) {
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], ld256(y[b].qs + 128 * c + 32 * k)),
                                                   off[8 * b + 4 * c + k]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, pick[k])));
            }
        }
        FMA_BLOCK(acc, sumi, f16f(x[b].d) * y[b].d);
    }
    return hsum8(acc);
}

static void gemv_a6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    if (nb > A6_MAXB) { /* longer than any repacked row: the tile itself */
        for (int64_t i = r0; i < r1; i++) vec_dot_q6_k(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    __m256i off[A6_MAXB * 8];
    a6_offsets(nb, x, off);
    const size_t row_bytes = (size_t)nb * sizeof(cm_block_q6_k);
    for (int64_t i = r0; i < r1; i++) {
        const char *wr = (const char *)w + (size_t)i * w_stride;
        if (i + A6_PF < r1) /* several rows' lines in flight (cm_matmul_rows' reason) */
            for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch(wr + A6_PF * w_stride + o, _MM_HINT_T0);
        y[i] = a6_row(nb, (const cm_block_q6_k *)(const void *)wr, x, off);
    }
}
