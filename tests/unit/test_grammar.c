/* test_grammar.c: the byte grammar matcher and the JSON-schema compiler
 * (sampler/grammar.h). Accept/reject lists written by hand per schema
 * feature; a soundness check that can fail for any over-permissive rule:
 * random walks that pick uniformly among the bytes the grammar allows until
 * it is done, 300 per schema, every result parsed by cJSON (an independent
 * JSON parser) and checked against the schema's constraints; unsupported
 * keywords refused by name and path; token masks over a toy vocabulary. */
#include "test.h"

#include "sampler/grammar.h"

#include <cjson/cJSON.h>

static cm_grammar *compile(const char *schema_json, char *err, size_t errlen) {
    cJSON *s = schema_json ? cJSON_Parse(schema_json) : NULL;
    cm_grammar *g = NULL;
    int rc = cm_json_grammar(s, &g, err, errlen);
    cJSON_Delete(s);
    return rc ? NULL : g;
}

/* Whole text accepted and complete? */
static bool matches(const cm_grammar *g, const char *text) {
    cm_grammar_state *s = cm_grammar_state_new(g);
    if (!s) return false;
    bool ok = cm_grammar_accept(s, text, strlen(text)) == 0 && cm_grammar_complete(s);
    cm_grammar_state_free(s);
    return ok;
}

static void expect(const char *schema, const char *const *good, const char *const *bad) {
    char err[256] = "";
    cm_grammar *g = compile(schema, err, sizeof err);
    CHECKF(g != NULL, "%s: %s", schema ? schema : "json_object", err);
    if (!g) return;
    for (int i = 0; good[i]; i++) CHECKF(matches(g, good[i]), "should match: %s", good[i]);
    for (int i = 0; bad[i]; i++) CHECKF(!matches(g, bad[i]), "should not match: %s", bad[i]);
    cm_grammar_free(g);
}

static void test_json_object(void) {
    const char *good[] = {"{}", " {\"a\": [1, 2.5, \"x\", true, null, {\"b\": -0.5e+3}]}",
                          "{\"\\u00e9\\n\": \"\xC3\xA9\"}", "{\n  \"k\": {}\n}", NULL};
    const char *bad[] = {
        "[1]",         "{\"a\" 1}", "{", "{\"a\":01}", "{\"a\":1,}", "\"s\"", "{\"a\":\"\x01\"}", "{\"a\":\"\xC3\"}",
        "{\"a\":tru}", "{} x",      NULL};
    expect(NULL, good, bad);
}

static const char *k_person =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
    "\"maxItems\":2},\"kind\":{\"enum\":[\"a\",\"b\",3]}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}";

static void test_object_schema(void) {
    const char *good[] = {"{\"name\":\"Al\",\"age\":3}", "{ \"name\" : \"Alice\" , \"age\" : -12 , \"tags\" : [ ] }",
                          "{\"name\":\"\",\"age\":0,\"tags\":[\"x\",\"y\"],\"kind\":3}",
                          "{\"name\":\"x\",\"age\":1,\"kind\":\"b\"}", NULL};
    const char *bad[] = {"{\"age\":3,\"name\":\"x\"}",
                         "{\"name\":\"x\"}",
                         "{\"name\":\"x\",\"age\":3.5}",
                         "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}",
                         "{\"name\":\"x\",\"age\":1,\"z\":1}",
                         "{\"name\":\"toolong\",\"age\":1}",
                         "{\"name\":\"x\",\"age\":1,\"kind\":\"c\"}",
                         "{\"name\":\"x\",\"age\":1,}",
                         NULL};
    expect(k_person, good, bad);
}

static const char *k_tree =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":[\"number\",\"null\"]},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
    "\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"const\":\"none\"}]}";

static void test_ref_anyof(void) {
    const char *good[] = {"{\"v\":1}", "{\"v\":null,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]}]}", "\"none\"", NULL};
    const char *bad[] = {"{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}", "\"some\"", "null", NULL};
    expect(k_tree, good, bad);
}

