/* test_rope.c: RoPE scaling read from GGUF keys (model/rope.c) the way
 * llama.cpp's loader reads them, and the rotation table against the YaRN
 * formulas written independently here in double precision (the golden
 * check against llama.cpp itself is test_synth_golden's *yarn* and
 * *linear* models). */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"

/* Parse a GGUF holding only the keys the writer w got. */
static int parse_keys(cm_gguf_writer *w, cm_buf *buf, cm_gguf *g) {
    char err[256];
    cm_buf_init(buf);
    memset(g, 0, sizeof *g);
    int rc = cm_gguf_writer_write_buf(w, buf, err, sizeof err);
    if (!rc) rc = cm_gguf_parse(g, (const uint8_t *)buf->data, buf->len, err, sizeof err);
    cm_gguf_writer_free(w);
    return rc;
}

static int read_scaling(const char *type, float factor, int orig, float attn, float beta_fast, unsigned flags,
                        cm_rope_scaling *rs, char *err, size_t errlen) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (type) cm_gguf_w_str(w, "llama.rope.scaling.type", type);
    if (factor > 0) cm_gguf_w_f32(w, "llama.rope.scaling.factor", factor);
    if (orig > 0) cm_gguf_w_u32(w, "llama.rope.scaling.original_context_length", (uint32_t)orig);
    if (attn > 0) cm_gguf_w_f32(w, "llama.rope.scaling.attn_factor", attn);
    if (beta_fast > 0) cm_gguf_w_f32(w, "llama.rope.scaling.yarn_beta_fast", beta_fast);
    cm_buf buf;
    cm_gguf g;
    int rc = parse_keys(w, &buf, &g);
    if (!rc) rc = cm_rope_scaling_read(&g, "llama", 4096, 64, 10000.0f, flags, rs, err, errlen);
    cm_gguf_close(&g);
    cm_buf_release(&buf);
    return rc;
}

static void test_read(void) {
    cm_rope_scaling rs;
    char err[256];
    /* no keys: none in effect (linear with factor 1) */
    CHECK(!read_scaling(NULL, 0, 0, 0, 0, 0, &rs, err, sizeof err));
    CHECK(rs.freq_scale == 1.0f && rs.ext_factor == 0.0f && rs.mscale == 1.0f && rs.n_ctx_orig == 4096);
    /* a factor without a type is linear (llama.cpp's default type) */
    CHECK(!read_scaling(NULL, 4, 0, 0, 0, 0, &rs, err, sizeof err));
    CHECK(rs.type == CM_ROPE_SCALING_LINEAR && rs.freq_scale == 0.25f && rs.ext_factor == 0.0f);
    /* "none" never scales */
    CHECK(!read_scaling("none", 4, 0, 0, 0, 0, &rs, err, sizeof err));
    CHECK(rs.freq_scale == 1.0f && rs.ext_factor == 0.0f);
    /* yarn: ext 1, original context, magnitude = attn_factor (the 1 + 0.1 ln s
     * is applied by the table), betas 32/1 unless the architecture reads them */
    CHECK(!read_scaling("yarn", 4, 32, 0.875f, 8, 0, &rs, err, sizeof err));
    CHECK(rs.type == CM_ROPE_SCALING_YARN && rs.ext_factor == 1.0f && rs.n_ctx_orig == 32);
    CHECKF(fabsf(rs.mscale - 0.875f) < 1e-6f, "mscale %g", rs.mscale);
    CHECK(rs.beta_fast == 32.0f && rs.beta_slow == 1.0f);
    CHECK(!read_scaling("yarn", 4, 32, 0, 8, CM_ROPE_READ_YARN_PARAMS, &rs, err, sizeof err));
    CHECK(rs.beta_fast == 8.0f);
    /* unknown types are refused by name */
    CHECK(read_scaling("longrope", 4, 0, 0, 0, 0, &rs, err, sizeof err) == CM_EUNSUPPORTED);
    CHECKF(strstr(err, "longrope") != NULL, "%s", err);
}

/* YaRN (Peng et al.; ggml's form) in double. */
static void yarn_ref(double pos, int n_rot, double base, double factor, int n_ctx_orig, double attn, int i, double *c,
                     double *s) {
    const double theta = pos * pow(base, -2.0 * i / n_rot);
    const double fs = 1.0 / factor;
    const double cd = n_rot * log(n_ctx_orig / (2 * M_PI * 32)) / (2 * log(base));
    const double cs = n_rot * log(n_ctx_orig / (2 * M_PI * 1)) / (2 * log(base));
    const double lo = fmax(0, floor(cd)), hi = fmin(n_rot - 1, ceil(cs));
    const double y = (i - lo) / fmax(0.001, hi - lo);
    const double mix = 1 - fmin(1, fmax(0, y));
    const double th = theta * fs * (1 - mix) + theta * mix;
    const double m = attn * (1 + 0.1 * log(factor));
    *c = cos(th) * m;
    *s = sin(th) * m;
}

static void test_cache(void) {
    cm_rope_scaling rs;
    char err[256];
    CHECK(!read_scaling("yarn", 4, 64, 0.9f, 0, 0, &rs, err, sizeof err));
    float cache[64];
    double worst = 0;
    const int positions[] = {0, 1, 17, 63, 64, 100, 1000, 5000}; /* before and past the original 64 */
    for (size_t k = 0; k < sizeof positions / sizeof positions[0]; k++) {
        cm_rope_cache(&rs, 64, 10000.0f, NULL, (float)positions[k], cache);
        for (int i = 0; i < 32; i++) {
            double c, s;
            yarn_ref(positions[k], 64, 10000.0, 4.0, 64, 0.9, i, &c, &s);
            /* float angles by iterated products: relative error ~1e-6 of
             * the angle (measured 2.2e-4 absolute at position 5000) */
            const double tol = 2e-6 * (1 + positions[k]);
            worst = fmax(worst, fmax(fabs(cache[2 * i] - c), fabs(cache[2 * i + 1] - s)) / tol);
        }
    }
    CHECKF(worst <= 1.0, "worst error %.3g of the bound", worst);
    /* linear: the angle scaled, magnitude 1; with frequency factors divided */
    CHECK(!read_scaling("linear", 2, 0, 0, 0, 0, &rs, err, sizeof err));
    float ff[32];
    for (int i = 0; i < 32; i++) ff[i] = 1.0f + (float)i / 8;
    cm_rope_cache(&rs, 64, 10000.0f, ff, 37.0f, cache);
    double e = 0;
    for (int i = 0; i < 32; i++) {
        const double th = 37.0 * pow(10000.0, -2.0 * i / 64) / ff[i] * 0.5;
        e = fmax(e, fmax(fabs(cache[2 * i] - cos(th)), fabs(cache[2 * i + 1] - sin(th))));
    }
    CHECKF(e < 1e-4, "linear + factors: error %.3g", e);
}

int main(void) {
    RUN(test_read);
    RUN(test_cache);
    TEST_END();
}
