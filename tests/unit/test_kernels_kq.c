/*
 * test_kernels_kq.c: the avx512 table's k-quant gemms on odd shapes: rows of
 * 1, 3, 6 and 9 (ragged row tiles) starting at row 0 and 1, token counts
 * 1..40 around each gemm's limits, row lengths of 1 to 64 super-blocks
 * (several passes for the longest) and past the gemms' 64 (their fallbacks).
 * Every (row, token) must equal the table's vec_dot bit for bit (kernels.h's
 * contract), the decode gemv too at one token, and the scalar reference
 * within 1e-5 of the dot's absolute sum (a wrong scale, offset or min term
 * is far larger). A CPU without the avx512 table reports the test skipped.
 *
 * q4_k (gemm_kq4_avx512.c, its float order "z4" for every path): 1 token the
 * gemv; 2..11 gemm_kw4, partial 4-token tiles; 12 and more 16-token groups;
 * 65 and 129 super-blocks k4_multi and past the decode gemv's token arrays.
 * q5_k (gemm_kq_avx512.c): 1..6 tokens gemv_kd_avx512.c's rows; 7, 8: 8
 * lanes; 9..16 one group of 16; 17, 19, 21, 37: 16 lanes then the last 1..5
 * in rows; 22, 27, 40: their last 6..11 in lanes (a part-empty group).
 * q6_k (gemm_kq6_avx512.c): 2..31 the lane-per-sub-block tiles; from 32
 * tokens in lanes, 4 rows x 16 tokens, the last few in the small tiles.
 */
#include "kernels/kernels.h"
#include "tensor/tensor.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"

enum { MAXROWS = 10, MAXTOK = 40 };

static int g_skipped;

static void check_shape(const cm_kernels *k, int type, int64_t n, int rows, int r0, int n_tok) {
    const cm_kernels *ref = cm_kernels_ref();
    const char *name = cm_type_name(type);
    const size_t ws = cm_row_size(type, n), xs = cm_row_size(CM_TYPE_Q8_K, n);
    float *f = malloc(sizeof(float) * (size_t)n * MAXROWS), *wf = malloc(sizeof(float) * (size_t)n * MAXROWS),
          *xf = malloc(sizeof(float) * (size_t)n * MAXTOK), *y = malloc(sizeof(float) * MAXTOK * MAXROWS);
    uint8_t *w = malloc(ws * MAXROWS), *x = malloc(xs * MAXTOK);
    for (int64_t i = 0; i < n * (r0 + rows); i++) f[i] = frand() * (float)(1 << (rnd() % 8));
    CHECK(cm_quantize_rows(type, f, w, r0 + rows, n) == (size_t)(r0 + rows) * ws);
    for (int r = 0; r < r0 + rows; r++) ref->to_float[type](w + (size_t)r * ws, wf + (size_t)r * n, n);
    for (int j = 0; j < n_tok; j++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[CM_TYPE_Q8_K](f, x + (size_t)j * xs, n);
        const cm_block_q8_k *yb = (const cm_block_q8_k *)(const void *)(x + (size_t)j * xs);
        for (int64_t i = 0; i < n; i++)
            xf[(size_t)j * n + i] = yb[i / CM_QK_K].d * (float)yb[i / CM_QK_K].qs[i % CM_QK_K];
    }
    for (int i = 0; i < MAXTOK * MAXROWS; i++) y[i] = -7.0f;
    k->gemm[type](n, w, ws, x, xs, y, MAXROWS, r0, r0 + rows, n_tok);
    long bad_bits = 0, bad_ref = 0, outside = 0;
    for (int j = 0; j < n_tok; j++)
        for (int r = 0; r < MAXROWS; r++) {
            const float got = y[j * MAXROWS + r];
            if (r < r0 || r >= r0 + rows) {
                outside += got != -7.0f;
                continue;
            }
            float vd, rd;
            k->vec_dot[type](n, &vd, w + (size_t)r * ws, x + (size_t)j * xs);
            ref->vec_dot[type](n, &rd, w + (size_t)r * ws, x + (size_t)j * xs);
            double abs = 0;
            for (int64_t i = 0; i < n; i++) abs += fabs((double)wf[(size_t)r * n + i] * xf[(size_t)j * n + i]);
            bad_bits += memcmp(&got, &vd, sizeof got) != 0;
            if (fabs((double)got - rd) > 1e-5 * abs + 1e-6) {
                if (!bad_ref++)
                    fprintf(stderr, "  %s k=%lld rows %d+%d n_tok %d: row %d token %d: gemm %.9g ref %.9g (abs %.3g)\n",
                            name, (long long)n, r0, rows, n_tok, r, j, (double)got, (double)rd, abs);
            }
        }
    if (n_tok == 1) { /* the decode gemv over the file's bytes: the same bits */
        float g[MAXROWS];
        for (int i = 0; i < MAXROWS; i++) g[i] = -7.0f;
        k->gemv[type](n, w, ws, x, xs, g, MAXROWS, r0, r0 + rows, 1);
        long bad_gemv = 0;
        for (int r = r0; r < r0 + rows; r++) bad_gemv += memcmp(&g[r], &y[r], sizeof g[r]) != 0;
        CHECKF(bad_gemv == 0, "%s k=%lld rows %d+%d: %ld gemv results differ from vec_dot", name, (long long)n, r0,
               rows, bad_gemv);
    }
    CHECKF(outside == 0, "%s k=%lld: %ld writes outside the row slice", name, (long long)n, outside);
    CHECKF(bad_bits == 0, "%s k=%lld rows %d+%d n_tok %d: %ld results differ from vec_dot", name, (long long)n, r0,
           rows, n_tok, bad_bits);
    CHECK(bad_ref == 0);
    free(f), free(wf), free(xf), free(y), free(w), free(x);
}

