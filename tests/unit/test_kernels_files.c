/* test_kernels_files.c: our reference weight quantizers against files made by
 * someone else. stories260K-q8_0.gguf and -q4_0.gguf in ../shared/models were
 * produced from stories260K-f32.gguf with ggml's reference Q8_0/Q4_0
 * quantizers (../shared/models/PROVENANCE.md), so quantizing every F32 tensor
 * that is quantized there must give back the file's bytes exactly. Then the
 * quantized tensors, dequantized, must sit within their format's error of the
 * F32 originals, and a matmul over the file's bytes must agree with one over
 * our own bytes bit for bit. */
#include "test.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tensor/tensor.h"

static int compare_file(const char *quant_name, enum cm_type want_type) {
    char err[256];
    cm_gguf f32 = {0}, q = {0};
    int rc = cm_gguf_open(&f32, t_shared("models/stories260K-f32.gguf"), NULL, NULL, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc) return 0;
    rc = cm_gguf_open(&q, t_shared(quant_name), NULL, NULL, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc) {
        cm_gguf_close(&f32);
        return 0;
    }
    int n_checked = 0;
    for (uint64_t i = 0; i < q.n_tensors; i++) {
        const cm_gguf_tensor_info *tq = &q.tensors[i];
        if (tq->type != (uint32_t)want_type) {
            CHECKF(tq->type == CM_TYPE_F32, "%s: unexpected type %s", tq->name, cm_type_name(tq->type));
            continue;
        }
        const cm_gguf_tensor_info *tf = cm_gguf_find_tensor(&f32, tq->name);
        CHECKF(tf && tf->type == CM_TYPE_F32, "%s missing or not f32 in the f32 file", tq->name);
        if (!tf) continue;
        CHECK(!memcmp(tf->ne, tq->ne, sizeof tf->ne));
        const int64_t n_per_row = tf->ne[0], nrows = (int64_t)(tf->nbytes / 4) / n_per_row;
        uint8_t *mine = malloc(tq->nbytes + 1);
        const size_t n = cm_quantize_rows(want_type, tf->data, mine, nrows, n_per_row);
        CHECKF(n == tq->nbytes, "%s: %zu bytes vs %llu", tq->name, n, (unsigned long long)tq->nbytes);
        if (n == tq->nbytes && memcmp(mine, tq->data, n)) {
            size_t at = 0;
            while (mine[at] == ((const uint8_t *)tq->data)[at]) at++;
            CHECKF(0, "%s (%s): first differing byte %zu of %zu", tq->name, cm_type_name(want_type), at, n);
        }

        /* Dequantized: within the format's error (test_kernels.c derives the bound) of the originals. */
        const cm_kernels *k = cm_kernels_ref();
        float *deq = malloc(sizeof(float) * (size_t)(nrows * n_per_row));
        k->to_float[want_type](tq->data, deq, nrows * n_per_row);
        const float *orig = tf->data;
        double se = 0, s2 = 0;
        for (int64_t j = 0; j < nrows * n_per_row; j++) {
            se += ((double)orig[j] - deq[j]) * ((double)orig[j] - deq[j]);
            s2 += (double)orig[j] * orig[j];
        }
        const double bound = want_type == CM_TYPE_Q8_0 ? 4.7e-5 : 1.2e-2;
        CHECKF(se <= bound * s2, "%s: nmse %.3g", tq->name, se / s2);

        /* A matmul over the file's bytes equals one over ours. */
        const enum cm_type vt = cm_type_traits_of(want_type)->vec_dot_type;
        const size_t xs = cm_row_size(vt, n_per_row);
        uint8_t *xq = malloc(xs * 2);
        float *x = malloc(sizeof(float) * (size_t)n_per_row * 2), *y1 = malloc(sizeof(float) * (size_t)nrows * 2),
              *y2 = malloc(sizeof(float) * (size_t)nrows * 2);
        cm_rng r;
        cm_rng_seed(&r, (uint64_t)i);
        for (int64_t j = 0; j < 2 * n_per_row; j++) x[j] = cm_rng_normal(&r);
        k->from_float[vt](x, xq, n_per_row);
        k->from_float[vt](x + n_per_row, xq + xs, n_per_row);
        cm_tensor Wf, Wm;
        cm_tensor_init(&Wf, want_type, 2, (int64_t[]){n_per_row, nrows}, (void *)tq->data, tq->name);
        cm_tensor_init(&Wm, want_type, 2, (int64_t[]){n_per_row, nrows}, mine, tq->name);
        cm_matmul_rows(cm_kernels_get(), &Wf, xq, xs, 2, y1, nrows, 0, nrows);
        cm_matmul_rows(cm_kernels_get(), &Wm, xq, xs, 2, y2, nrows, 0, nrows);
        CHECKF(!memcmp(y1, y2, sizeof(float) * (size_t)nrows * 2), "%s: matmul differs", tq->name);
        free(x);
        free(y1);
        free(y2);
        free(xq);
        free(deq);
        free(mine);
        n_checked++;
    }
    if (getenv("CUMULO_TEST_VERBOSE")) fprintf(stderr, "  %s: %d tensors byte-identical\n", quant_name, n_checked);
    cm_gguf_close(&q);
    cm_gguf_close(&f32);
    return n_checked;
}

static void test_q8_0_file(void) {
    /* token_embd, output and attn_q/k/v/output, ffn_gate/up of 5 layers: every
     * 2-D tensor with rows of 64 (ffn_down's 172 stays F32). */
    CHECK(compare_file("models/stories260K-q8_0.gguf", CM_TYPE_Q8_0) >= 30);
}

static void test_q4_0_file(void) { CHECK(compare_file("models/stories260K-q4_0.gguf", CM_TYPE_Q4_0) >= 30); }

int main(void) {
    RUN(test_q8_0_file);
    RUN(test_q4_0_file);
    TEST_END();
}
