/*
 * gvbench.c: the decode gemv (one token) over a model's matrix shapes, on
 * weights repacked at load as the model's are, cycling through enough
 * copies of each matrix that they come from memory (or, with MIB small,
 * from cache), timed by this thread's CPU time, best of REPS. Not a test:
 * it asserts nothing. A kernel micro-benchmark for A/B runs of two builds
 * (link this file against each libcumulo.a):
 *
 *   gvbench TYPE ROWSxCOLS[,ROWSxCOLS...] [MIB [REPS [NTOK]]]
 *
 * e.g. gvbench q4_k 2048x2048,512x2048,5632x2048,2048x5632 256 20. Prints
 * per shape the CPU microseconds per matrix and GB/s of weight bytes.
 */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gvbench TYPE ROWSxCOLS[,...] [MIB [REPS [NTOK]]]\n");
        return 2;
    }
    enum cm_type t = CM_TYPE_COUNT;
    for (int i = 0; i < CM_TYPE_COUNT; i++)
        if (cm_type_traits_of((enum cm_type)i) && strcmp(cm_type_name((enum cm_type)i), argv[1]) == 0)
            t = (enum cm_type)i;
    if (t == CM_TYPE_COUNT) {
        fprintf(stderr, "gvbench: unknown type '%s'\n", argv[1]);
        return 2;
    }
    const double mib = argc > 3 ? atof(argv[3]) : 256;
    const int reps = argc > 4 ? atoi(argv[4]) : 10, ntok = argc > 5 ? atoi(argv[5]) : 1;
    const cm_type_traits *tr = cm_type_traits_of(t);
    const cm_kernels *k = cm_kernels_get();
    double tot_us = 0, tot_gb = 0;
    for (char *s = argv[2]; s && *s;) {
        long rows = strtol(s, &s, 10), cols = strtol(s + 1, &s, 10);
        if (*s == ',') s++;
        const size_t rs = cm_row_size(t, cols), bytes = rs * (size_t)rows, as = cm_row_size(tr->vec_dot_type, cols);
        int nc = (int)(mib * 1048576.0 / (double)bytes);
        if (nc < 1) nc = 1;
        uint8_t **w = malloc(sizeof *w * (size_t)nc);
        cm_tensor *W = malloc(sizeof *W * (size_t)nc);
        const cm_tensor **wp = malloc(sizeof *wp * (size_t)nc);
        const cm_f16 h = cm_f32_to_f16(0.01f);
        for (int c = 0; c < nc; c++) {
            w[c] = malloc(bytes);
            for (size_t i = 0; i < bytes; i++) w[c][i] = (uint8_t)rnd();
            for (size_t b = 0; tr->quantized && b < bytes / tr->type_size; b++) {
                uint8_t *blk = w[c] + b * tr->type_size;
                const size_t off = t == CM_TYPE_Q6_K ? offsetof(cm_block_q6_k, d) : 0;
                memcpy(blk + off, &h, 2);
                if (t == CM_TYPE_Q4_K || t == CM_TYPE_Q5_K) memcpy(blk + 2, &h, 2);
            }
            const int64_t ne[2] = {cols, rows};
            cm_tensor_init(&W[c], t, 2, ne, w[c], "w");
            wp[c] = &W[c];
        }
        char err[200] = "";
        int owner;
        if (cm_repack_add(&owner, k, wp, nc, err, sizeof err) != 0) fprintf(stderr, "gvbench: no repack: %s\n", err);
        float *xf = malloc(sizeof(float) * (size_t)cols * (size_t)ntok),
              *y = malloc(sizeof(float) * (size_t)rows * (size_t)ntok);
        uint8_t *xq = malloc(as * (size_t)ntok);
        for (long i = 0; i < cols * ntok; i++) xf[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
        for (int j = 0; j < ntok; j++)
            k->from_float[tr->vec_dot_type](xf + (size_t)j * (size_t)cols, xq + as * (size_t)j, cols);
        double best = 1e9;
        for (int r = 0; r < reps; r++) {
            const double t0 = cpu_s();
            for (int c = 0; c < nc; c++) cm_matmul_rows(k, &W[c], xq, as, ntok, y, rows, 0, rows);
            const double dt = (cpu_s() - t0) / nc;
            if (dt < best) best = dt;
        }
        printf("%s %ldx%ld (%d copies, %.1f MiB): %9.2f us  %6.2f GB/s\n", tr->name, rows, cols, nc,
               (double)bytes * nc / 1048576.0, best * 1e6, (double)bytes / best / 1e9);
        tot_us += best * 1e6;
        tot_gb += (double)bytes / 1e9;
        cm_repack_drop(&owner);
        for (int c = 0; c < nc; c++) free(w[c]);
        free(w), free(W), free(wp), free(xf), free(y), free(xq);
    }
    printf("total %.2f us, %.2f GB/s\n", tot_us, tot_gb / tot_us * 1e6);
    return 0;
}
