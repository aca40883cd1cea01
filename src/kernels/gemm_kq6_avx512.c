/*
 * gemm_kq6_avx512.c: AVX-512 (VNNI) prefill gemm for q6_k with the weights
 * of a register tile's rows held in registers across its tokens, and q6_k's
 * decode gemv over rows repacked at load ("q6_k lanes"; gemv_kd_avx512.c
 * replaces it and keeps it for rows longer than its own). Moved out of
 * gemm_kq_avx512.c.
 *
 * From 32 tokens (KT6_MINTOK): 16 tokens in the int32 lanes (q5_k's
 * scheme), 4 rows x 2 groups of 16 per tile, in ztile_q6_k's float order
 * (below, "tokens in lanes"); measured on Zen 4 at 64-128 tokens ~10-15%
 * faster than the tiles below, which keep smaller batches and a batch's last
 * n_tok % 16 tokens when fewer than 12.
 *
 * The tiles: one int32 lane per sub-block: four vpdpbusd of the 6-bit
 * values (unsigned) against the token (signed), started from -32 * the
 * token's bsums, then one vpmulld with the scales: 5 multiplies per 256
 * products where the word-pair scheme spends 6 plus two shifts and blends;
 * the float side runs once per 16 super-blocks (ztile_q6_k's order: each
 * super-block's exact integer sum, converted, one FMA with d * dy). The
 * token operand is loaded once for both rows of the tile (an empty asm keeps
 * gcc from folding it into each vpdpbusd as a memory operand: that extra
 * load per row cost ~15%).
 *
 * Rows are unpacked once per pass of tokens into a stack buffer, tokens
 * packed once per pass. Every (row, token) is bit-identical to the table's
 * vec_dot (kernels.h; tests/unit/test_kernels_kq.c, test_kernels_invariant.c).
 * The same gemm over "q6_k lanes" rows is the table's gemm_packed (gemm_pq6:
 * the weights held once, repack.c; tests/unit/test_kernels_repack.c).
 *
 * Installed into the avx512 table by cm_kernels_fill_kq6_avx512 (dispatch.c)
 * after kernels_avx512.c, whose gemm (avx512_kgemm.h over ztile_q6_k, the
 * 4-token tiles) stays the fallback for rows longer than KQ_MAXNB
 * super-blocks and for one token. Stack: ~430 KiB at most (one of the two
 * gemms at a time; compute threads have CM_COMPUTE_STACK). Never allocates.
 */
#include "isa.h"

#include "base/base.h"

#include <immintrin.h>
#include <string.h>

#include "avx512_kpacked.h"

#define KQ_AI static inline __attribute__((always_inline))

enum {
    KQ_MAXNB = 64,        /* super-blocks per row (k <= 16384) */
    KQ_PASS = 256 * 1024, /* bytes of packed token values per pass (stay in L2 while row tiles walk them) */
    KQ16_R = 2,
    KQ16_T = 4, /* register tile: rows x tokens */
};

static cm_gemm_fn g_prev_q6; /* the table's gemm before ours (long rows, one token) */

KQ_AI __m256i kq_ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
KQ_AI const cm_block_q8_k *kq_tok(const void *x, size_t x_stride, int64_t j) {
    return (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)j * x_stride);
}

/* ---------------- q6_k ----------------
 * The avx512 table's q6_k dot (ztile_q6_k in kernels_avx512.c): per
 * super-block b the exact integer sum of its sub-blocks' scale times
 * sum((q - 32) * y), converted, one FMA with d * dy into float lane b % 16,
 * the 16 lanes summed at the end by _mm512_reduce_add_ps. Here per
 * super-block an int32 vector whose 128-bit lane j holds sub-blocks j, 4 +
 * j, 8 + j and 12 + j; kq_red2 / kq_red22 and kq_place16 sum 16
 * super-blocks' vectors into one (lane m: super-block 16q + m; integers, any
 * order), then one conversion and FMA for all 16. Here the row's
 * 6-bit values (unsigned) and the token's bytes are both laid out so that
 * dword L = 4j + i of operand v holds elements 4v .. 4v + 3 of sub-block 4i
 * + j: four vpdpbusd chained from the token's -32 * bsums give the
 * sub-block sums, one vpmulld the scales. */
