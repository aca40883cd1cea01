/*
 * cmd_announce.c: `cumulo announce --name N --port P` publishes this machine
 * as a _cumulo._tcp DNS-SD service over mDNS until Ctrl-C, then says goodbye.
 * A test aid until `cumulo node` exists (which will run the same responder).
 * It opens no TCP port: it only advertises the one it is given.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/mdns.h"
#include "os/os.h"
#include "proto/proto.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static const char *isa_name(void) {
    const cm_cpu_features *f = cm_cpu_features_get();
    if (f->x86_avx512f) return "avx512";
    if (f->x86_avx2) return "avx2";
    if (f->arm_neon) return "neon";
    return "scalar";
}

static const char k_announce_usage[] =
    "usage: cumulo announce --port P [--name N] [--id HEX] [--iface LIST] [--ttl S]\n\n"
    "Announce this machine as a cumulo node (DNS-SD _cumulo._tcp over mDNS) until\n"
    "Ctrl-C, then send goodbyes. Prints 'announced NAME' once probing succeeds (the\n"
    "name gets ' (2)' appended when another node already uses it).\n\n"
    "  --name N       instance name (default: the host name)\n"
    "  --port P       port advertised in the SRV record\n"
    "  --id HEX       node id for TXT id= (default: random)\n"
    "  --iface LIST   comma-separated interfaces (default: every multicast-capable one)\n"
    "  --ttl S        TTL of SRV and A records (default 120)\n";

int cmd_announce(int argc, char **argv) {
    if (cli_help(argc, argv, k_announce_usage, 0)) return 0;
    char host[64] = "cumulo";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    const char *name = host, *id = NULL, *ifaces = NULL;
    long port = -1, ttl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--port")) {
            if (!cli_int(a, v, 1, 65535, &port)) return 2;
            i++;
        } else if (!strcmp(a, "--ttl")) {
            if (!cli_int(a, v, 1, 86400, &ttl)) return 2;
            i++;
        } else if (!strcmp(a, "--name") || !strcmp(a, "--id") || !strcmp(a, "--iface")) {
            if (!v) return cli_fail("option '%s' needs a value", a), 2;
            if (a[2] == 'n') name = v;
            else if (a[3] == 'd') id = v;
            else ifaces = v;
            i++;
        } else return cli_fail("announce: unknown option '%s'; see 'cumulo announce --help'", a), 2;
    }
    if (port < 0) return cli_fail("announce: --port is required (the port to advertise, e.g. --port 7070)"), 2;
    char idbuf[17];
    if (!id) {
        cm_rng r;
        cm_rng_seed(&r, cm_now_ns() ^ ((uint64_t)getpid() << 32) ^ cm_wall_ms());
        snprintf(idbuf, sizeof idbuf, "%016llx", (unsigned long long)cm_rng_next(&r));
        id = idbuf;
    }
    char cores[16], mem[32], os[48];
    snprintf(cores, sizeof cores, "cores=%d", cm_cpu_count());
    snprintf(mem, sizeof mem, "mem=%llu", (unsigned long long)(cm_mem_total_bytes() >> 20));
    snprintf(os, sizeof os, "os=%s/%s", cm_os_name(), cm_arch_name());
    char isa[32];
    snprintf(isa, sizeof isa, "isa=%s", isa_name());
    cm_mdns_service svc = {.name = name,
                           .port = (uint16_t)port,
                           .node_id = id,
                           .proto_version = CM_PROTO_VERSION,
                           .txt_extra = {cores, mem, isa, os},
                           .n_txt_extra = 4,
                           .ttl_host = (uint32_t)ttl};
    char err[256];
    cm_mdns *m;
    if (cm_mdns_open(&m, ifaces, err, sizeof err) != 0) return cli_fail("%s", err);
    if (cm_mdns_announce(m, &svc, err, sizeof err) != 0) {
        cm_mdns_close(m);
        return cli_fail("%s", err);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    bool told = false;
    char last[CM_MDNS_LABEL_MAX + 1] = "";
    while (!g_stop) {
        int rc = cm_mdns_step(m, 100);
        if (rc) {
            cm_mdns_close(m);
            return cli_fail("mdns: %s", cm_strerror(rc));
        }
        bool up = cm_mdns_is_announced(m);
        if (up && (!told || strcmp(last, cm_mdns_current_name(m)))) {
            snprintf(last, sizeof last, "%s", cm_mdns_current_name(m));
            printf("announced %s\n", last);
            fflush(stdout);
            told = true;
        }
    }
    cm_mdns_close(m); /* goodbyes */
    return 0;
}
