/*
 * coord_recover.c: what the coordinator does when the set of nodes changes
 * (issue 7). cm_pipe_recover re-plans on the survivors after a loss;
 * cm_pipe_maintain, called while idle, redials lost nodes of the --nodes
 * list (and takes the nodes coord_join.c found by mDNS) and moves to a plan
 * that uses them: a pipeline or a tensor-parallel group by the planner, a
 * hybrid plan back to its opening plan. Both plan with the real planner
 * (cm_plan_make: speed, links, memory with KV counted) under a new epoch
 * (nodes drop traffic of any other epoch, so a stale node cannot act on the
 * old plan), keeping this machine's layers [0, local_last) because the
 * engine's stage-0 caches rely on them; they wait for READY and redial stage
 * 1; the engine then recomputes its sequences into the new stages. It must
 * never leave the pipe half-switched: on failure the pipe stays failed with
 * the reason.
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

static bool alive(const remote *r) { return r->ctl && r->rx_started && !atomic_load(&r->lost); }
static int rejoin_ms(void);

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
        if (!alive(r) || !refused) continue;
        cm_coord_log(p, "node %s ('%s') left out: it could not take its part: %s", r->addr, r->hello.name, r->ready_text);
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

/* Score of a plan as the planner ranks them (aggregate speed when several
 * sequences share the pipeline). */
static double score_of(const cm_plan *pl, int n_seq) { return n_seq > 1 ? pl->tok_s_aggregate : pl->tok_s; }

/* Layers [first, last) of stage s as recorded for the dashboard. */
static void stage_range(const cm_pipe *p, int s, int *first, int *last) {
    *first = *last = 0;
    for (int i = 0; i < p->n_members; i++)
        if (p->members[i].stage == s) {
            *first = p->members[i].first_layer;
            *last = p->members[i].last_layer;
            return;
        }
}

typedef struct replan_ctx {
    cm_plan_model pm;
    cm_plan_cluster full, sub;
    cm_plan cand, cur;
    int map[CM_PLAN_MAX_NODES]; /* sub-cluster node k (>= 1) is r[map[k]] */
} replan_ctx;

/* The planner's view of this machine plus the live nodes (the old stage
 * order first, then idle ones), and the best plan on it with this machine's
 * layers pinned. Fills x->cand (sub-cluster indices) and x->cur (the running
 * assignment, predicted on the same view). */
