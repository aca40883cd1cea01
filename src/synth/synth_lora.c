/*
 * synth_lora.c: random LoRA adapters (llama.cpp's adapter GGUF) for a given
 * base model, so that tests can check adapter loading and application
 * against llama.cpp without a training run.
 *
 * For every weight of the model that LoRA may target (blk.N.attn_q/k/v/
 * output, ffn_gate/up/down, output) the file gets lora_a [n_in, rank] and
 * lora_b [rank, n_out] in F32. A is near-normal with std 1/sqrt(n_in); B is
 * scaled so that the correction (alpha/rank) B A has an RMS of `strength`
 * times W's own RMS: visible in the output, not noise that drowns the model.
 * Values come from (seed, tensor name, row) with integer arithmetic and one
 * float multiply each, like synth.c, so the file is the same on every
 * machine. Reads only the model GGUF it is given; does no inference.
 */
#include "synth.h"

#include "../kernels/kernels.h"
#include "../tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t lora_hash(const char *s, uint64_t seed) {
    uint64_t h = 0xcbf29ce484222325ull ^ seed; /* FNV-1a over the name, seeded */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    h ^= h >> 31;
    h *= 0x7fb5d329728ea185ull;
    h ^= h >> 27;
    return h;
}

/* std * (sum of four 16-bit uniforms, centred) / its std: exact in integers. */
static void lora_normal(cm_rng *r, float *x, int64_t n, float std) {
    const float k = std * (float)(1.0 / sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0));
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = cm_rng_next(r);
        int32_t s = (int32_t)(u & 0xffff) + (int32_t)((u >> 16) & 0xffff) + (int32_t)((u >> 32) & 0xffff) +
                    (int32_t)(u >> 48) - 131070;
        x[i] = (float)s * k;
    }
}

/* RMS of a 2-D weight, dequantized row by row (double sum). */
static int weight_rms(const cm_gguf_tensor_info *w, double *rms, char *err, size_t errlen) {
    const cm_kernels *k = cm_kernels_get();
    if (!cm_type_traits_of(w->type) || !k->to_float[w->type])
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' has unsupported type %s", w->name,
                       cm_type_name(w->type));
    float *row = cm_malloc((size_t)w->ne[0] * sizeof(float));
    if (!row) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    size_t rs = cm_row_size(w->type, w->ne[0]);
    double ss = 0;
    for (int64_t r = 0; r < w->ne[1]; r++) {
        k->to_float[w->type]((const char *)w->data + (size_t)r * rs, row, w->ne[0]);
        for (int64_t i = 0; i < w->ne[0]; i++) ss += (double)row[i] * row[i];
    }
    cm_free(row);
    *rms = sqrt(ss / ((double)w->ne[0] * (double)w->ne[1]));
    return 0;
}

int cm_synth_lora_write(const cm_synth_lora_params *p, const cm_gguf *model, const char *path, cm_buf *out, char *err,
                        size_t errlen) {
    static const char *const targets[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                          "ffn_gate", "ffn_up", "ffn_down"};
    if (p->rank < 1 || p->rank > 1024) return cm_errf(err, errlen, CM_EINVAL, "rank %d is out of [1, 1024]", p->rank);
    if (!(p->alpha >= 0 && p->alpha < 1e6))
        return cm_errf(err, errlen, CM_EINVAL, "alpha %g is out of range", p->alpha);
    char *arch = cm_gguf_get_str(model, "general.architecture");
    if (!arch) return cm_errf(err, errlen, CM_EFORMAT, "the model has no general.architecture");
    char key[128];
    snprintf(key, sizeof key, "%s.block_count", arch);
    uint64_t n_layer = 0;
    if (!cm_gguf_get_u64(model, key, &n_layer) || n_layer > 4096) {
        cm_free(arch);
        return cm_errf(err, errlen, CM_EFORMAT, "the model has no valid %s", key);
    }
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (!w) {
        cm_free(arch);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    cm_gguf_w_str(w, "general.architecture", arch);
    cm_gguf_w_str(w, "general.type", "adapter");
    cm_gguf_w_str(w, "general.name", "cumulo synth lora");
    cm_gguf_w_str(w, "adapter.type", "lora");
    cm_gguf_w_f32(w, "adapter.lora.alpha", p->alpha);
    cm_free(arch);
    float **bufs = cm_calloc(n_layer * 7 * 2 + 2, sizeof *bufs);
    int nb = 0, rc = 0;
    const float eff = p->alpha > 0 ? p->alpha / (float)p->rank : 1.0f; /* llama.cpp's scale at user scale 1 */
    for (uint64_t il = 0; bufs && il <= n_layer && !rc; il++) {
        for (int t = 0; t < (il == n_layer ? 1 : 7) && !rc; t++) {
            char name[160];
            if (il == n_layer) snprintf(name, sizeof name, "output.weight");
            else snprintf(name, sizeof name, "blk.%llu.%s.weight", (unsigned long long)il, targets[t]);
            if (p->only && !strstr(name, p->only)) continue;
            const cm_gguf_tensor_info *wt = cm_gguf_find_tensor(model, name);
            if (!wt || wt->n_dims != 2) continue;
            double rms = 0;
            if ((rc = weight_rms(wt, &rms, err, errlen))) break;
            const int64_t n_in = wt->ne[0], n_out = wt->ne[1], R = p->rank;
            float *a = cm_malloc((size_t)(n_in * R) * sizeof(float)),
                  *b = cm_malloc((size_t)(n_out * R) * sizeof(float));
            bufs[nb++] = a;
            bufs[nb++] = b;
            if (!a || !b) {
                rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
                break;
            }
            const double sa = 1.0 / sqrt((double)n_in);
            const double sb = p->strength * rms / (sqrt((double)R) * sa * eff);
            char an[200], bn[200];
            snprintf(an, sizeof an, "%s.lora_a", name);
            snprintf(bn, sizeof bn, "%s.lora_b", name);
            cm_rng rng;
            cm_rng_seed(&rng, lora_hash(an, p->seed));
            lora_normal(&rng, a, n_in * R, (float)sa);
            cm_rng_seed(&rng, lora_hash(bn, p->seed));
            lora_normal(&rng, b, n_out * R, (float)sb);
            const int64_t ne_a[2] = {n_in, R}, ne_b[2] = {R, n_out};
            cm_gguf_w_tensor(w, an, CM_TYPE_F32, 2, ne_a, a);
            cm_gguf_w_tensor(w, bn, CM_TYPE_F32, 2, ne_b, b);
        }
    }
    if (!bufs) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (!rc) rc = path ? cm_gguf_writer_write(w, path, err, errlen) : cm_gguf_writer_write_buf(w, out, err, errlen);
    for (int i = 0; i < nb; i++) cm_free(bufs[i]);
    cm_free(bufs);
    cm_gguf_writer_free(w);
    return rc;
}
