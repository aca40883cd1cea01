/*
 * coord_tp.c: the coordinator's side of plans with tensor-parallel groups
 * (issue 5): one group of every machine, or hybrid (groups as pipeline
 * stages). This machine is rank 0 of stage 0: it assigns each node its stage,
 * rank and slice, dials the other stage-0 members, waits for READY and builds
 * stage 0's all-reduce. Afterwards each stage-0 micro-batch is sent to the
 * other stage-0 members as token ids (each embeds them itself) and the
 * members meet in the all-reduces; in a hybrid plan the hidden states then go
 * to stage 1's rank 0 exactly as in a pipeline (coord.c), which relays them to
 * its members. The last group's rank 0 samples. Hidden states never come
 * back here.
 */
#include "cluster/coord_impl.h"
#include "sched/simulate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ASSIGN of member r of stage s. */
static void fill_assign(cm_pipe *p, const cm_plan *plan, int s, int r, cm_msg_assign *a) {
    const cm_plan_stage *st = &plan->stages[s];
    const cm_plan_member *mb = &st->members[r];
    const cm_hparams *hp = &p->m->hp;
    int k = st->n_members;
    memset(a, 0, sizeof *a);
    a->epoch = atomic_load(&p->epoch);
    memcpy(a->model_sha256, p->sha, 32);
    const char *base = strrchr(p->model_path, '/');
    snprintf(a->model_name, sizeof a->model_name, "%.63s", base ? base + 1 : p->model_path);
    a->n_layers = (uint32_t)hp->n_layer;
    a->layer_begin = (uint32_t)st->first_layer;
    a->layer_end = (uint32_t)st->last_layer;
    a->flags = (s == 0 ? CM_ASSIGN_F_EMBED : 0) | (s == plan->n_stages - 1 ? CM_ASSIGN_F_OUTPUT : 0) |
               (k > 1 && p->tp_compress ? CM_ASSIGN_F_TP_Q8 : 0);
    a->head_begin = (uint32_t)mb->kv_head_begin;
    a->head_end = (uint32_t)mb->kv_head_end;
    a->ffn_begin = (uint32_t)mb->ffn_begin;
    a->ffn_end = (uint32_t)mb->ffn_end;
    a->n_ctx = (uint32_t)p->n_ctx;
    a->n_seq_max = (uint32_t)p->n_seq;
    a->stage = (uint16_t)s;
    a->n_stages = (uint16_t)plan->n_stages;
    a->hidden_dtype = CM_HIDDEN_F32;
    a->tp_rank = (uint8_t)r;
    a->tp_size = (uint8_t)k;
    for (int j = 0; j < k; j++) {
        int nd = st->members[j].node;
        snprintf(a->tp_peers[j], sizeof a->tp_peers[j], "%.63s", nd ? p->r[nd - 1].addr : "coordinator");
    }
    /* prev: informational ("" after this machine); next: the next group's rank 0. */
    if (s > 1) snprintf(a->prev, sizeof a->prev, "%.63s", p->r[plan->stages[s - 1].members[0].node - 1].addr);
    if (s + 1 < plan->n_stages) snprintf(a->next, sizeof a->next, "%.63s", p->r[plan->stages[s + 1].members[0].node - 1].addr);
}

/* A plan with tensor-parallel groups: one group of every machine (p->tp), or
 * hybrid (groups as pipeline stages). This machine is rank 0 of stage 0.
 * ASSIGN every node its stage, rank and slice (members of later groups dial
 * each other; their rank 0 relays its group's FORWARDs), dial and greet the
 * other stage-0 members, wait for READY everywhere, make stage 0's all-reduce
 * and dial stage 1's rank 0 (the data path, as in a pipeline). */
