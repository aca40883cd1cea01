/*
 * test_gptoss.c: the gpt-oss architecture (src/model/gptoss.c and its calls
 * in forward.c / moe.c) beyond the llama.cpp comparison of
 * test_synth_golden.c: the hyperparameters a released file's keys give
 * (alternating sliding-window layers, YaRN), which tensors bind where, the
 * clamped SwiGLU at its edges, results that do not depend on how tokens are
 * batched or threaded (sliding window and sinks included), and the one-line
 * refusals of layouts it cannot run.
 */
#include "test.h"

#include "gguf/gguf.h"
#include "model/gptoss.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"
#include "synth_fx.h"

static char errbuf[512];
static cm_gguf g_vocab;

typedef synth_fx fx;

/* 4 layers (sliding, full, sliding, full), window 4, 8 experts top 2. */
static int fx_open(fx *f, const char *type, uint64_t seed) {
    cm_synth_params sp = {.arch = "gpt-oss",
                          .n_embd = 256,
                          .n_layer = 4,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .n_ctx = 256,
                          .type = type,
                          .seed = seed,
                          .n_threads = 2,
                          .n_expert = 8,
                          .n_expert_used = 2,
                          .n_ff_exp = 256,
                          .n_swa = 4};
    char what[64];
    snprintf(what, sizeof what, "gpt-oss %s", type);
    return synth_fx_open(f, &sp, &g_vocab, what, errbuf, sizeof errbuf);
}

static void fx_close(fx *f) { synth_fx_close(f); }

static void test_hparams(void) {
    fx f;
    if (fx_open(&f, "mxfp4", 3)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    const cm_hparams *hp = &f.m.hp;
    CHECK(hp->arch == CM_ARCH_GPTOSS && !strcmp(cm_arch_name_of(hp->arch), "gpt-oss"));
    CHECK(hp->n_swa == 4 && hp->swa_pattern == 2);
    /* llama.cpp's pattern 2: even layers slide, odd ones see everything */
    CHECK(cm_layer_is_swa(hp, 0) && !cm_layer_is_swa(hp, 1) && cm_layer_is_swa(hp, 2) && !cm_layer_is_swa(hp, 3));
    CHECK(hp->rope_type == CM_ROPE_NEOX && hp->rope_base == 150000.0f && hp->rope_base_swa == hp->rope_base);
    /* YaRN factor 32 over 4096 positions: ext 1, attention factor
     * get_mscale(32) / (1 + 0.1 ln 32) = 1 up to float rounding */
    CHECK(hp->rope_freq_scale == 1.0f / 32.0f && hp->yarn_ext_factor == 1.0f && hp->n_ctx_orig == 4096);
    CHECK(fabsf(hp->yarn_attn_factor - 1.0f) < 1e-6f && hp->yarn_beta_fast == 32.0f && hp->yarn_beta_slow == 1.0f);
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 256 && !hp->expert_norm);
    for (int il = 0; il < hp->n_layer; il++) {
        const cm_layer *L = &f.m.layers[il];
        CHECK(L->bq.data && L->bk.data && L->bv.data && L->bo.data && L->attn_sinks.data && L->ffn_gate_inp_b.data &&
              L->ffn_gate_exps_b.data && L->ffn_up_exps_b.data && L->ffn_down_exps_b.data);
        /* the pre-FFN norm is the file's post_attention_norm; no gemma3-style post-norm */
        CHECK(strstr(L->ffn_norm.name, "post_attention_norm") && !L->attn_post_norm.data && !L->ffn_post_norm.data);
        CHECK(L->ffn_gate_exps.type == CM_TYPE_MXFP4 && L->ffn_down_exps.type == CM_TYPE_MXFP4 &&
              L->wq.type == CM_TYPE_Q8_0);
    }
    fx_close(&f);
}

/* swiglu_oai: x = min(g, 7), y = clamp(u, -7, 7), x sigmoid(1.702 x) (y + 1). */
static void test_swiglu_oai(void) {
    CHECK(cm_swiglu_oai(0.0f, 5.0f) == 0.0f);
    const float s7 = 7.0f / (1.0f + expf(-1.702f * 7.0f));
    CHECK(cm_swiglu_oai(7.0f, 0.0f) == s7 && cm_swiglu_oai(50.0f, 0.0f) == s7); /* gate clamped above */
    CHECK(cm_swiglu_oai(1.0f, 100.0f) == cm_swiglu_oai(1.0f, 7.0f));            /* up clamped both ways */
    CHECK(cm_swiglu_oai(1.0f, -100.0f) == cm_swiglu_oai(1.0f, -7.0f));
    CHECK(cm_swiglu_oai(1.0f, -1.0f) == 0.0f); /* the +1 on up */
    const float g = -30.0f;                    /* no lower clamp on the gate: a tiny negative, not 0 */
    CHECK(cm_swiglu_oai(g, 0.0f) < 0.0f && cm_swiglu_oai(g, 0.0f) > -1e-15f);
}

#define NTOK SYNTH_NTOK /* three times the window */

/* Logits of every position of the prompt, fed in batches of `step` tokens. */
static int run_steps(const cm_model *m, cm_pool *pool, int step, bool f16, float *out) {
    return synth_run_steps(m, pool, step, f16 ? CM_TYPE_F16 : CM_TYPE_F32, out, errbuf, sizeof errbuf);
}

