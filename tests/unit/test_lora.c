/*
 * test_lora.c: LoRA adapters (model/lora.h) against llama.cpp on stories260K.
 *
 * The adapters are random (cm_synth_lora_write, fixed seeds, made here in
 * memory exactly as tools/gen_lora_refs.sh makes them with `cumulo synth
 * --lora-for`); the files tests/data/lora/NAME.json hold llama.cpp's (node-llama-cpp
 * 3.21.1, F32 KV cache) greedy ids and teacher-forced probabilities with
 * them: one adapter at scale 1, the same at 1.5, two at once (the second
 * with alpha 0 and scale 0.7, FFN only), one on the Q8_0 model, and both
 * models without adapters. Each adapter must change the greedy text (else
 * the case proves nothing). Also: the one-line errors for files that are
 * not adapters, adapters of another architecture or shape, and tensors
 * cumulo does not adapt.
 */
#include "test.h"

#include "gguf/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"

#include <cjson/cJSON.h>

#define NPOS 64
#define NVOC 512

typedef struct ref {
    int n_prompt, n_gen, n_ids;
    int ids[NPOS];       /* prompt then generated */
    float p[NPOS][NVOC]; /* -1: below probs_min in the reference */
    double pmin;
} ref;

typedef struct base {
    cm_gguf g;
    cm_model m;
} base;

static base B32, B8;
static char errbuf[512];

static int load_base(base *b, const char *name) {
    char path[128];
    snprintf(path, sizeof path, "models/stories260K-%s.gguf", name);
    if (cm_gguf_open(&b->g, t_shared(path), NULL, NULL, errbuf, sizeof errbuf) ||
        cm_model_load(&b->m, &b->g, errbuf, sizeof errbuf)) {
        fprintf(stderr, "  %s\n", errbuf);
        return -1;
    }
    return 0;
}

static int load_ref(ref *r, const char *name) {
    char path[256], *txt;
    size_t len;
    snprintf(path, sizeof path, "tests/data/lora/%s.json", name);
    if (cm_file_read_all(path, &txt, &len, errbuf, sizeof errbuf)) {
        fprintf(stderr, "  %s\n", errbuf);
        return -1;
    }
    cJSON *j = cJSON_Parse(txt);
    cm_free(txt);
    if (!j) return -1;
    memset(r, 0, sizeof *r);
    cJSON *pt = cJSON_GetObjectItem(j, "prompt_tokens"), *gt = cJSON_GetObjectItem(j, "generated_tokens");
    cJSON *e;
    cJSON_ArrayForEach(e, pt) r->ids[r->n_ids++] = e->valueint;
    r->n_prompt = r->n_ids;
    cJSON_ArrayForEach(e, gt) r->ids[r->n_ids++] = e->valueint;
    r->n_gen = r->n_ids - r->n_prompt;
    r->pmin = cJSON_GetObjectItem(j, "probs_min")->valuedouble;
    int pos = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "probs")) {
        for (int v = 0; v < NVOC; v++) r->p[pos][v] = -1;
        cJSON *kv;
        cJSON_ArrayForEach(kv, cJSON_GetObjectItem(e, "p")) {
            int id = atoi(kv->string);
            if (id >= 0 && id < NVOC) r->p[pos][id] = (float)kv->valuedouble;
        }
        pos++;
    }
    cJSON_Delete(j);
    return pos == r->n_ids ? 0 : -1;
}

/* An adapter as tools/gen_lora_refs.sh makes it, added to l with scale. */
static int add_synth(cm_lora *l, base *b, int rank, float alpha, uint64_t seed, const char *only, float scale) {
    cm_synth_lora_params p = {.rank = rank, .alpha = alpha, .strength = 0.1f, .seed = seed, .only = only};
    cm_buf buf;
    cm_buf_init(&buf);
    cm_gguf g;
    int rc = cm_synth_lora_write(&p, &b->g, NULL, &buf, errbuf, sizeof errbuf);
    if (!rc) rc = cm_gguf_parse(&g, (const uint8_t *)buf.data, buf.len, errbuf, sizeof errbuf);
    if (!rc) {
        rc = cm_lora_add(l, &g, scale, errbuf, sizeof errbuf);
        cm_gguf_close(&g);
    }
    cm_buf_release(&buf);
    if (rc) fprintf(stderr, "  adapter: %s\n", errbuf);
    return rc;
}

