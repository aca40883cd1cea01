/*
 * lora.c: loading llama.cpp LoRA adapter GGUFs and adding B (A x) to the
 * targeted matmuls (see lora.h for the format and the math).
 *
 * Every pair lives in one list per (layer, target) slot, in the order the
 * adapters were added, so the corrections are summed in a fixed order. An
 * adapter is validated whole before any of it is kept: a bad file never
 * leaves half an adapter applied. Never allocates in cm_lora_apply (the
 * forward pass calls it).
 */
#include "lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lora_pair {
    float *a; /* [rank][a_cols]: columns [a_col0, a_col0 + a_cols) of the [rank][n_in] matrix */
    float *b; /* [b_rows][rank]: rows [b_row0, b_row0 + b_rows) of the [n_out][rank] matrix */
    int rank;
    int64_t n_in, n_out;
    int64_t a_col0, a_cols, b_row0, b_rows; /* whole (0, n_in, 0, n_out) but on a tensor-parallel member */
    float scale;                            /* the final default scale: user * alpha / rank (user without alpha) */
    float alpha; /* adapter.lora.alpha (0: none; a pair from parts: unknown, final scale given) */
    int next;    /* next pair of the same slot, -1 = last */
    int slot;    /* (layer, target) list it belongs to */
    int adapter; /* which cm_lora_add (or parts adapter index) it came from */
} lora_pair;

struct cm_lora {
    const cm_model *m;
    int n_adapters;
    float *user;       /* [n_adapters]: each adapter's default user scale (cm_lora_add's) */
    bool *overridable; /* [n_adapters]: alpha known (cm_lora_add), so a row's own scale can be applied */
    lora_pair *pairs;
    int n_pairs, cap;
    int *head, *tail; /* [(n_layer + 1) * CM_LORA_TARGET_COUNT]; -1 = none */
};

static const char *const target_names[CM_LORA_TARGET_COUNT] = {"attn_q",   "attn_k", "attn_v",   "attn_output",
                                                               "ffn_gate", "ffn_up", "ffn_down", "output"};

static int slot_of(const cm_lora *l, int il, enum cm_lora_target t) {
    if (t == CM_LORA_OUTPUT) il = l->m->hp.n_layer;
    return il * CM_LORA_TARGET_COUNT + (int)t;
}

cm_lora *cm_lora_new(const cm_model *m) {
    cm_lora *l = cm_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->m = m;
    size_t n = (size_t)(m->hp.n_layer + 1) * CM_LORA_TARGET_COUNT;
    l->head = cm_malloc(n * sizeof(int));
    l->tail = cm_malloc(n * sizeof(int));
    if (!l->head || !l->tail) {
        cm_lora_free(l);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) l->head[i] = l->tail[i] = -1;
    return l;
}

void cm_lora_free(cm_lora *l) {
    if (!l) return;
    for (int i = 0; i < l->n_pairs; i++) {
        cm_free(l->pairs[i].a);
        cm_free(l->pairs[i].b);
    }
    cm_free(l->pairs);
    cm_free(l->user);
    cm_free(l->overridable);
    cm_free(l->head);
    cm_free(l->tail);
    cm_free(l);
}

int cm_lora_count(const cm_lora *l) { return l ? l->n_adapters : 0; }
int cm_lora_n_pairs(const cm_lora *l) { return l ? l->n_pairs : 0; }

bool cm_lora_targets(const cm_lora *l, int il, enum cm_lora_target t) {
    if (!l || t >= CM_LORA_TARGET_COUNT || (t != CM_LORA_OUTPUT && (il < 0 || il >= l->m->hp.n_layer))) return false;
    return l->head[slot_of(l, il, t)] >= 0;
}

