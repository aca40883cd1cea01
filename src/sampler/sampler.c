/*
 * sampler.c: the token sampler (penalties, top-k, top-p, min-p, temperature,
 * seeded draw) and the logprobs the OpenAI API reports. The chain and its
 * formulas are documented in sampler.h; this file must keep to them.
 *
 * All working memory is sized in cm_sampler_new; nothing here allocates per
 * token. It never reads a token's text: stop strings live in stop.c.
 */
#include "sampler/sampler.h"

#include "os/os.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REPEAT_LAST_N_MAX (1 << 20)

typedef struct cand {
    int32_t id;
    float logit;
} cand;

struct cm_sampler {
    cm_sampler_params p;
    uint64_t seed;
    int32_t n_vocab;
    uint64_t key; /* the seed, mixed: the draws are a function of (key, pos) */
    uint64_t pos; /* samples taken since new/reset (cm_sampler_pos) */

    cand *cand; /* [n_vocab] working set, rebuilt each call */

    /* Penalty history: a ring of the last repeat_last_n accepted ids, and how
     * often each id occurs in it (kept in step with the ring). */
    int32_t *ring;    /* [repeat_last_n] */
    int32_t ring_len; /* entries in use */
    int32_t ring_pos; /* next slot to write */
    int32_t *count;   /* [n_vocab] occurrences inside the ring */
    uint32_t *stamp;  /* [n_vocab] "already penalised this call" marks */
    uint32_t epoch;

    int32_t eog[CM_SAMPLER_MAX_EOG];
    int n_eog;
};

/* The splitmix64 finaliser: a bijection of 64 bits with good avalanche. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cm_sampler_params_default(cm_sampler_params *p) {
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = CM_SAMPLER_SEED_RANDOM;
    p->n_probs = 0;
}

int cm_sampler_params_check(const cm_sampler_params *p, char *err, size_t errlen) {
    if (!isfinite(p->temperature)) return cm_errf(err, errlen, CM_EINVAL, "temperature must be a finite number");
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return cm_errf(err, errlen, CM_EINVAL, "top_p must be in [0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return cm_errf(err, errlen, CM_EINVAL, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return cm_errf(err, errlen, CM_EINVAL, "repeat_penalty must be > 0, got %g", (double)p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > REPEAT_LAST_N_MAX)
        return cm_errf(err, errlen, CM_EINVAL, "repeat_last_n must be in [0, %d], got %d", REPEAT_LAST_N_MAX,
                       (int)p->repeat_last_n);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return cm_errf(err, errlen, CM_EINVAL, "presence/frequency penalties must be finite");
    if (p->n_probs < 0 || p->n_probs > CM_SAMPLER_MAX_PROBS)
        return cm_errf(err, errlen, CM_EINVAL, "n_probs must be in [0, %d], got %d", CM_SAMPLER_MAX_PROBS,
                       (int)p->n_probs);
    return 0;
}

cm_sampler *cm_sampler_new(const cm_sampler_params *p, int32_t n_vocab, char *err, size_t errlen) {
    if (n_vocab < 1) {
        cm_errf(err, errlen, CM_EINVAL, "sampler needs a vocabulary of at least 1 token");
        return NULL;
    }
    if (cm_sampler_params_check(p, err, errlen) < 0) return NULL;
    cm_sampler *s = cm_calloc(1, sizeof *s);
    if (!s) goto oom;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cand = cm_malloc((size_t)n_vocab * sizeof *s->cand);
    s->count = cm_calloc((size_t)n_vocab, sizeof *s->count);
    s->stamp = cm_calloc((size_t)n_vocab, sizeof *s->stamp);
    s->ring = cm_malloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1) * sizeof *s->ring);
    if (!s->cand || !s->count || !s->stamp || !s->ring) goto oom;
    if (p->seed == CM_SAMPLER_SEED_RANDOM) {
        /* Mix two clocks and an address: good enough to differ between
         * requests; never CM_SAMPLER_SEED_RANDOM itself, so it can be replayed. */
        uint64_t x = cm_now_ns() ^ (cm_wall_ms() << 20) ^ (uint64_t)(uintptr_t)s;
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        s->seed = x == CM_SAMPLER_SEED_RANDOM ? 0 : x;
    } else {
        s->seed = p->seed;
    }
    s->p.seed = s->seed;
    s->key = mix64(s->seed ^ 0x6a09e667f3bcc909ull);
    cm_sampler_reset(s);
    return s;
oom:
    cm_sampler_free(s);
    cm_errf(err, errlen, CM_ENOMEM, "out of memory for a sampler of %d tokens", (int)n_vocab);
    return NULL;
}

void cm_sampler_free(cm_sampler *s) {
    if (!s) return;
    cm_free(s->cand);
    cm_free(s->count);
    cm_free(s->stamp);
    cm_free(s->ring);
    cm_free(s);
}

