/*
 * chat_harmony.c: the final-channel filter of gpt-oss replies (contract in
 * chat.h). A byte-at-a-time state machine over untrusted model output: a
 * header is read into a bounded buffer up to "<|message|>" (its channel is
 * the name after "<|channel|>"), a body is passed on (final channel) or
 * dropped (analysis, commentary) up to "<|end|>", holding back only a tail
 * that may begin an end marker. It never allocates and never reads past the
 * bytes it is given.
 */
#include "tokenizer/chat.h"

#include <string.h>

enum { H_HEADER, H_BODY, H_PASS };

static const char k_msg[] = "<|message|>";
static const char *const k_ends[] = {"<|end|>", "<|return|>", "<|call|>"};

void cm_harmony_init(cm_harmony *h) {
    memset(h, 0, sizeof *h);
    h->state = H_HEADER;
    h->first = true;
}

static bool is_prefix(const char *p, size_t n, const char *full) {
    size_t m = strlen(full);
    return n <= m && !memcmp(p, full, n);
}

/* Could buf[0, n) be, or begin with, tag? */
static bool opens(const char *p, size_t n, const char *tag) {
    size_t m = strlen(tag);
    return n <= m ? !memcmp(p, tag, n) : !memcmp(p, tag, m);
}

/* The header buf[0, n) ends with "<|message|>": is its channel "final"? */
static bool header_final(const char *b, size_t n) {
    static const char ch[] = "<|channel|>";
    const size_t cl = sizeof ch - 1;
    for (size_t i = 0; i + cl <= n; i++)
        if (!memcmp(b + i, ch, cl)) {
            const char *name = b + i + cl;
            size_t rest = n - i - cl, k = 0;
            while (k < rest && name[k] != ' ' && name[k] != '<') k++;
            return k == 5 && !memcmp(name, "final", 5);
        }
    return false;
}

static void feed_byte(cm_harmony *h, char c, cm_buf *out) {
    if (h->state == H_PASS) {
        cm_buf_append(out, &c, 1);
        return;
    }
    h->buf[h->n++] = c;
    if (h->state == H_HEADER) {
        const size_t ml = sizeof k_msg - 1;
        if (h->first && !opens(h->buf, h->n, "<|channel|>") && !opens(h->buf, h->n, "<|constrain|>")) {
            h->state = H_PASS; /* not a harmony reply: everything as it is */
            cm_buf_append(out, h->buf, h->n);
            h->n = 0;
            return;
        }
        if (h->n >= ml && !memcmp(h->buf + h->n - ml, k_msg, ml)) {
            h->final = header_final(h->buf, h->n);
            h->first = false;
            h->state = H_BODY;
            h->n = 0;
        } else if (h->n == sizeof h->buf) { /* no header is this long */
            h->state = H_PASS;
            cm_buf_append(out, h->buf, h->n);
            h->n = 0;
        }
        return;
    }
    /* body: release bytes that cannot start an end marker */
    while (h->n > 0) {
        bool partial = false;
        for (size_t i = 0; i < CM_ARRAY_LEN(k_ends); i++) {
            if (h->n == strlen(k_ends[i]) && !memcmp(h->buf, k_ends[i], h->n)) {
                h->n = 0;
                h->state = H_HEADER; /* next: <|start|>assistant<|channel|>...<|message|> */
                return;
            }
            if (is_prefix(h->buf, h->n, k_ends[i])) partial = true;
        }
        if (partial) return;
        if (h->final) cm_buf_append(out, h->buf, 1);
        memmove(h->buf, h->buf + 1, --h->n);
    }
}

void cm_harmony_feed(cm_harmony *h, const char *s, size_t n, cm_buf *out) {
    for (size_t i = 0; i < n; i++) feed_byte(h, s[i], out);
}

void cm_harmony_flush(cm_harmony *h, cm_buf *out) {
    if (h->state == H_BODY && h->final) cm_buf_append(out, h->buf, h->n); /* a header cut short is dropped */
    h->n = 0;
}
