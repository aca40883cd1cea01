/*
 * engine_lora.c: the engine's LoRA adapters (cm_engine_opts.loras): each
 * "FILE.gguf[:SCALE]" is parsed, validated against the loaded model and
 * copied into one cm_lora set (model/lora.h) that every forward pass of the
 * engine's context applies. Loaded before a cluster opens: the coordinator
 * sends every stage its layers' parts of the set (cluster/coord_lora.c).
 * The adapter files are closed again: the set holds its own F32 copy. Never
 * applies part of a set: any bad adapter fails the whole load.
 *
 * Scales per sequence (serve's per-request adapters, llama-server's
 * "lora" field): each session holds a user scale per adapter, starting from
 * the engine's defaults (the FILE:SCALE values, changed by
 * cm_engine_lora_set_defaults); every forward pass gives each row its
 * sequence's scales (cm_forward_args.lora_scales), so sequences with
 * different adapters share one batched pass and each row gets the bits it
 * gets alone. A session's KV cache is keyed by its scales: changing them
 * forgets the cache, and prefixes are shared only between sessions with
 * equal scales. On a cluster the stages apply the scales they were given at
 * load (their parts carry final scales only), so there the scales stay the
 * loaded ones (CM_EUNSUPPORTED otherwise).
 */
#include "engine_impl.h"

#include <math.h>
#include <string.h>

int cm_engine_load_loras(cm_engine *e, const cm_engine_opts *o, char *err, size_t errlen) {
    e->lora = cm_lora_new(&e->m);
    e->lora_path = cm_calloc((size_t)o->n_loras, sizeof *e->lora_path);
    e->lora_def = cm_calloc((size_t)o->n_loras, sizeof *e->lora_def);
    if (!e->lora || !e->lora_path || !e->lora_def) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    for (int i = 0; i < o->n_loras; i++) {
        char path[4096], msg[512];
        float scale;
        int rc = cm_lora_spec_parse(o->loras[i], path, sizeof path, &scale, msg, sizeof msg);
        if (rc) return cm_errf(err, errlen, rc, "%s", msg);
        cm_gguf g;
        if ((rc = cm_gguf_open(&g, path, NULL, NULL, msg, sizeof msg))) return cm_errf(err, errlen, rc, "%s", msg);
        rc = cm_lora_add(e->lora, &g, scale, msg, sizeof msg);
        cm_gguf_close(&g);
        if (rc) return cm_errf(err, errlen, rc, "LoRA '%s': %s", path, msg);
        if (!(e->lora_path[i] = cm_strdup(path))) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        e->lora_def[i] = scale;
    }
    return 0;
}

void cm_engine_loras_free(cm_engine *e) {
    for (int i = 0; e->lora_path && i < cm_lora_count(e->lora); i++) cm_free(e->lora_path[i]);
    cm_free(e->lora_path);
    cm_free(e->lora_def);
    cm_lora_free(e->lora);
}

int cm_engine_lora_count(const cm_engine *e) { return cm_lora_count(e->lora); }

const char *cm_engine_lora_path(const cm_engine *e, int i) {
    return i >= 0 && i < cm_lora_count(e->lora) ? e->lora_path[i] : NULL;
}

void cm_engine_lora_defaults(cm_engine *e, float *scales, int n) {
    pthread_mutex_lock(&e->lora_mu);
    for (int i = 0; i < n && i < cm_lora_count(e->lora); i++) scales[i] = e->lora_def[i];
    pthread_mutex_unlock(&e->lora_mu);
}

int cm_engine_lora_check(const cm_engine *e, const float *scales, int n, char *err, size_t errlen) {
    const int na = cm_lora_count(e->lora);
    if (n != na) return cm_errf(err, errlen, CM_EINVAL, "%d LoRA scales for %d adapters", n, na);
    for (int i = 0; i < n; i++) {
        if (!isfinite(scales[i]) || fabsf(scales[i]) >= 1e6f)
            return cm_errf(err, errlen, CM_EINVAL, "LoRA scale %g of adapter %d is out of range", scales[i], i);
        /* the stages get a sequence's scales in a SEQ_LORA of at most CM_PIPE_MAX_LORA */
        if (((e->cl && n > CM_PIPE_MAX_LORA) || !cm_lora_rows_ok(e->lora)) && scales[i] != cm_lora_scale(e->lora, i))
            return cm_errf(err, errlen, CM_EUNSUPPORTED,
                           "changing LoRA scales (adapter %d: %g, loaded with %g) is not supported with %d adapters "
                           "on a cluster (at most %d)",
                           i, scales[i], cm_lora_scale(e->lora, i), n, CM_PIPE_MAX_LORA);
    }
    return 0;
}

