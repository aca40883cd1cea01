/*
 * kernels_avx512.c: AVX-512 F/BW/VL + VNNI + BF16 (Ice Lake, Sapphire Rapids,
 * Zen 4 and later) versions of the kernels.
 *
 * Compiled with this ISA's flags only (Makefile) and called only when
 * cm_cpu_features_get() says the CPU has all of them (dispatch.c).
 * cm_kernels_fill_avx512() runs after cm_kernels_fill_avx2() on the same
 * table. It installs x86_tiles.h compiled with vpdpbusd (VNNI) for the byte
 * dot products, then replaces the hottest types with 512-bit tiles written
 * here: q4_0 (16 blocks per step, in the "lane order" below) and q8_0 (two
 * blocks per vector), whose fp16 scales are converted eight at a time; q6_k
 * (64 weights per vector); f32 and f16 (FMA), and bf16 with the
 * vdpbf16ps pair dot product (it treats denormal inputs as zero, which
 * activations and weights of real models never are).
 * gemm runs the same tiles as vec_dot (4 tokens per weight-row pass), so
 * every (row, token) gets vec_dot's bits whatever the batch (kernels.h);
 * q4_0, q8_0 and f16 instead use avx512_gemm.h, which repacks the
 * activations once per call and replays the tiles' exact arithmetic from the
 * packed operands (q4_0: 16 tokens across the lanes x 2 rows; 2 rows x 4
 * tokens for q8_0 and f16); q8_0 and f16 prefill now run
 * avx512_prefill.h (the same chains one at a time, 4 x 4 and 6 x 4 register
 * tiles), which falls back to those for rows longer than 16384. q4_0 also has a decode gemv
 * (4 rows per pass against the token packed once), same bits again, and
 * q4_0 and q5_k decode gemvs over rows repacked at load (repack.c;
 * avx512_krepack.h for the k-quants, which also has q5_k's and q6_k's plain
 * gemvs; q6_k's repacked one is in gemm_kq6_avx512.c; gemv_kd_avx512.c, filled
 * after them, replaces the repacked q5_k and q6_k decode gemvs and
 * q5_k's plain one with the same bits in fewer operations);
 * f16 (rows of up to 2730 elements; longer ones run vec_dot per row) and
 * q8_0 decode gemvs that prepare the token once per call (avx512_gemv.h).
 * Every tile keeps the contract of isa.h: integer sums exactly the
 * reference's, only the float accumulation order free (q6_k converts each
 * super-block's exact integer sum once: rounded to nearest above 2^24). Tested against the
 * reference in tests/unit/test_kernels_simd.c and for batch invariance in
 * test_kernels_invariant.c. Never allocates.
 *
 * q4_0's float order was chosen for the gemm (one FMA per block for 16
 * tokens; the former 4-blocks-per-vector order needed a conversion, a scale
 * permute and an FMA per 4 blocks for every single token). The q8_0 entries
 * set here are replaced by q8lane_avx512.c's, which use that lane order
 * (dispatch.c fills it last); NEEDSWORK: drop the q8_0 tiles here once
 * nothing needs them. q5_k prefill runs gemm_kq_avx512.c, q6_k's
 * gemm_kq6_avx512.c (its 4-token tiles here the fallback for long rows);
 * bf16 prefill runs avx512_prefill.h's chain-outer gemm (4 rows x 6 tokens
 * of vdpbf16ps, same bits as vec_dot). Every q4_k entry (its own float order
 * "z4") is gemm_kq4_avx512.c's, filled after this.
 */
#define CM_X86_VNNI 1
#include "x86_tiles.h"

#include "base/base.h"
#include "tune.h"

#include <stddef.h>

AI __m512 z_f32(const void *p, int64_t i) { return _mm512_loadu_ps((const float *)p + i); }
AI __m512 z_f16(const void *p, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const cm_f16 *)p + i)));
}

/* 32 elements per step, two accumulators per token; the tail goes element
 * by element (tiles.h's CM_TILE_FLOAT). */
#define FMA16(acc, a, b) _mm512_fmadd_ps(a, b, acc)
#define HSUM16X2(a, b) _mm512_reduce_add_ps(_mm512_add_ps(a, b))
CM_TILE_FLOAT(ztile_f32, z_f32, sc_f32, __m512, 16, _mm512_setzero_ps(), FMA16, HSUM16X2)
CM_TILE_FLOAT(ztile_f16, z_f16, sc_f16, __m512, 16, _mm512_setzero_ps(), FMA16, HSUM16X2)

