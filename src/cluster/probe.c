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

int cm_probe_nodes(const char *const *addrs, int n, bool insecure, const char *key_file, cm_node_info *out,
                   char *err, size_t errlen) {
    cm_net_cfg cfg;
    int rc = cm_cluster_net_cfg(&cfg, insecure, key_file, err, errlen);
    if (rc) return rc;
    cm_msg_hello me, peer;
    cm_cluster_hello(&me, NULL, 0, 0);
    for (int i = 0; i < n; i++) {
        cm_node_info *o = &out[i];
        memset(o, 0, sizeof *o);
        snprintf(o->addr, sizeof o->addr, "%s", addrs[i]);
        cm_conn *c;
        rc = cm_cluster_dial(addrs[i], &cfg, &me, &c, &peer, o->error, sizeof o->error);
        if (!rc) {
            rc = cm_cluster_measure(c, 1 << 16, &o->rtt_s, &o->bw, o->error, sizeof o->error);
            cm_conn_close(c, "probe done");
        }
        o->status = rc;
        if (rc) continue;
        snprintf(o->name, sizeof o->name, "%s", peer.name);
        o->caps.cores = (int)peer.cores;
        snprintf(o->caps.isa, sizeof o->caps.isa, "%s", peer.isa);
        o->caps.mem_total = peer.mem_total;
        o->caps.mem_free = peer.mem_free;
        snprintf(o->caps.os, sizeof o->caps.os, "%s", peer.os);
        snprintf(o->caps.arch, sizeof o->caps.arch, "%s", peer.arch);
        snprintf(o->caps.version, sizeof o->caps.version, "%s", peer.version);
        o->caps.gflops = peer.gflops;
        o->caps.mem_bw = peer.mem_gbs * 1e9;
    }
    return 0;
}
