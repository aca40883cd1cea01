/*
 * quants_lowbit.c: the scalar reference (the spec) for the low-bit weight
 * types MoE files ship in: Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4. For each, the
 * dequantizer and the dot product with the activation type ggml pairs it
 * with (Q8_K for Q2_K, Q3_K, IQ4_XS; Q8_0 for IQ4_NL and MXFP4). Pure
 * functions over caller buffers: no allocation, no state.
 *
 * Dequantizers evaluate ggml's expressions in ggml's operand order, so the
 * floats are bit-identical to dequantize_row_* (tests/unit/test_kernels_ggml.c
 * checks them against llama.cpp's own library). Dot products keep ggml's
 * integer sums exactly; only the float accumulation across blocks may differ
 * from llama.cpp's SIMD paths (as in dot_ref.c).
 */
#include "isa.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- Q2_K ---- */

void cm_ref_to_float_q2_k(const void *vx, float *y, int64_t n) {
    const cm_block_q2_k *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d), dmin = cm_f16_to_f32(x[b].dmin);
        const uint8_t *sc = x[b].scales;
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = x[b].qs + 32 * h;
            for (int k = 0; k < 4; k++) {
                for (int half = 0; half < 2; half++, sc++) {
                    const float dl = d * (*sc & 0xF), ml = dmin * (*sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * ((q[16 * half + l] >> (2 * k)) & 3) - ml;
                }
            }
        }
    }
}

/* dot = d*dy * sum_s (sc_s & 15) * sum q p  -  dmin*dy * sum_s (sc_s >> 4) * bsum_s */
void cm_ref_vec_dot_q2_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q2_k *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *sc = x[b].scales;
        const int8_t *p = y[b].qs;
        int summ = 0, isum = 0;
        for (int j = 0; j < 16; j++) summ += y[b].bsums[j] * (sc[j] >> 4);
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = x[b].qs + 32 * h;
            for (int k = 0; k < 4; k++, p += 32) {
                int lo = 0, hi = 0;
                for (int l = 0; l < 16; l++) {
                    lo += p[l] * ((q[l] >> (2 * k)) & 3);
                    hi += p[l + 16] * ((q[l + 16] >> (2 * k)) & 3);
                }
                isum += (*sc++ & 0xF) * lo;
                isum += (*sc++ & 0xF) * hi;
            }
        }
        const float dall = y[b].d * cm_f16_to_f32(x[b].d);
        const float dmin = y[b].d * cm_f16_to_f32(x[b].dmin);
        sumf += dall * isum - dmin * summ;
    }
    *s = sumf;
}

/* ---- Q3_K ---- */

/* Element e = 128h + 32k + l: low bits (qs[32h + l] >> 2k) & 3, high bit
 * 4h + k of hmask[l]; signed value low - 4 when that bit is clear. */
static inline int q3_k_value(const cm_block_q3_k *x, int h, int k, int l) {
    const int low = (x->qs[32 * h + l] >> (2 * k)) & 3;
    return low - ((x->hmask[l] >> (4 * h + k)) & 1 ? 0 : 4);
}

void cm_ref_to_float_q3_k(const void *vx, float *y, int64_t n) {
    const cm_block_q3_k *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d_all = cm_f16_to_f32(x[b].d);
        int8_t sc[16];
        cm_q3_k_scales(x[b].scales, sc);
        int is = 0;
        for (int h = 0; h < 2; h++) {
            for (int k = 0; k < 4; k++) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++) *y++ = dl * q3_k_value(&x[b], h, k, l);
                }
            }
        }
    }
}

void cm_ref_vec_dot_q3_k(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q3_k *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        int8_t sc[16];
        cm_q3_k_scales(x[b].scales, sc);
        const int8_t *p = y[b].qs;
        int isum = 0, is = 0;
        for (int h = 0; h < 2; h++) {
            for (int k = 0; k < 4; k++) {
                for (int half = 0; half < 2; half++, p += 16) {
                    int part = 0;
                    for (int l = 0; l < 16; l++) part += p[l] * q3_k_value(&x[b], h, k, 16 * half + l);
                    isum += sc[is++] * part;
                }
            }
        }
        sumf += (cm_f16_to_f32(x[b].d) * y[b].d) * isum;
    }
    *s = sumf;
}

