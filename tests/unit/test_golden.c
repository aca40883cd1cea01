/*
 * test_golden.c: the forward pass against llama.cpp on stories260K
 * (../shared/models, ../shared/reference, produced by node-llama-cpp with an
 * F32 KV cache, 1 thread). Token ids come straight from the reference JSON,
 * so this needs only gguf + kernels + model.
 *
 * Also proves the shapes the cluster builds on give the same answers:
 * 1 vs 2 threads, one-batch prefill vs token by token, two sequences in one
 * batch vs alone, two pipeline stages passing hidden states, and two
 * tensor-parallel slices whose partial sums meet in a test all-reduce.
 */
#include "test.h"
#include "fixtures.h"
#include "stories_ref.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "os/os.h"

#include <cjson/cJSON.h>
#include <pthread.h>

#define MAXTOK 512

typedef struct ref_case {
    int n_prompt, n_gen;
    int prompt[64];
    int gen[MAXTOK];
} ref_case;

typedef struct golden {
    const char *name;
    cm_gguf g;
    cm_model m;
    int n_cases;
    ref_case cases[4];
    stories_probs ref;
} golden;

static char errbuf[512];

static int load_ref(golden *G, const char *name) {
    char path[256];
    G->name = name;
    snprintf(path, sizeof path, "models/stories260K-%s.gguf", name);
    if (cm_gguf_open(&G->g, t_shared(path), NULL, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "  %s\n", errbuf);
        return -1;
    }
    if (cm_model_load(&G->m, &G->g, errbuf, sizeof errbuf)) {
        fprintf(stderr, "  %s\n", errbuf);
        return -1;
    }
    snprintf(path, sizeof path, "reference/stories260K-%s.greedy.json", name);
    char *txt;
    size_t len;
    if (cm_file_read_all(t_shared(path), &txt, &len, errbuf, sizeof errbuf)) return -1;
    cJSON *j = cJSON_Parse(txt);
    cm_free(txt);
    if (!j) return -1;
    cJSON *cases = cJSON_GetObjectItem(j, "cases"), *c;
    G->n_cases = 0;
    cJSON_ArrayForEach(c, cases) {
        ref_case *rc = &G->cases[G->n_cases++];
        cJSON *t;
        rc->n_prompt = rc->n_gen = 0;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(c, "prompt_tokens")) rc->prompt[rc->n_prompt++] = t->valueint;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(c, "generated_tokens")) rc->gen[rc->n_gen++] = t->valueint;
        if (G->n_cases == 4) break;
    }
    cJSON_Delete(j);
    return stories_probs_load(&G->ref, name, errbuf, sizeof errbuf);
}

static void release_ref(golden *G) {
    cm_model_release(&G->m);
    cm_gguf_close(&G->g);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void softmax_d(const float *x, int n, double *p) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += (p[i] = exp((double)x[i] - mx));
    for (int i = 0; i < n; i++) p[i] /= s;
}

/* Greedy generation of up to n_gen tokens on one machine; the prompt goes
 * in as one batch. Returns the count generated (stops after EOS 2). */
static bool g_rows; /* greedy and probs_err over an F32 cache as rows (the engine's default), not transposed */

static int greedy(const golden *G, cm_pool *pool, const int *prompt, int n_prompt, int n_gen, int *out) {
    const cm_model *m = &G->m;
    cm_ctx *c = cm_ctx_new(m, 64, 512, pool, errbuf, sizeof errbuf);
    cm_kv kv;
    if (!c || cm_kv_init_types(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 512, CM_TYPE_F32, CM_TYPE_F32, g_rows,
                               errbuf, sizeof errbuf))
        return -1;
    float logits[512];
    int32_t ids[64];
    for (int i = 0; i < n_prompt; i++) ids[i] = prompt[i];
    int n = 0;
    if (cm_forward_simple(c, &kv, ids, n_prompt, logits, errbuf, sizeof errbuf)) goto out;
    while (n < n_gen) {
        int32_t t = argmax(logits, m->hp.n_vocab);
        out[n++] = t;
        if (t == 2 || n == n_gen) break;
        if (cm_forward_simple(c, &kv, &t, 1, logits, errbuf, sizeof errbuf)) break;
    }
out:
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return n;
}

static int first_diff(const int *a, const int *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return n;
}

