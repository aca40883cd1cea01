/*
 * rope.c: rotary position embeddings, the one place that computes a
 * rotation: the scalings a GGUF asks for (none, linear, YaRN; Llama 3's
 * rope_freqs.weight frequency factors on top of any of them) read from its
 * "<arch>.rope.*" keys, the per-position cos/sin table, and its application
 * to one head (adjacent pairs or the two halves).
 *
 * Numerics follow ggml's CPU rope so that results match llama.cpp: angles by
 * iterated multiplication theta_i = p * base^(-2i/n_rot) (in float), divided
 * by the frequency factor, then YaRN's blend of the interpolated angle
 * (theta * freq_scale) and the extrapolated one with a linear ramp over the
 * correction dimensions, and cos/sin multiplied by the magnitude scale.
 * Which keys are read mirrors llama.cpp's loader: type, factor (or the old
 * "rope.scale_linear"), attn_factor and original_context_length for every
 * architecture; the YaRN extrapolation mix, magnitude and betas, and the log
 * multiplier only where the caller says its architecture reads them
 * (llama.cpp: grok / mistral3 / deepseek2), so that a file with stray keys
 * runs as llama.cpp runs it.
 *
 * This file never allocates and never touches the KV cache or a thread.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const k_scaling_names[CM_ROPE_SCALING_COUNT] = {"none", "linear", "yarn"};

const char *cm_rope_scaling_name(enum cm_rope_scaling_type t) {
    return (unsigned)t < CM_ROPE_SCALING_COUNT ? k_scaling_names[t] : "unknown";
}

/* "<arch>.<suffix>" as a float if present; returns 1 when found, 0 when
 * absent, a negative code when present but not a number. */
static int opt_float(const cm_gguf *g, const char *arch, const char *suffix, float *out, char *err, size_t errlen) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    if (!cm_gguf_get_f64(g, key, &v)) {
        if (cm_gguf_find_kv(g, key)) return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' is not a number", key);
        return 0;
    }
    if (!isfinite(v) || fabs(v) > 1e9)
        return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' = %g is out of range", key, v);
    *out = (float)v;
    return 1;
}

/* ggml's correction dimension: the rotary pair index whose wavelength turns
 * n_rot_turns times over n_ctx_orig positions. */
