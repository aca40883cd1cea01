/*
 * avx2_gemv.h: the AVX2 table's own f16 decode gemvs (one token) and f16 /
 * bf16 prompt gemms. Not a header in the usual sense: kernels_avx2.c
 * includes it once, after x86_tiles.h, under the AVX2 flags; it registers
 * them in the avx2 table only (the avx512 table has its own vec_dots, which
 * these would not match). Nothing else may include it. Never allocates.
 * (The table's q6_k kernels: avx2_q6k.h.)
 */

/* ---- f16: tile_f16's bits (x86_tiles.h, tiles.h's CM_TILE_FLOAT) ----
 * Per (row, token) the tile's two chains (elements i..i+7 and i+8..i+15 of
 * each step of 16, an FMA each), hsum8 of their sum, then the tail element
 * by element. The F16 tokens are converted to f32 once per call (gemv, below)
 * or once per block of rows and group of tokens (gemm) instead of in every
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

/* ---- the prompt gemm over packed panels (gemm_af16 from FP_MINT tokens) ----
 * The same float operations per (row, token) as fa_rows (tile_f16's two
 * chains in ascending step order, HSUM8X2, the scalar tail), from operands
 * laid out so that the register tile reads one sequential stream each:
 * - the tokens of a pass converted to f32 once per call, by group of FP_T:
 *   chain 0's steps, then chain 1's, each step's 8 elements of the group's
 *   FP_T tokens side by side (missing tokens of the last group are zeros);
 * - each block of FP_RB rows copied (f16, no arithmetic) by pair of rows:
 *   per chain and segment of FP_SEG steps, every pair's steps one after the
 *   other, each step the pair's two 8-element halves side by side (a
 *   missing last row is zeros).
 * The 2 x 6 tile then walks a segment of one chain: the group's tokens (12
 * KiB) stay in L1 while the block's weights (every pair's, contiguous)
 * stream from L2. Walking the file's rows and tokens in place (fa_rows, 2 + 3
 * streams 4-8 KiB apart) ran 27-30 GMAC/s against 46 for the same tile in
 * L1 (session 20). Results of padded rows and tokens are never stored. */
enum {
    FP_T = 6,                /* tokens per register tile */
    FP_RB = 32,              /* rows per packed block */
    FP_SEG = 64,             /* steps of one chain per segment */
    FP_MAXK = 8192,          /* longer rows: fa_rows */
    FP_YF = 2048 * 1024 / 4, /* floats of packed tokens per pass at most (read segment by segment: L2 or L3) */
    FP_MINT = 12,            /* fewer tokens: fa_rows (8 tokens: 0.65x in the panels) */
    FP_WF = 64 * 1024,       /* floats of a block's pairs converted to f32 (gemm_pf16; half of a Zen 1 L2) */
};

/* n steps of one chain of a row pair (wp: per step rows 0, 1's 8 elements,
 * fp16, or f32 when w32) x FP_T tokens (yp: per step FP_T vectors), lanes
 * carried in st[2 * FP_T] (row r, token t: st[r * FP_T + t]). */
AI void fp_tile(const void *wp, bool w32, const float *yp, int64_t n, __m256 *st, int T) {
    __m256 a0[FP_T], a1[FP_T]; /* rows 0 and 1 (the first T tokens) */
    _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
        a0[t] = st[t];
        a1[t] = st[FP_T + t];
    }
    for (int64_t m = 0; m < n; m++) {
        const __m256 w0 = w32 ? _mm256_load_ps((const float *)wp + 16 * m) : ld_f16(wp, 16 * m);
        const __m256 w1 = w32 ? _mm256_load_ps((const float *)wp + 16 * m + 8) : ld_f16(wp, 16 * m + 8);
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
            __m256 v = _mm256_load_ps(yp + (FP_T * m + t) * 8);
            __asm__("" : "+x"(v)); /* one load for both rows (not a memory operand of each FMA) */
            a0[t] = _mm256_fmadd_ps(w0, v, a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, v, a1[t]);
        }
    }
    _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
        st[t] = a0[t];
        st[FP_T + t] = a1[t];
    }
}

