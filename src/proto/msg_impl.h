/*
 * msg_impl.h: what the message codecs of msg.c, msg_assign.c and msg_data.c
 * share (private to src/proto): the two bounded cursors every field goes
 * through. A write cursor without a buffer only measures; a read cursor
 * remembers the first field that failed and reads nothing after it. Must
 * never read or write past its bounds, whatever counts a peer sent.
 */
#ifndef CM_PROTO_MSG_IMPL_H
#define CM_PROTO_MSG_IMPL_H

#include "proto.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

typedef struct wcur {
    uint8_t *p; /* NULL: measure only */
    size_t cap, len;
    bool over;           /* ran past cap */
    const char *invalid; /* first field that failed validation */
} wcur;

static inline void w_bytes(wcur *w, const void *src, size_t n) {
    if (w->p && !w->over) {
        if (n > w->cap - w->len) w->over = true;
        else if (n) memcpy(w->p + w->len, src, n);
    }
    w->len += n;
}
// clang-format off
static inline void w_u8(wcur *w, uint8_t v) { w_bytes(w, &v, 1); }
static inline void w_u16(wcur *w, uint16_t v) { uint8_t b[2]; cm_wr_u16(b, v); w_bytes(w, b, 2); }
static inline void w_u32(wcur *w, uint32_t v) { uint8_t b[4]; cm_wr_u32(b, v); w_bytes(w, b, 4); }
static inline void w_u64(wcur *w, uint64_t v) { uint8_t b[8]; cm_wr_u64(b, v); w_bytes(w, b, 8); }
static inline void w_i32(wcur *w, int32_t v) { w_u32(w, (uint32_t)v); }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline void w_f32(wcur *w, float v) { w_u32(w, f32_bits(v)); }
// clang-format on
static inline void w_check(wcur *w, bool ok, const char *field) {
    if (!ok && !w->invalid) w->invalid = field;
}
/* Strings: u16 length, then the bytes (no NUL); at most max bytes. */
static inline void w_str(wcur *w, const char *s, size_t max, const char *field) {
    size_t n = strnlen(s, max + 1);
    w_check(w, n <= max, field);
    if (n > max) n = max;
    w_u16(w, (uint16_t)n);
    w_bytes(w, s, n);
}

typedef struct rcur {
    const uint8_t *p;
    size_t n, off;
    const char *bad;    /* first field that failed */
    const char *reason; /* "truncated" / "out of range" */
} rcur;

static inline void r_fail(rcur *r, const char *field, const char *reason) {
    if (!r->bad) {
        r->bad = field;
        r->reason = reason;
    }
}
static inline const uint8_t *r_take(rcur *r, size_t k, const char *field) {
    if (r->bad) return NULL;
    if (k > r->n - r->off) {
        r_fail(r, field, "truncated");
        return NULL;
    }
    const uint8_t *q = r->p + r->off;
    r->off += k;
    return q;
}
// clang-format off
static inline uint8_t r_u8(rcur *r, const char *f) { const uint8_t *q = r_take(r, 1, f); return q ? q[0] : 0; }
static inline uint16_t r_u16(rcur *r, const char *f) { const uint8_t *q = r_take(r, 2, f); return q ? cm_rd_u16(q) : 0; }
static inline uint32_t r_u32(rcur *r, const char *f) { const uint8_t *q = r_take(r, 4, f); return q ? cm_rd_u32(q) : 0; }
static inline uint64_t r_u64(rcur *r, const char *f) { const uint8_t *q = r_take(r, 8, f); return q ? cm_rd_u64(q) : 0; }
static inline int32_t r_i32(rcur *r, const char *f) { return (int32_t)r_u32(r, f); }
static inline float r_f32(rcur *r, const char *f) { return bits_f32(r_u32(r, f)); }
// clang-format on
static inline void r_copy(rcur *r, void *dst, size_t k, const char *f) {
    const uint8_t *q = r_take(r, k, f);
    if (q) memcpy(dst, q, k);
    else memset(dst, 0, k);
}
static inline void r_check(rcur *r, bool ok, const char *field) {
    if (!ok) r_fail(r, field, "out of range");
}
/* Bytes below 0x20 and DEL are refused: peer strings end up in logs and on terminals. */
static inline void r_str(rcur *r, char *out, size_t max, const char *field) {
    out[0] = 0;
    uint16_t n = r_u16(r, field);
    if (r->bad) return;
    if (n > max) {
        r_fail(r, field, "too long");
        return;
    }
    const uint8_t *q = r_take(r, n, field);
    if (!q) return;
    for (size_t i = 0; i < n; i++)
        if (q[i] < 0x20 || q[i] == 0x7f) {
            r_fail(r, field, "has control characters");
            return;
        }
    memcpy(out, q, n);
    out[n] = 0;
}
/* A view of k elements of size sz, with the product overflow-checked. */
static inline const uint8_t *r_view(rcur *r, uint64_t k, uint64_t sz, const char *field) {
    uint64_t bytes;
    if (!cm_mul_ok(k, sz, &bytes) || bytes > SIZE_MAX) {
        r_fail(r, field, "too large");
        return NULL;
    }
    return r_take(r, (size_t)bytes, field);
}

static inline bool finite_nonneg(float f) { return isfinite(f) && f >= 0.0f; }

/* Encoders and decoders of one message family: false / CM_EUNSUPPORTED for
 * a type of another family. ASSIGN and the weight transfer (msg_assign.c); the
 * token path: FORWARD, OUTPUT, TOKEN, SEQ_*, ALLREDUCE (msg_data.c). */
bool cm_msg_enc_assign(wcur *w, const cm_msg *m);
int cm_msg_dec_assign(rcur *r, unsigned type, cm_msg *m);
bool cm_msg_enc_data(wcur *w, const cm_msg *m);
int cm_msg_dec_data(rcur *r, unsigned type, cm_msg *m);

#endif
