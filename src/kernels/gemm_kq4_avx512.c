/*
 * gemm_kq4_avx512.c: every q4_k kernel of the avx512 table (vec_dot, the
 * decode gemv, the gemm; all over the file's bytes: q4_k is not repacked on
 * this table, GEMV_K4) in one
 * float order, "z4": q5_k's z5 (x86_krepack.h, avx512_krepack.h) with 4-bit
 * values. Per super-block b the exact integer sums S_b (its 8 sub-blocks'
 * scale times sum(q * y)) and M_b (its 8 mins times the token's bsums pair
 * sums), each converted once; into float lane b % 16 one FMA of S_b with
 * d * dy, then one of M_b with -(dmin * dy); the 16 lanes summed at the end
 * by _mm512_reduce_add_ps's tree. How S_b and M_b are formed is free
 * (integers), so each path picks its own:
 *
 *   - one token (k4_row: vec_dot, the decode gemv; k4_multi runs it for a
 *     few tokens at once on rows longer than the gemms take): per 64
 *     weights one vpdpbusd of the nibbles (unsigned) against y (signed), two
 *     such 4-byte sums packed as the words of an int32 (one vpshufb) and one
 *     vpdpwssd with their sub-blocks' scales; each 16 super-blocks' 16
 *     dwords and the mins' products summed into lane b % 16 by transpose-adds
 *     (no horizontal sum per block), d and dmin of 4 blocks from one header
 *     (4 file-order blocks' first 16 bytes transposed into the form of a
 *     "q4_k lanes" group's), then the float side for 16 at once;
 *   - 2..11 tokens (gemm_kw4, batched decode): k4_row's integer lanes with
 *     the token packed once (k4_dotp: the file's qs as they are), a row
 *     unpacked once per pass and run against 4 tokens at a time, each 4
 *     blocks' sums folded into their lanes at once;
 *   - 12 tokens and more (kt4_rows, prefill): 16 tokens in the int32 lanes,
 *     4 rows x 16 tokens per tile. The token side packed once per pass
 *     as y + 128 (unsigned) so that the row's nibbles can be the signed
 *     operand, one vpdpbusd with the 4 weights broadcast from memory per 64
 *     products (no shuffles, no word pairs), one vpmulld with the sub-block's
 *     scale per 32 weights, the 128 * sum(q) offset taken out once per
 *     super-block (K), the mins by two vpdpwssd against the bsums pairs:
 *     4.3 multiplies per 256 products where the word-pair scheme spent 6 plus
 *     two pair shuffles per (row, token).
 *
 * Every (row, token) of every path is the same bits (kernels.h;
 * tests/unit/test_kernels_kq.c, test_kernels_invariant.c,
 * test_kernels_repack.c). Installed into the avx512 table by
 * cm_kernels_fill_kq4_avx512 (dispatch.c), replacing all of
 * kernels_avx512.c's q4_k entries. The helpers shared with gemv_kd_avx512.c's
 * q5_k rows (k4_red4, k4_place, the header transposes) are copies: that file
 * keeps its own. Stack: ~330 KiB at most (compute threads have
 * CM_COMPUTE_STACK). Never allocates.
 */
#include "isa.h"

#include "avx512_ktok.h"

#include "base/base.h"
#include "ref.h"
#include "x86_vec.h"

#include "x86_krepack.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define KQ_AI static inline __attribute__((always_inline))

/* ---------------- one token per row pass (k4_row) ---------------- */

/* word pairs (low word of a, low word of b) per dword in one vpshufb */
KQ_AI __m512i k4_pair(__m512i a, __m512i b) {
    const __m512i ctl = _mm512_broadcast_i32x4(_mm_setr_epi32(0x01000000, 0x05040000, 0x09080000, 0x0d0c0000));
    return _mm512_mask_shuffle_epi8(a, (__mmask64)0xccccccccccccccccull, b, ctl);
}

/* dword 4j + i of the result = the sum of a_i's 128-bit lane j, i = 0..3 */
KQ_AI __m512i k4_red4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i p01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    const __m512i p23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
}

/* q_k (dword 4j + i: part j of super-block 4k + i) -> lane 4k + i = sum over j */
KQ_AI __m512i k4_place(__m512i q0, __m512i q1, __m512i q2, __m512i q3) {
    const __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(q0, q1, 0x44), _mm512_shuffle_i32x4(q0, q1, 0xee));
    const __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(q2, q3, 0x44), _mm512_shuffle_i32x4(q2, q3, 0xee));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xdd));
}

/* One super-block's values: v[j] = elements 64j.. (the nibbles of qs + 32j,
 * low | high in the 256-bit halves) */
KQ_AI void k4_vals(const uint8_t *qs, __m512i v[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        const __m512i q = _mm512_broadcast_i64x4(ld256(qs + 32 * j));
        v[j] = _mm512_and_si512(_mm512_mask_srli_epi16(q, (__mmask32)0xffff0000u, q, 4), m4);
    }
}