/* Greedy ids of every case; need = how many leading ids must match. */
static void check_greedy(golden *G, int threads, int need_all) {
    cm_pool *pool = cm_pool_new(threads);
    for (int ci = 0; ci < G->n_cases; ci++) {
        ref_case *rc = &G->cases[ci];
        int out[MAXTOK];
        int n = greedy(G, pool, rc->prompt, rc->n_prompt, rc->n_gen, out);
        CHECKF(n == rc->n_gen, "%s case %d: generated %d of %d (%s)", G->name, ci, n, rc->n_gen, errbuf);
        int d = first_diff(out, rc->gen, n < rc->n_gen ? n : rc->n_gen);
        int need = need_all || rc->n_gen <= 64 ? rc->n_gen : 32;
        CHECKF(d >= need, "%s case %d (%d threads): first differing id at %d (ours %d, llama.cpp %d)", G->name, ci,
               threads, d, d < n ? out[d] : -1, rc->gen[d]);
        if (getenv("CUMULO_TEST_VERBOSE"))
            fprintf(stderr, "  %s case %d threads %d: %d/%d ids equal\n", G->name, ci, threads, d, rc->n_gen);
    }
    cm_pool_free(pool);
}

/* Teacher-forced probabilities at all 32 positions (one batch, all rows),
 * max-abs error against llama.cpp's. */
static double probs_err(golden *G, cm_pool *pool) {
    cm_ctx *c = cm_ctx_new(&G->m, 32, 512, pool, errbuf, sizeof errbuf);
    double e = stories_probs_err_kv(c, &G->m, &G->ref, CM_TYPE_F32, g_rows, errbuf, sizeof errbuf);
    cm_ctx_free(c);
    return e;
}

static golden G32, G8, G4;

static void test_f32_greedy(void) {
    check_greedy(&G32, 1, 1);
    check_greedy(&G32, 2, 1);
}

/* Probability bounds, about 5x the error measured on this x86 machine with
 * CUMULO_ISA=scalar, avx2 and avx512 (the same on all three):
 *   F32  1.96e-6 (1 and 2 threads)  -> 1e-5
 *   Q8_0 2.3e-6                     -> 1.2e-5
 *   Q4_0 1.61e-6                    -> 8e-6
 * llama.cpp rounds activations to Q8_0 exactly as we do, so what remains is
 * float summation order (SIMD lanes vs scalar); a wrong block layout or a
 * missing activation quantization gives errors of 1e-2 or more. NEON is not
 * measured here: a rounding flip there (see docs/DESIGN.md, "Why 8-bit types
 * deviate") would show as a failure to look at, not to widen blindly. */
#define F32_PROB_BOUND 1e-5
#define Q8_0_PROB_BOUND 1.2e-5
#define Q4_0_PROB_BOUND 8e-6

static void test_f32_probs(void) {
    CHECK(G32.ref.n == 32);
    cm_pool *pool = cm_pool_new(2);
    double e1 = probs_err(&G32, NULL), e2 = probs_err(&G32, pool);
    cm_pool_free(pool);
    printf("# stories260K f32: max |p - p_llama.cpp| = %.3g (1 thread), %.3g (2 threads)\n", e1, e2);
    CHECKF(e1 <= F32_PROB_BOUND, "f32 max prob error %g > %g", e1, F32_PROB_BOUND);
    CHECKF(e2 <= F32_PROB_BOUND, "f32 max prob error %g > %g (2 threads)", e2, F32_PROB_BOUND);
}

static void test_q8_0(void) {
    check_greedy(&G8, 1, 1);
    double e = probs_err(&G8, NULL);
    printf("# stories260K q8_0: max |p - p_llama.cpp| = %.3g\n", e);
    CHECKF(e <= Q8_0_PROB_BOUND, "q8_0 max prob error %g > %g", e, Q8_0_PROB_BOUND);
}

/* Q4_0: llama.cpp's own Q4_0 path (repacked kernels on x86) drifts from its
 * plain arithmetic after position ~48: its batched teacher-forced
 * probabilities differ from ours by up to 1e-2 there while F32 and Q8_0
 * agree to 2e-6 at all 80 positions checked. Its one-token greedy decode then
 * picks 308 over 336 at step 78 of the "" prompt, where our margin is 0.006.
 * So: all ids of the three 64-token prompts, the first 32 (measured: 78) of
 * the 200-token one. */