/* Rows [r0, r1) (at most FP_RB) into the block panel wp (ns steps of 16). */
AI void fp_pack_rows(const void *w, size_t w_stride, int64_t r0, int64_t r1, int64_t ns, cm_f16 *wp) {
    const int64_t np = (r1 - r0 + 1) / 2;
    for (int64_t p = 0; p < np; p++)
        for (int r = 0; r < 2; r++) {
            const int64_t i = r0 + 2 * p + r;
            const cm_f16 *x = (const cm_f16 *)(const void *)((const char *)w + (size_t)i * w_stride);
            for (int h = 0; h < 2; h++)
                for (int64_t s0 = 0; s0 < ns; s0 += FP_SEG) {
                    const int64_t sn = ns - s0 < FP_SEG ? ns - s0 : FP_SEG;
                    cm_f16 *d = wp + (size_t)(h * np * ns * 16 + s0 * np * 16 + p * sn * 16 + 8 * r);
                    if (i < r1)
                        for (int64_t m = 0; m < sn; m++)
                            _mm_storeu_si128(
                                (__m128i *)(void *)(d + 16 * m),
                                _mm_loadu_si128((const __m128i *)(const void *)(x + 16 * (s0 + m) + 8 * h)));
                    else
                        for (int64_t m = 0; m < sn; m++)
                            _mm_storeu_si128((__m128i *)(void *)(d + 16 * m), _mm_setzero_si128());
                }
        }
}

/* Tokens [j0, j0 + nt) of x (fp16) into yf as f32, by group of FP_T (the
 * layout above; 2 * ns * 8 * FP_T floats per group; missing tokens zeros). */
