/*
 * vk_model.c: a llama-family model's first layers on a Vulkan device: which
 * layers the shaders take (one tensor table drives the support check, the
 * upload and the layer-size estimate), the weights uploaded once and
 * repacked for the shaders (quant scales as F32 apart from the quants, so
 * every read is a whole word; a tensor-parallel member's rows or columns
 * alone), activations for max_batch tokens and a K/V cache of n_seq
 * sequence slots per layer, and the sizes the planner asks for. Recording
 * a layer is vk_record.c's, a batch's submission vk_forward.c's, the
 * slots' mirroring of the CPU caches vk_kv.c's. Never records or submits
 * a forward pass here.
 */
#include "vk_model.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

bool cm_gpu_model_supported(const cm_model *m, char *why, size_t whylen) {
    return cm_gpu_model_supported_range(m, 0, m->hp.n_layer, why, whylen);
}

/* Every tensor a layer may upload: where the model and glayer keep it, its
 * name, and what the shaders take: 'w' a matrix (cm_vk_type_ok), 'v' an F32
 * vector (a norm, a bias, gpt-oss's sinks, deepseek2's selection bias). */
#define T_(lf, gf, name, kind) \
    { offsetof(cm_layer, lf), offsetof(glayer, gf), name, kind }
static const struct {
    size_t lo, go;
    const char *name;
    char kind;
} tensors[] = {
    T_(attn_norm, attn_norm, "attn_norm", 'v'),
    T_(wq, wq, "attn_q", 'w'),
    T_(wk, wk, "attn_k", 'w'),
    T_(wv, wv, "attn_v", 'w'),
    T_(wo, wo, "attn_output", 'w'),
    T_(ffn_norm, ffn_norm, "ffn_norm", 'v'),
    T_(ffn_gate, gate, "ffn_gate", 'w'),
    T_(ffn_up, up, "ffn_up", 'w'),
    T_(ffn_down, down, "ffn_down", 'w'),
    T_(bq, bq, "attn_q.bias", 'v'), /* qwen2 */
    T_(bk, bk, "attn_k.bias", 'v'),
    T_(bv, bv, "attn_v.bias", 'v'),
    T_(q_norm, q_norm, "attn_q_norm", 'v'), /* qwen3, gemma3 */
    T_(k_norm, k_norm, "attn_k_norm", 'v'),
    T_(attn_post_norm, attn_post, "post_attention_norm", 'v'), /* gemma3 */
    T_(ffn_post_norm, ffn_post, "post_ffw_norm", 'v'),
    T_(ffn_gate_inp, router, "ffn_gate_inp", 'w'), /* mixtures of experts */
    T_(ffn_gate_inp_shexp, sh_inp, "ffn_gate_inp_shexp", 'w'),
    T_(ffn_gate_exps, gexp, "ffn_gate_exps", 'w'),
    T_(ffn_up_exps, uexp, "ffn_up_exps", 'w'),
    T_(ffn_down_exps, dexp, "ffn_down_exps", 'w'),
    T_(ffn_gate_shexp, sgate, "ffn_gate_shexp", 'w'),
    T_(ffn_up_shexp, sup, "ffn_up_shexp", 'w'),
    T_(ffn_down_shexp, sdown, "ffn_down_shexp", 'w'),
    T_(bo, bo, "attn_output.bias", 'v'), /* gpt-oss */
    T_(attn_sinks, sinks, "attn_sinks", 'v'),
    T_(ffn_gate_inp_b, router_b, "ffn_gate_inp.bias", 'v'),
    T_(ffn_gate_exps_b, gexp_b, "ffn_gate_exps.bias", 'v'),
    T_(ffn_up_exps_b, uexp_b, "ffn_up_exps.bias", 'v'),
    T_(ffn_down_exps_b, dexp_b, "ffn_down_exps.bias", 'v'),
    T_(wq_a, wq_a, "attn_q_a", 'w'), /* deepseek2 */
    T_(q_a_norm, q_a_norm, "attn_q_a_norm", 'v'),
    T_(wq_b, wq_b, "attn_q_b", 'w'),
    T_(wkv_a, wkv_a, "attn_kv_a_mqa", 'w'),
    T_(kv_a_norm, kv_a_norm, "attn_kv_a_norm", 'v'),
    T_(wk_b, wk_b, "attn_k_b", 'w'),
    T_(wv_b, wv_b, "attn_v_b", 'w'),
    T_(ffn_exp_probs_b, probs_b, "exp_probs_b", 'v'),
};
#undef T_
enum { NW = (int)CM_ARRAY_LEN(tensors) };
static const cm_tensor *tensor_of(const cm_layer *L, int i) {
    return (const cm_tensor *)(const void *)((const char *)L + tensors[i].lo);
}
static wt *wt_of(glayer *gl, int i) { return (wt *)(void *)((char *)gl + tensors[i].go); }

