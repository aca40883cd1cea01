/*
 * test_batch.c: continuous batching (engine.h, batch.c) on stories260K-q8_0:
 * sessions stepped together produce exactly the text each produces alone
 * with cm_session_generate, including sessions that join late, finish early
 * (different n_predict, a stop string) or are canceled. The first check runs
 * again on a synthetic mixture-of-experts model (qwen3moe, 64 experts top 8,
 * 2 threads): tokens of different sessions route to different experts and
 * group differently at every step, yet each session's text is its own; and
 * on a synthetic llama in q4_0 whose rows are repacked, so that the decode
 * steps of up to 16 sequences run the batched gemm (kernels.h gemm_packed).
 * Mixed passes (cm_engine_step_prefill, serve's): every newcomer's prompt
 * is evaluated 3 tokens at a time inside the running sessions' decode
 * passes (or apart when the pass has no room), and still every text and
 * logprob is the one alone; and three newcomers at once, 5 prompt tokens a
 * pass in all (cm_engine_step_prefill_many), so that two prompts' chunks
 * share a pass (checked), with the same result.
 */
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "sampler/grammar.h"
#include "synth/synth.h"
#include "test.h"

#include <unistd.h>

static cm_engine *E;
static char errbuf[512];

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
#define step_cb gen_cb

static const char *k_prompts[] = {"Once upon a time",
                                  "The cat",
                                  "Lily and Tom went to the park",
                                  "One day",
                                  "Tim had a red ball",
                                  "The sun",
                                  "A bird",
                                  "Mom said",
                                  "The little dog",
                                  "Sara saw",
                                  "Ben and Mia",
                                  "It was a rainy day",
                                  "The old tree",
                                  "Max wanted",
                                  "In the garden",
                                  "A big box"};
#define NP 16 /* more than any kernel tile, so the batch crosses every gemm path */

static void params(cm_gen_params *p, int i) {
    cm_gen_params_default(p);
    p->sampling.temperature = i % 3 == 2 ? 0.8f : 0.0f; /* some seeded sampled streams */
    p->sampling.seed = 42 + (uint64_t)i;
    p->n_predict = 20 + 7 * i;
}

static int prompt_ids(int i, int32_t *ids) {
    return cm_engine_tokenize(E, k_prompts[i], strlen(k_prompts[i]), true, false, ids, 256, errbuf, sizeof errbuf);
}

static bool g_mixed;   /* newcomers' prompts ride in the decode passes */
static int g_many = 1; /* newcomers joining at once (their chunks share a pass: cm_engine_step_prefill_many) */