static void test_q4_0(void) {
    check_greedy(&G4, 1, 0);
    double e = probs_err(&G4, NULL);
    printf("# stories260K q4_0: max |p - p_llama.cpp| = %.3g\n", e);
    CHECKF(e <= Q4_0_PROB_BOUND, "q4_0 max prob error %g > %g", e, Q4_0_PROB_BOUND);
}

/* Prefill in one batch == feeding the same tokens one at a time, and a
 * truncated cache continued == the uninterrupted run. Measured: bit-identical
 * logits (0) with CUMULO_ISA=scalar, avx2 and avx512, F32 and Q8_0; the bound
 * 1e-5 (was 1e-4) leaves room only for an ISA whose batched kernel sums in
 * another order than its one-token kernel. */
#define STEPWISE_LOGIT_BOUND 1e-5
static void test_prefill_vs_stepwise(void) {
    golden *Gs[] = {&G32, &G8};
    for (int gi = 0; gi < 2; gi++) {
        const cm_model *m = &Gs[gi]->m;
        cm_ctx *c = cm_ctx_new(m, 32, 512, NULL, errbuf, sizeof errbuf);
        cm_kv kv1, kv2;
        cm_kv_init(&kv1, m, 0, m->hp.n_layer, cm_slice_full(m), 64, errbuf, sizeof errbuf);
        cm_kv_init(&kv2, m, 0, m->hp.n_layer, cm_slice_full(m), 64, errbuf, sizeof errbuf);
        int32_t ids[20];
        for (int i = 0; i < 20; i++) ids[i] = Gs[gi]->ref.in[i];
        float l1[512], l2[512];
        CHECK(cm_forward_simple(c, &kv1, ids, 20, l1, errbuf, sizeof errbuf) == 0);
        for (int i = 0; i < 20; i++) CHECK(cm_forward_simple(c, &kv2, ids + i, 1, l2, errbuf, sizeof errbuf) == 0);
        double md = 0;
        for (int v = 0; v < 512; v++) md = fmax(md, fabs((double)l1[v] - l2[v]));
        printf("# %s: batch vs stepwise: max |logit difference| = %.3g\n", Gs[gi]->name, md);
        CHECKF(md <= STEPWISE_LOGIT_BOUND, "%s: batch vs stepwise logits differ by %g", Gs[gi]->name, md);
        CHECK(argmax(l1, 512) == argmax(l2, 512));
        CHECK(kv1.n_past == 20 && kv2.n_past == 20);
        /* Truncate and continue: rerunning the last 5 tokens gives the same logits. */
        cm_kv_truncate(&kv1, 15);
        CHECK(cm_forward_simple(c, &kv1, ids + 15, 5, l2, errbuf, sizeof errbuf) == 0);
        md = 0;
        for (int v = 0; v < 512; v++) md = fmax(md, fabs((double)l1[v] - l2[v]));
        printf("# %s: truncate + continue: max |logit difference| = %.3g\n", Gs[gi]->name, md);
        CHECKF(md <= STEPWISE_LOGIT_BOUND, "%s: truncate + continue differs by %g", Gs[gi]->name, md);
        cm_kv_release(&kv1);
        cm_kv_release(&kv2);
        cm_ctx_free(c);
    }
}