static void softmax(const float *x, double *p, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += p[i] = exp((double)x[i] - mx);
    for (int i = 0; i < n; i++) p[i] /= s;
}

/* Greedy ids (prompt in one batch, then one token at a time) and the max
 * probability error of teacher-forced logits at every position, with the
 * adapters l (NULL: none) and a pool of nth threads. */
static void run_case(base *b, const cm_lora *l, const ref *r, int nth, int *gen, double *perr) {
    const cm_model *m = &b->m;
    cm_pool *pool = nth > 1 ? cm_pool_new(nth) : NULL;
    cm_ctx *c = cm_ctx_new(m, NPOS, 256, pool, errbuf, sizeof errbuf);
    cm_ctx_set_lora(c, l);
    cm_kv kv;
    cm_kv_init(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 256, errbuf, sizeof errbuf);
    static float logits[NPOS * NVOC];
    int32_t ids[NPOS];
    for (int i = 0; i < r->n_prompt; i++) ids[i] = r->ids[i];
    int n = r->n_prompt;
    CHECK(cm_forward_simple(c, &kv, ids, n, logits, errbuf, sizeof errbuf) == 0);
    for (int k = 0; k < r->n_gen; k++) {
        int best = 0;
        for (int v = 1; v < m->hp.n_vocab; v++) best = logits[v] > logits[best] ? v : best;
        gen[k] = ids[n++] = best;
        if (k + 1 < r->n_gen) CHECK(cm_forward_simple(c, &kv, &ids[n - 1], 1, logits, errbuf, sizeof errbuf) == 0);
    }
    /* Teacher-forced: the reference ids in one batch, logits at every row. */
    cm_kv_truncate(&kv, 0);
    int32_t pos[NPOS], seq[NPOS], tok[NPOS];
    int8_t want[NPOS];
    for (int i = 0; i < r->n_ids; i++) pos[i] = i, seq[i] = 0, want[i] = 1, tok[i] = r->ids[i];
    cm_kv *kvs[1] = {&kv};
    cm_batch bt = {.n = r->n_ids, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = m->hp.n_layer,
                         .slice = cm_slice_full(m),
                         .kvs = kvs,
                         .n_kvs = 1,
                         .out_logits = logits};
    CHECK(cm_forward(c, &bt, &a, errbuf, sizeof errbuf) == 0);
    double worst = 0, p[NVOC];
    for (int i = 0; i < r->n_ids; i++) {
        softmax(logits + (size_t)i * m->hp.n_vocab, p, m->hp.n_vocab);
        for (int v = 0; v < m->hp.n_vocab; v++) {
            /* Below the reference's cut-off: llama.cpp's p < pmin, so ours may be at most pmin + the error. */
            double d = r->p[i][v] >= 0 ? fabs(p[v] - r->p[i][v]) : (p[v] > r->pmin ? p[v] - r->pmin : 0);
            worst = d > worst ? d : worst;
        }
    }
    *perr = worst;
    cm_kv_release(&kv);
    cm_ctx_free(c);
    cm_pool_free(pool);
}

/* Probability bounds. Without adapters, the stories260K golden ones
 * (test_golden.c: F32 1e-5, Q8_0 1.2e-5; measured here 1.96e-6 and 2.3e-6).
 * With adapters, measured on this Zen 4 (avx512), 1 and 2 threads alike:
 * f32_a 8.87e-6, f32_a2 1.94e-6, f32_ab 3.3e-6, q8_a 1.51e-6; bound 2e-5
 * (2.3x the worst). The worst is the top token at a position where p =
 * 0.99988: there our tail (the ~500 tokens of p < 1e-6 each) sums to 2.2e-5
 * and llama.cpp's to 1.3e-5. The no-adapter references show the same
 * tail excess (8.6e-6 vs 6.6e-6 at that position), so it is how the two
 * sides differ on very unlikely tokens, not the adapter math: a wrong
 * scale, a missing target or an adapter applied to the quantized input
 * gives errors of 1e-3 or more (NEEDSWORK: find where the tails part). */