/* One super-block's scaled lane sums (16 dwords, exact; their total is S_b);
 * s[h]: word 2l (l < 8) scale 4h, 2l + 1 scale 4h + 2; l >= 8: 4h + 1, 4h + 3 */
KQ_AI __m512i k4_dot(const __m512i v[4], const __m512i s[2], const int8_t *yq) {
    const __m512i z = _mm512_setzero_si512();
    __m512i s16 = z;
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m512i d0 = _mm512_dpbusd_epi32(z, v[2 * h], _mm512_loadu_si512(yq + 128 * h));
        const __m512i d1 = _mm512_dpbusd_epi32(z, v[2 * h + 1], _mm512_loadu_si512(yq + 128 * h + 64));
        s16 = _mm512_dpwssd_epi32(s16, k4_pair(d0, d1), s[h]);
    }
    return s16;
}

/* k4_dot against the token packed by k4_pack (yp: its 256 bytes of the
 * block): the file's 64-byte runs of qs used as they are, lane l < 8 of
 * half h: sub-blocks 4h | 4h + 1, l >= 8: 4h + 2 | 4h + 3 */
KQ_AI __m512i k4_dotp(const uint8_t *qs, const __m512i s[2], const uint8_t *yp) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), z = _mm512_setzero_si512();
    __m512i s16 = z;
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m512i q = _mm512_loadu_si512(qs + 64 * h);
        const __m512i d0 = _mm512_dpbusd_epi32(z, _mm512_and_si512(q, m4), _mm512_load_si512(yp + 128 * h));
        const __m512i d1 =
            _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4), _mm512_load_si512(yp + 128 * h + 64));
        s16 = _mm512_dpwssd_epi32(s16, k4_pair(d0, d1), s[h]);
    }
    return s16;
}

/* The token's values in k4_dotp's order: per super-block and half h, 64
 * bytes of elements 128h + 0..31 | 128h + 64..95, then 128h + 32..63 |
 * 128h + 96..127 */
static void k4_pack(int64_t nb, const cm_block_q8_k *y, uint8_t *d) {
    for (int64_t b = 0; b < nb; b++, d += 256)
        for (int h = 0; h < 2; h++) {
            const int8_t *q = y[b].qs + 128 * h;
            _mm512_store_si512((void *)(d + 128 * h),
                               _mm512_inserti64x4(_mm512_castsi256_si512(ld256(q)), ld256(q + 64), 1));
            _mm512_store_si512((void *)(d + 128 * h + 64),
                               _mm512_inserti64x4(_mm512_castsi256_si512(ld256(q + 32)), ld256(q + 96), 1));
        }
}

/* Four super-blocks' headers -> dd (dword i: block i's d | dmin << 16) and
 * the scale dwords a, b, c (repack.c's "q4_k lanes" group header): n (1..4)
 * file-order blocks' first 16 bytes transposed (zeros past n). */
KQ_AI void k4_hdr_file(const cm_block_q4_k *xt, int n, __m128i *dd, __m128i *a, __m128i *b, __m128i *c) {
    __m128i L[4];
    for (int i = 0; i < 4; i++)
        L[i] = i < n ? _mm_loadu_si128((const __m128i *)(const void *)(xt + i)) : _mm_setzero_si128();
    const __m128i t0 = _mm_unpacklo_epi32(L[0], L[1]), t1 = _mm_unpackhi_epi32(L[0], L[1]);
    const __m128i t2 = _mm_unpacklo_epi32(L[2], L[3]), t3 = _mm_unpackhi_epi32(L[2], L[3]);
    *dd = _mm_unpacklo_epi64(t0, t2);
    *a = _mm_unpackhi_epi64(t0, t2);
    *b = _mm_unpacklo_epi64(t1, t3);
    *c = _mm_unpackhi_epi64(t1, t3);
}

/* A quad's scale dwords a, b, c (rk_header's arithmetic) -> sw: 16 dwords
 * of two words, block j's scales (0, 2) at dword 2j, (1, 3) at 2j + 1,
 * (4, 6) at 8 + 2j, (5, 7) at 9 + 2j (k4_dot's pairs: one vpermd away;
 * packed: (0, 1), (2, 3), (4, 5), (6, 7), k4_dotp's);
 * mnw: the mins as words, block j's in 128-bit lane j */
KQ_AI void k4_scales(__m128i a, __m128i b, __m128i c, bool packed, __m512i *sw, __m512i *mnw) {
    const __m128i m3f = _mm_set1_epi32(0x3f3f3f3f), m0f = _mm_set1_epi32(0x0f0f0f0f), m03 = _mm_set1_epi32(0x03030303);
    const __m128i ord = packed ? _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                               : _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    const __m128i sc03 = _mm_shuffle_epi8(_mm_and_si128(a, m3f), ord);
    const __m128i sc47 = _mm_shuffle_epi8(
        _mm_or_si128(_mm_and_si128(c, m0f), _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(a, 6), m03), 4)), ord);
    const __m128i mn03 = _mm_and_si128(b, m3f);
    const __m128i mn47 = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(c, 4), m0f),
                                      _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(b, 6), m03), 4));
    const __m256i ml = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi32(mn03, mn47)),
                                               _mm_unpackhi_epi32(mn03, mn47), 1);
    *sw = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi16(sc03)), _mm256_cvtepu8_epi16(sc47), 1);
    *mnw = _mm512_cvtepu8_epi16(ml);
}

