/*
 * test_kernels_simd.c: every SIMD kernel (vec_dot, from_float, gemm) of every
 * ISA table this CPU runs (avx2, avx512, neon) against the scalar reference
 * table, on seeded data of many shapes: several block counts, all-zero
 * blocks, raw random block bytes (every bit pattern of quants, high bits and
 * 6-bit scales) with tiny and huge fp16 scales, and quantized real-looking rows.
 *
 * Error bound for dot products. The SIMD and reference kernels compute the
 * same integer sums exactly (8-bit activations, int32 lanes that stay below
 * 2^24), so they differ only in how the float terms are multiplied and added.
 * Any order of adding L terms has error at most gamma_L * S, gamma_L =
 * L*u/(1-L*u), u = 2^-24, where S bounds the sum of the terms' magnitudes;
 * each of the two results is within that of the exact value, so we allow
 *     |simd - ref| <= 2 * gamma_L * S.
 * S = sum_i |w_i| * |a_i| over the dequantized weight and activation, where
 * for types with a min term (q4_1, q5_1, q4_k, q5_k) |w_i| is taken as
 * |d*q| + |m| (computed by dequantizing a copy whose min has its sign made to
 * add), because the kernels add the d*q and m parts separately. L is an upper
 * bound on the length of the longest chain of float additions or roundings:
 * n + 16 for float types, n/16 + 16 for quantized ones (at most one float
 * term per 16 elements in any of our or the reference's orders, plus the
 * final reduction and the scale products). A kernel that reads a wrong
 * block, nibble or scale is off by a sizeable fraction of S, far above this.
 *
 * from_float must equal the reference byte for byte (it reproduces llama.cpp's
 * rounding). gemm must agree with the same table's vec_dot and with the
 * reference for every (row, token) within the same bound, and must write
 * nothing outside its rows (that gemm gives vec_dot's exact bits is
 * test_kernels_invariant.c's check).
 */
#include "kernels/kernels.h"
#include "test.h"

#include <stdint.h>

#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "test_rng.h"

static const enum cm_type k_types[] = {CM_TYPE_Q4_0,  CM_TYPE_Q4_1,    CM_TYPE_Q5_0,    CM_TYPE_Q5_1,   CM_TYPE_Q8_0,
                                       CM_TYPE_Q4_K,  CM_TYPE_Q5_K,    CM_TYPE_Q6_K,    CM_TYPE_F16,    CM_TYPE_BF16,
                                       CM_TYPE_F32,   CM_TYPE_Q2_K,    CM_TYPE_Q3_K,    CM_TYPE_IQ4_NL, CM_TYPE_IQ4_XS,
                                       CM_TYPE_MXFP4, CM_TYPE_IQ2_XXS, CM_TYPE_IQ3_XXS, CM_TYPE_IQ1_S};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])
static const char *const k_isas[] = {"avx2", "avx512", "neon"};

#define MAXN 8192
static float g_f[MAXN], g_w[MAXN], g_a[MAXN], g_tmp[MAXN];
static uint8_t g_wq[MAXN * 4], g_wabs[MAXN * 4], g_aq[MAXN * 4], g_aq2[MAXN * 4];

/* Floats in several regimes: mode 0 normal-ish, 1 wide dynamic range, 2 has
 * zero blocks, 3 has huge and tiny blocks. */
static void fill_floats(float *x, int64_t n, int mode) {
    for (int64_t i = 0; i < n; i++) {
        float v = frand();
        if (mode == 1) v *= (float)(1 << (rnd() % 20)) / 1024.0f;
        if (mode == 2 && ((i / 32) % 3 == 1 || (i / 256) % 4 == 2)) v = 0.0f;
        if (mode == 3) v *= ((i / 32) % 2) ? 1.5e3f : 1.0e-5f; /* 32 * 1.5e3 still fits q8_1.s (f16) */
        x[i] = v;
    }
}

static bool has_min(enum cm_type t) {
    return t == CM_TYPE_Q4_1 || t == CM_TYPE_Q5_1 || t == CM_TYPE_Q4_K || t == CM_TYPE_Q5_K || t == CM_TYPE_Q2_K;
}

