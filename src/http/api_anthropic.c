/*
 * api_anthropic.c: Anthropic's Messages API shapes (POST /v1/messages) over
 * the same jobs, queue and engine as the OpenAI routes. Parses and checks a
 * Messages body (cJSON over untrusted bytes: every field's type and range is
 * checked and a bad one is a 400 whose message starts with the field's path,
 * as Anthropic's do), renders system + messages through the chat template,
 * and writes the answers: a whole "message" object, or the event stream
 * message_start, content_block_start, ping, content_block_delta...,
 * content_block_stop, message_delta (stop_reason, usage), message_stop; and
 * Anthropic error bodies {"type":"error","error":{"type","message"}}.
 *
 * Differences from Anthropic, on purpose: any `model` name is accepted (the
 * server serves one model and answers with its id, so tools that send a
 * Claude model name still work); max_tokens beyond the context is cut to
 * what fits (stop_reason max_tokens) instead of refused; `metadata`,
 * `thinking` and `service_tier` are accepted and ignored. Images and
 * documents are a 400 naming them. Tool use (tools, tool_choice, tool_use
 * and tool_result blocks) is api_anthropic_tools.c.
 *
 * Never touches sockets; never aborts on input.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- errors ---- */

static const char *anth_error_type(int status) {
    switch (status) {
    case 400:
    case 405:
    case 408:
    case 431: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void cm_anth_error_json(cm_buf *out, const api_error *e) {
    cm_buf_printf(out, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", anth_error_type(e->status));
    cm_json_str(out, e->message, strlen(e->message));
    cm_buf_puts(out, "}}");
}

/* ---- request parsing ---- */

#define BAD(param, ...)                                                               \
    do {                                                                              \
        cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
        goto fail;                                                                    \
    } while (0)

/* Text of a `system` value or of a message's `content`: a string, or an
 * array of {"type":"text","text":...} blocks (joined as they are). */
static bool blocks_text(const cJSON *c, const char *what, cm_buf *out, api_error *ae) {
    if (cJSON_IsString(c)) {
        cm_buf_puts(out, c->valuestring);
        return true;
    }
    if (!cJSON_IsArray(c)) {
        cm_api_error_set(ae, 400, "invalid_request_error", what, NULL,
                         "%s: must be a string or an array of content blocks", what);
        return false;
    }
    int k = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsObject(b) || !cJSON_IsString(t)) {
            cm_api_error_set(ae, 400, "invalid_request_error", what, NULL, "%s.%d.type: Field required", what, k);
            return false;
        }
        if (strcmp(t->valuestring, "text")) {
            cm_api_error_set(ae, 400, "invalid_request_error", what, NULL,
                             "%s.%d.type: content blocks of type '%.64s' are not supported (this server reads "
                             "text blocks only)",
                             what, k, t->valuestring);
            return false;
        }
        if (!cJSON_IsString(x)) {
            cm_api_error_set(ae, 400, "invalid_request_error", what, NULL, "%s.%d.text: must be a string", what, k);
            return false;
        }
        cm_buf_puts(out, x->valuestring);
        k++;
    }
    return true;
}

/* Render system + messages with the chat template into text. A last
 * assistant message is a prefill: the reply continues it. */
static int anth_prompt(cm_http_server *srv, const cJSON *root, cm_buf *text, api_error *ae) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL,
                         "messages: Field required (a non-empty array of {role, content})");
        return -1;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n > 4096) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL, "messages: too many (%d; at most 4096)",
                         n);
        return -1;
    }
    cm_api_msgs l;
    int rc = -1;
    if (cm_api_msgs_init(&l, n + 1)) {
        cm_api_no_memory(CM_API_ANTHROPIC, ae);
        goto out;
    }
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (!cm_api_is_null(sys) && !blocks_text(sys, "system", cm_api_msgs_add(&l, "system"), ae)) goto out;
    int i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages.%d.role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, "%s: Field required", param);
            goto out;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "user") && strcmp(r, "assistant")) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                             "%s: must be 'user' or 'assistant' (the system prompt is the top-level 'system')", param);
            goto out;
        }
        snprintf(param, sizeof param, "messages.%d.content", i);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (cm_api_is_null(c)) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, "%s: Field required", param);
            goto out;
        }
        if (!blocks_text(c, param, cm_api_msgs_add(&l, r), ae)) goto out;
        i++;
    }
    cm_api_msgs_seal(&l);
    /* A trailing assistant message is continued, not closed. */
    bool prefill = !strcmp(l.m[l.n - 1].role, "assistant");
    char err[256];
    if (cm_engine_chat_render(cm_http_engine(srv), cm_http_chat_template(srv), l.m, (size_t)(l.n - prefill), true, text,
                              err, sizeof err)) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL, "messages: %s", err);
        goto out;
    }
    if (prefill) cm_buf_puts(text, l.m[l.n - 1].content);
    rc = 0;
