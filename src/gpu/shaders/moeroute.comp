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
// softmax of the K chosen (no renormalising or scale). deepseek2 (sel_off
// != ~0u): the probabilities are the softmax or (sig) the sigmoid of the
// logits; the selection scores at sel_off + j * X are them plus the bias
// (W[bias_off + e], when bias_off != ~0u) and, with G > 1 groups, those of
// every group outside the best GU (each scored by the sum of its top two,
// at gs_off + j * G) are -inf; the top K by selection score (a chosen one
// marked NaN) take their unbiased probabilities as weights, then norm and
// scale as above.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P {
    uint ntok, X, K, lg_off, ids_off, w_off, norm;
    float scale;
    uint sh_off, oai, sig, bias_off, G, GU, sel_off, gs_off;
} p;

/* deepseek2: the selection scores (biased, group-masked) and the top K by them */
void select_ds(const uint j, const uint lg, const uint o) {
    const uint sl = p.sel_off + j * p.X;
    const float nan_ = uintBitsToFloat(0x7fc00000u), ninf = uintBitsToFloat(0xff800000u);
    for (uint e = 0; e < p.X; e++)
        A[sl + e] = p.bias_off != 0xffffffffu ? A[lg + e] + uintBitsToFloat(W[p.bias_off + e]) : A[lg + e];
    if (p.G > 1) {
        const uint per = p.X / p.G, gb = p.gs_off + j * p.G;
        for (uint g = 0; g < p.G; g++) {
            const uint v = sl + g * per;
            uint b0 = 0;
            for (uint e = 1; e < per; e++)
                if (A[v + e] > A[v + b0]) b0 = e;
            uint b1 = b0 == 0 ? 1 : 0;
            for (uint e = 0; e < per; e++)
                if (e != b0 && A[v + e] > A[v + b1]) b1 = e;
            A[gb + g] = A[v + b0] + A[v + b1];
        }
        for (uint k = 0; k < p.GU; k++) { /* a kept group is marked NaN */
            int best = -1;
            for (uint g = 0; g < p.G; g++)
                if (!isnan(A[gb + g]) && (best < 0 || A[gb + g] > A[gb + uint(best)])) best = int(g);
            A[gb + uint(best)] = nan_;
        }
        for (uint g = 0; g < p.G; g++)
            if (!isnan(A[gb + g]))
                for (uint e = 0; e < per; e++) A[sl + g * per + e] = ninf;
    }
    for (uint k = 0; k < p.K; k++) {
        int best = -1;
        for (uint e = 0; e < p.X; e++) {
            const float v = A[sl + e];
            if (!isnan(v) && (best < 0 || v > A[sl + uint(best)])) best = int(e);
        }
        A[sl + uint(best)] = nan_;
        AU[p.ids_off + o + k] = uint(best);
        A[p.w_off + o + k] = A[lg + uint(best)];
    }
}

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
    if (p.sig != 0u) {
        for (uint e = 0; e < p.X; e++) A[lg + e] = 1.0 / (1.0 + exp(-A[lg + e]));
    } else {
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
    }
    float ws = 0.0;
    if (p.sel_off != 0xffffffffu) {
        select_ds(j, lg, o);
        for (uint k = 0; k < p.K; k++) ws += A[p.w_off + o + k];
    }
    for (uint k = 0; p.sel_off == 0xffffffffu && k < p.K; k++) {
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
