/*
 * kv_bench.c: one decode step of a real model after N positions of context,
 * per KV cache type, in one process, interleaved A B A B: what the KV type
 * costs the whole step (weights, attention, the K/V store), without the
 * minutes a real N-token prompt takes per run. The caches are filled with
 * random-ish rows (every byte written, so the pages are resident; the scores
 * are then meaningless, which costs attention nothing). Each variant's cache
 * is made as `cumulo run -ctk T -ctv T` made it before session 15: the
 * transposed layout for F32/F16 (now `-fa off`), rows (flash attention) for
 * Q8_0/Q4_0; `f16-fa`, `f32-fa`: F16/F32 rows (now the default).
 * KV_BENCH_PROMPT=1: fill each cache by a real N-token prompt of
 * pseudo-random tokens instead (minutes at 4k; real scores and rows).
 * Prints the median wall and process CPU ms per step (CPU time moves far less
 * than wall time on a machine shared with other jobs).
 * A benchmark, not a test: it asserts nothing.
 *
 *   make cumulo && cc -std=c11 -O2 -D_GNU_SOURCE -Isrc bench/kv_bench.c build/libcumulo.a \
 *       $(pkg-config --libs libmicrohttpd libcjson libsodium libpcre2-8) -lm -lpthread -o /tmp/kv_bench
 *   /tmp/kv_bench MODEL.gguf [THREADS] [DEPTH] [REPS] [TYPES...]   (default 1 4096 15 f16 q8_0)
 */
#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "os/os.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] * 1e3 : (t[n / 2 - 1] + t[n / 2]) * 0.5e3;
}

enum { NV_MAX = 6, REPS_MAX = 101, PF = 256 };

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: kv_bench MODEL.gguf [THREADS] [DEPTH] [REPS] [TYPES...]\n");
        return 2;
    }
    char err[512];
    cm_gguf g;
    cm_model m;
    if (cm_gguf_open(&g, argv[1], NULL, NULL, err, sizeof err) || cm_model_load(&m, &g, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (cm_model_repack_slice(&m, cm_slice_full(&m), err, sizeof err)) fprintf(stderr, "repack: %s\n", err);
    const int threads = argc > 2 ? atoi(argv[2]) : 1, N = argc > 3 ? atoi(argv[3]) : 4096;
    const int reps = argc > 4 ? CM_MAX(1, CM_MIN(REPS_MAX, atoi(argv[4]))) : 15;
    const char *names[NV_MAX] = {"f16", "q8_0"};
    int nv = 2;
    if (argc > 5)
        for (nv = 0; nv < NV_MAX && 5 + nv < argc; nv++) names[nv] = argv[5 + nv];
    cm_pool *pool = cm_pool_new(threads);
    cm_ctx *c = cm_ctx_new(&m, PF, N + 1, pool, err, sizeof err);
    if (!c) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    cm_kv kv[NV_MAX];
    for (int v = 0; v < nv; v++) {
        const bool fa = strstr(names[v], "-fa") != NULL;
        char tn[16];
        snprintf(tn, sizeof tn, "%.*s", (int)strcspn(names[v], "-"), names[v]);
        enum cm_type t;
        if (cm_kv_type_parse(tn, &t)) {
            fprintf(stderr, "unknown KV type '%s'\n", names[v]);
            return 2;
        }
        const bool rows = fa || t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0;
        if (cm_kv_init_types(&kv[v], &m, 0, m.hp.n_layer, cm_slice_full(&m), N + 1, t, t, rows, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        if (getenv("KV_BENCH_PROMPT")) { /* a real prompt of pseudo-random tokens, in chunks of PF */
            uint32_t st = 7;
            const double c0 = now(CLOCK_PROCESS_CPUTIME_ID);
            for (int p = 0; p < N; p += PF) {
                int32_t tok[PF], pos[PF], seq[PF];
                const int nb = CM_MIN(PF, N - p);
                for (int j = 0; j < nb; j++)
                    tok[j] = 1 + (int32_t)((st = st * 1103515245u + 12345u) >> 8) % (m.hp.n_vocab - 1), pos[j] = p + j,
                    seq[j] = 0;
                cm_kv *kvs[1] = {&kv[v]};
                cm_batch b = {.n = nb, .tokens = tok, .pos = pos, .seq = seq};
                cm_forward_args a = {
                    .layer_first = 0, .layer_last = m.hp.n_layer, .slice = cm_slice_full(&m), .kvs = kvs, .n_kvs = 1};
                if (cm_forward(c, &b, &a, err, sizeof err)) {
                    fprintf(stderr, "%s\n", err);
                    return 1;
                }
            }
            fprintf(stderr, "%s: %d-token prompt, %.1f s of CPU\n", names[v], N, now(CLOCK_PROCESS_CPUTIME_ID) - c0);
        } else {
            const size_t bytes = cm_kv_bytes_types(&m, 0, m.hp.n_layer, 0, m.hp.n_head_kv, N + 1, t, t) / 2;
            uint32_t st = 1;
            uint8_t *k = kv[v].k, *vv = kv[v].v;
            for (size_t i = 0; i < bytes; i++) k[i] = (uint8_t)((st = st * 1103515245u + 12345u) >> 24 & 0x3b);
            for (size_t i = 0; i < bytes; i++) vv[i] = (uint8_t)((st = st * 1103515245u + 12345u) >> 24 & 0x3b);
        }
        kv[v].n_past = N;
    }
    static double tw[NV_MAX][REPS_MAX], tc[NV_MAX][REPS_MAX];
    for (int r = -2; r < reps; r++) /* two warm-up rounds */
        for (int vi = 0; vi < nv; vi++) {
            const int v = (vi + (r < 0 ? 0 : r)) % nv; /* rotate the order */
            int32_t tok = 1 + (r + 2) % 7, pos = N, seq = 0;
            cm_kv *kvs[1] = {&kv[v]};
            cm_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
            cm_forward_args a = {
                .layer_first = 0, .layer_last = m.hp.n_layer, .slice = cm_slice_full(&m), .kvs = kvs, .n_kvs = 1};
            const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
            if (cm_forward(c, &b, &a, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            if (r >= 0) {
                tw[v][r] = now(CLOCK_MONOTONIC) - w0;
                tc[v][r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
            }
            kv[v].n_past = N;
        }
    printf("depth %d threads %d reps %d; decode step ms, median wall / process CPU:", N, threads, reps);
    for (int v = 0; v < nv; v++) printf("  %s %.2f / %.2f", names[v], median(tw[v], reps), median(tc[v], reps));
    printf("\n");
    for (int v = 0; v < nv; v++) cm_kv_release(&kv[v]);
    cm_ctx_free(c);
    cm_pool_free(pool);
    return 0;
}