/* "blk.N.<target>.weight" or "output.weight" -> (layer, target); false otherwise. */
static bool parse_base(const char *base, const cm_model *m, int *il, enum cm_lora_target *t) {
    if (!strcmp(base, "output.weight")) {
        *il = m->hp.n_layer;
        *t = CM_LORA_OUTPUT;
        return true;
    }
    int n = 0, pos = 0;
    char name[64];
    if (sscanf(base, "blk.%d.%63[a-z_].weight%n", &n, name, &pos) != 2 || base[pos] || pos == 0) return false;
    if (n < 0 || n >= m->hp.n_layer) return false;
    for (int k = 0; k < CM_LORA_OUTPUT; k++)
        if (!strcmp(name, target_names[k])) {
            *il = n;
            *t = (enum cm_lora_target)k;
            return true;
        }
    return false;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* A copy of a 2-D tensor as F32 rows. */
static float *to_f32(const cm_gguf_tensor_info *ti, char *err, size_t errlen, int *rc) {
    const cm_kernels *k = cm_kernels_get();
    const cm_type_traits *tr = cm_type_traits_of(ti->type);
    *rc = 0;
    if (!tr || !k->to_float[ti->type] || ti->ne[0] % tr->block_size) {
        *rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' has unsupported type %s", ti->name,
                      cm_type_name(ti->type));
        return NULL;
    }
    size_t rs = cm_row_size(ti->type, ti->ne[0]);
    if (rs * (size_t)ti->ne[1] > ti->nbytes) {
        *rc = cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' is truncated", ti->name);
        return NULL;
    }
    if ((uintptr_t)ti->data % cm_type_align(ti->type)) {
        *rc = cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' is misaligned", ti->name);
        return NULL;
    }
    float *out = cm_malloc((size_t)ti->ne[0] * (size_t)ti->ne[1] * sizeof(float));
    if (!out) {
        *rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory for tensor '%s'", ti->name);
        return NULL;
    }
    for (int64_t r = 0; r < ti->ne[1]; r++)
        k->to_float[ti->type]((const char *)ti->data + (size_t)r * rs, out + r * ti->ne[0], ti->ne[0]);
    return out;
}

static int check_header(const cm_lora *l, const cm_gguf *g, float *alpha, char *err, size_t errlen) {
    char *gt = cm_gguf_get_str(g, "general.type");
    bool ok = gt && !strcmp(gt, "adapter");
    if (!ok) {
        int rc = cm_errf(err, errlen, CM_EFORMAT, "not a LoRA adapter (general.type is '%s', expected 'adapter')",
                         gt ? gt : "missing");
        cm_free(gt);
        return rc;
    }
    cm_free(gt);
    char *at = cm_gguf_get_str(g, "adapter.type");
    ok = at && !strcmp(at, "lora");
    if (!ok) {
        int rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "adapter.type is '%s' (only 'lora' is supported)",
                         at ? at : "missing");
        cm_free(at);
        return rc;
    }
    cm_free(at);
    const char *want = cm_arch_name_of(l->m->hp.arch);
    char *arch = cm_gguf_get_str(g, "general.architecture");
    ok = arch && !strcmp(arch, want);
    if (!ok) {
        int rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "adapter is for architecture '%s', the model is '%s'",
                         arch ? arch : "missing", want);
        cm_free(arch);
        return rc;
    }
    cm_free(arch);
    if (l->m->hp.arch == CM_ARCH_DEEPSEEK2) /* its attention runs in mla.c, whose inputs lora_mm does not know */
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "LoRA adapters on deepseek2 (multi-head latent attention) are not supported yet");
    if (cm_gguf_find_kv(g, "adapter.alora.invocation_tokens"))
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "activated LoRA (adapter.alora.*) is not supported");
    double a = 0;
    if (cm_gguf_find_kv(g, "adapter.lora.alpha") && !cm_gguf_get_f64(g, "adapter.lora.alpha", &a))
        return cm_errf(err, errlen, CM_EFORMAT, "adapter.lora.alpha is not a number");
    if (!(a >= 0 && a < 1e9)) return cm_errf(err, errlen, CM_EFORMAT, "adapter.lora.alpha %g is out of range", a);
    *alpha = (float)a;
    return 0;
}

