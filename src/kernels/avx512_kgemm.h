/*
 * avx512_kgemm.h: the AVX-512 prefill gemm for q4_k (q5_k's went with its
 * own float order to avx512_krepack.h / gemm_kq_avx512.c) that
 * unpacks each weight row once per pass and reuses it for every token (q6_k's
 * moved to gemm_kq_avx512.c; only its scale word order is left here, for
 * gemv_fq6_k). Not a header in
 * the usual sense: kernels_avx512.c includes it once, after its tiles, under
 * its own ISA flags. Nothing else may include it. gemm_kq_avx512.c's gemms
 * replace these in the avx512 table and call them for rows past its limit.
 *
 * The 4-token tiles (ztile_q6_k, the 256-bit tile_q5_k; q4_k's 1 x 4 packed
 * gemm) unpack every super-block again for each group of 4 tokens, and spend per token a sign
 * fix-up (q6_k) or two byte multiplies per 32 weights before the scale. Here a
 * row tile is unpacked once into a buffer (per 128 or 64 weights: the bytes,
 * the per-lane correction, the scales laid out in word pairs), then a
 * R x T register tile walks it: per 64 weights and (row, token) one
 * vpdpbusd, and per two of those one shift, one blend and one vpdpwssd that
 * multiplies both by their scales. Integer identities (all exact in int32):
 *   q5_k, q4_k: q in [0, 31] unsigned against y signed, each 4-byte sum fits int16.
 * Two 4-byte sums D0, D1 go into one int32 as words (blend of D0 and D1 << 16),
 * and vpdpwssd against the word pair (s0, s1) adds s0 * D0 + s1 * D1: every
 * int32 lane ends up holding exactly the lane sum of the one-token tile (the
 * same 4-byte groups times the same scales), so the conversion, the FMA with
 * d * dy, the min term and the final reduction are the tile's own, and
 * every (row, token) is bit-identical to vec_dot (kernels.h;
 * tests/unit/test_kernels_invariant.c).
 *
 * Tokens go in passes of about KG_PASS bytes of activations (stay in L2 while
 * each row tile walks them). Stack: the row buffers, ~60 KiB at most; rows
 * longer than KG_MAXNB super-blocks (k > 16384) use the tiles. Never
 * allocates.
 */

enum {
    KG_MAXNB = 64,        /* super-blocks per row (k <= 16384) */
    KG_PASS = 256 * 1024, /* bytes of activations per pass */
    /* token super-blocks per pass, at least 4 x 4 x KG_MAXNB (the min operands' rows) */
    KG_YC = KG_PASS / (int)sizeof(cm_block_q8_k) > 16 * KG_MAXNB ? KG_PASS / (int)sizeof(cm_block_q8_k) : 16 * KG_MAXNB,
    K5_R = 2,
    K5_T = 4, /* q4_k register tile (its min term needs a second set of accumulators) */
};

/* ---- q6_k: the word-pair scale order of gemv_fq6_k (avx512_krepack.h) ---- */
/* word 2l = scale 8c + l/4, word 2l + 1 = scale 8c + 4 + l/4 */
static const uint16_t k_kg6_idx[2][32] = {
    {0, 4, 0, 4, 0, 4, 0, 4, 1, 5, 1, 5, 1, 5, 1, 5, 2, 6, 2, 6, 2, 6, 2, 6, 3, 7, 3, 7, 3, 7, 3, 7},
    {8,  12, 8,  12, 8,  12, 8,  12, 9,  13, 9,  13, 9,  13, 9,  13,
     10, 14, 10, 14, 10, 14, 10, 14, 11, 15, 11, 15, 11, 15, 11, 15}};

/* The q4_k gemm: passes of tokens, K5_R rows unpacked at a time
 * (NAME_unpack into BLK), K5_T tokens per NAME_tile; rows longer than
 * KG_MAXNB super-blocks, and one token, go to FALLBACK (the one-token tiles).
 * Per pass the tokens' min-term operands are gathered once, super-block
 * major (kg_minpack): tile tokens t..t+3's bsums pair sums and their dy
 * (each in its own 128-bit lane) are one 64-byte load each, so the tile
 * does the 4-lane min term of 4 tokens with one vector of each operation. */
