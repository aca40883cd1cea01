/*
 * x86_tiles.h: the body shared by kernels_avx2.c and kernels_avx512.c. Not a
 * header in the usual sense: each of those two files includes it once, under
 * its own ISA flags, so the same tiles compile to AVX2 code in one and to
 * AVX-512VL/VNNI code in the other (CM_X86_VNNI selects vpdpbusd for the byte
 * dot products). Nothing else may include it.
 *
 * Every quantized kernel is a "tile" that walks one weight row once and dots
 * each block against T activation rows (T = 1 for vec_dot, up to 4 for gemm),
 * so prefill loads and unpacks each weight block once per 4 tokens. vec_dot
 * and gemm share the tile, hence give the same bits. Integer sums are exactly
 * the reference's; only the order of the float accumulation differs.
 * Activation converters produce the reference's bytes exactly. The blocking
 * around the tiles (vec_dot, gemm, the float tiles' loop) is tiles.h's,
 * shared with kernels_neon.c.
 *
 * NEEDSWORK: the 256-bit q4_0 tile spends about half its instructions on the
 * per-block fp16 scales (two conversions and a broadcast per block) and runs
 * at ~14 GB/s on one Zen 5 core, below memory bandwidth; llama.cpp gets more
 * by repacking weights (blocks of 8 rows interleaved) at load time, which
 * needs a weight-layout decision above the kernels.
 */
#ifndef CM_X86_VNNI
#error "define CM_X86_VNNI (0 or 1) before including x86_tiles.h"
#endif

#include "tiles.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "x86_vec.h"

/* 32 bits -> 32 bytes: 0xff where bit i is set, else 0. */
AI __m256i bits32(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    __m256i v =
        _mm256_shuffle_epi8(_mm256_set1_epi32((int)u), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                         0x0101010101010101, 0x0000000000000000));
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}
/* Sum of products of unsigned bytes x (<= 128) and signed bytes y (> -128), as 8 int32
 * (each the sum of 4 neighbours). Without VNNI, maddubs' pairs stay below
 * 2*128*127 < 32767, so nothing saturates. */
AI __m256i dot_u8s8(__m256i x, __m256i y) {
#if CM_X86_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
#endif
}
/* Signed x signed: move x's sign onto y, so |x| can be the unsigned operand. */
AI __m256i dot_s8s8(__m256i x, __m256i y) { return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

/* ---- 32-element block types ----
 * TILE32 defines tile_<name>(nb, x, yv, T, out): out[t] = dot(x, yv[t]) over nb
 * blocks. Even and odd blocks use separate accumulators so two FMA chains
 * overlap; BODY(b, acc, m) adds block b's contribution. */
#define TILE32(NAME, XB, YB, BODY)                                                                     \
    AI void tile_##NAME(int64_t nb, const XB *x, const YB *const *yv, int T, float *out) {             \
        __m256 acc0[TMAX], acc1[TMAX];                                                                 \
        float m0[TMAX], m1[TMAX];                                                                      \
        for (int t = 0; t < T; t++) {                                                                  \
            acc0[t] = acc1[t] = _mm256_setzero_ps();                                                   \
            m0[t] = m1[t] = 0.0f;                                                                      \
        }                                                                                              \
        int64_t b = 0;                                                                                 \
        for (; b + 1 < nb; b += 2) {                                                                   \
            BODY(b, acc0, m0);                                                                         \
            BODY(b + 1, acc1, m1);                                                                     \
        }                                                                                              \
        if (b < nb) BODY(b, acc0, m0);                                                                 \
        for (int t = 0; t < T; t++) out[t] = hsum8(_mm256_add_ps(acc0[t], acc1[t])) + (m0[t] + m1[t]); \
    }

/* TILE32_CHAIN: one FMA chain per token over the blocks in order, then
 * hsum8 (+ the min terms' own chain): the order of llama.cpp's x86 vec_dot
 * for q5_0/q5_1 and of its llamafile tinyBLAS gemm for q5_0 (which its x86
 * builds run for q5_0 in prefill and decode alike), so these dots carry
 * llama.cpp's bits, not merely its value (phi3's 768-wide rows put a few
 * activations close enough to an 8-bit rounding tie that the two-chain
 * order's last bits flip them; test_synth_golden's phi3-q5_0/q5_1). */
