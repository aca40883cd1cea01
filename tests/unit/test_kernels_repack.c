/*
 * test_kernels_repack.c: weights repacked at load (repack.c) change no bit.
 * For every kernel table this CPU runs that has a gemv over repacked weights,
 * and rows with whole 16-block groups plus a tail, with no tail, and one
 * group only: after cm_repack_add, cm_matmul_rows with one token (the whole
 * tensor and row views) must equal vec_dot on the file's bytes bit for bit
 * (memcmp), the copy must really be used (found by address; a column view
 * must not find it), the layout must hold the same bytes as the file, and
 * cm_repack_drop must forget it. A table without such a gemv repacks nothing.
 * The batched-decode gemm over the same copy (gemm_packed, 2..gemm_packed_max
 * tokens, and a few more where the file's gemm takes over) must give every
 * (row, token) vec_dot's bits too, for every row slice. The same for q4_k's
 * and q5_k's layouts (one token). A column view added on its own (tensor
 * parallelism's slices of wo and ffn_down) is found with its own row stride
 * and gives vec_dot's bits on the file's columns, for one and several tokens.
 * F16's "f16 pairs" (the avx2 table): the layout element by element, odd
 * row counts, slices and row views starting mid-pair, decode and 1..67
 * tokens. Giving a loaded file's pages back under a copy (cm_repack_give_back) keeps
 * the bytes at the tensor's address and every matmul's bits. A call big enough
 * to repack on several threads makes each row's copy as cm_repack_row_for does.
 */
#include "kernels/kernels.h"
#include "os/os.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "test_rng.h"

enum { ROWS = 37, POOL = 5 };
static const char *const k_isas[] = {"scalar", "avx2", "avx512", "neon"};

/* What each check starts from: ROWS rows of n random weights quantized to
 * t (w: the file's bytes, ws per row; f: their ROWS x n floats, scratch
 * the check may reuse), the tensor W over them, added to k's repacked
 * copies (owner). */
typedef struct weights {
    float *f;
    uint8_t *w;
    size_t ws;
    cm_tensor W;
    int owner;
} weights;

static void weights_make(weights *m, const cm_kernels *k, enum cm_type t, int64_t n) {
    m->ws = cm_row_size(t, n);
    m->f = malloc(sizeof(float) * (size_t)(ROWS * n));
    m->w = malloc(m->ws * ROWS);
    for (int64_t i = 0; i < ROWS * n; i++) m->f[i] = frand() * (float)(1 << (rnd() % 8));
    CHECK(cm_quantize_rows(t, m->f, m->w, ROWS, n) == ROWS * m->ws);
    const int64_t ne[2] = {n, ROWS};
    cm_tensor_init(&m->W, t, 2, ne, m->w, "w");
    const cm_tensor *wp[] = {&m->W};
    char err[200] = "";
    CHECKF(cm_repack_add(&m->owner, k, wp, 1, err, sizeof err) == 0, "%s", err);
}

/* Drops the copy (it is found no more) and frees the weights. */
static void weights_free(weights *m) {
    cm_repack_drop(&m->owner);
    CHECK(cm_repack_find(&m->W, NULL) == NULL);
    free(m->f), free(m->w);
}

/* cv: a column view of a file's rows. Added on its own, it is found with
 * the row size of its width as stride, and matmuls over it (1 and 2..6
 * tokens) give vec_dot's bits on its columns of the file's bytes. */
