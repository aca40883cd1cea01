/*
 * model: the forward pass of the supported architectures (llama, qwen2,
 * qwen3, gemma3, phi3, and the mixture-of-experts qwen2moe, qwen3moe, gpt-oss,
 * llama with experts (Mixtral; see moe.h, gptoss.h) and deepseek2 (multi-head
 * latent attention, mla.h)) over a layer range and a tensor slice, with
 * per-sequence KV caches (deepseek2's holds the latent only).
 *
 * A cm_model is a set of cm_tensor views into a parsed GGUF (the mmap): no
 * weight is ever copied. The forward pass is written once for every way the
 * engine and the cluster run it:
 *
 *   - a BATCH of tokens, each with its position and its sequence: prefill of
 *     a prompt, one decode step, or several sequences decoding together all
 *     go through cm_forward();
 *   - a LAYER RANGE [first, last): pipeline stage k runs its layers and hands
 *     hidden states (n x n_embd floats) to stage k+1; only a stage with
 *     first == 0 embeds token ids, only a stage with last == n_layer applies
 *     the output norm and head;
 *   - a SLICE: KV heads [h0, h1) (query heads follow their KV head: query head
 *     q belongs to KV head q / (n_head / n_head_kv)) and FFN rows [f0, f1) of
 *     ffn_gate/ffn_up with the matching columns of ffn_down. attn_output and
 *     ffn_down then produce PARTIAL sums over the slice; the caller's
 *     all-reduce callback must replace them by the sum over all slices
 *     (single machine: the whole slice, callback NULL = no-op);
 *   - or, for a mixture-of-experts model, an EXPERT SLICE (expert
 *     parallelism): every layer's attention and router whole, and only the
 *     experts [e0, e1) run here (cm_expert_slice); the caller's gather callback fills in the
 *     other members' expert outputs before they are summed in the one fixed
 *     (top-k) order, so results are the bits of a single machine.
 *
 * Numerics follow ggml/llama.cpp (CPU) so that results match it: RMS norm
 * with a double sum of squares, RoPE angles by iterated multiplication with
 * theta_scale = base^(-2/n_rot) (adjacent pairs for llama, half split for
 * qwen2/qwen3), KQ scaled by 1/sqrt(head_dim), softmax with max subtraction
 * and a double sum, SiLU, activations converted to each weight type's
 * vec_dot_type (Q8_0 for Q4_0/Q8_0...) before its dot products.
 *
 * This module never includes net, proto, cluster or engine code, never opens
 * files (the caller passes a parsed cm_gguf) and never allocates in
 * cm_forward(): scratch is sized when a cm_ctx is created.
 */
#ifndef CM_MODEL_H
#define CM_MODEL_H

#include "../base/base.h"
#include "../gguf/gguf.h"
#include "../kernels/kernels.h"
#include "../kernels/tune.h"
#include "../os/os.h"
#include "../tensor/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cm_arch {
    CM_ARCH_LLAMA,
    CM_ARCH_QWEN2,
    CM_ARCH_QWEN3,
    CM_ARCH_QWEN2MOE,
    CM_ARCH_QWEN3MOE,
    CM_ARCH_GEMMA3,
    CM_ARCH_PHI3,
    CM_ARCH_GPTOSS,
    CM_ARCH_DEEPSEEK2,
    CM_ARCH_COUNT
};
enum cm_rope_type { CM_ROPE_NORM, CM_ROPE_NEOX, CM_ROPE_TYPE_COUNT };

const char *cm_arch_name_of(
    enum cm_arch a); /* "llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma3", "phi3", "gpt-oss", "deepseek2" */

/* deepseek2 (DeepSeek V2/V3/R1, Kimi K2): multi-head latent attention
 * (mla.h). Zeroed for every other architecture. */
typedef struct cm_mla_hparams {
    int q_lora;     /* <arch>.attention.q_lora_rank; 0: one attn_q (V2-Lite) */
    int kv_lora;    /* <arch>.attention.kv_lora_rank: the cached latent's width */
    int head_k;     /* nope + rope dims of a query head (key_length_mla, or key_length of a kv_b file) */
    int head_v;     /* value dims of a head (value_length_mla / value_length) */
    float kq_scale; /* softmax scale: mscale^2 / sqrt(head_k) */
    bool kv_b;      /* the file has the unsplit attn_kv_b (no *_mla keys): wk_b, wv_b derived at load */
    /* YaRN (rope.scaling.type "yarn"; ext_factor 0 = none) as ggml_rope_ext takes it */
    float ext_factor, attn_factor, beta_fast, beta_slow;
    int n_ctx_orig;
} cm_mla_hparams;

/* ---- RoPE scaling (rope.c) ----
 * What "<arch>.rope.scaling.*" asks for, read as llama.cpp reads it: the
 * type (missing: linear, as llama.cpp), factor (or the old
 * "rope.scale_linear"; 0 = none), attn_factor and original_context_length
 * for every architecture; the YaRN keys below only with the flags. */
