/* test_plan.c: the planner as a pure function, table-tested on imaginary
 * clusters (Mac minis, mixed boxes, slow links, too little memory). */
#include "test.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gpu/gpu.h"
#include "sched/plan.h"
#include "sched/simulate.h"

#define GiB (1024.0 * 1024 * 1024)

static void add_node(cm_plan_cluster *c, const char *name, double mem_gib, double bw_gbs, double tflops) {
    cm_plan_node *n = &c->nodes[c->n_nodes++];
    snprintf(n->name, sizeof n->name, "%s", name);
    n->mem_bytes = (uint64_t)(mem_gib * GiB);
    n->mem_bw = bw_gbs * 1e9;
    n->flops = tflops * 1e12;
}

static void links_all(cm_plan_cluster *c, double rtt_ms, double gbit) {
    for (int i = 0; i < CM_PLAN_MAX_NODES; i++)
        for (int j = 0; j < CM_PLAN_MAX_NODES; j++) {
            c->rtt_s[i][j] = i == j ? 0 : rtt_ms * 1e-3;
            c->bw[i][j] = gbit * 1e9 / 8;
        }
}

static void link_set(cm_plan_cluster *c, int a, int b, double rtt_ms, double gbit) {
    c->rtt_s[a][b] = c->rtt_s[b][a] = rtt_ms * 1e-3;
    c->bw[a][b] = c->bw[b][a] = gbit * 1e9 / 8;
}

/* What most cases start from: the model of a shape, default options in mode
 * (CM_PARALLEL_AUTO: the default's), an empty cluster whose links all have
 * rtt_ms and gbit. */
static void case_init(cm_plan_model *m, void (*shape)(cm_plan_model *), cm_plan_opts *o, enum cm_parallel mode,
                      cm_plan_cluster *c, double rtt_ms, double gbit) {
    shape(m);
    cm_plan_opts_default(o);
    if (mode != CM_PARALLEL_AUTO) o->mode = mode;
    memset(c, 0, sizeof *c);
    links_all(c, rtt_ms, gbit);
}

/* n Mac minis M4 Pro ("mini0"...): 64 GiB, 273 GB/s, 9 TFLOPS each. */
static void add_minis(cm_plan_cluster *c, int n) {
    for (int i = 0; i < n; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "mini%d", i);
        add_node(c, nm, 64, 273, 9);
    }
}

static int layers_of(const cm_plan *p, int node) {
    for (int s = 0; s < p->n_stages; s++)
        for (int i = 0; i < p->stages[s].n_members; i++)
            if (p->stages[s].members[i].node == node) return p->stages[s].last_layer - p->stages[s].first_layer;
    return 0;
}

/* A plan must cover every layer once, in order, with valid slices, and never
 * exceed any node's memory. */
static void check_plan_valid(const cm_plan *p, const cm_plan_model *m, const cm_plan_cluster *c,
                             const cm_plan_opts *o) {
    int l = 0;
    CHECK(p->n_stages >= 1);
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        CHECKF(st->first_layer == l, "stage %d starts at %d, expected %d", s, st->first_layer, l);
        CHECK(st->last_layer > st->first_layer);
        l = st->last_layer;
        int h = 0, f = 0;
        for (int i = 0; i < st->n_members; i++) {
            const cm_plan_member *mb = &st->members[i];
            CHECK(mb->kv_head_begin == h && mb->kv_head_end >= h);
            CHECK(mb->ffn_begin == f && mb->ffn_end >= f);
            if (i < st->n_members - 1 && m->ffn_granule > 1) CHECK((mb->ffn_end - mb->ffn_begin) % m->ffn_granule == 0);
            h = mb->kv_head_end;
            f = mb->ffn_end;
            CHECKF(mb->weight_bytes + mb->kv_bytes + o->reserve_bytes <= c->nodes[mb->node].mem_bytes, "%s over memory",
                   c->nodes[mb->node].name);
        }
        CHECK(h == m->n_kv_heads && f == m->ffn);
    }
    CHECK(l == m->n_layers);
    CHECK(p->tok_s > 0 && p->tok_s_aggregate >= p->tok_s * 0.999 && p->ttft_s > 0);
}

static void llama8b(cm_plan_model *m) { cm_plan_model_synthetic(m, 32, 4096, 32, 8, 14336, 128256, 4.85); }
static void llama70b(cm_plan_model *m) { cm_plan_model_synthetic(m, 80, 8192, 64, 8, 28672, 128256, 4.85); }

static void test_single_node(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama8b, &o, CM_PARALLEL_AUTO, &c, 0.2, 40);
    add_node(&c, "mini", 16, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECK(p.n_stages == 1 && p.stages[0].n_members == 1);
    /* memory-bound: ~ bandwidth / bytes per token */
    double bytes = 0;
    for (int l = 0; l < m.n_layers; l++) bytes += m.layer_bytes[l];
    bytes += m.head_bytes;
    CHECKF(fabs(p.tok_s - 100e9 / bytes) / (100e9 / bytes) < 0.01, "tok/s %.2f", p.tok_s);
}

/* KV cache types: the planner counts whole blocks (Q8_0: 34 bytes per 32
 * elements) and a long context that does not fit in F32 fits in Q8_0. */
static void test_kv_types(void) {
    cm_plan_model m;
    llama8b(&m);
    cm_plan_cluster c = {0};
    links_all(&c, 0.2, 40);
    add_node(&c, "mini", 16, 100, 4);
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.ctx = 65536;
    cm_plan p;
    char err[512];
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) != 0); /* F32: 32 x 8 x 128 x 2 x 4 B x 65536 = 16 GiB */
    o.kv_k32_bytes = o.kv_v32_bytes = 34;
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.n_stages == 1 && p.stages[0].members[0].kv_bytes == 32ull * 8 * (128 / 32) * (34 + 34) * 65536);
}

static void test_even_and_uneven_pipeline(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama8b, &o, CM_PARALLEL_PP, &c, 0.3, 40);
    add_node(&c, "a", 16, 100, 4);
    add_node(&c, "b", 16, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    /* equal nodes: equal stage times within one layer (the last stage also runs the output head) */
    double layer_s = m.layer_bytes[0] / 100e9;
    CHECKF(fabs(p.stages[0].compute_s - p.stages[1].compute_s) <= layer_s * 1.01, "%d vs %d layers", layers_of(&p, 0),
           layers_of(&p, 1));
    CHECK(layers_of(&p, 0) > layers_of(&p, 1));
    /* twice the bandwidth -> about twice the layers */
    c.nodes[1].mem_bw = 200e9;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    double ratio = (double)layers_of(&p, 1) / layers_of(&p, 0);
    CHECKF(ratio > 1.6 && ratio < 2.5, "ratio %.2f (%d/%d)", ratio, layers_of(&p, 1), layers_of(&p, 0));
    /* the slow node gets less, 3 nodes */
    cm_plan_cluster c3 = {0};
    links_all(&c3, 0.3, 40);
    add_node(&c3, "m4pro", 64, 273, 9);
    add_node(&c3, "m4", 16, 120, 4);
    add_node(&c3, "linux", 32, 40, 2);
    CHECK(cm_plan_make(&m, &c3, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c3, &o);
    CHECK(layers_of(&p, 0) > layers_of(&p, 1) && layers_of(&p, 1) > layers_of(&p, 2) && layers_of(&p, 2) >= 1);
}

static void test_memory_bound_node(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama8b, &o, CM_PARALLEL_PP, &c, 0.3, 40);
    add_node(&c, "big", 64, 100, 4);
    add_node(&c, "fast-but-small", 2.0, 400, 16); /* fastest, but holds few layers */
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECK(layers_of(&p, 1) < layers_of(&p, 0));
    CHECK(layers_of(&p, 1) >= 1);
}

