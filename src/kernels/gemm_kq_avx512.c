/*
 * gemm_kq_avx512.c: AVX-512 (VNNI) prefill gemms for q4_k and q5_k
 * with the weights of a register tile's rows held in registers across its
 * tokens.
 *
 * q4_k: per 128 weight x token products two vpdpbusd (4-byte sums),
 * one shift and one blend that pack the two sums as the words of each int32,
 * and one vpdpwssd that multiplies them by their two sub-blocks' scales into
 * the lane (measured against vpmaddubsw + vpdpwssd per 64: 3 multiplies per
 * 128 instead of 4 was 10-35% faster on Zen 4). q in [0, 15] unsigned times
 * y signed: |4-byte sum| <= 4 * 15 * 128 fits a word; each lane gets the sum
 * of sc * (its 4 bytes' sum), the lanes of ztile_q4_k (16). Its float side
 * (one FMA per super-block with d * dy, the min term, the final sums) is
 * vec_dot's own.
 *
 * q5_k (below): 16 tokens in the int32 lanes, in the table's "z5" float
 * order (avx512_krepack.h), 4 rows x 16 tokens per tile.
 *
 * q6_k: gemm_kq6_avx512.c.
 *
 * Rows are unpacked once per pass of tokens into a stack buffer, tokens
 * packed once per pass. Every (row, token) is bit-identical to the table's
 * vec_dot (kernels.h; tests/unit/test_kernels_invariant.c).
 *
 * Installed into the avx512 table by cm_kernels_fill_kq_avx512 (dispatch.c)
 * after kernels_avx512.c, whose gemms (avx512_kgemm.h; q5_k: the decode gemv per token) stay the fallback for rows longer
 * than KQ_MAXNB super-blocks and for one token (q5_k: fewer than 4). Stack: ~430 KiB at most (compute threads have
 * CM_COMPUTE_STACK). Never allocates.
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
    KQ16_T = 4, /* q6_k / q4_k register tile: rows x tokens (q4_k's min term: 4 tokens per vector) */
};

static cm_gemm_fn g_prev_q4, g_prev_q5; /* the table's gemms before ours (long rows) */

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

/* ---------------- q5_k: tokens in lanes ----------------
 * The avx512 table's q5_k dot ("z5", avx512_krepack.h): per super-block b
 * the exact integer sums S_b (sub-block scales times sum(q * y)) and M_b
 * (mins times the token's bsums pairs), each converted once; into float lane
 * b % 16 one FMA of S_b with d * dy, then one of M_b with -(dmin * dy); the
 * 16 lanes summed at the end in _mm512_reduce_add_ps's tree. Here int32 lane
 * t is token t of a group of 16 (q4_0's lane scheme, avx512_gemm.h), so the
 * 16 float lanes of z5 are 16 vectors per row (KT5_A, on the stack) and the
 * final tree runs across them. Tokens are packed once per pass as y + 128
 * (unsigned), rows unpacked once per pass as q - 16 (signed, broadcast a
 * dword at a time); per sub-block j a chain of 8 vpdpbusd gives D_j =
 * sum((y + 128)(q - 16)), then one vpmulld by its scale. Since
 * sum(y q) = D_j - 128 Q_j + 16 Y_j (Q_j = sum(q - 16), Y_j = the token's
 * sum over j): S_b starts from -128 sum_j sc_j Q_j (the row's) and gets
 * 16 sum_j sc_j Y_j with 4 vpdpwssd (words 16 sc_j against Y_j), M_b with 4
 * more (mins against Y_j). Per super-block, row and 16 tokens: 64 vpdpbusd,
 * 8 vpmulld, 8 vpdpwssd; the token operand loaded once for KT5_R rows. */
enum {
    KT5_R = 4,          /* rows per tile */
    KT5_MINTOK = 8,     /* fewer tokens leave most lanes empty: rk5_multi (a row unpacked once for up to 8 tokens) */
    KT5_TOKB = 69 * 64, /* a token group's super-block: 64 value vectors, 4 Y pair vectors, dy */
    KT5_PASS = KQ_MAXNB * KT5_TOKB, /* one group of 16 tokens of the longest row */
    KT5_ROWB =
        256 + 8 * 4 + 4 * 4 * 2 + 4 * 4, /* a row's super-block: q - 16, sc, 16 sc pairs, mn pairs, K, d, -dmin */
};

