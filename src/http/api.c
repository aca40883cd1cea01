/*
 * api.c: the OpenAI shapes. Parses and checks /v1/chat/completions and
 * /v1/completions bodies (cJSON over untrusted bytes: every field's type and
 * range is checked and a bad one is a 400 naming it), and writes responses:
 * whole JSON objects, SSE chunks ("chat.completion.chunk" / "text_completion"
 * with choices[].delta or choices[].text, finish_reason, usage, logprobs) and
 * OpenAI error objects.
 *
 * Responses are written by hand into cm_bufs (cm_json_str escapes, and turns
 * invalid UTF-8 into U+FFFD so the output is always valid JSON). Never
 * touches sockets; never aborts on input.
 */
#include "http_impl.h"

#include "../sampler/grammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- JSON text ---- */

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0. */
static int utf8_len(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if ((size_t)len > n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

void cm_json_str(cm_buf *b, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    cm_buf_append(b, "\"", 1);
    size_t i = 0, run = 0; /* bytes [i - run, i) are plain and not yet copied */
    while (i < n) {
        unsigned c = p[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            i++;
            run++;
            continue;
        }
        if (c >= 0x80) {
            int l = utf8_len(p + i, n - i);
            if (l) {
                i += (size_t)l;
                run += (size_t)l;
                continue;
            }
        }
        cm_buf_append(b, s + i - run, run);
        run = 0;
        if (c == '"') cm_buf_puts(b, "\\\"");
        else if (c == '\\') cm_buf_puts(b, "\\\\");
        else if (c == '\n') cm_buf_puts(b, "\\n");
        else if (c == '\r') cm_buf_puts(b, "\\r");
        else if (c == '\t') cm_buf_puts(b, "\\t");
        else if (c < 0x20) cm_buf_printf(b, "\\u%04x", c);
        else cm_buf_puts(b, "\xEF\xBF\xBD"); /* invalid UTF-8 byte */
        i++;
    }
    cm_buf_append(b, s + i - run, run);
    cm_buf_append(b, "\"", 1);
}

static void json_cstr(cm_buf *b, const char *s) { cm_json_str(b, s, strlen(s)); }

static void json_num(cm_buf *b, double v) {
    if (!isfinite(v)) v = v < 0 ? -9999.0 : 9999.0; /* JSON has no infinities */
    cm_buf_printf(b, "%.6g", v);
}

/* ---- errors ---- */

void cm_api_error_set(api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                      ...) {
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

void cm_api_error_json(cm_buf *out, const api_error *e) {
    cm_buf_puts(out, "{\"error\":{\"message\":");
    json_cstr(out, e->message);
    cm_buf_puts(out, ",\"type\":");
    json_cstr(out, e->type ? e->type : "invalid_request_error");
    cm_buf_puts(out, ",\"param\":");
    if (*e->param) json_cstr(out, e->param);
    else cm_buf_puts(out, "null");
    cm_buf_puts(out, ",\"code\":");
    if (*e->code) json_cstr(out, e->code);
    else cm_buf_puts(out, "null");
    cm_buf_puts(out, "}}");
}

void cm_api_sse_error(cm_buf *out, const job *j) {
    api_error e;
    cm_api_error_set(&e, j->http_status, "server_error", NULL, NULL, "%s", j->errmsg);
    cm_buf_puts(out, "data: ");
    cm_api_error_json(out, &e);
    cm_buf_puts(out, "\n\n");
}

/* ---- request parsing ---- */

#define BAD(param, ...)                                                               \
    do {                                                                              \
        cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
        goto fail;                                                                    \
    } while (0)

/* Message content: a string, or an array of {"type":"text","text":...} parts. */
static bool content_text(const cJSON *c, cm_buf *out, int i, api_error *ae) {
    if (cm_api_is_null(c)) return true;
    if (cJSON_IsString(c)) {
        cm_buf_puts(out, c->valuestring);
        return true;
    }
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!cJSON_IsArray(c)) {
        cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                         "'%s' must be a string or an array of text parts", param);
        return false;
    }
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x)) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                             "'%s': only parts of type 'text' are supported (this model reads text only)", param);
            return false;
        }
        cm_buf_puts(out, x->valuestring);
    }
    return true;
}