void cm_sampler_reset(cm_sampler *s) {
    memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->ring_len = 0;
    s->ring_pos = 0;
    s->pos = 0;
}

uint64_t cm_sampler_pos(const cm_sampler *s) { return s->pos; }

void cm_sampler_set_pos(cm_sampler *s, uint64_t pos) { s->pos = pos; }

uint64_t cm_sampler_seed(const cm_sampler *s) { return s->seed; }

const cm_sampler_params *cm_sampler_get_params(const cm_sampler *s) { return &s->p; }

int cm_sampler_set_eog(cm_sampler *s, const int32_t *ids, int n, char *err, size_t errlen) {
    if (n < 0 || n > CM_SAMPLER_MAX_EOG)
        return cm_errf(err, errlen, CM_EINVAL, "at most %d end-of-generation ids, got %d", CM_SAMPLER_MAX_EOG, n);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return cm_errf(err, errlen, CM_EINVAL, "end-of-generation id %d outside the vocabulary", (int)ids[i]);
    for (int i = 0; i < n; i++) s->eog[i] = ids[i];
    s->n_eog = n;
    return 0;
}

bool cm_sampler_is_eog(const cm_sampler *s, int32_t id) {
    for (int i = 0; i < s->n_eog; i++)
        if (s->eog[i] == id) return true;
    return false;
}

void cm_sampler_accept(cm_sampler *s, int32_t id) {
    int32_t n = s->p.repeat_last_n;
    if (id < 0 || id >= s->n_vocab || n == 0) return;
    if (s->ring_len == n) {
        s->count[s->ring[s->ring_pos]]--; /* the oldest entry leaves the window */
    } else {
        s->ring_len++;
    }
    s->ring[s->ring_pos] = id;
    s->count[id]++;
    s->ring_pos = (s->ring_pos + 1) % n;
}

/* The order every filter uses: larger logit first, lower id on ties. The
 * candidates never hold NaN, so this is a strict total order. */
static inline bool ahead(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    return ahead(a, b) ? -1 : ahead(b, a) ? 1 : 0;
}

static inline void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Sift c[i] down the min-heap c[0..k) whose root is the candidate LAST in
 * "ahead" order (the weakest of the k kept so far). */
static void sift_down(cand *c, int32_t k, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && ahead(&c[w], &c[l])) w = l;
        if (r < k && ahead(&c[w], &c[r])) w = r;
        if (w == i) return;
        swap_cand(&c[i], &c[w]);
        i = w;
    }
}

/* Rearrange c[0..n) so that c[0..k) are the k candidates ahead of all others
 * (in no particular order). One pass with a k-heap: most candidates lose
 * one comparison against the heap's weakest, so this is ~n for small k. */
static void select_top(cand *c, int32_t n, int32_t k) {
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (ahead(&c[i], &c[0])) {
            swap_cand(&c[i], &c[0]);
            sift_down(c, k, 0);
        }
}

/* The one place the penalty formula lives (documented in sampler.h). */
static inline float penalize_one(const cm_sampler_params *p, float l, int32_t count) {
    if (l == -INFINITY) return l;
    l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
    return l - ((float)count * p->frequency_penalty + p->presence_penalty);
}

static bool penalties_off(const cm_sampler *s) {
    const cm_sampler_params *p = &s->p;
    return s->ring_len == 0 ||
           (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f);
}

void cm_sampler_penalize(const cm_sampler *s, float *logits) {
    if (penalties_off(s)) return;
    /* Each distinct id once; quadratic in the window, which is fine outside
     * the token loop (the loop uses the stamp marks instead). */
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t id = s->ring[i];
        bool first = true;
        for (int32_t j = 0; j < i; j++)
            if (s->ring[j] == id) {
                first = false;
                break;
            }
        if (first) logits[id] = penalize_one(&s->p, logits[id], s->count[id]);
    }
}

/* Penalties, applied on the candidates while they are still indexed by id. */
static void apply_penalties(cm_sampler *s) {
    if (penalties_off(s)) return;
    if (++s->epoch == 0) { /* wrapped: old marks could alias the new epoch */
        memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
        s->epoch = 1;
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t id = s->ring[i];
        if (s->stamp[id] == s->epoch) continue;
        s->stamp[id] = s->epoch;
        s->cand[id].logit = penalize_one(&s->p, s->cand[id].logit, s->count[id]);
    }
}

/* The top n_probs of the raw logits and the chosen token's logprob, from a
 * full-vocabulary softmax at temperature 1 (see cm_sample_info). */
