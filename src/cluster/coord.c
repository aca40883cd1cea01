/*
 * coord.c: the coordinator's side of a cluster. cm_pipe_open connects to the
 * nodes (as a coordinator), measures each link, has the nodes measure the
 * links between them (coord_links.c), asks the planner with the user's
 * options (this machine is node 0 and keeps the first stage) and applies the
 * answer like every later plan (coord_plan.c: ASSIGN, READY, links), serving
 * streamed weights meanwhile. A receiver thread per node delivers TOKENs,
 * READYs, ERRORs and weight requests and judges the node's silence.
 *
 * Split: coord_plan.c changes the plan (one transaction), coord_data.c is the
 * data path, coord_recover.c decides when to re-plan; the state they share is
 * in coord_impl.h. Every wait has a deadline.
 *
 * Failures (issue 7): every node's control connection carries a HEARTBEAT
 * each CM_PIPE_HB_MS and the node echoes it (nodes also send their own, so a
 * heartbeat we skip while the data path holds send_mu costs nothing); a node
 * we hear nothing from for
 * CM_PIPE_LOST_MS (kill -9 shows sooner, as a closed connection; SIGSTOP or a
 * cut link only by silence) is declared lost, and waiting sequences wake with
 * the error. cm_pipe_recover then re-plans on the survivors under a new
 * epoch (nodes drop traffic of any other epoch), and the engine recomputes
 * its sequences into the new stages.
 */
#include "cluster/coord_impl.h"
#include "sched/simulate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cm_coord_log(cm_pipe *p, const char *fmt, ...) {
    if (!p->log) return;
    char line[8192]; /* the plan with its links matrix is one entry */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->log(p->log_ctx, line);
}

void cm_coord_fatal(cm_pipe *p, int code, const char *fmt, ...) {
    pthread_mutex_lock(&p->mu);
    if (!p->fatal) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->fatal_text, sizeof p->fatal_text, fmt, ap);
        va_end(ap);
        p->fatal = code < 0 ? code : CM_EIO;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Declared lost (the rx thread ends): why first, for the line that leaves
 * it out of the cluster. */
static void mark_lost(remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mark_lost(remote *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->lost_why, sizeof r->lost_why, fmt, ap);
    va_end(ap);
    atomic_store(&r->lost, true);
}

