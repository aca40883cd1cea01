/*
 * avx512_bgemm.h: the AVX-512 batched-decode gemm over the "q4_0 lanes"
 * repacked weights (repack.c). Not a header in the usual sense:
 * kernels_avx512.c includes it once, after gemv_rq4_0 (whose packed token
 * layout and row arithmetic it reuses), under its own ISA flags. Nothing else
 * may include it.
 *
 * Decoding B sequences in one step multiplies each weight matrix by B
 * activation rows. The weights stream from memory once per step; what must
 * not grow with B is the work per weight byte. Here each 16-block group of a
 * repacked row (288 bytes: 16 fp16 d, then 4 x 64 bytes of nibbles in lane
 * order) is loaded and split into its 8 nibble vectors and 16 dx ONCE, and
 * then serves up to BQ_T = 8 tokens from registers: per token 8 vpdpbusd
 * against that token's packed vectors (rq4_pack: 640 bytes per group, in
 * L1/L2), one conversion, one scale product and two FMAs. (Two rows per
 * tile sharing the token loads spilled registers and ran slower on Zen 4.)
 * Measured (bench/bbench.c, one Zen 4 thread, CPU time): 8 rows cost ~4-5x
 * one row's gemv instead of the ~11x of the prefill gemms at that size; at
 * 16 tokens it matches gemm_lq4_0, so the table uses it up to 16.
 *
 * Bits: for every (row, token) this is rq4_row's arithmetic exactly (lane j
 * = block j's exact int32 sum, d = dx * dy as f32, the same two FMAs into
 * the 8 chains in ascending group order, the same tail and hsum8), i.e.
 * vec_dot's bits on the file's bytes (kernels.h, batch invariance); the int32
 * sums may be formed in any order since they are exact.
 * tests/unit/test_kernels_invariant.c checks it bit for bit.
 *
 * Blocking: the tokens are packed BQ_PACK bytes at a time (on the stack, like
 * avx512_gemm.h's ZPACK); rows go in blocks of BQ_RB so that a block stays
 * in L2 while every tile of BQ_T tokens passes over it. Never allocates.
 */

enum { BQ_T = 8, BQ_RB = 16, BQ_PACK = 160 * 1024 };

/* One repacked row x T tokens: out[t]. pk: T packed tokens, tb bytes apart;
 * yv: their q8_0 rows (for the nb % 16 tail blocks). */
AI void bq4_tile(int64_t nb, const uint8_t *x, const uint8_t *pk, size_t tb, const cm_block_q8_0 *const *yv, int T,
                 float *out) {
    const int64_t ng = nb / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 c[BQ_T];
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
    for (int64_t b = 16 * ng; b < nb; b++, xt++) {
        const __m256i qx = _mm256_sub_epi8(nibbles32(xt->qs), _mm256_set1_epi8(8));
        for (int t = 0; t < T; t++)
            c[t] = fma_lane(c[t], (int)(b & 7), hsum_i32(dot_s8s8(qx, ld256(yv[t][b].qs))),
                            f16f(xt->d) * f16f(yv[t][b].d));
    }
    for (int t = 0; t < T; t++) out[t] = hsum8(c[t]);
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
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;
        const cm_block_q8_0 *yq[BQ_PACK / RQ_GROUP];
        for (int64_t t = 0; t < nt; t++) {
            yq[t] = (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
            rq4_pack(ng, yq[t], pk + (size_t)t * tb);
        }
        for (int64_t i0 = r0; i0 < r1; i0 += BQ_RB) {
            const int64_t i1 = r1 - i0 < BQ_RB ? r1 : i0 + BQ_RB;
            for (int64_t jj = 0; jj < nt; jj += BQ_T) {
                const int T = nt - jj < BQ_T ? (int)(nt - jj) : BQ_T;
                const uint8_t *p = pk + (size_t)jj * tb;
                const cm_block_q8_0 *const *yv = yq + jj;
                for (int64_t i = i0; i < i1; i++) {
                    const uint8_t *xr = (const uint8_t *)w + (size_t)i * w_stride;
                    float out[BQ_T];
                    switch (T) { /* a constant T keeps the tile's chains in registers */
                    case 8: bq4_tile(nb, xr, p, tb, yv, 8, out); break;
                    case 7: bq4_tile(nb, xr, p, tb, yv, 7, out); break;
                    case 6: bq4_tile(nb, xr, p, tb, yv, 6, out); break;
                    case 5: bq4_tile(nb, xr, p, tb, yv, 5, out); break;
                    case 4: bq4_tile(nb, xr, p, tb, yv, 4, out); break;
                    case 3: bq4_tile(nb, xr, p, tb, yv, 3, out); break;
                    case 2: bq4_tile(nb, xr, p, tb, yv, 2, out); break;
                    default: bq4_tile(nb, xr, p, tb, yv, 1, out); break;
                    }
                    for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i] = out[t];
                }
            }
        }
    }
}