static void test_slow_link_gets_fewer(void) {
    cm_plan_model m;
    cm_plan_model_synthetic(&m, 48, 2048, 32, 8, 5632, 32000, 8.5);
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_PP;
    o.n_seq = 4;
    cm_plan p;
    char err[512];
    cm_plan_cluster c = {0};
    links_all(&c, 0.2, 10);
    add_node(&c, "a", 8, 50, 2);
    add_node(&c, "b", 8, 50, 2);
    add_node(&c, "c", 8, 50, 2);
    link_set(&c, 1, 0, 20, 0.01);
    link_set(&c, 1, 2, 20, 0.01); /* b behind a slow link */
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECKF(layers_of(&p, 1) < layers_of(&p, 0) && layers_of(&p, 1) < layers_of(&p, 2), "%d %d %d", layers_of(&p, 0),
           layers_of(&p, 1), layers_of(&p, 2));
}

/* A re-plan after a loss keeps the coordinator's layers (first_stage_layers):
 * stage 0 holds exactly them, the survivors split the rest by speed and
 * memory, and a survivor too small for the rest makes it not fit. */
static void test_pinned_first_stage(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama8b, &o, CM_PARALLEL_PP, &c, 0.3, 40);
    add_node(&c, "here", 64, 100, 4);
    add_node(&c, "slow", 16, 50, 2);
    add_node(&c, "fast", 16, 200, 8);
    o.first_stage_layers = 5;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECKF(p.n_stages == 3 && p.stages[0].last_layer == 5, "stage 0 ends at %d", p.stages[0].last_layer);
    CHECKF(layers_of(&p, 2) > layers_of(&p, 1), "slow %d, fast %d", layers_of(&p, 1), layers_of(&p, 2));
    o.first_stage_layers = 20; /* more than the free plan would give here: still honoured */
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(p.stages[0].last_layer == 20 && layers_of(&p, 1) + layers_of(&p, 2) == 12);
    /* one small survivor cannot take the other 27 layers */
    cm_plan_cluster c2 = {0};
    links_all(&c2, 0.3, 40);
    add_node(&c2, "here", 64, 100, 4);
    add_node(&c2, "tiny", 1.0, 100, 4);
    o.first_stage_layers = 5;
    CHECK(cm_plan_make(&m, &c2, &o, &p, err, sizeof err) == CM_ENOSPACE);
    CHECKF(strstr(err, "does not fit") != NULL, "%s", err);
    o.first_stage_layers = 32; /* nothing left for a second stage */
    CHECK(cm_plan_make(&m, &c2, &o, &p, err, sizeof err) != 0);
}

static int stage_of(const cm_plan *p, int node) {
    for (int s = 0; s < p->n_stages; s++)
        for (int i = 0; i < p->stages[s].n_members; i++)
            if (p->stages[s].members[i].node == node) return s;
    return -1;
}

/* A slow link between two nodes, while every link to the coordinator (node
 * 0) is fast: what the coordinator measures alone would not show it; the
 * node to node matrix does. Equal nodes; the slow hop costs ~5 layers. */
static void test_slow_node_to_node_link(void) {
    cm_plan_model m;
    llama8b(&m);
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_PP;
    cm_plan p, q, u;
    char err[512];
    double layer_s = m.layer_bytes[0] / 100e9;
    /* Four nodes, the slow link between b and c. In the given order
     * (here, b, c, d) it is the hop b -> c: b sends over it and c receives
     * over it, so both get fewer layers than the first stage and fewer than
     * on the same cluster with every link fast. */
    cm_plan_cluster c = {0};
    links_all(&c, 0.2, 40);
    add_node(&c, "here", 16, 100, 4);
    add_node(&c, "b", 16, 100, 4);
    add_node(&c, "c", 16, 100, 4);
    add_node(&c, "d", 16, 100, 4);
    cm_plan_cluster cu = c;
    link_set(&c, 1, 2, 2, 0.025);
    double hop = 1e-3 + m.dim * 4.0 / (0.025e9 / 8);
    CHECKF(hop > 3 * layer_s, "the slow hop (%.2f ms) must cost several layers (%.2f ms each)", hop * 1e3,
           layer_s * 1e3);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECK(cm_plan_make(&m, &cu, &o, &u, err, sizeof err) == 0);
    CHECKF(stage_of(&p, 1) == 1 && stage_of(&p, 2) == 2, "given order kept: %s", p.why);
    CHECKF(layers_of(&p, 1) < layers_of(&p, 0) && layers_of(&p, 2) < layers_of(&p, 0), "%d %d %d %d: %s",
           layers_of(&p, 0), layers_of(&p, 1), layers_of(&p, 2), layers_of(&p, 3), p.why);
    CHECKF(layers_of(&p, 1) < layers_of(&u, 1) && layers_of(&p, 2) < layers_of(&u, 2), "b %d/%d, c %d/%d (slow/fast)",
           layers_of(&p, 1), layers_of(&u, 1), layers_of(&p, 2), layers_of(&u, 2));
    /* Free to order the nodes, the plan keeps b and c apart (here, b, d, c
     * or here, c, d, b): no hop crosses the slow link, the stages are sized
     * as on the fast cluster, and it predicts more tokens/s. */
    o.reorder = true;
    CHECK(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0);
    check_plan_valid(&q, &m, &c, &o);
    int sb = stage_of(&q, 1), sc = stage_of(&q, 2);
    CHECKF(sb > 0 && sc > 0 && abs(sb - sc) > 1, "b in stage %d, c in stage %d: %s", sb, sc, q.why);
    CHECKF(q.tok_s > p.tok_s * 1.02, "reordered %.2f tok/s vs given order %.2f", q.tok_s, p.tok_s);
    CHECK(layers_of(&q, 0) == layers_of(&u, 0));
    CHECK(strstr(q.why, "node orders") != NULL);
    /* Three nodes: b and c are always neighbours, whatever the order; both
     * get fewer layers than the coordinator and than on fast links. */
    cm_plan_cluster c3 = {0};
    links_all(&c3, 0.2, 40);
    add_node(&c3, "here", 16, 100, 4);
    add_node(&c3, "b", 16, 100, 4);
    add_node(&c3, "c", 16, 100, 4);
    cm_plan_cluster c3u = c3;
    link_set(&c3, 1, 2, 2, 0.025);
    CHECK(cm_plan_make(&m, &c3, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c3, &o);
    CHECK(cm_plan_make(&m, &c3u, &o, &u, err, sizeof err) == 0);
    CHECK(abs(stage_of(&p, 1) - stage_of(&p, 2)) == 1);
    CHECKF(layers_of(&p, 1) < layers_of(&p, 0) && layers_of(&p, 2) < layers_of(&p, 0), "%d %d %d: %s", layers_of(&p, 0),
           layers_of(&p, 1), layers_of(&p, 2), p.why);
    CHECKF(layers_of(&p, 1) + layers_of(&p, 2) < layers_of(&u, 1) + layers_of(&u, 2), "%d+%d vs %d+%d on fast links",
           layers_of(&p, 1), layers_of(&p, 2), layers_of(&u, 1), layers_of(&u, 2));
    /* An unreachable pair (how the coordinator marks a failed measurement)
     * is never made neighbours when another order exists. */
    link_set(&c, 1, 2, 10000, 1e-5);
    CHECK(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0);
    CHECK(abs(stage_of(&q, 1) - stage_of(&q, 2)) > 1);
}

/* True when no hop between adjacent stages and no pair inside a group of p
 * crosses a down link of c. */
static bool avoids_down(const cm_plan *p, const cm_plan_cluster *c) {
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        for (int i = 0; i < st->n_members; i++)
            for (int j = 0; j < st->n_members; j++)
                if (c->down[st->members[i].node][st->members[j].node]) return false;
        if (s + 1 < p->n_stages) {
            int a = st->members[0].node, b = p->stages[s + 1].members[0].node;
            if (c->down[a][b] || c->down[b][a]) return false;
        }
    }
    return true;
}

