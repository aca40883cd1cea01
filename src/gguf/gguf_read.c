/*
 * gguf_read.c: the GGUF v2/v3 reader and its lookups.
 *
 * Every byte it reads comes from an untrusted file: each read is bounds-checked
 * against n, every count is capped and bounded by what the remaining bytes
 * could hold before anything is allocated, and all size arithmetic is
 * overflow-checked. It must never assert, crash or allocate in proportion to
 * a number the file merely claims.
 */
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Smallest possible encodings, used to bound counts by the bytes left. */
#define MIN_KV_BYTES 13     /* key length (8) + type (4) + a 1-byte value */
#define MIN_TENSOR_BYTES 32 /* name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8) */

enum sect { S_HEADER, S_KEY, S_VALUE, S_TENSOR };

typedef struct rd {
    const uint8_t *p;
    size_t n, off;
    enum sect sect;
    uint64_t idx, cnt;
    const char *key; /* current kv's key (S_VALUE) */
    char *err;
    size_t errlen;
} rd;

static const char *const k_vtype_names[CM_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *cm_gguf_vtype_name(uint32_t t) { return t < CM_GGUF_VTYPE_COUNT ? k_vtype_names[t] : "unknown"; }

size_t cm_gguf_vtype_size(uint32_t t) {
    switch (t) {
    case CM_GGUF_U8:
    case CM_GGUF_I8:
    case CM_GGUF_BOOL: return 1;
    case CM_GGUF_U16:
    case CM_GGUF_I16: return 2;
    case CM_GGUF_U32:
    case CM_GGUF_I32:
    case CM_GGUF_F32: return 4;
    case CM_GGUF_U64:
    case CM_GGUF_I64:
    case CM_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Smallest encoding of one element of type t (t known to be valid). */
static uint64_t vtype_min_bytes(uint32_t t) {
    if (t == CM_GGUF_STRING) return 8;
    if (t == CM_GGUF_ARRAY) return 12;
    return cm_gguf_vtype_size(t);
}

/* "kv 3 of 19 ('general.name')", "tensor 3 of 291", ... for messages. */
static const char *where(const rd *r, char *buf, size_t len) {
    unsigned long long i = (unsigned long long)r->idx + 1, c = (unsigned long long)r->cnt;
    switch (r->sect) {
    case S_HEADER: snprintf(buf, len, "header"); break;
    case S_KEY: snprintf(buf, len, "key of kv %llu of %llu", i, c); break;
    case S_VALUE: snprintf(buf, len, "value of '%.64s' (kv %llu of %llu)", r->key, i, c); break;
    case S_TENSOR: snprintf(buf, len, "tensor table (tensor %llu of %llu)", i, c); break;
    }
    return buf;
}

static int fail(rd *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rd *r, int code, const char *fmt, ...) {
    char what[160], msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cm_errf(r->err, r->errlen, code, "%s in %s at byte %zu", msg, where(r, what, sizeof what), r->off);
}

static int truncated(rd *r) {
    char what[160];
    return cm_errf(r->err, r->errlen, CM_EFORMAT, "truncated %s at byte %zu", where(r, what, sizeof what), r->off);
}

static bool has(const rd *r, uint64_t k) { return k <= r->n - r->off; }

static int rd_u32(rd *r, uint32_t *v) {
    if (!has(r, 4)) return truncated(r);
    *v = cm_rd_u32(r->p + r->off);
    r->off += 4;
    return 0;
}

static int rd_u64(rd *r, uint64_t *v) {
    if (!has(r, 8)) return truncated(r);
    *v = cm_rd_u64(r->p + r->off);
    r->off += 8;
    return 0;
}

/* A length-prefixed string of at most maxlen bytes, in place. */
static int rd_str(rd *r, uint64_t maxlen, cm_gguf_str *s) {
    uint64_t len = 0;
    int rc = rd_u64(r, &len);
    if (rc) return rc;
    if (len > maxlen) {
        r->off -= 8;
        return fail(r, CM_EFORMAT, "string length %llu over the limit of %llu", (unsigned long long)len,
                    (unsigned long long)maxlen);
    }
    if (!has(r, len)) {
        r->off -= 8;
        return truncated(r);
    }
    s->ptr = (const char *)r->p + r->off;
    s->len = len;
    r->off += (size_t)len;
    return 0;
}

static char *arena_copy(cm_gguf *g, const cm_gguf_str *s) {
    char *d = cm_arena_alloc(&g->arena_, (size_t)s->len + 1);
    if (!d) return NULL;
    memcpy(d, s->ptr, (size_t)s->len);
    d[s->len] = 0;
    return d;
}

/* ---- name hashing (duplicate detection and O(1) lookups) ---- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const char *kv_name(const cm_gguf *g, uint32_t i) { return g->kv[i].key; }
static const char *t_name(const cm_gguf *g, uint32_t i) { return g->tensors[i].name; }

/* Table of index+1 (0 = empty), capacity a power of two >= 2 * count. */
static uint32_t *hash_new(uint64_t count, uint64_t *cap) {
    uint64_t c = 16;
    while (c < count * 2) c <<= 1;
    *cap = c;
    return cm_calloc((size_t)c, sizeof(uint32_t));
}

/* Insert index i; returns the index of an existing entry with the same name, or -1. */
static int64_t hash_insert(const cm_gguf *g, uint32_t *tab, uint64_t cap,
                           const char *(*name)(const cm_gguf *, uint32_t), uint32_t i) {
    const char *s = name(g, i);
    for (uint64_t h = hash_str(s) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (!tab[h]) {
            tab[h] = i + 1;
            return -1;
        }
        if (strcmp(name(g, tab[h] - 1), s) == 0) return tab[h] - 1;
    }
}

static int64_t hash_find(const cm_gguf *g, const uint32_t *tab, uint64_t cap,
                         const char *(*name)(const cm_gguf *, uint32_t), const char *s) {
    if (!tab || !s) return -1;
    for (uint64_t h = hash_str(s) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (!tab[h]) return -1;
        if (strcmp(name(g, tab[h] - 1), s) == 0) return tab[h] - 1;
    }
}

/* ---- values ---- */

static int rd_scalar(rd *r, uint32_t t, cm_gguf_kv *kv) {
    size_t sz = cm_gguf_vtype_size(t);
    if (!has(r, sz)) return truncated(r);
    const uint8_t *q = r->p + r->off;
    switch (t) {
    case CM_GGUF_U8: kv->v.u64 = q[0]; break;
    case CM_GGUF_I8: kv->v.i64 = (int8_t)q[0]; break;
    case CM_GGUF_U16: kv->v.u64 = cm_rd_u16(q); break;
    case CM_GGUF_I16: kv->v.i64 = (int16_t)cm_rd_u16(q); break;
    case CM_GGUF_U32: kv->v.u64 = cm_rd_u32(q); break;
    case CM_GGUF_I32: kv->v.i64 = (int32_t)cm_rd_u32(q); break;
    case CM_GGUF_U64: kv->v.u64 = cm_rd_u64(q); break;
    case CM_GGUF_I64: kv->v.i64 = (int64_t)cm_rd_u64(q); break;
    case CM_GGUF_F32: {
        uint32_t u = cm_rd_u32(q);
        float f;
        memcpy(&f, &u, 4);
        kv->v.f64 = f;
        break;
    }
    case CM_GGUF_F64: {
        uint64_t u = cm_rd_u64(q);
        memcpy(&kv->v.f64, &u, 8);
        break;
    }
    case CM_GGUF_BOOL:
        if (q[0] > 1) return fail(r, CM_EFORMAT, "bool value %u is neither 0 nor 1", q[0]);
        kv->v.b = q[0];
        break;
    }
    r->off += sz;
    return 0;
}

/* Validate an array body (type + count + elements) at depth (1 = a kv's value).
 * For the top-level array, fill kv's array fields and the string index. */
static int rd_array(rd *r, cm_gguf *g, int depth, cm_gguf_kv *kv) {
    uint32_t et = 0;
    uint64_t len = 0;
    int rc;
    if ((rc = rd_u32(r, &et)) || (rc = rd_u64(r, &len))) return rc;
    if (et >= CM_GGUF_VTYPE_COUNT) {
        r->off -= 12;
        return fail(r, CM_EFORMAT, "unknown array element type %u", et);
    }
    if (et == CM_GGUF_ARRAY && depth >= CM_GGUF_MAX_DEPTH) {
        r->off -= 12;
        return fail(r, CM_EFORMAT, "arrays nested deeper than %d", CM_GGUF_MAX_DEPTH);
    }
    uint64_t need;
    if (len > CM_GGUF_MAX_ARRAY || !cm_mul_ok(len, vtype_min_bytes(et), &need) || !has(r, need)) {
        r->off -= 8;
        if (len > CM_GGUF_MAX_ARRAY)
            return fail(r, CM_EFORMAT, "array length %llu over the limit of %u", (unsigned long long)len,
                        CM_GGUF_MAX_ARRAY);
        return fail(r, CM_EFORMAT, "array of %llu %s elements cannot fit in the %zu bytes left",
                    (unsigned long long)len, cm_gguf_vtype_name(et), r->n - r->off - 8);
    }
    size_t start = r->off;
    cm_gguf_str *strs = NULL;
    if (kv && et == CM_GGUF_STRING && len) {
        /* len * 16 <= 2 * remaining bytes: bounded by the file, not by a claim. */
        strs = cm_arena_alloc(&g->arena_, (size_t)len * sizeof *strs);
        if (!strs) return fail(r, CM_ENOMEM, "out of memory for %llu strings", (unsigned long long)len);
    }
    if (et == CM_GGUF_BOOL) {
        for (uint64_t i = 0; i < len; i++)
            if (r->p[r->off + i] > 1) {
                r->off += (size_t)i;
                return fail(r, CM_EFORMAT, "bool element %llu is %u, neither 0 nor 1", (unsigned long long)i,
                            r->p[r->off]);
            }
        r->off += (size_t)len;
    } else if (et == CM_GGUF_STRING) {
        for (uint64_t i = 0; i < len; i++) {
            cm_gguf_str s;
            if ((rc = rd_str(r, CM_GGUF_MAX_STRING, &s))) return rc;
            if (strs) strs[i] = s;
        }
    } else if (et == CM_GGUF_ARRAY) {
        for (uint64_t i = 0; i < len; i++)
            if ((rc = rd_array(r, g, depth + 1, NULL))) return rc;
    } else {
        r->off += (size_t)need;
    }
    if (kv) {
        kv->arr_type = (enum cm_gguf_vtype)et;
        kv->arr_len = len;
        kv->arr_data = r->p + start;
        kv->arr_nbytes = r->off - start;
        kv->arr_strs = strs;
    }
    return 0;
}

static int rd_kv(rd *r, cm_gguf *g, cm_gguf_kv *kv) {
    cm_gguf_str key;
    int rc;
    r->sect = S_KEY;
    if ((rc = rd_str(r, CM_GGUF_MAX_KEY, &key))) return rc;
    if (memchr(key.ptr, 0, (size_t)key.len)) {
        r->off -= (size_t)key.len + 8;
        return fail(r, CM_EFORMAT, "key contains a NUL byte");
    }
    if (!(kv->key = arena_copy(g, &key))) return fail(r, CM_ENOMEM, "out of memory");
    r->sect = S_VALUE;
    r->key = kv->key;
    uint32_t t;
    if ((rc = rd_u32(r, &t))) return rc;
    if (t >= CM_GGUF_VTYPE_COUNT) {
        r->off -= 4;
        return fail(r, CM_EFORMAT, "unknown value type %u", t);
    }
    kv->type = (enum cm_gguf_vtype)t;
    if (t == CM_GGUF_STRING) return rd_str(r, CM_GGUF_MAX_STRING, &kv->v.str);
    if (t == CM_GGUF_ARRAY) return rd_array(r, g, 1, kv);
    return rd_scalar(r, t, kv);
}

static int rd_tensor(rd *r, cm_gguf *g, cm_gguf_tensor_info *ti) {
    cm_gguf_str name;
    uint32_t nd, type;
    int rc;
    if ((rc = rd_str(r, CM_GGUF_MAX_NAME - 1, &name))) return rc;
    if (name.len == 0 || memchr(name.ptr, 0, (size_t)name.len)) {
        r->off -= (size_t)name.len + 8;
        return fail(r, CM_EFORMAT, name.len ? "tensor name contains a NUL byte" : "empty tensor name");
    }
    if (!(ti->name = arena_copy(g, &name))) return fail(r, CM_ENOMEM, "out of memory");
    if ((rc = rd_u32(r, &nd))) return rc;
    if (nd < 1 || nd > CM_MAX_DIMS) {
        r->off -= 4;
        return fail(r, CM_EFORMAT, "tensor '%s' has %u dimensions (1 to %d allowed)", ti->name, nd, CM_MAX_DIMS);
    }
    ti->n_dims = (int)nd;
    uint64_t nel = 1;
    for (int d = 0; d < CM_MAX_DIMS; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne;
        if ((rc = rd_u64(r, &ne))) return rc;
        if (ne == 0 || ne > INT64_MAX || !cm_mul_ok(nel, ne, &nel) || nel > INT64_MAX) {
            r->off -= 8;
            if (ne == 0) return fail(r, CM_EFORMAT, "tensor '%s' has dimension %u of size 0", ti->name, d);
            return fail(r, CM_EFORMAT, "tensor '%s' has too many elements (dimension %u is %llu)", ti->name, d,
                        (unsigned long long)ne);
        }
        ti->ne[d] = (int64_t)ne;
    }
    if ((rc = rd_u32(r, &type))) return rc;
    const cm_type_traits *tr = cm_type_traits_of(type);
    if (!tr) {
        r->off -= 4;
        return fail(r, CM_EUNSUPPORTED, "tensor '%s' has unknown type id %u", ti->name, type);
    }
    ti->type = type;
    if (ti->ne[0] % tr->block_size) {
        r->off -= 4;
        return fail(r, CM_EFORMAT, "tensor '%s': row of %lld elements is not a multiple of %s's block of %d", ti->name,
                    (long long)ti->ne[0], tr->name, tr->block_size);
    }
    if (!cm_mul_ok(nel / (uint64_t)tr->block_size, tr->type_size, &ti->nbytes)) {
        r->off -= 4;
        return fail(r, CM_EFORMAT, "tensor '%s' is too large", ti->name);
    }
    return rd_u64(r, &ti->offset);
}

static int parse(cm_gguf *g, const uint8_t *p, size_t n, char *err, size_t errlen) {
    rd r = {.p = p, .n = n, .sect = S_HEADER, .err = err, .errlen = errlen};
    int rc;
    g->base = p;
    g->size = n;
    if (n < 4 || memcmp(p, "GGUF", 4) != 0) {
        if (n >= 4 && memcmp(p, "FUGG", 4) == 0)
            return cm_errf(err, errlen, CM_EUNSUPPORTED, "big-endian GGUF files are not supported");
        return cm_errf(err, errlen, CM_EFORMAT, "not a GGUF file (no 'GGUF' magic at byte 0)");
    }
    r.off = 4;
    uint32_t ver;
    if ((rc = rd_u32(&r, &ver))) return rc;
    if (ver != 2 && ver != 3) {
        uint32_t sw = (ver >> 24) | ((ver >> 8) & 0xff00) | ((ver << 8) & 0xff0000) | (ver << 24);
        if (sw >= 1 && sw <= 3) return cm_errf(err, errlen, CM_EUNSUPPORTED, "big-endian GGUF files are not supported");
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "GGUF version %u is not supported (only versions 2 and 3)", ver);
    }
    g->version = ver;
    uint64_t nt, nkv;
    if ((rc = rd_u64(&r, &nt)) || (rc = rd_u64(&r, &nkv))) return rc;
    r.off = 8;
    if (nt > CM_GGUF_MAX_TENSORS)
        return fail(&r, CM_EFORMAT, "tensor count %llu over the limit of %u", (unsigned long long)nt,
                    CM_GGUF_MAX_TENSORS);
    r.off = 16;
    if (nkv > CM_GGUF_MAX_KV)
        return fail(&r, CM_EFORMAT, "kv count %llu over the limit of %u", (unsigned long long)nkv, CM_GGUF_MAX_KV);
    r.off = 24;
    /* Both caps are 2^20, so these products cannot overflow. */
    if (nkv * MIN_KV_BYTES + nt * MIN_TENSOR_BYTES > n - r.off) {
        r.off = 8;
        return fail(&r, CM_EFORMAT, "%llu tensors and %llu kvs cannot fit in a file of %zu bytes",
                    (unsigned long long)nt, (unsigned long long)nkv, n);
    }
    g->n_kv = nkv;
    g->n_tensors = nt;
    g->kv = cm_calloc(nkv ? (size_t)nkv : 1, sizeof *g->kv);
    g->tensors = cm_calloc(nt ? (size_t)nt : 1, sizeof *g->tensors);
    g->kv_hash_ = hash_new(nkv, &g->kv_hcap_);
    g->t_hash_ = hash_new(nt, &g->t_hcap_);
    if (!g->kv || !g->tensors || !g->kv_hash_ || !g->t_hash_)
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for %llu kvs and %llu tensors", (unsigned long long)nkv,
                       (unsigned long long)nt);

    r.cnt = nkv;
    for (r.idx = 0; r.idx < nkv; r.idx++) {
        size_t at = r.off;
        if ((rc = rd_kv(&r, g, &g->kv[r.idx]))) return rc;
        if (hash_insert(g, g->kv_hash_, g->kv_hcap_, kv_name, (uint32_t)r.idx) >= 0) {
            r.off = at;
            r.sect = S_KEY;
            return fail(&r, CM_EFORMAT, "duplicate key '%.64s'", g->kv[r.idx].key);
        }
    }

    g->alignment = CM_GGUF_DEFAULT_ALIGNMENT;
    const cm_gguf_kv *al = cm_gguf_find_kv(g, "general.alignment");
    if (al) {
        /* GGUF requires a multiple of 8; below that, block fields (f16 scales,
         * float d of the K types) would be read misaligned. */
        if (al->type != CM_GGUF_U32 || al->v.u64 < 8 || (al->v.u64 & (al->v.u64 - 1)) ||
            al->v.u64 > CM_GGUF_MAX_ALIGNMENT) {
            if (al->type != CM_GGUF_U32)
                return cm_errf(err, errlen, CM_EFORMAT, "general.alignment is a %s, not a u32",
                               cm_gguf_vtype_name(al->type));
            return cm_errf(err, errlen, CM_EFORMAT, "general.alignment %llu is not a power of two from 8 to %u",
                           (unsigned long long)al->v.u64, CM_GGUF_MAX_ALIGNMENT);
        }
        g->alignment = (uint32_t)al->v.u64;
    }

    r.sect = S_TENSOR;
    r.cnt = nt;
    for (r.idx = 0; r.idx < nt; r.idx++) {
        size_t at = r.off;
        if ((rc = rd_tensor(&r, g, &g->tensors[r.idx]))) return rc;
        if (hash_insert(g, g->t_hash_, g->t_hcap_, t_name, (uint32_t)r.idx) >= 0) {
            r.off = at;
            return fail(&r, CM_EFORMAT, "duplicate tensor name '%s'", g->tensors[r.idx].name);
        }
    }

    /* The data section starts at the next multiple of the alignment. */
    uint64_t a = g->alignment;
    g->data_offset = (r.off + a - 1) / a * a; /* r.off <= n < 2^63: no overflow */
    if (nt > 0 && g->data_offset > n)
        return cm_errf(err, errlen, CM_EFORMAT,
                       "truncated: data section would start at byte %llu, past the end (%zu bytes)",
                       (unsigned long long)g->data_offset, n);
    for (uint64_t i = 0; i < nt; i++) {
        cm_gguf_tensor_info *ti = &g->tensors[i];
        uint64_t start, end;
        if (ti->offset % a)
            return cm_errf(err, errlen, CM_EFORMAT,
                           "tensor '%s' (%llu of %llu): offset %llu is not a multiple of the alignment %u", ti->name,
                           (unsigned long long)i + 1, (unsigned long long)nt, (unsigned long long)ti->offset,
                           g->alignment);
        if (!cm_add_ok(g->data_offset, ti->offset, &start) || !cm_add_ok(start, ti->nbytes, &end) || end > n)
            return cm_errf(err, errlen, CM_EFORMAT,
                           "truncated: tensor '%s' (%llu of %llu) of %llu bytes at offset %llu "
                           "ends past the end of the file (%zu bytes)",
                           ti->name, (unsigned long long)i + 1, (unsigned long long)nt, (unsigned long long)ti->nbytes,
                           (unsigned long long)ti->offset, n);
        ti->data = p + start;
    }
    return 0;
}

int cm_gguf_parse(cm_gguf *g, const uint8_t *p, size_t n, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    g->file.fd = -1;
    cm_arena_init(&g->arena_, 0);
    if (!p) n = 0;
    static const uint8_t empty[1];
    int rc = parse(g, p ? p : empty, n, err, errlen);
    if (rc) cm_gguf_close(g);
    return rc;
}

/* Parse the file's bytes; g owns f from then on (f is released on error). */
static int parse_file(cm_gguf *g, cm_mapped_file *f, const char *path, char *err, size_t errlen) {
    char msg[512];
    int rc = cm_gguf_parse(g, f->data, f->size, msg, sizeof msg);
    if (rc) {
        cm_file_unmap(f);
        return cm_errf(err, errlen, rc, "'%s': %s", path, msg);
    }
    g->file = *f;
    return 0;
}

int cm_gguf_open(cm_gguf *g, const char *path, cm_gguf_progress_fn progress, void *progress_ctx, char *err,
                 size_t errlen) {
    cm_mapped_file f;
    memset(g, 0, sizeof *g);
    g->file.fd = -1;
    int rc = cm_file_map(&f, path, err, errlen);
    if (!rc) rc = parse_file(g, &f, path, err, errlen);
    if (rc) return rc;
    if (progress) {
        /* Read one byte per 4 KiB page, in chunks, reporting after each. */
        const uint64_t chunk = 32u << 20;
        uint64_t total = g->n_tensors && f.size > g->data_offset ? f.size - g->data_offset : 0;
        volatile uint8_t sink = 0;
        uint8_t acc = 0;
        for (uint64_t done = 0; done < total;) {
            uint64_t end = CM_MIN(total, done + chunk);
            for (uint64_t o = done; o < end; o += 4096) acc ^= f.data[g->data_offset + o];
            done = end;
            progress(progress_ctx, done, total);
        }
        sink = acc;
        (void)sink;
        if (total == 0) progress(progress_ctx, 0, 0);
    }
    return 0;
}

bool cm_gguf_worth_loading(uint64_t file_bytes) {
    if (cm_config_get()->mmap) return false;
    uint64_t avail = cm_mem_available_bytes();
    uint64_t need = file_bytes + file_bytes / 8 + ((uint64_t)256 << 20);
    return avail == 0 || need <= avail; /* unknown: the OS pages either kind */
}

int cm_gguf_load(cm_gguf *g, const char *path, cm_gguf_progress_fn progress, void *progress_ctx, char *err,
                 size_t errlen) {
    cm_mapped_file f;
    memset(g, 0, sizeof *g);
    g->file.fd = -1;
    int rc = cm_file_load(&f, path, progress, progress_ctx, err, errlen);
    return rc ? rc : parse_file(g, &f, path, err, errlen);
}

void cm_gguf_close(cm_gguf *g) {
    if (!g) return;
    cm_free(g->kv);
    cm_free(g->tensors);
    cm_free(g->kv_hash_);
    cm_free(g->t_hash_);
    if (g->arena_.block_size) cm_arena_release(&g->arena_);
    if (g->file.data) cm_file_unmap(&g->file);
    else if (g->file.fd > 0) cm_file_unmap(&g->file);
    memset(g, 0, sizeof *g);
    g->file.fd = -1;
}

/* ---- lookups ---- */

const cm_gguf_kv *cm_gguf_find_kv(const cm_gguf *g, const char *key) {
    int64_t i = hash_find(g, g->kv_hash_, g->kv_hcap_, kv_name, key);
    return i < 0 ? NULL : &g->kv[i];
}

const cm_gguf_tensor_info *cm_gguf_find_tensor(const cm_gguf *g, const char *name) {
    int64_t i = hash_find(g, g->t_hash_, g->t_hcap_, t_name, name);
    return i < 0 ? NULL : &g->tensors[i];
}

static bool is_unsigned(uint32_t t) {
    return t == CM_GGUF_U8 || t == CM_GGUF_U16 || t == CM_GGUF_U32 || t == CM_GGUF_U64;
}
static bool is_signed(uint32_t t) {
    return t == CM_GGUF_I8 || t == CM_GGUF_I16 || t == CM_GGUF_I32 || t == CM_GGUF_I64;
}

bool cm_gguf_get_u64(const cm_gguf *g, const char *key, uint64_t *out) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    if (!kv) return false;
    if (is_unsigned(kv->type)) {
        *out = kv->v.u64;
        return true;
    }
    if (is_signed(kv->type) && kv->v.i64 >= 0) {
        *out = (uint64_t)kv->v.i64;
        return true;
    }
    return false;
}