int cm_engine_lora_set_defaults(cm_engine *e, const float *scales, int n, char *err, size_t errlen) {
    int rc = cm_engine_lora_check(e, scales, n, err, errlen);
    if (rc) return rc;
    pthread_mutex_lock(&e->lora_mu);
    if (n > 0) memcpy(e->lora_def, scales, (size_t)n * sizeof *scales); /* none loaded: lora_def is NULL */
    pthread_mutex_unlock(&e->lora_mu);
    return 0;
}

int cm_session_lora_init(cm_session *s) {
    const int n = cm_lora_count(s->e->lora);
    if (!n) return 0;
    s->lora = cm_malloc((size_t)n * sizeof *s->lora);
    s->lora_sent = cm_malloc((size_t)n * sizeof *s->lora_sent);
    if (!s->lora || !s->lora_sent) return CM_ENOMEM;
    cm_engine_lora_defaults(s->e, s->lora, n);
    for (int i = 0; i < n; i++) s->lora_sent[i] = cm_lora_scale(s->e->lora, i); /* a fresh slot's */
    s->lora_gen = s->pipe_gen;
    return 0;
}

static bool same_scales(const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return false; /* by value: -0 and 0 give the same bits (both skip the row) */
    return true;
}

int cm_session_set_lora(cm_session *s, const float *scales, int n, char *err, size_t errlen) {
    int rc = cm_engine_lora_check(s->e, scales, n, err, errlen);
    if (rc || !n || same_scales(s->lora, scales, n)) return rc;
    memcpy(s->lora, scales, (size_t)n * sizeof *scales);
    cm_session_kv_forget(s); /* computed with other adapters: never reused */
    return 0;
}

const float *cm_session_lora(const cm_session *s, int *n) {
    *n = cm_lora_count(s->e->lora);
    return s->lora;
}

int cm_session_cached_prefix(const cm_session *s, const int32_t *ids, int n, const float *scales, int n_scales) {
    const int na = cm_lora_count(s->e->lora);
    if (na && (n_scales != na || !scales || !same_scales(s->lora, scales, na))) return 0;
    const int m = CM_MIN(s->n_hist, s->kv.n_past);
    int k = 0;
    while (k < m && k < n && s->hist[k] == ids[k]) k++;
    return k;
}

bool cm_session_lora_same(const cm_session *a, const cm_session *b) {
    const int na = cm_lora_count(a->e->lora);
    return a->e == b->e && (!na || same_scales(a->lora, b->lora, na));
}

int cm_session_lora_sync(cm_session *s, char *err, size_t errlen) {
    cm_engine *e = s->e;
    const int n = cm_lora_count(e->lora);
    if (!e->cl || !n || s->slot < 0) return 0;
    const int gen = cm_pipe_generation(e->cl);
    if (gen != s->lora_gen) { /* a re-plan: new stages, the loaded scales */
        for (int i = 0; i < n; i++) s->lora_sent[i] = cm_lora_scale(e->lora, i);
        s->lora_gen = gen;
    }
    if (same_scales(s->lora, s->lora_sent, n)) return 0;
    int rc = cm_pipe_seq_lora(e->cl, s->slot, s->lora, n, err, errlen);
    if (!rc) memcpy(s->lora_sent, s->lora, (size_t)n * sizeof *s->lora_sent);
    return rc;
}

int cm_engine_lora_rows(cm_engine *e, cm_forward_args *a, cm_session *const *sess, const float **ls, int cap, char *err,
                        size_t errlen) {
    a->lora_scales = NULL;
    if (!cm_lora_count(e->lora) || !sess) return 0;
    if (a->n_kvs > cap) return cm_errf(err, errlen, CM_EINVAL, "%d sequences in one pass", a->n_kvs);
    for (int k = 0; k < a->n_kvs; k++) ls[k] = sess[k]->lora;
    a->lora_scales = ls;
    return 0;
}
