/*
 * gguf_write.c: the GGUF v3 writer.
 *
 * It lays a file out exactly as ggml's gguf writer does (header, kvs, tensor
 * infos, zero padding to the alignment, tensor data each padded to the
 * alignment, offsets contiguous in tensor order) because llama.cpp rejects
 * any other offsets. Big files stream to PATH.tmp and are renamed into place,
 * so a crash never leaves a half-written PATH. It never writes a file its own
 * reader would reject: arguments are validated with the reader's rules.
 */
#include "gguf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct wtensor {
    char *name;
    enum cm_type type;
    int n_dims;
    int64_t ne[CM_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
    cm_gguf_fill_fn fill;
    void *fill_ctx;
} wtensor;

struct cm_gguf_writer {
    uint32_t alignment;
    bool has_alignment_kv;
    cm_buf kvbytes; /* serialized kvs, in order */
    char **keys;
    uint64_t n_kv, cap_kv;
    wtensor *t;
    uint64_t n_t, cap_t;
    int err; /* first error, sticky */
    char errmsg[256];
};

static void werr(cm_gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void werr(cm_gguf_writer *w, int code, const char *fmt, ...) {
    if (w->err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->errmsg, sizeof w->errmsg, fmt, ap);
    va_end(ap);
    w->err = code;
}

cm_gguf_writer *cm_gguf_writer_new(uint32_t alignment) {
    cm_gguf_writer *w = cm_calloc(1, sizeof *w);
    if (!w) return NULL;
    cm_buf_init(&w->kvbytes);
    w->alignment = alignment ? alignment : CM_GGUF_DEFAULT_ALIGNMENT;
    if ((w->alignment & (w->alignment - 1)) || w->alignment > CM_GGUF_MAX_ALIGNMENT)
        werr(w, CM_EINVAL, "alignment %u is not a power of two up to %u", w->alignment, CM_GGUF_MAX_ALIGNMENT);
    return w;
}

void cm_gguf_writer_free(cm_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) cm_free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_t; i++) cm_free(w->t[i].name);
    cm_free(w->keys);
    cm_free(w->t);
    cm_buf_release(&w->kvbytes);
    cm_free(w);
}

/* cm_buf_append, minus its memcpy(NULL, 0) (undefined) for empty pieces. */
static void append(cm_buf *b, const void *p, size_t n) {
    if (n) cm_buf_append(b, p, n);
}

static void put_u32(cm_buf *b, uint32_t v) {
    uint8_t q[4];
    cm_wr_u32(q, v);
    append(b, q, 4);
}
static void put_u64(cm_buf *b, uint64_t v) {
    uint8_t q[8];
    cm_wr_u64(q, v);
    append(b, q, 8);
}
static void put_str(cm_buf *b, const char *s, uint64_t len) {
    put_u64(b, len);
    append(b, s, (size_t)len);
}

/* Start a kv: check the key, record it, serialize key + type. False = skip. */
static bool begin_kv(cm_gguf_writer *w, const char *key, enum cm_gguf_vtype t) {
    if (w->err) return false;
    if (!key) {
        werr(w, CM_EINVAL, "NULL key");
        return false;
    }
    size_t len = strlen(key);
    if (len > CM_GGUF_MAX_KEY) {
        werr(w, CM_EINVAL, "key of %zu bytes is too long", len);
        return false;
    }
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) {
            werr(w, CM_EINVAL, "duplicate key '%.64s'", key);
            return false;
        }
    if (w->n_kv >= CM_GGUF_MAX_KV) {
        werr(w, CM_EINVAL, "too many kvs");
        return false;
    }
    if (w->n_kv == w->cap_kv) {
        uint64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        char **k = cm_realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) {
            werr(w, CM_ENOMEM, "out of memory");
            return false;
        }
        w->keys = k;
        w->cap_kv = cap;
    }
    if (!(w->keys[w->n_kv] = cm_strdup(key))) {
        werr(w, CM_ENOMEM, "out of memory");
        return false;
    }
    w->n_kv++;
    put_str(&w->kvbytes, key, len);
    put_u32(&w->kvbytes, t);
    return true;
}

