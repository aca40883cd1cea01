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
 * Operands: A = 16 tokens x the 32 activation bytes of block b, packed
 * once per call with the tokens' dy as f32 (a last group of fewer than 16
 * tokens padded with zero rows, so one tile shape serves all); B = the
 * weights of 16 rows, repacked per call into a small per-thread panel in
 * the VNNI layout (block b: 8 rows of 64 bytes, row q holding bytes
 * 4q..4q+3 of each weight row's block; q4_0's nibbles made signed q - 8),
 * reused by every token group: no second copy of the weights in memory.
 * C = 16 tokens x 16 rows of int32, stored to L1 and finished with
 * AVX-512: each chain runs over its blocks with the 16 tokens'
 * accumulators in registers (a chain's value does not depend on when the
 * others run).
 *
 * Tile configuration is per thread and per call: every call loads its own
 * and releases the tiles when it returns, so any thread may call at any
 * time. Compiled with the avx512 flags plus -mamx-tile -mamx-int8
 * (Makefile); installed by dispatch.c only when cm_cpu_features_get() says
 * this process may use AMX-INT8 and CUMULO_AMX is not 0. Below ax_mintok's
 * tokens (where the replaced gemm is faster, measured per layout and row
 * length), or for rows longer than AX_MAXNB blocks, it hands over to the
 * table's gemm it replaced. q4_0 rows repacked at load ("q4_0 lanes",
 * repack.c) get the same gemm as the table's gemm_packed (its panel reads
 * the lanes layout; same ints, same bits). A group of 4 or 8 tokens or
 * fewer runs on 4- or 8-row A and C tiles (ax_config), so a small batch
 * costs less than a full 16-token group.
 * Stack: ~880 KiB at most (compute threads have CM_COMPUTE_STACK, 8 MiB).
 * Never allocates.
 */
#include "amx.h"
#include "isa.h"

#include "base/base.h"

#include <immintrin.h>
#include <string.h>

#define XAI static inline __attribute__((always_inline))

enum {
    AX_MAXNB = 512,       /* longest row, in blocks (k <= 16384) */
    AX_PB = 512,          /* panel bytes per block: 8 x 64 */
    AX_TB = 576,          /* packed tokens' bytes per block: 16 x 32, 16 dy */
    AX_PACK = 512 * 1024, /* packed tokens per pass (16 at least: AX_MAXNB * AX_TB fits) */
};

/* Tiles: 0 and 1 A (M tokens x 32 bytes), 2 and 3 B (8 x 64 bytes), 4 to
 * 7 C (M tokens x 16 int32): four blocks in flight, each C tile zeroed,
 * multiplied once and stored. M = 16, or 4 or 8 for a group of that many
 * tokens or fewer (a small batch, a batch's last group): the tile work,
 * the stores and the epilogue shrink with it (each token's operations stay
 * the same). */
static void ax_config(int M) {
    const uint8_t m = (uint8_t)M, rows[8] = {m, m, 8, 8, m, m, m, m};
    static const uint16_t colsb[8] = {32, 32, 64, 64, 64, 64, 64, 64};
    cm_amx_config(rows, colsb);
}

/* The tile rows for a group of T tokens. */
static int ax_rows(int T) { return T <= 4 ? 4 : T <= 8 ? 8 : 16; }

/* The weights' layouts: q4_0 and q8_0 as in the file, q4_0 repacked at load
 * ("q4_0 lanes", repack.c). */
enum { AX_Q4_0, AX_Q4_0_LANES, AX_Q8_0 };

static cm_gemm_fn g_prev_q4_0, g_prev_q8_0, g_prev_packed_q4_0;

/* The fewest tokens (of rows of nb blocks) taken from the replaced gemm,
 * where AMX wins (bench/amxcross.c, thread CPU time, best of 5-7, 1
 * thread, Xeon family 6 model 167, HISTORY.md session 21). Up to 16
 * tokens the AMX gemm costs about the same (the per-call panel, one tile
 * group); the replaced gemms grow with the tokens. Over the file's layout
 * (gemm_lq4_0, gemm_qg8_0): q4_0 AMX / avx512 1.09-1.24x at 2 tokens on
 * 768 x 2048, 2048 x 768, 2048 x 2048 (rows x k); q8_0 0.88-0.92x at 3,
 * 1.13-1.17x at 4 (2048 x 768: 1.34x at 2). Over "q4_0 lanes", the batched
 * tile (avx512_bgemm.h) is the fast one: rows of whole groups of 16 blocks
 * cross at 13 tokens (0.96-1.05x at 13 at k 1536-8192, 1.00-1.12x at 14),
 * at 8-10 for k of 512 and 1024; a row's nb % 16 tail blocks go through its
 * per-token q8_0 dot there: k 768 (a MoE expert's down) 1.9-3.0x from 1
 * token, k 2816 1.15x from 3. */