#define TILE32_CHAIN(NAME, XB, YB, BODY)                                                   \
    AI void tile_##NAME(int64_t nb, const XB *x, const YB *const *yv, int T, float *out) { \
        __m256 acc[TMAX];                                                                  \
        float m[TMAX];                                                                     \
        for (int t = 0; t < T; t++) {                                                      \
            acc[t] = _mm256_setzero_ps();                                                  \
            m[t] = 0.0f;                                                                   \
        }                                                                                  \
        for (int64_t b = 0; b < nb; b++) BODY(b, acc, m);                                  \
        for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]) + m[t];                         \
    }

#define FMA_BLOCK(ACC, SUMI, SCALE) ACC = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SUMI), _mm256_set1_ps(SCALE), ACC)

#define BODY_Q4_0(B, ACC, M)                                                                                   \
    do {                                                                                                       \
        const __m256i qx = _mm256_sub_epi8(nibbles32(x[B].qs), _mm256_set1_epi8(8));                           \
        const float dx = f16f(x[B].d);                                                                         \
        for (int t = 0; t < T; t++) FMA_BLOCK(ACC[t], dot_s8s8(qx, ld256(yv[t][B].qs)), dx *f16f(yv[t][B].d)); \
    } while (0)
TILE32(q4_0, cm_block_q4_0, cm_block_q8_0, BODY_Q4_0)

#define BODY_Q4_1(B, ACC, M)                                                           \
    do {                                                                               \
        const __m256i qx = nibbles32(x[B].qs);                                         \
        const float dx = f16f(x[B].d), mx = f16f(x[B].m);                              \
        for (int t = 0; t < T; t++) {                                                  \
            FMA_BLOCK(ACC[t], dot_u8s8(qx, ld256(yv[t][B].qs)), dx *f16f(yv[t][B].d)); \
            M[t] += mx * f16f(yv[t][B].s);                                             \
        }                                                                              \
    } while (0)
TILE32(q4_1, cm_block_q4_1, cm_block_q8_1, BODY_Q4_1)

/* q5_0: the fifth bit clear means value - 16, which in a signed byte is 0xf0 | nibble. */
#define BODY_Q5_0(B, ACC, M)                                                                                   \
    do {                                                                                                       \
        const __m256i hi = _mm256_andnot_si256(bits32(x[B].qh), _mm256_set1_epi8((char)0xf0));                 \
        const __m256i qx = _mm256_or_si256(nibbles32(x[B].qs), hi);                                            \
        const float dx = f16f(x[B].d);                                                                         \
        for (int t = 0; t < T; t++) FMA_BLOCK(ACC[t], dot_s8s8(qx, ld256(yv[t][B].qs)), dx *f16f(yv[t][B].d)); \
    } while (0)
TILE32_CHAIN(q5_0, cm_block_q5_0, cm_block_q8_0, BODY_Q5_0)

#define BODY_Q5_1(B, ACC, M)                                                           \
    do {                                                                               \
        const __m256i hi = _mm256_and_si256(bits32(x[B].qh), _mm256_set1_epi8(0x10));  \
        const __m256i qx = _mm256_or_si256(nibbles32(x[B].qs), hi);                    \
        const float dx = f16f(x[B].d), mx = f16f(x[B].m);                              \
        for (int t = 0; t < T; t++) {                                                  \
            FMA_BLOCK(ACC[t], dot_u8s8(qx, ld256(yv[t][B].qs)), dx *f16f(yv[t][B].d)); \
            M[t] += mx * f16f(yv[t][B].s);                                             \
        }                                                                              \
    } while (0)
TILE32_CHAIN(q5_1, cm_block_q5_1, cm_block_q8_1, BODY_Q5_1)

