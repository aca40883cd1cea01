/*
 * load.c: binds a cm_model to a parsed GGUF: hyperparameters from metadata,
 * tensors as views into the mapped bytes, and validation of every tensor's
 * presence, type and shape so that the forward pass can trust them.
 * It must never copy weight data, and never accept a file it cannot run:
 * every rejection names the architecture, tensor or type at fault.
 */
#include "model.h"
#include "mla.h"
#include "moe.h"
#include "gptoss.h"
#include "meta.h"

#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *const k_arch_names[CM_ARCH_COUNT] = {"llama",  "qwen2", "qwen3",   "qwen2moe", "qwen3moe",
                                                        "gemma3", "phi3",  "gpt-oss", "deepseek2"};

const char *cm_arch_name_of(enum cm_arch a) { return (unsigned)a < CM_ARCH_COUNT ? k_arch_names[a] : "unknown"; }

int cm_meta_int(const cm_gguf *g, const char *arch, const char *suffix, long def, long lo, long hi, int *out, char *err,
                size_t errlen) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v;
    if (!cm_gguf_get_u64(g, key, &v)) {
        if (cm_gguf_find_kv(g, key))
            return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' is not a non-negative integer", key);
        if (def < 0) return cm_errf(err, errlen, CM_EFORMAT, "missing metadata '%s'", key);
        *out = (int)def;
        return 0;
    }
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' = %llu is out of range [%ld, %ld]", key,
                       (unsigned long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

int cm_meta_float(const cm_gguf *g, const char *arch, const char *suffix, double def, double lo, double hi, float *out,
                  char *err, size_t errlen) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    if (!cm_gguf_get_f64(g, key, &v)) {
        if (cm_gguf_find_kv(g, key)) return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' is not a number", key);
        v = def;
    }
    if (!(v >= lo && v <= hi)) return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' = %g is out of range", key, v);
    *out = (float)v;
    return 0;
}

static void fmt_shape(char *b, size_t n, int nd, const int64_t *ne) {
    size_t o = 0;
    o += (size_t)snprintf(b + o, n - o, "[");
    for (int i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(b + o, n - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < n) snprintf(b + o, n - o, "]");
}

/* Bind tensor `name` with expected shape [ne0] or [ne0, ne1] (ne1 == 0: 1-D).
 * weight: any type the kernels support; otherwise F32 only (norms, biases). */
static int bind(cm_model *m, cm_tensor *t, const char *name, int64_t ne0, int64_t ne1, bool weight, bool optional,
                char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    const cm_gguf_tensor_info *ti = cm_gguf_find_tensor(m->gguf, name);
    if (!ti) {
        if (optional) return 0;
        return cm_errf(err, errlen, CM_EFORMAT, "missing tensor '%s'", name);
    }
    if (weight ? !cm_kernels_supports((enum cm_type)ti->type) : ti->type != CM_TYPE_F32)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' has unsupported type %s", name,
                       cm_type_name(ti->type));
    int nd = ne1 ? 2 : 1;
    int64_t want[2] = {ne0, ne1};
    bool ok = true;
    for (int i = 0; i < CM_MAX_DIMS; i++) {
        int64_t have = i < ti->n_dims ? ti->ne[i] : 1;
        int64_t exp = i < nd ? want[i] : 1;
        if (have != exp) ok = false;
    }
    if (!ok) {
        char hs[96], ws[96];
        fmt_shape(hs, sizeof hs, ti->n_dims, ti->ne);
        fmt_shape(ws, sizeof ws, nd, want);
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' has shape %s, expected %s", name, hs, ws);
    }
    int64_t ne[2] = {ne0, ne1 ? ne1 : 1};
    if (cm_row_size((enum cm_type)ti->type, ne0) == 0)
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s': row length %lld is not a multiple of the %s block", name,
                       (long long)ne0, cm_type_name(ti->type));
    cm_tensor_init(t, (enum cm_type)ti->type, nd, ne, (void *)ti->data, ti->name);
    if (cm_tensor_nbytes(t) > ti->nbytes)
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' is shorter than its shape", name);
    m->n_params += (uint64_t)ne[0] * (uint64_t)ne[1];
    m->weight_bytes += cm_tensor_nbytes(t);
    return 0;
}