/* block j's scale pairs s[0], s[1] for k4_dot from sw */
KQ_AI void k4_spair(__m512i sw, int j, __m512i s[2]) {
    const __m512i base = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    s[0] = _mm512_permutexvar_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(2 * j)), sw);
    s[1] = _mm512_permutexvar_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(8 + 2 * j)), sw);
}

/* d (lanes 4k + i) and dmin of 16 super-blocks from the 4 quads' dd */
KQ_AI void k4_dd(const __m128i dd[4], __m512 *d, __m512 *dm) {
    const __m512i D =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(dd[0]), dd[1], 1)),
                           _mm256_inserti128_si256(_mm256_castsi128_si256(dd[2]), dd[3], 1), 1);
    *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D));
    *dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16)));
}

/* The token's side for 16 super-blocks b0..: bsums pair sums (zeros past nb,
 * up to a multiple of 4) and dy (0 past nb) */
KQ_AI void k4_tok16(int64_t b0, int64_t nb, const cm_block_q8_k *y, __m128i *pairs, __m512 *dy) {
    _Alignas(64) float d[16];
    for (int m = 0; m < 16; m++) {
        const int64_t b = b0 + m;
        if (b < nb) {
            const __m256i bs = ld256(y[b].bsums);
            pairs[m] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        } else pairs[m] = _mm_setzero_si128();
        d[m] = b < nb ? y[b].d : 0.0f;
    }
    *dy = _mm512_load_ps(d);
}

/* The decode gemvs prefetch K4_PFD bytes ahead of the quad being read (its
 * 9 lines, 2 per block; rows are contiguous, so past a row's end the next
 * rows'): from DRAM, 2048 x 2048 (8 super-blocks a row) ran 12% slower
 * than session 15's gemv without it and ~even with it, 5632 x 2048 1.05x
 * faster (bench/gvbench.c, Intel Xeon, session 17); a whole row 4 rows
 * ahead at once ran 1.3x slower. */
enum { K4_PFD = 2048 };
/* 16 super-blocks b0.. of a row in z4's order into acc (k4_row's step).
 * usepk: the token packed (k4_pack), else read as it is. */
KQ_AI __m512 k4_step(__m512 acc, int64_t b0, int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const __m128i *pp,
                     __m512 dy, const uint8_t *pk, bool usepk) {
    /* k4_red4 of the mins gives dword 4j + i = block 4i + j: back to 4i + j's lane */
    const __m512i mperm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const size_t BS = sizeof(cm_block_q4_k);
    __m512i q[4], mq[4];
    __m128i dd[4];
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const int64_t bq = b0 + 4 * k;
        if (bq >= nb) {
            q[k] = mq[k] = _mm512_setzero_si512();
            dd[k] = _mm_setzero_si128();
            continue;
        }
        const uint8_t *g = x + (size_t)bq * BS;
        const int n = nb - bq < 4 ? (int)(nb - bq) : 4;
        __m128i a, b, c;
        k4_hdr_file((const cm_block_q4_k *)(const void *)g, n, &dd[k], &a, &b, &c);
        const uint8_t *qs = g + offsetof(cm_block_q4_k, qs);
        const size_t sq = BS;
        __m512i sw, mnw, s4[4];
        k4_scales(a, b, c, usepk, &sw, &mnw);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            if (j >= n) {
                s4[j] = _mm512_setzero_si512();
                continue;
            }
            __m512i s[2], v[4];
            k4_spair(sw, j, s);
            if (usepk) { /* the decode gemv: the quad's 9 lines K4_PFD bytes on, 2 per block */
                _mm_prefetch((const char *)g + K4_PFD + 128 * j, _MM_HINT_T0);
                _mm_prefetch((const char *)g + K4_PFD + 128 * j + 64, _MM_HINT_T0);
                if (j == 3) _mm_prefetch((const char *)g + K4_PFD + 512, _MM_HINT_T0);
            }
            if (usepk) s4[j] = k4_dotp(qs + j * sq, s, pk + (size_t)(bq + j) * 256);
            else {
                k4_vals(qs + j * sq, v);
                s4[j] = k4_dot(v, s, y[bq + j].qs);
            }
        }
        q[k] = k4_red4(s4[0], s4[1], s4[2], s4[3]);
        mq[k] = _mm512_madd_epi16(mnw, _mm512_loadu_si512((const void *)(pp + 4 * k)));
    }
    const __m512i S = k4_place(q[0], q[1], q[2], q[3]);
    const __m512i M = _mm512_permutexvar_epi32(mperm, k4_red4(mq[0], mq[1], mq[2], mq[3]));
    __m512 d, dm;
    k4_dd(dd, &d, &dm);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(d, dy), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_xor_ps(_mm512_mul_ps(dm, dy), _mm512_set1_ps(-0.0f)), acc);
}

