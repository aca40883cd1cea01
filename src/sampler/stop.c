/*
 * stop.c: the stop-string matcher for streamed text (contract in sampler.h).
 *
 * State is one byte buffer: [0, emitted) was handed back by the last call and
 * is dropped at the start of the next one; the rest is held back. Held text
 * is always short (shorter than the longest stop string, plus at most three
 * bytes of an unfinished UTF-8 character), so scanning it on every feed is
 * cheap. It must never hand back part of a stop string, nor split a
 * character that the fed text completes later.
 */
#include "sampler/sampler.h"

#include <string.h>

struct cm_stop {
    char **stops;
    size_t *lens;
    int n;
    char *buf;
    size_t len, cap;
    size_t emitted; /* prefix of buf handed back by the previous call */
    bool done;
};

cm_stop *cm_stop_new(const char *const *stops, int n, char *err, size_t errlen) {
    if (n < 0 || (n > 0 && !stops)) {
        cm_errf(err, errlen, CM_EINVAL, "bad stop string list");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!stops[i] || !stops[i][0]) {
            cm_errf(err, errlen, CM_EINVAL, "stop string %d is empty", i);
            return NULL;
        }
    cm_stop *m = cm_calloc(1, sizeof *m);
    if (!m) goto oom;
    m->n = n;
    m->stops = cm_calloc((size_t)(n > 0 ? n : 1), sizeof *m->stops);
    m->lens = cm_calloc((size_t)(n > 0 ? n : 1), sizeof *m->lens);
    if (!m->stops || !m->lens) goto oom;
    size_t longest = 0;
    for (int i = 0; i < n; i++) {
        m->lens[i] = strlen(stops[i]);
        m->stops[i] = cm_malloc(m->lens[i] + 1);
        if (!m->stops[i]) goto oom;
        memcpy(m->stops[i], stops[i], m->lens[i] + 1);
        if (m->lens[i] > longest) longest = m->lens[i];
    }
    m->cap = longest + 256; /* room for the held tail plus a typical piece */
    m->buf = cm_malloc(m->cap);
    if (!m->buf) goto oom;
    return m;
oom:
    cm_stop_free(m);
    cm_errf(err, errlen, CM_ENOMEM, "out of memory for stop strings");
    return NULL;
}

void cm_stop_free(cm_stop *m) {
    if (!m) return;
    if (m->stops)
        for (int i = 0; i < m->n; i++) cm_free(m->stops[i]);
    cm_free(m->stops);
    cm_free(m->lens);
    cm_free(m->buf);
    cm_free(m);
}

void cm_stop_reset(cm_stop *m) {
    m->len = 0;
    m->emitted = 0;
    m->done = false;
}

/* Bytes at the end of b[0..n) that begin a UTF-8 character not yet complete. */
static size_t utf8_incomplete_tail(const char *b, size_t n) {
    size_t back = 0;
    while (back < n && back < 4) {
        unsigned char c = (unsigned char)b[n - 1 - back];
        if ((c & 0xC0) != 0x80) { /* a lead byte (or ASCII) */
            size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
            return back + 1 < need ? back + 1 : 0;
        }
        back++;
    }
    return 0; /* only continuation bytes: invalid, do not hold it forever */
}

/* Longest suffix of b[0..n) that is a proper prefix of some stop string. */
static size_t partial_tail(const cm_stop *m, const char *b, size_t n) {
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t L = m->lens[i];
        size_t max = L - 1 < n ? L - 1 : n;
        for (size_t k = max; k > best; k--)
            if (!memcmp(b + n - k, m->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

int cm_stop_feed(cm_stop *m, const char *piece, size_t n, const char **emit, size_t *emit_len) {
    *emit = m->buf;
    *emit_len = 0;
    if (m->done) return CM_ESTATE;
    /* Drop what the previous call handed back. */
    if (m->emitted) {
        memmove(m->buf, m->buf + m->emitted, m->len - m->emitted);
        m->len -= m->emitted;
        m->emitted = 0;
    }
    if (n > m->cap - m->len) {
        size_t cap = m->len + n;
        if (cap < m->cap * 2) cap = m->cap * 2;
        char *nb = cm_realloc(m->buf, cap);
        if (!nb) return CM_ENOMEM;
        m->buf = nb;
        m->cap = cap;
    }
    if (n) memcpy(m->buf + m->len, piece, n);
    m->len += n;
    *emit = m->buf; /* only now: the buffer may have moved */

    /* Earliest full match; the longer stop string on a tie. */
    size_t at = (size_t)-1, at_len = 0;
    int which = -1;
    for (int i = 0; i < m->n; i++) {
        size_t L = m->lens[i];
        if (L > m->len) continue;
        for (size_t pos = 0; pos + L <= m->len && pos <= at; pos++) {
            if (memcmp(m->buf + pos, m->stops[i], L)) continue;
            if (pos < at || L > at_len) {
                at = pos;
                at_len = L;
                which = i;
            }
            break;
        }
    }
    if (which >= 0) {
        m->done = true;
        *emit_len = at;
        m->emitted = m->len; /* nothing of the rest is ever handed back */
        return which;
    }
    size_t hold = partial_tail(m, m->buf, m->len);
    size_t u = utf8_incomplete_tail(m->buf, m->len);
    if (u > hold) hold = u;
    m->emitted = m->len - hold;
    *emit_len = m->emitted;
    return -1;
}

void cm_stop_flush(cm_stop *m, const char **emit, size_t *emit_len) {
    *emit = m->buf;
    *emit_len = 0;
    if (m->done) return;
    if (m->emitted) {
        memmove(m->buf, m->buf + m->emitted, m->len - m->emitted);
        m->len -= m->emitted;
    }
    *emit_len = m->len;
    m->emitted = m->len;
}