static int bind_blk(cm_model *m, cm_tensor *t, int il, const char *suffix, int64_t ne0, int64_t ne1, bool weight,
                    bool optional, char *err, size_t errlen) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return bind(m, t, name, ne0, ne1, weight, optional, err, errlen);
}

/* gemma3: sliding-window layers and their RoPE base, q scale (llama.cpp's
 * llm_build_gemma3_iswa and its hparams: pattern 6, local base 10000, the
 * 27B (62 layers) scales q by 1/sqrt(n_embd / n_head)). */
static int load_hparams_gemma3(cm_model *m, char *err, size_t errlen) {
    cm_hparams *hp = &m->hp;
    int rc;
    if ((rc = cm_meta_int(m->gguf, "gemma3", "attention.sliding_window", 0, 0, 1L << 30, &hp->n_swa, err, errlen)) ||
        (rc = cm_meta_int(m->gguf, "gemma3", "attention.sliding_window_pattern", 6, 0, 4096, &hp->swa_pattern, err,
                          errlen)) ||
        (rc = cm_meta_float(m->gguf, "gemma3", "rope.freq_base_swa", 10000.0, 1e-3, 1e12, &hp->rope_base_swa, err,
                            errlen)))
        return rc;
    hp->attn_q_scale =
        hp->n_layer == 62 ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)) : 1.0f / sqrtf((float)hp->head_dim);
    return 0;
}

/* Rows [r0, r1) of a bound 2-D tensor, as a tensor of its own (phi3's fused
 * weights; counted once, by bind()). */
static cm_tensor rows_of(const cm_tensor *w, int64_t r0, int64_t r1) {
    cm_tensor t = *w;
    t.data = (char *)w->data + (size_t)r0 * w->nb[1];
    t.ne[1] = r1 - r0;
    return t;
}

/* phi3: attn_qkv [E, QD + 2 KD] or separate q/k/v; ffn_up [E, 2F] holding
 * the gate rows then the up rows (ggml_swiglu on the fused product). */
static int bind_phi3(cm_model *m, cm_layer *L, int il, int64_t E, int64_t QD, int64_t KD, int64_t F, char *err,
                     size_t errlen) {
    int rc;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
    if (cm_gguf_find_tensor(m->gguf, name)) {
        cm_tensor qkv;
        if ((rc = bind(m, &qkv, name, E, QD + 2 * KD, true, false, err, errlen))) return rc;
        L->wq = rows_of(&qkv, 0, QD);
        L->wk = rows_of(&qkv, QD, QD + KD);
        L->wv = rows_of(&qkv, QD + KD, QD + 2 * KD);
    } else if ((rc = bind_blk(m, &L->wq, il, "attn_q.weight", E, QD, true, false, err, errlen)) ||
               (rc = bind_blk(m, &L->wk, il, "attn_k.weight", E, KD, true, false, err, errlen)) ||
               (rc = bind_blk(m, &L->wv, il, "attn_v.weight", E, KD, true, false, err, errlen))) {
        return rc;
    }
    cm_tensor up;
    if ((rc = bind_blk(m, &up, il, "ffn_up.weight", E, 2 * F, true, false, err, errlen))) return rc;
    L->ffn_gate = rows_of(&up, 0, F);
    L->ffn_up = rows_of(&up, F, 2 * F);
    return 0;
}

