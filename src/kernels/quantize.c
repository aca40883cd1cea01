/*
 * quantize.c: weight quantizers (cm_quantize_rows), ggml's reference
 * algorithms without an importance matrix, so that a file we write holds the
 * bytes llama-quantize (or gguf-py) would write from the same floats. Used by
 * synth and tests, never in the token loop. No allocation; all scratch is on
 * the stack and sized by the block.
 *
 * Rounding matters for byte equality, and each format keeps ggml's own:
 * Q4_0/Q4_1/Q5_0/Q5_1 truncate (int8_t)(v + 0.5-offset) after scaling by
 * 1/d; Q8_0 scales by 1/d and uses roundf (ties away from zero; this differs
 * from the x86 activation quantizer in quants_ref.c on purpose); K-quants
 * use nearest_int (ties to even) and ggml's scale searches:
 * Q4_K/Q5_K fit scale and min per 32 values by weighted least squares over a
 * range of candidate scales (make_qkx2_quants), Q6_K fits a signed scale per
 * 16 values (make_qx_quants, weights x^2).
 */
#include "isa.h"

#include <float.h>
#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* The signed value of largest magnitude in x[0..n) (the first one on ties). */
static float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

/* ---- 32-element block formats ---- */

/* Q4_0: d = -max/8 where max is the signed extreme, so that extreme maps to
 * exactly -8 and the other side gets 7 steps; values q = x/d + 8 in 0..15. */
static void q4_0_row(const float *x, void *vy, int64_t n) {
    cm_block_q4_0 *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax;
        const float max = signed_absmax(x, 32, &amax);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = cm_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            const float v0 = x[j] * id, v1 = x[j + 16] * id;
            const int q0 = imin(15, (int8_t)(v0 + 8.5f)), q1 = imin(15, (int8_t)(v1 + 8.5f));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q4_1: the block's [min, max] cut into 15 steps; q = (x - min)/d in 0..15. */
static void q4_1_row(const float *x, void *vy, int64_t n) {
    cm_block_q4_1 *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = cm_f32_to_f16(d);
        y[b].m = cm_f32_to_f16(min);
        for (int j = 0; j < 16; j++) {
            const float v0 = (x[j] - min) * id, v1 = (x[j + 16] - min) * id;
            const int q0 = imin(15, (int8_t)(v0 + 0.5f)), q1 = imin(15, (int8_t)(v1 + 0.5f));
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static inline void wr_qh(uint8_t qh[4], uint32_t v) {
    qh[0] = (uint8_t)v;
    qh[1] = (uint8_t)(v >> 8);
    qh[2] = (uint8_t)(v >> 16);
    qh[3] = (uint8_t)(v >> 24);
}

/* Q5_0: as Q4_0 with 16 levels per side; the 5th bits go to qh. */
static void q5_0_row(const float *x, void *vy, int64_t n) {
    cm_block_q5_0 *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax;
        const float max = signed_absmax(x, 32, &amax);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = cm_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const float v0 = x[j] * id, v1 = x[j + 16] * id;
            const uint32_t q0 = (uint32_t)imin(31, (int8_t)(v0 + 16.5f));
            const uint32_t q1 = (uint32_t)imin(31, (int8_t)(v1 + 16.5f));
            y[b].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= ((q0 >> 4) & 1) << j;
            qh |= ((q1 >> 4) & 1) << (j + 16);
        }
        wr_qh(y[b].qh, qh);
    }
}

/* Q5_1: as Q4_1 with 31 steps. ggml does not clamp here: (max-min)/d is 31
 * up to rounding, so (uint8_t)(v + 0.5) stays in 0..31. */
static void q5_1_row(const float *x, void *vy, int64_t n) {
    cm_block_q5_1 *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = cm_f32_to_f16(d);
        y[b].m = cm_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const float v0 = (x[j] - min) * id, v1 = (x[j + 16] - min) * id;
            const uint32_t q0 = (uint8_t)(v0 + 0.5f), q1 = (uint8_t)(v1 + 0.5f);
            y[b].qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= ((q0 >> 4) & 1) << j;
            qh |= ((q1 >> 4) & 1) << (j + 16);
        }
        wr_qh(y[b].qh, qh);
    }
}