/* A cut link between two live nodes (cm_plan_cluster.down, one direction
 * given): no plan of any mode puts them next to each other, even when that
 * means leaving a node out; the same cluster without the mark uses them as
 * neighbours (so the check can fail). */
static void test_down_link(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512] = "";
    case_init(&m, llama8b, &o, CM_PARALLEL_PP, &c, 0.2, 40);
    o.reorder = true;
    add_node(&c, "here", 64, 100, 4);
    add_node(&c, "b", 64, 100, 4);
    add_node(&c, "c", 64, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_stages == 3 && abs(stage_of(&p, 1) - stage_of(&p, 2)) == 1); /* without the mark: neighbours */
    c.down[2][1] = true;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECKF(p.n_stages == 2 && avoids_down(&p, &c), "%d stages: %s", p.n_stages, p.why);
    CHECKF(strstr(p.why, "left out") != NULL, "%s", p.why);
    /* The coordinator's re-plan (first stage pinned) too. */
    o.first_stage_layers = 10;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_stages == 2 && p.stages[0].last_layer == 10 && avoids_down(&p, &c));
    o.first_stage_layers = 0;
    /* Four nodes: all used, b and c apart. */
    add_node(&c, "d", 64, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECKF(p.n_stages == 4 && avoids_down(&p, &c), "%d stages: %s", p.n_stages, p.why);
    /* The given order (no reorder) stops before the down hop. */
    o.reorder = false;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_stages == 2 && stage_of(&p, 1) == 1 && avoids_down(&p, &c));
    /* An explicit grouping over the down link is refused with the reason. */
    int group_of[4] = {0, 1, 2, 3};
    CHECK(cm_plan_for_groups(&m, &c, &o, group_of, &p, err, sizeof err) == CM_EINVAL);
    CHECKF(strstr(err, "is down") != NULL, "%s", err);
    /* Tensor parallel: one group without the pair; auto / hybrid: no group
     * holds both and no hop joins them. */
    o.mode = CM_PARALLEL_TP;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECKF(p.n_stages == 1 && p.stages[0].n_members == 3 && avoids_down(&p, &c), "%d members", p.stages[0].n_members);
    o.mode = CM_PARALLEL_AUTO;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(avoids_down(&p, &c));
    o.mode = CM_PARALLEL_HYBRID;
    if (cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0) CHECK(avoids_down(&p, &c));
}

static void test_does_not_fit(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512] = "";
    case_init(&m, llama70b, &o, CM_PARALLEL_AUTO, &c, 0.3, 40);
    add_node(&c, "a", 16, 100, 4);
    add_node(&c, "b", 16, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == CM_ENOSPACE);
    CHECKF(strstr(err, "GiB missing") != NULL, "%s", err);
}

static void test_tensor_parallel_slices(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama8b, &o, CM_PARALLEL_TP, &c, 0.1, 80);
    add_node(&c, "a", 16, 100, 4);
    add_node(&c, "b", 16, 200, 8);
    add_node(&c, "c", 16, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECK(p.n_stages == 1 && p.stages[0].n_members == 3 && p.mode == CM_PARALLEL_TP);
    const cm_plan_member *mb = p.stages[0].members;
    CHECK(mb[1].kv_head_end - mb[1].kv_head_begin == 4); /* 8 heads at speeds 1:2:1 */
    CHECK(mb[1].ffn_end - mb[1].ffn_begin > mb[0].ffn_end - mb[0].ffn_begin);
    CHECK(p.bytes_per_token_tp == 2ull * 32 * 4096 * 4);
    /* more members than KV heads: the extra ones get FFN rows only */
    cm_plan_model small;
    cm_plan_model_synthetic(&small, 4, 512, 8, 2, 1536, 1000, 8.5);
    CHECK(cm_plan_make(&small, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &small, &c, &o);
}

static void test_auto_hybrid(void) {
    /* two pairs on Thunderbolt, the pairs joined by slow Ethernet: two TP groups, pipelined */
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama70b, &o, CM_PARALLEL_AUTO, &c, 1.0, 1);
    add_minis(&c, 4);
    link_set(&c, 0, 1, 0.1, 40);
    link_set(&c, 2, 3, 0.1, 40);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECKF(p.mode == CM_PARALLEL_HYBRID && p.n_stages == 2, "mode %s stages %d: %s", cm_parallel_name(p.mode),
           p.n_stages, p.why);
    /* all on fast links: tensor parallel wins for one stream */
    links_all(&c, 0.1, 80);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECKF(p.mode == CM_PARALLEL_TP, "mode %s: %s", cm_parallel_name(p.mode), p.why);
    /* on slow links only, tensor parallelism loses */
    links_all(&c, 2.0, 1);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECKF(p.mode == CM_PARALLEL_PP, "mode %s: %s", cm_parallel_name(p.mode), p.why);
    /* deterministic */
    cm_plan p2;
    CHECK(cm_plan_make(&m, &c, &o, &p2, err, sizeof err) == 0);
    CHECK(p2.tok_s == p.tok_s && p2.n_stages == p.n_stages);
}

/* A mixture-of-experts model gets pipeline plans only (the model refuses
 * tensor-parallel slices of experts): where a dense model of the same shape
 * goes tensor-parallel, auto picks a pipeline; tp and hybrid are refused. */
static void test_experts_no_row_split(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, llama70b, &o, CM_PARALLEL_AUTO, &c, 0.1, 80);
    add_minis(&c, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0 && p.mode == CM_PARALLEL_TP);
    m.n_experts = 8;
    m.n_experts_used = 2;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECKF(p.mode != CM_PARALLEL_TP, "mode %s: %s", cm_parallel_name(p.mode), p.why);
    for (int s = 0; s < p.n_stages; s++) CHECK(p.stages[s].ep == (p.stages[s].n_members > 1));
    o.mode = CM_PARALLEL_TP;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == CM_EUNSUPPORTED && strstr(err, "mixture-of-experts") &&
          strstr(err, "--parallel ep"));
    o.mode = CM_PARALLEL_PP;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0 && p.mode == CM_PARALLEL_PP);
}

