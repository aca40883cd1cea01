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
    struct {
        char host[64];
        int conns, unauth;
    } src[CM_NODE_MAX_CONNS];
    uint64_t window_ns; /* refusal log lines: this second's start, lines, lines left out */
    int logged, quiet;
} cm_node_limits;

void cm_node_limits_init(cm_node_limits *l);
void cm_node_limits_release(cm_node_limits *l); /* the mutex; counts must be 0 */
/* A slot for a new connection from host (an address without port): its
 * source index, counted as unauthenticated; or -1 with the reason in why. */
int cm_node_limits_take(cm_node_limits *l, const char *host, char *why, size_t cap);
void cm_node_limits_authenticated(cm_node_limits *l, int src); /* its handshake ended, either way */
void cm_node_limits_put(cm_node_limits *l, int src);           /* the connection is gone */
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
    /* Telemetry (issue 19): token rows the node's stages computed and the
     * time they took (added by node.c after each FORWARD); the thread turns
     * them, the memory in use, the CPU load and the power (RAPL, else an
     * estimate) into the heartbeat's telemetry tail. */
    _Atomic uint64_t rows, busy_ns;
    /* Called at every beat, before the heartbeats go out, on the thread
     * (no lock held): node.c's idle expert-load report. NULL: none. */
    void (*tick)(void *user);
    void *tick_user;
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

/* The node's lease (issue 19, node_lease.c): which coordinator it serves.
 * Taken by a coordinator's ASSIGN, renewed by every frame from it (its
 * heartbeats at least every CM_PIPE_HB_MS), released when its control
 * connection ends, and expired after cm_node_lease_ms() without a frame
 * (a frozen or cut-off coordinator). Thread-safe (its own lock). */
typedef struct cm_node_lease {
    pthread_mutex_t mu;
    pthread_mutex_t *send_mu; /* the node's lock for sends on coordinator connections */
    bool held;
    uint8_t owner_id[CM_NODE_ID_BYTES];
    char owner[CM_MSG_NAME_MAX + 1], model[CM_MSG_NAME_MAX + 1];
    uint64_t epoch, since_ms, renew_ns;
    bool loading; /* the owner's ASSIGN is being loaded: its connection is not read meanwhile */
    cm_conn *ctl; /* the owner's control connection (its thread closes it) */
} cm_node_lease;
/* 3 x the loss bound: longer than any silence of a live coordinator. */
int cm_node_lease_ms(void);
void cm_node_lease_init(cm_node_lease *l, pthread_mutex_t *send_mu);
void cm_node_lease_release(cm_node_lease *l);
/* Copy the lease, if held and not expired, into the HELLO h this node sends. */
void cm_node_lease_hello(cm_node_lease *l, cm_msg_hello *h);
/* A frame from peer: renews the lease when peer is its owner. */
void cm_node_lease_renew(cm_node_lease *l, const cm_msg_hello *peer);
/* An ASSIGN from coordinator peer on connection c. Returns 0 when it may
 * take the node (the lease is then its, epoch a->epoch; *took_over true
 * when another coordinator held it: that one's control connection got BYE
 * with the reason and was shut down, so its coordinator knows at once and
 * its thread ends), or CM_EBUSY with the refusal (for READY) in why.
 * me: this node's HELLO (its name in the text). */
int cm_node_lease_assign(cm_node_lease *l, const cm_msg_hello *me, const cm_msg_hello *peer, cm_conn *c,
                         const cm_msg_assign *a, bool *took_over, char *why, size_t cap);
/* Whether the lease is held through connection c. */
bool cm_node_lease_holds(cm_node_lease *l, const cm_conn *c);
/* "NAME at ADDR" of the owner, for log lines ("?" when none). */
void cm_node_lease_owner(cm_node_lease *l, char *out, size_t cap);
/* The ASSIGN taken by cm_node_lease_assign is loaded (or failed): the
 * silence bound runs again from now. */
void cm_node_lease_loaded(cm_node_lease *l);
/* Connection c ends: the lease is released if c was its owner's. */
void cm_node_lease_conn_end(cm_node_lease *l, cm_conn *c);

#endif
