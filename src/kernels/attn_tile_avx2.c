/*
 * attn_tile_avx2.c: prefill's many-query forms of attn_avx2.c's attn_qk
 * (F32/F16 K rows) and of the transposed-V sum (kernels.h attn_qk_many,
 * attn_vt_many), bit for bit the same table's decode results, as
 * attn_tile_avx512.c is for AVX-512, in 8 lanes.
 *
 * attn_avx2.c's attn_qk score of position j is, per lane l, a fused
 * multiply-add chain over the elements l, l + 8, l + 16, ... (P_l), then
 * hsum8's tree over the 8 lanes: ((P0 + P1) + (P2 + P3)) + ((P4 + P5) +
 * (P6 + P7)). Here a tile of 8 K rows is transposed once (F16 widened on the
 * way) so that element e of the 8 positions is one vector; P_l of four
 * queries is then a chain of fused multiply-adds with the query element
 * broadcast, and the tree is vector adds in the same order, with no per-dot
 * horizontal sum. The transposed V (element rows of positions) is turned
 * the other way: 8 elements x the tile's positions become position rows of
 * 8 elements, and the weights are broadcast. The positions past the last
 * multiple of 16 are added after the tree, in position order, each product
 * rounded before its add (attn_split.c's v_acc).
 *
 * Compiled with the AVX2 flags only. It never allocates: the transposed
 * tiles live on the stack (heads of at most TILE_MAXD elements).
 */
#include "isa.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { TILE_MAXD = CM_ATTN_MANY_MAXD, TILE_MAXN = CM_ATTN_MANY_MAXN };

/* 8 x 8 floats transposed in registers: r[i][j] -> r[j][i]. */
AI void tr8(__m256 *r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int a = 0; a < 2; a++) {
        u[4 * a] = _mm256_shuffle_ps(t[4 * a], t[4 * a + 2], 0x44);
        u[4 * a + 1] = _mm256_shuffle_ps(t[4 * a], t[4 * a + 2], 0xEE);
        u[4 * a + 2] = _mm256_shuffle_ps(t[4 * a + 1], t[4 * a + 3], 0x44);
        u[4 * a + 3] = _mm256_shuffle_ps(t[4 * a + 1], t[4 * a + 3], 0xEE);
    }
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

/* Elements [i, i + 8) of an F32 or F16 row as floats. */
AI __m256 load8(enum cm_type T, const char *r, int64_t i) {
    if (T == CM_TYPE_F32) return _mm256_loadu_ps((const float *)r + i);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cm_f16 *)r + i)));
}

/* dst[e * 8 + t] = row t's element c0 + e for t < nt (rows src + t * stride;
 * later t: 0), e in [0, 8). */
AI void tile8(enum cm_type T, const char *src, size_t stride, int nt, int64_t c0, float *dst) {
    __m256 r[8];
    for (int t = 0; t < 8; t++) r[t] = t < nt ? load8(T, src + (size_t)t * stride, c0) : _mm256_setzero_ps();
    tr8(r);
    for (int e = 0; e < 8; e++) _mm256_store_ps(dst + e * 8, r[e]);
}

/* P_m + P_(m+1) of four rows of scalars a0..a3: P_l the chain over steps st
 * of fma(X[e], a[e]) from 0, e = 8 st + l, X[e] the vector at X + 8 e. */
AI void pair4(const float *X, int steps, const float *const *a, int m, __m256 *h) {
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0;
    for (int st = 0; st < steps; st++) {
        const int e = 8 * st + m;
        const __m256 x = _mm256_load_ps(X + 8 * e), y = _mm256_load_ps(X + 8 * (e + 1));
        p0 = _mm256_fmadd_ps(x, _mm256_broadcast_ss(a[0] + e), p0);
        p1 = _mm256_fmadd_ps(x, _mm256_broadcast_ss(a[1] + e), p1);
        p2 = _mm256_fmadd_ps(x, _mm256_broadcast_ss(a[2] + e), p2);
        p3 = _mm256_fmadd_ps(x, _mm256_broadcast_ss(a[3] + e), p3);
        q0 = _mm256_fmadd_ps(y, _mm256_broadcast_ss(a[0] + e + 1), q0);
        q1 = _mm256_fmadd_ps(y, _mm256_broadcast_ss(a[1] + e + 1), q1);
        q2 = _mm256_fmadd_ps(y, _mm256_broadcast_ss(a[2] + e + 1), q2);
        q3 = _mm256_fmadd_ps(y, _mm256_broadcast_ss(a[3] + e + 1), q3);
    }
    h[0] = _mm256_add_ps(p0, q0);
    h[1] = _mm256_add_ps(p1, q1);
    h[2] = _mm256_add_ps(p2, q2);
    h[3] = _mm256_add_ps(p3, q3);
}

AI void add4(__m256 *d, const __m256 *x, const __m256 *y) {
    d[0] = _mm256_add_ps(x[0], y[0]);
    d[1] = _mm256_add_ps(x[1], y[1]);
    d[2] = _mm256_add_ps(x[2], y[2]);
    d[3] = _mm256_add_ps(x[3], y[3]);
}

