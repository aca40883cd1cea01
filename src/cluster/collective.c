/*
 * collective.c: the tensor-parallel all-reduce (direct exchange and ring,
 * optional Q8_0 transfer) and the mesh set-up. See collective.h for the
 * reduction orders and the wire layout. Never allocates while reducing,
 * never waits without a deadline, never closes a connection it was lent.
 */
#include "cluster/collective.h"

#include "cluster/coll_impl.h"
#include "cluster/coll_shm.h"
#include "base/base.h"
#include "os/os.h"
#include "tensor/tensor.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static _Atomic(const cm_coll_native *) g_native;
void cm_coll_set_native(const cm_coll_native *nat) { atomic_store(&g_native, nat); }
bool cm_coll_is_native(const cm_coll *c) { return c && c->nat; }

#define Q8_BYTES 34 /* f16 scale + 32 int8 */

static size_t q8_bytes(int64_t n) { return (size_t)((n + CM_COLL_QK - 1) / CM_COLL_QK) * Q8_BYTES; }

/* ---- little-endian fields ---- */
static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32); }
static void put_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(p, u);
}
static float get_f32(const uint8_t *p) {
    uint32_t u = get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- Q8_0 blocks (the last one zero-padded) ---- */
static void q8_quantize(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n; b += CM_COLL_QK) {
        int64_t m = n - b < CM_COLL_QK ? n - b : CM_COLL_QK;
        float amax = 0;
        for (int64_t i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint8_t *o = out + (b / CM_COLL_QK) * Q8_BYTES;
        put_u16(o, cm_f32_to_f16(d));
        for (int i = 0; i < CM_COLL_QK; i++) {
            float v = i < m ? x[b + i] * id : 0.0f;
            o[2 + i] = (uint8_t)(int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, v)));
        }
    }
}
static void q8_dequantize(const uint8_t *q, int64_t n, float *out, bool add) {
    for (int64_t b = 0; b < n; b += CM_COLL_QK) {
        int64_t m = n - b < CM_COLL_QK ? n - b : CM_COLL_QK;
        const uint8_t *o = q + (b / CM_COLL_QK) * Q8_BYTES;
        float d = cm_f16_to_f32(get_u16(o));
        for (int64_t i = 0; i < m; i++) {
            float v = d * (float)(int8_t)o[2 + i];
            out[b + i] = add ? v + out[b + i] : v;
        }
    }
}

/* ---- set-up ---- */

/* CUMULO_TP_ENCRYPT_LOOPBACK=1: encrypt the pieces on loopback links too
 * (by default they go auth-only there: cm_conn_set_clear_allreduce). */
static bool encrypt_loopback(void) { return cm_config_get()->tp_encrypt_loopback; }

/* Raise fd's send and receive buffers to CM_COLL_SOCK_BUF where they are
 * smaller (never lower them; best effort: a socket that refuses keeps its
 * own, which the 16 KiB pieces of old fitted). */
static void sock_bufs(int fd) {
    if (fd < 0) return;
    const int opts[2] = {SO_SNDBUF, SO_RCVBUF};
    for (int i = 0; i < 2; i++) {
        int cur = 0, want = CM_COLL_SOCK_BUF;
        socklen_t len = sizeof cur;
        if (getsockopt(fd, SOL_SOCKET, opts[i], &cur, &len) == 0 && cur >= want) continue;
        (void)setsockopt(fd, SOL_SOCKET, opts[i], &want, sizeof want);
    }
}

int cm_coll_new(const cm_coll_cfg *cfg, cm_coll **out, char *err, size_t errlen) {
    *out = NULL;
    if (cfg->size < 1 || cfg->size > CM_COLL_MAX_MEMBERS || cfg->rank < 0 || cfg->rank >= cfg->size)
        return cm_errf(err, errlen, CM_EINVAL, "tensor-parallel rank %d of %d is out of range", cfg->rank, cfg->size);
    if (cfg->max_n < 1 || cfg->max_n > (int64_t)UINT32_MAX)
        return cm_errf(err, errlen, CM_EINVAL, "all-reduce size %lld is out of range", (long long)cfg->max_n);
    for (int r = 0; r < cfg->size; r++) {
        if (r == cfg->rank) continue;
        if (!cfg->peers[r]) return cm_errf(err, errlen, CM_EINVAL, "no connection to tensor-parallel member %d", r);
        if (cm_conn_state(cfg->peers[r]) != CM_CONN_READY)
            return cm_errf(err, errlen, CM_EINVAL, "connection to member %d (%s) is not ready", r,
                           cm_conn_peer(cfg->peers[r]));
    }
    cm_coll *c = cm_calloc(1, sizeof *c);
    if (!c) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    c->cfg = *cfg;
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : CM_COLL_DEFAULT_TIMEOUT_MS;
    c->ring_min = cfg->ring_min == 0 ? CM_COLL_DEFAULT_RING_MIN : cfg->ring_min;
    size_t nf = (size_t)cfg->max_n;
    c->part = cm_calloc((size_t)cfg->size * nf, sizeof(float));
    c->tmp = cm_calloc(nf, sizeof(float));
    c->qall = cm_calloc(1, q8_bytes(cfg->max_n));
    if (!c->part || !c->tmp || !c->qall) {
        cm_coll_free(c);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for the all-reduce buffers");
    }
    for (int r = 0; r < cfg->size; r++)
        if (r != cfg->rank) {
            cm_conn_set_spin(cfg->peers[r], cm_coll_link_spin_us(cfg->peers[r]));
            cm_conn_set_clear_allreduce(cfg->peers[r], !encrypt_loopback());
            sock_bufs(cm_conn_fd(cfg->peers[r]));
        }
    c->trace = cm_config_get()->tp_trace;
    const cm_coll_native *nat = atomic_load(&g_native);
    if (nat && cfg->size > 1 && !nat->open(nat->ctx, cfg->rank, cfg->size, cfg->max_n, cfg->epoch, &c->ngrp) && c->ngrp)
        c->nat = nat;
    *out = c;
    return 0;
}

