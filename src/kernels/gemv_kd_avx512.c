/*
 * gemv_kd_avx512.c: AVX-512 k-quant decode gemvs with fewer vector
 * operations per super-block than the ones they replace in the avx512 table
 * (filled after gemm_kq_avx512.c, dispatch.c), each keeping that kernel's
 * lane sums (exact integers), float side and reduction, so every row is
 * still vec_dot on the file's bytes bit for bit (kernels.h;
 * tests/unit/test_kernels_repack.c, test_kernels_invariant.c):
 *   - q6_k over "q6_k lanes" (repack.c; was gemm_kq_avx512.c's gemv_kq6v),
 *     below;
 *   - q5_k over "q5_k lanes" and over the file's bytes (were
 *     avx512_krepack.h's gemv_rq5_k / gemv_fq5_k), and the table's q5_k
 *     vec_dot and gemm for 1-2 tokens: the 5-bit values in 3 operations per
 *     64 weights instead of 6, the word pairs by one vpshufb, 16
 *     super-blocks per step placed into z5's lanes as q6_k's are;
 * One row per pass everywhere: a single sequential stream (two adjacent
 * rows per pass, sharing the token's loads, ran q6_k 2.5x slower from
 * DRAM: two short streams, which the prefetcher follows badly). The
 * stream is prefetched in software CM_TUNE_KQ_GEMV_PFD bytes ahead of the block being
 * read, a few lines per block (rows are contiguous: past a row's end that is
 * the next rows'): from DRAM on the Intel Xeon of session 17, q6_k's gemv
 * 1.15-1.33x, q5_k's 1.1-1.2x (bench/gvbench.c, thread CPU time); the
 * hardware prefetcher alone kept fewer lines in flight.
 *
 * q6_k, against gemv_kq6v:
 *   - the 6-bit values: with hm = qh & 0x33 and hn = qh & 0xcc (the top bits
 *     of operands 0/2 and 1/3 with the bits that a 16-bit shift would carry
 *     into bits 6-7 cleared), each operand is one bitwise select of the low
 *     nibble's bits 0-3 and the shifted top bits' bits 4-7: hm << 4, hn << 2,
 *     hm, hn >> 2 (vpternlogd 0xca): 2 ands, 5 shifts, 4 selects per
 *     super-block instead of separate masks and ors;
 *   - each 16 super-blocks' exact integer sums placed into lanes by a
 *     transpose-add of 128-bit lanes, and their fp16 d gathered with one
 *     masked vpgatherdd (from the two bytes before d: never past the row).
 * Integer sums are exact, so their order is free; the conversion, the FMA
 * with d * dy per 16 super-blocks and the final _mm512_reduce_add_ps are
 * gemv_kq6v's (and ztile_q6_k's). Rows longer than the repacked ones
 * (never, through repack.c) and q5_k rows past 128 super-blocks keep the
 * kernels they replace. Stack: ~41 KiB at most. Never allocates.
 */
#include "isa.h"

#include "base/base.h"
#include "tune.h"
#include "ref.h"
#include "x86_vec.h"

#include "x86_krepack.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define KD_AI static inline __attribute__((always_inline))

enum { KD6_MAXNB = CM_REPACK_MAX_K / CM_QK_K };

typedef struct {
    __m512i y[4]; /* the token's bytes in the operands' order */
    __m512i c;    /* dword 4j + i: -32 * bsums[4i + j] */
} kd6_tok;

