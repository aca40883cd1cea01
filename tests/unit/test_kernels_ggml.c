/* test_kernels_ggml.c: our kernels against llama.cpp's own ggml binaries.
 * tests/data/kernels_ggml.txt was recorded by tools/kernels_oracle.c, which
 * ran node-llama-cpp 3.21.1's libggml-base.so (reference quantizers) and the
 * libggml-cpu variant ggml picks on the recording machine (zen4: its x86
 * activation converters and dot products) on the seeded inputs of
 * kernels_cases.h. Here we regenerate those inputs and require:
 *  - Q lines: cm_quantize_rows gives the same bytes (FNV-1a of 8 rows) for
 *    every weight type, every data shape: files we write are llama.cpp's;
 *  - A lines: from_float of every activation type (scalar table and every ISA
 *    table this CPU has) gives the same bytes as llama.cpp's x86 build;
 *  - D lines: vec_dot within float-accumulation error of llama.cpp's value:
 *    the integer sums are identical, only the order of the per-block float
 *    terms differs, so |ours - theirs| <= 2 * nb * eps * sum |terms|
 *    (nb = blocks per row, terms bounded by decode()'s magnitudes);
 *  - T lines: to_float of those quantized rows gives llama.cpp's floats bit
 *    for bit (FNV-1a of the floats), and R lines: the same on random block
 *    bytes (kc_fill_blocks), which reach level and scale patterns that
 *    quantizer outputs never hold;
 *  - E lines: vec_dot of those random-block rows, with the D lines' bound. */
#include "test.h"

#include "kernels/kernels.h"
#include "kernels_cases.h"

#include <float.h>

static FILE *open_data(void) {
    const char *p = "tests/data/kernels_ggml.txt";
    FILE *f = fopen(p, "r");
    CHECKF(f != NULL, "cannot open '%s' (run from the repository root)", p);
    return f;
}

static int type_of(const char *name) { return cm_type_from_name(name); }

/* |ours - theirs| of a vec_dot within float-accumulation error (see above);
 * returns err / sum|terms| for the worst-case report. */
static double check_dot(const char *label, const char *what, enum cm_type t, const uint8_t *w, const uint8_t *a,
                        float ours, float theirs) {
    static float wd[KC_N], xd[KC_N];
    static double wmag[KC_N], xmag[KC_N];
    const enum cm_type vt = cm_type_traits_of((uint32_t)t)->vec_dot_type;
    decode_row(t, w, KC_N, wd, wmag);
    decode_row(vt, a, KC_N, xd, xmag);
    double mag = 0;
    for (int i = 0; i < KC_N; i++) mag += wmag[i] * fabs(xd[i]);
    const int nb = KC_N / cm_type_traits_of((uint32_t)t)->block_size;
    double tol = 2.0 * (nb + 8) * FLT_EPSILON * mag + 1e-30;
    if (t == CM_TYPE_F32 || t == CM_TYPE_F16 || t == CM_TYPE_BF16) tol = 2.0 * 32 * FLT_EPSILON * mag + 1e-30;
    const double err = fabs((double)ours - theirs);
    CHECKF(err <= tol, "%s: vec_dot %s %s: %a vs llama.cpp %a (tol %.3g)", label, cm_type_name(t), what, ours, theirs,
           tol);
    return mag > 0 ? err / mag : 0;
}

