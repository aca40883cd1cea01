/*
 * tiles.h: the ISA-neutral half of the tile kernels, shared by x86_tiles.h
 * (AVX2 and AVX-512 builds), kernels_avx512.c and kernels_neon.c. Each of
 * those includes it once, under its own ISA flags, and supplies the
 * ISA's micro-kernels: a tile_NAME(n_blocks, x_row, y_rows, T, out) per
 * type, which dots one weight row with T <= TMAX activation rows, and for
 * the float types the vector loads and operations CM_TILE_FLOAT takes.
 * What is here is the blocking around the micro-kernels, written once:
 * vec_dot is the tile with T = 1, and gemm walks RB weight rows x TMAX
 * tokens at a time through the same tile, so every (row, token) of a gemm
 * gets vec_dot's bits (kernels.h). Nothing here names an instruction.
 * Never include it from anything but an ISA file.
 */
#ifndef CM_KERNELS_TILES_H
#define CM_KERNELS_TILES_H

#include "isa.h"

#define AI static inline __attribute__((always_inline))
#define TMAX 4 /* tokens per gemm tile */
#define RB 32  /* weight rows per gemm cache block */

/* The ISA file defines f16f (its fp16 -> f32 conversion). */
AI float f16f(cm_f16 h);

/* One element of a float row: the tails of the float tiles. */
AI float sc_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }
AI float sc_f16(const void *p, int64_t i) { return f16f(((const cm_f16 *)p)[i]); }
AI float sc_bf16(const void *p, int64_t i) { return cm_bf16_to_f32(((const cm_bf16 *)p)[i]); }

/* A float tile TILE(n, x, yv, T, out): 2 W elements per step (vectors VF of
 * W floats loaded by LD, made by ZERO), two accumulators per token updated
 * with FMA(acc, a, b) = acc + a * b, folded by HSUM2(a0, a1) = the sum of
 * both vectors' lanes; the tail goes element by element through SC. */
#define CM_TILE_FLOAT(TILE, LD, SC, VF, W, ZERO, FMA, HSUM2)                           \
    AI void TILE(int64_t n, const void *x, const void *const *yv, int T, float *out) { \
        VF a0[TMAX], a1[TMAX];                                                         \
        for (int t = 0; t < T; t++) a0[t] = a1[t] = ZERO;                              \
        int64_t i = 0;                                                                 \
        for (; i + 2 * (W) <= n; i += 2 * (W)) {                                       \
            const VF x0 = LD(x, i), x1 = LD(x, i + (W));                               \
            for (int t = 0; t < T; t++) {                                              \
                a0[t] = FMA(a0[t], x0, LD(yv[t], i));                                  \
                a1[t] = FMA(a1[t], x1, LD(yv[t], i + (W)));                            \
            }                                                                          \
        }                                                                              \
        for (int t = 0; t < T; t++) {                                                  \
            float s = HSUM2(a0[t], a1[t]);                                             \
            for (int64_t k = i; k < n; k++) s += SC(x, k) * SC(yv[t], k);              \
            out[t] = s;                                                                \
        }                                                                              \
    }

/* vec_dot_NAME and gemm_NAME around tile_NAME (weight blocks XB, activation
 * blocks YB of BLK elements each). */