static int plan_survivors(cm_pipe *p, replan_ctx *x, char *err, size_t errlen) {
    char e[600];
    int rc = cm_plan_model_from_gguf(p->g, &x->pm, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "re-plan: %s", e);
    cm_coord_make_cluster(p, &x->full);
    int n = 1;
    bool used[CM_PLAN_MAX_NODES] = {false};
    x->map[0] = -1;
    for (int s = 1; s < p->n_stages; s++) {
        int i = p->stage_remote[s];
        used[i] = true;
        if (alive(&p->r[i])) x->map[n++] = i;
    }
    for (int i = 0; i < p->n_remote; i++)
        if (!used[i] && alive(&p->r[i])) x->map[n++] = i;
    int n_layer = p->m->hp.n_layer;
    if (n == 1)
        return cm_errf(err, errlen, CM_EAGAIN, "no node is left to run layers [%d, %d): the model does not fit on the survivors",
                       p->local_last, n_layer);
    memset(&x->sub, 0, sizeof x->sub);
    x->sub.n_nodes = n;
    for (int a = 0; a < n; a++) {
        int fa = a ? x->map[a] + 1 : 0;
        x->sub.nodes[a] = x->full.nodes[fa];
        for (int b = 0; b < n; b++) {
            int fb = b ? x->map[b] + 1 : 0;
            x->sub.rtt_s[a][b] = x->full.rtt_s[fa][fb];
            x->sub.bw[a][b] = x->full.bw[fa][fb];
            x->sub.down[a][b] = x->full.down[fa][fb];
        }
    }
    cm_plan_opts po;
    cm_plan_opts_default(&po);
    po.ctx = p->n_ctx;
    po.n_seq = p->n_seq;
    po.mode = CM_PARALLEL_PP;
    po.first_stage_layers = p->local_last;
    po.reorder = true; /* as cm_pipe_open: the order follows the measured links */
    rc = cm_plan_make(&x->pm, &x->sub, &po, &x->cand, e, sizeof e);
    if (rc)
        return cm_errf(err, errlen, CM_EAGAIN, "the model no longer fits on this machine and the %d surviving node%s: %s",
                       n - 1, n == 2 ? "" : "s", e);
    /* The running assignment on the same view (only meaningful when every
     * one of its stages is alive; cur.n_stages = 0 otherwise). */
    memset(&x->cur, 0, sizeof x->cur);
    int k = 1;
    bool whole = true;
    for (int s = 1; s < p->n_stages; s++, k++)
        if (k >= n || x->map[k] != p->stage_remote[s]) whole = false;
    if (whole && !p->fatal) {
        x->cur.n_stages = p->n_stages;
        x->cur.mode = CM_PARALLEL_PP;
        for (int s = 0; s < p->n_stages; s++) {
            cm_plan_stage *st = &x->cur.stages[s];
            st->n_members = 1;
            st->members[0] = (cm_plan_member){.node = s, .kv_head_end = x->pm.n_kv_heads, .ffn_end = x->pm.ffn,
                                              .embed = s == 0, .head = s == p->n_stages - 1};
            stage_range(p, s, &st->first_layer, &st->last_layer);
        }
        cm_plan_predict(&x->pm, &x->sub, &po, &x->cur);
    }
    return 0;
}

/* Switch to x->cand: new epoch, ASSIGN every stage, wait for READY, redial
 * stage 1, record the plan, bump the generation. */
