/* test_sampler.c: the sampler chain (greedy, seeds, the drawn distribution,
 * what top-k/top-p/min-p exclude, the penalty formula, logprobs) and the
 * stop-string matcher, through sampler/sampler.h.
 *
 * Statistical checks use a fixed seed and many draws; each bound is 5
 * standard deviations of a binomial frequency, so a correct sampler fails one
 * with probability ~1e-6 per check, while a wrong distribution (e.g. top-p
 * keeping one token too many, temperature applied twice) misses by far more. */
#include "test.h"

#include "sampler/sampler.h"

static cm_sampler_params plain(void) {
    cm_sampler_params p;
    cm_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1234;
    return p;
}

static cm_sampler *mk(const cm_sampler_params *p, int32_t n) {
    char err[128] = "";
    cm_sampler *s = cm_sampler_new(p, n, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    return s;
}

/* Draw N tokens and count them; logits stay fixed, nothing is accepted. */
static void histogram(cm_sampler *s, const float *logits, int32_t n, int N, int *hist) {
    memset(hist, 0, (size_t)n * sizeof *hist);
    for (int i = 0; i < N; i++) {
        int32_t id = cm_sampler_sample(s, logits, NULL);
        if (id >= 0 && id < n) hist[id]++;
    }
}

static bool freq_ok(int count, int N, double p) {
    double f = (double)count / N, sd = sqrt(p * (1 - p) / N);
    return fabs(f - p) <= 5 * sd + 1e-9;
}

static void test_defaults(void) {
    cm_sampler_params p;
    cm_sampler_params_default(&p);
    CHECK(p.temperature == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f);
    CHECK(p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.seed == CM_SAMPLER_SEED_RANDOM);
    char err[128];
    p.top_p = 1.5f;
    CHECK(cm_sampler_params_check(&p, err, sizeof err) == CM_EINVAL && strstr(err, "top_p"));
    p.top_p = 0.9f;
    p.n_probs = CM_SAMPLER_MAX_PROBS + 1;
    CHECK(cm_sampler_new(&p, 10, err, sizeof err) == NULL && strstr(err, "n_probs"));
    p.n_probs = 0;
    CHECK(cm_sampler_new(&p, 0, err, sizeof err) == NULL);
    /* A random seed is drawn, reported, and not the sentinel. */
    cm_sampler *s = mk(&p, 10);
    CHECK(cm_sampler_seed(s) != CM_SAMPLER_SEED_RANDOM);
    CHECK(cm_sampler_get_params(s)->seed == cm_sampler_seed(s));
    cm_sampler_free(s);
    cm_sampler_free(NULL);
}

static void test_greedy(void) {
    float l[6] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f, NAN};
    cm_sampler_params p = plain();
    p.temperature = 0.0f;
    cm_sampler *s = mk(&p, 6);
    for (int i = 0; i < 5; i++) CHECK(cm_sampler_sample(s, l, NULL) == 1); /* tie 1/3: lowest id */
    cm_sampler_free(s);
    p = plain();
    p.top_k = 1;
    s = mk(&p, 6);
    for (int i = 0; i < 5; i++) CHECK(cm_sampler_sample(s, l, NULL) == 1);
    cm_sampler_free(s);
    /* Greedy draws no random numbers: interleaving greedy samplers changes nothing. */
    float all_bad[3] = {NAN, -INFINITY, NAN};
    p = plain();
    s = mk(&p, 3);
    CHECK(cm_sampler_sample(s, all_bad, NULL) == 0);
    /* +inf is no candidate either; the first largest finite logit after
     * non-finite ones (greedy's one pass over the logits, sampler.c) */
    float odd[6] = {-INFINITY, NAN, INFINITY, 3.0f, -2.0f, 3.0f};
    cm_sampler_free(s);
    p.temperature = 0.0f;
    s = mk(&p, 6);
    CHECK(cm_sampler_sample(s, odd, NULL) == 3);
    cm_sampler_accept(s, 3); /* a history with penalties off: still the plain argmax */
    CHECK(cm_sampler_sample(s, odd, NULL) == 3);
    cm_sampler_free(s);
    /* Greedy on a big vocabulary with the maximum at the end. */
    enum { N = 50000 };
    static float big[N];
    for (int i = 0; i < N; i++) big[i] = (float)(i % 1000) * 0.001f;
    big[N - 1] = 5.0f;
    p = plain();
    p.temperature = -1.0f;
    s = mk(&p, N);
    CHECK(cm_sampler_sample(s, big, NULL) == N - 1);
    cm_sampler_free(s);
}

