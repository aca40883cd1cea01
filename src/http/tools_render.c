/*
 * tools_render.c: tool lists, tool calls and tool results written exactly as
 * the models' official chat templates write them (api_tools.c puts them in
 * the prompt), for the families whose templates define them:
 *   Llama 3.1-3.3 (meta-llama's template, tools in the first user message):
 *     each tool as `tool | tojson(indent=4)` then a blank line; a call as
 *     {"name": "N", "parameters": ARGS|tojson} in the assistant's turn (its
 *     content is not written); a result in its own "ipython" turn as
 *     `content | tojson` (a string is quoted: Jinja strings are iterable);
 *   Mistral v0.3 / Large-2407 and Nemo (tekken) ("v3" templates):
 *     [AVAILABLE_TOOLS] [{"type": "function", "function": {...}}] before
 *     the last user message, each function key written raw when a string
 *     and `|tojson` otherwise ("return" left out); calls as [TOOL_CALLS]
 *     [FUNCTION|tojson minus its "}", "id": "ID"}, ...] then EOS; results
 *     as [TOOL_RESULTS] {"content": CONTENT, "call_id": "ID"}[/TOOL_RESULTS]
 *     with no [INST] around them (tekken: no space after the tags).
 * tojson is Python's json.dumps as transformers and @huggingface/jinja call
 * it: separators ", " and ": ", or "," and newline plus indent with an
 * indent; non-ASCII kept; arguments strings of OpenAI calls are parsed
 * first (templates expect objects). tests/sh/http_tools.sh renders the
 * official templates with @huggingface/jinja and compares (tools_template.mjs).
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static void pystr(cm_buf *b, const char *s) {
    cm_buf_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': cm_buf_puts(b, "\\\""); break;
        case '\\': cm_buf_puts(b, "\\\\"); break;
        case '\n': cm_buf_puts(b, "\\n"); break;
        case '\r': cm_buf_puts(b, "\\r"); break;
        case '\t': cm_buf_puts(b, "\\t"); break;
        case '\b': cm_buf_puts(b, "\\b"); break;
        case '\f': cm_buf_puts(b, "\\f"); break;
        default:
            if (*p < 0x20) cm_buf_printf(b, "\\u%04x", *p);
            else cm_buf_append(b, (const char *)p, 1);
        }
    }
    cm_buf_puts(b, "\"");
}

static void pyjson_at(cm_buf *b, const cJSON *j, int indent, int depth) {
    if (cJSON_IsNull(j) || !j) {
        cm_buf_puts(b, "null");
        return;
    }
    if (cJSON_IsTrue(j)) {
        cm_buf_puts(b, "true");
        return;
    }
    if (cJSON_IsFalse(j)) {
        cm_buf_puts(b, "false");
        return;
    }
    if (cJSON_IsString(j)) {
        pystr(b, j->valuestring);
        return;
    }
    if (cJSON_IsNumber(j)) { /* the shortest text that reads back, as JavaScript prints it */
        double v = j->valuedouble;
        char t[40];
        if (v == floor(v) && fabs(v) < 1e21) snprintf(t, sizeof t, "%.0f", v);
        else {
            snprintf(t, sizeof t, "%.15g", v);
            if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
        }
        cm_buf_puts(b, t);
        return;
    }
    bool arr = cJSON_IsArray(j);
    cm_buf_puts(b, arr ? "[" : "{");
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, j) {
        if (k++) cm_buf_puts(b, indent ? "," : ", ");
        if (indent) cm_buf_printf(b, "\n%*s", indent * (depth + 1), "");
        if (!arr) {
            pystr(b, c->string ? c->string : "");
            cm_buf_puts(b, ": ");
        }
        pyjson_at(b, c, indent, depth + 1);
    }
    if (indent && k) cm_buf_printf(b, "\n%*s", indent * depth, "");
    cm_buf_puts(b, arr ? "]" : "}");
}

void cm_tools_pyjson(cm_buf *b, const void *json, int indent) { pyjson_at(b, json, indent, 0); }

void cm_tools_llama_list(cm_buf *b, const void *tools) {
    const cJSON *t;
    cJSON_ArrayForEach(t, (const cJSON *)tools) {
        pyjson_at(b, t, 4, 0);
        cm_buf_puts(b, "\n\n");
    }
}

void cm_tools_mistral_list(cm_buf *b, const void *tools, bool tekken) {
    cm_buf_puts(b, tekken ? "[AVAILABLE_TOOLS][" : "[AVAILABLE_TOOLS] [");
    const cJSON *t;
    int k = 0;
    cJSON_ArrayForEach(t, (const cJSON *)tools) {
        if (k++) cm_buf_puts(b, ", ");
        cm_buf_puts(b, "{\"type\": \"function\", \"function\": {");
        const cJSON *v;
        int q = 0;
        cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(t, "function")) {
            if (!v->string || !strcmp(v->string, "return")) continue;
            if (q++) cm_buf_puts(b, ", ");
            cm_buf_printf(b, "\"%s\": ", v->string);
            if (cJSON_IsString(v)) cm_buf_printf(b, "\"%s\"", v->valuestring); /* raw, as the template writes it */
            else pyjson_at(b, v, 0, 0);
        }
        cm_buf_puts(b, "}}");
    }
    cm_buf_puts(b, "][/AVAILABLE_TOOLS]");
}

/* An OpenAI call's arguments (a JSON text) as the object templates expect;
 * text that is not JSON stays a string. */
static cJSON *args_of(const cJSON *fn) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    cJSON *o = cJSON_IsString(a) ? cJSON_Parse(a->valuestring) : NULL;
    if (!o)
        o = cJSON_IsString(a) ? cJSON_CreateString(a->valuestring)
            : a               ? cJSON_Duplicate(a, true)
                              : cJSON_CreateObject();
    return o;
}

bool cm_tools_exact_call(int fam, bool tekken, const void *tc_, cm_buf *out, bool first) {
    const cJSON *tc = tc_, *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(name) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "arguments"))) return false;
    cJSON *args = args_of(fn);
    if (!args) return false;
    if (fam == CM_TOOLS_LLAMA3) {
        cm_buf_printf(out, "%s{\"name\": \"%s\", \"parameters\": ", first ? "" : "\n", name->valuestring);
        pyjson_at(out, args, 0, 0);
        cm_buf_puts(out, "}");
    } else { /* FUNCTION|tojson minus "}", then the id */
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
        cm_buf_puts(out, first ? (tekken ? "[TOOL_CALLS][" : "[TOOL_CALLS] [") : ", ");
        cm_buf_puts(out, "{\"name\": ");
        pystr(out, name->valuestring);
        cm_buf_puts(out, ", \"arguments\": ");
        pyjson_at(out, args, 0, 0);
        if (cJSON_IsString(id)) cm_buf_printf(out, ", \"id\": \"%s\"", id->valuestring);
        cm_buf_puts(out, "}");
    }
    cJSON_Delete(args);
    return true;
}

void cm_tools_exact_result(int fam, bool tekken, const void *msg, const char *content, cm_buf *out) {
    if (fam == CM_TOOLS_LLAMA3) { /* content | tojson */
        pystr(out, content);
        return;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive((const cJSON *)msg, "tool_call_id");
    cm_buf_printf(out, "%s{\"content\": %s", tekken ? "[TOOL_RESULTS]" : "[TOOL_RESULTS] ", content);
    if (cJSON_IsString(id)) cm_buf_printf(out, ", \"call_id\": \"%s\"", id->valuestring);
    cm_buf_puts(out, "}[/TOOL_RESULTS]");
}
