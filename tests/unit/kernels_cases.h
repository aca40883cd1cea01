/* kernels_cases.h: the seeded inputs shared by tools/kernels_oracle.c (which
 * records what llama.cpp's own ggml libraries compute on them) and
 * tests/unit/test_kernels_ggml.c (which checks our kernels against that
 * record). Both must generate the same floats, so the generator lives here,
 * with the tests' independent block decoder. */
#ifndef CM_KERNELS_CASES_H
#define CM_KERNELS_CASES_H

#include "base/base.h"
#include "kernels/ref.h"
#include "tensor/tensor.h"

#include <math.h>
#include <string.h>

#define KC_ROWS 8
#define KC_N 512 /* elements per row: a multiple of every block size */
#define KC_DISTS 7

/* Rows of KC_N floats for case (kind, type, dist): normal, uniform, normal
 * with 40x outliers, positive, blocks of zeros / constants, small, and
 * "ties": half-integers with 127 at every block start, so that scale 1 puts
 * every value on a rounding tie (ties-to-even vs away-from-zero shows). */
static inline void kc_fill(float *x, int kind, int type, int dist) {
    cm_rng r;
    cm_rng_seed(&r, 0x6b65726eULL * 1000003u + (uint64_t)kind * 10007u + (uint64_t)type * 101u + (uint64_t)dist);
    for (int i = 0; i < KC_ROWS * KC_N; i++) {
        float v = cm_rng_normal(&r);
        switch (dist) {
        case 1: v = 2 * cm_rng_uniform(&r) - 1; break;
        case 2: v = (cm_rng_next(&r) % 97 == 0) ? 40 * v : v; break;
        case 3: v = fabsf(v) + 0.5f; break;
        case 4: v = (i / 32) % 3 == 1 ? 0.0f : (i / 32) % 3 == 2 ? 0.25f : v; break;
        case 5: v *= 1e-2f; break;
        case 6: v = i % 32 == 0 ? 127.0f : (float)((int)(cm_rng_next(&r) % 254) - 127) + 0.5f; break;
        default: break;
        }
        x[i] = v;
    }
}

