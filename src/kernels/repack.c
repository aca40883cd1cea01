/*
 * repack.c: weights rewritten once at load into layouts made for a table's
 * decode gemv, kept beside the file's bytes, and found again by address.
 *
 * The file's bytes stay where they are and stay the spec: every other
 * consumer (vec_dot, the prefill gemm, get_rows, column views of tensor
 * parallelism, other tables, the cluster's weight transfer) keeps reading
 * them. A repacked copy only replaces the operand of a gemv that reads the
 * whole row width (cm_matmul_rows, n_tok == 1), and every such gemv returns
 * vec_dot's bits for every row (kernels.h), so results never depend on
 * whether a tensor was repacked, which table runs, or how rows are split.
 *
 * Layout "q4_0 lanes" (same size as the row it
 * replaces, row stride unchanged): each group of 16 blocks, 288 bytes, is
 *   [16 fp16 d][4 x 64 bytes: vector q, lane j (4 bytes) = block j's qs[4q..4q+3]]
 * so one 64-byte load feeds vpdpbusd 16 blocks at once with int32 lane j =
 * block j: no shuffles, no gathered scales, one sequential stream per row.
 * The nb % 16 last blocks of a row stay as they are.
 *
 * Layout "q4_k lanes" (same size and stride): each group of 4 super-blocks,
 * 576 bytes, is
 *   [4 fp16 d][4 fp16 dmin][scales bytes 0-3 of blocks 0..3][bytes 4-7 ..]
 *   [bytes 8-11 ..][4 x 128 bytes: block j's qs]
 * so the 6-bit scales and mins of 4 blocks unpack with one set of 128-bit
 * operations (block j in dword j) and the 8 fp16 with one conversion; the
 * nb % 4 last super-blocks stay as they are. Layout "q5_k lanes" is the
 * same with the 4 blocks' qh (4 x 32 bytes) between the scales and the qs
 * (704 bytes per group).
 *
 * Layouts "q4_k pairs" and "q5_k pairs" (the avx2 table's own, selected by
 * its cm_kernels.repack; same size and stride): "q4_k lanes" / "q5_k lanes"
 * with each super-block's 256 values reordered so that one load, a mask and
 * a shift give the two vectors of a 64-value chunk that the avx2 gemv feeds
 * to two maddubs and one madd (avx2_krepack.h): chunk c's A holds in byte
 * 4l + e value 64c + 32 (e / 2) + 4l + e % 2, its B the value two on
 * (kp_block). q4_k: chunk c's 32 bytes are A | B << 4. q5_k: its 32 bytes U
 * are A (5 bits) | (B & 7) << 5, and the 32 bytes where "q5_k lanes" keeps
 * qh hold B >> 3 of chunk c in bits 2c, 2c + 1 (V). The nb % 4 last
 * super-blocks keep the file's block layout with their quants so reordered.
 *
 * Layout "q6_k lanes" (the avx512 table's q6_k; same size and stride; each super-block on its own,
 * as a cm_block_q6_k whose bytes mean): the 256 values in the order of
 * gemm_kq6_avx512.c's operands (position 64v + 4L + e = element 16 s(L) +
 * 4v + e, s(L) = 4 (L % 4) + L / 4): ql[m] = positions m | 64 + m (low |
 * high nibble), ql[64 + m] = 128 + m | 192 + m, qh[m] = the top 2 bits of
 * positions m, 64 + m, 128 + m, 192 + m (bits 0-1, 2-3, 4-5, 6-7);
 * scales[L] = scale s(L); d unchanged. Unpacking is a few shifts and masks
 * and four vpdpbusd give each sub-block's sum in one lane.
 *
 * Layout "q6_k pairs" (the avx2 table's q6_k; same size and stride; each
 * super-block on its own): v[0..8) the 6-bit values of groups of 32
 * elements 2p and 2p + 1 paired by 16-bit units (v[2p + u] byte 4j + e =
 * element 32 (2p + e / 2) + 4j + 2u + e % 2: avx2_q6k.h's a6g_pair), stored
 * as bytes 0-191: [v0 | v3 bits 0-1 << 6][v1 | v3 bits 2-3 << 6][v2 | v3
 * bits 4-5 << 6], the same for v4..v7; bytes 192-207 the scales 0, 2, .., 14
 * then 1, 3, .., 15; d unchanged at 208. A value is one mask (or three
 * shifts and masks for every fourth vector), a pair's scales one shuffle.
 *
 * Layout "q8_0 lanes" (the avx2 table's q8_0; same size and stride): each
 * group of 8 blocks, 272 bytes, is
 *   [8 fp16 d][8 x 32 bytes: vector q, lane j (4 bytes) = block j's qs[4q..4q+3]]
 * so 8 maddubs / madd pairs give the 8 blocks' sums in the 8 lanes with
 * plain adds (lane_avx2.c's gemv_p8_0); the nb % 8 last blocks of a row stay
 * as they are. Rows of 8 blocks to CM_REPACK_MAX_K_Q8_0 elements.
 *
 * Layout "f16 pairs" (rows rounded up to even, row stride unchanged: the
 * copy of row pair q, rows 2q and 2q + 1, is the 2 row sizes at row 2q):
 *   [chain 0: k / 16 steps of (row 2q's 8 elements, row 2q + 1's)]
 *   [chain 1: the same][row 2q's k % 16 tail elements][row 2q + 1's]
 * where chain 0's step m holds elements 16m..16m+7, chain 1's 16m+8..16m+15
 * (tile_f16's two chains), so the AVX2 table's prompt gemm (avx2_gemv.h's
 * gemm_pf16) walks a pair and a chain as one sequence, as its per-call
 * panels did, and the decode gemv reads a pair's rows at once. An odd last
 * row pairs with zeros. The pairs count from the tensor's (or added view's)
 * first row, so a row view starting at an odd row finds no copy (it reads
 * the file's bytes); a row slice [r0, r1) of a call may start or end
 * mid-pair.
 *
 * A view of a tensor may be repacked on its own (tensor parallelism's
 * column slices: columns [c0, c1) of every row): its copy holds only those
 * columns, rows packed at their own row size (cstride), and is found by the
 * view's address, width and row stride.
 *
 * One copy resident: where a table's gemv and gemm both read a type's
 * repacked layout (gemv_packed and gemm_packed; gemm_packed serves any
 * number of tokens, same bits), the file's pages under a whole tensor's
 * copy are given back to the OS (cm_repack_give_back: a file read into
 * memory becomes a mapping of the same bytes there, faulted in only if
 * something else reads them: a column view, another table, the cluster's
 * weight transfer) and cm_matmul_rows reads the copy for every n_tok
 * (cm_repack_find_alone). Every table's repacked types have such a gemm
 * (q4_0 on avx512 and avx2, q4_k / q5_k / q6_k / q8_0 / f16 on avx2, q5_k / q6_k on avx512:
 * avx512_kpacked.h); a table repacks a type only where its decode gemv
 * gains by it (the avx512 table's q4_k gemv ran as fast over the file's
 * bytes: not repacked there, gemm_kq4_avx512.c).
 *
 * The registry is process-wide: a sorted array of {owner, base, stride,
 * ne0, rows, type, copy, cstride}, under a rwlock (writers: loads and releases;
 * readers: every matmul). Copies come from cm_huge_alloc, one per owner
 * call. Never used from the token loop except cm_repack_find (no malloc).
 */