static void check_cols(const cm_kernels *k, const cm_tensor *cv) {
    const enum cm_type t = cv->type, vt = cm_type_traits_of(t)->vec_dot_type;
    const int64_t n = cv->ne[0], rows = cv->ne[1];
    const int64_t min = t == CM_TYPE_Q4_0   ? 16 * CM_QK4_0
                        : t == CM_TYPE_Q8_0 ? 8 * CM_QK8_0
                                            : 4 * CM_QK_K; /* repack.c's narrowest row */
    if (n < min) return;
    enum { NT = 6 };
    const size_t xs = cm_row_size(vt, n);
    uint8_t *x = malloc(xs * NT);
    float *f = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)(rows * NT)),
          *y = malloc(sizeof(float) * (size_t)(rows * NT));
    const cm_tensor *cp[] = {cv};
    char err[200] = "";
    int owner;
    CHECKF(cm_repack_add(&owner, k, cp, 1, err, sizeof err) == 0, "%s", err);
    size_t cs = 0;
    CHECK(cm_repack_find(cv, &cs) != NULL && cs == cm_row_size(t, n));
    for (int j = 0; j < NT; j++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[vt](f, x + (size_t)j * xs, n);
        for (int64_t r = 0; r < rows; r++)
            k->vec_dot[t](n, &ref[j * rows + r], (const uint8_t *)cv->data + (size_t)r * cv->nb[1], x + (size_t)j * xs);
    }
    long bad = 0;
    for (int nt = 1; nt <= NT; nt++) {
        memset(y, 0xff, sizeof(float) * (size_t)(rows * NT));
        cm_matmul_rows(k, cv, x, xs, nt, y, rows, 0, rows);
        for (int j = 0; j < nt; j++) bad += memcmp(y + j * rows, ref + j * rows, sizeof(float) * (size_t)rows) != 0;
    }
    if (bad)
        fprintf(stderr, "  %s %s column view n=%lld: %ld mismatching tokens\n", k->name, cm_type_name(t), (long long)n,
                bad);
    CHECK(bad == 0);
    cm_repack_drop(&owner);
    CHECK(cm_repack_find(cv, NULL) == NULL);
    free(x), free(f), free(ref), free(y);
}

static void check(const cm_kernels *k, enum cm_type t, int64_t n) {
    const enum cm_type vt = cm_type_traits_of(t)->vec_dot_type;
    weights m;
    weights_make(&m, k, t, n);
    const cm_tensor W = m.W;
    float *f = m.f;
    uint8_t *w = m.w;
    const size_t ws = m.ws, xs = cm_row_size(vt, n);
    uint8_t *x = malloc(xs * POOL), *lay = malloc(ws);
    float ref[ROWS], y[ROWS];
    const void *copy = cm_repack_find(&W, NULL);
    if (!k->gemv_packed[t]) {
        CHECK(copy == NULL);
        goto done;
    }
    CHECK(copy != NULL);
    if (!copy) goto done;
    cm_repack_row_for(k, t, w + ws, lay, n); /* the copy is the table's layout of the file's rows */
    CHECK(memcmp((const uint8_t *)copy + ws, lay, ws) == 0);
    const int64_t blk = cm_type_traits_of(t)->block_size;
    cm_tensor cv = W; /* a column view reads the file's bytes */
    cv.data = w + cm_row_size(t, blk);
    cv.ne[0] = n - blk;
    CHECK(cm_repack_find(&cv, NULL) == NULL);
    check_cols(k, &cv);
    long bad = 0;
    for (int p = 0; p < POOL; p++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
        uint8_t *xp = x + (size_t)p * xs;
        k->from_float[vt](f, xp, n);
        for (int r = 0; r < ROWS; r++) k->vec_dot[t](n, &ref[r], w + (size_t)r * ws, xp);
        static const int slices[][2] = {{0, ROWS}, {5, 22}, {36, 37}};
        for (int s = 0; s < 3; s++) {
            const int r0 = slices[s][0], r1 = slices[s][1];
            memset(y, 0xff, sizeof y);
            cm_matmul_rows(k, &W, xp, xs, 1, y, ROWS, r0, r1);
            bad += memcmp(y + r0, ref + r0, sizeof(float) * (size_t)(r1 - r0)) != 0;
            /* a row view, as the forward pass makes for pipeline/TP row slices */
            cm_tensor rv = W;
            rv.data = w + (size_t)r0 * ws;
            rv.ne[1] = r1 - r0;
            CHECK(cm_repack_find(&rv, NULL) == (const uint8_t *)copy + (size_t)r0 * ws);
            memset(y, 0xff, sizeof y);
            cm_matmul_rows(k, &rv, xp, xs, 1, y, ROWS, 0, r1 - r0);
            bad += memcmp(y, ref + r0, sizeof(float) * (size_t)(r1 - r0)) != 0;
        }
    }
    if (bad) fprintf(stderr, "  %s %s n=%lld: %ld mismatching slices\n", k->name, cm_type_name(t), (long long)n, bad);
    CHECK(bad == 0);
done:
    weights_free(&m);
    free(x), free(lay);
}