/* One row (the file's bytes) in z4's order. pairs / dyg: the token's
 * k4_tok16 for the whole row, or NULL (formed per 16 super-blocks here:
 * rows of any length); pk: the token packed by k4_pack (with pairs), or
 * NULL. */
KQ_AI float k4_row(int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const __m128i *pairs, const __m512 *dyg,
                   const uint8_t *pk) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        _Alignas(64) __m128i pl[16];
        __m512 dy;
        const __m128i *pp = pairs + b0;
        if (pairs) dy = dyg[b0 / 16];
        else k4_tok16(b0, nb, y, pl, &dy), pp = pl;
        acc = pk ? k4_step(acc, b0, nb, x, y, pp, dy, pk, true) : k4_step(acc, b0, nb, x, y, pp, dy, NULL, false);
    }
    return _mm512_reduce_add_ps(acc);
}

static void vec_dot_k4(int64_t n, float *s, const void *x, const void *y) {
    *s = k4_row(n / CM_QK_K, x, y, NULL, NULL, NULL);
}

/* The decode gemv over the file's bytes. No "q4_k lanes" gemv here: over
 * that layout the same loop ran x1.00-1.04 this one's speed (kbench
 * A B A B, thread CPU time, Xeon family 6 model 167, session 19), so q4_k
 * is not repacked on this table and its weights stay the file's, once. */
#define GEMV_K4(NAME)                                                                                                  \
    static void NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy, \
                     int64_t r0, int64_t r1, int64_t n_tok) {                                                          \
        (void)x_stride, (void)ldy, (void)n_tok;                                                                        \
        const int64_t nb = k / CM_QK_K;                                                                                \
        _Alignas(64) __m128i pairs[RK4_MAXB];                                                                          \
        _Alignas(64) __m512 dyg[RK4_MAXB / 16];                                                                        \
        _Alignas(64) uint8_t pk[RK4_MAXB * 256];                                                                       \
        const bool fit = nb <= RK4_MAXB;                                                                               \
        for (int64_t b0 = 0; fit && b0 < nb; b0 += 16) k4_tok16(b0, nb, x, pairs + b0, dyg + b0 / 16);                 \
        if (fit) k4_pack(nb, x, pk);                                                                                   \
        for (int64_t i = r0; i < r1; i++)                                                                              \
            y[i] = k4_row(nb, (const uint8_t *)w + (size_t)i * w_stride, x, fit ? pairs : NULL, fit ? dyg : NULL,      \
                          fit ? pk : NULL);                                                                            \
    }
GEMV_K4(gemv_k4f)

/* ---- a few tokens: k4_row for T tokens at once on the file's bytes, each
 * super-block's values and scale pairs built once for all of them; per token
 * the same integer sums, lanes and float steps as k4_row. ---- */
enum { K4_MT = 4 };

KQ_AI void k4_multi(int64_t nb, const uint8_t *x, const cm_block_q8_k *const *yv, const __m128i (*pairs)[RK4_MAXB],
                    const __m512 (*dyg)[RK4_MAXB / 16], int T, float *out) {
    const __m512i mperm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    const size_t BS = sizeof(cm_block_q4_k);
    __m512 acc[K4_MT];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        _Alignas(64) __m512i qt[K4_MT][4], mqt[K4_MT][4];
        __m128i dd[4];
        for (int k = 0; k < 4; k++) {
            const int64_t bq = b0 + 4 * k;
            if (bq >= nb) {
                for (int t = 0; t < T; t++) qt[t][k] = mqt[t][k] = _mm512_setzero_si512();
                dd[k] = _mm_setzero_si128();
                continue;
            }
            const int n = nb - bq < 4 ? (int)(nb - bq) : 4;
            const cm_block_q4_k *xq = (const cm_block_q4_k *)(const void *)(x + (size_t)bq * BS);
            __m128i a, b, c;
            k4_hdr_file(xq, n, &dd[k], &a, &b, &c);
            __m512i sw, mnw;
            k4_scales(a, b, c, false, &sw, &mnw);
            _Alignas(64) __m512i V[4][4], S[4][2];
            for (int j = 0; j < n; j++) {
                k4_spair(sw, j, S[j]);
                k4_vals(xq[j].qs, V[j]);
            }
            for (int t = 0; t < T; t++) {
                __m512i s4[4];
                for (int j = 0; j < 4; j++)
                    s4[j] = j < n ? k4_dot(V[j], S[j], yv[t][bq + j].qs) : _mm512_setzero_si512();
                qt[t][k] = k4_red4(s4[0], s4[1], s4[2], s4[3]);
                mqt[t][k] = _mm512_madd_epi16(mnw, _mm512_loadu_si512((const void *)(pairs[t] + bq)));
            }
        }
        __m512 d, dm;
        k4_dd(dd, &d, &dm);
        for (int t = 0; t < T; t++) {
            const __m512i Sv = k4_place(qt[t][0], qt[t][1], qt[t][2], qt[t][3]);
            const __m512i M = _mm512_permutexvar_epi32(mperm, k4_red4(mqt[t][0], mqt[t][1], mqt[t][2], mqt[t][3]));
            const __m512 dy = dyg[t][b0 / 16];
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Sv), _mm512_mul_ps(d, dy), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_xor_ps(_mm512_mul_ps(dm, dy), sgn), acc[t]);
        }
    }
    for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

