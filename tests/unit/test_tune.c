/*
 * test_tune.c: the kernels' knobs (kernels/tune.h). Every candidate value of
 * every knob gives vec_dot's bits in the kernels that read it (the decode
 * gemvs with one token, over the repacked copy where the knob's kernel reads
 * one; the f16 gemm with enough tokens for several passes at every pass
 * size), on every table this CPU runs; the knob table is sane; the cache
 * file round-trips and every corrupt or foreign variant (and a few thousand
 * random mutations) is refused with CM_EFORMAT, never a crash; the load-time
 * measurement wants nothing for small weights and picks a candidate of each
 * wanted knob for a 72 MiB f16 matrix. The cache dir, CUMULO_TUNE=0/force
 * and bench's report are tests/sh/tune_cli.sh's.
 */
#include "base/base.h"
#include "kernels/tune.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"

static const char *const k_isas[] = {"scalar", "avx2", "avx512", "neon"};

static void test_table(void) {
    for (int i = 0; i < CM_TUNE_COUNT; i++) {
        const cm_tune_knob_info *ki = cm_tune_info(i);
        CHECK(ki != NULL);
        bool def = false;
        for (int j = 0; j < ki->n_cand; j++) def |= ki->cand[j] == ki->def;
        CHECKF(def, "%s: default %d is not a candidate", ki->name, ki->def);
        CHECKF(cm_tune_get((enum cm_tune_knob)i) == ki->def, "%s starts at %d", ki->name,
               cm_tune_get((enum cm_tune_knob)i));
        CHECK(cm_tune_find(ki->name, strlen(ki->name)) == i);
        CHECK(cm_tune_set(i, ki->def + 1) == CM_EINVAL);
        CHECK(cm_tune_set(i, ki->cand[0]) == 0 && cm_tune_get((enum cm_tune_knob)i) == ki->cand[0]);
    }
    CHECK(cm_tune_info(CM_TUNE_COUNT) == NULL && cm_tune_info(-1) == NULL);
    CHECK(cm_tune_set(CM_TUNE_COUNT, 0) == CM_EINVAL);
    CHECK(cm_tune_find("nope", 4) == -1);
    cm_tune_defaults();
    for (int i = 0; i < CM_TUNE_COUNT; i++) CHECK(cm_tune_get((enum cm_tune_knob)i) == cm_tune_info(i)->def);
}

/* W (rows x n of type t) times n_tok tokens under table k through
 * cm_matmul_rows (the repacked copy where packed), every (row, token)
 * against vec_dot bit for bit; returns the mismatches. */
static int run_case(const cm_kernels *k, enum cm_type t, int64_t n, int64_t rows, int64_t n_tok, bool packed) {
    const enum cm_type vt = cm_type_traits_of(t)->vec_dot_type;
    const size_t ws = cm_row_size(t, n), xs = cm_row_size(vt, n);
    float *f = malloc(sizeof(float) * (size_t)(rows > n_tok ? rows : n_tok) * (size_t)n);
    uint8_t *w = malloc(ws * (size_t)rows), *x = malloc(xs * (size_t)n_tok);
    float *y = malloc(sizeof(float) * (size_t)(rows * n_tok));
    for (int64_t i = 0; i < rows * n; i++) f[i] = frand() * (float)(1 << (rnd() % 6));
    CHECK(cm_quantize_rows(t, f, w, rows, n) == (size_t)rows * ws);
    for (int64_t i = 0; i < n_tok * n; i++) f[i] = frand();
    for (int64_t j = 0; j < n_tok; j++) k->from_float[vt](f + j * n, x + (size_t)j * xs, n);
    cm_tensor W;
    const int64_t ne[2] = {n, rows};
    cm_tensor_init(&W, t, 2, ne, w, "w");
    int owner, bad = 0;
    char err[200] = "";
    if (packed) {
        const cm_tensor *wp[] = {&W};
        CHECKF(cm_repack_add(&owner, k, wp, 1, err, sizeof err) == 0, "%s", err);
    }
    cm_matmul_rows(k, &W, x, xs, n_tok, y, rows, 0, rows);
    for (int64_t j = 0; j < n_tok; j++)
        for (int64_t i = 0; i < rows; i++) {
            float r;
            k->vec_dot[t](n, &r, w + (size_t)i * ws, x + (size_t)j * xs);
            bad += memcmp(&r, &y[j * rows + i], sizeof r) != 0;
        }
    if (packed) cm_repack_drop(&owner);
    free(f), free(w), free(x), free(y);
    return bad;
}

