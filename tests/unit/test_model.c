/*
 * test_model.c: the model loader and forward pass on small random-weight
 * models of every supported architecture (llama tied/untied, llama with
 * Llama-3 rope_freqs, qwen2 with QKV bias, qwen3 with Q/K norm), made here
 * with the GGUF writer from a fixed seed and the stories260K vocabulary.
 *
 * - Loader errors name the culprit (unknown arch, missing tensor, bad shape,
 *   unsupported type).
 * - Teacher-forced probabilities and greedy ids against llama.cpp: the
 *   numbers in tests/data/arch_ref.txt were produced once by
 *   ../shared/oracle/probs.mjs + greedy.mjs (node-llama-cpp 3.21.1, 1
 *   thread, F32 KV) on the files `test_model --write DIR` writes.
 * - Pipeline stages and tensor-parallel slices equal the whole model on the
 *   NEOX / bias / Q-K-norm paths that stories260K does not exercise.
 */
#include "test.h"
#include "fixtures.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/model.h"

#include <pthread.h>

typedef struct synth {
    const char *name;  /* file stem */
    const char *arch;  /* "llama", "qwen2", "qwen3" */
    enum cm_type type; /* matrices */
    int E, L, H, HKV, D, F;
    bool tied, rope_freqs;
    float rope_base;
    uint64_t seed;
    const char *omit; /* leave this tensor out (error tests) */
    const char *i32;  /* write this tensor as I32 (error tests) */
    int bad_k_rows;   /* nonzero: attn_k rows (error tests) */
} synth;

static const synth k_models[] = {
    {"llama-f32", "llama", CM_TYPE_F32, 64, 2, 4, 2, 16, 128, false, false, 10000, 11, NULL, NULL, 0},
    {"llama-tied-q8_0", "llama", CM_TYPE_Q8_0, 64, 2, 4, 2, 16, 128, true, false, 10000, 12, NULL, NULL, 0},
    {"llama3-f32", "llama", CM_TYPE_F32, 64, 2, 4, 1, 16, 128, false, true, 500000, 13, NULL, NULL, 0},
    {"qwen2-f32", "qwen2", CM_TYPE_F32, 64, 2, 4, 2, 16, 128, true, false, 1000000, 14, NULL, NULL, 0},
    {"qwen3-f32", "qwen3", CM_TYPE_F32, 64, 2, 4, 2, 32, 128, true, false, 1000000, 15, NULL, NULL, 0},
    {"qwen3-q4_0", "qwen3", CM_TYPE_Q4_0, 64, 2, 4, 2, 32, 128, false, false, 1000000, 16, NULL, NULL, 0},
};

static char errbuf[512];
static cm_gguf g_vocab;

/* Buffers the writer references until it writes. */
typedef struct pool_bufs {
    void *p[256];
    int n;
} pool_bufs;
static void *keep(pool_bufs *b, size_t n) {
    void *p = cm_calloc(1, n ? n : 1);
    CM_ASSERT(p && b->n < 256);
    return b->p[b->n++] = p;
}

static void add_tensor(cm_gguf_writer *w, pool_bufs *bufs, cm_rng *r, const synth *s, const char *name,
                       enum cm_type type, int64_t ne0, int64_t ne1, float lo, float hi) {
    int64_t n = ne0 * ne1;
    float *f = keep(bufs, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = lo + (hi - lo) * cm_rng_uniform(r); /* drawn even if omitted */
    if (s->omit && !strcmp(s->omit, name)) return;
    int64_t ne[2] = {ne0, ne1};
    if (s->i32 && !strcmp(s->i32, name)) type = CM_TYPE_I32; /* same bytes as f32 */
    void *data = f;
    if (type != CM_TYPE_F32 && type != CM_TYPE_I32) {
        data = keep(bufs, cm_row_size(type, ne0) * (size_t)ne1);
        cm_quantize_rows(type, f, data, ne1, ne0);
    }
    cm_gguf_w_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, data);
}