static int apply_plan(cm_pipe *p, replan_ctx *x, const char *why, char *err, size_t errlen) {
    const cm_plan *pl = &x->cand;
    int n_st = pl->n_stages;
    int rid[CM_PLAN_MAX_NODES], lb[CM_PLAN_MAX_NODES], le[CM_PLAN_MAX_NODES];
    for (int s = 0; s < n_st; s++) {
        int k = pl->stages[s].members[0].node;
        rid[s] = k ? x->map[k] : -1;
        lb[s] = pl->stages[s].first_layer;
        le[s] = pl->stages[s].last_layer;
    }
    if (pl->stages[0].members[0].node != 0 || le[0] != p->local_last || n_st < 2)
        return cm_errf(err, errlen, CM_EINVAL, "re-plan: the plan does not keep this machine's layers [0, %d)", p->local_last);
    uint64_t ep = cm_wall_ms();
    if (ep <= atomic_load(&p->epoch)) ep = atomic_load(&p->epoch) + 1;
    atomic_store(&p->epoch, ep);
    pthread_mutex_lock(&p->send_mu);
    if (p->data) {
        cm_conn_close(p->data, NULL);
        p->data = NULL;
    }
    pthread_mutex_unlock(&p->send_mu);
    pthread_mutex_lock(&p->mu);
    p->fatal = 0;
    p->fatal_text[0] = 0;
    for (int i = 0; i < p->n_seq; i++) p->slots[i].asked = p->slots[i].got = 0;
    pthread_mutex_unlock(&p->mu);
    char line[900];
    int o = snprintf(line, sizeof line, "re-plan (epoch %llu, %s): here [0, %d)", (unsigned long long)ep, why, p->local_last);
    for (int s = 1; s < n_st && o < (int)sizeof line; s++)
        o += snprintf(line + o, sizeof line - (size_t)o, ", %s [%d, %d)", p->r[rid[s]].addr, lb[s], le[s]);
    if (o < (int)sizeof line)
        snprintf(line + o, sizeof line - (size_t)o, "; predicted %.1f tok/s (%.1f aggregate)", pl->tok_s, pl->tok_s_aggregate);
    cm_coord_log(p, "%s", line);
    for (int s = 1; s < n_st; s++) {
        int rc = cm_coord_assign_stage(p, s, n_st, rid, lb, le, err, errlen);
        if (rc) {
            cm_coord_fatal(p, rc, "re-plan: %s", err);
            return rc;
        }
    }
    int ids[CM_PLAN_MAX_NODES];
    char what[CM_PLAN_MAX_NODES][48];
    for (int s = 1; s < n_st; s++) {
        ids[s - 1] = rid[s];
        snprintf(what[s - 1], sizeof what[0], "layers [%d, %d)", lb[s], le[s]);
    }
    int rc = cm_coord_wait_ready(p, ids, (const char (*)[48])what, n_st - 1, 120, err, errlen);
    cm_msg_hello peer;
    cm_conn *d = NULL;
    if (!rc) {
        char e[400];
        rc = cm_cluster_dial(p->r[rid[1]].addr, &p->cfg, &p->hello, &d, &peer, e, sizeof e);
        if (rc) cm_errf(err, errlen, rc, "stage 1 at %s: %s", p->r[rid[1]].addr, e);
    }
    if (rc) { /* half-assigned: stay failed until the next attempt */
        cm_coord_fatal(p, rc, "re-plan: %s", err);
        return rc;
    }
    pthread_mutex_lock(&p->send_mu);
    p->data = d;
    pthread_mutex_unlock(&p->send_mu);
    p->n_stages = n_st;
    for (int s = 1; s < n_st; s++) p->stage_remote[s] = rid[s];
    /* The dashboard's record and the plan text, in the full node indices. */
    cm_plan *fp = &x->cur; /* reused: cur is no longer needed */
    *fp = *pl;
    for (int s = 0; s < n_st; s++) {
        int k = fp->stages[s].members[0].node;
        fp->stages[s].members[0].node = k ? x->map[k] + 1 : 0;
    }
    cm_coord_record_members(p, fp);
    cm_plan_format(fp, &x->pm, &x->full, p->plan_text, sizeof p->plan_text);
    p->generation++;
    return 0;
}

/* Let go of the live nodes the plan now running does not use (used[i]
 * false): a down link kept them out. A node drops its stage when its
 * coordinator's connection closes, so none keeps a stage of an old epoch;
 * cm_pipe_maintain redials them like lost nodes, and a re-plan takes them
 * back once the link is up again. */
static void release_unused(cm_pipe *p, const bool *used) {
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (used[i] || !alive(r)) continue;
        cm_coord_log(p, "node %s ('%s') is not in the plan: released until a re-plan takes it back", r->addr, r->hello.name);
        atomic_store(&r->released, true);
        pthread_join(r->rx, NULL);
        r->rx_started = false;
        cm_conn_close(r->ctl, "not in the current plan");
        r->ctl = NULL;
        r->ready = false;
        atomic_store(&r->lost, true);
        atomic_store(&r->released, false);
    }
}

/* Whether every node of the running plan is still alive: then no lost node
 * explains the failure (a link between two of them was cut, or is stuck). */
static bool plan_nodes_alive(const cm_pipe *p) {
    for (int s = 1; s < p->n_stages; s++)
        if (!alive(&p->r[p->stage_remote[s]])) return false;
    return true;
}

/* One re-plan after a loss. When no node was lost, or the previous re-plan
 * failed (a stage could not reach its next one), the links between the live
 * nodes are measured again first: a cut pair is then marked down and the
 * planner keeps the two apart (leaving one out if it must), instead of
 * making them neighbours again from the matrix measured at the start. */