static void *rx_main(void *arg) {
    remote *r = arg;
    cm_pipe *p = r->p;
    char err[512];
    atomic_store(&r->last_rx_ns, cm_now_ns());
    r->last_hb_ns = 0;
    while (!atomic_load(&p->closing)) {
        cm_msg m;
        uint64_t now = cm_now_ns();
        if (atomic_load(&r->released)) break; /* the plan no longer uses it (coord_recover.c): not a failure */
        if (now - r->last_hb_ns >= (uint64_t)CM_PIPE_HB_MS * 1000000ull) {
            cm_msg hb = {.type = CM_MSG_HEARTBEAT};
            hb.u.heartbeat =
                (cm_msg_heartbeat){.epoch = atomic_load(&p->epoch), .wall_ms = cm_wall_ms(), .mono_ns = now};
            int rc = 0;
            /* The data path holds send_mu through a send, which a frozen
             * stage stalls for up to the loss bound: never wait for it here,
             * or the silence check below would stop too. A heartbeat skipped
             * costs nothing: nodes send their own every CM_PIPE_HB_MS. */
            if (pthread_mutex_trylock(&p->send_mu) == 0) { /* loading is set under it, before the ASSIGN leaves */
                if (!atomic_load(&r->loading)) rc = cm_conn_send(r->ctl, &hb, p->lost_ms, err, sizeof err);
                pthread_mutex_unlock(&p->send_mu);
                r->last_hb_ns = now;
            }
            if (rc) {
                mark_lost(r, "heartbeat: %.180s", err);
                CM_LOGW("node %s ('%s') lost: heartbeat: %s", r->addr, r->hello.name, err);
                if (!atomic_load(&p->closing))
                    cm_coord_fatal(p, CM_ECLOSED, "node %s ('%s') lost: %s", r->addr, r->hello.name, err);
                break;
            }
        }
        /* Silence: loading a stage (no READY yet) may take long, but the
         * node's own heartbeat thread speaks all along (node.c, from the
         * ASSIGN), and frames queued while this thread served its weights
         * are read first (below): a looser bound, so that a node stopped
         * while the cluster opens is left out in seconds, not minutes
         * (coord_recover.c); otherwise the node echoes every heartbeat. */
        uint64_t bound_ms = atomic_load(&r->loading) ? cm_coord_load_silent_ms(p) : (uint64_t)p->lost_ms;
        /* Frames already waiting in the socket are not silence: this thread
         * may itself have been held up (a loaded machine, a long lock) while
         * the node kept talking; read them first. */
        if (now - atomic_load(&r->last_rx_ns) > bound_ms * 1000000ull && now >= atomic_load(&r->quiet_until_ns) &&
            cm_fd_wait_readable(cm_conn_fd(r->ctl), 0) <= 0) {
            mark_lost(r, "silent for %llu ms", (unsigned long long)bound_ms);
            CM_LOGW("node %s ('%s') lost: silent for %llu ms", r->addr, r->hello.name, (unsigned long long)bound_ms);
            if (!atomic_load(&p->closing))
                cm_coord_fatal(p, CM_ETIMEDOUT, "node %s ('%s') lost: silent for %llu ms", r->addr, r->hello.name,
                               (unsigned long long)bound_ms);
            break;
        }
        if (cm_fd_wait_readable(cm_conn_fd(r->ctl), 100) <= 0) continue;
        int rc = cm_conn_recv(r->ctl, &m, p->lost_ms, err, sizeof err);
        if (rc == CM_ETIMEDOUT) continue;
        if (rc || m.type == CM_MSG_BYE) {
            mark_lost(r, "left: %.180s", rc ? err : m.u.bye.text);
            if (!atomic_load(&p->closing))
                CM_LOGW("node %s ('%s') left: %s", r->addr, r->hello.name, rc ? err : m.u.bye.text);
            if (!atomic_load(&p->closing))
                cm_coord_fatal(p, rc ? rc : CM_ECLOSED, "node %s ('%s') left: %s", r->addr, r->hello.name,
                               rc ? err : m.u.bye.text);
            break;
        }
        atomic_store(&r->last_rx_ns, cm_now_ns());
        switch (m.type) {
        case CM_MSG_TOKEN: {
            const cm_msg_token *t = &m.u.token;
            if (t->epoch != atomic_load(&p->epoch) || t->seq >= p->n_seq) break;
            pthread_mutex_lock(&p->mu);
            slot *s = &p->slots[t->seq];
            s->token = t->token;
            s->logprob = t->logprob;
            s->n_top = t->n_top;
            for (int j = 0; j < t->n_top; j++) {
                s->top_id[j] = t->top_token[j];
                s->top_lp[j] = t->top_logprob[j];
            }
            s->got++;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            break;
        }
        case CM_MSG_OUTPUT: cm_coord_on_output(p, &m.u.output); break; /* pipe_output.c */
        case CM_MSG_TRAIN: cm_coord_on_train(p, r, &m.u.train); break; /* coord_train.c */
        case CM_MSG_READY:
            if (m.u.ready.epoch != atomic_load(&p->epoch)) break;
            pthread_mutex_lock(&p->mu);
            r->ready = true;
            r->ready_epoch = m.u.ready.epoch;
            atomic_store(&r->loading, false);
            r->ready_status = m.u.ready.status;
            memcpy(r->ready_text, m.u.ready.text, sizeof r->ready_text);
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            break;
        case CM_MSG_ERROR:
            /* A node answers its control connection in order, so an ERROR
             * before its READY of the current epoch is about an earlier
             * plan's traffic: typically a FORWARD whose expert exchange or
             * all-reduce failed when cm_coord_apply_plan closed the old
             * mesh. Counted, it would fail the re-plan waiting for that
             * READY (and spend one of recovery's attempts). */
            if (r->ready_epoch != atomic_load(&p->epoch)) {
                CM_LOGW("node %s ('%s'), an earlier plan's failure (ignored): %s", r->addr, r->hello.name,
                        m.u.error.text);
                break;
            }
            cm_coord_fatal(p, m.u.error.code, "node %s ('%s'): %s", r->addr, r->hello.name, m.u.error.text);
            break;
        case CM_MSG_WEIGHTS_REQ:
            if (!cm_coord_lora_serve(p, r, &m.u.weights_req, &rc, err, sizeof err)) /* a stage's LoRA parts */
                rc = cm_weights_serve(r->ctl, &p->send_mu, p->g, p->sha, &m.u.weights_req, err, sizeof err);
            if (rc) CM_LOGW("weights for %s: %s", r->addr, err);
            break;
        case CM_MSG_LINKS: /* awaited by cm_coord_recheck_links, or one that came after its deadline */
            pthread_mutex_lock(&p->mu);
            if (r->links_want && m.u.links.id == r->links_want && !r->links_got) {
                r->links_ans = m.u.links;
                r->links_got = true;
                pthread_cond_broadcast(&p->cv);
            }
            pthread_mutex_unlock(&p->mu);
            break;
        case CM_MSG_HEARTBEAT:
            if (m.u.heartbeat.has_stats) { /* live telemetry for /metrics and the dashboard */
                pthread_mutex_lock(&p->info_mu);
                r->stats = m.u.heartbeat;
                r->stats_ns = cm_now_ns();
                pthread_mutex_unlock(&p->info_mu);
            }
            break;
        case CM_MSG_EXPERT_LOAD: cm_coord_on_expert_load(p, r, &m.u.expert_load); break; /* coord_ep.c */
        case CM_MSG_PONG: break;
        default: CM_LOGW("unexpected %s from %s", cm_msg_type_name(m.type), r->addr); break;
        }
    }
    return NULL;
}

