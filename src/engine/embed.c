/*
 * embed.c: sentence embeddings from any model the engine runs (the
 * /v1/embeddings route). The token rows go through every layer as a prompt
 * does (causal attention, a KV cache of the input's own length, made and
 * freed per call), the final hidden state of each row gets the model's
 * output norm (llama.cpp's "embd" tensor: what it pools), and the rows are
 * pooled: mean over all rows (BOS included), the first row (CLS) or the last
 * one. Optionally L2-normalised (llama.cpp's server and OpenAI return unit
 * vectors; llama.cpp's own llama_get_embeddings* do not normalise).
 *
 * Forward passes take the engine lock chunk by chunk, like a session's
 * prefill, so embeddings interleave with generation steps. On a pipeline the
 * final hidden state lives on the last stage: it sends the rows back
 * (embed_cluster.c) and they are normed and pooled here the same way.
 */
#include "engine_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *cm_pooling_name(enum cm_pooling p) {
    static const char *const k[CM_POOLING_COUNT] = {"mean", "cls", "last"};
    return (unsigned)p < CM_POOLING_COUNT ? k[p] : "?";
}

enum cm_pooling cm_engine_pooling(const cm_engine *e, bool *declared) {
    char key[96];
    snprintf(key, sizeof key, "%s.pooling_type", cm_arch_name_of(e->m.hp.arch));
    uint64_t v = 0;
    bool have = cm_gguf_get_u64(&e->g, key, &v);
    /* llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker head: not an embedding) */
    enum cm_pooling p = CM_POOLING_MEAN;
    bool d = have && v >= 1 && v <= 3;
    if (d) p = v == 1 ? CM_POOLING_MEAN : v == 2 ? CM_POOLING_CLS : CM_POOLING_LAST;
    if (declared) *declared = d;
    return p;
}

int cm_engine_embed(cm_engine *e, const int32_t *ids, int n, enum cm_pooling pooling, bool normalize, float *out,
                    char *err, size_t errlen) {
    const cm_hparams *hp = &e->m.hp;
    const int E = hp->n_embd;
    const bool down = cm_engine_downstream(e); /* a pipeline: the last stage sends the final rows back */
    if (!down && (e->cl || e->local_last != hp->n_layer))
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "embeddings are not supported on a tensor-parallel group yet: serve the model on one machine "
                       "or a pipeline for /v1/embeddings");
    if ((unsigned)pooling >= CM_POOLING_COUNT) return cm_errf(err, errlen, CM_EINVAL, "unknown pooling %d", pooling);
    if (n < 1) return cm_errf(err, errlen, CM_EINVAL, "empty input");
    if (n > e->max_ctx)
        return cm_errf(err, errlen, CM_ENOSPACE, "input of %d tokens does not fit the context of %d", n, e->max_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab)
            return cm_errf(err, errlen, CM_EINVAL, "token id %d is out of the vocabulary", ids[i]);
    int bmax = CM_MIN(e->n_batch, CM_BATCH_MAX);
    cm_kv kv;
    memset(&kv, 0, sizeof kv);
    int rc =
        down ? 0 : cm_kv_init_types(&kv, &e->m, 0, hp->n_layer, e->slice, n, e->kv_k, e->kv_v, e->kv_rows, err, errlen);
    if (rc) return rc;
    /* a pipeline: every row at once (the last stage sends them back); here: one chunk at a time */
    float *hid = cm_malloc((size_t)(down ? n : bmax) * E * sizeof *hid);
    double *acc = cm_calloc((size_t)E, sizeof *acc);
    if (!hid || !acc) {
        rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        goto out;
    }
    if (down && (rc = cm_engine_embed_rows_cluster(e, ids, n, hid, err, errlen))) goto out;
    const float *w = e->m.output_norm.data;
    int32_t pos[CM_BATCH_MAX], seq[CM_BATCH_MAX] = {0};
    cm_kv *kvs[1] = {&kv};
    for (int done = 0; done < n;) {
        int nb = down ? n : CM_MIN(bmax, n - done);
        for (int i = 0; i < nb && !down; i++) pos[i] = done + i;
        cm_batch b = {.n = nb, .tokens = ids + done, .pos = pos, .seq = seq};
        cm_forward_args a = {
            .layer_first = 0, .layer_last = hp->n_layer, .slice = e->slice, .kvs = kvs, .n_kvs = 1, .out_hidden = hid};
        pthread_mutex_lock(&e->mu);
        rc = down ? 0 : cm_forward(e->ctx, &b, &a, err, errlen);
        pthread_mutex_unlock(&e->mu);
        if (rc) goto out;
        for (int i = 0; i < nb; i++) {
            int t = done + i;
            if ((pooling == CM_POOLING_CLS && t != 0) || (pooling == CM_POOLING_LAST && t != n - 1)) continue;
            /* the output norm, as the forward pass applies it before the head */
            const float *x = hid + (size_t)i * E;
            double ss = 0.0;
            for (int k = 0; k < E; k++) ss += (double)(x[k] * x[k]);
            float scale = 1.0f / sqrtf((float)(ss / E) + hp->rms_eps);
            for (int k = 0; k < E; k++) acc[k] += (double)(x[k] * scale * w[k]);
        }
        done += nb;
    }
    double div = pooling == CM_POOLING_MEAN ? n : 1, nrm = 0.0;
    for (int k = 0; k < E; k++) nrm += (acc[k] / div) * (acc[k] / div);
    nrm = normalize && nrm > 0 ? 1.0 / sqrt(nrm) : 1.0;
    for (int k = 0; k < E; k++) out[k] = (float)(acc[k] / div * nrm);
out:
    cm_free(acc);
    cm_free(hid);
    if (!down) cm_kv_release(&kv);
    return rc;
}