static int load_hparams(cm_model *m, char *err, size_t errlen) {
    const cm_gguf *g = m->gguf;
    cm_hparams *hp = &m->hp;
    const cm_gguf_kv *gt = cm_gguf_find_kv(g, "general.type"); /* llama.cpp's LoRA files: model/lora.h */
    if (gt && gt->type == CM_GGUF_STRING && gt->v.str.len == 7 && !memcmp(gt->v.str.ptr, "adapter", 7))
        return cm_errf(err, errlen, CM_EFORMAT, "this is a LoRA adapter, not a model (give it to --lora)");
    char *arch = cm_gguf_get_str(g, "general.architecture");
    if (!arch) return cm_errf(err, errlen, CM_EFORMAT, "missing metadata 'general.architecture'");
    int a = -1;
    for (int i = 0; i < CM_ARCH_COUNT; i++)
        if (!strcmp(arch, k_arch_names[i])) a = i;
    if (a < 0) {
        char list[256] = "";
        for (int i = 0; i < CM_ARCH_COUNT; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", k_arch_names[i]);
        int rc = cm_errf(err, errlen, CM_EUNSUPPORTED,
                         "unknown architecture '%.64s' (supported: %s; llama with experts = Mixtral)", arch, list);
        cm_free(arch);
        return rc;
    }
    cm_free(arch);
    hp->arch = (enum cm_arch)a;
    const char *an = k_arch_names[a];
    const long big = 1L << 24;
    int rc;
    if ((rc = cm_meta_int(g, an, "embedding_length", -1, 1, big, &hp->n_embd, err, errlen)) ||
        (rc = cm_meta_int(g, an, "block_count", -1, 1, 4096, &hp->n_layer, err, errlen)) ||
        (rc = cm_meta_int(g, an, "attention.head_count", -1, 1, 4096, &hp->n_head, err, errlen)) ||
        (rc = cm_meta_int(g, an, "attention.head_count_kv", hp->n_head, 1, hp->n_head, &hp->n_head_kv, err, errlen)) ||
        (rc = cm_meta_int(g, an, "context_length", 2048, 1, 1L << 30, &hp->n_ctx_train, err, errlen)))
        return rc;
    if (hp->n_head % hp->n_head_kv)
        return cm_errf(err, errlen, CM_EFORMAT, "head count %d is not a multiple of the KV head count %d", hp->n_head,
                       hp->n_head_kv);
    if (hp->arch == CM_ARCH_DEEPSEEK2) return cm_mla_load_hparams(m, err, errlen); /* MLA's own head sizes */
    long def_hd = hp->n_embd % hp->n_head ? -1 : hp->n_embd / hp->n_head;
    if ((rc = cm_meta_int(g, an, "attention.key_length", def_hd, 2, 65536, &hp->head_dim, err, errlen))) return rc;
    int vlen;
    if ((rc = cm_meta_int(g, an, "attention.value_length", hp->head_dim, 1, 65536, &vlen, err, errlen))) return rc;
    if (vlen != hp->head_dim)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "value length %d differs from key length %d", vlen, hp->head_dim);
    if ((rc = cm_meta_int(g, an, "rope.dimension_count", hp->head_dim, 2, hp->head_dim, &hp->n_rot, err, errlen)))
        return rc;
    if (hp->n_rot % 2) return cm_errf(err, errlen, CM_EFORMAT, "rope dimension count %d is odd", hp->n_rot);
    if ((rc = cm_meta_float(g, an, "attention.layer_norm_rms_epsilon", 1e-5, 0, 1, &hp->rms_eps, err, errlen)) ||
        (rc = cm_meta_float(g, an, "rope.freq_base", 10000.0, 1e-3, 1e12, &hp->rope_base, err, errlen)))
        return rc;
    if (hp->arch == CM_ARCH_GPTOSS) { /* its own YaRN and sliding-window keys (gptoss.c) */
        hp->rope_freq_scale = 1.0f;
        hp->rope_type = CM_ROPE_NEOX;
        return cm_gptoss_load_hparams(m, err, errlen);
    }
    if ((rc =
             cm_rope_scaling_read(g, an, hp->n_ctx_train, hp->n_rot, hp->rope_base, 0, &hp->rope_scaling, err, errlen)))
        return rc;
    hp->rope_freq_scale = hp->rope_scaling.freq_scale;
    hp->rope_type = hp->arch == CM_ARCH_LLAMA ? CM_ROPE_NORM : CM_ROPE_NEOX;
    if (hp->arch == CM_ARCH_GEMMA3) return load_hparams_gemma3(m, err, errlen);
    if (hp->arch == CM_ARCH_PHI3) { /* llm_build_phi3: ggml_scale(q, 1/sqrtf(D)) after RoPE, kq scale 1 */
        hp->attn_q_scale = 1.0f / sqrtf((float)hp->head_dim);
        /* llama.cpp disables phi3's sliding window (its converters fill the key wrongly); so do we */
        if (cm_gguf_find_tensor(g, "rope_factors_long.weight"))
            return cm_errf(err, errlen, CM_EUNSUPPORTED,
                           "phi3 with LongRoPE factors (rope_factors_long.weight) is not supported");
    }
    return 0;
}

void cm_model_release(cm_model *m) {
    if (!m) return;
    cm_repack_drop(m);
    cm_repack_drop(m->layers); /* cm_model_repack_slice's copies */
    cm_free(m->layers);
    cm_aligned_free(m->derived);
    memset(m, 0, sizeof *m);
}

