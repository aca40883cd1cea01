/*
 * mla.c: deepseek2's multi-head latent attention (see mla.h for the math)
 * and the deepseek2 hyperparameters.
 *
 * One pool run per layer, in steps separated by barriers: (1) xn converted
 * for wkv_a when its vec_dot_type differs from the first q weight's; (2)
 * the q_a (or q) and kv_a products; (3) per token: q_a's norm and its
 * conversion for wq_b, kv_cmpr's norm and k_pe's RoPE into the cache; (4)
 * wq_b; (5) per (token, head): q_pe's RoPE, the absorbed query wk_b · q_nope,
 * attention over the latent cache, and wv_b · o; (6) wo. It must never
 * allocate in cm_mla_attn() and never cache anything per head: the point of
 * MLA is a cache of (kv_lora_rank + n_rot) values per token and layer.
 */
#include "mla.h"
#include "meta.h"
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---------------- hyperparameters ---------------- */

/* llama.cpp's YaRN settings for deepseek2 (llama_context's yarn_attn_factor
 * with its deepseek2 mscale rule, then the graph's kq_scale). */
static void yarn_params(cm_hparams *hp, float factor, float log_mul, float rope_attn_factor) {
    cm_mla_hparams *a = &hp->mla;
    a->ext_factor = 1.0f;
    hp->rope_freq_scale = 1.0f / factor;
    float attn = 1.0f;
    if (factor > 1.0f) {
        if (log_mul != 0.0f) {
            const float ms_all = log_mul, ms = log_mul != 1.0f ? log_mul : 1.0f;
            attn = (0.1f * ms * logf(factor) + 1.0f) / (0.1f * ms_all * logf(factor) + 1.0f);
        } else {
            attn = 0.1f * logf(factor) + 1.0f;
        }
    }
    attn *= 1.0f / (1.0f + 0.1f * logf(factor));
    attn *= rope_attn_factor;
    a->attn_factor = attn;
    const float org = attn * (1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale));
    const float mscale = org * (1.0f + 0.1f * log_mul * logf(1.0f / hp->rope_freq_scale));
    a->kq_scale = 1.0f * mscale * mscale / sqrtf((float)a->head_k);
}

