/*
 * api_tools.c: OpenAI tool calls and structured output for
 * /v1/chat/completions.
 *
 * response_format json_object / json_schema compile to a grammar
 * (sampler/grammar.h) that the engine applies as token masks, so the reply
 * is valid JSON under the schema by construction; a schema keyword the
 * compiler cannot enforce is a 400 naming it.
 *
 * tools / tool_choice: the tools are written into the prompt the way each
 * model family was trained to read them, and the reply is parsed back into
 * tool_calls:
 *   hermes  (chatml templates: Qwen 2.5/3, Hermes): a "# Tools" system block
 *           with <tools>...</tools>; calls are <tool_call>\n{"name": ...,
 *           "arguments": {...}}\n</tool_call>; results go back as
 *           <tool_response>...</tool_response> in a user turn;
 *   llama3  (Llama 3.x): the JSON function list in front of the first user
 *           message; a call is {"name": ..., "parameters": {...}}; results
 *           in a user turn (cumulo's renderer has no ipython role);
 *   mistral (Mistral templates): [AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]
 *           before the last [INST]; calls [TOOL_CALLS][{"name", "arguments"}]
 *           (the [TOOL_CALLS] control token is not part of the text, so a
 *           reply that is such a JSON array is read as calls); results as
 *           [TOOL_RESULTS]...[/TOOL_RESULTS] in a user turn.
 * tool_choice "required" or a named function adds a grammar that forces
 * one call in the family's format with arguments valid under the tool's
 * parameters schema; "auto" lets the model choose and parses what it wrote;
 * "none" leaves the tools out. With tools, a stream carries the reply at
 * its end (one content or tool_calls delta, then finish_reason), since a
 * call is only known once its text is complete.
 *
 * Never aborts on input; never touches sockets.
 */
#include "http_impl.h"

#include "../sampler/grammar.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#define MAX_TOOLS 128

/* ---- response_format ---- */

int cm_api_response_format(const void *root_, job *j, api_error *ae) {
    const cJSON *root = root_;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t)) {
        cm_api_error_set(ae, 400, "invalid_request_error", "response_format", NULL,
                         "'response_format' must be {\"type\": ...}");
        return -1;
    }
    if (!strcmp(t->valuestring, "text")) return 0;
    const cJSON *schema = NULL;
    if (!strcmp(t->valuestring, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!cJSON_IsObject(js) || !cJSON_IsObject(schema)) {
            cm_api_error_set(ae, 400, "invalid_request_error", "response_format", NULL,
                             "'response_format.json_schema.schema' must be a JSON Schema object");
            return -1;
        }
    } else if (strcmp(t->valuestring, "json_object")) {
        cm_api_error_set(ae, 400, "invalid_request_error", "response_format", NULL,
                         "unknown response_format type '%.100s'", t->valuestring);
        return -1;
    }
    char err[300];
    int rc = cm_json_grammar(schema, &j->grammar, err, sizeof err);
    if (rc) {
        cm_api_error_set(ae, rc == CM_ENOMEM ? 503 : 400, rc == CM_ENOMEM ? "server_error" : "invalid_request_error",
                         "response_format", NULL, "response_format: %s", err);
        return -1;
    }
    return 0;
}

/* ---- tools: the request ---- */

bool cm_tools_wanted(const void *root_) {
    const cJSON *root = root_;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *m;
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) return true;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(root, "messages")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
        if ((cJSON_IsString(r) && !strcmp(r->valuestring, "tool")) || cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
            return true;
    }
    return false;
}

static int family_of(cm_http_server *srv, int *chat, api_error *ae) {
    char err[256];
    int f = cm_engine_chat_family(cm_http_engine(srv), cm_http_chat_template(srv), err, sizeof err);
    *chat = f;
    if (f == CM_CHAT_CHATML) return CM_TOOLS_HERMES;
    if (f == CM_CHAT_LLAMA3 || f == CM_CHAT_LLAMA31) return CM_TOOLS_LLAMA3;
    if (f == CM_CHAT_MISTRAL || f == CM_CHAT_MISTRAL_V1 || f == CM_CHAT_MISTRAL_V3 || f == CM_CHAT_MISTRAL_V3_TEKKEN ||
        f == CM_CHAT_MISTRAL_V7)
        return CM_TOOLS_MISTRAL;
    cm_api_error_set(ae, 400, "invalid_request_error", "tools", NULL,
                     "tool calls need a chat template of the Llama 3.x, chatml (Qwen 2.5/3, Hermes) or Mistral family; "
                     "this model's is %s",
                     f >= 0 ? cm_chat_family_name((enum cm_chat_family)f) : err);
    return -1;
}

