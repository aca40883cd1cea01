/*
 * caps.c: what this machine offers (cores, ISA, memory, a measured compute
 * speed and memory bandwidth), the HELLO built from it, file hashing for
 * content addressing, and the small network helpers node.c and coord.c share.
 * The measurements run real kernels for a few milliseconds, once per process.
 */
#include "cluster/cluster_int.h"

#include "kernels/kernels.h"
#include "os/os.h"
#include "tensor/tensor.h"

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static cm_node_caps g_caps;
static pthread_once_t g_caps_once = PTHREAD_ONCE_INIT;

/* Seconds for `reps` Q8_0 x Q8_0 dot products over n elements at x/y. */
static double time_dots(const cm_kernels *k, const uint8_t *x, const uint8_t *y, int64_t n, int reps, float *sink) {
    double t0 = cm_now_s();
    for (int r = 0; r < reps; r++) {
        float s = 0;
        k->vec_dot[CM_TYPE_Q8_0](n, &s, x, y);
        *sink += s;
    }
    return cm_now_s() - t0;
}

static void measure(void) {
    cm_node_caps *c = &g_caps;
    const cm_kernels *k = cm_kernels_get();
    c->cores = cm_cpu_count();
    const char *feats[32];
    const int n_feats = cm_cpu_feature_names(feats, (int)CM_ARRAY_LEN(feats));
    size_t at = (size_t)snprintf(c->isa, sizeof c->isa, "%s", k->name);
    const char *sep = " (";
    for (int i = 0; i < n_feats && at < sizeof c->isa; i++) {
        at += (size_t)snprintf(c->isa + at, sizeof c->isa - at, "%s%s", sep, feats[i]);
        sep = ",";
    }
    if (*sep == ',' && at + 1 < sizeof c->isa) memcpy(c->isa + at, ")", 2);
    c->mem_total = cm_mem_total_bytes();
    c->mem_free = cm_mem_available_bytes();
    if (c->mem_free > c->mem_total) c->mem_free = c->mem_total;
    snprintf(c->os, sizeof c->os, "%s", cm_os_name());
    snprintf(c->arch, sizeof c->arch, "%s", cm_arch_name());
    snprintf(c->version, sizeof c->version, "%s", CM_VERSION);
    /* Compute: 8 Ki elements (both operands ~17 KiB, in L1/L2), repeated.
     * Bandwidth: 32 MiB of Q8_0 weights against one activation row. */
    const int64_t small = 8192, big = (int64_t)24 << 20;
    size_t bs = (size_t)(big / CM_QK8_0) * sizeof(cm_block_q8_0);
    uint8_t *x = cm_calloc(1, bs), *y = cm_calloc(1, bs);
    float sink = 0;
    if (x && y && k->vec_dot[CM_TYPE_Q8_0]) {
        /* Touch every page first: the timed pass must stream memory, not
         * take page faults. Scales stay 0 (f16 zero), quants arbitrary. */
        memset(x, 1, bs);
        for (size_t i = 0; i < bs; i += sizeof(cm_block_q8_0)) x[i] = x[i + 1] = 0;
        time_dots(k, x, y, small, 50, &sink); /* warm up */
        double best = 1e9;
        for (int i = 0; i < 3; i++) {
            double t = time_dots(k, x, y, small, 400, &sink);
            if (t < best) best = t;
        }
        c->gflops = best > 0 ? 2.0 * (double)small * 400 / best / 1e9 : 0;
        /* A pass over a weight matrix streams it with the activation cached;
         * the best of two passes. */
        int64_t rows = big / small;
        double t = 1e9;
        for (int pass = 0; pass < 2; pass++) {
            double t0 = cm_now_s();
            for (int64_t r = 0; r < rows; r++) {
                float s = 0;
                k->vec_dot[CM_TYPE_Q8_0](small, &s, x + (size_t)r * (small / CM_QK8_0) * sizeof(cm_block_q8_0), y);
                sink += s;
            }
            double dt = cm_now_s() - t0;
            if (dt < t) t = dt;
        }
        c->mem_bw = t > 0 ? (double)bs / t : 0;
    }
    if (sink == 12345.0f) c->gflops += 0; /* keep the loops */
    cm_free(x);
    cm_free(y);
    /* Declared speeds replace the measured ones (tests that need equally
     * strong machines on one shared host; a machine busy at start). */
    const char *d = cm_config_get()->declare_speed;
    if (d) {
        char *e1, *e2 = NULL;
        double g = strtod(d, &e1), b = *e1 == ',' ? strtod(e1 + 1, &e2) : 0;
        if (e1 != d && *e1 == ',' && e2 && !*e2 && g > 0 && g < 1e6 && b > 0 && b < 1e6) {
            c->gflops = g;
            c->mem_bw = b * 1e9;
            c->declared = true;
        } else CM_LOGW("CUMULO_DECLARE_SPEED='%s' ignored: expected GFLOPS,GBS like 20,4", d);
    }
}