/* A stream resumed on another sampler (the new last stage after a re-plan):
 * same parameters, the accepted history replayed, cm_sampler_set_pos(k):
 * its next ids equal the undisturbed sampler's. Without set_pos (draw 0
 * again, the old behaviour) the continuation differs. Greedy samples count
 * too, so pos is always the caller's token count. */
static void test_resume_pos(void) {
    enum { N = 500, STEPS = 120, K = 47, HIST = 64 };
    static float l[STEPS][N];
    cm_rng r;
    cm_rng_seed(&r, 99);
    for (int t = 0; t < STEPS; t++)
        for (int i = 0; i < N; i++) l[t][i] = 1.5f * cm_rng_normal(&r);
    cm_sampler_params p;
    cm_sampler_params_default(&p);
    p.seed = 2024;
    p.repeat_penalty = 1.2f;
    p.repeat_last_n = HIST;
    cm_sampler *a = mk(&p, N);
    int32_t ids[STEPS];
    for (int t = 0; t < STEPS; t++) {
        ids[t] = cm_sampler_sample(a, l[t], NULL);
        cm_sampler_accept(a, ids[t]);
    }
    CHECK(cm_sampler_pos(a) == STEPS);
    cm_sampler *b = mk(&p, N), *c = mk(&p, N);
    for (int t = K - HIST < 0 ? 0 : K - HIST; t < K; t++) {
        cm_sampler_accept(b, ids[t]);
        cm_sampler_accept(c, ids[t]);
    }
    cm_sampler_set_pos(b, K);
    int same_b = 0, same_c = 0;
    for (int t = K; t < STEPS; t++) {
        int32_t x = cm_sampler_sample(b, l[t], NULL), y = cm_sampler_sample(c, l[t], NULL);
        same_b += x == ids[t];
        same_c += y == ids[t];
        cm_sampler_accept(b, ids[t]);
        cm_sampler_accept(c, ids[t]);
    }
    CHECKF(same_b == STEPS - K, "resumed at %d: %d of %d ids equal", K, same_b, STEPS - K);
    CHECKF(same_c < (STEPS - K) * 3 / 4, "restarted from draw 0: %d of %d ids equal (should differ)", same_c,
           STEPS - K);
    /* Greedy samples advance pos as well. */
    cm_sampler_params g = p;
    g.temperature = 0;
    cm_sampler *d = mk(&g, N);
    cm_sampler_sample(d, l[0], NULL);
    cm_sampler_sample(d, l[1], NULL);
    CHECK(cm_sampler_pos(d) == 2);
    cm_sampler_reset(d);
    CHECK(cm_sampler_pos(d) == 0);
    cm_sampler_free(a);
    cm_sampler_free(b);
    cm_sampler_free(c);
    cm_sampler_free(d);
}

static void test_seed_determinism(void) {
    enum { N = 1000, STEPS = 300 };
    static float l[N];
    cm_rng r;
    cm_rng_seed(&r, 7);
    for (int i = 0; i < N; i++) l[i] = 2.0f * cm_rng_normal(&r);
    cm_sampler_params p;
    cm_sampler_params_default(&p); /* the full default chain */
    p.seed = 42;
    p.repeat_penalty = 1.1f;
    p.presence_penalty = 0.2f;
    cm_sampler *a = mk(&p, N), *b = mk(&p, N);
    p.seed = 43;
    cm_sampler *c = mk(&p, N);
    int32_t ia[STEPS];
    int same_ab = 0, same_ac = 0;
    for (int t = 0; t < STEPS; t++) {
        int32_t x = cm_sampler_sample(a, l, NULL), y = cm_sampler_sample(b, l, NULL);
        int32_t z = cm_sampler_sample(c, l, NULL);
        ia[t] = x;
        same_ab += x == y;
        same_ac += x == z;
        cm_sampler_accept(a, x);
        cm_sampler_accept(b, y);
        cm_sampler_accept(c, z);
    }
    CHECK(same_ab == STEPS);
    CHECKF(same_ac < STEPS, "a different seed gave the same %d ids", STEPS);
    /* reset = as new: the same sequence again */
    cm_sampler_reset(a);
    int again = 0;
    for (int t = 0; t < STEPS; t++) {
        int32_t x = cm_sampler_sample(a, l, NULL);
        again += x == ia[t];
        cm_sampler_accept(a, x);
    }
    CHECK(again == STEPS);
    cm_sampler_free(a);
    cm_sampler_free(b);
    cm_sampler_free(c);
}

