/*
 * avx2_q6k.h: the AVX2 table's own q6_k decode gemvs and prompt gemms, over
 * the file's bytes and over its "q6_k pairs" copy. Not a header in the usual
 * sense: kernels_avx2.c includes it once, after x86_tiles.h, under the AVX2
 * flags; it registers them in the avx2 table only (the avx512 table has its
 * own vec_dots, which these would not match). Nothing else may include it.
 * Never allocates.
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
 *
 * gemv_p6_k / gemm_p6_k: the same bits over rows repacked at load ("q6_k
 * pairs", repack.c: the avx2 table's own q6_k layout), where values come
 * paired and mostly unmasked: about 5 operations per 32 weights (below).
 */

enum { A6_MAXB = CM_REPACK_MAX_K / CM_QK_K };

/* The token's bytes of one group of 32 values, aligned, beside their pair
 * offsets maddubs(32, y) (one 64-byte line). */
typedef struct {
    __m256i y, off;
} a6_tok;

AI void a6_prep(int64_t nb, const cm_block_q8_k *y, a6_tok *t) {
    const __m256i k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++)
        for (int g = 0; g < 8; g++) {
            const __m256i v = ld256(y[b].qs + 32 * g);
            t[8 * b + g].y = v;
            t[8 * b + g].off = _mm256_maddubs_epi16(k32, v);
        }
}

AI float a6_row(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *y, const a6_tok *tk) {
    /* within each 128-bit half of a scale vector (8 words: scales 8c..8c+7),
     * the low half picks scale 2k's word, the high half scale 2k + 1's */
    const __m256i pick[4] = {_mm256_set_m128i(_mm_set1_epi16(0x0302), _mm_set1_epi16(0x0100)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0706), _mm_set1_epi16(0x0504)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0b0a), _mm_set1_epi16(0x0908)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0f0e), _mm_set1_epi16(0x0d0c))};
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        /* the block's 4 lines A2_PFD bytes on */
        _Pragma("GCC unroll 4") for (int o = 0; o < (int)sizeof(cm_block_q6_k); o += 64)
            _mm_prefetch((const char *)&x[b] + A2_PFD + o, _MM_HINT_T0);
        /* scales 8c..8c+7 as int16 in both halves: a 64-bit sign extension
         * and an insert each (no vperm2i128: 8 µops on Zen 1) */
        __m256i scs[2];
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            const __m128i s8 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(x[b].scales + 8 * c)));
            scs[c] = _mm256_set_m128i(s8, s8);
        }
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            const __m256i sc = scs[c];
            __m256i q[4];
            q6_vals(&x[b], c, q);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const a6_tok *t = &tk[8 * b + 4 * c + k];
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], t->y), t->off);
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
    a6_tok tk[A6_MAXB * 8];
    a6_prep(nb, x, tk);
    for (int64_t i = r0; i < r1; i++)
        y[i] = a6_row(nb, (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)i * w_stride), x, tk);
}

/* ---- q6_k prefill: tile_q6_k's integer lanes (the sign trick's, pair
 * scales as a6_row shuffles them) for up to A6G_T tokens per pass over a
 * row; each (row, token) gets the tile's bits (vec_dot's). The lanes are
 * exact, and computed another way: with the token's bytes made unsigned (y +
 * 128, once per group of tokens, a6g_toks) and the values signed (q - 32),
 * maddubs(y + 128, q - 32) is per pair sum (y q') + 128 sum q' (|pair| <= 2 *
 * 255 * 32: nothing saturates; Q8_K bytes are never -128, so the tile's sign
 * trick is exact too), and the row's 128 sum q' terms, scaled like the
 * products, are taken off once per super-block for all tokens. Two groups of
 * 32 values (2p, 2p + 1: the token's bytes 64p..) are paired by 16-bit units
 * as avx2_krepack.h's ak_pair does (values at unpacking, token bytes once per
 * group of tokens), so maddubs + maddubs (int16: 4 products of one group and
 * scale per word, in [-32 * 255 * 4, 31 * 255 * 4], inside int16) and one
 * madd with both groups' pair scales give each lane both groups' terms: per
 * 64 weights and token two maddubs, an add, a madd and an add. A block of
 * rows is unpacked once (a6g_blk: paired values, pair scales, offset) for
 * every group of tokens, so a row pass is those operations and the
 * super-block's conversion and FMA per token. Rows in blocks of at most
 * A6G_RB (in L2) against every group of tokens (in L1). ---- */
enum { A6G_T = 8, A6G_RB = 128, A6G_CB = 1024 /* (row, super-block)s unpacked at once */ };