/* bf16: vdpbf16ps multiplies pairs of bf16 (exactly: 8-bit mantissas) and adds
 * both products into one float lane; 64 elements per step. */
AI void ztile_bf16(int64_t n, const void *x, const void *const *yv, int T, float *out) {
    __m512 a0[TMAX], a1[TMAX];
    for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm512_setzero_ps();
    const cm_bf16 *xb = x;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xb + i), x1 = (__m512bh)_mm512_loadu_si512(xb + i + 32);
        for (int t = 0; t < T; t++) {
            const cm_bf16 *yb = yv[t];
            a0[t] = _mm512_dpbf16_ps(a0[t], x0, (__m512bh)_mm512_loadu_si512(yb + i));
            a1[t] = _mm512_dpbf16_ps(a1[t], x1, (__m512bh)_mm512_loadu_si512(yb + i + 32));
        }
    }
    for (int t = 0; t < T; t++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
        for (int64_t k = i; k < n; k++) s += sc_bf16(x, k) * sc_bf16(yv[t], k);
        out[t] = s;
    }
}

/* ---- q4_0 and q8_0 with 512-bit vectors: two blocks per vector ----
 * Groups of 8 blocks. The 8 fp16 scales of a group are picked out of two
 * 64-byte loads with one word permute (instead of 8 scalar conversions), and
 * each pair of blocks is multiplied with vpdpbusd; |x| and the sign of x moved
 * onto y keep the unsigned x signed y form. The nb % 8 tail blocks use the
 * 256-bit tile. */

/* fp16 d of 8 consecutive blocks of 18 bytes (q4_0): words 0, 9, ..., 63. */
AI __m256 d8_q4_0(const void *p) {
    static const uint16_t idx[32] = {0, 9, 18, 27, 36, 45, 54, 63};
    const uint8_t *b = p;
    const __m512i w =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(b), _mm512_loadu_si512(idx), _mm512_loadu_si512(b + 64));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(w));
}
/* fp16 d of 8 consecutive blocks of 34 bytes (q8_0): words 0, 17, ..., 119. */
AI __m256 d8_q8_0(const void *p) {
    static const uint16_t i0[32] = {0, 17, 34, 51}, i1[32] = {0, 0, 0, 0, 4, 21, 38, 55};
    const uint8_t *b = p;
    const __m512i lo =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(b), _mm512_loadu_si512(i0), _mm512_loadu_si512(b + 64));
    const __m512i hi =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(b + 128), _mm512_loadu_si512(i1), _mm512_loadu_si512(b + 192));
    return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_blend_epi16(0xf0, lo, hi)));
}
AI __m512i ld2x256(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(ld256(a)), ld256(b), 1);
}
AI __m512i pair_q8_0(const cm_block_q8_0 *x) { return ld2x256(x[0].qs, x[1].qs); }

#define ZTILE_Q(NAME, XB, PAIR, D8X)                                                                                  \
    AI void ztile_##NAME(int64_t nb, const XB *x, const cm_block_q8_0 *const *yv, int T, float *out) {                \
        __m512 acc[2][TMAX];                                                                                          \
        for (int t = 0; t < T; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();                                      \
        const int64_t n8 = nb & ~(int64_t)7;                                                                          \
        for (int64_t b = 0; b < n8; b += 8) {                                                                         \
            const __m256 dx = D8X(x + b);                                                                             \
            __m512 sc[TMAX];                                                                                          \
            for (int t = 0; t < T; t++) sc[t] = _mm512_castps256_ps512(_mm256_mul_ps(dx, d8_q8_0(yv[t] + b)));        \
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                                     \
                const __m512i qx = PAIR(x + b + 2 * p);                                                               \
                const __m512i ax = _mm512_abs_epi8(qx);                                                               \
                const __mmask64 neg = _mm512_movepi8_mask(qx);                                                        \
                const __m512i pidx = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);   \
                for (int t = 0; t < T; t++) {                                                                         \
                    const cm_block_q8_0 *y = yv[t] + b + 2 * p;                                                       \
                    __m512i qy = ld2x256(y[0].qs, y[1].qs);                                                           \
                    qy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);                                   \
                    const __m512i sumi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, qy);                         \
                    acc[p & 1][t] =                                                                                   \
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_permutexvar_ps(pidx, sc[t]), acc[p & 1][t]); \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
        float tail[TMAX] = {0};                                                                                       \
        if (n8 < nb) {                                                                                                \
            const cm_block_q8_0 *yt[TMAX];                                                                            \
            for (int t = 0; t < T; t++) yt[t] = yv[t] + n8;                                                           \
            tile_##NAME(nb - n8, x + n8, yt, T, tail);                                                                \
        }                                                                                                             \
        for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t])) + tail[t];     \
    }