static void test_bits_every_value(void) {
    int tables = 0;
    for (size_t a = 0; a < sizeof k_isas / sizeof k_isas[0]; a++) {
        const cm_kernels *k = cm_kernels_for(k_isas[a]);
        if (!k) continue;
        tables++;
        for (int i = 0; i < CM_TUNE_COUNT; i++) {
            const cm_tune_knob_info *ki = cm_tune_info(i);
            for (int c = 0; c < ki->n_cand; c++) {
                CHECK(cm_tune_set(i, ki->cand[c]) == 0);
                for (int ti = 0; ti < ki->n_types; ti++) {
                    const enum cm_type t = ki->types[ti];
                    /* f16: 2048 keeps the decode token in f32, 4096 in fp16 (avx512_gemv.h) */
                    const int64_t lens[] = {2048, 4096};
                    for (int li = 0; li < 2; li++) {
                        const int64_t n = lens[li];
                        /* the gemm: 137 tokens, passes of 32 to 128 at 2048 elements; rows cross FG_R */
                        const int bad = ki->gemm
                                            ? run_case(k, t, n, 13, 137, false)
                                            : run_case(k, t, n, 24, 1, ki->packed) + run_case(k, t, n, 24, 1, false);
                        CHECKF(bad == 0, "%s table, %s = %d, %s, k = %lld: %d products differ from vec_dot", k->name,
                               ki->name, ki->cand[c], cm_type_traits_of(t)->name, (long long)n, bad);
                    }
                }
            }
        }
    }
    cm_tune_defaults();
    CHECK(tables >= 1);
}

static const char *const k_sig = "GenuineIntel 6 167 1; avx2 fma avx512f; l2 2097152; cpus 2";

static int parse_str(const char *s, cm_tune_choice *c) {
    char err[200];
    return cm_tune_parse((const uint8_t *)s, strlen(s), k_sig, c, err, sizeof err);
}

static void test_file(void) {
    cm_tune_choice c, back;
    memset(&c, 0, sizeof c);
    c.set[CM_TUNE_F16_GEMV_PFD] = true, c.val[CM_TUNE_F16_GEMV_PFD] = 3072;
    c.set[CM_TUNE_F16_GEMM_PASS] = true, c.val[CM_TUNE_F16_GEMM_PASS] = 512;
    char text[CM_TUNE_FILE_MAX];
    const size_t len = cm_tune_format(k_sig, &c, text, sizeof text);
    CHECK(len > 0 && len == strlen(text));
    CHECK(parse_str(text, &back) == 0);
    CHECK(memcmp(back.set, c.set, sizeof c.set) == 0);
    CHECK(back.val[CM_TUNE_F16_GEMV_PFD] == 3072 && back.val[CM_TUNE_F16_GEMM_PASS] == 512);
    CHECK(cm_tune_format(k_sig, &c, text, 20) == 0); /* does not fit */
    cm_tune_format(k_sig, &c, text, sizeof text);

    /* accepted: a newer build's knob is skipped; blank lines; no final newline */
    char ok[1024];
    snprintf(ok, sizeof ok, "cumulo-tune 1\nsig %s\nfuture.knob 7\n\navx512.q8_0.gemv.pfd 1024", k_sig);
    CHECK(parse_str(ok, &back) == 0 && back.set[CM_TUNE_Q8_0_GEMV_PFD] && back.val[CM_TUNE_Q8_0_GEMV_PFD] == 1024 &&
          !back.set[CM_TUNE_F16_GEMV_PFD]);

    char bad[8][1024];
    int nb = 0;
    snprintf(bad[nb++], 1024, "cumulo-tune 2\nsig %s\n", k_sig);                                  /* another version */
    snprintf(bad[nb++], 1024, "cumulo-tune 1\nsig AuthenticAMD 25 17 1; avx2\n");                 /* another CPU */
    snprintf(bad[nb++], 1024, "cumulo-tune 1\nsig %s\navx512.f16.gemv.pfd 999\n", k_sig);         /* not a candidate */
    snprintf(bad[nb++], 1024, "cumulo-tune 1\nsig %s\navx512.f16.gemv.pfd -1\n", k_sig);          /* not a number */
    snprintf(bad[nb++], 1024, "cumulo-tune 1\nsig %s\navx512.f16.gemv.pfd\n", k_sig);             /* no value */
    snprintf(bad[nb++], 1024, "cumulo-tune 1\nsig %s\navx512.f16.gemv.pfd 99999999999\n", k_sig); /* overflow */
    snprintf(bad[nb++], 1024, "cumulo-tune 1\n");                                                 /* truncated */
    snprintf(bad[nb++], 1024, "%s", "");                                                          /* empty */
    for (int i = 0; i < nb; i++) CHECKF(parse_str(bad[i], &back) == CM_EFORMAT, "accepted: %s", bad[i]);
    /* a line too long, a file too large */
    static char big[CM_TUNE_FILE_MAX + 64];
    snprintf(big, sizeof big, "cumulo-tune 1\nsig %s\n", k_sig);
    size_t o = strlen(big);
    memset(big + o, 'a', sizeof big - o - 1);
    big[sizeof big - 1] = 0;
    CHECK(parse_str(big, &back) == CM_EFORMAT);
    char err[200];
    CHECK(cm_tune_parse((const uint8_t *)big, CM_TUNE_FILE_MAX + 1, k_sig, &back, err, sizeof err) == CM_EFORMAT);
    /* random mutations of a good file: refused or accepted, with candidates only */
    uint8_t m[CM_TUNE_FILE_MAX];
    int accepted = 0;
    for (int it = 0; it < 5000; it++) {
        memcpy(m, text, len);
        size_t ml = len;
        const int edits = 1 + (int)(rnd() % 4);
        for (int e = 0; e < edits; e++) {
            switch (rnd() % 3) {
            case 0: m[rnd() % ml] = (uint8_t)rnd(); break;
            case 1: ml = 1 + rnd() % ml; break;
            default: m[rnd() % ml] = (uint8_t) "0123456789 \n"[rnd() % 12]; break;
            }
        }
        const int rc = cm_tune_parse(m, ml, k_sig, &back, err, sizeof err);
        CHECK(rc == 0 || rc == CM_EFORMAT);
        if (rc) continue;
        accepted++;
        for (int i = 0; i < CM_TUNE_COUNT; i++)
            if (back.set[i]) CHECK(cm_tune_set(i, back.val[i]) == 0);
    }
    cm_tune_defaults();
    CHECK(accepted > 0); /* some mutations only cut a line off or touch a skipped one */
}