typedef struct {
    _Alignas(64) int8_t q[256]; /* q - 16 in element order */
    int32_t sc[8];              /* the sub-blocks' scales */
    int32_t sw[4];              /* words 16 sc_2u, 16 sc_2u+1 */
    int32_t mw[4];              /* words mn_2u, mn_2u+1 */
    int32_t k;                  /* -128 sum_j sc_j Q_j */
    float d, ndmin;             /* d, -dmin */
    int32_t pad;
} kt5_blk;

static void kt5_unpack(int64_t nb, const cm_block_q5_k *x, kt5_blk *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1), k16 = _mm256_set1_epi8(16);
    const __m256i z = _mm256_setzero_si256();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t s8[8], m8[8];
        cm_k4_scales8(x[b].scales, s8, m8);
        __m256i qh = kq_ld256(x[b].qh);
        int32_t k = 0;
        for (int j = 0; j < 4; j++) { /* elements 64j.. (low nibbles, bit 2j), 64j+32.. (high, bit 2j+1) */
            const __m256i q = kq_ld256(x[b].qs + 32 * j);
            const __m256i lo =
                _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
            qh = _mm256_srli_epi16(qh, 2);
            _mm256_store_si256((__m256i *)(void *)(o[b].q + 64 * j), _mm256_sub_epi8(lo, k16));
            _mm256_store_si256((__m256i *)(void *)(o[b].q + 64 * j + 32), _mm256_sub_epi8(hi, k16));
            _Alignas(32) int64_t sl[4], sh[4];
            _mm256_store_si256((__m256i *)(void *)sl, _mm256_sad_epu8(lo, z));
            _mm256_store_si256((__m256i *)(void *)sh, _mm256_sad_epu8(hi, z));
            k += s8[2 * j] * ((int32_t)(sl[0] + sl[1] + sl[2] + sl[3]) - 512) +
                 s8[2 * j + 1] * ((int32_t)(sh[0] + sh[1] + sh[2] + sh[3]) - 512);
        }
        for (int j = 0; j < 8; j++) o[b].sc[j] = s8[j];
        for (int u = 0; u < 4; u++) {
            o[b].sw[u] = (int32_t)((uint32_t)(16 * s8[2 * u]) | (uint32_t)(16 * s8[2 * u + 1]) << 16);
            o[b].mw[u] = (int32_t)((uint32_t)m8[2 * u] | (uint32_t)m8[2 * u + 1] << 16);
        }
        o[b].k = -128 * k;
        o[b].d = _cvtsh_ss(x[b].d);
        o[b].ndmin = -_cvtsh_ss(x[b].dmin);
    }
}

/* Tokens j0 + t (t < T <= W, W = 16 or 8 lanes) into one group: per
 * super-block 64 vectors (lane t: token t's y[4c..4c+3] + 128), 4 vectors of
 * word pairs (Y_2u, Y_2u+1), dy; lanes past T zero (their sums are unused). */
