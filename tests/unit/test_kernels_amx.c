/*
 * test_kernels_amx.c: the AMX prefill gemms (gemm_amx.c) give the avx512
 * table's vec_dot bits for every (row, token), so logits are the same with
 * CUMULO_AMX=0 and 1 and an AMX machine agrees with a Zen 4 one in a
 * cluster (kernels.h batch invariance). memcmp, no tolerance.
 *
 * For q4_0 and q8_0: row lengths 32 (one block), 9, 27, 63 and 65 blocks
 * (every chain length mod 8 and 16), 2048, 5632 and 16384 (the longest the
 * AMX path takes); every n_tok from 1 to 40 and 47, 64, 65, 100, 129
 * (full 16-token groups and a last group of each size); row slices that
 * start and end off the 16-row panels; an output stride wider than the rows
 * (what lies outside the slice must stay untouched). Weights and
 * activations are random bytes with random-sign scales of varied size
 * (q8_0 weight bytes of -128 included, which no quantizer writes but a
 * file may hold; activations stay in -127..127, as from_float makes them).
 * Also through cm_matmul_rows with the avx512 table (the AMX gemm from the
 * token count where it wins, the VNNI one below: each batch checked to take
 * its path), over q4_0 rows repacked at load (the batched gemm, AMX from a
 * few tokens), and two threads at once (tile configuration is per thread).
 * A CPU, OS or build without AMX-INT8 reports a skip.
 */
#include "test_rng.h"

#include "test_amx.h"

enum { MAXK = 16384 };
static uint8_t g_w[ROWS * (MAXK / 32) * 34], g_x[MAXTOK * (MAXK / 32) * 34];

static void fill(const cm_kernels *k, enum cm_type t, int64_t n) {
    const size_t bw = t == CM_TYPE_Q4_0 ? 18 : 34, nbw = (size_t)ROWS * (size_t)(n / 32),
                 nbx = MAXTOK * (size_t)(n / 32);
    for (size_t i = 0; i < nbw * bw; i++) g_w[i] = (uint8_t)rnd();
    for (size_t i = 0; i < nbx * 34; i++) /* activations never hold -128 (the quantizer writes -127..127) */
        do g_x[i] = (uint8_t)rnd();
        while (g_x[i] == 0x80);
    for (size_t b = 0; b < nbw; b++) {
        const cm_f16 d = cm_f32_to_f16(frand() * (float)(1 << (rnd() % 6)) * 0.003f);
        memcpy(g_w + b * bw, &d, 2);
    }
    for (size_t b = 0; b < nbx; b++) {
        const cm_f16 d = cm_f32_to_f16(frand() * (float)(1 << (rnd() % 6)) * 0.01f);
        memcpy(g_x + b * 34, &d, 2);
    }
}

static const enum cm_type k_types[] = {CM_TYPE_Q4_0, CM_TYPE_Q8_0};
static const int64_t k_lens[] = {32, 9 * 32, 27 * 32, 63 * 32, 65 * 32, 2048, 5632, MAXK};

static void test_amx_bits(void) { amx_bits(k_types, CM_ARRAY_LEN(k_types), k_lens, CM_ARRAY_LEN(k_lens), 2048, fill); }

/* The table's own gemm (AMX from ax_mintok's tokens when CUMULO_AMX is not
 * 0, the VNNI one below) through cm_matmul_rows. */
static void test_table_bits(void) {
    static const int64_t lens[] = {5632};
    static const int toks[] = {2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 31, 33, 64, 129};
    amx_table_bits(k_types, CM_ARRAY_LEN(k_types), lens, 1, toks, CM_ARRAY_LEN(toks), fill);
}

/* The batched gemm over q4_0 rows repacked at load ("q4_0 lanes", AMX from
 * a few tokens up to gemm_packed_max), through cm_matmul_rows on the tensor
 * whose copy was made: still vec_dot's bits on the file's bytes, each batch
 * on its path. 768: a MoE expert's down (nb % 16 tail blocks). */
static void test_packed_bits(void) {
    static const int64_t lens[] = {16 * 32, 24 * 32, 27 * 32, 65 * 32, 2048, 5632};
    amx_packed_bits(CM_TYPE_Q4_0, lens, CM_ARRAY_LEN(lens), fill);
}

/* Small batches go to AMX where it wins (HISTORY.md session 21): over the
 * file's layout from 2 (q4_0) and 4 (q8_0) tokens, over "q4_0 lanes" from
 * 2 with tail blocks (a MoE expert's down, k 768) and from 13 otherwise
 * (session 20 had 24, which made moe.c pad its expert batches). */
static void test_small_starts(void) {
    static const amx_start st[] = {{CM_TYPE_Q4_0, false, 2048, 2}, {CM_TYPE_Q8_0, false, 2048, 4},
                                   {CM_TYPE_Q4_0, true, 768, 2},   {CM_TYPE_Q4_0, true, 2816, 3},
                                   {CM_TYPE_Q4_0, true, 2048, 13}, {CM_TYPE_Q4_0, true, 5632, 13}};
    amx_starts(st, CM_ARRAY_LEN(st));
}

/* Two threads at once on different slices of one product. */
static void test_amx_threads(void) { amx_threads_test(CM_TYPE_Q8_0, fill); }

int main(void) {
    amx_data(g_w, g_x, CM_TYPE_Q8_0);
    RUN(test_amx_bits);
    RUN(test_table_bits);
    RUN(test_packed_bits);
    RUN(test_small_starts);
    RUN(test_amx_threads);
    printf("# %ld (row, token) results compared with vec_dot\n", g_compared);
    TEST_END_SKIPPED(g_skipped);
}
