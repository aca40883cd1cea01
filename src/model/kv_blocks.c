/*
 * kv_blocks.c: prompt-prefix KV blocks shared copy-on-write between caches
 * (issue 22: a system prompt or a long document that many requests share is
 * evaluated once and held once).
 *
 * The block table is the process's page table. A cache's arrays are
 * anonymous mappings (kv_mem.c) laid out as model.h states; a block is a
 * page of them. Sharing a prefix writes the whole pages that src's first n
 * positions fill into a store (a nameless in-memory file, cm_anon_file, one
 * image of the cache's layout) and maps those file pages privately over the
 * same addresses of src and of every cache taking the prefix
 * (MAP_PRIVATE | MAP_FIXED): one physical page per block however many caches
 * map it, and the kernel copies a page on its first write (copy-on-write).
 * The bytes at every address are the ones a copy would have put there, so
 * attention, attn_split's blocks, the nodes and the GPU upload read what
 * they read before, bit for bit, with no change. (The same idea as
 * vAttention's virtual-memory KV cache, rather than a software table that
 * every reader would have to index through.)
 *
 * What is shared: whole pages of the rows arrays (K, and V in the rows
 * layout: one region per (layer, head), so a cache maps a few hundred
 * ranges). The transposed V of F32/F16 caches has a region per head
 * dimension (thousands of ranges of a page or less: a mapping each would
 * exceed the kernel's map count over 16 slots) and is copied, as are the
 * partial pages at a region's ends. NEEDSWORK: the transposed V's prefix
 * copied per slot is half the cache of the default layout; serve with
 * --flash-attn (rows) shares it too.
 *
 * Lifetime: a store is referenced by each cache that maps any page of it
 * (kv->store) and freed (its descriptor closed; the kernel frees the pages
 * once nothing maps them) with the last. A cache truncated below its shared
 * part keeps the mapping (what it writes again is copied on write, counted
 * as its own); one emptied (n_past 0), released or given another store maps
 * anonymous memory back over the store's ranges first, so no mapping keeps a
 * store's pages alive behind the accounting's back.
 *
 * Accounting (serve's --kv-mem and /metrics): cm_kv_shared_bytes is the part
 * of a cache's resident bytes that is the store's; the store's bytes are
 * counted once by whoever sums caches (distinct cm_kv_store_bytes ids).
 *
 * Never called inside a forward pass; the caller serialises it with passes
 * of both caches. The reference count is atomic: caches of one store may be
 * released from different threads.
 */
#include "kv_regions.h"
#include "model.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif

struct cm_kv_store {
    int fd;
    atomic_int refs; /* caches mapping any of its pages */
    uint64_t bytes;  /* the file's pages holding them */
};

static size_t pg(void) {
    const long v = sysconf(_SC_PAGESIZE); /* no cached static: caches are released from any thread */
    return v > 0 ? (size_t)v : 4096;
}

/* The whole pages of region i holding positions [0, n): [*lo, *hi) bytes
 * from the array's base; false when there is none. */
static bool whole(const region_set *r, size_t i, int n, size_t *lo, size_t *hi) {
    const size_t P = pg(), a = i * r->stride;
    size_t b = a + (size_t)n * r->unit;
    if (b > r->map) b = r->map;
    *lo = (a + P - 1) / P * P;
    *hi = b / P * P;
    return *hi > *lo;
}

/* The array's bytes start at this offset of a store's file: K at 0, V after
 * K's mapping. */
static size_t file_off(const cm_kv *kv, int set) { return set ? kv->k_map : 0; }

static bool shareable(const cm_kv *kv) { return kv->k && kv->k_map && (kv->latent || kv->v_map); }

uint64_t cm_kv_shareable_bytes(const cm_kv *kv, int n) {
    if (!shareable(kv) || n <= 0) return 0;
    region_set rs[2];
    const int nr = cm_kv_regions(kv, rs);
    uint64_t b = 0;
    for (int s = 0; s < nr; s++) {
        if (!rs[s].rows) continue;
        for (size_t i = 0; i < rs[s].n_reg; i++) {
            size_t lo, hi;
            if (whole(&rs[s], i, n, &lo, &hi)) b += hi - lo;
        }
    }
    return b;
}