int cm_coll_link_spin_us(const cm_conn *conn) {
    const int sp = cm_config_get()->tp_spin_us;
    if (sp >= 0) return sp;
    return cm_conn_is_loopback(conn) ? CM_COLL_LOOPBACK_SPIN_US : 0;
}

static void native_drop(cm_coll *c) {
    if (c->nat) c->nat->close(c->ngrp);
    c->nat = NULL;
    c->ngrp = NULL;
}

/* This thread's CPU time (the trace's breakdown); 0 where there is none. */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double per(double total, uint64_t n) { return n ? total / (double)n : 0.0; }

/* CUMULO_TP_TRACE: where this member's all-reduce time went, per op (µs). */
static void trace_print(const cm_coll *c) {
    const cm_coll_stats *s = &c->st;
    uint64_t gath = s->gather_ops + s->head_ops, big = s->ops - s->small_ops - gath;
    double us = 1e6, big_busy = s->busy_s - s->small_busy_s - c->gather_busy_s,
           big_wait = s->wait_s - s->small_wait_s - c->gather_wait_s;
    fprintf(stderr,
            "tp trace: rank %d of %d: %llu ops; decode-sized all-reduces %llu: %.1f us each (receiving %.1f; cipher "
            "%.1f + %.1f sealing + opening); larger %llu: %.1f us each (receiving %.1f; cipher %.1f + %.1f); gathers "
            "%llu: %.1f us each (receiving %.1f; cipher %.1f + %.1f); sending %.1f us/op; %.3f s between ops\n",
            c->cfg.rank, c->cfg.size, (unsigned long long)s->ops, (unsigned long long)s->small_ops,
            per(s->small_busy_s * us, s->small_ops), per(s->small_wait_s * us, s->small_ops),
            per((double)c->seal_ns[0] * 1e-3, s->small_ops), per((double)c->open_ns[0] * 1e-3, s->small_ops),
            (unsigned long long)big, per(big_busy * us, big), per(big_wait * us, big),
            per((double)c->seal_ns[1] * 1e-3, big), per((double)c->open_ns[1] * 1e-3, big), (unsigned long long)gath,
            per(c->gather_busy_s * us, gath), per(c->gather_wait_s * us, gath), per((double)c->seal_ns[2] * 1e-3, gath),
            per((double)c->open_ns[2] * 1e-3, gath), per(s->send_s * us, s->ops), s->gap_s);
    fprintf(stderr,
            "tp trace: rank %d of %d: larger all-reduces: %.1f ms CPU of %.1f ms wall in them; before them %.1f ms "
            "CPU of %.1f ms wall (computing)\n",
            c->cfg.rank, c->cfg.size, (double)c->big_cpu_ns * 1e-6, big_busy * 1e3, (double)c->big_gap_cpu_ns * 1e-6,
            (double)c->big_gap_wall_ns * 1e-6);
    fprintf(
        stderr,
        "tp trace: rank %d of %d: decode-sized all-reduces: %.1f us CPU of %.1f us wall in each; before each %.1f us "
        "CPU of %.1f us wall (computing)\n",
        c->cfg.rank, c->cfg.size, per((double)c->small_cpu_ns * 1e-3, s->small_ops),
        per(s->small_busy_s * us, s->small_ops), per((double)c->small_gap_cpu_ns * 1e-3, s->small_ops),
        per((double)c->small_gap_wall_ns * 1e-3, s->small_ops));
}

void cm_coll_free(cm_coll *c) {
    if (!c) return;
    if (c->trace && c->st.ops) trace_print(c);
    native_drop(c);
    cm_coll_shm_close(c->shm);
    cm_free(c->part);
    cm_free(c->tmp);
    cm_free(c->qall);
    cm_free(c);
}