/* byte 4j + i of the scales: scale 4i + j (repack.c's s(L)) */
static const int8_t k_kd6_sperm[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/* The token: per super-block its bytes transposed as the row's operands
 * (dword 4j + i of operand v: elements 4v.. of sub-block 4i + j) and -32 *
 * the sub-blocks' sums; dyg[q] lane m: dy of super-block 16q + m (0 past nb). */
static void kd6_pack(int64_t nb, const cm_block_q8_k *y, kd6_tok *o, __m512 *dyg) {
    for (int64_t b = 0; b < nb; b++) {
        __m512i X
        [4];
        for (int i = 0; i < 4; i++) X
        [i] = _mm512_loadu_si512(y[b].qs + 64 * i);
        const __m512i t0 = _mm512_unpacklo_epi32(X[0], X[1]), t1 = _mm512_unpackhi_epi32(X[0], X[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(X[2], X[3]), t3 = _mm512_unpackhi_epi32(X[2], X[3]);
        o[b].y[0] = _mm512_unpacklo_epi64(t0, t2);
        o[b].y[1] = _mm512_unpackhi_epi64(t0, t2);
        o[b].y[2] = _mm512_unpacklo_epi64(t1, t3);
        o[b].y[3] = _mm512_unpackhi_epi64(t1, t3);
        int32_t c[16];
        for (int L = 0; L < 16; L++) c[L] = -32 * (int32_t)y[b].bsums[k_kd6_sperm[L]];
        o[b].c = _mm512_loadu_si512(c);
    }
    for (int64_t q = 0; q < (nb + 15) / 16; q++) {
        _Alignas(64) float d[16];
        for (int m = 0; m < 16; m++) d[m] = 16 * q + m < nb ? y[16 * q + m].d : 0.0f;
        dyg[q] = _mm512_load_ps(d);
    }
}

/* The software prefetch distance of the decode gemvs here: the knob
 * CM_TUNE_KQ_GEMV_PFD (tune.h: chosen per CPU at load, 2048 by default).
 * One super-block of one row: dword 4j + i = scale(4i + j) * sum((q - 32) * y)
 * over sub-block 4i + j's 4v.. elements summed over v (gemv_kq6v's kq6v_sb);
 * its lines pfd bytes on prefetched. */
KD_AI __m512i kd6_sb(const cm_block_q6_k *x, const kd6_tok *t, size_t pfd) {
    for (int o = 0; o < 256; o += 64) _mm_prefetch((const char *)x + pfd + o, _MM_HINT_T0);
    const __m512i m4 = _mm512_set1_epi8(0x0f), k33 = _mm512_set1_epi8(0x33), kcc = _mm512_set1_epi8((char)0xcc);
    const __m512i l0 = _mm512_loadu_si512(x->ql), l1 = _mm512_loadu_si512(x->ql + 64), h = _mm512_loadu_si512(x->qh);
    const __m512i hm = _mm512_and_si512(h, k33), hn = _mm512_and_si512(h, kcc);
    /* m4 ? a : b per bit */
    const __m512i v0 = _mm512_ternarylogic_epi32(m4, l0, _mm512_slli_epi16(hm, 4), 0xca);
    const __m512i v1 = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(l0, 4), _mm512_slli_epi16(hn, 2), 0xca);
    const __m512i v2 = _mm512_ternarylogic_epi32(m4, l1, hm, 0xca);
    const __m512i v3 = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(l1, 4), _mm512_srli_epi16(hn, 2), 0xca);
    __m512i s = _mm512_dpbusd_epi32(t->c, v0, t->y[0]);
    s = _mm512_dpbusd_epi32(s, v1, t->y[1]);
    s = _mm512_dpbusd_epi32(s, v2, t->y[2]);
    s = _mm512_dpbusd_epi32(s, v3, t->y[3]);
    return _mm512_mullo_epi32(s, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)x->scales)));
}

/* dword 4j + i of the result = the sum of a_i's 128-bit lane j, i = 0..3 */
KD_AI __m512i kd_red4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i p01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    const __m512i p23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
}

/* q_k (dword 4j + i: part j of super-block 4k + i) -> lane 4k + i = sum over j */
KD_AI __m512i kd_place(__m512i q0, __m512i q1, __m512i q2, __m512i q3) {
    const __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(q0, q1, 0x44), _mm512_shuffle_i32x4(q0, q1, 0xee));
    const __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(q2, q3, 0x44), _mm512_shuffle_i32x4(q2, q3, 0xee));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xdd));
}

/* lane m: f32(d) of super-block b0 + m for m < n (0 past): dwords ending at d */
KD_AI __m512 kd6_d(const cm_block_q6_k *x, int64_t b0, int n) {
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32((int)b0),
                                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
                           _mm512_set1_epi32((int)sizeof(cm_block_q6_k)));
    const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx,
                                                  (const char *)x + offsetof(cm_block_q6_k, d) - 2, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
}