int cm_mla_load_hparams(cm_model *m, char *err, size_t errlen) {
    const cm_gguf *g = m->gguf;
    cm_hparams *hp = &m->hp;
    cm_mla_hparams *a = &hp->mla;
    int rc, kl, vl, klm, vlm, gating, ex_shared;
    const long big = 1L << 20;
    if ((rc = cm_meta_int(g, "deepseek2", "attention.q_lora_rank", 0, 0, big, &a->q_lora, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "attention.kv_lora_rank", -1, 1, big, &a->kv_lora, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "attention.key_length", -1, 2, big, &kl, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "attention.value_length", -1, 1, big, &vl, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "attention.key_length_mla", 0, 0, big, &klm, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "attention.value_length_mla", 0, 0, big, &vlm, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "rope.dimension_count", -1, 2, big, &hp->n_rot, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "leading_dense_block_count", 0, 0, hp->n_layer, &hp->n_dense_lead, err,
                          errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "expert_shared_count", 0, 0, 64, &ex_shared, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "expert_gating_func", 1, 0, 3, &gating, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "expert_group_count", 0, 0, 1024, &hp->n_expert_groups, err, errlen)) ||
        (rc = cm_meta_int(g, "deepseek2", "expert_group_used_count", 0, 0, 1024, &hp->n_group_used, err, errlen)) ||
        (rc = cm_meta_float(g, "deepseek2", "expert_weights_scale", 0.0, 0.0, 1e6, &hp->expert_scale, err, errlen)) ||
        (rc = cm_meta_float(g, "deepseek2", "attention.layer_norm_rms_epsilon", 1e-6, 0, 1, &hp->rms_eps, err,
                            errlen)) ||
        (rc = cm_meta_float(g, "deepseek2", "rope.freq_base", 10000.0, 1e-3, 1e12, &hp->rope_base, err, errlen)))
        return rc;
    if (hp->n_rot % 2) return cm_errf(err, errlen, CM_EFORMAT, "rope dimension count %d is odd", hp->n_rot);
    if (!klm != !vlm)
        return cm_errf(err, errlen, CM_EFORMAT, "deepseek2: key_length_mla and value_length_mla must come together");
    if (!klm) { /* the unsplit attn_kv_b layout: the keys describe the heads (llama.cpp runs it as MHA) */
        if (hp->n_head_kv != hp->n_head)
            return cm_errf(err, errlen, CM_EFORMAT,
                           "deepseek2 without key_length_mla (unsplit attn_kv_b): head_count_kv %d, expected %d",
                           hp->n_head_kv, hp->n_head);
        a->kv_b = true;
        a->head_k = kl;
        a->head_v = vl;
        hp->n_head_kv = 1; /* the cache holds the latent, as for the split layout */
    } else {
        a->head_k = klm;
        a->head_v = vlm;
        if (kl != a->kv_lora + hp->n_rot || vl != a->kv_lora || hp->n_head_kv != 1)
            return cm_errf(err, errlen, CM_EFORMAT,
                           "deepseek2 MLA: key_length %d, value_length %d, head_count_kv %d (expected %d, %d, 1)", kl,
                           vl, hp->n_head_kv, a->kv_lora + hp->n_rot, a->kv_lora);
    }
    if (a->head_k <= hp->n_rot)
        return cm_errf(err, errlen, CM_EFORMAT, "deepseek2: key_length_mla %d leaves no non-rotated dims (rope %d)",
                       a->head_k, hp->n_rot);
    hp->head_dim = a->kv_lora + hp->n_rot; /* the cache row */
    hp->rope_type = CM_ROPE_NORM;
    hp->rope_freq_scale = 1.0f;
    a->attn_factor = 1.0f;
    a->kq_scale = 1.0f / sqrtf((float)a->head_k);
    if (gating != 0 && gating != 1 && gating != 2)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "deepseek2: expert_gating_func %d is not supported (1 softmax, 2 sigmoid)", gating);
    hp->expert_sigmoid = gating == 2;
    hp->n_ff_shexp = ex_shared; /* times n_ff_exp in cm_moe_load_hparams */
    bool norm = false;
    if (!cm_gguf_get_bool(g, "deepseek2.expert_weights_norm", &norm) &&
        cm_gguf_find_kv(g, "deepseek2.expert_weights_norm"))
        return cm_errf(err, errlen, CM_EFORMAT, "metadata 'deepseek2.expert_weights_norm' is not a bool");
    hp->expert_norm = norm;
    /* RoPE scaling: none, or YaRN (DeepSeek V3's factor 40 and mscale) */
    char *st = cm_gguf_get_str(g, "deepseek2.rope.scaling.type");
    const bool yarn = st && !strcmp(st, "yarn");
    if (st && !yarn && strcmp(st, "none")) {
        rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "deepseek2: rope scaling type '%.32s' is not supported (none, yarn)",
                     st);
        cm_free(st);
        return rc;
    }
    cm_free(st);
    if (yarn) {
        /* llama.cpp reads no beta keys for deepseek2: 32 and 1 */
        float factor, log_mul, attn;
        int orig;
        if ((rc = cm_meta_float(g, "deepseek2", "rope.scaling.factor", 1.0, 1e-6, 1e6, &factor, err, errlen)) ||
            (rc = cm_meta_float(g, "deepseek2", "rope.scaling.yarn_log_multiplier", 0.0, 0.0, 1e3, &log_mul, err,
                                errlen)) ||
            (rc = cm_meta_float(g, "deepseek2", "rope.scaling.attn_factor", 1.0, 1e-6, 1e6, &attn, err, errlen)) ||
            (rc = cm_meta_int(g, "deepseek2", "rope.scaling.original_context_length", hp->n_ctx_train, 1, 1L << 30,
                              &orig, err, errlen)))
            return rc;
        a->beta_fast = 32.0f, a->beta_slow = 1.0f, a->n_ctx_orig = orig;
        yarn_params(hp, factor, log_mul / 0.1f, attn); /* llama.cpp cancels the converter's 0.1 */
    }
    return 0;
}