#define VEC_DOT(NAME, XB, YB, BLK)                                                                               \
    static void vec_dot_##NAME(int64_t n, float *s, const void *x, const void *y) {                              \
        const YB *yv[1] = {(const YB *)y};                                                                       \
        tile_##NAME(n / (BLK), (const XB *)x, yv, 1, s);                                                         \
    }                                                                                                            \
    static void gemm_##NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, \
                            int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {                                \
        /* RB rows at a time (a few hundred KB: stays in L2) against each group */                               \
        /* of TMAX tokens (stays in L1), so neither side streams from memory twice */                            \
        for (int64_t i0 = r0; i0 < r1; i0 += RB) {                                                               \
            const int64_t i1 = r1 - i0 < RB ? r1 : i0 + RB;                                                      \
            for (int64_t j = 0; j < n_tok; j += TMAX) {                                                          \
                const YB *yv[TMAX];                                                                              \
                const int T = n_tok - j < TMAX ? (int)(n_tok - j) : TMAX;                                        \
                for (int t = 0; t < T; t++)                                                                      \
                    yv[t] = (const YB *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);            \
                for (int64_t i = i0; i < i1; i++) {                                                              \
                    const XB *wr = (const XB *)(const void *)((const char *)w + (size_t)i * w_stride);           \
                    float out[TMAX];                                                                             \
                    switch (T) { /* constant T lets the compiler keep the tile in registers */                   \
                    case 4: tile_##NAME(k / (BLK), wr, yv, 4, out); break;                                       \
                    case 3: tile_##NAME(k / (BLK), wr, yv, 3, out); break;                                       \
                    case 2: tile_##NAME(k / (BLK), wr, yv, 2, out); break;                                       \
                    default: tile_##NAME(k / (BLK), wr, yv, 1, out); break;                                      \
                    }                                                                                            \
                    for (int t = 0; t < T; t++) y[(j + t) * ldy + i] = out[t];                                   \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }

/* vec_dot and gemm of every type with a tile in every ISA file. */
#define CM_VEC_DOT_TYPES()                                \
    VEC_DOT(q4_0, cm_block_q4_0, cm_block_q8_0, CM_QK4_0) \
    VEC_DOT(q4_1, cm_block_q4_1, cm_block_q8_1, CM_QK4_1) \
    VEC_DOT(q5_0, cm_block_q5_0, cm_block_q8_0, CM_QK5_0) \
    VEC_DOT(q5_1, cm_block_q5_1, cm_block_q8_1, CM_QK5_1) \
    VEC_DOT(q8_0, cm_block_q8_0, cm_block_q8_0, CM_QK8_0) \
    VEC_DOT(q4_k, cm_block_q4_k, cm_block_q8_k, CM_QK_K)  \
    VEC_DOT(q5_k, cm_block_q5_k, cm_block_q8_k, CM_QK_K)  \
    VEC_DOT(q6_k, cm_block_q6_k, cm_block_q8_k, CM_QK_K)  \
    VEC_DOT(f32, void, void, 1)                           \
    VEC_DOT(f16, void, void, 1)                           \
    VEC_DOT(bf16, void, void, 1)

/* Put into table k what CM_VEC_DOT_TYPES made and the activation
 * converters every ISA file defines (from_float_q8_0, _q8_1, _q8_k, _f16). */
#define CM_TILES_FILL(k)                                 \
    do {                                                 \
        CM_TILES_SET(k, CM_TYPE_Q4_0, q4_0);             \
        CM_TILES_SET(k, CM_TYPE_Q4_1, q4_1);             \
        CM_TILES_SET(k, CM_TYPE_Q5_0, q5_0);             \
        CM_TILES_SET(k, CM_TYPE_Q5_1, q5_1);             \
        CM_TILES_SET(k, CM_TYPE_Q8_0, q8_0);             \
        CM_TILES_SET(k, CM_TYPE_Q4_K, q4_k);             \
        CM_TILES_SET(k, CM_TYPE_Q5_K, q5_k);             \
        CM_TILES_SET(k, CM_TYPE_Q6_K, q6_k);             \
        CM_TILES_SET(k, CM_TYPE_F32, f32);               \
        CM_TILES_SET(k, CM_TYPE_F16, f16);               \
        CM_TILES_SET(k, CM_TYPE_BF16, bf16);             \
        (k)->from_float[CM_TYPE_Q8_0] = from_float_q8_0; \
        (k)->from_float[CM_TYPE_Q8_1] = from_float_q8_1; \
        (k)->from_float[CM_TYPE_Q8_K] = from_float_q8_k; \
        (k)->from_float[CM_TYPE_F16] = from_float_f16;   \
    } while (0)
#define CM_TILES_SET(k, T, NAME) ((k)->vec_dot[T] = vec_dot_##NAME, (k)->gemm[T] = gemm_##NAME)

#endif
