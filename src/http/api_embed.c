/*
 * api_embed.c: POST /v1/embeddings in OpenAI's shape. `input` is a string,
 * an array of strings, an array of token ids, or an array of such arrays;
 * each becomes one vector of the model's embedding width
 * (cm_engine_embed), as JSON floats or, with encoding_format "base64",
 * little-endian float32 bytes in base64 (what the openai SDK asks for by
 * default). Strings get BOS as for a prompt; token-id arrays are used as
 * they are.
 *
 * Pooling: the GGUF's `<arch>.pooling_type` when it declares one, else mean;
 * a request may override it with "pooling": "mean" | "cls" | "last" (a
 * cumulo extension, as llama.cpp's server takes --pooling). Vectors are
 * L2-normalised (unit length, as OpenAI's and llama.cpp's server's are)
 * unless "normalize": false. A `dimensions` other than the model's width is
 * a 400 (these models have no Matryoshka training to truncate to).
 *
 * Runs on the connection thread (no slot: an embedding is one prefill);
 * never aborts on input.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_INPUTS 2048 /* OpenAI's limit */

static void b64(cm_buf *b, const unsigned char *p, size_t n) {
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        q[0] = k[v >> 18 & 63];
        q[1] = k[v >> 12 & 63];
        q[2] = i + 1 < n ? k[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? k[v & 63] : '=';
        cm_buf_append(b, q, 4);
    }
}

/* One input's ids into *ids (malloc'd): a string (tokenized, BOS added) or
 * an array of token ids. */
static int input_ids(cm_http_server *srv, const cJSON *x, int idx, int32_t **ids, int *n, api_error *ae) {
    cm_engine *e = cm_http_engine(srv);
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    int n_ctx = cm_http_n_ctx(srv);
    *ids = NULL;
    *n = 0;
    if (cJSON_IsString(x)) {
        size_t len = strlen(x->valuestring);
        if (!len) {
            cm_api_error_set(ae, 400, "invalid_request_error", "input", NULL, "'input[%d]' is an empty string", idx);
            return -1;
        }
        char err[256];
        int cap = (int)CM_MIN(len + 8, (size_t)n_ctx + 8);
        for (;;) {
            *ids = cm_malloc((size_t)cap * sizeof **ids);
            if (!*ids) return cm_api_no_memory(CM_API_OPENAI, ae);
            int k = cm_engine_tokenize(e, x->valuestring, len, true, false, *ids, cap, err, sizeof err);
            if (k < 0) {
                cm_api_error_set(ae, 400, "invalid_request_error", "input", NULL, "%s", err);
                return -1;
            }
            if (k <= cap) {
                *n = k;
                break;
            }
            cm_free(*ids);
            *ids = NULL;
            cap = k;
        }
    } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) > 0) {
        int k = cJSON_GetArraySize(x);
        *ids = cm_malloc((size_t)k * sizeof **ids);
        if (!*ids) return cm_api_no_memory(CM_API_OPENAI, ae);
        const cJSON *t;
        cJSON_ArrayForEach(t, x) {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
                t->valuedouble >= in.n_vocab) {
                cm_api_error_set(ae, 400, "invalid_request_error", "input", NULL,
                                 "'input[%d]': token ids must be integers from 0 to %d", idx, in.n_vocab - 1);
                return -1;
            }
            (*ids)[(*n)++] = (int32_t)t->valuedouble;
        }
    } else {
        cm_api_error_set(ae, 400, "invalid_request_error", "input", NULL,
                         "'input' must be a string, an array of strings, an array of token ids or an array of "
                         "token-id arrays (none empty)");
        return -1;
    }
    if (*n > n_ctx) {
        cm_api_error_set(ae, 400, "invalid_request_error", "input", "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, input[%d] has %d tokens.", n_ctx,
                         idx, *n);
        return -1;
    }
    return 0;
}