void cm_coll_reset(cm_coll *c, uint64_t epoch) {
    native_drop(c);            /* the library's op sequence may be off by one: the exchange from here on */
    cm_coll_shm_close(c->shm); /* the same for the regions' counters: set up again at the next op */
    c->shm = NULL;
    c->shm_tried = false;
    c->cfg.epoch = epoch;
    c->op_id = 0;
    c->failed = false;
    c->err[0] = 0;
}

void cm_coll_stats_get(const cm_coll *c, cm_coll_stats *s) { *s = c->st; }
void cm_coll_stats_clear(cm_coll *c) { memset(&c->st, 0, sizeof c->st); }
const char *cm_coll_error(const cm_coll *c) { return c->err; }

bool cm_coll_uses_ring(const cm_coll *c, int64_t n) {
    return c->cfg.size > 1 && c->ring_min > 0 && n >= c->ring_min && n >= (int64_t)c->cfg.size * CM_COLL_QK;
}

/* Chunk c of the ring: [b(c), b(c+1)), boundaries on multiples of 32. */
static int64_t chunk_at(int64_t n, int k, int c) {
    if (c >= k) return n;
    int64_t b = (n / k) * c + (n % k) * c / k; /* n*c/k without overflow */
    return b / CM_COLL_QK * CM_COLL_QK;
}

static uint64_t piece_data_bytes(const cm_coll *c, int64_t n) {
    uint64_t t = 0;
    for (int64_t o = 0; o < n; o += CM_COLL_PIECE_FLOATS) {
        int64_t m = n - o < CM_COLL_PIECE_FLOATS ? n - o : CM_COLL_PIECE_FLOATS;
        t += c->cfg.compress ? q8_bytes(m) : (uint64_t)m * 4;
    }
    return t;
}

uint64_t cm_coll_data_bytes(const cm_coll *c, int64_t n) {
    int k = c->cfg.size, r = c->cfg.rank;
    if (k < 2) return 0;
    if (!cm_coll_uses_ring(c, n)) return (uint64_t)(k - 1) * piece_data_bytes(c, n);
    uint64_t t = 0;
    for (int s = 0; s < k - 1; s++) {
        int sc = ((r - s) % k + k) % k, ac = ((r + 1 - s) % k + k) % k;
        t += piece_data_bytes(c, chunk_at(n, k, sc + 1) - chunk_at(n, k, sc));
        t += piece_data_bytes(c, chunk_at(n, k, ac + 1) - chunk_at(n, k, ac));
    }
    return t;
}

/* ---- pieces ---- */

int cm_coll_piece_parse(const uint8_t *p, size_t n, cm_coll_piece *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n < CM_COLL_HDR_BYTES) return cm_errf(err, errlen, CM_EFORMAT, "all-reduce piece of %zu bytes is truncated", n);
    out->epoch = get_u64(p);
    out->op_id = get_u64(p + 8);
    out->layer = get_u16(p + 16);
    out->point = p[18];
    out->step = p[19];
    out->elem_offset = get_u32(p + 20);
    out->n = get_u32(p + 24);
    if ((out->point & ~CM_COLL_POINT_Q8) > CM_COLL_POINT_GATHER ||
        out->point == (CM_COLL_POINT_GATHER | CM_COLL_POINT_Q8))
        return cm_errf(err, errlen, CM_EFORMAT, "all-reduce piece has point %u", out->point);
    if (out->n < 1 || out->elem_offset > UINT32_MAX - out->n)
        return cm_errf(err, errlen, CM_EFORMAT, "all-reduce piece has %u elements at %u", out->n, out->elem_offset);
    uint64_t want = (out->point & CM_COLL_POINT_Q8) ? (uint64_t)q8_bytes(out->n) : (uint64_t)out->n * 4;
    if (want != n - CM_COLL_HDR_BYTES)
        return cm_errf(err, errlen, CM_EFORMAT, "all-reduce piece of %u elements carries %zu bytes, expected %llu",
                       out->n, n - CM_COLL_HDR_BYTES, (unsigned long long)want);
    out->data = p + CM_COLL_HDR_BYTES;
    out->data_len = n - CM_COLL_HDR_BYTES;
    return 0;
}

int cm_coll_peer_fail(cm_coll *c, int peer, int rc, const char *what, const char *detail) {
    c->failed = true;
    snprintf(c->err, sizeof c->err, "all-reduce op %llu: %s member %d (%s): %s", (unsigned long long)c->op_id, what,
             peer, cm_conn_peer(c->cfg.peers[peer]), detail);
    return rc;
}

static void count(cm_coll_link_stats *l, bool sent, size_t payload, size_t data, cm_conn *conn) {
    uint64_t wire = CM_FRAME_HDR + payload + (cm_conn_mode(conn) != CM_SEC_INSECURE ? CM_FRAME_MAC : 0);
    if (sent) {
        l->msgs_sent++;
        l->wire_sent += wire;
        l->data_sent += data;
    } else {
        l->msgs_recv++;
        l->wire_recv += wire;
        l->data_recv += data;
    }
}

