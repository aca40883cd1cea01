/*
 * isa.h: private seam between the dispatch table and the per-ISA kernel
 * files. Not part of the kernels API; only the .c files of src/kernels include it.
 *
 * A table is built by filling it with the scalar reference first
 * (cm_kernels_fill_ref) and then letting each ISA file override the entries it
 * implements; every entry it leaves alone stays the reference. The avx512
 * table is ref + avx2 overrides + avx512 overrides (every CPU we accept as
 * avx512 also passes the avx2 check). An override must compute what the
 * reference computes: bit-identical bytes for from_float (the activation
 * quantizers reproduce llama.cpp's x86 rounding, see quants_ref.c), and for
 * vec_dot the same integer sums with only float summation order free, and
 * gemm exactly the bits of the same table's vec_dot (kernels.h: batch invariance).
 * Fill functions run once under pthread_once and must not allocate.
 */
#ifndef CM_KERNELS_ISA_H
#define CM_KERNELS_ISA_H

#include "kernels.h"
#include "ref.h"

void cm_kernels_fill_ref(cm_kernels *k);
void cm_kernels_fill_attn_ref(cm_kernels *k); /* attn_ref.c: attn_v */

/* Which ISA files this build compiled. This mirrors the Makefile's
 * ISA_SRCS_EXCLUDE (by target architecture, not by OS), so it is the one
 * architecture #if the kernels need; CPU support is still decided at run time
 * from cm_cpu_features_get(). */
#if defined(__x86_64__) || defined(_M_X64)
#define CM_KERNELS_HAVE_X86 1
void cm_kernels_fill_avx2(cm_kernels *k);
void cm_kernels_fill_avx2_own(cm_kernels *k); /* the AVX2 table only, after cm_kernels_fill_avx2 */
void cm_kernels_fill_avx512(cm_kernels *k);
/* q4_0 in the AVX-512 q4_0's lane order (lane_avx2.c), called by cm_kernels_fill_avx2. */
void cm_kernels_fill_lane_avx2(cm_kernels *k);
/* q8_0 in that lane order too (lane_avx2.c), for the AVX2 table only (cm_kernels_fill_avx2_own). */
void cm_kernels_fill_lq8_avx2(cm_kernels *k);
/* The low-bit types' kernels (lowbit_avx2.c, lowbit_avx512.c), filled after
 * the files above. */
void cm_kernels_fill_lowbit_avx2(cm_kernels *k);
void cm_kernels_fill_lowbit_avx512(cm_kernels *k);
void cm_kernels_fill_attn_avx2(cm_kernels *k);        /* attn_avx2.c */
void cm_kernels_fill_attn_avx512(cm_kernels *k);      /* attn_avx512.c */
void cm_kernels_fill_attn_tile_avx512(cm_kernels *k); /* attn_tile_avx512.c: prefill's many-query tiles */
void cm_kernels_fill_attn_tile_avx2(cm_kernels *k);   /* attn_tile_avx2.c: the same for the AVX2 table */
/* the q5_k prefill gemm (gemm_kq_avx512.c), filled after kernels_avx512.c. */
void cm_kernels_fill_kq_avx512(cm_kernels *k);
/* q6_k's prefill gemm and repacked decode gemv (gemm_kq6_avx512.c), filled after it. */
void cm_kernels_fill_kq6_avx512(cm_kernels *k);
/* the q4_k prefill gemm (gemm_kq4_avx512.c), filled after gemm_kq_avx512.c. */
void cm_kernels_fill_kq4_avx512(cm_kernels *k);
/* the q6_k decode gemv over "q6_k lanes" (gemv_kd_avx512.c), filled after the gemms' files. */
void cm_kernels_fill_kd_avx512(cm_kernels *k);
/* q8_0 in block lane order (q8lane_avx512.c), filled last: replaces kernels_avx512.c's q8_0. */
void cm_kernels_fill_q8lane_avx512(cm_kernels *k);
/* q4_0 and q8_0 prefill on AMX tiles (gemm_amx.c), filled after every other
 * avx512 file when the CPU and the OS allow AMX-INT8 and CUMULO_AMX is not 0;
 * cm_kernels_amx_direct: its gemm of type t over the file's layout or (packed)
 * the repacked one for every n_tok, or NULL; *mintok: the fewest tokens the
 * table's gemm hands to it for rows of k elements (0 with NULL). */
void cm_kernels_fill_amx(cm_kernels *k);
cm_gemm_fn cm_kernels_amx_direct(enum cm_type t, bool packed, int64_t k, int *mintok);
/* q6_k prefill on AMX tiles (gemm_kq6_amx.c), filled by cm_kernels_fill_amx;
 * cm_kernels_amx6_direct: cm_kernels_amx_direct's part for q6_k. */
