/*
 * lane_avx2.c: the AVX2 table's q4_0 kernels in the AVX-512 table's "lane
 * order" (kernels_avx512.c), so the two x86 tables give q4_0 the same bits:
 * block b's exact integer sum s_b = sum (q - 8) * y, times d_b = dx_b * dy_b
 * (an f32 product), FMAed into chain b mod 8 in ascending block order, the 8
 * chains summed by hsum8. Here the 8 chains are one 256-bit vector and 8
 * consecutive blocks fill its lanes (lane j = block 8g + j), so a group of 8
 * blocks is one conversion, one scale product and one FMA; the remaining
 * nb % 8 blocks go one at a time into their chain (as the AVX-512 tail does).
 *
 * q8_0 (below) takes the same order: q8lane_avx512.c's, so both tables give
 * q8_0 the same bits too; its decode gemv and gemm also run over "q8_0
 * lanes" rows repacked at load (repack.c), where 8 blocks are transposed
 * by 4-byte words once and for all.
 *
 * Kernels: vec_dot on the file's bytes (8 blocks' int32 sums transposed into
 * one vector with hadd), gemm as vec_dot per (row, token) (isa.h
 * CM_ROW_GEMM), and over the "q4_0 lanes" rows repacked at load (repack.c)
 * the decode gemv and a gemm for any batch: the tokens are packed once per
 * call in the AVX-512 gemv's layout (rq4_pack's 640 bytes per 16-block group:
 * 8 vectors whose 4-byte lane j is y_j's bytes 4q..4q+3, then -8 * sum(y_j),
 * then the 16 dy as f32), and each half group (8 blocks) of a row is 4
 * 32-byte loads split into 8 nibble vectors, then per token 8 maddubs summed
 * in int16 (|sum| <= 8 * 2 * 15 * 128 = 30720, so nothing wraps), one madd
 * to int32, the offset, one conversion, one scale product, one FMA. The
 * weights are loaded and split once for up to LQ_T tokens.
 *
 * Every kernel keeps isa.h's contract; test_kernels_simd.c,
 * test_kernels_invariant.c and test_kernels_repack.c check them against the
 * reference, for batch invariance and bit for bit against vec_dot, and
 * test_kernels.c (test_lanes_across_tables) against the AVX-512 table.
 * Compiled with the AVX2 flags only (Makefile); never allocates.
 */
#include "isa.h"

#include "base/base.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#include "x86_vec.h"

/* The decode gemvs' software prefetch: the lines LA_PFD bytes ahead of the
 * ones being read (rows are contiguous: past a row's end that is the next
 * rows', past the last row a few lines nobody reads; prefetches never
 * fault). Prefetching changes no arithmetic. 2048, as the AVX-512 table's
 * QL_PFD / RQ_PFD (q8lane_avx512.c, kernels_avx512.c). */
enum { LA_PFD = 2048 };

/* Signed x signed bytes as 8 int32: |x| unsigned, x's sign moved onto y. */
AI __m256i dot_s8s8(__m256i x, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
                             _mm256_set1_epi16(1));
}

/* c = fma(s, d, c) in chain (lane) j of c, as kernels_avx512.c's q4_0_tail per lane. */
AI __m256 lfma_lane(__m256 c, int j, int32_t s, float d) {
    _Alignas(32) float v[8];
    _mm256_store_ps(v, c);
    v[j] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss((float)s), _mm_set_ss(d), _mm_set_ss(v[j])));
    return _mm256_load_ps(v);
}

/* h0: lanes 0-3 and 4-7 two parts of blocks 0-3's totals, h1 of blocks 4-7;
 * returns lane i = block i's total. Two blends, one vpermq and an add: no
 * vperm2i128 (8 µops on Zen 1, where vpermq is 2); the same sums (integer
 * adds: any order gives the same bits). */
