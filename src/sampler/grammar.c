/*
 * grammar.c: the byte grammar and its incremental matcher (grammar.h).
 *
 * A finished grammar is one array of elements: rule r's alternatives one
 * after the other, each ended by ALT (or END after the last), byte sets
 * interned in a table. A parse stack is a chain of nodes {pos, up}: pos is
 * where this level continues, up the node of the level below (-1: the
 * root). Live stacks have a byte set at pos. Feeding a byte moves each live
 * stack whose set has it one element on and expands the result (references
 * push, alternative ends pop) until every stack again stops at a byte set,
 * or the root ends (complete).
 *
 * Allocates after cm_grammar_state_new only for the mask cache (one bit per
 * token, MASK_CACHE entries per state, on a new shape); never aborts on a
 * grammar or input (overflows are reported as "not allowed" / CM_EINVAL).
 */
#include "grammar.h"

#include <math.h>
#include <string.h>

enum { E_END, E_ALT, E_SET, E_REF };
typedef struct elem {
    uint8_t t;
    int32_t a; /* E_SET: set index; E_REF: rule id */
} elem;

typedef struct rule_b {
    elem *v;
    int n, cap;
} rule_b;

struct cm_grammar {
    rule_b *rules;
    int n_rules, cap_rules;
    uint64_t (*sets)[4];
    int n_sets, cap_sets;
    int single[256]; /* set index of {b}, or -1 */
    bool oom;
    /* finished */
    bool finished;
    int root;
    elem *el;
    int n_el;
    int32_t *alt_off; /* [n_rules + 1] into alts */
    int32_t *alts;    /* start positions of every rule's alternatives */
};

cm_grammar *cm_grammar_new(void) {
    cm_grammar *g = cm_calloc(1, sizeof *g);
    if (!g) return NULL;
    for (int i = 0; i < 256; i++) g->single[i] = -1;
    return g;
}

void cm_grammar_free(cm_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_rules; i++) cm_free(g->rules[i].v);
    cm_free(g->rules);
    cm_free(g->sets);
    cm_free(g->el);
    cm_free(g->alt_off);
    cm_free(g->alts);
    cm_free(g);
}

int cm_grammar_n_rules(const cm_grammar *g) { return g->n_rules; }

int cm_grammar_rule(cm_grammar *g) {
    if (g->oom || g->finished) return -1;
    if (g->n_rules == g->cap_rules) {
        int nc = g->cap_rules ? 2 * g->cap_rules : 32;
        rule_b *r = cm_realloc(g->rules, (size_t)nc * sizeof *r);
        if (!r) {
            g->oom = true;
            return -1;
        }
        g->rules = r;
        g->cap_rules = nc;
    }
    memset(&g->rules[g->n_rules], 0, sizeof g->rules[0]);
    return g->n_rules++;
}

static void push(cm_grammar *g, int r, uint8_t t, int32_t a) {
    if (g->oom || g->finished || r < 0 || r >= g->n_rules) {
        g->oom = true;
        return;
    }
    rule_b *b = &g->rules[r];
    if (b->n == b->cap) {
        int nc = b->cap ? 2 * b->cap : 8;
        elem *v = cm_realloc(b->v, (size_t)nc * sizeof *v);
        if (!v) {
            g->oom = true;
            return;
        }
        b->v = v;
        b->cap = nc;
    }
    b->v[b->n++] = (elem){.t = t, .a = a};
}

void cm_grammar_alt(cm_grammar *g, int r) { push(g, r, E_ALT, 0); }

static int intern(cm_grammar *g, const uint64_t bits[4]) {
    for (int i = 0; i < g->n_sets; i++)
        if (!memcmp(g->sets[i], bits, sizeof g->sets[i])) return i;
    if (g->n_sets == g->cap_sets) {
        int nc = g->cap_sets ? 2 * g->cap_sets : 32;
        uint64_t(*s)[4] = cm_realloc(g->sets, (size_t)nc * sizeof *s);
        if (!s) {
            g->oom = true;
            return -1;
        }
        g->sets = s;
        g->cap_sets = nc;
    }
    memcpy(g->sets[g->n_sets], bits, sizeof g->sets[0]);
    return g->n_sets++;
}

