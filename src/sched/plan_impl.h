/*
 * plan_impl.h (private to src/sched): what plan.c, plan_cost.c and replicas.c
 * share.
 * Pure functions like the rest of the planner: no socket, file or clock.
 */
#ifndef CM_PLAN_IMPL_H
#define CM_PLAN_IMPL_H

#include "plan.h"

/* ---- the cost model (plan_cost.c) ---- */

/* One-way time of `bytes` from node a to node b (0 on the same node). */
double cm_plan_link_s(const cm_plan_cluster *c, const cm_plan_opts *o, int a, int b, double bytes);

/* The slowest member's time of one all-reduce of n_tok hidden states in stage st. */
double cm_plan_allreduce_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                           const cm_plan_stage *st, double n_tok);

/* Time of layer `layer` for the whole group st, n_tok tokens at once, with ar
 * the time of one all-reduce (cm_plan_allreduce_s). */
double cm_plan_stage_layer_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                             const cm_plan_stage *st, int layer, double n_tok, double ar);

/* Time of the output head in stage st (0 when no member holds it). */
double cm_plan_head_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_stage *st, double n_tok);

/* Whether every member of st fits layers [a, b) in its node's memory. */
bool cm_plan_stage_fits(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                        const cm_plan_stage *st, int a, int b);

/* out = c with each node that group_of uses (>= 0) given 1/k of its flops and
 * memory bandwidth, k = the used nodes on its host. */
void cm_plan_share_hosts(const cm_plan_cluster *c, const int *group_of, cm_plan_cluster *out);

/* The nodes plan p uses, as group_of (stage index, -1 unused). */
void cm_plan_groups(const cm_plan *p, int n_nodes, int *group_of);

/* Fill p's predictions (times, bytes, tokens/s) for cluster c as given
 * (hosts already shared: cm_plan_predict is the public entry). */
void cm_plan_predict_on(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p);

/* Bytes member mb needs for layers [a, b): weights (its slice, its experts
 * and replicas, embedding / head), KV cache and the reserve. */
uint64_t cm_plan_member_bytes(const cm_plan_model *m, const cm_plan_opts *o, const cm_plan_member *mb, int a, int b);

/* Every expert group of p: each member's expert_share from o->expert_load,
 * and replicas of hot experts (plan.h's cm_plan_opts.expert_load). */
void cm_plan_place_replicas(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p);

#endif
