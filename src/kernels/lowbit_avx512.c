/*
 * lowbit_avx512.c: AVX-512 (BW + VNNI) dot product of IQ4_XS against Q8_K:
 * two 32-element sub-blocks per 512-bit step, products summed by vpdpbusd
 * (~10% over the AVX2 kernel here). The same scheme for IQ4_NL/MXFP4 (two
 * 17/18-byte blocks per step, a float scale each) measured ~15% slower than
 * lowbit_avx2.c's, so the avx512 table keeps those.
 *
 * Registered after lowbit_avx2.c into the avx512 table; every entry it leaves
 * alone keeps the AVX2 kernel. Same contract as lowbit_avx2.c: the
 * reference's integer sums and its float expression, so it is bit-identical
 * to the scalar one; gemm runs vec_dot per (row, token). Never allocates.
 * NEEDSWORK: VNNI versions of Q2_K, Q3_K and the grid types; a multi-row
 * gemv for IQ4_NL/MXFP4 (one activation block load for several rows).
 */
#include "isa.h"

#include <immintrin.h>

static inline float h2f(cm_f16 h) { return _cvtsh_ss(h); } /* exact, = cm_f16_to_f32 */

/* Two groups of 16 packed nibbles (a, b) -> 64 table values:
 * [a lo nibbles | a hi nibbles | b lo | b hi], i.e. elements 0..31 of a, then of b. */
static inline __m512i nibbles2(const uint8_t *a, const uint8_t *b, __m512i table) {
    const __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)b), _mm_loadu_si128((const __m128i *)a));
    const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1); /* [a b a b] */
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* lanes [a, b, a, b] -> low nibbles of lanes 0,1 and high of 2,3; then reorder to [a lo, a hi, b lo, b hi] */
    const __m512i lo = _mm512_and_si512(qq, m4), hi = _mm512_and_si512(_mm512_srli_epi16(qq, 4), m4);
    const __m512i idx = _mm512_mask_blend_epi64(0xF0, lo, hi); /* [a lo, b lo, a hi, b hi] */
    const __m512i v = _mm512_shuffle_epi8(table, idx);
    return _mm512_permutexvar_epi64(_mm512_set_epi64(7, 6, 3, 2, 5, 4, 1, 0), v);
}

/* Per int32 lane: sum of 4 products v * y, v and y signed, |v| <= 127, y > -128. */
static inline __m512i dot_s8(__m512i v, __m512i y) {
    const __mmask64 neg = _mm512_movepi8_mask(v);
    const __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(v), ys);
}

static void vec_dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq4_xs *x = vx;
    const cm_block_q8_k *y = vy;
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cm_kvalues_iq4nl));
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        __m512i acc = _mm512_setzero_si512();
        for (int i = 0; i < 8; i += 2) {
            const int ls0 = (((x[b].scales_l[i / 2] & 0xF) | (((x[b].scales_h >> (2 * i)) & 3) << 4))) - 32;
            const int ls1 = (((x[b].scales_l[i / 2] >> 4) | (((x[b].scales_h >> (2 * i + 2)) & 3) << 4))) - 32;
            const __m512i v = nibbles2(x[b].qs + 16 * i, x[b].qs + 16 * i + 16, table);
            const __m512i p = dot_s8(v, _mm512_loadu_si512((const void *)(y[b].qs + 32 * i)));
            const __m512i sc = _mm512_inserti64x4(_mm512_set1_epi32(ls0), _mm256_set1_epi32(ls1), 1);
            acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, sc));
        }
        sumf += (h2f(x[b].d) * y[b].d) * _mm512_reduce_add_epi32(acc);
    }
    *s = sumf;
}

/* gemm = this file's vec_dot for every (row, token), row-major (isa.h). */
CM_ROW_GEMM(iq4_xs)

void cm_kernels_fill_lowbit_avx512(cm_kernels *k) {
#define REG(T, t) k->vec_dot[CM_TYPE_##T] = vec_dot_##t, k->gemm[CM_TYPE_##T] = gemm_##t
    REG(IQ4_XS, iq4_xs);
#undef REG
}