/* The model's view of target t of layer il (what the forward pass multiplies by). */
static const cm_tensor *bound_of(const cm_model *m, int il, enum cm_lora_target t) {
    if (t == CM_LORA_OUTPUT) return &m->output;
    const cm_tensor *v[CM_LAYER_MATMULS];
    cm_layer_matmuls(&m->layers[il], v);
    return v[t];
}

/* Validate one pair against the model; fills the pair's shape. */
static int check_pair(const cm_lora *l, const char *base, const cm_gguf_tensor_info *ta, const cm_gguf_tensor_info *tb,
                      lora_pair *p, char *err, size_t errlen) {
    const cm_gguf_tensor_info *w = cm_gguf_find_tensor(l->m->gguf, base);
    if (!w)
        return cm_errf(err, errlen, CM_EFORMAT,
                       "adapter tensor '%s' has no '%s' in the model (adapter made for another model?)", ta->name,
                       base);
    int il;
    enum cm_lora_target t;
    parse_base(base, l->m, &il, &t);
    const cm_tensor *bw = bound_of(l->m, il, t);
    if (!bw->data || bw->ne[0] != w->ne[0] || bw->ne[1] != w->ne[1]) /* phi3's fused ffn_up: gate rows first */
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "'%s' is fused or split in this %s model: LoRA on it is not supported", base,
                       cm_arch_name_of(l->m->hp.arch));
    if (ta->n_dims != 2 || tb->n_dims != 2 || w->n_dims != 2)
        return cm_errf(err, errlen, CM_EFORMAT, "adapter tensors of '%s' are not 2-D matrices", base);
    if (ta->ne[0] != w->ne[0])
        return cm_errf(
            err, errlen, CM_EFORMAT,
            "tensor '%s' has shape [%lld, %lld], the model's '%s' takes %lld inputs (adapter made for another model?)",
            ta->name, (long long)ta->ne[0], (long long)ta->ne[1], base, (long long)w->ne[0]);
    if (tb->ne[1] != w->ne[1])
        return cm_errf(
            err, errlen, CM_EFORMAT,
            "tensor '%s' has shape [%lld, %lld], the model's '%s' has %lld outputs (adapter made for another model?)",
            tb->name, (long long)tb->ne[0], (long long)tb->ne[1], base, (long long)w->ne[1]);
    if (ta->ne[1] != tb->ne[0])
        return cm_errf(err, errlen, CM_EFORMAT,
                       "'%s': lora_a has rank %lld but lora_b %lld (lora_a must be [n_in, rank])", base,
                       (long long)ta->ne[1], (long long)tb->ne[0]);
    if (ta->ne[1] < 1 || ta->ne[1] > CM_LORA_MAX_RANK)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "'%s': rank %lld is out of [1, %d]", base, (long long)ta->ne[1],
                       CM_LORA_MAX_RANK);
    p->rank = (int)ta->ne[1];
    p->n_in = ta->ne[0];
    p->n_out = tb->ne[1];
    p->a_col0 = p->b_row0 = 0;
    p->a_cols = p->n_in;
    p->b_rows = p->n_out;
    return 0;
}

/* Room for n more adapters' default scales. */
static int grow_adapters(cm_lora *l, int n) {
    float *u = cm_realloc(l->user, (size_t)(l->n_adapters + n) * sizeof *u);
    if (!u) return CM_ENOMEM;
    l->user = u;
    bool *o = cm_realloc(l->overridable, (size_t)(l->n_adapters + n) * sizeof *o);
    if (!o) return CM_ENOMEM;
    l->overridable = o;
    return 0;
}

