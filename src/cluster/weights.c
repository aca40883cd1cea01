/*
 * weights.c: content-addressed weight streaming (see weights.h for the
 * objects and the sparse cache file). The coordinator serves bytes from its
 * mapping; the node verifies every tensor's SHA-256 before trusting it and
 * never allocates from a peer's claim: sizes come from the manifest, whose
 * own bytes are checked against the model's hash in the manifest's tensor
 * table only after it is fully parsed by the bounded GGUF reader.
 */
#include "cluster/weights.h"
#include "cluster/cluster.h"

#include "os/os.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (4u << 20)
#define MANIFEST_MAX (256ull << 20) /* a header of 256 MiB is not a model we serve */

/* ---- coordinator ---- */

typedef struct served {
    const cm_gguf *g;
    uint8_t (*hash)[32]; /* per tensor */
    uint8_t *manifest;
    size_t manifest_len;
    uint8_t xm_id[32]; /* the expert manifest's address */
    uint8_t *xm;       /* expert manifest: slab hashes of the stacked expert tensors, table order */
    size_t xm_len;
    uint64_t *xm_tensor; /* [xm_len / 32]: the tensor index of each slab hash */
} served;
static served g_served;
static pthread_mutex_t g_served_mu = PTHREAD_MUTEX_INITIALIZER;

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A stacked expert tensor ([.., .., n_expert], named *_exps.*): its slab
 * size, else 0. */
static uint64_t expert_slab(const cm_gguf_tensor_info *t) {
    if (t->n_dims != 3 || t->ne[2] < 1 || !strstr(t->name, "_exps.") || t->nbytes % (uint64_t)t->ne[2]) return 0;
    return t->nbytes / (uint64_t)t->ne[2];
}

static void expert_manifest_id(const uint8_t model_sha[32], uint8_t out[32]) {
    static const char tag[] = "cumulo expert slabs 1";
    uint8_t buf[32 + sizeof tag - 1];
    memcpy(buf, model_sha, 32);
    memcpy(buf + 32, tag, sizeof tag - 1);
    crypto_hash_sha256(out, buf, sizeof buf);
}

static int prepare(const cm_gguf *g, char *err, size_t errlen) {
    if (g_served.g == g) return 0;
    cm_free(g_served.hash);
    cm_free(g_served.manifest);
    cm_free(g_served.xm);
    cm_free(g_served.xm_tensor);
    memset(&g_served, 0, sizeof g_served);
    uint64_t nt = g->n_tensors;
    size_t len = 24 + (size_t)g->data_offset + 32 * (size_t)nt;
    uint8_t(*h)[32] = cm_calloc(nt ? nt : 1, 32);
    uint8_t *mf = cm_malloc(len);
    if (!h || !mf) {
        cm_free(h);
        cm_free(mf);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for the manifest");
    }
    put_u64(mf, g->size);
    put_u64(mf + 8, g->data_offset);
    put_u64(mf + 16, nt);
    memcpy(mf + 24, g->base, (size_t)g->data_offset);
    for (uint64_t i = 0; i < nt; i++) {
        crypto_hash_sha256(h[i], g->tensors[i].data, g->tensors[i].nbytes);
        memcpy(mf + 24 + g->data_offset + 32 * i, h[i], 32);
    }
    g_served = (served){.g = g, .hash = h, .manifest = mf, .manifest_len = len};
    /* Expert slabs (NEEDSWORK: a second hashing pass over the experts' bytes;
     * one pass could feed both hashes). */
    uint64_t ns = 0;
    for (uint64_t i = 0; i < nt; i++)
        if (expert_slab(&g->tensors[i])) ns += (uint64_t)g->tensors[i].ne[2];
    if (ns) {
        g_served.xm = cm_malloc((size_t)ns * 32);
        g_served.xm_tensor = cm_malloc((size_t)ns * sizeof(uint64_t));
        if (!g_served.xm || !g_served.xm_tensor) {
            cm_free(g_served.xm);
            cm_free(g_served.xm_tensor);
            g_served.xm = NULL;
            g_served.xm_tensor = NULL;
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory for the expert manifest");
        }
        uint64_t k = 0;
        for (uint64_t i = 0; i < nt; i++) {
            uint64_t sl = expert_slab(&g->tensors[i]);
            for (int64_t e = 0; sl && e < g->tensors[i].ne[2]; e++, k++) {
                crypto_hash_sha256(g_served.xm + 32 * k, (const uint8_t *)g->tensors[i].data + (uint64_t)e * sl, sl);
                g_served.xm_tensor[k] = i;
            }
        }
        g_served.xm_len = (size_t)ns * 32;
    }
    return 0;
}