static void test_batch_invariance(void) {
    fx f;
    if (fx_open(&f, "q8_0", 5)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    const size_t V = (size_t)f.m.hp.n_vocab, sz = sizeof(float) * V * NTOK;
    cm_pool *pool = cm_pool_new(2);
    float *a = cm_malloc(sz), *b = cm_malloc(sz);
    for (int f16 = 0; f16 < 2; f16++) {
        CHECK(run_steps(&f.m, pool, NTOK, f16, a) == 0);
        CHECK(run_steps(&f.m, pool, 1, f16, b) == 0);
        CHECKF(!memcmp(a, b, sz), "kv %s: one batch vs token by token", f16 ? "f16" : "f32");
        CHECK(run_steps(&f.m, NULL, 5, f16, b) == 0);
        CHECKF(!memcmp(a, b, sz), "kv %s: 2 threads vs 1, batches of 5", f16 ? "f16" : "f32");
    }
    /* and the window matters: the last position differs from a model that
     * sees everything (sanity that the test runs past the window) */
    cm_hparams keep = f.m.hp;
    f.m.hp.n_swa = 0;
    CHECK(run_steps(&f.m, pool, NTOK, false, b) == 0);
    CHECK(memcmp(a + (NTOK - 1) * V, b + (NTOK - 1) * V, sizeof(float) * V) != 0);
    f.m.hp = keep;
    cm_free(a);
    cm_free(b);
    cm_pool_free(pool);
    fx_close(&f);
}

/* Rewrite a parsed file: kvs copied except `drop_key` (and `add` called to
 * write more), tensors copied with `from` renamed `to`. */
static int rewrite(const cm_gguf *g, const char *drop_key, void (*add)(cm_gguf_writer *), const char *from,
                   const char *to, cm_buf *out) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (!drop_key || strcmp(g->kv[i].key, drop_key)) cm_gguf_w_copy_kv(w, &g->kv[i]);
    if (add) add(w);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *t = &g->tensors[i];
        cm_gguf_w_tensor(w, from && !strcmp(t->name, from) ? to : t->name, (enum cm_type)t->type, t->n_dims, t->ne,
                         t->data);
    }
    int rc = cm_gguf_writer_write_buf(w, out, errbuf, sizeof errbuf);
    cm_gguf_writer_free(w);
    return rc;
}

static int load_err(const cm_buf *b) {
    cm_gguf g;
    cm_model m;
    memset(&g, 0, sizeof g);
    int rc = cm_gguf_parse(&g, (const uint8_t *)b->data, b->len, errbuf, sizeof errbuf);
    if (!rc) rc = cm_model_load(&m, &g, errbuf, sizeof errbuf);
    if (!rc) cm_model_release(&m);
    cm_gguf_close(&g);
    return rc;
}

static void add_pattern_array(cm_gguf_writer *w) {
    const bool swa[4] = {true, false, true, false};
    cm_gguf_w_arr(w, "gpt-oss.attention.sliding_window_pattern", CM_GGUF_BOOL, swa, 4);
}
static void add_longrope(cm_gguf_writer *w) { cm_gguf_w_str(w, "gpt-oss.rope.scaling.type", "longrope"); }
static void add_logmul(cm_gguf_writer *w) { cm_gguf_w_f32(w, "gpt-oss.rope.scaling.yarn_log_multiplier", 0.1f); }

static void test_refusals(void) {
    fx f;
    if (fx_open(&f, "f32", 7)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    struct {
        const char *drop;
        void (*add)(cm_gguf_writer *);
        const char *from, *to;
        int rc;
        const char *want;
    } cases[] = {
        {NULL, NULL, "blk.2.attn_sinks.weight", "blk.2.attn_sinkz.weight", CM_EFORMAT, "'blk.2.attn_sinks.weight'"},
        {NULL, NULL, "blk.1.ffn_down_exps.bias", "blk.1.ffn_down_exps.biaz", CM_EFORMAT, "'blk.1.ffn_down_exps.bias'"},
        {NULL, NULL, "blk.0.post_attention_norm.weight", "blk.0.ffn_norm.weight", CM_EFORMAT,
         "'blk.0.post_attention_norm.weight'"},
        {"gpt-oss.attention.sliding_window", NULL, NULL, NULL, CM_EFORMAT, "gpt-oss.attention.sliding_window"},
        {NULL, add_pattern_array, NULL, NULL, CM_EUNSUPPORTED, "per-layer array"},
        {"gpt-oss.rope.scaling.type", add_longrope, NULL, NULL, CM_EUNSUPPORTED, "'longrope'"},
        {NULL, add_logmul, NULL, NULL, CM_EUNSUPPORTED, "yarn_log_multiplier"},
        {NULL, NULL, "blk.3.ffn_gate_exps.weight", "blk.3.ffn_gate_up_exps.weight", CM_EUNSUPPORTED, "merged gate/up"},
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
        cm_buf b;
        cm_buf_init(&b);
        CHECK(rewrite(&f.g, cases[i].drop, cases[i].add, cases[i].from, cases[i].to, &b) == 0);
        errbuf[0] = 0;
        int rc = load_err(&b);
        CHECKF(rc == cases[i].rc && strstr(errbuf, cases[i].want) && !strchr(errbuf, '\n'), "case %zu: rc %d '%s'", i,
               rc, errbuf);
        printf("# %s\n", errbuf);
        cm_buf_release(&b);
    }
    fx_close(&f);
}

int main(void) {
    if (cm_gguf_open(&g_vocab, t_shared("vocab/ggml-vocab-llama-spm.gguf"), NULL, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_hparams);
    RUN(test_swiglu_oai);
    RUN(test_batch_invariance);
    RUN(test_refusals);
    cm_gguf_close(&g_vocab);
    TEST_END();
}
