/*
 * gemm_kq4_avx512.c: the AVX-512 (VNNI) prefill gemm for q4_k with the
 * weights of a register tile's rows held in registers across its tokens
 * (moved out of gemm_kq_avx512.c).
 *
 * Per 128 weight x token products two vpdpbusd (4-byte sums), one shift and
 * one blend that pack the two sums as the words of each int32, and one
 * vpdpwssd that multiplies them by their two sub-blocks' scales into the
 * lane (measured against vpmaddubsw + vpdpwssd per 64: 3 multiplies per 128
 * instead of 4 was 10-35% faster on Zen 4). q in [0, 15] unsigned times y
 * signed: |4-byte sum| <= 4 * 15 * 128 fits a word; each lane gets the sum
 * of sc * (its 4 bytes' sum), the lanes of ztile_q4_k (16). Its float side
 * (one FMA per super-block with d * dy, the min term, the final sums) is
 * vec_dot's own.
 *
 * Rows are unpacked once per pass of tokens into a stack buffer, tokens
 * packed once per pass. Every (row, token) is bit-identical to the table's
 * vec_dot (kernels.h; tests/unit/test_kernels_invariant.c).
 *
 * Installed into the avx512 table by cm_kernels_fill_kq4_avx512 (dispatch.c)
 * after kernels_avx512.c, whose gemm (avx512_kgemm.h) stays the fallback
 * for rows longer than KQ_MAXNB super-blocks and for one token. Stack:
 * ~430 KiB at most (compute threads have CM_COMPUTE_STACK). Never allocates.
 */
#include "isa.h"

#include "base/base.h"

#include <immintrin.h>
#include <string.h>

#define KQ_AI static inline __attribute__((always_inline))

enum {
    KQ_MAXNB = 64,        /* super-blocks per row (k <= 16384) */
    KQ_PASS = 256 * 1024, /* bytes of packed token values per pass (stay in L2 while row tiles walk them) */
    KQ16_R = 2,
    KQ16_T = 4, /* register tile: rows x tokens (the min term: 4 tokens per vector) */
};

static cm_gemm_fn g_prev_q4; /* the table's gemm before ours (long rows) */

/* The same reduction sequence as x86_tiles.h's hsum4. */
KQ_AI float kq_hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Two vectors of 4-byte sums that fit int16 as one of word pairs (d0's low
 * words, d1's as the high ones), for vpdpwssd against two scales. */
KQ_AI __m512i kq_pair(__m512i d0, __m512i d1) {
    return _mm512_mask_blend_epi16(0xaaaaaaaau, d0, _mm512_slli_epi32(d1, 16));
}
KQ_AI __m256i kq_ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
KQ_AI const cm_block_q8_k *kq_tok(const void *x, size_t x_stride, int64_t j) {
    return (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)j * x_stride);
}

/* ---------------- q6_k and q4_k: 16 int32 lanes per super-block ---------------- */

/* One super-block of a row, as the tile reads it: v = 0..3 are 64-byte
 * operands matching the token's v-th vector (kq16_pack); sp[u] pairs v = 2u
 * and 2u + 1 (word 2l, 2l + 1: their scales for lane l's 4 bytes).
 *   q6_k: v = 2c + h: elements 128c + 64h .. +63 (ztile_q6_k's q01 / q23),
 *         as q - 32 (signed); c = -128 * sum over v of the scales times the
 *         lane's (q - 32); the token side is y + 128 in element order.
 *   q4_k: v = 2h: the low nibbles of qs[64h ..] (elements 128h + 0..31 |
 *         128h + 64..95), v = 2h + 1 the high nibbles (128h + 32.. | 128h +
 *         96..), unsigned; c = 0; the token side is y (signed) in that order
 *         (ztile_q4_k's ylo / yhi). */
typedef struct {
    __m512i q[4], c;
    __m512i sp[2]; /* word 2l: lane l's scale in v = 2u, word 2l + 1: in v = 2u + 1 */
    __m128i mn;    /* q4_k: the 8 mins as words */
    float d, dmin;
} kq16_blk;

enum { KQ_Q6, KQ_Q4 };

/* q4_k: lanes 0-7 take scale 4h + (v & 1), lanes 8-15 scale 4h + 2 + (v & 1) */
static const uint16_t k_kq4_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6},
    {5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};

/* sp from the 4 operands' scale words s[v] (word 2l, 2l + 1: lane l's scale) */
KQ_AI void kq_pairs(kq16_blk *o, const __m512i s[4]) {
    for (int u = 0; u < 2; u++) o->sp[u] = _mm512_mask_blend_epi16(0xaaaaaaaau, s[2 * u], s[2 * u + 1]);
}

