/*
 * replicas.c: hot-expert replication in expert groups (issue 13). Real
 * routers are skewed: a few experts take many more tokens than the others,
 * so the member holding them is the group's slowest. Given routing counts
 * (cm_plan_opts.expert_load: a warm-up's cm_ctx_expert_hits or the nodes'
 * reports), each member's work is the assignments of the experts it holds,
 * an expert's split evenly among its holders (model.h's cm_expert_share:
 * contiguous shares of its rows, so every row is computed once and token
 * ids stay those of one machine). Greedily, while it lowers the slowest
 * member's time (work / memory bandwidth, like decode), the busiest
 * member's hottest expert gets one more holder: the member that ends least
 * busy, among those with memory for one expert's slabs of the stage's
 * layers. Ties go to the lowest index, so the result is a pure function of
 * the input. With counts by layer (cm_plan_opts.expert_load_layers) each
 * group is balanced under the sum over its own stage's layers. It never touches a socket, file or clock (plan.h).
 */
#include "plan_impl.h"

#include <string.h>

uint32_t cm_plan_expert_holders(const cm_plan_stage *st, int e) {
    uint32_t h = 0;
    for (int k = 0; k < st->n_members && k < 32; k++) {
        const cm_plan_member *mb = &st->members[k];
        bool held = e >= mb->expert_begin && e < mb->expert_end;
        for (int i = 0; i < mb->n_replicas && !held; i++) held = mb->replicas[i] == e;
        if (held) h |= 1u << k;
    }
    return h;
}

static int popcount32(uint32_t v) {
    int n = 0;
    for (; v; v &= v - 1) n++;
    return n;
}

/* Work of every member (assignments it computes) under the holders h[]. */
static void member_work(const cm_plan_stage *st, int X, const uint64_t *load, const uint32_t *h, double *w) {
    for (int k = 0; k < st->n_members; k++) w[k] = 0;
    for (int e = 0; e < X; e++) {
        const int r = popcount32(h[e]);
        for (int k = 0; k < st->n_members && r; k++)
            if (h[e] >> k & 1u) w[k] += (double)load[e] / r;
    }
}

static double slowest(const cm_plan_stage *st, const double *w, const double *bw, int *who) {
    double worst = -1;
    for (int k = 0; k < st->n_members; k++)
        if (w[k] / bw[k] > worst) worst = w[k] / bw[k], *who = k;
    return worst;
}

/* The counts of stage st's layers (load_layers summed over them) into out[X]; load itself
 * when there are no counts by layer or none of those layers has any (NULL: none). */
static const uint64_t *stage_load(const uint64_t *load, const uint64_t *load_layers, int n_layers, int X,
                                  const cm_plan_stage *st, uint64_t *out) {
    if (!load_layers) return load;
    uint64_t sum = 0;
    for (int e = 0; e < X; e++) out[e] = 0;
    for (int l = st->first_layer < 0 ? 0 : st->first_layer; l < st->last_layer && l < n_layers; l++)
        for (int e = 0; e < X; e++) {
            out[e] += load_layers[(size_t)l * (size_t)X + (size_t)e];
            sum += load_layers[(size_t)l * (size_t)X + (size_t)e];
        }
    return sum ? out : load;
}

