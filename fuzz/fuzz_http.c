/*
 * fuzz_http.c: libFuzzer target for the OpenAI request parser
 * (cm_api_parse_request in src/http/api.c): untrusted JSON bodies of
 * /v1/chat/completions (with tools and response_format: api_tools.c),
 * /v1/completions and Anthropic's /v1/messages (api_anthropic.c), parsed,
 * checked, schemas compiled to grammars, rendered through
 * the chat template and tokenized against stories260K-q8_0 (from
 * $CUMULO_SHARED, default ../shared). The first input byte picks the route
 * (bit 0: chat, bit 1: messages; bit 2: a POST /v1/fine_tuning/jobs body
 * (api_finetune.c; the server's hook refuses every checked request, so no
 * job starts), bit 3: a POST /lora-adapters body (api_lora.c)).
 * Any crash, leak or sanitizer report is a bug; a 4xx is the expected answer
 * to nonsense. The server listens on 127.0.0.1 with a free port only because
 * the parser needs a configured server; nothing connects to it.
 */
#include "engine/engine.h"
#include "http/http.h"
#include "http/http_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cm_http_server *S;
static cm_engine *E;

/* The fine-tuning hook: sees only checked requests; refuses them all. */
static int ft_refuse(void *user, const cm_http_ft_request *r, char *err, size_t errlen) {
    (void)user;
    if (!r->training_file[0] || strlen(r->training_file) >= sizeof r->training_file) abort();
    snprintf(err, errlen, "not in this harness");
    return CM_EINVAL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *shared = getenv("CUMULO_SHARED");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/models/stories260K-q8_0.gguf", shared && *shared ? shared : "../shared");
    cm_engine_opts eo = {.n_threads = 1};
    if (cm_engine_load(&E, path, &eo, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
    cm_http_opts o;
    cm_http_opts_default(&o);
    o.port = 0;
    o.model_id = "m";
    o.finetune = ft_refuse;
    if (cm_http_start(&S, &o, err, sizeof err) || cm_http_set_engine(S, E, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 12) { /* the fine-tuning job and /lora-adapters bodies */
        cm_buf out;
        cm_buf_init(&out);
        api_error ae;
        memset(&ae, 0, sizeof ae);
        int rc = data[0] & 4
                     ? cm_api_finetune(S, "POST", "/v1/fine_tuning/jobs", (const char *)data + 1, size - 1, &out, &ae)
                     : cm_api_lora_set(S, (const char *)data + 1, size - 1, &out, &ae);
        if (rc && (ae.status < 400 || ae.status >= 500 || !ae.message[0])) abort();
        cm_buf_release(&out);
        return 0;
    }
    bool chat = data[0] & 1, messages = data[0] & 2; /* bit 1: Anthropic's /v1/messages */
    job *j = cm_job_new(S, chat || messages);
    if (!j) return 0;
    api_error ae;
    memset(&ae, 0, sizeof ae);
    if (messages ? cm_anth_parse_request(S, (const char *)data + 1, size - 1, j, &ae)
                 : cm_api_parse_request(S, chat, (const char *)data + 1, size - 1, j, &ae)) {
        if (ae.status < 400 || ae.status >= 500 || !ae.message[0]) abort(); /* an error must be a 4xx with a message */
    } else {
        if (j->n_ids < 1 || j->n_ids >= cm_http_n_ctx(S)) abort();
    }
    cm_job_unref(j);
    return 0;
}
