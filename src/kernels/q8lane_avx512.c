/*
 * q8lane_avx512.c: the AVX-512 table's q8_0 kernels (vec_dot, decode gemv,
 * prefill gemm) in "block lane order", the float order q4_0 already uses:
 *
 *   for each block b in ascending order: s_b = the exact integer dot of the
 *   32 weight bytes with the 32 activation bytes; d_b = f32(dx_b) * f32(dy_b)
 *   (one f32 product); chain (b mod 8) = fma(f32(s_b), d_b, chain (b mod 8));
 *   the result is the 8 chains summed ((c0+c4)+(c2+c6)) + ((c1+c5)+(c3+c7)).
 *
 * Only one float FMA per block and (row, token) remains (the former order
 * kept 8 int32 lanes per block apart and spent a conversion and an FMA on
 * each, which bound the prefill). Every s_b is exact (|s_b| < 2^21), so
 * each kernel may compute it however suits it:
 *   - one token (vec_dot, the decode gemv): 16 blocks at a time, block
 *     4L + i's bytes in 128-bit lane L of vector i (x + 128 unsigned against
 *     y signed, minus 128 * sum(y)), a 4x4 transpose-add puts block j in lane
 *     j; the token's side (bytes, -128 * sum(y), dy) is packed once per call;
 *   - prefill (16 tokens across the int32 lanes): per block, 8 vpdpbusd of
 *     the tokens' y + 128 (packed once per pass) against the row's 4-byte
 *     words broadcast straight from the file's bytes, started at
 *     -128 * sum(x_b); the chains run one after another (a chain's value does
 *     not depend on when the others run), so a tile of QL_R rows x 16 tokens
 *     needs only QL_R float and QL_R int accumulators.
 * Either way each (row, token) gets the same s_b, d_b, FMAs and reduction,
 * so gemm and gemv equal vec_dot bit for bit (kernels.h;
 * tests/unit/test_kernels_invariant.c). The results differ from the former
 * avx512 q8_0 order (and from the avx2 table) in the last bits only.
 *
 * Compiled with the avx512 flags; filled after kernels_avx512.c (dispatch.c),
 * whose q8_0 entries it replaces. Stack: ~310 KiB in the prefill gemm at
 * most (rows up to QL_MAXNB blocks; longer rows take vec_dot per row and
 * token). Never allocates.
 */
#include "isa.h"

#include "base/base.h"
#include "tune.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QAI static inline __attribute__((always_inline))

enum {
    QL_GROUP = 640, /* one-token pack per 16 blocks: 8 x 64 B of y, -128*sum(y) (16 x i32), dy (16 x f32) */
    QL_TOKB = 576,  /* prefill pack per block and 16 tokens: 8 x 64 B of y + 128, dy (16 x f32) */
    QL_MAXNB = 512, /* longest row of the packed paths, in blocks (k <= 16384) */
    QL_R = 4,       /* rows per prefill tile */
    QL_MINTOK = 6,  /* fewer tokens: each row against each token with the one-token kernel */
    QL_CHUNK = 16,  /* vec_dot packs the token this many groups at a time */
};

QAI float q8l_f16f(cm_f16 h) { return _cvtsh_ss(h); }

QAI float q8l_hsum8(const float c[8]) { return ((c[0] + c[4]) + (c[2] + c[6])) + ((c[1] + c[5]) + (c[3] + c[7])); }

QAI __m512i q8l_ld4x128(const void *a, const void *b, const void *c, const void *d) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)a));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)b), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)c), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)d), 3);
}

/* p[i]: 4 int32 per 128-bit lane L summing to block 4L + i's total -> lane j = block j. */
QAI __m512i q8l_hadd4x4(const __m512i p[4]) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

/* f32 d of 16 consecutive blocks. */
QAI __m512 q8l_d16(const cm_block_q8_0 *x) {
    _Alignas(32) cm_f16 h[16];
    for (int j = 0; j < 16; j++) memcpy(&h[j], &x[j].d, 2);
    return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)h));
}

/* Block b's exact s_b (any bytes, -128 included). */
QAI int32_t q8l_block_dot(const cm_block_q8_0 *x, const cm_block_q8_0 *y) {
    const __m256i k128 = _mm256_set1_epi8((char)0x80), z = _mm256_setzero_si256();
    const __m256i yv = _mm256_loadu_si256((const __m256i *)(const void *)y->qs);
    const __m256i xu = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)x->qs), k128);
    const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(z, xu, yv), _mm256_dpbusd_epi32(z, k128, yv));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

