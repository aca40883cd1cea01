/*
 * plan_impl.h (private to src/sched): what plan.c and replicas.c share.
 * Pure functions like the rest of the planner: no socket, file or clock.
 */
#ifndef CM_PLAN_IMPL_H
#define CM_PLAN_IMPL_H

#include "plan.h"

/* Bytes member mb needs for layers [a, b): weights (its slice, its experts
 * and replicas, embedding / head), KV cache and the reserve. */
uint64_t cm_plan_member_bytes(const cm_plan_model *m, const cm_plan_opts *o, const cm_plan_member *mb, int a, int b);

/* Every expert group of p: each member's expert_share from o->expert_load,
 * and replicas of hot experts (plan.h's cm_plan_opts.expert_load). */
void cm_plan_place_replicas(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p);

#endif