uint64_t cm_kv_shared_bytes(const cm_kv *kv, int n) {
    if (!kv->store) return 0;
    return cm_kv_shareable_bytes(kv, n < kv->n_shared ? n : kv->n_shared);
}

uint64_t cm_kv_store_bytes(const cm_kv *kv, const void **id) {
    if (id) *id = kv->store;
    return kv->store ? kv->store->bytes : 0;
}

static void unref(struct cm_kv_store *st) {
    if (st && atomic_fetch_sub(&st->refs, 1) == 1) {
        close(st->fd);
        cm_free(st);
    }
}

/* Anonymous memory again over [p, p + len) (a store's range), its bytes kept
 * when keep (through a bounce buffer; NULL: not kept). */
static int remap_anon(uint8_t *p, size_t len, uint8_t *bounce, size_t blen) {
    for (size_t off = 0; off < len;) {
        const size_t c = bounce ? CM_MIN(blen, len - off) : len - off;
        if (bounce) memcpy(bounce, p + off, c);
        void *q =
            mmap(p + off, c, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (q == MAP_FAILED) return CM_ENOMEM;
#ifdef MADV_NOHUGEPAGE
        (void)madvise(q, c, MADV_NOHUGEPAGE);
#endif
        if (bounce) memcpy(p + off, bounce, c);
        off += c;
    }
    return 0;
}

/* kv lets go of its store: every range it maps becomes anonymous memory
 * again, its bytes kept when keep. */
static int detach(cm_kv *kv, bool keep) {
    if (!kv->store) return 0;
    enum { BOUNCE = 1 << 20 };
    uint8_t *bounce = keep ? cm_malloc(BOUNCE) : NULL;
    if (keep && !bounce) return CM_ENOMEM;
    region_set rs[2];
    const int nr = cm_kv_regions(kv, rs);
    int rc = 0;
    for (int s = 0; s < nr && !rc; s++) {
        if (!rs[s].rows) continue;
        for (size_t i = 0; i < rs[s].n_reg && !rc; i++) {
            size_t lo, hi;
            if (whole(&rs[s], i, kv->n_mapped, &lo, &hi)) rc = remap_anon(rs[s].base + lo, hi - lo, bounce, BOUNCE);
        }
    }
    cm_free(bounce);
    if (rc) return rc; /* still mapped: the reference stays */
    unref(kv->store);
    kv->store = NULL;
    kv->n_mapped = kv->n_shared = 0;
    return 0;
}

void cm_kv_blocks_trim(cm_kv *kv) {
    if (!kv->store) return;
    if (kv->n_shared > kv->n_past) kv->n_shared = kv->n_past;
    if (kv->n_past == 0) (void)detach(kv, false);
}

void cm_kv_blocks_release(cm_kv *kv) {
    unref(kv->store); /* the caller unmaps the arrays, the store's ranges with them */
    kv->store = NULL;
    kv->n_mapped = kv->n_shared = 0;
}

static int write_all(int fd, const uint8_t *p, size_t len, size_t off) {
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return CM_EIO;
        p += w;
        off += (size_t)w;
        len -= (size_t)w;
    }
    return 0;
}

/* A store of src's first n positions (the whole pages of its rows arrays). */
static struct cm_kv_store *store_new(const cm_kv *src, int n) {
    struct cm_kv_store *st = cm_calloc(1, sizeof *st);
    if (!st) return NULL;
    st->fd = cm_anon_file((uint64_t)src->k_map + (uint64_t)src->v_map);
    if (st->fd < 0) {
        cm_free(st);
        return NULL;
    }
    atomic_init(&st->refs, 0);
    region_set rs[2];
    const int nr = cm_kv_regions(src, rs);
    for (int s = 0; s < nr; s++) {
        if (!rs[s].rows) continue;
        for (size_t i = 0; i < rs[s].n_reg; i++) {
            size_t lo, hi;
            if (!whole(&rs[s], i, n, &lo, &hi)) continue;
            if (write_all(st->fd, rs[s].base + lo, hi - lo, file_off(src, s) + lo)) {
                close(st->fd);
                cm_free(st);
                return NULL;
            }
            st->bytes += hi - lo;
        }
    }
    return st;
}