enum cm_rope_scaling_type { CM_ROPE_SCALING_NONE, CM_ROPE_SCALING_LINEAR, CM_ROPE_SCALING_YARN, CM_ROPE_SCALING_COUNT };
enum {
    CM_ROPE_READ_YARN_PARAMS = 1u << 0,  /* yarn_ext_factor, yarn_attn_factor, yarn_beta_fast/slow (grok) */
    CM_ROPE_READ_YARN_LOG_MUL = 1u << 1, /* yarn_log_multiplier (deepseek2, mistral3) */
};
typedef struct cm_rope_scaling {
    enum cm_rope_scaling_type type;
    float factor;               /* rope.scaling.factor as stored (0: absent) */
    float freq_scale;           /* 1 / factor (linear, yarn), else 1: the interpolated angle's scale */
    int n_ctx_orig;             /* rope.scaling.original_context_length (default: context_length) */
    float ext_factor;           /* YaRN's extrapolation mix: 1 for yarn, else 0 (or the file's, with the flag) */
    float attn_factor;          /* rope.scaling.attn_factor (default 1) */
    float yarn_attn_factor;     /* rope.scaling.yarn_attn_factor (flag; default 1; used only without YaRN) */
    float beta_fast, beta_slow; /* YaRN correction range in turns (default 32, 1) */
    float log_mul;              /* rope.scaling.yarn_log_multiplier (flag; 0 = none) as the caller wants it */
    bool log_mul_is_mscale;     /* deepseek2: llama.cpp's mscale = log_mul too (callers set, then _finish) */
    /* derived by cm_rope_scaling_finish: */
    float corr_dims[2]; /* YaRN ramp from pair index corr_dims[0] (extrapolated) to [1] (interpolated) */
    float mscale;       /* cos/sin magnitude before YaRN's own 1 + 0.1 ln(1 / freq_scale) */
} cm_rope_scaling;
const char *cm_rope_scaling_name(enum cm_rope_scaling_type t); /* "none", "linear", "yarn" */
/* Read the scaling of architecture `arch` (its key prefix) for n_rot rotated
 * dimensions and base `base`; flags: CM_ROPE_READ_*. Returns 0, or
 * CM_EFORMAT / CM_EUNSUPPORTED (an unknown type such as longrope) with a message. */
int cm_rope_scaling_read(const cm_gguf *g, const char *arch, int n_ctx_train, int n_rot, float base, unsigned flags,
                         cm_rope_scaling *rs, char *err, size_t errlen);
/* Recompute the derived fields after changing the others. */
void cm_rope_scaling_finish(cm_rope_scaling *rs, int n_rot, float base);
/* cos/sin of position pos for the n_rot / 2 pairs: cache[2i] = cos, [2i+1]
 * = sin (both times the magnitude), as ggml's rope cache; rs NULL = no
 * scaling; freq_factors: Llama 3's rope_freqs (n_rot / 2) or NULL. */
void cm_rope_cache(const cm_rope_scaling *rs, int n_rot, float base, const float *freq_factors, float pos,
                   float *cache);
/* Rotate the first n_rot values of one head v by a cache row (NORM: pairs
 * (2i, 2i+1); NEOX: pairs (i, i + n_rot/2)). */
void cm_rope_apply(enum cm_rope_type type, int n_rot, const float *cache, float *v);

/* Hyperparameters, read from "<arch>.*" metadata keys. */
typedef struct cm_hparams {
    enum cm_arch arch;
    int n_vocab;                  /* rows of token_embd */
    int n_embd;                   /* <arch>.embedding_length */
    int n_layer;                  /* <arch>.block_count */
    int n_head;                   /* <arch>.attention.head_count */
    int n_head_kv;                /* <arch>.attention.head_count_kv (default n_head) */
    int head_dim;                 /* <arch>.attention.key_length (default n_embd / n_head) */
    int n_ff;                     /* <arch>.feed_forward_length (or from ffn_gate's shape) */
    int n_rot;                    /* <arch>.rope.dimension_count (default head_dim) */
    int n_ctx_train;              /* <arch>.context_length */
    float rms_eps;                /* <arch>.attention.layer_norm_rms_epsilon (default 1e-5) */
    float rope_base;              /* <arch>.rope.freq_base (default 10000) */
    float rope_freq_scale;        /* = rope_scaling.freq_scale (kept for callers that read it) */
    cm_rope_scaling rope_scaling; /* <arch>.rope.scaling.* (rope.c) */
    enum cm_rope_type rope_type;
    /* Mixture of experts (0 experts: a dense FFN). Keys "<arch>.expert_count",
     * "expert_used_count", "expert_feed_forward_length" (default n_ff /
     * n_used), "expert_shared_feed_forward_length" (qwen2moe; default n_ff). */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    bool expert_norm; /* renormalise the top-k weights to sum 1 (qwen3moe, Mixtral; not qwen2moe) */
    /* gemma3 (zero elsewhere): layers il with il % swa_pattern < swa_pattern
     * - 1 attend to the last n_swa positions only and rotate with
     * rope_base_swa; the others are global. The embeddings are scaled by
     * sqrtf(n_embd), q by attn_q_scale (softmax scale 1), and the FFN is
     * GELU(tanh)-gated. */
    int n_swa;           /* <arch>.attention.sliding_window */
    int swa_pattern;     /* <arch>.attention.sliding_window_pattern (llama.cpp's rule: 6) */
    float rope_base_swa; /* <arch>.rope.freq_base_swa (default 10000) */
    float attn_q_scale;  /* 1/sqrt(head_dim); 27B: 1/sqrt(n_embd / n_head); phi3 too; else 0 */
    /* YaRN RoPE (gpt-oss only for now, gptoss.c; ext_factor 0 = none):
     * "<arch>.rope.scaling.type" = "yarn", factor -> rope_freq_scale (also
     * on the sliding-window layers), original_context_length -> n_ctx_orig;
     * beta fast/slow 32/1 and the attention factor as llama.cpp's context
     * sets them. */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int n_ctx_orig;
    /* deepseek2's MoE (mla.c reads the keys): the first n_dense_lead layers
     * have a dense FFN; the router's gating is softmax or sigmoid
     * (expert_gating_func 2), the selection adds exp_probs_b, top-k runs
     * within the best expert_group_used_count of expert_group_count groups
     * (each scored by its top two), and the weights are scaled by
     * expert_weights_scale (0: none). n_ff_shexp = expert_shared_count *
     * n_ff_exp, an ungated shared expert. */
    int n_dense_lead, n_expert_groups, n_group_used;
    bool expert_sigmoid;
    float expert_scale;
    cm_mla_hparams mla;
} cm_hparams;

/* Is layer il a sliding-window layer? */
static inline int cm_layer_is_swa(const cm_hparams *hp, int il) {
    return hp->n_swa > 0 && hp->swa_pattern > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
}

/* One transformer block. Optional tensors have data == NULL. Shapes (ne[0]
 * = input features): wq [E, H*D], wk/wv [E, Hkv*D], wo [H*D, E],
 * gate/up [E, F], down [F, E]; norms and biases are F32 vectors. phi3's
 * fused attn_qkv [E, (H + 2 Hkv) D] and ffn_up [E, 2F] (gate rows first)
 * are bound as row views: wq/wk/wv and gate/up point into them. */