static void fill_info(const cm_sampler *s, const float *logits, int32_t chosen, cm_sample_info *info) {
    int32_t n = s->n_vocab;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (isfinite(logits[i]) && logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    if (mx != -INFINITY)
        for (int32_t i = 0; i < n; i++)
            if (isfinite(logits[i])) sum += expf(logits[i] - mx); /* float exp, double sum: ~1e-7 relative */
    double lse = mx == -INFINITY ? 0.0 : mx + log(sum);
    float lc = logits[chosen];
    info->logprob = isfinite(lc) && mx != -INFINITY ? (float)(lc - lse) : -INFINITY;

    int32_t k = CM_MIN(s->p.n_probs, n);
    info->n_top = 0;
    if (k <= 0) return;
    /* Insertion into a short sorted list; scanning ids upward with a strict
     * comparison keeps the lower id first among equal logits. */
    cand top[CM_SAMPLER_MAX_PROBS];
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        float l = isfinite(logits[i]) ? logits[i] : -INFINITY;
        if (m == k && !(l > top[m - 1].logit)) continue;
        int32_t j = m < k ? m++ : k - 1;
        while (j > 0 && l > top[j - 1].logit) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = i;
        top[j].logit = l;
    }
    for (int32_t j = 0; j < m; j++) {
        info->top[j].id = top[j].id;
        info->top[j].logprob = top[j].logit == -INFINITY || mx == -INFINITY ? -INFINITY : (float)(top[j].logit - lse);
    }
    info->n_top = m;
}

/* The uniform draw of sample number s->pos, in [0, 1): counter-based (the
 * splitmix64 sequence started at the mixed seed, read at index pos), so a
 * sampler made elsewhere and moved to the same pos draws the same number. */
static inline double uniform01(const cm_sampler *s) {
    return (double)(mix64(s->key + (s->pos + 1) * 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-53;
}

static int32_t sample_chain(cm_sampler *s, const float *logits) {
    const cm_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;
    cand *c = s->cand;
    if ((p->temperature <= 0.0f || p->top_k == 1) && penalties_off(s)) {
        /* Greedy without penalties: the chain below's answer (the first
         * largest finite logit; 0 when none is finite) without building the
         * candidates, one pass over the logits. */
        int32_t best = -1;
        float bl = -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            const float l = logits[i];
            if (isfinite(l) && (best < 0 || l > bl)) {
                best = i;
                bl = l;
            }
        }
        return best < 0 ? 0 : best;
    }
    bool any = false;
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        c[i].id = i;
        c[i].logit = isfinite(l) ? l : -INFINITY; /* +inf too: it would poison the softmax */
        any |= c[i].logit != -INFINITY;
    }
    if (!any) return 0;

    apply_penalties(s);

    if (p->temperature <= 0.0f || p->top_k == 1) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return best;
    }

    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
        sorted = true;
    }

    if (p->top_p < 1.0f) {
        float mx = c[0].logit;
        if (!sorted)
            for (int32_t i = 1; i < n; i++)
                if (c[i].logit > mx) mx = c[i].logit;
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++) sum += expf(c[i].logit - mx);
        double target = (double)p->top_p * sum;
        if (!sorted) {
            /* The nucleus is a prefix of the sorted order: once the k best
             * hold the target mass, sorting those k alone gives the same
             * nucleus as sorting everything. Peaked distributions stop at
             * k = 256; flat ones end in a full sort. */
            int32_t k = CM_MIN(n, 256);
            for (;;) {
                if (k < n) select_top(c, n, k);
                double mass = 0.0;
                for (int32_t i = 0; i < k; i++) mass += expf(c[i].logit - mx);
                if (mass >= target || k == n) break;
                k = k > n / 8 ? n : k * 8;
            }
            n = k;
            qsort(c, (size_t)n, sizeof *c, cmp_cand);
            sorted = true;
        }
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += expf(c[i].logit - mx);
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }

    if (p->min_p > 0.0f) {
        float mx = c[0].logit;
        if (!sorted)
            for (int32_t i = 1; i < n; i++)
                if (c[i].logit > mx) mx = c[i].logit;
        /* p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p) */
        float thr = mx + logf(p->min_p);
        int32_t keep = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].logit >= thr) c[keep++] = c[i]; /* order-preserving compaction */
        n = keep > 0 ? keep : 1;
    }

    float inv_t = 1.0f / p->temperature;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        c[i].logit *= inv_t;
        if (c[i].logit > mx) mx = c[i].logit;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)c[i].logit - mx);
    double r = uniform01(s) * sum, cum = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; i++) {
        double w = exp((double)c[i].logit - mx);
        if (w == 0.0) continue;
        cum += w;
        last = i;
        if (r < cum) return c[i].id;
    }
    return c[last].id; /* rounding left r just past the total */
}

int32_t cm_sampler_sample(cm_sampler *s, const float *logits, cm_sample_info *info) {
    int32_t id = sample_chain(s, logits);
    s->pos++; /* every sample counts, greedy or not: pos is the caller's token count */
    if (info) fill_info(s, logits, id, info);
    return id;
}