static float corr_dim(int n_dims, int n_ctx_orig, float turns, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (turns * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

static float yarn_mscale(float factor, float mscale) {
    return factor <= 1.0f ? 1.0f : 0.1f * mscale * logf(factor) + 1.0f;
}

void cm_rope_scaling_finish(cm_rope_scaling *rs, int n_rot, float base) {
    rs->corr_dims[0] = rs->corr_dims[1] = 0;
    rs->mscale = rs->yarn_attn_factor * rs->attn_factor;
    if (rs->ext_factor == 0.0f) return;
    const float lo = floorf(corr_dim(n_rot, rs->n_ctx_orig, rs->beta_fast, base));
    const float hi = ceilf(corr_dim(n_rot, rs->n_ctx_orig, rs->beta_slow, base));
    rs->corr_dims[0] = lo > 0 ? lo : 0;
    rs->corr_dims[1] = hi < (float)(n_rot - 1) ? hi : (float)(n_rot - 1);
    /* llama.cpp's context: with YaRN on, the magnitude is the HF YaRN's
     * (with the log multiplier when the architecture reads one) divided by
     * the 1 + 0.1 ln(factor) that the rope op multiplies back in; llama.cpp
     * before its PR 17945 gives the same product for a zero multiplier. */
    const float factor = 1.0f / rs->freq_scale;
    float m = yarn_mscale(factor, 1.0f);
    if (rs->log_mul != 0.0f)
        m = yarn_mscale(factor, rs->log_mul_is_mscale ? rs->log_mul : 1.0f) / yarn_mscale(factor, rs->log_mul);
    rs->mscale = m / (1.0f + 0.1f * logf(factor)) * rs->attn_factor;
}

int cm_rope_scaling_read(const cm_gguf *g, const char *arch, int n_ctx_train, int n_rot, float base, unsigned flags,
                         cm_rope_scaling *rs, char *err, size_t errlen) {
    memset(rs, 0, sizeof *rs);
    rs->type = CM_ROPE_SCALING_LINEAR; /* llama.cpp's default when the type key is missing */
    rs->freq_scale = 1.0f;
    rs->attn_factor = 1.0f;
    rs->yarn_attn_factor = 1.0f;
    rs->beta_fast = 32.0f;
    rs->beta_slow = 1.0f;
    rs->ext_factor = -1.0f; /* not set */
    rs->n_ctx_orig = n_ctx_train;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (cm_gguf_find_kv(g, key)) {
        char *st = cm_gguf_get_str(g, key);
        if (!st) return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' is not a string", key);
        int t = -1;
        for (int i = 0; i < CM_ROPE_SCALING_COUNT; i++)
            if (!strcmp(st, k_scaling_names[i])) t = i;
        if (t < 0) {
            int rc = cm_errf(err, errlen, CM_EUNSUPPORTED,
                             "rope scaling type '%.32s' is not supported (supported: none, linear, yarn)", st);
            cm_free(st);
            return rc;
        }
        cm_free(st);
        rs->type = (enum cm_rope_scaling_type)t;
    }
    int rc;
    float factor = 0.0f;
    if ((rc = opt_float(g, arch, "rope.scaling.factor", &factor, err, errlen)) < 0) return rc;
    if (rc == 0 && (rc = opt_float(g, arch, "rope.scale_linear", &factor, err, errlen)) < 0) return rc;
    if (factor < 0.0f) return cm_errf(err, errlen, CM_EFORMAT, "rope scaling factor %g is negative", factor);
    rs->factor = factor;
    if (rs->type != CM_ROPE_SCALING_NONE && factor != 0.0f) rs->freq_scale = 1.0f / factor;
    if ((rc = opt_float(g, arch, "rope.scaling.attn_factor", &rs->attn_factor, err, errlen)) < 0) return rc;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
    uint64_t oc;
    if (!cm_gguf_get_u64(g, key, &oc)) {
        if (cm_gguf_find_kv(g, key))
            return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' is not a non-negative integer", key);
    } else if (oc > 0) {
        if (oc > (1u << 30))
            return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' = %llu is out of range", key,
                           (unsigned long long)oc);
        rs->n_ctx_orig = (int)oc;
    }
    if (flags & CM_ROPE_READ_YARN_PARAMS) {
        if ((rc = opt_float(g, arch, "rope.scaling.yarn_ext_factor", &rs->ext_factor, err, errlen)) < 0 ||
            (rc = opt_float(g, arch, "rope.scaling.yarn_attn_factor", &rs->yarn_attn_factor, err, errlen)) < 0 ||
            (rc = opt_float(g, arch, "rope.scaling.yarn_beta_fast", &rs->beta_fast, err, errlen)) < 0 ||
            (rc = opt_float(g, arch, "rope.scaling.yarn_beta_slow", &rs->beta_slow, err, errlen)) < 0)
            return rc;
    }
    if (flags & CM_ROPE_READ_YARN_LOG_MUL) {
        if ((rc = opt_float(g, arch, "rope.scaling.yarn_log_multiplier", &rs->log_mul, err, errlen)) < 0) return rc;
    }
    if (rs->ext_factor < 0.0f) rs->ext_factor = rs->type == CM_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    cm_rope_scaling_finish(rs, n_rot, base);
    return 0;
}

void cm_rope_cache(const cm_rope_scaling *rs, int n_rot, float base, const float *freq_factors, float pos,
                   float *cache) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const float fs = rs ? rs->freq_scale : 1.0f;
    const float ext = rs ? rs->ext_factor : 0.0f;
    float mscale = rs ? rs->mscale : 1.0f;
    if (ext != 0.0f) mscale *= 1.0f + 0.1f * logf(1.0f / fs);
    const float lo = rs ? rs->corr_dims[0] : 0.0f,
                span = rs ? fmaxf(0.001f, rs->corr_dims[1] - rs->corr_dims[0]) : 1.0f;
    float theta = pos;
    for (int i0 = 0; i0 < n_rot; i0 += 2) {
        const float extrap = freq_factors ? theta / freq_factors[i0 / 2] : theta;
        const float interp = fs * extrap;
        float th = interp;
        if (ext != 0.0f) {
            const float y = ((float)(i0 / 2) - lo) / span;
            const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext;
            th = interp * (1.0f - mix) + extrap * mix;
        }
        cache[i0] = cosf(th) * mscale;
        cache[i0 + 1] = sinf(th) * mscale;
        theta *= theta_scale;
    }
}

void cm_rope_apply(enum cm_rope_type type, int n_rot, const float *cache, float *v) {
    if (type == CM_ROPE_NORM) {
        for (int i0 = 0; i0 < n_rot; i0 += 2) {
            const float c = cache[i0], s = cache[i0 + 1];
            const float x0 = v[i0], x1 = v[i0 + 1];
            v[i0] = x0 * c - x1 * s;
            v[i0 + 1] = x0 * s + x1 * c;
        }
    } else {
        const int h = n_rot / 2;
        for (int i0 = 0; i0 < n_rot; i0 += 2) {
            const float c = cache[i0], s = cache[i0 + 1];
            const int ic = i0 / 2;
            const float x0 = v[ic], x1 = v[ic + h];
            v[ic] = x0 * c - x1 * s;
            v[ic + h] = x0 * s + x1 * c;
        }
    }
}
