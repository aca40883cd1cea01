/*
 * test_mla.c: deepseek2's multi-head latent attention (src/model/mla.c)
 * beyond the llama.cpp comparison of test_synth_golden.c: the cache holds
 * one latent row (kv_lora_rank + rope dims) per token and layer; results do
 * not depend on how tokens are batched, on the thread count, on sequences
 * sharing a batch, on a pipeline split or on a truncated and refilled cache;
 * an F16 cache gives llama.cpp's F16-cache numbers; a tensor-parallel group
 * of query-head slices (the latent cached whole on each member) gives one
 * machine's logits; and the layouts we do not run are one-line
 * errors that name what is wrong (a slice without experts, an attn_kv_b
 * in a split file, an unknown rope scaling); the unsplit attn_kv_b of older
 * files is split at load (llama.cpp's numbers: test_synth_golden).
 */
#include "test.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>

static char errbuf[512];
static cm_gguf g_vocab;

typedef struct fx {
    cm_buf file;
    cm_gguf g;
    cm_model m;
} fx;

static int fx_write(fx *f, const char *variant, const char *type) {
    memset(f, 0, sizeof *f);
    cm_buf_init(&f->file);
    const bool lite = !strncmp(variant, "lite", 4);
    cm_synth_params sp = {.arch = "deepseek2",
                          .variant = variant,
                          .n_embd = 256,
                          .n_layer = 3,
                          .n_head = 4,
                          .n_head_kv = 4,
                          .n_ff = 768,
                          .n_ctx = 256,
                          .type = type,
                          .seed = 77,
                          .n_threads = 2,
                          .n_expert = lite ? 8 : 16,
                          .n_expert_used = lite ? 2 : 4,
                          .n_ff_exp = 256};
    return cm_synth_write(&sp, &g_vocab, NULL, &f->file, errbuf, sizeof errbuf);
}

static int fx_load(fx *f) {
    if (cm_gguf_parse(&f->g, (const uint8_t *)f->file.data, f->file.len, errbuf, sizeof errbuf)) return -1;
    return cm_model_load(&f->m, &f->g, errbuf, sizeof errbuf);
}

static int fx_open(fx *f, const char *variant, const char *type) {
    if (fx_write(f, variant, type) || fx_load(f)) {
        fprintf(stderr, "  deepseek2 %s %s: %s\n", variant, type, errbuf);
        return -1;
    }
    return 0;
}

static void fx_close(fx *f) {
    cm_model_release(&f->m);
    cm_gguf_close(&f->g);
    cm_buf_release(&f->file);
}

/* Replace every occurrence of the n bytes `from` in the file by `to`. */
#define PATCH(b, from, to) patch_n(b, from, to, sizeof(from) - 1)
static int patch_n(cm_buf *b, const char *from, const char *to, size_t n) {
    int hits = 0;
    for (size_t i = 0; i + n <= b->len; i++)
        if (!memcmp(b->data + i, from, n)) memcpy(b->data + i, to, n), hits++;
    return hits;
}

#define NTOK 12
static const int32_t k_prompt[NTOK] = {1, 450, 4996, 17354, 1701, 432, 12500, 975, 15043, 29892, 920, 338};

/* ---- 8-bit rounding ties (the tensor-parallel check) ----
 * A group's all-reduced sums round in another order than one machine's, so
 * its residual stream differs from one machine's in the last bits (~1e-7).
 * Converting activations to Q8_0 absorbs that unless an element lies within
 * those bits of a rounding tie; then one byte moves by one step and the
 * logits by ~1e-1 (lite, with q8_0's avx512 block lane order: L2's
 * attention input, row 2, column 56, x/d = -22.50507 vs -22.50508). Which
 * inputs sit at such a tie depends on the sum order, not on correctness.
 * So run() records one machine's Q8_0 activations (g_ties) and each member
 * rounds a block as one machine did wherever the block's floats agree with
 * one machine's to 1e-6 of the block's largest: a tie. A wrong slice, sum or
 * gather changes the floats by far more, is left alone, and fails as before. */
typedef struct tie_rec {
    int layer, site, row;
    int64_t col0, n;
    float *x;
    void *q;
} tie_rec;
typedef struct tie_log {
    tie_rec *r;
    int n, cap;
} tie_log;
static tie_log *g_ties; /* set: run() records into it */