bool cm_gpu_model_supported_range(const cm_model *m, int l0, int l1, char *why, size_t whylen) {
    const cm_hparams *hp = &m->hp;
    const bool oai = hp->arch == CM_ARCH_GPTOSS;
    if ((hp->n_swa && hp->arch != CM_ARCH_GEMMA3 && !oai) || hp->n_rot % 2 || hp->n_rot > hp->head_dim ||
        (hp->rope_type != CM_ROPE_NORM && hp->rope_type != CM_ROPE_NEOX)) {
        snprintf(why, whylen, "the GPU has no sliding window or partial rope of this kind");
        return false;
    }
    if (hp->n_expert_groups > 1 && hp->n_expert % hp->n_expert_groups) {
        snprintf(why, whylen, "%d experts in %d groups", hp->n_expert, hp->n_expert_groups);
        return false;
    }
    for (int il = CM_MAX(l0, 0); il < CM_MIN(l1, hp->n_layer); il++) {
        const cm_layer *L = &m->layers[il];
        if (((L->bo.data || L->attn_sinks.data || L->ffn_gate_inp_b.data || L->ffn_gate_exps_b.data) && !oai) ||
            (!L->ffn_gate.data && !L->ffn_gate_inp.data)) {
            snprintf(why, whylen, "layer %d has an output bias, sinks or no gate (not on the GPU yet)", il);
            return false;
        }
        for (int i = 0; i < NW; i++) {
            const cm_tensor *t = tensor_of(L, i);
            if (!t->data) continue;
            if (tensors[i].kind == 'w' && !cm_vk_type_ok(t, why, whylen, tensors[i].name)) return false;
            if (tensors[i].kind == 'v' && t->type != CM_TYPE_F32) {
                snprintf(why, whylen, "layer %d has a %s %s (the GPU has f32)", il, cm_type_name(t->type),
                         tensors[i].name);
                return false;
            }
        }
        if (hp->arch == CM_ARCH_DEEPSEEK2 && !cm_vkm_mla_ok(m, il, why, whylen)) return false;
    }
    return true;
}

/* Packed words of one expert (of a 2-D tensor: of it), padded to 4 words. */
static uint64_t expert_words(const cm_tensor *w) { return (cm_vk_packed_words(w) + 3) & ~(uint64_t)3; }
static uint64_t tensor_words(const cm_tensor *w) {
    return cm_vk_grid_words(w->type) + expert_words(w) * (uint64_t)(w->n_dims == 3 ? w->ne[2] : 1);
}

/* Pack w at dst: a grid type's grid, then a stacked tensor expert by expert, each at its stride. */
static void pack_tensor(const cm_tensor *w, uint32_t *dst) {
    const int64_t ne = w->n_dims == 3 ? w->ne[2] : 1;
    cm_vk_pack_grid(w->type, dst);
    dst += cm_vk_grid_words(w->type);
    for (int64_t e = 0; e < ne; e++) {
        cm_tensor v = *w;
        v.data = (char *)w->data + (size_t)e * w->nb[2];
        v.ne[2] = 1;
        v.n_dims = CM_MIN(w->n_dims, 2);
        cm_vk_pack(&v, dst + (size_t)e * expert_words(w));
    }
}

