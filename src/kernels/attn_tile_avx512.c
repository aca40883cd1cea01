/*
 * attn_tile_avx512.c: prefill's many-query forms of attn_avx512.c's attn_qk
 * (F32/F16 K rows) and of the transposed-V sum (kernels.h attn_qk_many,
 * attn_vt_many), bit for bit the same table's decode results, but with the
 * positions (QK) or the elements (V) in the vector lanes instead of a
 * 16-lane partial per dot summed by a transposing tree.
 *
 * attn_qk's score of position j is, per lane l, a fused multiply-add chain
 * over the elements l, l + 16, ... (P_l), then hsum16's tree over the 16
 * lanes: ((H0 + H4) + (H2 + H6)) + ((H1 + H5) + (H3 + H7)) with H_m = P_m +
 * P_(m+8). Here a tile of 16 K rows is transposed once (F16 widened on the
 * way) so that element e of all 16 positions is one vector; P_l of four
 * queries is then a chain of fused multiply-adds with the query element
 * broadcast, and the tree is vector adds in the same order. The many queries
 * of a prefill tile share each transposed tile, and there is no per-dot
 * horizontal sum (the decode kernel's cost for one query per dot).
 * The transposed V (element rows of positions) is turned the other way: a
 * block of 16 elements x the tile's positions becomes position rows of 16
 * elements, and the weights are broadcast. The positions past the last
 * multiple of 16 are added after the tree, in position order, each product
 * rounded before its add (attn_split.c's v_acc).
 *
 * Compiled with the AVX-512 flags only. It never allocates: the transposed
 * tiles live on the stack (heads of at most TILE_MAXD elements; wider heads
 * keep the decode kernels).
 */
#include "attn_q8_avx512.h"
#include "isa.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { TILE_MAXD = CM_ATTN_MANY_MAXD, TILE_MAXN = CM_ATTN_MANY_MAXN };

/* 16 x 16 floats transposed in registers: r[i][j] -> r[j][i]. */
AI void tr16(__m512 *r) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int a = 0; a < 4; a++) {
        u[4 * a] = _mm512_shuffle_ps(t[4 * a], t[4 * a + 2], 0x44);
        u[4 * a + 1] = _mm512_shuffle_ps(t[4 * a], t[4 * a + 2], 0xEE);
        u[4 * a + 2] = _mm512_shuffle_ps(t[4 * a + 1], t[4 * a + 3], 0x44);
        u[4 * a + 3] = _mm512_shuffle_ps(t[4 * a + 1], t[4 * a + 3], 0xEE);
    }
    /* u[4a + e], 128-bit lane k: rows 4a..4a+3 of column 4k + e */
    for (int e = 0; e < 4; e++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xEE);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44),
                     v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xEE);
        r[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* Elements [i, i + 16) of an F32 or F16 row as floats; only the first m
 * (1..16) are read, the rest are 0. */
AI __m512 load16(enum cm_type T, const char *r, int64_t i, int m) {
    const __mmask16 km = (__mmask16)((1u << m) - 1);
    if (T == CM_TYPE_F32) return _mm512_maskz_loadu_ps(km, (const float *)r + i);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, (const cm_f16 *)r + i));
}

/* dst[e * 16 + t] = row t's element c0 + e for t < nt (rows src + t * stride;
 * later t: 0), e in [0, 16): 16 rows' elements [c0, c0 + 16) turned into 16
 * vectors of the rows. */
AI void tile16(enum cm_type T, const char *src, size_t stride, int nt, int64_t c0, float *dst) {
    __m512 r[16];
    for (int t = 0; t < 16; t++) r[t] = t < nt ? load16(T, src + (size_t)t * stride, c0, 16) : _mm512_setzero_ps();
    tr16(r);
    for (int e = 0; e < 16; e++) _mm512_store_ps(dst + e * 16, r[e]);
}

/* H_m = P_m + P_(m+8) of four rows of scalars a0..a3: P_l the chain over
 * steps st of fma(X[e], a[e]) from 0, e = 16 st + l, X[e] the vector at
 * X + 16 e. */
