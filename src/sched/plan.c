/*
 * plan.c: the placement policy (see plan.h for the cost model).
 * PURE: no sockets, files, clocks or globals; the same input gives the same
 * plan. Every number it uses comes from its arguments.
 */
#include "plan.h"
#include "plan_gpu.h"
#include "plan_impl.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *k_parallel_names[CM_PARALLEL_COUNT] = {"auto", "pp", "tp", "hybrid", "ep"};

const char *cm_parallel_name(enum cm_parallel p) {
    return (unsigned)p < CM_PARALLEL_COUNT ? k_parallel_names[p] : "unknown";
}

int cm_parallel_from_name(const char *s) {
    for (int i = 0; i < CM_PARALLEL_COUNT; i++)
        if (!strcmp(s, k_parallel_names[i])) return i;
    return -1;
}

void cm_plan_opts_default(cm_plan_opts *o) {
    memset(o, 0, sizeof *o);
    o->ctx = 2048;
    o->n_seq = 1;
    o->kv_elem_bytes = 4;
    o->prompt_tokens = 128;
    o->mode = CM_PARALLEL_AUTO;
    o->reserve_bytes = 256ull << 20;
    o->exchange_overhead_s = 30e-6;
}

/* ---- slices inside a group ---- */

/* Split `units` among k members proportionally to w[], largest remainder,
 * each member getting at least `min_each` (when units allow). */
static void split_units(int units, int k, const double *w, int min_each, int *out) {
    double wsum = 0;
    for (int i = 0; i < k; i++) wsum += w[i] > 0 ? w[i] : 0;
    if (min_each * k > units) min_each = 0;
    int rest = units - min_each * k, given = 0;
    double rem[CM_PLAN_MAX_NODES];
    for (int i = 0; i < k; i++) {
        double exact = wsum > 0 ? rest * (w[i] > 0 ? w[i] : 0) / wsum : (double)rest / k;
        out[i] = (int)floor(exact);
        rem[i] = exact - out[i];
        given += out[i];
    }
    while (given < rest) { /* hand out the remainder, largest fraction first, ties to lower index */
        int best = 0;
        for (int i = 1; i < k; i++)
            if (rem[i] > rem[best]) best = i;
        out[best]++;
        rem[best] = -1;
        given++;
    }
    for (int i = 0; i < k; i++) out[i] += min_each;
}

/* Expert group (a group of several members over a model with experts):
 * every member holds the attention, router and shared expert whole and a
 * contiguous range of the experts, in member order, sized in proportion to
 * its memory bandwidth (decode reads the chosen experts where they are), or,
 * by_mem, to its memory beyond the reserve (when a split by speed does not
 * fit); each member gets at least one expert when there are enough. */
static void expert_ranges(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan_stage *st,
                          bool by_mem) {
    int k = st->n_members, share[CM_PLAN_MAX_NODES];
    double w[CM_PLAN_MAX_NODES] = {0};
    for (int i = 0; i < k; i++) {
        const cm_plan_node *nd = &c->nodes[st->members[i].node];
        w[i] =
            by_mem ? (nd->mem_bytes > o->reserve_bytes ? (double)(nd->mem_bytes - o->reserve_bytes) : 0) : nd->mem_bw;
    }
    split_units(m->n_experts, k, w, 1, share);
    st->ep = k > 1;
    for (int i = 0, e = 0; i < k; i++) {
        cm_plan_member *mb = &st->members[i];
        mb->expert_begin = e;
        e += share[i];
        mb->expert_end = i == k - 1 ? m->n_experts : e;
    }
}

static void assign_experts(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan_stage *st,
                           bool by_mem) {
    expert_ranges(m, c, o, st, by_mem);
    for (int i = 0; i < st->n_members; i++) {
        cm_plan_member *mb = &st->members[i];
        mb->kv_head_begin = 0;
        mb->kv_head_end = m->n_kv_heads;
        mb->ffn_begin = 0;
        mb->ffn_end = m->ffn;
    }
}

