/*
 * coord_ep.c: hot-expert replication on the coordinator's side (issue 13).
 * The routing counts given at open (--expert-load) go into every plan the
 * pipe asks for (opening and re-plans alike, through coord_plan.c's one
 * plan-change path), so the planner (sched/replicas.c) gives the hot experts
 * more holders; each member learns every member's replicas in its ASSIGN,
 * and this machine, rank 0 of stage 0, derives the holders of each expert
 * from the running plan for its forward pass and its exchange (ep_gather.c).
 * Without given counts the coordinator measures them: its own context routes
 * every token of its layers (every member of an expert group does), so its
 * counts are the group's, and rank 0 of every later stage reports its
 * layers' counts in EXPERT_LOAD messages (deltas, about every heartbeat
 * while it computes; cm_coord_on_expert_load checks and sums them), so the
 * counts cover every layer; while idle, after a warm-up, cm_coord_ep_rebalance
 * asks the re-plan question with them and applies an answer that moves
 * experts or replicas and is predicted faster, through the same one plan
 * change as a recovery (no other way to switch plans exists). It never
 * changes a plan while a forward pass runs, and it never counts anything
 * itself: the counts are the model's (model.h's cm_ctx_expert_hits).
 */
#include "cluster/coord_impl.h"
#include "cluster/ep_load.h"

#include <stdio.h>
#include <string.h>

void cm_coord_ep_init(cm_pipe *p, const cm_plan_request *q) {
    p->ep_warmup = q->expert_load ? -1 : q->expert_warmup ? q->expert_warmup : CM_PIPE_EXPERT_WARMUP;
    atomic_store(&p->ep_load_src, q->expert_load ? CM_EXPERT_LOAD_GIVEN : CM_EXPERT_LOAD_UNIFORM);
}

/* Cells of the per-layer arrays: n_layer x n_expert. */
static size_t cells(const cm_pipe *p) { return (size_t)p->m->hp.n_layer * (size_t)p->m->hp.n_expert; }

void cm_pipe_expert_observe(cm_pipe *p, int il, const uint64_t *hits, int n) {
    const int nx = p->m->hp.n_expert;
    if (p->ep_warmup < 0 || nx <= 0 || n != nx || il < 0 || il >= p->m->hp.n_layer) return;
    if (!p->ep_local && !(p->ep_local = cm_calloc(cells(p), sizeof *p->ep_local))) return;
    memcpy(p->ep_local + (size_t)il * (size_t)nx, hits, (size_t)nx * sizeof *hits);
}

void cm_pipe_expert_reported(const cm_pipe *p, int il, uint64_t *hits, int n) {
    const int nx = p->m->hp.n_expert, nl = p->m->hp.n_layer;
    if (nx <= 0 || n != nx || il >= nl) return;
    cm_pipe *w = (cm_pipe *)p; /* the lock only */
    pthread_mutex_lock(&w->info_mu);
    for (int l = il < 0 ? 0 : il; p->ep_remote && l < (il < 0 ? nl : il + 1); l++)
        for (int e = 0; e < nx; e++) hits[e] += p->ep_remote[(size_t)l * (size_t)nx + (size_t)e];
    pthread_mutex_unlock(&w->info_mu);
}

/* Log a refused EXPERT_LOAD (at most once a second; every one is counted). */
static void refuse(cm_pipe *p, remote *r, const char *why) {
    atomic_fetch_add(&p->ep_refused, 1);
    uint64_t now = cm_now_ns();
    pthread_mutex_lock(&p->info_mu);
    bool log = now - p->ep_refused_log_ns >= 1000000000ull || !p->ep_refused_log_ns;
    if (log) p->ep_refused_log_ns = now;
    pthread_mutex_unlock(&p->info_mu);
    if (log) CM_LOGW("EXPERT_LOAD from %s ('%s') refused: %s", r->addr, r->hello.name, why);
}