AI void fp_pack_toks(const void *x, size_t x_stride, int64_t j0, int64_t nt, int64_t ns, float *yf) {
    const int64_t ng = (nt + FP_T - 1) / FP_T, gs = 2 * ns * 8 * FP_T;
    for (int64_t t = 0; t < ng * FP_T; t++) {
        const cm_f16 *yr = (const cm_f16 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
        float *d = yf + (t / FP_T) * gs + (t % FP_T) * 8;
        for (int h = 0; h < 2; h++)
            for (int64_t m = 0; m < ns; m++)
                _mm256_store_ps(d + (h * ns + m) * 8 * FP_T, t < nt ? ld_f16(yr, 16 * m + 8 * h) : _mm256_setzero_ps());
    }
}

static void gemm_af16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t kf = k & ~(int64_t)15, ns = kf / 16; /* steps of 16 */
    if (k > FA_MAXK) {
        gemm_f16(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    if (n_tok < FP_MINT || k > FP_MAXK || ns == 0) {
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
        return;
    }
    /* 2.5 MiB of stack (compute threads have CM_COMPUTE_STACK, 8 MiB) */
    _Alignas(32) float yf[FP_YF];                   /* the pass's tokens, by group */
    _Alignas(32) cm_f16 wp[FP_RB * FP_MAXK];        /* the block's rows, by pair */
    _Alignas(32) __m256 st[FP_RB / 2][2][2 * FP_T]; /* per pair and chain */
    const int64_t gs = 2 * ns * 8 * FP_T;           /* floats per group */
    const int64_t gmax = FP_YF / gs;                /* groups per pass (k <= FP_MAXK: >= 5) */
    const int64_t npass = (n_tok + gmax * FP_T - 1) / (gmax * FP_T);
    /* passes of equal size (a pass packs the rows again) */
    const int64_t cap = ((n_tok + npass - 1) / npass + FP_T - 1) / FP_T * FP_T;
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap, ng = (nt + FP_T - 1) / FP_T;
        fp_pack_toks(x, x_stride, j0, nt, ns, yf);
        for (int64_t i0 = r0; i0 < r1; i0 += FP_RB) {
            const int64_t i1 = r1 - i0 < FP_RB ? r1 : i0 + FP_RB, np = (i1 - i0 + 1) / 2;
            fp_pack_rows(w, w_stride, i0, i1, ns, wp);
            /* the next block's rows into L2 meanwhile, a few lines per segment (rows adjacent, as in a GGUF) */
            const char *pf = (const char *)w + (size_t)i1 * w_stride;
            const size_t pfb = i1 < r1 ? (size_t)(r1 - i1 < FP_RB ? r1 - i1 : FP_RB) * w_stride : 0;
            const size_t pstep = (pfb / (size_t)(2 * ng * ((ns + FP_SEG - 1) / FP_SEG)) + 64) & ~(size_t)63;
            size_t po = 0;
            for (int64_t g = 0; g < ng; g++) {
                const float *yg = yf + g * gs;
                memset(st, 0, sizeof st);
                for (int h = 0; h < 2; h++)
                    for (int64_t s0 = 0; s0 < ns; s0 += FP_SEG) {
                        const int64_t sn = ns - s0 < FP_SEG ? ns - s0 : FP_SEG;
                        const cm_f16 *ws = wp + (size_t)(h * np * ns * 16 + s0 * np * 16);
                        const float *ys = yg + (h * ns + s0) * 8 * FP_T;
                        for (const size_t pe = po + pstep; po < pe && po < pfb; po += 64)
                            _mm_prefetch(pf + po, _MM_HINT_T1);
                        for (int64_t p = 0; p < np; p++) fp_tile(ws + p * sn * 16, false, ys, sn, st[p][h], FP_T);
                    }
                const int T = nt - g * FP_T < FP_T ? (int)(nt - g * FP_T) : FP_T;
                for (int64_t i = i0; i < i1; i++) {
                    const int64_t p = (i - i0) / 2, r = (i - i0) % 2;
                    const cm_f16 *xr = (const cm_f16 *)(const void *)((const char *)w + (size_t)i * w_stride);
                    for (int t = 0; t < T; t++) {
                        const int64_t j = j0 + g * FP_T + t;
                        const cm_f16 *yr = (const cm_f16 *)(const void *)((const char *)x + (size_t)j * x_stride);
                        float s = HSUM8X2(st[p][0][r * FP_T + t], st[p][1][r * FP_T + t]);
                        for (int64_t e = kf; e < k; e++) s += sc_f16(xr, e) * sc_f16(yr, e);
                        y[j * ldy + i] = s;
                    }
                }
            }
        }
    }
}

/* Decode: one row per pass (a single sequential stream, as the AVX-512
 * table's gemv_vf16), each row tile_f16's operations with T = 1 (the two
 * chains, HSUM8X2, the tail), prefetched FA_PFD bytes ahead: walking RB
 * rows span by span (fa_rows) read 32 streams at once and reached ~55-58% of
 * the read roofline. The token in f32 (converted once, exact) while it and a
 * row fit in half of L1 (avx512_gemv.h's GV_F16_F32K); past that in fp16, as
 * vec_dot. */
enum { FA_PFD = 2048, FA_F32K = 16384 / 6 };

/* One row x the token: yh, the token in fp16 (converted in the loop, as
 * vec_dot), else in f32 (converted once: the same values). */
AI float fa_gv_row(int64_t n, const cm_f16 *x, const void *y, bool yh) {
#define FA_LDY(i) (yh ? ld_f16(y, i) : ld_f32(y, i))
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) { /* two steps of tile_f16 per 64-byte line */
        _mm_prefetch((const char *)(x + i) + FA_PFD, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(ld_f16(x, i), FA_LDY(i), a0);
        a1 = _mm256_fmadd_ps(ld_f16(x, i + 8), FA_LDY(i + 8), a1);
        a0 = _mm256_fmadd_ps(ld_f16(x, i + 16), FA_LDY(i + 16), a0);
        a1 = _mm256_fmadd_ps(ld_f16(x, i + 24), FA_LDY(i + 24), a1);
    }
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(ld_f16(x, i), FA_LDY(i), a0);
        a1 = _mm256_fmadd_ps(ld_f16(x, i + 8), FA_LDY(i + 8), a1);
    }
#undef FA_LDY
    float s = HSUM8X2(a0, a1);
    for (; i < n; i++) s += sc_f16(x, i) * (yh ? sc_f16(y, i) : sc_f32(y, i));
    return s;
}

