/*
 * probe.c: finding nodes (mDNS browse for _cumulo._tcp) and measuring them
 * from this machine (handshake, HELLO, RTT and bandwidth), for `cumulo nodes`
 * and `--nodes auto`; and node to node links: a node asked with LINKS_REQ
 * dials the peers named and measures them the same way (every wait bounded
 * by the request's deadline, so a dead peer costs at most that). It only
 * connects and pings; it assigns nothing.
 */
#include "cluster/cluster_int.h"
#include "cluster/mdns.h"

#include "os/os.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

int cm_discover(double timeout_s, char addrs[][80], int max, char *err, size_t errlen) {
    cm_mdns *m;
    int rc = cm_mdns_open(&m, NULL, err, errlen);
    if (rc) return rc;
    if ((rc = cm_mdns_browse(m, NULL, NULL))) {
        cm_mdns_close(m);
        return cm_errf(err, errlen, rc, "mDNS browse failed");
    }
    double end = cm_now_s() + timeout_s;
    while (cm_now_s() < end) {
        double left = end - cm_now_s();
        rc = cm_mdns_step(m, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (rc) break;
    }
    int n = 0;
    size_t k = cm_mdns_instance_count(m);
    for (size_t i = 0; i < k && n < max; i++) {
        const cm_mdns_instance *in = cm_mdns_instance_at(m, i);
        if (!in->addr[0] || !in->port) continue;
        char a[80];
        snprintf(a, sizeof a, strchr(in->addr, ':') ? "[%s]:%u" : "%s:%u", in->addr, in->port);
        bool dup = false;
        for (int j = 0; j < n; j++) dup |= !strcmp(addrs[j], a);
        if (!dup) snprintf(addrs[n++], 80, "%s", a);
    }
    cm_mdns_close(m);
    return rc < 0 ? rc : n;
}

static void probe_links(cm_conn **conns, int n, cm_node_info *out);

/* Measure one dialled node (c NULL when its dial failed with rc, e) into o;
 * the connection goes to *keep when keep is not NULL, else it is closed. */
static void probe_one(cm_node_info *o, const char *addr, cm_conn *c, const cm_msg_hello *peer, int rc, const char *e,
                      cm_conn **keep) {
    memset(o, 0, sizeof *o);
    snprintf(o->addr, sizeof o->addr, "%s", addr);
    snprintf(o->error, sizeof o->error, "%s", e);
    if (!rc) {
        rc = cm_cluster_measure(c, CM_LINKS_PROBE_BYTES, &o->rtt_s, &o->bw, o->error, sizeof o->error);
        if (!rc && keep) *keep = c;
        else cm_conn_close(c, "probe done");
    }
    o->status = rc;
    if (rc) return;
    snprintf(o->name, sizeof o->name, "%s", peer->name);
    snprintf(o->host, sizeof o->host, "%s", peer->host);
    if (peer->lease_epoch) cm_lease_text(peer, o->serves, sizeof o->serves);
    o->caps.cores = (int)peer->cores;
    snprintf(o->caps.isa, sizeof o->caps.isa, "%s", peer->isa);
    o->caps.mem_total = peer->mem_total;
    o->caps.mem_free = peer->mem_free;
    snprintf(o->caps.os, sizeof o->caps.os, "%s", peer->os);
    snprintf(o->caps.arch, sizeof o->caps.arch, "%s", peer->arch);
    snprintf(o->caps.version, sizeof o->caps.version, "%s", peer->version);
    o->caps.gflops = peer->gflops;
    o->caps.mem_bw = peer->mem_gbs * 1e9;
    if (peer->has_gpu) { /* issue 16 */
        snprintf(o->caps.gpu_name, sizeof o->caps.gpu_name, "%s", peer->gpu_name);
        o->caps.gpu_mem = peer->gpu_mem;
        o->caps.gpu_bw = peer->gpu_gbs * 1e9;
        o->caps.gpu_flops = peer->gpu_gflops * 1e9;
        o->caps.gpu_layers = (int)peer->gpu_layers;
    }
}

int cm_probe_nodes(const char *const *addrs, int n, bool insecure, const char *key_file, cm_node_info *out, char *err,
                   size_t errlen) {
    cm_net_cfg cfg;
    int rc = cm_cluster_net_cfg(&cfg, insecure, key_file, err, errlen);
    if (rc) return rc;
    cm_msg_hello me;
    cm_cluster_hello(&me, NULL, 0, 0);
    /* kept open for the node to node measurement */
    cm_conn *conns[CM_NODE_LINKS_MAX] = {0};
    bool links = n <= CM_NODE_LINKS_MAX;
    /* Handshakes all at once (dead or fake addresses cost one deadline in
     * all), then the measurements one at a time (links measured together
     * would share this machine's bandwidth). */
    for (int at = 0; at < n; at += CM_CLUSTER_DIAL_MAX) {
        int k = n - at < CM_CLUSTER_DIAL_MAX ? n - at : CM_CLUSTER_DIAL_MAX;
        char(*a)[80] = cm_calloc((size_t)k, sizeof *a);
        char(*es)[400] = cm_calloc((size_t)k, sizeof *es);
        cm_conn **cs = cm_calloc((size_t)k, sizeof *cs);
        cm_msg_hello *peers = cm_calloc((size_t)k, sizeof *peers);
        int *rcs = cm_calloc((size_t)k, sizeof *rcs);
        rc = a && es && cs && peers && rcs ? 0 : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        if (!rc) {
            for (int i = 0; i < k; i++) snprintf(a[i], sizeof a[i], "%s", addrs[at + i]);
            cm_cluster_dial_many((const char(*)[80])a, k, &cfg, &me, cs, peers, rcs, es);
            for (int i = 0; i < k; i++)
                probe_one(&out[at + i], addrs[at + i], cs[i], &peers[i], rcs[i], es[i], links ? &conns[at + i] : NULL);
        }
        cm_free(a);
        cm_free(es);
        cm_free(cs);
        cm_free(peers);
        cm_free(rcs);
        if (rc) {
            for (int i = 0; i < n && links; i++) cm_conn_close(conns[i], NULL);
            return rc;
        }
    }
    if (links) {
        probe_links(conns, n, out);
        for (int i = 0; i < n; i++)
            if (conns[i]) cm_conn_close(conns[i], "probe done");
    }
    return 0;
}

/* ---- node to node links (LINKS_REQ / LINKS) ---- */

void cm_cluster_links_measure(const cm_net_cfg *cfg, const cm_msg_hello *mine, const cm_msg_links_req *q,
                              cm_msg_links *out) {
    memset(out, 0, sizeof *out);
    out->id = q->id;
    out->n = q->n_peers <= CM_MSG_MAX_PEERS ? q->n_peers : CM_MSG_MAX_PEERS;
    uint64_t end = cm_now_ns() + (uint64_t)q->deadline_ms * 1000000ull;
    for (int i = 0; i < out->n; i++) {
        cm_msg_link *l = &out->link[i];
        memcpy(l->addr, q->peers[i], sizeof l->addr);
        uint64_t now = cm_now_ns();
        /* One peer after the other (measuring them at once would make them
         * share this node's link and CPU). A dead peer stalls in the connect
         * or the handshake: those get this peer's share of what is left (at
         * least 500 ms), so it cannot starve the peers after it; the
         * measurement itself may use all that is left. */
        int left = now < end ? (int)((end - now) / 1000000ull) : 0;
        int share = left / (out->n - i);
        if (share < 500) share = left < 500 ? left : 500;
        char e[300];
        cm_conn *c = NULL;
        cm_msg_hello peer;
        double rtt = 0, bw = 0;
        int rc = share < 1 ? cm_errf(e, sizeof e, CM_ETIMEDOUT, "no time left")
                           : cm_cluster_dial_within(q->peers[i], cfg, mine, share, &c, &peer, e, sizeof e);
        if (!rc) {
            now = cm_now_ns();
            left = now < end ? (int)((end - now) / 1000000ull) : 0;
            rc = left < 1 ? cm_errf(e, sizeof e, CM_ETIMEDOUT, "no time left")
                          : cm_cluster_measure_within(c, (int)q->probe_bytes, left, &rtt, &bw, e, sizeof e);
        }
        if (c) cm_conn_close(c, rc ? NULL : "link measured");
        l->status = rc < 0 ? rc : rc ? CM_EIO : 0;
        l->rtt_s = rc ? 0 : (float)rtt;
        l->bw = rc ? 0 : (float)bw;
        if (rc) CM_LOGW("link to %s not measured: %s", q->peers[i], e);
        else CM_LOGI("link to %s ('%s'): rtt %.3f ms, %.1f MB/s", q->peers[i], peer.name, rtt * 1e3, bw / 1e6);
    }
}

int cm_cluster_links_ask(cm_conn *c, const char *const *peers, int n, int deadline_ms, int probe_bytes,
                         cm_msg_links *out, char *err, size_t errlen) {
    static _Atomic uint64_t next_id = 1;
    if (n < 1 || n > (int)CM_MSG_MAX_PEERS)
        return cm_errf(err, errlen, CM_EINVAL, "%d peers to measure (1..%u)", n, CM_MSG_MAX_PEERS);
    cm_msg m = {.type = CM_MSG_LINKS_REQ};
    cm_msg_links_req *q = &m.u.links_req;
    q->id = atomic_fetch_add(&next_id, 1);
    q->deadline_ms = (uint32_t)deadline_ms;
    q->probe_bytes = (uint32_t)probe_bytes;
    q->n_peers = (uint8_t)n;
    for (int i = 0; i < n; i++) snprintf(q->peers[i], sizeof q->peers[i], "%.63s", peers[i]);
    int rc = cm_conn_send(c, &m, 5000, err, errlen);
    if (rc) return rc;
    /* The node answers within deadline_ms; the margin covers the answer's
     * trip and a busy node. */
    uint64_t end = cm_now_ns() + (uint64_t)(deadline_ms + 2000) * 1000000ull;
    for (;;) {
        uint64_t now = cm_now_ns();
        if (now >= end) return cm_errf(err, errlen, CM_ETIMEDOUT, "no LINKS answer within %d ms", deadline_ms + 2000);
        cm_msg r;
        rc = cm_conn_recv(c, &r, (int)((end - now) / 1000000ull) + 1, err, errlen);
        if (rc) return rc;
        if (r.type == CM_MSG_ERROR) return cm_errf(err, errlen, r.u.error.code, "%s", r.u.error.text);
        if (r.type != CM_MSG_LINKS || r.u.links.id != q->id) continue; /* a heartbeat echo, a late answer */
        if (r.u.links.n != n)
            return cm_errf(err, errlen, CM_EPROTO, "LINKS with %u entries for %d peers", r.u.links.n, n);
        *out = r.u.links;
        return 0;
    }
}

/* Every reachable node measures its links to the other reachable ones. */
static void probe_links(cm_conn **conns, int n, cm_node_info *out) {
    for (int i = 0; i < n; i++) {
        if (!conns[i]) continue;
        const char *peers[CM_NODE_LINKS_MAX];
        int idx[CM_NODE_LINKS_MAX], k = 0;
        for (int j = 0; j < n; j++)
            if (j != i && conns[j] && k < (int)CM_MSG_MAX_PEERS) {
                idx[k] = j;
                peers[k++] = out[j].addr;
            }
        if (!k) continue;
        cm_msg_links l;
        char e[300];
        int rc = cm_cluster_links_ask(conns[i], peers, k, CM_LINKS_DEADLINE_MS, CM_LINKS_PROBE_BYTES, &l, e, sizeof e);
        for (int t = 0; t < k; t++) {
            cm_node_link *nl = &out[i].links[idx[t]];
            nl->asked = true;
            nl->status = rc ? rc : l.link[t].status;
            nl->rtt_s = rc ? 0 : l.link[t].rtt_s;
            nl->bw = rc ? 0 : l.link[t].bw;
        }
        if (rc) CM_LOGW("node %s did not report its links: %s", out[i].addr, e);
    }
}