int cm_lora_add(cm_lora *l, const cm_gguf *g, float scale, char *err, size_t errlen) {
    float alpha = 0;
    int rc = check_header(l, g, &alpha, err, errlen);
    if (rc) return rc;
    if (!(scale > -1e6f && scale < 1e6f))
        return cm_errf(err, errlen, CM_EINVAL, "LoRA scale %g is out of range", scale);
    /* Pass 1: every tensor is half of a known pair, every pair whole and the right shape. */
    int n_new = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *t = &g->tensors[i];
        bool is_a = ends_with(t->name, ".lora_a"), is_b = ends_with(t->name, ".lora_b");
        if (!is_a && !is_b) {
            if (ends_with(t->name, "_norm.weight")) continue; /* llama.cpp ignores these too */
            return cm_errf(err, errlen, CM_EFORMAT, "adapter tensor '%s' is not a .lora_a/.lora_b half", t->name);
        }
        char base[CM_GGUF_MAX_NAME];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
        int il;
        enum cm_lora_target tg;
        if (!parse_base(base, l->m, &il, &tg))
            return cm_errf(err, errlen, CM_EUNSUPPORTED,
                           "adapter tensor '%s': cumulo applies LoRA to blk.N.attn_q/k/v/output, ffn_gate/up/down "
                           "and output weights only",
                           t->name);
        char other[CM_GGUF_MAX_NAME + 8];
        snprintf(other, sizeof other, "%s%s", base, is_a ? ".lora_b" : ".lora_a");
        const cm_gguf_tensor_info *o = cm_gguf_find_tensor(g, other);
        if (!o) return cm_errf(err, errlen, CM_EFORMAT, "adapter tensor '%s' has no '%s'", t->name, other);
        if (!is_a) continue;
        lora_pair p;
        if ((rc = check_pair(l, base, t, o, &p, err, errlen))) return rc;
        n_new++;
    }
    if (n_new == 0) return cm_errf(err, errlen, CM_EFORMAT, "adapter has no lora_a/lora_b tensor pairs");
    if (grow_adapters(l, 1)) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (l->n_pairs + n_new > l->cap) {
        int cap = l->n_pairs + n_new;
        lora_pair *np = cm_realloc(l->pairs, (size_t)cap * sizeof *np);
        if (!np) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        l->pairs = np;
        l->cap = cap;
    }
    /* Pass 2: copy as F32, then link every pair (only once all copies succeeded). */
    int first = l->n_pairs, n = first;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *t = &g->tensors[i];
        if (!ends_with(t->name, ".lora_a")) continue;
        char base[CM_GGUF_MAX_NAME], other[CM_GGUF_MAX_NAME + 8];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
        snprintf(other, sizeof other, "%s.lora_b", base);
        const cm_gguf_tensor_info *o = cm_gguf_find_tensor(g, other);
        int il;
        enum cm_lora_target tg;
        parse_base(base, l->m, &il, &tg);
        lora_pair *p = &l->pairs[n];
        memset(p, 0, sizeof *p);
        check_pair(l, base, t, o, p, err, errlen);
        p->scale = alpha != 0 ? scale * alpha / (float)p->rank : scale; /* final_scale()'s expression */
        p->alpha = alpha;
        p->next = -1;
        p->a = to_f32(t, err, errlen, &rc);
        if (!rc) p->b = to_f32(o, err, errlen, &rc);
        if (rc) {
            for (int k = first; k <= n; k++) {
                cm_free(l->pairs[k].a);
                cm_free(l->pairs[k].b);
            }
            return rc;
        }
        p->slot = slot_of(l, il, tg);
        p->adapter = l->n_adapters;
        n++;
    }
    for (int k = first; k < n; k++) {
        int s = l->pairs[k].slot;
        if (l->tail[s] >= 0) l->pairs[l->tail[s]].next = k;
        else l->head[s] = k;
        l->tail[s] = k;
    }
    l->n_pairs = n;
    l->user[l->n_adapters] = scale;
    l->overridable[l->n_adapters] = true;
    l->n_adapters++;
    return 0;
}

