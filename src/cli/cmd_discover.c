/*
 * cmd_discover.c: `cumulo discover` browses the link for _cumulo._tcp nodes
 * over mDNS/DNS-SD and lists them (table or --json); --watch prints add and
 * remove events as they happen. It only listens and queries; it never
 * announces anything.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/mdns.h"
#include "os/os.h"

#include <cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static cJSON *txt_json(const cm_mdns_instance *in) {
    cJSON *o = cJSON_CreateObject();
    size_t i = 0;
    while (i < in->txt_len) {
        size_t l = in->txt[i];
        if (l > in->txt_len - i - 1) break;
        char s[256];
        memcpy(s, in->txt + i + 1, l);
        s[l] = 0;
        char *eq = strchr(s, '=');
        if (eq) *eq = 0;
        if (*s && !cJSON_GetObjectItemCaseSensitive(o, s)) cJSON_AddStringToObject(o, s, eq ? eq + 1 : "");
        i += 1 + l;
    }
    return o;
}

static cJSON *inst_json(const cm_mdns_instance *in, const char *event) {
    cJSON *o = cJSON_CreateObject();
    if (event) cJSON_AddStringToObject(o, "event", event);
    cJSON_AddStringToObject(o, "name", in->name);
    cJSON_AddStringToObject(o, "host", in->host);
    cJSON_AddStringToObject(o, "addr", in->addr);
    cJSON_AddNumberToObject(o, "port", in->port);
    cJSON_AddStringToObject(o, "iface", in->ifname);
    cJSON_AddItemToObject(o, "txt", txt_json(in));
    return o;
}

typedef struct {
    bool json, watch;
} disc_opts;

static void on_event(void *ud, enum cm_mdns_event ev, const cm_mdns_instance *in) {
    const disc_opts *o = ud;
    if (!o->watch) return;
    static const char *names[] = {"add", "update", "remove"};
    if (o->json) {
        cJSON *j = inst_json(in, names[ev]);
        cli_json_print(j, false);
    } else {
        printf("%s '%s' %s:%u\n", names[ev], in->name, in->addr, in->port);
    }
    fflush(stdout);
}

static const char k_discover_usage[] =
    "usage: cumulo discover [--timeout S] [--json] [--watch] [--iface LIST]\n\n"
    "Browse the local network for cumulo nodes (DNS-SD over mDNS, _cumulo._tcp) and\n"
    "list them: name, address, port and TXT capabilities.\n\n"
    "  --timeout S    seconds to browse (default 3)\n"
    "  --json         print a JSON array (with --watch: one JSON object per event)\n"
    "  --watch        print add/update/remove events as they happen\n"
    "  --iface LIST   comma-separated interfaces (default: every multicast-capable one)\n";

int cmd_discover(int argc, char **argv) {
    if (cli_help(argc, argv, k_discover_usage, 0)) return 0;
    double timeout = 3;
    disc_opts o = {false, false};
    const char *ifaces = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--timeout")) {
            if (!cli_float("--timeout", i + 1 < argc ? argv[++i] : NULL, 0.1, 86400, &timeout)) return 2;
        } else if (!strcmp(argv[i], "--json")) o.json = true;
        else if (!strcmp(argv[i], "--watch")) o.watch = true;
        else if (!strcmp(argv[i], "--iface")) {
            if (i + 1 >= argc) return cli_fail("option '--iface' needs a value"), 2;
            ifaces = argv[++i];
        } else return cli_fail("discover: unknown option '%s'; see 'cumulo discover --help'", argv[i]), 2;
    }
    char err[256];
    cm_mdns *m;
    if (cm_mdns_open(&m, ifaces, err, sizeof err) != 0) return cli_fail("%s", err);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    cm_mdns_browse(m, on_event, &o);
    double end = cm_now_s() + timeout;
    while (!g_stop && cm_now_s() < end) {
        int rc = cm_mdns_step(m, 100);
        if (rc) {
            cm_mdns_close(m);
            return cli_fail("mdns: %s", cm_strerror(rc));
        }
    }
    size_t n_seen = cm_mdns_instance_count(m);
    if (n_seen == 0 && (o.json || o.watch)) /* the table says so itself; JSON and events only to stderr */
        fprintf(stderr, "cumulo: no nodes found in %.1f s (is `cumulo node` running, and on this network?)\n", timeout);
    if (!o.watch) {
        size_t n = cm_mdns_instance_count(m);
        if (o.json) {
            cJSON *a = cJSON_CreateArray();
            for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, inst_json(cm_mdns_instance_at(m, i), NULL));
            cli_json_print(a, true);
        } else {
            if (n == 0)
                fprintf(stderr, "cumulo: no nodes found in %.1f s (is `cumulo node` running, and on this network?)\n",
                        timeout);
            for (size_t i = 0; i < n; i++) {
                const cm_mdns_instance *in = cm_mdns_instance_at(m, i);
                char id[64] = "", ver[32] = "", cores[16] = "", mem[24] = "", isa[160] = "";
                cm_mdns_txt_get(in->txt, in->txt_len, "id", id, sizeof id);
                cm_mdns_txt_get(in->txt, in->txt_len, "ver", ver, sizeof ver);
                cm_mdns_txt_get(in->txt, in->txt_len, "cores", cores, sizeof cores);
                cm_mdns_txt_get(in->txt, in->txt_len, "mem", mem, sizeof mem);
                cm_mdns_txt_get(in->txt, in->txt_len, "isa", isa, sizeof isa);
                char ap[80];
                snprintf(ap, sizeof ap, "%s:%u", in->addr, in->port);
                printf("%-24s %-22s id=%s ver=%s cores=%s mem=%s isa=%s\n", in->name, ap, id, ver, cores, mem, isa);
            }
        }
    }
    cm_mdns_close(m);
    return 0;
}