/* Fill kv-head and FFN ranges of a stage's members from their speeds. */
static void assign_slices(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan_stage *st,
                          bool by_mem) {
    int k = st->n_members;
    /* --parallel tp asks for tensor-parallel FFN rows, which the forward pass
     * refuses for experts with its own message (tests/sh/cluster_moe.sh). */
    if (m->n_experts > 0 && k > 1 && o->mode != CM_PARALLEL_TP) {
        assign_experts(m, c, o, st, by_mem);
        return;
    }
    st->ep = false;
    double w[CM_PLAN_MAX_NODES];
    int heads[CM_PLAN_MAX_NODES], units[CM_PLAN_MAX_NODES];
    for (int i = 0; i < k; i++) w[i] = c->nodes[st->members[i].node].mem_bw;
    /* Boundaries only where cm_slice_check allows them: heads in units of
     * head_granule, FFN rows in units of ffn_granule; the last member takes
     * any remainder (the ends of the ranges are always legal). */
    int hg = m->head_granule > 0 ? m->head_granule : 1;
    split_units(m->n_kv_heads / hg > 0 ? m->n_kv_heads / hg : 1, k, w, 1, heads);
    int gran = m->ffn_granule > 0 ? m->ffn_granule : 1;
    split_units(m->ffn / gran > 0 ? m->ffn / gran : 1, k, w, 1, units);
    int h = 0, f = 0;
    for (int i = 0; i < k; i++) {
        cm_plan_member *mb = &st->members[i];
        mb->kv_head_begin = h;
        h += heads[i] * hg;
        if (h > m->n_kv_heads || i == k - 1) h = m->n_kv_heads;
        mb->kv_head_end = h;
        mb->ffn_begin = f;
        f += units[i] * gran;
        if (f > m->ffn) f = m->ffn;
        mb->ffn_end = i == k - 1 ? m->ffn : f;
        mb->expert_begin = 0;
        mb->expert_end = m->n_experts;
    }
    /* deepseek2 (kv_shared): tensor-parallel heads and dense rows as above,
     * the MoE layers' experts as an expert group (ep_tp below). */
    if (m->n_experts > 0 && k > 1 && m->kv_shared) expert_ranges(m, c, o, st, by_mem);
}

/* ---- links that are down (cm_plan_cluster.down) ---- */

static bool link_down(const cm_plan_cluster *c, int a, int b) { return a != b && (c->down[a][b] || c->down[b][a]); }

/* The first link of plan p that is down (cm_plan_cluster.down): a hop
 * between adjacent stages' first members, or two members of one group. */
static bool plan_uses_down(const cm_plan_cluster *c, const cm_plan *p, int *a, int *b) {
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        for (int i = 0; i < st->n_members; i++)
            for (int j = i + 1; j < st->n_members; j++)
                if (link_down(c, st->members[i].node, st->members[j].node)) {
                    *a = st->members[i].node, *b = st->members[j].node;
                    return true;
                }
        if (s + 1 < p->n_stages && link_down(c, st->members[0].node, p->stages[s + 1].members[0].node)) {
            *a = st->members[0].node, *b = p->stages[s + 1].members[0].node;
            return true;
        }
    }
    return false;
}

/* Pipeline over order[0..n): keep the longest prefix whose hops are all up
 * (group_of: position in it, -1 for the nodes after the first down hop).
 * Returns the prefix length. */
static int chain_prefix(const cm_plan_cluster *c, const int *order, int n, int max_stages, int *group_of) {
    int k = 0;
    for (int i = 0; i < c->n_nodes; i++) group_of[i] = -1;
    while (k < n && k < max_stages && (k == 0 || !link_down(c, order[k - 1], order[k]))) {
        group_of[order[k]] = k;
        k++;
    }
    return k;
}

/* ---- layer split across stages ---- */

/* Layer k's time in stage s: on the stage's GPU while it holds them (f), else lay_s's. */
static double layer_t(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const cm_plan_stage *st,
                      cm_plan_gpu_fill *f, const double *lay_s, int s, int k) {
    return cm_plan_gpu_take(m, c, o, st, f, k) ? cm_plan_gpu_layer_s(m, c, st, k, 1)
                                               : lay_s[s * CM_PLAN_MAX_LAYERS + k];
}

/* Greedy fill under a bottleneck time T: stage s takes layers while its time
 * (with its outgoing hop) stays <= T and its members' memory holds them,
 * leaving at least one layer for each later stage. */
