/*
 * vk_model.c: a llama-family model's first layers on a Vulkan device (the
 * shaders in src/gpu/shaders; gemma3's, and the mixture-of-experts FFNs of
 * qwen3moe, qwen2moe and Mixtral, record_moe): weights uploaded once, repacked for the
 * shaders (quant scales as F32 apart from the quants, so every read is a
 * whole word); activations for max_batch tokens; a K/V cache of n_seq
 * sequence slots. One forward = one command buffer for all the device's
 * layers and one wait.
 *
 * The CPU's caches stay the truth: the device's K and V rows come back and
 * are stored there too, and a slot whose sequence the device has not kept
 * up with (the CPU ran a batch, a truncation, a copy) is re-filled from
 * the CPU cache. The arithmetic is F32 with F32 activations (the CPU
 * converts activations to the weight's vec_dot_type first), so logits agree
 * with the CPU path to about 1e-3, not bit for bit; an F16 cache is
 * emulated by rounding what the CPU rounds.
 */
#include "vk_model.h"

#include "../kernels/kernels.h"

#include <math.h>
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

static bool kv_quant(enum cm_type t) { return t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0; }
/* Words of one cache row of D elements on the device (kvq.glsl). */
static uint32_t kv_row_words(enum cm_type t, int D) {
    return t == CM_TYPE_Q8_0 ? (uint32_t)D / 32 * 9 : t == CM_TYPE_Q4_0 ? (uint32_t)D / 32 * 5 : (uint32_t)D;
}
static uint32_t kv_code(enum cm_type t) {
    return t == CM_TYPE_F16 ? 1 : t == CM_TYPE_Q8_0 ? 2 : t == CM_TYPE_Q4_0 ? 3 : 0;
}

bool cm_gpu_kv_supported(const cm_model *m, enum cm_type kv_k, enum cm_type kv_v, char *why, size_t whylen) {
    if ((kv_k == CM_TYPE_F32 || kv_k == CM_TYPE_F16) && kv_v == kv_k) return true;
    if (!kv_quant(kv_k) || !kv_quant(kv_v)) {
        snprintf(why, whylen, "a %s/%s KV cache is not on the GPU (f32, f16, or q8_0/q4_0 for both)",
                 cm_type_name(kv_k), cm_type_name(kv_v));
        return false;
    }
    if (m->hp.arch == CM_ARCH_DEEPSEEK2 || m->hp.head_dim % 32) {
        snprintf(why, whylen, "a %s/%s KV cache of this model is not on the GPU (deepseek2, or head size %d)",
                 cm_type_name(kv_k), cm_type_name(kv_v), m->hp.head_dim);
        return false;
    }
    return true;
}

uint64_t cm_gpu_layer_bytes(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq) {
    return cm_gpu_layer_bytes_kv(m, il, max_batch, n_ctx, n_seq, CM_TYPE_F32, CM_TYPE_F32);
}

