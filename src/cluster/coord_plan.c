/*
 * coord_plan.c: the one way the coordinator changes who runs what. A plan
 * (sched/plan.h: stages of tensor-parallel groups; a pipeline is groups of
 * one, a tensor-parallel group of every machine is one stage) is applied as
 * one transaction, cm_coord_apply_plan, whether the cluster opens, recovers
 * from a loss, takes nodes back or takes new ones: new epoch, old links
 * dropped, one ASSIGN builder for every member, one READY wait, links
 * dialled, the record published, unused nodes released. Opening and
 * re-planning differ only in the question asked of the planner; the
 * re-plan's question is cm_coord_replan.
 *
 * It must never leave the pipe half-switched: until the last step succeeds
 * the running record (p->plan) is the old one and a failure leaves the pipe
 * failed with the reason, so that the next recovery starts from a known
 * state. It holds no lock across a network wait that the data path needs.
 */
#include "cluster/coord_impl.h"
#include "sched/simulate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ASSIGN of member k of stage s of plan: its layers, its slice, its
 * group's peers and the next stage's first member. */
static void fill_assign(cm_pipe *p, const cm_plan *plan, int s, int k, cm_msg_assign *a) {
    const cm_plan_stage *st = &plan->stages[s];
    const cm_plan_member *mb = &st->members[k];
    const cm_hparams *hp = &p->m->hp;
    int n = st->n_members;
    memset(a, 0, sizeof *a);
    a->epoch = atomic_load(&p->epoch);
    memcpy(a->model_sha256, p->sha, 32);
    const char *base = strrchr(p->model_path, '/');
    snprintf(a->model_name, sizeof a->model_name, "%.63s", base ? base + 1 : p->model_path);
    a->n_layers = (uint32_t)hp->n_layer;
    a->layer_begin = (uint32_t)st->first_layer;
    a->layer_end = (uint32_t)st->last_layer;
    a->flags = (s == 0 ? CM_ASSIGN_F_EMBED : 0) | (s == plan->n_stages - 1 ? CM_ASSIGN_F_OUTPUT : 0) |
               (n > 1 && p->tp_compress && !st->ep ? CM_ASSIGN_F_TP_Q8 : 0) | (p->take ? CM_ASSIGN_F_TAKE : 0) |
               (cm_pipe_plan_head_split(plan) ? CM_ASSIGN_F_HEAD : 0);
    cm_coord_lora_fill(p, plan, s, k, a);             /* its parts of the LoRA adapters (coord_lora.c) */
    if (p->kv_type_k || p->kv_type_v || p->kv_rows) { /* the engine's KV cache types (default F32: no field) */
        a->flags |= CM_ASSIGN_F_KV;
        a->kv_type_k = (uint8_t)p->kv_type_k;
        a->kv_type_v = (uint8_t)p->kv_type_v;
        a->kv_rows = p->kv_rows;
    }
    if (st->ep && n > 1) { /* expert group: every member's experts, so each knows whose rows are whose */
        a->flags |= CM_ASSIGN_F_EP;
        for (int j = 0; j < n; j++) a->expert_bounds[j] = (uint16_t)st->members[j].expert_begin;
        a->expert_bounds[n] = (uint16_t)st->members[n - 1].expert_end;
        cm_coord_fill_replicas(st, a); /* hot experts' extra holders (coord_ep.c) */
    }
    a->head_begin = (uint32_t)mb->kv_head_begin;
    a->head_end = (uint32_t)mb->kv_head_end;
    a->ffn_begin = (uint32_t)mb->ffn_begin;
    a->ffn_end = (uint32_t)mb->ffn_end;
    a->n_ctx = (uint32_t)p->n_ctx;
    a->n_seq_max = (uint32_t)p->n_seq;
    a->stage = (uint16_t)s;
    a->n_stages = (uint16_t)plan->n_stages;
    a->hidden_dtype = CM_HIDDEN_F32;
    a->tp_rank = (uint8_t)k;
    a->tp_size = (uint8_t)n;
    for (int j = 0; j < n; j++) {
        int nd = st->members[j].node;
        snprintf(a->tp_peers[j], sizeof a->tp_peers[j], "%.63s", nd ? p->r[nd - 1].addr : "coordinator");
    }
    /* prev: informational ("" after this machine); next: the next group's rank 0. */
    if (s > 1) snprintf(a->prev, sizeof a->prev, "%.63s", p->r[plan->stages[s - 1].members[0].node - 1].addr);
    if (s + 1 < plan->n_stages)
        snprintf(a->next, sizeof a->next, "%.63s", p->r[plan->stages[s + 1].members[0].node - 1].addr);
}

