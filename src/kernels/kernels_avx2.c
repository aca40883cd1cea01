/*
 * kernels_avx2.c: AVX2 + FMA + F16C (Haswell, Zen and later) versions of the kernels.
 * Compiled with this ISA's flags only (Makefile) and called only when
 * cm_cpu_features_get() says the CPU has it. cm_kernels_fill_avx2() overrides
 * the table entries this file implements; every other entry stays the scalar
 * reference. Each override must agree with the reference (see isa.h) and is
 * tested against it in tests/unit/test_kernels.c. Never allocates.
 */
#include "isa.h"

void cm_kernels_fill_avx2(cm_kernels *k) {
    (void)k; /* NEEDSWORK: no avx2 kernels yet; the simd helper owns this file. */
}