static void test_distribution(void) {
    /* logits = ln p (+ a constant, which softmax ignores) */
    const double pr[5] = {0.5, 0.25, 0.125, 0.0625, 0.0625};
    float l[5];
    for (int i = 0; i < 5; i++) l[i] = (float)log(pr[i]) + 3.0f;
    enum { DRAWS = 200000 };
    int h[5];
    cm_sampler_params p = plain();
    cm_sampler *s = mk(&p, 5);
    histogram(s, l, 5, DRAWS, h);
    for (int i = 0; i < 5; i++) CHECKF(freq_ok(h[i], DRAWS, pr[i]), "T=1 id %d: %d/%d vs %g", i, h[i], DRAWS, pr[i]);
    cm_sampler_free(s);
    /* T = 0.5 squares the probabilities: p ~ pr^2 */
    double q[5], z = 0;
    for (int i = 0; i < 5; i++) z += q[i] = pr[i] * pr[i];
    p.temperature = 0.5f;
    s = mk(&p, 5);
    histogram(s, l, 5, DRAWS, h);
    for (int i = 0; i < 5; i++) CHECKF(freq_ok(h[i], DRAWS, q[i] / z), "T=0.5 id %d: %d vs %g", i, h[i], q[i] / z);
    cm_sampler_free(s);
    /* T = 2 flattens: p ~ sqrt(pr) */
    z = 0;
    for (int i = 0; i < 5; i++) z += q[i] = sqrt(pr[i]);
    p.temperature = 2.0f;
    s = mk(&p, 5);
    histogram(s, l, 5, DRAWS, h);
    for (int i = 0; i < 5; i++) CHECKF(freq_ok(h[i], DRAWS, q[i] / z), "T=2 id %d: %d vs %g", i, h[i], q[i] / z);
    cm_sampler_free(s);
}