void cm_kernels_fill_amx6(cm_kernels *k);
cm_gemm_fn cm_kernels_amx6_direct(bool packed, int64_t k, int *mintok);
/* q4_k and q5_k prefill on AMX tiles (gemm_kq45_amx.c): cm_kernels_fill_amx's
 * and cm_kernels_amx_direct's part for those types. */
void cm_kernels_fill_amxk(cm_kernels *k);
cm_gemm_fn cm_kernels_amxk_direct(enum cm_type t, bool packed, int64_t k, int *mintok);
/* AMX gemm calls this thread made (cm_kernels_amx_calls). */
uint64_t cm_kernels_amx_ncalls(void);
#else
#define CM_KERNELS_HAVE_X86 0
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define CM_KERNELS_HAVE_NEON 1
void cm_kernels_fill_neon(cm_kernels *k);
void cm_kernels_fill_lowbit_neon(cm_kernels *k); /* lowbit_neon.c */
void cm_kernels_fill_attn_neon(cm_kernels *k);   /* attn_neon.c */
#else
#define CM_KERNELS_HAVE_NEON 0
#endif

/* The attention split's kernels (kernels.h attn_qk / attn_vm) of the KV
 * types F32, F16, Q8_0, Q4_0 as `static` attn_qk_NAME / attn_vm_NAME calling
 * the including file's inline qk_multi / vm_multi with the type, and the
 * table entries (attn_avx2.c, attn_avx512.c, attn_neon.c). */
#define CM_ATTN_MULTI_ONE(T, NAME)                                                                                 \
    static void attn_qk_##NAME(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale, \
                               float *s, int ld) {                                                                 \
        qk_multi(T, D, nq, q, k, k_row, n, scale, s, ld);                                                          \
    }                                                                                                              \
    static void attn_vm_##NAME(int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,      \
                               float *acc) {                                                                       \
        vm_multi(T, D, nq, v, v_row, w, ld, n, acc);                                                               \
    }
#define CM_ATTN_MULTI_DEFINE()            \
    CM_ATTN_MULTI_ONE(CM_TYPE_F32, f32)   \
    CM_ATTN_MULTI_ONE(CM_TYPE_F16, f16)   \
    CM_ATTN_MULTI_ONE(CM_TYPE_Q8_0, q8_0) \
    CM_ATTN_MULTI_ONE(CM_TYPE_Q4_0, q4_0)
#define CM_ATTN_MULTI_FILL(k)                      \
    do {                                           \
        (k)->attn_qk[CM_TYPE_F32] = attn_qk_f32;   \
        (k)->attn_qk[CM_TYPE_F16] = attn_qk_f16;   \
        (k)->attn_qk[CM_TYPE_Q8_0] = attn_qk_q8_0; \
        (k)->attn_qk[CM_TYPE_Q4_0] = attn_qk_q4_0; \
        (k)->attn_vm[CM_TYPE_F32] = attn_vm_f32;   \
        (k)->attn_vm[CM_TYPE_F16] = attn_vm_f16;   \
        (k)->attn_vm[CM_TYPE_Q8_0] = attn_vm_q8_0; \
        (k)->attn_vm[CM_TYPE_Q4_0] = attn_vm_q4_0; \
    } while (0)

/* The ISA files whose gemm is their vec_dot applied to every (row, token),
 * row-major, so gemm is the same table's vec_dot bit for bit by construction.
 * CM_ROW_GEMM(t) defines `static void gemm_t` from the including file's
 * `vec_dot_t`; CM_LOWBIT_TYPES(X) calls X(TYPE, name) for each type that
 * lowbit_avx2.c and lowbit_neon.c both implement. */
#define CM_ROW_GEMM(t)                                                                                                \
    static void gemm_##t(int64_t kk, const void *w, size_t ws, const void *x, size_t xs, float *y, int64_t ldy,       \
                         int64_t r0, int64_t r1, int64_t n_tok) {                                                     \
        for (int64_t i = r0; i < r1; i++)                                                                             \
            for (int64_t j = 0; j < n_tok; j++)                                                                       \
                vec_dot_##t(kk, &y[j * ldy + i], (const char *)w + (size_t)i * ws, (const char *)x + (size_t)j * xs); \
    }
#define CM_LOWBIT_TYPES(X) \
    X(Q2_K, q2_k)          \
    X(Q3_K, q3_k)          \
    X(IQ4_NL, iq4_nl)      \
    X(IQ4_XS, iq4_xs)      \
    X(MXFP4, mxfp4)        \
    X(IQ2_XXS, iq2_xxs)    \
    X(IQ3_XXS, iq3_xxs)    \
    X(IQ1_S, iq1_s)

#endif
