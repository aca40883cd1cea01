/*
 * lowbit_avx2.c: AVX2 dot products of the low-bit weight types (Q2_K, Q3_K,
 * IQ4_XS, IQ2_XXS, IQ3_XXS, IQ1_S against Q8_K; IQ4_NL, MXFP4 against Q8_0).
 *
 * Compiled with the AVX2 flags only and registered by dispatch.c into the
 * avx2 and avx512 tables when the CPU has AVX2 (cm_kernels_fill_lowbit_avx2);
 * every other entry stays what the other ISA files set. Their gemm runs the
 * same vec_dot per (row, token), each weight row once for all tokens while it
 * is in cache, so batch invariance holds by construction.
 * NEEDSWORK: a tiled gemm (several rows x tokens per pass) for prefill speed.
 *
 * The super-block types compute the reference's integer sum exactly (int16
 * pair products cannot saturate: |level| <= 127 against |q8| <= 127, and
 * int32 sums stay below 2^28) and then the reference's float expression in
 * its order, so they are bit-identical to quants_lowbit.c. The 32-element
 * types keep eight float lanes across blocks (float order only differs).
 * Never allocates.
 */
#include "isa.h"

#include <immintrin.h>
#include <string.h>

/* f16 -> f32 with F16C: exact, so equal to cm_f16_to_f32. */
static inline float h2f(cm_f16 h) { return _cvtsh_ss(h); }

/* sum over the 32 bytes of x*y as int16 pairs, x and y signed, |x|, |y| <= 127. */
static inline __m256i dot_pairs_s8(__m256i x, __m256i y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline int hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float hsum_f32x8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 packed nibbles -> 32 table values: element j from the low nibble of
 * byte j, element j + 16 from its high nibble. */
static inline __m256i nibbles_to_values(const uint8_t *qs, __m128i table) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    return _mm256_set_m128i(hi, lo);
}

/* Two int16 scales, each for 16 consecutive elements (8 pair lanes). */
static inline __m256i scale_pair(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

/* ---- 32-element blocks against Q8_0 ---- */

/* Two blocks per step into two float accumulators (independent fma chains). */
#define DOT32(NAME, BLOCK, QK, TABLE, SCALE)                                                                          \
    static void vec_dot_##NAME(int64_t n, float *s, const void *vx, const void *vy) {                                 \
        const BLOCK *x = vx;                                                                                          \
        const cm_block_q8_0 *y = vy;                                                                                  \
        const __m128i table = _mm_loadu_si128((const __m128i *)TABLE);                                                \
        const __m256i ones = _mm256_set1_epi16(1);                                                                    \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                                \
        const int64_t nb = n / QK;                                                                                    \
        int64_t b = 0;                                                                                                \
        for (; b + 1 < nb; b += 2) {                                                                                  \
            const __m256i v0 = nibbles_to_values(x[b].qs, table), v1 = nibbles_to_values(x[b + 1].qs, table);         \
            const __m256i p0 =                                                                                        \
                _mm256_madd_epi16(dot_pairs_s8(v0, _mm256_loadu_si256((const __m256i *)y[b].qs)), ones);              \
            const __m256i p1 =                                                                                        \
                _mm256_madd_epi16(dot_pairs_s8(v1, _mm256_loadu_si256((const __m256i *)y[b + 1].qs)), ones);          \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(b)), _mm256_cvtepi32_ps(p0), acc0);                           \
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(b + 1)), _mm256_cvtepi32_ps(p1), acc1);                       \
        }                                                                                                             \
        for (; b < nb; b++) {                                                                                         \
            const __m256i v = nibbles_to_values(x[b].qs, table);                                                      \
            const __m256i p = _mm256_madd_epi16(dot_pairs_s8(v, _mm256_loadu_si256((const __m256i *)y[b].qs)), ones); \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(b)), _mm256_cvtepi32_ps(p), acc0);                            \
        }                                                                                                             \
        *s = hsum_f32x8(_mm256_add_ps(acc0, acc1));                                                                   \
    }