/* Two sequences decoding together in one batch give each one's own ids. */
static void test_two_sequences(void) {
    const golden *G = &G32;
    const cm_model *m = &G->m;
    cm_pool *pool = cm_pool_new(2);
    cm_ctx *c = cm_ctx_new(m, 16, 512, pool, errbuf, sizeof errbuf);
    cm_kv kvA, kvB;
    cm_kv_init(&kvA, m, 0, m->hp.n_layer, cm_slice_full(m), 256, errbuf, sizeof errbuf);
    cm_kv_init(&kvB, m, 0, m->hp.n_layer, cm_slice_full(m), 256, errbuf, sizeof errbuf);
    cm_kv *kvs[2] = {&kvA, &kvB};
    const ref_case *A = &G->cases[1], *B = &G->cases[2]; /* different prompt lengths */
    /* Prefill both prompts in one mixed batch, interleaved. */
    int32_t ids[32], pos[32], seq[32];
    int8_t want[32];
    int n = 0, ia = 0, ib = 0;
    while (ia < A->n_prompt || ib < B->n_prompt) {
        if (ia < A->n_prompt) {
            ids[n] = A->prompt[ia];
            pos[n] = ia;
            seq[n] = 0;
            want[n] = ia == A->n_prompt - 1;
            n++;
            ia++;
        }
        if (ib < B->n_prompt) {
            ids[n] = B->prompt[ib];
            pos[n] = ib;
            seq[n] = 1;
            want[n] = ib == B->n_prompt - 1;
            n++;
            ib++;
        }
    }
    float logits[2 * 512];
    int outA[64], outB[64];
    cm_batch b = {.n = n, .tokens = ids, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = m->hp.n_layer,
                         .slice = cm_slice_full(m),
                         .kvs = kvs,
                         .n_kvs = 2,
                         .out_logits = logits};
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == 0);
    /* The logits rows come in batch order: A's last prompt token is before B's. */
    int a_first = 2 * A->n_prompt - 1 < 2 * B->n_prompt;
    int ra = a_first ? 0 : 1, rb = 1 - ra;
    for (int step = 0; step < 48; step++) {
        outA[step] = argmax(logits + ra * 512, 512);
        outB[step] = argmax(logits + rb * 512, 512);
        /* B first this time, to check row order is honoured. */
        ids[0] = outB[step];
        pos[0] = kvB.n_past;
        seq[0] = 1;
        want[0] = 1;
        ids[1] = outA[step];
        pos[1] = kvA.n_past;
        seq[1] = 0;
        want[1] = 1;
        b.n = 2;
        ra = 1;
        rb = 0;
        if (cm_forward(c, &b, &a, errbuf, sizeof errbuf)) {
            CHECKF(0, "%s", errbuf);
            break;
        }
    }
    CHECKF(first_diff(outA, A->gen, 48) == 48, "sequence A in a shared batch differs at %d",
           first_diff(outA, A->gen, 48));
    CHECKF(first_diff(outB, B->gen, 48) == 48, "sequence B in a shared batch differs at %d",
           first_diff(outB, B->gen, 48));
    /* Positions must be contiguous: a gap is an error, and leaves n_past alone. */
    int np = kvA.n_past;
    pos[0] = kvA.n_past + 1;
    seq[0] = 0;
    b.n = 1;
    CHECK(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECK(kvA.n_past == np);
    cm_kv_release(&kvA);
    cm_kv_release(&kvB);
    cm_ctx_free(c);
    cm_pool_free(pool);
}

/* Two pipeline stages: layers [0, k) then [k, n), handing hidden states over. */
static void test_pipeline_stages(void) {
    golden *Gs[] = {&G32, &G4};
    for (int gi = 0; gi < 2; gi++) {
        const golden *G = Gs[gi];
        const cm_model *m = &G->m;
        const int L = m->hp.n_layer, k = 2;
        cm_ctx *c1 = cm_ctx_new(m, 16, 512, NULL, errbuf, sizeof errbuf);
        cm_ctx *c2 = cm_ctx_new(m, 16, 512, NULL, errbuf, sizeof errbuf);
        cm_kv kv1, kv2;
        cm_kv_init(&kv1, m, 0, k, cm_slice_full(m), 128, errbuf, sizeof errbuf);
        cm_kv_init(&kv2, m, k, L, cm_slice_full(m), 128, errbuf, sizeof errbuf);
        CHECK(cm_kv_bytes(m, 0, k, 0, m->hp.n_head_kv, 128) == (uint64_t)2 * k * 4 * 128 * 8 * 4);
        const ref_case *rc = &G->cases[3];
        int32_t ids[16], pos[16], seq[16] = {0};
        float hidden[16 * 64], logits[512];
        cm_kv *k1[1] = {&kv1}, *k2[1] = {&kv2};
        int n = rc->n_prompt, out[64];
        for (int i = 0; i < n; i++) ids[i] = rc->prompt[i];
        for (int step = 0; step < 64; step++) {
            for (int i = 0; i < n; i++) pos[i] = kv1.n_past + i;
            cm_batch b1 = {.n = n, .tokens = ids, .pos = pos, .seq = seq};
            cm_forward_args a1 = {.layer_first = 0,
                                  .layer_last = k,
                                  .slice = cm_slice_full(m),
                                  .kvs = k1,
                                  .n_kvs = 1,
                                  .out_hidden = hidden};
            cm_batch b2 = {.n = n, .embd = hidden, .pos = pos, .seq = seq};
            cm_forward_args a2 = {.layer_first = k,
                                  .layer_last = L,
                                  .slice = cm_slice_full(m),
                                  .kvs = k2,
                                  .n_kvs = 1,
                                  .out_logits = logits};
            if (cm_forward(c1, &b1, &a1, errbuf, sizeof errbuf) || cm_forward(c2, &b2, &a2, errbuf, sizeof errbuf)) {
                CHECKF(0, "%s", errbuf);
                break;
            }
            out[step] = ids[0] = argmax(logits, 512);
            n = 1;
        }
        CHECKF(first_diff(out, rc->gen, 64) == 64, "%s: 2-stage pipeline differs at %d", G->name,
               first_diff(out, rc->gen, 64));
        /* A stage that does not end at the last layer cannot give logits. */
        cm_batch b = {.n = 1, .tokens = ids, .pos = pos, .seq = seq};
        pos[0] = kv1.n_past;
        cm_forward_args bad = {
            .layer_first = 0, .layer_last = k, .slice = cm_slice_full(m), .kvs = k1, .n_kvs = 1, .out_logits = logits};
        CHECK(cm_forward(c1, &b, &bad, errbuf, sizeof errbuf) == CM_EINVAL);
        cm_kv_release(&kv1);
        cm_kv_release(&kv2);
        cm_ctx_free(c1);
        cm_ctx_free(c2);
    }
}

