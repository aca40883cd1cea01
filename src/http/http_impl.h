/*
 * http_impl.h: what the files of the http module share: the server, a job
 * (one generation request, shared by its connection thread and the
 * scheduler), the scheduler (queue.c), metrics (metrics.c), the OpenAI
 * request/response shapes (api.c) and JSON text helpers. Private.
 */
#ifndef CM_HTTP_IMPL_H
#define CM_HTTP_IMPL_H

#include "http.h"

#include "../os/os.h"
#include "../tokenizer/chat.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct cm_http_server cm_http_server;

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };
enum cm_api_kind { CM_API_OPENAI, CM_API_ANTHROPIC, CM_API_COUNT }; /* the shapes a job answers in */

/* One request. Two owners (connection + scheduler) release it with cm_job_unref. */
typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    atomic_int cancel; /* the client went away */
    cm_http_server *srv;
    /* the request (immutable once queued) */
    bool chat, stream, include_usage;
    enum cm_api_kind api;       /* OpenAI (api.c) or Anthropic Messages (api_anthropic.c) */
    int tools;                  /* CM_TOOLS_*: parse the reply for tool calls in that family's format (api_tools.c) */
    struct cm_grammar *grammar; /* response_format / forced tool call; owned, freed with the job */
    int logprobs;               /* -1: none; else top logprobs per token (0..20) */
    int32_t *ids;
    int n_ids;
    cm_gen_params gp;
    float *lora; /* [n_lora]: the adapters' scales for this request (api_lora.c); NULL: no adapters */
    int n_lora;
    char **stops;
    int n_stops;
    char id[48];
    long long created;
    int fd;             /* the connection's socket, to notice a hang-up */
    void *conn;         /* its MHD_Connection, to resume it (server.c) */
    bool suspended;     /* under mu: the connection waits for this job's progress */
    bool keepalive_due; /* under mu: the watchdog asks the stream for a keep-alive comment */
    double t_suspended;
    double t_queued;
    bool trace_sent;  /* CUMULO_SERVE_TRACE: its first token's bytes were handed to the connection */
    struct job *next; /* queue link (scheduler lock) */
    /* progress (under mu) */
    enum job_state state;
    cm_session *sess; /* while it holds a slot, for cancel */
    cm_buf sse;       /* streaming: bytes not yet sent */
    size_t sse_off;
    cm_buf text;         /* non-streaming: the whole text */
    cm_sample_info *lps; /* logprobs of each generated token */
    int32_t *lp_ids;
    int n_lps, cap_lps, lps_sent;
    int n_gen;
    int n_cached; /* prompt tokens found in the slot's KV cache */
    enum cm_finish finish;
    int stop_index;  /* which of stops[] ended it (finish stop), or -1 */
    int http_status; /* 0 or the status of a failure */
    char errmsg[256];
    /* gpt-oss chat (the prompt ends "<|start|>assistant"): only the reply's
     * final channel is returned (cm_harmony, chat.h); hout is its scratch */
    bool harmony;
    cm_harmony hf;
    cm_buf hout;
} job;

job *cm_job_new(cm_http_server *srv, bool chat); /* one reference */
void cm_job_ref(job *j);
void cm_job_unref(job *j);
/* The job made progress (tokens, or its end): resume its connection if it
 * waits. Call without holding j->mu, while holding a reference. */
void cm_job_wake(job *j);

/* An OpenAI error: {"error":{"message","type","param","code"}} with a status. */
typedef struct api_error {
    int status;
    const char *type; /* "invalid_request_error", "authentication_error", ... */
    char param[64];   /* "" = null */
    char code[64];    /* "" = null */
    char message[512];
} api_error;
void cm_api_error_set(api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));
void cm_api_error_json(cm_buf *out, const api_error *e);
/* A failed stream's last event: "data: " and j's error (j->http_status,
 * j->errmsg) as a server_error, then a blank line. */
void cm_api_sse_error(cm_buf *out, const job *j);
/* Parse and check a /v1/chat/completions (chat) or /v1/completions body into
 * j (prompt ids, generation parameters, output options). 0, or -1 with *ae
 * filled (400 naming the parameter, 404 unknown model, 400
 * context_length_exceeded with token counts). */
