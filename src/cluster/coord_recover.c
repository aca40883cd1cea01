/*
 * coord_recover.c: what the coordinator does when the set of nodes changes
 * (issue 7). cm_pipe_recover re-plans on the survivors after a loss;
 * cm_pipe_maintain, called while idle, redials lost nodes of the --nodes
 * list (and takes the nodes coord_join.c found by mDNS) and moves to a plan
 * that uses them. This file decides WHEN to re-plan and with which nodes
 * (settling after a loss, re-measuring links, retries, leaving out nodes
 * that refuse their part); the question to the planner (cm_coord_replan)
 * and the switch itself (cm_coord_apply_plan, one transaction for every
 * shape of plan) are coord_plan.c's. The engine then recomputes its
 * sequences into the new stages. It must never leave the pipe
 * half-switched: on failure the pipe stays failed with the reason.
 */
#include "cluster/coord_impl.h"
#include "sched/simulate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cm_pipe_failed(cm_pipe *p) {
    pthread_mutex_lock(&p->mu);
    bool f = p->fatal != 0;
    pthread_mutex_unlock(&p->mu);
    return f;
}

int cm_pipe_generation(const cm_pipe *p) { return p->generation; }

/* Join the receiver threads of lost nodes (they end within the bound) and
 * close their connections: a node is then either alive or closed. */
static int reap_lost(cm_pipe *p) {
    int n = 0;
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (!atomic_load(&r->lost) || !r->ctl) continue;
        n++;
        if (r->rx_started) pthread_join(r->rx, NULL);
        r->rx_started = false;
        cm_conn_close(r->ctl, NULL);
        r->ctl = NULL;
    }
    return n;
}

/* Nodes that refused their part of a plan (READY with an error: a disk or
 * cache that fails) are closed, so that the recovery that follows plans
 * without them (it would otherwise fail the same way and give up), and
 * are not redialled for CM_JOIN_RETRY_MS. Returns how many. */
static int drop_refusers(cm_pipe *p) {
    int n = 0;
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        pthread_mutex_lock(&p->mu);
        bool refused = r->ready && r->ready_status;
        pthread_mutex_unlock(&p->mu);
        if (!cm_coord_alive(r) || !refused) continue;
        cm_coord_log(p, "node %s ('%s') left out: it could not take its part: %s", r->addr, r->hello.name,
                     r->ready_text);
        r->refused_until_ns = cm_now_ns() + (uint64_t)CM_JOIN_RETRY_MS * 1000000ull;
        atomic_store(&r->released, true); /* its rx thread ends without failing the pipe */
        pthread_join(r->rx, NULL);
        r->rx_started = false;
        cm_conn_close(r->ctl, "refused its part");
        r->ctl = NULL;
        atomic_store(&r->lost, true);
        atomic_store(&r->released, false);
        n++;
    }
    return n;
}

/* Whether every node of the running plan is still alive: then no lost node
 * explains the failure (a link between two of them was cut, or is stuck). */
static bool plan_nodes_alive(cm_pipe *p) {
    for (int s = 0; s < p->plan.n_stages; s++)
        for (int k = 0; k < p->plan.stages[s].n_members; k++) {
            const remote *r = cm_coord_member(p, s, k);
            if (r && !cm_coord_alive(r)) return false;
        }
    return true;
}

/* One re-plan after a loss. When no node of the plan was lost, or the
 * previous re-plan failed (a stage could not reach its next one), the links
 * between the live nodes are measured again first: a cut pair is then
 * marked down and the planner keeps the two apart (leaving one out if it
 * must), instead of putting them together again from the matrix measured at
 * the start. The old links are dropped first: closing our all-reduce links
 * wakes members blocked in one with us, so that they can answer. */
