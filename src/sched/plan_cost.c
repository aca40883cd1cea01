/*
 * plan_cost.c: the planner's cost model - the bytes each member holds and the
 * seconds a layer, a hop, an all-reduce or an expert exchange takes (plan.h
 * describes the model); plan.c searches placements with it.
 * PURE: no sockets, files, clocks or globals.
 */
#include "plan.h"
#include "plan_gpu.h"
#include "plan_impl.h"

#include <math.h>
#include <string.h>

/* ---- bytes ---- */

/* Share of a layer's weights for a member that holds `heads` of the KV heads
 * and `rows` of the FFN rows. */
static double member_share(const cm_plan_model *m, int heads, int rows) {
    double hd = m->head_dim;
    double attn = (double)m->dim * hd * (2.0 * m->n_heads + 2.0 * m->n_kv_heads);
    double ffn = 3.0 * m->dim * (double)m->ffn;
    double tot = attn + ffn;
    if (tot <= 0) return 0;
    return attn / tot * heads / m->n_kv_heads + ffn / tot * rows / (double)m->ffn;
}

/* Bytes of layer l member mb holds (active: what one decoded token reads):
 * its share of the dense part, and of the experts its range, of which a
 * token uses n_experts_used / n_experts on average. */
static double member_layer_bytes(const cm_plan_model *m, const cm_plan_member *mb, int l, bool active, bool params) {
    double s = member_share(m, mb->kv_head_end - mb->kv_head_begin, mb->ffn_end - mb->ffn_begin);
    double total = params ? (double)m->layer_params[l] : (double)m->layer_bytes[l];
    if (m->n_experts <= 0) return s * total;
    double ex = params ? (double)m->layer_expert_params[l] : (double)m->layer_expert_bytes[l];
    double held = (double)(mb->expert_end - mb->expert_begin + mb->n_replicas) / m->n_experts;
    if (active && mb->expert_share > 0) /* measured routing (replicas.c): its share of the assignments */
        return s * (total - ex) + ex * mb->expert_share * (double)m->n_experts_used / m->n_experts;
    return s * (total - ex) + ex * held * (active ? (double)m->n_experts_used / m->n_experts : 1.0);
}

/* ---- costs ---- */

double cm_plan_link_s(const cm_plan_cluster *c, const cm_plan_opts *o, int a, int b, double bytes) {
    if (a == b) return 0;
    double bw = c->bw[a][b] > 0 ? c->bw[a][b] : 1e9;
    return c->rtt_s[a][b] / 2 + bytes / bw + o->exchange_overhead_s;
}

double cm_plan_allreduce_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                           const cm_plan_stage *st, double n_tok) {
    int k = st->n_members;
    if (k < 2) return 0;
    double worst = 0, bytes = n_tok * m->dim * 4.0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            if (i == j) continue;
            int a = st->members[i].node, b = st->members[j].node;
            double bw = c->bw[a][b] > 0 ? c->bw[a][b] : 1e9;
            /* direct exchange for one token; ring (2(k-1)/k of the data) for batches */
            double data = n_tok <= 1 ? (k - 1) * bytes : 2.0 * (k - 1) / k * bytes;
            double t = c->rtt_s[a][b] / 2 + data / bw + o->exchange_overhead_s;
            if (n_tok > 1) t += (2.0 * (k - 1) - 1) * (c->rtt_s[a][b] / 2 + o->exchange_overhead_s);
            if (t > worst) worst = t;
        }
    return worst;
}

/* The expert exchange of one layer of an expert group, n_tok tokens: member
 * i sends its expected share of the k chosen experts' outputs (used *
 * held_i / n_experts rows of dim floats per token) to every other member. */
