/*
 * coord_join.c: nodes that appear after the cluster started (issue 7, item
 * 3). With --nodes auto the coordinator keeps browsing mDNS for
 * _cumulo._tcp in a thread of its own once it is idle for the first time
 * (cm_pipe_maintain: `serve` calls it, a one-shot `run` never does, so a run
 * does not browse). The addresses it learns wait in a bounded table until
 * the next idle cm_pipe_maintain dials them: the same authenticated
 * handshake as at start (a node with another key, --insecure or another
 * protocol version is left out with one log line, as at start), the link
 * from here measured twice, the node's links toward the other nodes
 * (LINKS_REQ); it then becomes one more remote, and the re-plan that follows
 * decides whether to use it.
 *
 * It must never let announcements grow memory or stall the cluster: the
 * table (CM_JOIN_TABLE) and the remotes (CM_PLAN_MAX_NODES - 1) are fixed
 * arrays, a full table ignores newcomers (counted), and one idle call dials
 * at most CM_JOIN_DIALS addresses, each bounded by CM_JOIN_DIAL_MS.
 */
#include "cluster/coord_impl.h"
#include "cluster/mdns.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JOIN_NEW, JOIN_REFUSED, JOIN_MEMBER };

struct cm_join {
    cm_pipe *p;
    cm_mdns *m;
    pthread_t th;
    atomic_int stop;
    pthread_mutex_t mu; /* c, n, ignored: the browse thread writes, cm_pipe_maintain reads */
    struct {
        char addr[80];
        int state;
        uint64_t next_ns; /* JOIN_REFUSED: not dialled again before */
    } c[CM_JOIN_TABLE];
    int n;
    uint64_t ignored; /* announcements not kept: the table was full */
    uint64_t ignored_logged;
};

static void addr_of(const cm_mdns_instance *in, char out[80]) {
    snprintf(out, 80, strchr(in->addr, ':') ? "[%.60s]:%u" : "%.60s:%u", in->addr, in->port);
}

/* The browse thread's events (inside cm_mdns_step). */
static void on_event(void *ud, enum cm_mdns_event ev, const cm_mdns_instance *in) {
    struct cm_join *j = ud;
    if (!in->addr[0] || !in->port) return;
    char a[80];
    addr_of(in, a);
    pthread_mutex_lock(&j->mu);
    int at = -1;
    for (int i = 0; i < j->n; i++)
        if (!strcmp(j->c[i].addr, a)) at = i;
    if (ev == CM_MDNS_REMOVE) {
        /* Gone (goodbye or TTL): forget it unless it is a remote (those are
         * redialled by cm_pipe_maintain when lost), so the table holds the
         * living. */
        if (at >= 0 && j->c[at].state != JOIN_MEMBER) j->c[at] = j->c[--j->n];
    } else if (at >= 0) {
        if (j->c[at].state == JOIN_REFUSED && ev == CM_MDNS_UPDATE) j->c[at].next_ns = 0; /* changed: try again */
    } else if (j->n < CM_JOIN_TABLE) {
        snprintf(j->c[j->n].addr, sizeof j->c[0].addr, "%s", a);
        j->c[j->n].state = JOIN_NEW;
        j->c[j->n].next_ns = 0;
        j->n++;
    } else {
        j->ignored++;
    }
    pthread_mutex_unlock(&j->mu);
}

static void *browse_main(void *arg) {
    struct cm_join *j = arg;
    while (!atomic_load(&j->stop))
        if (cm_mdns_step(j->m, 200)) cm_sleep_ms(200); /* a socket error: keep trying, slowly */
    return NULL;
}

void cm_coord_join_stop(cm_pipe *p) {
    struct cm_join *j = p->join;
    if (!j) return;
    atomic_store(&j->stop, 1);
    pthread_join(j->th, NULL);
    cm_mdns_close(j->m);
    pthread_mutex_destroy(&j->mu);
    cm_free(j);
    p->join = NULL;
}

/* Start browsing (once; a failure is logged and not retried: the cluster
 * goes on with the nodes it has). */