#define BODY_Q8_0(B, ACC, M)                                                                                   \
    do {                                                                                                       \
        const __m256i qx = ld256(x[B].qs);                                                                     \
        const float dx = f16f(x[B].d);                                                                         \
        for (int t = 0; t < T; t++) FMA_BLOCK(ACC[t], dot_s8s8(qx, ld256(yv[t][B].qs)), dx *f16f(yv[t][B].d)); \
    } while (0)
TILE32(q8_0, cm_block_q8_0, cm_block_q8_0, BODY_Q8_0)

/* ---- K-quants (256-element super-blocks against Q8_K) ---- */

/* Sum over the 8 sub-blocks of mn[j] * (bsums[2j] + bsums[2j+1]), as 4 int32. */
AI __m128i kmins(const uint8_t mn[8], const int16_t *bsums) {
    const __m256i bs = ld256(bsums);
    const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), pairs);
}

/* q4_k / q5_k share everything but the fifth bit. */
#define TILE_K45(NAME, XB, HAS_QH)                                                                                   \
    AI void tile_##NAME(int64_t nb, const XB *x, const cm_block_q8_k *const *yv, int T, float *out) {                \
        __m256 acc[TMAX];                                                                                            \
        __m128 accm[TMAX];                                                                                           \
        for (int t = 0; t < T; t++) {                                                                                \
            acc[t] = _mm256_setzero_ps();                                                                            \
            accm[t] = _mm_setzero_ps();                                                                              \
        }                                                                                                            \
        const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);                                        \
        for (int64_t b = 0; b < nb; b++) {                                                                           \
            uint8_t sc[8], mn[8];                                                                                    \
            cm_k4_scales8(x[b].scales, sc, mn);                                                                      \
            __m256i sumi[TMAX];                                                                                      \
            for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();                                            \
            __m256i qh = HAS_QH ? ld256(((const cm_block_q5_k *)(const void *)&x[b])->qh) : one;                     \
            (void)qh;                                                                                                \
            for (int j = 0; j < 4; j++) {                                                                            \
                const __m256i q = ld256(x[b].qs + 32 * j);                                                           \
                __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);            \
                if (HAS_QH) {                                                                                        \
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));                       \
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4)); \
                    qh = _mm256_srli_epi16(qh, 2);                                                                   \
                }                                                                                                    \
                const __m256i slo = _mm256_set1_epi16(sc[2 * j]), shi = _mm256_set1_epi16(sc[2 * j + 1]);            \
                for (int t = 0; t < T; t++) {                                                                        \
                    const int8_t *y = yv[t][b].qs + 64 * j;                                                          \
                    const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(y)), slo);                  \
                    const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(y + 32)), shi);             \
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(plo, phi));                                 \
                }                                                                                                    \
            }                                                                                                        \
            const float d = f16f(x[b].d), dmin = f16f(x[b].dmin);                                                    \
            for (int t = 0; t < T; t++) {                                                                            \
                const float yd = yv[t][b].d;                                                                         \
                FMA_BLOCK(acc[t], sumi[t], d *yd);                                                                   \
                accm[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(kmins(mn, yv[t][b].bsums)), _mm_set1_ps(dmin * yd), accm[t]); \
            }                                                                                                        \
        }                                                                                                            \
        for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]) - hsum4(accm[t]);                                         \
    }
TILE_K45(q4_k, cm_block_q4_k, 0)
TILE_K45(q5_k, cm_block_q5_k, 1)

/* q6_k super-block x's values of half c (128 values) as 4 vectors of bytes
 * in [0, 63], q[k] the 32 values that meet the token's y[128c + 32k ..]. */
