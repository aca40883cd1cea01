/*
 * tunebench.c: every candidate value of one kernel knob (kernels/tune.h),
 * interleaved in one process (A B C, B C A, ... so load on the machine hits
 * each alike), best of REPS by this thread's CPU time. Not a test: it asserts
 * nothing. For a decode gemv's knob: the one-token gemv over enough copies of
 * the shapes that they come from memory (MIB, default 1024), repacked as the
 * model's are where the knob's kernel reads the copy; for the f16 gemm's
 * pass: ROWSxCOLS times NTOK tokens (default 128).
 *
 *   tunebench KNOB[:TYPE] ROWSxCOLS[,ROWSxCOLS...] [MIB [REPS [NTOK]]]
 *
 * e.g. tunebench avx512.f16.gemv.pfd 2048x2048,5632x2048,2048x5632 1024 15
 *      tunebench avx512.f16.gemm.pass_kib 2048x2048 0 15 128
 * Prints per candidate the best CPU ms per pass (GB/s of weights for a
 * gemv, GFLOP/s for the gemm) and its ratio to the default's time.
 */
#include "kernels/tune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((int)(g_rng % 2001) - 1000) / 1000.0f;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tunebench KNOB ROWSxCOLS[,...] [MIB [REPS [NTOK]]]\n");
        return 2;
    }
    const char *colon = strchr(argv[1], ':'); /* KNOB:TYPE picks one of a knob's types (default its first) */
    const int knob = cm_tune_find(argv[1], colon ? (size_t)(colon - argv[1]) : strlen(argv[1]));
    if (knob < 0) {
        fprintf(stderr, "no knob '%s'; knobs:", argv[1]);
        for (int i = 0; i < CM_TUNE_COUNT; i++) fprintf(stderr, " %s", cm_tune_info(i)->name);
        fprintf(stderr, "\n");
        return 2;
    }
    const cm_tune_knob_info *ki = cm_tune_info(knob);
    const cm_kernels *k = cm_kernels_for(ki->table);
    if (!k) {
        fprintf(stderr, "no %s table on this CPU\n", ki->table);
        return 1;
    }
    const double mib = argc > 3 ? atof(argv[3]) : 1024;
    const int reps = argc > 4 ? atoi(argv[4]) : 10;
    const int64_t ntok = ki->gemm ? (argc > 5 ? atoll(argv[5]) : 128) : 1;
    enum cm_type t = ki->types[0];
    for (int i = 0; colon && i < ki->n_types; i++)
        if (!strcmp(cm_type_traits_of(ki->types[i])->name, colon + 1)) t = ki->types[i];
    const enum cm_type vt = cm_type_traits_of(t)->vec_dot_type;
    enum { MAXM = 4096 };
    static cm_tensor W[MAXM];
    int nm = 0, ns = 0;
    int64_t shp[16][2];
    for (char *s = argv[2]; *s && ns < 16;) {
        shp[ns][0] = strtoll(s, &s, 10);
        if (*s == 'x') s++;
        shp[ns][1] = strtoll(s, &s, 10);
        ns++;
        if (*s == ',') s++;
    }
    size_t total = 0, maxk = 0, maxr = 0;
    const int owner = 0;
    char err[200];
    do {
        for (int i = 0; i < ns && nm < MAXM; i++) {
            const int64_t r = shp[i][0], c = shp[i][1];
            const size_t b = (size_t)r * cm_row_size(t, c);
            float *f = malloc(sizeof(float) * (size_t)c * (size_t)r);
            for (int64_t e = 0; e < r * c; e++) f[e] = frand();
            void *w = aligned_alloc(64, (b + 63) & ~(size_t)63);
            cm_quantize_rows(t, f, w, r, c);
            free(f);
            const int64_t ne[2] = {c, r};
            cm_tensor_init(&W[nm], t, 2, ne, w, "w");
            const cm_tensor *wp[] = {&W[nm]};
            if (ki->packed && cm_repack_add(&owner, k, wp, 1, err, sizeof err)) {
                fprintf(stderr, "repack: %s\n", err);
                return 1;
            }
            nm++;
            total += b;
            maxk = (size_t)c > maxk ? (size_t)c : maxk;
            maxr = (size_t)r > maxr ? (size_t)r : maxr;
        }
    } while (!ki->gemm && (double)total < mib * 1048576.0 && nm < MAXM);
    float *xf = malloc(sizeof(float) * maxk * (size_t)ntok), *y = malloc(sizeof(float) * maxr * (size_t)ntok);
    for (size_t e = 0; e < maxk * (size_t)ntok; e++) xf[e] = frand();
    const size_t xs = cm_row_size(vt, (int64_t)maxk);
    char *xq = malloc(xs * (size_t)ntok);
    double best[CM_TUNE_MAXCAND];
    for (int c = 0; c < ki->n_cand; c++) best[c] = 1e30;
    for (int rep = -1; rep < reps; rep++)
        for (int cc = 0; cc < ki->n_cand; cc++) {
            const int c = (cc + (rep < 0 ? 0 : rep)) % ki->n_cand;
            cm_tune_set(knob, ki->cand[c]);
            double dt = 0;
            for (int m = 0; m < (ki->gemm ? 1 : nm); m++) {
                const int64_t kk = W[m].ne[0], rr = W[m].ne[1];
                const size_t xsm = cm_row_size(vt, kk);
                for (int64_t j = 0; j < ntok; j++)
                    k->from_float[vt](xf + (size_t)j * (size_t)kk, xq + (size_t)j * xsm, kk);
                const double t0 = cpu_s();
                cm_matmul_rows(k, &W[m], xq, xsm, ntok, y, rr, 0, rr);
                dt += cpu_s() - t0;
            }
            if (rep >= 0 && dt < best[c]) best[c] = dt;
        }
    int def = 0;
    for (int c = 0; c < ki->n_cand; c++)
        if (ki->cand[c] == ki->def) def = c;
    printf("%s (%s table, %s, %d matrices, %.0f MiB%s, best of %d, CPU time)\n", ki->name, k->name,
           cm_type_traits_of(t)->name, ki->gemm ? 1 : nm, (double)total / 1048576.0, ki->packed ? ", repacked" : "",
           reps);
    for (int c = 0; c < ki->n_cand; c++) {
        const double work = ki->gemm ? 2.0 * (double)W[0].ne[0] * (double)W[0].ne[1] * (double)ntok / best[c] / 1e9
                                     : (double)total / best[c] / 1e9;
        printf("  %6d%s: %8.3f ms  %7.2f %s  time / default's %.3f\n", ki->cand[c], c == def ? "*" : " ", best[c] * 1e3,
               work, ki->gemm ? "GFLOP/s" : "GB/s", best[c] / best[def]);
    }
    (void)xs;
    return 0;
}