/* one row of nb super-blocks */
KD_AI float kd6_row(int64_t nb, const cm_block_q6_k *x, const kd6_tok *yp, const __m512 *dyg, size_t pfd) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int n = nb - b0 < 16 ? (int)(nb - b0) : 16;
        __m512i q[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m512i s[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                const int64_t b = b0 + 4 * k + i;
                s[i] = 4 * k + i < n ? kd6_sb(x + b, yp + b, pfd) : _mm512_setzero_si512();
            }
            q[k] = kd_red4(s[0], s[1], s[2], s[3]);
        }
        const __m512i v = kd_place(q[0], q[1], q[2], q[3]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(kd6_d(x, b0, n), dyg[b0 / 16]), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static cm_gemm_fn g_prev_q6v;

static void gemv_kd6(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    if (nb > KD6_MAXNB) {
        g_prev_q6v(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) kd6_tok yp[KD6_MAXNB];
    _Alignas(64) __m512 dyg[KD6_MAXNB / 16];
    kd6_pack(nb, x, yp, dyg);
    const size_t pfd = (size_t)cm_tune_get(CM_TUNE_KQ_GEMV_PFD);
    for (int64_t i = r0; i < r1; i++) {
        y[i] = kd6_row(nb, (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)i * w_stride), yp, dyg, pfd);
    }
}

/* ---- q5_k: avx512_krepack.h's rk5 gemvs (over "q5_k lanes" and over the
 * file's bytes) with the 5-bit values built in 3 operations per 64 weights
 * instead of 6: the nibbles shifted into place as there (srlv by 0 | 4), the
 * fifth bits shifted by a per-half constant so that bit 2j | 2j + 1 of qh
 * lands on bit 4 (left for j < 2, right for j >= 2: within each byte of a
 * 16-bit word either way), masked to 0x10, and one select (vpternlogd) of
 * the nibble's bits 0-3 and that bit. The word pairs and the vpdpwssd are
 * rk5_block's (exact integers). Per 16 super-blocks, as q6_k above: each
 * block's 16 dwords and its mins' 4 products summed into lane b % 16 by
 * transpose-adds (kd_red4, kd_place: no per-block horizontal sum), d and
 * dmin taken from the 4 quads' headers (file-order quads' first 16 bytes
 * transposed into the group header's form, so scales are unpacked 4 blocks
 * at once there too), then z5's float side: one conversion of S and of M,
 * an FMA with d * dy then one with -(dmin * dy), _mm512_reduce_add_ps at the
 * end (x86_krepack.h's rk5_put / rk5_end: the same bits; lanes past nb are
 * zero). ---- */
static cm_gemm_fn g_prev_rq5, g_prev_fq5;

/* word pairs (low word of a, low word of b) per dword in one vpshufb: the
 * same as blending a with b << 16 */
KD_AI __m512i kd_pair(__m512i a, __m512i b) {
    /* bytes 4i + 2, 4i + 3 <- b's bytes 4i, 4i + 1 (indices within each 128-bit lane) */
    const __m512i ctl = _mm512_broadcast_i32x4(_mm_setr_epi32(0x01000000, 0x05040000, 0x09080000, 0x0d0c0000));
    return _mm512_mask_shuffle_epi8(a, (__mmask64)0xccccccccccccccccull, b, ctl);
}

/* One super-block's 5-bit values: v[j] = elements 64j.. (the nibbles of
 * qs + 32j, low | high in the 256-bit halves, with bit 4 from qh) */
KD_AI void kd5_vals(const uint8_t *qs, const uint8_t *qh, __m512i v[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), k10 = _mm512_set1_epi8(0x10);
    const __m512i h5 = _mm512_broadcast_i64x4(ld256(qh));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) { /* bits 2j (low nibbles) and 2j+1 (high) of qh */
        const __m512i q = _mm512_broadcast_i64x4(ld256(qs + 32 * j));
        /* bit 2j (2j + 1 in the upper half) of each byte to bit 4 */
        const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)(j < 2 ? 4 - 2 * j : 2 * j - 4)),
                                               _mm256_set1_epi16((short)(j < 2 ? 3 - 2 * j : 2 * j - 3)), 1);
        const __m512i hb = _mm512_and_si512(j < 2 ? _mm512_sllv_epi16(h5, cnt) : _mm512_srlv_epi16(h5, cnt), k10);
        v[j] = _mm512_ternarylogic_epi32(m4, _mm512_mask_srli_epi16(q, (__mmask32)0xffff0000u, q, 4), hb, 0xca);
    }
}

