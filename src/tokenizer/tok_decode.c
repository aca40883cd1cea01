/*
 * tok_decode.c: token ids -> text. Pieces are computed once per tokenizer
 * (llama.cpp's token-to-piece cache) so the token loop only looks them up;
 * cm_tokenizer_decode reproduces llama_detokenize including its leading-space
 * and clean-up rules; cm_detok streams valid UTF-8 piece by piece.
 *
 * Must never emit invalid UTF-8 from the streaming path, and never allocate
 * there (the generation loop calls it once per token).
 */
#include "tok_internal.h"

#include <string.h>

/* ---- GPT-2 byte <-> unicode ---- */

/* Printable bytes map to themselves; the other 68 map to U+0100.. in byte order. */
static uint32_t byte_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33 + (b - 0x7F);
    return 256u + 67; /* 0xAD */
}

size_t cm_tok_byte_to_utf8(uint8_t b, char out[2]) { return cm_tok_utf8_put(byte_cp(b), out); }

int cm_tok_utf8_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 256 || cp > 256 + 67) return -1;
    uint32_t n = cp - 256;
    if (n <= 32) return (int)n;
    if (n <= 66) return (int)(0x7F + n - 33);
    return 0xAD;
}

/* ---- pieces ---- */

static void put_text(cm_buf *b, const cm_tokenizer *t, cm_token id) {
    cm_buf_append(b, t->text_blob + t->text_off[id], t->text_len[id]);
}

/* The byte of a <0xXX> token: the hex digits at [3, 5), as llama.cpp reads them. */
static uint8_t token_byte(const char *s, size_t n) {
    unsigned v = 0;
    for (size_t i = 3; i < n && i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) break;
        v = v * 16 + (unsigned)d;
    }
    return (uint8_t)v;
}

static void piece_of(const cm_tokenizer *t, cm_token id, cm_buf *b) {
    uint32_t a = t->attr[id];
    const char *s = t->text_blob + t->text_off[id];
    size_t n = t->text_len[id];
    if (a & (CM_TOK_ATTR_UNKNOWN | CM_TOK_ATTR_CONTROL | CM_TOK_ATTR_USER_DEFINED)) {
        put_text(b, t, id);
    } else if (a & CM_TOK_ATTR_NORMAL) {
        if (t->kind == CM_TOK_SPM) {
            for (size_t i = 0; i < n; i++) {
                if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                    cm_buf_append(b, " ", 1);
                    i += 2;
                } else cm_buf_append(b, s + i, 1);
            }
        } else {
            /* byte-level decode; a character outside the mapping is written the
             * way llama.cpp writes it: [UNK_BYTE_0x<its utf8 hex><token text>] */
            size_t i = 0;
            while (i < n) {
                uint32_t cp = cm_tok_utf8_lax((const uint8_t *)s, n, &i);
                if (cp > 0x10FFFF) cp = 0xFFFD;
                int by = cm_tok_utf8_to_byte(cp);
                if (by >= 0) {
                    char c = (char)by;
                    cm_buf_append(b, &c, 1);
                } else {
                    char u[4];
                    size_t k = cm_tok_utf8_put(cp, u);
                    cm_buf_puts(b, "[UNK_BYTE_0x");
                    for (size_t j = 0; j < k; j++) cm_buf_printf(b, "%02x", (uint8_t)u[j]);
                    cm_buf_append(b, s, n);
                    cm_buf_puts(b, "]");
                }
            }
        }
    } else if (a & CM_TOK_ATTR_BYTE) {
        char c = (char)token_byte(s, n);
        cm_buf_append(b, &c, 1);
    }
    /* UNDEFINED / UNUSED: nothing */
}

int cm_tok_build_pieces(cm_tokenizer *t, char *err, size_t errlen) {
    cm_buf b;
    cm_buf_init(&b);
    t->piece_off = cm_calloc((size_t)t->n_vocab, sizeof(uint64_t));
    t->piece_len = cm_calloc((size_t)t->n_vocab, sizeof(uint32_t));
    if (!t->piece_off || !t->piece_len) return CM_ENOMEM;
    for (cm_token id = 0; id < t->n_vocab; id++) {
        size_t before = b.len;
        piece_of(t, id, &b);
        if (b.oom) break;
        t->piece_off[id] = before;
        t->piece_len[id] = (uint32_t)(b.len - before);
        if (t->piece_len[id] > t->max_piece_len) t->max_piece_len = t->piece_len[id];
    }
    if (b.oom) {
        cm_buf_release(&b);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory building token pieces");
    }
    t->piece_blob = b.data ? b.data : cm_malloc(1);
    return t->piece_blob ? 0 : CM_ENOMEM;
}

const char *cm_tokenizer_piece(const cm_tokenizer *t, cm_token id, bool special, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (!special && (t->attr[id] & (CM_TOK_ATTR_UNKNOWN | CM_TOK_ATTR_CONTROL))) {
        if (len) *len = 0;
        return "";
    }
    if (len) *len = t->piece_len[id];
    return t->piece_blob + t->piece_off[id];
}

