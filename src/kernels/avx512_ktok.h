/*
 * avx512_ktok.h: the token groups of the k-quant gemms with tokens in the
 * int32 lanes (gemm_kq4_avx512.c's q4_k, gemm_kq_avx512.c's q5_k). Plain C
 * over the tokens' q8_k blocks; included by those two files only.
 */
#ifndef CM_AVX512_KTOK_H
#define CM_AVX512_KTOK_H

#include <stdint.h>
#include <string.h>

enum { KT_TOKB = 69 * 64 }; /* a 16-token group's super-block: 64 value vectors, 4 Y pair vectors, dy */

/* Tokens j0 + t (t < T <= W, W = 16 or 8 lanes) into one group: per
 * super-block 64 vectors (lane t: token t's y[4c..4c+3] + 128), 4 vectors of
 * word pairs (Y_2u, Y_2u+1), dy; lanes past T zero (their sums are unused). */
static inline void kt_pack(const void *x, size_t x_stride, int64_t j0, int T, int W, int64_t nb, uint8_t *o) {
    for (int64_t b = 0; b < nb; b++) {
        uint32_t *a = (uint32_t *)(void *)(o + (size_t)b * KT_TOKB / 16 * (size_t)W);
        uint32_t *yw = a + 64 * W;
        float *dy = (float *)(void *)(yw + 4 * W);
        for (int t = 0; t < W; t++) {
            if (t >= T) {
                for (int c = 0; c < 64; c++) a[c * W + t] = 0;
                for (int u = 0; u < 4; u++) yw[u * W + t] = 0;
                dy[t] = 0.0f;
                continue;
            }
            const cm_block_q8_k *y =
                (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride) + b;
            uint32_t v[64];
            memcpy(v, y->qs, 256);
            for (int c = 0; c < 64; c++) a[c * W + t] = v[c] ^ 0x80808080u;
            for (int u = 0; u < 4; u++) {
                const int j = 2 * u;
                const uint16_t y0 = (uint16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
                const uint16_t y1 = (uint16_t)(y->bsums[2 * j + 2] + y->bsums[2 * j + 3]);
                yw[u * W + t] = y0 | (uint32_t)y1 << 16;
            }
            dy[t] = y->d;
        }
    }
}

#endif
