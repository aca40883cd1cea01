/*
 * kernels_avx2.c: AVX2 + FMA + F16C (Haswell, Zen and later) versions of the
 * dot products, activation converters and prefill gemm.
 *
 * Compiled with this ISA's flags only (Makefile) and called only when
 * cm_cpu_features_get() says the CPU has it. cm_kernels_fill_avx2() overrides
 * the entries this file implements; every other entry stays the scalar
 * reference. The kernels themselves are in x86_tiles.h (shared with the
 * AVX-512 file), plus q4_k and q5_k decode gemvs and prefill gemms over
 * rows repacked at load (avx2_krepack.h), the AVX2 table's own q6_k (over
 * the file's rows, and over "q6_k pairs" repacked at load; avx2_q6k.h) and
 * f16 gemv and gemm (avx2_gemv.h), and q4_0 / q8_0 in the AVX-512 table's lane
 * order (lane_avx2.c; q8_0 also over "q8_0 lanes" rows repacked at load); tested against the reference in
 * tests/unit/test_kernels_simd.c, for batch invariance in
 * test_kernels_invariant.c and test_kernels_repack.c. Never allocates.
 */
/* GCC at -O2 does not peel the tiles' loops over their (constant) token
 * count, which leaves each token's accumulators in memory; ask for it here,
 * in this file only (unrolling never reorders a float operation, so the bits
 * stay the same). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("unroll-loops")
#endif
#define CM_X86_VNNI 0
#include "x86_tiles.h"

#include "base/base.h"

/* v, kept in a register at this point. In the gemms' tiles each token's
 * integer accumulator takes one add per product vector; GCC reassociates
 * such chains into trees over all of a block's products, every one of them
 * live at once and spilled to the stack (16 ymm registers): measured 1.3-1.4x
 * slower. Integer adds are exact, so this changes no bit. */
AI __m256i ax_keep(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}

/* The decode gemvs' software prefetch (avx2_q6k.h's q6_k, avx2_krepack.h's
 * q4_k / q5_k): the lines A2_PFD bytes ahead of the ones being read (rows
 * are contiguous: past a row's end that is the next rows'; prefetches never
 * fault), a few per block. Prefetching changes no arithmetic. 2048, as the
 * AVX-512 table's KD_PFD (gemv_kd_avx512.c). */
enum { A2_PFD = 2048 };

#include "avx2_gemv.h"
#include "avx2_q6k.h"
#include "avx2_krepack.h"
#include "isa.h"

void cm_kernels_fill_avx2(cm_kernels *k) {
    x86_fill(k);
    cm_kernels_fill_lane_avx2(k); /* q4_0 in the AVX-512 table's lane order */
}

/* The AVX2 table's own: the avx512 table (filled with cm_kernels_fill_avx2
 * first) has its own vec_dots, which these match not (avx2_gemv.h). */
void cm_kernels_fill_avx2_own(cm_kernels *k) {
    k->gemv[CM_TYPE_Q6_K] = gemv_a6_k;
    k->gemm[CM_TYPE_Q6_K] = gemm_a6_k;
    k->repack[CM_TYPE_Q6_K] = cm_repack_q6_k_pairs; /* "q6_k pairs" (repack.c) */
    k->gemv_packed[CM_TYPE_Q6_K] = gemv_p6_k;
    k->gemm_packed[CM_TYPE_Q6_K] = gemm_p6_k;
    k->gemm[CM_TYPE_F16] = gemm_af16;
    k->gemv[CM_TYPE_F16] = gemv_af16;
    k->gemm[CM_TYPE_BF16] = gemm_abf16;
    k->gemv_packed[CM_TYPE_F16] = gemv_pf16; /* "f16 pairs" (repack.c) */
    k->gemm_packed[CM_TYPE_F16] = gemm_pf16;
    cm_kernels_fill_lq8_avx2(k);
    /* q4_k / q5_k over the table's own "pairs" layouts (repack.c), gemv and
     * gemm (the table's gemm_packed_max: every batch) */
    k->repack[CM_TYPE_Q4_K] = cm_repack_q4_k_pairs;
    k->repack[CM_TYPE_Q5_K] = cm_repack_q5_k_pairs;
    k->gemv_packed[CM_TYPE_Q4_K] = gemv_ak4_k;
    k->gemv_packed[CM_TYPE_Q5_K] = gemv_ak5_k;
    k->gemm_packed[CM_TYPE_Q4_K] = gemm_ak4_k;
    k->gemm_packed[CM_TYPE_Q5_K] = gemm_ak5_k;
}