/* Little-endian f32 runs: a plain copy where the host is little-endian
 * (every machine cumulo runs on so far; CM_COLL_LE, coll_impl.h), byte by
 * byte elsewhere. */
static void put_f32s(uint8_t *p, const float *x, int64_t m) {
    if (CM_COLL_LE) memcpy(p, x, (size_t)m * 4);
    else
        for (int64_t i = 0; i < m; i++) put_f32(p + 4 * i, x[i]);
}
/* dst[i] = v_i, or dst[i] = v_i + dst[i] (the bits of the order the callers
 * name: IEEE addition commutes) */
static void get_f32s(const uint8_t *p, float *dst, int64_t m, bool add) {
    if (CM_COLL_LE && !add) {
        memcpy(dst, p, (size_t)m * 4);
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        float v;
        if (CM_COLL_LE) memcpy(&v, p + 4 * i, 4);
        else v = get_f32(p + 4 * i);
        dst[i] = add ? v + dst[i] : v;
    }
}

/* Send x[off, off+m) (or, when q is given, its Q8_0 blocks q) to peer,
 * written straight into the connection's frame buffer (no staging copy). */
/* A piece's header at p (collective.h's wire layout). */
void cm_coll_put_hdr(const cm_coll *c, uint8_t *p, int step, int64_t off, int64_t m, bool q8) {
    put_u64(p, c->cfg.epoch);
    put_u64(p + 8, c->op_id);
    put_u16(p + 16, (uint16_t)(c->op_id / 2));
    p[18] = (uint8_t)(c->gathering ? CM_COLL_POINT_GATHER : (c->op_id % 2) | (q8 ? CM_COLL_POINT_Q8 : 0));
    p[19] = (uint8_t)step;
    put_u32(p + 20, (uint32_t)off);
    put_u32(p + 24, (uint32_t)m);
}

static int send_piece(cm_coll *c, int peer, int step, int64_t off, int64_t m, const float *x, const uint8_t *q) {
    size_t data = q ? q8_bytes(m) : (size_t)m * 4;
    uint8_t *p = cm_conn_tx_payload(c->cfg.peers[peer], CM_COLL_HDR_BYTES + data);
    if (!p) return cm_coll_peer_fail(c, peer, CM_ENOMEM, "sending to", "out of memory for a frame");
    cm_coll_put_hdr(c, p, step, off, m, q != NULL);
    if (q) memcpy(p + CM_COLL_HDR_BYTES, q, data);
    else put_f32s(p + CM_COLL_HDR_BYTES, x + off, m);
    char e[256];
    uint64_t t0 = cm_now_ns();
    int rc =
        cm_conn_send_tx(c->cfg.peers[peer], CM_MSG_ALLREDUCE, CM_COLL_HDR_BYTES + data, c->timeout_ms, e, sizeof e);
    c->st.send_s += (double)(cm_now_ns() - t0) * 1e-9;
    if (rc) return cm_coll_peer_fail(c, peer, rc, "sending to", e);
    count(&c->st.link[peer], true, CM_COLL_HDR_BYTES + data, data, c->cfg.peers[peer]);
    return 0;
}

enum { PUT_STORE, PUT_ADD };

/* Receive the piece (step, off, m) from peer; store or add it into dst[off..];
 * with qkeep, also keep its Q8_0 blocks at qkeep (all-gather forwarding). */
static int recv_piece(cm_coll *c, int peer, int step, int64_t off, int64_t m, float *dst, int how, uint8_t *qkeep) {
    unsigned type = 0;
    const uint8_t *pl = NULL;
    size_t len = 0;
    char e[256];
    uint64_t t0 = cm_now_ns();
    int rc = cm_conn_recv_payload(c->cfg.peers[peer], &type, &pl, &len, c->timeout_ms, e, sizeof e);
    c->st.wait_s += (double)(cm_now_ns() - t0) * 1e-9;
    if (rc) return cm_coll_peer_fail(c, peer, rc, "receiving from", e);
    if (type != CM_MSG_ALLREDUCE) {
        snprintf(e, sizeof e, "expected ALLREDUCE, got %s", cm_msg_type_name(type));
        return cm_coll_peer_fail(c, peer, CM_EPROTO, "from", e);
    }
    cm_coll_piece pc;
    if ((rc = cm_coll_check_piece(c, peer, pl, len, step, off, m, &pc))) return rc;
    bool q8 = (pc.point & CM_COLL_POINT_Q8) != 0;
    if (q8) {
        if (qkeep) memcpy(qkeep, pc.data, pc.data_len);
        q8_dequantize(pc.data, m, dst + off, how == PUT_ADD);
    } else get_f32s(pc.data, dst + off, m, how == PUT_ADD);
    count(&c->st.link[peer], false, len, pc.data_len, c->cfg.peers[peer]);
    return 0;
}