/* q4_0 in "lane order", the one order vec_dot, the decode gemv and the
 * tokens-in-lanes gemm (avx512_gemm.h) all follow, so they agree bit for bit:
 * block b's exact integer sum s_b = sum (q - 8) * y times d_b = dx_b * dy_b
 * (an f32 product) is FMAed into chain b mod 8 (blocks in ascending order),
 * and the 8 chains are summed by hsum8's tree ((c0+c4)+(c2+c6)) +
 * ((c1+c5)+(c3+c7)). Eight chains are what a gemm with 16 tokens across the
 * lanes can hold for 2 rows in registers, and a one-token dot gets 16 blocks'
 * sums into the lanes of one vector with a 4x4 transpose-add.
 *
 * The one-token side: vector i of a 16-block group holds in its 128-bit lane
 * L block 4L + i's 16 low nibbles (against y[0..15]) or high nibbles
 * (against y[16..31]); the nibbles stay unsigned for vpdpbusd and the -8
 * offset is subtracted as 8 * sum(y). */
AI __m512i ld4x128(const void *a, const void *b, const void *c, const void *d) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)a));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)b), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)c), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)d), 3);
}
/* p[i] has 4 int32 per 128-bit lane L, summing to block 4L + i's total:
 * returns the 16 totals, lane j = block j. */
AI __m512i hadd4x4(const __m512i p[4]) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}
AI __m512 d16(__m256 a, __m256 b) { return _mm512_insertf32x8(_mm512_castps256_ps512(a), b, 1); }
/* A q4_0 row's tail (the blocks past its last group of 16, in the file's
 * layout): blocks xt[0..n), n <= 8, into chains (lanes) 0..n-1 of c, block
 * j's exact integer sum s_j converted and one FMA with dx_j * dy_j: c_j =
 * fma(s_j, dx_j * dy_j, c_j), eight lanes at once. Callers pass blocks
 * 8i..8i+7 past a multiple of 16, in order: block b into lane b & 7, as one
 * block at a time did (through a store and reload of c per block: a TP
 * member's slice of ffn_down, 2816 of the 1B models' 5632 columns, 5 groups
 * and 8 blocks, spent a fifth of its gemv there). */
AI __m256 q4_0_tail(const cm_block_q4_0 *xt, const cm_block_q8_0 *y, int n, __m256 c) {
    __m256i p[8];
    _Alignas(16) uint16_t dx[8] = {0}, dy[8] = {0};
    for (int j = 0; j < 8; j++) {
        p[j] = _mm256_setzero_si256();
        if (j >= n) continue;
        p[j] = dot_s8s8(_mm256_sub_epi8(nibbles32(xt[j].qs), _mm256_set1_epi8(8)), ld256(y[j].qs));
        memcpy(&dx[j], &xt[j].d, 2);
        memcpy(&dy[j], &y[j].d, 2);
    }
    /* lane j of s: the 8 int32 of p[j] summed (integers: any order) */
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    const __m256i s =
        _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)dx)),
                                   _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)dy)));
    /* lanes past n keep c as it is (an FMA of zeros would turn -0 into +0) */
    return _mm256_mask3_fmadd_ps(_mm256_cvtepi32_ps(s), d, c, (__mmask8)((1u << n) - 1u));
}