/* Part `part` of `parts` of the bytes [lo, hi) asked into L2: the next block
 * of rows of a prefill gemm, spread over the current block's groups of
 * tokens, so that its unpacking finds them there instead of in DRAM. */
static inline void a6g_pf(const char *lo, const char *hi, int64_t part, int64_t parts) {
    const int64_t n = hi - lo;
    for (int64_t o = n * part / parts & ~(int64_t)63; o < n * (part + 1) / parts; o += 64)
        _mm_prefetch(lo + o, _MM_HINT_T1);
}

/* Two vectors of 32 bytes (a pair of groups of 32: values or token bytes) by
 * 16-bit units: o[0] the low unit of each dword of a and of b, o[1] the high
 * ones (avx2_krepack.h's ak_pair). */
AI void a6g_pair(__m256i a, __m256i b, __m256i *o) {
    o[0] = _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xaa);
    o[1] = _mm256_blend_epi16(_mm256_srli_epi32(a, 16), b, 0xaa);
}

typedef struct {
    uint8_t qs[A6_MAXB][A6G_T][CM_QK_K]; /* token t's bytes of super-block b, + 128, paired per 64 */
    float yd[A6_MAXB][A6G_T];            /* token t's d (0 past T) */
} a6g_toks;

/* One super-block of a row, unpacked: q[2p], q[2p + 1] the values q - 32 of
 * groups 2p and 2p + 1 (chunk p / 2's 32-value groups 2 (p % 2), + 1)
 * paired, sv[p] their pair scales (2p's in the even words), noff minus the
 * offset lanes, d the block's scale. */
typedef struct {
    __m256i q[8], sv[4], noff;
    float d;
} a6g_blk;

static void a6g_prep(int64_t nb, const cm_block_q8_k *const *yv, int T, a6g_toks *g) {
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++)
        for (int t = 0; t < A6G_T; t++) {
            g->yd[b][t] = t < T ? yv[t][b].d : 0.0f;
            if (t < T)
                for (int o = 0; o < CM_QK_K; o += 64) {
                    __m256i v[2];
                    a6g_pair(_mm256_xor_si256(ld256(yv[t][b].qs + o), k80),
                             _mm256_xor_si256(ld256(yv[t][b].qs + o + 32), k80), v);
                    _mm256_storeu_si256((__m256i *)(void *)(g->qs[b][t] + o), v[0]);
                    _mm256_storeu_si256((__m256i *)(void *)(g->qs[b][t] + o + 32), v[1]);
                }
        }
}

static void a6g_unpack(const cm_block_q6_k *x, a6g_blk *o) {
    const __m256i pick[4] = {_mm256_set_m128i(_mm_set1_epi16(0x0302), _mm_set1_epi16(0x0100)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0706), _mm_set1_epi16(0x0504)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0b0a), _mm_set1_epi16(0x0908)),
                             _mm256_set_m128i(_mm_set1_epi16(0x0f0e), _mm_set1_epi16(0x0d0c))};
    const __m256i k32 = _mm256_set1_epi8(32), k80 = _mm256_set1_epi8((char)0x80);
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x->scales));
    const __m256i scs[2] = {_mm256_permute2x128_si256(s16, s16, 0x00), _mm256_permute2x128_si256(s16, s16, 0x11)};
    __m256i off = _mm256_setzero_si256();
    for (int c = 0; c < 2; c++) {
        __m256i q[4], sv[4];
        q6_vals(x, c, q);
        for (int k = 0; k < 4; k++) {
            q[k] = _mm256_sub_epi8(q[k], k32);
            sv[k] = _mm256_shuffle_epi8(scs[c], pick[k]);
            off = _mm256_add_epi32(off, _mm256_madd_epi16(_mm256_maddubs_epi16(k80, q[k]), sv[k]));
        }
        for (int m = 0; m < 2; m++) {
            a6g_pair(q[2 * m], q[2 * m + 1], &o->q[4 * c + 2 * m]);
            o->sv[2 * c + m] = _mm256_blend_epi16(sv[2 * m], sv[2 * m + 1], 0xaa);
        }
    }
    o->noff = _mm256_sub_epi32(_mm256_setzero_si256(), off);
    o->d = f16f(x->d);
}

AI void a6g_row(int64_t nb, const a6g_blk *x, const a6g_toks *g, int T, float *out) {
    __m256 acc[A6G_T];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *yq = g->qs[b][0];
        __m256i sumi[A6G_T];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) sumi[t] = x[b].noff;
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m256i qa = x[b].q[2 * p], qb = x[b].q[2 * p + 1], sv = x[b].sv[p];
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const uint8_t *yy = yq + CM_QK_K * t + 64 * p;
                const __m256i s = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(ld256(yy), qa), _mm256_maddubs_epi16(ld256(yy + 32), qb)),
                    sv);
                sumi[t] = ax_keep(_mm256_add_epi32(sumi[t], s));
            }
        }
        float dy[A6G_T];
        _mm256_storeu_ps(dy, _mm256_mul_ps(_mm256_set1_ps(x[b].d), _mm256_loadu_ps(g->yd[b])));
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_broadcast_ss(&dy[t]), acc[t]);
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]);
}