/* ---- IQ4_NL, IQ4_XS ---- */

void cm_ref_to_float_iq4_nl(const void *vx, float *y, int64_t n) {
    const cm_block_iq4_nl *x = vx;
    for (int64_t b = 0; b < n / CM_QK4_NL; b++, y += CM_QK4_NL) {
        const float d = cm_f16_to_f32(x[b].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * cm_kvalues_iq4nl[x[b].qs[j] & 0xF];
            y[j + 16] = d * cm_kvalues_iq4nl[x[b].qs[j] >> 4];
        }
    }
}

void cm_ref_vec_dot_iq4_nl(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq4_nl *x = vx;
    const cm_block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK4_NL; b++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += y[b].qs[j] * cm_kvalues_iq4nl[x[b].qs[j] & 0xF];
            sumi += y[b].qs[j + 16] * cm_kvalues_iq4nl[x[b].qs[j] >> 4];
        }
        sumf += (cm_f16_to_f32(y[b].d) * cm_f16_to_f32(x[b].d)) * sumi;
    }
    *s = sumf;
}

/* Sub-block i's 6-bit scale minus 32. */
static inline int iq4_xs_scale(const cm_block_iq4_xs *x, int i) {
    const int low = (x->scales_l[i / 2] >> (4 * (i % 2))) & 0xF;
    const int top = (x->scales_h >> (2 * i)) & 3;
    return (low | (top << 4)) - 32;
}

void cm_ref_to_float_iq4_xs(const void *vx, float *y, int64_t n) {
    const cm_block_iq4_xs *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d);
        const uint8_t *qs = x[b].qs;
        for (int i = 0; i < 8; i++, y += 32, qs += 16) {
            const float dl = d * iq4_xs_scale(&x[b], i);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * cm_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * cm_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* One float term per super-block: the scaled sub-block sums are integers. */
void cm_ref_vec_dot_iq4_xs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq4_xs *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const uint8_t *qs = x[b].qs;
        const int8_t *p = y[b].qs;
        int isum = 0;
        for (int i = 0; i < 8; i++, qs += 16, p += 32) {
            int part = 0;
            for (int j = 0; j < 16; j++)
                part += p[j] * cm_kvalues_iq4nl[qs[j] & 0xF] + p[j + 16] * cm_kvalues_iq4nl[qs[j] >> 4];
            isum += iq4_xs_scale(&x[b], i) * part;
        }
        sumf += (cm_f16_to_f32(x[b].d) * y[b].d) * isum;
    }
    *s = sumf;
}

/* ---- MXFP4 ---- */

void cm_ref_to_float_mxfp4(const void *vx, float *y, int64_t n) {
    const cm_block_mxfp4 *x = vx;
    for (int64_t b = 0; b < n / CM_QK_MXFP4; b++, y += CM_QK_MXFP4) {
        const float d = cm_e8m0_to_f32_half(x[b].e);
        for (int j = 0; j < 16; j++) {
            y[j] = cm_kvalues_mxfp4[x[b].qs[j] & 0xF] * d;
            y[j + 16] = cm_kvalues_mxfp4[x[b].qs[j] >> 4] * d;
        }
    }
}

void cm_ref_vec_dot_mxfp4(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_mxfp4 *x = vx;
    const cm_block_q8_0 *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_MXFP4; b++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += y[b].qs[j] * cm_kvalues_mxfp4[x[b].qs[j] & 0xF];
            sumi += y[b].qs[j + 16] * cm_kvalues_mxfp4[x[b].qs[j] >> 4];
        }
        sumf += (cm_f16_to_f32(y[b].d) * cm_e8m0_to_f32_half(x[b].e)) * sumi;
    }
    *s = sumf;
}

void cm_kernels_fill_lowbit_ref(cm_kernels *k) {
#define REG(T, t)                                   \
    k->to_float[CM_TYPE_##T] = cm_ref_to_float_##t; \
    k->vec_dot[CM_TYPE_##T] = cm_ref_vec_dot_##t
    REG(Q2_K, q2_k);
    REG(Q3_K, q3_k);
    REG(IQ4_NL, iq4_nl);
    REG(IQ4_XS, iq4_xs);
    REG(MXFP4, mxfp4);
#undef REG
    cm_kernels_fill_iq_ref(k);
}
