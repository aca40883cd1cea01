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
#include "test_rng.h"

#include "test_amx.h"

enum { MAXNB = 64, MAXK = MAXNB * 256 };
static uint8_t g_w[ROWS * MAXNB * 176], g_x[MAXTOK * MAXNB * 292];
static float g_f[MAXK];

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

static const enum cm_type k_types[] = {CM_TYPE_Q4_K, CM_TYPE_Q5_K};
static const int64_t k_lens[] = {256,      2 * 256,  8 * 256,  9 * 256,  15 * 256,   16 * 256,
                                 17 * 256, 22 * 256, 31 * 256, 33 * 256, MAXNB * 256};

static void test_amxk_bits(void) { amx_bits(k_types, CM_ARRAY_LEN(k_types), k_lens, CM_ARRAY_LEN(k_lens), 4096, fill); }

/* The table's own gemm (AMX from its minimum token count when CUMULO_AMX
 * is not 0) through cm_matmul_rows. */
static void test_table_bits(void) {
    static const int64_t lens[] = {768, 1024, 5632};
    static const int toks[] = {2, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 18, 19, 31, 33, 64, 129};
    amx_table_bits(k_types, CM_ARRAY_LEN(k_types), lens, CM_ARRAY_LEN(lens), toks, CM_ARRAY_LEN(toks), fill);
}

/* Over "q5_k lanes" rows (the table's gemm_packed) through cm_matmul_rows,
 * each batch on its path. */
static void test_packed_bits(void) {
    static const int64_t lens[] = {1024, 2048, 5632};
    amx_packed_bits(CM_TYPE_Q5_K, lens, CM_ARRAY_LEN(lens), fill);
}

/* Small batches go to AMX where it wins (HISTORY.md session 21; q4_k 16,
 * q5_k 19 for every row length before). */
static void test_small_starts(void) {
    static const amx_start st[] = {{CM_TYPE_Q4_K, false, 768, 9},   {CM_TYPE_Q4_K, false, 1024, 11},
                                   {CM_TYPE_Q4_K, false, 2048, 16}, {CM_TYPE_Q5_K, false, 1024, 9},
                                   {CM_TYPE_Q5_K, false, 2048, 18}, {CM_TYPE_Q5_K, true, 1024, 9},
                                   {CM_TYPE_Q5_K, true, 2048, 17}};
    amx_starts(st, CM_ARRAY_LEN(st));
}

/* Two threads at once on different slices of one product. */
static void test_amxk_threads(void) { amx_threads_test(CM_TYPE_Q5_K, fill); }

int main(void) {
    amx_data(g_w, g_x, CM_TYPE_Q8_K);
    RUN(test_amxk_bits);
    RUN(test_table_bits);
    RUN(test_packed_bits);
    RUN(test_small_starts);
    RUN(test_amxk_threads);
    printf("# %ld (row, token) results compared with vec_dot\n", g_compared);
    TEST_END_SKIPPED(g_skipped);
}
