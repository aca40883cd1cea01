/*
 * avx2_krepack.h: the AVX2 decode gemvs over q4_k and q5_k rows repacked at load
 * ("q4_k lanes", repack.c). Not a header in the usual sense: kernels_avx2.c
 * includes it once, after x86_tiles.h, under its own ISA flags (the AVX-512
 * table, filled after, replaces it with avx512_krepack.h's). Nothing else
 * may include it.
 *
 * tile_q4_k's arithmetic for one token (x86_tiles.h: per 64 weights two
 * maddubs against the token, two madd with the broadcast scales, the 8 int32
 * lanes FMAed with d * dy, the min term in 4 lanes, hsum8 - hsum4), so each
 * row is vec_dot on the file's bytes bit for bit; what the layout saves is
 * cm_k4_scales8's scalar bit work and the fp16 conversions per super-block (4
 * blocks' at once, x86_krepack.h), and the token's bsums pair sums, gathered
 * once per call. One row per pass: a single sequential stream. The
 * prefill gemms at the end run the same arithmetic for 8 tokens per row pass.
 */
#include "x86_krepack.h"

/* The 8 scales bytes of a block as sw. */
AI __m256i ak_sw(__m128i sc8) { return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8)); }
/* Block j's 8 scales (bytes 0-7 or 8-15 of lo = unpacklo(sc03, sc47) for
 * blocks 0 and 1, of hi = unpackhi for blocks 2 and 3) as sw. */
AI void ak_sws(__m128i sc03, __m128i sc47, __m256i sw[4]) {
    const __m128i lo = _mm_unpacklo_epi32(sc03, sc47), hi = _mm_unpackhi_epi32(sc03, sc47);
    sw[0] = ak_sw(lo);
    sw[1] = ak_sw(_mm_srli_si128(lo, 8));
    sw[2] = ak_sw(hi);
    sw[3] = ak_sw(_mm_srli_si128(hi, 8));
}

/* The 8 scale bytes of 2 blocks (sc8's 16 bytes: block 0's, then block
 * 1's) as dwords holding the scale in both words, scd[0..16): a scale's
 * madd operand is then one dword broadcast from memory (no shuffle). */
AI void akd_scd2(__m128i sc8, int32_t *scd) {
    const __m128i w0 = _mm_cvtepu8_epi16(sc8), w1 = _mm_cvtepu8_epi16(_mm_srli_si128(sc8, 8));
    _mm_storeu_si128((__m128i *)(void *)scd, _mm_unpacklo_epi16(w0, w0));
    _mm_storeu_si128((__m128i *)(void *)(scd + 4), _mm_unpackhi_epi16(w0, w0));
    _mm_storeu_si128((__m128i *)(void *)(scd + 8), _mm_unpacklo_epi16(w1, w1));
    _mm_storeu_si128((__m128i *)(void *)(scd + 12), _mm_unpackhi_epi16(w1, w1));
}
/* Block m's scale as a madd operand. */
#define AKD_SC(SCD, M) _mm256_set1_epi32((SCD)[M])

/* One super-block: qs (the file's order), its 8 scales as scd[0..8)
 * (akd_scd2), mins as words, d, dmin; y the token's block, pairs its bsums
 * pair sums. */
AI void ak4_block(const uint8_t *qs, const int32_t *scd, __m128i mn16, float d, float dmin, const cm_block_q8_k *y,
                  __m128i pairs, __m256 *acc, __m128 *accm) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i q = ld256(qs + 32 * j);
        const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(y->qs + 64 * j)), AKD_SC(scd, 2 * j));
        const __m256i phi =
            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(y->qs + 64 * j + 32)), AKD_SC(scd, 2 * j + 1));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
    }
    FMA_BLOCK(*acc, sumi, d * y->d);
    *accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mn16, pairs)), _mm_set1_ps(dmin * y->d), *accm);
}

