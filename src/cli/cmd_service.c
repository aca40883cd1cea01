/*
 * cmd_service.c: `cumulo service install|uninstall|print node|serve`: run
 * the node (or a server) as a service that starts at boot and restarts
 * after a failure: a systemd unit on Linux (system-wide or --user), a
 * launchd property list on macOS (LaunchDaemons or --user LaunchAgents).
 * The unit runs this very binary (its absolute path) with the options
 * given after `--`; `print` shows the unit's text without changing anything.
 *
 * CUMULO_SERVICE_ROOT=DIR writes every file under DIR instead of / (for
 * packaging and tests) and never calls systemctl or launchctl.
 */
#include "cli.h"

#include "base/base.h"
#include "os/os.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const char k_usage[] =
    "usage: cumulo service install|uninstall|print node|serve [--user] [--run-as USER] [--no-start]\n"
    "                     [-- OPTIONS for cumulo node / cumulo serve MODEL ...]\n"
    "\n"
    "Run `cumulo node` (or `cumulo serve`) as a service that starts at boot and restarts after a\n"
    "failure: a systemd unit on Linux, a launchd job on macOS.\n"
    "\n"
    "  install        write the unit, enable it and start it now\n"
    "  uninstall      stop and disable it, delete the unit\n"
    "  print          show the unit install would write (nothing is changed)\n"
    "  --user         a service of this user (systemctl --user, ~/Library/LaunchAgents) instead of\n"
    "                 a system one (/etc/systemd/system, /Library/LaunchDaemons: run as root)\n"
    "  --run-as USER  the account a system service runs as (default: $SUDO_USER, else you); its\n"
    "                 home holds the cluster key (~/.config/cumulo/cluster.key) and the caches\n"
    "  --no-start     write (and on Linux enable) the unit without starting it\n"
    "  -- OPTIONS     passed to the command, e.g.  -- --name shelf1 --port 7070\n"
    "                 or for serve:  -- org/repo:Q4_K_M --nodes auto --port 8080\n"
    "\n"
    "examples:\n"
    "  sudo cumulo service install node -- --name $(hostname -s)\n"
    "  cumulo service install serve --user -- ~/models/m.gguf --nodes auto --host 0.0.0.0\n"
    "  journalctl -u cumulo-node -f        (Linux: the service's log)\n"
    "\n"
    "CUMULO_SERVICE_ROOT=DIR writes under DIR instead of / and starts nothing (packaging, tests).\n";

typedef struct svc {
    const char *action, *role, *run_as;
    bool user, no_start, mac;
    const char *root; /* "" or CUMULO_SERVICE_ROOT */
    char exe[PATH_MAX], path[1200], home[512];
    const char *args[64];
    int n_args;
} svc;

/* One argument for systemd's ExecStart: quoted when it must be, with %
 * and $ (systemd's specifiers and variables) escaped. */
static void sd_arg(cm_buf *b, const char *a) {
    bool plain = *a != 0;
    for (const char *p = a; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '"' || *p == '\'' || *p == '\\' || *p == ';') plain = false;
    if (!plain) cm_buf_append(b, "\"", 1);
    for (const char *p = a; *p; p++) {
        if (*p == '%') cm_buf_append(b, "%%", 2);
        else if (*p == '$') cm_buf_append(b, "$$", 2);
        else if (*p == '"' || *p == '\\') {
            cm_buf_append(b, "\\", 1);
            cm_buf_append(b, p, 1);
        } else cm_buf_append(b, p, 1);
    }
    if (!plain) cm_buf_append(b, "\"", 1);
}

static void xml_text(cm_buf *b, const char *a) {
    for (const char *p = a; *p; p++) {
        if (*p == '&') cm_buf_printf(b, "&amp;");
        else if (*p == '<') cm_buf_printf(b, "&lt;");
        else if (*p == '>') cm_buf_printf(b, "&gt;");
        else cm_buf_append(b, p, 1);
    }
}