static double expert_exchange_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                                const cm_plan_stage *st, double n_tok) {
    int k = st->n_members;
    if (!st->ep || k < 2 || m->n_experts <= 0) return 0;
    double worst = 0;
    for (int i = 0; i < k; i++) {
        const cm_plan_member *mb = &st->members[i];
        double rows =
            n_tok * m->n_experts_used *
            (mb->expert_share > 0 ? mb->expert_share : (double)(mb->expert_end - mb->expert_begin) / m->n_experts);
        for (int j = 0; j < k; j++) {
            if (i == j) continue;
            int a = mb->node, b = st->members[j].node;
            double bw = c->bw[a][b] > 0 ? c->bw[a][b] : 1e9;
            double t = c->rtt_s[a][b] / 2 + (k - 1) * rows * m->dim * 4.0 / bw + o->exchange_overhead_s;
            if (t > worst) worst = t;
        }
    }
    return worst;
}

static double member_layer_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_member *mb, int layer,
                             double n_tok) {
    const cm_plan_node *n = &c->nodes[mb->node];
    /* decode reads the active bytes; a prefill of many tokens reaches most experts */
    double mem = member_layer_bytes(m, mb, layer, n_tok <= 1, false) / (n->mem_bw > 0 ? n->mem_bw : 1e9);
    double cmp = 2.0 * member_layer_bytes(m, mb, layer, true, true) * n_tok / (n->flops > 0 ? n->flops : 1e9);
    return mem > cmp ? mem : cmp;
}

/* deepseek2's tensor-parallel group: an expert group whose members also
 * split the heads (kv_shared), so attention and the dense layers' FFN are
 * all-reduced as well. */
static bool ep_tp(const cm_plan_model *m, const cm_plan_stage *st) {
    for (int i = 0; st->ep && m->kv_shared && i < st->n_members; i++)
        if (st->members[i].kv_head_end - st->members[i].kv_head_begin != m->n_kv_heads) return true;
    return false;
}

/* Time of one layer for the whole group, n_tok tokens at once. */
double cm_plan_stage_layer_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                             const cm_plan_stage *st, int layer, double n_tok, double ar) {
    double worst = 0;
    for (int i = 0; i < st->n_members; i++) {
        double t = member_layer_s(m, c, &st->members[i], layer, n_tok);
        if (t > worst) worst = t;
    }
    if (st->ep) /* one expert exchange instead of two all-reduces (dense layers of a MoE model: none) */
        return worst + (m->layer_expert_bytes[layer] ? expert_exchange_s(m, c, o, st, n_tok) : 0) +
               (ep_tp(m, st) ? (m->layer_expert_bytes[layer] ? 1 : 2) * ar : 0);
    return worst + 2 * ar;
}

double cm_plan_head_s(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_stage *st, double n_tok) {
    for (int i = 0; i < st->n_members; i++) {
        if (!st->members[i].head) continue;
        const cm_plan_node *n = &c->nodes[st->members[i].node];
        double mem = (double)m->head_bytes / (n->mem_bw > 0 ? n->mem_bw : 1e9);
        double cmp = 2.0 * (double)m->head_params * n_tok / (n->flops > 0 ? n->flops : 1e9);
        return mem > cmp ? mem : cmp;
    }
    return 0;
}

static uint64_t kv_head_layer_bytes(const cm_plan_model *m, const cm_plan_opts *o) {
    if (o->kv_k32_bytes > 0 && o->kv_v32_bytes > 0) /* block types: whole blocks per row */
        return ((uint64_t)m->head_dim * (uint64_t)(o->kv_k32_bytes + o->kv_v32_bytes) + 31) / 32 * (uint64_t)o->ctx *
               (uint64_t)o->n_seq;
    return 2ull * (uint64_t)m->head_dim * (uint64_t)o->ctx * (uint64_t)o->n_seq * (uint64_t)o->kv_elem_bytes;
}

/* Bytes member i of stage st needs for layers [a, b). */
static uint64_t member_bytes(const cm_plan_model *m, const cm_plan_opts *o, const cm_plan_member *mb, int a, int b,
                             uint64_t *weights_out, uint64_t *kv_out) {
    double w = 0;
    for (int l = a; l < b; l++) w += member_layer_bytes(m, mb, l, false, false);
    uint64_t weights = (uint64_t)ceil(w);
    if (mb->embed) weights += m->embd_bytes;
    if (mb->head) weights += m->head_bytes;
    uint64_t kv = kv_head_layer_bytes(m, o) * (uint64_t)(m->kv_shared ? 1 : mb->kv_head_end - mb->kv_head_begin) *
                  (uint64_t)(b - a);
    if (weights_out) *weights_out = weights;
    if (kv_out) *kv_out = kv;
    return weights + kv + o->reserve_bytes;
}