static void test_bad_input(void) {
    cm_plan_model m;
    llama8b(&m);
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    cm_plan p;
    char err[512];
    cm_plan_cluster c = {0};
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == CM_EINVAL);
    links_all(&c, 0.3, 40);
    add_node(&c, "a", 16, 100, 4);
    m.n_layers = 0;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == CM_EINVAL);
    /* more nodes than layers: pipeline uses as many as it can */
    cm_plan_model t;
    cm_plan_model_synthetic(&t, 2, 64, 8, 4, 172, 512, 32);
    for (int i = 0; i < 3; i++) add_node(&c, "x", 1, 10, 1);
    o.mode = CM_PARALLEL_PP;
    o.reserve_bytes = 0;
    CHECK(cm_plan_make(&t, &c, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_stages == 2);
}

/* ---- expert parallelism (issue 13) ---- */

/* Qwen3-30B-A3B-like: 48 layers, 128 experts of width 768, 8 used, Q4_K_M. */
static void qwen3_30b_a3b(cm_plan_model *m) {
    cm_plan_model_synthetic_moe(m, 48, 2048, 32, 4, 128, 8, 768, 0, 151936, 4.85);
}

/* An expert group: every member holds every KV head and FFN row, the expert
 * ranges tile [0, n_experts) in member order, nobody is over memory. */
static void check_ep_valid(const cm_plan *p, const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o) {
    int l = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        CHECK(st->first_layer == l && st->last_layer > l);
        l = st->last_layer;
        CHECK(st->ep == (st->n_members > 1));
        int e = 0;
        for (int i = 0; i < st->n_members; i++) {
            const cm_plan_member *mb = &st->members[i];
            CHECK(mb->kv_head_begin == 0 && mb->kv_head_end == m->n_kv_heads);
            CHECK(mb->ffn_begin == 0 && mb->ffn_end == m->ffn);
            CHECKF(mb->expert_begin == e && mb->expert_end > e, "member %d experts [%d, %d), expected from %d", i,
                   mb->expert_begin, mb->expert_end, e);
            e = mb->expert_end;
            CHECKF(mb->weight_bytes + mb->kv_bytes + o->reserve_bytes <= c->nodes[mb->node].mem_bytes, "%s over memory",
                   c->nodes[mb->node].name);
        }
        CHECK(e == m->n_experts);
    }
    CHECK(l == m->n_layers);
    CHECK(p->tok_s > 0);
}

static int held(const cm_plan_member *mb) { return mb->expert_end - mb->expert_begin; }

static void test_ep_even(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, qwen3_30b_a3b, &o, CM_PARALLEL_EP, &c, 0.1, 40);
    add_node(&c, "a", 24, 120, 4);
    add_node(&c, "b", 24, 120, 4);
    add_node(&c, "c", 24, 120, 4);
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    check_ep_valid(&p, &m, &c, &o);
    CHECK(p.mode == CM_PARALLEL_EP && p.n_stages == 1 && p.stages[0].n_members == 3);
    for (int i = 0; i < 3; i++)
        CHECKF(held(&p.stages[0].members[i]) >= 42 && held(&p.stages[0].members[i]) <= 43, "member %d holds %d", i,
               held(&p.stages[0].members[i]));
    /* the exchange: (members - 1) x used x MoE layers x dim x 4 per token */
    CHECK(p.bytes_per_token_ep == 2ull * 8 * 48 * 2048 * 4);
    CHECK(p.bytes_per_token_tp == 0);
    /* each member holds a third of the experts: well under the whole model */
    CHECK(p.stages[0].members[1].weight_bytes < (m.layer_bytes[0] * 48) / 2);
}

/* Hot experts (replicas.c): qwen3-30b-a3b on three equal machines with a
 * router that sends 30% of the assignments to expert 5 (the rest even).
 * Given the counts, the hot expert gets replicas, the busiest member's share
 * falls and the predicted speed beats the same counts without replicas;
 * the result is a pure function; uniform counts give no replica; memory for
 * less than one more expert gives none either. */
static void test_ep_replicas_plan(void) {
    cm_plan_model m;
    qwen3_30b_a3b(&m);
    cm_plan_cluster c = {0};
    links_all(&c, 0.1, 40);
    add_node(&c, "a", 24, 120, 4);
    add_node(&c, "b", 24, 120, 4);
    add_node(&c, "c", 24, 120, 4);
    uint64_t load[128], flat[128];
    for (int e = 0; e < 128; e++) load[e] = 700, flat[e] = 1000;
    load[5] = 700ull * 127 * 3 / 7; /* 30% of all */
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_EP;
    o.expert_load = load;
    cm_plan p, q, none;
    char err[512];
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    check_ep_valid(&p, &m, &c, &o);
    const cm_plan_stage *st = &p.stages[0];
    const uint32_t h5 = cm_plan_expert_holders(st, 5);
    int reps = 0;
    double max_share = 0;
    for (int i = 0; i < 3; i++) {
        reps += st->members[i].n_replicas;
        max_share = st->members[i].expert_share > max_share ? st->members[i].expert_share : max_share;
        for (int r = 1; r < st->members[i].n_replicas; r++)
            CHECK(st->members[i].replicas[r - 1] < st->members[i].replicas[r]);
    }
    CHECKF(reps >= 1 && (h5 & (h5 - 1)), "expert 5 held by 0x%x (%d replicas)", h5, reps);
    CHECKF(h5 & 1u, "expert 5's home is member 0 (0x%x)", h5);
    o.max_replicas = -1; /* the same counts, shares only */
    CHECKF(cm_plan_make(&m, &c, &o, &none, err, sizeof err) == 0, "%s", err);
    double none_share = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(none.stages[0].members[i].n_replicas == 0);
        none_share =
            none.stages[0].members[i].expert_share > none_share ? none.stages[0].members[i].expert_share : none_share;
    }
    CHECKF(max_share < none_share && p.tok_s > none.tok_s, "busiest share %.3f vs %.3f, %.2f vs %.2f tok/s", max_share,
           none_share, p.tok_s, none.tok_s);
    printf(
        "# hot expert 5 (30%%): holders 0x%x, %d replica(s), busiest share %.3f (no replicas %.3f), %.2f vs %.2f tok/s\n",
        h5, reps, max_share, none_share, p.tok_s, none.tok_s);
    o.max_replicas = 0;
    CHECK(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0 && q.tok_s == p.tok_s); /* pure */
    for (int i = 0; i < 3; i++) {
        const cm_plan_member *a = &p.stages[0].members[i], *b = &q.stages[0].members[i];
        CHECK(a->n_replicas == b->n_replicas && !memcmp(a->replicas, b->replicas, sizeof a->replicas) &&
              a->expert_share == b->expert_share);
    }
    /* a running plan made without counts, priced under counts measured later
     * (coord_ep.c's re-plan question): the same shares and speed as the plan
     * made with them but no replicas, and slower than the replicated one by
     * more than the coordinator's 2% bar */
    cm_plan_opts u = o;
    u.expert_load = NULL;
    cm_plan run;
    CHECKF(cm_plan_make(&m, &c, &u, &run, err, sizeof err) == 0, "%s", err);
    cm_plan_expert_shares(&run, load, 128);
    cm_plan_predict(&m, &c, &o, &run);
    for (int i = 0; i < 3; i++) {
        const cm_plan_member *a = &run.stages[0].members[i], *b = &none.stages[0].members[i];
        CHECKF(a->expert_begin == b->expert_begin && a->expert_end == b->expert_end && a->n_replicas == 0 &&
                   fabs(a->expert_share - b->expert_share) < 1e-12,
               "member %d: [%d, %d) share %.4f vs [%d, %d) %.4f", i, a->expert_begin, a->expert_end, a->expert_share,
               b->expert_begin, b->expert_end, b->expert_share);
    }
    CHECKF(fabs(run.tok_s - none.tok_s) < 1e-9 * none.tok_s && p.tok_s > 1.02 * run.tok_s,
           "re-priced %.3f tok/s vs %.3f (no replicas), %.3f (replicas)", run.tok_s, none.tok_s, p.tok_s);
    o.expert_load = flat;
    CHECK(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0);
    for (int i = 0; i < 3; i++) CHECK(q.stages[0].members[i].n_replicas == 0);
    /* memory for half an expert more than the plan without replicas: none */
    uint64_t one = 0;
    for (int l = 0; l < m.n_layers; l++) one += m.layer_expert_bytes[l] / (uint64_t)m.n_experts;
    for (int i = 0; i < 3; i++)
        c.nodes[i].mem_bytes =
            none.stages[0].members[i].weight_bytes + none.stages[0].members[i].kv_bytes + o.reserve_bytes + one / 2;
    o.expert_load = load;
    CHECKF(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 3; i++)
        CHECKF(q.stages[0].members[i].n_replicas == 0, "member %d got a replica without memory", i);
}

