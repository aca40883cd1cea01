/*
 * attn_qk_bench.c: one kernel table's decode attn_qk (kernels.h) over F16
 * rows against Q8_0 rows of the same values, interleaved A B per rep: D = 64,
 * 4096 positions in calls of 256 (attn_split.c's blocks), NQ queries per call
 * (the query heads of one KV head: 4 for a 1B llama). Prints the fastest
 * process CPU time of each and their ratio. A benchmark, not a test.
 *
 *   make cumulo && cc -std=c11 -O2 -D_GNU_SOURCE -Isrc bench/attn_qk_bench.c build/libcumulo.a \
 *       $(pkg-config --libs libmicrohttpd libcjson libsodium libpcre2-8) -lm -lpthread -o /tmp/attn_qk_bench
 *   /tmp/attn_qk_bench [NQ] [ISA]   (default 4 avx2)
 */
#include "base/base.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { D = 64, N = 4096, CH = 256, QM = 8 };

int main(int argc, char **argv) {
    const int nq = argc > 1 ? atoi(argv[1]) : 4;
    const cm_kernels *k = cm_kernels_for(argc > 2 ? argv[2] : "avx2");
    if (!k || nq < 1 || nq > QM) {
        fprintf(stderr, "usage: attn_qk_bench [NQ 1-8] [ISA] (that ISA's table on this CPU)\n");
        return 2;
    }
    static float x[N * D], q[QM * D], s[QM * CH];
    uint8_t qb[2 * D];
    for (int i = 0; i < N * D; i++) x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (int i = 0; i < QM * D; i++) q[i] = (float)((i * 40503u) % 1000) / 300.0f - 1.5f;
    for (int r = 0; r < QM; r++) { /* as attn_split.c rounds a Q8_0 K's queries */
        k->from_float[CM_TYPE_Q8_0](q + r * D, qb, D);
        k->to_float[CM_TYPE_Q8_0](qb, q + r * D, D);
    }
    const size_t r16 = cm_row_size(CM_TYPE_F16, D), r8 = cm_row_size(CM_TYPE_Q8_0, D);
    uint8_t *k16 = malloc(r16 * N), *k8 = malloc(r8 * N);
    if (!k16 || !k8) return 1;
    cm_quantize_rows(CM_TYPE_F16, x, k16, N, D);
    cm_quantize_rows(CM_TYPE_Q8_0, x, k8, N, D);
    double t[2] = {1e9, 1e9};
    for (int rep = 0; rep < 15; rep++)
        for (int v = 0; v < 2; v++) {
            const double t0 = cpu();
            for (int it = 0; it < 40; it++)
                for (int j = 0; j < N; j += CH) {
                    if (v == 0) k->attn_qk[CM_TYPE_F16](D, nq, q, k16 + j * r16, r16, CH, 0.125f, s, CH);
                    else k->attn_qk[CM_TYPE_Q8_0](D, nq, q, k8 + j * r8, r8, CH, 0.125f, s, CH);
                }
            const double dt = cpu() - t0;
            if (dt < t[v]) t[v] = dt;
        }
    printf("%s nq %d: f16 %.2f ms  q8_0 %.2f ms  q8_0/f16 %.3f\n", k->name, nq, t[0] * 1e3, t[1] * 1e3, t[1] / t[0]);
    free(k16);
    free(k8);
    return 0;
}