static int ax_mintok(int lay, int64_t nb) {
    if (lay == AX_Q4_0) return 2;
    if (lay == AX_Q8_0) return 4;
    return nb % 16 ? (nb < 64 ? 2 : 3) : nb <= 32 ? 10 : 13;
}

_Thread_local uint64_t cm_amx_calls;

/* The panel of rows [i, i + R) (R <= 16; lanes past R repeat row R - 1):
 * per block, the 8 x 64 bytes of B and the 16 dx as f32. */
XAI void ax_panel(int lay, int64_t nb, const uint8_t *w, size_t ws, int R, uint8_t *pb, float *dx) {
    _Alignas(64) int32_t off[16];
    for (int n = 0; n < 16; n++) off[n] = (int32_t)((size_t)(n < R ? n : R - 1) * ws);
    const __m512i idx = _mm512_load_si512((const void *)off);
    const __m512i m4 = _mm512_set1_epi8(0x0f), k8 = _mm512_set1_epi8(8);
    const size_t bs = lay == AX_Q8_0 ? sizeof(cm_block_q8_0) : sizeof(cm_block_q4_0);
    const int64_t nl = lay == AX_Q4_0_LANES ? nb / 16 * 16 : 0; /* blocks in "q4_0 lanes" groups */
    for (int64_t b = 0; b < nb; b++, pb += AX_PB) {
        /* the block's fp16 d and its qs dword q at qs + qstep * q */
        const uint8_t *d = w + (size_t)b * bs, *qs = d + 2;
        size_t qstep = 4;
        if (b < nl) {
            const uint8_t *g = w + (size_t)(b / 16) * (16 * sizeof(cm_block_q4_0));
            d = g + 2 * (b % 16), qs = g + 32 + 4 * (b % 16), qstep = 64;
        }
        const __m512i dw = _mm512_i32gather_epi32(idx, (const void *)d, 1);
        _mm512_store_ps(dx + 16 * b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw)));
        if (lay != AX_Q8_0) {
            for (int q = 0; q < 4; q++) {
                const __m512i v = _mm512_i32gather_epi32(idx, (const void *)(qs + qstep * (size_t)q), 1);
                _mm512_store_si512((void *)(pb + 64 * q), _mm512_sub_epi8(_mm512_and_si512(v, m4), k8));
                _mm512_store_si512((void *)(pb + 64 * (q + 4)),
                                   _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), k8));
            }
        } else {
            for (int q = 0; q < 8; q++)
                _mm512_store_si512((void *)(pb + 64 * q), _mm512_i32gather_epi32(idx, (const void *)(qs + 4 * q), 1));
        }
    }
}

/* Pack T (1..16) tokens at x (stride xs), all nb blocks, AX_TB bytes per
 * block: the 16 x 32 bytes of the A tile (rows past T zero), then the 16 dy
 * as f32 (0 past T). */
static void ax_pack(int64_t nb, const uint8_t *x, size_t xs, int T, uint8_t *d) {
    for (int m = 0; m < 16; m++) {
        const uint8_t *xm = x + (size_t)m * xs;
        uint8_t *dm = d + 32 * m;
        float *dym = (float *)(void *)(d + 512) + m;
        if (m >= T) {
            for (int64_t b = 0; b < nb; b++) {
                _mm256_store_si256((__m256i *)(void *)(dm + (size_t)b * AX_TB), _mm256_setzero_si256());
                dym[(size_t)b * AX_TB / 4] = 0;
            }
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = xm + (size_t)b * sizeof(cm_block_q8_0);
            _mm256_store_si256((__m256i *)(void *)(dm + (size_t)b * AX_TB),
                               _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2)));
            cm_f16 h;
            memcpy(&h, blk, 2);
            dym[(size_t)b * AX_TB / 4] = _cvtsh_ss(h);
        }
    }
}

/* One block's epilogue: acc[m] = fma(f32(C[m]), dx * dy_m, acc[m]) for the M token rows m. */
XAI void ax_fin(int M, const int32_t *cb, const float *dx, const float *dy, __m512 *acc) {
    const __m512 d = _mm512_load_ps(dx);
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * m))),
                        _mm512_mul_ps(d, _mm512_set1_ps(dy[m])), acc[m]);
}

