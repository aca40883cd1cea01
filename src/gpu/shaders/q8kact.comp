#version 450
// Activations to Q8_K the way the CPU converts them (quants_ref.c,
// x86_tiles.h): per super-block of 256, the signed value of largest
// magnitude (the first one wins a tie) gives iscale = -127 / max, q =
// min(127, round-to-even(iscale * x)), d = 1 / iscale, bsums per 16; an
// all-zero block is all zeros. Row j of x (x_off + j * ldx, K floats)
// becomes row j at q_off + j * nb * 81 words: nb scales (F32), nb * 16
// bsums (ints), then nb * 64 words of quants. One invocation per (row,
// super-block). NEEDSWORK: Vulkan allows division 2.5 ulp off (lavapipe
// divides exactly), as in q8act.comp.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint K, ntok, x_off, ldx, q_off; } p;

void main() {
    const uint nb = p.K / 256, id = gl_GlobalInvocationID.x;
    if (id >= p.ntok * nb) return;
    const uint j = id / nb, b = id % nb, xb = p.x_off + j * p.ldx + b * 256, qr = p.q_off + j * nb * 81;
    float amax = 0.0, mx = 0.0;
    for (uint e = 0; e < 256; e++) {
        const float v = A[xb + e];
        if (abs(v) > amax) {
            amax = abs(v);
            mx = v;
        }
    }
    const float iscale = amax != 0.0 ? -127.0 / mx : 0.0;
    A[qr + b] = amax != 0.0 ? 1.0 / iscale : 0.0;
    for (uint g = 0; g < 16; g++) {
        int s = 0;
        for (uint i = 0; i < 4; i++) {
            uint w = 0;
            for (uint k = 0; k < 4; k++) {
                const int v = min(127, int(roundEven(iscale * A[xb + g * 16 + i * 4 + k])));
                s += v;
                w |= (uint(v) & 255u) << (8 * k);
            }
            AU[qr + nb * 17 + b * 64 + g * 4 + i] = w;
        }
        AU[qr + nb + b * 16 + g] = uint(s);
    }
}
