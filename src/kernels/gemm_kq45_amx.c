/*
 * gemm_kq45_amx.c: the avx512 table's q4_k and q5_k prefill gemms on AMX tiles
 * (Sapphire Rapids and later), bit-identical to that table's vec_dot.
 *
 * Both types share the avx512 table's float order (z4, gemm_kq4_avx512.c;
 * z5, avx512_krepack.h): per super-block b the exact integers S_b (the sum
 * over its 256 weights of sc_j(i) * q_i * y_i, sc_j the 6-bit scale of
 * sub-block j) and M_b (sum_j mn_j * Y_j, Y_j the token's sum over
 * sub-block j, from the q8_k bsums), each converted to f32 once; float lane
 * l = b % 16 gets acc_l = fma(f32(S_b), d * dy, acc_l), then acc_l =
 * fma(f32(M_b), -dmin * dy, acc_l) (b ascending), and the 16 lanes are
 * summed in _mm512_reduce_add_ps's tree. Only the integers are formed
 * differently here, which is free: the same bits for every (row, token).
 *
 * S_b on tiles: p_i = sc_j(i) * q_i < 2^11 (q5_k: 31 * 63) is split into
 * bytes lo_i = p_i & 255 and hi_i = p_i >> 8; one TDPBUSD (unsigned A,
 * signed B) per 64 weights accumulates sum(lo * y) and another sum(hi * y)
 * over the whole super-block into two C tiles (16 rows x 16 tokens), and
 * S_b = C_lo + 256 * C_hi exactly (|C_lo| <= 256 * 255 * 128, |S_b| < 2^26):
 * 8 TDPBUSD per super-block and no multiply by the scales afterwards. M_b:
 * four vpdpwssd per row against the tokens' Y pairs (AVX-512), as
 * gemm_kq4_avx512.c's kt4_rows. The float epilogue then does exactly the
 * operations above with the 16 tokens of a row in one vector; the lanes'
 * chains (l = 0..15, blocks l, l + 16, ...) run one after another, the next
 * block's tiles issued between the current block's row epilogues.
 *
 * Operands: A = the byte-split products of 16 weight rows, built per call
 * into a per-thread panel (row-major, 64 bytes a tile row: no second copy of
 * the weights in memory) with each row's d, -dmin and mins word pairs;
 * B = 16 tokens' q8_k values in the VNNI layout (row c of a tile: the 16
 * tokens' bytes 4c..4c+3), packed once per call with their Y pairs and dy
 * (a last group of fewer than 16 tokens padded with zeros, its results
 * never stored). Rows past a slice's end repeat its last row (never stored).
 *
 * Tile configuration is per thread and per call (loaded, released before
 * returning). Compiled with the AMX flags (Makefile); installed by
 * gemm_amx.c's cm_kernels_fill_amx (only where AMX-INT8 is usable and
 * CUMULO_AMX is not 0). Below ak_mintok's tokens, or for rows longer than
 * AK_MAXNB super-blocks, it hands over to the table's gemm it replaced.
 * Tests: tests/unit/test_kernels_amxk.c. Stack: ~1.8 MiB at most (compute
 * threads have CM_COMPUTE_STACK, 8 MiB). Never allocates.
 */
#include "amx.h"
#include "isa.h"

#include "base/base.h"
#include "ref.h"

#include <immintrin.h>
#include <string.h>

#include "avx512_kpacked.h"

#define AKI static inline __attribute__((always_inline))

enum {
    AK_MAXNB = 64,         /* longest row, in super-blocks (k <= 16384) */
    AK_PB = 8192,          /* panel bytes per super-block: 4 lo tiles, 4 hi tiles, 16 x 64 bytes each */
    AK_TB = 4416,          /* a packed group's super-block: 4 B tiles (4096), 4 Y pair vectors, dy */
    AK_PACK = 1024 * 1024, /* packed tokens per pass (one group of the longest row fits) */
    AK_GMAX = 16,          /* groups of 16 tokens per pass at most */
};

static cm_gemm_fn g_prev_q4_k, g_prev_q5_k;

