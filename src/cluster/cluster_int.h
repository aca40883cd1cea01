/*
 * cluster_int.h: what node.c, coord.c and probe.c share and nobody outside
 * src/cluster/ needs: the HELLO of this process, the network configuration
 * (cluster key or --insecure), link measurement over a READY connection.
 * Includes net/proto, so it must never be included next to engine.h.
 */
#ifndef CM_CLUSTER_INT_H
#define CM_CLUSTER_INT_H

#include "cluster/cluster.h"
#include "net/net.h"

#include <pthread.h>

/* Fill a HELLO from the measured capabilities, with a new random node id.
 * roles: CM_ROLE_* bits. */
void cm_cluster_hello(cm_msg_hello *h, const char *name, uint16_t listen_port, uint32_t roles);
/* Load the key (or not, when insecure) into cfg. */
int cm_cluster_net_cfg(cm_net_cfg *cfg, bool insecure, const char *key_file, char *err, size_t errlen);
/* Connect to "host:port" and run the handshake as initiator. */
int cm_cluster_dial(const char *addr, const cm_net_cfg *cfg, const cm_msg_hello *mine, cm_conn **out,
                    cm_msg_hello *peer, char *err, size_t errlen);
/* Dial n addresses at once, one thread each (n <= CM_CLUSTER_DIAL_MAX), so
 * that addresses that never answer (a flood of fake mDNS announcements) cost
 * one connect deadline in all, not one each. out[i] is NULL and rc[i] < 0
 * (reason in err[i]) for each that failed. Peers may be NULL. */
#define CM_CLUSTER_DIAL_MAX 64
void cm_cluster_dial_many(const char (*addrs)[80], int n, const cm_net_cfg *cfg, const cm_msg_hello *mine,
                          cm_conn **out, cm_msg_hello *peers, int *rc, char (*err)[400]);
/* The same, connect and handshake together bounded by timeout_ms. */
int cm_cluster_dial_within(const char *addr, const cm_net_cfg *cfg, const cm_msg_hello *mine, int timeout_ms,
                           cm_conn **out, cm_msg_hello *peer, char *err, size_t errlen);
/* Round trip (minimum of a few empty PINGs) and one-way bandwidth (a PING
 * carrying probe_bytes) on a connection nobody else is receiving on. */
int cm_cluster_measure(cm_conn *c, int probe_bytes, double *rtt_s, double *bw, char *err, size_t errlen);
/* The same within timeout_ms in all (0: each exchange has its own bound). */
int cm_cluster_measure_within(cm_conn *c, int probe_bytes, int timeout_ms, double *rtt_s, double *bw, char *err,
                              size_t errlen);

/* Node to node links (LINKS_REQ / LINKS, docs/PROTOCOL.md).
 * Answering side: dial every peer of q with this node's identity, measure
 * RTT and bandwidth toward it, one peer after the other, all within
 * q->deadline_ms; fills out (one entry per peer; those not reached in time
 * say CM_ETIMEDOUT). Never fails as a whole. */
void cm_cluster_links_measure(const cm_net_cfg *cfg, const cm_msg_hello *mine, const cm_msg_links_req *q,
                              cm_msg_links *out);
/* Asking side: send a LINKS_REQ naming peers[0..n) on c and wait for the
 * LINKS answer (deadline_ms plus a margin for the answer itself). On a
 * connection nobody else receives on; other messages meanwhile are
 * skipped. */
int cm_cluster_links_ask(cm_conn *c, const char *const *peers, int n, int deadline_ms, int probe_bytes,
                         cm_msg_links *out, char *err, size_t errlen);
#define CM_LINKS_DEADLINE_MS 3000      /* per node asked: a dead peer costs at most this */
#define CM_LINKS_PROBE_BYTES (1 << 16) /* the bandwidth probe of every link measurement */

/* Tensor parallel: after cm_coll_mesh_greet, the dialer names the plan's
 * epoch in a PING (id = epoch), so that the node hands the connection to the
 * assignment of that epoch only. */
int cm_tp_greet_epoch(cm_conn *c, uint64_t epoch, char *err, size_t errlen);

/* Ownership (issue 19; node_lease.c): a node serves one coordinator at a
 * time, under a lease that its HELLO shows (lease_epoch != 0). The reason a
 * coordinator leaves such a node out, into buf: "NAME serves MODEL for
 * coordinator OWNER since HH:MM (epoch E); --take to take it over". */
void cm_lease_text(const cm_msg_hello *node, char *buf, size_t cap);
/* Whether node's HELLO says it serves another coordinator than mine. */
bool cm_lease_foreign(const cm_msg_hello *node, const cm_msg_hello *mine);
/* pipe_output.c, the last stage: send the rows of f whose want[] is
 * CM_WANT_HIDDEN (their final hidden state, rows[n][dim] in batch order)
 * back to the coordinator on c (under mu), one OUTPUT per run of one
 * sequence's rows. Compacts rows in place. */
int cm_node_send_hidden(cm_conn *c, pthread_mutex_t *mu, const cm_msg_forward *f, const int8_t *want,
                        const int32_t *pos, const int32_t *seq, float *rows, int n, int dim, char *err, size_t errlen);

#endif
