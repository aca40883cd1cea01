/*
 * finetune_dp.c: the planner's data parallelism for `cumulo finetune
 * --cluster` (issue 17): with neither --layers nor --data-parallel, measure
 * the nodes (cm_probe_nodes: HELLO, RTT, bandwidth, node to node links;
 * nothing is assigned) and ask sched/plan_dp.h how many replicas of the
 * training pipeline they hold. It only chooses; cmd_finetune.c opens the
 * replicas as with --data-parallel N and falls back to one pipeline when
 * they do not open. A node it cannot measure makes it answer one replica:
 * the pipeline's own open then says what is wrong.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/cluster.h"
#include "os/os.h"
#include "sched/plan_dp.h"
#include "sched/simulate.h"

#include <stdio.h>
#include <string.h>

/* The probed nodes as the planner's cluster, this machine first (as coord.c's make_cluster). */
static void to_cluster(const cm_node_info *in, int n, cm_plan_cluster *c) {
    memset(c, 0, sizeof *c);
    cm_node_caps me;
    cm_node_caps_get(&me);
    c->n_nodes = n + 1;
    snprintf(c->nodes[0].name, sizeof c->nodes[0].name, "this machine");
    c->nodes[0].mem_bytes = me.mem_free;
    c->nodes[0].mem_bw = me.mem_bw > 0 ? me.mem_bw : 1e9;
    c->nodes[0].flops = (me.gflops > 0 ? me.gflops : 1) * 1e9;
    cm_host_id(c->nodes[0].host, sizeof c->nodes[0].host);
    for (int i = 0; i < n; i++) {
        const cm_node_info *f = &in[i];
        cm_plan_node *nd = &c->nodes[i + 1];
        snprintf(nd->name, sizeof nd->name, "%.40s %.20s", f->name, f->addr);
        nd->mem_bytes = f->caps.mem_free;
        nd->mem_bw = f->caps.mem_bw > 0 ? f->caps.mem_bw : 1e9;
        nd->flops = (f->caps.gflops > 0 ? f->caps.gflops : 1) * 1e9;
        snprintf(nd->host, sizeof nd->host, "%s", f->host);
        if (f->caps.gpu_name[0]) {
            nd->gpu_mem_bytes = f->caps.gpu_mem;
            nd->gpu_mem_bw = f->caps.gpu_bw;
            nd->gpu_flops = f->caps.gpu_flops;
            nd->gpu_layers = f->caps.gpu_layers;
        }
        c->rtt_s[0][i + 1] = c->rtt_s[i + 1][0] = f->rtt_s;
        c->bw[0][i + 1] = c->bw[i + 1][0] = f->bw > 0 ? f->bw : 1e6;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const cm_node_link *l = j < CM_NODE_LINKS_MAX ? &in[i].links[j] : NULL;
            if (i == j) continue;
            if (l && l->asked && !l->status) {
                c->rtt_s[i + 1][j + 1] = l->rtt_s;
                c->bw[i + 1][j + 1] = l->bw > 0 ? l->bw : 1e6;
            } else { /* not measured: as the slower of the two links to this machine */
                c->rtt_s[i + 1][j + 1] = CM_MAX(in[i].rtt_s, in[j].rtt_s);
                c->bw[i + 1][j + 1] = CM_MAX(CM_MIN(in[i].bw, in[j].bw), 1e6);
                c->down[i + 1][j + 1] = l && l->asked;
            }
        }
}

int cli_finetune_dp(const cm_gguf *g, const char *nodes, bool insecure, const char *key_file, bool take, int n_ctx,
                    char *list, size_t cap, char *why, size_t whylen) {
    char addrs[CM_PLAN_MAX_NODES - 1][80], e[400];
    const char *ptr[CM_PLAN_MAX_NODES - 1];
    int n = 0;
    const bool mdns = !nodes || !strcmp(nodes, "auto");
    why[0] = 0;
    if (mdns) {
        n = cm_discover(3.0, addrs, CM_PLAN_MAX_NODES - 1, e, sizeof e);
    } else {
        for (const char *q = nodes; *q && n < CM_PLAN_MAX_NODES - 1;) {
            size_t k = strcspn(q, ",");
            if (k && k < sizeof addrs[0]) memcpy(addrs[n], q, k), addrs[n++][k] = 0;
            q += k + (q[k] == ',');
        }
    }
    if (n < 2) return 1;
    for (int i = 0; i < n; i++) ptr[i] = addrs[i];
    cm_node_info *info = cm_calloc((size_t)n, sizeof *info);
    cm_plan_cluster *c = cm_calloc(1, sizeof *c);
    cm_plan_model *pm = cm_calloc(1, sizeof *pm);
    int reps = 1;
    if (!info || !c || !pm || cm_probe_nodes(ptr, n, insecure, key_file, info, e, sizeof e) ||
        cm_plan_model_from_gguf(g, pm, e, sizeof e))
        goto done;
    int used = 0; /* mDNS: nodes that cannot be used are left out, as cm_pipe_open does */
    for (int i = 0; i < n; i++) {
        const bool ok = !info[i].status && (take || !info[i].serves[0]);
        if (!ok && !mdns) goto done;
        if (ok) info[used++] = info[i];
    }
    /* (leaving nodes out breaks the link table's indices: measured links stay only without gaps) */
    if (used < n)
        for (int i = 0; i < used; i++) memset(info[i].links, 0, sizeof info[i].links);
    to_cluster(info, used, c);
    cm_plan_opts po;
    cm_plan_opts_default(&po);
    po.ctx = n_ctx; /* as cmd_finetune.c's pipe: one sequence, an F32 KV cache */
    cm_plan_dp d;
    if (cm_plan_data_parallel(pm, c, &po, &d, e, sizeof e) || d.n_replicas < 2) goto done;
    size_t at = 0;
    list[0] = 0;
    for (int i = 0; i < d.n_replicas * d.per_replica && at < cap; i++)
        at += (size_t)snprintf(list + at, cap - at, "%s%s", i ? "," : "", info[d.order[i] - 1].addr);
    if (at < cap) reps = d.n_replicas;
    snprintf(why, whylen, "%s", d.why);
done:
    cm_free(info);
    cm_free(c);
    cm_free(pm);
    return reps;
}
