/*
 * tok_encode.c: text -> token ids, following llama.cpp's llama_tokenize step
 * by step: special tokens are cut out of the text first (user-defined always,
 * control/unknown only when asked), then each remaining piece goes through
 * SPM (▁ for spaces, bigram merges by score, <0xXX> byte fallback) or
 * byte-level BPE (pre-tokenizer regexes, GPT-2 byte mapping, merges by rank).
 *
 * Input is any bytes: invalid UTF-8 is decoded as llama.cpp does (each bad
 * byte becomes U+FFFD for BPE; SPM works on raw bytes). Scratch memory is
 * per call and freed before returning; nothing here may keep state between
 * calls, so one tokenizer serves many threads.
 */
#include "tok_internal.h"

#include <string.h>

/* ---- UTF-8 ---- */

uint32_t cm_tok_utf8_lax(const uint8_t *p, size_t n, size_t *i) {
    size_t k = *i;
    uint8_t b = p[k];
    if (!(b & 0x80)) {
        *i = k + 1;
        return b;
    }
    if (!(b & 0x40)) goto bad;
#define CONT(j) ((p[k + (j)] & 0xC0) == 0x80)
    if (!(b & 0x20)) {
        if (k + 1 >= n || !CONT(1)) goto bad;
        *i = k + 2;
        return ((uint32_t)(b & 0x1F) << 6) | (p[k + 1] & 0x3F);
    }
    if (!(b & 0x10)) {
        if (k + 2 >= n || !CONT(1) || !CONT(2)) goto bad;
        *i = k + 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(p[k + 1] & 0x3F) << 6) | (p[k + 2] & 0x3F);
    }
    if (!(b & 0x08)) {
        if (k + 3 >= n || !CONT(1) || !CONT(2) || !CONT(3)) goto bad;
        *i = k + 4;
        return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(p[k + 1] & 0x3F) << 12) | ((uint32_t)(p[k + 2] & 0x3F) << 6) |
               (p[k + 3] & 0x3F);
    }
#undef CONT
bad:
    *i = k + 1;
    return UINT32_MAX;
}

size_t cm_tok_utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- scratch ---- */

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n;
} sym;
typedef struct bigram {
    int32_t left, right;
    float score;
    int32_t rank;
    uint32_t size;
} bigram;
typedef struct frag {
    cm_token tok;
    size_t off, len;
} frag;

typedef struct scratch {
    cm_token *ids;
    size_t n_ids, cap_ids;
    char *a;
    size_t cap_a; /* SPM text / BPE canonical text */
    char *b;
    size_t cap_b; /* BPE match subject */
    char *w;
    size_t cap_w; /* BPE byte-encoded word */
    sym *syms;
    size_t cap_syms;
    bigram *heap;
    size_t n_heap, cap_heap;
    frag *fr;
    size_t n_fr, cap_fr;
    frag *fr2;
    size_t n_fr2, cap_fr2;
    cm_tok_spans words, tmp;
    bool spm; /* heap order */
} scratch;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return false;
        c *= 2;
    }
    void *q = cm_realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}
#define GROW(ptr, cap, need) grow((void **)&(ptr), &(cap), (need), sizeof(*(ptr)))

static bool push_id(scratch *s, cm_token id) {
    if (!GROW(s->ids, s->cap_ids, s->n_ids + 1)) return false;
    s->ids[s->n_ids++] = id;
    return true;
}

static void scratch_free(scratch *s) {
    cm_free(s->ids);
    cm_free(s->a);
    cm_free(s->b);
    cm_free(s->w);
    cm_free(s->syms);
    cm_free(s->heap);
    cm_free(s->fr);
    cm_free(s->fr2);
    cm_free(s->words.v);
    cm_free(s->tmp.v);
}

/* ---- merge queue: SPM pops the highest score, BPE the lowest rank; ties by leftmost ---- */