static void kt5_pack(const void *x, size_t x_stride, int64_t j0, int T, int W, int64_t nb, uint8_t *o) {
    for (int64_t b = 0; b < nb; b++) {
        uint32_t *a = (uint32_t *)(void *)(o + (size_t)b * KT5_TOKB / 16 * (size_t)W);
        uint32_t *yw = a + 64 * W;
        float *dy = (float *)(void *)(yw + 4 * W);
        for (int t = 0; t < W; t++) {
            if (t >= T) {
                for (int c = 0; c < 64; c++) a[c * W + t] = 0;
                for (int u = 0; u < 4; u++) yw[u * W + t] = 0;
                dy[t] = 0.0f;
                continue;
            }
            const cm_block_q8_k *y = kq_tok(x, x_stride, j0 + t) + b;
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

KQ_AI int32_t kt5_ld(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* R rows (xb: their unpacked super-blocks) against one packed group of 16
 * tokens: out[r][t] (z5's bits for each (row, token)). */
KQ_AI void kt5_rows(int64_t nb, const kt5_blk *const *xb, const uint8_t *pg, int R, float (*out)[16]) {
    __m512 A[KT5_R][16];
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 16; l++) A[r][l] = _mm512_setzero_ps();
    const __m512i z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pg + (size_t)b * KT5_TOKB;
        __m512i S[KT5_R], C[KT5_R];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) S[r] = _mm512_set1_epi32(xb[r][b].k);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                const __m512i a = _mm512_load_si512((const void *)(pb + 64 * (8 * j + c)));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) C[r] =
                    _mm512_dpbusd_epi32(c ? C[r] : z, a, _mm512_set1_epi32(kt5_ld(xb[r][b].q + 32 * j + 4 * c)));
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) S[r] =
                _mm512_add_epi32(S[r], _mm512_mullo_epi32(C[r], _mm512_set1_epi32(xb[r][b].sc[j])));
        }
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
            const __m512i yw = _mm512_load_si512((const void *)(pb + 64 * (64 + u)));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                S[r] = _mm512_dpwssd_epi32(S[r], yw, _mm512_set1_epi32(xb[r][b].sw[u]));
                C[r] = _mm512_dpwssd_epi32(u ? C[r] : z, yw, _mm512_set1_epi32(xb[r][b].mw[u]));
            }
        }
        const __m512 dy = _mm512_load_ps((const void *)(pb + 64 * 68));
        const int l = (int)(b & 15);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m512 acc =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[r]), _mm512_mul_ps(_mm512_set1_ps(xb[r][b].d), dy), A[r][l]);
            A[r][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(C[r]), _mm512_mul_ps(_mm512_set1_ps(xb[r][b].ndmin), dy), acc);
        }
    }
    for (int r = 0; r < R; r++) { /* _mm512_reduce_add_ps's tree (z5_reduce), for 16 tokens at once */
        __m512 h[8];
        for (int i = 0; i < 8; i++) h[i] = _mm512_add_ps(A[r][i + 8], A[r][i]);
        for (int i = 0; i < 4; i++) h[i] = _mm512_add_ps(h[i + 4], h[i]);
        const __m512 e0 = _mm512_add_ps(h[0], h[2]), e1 = _mm512_add_ps(h[1], h[3]);
        _mm512_storeu_ps(out[r], _mm512_add_ps(e0, e1));
    }
}

/* kt5_rows with 256-bit vectors: a group of 8 tokens (few-token batches). */
KQ_AI void kt5_rows8(int64_t nb, const kt5_blk *const *xb, const uint8_t *pg, int R, float (*out)[8]) {
    __m256 A[KT5_R][16];
    for (int r = 0; r < R; r++)
        for (int l = 0; l < 16; l++) A[r][l] = _mm256_setzero_ps();
    const __m256i z = _mm256_setzero_si256();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pg + (size_t)b * (KT5_TOKB / 2);
        __m256i S[KT5_R], C[KT5_R];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) S[r] = _mm256_set1_epi32(xb[r][b].k);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                const __m256i a = _mm256_load_si256((const __m256i *)(const void *)(pb + 32 * (8 * j + c)));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) C[r] =
                    _mm256_dpbusd_epi32(c ? C[r] : z, a, _mm256_set1_epi32(kt5_ld(xb[r][b].q + 32 * j + 4 * c)));
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) S[r] =
                _mm256_add_epi32(S[r], _mm256_mullo_epi32(C[r], _mm256_set1_epi32(xb[r][b].sc[j])));
        }
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
            const __m256i yw = _mm256_load_si256((const __m256i *)(const void *)(pb + 32 * (64 + u)));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                S[r] = _mm256_dpwssd_epi32(S[r], yw, _mm256_set1_epi32(xb[r][b].sw[u]));
                C[r] = _mm256_dpwssd_epi32(u ? C[r] : z, yw, _mm256_set1_epi32(xb[r][b].mw[u]));
            }
        }
        const __m256 dy = _mm256_load_ps((const void *)(pb + 32 * 68));
        const int l = (int)(b & 15);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m256 acc =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[r]), _mm256_mul_ps(_mm256_set1_ps(xb[r][b].d), dy), A[r][l]);
            A[r][l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(C[r]), _mm256_mul_ps(_mm256_set1_ps(xb[r][b].ndmin), dy), acc);
        }
    }
    for (int r = 0; r < R; r++) { /* _mm512_reduce_add_ps's tree (z5_reduce), for 16 tokens at once */
        __m256 h[8];
        for (int i = 0; i < 8; i++) h[i] = _mm256_add_ps(A[r][i + 8], A[r][i]);
        for (int i = 0; i < 4; i++) h[i] = _mm256_add_ps(h[i + 4], h[i]);
        const __m256 e0 = _mm256_add_ps(h[0], h[2]), e1 = _mm256_add_ps(h[1], h[3]);
        _mm256_storeu_ps(out[r], _mm256_add_ps(e0, e1));
    }
}

