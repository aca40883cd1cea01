/*
 * mdns_packet.c: pure DNS message codec for mDNS / DNS-SD (RFC 1035 §4,
 * RFC 6762 §18). Reads only inside (p, n); every offset is checked before
 * use. Compression pointers must point strictly backwards from the pointer
 * itself, so a name can never loop, and the jump count is capped anyway.
 * It must never touch a socket, a clock or global state, and never abort on
 * input bytes.
 */
#include "mdns.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>

#define MAX_JUMPS 64

static uint16_t rd16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static uint32_t rd32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int ascii_lower(int c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* ---------------------------------------------------------------- names */

static int name_append_label(cm_mdns_name *n, const uint8_t *s, size_t len) {
    if (len == 0 || len > CM_MDNS_LABEL_MAX) return CM_ERANGE;
    /* keep room for this label, its length byte and the final zero */
    if ((size_t)n->len + 1 + len + 1 > CM_MDNS_NAME_WIRE_MAX) return CM_ERANGE;
    n->b[n->len++] = (uint8_t)len;
    memcpy(n->b + n->len, s, len);
    n->len = (uint8_t)(n->len + len);
    return 0;
}

int cm_mdns_name_make(cm_mdns_name *n, const char *first_label, const char *dotted) {
    memset(n, 0, sizeof *n);
    if (first_label) {
        int rc = name_append_label(n, (const uint8_t *)first_label, strlen(first_label));
        if (rc) return rc;
    }
    const char *s = dotted ? dotted : "";
    while (*s) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        int rc = name_append_label(n, (const uint8_t *)s, len);
        if (rc) return rc;
        s += len;
        if (*s == '.') s++;
    }
    n->b[n->len++] = 0;
    return 0;
}

bool cm_mdns_name_eq(const cm_mdns_name *a, const cm_mdns_name *b) {
    if (a->len != b->len) return false;
    /* Label lengths sit at the same offsets when the lengths match label by
     * label; compare length bytes exactly and label bytes case-insensitively. */
    size_t i = 0;
    while (i < a->len) {
        uint8_t la = a->b[i], lb = b->b[i];
        if (la != lb) return false;
        if (la == 0) return i + 1 == a->len;
        for (size_t k = 1; k <= la; k++)
            if (ascii_lower(a->b[i + k]) != ascii_lower(b->b[i + k])) return false;
        i += 1 + (size_t)la;
    }
    return false;
}

bool cm_mdns_name_split_instance(const cm_mdns_name *n, const cm_mdns_name *service, char *label, size_t cap) {
    if (n->len < 2) return false;
    size_t l = n->b[0];
    if (l == 0 || 1 + l >= n->len) return false;
    cm_mdns_name rest;
    rest.len = (uint8_t)(n->len - 1 - l);
    memcpy(rest.b, n->b + 1 + l, rest.len);
    if (!cm_mdns_name_eq(&rest, service)) return false;
    if (label && cap) {
        size_t k = CM_MIN(l, cap - 1);
        memcpy(label, n->b + 1, k);
        label[k] = 0;
    }
    return true;
}

void cm_mdns_name_text(const cm_mdns_name *n, char *out, size_t cap) {
    size_t o = 0, i = 0;
    if (!cap) return;
#define PUT(c)                                 \
    do {                                       \
        if (o + 1 < cap) out[o++] = (char)(c); \
    } while (0)
    while (i < n->len && n->b[i]) {
        size_t l = n->b[i];
        if (i + 1 + l > n->len) break;
        for (size_t k = 1; k <= l; k++) {
            uint8_t c = n->b[i + k];
            if (c == '.' || c == '\\') {
                PUT('\\');
                PUT(c);
            } else if (c < 0x20 || c == 0x7f) {
                char tmp[8];
                snprintf(tmp, sizeof tmp, "\\%03u", c);
                for (char *t = tmp; *t; t++) PUT(*t);
            } else PUT(c);
        }
        PUT('.');
        i += 1 + l;
    }
    if (o == 0) PUT('.');
#undef PUT
    out[o] = 0;
}

/* Read a possibly compressed name starting at *off. On success *off is just
 * past the name's bytes at its original position (not past jump targets). */
