/*
 * engine_impl.h: the engine's private structs, shared by engine.c (loading,
 * sessions, one-sequence generation) and batch.c (several sessions stepping
 * together). Nothing outside src/engine/ includes this file; the public
 * surface is engine.h.
 */
#ifndef CM_ENGINE_IMPL_H
#define CM_ENGINE_IMPL_H

#include "engine.h"

#include "../cluster/cluster.h"
#include "../gguf/gguf.h"
#include "../model/lora.h"
#include "../model/model.h"
#include "../os/os.h"
#include "../tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>

struct cm_engine {
    cm_gguf g;
    cm_model m;
    cm_tokenizer *tok;
    cm_pool *pool;
    cm_ctx *ctx;
    cm_lora *lora;    /* adapters (cm_engine_opts.loras), or NULL */
    char **lora_path; /* [cm_lora_count]: each adapter's file (GET /lora-adapters) */
    float *lora_def;  /* [cm_lora_count]: default user scales of new requests/sessions (under lora_mu) */
    pthread_mutex_t lora_mu;
    struct cm_gpu *gpu; /* engine_gpu.c: the device and the layers on it, or NULL */
    struct cm_gpu_model *gpu_m;
    pthread_mutex_t mu;
    int n_ctx, n_batch, max_ctx;
    bool kv_f16;
    enum cm_type kv_k, kv_v; /* the sessions' KV cache types (cm_engine_opts) */
    bool kv_rows;
    char *name;
    float *step_logits;             /* [n_batch][n_vocab] for cm_engine_step; made on its first call (batch.c) */
    cm_pipe *cl;                    /* the cluster, whatever the plan's shape (stage 0 is ours); NULL on one machine */
    int local_last;                 /* we compute layers [0, local_last) */
    cm_slice slice;                 /* our part of every layer when we sample: full, or our group's slice */
    void *gvocab;                   /* constrain.c: token texts for grammar masks, built on first use (under mu) */
    unsigned test_cluster_delay_ms; /* test hook (CUMULO_TEST_CLUSTER_DELAY_MS): a pause after each
                                       micro-batch sent to the cluster, so a test can kill a stage
                                       mid-prefill or mid-generation of `cumulo run` */
    /* batch.c interjections (cm_engine_set_interject): the caller's function,
     * a context of ij_max rows of its own and logits for ij_max prompts */
    cm_engine_interject_fn ij_fn;
    void *ij_user;
    int ij_max;
    cm_ctx *ij_ctx;
    float *ij_logits;
    bool ij_in;           /* inside ij_fn (between two layers of a pass) */
    uint64_t ij_prompts;  /* prompts evaluated by interjection */
    unsigned ij_delay_ms; /* test hook (CUMULO_TEST_LAYER_DELAY_MS): a pause between layers of a step's pass */
};

/* The one question the engine asks about the cluster's shape (stage 0's
 * contract, cluster.h cm_pipe_samples_here; fixed for the pipe's life): does
 * a last stage elsewhere sample? Then our layers' output goes on
 * (cm_pipe_send), tokens come back (cm_pipe_recv_token), a session's last
 * token stays pending until its sample, and our slice is read from the plan
 * (cm_engine_slice). False on one machine and when this machine samples
 * (every layer here; a group met through cm_pipe_stage0 in cm_engine_forward). */
static inline bool cm_engine_downstream(const cm_engine *e) { return e->cl && !cm_pipe_samples_here(e->cl); }

struct cm_step; /* batch.c: generation state of a session in step mode */

struct cm_session {
    cm_engine *e;
    cm_kv kv;
    int n_ctx;
    int32_t *hist; /* [n_ctx + 1]: tokens of the sequence; the first kv.n_past are in the cache */
    int n_hist;
    float *logits; /* [n_vocab]: after the last evaluated token */
    bool have_logits;
    bool first_taken; /* batch.c: its first token was sampled by cm_session_first_token (the next step evaluates it) */
    char *piece;      /* detokenizer output, cm_detok_max_out bytes */
    size_t piece_cap;
    atomic_int cancel;
    cm_timings t;
    struct cm_step *step; /* NULL unless cm_session_start was called (batch.c) */
    int slot;             /* cluster: the sequence's slot on every stage; -1 on one machine */
    float *hidden;        /* cluster: [n_batch][n_embd] our stage's output */
    int pipe_gen;         /* cluster: cm_pipe_generation when our stage-0 cache was last valid downstream */
    float *lora;          /* [cm_lora_count(e->lora)]: the adapters' user scales of this sequence: its KV
                             cache was computed with them (cm_session_set_lora forgets it when they change) */
    float *lora_sent;     /* cluster: the scales the stages hold for our slot (SEQ_LORA; the loaded ones at first) */
    int lora_gen;         /* cluster: the pipe generation lora_sent is from (a re-plan resets the stages) */
    int inflight;         /* pipeline (batch_pipe.c): CM_PIPE_WANT_TOKEN / _LOGITS of the decode row sent and
                             not yet answered (its token is collected at the session's next step); 0: none */
    int inflight_gen;     /* pipeline: cm_pipe_generation when that row was sent (a recovery loses it) */
};

/* batch.c, for batch_pipe.c: a session's step ends (finish reason fin);
 * sample from s->logits, or take the token a last stage sampled, then
 * stream and decide: 1 when the new token must be evaluated, 0 when the
 * session finished, or an error code. */
