/*
 * attn_avx2.c: attention's value side (kernels.h, cm_attn_v_fn) with AVX2,
 * FMA and F16C: 8 accumulator elements per register while the tile's V
 * rows stream past (j order per element, fused multiply-adds: the last bits
 * may differ from attn_ref.c). F32, F16 and Q8_0; Q4_0 stays the
 * reference. Compiled with the AVX2 flags only.
 *
 * The multi-query decode ops (attn_qk, attn_vm, attn_exp; kernels.h) for
 * F32, F16, Q8_0 and Q4_0 rows, shaped as attn_avx512.c's in 8 lanes: a K
 * row widened to floats 16 elements at a time for up to four queries, each
 * (query, position) dot an 8-lane partial, 8 positions' partials summed by
 * one transposing tree (a partial group at the end of a tile runs the same
 * code with zero partials; Q8_0 K rows go by int8 dots instead, below); the V side keeps four queries' accumulators of
 * 16 elements in registers; exp is the same degree-7 polynomial, 2^n built
 * in two exponent-field halves (n goes below the normal range).
 */
#include "isa.h"

#include <immintrin.h>
#include <math.h>

static void attn_v_f32(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 4;
        for (int j = 0; j < n; j++, r += v_row)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps((const float *)r), a);
        _mm256_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], ((const float *)((const char *)v + (size_t)j * v_row))[i], acc[i]);
}

static void attn_v_f16(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 2;
        for (int j = 0; j < n; j++, r += v_row)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r)), a);
        _mm256_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], cm_f16_to_f32(((const cm_f16 *)((const char *)v + (size_t)j * v_row))[i]), acc[i]);
}

static void attn_v_q8_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int64_t b = 0; b < D / 32; b++) {
        __m256 a[4];
        for (int h = 0; h < 4; h++) a[h] = _mm256_loadu_ps(acc + b * 32 + h * 8);
        const char *r = (const char *)v + (size_t)b * sizeof(cm_block_q8_0);
        for (int j = 0; j < n; j++, r += v_row) {
            const cm_block_q8_0 *blk = (const cm_block_q8_0 *)r;
            const __m256 d = _mm256_set1_ps(cm_f16_to_f32(blk->d)), wj = _mm256_set1_ps(w[j]);
            for (int h = 0; h < 4; h++) {
                const __m128i q = _mm_loadl_epi64((const __m128i *)(blk->qs + h * 8));
                const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
                a[h] = _mm256_fmadd_ps(wj, x, a[h]);
            }
        }
        for (int h = 0; h < 4; h++) _mm256_storeu_ps(acc + b * 32 + h * 8, a[h]);
    }
}

/* F16 accumulator step: 8 lanes, fused, rounded to F16 nearest-even. */
static void attn_f16_step(int64_t D, void *accv, const void *vv, float ms, float w) {
    cm_f16 *acc = accv;
    const cm_f16 *v = vv;
    int64_t i = 0;
    const __m256 vm = _mm256_set1_ps(ms), vw = _mm256_set1_ps(w);
    for (; i + 8 <= D; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        if (ms != 1.0f) a = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a, vm), _MM_FROUND_TO_NEAREST_INT));
        a = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), vw, a);
        _mm_storeu_si128((__m128i *)(acc + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < D; i++) {
        if (ms != 1.0f) acc[i] = cm_f32_to_f16(cm_f16_to_f32(acc[i]) * ms);
        acc[i] = cm_f32_to_f16(fmaf(cm_f16_to_f32(v[i]), w, cm_f16_to_f32(acc[i])));
    }
}

/* The lane order of ggml's AVX-512 F16 dot (kernels.h) in 8 x 8 lanes. */
static void attn_f16_dot(int64_t D, float *s, const void *xv, const void *yv) {
    const cm_f16 *x = xv, *y = yv;
    __m256 a[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps(); /* unrolled: in registers */
    const int64_t np = D & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) a[j] =
            _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * j))),
                            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * j))), a[j]);
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a[j] = _mm256_add_ps(a[j], a[j + 4]); /* l + l+32 */
    a[0] = _mm256_add_ps(a[0], a[2]);                                                         /* l + l+16 */
    a[1] = _mm256_add_ps(a[1], a[3]);
    /* t[l] += t[l + w] for w = 8, 4, 2, 1 over t = a[0], a[1] in registers */
    const __m256 u = _mm256_add_ps(a[0], a[1]);
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    double sum = _mm_cvtss_f32(v);
    for (int64_t i = np; i < D; i++) sum += (double)(cm_f16_to_f32(x[i]) * cm_f16_to_f32(y[i]));
    *s = (float)sum;
}

