/*
 * vk_model.h: a model's layers on the device, shared by vk_model.c (the
 * tensor table, upload, sizes), vk_record.c (recording the llama-family
 * layers and the mixture-of-experts FFNs), vk_kv.c (the slots mirroring the
 * CPU caches), vk_forward.c (a batch's submission, a tensor-parallel
 * member's halves) and vk_mla.c (deepseek2's latent attention and its
 * latent cache). Private to src/gpu; no Vulkan types.
 */
#ifndef CM_VK_MODEL_H
#define CM_VK_MODEL_H

#include "vk_int.h"

typedef struct wt {
    uint32_t off, type, K, rows; /* words into the layer buffer */
    uint32_t stride;             /* a stacked [K, rows, n_expert] tensor: words per expert (0: 2-D) */
} wt;

typedef struct glayer {
    cm_vk_buf *buf, *kv; /* weights; the K/V cache of every slot (slot_stride floats each) */
    cm_vk_set *set;
    wt attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;
    wt bq, bk, bv, q_norm, k_norm; /* qwen2's biases, qwen3's per-head norms: K 0 when absent */
    wt attn_post, ffn_post;        /* gemma3's post norms (K 0 when absent) */
    /* a mixture-of-experts layer (router K 0 when dense): the router, qwen2moe's shared-expert
     * gate, the stacked experts, the shared expert */
    wt router, sh_inp, gexp, uexp, dexp, sgate, sup, sdown;
    /* gpt-oss: the attention output bias, the heads' sink logits, the router's and the experts' biases */
    wt bo, sinks, router_b, gexp_b, uexp_b, dexp_b;
    /* deepseek2: the latent attention's tensors (vk_mla.c; wq is V2-Lite's attn_q), V3's selection bias */
    wt wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b, probs_b;
} glayer;

struct cm_gpu_model {
    cm_gpu *g;
    const cm_model *m;
    int l0, nl, B, ctx, n_seq; /* layers [l0, l0 + nl) of m */
    int E, D, nq, nkv, QD, KD, F, n_rot;
    int sh1;              /* the full slice's h1 (kv heads; deepseek2: query heads) */
    cm_slice sl;          /* the slice of every layer it holds (a tensor-parallel member's; else full) */
    bool tp;              /* sl is partial: each layer's two halves end in the batch's all-reduce */
    float *part;          /* tp: B * E floats, the partial sums all-reduced on the host */
    bool mla;             /* deepseek2: K holds the latent rows (D = kv_lora + rope), no V */
    int nx, nxk, fx, fsh; /* experts, used per token, expert and shared-expert widths (0: dense) */
    glayer *L;
    cm_vk_buf *act, *io;
    /* A's regions (floats); io holds the first five at the same offsets */
    uint32_t o_x, o_k, o_v, o_rope, o_rope_swa, o_meta, o_io_end, o_xn, o_q, o_att, o_gate, o_up, o_sc, o_q8;
    uint32_t o_lg, o_ids, o_ew, o_shl, o_eg, o_eu, o_ey, o_sy; /* MoE: router, choice, expert rows (record_moe) */
    uint32_t o_sel, o_gs;                                      /* deepseek2's selection scores, group scores */
    uint32_t o_qa, o_qabs, o_lat, o_hid; /* deepseek2: q_a; absorbed queries; latent outputs; head ids */
    uint32_t q8_src;                     /* while recording: the region o_q8 holds converted, or UINT32_MAX */
    uint32_t q8_type;                    /* ... to this type (Q8_0, Q8_K) */
    uint32_t slot_stride;                /* words of one slot's K and V of one layer */
    enum cm_type kvk, kvv;               /* the cache types the slots were sized for (F32: any fits) */
    /* this batch's cache: K and V types (kvq.glsl's codes), words of a row, Walsh-Hadamard blocks */
    uint32_t bkt, bvt, bkrw, bvrw, brk, brv;
    const cm_kv **slot_kv; /* which CPU cache each slot mirrors (by address) */
    int *slot_valid;       /* positions [0, valid) of the slot equal the CPU cache's */
    uint64_t *slot_used, tick;
    float *tmp;                  /* ctx * D floats, for re-filling a slot */
    bool lost_said;              /* the device-lost warning was logged */
    uint64_t n_took, n_declined; /* batches (cm_gpu_model_batches) */
};

