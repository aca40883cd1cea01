/*
 * test_kernels_invariant.c: batch invariance, the contract of kernels.h.
 * For every kernel table this CPU runs (scalar, avx2, avx512, neon) and every
 * weight type, the product of a token in a batch of n_tok tokens (any n_tok
 * from 1 to 33, the token at any position in the batch, any row slice) must
 * equal, bit for bit (memcmp), vec_dot of the same weight row and activation
 * row. Without this the same request gives different logits alone, batched
 * with other users, or after prompt-prefix reuse, and near-tie greedy tokens
 * flip. Agreement with the reference within a float bound is
 * test_kernels_simd.c's job; this test allows no difference at all.
 *
 * Rows of 27 blocks (the 512-bit tiles' 8-block groups plus a 3-block tail)
 * for 32-element types, 3 super-blocks for K-quants and 869 elements (not a
 * multiple of any vector width) for float types; 37 rows, so row slices
 * cross the gemm's row blocks unevenly. Activations are a pool of 40 distinct
 * token rows; a batch is the pool window [s, s + n_tok), so each pool row
 * shows up at many positions of many batch sizes. Long rows (10336 and 6496
 * elements; K-quants 40 and 64 super-blocks) with 19 tokens at once, where the
 * gemms need several passes, and with one token (the decode gemvs).
 */
#include "kernels/kernels.h"
#include "test.h"

#include <stdint.h>

#include "test_rng.h"

static const enum cm_type k_types[] = {CM_TYPE_Q4_0,  CM_TYPE_Q4_1,    CM_TYPE_Q5_0,    CM_TYPE_Q5_1,   CM_TYPE_Q8_0,
                                       CM_TYPE_Q4_K,  CM_TYPE_Q5_K,    CM_TYPE_Q6_K,    CM_TYPE_F16,    CM_TYPE_BF16,
                                       CM_TYPE_F32,   CM_TYPE_Q2_K,    CM_TYPE_Q3_K,    CM_TYPE_IQ4_NL, CM_TYPE_IQ4_XS,
                                       CM_TYPE_MXFP4, CM_TYPE_IQ2_XXS, CM_TYPE_IQ3_XXS, CM_TYPE_IQ1_S};
/* Rows of a type: through the reference quantizer, or, for the grid types
 * that have none, random blocks with a sane f16 scale d (their first field). */
static size_t make_rows(enum cm_type t, const float *f, uint8_t *w, int64_t rows, int64_t n) {
    const size_t got = cm_quantize_rows(t, f, w, rows, n);
    if (got || (t != CM_TYPE_IQ2_XXS && t != CM_TYPE_IQ3_XXS && t != CM_TYPE_IQ1_S)) return got;
    const cm_type_traits *tr = cm_type_traits_of(t);
    const size_t nb = (size_t)rows * (size_t)(n / tr->block_size);
    for (size_t i = 0; i < nb * tr->type_size; i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < nb; b++) {
        const cm_f16 d = cm_f32_to_f16(0.01f * f[b % (size_t)n]);
        memcpy(w + b * tr->type_size, &d, 2);
    }
    return nb * tr->type_size;
}
/* Super-block (256) types: rows are multiples of 256. */
static bool is_k(enum cm_type t) { return cm_type_traits_of(t)->block_size == 256; }
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])
static const char *const k_isas[] = {"scalar", "avx2", "avx512", "neon"};

enum { ROWS = 37, POOL = 40, MAXTOK = 33, MAXK = 1024 };
static float g_f[ROWS * MAXK];
static uint8_t g_w[ROWS * MAXK * 4], g_x[POOL * MAXK * 4];
static float g_ref[POOL][ROWS], g_y[MAXTOK * ROWS];

static int64_t row_len(enum cm_type t) {
    if (t == CM_TYPE_F32 || t == CM_TYPE_F16 || t == CM_TYPE_BF16) return 869;
    if (is_k(t)) return 3 * 256;
    return 27 * 32;
}

