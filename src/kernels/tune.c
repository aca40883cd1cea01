/*
 * tune.c: the knobs' table, their values, the cache file's format and the
 * load-time measurement (tune.h). Touches no file itself (model/tune_cache.c
 * reads and writes the cache); the measurement allocates scratch once per
 * call, never in the token loop. Must never change a result: every
 * candidate of every knob gives the same bits (tests/unit/test_tune.c).
 */
#include "tune.h"

#include "base/base.h"
#include "os/os.h"

#include <stdio.h>
#include <string.h>

/* Candidates: the prefetch distances around the one sessions 18-19 picked by
 * hand (2048: docs/HISTORY.md; 3072 was best for f16 on that Intel Xeon,
 * 1024 for q8_0 at one thread; 4096 aliased L1 sets there), and f16 passes
 * of 256 KiB to 1 MiB of converted tokens (1 MiB fills Zen 4's L2). */
static const cm_tune_knob_info k_knobs[CM_TUNE_COUNT] = {
    [CM_TUNE_F16_GEMV_PFD] =
        {"avx512.f16.gemv.pfd", "avx512", {CM_TYPE_F16}, 1, false, false, 2048, 3, {1024, 2048, 3072}},
    [CM_TUNE_Q8_0_GEMV_PFD] =
        {"avx512.q8_0.gemv.pfd", "avx512", {CM_TYPE_Q8_0}, 1, false, false, 2048, 3, {1024, 2048, 3072}},
    [CM_TUNE_Q4_0_GEMV_PFD] =
        {"avx512.q4_0.gemv.pfd", "avx512", {CM_TYPE_Q4_0}, 1, false, true, 2048, 3, {1024, 2048, 3072}},
    [CM_TUNE_KQ_GEMV_PFD] = {"avx512.q5_k+q6_k.gemv.pfd",
                             "avx512",
                             {CM_TYPE_Q5_K, CM_TYPE_Q6_K},
                             2,
                             false,
                             false,
                             2048,
                             3,
                             {1024, 2048, 3072}},
    [CM_TUNE_F16_GEMM_PASS] =
        {"avx512.f16.gemm.pass_kib", "avx512", {CM_TYPE_F16}, 1, true, false, 1024, 3, {256, 512, 1024}},
};

int cm_tune_vals_[CM_TUNE_COUNT] = {2048, 2048, 2048, 2048, 1024};

const cm_tune_knob_info *cm_tune_info(int knob) { return knob >= 0 && knob < CM_TUNE_COUNT ? &k_knobs[knob] : NULL; }

int cm_tune_find(const char *name, size_t len) {
    for (int i = 0; i < CM_TUNE_COUNT; i++)
        if (strlen(k_knobs[i].name) == len && memcmp(k_knobs[i].name, name, len) == 0) return i;
    return -1;
}

static bool is_cand(int knob, int v) {
    for (int j = 0; j < k_knobs[knob].n_cand; j++)
        if (k_knobs[knob].cand[j] == v) return true;
    return false;
}

int cm_tune_set(int knob, int value) {
    if (knob < 0 || knob >= CM_TUNE_COUNT || !is_cand(knob, value)) return CM_EINVAL;
    __atomic_store_n(&cm_tune_vals_[knob], value, __ATOMIC_RELAXED);
    return 0;
}

void cm_tune_defaults(void) {
    for (int i = 0; i < CM_TUNE_COUNT; i++) (void)cm_tune_set(i, k_knobs[i].def);
}

void cm_tune_apply(const cm_tune_choice *c) {
    for (int i = 0; i < CM_TUNE_COUNT; i++)
        if (c->set[i]) (void)cm_tune_set(i, c->val[i]);
}

/* ---- the cache file ---- */

static const char k_magic[] = "cumulo-tune 1";