/* The text of a message's content (string or text parts; null: ""). */
static bool content_of(const cJSON *c, cm_buf *out) {
    if (!c || cJSON_IsNull(c)) return true;
    if (cJSON_IsString(c)) {
        cm_buf_puts(out, c->valuestring);
        return true;
    }
    if (!cJSON_IsArray(c)) return false;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(x)) return false;
        cm_buf_puts(out, x->valuestring);
    }
    return true;
}

/* One assistant tool call as the family writes it. */
static bool call_text(int fam, const cJSON *tc, cm_buf *out, bool first) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!cJSON_IsString(name) || !cJSON_IsString(args)) return false;
    cJSON *a = cJSON_Parse(args->valuestring);
    char *at = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    const char *av = at ? at : "{}";
    cm_buf q;
    cm_buf_init(&q);
    cm_json_str(&q, name->valuestring, strlen(name->valuestring));
    cm_buf_append(&q, "", 1);
    if (fam == CM_TOOLS_HERMES)
        cm_buf_printf(out, "%s<tool_call>\n{\"name\": %s, \"arguments\": %s}\n</tool_call>", first ? "" : "\n", q.data,
                      av);
    else if (fam == CM_TOOLS_LLAMA3)
        cm_buf_printf(out, "%s{\"name\": %s, \"parameters\": %s}", first ? "" : "\n", q.data, av);
    else cm_buf_printf(out, "%s{\"name\": %s, \"arguments\": %s}", first ? "[TOOL_CALLS] [" : ", ", q.data, av);
    cm_buf_release(&q);
    cJSON_free(at);
    return true;
}

static const char k_marker[] = "\x01cumulo-tools\x01";

