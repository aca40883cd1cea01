/* test_attn_split.c: decode attention split over blocks of KV positions
 * (model/attn_split.c and its kernels attn_qk / attn_vm / attn_exp).
 *   - every kernel table (scalar, and AVX2 / AVX-512 where the CPU has them;
 *     NEON's kernels are checked against scalar in test_kernels_simd) against
 *     softmax attention in double over the cache's dequantized rows, for the
 *     KV types F32, F16, Q8_0, Q4_0 (rotated and not), with a window and a
 *     sink, four queries sharing a KV head;
 *   - a whole decode step past the split threshold gives the same bits with
 *     1, 2 and 3 threads (the blocks are fixed by position, merged in block
 *     order; the prompt's chunks past 512 positions through the multi-query
 *     tiles), over a rows cache and over the transposed (default) one, and
 *     agrees with the per-(token, head) paths (cm_ctx_set_attn_split off);
 *   - a prompt past it fed at once, in chunks of 7 and one token at a time
 *     gives the same bits (batch invariance: cm_attn_multi keeps each
 *     query's decode order; test_attn_multi checks it kernel by kernel). */
#include "test.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"

static char errbuf[512];

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

enum { D = 64, N = 1200, NQ = 4 };

/* softmax(scale q.K_p, p in [lo, hi), and the sink) . V in double. */
static void naive(const float *q, const float *k, const float *v, int lo, int hi, float scale, float sink,
                  double *out) {
    static double sc[N];
    double mx = isnan(sink) ? -INFINITY : sink, sum = 0;
    for (int p = lo; p < hi; p++) {
        double d = 0;
        for (int i = 0; i < D; i++) d += (double)q[i] * k[(size_t)p * D + i];
        sc[p] = d * scale;
        mx = fmax(mx, sc[p]);
    }
    for (int i = 0; i < D; i++) out[i] = 0;
    for (int p = lo; p < hi; p++) {
        const double e = exp(sc[p] - mx);
        sum += e;
        for (int i = 0; i < D; i++) out[i] += e * v[(size_t)p * D + i];
    }
    if (!isnan(sink)) sum += exp(sink - mx);
    for (int i = 0; i < D; i++) out[i] /= sum;
}

/* n rows of D floats as a cache of type t, rotated by rot first (0: not). */
static uint8_t *make_rows(enum cm_type t, const float *x, int n, int rot) {
    const size_t row = cm_row_size(t, D);
    uint8_t *p = cm_malloc(row * (size_t)n + 64);
    float tmp[D];
    for (int j = 0; j < n; j++) {
        memcpy(tmp, x + (size_t)j * D, sizeof tmp);
        if (rot) cm_fwht_rows(tmp, D, rot);
        if (t == CM_TYPE_F32) memcpy(p + row * j, tmp, sizeof tmp);
        else if (t == CM_TYPE_F16) cm_kernels_ref()->from_float[CM_TYPE_F16](tmp, p + row * j, D);
        else cm_quantize_rows(t, tmp, p + row * j, 1, D);
    }
    return p;
}

/* What the cache holds as floats in the query's frame (rotated back). */
static void dequant_rows(enum cm_type t, const uint8_t *r, int n, int rot, float *out) {
    const size_t row = cm_row_size(t, D);
    for (int j = 0; j < n; j++) {
        cm_kernels_ref()->to_float[t](r + row * j, out + (size_t)j * D, D);
        if (rot) cm_fwht_rows(out + (size_t)j * D, D, rot);
    }
}

