/*
 * coord.c: the coordinator's side of a pipeline-parallel cluster. cm_pipe_open
 * connects to the nodes (as a coordinator), measures each link, has the nodes
 * measure the links between them (coord_links.c), plans with
 * cm_plan_make (this machine is node 0 and keeps the first stage), sends every
 * node its ASSIGN and waits for READY, serving streamed weights meanwhile.
 * Afterwards the engine sends each micro-batch's hidden states to stage 1 on
 * one data connection (stages pass them on directly) and waits on a sequence
 * slot for the token the last stage sampled; a receiver thread per node
 * delivers TOKENs, ERRORs and weight requests.
 *
 * Ordering: everything about one sequence (SEQ_START, FORWARD, SEQ_FREE)
 * travels down the same chain of connections, so every stage sees it in the
 * order it was sent. No vocabulary-sized data crosses any link. Every wait has
 * a deadline.
 *
 * Split: coord_tp.c opens a tensor-parallel group, coord_recover.c re-plans
 * after a loss; the state they share is in coord_impl.h.
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
            hb.u.heartbeat = (cm_msg_heartbeat){.epoch = atomic_load(&p->epoch), .wall_ms = cm_wall_ms(), .mono_ns = now};
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
                atomic_store(&r->lost, true);
                CM_LOGW("node %s ('%s') lost: heartbeat: %s", r->addr, r->hello.name, err);
                if (!atomic_load(&p->closing))
                    cm_coord_fatal(p, CM_ECLOSED, "node %s ('%s') lost: %s", r->addr, r->hello.name, err);
                break;
            }
        }
        /* Silence: loading a stage (no READY yet) may take long; otherwise
         * the node echoes every heartbeat. */
        uint64_t bound_ms = atomic_load(&r->loading) ? 600000 : (uint64_t)p->lost_ms;
        /* Frames already waiting in the socket are not silence: this thread
         * may itself have been held up (a loaded machine, a long lock) while
         * the node kept talking; read them first. */
        if (now - atomic_load(&r->last_rx_ns) > bound_ms * 1000000ull && now >= atomic_load(&r->quiet_until_ns) &&
            cm_fd_wait_readable(cm_conn_fd(r->ctl), 0) <= 0) {
            atomic_store(&r->lost, true);
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
            atomic_store(&r->lost, true);
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
        case CM_MSG_READY:
            if (m.u.ready.epoch != atomic_load(&p->epoch)) break;
            pthread_mutex_lock(&p->mu);
            r->ready = true;
            atomic_store(&r->loading, false);
            r->ready_status = m.u.ready.status;
            memcpy(r->ready_text, m.u.ready.text, sizeof r->ready_text);
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            break;
        case CM_MSG_ERROR:
            cm_coord_fatal(p, m.u.error.code, "node %s ('%s'): %s", r->addr, r->hello.name, m.u.error.text);
            break;
        case CM_MSG_WEIGHTS_REQ:
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
    if (i == j) { *rtt = 0; *bw = 1e12; return true; }
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
    for (int i = 0; i < p->n_remote; i++) {
        const remote *r = &p->r[i];
        cm_plan_node *nd = &c->nodes[i + 1];
        snprintf(nd->name, sizeof nd->name, "%.40s %.20s", r->hello.name, r->addr);
        nd->mem_bytes = r->hello.mem_free;
        nd->mem_bw = r->hello.mem_gbs > 0 ? (double)r->hello.mem_gbs * 1e9 : 1e9;
        nd->flops = (r->hello.gflops > 0 ? r->hello.gflops : 1) * 1e9;
    }
    for (int i = 0; i < c->n_nodes; i++)
        for (int j = 0; j < c->n_nodes; j++)
            if (!node_link(p, i, j, &c->rtt_s[i][j], &c->bw[i][j]) && i && j) {
                double rtt, bw;
                c->down[i][j] = cm_coord_link(p, i - 1, j - 1, &rtt, &bw) < 0 || cm_coord_link(p, j - 1, i - 1, &rtt, &bw) < 0;
            }
}