static bool fill_under(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p,
                       const double *lay_s, const double *hop, double T) {
    int G = p->n_stages, l = 0;
    for (int s = 0; s < G; s++) {
        cm_plan_stage *st = &p->stages[s];
        int left_for_later = G - 1 - s;
        double t = s == G - 1 ? cm_plan_head_s(m, c, st, 1) : 0;
        t += hop[s] + hop[s == 0 ? G - 1 : s - 1]; /* a stage sends and receives */
        st->first_layer = l;
        int b = l;
        cm_plan_gpu_fill gf = {0};
        if (s == G - 1) {
            b = m->n_layers;
            for (int k = l; k < b; k++) t += layer_t(m, c, o, st, &gf, lay_s, s, k);
            if (t > T || !cm_plan_stage_fits(m, c, o, st, l, b)) return false;
        } else if (s == 0 && o->first_stage_layers > 0) {
            /* Pinned: the coordinator already holds these layers (its memory
             * is not checked again: what it uses for them is no longer free). */
            b = o->first_stage_layers;
            if (b > m->n_layers - left_for_later) return false;
            for (int k = l; k < b; k++) t += layer_t(m, c, o, st, &gf, lay_s, 0, k);
            if (t > T && T < 1e30) return false;
        } else {
            while (b < m->n_layers - left_for_later) {
                cm_plan_gpu_fill g2 = gf;
                double nt = t + layer_t(m, c, o, st, &g2, lay_s, s, b);
                if (b > l && (nt > T || !cm_plan_stage_fits(m, c, o, st, l, b + 1))) break;
                if (b == l && !cm_plan_stage_fits(m, c, o, st, l, b + 1)) return false;
                gf = g2;
                t = nt;
                b++;
            }
            if (t > T && b == l + 1 && T < 1e30) return false;
        }
        st->last_layer = b;
        l = b;
    }
    return l == m->n_layers;
}

static int plan_for_groups(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const int *group_of,
                           bool by_mem, cm_plan *out, char *err, size_t errlen);

int cm_plan_for_groups(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const int *group_of,
                       cm_plan *out, char *err, size_t errlen) {
    int rc = plan_for_groups(m, c, o, group_of, false, out, err, errlen);
    /* Experts split by speed do not fit: split them by memory instead. */
    if (rc == CM_ENOSPACE && m && m->n_experts > 0) {
        char e2[512];
        if (!plan_for_groups(m, c, o, group_of, true, out, e2, sizeof e2)) return 0;
    }
    return rc;
}

