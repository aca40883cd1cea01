/* test_plan_dp.c: the choice of data-parallel replicas for training
 * (sched/plan_dp.h) on imaginary clusters: the most replicas whose nodes
 * each hold the model, dealt by speed, the slowest left out, one pipeline
 * when the model fits only once. */
#include "test.h"

#include <string.h>

#include "base/base.h"
#include "sched/plan_dp.h"

static cm_plan_model g_m;
static double g_total; /* the model's weight bytes */

/* A cluster of 1 + n nodes; node i (0: this machine) offers frac[i] of the
 * model's bytes beyond the reserve and computes flops[i] GFLOP/s. */
static void cluster(cm_plan_cluster *c, int n, const double *frac, const double *gflops, const cm_plan_opts *o) {
    memset(c, 0, sizeof *c);
    c->n_nodes = n + 1;
    for (int i = 0; i <= n; i++) {
        cm_plan_node *nd = &c->nodes[i];
        snprintf(nd->name, sizeof nd->name, "n%d", i);
        nd->mem_bytes = (uint64_t)(frac[i] * g_total) + o->reserve_bytes;
        nd->mem_bw = 100e9;
        nd->flops = gflops[i] * 1e9;
        for (int j = 0; j <= n; j++) {
            c->rtt_s[i][j] = i == j ? 0 : 2e-4;
            c->bw[i][j] = 1.25e9;
        }
    }
}

static void setup(cm_plan_opts *o) {
    cm_plan_model_synthetic(&g_m, 32, 4096, 32, 8, 14336, 128256, 4.85); /* an 8B at ~4.85 bits */
    g_total = (double)(g_m.embd_bytes + g_m.head_bytes);
    for (int l = 0; l < g_m.n_layers; l++) g_total += (double)g_m.layer_bytes[l];
    cm_plan_opts_default(o);
    o->ctx = 256; /* a training window: its KV-sized share is a few MB a layer */
}

static cm_plan_dp choose(int n, const double *frac, const double *gflops) {
    cm_plan_opts o;
    setup(&o);
    cm_plan_cluster *c = cm_calloc(1, sizeof *c);
    cm_plan_dp d;
    char err[256] = "";
    cluster(c, n, frac, gflops, &o);
    int rc = cm_plan_data_parallel(&g_m, c, &o, &d, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    cm_free(c);
    return d;
}

static const double k_same[8] = {1, 1, 1, 1, 1, 1, 1, 1};

/* 0.6 of the model per node: this machine and any one node hold it. */
static void test_pairs(void) {
    const double f[5] = {0.6, 0.6, 0.6, 0.6, 0.6};
    cm_plan_dp d = choose(4, f, k_same);
    CHECKF(d.n_replicas == 4 && d.per_replica == 1, "%d x %d: %s", d.n_replicas, d.per_replica, d.why);
    for (int i = 1; i <= 4; i++) CHECK(d.replica_of[i] == i - 1); /* equal speeds: the cluster's order */
}

/* 0.4 per node: three machines hold it, two do not: 2 replicas of 2 nodes,
 * dealt fastest first (flops 1, 4, 2, 3 -> sorted nodes 2, 4, 3, 1). */
static void test_triples_by_speed(void) {
    const double f[5] = {0.4, 0.4, 0.4, 0.4, 0.4}, s[5] = {1, 1, 4, 2, 3};
    cm_plan_dp d = choose(4, f, s);
    CHECKF(d.n_replicas == 2 && d.per_replica == 2, "%d x %d: %s", d.n_replicas, d.per_replica, d.why);
    CHECK(d.replica_of[2] == 0 && d.replica_of[3] == 0 && d.replica_of[4] == 1 && d.replica_of[1] == 1);
    CHECK(d.order[0] == 2 && d.order[1] == 3 && d.order[2] == 4 && d.order[3] == 1);
}

/* 5 nodes at 0.4: 2 replicas of 2, the slowest node left out. */
static void test_slowest_left_out(void) {
    const double f[6] = {0.4, 0.4, 0.4, 0.4, 0.4, 0.4}, s[6] = {1, 5, 4, 3, 0.5, 2};
    cm_plan_dp d = choose(5, f, s);
    CHECKF(d.n_replicas == 2 && d.per_replica == 2, "%d x %d: %s", d.n_replicas, d.per_replica, d.why);
    CHECK(d.replica_of[4] == -1);
    CHECK(d.replica_of[1] == 0 && d.replica_of[3] == 0 && d.replica_of[2] == 1 && d.replica_of[5] == 1);
    CHECK(strstr(d.why, "left out") != NULL);
}

/* 0.3 per node: only all five together hold it: one pipeline; and a
 * single node never makes replicas. */
static void test_fits_once(void) {
    const double f[5] = {0.3, 0.3, 0.3, 0.3, 0.3};
    cm_plan_dp d = choose(4, f, k_same);
    CHECKF(d.n_replicas == 1, "%d: %s", d.n_replicas, d.why);
    for (int i = 0; i < 4; i++) CHECK(d.order[i] == i + 1);
    const double g[2] = {2, 2};
    d = choose(1, g, k_same);
    CHECK(d.n_replicas == 1);
}

/* A down link between this machine and node 1: a replica of node 1 alone
 * cannot follow this machine, so no one-node replicas (node 1 is dealt
 * into the first); with node 3 between them (0 -> 3 -> 1), 2 replicas of 2. */
static void test_down_link(void) {
    cm_plan_opts o;
    setup(&o);
    const double f[5] = {0.6, 0.6, 0.6, 0.6, 0.6};
    cm_plan_cluster *c = cm_calloc(1, sizeof *c);
    cluster(c, 4, f, k_same, &o);
    c->down[0][1] = c->down[1][0] = true;
    cm_plan_dp d;
    char err[256];
    CHECK(cm_plan_data_parallel(&g_m, c, &o, &d, err, sizeof err) == 0);
    CHECKF(d.n_replicas == 2 && d.per_replica == 2, "%d x %d: %s", d.n_replicas, d.per_replica, d.why);
    cm_free(c);
}

int main(void) {
    RUN(test_pairs);
    RUN(test_triples_by_speed);
    RUN(test_slowest_left_out);
    RUN(test_fits_once);
    RUN(test_down_link);
    TEST_END();
}