static void systemd_unit(const svc *s, cm_buf *b) {
    cm_buf_printf(b,
                  "# written by `cumulo service install %s`; remove with `cumulo service uninstall %s%s`\n"
                  "[Unit]\n"
                  "Description=cumulo %s (%s)\n"
                  "After=network-online.target\n"
                  "Wants=network-online.target\n"
                  "\n"
                  "[Service]\n"
                  "Type=simple\n",
                  s->role, s->role, s->user ? " --user" : "", s->role,
                  !strcmp(s->role, "node") ? "offers this machine to a cluster"
                                           : "OpenAI-compatible API and dashboard");
    if (!s->user && s->run_as && strcmp(s->run_as, "root")) cm_buf_printf(b, "User=%s\n", s->run_as);
    cm_buf_printf(b, "ExecStart=");
    sd_arg(b, s->exe);
    cm_buf_printf(b, " %s", s->role);
    for (int i = 0; i < s->n_args; i++) {
        cm_buf_append(b, " ", 1);
        sd_arg(b, s->args[i]);
    }
    cm_buf_printf(b,
                  "\n"
                  "Restart=on-failure\n"
                  "RestartSec=3\n"
                  "# a stop is SIGTERM, on which cumulo finishes cleanly\n"
                  "KillSignal=SIGTERM\n"
                  "TimeoutStopSec=20\n"
                  "NoNewPrivileges=yes\n"
                  "PrivateTmp=yes\n"
                  "ProtectSystem=full\n"
                  "LimitNOFILE=65536\n"
                  "\n"
                  "[Install]\n"
                  "WantedBy=%s\n",
                  s->user ? "default.target" : "multi-user.target");
}

static void launchd_plist(const svc *s, cm_buf *b) {
    cm_buf_printf(b,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" "
                  "\"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n"
                  "<!-- written by `cumulo service install %s`; remove with `cumulo service uninstall %s%s` -->\n"
                  "<plist version=\"1.0\">\n<dict>\n"
                  "  <key>Label</key>\n  <string>org.cumulo.%s</string>\n"
                  "  <key>ProgramArguments</key>\n  <array>\n    <string>",
                  s->role, s->role, s->user ? " --user" : "", s->role);
    xml_text(b, s->exe);
    cm_buf_printf(b, "</string>\n    <string>%s</string>\n", s->role);
    for (int i = 0; i < s->n_args; i++) {
        cm_buf_printf(b, "    <string>");
        xml_text(b, s->args[i]);
        cm_buf_printf(b, "</string>\n");
    }
    cm_buf_printf(b, "  </array>\n");
    if (!s->user && s->run_as && strcmp(s->run_as, "root")) {
        cm_buf_printf(b, "  <key>UserName</key>\n  <string>");
        xml_text(b, s->run_as);
        cm_buf_printf(b, "</string>\n");
    }
    cm_buf_printf(b, "  <key>RunAtLoad</key>\n  <true/>\n"
                     "  <key>KeepAlive</key>\n  <dict>\n    <key>SuccessfulExit</key>\n    <false/>\n  </dict>\n"
                     "  <key>ThrottleInterval</key>\n  <integer>3</integer>\n"
                     "  <key>StandardErrorPath</key>\n  <string>");
    if (s->user) xml_text(b, s->home); /* ~/Library/Logs, or /Library/Logs for a daemon */
    cm_buf_printf(b, "/Library/Logs/cumulo-%s.log</string>\n</dict>\n</plist>\n", s->role);
}

