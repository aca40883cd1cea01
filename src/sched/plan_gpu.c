/*
 * plan_gpu.c: what a node's GPU changes in a plan (issue 16). The device
 * holds a prefix of its stage's layers (that is what `cumulo node --gpu`
 * uploads: src/cluster/node_gpu.c), each costing its weight bytes and an
 * F32 K/V cache of ctx x n_seq positions (the device keeps its cache in
 * F32 whatever the CPU's type); those layers run at the GPU's measured
 * bandwidth and throughput, the rest at the node's CPU speeds. Tensor
 * parallel groups and mixtures of experts stay on the CPU: the device
 * takes whole dense layers only.
 */
#include "plan_gpu.h"

static const cm_plan_node *gpu_node(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_stage *st) {
    if (st->n_members != 1 || m->n_experts > 0) return NULL;
    const cm_plan_node *n = &c->nodes[st->members[0].node];
    return n->gpu_mem_bytes > 0 && n->gpu_mem_bw > 0 && n->gpu_flops > 0 ? n : NULL;
}

bool cm_plan_gpu_take(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const cm_plan_stage *st,
                      cm_plan_gpu_fill *f, int l) {
    const cm_plan_node *n = gpu_node(m, c, st);
    if (!n || f->full) return false;
    const double kv = 2.0 * m->n_kv_heads * m->head_dim * (double)o->ctx * (o->n_seq > 0 ? o->n_seq : 1) * 4;
    const double need = (double)m->layer_bytes[l] + kv;
    const double budget = n->gpu_mem_bytes > o->reserve_bytes ? (double)(n->gpu_mem_bytes - o->reserve_bytes) : 0;
    if ((n->gpu_layers > 0 && f->n >= n->gpu_layers) || f->used + need > budget) {
        f->full = true;
        return false;
    }
    f->used += need;
    f->n++;
    return true;
}

double cm_plan_gpu_layer_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_stage *st, int l,
                           double n_tok) {
    const cm_plan_node *n = &c->nodes[st->members[0].node];
    const double mem = (double)m->layer_bytes[l] / n->gpu_mem_bw;
    const double cmp = 2.0 * (double)m->layer_params[l] * n_tok / n->gpu_flops;
    return mem > cmp ? mem : cmp;
}