AI __m256i fold8(__m256i h0, __m256i h1) {
    const __m256i a = _mm256_blend_epi32(h0, h1, 0xf0), b = _mm256_blend_epi32(h1, h0, 0xf0);
    return _mm256_add_epi32(a, _mm256_permute4x64_epi64(b, 0x4e));
}

/* p[i]: 8 int32 summing to block i's total; returns lane i = block i's total. */
AI __m256i hadd8x8(const __m256i p[8]) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return fold8(h0, h1);
}

/* 8 fp16 scales, 'stride' bytes apart, as f32. */
AI __m256 d8(const void *p, size_t stride) {
    const uint8_t *b = p;
    uint16_t h[8];
    for (int i = 0; i < 8; i++) memcpy(&h[i], b + (size_t)i * stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
}

/* Blocks b0..nb-1 of a row in the file's order (b0 a multiple of 8) into c. */
AI __m256 lq4_file(int64_t b0, int64_t nb, const cm_block_q4_0 *x, const cm_block_q8_0 *y, __m256 c) {
    int64_t b = b0;
    const __m256i k8 = _mm256_set1_epi8(8);
    for (; b + 8 <= nb; b += 8) {
        __m256i p[8];
        for (int i = 0; i < 8; i++) p[i] = dot_s8s8(_mm256_sub_epi8(nibbles32(x[b + i].qs), k8), ld256(y[b + i].qs));
        const __m256 f = _mm256_cvtepi32_ps(hadd8x8(p));
        const __m256 d = _mm256_mul_ps(d8(&x[b].d, sizeof *x), d8(&y[b].d, sizeof *y));
        c = _mm256_fmadd_ps(f, d, c);
    }
    for (; b < nb; b++) {
        const __m256i qx = _mm256_sub_epi8(nibbles32(x[b].qs), k8);
        c = lfma_lane(c, (int)(b & 7), hsum_i32(dot_s8s8(qx, ld256(y[b].qs))), f16f(x[b].d) * f16f(y[b].d));
    }
    return c;
}

static void vec_dot_lq4_0(int64_t n, float *s, const void *vx, const void *vy) {
    *s = hsum8(lq4_file(0, n / CM_QK4_0, vx, vy, _mm256_setzero_ps()));
}
CM_ROW_GEMM(lq4_0)

/* ---- over the "q4_0 lanes" rows ---- */
enum { LQ_GROUP = 640, LQ_MAXG = CM_REPACK_MAX_K / 512, LQ_T = 4, LQ_RB = 16, LQ_PACK = 160 * 1024 };

/* The token's 16-block groups in rq4_pack's layout (kernels_avx512.c). */
AI void lq4_pack(int64_t ng, const cm_block_q8_0 *y, uint8_t *d) {
    const int bs = (int)sizeof *y; /* lane j: block j's qs, j < 8 */
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bs));
    const __m256i k8 = _mm256_set1_epi8(8), one = _mm256_set1_epi16(1);
    for (int64_t g = 0; g < ng; g++, y += 16, d += LQ_GROUP) {
        for (int h = 0; h < 2; h++) {
            const uint8_t *base = (const uint8_t *)(y + 8 * h) + offsetof(cm_block_q8_0, qs);
            __m256i sum = _mm256_setzero_si256();
            for (int q = 0; q < 8; q++) {
                const __m256i v = _mm256_i32gather_epi32((const int *)(const void *)(base + 4 * q), idx, 1);
                _mm256_store_si256((__m256i *)(void *)(d + 64 * q + 32 * h), v);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(k8, v), one));
            }
            _mm256_store_si256((__m256i *)(void *)(d + 512 + 32 * h), _mm256_sub_epi32(_mm256_setzero_si256(), sum));
            _mm256_store_ps((float *)(void *)(d + 576 + 32 * h), d8(&y[8 * h].d, sizeof *y));
        }
    }
}

/* One repacked row x T packed tokens (tb bytes apart): out[t]. yv: the
 * tokens' q8_0 rows, for the nb % 16 tail blocks (the file's order). */