/* The int32 sums of blocks b, b + 8, b + 16, b + 24 (the first n of them)
 * of the panel pb against the packed tokens xp into cb + 256 * i. */
#define AX_BLOCK(ta, tb, tc, blk)                      \
    do {                                               \
        _tile_loadd(tb, pb + (size_t)(blk)*AX_PB, 64); \
        _tile_loadd(ta, xp + (size_t)(blk)*AX_TB, 32); \
        _tile_zero(tc);                                \
        _tile_dpbssd(tc, ta, tb);                      \
    } while (0)
XAI void ax_sums(int64_t b, int n, const uint8_t *xp, const uint8_t *pb, int32_t *cb) {
    AX_BLOCK(0, 2, 4, b);
    if (n > 1) AX_BLOCK(1, 3, 5, b + 8);
    if (n > 2) AX_BLOCK(0, 2, 6, b + 16);
    if (n > 3) AX_BLOCK(1, 3, 7, b + 24);
    _tile_stored(4, cb, 64);
    if (n > 1) _tile_stored(5, cb + 256, 64);
    if (n > 2) _tile_stored(6, cb + 512, 64);
    if (n > 3) _tile_stored(7, cb + 768, 64);
}

/* How many of blocks b, b + 8, b + 16, b + 24 exist. */
XAI int ax_count(int64_t b, int64_t nb) {
    const int64_t n = (nb - b + 7) / 8;
    return n < 4 ? (int)n : 4;
}

/* The 16 rows of a panel against one packed group of tokens: ch + 256 * c +
 * 16 * m = chain c of token m for the 16 rows. Chain c runs over blocks c,
 * c + 8, ... four at a time (a step); the tile sums of the next step are
 * issued one block at a time between this step's block epilogues (two
 * buffers in cb): 8% faster than all four ahead (K 4096, 128 tokens), though
 * the tile part and the epilogue still mostly add up. */
XAI void ax_group_m(int M, int64_t nb, const uint8_t *xp, const uint8_t *pb, const float *dx, int32_t *cb, float *ch) {
    int cur = 0;
    if (nb > 0) ax_sums(0, ax_count(0, nb), xp, pb, cb);
    for (int c = 0; c < 8; c++) {
        __m512 acc[16];
        _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
        for (int64_t b = c; b < nb; b += 32) {
            const int n = ax_count(b, nb);
            const int64_t bn = b + 32 < nb ? b + 32 : c + 1; /* else the next chain's first step */
            const int nn = bn < nb && (bn > b || c < 7) ? ax_count(bn, nb) : 0;
            int32_t *cn = cb + 1024 * (cur ^ 1);
            const int32_t *cc = cb + 1024 * cur;
#define AX_STEP(i, ta, tb, tc)                                                                    \
    do {                                                                                          \
        if ((i) < nn) {                                                                           \
            AX_BLOCK(ta, tb, tc, bn + 8 * (i));                                                   \
            _tile_stored(tc, cn + 256 * (i), 64);                                                 \
        }                                                                                         \
        if ((i) < n)                                                                              \
            ax_fin(M, cc + 256 * (i), dx + 16 * (b + 8 * (i)),                                    \
                   (const float *)(const void *)(xp + (size_t)(b + 8 * (i)) * AX_TB + 512), acc); \
    } while (0)
            AX_STEP(0, 0, 2, 4);
            AX_STEP(1, 1, 3, 5);
            AX_STEP(2, 0, 2, 6);
            AX_STEP(3, 1, 3, 7);
#undef AX_STEP
            cur ^= 1;
        }
        _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) _mm512_store_ps(ch + 256 * c + 16 * m, acc[m]);
    }
}
static void ax_group(int M, int64_t nb, const uint8_t *xp, const uint8_t *pb, const float *dx, int32_t *cb, float *ch) {
    if (M == 4) ax_group_m(4, nb, xp, pb, dx, cb, ch);
    else if (M == 8) ax_group_m(8, nb, xp, pb, dx, cb, ch);
    else ax_group_m(16, nb, xp, pb, dx, cb, ch);
}

