/*
 * test_lora_rows.c: LoRA adapters chosen per sequence (engine.h
 * cm_session_set_lora; serve's per-request "lora" field) on
 * stories260K-q8_0 with two random adapters A (rank 4, alpha 8, every
 * target, scale 1) and B (rank 8, no alpha, FFN only, scale 0.7).
 *
 * - A session of an engine holding A and B, given the scales (1, 0),
 *   (0, 0.7), (0, 0) or (1, 0.7), produces exactly the text and logprobs
 *   of an engine loaded with A alone, B alone, no adapter, both: a row's own
 *   scales give the bits of that adapter set (each adapter must change the
 *   text, or the case proves nothing).
 * - Batch invariance: sessions with different adapters stepped together
 *   (joining one per step, so every pass mixes adapter sets and shapes)
 *   each produce what they produce alone.
 * - The KV cache is keyed by the scales: new scales forget a session's
 *   cache, cm_session_cached_prefix is 0 under other scales, and a prefix
 *   is never shared between sessions with different scales.
 * - Bad scales (count, NaN, out of range) are refused; defaults can change.
 */
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "synth/synth.h"
#include "test.h"

#include <math.h>
#include <unistd.h>

static char errbuf[512];
static char pa[128], pb[128];
static cm_engine *E_AB, *E_A, *E_B, *E_0;

typedef struct out {
    cm_buf b;
    int n_tok;
    float lp_sum;
} out;

static int gen_cb(void *u, const cm_token_event *ev) {
    out *o = u;
    if (ev->id >= 0) {
        o->n_tok++;
        if (ev->info) o->lp_sum += ev->info->logprob;
    }
    cm_buf_append(&o->b, ev->text, ev->len);
    return 0;
}

static const char *k_prompts[] = {
    "Once upon a time", "The cat", "Lily and Tom went to the park", "One day", "Tim had a red ball", "The sun",
    "A bird",           "Mom said"};
#define NP 8
/* the adapter sets: scales of (A, B), and the engine that holds exactly that set */
static const float k_sets[4][2] = {{1.0f, 0.0f}, {0.0f, 0.7f}, {0.0f, 0.0f}, {1.0f, 0.7f}};
static cm_engine **k_ref[4] = {&E_A, &E_B, &E_0, &E_AB};

static void params(cm_gen_params *p, int i) {
    cm_gen_params_default(p);
    p->sampling.temperature = i % 3 == 2 ? 0.8f : 0.0f; /* some seeded sampled streams */
    p->sampling.seed = 42 + (uint64_t)i;
    p->n_predict = 16 + 5 * i;
}

static int prompt_ids(cm_engine *e, int i, int32_t *ids) {
    return cm_engine_tokenize(e, k_prompts[i], strlen(k_prompts[i]), true, false, ids, 256, errbuf, sizeof errbuf);
}

/* Prompt i alone on engine e, with the scales sc (NULL: the engine's). */
static void alone(cm_engine *e, int i, const float *sc, out *o) {
    int32_t ids[256];
    memset(o, 0, sizeof *o);
    cm_session *s = cm_session_new(e, 256, errbuf, sizeof errbuf);
    if (sc) CHECK(cm_session_set_lora(s, sc, 2, errbuf, sizeof errbuf) == 0);
    int n = prompt_ids(e, i, ids);
    CHECK(cm_session_set_prompt(s, ids, n, errbuf, sizeof errbuf) == 0);
    cm_gen_params p;
    params(&p, i);
    cm_gen_result r;
    CHECK(cm_session_generate(s, &p, gen_cb, o, &r, errbuf, sizeof errbuf) == 0);
    cm_session_free(s);
}

static bool same(const out *a, const out *b) {
    return a->n_tok == b->n_tok && a->lp_sum == b->lp_sum && a->b.len == b->b.len &&
           !memcmp(a->b.data, b->b.data, a->b.len);
}

/* Prompt i with set i % 4: per-row scales equal the engine holding that set. */
static void test_rows_equal_loaded_sets(void) {
    for (int i = 0; i < NP; i++) {
        out want, got;
        alone(*k_ref[i % 4], i, NULL, &want);
        alone(E_AB, i, k_sets[i % 4], &got);
        CHECKF(same(&want, &got), "prompt %d set %d: '%.*s' (%g) vs '%.*s' (%g)", i, i % 4, (int)want.b.len,
               want.b.data, want.lp_sum, (int)got.b.len, got.b.data, got.lp_sum);
        cm_buf_release(&want.b);
        cm_buf_release(&got.b);
    }
    /* every adapter matters: A, B and none give three different greedy texts */
    out o[3];
    for (int k = 0; k < 3; k++) alone(E_AB, 0, k_sets[k], &o[k]);
    for (int k = 0; k < 3; k++) {
        CHECKF(!same(&o[k], &o[(k + 1) % 3]), "sets %d and %d give the same text '%.*s'", k, (k + 1) % 3,
               (int)o[k].b.len, o[k].b.data);
    }
    for (int k = 0; k < 3; k++) cm_buf_release(&o[k].b);
}