AI void lq4_tile(int64_t nb, const uint8_t *x, const uint8_t *pk, size_t tb, const cm_block_q8_0 *const *yv, int T,
                 bool pf, float *out) {
    const int64_t ng = nb / 16;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    __m256 c[LQ_T];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) c[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *xg = x + (size_t)g * 16 * sizeof(cm_block_q4_0);
        if (pf) /* the decode gemv: the group's 5 lines LA_PFD bytes on */
            _Pragma("GCC unroll 5") for (int o = 0; o < 16 * (int)sizeof(cm_block_q4_0); o += 64)
                _mm_prefetch((const char *)xg + LA_PFD + o, _MM_HINT_T0);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m256i lo[4], hi[4];
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                const __m256i v = ld256(xg + 32 + 64 * q + 32 * h);
                lo[q] = _mm256_and_si256(v, m4);
                hi[q] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(xg + 16 * h)));
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const uint8_t *pg = pk + (size_t)t * tb + (size_t)g * LQ_GROUP + 32 * h;
                __m256i a = _mm256_setzero_si256();
                _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                    a = _mm256_add_epi16(a, _mm256_maddubs_epi16(lo[q], ld256(pg + 64 * q)));
                    a = _mm256_add_epi16(a, _mm256_maddubs_epi16(hi[q], ld256(pg + 256 + 64 * q)));
                }
                const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(a, one), ld256(pg + 512));
                const __m256 d = _mm256_mul_ps(dx, _mm256_loadu_ps((const float *)(const void *)(pg + 576)));
                c[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, c[t]);
            }
        }
    }
    /* blocks 16 * ng.. are the file's, at their own offsets */
    const cm_block_q4_0 *xb = (const cm_block_q4_0 *)(const void *)x;
    for (int t = 0; t < T; t++) out[t] = hsum8(lq4_file(16 * ng, nb, xb, yv[t], c[t]));
}

static void gemv_lq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK4_0, ng = nb / 16;
    CM_ASSERT(ng <= LQ_MAXG);
    _Alignas(64) uint8_t pk[LQ_MAXG * LQ_GROUP];
    lq4_pack(ng, x, pk);
    const cm_block_q8_0 *yv[1] = {x};
    for (int64_t i = r0; i < r1; i++)
        lq4_tile(nb, (const uint8_t *)w + (size_t)i * w_stride, pk, 0, yv, 1, true, &y[i]);
}

/* Any number of tokens: packed LQ_PACK bytes at a time; rows in blocks of
 * LQ_RB so a block stays in L2 while every tile of LQ_T tokens passes. The
 * first tile prefetches the next block into L2 row by row, so its fetch
 * overlaps the block's arithmetic: bbench (CUMULO_ISA=avx2, 1B shapes, one
 * Zen 4 thread, under load, interleaved) 1.1-1.15x at 3-8 tokens, 1.05x at
 * 16-32, the same at 2. */