AI void kg_minpack(int64_t nb, const cm_block_q8_k *y, __m128i *pr, __m128 *ydv, int64_t ld) {
    for (int64_t b = 0; b < nb; b++) {
        const __m256i bs = ld256(y[b].bsums);
        pr[b * ld] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        ydv[b * ld] = _mm_set1_ps(y[b].d);
    }
}

/* accm[r] (4 tokens' 4 min lanes, token t in 128-bit lane t) += the min
 * terms of super-block b: ztile_q4_k's / tile_q5_k's kmins times dmin * dy */
AI __m512 kg_min4(__m512 accm, __m128i mn16, float dmin, const __m128i *pr, const __m128 *ydv) {
    const __m512i m = _mm512_madd_epi16(_mm512_broadcast_i32x4(mn16), _mm512_load_si512((const void *)pr));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(m),
                           _mm512_mul_ps(_mm512_set1_ps(dmin), _mm512_load_ps((const void *)ydv)), accm);
}

/* Token t's min total, as hsum4 of its lanes. */
AI float kg_min_lane(__m512 accm, int t) {
    _Alignas(64) float v[16];
    _mm512_store_ps(v, accm);
    return hsum4(_mm_load_ps(v + 4 * t));
}

enum { KG_MINLD = KG_YC + 4 * KG_MAXNB }; /* pass tokens (rounded up to 4) x super-blocks */

#define KG_GEMM(NAME, BLK, XB, FALLBACK)                                                                               \
    static void gemm_##NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,       \
                            int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {                                      \
        const int64_t nb = k / CM_QK_K;                                                                                \
        if (nb > KG_MAXNB || n_tok < 2) {                                                                              \
            FALLBACK(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);                                              \
            return;                                                                                                    \
        }                                                                                                              \
        _Alignas(64) BLK buf[K5_R * KG_MAXNB];                                                                         \
        _Alignas(64) __m128i pr[KG_MINLD];                                                                             \
        _Alignas(64) __m128 ydv[KG_MINLD];                                                                             \
        int64_t cap = KG_PASS / (nb * (int64_t)sizeof(cm_block_q8_k));                                                 \
        if (cap < 4 * K5_T) cap = 4 * K5_T;                                                                            \
        for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {                                                                  \
            const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap, ld = (nt + 3) & ~(int64_t)3;                       \
            for (int64_t j = 0; j < ld; j++) {                                                                         \
                if (j < nt)                                                                                            \
                    kg_minpack(nb,                                                                                     \
                               (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j0 + j) * x_stride),   \
                               pr + j, ydv + j, ld);                                                                   \
                else                                                                                                   \
                    for (int64_t b = 0; b < nb; b++)                                                                   \
                        pr[b * ld + j] = _mm_setzero_si128(), ydv[b * ld + j] = _mm_setzero_ps();                      \
            }                                                                                                          \
            for (int64_t i = r0; i < r1; i += K5_R) {                                                                  \
                const int R = r1 - i < K5_R ? (int)(r1 - i) : K5_R;                                                    \
                const BLK *xb[K5_R];                                                                                   \
                for (int r = 0; r < R; r++) {                                                                          \
                    NAME##_unpack(nb, (const XB *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),        \
                                  buf + r * nb);                                                                       \
                    xb[r] = buf + r * nb;                                                                              \
                }                                                                                                      \
                for (int64_t jj = 0; jj < nt; jj += K5_T) {                                                            \
                    const int T = nt - jj < K5_T ? (int)(nt - jj) : K5_T;                                              \
                    const cm_block_q8_k *yv[K5_T];                                                                     \
                    for (int t = 0; t < T; t++)                                                                        \
                        yv[t] =                                                                                        \
                            (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j0 + jj + t) * x_stride); \
                    float out[K5_R * K5_T];                                                                            \
                    if (R == K5_R && T == K5_T) NAME##_tile(nb, xb, yv, pr + jj, ydv + jj, ld, K5_R, K5_T, out);       \
                    else                                                                                               \
                        for (int r = 0; r < R; r++) switch (T) {                                                       \
                            case 4: NAME##_tile(nb, xb + r, yv, pr + jj, ydv + jj, ld, 1, 4, out + r * K5_T); break;   \
                            case 3: NAME##_tile(nb, xb + r, yv, pr + jj, ydv + jj, ld, 1, 3, out + r * K5_T); break;   \
                            case 2: NAME##_tile(nb, xb + r, yv, pr + jj, ydv + jj, ld, 1, 2, out + r * K5_T); break;   \
                            default: NAME##_tile(nb, xb + r, yv, pr + jj, ydv + jj, ld, 1, 1, out + r * K5_T); break;  \
                            }                                                                                          \
                    for (int r = 0; r < R; r++)                                                                        \
                        for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i + r] = out[r * K5_T + t];                \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }

