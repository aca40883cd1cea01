/*
 * avx2_gemv.h: the AVX2 table's own q6_k and f16 kernels (vec_dot, decode
 * gemv, prefill gemm), over the file's bytes. Not a header in the usual
 * sense: kernels_avx2.c includes it once, after x86_tiles.h, under the AVX2
 * flags; it registers them in the avx2 table only (the avx512 table has its
 * own, which these do not match). Nothing else may include it. Never
 * allocates.
 *
 * q6_k, the AVX2 table's float order: per super-block b the exact integer
 * total s_b = sum_j sc_j * sum_i (q_i - 32) * y_i, then one chain per (row,
 * token): acc = fma((float)s_b, dx_b * dy_b, acc) in ascending b (an f32
 * product, a fused multiply-add), no horizontal float sum. Only the integer
 * total reaches a float, so it may be computed any exact way, which lets the
 * -32 offset come from the token's bsums (Q8_K's 16-value sums) once per
 * block instead of once per value, as llama.cpp's x86 q6_k does:
 *   s_b = sum_j sc_j * sum_i q_i * y_i  -  32 * sum_j sc_j * bsums_j.
 * The first term is maddubs(q, y) (q unsigned 0..63, y signed, |pair| <=
 * 2 * 63 * 128 = 16128 < 2^15: no saturation), madd with the pair scales
 * (|lane| per 32 values <= 2 * 16128 * 128 < 2^23, 8 of them < 2^26); the
 * second is one madd of the scales times -32 (|sc * 32| <= 4096, an int16)
 * with the bsums (|bsum| <= 16 * 128 = 2048): |lane| <= 2 * 4096 * 2048 =
 * 2^24. Every int32 lane and partial sum stays below 2^27 and the total
 * |s_b| <= 256 * 32 * 128 * 128 < 2^28: exact. Per 32 values and token that
 * is one maddubs, one madd and one add (the sign trick took two more).
 * Several rows' or tokens' totals are transposed into the lanes of one
 * vector (a6_hadd8), so the conversions, scale products and FMAs go 8 at a
 * time, each lane its own (row, token) chain: vec_dot's bits.
 */

enum { A6_MAXB = CM_REPACK_MAX_K / CM_QK_K, A6_PF = 4, A6G_T = 8, A6G_RB = 16 };

/* p[i]: 8 int32 summing to total i; returns lane i = total i (exact). */
AI __m256i a6_hadd8(const __m256i p[8]) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* The block's 16 scales as words (s16) and as -32 * scale words (ns). */
AI void a6_scales(const cm_block_q6_k *x, __m256i *s16, __m256i *ns) {
    *s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x->scales));
    *ns = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(*s16, 5));
}

/* The 6-bit values 32k..32k+31 of half c of block x (0..63, q6_vals' order). */
AI __m256i a6_vals(const cm_block_q6_k *x, int c, int k) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i l = ld256(x->ql + 64 * c + 32 * (k & 1)), h = ld256(x->qh + 32 * c);
    const __m256i lo = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    const __m256i hs = k == 0   ? _mm256_slli_epi16(h, 4)
                       : k == 1 ? _mm256_slli_epi16(h, 2)
                       : k == 2 ? h
                                : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hs, m30));
}

/* Block x against T tokens' blocks yb[t] into sumi[t] (8 lanes summing to
 * s_b, the offset term included). T a constant. The 8 pair-scale vectors go
 * to memory once, as operands of the madds: with T = 8 the accumulators
 * take half the 16 registers. */
AI void a6_block(const cm_block_q6_k *x, const cm_block_q8_k *const *yb, int T, __m256i *sumi) {
    /* within each 128-bit half of a scale vector (8 words: scales 8c..8c+7),
     * the low half picks scale 2k's word, the high half scale 2k + 1's */
    const __m256i pick[4] = {_mm256_set_m128i(_mm_set1_epi16(0x0302), _mm_set1_epi16(0x0100)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0706), _mm_set1_epi16(0x0504)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0b0a), _mm_set1_epi16(0x0908)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0f0e), _mm_set1_epi16(0x0d0c))};
    __m256i s16, ns, sv[8];
    a6_scales(x, &s16, &ns);
    const __m256i sc[2] = {_mm256_permute2x128_si256(s16, s16, 0x00), _mm256_permute2x128_si256(s16, s16, 0x11)};
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) sv[i] = _mm256_shuffle_epi8(sc[i / 4], pick[i % 4]);
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) sumi[t] = _mm256_madd_epi16(ns, ld256(yb[t]->bsums));
    _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            const __m256i q = a6_vals(x, c, k);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const __m256i p = _mm256_maddubs_epi16(q, ld256(yb[t]->qs + 128 * c + 32 * k));
                sumi[t] = ax_keep(_mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sv[4 * c + k])));
            }
        }
    }
}

