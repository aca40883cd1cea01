/*
 * ep_load.c: whether an EXPERT_LOAD report fits the running plan (ep_load.h).
 * A node of the cluster holds the key, so its reports are authenticated, but
 * a confused or hostile one must not skew the counts the re-plan places
 * replicas by: only rank 0 of a later stage speaks for that stage's layers.
 */
#include "cluster/ep_load.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>

int cm_ep_load_check(const cm_cluster_member *mbs, int n, const char *addr, const cm_msg_expert_load *q, int n_layer,
                     int n_expert, char *why, size_t cap) {
    int stage = -1, first = 0, last = 0;
    for (int i = 0; i < n && addr && *addr; i++) {
        const cm_cluster_member *mb = &mbs[i];
        if (mb->local || strcmp(mb->addr, addr)) continue;
        if (mb->stage > 0 && mb->member == 0) stage = mb->stage, first = mb->first_layer, last = mb->last_layer;
    }
    const unsigned long long lb = q->layer_begin, le = lb + q->n_layers;
    if (stage < 0) return cm_errf(why, cap, CM_EPROTO, "not rank 0 of a later stage of the running plan");
    if (n_expert <= 0 || q->n_expert != (unsigned)n_expert)
        return cm_errf(why, cap, CM_EPROTO, "%u experts, the model has %d", q->n_expert, n_expert);
    if (q->n_layers == 0 || lb < (unsigned long long)first || le > (unsigned long long)last ||
        le > (unsigned long long)n_layer)
        return cm_errf(why, cap, CM_EPROTO, "layers [%llu, %llu) outside its stage's [%d, %d)", lb, le, first, last);
    return 0;
}
