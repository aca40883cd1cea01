/*
 * session_share.c: a session's side of the prompt-prefix KV blocks shared
 * copy-on-write (src/model/kv_blocks.c, issue 22): take another session's
 * prefix without copying it, and say which of the cache's bytes are shared
 * (counted once by serve's admission and /metrics) and which are its own.
 */
#include "engine_impl.h"

#include <string.h>

int cm_session_share_prefix(cm_session *dst, cm_session *src, int n, char *err, size_t errlen) {
    if (dst->e != src->e) return cm_errf(err, errlen, CM_EINVAL, "sessions of different engines");
    if (dst->e->cl) return cm_errf(err, errlen, CM_EUNSUPPORTED, "prefix sharing on a cluster");
    if (!cm_session_lora_same(dst, src))
        return cm_errf(err, errlen, CM_EINVAL, "the sessions use different LoRA adapter scales");
    if (n > src->kv.n_past || n > src->n_hist || n > dst->n_ctx)
        return cm_errf(err, errlen, CM_EINVAL, "prefix of %d tokens is longer than the source's", n);
    int rc = cm_kv_share_prefix(&dst->kv, &src->kv, n, err, errlen);
    if (rc) return rc;
    memcpy(dst->hist, src->hist, (size_t)n * sizeof *dst->hist);
    dst->n_hist = n;
    dst->have_logits = false;
    return 0;
}

uint64_t cm_session_kv_private(const cm_session *s, int n) {
    if (n < 0) n = s->kv.n_past;
    return cm_kv_resident_bytes(&s->kv, n) - cm_kv_shared_bytes(&s->kv, n);
}

uint64_t cm_session_kv_shareable(const cm_session *s, int n) { return cm_kv_shareable_bytes(&s->kv, n); }

uint64_t cm_session_kv_store(const cm_session *s, const void **id) { return cm_kv_store_bytes(&s->kv, id); }
