/*
 * fuzz_schema.c: libFuzzer target for the JSON-Schema compiler and the
 * grammar matcher (src/sampler/json_schema.c, grammar.c) and for reading
 * tool calls out of a reply (cm_tools_parse_text, src/http/api_tools.c):
 * schemas and replies come from HTTP clients and models, so untrusted.
 *
 * Input: SCHEMA '\0' TEXT. The schema (when it parses as JSON) compiles or
 * is refused with a message; a compiled grammar is fed TEXT in uneven
 * pieces, each accept agreeing with allows, and the whole text as complete
 * must parse as JSON (cJSON). TEXT is also parsed as a reply of every tool
 * family: every call has a name and arguments. Never writes to disk.
 */
#include "http/http_impl.h"
#include "sampler/grammar.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                               \
    do {                                                                         \
        if (!(x)) {                                                              \
            fprintf(stderr, "fuzz_schema: %s failed (line %d)\n", #x, __LINE__); \
            abort();                                                             \
        }                                                                        \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *z = memchr(data, 0, size);
    size_t sn = z ? (size_t)(z - data) : size;
    const char *text = z ? (const char *)z + 1 : "";
    size_t tn = z ? size - sn - 1 : 0;
    cJSON *schema = cJSON_ParseWithLength((const char *)data, sn);
    cm_grammar *g = NULL;
    char err[300] = "";
    int rc = cm_json_grammar(sn == 0 ? NULL : schema, &g, err, sizeof err);
    REQUIRE((rc == 0) == (g != NULL));
    REQUIRE(rc == 0 || err[0]);
    if (g && (sn == 0 || schema)) {
        cm_grammar_state *s = cm_grammar_state_new(g);
        if (s) {
            bool alive = true;
            for (size_t i = 0; i < tn && alive;) {
                size_t k = 1 + (unsigned char)text[i] % 4;
                if (k > tn - i) k = tn - i;
                bool ok = cm_grammar_allows(s, text + i, k);
                int a = cm_grammar_accept(s, text + i, k);
                REQUIRE(ok == (a == 0));
                alive = a == 0;
                i += k;
            }
            if (alive && tn && cm_grammar_complete(s)) {
                cJSON *j = cJSON_ParseWithLength(text, tn);
                REQUIRE(j != NULL);
                cJSON_Delete(j);
            }
            cm_grammar_state_free(s);
        }
    }
    cm_grammar_free(g);
    cJSON_Delete(schema);
    for (int fam = CM_TOOLS_HERMES; fam <= CM_TOOLS_MISTRAL; fam++) {
        cm_buf content;
        cm_buf_init(&content);
        void *cv = NULL;
        REQUIRE(cm_tools_parse_text(fam, text, tn, &content, &cv) == 0);
        const cJSON *c;
        cJSON_ArrayForEach(c, (cJSON *)cv) {
            REQUIRE(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, "name")));
            REQUIRE(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c, "arguments")));
        }
        cJSON_Delete(cv);
        cm_buf_release(&content);
    }
    return 0;
}