/* Build a model file into out. */
static int make_model(const synth *s, cm_buf *out) {
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    pool_bufs bufs = {.n = 0};
    cm_rng r;
    cm_rng_seed(&r, s->seed);
    char k[128];
    cm_gguf_w_str(w, "general.architecture", s->arch);
    cm_gguf_w_str(w, "general.name", s->name);
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", s->arch, suffix), k)
    cm_gguf_w_u32(w, KEY("context_length"), 256);
    cm_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)s->E);
    cm_gguf_w_u32(w, KEY("block_count"), (uint32_t)s->L);
    cm_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)s->F);
    cm_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)s->H);
    cm_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->HKV);
    cm_gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)s->D);
    cm_gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)s->D);
    cm_gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)s->D);
    cm_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    cm_gguf_w_f32(w, KEY("rope.freq_base"), s->rope_base);
#undef KEY
    for (uint64_t i = 0; i < g_vocab.n_kv; i++)
        if (!strncmp(g_vocab.kv[i].key, "tokenizer.", 10)) cm_gguf_w_copy_kv(w, &g_vocab.kv[i]);
    const int E = s->E, V = 512, QD = s->H * s->D, KD = s->HKV * s->D, F = s->F;
    const float ae = 1.0f, aw = 1.7f / sqrtf((float)E), ad = 1.7f / sqrtf((float)F), ao = 1.7f / sqrtf((float)QD);
    add_tensor(w, &bufs, &r, s, "token_embd.weight", s->type, E, V, -ae, ae);
    add_tensor(w, &bufs, &r, s, "output_norm.weight", CM_TYPE_F32, E, 1, 0.8f, 1.2f);
    if (!s->tied) add_tensor(w, &bufs, &r, s, "output.weight", s->type, E, V, -3 * aw, 3 * aw);
    if (s->rope_freqs) add_tensor(w, &bufs, &r, s, "rope_freqs.weight", CM_TYPE_F32, s->D / 2, 1, 1.0f, 8.0f);
    for (int il = 0; il < s->L; il++) {
        char n[64];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d.%s", il, suffix), n)
        add_tensor(w, &bufs, &r, s, T("attn_norm.weight"), CM_TYPE_F32, E, 1, 0.8f, 1.2f);
        add_tensor(w, &bufs, &r, s, T("attn_q.weight"), s->type, E, QD, -aw, aw);
        add_tensor(w, &bufs, &r, s, T("attn_k.weight"), s->type, E, s->bad_k_rows ? s->bad_k_rows : KD, -aw, aw);
        add_tensor(w, &bufs, &r, s, T("attn_v.weight"), s->type, E, KD, -aw, aw);
        add_tensor(w, &bufs, &r, s, T("attn_output.weight"), s->type, QD, E, -ao, ao);
        if (!strcmp(s->arch, "qwen2")) {
            add_tensor(w, &bufs, &r, s, T("attn_q.bias"), CM_TYPE_F32, QD, 1, -0.5f, 0.5f);
            add_tensor(w, &bufs, &r, s, T("attn_k.bias"), CM_TYPE_F32, KD, 1, -0.5f, 0.5f);
            add_tensor(w, &bufs, &r, s, T("attn_v.bias"), CM_TYPE_F32, KD, 1, -0.5f, 0.5f);
        }
        if (!strcmp(s->arch, "qwen3")) {
            add_tensor(w, &bufs, &r, s, T("attn_q_norm.weight"), CM_TYPE_F32, s->D, 1, 0.5f, 1.5f);
            add_tensor(w, &bufs, &r, s, T("attn_k_norm.weight"), CM_TYPE_F32, s->D, 1, 0.5f, 1.5f);
        }
        add_tensor(w, &bufs, &r, s, T("ffn_norm.weight"), CM_TYPE_F32, E, 1, 0.8f, 1.2f);
        add_tensor(w, &bufs, &r, s, T("ffn_gate.weight"), s->type, E, F, -aw, aw);
        add_tensor(w, &bufs, &r, s, T("ffn_up.weight"), s->type, E, F, -aw, aw);
        /* ffn_down's rows (F = 128) fit every block size used here. */
        add_tensor(w, &bufs, &r, s, T("ffn_down.weight"), s->type, F, E, -ad, ad);
#undef T
    }
    int rc = cm_gguf_writer_write_buf(w, out, errbuf, sizeof errbuf);
    cm_gguf_writer_free(w);
    for (int i = 0; i < bufs.n; i++) cm_free(bufs.p[i]);
    return rc;
}

