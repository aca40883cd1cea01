/*
 * vk_kv.c: the device's K/V slots as mirrors of the CPU's caches. The CPU's
 * caches stay the truth: the device's K and V rows come back and are
 * stored there too (cm_vkm_kv_store_batch), and a slot whose sequence the
 * device has not kept up with (the CPU ran a batch, a truncation, a copy)
 * is re-filled from the CPU cache before the batch (cm_vkm_assign_slots).
 * A quantized cache's rows travel as the CPU's blocks in kvq.glsl's
 * layout; an F16 cache is held as floats on the device. Never decides
 * from the device's rows alone what a sequence holds.
 */
#include "vk_model.h"

#include "../kernels/kernels.h"

#include <stdio.h>
#include <string.h>

static bool kv_quant(enum cm_type t) { return t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0; }
/* Words of one cache row of D elements on the device (kvq.glsl). */
uint32_t cm_vkm_kv_row_words(enum cm_type t, int D) {
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

uint64_t cm_gpu_kv_bytes(int n_kv_heads, int head_dim, uint64_t n_pos, enum cm_type kv_k, enum cm_type kv_v) {
    if (!kv_quant(kv_k) || !kv_quant(kv_v)) kv_k = kv_v = CM_TYPE_F32; /* (an F16 cache's slots hold floats) */
    const uint64_t row = (uint64_t)cm_vkm_kv_row_words(kv_k, head_dim) + cm_vkm_kv_row_words(kv_v, head_dim);
    return (uint64_t)CM_MAX(n_kv_heads, 0) * row * 4 * n_pos;
}

static bool kv_ok(const cm_gpu_model *gm, const cm_kv *kv) {
    char why[160];
    const enum cm_type vt = kv->v_rows ? kv->type_v : kv->type;
    const bool f = cm_gpu_kv_supported(gm->m, kv->type, vt, why, sizeof why) && (!kv_quant(kv->type) || kv->v_rows) &&
                   cm_vkm_kv_row_words(kv->type, gm->D) + cm_vkm_kv_row_words(vt, gm->D) <=
                       cm_vkm_kv_row_words(gm->kvk, gm->D) + cm_vkm_kv_row_words(gm->kvv, gm->D);
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
        const uint32_t rw[2] = {cm_vkm_kv_row_words(ts[0], D), cm_vkm_kv_row_words(ts[1], D)};
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
int cm_vkm_assign_slots(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, uint32_t *slots, char *err,
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

void cm_vkm_kv_batch_types(cm_gpu_model *gm, const cm_kv *kv0) {
    const bool quant = kv_quant(kv0->type);
    const enum cm_type tv = quant ? kv0->type_v : kv0->type;
    gm->bkt = kv_code(kv0->type);
    gm->bvt = kv_code(tv);
    gm->bkrw = cm_vkm_kv_row_words(kv0->type, gm->D);
    gm->bvrw = cm_vkm_kv_row_words(tv, gm->D);
    gm->brk = gm->brv = 0;
    if (quant && !gm->mla) { /* the CPU's rotations of this cache (attn.c) */
        const cm_attn_kv av = cm_attn_kv_of(kv0, gm->l0, gm->sl.h0);
        gm->brk = (uint32_t)av.rot_k;
        gm->brv = (uint32_t)av.rot_v;
    }
}

void cm_vkm_kv_store_batch(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, const float *io,
                           const uint32_t *slots) {
    const int n = b->n, KD = gm->KD;
    for (int il = 0; il < gm->nl; il++)
        for (int j = 0; j < n; j++) {
            const float *k = io + gm->o_k + ((size_t)il * gm->B + j) * KD;
            const float *v = io + gm->o_v + ((size_t)il * gm->B + j) * KD;
            if (gm->mla) { /* the latent row alone */
                cm_vkm_latent_write(a->kvs[b->seq[j]], gm->l0 + il, b->pos[j], k);
                continue;
            }
            for (int hk = 0; hk < gm->nkv; hk++)
                cm_kv_store(cm_kernels_get(), (cm_kv *)a->kvs[b->seq[j]], gm->l0 + il, gm->sl.h0 + hk, b->pos[j],
                            k + hk * gm->D, v + hk * gm->D);
        }
    for (int j = 0; j < n; j++) gm->slot_valid[slots[j]]++;
}

int cm_gpu_test_kv_diff(cm_gpu_model *gm, const cm_kv *kv, char *err, size_t errlen) {
    int s = -1;
    for (int i = 0; i < gm->n_seq; i++)
        if (gm->slot_kv[i] == kv) s = i;
    if (s < 0 || !kv_quant(kv->type) || gm->mla)
        return cm_errf(err, errlen, CM_EINVAL, "no quantized slot of this cache");
    const int D = gm->D, n = kv->n_past;
    const enum cm_type ts[2] = {kv->type, kv->type_v};
    const uint32_t rw[2] = {cm_vkm_kv_row_words(ts[0], D), cm_vkm_kv_row_words(ts[1], D)};
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
