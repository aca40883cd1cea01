/*
 * vk_forward.c: one batch through the device's layers: the slots of its
 * sequences (vk_kv.c), the residual and the rotations into the host-visible
 * io buffer, one command buffer for all the device's layers (vk_record.c)
 * and one wait, then the residual and the K/V rows back. A tensor-parallel
 * member instead submits each half-layer and all-reduces its partial sum
 * on the host. A batch the device cannot take (its shape, its caches, a
 * lost device) is declined (0) for the CPU to run; never half-applied.
 */
#include "vk_model.h"

#include <string.h>

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
    float *io = cm_vk_buf_map(gm->io);
    memcpy(io + gm->o_x, x, bytes);
    int rc = cm_vk_begin(gm->g, err, errlen);
    if (rc) return rc;
    cm_vk_copy(gm->g, gm->io, 0, gm->act, 0, (uint64_t)gm->o_x * 4 + bytes);
    cm_vk_copy(gm->g, gm->io, (uint64_t)gm->o_rope * 4, gm->act, (uint64_t)gm->o_rope * 4,
               (uint64_t)(gm->o_io_end - gm->o_rope) * 4); /* (rotations and metadata: small) */
    cm_vkm_record_half(gm, il, half, n, f16);
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
    int rc = cm_vkm_assign_slots(gm, b, a, meta + gm->B, err, errlen);
    if (rc <= 0) {
        cm_vk_unlock(gm->g);
        return rc;
    }
    const int n = b->n, E = gm->E;
    const cm_kv *kv0 = a->kvs[b->seq[0]]; /* every cache of the batch has its types (cm_vkm_assign_slots) */
    const bool f16 = kv0->type == CM_TYPE_F16;
    cm_vkm_kv_batch_types(gm, kv0);
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
        for (int il = 0; il < gm->nl; il++) cm_vkm_record_layer(gm, il, n, f16);
        cm_vk_copy(gm->g, gm->act, 0, gm->io, 0, (uint64_t)gm->o_rope * 4);
        rc = cm_vk_submit(gm->g, err, errlen);
    }
    if (!rc) {
        if (!gm->tp) memcpy(x, io + gm->o_x, (size_t)n * E * sizeof(float)); /* (a slice's: added on the host) */
        cm_vkm_kv_store_batch(gm, b, a, io, meta + gm->B);
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
