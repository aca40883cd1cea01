/*
 * api_anthropic_tools.c: tool use in Anthropic's Messages API, on top of
 * the OpenAI tool machinery (api_tools.c). The request is translated:
 * tools [{name, description, input_schema}] become functions, tool_choice
 * auto / any / tool(name) / none become auto / required / named / none,
 * assistant tool_use blocks become tool_calls and user tool_result blocks
 * become tool messages (in their order, before the user's text); then the
 * prompt is rendered for the model's family exactly as for
 * /v1/chat/completions, and a forced choice gets the same grammar. The reply
 * is parsed back into content blocks: a text block for any text, one
 * tool_use block {id, name, input} per call, stop_reason "tool_use". A
 * stream then carries its blocks at the end (message_start and ping first;
 * each block as content_block_start, one delta — text_delta or
 * input_json_delta — and content_block_stop), since a call is only known
 * once its text is complete.
 *
 * Never aborts on input; never touches sockets.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

bool cm_anth_tools_wanted(const void *root_) {
    const cJSON *root = root_;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *m, *b;
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) return true;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(root, "messages")) {
        cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(m, "content")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
            if (cJSON_IsString(t) && (!strcmp(t->valuestring, "tool_use") || !strcmp(t->valuestring, "tool_result")))
                return true;
        }
    }
    return false;
}

#define FAIL(param, ...)                                                              \
    do {                                                                              \
        cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
        goto out;                                                                     \
    } while (0)

/* Text of a string or of text blocks into a new string item ("" for null). */
static cJSON *text_of(const cJSON *c) {
    cm_buf b;
    cm_buf_init(&b);
    if (cJSON_IsString(c)) cm_buf_puts(&b, c->valuestring);
    const cJSON *x;
    if (cJSON_IsArray(c)) cJSON_ArrayForEach(x, c) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(x, "text");
            if (cJSON_IsString(t)) cm_buf_puts(&b, t->valuestring);
        }
    cm_buf_append(&b, "", 1);
    cJSON *s = cJSON_CreateString(b.data ? b.data : "");
    cm_buf_release(&b);
    return s;
}

