/*
 * metrics.c: counters for /metrics (Prometheus text format 0.0.4) and the
 * dashboard's /api/cluster JSON: requests by route and status, prompt and
 * generated tokens, errors, queue depth, active slots, tokens/s over the last
 * seconds, and per node memory, CPU load, power (measured or estimated,
 * labelled) and tokens per watt. One machine = one node; a cluster engine
 * adds its nodes (live readings from their heartbeats, issue 19) and links.
 * Every number shown is a real reading; nothing is made up for show.
 * Cluster tokens/W = the cluster's tokens/s / the watts of every machine,
 * each host counted once (nodes sharing a machine report its watts alike),
 * labelled by how each machine's watts were obtained.
 */
#include "http_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

const char *const cm_http_route_names[R_COUNT] = {"/",
                                                  "/health",
                                                  "/metrics",
                                                  "/api/cluster",
                                                  "/v1/models",
                                                  "/v1/chat/completions",
                                                  "/v1/completions",
                                                  "/v1/messages",
                                                  "/v1/embeddings",
                                                  "/apply-template",
                                                  "/lora-adapters",
                                                  "/v1/fine_tuning/jobs",
                                                  "other"};

static const int k_statuses[] = {200, 400, 401, 403, 404, 405, 408, 413, 429, 431, 500, 503};
#define N_STATUS ((int)CM_ARRAY_LEN(k_statuses) + 1) /* + "other" */
#define RATE_WINDOW 5                                /* seconds of tokens/s averaging */

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[R_COUNT][N_STATUS];
    uint64_t prompt_tokens, cached_tokens, gen_tokens, client_errors, server_errors;
    uint64_t prefix_hits, prefix_tokens; /* prompt prefixes copied between slots */
    uint64_t bucket[RATE_WINDOW + 1];    /* generated tokens per second, ring by second */
    int64_t bucket_sec[RATE_WINDOW + 1];
    cm_power_meter *pm;
    cm_power_sample power;
    double power_t;
    char node[128];
};

metrics *cm_metrics_new(double tdp_w) {
    metrics *m = cm_calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->pm = cm_power_open(tdp_w);
    if (gethostname(m->node, sizeof m->node - 1) || !m->node[0]) snprintf(m->node, sizeof m->node, "local");
    if (m->pm) cm_power_read(m->pm, &m->power);
    m->power_t = cm_now_s();
    return m;
}

void cm_metrics_free(metrics *m) {
    if (!m) return;
    cm_power_close(m->pm);
    pthread_mutex_destroy(&m->mu);
    cm_free(m);
}

void cm_metrics_request(metrics *m, enum route r, int status) {
    int k = 0;
    while (k < N_STATUS - 1 && k_statuses[k] != status) k++;
    pthread_mutex_lock(&m->mu);
    m->requests[r][k]++;
    if (status >= 400 && status < 500) m->client_errors++;
    if (status >= 500) m->server_errors++;
    pthread_mutex_unlock(&m->mu);
}

void cm_metrics_prefix(metrics *m, int n_tokens) {
    pthread_mutex_lock(&m->mu);
    m->prefix_hits++;
    m->prefix_tokens += (uint64_t)(n_tokens > 0 ? n_tokens : 0);
    pthread_mutex_unlock(&m->mu);
}

void cm_metrics_tokens(metrics *m, int n_prompt, int n_cached) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)n_prompt;
    m->cached_tokens += (uint64_t)(n_cached > 0 ? n_cached : 0);
    pthread_mutex_unlock(&m->mu);
}

void cm_metrics_gen_tokens(metrics *m, int n) {
    int64_t sec = (int64_t)cm_now_s();
    int i = (int)(sec % (RATE_WINDOW + 1));
    pthread_mutex_lock(&m->mu);
    m->gen_tokens += (uint64_t)n;
    if (m->bucket_sec[i] != sec) {
        m->bucket_sec[i] = sec;
        m->bucket[i] = 0;
    }
    m->bucket[i] += (uint64_t)n;
    pthread_mutex_unlock(&m->mu);
}