static void gemv_af16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
#define FA_GROW(i) ((const cm_f16 *)(const void *)((const char *)w + (size_t)(i)*w_stride))
    if (k > FA_F32K) {
        for (int64_t i = r0; i < r1; i++) y[i] = fa_gv_row(k, FA_GROW(i), x, true);
        return;
    }
    _Alignas(32) float yf[FA_F32K];
    fa_convert(k, x, yf);
    for (int64_t i = r0; i < r1; i++) y[i] = fa_gv_row(k, FA_GROW(i), yf, false);
#undef FA_GROW
}

/* ---- f16 over rows repacked at load ("f16 pairs", repack.c) ----
 * Row pair q of a copy (rows 2q and 2q + 1; w_stride is the row size, 2k
 * bytes) sits at w + 2q * w_stride: chain 0's ns = k / 16 steps (per step
 * row 2q's 8 elements then row 2q + 1's: the panel above, one pair), chain
 * 1's, then row 2q's k % 16 tail elements and row 2q + 1's. The prompt gemm
 * converts a block of pairs (FP_WF floats at most) to f32 in this layout once
 * per pass of tokens and walks that (the panel tile without its fp16
 * conversions: vcvtph2ps takes about two cycles of Zen 1's FMA pipes, so the
 * 2 x 6 tile ran 16 cycles per step instead of its 12 FMAs'; f32 exact, so
 * the same bits), the decode
 * gemv reads both rows of a pair at once (chain 0 and chain 1: two streams).
 * Each (row, token) is tile_f16's operations in its order (as gemm_af16 and
 * gemv_af16). A slice may start or end mid-pair: the pair is computed, the
 * row outside [r0, r1) not stored. Rows at most CM_REPACK_MAX_K long (the
 * token groups of a pass: 6k floats each, at least 2 per pass). */

/* fp_tile over f32 weights with a constant token count (a pass's last group) */
AI void fp_tile_rt(const float *wp, const float *yp, int64_t n, __m256 *st, int T) {
    switch (T) {
    case 6: fp_tile(wp, true, yp, n, st, 6); break;
    case 5: fp_tile(wp, true, yp, n, st, 5); break;
    case 4: fp_tile(wp, true, yp, n, st, 4); break;
    case 3: fp_tile(wp, true, yp, n, st, 3); break;
    case 2: fp_tile(wp, true, yp, n, st, 2); break;
    default: fp_tile(wp, true, yp, n, st, 1); break;
    }
}

#define FQ_PAIR(q) ((const cm_f16 *)(const void *)((const char *)w + (size_t)(2 * (q)) * w_stride))

/* Few tokens (< FP_MINT): per pair both chains at once for T <= FQ_T tokens
 * (f32, k apart in yf), 4T accumulators, one pass over the pair (as
 * gemv_pf16); blocks of pairs that stay in L2 for every group of tokens.
 * (The panels at 4 tokens: 0.88x of fa_rows on the file's rows.) */
enum { FQ_T = 3, FQ_BLK = 256 * 1024 /* bytes of pairs per block */ };

AI void fq_pair(int64_t k, const cm_f16 *c0, const float *yf, int T, const cm_f16 *const *yh, float *out) {
    const int64_t kf = k & ~(int64_t)15, ns = kf / 16, kt = k - kf;
    const cm_f16 *c1 = c0 + 16 * ns;
    __m256 a[2][2][FQ_T]; /* row, chain, token */
    _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) a[0][0][t] = a[0][1][t] = a[1][0][t] = a[1][1][t] =
        _mm256_setzero_ps();
    for (int64_t m = 0; m < ns; m++) {
        const __m256 w00 = ld_f16(c0, 16 * m), w10 = ld_f16(c0, 16 * m + 8);
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) {
            __m256 v = ld_f32(yf + t * k, 16 * m);
            __asm__("" : "+x"(v));
            a[0][0][t] = _mm256_fmadd_ps(w00, v, a[0][0][t]);
            a[1][0][t] = _mm256_fmadd_ps(w10, v, a[1][0][t]);
        }
        const __m256 w01 = ld_f16(c1, 16 * m), w11 = ld_f16(c1, 16 * m + 8);
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) {
            __m256 v = ld_f32(yf + t * k, 16 * m + 8);
            __asm__("" : "+x"(v));
            a[0][1][t] = _mm256_fmadd_ps(w01, v, a[0][1][t]);
            a[1][1][t] = _mm256_fmadd_ps(w11, v, a[1][1][t]);
        }
    }
    const cm_f16 *tl = c0 + 2 * kf;
    _Pragma("GCC unroll 3") for (int t = 0; t < T; t++) for (int r = 0; r < 2; r++) {
        float s = HSUM8X2(a[r][0][t], a[r][1][t]);
        for (int64_t e = kf; e < k; e++) s += sc_f16(tl + r * kt, e - kf) * sc_f16(yh[t], e);
        out[2 * t + r] = s;
    }
}

