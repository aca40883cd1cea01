/*
 * attn_split.c: decode attention split over blocks of KV positions, so that
 * every thread has work however few KV heads a slice has and however long
 * the context is.
 *
 * The positions are cut at fixed multiples of CM_ATTN_BLOCK (never at a
 * thread's share): each (KV head, block) task computes, for the KV head's
 * query heads together, an online-softmax partial (the block's max M, its
 * sum S of e^(s - M) and the weighted sum of V rows), and the partials are
 * merged in block order. The bits therefore depend on the inputs and the
 * kernel table only, never on the number of threads (test_attn checks it).
 * The query heads of a KV head share each K and V row as it streams past
 * (kernels.h attn_qk / attn_vm), the costly part at 4k-32k positions.
 *
 * A transposed V (the default F32/F16 cache: element rows of n_ctx
 * positions, cm_attn_kv.v_tstride) is read the same way turned around: each
 * V element row's positions in a tile dotted with the queries' weights by
 * the same attn_qk kernel (the weights as its "queries", the element rows as
 * its "rows").
 *
 * Prefill past the split threshold (cm_attn_multi) runs the same blocks for
 * several tokens at once, bit for bit each token's decode: in a block, the
 * query heads of the tokens whose positions start at the same place share
 * each K/V tile, so K and V are read once per group of tokens instead of
 * once per (token, head). There the table's many-query kernels
 * (attn_qk_many, attn_vt_many) replace attn_qk where it has them: the same
 * bits with the positions (or V's elements) in the vector lanes, cheaper
 * when dozens of queries share a tile.
 *
 * Numerics: the query is rounded as K's vec_dot_type rounds it (F16, or Q8_0
 * for the quantized types, as ggml's flash attention converts Q), the dots
 * and the weighted V sum in F32, expf per the table. This never allocates;
 * the caller gives scratch (cm_attn_split_scratch_floats).
 */
#include "model.h"

#include <math.h>
#include <string.h>

enum { ROT_MAX_D = 1024 }; /* as attn.c: wider heads are stored unrotated */

/* A SIMD table without its own attn_qk keeps the per-head paths, whose dots
 * are that table's SIMD ones (every table has them now; a new ISA may not). */
bool cm_attn_split_ok(const cm_kernels *k, const cm_attn_kv *kv, int head_dim) {
    const cm_kernels *ref = cm_kernels_ref();
    if (kv->v_tstride && (kv->v_type != CM_TYPE_F32 && kv->v_type != CM_TYPE_F16)) return false;
    return head_dim % 16 == 0 && head_dim <= ROT_MAX_D && k->attn_qk[kv->k_type] && k->attn_vm[kv->v_type] &&
           k->attn_qk[kv->v_type] && k->attn_exp && (k == ref || k->attn_qk[kv->k_type] != ref->attn_qk[kv->k_type]);
}

size_t cm_attn_split_scratch_floats(int nq, int head_dim) {
    return (size_t)nq * (3 * (size_t)head_dim + 2 * CM_ATTN_BLOCK + 2) + 64; /* tiles up to a block (v_tile) */
}

/* Query r = (token r / rep, head r % rep) at q + (r / rep) * q_stride +
 * (r % rep) * D, rotated as K's rows are and rounded through K's
 * vec_dot_type, into qf (nq rows of D). */
static void prep_queries(const cm_kernels *k, const cm_attn_kv *kv, int D, int nq, int rep, const float *q,
                         size_t q_stride, float *qf) {
    const enum cm_type qt = cm_type_traits_of(kv->k_type)->vec_dot_type;
    uint8_t tmp[ROT_MAX_D * 4];
    for (int r = 0; r < nq; r++) {
        float *x = qf + (size_t)r * D;
        memcpy(x, q + (size_t)(r / rep) * q_stride + (size_t)(r % rep) * D, (size_t)D * sizeof(float));
        if (kv->rot_k) cm_fwht_rows(x, D, kv->rot_k);
        if (qt != CM_TYPE_F32) {
            k->from_float[qt](x, tmp, D);
            k->to_float[qt](tmp, x, D);
        }
    }
}

