/* test_attn_many.c: prefill's many-query attention kernels (kernels.h
 * attn_qk_many, attn_vt_many; kernels/attn_tile_*.c) give, bit for bit, what
 * the same table's decode kernels give (model/attn_split.c's batch
 * invariance rests on it):
 *   - attn_qk_many against attn_qk: F32 and F16 K rows, head sizes 16 to 256
 *     (a multiple of 16), 1-9 queries (groups of four and remainders), 1-300
 *     positions (partial groups of 16 at the end), rows further apart than
 *     a head;
 *   - attn_vt_many against attn_split.c's v_acc over a transposed V (attn_qk
 *     over V's element rows with the weights as queries, then acc += that,
 *     then the last n % 16 positions in order, unfused), with zero weights
 *     past each query's own end as prefill's masks make them;
 *   - attn_qk_many against attn_qk over Q8_0 K rows (the queries rounded
 *     through Q8_0 as attn_split.c rounds them; head sizes 32-256, those not
 *     a multiple of 64 taking the decode's float path), and attn_vm over Q8_0
 *     and Q4_0 V rows for 1-9 queries at once against each query alone (prefill
 *     passes up to 128 queries per call), and attn_qk over Q8_0 K rows for
 *     1-9 queries at once against each query alone over positions split in
 *     two (AVX2's int8 slots of queries and positions), near the reference;
 *   - the comparison can fail: the reference table's (plain-order) results
 *     differ from the SIMD table's in most cases. */
#include "test.h"

#include "base/base.h"
#include "kernels/kernels.h"

enum { NPOS = 300, DMAX = 256, QMAX = 9, LD = 320 };
static int n_skipped;

static uint64_t rng = 5;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* v_acc's transposed branch (attn_split.c), with the table's attn_qk. */
static void vt_ref(const cm_kernels *k, enum cm_type t, int D, int nq, const uint8_t *vt, size_t stride, const float *w,
                   int ld, int n, float *acc) {
    static float wc[QMAX * NPOS], tmp[QMAX * DMAX];
    const int n16 = n & ~15;
    const size_t es = t == CM_TYPE_F32 ? 4 : 2;
    if (n16) {
        for (int r = 0; r < nq; r++) memcpy(wc + (size_t)r * n16, w + (size_t)r * ld, (size_t)n16 * sizeof(float));
        k->attn_qk[t](n16, nq, wc, vt, stride, D, 1.0f, tmp, D);
        for (int i = 0; i < nq * D; i++) acc[i] += tmp[i];
    }
    for (int i = 0; i < D; i++)
        for (int j = n16; j < n; j++) {
            const uint8_t *p = vt + (size_t)i * stride + (size_t)j * es;
            const float x = t == CM_TYPE_F16 ? cm_f16_to_f32(*(const cm_f16 *)p) : *(const float *)p;
            for (int r = 0; r < nq; r++) {
                const float prod = w[(size_t)r * ld + j] * x;
                acc[(size_t)r * D + i] = acc[(size_t)r * D + i] + prod;
            }
        }
}