/* One super-block's scaled lane sums (16 dwords, exact; their total is S_b) */
KD_AI __m512i kd5_dot(const __m512i v[4], const __m512i s[2], const cm_block_q8_k *y) {
    const __m512i z = _mm512_setzero_si512();
    __m512i s16 = z;
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m512i d0 = _mm512_dpbusd_epi32(z, v[2 * h], _mm512_loadu_si512(y->qs + 128 * h));
        const __m512i d1 = _mm512_dpbusd_epi32(z, v[2 * h + 1], _mm512_loadu_si512(y->qs + 128 * h + 64));
        s16 = _mm512_dpwssd_epi32(s16, kd_pair(d0, d1), s[h]);
    }
    return s16;
}

KD_AI __m512i kd5_block(const uint8_t *qs, const uint8_t *qh, const __m512i s[2], const cm_block_q8_k *y) {
    __m512i v[4];
    kd5_vals(qs, qh, v);
    return kd5_dot(v, s, y);
}

/* Four super-blocks' headers -> dd (dword i: block i's d | dmin << 16) and
 * the scale dwords a, b, c of repack.c's group header. Grouped: the group's
 * header; else n (1..4) file-order blocks' first 16 bytes transposed (zeros
 * past n). */
KD_AI void kd5_hdr_group(const uint8_t *g, __m128i *dd, __m128i *a, __m128i *b, __m128i *c) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)g);
    *dd = _mm_unpacklo_epi16(h, _mm_srli_si128(h, 8));
    *a = _mm_loadu_si128((const __m128i *)(const void *)(g + 16));
    *b = _mm_loadu_si128((const __m128i *)(const void *)(g + 32));
    *c = _mm_loadu_si128((const __m128i *)(const void *)(g + 48));
}

KD_AI void kd5_hdr_file(const cm_block_q5_k *xt, int n, __m128i *dd, __m128i *a, __m128i *b, __m128i *c) {
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

/* A quad's scale dwords a, b, c (rk_header's arithmetic) -> sw: 32 words,
 * block j's scale i (i < 4) at 4j + i, scale 4 + i at 16 + 4j + i; mnw: the
 * mins as words, block j's in 128-bit lane j */
KD_AI void kd5_scales(__m128i a, __m128i b, __m128i c, __m512i *sw, __m512i *mnw) {
    const __m128i m3f = _mm_set1_epi32(0x3f3f3f3f), m0f = _mm_set1_epi32(0x0f0f0f0f), m03 = _mm_set1_epi32(0x03030303);
    const __m128i sc03 = _mm_and_si128(a, m3f);
    const __m128i sc47 =
        _mm_or_si128(_mm_and_si128(c, m0f), _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(a, 6), m03), 4));
    const __m128i mn03 = _mm_and_si128(b, m3f);
    const __m128i mn47 = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(c, 4), m0f),
                                      _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(b, 6), m03), 4));
    const __m256i ml = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi32(mn03, mn47)),
                                               _mm_unpackhi_epi32(mn03, mn47), 1);
    *sw = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi16(sc03)), _mm256_cvtepu8_epi16(sc47), 1);
    *mnw = _mm512_cvtepu8_epi16(ml);
}

/* Four super-blocks bq.. (n of them; zeros past) from their scale dwords
 * (rk_header's arithmetic): their lane sums folded into *q (dword 4j + i:
 * part j of block i) and the mins' products into *mq (128-bit lane i: block
 * i's). Block i's qs at qs + i * sq, qh at qh + i * sh. */