/* The panel of rows w (stride ws), R of them (R <= 16; lanes past R repeat
 * row R - 1): per super-block b the byte-split products at pa + AK_PB * b
 * (tile k of lo at 1024 k, of hi at 4096 + 1024 k, row r at 64 r), and the
 * rows' d (pd[16 b + r]), -dmin (pn) and mins word pairs (pm[16 (4 b + u) + r]
 * = mn_2u | mn_2u+1 << 16). q5: q5_k rows, else q4_k. */
AKI void ak_panel(bool q5, int64_t nb, const uint8_t *w, size_t ws, int R, uint8_t *pa, float *pd, float *pn,
                  int32_t *pm, bool lanes) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1), mlo = _mm512_set1_epi16(0x00ff);
    /* per 64-weight chunk: shift counts of the low (elements 64k..) and high (64k+32..) nibbles */
    const __m512i nsh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    for (int r = 0; r < 16; r++) {
        const uint8_t *row = w + (size_t)(r < R ? r : R - 1) * ws;
        for (int64_t b = 0; b < nb; b++) {
            cm_block_q5_k tmp; /* lanes: the rows are "q5_k lanes", this super-block in the file's form */
            if (lanes) kp_q5_blk(row, nb, b, &tmp);
            const uint8_t *blk =
                lanes ? (const uint8_t *)&tmp : row + (size_t)b * (q5 ? sizeof(cm_block_q5_k) : sizeof(cm_block_q4_k));
            const cm_block_q4_k *b4 = (const cm_block_q4_k *)(const void *)blk;
            const cm_block_q5_k *b5 = (const cm_block_q5_k *)(const void *)blk;
            uint8_t sc[8], mn[8];
            cm_k4_scales8(q5 ? b5->scales : b4->scales, sc, mn);
            uint64_t sc64;
            memcpy(&sc64, sc, 8);
            /* the 8 scales as words 0..7, sub-block 2k's in words 0..15 of kth vector, 2k+1's in 16..31 */
            const __m512i scw = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_cvtsi64_si128((long long)sc64)));
            const uint8_t *qs = q5 ? b5->qs : b4->qs;
            const __m512i h5 = q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)b5->qh))
                                  : _mm512_setzero_si512();
            uint8_t *pr = pa + (size_t)b * AK_PB + 64 * r;
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i q =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * k)));
                __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, nsh), m4);
                if (q5) { /* bit 2k (low nibbles) or 2k + 1 (high) of qh as bit 4 */
                    const __m512i hb = _mm512_srlv_epi16(
                        h5, _mm512_add_epi16(_mm512_srli_epi16(nsh, 2), _mm512_set1_epi16((short)(2 * k))));
                    v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(hb, one), 4));
                }
                const __m512i sk = _mm512_permutexvar_epi16(
                    _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * k)), _mm256_set1_epi16((short)(2 * k + 1)), 1),
                    scw);
                const __m512i pe = _mm512_mullo_epi16(_mm512_and_si512(v, mlo), sk);
                const __m512i po = _mm512_mullo_epi16(_mm512_srli_epi16(v, 8), sk);
                /* lo bytes: pe & 0xff | po << 8; hi bytes: pe >> 8 | po & 0xff00 */
                _mm512_store_si512((void *)(pr + 1024 * k),
                                   _mm512_ternarylogic_epi32(mlo, pe, _mm512_slli_epi16(po, 8), 0xca));
                _mm512_store_si512((void *)(pr + 4096 + 1024 * k),
                                   _mm512_ternarylogic_epi32(mlo, _mm512_srli_epi16(pe, 8), po, 0xca));
            }
            pd[16 * b + r] = _cvtsh_ss(b4->d);
            pn[16 * b + r] = -_cvtsh_ss(b4->dmin);
            for (int u = 0; u < 4; u++)
                pm[16 * (4 * b + u) + r] = (int32_t)((uint32_t)mn[2 * u] | (uint32_t)mn[2 * u + 1] << 16);
        }
    }
}

/* Pack T (1..16) tokens at x (stride xs, q8_k rows of nb super-blocks) into
 * one group, AK_TB bytes per super-block: dword 16 c + t = token t's bytes
 * 4c..4c+3 (c < 64), then dword 1024 + 16 u + t = its Y_2u | Y_2u+1 << 16,
 * then float 1088 + t = its d; zeros past T. */