void cm_grammar_set(cm_grammar *g, int r, const uint64_t bits[4]) {
    int k = intern(g, bits);
    if (k >= 0) push(g, r, E_SET, k);
}

void cm_grammar_range(cm_grammar *g, int r, unsigned lo, unsigned hi) {
    uint64_t bits[4] = {0};
    for (unsigned c = lo; c <= hi && c < 256; c++) bits[c >> 6] |= 1ull << (c & 63);
    if (lo == hi && lo < 256) {
        if (g->single[lo] < 0) g->single[lo] = intern(g, bits);
        if (g->single[lo] >= 0) push(g, r, E_SET, g->single[lo]);
        return;
    }
    cm_grammar_set(g, r, bits);
}

void cm_grammar_lit(cm_grammar *g, int r, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cm_grammar_range(g, r, *p, *p);
}

void cm_grammar_ref(cm_grammar *g, int r, int sub) { push(g, r, E_REF, sub); }

/* Can rule r start with r itself without consuming a byte (left recursion)?
 * Depth-first over the rules that can be empty-prefixed. */
static bool nullable(const cm_grammar *g, int r, uint8_t *memo);

static bool seq_nullable(const cm_grammar *g, const elem *e, uint8_t *memo) {
    for (; e->t != E_END && e->t != E_ALT; e++)
        if (e->t == E_SET || !nullable(g, e->a, memo)) return false;
    return true;
}

static bool nullable(const cm_grammar *g, int r, uint8_t *memo) {
    if (memo[r]) return memo[r] == 2; /* 1: in progress (assume not), 2: yes, 3: no */
    memo[r] = 1;
    bool y = false;
    for (int k = g->alt_off[r]; k < g->alt_off[r + 1] && !y; k++) y = seq_nullable(g, g->el + g->alts[k], memo);
    memo[r] = y ? 2 : 3;
    return y;
}

static bool left_rec(const cm_grammar *g, int r, int target, uint8_t *seen, uint8_t *memo) {
    if (seen[r]) return false;
    seen[r] = 1;
    for (int k = g->alt_off[r]; k < g->alt_off[r + 1]; k++)
        for (const elem *e = g->el + g->alts[k]; e->t == E_REF; e++) {
            if (e->a == target || left_rec(g, e->a, target, seen, memo)) return true;
            if (!nullable(g, e->a, memo)) break;
        }
    return false;
}

int cm_grammar_finish(cm_grammar *g, int root, char *err, size_t errlen) {
    if (g->finished) return cm_errf(err, errlen, CM_ESTATE, "grammar already finished");
    if (g->oom) return cm_errf(err, errlen, CM_ENOMEM, "out of memory building the grammar");
    if (root < 0 || root >= g->n_rules) return cm_errf(err, errlen, CM_EINVAL, "no root rule %d", root);
    int n = 0, na = 0;
    for (int r = 0; r < g->n_rules; r++) {
        n += g->rules[r].n + 1;
        na += 1;
        for (int i = 0; i < g->rules[r].n; i++) na += g->rules[r].v[i].t == E_ALT;
    }
    g->el = cm_malloc((size_t)n * sizeof *g->el);
    g->alt_off = cm_malloc((size_t)(g->n_rules + 1) * sizeof *g->alt_off);
    g->alts = cm_malloc((size_t)na * sizeof *g->alts);
    if (!g->el || !g->alt_off || !g->alts) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int p = 0, a = 0;
    for (int r = 0; r < g->n_rules; r++) {
        g->alt_off[r] = a;
        g->alts[a++] = p;
        for (int i = 0; i < g->rules[r].n; i++) {
            elem e = g->rules[r].v[i];
            if (e.t == E_REF && (e.a < 0 || e.a >= g->n_rules))
                return cm_errf(err, errlen, CM_EINVAL, "rule %d refers to no rule %d", r, e.a);
            g->el[p++] = e;
            if (e.t == E_ALT) g->alts[a++] = p;
        }
        g->el[p++] = (elem){.t = E_END};
    }
    g->alt_off[g->n_rules] = a;
    g->n_el = p;
    g->root = root;
    uint8_t *seen = cm_calloc((size_t)g->n_rules, 2);
    if (!seen) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    uint8_t *memo = seen + g->n_rules;
    int bad = -1;
    for (int r = 0; r < g->n_rules && bad < 0; r++) {
        memset(seen, 0, (size_t)g->n_rules);
        if (left_rec(g, r, r, seen, memo)) bad = r;
    }
    cm_free(seen);
    if (bad >= 0) return cm_errf(err, errlen, CM_EINVAL, "rule %d is left-recursive", bad);
    g->finished = true;
    return 0;
}