static void check_table(const cm_kernels *k, enum cm_type t) {
    const cm_type_traits *tr = cm_type_traits_of(t);
    const enum cm_type vt = tr->vec_dot_type;
    const int64_t n = row_len(t);
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(vt, n);
    /* Weights with a spread of magnitudes, so float rounding matters. */
    for (int64_t i = 0; i < ROWS * n; i++) g_f[i] = frand() * (float)(1 << (rnd() % 8));
    CHECK(make_rows(t, g_f, g_w, ROWS, n) == ROWS * ws);
    for (int p = 0; p < POOL; p++) {
        for (int64_t i = 0; i < n; i++) g_f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[vt](g_f, g_x + (size_t)p * xs, n);
    }
    cm_tensor W;
    memset(&W, 0, sizeof W);
    W.type = t;
    W.ne[0] = n;
    W.ne[1] = ROWS;
    W.nb[1] = ws;
    W.data = g_w;
    for (int p = 0; p < POOL; p++)
        for (int r = 0; r < ROWS; r++) k->vec_dot[t](n, &g_ref[p][r], g_w + (size_t)r * ws, g_x + (size_t)p * xs);

    long bad = 0, cases = 0;
    char first[160] = "";
    static const int starts[] = {0, 1, 3, 7};
    static const int slices[][2] = {{0, ROWS}, {5, 22}, {36, 37}};
    for (int n_tok = 1; n_tok <= MAXTOK; n_tok++) {
        for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++) {
            const int s = starts[si];
            if (s + n_tok > POOL) continue;
            for (size_t ri = 0; ri < sizeof slices / sizeof slices[0]; ri++) {
                const int r0 = slices[ri][0], r1 = slices[ri][1];
                for (int i = 0; i < MAXTOK * ROWS; i++) g_y[i] = -7.0f;
                cm_matmul_rows(k, &W, g_x + (size_t)s * xs, xs, n_tok, g_y, ROWS, r0, r1);
                for (int j = 0; j < n_tok; j++)
                    for (int r = 0; r < ROWS; r++) {
                        const float *got = &g_y[j * ROWS + r];
                        cases++;
                        if (r < r0 || r >= r1) {
                            if (*got != -7.0f) bad++; /* wrote outside its slice */
                            continue;
                        }
                        if (memcmp(got, &g_ref[s + j][r], sizeof(float)) == 0) continue;
                        if (!bad++)
                            snprintf(first, sizeof first,
                                     "n_tok %d, token %d of the batch, row %d: gemm %.9g vec_dot %.9g", n_tok, j, r,
                                     (double)*got, (double)g_ref[s + j][r]);
                    }
            }
        }
    }
    CHECKF(bad == 0, "%s %s: %ld of %ld (row, token) results differ from vec_dot; first: %s", k->name, tr->name, bad,
           cases, first);
}

static void test_gemm_equals_vec_dot(void) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        tables++;
        printf("# table %s\n", k->name);
        for (int ti = 0; ti < N_TYPES; ti++) check_table(k, k_types[ti]);
    }
    CHECK(tables >= 1); /* scalar always exists */
}

/* Rows long enough that a gemm packing activations into a bounded buffer
 * (kernels_avx512.c's avx512_gemm.h) needs several passes over the tokens:
 * every pass boundary must still give vec_dot's bits. */
enum { LROWS = 7, LTOK = 19, LK = 10336 }; /* 323 blocks of 32: 40 groups of 8 plus 3 */
/* 203 blocks: the q4_0 tokens-in-lanes gemm packs one group of 16 tokens per
 * pass here (16 + 3 tokens: two passes), while LK is past its limit (tiles). */
enum { LK2 = 6496 };
/* F16 rows of 511 steps of 16 plus 3 and 67 tokens: the avx2 table's panel
 * gemm (avx2_gemv.h, FP_*) takes them in two passes of tokens (36 + 31, a
 * lone token in the last group), an odd row padded, 8 segments a chain (the
 * last one short). */
enum { FPK = 8179, FPTOK = 67 };
static uint8_t g_lw[LROWS * LK * 4], g_lx[FPTOK * FPK * 2 > LTOK *LK * 4 ? FPTOK *FPK * 2 : LTOK *LK * 4];
/* K-quants: 40 super-blocks and 64 (the longest rows gemm_kq*_avx512.c
 * take: 16 + 3 tokens, two passes). */
enum { LKQ = 64 * 256 };
/* 513 blocks: one past the rows q8lane_avx512.c's packed gemm and gemv take
 * (they fall back to vec_dot per row and token). */
enum { LK3 = 513 * 32 }; /* also the longest float row below: > LKQ */
/* K-quants at a model's shape too: 22 super-blocks (ffn_down of a 2048 / 5632
 * model) and 53 tokens, so gemm_kq_avx512.c's passes end unevenly and q5_k's
 * token pairs end with a lone token. */