static void join_start(cm_pipe *p) {
    p->join_tried = true;
    struct cm_join *j = cm_calloc(1, sizeof *j);
    if (!j) return;
    char e[300];
    int rc = cm_mdns_open(&j->m, NULL, e, sizeof e);
    if (!rc) rc = cm_mdns_browse(j->m, on_event, j);
    if (!rc) {
        pthread_mutex_init(&j->mu, NULL);
        j->p = p;
        if (pthread_create(&j->th, NULL, browse_main, j)) {
            pthread_mutex_destroy(&j->mu);
            rc = cm_errf(e, sizeof e, CM_ENOMEM, "cannot start a thread");
        }
    }
    if (rc) {
        cm_coord_log(p, "mDNS: cannot keep browsing for new nodes: %s", e);
        cm_mdns_close(j->m);
        cm_free(j);
        return;
    }
    p->join = j;
    cm_coord_log(p, "mDNS: browsing for new nodes (at most %d in the cluster)", CM_PLAN_MAX_NODES - 1);
}

static void set_state(struct cm_join *j, const char *addr, int state, uint64_t next_ns) {
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n; i++)
        if (!strcmp(j->c[i].addr, addr)) {
            j->c[i].state = state;
            j->c[i].next_ns = next_ns;
        }
    pthread_mutex_unlock(&j->mu);
}

/* The handshakes of one idle call run at once, each bounded by
 * CM_JOIN_DIAL_MS: addresses that never answer (a flood of fake
 * announcements) cost one bound in all. */
typedef struct join_dial {
    const char *addr;
    const cm_pipe *p;
    cm_conn *c;
    cm_msg_hello h;
    int rc;
    char e[400];
    pthread_t th;
    bool started;
} join_dial;

static void *dial_main(void *arg) {
    join_dial *d = arg;
    d->rc = cm_cluster_dial_within(d->addr, &d->p->cfg, &d->p->hello, CM_JOIN_DIAL_MS, &d->c, &d->h, d->e, sizeof d->e);
    return NULL;
}

/* Take one dialled address found by mDNS (d->rc: the handshake's outcome);
 * 1 when it became a remote. */
static int join_one(cm_pipe *p, struct cm_join *j, join_dial *d, bool first_try) {
    const char *addr = d->addr;
    uint64_t retry = cm_now_ns() + (uint64_t)CM_JOIN_RETRY_MS * 1000000ull;
    cm_conn *c = d->c;
    cm_msg_hello h = d->h;
    int rc = d->rc;
    char e[400];
    snprintf(e, sizeof e, "%s", d->e);
    if (!rc && p->n_remote >= CM_PLAN_MAX_NODES - 1) {
        if (first_try)
            cm_coord_log(p, "node %s (found by mDNS) not used: the cluster has %d nodes already", addr, p->n_remote);
        cm_conn_close(c, NULL);
        set_state(j, addr, JOIN_REFUSED, retry);
        return 0;
    }
    if (!rc && cm_lease_foreign(&h, &p->hello)) { /* it serves another coordinator (issue 19): not ours */
        char why[400];
        cm_lease_text(&h, why, sizeof why);
        if (first_try) cm_coord_log(p, "node %s (found by mDNS) not used: %s", addr, why);
        cm_conn_close(c, NULL);
        set_state(j, addr, JOIN_REFUSED, retry);
        return 0;
    }
    double rtt = 0, bw = 0, rtt2 = 0, bw2 = 0;
    for (int i = 0; !rc && i < p->n_remote; i++)
        if (!memcmp(p->r[i].hello.node_id, h.node_id, sizeof h.node_id) && p->r[i].ctl) {
            /* The same node under another address (a second interface). */
            cm_conn_close(c, NULL);
            set_state(j, addr, JOIN_MEMBER, 0);
            return 0;
        }
    /* Two measurements, best of each (as when a lost node comes back). */
    if (!rc) rc = cm_cluster_measure(c, CM_LINKS_PROBE_BYTES, &rtt, &bw, e, sizeof e);
    if (!rc) rc = cm_cluster_measure(c, CM_LINKS_PROBE_BYTES, &rtt2, &bw2, e, sizeof e);
    if (rc) {
        if (first_try) {
            CM_LOGW("node %s (found by mDNS) not used: %s", addr, e);
            cm_coord_log(p, "node %s (found by mDNS) not used: %s", addr, e);
        }
        if (c) cm_conn_close(c, NULL);
        set_state(j, addr, JOIN_REFUSED, retry);
        return 0;
    }
    remote *r = &p->r[p->n_remote];
    memset(r, 0, sizeof *r);
    snprintf(r->addr, sizeof r->addr, "%.79s", addr);
    r->p = p;
    r->ctl = c;
    r->hello = h;
    r->rtt = rtt2 < rtt ? rtt2 : rtt;
    r->bw = bw2 > bw ? bw2 : bw;
    /* Its links toward the live nodes (theirs toward it stay estimated until
     * the next start: their connections belong to their receiver threads). */
    const char *peers[CM_PLAN_MAX_NODES];
    int k = 0;
    for (int i = 0; i < p->n_remote && k < (int)CM_MSG_MAX_PEERS; i++)
        if (p->r[i].ctl && !atomic_load(&p->r[i].lost)) peers[k++] = p->r[i].addr;
    cm_msg_links l;
    if (k && !cm_cluster_links_ask(c, peers, k, CM_JOIN_DIAL_MS, CM_LINKS_PROBE_BYTES, &l, e, sizeof e)) {
        for (int t = 0; t < k; t++) {
            snprintf(r->links[t].addr, sizeof r->links[t].addr, "%.79s", peers[t]);
            r->links[t].status = l.link[t].status;
            r->links[t].rtt = l.link[t].rtt_s;
            r->links[t].bw = l.link[t].bw;
        }
        r->n_links = k;
    }
    p->n_remote++;
    set_state(j, addr, JOIN_MEMBER, 0);
    cm_coord_log(
        p,
        "node %s ('%s') joined (found by mDNS): %u cores, %.1f GFLOP/s, %.2f GiB free; rtt %.3f ms, %.1f MB/s; "
        "%d of its links measured",
        r->addr, h.name, h.cores, h.gflops, (double)h.mem_free / (1 << 30), r->rtt * 1e3, r->bw / 1e6, r->n_links);
    return 1;
}