/* Under mu: tokens/s over the last RATE_WINDOW whole seconds. */
static double rate(metrics *m) {
    int64_t now = (int64_t)cm_now_s();
    uint64_t sum = 0;
    for (int i = 0; i < RATE_WINDOW + 1; i++)
        if (m->bucket_sec[i] < now && m->bucket_sec[i] >= now - RATE_WINDOW) sum += m->bucket[i];
    return (double)sum / RATE_WINDOW;
}

/* The cluster's power: every distinct host once (this machine's meter, then
 * each remote member's heartbeat), with a label saying how each was obtained
 * ("rapl x1, estimate x2") and whether every machine reported. */
typedef struct cluster_power {
    double watts, tpw;
    int n_hosts, n_missing;
    char label[160];
} cluster_power;

static void add_src(int *cnt, const char *const *names, int n_names, const char *src) {
    for (int i = 0; i < n_names; i++)
        if (!strcmp(names[i], src)) {
            cnt[i]++;
            return;
        }
    cnt[n_names - 1]++;
}

static void sum_cluster_power(double local_w, bool local_measured, double tps, const cm_engine_member *mbs, int n,
                              cluster_power *cp) {
    static const char *const names[] = {"rapl", "estimate", "counters", "none"};
    int cnt[4] = {0};
    const char *seen[64];
    int n_seen = 0;
    memset(cp, 0, sizeof *cp);
    cp->watts = local_w;
    cp->n_hosts = 1;
    add_src(cnt, names, 4, local_measured ? "rapl" : "estimate");
    for (int i = 0; i < n; i++)
        if (mbs[i].local && n_seen < 64) seen[n_seen++] = mbs[i].host;
    for (int i = 0; i < n; i++) {
        const cm_engine_member *mb = &mbs[i];
        if (mb->local) continue;
        bool dup = false;
        for (int k = 0; k < n_seen && !dup; k++) dup = mb->host[0] && !strcmp(seen[k], mb->host);
        if (dup) continue; /* its machine is counted already */
        if (!mb->live) {
            cp->n_missing++;
            continue;
        }
        if (n_seen < 64) seen[n_seen++] = mb->host;
        cp->watts += mb->live_power_w;
        cp->n_hosts++;
        add_src(cnt, names, 4, mb->live_power_source);
    }
    size_t o = 0;
    for (int i = 0; i < 4; i++)
        if (cnt[i] && o < sizeof cp->label)
            o += (size_t)snprintf(cp->label + o, sizeof cp->label - o, "%s%s x%d", o ? ", " : "", names[i], cnt[i]);
    if (cp->n_missing && o < sizeof cp->label)
        snprintf(cp->label + o, sizeof cp->label - o, ", %d not reporting", cp->n_missing);
    cp->tpw = cm_power_tokens_per_watt(tps, cp->watts);
}

/* Under mu: a power reading at most a second old (reads average over the gap). */
static void refresh_power(metrics *m) {
    double now = cm_now_s();
    if (m->pm && now - m->power_t >= 1.0) {
        cm_power_read(m->pm, &m->power);
        m->power_t = now;
    }
}

typedef struct snap {
    int queued, active, slots;
    double tps, watts, joules, load, tpw;
    bool measured, ready;
    uint64_t mem_total, mem_used;
    cm_http_kv_stats kv;
} snap;

/* Lock order: the scheduler's lock is never taken under m->mu (the scheduler
 * may report to metrics while holding its own), so the scheduler's numbers
 * are read first, then m->mu is taken here. */
static void take(metrics *m, cm_http_server *srv, snap *s) {
    memset(s, 0, sizeof *s);
    s->ready = cm_http_ready(srv);
    cm_http_queue_stats(srv, &s->queued, &s->active, &s->slots);
    cm_http_kv_stats_get(srv, &s->kv);
    pthread_mutex_lock(&m->mu);
    s->tps = rate(m);
    refresh_power(m);
    s->watts = m->power.watts;
    s->joules = m->power.joules;
    s->load = m->power.cpu_load;
    s->measured = m->power.measured;
    s->tpw = cm_power_tokens_per_watt(s->tps, s->watts);
    pthread_mutex_unlock(&m->mu);
    s->mem_total = cm_mem_total_bytes();
    uint64_t avail = cm_mem_available_bytes();
    s->mem_used = s->mem_total > avail ? s->mem_total - avail : 0;
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void label(cm_buf *o, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') cm_buf_printf(o, "\\%c", *v);
        else if (*v == '\n') cm_buf_puts(o, "\\n");
        else cm_buf_printf(o, "%c", *v);
    }
}