/* Counts by layer (a running cluster's stages report theirs): qwen3-30b-a3b
 * over two stages of two equal machines each (both expert groups), expert 5
 * hot (30%) in stage 0's layers and expert 77 in stage 1's. Each group gets
 * replicas of its own stage's hot expert only; the model-wide sum (both at
 * 15%) would treat the two alike. Re-placing the replicas of a plan made
 * without counts (cm_plan_replace_replicas, what a cluster's measured load
 * asks) keeps its stages and ranges and gives the same replicas and speed
 * as the plan made with the counts. */
static void test_ep_replicas_by_stage(void) {
    cm_plan_model m;
    qwen3_30b_a3b(&m);
    cm_plan_cluster c = {0};
    links_all(&c, 0.1, 40);
    for (int i = 0; i < 4; i++) add_node(&c, i == 0 ? "a" : i == 1 ? "b" : i == 2 ? "c" : "d", 24, 120, 4);
    const int groups[4] = {0, 0, 1, 1};
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_HYBRID;
    cm_plan plain, p, q;
    char err[512];
    CHECKF(cm_plan_for_groups(&m, &c, &o, groups, &plain, err, sizeof err) == 0, "%s", err);
    CHECK(plain.n_stages == 2 && plain.stages[0].ep && plain.stages[1].ep && plain.stages[0].n_members == 2);
    const int split = plain.stages[1].first_layer;
    static uint64_t by_layer[48 * 128];
    uint64_t all[128] = {0};
    for (int l = 0; l < 48; l++)
        for (int e = 0; e < 128; e++) {
            uint64_t v = 700;
            if (e == (l < split ? 5 : 77)) v = 700ull * 127 * 3 / 7; /* 30% of the layer's assignments */
            by_layer[l * 128 + e] = v;
            all[e] += v;
        }
    o.expert_load = all;
    o.expert_load_layers = by_layer;
    o.n_load_layers = 48;
    CHECKF(cm_plan_for_groups(&m, &c, &o, groups, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.n_stages == 2 && p.stages[1].first_layer == split);
    for (int s = 0; s < 2; s++) {
        const uint32_t h5 = cm_plan_expert_holders(&p.stages[s], 5), h77 = cm_plan_expert_holders(&p.stages[s], 77);
        const bool rep5 = h5 & (h5 - 1), rep77 = h77 & (h77 - 1);
        CHECKF(s == 0 ? rep5 && !rep77 : rep77 && !rep5, "stage %d: expert 5 held by 0x%x, 77 by 0x%x", s, h5, h77);
    }
    /* the same counts summed over the model: 5 and 77 (one in each member's range) at 15%
     * each look balanced in both groups, and neither is replicated anywhere */
    cm_plan_opts sum = o;
    sum.expert_load_layers = NULL;
    CHECKF(cm_plan_for_groups(&m, &c, &sum, groups, &q, err, sizeof err) == 0, "%s", err);
    for (int s = 0; s < 2; s++) {
        const uint32_t h5 = cm_plan_expert_holders(&q.stages[s], 5), h77 = cm_plan_expert_holders(&q.stages[s], 77);
        CHECKF(!(h5 & (h5 - 1)) && !(h77 & (h77 - 1)), "summed, stage %d: expert 5 held by 0x%x, 77 by 0x%x", s, h5,
               h77);
    }
    /* the running plan without replicas priced under the counts by layer */
    cm_plan run = plain;
    cm_plan_expert_shares_by_layer(&run, all, by_layer, 48, 128);
    double busiest = 0;
    for (int k = 0; k < 2; k++) busiest = fmax(busiest, run.stages[1].members[k].expert_share);
    CHECKF(busiest > 0.6, "stage 1's busiest member computes %.3f of its layers' assignments", busiest);
    cm_plan_predict(&m, &c, &o, &run);
    /* the running plan without counts, its replicas placed again under them */
    q = plain;
    cm_plan_replace_replicas(&m, &c, &o, &q);
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 2; k++) {
            const cm_plan_member *a = &q.stages[s].members[k], *b = &p.stages[s].members[k];
            CHECKF(a->node == b->node && a->expert_begin == b->expert_begin && a->expert_end == b->expert_end &&
                       a->n_replicas == b->n_replicas &&
                       !memcmp(a->replicas, b->replicas, (size_t)a->n_replicas * sizeof a->replicas[0]),
                   "stage %d member %d: replicas %d vs %d", s, k, a->n_replicas, b->n_replicas);
        }
    CHECKF(fabs(q.tok_s - p.tok_s) < 1e-9 * p.tok_s && q.tok_s > run.tok_s, "%.3f vs %.3f tok/s (no replicas %.3f)",
           q.tok_s, p.tok_s, run.tok_s);
    printf("# by stage: stage 0 [0, %d) replicates 5, stage 1 replicates 77; %.2f tok/s vs %.2f without replicas "
           "(stage 1's busiest member %.3f of its assignments)\n",
           split, p.tok_s, run.tok_s, busiest);
}

/* deepseek2 (kv_shared: slices of query heads, the latent on every member)
 * with --parallel tp: the heads split, the experts an expert group, every
 * member's KV the whole latent; all-reduces for attention (every layer) and
 * the dense layers' FFN counted beside the expert exchange. */