typedef struct {
    __m512i q[4]; /* q (0..63), operand v: dword 4j + i = sub-block 4i + j's elements 4v.. */
    __m512i sc;   /* dword 4j + i: scale of sub-block 4i + j */
} kq6_blk;

typedef struct {
    __m512i y[4]; /* the token's bytes in kq6_blk's order */
    __m512i c;    /* dword 4j + i: -32 * bsums[4i + j] */
} kq6_tok;

/* Four vectors X_i whose 128-bit lane j holds 4 dwords -> o[v], dword 4j + i
 * = X_i's dword v of lane j. */
KQ_AI void kq6_transpose(const __m512i x[4], __m512i o[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(x[0], x[1]), t1 = _mm512_unpackhi_epi32(x[0], x[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(x[2], x[3]), t3 = _mm512_unpackhi_epi32(x[2], x[3]);
    o[0] = _mm512_unpacklo_epi64(t0, t2);
    o[1] = _mm512_unpackhi_epi64(t0, t2);
    o[2] = _mm512_unpacklo_epi64(t1, t3);
    o[3] = _mm512_unpackhi_epi64(t1, t3);
}
/* dword 4j + i = the sum of s_i's 128-bit lane j (kernels_avx512.c's red4) */
KQ_AI __m512i kq_red2(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
KQ_AI __m512i kq_red22(__m512i p01, __m512i p23) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
}

/* byte 4j + i of the scales: scale 4i + j */
static const int8_t k_kq6_sperm[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/* The values of a "q6_k lanes" super-block (repack.c) as kq6_blk's operands:
 * v[u] = the 64 values at positions 64u.. (dword 4j + i: sub-block 4i + j's
 * elements 4u..) */
KQ_AI void kq6_lanes_vals(const cm_block_q6_k *x, __m512i v[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i l0 = _mm512_loadu_si512(x->ql), l1 = _mm512_loadu_si512(x->ql + 64), h = _mm512_loadu_si512(x->qh);
    v[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
    v[1] =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
    v[2] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(h, m30));
    v[3] =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
}

/* o[b] (zero from nb to nb rounded up to 4), dg[q]: lane m = d of super-block 16q + m (0 past nb);
 * lanes: x is a row of "q6_k lanes", whose values and scales are already in o's order */
KQ_AI void kq6_unpack(int64_t nb, const cm_block_q6_k *x, kq6_blk *o, __m512 *dg, bool lanes) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    static const uint16_t k_shift[2][32] = {
        {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}};
    const __m512i shl = _mm512_loadu_si512(k_shift[0]), shr = _mm512_loadu_si512(k_shift[1]);
    const __m128i sp = _mm_loadu_si128((const __m128i *)(const void *)k_kq6_sperm);
    for (int64_t b = 0; lanes && b < nb; b++) {
        kq6_lanes_vals(x + b, o[b].q);
        o[b].sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)x[b].scales));
    }
    for (int64_t b = 0; !lanes && b < nb; b++) {
        __m512i X
        [4];
        for (int c = 0; c < 2; c++) { /* X[2c]: elements 128c.., X[2c + 1]: 128c + 64.. */
            const __m512i l = _mm512_loadu_si512(x[b].ql + 64 * c);
            const __m512i h = _mm512_broadcast_i64x4(kq_ld256(x[b].qh + 32 * c));
            X
            [2 * c] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30));
            X
            [2 * c + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(h, shr), m30));
        }
        kq6_transpose(X, o[b].q);
        o[b].sc =
            _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)x[b].scales), sp));
    }
    for (int64_t b = nb; b < (nb + 3) / 4 * 4; b++) memset(&o[b], 0, sizeof o[b]);
    for (int64_t q = 0; q < (nb + 15) / 16; q++) {
        _Alignas(64) float d[16];
        for (int m = 0; m < 16; m++) d[m] = 16 * q + m < nb ? _cvtsh_ss(x[16 * q + m].d) : 0.0f;
        dg[q] = _mm512_load_ps(d);
    }
}

