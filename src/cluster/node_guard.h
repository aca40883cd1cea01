/*
 * node_guard.h: what keeps `cumulo node` (node.c) alive under pressure, kept
 * apart so node.c stays about serving stages: the connection limits that
 * hold against a flood from the LAN, and the heartbeat thread that tells the
 * coordinator this process runs whatever its compute threads wait for.
 * Private to node.c and node_guard.c.
 */
#ifndef CM_NODE_GUARD_H
#define CM_NODE_GUARD_H

#include "cluster/cluster_int.h"

#include <pthread.h>
#include <stdatomic.h>

#define CM_NODE_MAX_CONNS 64        /* connection threads at once */
#define CM_NODE_MAX_UNAUTH 32       /* of them still in their handshake */
#define CM_NODE_MAX_UNAUTH_SOURCE 4 /* ... from one source address */
#define CM_NODE_HANDSHAKE_MS 3000   /* to prove the key and say HELLO */
#define CM_NODE_MAX_HB 8            /* coordinator connections that get our heartbeats */

/* Connection counts, overall and per source address. Thread-safe. */
typedef struct cm_node_limits {
    pthread_mutex_t mu;
    int n_conns, n_unauth;
    struct { char host[64]; int conns, unauth; } src[CM_NODE_MAX_CONNS];
    uint64_t window_ns; /* refusal log lines: this second's start, lines, lines left out */
    int logged, quiet;
} cm_node_limits;

void cm_node_limits_init(cm_node_limits *l);
void cm_node_limits_release(cm_node_limits *l); /* the mutex; counts must be 0 */
/* A slot for a new connection from host (an address without port): its
 * source index, counted as unauthenticated; or -1 with the reason in why. */
int cm_node_limits_take(cm_node_limits *l, const char *host, char *why, size_t cap);
void cm_node_limits_authenticated(cm_node_limits *l, int src); /* its handshake ended, either way */
void cm_node_limits_put(cm_node_limits *l, int src);       /* the connection is gone */
/* Log a refused connection (at most 5 lines a second; the rest are counted
 * into the next line). */
void cm_node_limits_refused(cm_node_limits *l, const char *peer, const char *why);

/* The heartbeat thread: every CM_PIPE_HB_MS a HEARTBEAT (epoch *epoch) on
 * every connection added, sent under *send_mu (the node's lock for sends on
 * coordinator connections). A connection whose send fails is dropped from the
 * list (it is FAILED; its own thread ends it). */
typedef struct cm_node_hb {
    pthread_mutex_t *send_mu;
    _Atomic uint64_t *epoch;
    atomic_int *stop;
    cm_conn *conns[CM_NODE_MAX_HB]; /* under *send_mu */
    pthread_t th;
    bool started;
} cm_node_hb;

/* Start the thread (send_mu, epoch and stop set by the caller); it ends when
 * *stop is set, and cm_node_hb_join waits for it. */
int cm_node_hb_start(cm_node_hb *h);
void cm_node_hb_join(cm_node_hb *h);
/* Add c (idempotent; ignored when full) / remove it: before closing c. */
void cm_node_hb_add(cm_node_hb *h, cm_conn *c);
void cm_node_hb_remove(cm_node_hb *h, cm_conn *c);

#endif