AI void q6_vals(const cm_block_q6_k *x, int c, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = ld256(x->ql + 64 * c), l1 = ld256(x->ql + 64 * c + 32);
    const __m256i h = ld256(x->qh + 32 * c);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
    q[3] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

/* q6_k: 6-bit values stored offset by 32, 16 signed 8-bit scales per super-block.
 * The values are made signed (q - 32) before the byte products: then every
 * int32 lane stays below 2^24 (8 * 2*32*127 * 128), so converting it to float
 * is exact and its size is bounded by the dot's own absolute sum. */
AI void tile_q6_k(int64_t nb, const cm_block_q6_k *x, const cm_block_q8_k *const *yv, int T, float *out) {
    __m256 acc[TMAX];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    const __m256i k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++) {
        __m256i sumi[TMAX];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            __m256i q[4];
            q6_vals(&x[b], c, q);
            for (int k = 0; k < 4; k++) {
                const int8_t *s = x[b].scales + 8 * c + 2 * k;
                const __m256i sv = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
                const __m256i qs = _mm256_sub_epi8(q[k], k32);
                const __m256i qa = _mm256_sign_epi8(qs, qs);
                for (int t = 0; t < T; t++) {
                    const __m256i yy = _mm256_sign_epi8(ld256(yv[t][b].qs + 128 * c + 32 * k), qs);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, yy), sv));
                }
            }
        }
        const float d = f16f(x[b].d);
        for (int t = 0; t < T; t++) FMA_BLOCK(acc[t], sumi[t], d * yv[t][b].d);
    }
    for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]);
}

/* ---- float types: 16 elements per step, two accumulators per token ---- */
AI __m256 ld_f32(const void *p, int64_t i) { return _mm256_loadu_ps((const float *)p + i); }
AI __m256 ld_f16(const void *p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cm_f16 *)p + i)));
}
/* acc + a * b, and the sum of the lanes of a + b (tiles.h's CM_TILE_FLOAT) */
#define FMA8(acc, a, b) _mm256_fmadd_ps(a, b, acc)
#define HSUM8X2(a, b) hsum8(_mm256_add_ps(a, b))
CM_TILE_FLOAT(tile_f32, ld_f32, sc_f32, __m256, 8, _mm256_setzero_ps(), FMA8, HSUM8X2)
CM_TILE_FLOAT(tile_f16, ld_f16, sc_f16, __m256, 8, _mm256_setzero_ps(), FMA8, HSUM8X2)

/* bf16 in the arithmetic of the AVX-512 table's ztile_bf16 (kernels_avx512.c),
 * which is that of llama.cpp's x86 vec_dot on AVX512-BF16 CPUs (the synthetic
 * goldens' references): vdpbf16ps, emulated. A 32-bit lane holds the pair of
 * elements 2j, 2j+1; the odd element's product is added first, then the even
 * one's, each rounded (vdpbf16ps's two FMAs; the products are exact, 8-bit
 * mantissas); 64 elements per step in two 16-lane chains (here 4 x 8 lanes),
 * folded lane by lane and then halved as _mm512_reduce_add_ps does, so this
 * table's bf16 bits equal the AVX-512 table's (vdpbf16ps also flushes
 * denormals, which no model's weights or activations are). With its own
 * order (2 x 8 lanes, one element per lane) CUMULO_ISA=avx2 parted from the
 * references at a near tie in gemma3-bf16 (test_synth_golden). */
AI __m256 bf16_hi(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))); }
AI __m256 bf16_lo(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
AI __m256 dpbf16_8(__m256 acc, __m256i x, __m256i y) {
    acc = _mm256_fmadd_ps(bf16_hi(x), bf16_hi(y), acc);
    return _mm256_fmadd_ps(bf16_lo(x), bf16_lo(y), acc);
}
AI void tile_bf16(int64_t n, const void *x, const void *const *yv, int T, float *out) {
    __m256 a[TMAX][4]; /* [0], [1]: the first 16-lane chain (elements 0-31 of a step); [2], [3]: the second */
    for (int t = 0; t < T; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm256_setzero_ps();
    const cm_bf16 *xb = x;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m256i x0 = ld256(xb + i), x1 = ld256(xb + i + 16), x2 = ld256(xb + i + 32), x3 = ld256(xb + i + 48);
        for (int t = 0; t < T; t++) {
            const cm_bf16 *yb = yv[t];
            a[t][0] = dpbf16_8(a[t][0], x0, ld256(yb + i));
            a[t][1] = dpbf16_8(a[t][1], x1, ld256(yb + i + 16));
            a[t][2] = dpbf16_8(a[t][2], x2, ld256(yb + i + 32));
            a[t][3] = dpbf16_8(a[t][3], x3, ld256(yb + i + 48));
        }
    }
    for (int t = 0; t < T; t++) {
        /* chain 1 + chain 2 lane by lane, then lanes 8-15 + lanes 0-7, then hsum8's halving */
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(a[t][1], a[t][3]), _mm256_add_ps(a[t][0], a[t][2])));
        for (int64_t k = i; k < n; k++) s += sc_bf16(x, k) * sc_bf16(yv[t], k);
        out[t] = s;
    }
}