uint64_t cm_gpu_kv_bytes(int n_kv_heads, int head_dim, uint64_t n_pos, enum cm_type kv_k, enum cm_type kv_v) {
    if (!kv_quant(kv_k) || !kv_quant(kv_v)) kv_k = kv_v = CM_TYPE_F32; /* (an F16 cache's slots hold floats) */
    const uint64_t row = (uint64_t)kv_row_words(kv_k, head_dim) + kv_row_words(kv_v, head_dim);
    return (uint64_t)CM_MAX(n_kv_heads, 0) * row * 4 * n_pos;
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
    const uint64_t slot = gm->mla ? (uint64_t)gm->nkv * n_ctx * gm->D
                                  : (uint64_t)gm->nkv * n_ctx * (kv_row_words(kv_k, gm->D) + kv_row_words(kv_v, gm->D));
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

/* ---- recording the ops ---- */

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

static void record_layer(cm_gpu_model *gm, int il, int n, bool f16) {
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

/* ---- the CPU caches ---- */

static bool kv_ok(const cm_gpu_model *gm, const cm_kv *kv) {
    char why[160];
    const enum cm_type vt = kv->v_rows ? kv->type_v : kv->type;
    const bool f = cm_gpu_kv_supported(gm->m, kv->type, vt, why, sizeof why) && (!kv_quant(kv->type) || kv->v_rows) &&
                   kv_row_words(kv->type, gm->D) + kv_row_words(vt, gm->D) <=
                       kv_row_words(gm->kvk, gm->D) + kv_row_words(gm->kvv, gm->D);
    return f && kv->latent == gm->mla && !(kv->latent && kv->v_rows) && kv->layer_first <= gm->l0 &&
           kv->layer_last >= gm->l0 + gm->nl && kv->h0 == gm->sl.h0 && kv->h1 == (gm->tp ? gm->sl.h1 : gm->sh1) &&
           kv->n_ctx <= gm->ctx && kv->head_dim == gm->D;
}

/* Row p of K (kind 0) or V (kind 1) of (layer il, head hk) of a CPU cache as floats. */
static void kv_read(const cm_kv *kv, int il, int hk, int kind, int p, float *out) {
    const int D = kv->head_dim;
    const bool f16 = (kind ? kv->type_v : kv->type) == CM_TYPE_F16;
    if (kv->v_rows) {
        const cm_attn_kv av = cm_attn_kv_of(kv, il, hk);
        const uint8_t *r = (kind ? av.v + p * av.v_row : av.k + p * av.k_row);
        for (int d = 0; d < D; d++) out[d] = f16 ? cm_f16_to_f32(((const cm_f16 *)r)[d]) : ((const float *)r)[d];
        return;
    }
    const size_t off = ((size_t)(il - kv->layer_first) * (size_t)(kv->h1 - kv->h0) + (size_t)(hk - kv->h0)) *
                       (size_t)kv->n_ctx * (size_t)D;
    const void *base = kind ? kv->v : kv->k;
    for (int d = 0; d < D; d++) {
        const size_t i = off + (kind ? (size_t)d * kv->n_ctx + p : (size_t)p * D + d);
        out[d] = f16 ? cm_f16_to_f32(((const cm_f16 *)base)[i]) : ((const float *)base)[i];
    }
}

static void kv_write(const cm_kv *kv_c, int il, int hk, int p, const float *k, const float *v) {
    cm_kv *kv = (cm_kv *)kv_c;
    if (kv->v_rows) {
        cm_kv_store_rows(cm_kernels_get(), kv, il, hk, p, k, v);
        return;
    }
    const int D = kv->head_dim;
    const size_t off = ((size_t)(il - kv->layer_first) * (size_t)(kv->h1 - kv->h0) + (size_t)(hk - kv->h0)) *
                       (size_t)kv->n_ctx * (size_t)D;
    if (kv->type == CM_TYPE_F16) {
        cm_f16 *kd = (cm_f16 *)kv->k + off + (size_t)p * D, *vt = (cm_f16 *)kv->v + off;
        for (int i = 0; i < D; i++) kd[i] = cm_f32_to_f16(k[i]);
        for (int i = 0; i < D; i++) vt[(size_t)i * kv->n_ctx + p] = cm_f32_to_f16(v[i]);
    } else {
        memcpy((float *)kv->k + off + (size_t)p * D, k, (size_t)D * sizeof(float));
        float *vt = (float *)kv->v + off;
        for (int i = 0; i < D; i++) vt[(size_t)i * kv->n_ctx + p] = v[i];
    }
}

/* A quantized row (the CPU's blocks) in the device's layout (kvq.glsl). */
static void qrow_words(enum cm_type t, const uint8_t *row, int D, uint32_t *w) {
    const int nb = D / 32;
    for (int b = 0; b < nb; b++) {
        if (t == CM_TYPE_Q8_0) {
            const cm_block_q8_0 *x = (const cm_block_q8_0 *)(const void *)row + b;
            const float d = cm_f16_to_f32(x->d);
            memcpy(&w[b], &d, 4);
            for (int i = 0; i < 8; i++)
                w[nb + b * 8 + i] = (uint32_t)(uint8_t)x->qs[4 * i] | (uint32_t)(uint8_t)x->qs[4 * i + 1] << 8 |
                                    (uint32_t)(uint8_t)x->qs[4 * i + 2] << 16 |
                                    (uint32_t)(uint8_t)x->qs[4 * i + 3] << 24;
        } else {
            const cm_block_q4_0 *x = (const cm_block_q4_0 *)(const void *)row + b;
            const float d = cm_f16_to_f32(x->d);
            memcpy(&w[b], &d, 4);
            for (int i = 0; i < 4; i++) {
                uint32_t v = 0;
                for (int k = 0; k < 8; k++) {
                    const int e = i * 8 + k; /* element e: the low nibble of byte e, or the high one of e - 16 */
                    const uint32_t q = e < 16 ? x->qs[e] & 15u : (uint32_t)x->qs[e - 16] >> 4;
                    v |= q << (4 * k);
                }
                w[nb + b * 4 + i] = v;
            }
        }
    }
}

/* Fill slot s's positions [0, n) from the CPU cache. */
static int refill(cm_gpu_model *gm, int s, const cm_kv *kv, int n, char *err, size_t errlen) {
    const int D = gm->D;
    if (kv_quant(kv->type)) { /* the rows as they are, in the device's layout */
        const enum cm_type ts[2] = {kv->type, kv->type_v};
        const uint32_t rw[2] = {kv_row_words(ts[0], D), kv_row_words(ts[1], D)};
        uint32_t *w = (uint32_t *)(void *)gm->tmp; /* ctx * D floats: more than n rows of either */
        for (int il = 0; il < gm->nl && n > 0; il++)
            for (int kind = 0; kind < 2; kind++)
                for (int hk = 0; hk < gm->nkv; hk++) {
                    const cm_attn_kv av = cm_attn_kv_of(kv, gm->l0 + il, gm->sl.h0 + hk);
                    for (int p = 0; p < n; p++)
                        qrow_words(ts[kind], kind ? av.v + (size_t)p * av.v_row : av.k + (size_t)p * av.k_row, D,
                                   w + (size_t)p * rw[kind]);
                    const uint64_t off = (uint64_t)s * gm->slot_stride +
                                         (kind ? (uint64_t)gm->nkv * gm->ctx * rw[0] : 0) +
                                         (uint64_t)hk * gm->ctx * rw[kind];
                    int rc = cm_vk_upload(gm->g, gm->L[il].kv, off * 4, w, (uint64_t)n * rw[kind] * 4, err, errlen);
                    if (rc) return rc;
                }
        return 0;
    }
    for (int il = 0; il < gm->nl && gm->mla && n > 0; il++) { /* the latent rows: [ctx][D] per slot */
        for (int p = 0; p < n; p++) cm_vkm_latent_read(kv, gm->l0 + il, p, gm->tmp + (size_t)p * D);
        const uint64_t off = (uint64_t)s * gm->slot_stride;
        int rc = cm_vk_upload(gm->g, gm->L[il].kv, off * 4, gm->tmp, (uint64_t)n * D * 4, err, errlen);
        if (rc) return rc;
    }
    for (int il = 0; il < gm->nl && !gm->mla; il++)
        for (int kind = 0; kind < 2; kind++)
            for (int hk = 0; hk < gm->nkv; hk++) {
                if (n == 0) continue;
                for (int p = 0; p < n; p++) kv_read(kv, gm->l0 + il, gm->sl.h0 + hk, kind, p, gm->tmp + (size_t)p * D);
                const uint64_t off = (uint64_t)s * gm->slot_stride + ((uint64_t)kind * gm->nkv + hk) * gm->ctx * D;
                int rc = cm_vk_upload(gm->g, gm->L[il].kv, off * 4, gm->tmp, (uint64_t)n * D * 4, err, errlen);
                if (rc) return rc;
            }
    return 0;
}

/* The slot of each token (into slots[]), re-filling stale ones. 0: none
 * fits (more sequences than slots, or a cache the device cannot mirror). */
static int assign_slots(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, uint32_t *slots, char *err,
                        size_t errlen) {
    gm->tick++;
    const cm_kv *kv0 = a->kvs[b->seq[0]];
    for (int j = 0; j < b->n; j++) {
        const cm_kv *kv = a->kvs[b->seq[j]];
        if (!kv_ok(gm, kv) || kv->type != kv0->type || kv->type_v != kv0->type_v) return 0; /* one kind a batch */
        int s = -1;
        for (int i = 0; i < gm->n_seq && s < 0; i++)
            if (gm->slot_kv[i] == kv) s = i;
        if (s < 0) { /* the least recently used slot not in this batch */
            for (int i = 0; i < gm->n_seq; i++)
                if (gm->slot_used[i] != gm->tick && (s < 0 || gm->slot_used[i] < gm->slot_used[s])) s = i;
            if (s < 0) return 0;
            gm->slot_kv[s] = kv;
            gm->slot_valid[s] = -1;
        }
        if (gm->slot_used[s] != gm->tick && gm->slot_valid[s] != kv->n_past) {
            /* NEEDSWORK: a copy into a cache at the very length the slot holds is not seen. */
            int rc = refill(gm, s, kv, kv->n_past, err, errlen);
            if (rc) return rc;
            gm->slot_valid[s] = kv->n_past;
        }
        gm->slot_used[s] = gm->tick;
        slots[j] = (uint32_t)s;
    }
    return 1;
}

int cm_gpu_offload(void *gm, const cm_batch *b, const cm_forward_args *a, float *x, const float *rope, char *err,
                   size_t errlen) {
    return cm_gpu_forward_layers(gm, b, a, x, rope, err, errlen);
}

/* Half of layer il of a tensor-parallel member (0 attention, 1 FFN) from
 * the residual x into gm->part: its partial sum (zero for a member without
 * KV heads or FFN rows). */
static int tp_half(cm_gpu_model *gm, int il, int half, int n, bool f16, const float *x, char *err, size_t errlen) {
    const int E = gm->E;
    const uint32_t QD = (uint32_t)gm->QD, F = (uint32_t)gm->F;
    const size_t bytes = (size_t)n * E * sizeof(float);
    if (half ? F == 0 : QD == 0) {
        memset(gm->part, 0, bytes);
        return 0;
    }
    glayer *L = &gm->L[il];
    cm_vk_set *s = L->set;
    float *io = cm_vk_buf_map(gm->io);
    memcpy(io + gm->o_x, x, bytes);
    int rc = cm_vk_begin(gm->g, err, errlen);
    if (rc) return rc;
    cm_vk_copy(gm->g, gm->io, 0, gm->act, 0, (uint64_t)gm->o_x * 4 + bytes);
    cm_vk_copy(gm->g, gm->io, (uint64_t)gm->o_rope * 4, gm->act, (uint64_t)gm->o_rope * 4,
               (uint64_t)(gm->o_io_end - gm->o_rope) * 4); /* (rotations and metadata: small) */
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
    cm_vk_copy(gm->g, gm->act, 0, gm->io, 0, (uint64_t)gm->o_rope * 4); /* the partial sum, K and V rows */
    if ((rc = cm_vk_submit(gm->g, err, errlen))) return rc;
    memcpy(gm->part, io + gm->o_x, bytes);
    return 0;
}

/* A tensor-parallel member's layers: each half (attention up to its
 * attn_output columns, the FFN up to its ffn_down columns) is one
 * submission from the host's residual x; its partial sum comes back, is
 * all-reduced through the batch's allreduce and added into x on the host,
 * as forward.c's add_pending does (the same sum on every member, so the
 * members' residuals stay equal). */
static int forward_tp(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, float *x, bool f16, char *err,
                      size_t errlen) {
    const int64_t red = (int64_t)b->n * gm->E;
    int rc = 0;
    for (int il = 0; !rc && il < gm->nl; il++)
        for (int half = 0; !rc && half < 2; half++) {
            if ((rc = tp_half(gm, il, half, b->n, f16, x, err, errlen))) break;
            if ((rc = a->allreduce(a->allreduce_user, gm->part, red))) {
                rc = cm_errf(err, errlen, rc, "all-reduce after the %s of layer %d failed: %s",
                             half ? "ffn" : "attention", gm->l0 + il, cm_strerror(rc));
                break;
            }
            for (int64_t i = 0; i < red; i++) x[i] = x[i] + gm->part[i];
        }
    return rc;
}

static int forward_layers(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, float *x, const float *rope_c,
                          char *err, size_t errlen) {
    if (gm->nl == 0 || a->layer_first != gm->l0 || a->layer_last < gm->l0 + gm->nl || b->n > gm->B || a->experts.ep ||
        (gm->tp ? !a->allreduce : a->allreduce != NULL))
        return 0;
    const cm_slice want = gm->tp ? gm->sl : (cm_slice){0, gm->sh1, 0, gm->F};
    if (a->slice.h0 != want.h0 || a->slice.h1 != want.h1 || a->slice.f0 != want.f0 || a->slice.f1 != want.f1) return 0;
    if (cm_gpu_lost(gm->g)) { /* the batch that found it lost failed; the CPU does the later ones */
        if (!gm->lost_said) CM_LOGW("gpu: %s was lost; the CPU computes from now on", cm_gpu_info_of(gm->g)->name);
        gm->lost_said = true;
        return 0;
    }
    cm_vk_lock(gm->g);
    float *io = cm_vk_buf_map(gm->io);
    uint32_t *meta = (uint32_t *)(io + gm->o_meta);
    int rc = assign_slots(gm, b, a, meta + gm->B, err, errlen);
    if (rc <= 0) {
        cm_vk_unlock(gm->g);
        return rc;
    }
    const int n = b->n, E = gm->E, KD = gm->KD;
    const cm_kv *kv0 = a->kvs[b->seq[0]]; /* every cache of the batch has its types (assign_slots) */
    const bool f16 = kv0->type == CM_TYPE_F16, quant = kv_quant(kv0->type);
    const enum cm_type tv = quant ? kv0->type_v : kv0->type;
    gm->bkt = kv_code(kv0->type);
    gm->bvt = kv_code(tv);
    gm->bkrw = kv_row_words(kv0->type, gm->D);
    gm->bvrw = kv_row_words(tv, gm->D);
    gm->brk = gm->brv = 0;
    if (quant && !gm->mla) { /* the CPU's rotations of this cache (attn.c) */
        const cm_attn_kv av = cm_attn_kv_of(kv0, gm->l0, gm->sl.h0);
        gm->brk = (uint32_t)av.rot_k;
        gm->brv = (uint32_t)av.rot_v;
    }
    for (int j = 0; j < n; j++) meta[j] = (uint32_t)b->pos[j];
    memcpy(io + gm->o_x, x, (size_t)n * E * sizeof(float));
    memcpy(io + gm->o_rope, rope_c, (size_t)n * gm->n_rot * sizeof(float));
    const cm_hparams *hp = &gm->m->hp;
    if (hp->n_swa) /* the sliding-window layers' rotations, as forward.c's */
        for (int j = 0; j < n; j++)
            cm_model_rope_cache(gm->m, (float)b->pos[j], true, io + gm->o_rope_swa + (size_t)j * hp->n_rot);
    rc = cm_vk_fault(gm->g, err, errlen);
    if (!rc && gm->tp) rc = forward_tp(gm, b, a, x, f16, err, errlen);
    else if (!rc) rc = cm_vk_begin(gm->g, err, errlen);
    if (!rc && !gm->tp) {
        cm_vk_copy(gm->g, gm->io, 0, gm->act, 0, (uint64_t)gm->o_x * 4 + (uint64_t)n * E * 4);
        cm_vk_copy(gm->g, gm->io, (uint64_t)gm->o_rope * 4, gm->act, (uint64_t)gm->o_rope * 4,
                   (uint64_t)(gm->o_io_end - gm->o_rope) * 4);
        for (int il = 0; il < gm->nl; il++) record_layer(gm, il, n, f16);
        cm_vk_copy(gm->g, gm->act, 0, gm->io, 0, (uint64_t)gm->o_rope * 4);
        rc = cm_vk_submit(gm->g, err, errlen);
    }
    if (!rc) {
        if (!gm->tp) memcpy(x, io + gm->o_x, (size_t)n * E * sizeof(float)); /* (a slice's: added on the host) */
        for (int il = 0; il < gm->nl; il++)
            for (int j = 0; j < n; j++) {
                const float *k = io + gm->o_k + ((size_t)il * gm->B + j) * KD;
                const float *v = io + gm->o_v + ((size_t)il * gm->B + j) * KD;
                if (gm->mla) { /* the latent row alone */
                    cm_vkm_latent_write(a->kvs[b->seq[j]], gm->l0 + il, b->pos[j], k);
                    continue;
                }
                for (int hk = 0; hk < gm->nkv; hk++)
                    kv_write(a->kvs[b->seq[j]], gm->l0 + il, gm->sl.h0 + hk, b->pos[j], k + hk * gm->D, v + hk * gm->D);
            }
        for (int j = 0; j < n; j++) gm->slot_valid[meta[gm->B + j]]++;
    } else {
        for (int i = 0; i < gm->n_seq; i++) gm->slot_kv[i] = NULL; /* what the device holds is unknown now */
    }
    cm_vk_unlock(gm->g);
    return rc ? rc : gm->nl;
}

int cm_gpu_forward_layers(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, float *x, const float *rope_c,
                          char *err, size_t errlen) {
    if (!gm) return 0;
    const int rc = forward_layers(gm, b, a, x, rope_c, err, errlen);
    if (rc > 0) gm->n_took++;
    else if (rc == 0) gm->n_declined++;
    return rc;
}

int cm_gpu_test_kv_diff(cm_gpu_model *gm, const cm_kv *kv, char *err, size_t errlen) {
    int s = -1;
    for (int i = 0; i < gm->n_seq; i++)
        if (gm->slot_kv[i] == kv) s = i;
    if (s < 0 || !kv_quant(kv->type) || gm->mla)
        return cm_errf(err, errlen, CM_EINVAL, "no quantized slot of this cache");
    const int D = gm->D, n = kv->n_past;
    const enum cm_type ts[2] = {kv->type, kv->type_v};
    const uint32_t rw[2] = {kv_row_words(ts[0], D), kv_row_words(ts[1], D)};
    cm_vk_buf *h = cm_vk_buf_new(gm->g, (uint64_t)gm->slot_stride * 4, CM_VK_HOST, err, errlen);
    uint32_t *want = cm_calloc(rw[0] + rw[1], 4);
    int rc = h && want ? 0 : CM_ENOMEM, bad = 0;
    cm_vk_lock(gm->g);
    for (int il = 0; !rc && il < gm->nl; il++) {
        rc = cm_vk_begin(gm->g, err, errlen);
        if (rc) break;
        cm_vk_copy(gm->g, gm->L[il].kv, (uint64_t)s * gm->slot_stride * 4, h, 0, (uint64_t)gm->slot_stride * 4);
        if ((rc = cm_vk_submit(gm->g, err, errlen))) break;
        const uint32_t *got = cm_vk_buf_map(h);
        for (int kind = 0; kind < 2; kind++)
            for (int hk = 0; hk < gm->nkv; hk++) {
                const cm_attn_kv av = cm_attn_kv_of(kv, gm->l0 + il, gm->sl.h0 + hk);
                for (int p = 0; p < n; p++) {
                    qrow_words(ts[kind], kind ? av.v + (size_t)p * av.v_row : av.k + (size_t)p * av.k_row, D, want);
                    const uint64_t off = (kind ? (uint64_t)gm->nkv * gm->ctx * rw[0] : 0) +
                                         ((uint64_t)hk * gm->ctx + (uint64_t)p) * rw[kind];
                    bad += memcmp(got + off, want, rw[kind] * 4) != 0;
                }
            }
    }
    cm_vk_unlock(gm->g);
    cm_vk_buf_free(gm->g, h);
    cm_free(want);
    return rc ? rc : bad;
}