int cm_coord_tp_open(cm_pipe *p, const cm_plan *plan, char *err, size_t errlen) {
    const cm_plan_stage *st0 = &plan->stages[0];
    const cm_hparams *hp = &p->m->hp;
    int k = st0->n_members;
    if (st0->members[0].node != 0)
        return cm_errf(err, errlen, CM_EINVAL, "the first tensor-parallel group must start on this machine");
    for (int s = 0; s < plan->n_stages; s++)
        if (plan->stages[s].n_members > CM_COLL_MAX_MEMBERS || plan->stages[s].n_members > (int)CM_MSG_MAX_TP)
            return cm_errf(err, errlen, CM_EINVAL, "a tensor-parallel group of %d members (at most %d)",
                           plan->stages[s].n_members, CM_COLL_MAX_MEMBERS);
    if (!p->tp_plan && !(p->tp_plan = cm_calloc(1, sizeof *p->tp_plan)))
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (p->tp_plan != plan) *p->tp_plan = *plan;
    if (!p->orig_plan && (p->orig_plan = cm_calloc(1, sizeof *p->orig_plan))) *p->orig_plan = *plan;
    p->tp = plan->n_stages == 1;
    p->grouped = true;
    p->tp_size = k;
    const cm_plan_member *m0 = &st0->members[0];
    p->tp_slice = (cm_slice){m0->kv_head_begin, m0->kv_head_end, m0->ffn_begin, m0->ffn_end};
    for (int r = 1; r < k; r++) p->s0_remote[r] = st0->members[r].node - 1;
    cm_coord_start_rx(p);
    for (int s = 0; s < plan->n_stages; s++)
        for (int r = 0; r < plan->stages[s].n_members; r++) {
            int nd = plan->stages[s].members[r].node;
            if (nd == 0) continue;
            remote *rm = &p->r[nd - 1];
            cm_msg msg = {.type = CM_MSG_ASSIGN};
            fill_assign(p, plan, s, r, &msg.u.assign);
            pthread_mutex_lock(&p->mu);
            rm->ready = false;
            pthread_mutex_unlock(&p->mu);
            pthread_mutex_lock(&p->send_mu);
            atomic_store(&rm->loading, true);
            int rc = cm_conn_send(rm->ctl, &msg, 10000, err, errlen);
            pthread_mutex_unlock(&p->send_mu);
            if (rc) return rc;
        }
    for (int r = 1; r < k; r++) {
        remote *rm = &p->r[p->s0_remote[r]];
        char e[400];
        cm_msg_hello peer;
        int rc = cm_cluster_dial(rm->addr, &p->cfg, &p->hello, &p->tp_conn[r], &peer, e, sizeof e);
        if (!rc) rc = cm_coll_mesh_greet(p->tp_conn[r], 0, 10000, e, sizeof e);
        if (!rc) rc = cm_tp_greet_epoch(p->tp_conn[r], p->epoch, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "tensor-parallel rank %d at %s: %s", r, rm->addr, e);
    }
    int ids[CM_PLAN_MAX_NODES * 2], n_wait = 0;
    char what[CM_PLAN_MAX_NODES * 2][48];
    for (int s = 0; s < plan->n_stages; s++)
        for (int r = 0; r < plan->stages[s].n_members && n_wait < (int)CM_ARRAY_LEN(ids); r++) {
            int nd = plan->stages[s].members[r].node;
            if (nd == 0) continue;
            ids[n_wait] = nd - 1;
            snprintf(what[n_wait++], sizeof what[0], "rank %d of stage %d", r, s);
        }
    int rc = cm_coord_wait_ready(p, ids, (const char (*)[48])what, n_wait, 600, err, errlen);
    if (rc) return rc;
    if (k > 1) {
        cm_coll_cfg cc = {.rank = 0, .size = k, .max_n = (int64_t)p->max_batch * hp->n_embd, .timeout_ms = p->lost_ms,
                          .epoch = p->epoch, .compress = p->tp_compress};
        for (int r = 1; r < k; r++) cc.peers[r] = p->tp_conn[r];
        char e[300];
        rc = cm_coll_new(&cc, &p->coll, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "all-reduce: %s", e);
    }
    if (plan->n_stages > 1) {
        const char *a1 = p->r[plan->stages[1].members[0].node - 1].addr;
        char e[400];
        cm_msg_hello peer;
        rc = cm_cluster_dial(a1, &p->cfg, &p->hello, &p->data, &peer, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "stage 1 at %s: %s", a1, e);
    }
    if (p->tp)
        cm_coord_log(p, "tensor parallel: %d members, this machine rank 0 with KV heads [%d, %d) and FFN rows [%d, %d)%s", k,
                     p->tp_slice.h0, p->tp_slice.h1, p->tp_slice.f0, p->tp_slice.f1, p->tp_compress ? ", Q8_0 transfers" : "");
    else {
        char line[900];
        int o = snprintf(line, sizeof line, "hybrid: %d stages of", plan->n_stages);
        for (int s = 0; s < plan->n_stages && o < (int)sizeof line; s++)
            o += snprintf(line + o, sizeof line - (size_t)o, "%s %d member%s (layers [%d, %d))", s ? "," : "",
                          plan->stages[s].n_members, plan->stages[s].n_members > 1 ? "s" : "", plan->stages[s].first_layer,
                          plan->stages[s].last_layer);
        if (o < (int)sizeof line)
            snprintf(line + o, sizeof line - (size_t)o, "; this machine rank 0 of stage 0 with KV heads [%d, %d) and FFN rows [%d, %d)%s",
                     p->tp_slice.h0, p->tp_slice.h1, p->tp_slice.f0, p->tp_slice.f1, p->tp_compress ? ", Q8_0 transfers" : "");
        cm_coord_log(p, "%s", line);
    }
    return 0;
}

