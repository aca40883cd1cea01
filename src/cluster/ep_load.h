/*
 * ep_load.h: the coordinator's rule for an EXPERT_LOAD report (issue 13;
 * proto.h's cm_msg_expert_load), kept apart as a pure function so that a
 * test can feed it a hostile stage's reports without a cluster. Private to
 * src/cluster (coord_ep.c) and its tests.
 */
#ifndef CM_EP_LOAD_H
#define CM_EP_LOAD_H

#include "cluster/member.h"
#include "proto/proto.h"

#include <stddef.h>

/* Whether the report q, from the node at addr, may be added to the counts
 * of a plan whose machines are mbs[0, n) (the published members, stage
 * order) for a model of n_layer layers of n_expert experts: the sender is
 * rank 0 (member 0) of a later stage (stage >= 1; this machine counts stage
 * 0 itself), its counts name every expert of the model and only layers of
 * that stage. 0, or CM_EPROTO with the reason in why. Pure: no lock, no
 * clock; the caller holds whatever guards mbs. */
int cm_ep_load_check(const cm_cluster_member *mbs, int n, const char *addr, const cm_msg_expert_load *q, int n_layer,
                     int n_expert, char *why, size_t cap);

#endif
