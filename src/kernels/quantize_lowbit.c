/*
 * quantize_lowbit.c: weight quantizers for Q2_K, Q3_K, IQ4_NL, IQ4_XS and
 * MXFP4, reproducing what ggml_quantize_chunk writes without an importance
 * matrix (what llama-quantize and gguf-py produce from the same floats), so
 * synth models of these types are llama.cpp's bytes. Used by synth and
 * tests through cm_quantize_rows, never in the token loop. No allocation.
 *
 * Which ggml routine that is matters for byte equality: Q2_K and Q3_K use
 * the *_ref quantizers; IQ4_NL and IQ4_XS use quantize_iq4_nl/_xs with no
 * weights, i.e. the x^2-weighted search over 15 candidate scales (ntry 7),
 * not quantize_row_iq4_nl_ref's ntry -1; MXFP4 uses quantize_row_mxfp4_ref.
 * Every float expression keeps ggml's operand order (FP contraction off).
 */
#include "isa.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Pack 2-bit levels L[256] the Q2_K/Q3_K way: per 128 elements, byte l holds
 * elements l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int h = 0; h < 2; h++, L += 128, qs += 32)
        for (int l = 0; l < 32; l++) qs[l] = (uint8_t)(L[l] | (L[l + 32] << 2) | (L[l + 64] << 4) | (L[l + 96] << 6));
}

/* ---- Q2_K ---- */

static void q2_k_row(const float *x, void *vy, int64_t n) {
    cm_block_q2_k *y = vy;
    uint8_t L[CM_QK_K];
    float w[16], mins[16], scales[16];
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = cm_fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        /* 4-bit scales (low nibble) and mins (high nibble) against the largest. */
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; j++) y[b].scales[j] = (uint8_t)cm_nearest_int(iscale * scales[j]);
            y[b].d = cm_f32_to_f16(max_scale / 15.f);
        } else {
            memset(y[b].scales, 0, sizeof y[b].scales);
            y[b].d = cm_f32_to_f16(0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; j++) y[b].scales[j] |= (uint8_t)(cm_nearest_int(iscale * mins[j]) << 4);
            y[b].dmin = cm_f32_to_f16(max_min / 15.f);
        } else {
            y[b].dmin = cm_f32_to_f16(0.f);
        }
        /* Requantize against the stored scales. */
        for (int j = 0; j < 16; j++) {
            const float d = cm_f16_to_f32(y[b].d) * (y[b].scales[j] & 0xF);
            if (!d) continue;
            const float dm = cm_f16_to_f32(y[b].dmin) * (y[b].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)imax(0, imin(3, cm_nearest_int((x[16 * j + l] + dm) / d)));
        }
        pack_2bit(L, y[b].qs);
    }
}

/* ---- Q3_K ---- */

/* ggml's make_q3_quants with do_rmse: x ~ scale * l, l in -nmax..nmax-1,
 * weights x^2; start from the grid through the signed extreme, then up to 5
 * passes that move single levels when that raises sumlx^2/suml2. Stores
 * l + nmax in L; returns the scale. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, cm_nearest_int(iscale * x[i])));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * L[i] * L[i];
            const int nl = imax(-nmax, imin(nmax - 1, cm_nearest_int(x[i] * sl2 / slx)));
            if (nl == L[i]) continue;
            slx += w * x[i] * nl;
            sl2 += w * nl * nl;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void q3_k_row(const float *x, void *vy, int64_t n) {
    cm_block_q3_k *y = vy;
    int8_t L[CM_QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(y[b].scales, 0, 12);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = imax(-32, imin(31, cm_nearest_int(iscale * scales[j]))) + 32; /* 0..63 */
                if (j < 8) y[b].scales[j] = (uint8_t)(l & 0xF);
                else y[b].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[b].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[b].d = cm_f32_to_f16(1 / iscale);
        } else {
            y[b].d = cm_f32_to_f16(0.f);
        }
        /* Requantize against the stored scales; L becomes 0..7. */
        int8_t sc[16];
        cm_q3_k_scales(y[b].scales, sc);
        for (int j = 0; j < 16; j++) {
            const float d = cm_f16_to_f32(y[b].d) * sc[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(imax(-4, imin(3, cm_nearest_int(x[16 * j + l] / d))) + 4);
        }
        /* High bit of element e goes to bit e/32 of hmask[e%32]. */
        uint8_t low[CM_QK_K];
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int e = 0; e < CM_QK_K; e++) {
            int v = L[e];
            if (v > 3) {
                y[b].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                v -= 4;
            }
            low[e] = (uint8_t)v;
        }
        pack_2bit(low, y[b].qs);
    }
}

/* ---- IQ4_NL, IQ4_XS ---- */

/* ggml's best_index_int8: the index of the table value nearest to v (ties
 * to the upper one), by bisection over the sorted table. */
static int nearest_kvalue(const int8_t *val, float v) {
    if (v <= val[0]) return 0;
    if (v >= val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < val[mid]) hi = mid;
        else lo = mid;
    }
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