/* n_tok tokens, K4_MT per row pass (rows past RK4_MAXB: k4_row per token) */
static void gemm_k4few(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    if (nb > RK4_MAXB) {
        for (int64_t j = 0; j < n_tok; j++) {
            const cm_block_q8_k *yt = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)j * x_stride);
            for (int64_t i = r0; i < r1; i++)
                y[j * ldy + i] = k4_row(nb, (const uint8_t *)w + (size_t)i * w_stride, yt, NULL, NULL, NULL);
        }
        return;
    }
    _Alignas(64) __m128i pairs[K4_MT][RK4_MAXB];
    _Alignas(64) __m512 dyg[K4_MT][RK4_MAXB / 16];
    for (int64_t j0 = 0; j0 < n_tok; j0 += K4_MT) {
        const int T = n_tok - j0 < K4_MT ? (int)(n_tok - j0) : K4_MT;
        const cm_block_q8_k *yv[K4_MT];
        for (int t = 0; t < T; t++) {
            yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
            for (int64_t b0 = 0; b0 < nb; b0 += 16) k4_tok16(b0, nb, yv[t], pairs[t] + b0, dyg[t] + b0 / 16);
        }
        const __m128i(*pp)[RK4_MAXB] = (const __m128i(*)[RK4_MAXB])pairs;
        const __m512(*dp)[RK4_MAXB / 16] = (const __m512(*)[RK4_MAXB / 16]) dyg;
        for (int64_t i = r0; i < r1; i++) {
            float out[K4_MT];
            const uint8_t *row = (const uint8_t *)w + (size_t)i * w_stride;
            switch (T) { /* T constant in each: the token loops unrolled */
            case 4: k4_multi(nb, row, yv, pp, dp, 4, out); break;
            case 3: k4_multi(nb, row, yv, pp, dp, 3, out); break;
            case 2: k4_multi(nb, row, yv, pp, dp, 2, out); break;
            default: k4_multi(nb, row, yv, pp, dp, 1, out); break;
            }
            for (int t = 0; t < T; t++) y[(j0 + t) * ldy + i] = out[t];
        }
    }
}

/* ---------------- small batches: k4_dotp's lanes, tokens as a tile ----------------
 * A row unpacked once per pass (kw4_unpack: the nibbles of each 64 bytes of
 * qs as two operands, the scale pairs, the 4 blocks' mins, d and dmin per 16
 * super-blocks), the pass's tokens packed once (k4_pack, k4_tok16); then
 * per (row, token) and super-block two vpdpbusd, one pair shuffle and one
 * vpdpwssd per 128 products (k4_dotp), each 4 blocks' lanes summed into
 * their S_b by a transpose-add and two 128-bit lane folds, and their M_b by
 * one madd and two in-lane folds, placed into lanes b % 16 with one masked
 * move each: the z4 float side per 16 super-blocks as k4_row's. */
enum { KW4_T = 4, KW4_PASS = 16 }; /* tokens per tile, tokens packed per pass */

typedef struct {
    __m512i q[4];  /* operand v = 2h: low nibbles of qs[64h..], 2h + 1: high */
    __m512i sp[2]; /* k4_dotp's scale pairs */
} kw4_blk;

/* o[b], mn4[quad] (k4_scales' mnw), dv / dmv per 16 super-blocks (0 past nb) */
static void kw4_unpack(int64_t nb, const cm_block_q4_k *x, kw4_blk *o, __m512i *mn4, __m512 *dv, __m512 *dmv) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t bq = 0; bq < nb; bq += 4) {
        const int n = nb - bq < 4 ? (int)(nb - bq) : 4;
        __m128i dd, a, b, c;
        k4_hdr_file(x + bq, n, &dd, &a, &b, &c);
        __m512i sw;
        k4_scales(a, b, c, true, &sw, &mn4[bq / 4]);
        for (int j = 0; j < n; j++) {
            k4_spair(sw, j, o[bq + j].sp);
            for (int h = 0; h < 2; h++) {
                const __m512i q = _mm512_loadu_si512(x[bq + j].qs + 64 * h);
                o[bq + j].q[2 * h] = _mm512_and_si512(q, m4);
                o[bq + j].q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            }
        }
    }
    for (int64_t q = 0; q < (nb + 15) / 16; q++) {
        _Alignas(64) float d[16], dm[16];
        for (int m = 0; m < 16; m++) {
            const int64_t b = 16 * q + m;
            d[m] = b < nb ? _cvtsh_ss(x[b].d) : 0.0f;
            dm[m] = b < nb ? _cvtsh_ss(x[b].dmin) : 0.0f;
        }
        dv[q] = _mm512_load_ps(d);
        dmv[q] = _mm512_load_ps(dm);
    }
}