static int recover_once(cm_pipe *p, char *err, size_t errlen) {
    cm_coord_leave_plan(p);
    reap_lost(p);
    if (p->links_suspect || plan_nodes_alive(p)) {
        int changed = cm_coord_recheck_links(p, false);
        if (changed) p->next_link_check_ns = cm_now_ns() + 2ull * (uint64_t)p->rejoin_ms * 1000000ull;
    }
    cm_plan *pl = cm_calloc(1, sizeof *pl);
    if (!pl) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int rc = cm_coord_replan(p, pl, NULL, NULL, err, errlen);
    if (!rc) rc = cm_coord_apply_plan(p, pl, "recovery", err, errlen);
    p->links_suspect = rc != 0;
    cm_free(pl);
    return rc;
}

int cm_pipe_tp_recover(cm_pipe *p, char *err, size_t errlen) {
    if (p->plan.n_stages != 1) return cm_errf(err, errlen, CM_EINVAL, "not a tensor-parallel group");
    /* An all-reduce may fail before the receiver threads declare the node
     * lost: the group is broken either way. */
    if (!cm_pipe_failed(p)) cm_coord_fatal(p, CM_EIO, "an all-reduce of the tensor-parallel group failed");
    return cm_pipe_recover(p, err, errlen);
}

/* Recovery gave up, but nodes are still alive: a cut link between them may
 * have healed since (nobody was lost, so nobody is redialled). Worth another
 * try once per rejoin interval. */
static bool retry_due(const cm_pipe *p) {
    if (!p->gave_up || cm_now_ns() < p->gave_up_ns + (uint64_t)p->rejoin_ms * 1000000ull) return false;
    for (int i = 0; i < p->n_remote; i++)
        if (cm_coord_alive(&p->r[i])) return true;
    return false;
}

/* A node that stopped (SIGSTOP) or was cut off is declared lost by its
 * receiver thread after the loss bound of silence; a failure seen first by a
 * send that stalled or an all-reduce that ran out of time must not re-plan
 * with that node still counted alive (it would get an ASSIGN and be waited
 * for). Nodes send a heartbeat every CM_PIPE_HB_MS, so wait (at most the
 * bound) until every live node was heard from lately or is declared lost. */
static void settle(cm_pipe *p) {
    uint64_t end = cm_now_ns() + (uint64_t)p->lost_ms * 1000000ull + 500000000ull;
    while (cm_now_ns() < end) {
        bool doubt = false;
        uint64_t now = cm_now_ns();
        for (int i = 0; i < p->n_remote; i++) {
            remote *r = &p->r[i];
            if (!cm_coord_alive(r) || atomic_load(&r->loading)) continue;
            uint64_t heard = atomic_load(&r->last_rx_ns);
            if (now > heard && now - heard > 2ull * CM_PIPE_HB_MS * 1000000ull) doubt = true;
        }
        if (!doubt) return;
        cm_sleep_ms(20);
    }
}

static int recover_settled(cm_pipe *p, char *err, size_t errlen);

