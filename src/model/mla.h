/*
 * mla.h (private to src/model): deepseek2's multi-head latent attention
 * (DeepSeek V2/V2-Lite/V3/R1, Kimi K2): its hyperparameters, tensors, KV
 * cache size and the attention of one layer.
 *
 * The computation follows llama.cpp's deepseek2 graph in its MLA form (the
 * attn_k_b / attn_v_b tensors of current GGUFs; older files' attn_kv_b is
 * split into them at load, where llama.cpp runs it as MHA with the same
 * math in another order), "absorbed" so that the
 * cache holds, per token and layer, only the normed latent kv_cmpr
 * (kv_lora_rank floats) and the roped key part k_pe (n_rot floats), shared
 * by every head (MQA over the latent):
 *   q      = wq_b · rms_norm(wq_a · x) * q_a_norm     (or wq · x: V2-Lite)
 *   kv     = wkv_a · x = [kv_cmpr | k_pe]; kv_cmpr = rms_norm(kv_cmpr) * kv_a_norm
 *   q[h]   = [q_nope | q_pe]; q_pe, k_pe roped (adjacent pairs, n_rot dims)
 *   Q[h]   = [wk_b[h] · q_nope | q_pe]          (kv_lora + n_rot)
 *   K[p]   = [kv_cmpr[p] | k_pe[p]]             (the cache row)
 *   o[h]   = softmax(kq_scale * Q[h] · K[0..pos]) · kv_cmpr[0..pos]
 *   out    = wo · [wv_b[h] · o[h] for each h]
 * kq_scale = mscale^2 / sqrt(nope + rope), mscale from YaRN's factor and
 * rope.scaling.yarn_log_multiplier (1 without YaRN).
 *
 * Activations are converted to each weight's vec_dot_type before its dot
 * products exactly where ggml converts them, so quantized files match.
 * cm_mla_attn never allocates: scratch is sized by cm_mla_new.
 */
#ifndef CM_MODEL_MLA_H
#define CM_MODEL_MLA_H

#include "model.h"

/* Read deepseek2's keys into m->hp (after the common ones): the MLA ranks
 * and head sizes, the MoE keys of DeepSeek (leading dense layers, shared
 * experts, gating, groups, scale), rope type and scale. Sets n_head_kv = 1
 * and head_dim = kv_lora + n_rot (the cache row). Errors name the key. */
int cm_mla_load_hparams(cm_model *m, char *err, size_t errlen);
/* Bind layer il's attention tensors (and its exp_probs_b when present).
 * The unsplit attn_kv_b layout of older GGUFs is split into F32 wk_b and
 * wv_b in m->derived, as llama.cpp's converter splits it. */
int cm_mla_bind_layer(cm_model *m, int il, char *err, size_t errlen);
/* Bytes of an F32 latent cache for n_ctx positions over a layer range. */
uint64_t cm_mla_kv_bytes(const cm_model *m, int layer_first, int layer_last, int n_ctx);

/* The rotation of position p (n_rot floats, cos/sin pairs) of q_pe and
 * k_pe: the NORM type with deepseek2's YaRN settings (hp->mla), as
 * ggml_rope_cache_init; cm_model_rope_cache's for deepseek2. */
void cm_mla_rope_cache(const cm_hparams *hp, float p, float *cache);

typedef struct cm_mla cm_mla;
cm_mla *cm_mla_new(const cm_model *m, int max_batch, int max_ctx, int n_threads);
void cm_mla_free(cm_mla *s);

typedef struct cm_mla_run {
    const cm_model *m;
    const cm_kernels *k;
    cm_pool *pool;
    int il;
    const cm_batch *b;
    cm_kv *const *kvs;
    const float *xn; /* [n][n_embd] the normed input */
    const void *xq;  /* xn converted for the first weight (wq_a or wq) */
    size_t xq_stride;
    float *out;          /* [n][n_embd] attention output (before the residual add); over a
                          slice of heads the partial sum of wo's columns of those heads */
    int h0, h1;          /* query heads [h0, h1) of [0, n_head) (a tensor-parallel slice;
                          the latent is computed and cached whole on every member) */
    cm_act_hook_fn hook; /* tests only (model.h) */
    void *hook_user;
} cm_mla_run;
/* One layer's attention, called by every thread of the pool (ith of nth);
 * appends each token's latent row to its sequence's cache at its position. */
void cm_mla_attn(cm_mla *s, const cm_mla_run *r, int ith, int nth);

#endif