static void place_stage(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan_stage *st) {
    enum { MAXX = 1024 };
    const int X
    = m->n_experts, k = st->n_members;
    if (!st->ep || k < 2 || X < 1 || X > MAXX) return;
    static _Thread_local uint64_t by_stage[MAXX];
    const uint64_t *load = stage_load(o->expert_load, o->expert_load_layers, o->n_load_layers, X, st, by_stage);
    if (!load) return;
    const int cap = o->max_replicas < 0                                             ? 0
                    : o->max_replicas > 0 && o->max_replicas < CM_PLAN_MAX_REPLICAS ? o->max_replicas
                                                                                    : CM_PLAN_MAX_REPLICAS;
    double total = 0, bw[CM_PLAN_MAX_NODES], w[CM_PLAN_MAX_NODES];
    for (int e = 0; e < X; e++) total += (double)load[e];
    if (total <= 0) return;
    for (int i = 0; i < k; i++) {
        bw[i] = c->nodes[st->members[i].node].mem_bw > 0 ? c->nodes[st->members[i].node].mem_bw : 1e9;
        st->members[i].n_replicas = 0;
    }
    static _Thread_local uint32_t h[MAXX];
    for (int e = 0; e < X; e++) h[e] = cm_plan_expert_holders(st, e);
    for (int round = 0; round < k * cap; round++) {
        int busy = 0;
        member_work(st, X, load, h, w);
        const double now = slowest(st, w, bw, &busy);
        /* its hottest expert (per holder) that some other member could take */
        int best_e = -1, best_j = -1;
        double best_t = now * (1 - 1e-9);
        for (int e = 0; e < X; e++) {
            if (!(h[e] >> busy & 1u) || load[e] == 0) continue;
            for (int j = 0; j < k; j++) {
                cm_plan_member *mj = &st->members[j];
                if (h[e] >> j & 1u || mj->n_replicas >= cap) continue;
                mj->replicas[mj->n_replicas++] = e; /* try it: memory, then the new slowest time */
                const bool fits =
                    cm_plan_member_bytes(m, o, mj, st->first_layer, st->last_layer) <= c->nodes[mj->node].mem_bytes;
                mj->n_replicas--;
                if (!fits) continue;
                /* only e's holders change: each gives up load/r - load/(r + 1), j takes load/(r + 1) */
                double w2[CM_PLAN_MAX_NODES];
                const int r = popcount32(h[e]);
                const double was = (double)load[e] / r, now_each = (double)load[e] / (r + 1);
                int who;
                for (int i = 0; i < k; i++) w2[i] = w[i] - (h[e] >> i & 1u ? was - now_each : 0);
                w2[j] += now_each;
                const double t = slowest(st, w2, bw, &who);
                if (t < best_t) best_t = t, best_e = e, best_j = j;
            }
        }
        if (best_e < 0) break;
        cm_plan_member *mj = &st->members[best_j];
        int i = mj->n_replicas++;
        for (; i > 0 && mj->replicas[i - 1] > best_e; i--) mj->replicas[i] = mj->replicas[i - 1];
        mj->replicas[i] = best_e;
        h[best_e] |= 1u << best_j;
    }
    member_work(st, X, load, h, w);
    /* a measured zero stays distinguishable from "not measured" (0: uniform) */
    for (int i = 0; i < k; i++) st->members[i].expert_share = w[i] > 0 ? w[i] / total : 1e-300;
}

void cm_plan_expert_shares(cm_plan *p, const uint64_t *load, int n_experts) {
    cm_plan_expert_shares_by_layer(p, load, NULL, 0, n_experts);
}

void cm_plan_expert_shares_by_layer(cm_plan *p, const uint64_t *all, const uint64_t *load_layers, int n_layers,
                                    int n_experts) {
    enum { MAXX = 1024 };
    if ((!all && !load_layers) || n_experts < 1 || n_experts > MAXX) return;
    double w[CM_PLAN_MAX_NODES];
    static _Thread_local uint32_t h[MAXX];
    static _Thread_local uint64_t by_stage[MAXX];
    for (int s = 0; s < p->n_stages; s++) {
        cm_plan_stage *st = &p->stages[s];
        if (!st->ep || st->n_members < 2) continue;
        const uint64_t *load = stage_load(all, load_layers, n_layers, n_experts, st, by_stage);
        double total = 0;
        for (int e = 0; load && e < n_experts; e++) total += (double)load[e];
        if (total <= 0) continue;
        for (int e = 0; e < n_experts; e++) h[e] = cm_plan_expert_holders(st, e);
        member_work(st, n_experts, load, h, w);
        for (int i = 0; i < st->n_members; i++) st->members[i].expert_share = w[i] > 0 ? w[i] / total : 1e-300;
    }
}

void cm_plan_place_replicas(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p) {
    for (int s = 0; s < p->n_stages; s++) place_stage(m, c, o, &p->stages[s]);
}