/* Split "a,b,c" (or "auto") into node addresses. */
static int parse_nodes(const cm_pipe_opts *o, char addrs[][80], int max, char *err, size_t errlen) {
    if (!o->nodes || !*o->nodes) return cm_errf(err, errlen, CM_EINVAL, "no nodes given");
    if (!strcmp(o->nodes, "auto")) {
        int n = cm_discover(o->auto_wait_s > 0 ? o->auto_wait_s : 3, addrs, max, err, errlen);
        if (n == 0) return cm_errf(err, errlen, CM_ENOENT, "no cumulo nodes found by mDNS (is `cumulo node` running?)");
        return n;
    }
    int n = 0;
    const char *s = o->nodes;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l) {
            if (n == max) return cm_errf(err, errlen, CM_ERANGE, "more than %d nodes", max);
            if (l >= 80) return cm_errf(err, errlen, CM_EINVAL, "node address '%.*s' is too long", (int)l, s);
            memcpy(addrs[n], s, l);
            addrs[n][l] = 0;
            n++;
        }
        s += l + (e ? 1 : 0);
    }
    if (!n) return cm_errf(err, errlen, CM_EINVAL, "no nodes given");
    return n;
}

/* The link from plan node i to plan node j (0 = this machine, k = r[k-1]).
 * This machine measured its own link to each node (one direction; taken for
 * both). Between nodes: what i measured toward j (LINKS), else what j
 * measured toward i; a pair that could not reach each other gets a link no
 * plan wants to use; an unmeasured pair (a node that did not answer) is
 * estimated as the slower of the two links to here, which bounds it on a
 * switch or bridge. Returns whether it was measured. */
static bool node_link(const cm_pipe *p, int i, int j, double *rtt, double *bw) {
    if (i == j) {
        *rtt = 0;
        *bw = 1e12;
        return true;
    }
    if (i == 0 || j == 0) {
        const remote *r = &p->r[(i ? i : j) - 1];
        *rtt = r->rtt;
        *bw = r->bw;
        return true;
    }
    int st = cm_coord_link(p, i - 1, j - 1, rtt, bw);
    if (st > 0) return true;
    int st2 = cm_coord_link(p, j - 1, i - 1, rtt, bw);
    if (st2 > 0) return true;
    if (st < 0 || st2 < 0) { /* unreachable: 10 s round trips, 1 kB/s */
        *rtt = 10;
        *bw = 1e3;
        return false;
    }
    const remote *a = &p->r[i - 1], *b = &p->r[j - 1];
    *rtt = a->rtt > b->rtt ? a->rtt : b->rtt;
    *bw = a->bw < b->bw ? a->bw : b->bw;
    return false;
}

/* Build the planner's view: node 0 is this machine, then the remotes. A
 * pair that could not reach each other is down for the planner: never
 * neighbours, whatever the order costs (coord_links.c re-measures it). */