int cm_tools_prompt(cm_http_server *srv, const void *root_, job *j, cm_buf *text, api_error *ae) {
    const cJSON *root = root_;
    int chat_fam = -1;
    int fam = family_of(srv, &chat_fam, ae);
    if (fam < 0) return -1;
    /* the families whose official templates define tool turns: written exactly so (tools_render.c) */
    const bool tekken = chat_fam == CM_CHAT_MISTRAL_V3_TEKKEN;
    const bool exact =
        fam == CM_TOOLS_LLAMA3 || (fam == CM_TOOLS_MISTRAL && (chat_fam == CM_CHAT_MISTRAL_V3 || tekken));
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    int n_tools = cJSON_IsArray(tools) ? cJSON_GetArraySize(tools) : 0;
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) {
        cm_api_error_set(ae, 400, "invalid_request_error", "tools", NULL, "'tools' must be an array");
        return -1;
    }
    if (n_tools > MAX_TOOLS) {
        cm_api_error_set(ae, 400, "invalid_request_error", "tools", NULL, "at most %d tools", MAX_TOOLS);
        return -1;
    }
    /* tool_choice */
    const char *forced = NULL; /* a named function */
    bool required = false, none = n_tools == 0;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) none = true;
        else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) required = true;
        else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")) {
        } else {
            const cJSON *nm =
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"), "name");
            if (!cJSON_IsObject(choice) || !cJSON_IsString(nm)) {
                cm_api_error_set(
                    ae, 400, "invalid_request_error", "tool_choice", NULL,
                    "'tool_choice' must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":...}}");
                return -1;
            }
            forced = nm->valuestring;
        }
        if ((required || forced) && n_tools == 0) {
            cm_api_error_set(ae, 400, "invalid_request_error", "tool_choice", NULL, "'tool_choice' needs 'tools'");
            return -1;
        }
    }
    /* the tool list as the family shows it; check each tool */
    cm_buf list;
    cm_buf_init(&list);
    int rc = -1, found = 0;
    cm_api_msgs l = {0}; /* the conversation: its first nm_ messages are used */
    cm_chat_msg *m = NULL;
    cm_buf *parts = NULL;
    int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
    const cJSON *t;
    int k = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        bool name_ok = cJSON_IsString(nm) && *nm->valuestring && strlen(nm->valuestring) <= 64;
        for (const char *p = name_ok ? nm->valuestring : ""; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
                  *p == '-'))
                name_ok = false;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsObject(fn) || !name_ok ||
            (pa && !cJSON_IsNull(pa) && !cJSON_IsObject(pa))) {
            cm_api_error_set(
                ae, 400, "invalid_request_error", "tools", NULL,
                "tools[%d] must be {\"type\":\"function\",\"function\":{\"name\" (a-z, A-Z, 0-9, _ or -, at "
                "most 64), \"description\", \"parameters\" (a JSON Schema object)}}",
                k);
            goto out;
        }
        if (forced && !strcmp(forced, nm->valuestring)) found = 1;
        if (exact) {
            k++;
            continue;
        } /* the list is written after the loop */
        char *js = cJSON_PrintUnformatted(t);
        if (!js) {
            cm_api_no_memory(CM_API_OPENAI, ae);
            goto out;
        }
        if (fam == CM_TOOLS_MISTRAL) cm_buf_printf(&list, "%s%s", k ? ", " : "[", js);
        else cm_buf_printf(&list, "%s%s", k ? (fam == CM_TOOLS_LLAMA3 ? "\n\n" : "\n") : "", js);
        cJSON_free(js);
        k++;
    }
    if (fam == CM_TOOLS_MISTRAL && k && !exact) cm_buf_puts(&list, "]");
    if (exact && fam == CM_TOOLS_LLAMA3) cm_tools_llama_list(&list, tools);
    if (exact && fam == CM_TOOLS_MISTRAL && k) cm_tools_mistral_list(&list, tools, tekken);
    cm_buf_append(&list, "", 1);
    if (forced && !found) {
        cm_api_error_set(ae, 400, "invalid_request_error", "tool_choice", NULL,
                         "'tool_choice' names '%.64s', which is not in 'tools'", forced);
        goto out;
    }
    /* the conversation */
    if (n < 1 || n > 4096) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL,
                         "'messages' is required: a non-empty array (at most 4096)");
        goto out;
    }
    if (cm_api_msgs_init(&l, n + 1)) { /* one more: Hermes may add a system message */
        cm_api_no_memory(CM_API_OPENAI, ae);
        goto out;
    }
    m = l.m;
    parts = l.text;
    int nm_ = 0, last_user = -1;
    bool have_system = false, first_user = true;
    const cJSON *msg;
    int i = 0;
    cJSON_ArrayForEach(msg, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        const char *r = cJSON_IsString(role) ? role->valuestring : "";
        if (!strcmp(r, "developer")) r = "system";
        cm_buf *b = &parts[nm_];
        bool is_tool = !strcmp(r, "tool");
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && !is_tool) {
            cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                             "'%s.role' must be system, developer, user, assistant or tool", param);
            goto out;
        }
        if (is_tool) {
            const cJSON *prev = i ? cJSON_GetArrayItem(msgs, i - 1) : NULL;
            const cJSON *pr = cJSON_GetObjectItemCaseSensitive(prev, "role");
            if (!prev || !cJSON_IsString(pr) ||
                (strcmp(pr->valuestring, "tool") && !cJSON_GetObjectItemCaseSensitive(prev, "tool_calls"))) {
                snprintf(param, sizeof param, "messages[%d].role", i);
                cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                                 "messages with role 'tool' must answer a preceding message with 'tool_calls'");
                goto out;
            }
            /* consecutive results share one user turn (the exact families: one turn each) */
            bool join =
                !exact && nm_ > 0 && !strcmp(m[nm_ - 1].role, "user") && parts[nm_ - 1].len && i > 0 &&
                !strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, i - 1), "role")->valuestring, "tool");
            if (join) {
                b = &parts[--nm_];
                b->len--; /* drop the NUL */
                cm_buf_puts(b, "\n");
            }
            cm_buf res;
            cm_buf_init(&res);
            if (!content_of(c, &res)) {
                cm_buf_release(&res);
                goto badc;
            }
            cm_buf_append(&res, "", 1);
            if (exact) cm_tools_exact_result(fam, tekken, msg, res.data, b);
            else if (fam == CM_TOOLS_HERMES) cm_buf_printf(b, "<tool_response>\n%s\n</tool_response>", res.data);
            else if (fam == CM_TOOLS_MISTRAL) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
                cm_buf_printf(b, "[TOOL_RESULTS] {\"content\": %s", res.data);
                if (cJSON_IsString(id)) {
                    cm_buf_puts(b, ", \"call_id\": ");
                    cm_json_str(b, id->valuestring, strlen(id->valuestring));
                }
                cm_buf_puts(b, "}[/TOOL_RESULTS]");
            } else cm_buf_puts(b, res.data);
            cm_buf_release(&res);
            r = !exact ? "user" : fam == CM_TOOLS_LLAMA3 ? "ipython" : "tool_results";
        } else {
            if (!content_of(c, b)) goto badc;
            const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *tc;
            if (tcs && !strcmp(r, "assistant")) {
                int q = 0;
                if (exact) b->len = 0; /* the official templates write only the calls */
                else if (b->len) cm_buf_puts(b, "\n");
                cJSON_ArrayForEach(tc, tcs) if (exact ? !cm_tools_exact_call(fam, tekken, tc, b, q++ == 0)
                                                      : !call_text(fam, tc, b, q++ == 0)) {
                    cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                                     "'%s.tool_calls' entries need function.name and function.arguments (a string)",
                                     param);
                    goto out;
                }
                if (fam == CM_TOOLS_MISTRAL && q) cm_buf_puts(b, "]");
                if (exact && fam == CM_TOOLS_MISTRAL && q) r = "tool_calls";
            }
        }
        if (!strcmp(r, "system")) have_system = true;
        if (!strcmp(r, "user") && !is_tool) {
            last_user = nm_;
            if (first_user && fam == CM_TOOLS_LLAMA3 && !none && k) {
                cm_buf u;
                cm_buf_init(&u);
                cm_buf_printf(&u,
                              "Given the following functions, please respond with a JSON for a function call with its "
                              "proper arguments that best answers the given prompt.\n\nRespond in the format "
                              "{\"name\": function name, \"parameters\": dictionary of argument name and its value}."
                              "Do not use variables.\n\n%s",
                              list.data);
                cm_buf_append(&u, b->data ? b->data : "", b->len);
                cm_buf_release(b);
                *b = u;
            }
            first_user = false;
        }
        cm_buf_append(b, "", 1);
        m[nm_].role = r;
        nm_++;
        i++;
        continue;
    badc:
        cm_api_error_set(ae, 400, "invalid_request_error", param, NULL,
                         "'%s.content' must be a string, text parts or null", param);
        goto out;
    }
    for (int q = 0; q < nm_; q++) m[q].content = parts[q].data;
    /* Hermes: the tools go into the system message (a new one first if none). */
    cm_buf sys;
    cm_buf_init(&sys);
    if (fam == CM_TOOLS_HERMES && !none && k) {
        int si = -1;
        for (int q = 0; q < nm_ && si < 0; q++)
            if (!strcmp(m[q].role, "system")) si = q;
        if (si >= 0) cm_buf_puts(&sys, m[si].content);
        else cm_buf_puts(&sys, "You are a helpful assistant.");
        cm_buf_printf(&sys,
                      "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
                      "provided with function signatures within <tools></tools> XML tags:\n<tools>\n%s\n</tools>\n\n"
                      "For each function call, return a json object with function name and arguments within "
                      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                      "<args-json-object>}\n</tool_call>",
                      list.data);
        cm_buf_append(&sys, "", 1);
        if (si >= 0) m[si].content = sys.data;
        else {
            memmove(m + 1, m, (size_t)nm_ * sizeof *m);
            m[0] = (cm_chat_msg){.role = "system", .content = sys.data};
            nm_++;
            if (last_user >= 0) last_user++;
        }
    }
    (void)have_system;
    cm_buf mu;
    cm_buf_init(&mu);
    if (fam == CM_TOOLS_MISTRAL && !none && k && last_user >= 0) {
        cm_buf_puts(&mu, k_marker);
        cm_buf_puts(&mu, m[last_user].content);
        cm_buf_append(&mu, "", 1);
        m[last_user].content = mu.data;
    }
    char err[256];
    size_t start = text->len;
    if (cm_engine_chat_render(cm_http_engine(srv), cm_http_chat_template(srv), m, (size_t)nm_, true, text, err,
                              sizeof err)) {
        cm_api_error_set(ae, 400, "invalid_request_error", "messages", NULL, "%s", err);
        cm_buf_release(&sys);
        cm_buf_release(&mu);
        goto out;
    }
    if (mu.len) { /* move the tool list in front of the [INST] that holds the marker */
        cm_buf_append(text, "", 1);
        char *base = text->data + start, *mk = strstr(base, k_marker);
        char *inst = NULL;
        for (char *p = base; mk && (p = strstr(p, "[INST]")) && p < mk; p++) inst = p;
        if (mk && inst) {
            cm_buf fixed;
            cm_buf_init(&fixed);
            cm_buf_append(&fixed, base, (size_t)(inst - base));
            if (exact) cm_buf_puts(&fixed, list.data);
            else cm_buf_printf(&fixed, "[AVAILABLE_TOOLS] %s[/AVAILABLE_TOOLS]", list.data);
            cm_buf_append(&fixed, inst, (size_t)(mk - inst));
            cm_buf_puts(&fixed, mk + strlen(k_marker));
            text->len = start;
            cm_buf_append(text, fixed.data, fixed.len);
            cm_buf_release(&fixed);
        } else {
            text->len--; /* the NUL */
        }
    }
    static const char sys_head[] = "<|start_header_id|>system<|end_header_id|>\n\n";
    if (chat_fam == CM_CHAT_LLAMA31 && !none && k) { /* Llama 3.1+: the system block says so when tools are given */
        cm_buf_append(text, "", 1);
        char *h = strstr(text->data + start, sys_head);
        text->len--;
        if (h) {
            size_t at = (size_t)(h - text->data) + sizeof sys_head - 1, tail = text->len - at;
            static const char env[] = "Environment: ipython\n";
            cm_buf_append(text, env, sizeof env - 1); /* grow, then shift the tail */
            memmove(text->data + at + sizeof env - 1, text->data + at, tail);
            memcpy(text->data + at, env, sizeof env - 1);
        }
    }
    cm_buf_release(&sys);
    cm_buf_release(&mu);
    if (!none && k) j->tools = fam;
    /* forced: a grammar for one call of the allowed tools */
    if (!none && k && (required || forced)) {
        if (j->grammar) {
            cm_api_error_set(ae, 400, "invalid_request_error", "response_format", NULL,
                             "'response_format' cannot be combined with a forced 'tool_choice'");
            goto out;
        }
        cm_grammar *g = cm_grammar_new();
        int call = g ? cm_grammar_rule(g) : -1, w = g ? cm_json_ws_rule(g) : -1, root_r = g ? cm_grammar_rule(g) : -1;
        int alt = 0;
        if (!g || call < 0 || w < 0 || root_r < 0) {
            cm_grammar_free(g);
            cm_api_no_memory(CM_API_OPENAI, ae);
            goto out;
        }
        cJSON_ArrayForEach(t, tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (forced && strcmp(forced, nm->valuestring)) continue;
            int args = cm_json_schema_rule(g, cJSON_IsObject(pa) ? pa : NULL, NULL, err, sizeof err);
            if (args < 0) {
                cm_grammar_free(g);
                cm_api_error_set(ae, 400, "invalid_request_error", "tools", NULL, "tool '%.64s' parameters: %s",
                                 nm->valuestring, err);
                goto out;
            }
            if (alt++) cm_grammar_alt(g, call);
            char head[160];
            snprintf(head, sizeof head, "%s{\"name\": \"%s\", \"%s\": ",
                     fam == CM_TOOLS_HERMES    ? "<tool_call>\n"
                     : fam == CM_TOOLS_MISTRAL ? "["
                                               : "",
                     nm->valuestring, fam == CM_TOOLS_LLAMA3 ? "parameters" : "arguments");
            cm_grammar_lit(g, call, head);
            cm_grammar_ref(g, call, args);
            cm_grammar_lit(g, call, fam == CM_TOOLS_HERMES ? "}\n</tool_call>" : fam == CM_TOOLS_MISTRAL ? "}]" : "}");
        }
        cm_grammar_ref(g, root_r, w);
        cm_grammar_ref(g, root_r, call);
        if (cm_grammar_finish(g, root_r, err, sizeof err)) {
            cm_grammar_free(g);
            cm_api_error_set(ae, 400, "invalid_request_error", "tools", NULL, "%s", err);
            goto out;
        }
        j->grammar = g;
    }
    rc = 0;