typedef struct cm_layer {
    cm_tensor attn_norm, wq, wk, wv, wo;
    cm_tensor bq, bk, bv;                    /* qwen2 */
    cm_tensor q_norm, k_norm;                /* qwen3, gemma3: [D], applied per head before RoPE */
    cm_tensor attn_post_norm, ffn_post_norm; /* gemma3: [E], on each block's output before the residual add */
    cm_tensor ffn_norm, ffn_gate, ffn_up, ffn_down;
    /* MoE layers (hp.n_expert > 0; then ffn_gate/up/down are absent):
     * router gate_inp [E, n_expert]; experts stacked as 3-D tensors
     * gate_exps/up_exps [E, F_exp, n_expert], down_exps [F_exp, E, n_expert];
     * qwen2moe's shared expert gate/up [E, F_sh], down [F_sh, E] and its
     * sigmoid gate gate_inp_shexp [E]. */
    cm_tensor ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    cm_tensor ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
    /* gpt-oss (gptoss.c): attn_output bias [E], per-head sink logits
     * attn_sinks [H], router bias [n_expert], expert biases gate/up
     * [F_exp, n_expert] and down [E, n_expert]. Its pre-FFN norm
     * (post_attention_norm in the file) is bound as ffn_norm. */
    cm_tensor bo, attn_sinks, ffn_gate_inp_b, ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b;
    cm_tensor ffn_exp_probs_b; /* deepseek2 V3: [n_expert] selection bias, F32 */
    /* deepseek2 MLA (wq: V2-Lite's [E, H*head_k]; wo [H*head_v, E]):
     * wq_a [E, q_lora], q_a_norm [q_lora], wq_b [q_lora, H*head_k];
     * wkv_a [E, kv_lora + rope], kv_a_norm [kv_lora];
     * wk_b [nope, kv_lora, H], wv_b [kv_lora, head_v, H] (3-D); or, in
     * older files, wkv_b [kv_lora, H * (nope + head_v)], from which wk_b and
     * wv_b are derived at load as F32 in m->derived (mla.c). */
    cm_tensor wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b, wkv_b;
} cm_layer;

/* A layer's dense matmul weights, in the one order every walk over them
 * shares (load-time repacking, kernel tuning; lora.h's enum cm_lora_target
 * numbers its first 7 targets so): wq, wk, wv, wo, ffn_gate, ffn_up,
 * ffn_down. Absent ones (an MoE layer's FFN) have data == NULL. */
#define CM_LAYER_MATMULS 7
static inline void cm_layer_matmuls(const cm_layer *L, const cm_tensor *w[CM_LAYER_MATMULS]) {
    w[0] = &L->wq, w[1] = &L->wk, w[2] = &L->wv, w[3] = &L->wo;
    w[4] = &L->ffn_gate, w[5] = &L->ffn_up, w[6] = &L->ffn_down;
}

typedef struct cm_model {
    cm_hparams hp;
    cm_tensor tok_embd;    /* [E, V] */
    cm_tensor output_norm; /* [E] */
    cm_tensor output;      /* [E, V]; a view of tok_embd when the file has no output.weight */
    cm_tensor rope_freqs;  /* [n_rot/2] Llama 3.x frequency factors, or data == NULL */
    bool tied_output;      /* output is tok_embd */
    cm_layer *layers;      /* [n_layer] */
    const cm_gguf *gguf;   /* not owned */
    uint64_t n_params;     /* elements of all weights (tied output counted once) */
    uint64_t weight_bytes; /* bytes of all weights in the file */
    /* What one token reads: all but the unused experts (= the totals for a
     * dense model). */
    uint64_t n_params_active, weight_bytes_active;
    /* Weights computed at load, owned (cm_aligned_alloc; NULL: none):
     * deepseek2's wk_b of every layer from an unsplit attn_kv_b (mla.c). */
    void *derived;
    /* Decode-layout copies (kernels.h): made at load for a file read into
     * memory (repack); the whole tensors' copies are there now (repack_whole:
     * a tensor-parallel member holds its slice's instead). */
    bool repack, repack_whole;
} cm_model;

/* The rotation of position p (n_rot floats, cm_rope_cache's layout): the
 * model's scaling (gpt-oss: YaRN), or a sliding-window layer's (swa: its
 * base; gemma3 with no scaling, gpt-oss with YaRN; deepseek2: its q_pe /
 * k_pe rotation, mla.c's). forward.c's, and the GPU's for its
 * sliding-window layers. */
void cm_model_rope_cache(const cm_model *m, float p, bool swa, float *cache);

/* Bind a model to a parsed GGUF (which must outlive it). Validates the
 * architecture, hyperparameters, every tensor's presence, type and shape.
 * Errors (CM_EUNSUPPORTED / CM_EFORMAT) name the culprit:
 *   "unknown architecture 'gpt2' (supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, phi3)",
 *   "missing tensor 'blk.3.ffn_up.weight'",
 *   "tensor 'blk.0.attn_q.weight' has unsupported type q2_k",
 *   "tensor 'blk.0.attn_k.weight' has shape [64, 48], expected [64, 32]".
 * On error *m is released. Not thread-safe against itself; the loaded model
 * is read-only afterwards and may be shared by any number of threads. */
int cm_model_load(cm_model *m, const cm_gguf *g, char *err, size_t errlen);
/* A tensor-parallel member's model, without the whole tensors' decode-layout
 * copies (cm_model_repack_slice makes its slice's): the file read into memory
 * when it fits (cm_gguf_load, with progress), else mapped. Messages name the
 * path. On error g and m may hold what was opened (cm_model_release,
 * cm_gguf_close). */
int cm_model_open_for_slice(cm_gguf *g, cm_model *m, const char *path, cm_gguf_progress_fn progress, void *progress_ctx,
                            char *err, size_t errlen);
void cm_model_release(cm_model *m); /* no-op on a zeroed struct */