/* gemm_packed: n_tok tokens at once, every (row, token) = vec_dot's bits. */
enum { BPOOL = 67 };
static void check_batch(const cm_kernels *k, enum cm_type t, int64_t n) {
    const enum cm_type vt = cm_type_traits_of(t)->vec_dot_type;
    weights m;
    weights_make(&m, k, t, n);
    const size_t xs = cm_row_size(vt, n);
    uint8_t *x = malloc(xs * BPOOL);
    float *ref = malloc(sizeof(float) * ROWS * BPOOL), *y = malloc(sizeof(float) * ROWS * BPOOL);
    CHECK(cm_repack_find(&m.W, NULL) != NULL);
    for (int p = 0; p < BPOOL; p++) {
        for (int64_t i = 0; i < n; i++) m.f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[vt](m.f, x + (size_t)p * xs, n);
        for (int r = 0; r < ROWS; r++) k->vec_dot[t](n, &ref[p * ROWS + r], m.w + (size_t)r * m.ws, x + (size_t)p * xs);
    }
    long bad = 0;
    char first[200] = "";
    const int top = k->gemm_packed_max + 3 < BPOOL ? k->gemm_packed_max + 3 : BPOOL;
    /* n_tok 1 (only a chunk's remainder reaches the tile so: called directly),
     * then 2..top through the driver; row slices of every width 1..7 at odd
     * starts, so each row-block shape and token-tile remainder of the tile
     * runs, and nothing outside [r0, r1) x [0, n_tok) may be written */
    for (int nt = 1; nt <= top; nt++) {
        static const int slices[][2] = {{0, ROWS}, {5, 22},  {36, 37}, {3, 5},  {30, 33}, {1, 5},
                                        {9, 14},   {31, 37}, {2, 9},   {4, 12}, {0, 33}};
        enum { NS = sizeof slices / sizeof slices[0] };
        for (int s = 0; s < NS; s++) {
            const int r0 = slices[s][0], r1 = slices[s][1], p0 = (nt * 7 + s) % (BPOOL - nt + 1);
            memset(y, 0xff, sizeof(float) * ROWS * BPOOL);
            if (nt == 1)
                k->gemm_packed[t](n, cm_repack_find(&m.W, NULL), m.ws, x + (size_t)p0 * xs, xs, y, ROWS, r0, r1, 1);
            else cm_matmul_rows(k, &m.W, x + (size_t)p0 * xs, xs, nt, y, ROWS, r0, r1);
            for (int j = 0; j < BPOOL; j++)
                for (int r = 0; r < ROWS; r++) {
                    const bool in = j < nt && r >= r0 && r < r1;
                    const uint32_t untouched = 0xffffffffu;
                    if (in ? memcmp(&y[j * ROWS + r], &ref[(p0 + j) * ROWS + r], sizeof(float)) != 0
                           : memcmp(&y[j * ROWS + r], &untouched, sizeof(float)) != 0) {
                        if (!bad++)
                            snprintf(first, sizeof first, "n_tok %d, rows [%d, %d), token %d, row %d: %.9g, %s %.9g",
                                     nt, r0, r1, j, r, (double)y[j * ROWS + r], in ? "vec_dot" : "untouched",
                                     in ? (double)ref[(p0 + j) * ROWS + r] : 0.0);
                    }
                }
        }
    }
    if (bad)
        fprintf(stderr, "  %s %s n=%lld batched: %ld mismatches; first %s\n", k->name, cm_type_name(t), (long long)n,
                bad, first);
    CHECK(bad == 0);
    weights_free(&m);
    free(x), free(ref), free(y);
}

static void test_q4_0_batched(void) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k || !k->gemm_packed[CM_TYPE_Q4_0]) continue;
        tables++;
        CHECK(k->gemv_packed[CM_TYPE_Q4_0] != NULL && k->gemm_packed_max >= 2);
        check_batch(k, CM_TYPE_Q4_0, 512);
        check_batch(k, CM_TYPE_Q4_0, 43 * 32);
        check_batch(k, CM_TYPE_Q4_0, 5632);
        check_batch(k, CM_TYPE_Q4_0, 2816);  /* a TP member's ffn_down slice: an 8-block tail */
        check_batch(k, CM_TYPE_Q4_0, 16384); /* more tokens than one pack holds: chunks */
    }
    if (!tables) printf("skip: n/a: no kernel table on this CPU has a batched gemm over repacked q4_0\n");
}

