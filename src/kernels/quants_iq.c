/*
 * quants_iq.c: the scalar reference (the spec) for the grid-based IQ types
 * IQ2_XXS, IQ3_XXS and IQ1_S: dequantizers and dot products with Q8_K.
 * Pure functions over caller buffers: no allocation, no state.
 *
 * Dequantizers evaluate ggml's expressions in ggml's operand order (bit-exact
 * with dequantize_row_*, checked against llama.cpp's library on random
 * blocks). Dot products keep ggml's integer sums (per 32 elements, times the
 * odd scale 2s + 1) and its final float expression. There is no quantizer:
 * ggml makes these types only with an importance matrix. Multi-byte fields
 * are read as little-endian bytes, so the code does not depend on the host.
 */
#include "isa.h"

#include "base/base.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline int grid8(uint64_t g, int j) { return (int)((g >> (8 * j)) & 0xFF); }

/* ---- IQ2_XXS: 8 bytes per 32 elements: 4 indices, then signs + scale ---- */

void cm_ref_to_float_iq2_xxs(const void *vx, float *y, int64_t n) {
    const uint8_t *blk = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++, blk += sizeof(cm_block_iq2_xxs)) {
        const float d = cm_f16_to_f32(cm_rd_u16(blk));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = blk + 2 + 8 * ib;
            const uint32_t aux = rd32(q + 4);
            const float db = d * (0.5f + (aux >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8) {
                const uint64_t g = cm_iq2xxs_grid[q[l]];
                const uint8_t signs = cm_iq_signs((aux >> (7 * l)) & 127);
                for (int j = 0; j < 8; j++) y[j] = db * grid8(g, j) * (signs >> j & 1 ? -1.f : 1.f);
            }
        }
    }
}

void cm_ref_vec_dot_iq2_xxs(int64_t n, float *s, const void *vx, const void *vy) {
    const uint8_t *blk = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0.f;
    for (int64_t b = 0; b < n / CM_QK_K; b++, blk += sizeof(cm_block_iq2_xxs)) {
        const float d = cm_f16_to_f32(cm_rd_u16(blk)) * y[b].d;
        const int8_t *p = y[b].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = blk + 2 + 8 * ib;
            const uint32_t aux = rd32(q + 4);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++, p += 8) {
                const uint64_t g = cm_iq2xxs_grid[q[l]];
                const uint8_t signs = cm_iq_signs((aux >> (7 * l)) & 127);
                for (int j = 0; j < 8; j++) sumi += grid8(g, j) * p[j] * (signs >> j & 1 ? -1 : 1);
            }
            bsum += sumi * (int32_t)(2 * (aux >> 28) + 1);
        }
        sumf += d * bsum;
    }
    *s = 0.125f * sumf;
}

/* ---- IQ3_XXS: 64 index bytes, then 8 u32 of signs + scale ---- */

void cm_ref_to_float_iq3_xxs(const void *vx, float *y, int64_t n) {
    const cm_block_iq3_xxs *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d);
        const uint8_t *q = x[b].qs;
        for (int ib = 0; ib < 8; ib++, q += 8) {
            const uint32_t aux = rd32(x[b].qs + CM_QK_K / 4 + 4 * ib);
            const float db = d * (0.5f + (aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8) {
                const uint8_t signs = cm_iq_signs((aux >> (7 * l)) & 127);
                const uint32_t g1 = cm_iq3xxs_grid[q[2 * l]], g2 = cm_iq3xxs_grid[q[2 * l + 1]];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * (int)((g1 >> (8 * j)) & 0xFF) * (signs >> j & 1 ? -1.f : 1.f);
                    y[j + 4] = db * (int)((g2 >> (8 * j)) & 0xFF) * (signs >> (j + 4) & 1 ? -1.f : 1.f);
                }
            }
        }
    }
}

void cm_ref_vec_dot_iq3_xxs(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq3_xxs *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0.f;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d) * y[b].d;
        const uint8_t *q = x[b].qs;
        const int8_t *p = y[b].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < 8; ib++, q += 8) {
            const uint32_t aux = rd32(x[b].qs + CM_QK_K / 4 + 4 * ib);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++, p += 8) {
                const uint8_t signs = cm_iq_signs((aux >> (7 * l)) & 127);
                const uint32_t g1 = cm_iq3xxs_grid[q[2 * l]], g2 = cm_iq3xxs_grid[q[2 * l + 1]];
                for (int j = 0; j < 4; j++) {
                    sumi += (int)((g1 >> (8 * j)) & 0xFF) * p[j] * (signs >> j & 1 ? -1 : 1);
                    sumi += (int)((g2 >> (8 * j)) & 0xFF) * p[j + 4] * (signs >> (j + 4) & 1 ? -1 : 1);
                }
            }
            bsum += sumi * (int32_t)(2 * (aux >> 28) + 1);
        }
        sumf += d * bsum;
    }
    *s = 0.25f * sumf;
}

/* ---- IQ1_S: 11-bit indices into a {-1,0,1} grid, shifted by +-1/8 ---- */

#define IQ1S_DELTA 0.125f

static inline int iq1s_point(const cm_block_iq1_s *x, int ib, int l, int j) {
    const int idx = x->qs[4 * ib + l] | (((x->qh[ib] >> (3 * l)) & 7) << 8);
    return (int8_t)((cm_iq1s_grid[idx] >> (8 * j)) & 0xFF);
}

void cm_ref_to_float_iq1_s(const void *vx, float *y, int64_t n) {
    const cm_block_iq1_s *x = vx;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const float d = cm_f16_to_f32(x[b].d);
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = x[b].qh[ib];
            const float dl = d * (2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
            for (int l = 0; l < 4; l++, y += 8)
                for (int j = 0; j < 8; j++) y[j] = dl * (iq1s_point(&x[b], ib, l, j) + delta);
        }
    }
}

void cm_ref_vec_dot_iq1_s(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_iq1_s *x = vx;
    const cm_block_q8_k *y = vy;
    float sumf = 0;
    for (int64_t b = 0; b < n / CM_QK_K; b++) {
        const int8_t *p = y[b].qs;
        int sumi = 0, sumi1 = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = x[b].qh[ib];
            const int ls = 2 * ((qh >> 12) & 7) + 1;
            const int delta = qh & 0x8000 ? -1 : 1;
            int lsum = 0;
            for (int l = 0; l < 4; l++, p += 8)
                for (int j = 0; j < 8; j++) lsum += p[j] * iq1s_point(&x[b], ib, l, j);
            sumi += ls * lsum;
            sumi1 += ls * delta * (y[b].bsums[2 * ib] + y[b].bsums[2 * ib + 1]);
        }
        sumf += cm_f16_to_f32(x[b].d) * y[b].d * (sumi + IQ1S_DELTA * sumi1);
    }
    *s = sumf;
}

void cm_kernels_fill_iq_ref(cm_kernels *k) {
#define REG(T, t)                                   \
    k->to_float[CM_TYPE_##T] = cm_ref_to_float_##t; \
    k->vec_dot[CM_TYPE_##T] = cm_ref_vec_dot_##t
    REG(IQ2_XXS, iq2_xxs);
    REG(IQ3_XXS, iq3_xxs);
    REG(IQ1_S, iq1_s);
#undef REG
}