static void test_mla_tensor_parallel(void) {
    cm_plan_model m;
    qwen3_30b_a3b(&m);
    m.kv_shared = true;
    m.n_kv_heads = m.n_heads;                               /* 32 */
    m.layer_expert_bytes[0] = m.layer_expert_params[0] = 0; /* a leading dense layer */
    cm_plan_cluster c = {0};
    links_all(&c, 0.1, 40);
    add_node(&c, "a", 24, 120, 4);
    add_node(&c, "b", 24, 120, 4);
    add_node(&c, "c", 24, 120, 4);
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_TP;
    cm_plan p;
    char err[512];
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.n_stages == 1 && p.stages[0].n_members == 3 && p.stages[0].ep);
    int h = 0, e = 0;
    for (int i = 0; i < 3; i++) {
        const cm_plan_member *mb = &p.stages[0].members[i];
        CHECKF(mb->kv_head_begin == h && mb->kv_head_end > h && mb->kv_head_end - h < 32, "member %d heads [%d, %d)", i,
               mb->kv_head_begin, mb->kv_head_end);
        CHECK(mb->expert_begin == e && mb->expert_end > e);
        h = mb->kv_head_end, e = mb->expert_end;
        CHECK(mb->kv_bytes == p.stages[0].members[0].kv_bytes); /* the latent, whatever the heads */
    }
    CHECK(h == 32 && e == 128);
    CHECK(p.bytes_per_token_tp == (48ull + 1) * 2048 * 4);
    CHECK(p.bytes_per_token_ep == 2ull * 8 * 47 * 2048 * 4);
    m.kv_shared = false; /* any other mixture of experts: refused */
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == CM_EUNSUPPORTED);
}

static void test_ep_uneven_speed(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&m, qwen3_30b_a3b, &o, CM_PARALLEL_EP, &c, 0.1, 40);
    add_node(&c, "m4", 24, 120, 4);
    add_node(&c, "m4pro", 48, 273, 8);
    add_node(&c, "m4b", 24, 120, 4);
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    check_ep_valid(&p, &m, &c, &o);
    const cm_plan_member *mb = p.stages[0].members;
    /* 273 / (120 + 273 + 120) of 128 = 68.1 */
    CHECKF(held(&mb[1]) == 68 && held(&mb[0]) + held(&mb[2]) == 60, "held %d %d %d", held(&mb[0]), held(&mb[1]),
           held(&mb[2]));
    /* the faster member's decode time is not the worst by much: shares follow speed */
    CHECK(mb[1].layer_s < mb[0].layer_s * 1.1);
}

static void test_ep_uneven_memory(void) {
    /* equal speed, one small node: a split by speed leaves it over memory,
     * so the experts are split by memory instead */
    cm_plan_model m;
    qwen3_30b_a3b(&m);
    cm_plan_cluster c = {0};
    links_all(&c, 0.1, 40);
    add_node(&c, "big1", 64, 120, 4);
    add_node(&c, "big2", 64, 120, 4);
    add_node(&c, "small", 5, 120, 4);
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_EP;
    o.ctx = 1024;
    cm_plan p;
    char err[512];
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    check_ep_valid(&p, &m, &c, &o);
    const cm_plan_member *mb = p.stages[0].members;
    CHECKF(held(&mb[2]) >= 1 && held(&mb[2]) < held(&mb[0]) / 4, "small holds %d of %d", held(&mb[2]), m.n_experts);
    /* any node count: 5 uneven nodes */
    cm_plan_cluster c5 = {0};
    links_all(&c5, 0.1, 40);
    add_node(&c5, "a", 16, 100, 4);
    add_node(&c5, "b", 32, 200, 4);
    add_node(&c5, "c", 16, 60, 4);
    add_node(&c5, "d", 64, 400, 4);
    add_node(&c5, "e", 8, 50, 4);
    CHECKF(cm_plan_make(&m, &c5, &o, &p, err, sizeof err) == 0, "%s", err);
    check_ep_valid(&p, &m, &c5, &o);
    CHECK(p.stages[0].n_members == 5 && held(&p.stages[0].members[3]) > held(&p.stages[0].members[1]) &&
          held(&p.stages[0].members[1]) > held(&p.stages[0].members[0]));
    /* too little memory in all: the planner says so */
    cm_plan_cluster tiny = {0};
    links_all(&tiny, 0.1, 40);
    add_node(&tiny, "a", 4, 100, 4);
    add_node(&tiny, "b", 4, 100, 4);
    CHECK(cm_plan_make(&m, &tiny, &o, &p, err, sizeof err) == CM_ENOSPACE);
}

static void test_ep_modes(void) {
    cm_plan_model dense;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p;
    char err[512];
    case_init(&dense, llama8b, &o, CM_PARALLEL_EP, &c, 0.1, 40);
    add_node(&c, "a", 24, 120, 4);
    add_node(&c, "b", 24, 120, 4);
    add_node(&c, "c", 24, 120, 4);
    CHECK(cm_plan_make(&dense, &c, &o, &p, err, sizeof err) == CM_EINVAL && strstr(err, "mixture-of-experts"));
    CHECK(cm_parallel_from_name("ep") == CM_PARALLEL_EP && !strcmp(cm_parallel_name(CM_PARALLEL_EP), "ep"));
    cm_plan_model m;
    qwen3_30b_a3b(&m);
    /* auto and hybrid: a group over an MoE model is always an expert group */
    for (int mode = CM_PARALLEL_AUTO; mode <= CM_PARALLEL_HYBRID; mode += CM_PARALLEL_HYBRID) {
        o.mode = (enum cm_parallel)mode;
        CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
        for (int s = 0; s < p.n_stages; s++) CHECK(p.stages[s].ep == (p.stages[s].n_members > 1));
        if (mode == CM_PARALLEL_HYBRID) CHECK(p.n_stages == 2 && p.mode == CM_PARALLEL_EP);
        check_ep_valid(&p, &m, &c, &o);
    }
    /* --parallel tp (FFN rows) is refused for experts, naming ep */
    o.mode = CM_PARALLEL_TP;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == CM_EUNSUPPORTED && strstr(err, "--parallel ep"));
    /* a pipeline reads only the active experts: much faster than its bytes would say */
    o.mode = CM_PARALLEL_PP;
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    uint64_t total = 0;
    for (int l = 0; l < m.n_layers; l++) total += m.layer_bytes[l];
    CHECKF(p.tok_s > 2.0 * 120e9 / (double)total, "pipeline %.1f tok/s", p.tok_s);
}

/* Issue 19: nodes on one host share its cores and memory bandwidth. Three
 * nodes (and the coordinator) on one 2-core machine, each measuring the
 * whole machine, were predicted 38 tok/s and ran 10-16: sharing, the
 * prediction is a quarter of the naive one (4 members, memory-bound layers,
 * links negligible), and a node on a host of its own gets more layers than
 * one sharing. The KV line says per sequence and in all. */
/* serve's micro-batches in flight on a pipeline (cm_plan_pipe_groups): one
 * per set of stages sharing a host, whatever else the plan says. */
