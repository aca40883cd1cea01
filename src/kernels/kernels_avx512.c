/*
 * kernels_avx512.c: AVX-512 F/BW/VL/VNNI/BF16 (Ice Lake server, Sapphire Rapids, Zen 4 and later) versions of the kernels.
 * Compiled with this ISA's flags only (Makefile) and called only when
 * cm_cpu_features_get() says the CPU has it. cm_kernels_fill_avx512() overrides
 * the table entries this file implements; every other entry stays the scalar
 * reference. Each override must agree with the reference (see isa.h) and is
 * tested against it in tests/unit/test_kernels.c. Never allocates.
 */
#include "isa.h"

void cm_kernels_fill_avx512(cm_kernels *k) {
    (void)k; /* NEEDSWORK: no avx512 kernels yet; the simd helper owns this file. */
}