/* tokens [j0, j0 + nt): o[t * nbp + b] (nbp = nb rounded up to 4, zero past nb), dyg[t * nq + q] (lane m: dy of 16q + m, 0 past nb) */
static void kq6_pack(const void *x, size_t x_stride, int64_t j0, int64_t nt, int64_t nb, kq6_tok *o, __m512 *dyg) {
    const int64_t ng = (nb + 3) / 4;
    for (int64_t t = 0; t < nt; t++) {
        const cm_block_q8_k *y = kq_tok(x, x_stride, j0 + t);
        for (int64_t b = nb; b < 4 * ng; b++) memset(o + t * 4 * ng + b, 0, sizeof *o);
        for (int64_t b = 0; b < nb; b++) {
            kq6_tok *p = o + t * 4 * ng + b;
            __m512i X
            [4];
            for (int i = 0; i < 4; i++) X
            [i] = _mm512_loadu_si512(y[b].qs + 64 * i);
            kq6_transpose(X, p->y);
            int32_t c[16];
            for (int L = 0; L < 16; L++) c[L] = -32 * (int32_t)y[b].bsums[k_kq6_sperm[L]];
            p->c = _mm512_loadu_si512(c);
        }
        const int64_t nq = (nb + 15) / 16;
        for (int64_t q = 0; q < nq; q++) {
            _Alignas(64) float d[16];
            for (int m = 0; m < 16; m++) d[m] = 16 * q + m < nb ? y[16 * q + m].d : 0.0f;
            dyg[t * nq + q] = _mm512_load_ps(d);
        }
    }
}

/* super-block b's sums into s[r][t] */
KQ_AI void kq6_sb(int64_t nb, const kq6_blk *const *xb, const kq6_tok *yt, int64_t b, int R, int T,
                  __m512i s[KQ16_R][KQ16_T]) {
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
        const __m512i c = _mm512_load_si512((const void *)&yt[t * nb + b].c);
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) s[r][t] = c;
    }
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
        __m512i q[KQ16_R];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) q[r] = _mm512_load_si512((const void *)&xb[r][b].q[v]);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            __m512i y = _mm512_load_si512((const void *)&yt[t * nb + b].y[v]);
            __asm__("" : "+v"(y)); /* one load for the R rows, not one memory operand each */
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) s[r][t] = _mm512_dpbusd_epi32(s[r][t], q[r], y);
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        const __m512i sc = _mm512_load_si512((const void *)&xb[r][b].sc);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s[r][t] = _mm512_mullo_epi32(s[r][t], sc);
    }
}

/* red4's output q (dword 4j + i: super-block 4k + i's part in 128-bit lane
 * j) summed over j into lanes 4k .. 4k + 3 of v (kernels_avx512.c's place16) */
KQ_AI __m512i kq_place16(__m512i v, __m512i q, int k) {
    __m512i h = _mm512_add_epi32(q, _mm512_shuffle_i32x4(q, q, 0x4e));
    h = _mm512_add_epi32(h, _mm512_shuffle_i32x4(h, h, 0xb1));
    return _mm512_mask_mov_epi32(v, (__mmask16)(0xfu << (4 * k)), h);
}

/* ztile_q6_k's float side: every 16 super-blocks, their exact sums (lane m:
 * super-block 16q + m) converted and one FMA with d * dy */
KQ_AI void kq6_tile(int64_t ng, const kq6_blk *const *xb, const __m512 *const *xd, const kq6_tok *yt, const __m512 *dyg,
                    int R, int T, float *out) {
    const int64_t nb = 4 * ng, nq = (ng + 3) / 4; /* padded: zero super-blocks give zero sums */
    __m512 af[KQ16_R][KQ16_T];
    __m512i v[KQ16_R][KQ16_T];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
        af[r][t] = _mm512_setzero_ps();
        v[r][t] = _mm512_setzero_si512();
    }
    for (int64_t g = 0; g < ng; g++) {
        __m512i s0[KQ16_R][KQ16_T], s1[KQ16_R][KQ16_T], p[KQ16_R][KQ16_T];
        kq6_sb(nb, xb, yt, 4 * g, R, T, s0);
        kq6_sb(nb, xb, yt, 4 * g + 1, R, T, s1);
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            p[r][t] = kq_red2(s0[r][t], s1[r][t]);
        kq6_sb(nb, xb, yt, 4 * g + 2, R, T, s0);
        kq6_sb(nb, xb, yt, 4 * g + 3, R, T, s1);
        const int k = (int)(g & 3);
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            v[r][t] = kq_place16(v[r][t], kq_red22(p[r][t], kq_red2(s0[r][t], s1[r][t])), k);
        if (k == 3 || g == ng - 1) {
            const int64_t q = g / 4;
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                af[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[r][t]), _mm512_mul_ps(xd[r][q], dyg[t * nq + q]), af[r][t]);
                v[r][t] = _mm512_setzero_si512();
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
        out[r * KQ16_T + t] = _mm512_reduce_add_ps(af[r][t]);
}