int cm_lora_spec_parse(const char *spec, char *path, size_t pathlen, float *scale, char *err, size_t errlen) {
    *scale = 1.0f;
    size_t n = strlen(spec);
    const char *colon = strrchr(spec, ':');
    if (colon && colon[1]) {
        char *end;
        double v = strtod(colon + 1, &end);
        if (!*end && v == v) {
            *scale = (float)v;
            n = (size_t)(colon - spec);
        }
    }
    if (n == 0) return cm_errf(err, errlen, CM_EINVAL, "LoRA '%s' has no file name (expected FILE.gguf[:SCALE])", spec);
    if (n >= pathlen) return cm_errf(err, errlen, CM_EINVAL, "LoRA path '%s' is too long", spec);
    memcpy(path, spec, n);
    path[n] = 0;
    return 0;
}

/* Pair p's scale for a row whose adapters' user scales are u (NULL: the
 * defaults). The same expression as cm_lora_add's default, so a row given
 * its adapter's default scale gets the default's bits. */
static inline float final_scale(const cm_lora *l, const lora_pair *p, const float *u) {
    if (!u || !l->overridable[p->adapter]) return p->scale;
    const float s = u[p->adapter];
    return p->alpha != 0 ? s * p->alpha / (float)p->rank : s;
}

void cm_lora_apply(const cm_lora *l, int il, enum cm_lora_target t, const float *x, int64_t ldx, int64_t col0,
                   int64_t ncols, int n_tok, float *y, int64_t ldy, int64_t row0, int64_t r0, int64_t r1) {
    cm_lora_apply_rows(l, il, t, x, ldx, col0, ncols, n_tok, y, ldy, row0, r0, r1, NULL);
}

void cm_lora_apply_rows(const cm_lora *l, int il, enum cm_lora_target t, const float *x, int64_t ldx, int64_t col0,
                        int64_t ncols, int n_tok, float *y, int64_t ldy, int64_t row0, int64_t r0, int64_t r1,
                        const float *const *user) {
    if (!l || r1 <= r0) return;
    float ax[CM_LORA_MAX_RANK];
    for (int p = l->head[slot_of(l, il, t)]; p >= 0; p = l->pairs[p].next) {
        const lora_pair *lp = &l->pairs[p];
        const int R = lp->rank;
        for (int j = 0; j < n_tok; j++) {
            /* Each row on its own (batch invariance): its scale, and a row
             * whose scale is 0 gets nothing added, as without the adapter. */
            const float sc = final_scale(l, lp, user ? user[j] : NULL);
            if (sc == 0.0f) continue;
            const float *xj = x + (int64_t)j * ldx;
            for (int k = 0; k < R; k++) { /* A x: one row of A per rank */
                const float *a = lp->a + (int64_t)k * lp->a_cols + (col0 - lp->a_col0);
                float s = 0.0f;
                for (int64_t i = 0; i < ncols; i++) s += a[i] * xj[i];
                ax[k] = s;
            }
            float *yj = y + (int64_t)j * ldy;
            for (int64_t r = r0; r < r1; r++) { /* B (A x), scaled, added to W x */
                const float *b = lp->b + (row0 + r - lp->b_row0) * R;
                float s = 0.0f;
                for (int k = 0; k < R; k++) s += b[k] * ax[k];
                yj[r] += sc * s;
            }
        }
    }
}

bool cm_lora_rows_ok(const cm_lora *l) {
    for (int a = 0; l && a < l->n_adapters; a++)
        if (!l->overridable[a]) return false;
    return true;
}

float cm_lora_scale(const cm_lora *l, int adapter) {
    return l && adapter >= 0 && adapter < l->n_adapters ? l->user[adapter] : 0.0f;
}

/* ---- a set's parts for a cluster stage (lora.h: cm_lora_parts_write / cm_lora_add_parts) ---- */

#define PARTS_MAGIC 0x504C4D43u /* "CMLP" */
#define PARTS_VERSION 3u        /* 3: each pair's alpha (a row's own scale needs it); 2 (read): a reserved 0 there */
#define PARTS_HDR 16
#define PAIR_HDR 72