/* A tensor-parallel member's part of tensor i of L (forward.c's views:
 * rows of Q, K, V, gate and up, columns of attn_output and ffn_down); the
 * tensor itself otherwise. */
static cm_tensor slice_of(const cm_gpu_model *gm, const cm_layer *L, int i) {
    cm_tensor t = *tensor_of(L, i);
    if (!gm->tp || !t.data) return t;
    const int64_t D = gm->D, rep = gm->m->hp.n_head / gm->m->hp.n_head_kv;
    const cm_slice s = gm->sl;
    int64_t r0 = -1, r1 = 0, c0 = -1, c1 = 0;
    const char *name = tensors[i].name;
    if (!strcmp(name, "attn_q")) r0 = s.h0 * rep * D, r1 = s.h1 * rep * D;
    else if (!strcmp(name, "attn_k") || !strcmp(name, "attn_v")) r0 = s.h0 * D, r1 = s.h1 * D;
    else if (!strcmp(name, "attn_output")) c0 = s.h0 * rep * D, c1 = s.h1 * rep * D;
    else if (!strcmp(name, "ffn_gate") || !strcmp(name, "ffn_up")) r0 = s.f0, r1 = s.f1;
    else if (!strcmp(name, "ffn_down")) c0 = s.f0, c1 = s.f1;
    if (r0 >= 0) {
        t.data = (char *)t.data + (size_t)r0 * t.nb[1];
        t.ne[1] = r1 - r0;
    } else if (c0 >= 0) {
        t.data = (char *)t.data + cm_row_size(t.type, c0);
        t.ne[0] = c1 - c0;
    }
    return t;
}

static int upload_layer(cm_gpu_model *gm, int il, char *err, size_t errlen) {
    const cm_layer *L = &gm->m->layers[gm->l0 + il];
    glayer *gl = &gm->L[il];
    cm_tensor views[NW];
    const cm_tensor *ws[NW];
    wt *ts[NW];
    for (int i = 0; i < NW; i++) views[i] = slice_of(gm, L, i), ws[i] = &views[i], ts[i] = wt_of(gl, i);
    uint64_t words = 0;
    for (int i = 0; i < NW; i++) {
        if (!ws[i]->data) continue; /* an absent bias or norm: K stays 0 */
        *ts[i] = (wt){.off = (uint32_t)words,
                      .type = ws[i]->type,
                      .K = (uint32_t)ws[i]->ne[0],
                      .rows = (uint32_t)ws[i]->ne[1],
                      .stride = ws[i]->n_dims == 3 ? (uint32_t)expert_words(ws[i]) : 0};
        words += tensor_words(ws[i]);
    }
    if (words * 4 > cm_vk_max_range(gm->g))
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "layer %d's %llu weight bytes exceed the device's buffer range",
                       il, (unsigned long long)words * 4);
    uint32_t *host = cm_calloc(words ? words : 1, 4);
    if (!host) return cm_errf(err, errlen, CM_ENOMEM, "out of memory packing layer %d", il);
    for (int i = 0; i < NW; i++)
        if (ws[i]->data) pack_tensor(ws[i], host + ts[i]->off);
    int rc = CM_ENOMEM;
    if ((gl->buf = cm_vk_buf_new(gm->g, words * 4, CM_VK_DEVICE, err, errlen)))
        rc = cm_vk_upload(gm->g, gl->buf, 0, host, words * 4, err, errlen);
    cm_free(host);
    if (!rc && !(gl->kv = cm_vk_buf_new(gm->g, CM_MAX((uint64_t)gm->slot_stride * gm->n_seq * 4, 16), CM_VK_DEVICE, err,
                                        errlen))) /* (a member with no KV heads: none) */
        rc = CM_ENOMEM;
    if (!rc && !(gl->set = cm_vk_set_new(gm->g, gl->buf, gm->act, gl->kv, err, errlen))) rc = CM_ENOMEM;
    return rc;
}

int cm_gpu_model_new(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int n_layers, int max_batch, int n_ctx,
                     int n_seq, char *err, size_t errlen) {
    return cm_gpu_model_new_at(out, g, m, 0, n_layers, max_batch, n_ctx, n_seq, err, errlen);
}