int cm_weights_serve(cm_conn *c, pthread_mutex_t *send_mu, const cm_gguf *g, const uint8_t model_sha[32],
                     const cm_msg_weights_req *rq, char *err, size_t errlen) {
    pthread_mutex_lock(&g_served_mu);
    int rc = prepare(g, err, errlen);
    const uint8_t *obj = NULL;
    uint64_t total = 0;
    if (!rc) {
        uint8_t xid[32];
        expert_manifest_id(model_sha, xid);
        if (!memcmp(rq->tensor_hash, model_sha, 32)) {
            obj = g_served.manifest;
            total = g_served.manifest_len;
        } else if (!memcmp(rq->tensor_hash, xid, 32)) {
            obj = g_served.xm; /* NULL (no such object) for a model without experts */
            total = g_served.xm_len;
        } else {
            for (uint64_t i = 0; i < g->n_tensors && !obj; i++)
                if (!memcmp(g_served.hash[i], rq->tensor_hash, 32)) {
                    obj = g->tensors[i].data;
                    total = g->tensors[i].nbytes;
                }
            /* an expert slab: the k-th slab hash, counted within its tensor */
            for (uint64_t k = 0, e = 0; k < g_served.xm_len / 32 && !obj; k++) {
                e = k && g_served.xm_tensor[k] == g_served.xm_tensor[k - 1] ? e + 1 : 0;
                if (memcmp(g_served.xm + 32 * k, rq->tensor_hash, 32)) continue;
                const cm_gguf_tensor_info *t = &g->tensors[g_served.xm_tensor[k]];
                total = expert_slab(t);
                obj = (const uint8_t *)t->data + e * total;
            }
        }
    }
    pthread_mutex_unlock(&g_served_mu);
    if (rc) return rc;
    return cm_weights_send_object(c, send_mu, obj, total, rq, err, errlen);
}

int cm_weights_send_object(cm_conn *c, pthread_mutex_t *send_mu, const uint8_t *obj, uint64_t total,
                           const cm_msg_weights_req *rq, char *err, size_t errlen) {
    int rc;
    cm_msg m = {.type = CM_MSG_WEIGHTS_CHUNK};
    memcpy(m.u.weights_chunk.tensor_hash, rq->tensor_hash, 32);
    if (!obj || rq->offset > total) {
        /* An empty chunk with total 0 says "no such object". */
        m.u.weights_chunk.total = 0;
        m.u.weights_chunk.offset = 0;
    } else {
        uint64_t n = total - rq->offset;
        if (n > rq->len) n = rq->len;
        m.u.weights_chunk.offset = rq->offset;
        m.u.weights_chunk.total = total;
        m.u.weights_chunk.data = obj + rq->offset;
        m.u.weights_chunk.data_len = (uint32_t)n;
    }
    pthread_mutex_lock(send_mu);
    rc = cm_conn_send(c, &m, CM_PIPE_DATA_MS, err, errlen);
    pthread_mutex_unlock(send_mu);
    return rc;
}

/* ---- node ---- */

/* The caller's sink for an ASSIGN that supersedes the fetch in progress
 * (cm_weights_fetch's newer/superseded), for this thread's fetch. */
