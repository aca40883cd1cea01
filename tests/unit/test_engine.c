/*
 * test_engine.c: the engine facade (engine.h) on stories260K: tokenize +
 * greedy generation equal llama.cpp's reference ids and llama2.c's text;
 * prefix reuse evaluates only the new tail and changes nothing; continuing
 * a generation equals generating at once; stop strings, n_predict, cancel
 * from the callback, a full context; two sessions on two threads; errors.
 */
#include "test.h"

#include "engine/engine.h"
#include "os/os.h"

#include <cjson/cJSON.h>
#include <pthread.h>

static char errbuf[512];
static cm_engine *E;

typedef struct collect {
    int32_t ids[1024];
    int n;
    char text[8192];
    size_t len;
    int stop_after; /* return 1 after this many tokens (0: never) */
    int bad_info;   /* events whose logprob info is missing or inconsistent */
    int with_top;   /* events carrying 3 top alternatives */
} collect;

static int on_tok(void *user, const cm_token_event *ev) {
    collect *c = user;
    int32_t id = ev->id;
    const char *text = ev->text;
    size_t len = ev->len;
    /* Greedy picks the most likely token: its logprob is the top one. */
    if (id >= 0 && (!ev->info || ev->info->logprob > 0 || (ev->info->n_top > 0 && ev->info->top[0].id != id)))
        c->bad_info++;
    if (id >= 0 && ev->info && ev->info->n_top == 3) c->with_top++;
    if (id >= 0 && c->n < 1024) c->ids[c->n++] = id;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    return c->stop_after && c->n >= c->stop_after;
}

static cm_gen_params greedy_params(int n) {
    cm_gen_params p;
    cm_gen_params_default(&p);
    p.n_predict = n;
    p.sampling.temperature = 0;
    p.sampling.repeat_penalty = 1;
    return p;
}

/* Reference case c of the f32 greedy file. */
static int ref_case(int c, int32_t *prompt, int *np, int32_t *gen, int *ng, char **text) {
    char *txt;
    size_t len;
    if (cm_file_read_all(t_shared("reference/stories260K-f32.greedy.json"), &txt, &len, errbuf, sizeof errbuf))
        return -1;
    cJSON *j = cJSON_Parse(txt);
    cm_free(txt);
    cJSON *cs = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "cases"), c), *t;
    *np = *ng = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(cs, "prompt_tokens")) prompt[(*np)++] = t->valueint;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(cs, "generated_tokens")) gen[(*ng)++] = t->valueint;
    if (text) *text = cm_strdup(cJSON_GetObjectItem(cs, "prompt")->valuestring);
    cJSON_Delete(j);
    return 0;
}

static void test_tokenize_and_greedy(void) {
    for (int c = 0; c < 4; c++) {
        int32_t prompt[64], gen[256], toks[64];
        int np, ng;
        char *text;
        CHECK(ref_case(c, prompt, &np, gen, &ng, &text) == 0);
        int n = cm_engine_tokenize(E, text, strlen(text), true, false, toks, 64, errbuf, sizeof errbuf);
        CHECKF(n == np && !memcmp(toks, prompt, (size_t)np * 4), "case %d: prompt tokens differ from llama.cpp", c);
        cm_session *s = cm_session_new(E, 512, errbuf, sizeof errbuf);
        CHECK(cm_session_set_prompt(s, toks, n, errbuf, sizeof errbuf) == 0);
        cm_gen_params p = greedy_params(ng);
        p.sampling.n_probs = c == 1 ? 3 : 0;
        static collect col;
        memset(&col, 0, sizeof col);
        cm_gen_result res;
        CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
        CHECK(col.with_top == (c == 1 ? ng : 0));
        CHECKF(col.n == ng && !memcmp(col.ids, gen, (size_t)ng * 4), "case %d: ids differ", c);
        CHECK(res.finish == CM_FINISH_LENGTH && res.t.n_gen == ng && res.t.n_prompt == np);
        CHECK(col.bad_info == 0);
        if (c == 0) {
            char *want;
            size_t wl;
            CHECK(cm_file_read_all(t_shared("reference/stories260K.llama2c-expected-200.txt"), &want, &wl, errbuf,
                                   sizeof errbuf) == 0);
            CHECKF(col.len == wl && !memcmp(col.text, want, wl), "text differs from llama2.c's:\n%s", col.text);
            cm_free(want);
        }
        cm_free(text);
        cm_session_free(s);
    }
}

