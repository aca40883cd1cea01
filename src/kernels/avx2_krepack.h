/*
 * avx2_krepack.h: the AVX2 table's q4_k and q5_k decode gemvs and prompt
 * gemms over rows repacked at load in its own layouts ("q4_k pairs", "q5_k
 * pairs", repack.c; the AVX-512 table keeps "q5_k lanes"). Not a header in
 * the usual sense: kernels_avx2.c includes it once, after x86_tiles.h,
 * under its own ISA flags. Nothing else may include it.
 *
 * tile_q4_k's arithmetic for one token (x86_tiles.h: the 8 int32 lanes of
 * each super-block FMAed with d * dy, the min term in 4 lanes, hsum8 -
 * hsum4), so each row is vec_dot on the file's bytes bit for bit. Lane l of
 * a super-block is, for each of its 8 groups of 32 weights (one scale each),
 * the scale times the 4 products of the group's dword l: tile_q4_k takes
 * per 64 weights two maddubs, two madd and two adds; the pairs layout holds
 * each 64 weights as the two vectors A, B (group 2c's and 2c + 1's bytes by
 * 16-bit units: ak_pair's order) that meet the token's bytes paired once
 * per call (ak_tok), so per 64 weights it is an and, a shift and an and
 * (q5_k: three more, the fifth bits pre-merged), two maddubs, an int16
 * add, one madd with both scales and one add (akp_block): 8 (q5_k 11) ymm
 * operations instead of 11 (15). What the header saves is cm_k4_scales8's
 * scalar bit work and the fp16 conversions per super-block (4 blocks' at
 * once, x86_krepack.h). One row per pass: a single sequential stream. The
 * prefill gemms at the end run the same arithmetic for 8 tokens per row pass.
 */
#include "x86_krepack.h"

/* Two vectors of 32 bytes (a group pair, weights or token bytes) by 16-bit
 * units: o[0] the low unit of each dword of a and of b, o[1] the high ones. */
AI void ak_pair(__m256i a, __m256i b, __m256i *o) {
    o[0] = _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xaa);
    o[1] = _mm256_blend_epi16(_mm256_srli_epi32(a, 16), b, 0xaa);
}

/* The token's bytes of nb super-blocks in the pairs' order (ak_pair per 64:
 * yp[256b + 64c ..] meets chunk c's A, yp[256b + 64c + 32 ..] its B). */
AI void ak_tok(int64_t nb, const cm_block_q8_k *y, int8_t *yp) {
    for (int64_t b = 0; b < nb; b++)
        for (int c = 0; c < 4; c++) {
            __m256i v[2];
            ak_pair(ld256(y[b].qs + 64 * c), ld256(y[b].qs + 64 * c + 32), v);
            _mm256_storeu_si256((__m256i *)(void *)(yp + 256 * b + 64 * c), v[0]);
            _mm256_storeu_si256((__m256i *)(void *)(yp + 256 * b + 64 * c + 32), v[1]);
        }
}

/* A block's 8 scale bytes (sc8's low 8) as words: scw[c] = chunk c's two
 * scales (2c low), a madd operand by one dword broadcast from memory. */
AI void ak_scw(__m128i sc8, int32_t *scw) { _mm_storeu_si128((__m128i *)(void *)scw, _mm_cvtepu8_epi16(sc8)); }
/* A group's 4 blocks' (rk_header's sc03, sc47) into scw[0..16). */
AI void ak_scw4(__m128i sc03, __m128i sc47, int32_t *scw) {
    const __m128i lo = _mm_unpacklo_epi32(sc03, sc47), hi = _mm_unpackhi_epi32(sc03, sc47);
    ak_scw(lo, scw);
    ak_scw(_mm_srli_si128(lo, 8), scw + 4);
    ak_scw(hi, scw + 8);
    ak_scw(_mm_srli_si128(hi, 8), scw + 12);
}

/* Chunk c's A and B of a pairs block (repack.c): q4_k's from qs (qhv
 * unused), q5_k's from U = qs and V = qhv (HAS_QH a constant). */
AI void akp_vals(const uint8_t *qs, __m256i qhv, int has_qh, int c, __m256i *a, __m256i *b) {
    const __m256i q = ld256(qs + 32 * c);
    if (!has_qh) {
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        *a = _mm256_and_si256(q, m4);
        *b = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        return;
    }
    /* V's bits 2c, 2c + 1 to bits 3, 4 by one 16-bit shift (3, 1, -1, -3):
     * what crosses into the other byte lands outside the mask */
    const __m256i h = c == 0   ? _mm256_slli_epi16(qhv, 3)
                      : c == 1 ? _mm256_slli_epi16(qhv, 1)
                      : c == 2 ? _mm256_srli_epi16(qhv, 1)
                               : _mm256_srli_epi16(qhv, 3);
    *a = _mm256_and_si256(q, _mm256_set1_epi8(0x1f));
    *b = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 5), _mm256_set1_epi8(0x07)),
                         _mm256_and_si256(h, _mm256_set1_epi8(0x18)));
}