/* ---------------- tokens in lanes (n_tok >= KT6_MINTOK) ----------------
 * int32 lane t is token t of a group of 16 (q5_k's scheme, gemm_kq_avx512.c)
 * with ztile_q6_k's float order unchanged: per super-block b and row the
 * exact integer sum I_b for 16 tokens at once, converted, one FMA with
 * d * dy into float lane b % 16, which here is one of 16 vectors per row
 * (A, on the stack); the final tree across them is _mm512_reduce_add_ps's.
 * Tokens are packed once per pass as y + 128 (unsigned), rows unpacked once
 * per pass as q - 32 (signed, broadcast a dword at a time): per sub-block j
 * a chain of 4 vpdpbusd gives D_j = sum((y + 128)(q - 32)), one vpmulld its
 * scale; sum(y (q - 32)) = D_j - 128 Q_j (Q_j = sum(q - 32)), so I_b starts
 * from K = -128 sum_j sc_j Q_j (the row's). |I_b| < 2^28 and every partial
 * sum fits int32. Per super-block, row and 16 tokens: 64 vpdpbusd and 16
 * vpmulld (the lane-per-sub-block tiles: the same multiplies plus the
 * transposes that gather each super-block's 16 lanes; the vpmulld cost ~10%
 * here, measured by leaving them out); each token vector loaded once for
 * KT6_R rows, each row dword broadcast once for KT6_G groups (the j loop
 * unrolled 2, not 16: fully unrolled, gcc reloaded the token vectors per
 * row and spilled). The row's K comes from 8 vpdpbusd of its 6-bit values
 * against the scales (a scalar sum per sub-block cost ~5% at 32 tokens). */
enum {
    KT6_R = 4,          /* rows per tile */
    KT6_G = 2,          /* token groups per tile */
    KT6_MINTOK = 32,    /* fewer tokens: kq6_tile (measured: the row unpack per pass outweighs the gain below 32) */
    KT6_MINREM = 12,    /* a batch's last n_tok % 16 tokens when fewer: kq6_tile too */
    KT6_TOKB = 65 * 64, /* a token group's super-block: 64 value vectors, dy */
    KT6_PASS = KQ_MAXNB * KT6_TOKB, /* one group of 16 tokens of the longest row */
};

typedef struct {
    _Alignas(64) int8_t q[256]; /* q - 32 in element order */
    int32_t sc[16];             /* the sub-blocks' scales */
    int32_t k;                  /* -128 sum_j sc_j Q_j */
    float d;
} kt6_blk;

KQ_AI void kq6_unlanes_blk(const cm_block_q6_k *x, cm_block_q6_k *o);

/* lanes: x is a row of "q6_k lanes" (each super-block turned back into the file's bytes first) */
static void kt6_unpack(int64_t nb, const cm_block_q6_k *xr, kt6_blk *o, bool lanes) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++) {
        cm_block_q6_k tmp;
        if (lanes) kq6_unlanes_blk(xr + b, &tmp);
        const cm_block_q6_k *x = lanes ? &tmp : xr + b;
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)x->scales));
        _mm512_storeu_si512(o[b].sc, sc);
        __m256i acc = _mm256_setzero_si256(); /* sum_j sc_j * sum(q) over sub-block j, in pieces */
        for (int c = 0; c < 2; c++) {         /* elements 128c + 32e + l, e = 0..3 */
            const __m256i l0 = kq_ld256(x->ql + 64 * c), l1 = kq_ld256(x->ql + 64 * c + 32);
            const __m256i h = kq_ld256(x->qh + 32 * c);
            __m256i v[4];
            v[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            v[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
            v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            for (int e = 0; e < 4; e++) { /* sub-blocks 8c + 2e (bytes 0-15), 8c + 2e + 1 */
                const int j = 8 * c + 2 * e;
                _mm256_store_si256((__m256i *)(void *)(o[b].q + 128 * c + 32 * e), _mm256_sub_epi8(v[e], k32));
                acc = _mm256_dpbusd_epi32(
                    acc, v[e], _mm256_set_m128i(_mm_set1_epi8(x->scales[j + 1]), _mm_set1_epi8(x->scales[j])));
            }
        }
        /* sum_j sc_j Q_j = sum_j sc_j (sum(q) - 16 * 32) */
        const __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        const int32_t sq = _mm_cvtsi128_si32(a4) + _mm_extract_epi32(a4, 1) + _mm_extract_epi32(a4, 2) +
                           _mm_extract_epi32(a4, 3) - 512 * _mm512_reduce_add_epi32(sc);
        o[b].k = -128 * sq;
        o[b].d = _cvtsh_ss(x->d);
    }
}

