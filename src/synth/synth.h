/*
 * synth: random-weight models with exactly the metadata keys, tensor names,
 * shapes and types a real GGUF of the architecture has (llama, qwen2, qwen3,
 * gemma3, phi3, and the mixture-of-experts qwen2moe, qwen3moe and llama with experts),
 * so that tests and demos can exercise every architecture x tensor type
 * without downloading anything, and llama.cpp loads the same file.
 *
 * Weights are drawn deterministically from (seed, tensor name, row): the file
 * is a pure function of its parameters, whatever the thread count or
 * platform (the generator uses integer arithmetic and one float multiply per
 * value; no libm). Scales keep the logits non-degenerate (see synth.c).
 * Quantized tensors are drawn directly as blocks (random codes, block
 * scales that give the float path's std and zero mean): a 1B Q4_K_M model
 * takes about a second of CPU instead of the ~50 s the reference K-quant
 * quantizers need; norms and biases stay F32.
 *
 * This module writes files and never reads anything but the vocabulary GGUF
 * it is given; it does no inference.
 */
#ifndef CM_SYNTH_H
#define CM_SYNTH_H

#include "../base/base.h"
#include "../gguf/gguf.h"
#include "../os/os.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct cm_synth_params {
    const char *arch; /* "llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma3", "phi3", "deepseek2" */
    int n_embd;       /* model dim; a multiple of the weight type's block size (256 for K-quants) */
    int n_layer;
    int n_head;    /* n_embd % n_head == 0; head_dim = n_embd / n_head, even */
    int n_head_kv; /* divides n_head */
    int n_ff;      /* multiple of the block size like n_embd (MoE: the feed_forward_length key;
                         * qwen2moe's shared expert width unless n_ff_shexp) */
    /* Mixture of experts: n_expert > 0 (qwen2moe/qwen3moe need it; llama with
     * experts is Mixtral, its experts n_ff wide); the experts of qwen*moe are
     * n_ff_exp wide (0 = n_ff); n_ff_shexp: qwen2moe's shared expert (0 = n_ff). */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    /* A skewed router (tests of hot-expert replication): hot_expert > 0 scales
     * the router row of expert hot_expert - 1 by 40 in every MoE layer (qwen*moe,
     * Mixtral), so it wins wherever its logit is positive. 0: none. */
    int hot_expert;
    int hot_first_layer; /* the skew only in MoE layers >= this one (0: every layer; a later
                            pipeline stage's hot expert) */
    int n_ctx;           /* <arch>.context_length; 0 = 4096 */
    const char *type;    /* f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m ... */
    float rope_base;     /* 0 = the architecture's usual (llama 10000, with llama3 scaling 500000, qwen 1e6) */
    bool rope_llama3;    /* Llama 3.1 rope scaling: rope_freqs.weight (factor 8, low 1, high 4, original ctx 8192) */
    /* RoPE scaling keys (rope.scaling.*), written when rope_scaling is set:
     * "none", "linear" or "yarn" (type), rope_factor (factor, > 0),
     * rope_orig_ctx (original_context_length; 0 = not written),
     * rope_attn_factor (attn_factor; 0 = not written); and the YaRN keys
     * llama.cpp reads only for some architectures (0 = not written):
     * yarn_beta_fast, yarn_beta_slow, yarn_log_mul. */
    const char *rope_scaling;
    float rope_factor;
    int rope_orig_ctx;
    float rope_attn_factor, yarn_beta_fast, yarn_beta_slow, yarn_log_mul;
    bool tied; /* no output.weight: the head reuses token_embd */
    int n_swa; /* gemma3: attention.sliding_window; 0 = 8 */
    /* deepseek2 (needs --experts): "v3" (q LoRA, sigmoid routing with
     * exp_probs_b, 4 expert groups of which 2 are used, scale 2.5,
     * normalised weights, 1 shared expert) or "lite" (V2-Lite: one attn_q,
     * softmax routing, unnormalised, 2 shared experts); both MLA with the
     * split attn_k_b/attn_v_b, kv_lora_rank 256, 64 nope + 32 rope dims,
     * 64 value dims per head, and 1 leading dense layer; "v3yarn": v3 with
     * DeepSeek V3's YaRN keys (factor 40, original context 4096,
     * yarn_log_multiplier 0.1); "v3kvb", "litekvb": v3 or lite in the
     * layout of GGUFs converted before llama.cpp's MLA support: one
     * attn_kv_b [kv_lora, H * (64 + 64)] (per head its key rows, then its
     * value rows), head_count_kv = heads, key_length 96, value_length 64
     * and no *_mla keys. NULL = "v3". */
    const char *variant;
    uint64_t seed;
    int n_threads; /* 0 = all CPUs; never changes the output */
    /* Called after each tensor with bytes done / total (total is the tensor data size). */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} cm_synth_params;

/* Types that --type accepts, space-separated (for help texts). */
const char *cm_synth_type_names(void);

/* Check p (shapes vs types, known arch/type) without writing anything.
 * Returns 0 or CM_EINVAL with a one-line message. */
int cm_synth_check(const cm_synth_params *p, char *err, size_t errlen);

/* Write the model to path atomically (or, when path is NULL, append the
 * whole file to out: tests). vocab is a parsed GGUF whose tokenizer.* keys
 * are copied (its tokenizer.ggml.tokens gives n_vocab). Returns 0 or a CM_E*
 * code with a message. Thread-safe only against other calls with their own
 * arguments; uses its own compute pool for the duration of the call. */
int cm_synth_write(const cm_synth_params *p, const cm_gguf *vocab, const char *path, cm_buf *out, char *err,
                   size_t errlen);

/* A small vocabulary of cumulo's own (synth_vocab.c): a GGUF holding only
 * tokenizer.* keys ("llama" model: <unk> <s> </s>, characters, common words,
 * no byte tokens), appended to out, for `--vocab builtin` when no tokenizer
 * file is at hand. Its text is noise under random weights, readable noise.
 * Returns 0 or CM_ENOMEM. */
int cm_synth_builtin_vocab(cm_buf *out, char *err, size_t errlen);

/* Llama 3.1 rope frequency factors (n = head_dim / 2 values), as the HF
 * converter computes them: factor 8, low_freq_factor 1, high_freq_factor 4,
 * original context 8192. */
void cm_synth_llama3_freqs(float *out, int head_dim, float rope_base);

/* A random LoRA adapter for a model (synth_lora.c): llama.cpp's adapter
 * GGUF with F32 lora_a/lora_b pairs for every blk.N.attn_q/k/v/output,
 * ffn_gate/up/down and output weight the model has (those whose name
 * contains `only`, when set), sized so that (alpha/rank) B A has `strength`
 * times W's RMS. Deterministic by seed, like cm_synth_write. Written to path
 * atomically, or appended to out when path is NULL. */
typedef struct cm_synth_lora_params {
    int rank;
    float alpha;
    float strength; /* e.g. 0.3 */
    uint64_t seed;
    const char *only; /* NULL: every target */
} cm_synth_lora_params;
int cm_synth_lora_write(const cm_synth_lora_params *p, const cm_gguf *model, const char *path, cm_buf *out, char *err,
                        size_t errlen);

#endif
