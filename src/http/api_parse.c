/*
 * api_parse.c: what the OpenAI (api.c) and Anthropic (api_anthropic.c)
 * request parsers share: reading a number, integer or boolean field with
 * its range checked (absent or null keeps the default; anything else is a
 * 400 naming the field), the list of messages a conversation is read into,
 * and turning the rendered prompt into the job's token ids. Each API's own message style is kept: OpenAI's
 * "'temperature' must be ...", Anthropic's "temperature: must be ...".
 *
 * Never aborts on input.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

bool cm_api_is_null(const cJSON *x) { return !x || cJSON_IsNull(x); }

int cm_api_msgs_init(cm_api_msgs *l, int cap) {
    *l = (cm_api_msgs){.m = cm_calloc((size_t)cap, sizeof *l->m), .text = cm_calloc((size_t)cap, sizeof *l->text)};
    if (!l->m || !l->text) return -1;
    l->cap = cap;
    for (int k = 0; k < cap; k++) cm_buf_init(&l->text[k]);
    return 0;
}

cm_buf *cm_api_msgs_add(cm_api_msgs *l, const char *role) {
    CM_ASSERT(l->n < l->cap);
    l->m[l->n].role = role;
    return &l->text[l->n++];
}

void cm_api_msgs_seal(cm_api_msgs *l) {
    for (int k = 0; k < l->n; k++) {
        cm_buf_append(&l->text[k], "", 1);
        l->m[k].content = l->text[k].data;
    }
}

void cm_api_msgs_release(cm_api_msgs *l) {
    for (int k = 0; k < l->cap; k++) cm_buf_release(&l->text[k]);
    cm_free(l->text);
    cm_free(l->m);
    *l = (cm_api_msgs){0};
}

/* A 400 invalid_request_error for `key` whose message is "<key> <what>" in
 * the API's style. */
static void bad_field(enum cm_api_kind api, api_error *ae, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bad_field(enum cm_api_kind api, api_error *ae, const char *key, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (api == CM_API_ANTHROPIC) cm_api_error_set(ae, 400, "invalid_request_error", key, NULL, "%s: %s", key, what);
    else cm_api_error_set(ae, 400, "invalid_request_error", key, NULL, "'%s' %s", key, what);
}

bool cm_api_get_float(enum cm_api_kind api, const cJSON *o, const char *key, double lo, double hi, float *out,
                      api_error *ae) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cm_api_is_null(x)) return true;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < lo || x->valuedouble > hi) {
        bad_field(api, ae, key, "must be a number from %g to %g", lo, hi);
        return false;
    }
    *out = (float)x->valuedouble;
    return true;
}

bool cm_api_get_int(enum cm_api_kind api, const cJSON *o, const char *key, double lo, double hi, long long *out,
                    api_error *ae) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cm_api_is_null(x)) return true;
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < lo || x->valuedouble > hi) {
        bad_field(api, ae, key, "must be an integer from %.0f to %.0f", lo, hi);
        return false;
    }
    *out = (long long)x->valuedouble;
    return true;
}

bool cm_api_get_bool(enum cm_api_kind api, const cJSON *o, const char *key, bool *out, api_error *ae) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cm_api_is_null(x)) return true;
    if (!cJSON_IsBool(x)) {
        bad_field(api, ae, key, "must be true or false");
        return false;
    }
    *out = cJSON_IsTrue(x);
    return true;
}

int cm_api_tokenize(cm_http_server *srv, enum cm_api_kind api, const char *text, size_t len, bool special,
                    const char *param, job *j, api_error *ae) {
    cm_engine *e = cm_http_engine(srv);
    char err[256];
    int cap = (int)CM_MIN(len + 8, (size_t)cm_http_n_ctx(srv) + 8);
    for (;;) {
        j->ids = cm_malloc((size_t)cap * sizeof *j->ids);
        if (!j->ids) {
            cm_api_error_set(ae, 503, api == CM_API_ANTHROPIC ? "api_error" : "server_error", NULL, NULL,
                             "out of memory");
            return -1;
        }
        int n = cm_engine_tokenize(e, text, len, true, special, j->ids, cap, err, sizeof err);
        if (n < 0) {
            if (api == CM_API_ANTHROPIC)
                cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, "%s: %s", param, err);
            else cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, "%s", err);
            return -1;
        }
        if (n <= cap) {
            j->n_ids = n;
            return 0;
        }
        cm_free(j->ids);
        j->ids = NULL;
        cap = n;
    }
}