static int recover_once(cm_pipe *p, char *err, size_t errlen) {
    if (p->grouped) return cm_coord_tp_recover(p, err, errlen); /* hybrid: tensor-parallel groups as stages (coord_tp.c) */
    reap_lost(p);
    if (p->links_suspect || plan_nodes_alive(p)) {
        int changed = cm_coord_recheck_links(p, false);
        if (changed) p->next_link_check_ns = cm_now_ns() + 2ull * (uint64_t)rejoin_ms() * 1000000ull;
    }
    replan_ctx *x = cm_calloc(1, sizeof *x);
    if (!x) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    pthread_mutex_lock(&p->mu);
    p->fatal = CM_EIO; /* plan_survivors must not take the broken plan for a running one */
    pthread_mutex_unlock(&p->mu);
    int rc = plan_survivors(p, x, err, errlen);
    if (!rc) rc = apply_plan(p, x, "recovery", err, errlen);
    p->links_suspect = rc != 0;
    if (!rc) {
        bool used[CM_PLAN_MAX_NODES] = {false};
        for (int s = 1; s < p->n_stages; s++) used[p->stage_remote[s]] = true;
        release_unused(p, used);
    }
    cm_free(x);
    return rc;
}

/* The planner's tensor-parallel group of this machine and every live node
 * (KV heads and FFN rows by speed; memory checked): x->cand in the indices
 * of the live sub-cluster, x->cur the same plan in the full node indices. */
static int tp_plan_alive(cm_pipe *p, replan_ctx *x, cm_plan_opts *po, char *err, size_t errlen) {
    char e[600];
    int rc = cm_plan_model_from_gguf(p->g, &x->pm, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "re-plan: %s", e);
    cm_coord_make_cluster(p, &x->full);
    int n = 1;
    x->map[0] = -1;
    for (int i = 0; i < p->n_remote; i++)
        if (alive(&p->r[i])) x->map[n++] = i;
    memset(&x->sub, 0, sizeof x->sub);
    x->sub.n_nodes = n;
    for (int a = 0; a < n; a++) {
        int fa = a ? x->map[a] + 1 : 0;
        x->sub.nodes[a] = x->full.nodes[fa];
        for (int b = 0; b < n; b++) {
            int fb = b ? x->map[b] + 1 : 0;
            x->sub.rtt_s[a][b] = x->full.rtt_s[fa][fb];
            x->sub.bw[a][b] = x->full.bw[fa][fb];
            x->sub.down[a][b] = x->full.down[fa][fb];
        }
    }
    cm_plan_opts_default(po);
    po->ctx = p->n_ctx;
    po->n_seq = p->n_seq;
    po->mode = CM_PARALLEL_TP;
    rc = cm_plan_make(&x->pm, &x->sub, po, &x->cand, e, sizeof e);
    if (rc)
        return cm_errf(err, errlen, CM_EAGAIN, "the model no longer fits on this machine and the %d surviving node%s: %s",
                       n - 1, n == 2 ? "" : "s", e);
    x->cur = x->cand;
    cm_plan_stage *st = &x->cur.stages[0];
    for (int k = 0; k < st->n_members; k++) {
        int j = st->members[k].node;
        st->members[k].node = j ? x->map[j] + 1 : 0;
    }
    return 0;
}

/* Switch the tensor-parallel group to x->cur (full indices) under a new
 * epoch: leave the old group (closing our rank links wakes members blocked
 * in an all-reduce with us) and open the new one. A group of this machine
 * alone computes every slice itself (it maps the whole model anyway). */
