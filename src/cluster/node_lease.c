/*
 * node_lease.c: ownership of a node (issue 19). A node serves one
 * coordinator at a time: the first coordinator's ASSIGN takes a lease
 * (its identity: the random node id of its HELLO, its name, the model, the
 * plan epoch, since when), every frame from it renews the lease, and the
 * lease ends with its control connection or after cm_node_lease_ms() of
 * silence. Another coordinator's ASSIGN is refused with the reason unless it
 * says CM_ASSIGN_F_TAKE (--take), or the lease expired: then the old owner's
 * control connection gets BYE with the reason and is shut down, so that the
 * old coordinator learns it at once and re-plans without this node.
 * The lease is shown in every HELLO this node sends, so a coordinator leaves
 * a node that serves another out of its plan before asking (cm_lease_*).
 * Must never close a connection it does not own: it only shuts the owner's
 * socket down (the owner's thread closes it, after cm_node_lease_conn_end).
 */
#include "cluster/node_guard.h"

#include "os/os.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

int cm_node_lease_ms(void) { return 3 * cm_cluster_lost_ms(); }

void cm_node_lease_init(cm_node_lease *l, pthread_mutex_t *send_mu) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->send_mu = send_mu;
}

void cm_node_lease_release(cm_node_lease *l) { pthread_mutex_destroy(&l->mu); }

/* Under l->mu. */
static bool valid(const cm_node_lease *l, uint64_t now) {
    return l->held && (l->loading || now - l->renew_ns <= (uint64_t)cm_node_lease_ms() * 1000000ull);
}

void cm_node_lease_hello(cm_node_lease *l, cm_msg_hello *h) {
    pthread_mutex_lock(&l->mu);
    if (valid(l, cm_now_ns())) {
        h->lease_epoch = l->epoch ? l->epoch : 1;
        h->lease_since_ms = l->since_ms;
        memcpy(h->lease_owner_id, l->owner_id, CM_NODE_ID_BYTES);
        memcpy(h->lease_owner, l->owner, sizeof h->lease_owner);
        memcpy(h->lease_model, l->model, sizeof h->lease_model);
    } else {
        h->lease_epoch = h->lease_since_ms = 0;
        memset(h->lease_owner_id, 0, CM_NODE_ID_BYTES);
        h->lease_owner[0] = h->lease_model[0] = 0;
    }
    pthread_mutex_unlock(&l->mu);
}

void cm_node_lease_renew(cm_node_lease *l, const cm_msg_hello *peer) {
    pthread_mutex_lock(&l->mu);
    if (l->held && !memcmp(l->owner_id, peer->node_id, CM_NODE_ID_BYTES)) l->renew_ns = cm_now_ns();
    pthread_mutex_unlock(&l->mu);
}

int cm_node_lease_assign(cm_node_lease *l, const cm_msg_hello *me, const cm_msg_hello *peer, cm_conn *c,
                         const cm_msg_assign *a, bool *took_over, char *why, size_t cap) {
    *took_over = false;
    uint64_t now = cm_now_ns();
    const char *addr = c ? cm_conn_peer(c) : "?";
    pthread_mutex_lock(&l->mu);
    bool mine = l->held && !memcmp(l->owner_id, peer->node_id, CM_NODE_ID_BYTES);
    if (l->held && !mine) {
        bool live = valid(l, now);
        if (live && !(a->flags & CM_ASSIGN_F_TAKE)) {
            cm_msg_hello h = *me;
            h.lease_epoch = l->epoch ? l->epoch : 1;
            h.lease_since_ms = l->since_ms;
            memcpy(h.lease_owner, l->owner, sizeof h.lease_owner);
            memcpy(h.lease_model, l->model, sizeof h.lease_model);
            pthread_mutex_unlock(&l->mu);
            cm_lease_text(&h, why, cap);
            return CM_EBUSY;
        }
        /* Taken over (--take) or expired: the old owner hears it now. */
        if (l->ctl) {
            cm_msg bye = {.type = CM_MSG_BYE};
            if (live)
                snprintf(bye.u.bye.text, sizeof bye.u.bye.text, "%s was taken over by coordinator '%s' (--take)",
                         me->name, peer->name);
            else
                snprintf(
                    bye.u.bye.text, sizeof bye.u.bye.text,
                    "%s: this coordinator was silent for over %d ms; its lease expired and coordinator '%s' took the node",
                    me->name, cm_node_lease_ms(), peer->name);
            char e[200];
            pthread_mutex_lock(l->send_mu);
            cm_conn_send(l->ctl, &bye, 1000, e, sizeof e);
            pthread_mutex_unlock(l->send_mu);
            cm_sock_shutdown(cm_conn_fd(l->ctl));
        }
        fprintf(stderr, "cumulo node '%s': coordinator %s at %s took this node over from coordinator %s%s\n", me->name,
                peer->name, addr, l->owner, live ? " (--take)" : " (its lease had expired)");
        *took_over = true;
    }
    if (!mine) l->since_ms = cm_wall_ms();
    l->held = true;
    memcpy(l->owner_id, peer->node_id, CM_NODE_ID_BYTES);
    snprintf(l->owner, sizeof l->owner, "%.28s at %.31s", peer->name, addr); /* names may repeat (host names) */
    snprintf(l->model, sizeof l->model, "%s", a->model_name);
    l->epoch = a->epoch;
    l->renew_ns = now;
    l->loading = true;
    l->ctl = c;
    pthread_mutex_unlock(&l->mu);
    return 0;
}

bool cm_node_lease_holds(cm_node_lease *l, const cm_conn *c) {
    pthread_mutex_lock(&l->mu);
    bool h = l->held && l->ctl == c;
    pthread_mutex_unlock(&l->mu);
    return h;
}

void cm_node_lease_owner(cm_node_lease *l, char *out, size_t cap) {
    pthread_mutex_lock(&l->mu);
    snprintf(out, cap, "%s", l->held ? l->owner : "?");
    pthread_mutex_unlock(&l->mu);
}

void cm_node_lease_loaded(cm_node_lease *l) {
    pthread_mutex_lock(&l->mu);
    l->loading = false;
    l->renew_ns = cm_now_ns();
    pthread_mutex_unlock(&l->mu);
}

void cm_node_lease_conn_end(cm_node_lease *l, cm_conn *c) {
    pthread_mutex_lock(&l->mu);
    if (l->ctl == c) {
        l->ctl = NULL;
        l->held = false;
    }
    pthread_mutex_unlock(&l->mu);
}

void cm_lease_text(const cm_msg_hello *node, char *buf, size_t cap) {
    char since[16] = "?";
    time_t t = (time_t)(node->lease_since_ms / 1000);
    struct tm tm;
    if (node->lease_since_ms && localtime_r(&t, &tm)) strftime(since, sizeof since, "%H:%M", &tm);
    snprintf(buf, cap, "%s serves %s for coordinator %s since %s (epoch %llu); --take to take it over", node->name,
             node->lease_model[0] ? node->lease_model : "a model",
             node->lease_owner[0] ? node->lease_owner : "(unnamed)", since, (unsigned long long)node->lease_epoch);
}

bool cm_lease_foreign(const cm_msg_hello *node, const cm_msg_hello *mine) {
    return node->lease_epoch != 0 && memcmp(node->lease_owner_id, mine->node_id, CM_NODE_ID_BYTES) != 0;
}