AI float ak4_row(int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const __m128i *pairs) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, x += RK4_GROUP) {
        /* the group's 9 lines A2_PFD bytes on */
        _Pragma("GCC unroll 9") for (int o = 0; o < RK4_GROUP; o += 64)
            _mm_prefetch((const char *)x + A2_PFD + o, _MM_HINT_T0);
        float dd[8];
        __m128i sc03, sc47, mn16[4];
        rk_header(x, dd, &sc03, &sc47, mn16);
        int32_t scd[32];
        akd_scd2(_mm_unpacklo_epi32(sc03, sc47), scd);
        akd_scd2(_mm_unpackhi_epi32(sc03, sc47), scd + 16);
        for (int j = 0; j < 4; j++) {
            ak4_block(x + 64 + 128 * j, scd + 8 * j, mn16[j], dd[j], dd[4 + j], y + b + j, pairs[b + j], &acc, &accm);
        }
    }
    for (const cm_block_q4_k *xt = (const cm_block_q4_k *)(const void *)x; b < nb; b++, xt++) {
        uint8_t sc[8], mn[8];
        int32_t scd[16];
        cm_k4_scales8(xt->scales, sc, mn);
        akd_scd2(_mm_loadl_epi64((const __m128i *)sc), scd);
        ak4_block(xt->qs, scd, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f16f(xt->d), f16f(xt->dmin),
                  y + b, pairs[b], &acc, &accm);
    }
    return hsum8(acc) - hsum4(accm);
}

static void gemv_ak4_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= RK4_MAXB);
    __m128i pairs[RK4_MAXB];
    rk_pairs(nb, x, pairs);
    for (int64_t i = r0; i < r1; i++) y[i] = ak4_row(nb, (const uint8_t *)w + (size_t)i * w_stride, x, pairs);
}

/* ---- q5_k over "q5_k lanes" (repack.c: the q4_k group's header, then the
 * 4 blocks' qh, 32 bytes each, then their qs): tile_q5_k's arithmetic (the
 * fifth bit ORed in as bit 4 of each nibble, as x86_tiles.h does), so each
 * row is vec_dot on the file's bytes bit for bit. ---- */
enum { AK5_GROUP = 4 * (int)sizeof(cm_block_q5_k) };

AI void ak5_block(const uint8_t *qs, const uint8_t *qhp, const int32_t *scd, __m128i mn16, float d, float dmin,
                  const cm_block_q8_k *y, __m128i pairs, __m256 *acc, __m128 *accm) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    const __m256i qh = ld256(qhp);
    __m256i sumi = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        const __m256i q = ld256(qs + 32 * j);
        /* bit 2j (lo) or 2j + 1 (hi) of each qh byte moved to bit 4 by one
         * 16-bit shift of at most 4 (no bit crosses into the other byte
         * that the mask keeps), then masked: one shift and one and each */
        const __m256i blo = 2 * j <= 4 ? _mm256_slli_epi16(qh, 4 - 2 * j) : _mm256_srli_epi16(qh, 2 * j - 4);
        const __m256i bhi = 2 * j + 1 <= 4 ? _mm256_slli_epi16(qh, 3 - 2 * j) : _mm256_srli_epi16(qh, 2 * j - 3);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(blo, m16));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_and_si256(bhi, m16));
        const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(y->qs + 64 * j)), AKD_SC(scd, 2 * j));
        const __m256i phi =
            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(y->qs + 64 * j + 32)), AKD_SC(scd, 2 * j + 1));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
    }
    FMA_BLOCK(*acc, sumi, d * y->d);
    *accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mn16, pairs)), _mm_set1_ps(dmin * y->d), *accm);
}

AI float ak5_row(int64_t nb, const uint8_t *x, const cm_block_q8_k *y, const __m128i *pairs) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, x += AK5_GROUP) {
        /* the group's 11 lines A2_PFD bytes on */
        _Pragma("GCC unroll 11") for (int o = 0; o < AK5_GROUP; o += 64)
            _mm_prefetch((const char *)x + A2_PFD + o, _MM_HINT_T0);
        float dd[8];
        __m128i sc03, sc47, mn16[4];
        rk_header(x, dd, &sc03, &sc47, mn16);
        int32_t scd[32];
        akd_scd2(_mm_unpacklo_epi32(sc03, sc47), scd);
        akd_scd2(_mm_unpackhi_epi32(sc03, sc47), scd + 16);
        for (int j = 0; j < 4; j++) {
            ak5_block(x + 192 + 128 * j, x + 64 + 32 * j, scd + 8 * j, mn16[j], dd[j], dd[4 + j], y + b + j,
                      pairs[b + j], &acc, &accm);
        }
    }
    for (const cm_block_q5_k *xt = (const cm_block_q5_k *)(const void *)x; b < nb; b++, xt++) {
        uint8_t sc[8], mn[8];
        int32_t scd[16];
        cm_k4_scales8(xt->scales, sc, mn);
        akd_scd2(_mm_loadl_epi64((const __m128i *)sc), scd);
        ak5_block(xt->qs, xt->qh, scd, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f16f(xt->d),
                  f16f(xt->dmin), y + b, pairs[b], &acc, &accm);
    }
    return hsum8(acc) - hsum4(accm);
}

