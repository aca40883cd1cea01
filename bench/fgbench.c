/*
 * fgbench.c: the float prefill gemms (f16, bf16) on one thread: a ROWS x K
 * weight matrix times T tokens through a kernel table's gemm, best of REPS
 * by this thread's CPU time (steady on a loaded machine), GFLOP/s =
 * 2 * ROWS * K * T / time. Not a test: it asserts nothing.
 *   fgbench TYPE ROWS K T [REPS [ISA]]   e.g. fgbench f16 2048 2048 128
 * For an A/B, build it against two trees and run the two binaries
 * interleaved (bench/README.md).
 */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: fgbench f16|bf16 ROWS K T [REPS [ISA]]\n");
        return 2;
    }
    const enum cm_type t = !strcmp(argv[1], "bf16") ? CM_TYPE_BF16 : CM_TYPE_F16;
    const int64_t rows = atoll(argv[2]), k = atoll(argv[3]), nt = atoll(argv[4]);
    const int reps = argc > 5 ? atoi(argv[5]) : 5;
    const cm_kernels *kt = cm_kernels_for(argc > 6 ? argv[6] : "avx512");
    if (!kt || !kt->gemm[t]) {
        fprintf(stderr, "no such table or gemm\n");
        return 1;
    }
    /* the weights in huge pages where the system allows, as cumulo loads them */
    const size_t wb = ((size_t)rows * (size_t)k * 2 + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    uint16_t *w = aligned_alloc(2u << 20, wb), *x = malloc((size_t)nt * (size_t)k * 2);
    madvise(w, wb, MADV_HUGEPAGE);
    float *y = malloc(sizeof(float) * (size_t)rows * (size_t)nt);
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)rows * (size_t)k + (size_t)nt * (size_t)k; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float v = (float)((int)(s % 2001) - 1000) / 1000.0f;
        const uint16_t h = t == CM_TYPE_F16 ? cm_f32_to_f16(v) : cm_f32_to_bf16(v);
        if (i < (size_t)rows * (size_t)k) w[i] = h;
        else x[i - (size_t)rows * (size_t)k] = h;
    }
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        const double t0 = cpu_s();
        kt->gemm[t](k, w, (size_t)k * 2, x, (size_t)k * 2, y, rows, 0, rows, nt);
        const double dt = cpu_s() - t0;
        if (dt < best) best = dt;
    }
    double sum = 0;
    for (size_t i = 0; i < (size_t)rows * (size_t)nt; i++) sum += y[i];
    printf("%s %s %lldx%lld T=%lld: %.2f ms, %.1f GFLOP/s (checksum %.6g)\n", argv[1], kt->name, (long long)rows,
           (long long)k, (long long)nt, best * 1e3, 2.0 * (double)rows * (double)k * (double)nt / best / 1e9, sum);
    free(w), free(x), free(y);
    return 0;
}