static void ak_pack(int64_t nb, const uint8_t *x, size_t xs, int T, uint8_t *d) {
    for (int64_t b = 0; b < nb; b++) {
        uint32_t *a = (uint32_t *)(void *)(d + (size_t)b * AK_TB);
        float *dy = (float *)(void *)(a + 1088);
        for (int t = 0; t < 16; t++) {
            if (t >= T) {
                for (int c = 0; c < 68; c++) a[16 * c + t] = 0;
                dy[t] = 0.0f;
                continue;
            }
            const cm_block_q8_k *y = (const cm_block_q8_k *)(const void *)(x + (size_t)t * xs) + b;
            uint32_t v[64];
            memcpy(v, y->qs, 256);
            for (int c = 0; c < 64; c++) a[16 * c + t] = v[c];
            for (int u = 0; u < 4; u++) {
                const uint16_t y0 = (uint16_t)(y->bsums[4 * u] + y->bsums[4 * u + 1]);
                const uint16_t y1 = (uint16_t)(y->bsums[4 * u + 2] + y->bsums[4 * u + 3]);
                a[1024 + 16 * u + t] = y0 | (uint32_t)y1 << 16;
            }
            dy[t] = y->d;
        }
    }
}

/* Rows r0..r0+3 of super-block b's epilogue: cc its C_lo (C_hi at + 256), tb its packed tokens. */
AKI void ak_fin4(int r0, int64_t b, const int32_t *cc, const uint8_t *tb, const float *pd, const float *pn,
                 const int32_t *pm, __m512 *acc) {
    const __m512i z = _mm512_setzero_si512();
    const __m512 dy = _mm512_load_ps((const void *)(tb + 4352));
    _Pragma("GCC unroll 4") for (int r = r0; r < r0 + 4; r++) {
        const __m512i S = _mm512_add_epi32(_mm512_load_si512((const void *)(cc + 16 * r)),
                                           _mm512_slli_epi32(_mm512_load_si512((const void *)(cc + 256 + 16 * r)), 8));
        __m512i M = z;
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) M = _mm512_dpwssd_epi32(
            M, _mm512_load_si512((const void *)(tb + 4096 + 64 * u)), _mm512_set1_epi32(pm[16 * (4 * b + u) + r]));
        const __m512 a =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(_mm512_set1_ps(pd[16 * b + r]), dy), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(_mm512_set1_ps(pn[16 * b + r]), dy), a);
    }
}

/* out[r] (row r's 16 tokens) -> out[t] (token t's 16 rows) */
AKI void ak_transpose(__m512 *o) {
    __m512 u[4][4]; /* u[e][q]: 128-bit lane L holds rows 4q..4q+3 of token 4L + e */
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
        const __m512 t0 = _mm512_unpacklo_ps(o[4 * q], o[4 * q + 1]), t1 = _mm512_unpackhi_ps(o[4 * q], o[4 * q + 1]);
        const __m512 t2 = _mm512_unpacklo_ps(o[4 * q + 2], o[4 * q + 3]),
                     t3 = _mm512_unpackhi_ps(o[4 * q + 2], o[4 * q + 3]);
        u[0][q] = _mm512_shuffle_ps(t0, t2, 0x44);
        u[1][q] = _mm512_shuffle_ps(t0, t2, 0xee);
        u[2][q] = _mm512_shuffle_ps(t1, t3, 0x44);
        u[3][q] = _mm512_shuffle_ps(t1, t3, 0xee);
    }
    _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[e][0], u[e][1], 0x44),
                     v1 = _mm512_shuffle_f32x4(u[e][0], u[e][1], 0xee);
        const __m512 v2 = _mm512_shuffle_f32x4(u[e][2], u[e][3], 0x44),
                     v3 = _mm512_shuffle_f32x4(u[e][2], u[e][3], 0xee);
        o[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        o[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        o[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        o[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}

/* One group's epilogue of super-block b (cc: its C_lo, C_hi at + 256; tb:
 * its packed tokens): the lane chain b % 16 goes on from am (or +0 at the
 * chain's start) and back to am, or at the chain's end into hs (lane
 * l >= 8's added to lane l - 8's: the tree's first level). */
AKI void ak_gfin(int64_t b, int64_t nb, const int32_t *cc, const uint8_t *tb, const float *pd, const float *pn,
                 const int32_t *pm, __m512 *am, __m512 (*hs)[16]) {
    __m512 acc[16];
    if (b < 16) _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    else _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) acc[r] = am[r];
    ak_fin4(0, b, cc, tb, pd, pn, pm, acc);
    ak_fin4(4, b, cc, tb, pd, pn, pm, acc);
    ak_fin4(8, b, cc, tb, pd, pn, pm, acc);
    ak_fin4(12, b, cc, tb, pd, pn, pm, acc);
    const int l = (int)(b % 16);
    if (b + 16 < nb) _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) am[r] = acc[r];
    else if (l < 8) _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) hs[l][r] = acc[r];
    else _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) hs[l - 8][r] = _mm512_add_ps(acc[r], hs[l - 8][r]);
}