void cm_node_caps_get(cm_node_caps *c) {
    pthread_once(&g_caps_once, measure);
    *c = g_caps;
    uint64_t fr = cm_mem_available_bytes();
    c->mem_free = fr < c->mem_total ? fr : c->mem_total;
    /* CUMULO_MEM_OFFER (bytes, or with a K/M/G suffix) caps the memory this
     * machine offers the planner: it keeps the rest for other work, and
     * tests make a model stop fitting when a node goes. */
    int64_t offer = cm_config_get()->mem_offer;
    if (offer >= 0 && (uint64_t)offer < c->mem_free) c->mem_free = (uint64_t)offer;
}

void cm_sha256_hex(const uint8_t h[32], char out[65]) {
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Remembered hashes: hashing a multi-GB file takes seconds. */
typedef struct hash_memo {
    char path[512];
    uint64_t size;
    int64_t mtime;
    uint8_t h[32];
} hash_memo;
static hash_memo g_memo[32];
static int g_memo_n;
static pthread_mutex_t g_memo_mu = PTHREAD_MUTEX_INITIALIZER;

int cm_file_sha256(const char *path, uint8_t out[32], char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) return cm_errf(err, errlen, CM_ENOENT, "cannot open '%s': no such file", path);
    pthread_mutex_lock(&g_memo_mu);
    for (int i = 0; i < g_memo_n; i++)
        if (!strcmp(g_memo[i].path, path) && g_memo[i].size == (uint64_t)st.st_size &&
            g_memo[i].mtime == (int64_t)st.st_mtime) {
            memcpy(out, g_memo[i].h, 32);
            pthread_mutex_unlock(&g_memo_mu);
            return 0;
        }
    pthread_mutex_unlock(&g_memo_mu);
    FILE *f = fopen(path, "rb");
    if (!f) return cm_errf(err, errlen, CM_ENOENT, "cannot open '%s'", path);
    crypto_hash_sha256_state s;
    crypto_hash_sha256_init(&s);
    static _Thread_local uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) crypto_hash_sha256_update(&s, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) return cm_errf(err, errlen, CM_EIO, "cannot read '%s'", path);
    crypto_hash_sha256_final(&s, out);
    pthread_mutex_lock(&g_memo_mu);
    hash_memo *m = &g_memo[g_memo_n < 32 ? g_memo_n++ : 0];
    snprintf(m->path, sizeof m->path, "%s", path);
    m->size = (uint64_t)st.st_size;
    m->mtime = (int64_t)st.st_mtime;
    memcpy(m->h, out, 32);
    pthread_mutex_unlock(&g_memo_mu);
    return 0;
}

