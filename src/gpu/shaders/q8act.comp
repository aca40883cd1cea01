#version 450
// Activations to Q8_0 the way the CPU converts them (quants_ref.c,
// llama.cpp's x86 path): per block of 32, d = amax / 127 rounded to F16,
// q = round-to-even(x * 127 / amax) clamped to [-128, 127]. Row j of x
// (x_off + j * ldx, K floats) becomes row j at q_off + j * nb * 9 words: nb
// scales (F32 holding the F16 value), then nb * 8 words of quants. -DQ8_1
// (for Q4_1/Q5_1): nb * 10 words, the nb sums s = d * sum(q) (rounded to F16
// as the CPU's Q8_1) after the scales. One
// invocation per (row, block). NEEDSWORK: Vulkan allows division 2.5 ulp
// off; an inexact 127 / amax would round a tie the other way (lavapipe
// divides exactly).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint K, ntok, x_off, ldx, q_off; } p;

void main() {
    const uint nb = p.K / 32, id = gl_GlobalInvocationID.x;
    if (id >= p.ntok * nb) return;
#ifdef Q8_1
    const uint RW = 10, XQ = 2 * nb;
#else
    const uint RW = 9, XQ = nb;
#endif
    const uint j = id / nb, b = id % nb, xb = p.x_off + j * p.ldx + b * 32, qr = p.q_off + j * nb * RW;
    float amax = 0.0;
    for (uint e = 0; e < 32; e++) amax = max(amax, abs(A[xb + e]));
    const float inv = amax != 0.0 ? 127.0 / amax : 0.0;
    A[qr + b] = f16r(amax / 127.0);
    int sum = 0;
    for (uint i = 0; i < 8; i++) {
        uint w = 0;
        for (uint k = 0; k < 4; k++) {
            const int v = clamp(int(roundEven(A[xb + i * 4 + k] * inv)), -128, 127);
            sum += v;
            w |= (uint(v) & 255u) << (8 * k);
        }
        AU[qr + XQ + b * 8 + i] = w;
    }
#ifdef Q8_1
    A[qr + nb + b] = f16r((amax / 127.0) * float(sum));
#endif
}