/* Q8_0 weights: d = amax/127, q = roundf(x * (1/d)). */
static void q8_0_row(const float *x, void *vy, int64_t n) {
    cm_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = cm_f32_to_f16(d);
        for (int j = 0; j < 32; j++) y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ---- K-quant scale searches ---- */

/* Fit x ~ scale * L + min with L in 0..nmax (min <= 0), minimising the
 * weighted squared error: start from the plain min/max grid, then try nstep+1
 * candidate grids iscale = (nmax + rmin + rdelta*is)/(max - min), each
 * followed by the closed-form least-squares scale and min for its levels;
 * keep the best. Returns the scale and stores -min in *neg_min. use_mad
 * measures absolute instead of squared error (Q2_K). */
float cm_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, float rmin,
                       float rdelta, int nstep, bool use_mad) {
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        const int l = cm_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        const float diff = scale * L[i] + min - x[i];
        best_err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(0, imin(nmax, cm_nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float diff = this_scale * Laux[i] + this_min - x[i];
            err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
        }
        if (err < best_err) {
            memcpy(L, Laux, (size_t)n);
            best_err = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

/* Fit x ~ scale * l with l in -nmax..nmax-1 (stored as l + nmax), weights
 * x^2: the grid through the signed extreme, then 18 nearby grids
 * -(nmax + 0.1*is)/max, keeping the one with the largest sumlx^2/suml2
 * (= the smallest weighted error at its least-squares scale). */
static float fit_scale_signed(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = imax(-nmax, imin(nmax - 1, cm_nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = imax(-nmax, imin(nmax - 1, cm_nearest_int(iscale * x[i])));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, cm_nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q4_K and Q5_K share everything but the level count (15 or 31), the search
 * grid and how levels are packed. Fills d, dmin, scales and L[256]. */
static void k4_scales_and_levels(const float *x, int nmax, float rmin, int nstep, cm_f16 *d_out, cm_f16 *dmin_out,
                                 uint8_t scales_out[12], uint8_t L[CM_QK_K]) {
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int s = 0; s < 8; s++) {
        const float *xs = x + 32 * s;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[s] = cm_fit_scale_min(32, nmax, xs, w, L + 32 * s, &mins[s], rmin, 0.1f, nstep, false);
        if (scales[s] > max_scale) max_scale = scales[s];
        if (mins[s] > max_min) max_min = mins[s];
    }
    /* 6-bit scales and mins relative to the block's largest. */
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales_out, 0, 12);
    for (int s = 0; s < 8; s++) {
        const uint8_t ls = (uint8_t)imin(63, (uint8_t)cm_nearest_int(inv_scale * scales[s]));
        const uint8_t lm = (uint8_t)imin(63, (uint8_t)cm_nearest_int(inv_min * mins[s]));
        if (s < 4) {
            scales_out[s] = ls;
            scales_out[s + 4] = lm;
        } else {
            scales_out[s + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales_out[s - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[s] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = cm_f32_to_f16(max_scale / 63.f);
    *dmin_out = cm_f32_to_f16(max_min / 63.f);
    /* Requantize against the scales as stored (fp16 and 6-bit). */
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        cm_k4_scale_min(s, scales_out, &sc, &m);
        const float d = cm_f16_to_f32(*d_out) * sc;
        if (!d) continue;
        const float dm = cm_f16_to_f32(*dmin_out) * m;
        for (int l = 0; l < 32; l++)
            L[32 * s + l] = (uint8_t)imax(0, imin(nmax, cm_nearest_int((x[32 * s + l] + dm) / d)));
    }
}

static void q4_k_row(const float *x, void *vy, int64_t n) {
    cm_block_q4_k *y = vy;
    uint8_t L[CM_QK_K];
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        k4_scales_and_levels(x, 15, -1.f, 20, &y[b].d, &y[b].dmin, y[b].scales, L);
        for (int c = 0; c < 4; c++) /* 64 elements per 32 bytes: low nibble, high nibble */
            for (int l = 0; l < 32; l++) y[b].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

static void q5_k_row(const float *x, void *vy, int64_t n) {
    cm_block_q5_k *y = vy;
    uint8_t L[CM_QK_K];
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        k4_scales_and_levels(x, 31, -0.5f, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
                y[b].qh[l] |= (uint8_t)(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
                y[b].qs[32 * c + l] = (uint8_t)((l1 & 0xF) | ((l2 & 0xF) << 4));
            }
        }
    }
}

static void q6_k_row(const float *x, void *vy, int64_t n) {
    cm_block_q6_k *y = vy;
    int8_t L[CM_QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int s = 0; s < 16; s++) {
            scales[s] = fit_scale_signed(16, 32, x + 16 * s, L + 16 * s);
            if (fabsf(scales[s]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[s]);
                max_scale = scales[s];
            }
        }
        memset(&y[b], 0, sizeof y[b]);
        if (max_abs_scale < GROUP_MAX_EPS) continue; /* all (near) zero: d = 0 */
        const float iscale = -128.f / max_scale;
        y[b].d = cm_f32_to_f16(1 / iscale);
        for (int s = 0; s < 16; s++) y[b].scales[s] = (int8_t)imin(127, cm_nearest_int(iscale * scales[s]));
        for (int s = 0; s < 16; s++) {
            const float d = cm_f16_to_f32(y[b].d) * y[b].scales[s];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (int8_t)(32 + imax(-32, imin(31, cm_nearest_int(x[16 * s + l] / d))));
        }
        /* Pack (layout in cm_ref_to_float_q6_k). */
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            const int8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

static void f32_row(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

size_t cm_quantize_rows(enum cm_type t, const float *src, void *dst, int64_t nrows, int64_t n_per_row) {
    void (*row)(const float *, void *, int64_t) = NULL;
    switch (t) {
    case CM_TYPE_F32: row = f32_row; break;
    case CM_TYPE_F16: row = cm_ref_from_float_f16; break;
    case CM_TYPE_BF16: row = cm_ref_from_float_bf16; break;
    case CM_TYPE_Q4_0: row = q4_0_row; break;
    case CM_TYPE_Q4_1: row = q4_1_row; break;
    case CM_TYPE_Q5_0: row = q5_0_row; break;
    case CM_TYPE_Q5_1: row = q5_1_row; break;
    case CM_TYPE_Q8_0: row = q8_0_row; break;
    case CM_TYPE_Q4_K: row = q4_k_row; break;
    case CM_TYPE_Q5_K: row = q5_k_row; break;
    case CM_TYPE_Q6_K: row = q6_k_row; break;
    default: row = cm_quantize_row_lowbit(t); break;
    }
    if (!row) return 0;
    const size_t row_size = cm_row_size(t, n_per_row);
    if (row_size == 0 || nrows < 0) return 0;
    for (int64_t r = 0; r < nrows; r++) row(src + r * n_per_row, (char *)dst + (size_t)r * row_size, n_per_row);
    return (size_t)nrows * row_size;
}