int cm_coord_join_poll(cm_pipe *p) {
    if (!p->from_mdns) return 0;
    if (!p->join_tried) join_start(p);
    struct cm_join *j = p->join;
    if (!j) return 0;
    char todo[CM_JOIN_DIALS][80];
    bool first[CM_JOIN_DIALS];
    int n = 0;
    uint64_t now = cm_now_ns(), ignored;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n && n < CM_JOIN_DIALS; i++) {
        if (j->c[i].state == JOIN_MEMBER || j->c[i].next_ns > now) continue;
        bool known = false; /* a node of the cluster already (found at start, or joined) */
        for (int r = 0; r < p->n_remote; r++) known |= !strcmp(p->r[r].addr, j->c[i].addr);
        if (known) {
            j->c[i].state = JOIN_MEMBER;
            continue;
        }
        memcpy(todo[n], j->c[i].addr, sizeof todo[0]);
        first[n++] = j->c[i].state == JOIN_NEW;
    }
    ignored = j->ignored;
    pthread_mutex_unlock(&j->mu);
    if (ignored > j->ignored_logged) {
        cm_coord_log(p, "mDNS: %llu announcement(s) of new nodes ignored: %d addresses wait already",
                     (unsigned long long)(ignored - j->ignored_logged), CM_JOIN_TABLE);
        j->ignored_logged = ignored;
    }
    join_dial d[CM_JOIN_DIALS];
    memset(d, 0, sizeof d);
    for (int i = 0; i < n; i++) {
        d[i].addr = todo[i];
        d[i].p = p;
        d[i].started = !pthread_create(&d[i].th, NULL, dial_main, &d[i]);
        if (!d[i].started) dial_main(&d[i]); /* no thread: here, one at a time */
    }
    for (int i = 0; i < n; i++)
        if (d[i].started) pthread_join(d[i].th, NULL);
    int added = 0;
    for (int i = 0; i < n; i++) added += join_one(p, j, &d[i], first[i]);
    if (added) cm_coord_start_rx(p);
    return added;
}