/* "a,b,c" of positive counts into v (at most max); the count, or an error. */
static int parse_counts(const char *what, const char *str, int *v, int max, char *err, size_t errlen) {
    int n = 0;
    for (const char *s = str; *s;) {
        char *e;
        long x = strtol(s, &e, 10);
        if (e == s || x < 1 || x > 65536 || n == max || (*e && *e != ','))
            return cm_errf(err, errlen, CM_EINVAL, "%s '%s': expected at most %d positive counts like 2,2", what, str, max);
        v[n++] = (int)x;
        s = *e ? e + 1 : e;
    }
    return n ? n : cm_errf(err, errlen, CM_EINVAL, "%s is empty", what);
}

int cm_coord_plan_groups(cm_pipe *p, const cm_pipe_opts *o, const cm_plan_opts *po, const cm_plan_model *pm,
                         const cm_plan_cluster *pc, cm_plan *plan, char *err, size_t errlen) {
    (void)p;
    int g[CM_PLAN_MAX_NODES], group_of[CM_PLAN_MAX_NODES];
    int n = parse_counts("--groups", o->groups, g, CM_PLAN_MAX_NODES, err, errlen);
    if (n < 0) return n;
    int at = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g[i]; j++, at++) {
            if (at == pc->n_nodes)
                return cm_errf(err, errlen, CM_EINVAL, "--groups %s names more members than the %d machines", o->groups,
                               pc->n_nodes);
            group_of[at] = i;
        }
    for (; at < pc->n_nodes; at++) group_of[at] = -1; /* machines left out of the plan */
    int rc = cm_plan_for_groups(pm, pc, po, group_of, plan, err, errlen);
    if (rc) return rc;
    if (o->layers && *o->layers) {
        int c[CM_PLAN_MAX_NODES], sum = 0;
        int nl = parse_counts("--layers", o->layers, c, CM_PLAN_MAX_NODES, err, errlen);
        if (nl < 0) return nl;
        if (nl != plan->n_stages)
            return cm_errf(err, errlen, CM_EINVAL, "--layers names %d stages, --groups %d", nl, plan->n_stages);
        for (int i = 0; i < nl; i++) sum += c[i];
        if (sum != pm->n_layers)
            return cm_errf(err, errlen, CM_EINVAL, "--layers adds up to %d, the model has %d layers", sum, pm->n_layers);
        for (int s = 0, l = 0; s < plan->n_stages; s++) {
            plan->stages[s].first_layer = l;
            l += c[s];
            plan->stages[s].last_layer = l;
        }
        cm_plan_predict(pm, pc, po, plan);
    }
    snprintf(plan->why, sizeof plan->why, "groups of %s members set by --groups%s%s", o->groups,
             o->layers && *o->layers ? ", layers by --layers " : "", o->layers && *o->layers ? o->layers : "");
    return 0;
}

/* [begin, end) of part r of k of total units in multiples of granule (the
 * last part takes the remainder). */
static void even_part(int total, int granule, int k, int r, int *b, int *e) {
    if (granule < 1) granule = 1;
    *b = r == 0 ? 0 : (int)((int64_t)total * r / k) / granule * granule;
    *e = r == k - 1 ? total : (int)((int64_t)total * (r + 1) / k) / granule * granule;
}