static void test_split_vs_naive(void) {
    static const enum cm_type types[4] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0, CM_TYPE_Q4_0};
    const cm_kernels *tables[3] = {cm_kernels_ref(), cm_kernels_for("avx2"), cm_kernels_for("avx512")};
    uint64_t s = 5;
    float *k = cm_malloc(sizeof(float) * D * N), *v = cm_malloc(sizeof(float) * D * N), q[NQ * D], out[D];
    float *kd = cm_malloc(sizeof(float) * D * N), *vd = cm_malloc(sizeof(float) * D * N);
    for (int i = 0; i < D * N; i++) k[i] = frand(&s), v[i] = frand(&s);
    for (int i = 0; i < NQ * D; i++) q[i] = 3 * frand(&s);
    float *scratch = cm_malloc(sizeof(float) * cm_attn_split_scratch_floats(NQ, D));
    const int nbmax = N / CM_ATTN_BLOCK + 2;
    float *parts = cm_malloc(sizeof(float) * NQ * nbmax * (D + 2));
    const int ranges[3][2] = {{0, N}, {300, 1100}, {0, 700}};
    const float sinks[2] = {NAN, 1.5f};
    int tested = 0;
    for (int ti = 0; ti < 3; ti++) {
        const cm_kernels *kk = tables[ti];
        if (!kk) continue;
        for (int t = 0; t < 4; t++)
            for (int rot = 0; rot < (t >= 2 ? 2 : 1); rot++) {
                const int rk = rot ? cm_kv_rot_k(types[t], D) : 0, rv = rot ? cm_kv_rot_v(types[t], D) : 0;
                uint8_t *kr = make_rows(types[t], k, N, rk), *vr = make_rows(types[t], v, N, rv);
                dequant_rows(types[t], kr, N, rk, kd);
                dequant_rows(types[t], vr, N, rv, vd);
                const size_t row = cm_row_size(types[t], D);
                const cm_attn_kv av = {.k = kr,
                                       .v = vr,
                                       .k_row = row,
                                       .v_row = row,
                                       .k_type = types[t],
                                       .v_type = types[t],
                                       .rot_k = rk,
                                       .rot_v = rv};
                CHECK(cm_attn_split_ok(kk, &av, D));
                for (int r = 0; r < 3; r++) {
                    const int lo = ranges[r][0], hi = ranges[r][1], b0 = lo / CM_ATTN_BLOCK;
                    const int nb = (hi - 1) / CM_ATTN_BLOCK + 1 - b0;
                    for (int bi = 0; bi < nb; bi++) {
                        const int p0 = CM_MAX(lo, (b0 + bi) * CM_ATTN_BLOCK),
                                  p1 = CM_MIN(hi, (b0 + bi + 1) * CM_ATTN_BLOCK);
                        cm_attn_split_block(kk, &av, D, NQ, q, p0, p1, 0.125f, scratch, parts + (size_t)bi * (D + 2),
                                            (size_t)nbmax * (D + 2));
                    }
                    for (int si = 0; si < 2; si++)
                        for (int h = 0; h < NQ; h++) {
                            double ref[D], e = 0;
                            cm_attn_split_merge(parts + (size_t)h * nbmax * (D + 2), nb, D, sinks[si], rv, out);
                            naive(q + h * D, kd, vd, lo, hi, 0.125f, sinks[si], ref);
                            for (int i = 0; i < D; i++) e = fmax(e, fabs(out[i] - ref[i]));
                            /* the query rounded through K's vec_dot type (F16: 2^-11
                             * relative, Q8_0: 1/254 of a block's max) moves the scores;
                             * F32 sums of 256 products otherwise. Measured: F32 6e-8,
                             * F16 3e-5, Q8_0 5e-4, Q4_0 5e-4 */
                            const double tol = t == 0 ? 1e-6 : t == 1 ? 3e-4 : 2.5e-3;
                            if (getenv("CUMULO_TEST_VERBOSE") && h == 0)
                                fprintf(stderr, "  %s %s rot %d [%d, %d) sink %g: %.3g\n", kk->name,
                                        cm_type_name(types[t]), rot, lo, hi, (double)sinks[si], e);
                            CHECKF(e < tol, "%s %s rot %d [%d, %d) query %d: max error %.3g", kk->name,
                                   cm_type_name(types[t]), rot, lo, hi, h, e);
                        }
                    tested++;
                }
                cm_free(kr);
                cm_free(vr);
            }
    }
    CHECK(tested >= 18 * ((tables[1] != NULL) + 1));
    cm_free(scratch), cm_free(parts);
    cm_free(k), cm_free(v), cm_free(kd), cm_free(vd);
}

/* The transposed layout's view (F32/F16 V as element rows, v_tstride) in
 * decode's blocks, and cm_attn_multi (prefill: 3 tokens x 4 heads, each token
 * its own [lo, hi), rows and transposed V, with a sink) against the naive
 * softmax, with every table. */