/* Tokens j0 + t (t < T <= 16) into one group: per super-block 64 vectors
 * (lane t: token t's y[4c..4c+3] + 128) and dy; lanes past T zero. */
static void kt6_pack(const void *x, size_t x_stride, int64_t j0, int T, int64_t nb, uint8_t *o) {
    for (int64_t b = 0; b < nb; b++) {
        uint32_t *a = (uint32_t *)(void *)(o + (size_t)b * KT6_TOKB);
        float *dy = (float *)(void *)(a + 64 * 16);
        for (int t = 0; t < 16; t++) {
            if (t >= T) {
                for (int c = 0; c < 64; c++) a[c * 16 + t] = 0;
                dy[t] = 0.0f;
                continue;
            }
            const cm_block_q8_k *y = kq_tok(x, x_stride, j0 + t) + b;
            uint32_t v[64];
            memcpy(v, y->qs, 256);
            for (int c = 0; c < 64; c++) a[c * 16 + t] = v[c] ^ 0x80808080u;
            dy[t] = y->d;
        }
    }
}

KQ_AI int32_t kt6_ld(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* R rows (xb: their unpacked super-blocks) against G packed groups of 16
 * tokens (gs bytes apart): out[g][r][t] (ztile_q6_k's bits for each (row,
 * token)). Each broadcast dword of a row feeds the G groups. */
KQ_AI void kt6_rows(int64_t nb, const kt6_blk *const *xb, const uint8_t *pg, int64_t gs, int R, int G,
                    float (*out)[KT6_R][16]) {
    __m512 A[KT6_G][KT6_R][16];
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            for (int l = 0; l < 16; l++) A[g][r][l] = _mm512_setzero_ps();
    const __m512i z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pg + (size_t)b * KT6_TOKB;
        __m512i S[KT6_G][KT6_R], C[KT6_G][KT6_R];
        _Pragma("GCC unroll 2") for (int g = 0; g < G; g++) _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            S[g][r] = _mm512_set1_epi32(xb[r][b].k);
        _Pragma("GCC unroll 2") for (int j = 0; j < 16; j++) {
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                __m512i a[KT6_G];
                _Pragma("GCC unroll 2") for (int g = 0; g < G; g++) a[g] =
                    _mm512_load_si512((const void *)(pb + g * gs + 64 * (4 * j + c)));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    __m512i q = _mm512_set1_epi32(kt6_ld(xb[r][b].q + 16 * j + 4 * c));
                    if (G > 1) __asm__("" : "+v"(q)); /* one broadcast for the G groups */
                    _Pragma("GCC unroll 2") for (int g = 0; g < G; g++) C[g][r] =
                        _mm512_dpbusd_epi32(c ? C[g][r] : z, a[g], q);
                }
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const __m512i sc = _mm512_set1_epi32(xb[r][b].sc[j]);
                _Pragma("GCC unroll 2") for (int g = 0; g < G; g++) S[g][r] =
                    _mm512_add_epi32(S[g][r], _mm512_mullo_epi32(C[g][r], sc));
            }
        }
        const int l = (int)(b & 15);
        _Pragma("GCC unroll 2") for (int g = 0; g < G; g++) {
            const __m512 dy = _mm512_load_ps((const void *)(pb + g * gs + 64 * 64));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) A[g][r][l] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[g][r]), _mm512_mul_ps(_mm512_set1_ps(xb[r][b].d), dy), A[g][r][l]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++) { /* _mm512_reduce_add_ps's tree, for 16 tokens at once */
            __m512 h[8];
            for (int i = 0; i < 8; i++) h[i] = _mm512_add_ps(A[g][r][i + 8], A[g][r][i]);
            for (int i = 0; i < 4; i++) h[i] = _mm512_add_ps(h[i + 4], h[i]);
            const __m512 e0 = _mm512_add_ps(h[0], h[2]), e1 = _mm512_add_ps(h[1], h[3]);
            _mm512_storeu_ps(out[g][r], _mm512_add_ps(e0, e1));
        }
}