static bool before(const scratch *s, const bigram *x, const bigram *y) {
    if (s->spm) return x->score > y->score || (x->score == y->score && x->left < y->left);
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static bool heap_push(scratch *s, bigram b) {
    if (!GROW(s->heap, s->cap_heap, s->n_heap + 1)) return false;
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(s, &b, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
    return true;
}

static bigram heap_pop(scratch *s) {
    bigram top = s->heap[0], last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(s, &s->heap[c + 1], &s->heap[c])) c++;
        if (!before(s, &s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Split text into symbols of one (lax) UTF-8 character each, chained. */
static int make_symbols(scratch *s, const char *text, size_t n, size_t *nsym) {
    if (!GROW(s->syms, s->cap_syms, n + 1)) return CM_ENOMEM;
    size_t k = 0, off = 0;
    while (off < n) {
        size_t len = CM_MIN(cm_tok_utf8_len((uint8_t)text[off]), n - off);
        s->syms[k] = (sym){(int32_t)k - 1, off + len == n ? -1 : (int32_t)k + 1, (uint32_t)off, (uint32_t)len};
        off += len;
        k++;
    }
    *nsym = k;
    return 0;
}

/* Run the merge loop over s->syms (text is what their offsets index). */
static int merge_loop(const cm_tokenizer *t, scratch *s, const char *text, size_t nsym) {
    s->n_heap = 0;
#define TRY_ADD(L, R)                                                                             \
    do {                                                                                          \
        int32_t l_ = (L), r_ = (R);                                                               \
        if (l_ >= 0 && r_ >= 0) {                                                                 \
            const sym *a_ = &s->syms[l_], *b_ = &s->syms[r_];                                     \
            bigram g_ = {l_, r_, 0, 0, a_->n + b_->n};                                            \
            bool ok_ = false;                                                                     \
            if (s->spm) {                                                                         \
                cm_token id_ = cm_tok_lookup(t, text + a_->off, a_->n + b_->n);                   \
                if (id_ != CM_TOKEN_NULL) {                                                       \
                    g_.score = t->score[id_];                                                     \
                    ok_ = true;                                                                   \
                }                                                                                 \
            } else {                                                                              \
                int32_t rk_ = cm_tok_merge_rank(t, text + a_->off, a_->n, text + b_->off, b_->n); \
                if (rk_ >= 0) {                                                                   \
                    g_.rank = rk_;                                                                \
                    ok_ = true;                                                                   \
                }                                                                                 \
            }                                                                                     \
            if (ok_ && !heap_push(s, g_)) return CM_ENOMEM;                                       \
        }                                                                                         \
    } while (0)
    for (size_t i = 1; i < nsym; i++) TRY_ADD((int32_t)i - 1, (int32_t)i);
    while (s->n_heap) {
        bigram g = heap_pop(s);
        sym *l = &s->syms[g.left], *r = &s->syms[g.right];
        /* stale: one side already merged (a symbol only ever absorbs its right neighbour) */
        if (!l->n || !r->n || l->n + r->n != g.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = g.left;
        TRY_ADD(l->prev, g.left);
        TRY_ADD(g.left, l->next);
    }
#undef TRY_ADD
    return 0;
}

/* ---- SPM ---- */

static int spm_byte(const cm_tokenizer *t, scratch *s, uint8_t c, char *err, size_t errlen) {
    static const char hex[] = "0123456789ABCDEF";
    char buf[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
    cm_token id = cm_tok_lookup(t, buf, 6);
    if (id == CM_TOKEN_NULL) id = cm_tok_lookup(t, (const char *)&c, 1);
    if (id == CM_TOKEN_NULL)
        return cm_errf(err, errlen, CM_EFORMAT, "the vocabulary has no token for byte 0x%02X (no <0x%02X>)", c, c);
    return push_id(s, id) ? 0 : CM_ENOMEM;
}

static int spm_fragment(const cm_tokenizer *t, scratch *s, const char *p, size_t n, bool prefix, char *err,
                        size_t errlen) {
    /* space prefix, then every ' ' -> U+2581 (3 bytes) */
    size_t need = 3 * (n + 1);
    if (!GROW(s->a, s->cap_a, need)) return CM_ENOMEM;
    size_t m = 0;
    if (prefix) {
        memcpy(s->a, "\xe2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(s->a + m, "\xe2\x96\x81", 3);
            m += 3;
        } else s->a[m++] = p[i];
    }
    size_t nsym;
    int rc = make_symbols(s, s->a, m, &nsym);
    if (rc) return rc;
    s->spm = true;
    if ((rc = merge_loop(t, s, s->a, nsym))) return rc;
    for (int32_t i = nsym ? 0 : -1; i != -1; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        cm_token id = cm_tok_lookup(t, s->a + y->off, y->n);
        if (id != CM_TOKEN_NULL) {
            if (!push_id(s, id)) return CM_ENOMEM;
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++)
            if ((rc = spm_byte(t, s, (uint8_t)s->a[y->off + j], err, errlen))) return rc;
    }
    return 0;
}

/* ---- BPE ---- */

static int bpe_word(const cm_tokenizer *t, scratch *s, const char *w, size_t n) {
    if (t->ignore_merges) {
        cm_token id = cm_tok_lookup(t, w, n);
        if (id != CM_TOKEN_NULL) return push_id(s, id) ? 0 : CM_ENOMEM;
    }
    size_t nsym;
    int rc = make_symbols(s, w, n, &nsym);
    if (rc) return rc;
    s->spm = false;
    if ((rc = merge_loop(t, s, w, nsym))) return rc;
    for (int32_t i = nsym ? 0 : -1; i != -1; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        cm_token id = cm_tok_lookup(t, w + y->off, y->n);
        if (id != CM_TOKEN_NULL) {
            if (!push_id(s, id)) return CM_ENOMEM;
            continue;
        }
        /* llama.cpp: look each byte up as a one-byte token; bytes without one are dropped */
        for (uint32_t j = 0; j < y->n; j++) {
            cm_token b = cm_tok_lookup(t, w + y->off + j, 1);
            if (b != CM_TOKEN_NULL && !push_id(s, b)) return CM_ENOMEM;
        }
    }
    return 0;
}

static int bpe_fragment(const cm_tokenizer *t, scratch *s, const char *p, size_t n, char *err, size_t errlen) {
    /* Canonical UTF-8 of what llama.cpp decodes (bad bytes -> U+FFFD), and a
     * copy for PCRE2 with surrogates (valid to llama.cpp, not to PCRE2) shown
     * as U+E000, which no pre-tokenizer class tells apart from them. */
    uint64_t need;
    if (!cm_mul_ok(n, 4, &need) || !GROW(s->a, s->cap_a, need + 4) || !GROW(s->b, s->cap_b, need + 4)) return CM_ENOMEM;
    size_t i = 0, m = 0;
    while (i < n) {
        uint32_t cp = cm_tok_utf8_lax((const uint8_t *)p, n, &i);
        if (cp > 0x10FFFF) cp = 0xFFFD; /* also: llama.cpp throws for > U+10FFFF; we do not */
        size_t k = cm_tok_utf8_put(cp, s->a + m);
        if (cp >= 0xD800 && cp <= 0xDFFF) memcpy(s->b + m, "\xee\x80\x80", 3);
        else memcpy(s->b + m, s->a + m, k);
        m += k;
    }
    int rc = cm_tok_pre_split(t, s->b, m, &s->words, &s->tmp, err, errlen);
    if (rc) return rc;
    for (size_t wi = 0; wi < s->words.n; wi++) {
        cm_tok_span sp = s->words.v[wi];
        if (!GROW(s->w, s->cap_w, 2 * sp.len + 1)) return CM_ENOMEM;
        size_t wl = 0;
        for (size_t j = 0; j < sp.len; j++) { wl += cm_tok_byte_to_utf8((uint8_t)s->a[sp.off + j], s->w + wl); }
        if ((rc = bpe_word(t, s, s->w, wl))) return rc;
    }
    return 0;
}

/* ---- special-token partition (llama.cpp's tokenizer_st_partition) ---- */

static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static int partition(const cm_tokenizer *t, scratch *s, const char *text, size_t n, bool parse_special) {
    s->n_fr = 0;
    if (!n) return 0;
    if (!GROW(s->fr, s->cap_fr, 1)) return CM_ENOMEM;
    s->fr[s->n_fr++] = (frag){CM_TOKEN_NULL, 0, n};
    for (size_t k = 0; k < t->n_special; k++) {
        cm_token id = t->special[k];
        uint32_t a = t->attr[id];
        if (!parse_special && (a & (CM_TOK_ATTR_CONTROL | CM_TOK_ATTR_UNKNOWN))) continue;
        const char *tx = t->text_blob + t->text_off[id];
        size_t tl = t->text_len[id];
        s->n_fr2 = 0;
        for (size_t f = 0; f < s->n_fr; f++) {
            frag fr = s->fr[f];
            const char *m = fr.tok == CM_TOKEN_NULL && fr.len >= tl ? memmem(text + fr.off, fr.len, tx, tl) : NULL;
            if (!m) {
                if (!GROW(s->fr2, s->cap_fr2, s->n_fr2 + 1)) return CM_ENOMEM;
                s->fr2[s->n_fr2++] = fr;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            while (m) {
                size_t mo = (size_t)(m - text), ll = mo - pos;
                if (a & CM_TOK_ATTR_LSTRIP)
                    while (ll > 0 && is_space(text[pos + ll - 1])) ll--;
                if (!GROW(s->fr2, s->cap_fr2, s->n_fr2 + 2)) return CM_ENOMEM;
                if (ll) s->fr2[s->n_fr2++] = (frag){CM_TOKEN_NULL, pos, ll};
                s->fr2[s->n_fr2++] = (frag){id, 0, 0};
                pos = mo + tl;
                if (pos >= end) break;
                if (a & CM_TOK_ATTR_RSTRIP)
                    while (pos < end && is_space(text[pos])) pos++;
                m = end - pos >= tl ? memmem(text + pos, end - pos, tx, tl) : NULL;
            }
            if (pos < end) {
                if (!GROW(s->fr2, s->cap_fr2, s->n_fr2 + 1)) return CM_ENOMEM;
                s->fr2[s->n_fr2++] = (frag){CM_TOKEN_NULL, pos, end - pos};
            }
        }
        frag *sw = s->fr;
        s->fr = s->fr2;
        s->fr2 = sw;
        size_t c = s->cap_fr;
        s->cap_fr = s->cap_fr2;
        s->cap_fr2 = c;
        s->n_fr = s->n_fr2;
    }
    return 0;
}

static int encode(const cm_tokenizer *t, scratch *s, const char *text, size_t n, unsigned flags, char *err,
                  size_t errlen) {
    int rc = partition(t, s, text, n, (flags & CM_TOK_PARSE_SPECIAL) != 0);
    if (rc) return rc;
    bool add = (flags & CM_TOK_ADD_SPECIAL) != 0;
    if (add && t->add_bos && !push_id(s, t->bos)) return CM_ENOMEM;
    bool prev_special = true; /* SPM: a space prefix before text that starts the input or follows a special token */
    for (size_t f = 0; f < s->n_fr; f++) {
        const frag *fr = &s->fr[f];
        if (fr->tok != CM_TOKEN_NULL) {
            if (!push_id(s, fr->tok)) return CM_ENOMEM;
            prev_special = true;
            continue;
        }
        if (t->kind == CM_TOK_SPM)
            rc = spm_fragment(t, s, text + fr->off, fr->len, t->add_space_prefix && prev_special, err, errlen);
        else rc = bpe_fragment(t, s, text + fr->off, fr->len, err, errlen);
        if (rc) return rc;
        prev_special = false;
    }
    if (add && t->add_eos && !push_id(s, t->eos)) return CM_ENOMEM;
    return 0;
}

int cm_tokenizer_encode_alloc(const cm_tokenizer *t, const char *text, size_t n, unsigned flags, cm_token **out,
                              size_t *n_out, char *err, size_t errlen) {
    scratch s;
    memset(&s, 0, sizeof s);
    *out = NULL;
    *n_out = 0;
    int rc = encode(t, &s, text, n, flags, err, errlen);
    if (rc == CM_ENOMEM) cm_errf(err, errlen, rc, "out of memory while tokenizing %zu bytes", n);
    if (!rc) {
        *out = s.ids ? s.ids : cm_malloc(sizeof(cm_token));
        if (!*out) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        *n_out = s.n_ids;
        s.ids = NULL;
    }
    scratch_free(&s);
    return rc;
}

int cm_tokenizer_encode(const cm_tokenizer *t, const char *text, size_t n, unsigned flags, cm_token *out, size_t cap,
                        size_t *n_out, char *err, size_t errlen) {
    cm_token *ids;
    size_t k;
    int rc = cm_tokenizer_encode_alloc(t, text, n, flags, &ids, &k, err, errlen);
    if (rc) return rc;
    *n_out = k;
    if (CM_MIN(k, cap)) memcpy(out, ids, CM_MIN(k, cap) * sizeof(cm_token));
    cm_free(ids);
    if (k > cap) return cm_errf(err, errlen, CM_ERANGE, "%zu tokens do not fit in %zu", k, cap);
    return 0;
}
