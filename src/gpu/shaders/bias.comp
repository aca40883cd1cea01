#version 450
// y_j += b for rows j < rows of n elements (stride ld): a projection's bias.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint n, rows, y_off, ld, b_off; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i >= p.n * p.rows) return;
    const uint j = i / p.n, c = i - j * p.n;
    A[p.y_off + j * p.ld + c] += uintBitsToFloat(W[p.b_off + c]);
}