/* ---- slices ---- */
typedef struct cm_slice {
    int h0, h1; /* KV heads [h0, h1) of [0, n_head_kv); may be empty (FFN-only member);
                 * deepseek2: query heads of [0, n_head) (the latent is cached whole) */
    int f0, f1; /* FFN rows [f0, f1) of [0, n_ff); may be empty */
} cm_slice;
/* Expert parallelism (issue 13; cm_forward_args.experts): ep = this member
 * runs only the experts [e0, e1) of [0, n_expert) of every MoE layer (may be
 * empty), with the slice whole (every KV head and FFN row); cm_forward then
 * calls the expert gather instead of the all-reduce. Zeroed (ep false):
 * every expert. Kept apart from cm_slice so that the KV cache, which the
 * experts do not change, and every cm_slice initialiser stay as they are. */
typedef struct cm_expert_slice {
    bool ep;
    int e0, e1;
} cm_expert_slice;
/* The whole model (single machine). */
cm_slice cm_slice_full(const cm_model *m);
/* Decode-layout copies of every matmul weight, owned by m (cm_model_load
 * makes them for a file read into memory). Returns 0 or CM_ENOMEM. */
int cm_model_repack_whole(cm_model *m, char *err, size_t errlen);

/* The kernels' knobs (kernels/tune.h) for m's weights on this CPU
 * (tune_cache.c; cm_model_load calls it): CUMULO_TUNE=0 sets the built-in
 * defaults; else the values cached for this CPU's signature under
 * CUMULO_TUNE_DIR (default $XDG_CACHE_HOME/cumulo/tune, else
 * $HOME/.cache/cumulo/tune), and those missing (or all, CUMULO_TUNE=force)
 * measured on m's weights when may_measure (cm_model_load of a file read
 * into memory: a mapped one would time page faults, a cluster member's
 * slice load would stall its links; else the defaults) and written back.
 * A corrupt or foreign file: a warning, measured again. The values are
 * process-wide (one CPU); same bits whatever they are. Thread-safe; 0 or
 * CM_ENOMEM (the knobs then stay as they were). */
int cm_model_tune(const cm_model *m, bool may_measure);
typedef struct cm_model_tune_info {
    const char *source;       /* "cache", "measured", "defaults" (mapped file), "off" (CUMULO_TUNE=0), "none"
                         * (no knob reads this model's weights on this table), NULL: never called */
    cm_tune_choice choice;    /* the values cached or measured for this model's knobs */
    int value[CM_TUNE_COUNT]; /* every knob's value after the call */
    bool used[CM_TUNE_COUNT]; /* knob i matters to this model (CUMULO_TUNE=0: would) */
    double ns[CM_TUNE_COUNT][CM_TUNE_MAXCAND]; /* measured: best rep per candidate (0: not measured) */
    double ms, cpu_ms;                         /* the time the call took, and its thread's CPU time */
    char path[512];                            /* the cache file ("" when none) */
} cm_model_tune_info;
/* What the last cm_model_tune of this process did. Thread-safe. */
void cm_model_tune_last(cm_model_tune_info *out);
/* The cache file for CPU signature sig: 0, CM_ENOENT (no dir), CM_ERANGE. */
int cm_tune_cache_path(const char *sig, char *out, size_t cap);
/* Tensor parallelism: where the model was repacked at load, a member keeps
 * decode-layout copies of its slice only: the rows of wq/wk/wv (its heads)
 * and ffn_gate/ffn_up (its FFN rows), the columns of wo and ffn_down, and the
 * output head; the whole tensors' copies are dropped (deepseek2 keeps them:
 * its attention reads its own views, mla.c). The full slice gets the whole
 * copies back. Same bits either way (kernels.h). Call it whenever the
 * member's slice changes, while no forward pass runs on m. Returns 0 or
 * CM_ENOMEM (the slices then read the file's bytes).
 * NEEDSWORK: the output head's copy is whole (a member computes its rows of
 * it only when the plan splits the head, cm_slice_head_rows), and a file
 * read into memory (a type without a repacked layout) stays beside them. */
int cm_model_repack_slice(cm_model *m, cm_slice s, char *err, size_t errlen);
/* Is the slice in range and aligned so that the columns it takes from
 * attn_output and ffn_down start and end on block boundaries of their types?
 * Returns 0 or CM_EINVAL with a message; CM_EUNSUPPORTED for any slice but
 * the whole model of a mixture-of-experts model (NEEDSWORK: tensor-parallel
 * expert rows; experts are split by cm_expert_slice instead), except
 * deepseek2's heads and dense-layer FFN rows, which go with an expert slice
 * (cm_expert_slice_check). */
int cm_slice_check(const cm_model *m, cm_slice s, char *err, size_t errlen);
/* A tensor-parallel member's rows of the output head, [*v0, *v1) of
 * n_vocab, in proportion to its FFN rows: n_vocab * f0 / n_ff to
 * n_vocab * f1 / n_ff. Members whose FFN ranges tile [0, n_ff) get ranges
 * that tile the vocabulary, each computed from its own slice alone. */
void cm_slice_head_rows(const cm_model *m, cm_slice s, int *v0, int *v1);
/* Is x a valid expert slice to go with s (zeroed: always, unless s is a
 * partial deepseek2 slice, which needs one)? CM_EINVAL for a dense model, a
 * range outside [0, n_expert], or s not the whole model (deepseek2: any
 * slice cm_slice_check accepts). */
int cm_expert_slice_check(const cm_model *m, cm_slice s, cm_expert_slice x, char *err, size_t errlen);

/* ---- KV cache of one sequence ----
 * For each layer in [layer_first, layer_last) and each KV head of the slice:
 * K as [n_ctx][head_dim] and V transposed as [head_dim][n_ctx] (ggml's
 * non-flash layout, so the V product sums over positions in ggml's order).
 * F32 like the llama.cpp reference, or F16 (half the memory; then, like
 * ggml, the query is rounded to F16 for K.Q and the attention weights to F16
 * for the V product). n_past is the number of positions filled:
 * cm_forward() appends at n_past; cm_kv_truncate() lets a sequence drop its
 * tail and continue from an earlier position (prefix reuse). A cm_kv is used
 * by one cm_forward() at a time. */