/* Byte offset of the fp16 scale d (and of the min, d + 2) in a block. */
static size_t scale_offset(enum cm_type t) {
    return t == CM_TYPE_Q6_K   ? offsetof(cm_block_q6_k, d)
           : t == CM_TYPE_Q2_K ? offsetof(cm_block_q2_k, d)
           : t == CM_TYPE_Q3_K ? offsetof(cm_block_q3_k, d)
                               : 0;
}

/* Overwrite the fp16 scale fields of raw random blocks with finite values
 * (random bits would give inf/nan), from tiny to large. */
static void fix_scales(enum cm_type t, uint8_t *p, int64_t nblocks, size_t bs) {
    static const float mags[] = {1e-4f, 1e-2f, 0.5f, 3.0f, 100.0f};
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + (size_t)b * bs;
        const size_t off_d = scale_offset(t);
        if (t == CM_TYPE_MXFP4) { /* an E8M0 exponent: 2^(e-127) from 2^-17 to 2^12 */
            blk[0] = (uint8_t)(110 + rnd() % 30);
            continue;
        }
        cm_f16 d = cm_f32_to_f16(frand() * mags[rnd() % 5]);
        memcpy(blk + off_d, &d, 2);
        if (has_min(t)) {
            cm_f16 m = cm_f32_to_f16(frand() * mags[rnd() % 5]);
            memcpy(blk + off_d + 2, &m, 2);
        }
    }
}

/* A copy whose dequantized values are |d*q| + |m| (see the bound above). */
static void abs_weights(enum cm_type t, const uint8_t *src, uint8_t *dst, int64_t nblocks, size_t bs) {
    memcpy(dst, src, (size_t)nblocks * bs);
    if (!has_min(t)) return;
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = dst + (size_t)b * bs + scale_offset(t);
        blk[1] &= 0x7f;                                                                  /* d >= 0 */
        if (t == CM_TYPE_Q4_K || t == CM_TYPE_Q5_K || t == CM_TYPE_Q2_K) blk[3] |= 0x80; /* d*sc*q - dmin*m */
        else blk[3] &= 0x7f;                                                             /* value = d*q + m */
    }
}

/* Dequantize activations of type t (the vec_dot types) without relying on
 * the table having to_float for them. */
static void deq_act(enum cm_type t, const void *p, float *y, int64_t n) {
    if (t == CM_TYPE_Q8_0 || t == CM_TYPE_Q8_1) {
        size_t bs = cm_row_size(t, 32);
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = (const uint8_t *)p + (size_t)b * bs;
            cm_f16 d;
            memcpy(&d, blk, 2);
            const int8_t *q = (const int8_t *)(blk + (t == CM_TYPE_Q8_0 ? 2 : 4));
            for (int j = 0; j < 32; j++) y[b * 32 + j] = cm_f16_to_f32(d) * q[j];
        }
    } else if (t == CM_TYPE_Q8_K) {
        const cm_block_q8_k *x = p;
        for (int64_t b = 0; b < n / 256; b++)
            for (int j = 0; j < 256; j++) y[b * 256 + j] = x[b].d * x[b].qs[j];
    } else if (t == CM_TYPE_F16) {
        for (int64_t i = 0; i < n; i++) y[i] = cm_f16_to_f32(((const cm_f16 *)p)[i]);
    } else if (t == CM_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) y[i] = cm_bf16_to_f32(((const cm_bf16 *)p)[i]);
    } else {
        memcpy(y, p, (size_t)n * 4);
    }
}

static double dot_bound(enum cm_type t, int64_t n, double S) {
    const cm_type_traits *tr = cm_type_traits_of(t);
    double L = tr->quantized ? (double)(n / 16 + 16) : (double)(n + 16);
    double u = 1.0 / 16777216.0;
    return 2.0 * (L * u / (1.0 - L * u)) * S + 1e-30;
}

/* Make one weight row of type t and n elements into wq (mode: 0..3 floats
 * through the reference quantizer, 4 raw random bytes with sane scales). */