/* ---------------- the unsplit attn_kv_b ----------------
 * Older GGUFs carry, per layer, one attn_kv_b [kv_lora, H * (nope + head_v)]:
 * for head h, nope key rows then head_v value rows, each over the latent.
 * llama.cpp's converter now splits it into attn_k_b (the key rows
 * transposed: [nope, kv_lora, H]) and attn_v_b (the value rows: [kv_lora,
 * head_v, H]); so does the load here, into m->derived, dequantized to F32.
 * llama.cpp runs such a file as MHA: per position it decompresses the latent
 * (converted to attn_kv_b's vec_dot_type) into each head's key and value.
 * With F32 wk_b and wv_b and the cached latent rounded the same way
 * (cm_mla_attn, step 3), the absorbed products here are that math in another
 * order: the same numbers up to float rounding (an F16 or quantized wk_b
 * would round where llama.cpp does not).
 * NEEDSWORK: 4 H kv_lora (nope + head_v) bytes per layer (DeepSeek V3: 64 MiB),
 * and every layer is derived, also on a pipeline stage that runs a few. */

static size_t kvb_layer_bytes(const cm_hparams *hp) {
    const size_t n =
        (size_t)hp->n_head * (size_t)hp->mla.kv_lora * (size_t)(hp->mla.head_k - hp->n_rot + hp->mla.head_v);
    return (n * sizeof(float) + 63) & ~(size_t)63;
}

static int split_kv_b(cm_model *m, int il, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    const cm_mla_hparams *a = &hp->mla;
    cm_layer *L = &m->layers[il];
    const cm_tensor *kvb = &L->wkv_b;
    const int64_t H = hp->n_head, C = a->kv_lora, nope = a->head_k - hp->n_rot, per = nope + a->head_v;
    if (!m->derived && !(m->derived = cm_aligned_alloc((size_t)hp->n_layer * kvb_layer_bytes(hp))))
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory splitting attn_kv_b (%zu bytes)",
                       (size_t)hp->n_layer * kvb_layer_bytes(hp));
    float *kb = (float *)((char *)m->derived + (size_t)il * kvb_layer_bytes(hp)), *vb = kb + H * C * nope;
    float *row = cm_aligned_alloc((size_t)C * sizeof(float));
    if (!row) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    const cm_kernels *k = cm_kernels_ref();
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i = 0; i < nope; i++) { /* wk_b[h][c][i] = key row i of head h, element c */
            k->to_float[kvb->type]((const char *)kvb->data + (size_t)(h * per + i) * kvb->nb[1], row, C);
            for (int64_t c = 0; c < C; c++) kb[(h * C + c) * nope + i] = row[c];
        }
        for (int64_t i = 0; i < a->head_v; i++) /* wv_b[h][i] = value row i of head h */
            k->to_float[kvb->type]((const char *)kvb->data + (size_t)(h * per + nope + i) * kvb->nb[1],
                                   vb + (h * a->head_v + i) * C, C);
    }
    cm_aligned_free(row);
    cm_tensor_init(&L->wk_b, CM_TYPE_F32, 3, (const int64_t[]){nope, C, H}, kb, kvb->name);
    cm_tensor_init(&L->wv_b, CM_TYPE_F32, 3, (const int64_t[]){C, a->head_v, H}, vb, kvb->name);
    return 0;
}

