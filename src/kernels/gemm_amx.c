/*
 * gemm_amx.c: the avx512 table's q4_0 and q8_0 prefill gemms on AMX tiles
 * (Sapphire Rapids and later), bit-identical to that table's vec_dot.
 *
 * Both types share the avx512 table's "block lane order" (kernels_avx512.c
 * ztile_q4_0, q8lane_avx512.c): per block b in ascending order the exact
 * integer s_b = sum(q * y) (q4_0: q - 8), d_b = f32(dx_b) * f32(dy_b) (one
 * f32 product), chain (b mod 8) = fma(f32(s_b), d_b, chain), and the result
 * ((c0+c4)+(c2+c6)) + ((c1+c5)+(c3+c7)). Here one TDPBSSD per block (K = 32)
 * gives s_b exactly for 16 tokens x 16 rows at once (signed bytes, int32
 * sums, |s_b| < 2^19), so only the float epilogue remains, and it does
 * exactly the operations above per (row, token): so every result equals
 * vec_dot's bits (kernels.h's batch invariance; an AMX machine and one
 * without agree in a cluster), tests/unit/test_kernels_amx.c.
 *
 * Operands: A = 16 tokens x the 32 activation bytes of block b, loaded
 * straight from the Q8_0 activation rows (tile row stride = the row
 * stride); B = the weights of 16 rows, repacked per call into a small
 * per-thread panel in the VNNI layout (block b: 8 rows of 64 bytes, row q
 * holding bytes 4q..4q+3 of each weight row's block; q4_0's nibbles made
 * signed q - 8), reused by every token group: no second copy of the
 * weights in memory. C = 16 tokens x 16 rows of int32, stored to L1 and
 * finished with AVX-512: each chain runs over its blocks with the 16
 * tokens' accumulators in registers (a chain's value does not depend on
 * when the others run).
 *
 * Tile configuration is per thread and per call: every call loads its own
 * (the last token group may have fewer than 16 rows) and releases the tiles
 * when it returns, so any thread may call at any time. Compiled with the
 * avx512 flags plus -mamx-tile -mamx-int8 (Makefile); installed by
 * dispatch.c only when cm_cpu_features_get() says this process may use
 * AMX-INT8 and CUMULO_AMX is not 0. Below AX_MINTOK tokens, or for rows
 * longer than AX_MAXNB blocks, it hands over to the table's gemm it
 * replaced. Stack: ~330 KiB at most. Never allocates.
 */
#include "isa.h"

#include "base/base.h"

#include <immintrin.h>
#include <string.h>

#define XAI static inline __attribute__((always_inline))

enum {
    AX_MAXNB = 512, /* longest row, in blocks (k <= 16384) */
    AX_MINTOK = 16, /* fewer tokens: the replaced gemm */
    AX_PB = 512,    /* panel bytes per block: 8 x 64 */
};

/* Tiles: 0 A (16 tokens x 32 bytes), 1 A of the last token group (nt
 * rows), 2 and 3 B (8 x 64 bytes), 4 and 5 C (16 x 16 int32), 6 and 7 C of
 * the last token group. */
