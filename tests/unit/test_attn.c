/* test_attn.c: the KV cache's value kernel (kernels.h attn_v) of every ISA
 * against the scalar reference, and the tiled online-softmax attention
 * (model/attn.c, cm_attn_flash) against softmax attention in double, for
 * every KV type, with a window (p_lo > 0) and a sink. */
#include "test.h"

#include "base/base.h"
#include "kernels/kernels.h"
#include "model/model.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static const enum cm_type k_types[4] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0, CM_TYPE_Q4_0};

/* Rows of n x D floats converted to type t (the cache's bytes). */
static void *make_rows(enum cm_type t, const float *x, int n, int D) {
    const size_t row = cm_row_size(t, D);
    uint8_t *p = cm_malloc(row * (size_t)n + 64);
    for (int j = 0; j < n; j++) {
        if (t == CM_TYPE_F32) memcpy(p + row * j, x + (size_t)j * D, (size_t)D * 4);
        else if (t == CM_TYPE_F16) cm_kernels_ref()->from_float[CM_TYPE_F16](x + (size_t)j * D, p + row * j, D);
        else cm_quantize_rows(t, x + (size_t)j * D, p + row * j, 1, D);
    }
    return p;
}

static void test_attn_v_isa(void) {
    const char *isas[] = {"avx2", "avx512", "neon"};
    const int D = 128, n = 64;
    uint64_t s = 7;
    float *x = cm_malloc(sizeof(float) * D * n), w[64], a0[128], a1[128];
    for (int i = 0; i < D * n; i++) x[i] = frand(&s);
    for (int j = 0; j < n; j++) w[j] = (frand(&s) + 1.0f) / 2;
    int tested = 0;
    for (int t = 0; t < 4; t++) {
        void *v = make_rows(k_types[t], x, n, D);
        const size_t row = cm_row_size(k_types[t], D);
        for (size_t k = 0; k < sizeof isas / sizeof *isas; k++) {
            const cm_kernels *kk = cm_kernels_for(isas[k]);
            if (!kk || !kk->attn_v[k_types[t]]) continue;
            for (int i = 0; i < D; i++) a0[i] = a1[i] = 0.25f * (float)i / D;
            cm_kernels_ref()->attn_v[k_types[t]](D, v, row, w, n, a0);
            kk->attn_v[k_types[t]](D, v, row, w, n, a1);
            /* 64 fused adds vs separately rounded products, sums < 64:
             * measured 1.4e-6 (F32, F16), 9.5e-7 (Q8_0), 0 (Q4_0: reference) */
            double e = 0;
            for (int i = 0; i < D; i++) e = fmax(e, fabs(a0[i] - a1[i]));
            if (getenv("CUMULO_TEST_VERBOSE")) fprintf(stderr, "  %s %s: %.3g\n", isas[k], cm_type_name(k_types[t]), e);
            CHECKF(e < 5e-6, "%s %s: max error %.3g", isas[k], cm_type_name(k_types[t]), e);
            tested++;
        }
        cm_free(v);
    }
    CHECK(cm_kernels_ref()->attn_v[CM_TYPE_Q4_0] != NULL);
    if (getenv("CUMULO_TEST_VERBOSE")) fprintf(stderr, "  %d (isa, type) pairs tested\n", tested);
    cm_free(x);
}

/* softmax(scale q.K_p for p in [lo, hi) and the sink) . V in double, over
 * the dequantized rows (the query rounded as the kernel rounds it is not
 * modelled: the bound covers it). */
static void naive(const float *q, const float *k, const float *v, int D, int lo, int hi, float scale, float sink,
                  double *out) {
    double mx = isnan(sink) ? -INFINITY : sink, sum = 0;
    double sc[600];
    for (int p = lo; p < hi; p++) {
        double d = 0;
        for (int i = 0; i < D; i++) d += (double)q[i] * k[(size_t)p * D + i];
        sc[p] = d * scale;
        mx = fmax(mx, sc[p]);
    }
    for (int i = 0; i < D; i++) out[i] = 0;
    for (int p = lo; p < hi; p++) {
        const double e = exp(sc[p] - mx);
        sum += e;
        for (int i = 0; i < D; i++) out[i] += e * v[(size_t)p * D + i];
    }
    if (!isnan(sink)) sum += exp(sink - mx);
    for (int i = 0; i < D; i++) out[i] /= sum;
}