size_t cm_tune_format(const char *sig, const cm_tune_choice *c, char *out, size_t cap) {
    size_t o = 0;
    int w = snprintf(out, cap, "%s\nsig %s\n", k_magic, sig);
    if (w < 0 || (size_t)w >= cap) return 0;
    o = (size_t)w;
    for (int i = 0; i < CM_TUNE_COUNT; i++) {
        if (!c->set[i]) continue;
        w = snprintf(out + o, cap - o, "%s %d\n", k_knobs[i].name, c->val[i]);
        if (w < 0 || (size_t)w >= cap - o) return 0;
        o += (size_t)w;
    }
    return o;
}

/* The line at p[*o:n] without its '\n' (*len bytes), *o moved past it;
 * false at the end or for a line longer than CM_TUNE_SIG_MAX + 16. */
static bool next_line(const uint8_t *p, size_t n, size_t *o, const char **line, size_t *len) {
    if (*o >= n) return false;
    const uint8_t *s = p + *o, *e = memchr(s, '\n', n - *o);
    const size_t l = e ? (size_t)(e - s) : n - *o;
    if (l > CM_TUNE_SIG_MAX + 16) return false;
    *line = (const char *)s, *len = l;
    *o += l + (e ? 1 : 0);
    return true;
}

int cm_tune_parse(const uint8_t *p, size_t n, const char *sig, cm_tune_choice *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (n > CM_TUNE_FILE_MAX) return cm_errf(err, errlen, CM_EFORMAT, "over %d bytes", CM_TUNE_FILE_MAX);
    size_t o = 0, len;
    const char *l;
    if (!next_line(p, n, &o, &l, &len) || len != sizeof k_magic - 1 || memcmp(l, k_magic, len) != 0)
        return cm_errf(err, errlen, CM_EFORMAT, "not a '%s' file", k_magic);
    if (!next_line(p, n, &o, &l, &len) || len < 4 || memcmp(l, "sig ", 4) != 0)
        return cm_errf(err, errlen, CM_EFORMAT, "no signature line");
    if (len - 4 != strlen(sig) || memcmp(l + 4, sig, len - 4) != 0)
        return cm_errf(err, errlen, CM_EFORMAT, "made on another CPU");
    while (o < n) {
        if (!next_line(p, n, &o, &l, &len)) return cm_errf(err, errlen, CM_EFORMAT, "a line too long");
        if (len == 0) continue;
        const char *sp = memchr(l, ' ', len);
        if (!sp || sp == l) return cm_errf(err, errlen, CM_EFORMAT, "a line without 'NAME VALUE'");
        const size_t nl = (size_t)(sp - l), vl = len - nl - 1;
        long v = 0;
        if (vl == 0 || vl > 9) return cm_errf(err, errlen, CM_EFORMAT, "a bad value");
        for (size_t i = 0; i < vl; i++) {
            const char ch = sp[1 + i];
            if (ch < '0' || ch > '9') return cm_errf(err, errlen, CM_EFORMAT, "a bad value");
            v = v * 10 + (ch - '0');
        }
        const int knob = cm_tune_find(l, nl);
        if (knob < 0) continue; /* a newer build's knob */
        if (!is_cand(knob, (int)v))
            return cm_errf(err, errlen, CM_EFORMAT, "%s %ld is not one of its values", k_knobs[knob].name, v);
        c->val[knob] = (int)v, c->set[knob] = true;
    }
    return 0;
}

/* ---- measurement ---- */

static bool knob_takes_type(int knob, const cm_tensor *W) {
    const cm_tune_knob_info *ki = &k_knobs[knob];
    bool type = false;
    for (int t = 0; t < ki->n_types; t++) type |= W->type == ki->types[t];
    return type && W->data && W->ne[0] > 0 && W->ne[1] > 0;
}

static bool knob_takes(int knob, const cm_tensor *W) {
    const cm_tune_knob_info *ki = &k_knobs[knob];
    if (!knob_takes_type(knob, W)) return false;
    if (ki->packed && !cm_repack_find(W, NULL)) return false;
    if (ki->gemm) return W->ne[0] >= 512 && W->ne[0] <= 16384 && W->ne[1] >= 64;
    return true;
}