bool cm_gguf_get_i64(const cm_gguf *g, const char *key, int64_t *out) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    if (!kv) return false;
    if (is_signed(kv->type)) {
        *out = kv->v.i64;
        return true;
    }
    if (is_unsigned(kv->type) && kv->v.u64 <= INT64_MAX) {
        *out = (int64_t)kv->v.u64;
        return true;
    }
    return false;
}

bool cm_gguf_get_f64(const cm_gguf *g, const char *key, double *out) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    if (!kv) return false;
    if (kv->type == CM_GGUF_F32 || kv->type == CM_GGUF_F64) *out = kv->v.f64;
    else if (is_signed(kv->type)) *out = (double)kv->v.i64;
    else if (is_unsigned(kv->type)) *out = (double)kv->v.u64;
    else return false;
    return true;
}

bool cm_gguf_get_bool(const cm_gguf *g, const char *key, bool *out) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    if (!kv || kv->type != CM_GGUF_BOOL) return false;
    *out = kv->v.b;
    return true;
}

char *cm_gguf_get_str(const cm_gguf *g, const char *key) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    if (!kv || kv->type != CM_GGUF_STRING) return NULL;
    char *s = cm_malloc((size_t)kv->v.str.len + 1);
    if (!s) return NULL;
    memcpy(s, kv->v.str.ptr, (size_t)kv->v.str.len);
    s[kv->v.str.len] = 0;
    return s;
}

