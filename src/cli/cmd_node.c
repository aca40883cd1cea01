/*
 * cmd_node.c: `cumulo node` offers this machine to a cluster (see
 * cluster/cluster.h) until SIGINT/SIGTERM, and `cumulo nodes` lists the nodes
 * found by mDNS or given, measured from here.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/cluster.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static atomic_int g_stop;
static void on_stop(int sig) {
    (void)sig;
    atomic_store(&g_stop, 1);
}

static const char k_node_usage[] =
    "usage: cumulo node [--port P] [--name N] [--cache DIR] [--models DIR] [--join HOST:PORT ...]\n"
    "                   [--threads N] [--mmap] [--insecure] [--key-file FILE] [--bind ADDR] [--no-mdns]\n"
    "                   [--gpu auto|vulkan|none|N] [--gpu-layers K]\n"
    "\n"
    "Offer this machine's cores and memory to a cumulo cluster: listen for the\n"
    "coordinator (`cumulo run --cluster`, `cumulo serve --nodes`), take a pipeline\n"
    "stage, run it. Every peer must know the cluster key (see `cumulo key`).\n"
    "\n"
    "  --port P          TCP port (default 7070; 0 = any free port)\n"
    "  --port-file FILE  write the port chosen to FILE\n"
    "  --name N          name shown to others (default: the host name)\n"
    "  --cache DIR       streamed weights (default ~/.cache/cumulo)\n"
    "  --models DIR      where to look for an assigned model's GGUF (same sha256: mapped from disk);\n"
    "                    default: the models `cumulo pull` keeps ($CUMULO_MODELS or ~/.cache/cumulo/models)\n"
    "  --join HOST:PORT  check the link to a peer at start (repeatable)\n"
    "  --threads N       compute threads (default: all CPUs)\n"
    "  --mmap            keep streamed slices in a file mapping (default: read into huge-page\n"
    "                    memory when they fit, fewer TLB misses per token; also CUMULO_MMAP=1)\n"
    "  --bind ADDR       listen on this address only\n"
    "  --no-mdns         do not announce this node on the local network\n"
    "  --gpu auto|vulkan|none|N  run each stage's first layers on a Vulkan GPU (auto: the first GPU;\n"
    "                    vulkan: any device, lavapipe too; N: device N of 'cumulo info --gpu'): measured at\n"
    "                    start and reported to coordinators, which plan with it; default $CUMULO_GPU, else none\n"
    "  --gpu-layers K    at most K of a stage's layers on it (default: as many as its memory holds)\n"
    "\n"
    "CUMULO_DECLARE_SPEED=GFLOPS,GBS in the environment replaces the measured compute\n"
    "speed and memory bandwidth (equally strong machines in tests).\n"
    "\n"
    "Cluster key:\n";

int cmd_node(int argc, char **argv) {
    if (cli_help(argc, argv, k_node_usage, CLI_CLUSTER_LINK)) return 0;
    cm_node_opts o = {.port = 7070, .mdns = true};
    const char *join[16];
    long l;
    cli_gpu gpuo = {0};
    cli_cluster clo = {.accept = CLI_CLUSTER_LINK};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int go = cli_gpu_opt(argc, argv, &i, &gpuo);         /* --gpu, --gpu-layers (gpuopt.c) */
        if (!go) go = cli_cluster_opt(argc, argv, &i, &clo); /* --insecure, --key-file (clusteropt.c) */
        if (go < 0) return 1;
        if (go) continue;
        if (!strcmp(a, "--no-mdns")) {
            o.mdns = false;
            continue;
        }
        if (!strcmp(a, "--mmap")) {
            o.mmap = true;
            continue;
        }
        if (a[0] != '-') return cli_fail("unexpected argument '%s'; see 'cumulo node --help'", a);
        if (!v) return cli_fail("option '%s' needs a value", a);
        i++;
        if (!strcmp(a, "--port")) {
            if (!cli_int(a, v, 0, 65535, &l)) return 1;
            o.port = (uint16_t)l;
        } else if (!strcmp(a, "--threads")) {
            if (!cli_int(a, v, 1, 1024, &l)) return 1;
            o.n_threads = (int)l;
        } else if (!strcmp(a, "--name")) o.name = v;
        else if (!strcmp(a, "--cache")) o.cache_dir = v;
        else if (!strcmp(a, "--models")) o.models_dir = v;
        else if (!strcmp(a, "--bind")) o.bind = v;
        else if (!strcmp(a, "--port-file")) o.port_file = v;
        else if (!strcmp(a, "--join")) {
            if (o.n_join == (int)CM_ARRAY_LEN(join))
                return cli_fail("at most %d --join peers", (int)CM_ARRAY_LEN(join));
            join[o.n_join++] = v;
        } else return cli_fail("unknown option '%s'; see 'cumulo node --help'", a);
    }
    o.join = join;
    o.insecure = clo.insecure;
    o.key_file = clo.key_file;
    cli_gpu_pick(&gpuo, &o.gpu, &o.gpu_layers);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[512];
    int rc = cm_node_run(&o, &g_stop, err, sizeof err);
    if (rc) return cli_fail("%s", err);
    fprintf(stderr, "cumulo node stopped\n");
    return 0;
}