static void test_prefix_reuse_and_continue(void) {
    int32_t prompt[64], gen[256];
    int np, ng;
    CHECK(ref_case(0, prompt, &np, gen, &ng, NULL) == 0);
    /* Prompt = BOS + the first 20 reference ids; then BOS + 30: only 10 new. */
    int32_t seq[64];
    seq[0] = 1;
    memcpy(seq + 1, gen, 40 * sizeof *seq);
    cm_session *s = cm_session_new(E, 256, errbuf, sizeof errbuf);
    CHECK(cm_session_set_prompt(s, seq, 21, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_timings(s).n_prompt == 21);
    CHECK(cm_session_set_prompt(s, seq, 31, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_timings(s).n_prompt == 10);
    /* The same prompt again re-evaluates only the last token. */
    CHECK(cm_session_set_prompt(s, seq, 31, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_timings(s).n_prompt == 1);
    /* Generate 5, then 5 more (continuing), equals the reference. */
    cm_gen_params p = greedy_params(5);
    static collect col;
    memset(&col, 0, sizeof col);
    cm_gen_result res;
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECKF(col.n == 10 && !memcmp(col.ids, gen + 30, 10 * sizeof *gen), "continued generation differs");
    /* A shorter prompt ("Once upon a time", which the cached story also
     * starts with) truncates the cache to it: only its last token is new. */
    int32_t other[8] = {1, 403, 407, 261, 378};
    CHECK(cm_session_set_prompt(s, other, 5, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_timings(s).n_prompt == 1);
    memset(&col, 0, sizeof col);
    p.n_predict = 8;
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    int32_t p1[64], g1[256];
    int n1, m1;
    ref_case(1, p1, &n1, g1, &m1, NULL);
    CHECK(col.n == 8 && !memcmp(col.ids, g1, 8 * sizeof *g1));
    int n;
    const int32_t *h = cm_session_tokens(s, &n);
    CHECK(n == 13 && h[4] == 378 && h[5] == g1[0]);
    cm_session_free(s);
}

static void test_stops_and_limits(void) {
    int32_t bos = 1;
    cm_session *s = cm_session_new(E, 512, errbuf, sizeof errbuf);
    cm_gen_params p = greedy_params(200);
    const char *stops[] = {"girl"};
    p.stops = stops;
    p.n_stops = 1;
    static collect col;
    memset(&col, 0, sizeof col);
    cm_gen_result res;
    CHECK(cm_session_set_prompt(s, &bos, 1, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECKF(res.finish == CM_FINISH_STOP && res.stop_index == 0 &&
               !strcmp(col.text, "Once upon a time, there was a little "),
           "stop: finish %s text '%s'", cm_finish_name(res.finish), col.text);
    /* Cancel from the callback. */
    p = greedy_params(100);
    memset(&col, 0, sizeof col);
    col.stop_after = 7;
    CHECK(cm_session_set_prompt(s, &bos, 1, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECK(res.finish == CM_FINISH_CANCEL && col.n == 7);
    /* Cancel from outside, before generation: generate clears it, so it runs. */
    cm_session_cancel(s);
    memset(&col, 0, sizeof col);
    p.n_predict = 3;
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECK(res.finish == CM_FINISH_LENGTH && col.n == 3);
    cm_session_free(s);
    /* A full context ends generation with finish = ctx. */
    s = cm_session_new(E, 16, errbuf, sizeof errbuf);
    p = greedy_params(100);
    memset(&col, 0, sizeof col);
    CHECK(cm_session_set_prompt(s, &bos, 1, errbuf, sizeof errbuf) == 0);
    CHECK(cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECKF(res.finish == CM_FINISH_CTX && col.n == 15, "ctx: finish %s, %d tokens", cm_finish_name(res.finish), col.n);
    /* A prompt longer than the context is refused. */
    int32_t many[20];
    for (int i = 0; i < 20; i++) many[i] = i ? 400 : 1;
    CHECK(cm_session_set_prompt(s, many, 20, errbuf, sizeof errbuf) == CM_ENOSPACE);
    CHECK(strstr(errbuf, "does not fit the context of 16") != NULL);
    many[3] = 99999;
    CHECK(cm_session_set_prompt(s, many, 10, errbuf, sizeof errbuf) == CM_EINVAL);
    cm_session_free(s);
}

typedef struct thr {
    int c;
    int ok;
    int32_t prompt[64], gen[256];
    int np, ng;
} thr;

static void *thr_main(void *arg) {
    thr *t = arg;
    int32_t *prompt = t->prompt, *gen = t->gen;
    int np = t->np, ng = t->ng;
    char eb[256];
    cm_session *s = cm_session_new(E, 256, eb, sizeof eb);
    cm_gen_params p = greedy_params(ng);
    collect *col = cm_calloc(1, sizeof *col);
    cm_gen_result res;
    t->ok = s && cm_session_set_prompt(s, prompt, np, eb, sizeof eb) == 0 &&
            cm_session_generate(s, &p, on_tok, col, &res, eb, sizeof eb) == 0 && col->n == ng &&
            !memcmp(col->ids, gen, (size_t)ng * 4);
    cm_free(col);
    cm_session_free(s);
    return NULL;
}

static void test_two_sessions_threads(void) {
    pthread_t th[2];
    static thr t[2] = {{.c = 1}, {.c = 3}};
    for (int i = 0; i < 2; i++) CHECK(ref_case(t[i].c, t[i].prompt, &t[i].np, t[i].gen, &t[i].ng, NULL) == 0);
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thr_main, &t[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(t[0].ok && t[1].ok);
}

static void test_info_and_errors(void) {
    cm_engine_info in;
    cm_engine_get_info(E, &in);
    CHECK(!strcmp(in.arch, "llama") && in.n_layer == 5 && in.n_vocab == 512 && in.bos == 1 && in.eos == 2);
    CHECK(in.kv_bytes_per_token == 2 * 5 * 4 * 8 * 4 && in.n_params == 292800);
    cm_type_usage tu[8];
    CHECK(cm_engine_type_usage(E, tu, 8) == 1 && !strcmp(tu[0].type, "f32"));
    cm_engine *e2;
    CHECK(cm_engine_load(&e2, "/nonexistent/x.gguf", NULL, errbuf, sizeof errbuf) == CM_ENOENT);
    CHECK(strstr(errbuf, "cannot open '/nonexistent/x.gguf'") != NULL);
    cm_engine_opts o = {.n_threads = 1, .n_ctx = 64};
    CHECK(cm_engine_load(&e2, t_shared("models/stories260K-q4_0.gguf"), &o, errbuf, sizeof errbuf) == 0);
    cm_engine_get_info(e2, &in);
    CHECK(in.n_ctx == 64 && in.n_threads == 1);
    CHECK(cm_engine_type_usage(e2, tu, 8) == 2);
    cm_engine_free(e2);
    cm_engine_free(NULL);
    /* Chat: stories260K has no template (an error naming the choices); a named one renders. */
    cm_buf b;
    cm_buf_init(&b);
    cm_chat_msg msgs[2] = {{"system", "Be brief."}, {"user", "hi"}};
    CHECK(cm_engine_chat_render(E, NULL, msgs, 2, true, &b, errbuf, sizeof errbuf) == CM_EUNSUPPORTED);
    CHECK(strstr(errbuf, "chatml") != NULL);
    CHECK(cm_engine_chat_render(E, "chatml", msgs, 2, true, &b, errbuf, sizeof errbuf) == 0);
    cm_buf_append(&b, "", 1);
    CHECKF(b.data && !strcmp(b.data, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                     "<|im_start|>assistant\n"),
           "%s", b.data);
    cm_buf_release(&b);
    cm_session_free(NULL);
}

/* Weights read into memory by default (this test's E), mapped on request:
 * the same ids either way; a cluster engine and CUMULO_MMAP=1 map. */
static void test_weights_in_memory(void) {
    cm_engine_info in;
    cm_engine_get_info(E, &in);
    CHECK(in.weights_in_memory);
    cm_engine_opts o = {.n_threads = 1, .mmap = true};
    cm_engine *e2 = NULL;
    CHECK(cm_engine_load(&e2, t_shared("models/stories260K-f32.gguf"), &o, errbuf, sizeof errbuf) == 0);
    if (!e2) return;
    cm_engine_get_info(e2, &in);
    CHECK(!in.weights_in_memory);
    int32_t prompt[64], gen[256];
    int np, ng;
    char *text;
    CHECK(ref_case(0, prompt, &np, gen, &ng, &text) == 0);
    cm_session *s = cm_session_new(e2, 512, errbuf, sizeof errbuf);
    CHECK(s && cm_session_set_prompt(s, prompt, np, errbuf, sizeof errbuf) == 0);
    cm_gen_params p = greedy_params(ng);
    static collect col;
    memset(&col, 0, sizeof col);
    cm_gen_result res;
    CHECK(s && cm_session_generate(s, &p, on_tok, &col, &res, errbuf, sizeof errbuf) == 0);
    CHECKF(col.n == ng && !memcmp(col.ids, gen, (size_t)ng * 4), "mapped weights: ids differ");
    cm_session_free(s);
    cm_free(text);
    cm_engine_free(e2);
    cm_engine_opts c = {.nodes = "127.0.0.1:1"};
    CHECK(!cm_engine_weights_in_memory(&c, 4096));
    CHECK(cm_engine_weights_in_memory(NULL, 4096));
    setenv("CUMULO_MMAP", "1", 1);
    cm_config_reload();
    CHECK(!cm_engine_weights_in_memory(NULL, 4096));
    unsetenv("CUMULO_MMAP");
    cm_config_reload();
}

int main(void) {
    cm_engine_opts o = {.n_threads = 2};
    if (cm_engine_load(&E, t_shared("models/stories260K-f32.gguf"), &o, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_tokenize_and_greedy);
    RUN(test_prefix_reuse_and_continue);
    RUN(test_stops_and_limits);
    RUN(test_two_sessions_threads);
    RUN(test_info_and_errors);
    RUN(test_weights_in_memory);
    cm_engine_free(E);
    TEST_END();
}
