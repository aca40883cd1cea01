/*
 * engine: the inference facade. An engine is a loaded model (GGUF read into
 * huge-page memory, or mapped +
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
 * Memory: the weights stay where the load put them (cm_engine_weights_in_memory);
 * a session allocates its KV cache,
 * sampler and scratch when created; generating allocates nothing per token.
 */
#ifndef CM_ENGINE_H
#define CM_ENGINE_H

#include "../base/base.h"
#include "../sampler/sampler.h"
#include "../cluster/member.h"
#include "../sched/plan.h"
#include "../tokenizer/chat.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cm_engine cm_engine;
typedef struct cm_session cm_session;

/* Called while the file is mapped and read (done == total at the end). */
typedef void (*cm_engine_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct cm_engine_opts {
    int n_threads; /* compute threads; 0 = all online CPUs */
    int n_ctx;     /* default context of sessions; 0 = the model's, capped at 4096 */
    int n_batch;   /* most prompt tokens per forward pass; 0 = 64 (--parallel tp: CM_BATCH_MAX) */
    bool kv_f16;   /* sessions keep an F16 KV cache (half the memory; llama.cpp's default) */
    /* KV cache element types (llama.cpp's -ctk/-ctv): F32 (zero), F16, Q8_0,
     * Q4_0; F32 for both with kv_f16 means F16 for both. A quantized type or
     * different K and V types keep K and V as rows attended by tiled
     * attention with an online softmax (model/attn.c), as llama.cpp needs
     * flash attention for them; so do F32 and F16 by default (no 32 MiB
     * transposed V per slot committed at the first token, attention ~2/3 of
     * its cost in a batched decode step). kv_transposed: F32/F16 with V
     * transposed and the two-pass softmax instead (ggml's non-flash layout
     * and order; -fa off), which deepseek2's latent cache always uses. */
    int kv_type_k, kv_type_v; /* enum cm_type values (tensor.h) */
    bool kv_transposed;
    cm_engine_progress_fn progress; /* NULL: no progress (pages load lazily) */
    bool mmap;                      /* keep the weights in a file mapping (lazy 4 KiB pages) even when they fit in
                          * memory; default (and CUMULO_MMAP unset): a model run on this machine alone is
                          * read into huge-page memory when it fits (cm_engine_weights_in_memory) */
    void *progress_ctx;
    /* Cluster, pipeline parallel (NULL nodes: this machine only). This
     * machine computes the first stage; the nodes the rest, the last one
     * samples. "auto" finds nodes by mDNS; else "host:port,host:port,...". */
    const char *nodes;
    bool insecure;        /* no cluster key (every node must run --insecure too) */
    const char *key_file; /* NULL: $CUMULO_KEY_FILE or ~/.config/cumulo/cluster.key */
    int n_seq;            /* sequences the cluster serves at once; 0 = 8 */
    cm_plan_request plan; /* the plan's shape: PP, TP (one group of every machine: this one is rank 0, computes
                             * every layer on its slice and samples), HYBRID (groups as stages) or AUTO; a layer
                             * split, members per stage, relative speeds. Zero: the planner's pipeline. Parsed
                             * by the caller (cumulo: --parallel, --layers, --groups, --tp-weights) */
    bool tp_compress;     /* tensor-parallel all-reduces travel as 8-bit Q8_0 blocks */
    bool take;            /* --take: use nodes that serve another coordinator (cm_pipe_opts.take) */
    void (*log)(void *ctx, const char *line); /* cluster progress: links, plan, weights */
    void *log_ctx;
    /* LoRA adapters applied to every forward pass, each "FILE.gguf[:SCALE]"
     * (llama.cpp's adapter GGUF; several are summed; model/lora.h). With
     * nodes, every stage applies its layers' parts (cluster/coord_lora.c). */
    const char *const *loras;
    int n_loras;
    /* A Vulkan GPU for the first layers (engine_gpu.c, src/gpu): "auto",
     * "vulkan" (any device, a CPU driver too), "N" or "none"; NULL: $CUMULO_GPU,
     * else "auto" when gpu_layers > 0, else none. gpu_layers: how many of the
     * first layers (0: all). A device
     * or driver that is missing, or a model it cannot run, is one warning
     * and the CPU does everything. */
    const char *gpu;
    int gpu_layers;
} cm_engine_opts;

/* Load a GGUF model. Errors (one line, naming the file/tensor/arch/type):
 * CM_ENOENT "cannot open 'x.gguf': no such file", CM_EFORMAT, CM_EUNSUPPORTED,
 * CM_ENOMEM. opts may be NULL for defaults. */
int cm_engine_load(cm_engine **out, const char *path, const cm_engine_opts *opts, char *err, size_t errlen);
void cm_engine_free(cm_engine *e); /* NULL is a no-op */
/* The GPU that computes the first layers ("llvmpipe (LLVM 15.0.6, 256
 * bits)") and how many, or NULL and 0 when the CPU does all. */
const char *cm_engine_gpu_device(const cm_engine *e, int *layers);
/* Batches the device took and declined (the CPU computed them) since its
 * current upload (a re-formed group's slice: since then); false: no device. */
bool cm_engine_gpu_batches(const cm_engine *e, uint64_t *took, uint64_t *declined);
/* Device bytes of an average layer with one sequence of n_ctx positions in
 * this engine's KV cache types (weights and the cache as the device holds
 * them: cm_gpu_layer_bytes_kv), for `cumulo info`'s "layers fit". */
uint64_t cm_engine_gpu_layer_bytes(const cm_engine *e, int n_ctx);
/* Whether cm_engine_load reads a file of file_bytes into memory rather than
 * mapping it: not with opts->mmap, not in a pipeline or hybrid cluster (this
 * machine reads only its layers of the file; a `--parallel tp` group reads a
 * slice of every layer, so it is read in), else cm_gguf_worth_loading. */
bool cm_engine_weights_in_memory(const cm_engine_opts *opts, uint64_t file_bytes);

typedef struct cm_engine_info {
    const char *arch; /* "llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe" */
    const char *name; /* general.name or the file name */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int n_ctx_train; /* the model's context length */
    int n_ctx;       /* sessions' default context */
    int n_threads;
    uint64_t n_params;      /* weight elements */
    uint64_t weight_bytes;  /* bytes of weights */
    bool weights_in_memory; /* read into huge-page memory (else mapped from the file) */
    uint64_t file_bytes;
    uint64_t kv_bytes_per_token;           /* KV cache bytes per position of one sequence (K and V in their types) */
    const char *kv_type_k, *kv_type_v;     /* "f32", "f16", "q8_0", "q4_0" (static strings) */
    int32_t bos, eos, eot;                 /* -1 when the vocabulary has none */
    bool add_bos;                          /* tokenizer.ggml.add_bos_token */
    int n_stages;                          /* pipeline stages (1: this machine alone) */
    int local_layers;                      /* layers computed on this machine */
    int tp_size;                           /* tensor-parallel group size (1: none) */
    int n_expert, n_expert_used, n_ff_exp; /* mixture of experts (0: dense) */
    uint64_t n_params_active, weight_bytes_active; /* what one token reads (= the totals when dense) */
    int pass_rows_fast; /* rows of a forward pass up to which the batched-decode kernels take the FFN's
                         * weights (their small-batch gemm over repacked rows; past it the prefill gemm,
                         * slower per row at 33-64 rows); 0: no such bound for this model's types */
} cm_engine_info;
void cm_engine_get_info(const cm_engine *e, cm_engine_info *info);

/* The cluster plan as text, or NULL when the engine runs on this machine. */
const char *cm_engine_plan(const cm_engine *e);
/* Cluster upkeep while idle: call only when no session of e is evaluating
 * or generating (serve's scheduler does, about every second with nothing in
 * flight). Nodes that were lost and answer again (and, with --nodes auto,
 * new ones found by mDNS) are taken with a re-plan when the planner
 * predicts it is not worse (cm_pipe_maintain; pipelines and TP groups); a
 * cluster that could not continue becomes usable again. Returns 1 when the
 * plan changed, 0 when not (always on one machine), or an error. */
int cm_engine_maintain(cm_engine *e, char *err, size_t errlen);
/* Traffic on the first pipeline hop (this machine -> stage 1): bytes of
 * FORWARD frames, their count, and the hidden-state rows (tokens) carried.
 * Returns false on a single-machine engine. */
bool cm_engine_hop_stats(const cm_engine *e, uint64_t *bytes, uint64_t *frames, uint64_t *rows);
/* Mixture of experts: (token, slot) assignments routed to each expert so far,
 * all MoE layers summed (model.h's cm_ctx_expert_hits; what --expert-load
 * takes): this machine's, and in a cluster also those the later stages
 * reported (EXPERT_LOAD), so every layer is counted. Copies min(n, n_expert);
 * returns n_expert (0: dense). */
int cm_engine_expert_hits(const cm_engine *e, uint64_t *hits, int n);
/* The same for layer il alone (0 for a layer nobody counted yet).
 * Both: any thread, also while sessions run. */
int cm_engine_expert_hits_layer(const cm_engine *e, int il, uint64_t *hits, int n);
/* A cluster engine's expert routing: where its counts come from (measured
 * while serving, given, uniform), re-plans they made, its expert exchange
 * (cluster/member.h). False on one machine. Any thread. */
typedef cm_cluster_experts cm_engine_experts;
bool cm_engine_expert_info(const cm_engine *e, cm_engine_experts *out);
/* Tensor parallel: this machine's all-reduce traffic (element bytes, whole
 * frames' bytes), all-reduce operations, and token rows evaluated. False
 * without a TP group. */
bool cm_engine_tp_stats(const cm_engine *e, uint64_t *data_sent, uint64_t *wire_sent, uint64_t *ops, uint64_t *rows);

/* The machines of a cluster engine as the coordinator knows them, stage
 * order (the dashboard's topology). Facts of remote machines are from their
 * HELLO when they connected; rtt_s/bw are this machine's measured link to
 * them (0 for this machine). */
typedef cm_cluster_member cm_engine_member; /* cluster/member.h */
/* Fills up to max entries; returns the count (0 on a single-machine engine). */
int cm_engine_members(const cm_engine *e, cm_engine_member *out, int max);

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
int cm_engine_tokenize(const cm_engine *e, const char *text, size_t len, bool add_bos, bool parse_special, int32_t *out,
                       int max, char *err, size_t errlen);
/* The bytes of one token (may be a partial UTF-8 sequence); returns the
 * length written (at most cap) or a negative code. */
int cm_engine_token_piece(const cm_engine *e, int32_t id, char *buf, size_t cap);

/* Render a conversation (cm_chat_msg from tokenizer/chat.h: role + content)
 * with the model's tokenizer.chat_template, or with the named family when
 * template_name is non-NULL ("chatml", "llama3", ...). Appends the prompt
 * text to out; tokenize it with add_bos = true and parse_special = true (the
 * text never repeats a BOS the tokenizer adds). CM_EUNSUPPORTED when the
 * model has no template or an unrecognised one (the message lists the names
 * --chat-template accepts). */
int cm_engine_chat_render(const cm_engine *e, const char *template_name, const cm_chat_msg *msgs, size_t n,
                          bool add_generation_prompt, cm_buf *out, char *err, size_t errlen);

/* ---- embeddings (embed.c) ---- */

/* How the rows of a sequence become one vector: the mean of every row, the
 * first row (CLS), or the last row. */
enum cm_pooling { CM_POOLING_MEAN, CM_POOLING_CLS, CM_POOLING_LAST, CM_POOLING_COUNT };
const char *cm_pooling_name(enum cm_pooling p); /* "mean", "cls", "last" */
/* The pooling the GGUF declares ("<arch>.pooling_type" 1 mean, 2 cls, 3 last;
 * *declared true), else mean (*declared false; declared may be NULL). */
enum cm_pooling cm_engine_pooling(const cm_engine *e, bool *declared);
/* The embedding of ids[0..n) (exactly these ids: the caller adds BOS): the
 * final hidden state after the model's output norm, pooled, L2-normalised
 * when normalize; out has n_embd floats. Allocates its own KV cache for the
 * call; forward passes share the engine lock with sessions, so any thread
 * may call it while others generate. CM_EUNSUPPORTED on a cluster engine
 * (the last stage holds the final hidden state), CM_ENOSPACE when n exceeds
 * the engine's largest context, CM_EINVAL for an id out of the vocabulary. */
int cm_engine_embed(cm_engine *e, const int32_t *ids, int n, enum cm_pooling pooling, bool normalize, float *out,
                    char *err, size_t errlen);

/* The chat family (enum cm_chat_family, >= 0) cm_engine_chat_render uses
 * with this template_name, or a negative code. */
int cm_engine_chat_family(const cm_engine *e, const char *template_name, char *err, size_t errlen);

/* ---- sessions ---- */

typedef struct cm_gen_params {
    int n_predict;              /* most tokens to generate; <= 0: until EOG or the context is full */
    cm_sampler_params sampling; /* see sampler.h; cm_sampler_params_default() */
    const char *const *stops;   /* stop strings (not included in the output) */
    int n_stops;
    bool ignore_eos;                  /* keep going past EOS/EOT */
    const struct cm_grammar *grammar; /* NULL, or only text this grammar allows (sampler/grammar.h; the
                                    * caller keeps it alive until the session finishes); CM_EUNSUPPORTED
                                    * from cm_session_start on a pipeline cluster */
    bool skip_logprobs;               /* nobody reads cm_token_event.info (NULL then): no softmax over the
                                       * vocabulary per token; the tokens are the same either way */
} cm_gen_params;
void cm_gen_params_default(cm_gen_params *p); /* n_predict 128, sampler defaults, no stops */

enum cm_finish { CM_FINISH_LENGTH, CM_FINISH_EOG, CM_FINISH_STOP, CM_FINISH_CANCEL, CM_FINISH_CTX, CM_FINISH_COUNT };
const char *cm_finish_name(enum cm_finish f); /* "length", "eog", "stop", "cancel", "ctx" */

typedef struct cm_timings {
    int n_prompt; /* prompt tokens evaluated (after prefix reuse) */
    double prompt_s;
    int n_gen; /* tokens generated */
    double gen_s;
} cm_timings;

typedef struct cm_gen_result {
    enum cm_finish finish;
    cm_timings t;
    int stop_index; /* which stop string matched, or -1 */
} cm_gen_result;

/* One step of a generation, as the callback sees it. */
typedef struct cm_token_event {
    int32_t id;       /* the token sampled; -1 for the final flush of held-back text */
    const char *text; /* text now safe to show: whole UTF-8 characters, stop strings held
                                 * back; may be empty, and may belong to earlier tokens */
    size_t len;
    const cm_sample_info *info; /* logprob of id and, when sampling.n_probs > 0, the top
                                 * alternatives (sampler.h); NULL for the flush */
} cm_token_event;
/* Called for every generated token and once at the end (id -1) when text
 * was still held back. The EOG token itself is not reported. Return non-zero
 * to stop (finish = cancel). Runs on the generating thread. */
typedef int (*cm_token_cb)(void *user, const cm_token_event *ev);

/* A session of n_ctx positions (0 = the engine's default). */
cm_session *cm_session_new(cm_engine *e, int n_ctx, char *err, size_t errlen);
void cm_session_free(cm_session *s); /* NULL is a no-op */
int cm_session_n_ctx(const cm_session *s);
int cm_session_n_past(const cm_session *s);
/* The session's tokens so far (prompt + generated); valid until the next call. */
const int32_t *cm_session_tokens(const cm_session *s, int *n);
/* KV memory (paged: committed as positions are written, model.h kv_mem):
 * the bytes the session's cache occupies when it holds n positions (n < 0:
 * the ones it holds now), page rounding included; cm_session_kv_drop forgets
 * the cached tokens and gives their memory back (session_kv.c). */
uint64_t cm_session_kv_bytes(const cm_session *s, int n);
void cm_session_kv_drop(cm_session *s);
/* The KV pool (model.h cm_kv_rewind): a new prompt keeping a shorter prefix
 * and cm_session_kv_forget (the cached tokens forgotten) keep the pages past
 * the positions kept committed, so the next sequence reuses them without
 * first-touch page faults; cm_session_kv_pooled: their bytes (not in
 * cm_session_kv_bytes(s, -1)); cm_session_kv_trim_pool gives them back
 * (cm_session_kv_drop gives back everything). Between passes only. */
void cm_session_kv_forget(cm_session *s);
uint64_t cm_session_kv_pooled(const cm_session *s);
void cm_session_kv_trim_pool(cm_session *s);
/* Shared prefix blocks (session_share.c, model.h kv_blocks): of
 * cm_session_kv_bytes(s, n), the bytes that are not a shared store's (what
 * this session alone costs); the bytes of whole pages a share of n positions
 * would map (by layout); the store's own bytes, to be counted once over all
 * sessions mapping it (*id names it; NULL: none). */
uint64_t cm_session_kv_private(const cm_session *s, int n);
uint64_t cm_session_kv_shareable(const cm_session *s, int n);
uint64_t cm_session_kv_store(const cm_session *s, const void **id);

/* Make the session's sequence equal to ids[0..n): keeps the longest common
 * prefix with what is already in the KV cache (prefix reuse), evaluates the
 * rest and leaves the logits of the last token ready for generation.
 * CM_ENOSPACE "prompt of 600 tokens does not fit the context of 512" when
 * n > n_ctx; CM_ECANCELED when canceled. */
int cm_session_set_prompt(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen);
/* Chunked prefill (serve's scheduler interleaves the chunks with decode
 * steps of other sessions): cm_session_prompt_begin makes the sequence
 * ids[0..n) as set_prompt does (same checks, prefix reuse) but evaluates
 * nothing; each cm_session_prompt_step then evaluates at most max_tokens
 * more (<= 0: all) and returns how many are left (0: done, the logits of the
 * last token ready as after set_prompt) or an error (CM_ECANCELED when
 * canceled). set_prompt is begin + one step of all: the same bits whatever
 * the chunking (batch invariance); timings add up over the steps. */
int cm_session_prompt_begin(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen);
int cm_session_prompt_step(cm_session *s, int max_tokens, char *err, size_t errlen);
/* Shared prompt prefixes: make dst's sequence start with the first n tokens
 * of src's (n at most what src has evaluated), copying their KV cache rows,
 * so that a following prompt_begin/set_prompt whose ids start with them
 * evaluates only the rest. Both sessions of one engine on this machine alone
 * (CM_EUNSUPPORTED on a cluster: the other stages hold their own caches);
 * neither may be in a forward pass meanwhile. The bits of what follows are
 * the same as if dst had evaluated the prefix itself (batch invariance). */
int cm_session_copy_prefix(cm_session *dst, const cm_session *src, int n, char *err, size_t errlen);
/* The same, but the prefix's KV pages are shared copy-on-write by dst and
 * src (one physical copy however many sessions take it; model.h kv_blocks),
 * copied where they cannot be. Same conditions, same bits; src's cache is
 * remapped (not changed) on its first share. */
int cm_session_share_prefix(cm_session *dst, cm_session *src, int n, char *err, size_t errlen);
/* Append tokens (e.g. the next user turn in a chat) and evaluate them,
 * together with the last generated token if it was not evaluated yet. */
int cm_session_append(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen);

/* Generate after set_prompt/append (or again, to continue): sample, stream through cb, stop at EOG,
 * a stop string, n_predict tokens, a full context or cancel. The sampler is
 * (re)made from p->sampling for each call. Returns 0 (see res->finish) or an
 * error code. It is cm_session_start + cm_engine_step on this session alone
 * + cm_session_finish (below), so its text is the batched one by
 * construction. */
int cm_session_generate(cm_session *s, const cm_gen_params *p, cm_token_cb cb, void *user, cm_gen_result *res,
                        char *err, size_t errlen);

/* Ask a running set_prompt/append/generate to stop at the next token (or
 * prompt chunk). Thread-safe, async-signal-safe. Cleared when the next
 * set_prompt/append/generate starts, so a cancel that arrives between calls
 * is forgotten. */
void cm_session_cancel(cm_session *s);

/* Timings of the last set_prompt/append + generate. */
cm_timings cm_session_timings(const cm_session *s);

/* ---- LoRA adapters per sequence (engine_lora.c; llama-server's /lora-adapters) ----
 *
 * The adapters of cm_engine_opts.loras, ids 0.. in that order. Each session
 * has a user scale per adapter (0: off), starting from the engine's
 * defaults (the FILE:SCALE values until cm_engine_lora_set_defaults);
 * sessions with different scales share batched forward passes, each row
 * with the bits it gets alone (batch invariance). On a cluster the scales
 * stay those loaded (CM_EUNSUPPORTED). */
int cm_engine_lora_count(const cm_engine *e);
const char *cm_engine_lora_path(const cm_engine *e, int i); /* the file; NULL for a bad i */
/* The default scales (n at most cm_engine_lora_count); any thread. */
void cm_engine_lora_defaults(cm_engine *e, float *scales, int n);
/* Would these n scales be accepted (n = the count, finite, |s| < 1e6; a
 * cluster: the loaded ones)? 0 or CM_EINVAL / CM_EUNSUPPORTED + message. */
int cm_engine_lora_check(const cm_engine *e, const float *scales, int n, char *err, size_t errlen);
/* Set the defaults of sessions made (and requests parsed) from now on. Any thread. */
int cm_engine_lora_set_defaults(cm_engine *e, const float *scales, int n, char *err, size_t errlen);
/* The session's scales for what it evaluates from now on (checked as
 * cm_engine_lora_check). When they differ from its current ones its cached
 * tokens are forgotten (cm_session_kv_forget): a KV cache computed with one
 * adapter set is never reused with another. Not during a forward pass of s. */
int cm_session_set_lora(cm_session *s, const float *scales, int n, char *err, size_t errlen);
const float *cm_session_lora(const cm_session *s, int *n); /* its scales (*n = the count; NULL when none) */
/* How many of ids[0..n) the session's KV cache holds, as prefix reuse for a
 * sequence with these adapter scales would keep them: 0 when the scales are
 * not the session's (scales NULL / n_scales 0: an engine without adapters). */
int cm_session_cached_prefix(const cm_session *s, const int32_t *ids, int n, const float *scales, int n_scales);
/* Do two sessions have the same scales (so one may take the other's prefix)? */
bool cm_session_lora_same(const cm_session *a, const cm_session *b);

/* ---- several sessions generating together (batch.c) ----
 *
 * Continuous batching: each session that is generating samples its next token
 * and all of them are evaluated in ONE forward pass (one row per sequence);
 * sessions may start and finish between steps; at most n_batch sequences
 * share one forward pass (more take several passes of the same step).
 *
 * Same output alone or in a crowd: a session's text equals what
 * cm_session_generate gives for the same prompt and parameters WHEN every
 * forward pass computes each row with the same bits whatever the number of
 * rows. The kernels promise exactly that (kernels.h: every gemm result is
 * bit-identical to vec_dot for any token count and position), so an engine
 * is batch-invariant whatever its n_batch: prompts, prefix reuse and batched
 * decode alike.
 *
 * Use: cm_session_set_prompt (prefill), then cm_session_start; then call
 * cm_engine_step with every running session until cm_session_running is false
 * for each; then cm_session_finish for its result. cm_session_generate is
 * exactly that for one session (the only generation loop). A session is
 * stepped by one thread at a time; several threads may step sessions of one
 * engine at once; cm_session_cancel from any thread
 * ends a session at its next step with finish = cancel. */

/* Begin generating on a session whose prompt was just evaluated. Allocates
 * the sampler and stop matcher (per request, not per token). CM_ESTATE when
 * no logits are ready; CM_EINVAL for bad parameters. */
/* The callback is cm_session_generate's (cm_token_cb, with the token's
 * logprobs in ev->info); it runs inside cm_engine_step; returning non-zero
 * ends that session (finish = cancel). */
int cm_session_start(cm_session *s, const cm_gen_params *p, cm_token_cb cb, void *user, char *err, size_t errlen);
bool cm_session_running(const cm_session *s);
/* One step for ss[0..n) (sessions that are not running are skipped): sample,
 * stream, and evaluate every new token together. Returns the number of
 * sessions still running, or an error code (then every session of the step
 * has stopped). */
int cm_engine_step(cm_engine *e, cm_session *const *ss, int n, char *err, size_t errlen);
/* cm_engine_step with a prompt chunk riding along (serve's mixed passes): up
 * to max_tokens of pre's pending prompt (cm_session_prompt_begin) go into
 * the step's last forward pass after the decode rows, so the weights are
 * read once for both; the bits of every row are what they are apart (the
 * kernels are batch-invariant). *pre_done: the prompt tokens evaluated (0
 * when the pass had no room, or on a cluster: then none), or pre's error
 * code (< 0, its message in err when the step returns >= 0). The prompt is
 * done when cm_session_n_past reaches its length (cm_session_start may
 * follow). */
int cm_engine_step_prefill(cm_engine *e, cm_session *const *ss, int n, cm_session *pre, int max_tokens, int *pre_done,
                           char *err, size_t errlen);
/* The same with several pending prompts pre[0..n_pre) (in that order: the
 * first gets its chunk first): max_tokens in all go into the pass, so the
 * decode step waits for at most max_tokens prompt rows however many prompts
 * ride; pre_done[k] as *pre_done for pre[k]. */
/* Interjections (serve's time to first token under load): fn is called on
 * the stepping thread between two layers of every forward pass of
 * cm_engine_step*, the pass paused; there it may evaluate newly arrived
 * short prompts whole with cm_engine_interject_prompts (a pass of their own
 * on a context of max_tokens rows, made here) and stream their first
 * tokens (cm_session_first_token), so a short request waits for one layer
 * of the pass in flight instead of all of it, and rides no decode rows. The
 * paused pass goes on unchanged (other sequences, its own scratch): every
 * row keeps its bits. Only on one machine, on the CPU, without adapters:
 * returns false (and sets nothing) otherwise. fn NULL: none. Not
 * thread-safe: set before stepping. */
typedef void (*cm_engine_interject_fn)(void *user);
bool cm_engine_set_interject(cm_engine *e, cm_engine_interject_fn fn, void *user, int max_tokens);
/* Only inside fn: the pending prompts of pre[0..n_pre) (cm_session_prompt_begin
 * done) evaluated whole in one pass, in order, while they fit max_tokens
 * rows in all. Returns how many (the first ones) were evaluated (each then
 * has its logits: cm_session_start may follow), or an error code (none
 * evaluated). */
int cm_engine_interject_prompts(cm_engine *e, cm_session *const *pre, int n_pre, char *err, size_t errlen);
uint64_t cm_engine_interjected(const cm_engine *e); /* prompts evaluated by interjection so far */
/* Right after cm_session_start: sample and stream the first token now
 * rather than at the next step (which then evaluates it without sampling
 * again). Returns 1 when the session goes on, 0 when that token ended it,
 * or an error code (it ended). */
int cm_session_first_token(cm_session *s);
int cm_engine_step_prefill_many(cm_engine *e, cm_session *const *ss, int n, cm_session *const *pre, int n_pre,
                                int max_tokens, int *pre_done, char *err, size_t errlen);
/* The result of a session that is no longer running; frees its step state.
 * CM_ESTATE if it never started or is still running. */
int cm_session_finish(cm_session *s, cm_gen_result *res);

#endif
