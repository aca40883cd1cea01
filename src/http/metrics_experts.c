/*
 * metrics_experts.c: a mixture-of-experts model's routing in /metrics and
 * /api/cluster (issue 13): the token assignments the router sent to each
 * expert of each layer this machine computes (model.h's counts, read while
 * sessions run; in a cluster with the later stages' reports, so every
 * layer), which members of each expert group hold each expert (a hot
 * one replicated), where the counts the planner uses come from and how
 * often they changed the plan, and this machine's expert exchange. Nothing
 * here is estimated: a layer nobody has counted yet shows no counts in
 * /metrics and zeros in /api/cluster.
 */
#include "http_impl.h"

#include <stdio.h>
#include <string.h>

enum { MAX_X = 1024 };

/* Members of stage s's expert group holding expert e (a range or a replica). */
static int holders(const cm_engine_member *mbs, int n, int s, int e) {
    int h = 0;
    for (int i = 0; i < n; i++) {
        const cm_engine_member *mb = &mbs[i];
        if (mb->stage != s || !mb->ep) continue;
        bool held = e >= mb->expert_begin && e < mb->expert_end;
        for (int r = 0; r < mb->n_replicas && !held; r++) held = mb->replicas[r] == e;
        h += held;
    }
    return h;
}

/* The layers counted: every one (a cluster's later stages report theirs). */
static int counted_layers(const cm_engine_info *in) { return in->n_layer; }

/* The server's engine and its facts when its model has experts, else NULL. */
static cm_engine *moe_engine(cm_http_server *srv, cm_engine_info *in) {
    cm_engine *e = cm_http_engine(srv);
    memset(in, 0, sizeof *in);
    if (e) cm_engine_get_info(e, in);
    return e && in->n_expert > 0 && in->n_expert <= MAX_X ? e : NULL;
}

void cm_metrics_experts_prometheus(cm_http_server *srv, cm_buf *o) {
    cm_engine_info in;
    cm_engine *e = moe_engine(srv, &in);
    if (!e) return;
    const int nx = in.n_expert;
    static _Thread_local uint64_t h[MAX_X];
    cm_buf_puts(o, "# HELP cumulo_expert_routed_total Token assignments the router sent to an expert, by layer "
                   "(every stage's layers in a cluster).\n# TYPE cumulo_expert_routed_total counter\n");
    for (int il = 0; il < counted_layers(&in); il++) {
        cm_engine_expert_hits_layer(e, il, h, nx);
        uint64_t sum = 0;
        for (int x = 0; x < nx; x++) sum += h[x];
        if (!sum) continue; /* a dense layer, or none routed yet */
        for (int x = 0; x < nx; x++)
            cm_buf_printf(o, "cumulo_expert_routed_total{layer=\"%d\",expert=\"%d\"} %llu\n", il, x,
                          (unsigned long long)h[x]);
    }
    cm_engine_experts ex;
    if (!cm_engine_expert_info(e, &ex)) return;
    cm_engine_member mbs[32];
    int n = cm_engine_members(e, mbs, (int)CM_ARRAY_LEN(mbs));
    if (n > (int)CM_ARRAY_LEN(mbs)) n = (int)CM_ARRAY_LEN(mbs);
    cm_buf_puts(o, "# HELP cumulo_expert_holders Members of an expert group holding an expert (more than 1: "
                   "replicated).\n# TYPE cumulo_expert_holders gauge\n");
    for (int i = 0; i < n; i++) {
        if (!mbs[i].ep || mbs[i].member) continue; /* each group once, by its first member */
        for (int x = 0; x < nx; x++)
            cm_buf_printf(o, "cumulo_expert_holders{stage=\"%d\",expert=\"%d\"} %d\n", mbs[i].stage, x,
                          holders(mbs, n, mbs[i].stage, x));
    }
    cm_buf_printf(o,
                  "# HELP cumulo_expert_replans_total Plan changes made because of the routing measured while "
                  "serving (load: measured, given or uniform).\n# TYPE cumulo_expert_replans_total counter\n"
                  "cumulo_expert_replans_total{load=\"%s\"} %d\n"
                  "# HELP cumulo_expert_exchange_bytes_total Element bytes this machine sent in expert "
                  "exchanges, every plan.\n# TYPE cumulo_expert_exchange_bytes_total counter\n"
                  "cumulo_expert_exchange_bytes_total %llu\n"
                  "# HELP cumulo_expert_exchange_rows_total Token rows through this machine's expert group, "
                  "every plan.\n# TYPE cumulo_expert_exchange_rows_total counter\n"
                  "cumulo_expert_exchange_rows_total %llu\n",
                  ex.load, ex.replans, (unsigned long long)ex.exchange_bytes, (unsigned long long)ex.exchange_rows);
}