static int plan_for_groups(const cm_plan_model *m, const cm_plan_cluster *c_in, const cm_plan_opts *o,
                           const int *group_of, bool by_mem, cm_plan *out, char *err, size_t errlen) {
    if (!m || !c_in || !o || !out || !group_of) return cm_errf(err, errlen, CM_EINVAL, "plan: missing argument");
    if (c_in->n_nodes < 1 || c_in->n_nodes > CM_PLAN_MAX_NODES)
        return cm_errf(err, errlen, CM_EINVAL, "plan: %d nodes (1..%d supported)", c_in->n_nodes, CM_PLAN_MAX_NODES);
    /* Everything below plans on the nodes' shares of their hosts. */
    static _Thread_local cm_plan_cluster eff;
    cm_plan_share_hosts(c_in, group_of, &eff);
    const cm_plan_cluster *c = &eff;
    if (c->n_nodes < 1 || c->n_nodes > CM_PLAN_MAX_NODES)
        return cm_errf(err, errlen, CM_EINVAL, "plan: %d nodes (1..%d supported)", c->n_nodes, CM_PLAN_MAX_NODES);
    if (m->n_layers < 1 || m->n_layers > CM_PLAN_MAX_LAYERS || m->n_kv_heads < 1 || m->dim < 1 || m->ffn < 1)
        return cm_errf(err, errlen, CM_EINVAL, "plan: bad model shape (%d layers)", m->n_layers);
    if (m->n_experts < 0 || (m->n_experts > 0 && (m->n_experts_used < 1 || m->n_experts_used > m->n_experts)))
        return cm_errf(err, errlen, CM_EINVAL, "plan: %d of %d experts used", m->n_experts_used, m->n_experts);
    memset(out, 0, sizeof *out);
    int G = 0;
    for (int i = 0; i < c->n_nodes; i++)
        if (group_of[i] >= 0 && group_of[i] + 1 > G) G = group_of[i] + 1;
    if (G < 1) return cm_errf(err, errlen, CM_EINVAL, "plan: no node is used");
    if (G > m->n_layers)
        return cm_errf(err, errlen, CM_EINVAL, "plan: %d pipeline stages for %d layers", G, m->n_layers);
    out->n_stages = G;
    for (int i = 0; i < c->n_nodes; i++) {
        if (group_of[i] < 0) continue;
        cm_plan_stage *st = &out->stages[group_of[i]];
        st->members[st->n_members++].node = i;
    }
    bool any_tp = false;
    int da, db;
    for (int s = 0; s < G; s++)
        if (out->stages[s].n_members == 0) return cm_errf(err, errlen, CM_EINVAL, "plan: stage %d has no node", s);
    if (plan_uses_down(c, out, &da, &db))
        return cm_errf(err, errlen, CM_EINVAL, "plan: the link between %s and %s is down", c->nodes[da].name,
                       c->nodes[db].name);
    for (int s = 0; s < G; s++) {
        cm_plan_stage *st = &out->stages[s];
        if (st->n_members > 1) any_tp = true;
        assign_slices(m, c, o, st, by_mem);
    }
    /* embedding on the first stage, head on the last: the member with the most memory */
    for (int pass = 0; pass < 2; pass++) {
        cm_plan_stage *st = &out->stages[pass == 0 ? 0 : G - 1];
        int best = 0;
        for (int i = 1; i < st->n_members; i++)
            if (c->nodes[st->members[i].node].mem_bytes > c->nodes[st->members[best].node].mem_bytes) best = i;
        if (pass == 0) st->members[best].embed = true;
        else st->members[best].head = true;
    }
    out->mode = G == 1 && any_tp ? CM_PARALLEL_TP : !any_tp ? CM_PARALLEL_PP : CM_PARALLEL_HYBRID;
    if (any_tp && m->n_experts > 0 && o->mode != CM_PARALLEL_TP) out->mode = CM_PARALLEL_EP; /* expert groups */

    /* per-stage per-layer times and hops, then binary search the bottleneck */
    static const int LMAX = CM_PLAN_MAX_LAYERS;
    double lay_s[CM_PLAN_MAX_NODES * CM_PLAN_MAX_LAYERS];
    double hop[CM_PLAN_MAX_NODES];
    double hi = 0;
    for (int s = 0; s < G; s++) {
        cm_plan_stage *st = &out->stages[s];
        double ar = cm_plan_allreduce_s(m, c, o, st, 1);
        for (int l = 0; l < m->n_layers; l++) {
            lay_s[s * LMAX + l] = cm_plan_stage_layer_s(m, c, o, st, l, 1, ar);
            hi += lay_s[s * LMAX + l];
        }
        int to = s + 1 < G ? out->stages[s + 1].members[0].node : 0;
        hop[s] = cm_plan_link_s(c, o, st->members[0].node, to, s + 1 < G ? m->dim * 4.0 : 16.0);
        hi += hop[s] + cm_plan_head_s(m, c, st, 1);
    }
    if (!fill_under(m, c, o, out, lay_s, hop, 1e300)) {
        /* does not fit: say how much is missing */
        uint64_t need = 0, have = 0;
        cm_plan_member whole = {0};
        whole.kv_head_end = m->n_kv_heads;
        whole.ffn_end = m->ffn;
        whole.expert_end = m->n_experts;
        whole.embed = whole.head = true;
        need = cm_plan_member_bytes(m, o, &whole, 0, m->n_layers) - o->reserve_bytes;
        for (int i = 0; i < c->n_nodes; i++)
            if (group_of[i] >= 0) {
                uint64_t mb = c->nodes[i].mem_bytes;
                have += mb > o->reserve_bytes ? mb - o->reserve_bytes : 0;
            }
        if (need > have)
            return cm_errf(err, errlen, CM_ENOSPACE,
                           "model does not fit: needs %.2f GiB (weights + KV at ctx %d x %d seq), the nodes offer "
                           "%.2f GiB; %.2f GiB missing — add a node, lower --ctx, or use a smaller quantization",
                           need / 1073741824.0, o->ctx, o->n_seq, have / 1073741824.0, (need - have) / 1073741824.0);
        return cm_errf(err, errlen, CM_ENOSPACE,
                       "model does not fit this split: a node's share exceeds its memory (needs %.2f GiB in all, "
                       "%.2f GiB offered); lower --ctx or try another --parallel mode",
                       need / 1073741824.0, have / 1073741824.0);
    }
    double lo = 0;
    for (int it = 0; it < 80; it++) {
        double mid = (lo + hi) / 2;
        if (fill_under(m, c, o, out, lay_s, hop, mid)) hi = mid;
        else lo = mid;
    }
    if (!fill_under(m, c, o, out, lay_s, hop, hi)) fill_under(m, c, o, out, lay_s, hop, 1e300);
    if ((o->expert_load || o->expert_load_layers) && m->n_experts > 0)
        cm_plan_place_replicas(m, c, o, out); /* replicas.c */
    cm_plan_predict_on(m, c, o, out);
    return 0;
}

