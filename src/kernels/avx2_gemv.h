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
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            const __m256i sc = scs[c];
            __m256i q[4];
            q6_vals(&x[b], c, q);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
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

/* ---- q6_k prefill: tile_q6_k's arithmetic (the sign trick, pair scales
 * as a6_row shuffles them) for up to A6G_T tokens per pass over a row, so the
 * 6-bit values and the scales are made once for 8 tokens instead of 4; each
 * (row, token) gets the tile's bits (vec_dot's). Rows in blocks of A6G_RB (in
 * L2) against every group of tokens (in L1). ---- */
enum { A6G_T = 8, A6G_RB = 16 };

AI void a6g_row(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *const *yv, int T, float *out) {
    const __m256i pick[4] = {_mm256_set_m128i(_mm_set1_epi16(0x0302), _mm_set1_epi16(0x0100)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0706), _mm_set1_epi16(0x0504)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0b0a), _mm_set1_epi16(0x0908)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0f0e), _mm_set1_epi16(0x0d0c))};
    const __m256i k32 = _mm256_set1_epi8(32);
    __m256 acc[A6G_T];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x[b].scales));
        const __m256i scs[2] = {_mm256_permute2x128_si256(s16, s16, 0x00), _mm256_permute2x128_si256(s16, s16, 0x11)};
        __m256i sumi[A6G_T];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            const __m256i sc = scs[c];
            __m256i q[4];
            q6_vals(&x[b], c, q);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m256i sv = _mm256_shuffle_epi8(sc, pick[k]);
                const __m256i qs = _mm256_sub_epi8(q[k], k32), qa = _mm256_sign_epi8(qs, qs);
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                    const __m256i yy = _mm256_sign_epi8(ld256(yv[t][b].qs + 128 * c + 32 * k), qs);
                    sumi[t] = ax_keep(_mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, yy), sv)));
                }
            }
        }
        const float d = f16f(x[b].d);
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) FMA_BLOCK(acc[t], sumi[t], d * yv[t][b].d);
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]);
}

static void gemm_a6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    for (int64_t i0 = r0; i0 < r1; i0 += A6G_RB) {
        const int64_t i1 = r1 - i0 < A6G_RB ? r1 : i0 + A6G_RB;
        for (int64_t j = 0; j < n_tok; j += A6G_T) {
            const int T = n_tok - j < A6G_T ? (int)(n_tok - j) : A6G_T;
            const cm_block_q8_k *yv[A6G_T];
            for (int t = 0; t < T; t++)
                yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
            for (int64_t i = i0; i < i1; i++) {
                const cm_block_q6_k *xr = (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)i * w_stride);
                float out[A6G_T];
                switch (T) { /* a constant T keeps the tile in registers */
                case 8: a6g_row(nb, xr, yv, 8, out); break;
                case 7: a6g_row(nb, xr, yv, 7, out); break;
                case 6: a6g_row(nb, xr, yv, 6, out); break;
                case 5: a6g_row(nb, xr, yv, 5, out); break;
                case 4: a6g_row(nb, xr, yv, 4, out); break;
                case 3: a6g_row(nb, xr, yv, 3, out); break;
                case 2: a6g_row(nb, xr, yv, 2, out); break;
                default: a6g_row(nb, xr, yv, 1, out); break;
                }
                for (int t = 0; t < T; t++) y[(j + t) * ldy + i] = out[t];
            }
        }
    }
}

/* ---- f16: tile_f16's bits (x86_tiles.h, tiles.h's CM_TILE_FLOAT) ----
 * Per (row, token) the tile's two chains (elements i..i+7 and i+8..i+15 of
 * each step of 16, an FMA each), hsum8 of their sum, then the tail element
 * by element. The F16 tokens are converted to f32 once per call (gemv) or
 * once per block of rows and group of tokens (gemm) instead of in every
 * tile, conversions being exact, and FA_R rows share each token load: the
 * tile then issues 4 conversions per 12 FMAs instead of 10 per 8. */
enum { FA_R = 2, FA_T = 3, FA_MAXK = 16384, FA_KC = 1024 };

/* Steps [s0, s1) of 16 elements of R rows (x[r]) x T f32 tokens (y + t * ys),
 * the chains of row r and token t in st[r * 2 * FA_T + 2 * t + h] (h: which
 * half of the step), so a row can be walked in spans that keep the tokens'
 * span in L1. */
