/*
 * kv_copy.c: copying the first positions of one sequence's KV cache into
 * another's (a prompt prefix shared across requests: a system prompt
 * evaluated once, then copied into every slot that starts with it).
 *
 * The copy moves BYTES of whole positions through the layouts model.h states
 * for cm_kv (K as [layer][head][n_ctx] rows; V transposed as
 * [layer][head][head_dim][n_ctx] in F32/F16, or as rows like K's in the rows
 * layout of the quantized types; no V in deepseek2's latent cache), sized by
 * the cache's own row sizes, so it needs no arithmetic on the values.
 * Serve shares prefixes copy-on-write instead (kv_blocks.c), which falls
 * back to this copy where pages cannot be shared.
 * Never allocates; the caller serialises it with forward passes of both
 * caches.
 */
#include "model.h"

#include <string.h>

int cm_kv_copy_prefix(cm_kv *dst, const cm_kv *src, int n, char *err, size_t errlen) {
    if (dst == src) return 0;
    if (dst->type != src->type || dst->layer_first != src->layer_first || dst->layer_last != src->layer_last ||
        dst->h0 != src->h0 || dst->h1 != src->h1 || dst->head_dim != src->head_dim || dst->v_rows != src->v_rows ||
        (src->v_rows && dst->type_v != src->type_v) || dst->latent != src->latent)
        return cm_errf(err, errlen, CM_EINVAL, "kv caches of different shapes or types");
    if (n < 0 || n > src->n_past || n > dst->n_ctx)
        return cm_errf(err, errlen, CM_EINVAL, "prefix of %d positions (source holds %d, target fits %d)", n,
                       src->n_past, dst->n_ctx);
    if (dst->store) cm_kv_truncate(dst, 0); /* a shared prefix let go (kv_blocks.c), not written through */
    const int D = src->head_dim;
    /* one position of one K head (a row in either layout; deepseek2's latent row too) */
    const size_t pos_bytes = src->v_rows ? src->k_row : cm_row_size(src->type, D);
    const size_t one = cm_row_size(src->type, 1); /* one element of a transposed V row */
    const int nh = (src->layer_last - src->layer_first) * (src->latent ? 1 : src->h1 - src->h0); /* latent: per layer */
    for (int lh = 0; lh < nh; lh++) {
        const size_t ks = (size_t)lh * (size_t)src->n_ctx * pos_bytes, kd = (size_t)lh * (size_t)dst->n_ctx * pos_bytes;
        memcpy((char *)dst->k + kd, (const char *)src->k + ks, (size_t)n * pos_bytes);
        if (src->latent) continue; /* deepseek2: the latent is the whole cache */
        if (src->v_rows) {         /* V rows like K's (attn.c) */
            const size_t vs = (size_t)lh * (size_t)src->n_ctx * src->v_row,
                         vd = (size_t)lh * (size_t)dst->n_ctx * src->v_row;
            memcpy((char *)dst->v + vd, (const char *)src->v + vs, (size_t)n * src->v_row);
            continue;
        }
        for (int d = 0; d < D; d++) {
            const size_t vs = ((size_t)lh * (size_t)D + (size_t)d) * (size_t)src->n_ctx * one;
            const size_t vd = ((size_t)lh * (size_t)D + (size_t)d) * (size_t)dst->n_ctx * one;
            memcpy((char *)dst->v + vd, (const char *)src->v + vs, (size_t)n * one);
        }
    }
    dst->n_past = n;
    return 0;
}