/* ---- q6_k over "q6_k pairs" (repack.c; the avx2 table's layout): the
 * values come paired as a6g_pair pairs them (groups 2p, 2p + 1 by 16-bit
 * units), three of every four vectors need one mask and the fourth is
 * gathered from their top bits, the pair scales are one dword shuffle of
 * the 16 scales (evens then odds). The gemv: per pair p of a super-block
 * maddubs + maddubs against the token's paired bytes (a6p_tok), the pair
 * offsets 32 * (y) taken off once, one madd with both groups' scales:
 * tile_q6_k's integer lanes (exact: each word |v y + v' y'| * 2 <= 4 * 63 *
 * 128 wraps back into range after the offset, |sum (q - 32) y| over 4 <=
 * 16256), then its FMA per super-block and hsum8: vec_dot's bits. ---- */
enum { A6P_SC = 192, A6P_D = 208 };

/* The 8 paired value vectors (0..63) of super-block x. */
AI void a6p_vals(const uint8_t *x, __m256i v[8]) {
    const __m256i m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0c),
                  m30 = _mm256_set1_epi8(0x30);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m256i x0 = ld256(x + 96 * h), x1 = ld256(x + 96 * h + 32), x2 = ld256(x + 96 * h + 64);
        v[4 * h] = _mm256_and_si256(x0, m3f);
        v[4 * h + 1] = _mm256_and_si256(x1, m3f);
        v[4 * h + 2] = _mm256_and_si256(x2, m3f);
        v[4 * h + 3] = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x0, 6), m03),
                                                       _mm256_and_si256(_mm256_srli_epi16(x1, 4), m0c)),
                                       _mm256_and_si256(_mm256_srli_epi16(x2, 2), m30));
    }
}
/* Pair p's scales sv[p] (group 2p's in the even words, 2p + 1's in the odd
 * ones; scale 2g + 1 in the high half): the stored scales 0, 2, .., 14, 1,
 * 3, .., 15 as words (low half: evens), dword p of each half broadcast. */
AI void a6p_sv(const uint8_t *x, __m256i sv[4]) {
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(x + A6P_SC)));
    sv[0] = _mm256_shuffle_epi32(s, 0x00);
    sv[1] = _mm256_shuffle_epi32(s, 0x55);
    sv[2] = _mm256_shuffle_epi32(s, 0xaa);
    sv[3] = _mm256_shuffle_epi32(s, 0xff);
}

/* Super-block x ("q6_k pairs") as a6g_unpack gives the file's. */
static void a6g_unpack_p(const uint8_t *x, a6g_blk *o) {
    const __m256i k32 = _mm256_set1_epi8(32), k80 = _mm256_set1_epi8((char)0x80);
    __m256i v[8], off = _mm256_setzero_si256();
    a6p_vals(x, v);
    a6p_sv(x, o->sv);
    for (int p = 0; p < 4; p++) {
        o->q[2 * p] = _mm256_sub_epi8(v[2 * p], k32);
        o->q[2 * p + 1] = _mm256_sub_epi8(v[2 * p + 1], k32);
        const __m256i m =
            _mm256_add_epi16(_mm256_maddubs_epi16(k80, o->q[2 * p]), _mm256_maddubs_epi16(k80, o->q[2 * p + 1]));
        off = _mm256_add_epi32(off, _mm256_madd_epi16(m, o->sv[p]));
    }
    o->noff = _mm256_sub_epi32(_mm256_setzero_si256(), off);
    cm_f16 d;
    memcpy(&d, x + A6P_D, 2);
    o->d = f16f(d);
}