KD_AI void kd5_quad(__m128i a, __m128i b, __m128i c, const uint8_t *qs, const uint8_t *qh, size_t sq, size_t sh, int n,
                    const cm_block_q8_k *y, const __m128i *pairs, __m512i *q, __m512i *mq) {
    /* word 2l (l < 8): scale 4h of block j; 2l+1: 4h+2; l >= 8: 4h+1, 4h+3 */
    static const uint16_t k_base[32] = {0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
                                        1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3};
    const __m512i base = _mm512_loadu_si512(k_base);
    __m512i sw, mnw;
    kd5_scales(a, b, c, &sw, &mnw);
    __m512i s4[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        if (j >= n) {
            s4[j] = _mm512_setzero_si512();
            continue;
        }
        const __m512i s[2] = {
            _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * j))), sw),
            _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(16 + 4 * j))), sw)};
        s4[j] = kd5_block(qs + j * sq, qh + j * sh, s, y + j);
    }
    *q = kd_red4(s4[0], s4[1], s4[2], s4[3]);
    *mq = _mm512_madd_epi16(mnw, _mm512_loadu_si512((const void *)pairs));
}

/* One row in z5's order, 16 super-blocks per step: each block's exact sums
 * placed into lane b % 16 by transpose-adds (kd_red4, kd_place), d and dmin
 * from the 4 quads' headers, then z5's conversion and two FMAs with d * dy
 * and -(dmin * dy). */
KD_AI float kd5_row(int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const __m128i *pairs, const __m512 *dyg,
                    bool grouped, size_t pf) {
    const int64_t ng = grouped ? nb / 4 * 4 : 0;
    /* kd_red4 of the mins gives dword 4j + i = block 4i + j: back to 4i + j's lane */
    const __m512i mperm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    const size_t BS = sizeof(cm_block_q5_k);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        __m512i q[4], mq[4];
        __m128i dd[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            const int64_t bq = b0 + 4 * k;
            const uint8_t *g = x + (size_t)bq * BS;
            __m128i a, b, c;
            if (pf && bq < nb) /* the decode gemv: the quad's 11 lines pf bytes on */
                for (int o = 0; o < 4 * (int)BS; o += 64) _mm_prefetch((const char *)g + pf + o, _MM_HINT_T0);
            if (bq + 4 <= ng) {
                kd5_hdr_group(g, &dd[k], &a, &b, &c);
                kd5_quad(a, b, c, g + 192, g + 64, 128, 32, 4, y + bq, pairs + bq, &q[k], &mq[k]);
            } else if (bq < nb) {
                const int n = nb - bq < 4 ? (int)(nb - bq) : 4;
                kd5_hdr_file((const cm_block_q5_k *)(const void *)g, n, &dd[k], &a, &b, &c);
                kd5_quad(a, b, c, g + offsetof(cm_block_q5_k, qs), g + offsetof(cm_block_q5_k, qh), BS, BS, n, y + bq,
                         pairs + bq, &q[k], &mq[k]);
            } else {
                q[k] = mq[k] = _mm512_setzero_si512();
                dd[k] = _mm_setzero_si128();
            }
        }
        const __m512i S = kd_place(q[0], q[1], q[2], q[3]);
        const __m512i M = _mm512_permutexvar_epi32(mperm, kd_red4(mq[0], mq[1], mq[2], mq[3]));
        const __m512i D =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(dd[0]), dd[1], 1)),
                               _mm256_inserti128_si256(_mm256_castsi128_si256(dd[2]), dd[3], 1), 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D));
        const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16)));
        const __m512 dy = dyg[b0 / 16];
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(d, dy), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_xor_ps(_mm512_mul_ps(dm, dy), sgn), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* The token's side: bsums pair sums (zeros up to a multiple of 4: kd5_quad
 * reads 4) and dy per 16 super-blocks (0 past nb) */
static void kd5_tok(int64_t nb, const cm_block_q8_k *y, __m128i *pairs, __m512 *dyg) {
    rk_pairs(nb, y, pairs);
    for (int64_t b = nb; b % 4; b++) pairs[b] = _mm_setzero_si128();
    for (int64_t q = 0; q < (nb + 15) / 16; q++) {
        _Alignas(64) float d[16];
        for (int m = 0; m < 16; m++) d[m] = 16 * q + m < nb ? y[16 * q + m].d : 0.0f;
        dyg[q] = _mm512_load_ps(d);
    }
}