/* The scale of one 32-element sub-block over the IQ4 table, weights x^2:
 * start from the grid that maps the signed extreme to the table's end, then
 * try 15 grids (itry - 127)/max, keeping the best least-squares scale. L gets
 * the levels of the starting grid. Returns 0 for an all-(near)-zero block. */
static float iq4_block_scale(const float *x, uint8_t *L) {
    const int8_t *val = cm_kvalues_iq4nl;
    float w[32], amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        w[j] = x[j] * x[j];
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < GROUP_MAX_EPS) return 0;
    float d = -max / val[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        const int l = nearest_kvalue(val, id * x[j]);
        L[j] = (uint8_t)l;
        const float q = val[l];
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -7; itry <= 7; itry++) {
        id = (float)(itry + val[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = val[nearest_kvalue(val, id * x[j])];
            sumqx += w[j] * q * x[j];
            sumq2 += w[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 levels into 16 bytes: element j low nibble, j+16 high nibble. */
static void pack_nibbles32(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

static void iq4_nl_row(const float *x, void *vy, int64_t n) {
    cm_block_iq4_nl *y = vy;
    uint8_t L[32];
    for (int64_t b = 0; b < n / CM_QK4_NL; b++, x += CM_QK4_NL) {
        const float d = iq4_block_scale(x, L);
        y[b].d = cm_f32_to_f16(d);
        const float id = d ? 1 / d : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_kvalue(cm_kvalues_iq4nl, id * x[j]);
        pack_nibbles32(L, y[b].qs);
    }
}

static void iq4_xs_row(const float *x, void *vy, int64_t n) {
    cm_block_iq4_xs *y = vy;
    uint8_t L[32];
    float scales[8];
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        float max_scale = 0, amax_scale = 0;
        for (int i = 0; i < 8; i++) {
            scales[i] = iq4_block_scale(x + 32 * i, L);
            if (fabsf(scales[i]) > amax_scale) {
                amax_scale = fabsf(scales[i]);
                max_scale = scales[i];
            }
        }
        /* 6-bit sub-block scales l - 32 against d = -max/32 (d itself, not
         * its fp16 rounding, sets the levels, as in ggml). */
        const float d = -max_scale / 32;
        y[b].d = cm_f32_to_f16(d);
        y[b].scales_h = 0;
        const float id = d ? 1 / d : 0.f;
        for (int i = 0; i < 8; i++) {
            int l = imax(-32, imin(31, cm_nearest_int(id * scales[i])));
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_kvalue(cm_kvalues_iq4nl, idl * x[32 * i + j]);
            pack_nibbles32(L, y[b].qs + 16 * i);
            l += 32;
            if (i % 2 == 0) y[b].scales_l[i / 2] = (uint8_t)(l & 0xF);
            else y[b].scales_l[i / 2] |= (uint8_t)((l & 0xF) << 4);
            y[b].scales_h = (uint16_t)(y[b].scales_h | ((l >> 4) << (2 * i)));
        }
    }
}

/* ---- MXFP4 ---- */

/* The E2M1 code whose (doubled) value times e is nearest to v; the first on
 * ties, so +0 (code 0) wins over -0 (code 8). */
static int nearest_fp4(float v, float e) {
    int best = 0;
    float best_err = fabsf(cm_kvalues_mxfp4[0] * e - v);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(cm_kvalues_mxfp4[i] * e - v);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

/* The shared exponent puts the block's largest magnitude in E2M1's top
 * binade: e = floor(log2(amax)) - 2 + 127 (ggml's choice, which saturates
 * values in [6, 8) * 2^(e-127) to 6). */
static void mxfp4_row(const float *x, void *vy, int64_t n) {
    cm_block_mxfp4 *y = vy;
    for (int64_t b = 0; b < n / CM_QK_MXFP4; b++, x += CM_QK_MXFP4) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        int e = 0;
        if (amax > 0) {
            /* ggml casts the float to uint8_t; out of 0..255 that is
             * undefined, so clamp (only |x| < 2^-125 or >= 2^129 reach it). */
            const float ef = floorf(log2f(amax)) - 2 + 127;
            e = ef < 0 ? 0 : ef > 255 ? 255 : (int)ef;
        }
        y[b].e = (uint8_t)e;
        const float d = cm_e8m0_to_f32_half(y[b].e);
        for (int j = 0; j < 16; j++) y[b].qs[j] = (uint8_t)(nearest_fp4(x[j], d) | (nearest_fp4(x[j + 16], d) << 4));
    }
}

cm_quantize_row_fn cm_quantize_row_lowbit(enum cm_type t) {
    switch (t) {
    case CM_TYPE_Q2_K: return q2_k_row;
    case CM_TYPE_Q3_K: return q3_k_row;
    case CM_TYPE_IQ4_NL: return iq4_nl_row;
    case CM_TYPE_IQ4_XS: return iq4_xs_row;
    case CM_TYPE_MXFP4: return mxfp4_row;
    default: return NULL;
    }
}