/* The four rows' sums in hsum8's tree order (see the top of the file). */
AI void tree4(const float *X, int steps, const float *const *a, __m256 *out) {
    __m256 lo[4], hi[4], g[4];
    pair4(X, steps, a, 0, lo);
    pair4(X, steps, a, 2, g);
    add4(lo, lo, g);
    pair4(X, steps, a, 4, hi);
    pair4(X, steps, a, 6, g);
    add4(hi, hi, g);
    add4(out, lo, hi);
}

/* attn_qk's scores (attn_avx2.c, F32/F16 rows) with 8 positions per
 * transposed tile. A group of fewer than four queries repeats its first
 * query's row in the empty places and stores nothing for them. */
AI void qk_many(enum cm_type T, int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                float *s, int ld) {
    float kt[TILE_MAXD * 8] __attribute__((aligned(32)));
    const __m256 vs = _mm256_set1_ps(scale);
    for (int j = 0; j < n; j += 8) {
        const int nt = n - j < 8 ? n - j : 8;
        const char *r0 = (const char *)k + (size_t)j * k_row;
        for (int64_t c = 0; c < D; c += 8) tile8(T, r0, k_row, nt, c, kt + c * 8);
        for (int h0 = 0; h0 < nq; h0 += 4) {
            const int nh = nq - h0 < 4 ? nq - h0 : 4;
            const float *a[4];
            for (int h = 0; h < 4; h++) a[h] = q + (size_t)(h0 + (h < nh ? h : 0)) * D;
            __m256 e[4];
            tree4(kt, (int)(D / 8), a, e);
            for (int h = 0; h < nh; h++) {
                const __m256 o = _mm256_mul_ps(e[h], vs);
                float *dst = s + (size_t)(h0 + h) * ld + j;
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

/* v_acc's transposed branch (attn_split.c) over attn_avx2.c's attn_qk:
 * acc[r * D + i] += the tree sum over positions [0, n & ~15) of w[r * ld +
 * j] V_j[i] (the weights as attn_qk's queries, V's element rows as its rows,
 * then times 1), then positions [n & ~15, n) in order, each product rounded
 * before its add. V element i of position j at vt + i * vt_stride + j * es. */
AI void vt_many(enum cm_type T, int64_t D, int nq, const void *vt, size_t vt_stride, const float *w, int ld, int n,
                float *acc) {
    float vr[TILE_MAXN * 8] __attribute__((aligned(32))), tail[16 * 8] __attribute__((aligned(32)));
    const int n16 = n & ~15, nt = n - n16;
    for (int64_t i0 = 0; i0 < D; i0 += 8) {
        const char *e0 = (const char *)vt + (size_t)i0 * vt_stride;
        /* vr[j * 8 + t] = element i0 + t of position j */
        for (int j = 0; j < n16; j += 8) tile8(T, e0, vt_stride, 8, j, vr + j * 8);
        for (int p = 0; p < nt; p++)
            for (int t = 0; t < 8; t++) {
                const char *r = e0 + (size_t)t * vt_stride;
                tail[p * 8 + t] =
                    T == CM_TYPE_F32 ? ((const float *)r)[n16 + p] : _cvtsh_ss(((const cm_f16 *)r)[n16 + p]);
            }
        for (int h0 = 0; h0 < nq; h0 += 4) {
            const int nh = nq - h0 < 4 ? nq - h0 : 4;
            const float *a[4];
            for (int h = 0; h < 4; h++) a[h] = w + (size_t)(h0 + (h < nh ? h : 0)) * ld;
            __m256 e[4];
            if (n16) tree4(vr, n16 / 8, a, e);
            for (int h = 0; h < nh; h++) {
                float *o = acc + (size_t)(h0 + h) * D + i0;
                __m256 x = _mm256_loadu_ps(o);
                if (n16) x = _mm256_add_ps(x, e[h]);
                for (int t = 0; t < nt; t++)
                    x = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(a[h][n16 + t]), _mm256_load_ps(tail + t * 8)));
                _mm256_storeu_ps(o, x);
            }
        }
    }
}

static void attn_qk_many_f32(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                             float *s, int ld) {
    qk_many(CM_TYPE_F32, D, nq, q, k, k_row, n, scale, s, ld);
}
static void attn_qk_many_f16(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                             float *s, int ld) {
    qk_many(CM_TYPE_F16, D, nq, q, k, k_row, n, scale, s, ld);
}
static void attn_vt_many_f32(int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                             float *acc) {
    vt_many(CM_TYPE_F32, D, nq, v, v_row, w, ld, n, acc);
}
static void attn_vt_many_f16(int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                             float *acc) {
    vt_many(CM_TYPE_F16, D, nq, v, v_row, w, ld, n, acc);
}

void cm_kernels_fill_attn_tile_avx2(cm_kernels *k) {
    k->attn_qk_many[CM_TYPE_F32] = attn_qk_many_f32;
    k->attn_qk_many[CM_TYPE_F16] = attn_qk_many_f16;
    k->attn_vt_many[CM_TYPE_F32] = attn_vt_many_f32;
    k->attn_vt_many[CM_TYPE_F16] = attn_vt_many_f16;
}