static size_t tensor_bytes(const cm_tensor *W) { return (size_t)W->ne[1] * cm_row_size(W->type, W->ne[0]); }

int cm_tune_wanted(const cm_kernels *k, const cm_tensor *const *ws, int n, bool want[CM_TUNE_COUNT]) {
    int nw = 0;
    for (int i = 0; i < CM_TUNE_COUNT; i++) {
        want[i] = false;
        if (strcmp(k_knobs[i].table, k->name) != 0) continue;
        size_t bytes = 0;
        bool takes = false;
        for (int j = 0; j < n; j++) {
            const bool t = knob_takes(i, ws[j]);
            takes |= t;
            if (t || (k_knobs[i].gemm && knob_takes_type(i, ws[j]))) bytes += tensor_bytes(ws[j]);
        }
        want[i] = takes && bytes >= CM_TUNE_MIN_BYTES;
        nw += want[i];
    }
    return nw;
}

enum {
    CHUNK_BYTES = 24 << 20, /* weights a gemv rep reads: one core's DRAM share for a few ms */
    GEMM_TOK = 128,         /* tokens of the gemm rep: passes of 32, 64 and 128 at k = 2048 */
    GEMM_ROWS = 192,        /* rows of each weight */
    GEMM_SHAPES = 4,        /* weights of distinct row lengths it runs (the first met of each) */
};

typedef struct {
    const cm_kernels *k;
    const cm_tensor *const *ws;
    int n;
    float *xf;  /* random activations, the longest row's length (GEMM_TOK rows for the gemm) */
    void *xq;   /* converted to the vec_dot_type */
    float *y;   /* results */
    int cursor; /* the next weight a gemv rep starts at */
} tune_run;

/* One gemv rep of knob: weights from the cursor on until CHUNK_BYTES were
 * read; CPU ns per MiB. */
static double gemv_rep(tune_run *r, int knob) {
    uint64_t ns = 0;
    size_t bytes = 0;
    for (int guard = 0; bytes < CHUNK_BYTES && guard < 2 * r->n; guard++) {
        const cm_tensor *W = r->ws[r->cursor];
        r->cursor = (r->cursor + 1) % r->n;
        if (!knob_takes(knob, W)) continue;
        const enum cm_type vt = cm_type_traits_of(W->type)->vec_dot_type;
        r->k->from_float[vt](r->xf, r->xq, W->ne[0]);
        const uint64_t t0 = cm_thread_cpu_ns();
        cm_matmul_rows(r->k, W, r->xq, cm_row_size(vt, W->ne[0]), 1, r->y, W->ne[1], 0, W->ne[1]);
        ns += cm_thread_cpu_ns() - t0;
        bytes += tensor_bytes(W);
    }
    return bytes ? (double)ns * (double)(1 << 20) / (double)bytes : 0;
}

/* One gemm rep: GEMM_TOK tokens against GEMM_ROWS rows of each of G[0:ng]
 * (one weight per row length: a pass size that suits 2048-element rows can
 * cost a 5632-element one 1.3x); CPU ns of the products. */
static double gemm_rep(tune_run *r, const cm_tensor *const *G, int ng) {
    uint64_t ns = 0;
    for (int g = 0; g < ng; g++) {
        const cm_tensor *W = G[g];
        const int64_t k = W->ne[0], rows = W->ne[1] < GEMM_ROWS ? W->ne[1] : GEMM_ROWS;
        const enum cm_type vt = cm_type_traits_of(W->type)->vec_dot_type;
        const size_t xs = cm_row_size(vt, k);
        for (int t = 0; t < GEMM_TOK; t++)
            r->k->from_float[vt](r->xf + (size_t)t * (size_t)k, (char *)r->xq + (size_t)t * xs, k);
        const uint64_t t0 = cm_thread_cpu_ns();
        cm_matmul_rows(r->k, W, r->xq, xs, GEMM_TOK, r->y, rows, 0, rows);
        ns += cm_thread_cpu_ns() - t0;
    }
    return (double)ns;
}

