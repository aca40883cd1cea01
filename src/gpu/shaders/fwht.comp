#version 450
// In place on rows of D floats (nh heads of D per token row, n token rows
// at x_off, stride ldx; one workgroup per (token, head)): the Walsh-Hadamard
// rotation of blocks of rot (0: none) as attn.c's cm_fwht_rows (each value
// times scale, then the butterflies: the same bits), then with q8 != 0 the
// row rounded through Q8_0 as the CPU converts activations (q8act.comp) and
// back to floats. A quantized cache's query (rotated as its keys, then
// through K's vec_dot type, Q8_0) and its attention output (back from the
// values' rotation).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P {
    uint D, nh, n, x_off, ldx, rot;
    float scale;
    uint q8;
    float pre; /* each value times pre first (gemma3's attn_q_scale as attn_layer.c applies it; else 1) */
} p;
shared float sh[1024];

void main() {
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, D = p.D;
    const uint base = p.x_off + (row / p.nh) * p.ldx + (row % p.nh) * D;
    if (p.rot != 0u) {
        for (uint d = tid; d < D; d += 64u) {
            precise const float v0 = A[base + d] * p.pre;
            precise const float v = v0 * p.scale;
            sh[d] = v;
        }
        const uint half_n = p.rot / 2u;
        for (uint len = 1u; len < p.rot; len <<= 1) {
            barrier();
            for (uint q = tid; q < D / 2u; q += 64u) {
                const uint c = q / half_n, r = q % half_n;
                const uint i = c * p.rot + (r / len) * 2u * len + r % len;
                precise const float u = sh[i], w = sh[i + len];
                precise const float a = u + w, b = u - w;
                sh[i] = a;
                sh[i + len] = b;
            }
        }
        barrier();
        if (p.q8 == 0u) {
            for (uint d = tid; d < D; d += 64u) A[base + d] = sh[d];
            return;
        }
        for (uint d = tid; d < D; d += 64u) A[base + d] = sh[d];
        memoryBarrierBuffer();
        barrier();
    }
    if (p.q8 == 0u) return;
    if (p.rot == 0u && p.pre != 1.0) {
        for (uint d = tid; d < D; d += 64u) {
            precise const float v = A[base + d] * p.pre;
            A[base + d] = v;
        }
        memoryBarrierBuffer();
        barrier();
    }
    for (uint b = tid; b < D / 32u; b += 64u) {
    const uint xb = base + b * 32u;
    float amax = 0.0;
    for (uint e = 0u; e < 32u; e++) amax = max(amax, abs(A[xb + e]));
    const float inv = amax != 0.0 ? 127.0 / amax : 0.0;
    const float d = f16r(amax / 127.0);
    for (uint e = 0u; e < 32u; e++) {
        precise const float v = A[xb + e] * inv;
        A[xb + e] = float(clamp(int(roundEven(v)), -128, 127)) * d;
    }
    }
}
