/*
 * net.c: TCP connections, whole frames with deadlines, and the handshake state
 * machine (NEW -> READY, or FAILED). It must never wait without a deadline,
 * never allocate a frame's declared length before the bytes arrive (a lying
 * header costs at most one growth step), never hand the layers above a frame
 * that proto did not open, and never keep using a stream after an error left
 * it out of step.
 */
#include "net.h"

#include "base/base.h"
#include "os/os.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define RX_STEP (1u << 20)  /* the rx buffer grows at most this far ahead of the bytes received */
#define SPIN_KEEP_NS 50000u /* a spinning receive keeps its core this long before it yields */

struct cm_listener {
    int fd;
    uint16_t port;
};

struct cm_conn {
    int fd;
    _Atomic enum cm_conn_state state; /* written by the receiving thread, read by senders (usable) */
    cm_chan s;
    int stall_ms;     /* sends give up after this long without progress (0: never) */
    uint64_t spin_ns; /* receives poll the socket this long before sleeping in poll() (0: never) */
    char peer[64];
    uint8_t *rx, *tx;
    size_t rx_cap, tx_cap;
    uint64_t seal_ns, open_ns; /* time in cm_frame_seal / cm_frame_open (sender's / receiver's thread) */
    /* Traffic counters: whole frames on the wire (header + payload + MAC), by
     * type. The sender's thread writes tx_*, the receiver's rx_*; readers on
     * other threads see relaxed snapshots. */
    _Atomic uint64_t tx_bytes[CM_MSG_COUNT], tx_frames[CM_MSG_COUNT];
    _Atomic uint64_t rx_bytes[CM_MSG_COUNT], rx_frames[CM_MSG_COUNT];
};

/* ---- small helpers ---- */