/* ---- two tensor-parallel slices in two threads, summed by a test all-reduce ---- */

typedef struct tp_member {
    fx_tp_rank tr; /* the all-reduce gets &tr */
    const golden *G;
    cm_slice slice;
    int out[64];
    int n_out;
    double logits_sum[512];
    int rc;
} tp_member;

static void *tp_main(void *arg) {
    tp_member *me = arg;
    const cm_model *m = &me->G->m;
    cm_ctx *c = cm_ctx_new(m, 16, 512, NULL, NULL, 0);
    cm_kv kv;
    me->rc = cm_kv_init(&kv, m, 0, m->hp.n_layer, me->slice, 128, NULL, 0);
    if (me->rc) return NULL;
    const ref_case *rc = &me->G->cases[1];
    int32_t ids[16], pos[16], seq[16] = {0};
    int n = rc->n_prompt;
    float logits[512];
    cm_kv *kvs[1] = {&kv};
    for (int i = 0; i < n; i++) ids[i] = rc->prompt[i];
    for (int step = 0; step < 64; step++) {
        for (int i = 0; i < n; i++) pos[i] = kv.n_past + i;
        cm_batch b = {.n = n, .tokens = ids, .pos = pos, .seq = seq};
        cm_forward_args a = {.layer_first = 0,
                             .layer_last = m->hp.n_layer,
                             .slice = me->slice,
                             .kvs = kvs,
                             .n_kvs = 1,
                             .allreduce = fx_tp_allreduce,
                             .allreduce_user = &me->tr,
                             .out_logits = logits};
        if ((me->rc = cm_forward(c, &b, &a, NULL, 0))) break;
        if (step == 0)
            for (int v = 0; v < 512; v++) me->logits_sum[v] = logits[v];
        me->out[me->n_out++] = ids[0] = argmax(logits, 512);
        n = 1;
    }
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return NULL;
}

