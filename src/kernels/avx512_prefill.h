/*
 * avx512_prefill.h: the AVX-512 prefill gemms for q8_0, f16 and bf16 that keep the
 * one-token tiles' float order and still reuse each operand across a large
 * register tile. Not a header in the usual sense: kernels_avx512.c includes it
 * once, after its tiles and avx512_gemm.h, under its own ISA flags. Nothing
 * else may include it.
 *
 * The idea: a tile's float order is a set of independent accumulation chains
 * per (row, token) (q8_0: 4 chains of 8 lanes, block b into chain b mod 4;
 * f16: 2 chains of 16 lanes, the low and high halves of each 32 elements),
 * each fed in ascending element order, then one fixed reduction. A chain's
 * result does not depend on when the other chains run, so the gemm runs the
 * chains one after another ("chain-outer"): only one accumulator per (row,
 * token) is live, and the register tile grows from 2 x 4 to 4 x 4 (q8_0) or
 * 6 x 4 (f16), with every weight and activation vector loaded once per tile.
 * The chains' lanes are stored, and the tile's own reduction runs on them at
 * the end, so every (row, token) is bit-identical to vec_dot (kernels.h;
 * tests/unit/test_kernels_invariant.c).
 *
 * q8_0 (ztile_q8_0's order): per block and (row, token) one vpdpbusd on 8
 * lanes (weights as stored are the signed operand, y + 128 the unsigned one,
 * started from -128 * sum(x) per 4 bytes, which the row tile computes once),
 * one conversion and one FMA with the product dx * dy broadcast from a small
 * table the token tile fills 8 products per multiply: three vector operations
 * per 32 multiply-adds, where the 2 x 4 gemm spent a scale product per block
 * pair as well, and no token packing budget (the weights were streamed from
 * memory once per 9-26 tokens). Blocks past the last whole group of 8 go
 * through tile_q8_0, as in ztile_q8_0.
 * f16 (ztile_f16's order): weights converted to f32 once per row tile and
 * segment (reused by every token), activations once per call (reused by every
 * row); see the f16 section.
 *
 * q8_0 runs the 4 chains over one segment of QG_SEG blocks before the next
 * (each chain's lanes carried in memory across segments), so the tile's
 * weights, corrections, activations and scale products stay near L1 for long
 * rows too (ffn_down).
 *
 * Stack: ~180 KiB (q8_0) / ~1.1 MiB (f16) of tables at most; every thread
 * cumulo starts has the default 8 MiB. Rows longer than the tables (k >
 * 16384) use the earlier gemms. Never allocates.
 */

enum {
    QG_R = 4,               /* weight rows per register tile */
    QG_T = 4,               /* tokens per register tile */
    QG_MAXNB = 512,         /* blocks per row (k <= 16384) */
    QG_LD = QG_MAXNB + 16,  /* float stride of the tables (a cache line of padding: no set aliasing) */
    QG_DYF = 64 * 1024 / 4, /* floats of token scales per pass */
    QG_SEG = 64,            /* blocks per segment: all 4 chains run over one segment, then the next */
};