/* acc[r * D + i] += w[r * ld + j] V_{p0 + j}[i] for j in [0, n). V rows: the
 * table's attn_vm. A transposed V: attn_qk over V's element rows for the
 * first n16 positions (its widths are multiples of 16; tmp: nq (D + n16)
 * floats), then the last n % 16 in element order. */
static void v_acc(const cm_kernels *k, const cm_attn_kv *kv, int D, int nq, const float *w, int ld, int p0, int n,
                  float *acc, float *tmp, bool many) {
    if (many && kv->v_tstride && k->attn_vt_many[kv->v_type] && n <= CM_ATTN_MANY_MAXN) { /* the same bits */
        k->attn_vt_many[kv->v_type](D, nq, kv->v + (size_t)p0 * kv->v_row, kv->v_tstride, w, ld, n, acc);
        return;
    }
    if (!kv->v_tstride) {
        k->attn_vm[kv->v_type](D, nq, kv->v + (size_t)p0 * kv->v_row, kv->v_row, w, ld, n, acc);
        return;
    }
    const int n16 = n & ~15;
    if (n16) {
        const float *wq = w;
        if (ld != n16) { /* the weights as rows of n16 */
            float *wc = tmp + (size_t)nq * D;
            for (int r = 0; r < nq; r++) memcpy(wc + (size_t)r * n16, w + (size_t)r * ld, (size_t)n16 * sizeof(float));
            wq = wc;
        }
        k->attn_qk[kv->v_type](n16, nq, wq, kv->v + (size_t)p0 * kv->v_row, kv->v_tstride, D, 1.0f, tmp, D);
        for (size_t i = 0; i < (size_t)nq * D; i++) acc[i] += tmp[i];
    }
    const uint8_t *v = kv->v + (size_t)(p0 + n16) * kv->v_row;
    for (int i = 0; i < D; i++, v += kv->v_tstride)
        for (int j = 0; j < n - n16; j++) {
            const float x = kv->v_type == CM_TYPE_F16 ? cm_f16_to_f32(((const cm_f16 *)v)[j]) : ((const float *)v)[j];
            for (int r = 0; r < nq; r++) acc[(size_t)r * D + i] += w[(size_t)r * ld + n16 + j] * x;
        }
}

/* Positions per tile: CM_ATTN_TILE over V rows; a whole block over a
 * transposed V, whose element rows are then read 256 positions at a time
 * (64 at a time touched 64 pages per tile and ran slower than the per-head
 * two-pass, measured). */
static int v_tile(const cm_attn_kv *kv) { return kv->v_tstride ? CM_ATTN_BLOCK : CM_ATTN_TILE; }

/* The largest of s[j0:j1] (-inf if none). Four running maxima: the same
 * value as one in order (a max is the max in any order; of a +0 and a -0 it
 * may keep the other, and every use of M gives the same bits with either). */
static float row_max(const float *s, int j0, int j1) {
    float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
    int j = j0;
    for (; j + 4 <= j1; j += 4) {
        m0 = s[j] > m0 ? s[j] : m0;
        m1 = s[j + 1] > m1 ? s[j + 1] : m1;
        m2 = s[j + 2] > m2 ? s[j + 2] : m2;
        m3 = s[j + 3] > m3 ? s[j + 3] : m3;
    }
    for (; j < j1; j++) m0 = s[j] > m0 ? s[j] : m0;
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    return m2 > m0 ? m2 : m0;
}

/* The online softmax over tiles of v_tile positions from min(lo) to
 * max(hi), query r seeing [lo[r / rep], hi[r / rep]) (masked elsewhere: its
 * weights 0, its max and sum untouched): M, S and acc of every query. */
