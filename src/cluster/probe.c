/*
 * probe.c: finding nodes (mDNS browse for _cumulo._tcp) and measuring them
 * from this machine (handshake, HELLO, RTT and bandwidth), for `cumulo nodes`
 * and `--nodes auto`. It only connects and pings; it assigns nothing.
 */
#include "cluster/cluster_int.h"
#include "cluster/mdns.h"

#include "os/os.h"

#include <stdio.h>
#include <string.h>

int cm_discover(double timeout_s, char addrs[][80], int max, char *err, size_t errlen) {
    cm_mdns *m;
    int rc = cm_mdns_open(&m, NULL, err, errlen);
    if (rc) return rc;
    if ((rc = cm_mdns_browse(m, NULL, NULL))) {
        cm_mdns_close(m);
        return cm_errf(err, errlen, rc, "mDNS browse failed");
    }
    double end = cm_now_s() + timeout_s;
    while (cm_now_s() < end) {
        double left = end - cm_now_s();
        rc = cm_mdns_step(m, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (rc) break;
    }
    int n = 0;
    size_t k = cm_mdns_instance_count(m);
    for (size_t i = 0; i < k && n < max; i++) {
        const cm_mdns_instance *in = cm_mdns_instance_at(m, i);
        if (!in->addr[0] || !in->port) continue;
        char a[80];
        snprintf(a, sizeof a, strchr(in->addr, ':') ? "[%s]:%u" : "%s:%u", in->addr, in->port);
        bool dup = false;
        for (int j = 0; j < n; j++) dup |= !strcmp(addrs[j], a);
        if (!dup) snprintf(addrs[n++], 80, "%s", a);
    }
    cm_mdns_close(m);
    return rc < 0 ? rc : n;
}

/* Measure one dialled node (c NULL when its dial failed with rc, e) into o. */
static void probe_one(cm_node_info *o, const char *addr, cm_conn *c, const cm_msg_hello *peer, int rc, const char *e) {
    memset(o, 0, sizeof *o);
    snprintf(o->addr, sizeof o->addr, "%s", addr);
    snprintf(o->error, sizeof o->error, "%s", e);
    if (!rc) {
        rc = cm_cluster_measure(c, 1 << 16, &o->rtt_s, &o->bw, o->error, sizeof o->error);
        cm_conn_close(c, "probe done");
    }
    o->status = rc;
    if (rc) return;
    snprintf(o->name, sizeof o->name, "%s", peer->name);
    o->caps.cores = (int)peer->cores;
    snprintf(o->caps.isa, sizeof o->caps.isa, "%s", peer->isa);
    o->caps.mem_total = peer->mem_total;
    o->caps.mem_free = peer->mem_free;
    snprintf(o->caps.os, sizeof o->caps.os, "%s", peer->os);
    snprintf(o->caps.arch, sizeof o->caps.arch, "%s", peer->arch);
    snprintf(o->caps.version, sizeof o->caps.version, "%s", peer->version);
    o->caps.gflops = peer->gflops;
    o->caps.mem_bw = peer->mem_gbs * 1e9;
}

int cm_probe_nodes(const char *const *addrs, int n, bool insecure, const char *key_file, cm_node_info *out,
                   char *err, size_t errlen) {
    cm_net_cfg cfg;
    int rc = cm_cluster_net_cfg(&cfg, insecure, key_file, err, errlen);
    if (rc) return rc;
    cm_msg_hello me;
    cm_cluster_hello(&me, NULL, 0, 0);
    /* Handshakes all at once (dead or fake addresses cost one deadline in
     * all), then the measurements one at a time (links measured together
     * would share this machine's bandwidth). */
    for (int at = 0; at < n; at += CM_CLUSTER_DIAL_MAX) {
        int k = n - at < CM_CLUSTER_DIAL_MAX ? n - at : CM_CLUSTER_DIAL_MAX;
        char (*a)[80] = cm_calloc((size_t)k, sizeof *a);
        char (*es)[400] = cm_calloc((size_t)k, sizeof *es);
        cm_conn **cs = cm_calloc((size_t)k, sizeof *cs);
        cm_msg_hello *peers = cm_calloc((size_t)k, sizeof *peers);
        int *rcs = cm_calloc((size_t)k, sizeof *rcs);
        rc = a && es && cs && peers && rcs ? 0 : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        if (!rc) {
            for (int i = 0; i < k; i++) snprintf(a[i], sizeof a[i], "%s", addrs[at + i]);
            cm_cluster_dial_many((const char (*)[80])a, k, &cfg, &me, cs, peers, rcs, es);
            for (int i = 0; i < k; i++) probe_one(&out[at + i], addrs[at + i], cs[i], &peers[i], rcs[i], es[i]);
        }
        cm_free(a);
        cm_free(es);
        cm_free(cs);
        cm_free(peers);
        cm_free(rcs);
        if (rc) return rc;
    }
    return 0;
}