static void make_cluster(cm_pipe *p, cm_plan_cluster *c) {
    memset(c, 0, sizeof *c);
    cm_node_caps me;
    cm_node_caps_get(&me);
    c->n_nodes = 1 + p->n_remote;
    snprintf(c->nodes[0].name, sizeof c->nodes[0].name, "%.50s (here)", p->hello.name);
    c->nodes[0].mem_bytes = me.mem_free;
    c->nodes[0].mem_bw = me.mem_bw > 0 ? me.mem_bw : 1e9;
    c->nodes[0].flops = (me.gflops > 0 ? me.gflops : 1) * 1e9;
    snprintf(c->nodes[0].host, sizeof c->nodes[0].host, "%s", p->hello.host); /* shared hosts split their cores */
    for (int i = 0; i < p->n_remote; i++) {
        const remote *r = &p->r[i];
        cm_plan_node *nd = &c->nodes[i + 1];
        snprintf(nd->name, sizeof nd->name, "%.40s %.20s", r->hello.name, r->addr);
        nd->mem_bytes = r->hello.mem_free;
        nd->mem_bw = r->hello.mem_gbs > 0 ? (double)r->hello.mem_gbs * 1e9 : 1e9;
        nd->flops = (r->hello.gflops > 0 ? r->hello.gflops : 1) * 1e9;
        snprintf(nd->host, sizeof nd->host, "%s", r->hello.host);
        if (r->hello.has_gpu) { /* issue 16: its stage's first layers run on its GPU (plan.h) */
            nd->gpu_mem_bytes = r->hello.gpu_mem;
            nd->gpu_mem_bw = (double)r->hello.gpu_gbs * 1e9;
            nd->gpu_flops = (double)r->hello.gpu_gflops * 1e9;
            nd->gpu_layers = (int)r->hello.gpu_layers;
        }
    }
    for (int i = 0; i < c->n_nodes; i++)
        for (int j = 0; j < c->n_nodes; j++)
            if (!node_link(p, i, j, &c->rtt_s[i][j], &c->bw[i][j]) && i && j) {
                double rtt, bw;
                c->down[i][j] =
                    cm_coord_link(p, i - 1, j - 1, &rtt, &bw) < 0 || cm_coord_link(p, j - 1, i - 1, &rtt, &bw) < 0;
            }
}

/* "2,1,2" for a plan's why. */
static void counts_text(const int *v, int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", v[i]);
}

/* --tp-weights: the named machines' speeds ARE these relative speeds (their
 * measured mean, shared out in proportion), not the measurements scaled by
 * them: measured speeds on a busy or shared host swing from run to run, and
 * `--tp-weights 1,1` must give the same even slices every time (the
 * slices' partial sums round differently, so uneven ones change the last
 * bits, and a benchmark compares nothing when its split moves). */
static void set_relative_speeds(cm_plan_cluster *pc, const double *w, int n_w) {
    int n = n_w < pc->n_nodes ? n_w : pc->n_nodes;
    double flops = 0, bw = 0, ws = 0;
    for (int i = 0; i < n; i++) {
        flops += pc->nodes[i].flops;
        bw += pc->nodes[i].mem_bw;
        ws += w[i];
    }
    if (n < 1 || !(ws > 0)) return;
    for (int i = 0; i < n; i++) {
        pc->nodes[i].flops = flops * w[i] / ws;
        pc->nodes[i].mem_bw = bw * w[i] / ws;
    }
}

/* A request from an API caller is checked like bytes from outside (the CLI
 * checked its own already). */