static uint64_t deadline_after(int timeout_ms) {
    if (timeout_ms <= 0) timeout_ms = 1;
    return cm_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* Wait for events on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, uint64_t deadline) {
    for (;;) {
        uint64_t now = cm_now_ns();
        if (now >= deadline) return 0;
        uint64_t ms = (deadline - now + 999999) / 1000000;
        struct pollfd pfd = {fd, events, 0};
        int r = poll(&pfd, 1, ms > 60000 ? 60000 : (int)ms);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        port = ntohs(a->sin_port);
        snprintf(out, cap, "%s:%u", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        port = ntohs(a->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) snprintf(out, cap, "%s:%u", host + 7, port); /* "::ffff:1.2.3.4" */
        else snprintf(out, cap, "[%s]:%u", host, port);
    } else if (sa->sa_family == AF_UNIX) { /* a transport provider's peer: the name it bound, else "local" */
        const struct sockaddr_un *u = (const struct sockaddr_un *)sa;
        const char *base = u->sun_path[0] ? strrchr(u->sun_path, '/') : NULL;
        snprintf(out, cap, "%.60s", base && base[1] ? base + 1 : "local");
    } else {
        snprintf(out, cap, "?");
    }
}

/* Record a failure: message "peer ADDR <what>", a warning in the log, state FAILED. */
static int conn_fail(cm_conn *c, int code, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int conn_fail(cm_conn *c, int code, char *err, size_t errlen, const char *fmt, ...) {
    char what[600], msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* "sent a frame with a bad MAC" and "the peer does not know ..." read as one sentence. */
    const char *w = !strncmp(what, "the peer ", 9) ? what + 9 : what;
    bool sentence = w != what || !strncmp(w, "sent ", 5) || !strncmp(w, "closed ", 7) || !strncmp(w, "did ", 4) ||
                    !strncmp(w, "refused ", 8) || !strncmp(w, "has ", 4) || !strncmp(w, "stalled ", 8) ||
                    !strncmp(w, "took ", 5);
    snprintf(msg, sizeof msg, "peer %s%s%s", c->peer, sentence ? " " : ": ", w);
    cm_log(code == CM_ETIMEDOUT || code == CM_ECLOSED ? CM_LOG_INFO : CM_LOG_WARN, "%s; connection dropped", msg);
    if (c->state != CM_CONN_CLOSED) c->state = CM_CONN_FAILED;
    return cm_errf(err, errlen, code, "%s", msg);
}

static int set_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static cm_conn *conn_new(int fd, const struct sockaddr *sa) {
    cm_conn *c = cm_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    c->state = CM_CONN_NEW;
    cm_chan_init(&c->s);
    format_addr(sa, c->peer, sizeof c->peer);
    return c;
}

int cm_net_parse_addr(const char *s, uint16_t default_port, char *host, size_t hostcap, uint16_t *port, char *err,
                      size_t errlen) {
    const char *h = s, *p = NULL;
    size_t hl;
    if (!s || !*s) return cm_errf(err, errlen, CM_EINVAL, "empty address");
    if (s[0] == '[') {
        const char *e = strchr(s, ']');
        if (!e) return cm_errf(err, errlen, CM_EINVAL, "bad address '%s': missing ']'", s);
        h = s + 1;
        hl = (size_t)(e - h);
        if (e[1] == ':') p = e + 2;
        else if (e[1]) return cm_errf(err, errlen, CM_EINVAL, "bad address '%s'", s);
    } else {
        const char *c1 = strchr(s, ':');
        if (c1 && !strchr(c1 + 1, ':')) {
            hl = (size_t)(c1 - s);
            p = c1 + 1;
        } else hl = strlen(s); /* no colon, or a bare IPv6 address */
    }
    if (hl == 0 || hl >= hostcap) return cm_errf(err, errlen, CM_EINVAL, "bad address '%s': host", s);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = default_port;
    if (p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (!*p || *end || v < 1 || v > 65535)
            return cm_errf(err, errlen, CM_EINVAL, "bad address '%s': port must be 1-65535", s);
        *port = (uint16_t)v;
    }
    return 0;
}

/* ---- listen / accept / connect ---- */

static const cm_net_transport *g_transport; /* set once at start (cm_net_set_transport) */
void cm_net_set_transport(const cm_net_transport *t) { g_transport = t; }
static bool transport_claims(const char *host) { return g_transport && host && !strcmp(host, g_transport->host); }

/* A provider's stream socket as a connection named "HOST:PORT". */
static int transport_conn(int fd, uint16_t port, cm_conn **out, char *err, size_t errlen) {
    struct sockaddr sa = {.sa_family = AF_UNIX};
    if (cm_sock_prepare(fd) != 0 || !(*out = conn_new(fd, &sa))) {
        close(fd);
        return cm_errf(err, errlen, CM_EIO, "cannot set up a %s link", g_transport->host);
    }
    snprintf((*out)->peer, sizeof(*out)->peer, "%s:%u", g_transport->host, (unsigned)port);
    return 0;
}

int cm_net_listen(const char *host, uint16_t port, cm_listener **out, char *err, size_t errlen) {
    *out = NULL;
    if (transport_claims(host)) {
        cm_listener *l = cm_calloc(1, sizeof *l);
        if (!l) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        int rc = g_transport->listen(g_transport->ctx, port, &l->fd, &l->port, err, errlen);
        if (rc) {
            cm_free(l);
            return rc;
        }
        *out = l;
        return 0;
    }
    bool any = !host || !*host || !strcmp(host, "*");
    char pstr[8];
    snprintf(pstr, sizeof pstr, "%u", (unsigned)port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    hints.ai_family = any ? AF_INET6 : AF_UNSPEC;
    int gai = getaddrinfo(any ? NULL : host, pstr, &hints, &res);
    if (gai && any) { /* no IPv6 here: fall back to IPv4 */
        hints.ai_family = AF_INET;
        gai = getaddrinfo(NULL, pstr, &hints, &res);
    }
    if (gai) return cm_errf(err, errlen, CM_EINVAL, "cannot listen on '%s': %s", any ? "*" : host, gai_strerror(gai));
    int last = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6 && any) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (cm_sock_prepare(fd) == 0 && bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            getsockname(fd, (struct sockaddr *)&ss, &sl);
            cm_listener *l = cm_calloc(1, sizeof *l);
            if (!l) {
                close(fd);
                freeaddrinfo(res);
                return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
            }
            l->fd = fd;
            l->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                    : ((struct sockaddr_in6 *)&ss)->sin6_port);
            freeaddrinfo(res);
            *out = l;
            return 0;
        }
        last = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (any && hints.ai_family == AF_INET6) /* a kernel without IPv6 sockets: IPv4 only */
        return cm_net_listen("0.0.0.0", port, out, err, errlen);
    return cm_errf(err, errlen, CM_EIO, "cannot listen on %s port %u: %s", any ? "*" : host, (unsigned)port,
                   strerror(last));
}

uint16_t cm_listener_port(const cm_listener *l) { return l->port; }
int cm_listener_fd(const cm_listener *l) { return l->fd; }

void cm_listener_close(cm_listener *l) {
    if (!l) return;
    close(l->fd);
    cm_free(l);
}

int cm_listener_accept(cm_listener *l, int timeout_ms, cm_conn **out, char *err, size_t errlen) {
    *out = NULL;
    uint64_t deadline = deadline_after(timeout_ms);
    for (;;) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss); /* an unnamed Unix peer fills in no path */
        socklen_t sl = sizeof ss;
        int fd = accept(l->fd, (struct sockaddr *)&ss, &sl);
        if (fd >= 0) {
            if (cm_sock_prepare(fd) != 0 || (ss.ss_family != AF_UNIX && set_nodelay(fd) != 0)) {
                int e = errno;
                close(fd);
                return cm_errf(err, errlen, CM_EIO, "cannot set up an accepted socket: %s", strerror(e));
            }
            *out = conn_new(fd, (struct sockaddr *)&ss);
            if (!*out) {
                close(fd);
                return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
            }
            return 0;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return cm_errf(err, errlen, CM_EIO, "accept failed: %s", strerror(errno));
        int w = wait_fd(l->fd, POLLIN, deadline);
        if (w == 0) return cm_errf(err, errlen, CM_ETIMEDOUT, "no peer connected within %d ms", timeout_ms);
        if (w < 0) return cm_errf(err, errlen, CM_EIO, "poll failed: %s", strerror(errno));
    }
}