int cm_api_embeddings(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae) {
    cJSON *root = cJSON_ParseWithLength(body, n);
    cm_engine *e = cm_http_engine(srv);
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    float *vec = NULL;
    int32_t *ids = NULL;
    int rc = -1;
#define BAD(param, ...)                                                               \
    do {                                                                              \
        cm_api_error_set(ae, 400, "invalid_request_error", param, NULL, __VA_ARGS__); \
        goto done;                                                                    \
    } while (0)
    if (!root) BAD(NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(root)) BAD(NULL, "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) BAD("model", "'model' must be a string");
    if (cJSON_IsString(model) && strcmp(model->valuestring, cm_http_model_id(srv))) {
        cm_api_error_set(ae, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%.200s' does not exist; this server serves '%.200s'", model->valuestring,
                         cm_http_model_id(srv));
        goto done;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    bool base64 = false;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64")))
            BAD("encoding_format", "'encoding_format' must be 'float' or 'base64'");
        base64 = !strcmp(fmt->valuestring, "base64");
    }
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    if (dim && !cJSON_IsNull(dim) && (!cJSON_IsNumber(dim) || dim->valuedouble != in.n_embd))
        BAD("dimensions", "'dimensions' must be %d, this model's embedding width (it cannot shorten its vectors)",
            in.n_embd);
    enum cm_pooling pooling = cm_engine_pooling(e, NULL);
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(root, "pooling");
    if (pl && !cJSON_IsNull(pl)) {
        int k = -1;
        for (int i = 0; cJSON_IsString(pl) && i < CM_POOLING_COUNT; i++)
            if (!strcmp(pl->valuestring, cm_pooling_name((enum cm_pooling)i))) k = i;
        if (k < 0) BAD("pooling", "'pooling' must be 'mean', 'cls' or 'last'");
        pooling = (enum cm_pooling)k;
    }
    bool normalize = true;
    const cJSON *nz = cJSON_GetObjectItemCaseSensitive(root, "normalize");
    if (nz && !cJSON_IsNull(nz)) {
        if (!cJSON_IsBool(nz)) BAD("normalize", "'normalize' must be true or false");
        normalize = cJSON_IsTrue(nz);
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!input || cJSON_IsNull(input)) BAD("input", "'input' is required");
    /* One input (a string or one id array) or a list of them. */
    bool many = cJSON_IsArray(input) && cJSON_GetArraySize(input) > 0 &&
                (cJSON_IsString(cJSON_GetArrayItem(input, 0)) || cJSON_IsArray(cJSON_GetArrayItem(input, 0)));
    int n_in = many ? cJSON_GetArraySize(input) : 1;
    if (n_in > MAX_INPUTS) BAD("input", "'input' has %d items; at most %d", n_in, MAX_INPUTS);
    vec = cm_malloc((size_t)in.n_embd * sizeof *vec);
    if (!vec) {
        cm_api_no_memory(CM_API_OPENAI, ae);
        goto done;
    }
    cm_buf_puts(out, "{\"object\":\"list\",\"data\":[");
    long long n_tok = 0;
    for (int i = 0; i < n_in; i++) {
        const cJSON *x = many ? cJSON_GetArrayItem(input, i) : input;
        int k;
        if (many && !cJSON_IsString(x) && !cJSON_IsArray(x))
            BAD("input", "'input[%d]' must be a string or an array of token ids like the first item", i);
        if (input_ids(srv, x, i, &ids, &k, ae)) goto done;
        char err[256];
        int erc = cm_engine_embed(e, ids, k, pooling, normalize, vec, err, sizeof err);
        cm_free(ids);
        ids = NULL;
        if (erc) {
            if (erc == CM_EUNSUPPORTED) cm_api_error_set(ae, 501, "server_error", NULL, "unsupported", "%s", err);
            else if (erc == CM_ENOMEM) cm_api_error_set(ae, 503, "server_error", NULL, NULL, "%s", err);
            else
                cm_api_error_set(ae, erc == CM_EINVAL || erc == CM_ENOSPACE ? 400 : 500,
                                 erc == CM_EINVAL || erc == CM_ENOSPACE ? "invalid_request_error" : "server_error",
                                 "input", NULL, "%s", err);
            goto done;
        }
        n_tok += k;
        cm_buf_printf(out, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (base64) {
            unsigned char le[4];
            cm_buf_puts(out, "\"");
            /* little-endian float32, as numpy's frombuffer reads it */
            cm_buf bytes;
            cm_buf_init(&bytes);
            for (int d = 0; d < in.n_embd; d++) {
                uint32_t u;
                memcpy(&u, &vec[d], 4);
                le[0] = (unsigned char)u;
                le[1] = (unsigned char)(u >> 8);
                le[2] = (unsigned char)(u >> 16);
                le[3] = (unsigned char)(u >> 24);
                cm_buf_append(&bytes, le, 4);
            }
            b64(out, (const unsigned char *)bytes.data, bytes.len);
            cm_buf_release(&bytes);
            cm_buf_puts(out, "\"");
        } else {
            cm_buf_puts(out, "[");
            for (int d = 0; d < in.n_embd; d++)
                cm_buf_printf(out, "%s%.9g", d ? "," : "", isfinite(vec[d]) ? vec[d] : 0.0);
            cm_buf_puts(out, "]");
        }
        cm_buf_puts(out, "}");
    }
    cm_buf_puts(out, "],\"model\":");
    cm_json_str(out, cm_http_model_id(srv), strlen(cm_http_model_id(srv)));
    cm_buf_printf(out, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}", n_tok, n_tok);
    if (out->oom) {
        cm_api_no_memory(CM_API_OPENAI, ae);
        goto done;
    }
    rc = 0;
#undef BAD
done:
    cm_free(ids);
    cm_free(vec);
    cJSON_Delete(root);
    return rc;
}
