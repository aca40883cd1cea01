/*
 * vk_record.c: recording a layer's ops into the open command buffer (the
 * shaders in src/gpu/shaders): the llama-family attention (gemma3's,
 * qwen2's and qwen3's variants, a quantized cache's rotations), the dense
 * FFN, the mixture-of-experts FFNs of qwen3moe, qwen2moe, Mixtral and
 * gpt-oss (record_moe), and a tensor-parallel member's halves. The
 * arithmetic is F32 with F32 activations (the CPU converts activations to
 * the weight's vec_dot_type first, and so do the shaders here), so logits
 * agree with the CPU path to about 1e-3, not bit for bit; an F16 cache is
 * emulated by rounding what the CPU rounds. Only records: never begins,
 * submits or touches host memory.
 */
#include "vk_model.h"

#include <math.h>

/* (vk_model.h) Quantized weights take x converted to Q8_0, Q8_1 or Q8_K. */
void cm_vkm_mm(cm_gpu_model *gm, cm_vk_set *s, const wt *w, uint32_t x_off, uint32_t ldx, int n, uint32_t y_off,
               uint32_t ldy, int ny, uint32_t xdiv, uint32_t ids_off, bool add) {
    const enum cm_type act = cm_vk_act_type((enum cm_type)w->type);
    if (act != CM_TYPE_F32) {
        if (gm->q8_src != x_off || gm->q8_type != (uint32_t)act) {
            const uint32_t bs = act == CM_TYPE_Q8_K ? 256 : 32, pq[5] = {w->K, (uint32_t)n, x_off, ldx, gm->o_q8};
            cm_vk_dispatch(gm->g, cm_vk_act_pipe(act), s, pq, sizeof pq, ((uint32_t)n * (w->K / bs) + 63) / 64, 1);
            gm->q8_src = x_off;
            gm->q8_type = (uint32_t)act;
        }
        x_off = gm->o_q8;
        ldx = cm_vk_act_words(act, w->K);
    }
    const uint32_t p[12] = {w->K, w->rows, (uint32_t)ny, w->off, x_off, ldx, y_off, ldy, add, ids_off, w->stride, xdiv};
    cm_vk_dispatch(gm->g, cm_vk_mm_pipe((enum cm_type)w->type), s, p, sizeof p, w->rows,
                   w->stride ? (uint32_t)ny : (uint32_t)(ny + 7) / 8);
}
static void mm(cm_gpu_model *gm, cm_vk_set *s, const wt *w, uint32_t x_off, uint32_t ldx, uint32_t y_off, uint32_t ldy,
               int n, bool add) {
    cm_vkm_mm(gm, s, w, x_off, ldx, n, y_off, ldy, n, 1, gm->o_ids, add);
}
/* A stacked expert tensor: row a of y from expert AU[o_ids + a]. */
static void mm_rows(cm_gpu_model *gm, cm_vk_set *s, const wt *w, uint32_t x_off, uint32_t ldx, int n, uint32_t y_off,
                    uint32_t ldy, int ny, uint32_t xdiv, bool add) {
    cm_vkm_mm(gm, s, w, x_off, ldx, n, y_off, ldy, ny, xdiv, gm->o_ids, add);
}

/* silu(g) * u over n elements in place of g (gelu: gemma3's). */
static void glu(cm_gpu *g, cm_vk_set *s, bool gelu, uint32_t n, uint32_t g_off, uint32_t u_off) {
    const uint32_t ps[3] = {n, g_off, u_off};
    cm_vk_dispatch(g, gelu ? VKP_GELU : VKP_SILU, s, ps, sizeof ps, (n + 63) / 64, 1);
}

/* y_j += b for n rows of k elements at y_off, stride ld (bias.comp): b the
 * vector at b_off of the layer buffer, or (ids != ~0u) row j's expert's row
 * of a stacked bias there, or (src_a) row j of A at b_off. */
static void add_rows(cm_gpu *g, cm_vk_set *s, uint32_t k, int n, uint32_t y_off, uint32_t ld, uint32_t b_off,
                     uint32_t ids, bool src_a) {
    const uint32_t p[7] = {k, (uint32_t)n, y_off, ld, b_off, ids, src_a};
    cm_vk_dispatch(g, VKP_BIAS, s, p, sizeof p, (k * (uint32_t)n + 63) / 64, 1);
}
/* y_j += b (w) for n rows of w->K at y_off, stride ld. */
static void bias(cm_gpu *g, cm_vk_set *s, const wt *w, uint32_t y_off, uint32_t ld, int n) {
    add_rows(g, s, w->K, n, y_off, ld, w->off, UINT32_MAX, false);
}