/* q4_k, q5_k and q6_k prefill over their lanes (the avx2 table's q4_k and
 * q5_k gemm_packed, the avx512 table's q5_k and q6_k: avx512_kpacked.h):
 * groups only, a 3-block tail, five groups and a 2-block tail. */
static void test_k_batched(void) {
    static const enum cm_type types[] = {CM_TYPE_Q4_K, CM_TYPE_Q5_K, CM_TYPE_Q6_K};
    int tables = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
            const cm_kernels *k = cm_kernels_for(k_isas[i]);
            if (!k || !k->gemm_packed[types[ti]]) continue;
            tables++;
            check_batch(k, types[ti], 1024);
            check_batch(k, types[ti], 7 * 256);
            check_batch(k, types[ti], 5632);
        }
    if (!tables) printf("skip: n/a: no kernel table on this CPU has a batched gemm over repacked k-quants\n");
}

/* "f16 pairs" (repack.c): element e of row 2q + i at chain (e % 16) / 8's
 * step e / 16, half i, or in row i's tail; an odd last row paired with
 * zeros. Decode over the copy (cm_matmul_rows, one token): vec_dot's bits
 * for slices starting and ending mid-pair; a row view from an even row
 * finds the copy at its row, one from an odd row finds none (the file's
 * bytes), both give vec_dot's bits. */
static void check_f16(const cm_kernels *k, int64_t n) {
    const enum cm_type t = CM_TYPE_F16;
    const int64_t kf = n & ~(int64_t)15, kt = n - kf;
    weights m;
    weights_make(&m, k, t, n);
    const cm_tensor W = m.W;
    float *f = m.f;
    uint8_t *w = m.w;
    const size_t ws = m.ws;
    uint8_t *x = malloc(ws);
    float ref[ROWS], y[2 * ROWS];
    CHECK(cm_repack_size(k, &W) >= (ROWS + 1) * ws);
    const cm_f16 *copy = cm_repack_find(&W, NULL);
    CHECK(copy != NULL);
    if (!copy) goto done;
    long lay = 0; /* every element where the layout says, the padding row zeros */
    for (int64_t r = 0; r < ROWS + 1; r++) {
        const cm_f16 *pair = (const cm_f16 *)(const void *)((const uint8_t *)copy + (size_t)(r & ~1) * ws);
        const int64_t i = r & 1;
        for (int64_t e = 0; e < n; e++) {
            const int64_t pos = e < kf ? (e % 16) / 8 * kf + e / 16 * 16 + 8 * i + e % 8 : 2 * kf + i * kt + e - kf;
            const cm_f16 want = r < ROWS ? ((const cm_f16 *)(const void *)(w + (size_t)r * ws))[e] : 0;
            lay += memcmp(&pair[pos], &want, sizeof want) != 0;
        }
    }
    if (lay) fprintf(stderr, "  %s f16 n=%lld: %ld elements out of place\n", k->name, (long long)n, lay);
    CHECK(lay == 0);
    long bad = 0;
    for (int p = 0; p < POOL; p++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[t](f, x, n);
        for (int r = 0; r < ROWS; r++) k->vec_dot[t](n, &ref[r], w + (size_t)r * ws, x);
        static const int slices[][2] = {{0, ROWS}, {5, 22}, {36, 37}, {3, 4}, {1, 36}, {0, 1}, {4, 21}};
        for (int s = 0; s < 7; s++) {
            const int r0 = slices[s][0], r1 = slices[s][1];
            memset(y, 0xff, sizeof y);
            cm_matmul_rows(k, &W, x, ws, 1, y, ROWS, r0, r1);
            for (int r = 0; r < ROWS; r++) {
                const uint32_t untouched = 0xffffffffu;
                bad += r >= r0 && r < r1 ? memcmp(&y[r], &ref[r], sizeof(float)) != 0
                                         : memcmp(&y[r], &untouched, sizeof(float)) != 0;
            }
            cm_tensor rv = W; /* a row view: found at its row from an even row only */
            rv.data = w + (size_t)r0 * ws;
            rv.ne[1] = r1 - r0;
            CHECK(cm_repack_find(&rv, NULL) == (r0 % 2 ? NULL : (const uint8_t *)copy + (size_t)r0 * ws));
            memset(y, 0xff, sizeof y);
            cm_matmul_rows(k, &rv, x, ws, 1, y, ROWS, 0, r1 - r0);
            bad += memcmp(y, ref + r0, sizeof(float) * (size_t)(r1 - r0)) != 0;
            cm_matmul_rows(k, &rv, x, 0, 2, y, ROWS, 0, r1 - r0); /* 2 tokens, both x (x_stride 0) */
            bad += memcmp(y, ref + r0, sizeof(float) * (size_t)(r1 - r0)) != 0;
            bad += memcmp(y + ROWS, ref + r0, sizeof(float) * (size_t)(r1 - r0)) != 0;
        }
    }
    if (bad) fprintf(stderr, "  %s f16 n=%lld: %ld mismatching rows\n", k->name, (long long)n, bad);
    CHECK(bad == 0);
done:
    weights_free(&m);
    free(x);
}