/* A member of a group was lost: every group keeps its surviving members
 * (this machine stays rank 0 of the first) and, when it lost one, its slices
 * are split evenly among them (the engine re-shapes its stage-0 caches when
 * its own slice changes: cm_pipe_tp_slice); this machine's group keeps its
 * layers, groups left empty disappear and the later layers are split evenly
 * over the groups that remain. Everyone gets the new epoch (their FORWARDs
 * and all-reduces carry it), so the whole plan is opened again. */
int cm_coord_tp_recover(cm_pipe *p, char *err, size_t errlen) {
    const cm_plan *old = p->tp_plan;
    if (!old || p->tp)
        return cm_errf(err, errlen, CM_EAGAIN, "a member of the tensor-parallel group was lost; one group of every "
                                               "machine is not re-planned (NEEDSWORK)");
    for (int i = 0; i < p->n_remote; i++) { /* lost: their rx threads end within the bound */
        remote *r = &p->r[i];
        if (atomic_load(&r->lost) && r->rx_started) {
            pthread_join(r->rx, NULL);
            r->rx_started = false;
            cm_conn_close(r->ctl, NULL);
            r->ctl = NULL;
        }
    }
    cm_plan *np = cm_calloc(1, sizeof *np);
    cm_plan_model *pm = cm_calloc(1, sizeof *pm);
    int rc = np && pm ? cm_plan_model_from_gguf(p->g, pm, err, errlen) : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (rc) goto out;
    *np = *old;
    np->n_stages = 0;
    for (int s = 0; s < old->n_stages; s++) {
        cm_plan_stage st = old->stages[s];
        st.n_members = 0;
        for (int j = 0; j < old->stages[s].n_members; j++) {
            int nd = old->stages[s].members[j].node;
            const remote *rm = nd ? &p->r[nd - 1] : NULL;
            if (!rm || (rm->ctl && !atomic_load(&rm->lost))) st.members[st.n_members++] = old->stages[s].members[j];
        }
        if (!st.n_members) continue;
        for (int j = 0; j < st.n_members && st.n_members != old->stages[s].n_members; j++) {
            cm_plan_member *mb = &st.members[j];
            even_part(pm->n_kv_heads, pm->head_granule, st.n_members, j, &mb->kv_head_begin, &mb->kv_head_end);
            even_part(pm->ffn, pm->ffn_granule, st.n_members, j, &mb->ffn_begin, &mb->ffn_end);
        }
        np->stages[np->n_stages++] = st;
    }
    int n_layer = p->m->hp.n_layer, rest = n_layer - p->local_last, later = np->n_stages - 1;
    if (!later) {
        rc = cm_errf(err, errlen, CM_EAGAIN, "no node is left to run layers [%d, %d)", p->local_last, n_layer);
        goto out;
    }
    if (later > rest) later = rest; /* more groups than layers: the last ones go */
    bool same = later + 1 == old->n_stages; /* no group vanished: the layers stay where they are */
    np->n_stages = later + 1;
    for (int s = 1, at = p->local_last; s <= later && !same; s++) {
        int k = rest / later + (s - 1 < rest % later ? 1 : 0);
        np->stages[s].first_layer = at;
        np->stages[s].last_layer = at + k;
        at += k;
    }
    np->mode = CM_PARALLEL_HYBRID;
    uint64_t ep = cm_wall_ms();
    if (ep <= atomic_load(&p->epoch)) ep = atomic_load(&p->epoch) + 1;
    atomic_store(&p->epoch, ep);
    pthread_mutex_lock(&p->send_mu);
    if (p->data) cm_conn_close(p->data, NULL);
    p->data = NULL;
    pthread_mutex_unlock(&p->send_mu);
    cm_coll_free(p->coll);
    p->coll = NULL;
    cm_coll_mesh_close(p->tp_conn, CM_COLL_MAX_MEMBERS);
    pthread_mutex_lock(&p->mu);
    p->fatal = 0;
    p->fatal_text[0] = 0;
    for (int i = 0; i < p->n_seq; i++) p->slots[i].asked = p->slots[i].got = 0;
    pthread_mutex_unlock(&p->mu);
    char line[600];
    int o = snprintf(line, sizeof line, "re-plan (epoch %llu): this machine's group, %d member%s, keeps [0, %d)",
                     (unsigned long long)ep, np->stages[0].n_members, np->stages[0].n_members > 1 ? "s" : "", p->local_last);
    for (int s = 1; s < np->n_stages && o < (int)sizeof line; s++)
        o += snprintf(line + o, sizeof line - (size_t)o, ", %d member%s [%d, %d)", np->stages[s].n_members,
                      np->stages[s].n_members > 1 ? "s" : "", np->stages[s].first_layer, np->stages[s].last_layer);
    cm_coord_log(p, "%s", line);
    rc = cm_coord_tp_open(p, np, err, errlen);
    if (rc) goto out;
    p->n_stages = np->n_stages;
    for (int s = 1; s < np->n_stages; s++) p->stage_remote[s] = np->stages[s].members[0].node - 1;
    cm_coord_record_members(p, np);
    p->generation++;
out:
    cm_free(pm);
    cm_free(np); /* cm_coord_tp_open kept its own copy */
    return rc;
}

