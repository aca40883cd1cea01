/*
 * node_guard.c: connection limits and the heartbeat thread of `cumulo node`
 * (node_guard.h). The limits must never let one source address take the
 * handshake slots every coordinator needs, and never log a line per packet
 * of a flood; the heartbeat thread must never take the node's compute lock,
 * or a long forward pass would look like a dead node.
 */
#include "cluster/node_guard.h"

#include "os/os.h"

#include <stdio.h>
#include <string.h>

void cm_node_limits_init(cm_node_limits *l) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
}

void cm_node_limits_release(cm_node_limits *l) { pthread_mutex_destroy(&l->mu); }

int cm_node_limits_take(cm_node_limits *l, const char *host, char *why, size_t cap) {
    pthread_mutex_lock(&l->mu);
    int at = -1, free_at = -1;
    for (int i = 0; i < CM_NODE_MAX_CONNS; i++) {
        if (l->src[i].conns && !strcmp(l->src[i].host, host)) {
            at = i;
            break;
        }
        if (!l->src[i].conns && free_at < 0) free_at = i;
    }
    if (l->n_conns >= CM_NODE_MAX_CONNS) snprintf(why, cap, "%d connections open (the limit)", l->n_conns);
    else if (l->n_unauth >= CM_NODE_MAX_UNAUTH)
        snprintf(why, cap, "%d connections still in their handshake (the limit)", l->n_unauth);
    else if (at >= 0 && l->src[at].unauth >= CM_NODE_MAX_UNAUTH_SOURCE)
        snprintf(why, cap, "%d connections from %s still in their handshake (the limit per address)", l->src[at].unauth,
                 host);
    else {
        if (at < 0) { /* n_conns < CM_NODE_MAX_CONNS: some entry is free */
            at = free_at;
            snprintf(l->src[at].host, sizeof l->src[at].host, "%s", host);
        }
        l->src[at].conns++;
        l->src[at].unauth++;
        l->n_conns++;
        l->n_unauth++;
        pthread_mutex_unlock(&l->mu);
        return at;
    }
    pthread_mutex_unlock(&l->mu);
    return -1;
}

void cm_node_limits_authenticated(cm_node_limits *l, int src) {
    pthread_mutex_lock(&l->mu);
    l->src[src].unauth--;
    l->n_unauth--;
    pthread_mutex_unlock(&l->mu);
}

void cm_node_limits_put(cm_node_limits *l, int src) {
    pthread_mutex_lock(&l->mu);
    l->src[src].conns--;
    l->n_conns--;
    pthread_mutex_unlock(&l->mu);
}

void cm_node_limits_refused(cm_node_limits *l, const char *peer, const char *why) {
    pthread_mutex_lock(&l->mu);
    uint64_t now = cm_now_ns();
    if (now - l->window_ns > 1000000000ull) {
        l->window_ns = now;
        l->logged = 0;
    }
    bool say = l->logged < 5;
    int quiet = 0;
    if (say) {
        l->logged++;
        quiet = l->quiet;
        l->quiet = 0;
    } else l->quiet++;
    pthread_mutex_unlock(&l->mu);
    if (!say) return;
    if (quiet) CM_LOGW("refused connection from %s: %s (and %d more refused, not logged)", peer, why, quiet);
    else CM_LOGW("refused connection from %s: %s", peer, why);
}

void cm_node_hb_add(cm_node_hb *h, cm_conn *c) {
    pthread_mutex_lock(h->send_mu);
    int at = -1;
    for (int i = 0; i < CM_NODE_MAX_HB; i++) {
        if (h->conns[i] == c) {
            at = i;
            break;
        }
        if (!h->conns[i] && at < 0) at = i;
    }
    if (at >= 0) h->conns[at] = c;
    pthread_mutex_unlock(h->send_mu);
}

