/*
 * kv.c: the per-sequence KV cache's life: its size, its reservation for a
 * layer range and a slice of KV heads, truncation and rewinding. Where its
 * pages come from is kv_mem.c's; shared blocks are kv_blocks.c's; the layout
 * of its rows is model.h's (cm_kv).
 */
#include "mla.h"
#include "model.h"

#include <string.h>

uint64_t cm_kv_bytes(const cm_model *m, int layer_first, int layer_last, int h0, int h1, int n_ctx) {
    if (m->hp.arch == CM_ARCH_DEEPSEEK2)
        return cm_mla_kv_bytes(m, layer_first, layer_last, n_ctx); /* the latent only */
    uint64_t n =
        (uint64_t)(layer_last - layer_first) * (uint64_t)(h1 - h0) * (uint64_t)n_ctx * (uint64_t)m->hp.head_dim;
    return 2 * n * sizeof(float);
}

int cm_kv_check(const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx, char *err, size_t errlen) {
    if (layer_first < 0 || layer_last > m->hp.n_layer || layer_first >= layer_last)
        return cm_errf(err, errlen, CM_EINVAL, "layer range [%d, %d) is out of [0, %d)", layer_first, layer_last,
                       m->hp.n_layer);
    if (s.h0 < 0 || s.h1 > cm_slice_full(m).h1 || s.h0 > s.h1)
        return cm_errf(err, errlen, CM_EINVAL, "kv head range [%d, %d) is out of [0, %d)", s.h0, s.h1,
                       cm_slice_full(m).h1);
    if (n_ctx < 1 || n_ctx > (1 << 24))
        return cm_errf(err, errlen, CM_EINVAL, "context size %d is out of range", n_ctx);
    return 0;
}

int cm_kv_init(cm_kv *kv, const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx, char *err,
               size_t errlen) {
    return cm_kv_init_type(kv, m, layer_first, layer_last, s, n_ctx, CM_TYPE_F32, err, errlen);
}

int cm_kv_init_type(cm_kv *kv, const cm_model *m, int layer_first, int layer_last, cm_slice s, int n_ctx,
                    enum cm_type type, char *err, size_t errlen) {
    memset(kv, 0, sizeof *kv);
    if (type != CM_TYPE_F32 && type != CM_TYPE_F16)
        return cm_errf(err, errlen, CM_EINVAL, "kv cache type %s is not supported (f32, f16)", cm_type_name(type));
    int rc = cm_kv_check(m, layer_first, layer_last, s, n_ctx, err, errlen);
    if (rc) return rc;
    const bool mla = m->hp.arch == CM_ARCH_DEEPSEEK2; /* K only: the latent rows (mla.h) */
    uint64_t half = cm_kv_bytes(m, layer_first, layer_last, s.h0, s.h1, n_ctx) / (mla ? 1 : 2);
    if (type == CM_TYPE_F16) half /= 2;
    if (half > SIZE_MAX / 2)
        return cm_errf(err, errlen, CM_ENOMEM, "kv cache of %llu bytes is too large", (unsigned long long)half * 2);
    /* reserved address space: untouched context costs no memory (kv_mem.c) */
    kv->k = cm_kv_mem_map((size_t)half + sizeof(float), &kv->k_map);
    kv->v = cm_kv_mem_map((mla ? 0 : (size_t)half) + sizeof(float), &kv->v_map);
    if (!kv->k || !kv->v) {
        cm_kv_release(kv);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for a kv cache of %llu bytes",
                       (unsigned long long)half * 2);
    }
    kv->layer_first = layer_first;
    kv->layer_last = layer_last;
    kv->h0 = s.h0;
    kv->h1 = s.h1;
    kv->n_ctx = n_ctx;
    kv->head_dim = m->hp.head_dim;
    kv->n_past = 0;
    kv->type = type;
    kv->type_v = type;
    kv->latent = mla;
    return 0;
}

void cm_kv_release(cm_kv *kv) {
    if (!kv) return;
    cm_kv_blocks_release(kv);
    if (kv->k_map) cm_kv_mem_unmap(kv->k, kv->k_map);
    else cm_free(kv->k);
    if (kv->v_map) cm_kv_mem_unmap(kv->v, kv->v_map);
    else cm_free(kv->v);
    memset(kv, 0, sizeof *kv);
}

void cm_kv_truncate(cm_kv *kv, int n_past) {
    if (n_past < 0) n_past = 0;
    if (n_past < kv->n_past) {
        kv->n_past = n_past;
        cm_kv_trim(kv); /* the pages past it go back (kv_mem.c) */
    }
}

void cm_kv_rewind(cm_kv *kv, int n_past) {
    if (n_past < 0) n_past = 0;
    if (n_past < kv->n_past) {
        if (kv->n_pool < kv->n_past) kv->n_pool = kv->n_past; /* their pages stay (kv_mem.c) */
        kv->n_past = n_past;
        cm_kv_blocks_trim(kv); /* below the shared part, or 0: as cm_kv_trim */
    }
}