void cm_cluster_hello(cm_msg_hello *h, const char *name, uint16_t listen_port, uint32_t roles) {
    cm_node_caps c;
    cm_node_caps_get(&c);
    memset(h, 0, sizeof *h);
    h->proto_version = CM_PROTO_VERSION;
    /* A fresh id per caller: a node daemon draws its own once, a
     * coordinator once per pipe (several may share a process in tests). */
    if (sodium_init() < 0) { /* randombytes works even so */
    }
    randombytes_buf(h->node_id, sizeof h->node_id);
    char host[64] = "cumulo";
    if (!name || !*name) {
        gethostname(host, sizeof host - 1);
        name = host;
    }
    snprintf(h->name, sizeof h->name, "%s", name);
    for (char *p = h->name; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '_';
    h->listen_port = listen_port;
    h->roles = roles;
    h->cores = (uint32_t)(c.cores > 0 ? c.cores : 1);
    snprintf(h->isa, sizeof h->isa, "%s", c.isa);
    h->mem_total = c.mem_total;
    h->mem_free = c.mem_free;
    snprintf(h->os, sizeof h->os, "%s", c.os);
    snprintf(h->arch, sizeof h->arch, "%s", c.arch);
    snprintf(h->version, sizeof h->version, "%s", c.version);
    h->gflops = (float)c.gflops;
    h->mem_gbs = (float)(c.mem_bw / 1e9);
    h->has_tail = true;
    cm_host_id(h->host, sizeof h->host);
}

int cm_cluster_lost_ms(void) {
    int ms = cm_config_get()->lost_ms; /* tests: a tighter or looser bound */
    return ms ? ms : CM_PIPE_LOST_MS;
}

int cm_cluster_net_cfg(cm_net_cfg *cfg, bool insecure, const char *key_file, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    cfg->send_stall_ms = cm_cluster_lost_ms(); /* a peer that takes nothing for the loss bound is gone */
    if (insecure) {
        cfg->mode = CM_SEC_INSECURE;
        return 0;
    }
    cfg->mode = CM_SEC_ENCRYPT;
    char path[512];
    if (!key_file || !*key_file) {
        int rc = cm_net_key_default_path(path, sizeof path, err, errlen);
        if (rc) return rc;
        key_file = path;
    }
    int rc = cm_net_key_load(key_file, cfg->key, err, errlen);
    if (rc == CM_ENOENT)
        return cm_errf(err, errlen, rc, "no cluster key at '%s' (run `cumulo key`, or pass --insecure on every node)",
                       key_file);
    return rc;
}

int cm_cluster_dial(const char *addr, const cm_net_cfg *cfg, const cm_msg_hello *mine, cm_conn **out,
                    cm_msg_hello *peer, char *err, size_t errlen) {
    return cm_cluster_dial_within(addr, cfg, mine, 5000, out, peer, err, errlen);
}

int cm_cluster_dial_within(const char *addr, const cm_net_cfg *cfg, const cm_msg_hello *mine, int timeout_ms,
                           cm_conn **out, cm_msg_hello *peer, char *err, size_t errlen) {
    char host[256];
    uint16_t port;
    *out = NULL;
    if (timeout_ms < 1) return cm_errf(err, errlen, CM_ETIMEDOUT, "no time left to connect to %s", addr);
    int rc = cm_net_parse_addr(addr, CM_NET_DEFAULT_PORT, host, sizeof host, &port, err, errlen);
    if (rc) return rc;
    uint64_t end = cm_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    cm_conn *c;
    if ((rc = cm_net_connect(host, port, timeout_ms, &c, err, errlen))) return rc;
    /* the handshake gets what the connect left (it has its own default otherwise) */
    cm_net_cfg hc = *cfg;
    uint64_t now = cm_now_ns();
    int left = now < end ? (int)((end - now) / 1000000ull) : 0;
    if (left < 1) left = 1;
    if (!hc.handshake_ms || hc.handshake_ms > left) hc.handshake_ms = left;
    rc = cm_conn_handshake(c, true, &hc, mine, peer, err, errlen);
    sodium_memzero(&hc, sizeof hc); /* a copy of the key */
    if (rc) {
        cm_conn_close(c, NULL);
        return rc;
    }
    *out = c;
    return 0;
}

typedef struct dial_job {
    const char *addr;
    const cm_net_cfg *cfg;
    const cm_msg_hello *mine;
    cm_conn *out;
    cm_msg_hello peer;
    int rc;
    char err[400];
    pthread_t th;
    bool started;
} dial_job;

static void *dial_main(void *arg) {
    dial_job *j = arg;
    j->rc = cm_cluster_dial(j->addr, j->cfg, j->mine, &j->out, &j->peer, j->err, sizeof j->err);
    return NULL;
}

void cm_cluster_dial_many(const char (*addrs)[80], int n, const cm_net_cfg *cfg, const cm_msg_hello *mine,
                          cm_conn **out, cm_msg_hello *peers, int *rc, char (*err)[400]) {
    CM_ASSERT(n >= 0 && n <= CM_CLUSTER_DIAL_MAX);
    dial_job *jobs = cm_calloc((size_t)(n ? n : 1), sizeof *jobs);
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (!jobs) {
            rc[i] = cm_errf(err[i], 400, CM_ENOMEM, "out of memory");
            continue;
        }
        dial_job *j = &jobs[i];
        j->addr = addrs[i];
        j->cfg = cfg;
        j->mine = mine;
        j->started = pthread_create(&j->th, NULL, dial_main, j) == 0;
        if (!j->started) dial_main(j); /* no thread: dial here, one at a time */
    }
    for (int i = 0; jobs && i < n; i++) {
        dial_job *j = &jobs[i];
        if (j->started) pthread_join(j->th, NULL);
        out[i] = j->out;
        if (peers) peers[i] = j->peer;
        rc[i] = j->rc;
        snprintf(err[i], 400, "%s", j->rc ? j->err : "");
    }
    cm_free(jobs);
}