static void tie_record(void *user, int layer, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt,
                       const float *x, void *xq, int64_t n) {
    tie_log *L = user;
    if (vdt != CM_TYPE_Q8_0) return;
    if (L->n == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 256;
        tie_rec *r = cm_malloc((size_t)L->cap * sizeof *r);
        if (L->n) memcpy(r, L->r, (size_t)L->n * sizeof *r);
        cm_free(L->r);
        L->r = r;
    }
    tie_rec *r = &L->r[L->n++];
    *r =
        (tie_rec){layer, (int)site, row, col0, n, cm_malloc((size_t)n * sizeof(float)), cm_malloc(cm_row_size(vdt, n))};
    memcpy(r->x, x, (size_t)n * sizeof(float));
    memcpy(r->q, xq, cm_row_size(vdt, n));
}

static void tie_free(tie_log *L) {
    for (int i = 0; i < L->n; i++) cm_free(L->r[i].x), cm_free(L->r[i].q);
    cm_free(L->r);
    *L = (tie_log){0};
}

/* Logits of every position, the prompt fed in batches of `step` tokens (kv
 * type kt); with `cut` > 0 the cache is truncated to `cut` positions after
 * the whole prompt and refilled from there. */
static int run(const cm_model *m, cm_pool *pool, int step, enum cm_type kt, int cut, float *out) {
    const int V = m->hp.n_vocab;
    cm_ctx *c = cm_ctx_new(m, NTOK, 64, pool, errbuf, sizeof errbuf);
    if (c && g_ties) cm_ctx_set_act_hook(c, tie_record, g_ties);
    cm_kv kv;
    if (!c || cm_kv_init_type(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 64, kt, errbuf, sizeof errbuf)) {
        cm_ctx_free(c);
        return -1;
    }
    int rc = 0;
    for (int pass = 0; pass < (cut ? 2 : 1) && !rc; pass++) {
        if (pass) cm_kv_truncate(&kv, cut);
        for (int done = pass ? cut : 0; done < NTOK && !rc; done += step) {
            const int nb = CM_MIN(step, NTOK - done);
            int32_t pos[NTOK], seq[NTOK];
            int8_t want[NTOK];
            for (int i = 0; i < nb; i++) pos[i] = done + i, seq[i] = 0, want[i] = 1;
            cm_kv *kvs[1] = {&kv};
            cm_batch b = {.n = nb, .tokens = k_prompt + done, .pos = pos, .seq = seq, .logits = want};
            cm_forward_args a = {.layer_first = 0,
                                 .layer_last = m->hp.n_layer,
                                 .slice = cm_slice_full(m),
                                 .kvs = kvs,
                                 .n_kvs = 1,
                                 .out_logits = out + (size_t)done * V};
            rc = cm_forward(c, &b, &a, errbuf, sizeof errbuf);
        }
    }
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return rc;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* The cache is the latent: n_layer x n_ctx x (kv_lora_rank + rope) floats. */
static void test_mla_kv_is_latent(void) {
    fx f;
    if (fx_open(&f, "v3", "q8_0")) {
        CHECK(0);
        return;
    }
    const cm_hparams *hp = &f.m.hp;
    CHECK(hp->n_head_kv == 1 && hp->head_dim == 256 + 32 && hp->mla.kv_lora == 256 && hp->mla.head_k == 96 &&
          hp->mla.head_v == 64 && hp->n_rot == 32 && hp->n_dense_lead == 1 && hp->expert_sigmoid &&
          hp->n_expert_groups == 4 && hp->n_group_used == 2 && hp->expert_norm && hp->n_ff_shexp == 256);
    CHECK(fabsf(hp->expert_scale - 2.5f) < 1e-6f && fabsf(hp->mla.kq_scale - 1.0f / sqrtf(96.0f)) < 1e-7f);
    CHECK(cm_kv_bytes(&f.m, 0, 3, 0, 1, 100) == 3ull * 100 * 288 * 4);
    CHECK(cm_kv_bytes(&f.m, 1, 3, 0, 1, 100) == 2ull * 100 * 288 * 4);
    /* a dense layer first, then experts with V3's selection bias */
    CHECK(f.m.layers[0].ffn_gate.data && !f.m.layers[0].ffn_gate_inp.data);
    CHECK(f.m.layers[1].ffn_gate_inp.data && f.m.layers[1].ffn_exp_probs_b.data && f.m.layers[1].wq_a.data &&
          !f.m.layers[1].wq.data && !f.m.layers[1].ffn_gate_inp_shexp.data);
    fx_close(&f);
    if (fx_open(&f, "lite", "q4_k")) {
        CHECK(0);
        return;
    }
    CHECK(f.m.hp.mla.q_lora == 0 && f.m.layers[0].wq.data && !f.m.layers[0].wq_a.data && !f.m.hp.expert_sigmoid &&
          !f.m.hp.expert_norm && f.m.hp.n_expert_groups == 0 && f.m.hp.n_ff_shexp == 512 &&
          !f.m.layers[1].ffn_exp_probs_b.data);
    fx_close(&f);
}

/* One batch, token by token, steps of 5, 1 or 2 threads, a truncated and
 * refilled cache: the same bits. An F16 cache: close. */
static void test_mla_batch_invariant(void) {
    const char *vs[] = {"v3", "lite", "v3yarn", "litekvb"};
    const char *ts[] = {"q8_0", "q4_k", "f32", "q8_0"};
    cm_pool *pool = cm_pool_new(2);
    for (int i = 0; i < 4; i++) {
        fx f;
        if (fx_open(&f, vs[i], ts[i])) {
            CHECK(0);
            continue;
        }
        const size_t n = (size_t)NTOK * f.m.hp.n_vocab;
        float *a = cm_malloc(n * 4), *b = cm_malloc(n * 4);
        CHECK(run(&f.m, NULL, NTOK, CM_TYPE_F32, 0, a) == 0);
        CHECK(run(&f.m, pool, 1, CM_TYPE_F32, 0, b) == 0);
        CHECKF(max_diff(a, b, n) == 0, "%s: batch vs token by token on 2 threads: %g", vs[i], max_diff(a, b, n));
        CHECK(run(&f.m, pool, 5, CM_TYPE_F32, 6, b) == 0);
        CHECKF(max_diff(a, b, n) == 0, "%s: steps of 5 after a truncation to 6: %g", vs[i], max_diff(a, b, n));
        /* F16 cache: batch invariant too, and not the F32 numbers (these
         * random MoE models move by up to 0.7 of a logit: llama.cpp's F16
         * cache does the same, see test_mla_f16_vs_llama_cpp) */
        CHECK(run(&f.m, pool, NTOK, CM_TYPE_F16, 0, a) == 0);
        CHECK(run(&f.m, NULL, 1, CM_TYPE_F16, 0, b) == 0);
        CHECKF(max_diff(a, b, n) == 0, "%s: F16 cache: batch vs token by token: %g", vs[i], max_diff(a, b, n));
        cm_free(a);
        cm_free(b);
        fx_close(&f);
    }
    cm_pool_free(pool);
}

/* The F16 latent cache against llama.cpp's F16 cache on the same file
 * (tests/data/mla/lite-q4_k-f16kv.json): within the golden test's F16 bound
 * 1e-3 at each listed probability of the positions before the two part,
 * where the F32 cache is off by more: the test tells the two apart. This
 * random MoE model parts at a rounding tie once the Q4_K sums' order differs
 * from llama.cpp's (every table of ours since the avx512 "z4" order:
 * positions 0-6 within 5.1e-7, the F32 cache 2.1e-3..4e-2 there; 7 on up to
 * 0.019); at least 6 positions must agree. */
static void test_mla_f16_vs_llama_cpp(void) {
    char *txt = NULL;
    size_t len;
    CHECK(cm_file_read_all("tests/data/mla/lite-q4_k-f16kv.json", &txt, &len, errbuf, sizeof errbuf) == 0);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    cm_free(txt);
    const cJSON *pos = cJSON_GetObjectItem(j, "positions");
    CHECK(cJSON_IsArray(pos) && cJSON_GetArraySize(pos) == NTOK);
    fx f;
    if (!j || fx_open(&f, "lite", "q4_k")) {
        CHECK(0);
        cJSON_Delete(j);
        return;
    }
    const int V = f.m.hp.n_vocab;
    float *l16 = cm_malloc((size_t)NTOK * V * 4), *l32 = cm_malloc((size_t)NTOK * V * 4);
    CHECK(run(&f.m, NULL, NTOK, CM_TYPE_F16, 0, l16) == 0 && run(&f.m, NULL, NTOK, CM_TYPE_F32, 0, l32) == 0);
    double e16[NTOK] = {0}, e32[NTOK] = {0};
    for (int i = 0; i < NTOK && cJSON_IsArray(pos); i++) {
        const cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(pos, i), "ids");
        const cJSON *ps = cJSON_GetObjectItem(cJSON_GetArrayItem(pos, i), "p");
        for (int which = 0; which < 2; which++) {
            const float *l = (which ? l32 : l16) + (size_t)i * V;
            double mx = -1e30, sum = 0;
            for (int v = 0; v < V; v++) mx = fmax(mx, l[v]);
            for (int v = 0; v < V; v++) sum += exp(l[v] - mx);
            for (int k = 0; k < cJSON_GetArraySize(ids); k++) {
                const int id = cJSON_GetArrayItem(ids, k)->valueint;
                const double e = fabs(exp(l[id] - mx) / sum - cJSON_GetArrayItem(ps, k)->valuedouble);
                if (which) e32[i] = fmax(e32[i], e);
                else e16[i] = fmax(e16[i], e);
            }
        }
    }
    int agree = 0;
    double m16 = 0, m32 = 0;
    while (agree < NTOK && e16[agree] <= 1e-3) {
        m16 = fmax(m16, e16[agree]);
        m32 = fmax(m32, e32[agree]);
        agree++;
    }
    printf("# F16 latent cache vs llama.cpp's F16 cache: positions 0-%d within %.2g (F32 cache: %.2g there)\n",
           agree - 1, m16, m32);
    CHECKF(agree >= 6, "F16 cache: position %d: max |p - p_llama.cpp| = %g > 1e-3", agree,
           agree < NTOK ? e16[agree] : 0);
    CHECKF(m32 > 1e-3, "the F32 cache matches llama.cpp's F16 numbers (%g): the F16 path is not exercised", m32);
    cm_free(l16);
    cm_free(l32);
    fx_close(&f);
    cJSON_Delete(j);
}