int cm_gpu_model_supported_prefix(const cm_model *m, int l0, int l1, char *why, size_t whylen) {
    if (cm_gpu_model_supported_range(m, l0, l1, why, whylen)) return l1 - l0;
    char w1[256];
    int k = 0;
    while (l0 + k < l1 && cm_gpu_model_supported_range(m, l0 + k, l0 + k + 1, w1, sizeof w1)) k++;
    return k;
}

bool cm_gpu_model_supported_slice(const cm_model *m, int l0, int l1, cm_slice s, char *why, size_t whylen) {
    if (!cm_gpu_model_supported_range(m, l0, l1, why, whylen)) return false;
    const cm_slice f = cm_slice_full(m);
    if (s.h0 == f.h0 && s.h1 == f.h1 && s.f0 == f.f0 && s.f1 == f.f1) return true;
    const cm_hparams *hp = &m->hp;
    if (hp->arch == CM_ARCH_DEEPSEEK2 || hp->n_expert) {
        snprintf(why, whylen, "a tensor-parallel slice of a %s is not on the GPU (dense llama-family layers)",
                 hp->n_expert ? "mixture of experts" : "deepseek2 model");
        return false;
    }
    if (s.h0 < 0 || s.h1 > f.h1 || s.h0 > s.h1 || s.f0 < 0 || s.f1 > f.f1 || s.f0 > s.f1) {
        snprintf(why, whylen, "a slice out of range (heads [%d, %d), FFN rows [%d, %d))", s.h0, s.h1, s.f0, s.f1);
        return false;
    }
    for (int il = CM_MAX(l0, 0); il < CM_MIN(l1, hp->n_layer); il++) {
        const cm_layer *L = &m->layers[il];
        if (L->bq.data || L->bk.data || L->bv.data || L->bo.data || L->attn_post_norm.data || L->ffn_post_norm.data) {
            snprintf(why, whylen, "a tensor-parallel slice of layer %d (biases or post norms) is not on the GPU", il);
            return false;
        }
    }
    return true;
}

uint64_t cm_gpu_layer_bytes(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq) {
    return cm_gpu_layer_bytes_kv(m, il, max_batch, n_ctx, n_seq, CM_TYPE_F32, CM_TYPE_F32);
}

uint64_t cm_gpu_layer_bytes_kv(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq, enum cm_type kv_k,
                               enum cm_type kv_v) {
    return cm_gpu_layer_bytes_slice(m, il, max_batch, n_ctx, n_seq, kv_k, kv_v, cm_slice_full(m));
}

uint64_t cm_gpu_layer_bytes_slice(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq, enum cm_type kv_k,
                                  enum cm_type kv_v, cm_slice sl) {
    uint64_t words = 0;
    for (int i = 0; i < NW; i++)
        if (tensor_of(&m->layers[il], i)->data) words += tensor_words(tensor_of(&m->layers[il], i));
    const cm_hparams *hp = &m->hp;
    const uint64_t slots = (uint64_t)n_ctx * (uint64_t)CM_MAX(n_seq, 1);
    if (hp->arch == CM_ARCH_DEEPSEEK2) { /* the latent rows only */
        const uint64_t KD = (uint64_t)hp->n_head_kv * hp->head_dim;
        return words * 4 + KD * 4 * (slots + (uint64_t)max_batch);
    }
    const int nkv = CM_MAX(0, CM_MIN(sl.h1, hp->n_head_kv) - CM_MAX(sl.h0, 0));
    const uint64_t KD = (uint64_t)nkv * hp->head_dim; /* + the layer's K and V rows of a batch */
    return words * 4 + cm_gpu_kv_bytes(nkv, hp->head_dim, slots, kv_k, kv_v) + 2 * KD * 4 * (uint64_t)max_batch;
}