/* A mixture-of-experts FFN (moe.c's arithmetic): router logits, the top k
 * and their weights per token (moeroute.comp), each (token, slot)'s expert
 * gate/up/down from the stacked tensors, qwen2moe's shared expert, and the
 * weighted sum in top-k order added to the residual (moesum.comp). */
static void record_moe(cm_gpu_model *gm, cm_vk_set *s, const glayer *L, int n) {
    const cm_hparams *hp = &gm->m->hp;
    const uint32_t E = (uint32_t)gm->E, NX = (uint32_t)gm->nx, K = (uint32_t)gm->nxk, FX = (uint32_t)gm->fx;
    const uint32_t FS = (uint32_t)gm->fsh, none = UINT32_MAX;
    const int na = n * gm->nxk;
    mm(gm, s, &L->router, gm->o_xn, E, gm->o_lg, NX, n, false);
    if (L->router_b.K) bias(gm->g, s, &L->router_b, gm->o_lg, NX, n); /* gpt-oss */
    if (L->sh_inp.K) mm(gm, s, &L->sh_inp, gm->o_xn, E, gm->o_shl, 1, n, false);
    /* deepseek2: sigmoid or softmax, the selection bias, group-limited top-k (moeroute.comp) */
    const bool ds = hp->expert_sigmoid || hp->n_expert_groups > 1 || L->probs_b.K;
    struct {
        uint32_t ntok, nx, k, lg_off, ids_off, w_off, norm;
        float scale;
        uint32_t sh_off, oai, sig, bias_off, groups, groups_used, sel_off, gs_off;
    } pr = {(uint32_t)n,
            NX,
            K,
            gm->o_lg,
            gm->o_ids,
            gm->o_ew,
            hp->expert_norm,
            hp->expert_scale,
            L->sh_inp.K ? gm->o_shl : none,
            hp->arch == CM_ARCH_GPTOSS,
            hp->expert_sigmoid,
            L->probs_b.K ? L->probs_b.off : none,
            (uint32_t)hp->n_expert_groups,
            (uint32_t)hp->n_group_used,
            ds ? gm->o_sel : none,
            gm->o_gs};
    cm_vk_dispatch(gm->g, VKP_MOE_ROUTE, s, &pr, sizeof pr, ((uint32_t)n + 63) / 64, 1);
    mm_rows(gm, s, &L->gexp, gm->o_xn, E, n, gm->o_eg, FX, na, K, false);
    mm_rows(gm, s, &L->uexp, gm->o_xn, E, n, gm->o_eu, FX, na, K, false);
    if (L->gexp_b.K) { /* gpt-oss: gate and up plus their expert's bias, the clamped SwiGLU */
        add_rows(gm->g, s, FX, na, gm->o_eg, FX, L->gexp_b.off, gm->o_ids, false);
        add_rows(gm->g, s, FX, na, gm->o_eu, FX, L->uexp_b.off, gm->o_ids, false);
        const uint32_t ps[3] = {(uint32_t)na * FX, gm->o_eg, gm->o_eu};
        cm_vk_dispatch(gm->g, VKP_SWIGLU_OAI, s, ps, sizeof ps, ((uint32_t)na * FX + 63) / 64, 1);
    } else glu(gm->g, s, false, (uint32_t)na * FX, gm->o_eg, gm->o_eu);
    mm_rows(gm, s, &L->dexp, gm->o_eg, FX, na, gm->o_ey, E, na, 1, false);
    if (L->dexp_b.K) add_rows(gm->g, s, E, na, gm->o_ey, E, L->dexp_b.off, gm->o_ids, false);
    if (L->sgate.K) {
        mm(gm, s, &L->sgate, gm->o_xn, E, gm->o_gate, FS, n, false);
        mm(gm, s, &L->sup, gm->o_xn, E, gm->o_up, FS, n, false);
        glu(gm->g, s, false, (uint32_t)n * FS, gm->o_gate, gm->o_up);
        mm(gm, s, &L->sdown, gm->o_gate, FS, gm->o_sy, E, n, false);
    }
    const uint32_t ps[8] = {
        (uint32_t)n, E, K, gm->o_ey, gm->o_ew, gm->o_x, L->sgate.K ? gm->o_sy : none, L->sh_inp.K ? gm->o_shl : none};
    cm_vk_dispatch(gm->g, VKP_MOE_SUM, s, ps, sizeof ps, ((uint32_t)n * E + 63) / 64, 1);
}