int cm_pipe_recover(cm_pipe *p, char *err, size_t errlen) {
    if (!cm_pipe_failed(p)) return 0;
    if (p->gave_up && retry_due(p)) p->gave_up = false;
    if (p->gave_up) { /* nothing changed since: the same answer, at once */
        pthread_mutex_lock(&p->mu);
        int rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    /* A stage that reports its neighbour's failure may speak first: give
     * closed connections a moment to show as lost. */
    cm_sleep_ms(200);
    settle(p);
    return recover_settled(p, err, errlen);
}

static int recover_settled(cm_pipe *p, char *err, size_t errlen) {
    char why[300];
    pthread_mutex_lock(&p->mu);
    snprintf(why, sizeof why, "%.299s", p->cause[0] ? p->cause : p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    cm_coord_log(p, "failure: %s; re-planning on the survivors", why);
    int rc = 0;
    /* Test hook (tests/sh/cluster_failover.sh shows it fails without recovery). */
    if (p->no_recover) rc = cm_errf(err, errlen, CM_EAGAIN, "recovery disabled");
    for (int attempt = 0; attempt < 3 && !rc; attempt++) {
        rc = recover_once(p, err, errlen);
        if (!rc) {
            p->cause[0] = 0;
            if (p->plan.n_stages == 1 && p->plan.stages[0].ep) /* experts re-placed on the survivors */
                cm_coord_log(p, "recovered: expert group of %d, epoch %llu", p->plan.stages[0].n_members,
                             (unsigned long long)atomic_load(&p->epoch));
            else if (p->plan.n_stages == 1)
                cm_coord_log(p, "recovered: tensor-parallel group of %d, epoch %llu", p->plan.stages[0].n_members,
                             (unsigned long long)atomic_load(&p->epoch));
            else
                cm_coord_log(p, "recovered: %d stages, epoch %llu", p->plan.n_stages,
                             (unsigned long long)atomic_load(&p->epoch));
            return 0;
        }
        if (rc == CM_EAGAIN) break;
        cm_coord_log(p, "re-plan failed: %s", err);
        drop_refusers(p);
        rc = 0;
    }
    /* Stay failed with the reason (CM_EAGAIN when the survivors cannot hold
     * the model: serve answers new requests 503): every later request gets
     * it, until cm_pipe_maintain finds nodes back. */
    char e2[600];
    snprintf(e2, sizeof e2, "%s", err);
    pthread_mutex_lock(&p->mu);
    p->fatal = rc == CM_EAGAIN ? CM_EAGAIN : CM_EIO;
    p->gave_up = true;
    p->gave_up_ns = cm_now_ns();
    memcpy(p->cause, why, sizeof p->cause);
    /* The reason first: HTTP error bodies keep only the first 255 bytes. */
    snprintf(p->fatal_text, sizeof p->fatal_text, "the cluster cannot continue: %.330s (after: %.230s)", e2, why);
    pthread_cond_broadcast(&p->cv);
    cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    return p->fatal;
}

/* Whether a connected node was declared lost (not yet reaped). */
static bool any_lost(const cm_pipe *p) {
    for (int i = 0; i < p->n_remote; i++)
        if (p->r[i].ctl && atomic_load(&p->r[i].lost)) return true;
    return false;
}

/* Whether a live node has not answered its ASSIGN yet. */
static bool any_loading(const cm_pipe *p) {
    for (int i = 0; i < p->n_remote; i++)
        if (p->r[i].ctl && !atomic_load(&p->r[i].lost) && atomic_load(&p->r[i].loading)) return true;
    return false;
}

int cm_coord_open_recover(cm_pipe *p, const cm_plan *tried, int rc, char *err, size_t errlen) {
    /* The same settling as after ready: a node killed while it loaded shows
     * as a closed connection within moments, one stopped as silence within
     * the loading bound (coord.c), which wait_ready already waited out. */
    cm_sleep_ms(200);
    settle(p);
    /* A failure seen first by a send or a mesh dial: the dead node's
     * receiver thread may not have run yet on a busy machine (up to the loss
     * bound for it). A member that refused its part because its neighbour
     * does not answer (a node stopped while it loads: no READY) speaks
     * before the silence bound declares that neighbour lost: while a node
     * still loads, up to that bound. A failure that is no loss costs that
     * much more time. */
    uint64_t t0 = cm_now_ns(), end = t0 + (uint64_t)p->lost_ms * 1000000ull;
    uint64_t end_loading = t0 + (cm_coord_load_silent_ms(p) + 1000) * 1000000ull;
    while (!any_lost(p) && cm_now_ns() < end_loading && (cm_now_ns() < end || any_loading(p))) cm_sleep_ms(20);
    char lost[600] = "";
    int n_lost = 0;
    size_t o = 0;
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (!r->ctl || !atomic_load(&r->lost)) continue;
        cm_coord_log(p, "node %s ('%s') left out: lost while the cluster opened (%s); planning without it", r->addr,
                     r->hello.name, r->lost_why);
        o = cm_appendf(lost, sizeof lost, o, "%s%s ('%s')", n_lost ? ", " : "", r->addr, r->hello.name);
        n_lost++;
    }
    if (!n_lost || p->no_recover) return rc; /* not a loss (a refusal, a bad request): the error as it was */
    char first[600];
    snprintf(first, sizeof first, "%s", err);
    pthread_mutex_lock(&p->mu);
    if (!p->fatal) {
        p->fatal = rc < 0 ? rc : CM_EIO;
        snprintf(p->fatal_text, sizeof p->fatal_text, "%s", first);
    }
    snprintf(p->cause, sizeof p->cause, "node%s %.250s lost while the cluster opened", n_lost > 1 ? "s" : "", lost);
    pthread_mutex_unlock(&p->mu);
    /* The plan tried is the running record, as if it had run: the re-plan
     * keeps its shape (one group stays one group) and this machine's layers. */
    pthread_mutex_lock(&p->send_mu);
    p->plan = *tried;
    pthread_mutex_unlock(&p->send_mu);
    rc = recover_settled(p, err, errlen);
    if (!rc) {
        cm_coord_log(p, "%s", p->plan_text); /* the plan that runs */
        return 0;
    }
    char e2[600];
    snprintf(e2, sizeof e2, "%s", err);
    char *after = strstr(e2, " (after: "); /* the loss, said first here */
    if (after) *after = 0;
    return cm_errf(err, errlen, rc,
                   "node%s %s lost while the cluster opened, and %s; start %s again (or name other nodes in --nodes), "
                   "or ask for less (a smaller --ctx, fewer --slots) so that the rest can hold the model",
                   n_lost > 1 ? "s" : "", lost, e2, n_lost > 1 ? "them" : "it");
}

/* Redial the nodes we lost; returns how many came back. */
static int redial_lost(cm_pipe *p) {
    int back = 0;
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (r->ctl || cm_now_ns() < r->refused_until_ns) continue;
        char e[400], host[256];
        uint16_t port;
        cm_msg_hello h;
        cm_conn *c = NULL;
        double rtt = 0, bw = 0;
        /* The caller is idle but new requests may be waiting behind it: a
         * quick TCP check first (a machine that is off costs 300 ms), then a
         * handshake bounded at 1 s (a frozen process accepts TCP but never
         * answers). */
        if (cm_net_parse_addr(r->addr, CM_NET_DEFAULT_PORT, host, sizeof host, &port, e, sizeof e)) continue;
        if (cm_net_connect(host, port, 300, &c, e, sizeof e)) continue;
        cm_net_cfg cfg = p->cfg;
        cfg.handshake_ms = 1000;
        int rc = cm_conn_handshake(c, true, &cfg, &p->hello, &h, e, sizeof e);
        if (!rc && cm_lease_foreign(&h, &p->hello)) {
            /* Taken by another coordinator: not ours to take back. Asked
             * again at every check (it is ours again the moment the other
             * lets go); said once. */
            if (!r->held_logged) {
                char why[400];
                cm_lease_text(&h, why, sizeof why);
                cm_coord_log(p, "node %s not taken back while another coordinator holds it: %s", r->addr, why);
                r->held_logged = true;
            }
            r->seen_back = false;
            cm_conn_close(c, NULL);
            continue;
        }
        if (!rc) r->held_logged = false;
        if (!rc && !r->seen_back) {
            /* Back once: taken at the next check if it still answers (a
             * flapping node is not re-planned for at every blink, and one
             * just woken from SIGSTOP settles before its link is measured). */
            r->seen_back = true;
            cm_conn_close(c, NULL);
            continue;
        }
        /* Two measurements, best of each: one busy moment of a loaded
         * machine would otherwise price its link far too high. */
        double rtt2 = 0, bw2 = 0;
        if (!rc) rc = cm_cluster_measure(c, CM_LINKS_PROBE_BYTES, &rtt, &bw, e, sizeof e);
        if (!rc) rc = cm_cluster_measure(c, CM_LINKS_PROBE_BYTES, &rtt2, &bw2, e, sizeof e);
        if (rc) {
            r->seen_back = false;
            if (c) cm_conn_close(c, NULL);
            continue;
        }
        if (rtt2 < rtt) rtt = rtt2;
        if (bw2 > bw) bw = bw2;
        r->seen_back = false;
        r->ctl = c;
        r->hello = h;
        r->rtt = rtt;
        r->bw = bw;
        r->ready = false;
        r->ready_status = 0;
        atomic_store(&r->loading, false);
        atomic_store(&r->lost, false);
        cm_coord_log(p, "node %s ('%s') is back: rtt %.3f ms, %.1f MB/s, %.2f GiB free", r->addr, h.name, rtt * 1e3,
                     bw / 1e6, (double)h.mem_free / (1 << 30));
        back++;
    }
    if (back) cm_coord_start_rx(p);
    return back;
}