/* Parse the piece (step, off, m) from peer at pl and check it is the one due. */
int cm_coll_check_piece(cm_coll *c, int peer, const uint8_t *pl, size_t len, int step, int64_t off, int64_t m,
                        cm_coll_piece *out) {
    char e[256];
    cm_coll_piece pc;
    if (cm_coll_piece_parse(pl, len, &pc, e, sizeof e)) return cm_coll_peer_fail(c, peer, CM_EPROTO, "from", e);
    bool q8 = (pc.point & CM_COLL_POINT_Q8) != 0;
    /* A gather piece where a partial sum is due, or the reverse, is out of
     * sequence like any other (a gather never travels as Q8_0). */
    if (pc.epoch != c->cfg.epoch || pc.op_id != c->op_id || pc.step != step || pc.elem_offset != (uint64_t)off ||
        pc.n != (uint64_t)m || q8 != (c->cfg.compress && !c->gathering) ||
        (pc.point == CM_COLL_POINT_GATHER) != c->gathering) {
        snprintf(e, sizeof e,
                 "piece out of sequence: epoch %llu op %llu step %u elements [%u, +%u)%s, expected epoch %llu op "
                 "%llu step %d elements [%lld, +%lld)%s",
                 (unsigned long long)pc.epoch, (unsigned long long)pc.op_id, pc.step, pc.elem_offset, pc.n,
                 q8 ? " q8" : "", (unsigned long long)c->cfg.epoch, (unsigned long long)c->op_id, step, (long long)off,
                 (long long)m, c->cfg.compress ? " q8" : "");
        return cm_coll_peer_fail(c, peer, CM_EPROTO, "from", e);
    }
    *out = pc;
    return 0;
}

/* ---- direct exchange ---- */

static int allreduce_direct(cm_coll *c, float *x, int64_t n) {
    int k = c->cfg.size, r = c->cfg.rank;
    int64_t mx = c->cfg.max_n;
    for (int64_t off = 0; off < n; off += CM_COLL_PIECE_FLOATS) {
        int64_t m = n - off < CM_COLL_PIECE_FLOATS ? n - off : CM_COLL_PIECE_FLOATS;
        const uint8_t *q = NULL;
        float *own = x;
        if (c->cfg.compress) { /* everyone sums the same dequantized values, own included */
            q8_quantize(x + off, m, c->qall);
            q = c->qall;
            q8_dequantize(q, m, c->tmp + off, false);
            own = c->tmp;
        }
        /* Send to everyone before waiting for anyone: the peers' pieces are
         * in flight while we send; rank+1 first spreads the load. */
        for (int i = 1; i < k; i++) {
            int p = (r + i) % k;
            int rc = send_piece(c, p, 0, off, m, x, q);
            if (rc) return rc;
        }
        for (int i = 1; i < k; i++) {
            int p = (r - i + k) % k;
            int rc = recv_piece(c, p, 0, off, m, c->part + (size_t)p * (size_t)mx, PUT_STORE, NULL);
            if (rc) return rc;
        }
        /* The fixed order: ((p0 + p1) + p2) + ... (src[r] is our own
         * partial, which may be x itself: each element is read before it is
         * written) */
        const float *src[CM_COLL_MAX_MEMBERS];
        for (int j = 0; j < k; j++) src[j] = j == r ? own : c->part + (size_t)j * (size_t)mx;
        if (k == 2) { /* the common pair, in a loop the compiler vectorizes */
            const float *a = src[0] + off, *b = src[1] + off;
            float *y = x + off;
            for (int64_t i = 0; i < m; i++) y[i] = a[i] + b[i];
        } else
            for (int64_t i = off; i < off + m; i++) {
                float s = src[0][i];
                for (int j = 1; j < k; j++) s += src[j][i];
                x[i] = s;
            }
    }
    return 0;
}

/* ---- ring ---- */

/* One ring step: send chunk sc of x (or its blocks in qall) to rank+1 while
 * receiving chunk rc from rank-1, piece by piece, interleaved so that at most
 * two pieces wait on any connection. */
static int ring_step(cm_coll *c, int step, int sc, int rcv, float *x, int64_t n, int how, bool send_q) {
    int k = c->cfg.size, r = c->cfg.rank, next = (r + 1) % k, prev = (r + k - 1) % k;
    int64_t s0 = chunk_at(n, k, sc), s1 = chunk_at(n, k, sc + 1);
    int64_t r0 = chunk_at(n, k, rcv), r1 = chunk_at(n, k, rcv + 1);
    int64_t so = s0, ro = r0;
    while (so < s1 || ro < r1) {
        if (so < s1) {
            int64_t m = s1 - so < CM_COLL_PIECE_FLOATS ? s1 - so : CM_COLL_PIECE_FLOATS;
            const uint8_t *q = NULL;
            if (c->cfg.compress) {
                uint8_t *qp = c->qall + (size_t)(so / CM_COLL_QK) * Q8_BYTES;
                if (!send_q) q8_quantize(x + so, m, qp); /* a running sum: quantize it now */
                q = qp;
            }
            int rc = send_piece(c, next, step, so, m, x, q);
            if (rc) return rc;
            so += m;
        }
        if (ro < r1) {
            int64_t m = r1 - ro < CM_COLL_PIECE_FLOATS ? r1 - ro : CM_COLL_PIECE_FLOATS;
            uint8_t *keep = c->cfg.compress && how == PUT_STORE ? c->qall + (size_t)(ro / CM_COLL_QK) * Q8_BYTES : NULL;
            int rc = recv_piece(c, prev, step, ro, m, x, how, keep);
            if (rc) return rc;
            ro += m;
        }
    }
    return 0;
}