int cm_cluster_measure(cm_conn *c, int probe_bytes, double *rtt_s, double *bw, char *err, size_t errlen) {
    return cm_cluster_measure_within(c, probe_bytes, 0, rtt_s, bw, err, errlen);
}

/* The wait for one exchange: its own bound, cut to what the deadline leaves
 * (end 0: no deadline). */
static int wait_ms(uint64_t end, int own, char *err, size_t errlen) {
    if (!end) return own;
    uint64_t now = cm_now_ns();
    if (now >= end) return cm_errf(err, errlen, CM_ETIMEDOUT, "link measurement ran out of time");
    uint64_t left = (end - now) / 1000000ull + 1;
    return left < (uint64_t)own ? (int)left : own;
}

int cm_cluster_measure_within(cm_conn *c, int probe_bytes, int timeout_ms, double *rtt_s, double *bw, char *err,
                              size_t errlen) {
    double best = 1e9;
    cm_msg m, r;
    uint64_t end = timeout_ms > 0 ? cm_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
    for (int i = 0; i < 4; i++) {
        memset(&m, 0, sizeof m);
        m.type = CM_MSG_PING;
        m.u.ping.id = (uint64_t)i;
        m.u.ping.sent_ns = cm_now_ns();
        double t0 = cm_now_s();
        int w = wait_ms(end, 5000, err, errlen);
        if (w < 0) return w;
        int rc = cm_conn_send(c, &m, w, err, errlen);
        if (!rc && (w = wait_ms(end, 5000, err, errlen)) < 0) rc = w;
        if (!rc) rc = cm_conn_recv(c, &r, w, err, errlen);
        if (rc) return rc;
        if (r.type != CM_MSG_PONG)
            return cm_errf(err, errlen, CM_EPROTO, "expected PONG, got %s", cm_msg_type_name(r.type));
        double t = cm_now_s() - t0;
        if (t < best) best = t;
    }
    *rtt_s = best;
    *bw = 0;
    if (probe_bytes <= 0) return 0;
    uint8_t *data = cm_calloc(1, (size_t)probe_bytes);
    if (!data) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    /* The fastest of three, so a cold connection (slow start, first
     * buffer growth) does not pass for a slow link. */
    double tb = 1e9;
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        memset(&m, 0, sizeof m);
        m.type = CM_MSG_PING;
        m.u.ping.id = 100 + (uint64_t)i;
        m.u.ping.data = data;
        m.u.ping.data_len = (uint32_t)probe_bytes;
        double t0 = cm_now_s();
        int w = wait_ms(end, CM_PIPE_DATA_MS, err, errlen);
        rc = w < 0 ? w : cm_conn_send(c, &m, w, err, errlen);
        if (!rc && (w = wait_ms(end, CM_PIPE_DATA_MS, err, errlen)) < 0) rc = w;
        if (!rc) rc = cm_conn_recv(c, &r, w, err, errlen);
        if (!rc && r.type != CM_MSG_PONG)
            rc = cm_errf(err, errlen, CM_EPROTO, "expected PONG, got %s", cm_msg_type_name(r.type));
        double t = cm_now_s() - t0;
        if (t < tb) tb = t;
    }
    cm_free(data);
    if (rc) return rc;
    /* Below ~10 us the difference is noise: call it 10 GB/s-class. */
    double t = tb - best;
    *bw = (double)probe_bytes / (t > probe_bytes / 1e10 ? t : probe_bytes / 1e10);
    return 0;
}

int cm_tp_greet_epoch(cm_conn *c, uint64_t epoch, char *err, size_t errlen) {
    cm_msg m = {.type = CM_MSG_PING};
    m.u.ping.id = epoch;
    return cm_conn_send(c, &m, 10000, err, errlen);
}