#define GEMV_KD5(NAME, PREV, GROUPED)                                                                                  \
    static void NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy, \
                     int64_t r0, int64_t r1, int64_t n_tok) {                                                          \
        const int64_t nb = k / CM_QK_K;                                                                                \
        if (nb > RK4_MAXB) {                                                                                           \
            PREV(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);                                                  \
            return;                                                                                                    \
        }                                                                                                              \
        _Alignas(64) __m128i pairs[RK4_MAXB];                                                                          \
        _Alignas(64) __m512 dyg[RK4_MAXB / 16];                                                                        \
        kd5_tok(nb, x, pairs, dyg);                                                                                    \
        const size_t pfd = (size_t)cm_tune_get(CM_TUNE_KQ_GEMV_PFD);                                                   \
        for (int64_t i = r0; i < r1; i++)                                                                              \
            y[i] = kd5_row(nb, (const uint8_t *)w + (size_t)i * w_stride, x, pairs, dyg, GROUPED, pfd);                \
    }
GEMV_KD5(gemv_kd5r, g_prev_rq5, true)  /* over "q5_k lanes" (repack.c) */
GEMV_KD5(gemv_kd5f, g_prev_fq5, false) /* over the file's bytes */

/* ---- q5_k's gemm for 1 to KD5_MAXT tokens, and for the last n_tok % 16
 * tokens of a larger batch when at most KD5_MAXREM (the rest: gemm_kq_avx512.c's
 * gemm_kq5, 16 tokens in lanes, whose part-empty groups cost a full one): kd5_row for up to KD5_MT tokens at once on
 * the file's bytes, each super-block's values and scale words built once
 * (kd5_vals) for all of them; per token the same exact integer sums (kd_red4
 * formed as the blocks come: two pair sums live per token, no array of
 * values), lanes and float steps as kd5_row: vec_dot's bits. T is a
 * constant in each instance (kd5_multi_T), so the token loops unroll and
 * the values stay in registers. ---- */
enum {
    KD5_MT = 6,    /* tokens per row pass */
    KD5_MAXT = 6,  /* most tokens done here (more: tokens in lanes, 8 or 16 per group) */
    KD5_MAXREM = 5 /* most of a larger batch's last tokens done here (a further group of 16 lanes costs ~7 rows' tokens:
                      the rows are unpacked once for all groups) */
};
static cm_gemm_fn g_prev_gq5, g_prev_pgq5; /* the gemm and gemm_packed this one wraps */