static inline uint64_t kc_fnv(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Weight types the record covers (quantizers and dot products) and
 * activation types (converters). */
static const enum cm_type kc_weight_types[] = {CM_TYPE_F32,  CM_TYPE_F16,    CM_TYPE_BF16,   CM_TYPE_Q4_0,
                                               CM_TYPE_Q4_1, CM_TYPE_Q5_0,   CM_TYPE_Q5_1,   CM_TYPE_Q8_0,
                                               CM_TYPE_Q4_K, CM_TYPE_Q5_K,   CM_TYPE_Q6_K,   CM_TYPE_Q2_K,
                                               CM_TYPE_Q3_K, CM_TYPE_IQ4_NL, CM_TYPE_IQ4_XS, CM_TYPE_MXFP4};
#define KC_N_WEIGHT_TYPES ((int)(sizeof kc_weight_types / sizeof kc_weight_types[0]))
/* Types recorded on random blocks only (R and E lines): ggml quantizes to
 * them only with an importance matrix, and we have no quantizer. */
static const enum cm_type kc_block_types[] = {CM_TYPE_IQ2_XXS, CM_TYPE_IQ3_XXS, CM_TYPE_IQ1_S};
#define KC_N_BLOCK_TYPES ((int)(sizeof kc_block_types / sizeof kc_block_types[0]))
#define KC_N_ACT_TYPES 5

/* KC_ROWS rows of random blocks of quantized type t (case R of the record):
 * random bytes, then every scale field overwritten with a sane value (random
 * bytes there could be inf or NaN halves). Exercises every bit pattern of
 * levels and sub-block scales, which quantizer outputs do not. */
static inline void kc_fill_blocks(uint8_t *p, int type, const cm_type_traits *tr) {
    cm_rng r;
    cm_rng_seed(&r, 0x626c6b73ULL * 1000003u + (uint64_t)type * 101u);
    const size_t nb = (size_t)KC_ROWS * KC_N / (size_t)tr->block_size;
    for (size_t i = 0; i < nb * tr->type_size; i++) p[i] = (uint8_t)cm_rng_next(&r);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *q = p + b * tr->type_size;
        const cm_f16 s1 = cm_f32_to_f16(0.01f * cm_rng_normal(&r)), s2 = cm_f32_to_f16(0.02f * cm_rng_normal(&r));
        switch (type) {
        case CM_TYPE_Q4_0:
        case CM_TYPE_Q5_0:
        case CM_TYPE_Q8_0:
        case CM_TYPE_IQ4_NL:
        case CM_TYPE_IQ4_XS:
        case CM_TYPE_IQ2_XXS:
        case CM_TYPE_IQ3_XXS:
        case CM_TYPE_IQ1_S: cm_wr_u16(q, s1); break;
        case CM_TYPE_Q4_1:
        case CM_TYPE_Q5_1:
        case CM_TYPE_Q4_K:
        case CM_TYPE_Q5_K:
            cm_wr_u16(q, s1);
            cm_wr_u16(q + 2, s2);
            break;
        case CM_TYPE_Q6_K: cm_wr_u16(q + 208, s1); break;
        case CM_TYPE_Q2_K:
            cm_wr_u16(q + 80, s1);
            cm_wr_u16(q + 82, s2);
            break;
        case CM_TYPE_Q3_K: cm_wr_u16(q + 108, s1); break;
        case CM_TYPE_MXFP4: q[0] = (uint8_t)(b % 8 == 0 ? b / 8 % 3 : 100 + cm_rng_next(&r) % 60); break;
        default: break;
        }
    }
}
static const enum cm_type kc_act_types[] = {CM_TYPE_F16, CM_TYPE_BF16, CM_TYPE_Q8_0, CM_TYPE_Q8_1, CM_TYPE_Q8_K};

/* ---- an independent decoder, from the GGUF layouts ----
 * decode(t, block bytes, i, &mag) returns element i of one block and, in
 * mag, the sum of the magnitudes of the float terms that make it up (what
 * its float rounding error is relative to). */
static inline float h2f(const uint8_t *p) { return cm_f16_to_f32(cm_rd_u16(p)); }
static inline int nib(const uint8_t *qs, int i, int half) { /* element i of a 2-nibble packing */
    return i < half ? (qs[i] & 15) : (qs[i - half] >> 4);
}
static inline int bit(const uint8_t *p, int k) { return (p[k / 8] >> (k % 8)) & 1; }
/* 6-bit scale (which=0) or min (which=1) of sub-block s of a Q4_K/Q5_K block:
 * 12 bytes hold 8 pairs; s<4: low 6 bits of byte s (scale) / s+4 (min);
 * s>=4: low/high nibble of byte s+4, top 2 bits from bits 6-7 of byte s-4
 * (scale) / s (min). */
static inline int k_sm(const uint8_t *sc, int s, int which) {
    if (s < 4) return sc[s + 4 * which] & 63;
    const int low = which ? sc[s + 4] >> 4 : sc[s + 4] & 15;
    const int top = sc[which ? s : s - 4] >> 6;
    return low | (top << 4);
}

