/* test_attn_multi.c: prefill attention over several tokens at once
 * (model/attn_split.c, cm_attn_multi) gives, for every query row, exactly the
 * bits of the decode path: cm_attn_split_block over the query's blocks of
 * CM_ATTN_BLOCK positions, merged in block order by cm_attn_split_merge.
 * That is the batch-invariance contract of kernels.h: a prompt chunked into
 * decode steps gives the logprobs of the same prompt evaluated alone.
 *   - every kernel table (scalar, AVX2 and AVX-512 where the CPU has them),
 *     KV types F32, F16, Q8_0, Q4_0 over rows (rotated as the cache rotates
 *     them) and F32, F16 transposed; head sizes 64, 128 (and 80 for the
 *     float types); 1-8 tokens of 1-8 query heads each; consecutive
 *     positions (a prompt's chunk), windows and scattered ends, lengths that
 *     are not multiples of the block or the tile, with and without sinks;
 *   - the comparison can fail: one online softmax over the whole range (the
 *     old multi-query tiles' order) and the blocks merged in reverse order
 *     both change bits in these cases. */
#include "test.h"

#include "base/base.h"
#include "kernels/kernels.h"
#include "model/model.h"

enum { NPOS = 1400, DMAX = 128, TMAX = 8, RMAX = 8, NBMAX = NPOS / CM_ATTN_BLOCK + 2 };