#include "kernels.h"

#include "base/base.h"
#include "os/os.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct rp_entry {
    const void *owner;
    const char *base; /* the file's bytes of the tensor (row 0) */
    size_t stride;    /* bytes per row (nb[1]) */
    int64_t ne0, rows;
    enum cm_type type;
    const char *copy; /* the repacked rows */
    size_t cstride;   /* the copy's bytes per row: the row size of ne0 elements */
    void *alloc;      /* the owner's allocation (set on its first entry only) */
    size_t alloc_n;
    bool alone; /* the file's bytes were given back: the copy serves every n_tok (cm_repack_give_back) */
} rp_entry;

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static rp_entry *g_e;
static int g_n, g_cap;

/* Does the table consume a repacked layout for type t, and may we use it? */
static bool rp_wanted(const cm_kernels *k, const cm_tensor *W) {
    if (!k || (unsigned)W->type >= CM_TYPE_COUNT || !k->gemv_packed[W->type] || !W->data) return false;
    if (W->n_dims < 2 || W->ne[1] < 1) return false;
    if (W->type == CM_TYPE_Q4_0) return W->ne[0] >= 16 * CM_QK4_0 && W->ne[0] <= CM_REPACK_MAX_K;
    if (W->type == CM_TYPE_Q4_K || W->type == CM_TYPE_Q5_K)
        return W->ne[0] >= 4 * CM_QK_K && W->ne[0] <= CM_REPACK_MAX_K;
    if (W->type == CM_TYPE_Q6_K) return W->ne[0] >= CM_QK_K && W->ne[0] <= CM_REPACK_MAX_K;
    if (W->type == CM_TYPE_F16) return W->ne[0] >= 16 && W->ne[0] <= CM_REPACK_MAX_K;
    if (W->type == CM_TYPE_Q8_0) return W->ne[0] >= 8 * CM_QK8_0 && W->ne[0] <= CM_REPACK_MAX_K_Q8_0;
    return false;
}