static void fq_small(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    _Alignas(32) float yf[FQ_T * CM_REPACK_MAX_K];
    const int64_t q0 = r0 / 2, q1 = (r1 + 1) / 2;
    int64_t bp = FQ_BLK / (int64_t)(2 * w_stride);
    if (bp < 1) bp = 1;
    for (int64_t b0 = q0; b0 < q1; b0 += bp) {
        const int64_t b1 = q1 - b0 < bp ? q1 : b0 + bp;
        for (int64_t j = 0; j < n_tok; j += FQ_T) {
            const int T = n_tok - j < FQ_T ? (int)(n_tok - j) : FQ_T;
            const cm_f16 *yh[FQ_T];
            for (int t = 0; t < T; t++) {
                yh[t] = (const cm_f16 *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
                fa_convert(k, yh[t], yf + t * k);
            }
            for (int64_t q = b0; q < b1; q++) {
                float out[2 * FQ_T];
                switch (T) { /* a constant T keeps the chains in registers */
                case 3: fq_pair(k, FQ_PAIR(q), yf, 3, yh, out); break;
                case 2: fq_pair(k, FQ_PAIR(q), yf, 2, yh, out); break;
                default: fq_pair(k, FQ_PAIR(q), yf, 1, yh, out); break;
                }
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < 2; r++)
                        if (2 * q + r >= r0 && 2 * q + r < r1) y[(j + t) * ldy + 2 * q + r] = out[2 * t + r];
            }
        }
    }
}