static void test_batched_equals_alone(void) {
    out alone[NP], together[NP];
    cm_gen_result ra[NP], rt[NP];
    int32_t ids[256];
    for (int i = 0; i < NP; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        cm_session *s = cm_session_new(E, 256, errbuf, sizeof errbuf);
        int n = prompt_ids(i, ids);
        CHECK(cm_session_set_prompt(s, ids, n, errbuf, sizeof errbuf) == 0);
        cm_gen_params p;
        params(&p, i);
        CHECK(cm_session_generate(s, &p, gen_cb, &alone[i], &ra[i], errbuf, sizeof errbuf) == 0);
        cm_session_free(s);
    }
    cm_session *ss[NP];
    for (int i = 0; i < NP; i++) {
        memset(&together[i], 0, sizeof together[i]);
        ss[i] = cm_session_new(E, 256, errbuf, sizeof errbuf);
    }
    /* Sessions join one per step, so the batch changes shape while others run. */
    int joined = 0, steps = 0, n_pre = 0, n_mixed = 0, n_shared = 0, len[NP] = {0};
    for (;;) {
        if (joined < NP && !n_pre) {
            int n = prompt_ids(joined, ids);
            if (g_mixed) {
                for (n_pre = 0; n_pre < g_many && joined + n_pre < NP; n_pre++) {
                    len[n_pre] = prompt_ids(joined + n_pre, ids);
                    CHECK(cm_session_prompt_begin(ss[joined + n_pre], ids, len[n_pre], errbuf, sizeof errbuf) == 0);
                }
            } else {
                CHECK(cm_session_set_prompt(ss[joined], ids, n, errbuf, sizeof errbuf) == 0);
                cm_gen_params p;
                params(&p, joined);
                CHECK(cm_session_start(ss[joined], &p, step_cb, &together[joined], errbuf, sizeof errbuf) == 0);
                joined++;
            }
        }
        int r;
        if (n_pre) {
            int done[NP] = {0}, any = 0, rode = 0, left = 0;
            /* budget 5: a prompt with fewer tokens left leaves room to the next one */
            r = g_many > 1
                    ? cm_engine_step_prefill_many(E, ss, joined, ss + joined, n_pre, 5, done, errbuf, sizeof errbuf)
                    : cm_engine_step_prefill(E, ss, joined, ss[joined], 3, done, errbuf, sizeof errbuf);
            for (int k = 0; k < n_pre; k++) {
                CHECKF(done[k] >= 0, "%s", errbuf);
                any += done[k] > 0;
                rode += done[k] > 0;
            }
            n_mixed += any && joined > 0; /* beside decode rows */
            n_shared += rode > 1;         /* two prompts in one pass */
            for (int k = 0; k < n_pre && !any; k++)
                if (cm_session_n_past(ss[joined + k]) < len[k]) { /* no room: apart */
                    CHECK(cm_session_prompt_step(ss[joined + k], 3, errbuf, sizeof errbuf) >= 0);
                    break;
                }
            for (int k = 0; k < n_pre; k++) left += cm_session_n_past(ss[joined + k]) < len[k];
            if (!left) { /* all of them start together, the array of running sessions stays contiguous */
                for (int k = 0; k < n_pre; k++, joined++) {
                    cm_gen_params p;
                    params(&p, joined);
                    CHECK(cm_session_start(ss[joined], &p, step_cb, &together[joined], errbuf, sizeof errbuf) == 0);
                }
                n_pre = 0;
                if (r == 0) r = 1; /* they run from the next step */
            }
        } else {
            r = cm_engine_step(E, ss, joined, errbuf, sizeof errbuf);
        }
        CHECKF(r >= 0, "%s", errbuf);
        steps++;
        if (r <= 0 && joined == NP) break;
        if (steps > 1000) break;
    }
    CHECKF(!g_mixed || n_mixed > 0, "no prompt chunk rode in a decode pass");
    CHECKF(g_many < 2 || n_shared > 0, "no two prompts' chunks rode in one pass");
    for (int i = 0; i < NP; i++) {
        CHECK(!cm_session_running(ss[i]));
        CHECK(cm_session_finish(ss[i], &rt[i]) == 0);
        cm_buf_append(&alone[i].b, "", 1);
        cm_buf_append(&together[i].b, "", 1);
        CHECKF(!strcmp(alone[i].b.data, together[i].b.data), "prompt %d: alone '%s' together '%s'", i, alone[i].b.data,
               together[i].b.data);
        CHECKF(rt[i].finish == ra[i].finish, "prompt %d finish %d vs %d", i, rt[i].finish, ra[i].finish);
        CHECK(rt[i].t.n_gen == ra[i].t.n_gen);
        CHECK(together[i].lp_sum < 0);
        CHECKF(together[i].lp_sum == alone[i].lp_sum, "prompt %d logprobs %g vs %g", i, together[i].lp_sum,
               alone[i].lp_sum);
        cm_buf_release(&alone[i].b);
        cm_buf_release(&together[i].b);
        cm_session_free(ss[i]);
    }
}