uint64_t cm_plan_member_bytes(const cm_plan_model *m, const cm_plan_opts *o, const cm_plan_member *mb, int a, int b) {
    return member_bytes(m, o, mb, a, b, NULL, NULL);
}

bool cm_plan_stage_fits(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o,
                        const cm_plan_stage *st, int a, int b) {
    for (int i = 0; i < st->n_members; i++)
        if (member_bytes(m, o, &st->members[i], a, b, NULL, NULL) > c->nodes[st->members[i].node].mem_bytes)
            return false;
    return true;
}

/* Shared hosts: out = c with each node that group_of uses (>= 0) given
 * 1/k of its flops and memory bandwidth, k = the used nodes on its host. */
void cm_plan_share_hosts(const cm_plan_cluster *c, const int *group_of, cm_plan_cluster *out) {
    *out = *c;
    for (int i = 0; i < c->n_nodes; i++) {
        if (group_of[i] < 0 || !c->nodes[i].host[0]) continue;
        int k = 0;
        for (int j = 0; j < c->n_nodes; j++)
            if (group_of[j] >= 0 && !strcmp(c->nodes[j].host, c->nodes[i].host)) k++;
        if (k > 1) {
            out->nodes[i].flops /= k;
            out->nodes[i].mem_bw /= k;
        }
    }
}

/* The nodes plan p uses, as group_of (stage index, -1 unused). */
void cm_plan_groups(const cm_plan *p, int n_nodes, int *group_of) {
    for (int i = 0; i < n_nodes; i++) group_of[i] = -1;
    for (int s = 0; s < p->n_stages; s++)
        for (int i = 0; i < p->stages[s].n_members; i++)
            if (p->stages[s].members[i].node >= 0 && p->stages[s].members[i].node < n_nodes)
                group_of[p->stages[s].members[i].node] = s;
}

void cm_plan_predict(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p) {
    static _Thread_local cm_plan_cluster eff;
    int group_of[CM_PLAN_MAX_NODES];
    cm_plan_groups(p, c->n_nodes, group_of);
    cm_plan_share_hosts(c, group_of, &eff);
    cm_plan_predict_on(m, &eff, o, p);
}

void cm_plan_replace_replicas(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p) {
    static _Thread_local cm_plan_cluster eff;
    int group_of[CM_PLAN_MAX_NODES];
    cm_plan_groups(p, c->n_nodes, group_of);
    cm_plan_share_hosts(c, group_of, &eff);
    for (int s = 0; s < p->n_stages; s++)
        for (int k = 0; k < p->stages[s].n_members; k++) {
            p->stages[s].members[k].n_replicas = 0;
            p->stages[s].members[k].expert_share = 0;
        }
    if ((o->expert_load || o->expert_load_layers) && m->n_experts > 0) cm_plan_place_replicas(m, &eff, o, p);
    cm_plan_predict_on(m, &eff, o, p);
}