static int repack_whole(cm_model *m, const cm_mapped_file *f, char *err, size_t errlen);

static int load(cm_model *m, const cm_gguf *g, bool whole, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->gguf = g;
    int rc = load_hparams(m, err, errlen);
    if (rc) {
        cm_model_release(m);
        return rc;
    }
    cm_hparams *hp = &m->hp;
    const cm_gguf_tensor_info *te = cm_gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        cm_model_release(m);
        return cm_errf(err, errlen, CM_EFORMAT, "missing tensor 'token_embd.weight'");
    }
    if (te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        cm_model_release(m);
        return cm_errf(err, errlen, CM_EFORMAT, "tensor 'token_embd.weight' has a bad shape");
    }
    hp->n_vocab = (int)te->ne[1];
    /* The FFN width comes from the tensor when the key is missing (old files). */
    const cm_gguf_tensor_info *tg = cm_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
    if (!tg) tg = cm_gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight"); /* MoE: the experts' width */
    long def_ff = tg && tg->n_dims >= 2 && tg->ne[1] > 0 && tg->ne[1] < (1 << 26) ? (long)tg->ne[1] : -1;
    if ((rc = cm_meta_int(g, cm_arch_name_of(hp->arch), "feed_forward_length", def_ff, 1, 1L << 26, &hp->n_ff, err,
                          errlen))) {
        cm_model_release(m);
        return rc;
    }
    if ((rc = cm_moe_load_hparams(m, err, errlen))) {
        cm_model_release(m);
        return rc;
    }
    const int64_t E = hp->n_embd, V = hp->n_vocab, D = hp->head_dim;
    const int64_t QD = (int64_t)hp->n_head * D, KD = (int64_t)hp->n_head_kv * D, F = hp->n_ff;
    m->layers = cm_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        cm_model_release(m);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }

    if ((rc = bind(m, &m->tok_embd, "token_embd.weight", E, V, true, false, err, errlen)) ||
        (rc = bind(m, &m->output_norm, "output_norm.weight", E, 0, false, false, err, errlen)) ||
        (rc = bind(m, &m->output, "output.weight", E, V, true, true, err, errlen)) ||
        (rc = bind(m, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 0, false, true, err, errlen)))
        goto fail;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->tied_output = true;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        cm_layer *L = &m->layers[il];
        bool qwen2 = hp->arch == CM_ARCH_QWEN2 || hp->arch == CM_ARCH_QWEN2MOE;
        bool gemma3 = hp->arch == CM_ARCH_GEMMA3, phi3 = hp->arch == CM_ARCH_PHI3, gptoss = hp->arch == CM_ARCH_GPTOSS;
        /* qwen3, qwen3moe and gemma3 have per-head Q/K norms */
        bool qwen3 = hp->arch == CM_ARCH_QWEN3 || hp->arch == CM_ARCH_QWEN3MOE || gemma3;
        if (phi3 && (rc = bind_phi3(m, L, il, E, QD, KD, F, err, errlen))) goto fail;
        if (hp->arch == CM_ARCH_DEEPSEEK2) { /* MLA (mla.c); leading dense layers, then experts */
            if ((rc = bind_blk(m, &L->attn_norm, il, "attn_norm.weight", E, 0, false, false, err, errlen)) ||
                (rc = bind_blk(m, &L->ffn_norm, il, "ffn_norm.weight", E, 0, false, false, err, errlen)) ||
                (rc = cm_mla_bind_layer(m, il, err, errlen)))
                goto fail;
            if (il >= hp->n_dense_lead
                    ? (rc = cm_moe_bind_layer(m, il, err, errlen)) != 0
                    : ((rc = bind_blk(m, &L->ffn_gate, il, "ffn_gate.weight", E, F, true, false, err, errlen)) ||
                       (rc = bind_blk(m, &L->ffn_up, il, "ffn_up.weight", E, F, true, false, err, errlen)) ||
                       (rc = bind_blk(m, &L->ffn_down, il, "ffn_down.weight", F, E, true, false, err, errlen))))
                goto fail;
            continue;
        }
        if ((rc = bind_blk(m, &L->attn_norm, il, "attn_norm.weight", E, 0, false, false, err, errlen)) ||
            (!phi3 && (rc = bind_blk(m, &L->wq, il, "attn_q.weight", E, QD, true, false, err, errlen))) ||
            (!phi3 && (rc = bind_blk(m, &L->wk, il, "attn_k.weight", E, KD, true, false, err, errlen))) ||
            (!phi3 && (rc = bind_blk(m, &L->wv, il, "attn_v.weight", E, KD, true, false, err, errlen))) ||
            (rc = bind_blk(m, &L->wo, il, "attn_output.weight", QD, E, true, false, err, errlen)) ||
            (rc = bind_blk(m, &L->bq, il, "attn_q.bias", QD, 0, false, !qwen2, err, errlen)) ||
            (rc = bind_blk(m, &L->bk, il, "attn_k.bias", KD, 0, false, !qwen2, err, errlen)) ||
            (rc = bind_blk(m, &L->bv, il, "attn_v.bias", KD, 0, false, !qwen2, err, errlen)) ||
            (rc = bind_blk(m, &L->q_norm, il, "attn_q_norm.weight", D, 0, false, !qwen3, err, errlen)) ||
            (rc = bind_blk(m, &L->k_norm, il, "attn_k_norm.weight", D, 0, false, !qwen3, err, errlen)) ||
            /* gpt-oss calls its pre-FFN norm post_attention_norm */
            (rc = bind_blk(m, &L->ffn_norm, il, gptoss ? "post_attention_norm.weight" : "ffn_norm.weight", E, 0, false,
                           false, err, errlen)) ||
            (!gptoss && (rc = bind_blk(m, &L->attn_post_norm, il, "post_attention_norm.weight", E, 0, false, !gemma3,
                                       err, errlen))) ||
            (rc = bind_blk(m, &L->ffn_post_norm, il, "post_ffw_norm.weight", E, 0, false, !gemma3, err, errlen)))
            goto fail;
        if (hp->n_expert
                ? (rc = cm_moe_bind_layer(m, il, err, errlen)) != 0
                : ((!phi3 && (rc = bind_blk(m, &L->ffn_gate, il, "ffn_gate.weight", E, F, true, false, err, errlen))) ||
                   (!phi3 && (rc = bind_blk(m, &L->ffn_up, il, "ffn_up.weight", E, F, true, false, err, errlen))) ||
                   (rc = bind_blk(m, &L->ffn_down, il, "ffn_down.weight", F, E, true, false, err, errlen))))
            goto fail;
        if (gptoss && (rc = cm_gptoss_bind_layer(m, il, err, errlen))) goto fail;
        char bname[96];
        snprintf(bname, sizeof bname, "blk.%d.attn_output.bias", il);
        if (!gptoss && cm_gguf_find_tensor(g, bname)) {
            rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' is not supported", bname);
            goto fail;
        }
    }
    cm_moe_count_active(m);
    /* Decode-layout copies of the matmul weights for this CPU's kernels
     * (kernels.h; results are the same bits with or without them). They cost
     * up to the weights' size again, so only for a file read into memory
     * (a model run whole, or a node's slice: every layer here runs) and only
     * while that much memory is free with cm_gguf_worth_loading's margin. A
     * mapped file (a coordinator's or a pipeline stage's whole-model file, or
     * one that only just fits) keeps the file's layout alone.
     * Where the copy serves every pass (repack.c: gemv and gemm both read
     * it), the file's pages under it go back to the OS: one copy resident.
     * NEEDSWORK: repack in place instead of beside, then every file can. */
    m->repack = g->file.in_memory && cm_gguf_worth_loading(g->size);
    if (m->repack && whole && (rc = repack_whole(m, &g->file, err, errlen))) goto fail;
    /* the kernels' knobs for these weights on this CPU: cached, or measured on them (a whole model
     * in memory; a cluster member loading its slice does not stall its links for it, and takes the
     * cache or the defaults); without memory for the scratch they stay as they are (same bits) */
    (void)cm_model_tune(m, whole && g->file.in_memory);
    return 0;