#define SCALE_IQ4_NL(b) (h2f(y[b].d) * h2f(x[b].d))
#define SCALE_MXFP4(b) (h2f(y[b].d) * cm_e8m0_to_f32_half(x[b].e))
DOT32(iq4_nl, cm_block_iq4_nl, CM_QK4_NL, cm_kvalues_iq4nl, SCALE_IQ4_NL)
DOT32(mxfp4, cm_block_mxfp4, CM_QK_MXFP4, cm_kvalues_mxfp4, SCALE_MXFP4)
#undef DOT32

/* ---- super-blocks against Q8_K ---- */

static void vec_dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq4_xs *x = vx;
    const cm_block_q8_k *y = vy;
    const __m128i table = _mm_loadu_si128((const __m128i *)cm_kvalues_iq4nl);
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {
            const int ls =
                (((x[b].scales_l[i / 2] >> (4 * (i % 2))) & 0xF) | (((x[b].scales_h >> (2 * i)) & 3) << 4)) - 32;
            const __m256i v = nibbles_to_values(x[b].qs + 16 * i, table);
            const __m256i p = dot_pairs_s8(v, _mm256_loadu_si256((const __m256i *)(y[b].qs + 32 * i)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));
        }
        sumf += (h2f(x[b].d) * y[b].d) * hsum_i32x8(acc);
    }
    *s = sumf;
}

static void vec_dot_q2_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q2_k *x = vx;
    const cm_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *sc = x[b].scales;
        int summ = 0;
        for (int j = 0; j < 16; j++) summ += y[b].bsums[j] * (sc[j] >> 4);
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i lv = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3); /* 0..3 */
                const __m256i p8 = _mm256_loadu_si256((const __m256i *)(y[b].qs + 128 * h + 32 * k));
                const int is = 8 * h + 2 * k;
                const __m256i p = _mm256_maddubs_epi16(lv, p8);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(sc[is] & 0xF, sc[is + 1] & 0xF)));
            }
        }
        const float dall = y[b].d * h2f(x[b].d);
        const float dmin = y[b].d * h2f(x[b].dmin);
        sumf += dall * hsum_i32x8(acc) - dmin * summ;
    }
    *s = sumf;
}

static void vec_dot_q3_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q3_k *x = vx;
    const cm_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        int8_t sc[16];
        cm_q3_k_scales(x[b].scales, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[b].hmask);
        __m256i acc = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                const __m256i hbit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), one);
                /* value = low - 4 where the high bit is clear */
                const __m256i v = _mm256_sub_epi8(low, _mm256_slli_epi16(_mm256_xor_si256(hbit, one), 2));
                const __m256i p8 = _mm256_loadu_si256((const __m256i *)(y[b].qs + 128 * h + 32 * k));
                const int is = 8 * h + 2 * k;
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(dot_pairs_s8(v, p8), scale_pair(sc[is], sc[is + 1])));
            }
        }
        sumf += (h2f(x[b].d) * y[b].d) * hsum_i32x8(acc);
    }
    *s = sumf;
}

/* ---- grid types against Q8_K ---- */

/* For each 7-bit sign code: 8 bytes, 0xFF where the element is negated (the
 * 7 stored bits and their parity). Filled once by the fill function. */
static uint64_t g_sign64[128];

static void init_sign64(void) {
    for (unsigned i = 0; i < 128; i++) {
        const uint8_t sb = cm_iq_signs(i);
        uint64_t m = 0;
        for (int j = 0; j < 8; j++)
            if (sb >> j & 1) m |= (uint64_t)0xFF << (8 * j);
        g_sign64[i] = m;
    }
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4); /* x86 is little-endian, as the format */
    return v;
}

/* sum_j g_j * (+-p_j) per pair lane times ls, g unsigned grid bytes. */
static inline __m256i iq_group(__m256i g, uint32_t aux, const int8_t *p, int ls) {
    const __m256i m = _mm256_set_epi64x((long long)g_sign64[(aux >> 21) & 127], (long long)g_sign64[(aux >> 14) & 127],
                                        (long long)g_sign64[(aux >> 7) & 127], (long long)g_sign64[aux & 127]);
    const __m256i y = _mm256_loadu_si256((const __m256i *)p);
    const __m256i ys = _mm256_sub_epi8(_mm256_xor_si256(y, m), m);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(g, ys), _mm256_set1_epi16((short)ls));
}

