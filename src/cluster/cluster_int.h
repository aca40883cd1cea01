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

/* Fill a HELLO from the measured capabilities, with a new random node id.
 * roles: CM_ROLE_* bits. */
void cm_cluster_hello(cm_msg_hello *h, const char *name, uint16_t listen_port, uint32_t roles);
/* Load the key (or not, when insecure) into cfg. */
int cm_cluster_net_cfg(cm_net_cfg *cfg, bool insecure, const char *key_file, char *err, size_t errlen);
/* Connect to "host:port" and run the handshake as initiator. */
int cm_cluster_dial(const char *addr, const cm_net_cfg *cfg, const cm_msg_hello *mine, cm_conn **out,
                    cm_msg_hello *peer, char *err, size_t errlen);
/* Round trip (minimum of a few empty PINGs) and one-way bandwidth (a PING
 * carrying probe_bytes) on a connection nobody else is receiving on. */
int cm_cluster_measure(cm_conn *c, int probe_bytes, double *rtt_s, double *bw, char *err, size_t errlen);

/* Tensor parallel: after cm_coll_mesh_greet, the dialer names the plan's
 * epoch in a PING (id = epoch), so that the node hands the connection to the
 * assignment of that epoch only. */
int cm_tp_greet_epoch(cm_conn *c, uint64_t epoch, char *err, size_t errlen);

#endif