static int chat_prompt(cm_http_server *srv, const cJSON *root, cm_buf *text, api_error *ae) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL,
                         "'messages' is required: a non-empty array of {role, content}");
        return -1;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n > 4096) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL, "too many messages (%d; at most 4096)", n);
        return -1;
    }
    cm_api_msgs l;
    int rc = -1;
    if (cm_api_msgs_init(&l, n)) {
        cm_api_no_memory(CM_API_OPENAI, ae);
        goto out;
    }
    int i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, "'%s' is required", param);
            goto out;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                             "'%s' must be system, developer, user or assistant (tools are not supported)", param);
            goto out;
        }
        if (!content_text(cJSON_GetObjectItemCaseSensitive(msg, "content"), cm_api_msgs_add(&l, r), i, ae)) goto out;
        i++;
    }
    cm_api_msgs_seal(&l);
    char err[256];
    if (cm_engine_chat_render(cm_http_engine(srv), cm_http_chat_template(srv), l.m, (size_t)l.n, true, text, err,
                              sizeof err)) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL, "%s", err);
        goto out;
    }
    rc = 0;
out:
    cm_api_msgs_release(&l);
    return rc;
}

static int completion_prompt(cm_http_server *srv, const cJSON *root, job *j, api_error *ae) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p))
        return cm_api_tokenize(srv, CM_API_OPENAI, p->valuestring, strlen(p->valuestring), false, "prompt", j, ae);
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(p, 0))) {
        cm_engine_info info;
        cm_engine_get_info(cm_http_engine(srv), &info);
        int n = cJSON_GetArraySize(p);
        j->ids = cm_malloc((size_t)n * sizeof *j->ids);
        if (!j->ids) return cm_api_no_memory(CM_API_OPENAI, ae);
        const cJSON *x;
        cJSON_ArrayForEach(x, p) {
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
                x->valuedouble >= info.n_vocab) {
                cm_api_error_set(ae, 400, "invalid_request_error", "prompt", NULL,
                                 "'prompt' token ids must be integers from 0 to %d", info.n_vocab - 1);
                return -1;
            }
            j->ids[j->n_ids++] = (int32_t)x->valuedouble;
        }
        return 0;
    }
    cm_api_error_set(ae, 400, "invalid_request_error", "prompt", NULL,
                     "'prompt' is required: a string, an array of one string, or an array of token ids");
    return -1;
}