static int tp_switch(cm_pipe *p, replan_ctx *x, const char *why, char *err, size_t errlen) {
    cm_coll_free(p->coll);
    p->coll = NULL;
    cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
    cm_plan *fp = &x->cur;
    cm_plan_stage *st = &fp->stages[0];
    for (int k = 0; k < st->n_members; k++)
        if (st->members[k].node) p->r[st->members[k].node - 1].ready = false;
    uint64_t ep = cm_wall_ms();
    if (ep <= atomic_load(&p->epoch)) ep = atomic_load(&p->epoch) + 1;
    atomic_store(&p->epoch, ep);
    pthread_mutex_lock(&p->mu);
    p->fatal = 0;
    p->fatal_text[0] = 0;
    for (int i = 0; i < p->n_seq; i++) p->slots[i].asked = p->slots[i].got = 0;
    pthread_mutex_unlock(&p->mu);
    cm_coord_log(p, "re-plan (epoch %llu, %s): tensor-parallel group of %d (this machine and %d node%s)",
                 (unsigned long long)ep, why, st->n_members, st->n_members - 1, st->n_members == 2 ? "" : "s");
    int rc = 0;
    if (st->n_members > 1 && st->members[0].node == 0) {
        rc = cm_coord_tp_open(p, fp, err, errlen);
    } else if (st->n_members == 1 && st->members[0].node == 0) {
        p->tp_size = 1; /* every slice here: no all-reduce */
        p->tp_slice = (cm_slice){0, p->m->hp.n_head_kv, 0, p->m->hp.n_ff};
        if (p->tp_plan) *p->tp_plan = *fp; /* the group running now (a later rejoin compares with it) */
        cm_coord_log(p, "tensor parallel: this machine alone now, every KV head and FFN row");
    } else {
        rc = cm_errf(err, errlen, CM_EINVAL, "re-plan: the group does not start on this machine");
    }
    if (!rc) {
        cm_coord_record_members(p, fp);
        cm_plan_format(fp, &x->pm, &x->full, p->plan_text, sizeof p->plan_text);
        p->generation++;
        /* A live node out of the group (a down link) must not get the
         * group's sequence messages (cm_coord_send_data sends to every
         * connected node). */
        bool used[CM_PLAN_MAX_NODES] = {false};
        for (int k = 0; k < st->n_members; k++)
            if (st->members[k].node) used[st->members[k].node - 1] = true;
        release_unused(p, used);
    } else {
        cm_coord_fatal(p, rc, "re-plan: %s", err);
    }
    return rc;
}

/* One re-formation of a tensor-parallel group on the survivors. */
static int tp_recover_once(cm_pipe *p, char *err, size_t errlen) {
    cm_coll_free(p->coll);
    p->coll = NULL;
    cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
    /* No member lost (a link between two of them cut?), or the last try
     * failed: measure the links between the live nodes again, so the group
     * leaves one of a cut pair out (the planner's down links). */
    if (!reap_lost(p) || p->links_suspect) cm_coord_recheck_links(p, false);
    replan_ctx *x = cm_calloc(1, sizeof *x);
    if (!x) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    cm_plan_opts po;
    int rc = tp_plan_alive(p, x, &po, err, errlen);
    if (!rc) rc = tp_switch(p, x, "recovery", err, errlen);
    p->links_suspect = rc != 0;
    cm_free(x);
    return rc;
}

/* Idle, nothing failed, nodes back or new: a tensor-parallel group of every
 * machine takes the planner's group of every live node when it has more
 * members and is not predicted more than 10% slower (or is predicted more
 * than 5% faster). A hybrid plan goes back to the plan it opened with once
 * every member of it is alive again (NEEDSWORK: re-plan hybrid groups with
 * the planner, new nodes included). Returns 1 when the plan changed. */