static _Thread_local cm_msg_assign *g_newer;
static _Thread_local bool *g_superseded;

/* A message other than a chunk: a newer ASSIGN is kept for the caller. */
static int not_a_chunk(const cm_msg *r, char *err, size_t errlen) {
    if (r->type == CM_MSG_ASSIGN && g_newer && g_superseded) {
        *g_newer = r->u.assign;
        *g_superseded = true;
        return cm_errf(err, errlen, CM_ECANCELED, "superseded by the assignment of epoch %llu",
                       (unsigned long long)r->u.assign.epoch);
    }
    return cm_errf(err, errlen, CM_EPROTO, "expected a WEIGHTS_CHUNK, got %s", cm_msg_type_name(r->type));
}

/* Fetch [0, total) of an object into buf (cap bytes) or, when fd >= 0, to
 * fd at file offset base. total_out: the object's size (first chunk). */
static int fetch(cm_conn *c, pthread_mutex_t *send_mu, const uint8_t hash[32], uint8_t *buf, size_t cap, int fd,
                 uint64_t base, uint64_t expect, uint64_t *total_out, char *err, size_t errlen) {
    uint64_t off = 0, total = expect;
    for (;;) {
        cm_msg m = {.type = CM_MSG_WEIGHTS_REQ};
        memcpy(m.u.weights_req.tensor_hash, hash, 32);
        m.u.weights_req.offset = off;
        m.u.weights_req.len = CHUNK;
        pthread_mutex_lock(send_mu);
        int rc = cm_conn_send(c, &m, 30000, err, errlen);
        pthread_mutex_unlock(send_mu);
        if (rc) return rc;
        cm_msg r;
        /* Chunks are the only thing the coordinator sends while we load, but
         * the answer to the request of a fetch that a newer ASSIGN superseded
         * may still be on its way: a few chunks of another object, or of this
         * one at another offset (the new fetch asks for the same object
         * again; a stale answer at the same offset holds the same bytes),
         * are skipped. */
        int stale = 0;
        do rc = cm_conn_recv(c, &r, CM_PIPE_DATA_MS, err, errlen);
        while (!rc && (r.type == CM_MSG_HEARTBEAT || r.type == CM_MSG_PING ||
                       (r.type == CM_MSG_WEIGHTS_CHUNK &&
                        (memcmp(r.u.weights_chunk.tensor_hash, hash, 32) || r.u.weights_chunk.offset != off) &&
                        ++stale <= 4)));
        if (rc) return rc;
        if (r.type != CM_MSG_WEIGHTS_CHUNK) return not_a_chunk(&r, err, errlen);
        if (memcmp(r.u.weights_chunk.tensor_hash, hash, 32))
            return cm_errf(err, errlen, CM_EPROTO, "a WEIGHTS_CHUNK of another object");
        const cm_msg_weights_chunk *ch = &r.u.weights_chunk;
        if (ch->total == 0) return cm_errf(err, errlen, CM_ENOENT, "the coordinator does not have that object");
        if (off == 0 && !expect) {
            total = ch->total;
            if (fd < 0 && total > cap)
                return cm_errf(err, errlen, CM_ERANGE, "object of %llu bytes is too large", (unsigned long long)total);
        }
        if (ch->total != total || ch->offset != off || (ch->data_len == 0 && off < total))
            return cm_errf(err, errlen, CM_EPROTO, "chunk at %llu of %llu does not continue at %llu",
                           (unsigned long long)ch->offset, (unsigned long long)ch->total, (unsigned long long)off);
        if (fd >= 0) {
            size_t done = 0;
            while (done < ch->data_len) {
                ssize_t w = pwrite(fd, ch->data + done, ch->data_len - done, (off_t)(base + off + done));
                if (w <= 0) return cm_errf(err, errlen, CM_EIO, "cannot write the cache: %s", strerror(errno));
                done += (size_t)w;
            }
        } else {
            if (off + ch->data_len > cap) return cm_errf(err, errlen, CM_ERANGE, "object larger than announced");
            memcpy(buf + off, ch->data, ch->data_len);
        }
        off += ch->data_len;
        if (off >= total) break;
    }
    if (total_out) *total_out = total;
    return 0;
}