typedef struct loaded {
    cm_buf bytes;
    cm_gguf g;
    cm_model m;
} loaded;

static int load_synth(const synth *s, loaded *L) {
    memset(L, 0, sizeof *L);
    cm_buf_init(&L->bytes);
    int rc = make_model(s, &L->bytes);
    if (rc) return rc;
    if ((rc = cm_gguf_parse(&L->g, (const uint8_t *)L->bytes.data, L->bytes.len, errbuf, sizeof errbuf))) return rc;
    return cm_model_load(&L->m, &L->g, errbuf, sizeof errbuf);
}

static void unload(loaded *L) {
    cm_model_release(&L->m);
    cm_gguf_close(&L->g);
    cm_buf_release(&L->bytes);
}

static void test_load_errors(void) {
    synth s = k_models[0];
    loaded L;
    s.arch = "gpt9";
    CHECK(load_synth(&s, &L) == CM_EUNSUPPORTED && strstr(errbuf, "unknown architecture 'gpt9'"));
    unload(&L);
    s = k_models[0];
    s.omit = "blk.1.ffn_up.weight";
    CHECK(load_synth(&s, &L) == CM_EFORMAT && strstr(errbuf, "missing tensor 'blk.1.ffn_up.weight'"));
    unload(&L);
    s = k_models[3];
    s.omit = "blk.0.attn_k.bias";
    CHECK(load_synth(&s, &L) == CM_EFORMAT && strstr(errbuf, "missing tensor 'blk.0.attn_k.bias'"));
    unload(&L);
    s = k_models[4];
    s.omit = "blk.1.attn_q_norm.weight";
    CHECK(load_synth(&s, &L) == CM_EFORMAT && strstr(errbuf, "'blk.1.attn_q_norm.weight'"));
    unload(&L);
    s = k_models[0];
    s.i32 = "blk.0.attn_v.weight";
    CHECK(load_synth(&s, &L) == CM_EUNSUPPORTED && strstr(errbuf, "'blk.0.attn_v.weight' has unsupported type i32"));
    unload(&L);
    s = k_models[0];
    s.bad_k_rows = 48;
    CHECKF(load_synth(&s, &L) == CM_EFORMAT && strstr(errbuf, "has shape [64, 48], expected [64, 32]"), "%s", errbuf);
    unload(&L);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void softmax_d(const float *x, int n, double *p) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += (p[i] = exp((double)x[i] - mx));
    for (int i = 0; i < n; i++) p[i] /= s;
}

/* The teacher-forced sequence the references use. */
static const int32_t k_seq[8] = {1, 403, 407, 261, 378, 432, 383, 286};

/* Logits at all 8 positions, whole model, one batch. */
static int run_all(const cm_model *m, float *logits) {
    cm_ctx *c = cm_ctx_new(m, 8, 256, NULL, errbuf, sizeof errbuf);
    cm_kv kv;
    cm_kv_init(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 256, errbuf, sizeof errbuf);
    int32_t pos[8], seq[8] = {0};
    int8_t want[8];
    for (int i = 0; i < 8; i++) pos[i] = i, want[i] = 1;
    cm_kv *kvs[1] = {&kv};
    cm_batch b = {.n = 8, .tokens = k_seq, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = m->hp.n_layer,
                         .slice = cm_slice_full(m),
                         .kvs = kvs,
                         .n_kvs = 1,
                         .out_logits = logits};
    int rc = cm_forward(c, &b, &a, errbuf, sizeof errbuf);
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return rc;
}

/* Reference file: "name pos id:p id:p ..." (top 16 probabilities), and
 * "name greedy prompt_ids... : generated_ids..." */
static char *g_ref;