static void gemm_plq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK4_0, ng = nb / 16;
    CM_ASSERT(ng >= 1 && ng <= LQ_MAXG);
    const size_t tb = (size_t)ng * LQ_GROUP;
    _Alignas(64) uint8_t pk[LQ_PACK];
    const int64_t cap = (int64_t)(LQ_PACK / tb) >= 1 ? (int64_t)(LQ_PACK / tb) : 1;
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;
        const cm_block_q8_0 *yq[LQ_PACK / LQ_GROUP];
        for (int64_t t = 0; t < nt; t++) {
            yq[t] = (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
            lq4_pack(ng, yq[t], pk + (size_t)t * tb);
        }
        for (int64_t i0 = r0; i0 < r1; i0 += LQ_RB) {
            const int64_t i1 = r1 - i0 < LQ_RB ? r1 : i0 + LQ_RB;
            for (int64_t jj = 0; jj < nt; jj += LQ_T) {
                const int T = nt - jj < LQ_T ? (int)(nt - jj) : LQ_T;
                const uint8_t *p = pk + (size_t)jj * tb;
                const cm_block_q8_0 *const *yv = yq + jj;
                for (int64_t i = i0; i < i1; i++) {
                    const uint8_t *xr = (const uint8_t *)w + (size_t)i * w_stride;
                    /* the first tile over a block fetches the next block's
                     * row into L2 (from 3 tokens: at 2 the hardware's
                     * prefetch alone measured faster) */
                    if (nt > 2 && jj == 0 && i + LQ_RB < r1)
                        for (size_t o = 0; o < (size_t)nb * sizeof(cm_block_q4_0); o += 64)
                            _mm_prefetch((const char *)xr + (size_t)LQ_RB * w_stride + o, _MM_HINT_T1);
                    float out[LQ_T];
                    switch (T) { /* a constant T keeps the tile's chains in registers */
                    case 4: lq4_tile(nb, xr, p, tb, yv, 4, false, out); break;
                    case 3: lq4_tile(nb, xr, p, tb, yv, 3, false, out); break;
                    case 2: lq4_tile(nb, xr, p, tb, yv, 2, false, out); break;
                    default: lq4_tile(nb, xr, p, tb, yv, 1, false, out); break;
                    }
                    for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i] = out[t];
                }
            }
        }
    }
}

/* ---- q8_0 in the same block lane order (q8lane_avx512.c's) ----
 * s_b = the exact integer dot of block b (|s_b| < 2^21), d_b = dx_b * dy_b,
 * chain b mod 8 = fma(s_b, d_b, chain), hsum8 of the chains: the AVX-512
 * table's q8_0 bits. 8 blocks fill one vector's lanes (fold2 + hadd), so 8 blocks
 * cost one conversion, one scale product and one FMA instead of 8 each; the
 * token's dy are converted to f32 once per call (gemv) or per row block and
 * token group (gemm), exactly. */
enum { L8_MAXNB = 512 };

/* Two blocks' dot vectors p0, p1 (8 int32 each) folded to 4 lanes: lanes 0-1
 * p0's halves, 2-3 p1's, as 128-bit operations (Zen 1 splits every 256-bit
 * one in two; this measured faster there than a 256-bit hadd tree). */
AI __m128i fold2(__m256i p0, __m256i p1) {
    return _mm_hadd_epi32(_mm_add_epi32(_mm256_castsi256_si128(p0), _mm256_extracti128_si256(p0, 1)),
                          _mm_add_epi32(_mm256_castsi256_si128(p1), _mm256_extracti128_si256(p1, 1)));
}

/* Blocks [0, nb) of a row against one token into the chains c: the token's
 * block j's 32 bytes at yq + j * ys (its q8_0 row, ys = 34, or the gemv's
 * aligned copy, ys = 32), its dy as f32 in dyf. Per 8 blocks the dots fold
 * pairwise as they come (few vectors live), then lane i = block i's sum. */
AI __m256 lq8_row(int64_t nb, const cm_block_q8_0 *x, const uint8_t *yq, size_t ys, const float *dyf, bool pf,
                  __m256 c) {
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        if (pf) /* the decode gemv: the group's 5 lines LA_PFD bytes on */
            _Pragma("GCC unroll 5") for (int o = 0; o < 8 * (int)sizeof(cm_block_q8_0); o += 64)
                _mm_prefetch((const char *)(x + b) + LA_PFD + o, _MM_HINT_T0);
        __m128i h[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const int64_t j = b + 2 * i;
            h[i] = fold2(dot_s8s8(ld256(x[j].qs), ld256(yq + (size_t)j * ys)),
                         dot_s8s8(ld256(x[j + 1].qs), ld256(yq + (size_t)(j + 1) * ys)));
        }
        const __m256i s = _mm256_set_m128i(_mm_hadd_epi32(h[2], h[3]), _mm_hadd_epi32(h[0], h[1]));
        const __m256 d = _mm256_mul_ps(d8(&x[b].d, sizeof *x), _mm256_loadu_ps(dyf + b));
        c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, c);
    }
    for (; b < nb; b++)
        c = lfma_lane(c, (int)(b & 7), hsum_i32(dot_s8s8(ld256(x[b].qs), ld256(yq + (size_t)b * ys))),
                      f16f(x[b].d) * dyf[b]);
    return c;
}