int cm_anth_tools_prompt(cm_http_server *srv, const void *root_, job *j, cm_buf *text, api_error *ae) {
    const cJSON *root = root_;
    cJSON *o = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(o, "messages");
    int rc = -1;
    char param[64];
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (sys && !cJSON_IsNull(sys)) {
        if (!cJSON_IsString(sys) && !cJSON_IsArray(sys))
            FAIL("system", "system: must be a string or an array of text blocks");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddItemToObject(m, "content", text_of(sys));
        cJSON_AddItemToArray(msgs, m);
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "messages"), *msg;
    if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) < 1)
        FAIL("messages", "messages: Field required (a non-empty array of {role, content})");
    int i = 0;
    cJSON_ArrayForEach(msg, in) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        snprintf(param, sizeof param, "messages.%d.role", i);
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
            FAIL(param, "%s: must be 'user' or 'assistant'", param);
        bool user = !strcmp(role->valuestring, "user");
        if (!user && i == cJSON_GetArraySize(in) - 1)
            FAIL("messages", "messages: a prefilled assistant turn cannot be combined with tool use");
        cm_buf tx;
        cm_buf_init(&tx);
        cJSON *calls = user ? NULL : cJSON_CreateArray();
        if (cJSON_IsString(c)) cm_buf_puts(&tx, c->valuestring);
        else if (cJSON_IsArray(c)) {
            int k = 0;
            const cJSON *b;
            cJSON_ArrayForEach(b, c) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
                const char *ty = cJSON_IsString(t) ? t->valuestring : "";
                snprintf(param, sizeof param, "messages.%d.content.%d", i, k);
                if (!strcmp(ty, "text") && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(b, "text"))) {
                    cm_buf_puts(&tx, cJSON_GetObjectItemCaseSensitive(b, "text")->valuestring);
                } else if (!strcmp(ty, "tool_result") && user) {
                    const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
                    if (!cJSON_IsString(id)) {
                        cm_buf_release(&tx);
                        cJSON_Delete(calls);
                        FAIL(param, "%s.tool_use_id: Field required", param);
                    }
                    cJSON *m = cJSON_CreateObject();
                    cJSON_AddStringToObject(m, "role", "tool");
                    cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
                    cJSON_AddItemToObject(m, "content", text_of(cJSON_GetObjectItemCaseSensitive(b, "content")));
                    cJSON_AddItemToArray(msgs, m);
                } else if (!strcmp(ty, "tool_use") && !user) {
                    const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id"),
                                *nm = cJSON_GetObjectItemCaseSensitive(b, "name");
                    const cJSON *inp = cJSON_GetObjectItemCaseSensitive(b, "input");
                    if (!cJSON_IsString(id) || !cJSON_IsString(nm) || !cJSON_IsObject(inp)) {
                        cm_buf_release(&tx);
                        cJSON_Delete(calls);
                        FAIL(param, "%s: a tool_use block needs id, name and input (an object)", param);
                    }
                    char *args = cJSON_PrintUnformatted(inp);
                    cJSON *call = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(call, "function");
                    cJSON_AddStringToObject(call, "id", id->valuestring);
                    cJSON_AddStringToObject(call, "type", "function");
                    cJSON_AddStringToObject(fn, "name", nm->valuestring);
                    cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
                    cJSON_free(args);
                    cJSON_AddItemToArray(calls, call);
                } else {
                    cm_buf_release(&tx);
                    cJSON_Delete(calls);
                    FAIL(param,
                         "%s.type: content blocks of type '%.64s' are not supported here (text, tool_use in "
                         "assistant turns, tool_result in user turns)",
                         param, ty);
                }
                k++;
            }
        } else {
            cm_buf_release(&tx);
            cJSON_Delete(calls);
            snprintf(param, sizeof param, "messages.%d.content", i);
            FAIL(param, "%s: must be a string or an array of content blocks", param);
        }
        cm_buf_append(&tx, "", 1);
        bool has_calls = calls && cJSON_GetArraySize(calls) > 0;
        if (tx.len > 1 || has_calls) { /* a user turn of tool results only adds nothing more */
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", role->valuestring);
            if (tx.len > 1) cJSON_AddStringToObject(m, "content", tx.data);
            else cJSON_AddNullToObject(m, "content");
            if (has_calls) cJSON_AddItemToObject(m, "tool_calls", calls), calls = NULL;
            cJSON_AddItemToArray(msgs, m);
        }
        cJSON_Delete(calls);
        cm_buf_release(&tx);
        i++;
    }
    /* tools and tool_choice */
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *t;
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) FAIL("tools", "tools: must be an array");
        cJSON *ot = cJSON_AddArrayToObject(o, "tools");
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name"),
                        *d = cJSON_GetObjectItemCaseSensitive(t, "description");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(t, "input_schema"),
                        *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            if (!cJSON_IsString(nm) || !cJSON_IsObject(sc) ||
                (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "custom"))))
                FAIL("tools", "tools.%d: must be {name, description, input_schema} (server tools are not supported)",
                     k);
            cJSON *f = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(f, "function");
            cJSON_AddStringToObject(f, "type", "function");
            cJSON_AddStringToObject(fn, "name", nm->valuestring);
            if (cJSON_IsString(d)) cJSON_AddStringToObject(fn, "description", d->valuestring);
            cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(sc, true));
            cJSON_AddItemToArray(ot, f);
            k++;
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type"),
                    *nm = cJSON_GetObjectItemCaseSensitive(tc, "name");
        const char *v = cJSON_IsString(ty) ? ty->valuestring : "";
        if (!strcmp(v, "auto") || !strcmp(v, "none")) cJSON_AddStringToObject(o, "tool_choice", v);
        else if (!strcmp(v, "any")) cJSON_AddStringToObject(o, "tool_choice", "required");
        else if (!strcmp(v, "tool") && cJSON_IsString(nm)) {
            cJSON *c = cJSON_AddObjectToObject(o, "tool_choice");
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", nm->valuestring);
        } else {
            FAIL(
                "tool_choice",
                "tool_choice: must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}");
        }
    }
    rc = cm_tools_prompt(srv, o, j, text, ae);
out:
    cJSON_Delete(o);
    return rc;
}

/* ---- the reply ---- */

static const char *stop_reason(const job *j, int n_calls) {
    if (n_calls) return "tool_use";
    switch (j->finish) {
    case CM_FINISH_LENGTH:
    case CM_FINISH_CTX: return "max_tokens";
    case CM_FINISH_STOP: return "stop_sequence";
    default: return "end_turn";
    }
}

static void tool_id(cm_buf *b, const job *j, int i) {
    const char *hex = strchr(j->id, '_');
    cm_buf_printf(b, "\"toolu_%.24s%02d\"", hex ? hex + 1 : "", i);
}