static void attend(const cm_kernels *k, const cm_attn_kv *kv, int D, int nq, int rep, const float *qf, const int *lo,
                   const int *hi, float scale, float *sc, float *acc, float *M, float *S, float *tmp, bool many) {
    many = many && D <= CM_ATTN_MANY_MAXD;
    const cm_attn_qk_fn qk = many && k->attn_qk_many[kv->k_type] ? k->attn_qk_many[kv->k_type] : k->attn_qk[kv->k_type];
    int pmin = lo[0], pmax = hi[0];
    for (int g = 1; g < nq / rep; g++) pmin = CM_MIN(pmin, lo[g]), pmax = CM_MAX(pmax, hi[g]);
    for (int r = 0; r < nq; r++) {
        M[r] = -INFINITY;
        S[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * D * sizeof(float));
    const int T = v_tile(kv);
    for (int t0 = pmin; t0 < pmax; t0 += T) {
        const int nt = CM_MIN(T, pmax - t0);
        qk(D, nq, qf, kv->k + (size_t)t0 * kv->k_row, kv->k_row, nt, scale, sc, T);
        for (int r = 0; r < nq; r++) {
            float *s = sc + (size_t)r * T, *a = acc + (size_t)r * D;
            const int j0 = CM_MAX(0, CM_MIN(nt, lo[r / rep] - t0)), j1 = CM_MAX(j0, CM_MIN(nt, hi[r / rep] - t0));
            const float mt = row_max(s, j0, j1);
            if (mt > M[r] && M[r] == -INFINITY) {
                M[r] = mt;          /* the first: acc and S are +0, as a rescale by e^-inf = 0 would leave them */
            } else if (mt > M[r]) { /* a new maximum: rescale what came before */
                const float ms = expf(M[r] - mt);
                for (int i = 0; i < D; i++) a[i] *= ms;
                S[r] *= ms;
                M[r] = mt;
            }
            if (j1 > j0) S[r] += k->attn_exp(j1 - j0, s + j0, M[r]);
            for (int j = 0; j < j0; j++) s[j] = 0.0f;
            for (int j = j1; j < nt; j++) s[j] = 0.0f;
        }
        v_acc(k, kv, D, nq, sc, T, t0, nt, acc, tmp, many);
    }
}

void cm_attn_split_block(const cm_kernels *k, const cm_attn_kv *kv, int D, int nq, const float *q, int p0, int p1,
                         float scale, float *scratch, float *part, size_t part_stride) {
    float *qf = scratch, *sc = qf + (size_t)nq * D, *acc = sc + (size_t)nq * v_tile(kv), *M = acc + (size_t)nq * D,
          *S = M + nq, *tmp = S + nq;
    prep_queries(k, kv, D, nq, nq, q, 0, qf);
    attend(k, kv, D, nq, nq, qf, &p0, &p1, scale, sc, acc, M, S, tmp, false);
    for (int r = 0; r < nq; r++) {
        float *pr = part + (size_t)r * part_stride;
        pr[0] = M[r];
        pr[1] = S[r];
        memcpy(pr + 2, acc + (size_t)r * D, (size_t)D * sizeof(float));
    }
}

size_t cm_attn_multi_scratch_floats(int nq, int head_dim) {
    return (size_t)nq * head_dim + cm_attn_split_scratch_floats(nq, head_dim);
}

/* Prefill: every token's queries go through the decode's blocks (the blocks
 * of [lo, hi) cut at multiples of CM_ATTN_BLOCK, each block's partial by
 * attend over tiles from the block's first position, the partials merged in
 * block order), so each query gets the bits of cm_attn_split_block + merge.
 * What is shared: in a block, the tokens whose clipped range starts at the
 * same position run through attend together (one K/V read for all their
 * query heads). Over V rows a token whose range ends earlier in the block is
 * masked there: its later scores are never its max nor in its exp's sum, its
 * weights are 0, and attn_vm's per-element fused sum in position order adds
 * exact zeros, so its tiles (which start where decode's start) give decode's
 * bits. A transposed V sums a tile's first n & ~15 positions per lane and
 * the rest in element order: there only tokens with the same n & ~15 share
 * (their lane sums see the same weights; in the element-order rest a
 * shorter range's zero weights are exact no-ops again). */
void cm_attn_multi(const cm_kernels *k, const cm_attn_kv *kv, int D, int ntok, int rep, const float *q, size_t q_stride,
                   const int *lo, const int *hi, float scale, const float *sinks, float *scratch, float *parts,
                   size_t part_stride, float *out, size_t out_stride) {
    const int nq = ntok * rep;
    float *qa = scratch, *qg = qa + (size_t)nq * D, *sc = qg + (size_t)nq * D, *acc = sc + (size_t)nq * v_tile(kv),
          *M = acc + (size_t)nq * D, *S = M + nq, *tmp = S + nq;
    prep_queries(k, kv, D, nq, rep, q, q_stride, qa);
    int bmin = lo[0] / CM_ATTN_BLOCK, bmax = (hi[0] - 1) / CM_ATTN_BLOCK;
    for (int g = 1; g < ntok; g++)
        bmin = CM_MIN(bmin, lo[g] / CM_ATTN_BLOCK), bmax = CM_MAX(bmax, (hi[g] - 1) / CM_ATTN_BLOCK);
    for (int b = bmin; b <= bmax; b++) {
        uint64_t done = 0; /* tokens of this block already computed (ntok <= CM_ATTN_MULTI_MAX) */
        for (int g = 0; g < ntok; g++) {
            const int p0 = CM_MAX(lo[g], b * CM_ATTN_BLOCK), p1 = CM_MIN(hi[g], (b + 1) * CM_ATTN_BLOCK);
            if ((done >> g & 1) || p0 >= p1) continue;
            int mem[CM_ATTN_MULTI_MAX], mlo[CM_ATTN_MULTI_MAX], mhi[CM_ATTN_MULTI_MAX], nm = 0;
            for (int u = g; u < ntok; u++) {
                const int u0 = CM_MAX(lo[u], b * CM_ATTN_BLOCK), u1 = CM_MIN(hi[u], (b + 1) * CM_ATTN_BLOCK);
                if ((done >> u & 1) || u0 >= u1 || u0 != p0 || (kv->v_tstride && ((u1 - u0) ^ (p1 - p0)) & ~15))
                    continue;
                done |= (uint64_t)1 << u;
                mem[nm] = u, mlo[nm] = u0, mhi[nm++] = u1;
            }
            const float *qm = qa + (size_t)g * rep * D;
            if (mem[nm - 1] - g != nm - 1) { /* not a run of tokens: gather their queries */
                for (int i = 0; i < nm; i++)
                    memcpy(qg + (size_t)i * rep * D, qa + (size_t)mem[i] * rep * D, (size_t)rep * D * sizeof(float));
                qm = qg;
            }
            attend(k, kv, D, nm * rep, rep, qm, mlo, mhi, scale, sc, acc, M, S, tmp, true);
            for (int i = 0; i < nm; i++)
                for (int h = 0; h < rep; h++) {
                    const int r = i * rep + h, u = mem[i];
                    float *pr = parts + (size_t)(u * rep + h) * part_stride +
                                (size_t)(b - lo[u] / CM_ATTN_BLOCK) * ((size_t)D + 2);
                    pr[0] = M[r];
                    pr[1] = S[r];
                    memcpy(pr + 2, acc + (size_t)r * D, (size_t)D * sizeof(float));
                }
        }
    }
    for (int r = 0; r < nq; r++) {
        const int g = r / rep, nb = (hi[g] - 1) / CM_ATTN_BLOCK + 1 - lo[g] / CM_ATTN_BLOCK;
        cm_attn_split_merge(parts + (size_t)r * part_stride, nb, D, sinks ? sinks[r % rep] : NAN, kv->rot_v,
                            out + (size_t)g * out_stride + (size_t)(r % rep) * D);
    }
}

void cm_attn_split_merge(const float *parts, int nb, int D, float sink, int rot_v, float *out) {
    float M = -INFINITY, S = 0.0f;
    for (int b = 0; b < nb; b++) M = parts[(size_t)b * (D + 2)] > M ? parts[(size_t)b * (D + 2)] : M;
    if (!isnan(sink) && sink > M) M = sink;
    for (int i = 0; i < D; i++) out[i] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const float *p = parts + (size_t)b * (D + 2);
        if (p[0] == -INFINITY) continue; /* an empty block */
        const float f = expf(p[0] - M);
        S += p[1] * f;
        for (int i = 0; i < D; i++) out[i] += p[2 + i] * f;
    }
    if (!isnan(sink)) S += expf(sink - M); /* a logit with no value: only the denominator grows */
    const float inv = S > 0.0f ? 1.0f / S : 0.0f;
    for (int i = 0; i < D; i++) out[i] *= inv;
    if (rot_v) cm_fwht_rows(out, D, rot_v); /* back from the values' rotation */
}
