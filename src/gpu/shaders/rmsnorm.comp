#version 450
// y_j = (x_j / sqrt(mean(x_j^2) + eps)) * w: one workgroup per row j; add:
// y_j += that instead (gemma3's post norms into the residual).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint n, x_off, ldx, y_off, ldy, w_off; float eps; uint add; } p;
shared float red[64];

void main() {
    const uint j = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint xb = p.x_off + j * p.ldx, yb = p.y_off + j * p.ldy;
    float s = 0.0;
    for (uint i = tid; i < p.n; i += 64) s += A[xb + i] * A[xb + i];
    red[tid] = s;
    barrier();
    for (uint h = 32; h > 0; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    const float scale = 1.0 / sqrt(red[0] / float(p.n) + p.eps);
    for (uint i = tid; i < p.n; i += 64) {
        const float v = (A[xb + i] * scale) * uintBitsToFloat(W[p.w_off + i]);
        A[yb + i] = p.add != 0 ? A[yb + i] + v : v;
    }
}