int cm_api_parse_request(cm_http_server *srv, bool chat, const char *body, size_t n, job *j, api_error *ae);
/* GET /v1/models */
void cm_api_models_json(cm_http_server *srv, cm_buf *out);
/* Append one SSE event "data: <json>\n\n" for the text/logprobs so far. */
void cm_api_stream_delta(job *j, const char *text, size_t len);
/* The first chat event: delta {"role":"assistant","content":""}. */
void cm_api_stream_role(job *j);
/* The closing events: finish chunk, usage chunk, [DONE]. */
void cm_api_stream_end(job *j);
/* Non-streaming body (malloc'd JSON) of a finished job. */
char *cm_api_final_json(job *j);
/* The end of every final_json: NUL-terminates b and hands its bytes to the
 * caller (cm_free), or NULL with b released when an append ran out of
 * memory (api.c). */
char *cm_api_buf_take(cm_buf *b);

/* ---- request fields both APIs read (api_parse.c) ---- */
struct cJSON;
bool cm_api_is_null(const struct cJSON *x); /* absent or JSON null */
/* *ae = 503 "out of memory" in the API's style (error type server_error or
 * api_error); returns -1. */
int cm_api_no_memory(enum cm_api_kind api, api_error *ae);
/* o[key] into *out when present and not null; a number (integer) outside
 * [lo, hi] or a non-boolean is a 400 naming the key in the API's style and
 * false. get_float checks the range on the double and stores it rounded to
 * float (the sampler's fields are floats). */
bool cm_api_get_float(enum cm_api_kind api, const struct cJSON *o, const char *key, double lo, double hi, float *out,
                      api_error *ae);
bool cm_api_get_int(enum cm_api_kind api, const struct cJSON *o, const char *key, double lo, double hi, long long *out,
                    api_error *ae);
bool cm_api_get_bool(enum cm_api_kind api, const struct cJSON *o, const char *key, bool *out, api_error *ae);
/* The request's stop strings into j->stops / j->n_stops and j->gp: OpenAI's
 * "stop" (a string or an array) or Anthropic's "stop_sequences" (an array),
 * at most 16 strings of at most 1024 bytes each; an empty one matches
 * nothing (OpenAI skips it, Anthropic refuses it). 0, or -1 with *ae: 400
 * naming the field, or 503 out of memory (the strings copied so far stay in
 * j->stops, counted in j->n_stops, and go with the job). */
int cm_api_parse_stops(enum cm_api_kind api, const struct cJSON *root, job *j, api_error *ae);
/* A conversation being read from a request: up to cap messages, each with
 * its own text buffer. init: 0, or -1 out of memory (release it either
 * way); add: the next message's role and the buffer its text goes into;
 * seal: NUL-terminates every text and points m[k].content at it, for
 * cm_engine_chat_render(l.m, l.n). */
typedef struct cm_api_msgs {
    cm_chat_msg *m;
    cm_buf *text;
    int n, cap;
} cm_api_msgs;
int cm_api_msgs_init(cm_api_msgs *l, int cap);
cm_buf *cm_api_msgs_add(cm_api_msgs *l, const char *role);
void cm_api_msgs_seal(cm_api_msgs *l);
void cm_api_msgs_release(cm_api_msgs *l);
/* The rendered prompt's token ids into j->ids / j->n_ids (BOS added;
 * special tokens parsed when `special`). 0, or -1 with *ae: 400 naming
 * `param` when the tokenizer refuses the text, 503 out of memory. */
int cm_api_tokenize(cm_http_server *srv, enum cm_api_kind api, const char *text, size_t len, bool special,
                    const char *param, job *j, api_error *ae);

/* ---- LoRA adapters (api_lora.c; llama-server's routes and "lora" field) ---- */
/* The request's "lora" list (root: its cJSON) over the defaults into
 * j->lora; 0, or -1 with a 400 naming the bad entry. */
int cm_api_parse_lora(cm_http_server *srv, enum cm_api_kind api, const void *root, job *j, api_error *ae);
/* GET /lora-adapters: [{"id","path","scale"}]; POST: set the defaults ({"success":true}). 0 or -1 + *ae. */
int cm_api_lora_list_json(cm_http_server *srv, cm_buf *out, api_error *ae);
int cm_api_lora_set(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae);