out:
    cm_api_msgs_release(&l);
    return rc;
}

int cm_anth_parse_request(cm_http_server *srv, const char *body, size_t n, job *j, api_error *ae) {
    cJSON *root = cJSON_ParseWithLength(body, n);
    cm_buf text;
    cm_buf_init(&text);
    j->chat = true;
    j->api = CM_API_ANTHROPIC;
    j->logprobs = -1;
    /* "chatcmpl-<hex>" -> "msg_<hex>" */
    const char *hex = strchr(j->id, '-');
    char id[sizeof j->id];
    snprintf(id, sizeof id, "msg_%.40s", hex ? hex + 1 : j->id);
    memcpy(j->id, id, sizeof id);
    if (!root) BAD(NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(root)) BAD(NULL, "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsString(model)) BAD("model", "model: Field required (a string)");
    long long mt = -1;
    if (cm_api_is_null(cJSON_GetObjectItemCaseSensitive(root, "max_tokens")))
        BAD("max_tokens", "max_tokens: Field required");
    if (!cm_api_get_int(CM_API_ANTHROPIC, root, "max_tokens", 1, 1 << 30, &mt, ae)) goto fail;
    if (!cm_api_get_bool(CM_API_ANTHROPIC, root, "stream", &j->stream, ae)) goto fail;
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (!cm_api_is_null(md) && !cJSON_IsObject(md)) BAD("metadata", "metadata: must be an object");
    if (cm_api_parse_lora(srv, CM_API_ANTHROPIC, root, j, ae)) goto fail; /* api_lora.c: per-request adapters */

    cm_gen_params *gp = &j->gp;
    cm_gen_params_default(gp);
    cm_sampler_params *sp = &gp->sampling;
    if (!cm_api_get_float(CM_API_ANTHROPIC, root, "temperature", 0, 1, &sp->temperature, ae)) goto fail;
    if (!cm_api_get_float(CM_API_ANTHROPIC, root, "top_p", 0, 1, &sp->top_p, ae)) goto fail;
    long long k = sp->top_k;
    if (!cm_api_get_int(CM_API_ANTHROPIC, root, "top_k", 0, 1 << 30, &k, ae)) goto fail;
    sp->top_k = (int32_t)k;
    if (cm_api_parse_stops(CM_API_ANTHROPIC, root, j, ae)) goto fail;
    char err[256];
    if (cm_sampler_params_check(sp, err, sizeof err)) BAD(NULL, "%s", err);
    if (cm_anth_tools_wanted(root) ? cm_anth_tools_prompt(srv, root, j, &text, ae) : anth_prompt(srv, root, &text, ae))
        goto fail;
    if (cm_api_tokenize(srv, CM_API_ANTHROPIC, text.data ? text.data : "", text.len, true, "messages", j, ae))
        goto fail;
    if (j->n_ids < 1) BAD("messages", "messages: the prompt is empty");
    int n_ctx = cm_http_n_ctx(srv);
    if (j->n_ids >= n_ctx)
        BAD("messages", "prompt is too long: %d tokens > %d maximum (the context of this server)", j->n_ids, n_ctx - 1);
    gp->n_predict = (int)CM_MIN(mt, (long long)(n_ctx - j->n_ids));
    gp->grammar = j->grammar; /* a forced tool_choice */
    cJSON_Delete(root);
    cm_buf_release(&text);
    return 0;
fail:
    cJSON_Delete(root);
    cm_buf_release(&text);
    return -1;
}

/* ---- responses ---- */

static const char *stop_reason(const job *j) {
    switch (j->finish) {
    case CM_FINISH_LENGTH:
    case CM_FINISH_CTX: return "max_tokens";
    case CM_FINISH_STOP: return "stop_sequence";
    default: return "end_turn";
    }
}

/* "stop_sequence":<the matched string or null> */
static void stop_sequence_json(cm_buf *b, const job *j) {
    cm_buf_puts(b, "\"stop_sequence\":");
    if (j->finish == CM_FINISH_STOP && j->stop_index >= 0 && j->stop_index < j->n_stops)
        cm_json_str(b, j->stops[j->stop_index], strlen(j->stops[j->stop_index]));
    else cm_buf_puts(b, "null");
}

static void event(cm_buf *b, const char *name) { cm_buf_printf(b, "event: %s\ndata: ", name); }

void cm_anth_stream_start(job *j) {
    cm_buf *b = &j->sse;
    event(b, "message_start");
    cm_buf_puts(b, "{\"type\":\"message_start\",\"message\":{\"id\":");
    cm_json_str(b, j->id, strlen(j->id));
    cm_buf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
    cm_json_str(b, cm_http_model_id(j->srv), strlen(cm_http_model_id(j->srv)));
    cm_buf_printf(
        b, ",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,\"output_tokens\":0}}}\n\n",
        j->n_ids);
    if (!j->tools) { /* with tools the blocks are known at the end (api_anthropic_tools.c) */
        event(b, "content_block_start");
        cm_buf_puts(
            b,
            "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    }
    event(b, "ping");
    cm_buf_puts(b, "{\"type\":\"ping\"}\n\n");
}

void cm_anth_stream_delta(job *j, const char *text, size_t len) {
    if (!len) return; /* logprobs-only steps have nothing to say here */
    if (j->tools) {
        cm_buf_append(&j->text, text, len);
        return;
    }
    cm_buf *b = &j->sse;
    event(b, "content_block_delta");
    cm_buf_puts(b, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":");
    cm_json_str(b, text, len);
    cm_buf_puts(b, "}}\n\n");
}

void cm_anth_stream_end(job *j) {
    cm_buf *b = &j->sse;
    if (j->http_status) {
        api_error e;
        cm_api_error_set(&e, j->http_status, "api_error", NULL, NULL, "%s", j->errmsg);
        event(b, "error");
        cm_anth_error_json(b, &e);
        cm_buf_puts(b, "\n\n");
        return;
    }
    if (j->finish == CM_FINISH_CANCEL) return; /* the client is gone */
    if (j->tools) {
        cm_anth_tools_stream_end(j);
        return;
    }
    event(b, "content_block_stop");
    cm_buf_puts(b, "{\"type\":\"content_block_stop\",\"index\":0}\n\n");
    event(b, "message_delta");
    cm_buf_printf(b, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",", stop_reason(j));
    stop_sequence_json(b, j);
    cm_buf_printf(b, "},\"usage\":{\"output_tokens\":%d}}\n\n", j->n_gen);
    event(b, "message_stop");
    cm_buf_puts(b, "{\"type\":\"message_stop\"}\n\n");
}

char *cm_anth_final_json(job *j) {
    if (j->tools) return cm_anth_tools_final_json(j);
    cm_buf b;
    cm_buf_init(&b);
    cm_buf_puts(&b, "{\"id\":");
    cm_json_str(&b, j->id, strlen(j->id));
    cm_buf_puts(&b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    cm_json_str(&b, cm_http_model_id(j->srv), strlen(cm_http_model_id(j->srv)));
    cm_buf_puts(&b, ",\"content\":[{\"type\":\"text\",\"text\":");
    cm_json_str(&b, j->text.data ? j->text.data : "", j->text.len);
    cm_buf_printf(&b, "}],\"stop_reason\":\"%s\",", stop_reason(j));
    stop_sequence_json(&b, j);
    cm_buf_printf(&b, ",\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d}}", j->n_ids, j->n_gen);
    return cm_api_buf_take(&b);
}