static int check_request(const cm_plan_request *q, const cm_plan_model *pm, char *err, size_t errlen) {
    int sum = 0;
    if (q->n_split < 0 || q->n_split > CM_PLAN_MAX_NODES || q->n_groups < 0 || q->n_groups > CM_PLAN_MAX_NODES ||
        q->n_weights < 0 || q->n_weights > CM_PLAN_MAX_NODES ||
        (q->mode_set && (q->mode < 0 || q->mode >= CM_PARALLEL_COUNT)))
        return cm_errf(err, errlen, CM_EINVAL, "plan request out of range");
    if (q->n_groups && q->n_split && q->n_split != q->n_groups)
        return cm_errf(err, errlen, CM_EINVAL, "a layer split of %d stages for %d groups", q->n_split, q->n_groups);
    if (q->mode_set && q->mode == CM_PARALLEL_TP && q->n_split)
        return cm_errf(err, errlen, CM_EINVAL, "a layer split makes a pipeline, not one tensor-parallel group");
    for (int i = 0; i < q->n_split; i++) {
        if (q->split[i] < 1)
            return cm_errf(err, errlen, CM_EINVAL, "a layer split with a stage of %d layers", q->split[i]);
        sum += q->split[i];
    }
    for (int i = 0; i < q->n_groups; i++)
        if (q->groups[i] < 1) return cm_errf(err, errlen, CM_EINVAL, "a group of %d members", q->groups[i]);
    for (int i = 0; i < q->n_weights; i++)
        if (!(q->weights[i] > 0) || q->weights[i] > 1e6)
            return cm_errf(err, errlen, CM_EINVAL, "a relative speed of %g", q->weights[i]);
    if (q->n_split && sum != pm->n_layers)
        return cm_errf(err, errlen, CM_EINVAL, "the layer split adds up to %d, the model has %d layers", sum,
                       pm->n_layers);
    return 0;
}

/* Stage s of plan takes the layer count split[s] (checked), in order. */
static void apply_split(const cm_plan_request *q, cm_plan *plan) {
    for (int s = 0, at = 0; s < plan->n_stages; s++) {
        plan->stages[s].first_layer = at;
        at += q->split[s];
        plan->stages[s].last_layer = at;
    }
}

/* The opening question: the planner's plan for the user's request (the
 * mode, a layer split, groups, relative speeds) over every connected node. */
static int make_plan(cm_pipe *p, const cm_pipe_opts *o, cm_plan *plan, cm_plan_model *pm, cm_plan_cluster *pc,
                     char *err, size_t errlen) {
    const cm_plan_request *q = &o->plan;
    int rc = cm_plan_model_from_gguf(p->g, pm, err, errlen);
    if (!rc) rc = check_request(q, pm, err, errlen);
    if (!rc && q->expert_load) rc = cm_coord_expert_load(p, q->expert_load, q->n_expert_load, err, errlen);
    cm_coord_ep_init(p, q); /* given counts, or measured ones (coord_ep.c) */
    if (rc) return rc;
    make_cluster(p, pc);
    cm_plan_opts po;
    cm_plan_opts_default(&po);
    po.ctx = p->n_ctx;
    po.n_seq = p->n_seq;
    po.kv_k32_bytes = (int)cm_row_size((enum cm_type)o->kv_type_k, 32); /* the planner counts the KV types */
    po.kv_v32_bytes = (int)cm_row_size((enum cm_type)o->kv_type_v, 32);
    po.mode = q->mode_set ? q->mode : q->n_groups ? CM_PARALLEL_HYBRID : CM_PARALLEL_PP;
    po.reorder = true;               /* the pipeline's order follows the measured links */
    po.expert_load = p->expert_load; /* hot experts: replicas in expert groups (NULL: none) */
    if (po.mode != CM_PARALLEL_PP)   /* relative speeds (tests, benchmarks, known-unequal machines) */
        set_relative_speeds(pc, q->weights, q->n_weights);
    char split[200];
    counts_text(q->split, q->n_split, split, sizeof split);
    int group_of[CM_PLAN_MAX_NODES];
    if (q->n_groups) { /* members per stage, in the cluster's order */
        int at = 0;
        for (int i = 0; i < q->n_groups; i++)
            for (int j = 0; j < q->groups[i]; j++, at++) {
                if (at == pc->n_nodes) {
                    int want = 0;
                    for (int k = 0; k < q->n_groups; k++) want += q->groups[k];
                    return cm_errf(err, errlen, CM_EINVAL, "the groups name %d members for %d machines", want,
                                   pc->n_nodes);
                }
                group_of[at] = i;
            }
        for (; at < pc->n_nodes; at++) group_of[at] = -1; /* machines left out of the plan */
        rc = cm_plan_for_groups(pm, pc, &po, group_of, plan, err, errlen);
        if (rc) return rc;
        if (q->n_split) {
            apply_split(q, plan);
            cm_plan_predict(pm, pc, &po, plan);
        }
        char g[200];
        counts_text(q->groups, q->n_groups, g, sizeof g);
        snprintf(plan->why, sizeof plan->why, "groups of %s members set by --groups%s%s", g,
                 q->n_split ? ", layers by --layers " : "", q->n_split ? split : "");
        return 0;
    }
    if (!q->n_split) return cm_plan_make(pm, pc, &po, plan, err, errlen);
    if (q->n_split > pc->n_nodes)
        return cm_errf(err, errlen, CM_EINVAL, "a split of %d stages for %d machines", q->n_split, pc->n_nodes);
    for (int i = 0; i < pc->n_nodes; i++) group_of[i] = i < q->n_split ? i : -1;
    rc = cm_plan_for_groups(pm, pc, &po, group_of, plan, err, errlen);
    if (rc) return rc;
    apply_split(q, plan);
    cm_plan_predict(pm, pc, &po, plan);
    snprintf(plan->why, sizeof plan->why, "layers split by --layers %s", split);
    return 0;
}