/* ---- fine-tuning jobs (api_finetune.c) ---- */
typedef struct cm_ft_state cm_ft_state;
cm_ft_state *cm_ft_new(void);
void cm_ft_free(cm_ft_state *f);
/* POST/GET /v1/fine_tuning/jobs, GET /v1/fine_tuning/jobs/ID, GET /api/train: 0 (out: the JSON) or -1 + *ae. */
int cm_api_finetune(cm_http_server *srv, const char *method, const char *url, const char *body, size_t n, cm_buf *out,
                    api_error *ae);
cm_ft_state *cm_http_ft(const cm_http_server *s); /* server.c */
const cm_http_opts *cm_http_options(const cm_http_server *s);

/* ---- Anthropic Messages API (api_anthropic.c) ---- */
/* {"type":"error","error":{"type","message"}}, the type from e->status. */
void cm_anth_error_json(cm_buf *out, const api_error *e);
/* Parse and check a POST /v1/messages body into j (as cm_api_parse_request). */
int cm_anth_parse_request(cm_http_server *srv, const char *body, size_t n, job *j, api_error *ae);
void cm_anth_stream_start(job *j); /* message_start, content_block_start, ping */
void cm_anth_stream_delta(job *j, const char *text, size_t len);
void cm_anth_stream_end(job *j); /* content_block_stop, message_delta, message_stop (or error) */
char *cm_anth_final_json(job *j);
/* Tool use (api_anthropic_tools.c): wanted = tools or tool blocks in the
 * request; prompt = translate to the OpenAI shape and cm_tools_prompt; the
 * reply as content blocks (text, tool_use), whole or as stream events. */
bool cm_anth_tools_wanted(const void *root);
int cm_anth_tools_prompt(cm_http_server *srv, const void *root, job *j, cm_buf *text, api_error *ae);
char *cm_anth_tools_final_json(job *j);
void cm_anth_tools_stream_end(job *j);

/* ---- tools and structured output (api_tools.c) ---- */
enum { CM_TOOLS_OFF, CM_TOOLS_HERMES, CM_TOOLS_LLAMA3, CM_TOOLS_MISTRAL };
/* root: the request's cJSON. response_format -> j->grammar (0, or -1 + *ae). */
int cm_api_response_format(const void *root, job *j, api_error *ae);
/* Does the request use tools (tools, or tool messages / tool_calls in history)? */
bool cm_tools_wanted(const void *root);
/* The prompt of a tools request, rendered for the model's family; sets
 * j->tools and, for a forced tool_choice, j->grammar. 0 or -1 + *ae. */
int cm_tools_prompt(cm_http_server *srv, const void *root, job *j, cm_buf *text, api_error *ae);
/* Split a reply into content and calls (a cJSON array of {"name","arguments"
 * (a JSON string)}, empty when the reply is not calls; free with cJSON_Delete). */
int cm_tools_parse_text(int family, const char *s, size_t n, cm_buf *content, void **calls);
/* The same for a finished tools job's reply (j->text, j->tools): content
 * is initialised here (release it); returns the calls (a cJSON *). */
void *cm_tools_reply(job *j, cm_buf *content);
char *cm_tools_final_json(job *j);
void cm_tools_stream_end(job *j);
/* tools_render.c: tool turns as the official templates write them (Llama
 * 3.1+, Mistral v3 and Nemo). pyjson: Jinja's tojson (Python's json.dumps);
 * llama_list: each tool tojson(indent=4) + blank line; mistral_list: the
 * whole [AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]; exact_call: one assistant
 * call (false: no function.name / arguments string); exact_result: a tool
 * message's text (llama3: a JSON string; mistral: the [TOOL_RESULTS] block). */
void cm_tools_pyjson(cm_buf *b, const void *json, int indent);
void cm_tools_llama_list(cm_buf *b, const void *tools);
void cm_tools_mistral_list(cm_buf *b, const void *tools, bool tekken);
bool cm_tools_exact_call(int fam, bool tekken, const void *tool_call, cm_buf *out, bool first);
void cm_tools_exact_result(int fam, bool tekken, const void *msg, const char *content, cm_buf *out);

/* ---- embeddings (api_embed.c) ---- */
/* POST /v1/embeddings: computes on the calling thread and appends the
 * response JSON to out; 0, or -1 with *ae filled (out then holds junk). */
