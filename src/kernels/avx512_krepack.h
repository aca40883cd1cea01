/*
 * avx512_krepack.h: the AVX-512 k-quant decode gemvs over rows repacked at
 * load (repack.c) and q5_k's and q6_k's plain ones. Not a header in the
 * usual sense: kernels_avx512.c includes it once, after avx512_gemm.h and
 * avx512_kgemm.h, under its own ISA flags. Nothing else may include it.
 * (q4_k's, over "q4_k lanes" too, are gemm_kq4_avx512.c's.)
 *
 * q5_k over "q5_k lanes" with the word-pair arithmetic (the fifth bit added
 * to each 64 weights on the fly) in the table's own float order "z5" (below,
 * also its vec_dot); the same row function over the file's bytes is q5_k's
 * plain decode gemv (a file that is mapped, not read).
 */

#include "x86_krepack.h"

/* 32 words: block j's scale i (i < 4) at 4j + i, scale 4 + i at 16 + 4j + i. */
AI __m512i rk_scale_words(__m128i sc03, __m128i sc47) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi16(sc03)), _mm256_cvtepu8_epi16(sc47), 1);
}

/* ---- q5_k: the avx512 table's own float order ("z5", shared by vec_dot,
 * both decode gemvs and gemm_kq_avx512.c's prefill gemm): per super-block b
 * the exact integer sums S_b (its 8 sub-blocks' scale times sum(q * y)) and
 * M_b (its 8 mins times the token's bsums pairs), each converted once; into
 * float lane b % 16 one FMA of S_b with d * dy, then one of M_b with
 * -(dmin * dy); the 16 lanes summed at the end by _mm512_reduce_add_ps. How
 * S_b and M_b are formed is free (integers): here kg5_tile's 8 lanes (the
 * fifth bit added on the fly, the token read as it is) and one madd, summed
 * 16 super-blocks at a time; the gemm puts super-blocks in lanes. ---- */
enum { RK5_GROUP = 4 * (int)sizeof(cm_block_q5_k) };

/* One super-block's 8 lanes (their sum is S_b) and 4 min lanes in *m (their sum is M_b).
 * qs and qh (the file's order), the word pairs s[h] (kg5_blk's), mins as
 * words, dmin; y the token's block, pairs its bsums pair sums. */
/* The 5-bit values of elements 64j .. 64j + 63 (v[j]: low nibbles in the
 * low 256 bits, high nibbles in the high) from qs and qh (the file's order). */
AI void rk5_vals(const uint8_t *qs, const uint8_t *qh, __m512i v[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    const __m512i nsh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1); /* lo | hi nibbles */
    const __m512i h5 = _mm512_broadcast_i64x4(ld256(qh));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) { /* bits 2j (low nibbles) and 2j+1 (high) of qh */
        const __m512i q = _mm512_broadcast_i64x4(ld256(qs + 32 * j));
        const __m512i hb =
            _mm512_srlv_epi16(h5, _mm512_add_epi16(_mm512_srli_epi16(nsh, 2), _mm512_set1_epi16((short)(2 * j))));
        v[j] = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(q, nsh), m4),
                               _mm512_slli_epi16(_mm512_and_si512(hb, one), 4));
    }
}

/* One super-block's 8 lanes against token block y (their sum is S_b) and 4
 * min lanes in *m (their sum is M_b): v its values (rk5_vals), s[h] the
 * word pairs (kg5_blk's), mn16 the mins as words, pairs y's bsums pairs. */
AI __m256i rk5_dot(const __m512i v[4], const __m512i s[2], __m128i mn16, const cm_block_q8_k *y, __m128i pairs,
                   __m128i *m) {
    const __m512i z = _mm512_setzero_si512();
    __m512i s16 = z;
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m512i d0 = _mm512_dpbusd_epi32(z, v[2 * h], _mm512_loadu_si512(y->qs + 128 * h));
        const __m512i d1 = _mm512_dpbusd_epi32(z, v[2 * h + 1], _mm512_loadu_si512(y->qs + 128 * h + 64));
        s16 = _mm512_dpwssd_epi32(s16, _mm512_mask_blend_epi16(0xaaaaaaaau, d0, _mm512_slli_epi32(d1, 16)), s[h]);
    }
    *m = _mm_madd_epi16(mn16, pairs);
    return _mm256_add_epi32(_mm512_castsi512_si256(s16), _mm512_extracti64x4_epi64(s16, 1));
}

