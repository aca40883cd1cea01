/*
 * test_amx.h: the harness the AMX gemm tests share (test_kernels_amx.c,
 * test_kernels_amxk.c, test_kernels_amx6.c). Each test checks an AMX
 * prefill gemm against the avx512 table's vec_dot, memcmp, no tolerance:
 * over ROWS rows and up to MAXTOK tokens, row slices that start and end off
 * the 16-row panels, an output stride wider than the rows (what lies outside
 * the slice must stay untouched), through cm_matmul_rows, and two threads at
 * once (tile configuration is per thread).
 *
 * The including file generates its own weights and activations, then tells
 * the harness where they are with amx_data() before any check: the weight
 * rows (row i at w + i * cm_row_size(t, n)), the activation rows (token j
 * at x + j * cm_row_size(xt, n)) and the activations' type xt.
 */
#ifndef CM_TEST_AMX_H
#define CM_TEST_AMX_H

#include "base/base.h"
#include "kernels/kernels.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>

enum { ROWS = 37, MAXTOK = 129, LDY = ROWS + 5 };
static float g_ref[MAXTOK * ROWS], g_y[MAXTOK * LDY];
static int g_skipped, g_printed;
static long g_compared; /* (row, token) results compared */
static const char *g_wb, *g_xb;
static enum cm_type g_xt;

static inline void amx_data(const void *w, const void *x, enum cm_type xt) {
    g_wb = w;
    g_xb = x;
    g_xt = xt;
}

/* g_ref[j * ROWS + i] = the avx512 vec_dot of row i and token j. */
static inline void reference(const cm_kernels *k, enum cm_type t, int64_t n, int n_tok) {
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(g_xt, n);
    for (int j = 0; j < n_tok; j++)
        for (int i = 0; i < ROWS; i++) k->vec_dot[t](n, &g_ref[j * ROWS + i], g_wb + i * ws, g_xb + j * xs);
}

/* Run gemm on rows [r0, r1) and n_tok tokens with ldy = LDY; every
 * (row, token) in the slice must equal g_ref, everything else be untouched. */
static inline int check(cm_gemm_fn gemm, enum cm_type t, int64_t n, int n_tok, int r0, int r1) {
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(g_xt, n);
    const float sentinel = -7.25e30f;
    for (int i = 0; i < n_tok * LDY; i++) g_y[i] = sentinel;
    gemm(n, g_wb, ws, g_xb, xs, g_y, LDY, r0, r1, n_tok);
    int bad = 0;
    for (int j = 0; j < n_tok; j++)
        for (int i = 0; i < LDY; i++) {
            const float *got = &g_y[j * LDY + i];
            const bool in = i >= r0 && i < r1;
            g_compared += in;
            const bool ok = in ? memcmp(got, &g_ref[j * ROWS + i], 4) == 0 : *got == sentinel;
            if (!ok && bad++ < 3 && g_printed++ < 12)
                fprintf(stderr, "  %s n=%lld n_tok=%d rows [%d,%d): (row %d, token %d) %.9g, vec_dot %.9g\n",
                        cm_type_name(t), (long long)n, n_tok, r0, r1, i, j, (double)*got,
                        in ? (double)g_ref[j * ROWS + i] : (double)sentinel);
        }
    return bad;
}

/* No AMX gemm (CPU, OS or build): report a skip and return true. */
static inline bool amx_skip(const cm_kernels *k, cm_gemm_fn amx) {
    if (k && amx) return false;
    printf("skip: n/a: no AMX gemm here (%s)\n", cm_kernels_amx_why());
    g_skipped++;
    return true;
}

/* The AMX gemm on rows of n (g_ref made for MAXTOK tokens): rows up to
 * short_max get every n_tok up to 40 and every slice, the longer ones fewer
 * tokens and slices; then 47, 64, 65, 100 and 129 tokens (full 16-token
 * groups and a last group of each size). */
static inline void amx_sweep(cm_gemm_fn amx, enum cm_type t, int64_t n, int64_t short_max) {
    static const int slices[][2] = {{0, ROWS}, {5, 21}, {16, 33}, {3, 4}, {17, 37}};
    static const int big_tok[] = {47, 64, 65, 100, 129};
    int bad = 0;
    const int maxsmall = n <= short_max ? 40 : 18;
    for (int nt = 1; nt <= maxsmall; nt++)
        for (size_t s = 0; s < CM_ARRAY_LEN(slices); s++)
            if (n <= short_max || s < 2) bad += check(amx, t, n, nt, slices[s][0], slices[s][1]);
    for (size_t b = 0; b < CM_ARRAY_LEN(big_tok); b++)
        for (size_t s = 0; s < CM_ARRAY_LEN(slices); s++)
            if (n <= short_max || s == 2) bad += check(amx, t, n, big_tok[b], slices[s][0], slices[s][1]);
    CHECKF(bad == 0, "%s, rows of %lld: %d results differ from vec_dot", cm_type_name(t), (long long)n, bad);
}

