/* test_api_stops.c: the stop strings of a request (cm_api_parse_stops,
 * src/http/api_parse.c), the one parser behind OpenAI's "stop" and
 * Anthropic's "stop_sequences": what each API accepts, the 400 each names,
 * and out of memory while copying them: a 503 in the API's style, the
 * strings copied so far owned by the job (nothing leaks: run it under
 * valgrind or ASan), no NULL among the job's stops. cm_strdup fails on
 * demand: this test links with -Wl,--wrap=cm_strdup (Makefile; GNU ld and
 * lld have it, macOS's linker not: there CM_TEST_NO_WRAP leaves that part
 * out, reported as a skip). */
#include "test.h"

#include "http/http_impl.h"

#include <cjson/cJSON.h>

#ifndef CM_TEST_NO_WRAP
char *__real_cm_strdup(const char *s);
char *__wrap_cm_strdup(const char *s);

static int strdup_fail_in = -1; /* cm_strdup calls until one fails; -1: none does */

char *__wrap_cm_strdup(const char *s) {
    if (strdup_fail_in >= 0 && strdup_fail_in-- == 0) return NULL;
    return __real_cm_strdup(s);
}
#endif

/* What the job's release does with its stops (server.c). */
static void release(job *j) {
    for (int i = 0; i < j->n_stops; i++) cm_free(j->stops[i]);
    cm_free(j->stops);
    *j = (job){0};
}

/* Parse body's stops into *j (zeroed first); the return code, with *ae. */
static int parse(enum cm_api_kind api, const char *body, job *j, api_error *ae) {
    *j = (job){0};
    *ae = (api_error){0};
    cJSON *root = cJSON_Parse(body);
    CHECKF(root != NULL, "bad test JSON '%s'", body);
    int rc = cm_api_parse_stops(api, root, j, ae);
    cJSON_Delete(root);
    return rc;
}

static void expect_400(enum cm_api_kind api, const char *body, const char *msg) {
    job j;
    api_error ae;
    int rc = parse(api, body, &j, &ae);
    CHECKF(rc == -1 && ae.status == 400 && !strcmp(ae.message, msg), "%s: rc %d, %d '%s', want 400 '%s'", body, rc,
           ae.status, ae.message, msg);
    release(&j);
}

static void test_openai(void) {
    job j;
    api_error ae;
    CHECK(parse(CM_API_OPENAI, "{\"stop\":[\"a\",\"\",\"bc\"]}", &j, &ae) == 0);
    /* the empty string matches nothing: left out */
    CHECK(j.n_stops == 2 && j.gp.n_stops == 2 && j.gp.stops == (const char *const *)j.stops);
    CHECK(j.n_stops == 2 && !strcmp(j.stops[0], "a") && !strcmp(j.stops[1], "bc"));
    release(&j);
    CHECK(parse(CM_API_OPENAI, "{\"stop\":\"x\"}", &j, &ae) == 0 && j.n_stops == 1 && !strcmp(j.stops[0], "x"));
    release(&j);
    CHECK(parse(CM_API_OPENAI, "{\"stop\":null}", &j, &ae) == 0 && j.n_stops == 0 && !j.stops);
    release(&j);
    expect_400(CM_API_OPENAI, "{\"stop\":3}", "'stop' must be a string or an array of at most 16 strings");
    expect_400(
        CM_API_OPENAI,
        "{\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
        "'stop' must be a string or an array of at most 16 strings");
    expect_400(CM_API_OPENAI, "{\"stop\":[\"a\",1]}",
               "'stop' must be a string or an array of strings (each at most 1024 bytes)");
}

static void test_anthropic(void) {
    job j;
    api_error ae;
    CHECK(parse(CM_API_ANTHROPIC, "{\"stop_sequences\":[\"a\",\"bc\"]}", &j, &ae) == 0);
    CHECK(j.n_stops == 2 && j.gp.n_stops == 2 && !strcmp(j.stops[1], "bc"));
    release(&j);
    CHECK(parse(CM_API_ANTHROPIC, "{\"stop\":[\"a\"]}", &j, &ae) == 0 && j.n_stops == 0); /* not its field */
    release(&j);
    expect_400(CM_API_ANTHROPIC, "{\"stop_sequences\":\"x\"}",
               "stop_sequences: must be an array of at most 16 strings");
    expect_400(CM_API_ANTHROPIC, "{\"stop_sequences\":[\"a\",\"\"]}", "stop_sequences.1: must not be empty");
    expect_400(CM_API_ANTHROPIC, "{\"stop_sequences\":[\"a\",{}]}",
               "stop_sequences.1: must be a string of at most 1024 bytes");
}

/* cm_strdup fails at the second, then the first string: 503, the copies
 * made before it kept and counted (the job frees them), none NULL. */
#ifndef CM_TEST_NO_WRAP
static void test_out_of_memory(void) {
    static const struct {
        enum cm_api_kind api;
        const char *body, *type;
    } k[] = {{CM_API_OPENAI, "{\"stop\":[\"a\",\"b\",\"c\"]}", "server_error"},
             {CM_API_ANTHROPIC, "{\"stop_sequences\":[\"a\",\"b\",\"c\"]}", "api_error"}};
    for (size_t c = 0; c < CM_ARRAY_LEN(k); c++)
        for (int at = 0; at < 3; at++) {
            job j;
            api_error ae;
            strdup_fail_in = at;
            int rc = parse(k[c].api, k[c].body, &j, &ae);
            strdup_fail_in = -1;
            CHECKF(rc == -1 && ae.status == 503 && !strcmp(ae.type, k[c].type) && !strcmp(ae.message, "out of memory"),
                   "%s, copy %d fails: rc %d, %d %s '%s'", k[c].body, at, rc, ae.status, ae.type ? ae.type : "",
                   ae.message);
            CHECKF(j.n_stops == at, "%s, copy %d fails: %d stops kept", k[c].body, at, j.n_stops);
            for (int i = 0; i < j.n_stops; i++) CHECK(j.stops[i] != NULL);
            release(&j);
        }
}
#endif

int main(void) {
    RUN(test_openai);
    RUN(test_anthropic);
#ifndef CM_TEST_NO_WRAP
    RUN(test_out_of_memory);
    TEST_END();
#else
    printf("skip: n/a: this linker has no --wrap (cm_strdup cannot be made to fail)\n");
    TEST_END_SKIPPED(0);
#endif
}