static int read_name(const uint8_t *p, size_t n, size_t *off, cm_mdns_name *out, char *err, size_t errlen) {
    size_t pos = *off, end_after = 0;
    bool jumped = false;
    int jumps = 0;
    out->len = 0;
    for (;;) {
        if (pos >= n) return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: truncated", *off);
        uint8_t c = p[pos];
        if ((c & 0xC0) == 0xC0) {
            if (pos + 1 >= n) return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: truncated pointer", *off);
            size_t target = ((size_t)(c & 0x3F) << 8) | p[pos + 1];
            /* strictly backwards: every jump lowers pos, so no loop is possible */
            if (target >= pos)
                return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: compression pointer not backwards", *off);
            if (++jumps > MAX_JUMPS)
                return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: too many compression jumps", *off);
            if (!jumped) {
                end_after = pos + 2;
                jumped = true;
            }
            pos = target;
            continue;
        }
        if ((c & 0xC0) != 0)
            return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: reserved label type 0x%02x", *off, c);
        if (c == 0) {
            if (out->len + 1 > CM_MDNS_NAME_WIRE_MAX)
                return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: longer than 255 bytes", *off);
            out->b[out->len++] = 0;
            *off = jumped ? end_after : pos + 1;
            return 0;
        }
        if (pos + 1 + c > n) return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: label truncated", *off);
        if ((size_t)out->len + 1 + c + 1 > CM_MDNS_NAME_WIRE_MAX)
            return cm_errf(err, errlen, CM_EFORMAT, "name at %zu: longer than 255 bytes", *off);
        memcpy(out->b + out->len, p + pos, 1 + (size_t)c);
        out->len = (uint8_t)(out->len + 1 + c);
        pos += 1 + (size_t)c;
    }
}

/* ---------------------------------------------------------------- parse */

static int parse_rdata(const uint8_t *p, size_t n, size_t off, cm_mdns_rr *rr, char *err, size_t errlen) {
    size_t end = off + rr->rdlen, o = off;
    int rc;
    switch (rr->type) {
    case CM_MDNS_T_A:
        if (rr->rdlen != 4) return cm_errf(err, errlen, CM_EFORMAT, "A record with rdlength %u", rr->rdlen);
        memcpy(rr->addr, p + off, 4);
        return 0;
    case CM_MDNS_T_AAAA:
        if (rr->rdlen != 16) return cm_errf(err, errlen, CM_EFORMAT, "AAAA record with rdlength %u", rr->rdlen);
        memcpy(rr->addr, p + off, 16);
        return 0;
    case CM_MDNS_T_PTR:
        /* a name inside rdata may point anywhere earlier in the packet, but
         * its own bytes must stay inside the rdata */
        if ((rc = read_name(p, end, &o, &rr->target, err, errlen))) return rc;
        if (o != end) return cm_errf(err, errlen, CM_EFORMAT, "PTR rdata has %zu trailing bytes", end - o);
        return 0;
    case CM_MDNS_T_SRV:
        if (rr->rdlen < 7) return cm_errf(err, errlen, CM_EFORMAT, "SRV rdata too short");
        rr->priority = rd16(p + off);
        rr->weight = rd16(p + off + 2);
        rr->port = rd16(p + off + 4);
        o = off + 6;
        if ((rc = read_name(p, end, &o, &rr->target, err, errlen))) return rc;
        if (o != end) return cm_errf(err, errlen, CM_EFORMAT, "SRV rdata has %zu trailing bytes", end - o);
        return 0;
    case CM_MDNS_T_TXT:
        /* a sequence of length-prefixed strings that exactly fills rdata */
        while (o < end) {
            size_t l = p[o];
            if (o + 1 + l > end) return cm_errf(err, errlen, CM_EFORMAT, "TXT string overruns rdata");
            o += 1 + l;
        }
        return 0;
    default: return 0; /* kept raw */
    }
}

