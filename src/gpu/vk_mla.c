/*
 * vk_mla.c: deepseek2's multi-head latent attention on the device, step for
 * step as src/model/mla.c computes it (see mla.h for the math): the q_a (or
 * q) and kv_a products, q_a's and kv_cmpr's norms, k_pe's RoPE and the
 * latent row into the cache, wq_b, q_pe's RoPE, the absorbed query wk_b[h] .
 * q_nope of every (token, head) as one stacked product (the head ids in
 * o_hid pick the matrix, as the experts' ids do), attention over the
 * latent rows (mla.comp), then wv_b[h] . o the same way. The cache on the
 * device holds what the CPU's holds, one row of kv_lora + rope floats per
 * position and layer, and nothing per head: never add a per-head cache
 * here. The RoPE caches are forward.c's (cm_model_rope_cache: mla.c's
 * rotation for deepseek2).
 */
#include "vk_model.h"

#include "../kernels/kernels.h"

#include <stdio.h>

/* attn_kv_b's activation type: llama.cpp's MHA view of an unsplit attn_kv_b
 * rounds the latent to it (mla.c, step 3); latround.comp's mode, -1: none,
 * -2: a type it does not round. */
static int round_mode(const cm_layer *L) {
    if (!L->wkv_b.data) return -1;
    switch (cm_type_traits_of(L->wkv_b.type)->vec_dot_type) {
    case CM_TYPE_F32: return -1;
    case CM_TYPE_F16: return 0;
    case CM_TYPE_Q8_0:
    case CM_TYPE_Q8_1: return 1;
    case CM_TYPE_Q8_K: return 2;
    case CM_TYPE_BF16: return 3;
    default: return -2;
    }
}

bool cm_vkm_mla_ok(const cm_model *m, int il, char *why, size_t whylen) {
    const cm_hparams *hp = &m->hp;
    const cm_mla_hparams *a = &hp->mla;
    const cm_layer *L = &m->layers[il];
    const int mode = round_mode(L);
    if (mode == -2 || (mode >= 0 && a->kv_lora % (mode == 2 ? 256 : 32))) {
        snprintf(why, whylen, "layer %d: a latent of %d rounded to %s's activations is not on the GPU", il, a->kv_lora,
                 cm_type_name(L->wkv_b.type));
        return false;
    }
    if (!L->wk_b.data || !L->wv_b.data || L->wk_b.n_dims != 3 || L->wv_b.n_dims != 3 ||
        !(a->q_lora ? L->wq_a.data && L->wq_b.data && L->q_a_norm.data : L->wq.data != NULL)) {
        snprintf(why, whylen, "layer %d: latent attention tensors missing", il);
        return false;
    }
    return true;
}

uint64_t cm_vkm_mla_fixed_words(const cm_hparams *hp, uint64_t B) {
    if (hp->arch != CM_ARCH_DEEPSEEK2) return 0;
    const uint64_t H = (uint64_t)hp->n_head, C = (uint64_t)hp->mla.kv_lora;
    const uint64_t q8 = H * ((C > (uint64_t)hp->mla.head_k ? C : (uint64_t)hp->mla.head_k) / 32 + 1) * 11;
    return B * ((uint64_t)hp->mla.q_lora + 2 * H * C + H + (uint64_t)hp->n_expert +
                (uint64_t)(hp->n_expert_groups > 1 ? hp->n_expert_groups : 1) + q8);
}

/* y = W x over n rows (a 2-D weight). */
static void mm2(cm_gpu_model *gm, cm_vk_set *s, const wt *w, uint32_t x_off, uint32_t ldx, uint32_t y_off, uint32_t ldy,
                int n) {
    cm_vkm_mm(gm, s, w, x_off, ldx, n, y_off, ldy, n, 1, gm->o_ids, false);
}