void cm_coord_on_expert_load(cm_pipe *p, remote *r, const cm_msg_expert_load *q) {
    const int nx = p->m->hp.n_expert, nl = p->m->hp.n_layer;
    char why[200];
    /* An earlier plan's counts (sent while a re-plan was on its way): its
     * layers may have moved; dropped, not refused (any re-plan races them). */
    if (q->epoch != atomic_load(&p->epoch)) return;
    pthread_mutex_lock(&p->info_mu); /* the published members: this plan's stages, as the dashboard sees them */
    int rc = cm_ep_load_check(p->members, p->n_members, r->addr, q, nl, nx, why, sizeof why); /* ep_load.c */
    if (!rc && !p->ep_remote && !(p->ep_remote = cm_calloc(cells(p), sizeof *p->ep_remote)))
        rc = cm_errf(why, sizeof why, CM_ENOMEM, "out of memory");
    if (!rc) {
        for (uint32_t i = 0; i < (uint32_t)q->n_layers * q->n_expert; i++)
            p->ep_remote[(size_t)q->layer_begin * (size_t)nx + i] += cm_msg_expert_load_count(q, i);
        atomic_fetch_add(&p->ep_reports, 1);
    }
    pthread_mutex_unlock(&p->info_mu);
    if (rc) refuse(p, r, why);
}

void cm_pipe_expert_info(const cm_pipe *p, cm_cluster_experts *out) {
    static const char *const src[] = {"uniform", "given", "measured"};
    int s = atomic_load(&p->ep_load_src);
    out->load = src[s >= 0 && s < 3 ? s : 0];
    out->warmup = p->ep_warmup;
    out->replans = atomic_load(&p->ep_replans);
    out->exchange_bytes = atomic_load(&p->ep_sent);
    out->exchange_rows = atomic_load(&p->ep_rows);
    out->reports = atomic_load(&p->ep_reports);
    out->refused = atomic_load(&p->ep_refused);
}

void cm_coord_member_experts(const cm_plan_stage *st, int k, cm_cluster_member *o) {
    const cm_plan_member *mb = &st->members[k];
    o->ep = st->ep && st->n_members > 1;
    o->expert_begin = mb->expert_begin;
    o->expert_end = mb->expert_end;
    o->n_replicas = o->ep ? CM_MIN(mb->n_replicas, (int)CM_ARRAY_LEN(o->replicas)) : 0;
    for (int i = 0; i < o->n_replicas; i++) o->replicas[i] = mb->replicas[i];
}

static bool has_group(const cm_plan *pl) {
    for (int s = 0; s < pl->n_stages; s++)
        if (pl->stages[s].ep && pl->stages[s].n_members > 1) return true;
    return false;
}

/* Whether two plans put the same layers and experts on the same nodes. */
static bool same_experts(const cm_plan *a, const cm_plan *b) {
    if (a->n_stages != b->n_stages) return false;
    for (int s = 0; s < a->n_stages; s++) {
        const cm_plan_stage *x = &a->stages[s], *y = &b->stages[s];
        if (x->n_members != y->n_members || x->ep != y->ep || x->first_layer != y->first_layer ||
            x->last_layer != y->last_layer)
            return false;
        for (int k = 0; k < x->n_members; k++) {
            const cm_plan_member *u = &x->members[k], *v = &y->members[k];
            if (u->node != v->node || u->expert_begin != v->expert_begin || u->expert_end != v->expert_end ||
                u->n_replicas != v->n_replicas ||
                memcmp(u->replicas, v->replicas, (size_t)u->n_replicas * sizeof u->replicas[0]))
                return false;
        }
    }
    return true;
}

/* The pace replicas set out to lower: the slowest expert-group member's
 * share of the routed assignments over its memory bandwidth (its expert
 * bytes per token; sched/replicas.c balances exactly this). */
static double expert_pace(const cm_plan *pl, const cm_plan_cluster *c) {
    double worst = 0;
    for (int s = 0; s < pl->n_stages; s++)
        for (int k = 0; pl->stages[s].ep && pl->stages[s].n_members > 1 && k < pl->stages[s].n_members; k++) {
            const cm_plan_member *mb = &pl->stages[s].members[k];
            const double bw = c->nodes[mb->node].mem_bw > 0 ? c->nodes[mb->node].mem_bw : 1e9;
            worst = CM_MAX(worst, mb->expert_share / bw);
        }
    return worst;
}

/* Whether the answer pl is worth a plan change (every session recomputes
 * its history): not predicted slower than the running plan priced under
 * the same counts, and predicted more than 2% faster or its slowest member's
 * expert pace at least 10% lower (in a small model the dense part, read by
 * every member, hides the experts' imbalance from the speed). */