/* Tiles 4..7 += the 64 weights 64k.. of super-block b against the groups at x0 (4, 5: lo, hi) and x1 (6, 7). */
#define AK_PCHUNK(b, x0, x1, k)                                         \
    do {                                                                \
        _tile_loadd(0, pa + (size_t)(b)*AK_PB + 1024 * (k), 64);        \
        _tile_loadd(2, (x0) + (size_t)(b)*AK_TB + 1024 * (k), 64);      \
        _tile_dpbusd(4, 0, 2);                                          \
        _tile_loadd(1, pa + (size_t)(b)*AK_PB + 4096 + 1024 * (k), 64); \
        _tile_dpbusd(5, 1, 2);                                          \
        _tile_loadd(3, (x1) + (size_t)(b)*AK_TB + 1024 * (k), 64);      \
        _tile_dpbusd(6, 0, 3);                                          \
        _tile_dpbusd(7, 1, 3);                                          \
    } while (0)
#define AK_PSTORE(dst)                    \
    do {                                  \
        _tile_stored(4, (dst), 64);       \
        _tile_stored(5, (dst) + 256, 64); \
        _tile_stored(6, (dst) + 512, 64); \
        _tile_stored(7, (dst) + 768, 64); \
    } while (0)
#define AK_PZERO()     \
    do {               \
        _tile_zero(4); \
        _tile_zero(5); \
        _tile_zero(6); \
        _tile_zero(7); \
    } while (0)

/* The 16 rows of a panel against ngr (<= AK_GMAX) packed groups of tokens
 * (gbytes apart), results of token t of group g (t < 16, below ntp - 16 g)
 * to yg + (16 g + t) * ldy under mask mk. The super-blocks run in chain
 * order (b % 16 = 0 first, each chain ascending), each against every group
 * before the next (its panel tiles stay in L1), two groups a step (A tiles
 * loaded once for both; an odd last group paired with itself, the copy's
 * sums unused), a group's chain state in am; while one step's epilogues run,
 * the next step's tiles are computed and stored to the other half of cb. */
