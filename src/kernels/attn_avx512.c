/*
 * attn_avx512.c: attention's value side (kernels.h, cm_attn_v_fn) with
 * AVX-512: 16 elements of the accumulator stay in a register while the
 * tile's V rows stream past (each element still sums its rows in j order,
 * with fused multiply-adds: the last bits may differ from attn_ref.c, whose
 * multiply and add round apart). F32, F16 (F16C) and Q8_0; Q4_0 stays the
 * reference. Compiled with the AVX-512 flags only.
 *
 * The multi-query decode ops (attn_qk, attn_vm, attn_exp; kernels.h) for
 * F32, F16, Q8_0 and Q4_0 rows: a K row is loaded and widened to floats 16
 * elements at a time; each (query, position) dot stays a 16-lane partial and
 * 16 positions' partials are summed together by one transposing tree
 * (hsum16) instead of one horizontal sum each (a tile's last partial group
 * runs the same code with zero partials past its end; Q8_0 rows of a
 * multiple of 64 elements: integer dots by VNNI); the V side keeps up to four
 * queries' accumulators in registers while the rows stream past; exp is a
 * degree-7 polynomial on a range-reduced argument scaled by 2^n (scalef),
 * within about 1 ulp of expf.
 */
#include "isa.h"

#include <immintrin.h>
#include <math.h>

static void attn_v_f32(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        __m512 a = _mm512_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 4;
        for (int j = 0; j < n; j++, r += v_row)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_loadu_ps((const float *)r), a);
        _mm512_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], ((const float *)((const char *)v + (size_t)j * v_row))[i], acc[i]);
}

static void attn_v_f16(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        __m512 a = _mm512_loadu_ps(acc + i);
        const char *r = (const char *)v + (size_t)i * 2;
        for (int j = 0; j < n; j++, r += v_row)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r)), a);
        _mm512_storeu_ps(acc + i, a);
    }
    for (; i < D; i++)
        for (int j = 0; j < n; j++)
            acc[i] = fmaf(w[j], cm_f16_to_f32(((const cm_f16 *)((const char *)v + (size_t)j * v_row))[i]), acc[i]);
}

/* Q8_0: element = d * q (rounded as to_float does), then the fused add. */
static void attn_v_q8_0(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc) {
    for (int64_t b = 0; b < D / 32; b++) {
        __m512 a0 = _mm512_loadu_ps(acc + b * 32), a1 = _mm512_loadu_ps(acc + b * 32 + 16);
        const char *r = (const char *)v + (size_t)b * sizeof(cm_block_q8_0);
        for (int j = 0; j < n; j++, r += v_row) {
            const cm_block_q8_0 *blk = (const cm_block_q8_0 *)r;
            const __m512 d = _mm512_set1_ps(cm_f16_to_f32(blk->d)), wj = _mm512_set1_ps(w[j]);
            const __m128i q0 = _mm_loadu_si128((const __m128i *)blk->qs),
                          q1 = _mm_loadu_si128((const __m128i *)(blk->qs + 16));
            const __m512 x0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
            const __m512 x1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
            a0 = _mm512_fmadd_ps(wj, x0, a0);
            a1 = _mm512_fmadd_ps(wj, x1, a1);
        }
        _mm512_storeu_ps(acc + b * 32, a0);
        _mm512_storeu_ps(acc + b * 32 + 16, a1);
    }
}

/* F16 accumulator step: 16 lanes, fused, rounded to F16 nearest-even. */
static void attn_f16_step(int64_t D, void *accv, const void *vv, float ms, float w) {
    cm_f16 *acc = accv;
    const cm_f16 *v = vv;
    int64_t i = 0;
    const __m512 vm = _mm512_set1_ps(ms), vw = _mm512_set1_ps(w);
    for (; i + 16 <= D; i += 16) {
        __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(acc + i)));
        if (ms != 1.0f) a = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(a, vm), _MM_FROUND_TO_NEAREST_INT));
        a = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + i))), vw, a);
        _mm256_storeu_si256((__m256i *)(acc + i), _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < D; i++) {
        if (ms != 1.0f) acc[i] = cm_f32_to_f16(cm_f16_to_f32(acc[i]) * ms);
        acc[i] = cm_f32_to_f16(fmaf(cm_f16_to_f32(v[i]), w, cm_f16_to_f32(acc[i])));
    }
}

/* ggml's AVX-512 F16 dot: 4 x 16 lanes, (0+2, 1+3), then 0+1, then the
 * 16-lane halving tree (256-bit halves, 128-bit halves, pairs, lanes). */
