/*
 * test_moe.c: the mixture-of-experts forward pass (src/model/moe.c) beyond
 * the llama.cpp comparison of test_synth_golden.c: results that must not
 * depend on how tokens are grouped (one batch, token by token, several
 * sequences interleaved, 1 or 2 threads, a pipeline split), exactly k experts
 * used per token, the active-parameter count, and the one-line refusals
 * (tensor-parallel slices, unknown architectures, old per-expert layouts,
 * missing expert keys).
 */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"
#include "synth_fx.h"

#include "kernels/kernels.h"

#include <stdlib.h>
#include <unistd.h>

static char errbuf[512];
static cm_gguf g_vocab;

typedef synth_fx fx;

static int fx_open(fx *f, const char *arch, const char *type, int experts, int used, int shared, uint64_t seed) {
    cm_synth_params sp = {.arch = arch,
                          .n_embd = 256,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .n_ctx = 256,
                          .type = type,
                          .seed = seed,
                          .n_threads = 2,
                          .n_expert = experts,
                          .n_expert_used = used,
                          .n_ff_exp = 256,
                          .n_ff_shexp = shared};
    char what[64];
    snprintf(what, sizeof what, "%s %s", arch, type);
    return synth_fx_open(f, &sp, &g_vocab, what, errbuf, sizeof errbuf);
}

static void fx_close(fx *f) { synth_fx_close(f); }

#define NTOK SYNTH_NTOK

/* Logits of every position of the prompt, fed in batches of `step` tokens. */
static int run_steps(const cm_model *m, cm_pool *pool, int step, float *out) {
    return synth_run_steps(m, pool, step, CM_TYPE_F32, out, errbuf, sizeof errbuf);
}

/* Two sequences (the prompt and the prompt shifted by 3) interleaved in one
 * batch equal each alone; out gets sequence 0's logits. */