static void run_tp(const golden *G, int n, const cm_slice *slices) {
    const cm_model *m = &G->m;
    fx_tp_group g;
    fx_tp_group_init(&g, n);
    tp_member mem[4];
    pthread_t th[4];
    for (int i = 0; i < n; i++) {
        mem[i] = (tp_member){.tr = {&g, i}, .G = G, .slice = slices[i]};
        CHECK(cm_slice_check(m, slices[i], errbuf, sizeof errbuf) == 0);
    }
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, tp_main, &mem[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    CHECK(g.calls == 64 * 2 * m->hp.n_layer);
    const ref_case *rc = &G->cases[1];
    for (int i = 0; i < n; i++)
        CHECKF(mem[i].rc == 0 && mem[i].n_out == 64 && first_diff(mem[i].out, rc->gen, 64) == 64,
               "%s: %d slices: member %d differs at %d", G->name, n, i, first_diff(mem[i].out, rc->gen, 64));
    fx_tp_group_destroy(&g);
}

static void test_tensor_parallel_slices(void) {
    const int F = G32.m.hp.n_ff;
    cm_slice two[2] = {{0, 2, 0, 100}, {2, 4, 100, F}};
    /* Uneven, with a member that holds FFN rows only (more members than KV heads). */
    cm_slice three[3] = {{0, 1, 0, 30}, {1, 4, 30, 120}, {4, 4, 120, F}};
    run_tp(&G32, 2, two);
    run_tp(&G8, 2, two);
    run_tp(&G32, 3, three);
    /* A slice boundary inside a Q8_0 block of attn_output is refused. */
    CHECK(cm_slice_check(&G8.m, (cm_slice){0, 1, 0, 172}, errbuf, sizeof errbuf) == CM_EINVAL);
    CHECK(cm_slice_check(&G32.m, (cm_slice){0, 1, 0, 172}, errbuf, sizeof errbuf) == 0);
    CHECK(cm_slice_check(&G32.m, (cm_slice){0, 5, 0, 172}, errbuf, sizeof errbuf) == CM_EINVAL);
}

/* An F16 KV cache against llama.cpp's (its default), stories260K F32, 64
 * positions one token at a time: measured 2.0e-4 (CUMULO_ISA=scalar), 2.5e-4
 * (avx2), 7.6e-4 (avx512, this Zen 4; the bound 1e-3 is not 5x that: the
 * AVX-512 F16 path's extra error is unexplained, NEEDSWORK) (an F32 cache is 1.1e-3 from
 * llama.cpp's F16 one, so the F16 rounding of q, K, V and the attention
 * weights is reproduced, not just tolerated). */
static double f16_kv(bool rows, const char *ref) {
    char *txt;
    size_t len;
    const char *dir = getenv("CUMULO_TESTDATA");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "tests/data", ref);
    if (cm_file_read_all(path, &txt, &len, errbuf, sizeof errbuf)) {
        CHECKF(0, "%s", errbuf);
        return 1;
    }
    const cm_model *m = &G32.m;
    cm_ctx *c = cm_ctx_new(m, 4, 512, NULL, errbuf, sizeof errbuf);
    cm_kv kv;
    CHECK(cm_kv_init_types(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 512, CM_TYPE_F16, CM_TYPE_F16, rows, errbuf,
                           sizeof errbuf) == 0);
    CHECK(kv.type == CM_TYPE_F16 && kv.v_rows == rows);
    double worst = 0;
    int n_rows = 0;
    for (char *line = txt; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line != '#') {
            char *e;
            int pos = (int)strtol(line, &e, 10);
            int32_t id = (int32_t)strtol(e, &e, 10);
            float lg[512];
            double p[512];
            CHECK(pos == kv.n_past && cm_forward_simple(c, &kv, &id, 1, lg, errbuf, sizeof errbuf) == 0);
            softmax_d(lg, 512, p);
            while (*e == ' ') {
                int v = (int)strtol(e, &e, 10);
                double ref = strtod(e + 1, &e);
                worst = fmax(worst, fabs(p[v] - ref));
            }
            n_rows++;
        }
        line = nl ? nl + 1 : NULL;
    }
    printf("# stories260K f32, F16 KV (%s): max |p - p_llama.cpp| = %.3g over %d positions (%s)\n",
           rows ? "rows" : "transposed", worst, n_rows, ref);
    CHECK(n_rows == 64);
    cm_kv_release(&kv);
    cm_ctx_free(c);
    cm_free(txt);
    CHECK(cm_kv_init_type(&kv, m, 0, 1, cm_slice_full(m), 8, CM_TYPE_Q8_0, errbuf, sizeof errbuf) == CM_EINVAL);
    return worst;
}

static void test_f16_kv(void) {
    double e = f16_kv(false, "stories260K_f16kv_ref.txt");
    CHECKF(e <= 1e-3, "f16 kv max prob error %g", e);
}

/* The rows layout, the engine's default for F32/F16 since session 15 (tiled
 * attention with an online softmax, cm_attn_flash, instead of ggml's
 * two-pass softmax over a transposed V): the same references and bounds as
 * the transposed cache above, F32 (greedy ids of every case at 1 and 2
 * threads, probabilities of F32, Q8_0 and Q4_0 weights) and F16 (the F16
 * reference). Measured on this Zen 4 (avx512): see the printed lines. */