static bool make_weights(const cm_kernels *ref, enum cm_type t, int64_t n, int mode, uint8_t *wq) {
    const cm_type_traits *tr = cm_type_traits_of(t);
    size_t rs = cm_row_size(t, n);
    /* The grid types have no quantizer: always random blocks. */
    const bool no_quantizer = t == CM_TYPE_IQ2_XXS || t == CM_TYPE_IQ3_XXS || t == CM_TYPE_IQ1_S;
    if ((mode == 4 || no_quantizer) && tr->quantized) {
        for (size_t i = 0; i < rs; i++) wq[i] = (uint8_t)rnd();
        fix_scales(t, wq, n / tr->block_size, tr->type_size);
        return true;
    }
    fill_floats(g_w, n, mode & 3);
    if (tr->quantized) return cm_quantize_rows(t, g_w, wq, 1, n) == rs;
    if (!ref->from_float[t]) return false;
    ref->from_float[t](g_w, wq, n);
    return true;
}

/* Every (type, n, data mode) of one ISA's vec_dot against the reference. */
static void check_vec_dot(const cm_kernels *k) {
    const cm_kernels *ref = cm_kernels_ref();
    static const int64_t nq[] = {32, 64, 96, 288, 1024, 4096 + 96};
    static const int64_t nk[] = {256, 512, 768, 4096};
    static const int64_t nf[] = {1, 7, 16, 33, 64, 100, 1000, 4099};
    int checked = 0, exact = 0;
    double worst = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const enum cm_type t = k_types[ti];
        const cm_type_traits *tr = cm_type_traits_of(t);
        if (!k->vec_dot[t] || k->vec_dot[t] == ref->vec_dot[t]) continue;
        CHECKF(ref->vec_dot[t] != NULL, "%s: no reference vec_dot", tr->name);
        if (!ref->vec_dot[t]) continue;
        const enum cm_type at = tr->vec_dot_type;
        const int64_t *ns = tr->block_size == 256 ? nk : tr->block_size == 32 ? nq : nf;
        const int nn = tr->block_size == 256 ? 4 : tr->block_size == 32 ? 6 : 8;
        for (int ni = 0; ni < nn; ni++) {
            const int64_t n = ns[ni];
            for (int mode = 0; mode < 5; mode++) {
                if (!make_weights(ref, t, n, mode, g_wq)) {
                    CHECKF(0, "%s: cannot make weights n=%lld", tr->name, (long long)n);
                    continue;
                }
                fill_floats(g_a, n, (mode + 1) % 4);
                ref->from_float[at](g_a, g_aq, n);
                float r = 0, s = 0;
                ref->vec_dot[t](n, &r, g_wq, g_aq);
                k->vec_dot[t](n, &s, g_wq, g_aq);
                /* S from the dequantized |weights| and |activations| */
                abs_weights(t, g_wq, g_wabs, n / tr->block_size, tr->type_size);
                ref->to_float[t](g_wabs, g_w, n);
                deq_act(at, g_aq, g_tmp, n);
                double S = 0;
                for (int64_t i = 0; i < n; i++) S += fabs((double)g_w[i]) * fabs((double)g_tmp[i]);
                const double err = fabs((double)s - (double)r), bound = dot_bound(t, n, S);
                checked++;
                exact += s == r;
                if (S > 0 && err / bound > worst) worst = err / bound;
                CHECKF(err <= bound && s == s, "%s %s n=%lld mode=%d: simd %.9g ref %.9g err %.3g bound %.3g", k->name,
                       tr->name, (long long)n, mode, s, r, err, bound);
            }
        }
    }
    printf("# %s vec_dot: %d cases, %d bit-exact, worst err = %.3f of bound\n", k->name, checked, exact, worst);
}

