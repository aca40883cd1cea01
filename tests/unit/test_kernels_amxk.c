/*
 * test_kernels_amxk.c: the AMX prefill gemms for q4_k and q5_k
 * (gemm_kq45_amx.c) give the avx512 table's vec_dot bits for every (row, token),
 * so logits are the same with CUMULO_AMX=0 and 1 and an AMX machine agrees
 * with a Zen 4 one in a cluster (kernels.h batch invariance). memcmp, no
 * tolerance.
 *
 * Row lengths of 1, 2, 8, 9, 15, 16, 17, 22, 31, 33 and 64 super-blocks
 * (every lane chain empty, one long and two long; 64 is the longest the AMX
 * path takes); every n_tok from 1 to 40 and 47, 64, 65, 100, 129 (full
 * 16-token groups and a last group of each size); row slices that start and
 * end off the 16-row panels; an output stride wider than the rows (what lies
 * outside the slice must stay untouched). Weights are random bytes (every
 * scale, min, nibble and fifth bit, the largest products 63 * 31 included)
 * with random-sign d and dmin of varied size; activations come from the
 * table's q8_k quantizer over random floats of varied size, some tokens
 * saturated (values of +-127 and -128 in every block). Also through
 * cm_matmul_rows with the avx512 table, and two threads at once (tile
 * configuration is per thread). A CPU, OS or build without AMX-INT8
 * reports a skip.
 */
#include "base/base.h"
#include "kernels/kernels.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>

#include "test_rng.h"

enum { ROWS = 37, MAXTOK = 129, MAXNB = 64, MAXK = MAXNB * 256 };
static uint8_t g_w[ROWS * MAXNB * 176], g_x[MAXTOK * MAXNB * 292];
static float g_ref[MAXTOK * ROWS], g_y[MAXTOK * (ROWS + 5)], g_f[MAXK];
static int g_skipped, g_printed;
static long g_compared; /* (row, token) results compared */

static void fill(const cm_kernels *k, enum cm_type t, int64_t n) {
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(CM_TYPE_Q8_K, n), bw = t == CM_TYPE_Q4_K ? 144 : 176;
    const int64_t nb = n / 256;
    for (size_t i = 0; i < ROWS * ws; i++) g_w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < (size_t)(ROWS * nb); b++) {
        const cm_f16 d = cm_f32_to_f16(frand() * (float)(1 << (rnd() % 6)) * 0.0005f);
        const cm_f16 dm = cm_f32_to_f16(frand() * (float)(1 << (rnd() % 6)) * 0.0005f);
        memcpy(g_w + b * bw, &d, 2);
        memcpy(g_w + b * bw + 2, &dm, 2);
    }
    for (int j = 0; j < MAXTOK; j++) {
        const bool sat = j % 7 == 3; /* every value at +-amax: +-127 and -128 after rounding */
        for (int64_t b = 0; b < nb; b++) {
            const float s = (float)(1 << (rnd() % 8)) * 0.01f;
            for (int i = 0; i < 256; i++) g_f[b * 256 + i] = sat ? (rnd() & 1 ? s : -s) : frand() * s;
        }
        k->from_float[CM_TYPE_Q8_K](g_f, g_x + (size_t)j * xs, n);
    }
}

/* g_ref[j * ROWS + i] = the avx512 vec_dot of row i and token j. */
static void reference(const cm_kernels *k, enum cm_type t, int64_t n, int n_tok) {
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(CM_TYPE_Q8_K, n);
    for (int j = 0; j < n_tok; j++)
        for (int i = 0; i < ROWS; i++) k->vec_dot[t](n, &g_ref[j * ROWS + i], g_w + i * ws, g_x + j * xs);
}

/* Run gemm on rows [r0, r1) and n_tok tokens with ldy = ROWS + 5; every
 * (row, token) in the slice must equal g_ref, everything else be untouched. */
