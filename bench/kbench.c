/*
 * kbench.c: kernel micro-benchmark. For each weight type and each kernel
 * table this CPU runs (scalar, avx2, avx512, neon) it times a 4096 x 4096
 * matrix-vector product on one thread (vec_dot over every row) and a
 * 4096 x 4096 x 16-token product (gemm where the table has one, else vec_dot
 * per row and token), and prints GB/s of weight bytes read, next to
 * this machine's single-thread read bandwidth over a buffer far larger than
 * the last-level cache (the roofline a memory-bound decode can reach).
 * Weights are random bytes with sane fp16 scales: timing does not depend on
 * the values. Not a test: it asserts nothing. `make kbench` builds and runs it;
 * KBENCH_TYPES=q4_0,f16 and KBENCH_REPS=N narrow it; KBENCH_TOK=N sets the
 * gemm's tokens (default 16), KBENCH_CPU=1 times by thread CPU time. Where a table has a
 * gemv over weights repacked at load, a line "ISA+rp" times it A B A B
 * against the plain gemv on the same bytes. Where the CPU has AMX-INT8, a line
 * "amx" times the AMX prefill gemm (gemm_amx.c, gemm_kq45_amx.c; every token
 * count) A B A B against the avx512 table's gemm without AMX, at the same
 * KBENCH_TOK.
 */
#include "kernels/kernels.h"
#include "os/os.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { N = 4096, TOKMAX = 256 };
static int TOK = 16;          /* KBENCH_TOK */
static int64_t g_rows = 4096; /* KBENCH_ROWS */

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Single-thread read bandwidth: sum 512 MiB of 64-bit words, best of 3. */
static double read_bw(void) {
    const size_t n = (size_t)512 << 20;
    uint64_t *p = malloc(n);
    if (!p) return 0;
    memset(p, 1, n);
    double best = 0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = cm_now_s();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < n / 8; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        sink += s0 + s1 + s2 + s3;
        double gbs = (double)n / (cm_now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    (void)sink;
    free(p);
    return best;
}

/* The kernels' clock: wall time, or with KBENCH_CPU=1 this thread's CPU
 * time (steadier on a machine shared with other jobs: time spent descheduled
 * does not count; caches and memory are still shared). */
static bool g_cpu;
static double now_s(void) {
    if (!g_cpu) return cm_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool wanted(const char *name) {
    const char *f = getenv("KBENCH_TYPES");
    if (!f || !*f) return true;
    size_t l = strlen(name);
    for (const char *p = f; (p = strstr(p, name)) != NULL; p += l)
        if ((p == f || p[-1] == ',') && (p[l] == 0 || p[l] == ',')) return true;
    return false;
}

/* The decode gemv over weights repacked at load (repack.c) against the
 * same bytes not repacked (another copy, so not found by address), A B A B
 * in one loop: "ISA+rp" and the plain gemv's GB/s of the same minutes. */
static void packed_ab(const cm_kernels *k, const cm_tensor *W, const void *xq, size_t as, float *y, double gb,
                      double bw) {
    const int reps = getenv("KBENCH_REPS") ? atoi(getenv("KBENCH_REPS")) : 5;
    const size_t bytes = (size_t)W->nb[1] * (size_t)W->ne[1];
    void *plain = malloc(bytes);
    memcpy(plain, W->data, bytes);
    cm_tensor W0 = *W;
    W0.data = plain;
    char err[200] = "";
    int owner;
    const cm_tensor *ws[] = {W};
    if (cm_repack_add(&owner, k, ws, 1, err, sizeof err) != 0 || !cm_repack_find(W, NULL)) {
        printf("  (no repacked copy: %s)\n", err);
        free(plain);
        return;
    }
    double bp = 1e9, b0 = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cm_matmul_rows(k, &W0, xq, as, 1, y, W->ne[1], 0, W->ne[1]);
        double t1 = now_s();
        cm_matmul_rows(k, W, xq, as, 1, y, W->ne[1], 0, W->ne[1]);
        double t2 = now_s();
        if (t1 - t0 < b0) b0 = t1 - t0;
        if (t2 - t1 < bp) bp = t2 - t1;
    }
    char name[16];
    snprintf(name, sizeof name, "%s+rp", k->name);
    printf("%-6s %-7s %10.1f %7.0f%%   (A B A B: not repacked %.1f GB/s, x%.2f)\n", cm_type_name(W->type), name,
           gb / bp, 100 * gb / bp / bw, gb / b0, b0 / bp);
    cm_repack_drop(&owner);
    free(plain);
}

/* The AMX gemm against the avx512 gemm without it, A B A B, TOK tokens. */
static void amx_ab(const cm_tensor *W, const void *xq, size_t as, float *y) {
    const cm_gemm_fn amx = cm_kernels_amx_gemm(W->type, true), vnni = cm_kernels_amx_gemm(W->type, false);
    if (!amx || !vnni) return;
    const int reps = getenv("KBENCH_REPS") ? atoi(getenv("KBENCH_REPS")) : 5;
    const int64_t n = W->ne[0], rows = W->ne[1];
    double ba = 1e9, bv = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        amx(n, W->data, W->nb[1], xq, as, y, rows, 0, rows, TOK);
        double t1 = now_s();
        vnni(n, W->data, W->nb[1], xq, as, y, rows, 0, rows, TOK);
        double t2 = now_s();
        if (t1 - t0 < ba) ba = t1 - t0;
        if (t2 - t1 < bv) bv = t2 - t1;
    }
    const double gb = (double)W->nb[1] * (double)rows / 1e9;
    printf("%-6s %-7s %10s %8s %12.1f   (A B A B: avx512 gemm %.1f GB/s, x%.2f; %d tokens)\n", cm_type_name(W->type),
           "amx", "", "", gb * TOK / ba, gb * TOK / bv, bv / ba, TOK);
}