static int run_interleaved(const cm_model *m, cm_pool *pool, float *out0, float *out1) {
    const int V = m->hp.n_vocab, n = 2 * 8;
    cm_ctx *c = cm_ctx_new(m, n, 64, pool, errbuf, sizeof errbuf);
    cm_kv kv0, kv1;
    if (!c || cm_kv_init(&kv0, m, 0, 2, cm_slice_full(m), 64, errbuf, sizeof errbuf) ||
        cm_kv_init(&kv1, m, 0, 2, cm_slice_full(m), 64, errbuf, sizeof errbuf)) {
        cm_ctx_free(c);
        return -1;
    }
    int32_t tok[16], pos[16], seq[16];
    int8_t want[16];
    for (int i = 0; i < 8; i++) {
        tok[2 * i] = synth_prompt[i], pos[2 * i] = i, seq[2 * i] = 0, want[2 * i] = 1;
        tok[2 * i + 1] = synth_prompt[i + 3], pos[2 * i + 1] = i, seq[2 * i + 1] = 1, want[2 * i + 1] = 1;
    }
    float *lg = cm_malloc(sizeof(float) * (size_t)V * n);
    cm_kv *kvs[2] = {&kv0, &kv1};
    cm_batch b = {.n = n, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {
        .layer_first = 0, .layer_last = 2, .slice = cm_slice_full(m), .kvs = kvs, .n_kvs = 2, .out_logits = lg};
    int rc = lg ? cm_forward(c, &b, &a, errbuf, sizeof errbuf) : CM_ENOMEM;
    for (int i = 0; !rc && i < 8; i++) {
        memcpy(out0 + (size_t)i * V, lg + (size_t)(2 * i) * V, sizeof(float) * (size_t)V);
        memcpy(out1 + (size_t)i * V, lg + (size_t)(2 * i + 1) * V, sizeof(float) * (size_t)V);
    }
    cm_free(lg);
    cm_kv_release(&kv0);
    cm_kv_release(&kv1);
    cm_ctx_free(c);
    return rc;
}

/* The same bits whatever the grouping: experts run as GEMMs over the tokens
 * that chose them, and the kernels are batch-invariant (kernels.h). */
static void test_moe_grouping_invariance(void) {
    const char *cases[][2] = {{"qwen3moe", "q8_0"}, {"qwen3moe", "q4_k"}, {"qwen2moe", "f16"}, {"llama", "q4_0"}};
    cm_pool *pool = cm_pool_new(2);
    for (size_t ci = 0; ci < CM_ARRAY_LEN(cases); ci++) {
        fx f;
        const bool q2 = !strcmp(cases[ci][0], "qwen2moe");
        if (fx_open(&f, cases[ci][0], cases[ci][1], ci == 0 ? 64 : 8, ci == 0 ? 8 : 2, q2 ? 512 : 0, 11 + ci)) {
            CHECKF(0, "%s", errbuf);
            continue;
        }
        const size_t V = (size_t)f.m.hp.n_vocab;
        float *a = cm_malloc(sizeof(float) * V * NTOK), *b = cm_malloc(sizeof(float) * V * NTOK);
        float *c0 = cm_malloc(sizeof(float) * V * 8), *c1 = cm_malloc(sizeof(float) * V * 8);
        float *d = cm_malloc(sizeof(float) * V * NTOK);
        CHECK(run_steps(&f.m, pool, NTOK, a) == 0);
        CHECK(run_steps(&f.m, pool, 1, b) == 0);
        CHECKF(memcmp(a, b, sizeof(float) * V * NTOK) == 0, "%s %s: one batch vs token by token", cases[ci][0],
               cases[ci][1]);
        CHECK(run_steps(&f.m, NULL, 5, b) == 0);
        CHECKF(memcmp(a, b, sizeof(float) * V * NTOK) == 0, "%s %s: 2 threads vs 1, batches of 5", cases[ci][0],
               cases[ci][1]);
        CHECK(run_interleaved(&f.m, pool, c0, c1) == 0);
        CHECKF(memcmp(a, c0, sizeof(float) * V * 8) == 0, "%s %s: interleaved sequence 0", cases[ci][0], cases[ci][1]);
        /* sequence 1 = the prompt from its 4th token: its own run */
        {
            cm_ctx *c = cm_ctx_new(&f.m, 8, 64, pool, errbuf, sizeof errbuf);
            cm_kv kv;
            CHECK(c && cm_kv_init(&kv, &f.m, 0, 2, cm_slice_full(&f.m), 64, errbuf, sizeof errbuf) == 0);
            int32_t pos[8], seq[8] = {0};
            int8_t want[8];
            for (int i = 0; i < 8; i++) pos[i] = i, want[i] = 1;
            cm_kv *kvs[1] = {&kv};
            cm_batch bt = {.n = 8, .tokens = synth_prompt + 3, .pos = pos, .seq = seq, .logits = want};
            cm_forward_args fa = {.layer_first = 0,
                                  .layer_last = 2,
                                  .slice = cm_slice_full(&f.m),
                                  .kvs = kvs,
                                  .n_kvs = 1,
                                  .out_logits = d};
            CHECK(cm_forward(c, &bt, &fa, errbuf, sizeof errbuf) == 0);
            CHECKF(memcmp(d, c1, sizeof(float) * V * 8) == 0, "%s %s: interleaved sequence 1", cases[ci][0],
                   cases[ci][1]);
            cm_kv_release(&kv);
            cm_ctx_free(c);
        }
        /* a pipeline split: stage [0,1) hands its hidden states to [1,2) */
        {
            cm_ctx *c = cm_ctx_new(&f.m, NTOK, 64, pool, errbuf, sizeof errbuf);
            cm_kv k0, k1;
            CHECK(cm_kv_init(&k0, &f.m, 0, 1, cm_slice_full(&f.m), 64, errbuf, sizeof errbuf) == 0);
            CHECK(cm_kv_init(&k1, &f.m, 1, 2, cm_slice_full(&f.m), 64, errbuf, sizeof errbuf) == 0);
            int32_t pos[NTOK], seq[NTOK] = {0};
            int8_t want[NTOK];
            for (int i = 0; i < NTOK; i++) pos[i] = i, want[i] = 1;
            float *hid = cm_malloc(sizeof(float) * 256 * NTOK);
            cm_kv *kv0[1] = {&k0}, *kv1[1] = {&k1};
            cm_batch b0 = {.n = NTOK, .tokens = synth_prompt, .pos = pos, .seq = seq, .logits = want};
            cm_forward_args a0 = {.layer_first = 0,
                                  .layer_last = 1,
                                  .slice = cm_slice_full(&f.m),
                                  .kvs = kv0,
                                  .n_kvs = 1,
                                  .out_hidden = hid};
            CHECK(cm_forward(c, &b0, &a0, errbuf, sizeof errbuf) == 0);
            cm_batch b1 = {.n = NTOK, .embd = hid, .pos = pos, .seq = seq, .logits = want};
            cm_forward_args a1 = {.layer_first = 1,
                                  .layer_last = 2,
                                  .slice = cm_slice_full(&f.m),
                                  .kvs = kv1,
                                  .n_kvs = 1,
                                  .out_logits = d};
            CHECK(cm_forward(c, &b1, &a1, errbuf, sizeof errbuf) == 0);
            CHECKF(memcmp(a, d, sizeof(float) * V * NTOK) == 0, "%s %s: pipeline split", cases[ci][0], cases[ci][1]);
            cm_free(hid);
            cm_kv_release(&k0);
            cm_kv_release(&k1);
            cm_ctx_free(c);
        }
        printf("# %s-%s (%d experts, top %d): one batch = token by token = 1 thread = interleaved = pipeline split\n",
               cases[ci][0], cases[ci][1], f.m.hp.n_expert, f.m.hp.n_expert_used);
        cm_free(a), cm_free(b), cm_free(c0), cm_free(c1), cm_free(d);
        fx_close(&f);
    }
    cm_pool_free(pool);
}

/* Expert slabs repacked at load (moe_load.c) give the bits of the file's
 * layout: a Q4_0 qwen3moe wide enough to be repacked (rows of 512), read
 * from a file into memory so that the copies serve alone (the file's pages
 * given back), 16 experts top 4: the prompt's 48 assignments give batches
 * of 1 to a few tokens per expert (the AMX gemm over the repacked rows
 * takes such batches itself where it wins). One batch = token by token (the packed gemv) = 1 thread =
 * the same model parsed from a buffer (not repacked: the file's layout). */
static void test_moe_repacked_experts(void) {
    cm_synth_params sp = {.arch = "qwen3moe",
                          .n_embd = 512,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .n_ctx = 256,
                          .type = "q4_0",
                          .seed = 23,
                          .n_threads = 2,
                          .n_expert = 16,
                          .n_expert_used = 4,
                          .n_ff_exp = 512};
    char path[] = "/tmp/cumulo-test-moe-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    fx f; /* the file's layout (a buffer: never repacked) */
    cm_gguf g = {0};
    cm_model m = {0};
    bool ok = synth_fx_open(&f, &sp, &g_vocab, "qwen3moe q4_0", errbuf, sizeof errbuf) == 0 &&
              cm_synth_write(&sp, &g_vocab, path, NULL, errbuf, sizeof errbuf) == 0 &&
              cm_gguf_load(&g, path, NULL, NULL, errbuf, sizeof errbuf) == 0 &&
              cm_model_load(&m, &g, errbuf, sizeof errbuf) == 0;
    CHECKF(ok, "%s", errbuf);
    if (ok) {
        /* expert 5's gate rows of layer 1, as moe.c views them */
        const cm_tensor *ge = &m.layers[1].ffn_gate_exps;
        cm_tensor v = *ge;
        v.data = (char *)ge->data + 5 * ge->nb[2];
        v.ne[2] = 1;
        v.n_dims = 2;
        const bool packed = cm_kernels_get()->gemm_packed[CM_TYPE_Q4_0] != NULL;
        if (packed) CHECKF(cm_repack_find_alone(&v, NULL) != NULL, "expert 5's rows are not repacked alone");
        else printf("# SKIP part: this table has no packed q4_0 gemm (the file's layout on both sides)\n");
        const size_t V = (size_t)m.hp.n_vocab;
        float *a = cm_malloc(sizeof(float) * V * NTOK), *b = cm_malloc(sizeof(float) * V * NTOK);
        cm_pool *pool = cm_pool_new(2);
        CHECK(run_steps(&f.m, pool, NTOK, a) == 0);
        CHECK(run_steps(&m, pool, NTOK, b) == 0);
        CHECKF(memcmp(a, b, sizeof(float) * V * NTOK) == 0, "one batch: repacked experts vs the file's layout");
        CHECK(run_steps(&m, pool, 1, b) == 0);
        CHECKF(memcmp(a, b, sizeof(float) * V * NTOK) == 0, "token by token (packed gemv) vs one batch");
        CHECK(run_steps(&m, NULL, 5, b) == 0);
        CHECKF(memcmp(a, b, sizeof(float) * V * NTOK) == 0, "1 thread, batches of 5, repacked");
        const bool amx = packed && !strcmp(cm_kernels_get()->name, "avx512") && !*cm_kernels_amx_why();
        printf("# qwen3moe-q4_0 512 wide, 16 experts top 4, %s table: repacked experts (%s) = the file's layout\n",
               cm_kernels_get()->name,
               !packed ? "none"
               : amx   ? "AMX from a few tokens"
                       : "batches as they are");
        cm_pool_free(pool);
        cm_free(a), cm_free(b);
    }
    cm_model_release(&m);
    cm_gguf_close(&g);
    fx_close(&f);
    unlink(path);
}

/* A token uses exactly k experts per layer and no other: poison one expert
 * of layer 0 at a time (NaN gate rows, an F32 model) and count the experts
 * whose poison reaches the logits of a one-token decode. */
static void test_moe_exactly_k(void) {
    fx f;
    if (fx_open(&f, "qwen3moe", "f32", 64, 8, 0, 5)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    const size_t V = (size_t)f.m.hp.n_vocab;
    float *ref = cm_malloc(sizeof(float) * V), *lg = cm_malloc(sizeof(float) * V);
    cm_ctx *c = cm_ctx_new(&f.m, 1, 8, NULL, errbuf, sizeof errbuf);
    cm_kv kv;
    CHECK(c && cm_kv_init(&kv, &f.m, 0, 2, cm_slice_full(&f.m), 8, errbuf, sizeof errbuf) == 0);
    const int32_t tok = 15043;
    CHECK(cm_forward_simple(c, &kv, &tok, 1, ref, errbuf, sizeof errbuf) == 0);
    cm_tensor *g = &f.m.layers[0].ffn_gate_exps;
    const size_t slab = g->nb[2];
    float *save = cm_malloc(slab);
    int reached = 0;
    for (int e = 0; e < f.m.hp.n_expert; e++) {
        float *w = (float *)((char *)g->data + (size_t)e * slab); /* the test's own writable buffer */
        memcpy(save, w, slab);
        for (size_t i = 0; i < slab / sizeof(float); i++) w[i] = NAN;
        cm_kv_truncate(&kv, 0);
        CHECK(cm_forward_simple(c, &kv, &tok, 1, lg, errbuf, sizeof errbuf) == 0);
        if (memcmp(lg, ref, sizeof(float) * V) != 0) {
            reached++;
            CHECK(isnan(lg[0]));
        }
        memcpy(w, save, slab);
    }
    CHECKF(reached == f.m.hp.n_expert_used, "%d experts reached the logits, expected %d", reached,
           f.m.hp.n_expert_used);
    printf("# qwen3moe 64 experts top 8: %d experts of layer 0 reach a token's logits\n", reached);
    cm_free(save);
    cm_kv_release(&kv);
    cm_ctx_free(c);
    cm_free(ref), cm_free(lg);
    fx_close(&f);
}

/* n_params_active: everything but the unused experts. */
static void test_moe_counts(void) {
    fx f;
    if (fx_open(&f, "qwen2moe", "q8_0", 8, 2, 512, 3)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    const uint64_t per_expert = 3ull * 256 * 256, L = 2;
    CHECK(f.m.hp.n_expert == 8 && f.m.hp.n_expert_used == 2 && f.m.hp.n_ff_exp == 256 && f.m.hp.n_ff_shexp == 512);
    CHECK(!f.m.hp.expert_norm);
    CHECK(f.m.n_params - f.m.n_params_active == L * 6 * per_expert);
    CHECK(f.m.weight_bytes - f.m.weight_bytes_active == L * 6 * 3 * cm_row_size(CM_TYPE_Q8_0, 256) * 256);
    fx_close(&f);
    fx d;
    if (fx_open(&d, "qwen3", "q8_0", 0, 0, 0, 3)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    CHECK(d.m.n_params_active == d.m.n_params && d.m.weight_bytes_active == d.m.weight_bytes && d.m.hp.n_expert == 0);
    fx_close(&d);
}

/* Rewrite a parsed file: every kv (general.architecture / expert_count
 * replaced when given) and every tensor, one renamed. */
static int rewrite(const cm_gguf *g, const char *arch, int drop_expert_count, const char *from, const char *to,
                   cm_buf *out) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    char *old = cm_gguf_get_str(g, "general.architecture");
    const size_t ol = old ? strlen(old) : 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cm_gguf_kv *kv = &g->kv[i];
        const char *k = kv->key;
        char nk[128];
        if (arch && !strcmp(k, "general.architecture")) cm_gguf_w_str(w, k, arch);
        else if (drop_expert_count && strstr(k, ".expert_count")) continue;
        else if (arch && old && !strncmp(k, old, ol) && k[ol] == '.' &&
                 (kv->type == CM_GGUF_U32 || kv->type == CM_GGUF_F32)) {
            snprintf(nk, sizeof nk, "%s%s", arch, k + ol); /* "<arch>.<suffix>" */
            if (kv->type == CM_GGUF_U32) cm_gguf_w_u32(w, nk, (uint32_t)kv->v.u64);
            else cm_gguf_w_f32(w, nk, (float)kv->v.f64);
        } else cm_gguf_w_copy_kv(w, kv);
    }
    cm_free(old);
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

static void test_moe_refusals(void) {
    fx f;
    if (fx_open(&f, "qwen3moe", "q8_0", 8, 2, 0, 9)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    /* tensor-parallel slices */
    cm_slice s = cm_slice_full(&f.m);
    CHECK(cm_slice_check(&f.m, s, errbuf, sizeof errbuf) == 0);
    s.h1 = 1;
    CHECK(cm_slice_check(&f.m, s, errbuf, sizeof errbuf) == CM_EUNSUPPORTED && strstr(errbuf, "tensor-parallel") &&
          strstr(errbuf, "qwen3moe"));
    s = cm_slice_full(&f.m);
    s.f1 = 256;
    CHECK(cm_slice_check(&f.m, s, errbuf, sizeof errbuf) == CM_EUNSUPPORTED);
    /* an unknown architecture: one line naming it and every supported one */
    cm_buf b;
    cm_buf_init(&b);
    CHECK(rewrite(&f.g, "grok", 0, NULL, NULL, &b) == 0);
    CHECK(load_err(&b) == CM_EUNSUPPORTED && strstr(errbuf, "'grok'") && strstr(errbuf, "qwen3moe") &&
          strstr(errbuf, "qwen2moe") && strstr(errbuf, "llama") && !strchr(errbuf, '\n'));
    printf("# %s\n", errbuf);
    cm_buf_release(&b);
    /* a qwen3moe file without expert_count */
    cm_buf_init(&b);
    CHECK(rewrite(&f.g, NULL, 1, NULL, NULL, &b) == 0);
    CHECK(load_err(&b) == CM_EFORMAT && strstr(errbuf, "qwen3moe.expert_count"));
    cm_buf_release(&b);
    /* the old per-expert layout (blk.N.ffn_gate.E.weight) */
    cm_buf_init(&b);
    CHECK(rewrite(&f.g, NULL, 0, "blk.1.ffn_norm.weight", "blk.0.ffn_gate.0.weight", &b) == 0);
    CHECK(load_err(&b) == CM_EUNSUPPORTED && strstr(errbuf, "blk.0.ffn_gate.0.weight"));
    cm_buf_release(&b);
    /* merged gate/up experts (newer llama.cpp conversions) */
    cm_buf_init(&b);
    CHECK(rewrite(&f.g, NULL, 0, "blk.1.ffn_norm.weight", "blk.0.ffn_gate_up_exps.weight", &b) == 0);
    CHECK(load_err(&b) == CM_EUNSUPPORTED && strstr(errbuf, "merged gate/up"));
    cm_buf_release(&b);
    /* a missing expert tensor */
    cm_buf_init(&b);
    CHECK(rewrite(&f.g, NULL, 0, "blk.1.ffn_up_exps.weight", "blk.1.ffn_up_exps.bias", &b) == 0);
    CHECK(load_err(&b) == CM_EFORMAT && strstr(errbuf, "blk.1.ffn_up_exps.weight"));
    cm_buf_release(&b);
    fx_close(&f);
    /* experts on an architecture that has none */
    fx q;
    if (fx_open(&q, "qwen2moe", "q8_0", 8, 2, 256, 9)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    cm_buf_init(&b);
    CHECK(rewrite(&q.g, "qwen2", 0, NULL, NULL, &b) == 0);
    CHECK(load_err(&b) == CM_EUNSUPPORTED && strstr(errbuf, "experts"));
    cm_buf_release(&b);
    fx_close(&q);
}

int main(void) {
    if (cm_gguf_open(&g_vocab, t_shared("vocab/ggml-vocab-llama-spm.gguf"), NULL, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_moe_grouping_invariance);
    RUN(test_moe_repacked_experts);
    RUN(test_moe_exactly_k);
    RUN(test_moe_counts);
    RUN(test_moe_refusals);
    cm_gguf_close(&g_vocab);
    TEST_END();
}