int cm_tune_measure(const cm_kernels *k, const cm_tensor *const *ws, int n, const bool want[CM_TUNE_COUNT],
                    cm_tune_choice *picked, double ns[CM_TUNE_COUNT][CM_TUNE_MAXCAND]) {
    memset(picked, 0, sizeof *picked);
    memset(ns, 0, sizeof(double) * CM_TUNE_COUNT * CM_TUNE_MAXCAND);
    int64_t maxk = 0, maxr = GEMM_ROWS;
    for (int j = 0; j < n; j++) {
        if (!ws[j]->data) continue;
        maxk = CM_MAX(maxk, ws[j]->ne[0]);
        maxr = CM_MAX(maxr, ws[j]->ne[1]);
    }
    if (maxk == 0) return 0;
    tune_run r = {.k = k, .ws = ws, .n = n};
    const size_t xn = (size_t)maxk * GEMM_TOK;
    r.xf = cm_malloc(xn * sizeof(float));
    r.xq = cm_aligned_alloc(xn * sizeof(float) + 4096);
    r.y = cm_malloc((size_t)CM_MAX(maxr, (int64_t)GEMM_TOK * GEMM_ROWS) * sizeof(float));
    if (!r.xf || !r.xq || !r.y) {
        cm_free(r.xf), cm_aligned_free(r.xq), cm_free(r.y);
        return CM_ENOMEM;
    }
    uint32_t s = 0x9e3779b9u; /* any activations do: only time is measured */
    for (size_t i = 0; i < xn; i++) {
        s = s * 1664525u + 1013904223u;
        r.xf[i] = (float)(int32_t)(s >> 8 & 0xffff) / 16384.0f - 2.0f;
    }
    for (int knob = 0; knob < CM_TUNE_COUNT; knob++) {
        if (!want[knob]) continue;
        const cm_tune_knob_info *ki = &k_knobs[knob];
        const cm_tensor *G[GEMM_SHAPES]; /* the gemm's weights: one per row length */
        int ng = 0;
        for (int j = 0; ki->gemm && j < n; j++) {
            if (!knob_takes(knob, ws[j])) continue;
            int g = 0;
            while (g < ng && G[g]->ne[0] != ws[j]->ne[0]) g++;
            if (g == ng && ng < GEMM_SHAPES) G[ng++] = ws[j];
        }
        if (ki->gemm && ng == 0) continue;
        double best[CM_TUNE_MAXCAND] = {0};
        (void)cm_tune_set(knob, ki->def); /* one untimed rep: pages, caches, clocks */
        if (ki->gemm) (void)gemm_rep(&r, G, ng);
        else (void)gemv_rep(&r, knob);
        for (int rep = 0; rep < CM_TUNE_REPS; rep++)
            for (int jj = 0; jj < ki->n_cand; jj++) {
                const int j = (jj + rep) % ki->n_cand;
                (void)cm_tune_set(knob, ki->cand[j]);
                const double t = ki->gemm ? gemm_rep(&r, G, ng) : gemv_rep(&r, knob);
                if (t > 0 && (best[j] == 0 || t < best[j])) best[j] = t;
            }
        int def = 0, win = -1;
        for (int j = 0; j < ki->n_cand; j++) {
            ns[knob][j] = best[j];
            if (ki->cand[j] == ki->def) def = j;
            if (best[j] > 0 && (win < 0 || best[j] < best[win])) win = j;
        }
        /* the default unless another is clearly faster: noise must not move it */
        if (win < 0 || best[def] == 0 || best[win] > 0.97 * best[def]) win = def;
        picked->val[knob] = ki->cand[win], picked->set[knob] = true;
        (void)cm_tune_set(knob, ki->cand[win]);
    }
    cm_free(r.xf), cm_aligned_free(r.xq), cm_free(r.y);
    return 0;
}
