/*
 * kernels_avx512.c: AVX-512 F/BW/VL + VNNI + BF16 (Ice Lake, Sapphire Rapids,
 * Zen 4 and later) versions of the kernels.
 *
 * Compiled with this ISA's flags only (Makefile) and called only when
 * cm_cpu_features_get() says the CPU has all of them (dispatch.c). The
 * quantized tiles are x86_tiles.h compiled with vpdpbusd (VNNI) for the byte
 * dot products; the float types use 512-bit FMA here, and bf16 uses the
 * vdpbf16ps pair dot product (it treats denormal inputs as zero, which
 * activations and weights of real models never are). cm_kernels_fill_avx512()
 * runs after cm_kernels_fill_avx2() on the same table and overrides what it
 * implements. Tested against the reference in tests/unit/test_kernels_simd.c.
 * Never allocates.
 */
#define CM_X86_VNNI 1
#include "x86_tiles.h"

AI __m512 z_f32(const void *p, int64_t i) { return _mm512_loadu_ps((const float *)p + i); }
AI __m512 z_f16(const void *p, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const cm_f16 *)p + i)));
}

/* 32 elements per step, two accumulators per token; the tail goes through
 * the 8-wide AVX2 tile's scalar end. */
#define ZTILE(NAME)                                                                                \
    AI void ztile_##NAME(int64_t n, const void *x, const void *const *yv, int T, float *out) {     \
        __m512 a0[TMAX], a1[TMAX];                                                                 \
        for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm512_setzero_ps();                           \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            const __m512 x0 = z_##NAME(x, i), x1 = z_##NAME(x, i + 16);                            \
            for (int t = 0; t < T; t++) {                                                          \
                a0[t] = _mm512_fmadd_ps(x0, z_##NAME(yv[t], i), a0[t]);                            \
                a1[t] = _mm512_fmadd_ps(x1, z_##NAME(yv[t], i + 16), a1[t]);                       \
            }                                                                                      \
        }                                                                                          \
        for (int t = 0; t < T; t++) {                                                              \
            float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));                           \
            for (int64_t k = i; k < n; k++) s += sc_##NAME(x, k) * sc_##NAME(yv[t], k);            \
            out[t] = s;                                                                            \
        }                                                                                          \
    }
ZTILE(f32)
ZTILE(f16)

/* bf16: vdpbf16ps multiplies pairs of bf16 (exactly: 8-bit mantissas) and adds
 * both products into one float lane; 64 elements per step. */
AI void ztile_bf16(int64_t n, const void *x, const void *const *yv, int T, float *out) {
    __m512 a0[TMAX], a1[TMAX];
    for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm512_setzero_ps();
    const cm_bf16 *xb = x;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xb + i), x1 = (__m512bh)_mm512_loadu_si512(xb + i + 32);
        for (int t = 0; t < T; t++) {
            const cm_bf16 *yb = yv[t];
            a0[t] = _mm512_dpbf16_ps(a0[t], x0, (__m512bh)_mm512_loadu_si512(yb + i));
            a1[t] = _mm512_dpbf16_ps(a1[t], x1, (__m512bh)_mm512_loadu_si512(yb + i + 32));
        }
    }
    for (int t = 0; t < T; t++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
        for (int64_t k = i; k < n; k++) s += sc_bf16(x, k) * sc_bf16(yv[t], k);
        out[t] = s;
    }
}

/* ---- q4_0 and q8_0 with 512-bit vectors: two blocks per vector ----
 * Groups of 8 blocks. The 8 fp16 scales of a group are picked out of two
 * 64-byte loads with one word permute (instead of 8 scalar conversions), and
 * each pair of blocks is multiplied with vpdpbusd; |x| and the sign of x moved
 * onto y keep the unsigned x signed y form. The nb % 8 tail blocks use the
 * 256-bit tile. */

