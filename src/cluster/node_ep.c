/*
 * node_ep.c: a stage node's share of the expert load the coordinator
 * measures (issue 13). The coordinator's own context counts only the layers
 * of stage 0; rank 0 of every later stage sends EXPERT_LOAD: how many
 * (token, slot) assignments its router sent to each expert of each of its
 * layers since its previous report (proto.h), at most once per
 * CM_PIPE_HB_MS, after a FORWARD or from the heartbeat thread when idle, so
 * the counts the coordinator re-plans hot-expert replicas by cover every
 * layer. The counts are the model's (cm_ctx_expert_hits_layer): nothing is
 * estimated here, and nothing is sent when nothing new was routed. Must
 * never block compute for long: one small message per report.
 */
#include "cluster/node_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

void cm_node_expert_report(stage *s) {
    const int nx = s->m.hp.n_expert;
    const int l0 = (int)s->as.layer_begin, l1 = (int)s->as.layer_end;
    if (nx <= 0 || nx > (int)CM_MSG_MAX_EXPERTS || s->as.stage == 0 || s->as.tp_rank != 0 || !s->ctx || l1 <= l0 ||
        !s->coord || s->ep_failed)
        return;
    const uint64_t now = cm_now_ns();
    if (s->ep_report_ns && now - s->ep_report_ns < (uint64_t)CM_PIPE_HB_MS * 1000000ull) return;
    s->ep_report_ns = now;
    const size_t nc = (size_t)(l1 - l0) * (size_t)nx;
    if (!s->ep_sent && !(s->ep_sent = cm_calloc(nc, sizeof *s->ep_sent))) return;
    if (!s->ep_delta && !(s->ep_delta = cm_calloc(nc, sizeof *s->ep_delta))) return;
    uint64_t h[CM_MSG_MAX_EXPERTS];
    bool any = false;
    for (int l = l0; l < l1; l++) {
        if (cm_ctx_expert_hits_layer(s->ctx, l, h, nx) != nx) return;
        for (int e = 0; e < nx; e++) {
            const size_t i = (size_t)(l - l0) * (size_t)nx + (size_t)e;
            uint64_t d = h[e] > s->ep_sent[i] ? h[e] - s->ep_sent[i] : 0;
            if (d > UINT32_MAX) d = UINT32_MAX; /* the rest goes in the next report */
            s->ep_delta[i] = (uint32_t)d;
            s->ep_sent[i] += d;
            any |= d > 0;
        }
    }
    if (!any) return;
    const int per = (int)(CM_MSG_MAX_EXPERT_CELLS / (unsigned)nx); /* layers per message */
    for (int a = l0; a < l1; a += per) {
        cm_msg m = {.type = CM_MSG_EXPERT_LOAD};
        m.u.expert_load = (cm_msg_expert_load){.epoch = s->as.epoch,
                                               .layer_begin = (uint32_t)a,
                                               .n_layers = (uint16_t)(l1 - a < per ? l1 - a : per),
                                               .n_expert = (uint16_t)nx,
                                               .counts = s->ep_delta + (size_t)(a - l0) * (size_t)nx};
        char e[300];
        pthread_mutex_lock(s->csend_mu);
        int rc = cm_conn_send(s->coord, &m, 5000, e, sizeof e);
        pthread_mutex_unlock(s->csend_mu);
        if (rc) { /* the connection's own thread sees it fail too; stop trying on this stage */
            CM_LOGW("expert load report to the coordinator: %s", e);
            s->ep_failed = true;
            return;
        }
    }
}