/* R rows x T tokens, all 4 chains in turn: lanes[r][t][c] = chain c's 8 lanes. */
AI void qg8_tile(int64_t b0, int64_t b1, const cm_block_q8_0 *const *x, const cm_block_q8_0 *const *yv,
                 const __m256i *corr, const float *dd, int R, int T, float (*lanes)[QG_T][4][8]) {
    const __m256i k128 = _mm256_set1_epi8((char)0x80);
    for (int c = 0; c < 4; c++) {
        __m256 acc[QG_R][QG_T];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            acc[r][t] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(lanes[r][t][c]);
        for (int64_t b = b0 + c; b < b1; b += 4) {
            __m256i xr[QG_R], cr[QG_R];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                xr[r] = ld256(x[r][b].qs);
                cr[r] = _mm256_load_si256(corr + (size_t)r * QG_LD + b);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const __m256i yu = _mm256_xor_si256(ld256(yv[t][b].qs), k128);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const __m256i s = _mm256_dpbusd_epi32(cr[r], yu, xr[r]);
                    acc[r][t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(s), _mm256_broadcast_ss(dd + (size_t)(r * QG_T + t) * QG_LD + b), acc[r][t]);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            _mm256_storeu_ps(lanes[r][t][c], acc[r][t]);
    }
}

static void gemm_qg8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK8_0, n8 = nb & ~(int64_t)7;
    if (n8 == 0 || nb > QG_MAXNB) {
        gemm_pq8_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) __m256i corr[QG_R * QG_LD]; /* -128 * sum(x) per 4 bytes, per row of the tile */
    _Alignas(64) float dxf[QG_R * QG_LD];
    _Alignas(64) float dd[QG_R * QG_T * QG_LD]; /* dx * dy per (row, token, block) */
    _Alignas(64) float dyf[QG_DYF];             /* dy per (token of the pass, block) */
    const int64_t cap = QG_DYF / n8;            /* tokens per pass */
    const __m256i k128 = _mm256_set1_epi8((char)0x80);
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;
        for (int64_t t = 0; t < nt; t++) {
            const cm_block_q8_0 *yb =
                (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
            for (int64_t b = 0; b < n8; b += 8) _mm256_store_ps(dyf + t * n8 + b, d8_q8_0(yb + b));
        }
        for (int64_t i = r0; i < r1; i += QG_R) {
            const int R = r1 - i < QG_R ? (int)(r1 - i) : QG_R;
            const cm_block_q8_0 *xr[QG_R];
            for (int r = 0; r < R; r++) {
                xr[r] = (const cm_block_q8_0 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
                for (int64_t b = 0; b < n8; b++)
                    corr[(size_t)r * QG_LD + b] = _mm256_sub_epi32(
                        _mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), k128, ld256(xr[r][b].qs)));
                for (int64_t b = 0; b < n8; b += 8) _mm256_store_ps(dxf + (size_t)r * QG_LD + b, d8_q8_0(xr[r] + b));
            }
            for (int64_t jj = 0; jj < nt; jj += QG_T) {
                const int T = nt - jj < QG_T ? (int)(nt - jj) : QG_T;
                const cm_block_q8_0 *yv[QG_T];
                for (int t = 0; t < T; t++) {
                    yv[t] = (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + jj + t) * x_stride);
                    for (int r = 0; r < R; r++)
                        for (int64_t b = 0; b < n8; b += 8)
                            _mm256_store_ps(dd + (size_t)(r * QG_T + t) * QG_LD + b,
                                            _mm256_mul_ps(_mm256_load_ps(dxf + (size_t)r * QG_LD + b),
                                                          _mm256_load_ps(dyf + (jj + t) * n8 + b)));
                }
                float lanes[QG_R][QG_T][4][8];
                for (int64_t b0 = 0; b0 < n8; b0 += QG_SEG) {
                    const int64_t b1 = n8 - b0 < QG_SEG ? n8 : b0 + QG_SEG;
                    if (R == QG_R && T == QG_T) qg8_tile(b0, b1, xr, yv, corr, dd, QG_R, QG_T, lanes);
                    else
                        for (int r = 0; r < R; r++) switch (T) {
                            case 4:
                                qg8_tile(b0, b1, xr + r, yv, corr + (size_t)r * QG_LD, dd + (size_t)r * QG_T * QG_LD, 1,
                                         4, lanes + r);
                                break;
                            case 3:
                                qg8_tile(b0, b1, xr + r, yv, corr + (size_t)r * QG_LD, dd + (size_t)r * QG_T * QG_LD, 1,
                                         3, lanes + r);
                                break;
                            case 2:
                                qg8_tile(b0, b1, xr + r, yv, corr + (size_t)r * QG_LD, dd + (size_t)r * QG_T * QG_LD, 1,
                                         2, lanes + r);
                                break;
                            default:
                                qg8_tile(b0, b1, xr + r, yv, corr + (size_t)r * QG_LD, dd + (size_t)r * QG_T * QG_LD, 1,
                                         1, lanes + r);
                                break;
                            }
                }
                for (int r = 0; r < R; r++) {
                    float tail[QG_T] = {0};
                    if (n8 < nb) {
                        const cm_block_q8_0 *yt[QG_T];
                        for (int t = 0; t < T; t++) yt[t] = yv[t] + n8;
                        tile_q8_0(nb - n8, xr[r] + n8, yt, T, tail);
                    }
                    for (int t = 0; t < T; t++) { /* ztile_q8_0's reduction: acc[0] = chains 0|1, acc[1] = 2|3 */
                        const float *l = lanes[r][t][0];
                        const __m512 a0 = _mm512_loadu_ps(l), a1 = _mm512_loadu_ps(l + 16);
                        y[(j0 + jj + t) * ldy + i + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + tail[t];
                    }
                }
            }
        }
    }
}

