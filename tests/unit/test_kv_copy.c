/*
 * test_kv_copy.c: a shared prompt prefix copied from one session into
 * another (cm_session_copy_prefix -> cm_kv_copy_prefix, what the server's
 * prefix cache does) gives exactly what evaluating the whole prompt gives,
 * in every KV cache layout: F32 and F16 with V transposed, the rows layout
 * of Q8_0 / Q4_0 and of F16 with flash attention, and deepseek2's latent
 * cache (no V). The copy must move whole positions of both K and V: a copy
 * that drops V or a position changes the logprobs compared here.
 */
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "synth/synth.h"
#include "tensor/tensor.h"
#include "gen_fx.h"
#include "synth_fx.h"
#include "test.h"

#include <unistd.h>

static char errbuf[512];

/* Whole prompt in one session vs prefix copied from another, then the rest. */
static void same_with_copy(const char *model, int kv_k, int kv_v, bool flash, const char *what) {
    cm_engine_opts o = {.n_threads = 1, .n_ctx = 256, .kv_type_k = kv_k, .kv_type_v = kv_v, .kv_transposed = !flash};
    cm_engine *e = NULL;
    if (cm_engine_load(&e, model, &o, errbuf, sizeof errbuf)) {
        CHECKF(0, "%s: %s", what, errbuf);
        return;
    }
    static const char text[] = "once upon a time there was a little girl she loved to play in the park with her "
                               "friends every day and the sun was big";
    int32_t ids[256];
    int n = cm_engine_tokenize(e, text, strlen(text), true, false, ids, 256, errbuf, sizeof errbuf);
    CHECK(n > 24);
    const int pre = n - 7;
    cm_gen_params p;
    cm_gen_params_default(&p);
    p.sampling.temperature = 0;
    p.n_predict = 16;
    p.ignore_eos = true;
    gen_out whole = {0}, copied = {0};
    cm_gen_result r;
    cm_session *a = cm_session_new(e, 256, errbuf, sizeof errbuf);
    CHECK(cm_session_set_prompt(a, ids, n, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(a, &p, gen_out_cb, &whole, &r, errbuf, sizeof errbuf) == 0);
    /* the source: a session that evaluated a prompt sharing the first `pre` tokens */
    cm_session *src = cm_session_new(e, 256, errbuf, sizeof errbuf);
    CHECK(cm_session_set_prompt(src, ids, pre, errbuf, sizeof errbuf) == 0);
    cm_session *b = cm_session_new(e, 256, errbuf, sizeof errbuf);
    CHECKF(cm_session_copy_prefix(b, src, pre, errbuf, sizeof errbuf) == 0, "%s: %s", what, errbuf);
    CHECK(cm_session_set_prompt(b, ids, n, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(b, &p, gen_out_cb, &copied, &r, errbuf, sizeof errbuf) == 0);
    CHECKF(whole.n_tok == 16 && copied.n_tok == whole.n_tok && whole.b.len == copied.b.len &&
               !memcmp(whole.b.data, copied.b.data, whole.b.len),
           "%s: text differs after a prefix copy", what);
    CHECKF(whole.lp_sum == copied.lp_sum, "%s: logprobs %.9g vs %.9g", what, whole.lp_sum, copied.lp_sum);
    cm_session_free(a);
    cm_session_free(src);
    cm_session_free(b);
    cm_buf_release(&whole.b);
    cm_buf_release(&copied.b);
    cm_engine_free(e);
}

/* A synthetic model with the builtin vocabulary (head size 64: quantized KV types need 32s). */
static int synth(const char *path, const char *arch, const char *variant) {
    cm_synth_params sp = {.arch = arch,
                          .variant = variant,
                          .n_embd = 256,
                          .n_layer = 3,
                          .n_head = 4,
                          .n_head_kv = variant ? 4 : 2,
                          .n_ff = 768,
                          .n_ctx = 512,
                          .type = "f32",
                          .seed = 11,
                          .n_expert = variant ? 8 : 0,
                          .n_expert_used = variant ? 2 : 0,
                          .n_ff_exp = variant ? 256 : 0};
    const int rc = synth_fx_write(&sp, path, errbuf, sizeof errbuf);
    CHECKF(!rc, "synth %s: %s", arch, errbuf);
    return rc;
}

static void test_layouts(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/cumulo-test-kvcopy-%d.gguf", (int)getpid());
    if (synth(path, "llama", NULL)) return;
    same_with_copy(path, CM_TYPE_F32, CM_TYPE_F32, false, "f32");
    same_with_copy(path, CM_TYPE_F16, CM_TYPE_F16, false, "f16");
    same_with_copy(path, CM_TYPE_F16, CM_TYPE_F16, true, "f16 flash (rows)");
    same_with_copy(path, CM_TYPE_Q8_0, CM_TYPE_Q8_0, false, "q8_0 (rows)");
    same_with_copy(path, CM_TYPE_Q8_0, CM_TYPE_Q4_0, false, "q8_0/q4_0 (rows)");
    unlink(path);
}

static void test_latent(void) { /* deepseek2 V2-Lite-style: the cache is the latent, no V */
    char path[256];
    snprintf(path, sizeof path, "/tmp/cumulo-test-kvcopy-ds-%d.gguf", (int)getpid());
    if (!synth(path, "deepseek2", "lite")) same_with_copy(path, CM_TYPE_F32, CM_TYPE_F32, false, "deepseek2 latent");
    unlink(path);
}

int main(void) {
    RUN(test_layouts);
    RUN(test_latent);
    TEST_END();
}
