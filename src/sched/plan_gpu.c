/*
 * plan_gpu.c: what a node's GPU changes in a plan (issue 16). The device
 * holds a prefix of its stage's layers (that is what `cumulo node --gpu`
 * uploads: src/cluster/node_gpu.c), each costing its weight bytes and a
 * K/V cache of ctx x n_seq positions as the device holds the cache's types
 * (cm_gpu_kv_bytes: Q8_0/Q4_0 blocks, else F32); those layers run at the GPU's measured
 * bandwidth and throughput, the rest at the node's CPU speeds. Tensor
 * parallel groups and mixtures of experts stay on the CPU: the device
 * takes whole dense layers only.
 */
#include "plan_gpu.h"

#include "gpu/gpu.h"

/* The cache type the options' bytes of 32 elements name (cm_plan_opts: 0
 * means kv_elem_bytes), for the device's size of it (cm_gpu_kv_bytes). */
static enum cm_type kv_type(int b32, int elem_bytes) {
    static const enum cm_type ts[] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0, CM_TYPE_Q4_0};
    if (b32 <= 0) return elem_bytes == 2 ? CM_TYPE_F16 : CM_TYPE_F32;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (cm_row_size(ts[i], 32) == (size_t)b32) return ts[i];
    return CM_TYPE_F32; /* (the largest: never an undercount) */
}

static const cm_plan_node *gpu_node(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_stage *st) {
    if (st->n_members != 1 || m->n_experts > 0) return NULL;
    const cm_plan_node *n = &c->nodes[st->members[0].node];
    return n->gpu_mem_bytes > 0 && n->gpu_mem_bw > 0 && n->gpu_flops > 0 ? n : NULL;
}

bool cm_plan_gpu_take(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const cm_plan_stage *st,
                      cm_plan_gpu_fill *f, int l) {
    const cm_plan_node *n = gpu_node(m, c, st);
    if (!n || f->full) return false;
    const uint64_t pos = (uint64_t)o->ctx * (uint64_t)(o->n_seq > 0 ? o->n_seq : 1);
    const double kv =
        (double)cm_gpu_kv_bytes(m->n_kv_heads, m->head_dim, pos, kv_type(o->kv_k32_bytes, o->kv_elem_bytes),
                                kv_type(o->kv_v32_bytes, o->kv_elem_bytes));
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