static void gemv_ak5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= RK4_MAXB);
    __m128i pairs[RK4_MAXB];
    rk_pairs(nb, x, pairs);
    for (int64_t i = r0; i < r1; i++) y[i] = ak5_row(nb, (const uint8_t *)w + (size_t)i * w_stride, x, pairs);
}

/* ---- prefill over the same rows: ak4_row / ak5_row for up to AKG_T tokens
 * at once (a row's header, nibbles and scales made once for all of them), so
 * each (row, token) gets those functions' integer lanes, hence their bits
 * (vec_dot's). Rows in blocks of AKG_RB (in L2) against every group of
 * tokens (in L1).
 *
 * The lanes are computed with fewer operations than ak4_block's maddubs,
 * madd, add per 32 weights: lane l of a super-block's sum is, for each of its
 * 8 groups of 32 weights (one scale each), the scale times the 4 products of
 * the group's dword l. A pair of groups (2p: the low nibbles, 2p + 1: the
 * high, meeting the token's bytes 64p.. and 64p + 32..) is laid out as two
 * vectors by 16-bit units (ak_pair): A = dword l's low unit of group 2p and
 * of group 2p + 1, B = their high units, the token's bytes alike. Then
 * maddubs(A) + maddubs(B) (int16: 4 products of one group per word, <= 4 *
 * 31 * 127 < 2^15) has in word 2l group 2p's four and in word 2l + 1 group
 * 2p + 1's, and one madd with the two scales gives lane l both groups' terms:
 * per 64 weights and token two maddubs, an add, a madd and an add instead of
 * two of each and three adds. The same integers lane for lane: the same bits.
 *
 * What a group of tokens needs is laid out once per (row block, group)
 * (akg_toks): the tokens' bytes block by block so paired (one pointer for all
 * T), their d, and for each pair of tokens the bsums pair sums and d side by
 * side in one vector, so the min term of two tokens takes one madd,
 * conversion, product and FMA (the same operations lane for lane as
 * ak4_row's 128-bit ones: the same bits), and d * dy of 8 tokens one
 * product. ---- */
enum { AKG_T = 8, AKG_P = AKG_T / 2, AKG_RB = 128, AKG_CB = 1536 /* (row, super-block)s unpacked at once */ };

/* Two vectors of 32 bytes (a group pair, weights or token bytes) by 16-bit
 * units: o[0] the low unit of each dword of a and of b, o[1] the high ones. */
AI void ak_pair(__m256i a, __m256i b, __m256i *o) {
    o[0] = _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xaa);
    o[1] = _mm256_blend_epi16(_mm256_srli_epi32(a, 16), b, 0xaa);
}

typedef struct {
    int8_t qs[RK4_MAXB][AKG_T][CM_QK_K]; /* token t's bytes of super-block b, paired (ak_pair per 64) */
    float yd[RK4_MAXB][AKG_T];           /* token t's d (0 past T) */
    __m256 yd2[RK4_MAXB][AKG_P];         /* d of tokens 2p (low half) and 2p + 1 (high), 4 each */
    __m256i pr2[RK4_MAXB][AKG_P];        /* their bsums pair sums, likewise */
} akg_toks;