/* Weights and activations for type t and rows of n (k: the avx512 table). */
typedef void (*amx_fill_fn)(const cm_kernels *k, enum cm_type t, int64_t n);

/* Each type's AMX gemm against vec_dot over rows of each length (amx_sweep);
 * a skip without types[0]'s AMX gemm. */
static inline void amx_bits(const enum cm_type *types, size_t n_types, const int64_t *lens, size_t n_lens,
                            int64_t short_max, amx_fill_fn fill) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (amx_skip(k, cm_kernels_amx_gemm(types[0], true))) return;
    for (size_t ti = 0; ti < n_types; ti++) {
        const enum cm_type t = types[ti];
        const cm_gemm_fn amx = cm_kernels_amx_gemm(t, true);
        CHECK(amx != NULL);
        if (!amx) continue;
        for (size_t li = 0; li < n_lens; li++) {
            fill(k, t, lens[li]);
            reference(k, t, lens[li], MAXTOK);
            amx_sweep(amx, t, lens[li], short_max);
        }
    }
}

/* Which path a batch took (cm_kernels_amx_calls, before: its count before
 * the call): AMX exactly from the token count cm_kernels_amx_path gives for
 * this type, layout and row length where AMX is on, the replaced gemm below
 * it and everywhere with CUMULO_AMX=0. g_path_bad counts the batches that
 * took the other path. */
static long g_path_bad, g_path_checked;
static inline void amx_path_check(enum cm_type t, bool packed, int64_t n, int64_t n_tok, uint64_t before) {
    cm_gemm_fn a, p;
    const int mintok = cm_kernels_amx_path(t, packed, n, &a, &p);
    const bool want = !*cm_kernels_amx_why() && mintok > 0 && n_tok > 1 && n_tok >= mintok;
    const bool got = cm_kernels_amx_calls() != before;
    g_path_checked++;
    if (want != got && g_path_bad++ < 6)
        fprintf(stderr, "  %s%s rows of %lld, %lld tokens: %s, expected %s (AMX from %d)\n", cm_type_name(t),
                packed ? " repacked" : "", (long long)n, (long long)n_tok, got ? "AMX" : "not AMX",
                want ? "AMX" : "not AMX", mintok);
}

/* The table's own gemm (AMX from its minimum token count when CUMULO_AMX is
 * not 0) through cm_matmul_rows, the model's entry, on weights of type g_mt. */
static enum cm_type g_mt;
static inline void gemm_via_matmul(int64_t n, const void *w, size_t ws, const void *x, size_t xs, float *y, int64_t ldy,
                                   int64_t r0, int64_t r1, int64_t n_tok) {
    cm_tensor W;
    const int64_t ne[2] = {n, ROWS};
    cm_tensor_init(&W, g_mt, 2, ne, (void *)(uintptr_t)w, "w");
    CHECK(W.nb[1] == ws);
    const uint64_t before = cm_kernels_amx_calls();
    cm_matmul_rows(cm_kernels_for("avx512"), &W, x, xs, n_tok, y, ldy, r0, r1);
    amx_path_check(g_mt, false, n, n_tok, before);
}

/* The avx512 table's own gemms through cm_matmul_rows (gemm_via_matmul),
 * every row, for each type and row length and each of the n_toks token
 * counts; a skip without the table. Prints whether its gemms use AMX. */
static inline void amx_table_bits(const enum cm_type *types, size_t n_types, const int64_t *lens, size_t n_lens,
                                  const int *toks, size_t n_toks, amx_fill_fn fill) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k) {
        printf("skip: n/a: no avx512 table on this CPU\n");
        g_skipped++;
        return;
    }
    printf("# avx512 table, AMX: %s\n", *cm_kernels_amx_why() ? cm_kernels_amx_why() : "in use");
    for (size_t ti = 0; ti < n_types; ti++)
        for (size_t li = 0; li < n_lens; li++) {
            const enum cm_type t = types[ti];
            const int64_t n = lens[li];
            fill(k, t, n);
            reference(k, t, n, MAXTOK);
            g_mt = t;
            int bad = 0;
            for (size_t i = 0; i < n_toks; i++) bad += check(gemm_via_matmul, t, n, toks[i], 0, ROWS);
            CHECKF(bad == 0, "%s rows of %lld through cm_matmul_rows: %d results differ from vec_dot", cm_type_name(t),
                   (long long)n, bad);
        }
    CHECKF(g_path_bad == 0, "%ld of %ld batches through cm_matmul_rows took the wrong path", g_path_bad,
           g_path_checked);
}

/* The table's gemm_packed over rows of type t repacked at load (the model's
 * copies, cm_repack_add), through cm_matmul_rows on the tensor whose copy
 * was made: vec_dot's bits on the file's bytes for every n_tok from 2 to 40
 * and row slices, each batch on its path (amx_path_check). A skip without
 * the avx512 table's gemm_packed for t. */
