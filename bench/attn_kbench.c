/*
 * attn_kbench.c: the decode attention kernels alone (no model): one KV head
 * of D = 64 with 4 query heads (llama 1B's shape), its N positions cut into
 * CM_ATTN_BLOCK blocks and run by cm_attn_split_block as a decode step does
 * (one thread), for the KV layouts F16 transposed (the default F16 cache),
 * F16 rows (-fa) and Q8_0 rows, per kernel table (ISA). Prints the median
 * time of one whole pass over the N positions (us, median of 15, variants
 * rotated so none always follows another) and a hash of the partials' bits,
 * so that two builds (before / after a kernel change) can be compared for
 * speed and for identical bits: run the two binaries alternately.
 * A benchmark, not a test: it asserts nothing.
 *
 *   make cumulo && cc -std=c11 -O2 -D_GNU_SOURCE -Isrc bench/attn_kbench.c build/libcumulo.a \
 *       $(pkg-config --libs libmicrohttpd libcjson libsodium libpcre2-8) -lm -lpthread -o /tmp/attn_kbench
 *   /tmp/attn_kbench [DEPTHS...]        (default 4096 16384; ATTN_KBENCH_ISA="avx512 avx2")
 * ATTN_KBENCH_ONLY=V (0 F16 transposed, 1 F16 rows, 2 Q8_0 rows) and
 * ATTN_KBENCH_REPS=R: that variant alone R times (for perf record).
 */
#include "base/base.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { D = 64, NQ = 4, NV = 3, REPS = 15 };

/* FNV-1a over 32-bit words (the floats' bits): cheap next to the pass */
static uint64_t fnv(uint64_t h, const float *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + i, 4);
        h = (h ^ u) * 1099511628211ull;
    }
    return h;
}

/* One decode pass over [0, N): every block's partial; returns their hash. */
static uint64_t pass(const cm_kernels *k, const cm_attn_kv *kv, int N, const float *q, float *scratch, float *part) {
    uint64_t h = 1469598103934665603ull;
    for (int p0 = 0; p0 < N; p0 += CM_ATTN_BLOCK) {
        const int p1 = CM_MIN(N, p0 + CM_ATTN_BLOCK);
        cm_attn_split_block(k, kv, D, NQ, q, p0, p1, 0.125f, scratch, part, D + 2);
        h = fnv(h, part, (size_t)NQ * (D + 2));
    }
    return h;
}

int main(int argc, char **argv) {
    int depths[8] = {4096, 16384}, nd = 2;
    if (argc > 1)
        for (nd = 0; nd < 8 && 1 + nd < argc; nd++) depths[nd] = atoi(argv[1 + nd]);
    const char *isas = getenv("ATTN_KBENCH_ISA") ? getenv("ATTN_KBENCH_ISA") : "avx512 avx2";
    const char *only = getenv("ATTN_KBENCH_ONLY");
    const int oreps = getenv("ATTN_KBENCH_REPS") ? atoi(getenv("ATTN_KBENCH_REPS")) : 200;
    static const char *vname[NV] = {"f16-transposed", "f16-rows", "q8_0-rows"};
    printf("one KV head, D %d, %d queries, 1 thread; us per pass over N positions (median of %d) and bits hash\n", D,
           NQ, REPS);
    float q[NQ * D], *scratch = malloc(cm_attn_split_scratch_floats(NQ, D) * sizeof(float)),
                     *part = malloc((size_t)NQ * (D + 2) * sizeof(float));
    uint32_t st = 7;
    for (int i = 0; i < NQ * D; i++) q[i] = (float)((int)((st = st * 1103515245u + 12345u) >> 16 & 0xff) - 128) / 64.0f;
    for (int di = 0; di < nd; di++) {
        const int N = depths[di];
        /* F16: small random values; Q8_0 rows by quantizing random floats */
        const size_t q8row = cm_row_size(CM_TYPE_Q8_0, D);
        cm_f16 *kf = malloc((size_t)N * D * 2), *vf = malloc((size_t)N * D * 2), *vt = malloc((size_t)N * D * 2);
        uint8_t *k8 = malloc((size_t)N * q8row), *v8 = malloc((size_t)N * q8row);
        float row[D];
        for (int p = 0; p < N; p++) {
            for (int i = 0; i < D; i++)
                row[i] = (float)((int)((st = st * 1103515245u + 12345u) >> 16 & 0x3ff) - 512) / 256.0f;
            for (int i = 0; i < D; i++) kf[(size_t)p * D + i] = cm_f32_to_f16(row[i]);
            cm_kernels_ref()->from_float[CM_TYPE_Q8_0](row, k8 + (size_t)p * q8row, D);
            for (int i = 0; i < D; i++)
                row[i] = (float)((int)((st = st * 1103515245u + 12345u) >> 16 & 0x3ff) - 512) / 256.0f;
            for (int i = 0; i < D; i++) vf[(size_t)p * D + i] = cm_f32_to_f16(row[i]);
            for (int i = 0; i < D; i++) vt[(size_t)i * N + p] = cm_f32_to_f16(row[i]);
            cm_kernels_ref()->from_float[CM_TYPE_Q8_0](row, v8 + (size_t)p * q8row, D);
        }
        const cm_attn_kv kvs[NV] = {
            {.k = (const uint8_t *)kf,
             .v = (const uint8_t *)vt,
             .k_row = D * 2,
             .v_row = 2,
             .k_type = CM_TYPE_F16,
             .v_type = CM_TYPE_F16,
             .v_tstride = (size_t)N * 2},
            {.k = (const uint8_t *)kf,
             .v = (const uint8_t *)vf,
             .k_row = D * 2,
             .v_row = D * 2,
             .k_type = CM_TYPE_F16,
             .v_type = CM_TYPE_F16},
            {.k = k8, .v = v8, .k_row = q8row, .v_row = q8row, .k_type = CM_TYPE_Q8_0, .v_type = CM_TYPE_Q8_0},
        };
        char buf[256];
        snprintf(buf, sizeof buf, "%s", isas);
        for (char *sv = NULL, *isa = strtok_r(buf, " ", &sv); isa; isa = strtok_r(NULL, " ", &sv)) {
            const cm_kernels *k = cm_kernels_for(isa);
            if (!k) {
                printf("%6d %-7s (not on this CPU)\n", N, isa);
                continue;
            }
            if (only) {
                const int v = atoi(only) % NV;
                for (int r = 0; r < oreps; r++) pass(k, &kvs[v], N, q, scratch, part);
                printf("%6d %-7s %s x%d done\n", N, isa, vname[v], oreps);
                continue;
            }
            double t[NV][REPS];
            uint64_t h[NV] = {0};
            for (int r = 0; r < REPS; r++)
                for (int vi = 0; vi < NV; vi++) {
                    const int v = (vi + r) % NV;
                    const double t0 = now();
                    h[v] = pass(k, &kvs[v], N, q, scratch, part);
                    t[v][r] = now() - t0;
                }
            printf("%6d %-7s", N, isa);
            for (int v = 0; v < NV; v++) {
                for (int i = 0; i < REPS; i++)
                    for (int j = i + 1; j < REPS; j++)
                        if (t[v][j] < t[v][i]) {
                            const double x = t[v][i];
                            t[v][i] = t[v][j];
                            t[v][j] = x;
                        }
                printf("  %s %8.1f us %016llx", vname[v], t[v][REPS / 2] * 1e6, (unsigned long long)h[v]);
            }
            printf("\n");
        }
        free(kf), free(vf), free(vt), free(k8), free(v8);
    }
    free(scratch), free(part);
    return 0;
}