#define AI static inline __attribute__((always_inline))
/* the loops over a group's queries: unrolled, their accumulators in
 * registers (-O2 leaves them in memory otherwise) */
#define UNROLL4 _Pragma("GCC unroll 4")

/* An F16 scale by F16C: the same value as cm_f16_to_f32 (exact either way),
 * without its call and branches in the row loops. */
AI float f16s(cm_f16 h) { return _cvtsh_ss(h); }

/* Elements [i, i + 16) of a KV row of type T (i a multiple of 16) as two
 * 8-lane halves; Q8_0/Q4_0 give the unscaled quants and *d the block scale. */
AI void row16(enum cm_type T, const char *r, int64_t i, __m256 *x0, __m256 *x1, float *d) {
    if (T == CM_TYPE_F32) {
        *d = 1.0f;
        *x0 = _mm256_loadu_ps((const float *)r + i);
        *x1 = _mm256_loadu_ps((const float *)r + i + 8);
        return;
    }
    if (T == CM_TYPE_F16) {
        *d = 1.0f;
        *x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cm_f16 *)r + i)));
        *x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cm_f16 *)r + i + 8)));
        return;
    }
    __m128i q;
    if (T == CM_TYPE_Q8_0) {
        const cm_block_q8_0 *b = (const cm_block_q8_0 *)r + i / 32;
        *d = f16s(b->d);
        q = _mm_loadu_si128((const __m128i *)(b->qs + (i & 16)));
    } else {
        const cm_block_q4_0 *b = (const cm_block_q4_0 *)r + i / 32;
        *d = f16s(b->d);
        q = _mm_loadu_si128((const __m128i *)b->qs);
        if (i & 16) q = _mm_srli_epi16(q, 4);
        q = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(15)), _mm_set1_epi8(8));
    }
    *x0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    *x1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

/* out lane L = the sum of the 8 lanes of v[L]. */
AI __m256 hsum8(const __m256 *v) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* Up to four queries against 8 positions per step, each K row widened once
 * for all of them. */
AI void qk_group(enum cm_type T, int64_t D, int nh, int h0, const float *qh, const void *k, size_t k_row, int n,
                 __m256 vs, float *s, int ld) {
    {
        for (int j = 0; j < n; j += 8) {
            const int nt = n - j < 8 ? n - j : 8;
            __m256 v[4][8];
            for (int t = 0; t < 8; t++) {
                __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                const char *r = (const char *)k + (size_t)(j + t) * k_row;
                if (t < nt && h0 == 0) _mm_prefetch(r + 64 * k_row, _MM_HINT_T0);
                if (t < nt && (T == CM_TYPE_F32 || T == CM_TYPE_F16)) {
                    for (int64_t i = 0; i < D; i += 16) {
                        __m256 x0, x1;
                        float d;
                        row16(T, r, i, &x0, &x1, &d);
                        UNROLL4 for (int h = 0; h < nh; h++) {
                            a[h] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(qh + h * D + i), a[h]);
                            a[h] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(qh + h * D + i + 8), a[h]);
                        }
                    }
                } else if (t < nt) {
                    for (int64_t i = 0; i < D; i += 32) {
                        __m256 x0, x1, x2, x3;
                        float d;
                        row16(T, r, i, &x0, &x1, &d);
                        row16(T, r, i + 16, &x2, &x3, &d);
                        const __m256 vd = _mm256_set1_ps(d);
                        UNROLL4 for (int h = 0; h < nh; h++) {
                            const float *qi = qh + h * D + i;
                            __m256 u = _mm256_mul_ps(x0, _mm256_loadu_ps(qi));
                            u = _mm256_fmadd_ps(x1, _mm256_loadu_ps(qi + 8), u);
                            u = _mm256_fmadd_ps(x2, _mm256_loadu_ps(qi + 16), u);
                            u = _mm256_fmadd_ps(x3, _mm256_loadu_ps(qi + 24), u);
                            a[h] = _mm256_fmadd_ps(u, vd, a[h]);
                        }
                    }
                }
                UNROLL4 for (int h = 0; h < nh; h++) v[h][t] = a[h];
            }
            UNROLL4 for (int h = 0; h < nh; h++) {
                const __m256 o = _mm256_mul_ps(hsum8(v[h]), vs);
                float *dst = s + (h0 + h) * ld + j;
                if (nt == 8) {
                    _mm256_storeu_ps(dst, o);
                } else {
                    float tmp[8];
                    _mm256_storeu_ps(tmp, o);
                    for (int t = 0; t < nt; t++) dst[t] = tmp[t];
                }
            }
        }
    }
}