static void test_unsupported(void) {
    struct {
        const char *schema, *want;
    } k[] = {
        {"{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]+$\"}}}",
         "unsupported JSON Schema keyword 'pattern' at /properties/zip"},
        {"{\"type\":\"integer\",\"minimum\":3}", "'minimum'"},
        {"{\"allOf\":[{}]}", "'allOf'"},
        {"{\"$ref\":\"http://x/y\"}", "$ref"},
        {"{\"type\":\"strnig\"}", "unknown type 'strnig'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'b' is not in 'properties'"},
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(k); i++) {
        char err[256] = "";
        cm_grammar *g = compile(k[i].schema, err, sizeof err);
        CHECKF(g == NULL && strstr(err, k[i].want), "%s -> '%s' (want '%s')", k[i].schema, err, k[i].want);
        cm_grammar_free(g);
    }
}

/* Walk: pick uniformly among allowed bytes until done, or stop at a complete
 * point with probability 1/4. */
static int walk(const cm_grammar *g, uint64_t *rng, char *out, int cap) {
    cm_grammar_state *s = cm_grammar_state_new(g);
    int n = 0;
    while (n < cap - 1) {
        if (cm_grammar_complete(s)) {
            *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
            if (cm_grammar_done(s) || (*rng >> 33) % 4 == 0) break;
        }
        unsigned char ok[256];
        int k = 0;
        for (int b = 1; b < 256; b++) {
            char c = (char)b;
            if (cm_grammar_allows(s, &c, 1)) ok[k++] = (unsigned char)b;
        }
        if (!k) {
            n = -1;
            break;
        }
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        /* prefer closing over growing once long, so walks end */
        char c = (char)ok[(*rng >> 33) % (unsigned)k];
        if (n > cap / 2) {
            for (int i = 0; i < k; i++)
                if (ok[i] == '}' || ok[i] == ']' || ok[i] == '"') c = (char)ok[i];
        }
        if (cm_grammar_accept(s, &c, 1)) {
            n = -1;
            break;
        }
        out[n++] = c;
    }
    bool complete = cm_grammar_complete(s);
    cm_grammar_state_free(s);
    if (n < 0 || !complete) return -1;
    out[n] = 0;
    return n;
}

static bool person_ok(const cJSON *j) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *age = cJSON_GetObjectItemCaseSensitive(j, "age");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(j, "tags"),
                *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !cJSON_IsNumber(age) ||
        age->valuedouble != floor(age->valuedouble))
        return false;
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, j) n++;
    if (n != 2 + (tags != NULL) + (kind != NULL)) return false;
    if (tags && (!cJSON_IsArray(tags) || cJSON_GetArraySize(tags) > 2)) return false;
    cJSON_ArrayForEach(x, tags) if (!cJSON_IsString(x)) return false;
    if (kind && !(cJSON_IsNumber(kind) && kind->valuedouble == 3) &&
        !(cJSON_IsString(kind) && (!strcmp(kind->valuestring, "a") || !strcmp(kind->valuestring, "b"))))
        return false;
    /* maxLength counts characters: the test's walks produce any UTF-8 */
    return true;
}

static void test_random_walks_sound(void) {
    char err[256] = "";
    const char *schemas[] = {NULL, k_person, k_tree};
    for (int si = 0; si < 3; si++) {
        cm_grammar *g = compile(schemas[si], err, sizeof err);
        CHECKF(g != NULL, "%s", err);
        if (!g) continue;
        uint64_t rng = 42 + (uint64_t)si;
        int valid = 0;
        static char buf[4096];
        for (int t = 0; t < 300; t++) {
            int n = walk(g, &rng, buf, sizeof buf);
            if (n < 0) continue; /* too long: not a verdict */
            cJSON *j = cJSON_Parse(buf);
            bool ok = j != NULL;
            if (ok && si == 0) ok = cJSON_IsObject(j);
            if (ok && si == 1) ok = person_ok(j);
            if (ok && si == 2)
                ok = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "v") != NULL
                                       : cJSON_IsString(j) && !strcmp(j->valuestring, "none");
            CHECKF(ok, "schema %d produced invalid '%s'", si, buf);
            valid += ok;
            cJSON_Delete(j);
        }
        CHECKF(valid >= 200, "schema %d: only %d of 300 walks finished", si, valid);
        cm_grammar_free(g);
    }
}

