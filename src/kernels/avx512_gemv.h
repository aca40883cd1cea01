/*
 * avx512_gemv.h: the AVX-512 decode gemvs for f16 and q8_0 that do the
 * token's share of the work once per call instead of once per row. Not a
 * header in the usual sense: kernels_avx512.c includes it once, after its
 * tiles, under its own ISA flags. Nothing else may include it.
 *
 * Decode (one token) runs every weight row against the same activation row,
 * and the one-token tiles redo that row's preparation for each weight row:
 * ztile_f16 converts the token's fp16 to f32 (one conversion per weight
 * conversion), ztile_q8_0 moves the token's sign bytes onto |x| (a mask, a
 * negation and a 256-bit insert per pair of blocks) and multiplies its
 * scales out of the 34-byte blocks (two permutes per 8 blocks). Here:
 *   f16: the token converted to f32 once (exact); each row then has
 *        ztile_f16's operations on the same values: the same two chains of
 *        FMAs, the same reduction and the same scalar tail;
 *   q8_0: the token packed once: per pair of blocks its 64 bytes side by
 *        side with -128 * their 4-byte sums as vpdpbusd's start, and its dy
 *        as f32. A row's pair then is x + 128 (unsigned) against y (signed):
 *        sum((x + 128) * y) - 128 * sum(y) = sum(x * y) per 4 bytes, exactly
 *        ztile_q8_0's lane (|x| against y with x's signs); the scale
 *        product dx * dy, the permute, the FMAs into the two accumulators,
 *        the tail through tile_q8_0 and the reduction are ztile_q8_0's.
 * So each row is vec_dot's bits (kernels.h; tests/unit/test_kernels_invariant.c,
 * n_tok 1). One row per pass (a single sequential stream, as GEMV_ROWS),
 * prefetched CM_TUNE_F16_GEMV_PFD bytes ahead (f16). f16 rows longer than GV_F16_F32K
 * elements keep the token in fp16 (vec_dot's operations, with the
 * prefetch); q8_0 rows longer than GV_MAXK go through vec_dot row by row. Stack: 11 KiB (f16) / 34 KiB
 * (q8_0) at most. Never allocates.
 */

enum { GV_MAXK = 16384, GV_Q8_MAXNB = GV_MAXK / CM_QK8_0 };

/* f16: the token in f32 only while it and one weight row fit in half of a
 * 32 KiB L1 (6 bytes per element). Past that every row evicts part of the
 * f32 token, which then comes from L2 again for each row: from DRAM, a
 * 2048 x 5632 (ffn_down) gemv ran at ~60% of a plain read loop that way
 * against ~100% with the token kept in fp16 (vec_dot per row), k = 4096 at
 * 88-93% against 100%, k = 2048 at ~100% either way (bench/gemv_dram.c:
 * one thread, 512 MiB of rows, Zen 4). From cache the f32 token is faster
 * (no second conversion per element), so it stays for short rows. */
enum { GV_F16_F32K = 16384 / 6 };

/* Software prefetch GV_PFD bytes ahead of the line being read (rows are
 * contiguous: past a row's end that is the next rows'; prefetches never
 * fault). The hardware prefetcher alone kept too few lines in flight for
 * one core's share of DRAM: a chain of 1B-model-shaped f16 gemvs (1.4 GB,
 * huge pages) ran at 81-82% of the read roofline at 1 and 2 threads
 * without it, 88-94% with 2048 bytes, 94-97% with 3072 and 83-84% with 4096
 * (the lines then alias the ones being read in L1's sets) on session 19's
 * Intel Xeon (docs/HISTORY.md). The distance is the knob
 * CM_TUNE_F16_GEMV_PFD (tune.h: chosen per CPU at load, 2048 by default). */

/* ---- f16 ---- */
AI float gvf16_row(int64_t n, const cm_f16 *x, const float *yf, size_t pfd) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) { /* ztile_f16 (CM_TILE_FLOAT), T = 1 */
        _mm_prefetch((const char *)(x + i) + pfd, _MM_HINT_T0);
        const __m512 x0 = z_f16(x, i), x1 = z_f16(x, i + 16);
        a0 = FMA16(a0, x0, _mm512_load_ps(yf + i));
        a1 = FMA16(a1, x1, _mm512_load_ps(yf + i + 16));
    }
    float s = HSUM16X2(a0, a1);
    for (int64_t k = i; k < n; k++) s += sc_f16(x, k) * yf[k];
    return s;
}