int cm_mla_bind_layer(cm_model *m, int il, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    const cm_mla_hparams *a = &hp->mla;
    cm_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, H = hp->n_head, nope = a->head_k - hp->n_rot;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_kv_b.weight", il);
    if (!a->kv_b && cm_gguf_find_tensor(m->gguf, name))
        return cm_errf(err, errlen, CM_EFORMAT,
                       "tensor '%s' in a file with key_length_mla (the split layout: attn_k_b + attn_v_b)", name);
    int rc;
    if (a->q_lora) {
        if ((rc = cm_moe_bind_tensor(m, &L->wq_a, il, "attn_q_a.weight", 2, E, a->q_lora, 1, true, err, errlen)) ||
            (rc = cm_moe_bind_tensor(m, &L->q_a_norm, il, "attn_q_a_norm.weight", 1, a->q_lora, 1, 1, false, err,
                                     errlen)) ||
            (rc = cm_moe_bind_tensor(m, &L->wq_b, il, "attn_q_b.weight", 2, a->q_lora, H * a->head_k, 1, true, err,
                                     errlen)))
            return rc;
    } else if ((rc = cm_moe_bind_tensor(m, &L->wq, il, "attn_q.weight", 2, E, H * a->head_k, 1, true, err, errlen))) {
        return rc;
    }
    if ((rc = cm_moe_bind_tensor(m, &L->wkv_a, il, "attn_kv_a_mqa.weight", 2, E, a->kv_lora + hp->n_rot, 1, true, err,
                                 errlen)) ||
        (rc = cm_moe_bind_tensor(m, &L->kv_a_norm, il, "attn_kv_a_norm.weight", 1, a->kv_lora, 1, 1, false, err,
                                 errlen)) ||
        (rc = cm_moe_bind_tensor(m, &L->wo, il, "attn_output.weight", 2, H * a->head_v, E, 1, true, err, errlen)))
        return rc;
    if (a->kv_b) {
        if ((rc = cm_moe_bind_tensor(m, &L->wkv_b, il, "attn_kv_b.weight", 2, a->kv_lora, H * (nope + a->head_v), 1,
                                     true, err, errlen)) ||
            (rc = split_kv_b(m, il, err, errlen)))
            return rc;
    } else if ((rc = cm_moe_bind_tensor(m, &L->wk_b, il, "attn_k_b.weight", 3, nope, a->kv_lora, H, true, err,
                                        errlen)) ||
               (rc = cm_moe_bind_tensor(m, &L->wv_b, il, "attn_v_b.weight", 3, a->kv_lora, a->head_v, H, true, err,
                                        errlen))) {
        return rc;
    }
    snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", il);
    if (hp->n_expert && il >= hp->n_dense_lead && cm_gguf_find_tensor(m->gguf, name) &&
        (rc = cm_moe_bind_tensor(m, &L->ffn_exp_probs_b, il, "exp_probs_b.bias", 1, hp->n_expert, 1, 1, false, err,
                                 errlen)))
        return rc;
    return 0;
}

uint64_t cm_mla_kv_bytes(const cm_model *m, int layer_first, int layer_last, int n_ctx) {
    return (uint64_t)(layer_last - layer_first) * (uint64_t)n_ctx * (uint64_t)m->hp.head_dim * sizeof(float);
}

/* ---------------- scratch ---------------- */

struct cm_mla {
    int max_batch, max_ctx, n_threads;
    float *qa;     /* [B][q_lora] */
    uint8_t *qaq;  /* [B] qa converted for wq_b */
    uint8_t *xkv;  /* [B] xn converted for wkv_a (when its type differs) */
    float *kvpe;   /* [B][kv_lora + rope] */
    float *q;      /* [B][H * head_k] */
    float *rope;   /* [B][n_rot] cos/sin pairs */
    float *att;    /* [B][H * head_v] */
    uint8_t *attq; /* [B] att converted for wo */
    float *tsc;    /* [threads][max_ctx + Q row + kv_lora] scores, absorbed query, latent output */
    uint8_t *tq;   /* [threads] q_nope / o converted (and F16 halves) */
    size_t rs_qa, rs_e, rs_att, tsc_stride, tq_stride;
};

static void *zalloc(size_t n) {
    void *p = cm_aligned_alloc(n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}

static size_t row_bound(int64_t n) { return ((size_t)n * 4 + 63) & ~(size_t)63; }

void cm_mla_free(cm_mla *s) {
    if (!s) return;
    void *ps[] = {s->qa, s->qaq, s->xkv, s->kvpe, s->q, s->rope, s->att, s->attq, s->tsc, s->tq};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++) cm_aligned_free(ps[i]);
    cm_free(s);
}

