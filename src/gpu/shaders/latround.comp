#version 450
// The latent kv_cmpr rounded in place to attn_kv_b's activation type and
// back (mla.c, step 3: llama.cpp's MHA view of an unsplit attn_kv_b
// decompresses it so rounded): K floats of ntok rows at x_off + j * ldx.
// mode 0: F16; 1: Q8_0 (Q8_1 quantizes its values the same way): per block
// of 32, q8act.comp's d and q, back as q * d; 2: Q8_K: per 256, q8kact.comp's
// iscale and q, back as (1 / iscale) * q; 3: BF16. One invocation per (row,
// block of 32 / 256; F16, BF16: of 32).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint K, ntok, x_off, ldx, mode; } p;

float bf16r(float x) {
    const uint u = floatBitsToUint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    return uintBitsToFloat((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

void main() {
    const uint bs = p.mode == 2 ? 256 : 32, nb = p.K / bs, id = gl_GlobalInvocationID.x;
    if (id >= p.ntok * nb) return;
    const uint j = id / nb, b = id % nb, xb = p.x_off + j * p.ldx + b * bs;
    if (p.mode == 0 || p.mode == 3) {
        for (uint e = 0; e < 32; e++) A[xb + e] = p.mode == 0 ? f16r(A[xb + e]) : bf16r(A[xb + e]);
        return;
    }
    if (p.mode == 1) {
        float amax = 0.0;
        for (uint e = 0; e < 32; e++) amax = max(amax, abs(A[xb + e]));
        const float inv = amax != 0.0 ? 127.0 / amax : 0.0, d = f16r(amax / 127.0);
        for (uint e = 0; e < 32; e++) A[xb + e] = float(clamp(int(roundEven(A[xb + e] * inv)), -128, 127)) * d;
        return;
    }
    float amax = 0.0, mx = 0.0;
    for (uint e = 0; e < 256; e++) {
        const float v = A[xb + e];
        if (abs(v) > amax) {
            amax = abs(v);
            mx = v;
        }
    }
    const float iscale = amax != 0.0 ? -127.0 / mx : 0.0, d = amax != 0.0 ? 1.0 / iscale : 0.0;
    for (uint e = 0; e < 256; e++) A[xb + e] = d * float(min(127, int(roundEven(iscale * A[xb + e]))));
}