int main(void) {
    static const enum cm_type types[] = {CM_TYPE_Q4_0, CM_TYPE_Q4_1, CM_TYPE_Q5_0, CM_TYPE_Q5_1,
                                         CM_TYPE_Q8_0, CM_TYPE_Q4_K, CM_TYPE_Q5_K, CM_TYPE_Q6_K,
                                         CM_TYPE_F16,  CM_TYPE_BF16, CM_TYPE_F32};
    static const char *const isas[] = {"scalar", "avx2", "avx512", "neon"};
    const int reps = getenv("KBENCH_REPS") ? atoi(getenv("KBENCH_REPS")) : 5;
    g_cpu = getenv("KBENCH_CPU") && atoi(getenv("KBENCH_CPU")) == 1;
    if (getenv("KBENCH_TOK") && atoi(getenv("KBENCH_TOK")) >= 2 && atoi(getenv("KBENCH_TOK")) <= TOKMAX)
        TOK = atoi(getenv("KBENCH_TOK"));
    if (getenv("KBENCH_ROWS") && atoi(getenv("KBENCH_ROWS")) >= 16) g_rows = atoi(getenv("KBENCH_ROWS"));
    const double bw = read_bw();
    printf("single-thread read bandwidth: %.1f GB/s (512 MiB sum)\n", bw);
    printf("matrix %lld x %d, 1 thread; gemm16 = %d tokens (KBENCH_TOK), weight bytes x tokens / time\n",
           (long long)g_rows, N, TOK);
    printf("%-6s %-7s %10s %8s %12s\n", "type", "isa", "matvec GB/s", "% of bw", "gemm16 GB/s");
    float *xf = malloc(sizeof(float) * N * TOK), *y = malloc(sizeof(float) * (size_t)g_rows * TOK);
    for (int i = 0; i < N * TOK; i++) xf[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum cm_type t = types[ti];
        const cm_type_traits *tr = cm_type_traits_of(t);
        if (!wanted(tr->name)) continue;
        const size_t rs = cm_row_size(t, N), as = cm_row_size(tr->vec_dot_type, N);
        uint8_t *w = malloc(rs * (size_t)g_rows), *xq = malloc(as * TOK);
        for (size_t i = 0; i < rs * (size_t)g_rows; i++) w[i] = (uint8_t)rnd();
        /* sane scales: every fp16 field the layouts have becomes 0.01 */
        const cm_f16 h = cm_f32_to_f16(0.01f);
        for (size_t b = 0; tr->quantized && b < rs * (size_t)g_rows / tr->type_size; b++) {
            uint8_t *blk = w + b * tr->type_size;
            size_t off = t == CM_TYPE_Q6_K ? offsetof(cm_block_q6_k, d) : 0;
            memcpy(blk + off, &h, 2);
            if (t == CM_TYPE_Q4_1 || t == CM_TYPE_Q5_1 || t == CM_TYPE_Q4_K || t == CM_TYPE_Q5_K)
                memcpy(blk + 2, &h, 2);
        }
        if (t == CM_TYPE_F16)
            for (size_t i = 0; i < (size_t)N * (size_t)g_rows; i++) ((cm_f16 *)w)[i] = cm_f32_to_f16(xf[i % (N * TOK)]);
        if (t == CM_TYPE_BF16)
            for (size_t i = 0; i < (size_t)N * (size_t)g_rows; i++)
                ((cm_bf16 *)w)[i] = cm_f32_to_bf16(xf[i % (N * TOK)]);
        if (t == CM_TYPE_F32)
            for (size_t i = 0; i < (size_t)N * (size_t)g_rows; i++) ((float *)w)[i] = xf[i % (N * TOK)];
        cm_kernels_ref()->from_float[tr->vec_dot_type](xf, xq, N);
        for (int j = 1; j < TOK; j++) memcpy(xq + j * as, xq, as);
        cm_tensor W;
        const int64_t ne[2] = {N, g_rows};
        cm_tensor_init(&W, t, 2, ne, w, "w");
        for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
            const cm_kernels *k = cm_kernels_for(isas[ii]);
            if (!k) continue;
            double best = 1e9, bestg = 1e9;
            for (int r = 0; r < reps; r++) {
                double t0 = now_s();
                cm_matmul_rows(k, &W, xq, as, 1, y, g_rows, 0, g_rows);
                double dt = now_s() - t0;
                if (dt < best) best = dt;
            }
            for (int r = 0; r < (reps + 1) / 2; r++) {
                double t0 = now_s();
                cm_matmul_rows(k, &W, xq, as, TOK, y, g_rows, 0, g_rows);
                double dt = now_s() - t0;
                if (dt < bestg) bestg = dt;
            }
            const double gb = (double)rs * (double)g_rows / 1e9;
            printf("%-6s %-7s %10.1f %7.0f%% %12.1f\n", tr->name, k->name, gb / best, 100 * gb / best / bw,
                   gb * TOK / bestg);
            fflush(stdout);
            if (k->gemv_packed[t]) packed_ab(k, &W, xq, as, y, gb, bw);
            if (!strcmp(k->name, "avx512")) amx_ab(&W, xq, as, y);
        }
        free(w);
        free(xq);
    }
    free(xf);
    free(y);
    return 0;
}