void cm_vkm_rmsnorm(cm_gpu *g, cm_vk_set *s, uint32_t n, uint32_t x_off, uint32_t ldx, uint32_t y_off, uint32_t ldy,
                    uint32_t w_off, float eps, int rows, bool add) {
    struct {
        uint32_t n, x_off, ldx, y_off, ldy, w_off;
        float eps;
        uint32_t add;
    } p = {n, x_off, ldx, y_off, ldy, w_off, eps, add};
    cm_vk_dispatch(g, VKP_RMSNORM, s, &p, sizeof p, (uint32_t)rows, 1);
}
/* y = rms_norm(x) * w by rows of n (add: y += that). */
static void rmsnorm_to(cm_gpu *g, cm_vk_set *s, uint32_t n, uint32_t x_off, uint32_t y_off, uint32_t w_off, float eps,
                       int rows, bool add) {
    cm_vkm_rmsnorm(g, s, n, x_off, n, y_off, n, w_off, eps, rows, add);
}
static void rmsnorm(cm_gpu *g, cm_vk_set *s, uint32_t n, uint32_t x_off, uint32_t y_off, uint32_t w_off, float eps,
                    int rows) {
    rmsnorm_to(g, s, n, x_off, y_off, w_off, eps, rows, false);
}

/* The residual gets W x (+ gemma3: through the post norm pn; gpt-oss: plus
 * the bias b): y += W x, y += rms_norm(W x) * pn or y += (W x + b) by way of
 * o_xn, in forward.c's order. */
static void mm_residual(cm_gpu_model *gm, cm_vk_set *s, const wt *w, const wt *pn, const wt *b, uint32_t x_off,
                        uint32_t ldx, int n) {
    const uint32_t E = (uint32_t)gm->E;
    gm->q8_src = UINT32_MAX;
    if (!pn->K && !b->K) {
        mm(gm, s, w, x_off, ldx, gm->o_x, E, n, true);
        return;
    }
    mm(gm, s, w, x_off, ldx, gm->o_xn, E, n, false);
    if (pn->K) {
        rmsnorm_to(gm->g, s, E, gm->o_xn, gm->o_x, pn->off, gm->m->hp.rms_eps, n, true);
        return;
    }
    bias(gm->g, s, b, gm->o_xn, E, n);
    add_rows(gm->g, s, E, n, gm->o_x, E, gm->o_xn, UINT32_MAX, true);
}

void cm_vkm_rope(cm_gpu *g, cm_vk_set *s, uint32_t n_rot, uint32_t D, uint32_t nh, int n, uint32_t x_off, uint32_t ldx,
                 uint32_t c_off, bool neox) {
    const uint32_t p[8] = {n_rot, D, nh, (uint32_t)n, x_off, ldx, c_off, neox};
    cm_vk_dispatch(g, VKP_ROPE, s, p, sizeof p, ((uint32_t)n * nh * (n_rot / 2) + 63) / 64, 1);
}

/* In place on n token rows (stride ldx) of nh heads of D at x_off: times
 * pre, the Walsh-Hadamard rotation of blocks of rot (0: none), then with q8
 * rounded through Q8_0 (fwht.comp). */
static void fwht(cm_gpu *g, cm_vk_set *s, uint32_t D, uint32_t nh, int n, uint32_t x_off, uint32_t ldx, uint32_t rot,
                 bool q8, float pre) {
    struct {
        uint32_t D, nh, n, x_off, ldx, rot;
        float scale;
        uint32_t q8;
        float pre;
    } p = {D, nh, (uint32_t)n, x_off, ldx, rot, rot ? 1.0f / sqrtf((float)rot) : 1.0f, q8, pre};
    cm_vk_dispatch(g, VKP_FWHT, s, &p, sizeof p, (uint32_t)n * nh, 1);
}