/* The nodes of a cluster engine, from their heartbeats (labels node = the
 * name it gave, host = its host id), and the cluster's power and tokens/W. */
static void remote_prometheus(metrics *m, cm_http_server *srv, const snap *s, cm_buf *o) {
    cm_engine *e = cm_http_engine(srv);
    cm_engine_member mbs[32];
    int n = e ? cm_engine_members(e, mbs, (int)CM_ARRAY_LEN(mbs)) : 0;
    if (n > (int)CM_ARRAY_LEN(mbs)) n = (int)CM_ARRAY_LEN(mbs);
    if (n <= 0) return;
    static const char *const what[][3] = {
        {"cumulo_cluster_node_memory_used_bytes", "Memory in use on a cluster node's machine (heartbeat).", "%.0f"},
        {"cumulo_cluster_node_cpu_load", "Busy fraction of a cluster node's CPUs (heartbeat).", "%.4f"},
        {"cumulo_cluster_node_power_watts", "Power of a cluster node's machine; source: rapl or estimate.", "%.3f"},
        {"cumulo_cluster_node_tokens_per_second", "Token rows a cluster node computed per second, recently.", "%.3f"},
        {"cumulo_cluster_node_ms_per_token", "A cluster node's stage time per token row, ms.", "%.3f"}};
    for (int w = 0; w < 5; w++) {
        cm_buf_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", what[w][0], what[w][1], what[w][0]);
        for (int i = 0; i < n; i++) {
            const cm_engine_member *mb = &mbs[i];
            double v;
            const char *src = "";
            if (mb->local) { /* this machine: its own meter */
                double vals[5] = {(double)s->mem_used, s->load, s->watts, s->tps, -1};
                v = vals[w];
                src = s->measured ? "rapl" : "estimate";
            } else {
                if (!mb->live) continue; /* no reading: no sample (never an invented one) */
                double vals[5] = {(double)mb->live_mem_used, mb->live_cpu_load, mb->live_power_w, mb->live_tok_s,
                                  mb->live_ms_per_tok};
                v = vals[w];
                src = mb->live_power_source;
            }
            if (v < 0) continue;
            cm_buf_printf(o, "%s{node=\"", what[w][0]);
            label(o, mb->local ? m->node : mb->name);
            cm_buf_puts(o, "\",host=\"");
            label(o, mb->host);
            cm_buf_printf(o, "\",stage=\"%d\"", mb->stage);
            if (w == 2) cm_buf_printf(o, ",source=\"%s\"", src);
            cm_buf_puts(o, "} ");
            cm_buf_printf(o, what[w][2], v);
            cm_buf_puts(o, "\n");
        }
    }
    cluster_power cp;
    sum_cluster_power(s->watts, s->measured, s->tps, mbs, n, &cp);
    cm_buf_printf(
        o,
        "# HELP cumulo_cluster_power_watts Watts of every machine of the cluster, each host once; source says how each was obtained.\n"
        "# TYPE cumulo_cluster_power_watts gauge\ncumulo_cluster_power_watts{hosts=\"%d\",source=\"%s\"} %.3f\n"
        "# HELP cumulo_cluster_tokens_per_watt Cluster tokens/s divided by cumulo_cluster_power_watts.\n"
        "# TYPE cumulo_cluster_tokens_per_watt gauge\ncumulo_cluster_tokens_per_watt{hosts=\"%d\",source=\"%s\"} %.5f\n",
        cp.n_hosts, cp.label, cp.watts, cp.n_hosts, cp.label, cp.tpw);
}

