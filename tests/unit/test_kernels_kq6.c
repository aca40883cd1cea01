/*
 * test_kernels_kq6.c: the avx512 table's q6_k prefill gemm
 * (gemm_kq6_avx512.c: tokens in lanes, 4 rows x 16 tokens, passes of token
 * groups, from 32 tokens; the lane-per-sub-block tiles below and for a last few) on odd shapes:
 * rows of 1, 3, 6 and 9 (ragged row tiles) starting at row 0 and 1, token
 * counts 1..40 (1: the table's gemm; 2..31: the small tiles; 16..40: full
 * and partial groups), row lengths of 1, 3, 8, 11, 17 and 64 super-blocks
 * (several passes for the longest) and 65 and 130 (past KQ_MAXNB: the
 * fallback). Every (row, token) must equal the table's vec_dot bit for bit
 * (kernels.h's contract) and the scalar reference within 1e-5 of the dot's
 * absolute sum (a wrong scale or offset is far larger). A CPU without the
 * avx512 table reports the test skipped.
 */
#include "kernels/kernels.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float frand(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

enum { MAXROWS = 10, MAXTOK = 40 };

static int g_skipped;

static void check_shape(const cm_kernels *k, int64_t n, int rows, int r0, int n_tok) {
    const cm_kernels *ref = cm_kernels_ref();
    const size_t ws = cm_row_size(CM_TYPE_Q6_K, n), xs = cm_row_size(CM_TYPE_Q8_K, n);
    float *f = malloc(sizeof(float) * (size_t)n * MAXROWS), *wf = malloc(sizeof(float) * (size_t)n * MAXROWS),
          *xf = malloc(sizeof(float) * (size_t)n * MAXTOK), *y = malloc(sizeof(float) * MAXTOK * MAXROWS);
    uint8_t *w = malloc(ws * MAXROWS), *x = malloc(xs * MAXTOK);
    for (int64_t i = 0; i < n * (r0 + rows); i++) f[i] = frand() * (float)(1 << (rnd() % 8));
    CHECK(cm_quantize_rows(CM_TYPE_Q6_K, f, w, r0 + rows, n) == (size_t)(r0 + rows) * ws);
    for (int r = 0; r < r0 + rows; r++) ref->to_float[CM_TYPE_Q6_K](w + (size_t)r * ws, wf + (size_t)r * n, n);
    for (int j = 0; j < n_tok; j++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[CM_TYPE_Q8_K](f, x + (size_t)j * xs, n);
        const cm_block_q8_k *yb = (const cm_block_q8_k *)(const void *)(x + (size_t)j * xs);
        for (int64_t i = 0; i < n; i++)
            xf[(size_t)j * n + i] = yb[i / CM_QK_K].d * (float)yb[i / CM_QK_K].qs[i % CM_QK_K];
    }
    for (int i = 0; i < MAXTOK * MAXROWS; i++) y[i] = -7.0f;
    k->gemm[CM_TYPE_Q6_K](n, w, ws, x, xs, y, MAXROWS, r0, r0 + rows, n_tok);
    long bad_bits = 0, bad_ref = 0, outside = 0;
    for (int j = 0; j < n_tok; j++)
        for (int r = 0; r < MAXROWS; r++) {
            const float got = y[j * MAXROWS + r];
            if (r < r0 || r >= r0 + rows) {
                outside += got != -7.0f;
                continue;
            }
            float vd, rd;
            k->vec_dot[CM_TYPE_Q6_K](n, &vd, w + (size_t)r * ws, x + (size_t)j * xs);
            ref->vec_dot[CM_TYPE_Q6_K](n, &rd, w + (size_t)r * ws, x + (size_t)j * xs);
            double abs = 0;
            for (int64_t i = 0; i < n; i++) abs += fabs((double)wf[(size_t)r * n + i] * xf[(size_t)j * n + i]);
            bad_bits += memcmp(&got, &vd, sizeof got) != 0;
            if (fabs((double)got - rd) > 1e-5 * abs + 1e-6) {
                if (!bad_ref++)
                    fprintf(stderr,
                            "  q6_k k=%lld rows %d+%d n_tok %d: row %d token %d: gemm %.9g ref %.9g (abs %.3g)\n",
                            (long long)n, r0, rows, n_tok, r, j, (double)got, (double)rd, abs);
            }
        }
    CHECKF(outside == 0, "q6_k k=%lld: %ld writes outside the row slice", (long long)n, outside);
    CHECKF(bad_bits == 0, "q6_k k=%lld rows %d+%d n_tok %d: %ld results differ from vec_dot", (long long)n, r0, rows,
           n_tok, bad_bits);
    CHECK(bad_ref == 0);
    free(f), free(wf), free(xf), free(y), free(w), free(x);
}

static void test_q6_k_gemm(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k) {
        g_skipped++;
        return;
    }
    static const int64_t nbs[] = {1, 3, 8, 11, 17, 64, 65, 130};
    static const int rows[][2] = {{0, 1}, {1, 3}, {0, 6}, {1, 9}};
    for (size_t a = 0; a < sizeof nbs / sizeof nbs[0]; a++)
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++)
            for (int t = 1; t <= MAXTOK; t++) {
                if (nbs[a] >= 17 && t % 8 != 0 && t % 8 != 1 && t != 15) continue; /* the long rows: fewer counts */
                check_shape(k, nbs[a] * CM_QK_K, rows[b][1], rows[b][0], t);
            }
}

int main(void) {
    RUN(test_q6_k_gemm);
    TEST_END_SKIPPED(g_skipped);
}