static void check_oom(cm_gguf_writer *w) {
    if (w->kvbytes.oom) werr(w, CM_ENOMEM, "out of memory");
}

#define W_INT(fn, ctype, vt, put)                          \
    void fn(cm_gguf_writer *w, const char *key, ctype v) { \
        if (!begin_kv(w, key, vt)) return;                 \
        put;                                               \
        check_oom(w);                                      \
    }
W_INT(cm_gguf_w_u8, uint8_t, CM_GGUF_U8, append(&w->kvbytes, &v, 1))
W_INT(cm_gguf_w_i8, int8_t, CM_GGUF_I8, {
    uint8_t u = (uint8_t)v;
    append(&w->kvbytes, &u, 1);
})
W_INT(cm_gguf_w_u16, uint16_t, CM_GGUF_U16, {
    uint8_t q[2];
    cm_wr_u16(q, v);
    append(&w->kvbytes, q, 2);
})
W_INT(cm_gguf_w_i16, int16_t, CM_GGUF_I16, {
    uint8_t q[2];
    cm_wr_u16(q, (uint16_t)v);
    append(&w->kvbytes, q, 2);
})
W_INT(cm_gguf_w_i32, int32_t, CM_GGUF_I32, put_u32(&w->kvbytes, (uint32_t)v))
W_INT(cm_gguf_w_u64, uint64_t, CM_GGUF_U64, put_u64(&w->kvbytes, v))
W_INT(cm_gguf_w_i64, int64_t, CM_GGUF_I64, put_u64(&w->kvbytes, (uint64_t)v))
W_INT(cm_gguf_w_bool, bool, CM_GGUF_BOOL, {
    uint8_t u = v ? 1 : 0;
    append(&w->kvbytes, &u, 1);
})
#undef W_INT

void cm_gguf_w_u32(cm_gguf_writer *w, const char *key, uint32_t v) {
    if (key && strcmp(key, "general.alignment") == 0 && !w->err) {
        if (v == 0 || (v & (v - 1)) || v > CM_GGUF_MAX_ALIGNMENT) {
            werr(w, CM_EINVAL, "general.alignment %u is not a power of two up to %u", v, CM_GGUF_MAX_ALIGNMENT);
            return;
        }
        w->alignment = v;
        w->has_alignment_kv = true;
    }
    if (!begin_kv(w, key, CM_GGUF_U32)) return;
    put_u32(&w->kvbytes, v);
    check_oom(w);
}

void cm_gguf_w_f32(cm_gguf_writer *w, const char *key, float v) {
    if (!begin_kv(w, key, CM_GGUF_F32)) return;
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(&w->kvbytes, u);
    check_oom(w);
}

void cm_gguf_w_f64(cm_gguf_writer *w, const char *key, double v) {
    if (!begin_kv(w, key, CM_GGUF_F64)) return;
    uint64_t u;
    memcpy(&u, &v, 8);
    put_u64(&w->kvbytes, u);
    check_oom(w);
}

void cm_gguf_w_strn(cm_gguf_writer *w, const char *key, const char *v, uint64_t len) {
    if (len > CM_GGUF_MAX_STRING || (!v && len)) {
        if (!w->err) werr(w, CM_EINVAL, "string value of '%.64s' is invalid or too long", key ? key : "");
        return;
    }
    if (!begin_kv(w, key, CM_GGUF_STRING)) return;
    put_str(&w->kvbytes, v, len);
    check_oom(w);
}

void cm_gguf_w_str(cm_gguf_writer *w, const char *key, const char *v) { cm_gguf_w_strn(w, key, v, v ? strlen(v) : 0); }