static void test_flash_vs_naive(void) {
    const int D = 64, N = 600;
    uint64_t s = 11;
    float *k = cm_malloc(sizeof(float) * D * N), *v = cm_malloc(sizeof(float) * D * N), q[64], out[64];
    float *kd = cm_malloc(sizeof(float) * D * N), *vd = cm_malloc(sizeof(float) * D * N);
    for (int i = 0; i < D * N; i++) k[i] = frand(&s), v[i] = frand(&s);
    for (int i = 0; i < D; i++) q[i] = 3 * frand(&s);
    void *scratch = cm_aligned_alloc(cm_attn_scratch_bytes(D));
    const int ranges[3][2] = {{0, 1}, {0, N}, {137, 400}};
    const float sinks[2] = {NAN, 1.5f};
    for (int t = 0; t < 4; t++) {
        uint8_t *kr = make_rows(k_types[t], k, N, D), *vr = make_rows(k_types[t], v, N, D);
        const size_t row = cm_row_size(k_types[t], D);
        for (int j = 0; j < N; j++) { /* what the cache holds, as floats */
            cm_kernels_ref()->to_float[k_types[t]](kr + row * j, kd + (size_t)j * D, D);
            cm_kernels_ref()->to_float[k_types[t]](vr + row * j, vd + (size_t)j * D, D);
        }
        const cm_attn_kv av = {
            .k = kr, .v = vr, .k_row = row, .v_row = row, .k_type = k_types[t], .v_type = k_types[t]};
        for (int r = 0; r < 3; r++)
            for (int si = 0; si < 2; si++) {
                double ref[64], e = 0;
                const cm_attn_query aq = {
                    .q = q, .p_lo = ranges[r][0], .p_hi = ranges[r][1], .scale = 0.125f, .sink = sinks[si]};
                cm_attn_flash(cm_kernels_get(), &av, D, &aq, scratch, out);
                naive(q, kd, vd, D, aq.p_lo, aq.p_hi, aq.scale, aq.sink, ref);
                for (int i = 0; i < D; i++) e = fmax(e, fabs(out[i] - ref[i]));
                /* the query rounded to K's vec_dot type moves the scores;
                 * F16 also accumulates V in F16 (as ggml does); measured
                 * F32 6.6e-8, F16 5.4e-4, Q8_0 6.3e-4, Q4_0 7.0e-4 */
                const double tol = t == 0 ? 3e-7 : t == 1 ? 1.5e-3 : 2.5e-3;
                if (getenv("CUMULO_TEST_VERBOSE"))
                    fprintf(stderr, "  flash %s r%d s%d: %.3g\n", cm_type_name(k_types[t]), r, si, e);
                CHECKF(e < tol, "%s [%d, %d) sink %g: max error %.3g", cm_type_name(k_types[t]), aq.p_lo, aq.p_hi,
                       (double)aq.sink, e);
            }
        cm_free(kr);
        cm_free(vr);
    }
    cm_aligned_free(scratch);
    cm_free(k), cm_free(v), cm_free(kd), cm_free(vd);
}

/* The F16 accumulator step and ggml-order F16 dot of each ISA equal the
 * scalar reference bit for bit (a tail past the SIMD width included). */
static void test_f16_path_isa(void) {
    const char *isas[] = {"avx2", "avx512", "neon"};
    uint64_t s = 9;
    for (int Di = 0; Di < 2; Di++) {
        const int D = Di ? 200 : 128;
        float x[200], y[200];
        cm_f16 xh[200], yh[200], acc0[200], acc1[200];
        for (int i = 0; i < D; i++) x[i] = frand(&s), y[i] = 4 * frand(&s);
        cm_kernels_ref()->from_float[CM_TYPE_F16](x, xh, D);
        cm_kernels_ref()->from_float[CM_TYPE_F16](y, yh, D);
        float d0;
        cm_kernels_ref()->attn_f16_dot(D, &d0, xh, yh);
        for (size_t k = 0; k < sizeof isas / sizeof *isas; k++) {
            const cm_kernels *kk = cm_kernels_for(isas[k]);
            if (!kk || !kk->attn_f16_dot) continue;
            float d1;
            kk->attn_f16_dot(D, &d1, xh, yh);
            CHECKF(memcmp(&d0, &d1, sizeof d0) == 0, "%s dot D=%d: %.9g vs %.9g", isas[k], D, (double)d1, (double)d0);
            memcpy(acc0, yh, sizeof acc0);
            memcpy(acc1, yh, sizeof acc1);
            for (int r = 0; r < 20; r++) { /* steps with and without a rescale */
                const float ms = r % 3 ? 1.0f : 0.7f + 0.01f * (float)r, w = 0.5f + frand(&s) * 0.4f;
                cm_kernels_ref()->attn_f16_step(D, acc0, xh, ms, w);
                kk->attn_f16_step(D, acc1, xh, ms, w);
            }
            CHECKF(memcmp(acc0, acc1, (size_t)D * sizeof(cm_f16)) == 0, "%s f16 step D=%d differs", isas[k], D);
        }
    }
}