/* A llama-family attention (o_xn the normed input) into o_att. */
static void record_attn(cm_gpu_model *gm, int il, int n, bool f16) {
    const cm_hparams *hp = &gm->m->hp;
    cm_gpu *g = gm->g;
    glayer *L = &gm->L[il];
    cm_vk_set *s = L->set;
    const uint32_t E = (uint32_t)gm->E, QD = (uint32_t)gm->QD, KD = (uint32_t)gm->KD;
    const uint32_t ko = gm->o_k + (uint32_t)(il * gm->B) * KD, vo = gm->o_v + (uint32_t)(il * gm->B) * KD;
    const bool neox = hp->rope_type == CM_ROPE_NEOX, swa = cm_layer_is_swa(hp, gm->l0 + il);
    const uint32_t rc = swa ? gm->o_rope_swa : gm->o_rope;
    mm(gm, s, &L->wq, gm->o_xn, E, gm->o_q, QD, n, false);
    mm(gm, s, &L->wk, gm->o_xn, E, ko, KD, n, false);
    mm(gm, s, &L->wv, gm->o_xn, E, vo, KD, n, false);
    /* qwen2's biases, then qwen3's per-head norms (rows of D), before RoPE as on the CPU */
    if (L->bq.K) bias(g, s, &L->bq, gm->o_q, QD, n);
    if (L->bk.K) bias(g, s, &L->bk, ko, KD, n);
    if (L->bv.K) bias(g, s, &L->bv, vo, KD, n);
    if (L->q_norm.K) rmsnorm(g, s, (uint32_t)gm->D, gm->o_q, gm->o_q, L->q_norm.off, hp->rms_eps, n * gm->nq);
    if (L->k_norm.K) rmsnorm(g, s, (uint32_t)gm->D, ko, ko, L->k_norm.off, hp->rms_eps, n * gm->nkv);
    cm_vkm_rope(g, s, (uint32_t)gm->n_rot, (uint32_t)gm->D, (uint32_t)gm->nq, n, gm->o_q, QD, rc, neox);
    cm_vkm_rope(g, s, (uint32_t)gm->n_rot, (uint32_t)gm->D, (uint32_t)gm->nkv, n, ko, KD, rc, neox);
    const uint32_t layer_base = 0; /* the layer's own buffer */
    const bool quant = gm->bkt >= 2;
    const float qscale = hp->attn_q_scale != 0.0f ? hp->attn_q_scale : 1.0f;
    if (!quant) {
        const uint32_t pk[11] = {(uint32_t)gm->D, (uint32_t)gm->nkv, (uint32_t)n, (uint32_t)gm->ctx, ko, vo,
                                 gm->o_meta,      (uint32_t)gm->B,   layer_base,  gm->slot_stride,   f16};
        cm_vk_dispatch(g, VKP_KVSTORE, s, pk, sizeof pk, ((uint32_t)n * KD + 63) / 64, 1);
    } else { /* quantized on the device as the CPU stores them; the query rotated and rounded as attn.c's */
        struct {
            uint32_t D, nkv, ntok, ctx, k_off, v_off, ld, meta_off, B, layer_base, slot_stride, kt, vt, krw, vrw, rk,
                rv;
            float sk, sv;
        } pq = {(uint32_t)gm->D,
                (uint32_t)gm->nkv,
                (uint32_t)n,
                (uint32_t)gm->ctx,
                ko,
                vo,
                KD,
                gm->o_meta,
                (uint32_t)gm->B,
                layer_base,
                gm->slot_stride,
                gm->bkt,
                gm->bvt,
                gm->bkrw,
                gm->bvrw,
                gm->brk,
                gm->brv,
                gm->brk ? 1.0f / sqrtf((float)gm->brk) : 1.0f,
                gm->brv ? 1.0f / sqrtf((float)gm->brv) : 1.0f};
        cm_vk_dispatch(g, VKP_KVQ, s, &pq, sizeof pq, (uint32_t)n * (uint32_t)gm->nkv, 2);
        fwht(g, s, (uint32_t)gm->D, (uint32_t)gm->nq, n, gm->o_q, QD, gm->brk, true, qscale);
    }
    struct {
        uint32_t D, nq, rep, nkv, ctx, ldq, q_off, o_off, sc_off, meta_off, B, layer_base, slot_stride, f16, swa;
        float scale, qscale; /* gemma3 (and phi3): q times attn_q_scale, softmax scale 1 */
        uint32_t sink_off;   /* gpt-oss */
        uint32_t kt, vt, krw, vrw;
    } pa = {(uint32_t)gm->D,
            (uint32_t)gm->nq,
            (uint32_t)(gm->nq / gm->nkv),
            (uint32_t)gm->nkv,
            (uint32_t)gm->ctx,
            QD,
            gm->o_q,
            gm->o_att,
            gm->o_sc,
            gm->o_meta,
            (uint32_t)gm->B,
            layer_base,
            gm->slot_stride,
            f16,
            swa ? (uint32_t)hp->n_swa : 0,
            hp->attn_q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)gm->D),
            quant ? 1.0f : qscale, /* (a quantized cache's query was scaled by fwht) */
            L->sinks.K ? L->sinks.off : UINT32_MAX,
            gm->bkt,
            gm->bvt,
            gm->bkrw,
            gm->bvrw};
    cm_vk_dispatch(g, VKP_ATTN, s, &pa, sizeof pa, (uint32_t)gm->nq, (uint32_t)n);
    if (quant && gm->brv) fwht(g, s, (uint32_t)gm->D, (uint32_t)gm->nq, n, gm->o_att, QD, gm->brv, false, 1.0f);
}