/* ---- f16: ztile_f16's two chains, one after the other ----
 * Chain h of a row is its elements 32m + 16h .. 32m + 16h + 15 (m = 0, 1,
 * ...), added in ascending m. The tokens of a pass are converted to f32 once
 * per call (vcvtph2ps is two uops on the FMA ports of Intel cores: converting
 * each token vector for every row tile spent a third of those ports' slots)
 * and stored by token tile: chain 0's vectors then chain 1's, each step's 16
 * elements of the tile's FG_T tokens side by side, so a tile reads one
 * sequential stream (the hardware prefetchers follow it: no prefetch
 * instructions, which took load-port slots the loads need). A row tile runs
 * chain 0 over every token, then chain 1; each chain in segments of FG_SEG of
 * its elements: the tile's rows' segment is converted to f32 into a small
 * buffer that stays in L1 while every token tile of the pass streams its own
 * segment of the packed tokens from L2, each tile's lanes carried across
 * segments in a table. The same FMAs on the same operands in the same order
 * per chain, then ztile_f16's reduction (fg_reduce16: sixteen at once, the
 * same additions) and scalar tail: each (row, token) keeps vec_dot's bits. */
enum {
    FG_R = 6,                /* weight rows per register tile */
    FG_T = 4,                /* tokens per register tile */
    FG_MAXK = 16384,         /* longer rows: gemm_pf16 */
    FG_SEG = 512,            /* elements of one chain per segment */
    FG_XLD = FG_SEG + 16,    /* float stride of the segment buffer's rows (+ a line: no set aliasing) */
    FG_YF = 1024 * 1024 / 4, /* floats of converted tokens per pass at most: 128 tokens of 2048 */
    FG_MAXT = 128,           /* tokens per pass at most (a multiple of FG_T) */
};

/* R rows' segment (f32, FG_XLD apart) x T tokens' segment (yseg: per step of
 * 16 elements, FG_T tokens' vectors), n elements: acc[r][t] = the chain's
 * lanes, carried in and out (from zero when first). */
AI void fg_tile(int64_t n, const float *xs, const float *yseg, const float *ynext, int R, int T, bool first,
                __m512 (*acc)[FG_T]) {
    __m512 a[FG_R][FG_T];
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) a[r][t] =
        first ? _mm512_setzero_ps() : acc[r][t];
    for (int64_t i = 0; i < n; i += 16) {
        __m512 xv[FG_R];
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) xv[r] = _mm512_load_ps(xs + (size_t)r * FG_XLD + i);
        _Pragma("GCC unroll 4") for (int t = 0; t < FG_T; t++)
            _mm_prefetch((const char *)(ynext + (size_t)(FG_T * i + 16 * t)), _MM_HINT_T0);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            const __m512 yy = _mm512_load_ps(yseg + (size_t)(FG_T * i + 16 * t));
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_ps(xv[r], yy, a[r][t]);
        }
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] =
        a[r][t];
}

/* The tile with constant R and T: FG_R rows, or the last rows of a slice in
 * tiles of 3, 2 and 1 (5 = 3 + 2, 4 = 2 + 2: a 1-row tile loads a weight
 * vector per 1-4 FMAs, a 3-row one per 3-12). */
static void fg_tile_any(int64_t n, const float *xs, const float *yseg, const float *ynext, int R, int T, bool first,
                        __m512 (*acc)[FG_T]) {
#define FG_ROWS(RR, TT) fg_tile(n, xs + (size_t)r * FG_XLD, yseg, ynext, RR, TT, first, acc + r)
#define FG_CASE(TT)                                                                 \
    case TT:                                                                        \
        if (R == FG_R) fg_tile(n, xs, yseg, ynext, FG_R, TT, first, acc);           \
        else                                                                        \
            for (int r = 0; r < R;) {                                               \
                const int left = R - r, take = left == 4 ? 2 : left > 3 ? 3 : left; \
                if (take == 3) FG_ROWS(3, TT);                                      \
                else if (take == 2) FG_ROWS(2, TT);                                 \
                else FG_ROWS(1, TT);                                                \
                r += take;                                                          \
            }                                                                       \
        break;
    switch (T) {
        FG_CASE(4)
        FG_CASE(3)
        FG_CASE(2)
    default: FG_CASE(1)
    }
#undef FG_CASE
#undef FG_ROWS
}

