/*
 * attn_bench.c: decode cost of attention alone at long contexts, in one
 * process, interleaved A B A B: a small synthetic llama (dim 2048, 32 heads,
 * 8 KV heads of 64, 1 layer, tiny FFN: attention is most of the step) with a
 * KV cache filled with random rows to depth N, one decode step timed with:
 * the per-head two-pass attention over the transposed F16 cache (the old
 * default, cm_ctx_set_attn_split off), the same cache split over KV blocks
 * (the default past 512 positions, attn_split.c), F16 rows (-fa) and Q8_0
 * rows, both split.
 * A benchmark, not a test: it asserts nothing.
 *
 *   make cumulo && cc -std=c11 -O2 -D_GNU_SOURCE -Isrc bench/attn_bench.c build/libcumulo.a \
 *       $(pkg-config --libs libmicrohttpd libcjson libsodium libpcre2-8) -lm -lpthread -o /tmp/attn_bench
 *   /tmp/attn_bench VOCAB.gguf [THREADS] [DEPTHS...]
 * ATTN_BENCH_PF=N: the prefill batch (default 64; a prompt's chunks are 256).
 */
#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process (all its threads): on a machine shared
 * with other jobs this moves far less than the wall clock. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double median9(double *t) {
    for (int i = 0; i < 9; i++)
        for (int j = i + 1; j < 9; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    return t[4] * 1e3;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: attn_bench VOCAB.gguf [THREADS] [DEPTHS...]\n");
        return 2;
    }
    char err[512];
    cm_gguf vocab, g;
    if (cm_gguf_open(&vocab, argv[1], NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const int threads = argc > 2 ? atoi(argv[2]) : 1;
    cm_synth_params sp = {.arch = "llama",
                          .n_embd = 2048,
                          .n_layer = 1,
                          .n_head = 32,
                          .n_head_kv = 8,
                          .n_ff = 256,
                          .n_ctx = 65536,
                          .type = "q8_0",
                          .seed = 1,
                          .n_threads = 1};
    cm_buf file;
    cm_buf_init(&file);
    cm_model m;
    if (cm_synth_write(&sp, &vocab, NULL, &file, err, sizeof err) ||
        cm_gguf_parse(&g, (const uint8_t *)file.data, file.len, err, sizeof err) ||
        cm_model_load(&m, &g, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    cm_pool *pool = cm_pool_new(threads);
    int depths[8] = {1024, 4096, 16384}, nd = 3;
    /* prefill batch (ATTN_BENCH_PF, default 64; a prompt's chunk is up to CM_BATCH_MAX) */
    const int PF = getenv("ATTN_BENCH_PF") ? CM_MAX(1, CM_MIN(CM_BATCH_MAX, atoi(getenv("ATTN_BENCH_PF")))) : 64;
    if (argc > 3)
        for (nd = 0; nd < 8 && 3 + nd < argc; nd++) depths[nd] = atoi(argv[3 + nd]);
    printf(
        "threads %d; decode step ms (median of 9, interleaved), wall then process CPU: depth, two-pass F16 per head, two-pass F16 split, F16 rows (-fa), Q8_0 rows\n",
        threads);
    for (int di = 0; di < nd; di++) {
        const int N = depths[di];
        cm_ctx *c = cm_ctx_new(&m, PF > 64 ? PF : 64, N + 1, pool, err, sizeof err);
        enum { NV = 4 };
        cm_kv kv[NV];
        const enum cm_type tk[NV] = {CM_TYPE_F16, CM_TYPE_F16, CM_TYPE_F16, CM_TYPE_Q8_0};
        for (int v = 0; v < NV; v++) {
            if (cm_kv_init_types(&kv[v], &m, 0, 1, cm_slice_full(&m), N + 1, tk[v], tk[v], v > 1, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            /* random-ish rows: every byte written so the pages are resident */
            const size_t kb = (size_t)N * 8 * (v == 3 ? kv[v].k_row : 128), vb = kb;
            uint8_t *k = kv[v].k, *vv = kv[v].v;
            uint32_t st = 1;
            for (size_t i = 0; i < kb; i++) k[i] = (uint8_t)((st = st * 1103515245u + 12345u) >> 24 & 0x3b);
            for (size_t i = 0; i < vb; i++) vv[i] = (uint8_t)((st = st * 1103515245u + 12345u) >> 24 & 0x3b);
            kv[v].n_past = N;
        }
        double t[NV][9], tc[NV][9];
        const char *only = getenv("ATTN_BENCH_ONLY"); /* profiling: 0 to 3 alone, 200 steps */
        if (only) cm_ctx_set_attn_split(c, atoi(only) != 0);
        for (int r = 0; only && r < 200; r++) {
            int32_t tok = 1, pos = N, seq = 0;
            cm_kv *kvs[1] = {&kv[atoi(only)]};
            cm_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
            cm_forward_args a = {.layer_first = 0, .layer_last = 1, .slice = cm_slice_full(&m), .kvs = kvs, .n_kvs = 1};
            if (cm_forward(c, &b, &a, err, sizeof err)) return 1;
            kvs[0]->n_past = N;
        }
        for (int r = 0; r < 9; r++)
            for (int vi = 0; vi < NV; vi++) {
                const int v = (vi + r) % NV; /* rotate the order: no variant always follows another */
                cm_ctx_set_attn_split(c, v != 0);
                int32_t tok = 1, pos = N, seq = 0;
                cm_kv *kvs[1] = {&kv[v]};
                cm_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
                cm_forward_args a = {
                    .layer_first = 0, .layer_last = 1, .slice = cm_slice_full(&m), .kvs = kvs, .n_kvs = 1};
                const double t0 = now(), c0 = cpu_now();
                if (cm_forward(c, &b, &a, err, sizeof err)) {
                    fprintf(stderr, "%s\n", err);
                    return 1;
                }
                t[v][r] = now() - t0;
                tc[v][r] = cpu_now() - c0;
                kv[v].n_past = N;
            }
        double med[NV], cpu[NV];
        for (int v = 0; v < NV; v++) med[v] = median9(t[v]), cpu[v] = median9(tc[v]);
        printf("%6d  %8.3f  %8.3f  %8.3f  %8.3f   cpu ms %8.3f  %8.3f  %8.3f  %8.3f\n", N, med[0], med[1], med[2],
               med[3], cpu[0], cpu[1], cpu[2], cpu[3]);
        /* prefill: the last PF of the N positions as one batch (K/V rewritten
         * in place), per head (split off) and multi-query tiles (on) */
        static const int pkv[4] = {0, 1, 3, 3}, pon[4] = {0, 1, 0, 1};
        double tp[4][9];
        for (int r = 0; r < 5 && N >= PF; r++)
            for (int vi = 0; vi < 4; vi++) {
                const int v = (vi + r) % 4;
                int32_t tok[CM_BATCH_MAX], pos[CM_BATCH_MAX], seq[CM_BATCH_MAX];
                for (int j = 0; j < PF; j++) tok[j] = 1 + j, pos[j] = N - PF + j, seq[j] = 0;
                cm_kv *kvs[1] = {&kv[pkv[v]]};
                kv[pkv[v]].n_past = N - PF;
                cm_ctx_set_attn_split(c, pon[v]);
                cm_batch b = {.n = PF, .tokens = tok, .pos = pos, .seq = seq};
                cm_forward_args a = {
                    .layer_first = 0, .layer_last = 1, .slice = cm_slice_full(&m), .kvs = kvs, .n_kvs = 1};
                const double c0 = cpu_now();
                if (cm_forward(c, &b, &a, err, sizeof err)) {
                    fprintf(stderr, "%s\n", err);
                    return 1;
                }
                tp[v][r] = cpu_now() - c0;
            }
        for (int v = 0; v < 4 && N >= PF; v++) { /* median of 5 */
            for (int i = 0; i < 5; i++)
                for (int j = i + 1; j < 5; j++)
                    if (tp[v][j] < tp[v][i]) {
                        double x = tp[v][i];
                        tp[v][i] = tp[v][j];
                        tp[v][j] = x;
                    }
        }
        if (N >= PF)
            printf(
                "        prefill of %d tokens, cpu ms: F16 transposed per head %8.2f  tiles %8.2f   Q8_0 rows per head %8.2f  tiles %8.2f\n",
                PF, tp[0][2] * 1e3, tp[1][2] * 1e3, tp[2][2] * 1e3, tp[3][2] * 1e3);
        for (int v = 0; v < NV; v++) cm_kv_release(&kv[v]);
        cm_ctx_free(c);
    }
    return 0;
}