static void attn_f16_dot(int64_t D, float *s, const void *xv, const void *yv) {
    const cm_f16 *x = xv, *y = yv;
    __m512 a[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a[j] = _mm512_setzero_ps(); /* unrolled: in registers */
    const int64_t np = D & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a[j] =
            _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16 * j))),
                            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16 * j))), a[j]);
    a[0] = _mm512_add_ps(a[0], a[2]);
    a[1] = _mm512_add_ps(a[1], a[3]);
    a[0] = _mm512_add_ps(a[0], a[1]);
    /* t[l] += t[l + w] for w = 8, 4, 2, 1 over t = a[0] in registers */
    const __m256 u = _mm256_add_ps(_mm512_castps512_ps256(a[0]),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[0]), 1)));
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    double sum = _mm_cvtss_f32(v);
    for (int64_t i = np; i < D; i++) sum += (double)(cm_f16_to_f32(x[i]) * cm_f16_to_f32(y[i]));
    *s = (float)sum;
}

/* Elements [i, i + 16) of a KV row of type T as floats (i a multiple of 16;
 * for the block types, of the 32-element block i / 32). Q8_0/Q4_0 give the
 * unscaled quants; *d receives the block's scale (1 for F32/F16). */
#define AI static inline __attribute__((always_inline))
/* the loops over a group's queries (and slices): unrolled, their
 * accumulators in registers (-O2 leaves them in memory otherwise) */
#define UNROLL4 _Pragma("GCC unroll 4")

/* An F16 scale by F16C: the same value as cm_f16_to_f32 (exact either way),
 * without its call and branches in the row loops. */
AI float f16s(cm_f16 h) { return _cvtsh_ss(h); }

AI __m512 row16(enum cm_type T, const char *r, int64_t i, float *d) {
    if (T == CM_TYPE_F32) {
        *d = 1.0f;
        return _mm512_loadu_ps((const float *)r + i);
    }
    if (T == CM_TYPE_F16) {
        *d = 1.0f;
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const cm_f16 *)r + i)));
    }
    if (T == CM_TYPE_Q8_0) {
        const cm_block_q8_0 *b = (const cm_block_q8_0 *)r + i / 32;
        *d = f16s(b->d);
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + (i & 16)))));
    }
    const cm_block_q4_0 *b = (const cm_block_q4_0 *)r + i / 32;
    *d = f16s(b->d);
    __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
    x = (i & 16) ? _mm512_srli_epi32(x, 4) : _mm512_and_si512(x, _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(x, _mm512_set1_epi32(8)));
}

/* out lane L = the sum of the 16 lanes of v[4 (L % 4) + L / 4]: 256-bit
 * halves, 128-bit quarters, then pairs and lanes within quarters. */
AI __m512 hsum16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

#include "attn_q8_avx512.h"

/* The queries h0 .. h0 + nh - 1 (nh a constant where inlined: their
 * accumulators stay in registers). */
AI void qk_q8_0_group(int64_t D, int nh, int h0, int8_t (*qi)[QK8_MAXD], int32_t (*qc)[QK8_MAXD / 4],
                      float (*qd)[QK8_MAXD / 4], const void *k, size_t k_row, int n, __m512 vs, float *s, int ld) {
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    {
        for (int j = 0; j < n; j += 16) { /* a last partial group: zero partials past n */
            const int nt = n - j < 16 ? n - j : 16;
            __m512 v[4][16];
            for (int t = 0; t < 16; t++) {
                const char *r = (const char *)k + (size_t)(j + t) * k_row;
                if (t < nt && h0 == 0) _mm_prefetch(r + 64 * k_row, _MM_HINT_T0);
                __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                for (int64_t c = 0; t < nt && c < D / 64; c++) {
                    const cm_block_q8_0 *b = (const cm_block_q8_0 *)r + 2 * c;
                    const __m512i kq = _mm512_xor_si512(
                        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[0].qs)),
                                           _mm256_loadu_si256((const __m256i *)b[1].qs), 1),
                        x80);
                    const __m512 dk = _mm512_insertf32x8(_mm512_set1_ps(f16s(b[0].d)), _mm256_set1_ps(f16s(b[1].d)), 1);
                    UNROLL4 for (int h = 0; h < nh; h++) {
                        const __m512i p = _mm512_dpbusd_epi32(_mm512_load_si512(qc[h] + c * 16), kq,
                                                              _mm512_load_si512(qi[h] + c * 64));
                        a[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dk, _mm512_load_ps(qd[h] + c * 16)),
                                               a[h]);
                    }
                }
                UNROLL4 for (int h = 0; h < nh; h++) v[h][(t & 3) * 4 + (t >> 2)] = a[h];
            }
            const __mmask16 km = (__mmask16)((1u << nt) - 1);
            UNROLL4 for (int h = 0; h < nh; h++)
                _mm512_mask_storeu_ps(s + (h0 + h) * ld + j, km, _mm512_mul_ps(hsum16(v[h]), vs));
        }
    }
}

