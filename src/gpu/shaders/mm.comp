#version 450
// y[j * ldy + r] (+)= dot(W row r, x_j): one workgroup per (row, 8 tokens),
// 64 threads over the row's blocks, summed by mmred.glsl (a shared-memory
// tree, or subgroupAdd in the *_sg variants).
// Weights are repacked at upload (vk_pack.c): F32, F16 and BF16 rows as in
// the file; Q8_0/Q4_0/Q5_0 as all the rows' block scales (F32) first, then the
// blocks' quants (8 / 4 / 5 words per block, Q5_0's qh first); Q4_1/Q5_1
// with all the mins (F32) between the scales and the quants. Activations as
// the CPU's kernels take them (kernels.h): F32 for F32; rounded to F16 for
// F16 and to BF16 for BF16; Q8_0 (q8act.comp: row j at x_off + j * ldx: nb scales, then nb * 8
// words of quants) for Q8_0/Q4_0/Q5_0 and MXFP4/IQ4_NL (Q4_0's layout, the
// nibbles indexing their tables; MXFP4's E8M0 scale halved as the CPU's), Q8_1 (q8act.comp -DQ8_1: the nb sums
// between) for Q4_1/Q5_1; integer block sums scaled by dw * dx (+ min * sum).
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint K, rows, ntok, w_off_, x_off, ldx, y_off, ldy, add, ids_off, w_stride, xdiv; } p;
#include "mmred.glsl"

#if defined(T_BF16)
// x rounded to BF16 (to nearest, ties to even, NaN kept: the CPU's cm_f32_to_bf16) and back
float bf16r(float x) {
    const uint u = floatBitsToUint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    return uintBitsToFloat((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
#endif

void main() {
    // w_stride != 0: a mixture-of-experts product (vk_model.c's record_moe): workgroup y is
    // one (token, slot) assignment t0, its expert AU[ids_off + t0] the
    // matrix at w_off + expert * w_stride, its input row t0 / xdiv.
    const bool ex = p.w_stride != 0u;
    const uint row = gl_WorkGroupID.x, t0 = ex ? gl_WorkGroupID.y : gl_WorkGroupID.y * 8, tid = gl_LocalInvocationID.x;
    const uint w_off = ex ? p.w_off_ + AU[p.ids_off + t0] * p.w_stride : p.w_off_, x0 = ex ? t0 / p.xdiv : t0;
    const uint nt = ex ? 1u : min(8u, p.ntok - t0);
    float acc[8];
    for (uint t = 0; t < 8; t++) acc[t] = 0.0;
#if defined(T_F32)
    const uint wr = w_off + row * p.K;
    for (uint e = tid; e < p.K; e += 64) {
        const float w = uintBitsToFloat(W[wr + e]);
        for (uint t = 0; t < nt; t++) acc[t] += w * A[p.x_off + (x0 + t) * p.ldx + e];
    }
#elif defined(T_F16)
    const uint wr = w_off + row * (p.K / 2);
    for (uint e = tid; e < p.K / 2; e += 64) {
        const vec2 w = unpackHalf2x16(W[wr + e]);
        for (uint t = 0; t < nt; t++) {
            const uint xi = p.x_off + (x0 + t) * p.ldx + 2 * e;
            acc[t] += w.x * f16r(A[xi]) + w.y * f16r(A[xi + 1]);
        }
    }
#elif defined(T_BF16)
    const uint wr = w_off + row * (p.K / 2);
    for (uint e = tid; e < p.K / 2; e += 64) {
        const uint u = W[wr + e];
        const float w0 = uintBitsToFloat(u << 16), w1 = uintBitsToFloat(u & 0xffff0000u);
        for (uint t = 0; t < nt; t++) {
            const uint xi = p.x_off + (x0 + t) * p.ldx + 2 * e;
            acc[t] += w0 * bf16r(A[xi]) + w1 * bf16r(A[xi + 1]);
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
        const float dw = uintBitsToFloat(W[w_off + row * nb + b]);
        int w[32];
#if defined(T_Q8_0)
        const uint qb = w_off + p.rows * nb + (row * nb + b) * 8;
        for (uint i = 0; i < 8; i++) {
            const int u = int(W[qb + i]);
            for (int k = 0; k < 4; k++) w[i * 4 + k] = bitfieldExtract(u, 8 * k, 8);
        }
#elif defined(T_Q4_0)
        const uint qb = w_off + p.rows * nb + (row * nb + b) * 4;
        for (uint i = 0; i < 4; i++) {
            const uint u = W[qb + i];
            for (uint k = 0; k < 4; k++) {
                const uint by = (u >> (8 * k)) & 255u;
                w[i * 4 + k] = int(by & 15u) - 8;
                w[16 + i * 4 + k] = int(by >> 4) - 8;
            }
        }
#elif defined(T_MXFP4) || defined(T_IQ4_NL)
#ifdef T_MXFP4
        const int kv[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
#else
        const int kv[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
#endif
        const uint qb = w_off + p.rows * nb + (row * nb + b) * 4;
        for (uint i = 0; i < 4; i++) {
            const uint u = W[qb + i];
            for (uint k = 0; k < 4; k++) {
                const uint by = (u >> (8 * k)) & 255u;
                w[i * 4 + k] = kv[by & 15u];
                w[16 + i * 4 + k] = kv[by >> 4];
            }
        }
#elif defined(T_Q4_1)
        const uint qb = w_off + 2 * p.rows * nb + (row * nb + b) * 4;
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
        const uint qb = w_off + SC * p.rows * nb + (row * nb + b) * 5, qh = W[qb];
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
            const uint xr = p.x_off + (x0 + t) * p.ldx, xq = xr + XQ + b * 8;
            int s = 0;
            for (uint i = 0; i < 8; i++) {
                const int u = int(AU[xq + i]);
                for (int k = 0; k < 4; k++) s += w[i * 4 + k] * bitfieldExtract(u, 8 * k, 8);
            }
#if defined(T_Q4_1) || defined(T_Q5_1)
            acc[t] += float(s) * (dw * A[xr + b]) + uintBitsToFloat(W[w_off + p.rows * nb + row * nb + b]) * A[xr + nb + b];
#else
            acc[t] += float(s) * (dw * A[xr + b]);
#endif
        }
    }
#endif
    store_rows(acc, nt, t0, row, tid);
}