void cm_metrics_prometheus(metrics *m, cm_http_server *srv, cm_buf *o) {
    snap s;
    take(m, srv, &s);
    pthread_mutex_lock(&m->mu);
    cm_buf_puts(o, "# HELP cumulo_requests_total HTTP requests by route and status.\n"
                   "# TYPE cumulo_requests_total counter\n");
    for (int r = 0; r < R_COUNT; r++)
        for (int k = 0; k < N_STATUS; k++)
            if (m->requests[r][k]) {
                if (k < N_STATUS - 1)
                    cm_buf_printf(o, "cumulo_requests_total{route=\"%s\",status=\"%d\"} %llu\n", cm_http_route_names[r],
                                  k_statuses[k], (unsigned long long)m->requests[r][k]);
                else
                    cm_buf_printf(o, "cumulo_requests_total{route=\"%s\",status=\"other\"} %llu\n",
                                  cm_http_route_names[r], (unsigned long long)m->requests[r][k]);
            }
    cm_buf_printf(
        o,
        "# HELP cumulo_errors_total Requests answered with an error, by kind (client: 4xx, server: 5xx).\n"
        "# TYPE cumulo_errors_total counter\n"
        "cumulo_errors_total{kind=\"client\"} %llu\ncumulo_errors_total{kind=\"server\"} %llu\n"
        "# HELP cumulo_prompt_tokens_total Prompt tokens of completed requests.\n"
        "# TYPE cumulo_prompt_tokens_total counter\ncumulo_prompt_tokens_total %llu\n"
        "# HELP cumulo_prompt_tokens_cached_total Prompt tokens reused from a slot's KV cache (not evaluated).\n"
        "# TYPE cumulo_prompt_tokens_cached_total counter\ncumulo_prompt_tokens_cached_total %llu\n"
        "# HELP cumulo_generated_tokens_total Tokens generated.\n"
        "# TYPE cumulo_generated_tokens_total counter\ncumulo_generated_tokens_total %llu\n"
        "# HELP cumulo_ready 1 when the model is loaded.\n# TYPE cumulo_ready gauge\ncumulo_ready %d\n"
        "# HELP cumulo_queue_depth Requests waiting for a slot.\n# TYPE cumulo_queue_depth gauge\n"
        "cumulo_queue_depth %d\n"
        "# HELP cumulo_slots_active Slots generating now.\n# TYPE cumulo_slots_active gauge\n"
        "cumulo_slots_active %d\n"
        "# HELP cumulo_slots_total Slots.\n# TYPE cumulo_slots_total gauge\ncumulo_slots_total %d\n"
        "# HELP cumulo_tokens_per_second Generated tokens per second, last %d s, whole cluster.\n"
        "# TYPE cumulo_tokens_per_second gauge\ncumulo_tokens_per_second %.3f\n",
        (unsigned long long)m->client_errors, (unsigned long long)m->server_errors,
        (unsigned long long)m->prompt_tokens, (unsigned long long)m->cached_tokens, (unsigned long long)m->gen_tokens,
        s.ready, s.queued, s.active, s.slots, RATE_WINDOW, s.tps);
    cm_buf_printf(o,
                  "# HELP cumulo_prefix_cache_hits_total Requests that took a shared prompt prefix from another "
                  "slot's KV cache (shared copy-on-write, not evaluated).\n"
                  "# TYPE cumulo_prefix_cache_hits_total counter\ncumulo_prefix_cache_hits_total %llu\n"
                  "# HELP cumulo_prefix_cache_tokens_total Prompt tokens so taken (not evaluated again).\n"
                  "# TYPE cumulo_prefix_cache_tokens_total counter\ncumulo_prefix_cache_tokens_total %llu\n",
                  (unsigned long long)m->prefix_hits, (unsigned long long)m->prefix_tokens);
    const cm_http_kv_stats kv = s.kv;
    const uint64_t kv_free = kv.capacity > kv.reserved ? kv.capacity - kv.reserved : 0;
    cm_buf_printf(o,
                  "# HELP cumulo_kv_bytes_in_use KV cache bytes the slots occupy (pages written).\n"
                  "# TYPE cumulo_kv_bytes_in_use gauge\ncumulo_kv_bytes_in_use %llu\n"
                  "# HELP cumulo_kv_bytes_reserved KV bytes held by idle slots or promised to running requests.\n"
                  "# TYPE cumulo_kv_bytes_reserved gauge\ncumulo_kv_bytes_reserved %llu\n"
                  "# HELP cumulo_kv_bytes_capacity The KV memory budget (--kv-mem).\n"
                  "# TYPE cumulo_kv_bytes_capacity gauge\ncumulo_kv_bytes_capacity %llu\n"
                  "# HELP cumulo_kv_blocks_free Unpromised budget in blocks of %d positions (%llu bytes each).\n"
                  "# TYPE cumulo_kv_blocks_free gauge\ncumulo_kv_blocks_free %llu\n"
                  "# HELP cumulo_kv_waiting 1 while the first queued request waits for KV memory.\n"
                  "# TYPE cumulo_kv_waiting gauge\ncumulo_kv_waiting %d\n"
                  "# HELP cumulo_kv_evictions_total Idle slots' caches given back to admit a request.\n"
                  "# TYPE cumulo_kv_evictions_total counter\ncumulo_kv_evictions_total %llu\n"
                  "# HELP cumulo_kv_bytes_shared Shared prompt-prefix KV pages (copy-on-write; in use, counted "
                  "once).\n"
                  "# TYPE cumulo_kv_bytes_shared gauge\ncumulo_kv_bytes_shared %llu\n"
                  "# HELP cumulo_kv_bytes_shared_saved Bytes the slots map from shared prefix pages beyond that "
                  "once (what copies would take).\n"
                  "# TYPE cumulo_kv_bytes_shared_saved gauge\ncumulo_kv_bytes_shared_saved %llu\n",
                  (unsigned long long)kv.in_use, (unsigned long long)kv.reserved, (unsigned long long)kv.capacity,
                  CM_HTTP_KV_BLOCK, (unsigned long long)kv.block_bytes,
                  (unsigned long long)(kv.block_bytes ? kv_free / kv.block_bytes : 0), kv.waiting,
                  (unsigned long long)kv.evictions, (unsigned long long)kv.shared, (unsigned long long)kv.shared_saved);
    cm_buf_printf(o,
                  "# HELP cumulo_kv_bytes_pooled KV pages kept committed past the slots' positions for the next "
                  "requests (no first-touch faults; not in use, in reserved).\n"
                  "# TYPE cumulo_kv_bytes_pooled gauge\ncumulo_kv_bytes_pooled %llu\n"
                  "# HELP cumulo_kv_pool_trims_total Times the pools were given back to admit a request.\n"
                  "# TYPE cumulo_kv_pool_trims_total counter\ncumulo_kv_pool_trims_total %llu\n"
                  "# HELP cumulo_prompt_interjections_total Short prompts evaluated in a pass of their own between "
                  "two layers of a running pass (their first token did not wait for it).\n"
                  "# TYPE cumulo_prompt_interjections_total counter\ncumulo_prompt_interjections_total %llu\n"
                  "# HELP cumulo_prompt_short_first_total Short prompts evaluated in a pass of their own between two "
                  "steps while others decode (their first token did not wait for the decode rows).\n"
                  "# TYPE cumulo_prompt_short_first_total counter\ncumulo_prompt_short_first_total %llu\n",
                  (unsigned long long)kv.pooled, (unsigned long long)kv.pool_trims,
                  (unsigned long long)kv.interjections, (unsigned long long)kv.short_first);
    const char *src = s.measured ? "measured" : "estimated";
    cm_buf_printf(o,
                  "# HELP cumulo_node_tokens_per_second Generated tokens per second of a node.\n"
                  "# TYPE cumulo_node_tokens_per_second gauge\ncumulo_node_tokens_per_second{node=\"%s\"} %.3f\n"
                  "# HELP cumulo_node_power_watts Power draw of a node (source: measured or estimated).\n"
                  "# TYPE cumulo_node_power_watts gauge\ncumulo_node_power_watts{node=\"%s\",source=\"%s\"} %.3f\n"
                  "# HELP cumulo_node_energy_joules_total Energy of a node since the server started.\n"
                  "# TYPE cumulo_node_energy_joules_total counter\n"
                  "cumulo_node_energy_joules_total{node=\"%s\",source=\"%s\"} %.3f\n"
                  "# HELP cumulo_node_tokens_per_watt Tokens per second per watt (tokens per joule).\n"
                  "# TYPE cumulo_node_tokens_per_watt gauge\n"
                  "cumulo_node_tokens_per_watt{node=\"%s\",source=\"%s\"} %.5f\n"
                  "# HELP cumulo_node_memory_used_bytes Memory in use on a node.\n"
                  "# TYPE cumulo_node_memory_used_bytes gauge\ncumulo_node_memory_used_bytes{node=\"%s\"} %llu\n"
                  "# HELP cumulo_node_memory_total_bytes Memory of a node.\n"
                  "# TYPE cumulo_node_memory_total_bytes gauge\ncumulo_node_memory_total_bytes{node=\"%s\"} %llu\n",
                  m->node, s.tps, m->node, src, s.watts, m->node, src, s.joules, m->node, src, s.tpw, m->node,
                  (unsigned long long)s.mem_used, m->node, (unsigned long long)s.mem_total);
    if (s.load >= 0)
        cm_buf_printf(o,
                      "# HELP cumulo_node_cpu_load Busy fraction of a node's CPUs.\n"
                      "# TYPE cumulo_node_cpu_load gauge\ncumulo_node_cpu_load{node=\"%s\"} %.4f\n",
                      m->node, s.load);
    pthread_mutex_unlock(&m->mu);
    remote_prometheus(m, srv, &s, o);
    cm_metrics_experts_prometheus(srv, o); /* routing per layer and expert (metrics_experts.c) */
}