static bool worth(cm_pipe *p, const cm_plan *pl, double cand, double cur, double *pace, double *pace_now) {
    cm_plan_cluster *c = cm_calloc(1, sizeof *c);
    cm_plan *now = cm_calloc(1, sizeof *now);
    *pace = *pace_now = 0;
    if (c && now) {
        cm_coord_make_cluster(p, c);
        *now = p->plan;
        cm_plan_expert_shares_by_layer(now, p->expert_load, p->expert_load_layers, p->m->hp.n_layer, p->m->hp.n_expert);
        *pace = expert_pace(pl, c);
        *pace_now = expert_pace(now, c);
    }
    cm_free(c);
    cm_free(now);
    return cand >= cur && (cand > 1.02 * cur || *pace < 0.9 * *pace_now);
}

int cm_coord_ep_rebalance(cm_pipe *p, char *err, size_t errlen) {
    const int nx = p->m->hp.n_expert;
    const size_t nc = cells(p);
    if (p->ep_warmup < 0 || nx <= 0 || !p->ep_local || !has_group(&p->plan)) return 0;
    if (!p->ep_now && !(p->ep_now = cm_calloc(nc, sizeof *p->ep_now))) return 0;
    if (!p->ep_seen && !(p->ep_seen = cm_calloc(nc, sizeof *p->ep_seen))) return 0;
    /* every layer's count: this machine's own plus what the later stages reported */
    pthread_mutex_lock(&p->info_mu);
    for (size_t i = 0; i < nc; i++) p->ep_now[i] = p->ep_local[i] + (p->ep_remote ? p->ep_remote[i] : 0);
    pthread_mutex_unlock(&p->info_mu);
    uint64_t fresh = 0;
    for (size_t i = 0; i < nc; i++)
        fresh += p->ep_now[i] >= p->ep_seen[i] ? p->ep_now[i] - p->ep_seen[i] : p->ep_now[i];
    if (fresh < (uint64_t)p->ep_warmup * (uint64_t)nx) return 0;
    uint64_t *load = cm_calloc((size_t)nx, sizeof *load), *by_layer = cm_malloc(nc * sizeof *by_layer);
    cm_plan *pl = cm_calloc(1, sizeof *pl);
    if (!load || !by_layer || !pl) {
        cm_free(load);
        cm_free(by_layer);
        cm_free(pl);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    /* the counts of earlier looks weigh half at each look: a moving skew is followed */
    const bool had = atomic_load(&p->ep_load_src) == CM_EXPERT_LOAD_MEASURED && p->expert_load_layers;
    for (size_t i = 0; i < nc; i++) {
        uint64_t d = p->ep_now[i] >= p->ep_seen[i] ? p->ep_now[i] - p->ep_seen[i] : p->ep_now[i];
        by_layer[i] = (had ? p->expert_load_layers[i] / 2 : 0) + d;
        p->ep_seen[i] = p->ep_now[i];
        load[i % (size_t)nx] += by_layer[i];
    }
    int hot = 0;
    uint64_t sum = 0;
    for (int e = 0; e < nx; e++) {
        sum += load[e];
        if (load[e] > load[hot]) hot = e;
    }
    cm_free(p->expert_load);
    p->expert_load = load; /* every later plan of the pipe (recoveries too) is asked with them */
    cm_free(p->expert_load_layers);
    p->expert_load_layers = by_layer; /* ... and each expert group with its own stage's layers */
    atomic_store(&p->ep_load_src, CM_EXPERT_LOAD_MEASURED);
    double cand = 0, cur = 0;
    int rc = cm_coord_replan_replicas(p, pl, &cand, &cur, err, errlen); /* the same stages, replicas placed anew */
    if (rc || same_experts(pl, &p->plan)) { /* nothing fits (a recovery will say), or nothing moves */
        cm_free(pl);
        return 0;
    }
    char what[600];
    int o = snprintf(what, sizeof what, "expert load measured (%llu new assignments; expert %d takes %.1f%%",
                     (unsigned long long)fresh, hot, sum ? 100.0 * (double)load[hot] / (double)sum : 0.0);
    for (int s = 0; s < p->plan.n_stages && p->plan.n_stages > 1 && o < (int)sizeof what; s++) {
        const cm_plan_stage *st = &p->plan.stages[s]; /* each expert group's own layers */
        if (!st->ep || st->n_members < 2) continue;
        uint64_t ssum = 0, shot = 0;
        int sh = 0;
        for (int e = 0; e < nx; e++) {
            uint64_t v = 0;
            for (int l = st->first_layer; l < st->last_layer; l++) v += by_layer[(size_t)l * (size_t)nx + (size_t)e];
            ssum += v;
            if (v > shot) shot = v, sh = e;
        }
        o += snprintf(what + o, sizeof what - (size_t)o, ", of stage %d's layers [%d, %d) expert %d %.1f%%", s,
                      st->first_layer, st->last_layer, sh, ssum ? 100.0 * (double)shot / (double)ssum : 0.0);
    }
    if (o < (int)sizeof what) snprintf(what + o, sizeof what - (size_t)o, ")");
    double pace, pace_now;
    const bool take = worth(p, pl, cand, cur, &pace, &pace_now);
    cm_coord_log(p, "%s: %s, predicted %.1f tok/s vs %.1f now, slowest member's expert share / bandwidth %.3g vs %.3g",
                 what, take ? "re-planning the experts" : "re-plan not taken", cand, cur, pace, pace_now);
    if (!take) {
        cm_free(pl);
        return 0;
    }
    rc = cm_coord_apply_plan(p, pl, "expert load measured", err, errlen);
    cm_free(pl);
    if (!rc) {
        atomic_fetch_add(&p->ep_replans, 1);
        return 1;
    }
    char e2[600];
    snprintf(e2, sizeof e2, "%s", err);
    rc = cm_pipe_recover(p, err, errlen); /* back on a plan that works */
    return rc ? rc : cm_errf(err, errlen, CM_EIO, "%s", e2);
}

int cm_coord_expert_load(cm_pipe *p, const uint64_t *load, int n, char *err, size_t errlen) {
    const int nx = p->m->hp.n_expert;
    if (nx <= 0) return cm_errf(err, errlen, CM_EINVAL, "--expert-load for a model without experts");
    if (n != nx)
        return cm_errf(err, errlen, CM_EINVAL, "--expert-load gives %d counts, the model has %d experts", n, nx);
    uint64_t *c = cm_malloc((size_t)nx * sizeof *c);
    if (!c) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    memcpy(c, load, (size_t)nx * sizeof *c);
    cm_free(p->expert_load);
    p->expert_load = c;
    return 0;
}

static bool has_replicas(const cm_plan_stage *st) {
    for (int k = 0; st->ep && k < st->n_members; k++)
        if (st->members[k].n_replicas > 0) return true;
    return false;
}

const uint32_t *cm_coord_ep_holders(cm_pipe *p) {
    const cm_plan_stage *st0 = &p->plan.stages[0];
    const int nx = p->m->hp.n_expert;
    if (nx <= 0 || st0->n_members < 2 || !has_replicas(st0)) return NULL;
    if (!p->ep_holders && !(p->ep_holders = cm_calloc((size_t)nx, sizeof *p->ep_holders))) return NULL;
    for (int e = 0; e < nx; e++) p->ep_holders[e] = cm_plan_expert_holders(st0, e);
    return p->ep_holders;
}

void cm_coord_replicas_text(const cm_plan_stage *st, char *out, size_t n) {
    size_t o = 0;
    out[0] = 0;
    if (!has_replicas(st)) return;
    bool first = true;
    o += (size_t)snprintf(out, n, "; replicas:");
    for (int k = 0; k < st->n_members && o < n; k++)
        for (int i = 0; i < st->members[k].n_replicas && o < n; i++, first = false)
            o += (size_t)snprintf(out + o, n - o, "%s rank %d holds %d", first ? "" : ",", k,
                                  st->members[k].replicas[i]);
}

void cm_coord_fill_replicas(const cm_plan_stage *st, cm_msg_assign *a) {
    if (!has_replicas(st)) return;
    a->flags |= CM_ASSIGN_F_REPLICAS;
    for (int k = 0; k < st->n_members && k < (int)CM_MSG_MAX_TP; k++) {
        const int nr = CM_MIN(st->members[k].n_replicas, (int)CM_MSG_MAX_REPLICAS);
        a->n_replicas[k] = (uint8_t)nr;
        for (int i = 0; i < nr; i++) a->replicas[k][i] = (uint16_t)st->members[k].replicas[i];
    }
}
