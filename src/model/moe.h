/*
 * moe.h (private to src/model): mixture-of-experts FFN layers (qwen2moe,
 * qwen3moe, llama with experts = Mixtral; gpt-oss's gating, expert biases
 * and activation are described in gptoss.h): loading the router, the stacked
 * expert tensors and qwen2moe's shared expert, and the FFN of one layer.
 *
 * The computation follows llama.cpp's build_moe_ffn() (softmax gating):
 * router logits = ffn_gate_inp x (F32 dot products), probabilities = softmax
 * over all experts (max subtraction, expf, double sum, scaled by the float
 * 1/sum), the top k by probability (descending; ties: lower expert id), their
 * weights = those probabilities, renormalised (qwen3moe, Mixtral: divided by
 * their double-summed, F16-min-clamped sum) or not (qwen2moe); each chosen
 * expert runs silu(gate) * up then down, its output is multiplied by its
 * weight, and the weighted outputs are added per token IN TOP-K ORDER
 * (slot 0 first), as llama.cpp adds its views. qwen2moe then adds the shared
 * expert's output times sigmoid(gate_inp_shexp . x), the sigmoid computed as
 * silu(v) / v like llama.cpp.
 *
 * Tokens are grouped by expert (ascending expert id, tokens in batch order)
 * and each active expert runs as one GEMM over its tokens; decode is the same
 * code with one token, so only the k chosen experts' rows are read. Because
 * the kernels are batch-invariant (kernels.h), a token's result is the same
 * bits whatever else is in the batch and however tokens group.
 */
#ifndef CM_MODEL_MOE_H
#define CM_MODEL_MOE_H

#include "model.h"

/* Read "<arch>.expert_*" keys into m->hp (after n_ff is known). A *moe
 * architecture without experts, or more used than there are, is an error. */
int cm_moe_load_hparams(cm_model *m, char *err, size_t errlen);
/* Bind layer il's router, experts and (qwen2moe) shared expert; refuses
 * the per-expert tensor layout of old Mixtral files with a message. */
int cm_moe_bind_layer(cm_model *m, int il, char *err, size_t errlen);
/* Bind blk.<il>.<suffix> with shape ne[0..nd) (nd <= 3), counted in the
 * model's totals; weight: any type the kernels support, else F32 only.
 * Missing: an error naming it (mla.c's tensors too). */
int cm_moe_bind_tensor(cm_model *m, cm_tensor *t, int il, const char *suffix, int nd, int64_t ne0, int64_t ne1,
                       int64_t ne2, bool weight, char *err, size_t errlen);
/* Repacked copies (kernels.h, cm_repack_add; owner m) of layer il's stacked
 * expert tensors, each as one matrix of every expert's rows, so that the
 * per-expert views moe.c multiplies find them (row views); the same bits,
 * the decode layout. Returns 0 or CM_ENOMEM. */
int cm_moe_repack_layer(const cm_model *m, int il, char *err, size_t errlen);
/* Set m->n_params_active / weight_bytes_active (after every layer is bound). */
void cm_moe_count_active(cm_model *m);
/* CM_EUNSUPPORTED unless s is the whole model (no tensor-parallel experts yet). */
int cm_moe_check_slice(const cm_model *m, cm_slice s, char *err, size_t errlen);
/* Expert parallelism: CM_EINVAL unless x is zeroed, or ep with [e0, e1) in
 * [0, n_expert] and s the whole model (attention and router whole). */
int cm_moe_check_experts(const cm_model *m, cm_slice s, cm_expert_slice x, char *err, size_t errlen);

/* Scratch of the MoE FFN for batches of up to max_batch tokens on a pool of n_threads. */
typedef struct cm_moe cm_moe;
cm_moe *cm_moe_new(const cm_model *m, int max_batch, int n_threads); /* n_threads: the pool's size */
void cm_moe_free(cm_moe *s);

/* One layer's MoE FFN over n tokens, called by every thread of the pool
 * (ith of nth) after the FFN input is normed (xn, [n][n_embd] floats) and
 * converted to ffn_gate_exps's vec_dot_type (xq, row stride xq_stride).
 * Writes out [n][n_embd] (the FFN output, to be added to the residual).
 * Synchronises with cm_pool_barrier(); returns after its last barrier with
 * its share of out written (the caller's pool run joins). */
typedef struct cm_moe_run {
    const cm_model *m;
    const cm_kernels *k;
    cm_pool *pool;
    int il, n;
    const float *xn;
    const void *xq;
    size_t xq_stride;
    float *out;
    cm_act_hook_fn hook; /* tests only (model.h) */
    void *hook_user;
    /* Expert parallelism: run only experts [e0, e1) (every expert when !ep)
     * and stop before the weighted sum (step 8) when defer_combine: the
     * caller then completes the rows of the other experts (cm_moe_rows,
     * model.h's cm_expert_gather_fn) and runs cm_moe_combine. */
    bool ep, defer_combine;
    int e0, e1;
    const uint32_t *holders; /* ep: replicated experts (cm_forward_args.expert_holders); NULL: [e0, e1) */
    int rank;
} cm_moe_run;
void cm_moe_ffn(cm_moe *s, const cm_moe_run *r, int ith, int nth);
/* Step 7 alone (after a deferred cm_moe_ffn of the same run): every thread. */
void cm_moe_combine(cm_moe *s, const cm_moe_run *r, int ith, int nth);
/* The expert output rows of the last cm_moe_ffn and their prefix offsets by
 * expert (model.h's cm_expert_gather_fn arguments). */
void cm_moe_rows(cm_moe *s, int n, float **y, const int32_t **rows);
/* Routing counts since cm_moe_new of layer il (< 0: every layer summed;
 * model.h's cm_ctx_expert_hits). Any thread, while forward passes run. */
void cm_moe_hits(const cm_moe *s, int il, uint64_t *hits, int n);

#endif