/* one row against T tokens (yp, pr, dyg: the first token's; token strides
 * ys, ps, ds): out[t] */
KQ_AI void kw4_tile(int64_t nb, const kw4_blk *xb, const __m512i *mn4, const __m512 *dv, const __m512 *dmv,
                    const uint8_t *yp, size_t ys, const __m128i *pr, size_t ps, const __m512 *dyg, size_t ds, int T,
                    float *out) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i lane0 = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    __m512 A[KW4_T];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) A[t] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        __m512i Sv[KW4_T], Mv[KW4_T];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) Sv[t] = Mv[t] = z;
        for (int k = 0; k < 4 && b0 + 4 * k < nb; k++) {
            const int64_t bq = b0 + 4 * k;
            const int n = nb - bq < 4 ? (int)(nb - bq) : 4;
            const __mmask16 msk = (__mmask16)(0xfu << (4 * k));
            __m512i s4[KW4_T][4];
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                if (j >= n) {
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s4[t][j] = z;
                    continue;
                }
                const kw4_blk *w = xb + bq + j;
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s4[t][j] = z;
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                    const __m512i q0 = _mm512_load_si512(&w->q[2 * h]), q1 = _mm512_load_si512(&w->q[2 * h + 1]);
                    const __m512i sp = _mm512_load_si512(&w->sp[h]);
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                        const uint8_t *yt = yp + (size_t)t * ys + (size_t)(bq + j) * 256 + 128 * h;
                        const __m512i d0 = _mm512_dpbusd_epi32(z, q0, _mm512_load_si512(yt));
                        const __m512i d1 = _mm512_dpbusd_epi32(z, q1, _mm512_load_si512(yt + 64));
                        s4[t][j] = _mm512_dpwssd_epi32(s4[t][j], k4_pair(d0, d1), sp);
                    }
                }
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                __m512i x = k4_red4(s4[t][0], s4[t][1], s4[t][2], s4[t][3]);
                x = _mm512_add_epi32(x, _mm512_shuffle_i32x4(x, x, 0x4e));
                x = _mm512_add_epi32(x, _mm512_shuffle_i32x4(x, x, 0xb1));
                Sv[t] = _mm512_mask_mov_epi32(Sv[t], msk, x);
                __m512i m =
                    _mm512_madd_epi16(mn4[bq / 4], _mm512_loadu_si512((const void *)(pr + (size_t)t * ps + bq)));
                m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, (_MM_PERM_ENUM)0x4e));
                m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, (_MM_PERM_ENUM)0xb1));
                Mv[t] = _mm512_mask_permutexvar_epi32(Mv[t], msk, lane0, m);
            }
        }
        const __m512 d = dv[b0 / 16], dm = dmv[b0 / 16];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            const __m512 dy = dyg[(size_t)t * ds + b0 / 16];
            A[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Sv[t]), _mm512_mul_ps(d, dy), A[t]);
            A[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Mv[t]), _mm512_xor_ps(_mm512_mul_ps(dm, dy), sgn), A[t]);
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(A[t]);
}

static void gemm_kw4(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    enum { MAXNB = 64 };
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= MAXNB);
    _Alignas(64) kw4_blk ub[MAXNB];
    _Alignas(64) __m512i mn4[MAXNB / 4];
    _Alignas(64) __m512 dv[MAXNB / 16], dmv[MAXNB / 16];
    _Alignas(64) uint8_t yp[KW4_PASS][MAXNB * 256];
    _Alignas(64) __m128i pr[KW4_PASS][MAXNB];
    _Alignas(64) __m512 dyg[KW4_PASS][MAXNB / 16];
    const size_t ys = sizeof yp[0], ps = MAXNB, ds = MAXNB / 16;
    for (int64_t j0 = 0; j0 < n_tok; j0 += KW4_PASS) {
        const int64_t nt = n_tok - j0 < KW4_PASS ? n_tok - j0 : KW4_PASS;
        for (int64_t t = 0; t < nt; t++) {
            const cm_block_q8_k *yt =
                (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
            k4_pack(nb, yt, yp[t]);
            for (int64_t b0 = 0; b0 < nb; b0 += 16) k4_tok16(b0, nb, yt, pr[t] + b0, dyg[t] + b0 / 16);
        }
        for (int64_t i = r0; i < r1; i++) {
            kw4_unpack(nb, (const cm_block_q4_k *)(const void *)((const char *)w + (size_t)i * w_stride), ub, mn4, dv,
                       dmv);
            for (int64_t t0 = 0; t0 < nt; t0 += KW4_T) {
                const int T = nt - t0 < KW4_T ? (int)(nt - t0) : KW4_T;
                float out[KW4_T];
                const uint8_t *yt = yp[t0];
                const __m128i *pt = pr[t0];
                const __m512 *dt = dyg[t0];
                switch (T) {
                case 4: kw4_tile(nb, ub, mn4, dv, dmv, yt, ys, pt, ps, dt, ds, 4, out); break;
                case 3: kw4_tile(nb, ub, mn4, dv, dmv, yt, ys, pt, ps, dt, ds, 3, out); break;
                case 2: kw4_tile(nb, ub, mn4, dv, dmv, yt, ys, pt, ps, dt, ds, 2, out); break;
                default: kw4_tile(nb, ub, mn4, dv, dmv, yt, ys, pt, ps, dt, ds, 1, out); break;
                }
                for (int t = 0; t < T; t++) y[(j0 + t0 + t) * ldy + i] = out[t];
            }
        }
    }
}