void cm_vkm_mla_record(cm_gpu_model *gm, int il, int n, bool f16) {
    const cm_hparams *hp = &gm->m->hp;
    const cm_mla_hparams *a = &hp->mla;
    cm_gpu *g = gm->g;
    const glayer *L = &gm->L[il];
    cm_vk_set *s = L->set;
    const uint32_t E = (uint32_t)gm->E, H = (uint32_t)gm->nq, R = (uint32_t)gm->D, C = (uint32_t)a->kv_lora;
    const uint32_t nr = (uint32_t)gm->n_rot, hk = (uint32_t)a->head_k, nope = hk - nr, QL = (uint32_t)a->q_lora;
    const uint32_t ko = gm->o_k + (uint32_t)(il * gm->B) * R, none = UINT32_MAX; /* the latent rows of the batch */
    const int nh = n * (int)H;
    /* 1-2. q_a (or q) and kv_a = [kv_cmpr | k_pe] from the normed input */
    if (QL) mm2(gm, s, &L->wq_a, gm->o_xn, E, gm->o_qa, QL, n);
    else mm2(gm, s, &L->wq, gm->o_xn, E, gm->o_q, H * hk, n);
    mm2(gm, s, &L->wkv_a, gm->o_xn, E, ko, R, n);
    gm->q8_src = none;
    /* 3. q_a's norm; kv_cmpr's norm (and an unsplit attn_kv_b's rounding), k_pe's RoPE, the row into the cache */
    if (QL) cm_vkm_rmsnorm(g, s, QL, gm->o_qa, QL, gm->o_qa, QL, L->q_a_norm.off, hp->rms_eps, n, false);
    cm_vkm_rmsnorm(g, s, C, ko, R, ko, R, L->kv_a_norm.off, hp->rms_eps, n, false);
    const int mode = round_mode(&gm->m->layers[gm->l0 + il]);
    if (mode >= 0) {
        const uint32_t pr[5] = {C, (uint32_t)n, ko, R, (uint32_t)mode};
        cm_vk_dispatch(g, VKP_LATROUND, s, pr, sizeof pr, ((uint32_t)n * (C / (mode == 2 ? 256 : 32)) + 63) / 64, 1);
    }
    cm_vkm_rope(g, s, nr, R, 1, n, ko + C, R, gm->o_rope, false);
    const uint32_t pk[11] = {
        R, 1, (uint32_t)n, (uint32_t)gm->ctx, ko, none, gm->o_meta, (uint32_t)gm->B, 0, gm->slot_stride, f16};
    cm_vk_dispatch(g, VKP_KVSTORE, s, pk, sizeof pk, ((uint32_t)n * R + 63) / 64, 1);
    /* 4. q = wq_b . norm(q_a) */
    if (QL) mm2(gm, s, &L->wq_b, gm->o_qa, QL, gm->o_q, H * hk, n);
    gm->q8_src = none;
    /* 5. q_pe's RoPE; the absorbed queries wk_b[h] . q_nope; attention; wv_b[h] . o */
    cm_vkm_rope(g, s, nr, hk, H, n, gm->o_q + nope, H * hk, gm->o_rope, false);
    cm_vkm_mm(gm, s, &L->wk_b, gm->o_q, hk, nh, gm->o_qabs, C, nh, 1, gm->o_hid, false);
    gm->q8_src = none;
    struct {
        uint32_t C, nr, H, ctx, qa_off, qpe_off, ldqpe, o_off, sc_off, meta_off, B, slot_stride, f16;
        float scale;
    } pa = {C,   nr,         H,        (uint32_t)gm->ctx, gm->o_qabs,      gm->o_q + nope,
            hk,  gm->o_lat,  gm->o_sc, gm->o_meta,        (uint32_t)gm->B, gm->slot_stride,
            f16, a->kq_scale};
    cm_vk_dispatch(g, VKP_MLA_ATTN, s, &pa, sizeof pa, H, (uint32_t)n);
    cm_vkm_mm(gm, s, &L->wv_b, gm->o_lat, C, nh, gm->o_att, (uint32_t)a->head_v, nh, 1, gm->o_hid, false);
    gm->q8_src = none;
}

static size_t latent_off(const cm_kv *kv, int il, int p) {
    return ((size_t)(il - kv->layer_first) * (size_t)kv->n_ctx + (size_t)p) * (size_t)kv->head_dim;
}

void cm_vkm_latent_read(const cm_kv *kv, int il, int p, float *out) {
    const size_t o = latent_off(kv, il, p);
    for (int d = 0; d < kv->head_dim; d++)
        out[d] =
            kv->type == CM_TYPE_F16 ? cm_f16_to_f32(((const cm_f16 *)kv->k)[o + d]) : ((const float *)kv->k)[o + d];
}

void cm_vkm_latent_write(const cm_kv *kv, int il, int p, const float *row) {
    const size_t o = latent_off(kv, il, p);
    for (int d = 0; d < kv->head_dim; d++)
        if (kv->type == CM_TYPE_F16) ((cm_f16 *)kv->k)[o + d] = cm_f32_to_f16(row[d]);
        else ((float *)kv->k)[o + d] = row[d];
}