static void gemm_pf16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t kf = k & ~(int64_t)15, ns = kf / 16, kt = k - kf;
    CM_ASSERT(ns > 0 && k <= CM_REPACK_MAX_K);
    if (n_tok < FP_MINT) {
        fq_small(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    /* 2.25 MiB of stack (compute threads have CM_COMPUTE_STACK, 8 MiB) */
    _Alignas(32) float yf[FP_YF];                   /* the pass's tokens, by group */
    _Alignas(32) float wf[FP_WF];                   /* the block's pairs as f32 */
    _Alignas(32) __m256 st[FP_RB / 2][2][2 * FP_T]; /* per pair and chain */
    const int64_t gs = 2 * ns * 8 * FP_T, gmax = FP_YF / gs;
    const int64_t npass = (n_tok + gmax * FP_T - 1) / (gmax * FP_T);
    const int64_t cap = ((n_tok + npass - 1) / npass + FP_T - 1) / FP_T * FP_T;
    const int64_t q0 = r0 / 2, q1 = (r1 + 1) / 2, pw = 32 * ns; /* f32 per pair */
    const int64_t bp = FP_WF / pw < 1 ? 1 : FP_WF / pw > FP_RB / 2 ? FP_RB / 2 : FP_WF / pw;
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap, ng = (nt + FP_T - 1) / FP_T;
        fp_pack_toks(x, x_stride, j0, nt, ns, yf);
        for (int64_t b0 = q0; b0 < q1; b0 += bp) {
            const int64_t b1 = q1 - b0 < bp ? q1 : b0 + bp, np = b1 - b0;
            for (int64_t p = 0; p < np; p++) /* both chains of each pair, converted once for every group */
                for (int64_t e = 0; e < pw; e += 8) _mm256_store_ps(wf + p * pw + e, ld_f16(FQ_PAIR(b0 + p), e));
            /* the next block's pairs into L2 meanwhile, a few lines per segment */
            const char *pf = (const char *)FQ_PAIR(b1);
            const size_t pfb = (size_t)(q1 - b1 < bp ? q1 - b1 : bp) * 2 * w_stride;
            const size_t pstep = (pfb / (size_t)(2 * ng * ((ns + FP_SEG - 1) / FP_SEG)) + 64) & ~(size_t)63;
            size_t po = 0;
            for (int64_t g = 0; g < ng; g++) {
                const float *yg = yf + g * gs;
                const int T = nt - g * FP_T < FP_T ? (int)(nt - g * FP_T) : FP_T;
                memset(st, 0, sizeof st);
                for (int h = 0; h < 2; h++)
                    for (int64_t s0 = 0; s0 < ns; s0 += FP_SEG) {
                        const int64_t sn = ns - s0 < FP_SEG ? ns - s0 : FP_SEG;
                        const float *ys = yg + (h * ns + s0) * 8 * FP_T;
                        for (const size_t pe = po + pstep; po < pe && po < pfb; po += 64)
                            _mm_prefetch(pf + po, _MM_HINT_T1);
                        for (int64_t p = 0; p < np; p++)
                            fp_tile_rt(wf + p * pw + (h * ns + s0) * 16, ys, sn, st[p][h], T);
                    }
                for (int64_t p = 0; p < np; p++)
                    for (int r = 0; r < 2; r++) {
                        const int64_t i = 2 * (b0 + p) + r;
                        if (i < r0 || i >= r1) continue;
                        const cm_f16 *tl = FQ_PAIR(b0 + p) + 2 * kf + r * kt;
                        for (int t = 0; t < T; t++) {
                            const int64_t j = j0 + g * FP_T + t;
                            const cm_f16 *yr = (const cm_f16 *)(const void *)((const char *)x + (size_t)j * x_stride);
                            float s = HSUM8X2(st[p][0][r * FP_T + t], st[p][1][r * FP_T + t]);
                            for (int64_t e = kf; e < k; e++) s += sc_f16(tl, e - kf) * sc_f16(yr, e);
                            y[j * ldy + i] = s;
                        }
                    }
            }
        }
    }
}

/* Decode over pairs: per pair the two rows' chains (4 accumulators), the
 * token in f32 while it fits as in gemv_af16 (else fp16: the same values),
 * each chain's stream prefetched FA_PFD bytes ahead (into the next pair's
 * same chain past its end). fq_gv_pairs is instantiated for each yh (a
 * constant: no test of it inside the loop; GCC -O2 does not unswitch). */