static void kq4_unpack(int64_t nb, const cm_block_q4_k *x, kq16_blk *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[8], mn[8];
        cm_k4_scales8(x[b].scales, sc, mn);
        const __m512i sc16 =
            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)sc)));
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512(x[b].qs + 64 * h);
            o[b].q[2 * h] = _mm512_and_si512(q, m4);
            o[b].q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        }
        __m512i s[4];
        for (int v = 0; v < 4; v++) s[v] = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_kq4_idx[v]), sc16);
        kq_pairs(&o[b], s);
        o[b].c = _mm512_setzero_si512();
        o[b].mn = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)mn));
        o[b].d = _cvtsh_ss(x[b].d);
        o[b].dmin = _cvtsh_ss(x[b].dmin);
    }
}

/* The pass's tokens [j0, j0 + nt): yp[(t * nb + b) * 256 + 64 v], the token's
 * v-th operand (KIND's order); dy[t * nb + b]; q4_k's min operands pr / ydv
 * [b * ld + t] (ld = nt rounded up to 4, the rest zero). */
static void kq16_pack(int kind, const void *x, size_t x_stride, int64_t j0, int64_t nt, int64_t nb, uint8_t *yp,
                      float *dy, __m128i *pr, __m128 *ydv, int64_t ld) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int64_t t = 0; t < ld; t++) {
        if (t >= nt) {
            for (int64_t b = 0; kind == KQ_Q4 && b < nb; b++)
                pr[b * ld + t] = _mm_setzero_si128(), ydv[b * ld + t] = _mm_setzero_ps();
            continue;
        }
        const cm_block_q8_k *y = kq_tok(x, x_stride, j0 + t);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *d = yp + (t * nb + b) * 256;
            if (kind == KQ_Q6) {
                for (int v = 0; v < 4; v++)
                    _mm512_store_si512((void *)(d + 64 * v),
                                       _mm512_xor_si512(_mm512_loadu_si512(y[b].qs + 64 * v), k128));
            } else {
                for (int h = 0; h < 2; h++) {
                    const int8_t *q = y[b].qs + 128 * h;
                    _mm256_store_si256((__m256i *)(void *)(d + 128 * h), kq_ld256(q));
                    _mm256_store_si256((__m256i *)(void *)(d + 128 * h + 32), kq_ld256(q + 64));
                    _mm256_store_si256((__m256i *)(void *)(d + 128 * h + 64), kq_ld256(q + 32));
                    _mm256_store_si256((__m256i *)(void *)(d + 128 * h + 96), kq_ld256(q + 96));
                }
                const __m256i bs = kq_ld256(y[b].bsums);
                pr[b * ld + t] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                ydv[b * ld + t] = _mm_set1_ps(y[b].d);
            }
            dy[t * nb + b] = y[b].d;
        }
    }
}

/* out[r * KQ16_T + t] for R rows and T tokens (yp / dy / pr / ydv from the tile's first token). */
KQ_AI void kq16_tile(int kind, int64_t nb, const kq16_blk *const *xb, const uint8_t *yp, const float *dy,
                     const __m128i *pr, const __m128 *ydv, int64_t ld, int R, int T, float *out) {
    __m512 af[KQ16_R][KQ16_T], am[KQ16_R];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        am[r] = _mm512_setzero_ps();
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) af[r][t] = _mm512_setzero_ps();
    }
    const __m512i z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        __m512i ai[KQ16_R][KQ16_T];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            const __m512i c = kind == KQ_Q6 ? _mm512_load_si512((const void *)&xb[r][b].c) : _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) ai[r][t] = c;
        }
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
            __m512i q0[KQ16_R], q1[KQ16_R], s[KQ16_R];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                q0[r] = _mm512_load_si512((const void *)&xb[r][b].q[2 * u]);
                q1[r] = _mm512_load_si512((const void *)&xb[r][b].q[2 * u + 1]);
                s[r] = _mm512_load_si512((const void *)&xb[r][b].sp[u]);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                const uint8_t *yt = yp + ((int64_t)t * nb + b) * 256 + 128 * u;
                const __m512i y0 = _mm512_load_si512((const void *)yt), y1 = _mm512_load_si512((const void *)(yt + 64));
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                    const __m512i d0 =
                        kind == KQ_Q6 ? _mm512_dpbusd_epi32(z, y0, q0[r]) : _mm512_dpbusd_epi32(z, q0[r], y0);
                    const __m512i d1 =
                        kind == KQ_Q6 ? _mm512_dpbusd_epi32(z, y1, q1[r]) : _mm512_dpbusd_epi32(z, q1[r], y1);
                    ai[r][t] = _mm512_dpwssd_epi32(ai[r][t], kq_pair(d0, d1), s[r]);
                }
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) af[r][t] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][t]), _mm512_set1_ps(xb[r][b].d * dy[t * nb + b]), af[r][t]);
            if (kind == KQ_Q4) { /* 4 tokens' min terms, one per 128-bit lane */
                const __m512i m = _mm512_madd_epi16(_mm512_broadcast_i32x4(xb[r][b].mn),
                                                    _mm512_load_si512((const void *)(pr + b * ld)));
                am[r] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(m),
                    _mm512_mul_ps(_mm512_set1_ps(xb[r][b].dmin), _mm512_load_ps((const void *)(ydv + b * ld))), am[r]);
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        _Alignas(64) float mv[16];
        _mm512_store_ps(mv, am[r]);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) out[r * KQ16_T + t] =
            kind == KQ_Q4 ? _mm512_reduce_add_ps(af[r][t]) - kq_hsum4(_mm_load_ps(mv + 4 * t))
                          : _mm512_reduce_add_ps(af[r][t]);
    }
}