out:
    cm_api_msgs_release(&l);
    cm_buf_release(&list);
    return rc;
}

/* ---- tools: the reply ---- */

static void trim(const char **s, size_t *n) {
    while (*n && (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r')) (*s)++, (*n)--;
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\n' || (*s)[*n - 1] == '\t' || (*s)[*n - 1] == '\r')) (*n)--;
}

/* {name, arguments|parameters} -> {"name", "arguments": "<compact JSON>"} appended to calls. */
static bool add_call(cJSON *calls, const cJSON *o) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(nm) || !*nm->valuestring ||
        (a && !cJSON_IsObject(a) && !cJSON_IsString(a)))
        return false;
    char *at = !a ? NULL : cJSON_IsString(a) ? NULL : cJSON_PrintUnformatted(a);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", nm->valuestring);
    cJSON_AddStringToObject(c, "arguments", at ? at : cJSON_IsString(a) ? a->valuestring : "{}");
    cJSON_AddItemToArray(calls, c);
    cJSON_free(at);
    return true;
}

/* First occurrence of needle in [p, end), or NULL (the reply is not NUL-terminated). */
static const char *find(const char *p, const char *end, const char *needle) {
    size_t k = strlen(needle);
    for (; p + k <= end; p++)
        if (*p == *needle && !memcmp(p, needle, k)) return p;
    return NULL;
}