void cm_coord_start_rx(cm_pipe *p) {
    for (int i = 0; i < p->n_remote; i++)
        if (!p->r[i].rx_started && p->r[i].ctl && !pthread_create(&p->r[i].rx, NULL, rx_main, &p->r[i]))
            p->r[i].rx_started = true; /* (no ctl: lost and closed by a re-plan) */
}

int cm_pipe_open(cm_pipe **out, const char *model_path, const cm_gguf *g, const cm_model *m, const cm_pipe_opts *o,
                 int *local_last, char *err, size_t errlen) {
    *out = NULL;
    *local_last = m->hp.n_layer;
    cm_pipe *p = cm_calloc(1, sizeof *p);
    if (!p) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    p->g = g;
    p->m = m;
    snprintf(p->model_path, sizeof p->model_path, "%.511s", model_path);
    pthread_mutex_init(&p->send_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->info_mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->n_seq = o->n_seq_max > 0 ? o->n_seq_max : 8;
    p->n_ctx = o->n_ctx > 0 ? o->n_ctx : 2048;
    p->max_batch = o->max_batch > 0 ? CM_MIN(o->max_batch, CM_BATCH_MAX) : 64;
    p->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : CM_PIPE_DATA_MS;
    /* The coordinator's environment, read here once (tests tighten the bounds). */
    p->lost_ms = cm_cluster_lost_ms(); /* CUMULO_LOST_MS is read there, for every process */
    const cm_config *cfg = cm_config_get();
    if (cfg->token_timeout_ms) p->timeout_ms = cfg->token_timeout_ms;   /* the token deadline of cm_pipe_recv_token */
    p->rejoin_ms = cfg->rejoin_ms ? cfg->rejoin_ms : CM_PIPE_REJOIN_MS; /* how often cm_pipe_maintain acts */
    p->no_recover = cfg->test_no_recover;                               /* cluster_failover.sh shows it fails without */
    p->log = o->log;
    p->log_ctx = o->log_ctx;
    p->epoch = cm_wall_ms();
    p->slots = cm_calloc((size_t)p->n_seq, sizeof *p->slots);
    int rc = p->slots ? 0 : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    char addrs[CM_PLAN_MAX_NODES - 1][80];
    int n = 0;
    if (!rc) rc = cm_cluster_net_cfg(&p->cfg, o->insecure, o->key_file, err, errlen);
    if (!rc) rc = n = parse_nodes(o, addrs, CM_PLAN_MAX_NODES - 1, err, errlen);
    if (rc < 0) goto fail;
    rc = cm_file_sha256(model_path, p->sha, err, errlen);
    if (rc) goto fail;
    cm_cluster_hello(&p->hello, NULL, 0, CM_ROLE_COORDINATOR);
    /* With --nodes auto, anyone on the LAN can announce itself: a node that
     * fails the handshake (another cluster key, --insecure, another
     * protocol version, nothing listening) is left out with a warning, so a
     * rogue announcement cannot stop the cluster. Nodes named by the user
     * must all work. Handshakes run all at once (addresses that never
     * answer cost one deadline in all), link measurements one at a time. */
    bool from_mdns = !strcmp(o->nodes, "auto");
    p->from_mdns = from_mdns;
    int n_refused = 0, n_busy = 0;
    char first_refusal[300] = "", first_busy[400] = "";
    cm_conn *dialled[CM_PLAN_MAX_NODES - 1];
    cm_msg_hello peers[CM_PLAN_MAX_NODES - 1];
    int dial_rc[CM_PLAN_MAX_NODES - 1];
    char dial_err[CM_PLAN_MAX_NODES - 1][400];
    cm_cluster_dial_many((const char(*)[80])addrs, n, &p->cfg, &p->hello, dialled, peers, dial_rc, dial_err);
    for (int i = 0; i < n; i++) {
        remote *r = &p->r[p->n_remote];
        char e[400];
        memset(r, 0, sizeof *r);
        snprintf(r->addr, sizeof r->addr, "%.79s", addrs[i]);
        r->p = p;
        p->n_remote++;
        rc = dial_rc[i];
        r->ctl = dialled[i];
        r->hello = peers[i];
        memcpy(e, dial_err[i], sizeof e);
        if (!rc && cm_lease_foreign(&r->hello, &p->hello) && !o->take) {
            /* A coordinator that just closed (a `run` right after another)
             * is released within moments: ask again for up to a second. */
            for (int k = 0; k < 4 && !rc && cm_lease_foreign(&r->hello, &p->hello); k++) {
                cm_conn_close(r->ctl, NULL);
                r->ctl = NULL;
                cm_sleep_ms(250);
                rc = cm_cluster_dial(r->addr, &p->cfg, &p->hello, &r->ctl, &r->hello, e, sizeof e);
            }
        }
        if (!rc && cm_lease_foreign(&r->hello, &p->hello)) { /* it serves another coordinator (issue 19) */
            char why[400];
            cm_lease_text(&r->hello, why, sizeof why);
            if (o->take) {
                cm_coord_log(p, "node %s: taking it over (--take): %s", r->addr, why);
            } else {
                CM_LOGW("node %s not used: %s", r->addr, why);
                cm_coord_log(p, "node %s not used: %s", r->addr, why);
                if (!n_busy++) snprintf(first_busy, sizeof first_busy, "%.380s", why);
                cm_conn_close(r->ctl, "serves another coordinator");
                memset(r, 0, sizeof *r);
                p->n_remote--;
                continue;
            }
        }
        if (!rc) rc = cm_cluster_measure(r->ctl, CM_LINKS_PROBE_BYTES, &r->rtt, &r->bw, e, sizeof e);
        if (rc && from_mdns) {
            CM_LOGW("node %s (found by mDNS) not used: %s", r->addr, e);
            cm_coord_log(p, "node %s (found by mDNS) not used: %s", r->addr, e);
            if (!n_refused++) snprintf(first_refusal, sizeof first_refusal, "node %.79s: %.200s", r->addr, e);
            cm_conn_close(r->ctl, NULL);
            memset(r, 0, sizeof *r);
            p->n_remote--;
            rc = 0;
            continue;
        }
        if (rc) {
            cm_errf(err, errlen, rc, "node %s: %s", r->addr, e);
            for (int k = i + 1; k < n; k++) cm_conn_close(dialled[k], NULL);
            goto fail;
        }
        cm_coord_log(
            p, "node %s ('%s'): %u cores %s, %.1f GFLOP/s, %.1f GB/s, %.2f GiB free; rtt %.3f ms, %.1f MB/s%s%s%s",
            r->addr, r->hello.name, r->hello.cores, r->hello.isa, r->hello.gflops, r->hello.mem_gbs,
            (double)r->hello.mem_free / (1 << 30), r->rtt * 1e3, r->bw / 1e6, r->hello.has_gpu ? "; GPU '" : "",
            r->hello.gpu_name, r->hello.has_gpu ? "'" : "");
    }
    if (!p->n_remote && n_busy) {
        rc = cm_errf(err, errlen, CM_EBUSY, "no node is free: %s", first_busy);
        goto fail;
    }
    if (!p->n_remote) {
        rc = cm_errf(err, errlen, CM_EAUTH, "none of the %d node(s) found by mDNS could be used; %s", n, first_refusal);
        goto fail;
    }
    cm_coord_measure_links(p);
    /* The cluster's node order: the nodes behind slower links last, where
     * only the last stage's hop (token ids back) leaves them. Stable, so
     * equal links keep the order given. A pipeline plan then tries every
     * order against the measured matrix (po.reorder); groups of other
     * modes follow this one. */
    for (int i = 1; i < p->n_remote; i++)
        for (int j = i; j > 0 && p->r[j].bw > 2 * p->r[j - 1].bw; j--) {
            remote t = p->r[j];
            p->r[j] = p->r[j - 1];
            p->r[j - 1] = t;
        }
    for (int i = 0; i < p->n_remote; i++) p->r[i].p = p;
    cm_plan plan;
    static cm_plan_model pm; /* large (per-layer tables); only used here, under the caller's load */
    static pthread_mutex_t pm_mu = PTHREAD_MUTEX_INITIALIZER;
    cm_plan_cluster *pc = cm_calloc(1, sizeof *pc);
    if (!pc) {
        rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        goto fail;
    }
    pthread_mutex_lock(&pm_mu);
    rc = make_plan(p, o, &plan, &pm, pc, err, errlen);
    if (!rc) {
        cm_plan_format(&plan, &pm, pc, p->plan_text, sizeof p->plan_text);
        size_t used = strlen(p->plan_text);
        cm_coord_links_text(p, p->plan_text + used, sizeof p->plan_text - used);
    }
    pthread_mutex_unlock(&pm_mu);
    cm_free(pc);
    if (rc) goto fail;
    p->ask = plan.mode;
    p->samples_here = plan.n_stages == 1;
    p->tp_compress = o->tp_compress;
    p->take = o->take;
    p->kv_type_k = o->kv_type_k;
    p->kv_type_v = o->kv_type_v;
    p->kv_rows = o->kv_rows;
    p->lora = o->lora;
    cm_coord_log(p, "%s", p->plan_text);
    if (plan.n_stages == 1 && plan.stages[0].n_members == 1) { /* everything fits best here: no cluster needed */
        cm_pipe_close(p);
        return 0;
    }
    rc = cm_coord_apply_plan(p, &plan, "open", err, errlen);
    p->take = false; /* later plans never take a node from another coordinator */
    if (rc) rc = cm_coord_open_recover(p, &plan, rc, err, errlen); /* a node lost meanwhile: on without it */
    if (rc) goto fail;
    *local_last = cm_coord_local_last(p);
    *out = p;
    return 0;
fail:
    cm_pipe_close(p);
    return rc < 0 ? rc : CM_EIO;
}

void cm_pipe_close(cm_pipe *p) {
    if (!p) return;
    cm_coord_join_stop(p);
    atomic_store(&p->closing, 1);
    for (int i = 0; i < p->n_remote; i++)
        if (p->r[i].rx_started) pthread_join(p->r[i].rx, NULL);
    if (p->data) cm_conn_close(p->data, "coordinator done");
    if (p->tr_turns && cm_config_get()->tp_trace) /* the serial part of a decode step (bench/tp_ratio.sh) */
        fprintf(stderr,
                "tp trace: rank 0: %.1f us from the head's gather to the next one-row FORWARD sent (sampling, the "
                "engine's turn), %llu tokens\n",
                (double)p->tr_turn_ns * 1e-3 / (double)p->tr_turns, (unsigned long long)p->tr_turns);
    cm_coll_free(p->coll);
    cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
    for (int i = 0; i < p->n_remote; i++)
        if (p->r[i].ctl) cm_conn_close(p->r[i].ctl, "coordinator done");
    pthread_mutex_destroy(&p->send_mu);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    cm_free(p->slots);
    cm_free(p->expert_load);
    cm_free(p->ep_holders);
    cm_free(p->ep_now);
    cm_free(p->ep_seen);
    cm_free(p->ep_local);
    cm_free(p->ep_remote);
    cm_free(p->expert_load_layers);
    cm_ep_pack_free(&p->ep_pack);
    cm_coord_lora_free(p);
    pthread_mutex_destroy(&p->info_mu);
    cm_free(p);
}

const char *cm_pipe_plan_text(const cm_pipe *p) { return p->plan_text; }
int cm_pipe_n_stages(const cm_pipe *p) { return p->plan.n_stages; }
int cm_pipe_groups(const cm_pipe *p) { return p->pipe_groups > 0 ? p->pipe_groups : p->plan.n_stages; }
void cm_coord_make_cluster(cm_pipe *p, cm_plan_cluster *c) { make_cluster(p, c); }
bool cm_coord_node_link(const cm_pipe *p, int i, int j, double *rtt, double *bw) { return node_link(p, i, j, rtt, bw); }