typedef struct {
    uint8_t palette, start_row, rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ax_cfg;

static void ax_config(int nt) {
    _Alignas(64) ax_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int t = nt ? nt : 16;
    c.rows[0] = 16, c.colsb[0] = 32;
    c.rows[1] = (uint8_t)t, c.colsb[1] = 32;
    c.rows[2] = c.rows[3] = 8, c.colsb[2] = c.colsb[3] = 64;
    c.rows[4] = c.rows[5] = 16, c.colsb[4] = c.colsb[5] = 64;
    c.rows[6] = c.rows[7] = (uint8_t)t, c.colsb[6] = c.colsb[7] = 64;
    _tile_loadconfig(&c);
}

static cm_gemm_fn g_prev_q4_0, g_prev_q8_0;

/* The panel of rows [i, i + R) (R <= 16; lanes past R repeat row R - 1):
 * per block, the 8 x 64 bytes of B and the 16 dx as f32. */
XAI void ax_panel(enum cm_type t, int64_t nb, const uint8_t *w, size_t ws, int R, uint8_t *pb, float *dx) {
    _Alignas(64) int32_t off[16];
    for (int n = 0; n < 16; n++) off[n] = (int32_t)((size_t)(n < R ? n : R - 1) * ws);
    const __m512i idx = _mm512_load_si512((const void *)off);
    const __m512i m4 = _mm512_set1_epi8(0x0f), k8 = _mm512_set1_epi8(8);
    const size_t bs = t == CM_TYPE_Q4_0 ? sizeof(cm_block_q4_0) : sizeof(cm_block_q8_0);
    for (int64_t b = 0; b < nb; b++, pb += AX_PB) {
        const uint8_t *blk = w + (size_t)b * bs;
        const __m512i dw = _mm512_i32gather_epi32(idx, (const void *)blk, 1);
        _mm512_store_ps(dx + 16 * b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw)));
        if (t == CM_TYPE_Q4_0) {
            for (int q = 0; q < 4; q++) {
                const __m512i v = _mm512_i32gather_epi32(idx, (const void *)(blk + 2 + 4 * q), 1);
                _mm512_store_si512((void *)(pb + 64 * q), _mm512_sub_epi8(_mm512_and_si512(v, m4), k8));
                _mm512_store_si512((void *)(pb + 64 * (q + 4)),
                                   _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), k8));
            }
        } else {
            for (int q = 0; q < 8; q++)
                _mm512_store_si512((void *)(pb + 64 * q), _mm512_i32gather_epi32(idx, (const void *)(blk + 2 + 4 * q), 1));
        }
    }
}

/* dy of the nt tokens at x (stride xs) for every block, as f32: dy[16 * b + m]
 * (m >= nt repeat token nt - 1). */
static void ax_dy(int64_t nb, const uint8_t *x, size_t xs, int nt, float *dy) {
    _Alignas(64) int32_t off[16];
    for (int m = 0; m < 16; m++) off[m] = (int32_t)((size_t)(m < nt ? m : nt - 1) * xs);
    const __m512i idx = _mm512_load_si512((const void *)off);
    for (int64_t b = 0; b < nb; b++) {
        const __m512i dw = _mm512_i32gather_epi32(idx, (const void *)(x + (size_t)b * sizeof(cm_block_q8_0)), 1);
        _mm512_store_ps(dy + 16 * b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw)));
    }
}

/* One block's epilogue: acc[m] = fma(f32(C[m]), dx * dy_m, acc[m]) for the 16 token rows m. */
XAI void ax_fin(const int32_t *cb, const float *dx, const float *dy, __m512 *acc) {
    const __m512 d = _mm512_load_ps(dx);
    _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) acc[m] = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * m))), _mm512_mul_ps(d, _mm512_set1_ps(dy[m])),
        acc[m]);
}

/* The 16 rows of a panel against one group of tokens (the A rows at x,
 * stride xs; TAIL: the last group, tiles 1, 6, 7): res[m] = the 16 rows'
 * results for token m. */
XAI void ax_group(int64_t nb, const uint8_t *x, size_t xs, const uint8_t *pb, const float *dx, const float *dy,
                  int32_t *cb, float *ch, bool tail) {
    for (int c = 0; c < 8; c++) {
        __m512 acc[16];
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
        int64_t b = c;
        for (; b + 8 < nb; b += 16) {
            const uint8_t *xa = x + (size_t)b * sizeof(cm_block_q8_0) + 2;
            const uint8_t *xb = xa + 8 * sizeof(cm_block_q8_0);
            _tile_loadd(2, pb + (size_t)b * AX_PB, 64);
            _tile_loadd(3, pb + (size_t)(b + 8) * AX_PB, 64);
            if (tail) {
                _tile_zero(6);
                _tile_zero(7);
                _tile_loadd(1, xa, (long)xs);
                _tile_dpbssd(6, 1, 2);
                _tile_loadd(1, xb, (long)xs);
                _tile_dpbssd(7, 1, 3);
                _tile_stored(6, cb, 64);
                _tile_stored(7, cb + 256, 64);
            } else {
                _tile_zero(4);
                _tile_zero(5);
                _tile_loadd(0, xa, (long)xs);
                _tile_dpbssd(4, 0, 2);
                _tile_loadd(0, xb, (long)xs);
                _tile_dpbssd(5, 0, 3);
                _tile_stored(4, cb, 64);
                _tile_stored(5, cb + 256, 64);
            }
            ax_fin(cb, dx + 16 * b, dy + 16 * b, acc);
            ax_fin(cb + 256, dx + 16 * (b + 8), dy + 16 * (b + 8), acc);
        }
        if (b < nb) {
            const uint8_t *xa = x + (size_t)b * sizeof(cm_block_q8_0) + 2;
            _tile_loadd(2, pb + (size_t)b * AX_PB, 64);
            if (tail) {
                _tile_zero(6);
                _tile_loadd(1, xa, (long)xs);
                _tile_dpbssd(6, 1, 2);
                _tile_stored(6, cb, 64);
            } else {
                _tile_zero(4);
                _tile_loadd(0, xa, (long)xs);
                _tile_dpbssd(4, 0, 2);
                _tile_stored(4, cb, 64);
            }
            ax_fin(cb, dx + 16 * b, dy + 16 * b, acc);
        }
        _Pragma("GCC unroll 16") for (int m = 0; m < 16; m++) _mm512_store_ps(ch + 256 * c + 16 * m, acc[m]);
    }
}