static int make_plan(cm_pipe *p, const cm_pipe_opts *o, cm_plan *plan, cm_plan_model *pm, cm_plan_cluster *pc,
                     char *err, size_t errlen) {
    int rc = cm_plan_model_from_gguf(p->g, pm, err, errlen);
    if (rc) return rc;
    make_cluster(p, pc);
    cm_plan_opts po;
    cm_plan_opts_default(&po);
    po.ctx = p->n_ctx;
    po.n_seq = p->n_seq;
    po.mode = CM_PARALLEL_PP;
    po.reorder = true; /* the pipeline's order follows the measured links */
    if (o->parallel && *o->parallel) {
        int mode = cm_parallel_from_name(o->parallel);
        if (mode < 0)
            return cm_errf(err, errlen, CM_EINVAL, "--parallel '%s': expected pp, tp, hybrid or auto", o->parallel);
        po.mode = (enum cm_parallel)mode;
    }
    if (o->groups && *o->groups && !(o->parallel && *o->parallel)) po.mode = CM_PARALLEL_HYBRID;
    if (po.mode != CM_PARALLEL_PP && o->tp_weights && *o->tp_weights) {
        /* Relative speeds (tests, or known-unequal machines): scale each
         * member's measured compute and memory bandwidth. */
        int i = 0;
        for (const char *s = o->tp_weights; *s && i < pc->n_nodes; i++) {
            char *e;
            double w = strtod(s, &e);
            if (e == s || !(w > 0) || w > 1e6 || (*e && *e != ','))
                return cm_errf(err, errlen, CM_EINVAL, "--tp-weights '%s': expected positive numbers like 1,2,1", o->tp_weights);
            pc->nodes[i].flops *= w;
            pc->nodes[i].mem_bw *= w;
            s = *e ? e + 1 : e;
        }
    }
    if (po.mode == CM_PARALLEL_TP && o->layers && *o->layers)
        return cm_errf(err, errlen, CM_EINVAL, "--layers splits a pipeline; it does not go with --parallel tp");
    if (o->groups && *o->groups) return cm_coord_plan_groups(p, o, &po, pm, pc, plan, err, errlen);
    if (!o->layers || !*o->layers) return cm_plan_make(pm, pc, &po, plan, err, errlen);
    /* Explicit split: layers per stage, this machine first. */
    int counts[CM_PLAN_MAX_NODES], n = 0, sum = 0;
    for (const char *s = o->layers; *s;) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s || v < 1 || n == CM_PLAN_MAX_NODES)
            return cm_errf(err, errlen, CM_EINVAL, "--layers '%s': expected positive counts like 2,1,2", o->layers);
        counts[n++] = (int)v;
        sum += (int)v;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return cm_errf(err, errlen, CM_EINVAL, "--layers '%s': expected counts like 2,1,2", o->layers);
    }
    if (sum != pm->n_layers)
        return cm_errf(err, errlen, CM_EINVAL, "--layers adds up to %d, the model has %d layers", sum, pm->n_layers);
    if (n > pc->n_nodes)
        return cm_errf(err, errlen, CM_EINVAL, "--layers names %d stages for %d machines", n, pc->n_nodes);
    int group_of[CM_PLAN_MAX_NODES];
    for (int i = 0; i < pc->n_nodes; i++) group_of[i] = i < n ? i : -1;
    rc = cm_plan_for_groups(pm, pc, &po, group_of, plan, err, errlen);
    if (rc) return rc;
    int at = 0;
    for (int s = 0; s < plan->n_stages; s++) {
        plan->stages[s].first_layer = at;
        at += counts[s];
        plan->stages[s].last_layer = at;
    }
    cm_plan_predict(pm, pc, &po, plan);
    snprintf(plan->why, sizeof plan->why, "layers split by --layers %s", o->layers);
    return 0;
}

/* What the dashboard shows of each machine: the plan's assignment plus the
 * HELLO facts and measured links gathered while connecting. */
