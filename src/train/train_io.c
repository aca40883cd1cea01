/*
 * train_io.c: writing the trained adapter (llama.cpp's LoRA GGUF) and the
 * checkpoints of a fine-tuning run, and reading a checkpoint back
 * (train_io.h). A checkpoint from another run shape is refused with one
 * line, never half loaded.
 */
#include "train_io.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const gguf_names[CM_LORA_OUTPUT] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                       "ffn_gate", "ffn_up", "ffn_down"};

static void put_header(cm_gguf_writer *w, const cm_tadapter *ad, const char *type) {
    cm_gguf_w_str(w, "general.architecture", cm_arch_name_of(ad->m->hp.arch));
    cm_gguf_w_str(w, "general.type", type);
    cm_gguf_w_str(w, "general.name", "cumulo finetune");
    cm_gguf_w_str(w, "adapter.type", "lora");
    cm_gguf_w_f32(w, "adapter.lora.alpha", ad->alpha);
}

int cm_tadapter_write(const cm_tadapter *ad, const char *path, cm_buf *out, char *err, size_t errlen) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (!w) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    put_header(w, ad, "adapter");
    for (int p = 0; p < ad->n_pairs; p++) {
        const cm_tpair *pr = &ad->pairs[p];
        char an[96], bn[96];
        snprintf(an, sizeof an, "blk.%d.%s.weight.lora_a", pr->il, gguf_names[pr->t]);
        snprintf(bn, sizeof bn, "blk.%d.%s.weight.lora_b", pr->il, gguf_names[pr->t]);
        const int64_t ne_a[2] = {pr->n_in, ad->rank}, ne_b[2] = {ad->rank, pr->n_out};
        cm_gguf_w_tensor(w, an, CM_TYPE_F32, 2, ne_a, ad->w + pr->a);
        cm_gguf_w_tensor(w, bn, CM_TYPE_F32, 2, ne_b, ad->w + pr->b);
    }
    int rc = path ? cm_gguf_writer_write(w, path, err, errlen) : cm_gguf_writer_write_buf(w, out, err, errlen);
    cm_gguf_writer_free(w);
    return rc;
}

int cm_train_ckpt_save(const cm_tadapter *ad, const cm_train_ckpt *c, const char *path, char *err, size_t errlen) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (!w) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    put_header(w, ad, "cumulo-finetune-checkpoint");
    cm_gguf_w_u32(w, "finetune.rank", (uint32_t)ad->rank);
    cm_gguf_w_u32(w, "finetune.targets", ad->targets);
    cm_gguf_w_u64(w, "finetune.seed", c->seed);
    cm_gguf_w_u64(w, "finetune.data_id", c->data_id);
    cm_gguf_w_i64(w, "finetune.step", ad->step);
    const int64_t n = (int64_t)ad->n_params, nh[2] = {3, c->n_hist};
    cm_gguf_w_tensor(w, "finetune.params", CM_TYPE_F32, 1, &n, ad->w);
    cm_gguf_w_tensor(w, "finetune.adam_m", CM_TYPE_F32, 1, &n, ad->m1);
    cm_gguf_w_tensor(w, "finetune.adam_v", CM_TYPE_F32, 1, &n, ad->m2);
    if (c->n_hist > 0) cm_gguf_w_tensor(w, "finetune.history", CM_TYPE_F32, 2, nh, c->hist);
    int rc = cm_gguf_writer_write(w, path, err, errlen);
    cm_gguf_writer_free(w);
    return rc;
}

static const cm_gguf_tensor_info *vec(const cm_gguf *g, const char *name, int64_t n) {
    const cm_gguf_tensor_info *t = cm_gguf_find_tensor(g, name);
    if (!t || t->type != CM_TYPE_F32 || t->n_dims != 1 || t->ne[0] != n || t->nbytes < (size_t)n * sizeof(float))
        return NULL;
    return t;
}