typedef struct cm_kv {
    int layer_first, layer_last;
    int h0, h1;
    int n_ctx;
    int head_dim;
    int n_past;
    enum cm_type type; /* K's type: CM_TYPE_F32 or CM_TYPE_F16 (transposed layout); also Q8_0, Q4_0 (rows) */
    void *k;           /* [layer][head][n_ctx][head_dim] */
    void *v;           /* [layer][head][head_dim][n_ctx], or rows [layer][head][n_ctx][head_dim] (v_rows) */
    /* attn.c: V's type and the rows layout (K and V rows of head_dim
     * elements in their types' blocks, attended by cm_attn_flash); zero in a
     * cache made by cm_kv_init / cm_kv_init_type (then type_v = type). */
    enum cm_type type_v;
    bool v_rows;
    bool latent;         /* deepseek2 (mla.h): k holds the latent rows, v only a placeholder */
    size_t k_row, v_row; /* bytes of one K / V row (v_rows) */
    size_t k_map, v_map; /* kv_mem.c: bytes mapped for k / v (0: heap memory of cm_calloc) */
    /* kv_blocks.c: the prefix blocks this cache maps from a shared store
     * (NULL: none): whole pages of positions [0, n_mapped) of its rows
     * arrays; [0, n_shared) are still the store's (n_shared <= n_mapped). */
    struct cm_kv_store *store;
    int n_mapped, n_shared;
    /* kv_mem.c: pages of positions [n_past, n_pool) stay committed after
     * cm_kv_rewind (a pool the next positions reuse without a page fault);
     * cm_kv_trim gives them back. Positions past max(n_past, n_pool) hold
     * no page (but what a failed pass wrote: cm_kv_trim). */
    int n_pool;
} cm_kv;
/* ---- KV cache types and flash attention (attn.c) ---- */
bool cm_kv_type_ok(enum cm_type t);                   /* F32, F16, Q8_0, Q4_0 */
int cm_kv_type_parse(const char *s, enum cm_type *t); /* "f32", "f16", "q8_0", "q4_0"; 0 or CM_EINVAL */
/* Bytes of a cache with these K and V types (a Q8_0 row of 32 elements: 34 bytes). */
uint64_t cm_kv_bytes_types(const cm_model *m, int layer_first, int layer_last, int h0, int h1, int n_ctx,
                           enum cm_type type_k, enum cm_type type_v);
/* A cache with K and V types of their own. rows: the rows layout and flash
 * attention (forced for quantized types or different K and V types, as
 * llama.cpp forces flash attention for a quantized V); otherwise the
 * transposed layout of cm_kv_init_type. The head size must be a multiple of
 * a quantized type's block (32). */
int cm_kv_init_types(cm_kv *kv, const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx,
                     enum cm_type type_k, enum cm_type type_v, bool rows, char *err, size_t errlen);
/* Store K and V (head_dim floats each) of kv head hk of layer il at
 * position pos of a rows-layout cache, converted to its types. */
void cm_kv_store_rows(const cm_kernels *k, cm_kv *kv, int il, int hk, int pos, const float *kr, const float *vr);
/* The same for a cache of either layout: the rows layout as above, or the
 * transposed one of cm_kv_init_type (F32 or F16; K a row at pos, V a column). */
void cm_kv_store(const cm_kernels *k, cm_kv *kv, int il, int hk, int pos, const float *kr, const float *vr);
/* The rows of one (layer, kv head) of a rows-layout cache, position 0 first. */
enum { CM_ATTN_TILE = 64 }; /* positions per tile of cm_attn_flash */
typedef struct cm_attn_kv {
    const uint8_t *k, *v;
    size_t k_row, v_row;
    enum cm_type k_type, v_type;
    /* Walsh-Hadamard rotation sizes (0: none; cm_kv_rot_k/v): K's rows hold
     * rotated keys (the query is rotated alike), V's rotated values (the
     * output is rotated back) */
    int rot_k, rot_v;
    /* 0: V as rows (v_row bytes apart). Otherwise the transposed layout (F32
     * or F16, attn_split.c only): element i of position p of V at
     * v + i * v_tstride + p * v_row. */
    size_t v_tstride;
} cm_attn_kv;
cm_attn_kv cm_attn_kv_of(const cm_kv *kv, int il, int hk);
/* llama.cpp rotates K and V (orthonormal Walsh-Hadamard, in chunks along
 * the head) before a quantized cache stores them: K in chunks of the
 * largest power of two >= 64 that divides head_dim, V in chunks of 64; none
 * for F32/F16 or a head_dim that is not a multiple of 64. 0: none. */
int cm_kv_rot_k(enum cm_type t, int head_dim);
int cm_kv_rot_v(enum cm_type t, int head_dim);
/* x[0:D] = H x in place, chunk by chunk of n (a power of 2 dividing D):
 * x * (1 / sqrt(n)), then the butterflies of stride 1, 2, ..., n/2. */
void cm_fwht_rows(float *x, int D, int n);
/* One query against positions [p_lo, p_hi) (a sliding window: p_lo > 0):
 * softmax(scale * q.K) over them (plus, unless sink is NAN, one more logit
 * `sink` that has no value row: gpt-oss's attention sinks) times V. */
typedef struct cm_attn_query {
    const float *q; /* [head_dim], roped (and scaled where the model scales q) */
    int p_lo, p_hi;
    float scale;
    float sink; /* NAN: none */
} cm_attn_query;
size_t cm_attn_scratch_bytes(int head_dim); /* scratch per concurrent call, 64-byte aligned */
/* out[0:head_dim] = the attention of q; tiles of CM_ATTN_TILE positions,
 * the query converted to K's vec_dot_type (as ggml's flash attention does),
 * an online softmax (running max and sum, rescaled per tile), V rows
 * dequantized to floats. Thread-safe with its own scratch. */
