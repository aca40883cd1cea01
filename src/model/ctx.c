/*
 * ctx.c: the forward context (struct cm_ctx, forward_ctx.h): its scratch,
 * sized once for a batch and a context so that cm_forward never allocates,
 * and its settings (kernels, LoRA, offload, activation hook).
 */
#include "forward_ctx.h"

#include <string.h>

static void *zalloc(size_t n) {
    void *p = cm_aligned_alloc(n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}

cm_ctx *cm_ctx_new(const cm_model *m, int max_batch, int max_ctx, cm_pool *pool, char *err, size_t errlen) {
    if (max_batch < 1 || max_batch > 65536 || max_ctx < 1 || max_ctx > (1 << 24)) {
        cm_errf(err, errlen, CM_EINVAL, "batch %d / context %d out of range", max_batch, max_ctx);
        return NULL;
    }
    cm_ctx *c = cm_calloc(1, sizeof *c);
    if (!c) {
        cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        return NULL;
    }
    const cm_hparams *hp = &m->hp;
    size_t B = (size_t)max_batch, E = (size_t)hp->n_embd, QD = (size_t)hp->n_head * hp->head_dim;
    size_t KD = (size_t)hp->n_head_kv * hp->head_dim,
           F = hp->n_expert && !hp->n_dense_lead ? 0 : (size_t)hp->n_ff; /* MoE: moe.c's scratch */
    size_t kmax = CM_MAX(E, CM_MAX(QD, F));
    c->m = m;
    c->k = cm_kernels_get();
    c->pool = pool;
    c->n_threads = cm_pool_size(pool);
    c->max_batch = max_batch;
    c->max_ctx = max_ctx;
    c->x = zalloc(B * E * 4);
    c->xn = zalloc(B * E * 4);
    c->part = zalloc(B * E * 4);
    c->q = zalloc(B * QD * 4);
    c->att = zalloc(B * QD * 4);
    c->kc = zalloc(B * KD * 4);
    c->vc = zalloc(B * KD * 4);
    c->gate = zalloc(B * F * 4);
    c->up = zalloc(B * F * 4);
    c->rope = zalloc(B * (size_t)hp->n_rot * 4);
    c->rope_swa = zalloc(B * (size_t)hp->n_rot * 4);
    c->scores = zalloc((size_t)c->n_threads * cm_fwd_scores_stride(max_ctx, hp->head_dim) * 4);
    c->split = hp->n_head_kv > 0 ? cm_calloc(cm_fwd_split_floats(m, max_ctx, c->n_threads), sizeof(float)) : NULL;
    /* F32 is the widest activation type (4 bytes per element; Q8_K is ~1.14). */
    c->xq_size = B * kmax * 4 + 64;
    c->xq = zalloc(c->xq_size);
    c->out_rows = zalloc(B * 4);
    c->lrow = zalloc(B * sizeof *c->lrow);
    c->lrow_out = zalloc(B * sizeof *c->lrow_out);
    if (hp->arch == CM_ARCH_DEEPSEEK2 && !(c->mla = cm_mla_new(m, max_batch, max_ctx, c->n_threads))) {
        cm_ctx_free(c);
        cm_errf(err, errlen, CM_ENOMEM, "out of memory for latent attention scratch (batch %d)", max_batch);
        return NULL;
    }
    if (hp->n_expert && !(c->moe = cm_moe_new(m, max_batch, c->n_threads))) {
        cm_ctx_free(c);
        cm_errf(err, errlen, CM_ENOMEM, "out of memory for expert scratch (batch %d)", max_batch);
        return NULL;
    }
    if (!c->x || !c->xn || !c->part || !c->q || !c->att || !c->kc || !c->vc || !c->gate || !c->up || !c->rope ||
        !c->rope_swa || !c->scores || !c->xq || !c->out_rows || !c->lrow || !c->lrow_out) {
        cm_ctx_free(c);
        cm_errf(err, errlen, CM_ENOMEM, "out of memory for forward scratch (batch %d)", max_batch);
        return NULL;
    }
    return c;
}

void cm_ctx_free(cm_ctx *c) {
    if (!c) return;
    float *fs[] = {c->x, c->xn, c->q, c->kc, c->vc, c->att, c->part, c->gate, c->up, c->rope, c->rope_swa, c->scores};
    for (size_t i = 0; i < CM_ARRAY_LEN(fs); i++) cm_aligned_free(fs[i]);
    cm_free(c->split);
    cm_aligned_free(c->xq);
    cm_aligned_free(c->out_rows);
    cm_aligned_free((void *)c->lrow);
    cm_aligned_free((void *)c->lrow_out);
    cm_moe_free(c->moe);
    cm_mla_free(c->mla);
    cm_free(c);
}

int cm_ctx_max_batch(const cm_ctx *c) { return c->max_batch; }
void cm_ctx_set_kernels(cm_ctx *c, const cm_kernels *k) { c->k = k ? k : cm_kernels_get(); }
void cm_ctx_set_lora(cm_ctx *c, const cm_lora *l) { c->lora = l; }
void cm_ctx_set_offload(cm_ctx *c, cm_offload_fn fn, void *user) {
    c->offload = fn;
    c->offload_user = user;
}
void cm_ctx_set_act_hook(cm_ctx *c, cm_act_hook_fn fn, void *user) {
    c->hook = fn;
    c->hook_user = user;
}
int cm_ctx_expert_hits(const cm_ctx *c, uint64_t *hits, int n) { return cm_ctx_expert_hits_layer(c, -1, hits, n); }
int cm_ctx_expert_hits_layer(const cm_ctx *c, int il, uint64_t *hits, int n) {
    if (c->moe) cm_moe_hits(c->moe, il, hits, n);
    return c->m->hp.n_expert;
}