int cm_mdns_parse(const uint8_t *p, size_t n, cm_mdns_msg *m, char *err, size_t errlen) {
    memset(m, 0, offsetof(cm_mdns_msg, q));
    if (!p || n < 12) return cm_errf(err, errlen, CM_EFORMAT, "message shorter than the 12-byte header");
    m->id = rd16(p);
    m->flags = rd16(p + 2);
    for (int s = 0; s < CM_MDNS_SEC_COUNT; s++) m->count[s] = rd16(p + 4 + 2 * s);
    size_t off = 12;
    /* Counts are untrusted: each entry consumes at least 5 bytes, so a huge
     * count fails on truncation long before any loop gets long. */
    for (unsigned i = 0; i < m->count[0]; i++) {
        cm_mdns_question qq, *q = m->nq < CM_MDNS_MAX_QUESTIONS ? &m->q[m->nq] : &qq;
        int rc = read_name(p, n, &off, &q->name, err, errlen);
        if (rc) return rc;
        if (n - off < 4) return cm_errf(err, errlen, CM_EFORMAT, "question %u truncated", i);
        q->type = rd16(p + off);
        uint16_t c = rd16(p + off + 2);
        q->klass = c & 0x7FFF;
        q->unicast_response = (c & 0x8000) != 0;
        off += 4;
        if (q != &qq) m->nq++;
        else m->capped = true;
    }
    for (int s = 1; s < CM_MDNS_SEC_COUNT; s++) {
        for (unsigned i = 0; i < m->count[s]; i++) {
            cm_mdns_rr tmp, *rr = m->nrr < CM_MDNS_MAX_RECORDS ? &m->rr[m->nrr] : &tmp;
            int rc = read_name(p, n, &off, &rr->name, err, errlen);
            if (rc) return rc;
            if (n - off < 10) return cm_errf(err, errlen, CM_EFORMAT, "record %u of section %d truncated", i, s);
            rr->type = rd16(p + off);
            uint16_t c = rd16(p + off + 2);
            rr->klass = c & 0x7FFF;
            rr->cache_flush = (c & 0x8000) != 0;
            rr->ttl = rd32(p + off + 4);
            rr->rdlen = rd16(p + off + 8);
            rr->section = (uint8_t)s;
            off += 10;
            if (rr->rdlen > n - off)
                return cm_errf(err, errlen, CM_EFORMAT, "record %u of section %d: rdata overruns message", i, s);
            rr->rdata = p + off;
            rr->target.len = 0;
            rr->priority = rr->weight = rr->port = 0;
            memset(rr->addr, 0, sizeof rr->addr);
            if ((rc = parse_rdata(p, n, off, rr, err, errlen))) return rc;
            off += rr->rdlen;
            if (rr != &tmp) m->nrr++;
            else m->capped = true;
        }
    }
    /* trailing bytes after the declared records are tolerated (padding) */
    return 0;
}

/* ---------------------------------------------------------------- write */

static void wput(cm_mdns_writer *w, const void *s, size_t k) {
    if (w->overflow || k > w->cap - w->len) {
        w->overflow = true;
        return;
    }
    memcpy(w->p + w->len, s, k);
    w->len += k;
}
static void wput16(cm_mdns_writer *w, uint16_t v) {
    uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
    wput(w, b, 2);
}
static void wput32(cm_mdns_writer *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    wput(w, b, 4);
}
static void wname(cm_mdns_writer *w, const cm_mdns_name *n) {
    if (n->len == 0) {
        uint8_t z = 0;
        wput(w, &z, 1);
        return;
    }
    wput(w, n->b, n->len);
}

void cm_mdns_writer_init(cm_mdns_writer *w, uint8_t *buf, size_t cap, uint16_t id, uint16_t flags) {
    memset(w, 0, sizeof *w);
    w->p = buf;
    w->cap = cap;
    wput16(w, id);
    wput16(w, flags);
    for (int i = 0; i < 4; i++) wput16(w, 0);
}

static bool enter_section(cm_mdns_writer *w, int sec) {
    if (sec < w->section) {
        w->order_error = true;
        return false;
    }
    if (w->count[sec] == 0xFFFF) {
        w->overflow = true;
        return false;
    }
    w->section = (uint8_t)sec;
    return true;
}