static const char k_nodes_usage[] =
    "usage: cumulo nodes [--timeout S] [--json] [--nodes HOST:PORT,...] [--no-mdns] [--insecure] [--key-file FILE]\n"
    "\n"
    "List cumulo nodes: those announced on the local network (mDNS) and those given,\n"
    "each with its capabilities and the round trip and bandwidth measured from here,\n"
    "then the links between them as each node measures them (node to node).\n"
    "\n"
    "  --timeout S    seconds to browse mDNS (default 2)\n"
    "  --nodes LIST   also probe these host:port addresses\n"
    "  --no-mdns      do not browse\n"
    "  --json         print a JSON array\n"
    "\n"
    "Cluster key:\n";

/* The exit status of `cumulo nodes`: 1, with a line saying why, when no node
 * answered (none found, or every one unreachable): scripts and health checks
 * must not read "0" as "the cluster is there". */
static int nodes_reachable(const cm_node_info *info, int n, bool mdns, bool given) {
    int up = 0;
    for (int i = 0; i < n; i++) up += info[i].status == 0;
    if (up) return 0;
    if (!n)
        fprintf(stderr, "cumulo: no nodes found (%s%s%s)\n", mdns ? "none announced on mDNS" : "mDNS off",
                given ? "" : ", no --nodes given", mdns ? "; is `cumulo node` running, and on this network?" : "");
    else fprintf(stderr, "cumulo: none of the %d node%s answered\n", n, n == 1 ? "" : "s");
    return 1;
}