static void test_many_bits(void) {
    static const enum cm_type types[2] = {CM_TYPE_F32, CM_TYPE_F16};
    static const int dims[5] = {16, 64, 80, 128, 256}, ns[9] = {1, 15, 16, 17, 37, 64, 200, 255, 256};
    const cm_kernels *tables[3] = {cm_kernels_ref(), cm_kernels_for("avx2"), cm_kernels_for("avx512")};
    static float x[NPOS * DMAX], q[QMAX * DMAX], w[QMAX * LD], s0[QMAX * LD], s1[QMAX * LD];
    static float a0[QMAX * DMAX], a1[QMAX * DMAX], a2[QMAX * DMAX];
    static uint8_t rows[NPOS * (DMAX + 8) * 4], vt[DMAX * (NPOS + 8) * 4];
    long checked = 0, qk_differ = 0, vt_differ = 0, have = 0;
    for (int ti = 0; ti < 3; ti++) {
        const cm_kernels *k = tables[ti];
        if (!k) continue;
        for (int yi = 0; yi < 2; yi++) {
            const enum cm_type t = types[yi];
            if (!k->attn_qk_many[t] && !k->attn_vt_many[t]) continue;
            have++;
            CHECKF(k->attn_qk_many[t] && k->attn_vt_many[t], "%s: only one of the many-query ops for %s", k->name,
                   cm_type_name(t));
            const size_t es = t == CM_TYPE_F32 ? 4 : 2;
            for (int di = 0; di < 5; di++) {
                const int D = dims[di];
                if (D > CM_ATTN_MANY_MAXD) continue;
                const size_t row = (size_t)(D + 8) * es, stride = (size_t)(NPOS + 8) * es; /* gaps between rows */
                for (int i = 0; i < NPOS * D; i++) x[i] = frand();
                for (int p = 0; p < NPOS; p++)
                    for (int i = 0; i < D; i++) {
                        uint8_t *kd = rows + (size_t)p * row + (size_t)i * es, *vd = vt + (size_t)i * stride + p * es;
                        if (t == CM_TYPE_F32) memcpy(kd, &x[p * D + i], 4), memcpy(vd, &x[p * D + i], 4);
                        else {
                            const cm_f16 h = cm_f32_to_f16(x[p * D + i]);
                            memcpy(kd, &h, 2), memcpy(vd, &h, 2);
                        }
                    }
                for (int i = 0; i < QMAX * D; i++) { /* queries as attn_split.c rounds them for an F16 K */
                    q[i] = 3.0f * frand();
                    if (t == CM_TYPE_F16) q[i] = cm_f16_to_f32(cm_f32_to_f16(q[i]));
                }
                for (int ni = 0; ni < 9; ni++)
                    for (int nq = 1; nq <= QMAX; nq += 1 + (ni % 3)) {
                        const int n = ns[ni];
                        for (int i = 0; i < QMAX * LD; i++) s0[i] = s1[i] = -7.0f;
                        k->attn_qk[t](D, nq, q, rows, row, n, 0.125f, s0, LD);
                        k->attn_qk_many[t](D, nq, q, rows, row, n, 0.125f, s1, LD);
                        CHECKF(!memcmp(s0, s1, sizeof s0), "%s %s qk D %d nq %d n %d: bits differ from attn_qk",
                               k->name, cm_type_name(t), D, nq, n);
                        if (k != cm_kernels_ref()) {
                            cm_kernels_ref()->attn_qk[t](D, nq, q, rows, row, n, 0.125f, s0, LD);
                            qk_differ += memcmp(s0, s1, sizeof s0) != 0;
                        }
                        /* weights: softmax-like, zero past each query's own end (n - r, at least 1) */
                        for (int r = 0; r < nq; r++)
                            for (int j = 0; j < LD; j++)
                                w[r * LD + j] = j < CM_MAX(1, n - r) ? frand() * 0.5f + 0.5f : 0;
                        for (int i = 0; i < nq * D; i++) a0[i] = a1[i] = a2[i] = (i % 3) ? 0.0f : frand();
                        vt_ref(k, t, D, nq, vt, stride, w, LD, n, a0);
                        k->attn_vt_many[t](D, nq, vt, stride, w, LD, n, a1);
                        CHECKF(!memcmp(a0, a1, sizeof(float) * nq * D),
                               "%s %s vt D %d nq %d n %d: bits differ from v_acc", k->name, cm_type_name(t), D, nq, n);
                        if (k != cm_kernels_ref()) {
                            vt_ref(cm_kernels_ref(), t, D, nq, vt, stride, w, LD, n, a2);
                            vt_differ += memcmp(a0, a2, sizeof(float) * nq * D) != 0;
                        }
                        checked++;
                    }
            }
        }
    }
    if (getenv("CUMULO_TEST_VERBOSE"))
        fprintf(stderr, "  %ld shapes; the reference order differs in %ld (qk) and %ld (vt)\n", checked, qk_differ,
                vt_differ);
    if (!have) {
        printf("skip: n/a: no kernel table on this CPU has the many-query ops (AVX-512 only)\n");
        n_skipped++;
        return;
    }
    CHECK(checked >= 100);
    CHECKF(qk_differ * 2 > checked && vt_differ * 2 > checked, "qk %ld, vt %ld of %ld differ from plain order",
           qk_differ, vt_differ, checked);
}

/* Q8_0 rows: K's many-query scores bit for bit attn_qk's; V's sums for many
 * queries bit for bit each query's alone. */