AI __m256i rk5_block(const uint8_t *qs, const uint8_t *qh, const __m512i s[2], __m128i mn16, const cm_block_q8_k *y,
                     __m128i pairs, __m128i *m) {
    __m512i v[4];
    rk5_vals(qs, qh, v);
    return rk5_dot(v, s, mn16, y, pairs, m);
}

/* The bsums pair sums of one token block, as kmins forms them. */
AI __m128i rk5_pair(const cm_block_q8_k *y) {
    const __m256i bs = ld256(y->bsums);
    return _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
}

/* A row of nb super-blocks in z5's order; grouped: repacked ("q5_k lanes"),
 * else the file's bytes (every block as a tail block); pairs: the token's
 * bsums pair sums, or NULL (formed here). */
AI float rk5_row(int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const __m128i *pairs, bool grouped) {
    rk5_acc A = {_mm512_setzero_ps(),    _mm512_setzero_ps(),    _mm512_setzero_ps(),
                 _mm512_setzero_si512(), _mm512_setzero_si512(), 0};
    const __m128 sgn = _mm_set1_ps(-0.0f);
    /* word 2l (l < 8): scale 4h of block j; 2l+1: 4h+2; l >= 8: 4h+1, 4h+3 */
    static const uint16_t k_base[32] = {0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
                                        1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3};
    const __m512i base = _mm512_loadu_si512(k_base);
    int64_t b = 0;
    for (; grouped && b + 4 <= nb; b += 4, x += RK5_GROUP) {
        float dd[8];
        __m128i sc03, sc47, mn16[4];
        rk_header(x, dd, &sc03, &sc47, mn16);
        const __m512i sw = rk_scale_words(sc03, sc47);
        __m256i sl[4];
        __m128i ml[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            const __m512i s[2] = {
                _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * j))), sw),
                _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(16 + 4 * j))), sw)};
            sl[j] = rk5_block(x + 192 + 128 * j, x + 64 + 32 * j, s, mn16[j], y + b + j,
                              pairs ? pairs[b + j] : rk5_pair(y + b + j), &ml[j]);
        }
        __m128i S4, M4;
        rk5_quad(sl, ml, &S4, &M4);
        const __m128 dy = _mm_setr_ps(y[b].d, y[b + 1].d, y[b + 2].d, y[b + 3].d);
        rk5_put(&A, S4, M4, _mm_mul_ps(_mm_loadu_ps(dd), dy), _mm_xor_ps(_mm_mul_ps(_mm_loadu_ps(dd + 4), dy), sgn));
    }
    const cm_block_q5_k *xt = (const cm_block_q5_k *)(const void *)x;
    __m256i sl[4];
    __m128i ml[4];
    _Alignas(16) float d4[4], m4[4], y4[4];
    int n = 0;
    for (; b < nb; b++, xt++) { /* the file's order, gathered 4 blocks at a time */
        uint8_t sc[8], mn[8];
        cm_k4_scales8(xt->scales, sc, mn);
        __m512i s[2];
        for (int h = 0; h < 2; h++)
            s[h] = _mm512_inserti64x4(_mm512_set1_epi32((int)(sc[4 * h] | (uint32_t)sc[4 * h + 2] << 16)),
                                      _mm256_set1_epi32((int)(sc[4 * h + 1] | (uint32_t)sc[4 * h + 3] << 16)), 1);
        sl[n] = rk5_block(xt->qs, xt->qh, s, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), y + b,
                          pairs ? pairs[b] : rk5_pair(y + b), &ml[n]);
        d4[n] = f16f(xt->d), m4[n] = f16f(xt->dmin), y4[n] = y[b].d;
        if (++n == 4 || b == nb - 1) {
            for (; n < 4; n++)
                sl[n] = _mm256_setzero_si256(), ml[n] = _mm_setzero_si128(), d4[n] = m4[n] = y4[n] = 0.0f;
            __m128i S4, M4;
            rk5_quad(sl, ml, &S4, &M4);
            const __m128 dy = _mm_load_ps(y4);
            rk5_put(&A, S4, M4, _mm_mul_ps(_mm_load_ps(d4), dy), _mm_xor_ps(_mm_mul_ps(_mm_load_ps(m4), dy), sgn));
            n = 0;
        }
    }
    return rk5_end(&A);
}

/* The avx512 table's q5_k dot (z5). */
static void vec_dot_zq5_k(int64_t n, float *s, const void *x, const void *y) {
    *s = rk5_row(n / CM_QK_K, x, y, NULL, false);
}