int cmd_nodes(int argc, char **argv) {
    if (cli_help(argc, argv, k_nodes_usage, CLI_CLUSTER_LINK)) return 0;
    double timeout = 2;
    bool json = false, mdns = true;
    const char *given = NULL;
    cli_cluster clo = {.accept = CLI_CLUSTER_LINK}; /* --nodes is this command's own: probe these too */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int co = cli_cluster_opt(argc, argv, &i, &clo);
        if (co < 0) return 1;
        if (co) continue;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--no-mdns")) mdns = false;
        else if (!strcmp(a, "--timeout")) {
            if (!cli_float(a, v, 0, 600, &timeout)) return 1;
            i++;
        } else if (!strcmp(a, "--nodes")) {
            if (!v) return cli_fail("option '%s' needs HOST:PORT,HOST:PORT,...", a);
            given = v;
            i++;
        } else return cli_fail("unknown option '%s'; see 'cumulo nodes --help'", a);
    }
    char addrs[64][80];
    bool from_mdns[64] = {0};
    int n = 0;
    char err[512];
    if (given) {
        for (const char *s = given; *s && n < 64;) {
            const char *e = strchr(s, ',');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            if (len && len < 80) {
                memcpy(addrs[n], s, len);
                addrs[n++][len] = 0;
            }
            s += len + (e ? 1 : 0);
        }
    }
    if (mdns) {
        char found[64][80];
        int k = cm_discover(timeout, found, 64, err, sizeof err);
        if (k < 0) fprintf(stderr, "cumulo: mDNS: %s\n", err);
        for (int i = 0; i < k && n < 64; i++) {
            bool dup = false;
            for (int j = 0; j < n; j++) dup |= !strcmp(addrs[j], found[i]);
            if (dup) continue;
            from_mdns[n] = true;
            memcpy(addrs[n++], found[i], 80);
        }
    }
    const char *ptr[64];
    for (int i = 0; i < n; i++) ptr[i] = addrs[i];
    cm_node_info info[64];
    if (n && cm_probe_nodes(ptr, n, clo.insecure, clo.key_file, info, err, sizeof err)) return cli_fail("%s", err);
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; i < n; i++) {
            const cm_node_info *f = &info[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "addr", f->addr);
            cJSON_AddBoolToObject(o, "mdns", from_mdns[i]);
            cJSON_AddBoolToObject(o, "reachable", f->status == 0);
            if (f->status) cJSON_AddStringToObject(o, "error", f->error);
            else {
                cJSON_AddStringToObject(o, "name", f->name);
                cJSON_AddStringToObject(o, "host", f->host);
                if (f->serves[0]) cJSON_AddStringToObject(o, "serves", f->serves);
                else cJSON_AddNullToObject(o, "serves");
                cJSON_AddNumberToObject(o, "cores", f->caps.cores);
                cJSON_AddStringToObject(o, "isa", f->caps.isa);
                cJSON_AddNumberToObject(o, "mem_total", (double)f->caps.mem_total);
                cJSON_AddNumberToObject(o, "mem_free", (double)f->caps.mem_free);
                cJSON_AddStringToObject(o, "os", f->caps.os);
                cJSON_AddStringToObject(o, "arch", f->caps.arch);
                cJSON_AddStringToObject(o, "version", f->caps.version);
                cJSON_AddNumberToObject(o, "gflops", f->caps.gflops);
                cJSON_AddNumberToObject(o, "mem_gbs", f->caps.mem_bw / 1e9);
                if (f->caps.gpu_name[0]) { /* issue 16 */
                    cJSON *g = cJSON_AddObjectToObject(o, "gpu");
                    cJSON_AddStringToObject(g, "name", f->caps.gpu_name);
                    cJSON_AddNumberToObject(g, "mem", (double)f->caps.gpu_mem);
                    cJSON_AddNumberToObject(g, "gbs", f->caps.gpu_bw / 1e9);
                    cJSON_AddNumberToObject(g, "gflops", f->caps.gpu_flops / 1e9);
                    cJSON_AddNumberToObject(g, "layers", f->caps.gpu_layers);
                } else cJSON_AddNullToObject(o, "gpu");
                cJSON_AddNumberToObject(o, "rtt_ms", f->rtt_s * 1e3);
                cJSON_AddNumberToObject(o, "mbytes_per_s", f->bw / 1e6);
                /* node to node, as this node measured them toward each other node */
                cJSON *lk = cJSON_AddArrayToObject(o, "links");
                for (int j = 0; j < n && j < CM_NODE_LINKS_MAX; j++) {
                    const cm_node_link *nl = &f->links[j];
                    if (!nl->asked) continue;
                    cJSON *jl = cJSON_CreateObject();
                    cJSON_AddStringToObject(jl, "to", info[j].addr);
                    cJSON_AddBoolToObject(jl, "measured", nl->status == 0);
                    if (nl->status) cJSON_AddStringToObject(jl, "error", cm_strerror(nl->status));
                    else {
                        cJSON_AddNumberToObject(jl, "rtt_ms", nl->rtt_s * 1e3);
                        cJSON_AddNumberToObject(jl, "mbytes_per_s", nl->bw / 1e6);
                    }
                    cJSON_AddItemToArray(lk, jl);
                }
            }
            cJSON_AddItemToArray(arr, o);
        }
        cli_json_print(arr, true);
        return nodes_reachable(info, n, mdns, given != NULL);
    }
    if (!n) return nodes_reachable(info, n, mdns, given != NULL);
    /* The ISA string ("avx512 (avx2,fma,f16c,avx512f,...)") goes last, whole:
     * cutting it hid the very features a mixed cluster differs in. */
    printf("%-22s %-16s %5s %9s %9s %8s %-14s %9s %10s  %s\n", "address", "name", "cores", "mem free", "GFLOP/s",
           "GB/s", "os/arch", "rtt ms", "MB/s", "isa");
    for (int i = 0; i < n; i++) {
        const cm_node_info *f = &info[i];
        if (f->status) {
            printf("%-22s unreachable: %s\n", f->addr, f->error);
            continue;
        }
        char osa[40];
        snprintf(osa, sizeof osa, "%s/%s", f->caps.os, f->caps.arch);
        printf("%-22s %-16.16s %5d %8.1fG %9.1f %8.1f %-14s %9.3f %10.1f  %s%s\n", f->addr, f->name, f->caps.cores,
               (double)f->caps.mem_free / (1 << 30), f->caps.gflops, f->caps.mem_bw / 1e9, osa, f->rtt_s * 1e3,
               f->bw / 1e6, f->caps.isa, from_mdns[i] ? " (mdns)" : "");
        if (f->caps.gpu_name[0]) { /* issue 16: a stage's first layers run there */
            char most[48] = "";
            if (f->caps.gpu_layers > 0) snprintf(most, sizeof most, ", at most %d layers", f->caps.gpu_layers);
            printf("%-22s gpu: %s, %.2f GiB, %.2f GB/s, %.1f GFLOP/s%s\n", "", f->caps.gpu_name,
                   (double)f->caps.gpu_mem / (1 << 30), f->caps.gpu_bw / 1e9, f->caps.gpu_flops / 1e9, most);
        }
        if (f->serves[0]) printf("%-22s busy: %s\n", "", f->serves);
    }
    int rc_reach = nodes_reachable(info, n, mdns, given != NULL);
    /* Node to node: row = the measuring node, column = the peer; rtt ms / MB/s. */
    bool any = false;
    for (int i = 0; i < n && i < CM_NODE_LINKS_MAX; i++)
        for (int j = 0; j < n && j < CM_NODE_LINKS_MAX; j++) any |= info[i].links[j].asked;
    if (!any) return rc_reach;
    printf("\nlinks node to node (row measured toward column: rtt ms / MB/s):\n%-22s", "from \\ to");
    for (int j = 0; j < n && j < CM_NODE_LINKS_MAX; j++) printf(" %-22s", info[j].addr);
    printf("\n");
    for (int i = 0; i < n && i < CM_NODE_LINKS_MAX; i++) {
        printf("%-22s", info[i].addr);
        for (int j = 0; j < n && j < CM_NODE_LINKS_MAX; j++) {
            const cm_node_link *nl = &info[i].links[j];
            char cell[64];
            if (i == j) snprintf(cell, sizeof cell, "-");
            else if (!nl->asked) snprintf(cell, sizeof cell, "not measured");
            else if (nl->status) snprintf(cell, sizeof cell, "failed: %s", cm_strerror(nl->status));
            else snprintf(cell, sizeof cell, "%.3f / %.1f", nl->rtt_s * 1e3, nl->bw / 1e6);
            printf(" %-22.22s", cell);
        }
        printf("\n");
    }
    return rc_reach;
}