void cm_attn_flash(const cm_kernels *k, const cm_attn_kv *kv, int head_dim, const cm_attn_query *q, void *scratch,
                   float *out);
/* ---- decode attention over KV blocks (attn_split.c) ----
 * Positions are cut at multiples of CM_ATTN_BLOCK; a block's partial for
 * each of nq queries of one KV head is [M, S, acc[head_dim]] (its max, its
 * sum of e^(s - M), its sum of e^(s - M) V), and the merge of a query's
 * partials in block order is the attention. Same bits for any split of the
 * blocks among threads. */
enum { CM_ATTN_BLOCK = 256 };
bool cm_attn_split_ok(const cm_kernels *k, const cm_attn_kv *kv, int head_dim); /* the table and head size allow it */
size_t cm_attn_split_scratch_floats(int nq, int head_dim); /* scratch of one cm_attn_split_block call */
/* Positions [p0, p1) for queries q (nq rows of head_dim floats, roped and
 * scaled as for cm_attn_flash): query r's partial at part + r * part_stride
 * (head_dim + 2 floats). Thread-safe with its own scratch. */
void cm_attn_split_block(const cm_kernels *k, const cm_attn_kv *kv, int head_dim, int nq, const float *q, int p0,
                         int p1, float scale, float *scratch, float *part, size_t part_stride);
/* Prefill: the rep query heads of each of ntok (<= CM_ATTN_MULTI_MAX) tokens
 * of one sequence (token g's heads at q + g * q_stride, head_dim floats
 * apart), token g over positions [lo[g], hi[g]); out like q (out_stride);
 * sinks: rep logits (NULL: none). Each query's bits are those of
 * cm_attn_split_block over its blocks, merged by cm_attn_split_merge (batch
 * invariance); K/V tiles are shared where the tokens' blocks allow it,
 * which needs of the table's kernels (kernels.h), per query row: attn_qk's
 * score of position j depends only on that query, K_j and j's place in the
 * call (not on nq, n or the other queries); attn_vm adds a zero weight
 * exactly and nothing else it does depends on nq or the other queries.
 * parts: query r's partials at parts + r * part_stride (part_stride >= its
 * blocks x (head_dim + 2)). Thread-safe with its own scratch of
 * cm_attn_multi_scratch_floats(ntok * rep, head_dim). */
enum { CM_ATTN_MULTI_MAX = 64 };
size_t cm_attn_multi_scratch_floats(int nq, int head_dim);
void cm_attn_multi(const cm_kernels *k, const cm_attn_kv *kv, int head_dim, int ntok, int rep, const float *q,
                   size_t q_stride, const int *lo, const int *hi, float scale, const float *sinks, float *scratch,
                   float *parts, size_t part_stride, float *out, size_t out_stride);
/* out[0:head_dim]: one query's nb partials (adjacent, block order) merged,
 * plus a sink logit unless NAN, divided by the sum, rotated back by rot_v. */
void cm_attn_split_merge(const float *parts, int nb, int head_dim, float sink, int rot_v, float *out);
/* Bytes of an F32 KV cache for n_ctx positions over a layer range and head
 * range (an F16 cache takes half). */
uint64_t cm_kv_bytes(const cm_model *m, int layer_first, int layer_last, int h0, int h1, int n_ctx);
/* An F32 cache. */
/* The layer range, KV head range and context size every cm_kv_init* takes,
 * checked (0, or an error naming the one out of range). */
int cm_kv_check(const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx, char *err, size_t errlen);
int cm_kv_init(cm_kv *kv, const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx, char *err,
               size_t errlen);
/* type: CM_TYPE_F32 or CM_TYPE_F16 (anything else: CM_EINVAL). */
int cm_kv_init_type(cm_kv *kv, const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx,
                    enum cm_type type, char *err, size_t errlen);
void cm_kv_release(cm_kv *kv);
void cm_kv_truncate(cm_kv *kv, int n_past); /* keeps positions [0, n_past); n_past clamped */
/* cm_kv_truncate that keeps the pages past n_past committed (kv->n_pool):
 * the positions written next reuse them without the kernel's first-touch
 * fault and zeroing (a cache's pool, given back by cm_kv_trim /
 * cm_kv_truncate; cm_kv_pooled_bytes counts it). Shared prefix blocks are
 * let go as cm_kv_truncate does. */
void cm_kv_rewind(cm_kv *kv, int n_past);
/* Make dst hold src's first n positions (n <= src->n_past, n <= dst->n_ctx;
 * same layer range, slice and type): their bytes are copied (kv_copy.c) and
 * dst->n_past = n. CM_EINVAL otherwise. */
int cm_kv_copy_prefix(cm_kv *dst, const cm_kv *src, int n, char *err, size_t errlen);
/* ---- KV memory committed on demand (kv_mem.c) ----
 * cm_kv_init* reserve K and V as address space (cm_kv_mem_map): pages cost
 * memory once written; cm_kv_truncate gives back the pages wholly past the
 * positions it keeps (cm_kv_trim), all of them at 0. The layout is unchanged. */
void *cm_kv_mem_map(size_t bytes, size_t *mapped); /* NULL when it cannot */
void cm_kv_mem_unmap(void *p, size_t mapped);
/* Bytes of the pages positions [0, n) of kv occupy (exact for its layout:
 * page rounding included); what a cache holding n positions costs. */
uint64_t cm_kv_resident_bytes(const cm_kv *kv, int n);
uint64_t cm_kv_mapped_bytes(const cm_kv *kv); /* address space reserved */
void cm_kv_trim(cm_kv *kv);                   /* give back the pages past kv->n_past (the pool too) */
/* Bytes of the pages kv keeps committed past its n_past (cm_kv_rewind's
 * pool): resident(max(n_past, n_pool)) - resident(n_past), page rounding
 * included (pages a shared prefix maps there counted too: an upper bound). */