__attribute__((noinline)) static void gemm_kt6(int64_t k, const void *w, size_t w_stride, const void *x,
                                               size_t x_stride, float *y, int64_t ldy, int64_t r0, int64_t r1,
                                               int64_t n_tok, bool lanes) {
    const int64_t nb = k / CM_QK_K;
    _Alignas(64) uint8_t pk[KT6_PASS];
    _Alignas(64) kt6_blk ub[KT6_R][KQ_MAXNB];
    const int64_t gb = nb * KT6_TOKB, gcap = (int64_t)sizeof pk / gb; /* groups per pass */
    for (int64_t j0 = 0; j0 < n_tok; j0 += gcap * 16) {
        const int64_t left = n_tok - j0, ng = (left + 15) / 16 < gcap ? (left + 15) / 16 : gcap;
        for (int64_t g = 0; g < ng; g++)
            kt6_pack(x, x_stride, j0 + 16 * g, left - 16 * g < 16 ? (int)(left - 16 * g) : 16, nb, pk + g * gb);
        for (int64_t i = r0; i < r1; i += KT6_R) {
            const int R = r1 - i < KT6_R ? (int)(r1 - i) : KT6_R;
            const kt6_blk *xb[KT6_R];
            for (int r = 0; r < R; r++) {
                kt6_unpack(nb, (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),
                           ub[r], lanes);
                xb[r] = ub[r];
            }
            for (int64_t g = 0; g < ng; g += KT6_G) {
                float out[KT6_G][KT6_R][16];
                const uint8_t *pg = pk + g * gb;
                if (g + 1 < ng) switch (R) {
                    case 4: kt6_rows(nb, xb, pg, gb, 4, 2, out); break;
                    case 3: kt6_rows(nb, xb, pg, gb, 3, 2, out); break;
                    case 2: kt6_rows(nb, xb, pg, gb, 2, 2, out); break;
                    default: kt6_rows(nb, xb, pg, gb, 1, 2, out); break;
                    }
                else switch (R) {
                    case 4: kt6_rows(nb, xb, pg, gb, 4, 1, out); break;
                    case 3: kt6_rows(nb, xb, pg, gb, 3, 1, out); break;
                    case 2: kt6_rows(nb, xb, pg, gb, 2, 1, out); break;
                    default: kt6_rows(nb, xb, pg, gb, 1, 1, out); break;
                    }
                for (int gg = 0; gg < KT6_G && g + gg < ng; gg++) {
                    const int T = left - 16 * (g + gg) < 16 ? (int)(left - 16 * (g + gg)) : 16;
                    for (int r = 0; r < R; r++)
                        for (int t = 0; t < T; t++) y[(j0 + 16 * (g + gg) + t) * ldy + i + r] = out[gg][r][t];
                }
            }
        }
    }
}