/* A token's dy as f32 (exact conversions). */
AI void lq8_dy(int64_t nb, const cm_block_q8_0 *y, float *dyf) {
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) _mm256_storeu_ps(dyf + b, d8(&y[b].d, sizeof *y));
    for (; b < nb; b++) dyf[b] = f16f(y[b].d);
}

static void vec_dot_lq8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const int64_t nb = n / CM_QK8_0;
    const cm_block_q8_0 *x = vx, *y = vy;
    __m256 c = _mm256_setzero_ps();
    int64_t b = 0;
    float dyf[L8_MAXNB];
    for (; b < nb; b += L8_MAXNB) { /* any length: the blocks in slices, in order */
        const int64_t m = nb - b < L8_MAXNB ? nb - b : L8_MAXNB;
        lq8_dy(m, y + b, dyf);
        c = lq8_row(m, x + b, (const uint8_t *)y[b].qs, sizeof *y, dyf, false, c);
    }
    *s = hsum8(c);
}

/* One token, rows [r0, r1), the row stream prefetched LA_PFD bytes ahead
 * into L1 (several lines in flight; a non-temporal hint measured ~4x slower
 * here, Intel family 6 model 167). */
static void gemv_lq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK8_0;
    if (nb > L8_MAXNB) {
        for (int64_t i = r0; i < r1; i++) vec_dot_lq8_0(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    /* the token's bytes copied once, 32-byte aligned: its loads never
     * split a cache line (a 34-byte block's do about one time in two) */
    const cm_block_q8_0 *xb = x;
    float dyf[L8_MAXNB];
    _Alignas(32) uint8_t yq[L8_MAXNB * 32];
    lq8_dy(nb, xb, dyf);
    for (int64_t b = 0; b < nb; b++) _mm256_store_si256((__m256i *)(void *)(yq + 32 * b), ld256(xb[b].qs));
    for (int64_t i = r0; i < r1; i++) {
        const char *wr = (const char *)w + (size_t)i * w_stride;
        y[i] = hsum8(lq8_row(nb, (const cm_block_q8_0 *)(const void *)wr, yq, 32, dyf, true, _mm256_setzero_ps()));
    }
}

/* ---- the q8_0 gemm: lq8_row's bits without its folds ----
 * A group of 8 blocks transposed by 4-byte words (l8_transpose: vector s,
 * lane i = block i's bytes 4s..4s+3), for the row and for each token, makes
 * madd(maddubs(|x|, sign(y, x)), 1) of vector s lane i block i's 4-byte
 * partial sum, exactly the lane dot_s8s8's madd gives in lq8_row (the same
 * byte pairs in each maddubs word, so even a saturating pair saturates the
 * same), and 8 adds give lane i block i's sum: per 32 weights and token a
 * sign, a maddubs, a madd and an add, where lq8_row also folds and hadds each
 * 8 blocks' dot vectors. Then lq8_row's conversion, scale product and FMA per
 * group, its tail blocks one by one: lq8_row's bits. Rows are transposed
 * (over "q8_0 lanes": loaded) once per block of rows (l8g_grp), tokens once
 * per (row block, group of L8G_T) (l8g_toks). */
enum { L8G_T = 8, L8G_RB = 64, L8G_CG = 1024 /* (row, 8-block group)s transposed at once */ };
enum { L8P_GROUP = 8 * sizeof(cm_block_q8_0) }; /* a "q8_0 lanes" group: 8 d, 8 vectors */

/* lane i of o[s] = dword s of q[i] */
AI void l8_transpose(const __m256i q[8], __m256i o[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(q[2 * i], q[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(q[2 * i], q[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {                                         /* blocks 0-3 (h = 0), 4-7 */
        u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);         /* dwords 0 | 4 */
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);     /* 1 | 5 */
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]); /* 2 | 6 */
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]); /* 3 | 7 */
    }
    for (int s = 0; s < 4; s++) {
        o[s] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x20);
        o[s + 4] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x31);
    }
}

