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

/* Which ISA files this build compiled. This mirrors the Makefile's
 * ISA_SRCS_EXCLUDE (by target architecture, not by OS), so it is the one
 * architecture #if the kernels need; CPU support is still decided at run time
 * from cm_cpu_features_get(). */
#if defined(__x86_64__) || defined(_M_X64)
#define CM_KERNELS_HAVE_X86 1
void cm_kernels_fill_avx2(cm_kernels *k);
void cm_kernels_fill_avx512(cm_kernels *k);
/* The low-bit types' kernels (lowbit_avx2.c, lowbit_avx512.c), filled after
 * the files above. */
void cm_kernels_fill_lowbit_avx2(cm_kernels *k);
void cm_kernels_fill_lowbit_avx512(cm_kernels *k);
#else
#define CM_KERNELS_HAVE_X86 0
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define CM_KERNELS_HAVE_NEON 1
void cm_kernels_fill_neon(cm_kernels *k);
void cm_kernels_fill_lowbit_neon(cm_kernels *k); /* lowbit_neon.c */
#else
#define CM_KERNELS_HAVE_NEON 0
#endif

#endif
