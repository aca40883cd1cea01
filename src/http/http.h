/*
 * http: the OpenAI-compatible HTTP API, the dashboard and its JSON, on
 * libmicrohttpd. On the inference side it sees ONLY engine/engine.h, so the
 * same server fronts one machine now and a cluster engine later.
 *
 * Routes: GET /health, /metrics, /api/cluster, /v1/models, / (dashboard);
 * POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages (Anthropic's
 * Messages API, api_anthropic.c) (streaming as server-sent
 * events or not). Requests wait in a bounded queue for one of n_slots slots;
 * every slot holds an engine session, and all running slots advance together
 * in one batched forward step (continuous batching); a new request joins
 * between steps, on the free slot whose cached tokens share the longest
 * prefix with its prompt. A client that disconnects cancels its request.
 *
 * Safe defaults: 127.0.0.1 only, a Host-header allow-list (DNS rebinding),
 * no CORS headers unless asked, limits on body and header size, connection
 * count and idle time. Every client mistake is a 4xx OpenAI error object.
 */
#ifndef CM_HTTP_H
#define CM_HTTP_H

#include "../base/base.h"
#include "../engine/engine.h"

#include <stdbool.h>
#include <stddef.h>

struct cm_http_ft_request;
typedef struct cm_http_opts {
    const char *host;    /* address to listen on; default "127.0.0.1" */
    int port;            /* 0: any free port (see cm_http_port); default 8080 */
    const char *api_key; /* required as "Authorization: Bearer KEY" on every route but /health and /; NULL/"": none */
    const char *cors_origin;        /* Access-Control-Allow-Origin value; NULL: no CORS headers */
    const char *const *allow_hosts; /* more names accepted in the Host header */
    int n_allow_hosts;
    int n_slots;               /* sequences generating at once; default 4 */
    int queue_max;             /* requests waiting for a slot; beyond: 503; default 16 */
    int n_ctx;                 /* context of each slot; 0: the engine's */
    uint64_t kv_mem;           /* bytes the slots' KV caches may occupy together (admission waits for
                              * room); 0: every slot's whole context, capped at 3/4 of the memory
                              * available at start */
    size_t max_body;           /* bytes; larger bodies get 413; default 1 MiB */
    size_t max_header;         /* bytes for the request line + headers; default 16 KiB */
    int max_conns;             /* open connections; default 4096 (an idle one costs a socket, no thread) */
    int max_conns_per_ip;      /* open connections from one client address; default 256 */
    int n_threads;             /* event-loop threads; 0: 2..4 by the core count */
    int timeout_s;             /* idle seconds before a connection is closed; default 10 */
    double tdp_w;              /* for the power estimate; default 65 */
    const char *model_id;      /* id in /v1/models and responses; default "model" */
    const char *chat_template; /* a family name ("chatml", "llama3", ...); NULL: the model's own
                              * template, or chatml when the model has none (as llama.cpp does) */
    /* Fine-tuning on the server (OpenAI's POST /v1/fine_tuning/jobs; api_finetune.c): NULL: the
     * routes answer 404. Called on an HTTP thread with a checked request; starts the job in the
     * background and returns at once (0), or an error whose message becomes the 400. The job
     * reports through cm_http_ft_progress / cm_http_ft_end; one job at a time. */
    int (*finetune)(void *user, const struct cm_http_ft_request *r, char *err, size_t errlen);
    void *finetune_user;
} cm_http_opts;
void cm_http_opts_default(cm_http_opts *o);

typedef struct cm_http_server cm_http_server;

/* A fine-tuning job as the API asked for it (fields 0: the trainer's defaults). */
typedef struct cm_http_ft_request {
    char id[48];             /* "ftjob-N", the server's */
    char training_file[256]; /* as given: the hook decides where it may be */
    char suffix[64];
    int n_epochs, batch_size;
    double lr_multiplier;   /* of the trainer's learning rate */
    int steps, rank, n_ctx; /* cumulo's own fields */
} cm_http_ft_request;
/* The running job's progress (any thread; copied under the server's lock,
 * shown by GET /v1/fine_tuning/jobs/ID, /api/train and the dashboard's
 * loss curve). val NaN: no eval at this step. */
void cm_http_ft_progress(cm_http_server *s, const char *id, long long step, long long steps, double loss, double val,
                         double tok_per_s, long long tokens);
/* The job ended: rc 0 (adapter: the file written) or an error (msg). */
void cm_http_ft_end(cm_http_server *s, const char *id, int rc, const char *adapter, const char *msg);