/* One row's group of 8 blocks: x[s] transposed, ax[s] = |x[s]|, dx the 8 d. */
typedef struct {
    __m256i x[8], ax[8];
    __m256 dx;
} l8g_grp;

typedef struct {
    __m256i y[L8_MAXNB / 8][L8G_T][8]; /* token t's group g, transposed */
    float dy[L8G_T][L8_MAXNB];         /* token t's dy as f32 */
} l8g_toks;

AI __m256i l8_keep(__m256i v) { /* in a register here: no reassociated trees (kernels_avx2.c's ax_keep) */
    __asm__("" : "+x"(v));
    return v;
}

/* xt: the row's nb % 8 tail blocks (the file's block layout) */
AI void l8g_row(int64_t nb, const l8g_grp *xg, const cm_block_q8_0 *xt, const l8g_toks *g,
                const cm_block_q8_0 *const *yv, int T, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 c[L8G_T];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) c[t] = _mm256_setzero_ps();
    const int64_t ng = nb / 8;
    for (int64_t gi = 0; gi < ng; gi++) {
        __m256i si[L8G_T];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) si[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int st = 0; st < 8; st++) {
            const __m256i xs = xg[gi].x[st], ax = xg[gi].ax[st];
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) si[t] = l8_keep(_mm256_add_epi32(
                si[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(g->y[gi][t][st], xs)), ones)));
        }
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) c[t] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(si[t]), _mm256_mul_ps(xg[gi].dx, _mm256_loadu_ps(g->dy[t] + 8 * gi)), c[t]);
    }
    for (int64_t b = ng * 8; b < nb; b++) { /* lq8_row's tail */
        const __m256i q = ld256(xt[b - ng * 8].qs);
        const float dx = f16f(xt[b - ng * 8].d);
        for (int t = 0; t < T; t++)
            c[t] = lfma_lane(c[t], (int)(b & 7), hsum_i32(dot_s8s8(q, ld256(yv[t][b].qs))), dx * g->dy[t][b]);
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) out[t] = hsum8(c[t]);
}

/* Row i's group gi as l8g_row takes it: transposed from the file's blocks,
 * or loaded from "q8_0 lanes" (packed: below), where it is so already. */
AI void l8g_stage(bool packed, const uint8_t *wr, int64_t gi, l8g_grp *o) {
    if (packed) {
        const uint8_t *xg = wr + (size_t)gi * L8P_GROUP;
        for (int st = 0; st < 8; st++) o->x[st] = ld256(xg + 16 + 32 * st);
        o->dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)xg));
    } else {
        const cm_block_q8_0 *xr = (const cm_block_q8_0 *)(const void *)wr;
        __m256i q[8];
        for (int b = 0; b < 8; b++) q[b] = ld256(xr[8 * gi + b].qs);
        l8_transpose(q, o->x);
        o->dx = d8(&xr[8 * gi].d, sizeof *xr);
    }
    for (int st = 0; st < 8; st++) o->ax[st] = _mm256_sign_epi8(o->x[st], o->x[st]);
}