static int allreduce_ring(cm_coll *c, float *x, int64_t n) {
    int k = c->cfg.size, r = c->cfg.rank;
    /* Reduce-scatter: at step s send the running sum of chunk r-s, add our
     * part to chunk r-s-1 from rank-1 (recv + own: addition commutes, so the
     * bits are those of running + own). */
    for (int s = 0; s < k - 1; s++) {
        int rc = ring_step(c, s, ((r - s) % k + k) % k, ((r - s - 1) % k + k) % k, x, n, PUT_ADD, false);
        if (rc) return rc;
    }
    /* We own chunk r+1. With compression the owner keeps what it sends. */
    int own = (r + 1) % k;
    if (c->cfg.compress) {
        int64_t a = chunk_at(n, k, own), b = chunk_at(n, k, own + 1);
        uint8_t *qp = c->qall + (size_t)(a / CM_COLL_QK) * Q8_BYTES;
        for (int64_t o = a; o < b; o += CM_COLL_PIECE_FLOATS) {
            int64_t m = b - o < CM_COLL_PIECE_FLOATS ? b - o : CM_COLL_PIECE_FLOATS;
            uint8_t *q = qp + (size_t)((o - a) / CM_COLL_QK) * Q8_BYTES;
            q8_quantize(x + o, m, q);
            q8_dequantize(q, m, x + o, false);
        }
    }
    /* All-gather: forward finished chunks unchanged (blocks byte for byte). */
    for (int s = 0; s < k - 1; s++) {
        int rc = ring_step(c, k - 1 + s, ((r + 1 - s) % k + k) % k, ((r - s) % k + k) % k, x, n, PUT_STORE, true);
        if (rc) return rc;
    }
    return 0;
}

/* ---- expert gather ---- */

static void sum_links(cm_coll *c) {
    memset(&c->st.total, 0, sizeof c->st.total);
    for (int p = 0; p < c->cfg.size; p++) {
        const cm_coll_link_stats *l = &c->st.link[p];
        c->st.total.msgs_sent += l->msgs_sent;
        c->st.total.msgs_recv += l->msgs_recv;
        c->st.total.wire_sent += l->wire_sent;
        c->st.total.wire_recv += l->wire_recv;
        c->st.total.data_sent += l->data_sent;
        c->st.total.data_recv += l->data_recv;
    }
}

/* Cipher time so far on every link of this member (sealing, opening). */
static void cipher_ns(const cm_coll *c, uint64_t *seal, uint64_t *open) {
    *seal = *open = 0;
    for (int p = 0; p < c->cfg.size; p++) {
        if (p == c->cfg.rank) continue;
        uint64_t s, o;
        cm_conn_cipher_ns(c->cfg.peers[p], &s, &o);
        *seal += s;
        *open += o;
    }
}

int cm_coll_allreduce(cm_coll *c, float *x, int64_t n, char *err, size_t errlen) {
    if (c->failed) return cm_errf(err, errlen, CM_ESTATE, "all-reduce failed before: %s", c->err);
    if (n < 1 || n > c->cfg.max_n) {
        snprintf(c->err, sizeof c->err, "all-reduce of %lld elements (at most %lld)", (long long)n,
                 (long long)c->cfg.max_n);
        return cm_errf(err, errlen, CM_ERANGE, "%s", c->err);
    }
    uint64_t seal0, open0;
    cipher_ns(c, &seal0, &open0);
    uint64_t t0 = cm_now_ns(), cpu0 = c->trace ? thread_cpu_ns() : 0;
    if (c->last_end_ns) c->st.gap_s += (double)(t0 - c->last_end_ns) * 1e-9;
    if (c->trace && c->last_end_ns && n > CM_COLL_SMALL_N) {
        c->big_gap_cpu_ns += cpu0 - c->last_end_cpu_ns;
        c->big_gap_wall_ns += t0 - c->last_end_ns;
    } else if (c->trace && c->last_end_ns) {
        c->small_gap_cpu_ns += cpu0 - c->last_end_cpu_ns;
        c->small_gap_wall_ns += t0 - c->last_end_ns;
    }
    double wait0 = c->st.wait_s;
    int rc = 0;
    bool ring = cm_coll_uses_ring(c, n);
    bool nat = c->nat != NULL;
    if (nat) {
        rc = c->nat->allreduce(c->ngrp, x, n, c->timeout_ms, c->err, sizeof c->err);
        if (rc) c->failed = true;
    } else if (c->cfg.size > 1 && !(rc = cm_coll_shm_setup(c))) {
        if (c->shm) ring = false, rc = cm_coll_allreduce_shm(c, x, n); /* every size: no ring between two */
        else rc = ring ? allreduce_ring(c, x, n) : allreduce_direct(c, x, n);
    }
    c->last_end_ns = cm_now_ns();
    if (c->trace) {
        c->last_end_cpu_ns = thread_cpu_ns();
        if (n > CM_COLL_SMALL_N) c->big_cpu_ns += c->last_end_cpu_ns - cpu0;
        else c->small_cpu_ns += c->last_end_cpu_ns - cpu0;
    }
    c->st.busy_s += (double)(c->last_end_ns - t0) * 1e-9;
    if (rc) return cm_errf(err, errlen, rc, "%s", c->err);
    if (n <= CM_COLL_SMALL_N) {
        c->st.small_ops++;
        c->st.small_busy_s += (double)(c->last_end_ns - t0) * 1e-9;
        c->st.small_wait_s += c->st.wait_s - wait0;
    }
    uint64_t seal1, open1;
    cipher_ns(c, &seal1, &open1);
    c->seal_ns[n > CM_COLL_SMALL_N] += seal1 - seal0;
    c->open_ns[n > CM_COLL_SMALL_N] += open1 - open0;
    c->op_id++;
    c->st.ops++;
    c->st.elems += (uint64_t)n;
    if (nat) c->st.native_ops++;
    else if (ring) c->st.ring_ops++;
    else c->st.direct_ops++;
    sum_links(c);
    return 0;
}