/* z5 for T (<= RK5_MT) tokens yv[t] against one row of the file's bytes,
 * the row's values unpacked once per super-block for all of them: out[t]
 * is vec_dot's bits (the same integers and float steps per token). */
enum { RK5_MT = 8 };
AI void rk5_multi(int64_t nb, const cm_block_q5_k *x, const cm_block_q8_k *const *yv, int T, float *out) {
    rk5_acc A[RK5_MT];
    __m256i sl[RK5_MT][4];
    __m128i ml[RK5_MT][4];
    _Alignas(16) float d4[4], m4[4], y4[RK5_MT][4];
    const __m128 sgn = _mm_set1_ps(-0.0f);
    for (int t = 0; t < T; t++)
        A[t] = (rk5_acc){_mm512_setzero_ps(),    _mm512_setzero_ps(),    _mm512_setzero_ps(),
                         _mm512_setzero_si512(), _mm512_setzero_si512(), 0};
    int n = 0;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[8], mn[8];
        cm_k4_scales8(x[b].scales, sc, mn);
        __m512i s[2], v[4];
        for (int h = 0; h < 2; h++)
            s[h] = _mm512_inserti64x4(_mm512_set1_epi32((int)(sc[4 * h] | (uint32_t)sc[4 * h + 2] << 16)),
                                      _mm256_set1_epi32((int)(sc[4 * h + 1] | (uint32_t)sc[4 * h + 3] << 16)), 1);
        const __m128i mn16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        rk5_vals(x[b].qs, x[b].qh, v);
        for (int t = 0; t < T; t++) {
            sl[t][n] = rk5_dot(v, s, mn16, yv[t] + b, rk5_pair(yv[t] + b), &ml[t][n]);
            y4[t][n] = yv[t][b].d;
        }
        d4[n] = f16f(x[b].d), m4[n] = f16f(x[b].dmin);
        if (++n == 4 || b == nb - 1) {
            for (; n < 4; n++) {
                d4[n] = m4[n] = 0.0f;
                for (int t = 0; t < T; t++)
                    sl[t][n] = _mm256_setzero_si256(), ml[t][n] = _mm_setzero_si128(), y4[t][n] = 0.0f;
            }
            for (int t = 0; t < T; t++) {
                __m128i S4, M4;
                rk5_quad(sl[t], ml[t], &S4, &M4);
                const __m128 dy = _mm_load_ps(y4[t]);
                rk5_put(&A[t], S4, M4, _mm_mul_ps(_mm_load_ps(d4), dy),
                        _mm_xor_ps(_mm_mul_ps(_mm_load_ps(m4), dy), sgn));
            }
            n = 0;
        }
    }
    for (int t = 0; t < T; t++) out[t] = rk5_end(&A[t]);
}

#define GEMV_RK5(NAME, GROUPED)                                                                                        \
    static void NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy, \
                     int64_t r0, int64_t r1, int64_t n_tok) {                                                          \
        (void)x_stride, (void)ldy, (void)n_tok;                                                                        \
        const int64_t nb = k / CM_QK_K;                                                                                \
        if (nb > RK4_MAXB) {                                                                                           \
            for (int64_t i = r0; i < r1; i++) vec_dot_zq5_k(k, &y[i], (const char *)w + (size_t)i * w_stride, x);      \
            return;                                                                                                    \
        }                                                                                                              \
        __m128i pairs[RK4_MAXB];                                                                                       \
        rk_pairs(nb, x, pairs);                                                                                        \
        for (int64_t i = r0; i < r1; i++)                                                                              \
            y[i] = rk5_row(nb, (const uint8_t *)w + (size_t)i * w_stride, x, pairs, GROUPED);                          \
    }
GEMV_RK5(gemv_rq5_k, true)  /* over "q5_k lanes" (repack.c) */
GEMV_RK5(gemv_fq5_k, false) /* over the file's bytes */

/* z5 for any number of tokens: up to RK5_MT tokens per row pass
 * (gemm_kq_avx512.c's gemm calls it for few tokens and rows past its limit). */