static void test_transposed_and_multi(void) {
    static const enum cm_type types[3] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0};
    const cm_kernels *tables[3] = {cm_kernels_ref(), cm_kernels_for("avx2"), cm_kernels_for("avx512")};
    uint64_t s = 11;
    float *k = cm_malloc(sizeof(float) * D * N), *v = cm_malloc(sizeof(float) * D * N), q[3 * NQ * D], out[3 * NQ * D];
    float *kd = cm_malloc(sizeof(float) * D * N), *vd = cm_malloc(sizeof(float) * D * N);
    for (int i = 0; i < D * N; i++) k[i] = frand(&s), v[i] = frand(&s);
    for (int i = 0; i < 3 * NQ * D; i++) q[i] = 3 * frand(&s);
    float *scratch = cm_malloc(sizeof(float) * cm_attn_multi_scratch_floats(3 * NQ, D));
    float *parts = cm_malloc(sizeof(float) * NQ * (N / CM_ATTN_BLOCK + 2) * (D + 2));
    const size_t mps = (size_t)(N / CM_ATTN_BLOCK + 2) * (D + 2);
    float *mparts = cm_malloc(sizeof(float) * 3 * NQ * mps);
    uint8_t *vt = cm_malloc((size_t)D * N * 4);
    const float sinks[NQ] = {NAN, 0.5f, NAN, 2.0f};
    int tested = 0;
    for (int ti = 0; ti < 3; ti++) {
        const cm_kernels *kk = tables[ti];
        if (!kk) continue;
        for (int t = 0; t < 3; t++)
            for (int trans = 0; trans < (t < 2 ? 2 : 1); trans++) {
                const size_t row = cm_row_size(types[t], D), es = t == 0 ? 4 : 2;
                const int rk = cm_kv_rot_k(types[t], D), rv = cm_kv_rot_v(types[t], D);
                uint8_t *kr = make_rows(types[t], k, N, rk), *vr = make_rows(types[t], v, N, rv);
                dequant_rows(types[t], kr, N, rk, kd);
                dequant_rows(types[t], vr, N, rv, vd);
                for (int p = 0; trans && p < N; p++) /* V's element rows of N positions */
                    for (int i = 0; i < D; i++) memcpy(vt + ((size_t)i * N + p) * es, vr + row * p + es * i, es);
                const cm_attn_kv av = {.k = kr,
                                       .v = trans ? vt : vr,
                                       .k_row = row,
                                       .v_row = trans ? es : row,
                                       .k_type = types[t],
                                       .v_type = types[t],
                                       .rot_k = rk,
                                       .rot_v = rv,
                                       .v_tstride = trans ? (size_t)N * es : 0};
                CHECK(cm_attn_split_ok(kk, &av, D));
                const int lo[3] = {0, 250, 0}, hi[3] = {700, 1005, N - 3};
                cm_attn_multi(kk, &av, D, 3, NQ, q, NQ * D, lo, hi, 0.125f, sinks, scratch, mparts, mps, out, NQ * D);
                for (int g = 0; g < 3; g++) {
                    const int b0 = lo[g] / CM_ATTN_BLOCK, nb = (hi[g] - 1) / CM_ATTN_BLOCK + 1 - b0;
                    for (int bi = 0; bi < nb; bi++)
                        cm_attn_split_block(kk, &av, D, NQ, q + g * NQ * D, CM_MAX(lo[g], (b0 + bi) * CM_ATTN_BLOCK),
                                            CM_MIN(hi[g], (b0 + bi + 1) * CM_ATTN_BLOCK), 0.125f, scratch,
                                            parts + (size_t)bi * (D + 2), (size_t)nb * (D + 2));
                    for (int h = 0; h < NQ; h++) {
                        double ref[D], e = 0, e2 = 0;
                        float o2[D];
                        naive(q + (g * NQ + h) * D, kd, vd, lo[g], hi[g], 0.125f, sinks[h], ref);
                        cm_attn_split_merge(parts + (size_t)h * nb * (D + 2), nb, D, sinks[h], rv, o2);
                        for (int i = 0; i < D; i++)
                            e = fmax(e, fabs(out[(g * NQ + h) * D + i] - ref[i])), e2 = fmax(e2, fabs(o2[i] - ref[i]));
                        const double tol = t == 0 ? 1e-6 : t == 1 ? 3e-4 : 2.5e-3;
                        CHECKF(e < tol && e2 < tol, "%s %s %s token %d head %d: multi %.3g, blocks %.3g", kk->name,
                               cm_type_name(types[t]), trans ? "transposed" : "rows", g, h, e, e2);
                        CHECKF(!memcmp(o2, out + (g * NQ + h) * D, sizeof o2),
                               "%s %s %s token %d head %d: multi's bits", kk->name, cm_type_name(types[t]),
                               trans ? "transposed" : "rows", g, h);
                    }
                }
                tested++;
                cm_free(kr);
                cm_free(vr);
            }
    }
    CHECK(tested >= 5);
    cm_free(scratch), cm_free(parts), cm_free(mparts), cm_free(vt);
    cm_free(k), cm_free(v), cm_free(kd), cm_free(vd);
}