void cm_mdns_write_question(cm_mdns_writer *w, const cm_mdns_name *name, uint16_t type, bool unicast_response) {
    if (!enter_section(w, CM_MDNS_SEC_QUESTION)) return;
    wname(w, name);
    wput16(w, type);
    wput16(w, (uint16_t)(CM_MDNS_CLASS_IN | (unicast_response ? 0x8000 : 0)));
    w->count[CM_MDNS_SEC_QUESTION]++;
}

void cm_mdns_write_rr(cm_mdns_writer *w, enum cm_mdns_section sec, const cm_mdns_rr *rr) {
    if (sec == CM_MDNS_SEC_QUESTION || sec >= CM_MDNS_SEC_COUNT) {
        w->order_error = true;
        return;
    }
    if (!enter_section(w, sec)) return;
    wname(w, &rr->name);
    wput16(w, rr->type);
    wput16(w, (uint16_t)((rr->klass ? rr->klass : CM_MDNS_CLASS_IN) | (rr->cache_flush ? 0x8000 : 0)));
    wput32(w, rr->ttl);
    size_t rdlen_at = w->len;
    wput16(w, 0);
    size_t start = w->len;
    switch (rr->type) {
    case CM_MDNS_T_A: wput(w, rr->addr, 4); break;
    case CM_MDNS_T_AAAA: wput(w, rr->addr, 16); break;
    case CM_MDNS_T_PTR: wname(w, &rr->target); break;
    case CM_MDNS_T_SRV:
        wput16(w, rr->priority);
        wput16(w, rr->weight);
        wput16(w, rr->port);
        wname(w, &rr->target);
        break;
    default:
        if (rr->rdlen) wput(w, rr->rdata, rr->rdlen);
        else if (rr->type == CM_MDNS_T_TXT) {
            uint8_t z = 0;
            wput(w, &z, 1);
        } /* RFC 6763 §6.1 */
        break;
    }
    if (w->overflow) return;
    size_t rdlen = w->len - start;
    w->p[rdlen_at] = (uint8_t)(rdlen >> 8);
    w->p[rdlen_at + 1] = (uint8_t)rdlen;
    w->count[sec]++;
}

int cm_mdns_writer_finish(cm_mdns_writer *w) {
    if (w->order_error) return CM_EINVAL;
    if (w->overflow || w->len > CM_MDNS_PKT_MAX) return CM_ENOSPACE;
    for (int s = 0; s < CM_MDNS_SEC_COUNT; s++) {
        w->p[4 + 2 * s] = (uint8_t)(w->count[s] >> 8);
        w->p[5 + 2 * s] = (uint8_t)w->count[s];
    }
    return (int)w->len;
}

/* ---------------------------------------------------------------- TXT */

int cm_mdns_txt_add(uint8_t *txt, size_t cap, size_t *len, const char *key, const char *value) {
    size_t kl = strlen(key), vl = value ? strlen(value) : 0;
    size_t sl = kl + (value ? 1 + vl : 0);
    if (kl == 0 || sl > 255) return CM_ERANGE;
    if (*len > cap || cap - *len < 1 + sl) return CM_ERANGE;
    uint8_t *o = txt + *len;
    *o++ = (uint8_t)sl;
    memcpy(o, key, kl);
    o += kl;
    if (value) {
        *o++ = '=';
        memcpy(o, value, vl);
    }
    *len += 1 + sl;
    return 0;
}

int cm_mdns_txt_get(const uint8_t *txt, size_t n, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key), o = 0;
    while (o < n) {
        size_t l = txt[o];
        if (l > n - o - 1) return CM_EFORMAT;
        const uint8_t *s = txt + o + 1;
        size_t klen = 0;
        while (klen < l && s[klen] != '=') klen++;
        bool match = klen == kl;
        for (size_t i = 0; match && i < kl; i++)
            if (ascii_lower(s[i]) != ascii_lower((unsigned char)key[i])) match = false;
        if (match) {
            size_t vl = klen < l ? l - klen - 1 : 0;
            if (cap) {
                size_t k = CM_MIN(vl, cap - 1);
                if (k) memcpy(out, s + klen + 1, k);
                out[k] = 0;
            }
            return (int)vl;
        }
        o += 1 + l;
    }
    return CM_ENOENT;
}