/* ---- matching ---- */

#define ARENA (1 << 15)

typedef struct node {
    int32_t pos, up;
} node;

/* Masks are cached by the state's shape: the positions along every stack's
 * chain plus the complete flag. Inside a long string (or any loop) the shape
 * repeats token after token, and the mask with it; computing one walks the
 * whole vocabulary, so this is what makes constrained decoding affordable. */
#define MASK_CACHE 8
#define SIG_MAX 4096
typedef struct mask_entry {
    int32_t *sig; /* [SIG_MAX], n_sig used */
    int n_sig;
    int32_t vocab_cap; /* bits has room for this many ids */
    const void *vocab;
    uint8_t *bits; /* allowed ids, one bit each */
    int n_ok;
    unsigned used;
} mask_entry;

struct cm_grammar_state {
    const cm_grammar *g;
    mask_entry cache[MASK_CACHE];
    unsigned tick;
    int32_t sig[SIG_MAX];
    node *nodes, *spare;
    int32_t *remap;
    int n_nodes;
    int32_t stacks[CM_GRAMMAR_MAX_STACKS];
    int n_stacks;
    bool complete;
    int32_t buf[2][CM_GRAMMAR_MAX_STACKS];
};

typedef struct walk {
    cm_grammar_state *s;
    int32_t *out;
    int n_out;
    bool complete, overflow;
} walk;

static int new_node(cm_grammar_state *s, int32_t pos, int32_t up) {
    if (s->n_nodes >= ARENA) return -1;
    s->nodes[s->n_nodes] = (node){pos, up};
    return s->n_nodes++;
}

/* Move from position pos (level up) to every byte set reachable without a byte. */
static void expand(walk *w, int32_t pos, int32_t up, int depth) {
    cm_grammar_state *s = w->s;
    const elem *e = &s->g->el[pos];
    if (depth > CM_GRAMMAR_MAX_DEPTH) {
        w->overflow = true;
        return;
    }
    if (e->t == E_END || e->t == E_ALT) {
        if (up < 0) {
            w->complete = true;
            return;
        }
        expand(w, s->nodes[up].pos, s->nodes[up].up, depth + 1);
        return;
    }
    if (e->t == E_REF) {
        /* a reference that ends its alternative continues straight at up (a
         * tail call): right recursion (x ::= a x) then runs in constant depth */
        uint8_t next = s->g->el[pos + 1].t;
        int cont = next == E_END || next == E_ALT ? up : new_node(s, pos + 1, up);
        if (cont < 0 && !(next == E_END || next == E_ALT)) {
            w->overflow = true;
            return;
        }
        const cm_grammar *g = s->g;
        for (int k = g->alt_off[e->a]; k < g->alt_off[e->a + 1]; k++) expand(w, g->alts[k], cont, depth + 1);
        return;
    }
    for (int i = 0; i < w->n_out; i++) /* the same stack twice (same chain node) */
        if (s->nodes[w->out[i]].pos == pos && s->nodes[w->out[i]].up == up) return;
    if (w->n_out == CM_GRAMMAR_MAX_STACKS) {
        w->overflow = true;
        return;
    }
    int k = new_node(s, pos, up);
    if (k < 0) {
        w->overflow = true;
        return;
    }
    w->out[w->n_out++] = k;
}