static void test_measure(void) {
    const cm_kernels *k = cm_kernels_for("avx512");
    /* small weights: nothing to measure on any table */
    for (size_t a = 0; a < sizeof k_isas / sizeof k_isas[0]; a++) {
        const cm_kernels *t = cm_kernels_for(k_isas[a]);
        if (!t) continue;
        static uint16_t small[64 * 1024];
        cm_tensor S;
        const int64_t ne[2] = {1024, 64};
        cm_tensor_init(&S, CM_TYPE_F16, 2, ne, small, "s");
        const cm_tensor *sp[] = {&S};
        bool want[CM_TUNE_COUNT];
        CHECK(cm_tune_wanted(t, sp, 1, want) == 0);
        for (int i = 0; i < CM_TUNE_COUNT; i++) CHECK(!want[i]);
    }
    if (!k) {
        printf("skip: n/a: no avx512 table on this CPU: the measurement of its knobs\n");
        return;
    }
    const int64_t n = 8192, rows = 4608; /* 72 MiB of f16 */
    uint16_t *w = malloc((size_t)n * (size_t)rows * 2);
    for (int64_t i = 0; i < n * rows; i++) w[i] = (uint16_t)(0x3000 + (rnd() & 0x7ff));
    cm_tensor W;
    const int64_t ne[2] = {n, rows};
    cm_tensor_init(&W, CM_TYPE_F16, 2, ne, w, "w");
    const cm_tensor *wp[] = {&W};
    bool want[CM_TUNE_COUNT];
    CHECK(cm_tune_wanted(k, wp, 1, want) == 2 && want[CM_TUNE_F16_GEMV_PFD] && want[CM_TUNE_F16_GEMM_PASS]);
    cm_tune_choice got;
    double ns[CM_TUNE_COUNT][CM_TUNE_MAXCAND];
    CHECK(cm_tune_measure(k, wp, 1, want, &got, ns) == 0);
    for (int i = 0; i < CM_TUNE_COUNT; i++) {
        const cm_tune_knob_info *ki = cm_tune_info(i);
        CHECK(got.set[i] == want[i]);
        if (!want[i]) continue;
        bool cand = false;
        for (int j = 0; j < ki->n_cand; j++) {
            cand |= got.val[i] == ki->cand[j];
            CHECKF(ns[i][j] > 0, "%s: candidate %d not measured", ki->name, ki->cand[j]);
        }
        CHECK(cand && cm_tune_get((enum cm_tune_knob)i) == got.val[i]);
        printf("%s = %d (best per rep:", ki->name, got.val[i]);
        for (int j = 0; j < ki->n_cand; j++) printf(" %d: %.3f ms", ki->cand[j], ns[i][j] * 1e-6);
        printf(")\n");
    }
    cm_tune_defaults();
    free(w);
}

int main(void) {
    RUN(test_table);
    RUN(test_bits_every_value);
    RUN(test_file);
    RUN(test_measure);
    TEST_END();
}