/* Q8_0 K with D a multiple of 32 (up to QK8_MAXD): the queries, which
 * attn_split.c rounds through Q8_0 (kernels.h), are re-quantized per 32-block
 * once per call (int8 values qi, scale qd = the block's largest |q| / 127,
 * exact for such a query) and dotted in int16/int32 as ggml's AVX2 q8_0 dot:
 * |k| unsigned times q with k's sign by maddubs (no overflow: 2 x 128 x 127),
 * pairs by madd. A "slot" is one (query, position) pair; four slots' 8 int32
 * partials per block go through one hadd tree to [4 slots' sums of elements
 * 0-15 | of 16-31], exact integers, then lo/hi each fused-added as
 * float(sum) x (d_k d_q) in block order, and the result is (lo + hi) x scale.
 * A slot's arithmetic is the same whether its vector holds four queries of one
 * position, two of two or one of four: each query's scores depend on that
 * query only (batch invariance). */
enum { QK8_MAXD = 1024 };

AI void q8_prep_avx2(int64_t D, const float *q, int8_t *qi, float *qd) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < D / 32; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(q + b * 32 + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float d = _mm_cvtss_f32(m4) / 127.0f;
        qd[b] = d;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
        i0 = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qi + b * 32), i0);
    }
}

/* G queries (h0 .. h0 + G - 1; G = 1, 2 or 4, a constant where inlined) by
 * 4 / G positions per step; slot p * G + g = (query g, position j + p); qdv:
 * per block, each slot's d_q (both halves). A last partial step reads the
 * last row again and stores only the positions below n. */
AI void qk_q8_0_slots(int64_t D, int G, int h0, int8_t (*qi)[QK8_MAXD], const float *qdv, const void *k, size_t k_row,
                      int n, float scale, float *s, int ld) {
    const int P = 4 / G;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128 vs = _mm_set1_ps(scale);
    for (int j = 0; j < n; j += P) {
        const char *r[4];
        UNROLL4 for (int p = 0; p < P; p++) {
            r[p] = (const char *)k + (size_t)(j + p < n ? j + p : n - 1) * k_row;
            if (h0 == 0) _mm_prefetch(r[p] + 64 * k_row, _MM_HINT_T0);
        }
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < D / 32; b++) {
            __m256i pv[4];
            uint64_t dk[4];
            UNROLL4 for (int p = 0; p < P; p++) {
                const cm_block_q8_0 *blk = (const cm_block_q8_0 *)r[p] + b;
                dk[p] = blk->d;
                const __m256i kq = _mm256_loadu_si256((const __m256i *)blk->qs), ka = _mm256_sign_epi8(kq, kq);
                UNROLL4 for (int g = 0; g < G; g++) {
                    const __m256i qv = _mm256_loadu_si256((const __m256i *)(qi[g] + b * 32));
                    pv[p * G + g] = _mm256_madd_epi16(_mm256_maddubs_epi16(ka, _mm256_sign_epi8(qv, kq)), ones);
                }
            }
            const __m256i hs = _mm256_hadd_epi32(_mm256_hadd_epi32(pv[0], pv[1]), _mm256_hadd_epi32(pv[2], pv[3]));
            __m256 vdk; /* the slots' K scales, exact as F16C widens them */
            if (G == 4) {
                vdk = _mm256_set1_ps(f16s((cm_f16)dk[0]));
            } else if (G == 2) {
                const __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(dk[0] | dk[1] << 16)));
                vdk = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d2), _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1));
            } else {
                const __m128 d4 =
                    _mm_cvtph_ps(_mm_cvtsi64_si128((long long)(dk[0] | dk[1] << 16 | dk[2] << 32 | dk[3] << 48)));
                vdk = _mm256_insertf128_ps(_mm256_castps128_ps256(d4), d4, 1);
            }
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hs), _mm256_mul_ps(vdk, _mm256_load_ps(qdv + b * 8)), acc);
        }
        const __m128 o4 = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)), vs);
        if (G == 1 && j + 4 <= n) {
            _mm_storeu_ps(s + h0 * ld + j, o4);
            continue;
        }
        float o[4];
        _mm_storeu_ps(o, o4);
        for (int p = 0; p < P && j + p < n; p++)
            UNROLL4 for (int g = 0; g < G; g++) s[(h0 + g) * ld + j + p] = o[p * G + g];
    }
}