static uint64_t rng = 77;
static uint32_t urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static float frand(void) { return (float)(urand() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

/* The cache: NPOS random rows of D elements of type t (rotated by rot) at
 * rows; for a transposed V (es > 0) its element rows of NPOS positions. */
static void fill_cache(enum cm_type t, int D, int rot, uint8_t *rows, uint8_t *trans) {
    const size_t row = cm_row_size(t, D), es = t == CM_TYPE_F32 ? 4 : 2;
    float x[DMAX];
    for (int p = 0; p < NPOS; p++) {
        for (int i = 0; i < D; i++) x[i] = frand();
        if (rot) cm_fwht_rows(x, D, rot);
        if (t == CM_TYPE_F32) memcpy(rows + row * p, x, (size_t)D * sizeof(float));
        else if (t == CM_TYPE_F16) cm_kernels_ref()->from_float[t](x, rows + row * p, D);
        else cm_quantize_rows(t, x, rows + row * p, 1, D);
        for (int i = 0; trans && i < D; i++) memcpy(trans + ((size_t)i * NPOS + p) * es, rows + row * p + es * i, es);
    }
}

/* One case's ranges: ntok tokens; mode 0 a prompt chunk (consecutive
 * positions), 1 the same under a sliding window, 2 scattered ends. */
static void make_ranges(int mode, int ntok, int *lo, int *hi) {
    const int start = 1 + (int)(urand() % (NPOS - TMAX - 1)), win = 100 + (int)(urand() % 700);
    for (int g = 0; g < ntok; g++) {
        hi[g] = mode == 2 ? 1 + (int)(urand() % NPOS) : start + g + 1;
        lo[g] = mode == 1 ? CM_MAX(0, hi[g] - win) : mode == 2 && urand() % 2 ? (int)(urand() % hi[g]) : 0;
    }
}

/* Decode's bits for the rep queries of one token: blocks, then the merge
 * (reverse: the blocks' partials merged last to first; whole: one partial
 * over [lo, hi), the order of one online softmax). */
static void decode_ref(const cm_kernels *k, const cm_attn_kv *kv, int D, int rep, const float *q, int lo, int hi,
                       const float *sinks, int variant, float *scratch, float *parts, float *out) {
    const size_t ps = (size_t)D + 2;
    const int b0 = lo / CM_ATTN_BLOCK, nb = variant == 2 ? 1 : (hi - 1) / CM_ATTN_BLOCK + 1 - b0;
    for (int bi = 0; bi < nb; bi++) {
        const int p0 = variant == 2 ? lo : CM_MAX(lo, (b0 + bi) * CM_ATTN_BLOCK);
        const int p1 = variant == 2 ? hi : CM_MIN(hi, (b0 + bi + 1) * CM_ATTN_BLOCK);
        const int slot = variant == 1 ? nb - 1 - bi : bi;
        cm_attn_split_block(k, kv, D, rep, q, p0, p1, 0.7f / sqrtf((float)D), scratch, parts + (size_t)slot * ps,
                            (size_t)nb * ps);
    }
    for (int h = 0; h < rep; h++)
        cm_attn_split_merge(parts + (size_t)h * nb * ps, nb, D, sinks ? sinks[h] : NAN, kv->rot_v, out + (size_t)h * D);
}

static void test_multi_bits(void) {
    static const enum cm_type types[6] = {CM_TYPE_F32,  CM_TYPE_F16, CM_TYPE_Q8_0,
                                          CM_TYPE_Q4_0, CM_TYPE_F32, CM_TYPE_F16};
    static const int dims[3] = {64, 128, 80}, reps[6] = {1, 2, 3, 4, 5, 8};
    const cm_kernels *tables[3] = {cm_kernels_ref(), cm_kernels_for("avx2"), cm_kernels_for("avx512")};
    uint8_t *kr = cm_malloc((size_t)NPOS * DMAX * 4), *vr = cm_malloc((size_t)NPOS * DMAX * 4);
    uint8_t *vt = cm_malloc((size_t)NPOS * DMAX * 4);
    const size_t mps = (size_t)NBMAX * (DMAX + 2);
    float *scratch = cm_malloc(sizeof(float) * cm_attn_multi_scratch_floats(TMAX * RMAX, DMAX));
    float *mparts = cm_malloc(sizeof(float) * TMAX * RMAX * mps), *parts = cm_malloc(sizeof(float) * RMAX * mps);
    float *q = cm_malloc(sizeof(float) * TMAX * (RMAX + 1) * DMAX);
    float *out = cm_malloc(sizeof(float) * TMAX * (RMAX + 1) * DMAX);
    float ref[RMAX * DMAX], sinks[RMAX];
    long cases = 0, rows = 0, differ_whole = 0, differ_reverse = 0, multi_block = 0, three_block = 0;
    for (int ti = 0; ti < 3; ti++) {
        const cm_kernels *kk = tables[ti];
        if (!kk) continue;
        for (int t = 0; t < 6; t++)
            for (int di = 0; di < 3; di++) {
                const enum cm_type ty = types[t];
                const int D = dims[di], trans = t >= 4;
                if (D % 32 && ty != CM_TYPE_F32 && ty != CM_TYPE_F16) continue;
                const int rk = cm_kv_rot_k(ty, D), rv = cm_kv_rot_v(ty, D);
                fill_cache(ty, D, rk, kr, NULL);
                fill_cache(ty, D, rv, vr, trans ? vt : NULL);
                const size_t row = cm_row_size(ty, D), es = ty == CM_TYPE_F32 ? 4 : 2;
                const cm_attn_kv av = {.k = kr,
                                       .v = trans ? vt : vr,
                                       .k_row = row,
                                       .v_row = trans ? es : row,
                                       .k_type = ty,
                                       .v_type = ty,
                                       .rot_k = rk,
                                       .rot_v = rv,
                                       .v_tstride = trans ? (size_t)NPOS * es : 0};
                CHECK(cm_attn_split_ok(kk, &av, D));
                for (int c = 0; c < (kk == tables[0] ? 4 : 9); c++) {
                    const int rep = reps[urand() % 6], ntok = 1 + (int)(urand() % TMAX), mode = c % 3;
                    int lo[TMAX], hi[TMAX];
                    make_ranges(mode, ntok, lo, hi);
                    const size_t qs = (size_t)(rep + 1) * D; /* token rows wider than rep heads, as a slice's */
                    for (size_t i = 0; i < ntok * qs; i++) q[i] = 3.0f * frand();
                    for (int h = 0; h < rep; h++) sinks[h] = frand();
                    const bool sink = c % 2;
                    cm_attn_multi(kk, &av, D, ntok, rep, q, qs, lo, hi, 0.7f / sqrtf((float)D), sink ? sinks : NULL,
                                  scratch, mparts, mps, out, qs);
                    cases++;
                    for (int g = 0; g < ntok; g++) {
                        const float *qg = q + g * qs, *og = out + g * qs;
                        decode_ref(kk, &av, D, rep, qg, lo[g], hi[g], sink ? sinks : NULL, 0, scratch, parts, ref);
                        rows += rep;
                        CHECKF(!memcmp(ref, og, sizeof(float) * rep * D),
                               "%s %s%s D %d rep %d token %d of %d [%d, %d): bits differ from decode's blocks",
                               kk->name, cm_type_name(ty), trans ? " transposed" : "", D, rep, g, ntok, lo[g], hi[g]);
                        if ((hi[g] - 1) / CM_ATTN_BLOCK == lo[g] / CM_ATTN_BLOCK) continue;
                        multi_block++;
                        if ((hi[g] - 1) / CM_ATTN_BLOCK - lo[g] / CM_ATTN_BLOCK >= 2) { /* a + b = b + a */
                            three_block++;
                            decode_ref(kk, &av, D, rep, qg, lo[g], hi[g], sink ? sinks : NULL, 1, scratch, parts, ref);
                            differ_reverse += memcmp(ref, og, sizeof(float) * rep * D) != 0;
                        }
                        decode_ref(kk, &av, D, rep, qg, lo[g], hi[g], sink ? sinks : NULL, 2, scratch, parts, ref);
                        differ_whole += memcmp(ref, og, sizeof(float) * rep * D) != 0;
                    }
                }
            }
    }
    if (getenv("CUMULO_TEST_VERBOSE"))
        fprintf(stderr,
                "  %ld cases, %ld query rows; tokens over 2+ blocks: %ld, %ld differ as one softmax; over 3+: %ld, %ld "
                "differ merged in reverse\n",
                cases, rows, multi_block, differ_whole, three_block, differ_reverse);
    CHECK(cases >= 100 && multi_block >= 100 && three_block >= 50);
    /* The bit comparison sees an order change (most tokens, not
     * necessarily all: a few may round alike). */
    CHECKF(differ_reverse * 2 > three_block && differ_whole * 2 > multi_block, "reverse %ld of %ld, whole %ld of %ld",
           differ_reverse, three_block, differ_whole, multi_block);
    cm_free(kr), cm_free(vr), cm_free(vt), cm_free(scratch), cm_free(mparts), cm_free(parts), cm_free(q), cm_free(out);
}

int main(void) {
    RUN(test_multi_bits);
    TEST_END();
}