/* Listen and serve. Until cm_http_set_engine, /health answers 503 and the
 * generation routes 503 (loading). The options' strings are copied. */
int cm_http_start(cm_http_server **out, const cm_http_opts *o, char *err, size_t errlen);
/* The port actually bound (useful with port 0). */
int cm_http_port(const cm_http_server *s);
/* Hand over a loaded engine (not owned; must outlive cm_http_stop). Makes
 * the slots' sessions and starts the scheduler. */
int cm_http_set_engine(cm_http_server *s, cm_engine *e, char *err, size_t errlen);
/* KV memory of the slots (paged: committed as written, admitted by bytes;
 * reported in blocks of CM_HTTP_KV_BLOCK positions of one sequence). */
enum { CM_HTTP_KV_BLOCK = 256 };
typedef struct cm_http_kv_stats {
    uint64_t capacity;      /* the budget */
    uint64_t in_use;        /* bytes the slots' caches occupy now (pages written) */
    uint64_t reserved;      /* in use by idle slots + promised to running jobs (their prompt + max tokens) */
    uint64_t block_bytes;   /* one block: CM_HTTP_KV_BLOCK positions */
    uint64_t slot_full;     /* one slot at its whole context */
    uint64_t evictions;     /* idle slots' caches given back to admit a job */
    uint64_t pooled;        /* pages kept committed past the slots' positions for reuse (not in in_use; in reserved) */
    uint64_t pool_trims;    /* times the pools were given back to admit a job */
    uint64_t shared;        /* shared prefix KV pages (in in_use, counted once) */
    uint64_t shared_saved;  /* bytes the slots map from them beyond that once: what copies would add */
    int waiting;            /* 1 while the queue's first job waits for KV memory */
    uint64_t interjections; /* short prompts evaluated between two layers of a pass (queue.c interject) */
    uint64_t short_first;   /* short prompts evaluated in a pass of their own between two steps (queue.c) */
} cm_http_kv_stats;
void cm_http_kv_stats_get(cm_http_server *s, cm_http_kv_stats *out); /* zeros before the engine is set */
/* Stop listening, end every request (streams get an error event), join all
 * threads, free the server. NULL is a no-op. */
void cm_http_stop(cm_http_server *s);

/* The Host header h (DNS rebinding): an IP literal (a rebinding attack
 * needs a name), localhost, host (the bound name) or one of allow[0..n);
 * the port is ignored; NULL (HTTP/1.0 without Host, not a browser): yes.
 * server.c's routes and the training dashboard check every request so. */
bool cm_http_host_ok(const char *h, const char *host, char *const *allow, int n_allow);

/* The training dashboard (train_dash.c; `cumulo finetune --dashboard
 * PORT`): a small server of its own on host:port (0: any free port) with
 * GET / (a page that draws the loss curve, tokens/s, the progress and the
 * nodes, polling) and GET /train.json (the same as JSON). The trainer
 * pushes what it shows; any thread, the calls take the dashboard's lock;
 * nothing of the trainer is read by the HTTP threads. Refuses requests
 * whose Host header fails cm_http_host_ok, and every method but GET/HEAD. */
typedef struct cm_train_dash cm_train_dash;
typedef struct cm_train_dash_point {
    int64_t step, steps;
    int epoch;
    double loss, val_loss; /* val_loss NaN: none at this step */
    double lr, tok_per_s, eta_s;
} cm_train_dash_point;
typedef struct cm_train_dash_node {
    char name[64], addr[80]; /* addr "" for this machine */
    int first_layer, last_layer;
    int replica; /* data parallelism: its replica (0 otherwise) */
    bool local;
} cm_train_dash_node;
int cm_train_dash_start(cm_train_dash **out, const char *host, int port, const char *title, char *err, size_t errlen);
int cm_train_dash_port(const cm_train_dash *d);
/* Append a point of the curve (steps in order; a repeated step replaces the last). */
void cm_train_dash_point_add(cm_train_dash *d, const cm_train_dash_point *p);
/* The machines that train now (replaces the previous list; at most 64). */
void cm_train_dash_nodes(cm_train_dash *d, const cm_train_dash_node *nodes, int n);
/* A status line ("training", "resuming from ...", "done: wrote A.gguf", an error). */
void cm_train_dash_status(cm_train_dash *d, const char *text);
void cm_train_dash_stop(cm_train_dash *d); /* NULL: no-op */

#endif