static void use_block(cm_buf *b, const job *j, const cJSON *c, int i, bool with_input) {
    const char *nm = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
    cm_buf_puts(b, "{\"type\":\"tool_use\",\"id\":");
    tool_id(b, j, i);
    cm_buf_puts(b, ",\"name\":");
    cm_json_str(b, nm, strlen(nm));
    cm_buf_puts(b, ",\"input\":");
    const char *args = cJSON_GetObjectItemCaseSensitive(c, "arguments")->valuestring;
    cJSON *a = with_input ? cJSON_Parse(args) : NULL;
    char *txt = cJSON_IsObject(a) ? cJSON_PrintUnformatted(a) : NULL;
    cm_buf_puts(b, txt ? txt : "{}");
    cJSON_free(txt);
    cJSON_Delete(a);
    cm_buf_puts(b, "}");
}

static void usage_tail(cm_buf *b, const job *j, const char *reason) {
    cm_buf_printf(b, "\"stop_reason\":\"%s\",\"stop_sequence\":", reason);
    if (j->finish == CM_FINISH_STOP && j->stop_index >= 0 && j->stop_index < j->n_stops)
        cm_json_str(b, j->stops[j->stop_index], strlen(j->stops[j->stop_index]));
    else cm_buf_puts(b, "null");
}

char *cm_anth_tools_final_json(job *j) {
    cm_buf content, b;
    cm_buf_init(&b);
    cJSON *calls = cm_tools_reply(j, &content);
    int n = cJSON_GetArraySize(calls);
    cm_buf_puts(&b, "{\"id\":");
    cm_json_str(&b, j->id, strlen(j->id));
    cm_buf_puts(&b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    cm_json_str(&b, cm_http_model_id(j->srv), strlen(cm_http_model_id(j->srv)));
    cm_buf_puts(&b, ",\"content\":[");
    bool any = false;
    if (content.len || !n) {
        cm_buf_puts(&b, "{\"type\":\"text\",\"text\":");
        cm_json_str(&b, content.data ? content.data : "", content.len);
        cm_buf_puts(&b, "}");
        any = true;
    }
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        if (any) cm_buf_puts(&b, ",");
        use_block(&b, j, c, i++, true);
        any = true;
    }
    cm_buf_puts(&b, "],");
    usage_tail(&b, j, stop_reason(j, n));
    cm_buf_printf(&b, ",\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d}}", j->n_ids, j->n_gen);
    cJSON_Delete(calls);
    cm_buf_release(&content);
    return cm_api_buf_take(&b);
}

static void event(cm_buf *b, const char *name) { cm_buf_printf(b, "event: %s\ndata: ", name); }

void cm_anth_tools_stream_end(job *j) {
    cm_buf *b = &j->sse;
    if (j->http_status || j->finish == CM_FINISH_CANCEL) return; /* cm_anth_stream_end wrote the error */
    cm_buf content;
    cJSON *calls = cm_tools_reply(j, &content);
    int n = cJSON_GetArraySize(calls), idx = 0;
    if (content.len || !n) {
        event(b, "content_block_start");
        cm_buf_puts(
            b,
            "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        if (content.len) {
            event(b, "content_block_delta");
            cm_buf_puts(b,
                        "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":");
            cm_json_str(b, content.data, content.len);
            cm_buf_puts(b, "}}\n\n");
        }
        event(b, "content_block_stop");
        cm_buf_puts(b, "{\"type\":\"content_block_stop\",\"index\":0}\n\n");
        idx = 1;
    }
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        event(b, "content_block_start");
        cm_buf_printf(b, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", idx);
        use_block(b, j, c, i, false);
        cm_buf_puts(b, "}\n\n");
        event(b, "content_block_delta");
        cm_buf_printf(
            b,
            "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":",
            idx);
        const char *args = cJSON_GetObjectItemCaseSensitive(c, "arguments")->valuestring;
        cm_json_str(b, args, strlen(args));
        cm_buf_puts(b, "}}\n\n");
        event(b, "content_block_stop");
        cm_buf_printf(b, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", idx);
        idx++;
        i++;
    }
    event(b, "message_delta");
    cm_buf_puts(b, "{\"type\":\"message_delta\",\"delta\":{");
    usage_tail(b, j, stop_reason(j, n));
    cm_buf_printf(b, "},\"usage\":{\"output_tokens\":%d}}\n\n", j->n_gen);
    event(b, "message_stop");
    cm_buf_puts(b, "{\"type\":\"message_stop\"}\n\n");
    cJSON_Delete(calls);
    cm_buf_release(&content);
}