static const int k_rows[][2] = {{0, 1}, {1, 3}, {0, 6}, {1, 9}};

/* Every row length of nbs against every token count of toks (all of 1..40
 * when short), and the long rows (past long_nb super-blocks) against
 * long_toks only. */
static void check_type(int type, const int64_t *nbs, int n_nbs, int64_t long_nb, const int *long_toks, int n_long) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k) {
        printf("skip: n/a: no avx512 table on this CPU (%s)\n", cm_type_name(type));
        g_skipped++;
        return;
    }
    for (int a = 0; a < n_nbs; a++)
        for (size_t b = 0; b < sizeof k_rows / sizeof k_rows[0]; b++) {
            const int n_toks = nbs[a] > long_nb ? n_long : MAXTOK;
            for (int c = 0; c < n_toks; c++)
                check_shape(k, type, nbs[a] * CM_QK_K, k_rows[b][1], k_rows[b][0],
                            nbs[a] > long_nb ? long_toks[c] : c + 1);
        }
}

static void test_q4_k(void) {
    static const int64_t nbs[] = {1, 3, 8, 11, 17, 64, 65, 129};
    static const int toks[] = {1, 2, 4, 5, 15, 17, 35}; /* few-token path, each width, partial, passes */
    check_type(CM_TYPE_Q4_K, nbs, 8, 11, toks, 7);
}

static void test_q5_k(void) {
    static const int64_t nbs[] = {1, 3, 8, 11, 17, 64};
    static const int toks[] = {1, 5, 7, 9, 17, 22, 35, 37};
    check_type(CM_TYPE_Q5_K, nbs, 6, 11, toks, 8);
}

static void test_q6_k(void) {
    static const int64_t nbs[] = {1, 3, 8, 11, 17, 64, 65, 130};
    static const int toks[] = {1, 8, 9, 15, 16, 17, 24, 25, 32, 33, 40};
    check_type(CM_TYPE_Q6_K, nbs, 8, 16, toks, 11);
}

int main(void) {
    RUN(test_q4_k);
    RUN(test_q5_k);
    RUN(test_q6_k);
    TEST_END_SKIPPED(g_skipped);
}