/* Blocks [b0, nb) one at a time into the chains c, then the reduction. */
QAI float q8l_finish(__m256 cv, int64_t b0, int64_t nb, const cm_block_q8_0 *x, const cm_block_q8_0 *y) {
    _Alignas(32) float c[8];
    _mm256_store_ps(c, cv);
    for (int64_t b = b0; b < nb; b++)
        c[b & 7] = fmaf((float)q8l_block_dot(x + b, y + b), q8l_f16f(x[b].d) * q8l_f16f(y[b].d), c[b & 7]);
    return q8l_hsum8(c);
}

/* ---- one token ---- */

/* Pack ng groups of the token y (QL_GROUP bytes each, 64-byte aligned). */
QAI void q8l_pack1(int64_t ng, const cm_block_q8_0 *y, uint8_t *d) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    for (int64_t g = 0; g < ng; g++, y += 16, d += QL_GROUP) {
        __m512i p[4];
        for (int i = 0; i < 4; i++) {
            const cm_block_q8_0 *yb = y + i;
            const __m512i lo = q8l_ld4x128(yb[0].qs, yb[4].qs, yb[8].qs, yb[12].qs);
            const __m512i hi = q8l_ld4x128(yb[0].qs + 16, yb[4].qs + 16, yb[8].qs + 16, yb[12].qs + 16);
            _mm512_store_si512((void *)(d + 128 * i), lo);
            _mm512_store_si512((void *)(d + 128 * i + 64), hi);
            p[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, k128, lo), k128, hi);
        }
        _mm512_store_si512((void *)(d + 512), _mm512_sub_epi32(z, q8l_hadd4x4(p)));
        _mm512_store_ps((void *)(d + 576), q8l_d16(y));
    }
}

/* The decode gemv's software prefetch: each group's 9 lines QL_PFD bytes
 * ahead of it (rows are contiguous: past a row's end that is the next rows',
 * past the last row a few lines nobody reads; prefetches never fault). The
 * hardware prefetcher alone kept too few lines in flight for one core's
 * share of DRAM: a chain of 1B-model-shaped q8_0 gemvs (767 MB, huge pages)
 * ran at 82% of the read roofline at 2 threads and 84% at 1 without it,
 * 88-94% and 89-91% with 1024-2048 bytes, and 67% at 4096 (the lines then
 * alias the ones being read in L1's sets) on session 19's Intel Xeon
 * (docs/HISTORY.md). The distance is the knob CM_TUNE_Q8_0_GEMV_PFD
 * (tune.h: chosen per CPU at load, 2048 by default). */

/* The chains after ng groups of row x against the packed token, from cv;
 * pf: prefetch pf bytes ahead (the decode gemv; 0: none). Prefetching
 * changes no arithmetic. */
QAI __m256 q8l_groups_p(int64_t ng, const cm_block_q8_0 *x, const uint8_t *pk, __m256 cv, size_t pf) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    for (int64_t g = 0; g < ng; g++, x += 16, pk += QL_GROUP) {
        if (pf)
            for (int o = 0; o < 16 * (int)sizeof(cm_block_q8_0); o += 64)
                _mm_prefetch((const char *)x + pf + o, _MM_HINT_T0);
        __m512i p[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const cm_block_q8_0 *xb = x + i;
            const __m512i lo = _mm512_xor_si512(q8l_ld4x128(xb[0].qs, xb[4].qs, xb[8].qs, xb[12].qs), k128);
            const __m512i hi =
                _mm512_xor_si512(q8l_ld4x128(xb[0].qs + 16, xb[4].qs + 16, xb[8].qs + 16, xb[12].qs + 16), k128);
            p[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, _mm512_load_si512((const void *)(pk + 128 * i))), hi,
                                       _mm512_load_si512((const void *)(pk + 128 * i + 64)));
        }
        const __m512 f =
            _mm512_cvtepi32_ps(_mm512_add_epi32(q8l_hadd4x4(p), _mm512_load_si512((const void *)(pk + 512))));
        const __m512 d = _mm512_mul_ps(q8l_d16(x), _mm512_load_ps((const void *)(pk + 576)));
        cv = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), cv);
        cv = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), cv);
    }
    return cv;
}
QAI __m256 q8l_groups(int64_t ng, const cm_block_q8_0 *x, const uint8_t *pk, __m256 cv) {
    return q8l_groups_p(ng, x, pk, cv, 0);
}