cm_mla *cm_mla_new(const cm_model *m, int max_batch, int max_ctx, int n_threads) {
    const cm_hparams *hp = &m->hp;
    const cm_mla_hparams *a = &hp->mla;
    cm_mla *s = cm_calloc(1, sizeof *s);
    if (!s) return NULL;
    const size_t B = (size_t)max_batch, H = (size_t)hp->n_head, R = (size_t)hp->head_dim;
    s->max_batch = max_batch;
    s->max_ctx = max_ctx;
    s->n_threads = n_threads < 1 ? 1 : n_threads;
    s->rs_qa = row_bound(a->q_lora);
    s->rs_e = row_bound(hp->n_embd);
    s->rs_att = row_bound((int64_t)H * a->head_v);
    s->tsc_stride = (size_t)max_ctx + R + 2 * (size_t)a->kv_lora + 16; /* scores, Q, o, an F16 row as floats */
    s->tq_stride = row_bound(CM_MAX(CM_MAX(a->head_k, a->kv_lora), (int)R)) + row_bound((max_ctx + 1) / 2 + 1);
    s->qa = zalloc(B * (size_t)a->q_lora * 4);
    s->qaq = zalloc(B * s->rs_qa);
    s->xkv = zalloc(B * s->rs_e);
    s->kvpe = zalloc(B * R * 4);
    s->q = zalloc(B * H * (size_t)a->head_k * 4);
    s->rope = zalloc(B * (size_t)hp->n_rot * 4);
    s->att = zalloc(B * H * (size_t)a->head_v * 4);
    s->attq = zalloc(B * s->rs_att);
    s->tsc = zalloc((size_t)s->n_threads * s->tsc_stride * 4);
    s->tq = zalloc((size_t)s->n_threads * s->tq_stride);
    void *ps[] = {s->qa, s->qaq, s->xkv, s->kvpe, s->q, s->rope, s->att, s->attq, s->tsc, s->tq};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++)
        if (!ps[i]) {
            cm_mla_free(s);
            return NULL;
        }
    return s;
}

/* ---------------- compute ---------------- */

static enum cm_type vdt_of(const cm_tensor *w) { return cm_type_traits_of(w->type)->vec_dot_type; }
static size_t act_rs(enum cm_type vdt, int64_t n) {
    return vdt == CM_TYPE_F32 ? (size_t)n * sizeof(float) : cm_row_size(vdt, n);
}

/* Convert x to vdt into dst (F32: a copy), shown to the test hook. */
static void convert(const cm_mla_run *r, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt, const float *x,
                    void *dst, int64_t n) {
    if (vdt == CM_TYPE_F32) {
        memcpy(dst, x, (size_t)n * sizeof(float));
        return;
    }
    r->k->from_float[vdt](x, dst, n);
    if (r->hook) r->hook(r->hook_user, r->il, site, row, col0, vdt, x, dst, n);
}

static void matmul(const cm_mla_run *r, const cm_tensor *w, const void *x, size_t xs, int n, float *y, int64_t ldy,
                   int ith, int nth) {
    int64_t r0, r1;
    cm_split_range(w->ne[1], ith, nth, &r0, &r1);
    if (r1 > r0) cm_matmul_rows(r->k, w, x, xs, n, y, ldy, r0, r1);
}

/* Head h of a stacked [ne0, ne1, H] tensor as a 2-D view. */
static cm_tensor head_view(const cm_tensor *w, int h) {
    cm_tensor t = *w;
    t.data = (char *)w->data + (size_t)h * w->nb[2];
    t.ne[2] = 1;
    t.n_dims = 2;
    return t;
}

