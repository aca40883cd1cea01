/*
 * kv_mem.c: KV cache memory committed on demand (paged KV memory, issue 22).
 *
 * A cache's K and V arrays are address space reserved by mmap (anonymous,
 * no swap reservation, no transparent huge pages): a page costs memory only
 * once a position stored in it is written, and cm_kv_truncate gives back the
 * pages that lie wholly past the positions it keeps (madvise), so a slot that
 * is reset, canceled or evicted holds nothing. The layout model.h states for
 * cm_kv is unchanged, so no reader of the cache (attention, attn_split's
 * blocks, kv_copy, cluster nodes, the GPU upload) changes and every bit an
 * attention computes is the one it computed before.
 *
 * cm_kv_resident_bytes is the exact number of bytes of pages that positions
 * [0, n) of a cache touch (the union of every (layer, head[, dim]) region's
 * used span, page by page), so a server can admit requests by it and report
 * it; the page rounding is the bounded overhead: per region at most one page
 * (the transposed V layout of F32/F16 caches has a region per head dimension,
 * so there a short sequence holds up to layers x heads x head_dim pages).
 *
 * The pool: a sequence that ends (a finished or canceled request, a new
 * prompt keeping a shorter prefix) is rewound with cm_kv_rewind, which
 * keeps the pages past the positions it keeps committed (n_pool), so the
 * next sequence in the same cache writes into pages already there instead
 * of faulting in freshly zeroed ones (and the give-back's madvise calls,
 * one per region in the transposed V, stay off the request's path too).
 * Who budgets memory gives the pool back (cm_kv_trim) when it needs the
 * room: serve's admission does (src/http/queue.c), before it evicts any
 * cached prefix. cm_kv_pooled_bytes says what the pool holds, so "in use"
 * (resident bytes of [0, n_past)) stays what positions occupy.
 *
 * Why not a block table of our own: every reader indexes positions as
 * [n_ctx] rows from one base; a table would change attention, attn_split,
 * kv_copy, the nodes and the Vulkan backend. Shared prefixes use the page
 * table instead (kv_blocks.c: the same pages mapped copy-on-write into
 * several caches). NEEDSWORK: the transposed V's page rounding.
 */
#include "kv_regions.h"
#include "model.h"

#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif

static size_t page_size(void) {
    static size_t p;
    if (!p) {
        long v = sysconf(_SC_PAGESIZE);
        p = v > 0 ? (size_t)v : 4096;
    }
    return p;
}

void *cm_kv_mem_map(size_t bytes, size_t *mapped) {
    const size_t P = page_size();
    size_t len = (bytes + P - 1) / P * P;
    if (!len) len = P;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
    flags |= MAP_NORESERVE; /* address space, not swap: pages are committed as written */
#endif
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_NOHUGEPAGE
    (void)madvise(p, len, MADV_NOHUGEPAGE); /* a 2 MiB page would commit 2 MiB for one position */
#endif
    *mapped = len;
    return p;
}

void cm_kv_mem_unmap(void *p, size_t mapped) {
    if (p && mapped) munmap(p, mapped);
}

/* Give pages [off, off + len) of a mapping back: their memory is freed now
 * and they read as zeros (Linux) or anything (elsewhere) until written. No
 * reader looks past a cache's n_past. */
static void give_back(uint8_t *base, size_t off, size_t len) {
    if (!len) return;
#if defined(__linux__)
    (void)madvise(base + off, len, MADV_DONTNEED);
#elif defined(MADV_FREE_REUSABLE) /* macOS: freed and no longer counted as the process's */
    (void)madvise(base + off, len, MADV_FREE_REUSABLE);
#elif defined(MADV_FREE)
    (void)madvise(base + off, len, MADV_FREE);
#else
    (void)mmap(base + off, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
#endif
}

uint64_t cm_kv_resident_bytes(const cm_kv *kv, int n) {
    if (n <= 0 || !kv->k) return 0;
    if (n > kv->n_ctx) n = kv->n_ctx;
    region_set rs[2];
    const int nr = cm_kv_regions(kv, rs);
    const size_t P = page_size();
    uint64_t bytes = 0;
    for (int r = 0; r < nr; r++) {
        if (!rs[r].map) { /* not mapped by cm_kv_mem_map (heap): the bytes themselves */
            bytes += (uint64_t)rs[r].n_reg * (uint64_t)n * rs[r].unit;
            continue;
        }
        if (rs[r].stride % P == 0) { /* regions start on pages: no page is shared (the usual case, O(1)) */
            const size_t used = CM_MIN((size_t)n * rs[r].unit, rs[r].stride);
            bytes += (uint64_t)rs[r].n_reg * (uint64_t)((used + P - 1) / P * P);
            continue;
        }
        bool any = false;
        size_t last = 0; /* the last page counted; regions ascend, so only it can repeat */
        for (size_t i = 0; i < rs[r].n_reg; i++) {
            size_t lo = i * rs[r].stride, hi = lo + (size_t)n * rs[r].unit;
            if (hi > rs[r].map) hi = rs[r].map;
            if (hi <= lo) continue;
            size_t p0 = lo / P, p1 = (hi - 1) / P;
            if (any && p0 <= last) p0 = last + 1;
            if (p1 >= p0) {
                bytes += (uint64_t)(p1 - p0 + 1) * P;
                last = p1;
                any = true;
            }
        }
    }
    return bytes;
}

uint64_t cm_kv_pooled_bytes(const cm_kv *kv) {
    if (kv->n_pool <= kv->n_past) return 0;
    return cm_kv_resident_bytes(kv, kv->n_pool) - cm_kv_resident_bytes(kv, kv->n_past);
}

uint64_t cm_kv_mapped_bytes(const cm_kv *kv) { return (uint64_t)kv->k_map + (uint64_t)kv->v_map; }

void cm_kv_trim(cm_kv *kv) {
    if (!kv->k) return;
    cm_kv_blocks_trim(kv); /* shared prefix blocks (kv_blocks.c) */
    kv->n_pool = 0;        /* the pool goes back with the rest */
    region_set rs[2];
    const int nr = cm_kv_regions(kv, rs);
    const size_t P = page_size();
    const size_t n = (size_t)(kv->n_past > 0 ? kv->n_past : 0);
    for (int r = 0; r < nr; r++) {
        if (!rs[r].map) continue;
        if (!n) { /* nothing kept: the whole array in one call */
            give_back(rs[r].base, 0, rs[r].map);
            continue;
        }
        size_t plo = 0, phi = 0; /* a pending run of pages to give back */
        for (size_t i = 0; i < rs[r].n_reg; i++) {
            size_t lo = i * rs[r].stride + n * rs[r].unit, hi = (i + 1) * rs[r].stride;
            if (i + 1 == rs[r].n_reg || hi > rs[r].map) hi = rs[r].map; /* the tail past the last region too */
            lo = (lo + P - 1) / P * P;                                  /* whole pages past the kept positions only */
            hi = hi / P * P;
            if (hi <= lo) continue;
            if (lo != phi) {
                give_back(rs[r].base, plo, phi - plo);
                plo = lo;
            }
            phi = hi;
        }
        give_back(rs[r].base, plo, phi - plo);
    }
}