static void vec_dot_lq8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const cm_block_q8_0 *x = vx, *y = vy;
    const int64_t nb = n / CM_QK8_0, ng = nb / 16;
    _Alignas(64) uint8_t pk[QL_CHUNK * QL_GROUP];
    __m256 cv = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g += QL_CHUNK) {
        const int64_t m = ng - g < QL_CHUNK ? ng - g : QL_CHUNK;
        q8l_pack1(m, y + 16 * g, pk);
        cv = q8l_groups(m, x + 16 * g, pk, cv);
    }
    *s = q8l_finish(cv, 16 * ng, nb, x, y);
}

/* n_tok tokens (any), each row against each token with the one-token kernel,
 * the tokens packed once (rows of at most QL_MAXNB blocks). */
static void q8l_rows(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK8_0, ng = nb / 16;
    enum { PKT = QL_MAXNB / 16 * QL_GROUP };
    _Alignas(64) uint8_t pk[QL_MINTOK * PKT];
    const size_t pfd = (size_t)cm_tune_get(CM_TUNE_Q8_0_GEMV_PFD);
    for (int64_t j0 = 0; j0 < n_tok; j0 += QL_MINTOK) {
        const int64_t nt = n_tok - j0 < QL_MINTOK ? n_tok - j0 : QL_MINTOK;
        for (int64_t t = 0; t < nt; t++)
            q8l_pack1(ng, (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride),
                      pk + t * PKT);
        for (int64_t i = r0; i < r1; i++) {
            const cm_block_q8_0 *xr = (const cm_block_q8_0 *)(const void *)((const char *)w + (size_t)i * w_stride);
            for (int64_t t = 0; t < nt; t++) {
                const cm_block_q8_0 *yt =
                    (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
                const __m256 cv = n_tok == 1 ? q8l_groups_p(ng, xr, pk, _mm256_setzero_ps(), pfd)
                                             : q8l_groups(ng, xr, pk + t * PKT, _mm256_setzero_ps());
                y[(j0 + t) * ldy + i] = q8l_finish(cv, 16 * ng, nb, xr, yt);
            }
        }
    }
}

static void gemv_lq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)n_tok;
    if (k / CM_QK8_0 > QL_MAXNB) {
        for (int64_t i = r0; i < r1; i++) vec_dot_lq8_0(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    q8l_rows(k, w, w_stride, x, x_stride, y, ldy, r0, r1, 1);
}

/* ---- prefill: 16 tokens across the lanes ---- */

/* Pack T (1..16) tokens, all nb blocks: per block, vector q lane t = token
 * t's y[4q..4q+3] + 128, then the 16 dy (lanes past T repeat token T-1). */
static void q8l_pack16(int64_t nb, const void *x, size_t x_stride, int T, uint8_t *d) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    _Alignas(64) int32_t off[16];
    for (int t = 0; t < 16; t++) off[t] = (int32_t)((size_t)(t < T ? t : T - 1) * x_stride);
    const __m512i idx = _mm512_load_si512((const void *)off);
    const uint8_t *base = x;
    for (int64_t b = 0; b < nb; b++, d += QL_TOKB) {
        const uint8_t *blk = base + (size_t)b * sizeof(cm_block_q8_0);
        for (int q = 0; q < 8; q++)
            _mm512_store_si512((void *)(d + 64 * q),
                               _mm512_xor_si512(_mm512_i32gather_epi32(idx, (const void *)(blk + 2 + 4 * q), 1), k128));
        const __m512i dw = _mm512_i32gather_epi32(idx, (const void *)blk, 1);
        _mm512_store_ps((void *)(d + 512), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw)));
    }
}

QAI int32_t q8l_ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* R rows x 16 tokens over nb blocks: res[r] = ((c0+c4)+(c2+c6)) + ((c1+c5)+(c3+c7)) per token lane. */
QAI void q8l_tile(int64_t nb, const cm_block_q8_0 *const *xr, const int32_t *corr, const float *dxf, size_t ld,
                  const uint8_t *pk, int R, __m512 *res) {
    __m512 ch[QL_R][8];
    for (int c = 0; c < 8; c++) {
        __m512 acc[QL_R];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t b = c; b < nb; b += 8) {
            const uint8_t *pb = pk + (size_t)b * QL_TOKB;
            __m512i s[QL_R];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) s[r] = _mm512_set1_epi32(corr[(size_t)r * ld + b]);
            _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++) {
                const __m512i tv = _mm512_load_si512((const void *)(pb + 64 * q));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) s[r] =
                    _mm512_dpbusd_epi32(s[r], tv, _mm512_set1_epi32(q8l_ld32(xr[r][b].qs + 4 * q)));
            }
            const __m512 dy = _mm512_load_ps((const void *)(pb + 512));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(s[r]), _mm512_mul_ps(_mm512_set1_ps(dxf[(size_t)r * ld + b]), dy), acc[r]);
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) ch[r][c] = acc[r];
    }
    for (int r = 0; r < R; r++)
        res[r] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(ch[r][0], ch[r][4]), _mm512_add_ps(ch[r][2], ch[r][6])),
                               _mm512_add_ps(_mm512_add_ps(ch[r][1], ch[r][5]), _mm512_add_ps(ch[r][3], ch[r][7])));
}