void cm_coord_record_members(cm_pipe *p, const cm_plan *plan) {
    cm_node_caps me;
    cm_node_caps_get(&me);
    /* Built aside, then copied under info_mu (an /api/cluster reader). */
    cm_pipe_member_info tmp[CM_ARRAY_LEN(p->members)];
    int nm = 0;
    for (int s = 0; s < plan->n_stages; s++) {
        const cm_plan_stage *st = &plan->stages[s];
        for (int k = 0; k < st->n_members && nm < (int)CM_ARRAY_LEN(tmp); k++) {
            const cm_plan_member *mb = &st->members[k];
            cm_pipe_member_info *o = &tmp[nm++];
            memset(o, 0, sizeof *o);
            o->stage = s;
            o->first_layer = st->first_layer;
            o->last_layer = st->last_layer;
            o->n_members = st->n_members;
            o->member = k;
            o->kv_head_begin = mb->kv_head_begin;
            o->kv_head_end = mb->kv_head_end;
            o->ffn_begin = mb->ffn_begin;
            o->ffn_end = mb->ffn_end;
            o->weight_bytes = mb->weight_bytes;
            o->kv_bytes = mb->kv_bytes;
            if (mb->node == 0) {
                o->local = true;
                memcpy(o->name, p->hello.name, strnlen(p->hello.name, sizeof o->name - 1));
                o->cores = (uint32_t)me.cores;
                o->mem_total = me.mem_total;
                o->mem_free = me.mem_free;
                o->gflops = me.gflops;
            } else {
                const remote *r = &p->r[mb->node - 1];
                /* o is zeroed: copy up to one byte short (snprintf would see p and o alias) */
                memcpy(o->addr, r->addr, strnlen(r->addr, sizeof o->addr - 1));
                memcpy(o->name, r->hello.name, strnlen(r->hello.name, sizeof o->name - 1));
                o->cores = r->hello.cores;
                o->mem_total = r->hello.mem_total;
                o->mem_free = r->hello.mem_free;
                o->gflops = r->hello.gflops;
                o->rtt_s = r->rtt;
                o->bw = r->bw;
            }
            if (s > 0 && k == 0) /* the hop into this stage */
                o->link_measured = node_link(p, plan->stages[s - 1].members[0].node, mb->node, &o->link_rtt_s, &o->link_bw);
        }
    }
    pthread_mutex_lock(&p->info_mu);
    memcpy(p->members, tmp, (size_t)nm * sizeof tmp[0]);
    p->n_members = nm;
    pthread_mutex_unlock(&p->info_mu);
}

/* ASSIGN stage s of n_st: layers [lb[s], le[s]) on r[rid[s]] (stage 0 is
 * this machine). */
