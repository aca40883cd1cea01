/*
 * engine: the inference facade. An engine is a loaded model (mmapped GGUF +
 * cm_model), its tokenizer and a compute pool (later: a cluster behind the
 * same calls). A session is one sequence: its KV cache, its token history,
 * its sampler. The HTTP layer and the CLI see only this header.
 *
 * Ownership: cm_engine_load returns an engine the caller frees with
 * cm_engine_free after freeing its sessions. Sessions may live on different
 * threads; forward passes of one engine are serialised by the engine (one
 * compute pool), so two sessions generating at once take turns per step.
 * cm_session_cancel may be called from any thread (e.g. a signal-driven
 * watcher or an HTTP disconnect); everything else on a session is one thread
 * at a time.
 *
 * Memory: the model stays in the mmap; a session allocates its KV cache,
 * sampler and scratch when created; generating allocates nothing per token.
 */
#ifndef CM_ENGINE_H
#define CM_ENGINE_H

#include "../base/base.h"
#include "../sampler/sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cm_engine cm_engine;
typedef struct cm_session cm_session;

/* Called while the file is mapped and read (done == total at the end). */
typedef void (*cm_engine_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct cm_engine_opts {
    int n_threads;       /* compute threads; 0 = all online CPUs */
    int n_ctx;           /* default context of sessions; 0 = the model's, capped at 4096 */
    int n_batch;         /* most prompt tokens per forward pass; 0 = 64 */
    cm_engine_progress_fn progress; /* NULL: no progress (pages load lazily) */
    void *progress_ctx;
    /* Cluster, pipeline parallel (NULL nodes: this machine only). This
     * machine computes the first stage; the nodes the rest, the last one
     * samples. "auto" finds nodes by mDNS; else "host:port,host:port,...". */
    const char *nodes;
    bool insecure;          /* no cluster key (every node must run --insecure too) */
    const char *key_file;   /* NULL: $CUMULO_KEY_FILE or ~/.config/cumulo/cluster.key */
    const char *layers;     /* layers per stage, this machine first ("2,1,2"); NULL: the planner's */
    int n_seq;              /* sequences the cluster serves at once; 0 = 8 */
    void (*log)(void *ctx, const char *line); /* cluster progress: links, plan, weights */
    void *log_ctx;
} cm_engine_opts;

/* Load a GGUF model. Errors (one line, naming the file/tensor/arch/type):
 * CM_ENOENT "cannot open 'x.gguf': no such file", CM_EFORMAT, CM_EUNSUPPORTED,
 * CM_ENOMEM. opts may be NULL for defaults. */
int cm_engine_load(cm_engine **out, const char *path, const cm_engine_opts *opts, char *err, size_t errlen);
void cm_engine_free(cm_engine *e); /* NULL is a no-op */

typedef struct cm_engine_info {
    const char *arch;        /* "llama", "qwen2", "qwen3" */
    const char *name;        /* general.name or the file name */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int n_ctx_train;         /* the model's context length */
    int n_ctx;               /* sessions' default context */
    int n_threads;
    uint64_t n_params;       /* weight elements */
    uint64_t weight_bytes;   /* bytes of weights (mmapped) */
    uint64_t file_bytes;
    uint64_t kv_bytes_per_token; /* KV cache bytes per position of one sequence */
    int32_t bos, eos, eot;   /* -1 when the vocabulary has none */
    bool add_bos;            /* tokenizer.ggml.add_bos_token */
    int n_stages;            /* pipeline stages (1: this machine alone) */
    int local_layers;        /* layers computed on this machine */
} cm_engine_info;
void cm_engine_get_info(const cm_engine *e, cm_engine_info *info);

/* The cluster plan as text, or NULL when the engine runs on this machine. */
const char *cm_engine_plan(const cm_engine *e);
/* Traffic on the first pipeline hop (this machine -> stage 1): bytes of
 * FORWARD frames, their count, and the hidden-state rows (tokens) carried.
 * Returns false on a single-machine engine. */
bool cm_engine_hop_stats(const cm_engine *e, uint64_t *bytes, uint64_t *frames, uint64_t *rows);

/* Quant mix: for each tensor type present, the count and bytes of tensors.
 * Fills up to max entries; returns the number of distinct types. */
typedef struct cm_type_usage {
    const char *type; /* "q8_0" */
    int n_tensors;
    uint64_t bytes;
    uint64_t n_elements;
} cm_type_usage;
int cm_engine_type_usage(const cm_engine *e, cm_type_usage *out, int max);

/* Tokenize text (add_bos: prepend BOS when the vocabulary wants one;
 * parse_special: "<|im_end|>" etc. become their special ids). Writes at most
 * max ids; returns the count needed (may exceed max: call again with more
 * room) or a negative error code. */
int cm_engine_tokenize(const cm_engine *e, const char *text, size_t len, bool add_bos, bool parse_special,
                       int32_t *out, int max, char *err, size_t errlen);
/* The bytes of one token (may be a partial UTF-8 sequence); returns the
 * length written (at most cap) or a negative code. */
int cm_engine_token_piece(const cm_engine *e, int32_t id, char *buf, size_t cap);

/* ---- sessions ---- */

typedef struct cm_gen_params {
    int n_predict;                 /* most tokens to generate; <= 0: until EOG or the context is full */
    cm_sampler_params sampling;    /* see sampler.h; cm_sampler_params_default() */
    const char *const *stops;      /* stop strings (not included in the output) */
    int n_stops;
    bool ignore_eos;               /* keep going past EOS/EOT */
} cm_gen_params;
void cm_gen_params_default(cm_gen_params *p); /* n_predict 128, sampler defaults, no stops */

enum cm_finish { CM_FINISH_LENGTH, CM_FINISH_EOG, CM_FINISH_STOP, CM_FINISH_CANCEL, CM_FINISH_CTX, CM_FINISH_COUNT };
const char *cm_finish_name(enum cm_finish f); /* "length", "eog", "stop", "cancel", "ctx" */

typedef struct cm_timings {
    int n_prompt;      /* prompt tokens evaluated (after prefix reuse) */
    double prompt_s;
    int n_gen;         /* tokens generated */
    double gen_s;
} cm_timings;

typedef struct cm_gen_result {
    enum cm_finish finish;
    cm_timings t;
    int stop_index;    /* which stop string matched, or -1 */
} cm_gen_result;

/* Streams generated text: called with each token id and the text that is
 * now safe to show (whole UTF-8 characters, stop strings held back; may be
 * empty), and at the end with id -1 for text still held back. The EOG token
 * itself is not reported. Return non-zero to stop (finish = cancel). */
typedef int (*cm_token_cb)(void *user, int32_t id, const char *text, size_t len);

/* A session of n_ctx positions (0 = the engine's default). */
cm_session *cm_session_new(cm_engine *e, int n_ctx, char *err, size_t errlen);
void cm_session_free(cm_session *s); /* NULL is a no-op */
int cm_session_n_ctx(const cm_session *s);
int cm_session_n_past(const cm_session *s);
/* The session's tokens so far (prompt + generated); valid until the next call. */
const int32_t *cm_session_tokens(const cm_session *s, int *n);

/* Make the session's sequence equal to ids[0..n): keeps the longest common
 * prefix with what is already in the KV cache (prefix reuse), evaluates the
 * rest and leaves the logits of the last token ready for generation.
 * CM_ENOSPACE "prompt of 600 tokens does not fit the context of 512" when
 * n > n_ctx; CM_ECANCELED when canceled. */
int cm_session_set_prompt(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen);
/* Append tokens (e.g. the next user turn in a chat) and evaluate them,
 * together with the last generated token if it was not evaluated yet. */
int cm_session_append(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen);

/* Generate after set_prompt/append (or again, to continue): sample, stream through cb, stop at EOG,
 * a stop string, n_predict tokens, a full context or cancel. The sampler is
 * (re)made from p->sampling for each call. Returns 0 (see res->finish) or an
 * error code. */
int cm_session_generate(cm_session *s, const cm_gen_params *p, cm_token_cb cb, void *user, cm_gen_result *res,
                        char *err, size_t errlen);

/* Ask a running set_prompt/append/generate to stop at the next token (or
 * prompt chunk). Thread-safe, async-signal-safe. Cleared when the next
 * set_prompt/append/generate starts, so a cancel that arrives between calls
 * is forgotten. */
void cm_session_cancel(cm_session *s);

/* Timings of the last set_prompt/append + generate. */
cm_timings cm_session_timings(const cm_session *s);

#endif