/* from_float: byte-identical to the reference, on all the regimes plus ties. */
static void check_from_float(const cm_kernels *k) {
    const cm_kernels *ref = cm_kernels_ref();
    static const enum cm_type ts[] = {CM_TYPE_Q8_0, CM_TYPE_Q8_1, CM_TYPE_Q8_K, CM_TYPE_F16, CM_TYPE_BF16, CM_TYPE_F32};
    int checked = 0;
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        const enum cm_type t = ts[ti];
        if (!k->from_float[t] || k->from_float[t] == ref->from_float[t]) continue;
        const int64_t n = 4096;
        const size_t rs = cm_row_size(t, n);
        for (int mode = 0; mode < 8; mode++) {
            fill_floats(g_f, n, mode & 3);
            if (mode == 4) /* exact ties: x*127/amax lands on k + 0.5 */
                for (int64_t i = 0; i < n; i++)
                    g_f[i] = (i % 32 == 0) ? 127.0f : (float)((int)(rnd() % 254) - 127) + 0.5f;
            if (mode == 5) /* the largest magnitude appears with both signs: the first one decides */
                for (int64_t i = 0; i < n; i++) g_f[i] = (i % 7 == 3) ? ((i / 7) % 2 ? 5.0f : -5.0f) : frand();
            if (mode == 6) /* subnormal halves, huge halves, values that round to f16 inf */
                for (int64_t i = 0; i < n; i++)
                    g_f[i] = frand() * ((i / 64) % 3 == 0 ? 1e-6f : (i / 64) % 3 == 1 ? 7e4f : 1.0f);
            if (mode == 7) /* one non-zero value per block, ties of the scale */
                for (int64_t i = 0; i < n; i++) g_f[i] = (i % 32 == 5) ? frand() * 10 : 0.0f;
            memset(g_aq, 0xa5, rs);
            memset(g_aq2, 0x5a, rs);
            ref->from_float[t](g_f, g_aq, n);
            k->from_float[t](g_f, g_aq2, n);
            size_t first = rs;
            for (size_t i = 0; i < rs; i++)
                if (g_aq[i] != g_aq2[i]) {
                    first = i;
                    break;
                }
            checked++;
            CHECKF(first == rs, "%s from_float %s mode %d: first differing byte %zu (ref %02x simd %02x)", k->name,
                   cm_type_name(t), mode, first, first < rs ? g_aq[first] : 0, first < rs ? g_aq2[first] : 0);
        }
        /* short rows: tails shorter than a vector */
        for (int64_t n2 = 1; n2 < 40 && !cm_type_traits_of(t)->quantized; n2 += 3) {
            fill_floats(g_f, n2, 0);
            memset(g_aq, 0, 256);
            memset(g_aq2, 0, 256);
            ref->from_float[t](g_f, g_aq, n2);
            k->from_float[t](g_f, g_aq2, n2);
            CHECKF(memcmp(g_aq, g_aq2, 256) == 0, "%s from_float %s n=%lld", k->name, cm_type_name(t), (long long)n2);
        }
    }
    printf("# %s from_float: %d rows compared byte for byte\n", k->name, checked);
}

/* gemm over a slice of rows and several token counts: equal to vec_dot per
 * (row, token), and within the bound of the reference. */
