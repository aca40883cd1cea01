/*
 * avx512_bgemm.h: the AVX-512 batched-decode gemm over the "q4_0 lanes"
 * repacked weights (repack.c). Not a header in the usual sense:
 * kernels_avx512.c includes it once, after gemv_rq4_0 (whose packed token
 * layout and row arithmetic it reuses), under its own ISA flags. Nothing else
 * may include it.
 *
 * Decoding B sequences in one step multiplies each weight matrix by B
 * activation rows. The weights stream from memory once per step; what must
 * not grow with B is the work per weight byte. From 3-4 tokens up the step
 * is compute-bound, so the tile is shaped for the fewest loads and non-VNNI
 * operations per vpdpbusd: BQ_R = 4 weight rows x BQ_T = 4 tokens. For each
 * 64-byte quarter q of a 16-block group (288 bytes: 16 fp16 d, then 4 x 64
 * bytes of nibbles in lane order) the 4 rows are loaded and split into their
 * low and high nibbles once (8 vectors), then each token's two packed vectors
 * for q (rq4_pack: 640 bytes per group, in L1/L2) are loaded once and serve
 * the 4 rows: 12 loads and 32 vpdpbusd into 16 independent accumulators.
 * After the 4 quarters each (row, token) gets one conversion, one scale
 * product and two FMAs. (The former 1 row x 8 tokens tile needed a token load
 * per vpdpbusd and ran each token's 8 vpdpbusd as one dependent chain.)
 * While the first token tile passes over 4 rows, the same group of the rows
 * BQ_PFD = 4 row blocks (16 rows) ahead is prefetched into L2
 * (_MM_HINT_T1), so the weights stream from memory once per call, ahead of
 * use, and later token tiles find them in L2. The former prefetch of the
 * next block into L1 (T0) evicted the packed tokens every tile reads there,
 * and the weights' stream then did not overlap the arithmetic: T1 made
 * bbench (1B shapes, one Zen 4 thread, under load, interleaved) 1.5-1.7x
 * faster at 8 tokens, 1.3x at 16, 1.15x at 32 (1, 2, 4 or 8 blocks ahead
 * measured the same there). At 2-4 tokens a block's arithmetic is too short
 * to hide one block's fetch: 4 blocks ahead made B = 3 1.15x and B = 2 on
 * 8B shapes 1.3x faster than 1 block, and the 4-row tile then beats one
 * row per pass x all the tokens (gemm_bq4_0_small) from 2 tokens up
 * (B = 2: 1.0x on 1B shapes, 1.3x on 8B; B = 4: 1.5x / 1.9x; B = 6: 1.5x),
 * which is left to a 1-token remainder of a chunk (BQ_MIN = 2).
 * Session-14 figures for the tile itself (bbench, one Zen 4 thread, under
 * load): 1.1-1.4x the
 * former tile at 16-32 tokens on 1B-llama shapes, ~2x on 8B-llama shapes
 * (whose 14336-wide rows the former 160 KiB token buffer could hold only 9
 * tokens of, so it re-read the weights); the same below 8 tokens.
 *
 * Ceiling: the exact per-block scale (one f32 multiply and one FMA lane per
 * block per (row, token), below) runs on the FMA pipes that vpdpbusd uses
 * on Zen 4 (bench/vnni_mix.c), so no tile shape passes ~8/10 of the VNNI
 * peak (~187 of 234 GMAC/s on one core). This tile runs ~166 GMAC/s with
 * its data in L1 and ~150-155 in bbench at 8-32 tokens (~131 before the
 * T1 prefetch). Tried in session 15 and slower: a row-pair tile (one zmm =
 * 2 rows x 8 blocks, so each scale product and FMA covers 16 lanes with no
 * extract) at 110-124 GMAC/s, its token operands being 256-bit broadcasts
 * (a shuffle-pipe op each) or duplicated in the pack (twice the bytes per
 * vpdpbusd); 4 rows x 3 tokens (the same in L1, 1-4% slower in bbench);
 * blocking rows so a token tile stays in L1 across 4-16 row blocks (+0-3%).
 *
 * Bits: for every (row, token) this is rq4_row's arithmetic exactly (lane j
 * = block j's exact int32 sum, d = dx * dy as f32, the same two FMAs into
 * the 8 chains in ascending group order, the same tail and hsum8), i.e.
 * vec_dot's bits on the file's bytes (kernels.h, batch invariance); the int32
 * sums may be formed in any order since they are exact.
 * tests/unit/test_kernels_repack.c checks it bit for bit (2 to
 * gemm_packed_max + 3 tokens, whole and partial row ranges).
 *
 * Blocking: all the call's tokens are packed once, BQ_PACK bytes at most (on
 * the stack: 640 KiB, which compute threads have room for, CM_COMPUTE_STACK;
 * 32 tokens of rows up to 16384 wide fit, so the weights are read from
 * memory once per call). Longer rows or more tokens take the tokens in
 * chunks, re-reading the weights once per chunk. The table uses this up to
 * 64 tokens (gemm_packed_max): measured against gemm_lq4_0 (bbench, one
 * thread, under load) it is 1.07-1.5x faster at 33-64 tokens on 1B-llama
 * shapes and ~2x on 8B-llama shapes, whose 14336-wide rows are too long for
 * gemm_lq4_0's packing (LQ_MAXNB) even with 2 chunks here. Never allocates.
 */

