/*
 * coord_links.c: node to node links for the coordinator's plan. The
 * coordinator measures its own link to each node when it connects; the links
 * between nodes it cannot see, so it asks each node (LINKS_REQ) to dial the
 * other nodes and measure them the same way, and plans with the matrix.
 * Nodes are asked one after the other (measuring all at once would make the
 * probes share links and the CPU), each within CM_LINKS_DEADLINE_MS: a dead
 * or unreachable peer costs at most that per node, and planning goes on with
 * what was measured. It must never fail the pipe: a link not measured is
 * estimated (coord.c make_cluster) and shown as such.
 *
 * Later, with the receiver threads running, cm_coord_recheck_links asks
 * again (round trip only): on a recovery that no lost node explains, so that
 * a cut pair is marked unreachable and the planner keeps it apart
 * (cm_plan_cluster.down), and while idle, so that a healed link is used
 * again. A node that does not answer leaves its links as they were.
 */
#include "cluster/coord_impl.h"

#include <stdio.h>
#include <string.h>

void cm_coord_measure_links(cm_pipe *p) {
    if (p->n_remote < 2) return;
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        const char *peers[CM_PLAN_MAX_NODES];
        int k = 0;
        for (int j = 0; j < p->n_remote; j++)
            if (j != i && k < (int)CM_MSG_MAX_PEERS) peers[k++] = p->r[j].addr;
        cm_msg_links l;
        char e[300];
        double t0 = cm_now_s();
        int rc = cm_cluster_links_ask(r->ctl, peers, k, CM_LINKS_DEADLINE_MS, CM_LINKS_PROBE_BYTES, &l, e, sizeof e);
        r->n_links = 0;
        if (rc) {
            /* A late answer may still come: the receiver thread skips it. */
            cm_coord_log(p, "node %s ('%s') did not report its links: %s", r->addr, r->hello.name, e);
            continue;
        }
        for (int t = 0; t < k; t++) {
            snprintf(r->links[t].addr, sizeof r->links[t].addr, "%.79s", peers[t]);
            r->links[t].status = l.link[t].status;
            r->links[t].rtt = l.link[t].rtt_s;
            r->links[t].bw = l.link[t].bw;
            if (l.link[t].status)
                cm_coord_log(p, "link %s -> %s: not measured (%s)", r->addr, peers[t], cm_strerror(l.link[t].status));
            else
                cm_coord_log(p, "link %s -> %s: rtt %.3f ms, %.1f MB/s", r->addr, peers[t], l.link[t].rtt_s * 1e3,
                             l.link[t].bw / 1e6);
        }
        r->n_links = k;
        CM_LOGI("links of %s measured in %.2f s", r->addr, cm_now_s() - t0);
    }
}

int cm_coord_link(const cm_pipe *p, int a, int b, double *rtt, double *bw) {
    const remote *r = &p->r[a];
    for (int t = 0; t < r->n_links; t++) {
        if (strcmp(r->links[t].addr, p->r[b].addr)) continue;
        if (r->links[t].status) return r->links[t].status;
        *rtt = r->links[t].rtt;
        *bw = r->links[t].bw;
        return 1;
    }
    return 0;
}

void cm_coord_links_text(const cm_pipe *p, char *buf, size_t n) {
    size_t k = 0;
#define OUT(...) (k = cm_appendf(buf, n, k, __VA_ARGS__))
    if (n) buf[0] = 0;
    OUT("links (row measured toward column; rtt ms / MB/s):\n%-22s %-22s", "from \\ to", "here");
    for (int j = 0; j < p->n_remote; j++) OUT(" %-22s", p->r[j].addr);
    OUT("\n%-22s %-22s", "here", "-");
    for (int j = 0; j < p->n_remote; j++) {
        char cell[64];
        snprintf(cell, sizeof cell, "%.3f / %.1f", p->r[j].rtt * 1e3, p->r[j].bw / 1e6);
        OUT(" %-22s", cell);
    }
    OUT("\n");
    for (int i = 0; i < p->n_remote; i++) {
        OUT("%-22s %-22s", p->r[i].addr, "(as here -> it)");
        for (int j = 0; j < p->n_remote; j++) {
            char cell[64];
            double rtt = 0, bw = 0;
            int st = i == j ? 0 : cm_coord_link(p, i, j, &rtt, &bw);
            if (i == j) snprintf(cell, sizeof cell, "-");
            else if (st > 0) snprintf(cell, sizeof cell, "%.3f / %.1f", rtt * 1e3, bw / 1e6);
            else if (st < 0) snprintf(cell, sizeof cell, "unreachable");
            else snprintf(cell, sizeof cell, "not measured");
            OUT(" %-22s", cell);
        }
        OUT("\n");
    }
#undef OUT
}

/* r's entry about the peer at addr (added when r has none and there is room). */
static int link_slot(remote *r, const char *addr) {
    for (int t = 0; t < r->n_links; t++)
        if (!strcmp(r->links[t].addr, addr)) return t;
    if (r->n_links >= CM_PLAN_MAX_NODES) return -1;
    int t = r->n_links++;
    snprintf(r->links[t].addr, sizeof r->links[t].addr, "%.79s", addr);
    r->links[t].status = 0;
    r->links[t].rtt = r->links[t].bw = 0;
    return t;
}