/* An F16 cache: cm_attn_flash equals, bit for bit, the recurrence ggml's
 * flash attention runs position by position (score, a new maximum rescales
 * at once, the F16 accumulator step, the sum), written out here with the
 * table's own dot and step: grouping the positions in tiles (scores first)
 * must not change any operation. Windows inside one tile, across tile
 * borders and past several, a rising maximum, a sink. */
static void test_f16_tiles_exact(void) {
    const int D = 64, N = 300;
    uint64_t s = 21;
    float *k = cm_malloc(sizeof(float) * D * N), *v = cm_malloc(sizeof(float) * D * N), q[64], out[64], ref[64];
    for (int j = 0; j < N; j++)
        for (int i = 0; i < D; i++) /* keys that grow along the cache: new maxima in later tiles too */
            k[(size_t)j * D + i] = frand(&s) + (float)j / (float)N, v[(size_t)j * D + i] = frand(&s);
    for (int i = 0; i < D; i++) q[i] = 2 + frand(&s);
    uint8_t *kr = make_rows(CM_TYPE_F16, k, N, D), *vr = make_rows(CM_TYPE_F16, v, N, D);
    const size_t row = cm_row_size(CM_TYPE_F16, D);
    const cm_attn_kv av = {.k = kr, .v = vr, .k_row = row, .v_row = row, .k_type = CM_TYPE_F16, .v_type = CM_TYPE_F16};
    void *scratch = cm_aligned_alloc(cm_attn_scratch_bytes(D));
    const cm_kernels *kk = cm_kernels_get();
    const int ranges[5][2] = {{0, 1}, {5, 60}, {0, 64}, {30, 200}, {0, N}};
    const float sinks[2] = {NAN, 9.0f};
    for (int r = 0; r < 5; r++)
        for (int si = 0; si < 2; si++) {
            const cm_attn_query aq = {
                .q = q, .p_lo = ranges[r][0], .p_hi = ranges[r][1], .scale = 0.5f, .sink = sinks[si]};
            cm_attn_flash(kk, &av, D, &aq, scratch, out);
            cm_f16 qh[64], acc[64];
            kk->from_float[CM_TYPE_F16](q, qh, D);
            memset(acc, 0, sizeof acc);
            float M = -INFINITY, S = 0.0f;
            for (int p = aq.p_lo; p < aq.p_hi; p++) {
                float sc, ms = 1.0f, vs = 1.0f;
                kk->attn_f16_dot(D, &sc, kr + row * p, qh);
                sc = sc * aq.scale;
                if (sc > M) {
                    const float Mold = M;
                    M = sc;
                    ms = expf(Mold - M);
                } else {
                    vs = expf(sc - M);
                }
                kk->attn_f16_step(D, acc, vr + row * p, ms, vs);
                S = S * ms + vs;
            }
            for (int i = 0; i < D; i++) ref[i] = cm_f16_to_f32(acc[i]);
            if (!isnan(aq.sink)) {
                float ms = 1.0f, vs = 1.0f;
                if (aq.sink > M) {
                    ms = expf(M - aq.sink);
                    for (int i = 0; i < D; i++) ref[i] *= ms;
                } else {
                    vs = expf(aq.sink - M);
                }
                S = S * ms + vs;
            }
            const float inv = S == 0.0f ? 0.0f : 1.0f / S;
            for (int i = 0; i < D; i++) ref[i] *= inv;
            CHECKF(memcmp(out, ref, sizeof out) == 0,
                   "f16 cache [%d, %d) sink %g: not the per-position bits (%.9g vs %.9g)", aq.p_lo, aq.p_hi,
                   (double)aq.sink, (double)out[0], (double)ref[0]);
        }
    cm_aligned_free(scratch);
    cm_free(kr), cm_free(vr), cm_free(k), cm_free(v);
}