/* fp16 d of 8 consecutive blocks of 18 bytes (q4_0): words 0, 9, ..., 63. */
AI __m256 d8_q4_0(const void *p) {
    static const uint16_t idx[32] = {0, 9, 18, 27, 36, 45, 54, 63};
    const uint8_t *b = p;
    const __m512i w = _mm512_permutex2var_epi16(_mm512_loadu_si512(b), _mm512_loadu_si512(idx),
                                                _mm512_loadu_si512(b + 64));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(w));
}
/* fp16 d of 8 consecutive blocks of 34 bytes (q8_0): words 0, 17, ..., 119. */
AI __m256 d8_q8_0(const void *p) {
    static const uint16_t i0[32] = {0, 17, 34, 51}, i1[32] = {0, 0, 0, 0, 4, 21, 38, 55};
    const uint8_t *b = p;
    const __m512i lo = _mm512_permutex2var_epi16(_mm512_loadu_si512(b), _mm512_loadu_si512(i0), _mm512_loadu_si512(b + 64));
    const __m512i hi = _mm512_permutex2var_epi16(_mm512_loadu_si512(b + 128), _mm512_loadu_si512(i1),
                                                 _mm512_loadu_si512(b + 192));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_blend_epi16(0xf0, lo, hi)));
}
AI __m512i ld2x256(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(ld256(a)), ld256(b), 1);
}
/* Blocks b, b+1 of q4_0 as signed bytes in block order. */
AI __m512i pair_q4_0(const cm_block_q4_0 *x) {
    const __m256i v = _mm256_loadu2_m128i((const __m128i *)x[1].qs, (const __m128i *)x[0].qs);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1); /* b0 b1 b0>>4 b1>>4 */
    z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm512_sub_epi8(_mm512_and_si512(z, _mm512_set1_epi8(0x0f)), _mm512_set1_epi8(8));
}
AI __m512i pair_q8_0(const cm_block_q8_0 *x) { return ld2x256(x[0].qs, x[1].qs); }

#define ZTILE_Q(NAME, XB, PAIR, D8X)                                                               \
    AI void ztile_##NAME(int64_t nb, const XB *x, const cm_block_q8_0 *const *yv, int T, float *out) { \
        __m512 acc[2][TMAX];                                                                       \
        for (int t = 0; t < T; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();                   \
        const int64_t n8 = nb & ~(int64_t)7;                                                       \
        for (int64_t b = 0; b < n8; b += 8) {                                                      \
            const __m256 dx = D8X(x + b);                                                          \
            __m512 sc[TMAX];                                                                       \
            for (int t = 0; t < T; t++) sc[t] = _mm512_castps256_ps512(_mm256_mul_ps(dx, d8_q8_0(yv[t] + b))); \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                  \
                const __m512i qx = PAIR(x + b + 2 * p);                                            \
                const __m512i ax = _mm512_abs_epi8(qx);                                            \
                const __mmask64 neg = _mm512_movepi8_mask(qx);                                     \
                const __m512i pidx = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1); \
                for (int t = 0; t < T; t++) {                                                      \
                    const cm_block_q8_0 *y = yv[t] + b + 2 * p;                                    \
                    __m512i qy = ld2x256(y[0].qs, y[1].qs);                                        \
                    qy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);                \
                    const __m512i sumi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, qy);      \
                    acc[p & 1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_permutexvar_ps(pidx, sc[t]), \
                                                    acc[p & 1][t]);                                \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        float tail[TMAX] = {0};                                                                    \
        if (n8 < nb) {                                                                             \
            const cm_block_q8_0 *yt[TMAX];                                                         \
            for (int t = 0; t < T; t++) yt[t] = yv[t] + n8;                                        \
            tile_##NAME(nb - n8, x + n8, yt, T, tail);                                             \
        }                                                                                          \
        for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t])) + tail[t]; \
    }
ZTILE_Q(q4_0, cm_block_q4_0, pair_q4_0, d8_q4_0)
ZTILE_Q(q8_0, cm_block_q8_0, pair_q8_0, d8_q8_0)

#define tile_zf32 ztile_f32
#define tile_zf16 ztile_f16
#define tile_zbf16 ztile_bf16
#define tile_zq4_0 ztile_q4_0
#define tile_zq8_0 ztile_q8_0
VEC_DOT(zf32, void, void, 1)
VEC_DOT(zf16, void, void, 1)
VEC_DOT(zbf16, void, void, 1)
VEC_DOT(zq4_0, cm_block_q4_0, cm_block_q8_0, CM_QK4_0)
VEC_DOT(zq8_0, cm_block_q8_0, cm_block_q8_0, CM_QK8_0)

void cm_kernels_fill_avx512(cm_kernels *k) {
    x86_fill(k);
    k->vec_dot[CM_TYPE_F32] = vec_dot_zf32;
    k->gemm[CM_TYPE_F32] = gemm_zf32;
    k->vec_dot[CM_TYPE_F16] = vec_dot_zf16;
    k->gemm[CM_TYPE_F16] = gemm_zf16;
    k->vec_dot[CM_TYPE_BF16] = vec_dot_zbf16;
    k->gemm[CM_TYPE_BF16] = gemm_zbf16;
    k->vec_dot[CM_TYPE_Q4_0] = vec_dot_zq4_0;
    k->gemm[CM_TYPE_Q4_0] = gemm_zq4_0;
    k->vec_dot[CM_TYPE_Q8_0] = vec_dot_zq8_0;
    k->gemm[CM_TYPE_Q8_0] = gemm_zq8_0;
}