int cm_coord_send_group0(cm_pipe *p, const cm_msg *m, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    int fatal = p->fatal;
    if (fatal) cm_errf(err, errlen, fatal, "%s", p->fatal_text);
    pthread_mutex_unlock(&p->mu);
    if (fatal) return fatal;
    for (int r = 1; r < p->tp_size; r++) {
        remote *rm = &p->r[p->s0_remote[r]];
        int rc = cm_conn_send(rm->ctl, m, p->timeout_ms, err, errlen);
        if (rc) { cm_coord_fatal(p, rc, "node %s: %s", rm->addr, err); return rc; }
    }
    return 0;
}

int cm_pipe_stage0_size(const cm_pipe *p) { return p && p->grouped ? p->tp_size : 1; }

int cm_pipe_last_top(cm_pipe *p, int slot_i, int32_t *ids, float *logprobs, int max) {
    if (slot_i < 0 || slot_i >= p->n_seq) return 0;
    pthread_mutex_lock(&p->mu);
    int n = CM_MIN(p->slots[slot_i].n_top, max);
    for (int i = 0; i < n; i++) {
        ids[i] = p->slots[slot_i].top_id[i];
        logprobs[i] = p->slots[slot_i].top_lp[i];
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

bool cm_pipe_is_tp(const cm_pipe *p) { return p && p->tp; }
int cm_pipe_tp_size(const cm_pipe *p) { return p->grouped ? p->tp_size : 1; }
cm_slice cm_pipe_tp_slice(const cm_pipe *p) { return p->tp_slice; }
void *cm_pipe_tp_coll(const cm_pipe *p) { return (void *)p; }
/* A failed all-reduce (a member lost mid-operation) fails the pipe at once,
 * so that the caller sees cm_pipe_failed and re-plans, rather than racing the
 * receiver thread that notices the closed connection. */
int cm_pipe_tp_allreduce(void *user, float *x, int64_t n) {
    cm_pipe *p = user;
    int rc = cm_coll_allreduce_cb(p->coll, x, n);
    if (rc) cm_coord_fatal(p, rc, "all-reduce of this machine's group: %s", cm_coll_error(p->coll));
    return rc;
}

int cm_pipe_tp_send(cm_pipe *p, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n, char *err,
                    size_t errlen) {
    if (n < 1 || n > (int)sizeof p->wantbuf) return cm_errf(err, errlen, CM_EINVAL, "micro-batch of %d rows", n);
    pthread_mutex_lock(&p->send_mu);
    memset(p->wantbuf, 0, (size_t)n);
    cm_msg m = {.type = CM_MSG_FORWARD};
    m.u.forward = (cm_msg_forward){.epoch = p->epoch, .request_id = ++p->next_req, .n_tokens = (uint32_t)n, .dim = 0,
                                   .dtype = CM_HIDDEN_TOKENS, .pos = pos, .seq = seq, .want = p->wantbuf,
                                   .tokens = tokens};
    int rc = cm_coord_send_group0(p, &m, err, errlen);
    if (!rc && p->tp) p->rows_sent += (uint64_t)n; /* hybrid: rows_sent counts the hidden rows to stage 1 */
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}

void cm_pipe_tp_stats(const cm_pipe *p, uint64_t *data_sent, uint64_t *wire_sent, uint64_t *ops, uint64_t *rows) {
    cm_coll_stats st = {0};
    if (p->coll) cm_coll_stats_get(p->coll, &st);
    *data_sent = st.total.data_sent;
    *wire_sent = st.total.wire_sent;
    *ops = st.ops;
    *rows = p->rows_sent;
}