void cm_step_end(cm_session *s, enum cm_finish fin);
int cm_step_sample(cm_session *s);
int cm_step_take(cm_session *s, int32_t id, const cm_sample_info *info);
bool cm_step_grammar(const cm_session *s);    /* its sampling is constrained (we sample, from logits) */
bool cm_step_quota_done(const cm_session *s); /* it generated its n_predict tokens */
/* batch_pipe.c: cm_engine_step on a pipeline (cm_engine_downstream). */
int cm_engine_step_pipe(cm_engine *e, cm_session *const *ss, int n, char *err, size_t errlen);
/* batch_pipe.c: wait for the answer to the session's decode row in flight,
 * if any, and drop it (before its pipe slot is released or reused). */
void cm_session_pipe_drain(cm_session *s);

/* Cluster (engine.c): evaluate hist[kv.n_past .. upto) through our layers
 * and send the hidden states on; want (proto.h's enum cm_want; true is
 * CM_PIPE_WANT_TOKEN) is what the last stage does after upto - 1: sample, send
 * the logits back, or (CM_PIPE_WANT_HIDDEN) send every row's final hidden state
 * back. On a cluster the last evaluated-or-pending token of a
 * session is pending until the next sample: have_logits means "ready to
 * sample" (n_hist == kv.n_past + 1). */
int cm_engine_eval_cluster(cm_session *s, int upto, int want, char *err, size_t errlen);
/* Embeddings on a pipeline (embed_cluster.c): the final hidden state of
 * every row of ids (before the output norm) into rows[n][n_embd]. */
int cm_engine_embed_rows_cluster(cm_engine *e, const int32_t *ids, int n, float *rows, char *err, size_t errlen);

/* Cluster, after a recovery (batch.c): a running session tells the new last
 * stage its sampler parameters, whole history and the count of tokens it
 * sampled so far (SEQ_START n_sampled: the draws go on from there); 0 and
 * nothing sent when it has not been started. */
int cm_session_seq_restart(cm_session *s, char *err, size_t errlen);
/* A forward pass over every layer (e->mu held; not downstream). With a
 * cluster (a group of every machine) the token rows go to every member first (sess[b->seq[i]]->slot names the sequence
 * there) and the pass all-reduces with them; a->slice is set to ours. */
int cm_engine_forward(cm_engine *e, const cm_batch *b, cm_forward_args *a, cm_session *const *sess, char *err,
                      size_t errlen);

/* This machine's part of every layer: full, its group's slice, or
 * (downstream) its stage's group's slice now (a re-plan may change it:
 * sessions re-shape their caches). */
cm_slice cm_engine_slice(const cm_engine *e);
/* Cluster: the top logprobs that came with the slot's latest token. */
void cm_engine_pipe_top(cm_engine *e, int slot, cm_sample_info *info);
/* A cluster where we sample, after the group was re-formed (engine.c): the
 * session gets an empty KV cache of the engine's new slice (0 when nothing
 * changed, and always 0 downstream: cm_engine_eval_cluster re-shapes). */
int cm_session_tp_sync(cm_session *s, char *err, size_t errlen);
/* Re-form a lost tensor-parallel group (cm_pipe_tp_recover) and take the new
 * slice; e->mu not held. */
int cm_engine_tp_recover(cm_engine *e, char *err, size_t errlen);
/* Evaluate what the session has not evaluated (after cm_session_tp_sync:
 * prompt + tokens emitted), logits of the last token (engine.c). */
int cm_session_recompute(cm_session *s, char *err, size_t errlen);

/* Grammar-constrained sampling (constrain.c). begin: the state for p->grammar
 * (NULL when none; CM_EUNSUPPORTED on a pipeline); mask: s->logits of the
 * tokens the grammar refuses become -inf, returns how many remain; take:
 * feed the chosen token's text. gvocab_free: by cm_engine_free. */
struct cm_grammar_state;
int cm_constrain_begin(cm_session *s, const cm_gen_params *p, struct cm_grammar_state **out, char *err, size_t errlen);
int cm_constrain_mask(cm_session *s, struct cm_grammar_state *gs);
int cm_constrain_take(cm_session *s, struct cm_grammar_state *gs, int32_t id);
void cm_engine_gvocab_free(cm_engine *e);
/* Load o->loras into e->lora and hand them to e->ctx (engine_lora.c). */
int cm_engine_load_loras(cm_engine *e, const cm_engine_opts *o, char *err, size_t errlen);
void cm_engine_loras_free(cm_engine *e);
/* A new session's scales: the engine's defaults now (engine_lora.c). */
int cm_session_lora_init(cm_session *s);
/* Cluster: make the stages hold s's scales for its slot (a SEQ_LORA when
 * they differ from what they hold); before s's next FORWARD. */
int cm_session_lora_sync(cm_session *s, char *err, size_t errlen);
/* cm_engine_forward's per-sequence scales for a (engine_lora.c): sess[k]'s
 * for kvs[k], in ls (room for a->n_kvs). */
int cm_engine_lora_rows(cm_engine *e, cm_forward_args *a, cm_session *const *sess, const float **ls, int cap, char *err,
                        size_t errlen);
/* engine_gpu.c: put the first layers on the GPU o asks for (a warning and
 * none when it cannot); release it before the context goes. */
int cm_engine_gpu_attach(cm_engine *e, const cm_engine_opts *o, char *err, size_t errlen);
void cm_engine_gpu_release(cm_engine *e);
/* e->slice changed (a re-formed tensor-parallel group): upload the new slice
 * to the device, or say why not in one line and leave it to the CPU. */
void cm_engine_gpu_reslice(cm_engine *e);

/* Free a session's step state (batch.c); called by cm_session_free. */
void cm_session_step_release(cm_session *s);

#endif