void cm_gguf_w_arr(cm_gguf_writer *w, const char *key, enum cm_gguf_vtype t, const void *data, uint64_t n) {
    size_t sz = cm_gguf_vtype_size(t);
    if (!w->err && (!sz || n > CM_GGUF_MAX_ARRAY || (!data && n))) {
        werr(w, CM_EINVAL, "array '%.64s' of %s: bad type or length", key ? key : "", cm_gguf_vtype_name(t));
        return;
    }
    if (!begin_kv(w, key, CM_GGUF_ARRAY)) return;
    put_u32(&w->kvbytes, t);
    put_u64(&w->kvbytes, n);
    const uint8_t *p = data;
    uint8_t q[8];
    for (uint64_t i = 0; i < n && !w->kvbytes.oom; i++) {
        /* Host values to little-endian, element by element (never a memcpy of host layout). */
        const uint8_t *e = p + i * (t == CM_GGUF_BOOL ? sizeof(bool) : sz);
        switch (sz) {
        case 1: q[0] = t == CM_GGUF_BOOL ? (*(const bool *)e ? 1 : 0) : e[0]; break;
        // clang-format off
        case 2: { uint16_t v; memcpy(&v, e, 2); cm_wr_u16(q, v); break; }
        case 4: { uint32_t v; memcpy(&v, e, 4); cm_wr_u32(q, v); break; }
        default: { uint64_t v; memcpy(&v, e, 8); cm_wr_u64(q, v); break; }
            // clang-format on
        }
        append(&w->kvbytes, q, sz);
    }
    check_oom(w);
}

void cm_gguf_w_arr_str(cm_gguf_writer *w, const char *key, const cm_gguf_str *s, uint64_t n) {
    if (!w->err && (n > CM_GGUF_MAX_ARRAY || (!s && n))) {
        werr(w, CM_EINVAL, "string array '%.64s' is invalid or too long", key ? key : "");
        return;
    }
    for (uint64_t i = 0; i < n && !w->err; i++)
        if (s[i].len > CM_GGUF_MAX_STRING || (!s[i].ptr && s[i].len))
            werr(w, CM_EINVAL, "string %llu of array '%.64s' is invalid", (unsigned long long)i, key ? key : "");
    if (!begin_kv(w, key, CM_GGUF_ARRAY)) return;
    put_u32(&w->kvbytes, CM_GGUF_STRING);
    put_u64(&w->kvbytes, n);
    for (uint64_t i = 0; i < n && !w->kvbytes.oom; i++) put_str(&w->kvbytes, s[i].ptr, s[i].len);
    check_oom(w);
}

void cm_gguf_w_copy_kv(cm_gguf_writer *w, const cm_gguf_kv *kv) {
    if (!kv) {
        werr(w, CM_EINVAL, "NULL kv");
        return;
    }
    uint8_t q[8];
    switch (kv->type) {
    case CM_GGUF_U8: cm_gguf_w_u8(w, kv->key, (uint8_t)kv->v.u64); return;
    case CM_GGUF_I8: cm_gguf_w_i8(w, kv->key, (int8_t)kv->v.i64); return;
    case CM_GGUF_U16: cm_gguf_w_u16(w, kv->key, (uint16_t)kv->v.u64); return;
    case CM_GGUF_I16: cm_gguf_w_i16(w, kv->key, (int16_t)kv->v.i64); return;
    case CM_GGUF_U32: cm_gguf_w_u32(w, kv->key, (uint32_t)kv->v.u64); return;
    case CM_GGUF_I32: cm_gguf_w_i32(w, kv->key, (int32_t)kv->v.i64); return;
    case CM_GGUF_U64: cm_gguf_w_u64(w, kv->key, kv->v.u64); return;
    case CM_GGUF_I64: cm_gguf_w_i64(w, kv->key, kv->v.i64); return;
    case CM_GGUF_F32: cm_gguf_w_f32(w, kv->key, (float)kv->v.f64); return; /* exact: came from f32 */
    case CM_GGUF_F64: cm_gguf_w_f64(w, kv->key, kv->v.f64); return;
    case CM_GGUF_BOOL: cm_gguf_w_bool(w, kv->key, kv->v.b); return;
    case CM_GGUF_STRING: cm_gguf_w_strn(w, kv->key, kv->v.str.ptr, kv->v.str.len); return;
    case CM_GGUF_ARRAY:
        /* The parsed elements are already little-endian GGUF: copy them verbatim. */
        if (!begin_kv(w, kv->key, CM_GGUF_ARRAY)) return;
        cm_wr_u32(q, kv->arr_type);
        append(&w->kvbytes, q, 4);
        put_u64(&w->kvbytes, kv->arr_len);
        append(&w->kvbytes, kv->arr_data, (size_t)kv->arr_nbytes);
        check_oom(w);
        return;
    default: werr(w, CM_EINVAL, "kv '%.64s' has unknown type %u", kv->key, (unsigned)kv->type);
    }
}