static bool has(const uint64_t *set, unsigned char c) { return set[c >> 6] >> (c & 63) & 1; }

/* Feed bytes p[0..n) from the current stacks. On success the result is in
 * w (its out buffer alternates between s->buf). */
static bool feed(cm_grammar_state *s, const char *p, size_t n, walk *w) {
    const int32_t *cur = s->stacks;
    int n_cur = s->n_stacks;
    w->complete = s->complete;
    w->out = (int32_t *)cur;
    w->n_out = n_cur;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        walk nw = {.s = s, .out = s->buf[i & 1], .n_out = 0};
        for (int k = 0; k < n_cur; k++) {
            node nd = s->nodes[cur[k]];
            if (has(s->g->sets[s->g->el[nd.pos].a], c)) expand(&nw, nd.pos + 1, nd.up, 0);
        }
        if (nw.overflow) return false;
        if (nw.n_out == 0 && !(nw.complete && i + 1 == n)) return false;
        *w = nw;
        cur = nw.out;
        n_cur = nw.n_out;
    }
    return true;
}

cm_grammar_state *cm_grammar_state_new(const cm_grammar *g) {
    if (!g || !g->finished) return NULL;
    cm_grammar_state *s = cm_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = g;
    s->nodes = cm_malloc(ARENA * sizeof *s->nodes);
    s->spare = cm_malloc(ARENA * sizeof *s->spare);
    s->remap = cm_malloc(ARENA * sizeof *s->remap);
    if (!s->nodes || !s->spare || !s->remap) {
        cm_grammar_state_free(s);
        return NULL;
    }
    walk w = {.s = s, .out = s->stacks};
    for (int k = g->alt_off[g->root]; k < g->alt_off[g->root + 1]; k++) expand(&w, g->alts[k], -1, 0);
    if (w.overflow) {
        cm_grammar_state_free(s);
        return NULL;
    }
    s->n_stacks = w.n_out;
    s->complete = w.complete;
    return s;
}

void cm_grammar_state_free(cm_grammar_state *s) {
    if (!s) return;
    for (int i = 0; i < MASK_CACHE; i++) {
        cm_free(s->cache[i].sig);
        cm_free(s->cache[i].bits);
    }
    cm_free(s->nodes);
    cm_free(s->spare);
    cm_free(s->remap);
    cm_free(s);
}

bool cm_grammar_allows(cm_grammar_state *s, const char *p, size_t n) {
    int mark = s->n_nodes;
    walk w;
    bool ok = feed(s, p, n, &w);
    s->n_nodes = mark;
    return ok;
}

static int32_t copy_chain(cm_grammar_state *s, int32_t k, int *n_new) {
    if (k < 0) return -1;
    if (s->remap[k] >= 0) return s->remap[k];
    int32_t up = copy_chain(s, s->nodes[k].up, n_new);
    s->spare[*n_new] = (node){s->nodes[k].pos, up};
    s->remap[k] = *n_new;
    return (*n_new)++;
}

int cm_grammar_accept(cm_grammar_state *s, const char *p, size_t n) {
    int mark = s->n_nodes;
    walk w;
    if (!feed(s, p, n, &w)) {
        s->n_nodes = mark;
        return CM_EINVAL;
    }
    if (n == 0) return 0;
    /* Keep only the chains of the live stacks (compaction). */
    for (int i = 0; i < s->n_nodes; i++) s->remap[i] = -1;
    int n_new = 0;
    int32_t tops[CM_GRAMMAR_MAX_STACKS];
    for (int i = 0; i < w.n_out; i++) tops[i] = copy_chain(s, w.out[i], &n_new);
    node *t = s->nodes;
    s->nodes = s->spare;
    s->spare = t;
    s->n_nodes = n_new;
    memcpy(s->stacks, tops, (size_t)w.n_out * sizeof *tops);
    s->n_stacks = w.n_out;
    s->complete = w.complete;
    return 0;
}