int cm_api_embeddings(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae);
/* POST /apply-template (llama-server's route): a chat request's prompt as
 * this server renders it, tools included: {"prompt": TEXT}; nothing runs. */
int cm_api_apply_template(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae);

/* ---- request queue (queue.c) ---- */
typedef struct cm_queue cm_queue;
cm_queue *cm_queue_new(cm_http_server *srv, cm_engine *e, int n_slots, int queue_max, int n_ctx, uint64_t kv_mem,
                       char *err, size_t errlen);
/* Queue a job (takes a reference). CM_EBUSY when the queue is full,
 * CM_ESTATE when stopping. */
int cm_queue_submit(cm_queue *s, job *j);
void cm_queue_stats(cm_queue *s, int *queued, int *active, int *slots);
void cm_queue_kv_stats(cm_queue *s, cm_http_kv_stats *out);
void cm_queue_free(cm_queue *s); /* ends queued and running jobs, joins the thread */

/* ---- metrics (metrics.c) ---- */
enum route {
    R_ROOT,
    R_HEALTH,
    R_METRICS,
    R_CLUSTER,
    R_MODELS,
    R_CHAT,
    R_COMPLETIONS,
    R_MESSAGES,
    R_EMBEDDINGS,
    R_APPLY_TEMPLATE,
    R_LORA,
    R_FINETUNE,
    R_OTHER,
    R_COUNT
};
extern const char *const cm_http_route_names[R_COUNT];
typedef struct metrics metrics;
metrics *cm_metrics_new(double tdp_w);
void cm_metrics_free(metrics *m);
void cm_metrics_request(metrics *m, enum route r, int status);
void cm_metrics_tokens(metrics *m, int n_prompt, int n_cached); /* a request completed */
void cm_metrics_prefix(metrics *m, int n_tokens);               /* a prompt prefix copied from another slot (queue.c) */
void cm_metrics_gen_tokens(metrics *m, int n);                  /* as they are produced, for tokens/s */
void cm_metrics_prometheus(metrics *m, cm_http_server *srv, cm_buf *out);
void cm_metrics_cluster_json(metrics *m, cm_http_server *srv, cm_buf *out);
/* A mixture of experts' routing (metrics_experts.c): /metrics lines; /api/cluster's
 * ",\"experts\":{...}" member; a node's ",\"experts\":[b,e],\"replicas\":[...]". Nothing
 * for a dense model (or a member outside an expert group). */
void cm_metrics_experts_prometheus(cm_http_server *srv, cm_buf *out);
void cm_metrics_experts_json(cm_http_server *srv, cm_buf *out);
void cm_metrics_member_experts_json(cm_buf *out, const cm_engine_member *mb);

/* ---- server facts other files need (server.c) ---- */
const char *cm_http_model_id(const cm_http_server *s);
cm_engine *cm_http_engine(const cm_http_server *s);
metrics *cm_http_metrics(const cm_http_server *s);
/* The scheduler's counts; all 0 before the engine is set. */
void cm_http_queue_stats(cm_http_server *s, int *queued, int *active, int *slots);
bool cm_http_ready(cm_http_server *s);
int cm_http_n_ctx(const cm_http_server *s);
/* The chat template family to use: NULL = the model's own. */
const char *cm_http_chat_template(const cm_http_server *s);

/* The limits in force (after cm_http_fit_fd_limit): all connections, per address (0: none). */
void cm_http_conn_limits(const cm_http_server *s, int *all, int *per_ip);

/* ---- process limits and libmicrohttpd's log (server_limits.c) ---- */
#include <stdarg.h>
/* MHD_OPTION_EXTERNAL_LOGGER: cls is the server (or NULL). */
void cm_http_mhd_log(void *cls, const char *fmt, va_list ap);
/* Raise RLIMIT_NOFILE toward want_conns + 256; the connections that fit. */
int cm_http_fit_fd_limit(int want_conns);

/* ---- JSON text (api.c) ---- */
/* Append n bytes as a JSON string (with quotes); invalid UTF-8 becomes U+FFFD. */
void cm_json_str(cm_buf *b, const char *s, size_t n);

/* ---- dashboard (dashboard.c) ---- */
extern const unsigned char cm_http_dashboard_html[]; /* NUL-terminated */

#endif