/* ggml_rms_norm then ggml_mul (double sum of float squares). */
static void rms_norm(const float *x, const float *w, float *y, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* ggml_rope_cache_init for the NORM type with YaRN (ext_factor 0: plain). */
void cm_mla_rope_cache(const cm_hparams *hp, float p, float *cache) {
    const cm_mla_hparams *a = &hp->mla;
    const int n = hp->n_rot;
    const float theta_scale = powf(hp->rope_base, -2.0f / (float)n);
    float corr[2] = {0, 0};
    if (a->ext_factor != 0.0f) { /* ggml_rope_yarn_corr_dims */
        const float lb = 2 * logf(hp->rope_base);
        const float start = floorf((float)n * logf((float)a->n_ctx_orig / (a->beta_fast * 2 * (float)M_PI)) / lb);
        const float end = ceilf((float)n * logf((float)a->n_ctx_orig / (a->beta_slow * 2 * (float)M_PI)) / lb);
        corr[0] = start > 0 ? start : 0;
        corr[1] = end < (float)(n - 1) ? end : (float)(n - 1);
    }
    float theta = p;
    for (int i0 = 0; i0 < n; i0 += 2) {
        const float interp = hp->rope_freq_scale * theta;
        float th = interp, ms = a->attn_factor;
        if (a->ext_factor != 0.0f) {
            const float y = ((float)(i0 / 2) - corr[0]) / CM_MAX(0.001f, corr[1] - corr[0]);
            const float ramp = (1 - CM_MIN(1.0f, CM_MAX(0.0f, y))) * a->ext_factor;
            th = interp * (1 - ramp) + theta * ramp;
            ms *= 1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale);
        }
        cache[i0] = cosf(th) * ms;
        cache[i0 + 1] = sinf(th) * ms;
        theta *= theta_scale;
    }
}

static void rope_norm(const float *cache, float *v, int n) {
    for (int i0 = 0; i0 < n; i0 += 2) {
        const float c = cache[i0], s = cache[i0 + 1], x0 = v[i0], x1 = v[i0 + 1];
        v[i0] = x0 * c - x1 * s;
        v[i0 + 1] = x0 * s + x1 * c;
    }
}

static size_t cache_off(const cm_kv *kv, int il, int p) {
    return ((size_t)(il - kv->layer_first) * (size_t)kv->n_ctx + (size_t)p) * (size_t)kv->head_dim;
}

/* Attention of head h (the slice's hl-th) of token j over its sequence's
 * latent cache, then wv_b[h] into att. */
static void attend(cm_mla *s, const cm_mla_run *r, int j, int h, int hl, int ith) {
    const cm_hparams *hp = &r->m->hp;
    const cm_mla_hparams *a = &hp->mla;
    const cm_layer *L = &r->m->layers[r->il];
    const int R = hp->head_dim, C = a->kv_lora, nope = a->head_k - hp->n_rot, H = r->h1 - r->h0;
    float *sc = s->tsc + (size_t)ith * s->tsc_stride, *Q = sc + s->max_ctx, *o = Q + R; /* then a row */
    uint8_t *tq = s->tq + (size_t)ith * s->tq_stride;
    const float *qh = s->q + ((size_t)j * H + (size_t)hl) * (size_t)a->head_k;
    /* Q = [wk_b[h] · q_nope | roped q_pe] */
    memcpy(Q + C, qh + nope, (size_t)hp->n_rot * sizeof(float));
    rope_norm(s->rope + (size_t)j * hp->n_rot, Q + C, hp->n_rot);
    const cm_tensor kb = head_view(&L->wk_b, h);
    const enum cm_type vk = vdt_of(&kb);
    convert(r, CM_ACT_K_IN, j, (int64_t)h * nope, vk, qh, tq, nope); /* columns: head h's */
    cm_matmul_rows(r->k, &kb, tq, act_rs(vk, nope), 1, Q, C, 0, C);
    /* scores, softmax (ggml_soft_max_ext: scale, max, expf, double sum) */
    const cm_kv *kv = r->kvs[r->b->seq[j]];
    const int np = r->b->pos[j] + 1;
    const bool f16 = kv->type == CM_TYPE_F16;
    float mx = -INFINITY;
    if (f16) {
        cm_f16 *qf = (cm_f16 *)tq;
        r->k->from_float[CM_TYPE_F16](Q, qf, R);
        const cm_f16 *kk = (const cm_f16 *)kv->k + cache_off(kv, r->il, 0);
        for (int p = 0; p < np; p++) {
            float d;
            r->k->vec_dot[CM_TYPE_F16](R, &d, kk + (size_t)p * R, qf);
            sc[p] = d * a->kq_scale;
            mx = sc[p] > mx ? sc[p] : mx;
        }
    } else {
        const float *kk = (const float *)kv->k + cache_off(kv, r->il, 0);
        for (int p = 0; p < np; p++) {
            float d;
            r->k->vec_dot[CM_TYPE_F32](R, &d, kk + (size_t)p * R, Q);
            sc[p] = d * a->kq_scale;
            mx = sc[p] > mx ? sc[p] : mx;
        }
    }
    double sum = 0.0;
    for (int p = 0; p < np; p++) {
        const float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += (double)e;
    }
    const float inv = (float)(1.0 / sum);
    for (int p = 0; p < np; p++) sc[p] *= inv;
    /* o = sum_p w_p kv_cmpr[p], accumulated row by row (contiguous, so it
     * vectorises; ggml sums each latent dim over positions in its own SIMD
     * order: the same sums up to float rounding, measured: the golden
     * tests' numbers did not change from the per-dim dot form) */
    memset(o, 0, (size_t)C * sizeof(float));
    if (f16) {
        const cm_f16 *kk = (const cm_f16 *)kv->k + cache_off(kv, r->il, 0);
        float *row = o + C;
        for (int p = 0; p < np; p++) {
            const float w = cm_f16_to_f32(cm_f32_to_f16(sc[p])); /* ggml rounds the weights to F16 */
            r->k->to_float[CM_TYPE_F16](kk + (size_t)p * R, row, C);
            for (int i = 0; i < C; i++) o[i] += w * row[i];
        }
    } else {
        const float *kk = (const float *)kv->k + cache_off(kv, r->il, 0);
        for (int p = 0; p < np; p++) {
            const float w = sc[p], *row = kk + (size_t)p * R;
            for (int i = 0; i < C; i++) o[i] += w * row[i];
        }
    }
    /* att[h] = wv_b[h] · o */
    const cm_tensor vb = head_view(&L->wv_b, h);
    const enum cm_type vv = vdt_of(&vb);
    convert(r, CM_ACT_V_IN, j, (int64_t)h * C, vv, o, tq, C);
    cm_matmul_rows(r->k, &vb, tq, act_rs(vv, C), 1, s->att + ((size_t)j * H + (size_t)hl) * (size_t)a->head_v,
                   a->head_v, 0, a->head_v);
}