int cm_net_connect(const char *host, uint16_t port, int timeout_ms, cm_conn **out, char *err, size_t errlen) {
    *out = NULL;
    if (transport_claims(host)) {
        int fd = -1, rc = g_transport->connect(g_transport->ctx, port, timeout_ms, &fd, err, errlen);
        return rc ? rc : transport_conn(fd, port, out, err, errlen);
    }
    char pstr[8];
    snprintf(pstr, sizeof pstr, "%u", (unsigned)port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    /* NEEDSWORK: getaddrinfo has no deadline; names are resolved before the clock starts. */
    int gai = getaddrinfo(host, pstr, &hints, &res);
    if (gai) return cm_errf(err, errlen, CM_EINVAL, "cannot resolve '%s': %s", host, gai_strerror(gai));
    uint64_t deadline = deadline_after(timeout_ms);
    char why[160] = "no address";
    int code = CM_EIO;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM, 0);
        if (fd < 0 || cm_sock_prepare(fd) != 0) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            if (fd >= 0) close(fd);
            continue;
        }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) r = 0;
            else if (w == 0) {
                snprintf(why, sizeof why, "no answer within %d ms", timeout_ms);
                code = CM_ETIMEDOUT;
            } else {
                snprintf(why, sizeof why, "%s", strerror(soerr ? soerr : errno));
                code = CM_EIO;
            }
        } else if (r != 0) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            code = CM_EIO;
        }
        if (r == 0 && set_nodelay(fd) == 0) {
            *out = conn_new(fd, ai->ai_addr);
            freeaddrinfo(res);
            if (!*out) {
                close(fd);
                return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
            }
            return 0;
        }
        close(fd);
        if (code == CM_ETIMEDOUT) break;
    }
    freeaddrinfo(res);
    return cm_errf(err, errlen, code, "cannot connect to %s port %u: %s", host, (unsigned)port, why);
}

/* ---- bytes with deadlines ---- */

static int write_all(cm_conn *c, const uint8_t *p, size_t n, uint64_t deadline, char *err, size_t errlen) {
    size_t done = 0;
    /* Two clocks: the call's deadline, and (stall_ms) the time since the peer
     * last took a byte: progress resets the second one only. */
    uint64_t stall_ns = c->stall_ms > 0 ? (uint64_t)c->stall_ms * 1000000ull : 0;
    uint64_t moved = cm_now_ns();
    while (done < n) {
        long w = cm_sock_send(c->fd, p + done, n - done);
        if (w > 0) {
            done += (size_t)w;
            moved = cm_now_ns();
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            uint64_t d = stall_ns && moved + stall_ns < deadline ? moved + stall_ns : deadline;
            int r = wait_fd(c->fd, POLLOUT, d);
            if (r == 1) continue;
            if (r == 0 && d < deadline)
                return conn_fail(c, CM_ETIMEDOUT, err, errlen,
                                 "took none of our data for %d ms (%zu of %zu bytes sent; frozen or overloaded?)",
                                 c->stall_ms, done, n);
            if (r == 0)
                return conn_fail(c, CM_ETIMEDOUT, err, errlen, "did not take our data in time (%zu of %zu bytes sent)",
                                 done, n);
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            c->state = CM_CONN_CLOSED;
            return cm_errf(err, errlen, CM_ECLOSED, "peer %s closed the connection", c->peer);
        }
        return conn_fail(c, CM_EIO, err, errlen, "send failed: %s", strerror(errno));
    }
    return 0;
}

/* Read exactly n bytes into p. *got counts progress so the caller can tell a
 * quiet line (0 bytes) from a stall mid-frame. */