/* A long row against the token in fp16: ztile_f16 with T = 1 (vec_dot_zf16's
 * operations, values and order) plus the prefetch. */
AI float gvf16_row_h(int64_t n, const cm_f16 *x, const cm_f16 *y, size_t pfd) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)(x + i) + pfd, _MM_HINT_T0);
        const __m512 x0 = z_f16(x, i), x1 = z_f16(x, i + 16);
        a0 = FMA16(a0, x0, z_f16(y, i));
        a1 = FMA16(a1, x1, z_f16(y, i + 16));
    }
    float s = HSUM16X2(a0, a1);
    for (int64_t k = i; k < n; k++) s += sc_f16(x, k) * sc_f16(y, k);
    return s;
}

static void gemv_vf16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const size_t pfd = (size_t)cm_tune_get(CM_TUNE_F16_GEMV_PFD);
    if (k > GV_F16_F32K) { /* the token in fp16, converted again for every row, as vec_dot */
        for (int64_t i = r0; i < r1; i++)
            y[i] = gvf16_row_h(k, (const cm_f16 *)(const void *)((const char *)w + (size_t)i * w_stride), x, pfd);
        return;
    }
    _Alignas(64) float yf[GV_F16_F32K];
    int64_t e = 0;
    for (; e + 16 <= k; e += 16) _mm512_store_ps(yf + e, z_f16(x, e));
    for (; e < k; e++) yf[e] = sc_f16(x, e);
    for (int64_t i = r0; i < r1; i++)
        y[i] = gvf16_row(k, (const cm_f16 *)(const void *)((const char *)w + (size_t)i * w_stride), yf, pfd);
}

/* ---- q8_0 ---- */
enum { GV_Q8_PAIR = 128 }; /* packed token bytes per pair of blocks: y, then the start lanes */

AI void gvq8_pack(int64_t n8, const cm_block_q8_0 *y, uint8_t *pk, float *dy) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    for (int64_t b = 0; b < n8; b += 2, pk += GV_Q8_PAIR) {
        const __m512i v = pair_q8_0(y + b);
        _mm512_store_si512((void *)pk, v);
        _mm512_store_si512((void *)(pk + 64), _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, k128, v)));
    }
    for (int64_t b = 0; b < n8; b += 8) _mm256_store_ps(dy + b, d8_q8_0(y + b));
}

AI float gvq8_row(int64_t nb, const cm_block_q8_0 *x, const uint8_t *pk, const float *dy, const cm_block_q8_0 *y) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const int64_t n8 = nb & ~(int64_t)7;
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < n8; b += 8, pk += 4 * GV_Q8_PAIR) { /* ztile_q8_0, T = 1 */
        const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(d8_q8_0(x + b), _mm256_load_ps(dy + b)));
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m512i xu = _mm512_xor_si512(pair_q8_0(x + b + 2 * p), k128);
            const uint8_t *pp = pk + p * GV_Q8_PAIR;
            const __m512i sumi = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(pp + 64)), xu,
                                                     _mm512_load_si512((const void *)pp));
            const __m512i pidx = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
            acc[p & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_permutexvar_ps(pidx, sc), acc[p & 1]);
        }
    }
    float tail = 0;
    if (n8 < nb) {
        const cm_block_q8_0 *yt[1] = {y + n8};
        tile_q8_0(nb - n8, x + n8, yt, 1, &tail);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + tail;
}

static void gemv_vq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK8_0;
    if (nb > GV_Q8_MAXNB) {
        for (int64_t i = r0; i < r1; i++) vec_dot_zq8_0(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    _Alignas(64) uint8_t pk[GV_Q8_MAXNB / 2 * GV_Q8_PAIR];
    _Alignas(64) float dy[GV_Q8_MAXNB];
    gvq8_pack(nb & ~(int64_t)7, x, pk, dy);
    for (int64_t i = r0; i < r1; i++)
        y[i] = gvq8_row(nb, (const cm_block_q8_0 *)(const void *)((const char *)w + (size_t)i * w_stride), pk, dy, x);
}