static void ak_groups(int64_t nb, int64_t ngr, int64_t ntp, const uint8_t *xp0, size_t gbytes, const uint8_t *pa,
                      const float *pd, const float *pn, const int32_t *pm, int32_t *cb, __m512 (*am)[16],
                      __m512 (*hs)[8][16], float *yg, int64_t ldy, __mmask16 mk) {
    int64_t seq[AK_MAXNB];
    int ns = 0;
    for (int64_t l = 0; l < 16 && l < nb; l++)
        for (int64_t b = l; b < nb; b += 16) seq[ns++] = b;
    const int64_t np = (ngr + 1) / 2;
#define AK_X(g) (xp0 + (size_t)((g) < ngr ? (g) : ngr - 1) * gbytes)
    AK_PZERO();
    for (int k = 0; k < 4; k++) AK_PCHUNK(seq[0], AK_X(0), AK_X(1), k);
    AK_PSTORE(cb);
    int64_t par = 0; /* steps done, for the half of cb */
    for (int s = 0; s < ns; s++) {
        const int64_t b = seq[s];
        for (int64_t p = 0; p < np; p++, par++) {
            const int64_t g0 = 2 * p, g1 = 2 * p + 1;
            const int32_t *cc = cb + 1024 * (par & 1);
            const uint8_t *t0 = AK_X(g0) + (size_t)b * AK_TB, *t1 = AK_X(g1) + (size_t)b * AK_TB;
            if (p + 1 < np || s + 1 < ns) {
                const int64_t bn = p + 1 < np ? b : seq[s + 1], pn2 = p + 1 < np ? 2 * p + 2 : 0;
                const uint8_t *x0 = AK_X(pn2), *x1 = AK_X(pn2 + 1);
                int32_t *cn = cb + 1024 * ((par + 1) & 1);
                AK_PZERO();
                AK_PCHUNK(bn, x0, x1, 0);
                AK_PCHUNK(bn, x0, x1, 1);
                ak_gfin(b, nb, cc, t0, pd, pn, pm, am[g0], hs[g0]);
                AK_PCHUNK(bn, x0, x1, 2);
                AK_PCHUNK(bn, x0, x1, 3);
                AK_PSTORE(cn);
            } else {
                ak_gfin(b, nb, cc, t0, pd, pn, pm, am[g0], hs[g0]);
            }
            if (g1 < ngr) ak_gfin(b, nb, cc + 512, t1, pd, pn, pm, am[g1], hs[g1]);
        }
    }
#undef AK_X
    for (int64_t g = 0; g < ngr; g++) {
        /* the rest of _mm512_reduce_add_ps's tree, for 16 tokens at once (kt4_rows'); lanes without
         * a block hold +0 and are added all the same */
        const __m512 z = _mm512_setzero_ps();
        __m512 out[16];
        for (int r = 0; r < 16; r++) {
            __m512 h[8];
            for (int i = 0; i < 8; i++) {
                h[i] = i < nb ? hs[g][i][r] : z;
                if (i + 8 >= nb) h[i] = _mm512_add_ps(z, h[i]);
            }
            for (int i = 0; i < 4; i++) h[i] = _mm512_add_ps(h[i + 4], h[i]);
            out[r] = _mm512_add_ps(_mm512_add_ps(h[0], h[2]), _mm512_add_ps(h[1], h[3]));
        }
        ak_transpose(out);
        const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(yg + (16 * g + t) * ldy, mk, out[t]);
    }
}

static void ak_gemm(bool q5, int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok, bool lanes) {
    const int64_t nb = k / CM_QK_K;
    _Alignas(64) uint8_t pa[AK_MAXNB * AK_PB], xp[AK_PACK];
    _Alignas(64) float pd[AK_MAXNB * 16], pn[AK_MAXNB * 16];
    _Alignas(64) int32_t pm[AK_MAXNB * 64], cb[2048];
    _Alignas(64) __m512 am[AK_GMAX][16], hs[AK_GMAX][8][16];
    const size_t gbytes = (size_t)nb * AK_TB;
    int64_t gcap = (int64_t)(AK_PACK / gbytes); /* groups of 16 tokens per pass */
    if (gcap > AK_GMAX) gcap = AK_GMAX;
    cm_amx_calls++;
    /* Tiles: 0 and 1 B (16 x 64 bytes: 64 activations of 16 tokens), 2 and 3 A (16 rows x 64
     * bytes: lo, hi), 4 to 7 C (16 rows x 16 int32: lo, hi of two super-blocks in flight). */
    cm_amx_config(NULL, NULL);
    for (int64_t j0 = 0; j0 < n_tok; j0 += 16 * gcap) {
        const int64_t ntp = n_tok - j0 < 16 * gcap ? n_tok - j0 : 16 * gcap, ngr = (ntp + 15) / 16;
        for (int64_t g = 0; g < ngr; g++) {
            const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
            ak_pack(nb, (const uint8_t *)x + (size_t)(j0 + 16 * g) * x_stride, x_stride, T, xp + (size_t)g * gbytes);
        }
        for (int64_t i = r0; i < r1; i += 16) {
            const int R = r1 - i < 16 ? (int)(r1 - i) : 16;
            if (lanes) ak_panel(true, nb, (const uint8_t *)w + (size_t)i * w_stride, w_stride, R, pa, pd, pn, pm, true);
            else ak_panel(q5, nb, (const uint8_t *)w + (size_t)i * w_stride, w_stride, R, pa, pd, pn, pm, false);
            ak_groups(nb, ngr, ntp, xp, gbytes, pa, pd, pn, pm, cb, am, hs, y + j0 * ldy + i, ldy,
                      (__mmask16)((1u << R) - 1));
        }
    }
    _tile_release();
}