/* The avx2 table's f16 gemv and gemm over "f16 pairs": one step, tails of
 * 5 and 3 (the token in fp16 past gemv_af16's f32 width), the 1B models'
 * widths; batches 1..67 (a pass's last group short) over row slices. */
static void test_f16_pairs(void) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        if (!k->gemv_packed[CM_TYPE_F16]) continue;
        tables++;
        CHECK(k->gemm_packed[CM_TYPE_F16] != NULL);
        static const int64_t ns[] = {16, 117, 2048, 5632, 8179};
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) check_f16(k, ns[j]);
        check_batch(k, CM_TYPE_F16, 117);
        check_batch(k, CM_TYPE_F16, 2048);
        check_batch(k, CM_TYPE_F16, 8179);
    }
    if (!tables) printf("skip: n/a: no kernel table on this CPU repacks f16\n");
}

static void test_q4_0_lanes(void) {
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        check(k, CM_TYPE_Q4_0, 512);     /* one group */
        check(k, CM_TYPE_Q4_0, 2048);    /* four groups, no tail */
        check(k, CM_TYPE_Q4_0, 43 * 32); /* two groups and an 11-block tail */
        check(k, CM_TYPE_Q4_0, 5632);    /* ffn_down of the 1B bench models */
        check(k, CM_TYPE_Q4_0, 2816);    /* its half, a TP member's slice: five groups and an 8-block tail */
    }
}

/* "q4_k lanes", "q5_k lanes": groups of 4 super-blocks and a tail of 0..3 ("q6_k lanes": no groups) */
static void check_k(enum cm_type t) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        tables += k->gemv_packed[t] != NULL;
        check(k, t, 1024);       /* one group */
        check(k, t, 2048);       /* two groups, no tail (the 1B models' width) */
        check(k, t, 7 * 256);    /* one group and a 3-block tail */
        check(k, t, 5632);       /* five groups and a 2-block tail (ffn_down of the 1B models) */
        if (t == CM_TYPE_Q5_K) { /* q5_k's gemvs step 16 super-blocks: a full step, then two and a 1-block tail */
            check(k, t, 16 * 256);
            check(k, t, 33 * 256);
        }
    }
    if (!tables) printf("skip: n/a: no kernel table on this CPU has a gemv over repacked %s\n", cm_type_name(t));
}
static void test_q4_k_lanes(void) { check_k(CM_TYPE_Q4_K); }
static void test_q5_k_lanes(void) { check_k(CM_TYPE_Q5_K); }
static void test_q6_k_lanes(void) {
    check_k(CM_TYPE_Q6_K);
    /* the avx512 decode gemv (gemv_kd_avx512.c) sums 16 super-blocks per float step:
     * one full step, and two full steps and a 1-block tail */
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        check(k, CM_TYPE_Q6_K, 16 * 256);
        check(k, CM_TYPE_Q6_K, 33 * 256);
    }
}

/* "q8_0 lanes" (the avx2 table's): groups of 8 blocks and a tail of 0..7,
 * up to CM_REPACK_MAX_K_Q8_0 elements (a longer row is not repacked);
 * decode and batches over the copy. */