static void test_vs_llama_cpp(void) {
    for (size_t mi = 0; mi < CM_ARRAY_LEN(k_models); mi++) {
        const synth *s = &k_models[mi];
        loaded L;
        if (load_synth(s, &L)) {
            CHECKF(0, "%s: %s", s->name, errbuf);
            unload(&L);
            continue;
        }
        static float logits[8 * 512];
        CHECK(run_all(&L.m, logits) == 0);
        double worst = 0;
        int rows = 0;
        char key[64];
        snprintf(key, sizeof key, "\n%s ", s->name);
        for (const char *p = strstr(g_ref, key); p; p = strstr(p + 1, key)) {
            const char *q = p + strlen(key);
            if (!strncmp(q, "greedy", 6)) continue;
            char *e;
            int pos = (int)strtol(q, &e, 10);
            double pr[512];
            softmax_d(logits + pos * 512, 512, pr);
            q = e;
            while (*q == ' ') {
                int id = (int)strtol(q, &e, 10);
                double ref = strtod(e + 1, &e);
                q = e;
                worst = fmax(worst, fabs(pr[id] - ref));
            }
            rows++;
        }
        /* F32: the summation order differs (SIMD lanes), ~1e-6; Q8_0/Q4_0: the
         * same integer dot products, so only float rounding again, but a
         * rounding flip in an 8-bit activation moves a probability by ~1e-4. */
        double bound = s->type == CM_TYPE_F32 ? 1e-4 : 1e-3;
        printf("# %-16s max |p - p_llama.cpp| over top-16 x 8 positions = %.3g\n", s->name, worst);
        CHECKF(rows == 8, "%s: %d reference rows", s->name, rows);
        CHECKF(worst <= bound, "%s: max prob error %g > %g", s->name, worst, bound);
        /* Greedy continuation. */
        snprintf(key, sizeof key, "\n%s greedy", s->name);
        const char *p = strstr(g_ref, key);
        CHECKF(p != NULL, "%s: no greedy reference", s->name);
        if (p) {
            p += strlen(key);
            int32_t prompt[32], gen[64];
            int np = 0, ng = 0;
            char *e;
            while (*p == ' ' && p[1] != ':') prompt[np++] = (int32_t)strtol(p, &e, 10), p = e;
            p += 2;
            while (*p == ' ') gen[ng++] = (int32_t)strtol(p, &e, 10), p = e;
            cm_ctx *c = cm_ctx_new(&L.m, 32, 256, NULL, errbuf, sizeof errbuf);
            cm_kv kv;
            cm_kv_init(&kv, &L.m, 0, L.m.hp.n_layer, cm_slice_full(&L.m), 256, errbuf, sizeof errbuf);
            float lg[512];
            cm_forward_simple(c, &kv, prompt, np, lg, errbuf, sizeof errbuf);
            int same = 0;
            for (; same < ng; same++) {
                int32_t t = argmax(lg, 512);
                if (t != gen[same]) break;
                cm_forward_simple(c, &kv, &t, 1, lg, errbuf, sizeof errbuf);
            }
            CHECKF(ng > 0 && same == ng, "%s: greedy ids differ from llama.cpp at %d of %d", s->name, same, ng);
            cm_kv_release(&kv);
            cm_ctx_free(c);
        }
        unload(&L);
    }
}

/* Stages and slices equal the whole model (NEOX, biases, Q/K norm, GQA 4:1). */
typedef struct tp_member {
    fx_tp_rank tr; /* the all-reduce gets &tr */
    const cm_model *m;
    cm_slice slice;
    float logits[8 * 512];
    int rc;
} tp_member;