AI void fq_gv_pairs(int64_t k, const void *w, size_t w_stride, const void *x, const void *yv, bool yh, float *y,
                    int64_t r0, int64_t r1) {
    const int64_t kf = k & ~(int64_t)15, ns = kf / 16, kt = k - kf, cb = 32 * ns; /* bytes per chain */
#define FQ_LDY(i) (yh ? ld_f16(yv, i) : ld_f32(yv, i))
    for (int64_t q = r0 / 2; q < (r1 + 1) / 2; q++) {
        const cm_f16 *c0 = FQ_PAIR(q), *c1 = c0 + 16 * ns;
        const char *p0 = (const char *)c0, *p1 = (const char *)c1, *n0 = p0 + 2 * w_stride, *n1 = p1 + 2 * w_stride;
        __m256 a00 = _mm256_setzero_ps(), a01 = _mm256_setzero_ps(); /* row 2q: chains 0, 1 */
        __m256 a10 = _mm256_setzero_ps(), a11 = _mm256_setzero_ps(); /* row 2q + 1 */
        int64_t m = 0;
        for (; m + 2 <= ns; m += 2) { /* one 64-byte line of each chain */
            const int64_t o = 32 * m + FA_PFD;
            _mm_prefetch(o < cb ? p0 + o : n0 + (o - cb), _MM_HINT_T0);
            _mm_prefetch(o < cb ? p1 + o : n1 + (o - cb), _MM_HINT_T0);
            _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
                const int64_t e = 16 * (m + u);
                const __m256 v0 = FQ_LDY(e), v1 = FQ_LDY(e + 8);
                a00 = _mm256_fmadd_ps(ld_f16(c0, e), v0, a00);
                a10 = _mm256_fmadd_ps(ld_f16(c0, e + 8), v0, a10);
                a01 = _mm256_fmadd_ps(ld_f16(c1, e), v1, a01);
                a11 = _mm256_fmadd_ps(ld_f16(c1, e + 8), v1, a11);
            }
        }
        for (; m < ns; m++) {
            const int64_t e = 16 * m;
            const __m256 v0 = FQ_LDY(e), v1 = FQ_LDY(e + 8);
            a00 = _mm256_fmadd_ps(ld_f16(c0, e), v0, a00);
            a10 = _mm256_fmadd_ps(ld_f16(c0, e + 8), v0, a10);
            a01 = _mm256_fmadd_ps(ld_f16(c1, e), v1, a01);
            a11 = _mm256_fmadd_ps(ld_f16(c1, e + 8), v1, a11);
        }
        const cm_f16 *tl = c0 + 2 * kf;
        if (2 * q >= r0) {
            float s = HSUM8X2(a00, a01);
            for (int64_t e = kf; e < k; e++) s += sc_f16(tl, e - kf) * sc_f16(x, e);
            y[2 * q] = s;
        }
        if (2 * q + 1 < r1) {
            float s = HSUM8X2(a10, a11);
            for (int64_t e = kf; e < k; e++) s += sc_f16(tl + kt, e - kf) * sc_f16(x, e);
            y[2 * q + 1] = s;
        }
    }
#undef FQ_LDY
}

static void gemv_pf16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    if (k > FA_F32K) {
        fq_gv_pairs(k, w, w_stride, x, x, true, y, r0, r1);
        return;
    }
    _Alignas(32) float yf[FA_F32K];
    fa_convert(k, x, yf);
    fq_gv_pairs(k, w, w_stride, x, yf, false, y, r0, r1);
}
#undef FQ_PAIR

/* ---- bf16 prompt gemm: tile_bf16's bits (x86_tiles.h) ----
 * Per (row, token) tile_bf16's four 8-lane chains (chain c: elements 64s +
 * 16c .. + 15 of each step s of 64; per lane the odd element's product then
 * the even one's, each an FMA), folded (1 + 3) + (0 + 2), hsum8, then the
 * tail element by element. The tokens' halves are split into f32 once per
 * block of rows and group of tokens (exact: a bf16 is the top half of its
 * f32) instead of in every tile: tile_bf16 spent 2 integer operations per
 * token and 16 elements beside its 2 FMAs, on the FMA ports. BA_R rows x
 * BA_T tokens share each load, one chain at a time, over spans of BA_KC
 * elements that keep the group's tokens in L1 while the block's rows sit in
 * L2 (as fa_rows). */
enum { BA_R = 2, BA_T = 4, BA_KC = 1024, BA_MAXK = 16384, BA_RB = 32 };

/* The first k64 elements of a bf16 token: per 16 elements the odd ones' f32
 * (8) then the even ones' (8), at o + the element index. */
AI void ba_split(int64_t k64, const cm_bf16 *y, float *o) {
    for (int64_t i = 0; i < k64; i += 16) {
        const __m256i v = ld256(y + i);
        _mm256_store_ps(o + i, bf16_hi(v));
        _mm256_store_ps(o + i + 8, bf16_lo(v));
    }
}

/* Elements [s0, s1) (multiples of 64) of R rows x T split tokens (yf + t *
 * ys), chain c of row r and token t in st[(r * BA_T + t) * 4 + c]. */
