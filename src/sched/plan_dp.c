/*
 * plan_dp.c: data-parallel replicas of a training pipeline (plan_dp.h).
 * PURE, like plan.c: every number comes from the arguments; it only asks
 * cm_plan_make whether each replica's nodes hold the model.
 */
#include "plan_dp.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>

/* The sub-cluster of node 0 and nodes[0..n) of c, links included. */
static void sub_cluster(const cm_plan_cluster *c, const int *nodes, int n, cm_plan_cluster *s) {
    int map[CM_PLAN_MAX_NODES];
    memset(s, 0, sizeof *s);
    map[0] = 0;
    for (int i = 0; i < n; i++) map[i + 1] = nodes[i];
    s->n_nodes = n + 1;
    for (int i = 0; i < s->n_nodes; i++) {
        s->nodes[i] = c->nodes[map[i]];
        for (int j = 0; j < s->n_nodes; j++) {
            s->rtt_s[i][j] = c->rtt_s[map[i]][map[j]];
            s->bw[i][j] = c->bw[map[i]][map[j]];
            s->down[i][j] = c->down[map[i]][map[j]];
        }
    }
}

int cm_plan_data_parallel(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan_dp *out,
                          char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->n_replicas = 1;
    if (!m || !c || c->n_nodes < 1 || c->n_nodes > CM_PLAN_MAX_NODES)
        return cm_errf(err, errlen, CM_EINVAL, "plan: need 1..%d nodes", CM_PLAN_MAX_NODES);
    const int n_other = c->n_nodes - 1;
    for (int i = 0; i < n_other; i++) out->order[i] = i + 1;
    snprintf(out->why, sizeof out->why, "one pipeline over every node");
    if (n_other < 2) return 0;
    /* the nodes fastest first (stable: the cluster's order among equals) */
    int sorted[CM_PLAN_MAX_NODES];
    for (int i = 0; i < n_other; i++) {
        int j = i;
        for (; j > 0 && c->nodes[i + 1].flops > c->nodes[sorted[j - 1]].flops; j--) sorted[j] = sorted[j - 1];
        sorted[j] = i + 1;
    }
    cm_plan_opts po = *o;
    po.mode = CM_PARALLEL_PP;
    po.reorder = true; /* as the pipe's own plan (coord.c's make_plan) */
    po.first_stage_layers = 0;
    cm_plan_cluster *sub = cm_calloc(1, sizeof *sub);
    cm_plan *plan = cm_calloc(1, sizeof *plan);
    if (!sub || !plan) {
        cm_free(sub);
        cm_free(plan);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    for (int k = n_other; k >= 2; k--) {
        const int per = n_other / k;
        bool fits = true;
        for (int r = 0; r < k && fits; r++) {
            int nodes[CM_PLAN_MAX_NODES];
            for (int j = 0; j < per; j++) nodes[j] = sorted[r + j * k];
            sub_cluster(c, nodes, per, sub);
            char e[256];
            fits = !cm_plan_make(m, sub, &po, plan, e, sizeof e) && plan->n_stages == per + 1;
        }
        if (!fits) continue;
        out->n_replicas = k;
        out->per_replica = per;
        for (int i = 1; i < c->n_nodes; i++) out->replica_of[i] = -1;
        for (int r = 0, at = 0; r < k; r++)
            for (int j = 0; j < per; j++) {
                out->order[at++] = sorted[r + j * k];
                out->replica_of[sorted[r + j * k]] = r;
            }
        snprintf(out->why, sizeof out->why, "%d replicas, each this machine and %d node%s (each holds the model)%s", k,
                 per, per > 1 ? "s" : "", n_other > k * per ? " (the slowest left out)" : "");
        break;
    }
    cm_free(sub);
    cm_free(plan);
    return 0;
}
