/*
 * test_train.c: LoRA training math (train/train.h) on tiny synthetic models.
 *
 * Gradient check: the analytic gradient of the mean cross-entropy with
 * respect to the LoRA parameters against central finite differences, along
 * random +-1 directions restricted to each (layer, target) pair's A and to
 * its B separately, so every pair is checked on its own. Directional
 * derivatives sum thousands of terms, which lifts them far above the F32
 * rounding noise of the loss; steps h = 5e-3 and 2h, Richardson-extrapolated.
 * Bound: |fd - analytic| / max(|analytic|, 0.1) < 2e-3 per direction
 * (measured worst 1.03e-3, qwen2 F32; the floor keeps near-zero derivatives, where F32
 * noise of ~5e-5 dominates, from failing on noise). llama (adjacent-pair RoPE), qwen2
 * (biases, NEOX RoPE), qwen3 (q/k norms), F32 and Q8_0 / Q4_K base weights
 * (dequantized on the fly: the math differs only in W), with and without
 * LoRA dropout (a fixed key gives a fixed mask: a smooth function).
 * Also: the adapter's output equals model/lora.h's inference correction
 * (the training forward's logits with the adapter vs cm_forward with it,
 * F32 model), and AdamW makes a known first step.
 */
#include "test.h"

#include "gguf/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "os/os.h"
#include "synth/synth.h"
#include "train/train.h"
#include "train/train_data.h"
#include "train/train_io.h"
#include "tokenizer/tokenizer.h"

static char errbuf[512];

typedef struct tiny {
    cm_buf file, vocab;
    cm_gguf g, gv;
    cm_model m;
} tiny;

static int g_layers = 2; /* layers of the next tiny model */

static int tiny_open(tiny *t, const char *arch, const char *type) {
    memset(t, 0, sizeof *t);
    cm_buf_init(&t->file);
    cm_buf_init(&t->vocab);
    bool k = !strncmp(type, "q4_k", 4);
    cm_synth_params sp = {.arch = arch,
                          .n_embd = k ? 256 : 64,
                          .n_layer = g_layers,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = k ? 256 : 96,
                          .type = type,
                          .seed = 11,
                          .n_threads = 1};
    int rc = cm_synth_builtin_vocab(&t->vocab, errbuf, sizeof errbuf);
    if (!rc) rc = cm_gguf_parse(&t->gv, (const uint8_t *)t->vocab.data, t->vocab.len, errbuf, sizeof errbuf);
    if (!rc) rc = cm_synth_write(&sp, &t->gv, NULL, &t->file, errbuf, sizeof errbuf);
    if (!rc) rc = cm_gguf_parse(&t->g, (const uint8_t *)t->file.data, t->file.len, errbuf, sizeof errbuf);
    if (!rc) rc = cm_model_load(&t->m, &t->g, errbuf, sizeof errbuf);
    if (rc) fprintf(stderr, "  %s %s: %s\n", arch, type, errbuf);
    return rc;
}

static void tiny_close(tiny *t) {
    cm_model_release(&t->m);
    cm_gguf_close(&t->g);
    cm_gguf_close(&t->gv);
    cm_buf_release(&t->file);
    cm_buf_release(&t->vocab);
}

enum { T = 7 };
static const int32_t TOK[T] = {1, 40, 77, 93, 12, 150, 64};
static const int32_t TGT[T] = {40, 77, -1, 12, 150, 64, 9};

static double loss_of(cm_trainer *tr, float drop) {
    int n;
    return cm_train_window(tr, TOK, TGT, T, false, 1.0f, drop, 99, &n) / n;
}