static void gemm_zq5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok == 1) {
        gemv_fq5_k(k, w, w_stride, x, x_stride, y, ldy, r0, r1, 1);
        return;
    }
    for (int64_t j0 = 0; j0 < n_tok; j0 += RK5_MT) {
        const int T = n_tok - j0 < RK5_MT ? (int)(n_tok - j0) : RK5_MT;
        const cm_block_q8_k *yv[RK5_MT];
        for (int t = 0; t < T; t++)
            yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride);
        for (int64_t i = r0; i < r1; i++) {
            float out[RK5_MT];
            rk5_multi(k / CM_QK_K, (const cm_block_q5_k *)(const void *)((const char *)w + (size_t)i * w_stride), yv, T,
                      out);
            for (int t = 0; t < T; t++) y[(j0 + t) * ldy + i] = out[t];
        }
    }
}

/* ---- q6_k decode gemv over the file's bytes: kg6_tile's lane sums with the
 * weights' 6-bit values unsigned and the -32 offset in the token: the token
 * is packed once per call with, per 64 weights, -32 * the 4-byte sums of y
 * as vpdpbusd's initial lanes, so one vpdpbusd of q against y gives
 * sum((q - 32) * y) per 4 bytes (in int16 range), blended into word pairs
 * and multiplied by the scale pairs with one vpdpwssd; red4 and place16
 * sum 16 super-blocks' lanes into their exact integer sums, and the float
 * side is ztile_q6_k's (vec_dot's bits). ---- */
enum { RK6_BLOCK = 4 * 64 };

AI void rk6_pack(int64_t nb, const cm_block_q8_k *y, uint8_t *d) {
    const __m512i k32 = _mm512_set1_epi8(32), z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++, d += RK6_BLOCK)
        for (int v = 0; v < 4; v++)
            _mm512_store_si512((void *)(d + 64 * v),
                               _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, k32, _mm512_loadu_si512(y[b].qs + 64 * v))));
}

/* super-block b's lane sums (ztile_q6_k's sub-blocks per 128-bit lane) */
AI __m512i rk6_sb(const cm_block_q6_k *x, const cm_block_q8_k *y, const uint8_t *pk, int64_t b) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_loadu_si512(k_q6k_shift[0]), shr = _mm512_loadu_si512(k_q6k_shift[1]);
    const __m512i i0 = _mm512_loadu_si512(k_kg6_idx[0]), i1 = _mm512_loadu_si512(k_kg6_idx[1]);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales)));
    __m512i s16 = _mm512_setzero_si512();
    pk += b * RK6_BLOCK;
    _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
        const __m512i l = _mm512_loadu_si512(x[b].ql + 64 * c);
        const __m512i h = _mm512_broadcast_i64x4(ld256(x[b].qh + 32 * c));
        const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30));
        const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                            _mm512_and_si512(_mm512_srlv_epi16(h, shr), m30));
        const __m512i d0 = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(pk + 128 * c)), q01,
                                               _mm512_loadu_si512(y[b].qs + 128 * c));
        const __m512i d1 = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(pk + 128 * c + 64)), q23,
                                               _mm512_loadu_si512(y[b].qs + 128 * c + 64));
        const __m512i w = _mm512_mask_blend_epi16(0xaaaaaaaau, d0, _mm512_slli_epi32(d1, 16));
        s16 = _mm512_dpwssd_epi32(s16, w, _mm512_permutexvar_epi16(c ? i1 : i0, sc16));
    }
    return s16;
}

/* ztile_q6_k's float side: 16 super-blocks' exact sums per conversion */
AI float rk6_row(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *y, const uint8_t *pk) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        __m512i v = _mm512_setzero_si512();
        _Alignas(64) float dd[16];
        for (int k = 0; k < 4 && b0 + 4 * k < nb; k++) {
            __m512i sg[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                const int64_t b = b0 + 4 * k + i;
                sg[i] = b < nb ? rk6_sb(x, y, pk, b) : _mm512_setzero_si512();
            }
            v = place16(v, red4(sg[0], sg[1], sg[2], sg[3]), k);
        }
        for (int m = 0; m < 16; m++) dd[m] = b0 + m < nb ? f16f(x[b0 + m].d) * y[b0 + m].d : 0.0f;
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_load_ps(dd), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static void gemv_fq6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    if (nb > RK4_MAXB) {
        for (int64_t i = r0; i < r1; i++) vec_dot_zq6_k(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    _Alignas(64) uint8_t pk[RK4_MAXB * RK6_BLOCK];
    rk6_pack(nb, x, pk);
    for (int64_t i = r0; i < r1; i++)
        y[i] = rk6_row(nb, (const cm_block_q6_k *)(const void *)((const char *)w + (size_t)i * w_stride), x, pk);
}