/* Map st's pages of positions [0, n) over kv's (same layout: same offsets).
 * kv's old store, if any, is let go (its ranges lie under the new ones, or
 * are taken back first, bytes kept). On failure kv's ranges are anonymous
 * again with the bytes they showed (st's bytes are the ones they replaced). */
static int attach(cm_kv *kv, struct cm_kv_store *st, int n) {
    if (kv->store == st && kv->n_shared >= n) return 0; /* unwritten since: n_shared drops on truncation */
    if (kv->store && kv->n_mapped > n) {
        int rc = detach(kv, true);
        if (rc) return rc;
    }
    region_set rs[2];
    const int nr = cm_kv_regions(kv, rs);
    int rc = 0;
    for (int s = 0; s < nr && !rc; s++) {
        if (!rs[s].rows) continue;
        for (size_t i = 0; i < rs[s].n_reg; i++) {
            size_t lo, hi;
            if (!whole(&rs[s], i, n, &lo, &hi)) continue;
            void *q = mmap(rs[s].base + lo, hi - lo, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_NORESERVE,
                           st->fd, (off_t)(file_off(kv, s) + lo));
            if (q == MAP_FAILED) {
                rc = CM_ENOMEM;
                break;
            }
        }
    }
    struct cm_kv_store *old = kv->store; /* every range of it lies under the new ones */
    atomic_fetch_add(&st->refs, 1);
    kv->store = st;
    kv->n_mapped = kv->n_shared = n;
    unref(old);
    if (rc) (void)detach(kv, true);
    return rc;
}

/* The bytes of positions [0, n) of dst that are not st's whole pages: copied
 * from src (the partial pages at a region's ends, the transposed V). */
static void copy_rest(cm_kv *dst, const cm_kv *src, int n) {
    region_set rd[2], rsrc[2];
    const int nr = cm_kv_regions(dst, rd);
    (void)cm_kv_regions(src, rsrc);
    for (int s = 0; s < nr; s++)
        for (size_t i = 0; i < rd[s].n_reg; i++) {
            const size_t a = i * rd[s].stride, b = a + (size_t)n * rd[s].unit;
            size_t lo = b, hi = b;
            if (!rd[s].rows || !whole(&rd[s], i, n, &lo, &hi)) lo = hi = b;
            memcpy(rd[s].base + a, rsrc[s].base + a, lo - a);
            memcpy(rd[s].base + hi, rsrc[s].base + hi, b - hi);
        }
}

int cm_kv_share_prefix(cm_kv *dst, cm_kv *src, int n, char *err, size_t errlen) {
    if (dst == src) return 0;
    /* where pages cannot be shared, the copy (which also checks shapes, types and n) */
    if (!shareable(dst) || !shareable(src) || dst->n_ctx != src->n_ctx || dst->k_map != src->k_map ||
        dst->v_map != src->v_map || n <= 0 || n > src->n_past || cm_kv_shareable_bytes(src, n) == 0)
        return cm_kv_copy_prefix(dst, src, n, err, errlen);
    if (dst->type != src->type || dst->layer_first != src->layer_first || dst->layer_last != src->layer_last ||
        dst->h0 != src->h0 || dst->h1 != src->h1 || dst->head_dim != src->head_dim || dst->v_rows != src->v_rows ||
        (src->v_rows && dst->type_v != src->type_v) || dst->latent != src->latent)
        return cm_errf(err, errlen, CM_EINVAL, "kv caches of different shapes or types");
    struct cm_kv_store *st = src->store && src->n_shared >= n ? src->store : NULL;
    if (!st) { /* src's prefix pages become a store, and src maps it too */
        st = store_new(src, n);
        if (!st) return cm_kv_copy_prefix(dst, src, n, err, errlen);
        if (attach(src, st, n)) /* src's bytes are kept; st went with the reference attach took */
            return cm_kv_copy_prefix(dst, src, n, err, errlen);
    }
    if (dst->n_past > n) cm_kv_truncate(dst, n); /* what dst held past n goes back */
    if (attach(dst, st, n)) return cm_kv_copy_prefix(dst, src, n, err, errlen);
    copy_rest(dst, src, n);
    dst->n_past = n;
    return 0;
}