/* Worst relative error of the directional derivatives over every pair's A and B. */
static double grad_check(const char *arch, const char *type, float drop) {
    tiny t;
    if (tiny_open(&t, arch, type)) return 1e9;
    cm_tadapter *ad = NULL;
    cm_trainer *tr = NULL;
    double worst = 0;
    if (cm_tadapter_new(&ad, &t.m, 3, 6.0f, CM_TRAIN_TARGETS_ALL, 5, errbuf, sizeof errbuf) ||
        cm_trainer_new(&tr, &t.m, ad, T, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "  %s\n", errbuf);
        worst = 1e9;
        goto out;
    }
    cm_rng rng;
    cm_rng_seed(&rng, 17);
    for (size_t i = 0; i < ad->n_params; i++) /* B nonzero, or A's gradient would be 0 */
        ad->w[i] += 0.05f * cm_rng_normal(&rng);
    int n;
    double l0 = cm_train_window(tr, TOK, TGT, T, true, 1.0f / 6.0f, drop, 99, &n);
    CHECK(n == 6 && l0 > 0);
    float *dir = cm_malloc(ad->n_params * sizeof(float)), *w0 = cm_malloc(ad->n_params * sizeof(float));
    memcpy(w0, ad->w, ad->n_params * sizeof(float));
    for (int p = 0; p < ad->n_pairs; p++)
        for (int half = 0; half < 2; half++) {
            const cm_tpair *pr = &ad->pairs[p];
            size_t off = half ? pr->b : pr->a, len = (size_t)(ad->rank * (half ? pr->n_out : pr->n_in));
            double an = 0;
            for (size_t i = 0; i < len; i++) {
                dir[i] = (cm_rng_next(&rng) & 1) ? 1.0f : -1.0f;
                an += (double)dir[i] * ad->g[off + i];
            }
            /* central differences at h and 2h, Richardson-extrapolated: the h^2 term
             * cancels, so h can be large enough that F32 noise in the loss stays small */
            const float h = getenv("H") ? (float)atof(getenv("H")) : 5e-3f;
            double d[2];
            for (int k = 0; k < 2; k++) {
                const float hk = h * (float)(k + 1);
                for (size_t i = 0; i < len; i++) ad->w[off + i] = w0[off + i] + hk * dir[i];
                double lp = loss_of(tr, drop);
                for (size_t i = 0; i < len; i++) ad->w[off + i] = w0[off + i] - hk * dir[i];
                double lm = loss_of(tr, drop);
                d[k] = (lp - lm) / (2.0 * hk);
            }
            memcpy(ad->w + off, w0 + off, len * sizeof(float));
            double fd = (4.0 * d[0] - d[1]) / 3.0;
            double rel = fabs(fd - an) / fmax(fabs(an), 0.1);
            if (rel > worst) worst = rel;
            if (getenv("CUMULO_TEST_VERBOSE"))
                fprintf(stderr, "  %s %s l%d t%d %s: analytic %.6g fd %.6g rel %.2e\n", arch, type, pr->il, pr->t,
                        half ? "B" : "A", an, fd, rel);
        }
    cm_free(dir);
    cm_free(w0);
out:
    cm_trainer_free(tr);
    cm_tadapter_free(ad);
    tiny_close(&t);
    return worst;
}

static void test_grad_check(void) {
    static const struct {
        const char *arch, *type;
        float drop;
    } cases[] = {{"llama", "f32", 0},    {"qwen2", "f32", 0},  {"qwen3", "f32", 0},
                 {"llama", "f32", 0.3f}, {"llama", "q8_0", 0}, {"qwen3", "q4_k", 0.1f}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double w = grad_check(cases[i].arch, cases[i].type, cases[i].drop);
        CHECKF(w < 2e-3, "%s %s dropout %g: worst relative error %.3g", cases[i].arch, cases[i].type, cases[i].drop, w);
        if (getenv("CUMULO_TEST_VERBOSE"))
            fprintf(stderr, "  %s %s dropout %g: worst %.3g\n", cases[i].arch, cases[i].type, cases[i].drop, w);
    }
}

static void test_refuses(void) {
    tiny t;
    if (tiny_open(&t, "gemma3", "f32")) {
        CHECK(0);
        return;
    }
    cm_tadapter *ad = NULL;
    int rc = cm_tadapter_new(&ad, &t.m, 4, 8, CM_TRAIN_TARGETS_ALL, 1, errbuf, sizeof errbuf);
    CHECK(rc == CM_EUNSUPPORTED && strstr(errbuf, "not gemma3"));
    tiny_close(&t);
    unsigned tg = 0;
    CHECK(cm_train_targets_parse("attn_q,ffn_down", &tg, errbuf, sizeof errbuf) == 0 &&
          tg == ((1u << CM_LORA_Q) | (1u << CM_LORA_DOWN)));
    CHECK(cm_train_targets_parse("attn_q,bogus", &tg, errbuf, sizeof errbuf) == CM_EINVAL && strstr(errbuf, "'bogus'"));
}