static int check(cm_gemm_fn gemm, enum cm_type t, int64_t n, int n_tok, int r0, int r1) {
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(CM_TYPE_Q8_K, n);
    const int ldy = ROWS + 5;
    const float sentinel = -7.25e30f;
    for (int i = 0; i < n_tok * ldy; i++) g_y[i] = sentinel;
    gemm(n, g_w, ws, g_x, xs, g_y, ldy, r0, r1, n_tok);
    int bad = 0;
    for (int j = 0; j < n_tok; j++)
        for (int i = 0; i < ldy; i++) {
            const float *got = &g_y[j * ldy + i];
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

static const enum cm_type k_types[] = {CM_TYPE_Q4_K, CM_TYPE_Q5_K};
static const int k_nbs[] = {1, 2, 8, 9, 15, 16, 17, 22, 31, 33, MAXNB};

static void test_amxk_bits(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k || !cm_kernels_amx_gemm(CM_TYPE_Q4_K, true)) {
        printf("skip: n/a: no AMX gemm here (%s)\n", cm_kernels_amx_why());
        g_skipped++;
        return;
    }
    static const int slices[][2] = {{0, ROWS}, {5, 21}, {16, 33}, {3, 4}, {17, 37}};
    static const int big_tok[] = {47, 64, 65, 100, 129};
    for (size_t ti = 0; ti < CM_ARRAY_LEN(k_types); ti++) {
        const enum cm_type t = k_types[ti];
        const cm_gemm_fn amx = cm_kernels_amx_gemm(t, true);
        CHECK(amx != NULL);
        if (!amx) continue;
        for (size_t li = 0; li < CM_ARRAY_LEN(k_nbs); li++) {
            const int64_t n = 256 * (int64_t)k_nbs[li];
            fill(k, t, n);
            reference(k, t, n, MAXTOK);
            int bad = 0;
            /* the short rows get every n_tok up to 40 and every slice; the long ones fewer */
            const int maxsmall = n <= 4096 ? 40 : 18;
            for (int nt = 1; nt <= maxsmall; nt++)
                for (size_t s = 0; s < CM_ARRAY_LEN(slices); s++)
                    if (n <= 4096 || s < 2) bad += check(amx, t, n, nt, slices[s][0], slices[s][1]);
            for (size_t b = 0; b < CM_ARRAY_LEN(big_tok); b++)
                for (size_t s = 0; s < CM_ARRAY_LEN(slices); s++)
                    if (n <= 4096 || s == 2) bad += check(amx, t, n, big_tok[b], slices[s][0], slices[s][1]);
            CHECKF(bad == 0, "%s, rows of %lld: %d results differ from vec_dot", cm_type_name(t), (long long)n, bad);
        }
    }
}

/* The table's own gemm (AMX from its minimum token count when CUMULO_AMX
 * is not 0) through cm_matmul_rows, the model's entry. */
static enum cm_type g_mt;
static void gemm_via_matmul(int64_t n, const void *w, size_t ws, const void *x, size_t xs, float *y, int64_t ldy,
                            int64_t r0, int64_t r1, int64_t n_tok) {
    cm_tensor W;
    const int64_t ne[2] = {n, ROWS};
    cm_tensor_init(&W, g_mt, 2, ne, (void *)(uintptr_t)w, "w");
    CHECK(W.nb[1] == ws);
    cm_matmul_rows(cm_kernels_for("avx512"), &W, x, xs, n_tok, y, ldy, r0, r1);
}

static void test_table_bits(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k) {
        printf("skip: n/a: no avx512 table on this CPU\n");
        g_skipped++;
        return;
    }
    printf("# avx512 table, AMX: %s\n", *cm_kernels_amx_why() ? cm_kernels_amx_why() : "in use");
    for (size_t ti = 0; ti < CM_ARRAY_LEN(k_types); ti++) {
        g_mt = k_types[ti];
        const int64_t n = 5632;
        fill(k, g_mt, n);
        reference(k, g_mt, n, MAXTOK);
        int bad = 0;
        static const int toks[] = {2, 7, 8, 9, 15, 16, 17, 31, 33, 64, 129};
        for (size_t i = 0; i < CM_ARRAY_LEN(toks); i++) bad += check(gemm_via_matmul, g_mt, n, toks[i], 0, ROWS);
        CHECKF(bad == 0, "%s through cm_matmul_rows: %d results differ from vec_dot", cm_type_name(g_mt), bad);
    }
}

/* Two threads at once on different slices of one product: each configures
 * its own tiles. */
typedef struct {
    cm_gemm_fn gemm;
    int64_t n;
    int r0, r1, reps;
    float *y;
} job;
static void *run_job(void *p) {
    job *j = p;
    const size_t ws = cm_row_size(CM_TYPE_Q5_K, j->n), xs = cm_row_size(CM_TYPE_Q8_K, j->n);
    for (int r = 0; r < j->reps; r++) j->gemm(j->n, g_w, ws, g_x, xs, j->y, ROWS, j->r0, j->r1, 64);
    return NULL;
}
static void test_amxk_threads(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    const cm_gemm_fn amx = cm_kernels_amx_gemm(CM_TYPE_Q5_K, true);
    if (!k || !amx) {
        printf("skip: n/a: no AMX gemm here (%s)\n", cm_kernels_amx_why());
        g_skipped++;
        return;
    }
    const int64_t n = 2048;
    fill(k, CM_TYPE_Q5_K, n);
    reference(k, CM_TYPE_Q5_K, n, 64);
    static float y[64 * ROWS];
    job a = {amx, n, 0, 19, 20, y}, b = {amx, n, 19, ROWS, 20, y};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, run_job, &a) == 0);
    CHECK(pthread_create(&tb, NULL, run_job, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(memcmp(y, g_ref, sizeof y) == 0);
}

int main(void) {
    RUN(test_amxk_bits);
    RUN(test_table_bits);
    RUN(test_amxk_threads);
    printf("# %ld (row, token) results compared with vec_dot\n", g_compared);
    TEST_END_SKIPPED(g_skipped);
}