static void test_rows_layout(void) {
    g_rows = true;
    check_greedy(&G32, 1, 1);
    check_greedy(&G32, 2, 1);
    check_greedy(&G8, 1, 1);
    check_greedy(&G4, 1, 0);
    cm_pool *pool = cm_pool_new(2);
    double e1 = probs_err(&G32, NULL), e2 = probs_err(&G32, pool), e8 = probs_err(&G8, NULL), e4 = probs_err(&G4, NULL);
    cm_pool_free(pool);
    g_rows = false;
    printf("# stories260K, F32 KV as rows: max |p - p_llama.cpp| f32 %.3g (1 thread) %.3g (2 threads), q8_0 %.3g, "
           "q4_0 %.3g\n",
           e1, e2, e8, e4);
    CHECKF(e1 <= F32_PROB_BOUND && e2 <= F32_PROB_BOUND, "rows: f32 max prob error %g / %g > %g", e1, e2,
           F32_PROB_BOUND);
    CHECKF(e8 <= Q8_0_PROB_BOUND, "rows: q8_0 max prob error %g > %g", e8, Q8_0_PROB_BOUND);
    CHECKF(e4 <= Q4_0_PROB_BOUND, "rows: q4_0 max prob error %g > %g", e4, Q4_0_PROB_BOUND);
    /* F16 rows against llama.cpp's flash attention over an F16 cache (-fa on;
     * its V sum kept in F16, ours in F32) and, for the record, against its
     * non-flash reference above (the transposed layout rounds the attention
     * weights to F16 as that path does; the rows do not). Measured, -fa /
     * non-flash reference: avx512 4.9e-4 / 1.36e-3, avx2 1.09e-3 / 1.22e-3,
     * scalar 1.12e-3 / 1.18e-3 (an F32 cache is 1.1e-3 from the non-flash
     * one: at this size F16 rows are checked for gross errors only; the F32
     * rows above are the tight check). */
    const double efa = f16_kv(true, "stories260K_f16kv_fa_ref.txt");
    const double enf = f16_kv(true, "stories260K_f16kv_ref.txt");
    CHECKF(efa <= 2e-3, "f16 rows vs llama.cpp -fa: max prob error %g", efa);
    CHECKF(enf <= 2e-3, "f16 rows vs llama.cpp without -fa: max prob error %g", enf);
}

static void test_hparams(void) {
    const cm_hparams *hp = &G32.m.hp;
    CHECK(hp->arch == CM_ARCH_LLAMA && hp->n_embd == 64 && hp->n_layer == 5 && hp->n_head == 8 && hp->n_head_kv == 4);
    CHECK(hp->head_dim == 8 && hp->n_ff == 172 && hp->n_vocab == 512 && hp->n_ctx_train == 512);
    CHECK(hp->rope_type == CM_ROPE_NORM && fabsf(hp->rope_base - 10000.f) < 1e-3f &&
          fabsf(hp->rms_eps - 1e-5f) < 1e-9f);
    CHECK(!G32.m.tied_output);
    CHECK(G32.m.tok_embd.data >= (void *)G32.g.base && (char *)G32.m.tok_embd.data < (char *)G32.g.base + G32.g.size);
    CHECK(G8.m.layers[0].wq.type == CM_TYPE_Q8_0 && G8.m.layers[0].ffn_down.type == CM_TYPE_F32);
}

int main(void) {
    if (load_ref(&G32, "f32") || load_ref(&G8, "q8_0") || load_ref(&G4, "q4_0")) {
        fprintf(stderr, "cannot load stories260K models/references from %s\n", t_shared(""));
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_hparams);
    RUN(test_f32_greedy);
    RUN(test_f32_probs);
    RUN(test_q8_0);
    RUN(test_q4_0);
    RUN(test_prefill_vs_stepwise);
    RUN(test_two_sequences);
    RUN(test_pipeline_stages);
    RUN(test_tensor_parallel_slices);
    RUN(test_f16_kv);
    RUN(test_rows_layout);
    release_ref(&G32);
    release_ref(&G8);
    release_ref(&G4);
    TEST_END();
}