static void qk_q8_0_vnni(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale, float *s,
                         int ld) {
    int8_t qi[4][QK8_MAXD] __attribute__((aligned(64)));
    int32_t qc[4][QK8_MAXD / 4] __attribute__((aligned(64)));
    float qd[4][QK8_MAXD / 4] __attribute__((aligned(64)));
    const __m512 vs = _mm512_set1_ps(scale);
    for (int h0 = 0; h0 < nq; h0 += 4) {
        const int nh = nq - h0 < 4 ? nq - h0 : 4;
        UNROLL4 for (int h = 0; h < nh; h++) q8_prep(D, q + (size_t)(h0 + h) * D, qi[h], qc[h], qd[h]);
        switch (nh) {
        case 4: qk_q8_0_group(D, 4, h0, qi, qc, qd, k, k_row, n, vs, s, ld); break;
        case 3: qk_q8_0_group(D, 3, h0, qi, qc, qd, k, k_row, n, vs, s, ld); break;
        case 2: qk_q8_0_group(D, 2, h0, qi, qc, qd, k, k_row, n, vs, s, ld); break;
        default: qk_q8_0_group(D, 1, h0, qi, qc, qd, k, k_row, n, vs, s, ld); break;
        }
    }
}

/* Up to four queries against 16 positions per step: each K row is widened
 * once for all of them (four independent FMA chains), the next tile's rows
 * are prefetched while this one is summed. qk_group: the queries h0 ..
 * h0 + nh - 1, nh a constant where inlined (the chains stay in registers). */
AI void qk_group(enum cm_type T, int64_t D, int nh, int h0, const float *qh, const void *k, size_t k_row, int n,
                 __m512 vs, float *s, int ld) {
    for (int j = 0; j < n; j += 16) { /* a last partial group: zero partials past n */
        const int nt = n - j < 16 ? n - j : 16;
        __m512 v[4][16];
        for (int t = 0; t < 16; t++) {
            const char *r = (const char *)k + (size_t)(j + t) * k_row;
            if (t < nt && h0 == 0) _mm_prefetch(r + 64 * k_row, _MM_HINT_T0);
            __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            if (t < nt && (T == CM_TYPE_F32 || T == CM_TYPE_F16)) {
                float d;
                for (int64_t i = 0; i < D; i += 16) {
                    const __m512 x = row16(T, r, i, &d);
                    UNROLL4 for (int h = 0; h < nh; h++) a[h] =
                        _mm512_fmadd_ps(x, _mm512_loadu_ps(qh + h * D + i), a[h]);
                }
            } else if (t < nt) {
                for (int64_t i = 0; i < D; i += 32) {
                    float d;
                    const __m512 x0 = row16(T, r, i, &d), x1 = row16(T, r, i + 16, &d), vd = _mm512_set1_ps(d);
                    UNROLL4 for (int h = 0; h < nh; h++) {
                        __m512 u = _mm512_mul_ps(x0, _mm512_loadu_ps(qh + h * D + i));
                        u = _mm512_fmadd_ps(x1, _mm512_loadu_ps(qh + h * D + i + 16), u);
                        a[h] = _mm512_fmadd_ps(u, vd, a[h]);
                    }
                }
            }
            UNROLL4 for (int h = 0; h < nh; h++) v[h][(t & 3) * 4 + (t >> 2)] = a[h];
        }
        const __mmask16 km = (__mmask16)((1u << nt) - 1);
        UNROLL4 for (int h = 0; h < nh; h++)
            _mm512_mask_storeu_ps(s + (h0 + h) * ld + j, km, _mm512_mul_ps(hsum16(v[h]), vs));
    }
}

