/* test_tools.c: reading tool calls back out of a reply, per family
 * (cm_tools_parse_text, src/http/api_tools.c): what each family's models
 * write in "auto" mode (text before a Hermes call, several calls, Llama's
 * <|python_tag|>, "parameters" vs "arguments", Mistral's array with or
 * without [TOOL_CALLS]), and replies that only look like calls (broken
 * JSON, no name) staying content, whole. */
#include "test.h"

#include "http/http_impl.h"

#include <cjson/cJSON.h>

/* "content|name(args);name(args)" */
static void parse(int fam, const char *text, char *out, size_t cap) {
    cm_buf content;
    cm_buf_init(&content);
    void *cv = NULL;
    CHECK(cm_tools_parse_text(fam, text, strlen(text), &content, &cv) == 0);
    snprintf(out, cap, "%.*s|", (int)content.len, content.data ? content.data : "");
    const cJSON *c;
    int i = 0;
    cJSON_ArrayForEach(c, (cJSON *)cv) {
        snprintf(out + strlen(out), cap - strlen(out), "%s%s(%s)", i++ ? ";" : "",
                 cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring,
                 cJSON_GetObjectItemCaseSensitive(c, "arguments")->valuestring);
    }
    cJSON_Delete(cv);
    cm_buf_release(&content);
}

static void expect(int fam, const char *text, const char *want) {
    char got[512];
    parse(fam, text, got, sizeof got);
    CHECKF(!strcmp(got, want), "family %d: '%s' -> '%s', want '%s'", fam, text, got, want);
}

static void test_hermes(void) {
    expect(CM_TOOLS_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", "|f({\"a\":1})");
    expect(
        CM_TOOLS_HERMES,
        "Let me check.\n<tool_call>\n{\"name\":\"f\",\"arguments\":{}}\n</tool_call>\n<tool_call>{\"name\":\"g\",\"arguments\":{\"x\":\"y\"}}</tool_call>",
        "Let me check.|f({});g({\"x\":\"y\"})");
    expect(CM_TOOLS_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
           "|f({\"a\":1})"); /* cut before the close tag */
    expect(CM_TOOLS_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>|");
    expect(CM_TOOLS_HERMES, "Just text.", "Just text.|");
}

static void test_llama3(void) {
    expect(CM_TOOLS_LLAMA3, " {\"name\": \"f\", \"parameters\": {\"a\": [1, 2]}}", "|f({\"a\":[1,2]})");
    expect(CM_TOOLS_LLAMA3, "<|python_tag|>{\"name\": \"f\", \"arguments\": {}}", "|f({})");
    expect(CM_TOOLS_LLAMA3, "{\"answer\": 42}", "{\"answer\": 42}|");
    expect(CM_TOOLS_LLAMA3, "The weather is fine.", "The weather is fine.|");
}

static void test_mistral(void) {
    expect(CM_TOOLS_MISTRAL,
           "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]",
           "|f({\"a\":1});g({})");
    expect(CM_TOOLS_MISTRAL, " [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]",
           "|f({\"a\":1})"); /* control token not in the text */
    expect(CM_TOOLS_MISTRAL, "[1, 2]", "[1, 2]|");
    expect(CM_TOOLS_MISTRAL, "[{\"name\": \"f\"}, {\"nom\": 1}]", "[{\"name\": \"f\"}, {\"nom\": 1}]|");
}

int main(void) {
    RUN(test_hermes);
    RUN(test_llama3);
    RUN(test_mistral);
    TEST_END();
}