static wtensor *add_tensor(cm_gguf_writer *w, const char *name, enum cm_type type, int n_dims, const int64_t *ne) {
    if (w->err) return NULL;
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= CM_GGUF_MAX_NAME) {
        werr(w, CM_EINVAL, "tensor name '%.64s' is empty or longer than %d bytes", name ? name : "",
             CM_GGUF_MAX_NAME - 1);
        return NULL;
    }
    const cm_type_traits *tr = cm_type_traits_of(type);
    if (!tr) {
        werr(w, CM_EINVAL, "tensor '%s': unknown type id %u", name, (unsigned)type);
        return NULL;
    }
    if (n_dims < 1 || n_dims > CM_MAX_DIMS || !ne) {
        werr(w, CM_EINVAL, "tensor '%s': %d dimensions (1 to %d allowed)", name, n_dims, CM_MAX_DIMS);
        return NULL;
    }
    uint64_t nel = 1, nbytes;
    for (int d = 0; d < n_dims; d++)
        if (ne[d] <= 0 || !cm_mul_ok(nel, (uint64_t)ne[d], &nel) || nel > INT64_MAX) {
            werr(w, CM_EINVAL, "tensor '%s': bad dimension %d (%lld)", name, d, (long long)ne[d]);
            return NULL;
        }
    if (ne[0] % tr->block_size) {
        werr(w, CM_EINVAL, "tensor '%s': row of %lld is not a multiple of %s's block of %d", name, (long long)ne[0],
             tr->name, tr->block_size);
        return NULL;
    }
    if (!cm_mul_ok(nel / (uint64_t)tr->block_size, tr->type_size, &nbytes)) {
        werr(w, CM_EINVAL, "tensor '%s' is too large", name);
        return NULL;
    }
    for (uint64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            werr(w, CM_EINVAL, "duplicate tensor name '%s'", name);
            return NULL;
        }
    if (w->n_t >= CM_GGUF_MAX_TENSORS) {
        werr(w, CM_EINVAL, "too many tensors");
        return NULL;
    }
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = cm_realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) {
            werr(w, CM_ENOMEM, "out of memory");
            return NULL;
        }
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = cm_strdup(name))) {
        werr(w, CM_ENOMEM, "out of memory");
        return NULL;
    }
    w->n_t++;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < CM_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    return t;
}

void cm_gguf_w_tensor(cm_gguf_writer *w, const char *name, enum cm_type type, int n_dims, const int64_t *ne,
                      const void *data) {
    wtensor *t = add_tensor(w, name, type, n_dims, ne);
    if (!t) return;
    if (!data) werr(w, CM_EINVAL, "tensor '%s': NULL data", name);
    t->data = data;
}

void cm_gguf_w_tensor_fill(cm_gguf_writer *w, const char *name, enum cm_type type, int n_dims, const int64_t *ne,
                           cm_gguf_fill_fn fill, void *ctx) {
    wtensor *t = add_tensor(w, name, type, n_dims, ne);
    if (!t) return;
    if (!fill) werr(w, CM_EINVAL, "tensor '%s': NULL fill function", name);
    t->fill = fill;
    t->fill_ctx = ctx;
}

/* ---- output ---- */

typedef struct sink {
    FILE *fp; /* or */
    cm_buf *buf;
    const char *path;
    int err;
    char *errs;
    size_t errlen;
} sink;

static int out(sink *s, const void *p, size_t n) {
    if (s->err || !n) return s->err;
    if (s->buf) {
        append(s->buf, p, n);
        if (s->buf->oom) s->err = cm_errf(s->errs, s->errlen, CM_ENOMEM, "out of memory writing GGUF");
    } else if (fwrite(p, 1, n, s->fp) != n) {
        s->err = cm_errf(s->errs, s->errlen, CM_EIO, "cannot write '%s': %s", s->path, strerror(errno));
    }
    return s->err;
}