#define F32_BOUND 1e-5
#define Q8_BOUND 1.2e-5
#define LORA_BOUND 2e-5

static void check_case(base *b, const cm_lora *l, const char *refname, double bound, const int *differ_from) {
    static ref r;
    if (load_ref(&r, refname)) {
        CHECKF(0, "cannot load reference %s", refname);
        return;
    }
    for (int nth = 1; nth <= 2; nth++) {
        int gen[NPOS];
        double e;
        run_case(b, l, &r, nth, gen, &e);
        int same = 0, first_diff = -1;
        for (int k = 0; k < r.n_gen; k++) {
            if (gen[k] == r.ids[r.n_prompt + k]) same++;
            else if (first_diff < 0) first_diff = k;
        }
        printf("# %s, %d thread%s: greedy %d/%d ids equal llama.cpp's, max |p - p_llama.cpp| = %.3g\n", refname, nth,
               nth > 1 ? "s" : "", same, r.n_gen, e);
        CHECKF(same == r.n_gen, "%s: greedy id %d differs from llama.cpp's", refname, first_diff);
        CHECKF(e <= bound, "%s: max prob error %g > %g", refname, e, bound);
        if (differ_from) {
            int diff = 0;
            for (int k = 0; k < r.n_gen; k++) diff += gen[k] != differ_from[k];
            CHECKF(diff > 0, "%s: the adapter does not change the greedy ids", refname);
        }
    }
}

static int none32[NPOS], none8[NPOS];

static void greedy_of(const char *name, int *out) {
    static ref r;
    if (load_ref(&r, name)) return;
    for (int k = 0; k < r.n_gen; k++) out[k] = r.ids[r.n_prompt + k];
}

static void test_no_adapter(void) {
    cm_lora *l = cm_lora_new(&B32.m); /* an empty set changes nothing */
    check_case(&B32, l, "f32_none", F32_BOUND, NULL);
    cm_lora_free(l);
    check_case(&B8, NULL, "q8_none", Q8_BOUND, NULL);
    greedy_of("f32_none", none32);
    greedy_of("q8_none", none8);
}

static void test_one_adapter(void) {
    cm_lora *l = cm_lora_new(&B32.m);
    CHECK(add_synth(l, &B32, 4, 8, 7, NULL, 1.0f) == 0);
    CHECK(cm_lora_count(l) == 1 && cm_lora_n_pairs(l) == 5 * 7 + 1);
    CHECK(cm_lora_targets(l, 0, CM_LORA_Q) && cm_lora_targets(l, 4, CM_LORA_DOWN) &&
          cm_lora_targets(l, 0, CM_LORA_OUTPUT));
    check_case(&B32, l, "f32_a", LORA_BOUND, none32);
    cm_lora_free(l);
}

static void test_scale(void) {
    cm_lora *l = cm_lora_new(&B32.m);
    CHECK(add_synth(l, &B32, 4, 8, 7, NULL, 1.5f) == 0);
    check_case(&B32, l, "f32_a2", LORA_BOUND, none32);
    cm_lora_free(l);
}

static void test_two_adapters(void) {
    cm_lora *l = cm_lora_new(&B32.m);
    CHECK(add_synth(l, &B32, 4, 8, 7, NULL, 1.0f) == 0);
    CHECK(add_synth(l, &B32, 8, 0, 8, "ffn", 0.7f) == 0);
    CHECK(cm_lora_count(l) == 2 && cm_lora_n_pairs(l) == 36 + 15);
    CHECK(!cm_lora_targets(NULL, 0, CM_LORA_Q));
    static int one[NPOS];
    greedy_of("f32_a", one);
    check_case(&B32, l, "f32_ab", LORA_BOUND, one); /* the second adapter changes the first's output */
    cm_lora_free(l);
}

static void test_q8_0(void) {
    cm_lora *l = cm_lora_new(&B8.m);
    CHECK(add_synth(l, &B8, 4, 8, 9, NULL, 1.0f) == 0);
    check_case(&B8, l, "q8_a", LORA_BOUND, none8);
    cm_lora_free(l);
}

