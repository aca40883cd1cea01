/*
 * ep_gather.h: the expert exchange of an expert group whose hot experts are
 * replicated (issue 13; sched/replicas.c places them, model.h's
 * cm_expert_share splits a replicated expert's rows among its holders).
 * Without replicas a member's rows are one contiguous run (its expert range)
 * and the exchange is cm_coll_allgather on y itself; with them a member's
 * rows are several runs, so each member packs its runs, in expert order, into
 * one contiguous part (parts in rank order) of a scratch vector, the parts
 * are all-gathered, and each member unpacks the others' runs into y. Each
 * row still travels once from the member that computed it, so the element
 * bytes are those of the formula in docs/DESIGN.md. Used by the coordinator
 * (rank 0, coord_data.c) and every node (node.c), so both sides derive the
 * same runs from the same holders and routing.
 */
#ifndef CM_CLUSTER_EP_GATHER_H
#define CM_CLUSTER_EP_GATHER_H

#include "cluster/collective.h"
#include "proto/proto.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cm_ep_pack {
    float *buf;           /* scratch, grown as needed (cm_ep_pack_free) */
    size_t cap;           /* floats */
    uint64_t shared_rows; /* rows this member computed of experts with more than one holder */
} cm_ep_pack;

/* One MoE layer's exchange (model.h's cm_expert_gather_fn arguments) in a
 * group of size members where holders[e] has bit k set when member k holds
 * expert e; this member is rank. On entry y holds this member's rows. */
int cm_ep_gather_holders(cm_coll *c, int rank, int size, const uint32_t *holders, float *y, int64_t row_len,
                         const int32_t *rows, int n_expert, cm_ep_pack *pk, char *err, size_t errlen);
void cm_ep_pack_free(cm_ep_pack *pk);
/* The holders of each of n_expert experts (bit r: rank r) under an ASSIGN
 * with EP (and REPLICAS); cm_malloc'ed, NULL when out of memory. */
uint32_t *cm_ep_holders_of(const cm_msg_assign *a, int n_expert);

#endif