static void json_num_or_null(cm_buf *o, const char *fmt, double v, bool known) {
    if (known) cm_buf_printf(o, fmt, v);
    else cm_buf_puts(o, "null");
}

/* One node of a cluster engine. Remote machines report memory, load, power
 * (labelled rapl or estimate), their rows/s and time per token in their
 * heartbeats (issue 19); a node that sent none lately (an older build) shows
 * null with source "unknown" and its memory as its HELLO said at connect.
 * Every stage of a pipeline carries every token, so tokens_per_second is the
 * cluster's; stage_tokens_per_second is what the node itself computed. */
static void cluster_node_json(cm_buf *o, metrics *m, const snap *s, const cm_engine_member *mb, int n_threads) {
    char id[160], role[48], slice[96];
    if (mb->local) snprintf(id, sizeof id, "%s", m->node);
    else snprintf(id, sizeof id, "%s", mb->addr);
    if (mb->stage == 0) snprintf(role, sizeof role, "coordinator (stage 0)");
    else snprintf(role, sizeof role, "stage %d", mb->stage);
    if (mb->n_members > 1)
        snprintf(slice, sizeof slice, "%d/%d: kv heads %d-%d, ffn %d-%d", mb->member + 1, mb->n_members,
                 mb->kv_head_begin, mb->kv_head_end, mb->ffn_begin, mb->ffn_end);
    else snprintf(slice, sizeof slice, "all");
    cm_buf_puts(o, "{\"id\":");
    cm_json_str(o, id, strlen(id));
    cm_buf_puts(o, ",\"name\":");
    cm_json_str(o, mb->name, strlen(mb->name));
    cm_buf_printf(o, ",\"host\":\"%s\",\"host_id\":", mb->local ? "local" : "remote");
    cm_json_str(o, mb->host, strlen(mb->host));
    cm_buf_puts(o, ",\"role\":");
    cm_json_str(o, role, strlen(role));
    cm_buf_printf(o, ",\"stage\":%d,\"layers\":[%d,%d],\"slice\":", mb->stage, mb->first_layer, mb->last_layer);
    cm_json_str(o, slice, strlen(slice));
    bool live = !mb->local && mb->live;
    uint64_t used = mb->local ? s->mem_used
                    : live    ? mb->live_mem_used
                              : mb->mem_total - (mb->mem_free < mb->mem_total ? mb->mem_free : mb->mem_total);
    uint64_t total = mb->local ? s->mem_total : mb->mem_total;
    cm_buf_printf(o,
                  ",\"weights_bytes\":%llu,\"kv_bytes\":%llu,\"memory_used\":%llu,\"memory_total\":%llu,"
                  "\"memory_source\":\"%s\",\"cpu_load\":",
                  (unsigned long long)mb->weight_bytes, (unsigned long long)mb->kv_bytes, (unsigned long long)used,
                  (unsigned long long)total,
                  mb->local ? "live"
                  : live    ? "live (heartbeat)"
                            : "at connect (HELLO)");
    if (mb->local) json_num_or_null(o, "%.4f", s->load, s->load >= 0);
    else json_num_or_null(o, "%.4f", mb->live_cpu_load, live && mb->live_cpu_load >= 0);
    cm_buf_printf(o, ",\"threads\":%d,\"cores\":%u,\"gflops\":%.2f,\"tokens_per_second\":%.3f,\"power_watts\":",
                  mb->local ? n_threads : 0, mb->cores, mb->gflops, s->tps);
    double w = mb->local ? s->watts : mb->live_power_w;
    json_num_or_null(o, "%.3f", w, mb->local || live);
    cm_buf_printf(o, ",\"power_source\":\"%s\",\"tokens_per_watt\":",
                  mb->local                                    ? (s->measured ? "measured" : "estimated")
                  : !live                                      ? "unknown"
                  : !strcmp(mb->live_power_source, "rapl")     ? "measured"
                  : !strcmp(mb->live_power_source, "estimate") ? "estimated"
                                                               : mb->live_power_source);
    json_num_or_null(o, "%.5f", cm_power_tokens_per_watt(s->tps, w), mb->local || live);
    cm_buf_puts(o, ",\"stage_tokens_per_second\":");
    json_num_or_null(o, "%.3f", mb->live_tok_s, live);
    cm_buf_puts(o, ",\"ms_per_token\":");
    json_num_or_null(o, "%.3f", mb->live_ms_per_tok, live);
    cm_buf_printf(o, ",\"telemetry_age_s\":");
    json_num_or_null(o, "%.2f", mb->live_age_s, live);
    cm_metrics_member_experts_json(o, mb); /* an expert group's member: its experts and replicas */
    cm_buf_puts(o, "}");
}