static void check_table(const cm_kernels *k, const char *label) {
    FILE *f = open_data();
    if (!f) return;
    static float x[KC_ROWS * KC_N], deq[KC_ROWS * KC_N];
    static uint8_t q[KC_ROWS * KC_N * 4], a[KC_ROWS * KC_N * 4], rb[KC_ROWS * KC_N * 4];
    char line[256], tn[32];
    int n_q = 0, n_a = 0, n_d = 0, n_t = 0, n_r = 0, n_e = 0, dist, row, n_quant = 0;
    double worst_d = 0;
    unsigned long long want;
    for (int i = 0; i < KC_N_WEIGHT_TYPES; i++) n_quant += cm_type_traits_of(kc_weight_types[i])->quantized;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == 'Q' && sscanf(line, "Q %31s %d %llx", tn, &dist, &want) == 3) {
            const int t = type_of(tn);
            kc_fill(x, 0, t, dist);
            const size_t n = cm_quantize_rows((enum cm_type)t, x, q, KC_ROWS, KC_N);
            CHECKF(n && kc_fnv(q, n) == want, "%s: quantize %s dist %d differs from ggml", label, tn, dist);
            n_q++;
        } else if (line[0] == 'T' && sscanf(line, "T %31s %d %llx", tn, &dist, &want) == 3) {
            const int t = type_of(tn); /* the Q line before it left the rows in q */
            k->to_float[t](q, deq, KC_ROWS * KC_N);
            CHECKF(kc_fnv(deq, sizeof deq) == want, "%s: to_float %s dist %d differs from ggml", label, tn, dist);
            n_t++;
        } else if (line[0] == 'R' && sscanf(line, "R %31s %llx", tn, &want) == 2) {
            const int t = type_of(tn);
            kc_fill_blocks(rb, t, cm_type_traits_of((uint32_t)t));
            k->to_float[t](rb, deq, KC_ROWS * KC_N);
            CHECKF(kc_fnv(deq, sizeof deq) == want, "%s: to_float %s of random blocks differs from ggml", label, tn);
            const enum cm_type vt = cm_type_traits_of((uint32_t)t)->vec_dot_type;
            kc_fill(x, 1, t, 0);
            for (int r = 0; r < KC_ROWS; r++) k->from_float[vt](x + r * KC_N, a + r * cm_row_size(vt, KC_N), KC_N);
            n_r++;
        } else if (line[0] == 'E') {
            char hex[64];
            if (sscanf(line, "E %31s %d %63s", tn, &row, hex) != 3) continue;
            const int t = type_of(tn); /* the R line before it left the rows in rb and a */
            const enum cm_type vt = cm_type_traits_of((uint32_t)t)->vec_dot_type;
            const uint8_t *w = rb + row * cm_row_size((enum cm_type)t, KC_N), *av = a + row * cm_row_size(vt, KC_N);
            float ours;
            k->vec_dot[t](KC_N, &ours, w, av);
            char what[32];
            snprintf(what, sizeof what, "random row %d", row);
            const double r = check_dot(label, what, (enum cm_type)t, w, av, ours, strtof(hex, NULL));
            if (r > worst_d) worst_d = r;
            n_e++;
        } else if (line[0] == 'A' && sscanf(line, "A %31s %d %llx", tn, &dist, &want) == 3) {
            const int t = type_of(tn);
            const size_t as = cm_row_size((enum cm_type)t, KC_N);
            kc_fill(x, 2, t, dist);
            for (int r = 0; r < KC_ROWS; r++) k->from_float[t](x + r * KC_N, a + r * as, KC_N);
            CHECKF(kc_fnv(a, as * KC_ROWS) == want, "%s: from_float %s dist %d differs from llama.cpp x86", label, tn,
                   dist);
            n_a++;
        } else if (line[0] == 'D') {
            char hex[64];
            if (sscanf(line, "D %31s %d %d %63s", tn, &dist, &row, hex) != 4) continue;
            const int t = type_of(tn);
            const enum cm_type vt = cm_type_traits_of((uint32_t)t)->vec_dot_type;
            const size_t rs = cm_row_size((enum cm_type)t, KC_N), as = cm_row_size(vt, KC_N);
            if (row == 0) { /* the case's inputs, once per (type, dist) */
                kc_fill(x, 0, t, dist);
                cm_quantize_rows((enum cm_type)t, x, q, KC_ROWS, KC_N);
                kc_fill(x, 1, t, dist);
                for (int r = 0; r < KC_ROWS; r++) k->from_float[vt](x + r * KC_N, a + r * as, KC_N);
            }
            float ours;
            k->vec_dot[t](KC_N, &ours, q + row * rs, a + row * as);
            char what[32];
            snprintf(what, sizeof what, "dist %d row %d", dist, row);
            const double r =
                check_dot(label, what, (enum cm_type)t, q + row * rs, a + row * as, ours, strtof(hex, NULL));
            if (r > worst_d) worst_d = r;
            n_d++;
        }
    }
    fclose(f);
    CHECKF(n_q == (KC_N_WEIGHT_TYPES - 1) * KC_DISTS && n_a == KC_N_ACT_TYPES * KC_DISTS &&
               n_d == KC_N_WEIGHT_TYPES * KC_DISTS * KC_ROWS && n_t == n_quant * KC_DISTS &&
               n_r == n_quant + KC_N_BLOCK_TYPES && n_e == (n_quant + KC_N_BLOCK_TYPES) * KC_ROWS,
           "%s: %d Q, %d A, %d D, %d T, %d R, %d E lines", label, n_q, n_a, n_d, n_t, n_r, n_e);
    if (getenv("CUMULO_TEST_VERBOSE"))
        fprintf(stderr,
                "  %s: %d quantizer cases, %d activation cases, %d dequantizer cases byte-identical; %d dots, "
                "worst |diff|/sum|terms| %.3g\n",
                label, n_q, n_a, n_t + n_r, n_d + n_e, worst_d);
}

static void test_scalar_vs_ggml(void) { check_table(cm_kernels_ref(), "scalar"); }

static void test_isa_vs_ggml(void) {
    const char *isas[] = {"avx2", "avx512", "neon"};
    for (int i = 0; i < 3; i++)
        if (cm_kernels_for(isas[i])) check_table(cm_kernels_for(isas[i]), isas[i]);
}

int main(void) {
    RUN(test_scalar_vs_ggml);
    RUN(test_isa_vs_ggml);
    TEST_END();
}