/* A synthetic llama in memory: 8 query heads on 2 KV heads of 64. */
static int load_model(cm_buf *file, cm_gguf *g, cm_model *m) {
    cm_synth_params sp = {.arch = "llama",
                          .n_embd = 512,
                          .n_layer = 2,
                          .n_head = 8,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .n_ctx = 2048,
                          .type = "f32",
                          .seed = 3,
                          .n_threads = 1};
    cm_buf vb;
    cm_buf_init(&vb);
    cm_buf_init(file);
    cm_gguf voc = {0};
    int rc = cm_synth_builtin_vocab(&vb, errbuf, sizeof errbuf) ||
             cm_gguf_parse(&voc, (const uint8_t *)vb.data, vb.len, errbuf, sizeof errbuf) ||
             cm_synth_write(&sp, &voc, NULL, file, errbuf, sizeof errbuf) ||
             cm_gguf_parse(g, (const uint8_t *)file->data, file->len, errbuf, sizeof errbuf) ||
             cm_model_load(m, g, errbuf, sizeof errbuf);
    CHECKF(!rc, "synthetic model: %s", errbuf);
    cm_gguf_close(&voc);
    cm_buf_release(&vb);
    return rc;
}

/* Prefill n_prompt tokens and decode one more with `threads` threads and a
 * cache of the given types and layout; the decode step's logits into out.
 * split false: the per-(token, head) paths at every length (two-pass over
 * the transposed cache, attn.c's tiles over rows), the reference. */
static int decode_logits(const cm_model *m, int threads, enum cm_type t, bool rows, const int32_t *toks, int n_prompt,
                         bool split, float *out) {
    cm_pool *pool = cm_pool_new(threads);
    cm_ctx *c = cm_ctx_new(m, 64, n_prompt + 8, pool, errbuf, sizeof errbuf);
    cm_kv kv;
    int rc = !c || cm_kv_init_types(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), n_prompt + 8, t, t, rows, errbuf,
                                    sizeof errbuf);
    if (c) cm_ctx_set_attn_split(c, split);
    if (!rc)
        rc = cm_forward_simple(c, &kv, toks, n_prompt, out, errbuf, sizeof errbuf) ||
             cm_forward_simple(c, &kv, toks + n_prompt, 1, out, errbuf, sizeof errbuf);
    CHECKF(!rc, "decode with %d threads: %s", threads, errbuf);
    if (c) cm_kv_release(&kv);
    cm_ctx_free(c);
    cm_pool_free(pool);
    return rc;
}