static void check_gemm(const cm_kernels *k) {
    const cm_kernels *ref = cm_kernels_ref();
    enum { R = 7, TOK = 21 };
    static float out[TOK * (R + 3)];
    static const int ntoks[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 21}; /* tiles, token-lane groups, partial groups */
    int checked = 0, exact = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const enum cm_type t = k_types[ti];
        const cm_type_traits *tr = cm_type_traits_of(t);
        if (!k->gemm[t] || !ref->vec_dot[t]) continue;
        const enum cm_type at = tr->vec_dot_type;
        const int64_t n = tr->block_size == 256  ? 512
                          : tr->block_size == 32 ? 416
                                                 : 100; /* 13 blocks: a group of 8 and a tail */
        const size_t wrs = cm_row_size(t, n), ars = cm_row_size(at, n);
        const size_t w_stride = wrs + tr->type_size, x_stride = ars + cm_type_traits_of(at)->type_size;
        CHECK(R * w_stride <= sizeof g_wq && TOK * x_stride <= sizeof g_aq);
        for (int r = 0; r < R; r++) make_weights(ref, t, n, r % 5, g_wq + r * w_stride);
        for (int j = 0; j < TOK; j++) {
            fill_floats(g_a, n, j % 4);
            ref->from_float[at](g_a, g_aq + j * x_stride, n);
        }
        for (size_t ni = 0; ni < sizeof ntoks / sizeof ntoks[0]; ni++) {
            const int n_tok = ntoks[ni];
            const int64_t r0 = n_tok % 3, r1 = R - (n_tok % 2), ldy = R + 3;
            for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) out[i] = -1234.5f;
            k->gemm[t](n, g_wq, w_stride, g_aq, x_stride, out, ldy, r0, r1, n_tok);
            for (int64_t j = 0; j < n_tok; j++)
                for (int64_t i = 0; i < ldy; i++) {
                    const float got = out[j * ldy + i];
                    if (i < r0 || i >= r1) {
                        CHECKF(got == -1234.5f, "%s gemm %s wrote outside rows [%lld,%lld)", k->name, tr->name,
                               (long long)r0, (long long)r1);
                        continue;
                    }
                    float v = 0, rv = 0;
                    k->vec_dot[t](n, &v, g_wq + i * w_stride, g_aq + j * x_stride);
                    ref->vec_dot[t](n, &rv, g_wq + i * w_stride, g_aq + j * x_stride);
                    abs_weights(t, g_wq + i * w_stride, g_wabs, n / tr->block_size, tr->type_size);
                    ref->to_float[t](g_wabs, g_w, n);
                    deq_act(at, g_aq + j * x_stride, g_tmp, n);
                    double S = 0;
                    for (int64_t e = 0; e < n; e++) S += fabs((double)g_w[e]) * fabs((double)g_tmp[e]);
                    checked++;
                    exact += got == v;
                    CHECKF(fabs((double)got - v) <= dot_bound(t, n, S),
                           "%s gemm %s row %lld tok %lld n_tok %d: %.9g vs vec_dot %.9g", k->name, tr->name,
                           (long long)i, (long long)j, n_tok, got, v);
                    CHECKF(fabs((double)got - rv) <= dot_bound(t, n, S), "%s gemm %s vs ref: %.9g vs %.9g", k->name,
                           tr->name, got, rv);
                }
        }
    }
    printf("# %s gemm: %d (row, token) results checked, %d bit-equal to vec_dot\n", k->name, checked, exact);
}

/* Attention's value kernel (attn_v, attn_*.c) against the reference: 64
 * rows of 96 elements (tails for 16-lane F32/F16) or 128 (block types).
 * Fused multiply-adds of weights <= 1 into sums < 64: measured 1.4e-6. */
static void check_attn_v(const cm_kernels *k) {
    static const enum cm_type kt[] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0};
    float x[64 * 128], w[64], a0[128], a1[128];
    static uint8_t rows[64 * 128 * 4];
    for (int i = 0; i < 64 * 128; i++)
        x[i] = (float)((g_rng = g_rng * 6364136223846793005ull + 1) >> 40) / 16777216.0f * 2 - 1;
    for (int j = 0; j < 64; j++) w[j] = (float)(j % 7) / 7.0f;
    for (size_t ti = 0; ti < sizeof kt / sizeof kt[0]; ti++) {
        const int D = kt[ti] == CM_TYPE_Q8_0 ? 128 : 96;
        const size_t row = cm_row_size(kt[ti], D);
        for (int j = 0; j < 64; j++) {
            if (kt[ti] == CM_TYPE_F32) memcpy(rows + row * j, x + j * D, (size_t)D * 4);
            else cm_quantize_rows(kt[ti], x + j * D, rows + row * j, 1, D);
        }
        CHECKF(k->attn_v[kt[ti]] && k->attn_v[kt[ti]] != cm_kernels_ref()->attn_v[kt[ti]],
               "%s has no SIMD attn_v for %s", k->name, cm_type_name(kt[ti]));
        if (!k->attn_v[kt[ti]]) continue;
        for (int i = 0; i < D; i++) a0[i] = a1[i] = (float)i / D;
        cm_kernels_ref()->attn_v[kt[ti]](D, rows, row, w, 64, a0);
        k->attn_v[kt[ti]](D, rows, row, w, 64, a1);
        double e = 0;
        for (int i = 0; i < D; i++) e = fmax(e, fabs(a0[i] - a1[i]));
        CHECKF(e < 5e-6, "%s attn_v %s: max error %.3g vs the reference", k->name, cm_type_name(kt[ti]), e);
    }
}