static void vec_dot_a6_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q6_k *x = vx;
    const cm_block_q8_k *y = vy;
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const cm_block_q8_k *yb[1] = {y + b};
        __m256i sumi[1];
        a6_block(x + b, yb, 1, sumi);
        const float d = f16f(x[b].d) * y[b].d;
        acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), hsum_i32(sumi[0])), _mm_set_ss(d), acc);
    }
    *s = _mm_cvtss_f32(acc);
}

/* Decode: 8 rows at a time in the lanes of one chain vector (the rows' dx
 * gathered per block), each row's lines prefetched A6_PF groups ahead. */
static void gemv_a6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    const cm_block_q8_k *yq = x;
    const size_t row_bytes = (size_t)nb * sizeof(cm_block_q6_k);
    int64_t i = r0;
    for (; i + 8 <= r1; i += 8) {
        const cm_block_q6_k *xr[8];
        for (int r = 0; r < 8; r++) {
            xr[r] = (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
            if (i + 8 + r < r1) /* several rows' lines in flight (cm_matmul_rows' reason) */
                for (size_t o = 0; o < row_bytes; o += 64)
                    _mm_prefetch((const char *)xr[r] + 8 * w_stride + o, _MM_HINT_T0);
        }
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const cm_block_q8_k *yb[1] = {yq + b};
            __m256i sumi[8];
            cm_f16 h[8];
            for (int r = 0; r < 8; r++) {
                a6_block(xr[r] + b, yb, 1, &sumi[r]);
                h[r] = xr[r][b].d;
            }
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a6_hadd8(sumi)), _mm256_mul_ps(dx, _mm256_set1_ps(yq[b].d)), acc);
        }
        _mm256_storeu_ps(y + i, acc);
    }
    for (; i < r1; i++) vec_dot_a6_k(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
}

/* One row x T tokens (yv[t]; dy[8 * b + t]: token t's block b scale):
 * out[t]. T a constant. */
AI void a6g_row(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *const *yv, const float *dy, int T,
                float *out) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const cm_block_q8_k *yb[A6G_T];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) yb[t] = yv[t] + b;
        __m256i sumi[A6G_T];
        a6_block(x + b, yb, T, sumi);
        _Pragma("GCC unroll 8") for (int t = T; t < A6G_T; t++) sumi[t] = _mm256_setzero_si256();
        const __m256 d = _mm256_mul_ps(_mm256_set1_ps(f16f(x[b].d)), _mm256_loadu_ps(dy + 8 * b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a6_hadd8(sumi)), d, acc);
    }
    _Alignas(32) float o[8];
    _mm256_store_ps(o, acc);
    for (int t = 0; t < T; t++) out[t] = o[t];
}

/* Prefill: each row once per group of A6G_T tokens, rows in blocks of A6G_RB
 * (in L2) against every group of tokens (in L1). */
static void gemm_a6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    if (nb > A6_MAXB) {
        for (int64_t i = r0; i < r1; i++)
            for (int64_t j = 0; j < n_tok; j++)
                vec_dot_a6_k(k, &y[j * ldy + i], (const char *)w + (size_t)i * w_stride,
                             (const char *)x + (size_t)j * x_stride);
        return;
    }
    float dy[8 * A6_MAXB];
    for (int64_t i0 = r0; i0 < r1; i0 += A6G_RB) {
        const int64_t i1 = r1 - i0 < A6G_RB ? r1 : i0 + A6G_RB;
        for (int64_t j = 0; j < n_tok; j += A6G_T) {
            const int T = n_tok - j < A6G_T ? (int)(n_tok - j) : A6G_T;
            const cm_block_q8_k *yv[A6G_T];
            for (int t = 0; t < T; t++) {
                yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
                for (int64_t b = 0; b < nb; b++) dy[8 * b + t] = yv[t][b].d;
            }
            for (int t = T; t < A6G_T; t++)
                for (int64_t b = 0; b < nb; b++) dy[8 * b + t] = 0;
            for (int64_t i = i0; i < i1; i++) {
                const cm_block_q6_k *xr = (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)i * w_stride);
                float out[A6G_T];
                switch (T) { /* a constant T keeps the tile in registers */
                case 8: a6g_row(nb, xr, yv, dy, 8, out); break;
                case 7: a6g_row(nb, xr, yv, dy, 7, out); break;
                case 6: a6g_row(nb, xr, yv, dy, 6, out); break;
                case 5: a6g_row(nb, xr, yv, dy, 5, out); break;
                case 4: a6g_row(nb, xr, yv, dy, 4, out); break;
                case 3: a6g_row(nb, xr, yv, dy, 3, out); break;
                case 2: a6g_row(nb, xr, yv, dy, 2, out); break;
                default: a6g_row(nb, xr, yv, dy, 1, out); break;
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