static void set_hosts(cm_plan_cluster *c, const char *const *h) {
    for (int i = 0; i < c->n_nodes; i++) snprintf(c->nodes[i].host, sizeof c->nodes[i].host, "%s", h[i]);
}

static void test_pipe_groups(void) {
    cm_plan_cluster c = {0};
    c.n_nodes = 6;
    cm_plan p = {0};
    p.n_stages = 3; /* stages 0, 1, 2 on nodes 0, 1, 2, one member each */
    for (int s = 0; s < 3; s++) {
        p.stages[s].n_members = 1;
        p.stages[s].members[0].node = s;
    }
    set_hosts(&c, (const char *const[]){"a", "b", "c", "", "", ""});
    CHECK(cm_plan_pipe_groups(&p, &c) == 3); /* three machines: a group each */
    set_hosts(&c, (const char *const[]){"a", "a", "a", "", "", ""});
    CHECK(cm_plan_pipe_groups(&p, &c) == 1); /* loopback: one host, one group */
    set_hosts(&c, (const char *const[]){"a", "a", "b", "", "", ""});
    CHECK(cm_plan_pipe_groups(&p, &c) == 2);
    set_hosts(&c, (const char *const[]){"a", "b", "a", "", "", ""}); /* not adjacent: still one host's turns */
    CHECK(cm_plan_pipe_groups(&p, &c) == 2);
    set_hosts(&c, (const char *const[]){"", "", "", "", "", ""}); /* unknown (older nodes): a host each */
    CHECK(cm_plan_pipe_groups(&p, &c) == 3);
    set_hosts(&c, (const char *const[]){"a", "", "a", "", "", ""});
    CHECK(cm_plan_pipe_groups(&p, &c) == 2);
    /* a tensor-parallel stage spanning hosts joins the stages on either */
    p.stages[1].n_members = 2;
    p.stages[1].members[1].node = 3;
    set_hosts(&c, (const char *const[]){"a", "b", "c", "a", "", ""}); /* stage 1 on b and a: 0 and 1 share a */
    CHECK(cm_plan_pipe_groups(&p, &c) == 2);
    set_hosts(&c, (const char *const[]){"a", "b", "c", "c", "", ""}); /* 1 and 2 share c */
    CHECK(cm_plan_pipe_groups(&p, &c) == 2);
    set_hosts(&c, (const char *const[]){"a", "a", "c", "c", "", ""}); /* 0-1 through a, 1-2 through c */
    CHECK(cm_plan_pipe_groups(&p, &c) == 1);
    set_hosts(&c, (const char *const[]){"a", "b", "c", "d", "", ""});
    CHECK(cm_plan_pipe_groups(&p, &c) == 3);
    p.n_stages = 1;
    CHECK(cm_plan_pipe_groups(&p, &c) == 1);
    p.n_stages = 0;
    CHECK(cm_plan_pipe_groups(&p, &c) == 1);
}

static void test_shared_host(void) {
    cm_plan_model m;
    cm_plan_model_synthetic(&m, 16, 2048, 32, 8, 8192, 32000, 4.5); /* ~1B */
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_PP;
    cm_plan p, q;
    char err[512];
    cm_plan_cluster c = {0};
    links_all(&c, 0.02, 100);
    for (int i = 0; i < 4; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "n%d", i);
        add_node(&c, nm, 20, 15, 0.06); /* the 2-core box: 15 GB/s, 60 GFLOP/s */
    }
    CHECKF(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 4; i++) snprintf(c.nodes[i].host, sizeof c.nodes[i].host, "vm-1");
    CHECKF(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0, "%s", err);
    check_plan_valid(&q, &m, &c, &o);
    double r = q.tok_s / p.tok_s;
    CHECKF(r > 0.23 && r < 0.27, "shared %.1f vs separate %.1f tok/s (ratio %.3f, want ~1/4)", q.tok_s, p.tok_s, r);
    CHECK(layers_of(&q, 1) == layers_of(&p, 1)); /* all shared alike: the same split */
    /* the plan text says who shares */
    static char buf[8192];
    cm_plan_format(&q, &m, &c, buf, sizeof buf);
    CHECKF(
        strstr(
            buf,
            "shared host vm-1: 4 members (n0, n1, n2, n3) share its cores and memory bandwidth: each planned at 1/4"),
        "%s", buf);
    CHECKF(strstr(buf, "serving: 1 micro-batch in flight (stages that share a host take turns)"), "%s", buf);
    /* the coordinator on a machine of its own, three nodes sharing another:
     * the coordinator's stage holds more layers than any shared one */
    snprintf(c.nodes[0].host, sizeof c.nodes[0].host, "mac");
    CHECKF(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0, "%s", err);
    CHECKF(layers_of(&q, 0) > 2 * layers_of(&q, 1) && layers_of(&q, 0) > 2 * layers_of(&q, 2), "%d %d %d %d",
           layers_of(&q, 0), layers_of(&q, 1), layers_of(&q, 2), layers_of(&q, 3));
    /* cm_plan_predict (a given split) applies the same sharing */
    cm_plan pr = q;
    cm_plan_predict(&m, &c, &o, &pr);
    CHECKF(fabs(pr.tok_s - q.tok_s) < 1e-9 * q.tok_s, "%.3f vs %.3f", pr.tok_s, q.tok_s);
    /* KV: per sequence and in all (ctx 2048, 3 sequences, f32): 2 (K, V) x 16 layers x 8 heads x 64 x 2048 x 4 bytes = 128 MiB each */
    o.n_seq = 3;
    CHECKF(cm_plan_make(&m, &c, &o, &q, err, sizeof err) == 0, "%s", err);
    cm_plan_format(&q, &m, &c, buf, sizeof buf);
    CHECKF(strstr(buf, "kv cache: 128.00 MiB per sequence (2048 positions), 384.00 MiB in all for 3 sequences"), "%s",
           buf);
}

/* Issue 16: a node with a GPU runs its stage's first layers there, as many
 * as the device memory holds (weights + an F32 KV cache, less the reserve)
 * and at most its gpu_layers; a faster node, so it gets more layers; never
 * in a tensor-parallel group or for a mixture of experts. */
static int gpu_layers_of(const cm_plan *p, int node) {
    for (int s = 0; s < p->n_stages; s++)
        for (int i = 0; i < p->stages[s].n_members; i++)
            if (p->stages[s].members[i].node == node) return p->stages[s].members[i].gpu_layers;
    return -1;
}