/* ---- q4_k (ztile_q4_k's order: 16 int32 lanes per super-block, 4 min lanes) ----
 * Per half h (128 weights): lo[h] = the low nibbles of qs[64h..64h+63]
 * (sub-blocks 4h | 4h+2, against y[128h..+31] | y[128h+64..+95]), hi[h] the
 * high nibbles (4h+1 | 4h+3, against y[128h+32..] | y[128h+96..]); s[h]: lanes
 * 0-7 (scale 4h, 4h+1), lanes 8-15 (4h+2, 4h+3), so lane m holds exactly
 * ztile_q4_k's plo + phi. */
typedef struct {
    __m512i q[2][2], s[2];
    __m128i mn;
    float d, dmin;
} kg4_blk;

static void kg4_unpack(int64_t nb, const cm_block_q4_k *x, kg4_blk *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[8], mn[8];
        cm_k4_scales8(x[b].scales, sc, mn);
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512(x[b].qs + 64 * h);
            o[b].q[h][0] = _mm512_and_si512(q, m4);
            o[b].q[h][1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            o[b].s[h] = _mm512_inserti64x4(_mm512_set1_epi32((int)(sc[4 * h] | (uint32_t)sc[4 * h + 1] << 16)),
                                           _mm256_set1_epi32((int)(sc[4 * h + 2] | (uint32_t)sc[4 * h + 3] << 16)), 1);
        }
        o[b].mn = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        o[b].d = f16f(x[b].d);
        o[b].dmin = f16f(x[b].dmin);
    }
}

AI void kg4_tile(int64_t nb, const kg4_blk *const *xb, const cm_block_q8_k *const *yv, const __m128i *pr,
                 const __m128 *ydv, int64_t ld, int R, int T, float *out) {
    __m512 acc[K5_R][K5_T], accm[K5_R];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
        accm[r] = _mm512_setzero_ps();
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    }
    const __m512i z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        __m512i q[K5_R][2][2], s[K5_R][2]; /* the rows' super-block, in registers for every token */
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            q[r][h][0] = _mm512_load_si512((const void *)&xb[r][b].q[h][0]);
            q[r][h][1] = _mm512_load_si512((const void *)&xb[r][b].q[h][1]);
            s[r][h] = _mm512_load_si512((const void *)&xb[r][b].s[h]);
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            const cm_block_q8_k *yb = &yv[t][b];
            __m512i yq[2][2];
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const int8_t *y = yb->qs + 128 * h;
                yq[h][0] = ld2x256(y, y + 64);
                yq[h][1] = ld2x256(y + 32, y + 96);
            }
            const float yd = yb->d;
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                __m512i s16 = z;
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                    const __m512i d0 = _mm512_dpbusd_epi32(z, q[r][h][0], yq[h][0]);
                    const __m512i d1 = _mm512_dpbusd_epi32(z, q[r][h][1], yq[h][1]);
                    const __m512i w = _mm512_mask_blend_epi16(0xaaaaaaaau, d0, _mm512_slli_epi32(d1, 16));
                    s16 = _mm512_dpwssd_epi32(s16, w, s[r][h]);
                }
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s16), _mm512_set1_ps(xb[r][b].d * yd), acc[r][t]);
            }
        }
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) accm[r] =
            kg_min4(accm[r], xb[r][b].mn, xb[r][b].dmin, pr + b * ld, ydv + b * ld);
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
        out[r * K5_T + t] = _mm512_reduce_add_ps(acc[r][t]) - kg_min_lane(accm[r], t);
}

KG_GEMM(kg4, kg4_blk, cm_block_q4_k, gemm_pq4_k)
