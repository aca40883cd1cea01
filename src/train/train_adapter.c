/*
 * train_adapter.c: the trainable LoRA adapter (train.h): which weights it
 * targets, its F32 parameters with their gradients and AdamW moments, and
 * the AdamW step. Never touches the base model's weights.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const tnames[CM_LORA_OUTPUT] = {"attn_q",   "attn_k", "attn_v",  "attn_o",
                                                   "ffn_gate", "ffn_up", "ffn_down"};

int cm_train_targets_parse(const char *s, unsigned *targets, char *err, size_t errlen) {
    unsigned t = 0;
    const char *p = s;
    while (*p) {
        size_t n = strcspn(p, ",");
        bool found = false;
        if (n == 3 && !strncmp(p, "all", 3)) t |= CM_TRAIN_TARGETS_ALL, found = true;
        else if (n == 4 && !strncmp(p, "attn", 4)) t |= 0xfu, found = true;
        else if (n == 3 && !strncmp(p, "ffn", 3)) t |= 0x70u, found = true;
        else if (n == 11 && !strncmp(p, "attn_output", 11)) t |= 1u << CM_LORA_O, found = true;
        for (int k = 0; k < CM_LORA_OUTPUT && !found; k++)
            if (strlen(tnames[k]) == n && !strncmp(p, tnames[k], n)) t |= 1u << k, found = true;
        if (!found)
            return cm_errf(
                err, errlen, CM_EINVAL,
                "unknown LoRA target '%.*s' (attn_q, attn_k, attn_v, attn_o, ffn_gate, ffn_up, ffn_down, attn, ffn, all)",
                (int)(n > 64 ? 64 : n), p);
        p += n;
        if (*p == ',') p++;
    }
    if (!t) return cm_errf(err, errlen, CM_EINVAL, "no LoRA targets given");
    *targets = t;
    return 0;
}

int cm_train_check_model(const cm_model *m, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    if ((hp->arch != CM_ARCH_LLAMA && hp->arch != CM_ARCH_QWEN2 && hp->arch != CM_ARCH_QWEN3) || hp->n_expert > 0)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "fine-tuning supports the dense llama, qwen2 and qwen3 architectures, not %s%s",
                       cm_arch_name_of(hp->arch), hp->n_expert > 0 ? " with experts" : "");
    if (hp->n_head % hp->n_head_kv || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "fine-tuning: unsupported head layout");
    return 0;
}

static const cm_tensor *target_tensor(const cm_model *m, int il, int t) {
    const cm_tensor *v[CM_LAYER_MATMULS];
    cm_layer_matmuls(&m->layers[il], v);
    return v[t];
}

static int build(cm_tadapter **out, const cm_model *m, int rank, float alpha, unsigned targets, int l0, int l1,
                 char *err, size_t errlen) {
    *out = NULL;
    int rc = cm_train_check_model(m, err, errlen);
    if (rc) return rc;
    if (rank < 1 || rank > CM_LORA_MAX_RANK)
        return cm_errf(err, errlen, CM_EINVAL, "rank %d is out of [1, %d]", rank, CM_LORA_MAX_RANK);
    if (!(alpha > 0 && alpha < 1e6f)) return cm_errf(err, errlen, CM_EINVAL, "alpha %g is out of (0, 1e6)", alpha);
    if (!(targets & CM_TRAIN_TARGETS_ALL)) return cm_errf(err, errlen, CM_EINVAL, "no LoRA targets");
    const int nl = m->hp.n_layer;
    cm_tadapter *a = cm_calloc(1, sizeof *a);
    if (!a) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    a->m = m;
    a->rank = rank;
    a->alpha = alpha;
    a->scale = alpha / (float)rank;
    a->targets = targets & CM_TRAIN_TARGETS_ALL;
    a->pairs = cm_calloc((size_t)nl * CM_LORA_OUTPUT, sizeof *a->pairs);
    a->slot = cm_malloc((size_t)nl * CM_LORA_OUTPUT * sizeof(int));
    if (!a->pairs || !a->slot) {
        cm_tadapter_free(a);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    size_t off = 0;
    for (int il = 0; il < nl; il++)
        for (int t = 0; t < CM_LORA_OUTPUT; t++) {
            a->slot[il * CM_LORA_OUTPUT + t] = -1;
            if (!(a->targets & (1u << t))) continue;
            if (il < l0) a->pair0++;
            if (il < l0 || il >= l1) continue;
            const cm_tensor *w = target_tensor(m, il, t);
            cm_tpair *p = &a->pairs[a->n_pairs];
            p->il = il;
            p->t = (enum cm_lora_target)t;
            p->n_in = w->ne[0];
            p->n_out = w->ne[1];
            p->a = off;
            off += (size_t)(rank * p->n_in);
            p->b = off;
            off += (size_t)(rank * p->n_out);
            a->slot[il * CM_LORA_OUTPUT + t] = a->n_pairs++;
        }
    a->n_params = off;
    a->w = cm_calloc(off, sizeof(float));
    a->g = cm_calloc(off, sizeof(float));
    a->m1 = cm_calloc(off, sizeof(float));
    a->m2 = cm_calloc(off, sizeof(float));
    if (!a->w || !a->g || !a->m1 || !a->m2) {
        cm_tadapter_free(a);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for %zu adapter parameters", off);
    }
    *out = a;
    return 0;
}

int cm_tadapter_new_range(cm_tadapter **out, const cm_model *m, int rank, float alpha, unsigned targets, int l0, int l1,
                          char *err, size_t errlen) {
    if (l0 < 0 || l1 <= l0 || l1 > m->hp.n_layer)
        return cm_errf(err, errlen, CM_EINVAL, "layers [%d, %d) of %d", l0, l1, m->hp.n_layer);
    return build(out, m, rank, alpha, targets, l0, l1, err, errlen);
}

void cm_tadapter_span(const cm_tadapter *a, int l0, int l1, size_t *off, size_t *n) {
    size_t b = a->n_params, e = 0;
    for (int i = 0; i < a->n_pairs; i++) {
        const cm_tpair *p = &a->pairs[i];
        if (p->il < l0 || p->il >= l1) continue;
        if (p->a < b) b = p->a;
        const size_t end = p->b + (size_t)a->rank * (size_t)p->n_out;
        if (end > e) e = end;
    }
    *off = e > b ? b : 0;
    *n = e > b ? e - b : 0;
}

int cm_tadapter_new(cm_tadapter **out, const cm_model *m, int rank, float alpha, unsigned targets, uint64_t seed,
                    char *err, size_t errlen) {
    int rc = build(out, m, rank, alpha, targets, 0, m->hp.n_layer, err, errlen);
    if (rc) return rc;
    cm_tadapter *a = *out;
    cm_rng rng;
    cm_rng_seed(&rng, seed ^ 0x4c6f5241ull);
    for (int i = 0; i < a->n_pairs; i++) {
        const cm_tpair *p = &a->pairs[i];
        const float bound = 1.0f / sqrtf((float)p->n_in);
        float *A = a->w + p->a;
        for (int64_t k = 0; k < rank * p->n_in; k++) A[k] = (2.0f * cm_rng_uniform(&rng) - 1.0f) * bound;
    }
    *out = a;
    return 0;
}

void cm_tadapter_free(cm_tadapter *a) {
    if (!a) return;
    cm_free(a->pairs);
    cm_free(a->slot);
    cm_free(a->w);
    cm_free(a->g);
    cm_free(a->m1);
    cm_free(a->m2);
    cm_free(a);
}

void cm_tadapter_adamw(cm_tadapter *a, float lr, float beta1, float beta2, float eps, float wd) {
    a->step++;
    const double bc1 = 1.0 - pow((double)beta1, (double)a->step), bc2 = 1.0 - pow((double)beta2, (double)a->step);
    const float c1 = (float)(1.0 / bc1), c2 = (float)(1.0 / bc2);
    for (size_t i = 0; i < a->n_params; i++) {
        const float g = a->g[i];
        a->m1[i] = beta1 * a->m1[i] + (1.0f - beta1) * g;
        a->m2[i] = beta2 * a->m2[i] + (1.0f - beta2) * g * g;
        const float mh = a->m1[i] * c1, vh = a->m2[i] * c2;
        a->w[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * a->w[i]);
        a->g[i] = 0.0f;
    }
}
