/*
 * coord_ep.c: hot-expert replication on the coordinator's side (issue 13).
 * The routing counts given at open (--expert-load) go into every plan the
 * pipe asks for (opening and re-plans alike, through coord_plan.c's one
 * plan-change path), so the planner (sched/replicas.c) gives the hot experts
 * more holders; each member learns every member's replicas in its ASSIGN,
 * and this machine, rank 0 of stage 0, derives the holders of each expert
 * from the running plan for its forward pass and its exchange (ep_gather.c).
 */
#include "cluster/coord_impl.h"

#include <stdio.h>
#include <string.h>

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