fail:
    cm_model_release(m);
    return rc;
}

/* The whole tensors' copies; f (NULL: none): the file read into memory
 * whose pages under them go back as each layer is repacked (repack.c), so
 * the load's peak holds the file and one layer's copies, not two models. */
static int repack_whole(cm_model *m, const cm_mapped_file *f, char *err, size_t errlen) {
    int rc = 0;
    for (int il = 0; il < m->hp.n_layer && !rc; il++) {
        const cm_layer *L = &m->layers[il];
        const cm_tensor *ws[CM_LAYER_MATMULS];
        cm_layer_matmuls(L, ws);
        rc = cm_repack_add(m, cm_kernels_get(), ws, CM_LAYER_MATMULS, err, errlen);
        /* the experts only at load (f): where their pages go back, one copy is held */
        if (!rc && f && L->ffn_gate_exps.data) rc = cm_moe_repack_layer(m, il, err, errlen);
        if (!rc && f) (void)cm_repack_give_back(m, cm_kernels_get(), f);
    }
    if (!rc) rc = cm_repack_add(m, cm_kernels_get(), (const cm_tensor *const[]){&m->output}, 1, err, errlen);
    if (!rc && f) (void)cm_repack_give_back(m, cm_kernels_get(), f);
    if (rc) cm_repack_drop(m);
    m->repack_whole = !rc;
    return rc;
}