int cm_api_apply_template(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae) {
    cJSON *root = cJSON_ParseWithLength(body, n);
    job *j = cm_calloc(1, sizeof *j); /* what cm_tools_prompt notes for a generation: unused here */
    cm_buf text;
    cm_buf_init(&text);
    int rc = -1;
    if (!j) cm_api_no_memory(CM_API_OPENAI, ae);
    else if (!cJSON_IsObject(root))
        cm_api_error_set(ae, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
    else rc = cm_tools_wanted(root) ? cm_tools_prompt(srv, root, j, &text, ae) : chat_prompt(srv, root, &text, ae);
    if (!rc) {
        cm_buf_puts(out, "{\"prompt\":");
        cm_json_str(out, text.data ? text.data : "", text.len);
        cm_buf_puts(out, "}");
    }
    if (j) cm_grammar_free(j->grammar);
    cm_free(j);
    cm_buf_release(&text);
    cJSON_Delete(root);
    return rc;
}

int cm_api_parse_request(cm_http_server *srv, bool chat, const char *body, size_t n, job *j, api_error *ae) {
    cJSON *root = cJSON_ParseWithLength(body, n);
    cm_buf text;
    cm_buf_init(&text);
    j->chat = chat;
    j->logprobs = -1;
    if (!root) BAD(NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(root)) BAD(NULL, "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cm_api_is_null(model) && !cJSON_IsString(model)) BAD("model", "'model' must be a string");
    if (cJSON_IsString(model) && strcmp(model->valuestring, cm_http_model_id(srv))) {
        cm_api_error_set(ae, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%.200s' does not exist; this server serves '%.200s'", model->valuestring,
                         cm_http_model_id(srv));
        goto fail;
    }
    long long nn = 1;
    if (!cm_api_get_int(CM_API_OPENAI, root, "n", 1, 1e9, &nn, ae)) goto fail;
    if (nn != 1) BAD("n", "only n=1 is supported");
    bool stream = false, usage = false;
    if (!cm_api_get_bool(CM_API_OPENAI, root, "stream", &stream, ae)) goto fail;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (!cm_api_is_null(so)) {
        if (!cJSON_IsObject(so)) BAD("stream_options", "'stream_options' must be an object");
        if (!stream) BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
        if (!cm_api_get_bool(CM_API_OPENAI, so, "include_usage", &usage, ae)) {
            snprintf(ae->param, sizeof ae->param, "stream_options.include_usage");
            goto fail;
        }
    }
    j->stream = stream;
    j->include_usage = usage;
    if (cm_api_response_format(root, j, ae)) goto fail;                /* api_tools.c: a grammar for JSON output */
    if (cm_api_parse_lora(srv, CM_API_OPENAI, root, j, ae)) goto fail; /* api_lora.c: per-request adapters */
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!chat && cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0)
        BAD("tools", "'tools' is for /v1/chat/completions");

    cm_gen_params *gp = &j->gp;
    cm_gen_params_default(gp);
    gp->n_predict = -1; /* OpenAI: until the model stops or the context is full */
    long long mt = -1;
    if (!cm_api_get_int(CM_API_OPENAI, root, "max_tokens", 1, 1 << 30, &mt, ae)) goto fail;
    if (!cm_api_get_int(CM_API_OPENAI, root, "max_completion_tokens", 1, 1 << 30, &mt, ae)) goto fail;
    cm_sampler_params *sp = &gp->sampling;
    if (!cm_api_get_float(CM_API_OPENAI, root, "temperature", 0, 2, &sp->temperature, ae)) goto fail;
    if (!cm_api_get_float(CM_API_OPENAI, root, "top_p", 0, 1, &sp->top_p, ae)) goto fail;
    if (!cm_api_get_float(CM_API_OPENAI, root, "min_p", 0, 1, &sp->min_p, ae)) goto fail;
    if (!cm_api_get_float(CM_API_OPENAI, root, "presence_penalty", -2, 2, &sp->presence_penalty, ae)) goto fail;
    if (!cm_api_get_float(CM_API_OPENAI, root, "frequency_penalty", -2, 2, &sp->frequency_penalty, ae)) goto fail;
    if (!cm_api_get_float(CM_API_OPENAI, root, "repeat_penalty", 0.01, 10, &sp->repeat_penalty, ae)) goto fail;
    long long k = sp->top_k;
    if (!cm_api_get_int(CM_API_OPENAI, root, "top_k", 0, 1 << 30, &k, ae)) goto fail;
    sp->top_k = (int32_t)k;
    long long seed = -1;
    if (!cm_api_get_int(CM_API_OPENAI, root, "seed", -1, 9007199254740991.0, &seed, ae)) goto fail;
    sp->seed = seed < 0 ? CM_SAMPLER_SEED_RANDOM : (uint64_t)seed;
    /* llama-server's extension: keep generating past EOS (load generators want fixed lengths) */
    if (!cm_api_get_bool(CM_API_OPENAI, root, "ignore_eos", &gp->ignore_eos, ae)) goto fail;
    if (chat) {
        bool lp = false;
        long long top = 0;
        if (!cm_api_get_bool(CM_API_OPENAI, root, "logprobs", &lp, ae)) goto fail;
        if (!cm_api_get_int(CM_API_OPENAI, root, "top_logprobs", 0, 20, &top, ae)) goto fail;
        if (top > 0 && !lp) BAD("top_logprobs", "'top_logprobs' requires 'logprobs': true");
        if (lp) j->logprobs = (int)top;
    } else {
        long long lp = -1;
        if (!cm_api_get_int(CM_API_OPENAI, root, "logprobs", 0, 5, &lp, ae)) goto fail;
        j->logprobs = (int)lp;
        bool echo = false;
        if (!cm_api_get_bool(CM_API_OPENAI, root, "echo", &echo, ae)) goto fail;
        if (echo) BAD("echo", "'echo' is not supported");
    }
    sp->n_probs = j->logprobs > 0 ? j->logprobs : 0;
    if (cm_api_parse_stops(CM_API_OPENAI, root, j, ae)) goto fail;
    char err[256];
    if (cm_sampler_params_check(sp, err, sizeof err)) BAD(NULL, "%s", err);
    /* the prompt */
    if (chat) {
        if (cm_tools_wanted(root) ? cm_tools_prompt(srv, root, j, &text, ae) : chat_prompt(srv, root, &text, ae))
            goto fail;
        /* gpt-oss's harmony prompt (the only one ending so): return the final channel */
        static const char harmony_open[] = "<|start|>assistant";
        const size_t hl = sizeof harmony_open - 1;
        j->harmony = text.len >= hl && !memcmp(text.data + text.len - hl, harmony_open, hl);
        if (j->harmony) cm_harmony_init(&j->hf);
        if (cm_api_tokenize(srv, CM_API_OPENAI, text.data ? text.data : "", text.len, true, "messages", j, ae))
            goto fail;
    } else if (completion_prompt(srv, root, j, ae)) {
        goto fail;
    }
    const char *what = chat ? "messages" : "prompt";
    if (j->n_ids < 1) BAD(what, "the prompt is empty");
    int n_ctx = cm_http_n_ctx(srv);
    if (j->n_ids >= n_ctx) {
        cm_api_error_set(ae, 400, "invalid_request_error", what, "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens.",
                         n_ctx, what, j->n_ids);
        goto fail;
    }
    if (mt > 0 && j->n_ids + mt > n_ctx) {
        cm_api_error_set(ae, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                         "the %s, %lld in the completion).",
                         n_ctx, j->n_ids + mt, j->n_ids, what, mt);
        goto fail;
    }
    gp->n_predict = mt > 0 ? (int)mt : -1;
    gp->grammar = j->grammar;
    cJSON_Delete(root);
    cm_buf_release(&text);
    return 0;
fail:
    cJSON_Delete(root);
    cm_buf_release(&text);
    return -1;
}

/* ---- responses ---- */

static const char *finish_reason(enum cm_finish f) {
    return f == CM_FINISH_LENGTH || f == CM_FINISH_CTX ? "length" : "stop";
}

/* One token's text and bytes for logprobs. */
static int piece(job *j, int32_t id, char *buf, size_t cap) {
    int n = cm_engine_token_piece(cm_http_engine(j->srv), id, buf, cap);
    return n < 0 ? 0 : n;
}

static void lp_token_fields(cm_buf *b, job *j, int32_t id, float lp) {
    char t[256];
    int n = piece(j, id, t, sizeof t);
    cm_buf_puts(b, "\"token\":");
    cm_json_str(b, t, (size_t)n);
    cm_buf_puts(b, ",\"logprob\":");
    json_num(b, lp);
    cm_buf_puts(b, ",\"bytes\":[");
    for (int i = 0; i < n; i++) cm_buf_printf(b, "%s%u", i ? "," : "", (unsigned char)t[i]);
    cm_buf_puts(b, "]");
}

/* logprobs of tokens [from, to): chat's {"content":[...]} or the legacy
 * completions {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static void lp_json(cm_buf *b, job *j, int from, int to) {
    if (j->logprobs < 0) {
        cm_buf_puts(b, "null");
        return;
    }
    if (j->chat) {
        cm_buf_puts(b, "{\"content\":[");
        for (int i = from; i < to; i++) {
            cm_buf_puts(b, i > from ? ",{" : "{");
            lp_token_fields(b, j, j->lp_ids[i], j->lps[i].logprob);
            cm_buf_puts(b, ",\"top_logprobs\":[");
            for (int k = 0; k < j->lps[i].n_top && k < j->logprobs; k++) {
                cm_buf_puts(b, k ? ",{" : "{");
                lp_token_fields(b, j, j->lps[i].top[k].id, j->lps[i].top[k].logprob);
                cm_buf_puts(b, "}");
            }
            cm_buf_puts(b, "]}");
        }
        cm_buf_puts(b, "]}");
        return;
    }
    char t[256];
    cm_buf_puts(b, "{\"tokens\":[");
    for (int i = from; i < to; i++) {
        if (i > from) cm_buf_puts(b, ",");
        cm_json_str(b, t, (size_t)piece(j, j->lp_ids[i], t, sizeof t));
    }
    cm_buf_puts(b, "],\"token_logprobs\":[");
    for (int i = from; i < to; i++) {
        if (i > from) cm_buf_puts(b, ",");
        json_num(b, j->lps[i].logprob);
    }
    cm_buf_puts(b, "],\"top_logprobs\":[");
    for (int i = from; i < to; i++) {
        cm_buf_puts(b, i > from ? ",{" : "{");
        for (int k = 0; k < j->lps[i].n_top && k < j->logprobs; k++) {
            if (k) cm_buf_puts(b, ",");
            cm_json_str(b, t, (size_t)piece(j, j->lps[i].top[k].id, t, sizeof t));
            cm_buf_puts(b, ":");
            json_num(b, j->lps[i].top[k].logprob);
        }
        cm_buf_puts(b, "}");
    }
    cm_buf_puts(b, "],\"text_offset\":[");
    size_t off = 0;
    for (int i = 0; i < to; i++) {
        if (i >= from) cm_buf_printf(b, "%s%zu", i > from ? "," : "", off);
        off += (size_t)piece(j, j->lp_ids[i], t, sizeof t);
    }
    cm_buf_puts(b, "]}");
}

static void chunk_head(cm_buf *b, job *j) {
    cm_buf_puts(b, "data: {\"id\":");
    json_cstr(b, j->id);
    cm_buf_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
                  j->chat ? "chat.completion.chunk" : "text_completion", j->created);
    json_cstr(b, cm_http_model_id(j->srv));
    cm_buf_puts(b, ",\"system_fingerprint\":\"cumulo\",\"choices\":[");
}

static void chunk(job *j, const char *text, size_t len, bool role, const char *finish) {
    cm_buf *b = &j->sse;
    chunk_head(b, j);
    cm_buf_puts(b, "{\"index\":0,");
    if (j->chat) {
        cm_buf_puts(b, "\"delta\":{");
        if (role) cm_buf_puts(b, "\"role\":\"assistant\",\"content\":\"\"");
        else if (!finish) {
            cm_buf_puts(b, "\"content\":");
            cm_json_str(b, text, len);
        }
        cm_buf_puts(b, "},");
    } else {
        cm_buf_puts(b, "\"text\":");
        cm_json_str(b, text, len);
        cm_buf_puts(b, ",");
    }
    cm_buf_puts(b, "\"logprobs\":");
    if (j->logprobs >= 0 && j->n_lps > j->lps_sent) {
        lp_json(b, j, j->lps_sent, j->n_lps);
        j->lps_sent = j->n_lps;
    } else {
        cm_buf_puts(b, "null");
    }
    cm_buf_puts(b, ",\"finish_reason\":");
    if (finish) cm_buf_printf(b, "\"%s\"", finish);
    else cm_buf_puts(b, "null");
    cm_buf_puts(b, "}]");
    if (j->include_usage) cm_buf_puts(b, ",\"usage\":null");
    cm_buf_puts(b, "}\n\n");
}

void cm_api_stream_delta(job *j, const char *text, size_t len) {
    if (j->api == CM_API_ANTHROPIC) {
        cm_anth_stream_delta(j, text, len);
        return;
    }
    if (j->tools) {
        cm_buf_append(&j->text, text, len);
        return;
    } /* calls are known at the end */
    chunk(j, text, len, false, NULL);
}