static bool wanted(const char *name, int b, int e, bool embed, bool last, bool has_output) {
    int layer;
    char rest[8];
    if (sscanf(name, "blk.%d.%1s", &layer, rest) == 2) return layer >= b && layer < e;
    if (!strcmp(name, "rope_freqs.weight")) return true;
    /* A member of the first stage's TP group embeds its tokens itself. */
    if (embed && !strcmp(name, "token_embd.weight")) return true;
    if (!last) return false;
    if (!strcmp(name, "output_norm.weight") || !strcmp(name, "output.weight")) return true;
    return !has_output && !strcmp(name, "token_embd.weight");
}

/* Is the tensor at [off, off + n) of fd equal to hash? */
static bool verify(int fd, uint64_t off, uint64_t n, const uint8_t hash[32]) {
    static _Thread_local uint8_t buf[1 << 16];
    crypto_hash_sha256_state s;
    crypto_hash_sha256_init(&s);
    uint64_t done = 0;
    while (done < n) {
        size_t want = n - done < sizeof buf ? (size_t)(n - done) : sizeof buf;
        ssize_t r = pread(fd, buf, want, (off_t)(off + done));
        if (r <= 0) return false;
        crypto_hash_sha256_update(&s, buf, (size_t)r);
        done += (uint64_t)r;
    }
    uint8_t h[32];
    crypto_hash_sha256_final(&s, h);
    return !memcmp(h, hash, 32);
}

/* Expert parallelism: the expert manifest (cached beside the manifest), and
 * the slabs [e0, e1) of tensor ti (whose slab hashes start at xh). */