/* The Walsh-Hadamard rotation of quantized caches: the Sylvester matrix
 * (-1)^popcount(i & j) / sqrt(n) per chunk, its own inverse; the chunk
 * sizes llama.cpp picks; and a rotated Q8_0 cache (stored through
 * cm_kv_store_rows, read through cm_attn_kv_of) still attends like the
 * unrotated floats. */
static int parity(unsigned x) {
    int p = 0;
    for (; x; x &= x - 1) p ^= 1;
    return p;
}

static void test_rotation(void) {
    float x[256], y[256];
    uint64_t s = 5;
    for (int i = 0; i < 256; i++) x[i] = y[i] = frand(&s);
    cm_fwht_rows(y, 256, 64);
    double e = 0;
    for (int c = 0; c < 256; c += 64)
        for (int i = 0; i < 64; i++) {
            double r = 0;
            for (int j = 0; j < 64; j++) r += (parity((unsigned)(i & j)) ? -1.0 : 1.0) * x[c + j] / 8.0;
            e = fmax(e, fabs(r - y[c + i]));
        }
    CHECKF(e < 1e-6, "H x vs the matrix: %.3g", e);
    cm_fwht_rows(y, 256, 64);
    e = 0;
    for (int i = 0; i < 256; i++) e = fmax(e, fabs(y[i] - x[i]));
    CHECKF(e < 1e-6, "H H x vs x: %.3g", e);
    CHECK(cm_kv_rot_k(CM_TYPE_Q8_0, 64) == 64 && cm_kv_rot_k(CM_TYPE_Q4_0, 128) == 128 &&
          cm_kv_rot_k(CM_TYPE_Q8_0, 192) == 64 && cm_kv_rot_k(CM_TYPE_Q8_0, 96) == 0 &&
          cm_kv_rot_k(CM_TYPE_F16, 128) == 0);
    CHECK(cm_kv_rot_v(CM_TYPE_Q8_0, 128) == 64 && cm_kv_rot_v(CM_TYPE_Q4_0, 96) == 0 &&
          cm_kv_rot_v(CM_TYPE_F32, 64) == 0);
    /* a cache through the real store and view */
    cm_model m;
    memset(&m, 0, sizeof m);
    m.hp.n_layer = 1, m.hp.n_head_kv = 1, m.hp.head_dim = 128;
    cm_kv kv;
    char err[128];
    const int D = 128, N = 50;
    CHECK(cm_kv_init_types(&kv, &m, 0, 1, (cm_slice){.h0 = 0, .h1 = 1}, N, CM_TYPE_Q8_0, CM_TYPE_Q8_0, true, err,
                           sizeof err) == 0);
    float *k = cm_malloc(sizeof(float) * D * N), *v = cm_malloc(sizeof(float) * D * N), q[128], out[128];
    double ref[128];
    for (int i = 0; i < D * N; i++) k[i] = frand(&s), v[i] = frand(&s);
    for (int i = 0; i < D; i++) q[i] = 3 * frand(&s);
    for (int p = 0; p < N; p++) cm_kv_store_rows(cm_kernels_get(), &kv, 0, 0, p, k + (size_t)p * D, v + (size_t)p * D);
    const cm_attn_kv av = cm_attn_kv_of(&kv, 0, 0);
    CHECK(av.rot_k == 128 && av.rot_v == 64);
    void *scratch = cm_aligned_alloc(cm_attn_scratch_bytes(D));
    const cm_attn_query aq = {.q = q, .p_lo = 0, .p_hi = N, .scale = 0.088f, .sink = NAN};
    cm_attn_flash(cm_kernels_get(), &av, D, &aq, scratch, out);
    naive(q, k, v, D, 0, N, aq.scale, aq.sink, ref);
    e = 0;
    for (int i = 0; i < D; i++) e = fmax(e, fabs(out[i] - ref[i]));
    if (getenv("CUMULO_TEST_VERBOSE")) fprintf(stderr, "  rotated q8_0 cache vs floats: %.3g\n", e);
    CHECKF(e < 4e-3, "rotated Q8_0 cache: max error %.3g", e);
    cm_aligned_free(scratch);
    cm_free(k);
    cm_free(v);
    cm_kv_release(&kv);
}

int main(void) {
    RUN(test_attn_v_isa);
    RUN(test_flash_vs_naive);
    RUN(test_rotation);
    RUN(test_f16_path_isa);
    RUN(test_f16_tiles_exact);
    TEST_END();
}