enum { KQ_NB = 22, KQ_TOK = 53 };
static float g_lf[LK3], g_ly[FPTOK * LROWS];

static void check_long(const cm_kernels *k, enum cm_type t, int64_t n, int ntok) {
    const cm_type_traits *tr = cm_type_traits_of(t);
    const enum cm_type vt = tr->vec_dot_type;
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(vt, n);
    for (int r = 0; r < LROWS; r++) {
        for (int64_t i = 0; i < n; i++) g_lf[i] = frand() * (float)(1 << (rnd() % 8));
        CHECK(make_rows(t, g_lf, g_lw + (size_t)r * ws, 1, n) == ws);
    }
    CHECK((size_t)ntok * xs <= sizeof g_lx && ntok <= FPTOK);
    for (int j = 0; j < ntok; j++) {
        for (int64_t i = 0; i < n; i++) g_lf[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[vt](g_lf, g_lx + (size_t)j * xs, n);
    }
    cm_tensor W;
    memset(&W, 0, sizeof W);
    W.type = t;
    W.ne[0] = n;
    W.ne[1] = LROWS;
    W.nb[1] = ws;
    W.data = g_lw;
    cm_matmul_rows(k, &W, g_lx, xs, ntok, g_ly, LROWS, 0, LROWS);
    long bad = 0;
    for (int j = 0; j < ntok; j++)
        for (int r = 0; r < LROWS; r++) {
            float ref;
            k->vec_dot[t](n, &ref, g_lw + (size_t)r * ws, g_lx + (size_t)j * xs);
            bad += memcmp(&ref, &g_ly[j * LROWS + r], sizeof ref) != 0;
        }
    CHECKF(bad == 0, "%s %s, rows of %lld: %ld of %d (row, token) results differ from vec_dot", k->name, tr->name,
           (long long)n, bad, ntok * LROWS);
    long bad1 = 0; /* one token: the decode gemv */
    for (int j = 0; j < 3; j++) {
        cm_matmul_rows(k, &W, g_lx + (size_t)j * xs, xs, 1, g_ly, LROWS, 0, LROWS);
        for (int r = 0; r < LROWS; r++) {
            float ref;
            k->vec_dot[t](n, &ref, g_lw + (size_t)r * ws, g_lx + (size_t)j * xs);
            bad1 += memcmp(&ref, &g_ly[r], sizeof ref) != 0;
        }
    }
    CHECKF(bad1 == 0, "%s %s, rows of %lld, one token: %ld of %d rows differ from vec_dot", k->name, tr->name,
           (long long)n, bad1, 3 * LROWS);
}

static void test_long_rows(void) {
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        for (int ti = 0; ti < N_TYPES; ti++) {
            check_long(k, k_types[ti], is_k(k_types[ti]) ? 40 * 256 : LK, LTOK);
            check_long(k, k_types[ti], is_k(k_types[ti]) ? LKQ : LK2, LTOK);
            if (k_types[ti] == CM_TYPE_Q8_0) check_long(k, k_types[ti], LK3, LTOK);
            /* F16: rows past the avx2 table's f32-token gemm (avx2_gemv.h,
             * FA_MAXK: its fallback), and rows of several 1024-element spans
             * plus a tail of 5, with an odd token count */
            if (k_types[ti] == CM_TYPE_F16) {
                check_long(k, k_types[ti], LK3, LTOK);
                check_long(k, k_types[ti], 2053, 7);
                /* the avx2 gemv's rows: a lone step of 16 before the tail, with
                 * the token in f32 (2069) and in fp16 (5653: past FA_F32K) */
                check_long(k, k_types[ti], 2069, 7);
                check_long(k, k_types[ti], 5653, 7);
                check_long(k, k_types[ti], 16384, LTOK); /* avx512_prefill.h: two passes of whole tiles */
                check_long(k, k_types[ti], FPK, FPTOK);
            }
            if (k_types[ti] == CM_TYPE_BF16) check_long(k, k_types[ti], 2048, LTOK); /* no scalar tail */
            if (is_k(k_types[ti])) check_long(k, k_types[ti], KQ_NB * 256, KQ_TOK);
        }
    }
}

int main(void) {
    RUN(test_gemm_equals_vec_dot);
    RUN(test_long_rows);
    TEST_END();
}