/* _mm512_reduce_add_ps of 16 vectors at once: lane 4k + m of the result is
 * v[4m + k]'s sum. The same additions in the same tree as the intrinsic
 * (upper 256 + lower 256, then upper 128 + lower 128 of that, then lanes 0,1
 * + lanes 2,3, then lane 0 + lane 1), each of the four levels on four or
 * eight sums per instruction instead of one. */
AI __m512 fg_reduce16(const __m512 *v) {
    __m512 s1[8], s2[4], s3[2];
    for (int p = 0; p < 8; p++) /* v[2p] | v[2p+1]: 8 lanes each */
        s1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE),
                              _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44));
    for (int p = 0; p < 4; p++) /* v[4p + k] in 128-bit lane k: 4 each */
        s2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], 0xDD),
                              _mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], 0x88));
    for (int p = 0; p < 2; p++) /* lane k: v[8p + k] (2), v[8p + 4 + k] (2) */
        s3[p] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * p], s2[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(s2[2 * p], s2[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* A full tile's 24 results (chains' lanes a0, a1; no scalar tail) into yo
 * (rows adjacent, tokens ldy apart): rows 0-3 by one fg_reduce16 (lane 4t +
 * r), rows 4-5 by another (lane 4t + r - 4), four and two floats per token. */
AI void fg_done(__m512 (*a0)[FG_T], __m512 (*a1)[FG_T], float *yo, int64_t ldy) {
    __m512 v[16], u[16];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) _Pragma("GCC unroll 4") for (int t = 0; t < FG_T; t++) {
        v[4 * r + t] = _mm512_add_ps(a0[r][t], a1[r][t]); /* ztile_f16's a0 + a1 */
        u[4 * r + t] = r < 2 ? _mm512_add_ps(a0[4 + r][t], a1[4 + r][t]) : _mm512_setzero_ps();
    }
    const __m512 s = fg_reduce16(v), s2 = fg_reduce16(u);
    _mm_storeu_ps(yo, _mm512_castps512_ps128(s));
    _mm_storel_pi((__m64 *)(void *)(yo + 4), _mm512_castps512_ps128(s2));
    _mm_storeu_ps(yo + ldy, _mm512_extractf32x4_ps(s, 1));
    _mm_storel_pi((__m64 *)(void *)(yo + ldy + 4), _mm512_extractf32x4_ps(s2, 1));
    _mm_storeu_ps(yo + 2 * ldy, _mm512_extractf32x4_ps(s, 2));
    _mm_storel_pi((__m64 *)(void *)(yo + 2 * ldy + 4), _mm512_extractf32x4_ps(s2, 2));
    _mm_storeu_ps(yo + 3 * ldy, _mm512_extractf32x4_ps(s, 3));
    _mm_storel_pi((__m64 *)(void *)(yo + 3 * ldy + 4), _mm512_extractf32x4_ps(s2, 3));
}

static void gemm_fg16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t n32 = k & ~(int64_t)31, nh = n32 / 2; /* elements per chain */
    if (n32 == 0 || k > FG_MAXK) {
        gemm_pf16(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) float yf[FG_YF];                           /* the pass's tokens in f32, by token tile */
    _Alignas(64) float xs[FG_R * FG_XLD];                   /* the row tile's segment of one chain in f32 */
    _Alignas(64) __m512 acc[2][FG_MAXT / FG_T][FG_R][FG_T]; /* per chain and token tile */
    const size_t ts = (size_t)FG_T * (size_t)n32;           /* floats per token tile */
    /* tokens per pass: the knob's KiB of them (tune.h; 1 MiB by default, one pass of a 128-token prompt
     * of 2048: fills Zen 4's L2, half of a Xeon's), at least a tile (k <= FG_MAXK: one fits 256 KiB) */
    const size_t yfl = CM_MIN((size_t)FG_YF, (size_t)cm_tune_get(CM_TUNE_F16_GEMM_PASS) * 256);
    int64_t cap = (int64_t)(yfl / ts) * FG_T;
    cap = cap > FG_MAXT ? FG_MAXT : cap;
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap, ntt = (nt + FG_T - 1) / FG_T;
        for (int64_t t = 0; t < nt; t++) {
            const void *yr = (const char *)x + (size_t)(j0 + t) * x_stride;
            float *d = yf + (size_t)(t / FG_T) * ts + (size_t)(t % FG_T) * 16;
            for (int64_t e = 0; e < n32; e += 32) {
                _mm512_store_ps(d + FG_T * (e / 2), z_f16(yr, e));
                _mm512_store_ps(d + FG_T * (nh + e / 2), z_f16(yr, e + 16));
            }
        }
        for (int64_t i = r0; i < r1; i += FG_R) {
            const int R = r1 - i < FG_R ? (int)(r1 - i) : FG_R;
            const cm_f16 *xr[FG_R];
            for (int r = 0; r < R; r++)
                xr[r] = (const cm_f16 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
            /* the next row tile into L2 (rows adjacent, as in a GGUF), a few lines per token tile: a
             * burst stalls on the miss queue */
            const char *pf = (const char *)w + (size_t)(i + FG_R) * w_stride;
            const size_t pfb = i + 2 * FG_R <= r1 ? (size_t)FG_R * w_stride : 0;
            const size_t pstep = (pfb / (size_t)(2 * ((nh + FG_SEG - 1) / FG_SEG) * ntt) + 64) & ~(size_t)63;
            size_t po = 0;
            for (int h = 0; h < 2; h++)
                for (int64_t s0 = 0; s0 < nh; s0 += FG_SEG) {
                    const int64_t n = nh - s0 < FG_SEG ? nh - s0 : FG_SEG;
                    for (int r = 0; r < R; r++) /* elements 32m + 16h.. for m = s0/16 .. */
                        for (int64_t e = 0; e < n; e += 16)
                            _mm512_store_ps(xs + (size_t)r * FG_XLD + e, z_f16(xr[r], 2 * (s0 + e) + 16 * h));
                    for (int64_t jt = 0; jt < ntt; jt++) {
                        for (const size_t pe = po + pstep; po < pe && po < pfb; po += 64)
                            _mm_prefetch(pf + po, _MM_HINT_T1);
                        const int T = nt - jt * FG_T < FG_T ? (int)(nt - jt * FG_T) : FG_T;
                        const float *yseg = yf + (size_t)jt * ts + (size_t)FG_T * (size_t)(h * nh + s0);
                        /* the next tile's segment into L1 meanwhile (past the last tile: harmless lines of yf) */
                        const float *ynext = jt + 1 < ntt ? yseg + ts : yf;
                        float *yo = y + (j0 + jt * FG_T) * ldy + i;
                        const bool last = h == 1 && s0 + n == nh;
                        if (last) /* its results' lines, written after this tile */
                            for (int t = 0; t < T; t++) {
                                __builtin_prefetch(yo + t * ldy, 1, 3);
                                __builtin_prefetch(yo + t * ldy + R - 1, 1, 3);
                            }
                        fg_tile_any(n, xs, yseg, ynext, R, T, s0 == 0, acc[h][jt]);
                        if (last && R == FG_R && T == FG_T && n32 == k) fg_done(acc[0][jt], acc[1][jt], yo, ldy);
                        else if (last)
                            for (int t = 0; t < T; t++) { /* ztile_f16's reduction and scalar tail */
                                const cm_f16 *yr =
                                    (const cm_f16 *)(const void *)((const char *)x +
                                                                   (size_t)(j0 + jt * FG_T + t) * x_stride);
                                for (int r = 0; r < R; r++) {
                                    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][jt][r][t], acc[1][jt][r][t]));
                                    for (int64_t e = n32; e < k; e++) sum += sc_f16(xr[r], e) * sc_f16(yr, e);
                                    yo[t * ldy + r] = sum;
                                }
                            }
                    }
                }
        }
    }
}

