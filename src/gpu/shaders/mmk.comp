#version 450
// y[j * ldy + r] (+)= dot(W row r, x_j) for the K-quants (Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K), IQ4_XS (IQ4_NL's values under 6-bit sub-block scales) and
// the grid types IQ2_XXS, IQ3_XXS, IQ1_S against activations in Q8_K (q8kact.comp: row j at x_off +
// j * ldx: nb scales, nb * 16 bsums, nb * 64 words of quants). One
// workgroup per (row, 8 tokens), 64 threads over the row's 32-element
// chunks (8 per super-block). The weights are the file's blocks, each
// padded to whole words (vk_pack.c): row r's block b at w_off + (r * nb +
// b) * BW. Per chunk, as the CPU's integer dot: sum over its two groups of
// 16 of scale * sum(q * x_q), minus min * bsum; then (d * dx) * isum -
// (dmin * dx) * summ in float (the CPU does the float step per super-block,
// here per chunk: a last-bit difference). A grid type's matrix starts with
// its grid (GW words, vk_pack.c: entry i's bytes as in src/kernels/
// iq_grids.c), a stacked expert tensor's once before its first expert; its
// power-of-two output factor (IQ2_XXS 1/8, IQ3_XXS 1/4) is folded into d,
// and IQ1_S's delta term is the min term (dmin = -d / 8).
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint K, rows, ntok, w_off_, x_off, ldx, y_off, ldy, add, ids_off, w_stride, xdiv; } p;
#include "mmred.glsl"

#if defined(T_Q4_K)
#define BW 36u
#elif defined(T_Q5_K)
#define BW 44u
#elif defined(T_Q6_K)
#define BW 53u
#elif defined(T_Q2_K)
#define BW 21u
#elif defined(T_IQ4_XS)
#define BW 34u
#elif defined(T_IQ2_XXS)
#define BW 17u
#define GW 512u
#elif defined(T_IQ3_XXS)
#define BW 25u
#define GW 256u
#elif defined(T_IQ1_S)
#define BW 13u
#define GW 4096u
#else /* T_Q3_K */
#define BW 28u
#endif

#ifndef GW
#define GW 0u
#endif

uint wb(uint base, uint i) { return (W[base + (i >> 2)] >> ((i & 3u) * 8u)) & 255u; }
uint wb32(uint base, uint i) { return wb(base, i) | (wb(base, i + 1) << 8) | (wb(base, i + 2) << 16) | (wb(base, i + 3) << 24); }
// IQ2/IQ3 signs: 7 stored bits and their parity as the 8th (ggml's ksigns table)
uint iqsigns(uint k) { return k | ((uint(bitCount(k)) & 1u) << 7); }

// Sub-block j (0..7) scale and min of Q4_K/Q5_K (6 bits each in 12 bytes at byte 4).
void k4sm(uint base, uint j, out int sc, out int m) {
    if (j < 4) {
        sc = int(wb(base, 4 + j) & 63u);
        m = int(wb(base, 8 + j) & 63u);
    } else {
        sc = int((wb(base, 8 + j) & 15u) | ((wb(base, j) >> 6) << 4));
        m = int((wb(base, 8 + j) >> 4) | ((wb(base, 4 + j) >> 6) << 4));
    }
}