static void test_q8_0_lanes(void) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        check(k, CM_TYPE_Q8_0, 256);     /* one group (or, without the layout: nothing repacked) */
        check(k, CM_TYPE_Q8_0, 2048);    /* eight groups, no tail */
        check(k, CM_TYPE_Q8_0, 43 * 32); /* five groups and a 3-block tail */
        check(k, CM_TYPE_Q8_0, 2816);    /* a TP member's ffn_down slice of the 1B models */
        check(k, CM_TYPE_Q8_0, 5632);
        check(k, CM_TYPE_Q8_0, CM_REPACK_MAX_K_Q8_0);
        if (!k->gemv_packed[CM_TYPE_Q8_0]) continue;
        tables++;
        CHECK(k->gemm_packed[CM_TYPE_Q8_0] != NULL);
        uint8_t dummy;
        cm_tensor W;
        const int64_t ne[2] = {CM_REPACK_MAX_K_Q8_0 + 32, 3}, ne_short[2] = {7 * 32, 3};
        cm_tensor_init(&W, CM_TYPE_Q8_0, 2, ne, &dummy, "w");
        CHECK(cm_repack_size(k, &W) == 0);
        cm_tensor_init(&W, CM_TYPE_Q8_0, 2, ne_short, &dummy, "w");
        CHECK(cm_repack_size(k, &W) == 0);
        check_batch(k, CM_TYPE_Q8_0, 256);
        check_batch(k, CM_TYPE_Q8_0, 43 * 32);
        check_batch(k, CM_TYPE_Q8_0, 5632);
        check_batch(k, CM_TYPE_Q8_0, CM_REPACK_MAX_K_Q8_0);
    }
    if (!tables) printf("skip: n/a: no kernel table on this CPU has a gemv over repacked q8_0\n");
}

/* One copy resident: a tensor in a file read into memory (cm_file_load),
 * repacked, its file pages given back where the table's gemm reads the
 * layout too (gemm_packed): the bytes at its address stay the file's, the
 * copy is then found for every n_tok (cm_repack_find_alone) and matmuls of
 * 1..gemm_packed_max and more tokens still give vec_dot's bits on the
 * file's bytes. Where the table has no gemm_packed nothing is given back.
 * A tensor outside a loaded file (malloc'd) gives nothing back. */
static void check_give_back(const cm_kernels *k, enum cm_type t, int64_t n) {
    enum { GROWS = 300, GPOOL = 80, OFF = 1000 }; /* 300 rows span many pages; an odd start */
    const enum cm_type vt = cm_type_traits_of(t)->vec_dot_type;
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(vt, n);
    float *f = malloc(sizeof(float) * (size_t)(GROWS * n));
    uint8_t *w = calloc(1, OFF + ws * GROWS + 77), *x = malloc(xs * GPOOL);
    float *ref = malloc(sizeof(float) * GROWS * GPOOL), *y = malloc(sizeof(float) * GROWS * GPOOL);
    for (int64_t i = 0; i < GROWS * n; i++) f[i] = frand() * (float)(1 << (rnd() % 8));
    CHECK(cm_quantize_rows(t, f, w + OFF, GROWS, n) == GROWS * ws);
    char path[] = "/tmp/cumulo-test-giveback-XXXXXX", err[200] = "";
    const int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, w, OFF + ws * GROWS + 77) == (ssize_t)(OFF + ws * GROWS + 77));
    close(fd);
    cm_mapped_file mf;
    CHECKF(cm_file_load(&mf, path, NULL, NULL, err, sizeof err) == 0, "%s", err);
    unlink(path);
    cm_tensor W, M;
    const int64_t ne[2] = {n, GROWS};
    cm_tensor_init(&W, t, 2, ne, (void *)(mf.data + OFF), "w");
    cm_tensor_init(&M, t, 2, ne, w + OFF, "m");
    const cm_tensor *wp[] = {&W}, *mp[] = {&M};
    int owner, owner2;
    CHECKF(cm_repack_add(&owner, k, wp, 1, err, sizeof err) == 0, "%s", err);
    CHECKF(cm_repack_add(&owner2, k, mp, 1, err, sizeof err) == 0, "%s", err);
    CHECK(cm_repack_give_back(&owner2, k, &mf) == 0); /* not the file's bytes */
    CHECK(cm_repack_find_alone(&M, NULL) == NULL);
    cm_repack_drop(&owner2);
    const size_t given = cm_repack_give_back(&owner, k, &mf);
    const bool both = k->gemm_packed[t] != NULL;
    CHECKF(both ? given > 0 && given <= ws * GROWS : given == 0, "%s %s: %zu bytes given back", k->name,
           cm_type_name(t), given);
    CHECK((cm_repack_find_alone(&W, NULL) != NULL) == both);
    CHECK(memcmp(mf.data, w, OFF + ws * GROWS + 77) == 0); /* the same bytes at the same address */
    for (int p = 0; p < GPOOL; p++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
        k->from_float[vt](f, x + (size_t)p * xs, n);
        for (int r = 0; r < GROWS; r++)
            k->vec_dot[t](n, &ref[p * GROWS + r], w + OFF + (size_t)r * ws, x + (size_t)p * xs);
    }
    static const int nts[] = {1, 2, 7, 32, 33, 64, GPOOL};
    static const int slices[][2] = {{0, GROWS}, {17, 150}, {150, GROWS}, {3, 4}};
    long bad = 0;
    for (size_t a = 0; a < sizeof nts / sizeof nts[0]; a++)
        for (size_t s = 0; s < sizeof slices / sizeof slices[0]; s++) {
            const int nt = nts[a], r0 = slices[s][0], r1 = slices[s][1];
            memset(y, 0xff, sizeof(float) * GROWS * GPOOL);
            cm_matmul_rows(k, &W, x, xs, nt, y, GROWS, r0, r1);
            for (int j = 0; j < nt; j++)
                for (int r = r0; r < r1; r++)
                    if (memcmp(&y[j * GROWS + r], &ref[j * GROWS + r], sizeof(float)) != 0 && !bad++)
                        fprintf(stderr, "  %s %s n=%lld given back: n_tok %d row %d token %d: %.9g, vec_dot %.9g\n",
                                k->name, cm_type_name(t), (long long)n, nt, r, j, (double)y[j * GROWS + r],
                                (double)ref[j * GROWS + r]);
        }
    CHECK(bad == 0);
    cm_repack_drop(&owner);
    CHECK(cm_repack_find(&W, NULL) == NULL && memcmp(mf.data, w, OFF + ws * GROWS + 77) == 0);
    cm_file_unmap(&mf);
    free(f), free(w), free(x), free(ref), free(y);
}