/* T tokens (yv) of nb super-blocks into g. */
static void akg_prep(int64_t nb, const cm_block_q8_k *const *yv, int T, akg_toks *g) {
    for (int t = 0; t < AKG_T; t++) /* token by token: one stream read at a time */
        for (int64_t b = 0; b < nb; b++) {
            if (t >= T) {
                g->yd[b][t] = 0.0f;
                continue;
            }
            const cm_block_q8_k *y = yv[t] + b;
            for (int o = 0; o < CM_QK_K; o += 64) {
                __m256i v[2];
                ak_pair(ld256(y->qs + o), ld256(y->qs + o + 32), v);
                _mm256_storeu_si256((__m256i *)(void *)(g->qs[b][t] + o), v[0]);
                _mm256_storeu_si256((__m256i *)(void *)(g->qs[b][t] + o + 32), v[1]);
            }
            g->yd[b][t] = y->d;
        }
    for (int64_t b = 0; b < nb; b++) {
        __m128i pr[AKG_T];
        for (int t = 0; t < AKG_T; t++) {
            if (t < T) {
                const __m256i bs = ld256(yv[t][b].bsums);
                pr[t] = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            } else pr[t] = _mm_setzero_si128();
        }
        for (int p = 0; p < AKG_P; p++) {
            g->yd2[b][p] = _mm256_set_m128(_mm_set1_ps(g->yd[b][2 * p + 1]), _mm_set1_ps(g->yd[b][2 * p]));
            g->pr2[b][p] = _mm256_set_m128i(pr[2 * p + 1], pr[2 * p]);
        }
    }
}

/* One super-block of a row, unpacked for the gemm: v[2p], v[2p + 1] the
 * values (bytes, q5_k's with the fifth bit) of groups 2p and 2p + 1 paired
 * (ak_pair), sc2[p] their two scales as words (2p low), mn2 the mins as
 * words in both halves, d, dmin. */
typedef struct {
    __m256i v[8], mn2;
    int32_t sc2[4];
    float d, dmin;
} akg_blk;

/* One super-block: qs (the file's order), qh (q5_k's, or NULL), the scales
 * as sw, mins as words; HAS_QH a constant. */
AI void akg_unpack_blk(const uint8_t *qs, const uint8_t *qhp, int has_qh, __m256i sw, __m128i mn16, float d, float dmin,
                       akg_blk *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256i qh = has_qh ? ld256(qhp) : one;
    for (int j = 0; j < 4; j++) {
        const __m256i q = ld256(qs + 32 * j);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (has_qh) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
            qh = _mm256_srli_epi16(qh, 2);
        }
        ak_pair(lo, hi, &o->v[2 * j]);
    }
    _mm_storeu_si128((__m128i *)(void *)o->sc2, _mm256_castsi256_si128(sw)); /* dword p: words 2p, 2p + 1 */
    o->mn2 = _mm256_broadcastsi128_si256(mn16);
    o->d = d;
    o->dmin = dmin;
}
/* A repacked row (q4_k lanes, or q5_k lanes when has_qh) of nb super-blocks into o[0..nb). */
static void akg_unpack(int64_t nb, const uint8_t *x, int has_qh, akg_blk *o) {
    const size_t group = has_qh ? (size_t)AK5_GROUP : (size_t)RK4_GROUP;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, x += group) {
        float dd[8];
        __m128i sc03, sc47, mn16[4];
        rk_header(x, dd, &sc03, &sc47, mn16);
        __m256i sw[4];
        ak_sws(sc03, sc47, sw);
        for (int j = 0; j < 4; j++) {
            if (has_qh)
                akg_unpack_blk(x + 192 + 128 * j, x + 64 + 32 * j, 1, sw[j], mn16[j], dd[j], dd[4 + j], &o[b + j]);
            else akg_unpack_blk(x + 64 + 128 * j, NULL, 0, sw[j], mn16[j], dd[j], dd[4 + j], &o[b + j]);
        }
    }
    for (; b < nb; b++) { /* the file's last nb % 4 super-blocks */
        uint8_t sc[8], mn[8];
        if (has_qh) {
            const cm_block_q5_k *xt = (const cm_block_q5_k *)(const void *)x + (b - nb / 4 * 4);
            cm_k4_scales8(xt->scales, sc, mn);
            akg_unpack_blk(xt->qs, xt->qh, 1, ak_sw(_mm_loadl_epi64((const __m128i *)sc)),
                           _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f16f(xt->d), f16f(xt->dmin), &o[b]);
        } else {
            const cm_block_q4_k *xt = (const cm_block_q4_k *)(const void *)x + (b - nb / 4 * 4);
            cm_k4_scales8(xt->scales, sc, mn);
            akg_unpack_blk(xt->qs, NULL, 0, ak_sw(_mm_loadl_epi64((const __m128i *)sc)),
                           _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f16f(xt->d), f16f(xt->dmin), &o[b]);
        }
    }
}