static void test_mask(void) {
    /* toy vocabulary: 0 "{", 1 "}", 2 "\"a\"", 3 ":", 4 "1", 5 " ", 6 "x", 7 EOG, 8 control, 9 "" */
    const char *pieces[] = {"{", "}", "\"a\"", ":", "1", " ", "x", "", "", ""};
    uint32_t off[11];
    char bytes[64];
    uint32_t o = 0;
    for (int i = 0; i < 10; i++) {
        off[i] = o;
        memcpy(bytes + o, pieces[i], strlen(pieces[i]));
        o += (uint32_t)strlen(pieces[i]);
    }
    off[10] = o;
    bool eog[10] = {[7] = true}, never[10] = {[8] = true};
    cm_grammar_vocab v = {.n_vocab = 10, .off = off, .bytes = bytes, .eog = eog, .never = never};
    char err[256];
    cm_grammar *g = compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}",
                            err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) return;
    cm_grammar_state *s = cm_grammar_state_new(g);
    float l[10];
    const int seq[] = {0, 2, 3, 4, 1};
    const char *allowed[] = {"0,5", "2,5", "3,5", "4,5", "1,4,5"};
    for (int step = 0; step < 5; step++) {
        for (int i = 0; i < 10; i++) l[i] = 0;
        int n = cm_grammar_mask(s, &v, l);
        char got[64] = "";
        for (int i = 0; i < 10; i++)
            if (l[i] == 0) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", *got ? "," : "", i);
        CHECKF(!strcmp(got, allowed[step]) && n == (int)(strlen(got) + 1) / 2, "step %d: allowed %s, want %s", step,
               got, allowed[step]);
        CHECK(cm_grammar_accept(s, pieces[seq[step]], strlen(pieces[seq[step]])) == 0);
    }
    for (int i = 0; i < 10; i++) l[i] = 0;
    cm_grammar_mask(s, &v, l);
    CHECK(l[7] == 0 && l[5] == 0 && isinf(l[0]) && isinf(l[8]) && isinf(l[9])); /* EOG or trailing space */
    CHECK(cm_grammar_complete(s) && !cm_grammar_done(s));
    CHECK(cm_grammar_accept(s, "x", 1) == CM_EINVAL && cm_grammar_complete(s)); /* refused, state kept */
    cm_grammar_state_free(s);
    cm_grammar_free(g);
}

static void test_left_recursion(void) {
    cm_grammar *g = cm_grammar_new();
    int a = cm_grammar_rule(g), b = cm_grammar_rule(g);
    cm_grammar_ref(g, a, b);
    cm_grammar_lit(g, a, "x");
    cm_grammar_alt(g, b); /* b ::= "" | a "y" : a -> b -> a without a byte */
    cm_grammar_ref(g, b, a);
    cm_grammar_lit(g, b, "y");
    char err[128] = "";
    CHECKF(cm_grammar_finish(g, a, err, sizeof err) == CM_EINVAL && strstr(err, "left-recursive"), "%s", err);
    cm_grammar_free(g);
}

int main(void) {
    RUN(test_json_object);
    RUN(test_object_schema);
    RUN(test_ref_anyof);
    RUN(test_unsupported);
    RUN(test_random_walks_sound);
    RUN(test_mask);
    RUN(test_left_recursion);
    TEST_END();
}