/* The multi-query decode ops (attn_qk, attn_vm, attn_exp; model/attn_split.c)
 * against the reference table, for every KV type (queries rounded through
 * K's vec_dot_type, as kernels.h says): nq = 1..5 queries (a
 * group of four and a remainder), D = 64 and 128, n = 64 rows and 37 (a
 * partial group of positions at the end). qk: each score within
 * 2 gamma_{D+32} sum |q||k| (the block types' d * q roundings included);
 * vm: each element within 2 gamma_{n+2} (|acc| + sum |w||v|); exp: within
 * 4 ulps of expf where that is normal, below 1e-37 where it is not. */
static void check_attn_split(const cm_kernels *k) {
    static const enum cm_type kt[] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0, CM_TYPE_Q4_0};
    const cm_kernels *ref = cm_kernels_ref();
    static float x[64 * 128], xd[64 * 128], q[5 * 128], w[5 * 64], s0[5 * 64], s1[5 * 64], a0[5 * 128], a1[5 * 128];
    static uint8_t rows[64 * 128 * 4];
    const double u = 1.0 / 16777216.0;
    int checked = 0;
    for (size_t ti = 0; ti < sizeof kt / sizeof kt[0]; ti++) {
        const enum cm_type t = kt[ti];
        CHECKF(k->attn_qk[t] && k->attn_qk[t] != ref->attn_qk[t] && k->attn_vm[t] && k->attn_vm[t] != ref->attn_vm[t],
               "%s has no SIMD attn_qk/attn_vm for %s", k->name, cm_type_name(t));
        if (!k->attn_qk[t] || !k->attn_vm[t]) continue;
        for (int D = 64; D <= 128; D += 64) {
            const size_t row = cm_row_size(t, D);
            for (int i = 0; i < 64 * D; i++)
                x[i] = (float)((g_rng = g_rng * 6364136223846793005ull + 1) >> 40) / 16777216.0f * 2 - 1;
            for (int j = 0; j < 64; j++) {
                if (t == CM_TYPE_F32) memcpy(rows + row * j, x + j * D, (size_t)D * 4);
                else cm_quantize_rows(t, x + j * D, rows + row * j, 1, D);
                ref->to_float[t](rows + row * j, xd + j * D, D);
            }
            for (int i = 0; i < 5 * D; i++) q[i] = 3 * x[(i * 7) % (64 * D)];
            if (t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0) { /* as attn_split.c rounds them (K's vec_dot_type) */
                static uint8_t qb[5 * 128 * 2];
                ref->from_float[CM_TYPE_Q8_0](q, qb, 5 * D);
                ref->to_float[CM_TYPE_Q8_0](qb, q, 5 * D);
            }
            for (int i = 0; i < 5 * 64; i++) w[i] = (float)(i % 11) / 11.0f;
            for (int nq = 1; nq <= 5; nq++)
                for (int n = 37; n <= 64; n += 27) {
                    ref->attn_qk[t](D, nq, q, rows, row, n, 0.125f, s0, 64);
                    k->attn_qk[t](D, nq, q, rows, row, n, 0.125f, s1, 64);
                    for (int h = 0; h < nq; h++)
                        for (int j = 0; j < n; j++) {
                            double S = 0;
                            for (int i = 0; i < D; i++) S += fabs((double)q[h * D + i] * xd[j * D + i]) * 0.125;
                            const double L = D + 32, bound = 2 * L * u / (1 - L * u) * S + 1e-30;
                            CHECKF(fabs((double)s0[h * 64 + j] - s1[h * 64 + j]) <= bound,
                                   "%s attn_qk %s D %d nq %d n %d: score (%d, %d) %.9g vs %.9g", k->name,
                                   cm_type_name(t), D, nq, n, h, j, s1[h * 64 + j], s0[h * 64 + j]);
                        }
                    for (int i = 0; i < nq * D; i++) a0[i] = a1[i] = (float)(i % D) / D;
                    ref->attn_vm[t](D, nq, rows, row, w, 64, n, a0);
                    k->attn_vm[t](D, nq, rows, row, w, 64, n, a1);
                    for (int h = 0; h < nq; h++)
                        for (int i = 0; i < D; i++) {
                            double S = fabs((double)(i % D) / D);
                            for (int j = 0; j < n; j++) S += fabs((double)w[h * 64 + j] * xd[j * D + i]);
                            const double L = n + 2, bound = 2 * L * u / (1 - L * u) * S;
                            CHECKF(fabs((double)a0[h * D + i] - a1[h * D + i]) <= bound,
                                   "%s attn_vm %s D %d nq %d n %d: (%d, %d) %.9g vs %.9g", k->name, cm_type_name(t), D,
                                   nq, n, h, i, a1[h * D + i], a0[h * D + i]);
                        }
                    checked++;
                }
        }
    }
    CHECKF(k->attn_exp && k->attn_exp != ref->attn_exp, "%s has no SIMD attn_exp", k->name);
    if (k->attn_exp) {
        for (int n = 1; n <= 67; n += 11) {
            for (int j = 0; j < n; j++) s0[j] = s1[j] = -(float)j * 1.7f - (float)n * 0.013f; /* down to -112 */
            const float sum0 = ref->attn_exp(n, s0, 0.25f), sum1 = k->attn_exp(n, s1, 0.25f);
            for (int j = 0; j < n; j++) {
                const double e = fabs((double)s0[j] - s1[j]);
                CHECKF(s0[j] >= 1.1754944e-38f ? e <= 4 * u * 2 * s0[j] : e < 1e-37,
                       "%s attn_exp n %d [%d]: %.9g vs expf %.9g", k->name, n, j, s1[j], s0[j]);
            }
            CHECKF(fabs((double)sum0 - sum1) <= (4 * u * 2 + (n + 2) * u * 2) * sum0,
                   "%s attn_exp n %d: sum %.9g vs %.9g", k->name, n, sum1, sum0);
        }
    }
    printf("# %s attn_qk/attn_vm: %d shapes checked against the reference\n", k->name, checked);
}