AI void qk_multi(enum cm_type T, int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                 float *s, int ld) {
    if (T == CM_TYPE_Q8_0 && D % 64 == 0 && D <= QK8_MAXD) {
        qk_q8_0_vnni(D, nq, q, k, k_row, n, scale, s, ld);
        return;
    }
    const __m512 vs = _mm512_set1_ps(scale);
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

/* Elements [i, i + 16 nc) of the queries h0 .. h0 + nh - 1 over the n rows
 * (nh, nc constants where inlined: nh x nc accumulators in registers, each
 * row's elements widened once for all of them); each element sums its rows
 * in j order, as one 16-element slice at a time would. */
AI void vm_group(enum cm_type T, int64_t D, int nh, int nc, int h0, int64_t i, const void *v, size_t v_row,
                 const float *w, int ld, int n, float *acc) {
    __m512 a[4][4];
    UNROLL4 for (int h = 0; h < nh; h++) UNROLL4 for (int c = 0; c < nc; c++) a[h][c] =
        _mm512_loadu_ps(acc + (h0 + h) * D + i + 16 * c);
    const char *r = (const char *)v;
    for (int j = 0; j < n; j++, r += v_row) {
        if (i == 0 && h0 == 0) _mm_prefetch(r + 64 * v_row, _MM_HINT_T0);
        __m512 x[4], wh[4];
        UNROLL4 for (int c = 0; c < nc; c++) {
            float d;
            x[c] = row16(T, r, i + 16 * c, &d);
            if (T == CM_TYPE_Q8_0 || T == CM_TYPE_Q4_0) x[c] = _mm512_mul_ps(x[c], _mm512_set1_ps(d));
        }
        UNROLL4 for (int h = 0; h < nh; h++) wh[h] = _mm512_set1_ps(w[(h0 + h) * ld + j]);
        UNROLL4 for (int h = 0; h < nh; h++) UNROLL4 for (int c = 0; c < nc; c++) a[h][c] =
            _mm512_fmadd_ps(wh[h], x[c], a[h][c]);
    }
    UNROLL4 for (int h = 0; h < nh; h++) UNROLL4 for (int c = 0; c < nc; c++)
        _mm512_storeu_ps(acc + (h0 + h) * D + i + 16 * c, a[h][c]);
}

AI void vm_nh(enum cm_type T, int64_t D, int nh, int h0, const void *v, size_t v_row, const float *w, int ld, int n,
              float *acc) {
    int64_t i = 0;
    for (; i + 64 <= D; i += 64) vm_group(T, D, nh, 4, h0, i, v, v_row, w, ld, n, acc);
    for (; i < D; i += 16) vm_group(T, D, nh, 1, h0, i, v, v_row, w, ld, n, acc);
}

enum { VQ_FLOATS = 4096 }; /* a chunk of dequantized V rows (16 KiB) */

AI void vm_multi(enum cm_type T, int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                 float *acc);

/* Q8_0/Q4_0 V rows for more than four queries (prefill's calls pass up to
 * 128): each row dequantized once into floats (d * q, rounded as row16's
 * product), then the F32 sums over them: the same elements, fused adds and
 * order, so the bits of four queries at a time. */
static void vm_quant_many(enum cm_type T, int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                          float *acc) {
    float x[VQ_FLOATS] __attribute__((aligned(64)));
    const int R = (int)(VQ_FLOATS / D);
    for (int j0 = 0; j0 < n; j0 += R) {
        const int nr = n - j0 < R ? n - j0 : R;
        for (int j = 0; j < nr; j++) {
            const char *r = (const char *)v + (size_t)(j0 + j) * v_row;
            for (int64_t i = 0; i < D; i += 16) {
                float d;
                const __m512 e = row16(T, r, i, &d);
                _mm512_store_ps(x + (size_t)j * D + i, _mm512_mul_ps(e, _mm512_set1_ps(d)));
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
    for (int h0 = 0; h0 < nq; h0 += 4) switch (nq - h0 < 4 ? nq - h0 : 4) {
        case 4: vm_nh(T, D, 4, h0, v, v_row, w, ld, n, acc); break;
        case 3: vm_nh(T, D, 3, h0, v, v_row, w, ld, n, acc); break;
        case 2: vm_nh(T, D, 2, h0, v, v_row, w, ld, n, acc); break;
        default: vm_nh(T, D, 1, h0, v, v_row, w, ld, n, acc); break;
        }
}

CM_ATTN_MULTI_DEFINE()

/* e^x = 2^n e^r, n = round(x log2 e), r = x - n ln 2 (two-part ln 2), e^r by
 * its Taylor series to degree 7 (|r| <= 0.347: remainder < 6e-9). */
AI __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static float attn_exp(int n, float *s, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (j < n) {
        const __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm));
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(sum);
}

void cm_kernels_fill_attn_avx512(cm_kernels *k) {
    k->attn_f16_step = attn_f16_step;
    k->attn_f16_dot = attn_f16_dot;
    k->attn_v[CM_TYPE_F32] = attn_v_f32;
    k->attn_v[CM_TYPE_F16] = attn_v_f16;
    k->attn_v[CM_TYPE_Q8_0] = attn_v_q8_0;
    CM_ATTN_MULTI_FILL(k);
    k->attn_exp = attn_exp;
}