/* Sessions with different adapter sets in one batch: each as alone. */
static void test_batched_mixed_sets(void) {
    out ref[NP], together[NP];
    for (int i = 0; i < NP; i++) alone(E_AB, i, k_sets[i % 4], &ref[i]);
    cm_session *ss[NP];
    int32_t ids[256];
    int joined = 0, steps = 0, mixed = 0;
    for (;;) {
        if (joined < NP) { /* one newcomer per step: the batch changes shape and mix */
            memset(&together[joined], 0, sizeof together[joined]);
            ss[joined] = cm_session_new(E_AB, 256, errbuf, sizeof errbuf);
            CHECK(cm_session_set_lora(ss[joined], k_sets[joined % 4], 2, errbuf, sizeof errbuf) == 0);
            int n = prompt_ids(E_AB, joined, ids);
            CHECK(cm_session_set_prompt(ss[joined], ids, n, errbuf, sizeof errbuf) == 0);
            cm_gen_params p;
            params(&p, joined);
            CHECK(cm_session_start(ss[joined], &p, gen_cb, &together[joined], errbuf, sizeof errbuf) == 0);
            joined++;
        }
        int running = 0, sets = 0;
        for (int i = 0; i < joined; i++)
            if (cm_session_running(ss[i])) {
                running++;
                sets |= 1 << (i % 4);
            }
        if (!running && joined == NP) break;
        mixed += running > 1 && (sets & (sets - 1)); /* two sets or more in this step */
        int r = cm_engine_step(E_AB, ss, joined, errbuf, sizeof errbuf);
        CHECKF(r >= 0, "step: %s", errbuf);
        if (r < 0 || ++steps > 1000) break;
    }
    CHECKF(mixed >= 10, "only %d steps mixed adapter sets", mixed);
    for (int i = 0; i < NP; i++) {
        cm_gen_result res;
        CHECK(cm_session_finish(ss[i], &res) == 0);
        CHECKF(same(&ref[i], &together[i]), "prompt %d set %d batched: '%.*s' (%g) vs alone '%.*s' (%g)", i, i % 4,
               (int)together[i].b.len, together[i].b.data, together[i].lp_sum, (int)ref[i].b.len, ref[i].b.data,
               ref[i].lp_sum);
        cm_buf_release(&ref[i].b);
        cm_buf_release(&together[i].b);
        cm_session_free(ss[i]);
    }
}

