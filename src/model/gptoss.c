/*
 * gptoss.c: the gpt-oss architecture's hyperparameters, extra tensors and
 * YaRN rotation cache (see gptoss.h for the arithmetic; the forward pass
 * itself stays in forward.c and moe.c, which call in here).
 * Like load.c it never copies weight data and rejects what it cannot run
 * with a message naming the key or tensor.
 */
#include "gptoss.h"
#include "meta.h"

#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ARCH "gpt-oss"

/* "gpt-oss.<suffix>" as an integer in [lo, hi] (missing: def; def < 0:
 * required); a per-layer array is not supported. */
static int key_i(const cm_gguf *g, const char *suffix, long def, long lo, long hi, int *out, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, ARCH ".%s", suffix);
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    if (kv && kv->type == CM_GGUF_ARRAY)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "metadata '%s' as a per-layer array is not supported", key);
    return cm_meta_int(g, ARCH, suffix, def, lo, hi, out, err, errlen);
}

int cm_gptoss_load_hparams(cm_model *m, char *err, size_t errlen) {
    cm_hparams *hp = &m->hp;
    const cm_gguf *g = m->gguf;
    int rc;
    /* llama.cpp: n_swa required, pattern 2 (layers il % 2 == 0 slide), the
     * SWA layers' base and scale those of the full layers unless given */
    if ((rc = key_i(g, "attention.sliding_window", -1, 1, 1L << 30, &hp->n_swa, err, errlen)) ||
        (rc = key_i(g, "attention.sliding_window_pattern", 2, 1, 4096, &hp->swa_pattern, err, errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.freq_base_swa", hp->rope_base, 1e-3, 1e12, &hp->rope_base_swa, err, errlen)))
        return rc;
    if (hp->n_rot != hp->head_dim)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "gpt-oss with rope dimension count %d != head size %d is not supported", hp->n_rot,
                       hp->head_dim);
    char *st = cm_gguf_get_str(g, ARCH ".rope.scaling.type");
    const bool yarn = st && !strcmp(st, "yarn");
    if (st && !yarn && strcmp(st, "none") && strcmp(st, "linear")) {
        rc = cm_errf(err, errlen, CM_EUNSUPPORTED,
                     "rope scaling type '%.32s' is not supported (gpt-oss: none, linear, yarn)", st);
        cm_free(st);
        return rc;
    }
    const bool none = st && !strcmp(st, "none");
    cm_free(st);
    float factor = 0, ext = -1, attn = 1, bf = 32, bsl = 1, rattn = 1, logmul = 0;
    if ((rc = cm_meta_float(g, ARCH, "rope.scaling.factor", 0.0, 0.0, 1e6, &factor, err, errlen)) ||
        (rc = key_i(g, "rope.scaling.original_context_length", hp->n_ctx_train, 1, 1L << 30, &hp->n_ctx_orig, err,
                    errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.scaling.yarn_ext_factor", -1.0, -1.0, 1e3, &ext, err, errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.scaling.yarn_attn_factor", 1.0, 0.0, 1e3, &attn, err, errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.scaling.yarn_beta_fast", 32.0, 0.0, 1e6, &bf, err, errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.scaling.yarn_beta_slow", 1.0, 0.0, 1e6, &bsl, err, errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.scaling.attn_factor", 1.0, 0.0, 1e3, &rattn, err, errlen)) ||
        (rc = cm_meta_float(g, ARCH, "rope.scaling.yarn_log_multiplier", 0.0, 0.0, 1e3, &logmul, err, errlen)))
        return rc;
    if (logmul != 0.0f)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "gpt-oss with a YaRN log multiplier (rope.scaling.yarn_log_multiplier) is not supported");
    /* llama_context's rules: no scaling for type "none", ext_factor 1 for
     * YaRN unless given, then the attention factor get_mscale(factor) times
     * the cancellation of rope_yarn's own magnitude factor, times the file's
     * rope.scaling.attn_factor */
    hp->rope_freq_scale = none || factor == 0.0f ? 1.0f : 1.0f / factor;
    hp->yarn_ext_factor = ext >= 0.0f ? ext : yarn ? 1.0f : 0.0f;
    hp->yarn_beta_fast = bf;
    hp->yarn_beta_slow = bsl;
    if (hp->yarn_ext_factor != 0.0f) {
        const float f = 1.0f / hp->rope_freq_scale;
        attn = f <= 1.0f ? 1.0f : 0.1f * logf(f) + 1.0f;
        attn *= 1.0f / (1.0f + 0.1f * logf(f));
    }
    hp->yarn_attn_factor = attn * rattn;
    return 0;
}

/* Bind an F32 tensor blk.<il>.<suffix> of shape [ne0] or [ne0, ne1]. */
static int bind_f32(cm_model *m, cm_tensor *t, int il, const char *suffix, int64_t ne0, int64_t ne1, char *err,
                    size_t errlen) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    memset(t, 0, sizeof *t);
    const cm_gguf_tensor_info *ti = cm_gguf_find_tensor(m->gguf, name);
    if (!ti) return cm_errf(err, errlen, CM_EFORMAT, "missing tensor '%s'", name);
    if (ti->type != CM_TYPE_F32)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' has unsupported type %s (gpt-oss: f32)", name,
                       cm_type_name(ti->type));
    const int nd = ne1 ? 2 : 1;
    const int64_t want[2] = {ne0, ne1 ? ne1 : 1};
    bool ok = true;
    for (int i = 0; i < CM_MAX_DIMS; i++)
        if ((i < ti->n_dims ? ti->ne[i] : 1) != (i < 2 ? want[i] : 1)) ok = false;
    if (!ok)
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' has the wrong shape, expected [%lld%s%lld]", name,
                       (long long)ne0, ne1 ? ", " : "", ne1 ? (long long)ne1 : 0LL);
    cm_tensor_init(t, CM_TYPE_F32, nd, want, (void *)ti->data, ti->name);
    if (cm_tensor_nbytes(t) > ti->nbytes)
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' is shorter than its shape", name);
    m->n_params += (uint64_t)cm_tensor_nelements(t);
    m->weight_bytes += cm_tensor_nbytes(t);
    return 0;
}