void cm_metrics_member_experts_json(cm_buf *o, const cm_engine_member *mb) {
    if (!mb->ep) return;
    cm_buf_printf(o, ",\"experts\":[%d,%d],\"replicas\":[", mb->expert_begin, mb->expert_end);
    for (int r = 0; r < mb->n_replicas; r++) cm_buf_printf(o, "%s%d", r ? "," : "", mb->replicas[r]);
    cm_buf_puts(o, "]");
}

void cm_metrics_experts_json(cm_http_server *srv, cm_buf *o) {
    cm_engine_info in;
    cm_engine *e = moe_engine(srv, &in);
    if (!e) return;
    const int nx = in.n_expert;
    static _Thread_local uint64_t h[MAX_X];
    cm_buf_printf(o, ",\"experts\":{\"n_expert\":%d,\"n_expert_used\":%d,\"counted_layers\":[0,%d]", nx,
                  in.n_expert_used, counted_layers(&in));
    cm_engine_experts ex;
    if (cm_engine_expert_info(e, &ex))
        cm_buf_printf(o,
                      ",\"load\":\"%s\",\"warmup\":%d,\"replans\":%d,\"exchange_bytes\":%llu,\"exchange_rows\":%llu,"
                      "\"reports\":%llu,\"refused_reports\":%llu",
                      ex.load, ex.warmup, ex.replans, (unsigned long long)ex.exchange_bytes,
                      (unsigned long long)ex.exchange_rows, (unsigned long long)ex.reports,
                      (unsigned long long)ex.refused);
    cm_engine_expert_hits(e, h, nx);
    cm_buf_puts(o, ",\"hits\":[");
    for (int x = 0; x < nx; x++) cm_buf_printf(o, "%s%llu", x ? "," : "", (unsigned long long)h[x]);
    cm_buf_puts(o, "],\"hits_by_layer\":[");
    for (int il = 0; il < in.n_layer; il++) {
        cm_engine_expert_hits_layer(e, il, h, nx);
        cm_buf_puts(o, il ? ",[" : "[");
        for (int x = 0; x < nx; x++) cm_buf_printf(o, "%s%llu", x ? "," : "", (unsigned long long)h[x]);
        cm_buf_puts(o, "]");
    }
    /* experts with more than one holder in some expert group */
    cm_engine_member mbs[32];
    int n = cm_engine_members(e, mbs, (int)CM_ARRAY_LEN(mbs));
    if (n > (int)CM_ARRAY_LEN(mbs)) n = (int)CM_ARRAY_LEN(mbs);
    cm_buf_puts(o, "],\"replicated\":[");
    bool first = true;
    for (int x = 0; x < nx; x++) {
        bool rep = false;
        for (int i = 0; i < n && !rep; i++) rep = mbs[i].ep && !mbs[i].member && holders(mbs, n, mbs[i].stage, x) > 1;
        if (rep) {
            cm_buf_printf(o, "%s%d", first ? "" : ",", x);
            first = false;
        }
    }
    cm_buf_puts(o, "]}");
}