static void test_give_back(void) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        if (k->gemv_packed[CM_TYPE_Q4_0]) {
            tables++;
            check_give_back(k, CM_TYPE_Q4_0, 2048);
            check_give_back(k, CM_TYPE_Q4_0, 5632);
        }
        if (k->gemv_packed[CM_TYPE_Q4_K]) check_give_back(k, CM_TYPE_Q4_K, 2048);
        if (k->gemv_packed[CM_TYPE_Q5_K]) {
            check_give_back(k, CM_TYPE_Q5_K, 2048);
            check_give_back(k, CM_TYPE_Q5_K, 5632);
            check_give_back(k, CM_TYPE_Q5_K, 17408); /* past the avx512 gemms' 64 super-blocks */
        }
        if (k->gemv_packed[CM_TYPE_Q6_K]) {
            check_give_back(k, CM_TYPE_Q6_K, 2048);
            check_give_back(k, CM_TYPE_Q6_K, 5632);  /* several of avx512_kpacked.h's chunks */
            check_give_back(k, CM_TYPE_Q6_K, 17408); /* past the avx512 gemms' 64 super-blocks */
        } else if (k->gemm[CM_TYPE_Q6_K]) {
            check_give_back(k, CM_TYPE_Q6_K, 2048); /* a gemm on the file's bytes: several blocks of rows */
        }
        if (k->gemv_packed[CM_TYPE_F16]) {
            check_give_back(k, CM_TYPE_F16, 2048);
            check_give_back(k, CM_TYPE_F16, 1005); /* a 13-element tail */
        }
        if (k->gemv_packed[CM_TYPE_Q8_0]) { /* "q8_0 lanes": groups only, and a 3-block tail */
            check_give_back(k, CM_TYPE_Q8_0, 2048);
            check_give_back(k, CM_TYPE_Q8_0, 43 * 32);
        } else if (k->gemm[CM_TYPE_Q8_0]) check_give_back(k, CM_TYPE_Q8_0, 2048); /* same */
    }
    if (!tables) printf("skip: n/a: no kernel table on this CPU repacks q4_0 (nothing to give back)\n");
}

/* One cm_repack_add call big enough to fill its copies on several threads
 * (repack.c: from 4 MiB on), mixing every type the table repacks with one
 * it does not: each copy must hold, row by row (f16: pair by pair), what
 * cm_repack_row_for (cm_repack_f16_pair) makes of the file's bytes alone,
 * and a tensor of a type no table repacks (between others) has no copy.
 * Random bytes: only where they go is checked. */
