/*
 * kv_copy.c: copying the first positions of one sequence's KV cache into
 * another's (a prompt prefix shared across requests: a system prompt
 * evaluated once, then copied into every slot that starts with it).
 *
 * The copy moves BYTES of whole positions through the layout model.h states
 * for cm_kv (K as [layer][head][n_ctx][head_dim] rows, V transposed as
 * [layer][head][head_dim][n_ctx]), sized by cm_row_size of the cache's
 * element type, so it needs no arithmetic on the values and stays right for
 * any element type a cache may get. NEEDSWORK: a block-quantized V cache
 * (several positions per block) would copy whole blocks of the transposed
 * rows; and paged KV memory (blocks shared copy-on-write instead of copied)
 * is a change of cm_kv itself, made together with the KV cache types.
 * Never allocates; the caller serialises it with forward passes of both
 * caches.
 */
#include "model.h"

#include <string.h>

int cm_kv_copy_prefix(cm_kv *dst, const cm_kv *src, int n, char *err, size_t errlen) {
    if (dst == src) return 0;
    if (dst->type != src->type || dst->layer_first != src->layer_first || dst->layer_last != src->layer_last ||
        dst->h0 != src->h0 || dst->h1 != src->h1 || dst->head_dim != src->head_dim)
        return cm_errf(err, errlen, CM_EINVAL, "kv caches of different shapes or types");
    if (n < 0 || n > src->n_past || n > dst->n_ctx)
        return cm_errf(err, errlen, CM_EINVAL, "prefix of %d positions (source holds %d, target fits %d)", n, src->n_past,
                       dst->n_ctx);
    const int D = src->head_dim;
    const size_t pos_bytes = cm_row_size(src->type, D);    /* one position of one K head */
    const size_t one = cm_row_size(src->type, 1);          /* one element of a V row */
    const int nh = (src->layer_last - src->layer_first) * (src->h1 - src->h0);
    for (int lh = 0; lh < nh; lh++) {
        const size_t ks = (size_t)lh * (size_t)src->n_ctx * pos_bytes, kd = (size_t)lh * (size_t)dst->n_ctx * pos_bytes;
        memcpy((char *)dst->k + kd, (const char *)src->k + ks, (size_t)n * pos_bytes);
        for (int d = 0; d < D; d++) {
            const size_t vs = ((size_t)lh * (size_t)D + (size_t)d) * (size_t)src->n_ctx * one;
            const size_t vd = ((size_t)lh * (size_t)D + (size_t)d) * (size_t)dst->n_ctx * one;
            memcpy((char *)dst->v + vd, (const char *)src->v + vs, (size_t)n * one);
        }
    }
    dst->n_past = n;
    return 0;
}