AI void ztile_q4_0(int64_t nb, const cm_block_q4_0 *x, const cm_block_q8_0 *const *yv, int T, float *out) {
    __m256 c[TMAX];
    for (int t = 0; t < T; t++) c[t] = _mm256_setzero_ps();
    const int64_t n16 = nb & ~(int64_t)15;
    const __m512i m4 = _mm512_set1_epi8(0x0f), k8 = _mm512_set1_epi8(8), z = _mm512_setzero_si512();
    for (int64_t b = 0; b < n16; b += 16) {
        __m512i lo[4], hi[4];
        for (int i = 0; i < 4; i++) {
            const cm_block_q4_0 *xb = x + b + i;
            const __m512i q = ld4x128(xb[0].qs, xb[4].qs, xb[8].qs, xb[12].qs);
            lo[i] = _mm512_and_si512(q, m4);
            hi[i] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        }
        const __m512 dx = d16(d8_q4_0(x + b), d8_q4_0(x + b + 8));
        for (int t = 0; t < T; t++) {
            const cm_block_q8_0 *y = yv[t] + b;
            __m512i p[4];
            for (int i = 0; i < 4; i++) {
                const __m512i ylo = ld4x128(y[i].qs, y[i + 4].qs, y[i + 8].qs, y[i + 12].qs);
                const __m512i yhi = ld4x128(y[i].qs + 16, y[i + 4].qs + 16, y[i + 8].qs + 16, y[i + 12].qs + 16);
                p[i] = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo[i], ylo), hi[i], yhi),
                                        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, k8, ylo), k8, yhi));
            }
            const __m512 f = _mm512_cvtepi32_ps(hadd4x4(p));
            const __m512 d = _mm512_mul_ps(dx, d16(d8_q8_0(y), d8_q8_0(y + 8)));
            c[t] = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), c[t]);
            c[t] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), c[t]);
        }
    }
    for (int64_t b = n16; b < nb; b += 8) /* block b into lane b & 7, in block order */
        for (int t = 0; t < T; t++) c[t] = q4_0_tail(x + b, yv[t] + b, (int)CM_MIN(nb - b, 8), c[t]);
    for (int t = 0; t < T; t++) out[t] = hsum8(c[t]);
}

/* ---- q4_0 decode gemv: ztile_q4_0's lane order for 4 rows per pass ----
 * The token is packed once per call (per 16-block group: for i = 0..3 the
 * y halves of blocks 4i..4i+3 in the 128-bit lanes and -8 * sum(y) as the
 * initial vpdpbusd accumulator, then the 16 dy as f32), so each row costs one
 * weight load per 4 blocks, the nibble split, 8 vpdpbusd, the transpose-add
 * and 2 FMAs per 16 blocks, and 4 rows give 4 independent chains. Blocks
 * 4i..4i+3 in vector i put block 4i + L in lane 4L + i of the transpose-add;
 * one permute restores lane b = block b, after which every operation is
 * ztile_q4_0's (same ints, same dx * dy, same FMAs into the same chains, same
 * remainder and reduction), so each row equals vec_dot bit for bit
 * (test_kernels_invariant.c, n_tok 1). The rows a pass will need next are
 * prefetched a group at a time, spread over the current pass. */
enum { GQ_GROUP = 832, GQ_MAXG = 64, GQ_R = 4 };

AI void gq4_pack(int64_t ng, const cm_block_q8_0 *y, uint8_t *d) {
    const __m512i k8 = _mm512_set1_epi8(8), z = _mm512_setzero_si512();
    for (int64_t g = 0; g < ng; g++, y += 16, d += GQ_GROUP) {
        for (int i = 0; i < 4; i++) {
            const cm_block_q8_0 *yb = y + 4 * i;
            const __m512i lo = ld4x128(yb[0].qs, yb[1].qs, yb[2].qs, yb[3].qs);
            const __m512i hi = ld4x128(yb[0].qs + 16, yb[1].qs + 16, yb[2].qs + 16, yb[3].qs + 16);
            _mm512_store_si512((void *)(d + 192 * i), lo);
            _mm512_store_si512((void *)(d + 192 * i + 64), hi);
            _mm512_store_si512((void *)(d + 192 * i + 128),
                               _mm512_sub_epi32(z, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, k8, lo), k8, hi)));
        }
        _mm512_store_ps((void *)(d + 768), d16(d8_q8_0(y), d8_q8_0(y + 8)));
    }
}