static void gemm_lq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK8_0;
    if (nb > QL_MAXNB) {
        for (int64_t i = r0; i < r1; i++)
            for (int64_t j = 0; j < n_tok; j++)
                vec_dot_lq8_0(k, &y[j * ldy + i], (const char *)w + (size_t)i * w_stride,
                              (const char *)x + (size_t)j * x_stride);
        return;
    }
    if (n_tok < QL_MINTOK) {
        q8l_rows(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    enum { PACK = QL_MAXNB * QL_TOKB, LD = QL_MAXNB };
    _Alignas(64) uint8_t pk[PACK];
    _Alignas(64) int32_t corr[QL_R * LD]; /* -128 * sum(x_b) per row of the tile */
    _Alignas(64) float dxf[QL_R * LD];
    const size_t gbytes = (size_t)nb * QL_TOKB;
    const int64_t gcap = (int64_t)(PACK / gbytes); /* groups of 16 tokens per pass */
    const __m256i k128 = _mm256_set1_epi8((char)0x80), z = _mm256_setzero_si256();
    for (int64_t j0 = 0; j0 < n_tok; j0 += 16 * gcap) {
        const int64_t ntp = n_tok - j0 < 16 * gcap ? n_tok - j0 : 16 * gcap, ngr = (ntp + 15) / 16;
        for (int64_t g = 0; g < ngr; g++) {
            const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
            q8l_pack16(nb, (const char *)x + (size_t)(j0 + 16 * g) * x_stride, x_stride, T, pk + (size_t)g * gbytes);
        }
        for (int64_t i = r0; i < r1; i += QL_R) {
            const int R = r1 - i < QL_R ? (int)(r1 - i) : QL_R;
            const cm_block_q8_0 *xr[QL_R];
            for (int r = 0; r < R; r++) {
                xr[r] = (const cm_block_q8_0 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
                for (int64_t b = 0; b < nb; b++) {
                    /* sum(x + 128) over the block by psadbw, less 32 * 128 */
                    const __m256i sad = _mm256_sad_epu8(
                        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)xr[r][b].qs), k128), z);
                    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
                    const int64_t sx = _mm_cvtsi128_si64(_mm_add_epi64(h, _mm_unpackhi_epi64(h, h))) - 32 * 128;
                    corr[(size_t)r * LD + b] = (int32_t)(-128 * sx);
                    dxf[(size_t)r * LD + b] = q8l_f16f(xr[r][b].d);
                }
            }
            for (int64_t g = 0; g < ngr; g++) {
                const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
                const uint8_t *pg = pk + (size_t)g * gbytes;
                __m512 res[QL_R];
                switch (R) {
                case 4: q8l_tile(nb, xr, corr, dxf, LD, pg, 4, res); break;
                case 3: q8l_tile(nb, xr, corr, dxf, LD, pg, 3, res); break;
                case 2: q8l_tile(nb, xr, corr, dxf, LD, pg, 2, res); break;
                default: q8l_tile(nb, xr, corr, dxf, LD, pg, 1, res); break;
                }
                for (int r = 0; r < R; r++) {
                    _Alignas(64) float o[16];
                    _mm512_store_ps(o, res[r]);
                    for (int t = 0; t < T; t++) y[(j0 + 16 * g + t) * ldy + i + r] = o[t];
                }
            }
        }
    }
}

void cm_kernels_fill_q8lane_avx512(cm_kernels *k) {
    k->vec_dot[CM_TYPE_Q8_0] = vec_dot_lq8_0;
    k->gemm[CM_TYPE_Q8_0] = gemm_lq8_0;
    k->gemv[CM_TYPE_Q8_0] = gemv_lq8_0;
}
