#version 450
// g[i] = silu(g[i]) * u[i] over n elements.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint n, g_off, u_off; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) return;
    const float v = A[p.g_off + i];
    A[p.g_off + i] = (v / (1.0 + exp(-v))) * A[p.u_off + i];
}