bool cm_gguf_arr_str(const cm_gguf_kv *kv, uint64_t i, cm_gguf_str *out) {
    if (!kv || kv->type != CM_GGUF_ARRAY || kv->arr_type != CM_GGUF_STRING || i >= kv->arr_len) return false;
    *out = kv->arr_strs[i];
    return true;
}

/* Element i of a fixed-size integer/float array, widened like scalar kvs. */
static bool arr_elem(const cm_gguf_kv *kv, uint64_t i, cm_gguf_kv *e) {
    if (!kv || kv->type != CM_GGUF_ARRAY || i >= kv->arr_len) return false;
    size_t sz = cm_gguf_vtype_size(kv->arr_type);
    if (!sz || kv->arr_type == CM_GGUF_BOOL) return false;
    rd r = {.p = kv->arr_data + i * sz, .n = sz};
    return rd_scalar(&r, kv->arr_type, e) == 0;
}

bool cm_gguf_arr_f64(const cm_gguf_kv *kv, uint64_t i, double *out) {
    cm_gguf_kv e;
    if (!arr_elem(kv, i, &e)) return false;
    if (kv->arr_type == CM_GGUF_F32 || kv->arr_type == CM_GGUF_F64) *out = e.v.f64;
    else if (is_signed(kv->arr_type)) *out = (double)e.v.i64;
    else *out = (double)e.v.u64;
    return true;
}

bool cm_gguf_arr_i64(const cm_gguf_kv *kv, uint64_t i, int64_t *out) {
    cm_gguf_kv e;
    if (!arr_elem(kv, i, &e)) return false;
    if (is_signed(kv->arr_type)) *out = e.v.i64;
    else if (is_unsigned(kv->arr_type) && e.v.u64 <= INT64_MAX) *out = (int64_t)e.v.u64;
    else return false;
    return true;
}
