/*
 * gemv_avx512.c: decode's matrix-vector product (one token) over several
 * weight rows per pass, for the float weight types whose one-row dot is
 * bound by its own instruction latency rather than by memory.
 *
 * kernels_avx512.c's F16 dot (ztile_f16 with one token) keeps two FMA
 * chains and converts the activation from F16 again for every row: 4
 * conversions + 2 dependent FMAs per 32 elements, which on one core runs
 * slower than DRAM delivers the row. Here four rows share each converted
 * activation vector and give 8 independent chains. Each row's arithmetic is
 * exactly ztile_f16's for T = 1 (same two accumulators, same FMA operands and
 * order, same reduction, same scalar tail), so results are bit-identical to
 * vec_dot; tests/unit/test_kernels_invariant.c (one token through cm_matmul_rows) holds that, and must be kept in
 * step with ztile_f16 if its order ever changes. Nothing here allocates.
 */
#include "isa.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI __m512 g_f16(const cm_f16 *p, int64_t i) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + i))); }

/* Rows w[0..R) of n elements against y: out[r] = dot(w[r], y). The unroll
 * pragmas keep the 2R accumulators in registers (without them GCC keeps
 * them in memory and this runs slower than one row at a time). */
AI void rows_f16(int64_t n, const cm_f16 *const *w, const cm_f16 *y, int R, float *out) {
    __m512 a0[4], a1[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 y0 = g_f16(y, i), y1 = g_f16(y, i + 16);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            a0[r] = _mm512_fmadd_ps(g_f16(w[r], i), y0, a0[r]);
            a1[r] = _mm512_fmadd_ps(g_f16(w[r], i + 16), y1, a1[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
        for (int64_t k = i; k < n; k++) s += _cvtsh_ss(w[r][k]) * _cvtsh_ss(y[k]);
        out[r] = s;
    }
}

/* cm_gemm_fn with n_tok == 1: y[i] = dot(W_i, x) for i in [r0, r1). Rows
 * stream from memory: the next block's rows are prefetched (all their lines)
 * while this block is computed. */
static void gemv_zf16(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                      int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    enum { R = 4, PF_ROWS = 4 };
    const size_t row_bytes = (size_t)k * sizeof(cm_f16);
    const cm_f16 *xv = x;
    int64_t i = r0;
    for (; i + R <= r1; i += R) {
        const cm_f16 *wr[R];
        for (int r = 0; r < R; r++) wr[r] = (const cm_f16 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
        for (int r = 0; r < PF_ROWS && i + R + r < r1; r++) {
            const char *pf = (const char *)wr[r] + (size_t)R * w_stride;
            for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_NTA);
        }
        rows_f16(k, wr, xv, R, y + i);
    }
    for (; i < r1; i++) {
        const cm_f16 *wr[1] = {(const cm_f16 *)(const void *)((const char *)w + (size_t)i * w_stride)};
        rows_f16(k, wr, xv, 1, y + i);
    }
}

void cm_kernels_fill_gemv_avx512(cm_kernels *k) { k->gemv[CM_TYPE_F16] = gemv_zf16; }