/* ---- bf16: ztile_bf16's two chains (elements 64c..64c+31 and 64c+32..64c+63
 * of each 64, one vdpbf16ps per 32), each over the whole row in turn, on the
 * rows and tokens as stored (vdpbf16ps takes bf16 as it is: nothing to
 * convert). The same vdpbf16ps on the same operands in the same order, the
 * same reduction and scalar tail: vec_dot's bits. ---- */
enum { BG_R = 4, BG_T = 6 };

/* R rows x T tokens, n64 elements: res[r][t][h] = chain h's lanes. */
AI void bg_tile(int64_t n64, const cm_bf16 *const *xr, const cm_bf16 *const *yv, int R, int T, __m512 (*res)[BG_T][2]) {
    for (int h = 0; h < 2; h++) {
        __m512 acc[BG_R][BG_T];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
        for (int64_t i = 32 * h; i < n64; i += 64) {
            __m512bh xv[BG_R];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) xv[r] = (__m512bh)_mm512_loadu_si512(xr[r] + i);
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
                const __m512bh yy = (__m512bh)_mm512_loadu_si512(yv[t] + i);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv[r], yy);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 6") for (int t = 0; t < T; t++)
            res[r][t][h] = acc[r][t];
    }
}

static void gemm_bg16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t n64 = k & ~(int64_t)63;
    if (n64 == 0) { /* no whole step of 64: the scalar tail only, as the 4-token tiles do it */
        gemm_zbf16(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    for (int64_t i = r0; i < r1; i += BG_R) {
        const int R = r1 - i < BG_R ? (int)(r1 - i) : BG_R;
        const cm_bf16 *xr[BG_R];
        for (int r = 0; r < R; r++)
            xr[r] = (const cm_bf16 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
        /* the next row tile into L2, a slice per token tile (rows adjacent, as in a GGUF) */
        const char *pf = (const char *)w + (size_t)(i + BG_R) * w_stride;
        const size_t pfb = i + 2 * BG_R <= r1 ? (size_t)BG_R * w_stride : 0;
        const size_t pstep = (pfb / (size_t)((n_tok + BG_T - 1) / BG_T) + 63) & ~(size_t)63;
        size_t po = 0;
        for (int64_t j = 0; j < n_tok; j += BG_T) {
            const int T = n_tok - j < BG_T ? (int)(n_tok - j) : BG_T;
            for (const size_t pe = po + pstep; po < pe && po < pfb; po += 64) _mm_prefetch(pf + po, _MM_HINT_T1);
            const cm_bf16 *yv[BG_T];
            for (int t = 0; t < T; t++)
                yv[t] = (const cm_bf16 *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
            __m512 res[BG_R][BG_T][2];
            if (R == BG_R) switch (T) { /* the last tokens: still 4 rows per pass, not 1 */
                case 6: bg_tile(n64, xr, yv, BG_R, 6, res); break;
                case 5: bg_tile(n64, xr, yv, BG_R, 5, res); break;
                case 4: bg_tile(n64, xr, yv, BG_R, 4, res); break;
                case 3: bg_tile(n64, xr, yv, BG_R, 3, res); break;
                case 2: bg_tile(n64, xr, yv, BG_R, 2, res); break;
                default: bg_tile(n64, xr, yv, BG_R, 1, res); break;
                }
            else
                for (int r = 0; r < R; r++) switch (T) {
                    case 6: bg_tile(n64, xr + r, yv, 1, 6, res + r); break;
                    case 5: bg_tile(n64, xr + r, yv, 1, 5, res + r); break;
                    case 4: bg_tile(n64, xr + r, yv, 1, 4, res + r); break;
                    case 3: bg_tile(n64, xr + r, yv, 1, 3, res + r); break;
                    case 2: bg_tile(n64, xr + r, yv, 1, 2, res + r); break;
                    default: bg_tile(n64, xr + r, yv, 1, 1, res + r); break;
                    }
            for (int r = 0; r < R; r++)
                for (int t = 0; t < T; t++) { /* ztile_bf16's reduction and scalar tail */
                    float s = _mm512_reduce_add_ps(_mm512_add_ps(res[r][t][0], res[r][t][1]));
                    for (int64_t e = n64; e < k; e++) s += sc_bf16(xr[r], e) * sc_bf16(yv[t], e);
                    y[(j + t) * ldy + i + r] = s;
                }
        }
    }
}