void cm_metrics_cluster_json(metrics *m, cm_http_server *srv, cm_buf *o) {
    snap s;
    take(m, srv, &s);
    cm_engine *e = cm_http_engine(srv);
    cm_engine_info in;
    memset(&in, 0, sizeof in);
    if (e) cm_engine_get_info(e, &in);
    cm_engine_member mbs[32];
    int n_mb = e ? cm_engine_members(e, mbs, (int)CM_ARRAY_LEN(mbs)) : 0;
    if (n_mb > (int)CM_ARRAY_LEN(mbs)) n_mb = (int)CM_ARRAY_LEN(mbs);
    cluster_power cp;
    sum_cluster_power(s.watts, s.measured, s.tps, mbs, n_mb, &cp);
    char scope[320];
    if (n_mb)
        snprintf(scope, sizeof scope, "every machine of the cluster, each host once (%d host%s: %s)", cp.n_hosts,
                 cp.n_hosts == 1 ? "" : "s", cp.label);
    else snprintf(scope, sizeof scope, "this machine");
    cm_buf_puts(o, "{\"model\":");
    cm_json_str(o, cm_http_model_id(srv), strlen(cm_http_model_id(srv)));
    cm_buf_printf(o, ",\"ready\":%s,\"arch\":", s.ready ? "true" : "false");
    cm_json_str(o, in.arch ? in.arch : "", in.arch ? strlen(in.arch) : 0);
    /* the KV cache's types and bytes per position of one sequence (issue 23) */
    cm_buf_puts(o, ",\"kv_type_k\":");
    cm_json_str(o, in.kv_type_k ? in.kv_type_k : "", in.kv_type_k ? strlen(in.kv_type_k) : 0);
    cm_buf_puts(o, ",\"kv_type_v\":");
    cm_json_str(o, in.kv_type_v ? in.kv_type_v : "", in.kv_type_v ? strlen(in.kv_type_v) : 0);
    cm_buf_printf(o, ",\"kv_bytes_per_token\":%llu,\"n_ctx\":%d", (unsigned long long)in.kv_bytes_per_token, in.n_ctx);
    cm_buf_printf(o,
                  ",\"n_layer\":%d,\"n_params\":%llu,\"n_stages\":%d,\"queue_depth\":%d,\"slots_active\":%d,"
                  "\"slots_total\":%d,\"tokens_per_second\":%.3f,\"power_watts\":%.3f,\"power_source\":\"%s\","
                  "\"tokens_per_watt\":%.5f,\"power_scope\":\"%s\",\"power_hosts\":%d,\"power_missing\":%d,\"nodes\":[",
                  in.n_layer, (unsigned long long)in.n_params, n_mb ? in.n_stages : 1, s.queued, s.active, s.slots,
                  s.tps, n_mb ? cp.watts : s.watts, !n_mb ? (s.measured ? "measured" : "estimated") : cp.label,
                  n_mb ? cp.tpw : s.tpw, scope, n_mb ? cp.n_hosts : 1, n_mb ? cp.n_missing : 0);
    if (n_mb) {
        for (int i = 0; i < n_mb; i++) {
            if (i) cm_buf_puts(o, ",");
            cluster_node_json(o, m, &s, &mbs[i], in.n_threads);
        }
        /* Links between consecutive stages (first members): the hop into
         * each stage, as measured when the pipe opened (this machine's own
         * links at connect, node to node links by the nodes themselves);
         * one the nodes could not measure says so, with null numbers. */
        cm_buf_puts(o, "],\"links\":[");
        uint64_t hop_bytes = 0, hop_frames = 0, hop_rows = 0;
        cm_engine_hop_stats(e, &hop_bytes, &hop_frames, &hop_rows);
        bool first = true;
        for (int i = 0; i < n_mb; i++) {
            if (mbs[i].member) continue;
            int j = i + 1;
            while (j < n_mb && mbs[j].member) j++;
            if (j >= n_mb) break;
            const cm_engine_member *a = &mbs[i], *b = &mbs[j];
            bool measured = b->link_measured;
            cm_buf_puts(o, first ? "{\"from\":" : ",{\"from\":");
            first = false;
            const char *fa = a->local ? m->node : a->addr, *tb = b->local ? m->node : b->addr;
            cm_json_str(o, fa, strlen(fa));
            cm_buf_puts(o, ",\"to\":");
            cm_json_str(o, tb, strlen(tb));
            cm_buf_printf(o, ",\"from_stage\":%d,\"to_stage\":%d,\"latency_ms\":", a->stage, b->stage);
            json_num_or_null(o, "%.3f", b->link_rtt_s * 1e3, measured);
            cm_buf_puts(o, ",\"bandwidth_mbps\":");
            json_num_or_null(o, "%.1f", b->link_bw * 8 / 1e6, measured);
            cm_buf_printf(o, ",\"source\":\"%s\",\"bytes\":",
                          !measured  ? "not measured (node to node)"
                          : a->local ? "measured at connect"
                                     : "measured node to node");
            /* traffic is counted on this machine's own hop only */
            json_num_or_null(o, "%.0f", (double)hop_bytes, a->local);
            cm_buf_puts(o, "}");
        }
        cm_buf_puts(o, "]");
        cm_metrics_experts_json(srv, o);
        cm_buf_puts(o, "}");
        return;
    }
    cm_buf_puts(o, "{\"id\":");
    cm_json_str(o, m->node, strlen(m->node));
    cm_buf_printf(
        o,
        ",\"host\":\"local\",\"role\":\"coordinator+worker\",\"stage\":0,\"layers\":[0,%d],\"slice\":\"all\","
        "\"weights_bytes\":%llu,\"memory_used\":%llu,\"memory_total\":%llu,\"memory_source\":\"live\",\"cpu_load\":",
        in.n_layer, (unsigned long long)in.weight_bytes, (unsigned long long)s.mem_used,
        (unsigned long long)s.mem_total);
    json_num_or_null(o, "%.4f", s.load, s.load >= 0);
    cm_buf_printf(o,
                  ",\"threads\":%d,\"tokens_per_second\":%.3f,\"power_watts\":%.3f,\"power_source\":\"%s\","
                  "\"tokens_per_watt\":%.5f}],\"links\":[]",
                  in.n_threads, s.tps, s.watts, s.measured ? "measured" : "estimated", s.tpw);
    cm_metrics_experts_json(srv, o);
    cm_buf_puts(o, "}");
}