/* One super-block in pair order: qs (and q5_k's V at qhp), scw its scale
 * words (ak_scw), mins as words, *dy = d * dy and *dmy = dmin * dy (dy the
 * token's d); yp the token's paired bytes of the block, pairs its bsums pair
 * sums. Per chunk: maddubs of A
 * and of B, their int16 sum (4 products of one 32-value group per word, <=
 * 4 * 31 * 128 < 2^15), one madd with the two scales: lane l gets group
 * 2c's and 2c + 1's terms of dword l, tile_q4_k / tile_q5_k's int32 lanes
 * (integer sums in another order): the same bits. */
AI void akp_block(const uint8_t *qs, const uint8_t *qhp, int has_qh, const int32_t *scw, __m128i mn16, const float *dy,
                  const float *dmy, const int8_t *yp, __m128i pairs, __m256 *acc, __m128 *accm) {
    const __m256i qhv = has_qh ? ld256(qhp) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i a, b;
        akp_vals(qs, qhv, has_qh, c, &a, &b);
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(a, ld256(yp + 64 * c)),
                                           _mm256_maddubs_epi16(b, ld256(yp + 64 * c + 32)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi32(scw[c])));
    }
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcast_ss(dy), *acc); /* FMA_BLOCK's */
    *accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mn16, pairs)), _mm_broadcast_ss(dmy), *accm);
}

/* One row of "q4_k pairs" (has_qh 0) or "q5_k pairs" (1): groups of 4
 * super-blocks (the q4_k lanes header, then q5_k's 4 V, then the quants),
 * then the nb % 4 last as the file's blocks with their quants in pair order. */
AI float akp_row(int64_t nb, const uint8_t *x, int has_qh, const float *ydv, const int8_t *yp, const __m128i *pairs) {
    const int group = has_qh ? 4 * (int)sizeof(cm_block_q5_k) : RK4_GROUP, qs0 = has_qh ? 192 : 64;
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, x += group) {
        /* the group's 9 (q5_k: 11) lines A2_PFD bytes on */
        _Pragma("GCC unroll 11") for (int o = 0; o < group; o += 64)
            _mm_prefetch((const char *)x + A2_PFD + o, _MM_HINT_T0);
        float dd[8];
        __m128i sc03, sc47, mn16[4];
        rk_header(x, dd, &sc03, &sc47, mn16);
        int32_t scw[16];
        ak_scw4(sc03, sc47, scw);
        float f[8]; /* d * dy, then dmin * dy, of the 4 blocks (products as tile_q4_k's) */
        _mm256_storeu_ps(
            f, _mm256_mul_ps(_mm256_loadu_ps(dd), _mm256_broadcast_ps((const __m128 *)(const void *)(ydv + b))));
        for (int j = 0; j < 4; j++)
            akp_block(x + qs0 + 128 * j, x + 64 + 32 * j, has_qh, scw + 4 * j, mn16[j], f + j, f + 4 + j,
                      yp + 256 * (b + j), pairs[b + j], &acc, &accm);
    }
    for (; b < nb; b++) {
        const cm_block_q5_k *x5 = (const cm_block_q5_k *)(const void *)x;
        const cm_block_q4_k *x4 = (const cm_block_q4_k *)(const void *)x;
        const uint8_t *scales = has_qh ? x5->scales : x4->scales;
        uint8_t sc[8], mn[8];
        int32_t scw[4];
        cm_k4_scales8(scales, sc, mn);
        ak_scw(_mm_loadl_epi64((const __m128i *)sc), scw);
        const float f[2] = {f16f(has_qh ? x5->d : x4->d) * ydv[b], f16f(has_qh ? x5->dmin : x4->dmin) * ydv[b]};
        akp_block(has_qh ? x5->qs : x4->qs, has_qh ? x5->qh : NULL, has_qh, scw,
                  _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f, f + 1, yp + 256 * b, pairs[b], &acc,
                  &accm);
        x += has_qh ? sizeof *x5 : sizeof *x4;
    }
    return hsum8(acc) - hsum4(accm);
}

AI void akp_gemv(int has_qh, int64_t k, const void *w, size_t w_stride, const void *x, float *y, int64_t r0,
                 int64_t r1) {
    const int64_t nb = k / CM_QK_K;
    CM_ASSERT(nb <= RK4_MAXB);
    __m128i pairs[RK4_MAXB];
    _Alignas(32) int8_t yp[RK4_MAXB * CM_QK_K]; /* 32 KiB at most (compute threads: CM_COMPUTE_STACK) */
    float ydv[RK4_MAXB];
    rk_pairs(nb, x, pairs);
    ak_tok(nb, x, yp);
    for (int64_t b = 0; b < nb; b++) ydv[b] = ((const cm_block_q8_k *)x)[b].d;
    for (int64_t i = r0; i < r1; i++)
        y[i] = akp_row(nb, (const uint8_t *)w + (size_t)i * w_stride, has_qh, ydv, yp, pairs);
}