/* A KV cache computed with one adapter set is never reused with another. */
static void test_prefix_keyed_by_adapters(void) {
    int32_t ids[256];
    int n = prompt_ids(E_AB, 2, ids);
    cm_session *a = cm_session_new(E_AB, 256, errbuf, sizeof errbuf);
    cm_session *b = cm_session_new(E_AB, 256, errbuf, sizeof errbuf);
    CHECK(cm_session_set_lora(a, k_sets[0], 2, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_set_prompt(a, ids, n, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_cached_prefix(a, ids, n, k_sets[0], 2) == n);
    CHECK(cm_session_cached_prefix(a, ids, n, k_sets[1], 2) == 0);
    CHECK(cm_session_cached_prefix(a, ids, n, NULL, 0) == 0);
    /* b under other scales: no share */
    CHECK(cm_session_set_lora(b, k_sets[1], 2, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_share_prefix(b, a, n - 1, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECK(cm_session_copy_prefix(b, a, n - 1, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECK(cm_session_n_past(b) == 0);
    /* under the same scales: shared */
    CHECK(cm_session_set_lora(b, k_sets[0], 2, errbuf, sizeof errbuf) == 0);
    CHECKF(cm_session_share_prefix(b, a, n - 1, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    CHECK(cm_session_n_past(b) == n - 1);
    /* the same scales again keep the cache; new ones forget it */
    CHECK(cm_session_set_lora(a, k_sets[0], 2, errbuf, sizeof errbuf) == 0 && cm_session_n_past(a) == n);
    CHECK(cm_session_set_lora(a, k_sets[2], 2, errbuf, sizeof errbuf) == 0 && cm_session_n_past(a) == 0);
    /* and a prompt evaluated again under the new scales matches the engine without adapters */
    CHECK(cm_session_set_prompt(a, ids, n, errbuf, sizeof errbuf) == 0);
    out o1, o2;
    memset(&o1, 0, sizeof o1);
    cm_gen_params p;
    params(&p, 0);
    cm_gen_result r;
    CHECK(cm_session_generate(a, &p, gen_cb, &o1, &r, errbuf, sizeof errbuf) == 0);
    memset(&o2, 0, sizeof o2);
    cm_session *z = cm_session_new(E_0, 256, errbuf, sizeof errbuf);
    CHECK(cm_session_set_prompt(z, ids, n, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(z, &p, gen_cb, &o2, &r, errbuf, sizeof errbuf) == 0);
    CHECK(same(&o1, &o2));
    cm_buf_release(&o1.b);
    cm_buf_release(&o2.b);
    cm_session_free(z);
    cm_session_free(a);
    cm_session_free(b);
}

static void test_bad_scales_and_defaults(void) {
    cm_session *s = cm_session_new(E_AB, 64, errbuf, sizeof errbuf);
    const float one[1] = {1}, nan2[2] = {NAN, 0}, big[2] = {0, 2e6f};
    CHECK(cm_session_set_lora(s, one, 1, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECKF(strstr(errbuf, "1 LoRA scales for 2 adapters") != NULL, "%s", errbuf);
    CHECK(cm_session_set_lora(s, nan2, 2, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECK(cm_session_set_lora(s, big, 2, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECKF(strstr(errbuf, "adapter 1") != NULL, "%s", errbuf);
    int n;
    const float *cur = cm_session_lora(s, &n);
    CHECK(n == 2 && cur[0] == 1.0f && fabsf(cur[1] - 0.7f) < 1e-6f); /* the load's FILE:SCALE */
    CHECK(cm_engine_lora_count(E_AB) == 2 && cm_engine_lora_count(E_0) == 0);
    CHECK(!strcmp(cm_engine_lora_path(E_AB, 1), pb) && !cm_engine_lora_path(E_AB, 2));
    const float d[2] = {0.25f, 0};
    CHECK(cm_engine_lora_set_defaults(E_AB, d, 2, errbuf, sizeof errbuf) == 0);
    float got[2];
    cm_engine_lora_defaults(E_AB, got, 2);
    CHECK(got[0] == 0.25f && got[1] == 0);
    cm_session *t = cm_session_new(E_AB, 64, errbuf, sizeof errbuf); /* new sessions start from the defaults */
    cur = cm_session_lora(t, &n);
    CHECK(cur[0] == 0.25f && cur[1] == 0);
    CHECK(cm_engine_lora_set_defaults(E_AB, nan2, 2, errbuf, sizeof errbuf) == CM_EINVAL);
    const float back[2] = {1.0f, 0.7f};
    CHECK(cm_engine_lora_set_defaults(E_AB, back, 2, errbuf, sizeof errbuf) == 0);
    cm_session_free(t);
    cm_session_free(s);
}

static int write_adapter(const char *path, int rank, float alpha, uint64_t seed, const char *only) {
    cm_gguf g;
    if (cm_gguf_open(&g, t_shared("models/stories260K-q8_0.gguf"), NULL, NULL, errbuf, sizeof errbuf)) return -1;
    cm_synth_lora_params p = {.rank = rank, .alpha = alpha, .strength = 0.1f, .seed = seed, .only = only};
    int rc = cm_synth_lora_write(&p, &g, path, NULL, errbuf, sizeof errbuf);
    cm_gguf_close(&g);
    return rc;
}

static cm_engine *load(const char *const *loras, int n) {
    cm_engine_opts o = {.n_threads = 2, .n_batch = 4, .loras = loras, .n_loras = n};
    cm_engine *e = NULL;
    if (cm_engine_load(&e, t_shared("models/stories260K-q8_0.gguf"), &o, errbuf, sizeof errbuf))
        fprintf(stderr, "%s\n", errbuf);
    return e;
}

int main(void) {
    snprintf(pa, sizeof pa, "/tmp/cumulo-test-lora-rows-a-%d.gguf", (int)getpid());
    snprintf(pb, sizeof pb, "/tmp/cumulo-test-lora-rows-b-%d.gguf", (int)getpid());
    if (write_adapter(pa, 4, 8, 7, NULL) || write_adapter(pb, 8, 0, 8, "ffn")) {
        fprintf(stderr, "adapters: %s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    char sa[160], sb[160];
    snprintf(sa, sizeof sa, "%s:1", pa);
    snprintf(sb, sizeof sb, "%s:0.7", pb);
    const char *ab[2] = {sa, sb}, *a[1] = {sa}, *b[1] = {sb};
    E_AB = load(ab, 2);
    E_A = load(a, 1);
    E_B = load(b, 1);
    E_0 = load(NULL, 0);
    if (!E_AB || !E_A || !E_B || !E_0) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_rows_equal_loaded_sets);
    RUN(test_batched_mixed_sets);
    RUN(test_prefix_keyed_by_adapters);
    RUN(test_bad_scales_and_defaults);
    cm_engine_free(E_AB);
    cm_engine_free(E_A);
    cm_engine_free(E_B);
    cm_engine_free(E_0);
    unlink(pa);
    unlink(pb);
    TEST_END();
}