static void test_filters_exclude(void) {
    /* p = 0.4 0.3 0.2 0.1 placed at scattered ids among 200 ids at -inf-ish */
    enum { N = 200, DRAWS = 100000 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = -30.0f - (float)(i % 7);
    const int ids[4] = {150, 3, 77, 12};
    const double pr[4] = {0.4, 0.3, 0.2, 0.1};
    for (int j = 0; j < 4; j++) l[ids[j]] = (float)log(pr[j]);
    int h[N];

    /* top-k 3: only the three best ever, renormalised 4:3:2 */
    cm_sampler_params p = plain();
    p.top_k = 3;
    cm_sampler *s = mk(&p, N);
    histogram(s, l, N, DRAWS, h);
    int others = DRAWS - h[150] - h[3] - h[77];
    CHECKF(others == 0, "top-k let %d excluded draws through", others);
    CHECK(freq_ok(h[150], DRAWS, 0.4 / 0.9) && freq_ok(h[3], DRAWS, 0.3 / 0.9) && freq_ok(h[77], DRAWS, 0.2 / 0.9));
    cm_sampler_free(s);

    /* top-p 0.65: 0.4 < 0.65 <= 0.7, so exactly {150, 3} */
    p = plain();
    p.top_p = 0.65f;
    s = mk(&p, N);
    histogram(s, l, N, DRAWS, h);
    CHECKF(h[150] + h[3] == DRAWS, "top-p let %d excluded draws through", DRAWS - h[150] - h[3]);
    CHECK(freq_ok(h[150], DRAWS, 0.4 / 0.7));
    cm_sampler_free(s);
    /* top-p 0.35: the best alone */
    p.top_p = 0.35f;
    s = mk(&p, N);
    histogram(s, l, N, 2000, h);
    CHECK(h[150] == 2000);
    cm_sampler_free(s);

    /* min-p 0.3: threshold 0.3 * 0.4 = 0.12 keeps 0.4, 0.3, 0.2 but not 0.1 */
    p = plain();
    p.min_p = 0.3f;
    s = mk(&p, N);
    histogram(s, l, N, DRAWS, h);
    CHECKF(h[12] == 0 && h[150] + h[3] + h[77] == DRAWS, "min-p: 0.1 drawn %d times", h[12]);
    CHECK(freq_ok(h[77], DRAWS, 0.2 / 0.9));
    cm_sampler_free(s);
    /* min-p is applied before temperature: a high temperature does not let 12 back in */
    p.temperature = 5.0f;
    s = mk(&p, N);
    histogram(s, l, N, DRAWS, h);
    CHECK(h[12] == 0 && h[150] + h[3] + h[77] == DRAWS);
    cm_sampler_free(s);

    /* top-p over a nucleus larger than the first partial sort (256): 1000
     * equal tokens at ids 0, 5, 10, ... and 4000 at -5. Sorted by (logit, id)
     * the nucleus is the first m = ceil(0.9 Z) of the equal ones. */
    {
        enum { NB = 5000 };
        static float lb[NB];
        static int hb[NB];
        for (int i = 0; i < NB; i++) lb[i] = i % 5 == 0 ? 0.0f : -5.0f;
        double Z = 1000 + 4000 * exp(-5.0);
        int m = (int)ceil(0.9 * Z);
        p = plain();
        p.top_p = 0.9f;
        s = mk(&p, NB);
        histogram(s, lb, NB, 5000, hb);
        int outside = 0, max_id = 0;
        for (int i = 0; i < NB; i++)
            if (hb[i]) {
                outside += i % 5 != 0 || i / 5 >= m;
                if (i > max_id) max_id = i;
            }
        CHECKF(outside == 0, "top-p drew %d ids outside the nucleus of %d", outside, m);
        CHECKF(max_id / 5 >= m - 10, "top-p nucleus too small: largest id %d, m %d", max_id, m);
        cm_sampler_free(s);
    }

    /* the chain: top-k 3 then top-p 0.8 of the renormalised (0.44, 0.33, 0.22):
     * 0.44 < 0.8 <= 0.78? no: 0.444 + 0.333 = 0.778 < 0.8, so all three stay;
     * top-p 0.7 then keeps two. */
    p = plain();
    p.top_k = 3;
    p.top_p = 0.7f;
    s = mk(&p, N);
    histogram(s, l, N, DRAWS, h);
    CHECK(h[150] + h[3] == DRAWS);
    cm_sampler_free(s);
    p.top_p = 0.8f;
    s = mk(&p, N);
    histogram(s, l, N, DRAWS, h);
    CHECK(h[77] > 0 && h[150] + h[3] + h[77] == DRAWS);
    cm_sampler_free(s);
}

static void test_penalties(void) {
    enum { N = 100 };
    cm_sampler_params p = plain();
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    p.repeat_last_n = 4;
    cm_sampler *s = mk(&p, N);
    /* history 5 7 5 9 5: the window of 4 holds 7 5 9 5 */
    const int32_t hist[5] = {5, 7, 5, 9, 5};
    for (int i = 0; i < 5; i++) cm_sampler_accept(s, hist[i]);
    cm_sampler_accept(s, -3); /* ignored */
    cm_sampler_accept(s, N);  /* ignored */
    float l[N], want[N];
    cm_rng r;
    cm_rng_seed(&r, 3);
    for (int i = 0; i < N; i++) want[i] = l[i] = 3.0f * cm_rng_normal(&r);
    l[5] = want[5] = 2.0f;
    l[7] = want[7] = -1.5f;
    l[9] = want[9] = 0.0f;
    /* the formula of sampler.h, by hand: counts in the window 5:2, 7:1, 9:1 */
    want[5] = 2.0f / 1.3f - (2 * 0.25f + 0.5f);
    want[7] = -1.5f * 1.3f - (1 * 0.25f + 0.5f);
    want[9] = 0.0f * 1.3f - (1 * 0.25f + 0.5f);
    cm_sampler_penalize(s, l);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += fabsf(l[i] - want[i]) > 1e-6f;
    CHECKF(bad == 0, "%d logits differ from the formula (5: %g vs %g)", bad, (double)l[5], (double)want[5]);

    /* The sampling path uses the same penalised logits: with greedy, a token
     * that leads by less than its penalty loses. */
    cm_sampler_params g = plain();
    g.temperature = 0.0f;
    g.presence_penalty = 1.0f;
    cm_sampler *gs = mk(&g, 3);
    float a[3] = {1.0f, 1.5f, 0.8f};
    CHECK(cm_sampler_sample(gs, a, NULL) == 1);
    cm_sampler_accept(gs, 1);
    CHECK(cm_sampler_sample(gs, a, NULL) == 0); /* 1.5 - 1 = 0.5 < 1.0 */
    cm_sampler_accept(gs, 0);
    CHECK(cm_sampler_sample(gs, a, NULL) == 2); /* 0.8 beats 0.5 and 0.0 */
    cm_sampler_free(gs);

    /* ... and with a draw: presence 1 on id 0 divides its odds by e. */
    cm_sampler_params d = plain();
    d.presence_penalty = 1.0f;
    cm_sampler *ds = mk(&d, 2);
    cm_sampler_accept(ds, 0);
    float b[2] = {0.0f, 0.0f};
    int h[2];
    enum { DRAWS = 100000 };
    histogram(ds, b, 2, DRAWS, h);
    double p0 = 1.0 / (1.0 + exp(1.0));
    CHECKF(freq_ok(h[0], DRAWS, p0), "presence: %d/%d vs %g", h[0], DRAWS, p0);
    cm_sampler_free(ds);

    /* The window slides: after 4 more other tokens, 5 is no longer penalised. */
    for (int i = 0; i < 4; i++) cm_sampler_accept(s, 50 + i);
    float c[N];
    memcpy(c, want, sizeof c);
    c[5] = 2.0f;
    cm_sampler_penalize(s, c);
    CHECK(c[5] == 2.0f && c[50] != want[50]);
    /* reset forgets the history */
    cm_sampler_reset(s);
    memcpy(c, want, sizeof c);
    cm_sampler_penalize(s, c);
    CHECK(!memcmp(c, want, sizeof c));
    cm_sampler_free(s);
}

static void test_logprobs(void) {
    enum { N = 500 };
    float l[N];
    cm_rng r;
    cm_rng_seed(&r, 11);
    for (int i = 0; i < N; i++) l[i] = 2.5f * cm_rng_normal(&r);
    l[10] = l[20] = 9.0f; /* a tie at the top: lower id first */
    l[30] = -INFINITY;
    double mx = 9.0, sum = 0;
    for (int i = 0; i < N; i++)
        if (isfinite(l[i])) sum += exp(l[i] - mx);
    double lse = mx + log(sum);
    cm_sampler_params p;
    cm_sampler_params_default(&p);
    p.seed = 5;
    p.temperature = 0.3f; /* logprobs ignore the sampling temperature */
    p.n_probs = 5;
    p.repeat_penalty = 2.0f; /* ... and the penalties */
    cm_sampler *s = mk(&p, N);
    cm_sampler_accept(s, 10);
    cm_sample_info info;
    int32_t id = cm_sampler_sample(s, l, &info);
    CHECK(id >= 0 && id < N);
    CHECKF(fabs(info.logprob - (l[id] - lse)) < 1e-5, "chosen %d: %g vs %g", id, (double)info.logprob, l[id] - lse);
    CHECK(info.n_top == 5);
    CHECK(info.top[0].id == 10 && info.top[1].id == 20);
    CHECK(fabs(info.top[0].logprob - (9.0 - lse)) < 1e-5);
    for (int j = 1; j < info.n_top; j++) CHECK(info.top[j].logprob <= info.top[j - 1].logprob);
    /* the 5th is really the 5th largest */
    int above = 0;
    for (int i = 0; i < N; i++) above += isfinite(l[i]) && l[i] - lse > info.top[4].logprob + 1e-6;
    CHECK(above == 4);
    cm_sampler_free(s);
    /* n_probs larger than the vocabulary */
    p.n_probs = 8;
    s = mk(&p, 3);
    float t[3] = {0, 1, 2};
    cm_sampler_sample(s, t, &info);
    CHECK(info.n_top == 3 && info.top[0].id == 2 && info.top[2].id == 0);
    cm_sampler_free(s);
}

static void test_eog(void) {
    cm_sampler_params p = plain();
    cm_sampler *s = mk(&p, 100);
    char err[128];
    int32_t ids[2] = {2, 99};
    CHECK(cm_sampler_set_eog(s, ids, 2, err, sizeof err) == 0);
    CHECK(cm_sampler_is_eog(s, 2) && cm_sampler_is_eog(s, 99) && !cm_sampler_is_eog(s, 3));
    int32_t bad[1] = {100};
    CHECK(cm_sampler_set_eog(s, bad, 1, err, sizeof err) == CM_EINVAL);
    CHECK(cm_sampler_is_eog(s, 2)); /* a refused set leaves the old one */
    CHECK(cm_sampler_set_eog(s, NULL, 0, err, sizeof err) == 0 && !cm_sampler_is_eog(s, 2));
    cm_sampler_free(s);
}

/* ---- stop strings ---- */

/* Feed pieces; collect what is emitted; return the matched index or -1. */
static int run_stop(const char *const *stops, int n, const char *const *pieces, char *out, size_t cap) {
    char err[128] = "";
    cm_stop *m = cm_stop_new(stops, n, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m) return -2;
    size_t len = 0;
    int hit = -1;
    for (int i = 0; pieces[i]; i++) {
        const char *e;
        size_t el;
        int rc = cm_stop_feed(m, pieces[i], strlen(pieces[i]), &e, &el);
        if (hit >= 0) CHECK(rc == CM_ESTATE && el == 0);
        else if (rc >= 0) hit = rc;
        CHECK(len + el < cap);
        memcpy(out + len, e, el);
        len += el;
    }
    if (hit < 0) {
        const char *e;
        size_t el;
        cm_stop_flush(m, &e, &el);
        memcpy(out + len, e, el);
        len += el;
    }
    out[len] = 0;
    cm_stop_free(m);
    return hit;
}

static void test_stop_basic(void) {
    char out[256];
    const char *st[] = {"STOP"};
    const char *p1[] = {"hello ", "ST", "O", "P", " never", NULL};
    CHECK(run_stop(st, 1, p1, out, sizeof out) == 0 && !strcmp(out, "hello "));
    /* a false start is released once it cannot match any more */
    const char *p2[] = {"a ST", "OX b", NULL};
    CHECK(run_stop(st, 1, p2, out, sizeof out) == -1 && !strcmp(out, "a STOX b"));
    /* match inside one piece, text after it dropped */
    const char *p3[] = {"abcSTOPdef", NULL};
    CHECK(run_stop(st, 1, p3, out, sizeof out) == 0 && !strcmp(out, "abc"));
    /* the held tail is flushed at the end */
    const char *p4[] = {"xyz ST", NULL};
    CHECK(run_stop(st, 1, p4, out, sizeof out) == -1 && !strcmp(out, "xyz ST"));
    /* no stop strings: a pass-through */
    const char *p5[] = {"one ", "two", NULL};
    CHECK(run_stop(NULL, 0, p5, out, sizeof out) == -1 && !strcmp(out, "one two"));
    /* empty stop strings are refused */
    char err[64];
    const char *empty[] = {"x", ""};
    CHECK(cm_stop_new(empty, 2, err, sizeof err) == NULL && strstr(err, "empty"));
}

static void test_stop_holding(void) {
    /* what is emitted after each piece, step by step */
    const char *st[] = {"</s>"};
    cm_stop *m = cm_stop_new(st, 1, NULL, 0);
    const char *e;
    size_t el;
    CHECK(cm_stop_feed(m, "ab<", 3, &e, &el) == -1 && el == 2 && !memcmp(e, "ab", 2));
    CHECK(cm_stop_feed(m, "/", 1, &e, &el) == -1 && el == 0);
    CHECK(cm_stop_feed(m, "x", 1, &e, &el) == -1 && el == 3 && !memcmp(e, "</x", 3));
    CHECK(cm_stop_feed(m, "</", 2, &e, &el) == -1 && el == 0);
    CHECK(cm_stop_feed(m, "s>tail", 6, &e, &el) == 0 && el == 0);
    CHECK(cm_stop_feed(m, "more", 4, &e, &el) == CM_ESTATE && el == 0);
    cm_stop_flush(m, &e, &el);
    CHECK(el == 0);
    cm_stop_reset(m);
    CHECK(cm_stop_feed(m, "ok", 2, &e, &el) == -1 && el == 2);
    cm_stop_free(m);
}

static void test_stop_multi_overlap(void) {
    char out[256];
    /* two stop strings; the one that starts first wins */
    const char *st[] = {"World", "lo W"};
    const char *p1[] = {"Hel", "lo Wor", "ld", NULL};
    CHECK(run_stop(st, 2, p1, out, sizeof out) == 1 && !strcmp(out, "Hel"));
    /* overlapping prefixes: "aab" after "aaab" (self-overlap) */
    const char *st2[] = {"aab"};
    const char *p2[] = {"xa", "a", "a", "b!", NULL};
    CHECK(run_stop(st2, 1, p2, out, sizeof out) == 0 && !strcmp(out, "xa"));
    /* a shorter stop inside a longer one's prefix: "abcd" and "bc" */
    const char *st3[] = {"abcd", "bc"};
    const char *p3[] = {"zab", "c", "d", NULL};
    CHECK(run_stop(st3, 2, p3, out, sizeof out) == 1 && !strcmp(out, "za"));
    /* same start: the longer wins */
    const char *st4[] = {"ab", "abc"};
    const char *p4[] = {"xabc", NULL};
    CHECK(run_stop(st4, 2, p4, out, sizeof out) == 1 && !strcmp(out, "x"));
    /* stop string spread over many one-byte pieces */
    const char *st5[] = {"<|im_end|>"};
    const char *p5[] = {"Hi", "<", "|", "im", "_", "end", "|", ">", "junk", NULL};
    CHECK(run_stop(st5, 1, p5, out, sizeof out) == 0 && !strcmp(out, "Hi"));
    /* a big piece grows the buffer */
    static char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *p6[] = {big, "<|im_e", "nd|>", NULL};
    static char out2[6000];
    CHECK(run_stop(st5, 1, p6, out2, sizeof out2) == 0 && strlen(out2) == sizeof big - 1);
}

static void test_stop_utf8(void) {
    char out[256];
    /* "é" = C3 A9, "日本" = E6 97 A5 E6 9C AC; "€" = E2 82 AC */
    const char *st[] = {"\xE6\x9C\xAC"};
    cm_stop *m = cm_stop_new(st, 1, NULL, 0);
    const char *e;
    size_t el;
    /* an incomplete character is held even when it cannot start a stop */
    CHECK(cm_stop_feed(m, "caf\xC3", 4, &e, &el) == -1 && el == 3);
    CHECK(cm_stop_feed(m, "\xA9 ", 2, &e, &el) == -1 && el == 3 && !memcmp(e, "\xC3\xA9 ", 3));
    CHECK(cm_stop_feed(m, "\xE2\x82", 2, &e, &el) == -1 && el == 0);
    CHECK(cm_stop_feed(m, "\xAC\xE6\x97", 3, &e, &el) == -1 && el == 3 && !memcmp(e, "\xE2\x82\xAC", 3));
    CHECK(cm_stop_feed(m, "\xA5\xE6", 2, &e, &el) == -1 && el == 3 && !memcmp(e, "\xE6\x97\xA5", 3));
    CHECK(cm_stop_feed(m, "\x9C\xAC!", 3, &e, &el) == 0 && el == 0);
    cm_stop_free(m);
    /* a multi-byte stop string split between pieces, with text before it */
    const char *st2[] = {"\xE3\x80\x82\xE3\x80\x82"}; /* "。。" */
    const char *p2[] = {"ok\xE3\x80", "\x82\xE3", "\x80\x82rest", NULL};
    CHECK(run_stop(st2, 1, p2, out, sizeof out) == 0 && !strcmp(out, "ok"));
    /* a single "。" is released once the next character is not "。" */
    const char *p3[] = {"a\xE3\x80\x82", "b", NULL};
    CHECK(run_stop(st2, 1, p3, out, sizeof out) == -1 && !strcmp(out, "a\xE3\x80\x82"
                                                                      "b"));
}

int main(void) {
    RUN(test_defaults);
    RUN(test_greedy);
    RUN(test_seed_determinism);
    RUN(test_resume_pos);
    RUN(test_distribution);
    RUN(test_filters_exclude);
    RUN(test_penalties);
    RUN(test_logprobs);
    RUN(test_eog);
    RUN(test_stop_basic);
    RUN(test_stop_holding);
    RUN(test_stop_multi_overlap);
    RUN(test_stop_utf8);
    TEST_END();
}