static int tp_rejoin(cm_pipe *p, char *err, size_t errlen) {
    if (!p->tp_plan) return 0;
    replan_ctx *x = cm_calloc(1, sizeof *x);
    cm_plan *now = cm_calloc(1, sizeof *now);
    int rc = x && now ? 0 : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (rc) goto out;
    if (!p->tp) { /* hybrid */
        const cm_plan *o = p->orig_plan;
        int members = 0, whole = o != NULL;
        for (int s = 0; o && s < o->n_stages; s++)
            for (int k = 0; k < o->stages[s].n_members; k++) {
                int nd = o->stages[s].members[k].node;
                if (nd && !alive(&p->r[nd - 1])) whole = 0;
                members++;
            }
        int cur_members = 0;
        for (int s = 0; s < p->tp_plan->n_stages; s++) cur_members += p->tp_plan->stages[s].n_members;
        if (!whole || members <= cur_members || o->stages[0].last_layer != p->local_last) goto out;
        *now = *o;
        pthread_mutex_lock(&p->send_mu);
        if (p->data) cm_conn_close(p->data, NULL);
        p->data = NULL;
        pthread_mutex_unlock(&p->send_mu);
        cm_coll_free(p->coll);
        p->coll = NULL;
        cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
        uint64_t ep = cm_wall_ms();
        if (ep <= atomic_load(&p->epoch)) ep = atomic_load(&p->epoch) + 1;
        atomic_store(&p->epoch, ep);
        pthread_mutex_lock(&p->mu);
        p->fatal = 0;
        p->fatal_text[0] = 0;
        for (int i = 0; i < p->n_seq; i++) p->slots[i].asked = p->slots[i].got = 0;
        pthread_mutex_unlock(&p->mu);
        cm_coord_log(p, "re-plan (epoch %llu, nodes back): every member of the opening plan is back; %d members again",
                     (unsigned long long)ep, members);
        rc = cm_coord_tp_open(p, now, err, errlen);
        if (!rc) {
            p->n_stages = now->n_stages;
            for (int s = 1; s < now->n_stages; s++) p->stage_remote[s] = now->stages[s].members[0].node - 1;
            cm_coord_record_members(p, now);
            p->generation++;
            cm_coord_log(p, "now the opening plan again: %d members in %d stages, epoch %llu", members, now->n_stages,
                         (unsigned long long)ep);
            rc = 1;
        } else {
            cm_coord_fatal(p, rc, "re-plan: %s", err);
        }
        goto out;
    }
    cm_plan_opts po;
    rc = tp_plan_alive(p, x, &po, err, errlen);
    if (rc) { rc = 0; goto out; } /* the running group stays */
    *now = *p->tp_plan;
    cm_plan_predict(&x->pm, &x->full, &po, now);
    double cand = score_of(&x->cand, p->n_seq), cur = score_of(now, p->n_seq);
    int grow = x->cand.stages[0].n_members > now->stages[0].n_members;
    if (grow && cand < 0.9 * cur) {
        cm_coord_log(p, "re-plan with the returning node(s) not taken: predicted %.1f tok/s vs %.1f now", cand, cur);
    } else if (grow || cand > 1.05 * cur) {
        rc = tp_switch(p, x, "nodes back or new", err, errlen);
        if (!rc) {
            cm_coord_log(p, "now a tensor-parallel group of %d, epoch %llu", p->tp_size,
                         (unsigned long long)atomic_load(&p->epoch));
            rc = 1;
        }
    }
out:
    cm_free(now);
    cm_free(x);
    return rc;
}

int cm_pipe_tp_recover(cm_pipe *p, char *err, size_t errlen) {
    if (!p->tp) return cm_errf(err, errlen, CM_EINVAL, "not a tensor-parallel group");
    /* An all-reduce may fail before the receiver threads declare the node
     * lost: the group is broken either way. */
    if (!cm_pipe_failed(p)) cm_coord_fatal(p, CM_EIO, "an all-reduce of the tensor-parallel group failed");
    return cm_pipe_recover(p, err, errlen);
}

static int rejoin_ms(void) {
    const char *env = getenv("CUMULO_REJOIN_MS"); /* tests: sooner */
    return env && atoi(env) >= 100 ? atoi(env) : CM_PIPE_REJOIN_MS;
}

/* Recovery gave up, but nodes are still alive: a cut link between them may
 * have healed since (nobody was lost, so nobody is redialled). Worth another
 * try once per rejoin interval. */