static int read_exact(cm_conn *c, uint8_t *p, size_t n, size_t *got, uint64_t deadline) {
    uint64_t spin_start = 0, spin_end = 0; /* set at the first empty read: spin until then, then sleep */
    while (*got < n) {
        ssize_t r = recv(c->fd, p + *got, n - *got, 0);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) return CM_ECLOSED;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (c->spin_ns) { /* a fast link: the bytes are microseconds away; a sleep costs a wake-up */
                uint64_t now = cm_now_ns();
                if (!spin_end) {
                    spin_start = now;
                    spin_end = CM_MIN(now + c->spin_ns, deadline);
                }
                if (now < spin_end) {
                    for (int i = 0; i < 32; i++) cm_cpu_relax();
                    /* Past the first SPIN_KEEP_NS, yield on every try: a
                     * peer on this core gets it at once. Not before: on a
                     * busy machine a yield hands the core to another
                     * process for a whole time slice, while the bytes are
                     * usually microseconds away (the thread pool's barrier
                     * spins as long before it yields). */
                    if (now - spin_start >= SPIN_KEEP_NS) cm_thread_yield();
                    continue;
                }
            }
            int w = wait_fd(c->fd, POLLIN, deadline);
            if (w == 1) continue;
            if (w == 0) return CM_ETIMEDOUT;
        }
        return errno == ECONNRESET ? CM_ECLOSED : CM_EIO;
    }
    return 0;
}

static bool ensure(uint8_t **buf, size_t *cap, size_t need) {
    if (*cap >= need) return true;
    uint8_t *nb = cm_realloc(*buf, need);
    if (!nb) return false;
    *buf = nb;
    *cap = need;
    return true;
}

static int usable(cm_conn *c, bool need_ready, char *err, size_t errlen) {
    if (c->state == CM_CONN_FAILED) return cm_errf(err, errlen, CM_ESTATE, "connection to %s failed earlier", c->peer);
    if (c->state == CM_CONN_CLOSED) return cm_errf(err, errlen, CM_ECLOSED, "connection to %s is closed", c->peer);
    if (need_ready && c->state != CM_CONN_READY)
        return cm_errf(err, errlen, CM_ESTATE, "connection to %s has not finished its handshake", c->peer);
    return 0;
}

/* Seal the payload sitting at c->tx + CM_FRAME_HDR and send it. */
static int send_sealed(cm_conn *c, unsigned type, size_t n, uint64_t deadline, char *err, size_t errlen) {
    size_t len;
    char e[256];
    uint64_t t0 = cm_now_ns();
    int rc = cm_frame_seal(&c->s, type, c->tx, n, c->tx_cap, &len, e, sizeof e);
    c->seal_ns += cm_now_ns() - t0;
    if (rc) return cm_errf(err, errlen, rc, "cannot send to %s: %s", c->peer, e);
    rc = write_all(c, c->tx, len, deadline, err, errlen);
    if (!rc && type < CM_MSG_COUNT) {
        atomic_fetch_add_explicit(&c->tx_bytes[type], len, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->tx_frames[type], 1, memory_order_relaxed);
    }
    return rc;
}

static int send_payload(cm_conn *c, unsigned type, const uint8_t *p, size_t n, uint64_t deadline, char *err,
                        size_t errlen) {
    if (!ensure(&c->tx, &c->tx_cap, cm_chan_overhead(&c->s) + n))
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for a %zu-byte frame", n);
    if (n) memcpy(c->tx + CM_FRAME_HDR, p, n);
    return send_sealed(c, type, n, deadline, err, errlen);
}

static int send_msg(cm_conn *c, const cm_msg *m, uint64_t deadline, char *err, size_t errlen) {
    size_t n;
    int rc = cm_msg_encode(m, NULL, 0, &n, err, errlen);
    if (rc) return rc;
    if (!ensure(&c->tx, &c->tx_cap, cm_chan_overhead(&c->s) + n))
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for a %zu-byte frame", n);
    rc = cm_msg_encode(m, c->tx + CM_FRAME_HDR, c->tx_cap - CM_FRAME_HDR, &n, err, errlen);
    if (rc) return rc;
    return send_sealed(c, m->type, n, deadline, err, errlen);
}

/* A peer of another protocol version, before the handshake: tell it why in a
 * frame of its own version (proto.h: what a refusal needs never changes), when
 * nothing was sent on this connection yet (a listener's first frame), then
 * fail with the same words from this side. */
