/*
 * gemm_kq_avx512.c: the AVX-512 (VNNI) prefill gemm for q5_k, with the
 * weights of a register tile's rows held in registers across its tokens.
 * q4_k's gemm is in gemm_kq4_avx512.c, q6_k's in gemm_kq6_avx512.c.
 *
 * q5_k (below): 16 tokens in the int32 lanes, in the table's "z5" float
 * order (avx512_krepack.h), 4 rows x 16 tokens per tile (8 tokens in
 * 256-bit lanes below KT5_W16 tokens); batches of fewer than KT5_MINTOK
 * tokens, and a larger batch's last n_tok % 16 when at most 5, go to
 * gemv_kd_avx512.c's rows (kd5_multi: each super-block's values built once
 * for up to 6 tokens), whose table entry wraps this one.
 *
 * Rows are unpacked once per pass of tokens into a stack buffer, tokens
 * packed once per pass. Every (row, token) is bit-identical to the table's
 * vec_dot (kernels.h; tests/unit/test_kernels_invariant.c). The same gemm
 * over "q5_k lanes" rows is the table's gemm_packed (gemm_pq5: the weights
 * held once, repack.c; tests/unit/test_kernels_repack.c).
 *
 * Installed into the avx512 table by cm_kernels_fill_kq_avx512 (dispatch.c)
 * after kernels_avx512.c, whose q5_k gemm (the decode gemv per token) stays
 * the fallback for rows longer than KQ_MAXNB super-blocks and for one token.
 * Stack: ~430 KiB at most (compute threads have CM_COMPUTE_STACK). Never
 * allocates.
 */
#include "isa.h"

#include "avx512_ktok.h"

#include "base/base.h"

#include <immintrin.h>
#include <string.h>

#include "avx512_kpacked.h"

#define KQ_AI static inline __attribute__((always_inline))

enum { KQ_MAXNB = 64 }; /* super-blocks per row (k <= 16384) */

static cm_gemm_fn g_prev_q5; /* the table's gemm before ours (long rows) */

KQ_AI __m256i kq_ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

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
    KT5_R = 4,      /* rows per tile */
    KT5_MINTOK = 7, /* fewer leave most lanes empty: gemv_kd_avx512.c's kd5_multi (rk5_multi past its rows) */
    KT5_W16 = 9,    /* fewer: one group of 8 tokens in 256-bit lanes (kt5_rows8) */
    KT5_RB = 16,    /* rows whose results are staged, then stored a token's 16 at a time: stores of single
                           floats ldy apart (often a multiple of 4 KiB: one L1 set) cost ~15% at 2048 x 1024 */
    KT5_YT = 256,   /* most tokens per pass (the staging buffer's) */
    KT5_PASS = KQ_MAXNB * KT_TOKB, /* one group of 16 tokens of the longest row */
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

/* Per super-block: the scales and mins by cm_k4_scales8's bit arithmetic on
 * three dwords (sub-blocks 0-3 / 4-7 in the bytes of one dword each), the
 * values as q - 16, and sum_j sc_j sum(q) by vpmaddubsw of the 5-bit values
 * (unsigned) against their sub-block's scale (each word <= 8 * 2 * 31 * 63:
 * no saturation) then vpmaddwd: no scalar work per value. */
static void kt5_unpack(int64_t nb, const cm_block_q5_k *xr, kt5_blk *o, bool lanes) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1), k16 = _mm256_set1_epi8(16);
    for (int64_t b = 0; b < nb; b++) {
        cm_block_q5_k tmp; /* lanes: the row is "q5_k lanes": this super-block in the file's form */
        if (lanes) kp_q5_blk((const uint8_t *)xr, nb, b, &tmp);
        const cm_block_q5_k *x = lanes ? &tmp : xr + b;
        uint32_t u[3];
        memcpy(u, x->scales, 12);
        const uint32_t sc03 = u[0] & 0x3f3f3f3fu, mn03 = u[1] & 0x3f3f3f3fu;
        const uint32_t sc47 = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
        const uint32_t mn47 = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
        const __m128i s8 = _mm_cvtsi64_si128((long long)((uint64_t)sc03 | (uint64_t)sc47 << 32));
        const __m128i m8 = _mm_cvtsi64_si128((long long)((uint64_t)mn03 | (uint64_t)mn47 << 32));
        _mm256_storeu_si256((__m256i *)(void *)o[b].sc, _mm256_cvtepu8_epi32(s8));
        _mm_storeu_si128((__m128i *)(void *)o[b].sw, _mm_slli_epi16(_mm_cvtepu8_epi16(s8), 4));
        _mm_storeu_si128((__m128i *)(void *)o[b].mw, _mm_cvtepu8_epi16(m8));
        __m256i qh = kq_ld256(x->qh), acc = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) { /* elements 64j.. (low nibbles, bit 2j), 64j+32.. (high, bit 2j+1) */
            const __m256i q = kq_ld256(x->qs + 32 * j);
            const __m256i lo =
                _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
            qh = _mm256_srli_epi16(qh, 2);
            _mm256_store_si256((__m256i *)(void *)(o[b].q + 64 * j), _mm256_sub_epi8(lo, k16));
            _mm256_store_si256((__m256i *)(void *)(o[b].q + 64 * j + 32), _mm256_sub_epi8(hi, k16));
            const uint32_t sj = j < 2 ? sc03 >> 16 * j : sc47 >> 16 * (j - 2); /* scales 2j, 2j + 1 */
            acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(lo, _mm256_set1_epi8((char)(sj & 0xff))));
            acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(hi, _mm256_set1_epi8((char)(sj >> 8 & 0xff))));
        }
        const __m256i d32 = _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(d32), _mm256_extracti128_si256(d32, 1));
        h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
        const int32_t ssum = _mm_cvtsi128_si32(_mm_sad_epu8(s8, _mm_setzero_si128())); /* sum_j sc_j */
        o[b].k = -128 * (_mm_cvtsi128_si32(h) - 512 * ssum);                           /* -128 sum_j sc_j Q_j */
        o[b].d = _cvtsh_ss(x->d);
        o[b].ndmin = -_cvtsh_ss(x->dmin);
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
        const uint8_t *pb = pg + (size_t)b * KT_TOKB;
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
        const uint8_t *pb = pg + (size_t)b * (KT_TOKB / 2);
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