static void describe(cm_plan *p, const cm_plan_cluster *c, const char *extra) {
    int n = snprintf(p->why, sizeof p->why, "%s plan, %d stage%s: ", cm_parallel_name(p->mode), p->n_stages,
                     p->n_stages == 1 ? "" : "s");
    for (int s = 0; s < p->n_stages && n < (int)sizeof p->why; s++) {
        const cm_plan_stage *st = &p->stages[s];
        n += snprintf(p->why + n, sizeof p->why - (size_t)n, "%s[", s ? " -> " : "");
        for (int i = 0; i < st->n_members && n < (int)sizeof p->why; i++)
            n += snprintf(p->why + n, sizeof p->why - (size_t)n, "%s%s", i ? "+" : "",
                          c->nodes[st->members[i].node].name);
        if (n < (int)sizeof p->why)
            n += snprintf(p->why + n, sizeof p->why - (size_t)n, "] layers %d-%d", st->first_layer, st->last_layer - 1);
    }
    if (n < (int)sizeof p->why)
        snprintf(p->why + n, sizeof p->why - (size_t)n, "; predicted %.1f tok/s for one stream%s", p->tok_s, extra);
}

/* Pipeline over every order of nodes 1..n-1 (node 0, the coordinator, keeps
 * the first stage): lexicographic permutations from the given order, so ties
 * keep the earliest, i.e. the cluster's own order. */
static int plan_best_order(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *out,
                           char *err, size_t errlen) {
    int n = c->n_nodes, perm[CM_PLAN_MAX_NODES], group_of[CM_PLAN_MAX_NODES];
    for (int i = 0; i < n; i++) perm[i] = i;
    static _Thread_local cm_plan best, cand; /* large; one plan at a time per thread */
    bool have = false;
    int tried = 0, rc_first = 0;
    char e1[512] = "";
    double given_score = -1;
    int used_best = 0;
    for (;;) {
        /* A down link ends the chain: the nodes after it sit this plan out
         * (another order may use them). */
        int used = chain_prefix(c, perm, n, n, group_of);
        char e2[512];
        int rc = cm_plan_for_groups(m, c, o, group_of, &cand, e2, sizeof e2);
        if (tried++ == 0 && rc) {
            rc_first = rc;
            snprintf(e1, sizeof e1, "%s", e2);
        }
        if (!rc) {
            double score = o->n_seq > 1 ? cand.tok_s_aggregate : cand.tok_s;
            if (tried == 1) given_score = score;
            double best_score = have ? (o->n_seq > 1 ? best.tok_s_aggregate : best.tok_s) : -1;
            /* Every node is used when some order allows it (as without down
             * links); only then does the speed decide. */
            if (used > used_best || (used == used_best && score > best_score * (1 + 1e-9))) {
                best = cand;
                have = true;
                used_best = used;
            }
        }
        /* next permutation of perm[1..n-1] */
        int i = n - 2;
        while (i >= 1 && perm[i] > perm[i + 1]) i--;
        if (i < 1) break;
        int j = n - 1;
        while (perm[j] < perm[i]) j--;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        for (int a = i + 1, b = n - 1; a < b; a++, b--) {
            t = perm[a];
            perm[a] = perm[b];
            perm[b] = t;
        }
    }
    if (!have) return cm_errf(err, errlen, rc_first ? rc_first : CM_ENOSPACE, "%s", e1[0] ? e1 : "no order fits");
    *out = best;
    char extra[200];
    const char *by = o->n_seq > 1 ? "aggregate" : "one-stream";
    double got = o->n_seq > 1 ? best.tok_s_aggregate : best.tok_s;
    int o2 = given_score > 0
                 ? snprintf(extra, sizeof extra, " (best of %d node orders by %s tok/s: %.1f; the given order: %.1f)",
                            tried, by, got, given_score)
                 : snprintf(extra, sizeof extra, " (best of %d node orders by %s tok/s: %.1f)", tried, by, got);
    if (used_best < n && o2 > 0 && o2 < (int)sizeof extra)
        snprintf(extra + o2, sizeof extra - (size_t)o2, "; %d node%s left out: a link between nodes is down",
                 n - used_best, n - used_best == 1 ? "" : "s");
    describe(out, c, extra);
    return 0;
}