static int refuse_version(cm_conn *c, unsigned v, uint64_t deadline, char *err, size_t errlen) {
    char theirs[300], mine[300], e2[64];
    uint8_t f[CM_FRAME_HDR + 1024];
    size_t n;
    cm_proto_mismatch_text(theirs, sizeof theirs, v, CM_PROTO_VERSION);
    cm_proto_mismatch_text(mine, sizeof mine, CM_PROTO_VERSION, v);
    if (c->s.tx_seq == 0 && cm_frame_refusal(v, CM_EUNSUPPORTED, theirs, f, sizeof f, &n, e2, sizeof e2) == 0)
        write_all(c, f, n, CM_MIN(deadline, cm_now_ns() + 200000000ull), e2, sizeof e2);
    return conn_fail(c, CM_EUNSUPPORTED, err, errlen, "%s", mine);
}

static int recv_frame(cm_conn *c, cm_frame_hdr *h, uint8_t **payload, uint64_t deadline, int timeout_ms, char *err,
                      size_t errlen) {
    size_t got = 0;
    char e[300];
    if (!ensure(&c->rx, &c->rx_cap, CM_FRAME_HDR + CM_FRAME_MAC + 256))
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int rc = read_exact(c, c->rx, CM_FRAME_HDR, &got, deadline);
    if (rc == CM_ETIMEDOUT && got == 0)
        return cm_errf(err, errlen, CM_ETIMEDOUT, "no frame from %s within %d ms", c->peer, timeout_ms);
    if (rc == CM_ECLOSED && got == 0) {
        c->state = CM_CONN_CLOSED;
        return cm_errf(err, errlen, CM_ECLOSED, "peer %s closed the connection", c->peer);
    }
    if (rc) goto io_error;
    rc = cm_frame_hdr_decode(c->rx, CM_FRAME_HDR, h, e, sizeof e);
    unsigned v;
    if (rc && !c->s.established && cm_frame_hdr_version(c->rx, CM_FRAME_HDR, &v) && v != CM_PROTO_VERSION)
        return refuse_version(c, v, deadline, err, errlen);
    if (!rc) rc = cm_chan_check_hdr(&c->s, h, e, sizeof e);
    if (rc) return conn_fail(c, rc, err, errlen, "%s", e);
    size_t need = CM_FRAME_HDR + (size_t)h->len + ((h->flags & CM_FRAME_F_MAC) ? CM_FRAME_MAC : 0);
    while (got < need) { /* grow with the bytes that actually arrive, not with the claim */
        size_t want = CM_MIN(need, CM_MAX(c->rx_cap, got + RX_STEP));
        if (!ensure(&c->rx, &c->rx_cap, want))
            return conn_fail(c, CM_ENOMEM, err, errlen, "out of memory for a %zu-byte frame", need);
        rc = read_exact(c, c->rx, want, &got, deadline);
        if (rc) goto io_error;
    }
    uint64_t t0 = cm_now_ns();
    rc = cm_frame_open(&c->s, c->rx, need, h, payload, e, sizeof e);
    c->open_ns += cm_now_ns() - t0;
    if (rc) return conn_fail(c, rc, err, errlen, "%s", e);
    if (h->type < CM_MSG_COUNT) {
        atomic_fetch_add_explicit(&c->rx_bytes[h->type], need, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->rx_frames[h->type], 1, memory_order_relaxed);
    }
    return 0;
io_error:
    if (rc == CM_ETIMEDOUT)
        return conn_fail(c, rc, err, errlen, "stalled mid-frame (%zu bytes received, %d ms deadline)", got, timeout_ms);
    if (rc == CM_ECLOSED) {
        c->state = CM_CONN_CLOSED;
        return cm_errf(err, errlen, CM_ECLOSED, "peer %s closed the connection mid-frame", c->peer);
    }
    return conn_fail(c, rc, err, errlen, "receive failed: %s", strerror(errno));
}

/* ---- handshake ---- */

/* Tell the peer why we refuse it (plaintext ERROR, best effort), then fail. */
static int refuse(cm_conn *c, int code, const char *why, uint64_t deadline, char *err, size_t errlen) {
    cm_msg m = {.type = CM_MSG_ERROR};
    m.u.error.code = code;
    snprintf(m.u.error.text, sizeof m.u.error.text, "%s", why);
    char e2[64];
    uint64_t d = CM_MIN(deadline, cm_now_ns() + 200000000ull);
    if (c->state != CM_CONN_FAILED && c->state != CM_CONN_CLOSED) send_msg(c, &m, d, e2, sizeof e2);
    return conn_fail(c, code, err, errlen, "%s", why);
}