AI void ba_span(const cm_bf16 *const *x, const float *yf, int64_t ys, int R, int T, int64_t s0, int64_t s1,
                __m256 *st) {
    _Pragma("GCC unroll 1") for (int c = 0; c < 4; c++) {
        __m256 a[BA_R][BA_T];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            a[r][t] = st[(r * BA_T + t) * 4 + c];
        for (int64_t i = s0 + 16 * c; i < s1; i += 64) {
            __m256 wh[BA_R], wl[BA_R];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const __m256i v = ld256(x[r] + i);
                wh[r] = bf16_hi(v);
                wl[r] = bf16_lo(v);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                __m256 vh = _mm256_load_ps(yf + t * ys + i), vl = _mm256_load_ps(yf + t * ys + i + 8);
                __asm__("" : "+x"(vh), "+x"(vl)); /* one load for all rows */
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    a[r][t] = _mm256_fmadd_ps(wh[r], vh, a[r][t]);
                    a[r][t] = _mm256_fmadd_ps(wl[r], vl, a[r][t]);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            st[(r * BA_T + t) * 4 + c] = a[r][t];
    }
}

AI void ba_span_rt(const cm_bf16 *const *x, const float *yf, int64_t ys, int R, int T, int64_t s0, int64_t s1,
                   __m256 *st) {
    if (R == BA_R) {
        switch (T) { /* a constant shape keeps the chains in registers */
        case 4: ba_span(x, yf, ys, BA_R, 4, s0, s1, st); break;
        case 3: ba_span(x, yf, ys, BA_R, 3, s0, s1, st); break;
        case 2: ba_span(x, yf, ys, BA_R, 2, s0, s1, st); break;
        default: ba_span(x, yf, ys, BA_R, 1, s0, s1, st); break;
        }
    } else {
        switch (T) {
        case 4: ba_span(x, yf, ys, 1, 4, s0, s1, st); break;
        case 3: ba_span(x, yf, ys, 1, 3, s0, s1, st); break;
        case 2: ba_span(x, yf, ys, 1, 2, s0, s1, st); break;
        default: ba_span(x, yf, ys, 1, 1, s0, s1, st); break;
        }
    }
}

static void gemm_abf16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (k > BA_MAXK) {
        gemm_bf16(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    const int64_t k64 = k & ~(int64_t)63;
    _Alignas(32) float yf[BA_T * BA_MAXK];
    _Alignas(32) __m256 st[BA_RB * BA_T * 4];
#define BA_ROW(i) ((const cm_bf16 *)(const void *)((const char *)w + (size_t)(i)*w_stride))
    for (int64_t i0 = r0; i0 < r1; i0 += BA_RB) {
        const int64_t i1 = r1 - i0 < BA_RB ? r1 : i0 + BA_RB;
        for (int64_t j = 0; j < n_tok; j += BA_T) {
            const int T = n_tok - j < BA_T ? (int)(n_tok - j) : BA_T;
            const cm_bf16 *yv[BA_T];
            for (int t = 0; t < T; t++) {
                yv[t] = (const cm_bf16 *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
                ba_split(k64, yv[t], yf + t * k64);
            }
            memset(st, 0, sizeof st);
            for (int64_t c0 = 0; c0 < k64; c0 += BA_KC) {
                const int64_t c1 = k64 - c0 < BA_KC ? k64 : c0 + BA_KC;
                int64_t i = i0;
                for (; i + BA_R <= i1; i += BA_R) {
                    const cm_bf16 *xr[BA_R] = {BA_ROW(i), BA_ROW(i + 1)};
                    ba_span_rt(xr, yf, k64, BA_R, T, c0, c1, st + (i - i0) * BA_T * 4);
                }
                if (i < i1) {
                    const cm_bf16 *xr[1] = {BA_ROW(i)};
                    ba_span_rt(xr, yf, k64, 1, T, c0, c1, st + (i - i0) * BA_T * 4);
                }
            }
            for (int64_t i = i0; i < i1; i++) {
                for (int t = 0; t < T; t++) {
                    const __m256 *a = st + (i - i0) * BA_T * 4 + t * 4;
                    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a[1], a[3]), _mm256_add_ps(a[0], a[2])));
                    for (int64_t e = k64; e < k; e++) s += sc_bf16(BA_ROW(i), e) * sc_bf16(yv[t], e);
                    y[(j + t) * ldy + i] = s;
                }
            }
        }
    }
#undef BA_ROW
}