/* ---- expert gather (expert parallelism) ---- */

static int64_t n_pieces(int64_t len) { return (len + CM_COLL_PIECE_FLOATS - 1) / CM_COLL_PIECE_FLOATS; }

/* Round i: our piece i to every peer (rank+1 first), then piece i of every
 * peer that has one: at most one piece waits on a connection each way.
 * root >= 0: only root receives (the others send to it alone). */
static int allgather_rounds(cm_coll *c, float *x, const int64_t *part, int root) {
    int k = c->cfg.size, r = c->cfg.rank;
    int64_t rounds = 0;
    for (int j = 0; j < k; j++) rounds = CM_MAX(rounds, n_pieces(part[j + 1] - part[j]));
    for (int64_t i = 0; i < rounds; i++) {
        int64_t off = part[r] + i * CM_COLL_PIECE_FLOATS;
        if (off < part[r + 1] && r != root) {
            int64_t m = CM_MIN(part[r + 1] - off, (int64_t)CM_COLL_PIECE_FLOATS);
            for (int d = 1; d < k; d++) {
                int to = (r + d) % k;
                if (root >= 0 && to != root) continue;
                int rc = send_piece(c, to, 0, off, m, x, NULL);
                if (rc) return rc;
            }
        }
        for (int d = 1; d < k && (root < 0 || r == root); d++) {
            int p = (r - d + k) % k;
            int64_t po = part[p] + i * CM_COLL_PIECE_FLOATS;
            if (po >= part[p + 1]) continue;
            int64_t m = CM_MIN(part[p + 1] - po, (int64_t)CM_COLL_PIECE_FLOATS);
            int rc = recv_piece(c, p, 0, po, m, x, PUT_STORE, NULL);
            if (rc) return rc;
        }
    }
    return 0;
}

static int gather_op(cm_coll *c, float *x, const int64_t *part, int root, char *err, size_t errlen) {
    if (c->failed) return cm_errf(err, errlen, CM_ESTATE, "all-reduce failed before: %s", c->err);
    int k = c->cfg.size;
    bool ok = part[0] == 0 && part[k] <= (int64_t)UINT32_MAX;
    for (int j = 0; j < k && ok; j++) ok = part[j] <= part[j + 1];
    if (!ok) {
        snprintf(c->err, sizeof c->err, "expert gather with parts out of order (end %lld)", (long long)part[k]);
        return cm_errf(err, errlen, CM_ERANGE, "%s", c->err);
    }
    uint64_t seal0, open0, seal1, open1;
    cipher_ns(c, &seal0, &open0);
    double wait0 = c->st.wait_s;
    uint64_t t0 = cm_now_ns();
    int rc = k > 1 && !c->nat ? cm_coll_shm_setup(c) : 0;
    c->gathering = true;
    if (!rc && k > 1) rc = c->shm ? cm_coll_gather_shm(c, x, part, root) : allgather_rounds(c, x, part, root);
    c->gathering = false;
    double busy = (double)(cm_now_ns() - t0) * 1e-9;
    c->st.busy_s += busy;
    c->gather_busy_s += busy;
    c->gather_wait_s += c->st.wait_s - wait0;
    cipher_ns(c, &seal1, &open1);
    c->seal_ns[2] += seal1 - seal0;
    c->open_ns[2] += open1 - open0;
    if (rc) return cm_errf(err, errlen, rc, "%s", c->err);
    c->op_id++;
    c->st.ops++;
    c->st.elems += (uint64_t)part[k];
    uint64_t before = c->st.total.data_sent, before_wire = c->st.total.wire_sent;
    sum_links(c);
    if (root < 0) {
        c->st.gather_ops++;
        c->st.gather_data_sent += c->st.total.data_sent - before;
    } else {
        c->st.head_ops++;
        c->st.head_data_sent += c->st.total.data_sent - before;
        c->st.head_wire_sent += c->st.total.wire_sent - before_wire;
    }
    return 0;
}