/* Two sequences in one batch, interleaved, and a pipeline split [0, 2) +
 * [2, 3): each row equals its sequence run alone. */
static void test_mla_sequences_and_stages(void) {
    fx f;
    if (fx_open(&f, "v3", "q8_0")) {
        CHECK(0);
        return;
    }
    const cm_model *m = &f.m;
    const int V = m->hp.n_vocab, E = m->hp.n_embd;
    float *ref = cm_malloc((size_t)NTOK * V * 4), *got = cm_malloc((size_t)NTOK * V * 4);
    float *hid = cm_malloc((size_t)NTOK * E * 4);
    CHECK(run(m, NULL, NTOK, CM_TYPE_F32, 0, ref) == 0);
    cm_ctx *c = cm_ctx_new(m, NTOK, 64, NULL, errbuf, sizeof errbuf);
    cm_kv k0, k1;
    CHECK(c && !cm_kv_init(&k0, m, 0, 3, cm_slice_full(m), 64, errbuf, sizeof errbuf) &&
          !cm_kv_init(&k1, m, 0, 3, cm_slice_full(m), 64, errbuf, sizeof errbuf));
    /* rows: seq 0 gets prompt[0..6), seq 1 prompt[0..6), alternating */
    int32_t tok[NTOK], pos[NTOK], seq[NTOK];
    int8_t want[NTOK];
    for (int i = 0; i < NTOK; i++) tok[i] = k_prompt[i / 2], pos[i] = i / 2, seq[i] = i % 2, want[i] = 1;
    cm_kv *kvs[2] = {&k0, &k1};
    cm_batch b = {.n = NTOK, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {
        .layer_first = 0, .layer_last = 3, .slice = cm_slice_full(m), .kvs = kvs, .n_kvs = 2, .out_logits = got};
    CHECKF(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    double d = 0;
    for (int i = 0; i < NTOK; i++) d = fmax(d, max_diff(got + (size_t)i * V, ref + (size_t)(i / 2) * V, (size_t)V));
    CHECKF(d == 0, "two interleaved sequences differ from one alone by %g", d);
    /* pipeline: layers [0, 2) give hidden states, [2, 3) the logits */
    cm_kv_truncate(&k0, 0);
    for (int i = 0; i < NTOK; i++) pos[i] = i, seq[i] = 0;
    cm_kv *kv0[1] = {&k0};
    cm_batch b1 = {.n = NTOK, .tokens = k_prompt, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a1 = {
        .layer_first = 0, .layer_last = 2, .slice = cm_slice_full(m), .kvs = kv0, .n_kvs = 1, .out_hidden = hid};
    CHECKF(cm_forward(c, &b1, &a1, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    cm_kv st2;
    CHECK(!cm_kv_init(&st2, m, 2, 3, cm_slice_full(m), 64, errbuf, sizeof errbuf));
    cm_kv *kv2[1] = {&st2};
    cm_batch b2 = {.n = NTOK, .embd = hid, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a2 = {
        .layer_first = 2, .layer_last = 3, .slice = cm_slice_full(m), .kvs = kv2, .n_kvs = 1, .out_logits = got};
    CHECKF(cm_forward(c, &b2, &a2, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    CHECKF(max_diff(got, ref, (size_t)NTOK * V) == 0, "pipeline split differs by %g",
           max_diff(got, ref, (size_t)NTOK * V));
    cm_kv_release(&k0);
    cm_kv_release(&k1);
    cm_kv_release(&st2);
    cm_ctx_free(c);
    cm_free(ref);
    cm_free(got);
    cm_free(hid);
    fx_close(&f);
}

/* The unsplit attn_kv_b of older files: split at load into F32 wk_b (its
 * key rows transposed) and wv_b (its value rows), the cache still the
 * latent; a layer without it is a missing tensor. */
static void test_mla_kv_b_split(void) {
    fx f;
    if (fx_open(&f, "v3kvb", "q4_k")) {
        CHECK(0);
        return;
    }
    const cm_hparams *hp = &f.m.hp;
    CHECK(hp->mla.kv_b && hp->n_head_kv == 1 && hp->head_dim == 256 + 32 && hp->mla.head_k == 96 &&
          hp->mla.head_v == 64);
    CHECK(cm_kv_bytes(&f.m, 0, 3, 0, 1, 100) == 3ull * 100 * 288 * 4);
    float row[256];
    for (int il = 0; il < 3; il++) {
        const cm_layer *L = &f.m.layers[il];
        CHECK(L->wkv_b.type == CM_TYPE_Q4_K && L->wkv_b.ne[0] == 256 && L->wkv_b.ne[1] == 4 * 128);
        CHECK(L->wk_b.type == CM_TYPE_F32 && L->wk_b.ne[0] == 64 && L->wk_b.ne[1] == 256 && L->wk_b.ne[2] == 4);
        CHECK(L->wv_b.type == CM_TYPE_F32 && L->wv_b.ne[0] == 256 && L->wv_b.ne[1] == 64 && L->wv_b.ne[2] == 4);
        int bad = 0;
        for (int h = 0; h < 4; h++)
            for (int r = 0; r < 128; r++) {
                cm_kernels_ref()->to_float[CM_TYPE_Q4_K](
                    (const char *)L->wkv_b.data + (size_t)(h * 128 + r) * L->wkv_b.nb[1], row, 256);
                for (int c = 0; c < 256; c++) {
                    const float *w = r < 64 ? (const float *)L->wk_b.data + ((size_t)h * 256 + c) * 64 + r
                                            : (const float *)L->wv_b.data + ((size_t)h * 64 + r - 64) * 256 + c;
                    bad += *w != row[c];
                }
            }
        CHECKF(bad == 0, "layer %d: %d elements of wk_b / wv_b differ from attn_kv_b's", il, bad);
    }
    fx_close(&f);
    CHECK(fx_write(&f, "v3kvb", "f32") == 0);
    CHECK(PATCH(&f.file, "blk.2.attn_kv_b.weight", "blk.2.attn_kv_x.weight") == 1);
    CHECK(fx_load(&f) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "missing tensor 'blk.2.attn_kv_b.weight'") != NULL, "%s", errbuf);
    fx_close(&f);
}

/* ---- an in-process tensor-parallel group (one thread per member) ---- */
#define TPM 3
typedef struct tp_group {
    int k;
    pthread_barrier_t bar;
    float *x[TPM];
    const int *eb; /* [k + 1] expert bounds */
} tp_group;
typedef struct tp_member {
    tp_group *G;
    const cm_model *m;
    int rank;
    cm_slice sl;
    float *logits; /* [NTOK][V] */
    int rc;
    const tie_log *one; /* one machine's Q8_0 activations */
    int ties;           /* blocks rounded as one machine's */
} tp_member;

/* cm_allreduce_fn: every member sums the partials in rank order. */
static int tp_allreduce(void *user, float *x, int64_t n) {
    tp_member *me = user;
    tp_group *G = me->G;
    G->x[me->rank] = x;
    pthread_barrier_wait(&G->bar);
    float *sum = cm_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        sum[i] = G->x[0][i];
        for (int r = 1; r < G->k; r++) sum[i] += G->x[r][i];
    }
    pthread_barrier_wait(&G->bar);
    memcpy(x, sum, (size_t)n * sizeof(float));
    cm_free(sum);
    return 0;
}

/* cm_expert_gather_fn: copy every other member's expert rows. */
static int tp_gather(void *user, float *y, int64_t row_len, const int32_t *rows, int n_expert) {
    tp_member *me = user;
    tp_group *G = me->G;
    G->x[me->rank] = y;
    pthread_barrier_wait(&G->bar);
    for (int r = 0; r < G->k; r++) {
        if (r == me->rank) continue;
        const int64_t a = rows[G->eb[r]], b = rows[G->eb[r + 1]];
        memcpy(y + a * row_len, G->x[r] + a * row_len, (size_t)((b - a) * row_len) * sizeof(float));
    }
    pthread_barrier_wait(&G->bar);
    (void)n_expert;
    return 0;
}

/* cm_act_hook_fn of a member: a tie's block as one machine rounded it. */
static void tie_force(void *user, int layer, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt,
                      const float *x, void *xq, int64_t n) {
    tp_member *me = user;
    if (vdt != CM_TYPE_Q8_0) return;
    for (int i = 0; i < me->one->n; i++) {
        const tie_rec *r = &me->one->r[i];
        if (r->layer != layer || r->site != (int)site || r->row != row || r->col0 != col0 || r->n != n) continue;
        cm_block_q8_0 *q = xq;
        const cm_block_q8_0 *o = r->q;
        for (int64_t b = 0; b < n / CM_QK8_0; b++) {
            if (!memcmp(&q[b], &o[b], sizeof q[b])) continue;
            float amax = 0, dmax = 0;
            for (int j = 0; j < CM_QK8_0; j++) {
                amax = fmaxf(amax, fabsf(r->x[b * CM_QK8_0 + j]));
                dmax = fmaxf(dmax, fabsf(x[b * CM_QK8_0 + j] - r->x[b * CM_QK8_0 + j]));
            }
            if (dmax > 1e-6f * amax) continue;
            q[b] = o[b];
            me->ties++;
        }
        return;
    }
}

static void *tp_main(void *arg) {
    tp_member *me = arg;
    const cm_model *m = me->m;
    char e[256];
    cm_ctx *c = cm_ctx_new(m, NTOK, 64, NULL, e, sizeof e);
    if (c && me->one) cm_ctx_set_act_hook(c, tie_force, me);
    cm_kv kv;
    me->rc = -1;
    if (!c || cm_kv_init(&kv, m, 0, m->hp.n_layer, me->sl, 64, e, sizeof e)) {
        fprintf(stderr, "  member %d: %s\n", me->rank, e);
        cm_ctx_free(c);
        return NULL; /* NEEDSWORK: the other members then wait at the barrier (the test's time limit ends it) */
    }
    int32_t pos[NTOK], seq[NTOK] = {0};
    int8_t want[NTOK];
    for (int i = 0; i < NTOK; i++) pos[i] = i, want[i] = 1;
    cm_kv *kvs[1] = {&kv};
    cm_batch b = {.n = NTOK, .tokens = k_prompt, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = m->hp.n_layer,
                         .slice = me->sl,
                         .kvs = kvs,
                         .n_kvs = 1,
                         .allreduce = tp_allreduce,
                         .allreduce_user = me,
                         .experts = {true, me->G->eb[me->rank], me->G->eb[me->rank + 1]},
                         .expert_gather = tp_gather,
                         .expert_gather_user = me,
                         .out_logits = me->logits};
    me->rc = cm_forward(c, &b, &a, e, sizeof e);
    if (me->rc) fprintf(stderr, "  member %d: %s\n", me->rank, e);
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return NULL;
}

/* Tensor parallelism of MLA: members with query heads [h0, h1) and dense
 * FFN rows (empty shares too; every member's slice partial, as the planner
 * makes them) and the MoE layers' experts as an expert group: every
 * member's logits are one machine's up to the partial sums' order, the same
 * argmax at every position. The sums differ in the last bits; the Q8_0
 * conversion of the next matmul's input absorbs that but at an 8-bit
 * rounding tie, which the members round as one machine did (tie_force
 * above; counted and printed). Measured: 0, with one tie in lite's groups
 * under q8_0's avx512 block lane order, none under the avx2 table. */
static void test_mla_tensor_parallel(void) {
    static const struct {
        int k;
        cm_slice sl[TPM];
    } groups[] = {
        {3, {{0, 1, 0, 256}, {1, 2, 256, 512}, {2, 4, 512, 768}}},
        {3, {{0, 4, 0, 512}, {4, 4, 512, 768}, {4, 4, 768, 768}}}, /* two without heads, one without rows */
    };
    static const int eb[2][2][TPM + 1] = {{{0, 5, 8, 16}, {0, 0, 9, 16}},
                                          {{0, 2, 4, 8}, {0, 4, 8, 8}}}; /* v3: 16, lite: 8 */
    const char *vs[] = {"v3", "lite"};
    for (int vi = 0; vi < 2; vi++) {
        fx f;
        if (fx_open(&f, vs[vi], "q8_0")) {
            CHECK(0);
            continue;
        }
        const int V = f.m.hp.n_vocab;
        const size_t n = (size_t)NTOK * V;
        float *one = cm_malloc(n * 4);
        tie_log ties = {0};
        g_ties = &ties;
        CHECK(run(&f.m, NULL, NTOK, CM_TYPE_F32, 0, one) == 0);
        g_ties = NULL;
        for (size_t gi = 0; gi < CM_ARRAY_LEN(groups); gi++) {
            tp_group G = {.k = groups[gi].k, .eb = eb[vi][gi]};
            pthread_barrier_init(&G.bar, NULL, (unsigned)G.k);
            tp_member mb[TPM];
            pthread_t th[TPM];
            for (int r = 0; r < G.k; r++) {
                mb[r] = (tp_member){
                    .G = &G, .m = &f.m, .rank = r, .sl = groups[gi].sl[r], .logits = cm_malloc(n * 4), .one = &ties};
                CHECK(cm_slice_check(&f.m, mb[r].sl, errbuf, sizeof errbuf) == 0);
                pthread_create(&th[r], NULL, tp_main, &mb[r]);
            }
            for (int r = 0; r < G.k; r++) pthread_join(th[r], NULL);
            for (int r = 0; r < G.k; r++) {
                CHECKF(mb[r].rc == 0, "%s group %zu member %d failed", vs[vi], gi, r);
                const double d = mb[r].rc ? 1 : max_diff(mb[r].logits, one, n);
                int same = 0;
                for (int p = 0; p < NTOK; p++) {
                    int a = 0, b = 0;
                    for (int t = 1; t < V; t++) {
                        if (one[(size_t)p * V + t] > one[(size_t)p * V + a]) a = t;
                        if (mb[r].logits[(size_t)p * V + t] > mb[r].logits[(size_t)p * V + b]) b = t;
                    }
                    same += a == b;
                }
                CHECKF(d < 1e-4 && same == NTOK, "%s group %zu member %d: logits differ by %g, %d of %d argmax equal",
                       vs[vi], gi, r, d, same, NTOK);
                if (r == 0)
                    fprintf(stderr,
                            "# %s tensor-parallel group of %d: max |logit - one machine| %.2g (%d Q8_0 blocks at an "
                            "8-bit tie rounded as one machine's)\n",
                            vs[vi], G.k, d, mb[r].ties);
                cm_free(mb[r].logits);
            }
            pthread_barrier_destroy(&G.bar);
        }
        tie_free(&ties);
        cm_free(one);
        fx_close(&f);
    }
}

/* What we do not run is a one-line error naming it. */
static void test_mla_refusals(void) {
    fx f;
    if (fx_open(&f, "v3", "q8_0")) {
        CHECK(0);
        return;
    }
    /* tensor-parallel slices are of query heads (and dense FFN rows), and
     * need an expert slice: the MoE layers are an expert group's */
    cm_slice s = cm_slice_full(&f.m);
    CHECK(s.h0 == 0 && s.h1 == 4 && f.m.hp.n_head_kv == 1);
    s.h1 = 5;
    CHECK(cm_slice_check(&f.m, s, errbuf, sizeof errbuf) == CM_EINVAL);
    s = cm_slice_full(&f.m);
    s.h1 = 2, s.f1 = 256;
    CHECK(cm_slice_check(&f.m, s, errbuf, sizeof errbuf) == 0);
    CHECK(cm_expert_slice_check(&f.m, s, (cm_expert_slice){0}, errbuf, sizeof errbuf) == CM_EINVAL &&
          strstr(errbuf, "deepseek2") && strstr(errbuf, "expert slice") && !strchr(errbuf, '\n'));
    CHECK(cm_expert_slice_check(&f.m, s, (cm_expert_slice){true, 0, 8}, errbuf, sizeof errbuf) == 0);
    s.f1 = 100; /* not on a Q8_0 block of the dense ffn_down */
    CHECK(cm_slice_check(&f.m, s, errbuf, sizeof errbuf) == CM_EINVAL && strstr(errbuf, "block"));
    fx_close(&f);
    /* a split file without key_length_mla reads as the unsplit layout, whose head_count_kv is the heads' */
    CHECK(fx_write(&f, "v3", "q8_0") == 0);
    CHECK(PATCH(&f.file, "key_length_mla", "key_length_mlx") == 1 &&
          PATCH(&f.file, "value_length_mla", "value_length_mlx") == 1);
    CHECK(fx_load(&f) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "key_length_mla") && strstr(errbuf, "attn_kv_b") && strstr(errbuf, "head_count_kv 1") &&
               !strchr(errbuf, '\n'),
           "%s", errbuf);
    fx_close(&f);
    /* an attn_kv_b tensor beside the split ones (renaming layer 1's exp_probs_b: the same length) */
    CHECK(fx_write(&f, "v3", "q8_0") == 0);
    CHECK(PATCH(&f.file, "blk.1.exp_probs_b.bias", "blk.1.attn_kv_b.weight") == 1);
    CHECK(fx_load(&f) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "'blk.1.attn_kv_b.weight'") && strstr(errbuf, "attn_k_b + attn_v_b") && !strchr(errbuf, '\n'),
           "%s", errbuf);
    fx_close(&f);
    /* an unknown rope scaling (the GGUF string "yarn": its u64 length, then the bytes) */
    CHECK(fx_write(&f, "v3yarn", "f32") == 0);
    CHECK(PATCH(&f.file, "\x04\x00\x00\x00\x00\x00\x00\x00yarn", "\x04\x00\x00\x00\x00\x00\x00\x00xarn") == 1);
    CHECK(fx_load(&f) == CM_EUNSUPPORTED);
    CHECKF(strstr(errbuf, "rope scaling type 'xarn'") && strstr(errbuf, "yarn") && !strchr(errbuf, '\n'), "%s", errbuf);
    fx_close(&f);
    /* synth refuses what llama.cpp's deepseek2 would not load */
    cm_synth_params sp = {.arch = "deepseek2",
                          .variant = "v3",
                          .n_embd = 256,
                          .n_layer = 3,
                          .n_head = 4,
                          .n_head_kv = 4,
                          .n_ff = 768,
                          .type = "q8_0",
                          .n_expert = 18,
                          .n_expert_used = 4,
                          .n_ff_exp = 256};
    CHECK(cm_synth_check(&sp, errbuf, sizeof errbuf) == CM_EINVAL && strstr(errbuf, "4 groups"));
    sp.n_expert = 16, sp.variant = "v4";
    CHECK(cm_synth_check(&sp, errbuf, sizeof errbuf) == CM_EINVAL && strstr(errbuf, "variant 'v4'"));
}

int main(void) {
    if (cm_gguf_open(&g_vocab, t_shared("vocab/ggml-vocab-llama-spm.gguf"), NULL, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_mla_kv_is_latent);
    RUN(test_mla_batch_invariant);
    RUN(test_mla_f16_vs_llama_cpp);
    RUN(test_mla_sequences_and_stages);
    RUN(test_mla_tensor_parallel);
    RUN(test_mla_kv_b_split);
    RUN(test_mla_refusals);
    cm_gguf_close(&g_vocab);
    TEST_END();
}
