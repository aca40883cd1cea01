/*
 * session_kv.c: a session's KV memory for serve's admission by memory
 * (paged KV memory, issue 22). The cache is committed page by page as
 * positions are written (src/model/kv_mem.c); these report what a session
 * holds or would hold, and give an idle session's memory back.
 */
#include "engine_impl.h"

uint64_t cm_session_kv_bytes(const cm_session *s, int n) {
    return cm_kv_resident_bytes(&s->kv, n < 0 ? s->kv.n_past : n);
}

void cm_session_kv_drop(cm_session *s) {
    cm_kv_truncate(&s->kv, 0);
    cm_kv_trim(&s->kv); /* also when it held nothing: pages written past n_past (a failed pass) */
    s->n_hist = 0;
    s->have_logits = false;
}

void cm_session_kv_forget(cm_session *s) {
    cm_kv_rewind(&s->kv, 0);
    s->n_hist = 0;
    s->have_logits = false;
}

uint64_t cm_session_kv_pooled(const cm_session *s) { return cm_kv_pooled_bytes(&s->kv); }

void cm_session_kv_trim_pool(cm_session *s) {
    if (cm_kv_pooled_bytes(&s->kv)) cm_kv_trim(&s->kv);
}