int cm_tools_parse_text(int fam, const char *s, size_t n, cm_buf *content, void **calls_out) {
    cJSON *calls = cJSON_CreateArray();
    *calls_out = calls;
    if (!calls) return CM_ENOMEM;
    const char *t = s;
    size_t tn = n;
    trim(&t, &tn);
    if (fam == CM_TOOLS_HERMES) {
        const char *open = "<tool_call>", *close = "</tool_call>";
        const char *p = t, *end = t + tn, *first = NULL;
        bool ok = true;
        while (ok && p < end) {
            const char *a = find(p, end, open);
            if (!a) break;
            if (!first) first = a;
            a += strlen(open);
            const char *b = find(a, end, close);
            if (!b) b = end;
            cJSON *o = cJSON_ParseWithLength(a, (size_t)(b - a));
            ok = o && add_call(calls, o);
            cJSON_Delete(o);
            p = b < end ? b + strlen(close) : end;
        }
        if (ok && first) {
            const char *c = t;
            size_t cn = (size_t)(first - t);
            trim(&c, &cn);
            cm_buf_append(content, c, cn);
            return 0;
        }
    } else {
        const char *p = t;
        size_t pn = tn;
        const char *pre = fam == CM_TOOLS_LLAMA3 ? "<|python_tag|>" : "[TOOL_CALLS]";
        if (pn >= strlen(pre) && !memcmp(p, pre, strlen(pre))) {
            p += strlen(pre);
            pn -= strlen(pre);
            trim(&p, &pn);
        }
        cJSON *o = pn ? cJSON_ParseWithLength(p, pn) : NULL;
        bool ok = o != NULL;
        if (ok && cJSON_IsArray(o) && cJSON_GetArraySize(o) > 0) {
            const cJSON *x;
            cJSON_ArrayForEach(x, o) ok = ok && add_call(calls, x);
        } else if (ok) {
            ok = add_call(calls, o);
        }
        cJSON_Delete(o);
        if (ok) return 0;
    }
    /* not calls: all of it is content */
    while (cJSON_GetArraySize(calls)) cJSON_DeleteItemFromArray(calls, 0);
    cm_buf_append(content, s, n);
    return 0;
}