static void qk_q8_0_int(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale, float *s,
                        int ld) {
    int8_t qi[4][QK8_MAXD] __attribute__((aligned(32)));
    float qd[4][QK8_MAXD / 32], qdv[QK8_MAXD / 32 * 8] __attribute__((aligned(32)));
    for (int h0 = 0; h0 < nq;) {
        const int G = nq - h0 >= 4 ? 4 : nq - h0 >= 2 ? 2 : 1;
        for (int g = 0; g < G; g++) q8_prep_avx2(D, q + (size_t)(h0 + g) * D, qi[g], qd[g]);
        for (int64_t b = 0; b < D / 32; b++)
            for (int l = 0; l < 8; l++) qdv[b * 8 + l] = qd[(l & 3) % G][b];
        switch (G) {
        case 4: qk_q8_0_slots(D, 4, h0, qi, qdv, k, k_row, n, scale, s, ld); break;
        case 2: qk_q8_0_slots(D, 2, h0, qi, qdv, k, k_row, n, scale, s, ld); break;
        default: qk_q8_0_slots(D, 1, h0, qi, qdv, k, k_row, n, scale, s, ld); break;
        }
        h0 += G;
    }
}

AI void qk_multi(enum cm_type T, int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                 float *s, int ld) {
    if (T == CM_TYPE_Q8_0 && D % 32 == 0 && D <= QK8_MAXD) {
        qk_q8_0_int(D, nq, q, k, k_row, n, scale, s, ld);
        return;
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int h0 = 0; h0 < nq; h0 += 4) {
        const float *qh = q + (size_t)h0 * D;
        switch (nq - h0 < 4 ? nq - h0 : 4) {
        case 4: qk_group(T, D, 4, h0, qh, k, k_row, n, vs, s, ld); break;
        case 3: qk_group(T, D, 3, h0, qh, k, k_row, n, vs, s, ld); break;
        case 2: qk_group(T, D, 2, h0, qh, k, k_row, n, vs, s, ld); break;
        default: qk_group(T, D, 1, h0, qh, k, k_row, n, vs, s, ld); break;
        }
    }
}

/* 16 elements of up to four queries' accumulators stay in registers while
 * the rows stream past. */
AI void vm_group(enum cm_type T, int64_t D, int nh, int h0, int64_t i, const void *v, size_t v_row, const float *w,
                 int ld, int n, float *acc) {
    {
        __m256 a[4][2];
        UNROLL4 for (int h = 0; h < nh; h++) {
            a[h][0] = _mm256_loadu_ps(acc + (h0 + h) * D + i);
            a[h][1] = _mm256_loadu_ps(acc + (h0 + h) * D + i + 8);
        }
        const char *r = (const char *)v;
        for (int j = 0; j < n; j++, r += v_row) {
            __m256 x0, x1;
            float d;
            if (i == 0 && h0 == 0) _mm_prefetch(r + 64 * v_row, _MM_HINT_T0);
            row16(T, r, i, &x0, &x1, &d);
            if (T == CM_TYPE_Q8_0 || T == CM_TYPE_Q4_0) {
                x0 = _mm256_mul_ps(x0, _mm256_set1_ps(d));
                x1 = _mm256_mul_ps(x1, _mm256_set1_ps(d));
            }
            UNROLL4 for (int h = 0; h < nh; h++) {
                const __m256 wj = _mm256_set1_ps(w[(h0 + h) * ld + j]);
                a[h][0] = _mm256_fmadd_ps(wj, x0, a[h][0]);
                a[h][1] = _mm256_fmadd_ps(wj, x1, a[h][1]);
            }
        }
        UNROLL4 for (int h = 0; h < nh; h++) {
            _mm256_storeu_ps(acc + (h0 + h) * D + i, a[h][0]);
            _mm256_storeu_ps(acc + (h0 + h) * D + i + 8, a[h][1]);
        }
    }
}