static void test_cancel_and_stop(void) {
    cm_session *a = cm_session_new(E, 256, errbuf, sizeof errbuf), *b = cm_session_new(E, 256, errbuf, sizeof errbuf);
    int32_t ids[256];
    int n = prompt_ids(0, ids);
    out oa = {0}, ob = {0};
    cm_gen_params p;
    params(&p, 0);
    p.n_predict = 100;
    CHECK(cm_session_set_prompt(a, ids, n, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_start(a, &p, step_cb, &oa, errbuf, sizeof errbuf) == 0);
    const char *stops[] = {"."};
    p.stops = stops;
    p.n_stops = 1;
    CHECK(cm_session_set_prompt(b, ids, n, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_start(b, &p, step_cb, &ob, errbuf, sizeof errbuf) == 0);
    cm_session *ss[2] = {a, b};
    for (int i = 0; i < 3; i++) CHECK(cm_engine_step(E, ss, 2, errbuf, sizeof errbuf) >= 1);
    cm_session_cancel(a);
    for (int i = 0; i < 200 && (cm_session_running(a) || cm_session_running(b)); i++)
        cm_engine_step(E, ss, 2, errbuf, sizeof errbuf);
    cm_gen_result ra, rb;
    CHECK(cm_session_finish(a, &ra) == 0 && ra.finish == CM_FINISH_CANCEL && ra.t.n_gen == 3);
    CHECK(cm_session_finish(b, &rb) == 0 && rb.finish == CM_FINISH_STOP);
    cm_buf_append(&ob.b, "", 1);
    CHECKF(!strchr(ob.b.data, '.'), "'%s'", ob.b.data);
    CHECK(cm_session_finish(a, &ra) == CM_ESTATE);
    cm_buf_release(&oa.b);
    cm_buf_release(&ob.b);
    cm_session_free(a);
    cm_session_free(b);
}

/* Interjections (engine.h cm_engine_set_interject): newcomers' prompts are
 * evaluated between two layers of a running step's pass, on a context of
 * their own, and their first tokens streamed there; every stream (the
 * paused pass's and the newcomers') must give the text and logprobs it
 * gives alone. Fails if the paused pass is disturbed (shared scratch), if
 * a newcomer's first token is sampled twice or lost, or if no interjection
 * happens. */
typedef struct ij_state {
    cm_session **ss;
    out *o;
    int next, n_total, n_ij;
    const cm_grammar *g; /* the last newcomer's grammar (its token texts are built under the engine's lock) */
} ij_state;

static void ij_fn(void *user) {
    ij_state *st = user;
    if (st->n_ij >= st->n_total || st->n_ij > st->next) return; /* one per step: the array grows between steps */
    int32_t ids[256];
    const int i = st->n_ij, n = prompt_ids(i, ids);
    CHECK(cm_session_prompt_begin(st->ss[i], ids, n, errbuf, sizeof errbuf) == 0);
    const int k = cm_engine_interject_prompts(E, &st->ss[i], 1, errbuf, sizeof errbuf);
    CHECKF(k == 1, "interjected %d: %s", k, errbuf);
    if (k != 1) return;
    cm_gen_params p;
    params(&p, i);
    if (i == st->n_total - 1) p.grammar = st->g;
    CHECK(cm_session_start(st->ss[i], &p, step_cb, &st->o[i], errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_first_token(st->ss[i]) == 1);
    CHECK(st->o[i].n_tok == 1); /* streamed now, not at the next step */
    st->n_ij++;
}

static void test_interject(void) {
    enum { N = 8, FIRST = 3 };
    out alone[N], together[N];
    int32_t ids[256];
    cm_grammar *g = cm_grammar_new(); /* the last one: a grammar, " the" then letters and spaces */
    const int root = cm_grammar_rule(g), tail = cm_grammar_rule(g);
    cm_grammar_lit(g, root, " the");
    cm_grammar_ref(g, root, tail);
    cm_grammar_range(g, tail, 'a', 'z');
    cm_grammar_ref(g, tail, tail);
    cm_grammar_alt(g, tail);
    cm_grammar_lit(g, tail, " ");
    cm_grammar_ref(g, tail, tail);
    cm_grammar_alt(g, tail);
    CHECKF(cm_grammar_finish(g, root, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    for (int i = 0; i < N; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        memset(&together[i], 0, sizeof together[i]);
        cm_session *s = cm_session_new(E, 256, errbuf, sizeof errbuf);
        int n = prompt_ids(i, ids);
        CHECK(cm_session_set_prompt(s, ids, n, errbuf, sizeof errbuf) == 0);
        cm_gen_params p;
        params(&p, i);
        if (i == N - 1) p.grammar = g;
        cm_gen_result r;
        CHECK(cm_session_generate(s, &p, gen_cb, &alone[i], &r, errbuf, sizeof errbuf) == 0);
        cm_session_free(s);
    }
    cm_session *ss[N];
    for (int i = 0; i < N; i++) ss[i] = cm_session_new(E, 256, errbuf, sizeof errbuf);
    for (int i = 0; i < FIRST; i++) {
        int n = prompt_ids(i, ids);
        CHECK(cm_session_set_prompt(ss[i], ids, n, errbuf, sizeof errbuf) == 0);
        cm_gen_params p;
        params(&p, i);
        CHECK(cm_session_start(ss[i], &p, step_cb, &together[i], errbuf, sizeof errbuf) == 0);
    }
    ij_state st = {.ss = ss, .o = together, .next = FIRST, .n_total = N, .n_ij = FIRST, .g = g};
    const uint64_t before = cm_engine_interjected(E);
    CHECK(cm_engine_set_interject(E, ij_fn, &st, 16));
    for (int steps = 0; steps < 1000; steps++) {
        int r = cm_engine_step(E, ss, st.next, errbuf, sizeof errbuf);
        CHECKF(r >= 0, "%s", errbuf);
        st.next = st.n_ij; /* a newcomer runs from the next step on */
        if (r <= 0 && st.next == N) break;
    }
    CHECK(cm_engine_set_interject(E, NULL, NULL, 0));
    CHECKF(cm_engine_interjected(E) - before == N - FIRST, "%llu interjected",
           (unsigned long long)(cm_engine_interjected(E) - before));
    for (int i = 0; i < N; i++) {
        cm_gen_result rt;
        CHECK(!cm_session_running(ss[i]));
        CHECK(cm_session_finish(ss[i], &rt) == 0);
        cm_buf_append(&alone[i].b, "", 1);
        cm_buf_append(&together[i].b, "", 1);
        CHECKF(!strcmp(alone[i].b.data, together[i].b.data), "prompt %d: alone '%s' interjected '%s'", i,
               alone[i].b.data, together[i].b.data);
        CHECKF(together[i].n_tok == alone[i].n_tok, "prompt %d: %d tokens vs %d", i, together[i].n_tok, alone[i].n_tok);
        CHECKF(together[i].lp_sum == alone[i].lp_sum, "prompt %d logprobs %g vs %g", i, together[i].lp_sum,
               alone[i].lp_sum);
        cm_buf_release(&alone[i].b);
        cm_buf_release(&together[i].b);
        cm_session_free(ss[i]);
    }
    cm_grammar_free(g);
}

int main(void) {
    cm_engine_opts o = {.n_threads = 1, .n_batch = 4}; /* batch-invariant: see engine.h */
    if (cm_engine_load(&E, t_shared("models/stories260K-q8_0.gguf"), &o, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        return 1;
    }
    RUN(test_batched_equals_alone);
    RUN(test_cancel_and_stop);
    RUN(test_interject);
    g_mixed = true;
    t_cur_name = "test_batched_equals_alone (mixed passes)";
    RUN(test_batched_equals_alone);
    g_many = 3;
    RUN(test_batched_equals_alone); /* three newcomers' chunks in one pass */
    g_many = 1;
    g_mixed = false;
    cm_engine_free(E);
    E = NULL;
    /* the same on a mixture-of-experts model */
    char path[256];
    snprintf(path, sizeof path, "/tmp/cumulo-test-batch-moe-%d.gguf", (int)getpid());
    cm_gguf voc;
    cm_synth_params sp = {.arch = "qwen3moe",
                          .n_embd = 256,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .type = "q4_k",
                          .seed = 17,
                          .n_threads = 2,
                          .n_expert = 64,
                          .n_expert_used = 8,
                          .n_ff_exp = 256};
    cm_engine_opts om = {.n_threads = 2, .n_batch = 4};
    if (cm_gguf_open(&voc, t_shared("vocab/ggml-vocab-llama-spm.gguf"), NULL, NULL, errbuf, sizeof errbuf) ||
        cm_synth_write(&sp, &voc, path, NULL, errbuf, sizeof errbuf) ||
        cm_engine_load(&E, path, &om, errbuf, sizeof errbuf)) {
        fprintf(stderr, "moe model: %s\n", errbuf);
        t_failed++;
    } else {
        t_cur_name = "test_batched_equals_alone (qwen3moe)";
        RUN(test_batched_equals_alone);
        cm_engine_free(E);
    }
    unlink(path);
    /* the same on a dense llama in q4_0 wide enough (512) for the repacked
     * rows, 2 threads and n_batch 16: a step of up to 16 sequences goes
     * through the batched-decode gemm over the repacked weights
     * (gemm_packed), one token alone through the repacked gemv */
    snprintf(path, sizeof path, "/tmp/cumulo-test-batch-q4-%d.gguf", (int)getpid());
    cm_synth_params sq = {.arch = "llama",
                          .n_embd = 512,
                          .n_layer = 2,
                          .n_head = 8,
                          .n_head_kv = 4,
                          .n_ff = 1024,
                          .type = "q4_0",
                          .seed = 5,
                          .n_threads = 2};
    cm_engine_opts oq = {.n_threads = 2, .n_batch = 16};
    if (cm_synth_write(&sq, &voc, path, NULL, errbuf, sizeof errbuf) ||
        cm_engine_load(&E, path, &oq, errbuf, sizeof errbuf)) {
        fprintf(stderr, "q4_0 model: %s\n", errbuf);
        t_failed++;
    } else {
        t_cur_name = "test_batched_equals_alone (llama q4_0, batched gemm)";
        RUN(test_batched_equals_alone);
        g_mixed = true;
        RUN(test_batched_equals_alone); /* with mixed passes */
        g_many = 3;
        RUN(test_batched_equals_alone); /* three newcomers' chunks in one pass */
        g_many = 1;
        g_mixed = false;
        t_cur_name = "test_interject (llama q4_0, batched gemm)";
        RUN(test_interject);
        cm_engine_free(E);
    }
    cm_gguf_close(&voc);
    unlink(path);
    TEST_END();
}