/* Rows a copy holds (pairs: rounded up to even) and its bytes (64-aligned). */
static int64_t rp_rows(enum cm_type t, int64_t rows) { return t == CM_TYPE_F16 ? (rows + 1) & ~(int64_t)1 : rows; }
static size_t rp_bytes(const cm_tensor *W) {
    return ((size_t)rp_rows(W->type, W->ne[1]) * cm_row_size(W->type, W->ne[0]) + 63) & ~(size_t)63;
}

void cm_repack_f16_pair(const void *a, const void *b, void *dst, int64_t k) {
    const cm_f16 *r[2] = {a, b};
    cm_f16 *d = dst;
    const int64_t kf = k & ~(int64_t)15, kt = k - kf;
    for (int h = 0; h < 2; h++)
        for (int64_t m = 0; m < kf / 16; m++)
            for (int i = 0; i < 2; i++) {
                cm_f16 *o = d + h * kf + 16 * m + 8 * i;
                if (r[i]) memcpy(o, r[i] + 16 * m + 8 * h, 8 * sizeof *o);
                else memset(o, 0, 8 * sizeof *o);
            }
    for (int i = 0; i < 2; i++) {
        cm_f16 *o = d + 2 * kf + i * kt;
        if (r[i]) memcpy(o, r[i] + kf, (size_t)kt * sizeof *o);
        else memset(o, 0, (size_t)kt * sizeof *o);
    }
}

/* "q4_0 lanes" and "q8_0 lanes": per group of G blocks (bs bytes each: an
 * fp16 d, then nq 4-byte words of quants) the G d, then word q of the G
 * blocks side by side for each q; the nb % G last blocks as they are. */
static void lanes_by_word(const uint8_t *x, uint8_t *d, int64_t nb, int G, size_t bs, int nq) {
    int64_t g = 0;
    for (; g + G <= nb; g += G, d += (size_t)G * bs) {
        for (int j = 0; j < G; j++) memcpy(d + 2 * j, x + (size_t)(g + j) * bs, 2);
        for (int q = 0; q < nq; q++)
            for (int j = 0; j < G; j++) memcpy(d + 2 * G + 4 * G * q + 4 * j, x + (size_t)(g + j) * bs + 2 + 4 * q, 4);
    }
    memcpy(d, x + (size_t)g * bs, (size_t)(nb - g) * bs);
}