static void head(cm_buf *b, job *j, bool chunk) {
    cm_buf_puts(b, chunk ? "data: {\"id\":" : "{\"id\":");
    cm_json_str(b, j->id, strlen(j->id));
    cm_buf_printf(b,
                  ",\"object\":\"%s\",\"created\":%lld,\"model\":", chunk ? "chat.completion.chunk" : "chat.completion",
                  j->created);
    cm_json_str(b, cm_http_model_id(j->srv), strlen(cm_http_model_id(j->srv)));
    cm_buf_puts(b, ",\"system_fingerprint\":\"cumulo\",\"choices\":[");
}

static void calls_json(cm_buf *b, job *j, const cJSON *calls, bool with_index) {
    cm_buf_puts(b, "\"tool_calls\":[");
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const char *nm = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const char *ar = cJSON_GetObjectItemCaseSensitive(c, "arguments")->valuestring;
        const char *hex = strchr(j->id, '-');
        cm_buf_printf(b, "%s{", i ? "," : "");
        if (with_index) cm_buf_printf(b, "\"index\":%d,", i);
        cm_buf_printf(b, "\"id\":\"call_%.24s%d\",\"type\":\"function\",\"function\":{\"name\":", hex ? hex + 1 : "",
                      i);
        cm_json_str(b, nm, strlen(nm));
        cm_buf_puts(b, ",\"arguments\":");
        cm_json_str(b, ar, strlen(ar));
        cm_buf_puts(b, "}}");
        i++;
    }
    cm_buf_puts(b, "]");
}