int cm_plan_make(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *out, char *err,
                 size_t errlen) {
    if (!c || c->n_nodes < 1 || c->n_nodes > CM_PLAN_MAX_NODES)
        return cm_errf(err, errlen, CM_EINVAL, "plan: need 1..%d nodes", CM_PLAN_MAX_NODES);
    int n = c->n_nodes;
    int group_of[CM_PLAN_MAX_NODES];
    int rc;
    char e2[512] = "";
    /* Experts are split across a group by expert (ep), never by rows: a
     * group over an MoE model in auto or hybrid mode is an expert group. */
    if (m->n_experts > 0 && n > 1 && o->mode == CM_PARALLEL_TP && !m->kv_shared)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "tensor-parallel plans of a mixture-of-experts model (%d experts) are not supported; "
                       "use --parallel ep (experts across the group) or pp",
                       m->n_experts);
    if (o->mode == CM_PARALLEL_PP && o->reorder && n >= 3 && n <= CM_PLAN_REORDER_MAX && n <= m->n_layers)
        return plan_best_order(m, c, o, out, err, errlen);
    if (o->mode == CM_PARALLEL_EP && m->n_experts < 1)
        return cm_errf(err, errlen, CM_EINVAL,
                       "expert parallelism needs a mixture-of-experts model (this one has no experts)");
    if (o->mode == CM_PARALLEL_PP || o->mode == CM_PARALLEL_TP || o->mode == CM_PARALLEL_EP || n == 1) {
        if (o->mode == CM_PARALLEL_TP || o->mode == CM_PARALLEL_EP) {
            /* One group: node 0, then every node with no down link to one
             * already in it. */
            for (int i = 0; i < n; i++) {
                group_of[i] = 0;
                for (int j = 0; j < i; j++)
                    if (group_of[j] == 0 && link_down(c, i, j)) group_of[i] = -1;
            }
        } else {
            int order[CM_PLAN_MAX_NODES];
            for (int i = 0; i < n; i++) order[i] = i;
            chain_prefix(c, order, n, m->n_layers, group_of);
        }
        rc = cm_plan_for_groups(m, c, o, group_of, out, err, errlen);
        if (rc == 0) describe(out, c, o->mode == CM_PARALLEL_AUTO ? "" : " (forced by --parallel)");
        return rc;
    }
    /* AUTO / HYBRID: every split of the node order into contiguous groups
     * (2^(n-1) of them; beyond 12 nodes only groups of equal size). */
    cm_plan best, cand;
    bool have = false;
    double best_pp = 0, best_tp = 0;
    int compositions = n <= 12 ? 1 << (n - 1) : 0;
    for (int mask = 0; mask < compositions || (compositions == 0 && mask < n); mask++) {
        if (compositions) {
            int g = 0;
            group_of[0] = 0;
            for (int i = 1; i < n; i++) {
                if (mask & (1 << (i - 1))) g++;
                group_of[i] = g;
            }
        } else {
            int size = mask + 1;
            if (n % size) continue;
            for (int i = 0; i < n; i++) group_of[i] = i / size;
        }
        if (cm_plan_for_groups(m, c, o, group_of, &cand, e2, sizeof e2) != 0) continue;
        if (o->mode == CM_PARALLEL_HYBRID && cand.mode != CM_PARALLEL_HYBRID && cand.mode != CM_PARALLEL_EP) continue;
        if (o->mode == CM_PARALLEL_HYBRID && cand.n_stages < 2) continue;
        if (cand.mode == CM_PARALLEL_PP && cand.tok_s > best_pp) best_pp = cand.tok_s;
        if ((cand.mode == CM_PARALLEL_TP || (cand.mode == CM_PARALLEL_EP && cand.n_stages == 1)) &&
            cand.tok_s > best_tp)
            best_tp = cand.tok_s;
        double score = o->n_seq > 1 ? cand.tok_s_aggregate : cand.tok_s;
        double best_score = have ? (o->n_seq > 1 ? best.tok_s_aggregate : best.tok_s) : -1;
        if (score > best_score * (1 + 1e-9)) {
            best = cand;
            have = true;
        }
    }
    if (!have && o->mode == CM_PARALLEL_HYBRID)
        return cm_errf(err, errlen, CM_EINVAL,
                       "no hybrid plan for %d node%s: hybrid needs 3 or more nodes and a fitting split%s%s", n,
                       n == 1 ? "" : "s", e2[0] ? " — " : "", e2);
    if (!have) {
        /* report the plain pipeline's error: it is the one that uses all memory best */
        for (int i = 0; i < n; i++) group_of[i] = i < m->n_layers ? i : -1;
        rc = cm_plan_for_groups(m, c, o, group_of, out, err, errlen);
        return rc ? rc : cm_errf(err, errlen, CM_ENOSPACE, "no plan fits: %s", e2);
    }
    *out = best;
    char extra[200];
    snprintf(extra, sizeof extra, " (best of all splits; pipeline-only best %.1f, tensor-only %.1f)", best_pp, best_tp);
    describe(out, c, extra);
    return 0;
}