static int fetch_expert_manifest(cm_conn *c, pthread_mutex_t *send_mu, const char *path, const uint8_t model_sha[32],
                                 uint64_t want, uint8_t **out, char *err, size_t errlen) {
    char *raw = NULL;
    size_t len = 0;
    char e[200];
    if (cm_file_read_all(path, &raw, &len, e, sizeof e) == 0 && len == want) {
        *out = (uint8_t *)raw;
        return 0;
    }
    cm_free(raw);
    uint8_t id[32];
    expert_manifest_id(model_sha, id);
    uint8_t *buf = cm_malloc(want ? (size_t)want : 1);
    if (!buf) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    uint64_t total = 0;
    int rc = fetch(c, send_mu, id, buf, (size_t)want, -1, 0, want, &total, err, errlen);
    if (!rc && total != want)
        rc = cm_errf(err, errlen, CM_EPROTO, "expert manifest of %llu bytes, expected %llu", (unsigned long long)total,
                     (unsigned long long)want);
    if (!rc) rc = cm_file_write_atomic(path, buf, (size_t)want, 0600, err, errlen);
    if (rc) {
        cm_free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

static int weights_fetch(cm_conn *c, pthread_mutex_t *send_mu, const char *cache_dir, const uint8_t model_sha[32],
                         int layer_begin, int layer_end, bool embed, bool last, int expert_begin, int expert_end,
                         const uint16_t *extra, int n_extra, char *path, size_t cap, uint64_t *fetched, char *err,
                         size_t errlen);

int cm_weights_fetch(cm_conn *c, pthread_mutex_t *send_mu, const char *cache_dir, const uint8_t model_sha[32],
                     int layer_begin, int layer_end, bool embed, bool last, int expert_begin, int expert_end,
                     const uint16_t *extra, int n_extra, char *path, size_t cap, uint64_t *fetched,
                     cm_msg_assign *newer, bool *superseded, char *err, size_t errlen) {
    if (superseded) *superseded = false;
    g_newer = newer;
    g_superseded = superseded;
    int rc = weights_fetch(c, send_mu, cache_dir, model_sha, layer_begin, layer_end, embed, last, expert_begin,
                           expert_end, extra, n_extra, path, cap, fetched, err, errlen);
    g_newer = NULL;
    g_superseded = NULL;
    return rc;
}

static int weights_fetch(cm_conn *c, pthread_mutex_t *send_mu, const char *cache_dir, const uint8_t model_sha[32],
                         int layer_begin, int layer_end, bool embed, bool last, int expert_begin, int expert_end,
                         const uint16_t *extra, int n_extra, char *path, size_t cap, uint64_t *fetched, char *err,
                         size_t errlen) {
    char hex[65], dir[520], mpath[640], gpath[640];
    cm_sha256_hex(model_sha, hex);
    *fetched = 0;
    snprintf(dir, sizeof dir, "%.500s/slices", cache_dir);
    if (cm_mkdir_p(dir, 0700, false))
        return cm_errf(err, errlen, CM_EIO, "cannot create '%s': %s", dir, strerror(errno));
    snprintf(mpath, sizeof mpath, "%s/%s.manifest", dir, hex);
    snprintf(gpath, sizeof gpath, "%s/%s.gguf", dir, hex);
    /* 1. The manifest: from the cache, else from the coordinator. */
    uint8_t *mf = NULL;
    size_t mlen = 0;
    int rc = 0;
    char *raw = NULL;
    if (cm_file_read_all(mpath, &raw, &mlen, err, errlen) == 0) {
        mf = (uint8_t *)raw;
    } else {
        uint8_t head[24];
        uint64_t total = 0;
        /* The size first (a 24-byte read), then the whole manifest. */
        cm_msg m = {.type = CM_MSG_WEIGHTS_REQ};
        memcpy(m.u.weights_req.tensor_hash, model_sha, 32);
        m.u.weights_req.len = 24;
        pthread_mutex_lock(send_mu);
        rc = cm_conn_send(c, &m, 30000, err, errlen);
        pthread_mutex_unlock(send_mu);
        cm_msg r;
        do
            if (!rc) rc = cm_conn_recv(c, &r, CM_PIPE_DATA_MS, err, errlen);
        while (!rc && (r.type == CM_MSG_HEARTBEAT || r.type == CM_MSG_PING));
        if (rc) return rc;
        if (r.type == CM_MSG_ASSIGN) return not_a_chunk(&r, err, errlen);
        if (r.type != CM_MSG_WEIGHTS_CHUNK || r.u.weights_chunk.total < 24 || r.u.weights_chunk.data_len != 24)
            return cm_errf(err, errlen, CM_EPROTO, "no manifest for model %.12s from the coordinator", hex);
        memcpy(head, r.u.weights_chunk.data, 24);
        total = r.u.weights_chunk.total;
        if (total > MANIFEST_MAX)
            return cm_errf(err, errlen, CM_ERANGE, "manifest of %llu bytes", (unsigned long long)total);
        mf = cm_malloc((size_t)total);
        if (!mf) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        rc = fetch(c, send_mu, model_sha, mf, (size_t)total, -1, 0, total, NULL, err, errlen);
        if (!rc && memcmp(mf, head, 24)) rc = cm_errf(err, errlen, CM_EPROTO, "manifest changed while fetched");
        mlen = (size_t)total;
        if (!rc) rc = cm_file_write_atomic(mpath, mf, mlen, 0600, err, errlen);
        if (rc) {
            cm_free(mf);
            return rc;
        }
    }
    uint64_t fsize = mlen >= 24 ? get_u64(mf) : 0, doff = mlen >= 24 ? get_u64(mf + 8) : 0,
             nt = mlen >= 24 ? get_u64(mf + 16) : 0;
    if (mlen < 24 || doff > mlen - 24 || nt > (mlen - 24 - doff) / 32 || 24 + doff + 32 * nt != mlen || doff > fsize) {
        cm_free(mf);
        remove(mpath);
        return cm_errf(err, errlen, CM_EFORMAT, "malformed manifest for model %.12s", hex);
    }
    /* 2. The sparse file: header at 0, full size. */
    int fd = open(gpath, O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        cm_free(mf);
        return cm_errf(err, errlen, CM_EIO, "cannot open '%s': %s", gpath, strerror(errno));
    }
    if (ftruncate(fd, (off_t)fsize) || pwrite(fd, mf + 24, (size_t)doff, 0) != (ssize_t)doff) {
        rc = cm_errf(err, errlen, CM_EIO, "cannot write '%s': %s", gpath, strerror(errno));
        goto out;
    }
    /* Parse the header through the bounded reader, on the sparse file. */
    cm_gguf g;
    char e[300];
    fsync(fd);
    if ((rc = cm_gguf_open(&g, gpath, NULL, NULL, e, sizeof e))) {
        rc = cm_errf(err, errlen, rc, "streamed header: %s", e);
        goto out;
    }
    if (g.n_tensors != nt || g.data_offset > fsize) {
        cm_gguf_close(&g);
        rc = cm_errf(err, errlen, CM_EFORMAT, "manifest and header disagree");
        goto out;
    }
    bool has_output = cm_gguf_find_tensor(&g, "output.weight") != NULL;
    /* Expert parallelism: the slab hashes of every stacked expert tensor. */
    uint8_t *xm = NULL;
    uint64_t xslabs = 0;
    bool ep = expert_end > 0;
    for (uint64_t i = 0; i < nt; i++)
        if (expert_slab(&g.tensors[i])) xslabs += (uint64_t)g.tensors[i].ne[2];
    if (ep && xslabs > MANIFEST_MAX / 32) { /* the header's claim: never allocate from it unbounded */
        cm_gguf_close(&g);
        rc = cm_errf(err, errlen, CM_ERANGE, "%llu expert slabs in the streamed header", (unsigned long long)xslabs);
        goto out;
    }
    if (ep && xslabs) {
        char xpath[660];
        snprintf(xpath, sizeof xpath, "%s/%s.experts", dir, hex);
        rc = fetch_expert_manifest(c, send_mu, xpath, model_sha, xslabs * 32, &xm, e, sizeof e);
        if (rc) {
            cm_gguf_close(&g);
            rc = cm_errf(err, errlen, rc, "expert manifest: %s", e);
            goto out;
        }
    }
    uint64_t need = 0, have = 0;
    for (uint64_t i = 0; i < nt; i++)
        if (wanted(g.tensors[i].name, layer_begin, layer_end, embed, last, has_output)) {
            uint64_t sl = xm ? expert_slab(&g.tensors[i]) : 0;
            bool extra_ok = true; /* replicas: experts of the tensor outside the range */
            for (int j = 0; sl && j < n_extra; j++)
                extra_ok &= extra[j] < g.tensors[i].ne[2] && (extra[j] < expert_begin || extra[j] >= expert_end);
            if (sl && (expert_begin < 0 || expert_end > g.tensors[i].ne[2] || expert_begin > expert_end || !extra_ok)) {
                cm_gguf_close(&g);
                cm_free(xm);
                rc = cm_errf(err, errlen, CM_EINVAL, "experts [%d, %d) of '%s' (%lld experts)", expert_begin,
                             expert_end, g.tensors[i].name, (long long)g.tensors[i].ne[2]);
                goto out;
            }
            need += sl ? sl * (uint64_t)(expert_end - expert_begin + n_extra) : g.tensors[i].nbytes;
        }
    for (uint64_t i = 0, xk = 0; i < nt && !rc; i++) {
        const cm_gguf_tensor_info *ti = &g.tensors[i];
        uint64_t sl = xm ? expert_slab(ti) : 0;
        uint64_t xbase = xk; /* this tensor's first slab hash */
        if (sl) xk += (uint64_t)ti->ne[2];
        if (!wanted(ti->name, layer_begin, layer_end, embed, last, has_output)) continue;
        uint64_t at = g.data_offset + ti->offset;
        if (sl) { /* only our experts' slabs, each verified by its own hash */
            for (int xi = expert_begin; xi < expert_end + n_extra && !rc; xi++) {
                const int ex = xi < expert_end ? xi : extra[xi - expert_end]; /* the range, then the replicas */
                const uint8_t *h = xm + 32 * (xbase + (uint64_t)ex);
                uint64_t so = at + (uint64_t)ex * sl;
                if (verify(fd, so, sl, h)) {
                    have += sl;
                    continue;
                }
                rc = fetch(c, send_mu, h, NULL, 0, fd, so, sl, NULL, e, sizeof e);
                if (!rc && !verify(fd, so, sl, h))
                    rc = cm_errf(e, sizeof e, CM_EAUTH, "expert %d does not match its hash", ex);
                if (rc) {
                    rc = cm_errf(err, errlen, rc, "tensor '%s': %s", ti->name, e);
                    break;
                }
                *fetched += sl;
            }
            if (!rc)
                CM_LOGI("weights: '%s' experts [%d, %d) verified (%.0f%% of this stage's %.1f MB)", ti->name,
                        expert_begin, expert_end, need ? 100.0 * (double)(have + *fetched) / (double)need : 100.0,
                        need / 1e6);
            continue;
        }
        const uint8_t *h = mf + 24 + doff + 32 * i;
        if (verify(fd, at, ti->nbytes, h)) {
            have += ti->nbytes;
            continue;
        }
        rc = fetch(c, send_mu, h, NULL, 0, fd, at, ti->nbytes, NULL, e, sizeof e);
        if (!rc && !verify(fd, at, ti->nbytes, h))
            rc = cm_errf(e, sizeof e, CM_EAUTH, "tensor '%s' does not match its hash", ti->name);
        if (rc) {
            rc = cm_errf(err, errlen, rc, "tensor '%s': %s", ti->name, e);
            break;
        }
        *fetched += ti->nbytes;
        CM_LOGI("weights: '%s' %.1f MB verified (%.0f%% of this stage's %.1f MB)", ti->name, ti->nbytes / 1e6,
                need ? 100.0 * (double)(have + *fetched) / (double)need : 100.0, need / 1e6);
    }
    cm_gguf_close(&g);
    cm_free(xm);
    if (!rc) {
        fsync(fd);
        size_t l = strlen(gpath);
        if (l >= cap) rc = cm_errf(err, errlen, CM_ERANGE, "cache path too long");
        else memcpy(path, gpath, l + 1);
    }
out:
    close(fd);
    cm_free(mf);
    return rc;
}

int cm_weights_fetch_object(cm_conn *c, pthread_mutex_t *send_mu, const uint8_t hash[32], uint64_t size, uint8_t **out,
                            cm_msg_assign *newer, bool *superseded, char *err, size_t errlen) {
    *out = NULL;
    if (size == 0) return cm_errf(err, errlen, CM_ERANGE, "object of 0 bytes");
    uint8_t *buf = cm_malloc((size_t)size);
    if (!buf) return cm_errf(err, errlen, CM_ENOMEM, "out of memory for %llu bytes", (unsigned long long)size);
    g_newer = newer;
    g_superseded = superseded;
    uint64_t total = 0;
    int rc = fetch(c, send_mu, hash, buf, (size_t)size, -1, 0, size, &total, err, errlen);
    g_newer = NULL;
    g_superseded = NULL;
    uint8_t h[32];
    if (!rc) crypto_hash_sha256(h, buf, (size_t)size);
    if (!rc && memcmp(h, hash, 32)) rc = cm_errf(err, errlen, CM_EPROTO, "the object's bytes do not match its sha256");
    if (rc) {
        cm_free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}