static void gemm_kq5(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    if (nb > KQ_MAXNB || n_tok < KT5_MINTOK) { /* few tokens: avx512_krepack.h's rows (z5 too) */
        g_prev_q5(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) uint8_t pk[KT5_PASS];
    _Alignas(64) kt5_blk ub[KT5_R][KQ_MAXNB];
    const int W = n_tok < 16 ? 8 : 16; /* tokens per group: 256-bit lanes for a few-token batch */
    const int64_t gb = nb * KT5_TOKB / 16 * W, gcap = (int64_t)sizeof pk / gb; /* groups per pass */
    for (int64_t j0 = 0; j0 < n_tok; j0 += gcap * W) {
        const int64_t left = n_tok - j0, ng = (left + W - 1) / W < gcap ? (left + W - 1) / W : gcap;
        for (int64_t g = 0; g < ng; g++)
            kt5_pack(x, x_stride, j0 + W * g, left - W * g < W ? (int)(left - W * g) : W, W, nb, pk + g * gb);
        for (int64_t i = r0; i < r1; i += KT5_R) {
            const int R = r1 - i < KT5_R ? (int)(r1 - i) : KT5_R;
            const kt5_blk *xb[KT5_R];
            for (int r = 0; r < R; r++) {
                kt5_unpack(nb, (const cm_block_q5_k *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),
                           ub[r]);
                xb[r] = ub[r];
            }
            for (int64_t g = 0; g < ng; g++) {
                float out[KT5_R][16];
                float(*o8)[8] = (float(*)[8])(void *)out; /* W = 8: rows 8 floats apart */
                const uint8_t *pg = pk + g * gb;
                if (W == 16) switch (R) {
                    case 4: kt5_rows(nb, xb, pg, 4, out); break;
                    case 3: kt5_rows(nb, xb, pg, 3, out); break;
                    case 2: kt5_rows(nb, xb, pg, 2, out); break;
                    default: kt5_rows(nb, xb, pg, 1, out); break;
                    }
                else switch (R) {
                    case 4: kt5_rows8(nb, xb, pg, 4, o8); break;
                    case 3: kt5_rows8(nb, xb, pg, 3, o8); break;
                    case 2: kt5_rows8(nb, xb, pg, 2, o8); break;
                    default: kt5_rows8(nb, xb, pg, 1, o8); break;
                    }
                const int T = left - W * g < W ? (int)(left - W * g) : W;
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) y[(j0 + W * g + t) * ldy + i + r] = W == 16 ? out[r][t] : o8[r][t];
            }
        }
    }
}

void cm_kernels_fill_kq_avx512(cm_kernels *k) {
    if (k->gemm[CM_TYPE_Q4_K]) {
        g_prev_q4 = k->gemm[CM_TYPE_Q4_K];
        k->gemm[CM_TYPE_Q4_K] = gemm_kq4;
    }
    if (k->gemm[CM_TYPE_Q5_K]) {
        g_prev_q5 = k->gemm[CM_TYPE_Q5_K];
        k->gemm[CM_TYPE_Q5_K] = gemm_kq5;
    }
}