/* The fewest tokens (rows of nb super-blocks) taken from the replaced gemm
 * (bench/amxcross.c, thread CPU time, best of 5, 1 thread, Xeon family 6
 * model 167, HISTORY.md session 21; the panel's build is most of the time
 * below 16 tokens, one pass up to 16). AMX / avx512 gemm, rows x k: q4_k
 * 1.09-1.20x at 9 tokens on 2048 x 768, 1.06x at 11 on 4096 x 1024, but
 * at 13-16 for k 2048 0.89-0.95x (768 rows), 1.03-1.07x (2048), 0.96-1.16x
 * (6144), a tie that the 8-layer MoE's Q4_K_M prompt (expert gate / up 768 x
 * 2048) did not resolve: 16 from k 1280; q5_k 1.02-1.03x at 9 for k 768 and
 * 1024, 0.95-1.04x at 17 and 1.01-1.08x at 18 for k 2048 and 8192; over "q5_k
 * lanes" 1.16-1.27x at 9 for k 768 and 1024, 0.97-1.00x at 9-16 and 1.03-1.10x
 * at 17 for k 2048 and 8192. */
static int ak_mintok(bool q5, bool lanes, int64_t nb) {
    if (!q5) return nb <= 3 ? 9 : nb <= 4 ? 11 : 16;
    if (nb <= 4) return 9;
    return lanes ? 17 : 18;
}

static void gemm_xq4_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < ak_mintok(false, false, k / CM_QK_K) || k / CM_QK_K > AK_MAXNB) {
        g_prev_q4_k(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ak_gemm(false, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

static void gemm_xq5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < ak_mintok(true, false, k / CM_QK_K) || k / CM_QK_K > AK_MAXNB) {
        g_prev_q5_k(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ak_gemm(true, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

/* The same over "q5_k lanes" (the table's gemm_packed, which it wraps: the
 * file's pages under the copy are given back, cm_repack_give_back). */
static cm_gemm_fn g_prev_pq5_k;
static void gemm_xpq5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < ak_mintok(true, true, k / CM_QK_K) || k / CM_QK_K > AK_MAXNB) {
        g_prev_pq5_k(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    ak_gemm(true, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

/* The AMX paths for every n_tok (tests and kbench; rows up to AK_MAXNB super-blocks). */
static void gemm_aq4_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ak_gemm(false, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}
static void gemm_aq5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ak_gemm(true, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

void cm_kernels_fill_amxk(cm_kernels *k) {
    g_prev_q4_k = k->gemm[CM_TYPE_Q4_K];
    g_prev_q5_k = k->gemm[CM_TYPE_Q5_K];
    CM_ASSERT(g_prev_q4_k && g_prev_q5_k);
    k->gemm[CM_TYPE_Q4_K] = gemm_xq4_k;
    k->gemm[CM_TYPE_Q5_K] = gemm_xq5_k;
    if (k->gemm_packed[CM_TYPE_Q5_K]) {
        g_prev_pq5_k = k->gemm_packed[CM_TYPE_Q5_K];
        k->gemm_packed[CM_TYPE_Q5_K] = gemm_xpq5_k;
    }
}

static void gemm_apq5_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) ak_gemm(true, k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

cm_gemm_fn cm_kernels_amxk_direct(enum cm_type t, bool packed, int64_t k, int *mintok) {
    *mintok = t == CM_TYPE_Q4_K && !packed ? ak_mintok(false, false, k / CM_QK_K)
              : t == CM_TYPE_Q5_K          ? ak_mintok(true, packed, k / CM_QK_K)
                                           : 0;
    return t == CM_TYPE_Q4_K && !packed ? gemm_aq4_k : t == CM_TYPE_Q5_K ? (packed ? gemm_apq5_k : gemm_aq5_k) : NULL;
}