uint64_t cm_kv_pooled_bytes(const cm_kv *kv);
/* ---- prefix KV blocks shared copy-on-write (kv_blocks.c) ----
 * Make dst hold src's first n positions (the conditions of
 * cm_kv_copy_prefix) by mapping the same physical pages into both: a store
 * of src's prefix pages is made once (src then maps it too) and every cache
 * that takes the prefix maps it; the first write into a shared page copies
 * it (the kernel's copy-on-write). Only whole pages of the rows arrays (K;
 * V in the rows layout) are shared, the rest is copied; same addresses and
 * bytes as a copy, so no reader changes. Falls back to the copy where pages
 * cannot be shared (heap caches, other context sizes). Caller serialises it
 * with forward passes of both caches. 0 or an error (CM_EINVAL as the copy). */
int cm_kv_share_prefix(cm_kv *dst, cm_kv *src, int n, char *err, size_t errlen);
/* The bytes of cm_kv_resident_bytes(kv, n) that are the store's (0 without
 * one), and the store's own bytes (counted once however many caches map it);
 * *id names the store (NULL: none). */
uint64_t cm_kv_shared_bytes(const cm_kv *kv, int n);
uint64_t cm_kv_store_bytes(const cm_kv *kv, const void **id);
/* Bytes of whole pages of positions [0, n) a share could map (by layout). */
uint64_t cm_kv_shareable_bytes(const cm_kv *kv, int n);
void cm_kv_blocks_trim(cm_kv *kv);    /* cm_kv_trim: n_past below the shared part, or 0: the store let go */
void cm_kv_blocks_release(cm_kv *kv); /* cm_kv_release: the store reference dropped */

/* ---- forward pass ---- */

/* A batch of n tokens. Row i is token i. */
typedef struct cm_batch {
    int n;
    const int32_t *tokens; /* [n] token ids; only for a stage with layer_first == 0 */
    const float *embd;     /* [n][n_embd] input hidden states, used when tokens == NULL (any stage) */
    const int32_t *pos;    /* [n] position of each token in its sequence */
    const int32_t *seq;    /* [n] index into cm_forward_args.kvs of its sequence */
    const int8_t *logits;  /* [n] nonzero: produce logits for this row; NULL = last row only */
} cm_batch;

/* Replace x[0 .. n) by its sum over all slices of the tensor-parallel group,
 * in place. Called by cm_forward() on the caller's thread, twice per layer
 * (after attn_output, after ffn_down), with n = batch n * n_embd. Must give
 * every member the same result (fixed reduction order). Returns 0 or an
 * error code, which aborts the forward pass. */
typedef int (*cm_allreduce_fn)(void *user, float *x, int64_t n);

/* Expert parallelism: complete the expert outputs of one MoE layer, in place.
 * y holds rows[n_expert] rows of row_len floats: the outputs of expert e for
 * its (token, slot) assignments are rows [rows[e], rows[e + 1]) (rows[0] = 0;
 * every member of the group computes the same routing, so the same rows[]).
 * On entry this member has filled the rows of its experts [e0, e1); on
 * return every row must hold its owner's bits. Called by cm_forward() on the
 * caller's thread, once per MoE layer, when the slice is an expert slice.
 * Returns 0 or an error code, which aborts the forward pass. */
typedef int (*cm_expert_gather_fn)(void *user, float *y, int64_t row_len, const int32_t *rows, int n_expert);

/* Tensor parallelism's split output head: this member has computed the
 * logits of vocabulary rows [head_v0, head_v1) of each of the n_out rows of
 * logits ([n_out][n_vocab]); complete them (the member that samples receives
 * the other members' rows, the others send theirs). Called by cm_forward()
 * on the caller's thread after the head. Every row has the bits the whole
 * head gives it on one machine (each logit is one row's dot product). */
typedef int (*cm_head_gather_fn)(void *user, float *logits, int n_out);

typedef struct cm_forward_args {
    int layer_first, layer_last; /* [0, n_layer) for a single machine */
    cm_slice slice;              /* must equal the slice the kvs were made with */
    cm_kv **kvs;                 /* sequences; batch.seq[i] indexes this array */
    int n_kvs;
    cm_allreduce_fn allreduce; /* NULL: no-op (the slice is the whole model); not called for an ep slice */
    void *allreduce_user;
    cm_expert_slice experts;           /* expert parallelism; zeroed: every expert (CM_EINVAL for a dense
                                    model or with a slice that is not whole) */
    cm_expert_gather_fn expert_gather; /* experts.ep: required unless [e0, e1) is every expert */
    void *expert_gather_user;
    /* Hot-expert replication (experts.ep; sched/replicas.c): expert_holders[e] = the group's
     * members holding expert e (bit k: member k), expert_rank = this member's bit; each expert's
     * rows are split among its holders by cm_expert_share, so every row is computed once, with
     * the bits of one machine (the kernels are batch-invariant). NULL: [e0, e1) alone. */
    const uint32_t *expert_holders;
    int expert_rank;
    /* Outputs (either, both or neither — neither just fills the KV caches):
     * out_hidden: [n][n_embd] hidden states after layer_last - 1 (for the next stage);
     * out_logits: [n_out][n_vocab] for the rows selected by batch.logits, in
     * batch order; requires layer_last == n_layer. */
    float *out_hidden;
    float *out_logits;
    /* Split head (tensor parallelism, with out_logits): only vocabulary rows
     * [head_v0, head_v1) are computed here, then head_gather is called.
     * head_gather NULL: every row (head_v0/v1 ignored). */
    int head_v0, head_v1;
    cm_head_gather_fn head_gather;
    void *head_gather_user;
    /* LoRA (cm_ctx_set_lora), per sequence: lora_scales[k] (NULL: the set's
     * defaults) holds the user scale of each adapter of the set for the rows
     * of kvs[k] (lora.h cm_lora_apply_rows); NULL: every row the defaults. */
    const float *const *lora_scales;
    /* Called on cm_forward's caller's thread after every layer but the last,
     * the pool idle (NULL: none): the engine lets a short prompt that just
     * arrived run a whole pass of its own on another cm_ctx there (batch.c
     * interjections), so it does not wait for the rest of this pass. It must
     * not touch this pass's ctx or its sequences' caches. */
    void (*between_layers)(void *user, int il);
    void *between_layers_user;
} cm_forward_args;