/* Receive one handshake frame of the expected type; an ERROR from the peer is its refusal. */
static int hs_recv(cm_conn *c, unsigned want, const uint8_t **p, size_t *n, uint64_t deadline, int timeout_ms,
                   char *err, size_t errlen) {
    cm_frame_hdr h;
    uint8_t *pl;
    int rc = recv_frame(c, &h, &pl, deadline, timeout_ms, err, errlen);
    if (rc == CM_ECLOSED)
        return conn_fail(c, CM_ECLOSED, err, errlen,
                         "closed the connection during the handshake (a different cluster key, a cumulo "
                         "older than protocol %d, which closes without a reason, or not a cumulo node?)",
                         CM_PROTO_VERSION);
    if (rc == CM_ETIMEDOUT && c->state != CM_CONN_FAILED)
        return conn_fail(c, rc, err, errlen, "did not finish the handshake within %d ms", timeout_ms);
    if (rc) return rc;
    if (h.type == CM_MSG_ERROR) {
        cm_msg m;
        char e[128];
        if (cm_msg_decode(CM_MSG_ERROR, pl, h.len, &m, e, sizeof e) != 0)
            return conn_fail(c, CM_EPROTO, err, errlen, "refused the handshake (%s)", e);
        int code = m.u.error.code < 0 && m.u.error.code > -CM_ERR_COUNT_ ? m.u.error.code : CM_EPROTO;
        return conn_fail(c, code, err, errlen, "refused the handshake: %s", m.u.error.text);
    }
    if (h.type != want)
        return refuse(c, CM_EPROTO, "sent an unexpected frame during the handshake", deadline, err, errlen);
    *p = pl;
    *n = h.len;
    return 0;
}

static int hs_auth(cm_conn *c, bool initiator, const cm_net_cfg *cfg, uint64_t deadline, int ms, char *err,
                   size_t errlen) {
    cm_hs hs;
    uint8_t buf[CM_HS_REPLY_BYTES];
    const uint8_t *p;
    size_t n, len;
    char e[300];
    int rc = cm_hs_init(&hs, initiator, cfg->mode, cfg->mode == CM_SEC_INSECURE ? NULL : cfg->key, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "%s", e);
    if (initiator) {
        if ((rc = cm_hs_write_init(&hs, buf, sizeof buf, &len, e, sizeof e)) != 0 ||
            (rc = send_payload(c, CM_MSG_AUTH_INIT, buf, len, deadline, err, errlen)) != 0 ||
            (rc = hs_recv(c, CM_MSG_AUTH_REPLY, &p, &n, deadline, ms, err, errlen)) != 0)
            goto out;
        int proof = cm_hs_read_reply(&hs, p, n, e, sizeof e);
        if (proof && !(proof == CM_EAUTH && hs.keys_ready)) {
            rc = refuse(c, proof, e, deadline, err, errlen);
            goto out;
        }
        if (hs.keys_ready) { /* send our proof even when theirs failed: both sides then refuse */
            if ((rc = cm_hs_write_finish(&hs, buf, sizeof buf, &len, e, sizeof e)) != 0 ||
                (rc = send_payload(c, CM_MSG_AUTH_FINISH, buf, len, deadline, err, errlen)) != 0)
                goto out;
        }
        if (proof) {
            rc = conn_fail(c, proof, err, errlen, "%s", e);
            goto out;
        }
    } else {
        if ((rc = hs_recv(c, CM_MSG_AUTH_INIT, &p, &n, deadline, ms, err, errlen)) != 0) goto out;
        if ((rc = cm_hs_read_init(&hs, p, n, e, sizeof e)) != 0) {
            rc = refuse(c, rc, e, deadline, err, errlen);
            goto out;
        }
        if ((rc = cm_hs_write_reply(&hs, buf, sizeof buf, &len, e, sizeof e)) != 0) {
            rc = refuse(c, rc, e, deadline, err, errlen);
            goto out;
        }
        if ((rc = send_payload(c, CM_MSG_AUTH_REPLY, buf, len, deadline, err, errlen)) != 0) goto out;
        if (cfg->mode != CM_SEC_INSECURE) {
            if ((rc = hs_recv(c, CM_MSG_AUTH_FINISH, &p, &n, deadline, ms, err, errlen)) != 0) goto out;
            if ((rc = cm_hs_read_finish(&hs, p, n, e, sizeof e)) != 0) {
                rc = conn_fail(c, rc, err, errlen, "%s", e);
                goto out;
            }
        }
    }
    rc = cm_hs_finish(&hs, &c->s, e, sizeof e);
    if (rc) rc = conn_fail(c, rc, err, errlen, "%s", e);
out:
    cm_hs_wipe(&hs);
    return rc;
}