/* A hand-made adapter: keys as given, one pair of the given shapes. */
static int add_made(cm_lora *l, const char *type, const char *arch, const char *name, int64_t n_in, int rank,
                    int64_t n_out, bool with_b) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (type) cm_gguf_w_str(w, "general.type", type);
    if (arch) cm_gguf_w_str(w, "general.architecture", arch);
    cm_gguf_w_str(w, "adapter.type", "lora");
    cm_gguf_w_f32(w, "adapter.lora.alpha", 4);
    static float zeros[1 << 16];
    char an[128], bn[128];
    snprintf(an, sizeof an, "%s.lora_a", name);
    snprintf(bn, sizeof bn, "%s.lora_b", name);
    int64_t na[2] = {n_in, rank}, nb[2] = {rank, n_out};
    cm_gguf_w_tensor(w, an, CM_TYPE_F32, 2, na, zeros);
    if (with_b) cm_gguf_w_tensor(w, bn, CM_TYPE_F32, 2, nb, zeros);
    cm_buf buf;
    cm_buf_init(&buf);
    cm_gguf g;
    int rc = cm_gguf_writer_write_buf(w, &buf, errbuf, sizeof errbuf);
    cm_gguf_writer_free(w);
    if (!rc && !(rc = cm_gguf_parse(&g, (const uint8_t *)buf.data, buf.len, errbuf, sizeof errbuf))) {
        rc = cm_lora_add(l, &g, 1.0f, errbuf, sizeof errbuf);
        cm_gguf_close(&g);
    }
    cm_buf_release(&buf);
    return rc;
}

static void test_errors(void) {
    cm_lora *l = cm_lora_new(&B32.m);
    /* The base model itself is not an adapter. */
    CHECK(cm_lora_add(l, &B32.g, 1.0f, errbuf, sizeof errbuf) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "not a LoRA adapter (general.type is 'missing'") != NULL, "%s", errbuf);
    CHECK(add_made(l, "model", "llama", "blk.0.attn_q.weight", 64, 4, 64, true) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "general.type is 'model'") != NULL, "%s", errbuf);
    CHECK(add_made(l, "adapter", "qwen2", "blk.0.attn_q.weight", 64, 4, 64, true) == CM_EUNSUPPORTED);
    CHECKF(!strcmp(errbuf, "adapter is for architecture 'qwen2', the model is 'llama'"), "%s", errbuf);
    CHECK(add_made(l, "adapter", "llama", "blk.0.attn_q.weight", 32, 4, 64, true) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "has shape [32, 4], the model's 'blk.0.attn_q.weight' takes 64 inputs") != NULL, "%s",
           errbuf);
    CHECK(add_made(l, "adapter", "llama", "blk.0.ffn_down.weight", 172, 4, 32, true) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "has 64 outputs") != NULL, "%s", errbuf);
    CHECK(add_made(l, "adapter", "llama", "blk.9.attn_q.weight", 64, 4, 64, true) == CM_EUNSUPPORTED);
    CHECK(add_made(l, "adapter", "llama", "token_embd.weight", 64, 4, 512, true) == CM_EUNSUPPORTED);
    CHECKF(strstr(errbuf, "'token_embd.weight.lora_a': cumulo applies LoRA to") != NULL, "%s", errbuf);
    CHECK(add_made(l, "adapter", "llama", "blk.0.attn_k.weight", 64, 4, 32, false) == CM_EFORMAT);
    CHECKF(strstr(errbuf, "has no 'blk.0.attn_k.weight.lora_b'") != NULL, "%s", errbuf);
    CHECK(cm_lora_count(l) == 0 && cm_lora_n_pairs(l) == 0); /* nothing kept from a bad adapter */
    CHECK(add_made(l, "adapter", "llama", "blk.0.attn_k.weight", 64, 4, 32, true) == 0);
    CHECK(cm_lora_count(l) == 1 && cm_lora_targets(l, 0, CM_LORA_K) && !cm_lora_targets(l, 1, CM_LORA_K));
    cm_lora_free(l);
    cm_lora_free(NULL);

    char path[64];
    float s;
    CHECK(cm_lora_spec_parse("a.gguf", path, sizeof path, &s, errbuf, sizeof errbuf) == 0 && !strcmp(path, "a.gguf") &&
          s == 1.0f);
    CHECK(cm_lora_spec_parse("dir:x/a.gguf:0.25", path, sizeof path, &s, errbuf, sizeof errbuf) == 0 &&
          !strcmp(path, "dir:x/a.gguf") && s == 0.25f);
    CHECK(cm_lora_spec_parse("a.gguf:-2", path, sizeof path, &s, errbuf, sizeof errbuf) == 0 && s == -2.0f);
    CHECK(cm_lora_spec_parse("c:/a.gguf", path, sizeof path, &s, errbuf, sizeof errbuf) == 0 &&
          !strcmp(path, "c:/a.gguf"));
    CHECK(cm_lora_spec_parse(":2", path, sizeof path, &s, errbuf, sizeof errbuf) == CM_EINVAL);
}