/* ---- recording (vk_record.c) ---- */
/* Record layer il for n tokens: the residual o_x through attention and FFN
 * (f16: an F16 cache's rounding). */
void cm_vkm_record_layer(cm_gpu_model *gm, int il, int n, bool f16);
/* Record half of layer il of a tensor-parallel member (0 attention, 1 FFN)
 * from the residual o_x: its partial sum into o_x. */
void cm_vkm_record_half(cm_gpu_model *gm, int il, int half, int n, bool f16);
/* y (+)= W x for n rows of x at x_off (stride ldx); quantized weights take x
 * converted first (once per source region and format: gm->q8_src). A stacked
 * tensor (w->stride): ny rows of y, row a from matrix AU[ids_off + a] and x
 * row a / xdiv. */
void cm_vkm_mm(cm_gpu_model *gm, cm_vk_set *s, const wt *w, uint32_t x_off, uint32_t ldx, int n, uint32_t y_off,
               uint32_t ldy, int ny, uint32_t xdiv, uint32_t ids_off, bool add);
/* y = rms_norm(x) * w (W at w_off) by rows of n, strides ldx and ldy (add: y += that). */
void cm_vkm_rmsnorm(cm_gpu *g, cm_vk_set *s, uint32_t n, uint32_t x_off, uint32_t ldx, uint32_t y_off, uint32_t ldy,
                    uint32_t w_off, float eps, int rows, bool add);
/* RoPE of nh heads of D (first n_rot of each) in n rows (stride ldx) from the cache at c_off. */
void cm_vkm_rope(cm_gpu *g, cm_vk_set *s, uint32_t n_rot, uint32_t D, uint32_t nh, int n, uint32_t x_off, uint32_t ldx,
                 uint32_t c_off, bool neox);

/* ---- the slots mirroring the CPU caches (vk_kv.c) ---- */
/* Words of one cache row of D elements on the device (kvq.glsl). */
uint32_t cm_vkm_kv_row_words(enum cm_type t, int D);
/* The slot of each token of b (into slots[]), re-filling stale ones from
 * the CPU caches. 1; 0: none fits (more sequences than slots, or a cache the
 * device cannot mirror); or a negative error. Under cm_vk_lock. */
int cm_vkm_assign_slots(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, uint32_t *slots, char *err,
                        size_t errlen);
/* This batch's cache types, row words and rotations (gm->bkt .. brv) from
 * kv0, the first cache of the batch (all share its types). */
void cm_vkm_kv_batch_types(cm_gpu_model *gm, const cm_kv *kv0);
/* After a batch: its K and V rows (io's o_k, o_v) into the CPU caches, and
 * each token's slot (slots[]) one position further. */
void cm_vkm_kv_store_batch(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, const float *io,
                           const uint32_t *slots);

/* ---- deepseek2 (vk_mla.c) ---- */
/* Can the device run layer il's latent attention? False with the reason. */
bool cm_vkm_mla_ok(const cm_model *m, int il, char *why, size_t whylen);
/* Device words of deepseek2's extra regions for batches of B (added to the fixed part). */
uint64_t cm_vkm_mla_fixed_words(const cm_hparams *hp, uint64_t B);
/* Record layer il's attention (after attn_norm into o_xn) up to the residual add of wo. */
void cm_vkm_mla_record(cm_gpu_model *gm, int il, int n, bool f16);
/* The latent row of position p of layer il of a CPU cache as floats, and the other way. */
void cm_vkm_latent_read(const cm_kv *kv, int il, int p, float *out);
void cm_vkm_latent_write(const cm_kv *kv, int il, int p, const float *row);

#endif