uint64_t cm_gpu_fixed_bytes(const cm_model *m, int max_batch, int n_ctx) {
    const cm_hparams *hp = &m->hp;
    const uint64_t B = (uint64_t)max_batch, QD = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t F = (uint64_t)CM_MAX(hp->n_ff, hp->n_ff_shexp), E = (uint64_t)hp->n_embd;
    const uint64_t big = CM_MAX(E, CM_MAX(QD, F)), K = (uint64_t)hp->n_expert_used, FX = (uint64_t)hp->n_ff_exp;
    const uint64_t moe = hp->n_expert ? (uint64_t)hp->n_expert + 2 * K + 1 + 2 * K * FX + K * E + E : 0;
    return 4 * B *
               (3 * E + 2 * QD + 2 * F + (uint64_t)hp->n_head * n_ctx + CM_MAX(big / 32 + 1, K * (FX / 32 + 1)) * 11 +
                moe) +
           4 * cm_vkm_mla_fixed_words(hp, B);
}

int cm_gpu_model_new_at(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int layer_first, int n_layers, int max_batch,
                        int n_ctx, int n_seq, char *err, size_t errlen) {
    return cm_gpu_model_new_kv(out, g, m, layer_first, n_layers, max_batch, n_ctx, n_seq, CM_TYPE_F32, CM_TYPE_F32, err,
                               errlen);
}

int cm_gpu_model_new_kv(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int layer_first, int n_layers, int max_batch,
                        int n_ctx, int n_seq, enum cm_type kv_k, enum cm_type kv_v, char *err, size_t errlen) {
    return cm_gpu_model_new_slice(out, g, m, layer_first, n_layers, max_batch, n_ctx, n_seq, kv_k, kv_v,
                                  cm_slice_full(m), err, errlen);
}

int cm_gpu_model_new_slice(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int layer_first, int n_layers,
                           int max_batch, int n_ctx, int n_seq, enum cm_type kv_k, enum cm_type kv_v, cm_slice sl,
                           char *err, size_t errlen) {
    *out = NULL;
    char why[256];
    const cm_hparams *hp = &m->hp;
    if (!cm_gpu_kv_supported(m, kv_k, kv_v, why, sizeof why))
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "gpu: %s", why);
    if (kv_k == CM_TYPE_F16) kv_k = kv_v = CM_TYPE_F32; /* an F16 cache's values are held as floats */
    layer_first = CM_MAX(0, CM_MIN(layer_first, hp->n_layer));
    n_layers = CM_MAX(0, CM_MIN(n_layers, hp->n_layer - layer_first));
    if (!cm_gpu_model_supported_slice(m, layer_first, layer_first + n_layers, sl, why, sizeof why))
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "gpu: %s", why);
    cm_gpu_model *gm = cm_calloc(1, sizeof *gm);
    if (!gm) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    gm->g = g;
    gm->m = m;
    gm->l0 = layer_first;
    gm->nl = n_layers;
    gm->B = max_batch;
    gm->ctx = n_ctx;
    gm->n_seq = CM_MAX(1, n_seq);
    gm->E = hp->n_embd;
    gm->D = hp->head_dim;
    gm->nkv = hp->n_head_kv;
    gm->nq = hp->n_head;
    gm->F = hp->n_ff;
    gm->sl = sl;
    const cm_slice full = cm_slice_full(m);
    gm->tp = sl.h0 != full.h0 || sl.h1 != full.h1 || sl.f0 != full.f0 || sl.f1 != full.f1;
    if (gm->tp) { /* the member's heads and FFN rows */
        gm->nkv = sl.h1 - sl.h0;
        gm->nq = gm->nkv * (hp->n_head / hp->n_head_kv);
        gm->F = sl.f1 - sl.f0;
    }
    gm->QD = gm->nq * gm->D;
    gm->KD = gm->nkv * gm->D;
    gm->n_rot = hp->n_rot;
    gm->mla = hp->arch == CM_ARCH_DEEPSEEK2;
    gm->sh1 = cm_slice_full(m).h1;
    gm->kvk = kv_k;
    gm->kvv = kv_v;
    if (hp->n_expert) {
        gm->nx = hp->n_expert;
        gm->nxk = hp->n_expert_used;
        gm->fx = hp->n_ff_exp;
        gm->fsh = hp->n_ff_shexp;
    }
    const uint64_t B = (uint64_t)gm->B, nl = (uint64_t)CM_MAX(gm->nl, 1);
    uint64_t o = 0;