static void ax_gemm(enum cm_type t, int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / 32;
    _Alignas(64) uint8_t pb[AX_MAXNB * AX_PB];
    _Alignas(64) float dx[AX_MAXNB * 16], dy[AX_MAXNB * 16], ch[8 * 256];
    _Alignas(64) int32_t cb[512];
    memset(cb, 0, sizeof cb); /* rows past the last group's tokens are read, never used */
    const int nt = (int)(n_tok % 16);
    ax_config(nt);
    const size_t bs = t == CM_TYPE_Q4_0 ? sizeof(cm_block_q4_0) : sizeof(cm_block_q8_0);
    (void)bs;
    for (int64_t i = r0; i < r1; i += 16) {
        const int R = r1 - i < 16 ? (int)(r1 - i) : 16;
        const __mmask16 mk = (__mmask16)((1u << R) - 1);
        ax_panel(t, nb, (const uint8_t *)w + (size_t)i * w_stride, w_stride, R, pb, dx);
        for (int64_t j0 = 0; j0 < n_tok; j0 += 16) {
            const int T = n_tok - j0 < 16 ? (int)(n_tok - j0) : 16;
            const uint8_t *xg = (const uint8_t *)x + (size_t)j0 * x_stride;
            ax_dy(nb, xg, x_stride, T, dy);
            if (T == 16) ax_group(nb, xg, x_stride, pb, dx, dy, cb, ch, false);
            else ax_group(nb, xg, x_stride, pb, dx, dy, cb, ch, true);
            for (int m = 0; m < T; m++) {
                const float *c = ch + 16 * m;
                const __m512 r = _mm512_add_ps(
                    _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(c), _mm512_load_ps(c + 1024)),
                                  _mm512_add_ps(_mm512_load_ps(c + 512), _mm512_load_ps(c + 1536))),
                    _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(c + 256), _mm512_load_ps(c + 1280)),
                                  _mm512_add_ps(_mm512_load_ps(c + 768), _mm512_load_ps(c + 1792))));
                _mm512_mask_storeu_ps(y + (j0 + m) * ldy + i, mk, r);
            }
        }
    }
    _tile_release();
}

static void gemm_xq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < AX_MINTOK || k / 32 > AX_MAXNB) {
        g_prev_q4_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ax_gemm(CM_TYPE_Q4_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

static void gemm_xq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < AX_MINTOK || k / 32 > AX_MAXNB) {
        g_prev_q8_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ax_gemm(CM_TYPE_Q8_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

/* The AMX paths for every n_tok (tests and kbench; rows up to AX_MAXNB blocks). */
static void gemm_aq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ax_gemm(CM_TYPE_Q4_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}
static void gemm_aq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ax_gemm(CM_TYPE_Q8_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

void cm_kernels_fill_amx(cm_kernels *k) {
    g_prev_q4_0 = k->gemm[CM_TYPE_Q4_0];
    g_prev_q8_0 = k->gemm[CM_TYPE_Q8_0];
    CM_ASSERT(g_prev_q4_0 && g_prev_q8_0);
    k->gemm[CM_TYPE_Q4_0] = gemm_xq4_0;
    k->gemm[CM_TYPE_Q8_0] = gemm_xq8_0;
}

cm_gemm_fn cm_kernels_amx_direct(enum cm_type t) {
    return t == CM_TYPE_Q4_0 ? gemm_aq4_0 : t == CM_TYPE_Q8_0 ? gemm_aq8_0 : NULL;
}