int cm_conn_handshake(cm_conn *c, bool initiator, const cm_net_cfg *cfg, const cm_msg_hello *mine, cm_msg_hello *peer,
                      char *err, size_t errlen) {
    if (c->state != CM_CONN_NEW)
        return cm_errf(err, errlen, CM_ESTATE, "connection to %s: handshake already run", c->peer);
    int ms = cfg->handshake_ms > 0 ? cfg->handshake_ms : CM_NET_HANDSHAKE_MS;
    uint64_t deadline = deadline_after(ms);
    c->stall_ms = cfg->send_stall_ms > 0 ? cfg->send_stall_ms : 0;
    int rc = hs_auth(c, initiator, cfg, deadline, ms, err, errlen);
    if (rc) return rc;
    /* Authenticated: exchange HELLOs (the initiator speaks first). */
    cm_msg me = {.type = CM_MSG_HELLO}, them;
    me.u.hello = *mine;
    me.u.hello.proto_version = CM_PROTO_VERSION;
    char e[300];
    for (int turn = 0; turn < 2; turn++) {
        if ((turn == 0) == initiator) {
            rc = send_msg(c, &me, deadline, err, errlen);
            if (rc) {
                if (c->state == CM_CONN_NEW) c->state = CM_CONN_FAILED;
                return rc;
            }
            continue;
        }
        cm_frame_hdr h;
        uint8_t *pl;
        rc = recv_frame(c, &h, &pl, deadline, ms, err, errlen);
        if (rc == CM_ECLOSED)
            return conn_fail(c, rc, err, errlen, "closed the connection after the key exchange (it refused our key?)");
        if (rc == CM_ETIMEDOUT && c->state != CM_CONN_FAILED)
            return conn_fail(c, rc, err, errlen, "sent no HELLO within %d ms", ms);
        if (rc) return rc;
        if (h.type == CM_MSG_ERROR && cm_msg_decode(h.type, pl, h.len, &them, e, sizeof e) == 0)
            return conn_fail(c, CM_EPROTO, err, errlen, "refused us: %s", them.u.error.text);
        if (h.type != CM_MSG_HELLO)
            return refuse(c, CM_EPROTO, "sent something other than HELLO after the key exchange", deadline, err,
                          errlen);
        if ((rc = cm_msg_decode(h.type, pl, h.len, &them, e, sizeof e)) != 0)
            return refuse(c, rc, e, deadline, err, errlen);
        if (them.u.hello.proto_version != CM_PROTO_VERSION) {
            snprintf(e, sizeof e, "sent a HELLO of protocol version %u (expected %d)",
                     (unsigned)them.u.hello.proto_version, CM_PROTO_VERSION);
            return refuse(c, CM_EUNSUPPORTED, e, deadline, err, errlen);
        }
        if (!memcmp(them.u.hello.node_id, mine->node_id, CM_NODE_ID_BYTES))
            return refuse(c, CM_EPROTO, "has this node's own id (a node connected to itself?)", deadline, err, errlen);
    }
    if (peer) *peer = them.u.hello;
    c->state = CM_CONN_READY;
    CM_LOGI("connected to %s (%s, %s)", c->peer, them.u.hello.name, cm_sec_mode_name(c->s.mode));
    return 0;
}

/* ---- messages ---- */

int cm_conn_send(cm_conn *c, const cm_msg *m, int timeout_ms, char *err, size_t errlen) {
    int rc = usable(c, true, err, errlen);
    return rc ? rc : send_msg(c, m, deadline_after(timeout_ms), err, errlen);
}

int cm_conn_send_payload(cm_conn *c, unsigned type, const uint8_t *payload, size_t n, int timeout_ms, char *err,
                         size_t errlen) {
    int rc = usable(c, true, err, errlen);
    return rc ? rc : send_payload(c, type, payload, n, deadline_after(timeout_ms), err, errlen);
}

uint8_t *cm_conn_tx_payload(cm_conn *c, size_t n) {
    if (!ensure(&c->tx, &c->tx_cap, cm_chan_overhead(&c->s) + n)) return NULL;
    return c->tx + CM_FRAME_HDR;
}

int cm_conn_send_tx(cm_conn *c, unsigned type, size_t n, int timeout_ms, char *err, size_t errlen) {
    int rc = usable(c, true, err, errlen);
    if (rc) return rc;
    if (!c->tx || cm_chan_overhead(&c->s) + n > c->tx_cap)
        return cm_errf(err, errlen, CM_EINVAL, "a %zu-byte payload to %s was not prepared", n, c->peer);
    return send_sealed(c, type, n, deadline_after(timeout_ms), err, errlen);
}

void cm_conn_cipher_ns(const cm_conn *c, uint64_t *seal_ns, uint64_t *open_ns) {
    *seal_ns = c->seal_ns;
    *open_ns = c->open_ns;
}

