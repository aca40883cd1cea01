/*
 * server_limits.c: what the server needs from the process around it: a
 * file-descriptor limit that fits its connections, and libmicrohttpd's own
 * messages turned into cumulo's log lines. Never logs a request's content.
 */
#include "http_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

/* libmicrohttpd's own messages, in our log format, at most 5 a second (a
 * flood of refused connections must not flood the log). */
void cm_http_mhd_log(void *cls, const char *fmt, va_list ap) {
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    /* A client that left (or that the header deadline cut off) is routine:
     * debug level (CUMULO_LOG=debug), outside the rate limit. */
    if (strstr(line, "closure") || strstr(line, "no longer available") || strstr(line, "reset by peer") ||
        strstr(line, "application reported internal error")) {
        size_t k = strlen(line);
        while (k && (line[k - 1] == '\n' || line[k - 1] == '.')) line[--k] = 0;
        CM_LOGD("http: %s", line);
        return;
    }
    static atomic_llong sec;
    static atomic_int n_in_sec, n_dropped;
    long long now = (long long)cm_now_s();
    if (atomic_exchange(&sec, now) != now) {
        int d = atomic_exchange(&n_dropped, 0);
        atomic_store(&n_in_sec, 0);
        if (d) CM_LOGW("http: %d more libmicrohttpd messages suppressed", d);
    }
    if (atomic_fetch_add(&n_in_sec, 1) >= 5) {
        atomic_fetch_add(&n_dropped, 1);
        return;
    }
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == ' ' || line[n - 1] == '.')) line[--n] = 0;
    if (n && line[0] >= 'A' && line[0] <= 'Z' && !(line[1] >= 'A' && line[1] <= 'Z'))
        line[0] = (char)(line[0] - 'A' + 'a');
    if (cls && !strncmp(line, "server reached connection limit", 31)) { /* MHD says this for both limits */
        int all, per_ip;
        cm_http_conn_limits(cls, &all, &per_ip);
        snprintf(line, sizeof line,
                 "a connection refused: %d open in all (--max-conns) or %d from its address (--max-per-ip)", all,
                 per_ip);
    }
    CM_LOGW("http: %s", line);
}

/* Every connection is a descriptor: raise the soft limit toward the hard
 * one, and fit max_conns to what we got. */
int cm_http_fit_fd_limit(int want_conns) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return want_conns;
    rlim_t want = (rlim_t)want_conns + 256; /* model files, nodes, logs */
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl)) rl.rlim_cur = old;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        int fit = rl.rlim_cur > 320 ? (int)(rl.rlim_cur - 256) : 64;
        CM_LOGW("http: %d connections need %llu file descriptors, the limit is %llu (ulimit -n); serving %d",
                want_conns, (unsigned long long)want, (unsigned long long)rl.rlim_cur, fit);
        return fit;
    }
    return want_conns;
}