void cm_plan_model_synthetic(cm_plan_model *m, int n_layers, int dim, int n_heads, int n_kv_heads, int ffn, int n_vocab,
                             double bits_per_weight) {
    memset(m, 0, sizeof *m);
    if (n_layers > CM_PLAN_MAX_LAYERS) n_layers = CM_PLAN_MAX_LAYERS;
    m->n_layers = n_layers;
    m->dim = dim;
    m->n_heads = n_heads;
    m->n_kv_heads = n_kv_heads;
    m->head_dim = n_heads ? dim / n_heads : 0;
    m->ffn = ffn;
    m->n_vocab = n_vocab;
    m->ffn_granule = 256;
    m->head_granule = 1; /* (n_heads / n_kv_heads) * head_dim columns per KV head: a multiple of 256 in practice */
    uint64_t attn = (uint64_t)dim * (uint64_t)m->head_dim * (2ull * (uint64_t)n_heads + 2ull * (uint64_t)n_kv_heads);
    uint64_t params = attn + 3ull * (uint64_t)dim * (uint64_t)ffn + 2ull * (uint64_t)dim;
    for (int l = 0; l < n_layers; l++) {
        m->layer_params[l] = params;
        m->layer_bytes[l] = (uint64_t)(params * bits_per_weight / 8.0);
    }
    m->embd_bytes = (uint64_t)((double)n_vocab * dim * bits_per_weight / 8.0);
    m->head_params = (uint64_t)n_vocab * (uint64_t)dim;
    m->head_bytes = (uint64_t)((double)n_vocab * dim * 6.5625 / 8.0); /* output head is usually Q6_K */
}

void cm_plan_model_synthetic_moe(cm_plan_model *m, int n_layers, int dim, int n_heads, int n_kv_heads, int n_expert,
                                 int n_used, int ffn_exp, int ffn_shared, int n_vocab, double bits_per_weight) {
    cm_plan_model_synthetic(m, n_layers, dim, n_heads, n_kv_heads, ffn_exp > 0 ? ffn_exp : 1, n_vocab, bits_per_weight);
    m->n_experts = n_expert;
    m->n_experts_used = n_used;
    uint64_t attn = (uint64_t)dim * (uint64_t)m->head_dim * (2ull * (uint64_t)n_heads + 2ull * (uint64_t)n_kv_heads);
    uint64_t experts = 3ull * (uint64_t)dim * (uint64_t)ffn_exp * (uint64_t)n_expert;
    uint64_t dense =
        attn + 3ull * (uint64_t)dim * (uint64_t)ffn_shared + (uint64_t)dim * (uint64_t)n_expert + 2ull * (uint64_t)dim;
    for (int l = 0; l < m->n_layers; l++) {
        m->layer_params[l] = dense + experts;
        m->layer_expert_params[l] = experts;
        m->layer_bytes[l] = (uint64_t)((double)(dense + experts) * bits_per_weight / 8.0);
        m->layer_expert_bytes[l] = (uint64_t)((double)experts * bits_per_weight / 8.0);
    }
}

static int stage_set(int *up, int s) { /* cm_plan_pipe_groups' union-find root */
    while (up[s] != s) s = up[s] = up[up[s]];
    return s;
}

int cm_plan_pipe_groups(const cm_plan *p, const cm_plan_cluster *c) {
    int up[CM_PLAN_MAX_NODES], n = p->n_stages < 1 ? 0 : CM_MIN(p->n_stages, CM_PLAN_MAX_NODES), sets = n;
    for (int s = 0; s < n; s++) up[s] = s;
    for (int s = 0; s < n; s++)
        for (int t = s + 1; t < n; t++)
            for (int i = 0; i < p->stages[s].n_members; i++)
                for (int j = 0; j < p->stages[t].n_members; j++) {
                    const char *a = c->nodes[p->stages[s].members[i].node].host;
                    const char *b = c->nodes[p->stages[t].members[j].node].host;
                    const int rs = stage_set(up, s), rt = stage_set(up, t);
                    if (!a[0] || rs == rt || strcmp(a, b) != 0) continue;
                    up[rt] = rs;
                    sets--;
                }
    return sets < 1 ? 1 : sets;
}