static void gemv_ak4_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    akp_gemv(0, k, w, w_stride, x, y, r0, r1);
}
static void gemv_ak5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    akp_gemv(1, k, w, w_stride, x, y, r0, r1);
}

/* ---- prefill over the same rows: akp_row for up to AKG_T tokens
 * at once (a row's header, nibbles and scales made once for all of them), so
 * each (row, token) gets those functions' integer lanes, hence their bits
 * (vec_dot's). Rows in blocks of AKG_RB (in L2) against every group of
 * tokens (in L1).
 *
 * The lanes as the gemv computes them: a pair of groups (2p: the low
 * nibbles, 2p + 1: the high, meeting the token's bytes 64p.. and 64p +
 * 32..) is the layout's two vectors (ak_pair's order): A = dword l's low
 * unit of group 2p and of group 2p + 1, B = their high units, the token's
 * bytes alike. Then maddubs(A) + maddubs(B) (int16: 4 products of one group
 * per word, <= 4 * 31 * 128 < 2^15) has in word 2l group 2p's four and in
 * word 2l + 1 group 2p + 1's, and one madd with the two scales gives lane l
 * both groups' terms. The same integers lane for lane: the same bits.
 *
 * What a group of tokens needs is laid out once per (row block, group)
 * (akg_toks): the tokens' bytes block by block so paired (one pointer for all
 * T), their d, and for each pair of tokens the bsums pair sums and d side by
 * side in one vector, so the min term of two tokens takes one madd,
 * conversion, product and FMA (the same operations lane for lane as
 * akp_row's 128-bit ones: the same bits), and d * dy of 8 tokens one
 * product. ---- */
enum { AKG_T = 8, AKG_P = AKG_T / 2, AKG_RB = 128, AKG_CB = 1536 /* (row, super-block)s unpacked at once */ };

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
 * (akp_vals), sc2[p] their two scales as words (2p low), mn2 the mins as
 * words in both halves, d, dmin. */
typedef struct {
    __m256i v[8], mn2;
    int32_t sc2[4];
    float d, dmin;
} akg_blk;

/* One super-block in pair order: qs (and q5_k's V at qhp when has_qh, a
 * constant), its scale words (ak_scw), mins as words. */
AI void akg_unpack_blk(const uint8_t *qs, const uint8_t *qhp, int has_qh, const int32_t *scw, __m128i mn16, float d,
                       float dmin, akg_blk *o) {
    const __m256i qhv = has_qh ? ld256(qhp) : _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) akp_vals(qs, qhv, has_qh, c, &o->v[2 * c], &o->v[2 * c + 1]);
    memcpy(o->sc2, scw, sizeof o->sc2); /* dword p: words 2p, 2p + 1 */
    o->mn2 = _mm256_broadcastsi128_si256(mn16);
    o->d = d;
    o->dmin = dmin;
}
/* A repacked row (q4_k pairs, or q5_k pairs when has_qh) of nb super-blocks into o[0..nb). */
static void akg_unpack(int64_t nb, const uint8_t *x, int has_qh, akg_blk *o) {
    const size_t group = has_qh ? 4 * sizeof(cm_block_q5_k) : (size_t)RK4_GROUP;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, x += group) {
        float dd[8];
        __m128i sc03, sc47, mn16[4];
        rk_header(x, dd, &sc03, &sc47, mn16);
        int32_t scw[16];
        ak_scw4(sc03, sc47, scw);
        for (int j = 0; j < 4; j++) {
            if (has_qh)
                akg_unpack_blk(x + 192 + 128 * j, x + 64 + 32 * j, 1, scw + 4 * j, mn16[j], dd[j], dd[4 + j],
                               &o[b + j]);
            else akg_unpack_blk(x + 64 + 128 * j, NULL, 0, scw + 4 * j, mn16[j], dd[j], dd[4 + j], &o[b + j]);
        }
    }
    for (; b < nb; b++) { /* the file's last nb % 4 super-blocks, quants in pair order */
        uint8_t sc[8], mn[8];
        int32_t scw[4];
        if (has_qh) {
            const cm_block_q5_k *xt = (const cm_block_q5_k *)(const void *)x + (b - nb / 4 * 4);
            cm_k4_scales8(xt->scales, sc, mn);
            ak_scw(_mm_loadl_epi64((const __m128i *)sc), scw);
            akg_unpack_blk(xt->qs, xt->qh, 1, scw, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f16f(xt->d),
                           f16f(xt->dmin), &o[b]);
        } else {
            const cm_block_q4_k *xt = (const cm_block_q4_k *)(const void *)x + (b - nb / 4 * 4);
            cm_k4_scales8(xt->scales, sc, mn);
            ak_scw(_mm_loadl_epi64((const __m128i *)sc), scw);
            akg_unpack_blk(xt->qs, NULL, 0, scw, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), f16f(xt->d),
                           f16f(xt->dmin), &o[b]);
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
                   ng); /* the next block of rows (avx2_q6k.h) */
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
