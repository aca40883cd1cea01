/*
 * plan_gpu.h: GPU nodes in the planner (plan_gpu.c; private to src/sched).
 * A pipeline stage of one member whose node has a GPU runs its first
 * layers there: the fill walks a stage's layers in order and asks
 * cm_plan_gpu_take whether the next one still fits on the device.
 */
#ifndef CM_PLAN_GPU_H
#define CM_PLAN_GPU_H

#include "plan.h"

/* A stage's layers on its GPU so far (zeroed at the stage's first layer). */
typedef struct cm_plan_gpu_fill {
    double used; /* bytes */
    int n;       /* layers */
    bool full;   /* a layer did not fit: the rest run on the CPU (the device holds a prefix) */
} cm_plan_gpu_fill;

/* Does stage st's GPU take layer l next? Counts it into f when it does. */
bool cm_plan_gpu_take(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const cm_plan_stage *st,
                      cm_plan_gpu_fill *f, int l);
/* Layer l's time on stage st's GPU for n_tok tokens. */
double cm_plan_gpu_layer_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_stage *st, int l,
                           double n_tok);

#endif