AI void pair4(const float *X, int steps, const float *const *a, int m, __m512 *h) {
    __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0;
    for (int st = 0; st < steps; st++) {
        const int e = 16 * st + m;
        const __m512 x = _mm512_load_ps(X + 16 * e), y = _mm512_load_ps(X + 16 * (e + 8));
        p0 = _mm512_fmadd_ps(x, _mm512_set1_ps(a[0][e]), p0);
        p1 = _mm512_fmadd_ps(x, _mm512_set1_ps(a[1][e]), p1);
        p2 = _mm512_fmadd_ps(x, _mm512_set1_ps(a[2][e]), p2);
        p3 = _mm512_fmadd_ps(x, _mm512_set1_ps(a[3][e]), p3);
        q0 = _mm512_fmadd_ps(y, _mm512_set1_ps(a[0][e + 8]), q0);
        q1 = _mm512_fmadd_ps(y, _mm512_set1_ps(a[1][e + 8]), q1);
        q2 = _mm512_fmadd_ps(y, _mm512_set1_ps(a[2][e + 8]), q2);
        q3 = _mm512_fmadd_ps(y, _mm512_set1_ps(a[3][e + 8]), q3);
    }
    h[0] = _mm512_add_ps(p0, q0);
    h[1] = _mm512_add_ps(p1, q1);
    h[2] = _mm512_add_ps(p2, q2);
    h[3] = _mm512_add_ps(p3, q3);
}

AI void add4(__m512 *d, const __m512 *x, const __m512 *y) {
    d[0] = _mm512_add_ps(x[0], y[0]);
    d[1] = _mm512_add_ps(x[1], y[1]);
    d[2] = _mm512_add_ps(x[2], y[2]);
    d[3] = _mm512_add_ps(x[3], y[3]);
}

/* The four rows' sums in hsum16's tree order (see the top of the file). */
AI void tree4(const float *X, int steps, const float *const *a, __m512 *out) {
    __m512 f0[4], g1[4], ha[4], hb[4], g[4];
    pair4(X, steps, a, 0, ha);
    pair4(X, steps, a, 4, hb);
    add4(f0, ha, hb);
    pair4(X, steps, a, 2, ha);
    pair4(X, steps, a, 6, hb);
    add4(g, ha, hb);
    add4(f0, f0, g);
    pair4(X, steps, a, 1, ha);
    pair4(X, steps, a, 5, hb);
    add4(g1, ha, hb);
    pair4(X, steps, a, 3, ha);
    pair4(X, steps, a, 7, hb);
    add4(g, ha, hb);
    add4(g1, g1, g);
    add4(out, f0, g1);
}

/* attn_qk's scores (attn_avx512.c, F32/F16 rows) with 16 positions per
 * transposed tile. A group of fewer than four queries repeats its first
 * query's row in the empty places and stores nothing for them. */
AI void qk_many(enum cm_type T, int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                float *s, int ld) {
    float kt[TILE_MAXD * 16] __attribute__((aligned(64)));
    const __m512 vs = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 16) {
        const int nt = n - j < 16 ? n - j : 16;
        const char *r0 = (const char *)k + (size_t)j * k_row;
        for (int64_t c = 0; c < D; c += 16) tile16(T, r0, k_row, nt, c, kt + c * 16);
        const __mmask16 km = (__mmask16)((1u << nt) - 1);
        for (int h0 = 0; h0 < nq; h0 += 4) {
            const int nh = nq - h0 < 4 ? nq - h0 : 4;
            const float *a[4];
            for (int h = 0; h < 4; h++) a[h] = q + (size_t)(h0 + (h < nh ? h : 0)) * D;
            __m512 e[4];
            tree4(kt, (int)(D / 16), a, e);
            for (int h = 0; h < nh; h++)
                _mm512_mask_storeu_ps(s + (size_t)(h0 + h) * ld + j, km, _mm512_mul_ps(e[h], vs));
        }
    }
}

/* Q8_0 K rows, D a multiple of 64: attn_qk's VNNI scores (attn_avx512.c,
 * attn_q8_avx512.h). There lane l of a (query, position) partial is the chain
 * over 64-element chunks c of fma(float(isum), d_k d_q, .), isum the exact
 * sum of the products of bytes 4l .. 4l + 3 of chunk c (block 2c for l < 8,
 * 2c + 1 for l >= 8), each started from the query's bias. Here chunk c of 16
 * K rows, + 128, is transposed as 16 x 16 dwords once per tile (dword l of
 * 16 positions in one vector); the query's four bytes and bias are
 * broadcast, d_k is the positions' vector times the query's d_q, and the
 * lanes meet in tree4's order: the decode's integers, products and sums. */
enum { Q8T_CH = TILE_MAXD / 64, Q8T_POS = 64 /* positions transposed at a time */ };

/* H_m = P_m + P_(m+8) for four queries, over the nc chunks of one tile:
 * kt[(c * 16 + l) * 16 + t] = dword l of chunk c of position t (+ 128),
 * dq[(h * nc + c) * 32 + 16 half + t] = d_k(t) d_q of query h's block 2c + half. */
