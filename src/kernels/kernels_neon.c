/*
 * kernels_neon.c: NEON with dotprod and fp16 (Apple M-series, Graviton 2+) versions of the kernels.
 * Compiled with this ISA's flags only (Makefile) and called only when
 * cm_cpu_features_get() says the CPU has it. cm_kernels_fill_neon() overrides
 * the table entries this file implements; every other entry stays the scalar
 * reference. Each override must agree with the reference (see isa.h) and is
 * tested against it in tests/unit/test_kernels.c. Never allocates.
 */
#include "isa.h"

void cm_kernels_fill_neon(cm_kernels *k) {
    (void)k; /* NEEDSWORK: no neon kernels yet; the simd helper owns this file. */
}