/* LINKS_REQ to r while its receiver thread runs (it hands the answer over). */
static int ask_live(cm_pipe *p, remote *r, const char *const *peers, int k, cm_msg_links *out, char *err,
                    size_t errlen) {
    static _Atomic uint64_t next_id = 1ull << 48; /* apart from cm_cluster_links_ask's ids */
    cm_msg m = {.type = CM_MSG_LINKS_REQ};
    cm_msg_links_req *q = &m.u.links_req;
    q->id = atomic_fetch_add(&next_id, 1);
    q->deadline_ms = CM_LINKS_RECHECK_MS;
    /* Round trip only: enough to tell a cut from a working link, and a
     * slow link (tc tbf) answers small pings well within the deadline where
     * a bandwidth probe would time out and look like a cut. */
    q->probe_bytes = 0;
    q->n_peers = (uint8_t)k;
    for (int i = 0; i < k; i++) snprintf(q->peers[i], sizeof q->peers[i], "%.63s", peers[i]);
    uint64_t wait_ns = (uint64_t)(CM_LINKS_RECHECK_MS + 2000) * 1000000ull;
    pthread_mutex_lock(&p->mu);
    r->links_want = q->id;
    r->links_got = false;
    pthread_mutex_unlock(&p->mu);
    atomic_store(&r->quiet_until_ns, cm_now_ns() + wait_ns);
    pthread_mutex_lock(&p->send_mu);
    int rc = cm_conn_send(r->ctl, &m, 2000, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    uint64_t end = cm_now_ns() + wait_ns;
    pthread_mutex_lock(&p->mu);
    while (!rc && !r->links_got) {
        if (atomic_load(&r->lost)) {
            rc = cm_errf(err, errlen, CM_ECLOSED, "node lost");
            break;
        }
        if (cm_now_ns() > end) {
            rc = cm_errf(err, errlen, CM_ETIMEDOUT, "no LINKS answer");
            break;
        }
        cm_coord_wait_tick(p);
    }
    if (!rc && r->links_ans.n != k)
        rc = cm_errf(err, errlen, CM_EPROTO, "LINKS with %u entries for %d peers", r->links_ans.n, k);
    if (!rc) *out = r->links_ans;
    r->links_want = 0;
    pthread_mutex_unlock(&p->mu);
    atomic_store(&r->quiet_until_ns, 0);
    return rc;
}

static bool pair_down(const cm_pipe *p, int i, int j) {
    double rtt, bw;
    int a = cm_coord_link(p, i, j, &rtt, &bw), b = cm_coord_link(p, j, i, &rtt, &bw);
    return a <= 0 && b <= 0 && (a < 0 || b < 0);
}

bool cm_coord_any_link_down(const cm_pipe *p) {
    for (int i = 0; i < p->n_remote; i++)
        for (int j = i + 1; j < p->n_remote; j++)
            if (cm_coord_alive(&p->r[i]) && cm_coord_alive(&p->r[j]) && pair_down(p, i, j)) return true;
    return false;
}

int cm_coord_recheck_links(cm_pipe *p, bool only_down) {
    int changed = 0;
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (!cm_coord_alive(r)) continue;
        const char *peers[CM_PLAN_MAX_NODES];
        int idx[CM_PLAN_MAX_NODES], k = 0;
        for (int j = i + 1; j < p->n_remote; j++)
            if (cm_coord_alive(&p->r[j]) && (!only_down || pair_down(p, i, j)) && k < (int)CM_MSG_MAX_PEERS) {
                idx[k] = j;
                peers[k++] = p->r[j].addr;
            }
        if (!k) continue;
        cm_msg_links l;
        char e[300];
        if (ask_live(p, r, peers, k, &l, e, sizeof e)) {
            /* No answer says nothing about the links: leave them as they are. */
            cm_coord_log(p, "node %s ('%s') did not re-measure its links: %s", r->addr, r->hello.name, e);
            continue;
        }
        for (int t = 0; t < k; t++) {
            remote *o = &p->r[idx[t]];
            bool was = pair_down(p, i, idx[t]);
            int sa = link_slot(r, o->addr), sb = link_slot(o, r->addr);
            if (sa < 0 || sb < 0) continue;
            int st = l.link[t].status;
            /* Both directions: the planner keeps the pair apart (or not)
             * whichever of the two measured last. */
            r->links[sa].status = o->links[sb].status = st;
            if (!st) { /* the bandwidth measured before stays (none was probed now) */
                r->links[sa].rtt = o->links[sb].rtt = l.link[t].rtt_s;
                if (l.link[t].bw > 0) r->links[sa].bw = o->links[sb].bw = l.link[t].bw;
            }
            if (st && !was) {
                changed++;
                cm_coord_log(p, "link %s -> %s is down (%s): the plan keeps them apart", r->addr, o->addr,
                             cm_strerror(st));
            } else if (!st && was) {
                changed++;
                cm_coord_log(p, "link %s -> %s is back: rtt %.3f ms", r->addr, o->addr, l.link[t].rtt_s * 1e3);
            }
        }
    }
    return changed;
}