/* the lane-per-sub-block tiles (few tokens, and the last few of a batch) */
__attribute__((noinline)) static void gemm_kq6_tiles(int64_t k, const void *w, size_t w_stride, const void *x,
                                                     size_t x_stride, float *y, int64_t ldy, int64_t r0, int64_t r1,
                                                     int64_t n_tok, bool lanes) {
    const int64_t nb = k / CM_QK_K, ng = (nb + 3) / 4, nq = (nb + 15) / 16;
    enum { CAPMAX = KQ_PASS / (int)CM_QK_K };
    _Alignas(64) kq6_blk buf[KQ16_R * (KQ_MAXNB + 3)];
    _Alignas(64) __m512 dbuf[KQ16_R * KQ_MAXNB / 4];
    _Alignas(64) kq6_tok yp[CAPMAX];
    _Alignas(64) __m512 dyg[CAPMAX];
    const int64_t cap = CAPMAX / (4 * ng); /* tokens per pass, >= 16 */
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;
        kq6_pack(x, x_stride, j0, nt, nb, yp, dyg);
        for (int64_t i = r0; i < r1; i += KQ16_R) {
            const int R = r1 - i < KQ16_R ? (int)(r1 - i) : KQ16_R;
            const kq6_blk *xb[KQ16_R];
            const __m512 *xd[KQ16_R];
            for (int r = 0; r < R; r++) {
                kq6_unpack(nb, (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),
                           buf + r * 4 * ng, dbuf + r * nq, lanes);
                xb[r] = buf + r * 4 * ng;
                xd[r] = dbuf + r * nq;
            }
            for (int64_t jj = 0; jj < nt; jj += KQ16_T) {
                const int T = nt - jj < KQ16_T ? (int)(nt - jj) : KQ16_T;
                const kq6_tok *yt = yp + jj * 4 * ng;
                const __m512 *dt = dyg + jj * nq;
                float out[KQ16_R * KQ16_T];
                if (R == KQ16_R && T == KQ16_T) kq6_tile(ng, xb, xd, yt, dt, KQ16_R, KQ16_T, out);
                else
                    for (int r = 0; r < R; r++) {
                        const kq6_blk *const *xr = xb + r;
                        const __m512 *const *dr = xd + r;
                        float *o = out + r * KQ16_T;
                        switch (T) {
                        case 4: kq6_tile(ng, xr, dr, yt, dt, 1, 4, o); break;
                        case 3: kq6_tile(ng, xr, dr, yt, dt, 1, 3, o); break;
                        case 2: kq6_tile(ng, xr, dr, yt, dt, 1, 2, o); break;
                        default: kq6_tile(ng, xr, dr, yt, dt, 1, 1, o); break;
                        }
                    }
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i + r] = out[r * KQ16_T + t];
            }
        }
    }
}

static void gemm_pq6_long(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                          int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok);

KQ_AI void kq6_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                    int64_t r0, int64_t r1, int64_t n_tok, bool lanes) {
    if (k / CM_QK_K > KQ_MAXNB || n_tok < 2) {
        if (lanes) gemm_pq6_long(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        else g_prev_q6(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    const int64_t rem = n_tok % 16, n16 = n_tok < KT6_MINTOK ? 0 : rem < KT6_MINREM ? n_tok - rem : n_tok;
    if (n16 > 0) gemm_kt6(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n16, lanes);
    if (n16 < n_tok)
        gemm_kq6_tiles(k, w, w_stride, (const char *)x + (size_t)n16 * x_stride, x_stride, y + n16 * ldy, ldy, r0, r1,
                       n_tok - n16, lanes);
}

static void gemm_kq6(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    kq6_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

/* The table's gemm_packed: the same over "q6_k lanes" (repack.c), so that the
 * file's pages can go back (cm_repack_give_back): kq6_tile's unpack reads the
 * lanes as they are (its operand order), the tokens-in-lanes unpack turns each
 * super-block back into the file's bytes first (kq6_unlanes_blk; ~7 ns a
 * super-block, once per pass of >= 32 tokens), rows longer than KQ_MAXNB
 * super-blocks go through avx512_kpacked.h to kernels_avx512.c's gemm. */
static void gemm_pq6(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    kq6_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

/* ---- q6_k decode over "q6_k lanes" (repack.c): the rows' values already
 * in kq6_blk's operand order, 6 bits each as in the file (210 bytes per
 * super-block), so a row streams at its file size; the token packed once
 * per call (kq6_pack). Same sums, groups and float side as the gemm. ---- */
enum { KQ6V_MAXNB = 128 }; /* rows up to CM_REPACK_MAX_K */

KQ_AI __m512i kq6v_sb(const cm_block_q6_k *x, const kq6_tok *yt) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i l0 = _mm512_loadu_si512(x->ql), l1 = _mm512_loadu_si512(x->ql + 64), h = _mm512_loadu_si512(x->qh);
    const __m512i v0 = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
    const __m512i v1 =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
    const __m512i v2 = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(h, m30));
    const __m512i v3 =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
    __m512i s = _mm512_load_si512((const void *)&yt->c);
    s = _mm512_dpbusd_epi32(s, v0, _mm512_load_si512((const void *)&yt->y[0]));
    s = _mm512_dpbusd_epi32(s, v1, _mm512_load_si512((const void *)&yt->y[1]));
    s = _mm512_dpbusd_epi32(s, v2, _mm512_load_si512((const void *)&yt->y[2]));
    s = _mm512_dpbusd_epi32(s, v3, _mm512_load_si512((const void *)&yt->y[3]));
    return _mm512_mullo_epi32(s, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)x->scales)));
}