/* Passes of tokens; per pass KQ16_R rows unpacked at a time, KQ16_T tokens per tile. */
KQ_AI void kq16_gemm(int kind, int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                     int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    enum { CAPMAX = KQ_PASS / (int)CM_QK_K };
    _Alignas(64) kq16_blk buf[KQ16_R * KQ_MAXNB];
    _Alignas(64) uint8_t yp[KQ_PASS];
    float dy[CAPMAX];
    _Alignas(64) __m128i pr[CAPMAX + 4 * KQ_MAXNB];
    _Alignas(64) __m128 ydv[CAPMAX + 4 * KQ_MAXNB];
    const int64_t cap = CAPMAX / nb; /* tokens per pass, >= 16 */
    for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {
        const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap, ld = (nt + 3) & ~(int64_t)3;
        kq16_pack(kind, x, x_stride, j0, nt, nb, yp, dy, pr, ydv, ld);
        for (int64_t i = r0; i < r1; i += KQ16_R) {
            const int R = r1 - i < KQ16_R ? (int)(r1 - i) : KQ16_R;
            const kq16_blk *xb[KQ16_R];
            for (int r = 0; r < R; r++) {
                const void *row = (const char *)w + (size_t)(i + r) * w_stride;
                kq4_unpack(nb, row, buf + r * nb);
                xb[r] = buf + r * nb;
            }
            for (int64_t jj = 0; jj < nt; jj += KQ16_T) {
                const int T = nt - jj < KQ16_T ? (int)(nt - jj) : KQ16_T;
                const uint8_t *yt = yp + jj * nb * 256;
                const float *dt = dy + jj * nb;
                float out[KQ16_R * KQ16_T];
                if (R == KQ16_R && T == KQ16_T)
                    kq16_tile(kind, nb, xb, yt, dt, pr + jj, ydv + jj, ld, KQ16_R, KQ16_T, out);
                else
                    for (int r = 0; r < R; r++) {
                        const kq16_blk *const *xr = xb + r;
                        float *o = out + r * KQ16_T;
                        switch (T) {
                        case 4: kq16_tile(kind, nb, xr, yt, dt, pr + jj, ydv + jj, ld, 1, 4, o); break;
                        case 3: kq16_tile(kind, nb, xr, yt, dt, pr + jj, ydv + jj, ld, 1, 3, o); break;
                        case 2: kq16_tile(kind, nb, xr, yt, dt, pr + jj, ydv + jj, ld, 1, 2, o); break;
                        default: kq16_tile(kind, nb, xr, yt, dt, pr + jj, ydv + jj, ld, 1, 1, o); break;
                        }
                    }
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i + r] = out[r * KQ16_T + t];
            }
        }
    }
}

static void gemm_kq4(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    if (k / CM_QK_K > KQ_MAXNB || n_tok < 2) {
        g_prev_q4(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    kq16_gemm(KQ_Q4, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}

void cm_kernels_fill_kq4_avx512(cm_kernels *k) {
    if (k->gemm[CM_TYPE_Q4_K]) {
        g_prev_q4 = k->gemm[CM_TYPE_Q4_K];
        k->gemm[CM_TYPE_Q4_K] = gemm_kq4;
    }
}