static void *tp_main(void *arg) {
    tp_member *me = arg;
    cm_ctx *c = cm_ctx_new(me->m, 8, 256, NULL, NULL, 0);
    cm_kv kv;
    if ((me->rc = cm_kv_init(&kv, me->m, 0, me->m->hp.n_layer, me->slice, 64, NULL, 0))) return NULL;
    int32_t pos[8], seq[8] = {0};
    int8_t want[8];
    for (int i = 0; i < 8; i++) pos[i] = i, want[i] = 1;
    cm_kv *kvs[1] = {&kv};
    cm_batch b = {.n = 8, .tokens = k_seq, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = me->m->hp.n_layer,
                         .slice = me->slice,
                         .kvs = kvs,
                         .n_kvs = 1,
                         .allreduce = fx_tp_allreduce,
                         .allreduce_user = &me->tr,
                         .out_logits = me->logits};
    me->rc = cm_forward(c, &b, &a, NULL, 0);
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return NULL;
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void test_stages_and_slices(void) {
    for (size_t mi = 0; mi < CM_ARRAY_LEN(k_models); mi++) {
        const synth *s = &k_models[mi];
        loaded L;
        if (load_synth(s, &L)) {
            CHECKF(0, "%s: %s", s->name, errbuf);
            unload(&L);
            continue;
        }
        const cm_model *m = &L.m;
        static float whole[8 * 512], staged[8 * 512];
        CHECK(run_all(m, whole) == 0);
        /* Two stages: [0,1) then [1,2). */
        cm_ctx *c = cm_ctx_new(m, 8, 256, NULL, errbuf, sizeof errbuf);
        cm_kv k1, k2;
        cm_kv_init(&k1, m, 0, 1, cm_slice_full(m), 64, errbuf, sizeof errbuf);
        cm_kv_init(&k2, m, 1, 2, cm_slice_full(m), 64, errbuf, sizeof errbuf);
        int32_t pos[8], seq[8] = {0};
        int8_t want[8];
        float hidden[8 * 64];
        for (int i = 0; i < 8; i++) pos[i] = i, want[i] = 1;
        cm_kv *a1[1] = {&k1}, *a2[1] = {&k2};
        cm_batch b1 = {.n = 8, .tokens = k_seq, .pos = pos, .seq = seq};
        cm_forward_args f1 = {
            .layer_first = 0, .layer_last = 1, .slice = cm_slice_full(m), .kvs = a1, .n_kvs = 1, .out_hidden = hidden};
        cm_batch b2 = {.n = 8, .embd = hidden, .pos = pos, .seq = seq, .logits = want};
        cm_forward_args f2 = {
            .layer_first = 1, .layer_last = 2, .slice = cm_slice_full(m), .kvs = a2, .n_kvs = 1, .out_logits = staged};
        CHECK(cm_forward(c, &b1, &f1, errbuf, sizeof errbuf) == 0);
        CHECK(cm_forward(c, &b2, &f2, errbuf, sizeof errbuf) == 0);
        CHECKF(max_diff(whole, staged, 8 * 512) == 0, "%s: stages differ by %g", s->name,
               max_diff(whole, staged, 8 * 512));
        cm_kv_release(&k1);
        cm_kv_release(&k2);
        cm_ctx_free(c);
        /* Slices: one per KV head (FFN split unevenly), plus an FFN-only member. */
        int nk = m->hp.n_head_kv, F = m->hp.n_ff;
        cm_slice sl[4];
        int n = 0;
        int bd = cm_type_traits_of(m->layers[0].ffn_down.type)->block_size;
        for (int h = 0; h < nk; h++) sl[n++] = (cm_slice){h, h + 1, 0, 0};
        sl[n++] = (cm_slice){nk, nk, 0, 0};
        sl[0].f1 = bd; /* uneven FFN rows, on ffn_down block boundaries */
        for (int i = 1; i < n; i++) sl[i].f0 = sl[i - 1].f1, sl[i].f1 = i == n - 1 ? F : sl[i].f0 + bd;
        fx_tp_group g;
        fx_tp_group_init(&g, n);
        static tp_member mem[4];
        pthread_t th[4];
        for (int i = 0; i < n; i++) {
            mem[i] = (tp_member){.tr = {&g, i}, .m = m, .slice = sl[i]};
            CHECKF(cm_slice_check(m, sl[i], errbuf, sizeof errbuf) == 0, "%s", errbuf);
            pthread_create(&th[i], NULL, tp_main, &mem[i]);
        }
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < n; i++) {
            CHECK(mem[i].rc == 0);
            /* Partial sums in another order: equal to float rounding. */
            double d = max_diff(whole, mem[i].logits, 8 * 512);
            CHECKF(d < 1e-3, "%s: slice member %d logits differ by %g", s->name, i, d);
            for (int r = 0; r < 8; r++) CHECK(argmax(whole + r * 512, 512) == argmax(mem[i].logits + r * 512, 512));
        }
        fx_tp_group_destroy(&g);
        unload(&L);
    }
}

