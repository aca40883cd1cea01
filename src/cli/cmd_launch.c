/*
 * cmd_launch.c: `cumulo launch user@host ...` starts `cumulo node` on other
 * machines over SSH (the system's ssh/scp, so ~/.ssh/config, agents and
 * known_hosts apply). For each host: copy this binary when the remote has
 * none (or another version), copy the cluster key through ssh's stdin into a
 * 0600 file (never on a command line), start the node detached, then connect
 * to it and show what it reports. `--stop` ends nodes started this way.
 * Commands run without a local shell (argv vectors); the remote side gets one
 * fixed command line whose only variable parts are quoted.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/cluster.h"
#include "net/net.h"
#include "os/os.h"

#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const char k_usage[] =
    "usage: cumulo launch USER@HOST[:SSHPORT] ... [--port P] [--identity FILE] [--ssh-opt OPT]...\n"
    "                     [--remote-dir DIR] [--key-file FILE] [--insecure] [--models DIR] [--no-mdns] [--stop]\n"
    "\n"
    "Start `cumulo node` on other machines over SSH: copy this binary there when the\n"
    "remote has none (or another version), copy the cluster key (mode 0600), start the\n"
    "node in the background, and check that it answers.\n"
    "\n"
    "  --port P          the nodes' port (default 7070)\n"
    "  --identity FILE   ssh private key (ssh -i)\n"
    "  --ssh-opt OPT     an ssh -o option, e.g. StrictHostKeyChecking=accept-new (repeatable)\n"
    "  --remote-dir DIR  where the binary, key, log and pid go on the remote (default .cumulo)\n"
    "  --models DIR      the remote nodes look for models there\n"
    "  --no-mdns         the nodes do not announce themselves (networks without multicast)\n"
    "  --stop            stop the nodes started by an earlier launch instead\n"
    "\n"
    "Cluster key (copied to every host; with --insecure the nodes run --insecure):\n";

typedef struct launch_opts {
    int port;
    const char *identity, *remote_dir, *key_file, *models;
    const char *ssh_opts[16];
    int n_ssh_opts;
    bool insecure, stop, no_mdns;
} launch_opts;

/* Run argv; stdin from in (n bytes; NULL: /dev/null); stdout (and stderr
 * too when merge_err) into out (cap). */