int cm_conn_recv_payload(cm_conn *c, unsigned *type, const uint8_t **payload, size_t *n, int timeout_ms, char *err,
                         size_t errlen) {
    int rc = usable(c, true, err, errlen);
    if (rc) return rc;
    cm_frame_hdr h;
    uint8_t *pl;
    rc = recv_frame(c, &h, &pl, deadline_after(timeout_ms), timeout_ms, err, errlen);
    if (rc) return rc;
    *type = h.type;
    *payload = pl;
    *n = h.len;
    if (h.type == CM_MSG_BYE) {
        c->state = CM_CONN_CLOSED;
        CM_LOGI("peer %s said goodbye", c->peer);
    }
    return 0;
}

int cm_conn_recv(cm_conn *c, cm_msg *m, int timeout_ms, char *err, size_t errlen) {
    unsigned type;
    const uint8_t *p;
    size_t n;
    char e[300];
    int rc = cm_conn_recv_payload(c, &type, &p, &n, timeout_ms, err, errlen);
    if (rc) return rc;
    rc = cm_msg_decode(type, p, n, m, e, sizeof e);
    /* The frame was authentic, so the peer holds the key: a malformed payload is
     * a bug or version skew there, and the stream is still in step — but we
     * refuse to guess, and fail the connection. */
    if (rc) return conn_fail(c, rc, err, errlen, "sent a %s", e);
    return 0;
}

void cm_conn_close(cm_conn *c, const char *reason) {
    if (!c) return;
    if (c->state == CM_CONN_READY) {
        cm_msg m = {.type = CM_MSG_BYE};
        snprintf(m.u.bye.text, sizeof m.u.bye.text, "%s", reason ? reason : "");
        char e[64];
        send_msg(c, &m, deadline_after(200), e, sizeof e);
    }
    close(c->fd);
    cm_chan_wipe(&c->s);
    cm_free(c->rx);
    cm_free(c->tx);
    cm_free(c);
}

const char *cm_conn_peer(const cm_conn *c) { return c->peer; }
void cm_conn_set_send_stall(cm_conn *c, int ms) { c->stall_ms = ms > 0 ? ms : 0; }
void cm_conn_set_spin(cm_conn *c, int us) { c->spin_ns = us > 0 ? (uint64_t)us * 1000u : 0; }

bool cm_conn_set_clear_allreduce(cm_conn *c, bool on) {
    char h[64];
    cm_conn_peer_host(c, h, sizeof h);
    /* IP loopback only: a transport's local socket ("local") may carry the
     * bytes on to another host */
    bool lo = !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strncmp(h, "::ffff:127.", 11);
    c->s.tx_clear_allreduce = on && lo && c->s.mode == CM_SEC_ENCRYPT;
    return c->s.tx_clear_allreduce;
}

bool cm_conn_is_loopback(const cm_conn *c) {
    char h[64];
    cm_conn_peer_host(c, h, sizeof h);
    return !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strncmp(h, "::ffff:127.", 11) || !strcmp(h, "local");
}

void cm_conn_peer_host(const cm_conn *c, char *out, size_t cap) {
    const char *p = c->peer, *e = strrchr(p, ':');
    if (p[0] == '[') {
        p++;
        e = strchr(p, ']');
    }
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (!cap) return;
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
}
enum cm_conn_state cm_conn_state(const cm_conn *c) { return c->state; }
cm_sec_mode cm_conn_mode(const cm_conn *c) { return c->s.mode; }
int cm_conn_fd(const cm_conn *c) { return c->fd; }

void cm_conn_get_stats(const cm_conn *c, unsigned type, cm_conn_stats *st) {
    memset(st, 0, sizeof *st);
    for (unsigned t = 0; t < CM_MSG_COUNT; t++) {
        if (type && t != type) continue;
        st->tx_bytes += atomic_load_explicit(&c->tx_bytes[t], memory_order_relaxed);
        st->tx_frames += atomic_load_explicit(&c->tx_frames[t], memory_order_relaxed);
        st->rx_bytes += atomic_load_explicit(&c->rx_bytes[t], memory_order_relaxed);
        st->rx_frames += atomic_load_explicit(&c->rx_frames[t], memory_order_relaxed);
    }
}

int cm_conn_seal_raw(cm_conn *c, unsigned type, const uint8_t *payload, size_t n, uint8_t *out, size_t cap, size_t *len,
                     char *err, size_t errlen) {
    if (cap < CM_FRAME_HDR + n) return cm_errf(err, errlen, CM_ERANGE, "buffer too small");
    memcpy(out + CM_FRAME_HDR, payload, n);
    return cm_frame_seal(&c->s, type, out, n, cap, len, err, errlen);
}

int cm_conn_write_raw(cm_conn *c, const void *p, size_t n, int timeout_ms, char *err, size_t errlen) {
    return write_all(c, p, n, deadline_after(timeout_ms), err, errlen);
}
