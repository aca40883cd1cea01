/*
 * test_kernels_amx6.c: the q6_k AMX prefill gemm (gemm_kq6_amx.c) gives the
 * avx512 table's vec_dot bits for every (row, token), so logits are the same
 * with CUMULO_AMX=0 and 1 and an AMX machine agrees with a Zen 4 one in a
 * cluster (kernels.h batch invariance). memcmp, no tolerance.
 *
 * Row lengths of 1, 3, 15, 16, 17, 31 and 33 super-blocks (chains, b mod 16,
 * of every shape: some empty, one or two or three super-blocks long), 2048,
 * 8192 and 16384 (the longest the AMX path takes); every n_tok from 1 to 40
 * and 47, 64, 65, 100, 129 (full 16-token groups and a last group of each
 * size); row slices that start and end off the 16-row panels; an output
 * stride wider than the rows (what lies outside the slice must stay
 * untouched). Weights are random bytes (every 6-bit value, scales from -128
 * to 127 with their products at both ends of the split's range) with
 * random-sign d of varied size; activations stay in -127..127 as from_float
 * makes them, with their bsums. Also through cm_matmul_rows with the avx512
 * table (AMX from its minimum token count, the VNNI gemm below), and two
 * threads at once (tile configuration is per thread). A CPU, OS or build
 * without AMX-INT8 reports a skip. q6_k has no repacked gemm in the avx512
 * table (its "q6_k lanes" copy serves one-token decode only), so the gemm
 * reads only the file's layout.
 */
#include "base/base.h"
#include "kernels/kernels.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>

#include "test_rng.h"

enum { ROWS = 37, MAXTOK = 129, MAXK = 16384, NBMAX = MAXK / 256 };
static cm_block_q6_k g_w[ROWS * NBMAX];
static cm_block_q8_k g_x[MAXTOK * NBMAX];
static float g_ref[MAXTOK * ROWS], g_y[MAXTOK * (ROWS + 5)];
static int g_skipped, g_printed;
static long g_compared; /* (row, token) results compared */

static void fill(int64_t k) {
    const size_t nb = (size_t)(k / 256);
    uint8_t *w = (uint8_t *)g_w;
    for (size_t i = 0; i < ROWS * nb * sizeof(cm_block_q6_k); i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < ROWS * nb; b++) {
        g_w[b].d = cm_f32_to_f16(frand() * (float)(1 << (rnd() % 6)) * 0.0003f);
        if (b % 7 == 0) g_w[b].scales[rnd() % 16] = -128; /* w = 4096: hi 16, lo 0 */
        if (b % 5 == 0) g_w[b].scales[rnd() % 16] = 127;
    }
    for (size_t b = 0; b < MAXTOK * nb; b++) {
        for (int j = 0; j < 256; j++) {
            int v;
            do v = (int8_t)rnd();
            while (v == -128);
            g_x[b].qs[j] = (int8_t)v;
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += g_x[b].qs[16 * g + j];
            g_x[b].bsums[g] = (int16_t)s;
        }
        g_x[b].d = frand() * (float)(1 << (rnd() % 6)) * 0.001f;
    }
}

/* g_ref[j * ROWS + i] = the avx512 vec_dot of row i and token j. */
static void reference(const cm_kernels *k, int64_t n, int n_tok) {
    const size_t ws = cm_row_size(CM_TYPE_Q6_K, n), xs = cm_row_size(CM_TYPE_Q8_K, n);
    for (int j = 0; j < n_tok; j++)
        for (int i = 0; i < ROWS; i++)
            k->vec_dot[CM_TYPE_Q6_K](n, &g_ref[j * ROWS + i], (const char *)g_w + i * ws, (const char *)g_x + j * xs);
}

/* Run gemm on rows [r0, r1) and n_tok tokens with ldy = ROWS + 5; every
 * (row, token) in the slice must equal g_ref, everything else be untouched. */
static int check(cm_gemm_fn gemm, int64_t n, int n_tok, int r0, int r1) {
    const size_t ws = cm_row_size(CM_TYPE_Q6_K, n), xs = cm_row_size(CM_TYPE_Q8_K, n);
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
                fprintf(stderr, "  q6_k n=%lld n_tok=%d rows [%d,%d): (row %d, token %d) %.9g, vec_dot %.9g\n",
                        (long long)n, n_tok, r0, r1, i, j, (double)*got,
                        in ? (double)g_ref[j * ROWS + i] : (double)sentinel);
        }
    return bad;
}