/* ---- whole-sequence decode ---- */

/* llama.cpp's clean-up of tokenization spaces, done in place on s[0..n):
 * " ?" " !" " ." " ," lose the space; " ' " loses both; " 's" " 'm" " 're"
 * " 've" lose the space. Returns the new length. */
static size_t clean_spaces(char *s, size_t n) {
    size_t total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        s[total++] = x;
    }
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = s[i];
        if (x == '\'' && i + 1 < n && s[i - 1] == ' ' && s[i + 1] == ' ') {
            total--;
            s[++i] = '\0';
        }
        s[total++] = x;
    }
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            char x1 = s[i + 1];
            if (x1 == 's' || x1 == 'm') total--;
            else if (i + 2 < n && ((x1 == 'r' && s[i + 2] == 'e') || (x1 == 'v' && s[i + 2] == 'e'))) total--;
        }
        s[total++] = x;
    }
    return total;
}

int cm_tokenizer_decode(const cm_tokenizer *t, const cm_token *ids, size_t n, unsigned flags, cm_buf *out, char *err,
                        size_t errlen) {
    bool remove_space = t->add_space_prefix;
    bool special = (flags & CM_TOK_UNPARSE_SPECIAL) != 0;
    if ((flags & CM_TOK_REMOVE_SPECIAL) && t->add_bos && n > 0 && ids[0] == t->bos) {
        remove_space = false;
        ids++;
        n--;
    }
    if ((flags & CM_TOK_REMOVE_SPECIAL) && t->add_eos && n > 0 && ids[n - 1] == t->eos) n--;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return cm_errf(err, errlen, CM_ERANGE, "token id %d is out of range (vocabulary of %d)", ids[i],
                           t->n_vocab);
    size_t start = out->len;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = cm_tokenizer_piece(t, ids[i], special, &len);
        if (remove_space && len && *p == ' ') {
            p++;
            len--;
        }
        remove_space = false;
        cm_buf_append(out, p, len);
    }
    if (out->oom) return cm_errf(err, errlen, CM_ENOMEM, "out of memory detokenizing");
    if (t->clean_spaces && out->len > start) {
        out->len = start + clean_spaces(out->data + start, out->len - start);
        if (out->data) out->data[out->len] = 0;
    }
    return 0;
}

/* ---- streaming ---- */

void cm_detok_init(cm_detok *d, const cm_tokenizer *t, bool special, bool lstrip_first) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->special = special;
    d->lstrip_first = lstrip_first;
}

size_t cm_detok_max_out(const cm_tokenizer *t) { return 3 * (t->max_piece_len + 4); }

/* Continuation bytes allowed after the lead byte (and bytes so far): the
 * Unicode/WHATWG bounds that rule out overlongs, surrogates and > U+10FFFF. */
static void cont_bounds(const cm_detok *d, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (d->npend != 1) return;
    switch (d->pend[0]) {
    case 0xE0: *lo = 0xA0; break;
    case 0xED: *hi = 0x9F; break;
    case 0xF0: *lo = 0x90; break;
    case 0xF4: *hi = 0x8F; break;
    default: break;
    }
}

static int seq_len(uint8_t b) { return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2; }

static size_t feed(cm_detok *d, const uint8_t *p, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint8_t b = p[i];
        if (!d->npend) {
            i++;
            if (b < 0x80) out[o++] = (char)b;
            else if (b >= 0xC2 && b <= 0xF4) d->pend[d->npend++] = b;
            else {
                memcpy(out + o, "\xef\xbf\xbd", 3);
                o += 3;
            }
            continue;
        }
        uint8_t lo, hi;
        cont_bounds(d, &lo, &hi);
        if (b < lo || b > hi) {
            /* the held sequence can never complete: one U+FFFD, then b afresh */
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            d->npend = 0;
            continue;
        }
        i++;
        d->pend[d->npend++] = b;
        if (d->npend == seq_len(d->pend[0])) {
            memcpy(out + o, d->pend, (size_t)d->npend);
            o += (size_t)d->npend;
            d->npend = 0;
        }
    }
    return o;
}

int cm_detok_push(cm_detok *d, cm_token id, char *out, size_t cap, size_t *n) {
    *n = 0;
    if (id < 0 || id >= d->tok->n_vocab || cap < cm_detok_max_out(d->tok)) return CM_ERANGE;
    size_t len;
    const char *p = cm_tokenizer_piece(d->tok, id, d->special, &len);
    if (!d->started && d->lstrip_first && len && *p == ' ') {
        p++;
        len--;
    }
    d->started = true;
    *n = feed(d, (const uint8_t *)p, len, out);
    return 0;
}

int cm_detok_flush(cm_detok *d, char *out, size_t cap, size_t *n) {
    *n = 0;
    if (!d->npend) return 0;
    if (cap < 3) return CM_ERANGE;
    memcpy(out, "\xef\xbf\xbd", 3);
    *n = 3;
    d->npend = 0;
    return 0;
}