#define REGION(f, n) gm->f = (uint32_t)o, o += ((uint64_t)(n) + 15) & ~(uint64_t)15
    REGION(o_x, B * gm->E);
    REGION(o_k, nl * B * gm->KD);
    REGION(o_v, gm->mla ? 0 : nl * B * gm->KD);
    REGION(o_rope, B * gm->n_rot);
    REGION(o_rope_swa, B * gm->n_rot); /* the sliding-window layers' rotations (gemma3, gpt-oss) */
    REGION(o_meta, 2 * B);
    gm->o_io_end = (uint32_t)o;
    REGION(o_xn, B * gm->E);
    const cm_mla_hparams *ma = &hp->mla; /* deepseek2 (zero elsewhere) */
    const uint64_t H = (uint64_t)gm->nq, C = (uint64_t)ma->kv_lora;
    REGION(o_q, B * CM_MAX((uint64_t)gm->QD, H * ma->head_k));
    REGION(o_att, B * CM_MAX((uint64_t)gm->QD, H * ma->head_v));
    REGION(o_gate, B * CM_MAX(gm->F, gm->fsh)); /* (qwen2moe's shared expert too) */
    REGION(o_up, B * CM_MAX(gm->F, gm->fsh));
    REGION(o_sc, B * gm->nq * (uint64_t)n_ctx);
    const uint64_t big = (uint64_t)CM_MAX(CM_MAX(gm->E, ma->q_lora), CM_MAX(gm->QD, CM_MAX(gm->F, gm->fsh)));
    const uint64_t XK = (uint64_t)gm->nxk, mla_rows = H * (CM_MAX(C, (uint64_t)ma->head_k) / 32 + 1);
    REGION(o_q8, B * CM_MAX(CM_MAX(big / 32 + 1, XK * ((uint64_t)gm->fx / 32 + 1)), gm->mla ? mla_rows : 0) *
                     11); /* Q8_0 9, Q8_K 81/8 */
    REGION(o_lg, B * gm->nx);
    REGION(o_ids, B * XK);
    REGION(o_ew, B * XK);
    REGION(o_shl, B);
    REGION(o_eg, B * XK * gm->fx);
    REGION(o_eu, B * XK * gm->fx);
    REGION(o_ey, B * XK * gm->E);
    REGION(o_sy, gm->fsh ? B * gm->E : 0);
    const bool ds_route = hp->expert_sigmoid || hp->n_expert_groups > 1 || gm->mla;
    REGION(o_sel, ds_route ? B * gm->nx : 0);
    REGION(o_gs, ds_route ? B * CM_MAX(hp->n_expert_groups, 1) : 0);
    REGION(o_qa, B * ma->q_lora);
    REGION(o_qabs, B * H * C);
    REGION(o_lat, B * H * C);
    REGION(o_hid, gm->mla ? B * H : 0);