enum { VQ_FLOATS = 4096 }; /* a chunk of dequantized V rows (16 KiB) */

AI void vm_multi(enum cm_type T, int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                 float *acc);

/* Q8_0/Q4_0 V rows for more than four queries (prefill passes up to 128):
 * each row dequantized once into floats (d * q, rounded as vm_group's
 * product), then the F32 sums over them: the same bits as four at a time. */
static void vm_quant_many(enum cm_type T, int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                          float *acc) {
    float x[VQ_FLOATS] __attribute__((aligned(32)));
    const int R = (int)(VQ_FLOATS / D);
    for (int j0 = 0; j0 < n; j0 += R) {
        const int nr = n - j0 < R ? n - j0 : R;
        for (int j = 0; j < nr; j++) {
            const char *r = (const char *)v + (size_t)(j0 + j) * v_row;
            for (int64_t i = 0; i < D; i += 16) {
                __m256 x0, x1;
                float d;
                row16(T, r, i, &x0, &x1, &d);
                _mm256_store_ps(x + (size_t)j * D + i, _mm256_mul_ps(x0, _mm256_set1_ps(d)));
                _mm256_store_ps(x + (size_t)j * D + i + 8, _mm256_mul_ps(x1, _mm256_set1_ps(d)));
            }
        }
        vm_multi(CM_TYPE_F32, D, nq, x, (size_t)D * sizeof(float), w + j0, ld, nr, acc);
    }
}

AI void vm_multi(enum cm_type T, int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                 float *acc) {
    if ((T == CM_TYPE_Q8_0 || T == CM_TYPE_Q4_0) && nq > 4 && D <= VQ_FLOATS / 4) {
        vm_quant_many(T, D, nq, v, v_row, w, ld, n, acc);
        return;
    }
    for (int64_t i = 0; i < D; i += 16)
        for (int h0 = 0; h0 < nq; h0 += 4) switch (nq - h0 < 4 ? nq - h0 : 4) {
            case 4: vm_group(T, D, 4, h0, i, v, v_row, w, ld, n, acc); break;
            case 3: vm_group(T, D, 3, h0, i, v, v_row, w, ld, n, acc); break;
            case 2: vm_group(T, D, 2, h0, i, v, v_row, w, ld, n, acc); break;
            default: vm_group(T, D, 1, h0, i, v, v_row, w, ld, n, acc); break;
            }
}

CM_ATTN_MULTI_DEFINE()

/* e^x = 2^n e^r as attn_avx512.c's exp512; 2^n = 2^(n/2) 2^(n - n/2), each
 * factor a normal float, since n reaches -150 (then the product rounds to
 * a denormal or 0 as expf's result does). */
AI __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

static float attn_exp(int n, float *s, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t[8];
    _mm256_storeu_ps(t, sum);
    float total = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
    if (j < n) {
        for (int i = 0; i < 8; i++) t[i] = j + i < n ? s[j + i] : m;
        _mm256_storeu_ps(t, exp256(_mm256_sub_ps(_mm256_loadu_ps(t), vm)));
        for (int i = 0; j + i < n; i++) {
            s[j + i] = t[i];
            total += t[i];
        }
    }
    return total;
}

void cm_kernels_fill_attn_avx2(cm_kernels *k) {
    CM_ATTN_MULTI_FILL(k);
    k->attn_exp = attn_exp;
    k->attn_f16_step = attn_f16_step;
    k->attn_f16_dot = attn_f16_dot;
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
}