static inline float decode(enum cm_type t, const uint8_t *b, int i, double *mag) {
    float d, m, v;
    int q;
    switch (t) {
    case CM_TYPE_Q4_0: /* f16 d | 16 B nibbles: elem i<16 low nibble of byte i, else high of i-16 */
        d = h2f(b);
        q = nib(b + 2, i, 16) - 8;
        v = q * d;
        *mag = fabs(v);
        return v;
    case CM_TYPE_Q4_1: /* f16 d | f16 m | 16 B nibbles */
        d = h2f(b);
        m = h2f(b + 2);
        q = nib(b + 4, i, 16);
        *mag = fabs((double)q * d) + fabs(m);
        return q * d + m;
    case CM_TYPE_Q5_0: /* f16 d | u32 qh (bit i = 5th bit of elem i) | 16 B nibbles */
        d = h2f(b);
        q = (nib(b + 6, i, 16) | (bit(b + 2, i) << 4)) - 16;
        v = q * d;
        *mag = fabs(v);
        return v;
    case CM_TYPE_Q5_1:
        d = h2f(b);
        m = h2f(b + 2);
        q = nib(b + 8, i, 16) | (bit(b + 4, i) << 4);
        *mag = fabs((double)q * d) + fabs(m);
        return q * d + m;
    case CM_TYPE_Q8_0:
        d = h2f(b);
        v = (int8_t)b[2 + i] * d;
        *mag = fabs(v);
        return v;
    case CM_TYPE_Q8_1:
        d = h2f(b);
        v = (int8_t)b[4 + i] * d;
        *mag = fabs(v);
        return v;
    case CM_TYPE_Q4_K:   /* f16 d | f16 dmin | 12 B scales | 128 B: 64-elem chunks, low then high nibbles */
    case CM_TYPE_Q5_K: { /* same, then 32 B qh (bit s of byte l: 5th bit of elem 32s+l) before qs */
        const int s = i / 32, c = i / 64, l = i % 32;
        const uint8_t *qs = b + (t == CM_TYPE_Q4_K ? 16 : 48);
        q = (s & 1) ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 15;
        if (t == CM_TYPE_Q5_K) q |= ((b[16 + l] >> s) & 1) << 4;
        const float dd = h2f(b) * k_sm(b + 4, s, 0), mm = h2f(b + 2) * k_sm(b + 4, s, 1);
        *mag = fabs((double)dd * q) + fabs(mm);
        return dd * q - mm;
    }
    case CM_TYPE_Q6_K: { /* 128 B ql | 64 B qh | 16 x int8 scale | f16 d; halves of 128 elems */
        const int h = i / 128, r = i % 128, k = r / 32, l = r % 32;
        const int lo = (b[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
        const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        q = (lo | (hi << 4)) - 32;
        v = h2f(b + 208) * (int8_t)b[192 + i / 16] * q;
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_Q2_K: { /* 16 B scales (lo: scale, hi: min) | 64 B 2-bit | f16 d | f16 dmin */
        const int h = i / 128, r = i % 128, k = r / 32, l = r % 32;
        q = (b[16 + 32 * h + l] >> (2 * k)) & 3;
        const uint8_t sc = b[i / 16];
        const float dd = h2f(b + 80) * (sc & 15), mm = h2f(b + 82) * (sc >> 4);
        *mag = fabs((double)dd * q) + fabs(mm);
        return dd * q - mm;
    }
    case CM_TYPE_Q3_K: { /* 32 B hmask | 64 B 2-bit | 12 B scales | f16 d */
        const int h = i / 128, r = i % 128, k = r / 32, l = r % 32, s = i / 16;
        q = ((b[32 + 32 * h + l] >> (2 * k)) & 3) - (bit(b + l, i / 32) ? 0 : 4);
        const int lo4 = (b[96 + s % 8] >> (4 * (s / 8))) & 15, hi2 = (b[96 + 8 + s % 4] >> (2 * (s / 4))) & 3;
        v = h2f(b + 108) * ((lo4 | (hi2 << 4)) - 32) * q;
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_IQ4_NL: { /* f16 d | 16 B nibbles, indices into ggml's kvalues_iq4nl */
        static const int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        v = h2f(b) * kv[nib(b + 2, i, 16)];
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_IQ4_XS: { /* f16 d | u16 scales_h | 4 B scales_l | 128 B: 32-elem sub-blocks of 16 B nibbles */
        static const int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const int s = i / 32;
        const int ls = ((b[4 + s / 2] >> (4 * (s & 1))) & 15) | (((cm_rd_u16(b + 2) >> (2 * s)) & 3) << 4);
        v = h2f(b) * (ls - 32) * kv[nib(b + 8 + 16 * s, i % 32, 16)];
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_MXFP4: { /* E8M0 e | 16 B nibbles of E2M1 (sign, 2-bit exp, 1-bit mantissa) */
        const int c = nib(b + 1, i, 16), e2 = (c >> 1) & 3, m1 = c & 1;
        const double mag1 = e2 ? ldexp(1.0 + 0.5 * m1, e2 - 1) : 0.5 * m1; /* E2M1, bias 1 */
        v = (float)((c & 8 ? -mag1 : mag1) * ldexp(1.0, (int)b[0] - 127));
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_IQ2_XXS:   /* f16 d | per 32 elems: 4 grid bytes, u32 (4 x 7 sign bits, 4-bit scale) */
    case CM_TYPE_IQ3_XXS: { /* f16 d | 64 grid bytes (4 elems each) | 8 x u32 (signs, scale) */
        const int s = i / 32, l = (i % 32) / 8, j = i % 8;
        const bool x2 = t == CM_TYPE_IQ2_XXS;
        const uint32_t aux = cm_rd_u32(x2 ? b + 2 + 8 * s + 4 : b + 2 + 64 + 4 * s);
        const unsigned s7 = (aux >> (7 * l)) & 127;
        int par = 0;
        for (int k = 0; k < 7; k++) par ^= (s7 >> k) & 1;
        const int neg = j < 7 ? (int)((s7 >> j) & 1) : par; /* 8th sign: the parity of the 7 */
        int g;
        if (x2) g = (int)((cm_iq2xxs_grid[b[2 + 8 * s + l]] >> (8 * j)) & 255);
        else g = (int)((cm_iq3xxs_grid[b[2 + 8 * s + 2 * l + j / 4]] >> (8 * (j % 4))) & 255);
        v = (float)(h2f(b) * (0.5 + (aux >> 28)) * (x2 ? 0.25 : 0.5) * g * (neg ? -1 : 1));
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_IQ1_S: { /* f16 d | 32 B low index bytes | 8 x u16 (3-bit index highs x4, scale, delta sign) */
        const int s = i / 32, l = (i % 32) / 8, j = i % 8;
        const int qh = cm_rd_u16(b + 34 + 2 * s);
        const int g = (int8_t)((cm_iq1s_grid[b[2 + 4 * s + l] | (((qh >> (3 * l)) & 7) << 8)] >> (8 * j)) & 255);
        const double dl = h2f(b) * (2 * ((qh >> 12) & 7) + 1), delta = qh & 0x8000 ? -0.125 : 0.125;
        v = (float)(dl * (g + delta));
        *mag = fabs(dl * g) + fabs(dl * delta);
        return v;
    }
    case CM_TYPE_Q8_K: { /* f32 d | 256 x int8 | 16 x i16 bsums */
        float df;
        memcpy(&df, b, 4);
        v = df * (int8_t)b[4 + i];
        *mag = fabs(v);
        return v;
    }
    case CM_TYPE_F32:
        memcpy(&v, b + 4 * i, 4);
        *mag = fabs(v);
        return v;
    case CM_TYPE_F16:
        v = h2f(b + 2 * i);
        *mag = fabs(v);
        return v;
    case CM_TYPE_BF16:
        v = cm_bf16_to_f32(cm_rd_u16(b + 2 * i));
        *mag = fabs(v);
        return v;
    default: *mag = NAN; return NAN; /* not a type we decode */
    }
}

static inline void decode_row(enum cm_type t, const void *row, int64_t n, float *y, double *mag) {
    const cm_type_traits *tr = cm_type_traits_of(t);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *blk = (const uint8_t *)row + (size_t)(i / tr->block_size) * tr->type_size;
        double mg = 0;
        y[i] = decode(t, blk, (int)(i % tr->block_size), &mg);
        if (mag) mag[i] = mg;
    }
}

#endif