void cm_vkm_record_layer(cm_gpu_model *gm, int il, int n, bool f16) {
    const cm_hparams *hp = &gm->m->hp;
    cm_gpu *g = gm->g;
    glayer *L = &gm->L[il];
    cm_vk_set *s = L->set;
    const uint32_t E = (uint32_t)gm->E, F = (uint32_t)gm->F;
    rmsnorm(g, s, E, gm->o_x, gm->o_xn, L->attn_norm.off, hp->rms_eps, n);
    gm->q8_src = UINT32_MAX;
    if (gm->mla) cm_vkm_mla_record(gm, il, n, f16); /* deepseek2's latent attention (vk_mla.c) */
    else record_attn(gm, il, n, f16);
    const uint32_t HV = gm->mla ? (uint32_t)(gm->nq * hp->mla.head_v) : (uint32_t)gm->QD;
    mm_residual(gm, s, &L->wo, &L->attn_post, &L->bo, gm->o_att, HV, n);
    rmsnorm(g, s, E, gm->o_x, gm->o_xn, L->ffn_norm.off, hp->rms_eps, n);
    gm->q8_src = UINT32_MAX;
    if (L->router.K) {
        record_moe(gm, s, L, n);
        return;
    }
    mm(gm, s, &L->gate, gm->o_xn, E, gm->o_gate, F, n, false);
    mm(gm, s, &L->up, gm->o_xn, E, gm->o_up, F, n, false);
    glu(g, s, hp->arch == CM_ARCH_GEMMA3, (uint32_t)n * F, gm->o_gate, gm->o_up);
    const wt nobias = {0};
    mm_residual(gm, s, &L->down, &L->ffn_post, &nobias, gm->o_gate, F, n);
}

void cm_vkm_record_half(cm_gpu_model *gm, int il, int half, int n, bool f16) {
    const int E = gm->E;
    const uint32_t QD = (uint32_t)gm->QD, F = (uint32_t)gm->F;
    glayer *L = &gm->L[il];
    cm_vk_set *s = L->set;
    rmsnorm(gm->g, s, (uint32_t)E, gm->o_x, gm->o_xn, half ? L->ffn_norm.off : L->attn_norm.off, gm->m->hp.rms_eps, n);
    gm->q8_src = UINT32_MAX;
    if (!half) {
        record_attn(gm, il, n, f16);
        gm->q8_src = UINT32_MAX;
        mm(gm, s, &L->wo, gm->o_att, QD, gm->o_x, (uint32_t)E, n, false);
    } else {
        mm(gm, s, &L->gate, gm->o_xn, (uint32_t)E, gm->o_gate, F, n, false);
        mm(gm, s, &L->up, gm->o_xn, (uint32_t)E, gm->o_up, F, n, false);
        glu(gm->g, s, false, (uint32_t)n * F, gm->o_gate, gm->o_up);
        gm->q8_src = UINT32_MAX;
        mm(gm, s, &L->down, gm->o_gate, F, gm->o_x, (uint32_t)E, n, false);
    }
}