AI void gq4_rows(int64_t nb, const cm_block_q4_0 *const *x, const uint8_t *pk, const cm_block_q8_0 *y,
                 const char *const *pf, size_t pf_bytes, int R, float *out) {
    const int64_t ng = nb / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m256 c[GQ_R];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) c[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *pg = pk + (size_t)g * GQ_GROUP;
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            if (pf[r])
                for (int o = 0; o < 320; o += 64) _mm_prefetch(pf[r] + (size_t)g * 288 + (size_t)o, _MM_HINT_NTA);
            __m512i p[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                const cm_block_q4_0 *xb = x[r] + 16 * g + 4 * i;
                const __m512i q = ld4x128(xb[0].qs, xb[1].qs, xb[2].qs, xb[3].qs);
                const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                const uint8_t *pi = pg + 192 * i;
                p[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_load_si512((const void *)(pi + 128)), lo,
                                                               _mm512_load_si512((const void *)pi)),
                                           hi, _mm512_load_si512((const void *)(pi + 64)));
            }
            const __m512 f = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(perm, hadd4x4(p)));
            const __m512 dx = d16(d8_q4_0(x[r] + 16 * g), d8_q4_0(x[r] + 16 * g + 8));
            const __m512 d = _mm512_mul_ps(dx, _mm512_load_ps((const void *)(pg + 768)));
            c[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), c[r]);
            c[r] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), c[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (pf[r])
            for (size_t o = (size_t)ng * 288; o < pf_bytes; o += 64) _mm_prefetch(pf[r] + o, _MM_HINT_NTA);
        for (int64_t b = 16 * ng; b < nb; b += 8) c[r] = q4_0_tail(x[r] + b, y + b, (int)CM_MIN(nb - b, 8), c[r]);
        out[r] = hsum8(c[r]);
    }
}

static void vec_dot_zq4_0(int64_t n, float *s, const void *x, const void *y);

static void gemv_zq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK4_0, ng = nb / 16;
    if (ng > GQ_MAXG) { /* longer than the packed token fits: one row at a time */
        for (int64_t i = r0; i < r1; i++) vec_dot_zq4_0(k, &y[i], (const char *)w + (size_t)i * w_stride, x);
        return;
    }
    _Alignas(64) uint8_t pk[GQ_MAXG * GQ_GROUP];
    const cm_block_q8_0 *yq = x;
    gq4_pack(ng, yq, pk);
    const size_t row_bytes = (size_t)nb * sizeof(cm_block_q4_0);
    for (int64_t i = r0; i < r1; i += GQ_R) {
        const int R = r1 - i < GQ_R ? (int)(r1 - i) : GQ_R;
        const cm_block_q4_0 *xr[GQ_R];
        const char *pf[GQ_R];
        for (int r = 0; r < R; r++) {
            xr[r] = (const cm_block_q4_0 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);
            pf[r] = i + GQ_R + r < r1 ? (const char *)xr[r] + GQ_R * w_stride : NULL;
        }
        switch (R) {
        case 4: gq4_rows(nb, xr, pk, yq, pf, row_bytes, 4, y + i); break;
        case 3: gq4_rows(nb, xr, pk, yq, pf, row_bytes, 3, y + i); break;
        case 2: gq4_rows(nb, xr, pk, yq, pf, row_bytes, 2, y + i); break;
        default: gq4_rows(nb, xr, pk, yq, pf, row_bytes, 1, y + i); break;
        }
    }
}

/* ---- q4_0 decode gemv over the "q4_0 lanes" repacked rows (repack.c) ----
 * A group of 16 blocks is 4 aligned-free 64-byte loads whose int32 lane j is
 * block j's: low nibbles dotted with the token's y[4q..4q+3] of block j, high
 * nibbles with y[16+4q..], both through vpdpbusd into lanes that start at
 * -8 * sum(y_j) (the token is packed that way once per call: 8 vectors, the
 * offsets, the 16 dy as f32; 640 bytes per group). Lane j then holds block
 * j's exact s_j, and the rest is ztile_q4_0's arithmetic (dx_j * dy_j, the
 * same two FMAs into chains j mod 8, the same remainder and hsum8), so each
 * row equals vec_dot on the file's bytes bit for bit. One row per pass: a
 * single sequential stream, which the hardware prefetcher follows best. */
/* Each group's 5 lines are prefetched RQ_PFD bytes ahead (rows are
 * contiguous; prefetches never fault): the 1B q4_0 model's decode at 2
 * threads, median token 16.9-17.2 ms against 18.8-19.0 without (session 19,
 * Intel Xeon; 1024 bytes: 17.6-17.7). The distance is the knob
 * CM_TUNE_Q4_0_GEMV_PFD (tune.h: chosen per CPU at load, 2048 by default). */