AI void pair4_q8(const int32_t *kt, const float *dq, int nc, const int32_t *const *qc, const int32_t *const *qi, int m,
                 __m512 *out) {
    __m512 p[4], r[4];
    _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) p[h] = r[h] = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        const __m512i x = _mm512_load_si512(kt + (c * 16 + m) * 16), y = _mm512_load_si512(kt + (c * 16 + m + 8) * 16);
        _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) {
            const __m512i a =
                _mm512_dpbusd_epi32(_mm512_set1_epi32(qc[h][c * 16 + m]), x, _mm512_set1_epi32(qi[h][c * 16 + m]));
            const __m512i b = _mm512_dpbusd_epi32(_mm512_set1_epi32(qc[h][c * 16 + m + 8]), y,
                                                  _mm512_set1_epi32(qi[h][c * 16 + m + 8]));
            p[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_load_ps(dq + (h * nc + c) * 32), p[h]);
            r[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_load_ps(dq + (h * nc + c) * 32 + 16), r[h]);
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) out[h] = _mm512_add_ps(p[h], r[h]);
}

AI void tree4_q8(const int32_t *kt, const float *dq, int nc, const int32_t *const *qc, const int32_t *const *qi,
                 __m512 *out) {
    __m512 f0[4], g1[4], ha[4], hb[4], g[4];
    pair4_q8(kt, dq, nc, qc, qi, 0, ha);
    pair4_q8(kt, dq, nc, qc, qi, 4, hb);
    add4(f0, ha, hb);
    pair4_q8(kt, dq, nc, qc, qi, 2, ha);
    pair4_q8(kt, dq, nc, qc, qi, 6, hb);
    add4(g, ha, hb);
    add4(f0, f0, g);
    pair4_q8(kt, dq, nc, qc, qi, 1, ha);
    pair4_q8(kt, dq, nc, qc, qi, 5, hb);
    add4(g1, ha, hb);
    pair4_q8(kt, dq, nc, qc, qi, 3, ha);
    pair4_q8(kt, dq, nc, qc, qi, 7, hb);
    add4(g, ha, hb);
    add4(g1, g1, g);
    add4(out, f0, g1);
}

/* The table's own attn_qk for Q8_0 (set by the fill, after attn_avx512.c's). */
static cm_attn_qk_fn qk_q8_0_decode;

static void attn_qk_many_q8_0(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                              float *s, int ld) {
    if (D % 64 || D > TILE_MAXD) { /* attn_qk's float path: the same function, the same bits */
        qk_q8_0_decode(D, nq, q, k, k_row, n, scale, s, ld);
        return;
    }
    int32_t kt[Q8T_POS / 16][Q8T_CH * 256] __attribute__((aligned(64)));
    float dk[Q8T_POS / 16][Q8T_CH * 32] __attribute__((aligned(64))), dq[4 * Q8T_CH * 32] __attribute__((aligned(64)));
    int8_t qi[4][QK8_MAXD] __attribute__((aligned(64)));
    int32_t qc[4][QK8_MAXD / 4] __attribute__((aligned(64)));
    float qd[4][QK8_MAXD / 4] __attribute__((aligned(64)));
    const int nc = (int)(D / 64);
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int j0 = 0; j0 < n; j0 += Q8T_POS) {
        const int np = n - j0 < Q8T_POS ? n - j0 : Q8T_POS;
        for (int j = 0; j < np; j += 16) { /* transpose the chunk's tiles once for every query */
            const int nt = np - j < 16 ? np - j : 16;
            for (int c = 0; c < nc; c++) {
                __m512 r[16];
                for (int t = 0; t < 16; t++) {
                    if (t >= nt) {
                        r[t] = _mm512_setzero_ps();
                        dk[j / 16][c * 32 + t] = dk[j / 16][c * 32 + 16 + t] = 0.0f;
                        continue;
                    }
                    const cm_block_q8_0 *b =
                        (const cm_block_q8_0 *)((const char *)k + (size_t)(j0 + j + t) * k_row) + 2 * c;
                    r[t] = _mm512_castsi512_ps(_mm512_xor_si512(
                        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[0].qs)),
                                           _mm256_loadu_si256((const __m256i *)b[1].qs), 1),
                        x80));
                    dk[j / 16][c * 32 + t] = _cvtsh_ss(b[0].d);
                    dk[j / 16][c * 32 + 16 + t] = _cvtsh_ss(b[1].d);
                }
                tr16(r);
                for (int l = 0; l < 16; l++) _mm512_store_ps((float *)kt[j / 16] + (c * 16 + l) * 16, r[l]);
            }
        }
        for (int h0 = 0; h0 < nq; h0 += 4) {
            const int nh = nq - h0 < 4 ? nq - h0 : 4;
            const int32_t *qcp[4], *qip[4];
            for (int h = 0; h < 4; h++) { /* empty places repeat the first query; nothing stored for them */
                if (h < nh) q8_prep(D, q + (size_t)(h0 + h) * D, qi[h], qc[h], qd[h]);
                qcp[h] = qc[h < nh ? h : 0];
                qip[h] = (const int32_t *)qi[h < nh ? h : 0];
            }
            for (int j = 0; j < np; j += 16) {
                const int nt = np - j < 16 ? np - j : 16;
                for (int h = 0; h < 4; h++) {
                    const float *qdh = qd[h < nh ? h : 0];
                    for (int c = 0; c < nc; c++) {
                        _mm512_store_ps(dq + (h * nc + c) * 32, _mm512_mul_ps(_mm512_load_ps(dk[j / 16] + c * 32),
                                                                              _mm512_set1_ps(qdh[c * 16])));
                        _mm512_store_ps(
                            dq + (h * nc + c) * 32 + 16,
                            _mm512_mul_ps(_mm512_load_ps(dk[j / 16] + c * 32 + 16), _mm512_set1_ps(qdh[c * 16 + 8])));
                    }
                }
                __m512 e[4];
                tree4_q8(kt[j / 16], dq, nc, qcp, qip, e);
                const __mmask16 km = (__mmask16)((1u << nt) - 1);
                for (int h = 0; h < nh; h++)
                    _mm512_mask_storeu_ps(s + (size_t)(h0 + h) * ld + j0 + j, km, _mm512_mul_ps(e[h], vs));
            }
        }
    }
}