/* The training forward's adapter is the inference adapter: same logits
 * (the F32 model's cm_forward with the written adapter loaded by lora.c). */
static void test_matches_inference(void) {
    tiny t;
    if (tiny_open(&t, "qwen2", "f32")) {
        CHECK(0);
        return;
    }
    cm_tadapter *ad = NULL;
    cm_trainer *tr = NULL;
    CHECK(cm_tadapter_new(&ad, &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 3, errbuf, sizeof errbuf) == 0);
    CHECK(cm_trainer_new(&tr, &t.m, ad, T, NULL, errbuf, sizeof errbuf) == 0);
    if (!ad || !tr) goto out;
    cm_rng rng;
    cm_rng_seed(&rng, 4);
    for (size_t i = 0; i < ad->n_params; i++) ad->w[i] += 0.1f * cm_rng_normal(&rng);
    /* reference: our loss from cm_forward's logits with lora.c applying the written file */
    cm_buf buf;
    cm_buf_init(&buf);
    cm_gguf ga;
    cm_lora *l = cm_lora_new(&t.m);
    int rc = cm_tadapter_write(ad, NULL, &buf, errbuf, sizeof errbuf);
    if (!rc) rc = cm_gguf_parse(&ga, (const uint8_t *)buf.data, buf.len, errbuf, sizeof errbuf);
    if (!rc) {
        rc = cm_lora_add(l, &ga, 1.0f, errbuf, sizeof errbuf);
        cm_gguf_close(&ga);
    }
    CHECKF(rc == 0, "%s", errbuf);
    double ref = 0, ref0 = 0;
    for (int with = 0; with < 2 && !rc; with++) {
        cm_ctx *c = NULL;
        cm_kv kv;
        rc = cm_kv_init(&kv, &t.m, 0, t.m.hp.n_layer, cm_slice_full(&t.m), 16, errbuf, sizeof errbuf);
        if (!rc && !(c = cm_ctx_new(&t.m, T, 16, NULL, errbuf, sizeof errbuf))) rc = CM_ENOMEM;
        CHECKF(rc == 0, "%s", errbuf);
        if (rc) break;
        if (with) cm_ctx_set_lora(c, l);
        int32_t pos[T], seq[T];
        int8_t lg[T];
        for (int i = 0; i < T; i++) pos[i] = i, seq[i] = 0, lg[i] = 1;
        const int V = t.m.hp.n_vocab;
        float *logits = cm_malloc((size_t)T * V * sizeof(float));
        cm_kv *kvs[1] = {&kv};
        cm_batch b = {.n = T, .tokens = TOK, .pos = pos, .seq = seq, .logits = lg};
        cm_forward_args fa = {.layer_first = 0,
                              .layer_last = t.m.hp.n_layer,
                              .slice = cm_slice_full(&t.m),
                              .kvs = kvs,
                              .n_kvs = 1,
                              .out_logits = logits};
        CHECK(cm_forward(c, &b, &fa, errbuf, sizeof errbuf) == 0);
        double s = 0;
        for (int i = 0; i < T; i++) {
            if (TGT[i] < 0) continue;
            const float *x = logits + (size_t)i * V;
            float mx = x[0];
            for (int v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
            double z = 0;
            for (int v = 0; v < V; v++) z += exp((double)(x[v] - mx));
            s += log(z) + mx - x[TGT[i]];
        }
        *(with ? &ref : &ref0) = s / 6;
        cm_free(logits);
        cm_ctx_free(c);
        cm_kv_release(&kv);
    }
    cm_lora_free(l);
    cm_buf_release(&buf);
    double ours = loss_of(tr, 0);
    CHECKF(fabs(ours - ref) < 1e-4 * fabs(ref), "training loss %.7f, inference with the adapter %.7f", ours, ref);
    CHECKF(fabs(ref - ref0) > 1e-3, "the adapter changes nothing (%.7f vs %.7f)", ref, ref0);
out:
    cm_trainer_free(tr);
    cm_tadapter_free(ad);
    tiny_close(&t);
}

/* Threads split the matmuls so that every output has one owner: the loss
 * and every gradient are the same bits with 1, 2 and 3 threads. */
static void test_threads(void) {
    tiny t;
    if (tiny_open(&t, "qwen3", "q8_0")) {
        CHECK(0);
        return;
    }
    cm_tadapter *ad = NULL;
    CHECK(cm_tadapter_new(&ad, &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 2, errbuf, sizeof errbuf) == 0);
    float *g1 = ad ? cm_malloc(ad->n_params * sizeof(float)) : NULL;
    double l1 = 0;
    for (int nth = 1; ad && g1 && nth <= 3; nth++) {
        for (size_t i = 0; i < ad->n_params; i++) ad->g[i] = 0, ad->w[i] += nth == 1 ? 0.01f * (float)(i % 7) : 0;
        cm_pool *pool = nth > 1 ? cm_pool_new(nth) : NULL;
        cm_trainer *tr = NULL;
        CHECK(cm_trainer_new(&tr, &t.m, ad, T, pool, errbuf, sizeof errbuf) == 0);
        int n;
        double l = tr ? cm_train_window(tr, TOK, TGT, T, true, 0.5f, 0.2f, 3, &n) : -1;
        if (nth == 1) {
            l1 = l;
            memcpy(g1, ad->g, ad->n_params * sizeof(float));
        } else {
            CHECKF(l == l1, "%d threads: loss %.17g vs %.17g", nth, l, l1);
            CHECKF(!memcmp(g1, ad->g, ad->n_params * sizeof(float)), "%d threads: other gradient bits", nth);
        }
        cm_trainer_free(tr);
        cm_pool_free(pool);
    }
    cm_free(g1);
    cm_tadapter_free(ad);
    tiny_close(&t);
}

/* A pipeline of stages (cm_trainer_new_range over adapter slices, the
 * pieces cm_train_fwd / head / back chained as the cluster chains them)
 * gives the loss, the gradients and, after AdamW on each slice, the
 * parameters of one trainer bit for bit: 4 layers as [0,1) [1,3) [3,4). */
static void test_stages(void) {
    tiny t;
    g_layers = 4;
    int rc = tiny_open(&t, "qwen3", "q8_0");
    g_layers = 2;
    if (rc) {
        CHECK(0);
        return;
    }
    enum { S = 3 };
    const int cut[S + 1] = {0, 1, 3, 4};
    cm_tadapter *ad = NULL, *sl[S] = {0};
    cm_trainer *tr = NULL, *st[S] = {0};
    size_t off[S], n[S];
    CHECK(cm_tadapter_new(&ad, &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 2, errbuf, sizeof errbuf) == 0);
    if (!ad) goto out;
    for (size_t i = 0; i < ad->n_params; i++) ad->w[i] += 0.01f * (float)(i % 7); /* B != 0 */
    CHECK(cm_trainer_new(&tr, &t.m, ad, T, NULL, errbuf, sizeof errbuf) == 0);
    size_t covered = 0;
    for (int k = 0; k < S; k++) {
        cm_tadapter_span(ad, cut[k], cut[k + 1], &off[k], &n[k]);
        CHECK(off[k] == covered);
        covered += n[k];
        CHECK(cm_tadapter_new_range(&sl[k], &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, cut[k], cut[k + 1], errbuf,
                                    sizeof errbuf) == 0);
        CHECK(sl[k] && sl[k]->n_params == n[k]);
        if (!sl[k] || sl[k]->n_params != n[k]) goto out;
        memcpy(sl[k]->w, ad->w + off[k], n[k] * sizeof(float));
        CHECK(cm_trainer_new_range(&st[k], &t.m, sl[k], cut[k], cut[k + 1], T, NULL, errbuf, sizeof errbuf) == 0);
        if (!st[k]) goto out;
    }
    CHECK(covered == ad->n_params);
    for (int rep = 0; rep < 2; rep++) { /* two windows and two steps: the moments too */
        int n1, n2;
        const double l1 = cm_train_window(tr, TOK, TGT, T, true, 0.25f, 0.2f, 3 + (uint64_t)rep, &n1);
        static float x[T * 64], dx[T * 64];
        for (int k = 0; k < S; k++) {
            cm_train_fwd(st[k], TOK, x, T, 0.2f, 3 + (uint64_t)rep);
            memcpy(x, cm_train_out(st[k]), sizeof x);
        }
        const double l2 = cm_train_head(st[S - 1], TGT, true, 0.25f, &n2);
        for (int k = S - 1; k >= 0; k--) {
            cm_train_back(st[k], k == S - 1 ? NULL : x, dx);
            memcpy(x, dx, sizeof x);
        }
        CHECKF(l1 == l2 && n1 == n2, "loss %.17g vs the stages' %.17g", l1, l2);
        for (int k = 0; k < S; k++) {
            CHECKF(!memcmp(ad->g + off[k], sl[k]->g, n[k] * sizeof(float)), "stage %d: other gradient bits", k);
            cm_tadapter_adamw(sl[k], 0.01f, 0.9f, 0.999f, 1e-8f, 0.01f);
        }
        cm_tadapter_adamw(ad, 0.01f, 0.9f, 0.999f, 1e-8f, 0.01f);
        for (int k = 0; k < S; k++)
            CHECKF(!memcmp(ad->w + off[k], sl[k]->w, n[k] * sizeof(float)) &&
                       !memcmp(ad->m2 + off[k], sl[k]->m2, n[k] * sizeof(float)),
                   "stage %d: other parameter bits after AdamW", k);
    }
out:
    for (int k = 0; k < S; k++) {
        cm_trainer_free(st[k]);
        cm_tadapter_free(sl[k]);
    }
    cm_trainer_free(tr);
    cm_tadapter_free(ad);
    tiny_close(&t);
}

/* Data parallelism (coord_train_dp.c): each window's gradients start from
 * zero and join ad->g at the end of its backward, so two replicas that
 * each run some of a step's windows, taking every window's gradients out
 * and adding them in window order, give one trainer's gradient bits. */
static void test_replicas(void) {
    tiny t;
    if (tiny_open(&t, "llama", "q8_0")) {
        CHECK(0);
        return;
    }
    enum { W = 3 };
    cm_tadapter *ad = NULL, *rp[2] = {0};
    cm_trainer *tr = NULL, *rt[2] = {0};
    float *sum = NULL, *wg[W] = {0};
    CHECK(cm_tadapter_new(&ad, &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 5, errbuf, sizeof errbuf) == 0);
    if (!ad) goto out;
    for (size_t i = 0; i < ad->n_params; i++) ad->w[i] += 0.01f * (float)(i % 5); /* B != 0 */
    CHECK(cm_trainer_new(&tr, &t.m, ad, T, NULL, errbuf, sizeof errbuf) == 0);
    sum = cm_calloc(ad->n_params, sizeof(float));
    for (int r = 0; r < 2; r++) {
        CHECK(cm_tadapter_new(&rp[r], &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 5, errbuf, sizeof errbuf) == 0);
        if (!rp[r]) goto out;
        memcpy(rp[r]->w, ad->w, ad->n_params * sizeof(float));
        CHECK(cm_trainer_new(&rt[r], &t.m, rp[r], T, NULL, errbuf, sizeof errbuf) == 0);
    }
    for (int k = 0; k < W; k++) wg[k] = cm_malloc(ad->n_params * sizeof(float));
    if (!tr || !sum || !rt[0] || !rt[1] || !wg[0] || !wg[1] || !wg[2]) goto out;
    int nt;
    for (int k = 0; k < W; k++)
        cm_train_window(tr, TOK, TGT, T, true, 0.1f + 0.3f * (float)k, 0.2f, 7 + (uint64_t)k, &nt);
    for (int k = 0; k < W; k++) { /* replica 0 takes windows 0 and 1, replica 1 window 2 */
        cm_tadapter *a = rp[k < 2 ? 0 : 1];
        cm_train_window(rt[k < 2 ? 0 : 1], TOK, TGT, T, true, 0.1f + 0.3f * (float)k, 0.2f, 7 + (uint64_t)k, &nt);
        memcpy(wg[k], a->g, ad->n_params * sizeof(float));
        memset(a->g, 0, ad->n_params * sizeof(float));
    }
    for (int k = 0; k < W; k++)
        for (size_t i = 0; i < ad->n_params; i++) sum[i] += wg[k][i];
    CHECKF(!memcmp(sum, ad->g, ad->n_params * sizeof(float)), "%s",
           "the replicas' windows summed in order: other bits");
out:
    for (int k = 0; k < W; k++) cm_free(wg[k]);
    for (int r = 0; r < 2; r++) {
        cm_trainer_free(rt[r]);
        cm_tadapter_free(rp[r]);
    }
    cm_free(sum);
    cm_trainer_free(tr);
    cm_tadapter_free(ad);
    tiny_close(&t);
}

/* cm_train_save / cm_train_restore (coord_train.c's stage 0 one window
 * ahead): window B's forward between window A's forward and backward
 * changes no bit of A's loss and gradients, nor of B's after. */
static void test_ahead(void) {
    tiny t;
    if (tiny_open(&t, "qwen2", "f32")) {
        CHECK(0);
        return;
    }
    static const int32_t TOK2[T] = {3, 41, 78, 2, 13, 151, 65};
    cm_tadapter *a1 = NULL, *a2 = NULL;
    cm_trainer *t1 = NULL, *t2 = NULL;
    cm_train_saved sv[2] = {{0}};
    CHECK(cm_tadapter_new(&a1, &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 9, errbuf, sizeof errbuf) == 0);
    CHECK(cm_tadapter_new(&a2, &t.m, 4, 8.0f, CM_TRAIN_TARGETS_ALL, 9, errbuf, sizeof errbuf) == 0);
    if (!a1 || !a2) goto out;
    for (size_t i = 0; i < a1->n_params; i++) a1->w[i] = a2->w[i] = a1->w[i] + 0.01f * (float)(i % 3);
    CHECK(cm_trainer_new(&t1, &t.m, a1, T, NULL, errbuf, sizeof errbuf) == 0);
    CHECK(cm_trainer_new(&t2, &t.m, a2, T, NULL, errbuf, sizeof errbuf) == 0);
    if (!t1 || !t2) goto out;
    for (int i = 0; i < 2; i++) sv[i].xs = cm_malloc(cm_train_saved_floats(t2) * sizeof(float));
    if (!sv[0].xs || !sv[1].xs) goto out;
    int n1, n2;
    const double la = cm_train_window(t1, TOK, TGT, T, true, 0.5f, 0.25f, 11, &n1);
    const double lb = cm_train_window(t1, TOK2, TGT, T - 2, true, 0.5f, 0.25f, 12, &n1);
    cm_train_fwd(t2, TOK, NULL, T, 0.25f, 11);
    cm_train_save(t2, &sv[0]);
    cm_train_fwd(t2, TOK2, NULL, T - 2, 0.25f, 12);
    cm_train_save(t2, &sv[1]);
    cm_train_restore(t2, &sv[0]);
    const double la2 = cm_train_head(t2, TGT, true, 0.5f, &n2);
    cm_train_back(t2, NULL, NULL);
    cm_train_restore(t2, &sv[1]);
    const double lb2 = cm_train_head(t2, TGT, true, 0.5f, &n2);
    cm_train_back(t2, NULL, NULL);
    CHECKF(la == la2 && lb == lb2, "losses %.17g %.17g vs %.17g %.17g", la, lb, la2, lb2);
    CHECKF(!memcmp(a1->g, a2->g, a1->n_params * sizeof(float)), "%s", "one window ahead: other gradient bits");
out:
    cm_free(sv[0].xs);
    cm_free(sv[1].xs);
    cm_trainer_free(t1);
    cm_trainer_free(t2);
    cm_tadapter_free(a1);
    cm_tadapter_free(a2);
    tiny_close(&t);
}

static void test_adamw(void) {
    tiny t;
    if (tiny_open(&t, "llama", "f32")) {
        CHECK(0);
        return;
    }
    cm_tadapter *ad = NULL;
    CHECK(cm_tadapter_new(&ad, &t.m, 2, 4.0f, 1u << CM_LORA_Q, 1, errbuf, sizeof errbuf) == 0);
    if (ad) {
        float w0 = ad->w[0];
        ad->g[0] = 0.5f;
        cm_tadapter_adamw(ad, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f);
        /* first step: m/(1-b1) = g, v/(1-b2) = g^2, so the update is lr (sign(g) + wd w) */
        CHECKF(fabsf(ad->w[0] - (w0 - 0.01f * (1.0f + 0.1f * w0))) < 1e-6f, "%g", ad->w[0]);
        CHECK(ad->g[0] == 0 && ad->step == 1);
    }
    cm_tadapter_free(ad);
    tiny_close(&t);
}

/* The loss flags: prompt tokens off, completion and EOS on; in a chat, only
 * the assistant turns (their text and the template's end of turn). */
static void test_data_masks(void) {
    cm_tokenizer *tok = NULL;
    cm_chat_template tpl;
    if (cm_tokenizer_open(&tok, t_shared("models/stories260K-f32.gguf"), errbuf, sizeof errbuf)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    CHECK(cm_chat_template_by_name(&tpl, "chatml", errbuf, sizeof errbuf) == 0);
    cm_chat_opts co = {.tokenizer_adds_bos = cm_tokenizer_add_bos(tok), .bos = "<s>", .eos = "</s>"};
    const char *jl =
        "{\"prompt\": \"the cat\", \"completion\": \" sat down\"}\n"
        "\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"},"
        " {\"role\": \"user\", \"content\": \"and\"}, {\"role\": \"assistant\", \"content\": \"bye\"}]}\n";
    cm_tdata d;
    int rc = cm_tdata_parse(&d, (const uint8_t *)jl, strlen(jl), "t.jsonl", tok, &tpl, &co, errbuf, sizeof errbuf);
    CHECKF(rc == 0, "%s", errbuf);
    if (!rc) {
        CHECK(d.n_ex == 2);
        /* each example's loss-flagged tokens, decoded */
        const char *want[2] = {" sat down", "hello<|im_end|>\nbye<|im_end|>\n"};
        for (int e = 0; e < 2 && e < d.n_ex; e++) {
            cm_token ids[256];
            size_t n = 0;
            for (int64_t i = d.ex_off[e]; i < d.ex_off[e + 1] && n < 256; i++)
                if (d.loss[i] && d.tok[i] != cm_tokenizer_eos(tok)) ids[n++] = d.tok[i];
            cm_buf b;
            cm_buf_init(&b);
            cm_tokenizer_decode(tok, ids, n, 0, &b, errbuf, sizeof errbuf);
            cm_buf_append(&b, "", 1);
            CHECKF(b.data && strstr(b.data, want[e] + (e == 0)) && strlen(b.data) <= strlen(want[e]) + 1,
                   "example %d: loss on '%s', want '%s'", e, b.data ? b.data : "", want[e]);
            cm_buf_release(&b);
        }
        CHECK(d.loss[d.ex_off[1] - 1] == 1 && d.tok[d.ex_off[1] - 1] == cm_tokenizer_eos(tok)); /* EOS learned */
        CHECK(d.loss[0] == 0);                                                                  /* BOS not */
        cm_twin *w = NULL;
        int nw = 0, ex[2] = {0, 1};
        CHECK(cm_tdata_pack(&d, ex, 2, 8, &w, &nw, errbuf, sizeof errbuf) == 0);
        /* every loss token is the target of exactly one window */
        int64_t targets = 0, loss_tok = 0;
        int32_t in[8], tg[8];
        for (int i = 0; i < nw; i++) {
            CHECK(w[i].len >= 2 && w[i].len <= 9);
            int T = cm_twin_fill(&d, w[i], in, tg);
            for (int j = 0; j < T; j++) targets += tg[j] >= 0;
        }
        for (int64_t i = 0; i < d.n_tok; i++) loss_tok += d.loss[i];
        CHECKF(targets == loss_tok, "%d windows have %lld targets, the data %lld loss tokens", nw, (long long)targets,
               (long long)loss_tok);
        cm_free(w);
        cm_tdata_release(&d);
    }
    /* a bad line names itself */
    const char *bad = "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"completion\": \"x\"}\n";
    CHECK(cm_tdata_parse(&d, (const uint8_t *)bad, strlen(bad), "b.jsonl", tok, NULL, &co, errbuf, sizeof errbuf) ==
          CM_EFORMAT);
    CHECKF(strstr(errbuf, "'b.jsonl' line 3: ") != NULL, "%s", errbuf);
    cm_tokenizer_free(tok);
}

int main(void) {
    RUN(test_data_masks);
    RUN(test_grad_check);
    RUN(test_refuses);
    RUN(test_threads);
    RUN(test_adamw);
    RUN(test_stages);
    RUN(test_replicas);
    RUN(test_ahead);
    RUN(test_matches_inference);
    TEST_END();
}