void cm_api_stream_role(job *j) {
    if (j->api == CM_API_ANTHROPIC) {
        cm_anth_stream_start(j);
        return;
    }
    if (j->chat) chunk(j, "", 0, true, NULL);
}

static void usage_json(cm_buf *b, job *j) {
    cm_buf_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", j->n_ids, j->n_gen,
                  j->n_ids + j->n_gen);
}

void cm_api_stream_end(job *j) {
    if (j->api == CM_API_ANTHROPIC) {
        cm_anth_stream_end(j);
        return;
    }
    if (j->tools) {
        cm_tools_stream_end(j);
        return;
    }
    cm_buf *b = &j->sse;
    if (j->http_status) {
        cm_api_sse_error(b, j);
    } else if (j->finish != CM_FINISH_CANCEL) {
        chunk(j, "", 0, false, finish_reason(j->finish));
        if (j->include_usage) {
            chunk_head(b, j);
            cm_buf_puts(b, "],\"usage\":");
            usage_json(b, j);
            cm_buf_puts(b, "}\n\n");
        }
    }
    cm_buf_puts(b, "data: [DONE]\n\n");
}

char *cm_api_final_json(job *j) {
    if (j->api == CM_API_ANTHROPIC) return cm_anth_final_json(j);
    if (j->tools) return cm_tools_final_json(j);
    cm_buf b;
    cm_buf_init(&b);
    cm_buf_puts(&b, "{\"id\":");
    json_cstr(&b, j->id);
    cm_buf_printf(&b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", j->chat ? "chat.completion" : "text_completion",
                  j->created);
    json_cstr(&b, cm_http_model_id(j->srv));
    cm_buf_puts(&b, ",\"system_fingerprint\":\"cumulo\",\"choices\":[{\"index\":0,");
    const char *t = j->text.data ? j->text.data : "";
    if (j->chat) {
        cm_buf_puts(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
        cm_json_str(&b, t, j->text.len);
        cm_buf_puts(&b, "},");
    } else {
        cm_buf_puts(&b, "\"text\":");
        cm_json_str(&b, t, j->text.len);
        cm_buf_puts(&b, ",");
    }
    cm_buf_puts(&b, "\"logprobs\":");
    lp_json(&b, j, 0, j->n_lps);
    cm_buf_printf(&b, ",\"finish_reason\":\"%s\"}],\"usage\":", finish_reason(j->finish));
    usage_json(&b, j);
    cm_buf_puts(&b, "}");
    return cm_api_buf_take(&b);
}

char *cm_api_buf_take(cm_buf *b) {
    cm_buf_append(b, "", 1);
    if (b->oom) {
        cm_buf_release(b);
        return NULL;
    }
    return b->data;
}

void cm_api_models_json(cm_http_server *srv, cm_buf *out) {
    cm_engine_info in;
    cm_engine_get_info(cm_http_engine(srv), &in);
    cm_buf_puts(out, "{\"object\":\"list\",\"data\":[{\"id\":");
    json_cstr(out, cm_http_model_id(srv));
    cm_buf_printf(out, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"cumulo\",\"meta\":{\"arch\":",
                  (long long)(cm_wall_ms() / 1000));
    json_cstr(out, in.arch);
    cm_buf_printf(out, ",\"n_params\":%llu,\"n_ctx\":%d,\"n_ctx_train\":%d,\"n_vocab\":%d}}]}",
                  (unsigned long long)in.n_params, cm_http_n_ctx(srv), in.n_ctx_train, in.n_vocab);
}