enum { RQ_GROUP = 640, RQ_MAXG = CM_REPACK_MAX_K / 512 };

AI void rq4_pack(int64_t ng, const cm_block_q8_0 *y, uint8_t *d) {
    const __m512i k8 = _mm512_set1_epi8(8), z = _mm512_setzero_si512();
    /* lane j: the offset of block j's qs in the token */
    const __m512i idx =
        _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)sizeof(cm_block_q8_0))),
                         _mm512_set1_epi32((int)offsetof(cm_block_q8_0, qs)));
    for (int64_t g = 0; g < ng; g++, y += 16, d += RQ_GROUP) {
        __m512i b = z;
        for (int q = 0; q < 8; q++) { /* vector q: y[4q..4q+3] of each block (q >= 4: the high half) */
            const __m512i v = _mm512_i32gather_epi32(idx, (const void *)((const uint8_t *)y + 4 * q), 1);
            _mm512_store_si512((void *)(d + 64 * q), v);
            b = _mm512_dpbusd_epi32(b, k8, v);
        }
        _mm512_store_si512((void *)(d + 512), _mm512_sub_epi32(z, b));
        _mm512_store_ps((void *)(d + 576), d16(d8_q8_0(y), d8_q8_0(y + 8)));
    }
}

AI float rq4_row(int64_t nb, const uint8_t *x, const uint8_t *pk, const cm_block_q8_0 *y, size_t pfd) {
    const int64_t ng = nb / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 c = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++, x += 16 * sizeof(cm_block_q4_0), pk += RQ_GROUP) {
        for (int o = 0; o < 16 * (int)sizeof(cm_block_q4_0); o += 64)
            _mm_prefetch((const char *)x + pfd + o, _MM_HINT_T0);
        __m512i a = _mm512_load_si512((const void *)(pk + 512)), b = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_loadu_si512(x + 32 + 64 * q);
            a = _mm512_dpbusd_epi32(a, _mm512_and_si512(v, m4), _mm512_load_si512((const void *)(pk + 64 * q)));
            b = _mm512_dpbusd_epi32(b, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                    _mm512_load_si512((const void *)(pk + 256 + 64 * q)));
        }
        const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
        const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)x)),
                                       _mm512_load_ps((const void *)(pk + 576)));
        c = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), c);
        c = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), c);
    }
    const cm_block_q4_0 *xt = (const cm_block_q4_0 *)(const void *)x;
    for (int64_t b = 16 * ng; b < nb; b += 8) /* block b into lane b & 7, in block order */
        c = q4_0_tail(xt + (b - 16 * ng), y + b, (int)CM_MIN(nb - b, 8), c);
    return hsum8(c);
}

static void gemv_rq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK4_0, ng = nb / 16;
    CM_ASSERT(ng <= RQ_MAXG);
    _Alignas(64) uint8_t pk[RQ_MAXG * RQ_GROUP];
    rq4_pack(ng, x, pk);
    const size_t pfd = (size_t)cm_tune_get(CM_TUNE_Q4_0_GEMV_PFD);
    for (int64_t i = r0; i < r1; i++) y[i] = rq4_row(nb, (const uint8_t *)w + (size_t)i * w_stride, pk, x, pfd);
}

ZTILE_Q(q8_0, cm_block_q8_0, pair_q8_0, d8_q8_0)

/* ---- q4_k and q6_k with 512-bit vectors: 64 weights per vector ----
 * Each 32-element sub-block (q4_k) or 16-element group (q6_k) fills whole
 * 128/256-bit parts of a vector, so its 16-bit scale is a word permute of the
 * block's scales away; the byte products go through maddubs (pairs) and madd
 * with the scale, as in the 256-bit tiles, with the same lane bounds (below
 * 2^24, so every conversion to float is exact). */

/* q6_k: per 128-element chunk c, one vector holds runs q0|q1 (ql[0..63] low
 * nibbles with qh bits 0-1 and 2-3) and one q2|q3 (high nibbles, qh bits 4-5
 * and 6-7), matching y[0..63] and y[64..127]; each 16-element quarter has one
 * scale. Values are made signed (q - 32) and |q| is the unsigned operand. */
static const uint16_t k_q6k_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
static const uint16_t k_q6k_shift[2][32] = {
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}};