static int pad(sink *s, uint64_t pos, uint32_t a) {
    static const uint8_t zeros[256];
    uint64_t k = (a - pos % a) % a;
    while (k && !s->err) {
        size_t m = (size_t)CM_MIN(k, sizeof zeros);
        out(s, zeros, m);
        k -= m;
    }
    return s->err;
}

static int emit(cm_gguf_writer *w, sink *s) {
    if (w->err) return cm_errf(s->errs, s->errlen, w->err, "%s", w->errmsg);
    bool add_align = w->alignment != CM_GGUF_DEFAULT_ALIGNMENT && !w->has_alignment_kv;
    cm_buf h;
    cm_buf_init(&h);
    append(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, w->n_t);
    put_u64(&h, w->n_kv + (add_align ? 1 : 0));
    if (add_align) {
        put_str(&h, "general.alignment", 17);
        put_u32(&h, CM_GGUF_U32);
        put_u32(&h, w->alignment);
    }
    append(&h, w->kvbytes.data, w->kvbytes.len);
    uint64_t off = 0, maxfill = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_u32(&h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&h, (uint64_t)t->ne[d]);
        put_u32(&h, t->type);
        put_u64(&h, off);
        uint64_t padded = (t->nbytes + w->alignment - 1) / w->alignment * w->alignment;
        if (!cm_add_ok(off, padded, &off)) {
            cm_buf_release(&h);
            return cm_errf(s->errs, s->errlen, CM_EINVAL, "tensor data is too large");
        }
        if (t->fill) maxfill = CM_MAX(maxfill, t->nbytes);
    }
    if (h.oom) {
        cm_buf_release(&h);
        return cm_errf(s->errs, s->errlen, CM_ENOMEM, "out of memory writing GGUF");
    }
    out(s, h.data, h.len);
    pad(s, h.len, w->alignment);
    cm_buf_release(&h);
    void *scratch = NULL;
    if (maxfill && !s->err && !(scratch = cm_malloc((size_t)maxfill)))
        s->err = cm_errf(s->errs, s->errlen, CM_ENOMEM, "out of memory for a tensor of %llu bytes",
                         (unsigned long long)maxfill);
    for (uint64_t i = 0; i < w->n_t && !s->err; i++) {
        const wtensor *t = &w->t[i];
        const void *data = t->data;
        if (t->fill) {
            char msg[256] = "";
            int rc = t->fill(t->fill_ctx, scratch, t->nbytes, msg, sizeof msg);
            if (rc) {
                s->err = cm_errf(s->errs, s->errlen, rc, "tensor '%s': %s", t->name, msg[0] ? msg : cm_strerror(rc));
                break;
            }
            data = scratch;
        }
        out(s, data, (size_t)t->nbytes);
        pad(s, t->nbytes, w->alignment);
    }
    cm_free(scratch);
    return s->err;
}

int cm_gguf_writer_write_buf(cm_gguf_writer *w, cm_buf *buf, char *err, size_t errlen) {
    sink s = {.buf = buf, .errs = err, .errlen = errlen};
    return emit(w, &s);
}

int cm_gguf_writer_write(cm_gguf_writer *w, const char *path, char *err, size_t errlen) {
    if (w->err) return cm_errf(err, errlen, w->err, "%s", w->errmsg);
    size_t plen = strlen(path);
    char *tmp = cm_malloc(plen + 5);
    if (!tmp) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        int rc = cm_errf(err, errlen, CM_EIO, "cannot create '%s': %s", tmp, strerror(errno));
        cm_free(tmp);
        return rc;
    }
    sink s = {.fp = fp, .path = tmp, .errs = err, .errlen = errlen};
    int rc = emit(w, &s);
    if (!rc && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
        rc = cm_errf(err, errlen, CM_EIO, "cannot write '%s': %s", tmp, strerror(errno));
    if (fclose(fp) != 0 && !rc) rc = cm_errf(err, errlen, CM_EIO, "cannot write '%s': %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = cm_errf(err, errlen, CM_EIO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (rc) remove(tmp);
    cm_free(tmp);
    return rc;
}