void cm_plan_predict_on(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p) {
    double cycle = 0, bottleneck = 0, ttft = 0;
    double P = o->prompt_tokens > 0 ? o->prompt_tokens : 1;
    for (int s = 0; s < p->n_stages; s++) {
        cm_plan_stage *st = &p->stages[s];
        double ar1 = cm_plan_allreduce_s(m, c, o, st, 1), arP = cm_plan_allreduce_s(m, c, o, st, P);
        double t = 0, tp = 0;
        cm_plan_gpu_fill gf = {0}, gfp = {0}; /* a GPU node's first layers (plan_gpu.c) */
        for (int l = st->first_layer; l < st->last_layer; l++) {
            t += cm_plan_gpu_take(m, c, o, st, &gf, l) ? cm_plan_gpu_layer_s(m, c, st, l, 1)
                                                       : cm_plan_stage_layer_s(m, c, o, st, l, 1, ar1);
            tp += cm_plan_gpu_take(m, c, o, st, &gfp, l) ? cm_plan_gpu_layer_s(m, c, st, l, P)
                                                         : cm_plan_stage_layer_s(m, c, o, st, l, P, arP);
        }
        t += cm_plan_head_s(m, c, st, 1);
        tp += cm_plan_head_s(m, c, st, 1); /* logits only for the last prompt token */
        for (int i = 0; i < st->n_members; i++) {
            cm_plan_member *mb = &st->members[i];
            double mt = 0;
            cm_plan_gpu_fill gm = {0};
            for (int l = st->first_layer; l < st->last_layer; l++)
                mt += cm_plan_gpu_take(m, c, o, st, &gm, l) ? cm_plan_gpu_layer_s(m, c, st, l, 1)
                                                            : member_layer_s(m, c, mb, l, 1);
            mb->layer_s = mt;
            mb->gpu_layers = gm.n;
            member_bytes(m, o, mb, st->first_layer, st->last_layer, &mb->weight_bytes, &mb->kv_bytes);
        }
        int from = st->members[0].node;
        int to = s + 1 < p->n_stages ? p->stages[s + 1].members[0].node : 0;
        double bytes = s + 1 < p->n_stages ? m->dim * 4.0 : 16.0; /* hidden state, or a token id back */
        st->compute_s = t;
        st->hop_s = cm_plan_link_s(c, o, from, to, bytes);
        cycle += t + st->hop_s;
        ttft += tp + cm_plan_link_s(c, o, from, to, s + 1 < p->n_stages ? P * m->dim * 4.0 : 16.0);
    }
    for (int s = 0; s < p->n_stages; s++) {
        /* without compute/communication overlap a stage is busy receiving,
         * computing and sending: that bounds the pipeline's throughput */
        const cm_plan_stage *st = &p->stages[s];
        double busy = st->compute_s + st->hop_s + p->stages[s == 0 ? p->n_stages - 1 : s - 1].hop_s;
        if (p->n_stages == 1) busy = st->compute_s + st->hop_s;
        if (busy > bottleneck) bottleneck = busy;
    }
    p->tok_s = cycle > 0 ? 1.0 / cycle : 0;
    p->kv_ctx = o->ctx;
    p->kv_n_seq = o->n_seq;
    p->kv_bytes_total = 0;
    for (int s = 0; s < p->n_stages; s++)
        for (int i = 0; i < p->stages[s].n_members; i++) p->kv_bytes_total += p->stages[s].members[i].kv_bytes;
    double agg = cycle > 0 ? o->n_seq / cycle : 0;
    if (bottleneck > 0 && agg > 1.0 / bottleneck) agg = 1.0 / bottleneck;
    p->tok_s_aggregate = agg;
    p->ttft_s = ttft;
    p->bytes_per_token_hop = (uint64_t)m->dim * 4;
    p->bytes_per_token_tp = 0;
    p->bytes_per_token_ep = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        if (!st->ep) continue;
        for (int l = st->first_layer; l < st->last_layer; l++)
            if (m->layer_expert_bytes[l])
                p->bytes_per_token_ep +=
                    (uint64_t)(st->n_members - 1) * (uint64_t)m->n_experts_used * (uint64_t)m->dim * 4;
    }
    for (int s = 0; s < p->n_stages; s++)
        if (p->stages[s].n_members > 1 && !p->stages[s].ep)
            p->bytes_per_token_tp +=
                2ull * (uint64_t)(p->stages[s].last_layer - p->stages[s].first_layer) * (uint64_t)m->dim * 4;
        else if (ep_tp(m, &p->stages[s])) /* attention, and the FFN of the dense layers */
            for (int l = p->stages[s].first_layer; l < p->stages[s].last_layer; l++)
                p->bytes_per_token_tp += (m->layer_expert_bytes[l] ? 1ull : 2ull) * (uint64_t)m->dim * 4;
}