void main() {
    // w_stride != 0: a mixture-of-experts product (vk_model.c's record_moe): workgroup y is
    // one (token, slot) assignment t0, its expert AU[ids_off + t0] the
    // matrix at w_off + expert * w_stride, its input row t0 / xdiv.
    const bool ex = p.w_stride != 0u;
    const uint row = gl_WorkGroupID.x, t0 = ex ? gl_WorkGroupID.y : gl_WorkGroupID.y * 8, tid = gl_LocalInvocationID.x;
    const uint gb = p.w_off_; /* a grid type's grid */
    const uint w_off = (ex ? p.w_off_ + AU[p.ids_off + t0] * p.w_stride : p.w_off_) + GW, x0 = ex ? t0 / p.xdiv : t0;
    const uint nt = ex ? 1u : min(8u, p.ntok - t0), nb = p.K / 256;
    float acc[8];
    for (uint t = 0; t < 8; t++) acc[t] = 0.0;
    for (uint u = tid; u < nb * 8; u += 64) {
        const uint b = u / 8, c = u % 8, base = w_off + (row * nb + b) * BW;
        const uint h = c / 4, k = c % 4;
        int w[32];
        int sc0, sc1, m0 = 0, m1 = 0;
        float d, dmin = 0.0;
#if defined(T_Q4_K) || defined(T_Q5_K)
        const vec2 dd = unpackHalf2x16(W[base]);
        d = dd.x;
        dmin = dd.y;
        k4sm(base, c, sc0, m0);
        sc1 = sc0;
        m1 = m0;
#if defined(T_Q4_K)
        const uint qs = 16;
#else
        const uint qs = 48;
#endif
        for (uint l = 0; l < 32; l++) {
            const uint by = wb(base, qs + 32 * (c / 2) + l);
            int v = int((c & 1u) != 0 ? by >> 4 : by & 15u);
#if defined(T_Q5_K)
            v |= int((wb(base, 16 + l) >> c) & 1u) << 4;
#endif
            w[l] = v;
        }
#elif defined(T_Q6_K)
        d = unpackHalf2x16(W[base + 52]).x;
        sc0 = int(wb(base, 192 + 2 * c) << 24) >> 24;
        sc1 = int(wb(base, 193 + 2 * c) << 24) >> 24;
        for (uint l = 0; l < 32; l++) {
            const uint by = wb(base, h * 64 + l + 32 * (k & 1u));
            const uint lo = k < 2 ? by & 15u : by >> 4;
            const uint hi = (wb(base, 128 + h * 32 + l) >> (2 * k)) & 3u;
            w[l] = int(lo | (hi << 4)) - 32;
        }
#elif defined(T_IQ4_XS)
        // d (f16), scales_h (u16: 2 top bits per sub-block), scales_l[4] (4 low bits each), qs[128]
        const int kv[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        d = unpackHalf2x16(W[base]).x;
        sc0 = int(((wb(base, 4 + c / 2) >> (4 * (c & 1u))) & 15u) | (((W[base] >> (16u + 2u * c)) & 3u) << 4)) - 32;
        sc1 = sc0;
        for (uint l = 0; l < 16; l++) {
            const uint by = wb(base, 8 + 16 * c + l);
            w[l] = kv[by & 15u];
            w[16 + l] = kv[by >> 4];
        }
#elif defined(T_IQ2_XXS)
        // d (f16), then per chunk 4 grid indices and a u32 of 4 x 7 sign bits and a 4-bit scale
        d = unpackHalf2x16(W[base]).x * 0.125;
        const uint aux = wb32(base, 2 + 8 * c + 4);
        sc0 = int(2u * (aux >> 28) + 1u);
        sc1 = sc0;
        for (uint l = 0; l < 4; l++) {
            const uint gi = wb(base, 2 + 8 * c + l), sg = iqsigns((aux >> (7u * l)) & 127u);
            const uint g0 = W[gb + 2 * gi], g1 = W[gb + 2 * gi + 1];
            for (uint j = 0; j < 8; j++) {
                const int v = int(((j < 4 ? g0 : g1) >> (8u * (j & 3u))) & 255u);
                w[8 * l + j] = ((sg >> j) & 1u) != 0 ? -v : v;
            }
        }
#elif defined(T_IQ3_XXS)
        // d (f16), 64 grid indices (8 per chunk), then per chunk a u32 of 4 x 7 sign bits and a 4-bit scale
        d = unpackHalf2x16(W[base]).x * 0.25;
        const uint aux = wb32(base, 66 + 4 * c);
        sc0 = int(2u * (aux >> 28) + 1u);
        sc1 = sc0;
        for (uint l = 0; l < 4; l++) {
            const uint sg = iqsigns((aux >> (7u * l)) & 127u);
            const uint g0 = W[gb + wb(base, 2 + 8 * c + 2 * l)], g1 = W[gb + wb(base, 3 + 8 * c + 2 * l)];
            for (uint j = 0; j < 4; j++) {
                const int v0 = int((g0 >> (8u * j)) & 255u), v1 = int((g1 >> (8u * j)) & 255u);
                w[8 * l + j] = ((sg >> j) & 1u) != 0 ? -v0 : v0;
                w[8 * l + 4 + j] = ((sg >> (j + 4)) & 1u) != 0 ? -v1 : v1;
            }
        }
#elif defined(T_IQ1_S)
        // d (f16), qs[32] (4 low index bytes per chunk), qh[8] u16 (4 x 3 high index bits, 3-bit scale, delta sign)
        d = unpackHalf2x16(W[base]).x;
        dmin = -0.125 * d;
        const uint qh = wb(base, 34 + 2 * c) | (wb(base, 35 + 2 * c) << 8);
        sc0 = int(2u * ((qh >> 12) & 7u) + 1u);
        sc1 = sc0;
        m0 = (qh & 0x8000u) != 0 ? -sc0 : sc0;
        m1 = m0;
        for (uint l = 0; l < 4; l++) {
            const uint gi = wb(base, 2 + 4 * c + l) | (((qh >> (3u * l)) & 7u) << 8);
            const uint g0 = W[gb + 2 * gi], g1 = W[gb + 2 * gi + 1];
            for (uint j = 0; j < 8; j++) w[8 * l + j] = bitfieldExtract(int(j < 4 ? g0 : g1), int(8u * (j & 3u)), 8);
        }
#elif defined(T_Q2_K)
        const vec2 dd = unpackHalf2x16(W[base + 20]);
        d = dd.x;
        dmin = dd.y;
        const uint s0 = wb(base, 2 * c), s1 = wb(base, 2 * c + 1);
        sc0 = int(s0 & 15u);
        m0 = int(s0 >> 4);
        sc1 = int(s1 & 15u);
        m1 = int(s1 >> 4);
        for (uint l = 0; l < 32; l++) w[l] = int((wb(base, 16 + 32 * h + l) >> (2 * k)) & 3u);
#else /* Q3_K: 6-bit scales offset by 32 (low nibbles in bytes 0-7, top 2 bits in bytes 8-11 of the 12 at byte 96) */
        d = unpackHalf2x16(W[base + 27]).x;
        const uint j0 = 2 * c, j1 = 2 * c + 1;
        sc0 = int(((j0 < 8 ? wb(base, 96 + j0) & 15u : wb(base, 96 + j0 - 8) >> 4) |
                   (((wb(base, 104 + j0 % 4) >> (2 * (j0 / 4))) & 3u) << 4))) - 32;
        sc1 = int(((j1 < 8 ? wb(base, 96 + j1) & 15u : wb(base, 96 + j1 - 8) >> 4) |
                   (((wb(base, 104 + j1 % 4) >> (2 * (j1 / 4))) & 3u) << 4))) - 32;
        for (uint l = 0; l < 32; l++) {
            const int lo = int((wb(base, 32 + 32 * h + l) >> (2 * k)) & 3u);
            w[l] = lo - (((wb(base, l) >> (4 * h + k)) & 1u) != 0 ? 0 : 4);
        }
#endif
        for (uint t = 0; t < nt; t++) {
            const uint xr = p.x_off + (x0 + t) * p.ldx, xq = xr + nb * 17 + b * 64 + c * 8;
            int s0 = 0, s1 = 0;
            for (uint i = 0; i < 4; i++) {
                const int u0 = int(AU[xq + i]), u1 = int(AU[xq + 4 + i]);
                for (int q = 0; q < 4; q++) {
                    s0 += w[i * 4 + q] * bitfieldExtract(u0, 8 * q, 8);
                    s1 += w[16 + i * 4 + q] * bitfieldExtract(u1, 8 * q, 8);
                }
            }
            const int isum = sc0 * s0 + sc1 * s1;
            const int summ = m0 * int(AU[xr + nb + b * 16 + 2 * c]) + m1 * int(AU[xr + nb + b * 16 + 2 * c + 1]);
            const float dx = A[xr + b];
            acc[t] += (d * dx) * float(isum) - (dmin * dx) * float(summ);
        }
    }
    store_rows(acc, nt, t0, row, tid);
}