/* lanes: x is a row of "q5_k lanes" (the table's gemm_packed: kd5_row's grouped headers) */
KD_AI void kd5_multi(int64_t nb, const uint8_t *x, const cm_block_q8_k *const *yv, const __m128i (*pairs)[RK4_MAXB],
                     const __m512 (*dyg)[RK4_MAXB / 16], int T, float *out, bool lanes) {
    const int64_t ng = lanes ? nb / 4 * 4 : 0;
    static const uint16_t k_base[32] = {0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
                                        1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3};
    const __m512i base = _mm512_loadu_si512(k_base);
    const __m512i mperm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    const size_t BS = sizeof(cm_block_q5_k);
    __m512 acc[KD5_MT];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        _Alignas(64) __m512i qt[4][KD5_MT], mqt[4][KD5_MT];
        __m128i dd[4];
        for (int k = 0; k < 4; k++) {
            const int64_t bq = b0 + 4 * k;
            if (bq >= nb) {
                for (int t = 0; t < T; t++) qt[k][t] = mqt[k][t] = _mm512_setzero_si512();
                dd[k] = _mm_setzero_si128();
                continue;
            }
            const int n = nb - bq < 4 ? (int)(nb - bq) : 4;
            const cm_block_q5_k *xq = (const cm_block_q5_k *)(const void *)(x + (size_t)bq * BS);
            const bool grp = bq + 4 <= ng;
            __m128i a, b, c;
            if (grp) kd5_hdr_group((const uint8_t *)xq, &dd[k], &a, &b, &c);
            else kd5_hdr_file(xq, n, &dd[k], &a, &b, &c);
            __m512i sw, mnw;
            kd5_scales(a, b, c, &sw, &mnw);
            __m512i p[KD5_MT], h[KD5_MT]; /* kd_red4's unpack sums of blocks 0, 1 (then 2, 3) */
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                __m512i s[KD5_MT];
                if (j < n) {
                    const __m512i S[2] = {
                        _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * j))), sw),
                        _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(16 + 4 * j))), sw)};
                    __m512i V[4];
                    if (grp) kd5_vals((const uint8_t *)xq + 192 + 128 * j, (const uint8_t *)xq + 64 + 32 * j, V);
                    else kd5_vals(xq[j].qs, xq[j].qh, V);
                    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) s[t] = kd5_dot(V, S, yv[t] + bq + j);
                } else _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) s[t] = _mm512_setzero_si512();
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                    if (j % 2 == 0) h[t] = s[t];
                    else if (j == 1)
                        p[t] = _mm512_add_epi32(_mm512_unpacklo_epi32(h[t], s[t]), _mm512_unpackhi_epi32(h[t], s[t]));
                    else {
                        const __m512i p23 =
                            _mm512_add_epi32(_mm512_unpacklo_epi32(h[t], s[t]), _mm512_unpackhi_epi32(h[t], s[t]));
                        qt[k][t] = _mm512_add_epi32(_mm512_unpacklo_epi64(p[t], p23), _mm512_unpackhi_epi64(p[t], p23));
                    }
                }
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) mqt[k][t] =
                _mm512_madd_epi16(mnw, _mm512_loadu_si512((const void *)(pairs[t] + bq)));
        }
        const __m512i D =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(dd[0]), dd[1], 1)),
                               _mm256_inserti128_si256(_mm256_castsi128_si256(dd[2]), dd[3], 1), 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(D));
        const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16)));
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            const __m512i Sv = kd_place(qt[0][t], qt[1][t], qt[2][t], qt[3][t]);
            const __m512i M = _mm512_permutexvar_epi32(mperm, kd_red4(mqt[0][t], mqt[1][t], mqt[2][t], mqt[3][t]));
            const __m512 dy = dyg[t][b0 / 16];
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Sv), _mm512_mul_ps(d, dy), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_xor_ps(_mm512_mul_ps(dm, dy), sgn), acc[t]);
        }
    }
    for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

/* One instance per token count (T constant: unrolled, in registers). */
#define KD5_MULTI_T(TT)                                                                                           \
    static void kd5_multi_##TT(int64_t nb, const uint8_t *x, const cm_block_q8_k *const *yv,                      \
                               const __m128i(*pairs)[RK4_MAXB], const __m512(*dyg)[RK4_MAXB / 16], float *out) {  \
        kd5_multi(nb, x, yv, pairs, dyg, TT, out, false);                                                         \
    }                                                                                                             \
    static void kd5_multi_p##TT(int64_t nb, const uint8_t *x, const cm_block_q8_k *const *yv,                     \
                                const __m128i(*pairs)[RK4_MAXB], const __m512(*dyg)[RK4_MAXB / 16], float *out) { \
        kd5_multi(nb, x, yv, pairs, dyg, TT, out, true);                                                          \
    }
KD5_MULTI_T(1)
KD5_MULTI_T(2)
KD5_MULTI_T(3)
KD5_MULTI_T(4)
KD5_MULTI_T(5)
KD5_MULTI_T(6)
typedef void (*kd5_multi_fn)(int64_t, const uint8_t *, const cm_block_q8_k *const *, const __m128i (*)[RK4_MAXB],
                             const __m512 (*)[RK4_MAXB / 16], float *);
static const kd5_multi_fn k_kd5_multi[2][KD5_MT + 1] = {
    {NULL, kd5_multi_1, kd5_multi_2, kd5_multi_3, kd5_multi_4, kd5_multi_5, kd5_multi_6},
    {NULL, kd5_multi_p1, kd5_multi_p2, kd5_multi_p3, kd5_multi_p4, kd5_multi_p5, kd5_multi_p6}};