enum { BQ_R = 4, BQ_T = 4, BQ_PFD = 4, BQ_MIN = 2, BQ1_T = 8, BQ_PACK = 640 * 1024 };

/* R repacked rows (xs bytes apart) x T tokens: out[r * BQ_T + t]. pk: T
 * packed tokens, tb bytes apart; yv: their q8_0 rows (for the nb % 16 tail
 * blocks); pf: the rows to prefetch group by group (NULL: none). */
AI void bq4_tile(int64_t nb, const uint8_t *x, size_t xs, int R, const uint8_t *pk, size_t tb,
                 const cm_block_q8_0 *const *yv, int T, const uint8_t *pf, float *out) {
    const int64_t ng = nb / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 c[BQ_R][BQ_T];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) c[r][t] =
        _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const size_t xo = (size_t)g * 16 * sizeof(cm_block_q4_0), po = (size_t)g * RQ_GROUP;
        if (pf) {
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const uint8_t *p = pf + (size_t)r * xs + xo;
                _mm_prefetch((const char *)p, _MM_HINT_T1);
                _mm_prefetch((const char *)p + 64, _MM_HINT_T1);
                _mm_prefetch((const char *)p + 128, _MM_HINT_T1);
                _mm_prefetch((const char *)p + 192, _MM_HINT_T1);
                _mm_prefetch((const char *)p + 256, _MM_HINT_T1);
            }
        }
        __m512i a[BQ_R][BQ_T];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) { /* -8 * sum(y) per block */
            const __m512i o = _mm512_load_si512((const void *)(pk + (size_t)t * tb + po + 512));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) a[r][t] = o;
        }
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            __m512i lo[BQ_R], hi[BQ_R];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const __m512i v = _mm512_loadu_si512(x + (size_t)r * xs + xo + 32 + 64 * q);
                lo[r] = _mm512_and_si512(v, m4);
                hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const uint8_t *pg = pk + (size_t)t * tb + po;
                const __m512i yl = _mm512_load_si512((const void *)(pg + 64 * q));
                const __m512i yh = _mm512_load_si512((const void *)(pg + 256 + 64 * q));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    a[r][t] = _mm512_dpbusd_epi32(a[r][t], lo[r], yl);
                    a[r][t] = _mm512_dpbusd_epi32(a[r][t], hi[r], yh);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            /* dx and dx * dy in 8-lane halves: only f's high half needs an extract */
            const uint8_t *xd = x + (size_t)r * xs + xo;
            const __m256 dx0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)xd));
            const __m256 dx1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(xd + 16)));
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const float *dy = (const float *)(const void *)(pk + (size_t)t * tb + po + 576);
                const __m512 f = _mm512_cvtepi32_ps(a[r][t]);
                c[r][t] = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm256_mul_ps(dx0, _mm256_load_ps(dy)), c[r][t]);
                c[r][t] =
                    _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm256_mul_ps(dx1, _mm256_load_ps(dy + 8)), c[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const cm_block_q4_0 *xt =
            (const cm_block_q4_0 *)(const void *)(x + (size_t)r * xs + (size_t)ng * 16 * sizeof(cm_block_q4_0));
        for (int64_t b = 16 * ng; b < nb; b += 8) /* kernels_avx512.c's q4_0_tail: eight blocks at once */
            for (int t = 0; t < T; t++)
                c[r][t] = q4_0_tail(xt + (b - 16 * ng), yv[t] + b, (int)CM_MIN(nb - b, 8), c[r][t]);
        for (int t = 0; t < T; t++) out[r * BQ_T + t] = hsum8(c[r][t]);
    }
}

/* The tile with constant R and T, so that its accumulators stay in registers. */
static void bq4_tile_any(int64_t nb, const uint8_t *x, size_t xs, int R, const uint8_t *pk, size_t tb,
                         const cm_block_q8_0 *const *yv, int T, const uint8_t *pf, float *out) {
#define BQ_CASE(RR, TT) \
    case (RR)*8 + (TT): bq4_tile(nb, x, xs, RR, pk, tb, yv, TT, pf, out); break;
    switch (R * 8 + T) {
        BQ_CASE(4, 4)
        BQ_CASE(4, 3)
        BQ_CASE(4, 2)
        BQ_CASE(4, 1)
        BQ_CASE(1, 4)
        BQ_CASE(1, 3)
        BQ_CASE(1, 2)
    default: bq4_tile(nb, x, xs, 1, pk, tb, yv, 1, pf, out); break;
    }
#undef BQ_CASE
}

/* The small-batch tile (below BQ_MIN tokens): one repacked row x T <= 8
 * tokens: out[t]. pk: T packed tokens, tb bytes apart;
 * yv: their q8_0 rows (for the nb % 16 tail blocks). */