/* ---- vec_dot and gemm wrappers (tiles.h) ---- */
CM_VEC_DOT_TYPES()

/* ---- activation converters (must match quants_ref.c byte for byte) ---- */

/* |x| max of 32 floats. */
AI float amax32(const float *x, __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Round v[k] * id to nearest-even int8 (|v * id| <= 127 by construction); returns the int sum. */
AI int round_store32(const __m256 v[4], float id, int8_t *q) {
    const __m256 m = _mm256_set1_ps(id);
    __m256i i[4];
    for (int k = 0; k < 4; k++)
        i[k] =
            _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
    /* packs interleave 128-bit lanes; the permute puts the bytes back in order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return sum;
}

static void from_float_q8_0(const float *x, void *vy, int64_t n) {
    cm_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / CM_QK8_0; b++, x += CM_QK8_0) {
        __m256 v[4];
        const float amax = amax32(x, v);
        const float d = amax / 127.0f;
        y[b].d = cm_f32_to_f16(d);
        (void)round_store32(v, amax != 0.0f ? 127.0f / amax : 0.0f, y[b].qs);
    }
}

static void from_float_q8_1(const float *x, void *vy, int64_t n) {
    cm_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / CM_QK8_1; b++, x += CM_QK8_1) {
        __m256 v[4];
        const float amax = amax32(x, v);
        const float d = amax / 127.0f;
        y[b].d = cm_f32_to_f16(d);
        const int sum = round_store32(v, amax != 0.0f ? 127.0f / amax : 0.0f, y[b].qs);
        y[b].s = cm_f32_to_f16(d * (float)sum);
    }
}

/* Q8_K: scale -127 / (the signed value of largest magnitude; the first one
 * wins a tie, as in the reference), round to nearest even, clamp at 127,
 * bsums per 16 elements; an all-zero block is all zero bytes. */
static void from_float_q8_k(const float *x, void *vy, int64_t n) {
    cm_block_q8_k *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / CM_QK_K; b++, x += CM_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < CM_QK_K; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        const float amax = _mm_cvtss_f32(s);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const __m256 va = _mm256_set1_ps(amax);
        int first = 0;
        for (int k = 0; k < CM_QK_K; k += 8) {
            const int hit =
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), va, _CMP_EQ_OQ));
            if (hit) {
                first = k + __builtin_ctz((unsigned)hit);
                break;
            }
        }
        const float iscale = -127.f / x[first];
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i k127 = _mm256_set1_epi32(127);
        for (int g = 0; g < CM_QK_K / 16; g++) {
            const float *xg = x + 16 * g;
            const __m256i i0 = _mm256_min_epi32(
                k127, _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xg), vs),
                                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
            const __m256i i1 = _mm256_min_epi32(
                k127, _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xg + 8), vs),
                                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
            y[b].bsums[g] = (int16_t)hsum_i32(_mm256_add_epi32(i0, i1));
            const __m256i p16 = _mm256_packs_epi32(i0, i1); /* lanes: i0lo i1lo | i0hi i1hi */
            const __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
            /* p8 = i0[0..3] i1[0..3] i0[4..7] i1[4..7]: swap the middle 4-byte groups */
            _mm_storeu_si128((__m128i *)(y[b].qs + 16 * g), _mm_shuffle_epi32(p8, _MM_SHUFFLE(3, 1, 2, 0)));
        }
        y[b].d = 1 / iscale;
    }
}

static void from_float_f16(const float *x, void *vy, int64_t n) {
    cm_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = cm_f32_to_f16(x[i]);
}

/* Every entry this body implements (both ISA files start from it). */
static void x86_fill(cm_kernels *k) { CM_TILES_FILL(k); }