KD_AI void kd5_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                    int64_t r0, int64_t r1, int64_t n_tok, bool lanes) {
    const int64_t nb = k / CM_QK_K;
    int64_t rem = n_tok > KD5_MAXT ? n_tok % 16 : n_tok; /* the tokens done here: the last rem */
    if (nb > RK4_MAXB || (n_tok > KD5_MAXT && rem > KD5_MAXREM)) rem = 0;
    if (n_tok - rem > 0) (lanes ? g_prev_pgq5 : g_prev_gq5)(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok - rem);
    if (rem == 0) return;
    x = (const char *)x + (size_t)(n_tok - rem) * x_stride;
    y += (n_tok - rem) * ldy;
    n_tok = rem;
    /* passes of at most KD5_MT tokens, as even as they go (12: 6 + 6) */
    const int np = (int)((n_tok + KD5_MT - 1) / KD5_MT);
    for (int p0 = 0, p = 0; p < np; p++) {
        const int T = (int)((n_tok - p0) / (np - p));
        _Alignas(64) __m128i pairs[KD5_MT][RK4_MAXB];
        _Alignas(64) __m512 dyg[KD5_MT][RK4_MAXB / 16];
        const cm_block_q8_k *yv[KD5_MT];
        for (int t = 0; t < T; t++) {
            yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(p0 + t) * x_stride);
            kd5_tok(nb, yv[t], pairs[t], dyg[t]);
        }
        const kd5_multi_fn f = k_kd5_multi[lanes][T];
        for (int64_t i = r0; i < r1; i++) {
            float out[KD5_MT];
            f(nb, (const uint8_t *)w + (size_t)i * w_stride, yv, (const __m128i(*)[RK4_MAXB])pairs,
              (const __m512(*)[RK4_MAXB / 16]) dyg, out);
            for (int t = 0; t < T; t++) y[(p0 + t) * ldy + i] = out[t];
        }
        p0 += T;
    }
}

static void gemm_kd5(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    kd5_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}
/* the same over "q5_k lanes" (the table's gemm_packed, gemm_kq_avx512.c's gemm_pq5 beneath) */
static void gemm_pkd5(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                      int64_t r0, int64_t r1, int64_t n_tok) {
    kd5_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

/* vec_dot (z5) on the file's bytes: the same row */
static cm_vec_dot_fn g_prev_vd5;
static void vec_dot_kd5(int64_t n, float *s, const void *x, const void *y) {
    const int64_t nb = n / CM_QK_K;
    if (nb > RK4_MAXB) {
        g_prev_vd5(n, s, x, y);
        return;
    }
    _Alignas(64) __m128i pairs[RK4_MAXB];
    _Alignas(64) __m512 dyg[RK4_MAXB / 16];
    kd5_tok(nb, y, pairs, dyg);
    *s = kd5_row(nb, x, y, pairs, dyg, false, 0);
}

void cm_kernels_fill_kd_avx512(cm_kernels *k) {
    if (k->gemv_packed[CM_TYPE_Q6_K]) {
        g_prev_q6v = k->gemv_packed[CM_TYPE_Q6_K];
        k->gemv_packed[CM_TYPE_Q6_K] = gemv_kd6;
    }
    if (k->gemv_packed[CM_TYPE_Q5_K] && k->gemv[CM_TYPE_Q5_K]) {
        g_prev_rq5 = k->gemv_packed[CM_TYPE_Q5_K];
        g_prev_fq5 = k->gemv[CM_TYPE_Q5_K];
        k->gemv_packed[CM_TYPE_Q5_K] = gemv_kd5r;
        k->gemv[CM_TYPE_Q5_K] = gemv_kd5f;
        if (k->gemm[CM_TYPE_Q5_K]) {
            g_prev_gq5 = k->gemm[CM_TYPE_Q5_K];
            k->gemm[CM_TYPE_Q5_K] = gemm_kd5;
        }
        if (k->gemm_packed[CM_TYPE_Q5_K]) {
            g_prev_pgq5 = k->gemm_packed[CM_TYPE_Q5_K];
            k->gemm_packed[CM_TYPE_Q5_K] = gemm_pkd5;
        }
        if (k->vec_dot[CM_TYPE_Q5_K]) {
            g_prev_vd5 = k->vec_dot[CM_TYPE_Q5_K];
            k->vec_dot[CM_TYPE_Q5_K] = vec_dot_kd5;
        }
    }
}