static const char *finish_of(job *j, const cJSON *calls) {
    if (cJSON_GetArraySize(calls) > 0) return "tool_calls";
    return j->finish == CM_FINISH_LENGTH || j->finish == CM_FINISH_CTX ? "length" : "stop";
}

static void usage(cm_buf *b, job *j) {
    cm_buf_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", j->n_ids, j->n_gen,
                  j->n_ids + j->n_gen);
}

void *cm_tools_reply(job *j, cm_buf *content) {
    void *calls = NULL;
    cm_buf_init(content);
    cm_tools_parse_text(j->tools, j->text.data ? j->text.data : "", j->text.len, content, &calls);
    return calls;
}

char *cm_tools_final_json(job *j) {
    cm_buf content, b;
    cm_buf_init(&b);
    cJSON *calls = cm_tools_reply(j, &content);
    head(&b, j, false);
    cm_buf_puts(&b, "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    if (content.len || !cJSON_GetArraySize(calls)) cm_json_str(&b, content.data ? content.data : "", content.len);
    else cm_buf_puts(&b, "null");
    if (cJSON_GetArraySize(calls)) {
        cm_buf_puts(&b, ",");
        calls_json(&b, j, calls, false);
    }
    cm_buf_printf(&b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":", finish_of(j, calls));
    usage(&b, j);
    cm_buf_puts(&b, "}");
    cJSON_Delete(calls);
    cm_buf_release(&content);
    return cm_api_buf_take(&b);
}

void cm_tools_stream_end(job *j) {
    cm_buf *b = &j->sse;
    if (j->http_status) {
        cm_api_sse_error(b, j);
    } else if (j->finish != CM_FINISH_CANCEL) {
        cm_buf content;
        cJSON *calls = cm_tools_reply(j, &content);
        const char *tail = j->include_usage ? ",\"usage\":null}\n\n" : "}\n\n";
        if (content.len) {
            head(b, j, true);
            cm_buf_puts(b, "{\"index\":0,\"delta\":{\"content\":");
            cm_json_str(b, content.data, content.len);
            cm_buf_printf(b, "},\"logprobs\":null,\"finish_reason\":null}]%s", tail);
        }
        if (cJSON_GetArraySize(calls)) {
            head(b, j, true);
            cm_buf_puts(b, "{\"index\":0,\"delta\":{");
            calls_json(b, j, calls, true);
            cm_buf_printf(b, "},\"logprobs\":null,\"finish_reason\":null}]%s", tail);
        }
        head(b, j, true);
        cm_buf_printf(b, "{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}]%s",
                      finish_of(j, calls), tail);
        if (j->include_usage) {
            head(b, j, true);
            cm_buf_puts(b, "],\"usage\":");
            usage(b, j);
            cm_buf_puts(b, "}\n\n");
        }
        cJSON_Delete(calls);
        cm_buf_release(&content);
    }
    cm_buf_puts(b, "data: [DONE]\n\n");
}