/* Bad batches are errors that leave the caches alone. */
static void test_forward_errors(void) {
    loaded L;
    CHECK(load_synth(&k_models[0], &L) == 0);
    const cm_model *m = &L.m;
    cm_ctx *c = cm_ctx_new(m, 4, 8, NULL, errbuf, sizeof errbuf);
    cm_kv kv;
    CHECK(cm_kv_init(&kv, m, 0, 2, cm_slice_full(m), 8, errbuf, sizeof errbuf) == 0);
    float lg[512];
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bad = 512;
    CHECK(cm_forward_simple(c, &kv, &bad, 1, lg, errbuf, sizeof errbuf) == CM_EINVAL && strstr(errbuf, "token id 512"));
    CHECK(kv.n_past == 0);
    CHECK(cm_forward_simple(c, &kv, ids, 8, lg, errbuf, sizeof errbuf) == 0 && kv.n_past == 8);
    CHECK(cm_forward_simple(c, &kv, ids, 1, lg, errbuf, sizeof errbuf) == CM_ENOSPACE && kv.n_past == 8);
    int32_t pos[5] = {0, 1, 2, 3, 4}, seq[5] = {0};
    cm_kv *kvs[1] = {&kv};
    cm_kv_truncate(&kv, 0);
    cm_batch b = {.n = 5, .tokens = ids, .pos = pos, .seq = seq};
    cm_forward_args a = {
        .layer_first = 0, .layer_last = 2, .slice = cm_slice_full(m), .kvs = kvs, .n_kvs = 1, .out_logits = lg};
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == CM_EINVAL); /* more than max_batch */
    b.n = 2;
    seq[1] = 1;
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == CM_EINVAL); /* no such sequence */
    seq[1] = 0;
    a.slice.h1 = 3;
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == CM_EINVAL); /* slice out of range */
    a.slice = (cm_slice){0, 1, 0, 128};
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == CM_EINVAL); /* kv made for another slice */
    a.slice = cm_slice_full(m);
    b.tokens = NULL;
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == CM_EINVAL); /* no input */
    CHECK(kv.n_past == 0);
    cm_kv_release(&kv);
    cm_kv_release(&kv); /* released twice: a no-op */
    CHECK(cm_kv_init(&kv, m, 1, 1, cm_slice_full(m), 8, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECK(cm_ctx_new(m, 0, 8, NULL, errbuf, sizeof errbuf) == NULL);
    cm_ctx_free(c);
    cm_ctx_free(NULL);
    unload(&L);
}

/* `test_model --write DIR`: write the models for the oracle. */
static int write_models(const char *dir) {
    for (size_t mi = 0; mi < CM_ARRAY_LEN(k_models); mi++) {
        cm_buf b;
        cm_buf_init(&b);
        if (make_model(&k_models[mi], &b)) {
            fprintf(stderr, "%s\n", errbuf);
            return 1;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, k_models[mi].name);
        if (cm_file_write_atomic(path, b.data, b.len, 0644, errbuf, sizeof errbuf)) {
            fprintf(stderr, "%s\n", errbuf);
            return 1;
        }
        cm_buf_release(&b);
        printf("%s\n", path);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (cm_gguf_open(&g_vocab, t_shared("models/stories260K-f32.gguf"), NULL, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    if (argc == 3 && !strcmp(argv[1], "--write")) return write_models(argv[2]);
    size_t n;
    const char *dir = getenv("CUMULO_TESTDATA");
    char path[512];
    snprintf(path, sizeof path, "%s/arch_ref.txt", dir && *dir ? dir : "tests/data");
    if (cm_file_read_all(path, &g_ref, &n, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_load_errors);
    RUN(test_forward_errors);
    RUN(test_vs_llama_cpp);
    RUN(test_stages_and_slices);
    cm_free(g_ref);
    cm_gguf_close(&g_vocab);
    TEST_END();
}