/* Where the unit goes (under CUMULO_SERVICE_ROOT when set). */
static int unit_path(svc *s) {
    int w;
    if (s->mac) {
        if (s->user)
            w = snprintf(s->path, sizeof s->path, "%s%s/Library/LaunchAgents/org.cumulo.%s.plist", s->root, s->home,
                         s->role);
        else w = snprintf(s->path, sizeof s->path, "%s/Library/LaunchDaemons/org.cumulo.%s.plist", s->root, s->role);
    } else if (s->user) {
        const char *xdg = cm_config_get()->xdg_config_home;
        if (xdg && !*s->root) w = snprintf(s->path, sizeof s->path, "%s/systemd/user/cumulo-%s.service", xdg, s->role);
        else
            w = snprintf(s->path, sizeof s->path, "%s%s/.config/systemd/user/cumulo-%s.service", s->root, s->home,
                         s->role);
    } else {
        w = snprintf(s->path, sizeof s->path, "%s/etc/systemd/system/cumulo-%s.service", s->root, s->role);
    }
    return w < 0 || (size_t)w >= sizeof s->path ? -1 : 0;
}

/* Run a command (argv), its output passed through; the exit status or -1. */
static int run_cmd(const char *const *argv) {
    pid_t pid;
    if (posix_spawnp(&pid, argv[0], NULL, NULL, (char *const *)argv, environ)) return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* systemctl [--user] VERB cumulo-ROLE.service, or launchctl; a failure says what to run by hand. */
static int manage(const svc *s, const char *verb) {
    char unit[64];
    snprintf(unit, sizeof unit, "cumulo-%s.service", s->role);
    int rc;
    const char *hand;
    if (s->mac) {
        const char *av[] = {"launchctl", verb, "-w", s->path, NULL};
        rc = run_cmd(av);
        hand = "launchctl";
    } else {
        const char *av[6];
        int k = 0;
        av[k++] = "systemctl";
        if (s->user) av[k++] = "--user";
        av[k++] = verb;
        if (strcmp(verb, "daemon-reload")) { /* enable --now / disable --now */
            av[k++] = "--now";
            av[k++] = unit;
        }
        av[k] = NULL;
        rc = run_cmd(av);
        hand = "systemctl";
    }
    if (rc != 0)
        fprintf(stderr, "cumulo: %s %s %s %s (exit %d)%s\n", hand, s->user && !s->mac ? "--user" : "", verb,
                s->mac ? s->path : unit, rc, rc < 0 ? ": not found (is this a systemd/launchd system?)" : "");
    return rc;
}

int cmd_service(int argc, char **argv) {
    for (int k = 1; k < argc && strcmp(argv[k], "--"); k++) /* a --help after -- is the command's */
        if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h")) {
            fputs(k_usage, stdout);
            return 0;
        }
    const cm_config *cfg = cm_config_get();
    svc s = {.root = cfg->service_root};
    s.mac = !strcmp(cm_os_name(), "darwin");
    const char *kind = cfg->service_kind; /* tests: the other system's file */
    if (kind) s.mac = !strcmp(kind, "launchd");
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "--user")) s.user = true;
        else if (!strcmp(a, "--no-start")) s.no_start = true;
        else if (!strcmp(a, "--run-as")) {
            if (i + 1 >= argc) return cli_fail("option '--run-as' needs a user name");
            s.run_as = argv[++i];
        } else if (a[0] == '-') return cli_fail("unknown option '%s'; see 'cumulo service --help'", a);
        else if (!s.action) s.action = a;
        else if (!s.role) s.role = a;
        else
            return cli_fail("unexpected '%s': options for the %s go after '--' (see 'cumulo service --help')", a,
                            s.role);
    }
    for (; i < argc; i++) {
        if (s.n_args == (int)CM_ARRAY_LEN(s.args)) return cli_fail("too many options after '--'");
        s.args[s.n_args++] = argv[i];
    }
    if (!s.action || !s.role)
        return cli_fail("service needs an action and a role: cumulo service install node (see --help)");
    if (strcmp(s.action, "install") && strcmp(s.action, "uninstall") && strcmp(s.action, "print"))
        return cli_fail("service: '%s' is not install, uninstall or print", s.action);
    if (strcmp(s.role, "node") && strcmp(s.role, "serve"))
        return cli_fail("service: '%s' is not node or serve", s.role);
    if (!strcmp(s.role, "serve") && strcmp(s.action, "uninstall")) {
        bool model = false;
        for (int k = 0; k < s.n_args; k++)
            if (s.args[k][0] != '-' && (k == 0 || s.args[k - 1][0] != '-' || !strncmp(s.args[k - 1], "--no-", 5)))
                model = true;
        if (!model)
            return cli_fail(
                "service for serve needs its MODEL after '--': cumulo service install serve -- MODEL.gguf [options]");
    }
    /* who runs it, and their home */
    if (!s.user && !s.run_as) {
        const char *su = cfg->sudo_user;
        struct passwd *pw = su ? getpwnam(su) : getpwuid(getuid());
        if (pw) s.run_as = strdup(pw->pw_name);
    }
    struct passwd *pw = s.user ? getpwuid(getuid()) : s.run_as ? getpwnam(s.run_as) : NULL;
    if (!s.user && s.run_as && !pw) return cli_fail("service: no user '%s' on this machine (--run-as)", s.run_as);
    const char *home = s.user && cfg->home ? cfg->home : pw ? pw->pw_dir : cfg->home;
    snprintf(s.home, sizeof s.home, "%s", home ? home : "");
    if (cli_self_path(s.exe, sizeof s.exe)) return cli_fail("service: cannot find this program's own path");
    /* a model file given relative to here must still be found by the service */
    static char absmodel[1400];
    for (int k = 0; k < s.n_args && !strcmp(s.role, "serve"); k++) {
        struct stat sb;
        if (s.args[k][0] != '-' && s.args[k][0] != '/' && !stat(s.args[k], &sb) && S_ISREG(sb.st_mode) &&
            realpath(s.args[k], absmodel)) {
            s.args[k] = absmodel;
            break;
        }
    }
    if (unit_path(&s)) return cli_fail("service: path too long");
    cm_buf b;
    cm_buf_init(&b);
    if (s.mac) launchd_plist(&s, &b);
    else systemd_unit(&s, &b);
    int rc = 0;
    char err[512];
    if (!strcmp(s.action, "print")) {
        fwrite(b.data, 1, b.len, stdout);
    } else if (!strcmp(s.action, "install")) {
        if (cm_mkdir_p(s.path, 0755, true) || cm_file_write_atomic(s.path, b.data, b.len, 0644, err, sizeof err)) {
            rc = cli_fail("service: cannot write %s (%s)%s", s.path, errno ? strerror(errno) : err,
                          !s.user && geteuid() ? "; a system service needs root: sudo cumulo service ..., or --user"
                                               : "");
        } else {
            fprintf(stderr, "wrote %s\n", s.path);
            if (!*s.root && !s.no_start) {
                if (s.mac) rc = manage(&s, "load") ? 1 : 0;
                else rc = manage(&s, "daemon-reload") || manage(&s, "enable") ? 1 : 0;
                if (!rc)
                    fprintf(stderr, "cumulo %s is running as a service%s\n", s.role,
                            s.mac    ? ""
                            : s.user ? " (journalctl --user -u cumulo-NAME)"
                                     : " (journalctl -u cumulo-NAME)");
            } else if (!*s.root && !s.mac) {
                rc = manage(&s, "daemon-reload") ? 1 : 0;
            }
        }
    } else { /* uninstall */
        if (access(s.path, F_OK)) rc = cli_fail("service: %s is not installed (no %s)", s.role, s.path);
        else {
            if (!*s.root) {
                if (s.mac) manage(&s, "unload");
                else manage(&s, "disable");
            }
            if (unlink(s.path)) rc = cli_fail("service: cannot delete %s: %s", s.path, strerror(errno));
            else {
                fprintf(stderr, "removed %s\n", s.path);
                if (!*s.root && !s.mac) manage(&s, "daemon-reload");
            }
        }
    }
    cm_buf_release(&b);
    return rc;
}