int cm_model_repack_whole(cm_model *m, char *err, size_t errlen) { return repack_whole(m, NULL, err, errlen); }

/* Repacked copies of the views a slice's forward pass multiplies (cm_forward's
 * layer loop); the whole tensors' copies are dropped unless deepseek2 needs them. */
int cm_model_repack_slice(cm_model *m, cm_slice s, char *err, size_t errlen) {
    const void *owner = m->layers; /* the slice's copies (the whole tensors' are under m) */
    if (!owner || !m->repack) return 0;
    cm_repack_drop(owner);
    const cm_slice full = cm_slice_full(m);
    const cm_hparams *hp = &m->hp;
    const bool whole = s.h0 == full.h0 && s.h1 == full.h1 && s.f0 == full.f0 && s.f1 == full.f1;
    /* deepseek2's attention has its own views (mla.c) of whole copies */
    const bool slim = hp->arch != CM_ARCH_DEEPSEEK2;
    if (whole || !slim) {
        if (!m->repack_whole && cm_model_repack_whole(m, err, errlen)) return CM_ENOMEM;
        if (whole) return 0;
    } else if (m->repack_whole) {
        cm_repack_drop(m);
        m->repack_whole = false;
    }
    const int64_t D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    int rc = slim ? cm_repack_add(owner, cm_kernels_get(), (const cm_tensor *const[]){&m->output}, 1, err, errlen) : 0;
    const size_t head = cm_repack_bytes(owner);
    size_t whole_layers = 0; /* what the whole layers' copies cost */
    for (int il = 0; il < hp->n_layer; il++) {
        const cm_layer *L = &m->layers[il];
        const cm_tensor *ws[CM_LAYER_MATMULS];
        cm_layer_matmuls(L, ws);
        for (int i = 0; i < CM_LAYER_MATMULS; i++) whole_layers += cm_repack_size(cm_kernels_get(), ws[i]);
    }
    for (int il = 0; il < hp->n_layer && !rc; il++) {
        const cm_layer *L = &m->layers[il];
        cm_tensor v[7];
        int n = 0;
        /* the views forward() makes (cm_forward's layer loop) */
        if (hp->arch != CM_ARCH_DEEPSEEK2) {
            if (slim) {
                v[n++] = cm_tensor_rows(&L->wq, (int64_t)s.h0 * rep * D, (int64_t)s.h1 * rep * D);
                v[n++] = cm_tensor_rows(&L->wk, (int64_t)s.h0 * D, (int64_t)s.h1 * D);
                v[n++] = cm_tensor_rows(&L->wv, (int64_t)s.h0 * D, (int64_t)s.h1 * D);
            }
            v[n++] = cm_tensor_cols(&L->wo, (int64_t)s.h0 * rep * D, (int64_t)s.h1 * rep * D);
        }
        if (!L->ffn_gate_inp.data && L->ffn_down.data) {
            if (slim) {
                v[n++] = cm_tensor_rows(&L->ffn_gate, s.f0, s.f1);
                v[n++] = cm_tensor_rows(&L->ffn_up, s.f0, s.f1);
            }
            v[n++] = cm_tensor_cols(&L->ffn_down, s.f0, s.f1);
        }
        const cm_tensor *ws[7];
        for (int i = 0; i < n; i++) ws[i] = &v[i];
        rc = n ? cm_repack_add(owner, cm_kernels_get(), ws, n, err, errlen) : 0;
    }
    if (rc) {
        cm_repack_drop(owner);
        return rc;
    }
    /* (tests/sh/cluster_tp_repack.sh reads this line) */
    CM_LOGD("tensor parallel: slice copies of KV heads [%d, %d) of %d and FFN rows [%d, %d) of %d: %zu bytes of the "
            "layers' %zu (+ %zu for the head); whole copies kept: %zu bytes",
            s.h0, s.h1, full.h1, s.f0, s.f1, full.f1, cm_repack_bytes(owner) - head, whole_layers, head,
            cm_repack_bytes(m));
    return 0;
}