/* ---------------- many tokens: 16 (or 8) tokens in the int32 lanes ----------------
 * Per super-block and row: S = K + sum_j sc_j * C_j, C_j = sum over the
 * sub-block's 32 weights of q * (y + 128) by 8 vpdpbusd (the token's 4 bytes
 * in lane t, the row's 4 nibbles broadcast), K = -128 * sum_j sc_j * Q_j (Q_j:
 * the sub-block's sum of q), so S = S_b exactly; M = sum_u of vpdpwssd of
 * the mins' word pairs with the bsums pairs (M_b). |C_j| <= 32 * 15 * 255. */
enum {
    KT4_R = 4,                      /* rows per tile */
    KT4_MINTOK = 12,                /* fewer tokens: gemm_kw4 (2..11 ran 0-30% faster than 16 lanes or 8, kbench) */
    KT4_MAXNB = 64,                 /* super-blocks per row (k <= 16384); longer rows: k4_multi */
    KT4_PASS = KT4_MAXNB * KT_TOKB, /* one group of 16 tokens of the longest row */
};

typedef struct {
    _Alignas(64) int8_t q[256]; /* q (0..15) in element order */
    int32_t sc[8];              /* the sub-blocks' scales */
    int32_t mw[4];              /* words mn_2u, mn_2u+1 */
    int32_t k;                  /* -128 sum_j sc_j Q_j */
    float d, ndmin;             /* d, -dmin */
} kt4_blk;

static void kt4_unpack(int64_t nb, const cm_block_q4_k *x, kt4_blk *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), z = _mm256_setzero_si256();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t s8[8], m8[8];
        cm_k4_scales8(x[b].scales, s8, m8);
        int32_t k = 0;
        for (int j = 0; j < 4; j++) { /* elements 64j.. (low nibbles), 64j+32.. (high) */
            const __m256i q = ld256(x[b].qs + 32 * j);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            _mm256_store_si256((__m256i *)(void *)(o[b].q + 64 * j), lo);
            _mm256_store_si256((__m256i *)(void *)(o[b].q + 64 * j + 32), hi);
            _Alignas(32) int64_t sl[4], sh[4];
            _mm256_store_si256((__m256i *)(void *)sl, _mm256_sad_epu8(lo, z));
            _mm256_store_si256((__m256i *)(void *)sh, _mm256_sad_epu8(hi, z));
            k += s8[2 * j] * (int32_t)(sl[0] + sl[1] + sl[2] + sl[3]) +
                 s8[2 * j + 1] * (int32_t)(sh[0] + sh[1] + sh[2] + sh[3]);
        }
        for (int j = 0; j < 8; j++) o[b].sc[j] = s8[j];
        for (int u = 0; u < 4; u++) o[b].mw[u] = (int32_t)((uint32_t)m8[2 * u] | (uint32_t)m8[2 * u + 1] << 16);
        o[b].k = -128 * k;
        o[b].d = _cvtsh_ss(x[b].d);
        o[b].ndmin = -_cvtsh_ss(x[b].dmin);
    }
}