static void test_gpu_node(void) {
    cm_plan_model m;
    cm_plan_opts o;
    cm_plan_cluster c;
    cm_plan p, p0;
    char err[512], buf[4096];
    case_init(&m, llama8b, &o, CM_PARALLEL_PP, &c, 0.3, 40);
    add_node(&c, "a", 16, 100, 4);
    add_node(&c, "b", 16, 100, 4);
    add_node(&c, "c", 16, 100, 4);
    CHECK(cm_plan_make(&m, &c, &o, &p0, err, sizeof err) == 0);
    CHECK(gpu_layers_of(&p0, 0) == 0 && gpu_layers_of(&p0, 1) == 0 && gpu_layers_of(&p0, 2) == 0);
    /* b gets a big fast GPU: every one of its layers is on it, it takes the most, the pipeline is faster */
    c.nodes[1].gpu_mem_bytes = (uint64_t)(24 * GiB);
    c.nodes[1].gpu_mem_bw = 800e9;
    c.nodes[1].gpu_flops = 40e12;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    CHECKF(layers_of(&p, 1) > layers_of(&p0, 1) && layers_of(&p, 1) > layers_of(&p, 0) &&
               layers_of(&p, 1) > layers_of(&p, 2),
           "%d %d %d layers (without the GPU %d)", layers_of(&p, 0), layers_of(&p, 1), layers_of(&p, 2),
           layers_of(&p0, 1));
    CHECK(gpu_layers_of(&p, 1) == layers_of(&p, 1) && gpu_layers_of(&p, 0) == 0 && gpu_layers_of(&p, 2) == 0);
    CHECKF(p.tok_s > p0.tok_s * 1.2, "%.2f vs %.2f tok/s", p.tok_s, p0.tok_s);
    cm_plan_format(&p, &m, &c, buf, sizeof buf);
    char want[32];
    snprintf(want, sizeof want, " gpu:%d\n", layers_of(&p, 1));
    CHECKF(strstr(buf, want) != NULL, "%s", buf);
    /* a small GPU holds a prefix: (1.25 GiB after the reserve) / (a layer + its F32 KV) */
    c.nodes[1].gpu_mem_bytes = (uint64_t)(1.5 * GiB);
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    check_plan_valid(&p, &m, &c, &o);
    const double per = (double)m.layer_bytes[0] + 2.0 * m.n_kv_heads * m.head_dim * o.ctx * 4;
    const int fit = (int)((1.5 * GiB - o.reserve_bytes) / per);
    CHECKF(gpu_layers_of(&p, 1) == fit && layers_of(&p, 1) >= fit, "%d on the GPU of %d, %d fit", gpu_layers_of(&p, 1),
           layers_of(&p, 1), fit);
    /* a Q8_0 cache is costed as the device holds it (9 words per 32 elements of K and of V: 9/32 of F32), not
     * as F32: at a long context more layers fit (cm_gpu_kv_bytes, the one function the estimates use) */
    CHECK(cm_gpu_kv_bytes(8, 128, 1000, CM_TYPE_Q8_0, CM_TYPE_Q8_0) * 32 ==
          cm_gpu_kv_bytes(8, 128, 1000, CM_TYPE_F32, CM_TYPE_F32) * 9);
    CHECK(cm_gpu_kv_bytes(8, 128, 1000, CM_TYPE_F32, CM_TYPE_F32) == 2ull * 8 * 128 * 4 * 1000);
    CHECK(cm_gpu_kv_bytes(8, 128, 1000, CM_TYPE_F16, CM_TYPE_F16) == 2ull * 8 * 128 * 4 * 1000); /* floats there */
    CHECK(cm_gpu_kv_bytes(8, 128, 1000, CM_TYPE_Q4_0, CM_TYPE_Q4_0) * 32 ==
          cm_gpu_kv_bytes(8, 128, 1000, CM_TYPE_F32, CM_TYPE_F32) * 5);
    o.ctx = 32768;
    int fits[2];
    for (int q = 0; q < 2; q++) {
        o.kv_k32_bytes = o.kv_v32_bytes = q ? 34 : 0; /* q8_0 (cm_row_size(Q8_0, 32)), f32 */
        CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
        check_plan_valid(&p, &m, &c, &o);
        const double kvq = 2.0 * m.n_kv_heads * m.head_dim / 32 * (q ? 36 : 128) * o.ctx;
        const int want_fit = (int)((1.5 * GiB - o.reserve_bytes) / ((double)m.layer_bytes[0] + kvq));
        fits[q] = gpu_layers_of(&p, 1);
        CHECKF(fits[q] == CM_MIN(want_fit, layers_of(&p, 1)), "%s: %d on the GPU of %d, %d fit", q ? "q8_0" : "f32",
               fits[q], layers_of(&p, 1), want_fit);
    }
    CHECKF(fits[1] > fits[0], "q8_0 cache: %d layers on the GPU, f32: %d", fits[1], fits[0]);
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_PP;
    /* its own limit (--gpu-layers 3) */
    c.nodes[1].gpu_mem_bytes = (uint64_t)(24 * GiB);
    c.nodes[1].gpu_layers = 3;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(gpu_layers_of(&p, 1) == 3);
    /* a tensor-parallel group and a mixture of experts: the CPU */
    c.nodes[1].gpu_layers = 0;
    o.mode = CM_PARALLEL_TP;
    CHECK(cm_plan_make(&m, &c, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_stages == 1 && gpu_layers_of(&p, 1) == 0);
    cm_plan_model moe;
    cm_plan_model_synthetic_moe(&moe, 24, 2048, 32, 4, 64, 8, 768, 0, 151936, 4.85);
    o.mode = CM_PARALLEL_PP;
    CHECK(cm_plan_make(&moe, &c, &o, &p, err, sizeof err) == 0);
    CHECK(gpu_layers_of(&p, 1) == 0);
    /* a cluster file's "gpu" (cumulo plan --simulate) */
    const char *js =
        "{\"nodes\": [{\"name\": \"cpu\"}, {\"name\": \"g\", \"gpu\": {\"mem_gb\": 24, \"mem_bw_gbs\": 800,"
        " \"tflops\": 40, \"layers\": 5}}]}";
    cm_plan_cluster cf;
    cm_plan_opts of;
    cm_plan_opts_default(&of);
    CHECKF(cm_sim_parse_cluster(js, strlen(js), &cf, &of, NULL, 0, NULL, 0, err, sizeof err) == 0, "%s", err);
    CHECK(cf.n_nodes == 2 && cf.nodes[0].gpu_mem_bytes == 0 && cf.nodes[1].gpu_mem_bytes == (uint64_t)(24 * GiB) &&
          cf.nodes[1].gpu_mem_bw == 800e9 && cf.nodes[1].gpu_flops == 40e12 && cf.nodes[1].gpu_layers == 5);
    const char *bad = "{\"nodes\": [{\"name\": \"g\", \"gpu\": 3}]}";
    CHECK(cm_sim_parse_cluster(bad, strlen(bad), &cf, &of, NULL, 0, NULL, 0, err, sizeof err) == CM_EFORMAT);
}

int main(void) {
    RUN(test_gpu_node);
    RUN(test_shared_host);
    RUN(test_pipe_groups);
    RUN(test_single_node);
    RUN(test_kv_types);
    RUN(test_even_and_uneven_pipeline);
    RUN(test_memory_bound_node);
    RUN(test_slow_link_gets_fewer);
    RUN(test_slow_node_to_node_link);
    RUN(test_down_link);
    RUN(test_does_not_fit);
    RUN(test_pinned_first_stage);
    RUN(test_tensor_parallel_slices);
    RUN(test_auto_hybrid);
    RUN(test_experts_no_row_split);
    RUN(test_bad_input);
    RUN(test_ep_even);
    RUN(test_mla_tensor_parallel);
    RUN(test_ep_uneven_speed);
    RUN(test_ep_uneven_memory);
    RUN(test_ep_modes);
    RUN(test_ep_replicas_plan);
    RUN(test_ep_replicas_by_stage);
    TEST_END();
}
