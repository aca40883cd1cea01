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
#define OUT(...) do { if (k < n) { int w_ = snprintf(buf + k, n - k, __VA_ARGS__); if (w_ > 0) k += (size_t)w_; } } while (0)
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
