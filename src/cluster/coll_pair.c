/*
 * coll_pair.c: a tensor-parallel pair on one host exchanging its pieces
 * through the shared-memory regions of coll_shm.h (collective.c's ops call
 * these once cm_coll_shm_setup found both members on IP loopback): the
 * all-reduce of any size, piece by piece, and the gathers. The bits are the
 * direct exchange's (p0 + p1); each piece keeps the wire header and its
 * check, as over the link.
 */
#include "cluster/coll_impl.h"

#include "base/base.h"
#include "os/os.h"

#include <stdio.h>
#include <string.h>

static bool ip_loopback(const cm_conn *conn) {
    char h[64];
    cm_conn_peer_host(conn, h, sizeof h);
    return !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strncmp(h, "::ffff:127.", 11);
}

/* At the first op: both members of a pair on IP loopback set up the regions
 * (the same test on both sides, so both take part in the exchange). */
int cm_coll_shm_setup(cm_coll *c) {
    if (c->shm_tried) return 0;
    c->shm_tried = true;
    int peer = 1 - c->cfg.rank;
    if (c->cfg.size != 2 || c->cfg.compress || c->nat || !CM_COLL_LE || !ip_loopback(c->cfg.peers[peer])) return 0;
    char e[384];
    int64_t cap = CM_MIN(c->cfg.max_n, (int64_t)CM_COLL_PIECE_FLOATS); /* larger ops stream through it */
    bool offer = !cm_config_get()->tp_shm_off && cap > 0;
    int rc = cm_coll_shm_open(c->cfg.peers[peer], c->cfg.epoch, c->op_id, cap, offer,
                              (uint64_t)cm_coll_link_spin_us(c->cfg.peers[peer]) * 1000u, c->timeout_ms, &c->shm, e,
                              sizeof e);
    if (rc) return cm_coll_peer_fail(c, peer, rc, "setting up shared memory with", e);
    return 0;
}

/* Elements per piece through the regions: a slot's capacity, at most a
 * link piece (64 KiB: a larger op streams through both slots, the peer
 * summing one piece while we write the next). */
static int64_t shm_piece(const cm_coll *c) { return CM_MIN(cm_coll_shm_cap(c->shm), (int64_t)CM_COLL_PIECE_FLOATS); }

/* Our piece (step, off, m) of src into our region's next slot. */
static int shm_send(cm_coll *c, int peer, int64_t off, int64_t m, const float *src) {
    int rc = 0;
    char e[384];
    uint64_t t0 = cm_now_ns();
    uint8_t *p = cm_coll_shm_tx_slot(c->shm, c->timeout_ms, &rc, e, sizeof e);
    if (!p) return cm_coll_peer_fail(c, peer, rc, "sending to", e);
    cm_coll_put_hdr(c, p, 0, off, m, false);
    memcpy(p + CM_COLL_HDR_BYTES, src + off, (size_t)m * 4);
    cm_coll_shm_tx_publish(c->shm);
    c->st.send_s += (double)(cm_now_ns() - t0) * 1e-9;
    cm_coll_link_stats *l = &c->st.link[peer];
    l->msgs_sent++;
    l->wire_sent += CM_COLL_HDR_BYTES + (uint64_t)m * 4;
    l->data_sent += (uint64_t)m * 4;
    return 0;
}

/* y[i] = y[i] + t[i] (p0 + p1 on rank 0) and y[i] = t[i] + y[i] (rank 1),
 * in runs of 16 that the compiler turns into vector adds (GCC's -O2 left the
 * plain loops scalar: a 163-token prompt's all-reduce summed 333k floats one
 * at a time); the same IEEE additions element by element, the same bits. */
static void add_own_first(float *restrict y, const float *restrict t, int64_t m) {
    int64_t i = 0;
    for (; i + 16 <= m; i += 16)
        for (int j = 0; j < 16; j++) y[i + j] = y[i + j] + t[i + j];
    for (; i < m; i++) y[i] = y[i] + t[i];
}
static void add_theirs_first(float *restrict y, const float *restrict t, int64_t m) {
    int64_t i = 0;
    for (; i + 16 <= m; i += 16)
        for (int j = 0; j < 16; j++) y[i + j] = t[i + j] + y[i + j];
    for (; i < m; i++) y[i] = t[i] + y[i];
}

/* The peer's piece (off, m) from its region: x[off..+m) = ours + theirs in
 * the fixed order p0 + p1 (add), or theirs (store). */
static int shm_recv(cm_coll *c, int peer, int64_t off, int64_t m, float *x, bool add) {
    int rc = 0;
    char e[384];
    uint64_t t0 = cm_now_ns();
    const uint8_t *q = cm_coll_shm_rx_slot(c->shm, c->timeout_ms, &rc, e, sizeof e);
    c->st.wait_s += (double)(cm_now_ns() - t0) * 1e-9;
    if (!q) return cm_coll_peer_fail(c, peer, rc, "receiving from", e);
    cm_coll_piece pc;
    if ((rc = cm_coll_check_piece(c, peer, q, CM_COLL_HDR_BYTES + (size_t)m * 4, 0, off, m, &pc))) return rc;
    /* the peer's elements read in place (aligned: coll_shm.h's slots start them on 64 bytes) */
    const float *theirs = (const float *)(const void *)pc.data;
    float *y = x + off;
    if (!add) memcpy(y, theirs, (size_t)m * 4);
    else if (c->cfg.rank == 0) add_own_first(y, theirs, m);
    else add_theirs_first(y, theirs, m);
    cm_coll_shm_rx_done(c->shm);
    cm_coll_link_stats *l = &c->st.link[peer];
    l->msgs_recv++;
    l->wire_recv += CM_COLL_HDR_BYTES + (uint64_t)m * 4;
    l->data_recv += (uint64_t)m * 4;
    return 0;
}

/* The direct exchange of a pair through the regions, any size: piece by
 * piece, ours then theirs (at most one piece ahead of the peer: two slots). */
int cm_coll_allreduce_shm(cm_coll *c, float *x, int64_t n) {
    int peer = 1 - c->cfg.rank;
    int64_t pm = shm_piece(c);
    for (int64_t off = 0; off < n; off += pm) {
        int64_t m = CM_MIN(n - off, pm);
        int rc = shm_send(c, peer, off, m, x);
        if (!rc) rc = shm_recv(c, peer, off, m, x, true);
        if (rc) return rc;
    }
    return 0;
}

/* A gather of a pair through the regions: our part's pieces to the peer
 * unless we are root, the peer's into x when we are root (root < 0: both). */
int cm_coll_gather_shm(cm_coll *c, float *x, const int64_t *part, int root) {
    int r = c->cfg.rank, peer = 1 - r;
    int64_t pm = shm_piece(c), mo = part[r], po = part[peer];
    bool send = r != root, recv = root < 0 || r == root;
    while ((send && mo < part[r + 1]) || (recv && po < part[peer + 1])) {
        if (send && mo < part[r + 1]) {
            int64_t m = CM_MIN(part[r + 1] - mo, pm);
            int rc = shm_send(c, peer, mo, m, x);
            if (rc) return rc;
            mo += m;
        }
        if (recv && po < part[peer + 1]) {
            int64_t m = CM_MIN(part[peer + 1] - po, pm);
            int rc = shm_recv(c, peer, po, m, x, false);
            if (rc) return rc;
            po += m;
        }
    }
    return 0;
}
