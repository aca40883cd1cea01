#version 450
// y_j += b for rows j < rows of n elements (stride ld). b: a vector in W at
// b_off (a projection's bias); ids_off != ~0u: row j's expert's row of a
// stacked [n, experts] bias at b_off + AU[ids_off + j] * n (gpt-oss's expert
// biases); src_a != 0: row j of A at b_off + j * ld (a residual add).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint n, rows, y_off, ld, b_off, ids_off, src_a; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i >= p.n * p.rows) return;
    const uint j = i / p.n, c = i - j * p.n;
    const float b = p.src_a != 0u               ? A[p.b_off + j * p.ld + c]
                    : p.ids_off != 0xffffffffu ? uintBitsToFloat(W[p.b_off + AU[p.ids_off + j] * p.n + c])
                                               : uintBitsToFloat(W[p.b_off + c]);
    A[p.y_off + j * p.ld + c] += b;
}