/* The gemm over the file's rows or (packed) "q8_0 lanes" rows: the same bits. */
AI void l8g_gemm(bool packed, int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                 int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK8_0, ng = nb / 8;
    /* ~700 KiB (compute threads: CM_COMPUTE_STACK) */
    l8g_toks g;
    l8g_grp rows[L8G_CG];
    const int64_t rb = ng * L8G_RB <= L8G_CG ? L8G_RB : L8G_CG / ng;
    /* where row i's tail blocks are: after its groups, in either layout */
    const size_t tail = packed ? (size_t)ng * L8P_GROUP : (size_t)ng * 8 * sizeof(cm_block_q8_0);
    for (int64_t i0 = r0; i0 < r1; i0 += rb) {
        const int64_t i1 = r1 - i0 < rb ? r1 : i0 + rb;
        for (int64_t i = i0; i < i1; i++)
            for (int64_t gi = 0; gi < ng; gi++)
                l8g_stage(packed, (const uint8_t *)w + (size_t)i * w_stride, gi, &rows[(i - i0) * ng + gi]);
        for (int64_t j = 0; j < n_tok; j += L8G_T) {
            const int T = n_tok - j < L8G_T ? (int)(n_tok - j) : L8G_T;
            const cm_block_q8_0 *yv[L8G_T];
            for (int t = 0; t < T; t++) {
                yv[t] = (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
                lq8_dy(nb, yv[t], g.dy[t]);
                for (int64_t gi = 0; gi < ng; gi++) {
                    __m256i q[8];
                    for (int b = 0; b < 8; b++) q[b] = ld256(yv[t][8 * gi + b].qs);
                    l8_transpose(q, g.y[gi][t]);
                }
            }
            for (int64_t i = i0; i < i1; i++) {
                const l8g_grp *xg = &rows[(i - i0) * ng];
                const cm_block_q8_0 *xt =
                    (const cm_block_q8_0 *)(const void *)((const char *)w + (size_t)i * w_stride + tail);
                float out[L8G_T];
                switch (T) { /* a constant T keeps the sums in registers */
                case 8: l8g_row(nb, xg, xt, &g, yv, 8, out); break;
                case 7: l8g_row(nb, xg, xt, &g, yv, 7, out); break;
                case 6: l8g_row(nb, xg, xt, &g, yv, 6, out); break;
                case 5: l8g_row(nb, xg, xt, &g, yv, 5, out); break;
                case 4: l8g_row(nb, xg, xt, &g, yv, 4, out); break;
                case 3: l8g_row(nb, xg, xt, &g, yv, 3, out); break;
                case 2: l8g_row(nb, xg, xt, &g, yv, 2, out); break;
                default: l8g_row(nb, xg, xt, &g, yv, 1, out); break;
                }
                for (int t = 0; t < T; t++) y[(j + t) * ldy + i] = out[t];
            }
        }
    }
}

static void gemm_lq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (k / CM_QK8_0 > L8_MAXNB) {
        for (int64_t i = r0; i < r1; i++)
            for (int64_t j = 0; j < n_tok; j++)
                vec_dot_lq8_0(k, &y[j * ldy + i], (const char *)w + (size_t)i * w_stride,
                              (const char *)x + (size_t)j * x_stride);
        return;
    }
    l8g_gemm(false, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

/* ---- over "q8_0 lanes" (repack.c: the AVX2 table's own q8_0 layout) ----
 * A row's groups of 8 blocks hold the group's 8 d, then l8_transpose's 8
 * vectors of its bytes (272 bytes, the group's size in the file); its nb % 8
 * last blocks are the file's. The decode gemv adds each group's 8 madds
 * (lane i = block i's exact sum) where lq8_row folds and hadds 8 dot vectors:
 * 1.4x per block on one Zen 1 core, the same bits (the same s_b, scale
 * product, FMA chains and tail). The gemm is gemm_lq8_0's, loading what it
 * transposes. Rows of at most L8_MAXNB blocks (CM_REPACK_MAX_K_Q8_0). */
_Static_assert(CM_REPACK_MAX_K_Q8_0 == L8_MAXNB * CM_QK8_0, "the q8_0 rows repack.c repacks are the rows these take");

/* A token's groups transposed as the rows are (256 bytes per group). */
AI void l8p_token(int64_t ng, const cm_block_q8_0 *y, uint8_t *yt) {
    for (int64_t gi = 0; gi < ng; gi++) {
        __m256i q[8], o[8];
        for (int b = 0; b < 8; b++) q[b] = ld256(y[8 * gi + b].qs);
        l8_transpose(q, o);
        for (int st = 0; st < 8; st++) _mm256_store_si256((__m256i *)(void *)(yt + 256 * gi + 32 * st), o[st]);
    }
}

static void gemv_p8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK8_0, ng = nb / 8;
    CM_ASSERT(nb <= L8_MAXNB);
    const cm_block_q8_0 *xb = x;
    _Alignas(32) uint8_t yt[L8_MAXNB * 32];
    float dyf[L8_MAXNB];
    lq8_dy(nb, xb, dyf);
    l8p_token(ng, xb, yt);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = r0; i < r1; i++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)i * w_stride;
        __m256 c = _mm256_setzero_ps();
        for (int64_t gi = 0; gi < ng; gi++) {
            const uint8_t *xg = wr + (size_t)gi * L8P_GROUP;
            _Pragma("GCC unroll 5") for (int o = 0; o < (int)L8P_GROUP; o += 64)
                _mm_prefetch((const char *)xg + LA_PFD + o, _MM_HINT_T0);
            __m256i s = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int st = 0; st < 8; st++) {
                const __m256i xv = ld256(xg + 16 + 32 * st);
                const __m256i yv = _mm256_load_si256((const __m256i *)(const void *)(yt + 256 * gi + 32 * st));
                s = l8_keep(_mm256_add_epi32(
                    s,
                    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv)), ones)));
            }
            const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)xg)),
                                           _mm256_loadu_ps(dyf + 8 * gi));
            c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, c);
        }
        const cm_block_q8_0 *xt = (const cm_block_q8_0 *)(const void *)(wr + (size_t)ng * L8P_GROUP);
        for (int64_t b = 8 * ng; b < nb; b++) /* lq8_row's tail */
            c = lfma_lane(c, (int)(b & 7), hsum_i32(dot_s8s8(ld256(xt[b - 8 * ng].qs), ld256(xb[b].qs))),
                          f16f(xt[b - 8 * ng].d) * dyf[b]);
        y[i] = hsum8(c);
    }
}

