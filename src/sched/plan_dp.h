/*
 * plan_dp: how many data-parallel replicas of a training pipeline a cluster
 * holds (issue 17; `cumulo finetune --cluster` without --layers or
 * --data-parallel asks it). PURE, as plan.h: the same imaginary cluster
 * gives the same answer, so the rule is table-tested (test_plan_dp.c).
 *
 * The replicas' shape is the one coord_train_dp.c runs: node 0 (this
 * machine) is the first stage of every replica; the other nodes are dealt
 * out, each to one replica. The rule: the most replicas k >= 2 such that
 * each replica (node 0 and its nodes) holds the whole model as a pipeline
 * with every one of its nodes a stage (cm_plan_make, --parallel pp); else
 * one (the plain pipeline over every node). The nodes go fastest first
 * (flops, then the cluster's order), round robin: replica r gets the
 * sorted nodes r, r + k, r + 2k, ..., so the replicas are alike; when k
 * does not divide them, the slowest are left out.
 * NEEDSWORK: the fit is inference's memory model at the training context
 * and one sequence (a training stage keeps each layer's input, T x dim
 * floats, about what the KV cache it does not have would take), and node
 * 0 is counted as if it held one replica's first stage (it holds every
 * replica's, the weights once in its mapping); more replicas are taken
 * whenever they fit, not by a predicted training speed.
 */
#ifndef CM_PLAN_DP_H
#define CM_PLAN_DP_H

#include "plan.h"

typedef struct cm_plan_dp {
    int n_replicas;                    /* 1: no data parallelism (one pipeline over every node) */
    int per_replica;                   /* nodes of each replica besides node 0 (n_replicas > 1) */
    int replica_of[CM_PLAN_MAX_NODES]; /* node i's replica; node 0 and, with one replica, all: 0; left out: -1 */
    int order[CM_PLAN_MAX_NODES];      /* the nodes 1.. replica by replica, n_replicas * per_replica of them */
    char why[256];
} cm_plan_dp;

/* Choose the replicas for training m on c (o: ctx and KV types of a
 * training run; mode and reorder are set here). Errors: CM_EINVAL for
 * nonsense input; a cluster that holds the model nowhere is n_replicas 1
 * (the pipeline's own plan then says why). */
int cm_plan_data_parallel(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan_dp *out,
                          char *err, size_t errlen);

#endif