int cm_coll_allgather(cm_coll *c, float *x, const int64_t *part, char *err, size_t errlen) {
    return gather_op(c, x, part, -1, err, errlen);
}

int cm_coll_gather(cm_coll *c, float *x, const int64_t *part, int root, char *err, size_t errlen) {
    if (root < 0 || root >= c->cfg.size)
        return cm_errf(err, errlen, CM_EINVAL, "gather to member %d of %d", root, c->cfg.size);
    return gather_op(c, x, part, root, err, errlen);
}

int cm_coll_allreduce_cb(void *user, float *x, int64_t n) {
    cm_coll *c = user;
    return cm_coll_allreduce(c, x, n, NULL, 0);
}

/* ---- mesh ---- */

int cm_coll_mesh_open(int rank, int size, cm_listener *l, const char *const *addrs, const cm_net_cfg *cfg,
                      const cm_msg_hello *mine, int timeout_ms, cm_conn **conns, char *err, size_t errlen) {
    if (size < 1 || size > CM_COLL_MAX_MEMBERS || rank < 0 || rank >= size)
        return cm_errf(err, errlen, CM_EINVAL, "tensor-parallel rank %d of %d is out of range", rank, size);
    for (int i = 0; i < size; i++) conns[i] = NULL;
    char e[384];
    int rc = 0;
    for (int j = 0; j < rank && !rc; j++) { /* lower ranks: we connect */
        char host[256];
        uint16_t port;
        if ((rc = cm_net_parse_addr(addrs[j], CM_NET_DEFAULT_PORT, host, sizeof host, &port, e, sizeof e)) ||
            (rc = cm_net_connect(host, port, timeout_ms, &conns[j], e, sizeof e)) ||
            (rc = cm_conn_handshake(conns[j], true, cfg, mine, NULL, e, sizeof e))) {
            cm_errf(err, errlen, rc, "tensor-parallel member %d: cannot reach member %d at '%s': %s", rank, j, addrs[j],
                    e);
            break;
        }
        if ((rc = cm_coll_mesh_greet(conns[j], rank, timeout_ms, e, sizeof e)))
            cm_errf(err, errlen, rc, "tensor-parallel member %d: cannot greet member %d at '%s': %s", rank, j, addrs[j],
                    e);
    }
    for (int got = 0; got < size - 1 - rank && !rc; got++) { /* higher ranks: they connect */
        cm_conn *c = NULL;
        cm_msg m;
        if ((rc = cm_listener_accept(l, timeout_ms, &c, e, sizeof e)) ||
            (rc = cm_conn_handshake(c, false, cfg, mine, NULL, e, sizeof e)) ||
            (rc = cm_conn_recv(c, &m, timeout_ms, e, sizeof e))) {
            cm_errf(err, errlen, rc, "tensor-parallel member %d: waiting for %d higher member(s): %s", rank,
                    size - 1 - rank - got, e);
            cm_conn_close(c, "mesh set-up failed");
            break;
        }
        int j = cm_coll_mesh_rank_of(&m);
        if (j <= rank || j >= size || conns[j]) {
            rc = cm_errf(err, errlen, CM_EPROTO, "tensor-parallel member %d: peer %s did not give a valid rank", rank,
                         cm_conn_peer(c));
            cm_conn_close(c, "bad rank");
            break;
        }
        conns[j] = c;
    }
    if (rc) cm_coll_mesh_close(conns, size);
    return rc;
}

int cm_coll_mesh_greet(cm_conn *c, int rank, int timeout_ms, char *err, size_t errlen) {
    cm_msg m = {.type = CM_MSG_PING};
    m.u.ping.id = CM_COLL_MESH_ID + (uint64_t)rank;
    return cm_conn_send(c, &m, timeout_ms, err, errlen);
}

int cm_coll_mesh_rank_of(const cm_msg *m) {
    if (m->type != CM_MSG_PING || m->u.ping.data_len || m->u.ping.id < CM_COLL_MESH_ID ||
        m->u.ping.id - CM_COLL_MESH_ID >= CM_COLL_MAX_MEMBERS)
        return -1;
    return (int)(m->u.ping.id - CM_COLL_MESH_ID);
}

void cm_coll_mesh_close(cm_conn **conns, int size) {
    for (int i = 0; i < size; i++) {
        cm_conn_close(conns[i], "tensor-parallel group closed");
        conns[i] = NULL;
    }
}
