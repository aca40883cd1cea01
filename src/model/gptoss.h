/*
 * gptoss.h (private to src/model): what the gpt-oss architecture (llama.cpp's
 * "openai-moe") adds to the shared forward pass: its hyperparameters
 * (alternating sliding-window and full layers, YaRN RoPE), the tensors the
 * other architectures lack (attention sinks, attn_output, router and expert
 * biases), its clamped SwiGLU and the YaRN rotation cache.
 *
 * The arithmetic follows ggml's CPU ops so that results match llama.cpp:
 *   - experts: top-k of the biased router logits, their weights the softmax
 *     of the k chosen logits (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT),
 *     gate and up plus their expert's bias, then
 *     swiglu_oai(g, u) = min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1),
 *     down plus its bias, times the weight (moe.c does the rest);
 *   - attention: a per-head sink logit joins the softmax's max and sum but
 *     has no value (forward.c), scale 1/sqrt(head_dim);
 *   - RoPE: NEOX pairs; YaRN as ggml_rope_yarn_corr_dims + rope_yarn.
 */
#ifndef CM_MODEL_GPTOSS_H
#define CM_MODEL_GPTOSS_H

#include "model.h"

#include <math.h>

/* After the common keys: sliding window (required), its pattern (default 2:
 * even layers slide), the SWA RoPE base, and YaRN (also accepted only here;
 * NEEDSWORK: the longctx branch brings RoPE scaling for every architecture,
 * then this is one caller of it). */
int cm_gptoss_load_hparams(cm_model *m, char *err, size_t errlen);
/* Bind layer il's gpt-oss-only tensors (all F32, all required). */
int cm_gptoss_bind_layer(cm_model *m, int il, char *err, size_t errlen);
/* YaRN rotation cache for position p: n_rot floats (cos, sin pairs) like
 * ggml_rope_cache_init with ext_factor/attn_factor from hp. ff: frequency
 * factors or NULL. */
void cm_yarn_rope_cache(const cm_hparams *hp, float p, float base, float freq_scale, const float *ff, float *cache);

/* ggml_compute_forward_swiglu_oai_f32 with llama.cpp's alpha 1.702, limit 7. */
static inline float cm_swiglu_oai(float g, float u) {
    const float limit = 7.0f, alpha = 1.702f;
    const float x = limit < g ? limit : g;                       /* std::min */
    const float y = u < -limit ? -limit : limit < u ? limit : u; /* std::clamp */
    const float glu = x / (1.0f + expf(alpha * (-x)));
    return glu * (y + 1.0f);
}

#endif