static inline void amx_packed_bits(enum cm_type t, const int64_t *lens, size_t n_lens, amx_fill_fn fill) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k || !k->gemm_packed[t]) {
        printf("skip: n/a: no avx512 table with a repacked %s gemm on this CPU\n", cm_type_name(t));
        g_skipped++;
        return;
    }
    for (size_t li = 0; li < n_lens; li++) {
        const int64_t n = lens[li];
        fill(k, t, n);
        reference(k, t, n, MAXTOK);
        cm_tensor W;
        const int64_t ne[2] = {n, ROWS};
        cm_tensor_init(&W, t, 2, ne, (void *)(uintptr_t)g_wb, "w");
        int owner;
        char err[128] = "";
        const cm_tensor *ws[] = {&W};
        CHECKF(cm_repack_add(&owner, k, ws, 1, err, sizeof err) == 0, "%s", err);
        if (!cm_repack_find(&W, NULL)) {
            printf("skip: no repacked copy (CUMULO_REPACK=0?)\n");
            g_skipped++;
            cm_repack_drop(&owner);
            return;
        }
        int bad = 0;
        const size_t xs = cm_row_size(g_xt, n);
        for (int nt = 2; nt <= 40; nt++) {
            static const int sl[][2] = {{0, ROWS}, {5, 21}, {17, 37}};
            for (size_t si = 0; si < CM_ARRAY_LEN(sl); si++) {
                for (int i = 0; i < nt * LDY; i++) g_y[i] = -7.25e30f;
                const uint64_t before = cm_kernels_amx_calls();
                cm_matmul_rows(k, &W, g_xb, xs, nt, g_y, LDY, sl[si][0], sl[si][1]);
                amx_path_check(t, true, n, nt, before);
                for (int j = 0; j < nt; j++)
                    for (int i = 0; i < LDY; i++) {
                        const bool in = i >= sl[si][0] && i < sl[si][1];
                        g_compared += in;
                        bad += in ? memcmp(&g_y[j * LDY + i], &g_ref[j * ROWS + i], 4) != 0
                                  : g_y[j * LDY + i] != -7.25e30f;
                    }
            }
        }
        CHECKF(bad == 0, "repacked %s, rows of %lld: %d results differ from vec_dot", cm_type_name(t), (long long)n,
               bad);
        cm_repack_drop(&owner);
    }
    CHECKF(g_path_bad == 0, "%ld of %ld batches over repacked rows took the wrong path", g_path_bad, g_path_checked);
}

/* Where AMX starts, per path (cm_kernels_amx_path), is no later than the
 * measured crossover it was set from (bench/amxcross.c): a small batch that
 * AMX serves faster must not go to the replaced gemm. Each entry: type,
 * repacked, row length, the latest first token count allowed. A skip
 * without AMX in use. */
typedef struct {
    enum cm_type t;
    bool packed;
    int64_t n;
    int at_most;
} amx_start;
static inline void amx_starts(const amx_start *st, size_t n_st) {
    if (*cm_kernels_amx_why()) {
        printf("skip: n/a: AMX not in use (%s)\n", cm_kernels_amx_why());
        g_skipped++;
        return;
    }
    for (size_t i = 0; i < n_st; i++) {
        cm_gemm_fn a, p;
        const int m = cm_kernels_amx_path(st[i].t, st[i].packed, st[i].n, &a, &p);
        CHECKF(a && p && m >= 1 && m <= st[i].at_most, "%s%s rows of %lld: AMX from %d tokens, want <= %d",
               cm_type_name(st[i].t), st[i].packed ? " repacked" : "", (long long)st[i].n, m, st[i].at_most);
    }
}

/* Two threads at once on different slices of one product, 64 tokens, rows
 * of n (g_ref made for them): each configures its own tiles. */
typedef struct {
    cm_gemm_fn gemm;
    enum cm_type t;
    int64_t n;
    int r0, r1, reps;
    float *y;
} amx_job;
static inline void *amx_run_job(void *p) {
    amx_job *j = p;
    const size_t ws = cm_row_size(j->t, j->n), xs = cm_row_size(g_xt, j->n);
    for (int r = 0; r < j->reps; r++) j->gemm(j->n, g_wb, ws, g_xb, xs, j->y, ROWS, j->r0, j->r1, 64);
    return NULL;
}
static inline void amx_threads(cm_gemm_fn amx, enum cm_type t, int64_t n) {
    static float y[64 * ROWS];
    amx_job a = {amx, t, n, 0, 19, 20, y}, b = {amx, t, n, 19, ROWS, 20, y};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, amx_run_job, &a) == 0);
    CHECK(pthread_create(&tb, NULL, amx_run_job, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(memcmp(y, g_ref, sizeof y) == 0);
}

/* amx_threads on type t's AMX gemm over rows of 2048; a skip without it. */
static inline void amx_threads_test(enum cm_type t, amx_fill_fn fill) {
    const cm_kernels *k = cm_kernels_for("avx512");
    const cm_gemm_fn amx = cm_kernels_amx_gemm(t, true);
    if (amx_skip(k, amx)) return;
    const int64_t n = 2048;
    fill(k, t, n);
    reference(k, t, n, 64);
    amx_threads(amx, t, n);
}

#endif