static int run2(char *const argv[], const char *in, size_t n, char *out, size_t cap, bool merge_err) {
    int pin[2] = {-1, -1}, pout[2] = {-1, -1};
    if (pipe(pin) || pipe(pout)) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    if (merge_err) posix_spawn_file_actions_adddup2(&fa, pout[1], 2);
    posix_spawn_file_actions_addclose(&fa, pin[1]);
    posix_spawn_file_actions_addclose(&fa, pout[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pin[0]);
    close(pout[1]);
    if (rc) {
        close(pin[1]);
        close(pout[0]);
        errno = rc;
        return -1;
    }
    if (in && n) {
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(pin[1], in + done, n - done);
            if (w <= 0) break;
            done += (size_t)w;
        }
    }
    close(pin[1]);
    size_t got = 0;
    char sink[512];
    for (;;) {
        char *dst = out && got + 1 < cap ? out + got : sink;
        size_t room = out && got + 1 < cap ? cap - 1 - got : sizeof sink;
        ssize_t r = read(pout[0], dst, room);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (dst != sink) got += (size_t)r;
    }
    if (out && cap) out[got] = 0;
    close(pout[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run(char *const argv[], const char *in, size_t n, char *out, size_t cap) {
    return run2(argv, in, n, out, cap, false);
}

/* Split "user@host:port" into the ssh destination and port. */
static void split_target(const char *t, char *dest, size_t cap, char *port, char *host, size_t hcap) {
    snprintf(dest, cap, "%s", t);
    port[0] = 0;
    char *colon = strrchr(dest, ':');
    if (colon && !strchr(colon, ']') && strchr(dest, ':') == colon) {
        snprintf(port, 8, "%.7s", colon + 1);
        *colon = 0;
    }
    const char *at = strrchr(dest, '@');
    snprintf(host, hcap, "%s", at ? at + 1 : dest);
}

/* argv for ssh/scp with our options; returns the count (args appended later). */
static int base_args(const char **av, bool scp, const launch_opts *o, const char *port) {
    int n = 0;
    av[n++] = scp ? "scp" : "ssh";
    av[n++] = "-o";
    av[n++] = "BatchMode=yes";
    if (*port) {
        av[n++] = scp ? "-P" : "-p";
        av[n++] = port;
    }
    if (o->identity) {
        av[n++] = "-i";
        av[n++] = o->identity;
    }
    for (int i = 0; i < o->n_ssh_opts; i++) {
        av[n++] = "-o";
        av[n++] = o->ssh_opts[i];
    }
    if (scp) av[n++] = "-q";
    return n;
}

/* Single-quote s for the remote shell. */
static void shq(char *out, size_t cap, const char *s) {
    size_t k = 0;
    if (k + 1 < cap) out[k++] = '\'';
    for (; *s && k + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(out + k, "'\\''", 4);
            k += 4;
        } else out[k++] = *s;
    }
    if (k + 1 < cap) out[k++] = '\'';
    out[k] = 0;
}

static int ssh_cmd2(const launch_opts *o, const char *dest, const char *port, const char *cmd, const char *in, size_t n,
                    char *out, size_t cap, bool merge_err) {
    const char *av[48];
    int k = base_args(av, false, o, port);
    av[k++] = dest;
    av[k++] = cmd;
    av[k] = NULL;
    return run2((char *const *)av, in, n, out, cap, merge_err);
}

static int ssh_cmd(const launch_opts *o, const char *dest, const char *port, const char *cmd, const char *in, size_t n,
                   char *out, size_t cap) {
    return ssh_cmd2(o, dest, port, cmd, in, n, out, cap, false);
}

/* The last non-empty line of s, trimmed, into out: the remote's error line. */
static void last_line(const char *s, char *out, size_t cap) {
    const char *best = NULL;
    size_t bl = 0;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        while (l && (p[l - 1] == '\r' || p[l - 1] == ' ')) l--;
        if (l) {
            best = p;
            bl = l;
        }
        if (!e) break;
        p = e + 1;
    }
    snprintf(out, cap, "%.*s", best ? (int)CM_MIN(bl, cap - 1) : 0, best ? best : "");
}

static int launch_one(const launch_opts *o, const char *target, const char *self, const char *key_hex,
                      cm_node_info *info) {
    char dest[256], port[8], host[260], rd[600], q[700], cmd[8192], out[512];
    split_target(target, dest, sizeof dest, port, host, sizeof host);
    shq(rd, sizeof rd, o->remote_dir);
    if (o->stop) {
        snprintf(cmd, sizeof cmd, "cd && test -f %s/node.pid && kill $(cat %s/node.pid) && rm -f %s/node.pid", rd, rd,
                 rd);
        int rc = ssh_cmd(o, dest, port, cmd, NULL, 0, NULL, 0);
        fprintf(stderr, "%s: %s\n", target, rc ? "no node to stop" : "node stopped");
        return rc ? 1 : 0;
    }
    /* 1. The binary: ours unless the remote has the same version. */
    char ver[64];
    snprintf(ver, sizeof ver, "cumulo %s", CM_VERSION);
    snprintf(cmd, sizeof cmd, "cd && mkdir -p %s && chmod 700 %s && (%s/cumulo version 2>/dev/null || true)", rd, rd,
             rd);
    int rc = ssh_cmd(o, dest, port, cmd, NULL, 0, out, sizeof out);
    if (rc) return cli_fail("%s: ssh failed (exit %d)", target, rc);
    if (!strstr(out, ver)) {
        fprintf(stderr, "%s: copying %s\n", target, self);
        const char *av[48];
        int k = base_args(av, true, o, port);
        char remote[900];
        snprintf(remote, sizeof remote, "%s:%s/cumulo", dest, o->remote_dir);
        av[k++] = self;
        av[k++] = remote;
        av[k] = NULL;
        if ((rc = run((char *const *)av, NULL, 0, NULL, 0))) return cli_fail("%s: scp failed (exit %d)", target, rc);
    } else {
        fprintf(stderr, "%s: %s already there\n", target, ver);
    }
    /* Pre-flight: does the binary run there at all (shared libraries, CPU,
     * loader)? Its own stderr says why not, in a second rather than after
     * the 30 s wait for a node that never started. */
    char pre[1024], line[400];
    snprintf(cmd, sizeof cmd, "cd && %s/cumulo --version", rd);
    rc = ssh_cmd2(o, dest, port, cmd, NULL, 0, pre, sizeof pre, true);
    if (rc || !strstr(pre, ver)) {
        last_line(pre, line, sizeof line);
        return cli_fail(
            "%s: the copied binary does not run there (exit %d): %s%s", target, rc, *line ? line : "no output",
            strstr(pre, "shared librar") ? "\n  install the libraries it names there (Debian: libmicrohttpd12 "
                                           "libcjson1 libsodium23 libpcre2-8-0), or copy a build made on a "
                                           "machine like it"
                                         : "");
    }
    /* 2. The key, through stdin into a 0600 file. */
    if (!o->insecure) {
        snprintf(cmd, sizeof cmd, "cd && umask 077 && cat > %s/cluster.key.tmp && mv %s/cluster.key.tmp %s/cluster.key",
                 rd, rd, rd);
        if ((rc = ssh_cmd(o, dest, port, cmd, key_hex, strlen(key_hex), NULL, 0)))
            return cli_fail("%s: cannot copy the cluster key (exit %d)", target, rc);
    }
    /* 3. Start the node, detached, replacing one we started before. */
    char extra[740] = "";
    if (o->models) {
        shq(q, sizeof q, o->models);
        snprintf(extra, sizeof extra, " --models %s", q);
    }
    if (o->no_mdns) strcat(extra, " --no-mdns");
    snprintf(
        cmd, sizeof cmd,
        /* stop the node we started before and wait (up to 10 s) until it has let go of the port */
        "cd && (if test -f %s/node.pid; then p=$(cat %s/node.pid); kill $p 2>/dev/null; i=0; "
        "while kill -0 $p 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; fi; "
        "nohup %s/cumulo node --port %d --cache %s/cache %s%s%s%s > %s/node.log 2>&1 < /dev/null & echo $! > %s/node.pid)",
        rd, rd, rd, o->port, rd, o->insecure ? "--insecure" : "--key-file ", o->insecure ? "" : rd,
        o->insecure ? "" : "/cluster.key", extra, rd, rd);
    if ((rc = ssh_cmd(o, dest, port, cmd, NULL, 0, NULL, 0)))
        return cli_fail("%s: cannot start the node (exit %d)", target, rc);
    /* 4. Is it there? */
    char addr[260];
    snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, o->port);
    const char *addrs[1] = {addr};
    char err[300];
    /* a node measures its speed before it listens; give a loaded machine 30 s */
    /* Every 2 s, also ask whether the process still lives: a node that
     * exited (port taken, bad key, no memory) shows its log's last line now. */
    snprintf(cmd, sizeof cmd,
             "cd && if kill -0 $(cat %s/node.pid) 2>/dev/null; then echo alive; else tail -n 20 %s/node.log; fi", rd,
             rd);
    /* The first look after 1 s, before any probe: a probe of a port that
     * someone else holds can wait for its handshake timeout. */
    double t_start = cm_now_s(), t_check = t_start - 1.0;
    info->status = -1;
    snprintf(info->error, sizeof info->error, "no answer within 30 s");
    while (cm_now_s() - t_start < 30) {
        cm_sleep_ms(200);
        if (cm_now_s() - t_check >= 2.0) {
            char log[2048], line[400];
            t_check = cm_now_s();
            if (ssh_cmd(o, dest, port, cmd, NULL, 0, log, sizeof log) == 0 && strncmp(log, "alive", 5)) {
                last_line(log, line, sizeof line);
                return cli_fail("%s: the node exited on start: %s (see %s/node.log there)", target,
                                *line ? line : "no log output", o->remote_dir);
            }
        }
        if (cm_now_s() - t_start < 1.0) continue;
        if (cm_probe_nodes(addrs, 1, o->insecure, o->key_file, info, err, sizeof err)) return cli_fail("%s", err);
        if (info->status == 0) break;
    }
    if (info->status) return cli_fail("%s: the node does not answer at %s: %s", target, addr, info->error);
    printf("%s: node '%s' at %s (%d cores, %s, %.1f GiB free; rtt %.3f ms)\n", target, info->name, addr,
           info->caps.cores, info->caps.isa, (double)info->caps.mem_free / (1 << 30), info->rtt_s * 1e3);
    return 0;
}