int cm_coord_assign_stage(cm_pipe *p, int s, int n_st, const int *rid, const int *lb, const int *le, char *err,
                        size_t errlen) {
    remote *r = &p->r[rid[s]];
    cm_msg m = {.type = CM_MSG_ASSIGN};
    cm_msg_assign *a = &m.u.assign;
    const cm_hparams *hp = &p->m->hp;
    a->epoch = atomic_load(&p->epoch);
    memcpy(a->model_sha256, p->sha, 32);
    const char *base = strrchr(p->model_path, '/');
    snprintf(a->model_name, sizeof a->model_name, "%.63s", base ? base + 1 : p->model_path);
    a->n_layers = (uint32_t)hp->n_layer;
    a->layer_begin = (uint32_t)lb[s];
    a->layer_end = (uint32_t)le[s];
    a->flags = s == n_st - 1 ? CM_ASSIGN_F_OUTPUT : 0;
    a->head_begin = 0;
    a->head_end = (uint32_t)hp->n_head_kv;
    a->ffn_begin = 0;
    a->ffn_end = (uint32_t)hp->n_ff;
    a->n_ctx = (uint32_t)p->n_ctx;
    a->n_seq_max = (uint32_t)p->n_seq;
    a->stage = (uint16_t)s;
    a->n_stages = (uint16_t)n_st;
    a->hidden_dtype = CM_HIDDEN_F32;
    a->tp_rank = 0;
    a->tp_size = 1;
    snprintf(a->tp_peers[0], sizeof a->tp_peers[0], "%.63s", r->addr);
    snprintf(a->prev, sizeof a->prev, "%.63s", s > 1 ? p->r[rid[s - 1]].addr : "");
    if (s + 1 < n_st) snprintf(a->next, sizeof a->next, "%.63s", p->r[rid[s + 1]].addr);
    pthread_mutex_lock(&p->mu);
    r->ready = false;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&p->send_mu);
    atomic_store(&r->loading, true);
    int rc = cm_conn_send(r->ctl, &m, 10000, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

static int send_assign(cm_pipe *p, const cm_plan *plan, int s, char *err, size_t errlen) {
    int rid[CM_PLAN_MAX_NODES], lb[CM_PLAN_MAX_NODES], le[CM_PLAN_MAX_NODES];
    for (int i = 0; i < plan->n_stages; i++) {
        rid[i] = plan->stages[i].members[0].node - 1;
        lb[i] = plan->stages[i].first_layer;
        le[i] = plan->stages[i].last_layer;
    }
    return cm_coord_assign_stage(p, s, plan->n_stages, rid, lb, le, err, errlen);
}


int cm_coord_wait_ready(cm_pipe *p, const int *ids, const char (*what)[48], int n, int timeout_s, char *err,
                        size_t errlen) {
    uint64_t deadline = cm_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int waiting = 0;
        for (int i = 0; i < n && !rc; i++) {
            const remote *r = &p->r[ids[i]];
            if (!r->ready) waiting++;
            else if (r->ready_status)
                rc = cm_errf(err, errlen, r->ready_status, "node %s ('%s') cannot take %s: %s", r->addr, r->hello.name,
                             what[i], r->ready_text);
        }
        if (p->fatal && !rc) rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
        if (rc || !waiting) break;
        if (cm_now_ns() > deadline) {
            rc = cm_errf(err, errlen, CM_ETIMEDOUT, "nodes were not ready within %d s", timeout_s);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
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
    p->max_batch = o->max_batch > 0 ? CM_MIN(o->max_batch, 256) : 64;
    p->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 60000;
    p->lost_ms = CM_PIPE_LOST_MS;
    {
        const char *env = getenv("CUMULO_LOST_MS"); /* tests: a tighter or looser bound */
        if (env && atoi(env) >= 200) p->lost_ms = atoi(env);
        env = getenv("CUMULO_TOKEN_TIMEOUT_MS"); /* tests: the token deadline of cm_pipe_recv_token */
        if (env && atoi(env) >= 200) p->timeout_ms = atoi(env);
    }
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
    int n_refused = 0;
    char first_refusal[300] = "";
    cm_conn *dialled[CM_PLAN_MAX_NODES - 1];
    cm_msg_hello peers[CM_PLAN_MAX_NODES - 1];
    int dial_rc[CM_PLAN_MAX_NODES - 1];
    char dial_err[CM_PLAN_MAX_NODES - 1][400];
    cm_cluster_dial_many((const char (*)[80])addrs, n, &p->cfg, &p->hello, dialled, peers, dial_rc, dial_err);
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
        if (!rc) rc = cm_cluster_measure(r->ctl, 1 << 16, &r->rtt, &r->bw, e, sizeof e);
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
        cm_coord_log(p, "node %s ('%s'): %u cores %s, %.1f GFLOP/s, %.1f GB/s, %.2f GiB free; rtt %.3f ms, %.1f MB/s", r->addr,
             r->hello.name, r->hello.cores, r->hello.isa, r->hello.gflops, r->hello.mem_gbs,
             (double)r->hello.mem_free / (1 << 30), r->rtt * 1e3, r->bw / 1e6);
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
    if (!pc) { rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory"); goto fail; }
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
    if (plan.stages[0].members[0].node != 0) {
        rc = cm_errf(err, errlen, CM_EINVAL, "the plan does not start on this machine");
        goto fail;
    }
    p->n_stages = plan.n_stages;
    p->local_last = plan.stages[0].last_layer;
    for (int s = 1; s < plan.n_stages; s++) p->stage_remote[s] = plan.stages[s].members[0].node - 1;
    cm_coord_record_members(p, &plan);
    cm_coord_log(p, "%s", p->plan_text);
    p->tp_compress = o->tp_compress;
    for (int s = 0; s < plan.n_stages; s++)
        if (plan.stages[s].n_members > 1) { /* TP, or hybrid: coord_tp.c */
            rc = cm_coord_tp_open(p, &plan, err, errlen);
            if (rc) goto fail;
            *local_last = p->local_last;
            *out = p;
            return 0;
        }
    if (plan.n_stages == 1) { /* everything fits best here: no cluster needed */
        *local_last = m->hp.n_layer;
        cm_pipe_close(p);
        return 0;
    }
    for (int i = 0; i < p->n_remote; i++) {
        if (pthread_create(&p->r[i].rx, NULL, rx_main, &p->r[i])) {
            rc = cm_errf(err, errlen, CM_ENOMEM, "cannot start a thread");
            goto fail;
        }
        p->r[i].rx_started = true;
    }
    for (int s = 1; s < plan.n_stages; s++)
        if ((rc = send_assign(p, &plan, s, err, errlen))) goto fail;
    /* Wait for every assigned node (loading, maybe streaming weights). */
    {
        int ids[CM_PLAN_MAX_NODES];
        char what[CM_PLAN_MAX_NODES][48];
        for (int s = 1; s < plan.n_stages; s++) {
            ids[s - 1] = plan.stages[s].members[0].node - 1;
            snprintf(what[s - 1], sizeof what[0], "layers [%d, %d)", plan.stages[s].first_layer, plan.stages[s].last_layer);
        }
        rc = cm_coord_wait_ready(p, ids, (const char (*)[48])what, plan.n_stages - 1, 600, err, errlen);
    }
    if (rc) goto fail;
    {
        const char *a1 = p->r[plan.stages[1].members[0].node - 1].addr;
        char e[400];
        cm_msg_hello peer;
        rc = cm_cluster_dial(a1, &p->cfg, &p->hello, &p->data, &peer, e, sizeof e);
        if (rc) { cm_errf(err, errlen, rc, "stage 1 at %s: %s", a1, e); goto fail; }
    }
    *local_last = p->local_last;
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
    cm_coll_free(p->coll);
    cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
    for (int i = 0; i < p->n_remote; i++)
        if (p->r[i].ctl) cm_conn_close(p->r[i].ctl, "coordinator done");
    pthread_mutex_destroy(&p->send_mu);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    cm_free(p->slots);
    cm_free(p->tp_plan);
    cm_free(p->orig_plan);
    cm_free(p);
}

const char *cm_pipe_plan_text(const cm_pipe *p) { return p->plan_text; }
int cm_pipe_n_stages(const cm_pipe *p) { return p->n_stages; }

int cm_pipe_seq_acquire(cm_pipe *p, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    int got = CM_EBUSY;
    for (int i = 0; i < p->n_seq; i++)
        if (!p->slots[i].used) {
            p->slots[i] = (slot){.used = true};
            got = i;
            break;
        }
    pthread_mutex_unlock(&p->mu);
    if (got < 0) cm_errf(err, errlen, CM_EBUSY, "all %d cluster sequences are in use", p->n_seq);
    return got;
}

int cm_coord_send_data(cm_pipe *p, const cm_msg *m, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    int fatal = p->fatal;
    if (fatal) cm_errf(err, errlen, fatal, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    if (fatal) return fatal;
    /* Every member of the group gets every sequence message; nodes that are
     * connected but not in it (back or joined, a re-plan not taken) none. */
    if (p->tp) return cm_coord_send_group0(p, m, err, errlen);
    if (p->grouped && m->type == CM_MSG_SEQ_FREE) { /* hybrid: stage 0's members hold the sequence too */
        int rc = cm_coord_send_group0(p, m, err, errlen);
        if (rc) return rc;
    }
    int rc = cm_conn_send(p->data, m, p->timeout_ms, err, errlen);
    if (rc) cm_coord_fatal(p, rc, "stage 1: %s", err);
    return rc;
}

void cm_pipe_seq_release(cm_pipe *p, int slot_i) {
    if (slot_i < 0 || slot_i >= p->n_seq) return;
    cm_msg m = {.type = CM_MSG_SEQ_FREE};
    m.u.seq_free = (cm_msg_seq_free){.epoch = p->epoch, .request_id = 0, .seq = slot_i};
    char e[300];
    pthread_mutex_lock(&p->send_mu);
    cm_coord_send_data(p, &m, e, sizeof e);
    pthread_mutex_unlock(&p->send_mu);
    pthread_mutex_lock(&p->mu);
    p->slots[slot_i].used = false;
    pthread_mutex_unlock(&p->mu);
}

int cm_pipe_seq_start(cm_pipe *p, int slot_i, const cm_sampler_params *sp, const int32_t *hist, int n_hist,
                      uint64_t n_sampled, char *err, size_t errlen) {
    cm_msg m = {.type = CM_MSG_SEQ_START};
    cm_msg_seq_start *q = &m.u.seq_start;
    int keep = sp->repeat_last_n > 0 ? CM_MIN(sp->repeat_last_n, (int)CM_MSG_MAX_HIST) : 0;
    if (n_hist > keep) { hist += n_hist - keep; n_hist = keep; }
    *q = (cm_msg_seq_start){.epoch = p->epoch, .seq = slot_i, .temperature = sp->temperature, .top_k = sp->top_k,
                            .top_p = sp->top_p, .min_p = sp->min_p, .repeat_penalty = sp->repeat_penalty,
                            .repeat_last_n = sp->repeat_last_n, .presence_penalty = sp->presence_penalty,
                            .frequency_penalty = sp->frequency_penalty, .seed = sp->seed, .n_sampled = n_sampled,
                            .n_probs = (uint8_t)CM_MIN(sp->n_probs > 0 ? sp->n_probs : 0, CM_MSG_MAX_TOP),
                            .n_hist = (uint32_t)n_hist, .hist = hist};
    pthread_mutex_lock(&p->send_mu);
    int rc = cm_coord_send_data(p, &m, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

int cm_pipe_send(cm_pipe *p, int slot_i, const float *hidden, const int32_t *pos, int n, bool want_last, char *err,
                 size_t errlen) {
    if (n < 1 || n > (int)sizeof p->wantbuf) return cm_errf(err, errlen, CM_EINVAL, "micro-batch of %d rows", n);
    pthread_mutex_lock(&p->send_mu);
    for (int i = 0; i < n; i++) {
        p->seqbuf[i] = slot_i;
        p->wantbuf[i] = (uint8_t)(want_last && i == n - 1);
    }
    if (want_last) {
        pthread_mutex_lock(&p->mu);
        p->slots[slot_i].asked++;
        pthread_mutex_unlock(&p->mu);
    }
    cm_msg m = {.type = CM_MSG_FORWARD};
    m.u.forward = (cm_msg_forward){.epoch = p->epoch, .request_id = ++p->next_req, .n_tokens = (uint32_t)n,
                                   .dim = (uint32_t)p->m->hp.n_embd, .dtype = CM_HIDDEN_F32, .pos = pos,
                                   .seq = p->seqbuf, .want = p->wantbuf, .hidden = hidden};
    int rc = cm_coord_send_data(p, &m, err, errlen);
    if (!rc) p->rows_sent += (uint64_t)n;
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

int cm_pipe_recv_token(cm_pipe *p, int slot_i, int32_t *token, float *logprob, char *err, size_t errlen) {
    uint64_t deadline = cm_now_ns() + (uint64_t)p->timeout_ms * 1000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    slot *s = &p->slots[slot_i];
    while (s->got < s->asked) {
        if (p->fatal) { rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text); break; }
        if (cm_now_ns() > deadline) {
            /* Every node answers its heartbeats, yet no token comes: a link
             * between two stages is cut (TCP retries it for many minutes and
             * nobody notices) or a stage is stuck. Fail the pipe, so that
             * the caller re-plans (fresh connections everywhere) or ends its
             * requests with this reason, instead of each waiting in turn. */
            pthread_mutex_unlock(&p->mu);
            cm_coord_fatal(p, CM_ETIMEDOUT, "no token from the last stage within %d ms (a link between stages may be cut)",
                           p->timeout_ms);
            pthread_mutex_lock(&p->mu);
            rc = cm_errf(err, errlen, p->fatal, "%s", p->fatal_text);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    if (!rc) {
        *token = s->token;
        if (logprob) *logprob = s->logprob;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int cm_pipe_members(const cm_pipe *p, cm_pipe_member_info *out, int max) {
    cm_pipe *q = (cm_pipe *)p; /* the lock, not the record, changes */
    pthread_mutex_lock(&q->info_mu);
    int n = p->n_members;
    for (int i = 0; i < n && i < max; i++) out[i] = p->members[i];
    pthread_mutex_unlock(&q->info_mu);
    return n;
}

void cm_pipe_hop_stats(const cm_pipe *p, uint64_t *bytes, uint64_t *frames, uint64_t *rows) {
    cm_conn_stats st = {0};
    if (!p->data) { *bytes = *frames = 0; *rows = p->rows_sent; return; }
    cm_conn_get_stats(p->data, CM_MSG_FORWARD, &st);
    *bytes = st.tx_bytes;
    *frames = st.tx_frames;
    *rows = p->rows_sent;
}


/* For coord_recover.c: the planner's view of every known node (index i + 1
 * is r[i]). */
void cm_coord_make_cluster(cm_pipe *p, cm_plan_cluster *c) { make_cluster(p, c); }
