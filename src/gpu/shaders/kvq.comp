#version 450
// A quantized cache's K and V rows (kvq.glsl's layout) of ntok tokens: one
// workgroup per (token, kv head) and kind (y: 0 K, 1 V), as the CPU's
// cm_kv_store_rows stores them: rotated first where the CPU rotates
// (rk / rv: the Walsh-Hadamard block, 0: none; sk / sv: its 1/sqrt(n)),
// in attn.c's order (scale, then the butterflies, so the same bits), then
// quantized as quantize.c's q8_0_row / q4_0_row (the weights' reference
// quantizers: Q8_0 d = amax / 127 and roundf(x / d); Q4_0 d = -max / 8 with
// max the first value of largest magnitude, min(15, int(x / d + 8.5))); the
// scale stored rounded to F16. The rows come from A (k_off / v_off + j * ld
// + hk * D); slot and position per token from the metadata. NEEDSWORK:
// Vulkan allows division 2.5 ulp off (lavapipe divides exactly).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
#include "kvq.glsl"
layout(push_constant) uniform P {
    uint D, nkv, ntok, ctx, k_off, v_off, ld, meta_off, B, layer_base, slot_stride, kt, vt, krw, vrw, rk, rv;
    float sk, sv;
} p;
shared float sh[1024];

// roundf: to nearest, halves away from zero
float round_away(float v) {
    const float t = trunc(v);
    precise const float f = abs(v - t);
    return f >= 0.5 ? t + sign(v) : t;
}

float elem(bool rot, uint src, uint e) { return rot ? sh[e] : A[src + e]; }

void main() {
    const uint row = gl_WorkGroupID.x, kind = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint j = row / p.nkv, hk = row % p.nkv, D = p.D;
    const uint t = kind == 0u ? p.kt : p.vt, rot = kind == 0u ? p.rk : p.rv, rw = kind == 0u ? p.krw : p.vrw;
    const float sc = kind == 0u ? p.sk : p.sv;
    const uint src = (kind == 0u ? p.k_off : p.v_off) + j * p.ld + hk * D;
    const uint pos = AU[p.meta_off + j], slot = AU[p.meta_off + p.B + j];
    const uint dst = slot * p.slot_stride + p.layer_base + (kind == 0u ? 0u : p.nkv * p.ctx * p.krw) +
                     (hk * p.ctx + pos) * rw;
    if (rot != 0u) {
        for (uint d = tid; d < D; d += 64u) {
            precise const float v = A[src + d] * sc;
            sh[d] = v;
        }
        const uint half_n = rot / 2u;
        for (uint len = 1u; len < rot; len <<= 1) {
            barrier();
            for (uint q = tid; q < D / 2u; q += 64u) {
                const uint c = q / half_n, r = q % half_n;
                const uint i = c * rot + (r / len) * 2u * len + r % len;
                precise const float u = sh[i], w = sh[i + len];
                precise const float a = u + w, b = u - w;
                sh[i] = a;
                sh[i + len] = b;
            }
        }
        barrier();
    }
    const uint nb = D / 32u;
    const bool rt = rot != 0u;
    for (uint b = tid; b < nb; b += 64u) {
    const uint e0 = b * 32u;
    if (t == KVT_Q8_0) {
        float amax = 0.0;
        for (uint e = 0u; e < 32u; e++) amax = max(amax, abs(elem(rt, src, e0 + e)));
        const float d = amax / 127.0;
        const float id = d != 0.0 ? 1.0 / d : 0.0;
        KVU[dst + b] = floatBitsToUint(f16r(d));
        for (uint i = 0u; i < 8u; i++) {
            uint w = 0u;
            for (uint k = 0u; k < 4u; k++) {
                precise const float v = elem(rt, src, e0 + i * 4u + k) * id;
                w |= (uint(int(round_away(v))) & 255u) << (8u * k);
            }
            KVU[dst + nb + b * 8u + i] = w;
        }
    } else {
        float amax = 0.0, mx = 0.0;
        for (uint e = 0u; e < 32u; e++) {
            const float x = elem(rt, src, e0 + e);
            if (amax < abs(x)) {
                amax = abs(x);
                mx = x;
            }
        }
        const float d = mx / -8.0;
        const float id = d != 0.0 ? 1.0 / d : 0.0;
        KVU[dst + b] = floatBitsToUint(f16r(d));
        for (uint i = 0u; i < 4u; i++) {
            uint w = 0u;
            for (uint k = 0u; k < 8u; k++) {
                precise const float v = elem(rt, src, e0 + i * 8u + k) * id;
                precise const float v8 = v + 8.5;
                w |= uint(min(15, int(v8))) << (4u * k);
            }
            KVU[dst + nb + b * 4u + i] = w;
        }
    }
    }
}