int cmd_launch(int argc, char **argv) {
    if (cli_help(argc, argv, k_usage, CLI_CLUSTER_LINK)) return 0;
    launch_opts o = {.port = 7070, .remote_dir = ".cumulo"};
    const char *targets[64];
    int nt = 0;
    long l;
    cli_cluster clo = {.accept = CLI_CLUSTER_LINK};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int co = cli_cluster_opt(argc, argv, &i, &clo); /* --insecure, --key-file (clusteropt.c) */
        if (co < 0) return 1;
        if (co) continue;
        if (!strcmp(a, "--stop")) {
            o.stop = true;
            continue;
        }
        if (!strcmp(a, "--no-mdns")) {
            o.no_mdns = true;
            continue;
        }
        if (a[0] != '-') {
            if (nt == 64) return cli_fail("at most 64 hosts");
            targets[nt++] = a;
            continue;
        }
        if (!v) return cli_fail("option '%s' needs a value", a);
        i++;
        if (!strcmp(a, "--port")) {
            if (!cli_int(a, v, 1, 65535, &l)) return 1;
            o.port = (int)l;
        } else if (!strcmp(a, "--identity")) o.identity = v;
        else if (!strcmp(a, "--remote-dir")) o.remote_dir = v;
        else if (!strcmp(a, "--models")) o.models = v;
        else if (!strcmp(a, "--ssh-opt")) {
            if (o.n_ssh_opts == 16) return cli_fail("at most 16 --ssh-opt");
            o.ssh_opts[o.n_ssh_opts++] = v;
        } else return cli_fail("unknown option '%s'; see 'cumulo launch --help'", a);
    }
    o.insecure = clo.insecure;
    o.key_file = clo.key_file;
    if (!nt) return cli_fail("launch needs at least one USER@HOST; see 'cumulo launch --help'");
    char self[PATH_MAX], key_hex[80] = "", err[400];
    if (cli_self_path(self, sizeof self)) return cli_fail("cannot find this program's binary");
    if (!o.insecure && !o.stop) {
        char path[512];
        const char *kf = o.key_file;
        if (!kf) {
            if (cm_net_key_default_path(path, sizeof path, err, sizeof err)) return cli_fail("%s", err);
            kf = path;
        }
        char *txt = NULL;
        size_t n = 0;
        if (cm_file_read_all(kf, &txt, &n, err, sizeof err))
            return cli_fail("no cluster key at '%s' (run `cumulo key`, or use --insecure)", kf);
        snprintf(key_hex, sizeof key_hex, "%.*s", (int)(n < 79 ? n : 79), txt);
        cm_free(txt);
    }
    int status = 0;
    for (int i = 0; i < nt; i++) {
        cm_node_info info;
        if (launch_one(&o, targets[i], self, key_hex, &info)) status = 1;
    }
    return status;
}
