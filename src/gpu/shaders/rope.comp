#version 450
// RoPE of nh heads of D elements in ntok rows (stride ldx) from the CPU's
// per-token cache (cos, sin pairs of n_rot, rope.c): one invocation per
// rotated pair. neox: pairs (i, i + n_rot/2), else (2i, 2i + 1).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint n_rot, D, nh, ntok, x_off, ldx, c_off, neox; } p;

void main() {
    const uint half_ = p.n_rot / 2, id = gl_GlobalInvocationID.x;
    if (id >= p.ntok * p.nh * half_) return;
    const uint pi = id % half_, h = (id / half_) % p.nh, j = id / (half_ * p.nh);
    const float c = A[p.c_off + j * p.n_rot + 2 * pi], s = A[p.c_off + j * p.n_rot + 2 * pi + 1];
    const uint base = p.x_off + j * p.ldx + h * p.D;
    const uint a0 = p.neox != 0 ? base + pi : base + 2 * pi;
    const uint a1 = p.neox != 0 ? base + pi + half_ : a0 + 1;
    const float x0 = A[a0], x1 = A[a1];
    A[a0] = x0 * c - x1 * s;
    A[a1] = x0 * s + x1 * c;
}