int cm_model_load(cm_model *m, const cm_gguf *g, char *err, size_t errlen) { return load(m, g, true, err, errlen); }

int cm_model_open_for_slice(cm_gguf *g, cm_model *m, const char *path, cm_gguf_progress_fn progress, void *progress_ctx,
                            char *err, size_t errlen) {
    /* read in when it fits: a member's prefill gemm reads the file's layout (its slice rows, and
     * every row of wo/ffn_down's columns), which through 4 KiB mapped pages cost it ~35% of its
     * prompt speed (HISTORY.md 2026-12-04) */
    struct stat st;
    const bool in = stat(path, &st) == 0 && cm_gguf_worth_loading((uint64_t)st.st_size);
    int rc = in ? cm_gguf_load(g, path, progress, progress_ctx, err, errlen)
                : cm_gguf_open(g, path, progress, progress_ctx, err, errlen);
    if (rc) return rc;
    char e[400];
    if ((rc = load(m, g, false, e, sizeof e))) return cm_errf(err, errlen, rc, "'%s': %s", path, e);
    /* (tests/sh/cluster_tp_repack.sh reads this line) */
    CM_LOGD("tensor parallel: '%s' %s", path, in ? "read into memory, its slice copied from it" : "mapped");
    return 0;
}

cm_slice cm_slice_full(const cm_model *m) {
    /* deepseek2: query heads (its one KV "head" is the latent every head shares) */
    cm_slice s = {0, m->hp.arch == CM_ARCH_DEEPSEEK2 ? m->hp.n_head : m->hp.n_head_kv, 0, m->hp.n_ff};
    return s;
}

void cm_slice_head_rows(const cm_model *m, cm_slice s, int *v0, int *v1) {
    int64_t V = m->hp.n_vocab, F = m->hp.n_ff > 0 ? m->hp.n_ff : 1;
    *v0 = (int)(V * s.f0 / F);
    *v1 = s.f1 >= F ? (int)V : (int)(V * s.f1 / F);
}

int cm_expert_slice_check(const cm_model *m, cm_slice s, cm_expert_slice x, char *err, size_t errlen) {
    return cm_moe_check_experts(m, s, x, err, errlen);
}

int cm_slice_check(const cm_model *m, cm_slice s, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    if (s.h0 < 0 || s.h1 > cm_slice_full(m).h1 || s.h0 > s.h1 || s.f0 < 0 || s.f1 > hp->n_ff || s.f0 > s.f1)
        return cm_errf(err, errlen, CM_EINVAL,
                       "slice heads [%d, %d) ffn [%d, %d) is out of range (kv heads %d, ffn %d)", s.h0, s.h1, s.f0,
                       s.f1, cm_slice_full(m).h1, hp->n_ff);
    if (hp->n_expert) return cm_moe_check_slice(m, s, err, errlen);
    int64_t cols_per_kv = (int64_t)(hp->n_head / hp->n_head_kv) * hp->head_dim;
    for (int il = 0; il < hp->n_layer; il++) {
        const cm_layer *L = &m->layers[il];
        int bo = cm_type_traits_of(L->wo.type)->block_size;
        int bd = cm_type_traits_of(L->ffn_down.type)->block_size;
        if ((s.h0 * cols_per_kv) % bo || (s.h1 * cols_per_kv) % bo)
            return cm_errf(err, errlen, CM_EINVAL, "slice heads [%d, %d) do not fall on %s block boundaries of '%s'",
                           s.h0, s.h1, cm_type_name(L->wo.type), L->wo.name);
        if (s.f0 % bd || s.f1 % bd)
            return cm_errf(err, errlen, CM_EINVAL, "slice ffn rows [%d, %d) do not fall on %s block boundaries of '%s'",
                           s.f0, s.f1, cm_type_name(L->ffn_down.type), L->ffn_down.name);
    }
    return 0;
}