void cm_plan_format(const cm_plan *p, const cm_plan_model *m, const cm_plan_cluster *c_in, char *buf, size_t n) {
    size_t k = 0;
    static _Thread_local cm_plan_cluster eff;
    int group_of[CM_PLAN_MAX_NODES];
    cm_plan_groups(p, c_in->n_nodes, group_of);
    cm_plan_share_hosts(c_in, group_of, &eff);
    const cm_plan_cluster *c = &eff;
#define OUT(...) (k = cm_appendf(buf, n, k, __VA_ARGS__))
    int w = 16;
    for (int s = 0; s < p->n_stages; s++)
        for (int i = 0; i < p->stages[s].n_members; i++) {
            int l = (int)strlen(c->nodes[p->stages[s].members[i].node].name);
            if (l > w) w = l;
        }
    OUT("%-*s %-5s %-7s %-9s %-10s %10s %10s %10s\n", w, "node", "stage", "layers", "kv-heads", "ffn-rows", "weights",
        "kv-cache", "ms/token");
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        for (int i = 0; i < st->n_members; i++) {
            const cm_plan_member *mb = &st->members[i];
            char lay[32], hr[32], fr[32];
            snprintf(lay, sizeof lay, "%d-%d", st->first_layer, st->last_layer - 1);
            snprintf(hr, sizeof hr, "%d-%d", mb->kv_head_begin, mb->kv_head_end - 1);
            if (st->ep) snprintf(fr, sizeof fr, "e%d-%d", mb->expert_begin, mb->expert_end - 1); /* experts */
            else snprintf(fr, sizeof fr, "%d-%d", mb->ffn_begin, mb->ffn_end - 1);
            char gl[32] = ""; /* the first layers on its GPU */
            if (mb->gpu_layers) snprintf(gl, sizeof gl, " gpu:%d", mb->gpu_layers);
            OUT("%-*s %-5d %-7s %-9s %-10s %9.1fM %9.1fM %10.3f%s%s%s\n", w, c->nodes[mb->node].name, s, lay, hr, fr,
                mb->weight_bytes / 1048576.0, mb->kv_bytes / 1048576.0, mb->layer_s * 1e3, mb->embed ? " embed" : "",
                mb->head ? " head" : "", gl);
        }
    }
    if (p->n_stages > 1) {
        /* the hops the cost model charges (one token's hidden state; the
         * last one is the token id back to the first stage) */
        OUT("hops (ms per token):");
        for (int s = 0; s < p->n_stages; s++)
            OUT(" %d->%d %.3f%s", s, s + 1 < p->n_stages ? s + 1 : 0, p->stages[s].hop_s * 1e3,
                s + 1 < p->n_stages ? "," : ";");
        OUT(" output head %.3f\n", cm_plan_head_s(m, c, &p->stages[p->n_stages - 1], 1) * 1e3);
    }
    if (p->kv_n_seq > 0) /* the kv-cache column holds every sequence's; say it per sequence too */
        OUT("kv cache: %.2f MiB per sequence (%d positions), %.2f MiB in all for %d sequence%s\n",
            p->kv_bytes_total / 1048576.0 / p->kv_n_seq, p->kv_ctx, p->kv_bytes_total / 1048576.0, p->kv_n_seq,
            p->kv_n_seq == 1 ? "" : "s");
    for (int i = 0; i < c->n_nodes; i++) { /* hosts shared by members of the plan */
        if (group_of[i] < 0 || !c->nodes[i].host[0]) continue;
        int first = -1, cnt = 0;
        for (int j = 0; j < c->n_nodes; j++)
            if (group_of[j] >= 0 && !strcmp(c->nodes[j].host, c->nodes[i].host)) {
                if (first < 0) first = j;
                cnt++;
            }
        if (first != i || cnt < 2) continue;
        OUT("shared host %s: %d members (", c->nodes[i].host, cnt);
        for (int j = 0, w2 = 0; j < c->n_nodes; j++)
            if (group_of[j] >= 0 && !strcmp(c->nodes[j].host, c->nodes[i].host))
                OUT("%s%s", w2++ ? ", " : "", c->nodes[j].name);
        OUT(") share its cores and memory bandwidth: each planned at 1/%d\n", cnt);
    }
    if (p->n_stages > 1) { /* serve's default (batch_pipe.c; CUMULO_PIPE_GROUPS overrides it) */
        const int g = cm_plan_pipe_groups(p, c_in);
        OUT("serving: %d micro-batch%s in flight (%s)\n", g, g == 1 ? "" : "es",
            g == p->n_stages ? "a host per stage" : "stages that share a host take turns");
    }
    OUT("mode %s; one stream %.2f tok/s; aggregate %.2f tok/s; time to first token %.3f s\n", cm_parallel_name(p->mode),
        p->tok_s, p->tok_s_aggregate, p->ttft_s);
    OUT("per token: %llu bytes per pipeline hop, %llu bytes of tensor-parallel all-reduce per member\n",
        (unsigned long long)p->bytes_per_token_hop, (unsigned long long)p->bytes_per_token_tp);
    if (m->n_experts > 0) /* ffn-rows shows e<first>-<last>: the experts each member of an expert group holds */
        OUT("experts: %d, %d used per token; %llu bytes of expert exchange per token (all members)\n", m->n_experts,
            m->n_experts_used, (unsigned long long)p->bytes_per_token_ep);
    OUT("why: %s\n", p->why);
#undef OUT
}
