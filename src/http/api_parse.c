/*
 * api_parse.c: what the OpenAI (api.c) and Anthropic (api_anthropic.c)
 * request parsers share: reading a number, integer or boolean field with
 * its range checked (absent or null keeps the default; anything else is a
 * 400 naming the field), the stop strings, the out-of-memory error, the
 * list of messages a conversation is read into, and turning the rendered
 * prompt into the job's token ids. Each API's own message style is kept:
 * OpenAI's "'temperature' must be ...", Anthropic's "temperature: must be ...".
 *
 * Never aborts on input.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

int cm_api_no_memory(enum cm_api_kind api, api_error *ae) {
    cm_api_error_set(ae, 503, api == CM_API_ANTHROPIC ? "api_error" : "server_error", NULL, NULL, "out of memory");
    return -1;
}

int cm_api_parse_stops(enum cm_api_kind api, const cJSON *root, job *j, api_error *ae) {
    bool anth = api == CM_API_ANTHROPIC;
    const char *key = anth ? "stop_sequences" : "stop";
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, key);
    if (cm_api_is_null(stop)) return 0;
    int ns = cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : !anth && cJSON_IsString(stop) ? 1 : -1;
    if (ns < 0 || ns > 16) {
        bad_field(api, ae, key,
                  anth ? "must be an array of at most 16 strings"
                       : "must be a string or an array of at most 16 strings");
        return -1;
    }
    j->stops = cm_calloc((size_t)(ns ? ns : 1), sizeof *j->stops);
    if (!j->stops) return cm_api_no_memory(api, ae);
    for (int i = 0; i < ns; i++) {
        const cJSON *s = cJSON_IsString(stop) ? stop : cJSON_GetArrayItem(stop, i);
        if (!cJSON_IsString(s) || strlen(s->valuestring) > 1024) {
            if (anth)
                cm_api_error_set(ae, 400, "invalid_request_error", key, NULL,
                                 "%s.%d: must be a string of at most 1024 bytes", key, i);
            else bad_field(api, ae, key, "must be a string or an array of strings (each at most 1024 bytes)");
            return -1;
        }
        if (!*s->valuestring) { /* an empty stop string matches nothing */
            if (!anth) continue;
            cm_api_error_set(ae, 400, "invalid_request_error", key, NULL, "%s.%d: must not be empty", key, i);
            return -1;
        }
        if (!(j->stops[j->n_stops] = cm_strdup(s->valuestring))) return cm_api_no_memory(api, ae);
        j->n_stops++;
    }
    j->gp.stops = (const char *const *)j->stops;
    j->gp.n_stops = j->n_stops;
    return 0;
}

int cm_api_tokenize(cm_http_server *srv, enum cm_api_kind api, const char *text, size_t len, bool special,
                    const char *param, job *j, api_error *ae) {
    cm_engine *e = cm_http_engine(srv);
    char err[256];
    int cap = (int)CM_MIN(len + 8, (size_t)cm_http_n_ctx(srv) + 8);
    for (;;) {
        j->ids = cm_malloc((size_t)cap * sizeof *j->ids);
        if (!j->ids) return cm_api_no_memory(api, ae);
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