/* One unpacked row x T tokens (g). acc[t]: token t's chain; accm[p]: the min
 * chains of tokens 2p and 2p + 1 (halves). */
AI void akg_row(int64_t nb, const akg_blk *x, const akg_toks *g, int T, float *out) {
    __m256 acc[AKG_T], accm[AKG_P];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    _Pragma("GCC unroll 4") for (int p = 0; p < (T + 1) / 2; p++) accm[p] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *yq = g->qs[b][0];
        __m256i sumi[AKG_T];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m256i va = x[b].v[2 * p], vb = x[b].v[2 * p + 1], sc = _mm256_set1_epi32(x[b].sc2[p]);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const int8_t *yy = yq + CM_QK_K * t + 64 * p;
                const __m256i s = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(va, ld256(yy)), _mm256_maddubs_epi16(vb, ld256(yy + 32))),
                    sc);
                sumi[t] = ax_keep(p ? _mm256_add_epi32(sumi[t], s) : s);
            }
        }
        float dy[AKG_T];
        _mm256_storeu_ps(dy, _mm256_mul_ps(_mm256_set1_ps(x[b].d), _mm256_loadu_ps(g->yd[b])));
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_broadcast_ss(&dy[t]), acc[t]);
        const __m256 dm = _mm256_set1_ps(x[b].dmin);
        _Pragma("GCC unroll 4") for (int p = 0; p < (T + 1) / 2; p++) accm[p] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_madd_epi16(x[b].mn2, g->pr2[b][p])), _mm256_mul_ps(dm, g->yd2[b][p]), accm[p]);
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        const __m256 m = accm[t / 2];
        out[t] = hsum8(acc[t]) - hsum4(t % 2 ? _mm256_extractf128_ps(m, 1) : _mm256_castps256_ps128(m));
    }
}

AI void akg_gemm(int has_qh, int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                 int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= RK4_MAXB);
    /* ~775 KiB (compute threads: CM_COMPUTE_STACK) */
    akg_toks g;
    akg_blk rows[AKG_CB];
    const int64_t rb = nb * AKG_RB <= AKG_CB ? AKG_RB : (nb > AKG_CB ? 1 : AKG_CB / nb);
    for (int64_t i0 = r0; i0 < r1; i0 += rb) {
        const int64_t i1 = r1 - i0 < rb ? r1 : i0 + rb;
        for (int64_t i = i0; i < i1; i++)
            akg_unpack(nb, (const uint8_t *)w + (size_t)i * w_stride, has_qh, &rows[(i - i0) * nb]);
        const int64_t i2 = r1 - i1 < rb ? r1 : i1 + rb, ng = (n_tok + AKG_T - 1) / AKG_T;
        for (int64_t j = 0; j < n_tok; j += AKG_T) {
            const int T = n_tok - j < AKG_T ? (int)(n_tok - j) : AKG_T;
            a6g_pf((const char *)w + (size_t)i1 * w_stride, (const char *)w + (size_t)i2 * w_stride, j / AKG_T,
                   ng); /* the next block of rows (avx2_gemv.h) */
            const cm_block_q8_k *yv[AKG_T];
            for (int t = 0; t < T; t++)
                yv[t] = (const cm_block_q8_k *)(const void *)((const char *)x + (size_t)(j + t) * x_stride);
            akg_prep(nb, yv, T, &g);
            for (int64_t i = i0; i < i1; i++) {
                const akg_blk *xr = &rows[(i - i0) * nb];
                float out[AKG_T];
                switch (T) { /* a constant T keeps the tile in registers */
                case 8: akg_row(nb, xr, &g, 8, out); break;
                case 7: akg_row(nb, xr, &g, 7, out); break;
                case 6: akg_row(nb, xr, &g, 6, out); break;
                case 5: akg_row(nb, xr, &g, 5, out); break;
                case 4: akg_row(nb, xr, &g, 4, out); break;
                case 3: akg_row(nb, xr, &g, 3, out); break;
                case 2: akg_row(nb, xr, &g, 2, out); break;
                default: akg_row(nb, xr, &g, 1, out); break;
                }
                for (int t = 0; t < T; t++) y[(j + t) * ldy + i] = out[t];
            }
        }
    }
}

static void gemm_ak4_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    akg_gemm(0, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}
static void gemm_ak5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    akg_gemm(1, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
}
