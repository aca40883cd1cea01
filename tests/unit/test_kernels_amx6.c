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
#include "test_rng.h"

#include "test_amx.h"

enum { MAXK = 16384, NBMAX = MAXK / 256 };
static cm_block_q6_k g_w[ROWS * NBMAX];
static cm_block_q8_k g_x[MAXTOK * NBMAX];

static void fill(const cm_kernels *k, enum cm_type t, int64_t n) {
    const size_t nb = (size_t)(n / 256);
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

static const int64_t k_lens[] = {256, 3 * 256, 15 * 256, 16 * 256, 17 * 256, 31 * 256, 33 * 256, 2048, 8192, MAXK};

static const enum cm_type k_types[] = {CM_TYPE_Q6_K};
static void test_amx6_bits(void) { amx_bits(k_types, 1, k_lens, CM_ARRAY_LEN(k_lens), 4096, fill); }

/* The table's own gemm (AMX from its minimum token count when CUMULO_AMX is
 * not 0, the VNNI gemm below) through cm_matmul_rows. */
static void test_table_bits(void) {
    static const int64_t lens[] = {3 * 256, 2048, 8192, MAXK};
    static const int toks[] = {2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 31, 33, 64, 129};
    amx_table_bits(k_types, 1, lens, CM_ARRAY_LEN(lens), toks, CM_ARRAY_LEN(toks), fill);
}

/* Over "q6_k lanes" rows (the table's gemm_packed) through cm_matmul_rows,
 * each batch on its path. */
static void test_packed_bits(void) {
    static const int64_t lens[] = {3 * 256, 2048, 8192};
    amx_packed_bits(CM_TYPE_Q6_K, lens, CM_ARRAY_LEN(lens), fill);
}

/* Small batches go to AMX where it wins (HISTORY.md session 21; 12 before). */
static void test_small_starts(void) {
    static const amx_start st[] = {{CM_TYPE_Q6_K, false, 768, 7},  {CM_TYPE_Q6_K, false, 2048, 10},
                                   {CM_TYPE_Q6_K, false, 8192, 6}, {CM_TYPE_Q6_K, true, 768, 9},
                                   {CM_TYPE_Q6_K, true, 2048, 11}, {CM_TYPE_Q6_K, true, 8192, 7}};
    amx_starts(st, CM_ARRAY_LEN(st));
}

/* Two threads at once on different slices of one product. */
static void test_amx6_threads(void) { amx_threads_test(CM_TYPE_Q6_K, fill); }

int main(void) {
    amx_data(g_w, g_x, CM_TYPE_Q8_K);
    RUN(test_amx6_bits);
    RUN(test_table_bits);
    RUN(test_packed_bits);
    RUN(test_small_starts);
    RUN(test_amx6_threads);
    printf("# %ld (row, token) results compared with vec_dot\n", g_compared);
    TEST_END_SKIPPED(g_skipped);
}
