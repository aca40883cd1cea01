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
 * Also through cm_matmul_rows with the avx512 table (the AMX gemm from 16
 * tokens, the VNNI one below), over q4_0 rows repacked at load (the
 * batched gemm, AMX from 24 tokens), and two threads at once (tile configuration
 * is per thread). A CPU, OS or build without AMX-INT8 reports a skip.
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

/* The table's own gemm (AMX from 16 tokens when CUMULO_AMX is not 0, the
 * VNNI one below) through cm_matmul_rows. */
static void test_table_bits(void) {
    static const int64_t lens[] = {5632};
    static const int toks[] = {2, 15, 16, 17, 31, 33, 64, 129};
    amx_table_bits(k_types, CM_ARRAY_LEN(k_types), lens, 1, toks, CM_ARRAY_LEN(toks), fill);
}

/* The batched gemm over q4_0 rows repacked at load ("q4_0 lanes", AMX from
 * 24 tokens up to gemm_packed_max), through cm_matmul_rows on the tensor
 * whose copy was made: still vec_dot's bits on the file's bytes. */
static void test_packed_bits(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    if (!k || !k->gemm_packed[CM_TYPE_Q4_0]) {
        printf("skip: n/a: no avx512 table with a repacked q4_0 gemm on this CPU\n");
        g_skipped++;
        return;
    }
    static const int64_t lens[] = {27 * 32, 65 * 32, 2048, 5632};
    for (size_t li = 0; li < CM_ARRAY_LEN(lens); li++) {
        const int64_t n = lens[li];
        fill(k, CM_TYPE_Q4_0, n);
        reference(k, CM_TYPE_Q4_0, n, MAXTOK);
        cm_tensor W;
        const int64_t ne[2] = {n, ROWS};
        cm_tensor_init(&W, CM_TYPE_Q4_0, 2, ne, g_w, "w");
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
        const size_t xs = cm_row_size(CM_TYPE_Q8_0, n);
        for (int nt = 2; nt <= 40; nt++) {
            static const int sl[][2] = {{0, ROWS}, {5, 21}, {17, 37}};
            for (size_t si = 0; si < CM_ARRAY_LEN(sl); si++) {
                for (int i = 0; i < nt * LDY; i++) g_y[i] = -7.25e30f;
                cm_matmul_rows(k, &W, g_x, xs, nt, g_y, LDY, sl[si][0], sl[si][1]);
                for (int j = 0; j < nt; j++)
                    for (int i = 0; i < LDY; i++) {
                        const bool in = i >= sl[si][0] && i < sl[si][1];
                        g_compared += in;
                        bad += in ? memcmp(&g_y[j * LDY + i], &g_ref[j * ROWS + i], 4) != 0
                                  : g_y[j * LDY + i] != -7.25e30f;
                    }
            }
        }
        CHECKF(bad == 0, "repacked q4_0, rows of %lld: %d results differ from vec_dot", (long long)n, bad);
        cm_repack_drop(&owner);
    }
}

/* Two threads at once on different slices of one product. */
static void test_amx_threads(void) { amx_threads_test(CM_TYPE_Q8_0, fill); }

int main(void) {
    amx_data(g_w, g_x, CM_TYPE_Q8_0);
    RUN(test_amx_bits);
    RUN(test_table_bits);
    RUN(test_packed_bits);
    RUN(test_amx_threads);
    printf("# %ld (row, token) results compared with vec_dot\n", g_compared);
    TEST_END_SKIPPED(g_skipped);
}