/* The 4 dwords of each 128-bit lane of s0..s3 summed into dword i of that
 * lane (integers: any order gives the same sums). */
AI __m512i red4(__m512i s0, __m512i s1, __m512i s2, __m512i s3) {
    const __m512i p01 = _mm512_add_epi32(_mm512_unpacklo_epi32(s0, s1), _mm512_unpackhi_epi32(s0, s1));
    const __m512i p23 = _mm512_add_epi32(_mm512_unpacklo_epi32(s2, s3), _mm512_unpackhi_epi32(s2, s3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
}

/* q6_k's lane sums of super-block b for T tokens: 128-bit lane j of sumi[t]
 * sums sub-blocks j, 4 + j, 8 + j, 12 + j (scale times sum((q - 32) * y)). */
AI void zq6_sums(const cm_block_q6_k *x, const cm_block_q8_k *const *yv, int64_t b, int T, __m512i *sumi) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    const __m512i shl = _mm512_loadu_si512(k_q6k_shift[0]), shr = _mm512_loadu_si512(k_q6k_shift[1]);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales)));
    for (int t = 0; t < T; t++) sumi[t] = _mm512_setzero_si512();
    _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
        const __m512i l = _mm512_loadu_si512(x[b].ql + 64 * c);
        const __m512i h = _mm512_broadcast_i64x4(ld256(x[b].qh + 32 * c));
        const __m512i q01 = _mm512_sub_epi8(
            _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30)), k32);
        const __m512i q23 = _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                            _mm512_and_si512(_mm512_srlv_epi16(h, shr), m30)),
                                            k32);
        const __m512i a01 = _mm512_abs_epi8(q01), a23 = _mm512_abs_epi8(q23);
        const __mmask64 n01 = _mm512_movepi8_mask(q01), n23 = _mm512_movepi8_mask(q23);
        const __m512i s01 = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_q6k_idx[2 * c]), sc16);
        const __m512i s23 = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_q6k_idx[2 * c + 1]), sc16);
        const __m512i z = _mm512_setzero_si512();
        for (int t = 0; t < T; t++) {
            const int8_t *y = yv[t][b].qs + 128 * c;
            __m512i y01 = _mm512_loadu_si512(y), y23 = _mm512_loadu_si512(y + 64);
            y01 = _mm512_mask_sub_epi8(y01, n01, z, y01);
            y23 = _mm512_mask_sub_epi8(y23, n23, z, y23);
            const __m512i p01 = _mm512_madd_epi16(_mm512_maddubs_epi16(a01, y01), s01);
            const __m512i p23 = _mm512_madd_epi16(_mm512_maddubs_epi16(a23, y23), s23);
            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(p01, p23));
        }
    }
}

/* q6_k (the avx512 table's bits; gemm_kq6_avx512.c, gemv_fq6_k and
 * gemv_kq6v give the same): per super-block b the exact integer sum I_b of
 * its 16 sub-blocks' scale * sum((q - 32) * y) (|I_b| < 2^28), converted
 * (round to nearest), one FMA with d * dy into float lane b % 16;
 * _mm512_reduce_add_ps at the end. */
AI void ztile_q6_k(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *const *yv, int T, float *out) {
    _Alignas(64) float acc[TMAX][16];
    for (int t = 0; t < T; t++) _mm512_store_ps(acc[t], _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        __m512i s[TMAX];
        zq6_sums(x, yv, b, T, s);
        const float d = f16f(x[b].d);
        for (int t = 0; t < T; t++)
            acc[t][b % 16] = fmaf((float)_mm512_reduce_add_epi32(s[t]), d * yv[t][b].d, acc[t][b % 16]);
    }
    for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(_mm512_load_ps(acc[t]));
}

/* red4's output q (dword 4j + i: super-block 4k + i's part in 128-bit lane
 * j) summed over j into lanes 4k .. 4k + 3 of v (k = 0..3) */
AI __m512i place16(__m512i v, __m512i q, int k) {
    __m512i h = _mm512_add_epi32(q, _mm512_shuffle_i32x4(q, q, 0x4e));
    h = _mm512_add_epi32(h, _mm512_shuffle_i32x4(h, h, 0xb1));
    return _mm512_mask_mov_epi32(v, (__mmask16)(0xfu << (4 * k)), h);
}

