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
 * Numerics: the query is rounded as K's vec_dot_type rounds it (F16, or Q8_0
 * for the quantized types, as ggml's flash attention converts Q), the dots
 * and the weighted V sum in F32, expf per the table. This never allocates;
 * the caller gives scratch (cm_attn_split_scratch_floats).
 */
#include "model.h"

#include <math.h>
#include <string.h>

enum { ROT_MAX_D = 1024 }; /* as attn.c: wider heads are stored unrotated */

/* A SIMD table without its own attn_qk (AVX2, NEON for now: NEEDSWORK)
 * keeps attn.c's per-head path, whose dots are that table's SIMD ones. */
bool cm_attn_split_ok(const cm_kernels *k, const cm_attn_kv *kv, int head_dim) {
    const cm_kernels *ref = cm_kernels_ref();
    return head_dim % 16 == 0 && head_dim <= ROT_MAX_D && k->attn_qk[kv->k_type] && k->attn_vm[kv->v_type] &&
           k->attn_exp && (k == ref || k->attn_qk[kv->k_type] != ref->attn_qk[kv->k_type]);
}

size_t cm_attn_split_scratch_floats(int nq, int head_dim) {
    return (size_t)nq * (2 * (size_t)head_dim + CM_ATTN_TILE + 2) + 16;
}

/* q (nq rows of D) rotated as K's rows are and rounded through K's
 * vec_dot_type, into qf. */
static void prep_queries(const cm_kernels *k, const cm_attn_kv *kv, int D, int nq, const float *q, float *qf) {
    const enum cm_type qt = cm_type_traits_of(kv->k_type)->vec_dot_type;
    uint8_t tmp[ROT_MAX_D * 4];
    for (int r = 0; r < nq; r++) {
        float *x = qf + (size_t)r * D;
        memcpy(x, q + (size_t)r * D, (size_t)D * sizeof(float));
        if (kv->rot_k) cm_fwht_rows(x, D, kv->rot_k);
        if (qt != CM_TYPE_F32) {
            k->from_float[qt](x, tmp, D);
            k->to_float[qt](tmp, x, D);
        }
    }
}

void cm_attn_split_block(const cm_kernels *k, const cm_attn_kv *kv, int D, int nq, const float *q, int p0, int p1,
                         float scale, float *scratch, float *part, size_t part_stride) {
    float *qf = scratch, *sc = qf + (size_t)nq * D, *acc = sc + (size_t)nq * CM_ATTN_TILE, *M = acc + (size_t)nq * D,
          *S = M + nq;
    prep_queries(k, kv, D, nq, q, qf);
    const cm_attn_qk_fn qk = k->attn_qk[kv->k_type];
    const cm_attn_vm_fn vm = k->attn_vm[kv->v_type];
    for (int r = 0; r < nq; r++) {
        M[r] = -INFINITY;
        S[r] = 0.0f;
    }
    memset(acc, 0, (size_t)nq * D * sizeof(float));
    for (int t0 = p0; t0 < p1; t0 += CM_ATTN_TILE) {
        const int nt = CM_MIN(CM_ATTN_TILE, p1 - t0);
        qk(D, nq, qf, kv->k + (size_t)t0 * kv->k_row, kv->k_row, nt, scale, sc, CM_ATTN_TILE);
        for (int r = 0; r < nq; r++) {
            float *s = sc + (size_t)r * CM_ATTN_TILE, *a = acc + (size_t)r * D;
            float mt = -INFINITY;
            for (int j = 0; j < nt; j++) mt = s[j] > mt ? s[j] : mt;
            if (mt > M[r]) { /* a new maximum: rescale what came before */
                const float ms = expf(M[r] - mt);
                for (int i = 0; i < D; i++) a[i] *= ms;
                S[r] *= ms;
                M[r] = mt;
            }
            S[r] += k->attn_exp(nt, s, M[r]);
        }
        vm(D, nq, kv->v + (size_t)t0 * kv->v_row, kv->v_row, sc, CM_ATTN_TILE, nt, acc);
    }
    for (int r = 0; r < nq; r++) {
        float *pr = part + (size_t)r * part_stride;
        pr[0] = M[r];
        pr[1] = S[r];
        memcpy(pr + 2, acc + (size_t)r * D, (size_t)D * sizeof(float));
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