bool cm_grammar_complete(const cm_grammar_state *s) { return s->complete; }
bool cm_grammar_done(const cm_grammar_state *s) { return s->complete && s->n_stacks == 0; }

/* The state's shape into s->sig; its length, or -1 when too long to cache. */
static int shape(cm_grammar_state *s) {
    int n = 0;
    for (int i = 0; i < s->n_stacks; i++) {
        for (int32_t k = s->stacks[i]; k >= 0; k = s->nodes[k].up) {
            if (n >= SIG_MAX - 2) return -1;
            s->sig[n++] = s->nodes[k].pos;
        }
        s->sig[n++] = -1;
    }
    s->sig[n++] = s->complete ? -2 : -3;
    return n;
}

static int apply(const mask_entry *e, int32_t n_vocab, float *logits) {
    for (int32_t id = 0; id < n_vocab; id++)
        if (!(e->bits[id >> 3] >> (id & 7) & 1)) logits[id] = -INFINITY;
    return e->n_ok;
}

int cm_grammar_mask(cm_grammar_state *s, const cm_grammar_vocab *v, float *logits) {
    int n_sig = shape(s);
    for (int i = 0; n_sig > 0 && i < MASK_CACHE; i++) {
        mask_entry *e = &s->cache[i];
        if (e->vocab == v && e->n_sig == n_sig && !memcmp(e->sig, s->sig, (size_t)n_sig * sizeof *s->sig)) {
            e->used = ++s->tick;
            return apply(e, v->n_vocab, logits);
        }
    }
    uint64_t first[4] = {0};
    for (int i = 0; i < s->n_stacks; i++) {
        const uint64_t *set = s->g->sets[s->g->el[s->nodes[s->stacks[i]].pos].a];
        for (int k = 0; k < 4; k++) first[k] |= set[k];
    }
    /* the least recently used entry takes the new mask (no cache when out of memory) */
    mask_entry *e = NULL;
    if (n_sig > 0) {
        e = &s->cache[0];
        for (int i = 1; i < MASK_CACHE; i++)
            if (s->cache[i].used < e->used) e = &s->cache[i];
        /* sized once per entry (at most MASK_CACHE allocations per request), then reused */
        if (e->bits && e->vocab_cap != v->n_vocab) {
            cm_free(e->bits);
            e->bits = NULL;
        }
        if (!e->sig) e->sig = cm_malloc(SIG_MAX * sizeof *e->sig);
        if (!e->bits) e->bits = cm_malloc(((size_t)v->n_vocab + 7) / 8), e->vocab_cap = v->n_vocab;
        if (!e->sig || !e->bits) e = NULL;
        else {
            memset(e->bits, 0, ((size_t)v->n_vocab + 7) / 8);
            e->vocab = NULL; /* invalid until filled */
        }
    }
    int n_ok = 0;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        bool ok;
        if (v->never && v->never[id]) ok = false;
        else if (v->eog && v->eog[id]) ok = s->complete;
        else {
            uint32_t a = v->off[id], b = v->off[id + 1];
            ok = b > a && has(first, (unsigned char)v->bytes[a]) && cm_grammar_allows(s, v->bytes + a, b - a);
        }
        if (ok) {
            n_ok++;
            if (e) e->bits[id >> 3] |= (uint8_t)(1u << (id & 7));
        } else {
            logits[id] = -INFINITY;
        }
    }
    if (e) {
        memcpy(e->sig, s->sig, (size_t)n_sig * sizeof *e->sig);
        e->n_sig = n_sig;
        e->vocab = v;
        e->n_ok = n_ok;
        e->used = ++s->tick;
    }
    return n_ok;
}