void cm_mla_attn(cm_mla *s, const cm_mla_run *r, int ith, int nth) {
    const cm_model *m = r->m;
    const cm_hparams *hp = &m->hp;
    const cm_mla_hparams *a = &hp->mla;
    const cm_layer *L = &m->layers[r->il];
    const int n = r->b->n, E = hp->n_embd, H = r->h1 - r->h0, R = hp->head_dim, C = a->kv_lora;
    /* the slice's query heads [h0, h1): their rows of wq_b (or wq), columns of wo */
    const cm_tensor wq = cm_tensor_rows(&L->wq, (int64_t)r->h0 * a->head_k, (int64_t)r->h1 * a->head_k);
    const cm_tensor wq_b = cm_tensor_rows(&L->wq_b, (int64_t)r->h0 * a->head_k, (int64_t)r->h1 * a->head_k);
    const cm_tensor wo = cm_tensor_cols(&L->wo, (int64_t)r->h0 * a->head_v, (int64_t)r->h1 * a->head_v);
    const cm_tensor *w0 = a->q_lora ? &L->wq_a : &wq;
    int64_t t0, t1;

    /* 1. xn for wkv_a when its vec_dot_type differs from w0's */
    const void *xkv = r->xq;
    size_t rs_kv = r->xq_stride;
    const enum cm_type vkv = vdt_of(&L->wkv_a);
    if (vkv != vdt_of(w0)) {
        rs_kv = act_rs(vkv, E);
        xkv = s->xkv;
        cm_split_range(n, ith, nth, &t0, &t1);
        for (int64_t j = t0; j < t1; j++)
            convert(r, CM_ACT_KV_A_IN, (int)j, 0, vkv, r->xn + j * E, s->xkv + j * rs_kv, E);
        cm_pool_barrier(r->pool);
    }

    /* 2. q_a (or q) and kv_a, as one row range */
    {
        const int64_t n0 = w0->ne[1], nr = n0 + R;
        cm_split_range(nr, ith, nth, &t0, &t1);
        if (t0 < n0)
            cm_matmul_rows(r->k, w0, r->xq, r->xq_stride, n, a->q_lora ? s->qa : s->q,
                           a->q_lora ? a->q_lora : (int64_t)H * a->head_k, t0, CM_MIN(t1, n0));
        if (t1 > n0) cm_matmul_rows(r->k, &L->wkv_a, xkv, rs_kv, n, s->kvpe, R, CM_MAX(t0, n0) - n0, t1 - n0);
    }
    cm_pool_barrier(r->pool);

    /* 3. per token: q_a's norm and conversion; the cache row [norm(kv_cmpr) | rope(k_pe)] */
    const enum cm_type vqb = a->q_lora ? vdt_of(&L->wq_b) : CM_TYPE_F32;
    const size_t rs_qb = act_rs(vqb, a->q_lora);
    cm_split_range(n, ith, nth, &t0, &t1);
    for (int64_t j = t0; j < t1; j++) {
        if (a->q_lora) {
            float *qa = s->qa + j * a->q_lora;
            rms_norm(qa, L->q_a_norm.data, qa, a->q_lora, hp->rms_eps);
            convert(r, CM_ACT_Q_B_IN, (int)j, 0, vqb, qa, s->qaq + j * rs_qb, a->q_lora);
        }
        float *kr = s->kvpe + j * R, *rc = s->rope + j * hp->n_rot;
        rms_norm(kr, L->kv_a_norm.data, kr, C, hp->rms_eps);
        const enum cm_type vkb = L->wkv_b.data ? vdt_of(&L->wkv_b) : CM_TYPE_F32;
        if (vkb != CM_TYPE_F32) { /* llama.cpp's MHA view decompresses the latent so rounded */
            uint8_t *tq = s->tq + (size_t)ith * s->tq_stride;
            convert(r, CM_ACT_KV_B_IN, (int)j, 0, vkb, kr, tq, C);
            cm_kernels_ref()->to_float[vkb](tq, kr, C);
        }
        cm_mla_rope_cache(hp, (float)r->b->pos[j], rc);
        rope_norm(rc, kr + C, hp->n_rot);
        cm_kv *kv = r->kvs[r->b->seq[j]];
        const size_t off = cache_off(kv, r->il, r->b->pos[j]);
        if (kv->type == CM_TYPE_F16) r->k->from_float[CM_TYPE_F16](kr, (cm_f16 *)kv->k + off, R);
        else memcpy((float *)kv->k + off, kr, (size_t)R * sizeof(float));
    }
    cm_pool_barrier(r->pool);

    /* 4. q = wq_b · q_a */
    if (a->q_lora) {
        matmul(r, &wq_b, s->qaq, rs_qb, n, s->q, (int64_t)H * a->head_k, ith, nth);
        cm_pool_barrier(r->pool);
    }

    /* 5. per (token, head): absorbed query, attention, wv_b */
    cm_split_range((int64_t)n * H, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) attend(s, r, (int)(t / H), r->h0 + (int)(t % H), (int)(t % H), ith);
    cm_pool_barrier(r->pool);

    /* 6. wo (over the slice's columns: a partial sum for the group's all-reduce) */
    if (H == 0) { /* a member without heads: nothing to add (it still cached the latent) */
        cm_split_range(n, ith, nth, &t0, &t1);
        if (t1 > t0) memset(r->out + t0 * E, 0, (size_t)(t1 - t0) * (size_t)E * sizeof(float));
        return;
    }
    const enum cm_type vo = vdt_of(&L->wo);
    const int64_t HV = (int64_t)H * a->head_v;
    const void *xo = s->att;
    size_t rs_o = (size_t)HV * sizeof(float);
    if (vo != CM_TYPE_F32) {
        rs_o = act_rs(vo, HV);
        cm_split_range(n, ith, nth, &t0, &t1);
        for (int64_t j = t0; j < t1; j++)
            convert(r, CM_ACT_ATTN_OUT, (int)j, (int64_t)r->h0 * a->head_v, vo, s->att + j * HV, s->attq + j * rs_o,
                    HV);
        cm_pool_barrier(r->pool);
        xo = s->attq;
    }
    matmul(r, &wo, xo, rs_o, n, r->out, E, ith, nth);
}