static void test_threads_bitwise(void) {
    cm_buf file;
    cm_gguf g;
    cm_model m;
    if (load_model(&file, &g, &m)) return;
    /* past the split threshold: the prompt's last chunks run the multi-query
     * tiles, the decode step 3 blocks */
    const int n_prompt = 2 * CM_ATTN_BLOCK + 180, V = m.hp.n_vocab;
    int32_t *toks = cm_malloc(sizeof(int32_t) * (n_prompt + 1));
    uint64_t s = 9;
    for (int i = 0; i <= n_prompt; i++) toks[i] = (int32_t)((frand(&s) + 1.0f) * 0.5f * (V - 1));
    float *ref = cm_malloc(sizeof(float) * V), *o = cm_malloc(sizeof(float) * V);
    static const enum cm_type types[3] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0};
    for (int ti = 0; ti < 5; ti++) { /* rows F32, F16, Q8_0; transposed F32, F16 */
        const enum cm_type t = types[ti % 3];
        const bool rows = ti < 3;
        if (decode_logits(&m, 1, t, rows, toks, n_prompt, true, ref)) break;
        for (int th = 2; th <= 3; th++) {
            if (decode_logits(&m, th, t, rows, toks, n_prompt, true, o)) break;
            CHECKF(!memcmp(ref, o, sizeof(float) * V), "%s %s cache: %d threads give other bits than 1",
                   cm_type_name(t), rows ? "rows" : "transposed", th);
        }
        /* against the per-(token, head) paths: float sums in another order;
         * F16: those round the weights to F16 (two-pass) or accumulate in F16
         * (rows, ggml's one-query path); Q8_0: the query rounded alike */
        if (decode_logits(&m, 2, t, rows, toks, n_prompt, false, ref)) break;
        double e = 0, mx = 0;
        for (int i = 0; i < V; i++) e = fmax(e, fabs(ref[i] - o[i])), mx = fmax(mx, fabs(o[i]));
        if (getenv("CUMULO_TEST_VERBOSE"))
            fprintf(stderr, "  %s %s: split vs per-head paths %.3g of %.3g\n", cm_type_name(t),
                    rows ? "rows" : "transposed", e, mx);
        CHECKF(e <= (t == CM_TYPE_F32 ? 1e-4 : 2e-3) * fmax(1.0, mx),
               "%s %s: split vs per-head logits differ by %.3g (max %.3g)", cm_type_name(t),
               rows ? "rows" : "transposed", e, mx);
    }
    cm_free(toks), cm_free(ref), cm_free(o);
    cm_model_release(&m);
    cm_gguf_close(&g);
    cm_buf_release(&file);
}

/* Two sequences past the split threshold decoded in one batch give the bits
 * of each decoded alone (the batch's one-token runs take decode's blocks). */
static void test_batched_decode(void) {
    cm_buf file;
    cm_gguf g;
    cm_model m;
    if (load_model(&file, &g, &m)) return;
    const int n_prompt = 2 * CM_ATTN_BLOCK + 100, V = m.hp.n_vocab, E = m.hp.n_embd;
    int32_t *toks = cm_malloc(sizeof(int32_t) * 2 * (n_prompt + 1));
    uint64_t s = 13;
    for (int i = 0; i < 2 * (n_prompt + 1); i++) toks[i] = (int32_t)((frand(&s) + 1.0f) * 0.5f * (V - 1));
    float *lg = cm_malloc(sizeof(float) * V), *h1 = cm_malloc(sizeof(float) * 2 * E),
          *h2 = cm_malloc(sizeof(float) * 2 * E);
    cm_pool *pool = cm_pool_new(2);
    cm_ctx *c = cm_ctx_new(&m, 64, n_prompt + 8, pool, errbuf, sizeof errbuf);
    for (int rows = 0; c && rows < 2; rows++) {
        const enum cm_type t = rows ? CM_TYPE_Q8_0 : CM_TYPE_F16;
        cm_kv kv[4];
        int rc = 0, nk = 0;
        for (; nk < 4 && !rc; nk++)
            rc = cm_kv_init_types(&kv[nk], &m, 0, m.hp.n_layer, cm_slice_full(&m), n_prompt + 8, t, t, rows, errbuf,
                                  sizeof errbuf) ||
                 cm_forward_simple(c, &kv[nk], toks + (nk % 2) * (n_prompt + 1), n_prompt, lg, errbuf, sizeof errbuf);
        for (int q = 0; q < 3 && !rc; q++) { /* kv 0 and 1 alone, kv 2 and 3 together */
            const int32_t tok[2] = {toks[n_prompt], toks[2 * n_prompt + 1]}, pos[2] = {n_prompt, n_prompt},
                          seq[2] = {0, 1};
            cm_kv *kvs[2] = {&kv[q == 2 ? 2 : q], &kv[3]};
            const cm_batch b = {.n = q == 2 ? 2 : 1, .tokens = q == 2 ? tok : tok + q, .pos = pos, .seq = seq};
            const cm_forward_args a = {.layer_first = 0,
                                       .layer_last = m.hp.n_layer,
                                       .slice = cm_slice_full(&m),
                                       .kvs = kvs,
                                       .n_kvs = q == 2 ? 2 : 1,
                                       .out_hidden = q == 2 ? h2 : h1 + q * E};
            rc = cm_forward(c, &b, &a, errbuf, sizeof errbuf);
        }
        CHECKF(!rc, "batched decode: %s", errbuf);
        if (!rc)
            CHECKF(!memcmp(h1, h2, sizeof(float) * 2 * E), "%s cache: two sequences decoded together differ from alone",
                   cm_type_name(t));
        for (int i = 0; i < nk; i++) cm_kv_release(&kv[i]);
    }
    CHECKF(c != NULL, "context: %s", errbuf);
    cm_ctx_free(c);
    cm_pool_free(pool);
    cm_free(toks), cm_free(lg), cm_free(h1), cm_free(h2);
    cm_model_release(&m);
    cm_gguf_close(&g);
    cm_buf_release(&file);
}

