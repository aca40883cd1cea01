#version 450
// Mixture-of-experts routing of one token per invocation, as the CPU's
// (src/model/moe.c, llama.cpp's softmax gating): the X router logits at
// lg_off + j * X become the softmax (max subtracted, exp, the sum (float
// here, double on the CPU), times 1 / sum) in place; the top K by
// probability (descending, ties to the lower expert id; a chosen one is
// marked -1, below every probability) go to AU[ids_off + j * K + k] with
// their weights at w_off + j * K + k, renormalised to sum 1 (norm: the sum
// clamped to F16's smallest normal) and scaled (scale != 0). qwen2moe's
// shared-expert gate (sh_off != ~0u): the logit there becomes llama.cpp's
// sigmoid silu(v) / v in place. oai (gpt-oss, llama.cpp's SOFTMAX_WEIGHT):
// the top K of the (already biased) logits themselves, their weights the
// softmax of the K chosen (no renormalising or scale).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint ntok, X, K, lg_off, ids_off, w_off, norm; float scale; uint sh_off, oai; } p;

void main() {
    const uint j = gl_GlobalInvocationID.x;
    if (j >= p.ntok) return;
    const uint lg = p.lg_off + j * p.X, o = j * p.K;
    if (p.oai != 0u) { /* a chosen logit is marked NaN: never chosen again */
        for (uint k = 0; k < p.K; k++) {
            int best = -1;
            for (uint e = 0; e < p.X; e++) {
                const float v = A[lg + e];
                if (!isnan(v) && (best < 0 || v > A[lg + uint(best)])) best = int(e);
            }
            AU[p.ids_off + o + k] = uint(best);
            A[p.w_off + o + k] = A[lg + uint(best)];
            A[lg + uint(best)] = uintBitsToFloat(0x7fc00000u);
        }
        float mx = A[p.w_off + o], sum = 0.0;
        for (uint k = 1; k < p.K; k++) mx = max(mx, A[p.w_off + o + k]);
        for (uint k = 0; k < p.K; k++) {
            const float v = exp(A[p.w_off + o + k] - mx);
            A[p.w_off + o + k] = v;
            sum += v;
        }
        const float inv = 1.0 / sum;
        for (uint k = 0; k < p.K; k++) A[p.w_off + o + k] *= inv;
        return;
    }
    float mx = A[lg];
    for (uint e = 1; e < p.X; e++) mx = max(mx, A[lg + e]);
    float sum = 0.0;
    for (uint e = 0; e < p.X; e++) {
        const float v = exp(A[lg + e] - mx);
        A[lg + e] = v;
        sum += v;
    }
    const float inv = 1.0 / sum;
    for (uint e = 0; e < p.X; e++) A[lg + e] *= inv;
    float ws = 0.0;
    for (uint k = 0; k < p.K; k++) {
        int best = -1;
        for (uint e = 0; e < p.X; e++) {
            const float v = A[lg + e];
            if (v >= 0.0 && (best < 0 || v > A[lg + uint(best)])) best = int(e);
        }
        const float w = A[lg + uint(best)];
        A[lg + uint(best)] = -1.0;
        AU[p.ids_off + o + k] = uint(best);
        A[p.w_off + o + k] = w;
        ws += w;
    }
    if (p.norm != 0u) {
        ws = max(ws, 6.103515625e-5);
        for (uint k = 0; k < p.K; k++) A[p.w_off + o + k] = A[p.w_off + o + k] / ws;
    }
    if (p.scale != 0.0 && p.scale != 1.0)
        for (uint k = 0; k < p.K; k++) A[p.w_off + o + k] = A[p.w_off + o + k] * p.scale;
    if (p.sh_off != 0xffffffffu) {
        const float v = A[p.sh_off + j];
        A[p.sh_off + j] = (v / (1.0 + exp(-v))) / v;
    }
}