static void check_threaded(const cm_kernels *k) {
    static const struct {
        enum cm_type t;
        int64_t n, rows;
    } sh[] = {/* q5_0: no table repacks it; q8_0 with a 1-block tail; sizes past 4 MiB for either x86 table */
              {CM_TYPE_Q4_K, 4096, 701}, {CM_TYPE_Q8_0, 2080, 33},  {CM_TYPE_Q5_0, 2048, 64}, {CM_TYPE_F16, 2048, 1001},
              {CM_TYPE_Q5_K, 2048, 333}, {CM_TYPE_Q6_K, 5632, 600}, {CM_TYPE_Q4_0, 5632, 600}};
    enum { NS = sizeof sh / sizeof sh[0] };
    cm_tensor W[NS];
    const cm_tensor *wp[NS];
    uint8_t *buf[NS];
    size_t total = 0;
    for (int i = 0; i < NS; i++) {
        const size_t bytes = cm_row_size(sh[i].t, sh[i].n) * (size_t)sh[i].rows;
        buf[i] = malloc(bytes);
        for (size_t b = 0; b < bytes; b++) buf[i][b] = (uint8_t)rnd();
        const int64_t ne[2] = {sh[i].n, sh[i].rows};
        cm_tensor_init(&W[i], sh[i].t, 2, ne, buf[i], "w");
        wp[i] = &W[i];
        total += cm_repack_size(k, &W[i]);
    }
    if (total < ((size_t)4 << 20)) {
        for (int i = 0; i < NS; i++) free(buf[i]);
        return; /* repacks too few of these types to take threads (scalar, neon) */
    }
    if (cm_cpu_count() < 2) printf("skip: n/a: one CPU: the repack ran on one thread (%s)\n", k->name);
    int owner;
    char err[200] = "";
    CHECKF(cm_repack_add(&owner, k, wp, NS, err, sizeof err) == 0, "%s", err);
    long bad = 0, seen = 0;
    for (int i = 0; i < NS; i++) {
        size_t cs = 0;
        const uint8_t *copy = cm_repack_find(&W[i], &cs);
        if (!k->gemv_packed[sh[i].t]) {
            CHECK(copy == NULL);
            continue;
        }
        if (!copy) continue; /* a width this table does not repack */
        seen++;
        const size_t rs = cm_row_size(sh[i].t, sh[i].n);
        CHECK(cs == rs);
        uint8_t *ref = malloc(2 * rs);
        const bool pairs = sh[i].t == CM_TYPE_F16;
        for (int64_t r = 0; r < sh[i].rows; r += pairs ? 2 : 1) {
            const uint8_t *src = buf[i] + (size_t)r * rs;
            const bool two = pairs && r + 1 < sh[i].rows;
            if (pairs) cm_repack_f16_pair(src, two ? src + rs : NULL, ref, sh[i].n);
            else cm_repack_row_for(k, sh[i].t, src, ref, sh[i].n);
            bad += memcmp(copy + (size_t)r * rs, ref, pairs ? 2 * rs : rs) != 0;
        }
        free(ref);
    }
    if (bad) fprintf(stderr, "  %s: %ld rows of a threaded repack differ from cm_repack_row_for\n", k->name, bad);
    CHECK(bad == 0 && seen >= 3);
    cm_repack_drop(&owner);
    for (int i = 0; i < NS; i++) free(buf[i]);
}

static void test_threaded(void) {
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (k) check_threaded(k);
    }
}

int main(void) {
    int tables = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        tables += k && k->gemv_packed[CM_TYPE_Q4_0] != NULL;
    }
    if (!tables) /* still run it: the tables without must repack nothing */
        printf(
            "skip: n/a: no kernel table on this CPU has a gemv over repacked q4_0 (only that nothing is repacked is checked)\n");
    RUN(test_q4_0_lanes);
    RUN(test_q4_0_batched);
    RUN(test_q4_k_lanes);
    RUN(test_q5_k_lanes);
    RUN(test_q6_k_lanes);
    RUN(test_q8_0_lanes);
    RUN(test_k_batched);
    RUN(test_f16_pairs);
    RUN(test_give_back);
    RUN(test_threaded);
    TEST_END();
}