static void gemv_kq6v(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= KQ6V_MAXNB);
    _Alignas(64) kq6_tok yp[KQ6V_MAXNB + 3];
    _Alignas(64) __m512 dyg[KQ6V_MAXNB / 16];
    kq6_pack(x, 0, 0, 1, nb, yp, dyg);
    for (int64_t i = r0; i < r1; i++) {
        const cm_block_q6_k *xr = (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)i * w_stride);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            __m512i v = _mm512_setzero_si512();
            for (int kk = 0; kk < 4 && b0 + 4 * kk < nb; kk++) {
                __m512i s[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                    const int64_t b = b0 + 4 * kk + j;
                    s[j] = b < nb ? kq6v_sb(xr + b, yp + b) : _mm512_setzero_si512();
                }
                v = kq_place16(v, kq_red22(kq_red2(s[0], s[1]), kq_red2(s[2], s[3])), kk);
            }
            _Alignas(64) float d[16];
            for (int m = 0; m < 16; m++) d[m] = b0 + m < nb ? _cvtsh_ss(xr[b0 + m].d) : 0.0f;
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(_mm512_load_ps(d), dyg[b0 / 16]), acc);
        }
        y[i] = _mm512_reduce_add_ps(acc);
    }
}

/* ---- "q6_k lanes" back to the file's bytes, one super-block. The lanes'
 * operand v (kq6_lanes_vals: dword 4j + i = sub-block 4i + j's elements 4v..)
 * is the 4 x 4 dword transpose per 128-bit lane of the elements in order
 * (kq6_transpose is its own inverse), which the file's ql / qh encoding then
 * packs as dequantize_row_q6_K reads it; the scales' order is a transpose
 * too. ---- */
KQ_AI void kq6_unlanes_blk(const cm_block_q6_k *x, cm_block_q6_k *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m03 = _mm512_set1_epi8(0x03);
    __m512i v[4], q[4];
    kq6_lanes_vals(x, v);
    kq6_transpose(v, q); /* q[r]: elements 64r .. 64r + 63 */
    for (int c = 0; c < 2; c++) {
        const __m512i a = q[2 * c], b = q[2 * c + 1];
        _mm512_storeu_si512(o->ql + 64 * c,
                            _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_slli_epi16(_mm512_and_si512(b, m4), 4)));
        const __m512i hq = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m03),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(b, 4), m03), 4));
        const __m256i qh =
            _mm256_or_si256(_mm512_castsi512_si256(hq), _mm256_slli_epi16(_mm512_extracti64x4_epi64(hq, 1), 2));
        _mm256_storeu_si256((__m256i *)(void *)(o->qh + 32 * c), qh);
    }
    const __m128i sp = _mm_loadu_si128((const __m128i *)(const void *)k_kq6_sperm);
    _mm_storeu_si128((__m128i *)(void *)o->scales,
                     _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)x->scales), sp));
    o->d = x->d;
}

static void kq6_unlanes(int64_t nb, const uint8_t *src, cm_block_q6_k *dst) {
    const cm_block_q6_k *x = (const cm_block_q6_k *)(const void *)src;
    for (int64_t b = 0; b < nb; b++) kq6_unlanes_blk(x + b, dst + b);
}

KQ_AI void kq6_prev_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                         int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    g_prev_q6(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}
KP_GEMM(gemm_pq6_long, cm_block_q6_k, kq6_unlanes, kq6_prev_gemm)

void cm_kernels_fill_kq6_avx512(cm_kernels *k) {
    if (k->gemm[CM_TYPE_Q6_K]) {
        g_prev_q6 = k->gemm[CM_TYPE_Q6_K];
        k->gemm[CM_TYPE_Q6_K] = gemm_kq6;
        k->gemv_packed[CM_TYPE_Q6_K] = gemv_kq6v;
        k->gemm_packed[CM_TYPE_Q6_K] = gemm_pq6;
    }
}