static const int64_t k_lens[] = {256, 3 * 256, 15 * 256, 16 * 256, 17 * 256, 31 * 256, 33 * 256, 2048, 8192, MAXK};

static void test_amx6_bits(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    const cm_gemm_fn amx = cm_kernels_amx_gemm(CM_TYPE_Q6_K, true);
    if (!k || !amx) {
        printf("skip: n/a: no AMX gemm here (%s)\n", cm_kernels_amx_why());
        g_skipped++;
        return;
    }
    static const int slices[][2] = {{0, ROWS}, {5, 21}, {16, 33}, {3, 4}, {17, 37}};
    static const int big_tok[] = {47, 64, 65, 100, 129};
    for (size_t li = 0; li < CM_ARRAY_LEN(k_lens); li++) {
        const int64_t n = k_lens[li];
        fill(n);
        reference(k, n, MAXTOK);
        int bad = 0;
        /* the short rows get every n_tok up to 40 and every slice; the long ones fewer */
        const int maxsmall = n <= 4096 ? 40 : 18;
        for (int nt = 1; nt <= maxsmall; nt++)
            for (size_t s = 0; s < CM_ARRAY_LEN(slices); s++)
                if (n <= 4096 || s < 2) bad += check(amx, n, nt, slices[s][0], slices[s][1]);
        for (size_t b = 0; b < CM_ARRAY_LEN(big_tok); b++)
            for (size_t s = 0; s < CM_ARRAY_LEN(slices); s++)
                if (n <= 4096 || s == 2) bad += check(amx, n, big_tok[b], slices[s][0], slices[s][1]);
        CHECKF(bad == 0, "q6_k, rows of %lld: %d results differ from vec_dot", (long long)n, bad);
    }
}

/* The table's own gemm (AMX from its minimum token count when CUMULO_AMX is
 * not 0) through cm_matmul_rows, the model's entry. */
static void gemm_via_matmul(int64_t n, const void *w, size_t ws, const void *x, size_t xs, float *y, int64_t ldy,
                            int64_t r0, int64_t r1, int64_t n_tok) {
    cm_tensor W;
    const int64_t ne[2] = {n, ROWS};
    cm_tensor_init(&W, CM_TYPE_Q6_K, 2, ne, (void *)(uintptr_t)w, "w");
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
    static const int64_t lens[] = {2048, 8192, MAXK};
    for (size_t li = 0; li < CM_ARRAY_LEN(lens); li++) {
        const int64_t n = lens[li];
        fill(n);
        reference(k, n, MAXTOK);
        int bad = 0;
        static const int toks[] = {2, 7, 11, 12, 13, 15, 16, 17, 31, 33, 64, 129};
        for (size_t i = 0; i < CM_ARRAY_LEN(toks); i++) bad += check(gemm_via_matmul, n, toks[i], 0, ROWS);
        CHECKF(bad == 0, "q6_k rows of %lld through cm_matmul_rows: %d results differ from vec_dot", (long long)n, bad);
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
    const size_t ws = cm_row_size(CM_TYPE_Q6_K, j->n), xs = cm_row_size(CM_TYPE_Q8_K, j->n);
    for (int r = 0; r < j->reps; r++) j->gemm(j->n, g_w, ws, g_x, xs, j->y, ROWS, j->r0, j->r1, 64);
    return NULL;
}
static void test_amx6_threads(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    const cm_gemm_fn amx = cm_kernels_amx_gemm(CM_TYPE_Q6_K, true);
    if (!k || !amx) {
        printf("skip: n/a: no AMX gemm here (%s)\n", cm_kernels_amx_why());
        g_skipped++;
        return;
    }
    const int64_t n = 2048;
    fill(n);
    reference(k, n, 64);
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
    RUN(test_amx6_bits);
    RUN(test_table_bits);
    RUN(test_amx6_threads);
    printf("# %ld (row, token) results compared with vec_dot\n", g_compared);
    TEST_END_SKIPPED(g_skipped);
}
