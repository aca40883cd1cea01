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

#define tile_zf32 ztile_f32
#define tile_zf16 ztile_f16
#define tile_zbf16 ztile_bf16
VEC_DOT(zf32, void, void, 1)
VEC_DOT(zf16, void, void, 1)
VEC_DOT(zbf16, void, void, 1)

void cm_kernels_fill_avx512(cm_kernels *k) {
    x86_fill(k);
    k->vec_dot[CM_TYPE_F32] = vec_dot_zf32;
    k->gemm[CM_TYPE_F32] = gemm_zf32;
    k->vec_dot[CM_TYPE_F16] = vec_dot_zf16;
    k->gemm[CM_TYPE_F16] = gemm_zf16;
    k->vec_dot[CM_TYPE_BF16] = vec_dot_zbf16;
    k->gemm[CM_TYPE_BF16] = gemm_zbf16;
}
