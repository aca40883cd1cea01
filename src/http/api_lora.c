/*
 * api_lora.c: LoRA adapters per request, as llama-server does it, so its
 * clients work unchanged: GET /lora-adapters lists the loaded adapters
 * ([{"id","path","scale"}]), POST /lora-adapters sets the default scales
 * ([{"id","scale"}], adapters not listed: 0), and a request's
 * "lora": [{"id","scale"}] replaces the defaults for that request only
 * (not listed: 0; an empty list: the defaults). The scales travel with the
 * job to its session (queue.c, cm_session_set_lora): requests with
 * different adapters share batched passes; cached prefixes are reused only
 * under equal scales (engine_lora.c).
 *
 * Bytes from a client: every id and scale is checked (a 400 naming the
 * entry); never aborts on input.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* list -> scales[0..n): unlisted adapters 0. 0, or -1 with msg ("lora[1].id ..."). */
static int parse_list(const cJSON *list, const char *name, float *scales, int n, char *msg, size_t msglen) {
    if (!cJSON_IsArray(list)) {
        snprintf(msg, msglen, "'%s' must be an array of {\"id\": N, \"scale\": S} objects", name);
        return -1;
    }
    for (int i = 0; i < n; i++) scales[i] = 0.0f;
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(it, "scale");
        if (!cJSON_IsObject(it)) {
            snprintf(msg, msglen, "'%s[%d]' must be an object {\"id\": N, \"scale\": S}", name, k);
            return -1;
        }
        if (!cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble)) {
            snprintf(msg, msglen, "'%s[%d].id' must be an integer adapter id (GET /lora-adapters lists them)", name, k);
            return -1;
        }
        if (id->valuedouble < 0 || id->valuedouble >= n) {
            if (n)
                snprintf(msg, msglen, "'%s[%d].id' %.0f is not an adapter id: this server has %d (ids 0 to %d)", name,
                         k, id->valuedouble, n, n - 1);
            else
                snprintf(
                    msg, msglen,
                    "'%s[%d].id' %.0f is not an adapter id: this server has no LoRA adapters (start it with --lora FILE.gguf)",
                    name, k, id->valuedouble);
            return -1;
        }
        if (!cJSON_IsNumber(sc) || !isfinite(sc->valuedouble) || fabs(sc->valuedouble) >= 1e6) {
            snprintf(msg, msglen, "'%s[%d].scale' must be a number between -1e6 and 1e6 (0: off)", name, k);
            return -1;
        }
        scales[(int)id->valuedouble] = (float)sc->valuedouble;
        k++;
    }
    return 0;
}

int cm_api_parse_lora(cm_http_server *srv, enum cm_api_kind api, const void *root, job *j, api_error *ae) {
    cm_engine *e = cm_http_engine(srv);
    const int n = cm_engine_lora_count(e);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive((const cJSON *)root, "lora");
    if (!n && (cm_api_is_null(list) || (cJSON_IsArray(list) && cJSON_GetArraySize(list) == 0))) return 0;
    char msg[400];
    if (n) {
        if (!(j->lora = cm_malloc((size_t)n * sizeof *j->lora))) return cm_api_no_memory(api, ae);
        j->n_lora = n;
        cm_engine_lora_defaults(e, j->lora, n);
    }
    int rc = 0;
    if (!cm_api_is_null(list) && !(cJSON_IsArray(list) && cJSON_GetArraySize(list) == 0)) {
        rc = parse_list(list, "lora", j->lora, n, msg, sizeof msg);
        if (!rc && cm_engine_lora_check(e, j->lora, n, msg, sizeof msg)) rc = -1;
    }
    if (rc) {
        if (api == CM_API_ANTHROPIC) cm_api_error_set(ae, 400, "invalid_request_error", "lora", NULL, "lora: %s", msg);
        else cm_api_error_set(ae, 400, "invalid_request_error", "lora", NULL, "%s", msg);
    }
    return rc;
}

int cm_api_lora_list_json(cm_http_server *srv, cm_buf *out, api_error *ae) {
    cm_engine *e = cm_http_engine(srv);
    const int n = cm_engine_lora_count(e);
    float *sc = cm_malloc((size_t)(n ? n : 1) * sizeof *sc);
    if (!sc) return cm_api_no_memory(CM_API_OPENAI, ae);
    cm_engine_lora_defaults(e, sc, n);
    cm_buf_puts(out, "[");
    for (int i = 0; i < n; i++) {
        const char *p = cm_engine_lora_path(e, i);
        cm_buf_printf(out, "%s{\"id\":%d,\"path\":", i ? "," : "", i);
        cm_json_str(out, p, strlen(p));
        char num[32];
        for (int prec = 6; prec <= 9;
             prec++) { /* the shortest that reads back as the same float: 0.7, not 0.699999988 */
            snprintf(num, sizeof num, "%.*g", prec, (double)sc[i]);
            if (strtof(num, NULL) == sc[i]) break;
        }
        cm_buf_printf(out, ",\"scale\":%s}", num);
    }
    cm_buf_puts(out, "]");
    cm_free(sc);
    return 0;
}

int cm_api_lora_set(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae) {
    cm_engine *e = cm_http_engine(srv);
    const int na = cm_engine_lora_count(e);
    cJSON *root = cJSON_ParseWithLength(body, n);
    float *sc = cm_malloc((size_t)(na ? na : 1) * sizeof *sc);
    char msg[400];
    int rc = -1;
    if (!sc) cm_api_no_memory(CM_API_OPENAI, ae);
    else if (!root)
        cm_api_error_set(ae, 400, "invalid_request_error", NULL, NULL, "the request body is not valid JSON");
    else if (parse_list(root, "body", sc, na, msg, sizeof msg) ||
             cm_engine_lora_set_defaults(e, sc, na, msg, sizeof msg))
        cm_api_error_set(ae, 400, "invalid_request_error", NULL, NULL, "%s", msg);
    else {
        cm_buf_puts(out, "{\"success\":true}");
        rc = 0;
    }
    cJSON_Delete(root);
    cm_free(sc);
    return rc;
}