AI void fa_span(const cm_f16 *const *x, const float *y, int64_t ys, int R, int T, int64_t s0, int64_t s1, __m256 *st) {
    __m256 a0[FA_R][FA_T], a1[FA_R][FA_T];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
        a0[r][t] = st[r * 2 * FA_T + 2 * t];
        a1[r][t] = st[r * 2 * FA_T + 2 * t + 1];
    }
    for (int64_t i = s0; i < s1; i += 16) {
        __m256 w[FA_R];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) w[r] = ld_f16(x[r], i);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) { /* one load of the token for all rows */
            const __m256 v = ld_f32(y + t * ys, i);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) a0[r][t] = _mm256_fmadd_ps(w[r], v, a0[r][t]);
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) w[r] = ld_f16(x[r], i + 8);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            const __m256 v = ld_f32(y + t * ys, i + 8);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) a1[r][t] = _mm256_fmadd_ps(w[r], v, a1[r][t]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
        st[r * 2 * FA_T + 2 * t] = a0[r][t];
        st[r * 2 * FA_T + 2 * t + 1] = a1[r][t];
    }
}

AI void fa_span_rt(const cm_f16 *const *x, const float *y, int64_t ys, int R, int T, int64_t s0, int64_t s1,
                   __m256 *st) {
    if (R == FA_R) {
        switch (T) { /* a constant shape keeps the chains in registers */
        case 3: fa_span(x, y, ys, FA_R, 3, s0, s1, st); break;
        case 2: fa_span(x, y, ys, FA_R, 2, s0, s1, st); break;
        default: fa_span(x, y, ys, FA_R, 1, s0, s1, st); break;
        }
    } else {
        switch (T) {
        case 3: fa_span(x, y, ys, 1, 3, s0, s1, st); break;
        case 2: fa_span(x, y, ys, 1, 2, s0, s1, st); break;
        default: fa_span(x, y, ys, 1, 1, s0, s1, st); break;
        }
    }
}

/* Rows [r0, r1) (at most RB) x T tokens (yf, k floats apart) into y (token
 * j0 + t at row ldy * (j0 + t)): the span loop, then per (row, token) the
 * tile's hsum8 of the two chains and its tail. */
AI void fa_rows(int64_t k, const void *w, size_t w_stride, const float *yf, int T, float *y, int64_t ldy, int64_t j0,
                int64_t r0, int64_t r1) {
    const int64_t kf = k & ~(int64_t)15;
    __m256 st[RB * 2 * FA_T];
    for (int i = 0; i < RB * 2 * FA_T; i++) st[i] = _mm256_setzero_ps();
#define FA_ROW(i) ((const cm_f16 *)(const void *)((const char *)w + (size_t)(i)*w_stride))
    for (int64_t c0 = 0; c0 < kf; c0 += FA_KC) {
        const int64_t c1 = kf - c0 < FA_KC ? kf : c0 + FA_KC;
        int64_t i = r0;
        for (; i + FA_R <= r1; i += FA_R) {
            const cm_f16 *x[FA_R] = {FA_ROW(i), FA_ROW(i + 1)};
            fa_span_rt(x, yf, k, FA_R, T, c0, c1, st + (i - r0) * 2 * FA_T);
        }
        if (i < r1) {
            const cm_f16 *x[1] = {FA_ROW(i)};
            fa_span_rt(x, yf, k, 1, T, c0, c1, st + (i - r0) * 2 * FA_T);
        }
    }
    for (int64_t i = r0; i < r1; i++)
        for (int t = 0; t < T; t++) {
            const __m256 *a = st + (i - r0) * 2 * FA_T + 2 * t;
            float s = HSUM8X2(a[0], a[1]);
            for (int64_t e = kf; e < k; e++) s += sc_f16(FA_ROW(i), e) * sc_f32(yf + t * k, e);
            y[(j0 + t) * ldy + i] = s;
        }
#undef FA_ROW
}

AI void fa_convert(int64_t k, const void *x, float *yf) {
    const cm_f16 *h = x;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(yf + i, ld_f16(h, i));
    for (; i < k; i++) yf[i] = f16f(h[i]);
}

static void gemm_af16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    if (k > FA_MAXK) {
        gemm_f16(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(32) float yf[FA_T * FA_MAXK];
    /* RB rows at a time (in L2) against each group of FA_T tokens, as tiles.h's gemm */
    for (int64_t i0 = r0; i0 < r1; i0 += RB) {
        const int64_t i1 = r1 - i0 < RB ? r1 : i0 + RB;
        for (int64_t j = 0; j < n_tok; j += FA_T) {
            const int T = n_tok - j < FA_T ? (int)(n_tok - j) : FA_T;
            for (int t = 0; t < T; t++) fa_convert(k, (const char *)x + (size_t)(j + t) * x_stride, yf + t * k);
            fa_rows(k, w, w_stride, yf, T, y, ldy, j, i0, i1);
        }
    }
}

static void gemv_af16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    if (k > 2 * FA_MAXK) {
        for (int64_t i = r0; i < r1; i++) vec_dot_f16(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    _Alignas(32) float yf[2 * FA_MAXK];
    fa_convert(k, x, yf);
    for (int64_t i0 = r0; i0 < r1; i0 += RB) fa_rows(k, w, w_stride, yf, 1, y, 0, 0, i0, r1 - i0 < RB ? r1 : i0 + RB);
}