/* A prompt past the split threshold fed at once (batches of 64: groups of
 * 8 tokens through cm_attn_multi) and fed in other chunks (7 tokens, then
 * one at a time: other groups, the decode's own path) gives the same bits
 * of the last logits: batch invariance (http_chunked.sh, end to end). */
static void test_chunked_prefill(void) {
    cm_buf file;
    cm_gguf g;
    cm_model m;
    if (load_model(&file, &g, &m)) return;
    const int n_prompt = 2 * CM_ATTN_BLOCK + 300, V = m.hp.n_vocab;
    int32_t *toks = cm_malloc(sizeof(int32_t) * n_prompt);
    uint64_t s = 17;
    for (int i = 0; i < n_prompt; i++) toks[i] = (int32_t)((frand(&s) + 1.0f) * 0.5f * (V - 1));
    float *ref = cm_malloc(sizeof(float) * V), *o = cm_malloc(sizeof(float) * V);
    cm_pool *pool = cm_pool_new(2);
    cm_ctx *c = cm_ctx_new(&m, 64, n_prompt + 8, pool, errbuf, sizeof errbuf);
    static const enum cm_type types[4] = {CM_TYPE_F16, CM_TYPE_Q8_0, CM_TYPE_Q4_0, CM_TYPE_F16};
    for (int ti = 0; c && ti < 4; ti++) { /* rows F16, Q8_0, Q4_0; transposed F16 */
        for (int how = 0; how < 3; how++) {
            cm_kv kv;
            int rc = cm_kv_init_types(&kv, &m, 0, m.hp.n_layer, cm_slice_full(&m), n_prompt + 8, types[ti], types[ti],
                                      ti < 3, errbuf, sizeof errbuf);
            /* how 0: at once; 1: chunks of 7; 2: 600 at once, then one at a time */
            const int step = how == 1 ? 7 : how == 2 ? 1 : n_prompt;
            for (int done = 0; !rc && done < n_prompt;) {
                const int nb = CM_MIN(how == 2 && done == 0 ? 600 : step, n_prompt - done);
                rc = cm_forward_simple(c, &kv, toks + done, nb, how ? o : ref, errbuf, sizeof errbuf);
                done += nb;
            }
            CHECKF(!rc, "prefill: %s", errbuf);
            if (!rc && how)
                CHECKF(!memcmp(ref, o, sizeof(float) * V), "%s %s cache: prompt fed %s gives other bits than at once",
                       cm_type_name(types[ti]), ti < 3 ? "rows" : "transposed",
                       how == 1 ? "in chunks of 7" : "one token at a time");
            if (!rc) cm_kv_release(&kv);
        }
    }
    CHECKF(c != NULL, "context: %s", errbuf);
    cm_ctx_free(c);
    cm_pool_free(pool);
    cm_free(toks), cm_free(ref), cm_free(o);
    cm_model_release(&m);
    cm_gguf_close(&g);
    cm_buf_release(&file);
}

int main(void) {
    RUN(test_split_vs_naive);
    RUN(test_transposed_and_multi);
    RUN(test_threads_bitwise);
    RUN(test_batched_decode);
    RUN(test_chunked_prefill);
    TEST_END();
}