/* Scratch for forward passes of up to max_batch tokens over sequences of up
 * to max_ctx positions, threads from pool (not owned; NULL = caller only).
 * One cm_ctx runs one cm_forward() at a time. */
typedef struct cm_ctx cm_ctx;
cm_ctx *cm_ctx_new(const cm_model *m, int max_batch, int max_ctx, cm_pool *pool, char *err, size_t errlen);
void cm_ctx_free(cm_ctx *c);
int cm_ctx_max_batch(const cm_ctx *c);
/* Use another kernel table (tests: the scalar reference). Default cm_kernels_get(). */
void cm_ctx_set_kernels(cm_ctx *c, const cm_kernels *k);

/* Tests only (tests/unit/test_synth_golden.c): called after every
 * conversion of activations to a dot product's input type, with the float
 * source x[0:n] and its converted bytes xq (columns [col0, col0 + n) of
 * batch row `row`; for CM_ACT_OUTPUT the row is the index among the rows
 * whose logits are produced). The hook may rewrite xq in place, e.g. to
 * round one element the other way. Called from the pool's threads, several
 * at once when the pool has more than one. NULL = none (the default). */
enum cm_act_site {
    CM_ACT_ATTN_IN,
    CM_ACT_K_IN,
    CM_ACT_V_IN,
    CM_ACT_ATTN_OUT,
    CM_ACT_FFN_IN,
    CM_ACT_UP_IN,
    CM_ACT_FFN_DOWN,
    CM_ACT_OUTPUT,
    /* MoE: the input of an expert's down projection (row = token, columns
                    * [slot * n_ff_exp, (slot + 1) * n_ff_exp) for its top-k slot), the
                    * shared expert's; the router and shared-expert inputs when their
                    * vec_dot_type differs from the experts' (then CM_ACT_FFN_IN is the
                    * experts' gate input) */
    CM_ACT_EXP_DOWN,
    CM_ACT_SHEXP_DOWN,
    CM_ACT_ROUTER_IN,
    CM_ACT_SHEXP_IN,
    /* deepseek2 (mla.c): the input of attn_kv_a_mqa when its vec_dot_type
                    * differs from the q weight's, and the normed q_a for attn_q_b
                    * (CM_ACT_K_IN / CM_ACT_V_IN: q_nope for attn_k_b and the latent
                    * output for attn_v_b, columns head * width) */
    CM_ACT_KV_A_IN,
    CM_ACT_Q_B_IN,
    /* gemma3: the gate's rounding to F16 before the GELU table (vdt
                    * F16; columns of the FFN), shown only when a hook is set */
    CM_ACT_GELU_IN,
    /* deepseek2 with an unsplit attn_kv_b (mla.c): the normed latent
                    * converted to its vec_dot_type (then cached dequantized) */
    CM_ACT_KV_B_IN
};
typedef void (*cm_act_hook_fn)(void *user, int layer, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt,
                               const float *x, void *xq, int64_t n);
void cm_ctx_set_act_hook(cm_ctx *c, cm_act_hook_fn fn, void *user);
/* Routing counts of c since cm_ctx_new: hits[e] += the (token, slot) assignments routed to
 * expert e, summed over every MoE layer and forward pass (the measure a warm-up hands the
 * planner for replicas: cm_plan_opts.expert_load). Copies min(n, n_expert) counts and
 * returns n_expert (0: a dense model). Any thread, also while a forward pass of c runs (the
 * counts are relaxed atomics: a running pass's may be missing). _layer: layer il's alone
 * (layers this context never computed, e.g. a later pipeline stage's, count 0). */
int cm_ctx_expert_hits(const cm_ctx *c, uint64_t *hits, int n);
int cm_ctx_expert_hits_layer(const cm_ctx *c, int il, uint64_t *hits, int n);
/* Rows [*lo, *hi) of an expert's c assignments (grouped by expert, model.h's gather rows)
 * that member rank computes when the members in holders hold it: the j-th of its r holders
 * in member order takes [c*j/r, c*(j+1)/r) (so one token goes to the last holder); empty
 * when rank is not a holder. Every member derives the same split from the same routing. */
void cm_expert_share(uint32_t holders, int rank, int c, int *lo, int *hi);
/* Offload of the first layers (a GPU: src/gpu/gpu.h's cm_gpu_offload): called
 * by cm_forward after the embeddings with x (b->n rows of n_embd) and the
 * rotation caches (b->n rows of n_rot); returns how many layers from
 * a->layer_first it computed into x (0: none, the CPU does all), or a
 * negative CM_E* code with err. fn NULL: none. user is not owned. */
typedef int (*cm_offload_fn)(void *user, const cm_batch *b, const struct cm_forward_args *a, float *x,
                             const float *rope, char *err, size_t errlen);
void cm_ctx_set_offload(cm_ctx *c, cm_offload_fn fn, void *user);
/* Past 512 positions attention runs over KV blocks / multi-query tiles
 * (attn_split.c; the default); false keeps the per-(token, head) paths at
 * every length (tests and benchmarks compare the two). */
void cm_ctx_set_attn_split(cm_ctx *c, bool on);

/* Run the batch through layers [layer_first, layer_last) over the slice.
 * For each sequence, its tokens in the batch must be at consecutive
 * positions starting at its kv->n_past (appended in batch order); each token
 * attends to positions [0, pos] of its own sequence. On success every kv's
 * n_past has advanced by its token count. Errors (CM_EINVAL, CM_ENOSPACE when
 * a sequence would exceed its n_ctx, or the all-reduce's code) leave the KV
 * n_past values unchanged. No allocation. */
int cm_forward(cm_ctx *c, const cm_batch *b, const cm_forward_args *a, char *err, size_t errlen);

/* Convenience for one sequence on one machine: whole model, whole slice,
 * logits of the last token into out_logits [n_vocab]. */
int cm_forward_simple(cm_ctx *c, cm_kv *kv, const int32_t *tokens, int n, float *out_logits, char *err, size_t errlen);

#endif