KQ_AI int32_t kt4_ld(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* R rows (xb: their unpacked super-blocks) against one packed group of
 * W tokens (SZ-bit vectors): out[r][t] (z4's bits for each (row, token)). */
#define KT4_ROWS(NAME, W, SZ, VI, VF, P)                                                                         \
    KQ_AI void NAME(int64_t nb, const kt4_blk *const *xb, const uint8_t *pg, int R, float(*out)[W]) {            \
        VF A[KT4_R][16];                                                                                         \
        for (int r = 0; r < R; r++)                                                                              \
            for (int l = 0; l < 16; l++) A[r][l] = P##_setzero_ps();                                             \
        const VI z = P##_setzero_si##SZ();                                                                       \
        for (int64_t b = 0; b < nb; b++) {                                                                       \
            const uint8_t *pb = pg + (size_t)b * (KT_TOKB / 16 * W);                                             \
            VI S[KT4_R], C[KT4_R];                                                                               \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) S[r] = P##_set1_epi32(xb[r][b].k);               \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                                \
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {                                            \
                    const VI a = P##_load_si##SZ((const void *)(pb + 4 * W * (8 * j + c)));                      \
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) C[r] =                                   \
                        P##_dpbusd_epi32(c ? C[r] : z, a, P##_set1_epi32(kt4_ld(xb[r][b].q + 32 * j + 4 * c)));  \
                }                                                                                                \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) S[r] =                                       \
                    P##_add_epi32(S[r], P##_mullo_epi32(C[r], P##_set1_epi32(xb[r][b].sc[j])));                  \
            }                                                                                                    \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                                \
                const VI yw = P##_load_si##SZ((const void *)(pb + 4 * W * (64 + u)));                            \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) C[r] =                                       \
                    P##_dpwssd_epi32(u ? C[r] : z, yw, P##_set1_epi32(xb[r][b].mw[u]));                          \
            }                                                                                                    \
            const VF dy = P##_load_ps((const void *)(pb + 4 * W * 68));                                          \
            const int l = (int)(b & 15);                                                                         \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                                \
                VF acc = P##_fmadd_ps(P##_cvtepi32_ps(S[r]), P##_mul_ps(P##_set1_ps(xb[r][b].d), dy), A[r][l]);  \
                A[r][l] = P##_fmadd_ps(P##_cvtepi32_ps(C[r]), P##_mul_ps(P##_set1_ps(xb[r][b].ndmin), dy), acc); \
            }                                                                                                    \
        }                                                                                                        \
        for (int r = 0; r < R; r++) { /* _mm512_reduce_add_ps's tree, for W tokens at once */                    \
            VF h[8];                                                                                             \
            for (int i = 0; i < 8; i++) h[i] = P##_add_ps(A[r][i + 8], A[r][i]);                                 \
            for (int i = 0; i < 4; i++) h[i] = P##_add_ps(h[i + 4], h[i]);                                       \
            const VF e0 = P##_add_ps(h[0], h[2]), e1 = P##_add_ps(h[1], h[3]);                                   \
            P##_storeu_ps(out[r], P##_add_ps(e0, e1));                                                           \
        }                                                                                                        \
    }
KT4_ROWS(kt4_rows, 16, 512, __m512i, __m512, _mm512)

static void gemm_k4(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                    int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    if (n_tok == 1) {
        gemv_k4f(k, w, w_stride, x, x_stride, y, ldy, r0, r1, 1);
        return;
    }
    if (nb > KT4_MAXNB) {
        gemm_k4few(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    if (n_tok < KT4_MINTOK) {
        gemm_kw4(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) uint8_t pk[KT4_PASS];
    _Alignas(64) kt4_blk ub[KT4_R][KT4_MAXNB];
    enum { W = 16 };
    const int64_t gb = nb * KT_TOKB / 16 * W, gcap = (int64_t)sizeof pk / gb; /* groups per pass */
    for (int64_t j0 = 0; j0 < n_tok; j0 += gcap * W) {
        const int64_t left = n_tok - j0, ng = (left + W - 1) / W < gcap ? (left + W - 1) / W : gcap;
        for (int64_t g = 0; g < ng; g++)
            kt_pack(x, x_stride, j0 + W * g, left - W * g < W ? (int)(left - W * g) : W, W, nb, pk + g * gb);
        for (int64_t i = r0; i < r1; i += KT4_R) {
            const int R = r1 - i < KT4_R ? (int)(r1 - i) : KT4_R;
            const kt4_blk *xb[KT4_R];
            for (int r = 0; r < R; r++) {
                kt4_unpack(nb, (const cm_block_q4_k *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),
                           ub[r]);
                xb[r] = ub[r];
            }
            for (int64_t g = 0; g < ng; g++) {
                float out[KT4_R][16];
                const uint8_t *pg = pk + g * gb;
                switch (R) {
                case 4: kt4_rows(nb, xb, pg, 4, out); break;
                case 3: kt4_rows(nb, xb, pg, 3, out); break;
                case 2: kt4_rows(nb, xb, pg, 2, out); break;
                default: kt4_rows(nb, xb, pg, 1, out); break;
                }
                const int T = left - W * g < W ? (int)(left - W * g) : W;
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) y[(j0 + W * g + t) * ldy + i + r] = out[r][t];
            }
        }
    }
}

void cm_kernels_fill_kq4_avx512(cm_kernels *k) {
    k->vec_dot[CM_TYPE_Q4_K] = vec_dot_k4;
    k->gemv[CM_TYPE_Q4_K] = gemv_k4f;
    k->gemv_packed[CM_TYPE_Q4_K] = NULL; /* cm_kernels_fill_avx2's: not repacked here (GEMV_K4) */
    k->gemm[CM_TYPE_Q4_K] = gemm_k4;
}