static int send_assign(cm_pipe *p, const cm_plan *plan, int s, int k, char *err, size_t errlen) {
    remote *r = &p->r[plan->stages[s].members[k].node - 1];
    cm_msg m = {.type = CM_MSG_ASSIGN};
    fill_assign(p, plan, s, k, &m.u.assign);
    pthread_mutex_lock(&p->mu);
    r->ready = false;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&p->send_mu);
    atomic_store(&r->loading, true); /* under send_mu: the receiver thread sends no heartbeat from now */
    int rc = cm_conn_send(r->ctl, &m, 10000, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    if (rc) return cm_errf(err, errlen, rc, "ASSIGN to %s: %s", r->addr, err);
    return 0;
}

/* Wait until every member of plan but this machine answered READY for the
 * current epoch: 0; the first that refused its part, a failure of the pipe,
 * or timeout_s passing: an error. */
static int wait_ready(cm_pipe *p, const cm_plan *plan, int timeout_s, char *err, size_t errlen) {
    uint64_t deadline = cm_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int waiting = 0;
        for (int s = 0; s < plan->n_stages && !rc; s++)
            for (int k = 0; k < plan->stages[s].n_members && !rc; k++) {
                const cm_plan_stage *st = &plan->stages[s];
                if (!st->members[k].node) continue;
                const remote *r = &p->r[st->members[k].node - 1];
                if (!r->ready) {
                    waiting++;
                } else if (r->ready_status) {
                    char what[64];
                    if (st->n_members > 1) snprintf(what, sizeof what, "rank %d of stage %d", k, s);
                    else snprintf(what, sizeof what, "layers [%d, %d)", st->first_layer, st->last_layer);
                    rc = cm_errf(err, errlen, r->ready_status, "node %s ('%s') cannot take %s: %s", r->addr,
                                 r->hello.name, what, r->ready_text);
                }
            }
        if (p->fatal && !rc) rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
        if (rc || !waiting) break;
        if (cm_now_ns() > deadline) {
            rc = cm_errf(err, errlen, CM_ETIMEDOUT, "nodes were not ready within %d s", timeout_s);
            break;
        }
        cm_coord_wait_tick(p);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The dashboard's copy: the plan's assignment plus the HELLO facts and
 * measured links gathered while connecting. Built aside, then copied under
 * info_mu (an /api/cluster reader). */
static void publish_members(cm_pipe *p, const cm_plan *plan) {
    cm_node_caps me;
    cm_node_caps_get(&me);
    cm_cluster_member tmp[CM_ARRAY_LEN(p->members)];
    int nm = 0;
    for (int s = 0; s < plan->n_stages; s++) {
        const cm_plan_stage *st = &plan->stages[s];
        for (int k = 0; k < st->n_members && nm < (int)CM_ARRAY_LEN(tmp); k++) {
            const cm_plan_member *mb = &st->members[k];
            cm_cluster_member *o = &tmp[nm++];
            memset(o, 0, sizeof *o);
            o->stage = s;
            o->first_layer = st->first_layer;
            o->last_layer = st->last_layer;
            o->n_members = st->n_members;
            o->member = k;
            o->kv_head_begin = mb->kv_head_begin;
            o->kv_head_end = mb->kv_head_end;
            o->ffn_begin = mb->ffn_begin;
            o->ffn_end = mb->ffn_end;
            o->weight_bytes = mb->weight_bytes;
            o->kv_bytes = mb->kv_bytes;
            cm_coord_member_experts(st, k, o); /* expert range and replicas (coord_ep.c) */
            if (mb->node == 0) {
                o->local = true;
                memcpy(o->name, p->hello.name, strnlen(p->hello.name, sizeof o->name - 1));
                memcpy(o->host, p->hello.host, strnlen(p->hello.host, sizeof o->host - 1));
                o->cores = (uint32_t)me.cores;
                o->mem_total = me.mem_total;
                o->mem_free = me.mem_free;
                o->gflops = me.gflops;
            } else {
                const remote *r = &p->r[mb->node - 1];
                /* o is zeroed: copy up to one byte short (snprintf would see p and o alias) */
                memcpy(o->addr, r->addr, strnlen(r->addr, sizeof o->addr - 1));
                memcpy(o->name, r->hello.name, strnlen(r->hello.name, sizeof o->name - 1));
                memcpy(o->host, r->hello.host, strnlen(r->hello.host, sizeof o->host - 1));
                o->cores = r->hello.cores;
                o->mem_total = r->hello.mem_total;
                o->mem_free = r->hello.mem_free;
                o->gflops = r->hello.gflops;
                o->rtt_s = r->rtt;
                o->bw = r->bw;
            }
            if (s > 0 && k == 0) /* the hop into this stage */
                o->link_measured =
                    cm_coord_node_link(p, plan->stages[s - 1].members[0].node, mb->node, &o->link_rtt_s, &o->link_bw);
        }
    }
    pthread_mutex_lock(&p->info_mu);
    memcpy(p->members, tmp, (size_t)nm * sizeof tmp[0]);
    p->n_members = nm;
    pthread_mutex_unlock(&p->info_mu);
}

/* Close the connection of every live node the running plan does not use
 * (lost until cm_pipe_maintain redials it). */
static void release_unused(cm_pipe *p) {
    bool used[CM_PLAN_MAX_NODES] = {false};
    for (int s = 0; s < p->plan.n_stages; s++)
        for (int k = 0; k < p->plan.stages[s].n_members; k++)
            if (p->plan.stages[s].members[k].node) used[p->plan.stages[s].members[k].node - 1] = true;
    /* A node drops its part when its coordinator's connection closes, so
     * none keeps a stage of an old epoch; cm_pipe_maintain redials them like
     * lost nodes, and a re-plan takes them back (a down link healed). */
    for (int i = 0; i < p->n_remote; i++) {
        remote *r = &p->r[i];
        if (used[i] || !cm_coord_alive(r)) continue;
        cm_coord_log(p, "node %s ('%s') is not in the plan: released until a re-plan takes it back", r->addr,
                     r->hello.name);
        atomic_store(&r->released, true); /* its rx thread ends without failing the pipe */
        pthread_join(r->rx, NULL);
        r->rx_started = false;
        cm_conn_close(r->ctl, "not in the current plan");
        r->ctl = NULL;
        r->ready = false;
        atomic_store(&r->lost, true);
        atomic_store(&r->released, false);
    }
}

/* One line per plan: each stage's members ("here", or an address; a group
 * joined by '+') and layers. */
static void describe(const cm_pipe *p, const cm_plan *pl, char *line, size_t n) {
    size_t o = 0;
    line[0] = 0;
    for (int s = 0; s < pl->n_stages && o < n; s++) {
        const cm_plan_stage *st = &pl->stages[s];
        o += (size_t)snprintf(line + o, n - o, "%s", s ? ", " : "");
        for (int k = 0; k < st->n_members && o < n; k++) {
            int nd = st->members[k].node;
            o += (size_t)snprintf(line + o, n - o, "%s%s", k ? "+" : "", nd ? p->r[nd - 1].addr : "here");
        }
        if (o < n) o += (size_t)snprintf(line + o, n - o, " [%d, %d)", st->first_layer, st->last_layer);
    }
}

/* The shape of a plan with groups, once it runs (tests read these lines). */
static void log_groups(cm_pipe *p, const cm_plan *pl) {
    const cm_plan_stage *st0 = &pl->stages[0];
    const cm_plan_member *m0 = &st0->members[0];
    char mine[200];
    snprintf(mine, sizeof mine, "KV heads [%d, %d) and FFN rows [%d, %d)%s", m0->kv_head_begin, m0->kv_head_end,
             m0->ffn_begin, m0->ffn_end, p->tp_compress ? ", Q8_0 transfers" : "");
    if (st0->ep) /* expert group (tests read this line) */
        snprintf(mine, sizeof mine, "experts [%d, %d) of %d", m0->expert_begin, m0->expert_end, p->m->hp.n_expert);
    if (pl->n_stages == 1 && st0->ep) {
        char ranges[400];
        int o = 0;
        for (int k = 0; k < st0->n_members && o < (int)sizeof ranges; k++)
            o += snprintf(ranges + o, sizeof ranges - (size_t)o, "%s[%d, %d)", k ? " " : "",
                          st0->members[k].expert_begin, st0->members[k].expert_end);
        char reps[300];
        cm_coord_replicas_text(st0, reps, sizeof reps);
        cm_coord_log(p, "expert parallel: %d members, this machine rank 0 with %s; experts by rank %s%s",
                     st0->n_members, mine, ranges, reps);
        return;
    }
    if (pl->n_stages == 1) {
        if (st0->n_members == 1) cm_coord_log(p, "tensor parallel: this machine alone now, every KV head and FFN row");
        else cm_coord_log(p, "tensor parallel: %d members, this machine rank 0 with %s", st0->n_members, mine);
        return;
    }
    if (cm_coord_plan_members(pl) == pl->n_stages) return; /* a pipeline */
    char line[900];
    int o = snprintf(line, sizeof line, "hybrid: %d stages of", pl->n_stages);
    for (int s = 0; s < pl->n_stages && o < (int)sizeof line; s++) {
        char reps[300]; /* an expert group's hot-expert replicas */
        cm_coord_replicas_text(&pl->stages[s], reps, sizeof reps);
        o += snprintf(line + o, sizeof line - (size_t)o, "%s %d member%s (layers [%d, %d)%s)", s ? "," : "",
                      pl->stages[s].n_members, pl->stages[s].n_members > 1 ? "s" : "", pl->stages[s].first_layer,
                      pl->stages[s].last_layer, reps);
    }
    if (o < (int)sizeof line)
        snprintf(line + o, sizeof line - (size_t)o, "; this machine rank 0 of stage 0 with %s", mine);
    cm_coord_log(p, "%s", line);
}

/* The plan as `cumulo plan` prints it, plus the links matrix. */
/* The plan's text, and the micro-batches serve keeps in flight on it (one
 * per set of stages sharing a host: cm_plan_pipe_groups). */
static void format_plan(cm_pipe *p, const cm_plan *pl) {
    cm_plan_model *pm = cm_calloc(1, sizeof *pm);
    cm_plan_cluster *pc = cm_calloc(1, sizeof *pc);
    char e[300];
    p->pipe_groups = pl->n_stages;
    if (pc) {
        cm_coord_make_cluster(p, pc);
        p->pipe_groups = cm_plan_pipe_groups(pl, pc);
    }
    if (pm && pc && !cm_plan_model_from_gguf(p->g, pm, e, sizeof e)) {
        cm_plan_format(pl, pm, pc, p->plan_text, sizeof p->plan_text);
        size_t used = strlen(p->plan_text);
        cm_coord_links_text(p, p->plan_text + used, sizeof p->plan_text - used);
    }
    cm_free(pm);
    cm_free(pc);
}

static int check_plan(const cm_pipe *p, const cm_plan *pl, char *err, size_t errlen) {
    if (pl->n_stages < 1 || pl->n_stages > CM_PLAN_MAX_NODES || pl->stages[0].n_members < 1 ||
        pl->stages[0].members[0].node != 0)
        return cm_errf(err, errlen, CM_EINVAL, "the plan does not start on this machine");
    int ll = cm_coord_local_last(p);
    if (ll && (pl->stages[0].first_layer != 0 || pl->stages[0].last_layer != ll))
        return cm_errf(err, errlen, CM_EINVAL, "the plan does not keep this machine's layers [0, %d)", ll);
    for (int s = 0; s < pl->n_stages; s++) {
        const cm_plan_stage *st = &pl->stages[s];
        if (st->n_members < 1 || st->n_members > CM_COLL_MAX_MEMBERS || st->n_members > (int)CM_MSG_MAX_TP)
            return cm_errf(err, errlen, CM_EINVAL, "a tensor-parallel group of %d members (at most %d)", st->n_members,
                           CM_COLL_MAX_MEMBERS);
        for (int k = 0; k < st->n_members; k++) {
            int nd = st->members[k].node;
            if ((nd == 0) != (s == 0 && k == 0) || nd < 0 || nd > p->n_remote || (nd && !p->r[nd - 1].ctl))
                return cm_errf(err, errlen, CM_EINVAL, "member %d of stage %d is not a connected node", k, s);
        }
    }
    return 0;
}

void cm_coord_leave_plan(cm_pipe *p) {
    pthread_mutex_lock(&p->send_mu);
    if (p->data) cm_conn_close(p->data, NULL);
    p->data = NULL;
    pthread_mutex_unlock(&p->send_mu);
    cm_coll_free(p->coll);
    p->coll = NULL;
    cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
}

int cm_coord_apply_plan(cm_pipe *p, const cm_plan *pl, const char *why, char *err, size_t errlen) {
    int rc = check_plan(p, pl, err, errlen);
    if (rc) return rc;
    bool opening = p->plan.n_stages == 0;
    const cm_plan_stage *st0 = &pl->stages[0];
    int k0 = st0->n_members;
    uint64_t ep = cm_wall_ms();
    if (ep <= atomic_load(&p->epoch)) ep = atomic_load(&p->epoch) + 1;
    atomic_store(&p->epoch, ep);
    cm_coord_leave_plan(p);
    pthread_mutex_lock(&p->mu);
    p->fatal = 0;
    p->fatal_text[0] = 0;
    for (int i = 0; i < p->n_seq; i++) p->slots[i].asked = p->slots[i].got = 0;
    pthread_mutex_unlock(&p->mu);
    if (!opening) {
        char line[1200], d[900];
        describe(p, pl, d, sizeof d);
        snprintf(line, sizeof line, "re-plan (epoch %llu, %s): %s; predicted %.1f tok/s (%.1f aggregate)",
                 (unsigned long long)ep, why, d, pl->tok_s, pl->tok_s_aggregate);
        cm_coord_log(p, "%s", line);
    }
    cm_coord_start_rx(p);
    rc = cm_coord_lora_prepare(p, pl, err, errlen); /* every member's parts of the adapters, before its ASSIGN */
    for (int s = 0; s < pl->n_stages && !rc; s++)
        for (int k = 0; k < pl->stages[s].n_members && !rc; k++)
            if (pl->stages[s].members[k].node) rc = send_assign(p, pl, s, k, err, errlen);
    /* This machine's group: a mesh link to each member (it waits for it
     * before it can answer READY), greeted with the epoch. */
    for (int k = 1; k < k0 && !rc; k++) {
        const remote *r = &p->r[st0->members[k].node - 1];
        char e[400];
        cm_msg_hello peer;
        rc = cm_cluster_dial(r->addr, &p->cfg, &p->hello, &p->tp_conn[k], &peer, e, sizeof e);
        if (!rc) rc = cm_coll_mesh_greet(p->tp_conn[k], 0, 10000, e, sizeof e);
        if (!rc) rc = cm_tp_greet_epoch(p->tp_conn[k], ep, e, sizeof e);
        if (rc) cm_errf(err, errlen, rc, "tensor-parallel rank %d at %s: %s", k, r->addr, e);
    }
    if (!rc) rc = wait_ready(p, pl, opening ? 600 : 120, err, errlen);
    if (!rc && k0 > 1) {
        cm_coll_cfg cc = {.rank = 0,
                          .size = k0,
                          .max_n = (int64_t)p->max_batch * p->m->hp.n_embd,
                          .timeout_ms = p->lost_ms,
                          .epoch = ep,
                          .compress = p->tp_compress && !st0->ep};
        for (int k = 1; k < k0; k++) cc.peers[k] = p->tp_conn[k];
        char e[300];
        rc = cm_coll_new(&cc, &p->coll, e, sizeof e);
        if (rc) cm_errf(err, errlen, rc, "all-reduce: %s", e);
    }
    cm_conn *d = NULL;
    if (!rc && pl->n_stages > 1) {
        const char *a1 = p->r[pl->stages[1].members[0].node - 1].addr;
        char e[400];
        cm_msg_hello peer;
        rc = cm_cluster_dial(a1, &p->cfg, &p->hello, &d, &peer, e, sizeof e);
        if (rc) cm_errf(err, errlen, rc, "stage 1 at %s: %s", a1, e);
    }
    if (rc) { /* half-assigned: stay failed until the next attempt */
        if (!opening) cm_coord_fatal(p, rc, "re-plan: %s", err);
        return rc;
    }
    pthread_mutex_lock(&p->send_mu);
    p->data = d;
    p->plan = *pl;
    pthread_mutex_unlock(&p->send_mu);
    publish_members(p, pl);
    format_plan(p, pl);
    log_groups(p, pl);
    if (!opening) { /* at the start, machines the user's request leaves out stay connected, idle */
        release_unused(p);
        p->generation++;
    }
    return 0;
}

/* The planner's view of this machine and the live nodes, the running plan's
 * nodes first in its order: sub-cluster node a >= 1 is r[map[a]]. */
static int live_view(cm_pipe *p, const cm_plan_cluster *full, cm_plan_cluster *sub, int *map) {
    int n = 1;
    bool seen[CM_PLAN_MAX_NODES] = {false};
    map[0] = -1;
    for (int s = 0; s < p->plan.n_stages; s++)
        for (int k = 0; k < p->plan.stages[s].n_members; k++) {
            int nd = p->plan.stages[s].members[k].node;
            if (nd && !seen[nd - 1] && cm_coord_alive(&p->r[nd - 1])) map[n++] = nd - 1;
            if (nd) seen[nd - 1] = true;
        }
    for (int i = 0; i < p->n_remote; i++)
        if (!seen[i] && cm_coord_alive(&p->r[i])) map[n++] = i;
    memset(sub, 0, sizeof *sub);
    sub->n_nodes = n;
    for (int a = 0; a < n; a++) {
        int fa = a ? map[a] + 1 : 0;
        sub->nodes[a] = full->nodes[fa];
        for (int b = 0; b < n; b++) {
            int fb = b ? map[b] + 1 : 0;
            sub->rtt_s[a][b] = full->rtt_s[fa][fb];
            sub->bw[a][b] = full->bw[fa][fb];
            sub->down[a][b] = full->down[fa][fb];
        }
    }
    return n;
}

/* Score of a plan as the planner ranks them (aggregate speed when several
 * sequences share the pipeline). */
static double score_of(const cm_plan *pl, int n_seq) { return n_seq > 1 ? pl->tok_s_aggregate : pl->tok_s; }

typedef struct replan_ctx {
    cm_plan_model pm;
    cm_plan_cluster full, sub;
    cm_plan cur;
} replan_ctx;

int cm_coord_replan(cm_pipe *p, cm_plan *out, double *score, double *cur_score, char *err, size_t errlen) {
    replan_ctx *x = cm_calloc(1, sizeof *x);
    if (!x) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    char e[600];
    int map[CM_PLAN_MAX_NODES];
    int rc = cm_plan_model_from_gguf(p->g, &x->pm, e, sizeof e);
    if (rc) {
        rc = cm_errf(err, errlen, rc, "re-plan: %s", e);
        goto out;
    }
    cm_coord_make_cluster(p, &x->full);
    int n = live_view(p, &x->full, &x->sub, map);
    bool one_group = p->plan.n_stages == 1; /* every layer here: a group of every machine */
    int ll = cm_coord_local_last(p);
    if (n == 1 && !one_group) {
        rc = cm_errf(err, errlen, CM_EAGAIN,
                     "no node is left to run layers [%d, %d): the model does not fit on the survivors", ll,
                     p->m->hp.n_layer);
        goto out;
    }
    cm_plan_opts po;
    cm_plan_opts_default(&po);
    po.ctx = p->n_ctx;
    po.n_seq = p->n_seq;
    po.mode = one_group ? CM_PARALLEL_TP : p->ask == CM_PARALLEL_HYBRID ? CM_PARALLEL_HYBRID : CM_PARALLEL_PP;
    /* Expert parallelism: the experts are re-placed on the survivors like
     * any slice (one group: an expert group again; with stages: every split,
     * as hybrid, whose groups are expert groups). */
    if (p->ask == CM_PARALLEL_EP) po.mode = one_group ? CM_PARALLEL_EP : CM_PARALLEL_HYBRID;
    po.first_stage_layers = one_group ? 0 : ll;    /* the engine's stage-0 caches rely on them */
    po.reorder = true;                             /* a pipeline's order follows the measured links */
    po.expert_load = p->expert_load;               /* hot experts get replicas again (NULL: none) */
    po.expert_load_layers = p->expert_load_layers; /* measured: each group by its own stage's layers */
    po.n_load_layers = p->m->hp.n_layer;
    rc = cm_plan_make(&x->pm, &x->sub, &po, out, e, sizeof e);
    if (rc && po.mode == CM_PARALLEL_HYBRID) { /* too few nodes left for groups: stages of one */
        po.mode = CM_PARALLEL_PP;
        rc = cm_plan_make(&x->pm, &x->sub, &po, out, e, sizeof e);
    }
    if (rc) {
        rc = cm_errf(err, errlen, CM_EAGAIN, "the model no longer fits on this machine and the %d surviving node%s: %s",
                     n - 1, n == 2 ? "" : "s", e);
        goto out;
    }
    for (int s = 0; s < out->n_stages; s++)
        for (int k = 0; k < out->stages[s].n_members; k++) {
            int a = out->stages[s].members[k].node;
            out->stages[s].members[k].node = a ? map[a] + 1 : 0;
        }
    if (score) *score = score_of(out, p->n_seq);
    if (cur_score) { /* the running plan on the same view */
        x->cur = p->plan;
        cm_plan_expert_shares_by_layer(&x->cur, po.expert_load, po.expert_load_layers, po.n_load_layers,
                                       x->pm.n_experts); /* priced under today's counts */
        cm_plan_predict(&x->pm, &x->full, &po, &x->cur);
        *cur_score = score_of(&x->cur, p->n_seq);
    }
out:
    cm_free(x);
    return rc;
}

int cm_coord_replan_replicas(cm_pipe *p, cm_plan *out, double *score, double *cur_score, char *err, size_t errlen) {
    replan_ctx *x = cm_calloc(1, sizeof *x);
    if (!x) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    char e[600];
    int rc = cm_plan_model_from_gguf(p->g, &x->pm, e, sizeof e);
    if (rc) {
        rc = cm_errf(err, errlen, rc, "re-plan: %s", e);
        cm_free(x);
        return rc;
    }
    cm_coord_make_cluster(p, &x->full); /* the running plan's node indices are the pipe's */
    cm_plan_opts po;
    cm_plan_opts_default(&po);
    po.ctx = p->n_ctx;
    po.n_seq = p->n_seq;
    po.mode = p->plan.mode;
    po.expert_load = p->expert_load;
    po.expert_load_layers = p->expert_load_layers;
    po.n_load_layers = p->m->hp.n_layer;
    *out = p->plan;
    cm_plan_replace_replicas(&x->pm, &x->full, &po, out); /* sched/plan.c: stages, members, ranges kept */
    *score = score_of(out, p->n_seq);
    x->cur = p->plan;
    cm_plan_expert_shares_by_layer(&x->cur, po.expert_load, po.expert_load_layers, po.n_load_layers, x->pm.n_experts);
    cm_plan_predict(&x->pm, &x->full, &po, &x->cur);
    *cur_score = score_of(&x->cur, p->n_seq);
    cm_free(x);
    return 0;
}