static void put32(cm_buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    cm_buf_append(b, x, 4);
}
static void put64(cm_buf *b, uint64_t v) {
    put32(b, (uint32_t)v);
    put32(b, (uint32_t)(v >> 32));
}
static void putf(cm_buf *b, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    put32(b, v);
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static float getf(const uint8_t *p) {
    uint32_t v = get32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* The rows of B and columns of A of target t that a member with slice s
 * reads (forward.c's lora_mm passes the same offsets): its query / KV rows,
 * FFN rows, the attention output's and ffn_down's input columns, its
 * vocabulary rows of a split head (head_split). s NULL: everything. */
static void needed(const cm_model *m, const cm_slice *s, bool head_split, enum cm_lora_target t, int64_t n_in,
                   int64_t n_out, int64_t *r0, int64_t *r1, int64_t *c0, int64_t *c1) {
    *r0 = *c0 = 0;
    *r1 = n_out;
    *c1 = n_in;
    if (!s) return;
    const cm_hparams *hp = &m->hp;
    const int64_t D = hp->head_dim, rep = hp->n_head / hp->n_head_kv;
    switch (t) {
    case CM_LORA_Q: *r0 = s->h0 * rep * D, *r1 = s->h1 * rep * D; break;
    case CM_LORA_K:
    case CM_LORA_V: *r0 = s->h0 * D, *r1 = s->h1 * D; break;
    case CM_LORA_O: *c0 = s->h0 * rep * D, *c1 = s->h1 * rep * D; break;
    case CM_LORA_GATE:
    case CM_LORA_UP: *r0 = s->f0, *r1 = s->f1; break;
    case CM_LORA_DOWN: *c0 = s->f0, *c1 = s->f1; break;
    case CM_LORA_OUTPUT:
        if (head_split) {
            int v0, v1;
            cm_slice_head_rows(m, *s, &v0, &v1);
            *r0 = v0, *r1 = v1;
        }
        break;
    default: break;
    }
}

static bool pair_in(const cm_lora *l, const lora_pair *p, int layer_begin, int layer_end, bool output) {
    int il = p->slot / CM_LORA_TARGET_COUNT;
    if (il == l->m->hp.n_layer) return output;
    return il >= layer_begin && il < layer_end;
}

int cm_lora_parts_write(const cm_lora *l, int layer_begin, int layer_end, bool output, const cm_slice *slice,
                        bool head_split, cm_buf *out, int *n_pairs) {
    int n = 0;
    for (int i = 0; l && i < l->n_pairs; i++) n += pair_in(l, &l->pairs[i], layer_begin, layer_end, output);
    put32(out, PARTS_MAGIC);
    put32(out, PARTS_VERSION);
    put32(out, (uint32_t)cm_lora_count(l));
    put32(out, (uint32_t)n);
    for (int i = 0; l && i < l->n_pairs; i++) {
        const lora_pair *p = &l->pairs[i];
        if (!pair_in(l, p, layer_begin, layer_end, output)) continue;
        const enum cm_lora_target t = (enum cm_lora_target)(p->slot % CM_LORA_TARGET_COUNT);
        int64_t r0, r1, c0, c1;
        needed(l->m, slice, head_split, t, p->n_in, p->n_out, &r0, &r1, &c0, &c1);
        CM_ASSERT(p->a_col0 == 0 && p->a_cols == p->n_in && p->b_row0 == 0 && p->b_rows == p->n_out);
        CM_ASSERT(0 <= r0 && r0 <= r1 && r1 <= p->n_out && 0 <= c0 && c0 <= c1 && c1 <= p->n_in);
        put32(out, (uint32_t)p->adapter);
        put32(out, (uint32_t)(p->slot / CM_LORA_TARGET_COUNT));
        put32(out, (uint32_t)t);
        put32(out, (uint32_t)p->rank);
        put64(out, (uint64_t)p->n_in);
        put64(out, (uint64_t)p->n_out);
        putf(out, p->scale);
        putf(out, p->alpha); /* version 3; 0: none (version 2 had a reserved 0 here) */
        put64(out, (uint64_t)c0);
        put64(out, (uint64_t)(c1 - c0));
        put64(out, (uint64_t)r0);
        put64(out, (uint64_t)(r1 - r0));
        for (int k = 0; k < p->rank; k++) /* A's columns [c0, c1) of every rank row */
            for (int64_t c = c0; c < c1; c++) putf(out, p->a[(int64_t)k * p->n_in + c]);
        for (int64_t k = r0 * p->rank; k < r1 * p->rank; k++) putf(out, p->b[k]); /* B's rows [r0, r1) */
    }
    if (n_pairs) *n_pairs = n;
    return out->oom ? CM_ENOMEM : 0;
}

int cm_lora_add_parts(cm_lora *l, const uint8_t *p, size_t n, char *err, size_t errlen) {
    if (n < PARTS_HDR || get32(p) != PARTS_MAGIC || (get32(p + 4) != PARTS_VERSION && get32(p + 4) != 2))
        return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: bad header");
    const bool v3 = get32(p + 4) == 3; /* alphas: the pairs take rows' own scales */
    const uint32_t n_adapters = get32(p + 8), n_pairs = get32(p + 12);
    if (n_adapters < 1 || n_adapters > 4096 || n_pairs > (n - PARTS_HDR) / PAIR_HDR)
        return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: %u adapters, %u pairs in %zu bytes", n_adapters, n_pairs,
                       n);
    const cm_hparams *hp = &l->m->hp;
    /* Pass 1: every pair in bounds, shaped like the model's weight, its
     * rows/columns inside it, adapters in order: nothing is kept unless all
     * of it is good. */
    size_t off = PARTS_HDR;
    uint32_t prev_adapter = 0;
    for (uint32_t i = 0; i < n_pairs; i++) {
        if (n - off < PAIR_HDR) return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: pair %u is truncated", i);
        const uint8_t *h = p + off;
        uint32_t ad = get32(h), il = get32(h + 4), t = get32(h + 8), rank = get32(h + 12);
        uint64_t n_in = get64(h + 16), n_out = get64(h + 24);
        float scale = getf(h + 32);
        uint64_t c0 = get64(h + 40), nc = get64(h + 48), r0 = get64(h + 56), nr = get64(h + 64);
        if (ad >= n_adapters || ad < prev_adapter || t >= CM_LORA_TARGET_COUNT ||
            (t == CM_LORA_OUTPUT) != (il == (uint32_t)hp->n_layer) || il > (uint32_t)hp->n_layer || rank < 1 ||
            rank > CM_LORA_MAX_RANK || !(scale > -1e9f && scale < 1e9f) ||
            (v3 ? !(getf(h + 36) >= 0 && getf(h + 36) < 1e9f) : get32(h + 36) != 0))
            return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: pair %u is out of range", i);
        prev_adapter = ad;
        char name[64];
        if (t == CM_LORA_OUTPUT) snprintf(name, sizeof name, "output.weight");
        else snprintf(name, sizeof name, "blk.%u.%s.weight", il, target_names[t]);
        const cm_gguf_tensor_info *w = cm_gguf_find_tensor(l->m->gguf, name);
        const cm_tensor *bw = bound_of(l->m, (int)il, (enum cm_lora_target)t);
        if (!w || w->n_dims != 2 || !bw->data || bw->ne[0] != w->ne[0] || bw->ne[1] != w->ne[1] ||
            n_in != (uint64_t)w->ne[0] || n_out != (uint64_t)w->ne[1])
            return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: pair %u does not fit the model's '%s'", i, name);
        /* n_in, n_out: a model's dimensions (< 2^40), rank <= 1024: no overflow in 64 bits */
        if (c0 > n_in || nc > n_in - c0 || r0 > n_out || nr > n_out - r0)
            return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: pair %u holds rows or columns outside '%s'", i, name);
        uint64_t bytes = 4 * (uint64_t)rank * (nc + nr);
        if (bytes > n - off - PAIR_HDR) return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: pair %u is truncated", i);
        off += PAIR_HDR + (size_t)bytes;
    }
    if (off != n) return cm_errf(err, errlen, CM_EFORMAT, "LoRA parts: %zu bytes after the last pair", n - off);
    if (l->n_pairs + (int64_t)n_pairs > INT32_MAX / 2) return cm_errf(err, errlen, CM_ENOMEM, "too many pairs");
    if (grow_adapters(l, (int)n_adapters)) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int cap = l->n_pairs + (int)n_pairs;
    if (cap > l->cap) {
        lora_pair *np = cm_realloc(l->pairs, (size_t)(cap ? cap : 1) * sizeof *np);
        if (!np) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        l->pairs = np;
        l->cap = cap;
    }
    /* Pass 2: copy, then link (only once every copy succeeded). */
    int first = l->n_pairs, k = first;
    off = PARTS_HDR;
    for (uint32_t i = 0; i < n_pairs; i++, k++) {
        const uint8_t *h = p + off;
        lora_pair *q = &l->pairs[k];
        memset(q, 0, sizeof *q);
        q->adapter = l->n_adapters + (int)get32(h);
        q->slot = (int)get32(h + 4) * CM_LORA_TARGET_COUNT + (int)get32(h + 8);
        q->rank = (int)get32(h + 12);
        q->n_in = (int64_t)get64(h + 16);
        q->n_out = (int64_t)get64(h + 24);
        q->scale = getf(h + 32);
        q->alpha = v3 ? getf(h + 36) : 0.0f;
        q->a_col0 = (int64_t)get64(h + 40);
        q->a_cols = (int64_t)get64(h + 48);
        q->b_row0 = (int64_t)get64(h + 56);
        q->b_rows = (int64_t)get64(h + 64);
        q->next = -1;
        const size_t na = (size_t)q->rank * (size_t)q->a_cols, nb = (size_t)q->b_rows * (size_t)q->rank;
        q->a = cm_malloc((na ? na : 1) * sizeof(float));
        q->b = cm_malloc((nb ? nb : 1) * sizeof(float));
        if (!q->a || !q->b) {
            for (int j = first; j <= k; j++) {
                cm_free(l->pairs[j].a);
                cm_free(l->pairs[j].b);
            }
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory for the LoRA parts");
        }
        const uint8_t *d = h + PAIR_HDR;
        for (size_t j = 0; j < na; j++) q->a[j] = getf(d + 4 * j);
        d += 4 * na;
        for (size_t j = 0; j < nb; j++) q->b[j] = getf(d + 4 * j);
        off += PAIR_HDR + 4 * (na + nb);
    }
    for (int j = first; j < k; j++) {
        int s = l->pairs[j].slot;
        if (l->tail[s] >= 0) l->pairs[l->tail[s]].next = j;
        else l->head[s] = j;
        l->tail[s] = j;
    }
    l->n_pairs = k;
    for (uint32_t a = 0; a < n_adapters; a++) { /* version 2: final scales only, no per-row scales */
        l->user[l->n_adapters + (int)a] = 0.0f;
        l->overridable[l->n_adapters + (int)a] = v3;
    }
    l->n_adapters += (int)n_adapters;
    return 0;
}

bool cm_lora_covers(const cm_lora *l, const cm_slice *slice, bool head_split) {
    for (int i = 0; l && i < l->n_pairs; i++) {
        const lora_pair *p = &l->pairs[i];
        int64_t r0, r1, c0, c1;
        needed(l->m, slice, head_split, (enum cm_lora_target)(p->slot % CM_LORA_TARGET_COUNT), p->n_in, p->n_out, &r0,
               &r1, &c0, &c1);
        if (r1 > r0 && (r0 < p->b_row0 || r1 > p->b_row0 + p->b_rows)) return false;
        if (c1 > c0 && (c0 < p->a_col0 || c1 > p->a_col0 + p->a_cols)) return false;
    }
    return true;
}