_Static_assert(offsetof(cm_block_q4_0, d) == 0 && offsetof(cm_block_q4_0, qs) == 2 && offsetof(cm_block_q8_0, d) == 0 &&
                   offsetof(cm_block_q8_0, qs) == 2,
               "lanes_by_word's block: d, then the quants");

void cm_repack_q4_0_lanes(const void *src, void *dst, int64_t nb) {
    lanes_by_word(src, dst, nb, 16, sizeof(cm_block_q4_0), CM_QK4_0 / 8);
}

void cm_repack_q8_0_lanes(const void *src, void *dst, int64_t nb) {
    lanes_by_word(src, dst, nb, 8, sizeof(cm_block_q8_0), CM_QK8_0 / 4);
}

/* The first 64 bytes of a "q4_k lanes" or "q5_k lanes" group, which the two
 * layouts share: block j's d and dmin, and its 12 scale bytes as three
 * 4-byte words (word q of the 4 blocks together). */
static void k_lanes_head(uint8_t *grp, int j, cm_f16 d, cm_f16 dmin, const uint8_t *scales) {
    memcpy(grp + 2 * j, &d, 2);
    memcpy(grp + 8 + 2 * j, &dmin, 2);
    for (int q = 0; q < 3; q++) memcpy(grp + 16 + 16 * q + 4 * j, scales + 4 * q, 4);
}

void cm_repack_q4_k_lanes(const void *src, void *dst, int64_t nb) {
    const cm_block_q4_k *x = src;
    uint8_t *d = dst;
    int64_t g = 0;
    for (; g + 4 <= nb; g += 4, d += 4 * sizeof(cm_block_q4_k)) {
        for (int j = 0; j < 4; j++) {
            k_lanes_head(d, j, x[g + j].d, x[g + j].dmin, x[g + j].scales);
            memcpy(d + 64 + 128 * j, x[g + j].qs, 128);
        }
    }
    memcpy(d, x + g, (size_t)(nb - g) * sizeof *x);
}

void cm_repack_q5_k_lanes(const void *src, void *dst, int64_t nb) {
    const cm_block_q5_k *x = src;
    uint8_t *d = dst;
    int64_t g = 0;
    for (; g + 4 <= nb; g += 4, d += 4 * sizeof(cm_block_q5_k)) {
        for (int j = 0; j < 4; j++) {
            k_lanes_head(d, j, x[g + j].d, x[g + j].dmin, x[g + j].scales);
            memcpy(d + 64 + 32 * j, x[g + j].qh, 32);
            memcpy(d + 192 + 128 * j, x[g + j].qs, 128);
        }
    }
    memcpy(d, x + g, (size_t)(nb - g) * sizeof *x);
}