int cm_train_ckpt_load(cm_tadapter *ad, cm_train_ckpt *c, const char *path, char *err, size_t errlen) {
    cm_gguf g;
    char msg[512];
    int rc = cm_gguf_open(&g, path, NULL, NULL, msg, sizeof msg);
    if (rc) return cm_errf(err, errlen, rc, "%s", msg);
    char *type = cm_gguf_get_str(&g, "general.type"), *arch = cm_gguf_get_str(&g, "general.architecture");
    uint64_t rank = 0, targets = 0, seed = 0, data_id = 0;
    int64_t step = -1;
    double alpha = 0;
    const int64_t n = (int64_t)ad->n_params;
    const cm_gguf_tensor_info *tw = vec(&g, "finetune.params", n), *tm = vec(&g, "finetune.adam_m", n),
                              *tv = vec(&g, "finetune.adam_v", n), *th = cm_gguf_find_tensor(&g, "finetune.history");
    if (!type || strcmp(type, "cumulo-finetune-checkpoint"))
        rc = cm_errf(err, errlen, CM_EFORMAT, "'%s' is not a cumulo finetune checkpoint", path);
    else if (!arch || strcmp(arch, cm_arch_name_of(ad->m->hp.arch)))
        rc = cm_errf(err, errlen, CM_EINVAL, "checkpoint '%s' is for architecture '%s'", path, arch ? arch : "?");
    else if (!cm_gguf_get_u64(&g, "finetune.rank", &rank) || !cm_gguf_get_u64(&g, "finetune.targets", &targets) ||
             !cm_gguf_get_u64(&g, "finetune.seed", &seed) || !cm_gguf_get_u64(&g, "finetune.data_id", &data_id) ||
             !cm_gguf_get_i64(&g, "finetune.step", &step) || !cm_gguf_get_f64(&g, "adapter.lora.alpha", &alpha) ||
             step < 0)
        rc = cm_errf(err, errlen, CM_EFORMAT, "checkpoint '%s' lacks its finetune.* keys", path);
    else if ((int)rank != ad->rank || (float)alpha != ad->alpha || (unsigned)targets != ad->targets)
        rc = cm_errf(
            err, errlen, CM_EINVAL,
            "checkpoint '%s' is of rank %llu, alpha %g, targets 0x%llx; this run has rank %d, alpha %g, targets 0x%x",
            path, (unsigned long long)rank, alpha, (unsigned long long)targets, ad->rank, ad->alpha, ad->targets);
    else if (seed != c->seed || data_id != c->data_id)
        rc = cm_errf(err, errlen, CM_EINVAL, "checkpoint '%s' was made with another --seed or other data", path);
    else if (!tw || !tm || !tv)
        rc = cm_errf(err, errlen, CM_EFORMAT, "checkpoint '%s' does not hold this adapter's %lld parameters", path,
                     (long long)n);
    else if (th && (th->type != CM_TYPE_F32 || th->n_dims != 2 || th->ne[0] != 3 ||
                    th->nbytes < (size_t)(3 * th->ne[1]) * sizeof(float) || th->ne[1] > (int64_t)1 << 30))
        rc = cm_errf(err, errlen, CM_EFORMAT, "checkpoint '%s' has a bad history", path);
    c->hist = NULL;
    c->n_hist = 0;
    if (!rc && th && th->ne[1] > 0) {
        c->hist = cm_malloc((size_t)(3 * th->ne[1]) * sizeof(float));
        if (!c->hist) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        else {
            memcpy(c->hist, th->data, (size_t)(3 * th->ne[1]) * sizeof(float));
            c->n_hist = th->ne[1];
        }
    }
    if (!rc) {
        memcpy(ad->w, tw->data, (size_t)n * sizeof(float));
        memcpy(ad->m1, tm->data, (size_t)n * sizeof(float));
        memcpy(ad->m2, tv->data, (size_t)n * sizeof(float));
        memset(ad->g, 0, (size_t)n * sizeof(float));
        ad->step = step;
    }
    cm_free(type);
    cm_free(arch);
    cm_gguf_close(&g);
    return rc;
}
