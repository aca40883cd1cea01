/*
 * session_share.c: a session's side of the prompt-prefix KV blocks shared
 * copy-on-write (src/model/kv_blocks.c, issue 22): take another session's
 * prefix without copying it (or, the same checks, by copying it), and say
 * which of the cache's bytes are shared (counted once by serve's admission
 * and /metrics) and which are its own.
 */
#include "engine_impl.h"

#include <string.h>

/* The checks and the history of a prefix taken from src: shared (copy-on-
 * write blocks of src_kv, which is &src->kv) when src_kv is given, else
 * copied. One place for both. */
static int take_prefix(cm_session *dst, const cm_session *src, cm_kv *src_kv, int n, char *err, size_t errlen) {
    const bool share = src_kv != NULL;
    if (dst->e != src->e) return cm_errf(err, errlen, CM_EINVAL, "sessions of different engines");
    if (dst->e->cl)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "%s on a cluster", share ? "prefix sharing" : "prefix copy");
    if (!cm_session_lora_same(dst, src))
        return cm_errf(err, errlen, CM_EINVAL, "the sessions use different LoRA adapter scales");
    if (n > src->kv.n_past || n > src->n_hist || n > dst->n_ctx)
        return cm_errf(err, errlen, CM_EINVAL, "prefix of %d tokens is longer than the source's", n);
    int rc = share ? cm_kv_share_prefix(&dst->kv, src_kv, n, err, errlen)
                   : cm_kv_copy_prefix(&dst->kv, &src->kv, n, err, errlen);
    if (rc) return rc;
    memcpy(dst->hist, src->hist, (size_t)n * sizeof *dst->hist);
    dst->n_hist = n;
    dst->have_logits = false;
    return 0;
}

int cm_session_share_prefix(cm_session *dst, cm_session *src, int n, char *err, size_t errlen) {
    return take_prefix(dst, src, &src->kv, n, err, errlen);
}

int cm_session_copy_prefix(cm_session *dst, const cm_session *src, int n, char *err, size_t errlen) {
    return take_prefix(dst, src, NULL, n, err, errlen);
}

uint64_t cm_session_kv_private(const cm_session *s, int n) {
    if (n < 0) n = s->kv.n_past;
    return cm_kv_resident_bytes(&s->kv, n) - cm_kv_shared_bytes(&s->kv, n);
}

uint64_t cm_session_kv_shareable(const cm_session *s, int n) { return cm_kv_shareable_bytes(&s->kv, n); }

uint64_t cm_session_kv_store(const cm_session *s, const void **id) { return cm_kv_store_bytes(&s->kv, id); }