static void vec_dot_iq2_xxs(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *blk = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0.f;
    for (int64_t b = 0; b < n / CM_QK_K; b++, blk += sizeof(cm_block_iq2_xxs)) {
        const float d = h2f((cm_f16)(blk[0] | (blk[1] << 8))) * y[b].d;
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = blk + 2 + 8 * ib;
            const uint32_t aux = rd32(q + 4);
            const __m256i g = _mm256_set_epi64x((long long)cm_iq2xxs_grid[q[3]], (long long)cm_iq2xxs_grid[q[2]],
                                                (long long)cm_iq2xxs_grid[q[1]], (long long)cm_iq2xxs_grid[q[0]]);
            acc = _mm256_add_epi32(acc, iq_group(g, aux, y[b].qs + 32 * ib, (int)(2 * (aux >> 28) + 1)));
        }
        sumf += d * hsum_i32x8(acc);
    }
    *s = 0.125f * sumf;
}

static void vec_dot_iq3_xxs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq3_xxs *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0.f;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = h2f(x[b].d) * y[b].d;
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x[b].qs + 8 * ib;
            const uint32_t aux = rd32(x[b].qs + CM_QK_K / 4 + 4 * ib);
            const __m256i g =
                _mm256_set_epi32((int)cm_iq3xxs_grid[q[7]], (int)cm_iq3xxs_grid[q[6]], (int)cm_iq3xxs_grid[q[5]],
                                 (int)cm_iq3xxs_grid[q[4]], (int)cm_iq3xxs_grid[q[3]], (int)cm_iq3xxs_grid[q[2]],
                                 (int)cm_iq3xxs_grid[q[1]], (int)cm_iq3xxs_grid[q[0]]);
            acc = _mm256_add_epi32(acc, iq_group(g, aux, y[b].qs + 32 * ib, (int)(2 * (aux >> 28) + 1)));
        }
        sumf += d * hsum_i32x8(acc);
    }
    *s = 0.25f * sumf;
}

static void vec_dot_iq1_s(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq1_s *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        int sumi1 = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = x[b].qh[ib];
            const uint8_t *q = x[b].qs + 4 * ib;
            const int ls = 2 * ((qh >> 12) & 7) + 1;
            const __m256i g = _mm256_set_epi64x((long long)cm_iq1s_grid[q[3] | (((qh >> 9) & 7) << 8)],
                                                (long long)cm_iq1s_grid[q[2] | (((qh >> 6) & 7) << 8)],
                                                (long long)cm_iq1s_grid[q[1] | (((qh >> 3) & 7) << 8)],
                                                (long long)cm_iq1s_grid[q[0] | ((qh & 7) << 8)]);
            const __m256i p = dot_pairs_s8(g, _mm256_loadu_si256((const __m256i *)(y[b].qs + 32 * ib)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));
            sumi1 += ls * (qh & 0x8000 ? -1 : 1) * (y[b].bsums[2 * ib] + y[b].bsums[2 * ib + 1]);
        }
        sumf += h2f(x[b].d) * y[b].d * (hsum_i32x8(acc) + 0.125f * sumi1);
    }
    *s = sumf;
}

/* gemm = this file's vec_dot for every (row, token), row-major (isa.h). */
#define ROW_GEMM(T, t) CM_ROW_GEMM(t)
CM_LOWBIT_TYPES(ROW_GEMM)
#undef ROW_GEMM

void cm_kernels_fill_lowbit_avx2(cm_kernels *k) {
    init_sign64(); /* idempotent; fill functions run once under pthread_once */
#define REG(T, t) k->vec_dot[CM_TYPE_##T] = vec_dot_##t, k->gemm[CM_TYPE_##T] = gemm_##t;
    CM_LOWBIT_TYPES(REG)
#undef REG
}