/* "q5_k lanes" rows back to the file's bytes (avx512_kpacked.h) */
static void kq5_unlanes(int64_t nb, const uint8_t *src, cm_block_q5_k *dst) {
    for (int64_t b = 0; b < nb; b++) kp_q5_blk(src, nb, b, dst + b);
}
KQ_AI void kq5_prev_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                         int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    g_prev_q5(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}
KP_GEMM(gemm_pq5_prev, cm_block_q5_k, kq5_unlanes, kq5_prev_gemm)

/* lanes: w is "q5_k lanes" (the table's gemm_packed, gemm_pq5) */
KQ_AI void kq5_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                    int64_t r0, int64_t r1, int64_t n_tok, bool lanes) {
    const int64_t nb = k / CM_QK_K;
    if (nb > KQ_MAXNB || n_tok < KT5_MINTOK) { /* few tokens: avx512_krepack.h's rows (z5 too) */
        if (lanes) gemm_pq5_prev(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        else g_prev_q5(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) uint8_t pk[KT5_PASS];
    _Alignas(64) kt5_blk ub[KT5_R][KQ_MAXNB];
    _Alignas(64) float yb[KT5_YT][KT5_RB];    /* a block of rows' results, token-major */
    const int W = n_tok < KT5_W16 ? 8 : 16;   /* tokens per group: 256-bit lanes for a few-token batch */
    const int64_t gb = nb * KT_TOKB / 16 * W; /* groups per pass: */
    const int64_t gcap = (int64_t)sizeof pk / gb < KT5_YT / W ? (int64_t)sizeof pk / gb : KT5_YT / W;
    for (int64_t j0 = 0; j0 < n_tok; j0 += gcap * W) {
        const int64_t left = n_tok - j0, ng = (left + W - 1) / W < gcap ? (left + W - 1) / W : gcap;
        const int64_t np = left < ng * W ? left : ng * W; /* tokens in this pass */
        for (int64_t g = 0; g < ng; g++)
            kt_pack(x, x_stride, j0 + W * g, left - W * g < W ? (int)(left - W * g) : W, W, nb, pk + g * gb);
        for (int64_t ib = r0; ib < r1; ib += KT5_RB) {
            const int64_t ie = r1 - ib < KT5_RB ? r1 : ib + KT5_RB;
            for (int64_t i = ib; i < ie; i += KT5_R) {
                const int R = ie - i < KT5_R ? (int)(ie - i) : KT5_R;
                const kt5_blk *xb[KT5_R];
                for (int r = 0; r < R; r++) {
                    kt5_unpack(nb, (const cm_block_q5_k *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),
                               ub[r], lanes);
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
                        for (int t = 0; t < T; t++) yb[W * g + t][i - ib + r] = W == 16 ? out[r][t] : o8[r][t];
                }
            }
            for (int64_t t = 0; t < np; t++) memcpy(y + (j0 + t) * ldy + ib, yb[t], sizeof(float) * (size_t)(ie - ib));
        }
    }
}

static void gemm_kq5(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    kq5_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

/* The table's gemm_packed for q5_k: the same over "q5_k lanes" (repack.c),
 * each super-block put back in the file's form as a row is unpacked (once
 * per pass of tokens), so that the file's pages can go back
 * (cm_repack_give_back). gemv_kd_avx512.c and gemm_kq45_amx.c wrap it as
 * they wrap gemm_kq5. */
static void gemm_pq5(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                     int64_t r0, int64_t r1, int64_t n_tok) {
    kq5_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

void cm_kernels_fill_kq_avx512(cm_kernels *k) {
    if (k->gemm[CM_TYPE_Q5_K]) {
        g_prev_q5 = k->gemm[CM_TYPE_Q5_K];
        k->gemm[CM_TYPE_Q5_K] = gemm_kq5;
        if (k->gemv_packed[CM_TYPE_Q5_K]) k->gemm_packed[CM_TYPE_Q5_K] = gemm_pq5;
    }
}