/* A q6_k super-block's 6-bit values in element order (ggml's dequantize_row_q6_K). */
static void q6_values(const cm_block_q6_k *x, uint8_t q[256]) {
    for (int c = 0; c < 2; c++) {
        const uint8_t *ql = x->ql + 64 * c, *qh = x->qh + 32 * c;
        for (int l = 0; l < 32; l++) {
            q[128 * c + l] = (uint8_t)((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4);
            q[128 * c + l + 32] = (uint8_t)((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4);
            q[128 * c + l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
            q[128 * c + l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
        }
    }
}

/* ---- "q4_k pairs" / "q5_k pairs" (the avx2 table's: cm_kernels.repack) ----
 * v[64c + i]: value i of a super-block's 64-value chunk c (ggml's order:
 * qs[32c + i % 32]'s low nibble for i < 32, high for i >= 32, q5_k's fifth
 * bit from qh[i % 32] bit 2c + i / 32). The chunk's two 32-byte vectors A
 * (h = 0) and B (h = 1): byte 4l + e is value 32 (e / 2) + 4l + 2h + e % 2,
 * so A's word 2l / 2l + 1 hold values 4l, 4l + 1 / 32 + 4l, 33 + 4l and B's
 * the next two of each dword (avx2_krepack.h). */

/* One super-block's quants in pair order: q4_k's 128 bytes (qh NULL), byte
 * 32c + n = A | B << 4; q5_k's U (qs, 128 bytes: byte 32c + n = A | (B & 7)
 * << 5) and V (oqh, 32 bytes: bits 2c, 2c + 1 of byte n = B >> 3 of chunk c).
 * Byte n's A is value 32s + j of chunk c, its B value 32s + j + 2, with
 * j = 4 (n / 4) + n % 2 and s = n / 2 % 2: the s-th nibble of the chunk's
 * qs bytes j and j + 2 (q5_k: plus bit 2c + s of qh bytes j and j + 2). */
static void kp_block(const uint8_t *qs, const uint8_t *qh, uint8_t *oqs, uint8_t *oqh) {
    uint8_t hb[32] = {0};
    for (int n = 0; n < 32; n++) {
        const int j = 4 * (n / 4) + n % 2, s = n / 2 % 2;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = qs + 32 * c;
            int a = q[j] >> 4 * s & 15, b = q[j + 2] >> 4 * s & 15;
            if (!qh) {
                oqs[32 * c + n] = (uint8_t)(a | b << 4);
                continue;
            }
            a |= (qh[j] >> (2 * c + s) & 1) << 4;
            b |= (qh[j + 2] >> (2 * c + s) & 1) << 4;
            oqs[32 * c + n] = (uint8_t)(a | (b & 7) << 5);
            hb[n] |= (uint8_t)((b >> 3) << (2 * c));
        }
    }
    if (oqh) memcpy(oqh, hb, 32);
}

/* A row of "lanes" (done by the caller) put into pair order: each
 * super-block's quants where the lanes layout keeps them (group j: qs at
 * 64 + 32 * n_qh + 128j, q5_k's qh at 64 + 32j; the tail: the block's). */
static void kp_row(const void *src, void *dst, int64_t nb, bool q5) {
    const size_t bs = q5 ? sizeof(cm_block_q5_k) : sizeof(cm_block_q4_k);
    const size_t oqs = q5 ? offsetof(cm_block_q5_k, qs) : offsetof(cm_block_q4_k, qs),
                 oqh = offsetof(cm_block_q5_k, qh);
    const uint8_t *x = src;
    uint8_t *d = dst;
    const int64_t ng = nb / 4 * 4;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *g = d + (size_t)(b / 4) * 4 * bs, *t = d + (size_t)b * bs; /* b's group, or b itself past ng */
        kp_block(x + (size_t)b * bs + oqs, q5 ? x + (size_t)b * bs + oqh : NULL,
                 b < ng ? g + 64 + (q5 ? 128 : 0) + 128 * (b % 4) : t + oqs,
                 !q5      ? NULL
                 : b < ng ? g + 64 + 32 * (b % 4)
                          : t + oqh);
    }
}

void cm_repack_q4_k_pairs(const void *src, void *dst, int64_t nb) {
    cm_repack_q4_k_lanes(src, dst, nb);
    kp_row(src, dst, nb, false);
}

void cm_repack_q5_k_pairs(const void *src, void *dst, int64_t nb) {
    cm_repack_q5_k_lanes(src, dst, nb);
    kp_row(src, dst, nb, true);
}

void cm_repack_q6_k_lanes(const void *src, void *dst, int64_t nb) {
    const cm_block_q6_k *x = src;
    cm_block_q6_k *o = dst;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t q[256];
        q6_values(&x[b], q);
        uint8_t p[256]; /* position 64v + 4L + e: element 16 s(L) + 4v + e, s(L) = 4 (L % 4) + L / 4 */
        for (int v = 0; v < 4; v++)
            for (int L = 0; L < 16; L++)
                for (int e = 0; e < 4; e++) p[64 * v + 4 * L + e] = q[16 * (4 * (L % 4) + L / 4) + 4 * v + e];
        cm_block_q6_k r;
        for (int m = 0; m < 64; m++) {
            r.ql[m] = (uint8_t)((p[m] & 0xf) | (p[64 + m] & 0xf) << 4);
            r.ql[64 + m] = (uint8_t)((p[128 + m] & 0xf) | (p[192 + m] & 0xf) << 4);
            r.qh[m] = (uint8_t)((p[m] >> 4) | (p[64 + m] >> 4) << 2 | (p[128 + m] >> 4) << 4 | (p[192 + m] >> 4) << 6);
        }
        for (int L = 0; L < 16; L++) r.scales[L] = x[b].scales[4 * (L % 4) + L / 4];
        r.d = x[b].d;
        memcpy(&o[b], &r, sizeof r);
    }
}

void cm_repack_q6_k_pairs(const void *src, void *dst, int64_t nb) {
    const cm_block_q6_k *x = src;
    uint8_t *o = dst;
    for (int64_t b = 0; b < nb; b++, o += sizeof *x) {
        uint8_t q[256], v[8][32];
        q6_values(&x[b], q);
        for (int g = 0; g < 8; g++) /* groups 2p, 2p + 1 paired by 16-bit units */
            for (int j = 0; j < 8; j++)
                for (int u = 0; u < 2; u++)
                    memcpy(&v[(g & ~1) | u][4 * j + 2 * (g & 1)], &q[32 * g + 4 * j + 2 * u], 2);
        for (int h = 0; h < 2; h++) /* 8 bytes at a time: the shifted bits are masked within each byte */
            for (int i = 0; i < 3; i++)
                for (int m = 0; m < 32; m += 8) {
                    uint64_t a, c;
                    memcpy(&a, &v[4 * h + i][m], 8);
                    memcpy(&c, &v[4 * h + 3][m], 8);
                    a |= (c >> 2 * i & 0x0303030303030303ull) << 6;
                    memcpy(o + 96 * h + 32 * i + m, &a, 8);
                }
        for (int i = 0; i < 8; i++) {
            o[192 + i] = (uint8_t)x[b].scales[2 * i];
            o[200 + i] = (uint8_t)x[b].scales[2 * i + 1];
        }
        memcpy(o + 208, &x[b].d, 2);
    }
}

void cm_repack_row(enum cm_type t, const void *src, void *dst, int64_t ne0) {
    if (t == CM_TYPE_Q4_0) cm_repack_q4_0_lanes(src, dst, ne0 / CM_QK4_0);
    else if (t == CM_TYPE_Q4_K) cm_repack_q4_k_lanes(src, dst, ne0 / CM_QK_K);
    else if (t == CM_TYPE_Q5_K) cm_repack_q5_k_lanes(src, dst, ne0 / CM_QK_K);
    else if (t == CM_TYPE_Q6_K) cm_repack_q6_k_lanes(src, dst, ne0 / CM_QK_K);
    else CM_ASSERT(!"no repacked layout for this type");
}

void cm_repack_row_for(const cm_kernels *k, enum cm_type t, const void *src, void *dst, int64_t ne0) {
    if (k && (unsigned)t < CM_TYPE_COUNT && k->repack[t])
        k->repack[t](src, dst, ne0 / cm_type_traits_of(t)->block_size);
    else cm_repack_row(t, src, dst, ne0);
}

static bool repack_off(void) { return cm_config_get()->repack_off; }

size_t cm_repack_size(const cm_kernels *k, const cm_tensor *W) {
    if (repack_off() || !rp_wanted(k, W)) return 0;
    return rp_bytes(W);
}

size_t cm_repack_bytes(const void *owner) {
    size_t n = 0;
    pthread_rwlock_rdlock(&g_lock);
    for (int i = 0; i < g_n; i++)
        if (g_e[i].owner == owner) n += g_e[i].alloc_n;
    pthread_rwlock_unlock(&g_lock);
    return n;
}

/* Filling the copies of one cm_repack_add call: rows (f16: row pairs) of
 * each wanted tensor split over the threads, in the order the entries take
 * (each tensor's copy at the next rp_bytes). Pure data movement: the same
 * bytes whichever thread writes a row. */
typedef struct rp_fill {
    const cm_kernels *k;
    const cm_tensor *const *ws;
    int n;
    char *mem;
} rp_fill;

static void rp_fill_run(void *ctx, int ith, int nth) {
    const rp_fill *f = ctx;
    size_t off = 0;
    for (int i = 0; i < f->n; i++) {
        const cm_tensor *W = f->ws[i];
        if (!rp_wanted(f->k, W)) continue;
        const size_t cs = cm_row_size(W->type, W->ne[0]);
        const char *src = W->data;
        char *dst = f->mem + off;
        const bool pairs = W->type == CM_TYPE_F16;
        int64_t u0, u1;
        cm_split_range(pairs ? (W->ne[1] + 1) / 2 : W->ne[1], ith, nth, &u0, &u1);
        for (int64_t u = u0; u < u1; u++) {
            if (pairs) {
                const int64_t r = 2 * u;
                cm_repack_f16_pair(src + (size_t)r * W->nb[1],
                                   r + 1 < W->ne[1] ? src + (size_t)(r + 1) * W->nb[1] : NULL, dst + (size_t)r * cs,
                                   W->ne[0]);
            } else cm_repack_row_for(f->k, W->type, src + (size_t)u * W->nb[1], dst + (size_t)u * cs, W->ne[0]);
        }
        off += rp_bytes(W);
    }
}

/* Threads for a call repacking total bytes: every CPU (up to 16) from
 * RP_THREADED_MIN on (a 1B model's layer is ~30 MB; the scalar reorders cost
 * ~2 ns a byte on one Zen 1 core, ~4 before kp_block's direct formula: a 7B
 * Q4_K_M model's ~4 GB are ~8 s of load on one core), one below (the
 * threads' start would cost more). */
enum { RP_THREADED_MIN = 4 << 20, RP_THREADS_MAX = 16 };

int cm_repack_add(const void *owner, const cm_kernels *k, const cm_tensor *const *ws, int n, char *err, size_t errlen) {
    if (repack_off()) return 0;
    size_t total = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        total += cm_repack_size(k, ws[i]);
        m += rp_wanted(k, ws[i]);
    }
    if (m == 0) return 0;
    char *mem = cm_huge_alloc(total);
    if (!mem) return cm_errf(err, errlen, CM_ENOMEM, "out of memory repacking %zu bytes of weights", total);
    /* the copies are made before the registry's lock is taken: nothing can
     * find them yet, and matmuls elsewhere (a model already serving) never
     * wait on a load */
    rp_fill fill = {.k = k, .ws = ws, .n = n, .mem = mem};
    int nth = total >= RP_THREADED_MIN ? cm_cpu_count() : 1;
    if (nth > RP_THREADS_MAX) nth = RP_THREADS_MAX;
    cm_pool *pool = nth > 1 ? cm_pool_new(nth) : NULL;
    int used = 1; /* the threads the pool got (it may start fewer) */
    if (pool) {
        used = cm_pool_size(pool);
        cm_pool_run(pool, rp_fill_run, &fill);
        cm_pool_free(pool);
    } else rp_fill_run(&fill, 0, 1);
    pthread_rwlock_wrlock(&g_lock);
    if (g_n + m > g_cap) {
        int cap = g_cap ? g_cap : 64;
        while (cap < g_n + m) cap *= 2;
        rp_entry *e = cm_realloc(g_e, (size_t)cap * sizeof *e);
        if (!e) {
            pthread_rwlock_unlock(&g_lock);
            cm_huge_free(mem, total);
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        }
        g_e = e, g_cap = cap;
    }
    size_t off = 0;
    bool first = true;
    for (int i = 0; i < n; i++) {
        const cm_tensor *W = ws[i];
        if (!rp_wanted(k, W)) continue;
        rp_entry e = {.owner = owner,
                      .base = W->data,
                      .stride = W->nb[1],
                      .ne0 = W->ne[0],
                      .rows = W->ne[1],
                      .type = W->type,
                      .copy = mem + off,
                      .cstride = cm_row_size(W->type, W->ne[0]),
                      .alloc = first ? mem : NULL,
                      .alloc_n = first ? total : 0};
        first = false;
        off += rp_bytes(W);
        int at = g_n; /* keep sorted by base */
        while (at > 0 && g_e[at - 1].base > e.base) at--;
        memmove(g_e + at + 1, g_e + at, (size_t)(g_n - at) * sizeof *g_e);
        g_e[at] = e;
        __atomic_store_n(&g_n, g_n + 1, __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&g_lock);
    CM_LOGD("repack: %d tensors, %zu bytes, for %p, on %d threads", m, total, owner, used);
    return 0;
}

void cm_repack_drop(const void *owner) {
    if (!owner) return;
    pthread_rwlock_wrlock(&g_lock);
    int j = 0, n = 0;
    size_t bytes = 0;
    for (int i = 0; i < g_n; i++) {
        if (g_e[i].owner == owner) {
            if (g_e[i].alloc) cm_huge_free(g_e[i].alloc, g_e[i].alloc_n);
            bytes += g_e[i].alloc_n;
            n++;
            continue;
        }
        g_e[j++] = g_e[i];
    }
    __atomic_store_n(&g_n, j, __ATOMIC_RELEASE);
    if (g_n == 0) {
        cm_free(g_e);
        g_e = NULL;
        g_cap = 0;
    }
    pthread_rwlock_unlock(&g_lock);
    if (n) CM_LOGD("repack: dropped %d tensors, %zu bytes, for %p", n, bytes, owner);
}

size_t cm_repack_give_back(const void *owner, const cm_kernels *k, const cm_mapped_file *f) {
    size_t n = 0;
    pthread_rwlock_wrlock(&g_lock);
    for (int i = 0; i < g_n; i++) {
        rp_entry *e = &g_e[i];
        if (e->owner != owner || e->alone || !k->gemm_packed[e->type]) continue;
        if (e->stride != e->cstride) continue; /* a view: the file's rows are wider */
        const size_t b = cm_file_give_back(f, e->base, (size_t)e->rows * e->stride);
        e->alone = b > 0;
        n += b;
    }
    pthread_rwlock_unlock(&g_lock);
    if (n) CM_LOGD("repack: gave back %zu bytes of the file's pages for %p (the copies serve them)", n, owner);
    return n;
}

static const void *find(const cm_tensor *W, size_t *stride, bool alone) {
    if (__atomic_load_n(&g_n, __ATOMIC_ACQUIRE) == 0) return NULL; /* nothing repacked: skip the lock */
    const char *p = W->data;
    const void *hit = NULL;
    pthread_rwlock_rdlock(&g_lock);
    int lo = 0, hi = g_n; /* last entry with base <= p */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (g_e[mid].base <= p) lo = mid + 1;
        else hi = mid;
    }
    for (int i = lo - 1; i >= 0 && i >= lo - 4; i--) { /* duplicates (one file, two owners) sit together */
        const rp_entry *e = &g_e[i];
        if (p >= e->base + (size_t)e->rows * e->stride) continue;
        const size_t o = (size_t)(p - e->base);
        if (o % e->stride || W->type != e->type || W->ne[0] != e->ne0 || W->nb[1] != e->stride) continue;
        if ((int64_t)(o / e->stride) + W->ne[1] > e->rows) continue;
        if (e->type == CM_TYPE_F16 && o / e->stride % 2) continue; /* mid-pair ("f16 pairs") */
        if (alone && !e->alone) continue;
        hit = e->copy + o / e->stride * e->cstride;
        if (stride) *stride = e->cstride;
        break;
    }
    pthread_rwlock_unlock(&g_lock);
    return hit;
}

const void *cm_repack_find(const cm_tensor *W, size_t *stride) { return find(W, stride, false); }

const void *cm_repack_find_alone(const cm_tensor *W, size_t *stride) { return find(W, stride, true); }