#define tile_zf32 ztile_f32
#define tile_zf16 ztile_f16
#define tile_zbf16 ztile_bf16
#define tile_zq4_0 ztile_q4_0
#define tile_zq8_0 ztile_q8_0
#define tile_zq6_k ztile_q6_k
VEC_DOT(zf32, void, void, 1)
VEC_DOT(zf16, void, void, 1)
VEC_DOT(zbf16, void, void, 1)
VEC_DOT(zq4_0, cm_block_q4_0, cm_block_q8_0, CM_QK4_0)
VEC_DOT(zq8_0, cm_block_q8_0, cm_block_q8_0, CM_QK8_0)
VEC_DOT(zq6_k, cm_block_q6_k, cm_block_q8_k, CM_QK_K)

/* Decode (one token): the rows in order, each through vec_dot, and no
 * software prefetch, so each thread reads its rows as one sequential stream
 * that the hardware prefetcher follows. On Zen 4 this beats both the
 * driver's prefetch of the row 4 ahead (dispatch.c) and 4-row passes (four
 * streams, which the prefetcher follows worse); the decode kernels here run
 * at 50-60 GB/s from L2 (f16), far above one core's share of DRAM. Each
 * y[i] is vec_dot's own result, so batch invariance is immediate. */
#define GEMV_ROWS(NAME)                                                                                          \
    static void gemv_##NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, \
                            int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {                                \
        (void)x_stride, (void)ldy, (void)n_tok;                                                                  \
        for (int64_t i = r0; i < r1; i++) vec_dot_##NAME(k, &y[i], (const char *)w + (size_t)i * w_stride, x);   \
    }
GEMV_ROWS(zbf16)

#include "avx512_gemm.h"
#include "avx512_bgemm.h"
#include "avx512_prefill.h"
#include "avx512_kgemm.h"
#include "avx512_krepack.h"
#include "avx512_gemv.h"

void cm_kernels_fill_avx512(cm_kernels *k) {
    x86_fill(k);
    k->vec_dot[CM_TYPE_F32] = vec_dot_zf32;
    k->gemm[CM_TYPE_F32] = gemm_zf32;
    k->vec_dot[CM_TYPE_F16] = vec_dot_zf16;
    k->gemm[CM_TYPE_F16] = gemm_fg16;
    k->gemv[CM_TYPE_F16] = gemv_vf16;
    k->vec_dot[CM_TYPE_BF16] = vec_dot_zbf16;
    k->gemm[CM_TYPE_BF16] = gemm_bg16;
    k->gemv[CM_TYPE_BF16] = gemv_zbf16;
    k->vec_dot[CM_TYPE_Q4_0] = vec_dot_zq4_0;
    k->gemm[CM_TYPE_Q4_0] = gemm_lq4_0;
    k->gemv[CM_TYPE_Q4_0] = gemv_zq4_0;
    k->gemv_packed[CM_TYPE_Q4_0] = gemv_rq4_0;
    k->gemm_packed[CM_TYPE_Q4_0] = gemm_bq4_0;
    /* 32, not 64: a tensor-parallel member's prefill through the batched tile
     * on its narrow slices ran ~30% slower at 33-64 tokens (bench/tp_ratio.sh,
     * HISTORY.md 2026-12-04), though whole matrices gained there (bbench) */
    k->gemm_packed_max = 32;
    k->vec_dot[CM_TYPE_Q8_0] = vec_dot_zq8_0;
    k->gemm[CM_TYPE_Q8_0] = gemm_qg8_0;
    k->gemv[CM_TYPE_Q8_0] = gemv_vq8_0;
    k->vec_dot[CM_TYPE_Q6_K] = vec_dot_zq6_k;
    k->gemm[CM_TYPE_Q6_K] = gemm_zq6_k; /* gemm_kq6_avx512.c's for rows up to 16384 */
    k->gemv[CM_TYPE_Q6_K] = gemv_fq6_k;
    k->vec_dot[CM_TYPE_Q5_K] = vec_dot_zq5_k; /* avx512_krepack.h's float order, not tile_q5_k's */
    k->gemm[CM_TYPE_Q5_K] = gemm_zq5_k;       /* gemm_kq_avx512.c's for 2+ tokens and rows up to 16384 */
    k->gemv[CM_TYPE_Q5_K] = gemv_fq5_k;
    k->gemv_packed[CM_TYPE_Q5_K] = gemv_rq5_k;
}
