/*
 * bbench.c: batched-decode kernel micro-benchmark. Times cm_matmul_rows over
 * a set of Q4_0 weight matrices (by default 1B-llama shapes, 256 MiB in all,
 * far beyond the last-level cache, so every pass streams the weights from
 * memory the way a decode step does) for B = 1, 2, 3, 4, 6, 8, 12, 16, 24, 32
 * activation rows, one thread, repacked copies made as the engine makes them.
 * Prints ms per pass over all weights, GB/s of weights read, and the
 * speed-up of B rows against B single-row passes. Not a test: it asserts
 * nothing. `make bbench` builds it; BBENCH_TYPE=q8_0 etc. picks the type,
 * BBENCH_MIB the size, BBENCH_REPS the best-of count, BBENCH_B="1,8" the batch
 * sizes, BBENCH_SHAPE=8b 8B-llama shapes (4096 wide, 14336-row FFN) instead.
 * Times are this thread's CPU time (the machine is shared).
 */
#include "kernels/kernels.h"
#include "os/os.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Thread CPU seconds: on a shared machine, time this thread actually ran. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

enum { MAXB = 64, KMAX = 14336 };

int main(void) {
    const char *tn = getenv("BBENCH_TYPE") ? getenv("BBENCH_TYPE") : "q4_0";
    enum cm_type t = CM_TYPE_COUNT;
    for (int i = 0; i < CM_TYPE_COUNT; i++)
        if (cm_type_traits_of((uint32_t)i) && !strcmp(cm_type_traits_of((uint32_t)i)->name, tn)) t = (enum cm_type)i;
    if (t == CM_TYPE_COUNT) {
        fprintf(stderr, "bbench: unknown type '%s'\n", tn);
        return 2;
    }
    const cm_type_traits *tr = cm_type_traits_of(t);
    const size_t mib = getenv("BBENCH_MIB") ? (size_t)atoi(getenv("BBENCH_MIB")) : 256;
    const int reps = getenv("BBENCH_REPS") ? atoi(getenv("BBENCH_REPS")) : 3;
    int bs[16] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}, nbs = 10;
    if (getenv("BBENCH_B")) {
        nbs = 0;
        for (const char *p = getenv("BBENCH_B"); *p && nbs < 16; p++) {
            bs[nbs++] = atoi(p);
            while (p[1] && p[1] != ',') p++;
            if (p[1] == ',') p++;
        }
    }
    /* one layer of 1B llama: q (2048x2048), k, v (2048x256 each... use 512), o, gate, up (2048 -> 5632), down;
     * BBENCH_SHAPE=8b: one layer of an 8B llama (4096 wide, 1024-row k and v, 14336 FFN) */
    static const struct bshape {
        int64_t k, rows;
    } shape1b[] = {{2048, 2048}, {2048, 256}, {2048, 256}, {2048, 2048}, {2048, 5632}, {2048, 5632}, {5632, 2048}},
      shape8b[] = {{4096, 4096}, {4096, 1024}, {4096, 1024}, {4096, 4096}, {4096, 14336}, {4096, 14336}, {14336, 4096}};
    const bool wide = getenv("BBENCH_SHAPE") && !strcmp(getenv("BBENCH_SHAPE"), "8b");
    const struct bshape *shape = wide ? shape8b : shape1b;
    enum { NS = 7 };
    size_t layer = 0;
    for (int s = 0; s < NS; s++) layer += cm_row_size(t, shape[s].k) * (size_t)shape[s].rows;
    const int nl = (int)(mib * 1048576 / layer) + 1;
    cm_tensor *W = calloc((size_t)nl * NS, sizeof *W);
    const cm_tensor **wp = calloc((size_t)nl * NS, sizeof *wp);
    size_t total = 0;
    for (int l = 0; l < nl; l++)
        for (int s = 0; s < NS; s++) {
            size_t n = cm_row_size(t, shape[s].k) * (size_t)shape[s].rows;
            uint8_t *w = cm_huge_alloc(n);
            for (size_t i = 0; i < n; i += 8) {
                uint64_t r = rnd();
                memcpy(w + i, &r, n - i < 8 ? n - i : 8);
            }
            const cm_f16 h = cm_f32_to_f16(0.01f);
            for (size_t b = 0; tr->quantized && b < n / tr->type_size; b++) memcpy(w + b * tr->type_size, &h, 2);
            const int64_t ne[2] = {shape[s].k, shape[s].rows};
            cm_tensor_init(&W[l * NS + s], t, 2, ne, w, "w");
            wp[l * NS + s] = &W[l * NS + s];
            total += n;
        }
    const cm_kernels *k = cm_kernels_get();
    char err[200];
    if (cm_repack_add(W, k, wp, nl * NS, err, sizeof err)) {
        fprintf(stderr, "bbench: %s\n", err);
        return 1;
    }
    const enum cm_type vt = tr->vec_dot_type;
    const size_t as = cm_row_size(vt, KMAX);
    uint8_t *xq = malloc(as * MAXB);
    float *xf = malloc(sizeof(float) * KMAX), *y = malloc(sizeof(float) * KMAX * MAXB);
    for (int j = 0; j < MAXB; j++) {
        for (int i = 0; i < KMAX; i++) xf[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
        k->from_float[vt](xf, xq + (size_t)j * as, KMAX);
    }
    printf("bbench: %s weights %.0f MiB (%d x %s-llama layers), table %s, 1 thread\n", tr->name, total / 1048576.0, nl,
           wide ? "8B" : "1B", k->name);
    printf("%4s %10s %8s %12s %9s\n", "B", "ms/pass", "GB/s", "ms/row-pass", "vs B x 1");
    double t1 = 0;
    for (int bi = 0; bi < nbs; bi++) {
        const int B = bs[bi] < 1 ? 1 : bs[bi] > MAXB ? MAXB : bs[bi];
        double best = 1e9;
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_s();
            for (int i = 0; i < nl * NS; i++) {
                const size_t xs = cm_row_size(vt, W[i].ne[0]);
                /* the engine packs rows of the matrix's own width */
                cm_matmul_rows(k, &W[i], xq, xs, B, y, W[i].ne[1], 0, W[i].ne[1]);
            }
            double dt = cpu_s() - t0;
            if (dt < best) best = dt;
        }
        if (B == 1) t1 = best;
        printf("%4d %10.2f %8.1f %12.2f %8.2fx\n", B, best * 1e3, total / best / 1e9, best * 1e3 / B,
               t1 > 0 ? t1 * B / best : 0.0);
        fflush(stdout);
    }
    cm_repack_drop(W);
    return 0;
}