static void gemm_p8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    CM_ASSERT(k / CM_QK8_0 <= L8_MAXNB);
    l8g_gemm(true, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

/* The AVX2 table only (dispatch.c calls it from cm_kernels_fill_avx2_own):
 * the avx512 table has q8lane_avx512.c's, with these bits. */
void cm_kernels_fill_lq8_avx2(cm_kernels *k) {
    k->vec_dot[CM_TYPE_Q8_0] = vec_dot_lq8_0;
    k->gemm[CM_TYPE_Q8_0] = gemm_lq8_0;
    k->gemv[CM_TYPE_Q8_0] = gemv_lq8_0;
    k->repack[CM_TYPE_Q8_0] = cm_repack_q8_0_lanes; /* "q8_0 lanes" (repack.c) */
    k->gemv_packed[CM_TYPE_Q8_0] = gemv_p8_0;
    k->gemm_packed[CM_TYPE_Q8_0] = gemm_p8_0;
}

void cm_kernels_fill_lane_avx2(cm_kernels *k) {
    k->vec_dot[CM_TYPE_Q4_0] = vec_dot_lq4_0;
    k->gemm[CM_TYPE_Q4_0] = gemm_lq4_0;
    k->gemv[CM_TYPE_Q4_0] = NULL;
    k->gemv_packed[CM_TYPE_Q4_0] = gemv_lq4_0;
    k->gemm_packed[CM_TYPE_Q4_0] = gemm_plq4_0;
    k->gemm_packed_max = CM_GEMM_PACKED_ALL; /* the packed gemm at every batch size */
}
