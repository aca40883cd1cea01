/*
 * lowbit_avx512.c: AVX-512 (VNNI) dot products of the low-bit weight types.
 *
 * Registered after lowbit_avx2.c into the avx512 table; every entry it leaves
 * alone keeps the AVX2 kernel. Same contract as lowbit_avx2.c: the reference's
 * integer sums, float order only free; no gemm. Never allocates.
 */
#include "isa.h"

void cm_kernels_fill_lowbit_avx512(cm_kernels *k) {
    (void)k; /* NEEDSWORK: VNNI versions; the AVX2 kernels serve this table until then. */
}