/* Logits of the last of a few prompt tokens with the set l (NULL: none). */
static void logits_of(base *b, const cm_lora *l, float *out) {
    const cm_model *m = &b->m;
    cm_ctx *c = cm_ctx_new(m, NPOS, 64, NULL, errbuf, sizeof errbuf);
    cm_ctx_set_lora(c, l);
    cm_kv kv;
    cm_kv_init(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 64, errbuf, sizeof errbuf);
    int32_t ids[6] = {1, 403, 407, 261, 378, 432};
    CHECK(cm_forward_simple(c, &kv, ids, 6, out, errbuf, sizeof errbuf) == 0);
    cm_kv_release(&kv);
    cm_ctx_free(c);
}

/* A cluster stage's parts (cm_lora_parts_write / cm_lora_add_parts): the
 * parts of every layer, or of two ranges added one after the other, give
 * the same logits, bit for bit, as the set they came from; a range holds
 * only its layers' pairs; hostile bytes are refused and leave the set as it
 * was. */
static void test_parts(void) {
    cm_lora *l = cm_lora_new(&B32.m);
    CHECK(add_synth(l, &B32, 4, 8, 7, NULL, 1.0f) == 0);
    CHECK(add_synth(l, &B32, 8, 0, 8, "ffn", 0.7f) == 0);
    cm_buf all, lo, hi;
    cm_buf_init(&all);
    cm_buf_init(&lo);
    cm_buf_init(&hi);
    int n_all = 0, n_lo = 0, n_hi = 0;
    CHECK(cm_lora_parts_write(l, 0, 5, true, NULL, false, &all, &n_all) == 0 && n_all == cm_lora_n_pairs(l));
    CHECK(cm_lora_parts_write(l, 0, 2, false, NULL, false, &lo, &n_lo) == 0 && n_lo == 2 * (7 + 3));
    CHECK(cm_lora_parts_write(l, 2, 5, true, NULL, false, &hi, &n_hi) == 0 && n_hi == 3 * (7 + 3) + 1);
    static float want[NVOC], got[NVOC], none[NVOC];
    logits_of(&B32, l, want);
    logits_of(&B32, NULL, none);
    CHECK(memcmp(want, none, sizeof want) != 0);
    cm_lora *w = cm_lora_new(&B32.m);
    CHECK(cm_lora_add_parts(w, (const uint8_t *)all.data, all.len, errbuf, sizeof errbuf) == 0);
    CHECK(cm_lora_count(w) == 2 && cm_lora_n_pairs(w) == n_all);
    logits_of(&B32, w, got);
    CHECK(memcmp(want, got, sizeof want) == 0);
    cm_lora_free(w);
    w = cm_lora_new(&B32.m);
    CHECK(cm_lora_add_parts(w, (const uint8_t *)lo.data, lo.len, errbuf, sizeof errbuf) == 0);
    CHECK(cm_lora_targets(w, 1, CM_LORA_Q) && !cm_lora_targets(w, 2, CM_LORA_Q) &&
          !cm_lora_targets(w, 0, CM_LORA_OUTPUT));
    CHECK(cm_lora_add_parts(w, (const uint8_t *)hi.data, hi.len, errbuf, sizeof errbuf) == 0);
    logits_of(&B32, w, got);
    CHECK(memcmp(want, got, sizeof want) == 0);
    cm_lora_free(w);
    /* hostile bytes: nothing kept */
    w = cm_lora_new(&B32.m);
    uint8_t *p = (uint8_t *)lo.data;
    CHECK(cm_lora_add_parts(w, p, lo.len - 1, errbuf, sizeof errbuf) == CM_EFORMAT); /* truncated */
    CHECK(cm_lora_add_parts(w, p, 15, errbuf, sizeof errbuf) == CM_EFORMAT);
    cm_buf_append(&lo, "", 1);
    p = (uint8_t *)lo.data;
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT && strstr(errbuf, "after the last"));
    lo.len--;
    p[20] = 9; /* the first pair's layer: not in the model */
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT);
    p[20] = 0;
    p[32] = 63; /* its n_in: not the weight's */
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT && strstr(errbuf, "does not fit"));
    p[32] = 64;
    p[16] = 1; /* adapter 1 before adapter 0's pairs */
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT && strstr(errbuf, "out of range"));
    p[16] = 0;
    p[12] = 200; /* more pairs than bytes */
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT);
    p[12] = (uint8_t)n_lo;
    CHECK(cm_lora_count(w) == 0 && cm_lora_n_pairs(w) == 0);
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == 0); /* restored: accepted */
    cm_lora_free(w);
    /* Version 3 carries each pair's alpha (bytes 36..39 of its header): a
     * bad one is refused, and version 2 (a reserved 0 there) is still read
     * but refuses a nonzero one. */
    w = cm_lora_new(&B32.m);
    const float nanf_ = NAN, neg = -1.0f;
    uint8_t keep[4];
    memcpy(keep, p + 16 + 36, 4);
    CHECK(p[4] == 3 && (keep[0] | keep[1] | keep[2] | keep[3])); /* adapter a: alpha 8 */
    memcpy(p + 16 + 36, &nanf_, 4);
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT);
    memcpy(p + 16 + 36, &neg, 4);
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT);
    memcpy(p + 16 + 36, keep, 4);
    p[4] = 2;
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT);
    p[4] = 7;
    CHECK(cm_lora_add_parts(w, p, lo.len, errbuf, sizeof errbuf) == CM_EFORMAT);
    p[4] = 3;
    CHECK(cm_lora_count(w) == 0);
    cm_lora_free(w);
    /* Rows' own scales (serve's per-request adapters) on a node's parts: the
     * same bits as on the set they came from, row by row, and not the
     * defaults' (a row of scales (0.5, 0), one of (0, 1.3), one of defaults). */
    w = cm_lora_new(&B32.m);
    CHECK(cm_lora_add_parts(w, (const uint8_t *)all.data, all.len, errbuf, sizeof errbuf) == 0 && cm_lora_rows_ok(w));
    CHECK(cm_lora_rows_ok(l) && cm_lora_scale(l, 0) == 1.0f && fabsf(cm_lora_scale(l, 1) - 0.7f) < 1e-6f);
    {
        const int64_t E = B32.m.hp.n_embd, F = B32.m.hp.n_ff;
        static float x[3 * 256], y1[3 * 256], y2[3 * 256], y0[3 * 256];
        for (int i = 0; i < 3 * 256; i++) x[i] = (float)((i * 29) % 13) * 0.1f - 0.6f;
        const float u0[2] = {0.5f, 0.0f}, u1[2] = {0.0f, 1.3f};
        const float *rows[3] = {u0, u1, NULL};
        const enum cm_lora_target ts[3] = {CM_LORA_Q, CM_LORA_UP, CM_LORA_DOWN};
        for (int k = 0; k < 3; k++) {
            const int64_t nin = ts[k] == CM_LORA_DOWN ? F : E, nout = ts[k] == CM_LORA_UP ? F : E;
            memset(y1, 0, sizeof y1);
            memset(y2, 0, sizeof y2);
            memset(y0, 0, sizeof y0);
            cm_lora_apply_rows(l, 1, ts[k], x, nin, 0, nin, 3, y1, nout, 0, 0, nout, rows);
            cm_lora_apply_rows(w, 1, ts[k], x, nin, 0, nin, 3, y2, nout, 0, 0, nout, rows);
            cm_lora_apply(l, 1, ts[k], x, nin, 0, nin, 3, y0, nout, 0, 0, nout);
            CHECKF(memcmp(y1, y2, (size_t)(3 * nout) * sizeof(float)) == 0, "target %d: parts differ", (int)ts[k]);
            CHECK(memcmp(y1, y0, (size_t)nout * sizeof(float)) != 0); /* row 0: its own scales, not the defaults */
            CHECK(memcmp(y1 + 2 * nout, y0 + 2 * nout, (size_t)nout * sizeof(float)) == 0); /* row 2: defaults */
        }
    }
    cm_lora_free(w);
    /* A tensor-parallel member's slice (kv heads [1, 3), FFN rows [40, 120),
     * its rows of a split head): smaller, covers that slice and not another,
     * and gives the same corrections, bit for bit, on what it holds. */
    const cm_slice sl = {1, 3, 40, 120}, other = {0, 2, 40, 120};
    cm_buf sb;
    cm_buf_init(&sb);
    CHECK(cm_lora_parts_write(l, 0, 5, true, &sl, true, &sb, NULL) == 0 && sb.len < all.len * 3 / 4);
    printf("# parts of a member with kv heads [1, 3) of 4, ffn rows [40, 120) of 172: %zu of %zu bytes\n", sb.len,
           all.len);
    w = cm_lora_new(&B32.m);
    CHECK(cm_lora_add_parts(w, (const uint8_t *)sb.data, sb.len, errbuf, sizeof errbuf) == 0);
    CHECK(cm_lora_covers(w, &sl, true) && !cm_lora_covers(w, &other, true) && !cm_lora_covers(w, NULL, false));
    {
        const cm_hparams *hp = &B32.m.hp;
        const int64_t E = hp->n_embd, D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
        const int64_t q0 = sl.h0 * rep * D, QS = (sl.h1 - sl.h0) * rep * D, FS = sl.f1 - sl.f0;
        int v0, v1;
        cm_slice_head_rows(&B32.m, sl, &v0, &v1);
        static float x[2 * 256], y1[2 * NVOC], y2[2 * NVOC];
        for (int i = 0; i < 2 * 256; i++) x[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
        struct {
            enum cm_lora_target t;
            int64_t ldx, col0, ncols, row0, rows;
        } cs[] = {{CM_LORA_Q, E, 0, E, q0, QS},        {CM_LORA_K, E, 0, E, sl.h0 * D, (sl.h1 - sl.h0) * D},
                  {CM_LORA_O, QS, q0, QS, 0, E},       {CM_LORA_GATE, E, 0, E, sl.f0, FS},
                  {CM_LORA_DOWN, FS, sl.f0, FS, 0, E}, {CM_LORA_OUTPUT, E, 0, E, v0, v1 - v0}};
        for (int il = 0; il < hp->n_layer; il++)
            for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
                memset(y1, 0, sizeof y1);
                memset(y2, 0, sizeof y2);
                cm_lora_apply(l, il, cs[k].t, x, cs[k].ldx, cs[k].col0, cs[k].ncols, 2, y1, NVOC, cs[k].row0, 0,
                              cs[k].rows);
                cm_lora_apply(w, il, cs[k].t, x, cs[k].ldx, cs[k].col0, cs[k].ncols, 2, y2, NVOC, cs[k].row0, 0,
                              cs[k].rows);
                CHECKF(memcmp(y1, y2, sizeof y1) == 0, "layer %d target %d: sliced parts differ", il, (int)cs[k].t);
            }
    }
    cm_lora_free(w);
    cm_buf_release(&sb);
    cm_buf_release(&all);
    cm_buf_release(&lo);
    cm_buf_release(&hi);
    cm_lora_free(l);
}

int main(void) {
    if (load_base(&B32, "f32") || load_base(&B8, "q8_0")) {
        fprintf(stderr, "cannot load stories260K models from %s\n", t_shared(""));
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_no_adapter);
    RUN(test_one_adapter);
    RUN(test_scale);
    RUN(test_two_adapters);
    RUN(test_q8_0);
    RUN(test_errors);
    RUN(test_parts);
    cm_model_release(&B32.m);
    cm_gguf_close(&B32.g);
    cm_model_release(&B8.m);
    cm_gguf_close(&B8.g);
    TEST_END();
}
