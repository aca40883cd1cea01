/*
 * coord_recover.c: what the coordinator does when a node is lost (issue 7).
 * cm_pipe_recover re-plans on the survivors under a new epoch (nodes drop
 * traffic of any other epoch, so a stale node cannot act on the old plan),
 * waits for their READY and redials stage 1; the engine then recomputes its
 * sequences into the new stages. It must never leave the pipe half-switched:
 * on failure the pipe stays failed with the reason.
 */
#include "cluster/coord_impl.h"

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

/* One re-plan attempt: this machine keeps layers [0, local_last) (the
 * engine's stage-0 caches stay valid); the surviving nodes, in their old
 * stage order, share the rest evenly. */
static int recover_once(cm_pipe *p, char *err, size_t errlen) {
    if (p->grouped) return cm_coord_tp_recover(p, err, errlen); /* tensor-parallel groups: coord_tp.c */
    int n_layer = p->m->hp.n_layer;
    /* Lost nodes: their rx threads have ended (or end within the bound). */
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (atomic_load(&r->lost) && r->rx_started) {
            pthread_join(r->rx, NULL);
            r->rx_started = false;
            cm_conn_close(r->ctl, NULL);
            r->ctl = NULL;
        }
    }
    int rid[CM_PLAN_MAX_NODES], lb[CM_PLAN_MAX_NODES], le[CM_PLAN_MAX_NODES], n_st = 1;
    bool used[CM_PLAN_MAX_NODES] = {false};
    for (int s = 1; s < p->n_stages; s++) {
        int i = p->stage_remote[s];
        used[i] = true;
        if (p->r[i].ctl && !atomic_load(&p->r[i].lost)) rid[n_st++] = i;
    }
    for (int i = 0; i < p->n_remote; i++) /* idle nodes we know join too */
        if (!used[i] && p->r[i].ctl && p->r[i].rx_started && !atomic_load(&p->r[i].lost)) rid[n_st++] = i;
    int rest = n_layer - p->local_last;
    if (n_st == 1)
        return cm_errf(err, errlen, CM_EAGAIN,
                       "no node is left to run layers [%d, %d): the model does not fit on the survivors", p->local_last,
                       n_layer);
    if (n_st - 1 > rest) n_st = rest + 1;
    lb[0] = 0;
    le[0] = p->local_last;
    for (int s = 1, at = p->local_last; s < n_st; s++) {
        int k = rest / (n_st - 1) + (s - 1 < rest % (n_st - 1) ? 1 : 0);
        lb[s] = at;
        le[s] = at + k;
        at += k;
    }
    uint64_t ep = cm_wall_ms();
    if (ep <= atomic_load(&p->epoch)) ep = atomic_load(&p->epoch) + 1;
    atomic_store(&p->epoch, ep);
    if (p->data) {
        cm_conn_close(p->data, NULL);
        p->data = NULL;
    }
    pthread_mutex_lock(&p->mu);
    p->fatal = 0;
    p->fatal_text[0] = 0;
    for (int i = 0; i < p->n_seq; i++) p->slots[i].asked = p->slots[i].got = 0;
    pthread_mutex_unlock(&p->mu);
    char line[600];
    int o = snprintf(line, sizeof line, "re-plan (epoch %llu): here [0, %d)", (unsigned long long)ep, p->local_last);
    for (int s = 1; s < n_st && o < (int)sizeof line; s++)
        o += snprintf(line + o, sizeof line - (size_t)o, ", %s [%d, %d)", p->r[rid[s]].addr, lb[s], le[s]);
    cm_coord_log(p, "%s", line);
    for (int s = 1; s < n_st; s++) {
        int rc = cm_coord_assign_stage(p, s, n_st, rid, lb, le, err, errlen);
        if (rc) return rc;
    }
    uint64_t deadline = cm_now_ns() + 120ull * 1000000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int waiting = 0;
        for (int s = 1; s < n_st; s++) {
            remote *r = &p->r[rid[s]];
            if (!r->ready) waiting++;
            else if (r->ready_status && !rc)
                rc = cm_errf(err, errlen, r->ready_status, "node %s ('%s') cannot take layers [%d, %d): %s", r->addr,
                             r->hello.name, lb[s], le[s], r->ready_text);
        }
        if (p->fatal && !rc) rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
        if (rc || !waiting) break;
        if (cm_now_ns() > deadline) { rc = cm_errf(err, errlen, CM_ETIMEDOUT, "survivors were not ready within 120 s"); break; }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    char e[400];
    cm_msg_hello peer;
    cm_conn *d = NULL;
    rc = cm_cluster_dial(p->r[rid[1]].addr, &p->cfg, &p->hello, &d, &peer, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "stage 1 at %s: %s", p->r[rid[1]].addr, e);
    pthread_mutex_lock(&p->send_mu);
    p->data = d;
    pthread_mutex_unlock(&p->send_mu);
    p->n_stages = n_st;
    for (int s = 1; s < n_st; s++) p->stage_remote[s] = rid[s];
    p->generation++;
    return 0;
}

int cm_pipe_recover(cm_pipe *p, char *err, size_t errlen) {
    if (!cm_pipe_failed(p)) return 0;
    /* A stage that reports its neighbour's failure may speak first: give
     * closed connections a moment to show as lost. */
    cm_sleep_ms(200);
    char why[600];
    pthread_mutex_lock(&p->mu);
    snprintf(why, sizeof why, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    cm_coord_log(p, "failure: %s; re-planning on the survivors", why);
    int rc = 0;
    /* Test hook (tests/sh/cluster_failover.sh shows it fails without recovery). */
    if (getenv("CUMULO_TEST_NO_RECOVER")) rc = cm_errf(err, errlen, CM_EAGAIN, "recovery disabled");
    for (int attempt = 0; attempt < 3 && !rc; attempt++) {
        rc = recover_once(p, err, errlen);
        if (!rc) {
            cm_coord_log(p, "recovered: %d stages, epoch %llu", p->n_stages, (unsigned long long)atomic_load(&p->epoch));
            return 0;
        }
        if (rc == CM_EAGAIN) break;
        cm_coord_log(p, "re-plan failed: %s", err);
    }
    /* Stay failed with the reason (CM_EAGAIN when no survivor can take the
     * layers: serve answers new requests 503): every later request gets it. */
    char e2[400];
    snprintf(e2, sizeof e2, "%s", err);
    pthread_mutex_lock(&p->mu);
    p->fatal = rc < 0 ? rc : CM_EIO;
    snprintf(p->fatal_text, sizeof p->fatal_text, "%.250s; the cluster cannot continue: %.250s", why, e2);
    pthread_cond_broadcast(&p->cv);
    cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    return rc;
}