void cm_node_hb_remove(cm_node_hb *h, cm_conn *c) {
    pthread_mutex_lock(h->send_mu);
    for (int i = 0; i < CM_NODE_MAX_HB; i++)
        if (h->conns[i] == c) h->conns[i] = NULL;
    pthread_mutex_unlock(h->send_mu);
}

/* The telemetry tail of the next heartbeat: power and load averaged since
 * the previous one, tokens/s and time per token over the last few seconds
 * (a window of 8 heartbeats, so that a stage between requests shows what it
 * did rather than zero at once). */
typedef struct hb_stats {
    cm_power_meter *pm;
    uint64_t t_ns[8], rows[8], busy[8];
    int at, n;
} hb_stats;

static void fill_stats(cm_node_hb *h, hb_stats *st, cm_msg_heartbeat *hb) {
    cm_power_sample ps = {.cpu_load = -1};
    if (st->pm) cm_power_read(st->pm, &ps);
    uint64_t total = cm_mem_total_bytes(), avail = cm_mem_available_bytes();
    uint64_t now = cm_now_ns(), rows = atomic_load(&h->rows), busy = atomic_load(&h->busy_ns);
    int old = st->n < 8 ? 0 : st->at; /* the oldest sample of the window */
    hb->has_stats = true;
    hb->mem_used = total > avail ? total - avail : 0;
    hb->cpu_load = ps.cpu_load >= 0 && ps.cpu_load <= 1 ? (float)ps.cpu_load : -1.0f;
    hb->power_w = st->pm && ps.watts >= 0 && ps.watts < 1e6 ? (float)ps.watts : 0.0f;
    hb->power_src = !st->pm ? CM_POWER_NONE : ps.measured ? CM_POWER_RAPL : CM_POWER_ESTIMATE;
    if (st->n) {
        double dt = (double)(now - st->t_ns[old]) / 1e9;
        uint64_t dr = rows - st->rows[old], db = busy - st->busy[old];
        hb->tok_s = dt > 0 ? (float)((double)dr / dt) : 0.0f;
        hb->ms_per_tok = dr ? (float)((double)db / 1e6 / (double)dr) : 0.0f;
    }
    st->t_ns[st->at] = now;
    st->rows[st->at] = rows;
    st->busy[st->at] = busy;
    st->at = (st->at + 1) % 8;
    if (st->n < 8) st->n++;
}

static void *hb_main(void *arg) {
    cm_node_hb *h = arg;
    hb_stats st = {.pm = cm_power_open(0)};
    while (!atomic_load(h->stop)) {
        if (h->tick) h->tick(h->tick_user);
        cm_msg m = {.type = CM_MSG_HEARTBEAT};
        m.u.heartbeat =
            (cm_msg_heartbeat){.epoch = atomic_load(h->epoch), .wall_ms = cm_wall_ms(), .mono_ns = cm_now_ns()};
        fill_stats(h, &st, &m.u.heartbeat);
        char e[300];
        pthread_mutex_lock(h->send_mu);
        for (int i = 0; i < CM_NODE_MAX_HB; i++) {
            if (!h->conns[i] || cm_conn_state(h->conns[i]) != CM_CONN_READY) continue;
            if (cm_conn_send(h->conns[i], &m, 1000, e, sizeof e)) {
                CM_LOGW("heartbeats to %s stop: %s", cm_conn_peer(h->conns[i]), e);
                h->conns[i] = NULL;
            }
        }
        pthread_mutex_unlock(h->send_mu);
        for (int t = 0; t < CM_PIPE_HB_MS && !atomic_load(h->stop); t += 50) cm_sleep_ms(50);
    }
    cm_power_close(st.pm);
    return NULL;
}

int cm_node_hb_start(cm_node_hb *h) {
    memset(h->conns, 0, sizeof h->conns);
    h->started = pthread_create(&h->th, NULL, hb_main, h) == 0;
    return h->started ? 0 : CM_ENOMEM;
}

void cm_node_hb_join(cm_node_hb *h) {
    if (h->started) pthread_join(h->th, NULL);
    h->started = false;
}