static void ax_gemm(int lay, int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / 32;
    _Alignas(64) uint8_t pb[AX_MAXNB * AX_PB], xp[AX_PACK];
    _Alignas(64) float dx[AX_MAXNB * 16], ch[8 * 256];
    _Alignas(64) int32_t cb[2048];
    const size_t gbytes = (size_t)nb * AX_TB;
    const int64_t gcap = (int64_t)(AX_PACK / gbytes); /* groups of 16 tokens per pass */
    int M = 0;                                        /* the tile rows configured */
    cm_amx_calls++;
    for (int64_t j0 = 0; j0 < n_tok; j0 += 16 * gcap) {
        const int64_t ntp = n_tok - j0 < 16 * gcap ? n_tok - j0 : 16 * gcap, ngr = (ntp + 15) / 16;
        for (int64_t g = 0; g < ngr; g++) {
            const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
            ax_pack(nb, (const uint8_t *)x + (size_t)(j0 + 16 * g) * x_stride, x_stride, T, xp + (size_t)g * gbytes);
        }
        for (int64_t i = r0; i < r1; i += 16) {
            const int R = r1 - i < 16 ? (int)(r1 - i) : 16;
            const __mmask16 mk = (__mmask16)((1u << R) - 1);
            ax_panel(lay, nb, (const uint8_t *)w + (size_t)i * w_stride, w_stride, R, pb, dx);
            for (int64_t g = 0; g < ngr; g++) {
                const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
                if (ax_rows(T) != M) ax_config(M = ax_rows(T));
                ax_group(M, nb, xp + (size_t)g * gbytes, pb, dx, cb, ch);
                for (int m = 0; m < T; m++) {
                    const float *c = ch + 16 * m;
                    const __m512 r =
                        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_load_ps(c), _mm512_load_ps(c + 1024)),
                                                    _mm512_add_ps(_mm512_load_ps(c + 512), _mm512_load_ps(c + 1536))),
                                      _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(c + 256), _mm512_load_ps(c + 1280)),
                                                    _mm512_add_ps(_mm512_load_ps(c + 768), _mm512_load_ps(c + 1792))));
                    _mm512_mask_storeu_ps(y + (j0 + 16 * g + m) * ldy + i, mk, r);
                }
            }
        }
    }
    _tile_release();
}

static void gemm_xq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < ax_mintok(AX_Q4_0, k / 32) || k / 32 > AX_MAXNB) {
        g_prev_q4_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ax_gemm(AX_Q4_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

static void gemm_xq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < ax_mintok(AX_Q8_0, k / 32) || k / 32 > AX_MAXNB) {
        g_prev_q8_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ax_gemm(AX_Q8_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

/* The AMX paths for every n_tok (tests and kbench; rows up to AX_MAXNB blocks). */
static void gemm_aq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ax_gemm(AX_Q4_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}
static void gemm_aq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ax_gemm(AX_Q8_0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

static void gemm_apq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ax_gemm(AX_Q4_0_LANES, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

/* The batched gemm over "q4_0 lanes" rows (up to gemm_packed_max tokens). */
static void gemm_pq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < ax_mintok(AX_Q4_0_LANES, k / 32) || k / 32 > AX_MAXNB) {
        g_prev_packed_q4_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ax_gemm(AX_Q4_0_LANES, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

void cm_kernels_fill_amx(cm_kernels *k) {
    g_prev_q4_0 = k->gemm[CM_TYPE_Q4_0];
    g_prev_q8_0 = k->gemm[CM_TYPE_Q8_0];
    g_prev_packed_q4_0 = k->gemm_packed[CM_TYPE_Q4_0];
    CM_ASSERT(g_prev_q4_0 && g_prev_q8_0 && g_prev_packed_q4_0);
    k->gemm[CM_TYPE_Q4_0] = gemm_xq4_0;
    k->gemm[CM_TYPE_Q8_0] = gemm_xq8_0;
    k->gemm_packed[CM_TYPE_Q4_0] = gemm_pq4_0;
    cm_kernels_fill_amxk(k); /* q4_k and q5_k: gemm_kq45_amx.c */
    cm_kernels_fill_amx6(k); /* q6_k: gemm_kq6_amx.c */
}

uint64_t cm_kernels_amx_ncalls(void) { return cm_amx_calls; }

cm_gemm_fn cm_kernels_amx_direct(enum cm_type t, bool packed, int64_t k, int *mintok) {
    if (t == CM_TYPE_Q6_K) return cm_kernels_amx6_direct(packed, k, mintok);
    if (t == CM_TYPE_Q4_K || t == CM_TYPE_Q5_K) return cm_kernels_amxk_direct(t, packed, k, mintok);
    const int lay = t == CM_TYPE_Q8_0 ? AX_Q8_0 : packed ? AX_Q4_0_LANES : AX_Q4_0;
    const cm_gemm_fn f = t == CM_TYPE_Q4_0              ? (packed ? gemm_apq4_0 : gemm_aq4_0)
                         : t == CM_TYPE_Q8_0 && !packed ? gemm_aq8_0
                                                        : NULL;
    *mintok = f ? ax_mintok(lay, k / 32) : 0;
    return f;
}