int cm_pipe_maintain(cm_pipe *p, char *err, size_t errlen) {
    if (!p) return 0;
    uint64_t now = cm_now_ns();
    if (now < p->next_rejoin_ns) return 0;
    int every_ms = p->rejoin_ms;
    p->next_rejoin_ns = now + (uint64_t)every_ms * 1000000ull;
    reap_lost(p);
    int back = redial_lost(p);
    back += cm_coord_join_poll(p); /* --nodes auto: nodes found by mDNS since */
    /* Links marked down (a cut seen by a re-plan, or at the start) are
     * measured again now and then: a healed one counts like a node back. */
    int healed = 0;
    if (now >= p->next_link_check_ns && cm_coord_any_link_down(p)) {
        p->next_link_check_ns = now + 2ull * (uint64_t)every_ms * 1000000ull;
        healed = cm_coord_recheck_links(p, true);
    }
    if (cm_pipe_failed(p)) {
        /* No node came back, but a cut link between live nodes may have
         * healed (nobody was lost, so nobody is redialled): try again, less
         * often (each try may wait for the nodes' READY). */
        if (!back && !healed && !retry_due(p)) return 0;
        p->gave_up = false;
        int rc = cm_pipe_recover(p, err, errlen);
        return rc ? rc : 1;
    }
    if (!back && !healed) return cm_coord_ep_rebalance(p, err, errlen); /* measured expert load (coord_ep.c) */
    /* The planner's answer on every live node; taken when it uses more
     * nodes and is not predicted more than 10% slower, or is predicted more
     * than 5% faster. A planner that finds nothing leaves the running plan. */
    cm_plan *pl = cm_calloc(1, sizeof *pl);
    if (!pl) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    double cand = 0, cur = 0;
    int rc = cm_coord_replan(p, pl, &cand, &cur, err, errlen);
    bool grow = !rc && cm_coord_plan_members(pl) > cm_coord_plan_members(&p->plan);
    if (rc) {
        rc = 0;
    } else if (grow && cand < 0.9 * cur) {
        cm_coord_log(p, "re-plan with the returning node(s) not taken: predicted %.1f tok/s vs %.1f now", cand, cur);
    } else if (grow || cand > 1.05 * cur) {
        rc = cm_coord_apply_plan(p, pl, back ? "nodes back or new" : "link back", err, errlen);
        if (!rc) {
            const cm_plan *now = &p->plan;
            int n_members = cm_coord_plan_members(now);
            if (now->n_stages == 1)
                cm_coord_log(p, "now a tensor-parallel group of %d, epoch %llu", n_members,
                             (unsigned long long)atomic_load(&p->epoch));
            else if (n_members == now->n_stages)
                cm_coord_log(p, "now %d stages, epoch %llu", now->n_stages, (unsigned long long)atomic_load(&p->epoch));
            else
                cm_coord_log(p, "now %d stages (%d members), epoch %llu", now->n_stages, n_members,
                             (unsigned long long)atomic_load(&p->epoch));
            rc = 1;
        } else {
            char e2[600];
            snprintf(e2, sizeof e2, "%s", err);
            drop_refusers(p);
            rc = cm_pipe_recover(p, err, errlen); /* back on the nodes that work */
            if (!rc) rc = cm_errf(err, errlen, CM_EIO, "%s", e2);
        }
    }
    cm_free(pl);
    return rc;
}
