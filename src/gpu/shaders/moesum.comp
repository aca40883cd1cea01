#version 450
// The mixture-of-experts output added to the residual, one invocation per
// (token j, element i), as the CPU's (src/model/moe.c, step 7): the K
// expert rows of token j (y_off + (j * K + k) * E) times their weights
// (w_off + j * K + k) summed in top-k order, then the shared expert's row
// (ys_off + j * E, when ys_off != ~0u) times its gate (sg_off + j, when
// sg_off != ~0u), and that sum added to x (x_off + j * E).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint ntok, E, K, y_off, w_off, x_off, ys_off, sg_off; } p;

void main() {
    const uint id = gl_GlobalInvocationID.x;
    if (id >= p.ntok * p.E) return;
    const uint j = id / p.E, i = id % p.E;
    float acc = A[p.y_off + (j * p.K) * p.E + i] * A[p.w_off + j * p.K];
    for (uint k = 1; k < p.K; k++) acc = acc + A[p.y_off + (j * p.K + k) * p.E + i] * A[p.w_off + j * p.K + k];
    if (p.ys_off != 0xffffffffu) {
        const float ys = A[p.ys_off + j * p.E + i];
        acc = acc + (p.sg_off != 0xffffffffu ? ys * A[p.sg_off + j] : ys);
    }
    A[p.x_off + j * p.E + i] += acc;
}
