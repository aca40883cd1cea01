/*
 * forward_ctx.h: the forward pass's private state (struct cm_ctx) and the
 * ops forward.c shares with attn_layer.c. Private to src/model: nothing
 * outside forward.c, ctx.c and attn_layer.c includes it.
 *
 * The ops are called by every thread of a pool run (ith of nth); those that
 * end in a barrier say so. None allocates.
 */
#ifndef CM_FORWARD_CTX_H
#define CM_FORWARD_CTX_H

#include "lora.h"
#include "mla.h"
#include "model.h"
#include "moe.h"

enum phase { PH_EMBED, PH_ATTN, PH_FFN, PH_MOE_COMBINE, PH_FINAL };

struct cm_ctx {
    const cm_model *m;
    const cm_kernels *k;
    cm_pool *pool;
    int max_batch, max_ctx, n_threads;
    float *x, *xn, *q, *kc, *vc, *att, *part, *gate, *up, *rope, *rope_swa, *scores;
    float *split;   /* attn_layer.c's decode over KV blocks: per-thread scratch, then the partials */
    bool split_off; /* cm_ctx_set_attn_split(c, false) */
    uint8_t *xq;
    size_t xq_size; /* bytes of xq */
    int32_t *out_rows;
    /* per call */
    const cm_batch *b;
    const cm_forward_args *a;
    enum phase ph;
    int il, n_out;
    bool pending;                           /* part holds a reduced output to add into x */
    const float *pending_norm;              /* gemma3: RMS-norm weights applied to part before the add, or NULL */
    const float *pending_bias;              /* gpt-oss: attn_output's bias added to part before the add, or NULL */
    cm_tensor wq, wk, wv, wo, gt, up_w, dn; /* slice views of layer il */
    int bad_token;
    cm_act_hook_fn hook; /* tests only (model.h) */
    void *hook_user;
    cm_moe *moe;            /* MoE models: the expert FFN's scratch (moe.c) */
    cm_mla *mla;            /* deepseek2: the latent attention's scratch (mla.c) */
    bool ep_gather;         /* this pass: an expert slice, combined after the caller's gather */
    const cm_lora *lora;    /* LoRA adapters (lora.h), or NULL */
    const float **lrow;     /* [max_batch]: this pass's per-row adapter scales (NULL: defaults) */
    const float **lrow_out; /* [max_batch]: the same for the rows whose logits are produced */
    bool lrows;             /* this pass has per-row scales (cm_forward_args.lora_scales) */
    cm_offload_fn offload;  /* the first layers elsewhere (a GPU), or NULL */
    void *offload_user;
};

/* Floats of attention scratch per thread: scores [max_ctx], the query as
 * F16 [head_dim halves], the scores as F16 [max_ctx halves] (F16 cache). */
static inline size_t cm_fwd_scores_stride(int max_ctx, int head_dim) {
    const size_t flash = (cm_attn_scratch_bytes(head_dim) + 3) / 4; /* a rows-layout cache (attn.c) */
    return CM_MAX((size_t)max_ctx + (size_t)head_dim + ((size_t)max_ctx + 1) / 2 + 16, flash + 16);
}

/* forward.c's ops (see each one's comment there). */
void cm_fwd_convert(cm_ctx *c, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt, const float *x, void *xq,
                    int64_t n);
void cm_fwd_rms_norm_row(const float *x, const float *w, float *y, int n, float eps);
const void *cm_fwd_prep_act(cm_ctx *c, enum cm_act_site site, const cm_tensor *w, const float *x, int64_t ld,
                            int64_t ncols, int n_tok, size_t *stride, int ith, int nth); /* ends in a barrier */
void cm_fwd_matmul(cm_ctx *c, const cm_tensor *w, const void *xq, size_t xs, int n_tok, float *y, int64_t ldy, int ith,
                   int nth);
void cm_fwd_add_pending(cm_ctx *c, int ith, int nth); /* ends in a barrier */
void cm_fwd_zero_part(cm_ctx *c, int ith, int nth);
const void *cm_fwd_add_norm_prep(cm_ctx *c, enum cm_act_site site, const cm_tensor *normw, const cm_tensor *w,
                                 size_t *stride, int ith, int nth); /* ends in a barrier */

/* attn_layer.c: layer c->il's attention up to attn_output's partial sum in
 * c->part (the PH_ATTN pool run). */
void cm_fwd_attn(cm_ctx *c, int ith, int nth);
/* Floats of cm_ctx.split (allocated lazily: calloc'd pages cost nothing until touched). */
size_t cm_fwd_split_floats(const cm_model *m, int max_ctx, int n_threads);

#endif