#undef REGION
    /* A buffer per layer: [slot][K|V][head][ctx][row] (deepseek2: [slot][ctx][D], the latent rows); a
     * row is D floats, or a quantized cache's blocks (kvq.glsl) */
    const uint64_t slot =
        gm->mla ? (uint64_t)gm->nkv * n_ctx * gm->D
                : (uint64_t)gm->nkv * n_ctx * (cm_vkm_kv_row_words(kv_k, gm->D) + cm_vkm_kv_row_words(kv_v, gm->D));
    while (gm->n_seq > 1 && (slot * gm->n_seq >= (1ull << 32) || slot * gm->n_seq * 4 > cm_vk_max_range(g)))
        gm->n_seq--;
    gm->slot_stride = (uint32_t)slot;
    int rc = 0;
    if (o >= (1ull << 32) || o * 4 > cm_vk_max_range(g) || slot * 4 > cm_vk_max_range(g) || slot >= (1ull << 32))
        rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "gpu: batch %d / context %d need buffers past the device's range",
                     max_batch, n_ctx);
    gm->L = cm_calloc((size_t)nl, sizeof *gm->L);
    gm->slot_kv = cm_calloc((size_t)gm->n_seq, sizeof *gm->slot_kv);
    gm->slot_valid = cm_calloc((size_t)gm->n_seq, sizeof *gm->slot_valid);
    gm->slot_used = cm_calloc((size_t)gm->n_seq, sizeof *gm->slot_used);
    gm->tmp = cm_calloc((size_t)n_ctx * gm->D, sizeof(float));
    if (gm->tp && !(gm->part = cm_calloc((size_t)B * gm->E, sizeof(float)))) rc = CM_ENOMEM;
    if (!rc && (!gm->L || !gm->slot_kv || !gm->slot_valid || !gm->slot_used || !gm->tmp))
        rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (!rc && (!(gm->act = cm_vk_buf_new(g, o * 4, CM_VK_DEVICE, err, errlen)) ||
                !(gm->io = cm_vk_buf_new(g, (uint64_t)gm->o_io_end * 4, CM_VK_HOST, err, errlen))))
        rc = CM_ENOMEM;
    for (int il = 0; !rc && il < gm->nl; il++) rc = upload_layer(gm, il, err, errlen);
    if (!rc && gm->mla) { /* the head of each (token, head) row: the stacked wk_b / wv_b's matrix (vk_mla.c) */
        uint32_t *hid = cm_calloc((size_t)(B * H), sizeof *hid);
        if (!hid) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        for (uint64_t a = 0; hid && a < B * H; a++) hid[a] = (uint32_t)(a % H);
        if (hid) rc = cm_vk_upload(g, gm->act, (uint64_t)gm->o_hid * 4, hid, B * H * 4, err, errlen);
        cm_free(hid);
    }
    if (rc) {
        cm_gpu_model_free(gm);
        return rc;
    }
    *out = gm;
    return 0;
}

void cm_gpu_model_free(cm_gpu_model *gm) {
    if (!gm) return;
    for (int il = 0; gm->L && il < gm->nl; il++) {
        cm_vk_set_free(gm->g, gm->L[il].set);
        cm_vk_buf_free(gm->g, gm->L[il].buf);
        cm_vk_buf_free(gm->g, gm->L[il].kv);
    }
    cm_vk_buf_free(gm->g, gm->act);
    cm_vk_buf_free(gm->g, gm->io);
    cm_free(gm->L);
    cm_free(gm->slot_kv);
    cm_free(gm->slot_valid);
    cm_free(gm->slot_used);
    cm_free(gm->tmp);
    cm_free(gm->part);
    cm_free(gm);
}

int cm_gpu_model_layers(const cm_gpu_model *gm) { return gm ? gm->nl : 0; }
void cm_gpu_model_batches(const cm_gpu_model *gm, uint64_t *took, uint64_t *declined) {
    *took = gm ? gm->n_took : 0;
    *declined = gm ? gm->n_declined : 0;
}

int cm_gpu_model_reslice(cm_gpu_model **gmp, cm_slice s, char *err, size_t errlen) {
    cm_gpu_model *gm = *gmp;
    if (!gm) return cm_errf(err, errlen, CM_EINVAL, "gpu: no model on the device");
    const cm_slice cur = gm->sl;
    if (s.h0 == cur.h0 && s.h1 == cur.h1 && s.f0 == cur.f0 && s.f1 == cur.f1) return 0;
    int rc;
    cm_gpu *g = gm->g;
    const cm_model *m = gm->m;
    const int l0 = gm->l0, nl = gm->nl, B = gm->B, ctx = gm->ctx, n_seq = gm->n_seq;
    const enum cm_type kk = gm->kvk, kv = gm->kvv;
    cm_gpu_model_free(gm); /* first: the device need not hold two uploads */
    *gmp = NULL;
    if ((rc = cm_gpu_model_new_slice(gmp, g, m, l0, nl, B, ctx, n_seq, kk, kv, s, err, errlen))) return rc;
    return 1;
}
const char *cm_gpu_model_device(const cm_gpu_model *gm) { return gm ? cm_gpu_info_of(gm->g)->name : ""; }