AI void bq1_tile(int64_t nb, const uint8_t *x, const uint8_t *pk, size_t tb, const cm_block_q8_0 *const *yv, int T,
                 float *out) {
    const int64_t ng = nb / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 c[BQ1_T];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) c[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *xg = x + (size_t)g * 16 * sizeof(cm_block_q4_0);
        __m512i lo[4], hi[4];
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_loadu_si512(xg + 32 + 64 * q);
            lo[q] = _mm512_and_si512(v, m4);
            hi[q] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)xg));
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            const uint8_t *pg = pk + (size_t)t * tb + (size_t)g * RQ_GROUP;
            __m512i a = _mm512_load_si512((const void *)(pg + 512)); /* -8 * sum(y) per block */
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                a = _mm512_dpbusd_epi32(a, lo[q], _mm512_load_si512((const void *)(pg + 64 * q)));
                a = _mm512_dpbusd_epi32(a, hi[q], _mm512_load_si512((const void *)(pg + 256 + 64 * q)));
            }
            const __m512 f = _mm512_cvtepi32_ps(a);
            const __m512 d = _mm512_mul_ps(dx, _mm512_load_ps((const void *)(pg + 576)));
            c[t] = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), c[t]);
            c[t] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), c[t]);
        }
    }
    const cm_block_q4_0 *xt = (const cm_block_q4_0 *)(const void *)(x + (size_t)ng * 16 * sizeof(cm_block_q4_0));
    for (int64_t b = 16 * ng; b < nb; b += 8) /* kernels_avx512.c's q4_0_tail: eight blocks at once */
        for (int t = 0; t < T; t++) c[t] = q4_0_tail(xt + (b - 16 * ng), yv[t] + b, (int)CM_MIN(nb - b, 8), c[t]);
    for (int t = 0; t < T; t++) out[t] = hsum8(c[t]);
}

/* Below BQ_MIN tokens (a chunk's last token): one row per pass (a single
 * sequential stream, which the hardware prefetcher follows) x the tokens. */
static void gemm_bq4_0_small(int64_t nb, const uint8_t *w, size_t w_stride, const uint8_t *pk, size_t tb,
                             const cm_block_q8_0 *const *yq, float *y, int64_t ldy, int64_t r0, int64_t r1, int nt) {
    for (int64_t i = r0; i < r1; i++) {
        const uint8_t *xr = w + (size_t)i * w_stride;
        float out[BQ1_T];
        switch (nt) { /* a constant T keeps the tile's chains in registers */
        case 7: bq1_tile(nb, xr, pk, tb, yq, 7, out); break;
        case 6: bq1_tile(nb, xr, pk, tb, yq, 6, out); break;
        case 5: bq1_tile(nb, xr, pk, tb, yq, 5, out); break;
        case 4: bq1_tile(nb, xr, pk, tb, yq, 4, out); break;
        case 3: bq1_tile(nb, xr, pk, tb, yq, 3, out); break;
        case 2: bq1_tile(nb, xr, pk, tb, yq, 2, out); break;
        default: bq1_tile(nb, xr, pk, tb, yq, 1, out); break;
        }
        for (int t = 0; t < nt; t++) y[t * ldy + i] = out[t];
    }
}

/* The table's gemm_packed for q4_0: w is the repacked copy (same row stride
 * as the file's rows), x the q8_0 activations. */
static void gemm_bq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK4_0, ng = nb / 16;
    CM_ASSERT(ng >= 1 && ng <= RQ_MAXG);
    const size_t tb = (size_t)ng * RQ_GROUP;
    _Alignas(64) uint8_t pk[BQ_PACK];
    const int64_t cap = (int64_t)(BQ_PACK / tb) >= 1 ? (int64_t)(BQ_PACK / tb) : 1;
    const uint8_t *wb = (const uint8_t *)w;
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;
        const cm_block_q8_0 *yq[BQ_PACK / RQ_GROUP];
        for (int64_t t = 0; t < nt; t++) {
            yq[t] = (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
            rq4_pack(ng, yq[t], pk + (size_t)t * tb);
        }
        if (nt < BQ_MIN) {
            gemm_bq4_0_small(nb, wb, w_stride, pk, tb, yq, y + j0 * ldy, ldy, r0, r1, (int)nt);
            continue;
        }
        for (int64_t i = r0; i < r1; i += BQ_R) {
            const int R = r1 - i < BQ_R ? 1 : BQ_R; /* the last < 4 rows one by one */
            const uint8_t *xr = wb + (size_t)i * w_stride;
            /* the rows BQ_PFD blocks ahead, within the slice */
            const uint8_t *pf = i + BQ_PFD * BQ_R < r1 ? xr + (size_t)(BQ_PFD * BQ_R) * w_stride : NULL;
            for (int64_t jj = 0; jj < nt; jj += BQ_T) {
                const int T = nt - jj < BQ_T ? (int)(nt - jj) : BQ_T;
                float out[BQ_R * BQ_T];
                bq4_tile_any(nb, xr, w_stride, R, pk + (size_t)jj * tb, tb, yq + jj, T, jj == 0 ? pf : NULL, out);
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i + r] = out[r * BQ_T + t];
            }
            if (R == 1) i += 1 - BQ_R;
        }
    }
}