static void test_tables(void) {
    int n_isa = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) {
            printf("# %s: not available on this CPU/build\n", k_isas[i]);
            continue;
        }
        n_isa++;
        g_rng = 0x9e3779b97f4a7c15ull + i;
        check_vec_dot(k);
        check_from_float(k);
        check_gemm(k);
        check_attn_v(k);
        check_attn_split(k);
    }
    printf("# %d SIMD table(s) tested\n", n_isa);
}

/* Every SIMD table claims the types the task names (a kernel silently left
 * as the reference would pass the comparisons above without being tested). */
static void test_coverage(void) {
    /* CUMULO_EXPECT_ISA="neon" (tests/sh/neon.sh): these tables must exist, so
     * a dispatch that silently stopped picking them fails instead of skipping. */
    const char *expect = getenv("CUMULO_EXPECT_ISA");
    for (size_t i = 0; expect && i < sizeof k_isas / sizeof k_isas[0]; i++)
        if (strstr(expect, k_isas[i]))
            CHECKF(cm_kernels_for(k_isas[i]) != NULL, "expected table '%s' missing", k_isas[i]);
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) {
        const cm_kernels *k = cm_kernels_for(k_isas[i]);
        if (!k) continue;
        const cm_kernels *ref = cm_kernels_ref();
        for (int ti = 0; ti < N_TYPES; ti++) {
            const enum cm_type t = k_types[ti];
            CHECKF(k->vec_dot[t] && k->vec_dot[t] != ref->vec_dot[t], "%s has no SIMD vec_dot for %s", k->name,
                   cm_type_name(t));
            CHECKF(k->gemm[t] != NULL, "%s has no gemm for %s", k->name, cm_type_name(t));
        }
        static const enum cm_type ff[] = {CM_TYPE_Q8_0, CM_TYPE_Q8_1, CM_TYPE_Q8_K, CM_TYPE_F16};
        for (int j = 0; j < 4; j++)
            CHECKF(k->from_float[ff[j]] && k->from_float[ff[j]] != ref->from_float[ff[j]],
                   "%s has no SIMD from_float for %s", k->name, cm_type_name(ff[j]));
    }
}

int main(void) {
    RUN(test_coverage);
    RUN(test_tables);
    TEST_END();
}