static bool retry_due(const cm_pipe *p) {
    if (!p->gave_up || cm_now_ns() < p->gave_up_ns + (uint64_t)rejoin_ms() * 1000000ull) return false;
    for (int i = 0; i < p->n_remote; i++)
        if (alive(&p->r[i])) return true;
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
            if (!alive(r) || atomic_load(&r->loading)) continue;
            uint64_t heard = atomic_load(&r->last_rx_ns);
            if (now > heard && now - heard > 2ull * CM_PIPE_HB_MS * 1000000ull) doubt = true;
        }
        if (!doubt) return;
        cm_sleep_ms(20);
    }
}

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
    char why[300];
    pthread_mutex_lock(&p->mu);
    snprintf(why, sizeof why, "%.299s", p->cause[0] ? p->cause : p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    cm_coord_log(p, "failure: %s; re-planning on the survivors", why);
    int rc = 0;
    /* Test hook (tests/sh/cluster_failover.sh shows it fails without recovery). */
    if (getenv("CUMULO_TEST_NO_RECOVER")) rc = cm_errf(err, errlen, CM_EAGAIN, "recovery disabled");
    for (int attempt = 0; attempt < 3 && !rc; attempt++) {
        rc = p->tp ? tp_recover_once(p, err, errlen) : recover_once(p, err, errlen);
        if (!rc) {
            p->cause[0] = 0;
            if (p->tp) cm_coord_log(p, "recovered: tensor-parallel group of %d, epoch %llu", p->tp_size,
                                    (unsigned long long)atomic_load(&p->epoch));
            else cm_coord_log(p, "recovered: %d stages, epoch %llu", p->n_stages, (unsigned long long)atomic_load(&p->epoch));
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
        if (!rc) rc = cm_cluster_measure(c, 1 << 16, &rtt, &bw, e, sizeof e);
        if (!rc) rc = cm_cluster_measure(c, 1 << 16, &rtt2, &bw2, e, sizeof e);
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
    int every_ms = CM_PIPE_REJOIN_MS;
    const char *env = getenv("CUMULO_REJOIN_MS"); /* tests: sooner */
    if (env && atoi(env) >= 100) every_ms = atoi(env);
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
    if (!back && !healed) return 0;
    if (p->grouped) { /* tensor-parallel groups (coord_tp.c opens them) */
        int rc = tp_rejoin(p, err, errlen);
        if (rc < 0) {
            char e2[600];
            snprintf(e2, sizeof e2, "%s", err);
            drop_refusers(p);
            rc = cm_pipe_recover(p, err, errlen); /* back on the nodes that work */
            if (!rc) rc = cm_errf(err, errlen, CM_EIO, "%s", e2);
        }
        return rc;
    }
    replan_ctx *x = cm_calloc(1, sizeof *x);
    if (!x) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int rc = plan_survivors(p, x, err, errlen);
    double cand = rc ? 0 : score_of(&x->cand, p->n_seq), cur = x->cur.n_stages ? score_of(&x->cur, p->n_seq) : 0;
    if (!rc && x->cand.n_stages > p->n_stages && cand < 0.9 * cur) {
        cm_coord_log(p, "re-plan with the returning node(s) not taken: predicted %.1f tok/s vs %.1f now", cand, cur);
    } else if (!rc && (x->cand.n_stages > p->n_stages || cand > 1.05 * cur)) {
        rc = apply_plan(p, x, back ? "nodes back or new" : "link back", err, errlen);
        if (!rc) {
            cm_coord_log(p, "now %d stages, epoch %llu", p->n_stages, (unsigned long long)atomic_load(&p->epoch));
            bool used[CM_PLAN_MAX_NODES] = {false};
            for (int s = 1; s < p->n_stages; s++) used[p->stage_remote[s]] = true;
            release_unused(p, used);
            rc = 1;
        } else {
            char e2[600];
            snprintf(e2, sizeof e2, "%s", err);
            drop_refusers(p);
            rc = cm_pipe_recover(p, err, errlen); /* back on the nodes that work */
            if (!rc) rc = cm_errf(err, errlen, CM_EIO, "%s", e2);
        }
    }
    cm_free(x);
    return rc;
}