/* gemm_a6_k over the file's rows, or (packed) over "q6_k pairs" rows. */
AI void a6g_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                 int64_t r0, int64_t r1, int64_t n_tok, bool packed) {
    const int64_t nb = k / CM_QK_K;
    if (nb > A6_MAXB) { /* longer than any repacked row: vec_dot (the same bits) */
        CM_ASSERT(!packed);
        for (int64_t j = 0; j < n_tok; j++)
            for (int64_t i = r0; i < r1; i++)
                vec_dot_q6_k(k, &y[j * ldy + i], (const char *)w + (size_t)i * w_stride,
                             (const char *)x + (size_t)j * x_stride);
        return;
    }
    /* ~710 KiB at the longest rows (compute threads: CM_COMPUTE_STACK) */
    a6g_toks g;
    a6g_blk rows[A6G_CB];
    const int64_t rb = nb * A6G_RB <= A6G_CB ? A6G_RB : (nb > A6G_CB ? 1 : A6G_CB / nb);
    for (int64_t i0 = r0; i0 < r1; i0 += rb) {
        const int64_t i1 = r1 - i0 < rb ? r1 : i0 + rb;
        for (int64_t i = i0; i < i1; i++) {
            const char *xr = (const char *)w + (size_t)i * w_stride;
            for (int64_t b = 0; b < nb; b++) {
                if (packed)
                    a6g_unpack_p((const uint8_t *)xr + b * (int64_t)sizeof(cm_block_q6_k), &rows[(i - i0) * nb + b]);
                else a6g_unpack((const cm_block_q6_k *)(const void *)xr + b, &rows[(i - i0) * nb + b]);
            }
        }
        const int64_t i2 = r1 - i1 < rb ? r1 : i1 + rb, ng = (n_tok + A6G_T - 1) / A6G_T;
        for (int64_t j = 0; j < n_tok; j += A6G_T) {
            const int T = n_tok - j < A6G_T ? (int)(n_tok - j) : A6G_T;
            a6g_pf((const char *)w + (size_t)i1 * w_stride, (const char *)w + (size_t)i2 * w_stride, j / A6G_T, ng);
            const cm_block_q8_k *yv[A6G_T];
            for (int t = 0; t < T; t++)
                yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
            a6g_prep(nb, yv, T, &g);
            for (int64_t i = i0; i < i1; i++) {
                const a6g_blk *xr = &rows[(i - i0) * nb];
                float out[A6G_T];
                switch (T) { /* a constant T keeps the tile in registers */
                case 8: a6g_row(nb, xr, &g, 8, out); break;
                case 7: a6g_row(nb, xr, &g, 7, out); break;
                case 6: a6g_row(nb, xr, &g, 6, out); break;
                case 5: a6g_row(nb, xr, &g, 5, out); break;
                case 4: a6g_row(nb, xr, &g, 4, out); break;
                case 3: a6g_row(nb, xr, &g, 3, out); break;
                case 2: a6g_row(nb, xr, &g, 2, out); break;
                default: a6g_row(nb, xr, &g, 1, out); break;
                }
                for (int t = 0; t < T; t++) y[(j + t) * ldy + i] = out[t];
            }
        }
    }
}

static void gemm_a6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    a6g_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}
static void gemm_p6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    a6g_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

/* The token's bytes of pair p of a super-block, paired (a6g_pair), and its
 * pair offsets maddubs(32, y[0]) + maddubs(32, y[1]) (96 bytes). */
typedef struct {
    __m256i y[2], off;
} a6p_tok;

AI float a6p_row(int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const a6p_tok *tk) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, x += sizeof(cm_block_q6_k)) {
        _Pragma("GCC unroll 4") for (int o = 0; o < (int)sizeof(cm_block_q6_k); o += 64)
            _mm_prefetch((const char *)x + A2_PFD + o, _MM_HINT_T0);
        __m256i v[8], sv[4];
        a6p_vals(x, v);
        a6p_sv(x, sv);
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const a6p_tok *t = &tk[4 * b + p];
            const __m256i s16 = _mm256_sub_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(v[2 * p], t->y[0]), _mm256_maddubs_epi16(v[2 * p + 1], t->y[1])),
                t->off);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s16, sv[p]));
        }
        cm_f16 d;
        memcpy(&d, x + A6P_D, 2);
        FMA_BLOCK(acc, sumi, f16f(d) * y[b].d);
    }
    return hsum8(acc);
}

static void gemv_p6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= A6_MAXB);
    const cm_block_q8_k *yq = x;
    const __m256i k32 = _mm256_set1_epi8(32);
    a6p_tok tk[A6_MAXB * 4];
    for (int64_t b = 0; b < nb; b++)
        for (int p = 0; p < 4; p++) {
            a6p_tok *t = &tk[4 * b + p];
            a6g_pair(ld256(yq[b].qs + 64 * p), ld256(yq[b].qs + 64 * p + 32), t->y);
            t->off = _mm256_add_epi16(_mm256_maddubs_epi16(k32, t->y[0]), _mm256_maddubs_epi16(k32, t->y[1]));
        }
    for (int64_t i = r0; i < r1; i++) y[i] = a6p_row(nb, (const uint8_t *)w + (size_t)i * w_stride, yq, tk);
}