static void test_many_q8_0(void) {
    static const int dims[6] = {32, 64, 96, 128, 192, 256}, ns[8] = {1, 15, 16, 17, 37, 64, 100, 256};
    const cm_kernels *tables[3] = {cm_kernels_ref(), cm_kernels_for("avx2"), cm_kernels_for("avx512")};
    static float x[NPOS * DMAX], q[QMAX * DMAX], w[QMAX * LD], s0[QMAX * LD], s1[QMAX * LD];
    static float a0[QMAX * DMAX], a1[QMAX * DMAX];
    static uint8_t rows[NPOS * (DMAX + 64)], rows4[NPOS * (DMAX + 64)], qq[DMAX * 2];
    const cm_type_traits *tq = cm_type_traits_of(CM_TYPE_Q8_0);
    long checked = 0, differ = 0, have = 0, vm_checked = 0, qk1_checked = 0;
    for (int ti = 0; ti < 3; ti++) {
        const cm_kernels *k = tables[ti];
        if (!k) continue;
        for (int di = 0; di < 6; di++) {
            const int D = dims[di];
            const size_t row = cm_row_size(CM_TYPE_Q8_0, D) + 2 * tq->type_size; /* gaps between rows */
            for (int i = 0; i < NPOS * D; i++) x[i] = frand() * (1 + (i / D) % 5);
            const size_t row4 = cm_row_size(CM_TYPE_Q4_0, D) + 18;
            for (int p = 0; p < NPOS; p++) {
                cm_quantize_rows(CM_TYPE_Q8_0, x + (size_t)p * D, rows + p * row, 1, D);
                cm_quantize_rows(CM_TYPE_Q4_0, x + (size_t)p * D, rows4 + p * row4, 1, D);
            }
            for (int i = 0; i < QMAX * D; i++) q[i] = 3.0f * frand();
            for (int r = 0; r < QMAX; r++) { /* as attn_split.c's prep_queries for a Q8_0 K */
                k->from_float[CM_TYPE_Q8_0](q + r * D, qq, D);
                k->to_float[CM_TYPE_Q8_0](qq, q + r * D, D);
            }
            for (int ni = 0; ni < 8; ni++)
                for (int nq = 1; nq <= QMAX; nq += 1 + (ni % 3)) {
                    const int n = ns[ni];
                    if (k->attn_qk_many[CM_TYPE_Q8_0]) {
                        have++;
                        for (int i = 0; i < QMAX * LD; i++) s0[i] = s1[i] = -7.0f;
                        k->attn_qk[CM_TYPE_Q8_0](D, nq, q, rows, row, n, 0.125f, s0, LD);
                        k->attn_qk_many[CM_TYPE_Q8_0](D, nq, q, rows, row, n, 0.125f, s1, LD);
                        CHECKF(!memcmp(s0, s1, sizeof s0), "%s q8_0 qk D %d nq %d n %d: bits differ from attn_qk",
                               k->name, D, nq, n);
                        cm_kernels_ref()->attn_qk[CM_TYPE_Q8_0](D, nq, q, rows, row, n, 0.125f, s0, LD);
                        differ += memcmp(s0, s1, sizeof s0) != 0;
                        checked++;
                    }
                    { /* attn_qk: nq queries at once bit for bit each alone, positions split at o
                       * (AVX2's int8 path groups queries and positions in slots), and near the
                       * reference table's scores */
                        const int o = n > 3 ? 3 : 0;
                        for (int i = 0; i < QMAX * LD; i++) s0[i] = s1[i] = -7.0f;
                        k->attn_qk[CM_TYPE_Q8_0](D, nq, q, rows, row, n, 0.125f, s1, LD);
                        for (int r = 0; r < nq; r++) {
                            if (o) k->attn_qk[CM_TYPE_Q8_0](D, 1, q + r * D, rows, row, o, 0.125f, s0 + r * LD, LD);
                            k->attn_qk[CM_TYPE_Q8_0](D, 1, q + r * D, rows + o * row, row, n - o, 0.125f,
                                                     s0 + r * LD + o, LD);
                        }
                        CHECKF(!memcmp(s0, s1, sizeof s0),
                               "%s q8_0 qk D %d nq %d n %d: many queries differ from each alone", k->name, D, nq, n);
                        cm_kernels_ref()->attn_qk[CM_TYPE_Q8_0](D, nq, q, rows, row, n, 0.125f, s0, LD);
                        float err = 0;
                        for (int i = 0; i < QMAX * LD; i++) err = fmaxf(err, fabsf(s0[i] - s1[i]) / (1 + fabsf(s0[i])));
                        CHECKF(err < 1e-4f, "%s q8_0 qk D %d nq %d n %d: %g from the reference", k->name, D, nq, n,
                               (double)err);
                        qk1_checked++;
                    }
                    /* V: weights zero past each query's own end, accumulators started non-zero */
                    for (int r = 0; r < nq; r++)
                        for (int j = 0; j < LD; j++) w[r * LD + j] = j < CM_MAX(1, n - r) ? frand() * 0.5f + 0.5f : 0;
                    for (int vi = 0; vi < 2; vi++) { /* Q8_0 and Q4_0 V rows */
                        const enum cm_type vt = vi ? CM_TYPE_Q4_0 : CM_TYPE_Q8_0;
                        const uint8_t *vr = vi ? rows4 : rows;
                        const size_t vrow = vi ? row4 : row;
                        for (int i = 0; i < nq * D; i++) a0[i] = a1[i] = (i % 3) ? 0.0f : frand();
                        k->attn_vm[vt](D, nq, vr, vrow, w, LD, n, a1);
                        for (int r = 0; r < nq; r++)
                            k->attn_vm[vt](D, 1, vr, vrow, w + r * LD, LD, n, a0 + (size_t)r * D);
                        CHECKF(!memcmp(a0, a1, sizeof(float) * nq * D),
                               "%s %s vm D %d nq %d n %d: many queries differ from each alone", k->name,
                               cm_type_name(vt), D, nq, n);
                        vm_checked++;
                    }
                }
        }
    }
    if (getenv("CUMULO_TEST_VERBOSE"))
        fprintf(stderr, "  q8_0: %ld qk shapes (the reference differs in %ld), %ld vm shapes\n", checked, differ,
                vm_checked);
    CHECK(vm_checked >= 100 && qk1_checked >= 100);
    if (!have) {
        printf("skip: n/a: no kernel table on this CPU has a Q8_0 many-query attn_qk (AVX-512 only)\n");
        n_skipped++;
        return;
    }
    CHECK(checked >= 100);
    CHECKF(differ * 2 > checked, "q8_0 qk: %ld of %ld differ from the reference table", differ, checked);
}

int main(void) {
    RUN(test_many_bits);
    RUN(test_many_q8_0);
    TEST_END_SKIPPED(n_skipped);
}