/* v_acc's transposed branch (attn_split.c) over attn_avx512.c's attn_qk:
 * acc[r * D + i] += the tree sum over positions [0, n & ~15) of w[r * ld +
 * j] V_j[i] (the weights as attn_qk's queries, V's element rows as its rows,
 * then times 1), then positions [n & ~15, n) in order, each product rounded
 * before its add. V element i of position j at vt + i * vt_stride + j * es. */
AI void vt_many(enum cm_type T, int64_t D, int nq, const void *vt, size_t vt_stride, const float *w, int ld, int n,
                float *acc) {
    float vr[TILE_MAXN * 16] __attribute__((aligned(64))), tail[16 * 16] __attribute__((aligned(64)));
    const int n16 = n & ~15, nt = n - n16;
    for (int64_t i0 = 0; i0 < D; i0 += 16) {
        const char *e0 = (const char *)vt + (size_t)i0 * vt_stride;
        /* vr[j * 16 + t] = element i0 + t of position j */
        for (int j = 0; j < n16; j += 16) tile16(T, e0, vt_stride, 16, j, vr + j * 16);
        if (nt) {
            __m512 r[16];
            for (int t = 0; t < 16; t++) r[t] = load16(T, e0 + (size_t)t * vt_stride, n16, nt);
            tr16(r);
            for (int t = 0; t < 16; t++) _mm512_store_ps(tail + t * 16, r[t]);
        }
        for (int h0 = 0; h0 < nq; h0 += 4) {
            const int nh = nq - h0 < 4 ? nq - h0 : 4;
            const float *a[4];
            for (int h = 0; h < 4; h++) a[h] = w + (size_t)(h0 + (h < nh ? h : 0)) * ld;
            __m512 e[4];
            if (n16) tree4(vr, n16 / 16, a, e);
            for (int h = 0; h < nh; h++) {
                float *o = acc + (size_t)(h0 + h) * D + i0;
                __m512 x = _mm512_loadu_ps(o);
                if (n16) x = _mm512_add_ps(x, e[h]);
                for (int t = 0; t < nt; t++)
                    x = _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(a[h][n16 + t]), _mm512_load_ps(tail + t * 16)));
                _mm512_storeu_ps(o, x);
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

void cm_kernels_fill_attn_tile_avx512(cm_kernels *k) {
    k->attn_qk_many[CM_TYPE_F32] = attn_qk_many_f32;
    k->attn_qk_many[CM_TYPE_F16] = attn_qk_many_f16;
    k->attn_vt_many[CM_TYPE_F32] = attn_vt_many_f32;
    k->attn_vt_many[CM_TYPE_F16] = attn_vt_many_f16;
    qk_q8_0_decode = k->attn_qk[CM_TYPE_Q8_0];                             /* filled before (dispatch.c) */
    if (qk_q8_0_decode) k->attn_qk_many[CM_TYPE_Q8_0] = attn_qk_many_q8_0; /* (V rows: the table's attn_vm) */
}
