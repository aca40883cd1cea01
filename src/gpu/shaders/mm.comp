#version 450
// y[j * ldy + r] (+)= dot(W row r, x_j): one workgroup per (row, 8 tokens),
// 64 threads over the row's blocks, a shared-memory tree for the sum.
// Weights are repacked at upload (vk_pack.c): F32 and F16 rows as in the
// file; Q8_0/Q4_0/Q5_0 as all the rows' block scales (F32) first, then the
// blocks' quants (8 / 4 / 5 words per block, Q5_0's qh first); Q4_1/Q5_1
// with all the mins (F32) between the scales and the quants. Activations as
// the CPU's kernels take them (kernels.h): F32 for F32; rounded to F16 for
// F16; Q8_0 (q8act.comp: row j at x_off + j * ldx: nb scales, then nb * 8
// words of quants) for Q8_0/Q4_0/Q5_0, Q8_1 (q8act.comp -DQ8_1: the nb sums
// between) for Q4_1/Q5_1; integer block sums scaled by dw * dx (+ min * sum).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint K, rows, ntok, w_off, x_off, ldx, y_off, ldy, add; } p;
shared float red[8 * 64];

void main() {
    const uint row = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * 8, tid = gl_LocalInvocationID.x;
    const uint nt = min(8u, p.ntok - t0);
    float acc[8];
    for (uint t = 0; t < 8; t++) acc[t] = 0.0;
#if defined(T_F32)
    const uint wr = p.w_off + row * p.K;
    for (uint e = tid; e < p.K; e += 64) {
        const float w = uintBitsToFloat(W[wr + e]);
        for (uint t = 0; t < nt; t++) acc[t] += w * A[p.x_off + (t0 + t) * p.ldx + e];
    }
#elif defined(T_F16)
    const uint wr = p.w_off + row * (p.K / 2);
    for (uint e = tid; e < p.K / 2; e += 64) {
        const vec2 w = unpackHalf2x16(W[wr + e]);
        for (uint t = 0; t < nt; t++) {
            const uint xi = p.x_off + (t0 + t) * p.ldx + 2 * e;
            acc[t] += w.x * f16r(A[xi]) + w.y * f16r(A[xi + 1]);
        }
    }
#else
    const uint nb = p.K / 32;
#if defined(T_Q4_1) || defined(T_Q5_1) /* the mins after the scales; Q8_1 activations: the sums after the scales */
    const uint SC = 2, XQ = 2 * nb;
#else
    const uint SC = 1, XQ = nb;
#endif
    for (uint b = tid; b < nb; b += 64) {
        const float dw = uintBitsToFloat(W[p.w_off + row * nb + b]);
        int w[32];
#if defined(T_Q8_0)
        const uint qb = p.w_off + p.rows * nb + (row * nb + b) * 8;
        for (uint i = 0; i < 8; i++) {
            const int u = int(W[qb + i]);
            for (int k = 0; k < 4; k++) w[i * 4 + k] = bitfieldExtract(u, 8 * k, 8);
        }
#elif defined(T_Q4_0)
        const uint qb = p.w_off + p.rows * nb + (row * nb + b) * 4;
        for (uint i = 0; i < 4; i++) {
            const uint u = W[qb + i];
            for (uint k = 0; k < 4; k++) {
                const uint by = (u >> (8 * k)) & 255u;
                w[i * 4 + k] = int(by & 15u) - 8;
                w[16 + i * 4 + k] = int(by >> 4) - 8;
            }
        }
#elif defined(T_Q4_1)
        const uint qb = p.w_off + 2 * p.rows * nb + (row * nb + b) * 4;
        for (uint i = 0; i < 4; i++) {
            const uint u = W[qb + i];
            for (uint k = 0; k < 4; k++) {
                const uint by = (u >> (8 * k)) & 255u;
                w[i * 4 + k] = int(by & 15u);
                w[16 + i * 4 + k] = int(by >> 4);
            }
        }
#elif defined(T_Q5_0) || defined(T_Q5_1)
#ifdef T_Q5_0
        const int off5 = 16;
#else
        const int off5 = 0;
#endif
        const uint qb = p.w_off + SC * p.rows * nb + (row * nb + b) * 5, qh = W[qb];
        for (uint i = 0; i < 4; i++) {
            const uint u = W[qb + 1 + i];
            for (uint k = 0; k < 4; k++) {
                const uint by = (u >> (8 * k)) & 255u, e = i * 4 + k;
                w[e] = int((by & 15u) | (((qh >> e) & 1u) << 4)) - off5;
                w[16 + e] = int((by >> 4) | (((qh >> (e + 16)) & 1u) << 4)) - off5;
            }
        }
#endif
        for (uint t = 0; t < nt; t++) {
            const uint xr = p.x_off + (t0 + t) * p.ldx, xq = xr + XQ + b * 8;
            int s = 0;
            for (uint i = 0; i < 8; i++) {
                const int u = int(AU[xq + i]);
                for (int k = 0; k < 4; k++) s += w[i * 4 + k] * bitfieldExtract(u, 8 * k, 8);
            }
#if defined(T_Q4_1) || defined(T_Q5_1)
            acc[t] += float(s) * (dw * A[xr + b]) + uintBitsToFloat(W[p.w_off + p.rows * nb + row * nb + b]) * A[xr + nb + b];
#else
            acc[t] += float(s) * (dw * A[xr + b]);
#endif
        }
    }
#endif
    for (uint t = 0; t < 8; t++) red[t * 64 + tid] = acc[t];
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
        if (tid < s)
            for (uint t = 0; t < 8; t++) red[t * 64 + tid] += red[t * 64 + tid + s];
        barrier();
    }
    if (tid < nt) {
        const uint yi = p.y_off + (t0 + tid) * p.ldy + row;
        A[yi] = (p.add != 0 ? A[yi] : 0.0) + red[tid * 64];
    }
}