int cm_gptoss_bind_layer(cm_model *m, int il, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    cm_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, X
    = hp->n_expert;
    int rc;
    if ((rc = bind_f32(m, &L->bo, il, "attn_output.bias", E, 0, err, errlen)) ||
        (rc = bind_f32(m, &L->attn_sinks, il, "attn_sinks.weight", hp->n_head, 0, err, errlen)) ||
        (rc = bind_f32(m, &L->ffn_gate_inp_b, il, "ffn_gate_inp.bias", X, 0, err, errlen)) ||
        (rc = bind_f32(m, &L->ffn_gate_exps_b, il, "ffn_gate_exps.bias", F, X, err, errlen)) ||
        (rc = bind_f32(m, &L->ffn_up_exps_b, il, "ffn_up_exps.bias", F, X, err, errlen)) ||
        (rc = bind_f32(m, &L->ffn_down_exps_b, il, "ffn_down_exps.bias", E, X, err, errlen)))
        return rc;
    return 0;
}

/* ggml_rope_yarn_corr_dim */
static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * 3.14159265358979323846f)) / (2 * logf(base));
}

void cm_yarn_rope_cache(const cm_hparams *hp, float p, float base, float freq_scale, const float *ff, float *cache) {
    const int n = hp->n_rot;
    const float ext = hp->yarn_ext_factor;
    float lo = floorf(corr_dim(n, hp->n_ctx_orig, hp->yarn_beta_fast, base));
    float hi = ceilf(corr_dim(n, hp->n_ctx_orig, hp->yarn_beta_slow, base));
    lo = lo > 0 ? lo : 0;
    hi = hi < (float)(n - 1) ? hi : (float)(n - 1);
    const float theta_scale = powf(base, -2.0f / (float)n);
    float theta = p;
    for (int i0 = 0; i0 < n; i0 += 2) {
        const float th_extrap = ff ? theta / ff[i0 / 2] : theta;
        const float th_interp = freq_scale * th_extrap;
        float th = th_interp, mscale = hp->yarn_attn_factor;
        if (ext != 0.0f) {
            const float hl = hi - lo;
            const float y = (float)(i0 / 2 - lo) / (0.001f > hl ? 0.001f : hl);
            const float ramp = 1 - (1 < (y > 0 ? y : 0) ? 1 : (y > 0 ? y : 0));
            const float mix = ramp * ext;
            th = th_interp * (1 - mix) + th_extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
        }
        cache[i0] = cosf(th) * mscale;
        cache[i0 + 1] = sinf(th) * mscale;
        theta *= theta_scale;
    }
}
