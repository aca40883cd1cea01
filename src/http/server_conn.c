/*
 * server_conn.c: the connection and daemon plumbing under server.c's
 * request handling: starting libmicrohttpd (its event loop and limits) and
 * stopping it, taking the engine once it is loaded, the list of open
 * connections, and the watchdog that enforces the request-header deadline
 * (slowloris), cancels the jobs of clients that hung up and resumes quiet
 * streams for a keep-alive. It never reads a request's content and never
 * blocks an event-loop thread.
 */
#include "server_impl.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* One open connection, for the header deadline and for noticing that the
 * client of a suspended request left (see watchdog). */
typedef struct conn {
    int fd;
    double t0;       /* when the connection opened or its last request ended */
    bool in_request; /* headers complete: the request is the handler's now */
    job *j;          /* a generation job it waits for (a reference), or NULL */
    struct conn *prev, *next;
} conn;

/* Has the peer closed the connection? (Pipelined bytes do not count.) */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- slowloris: a deadline for request headers ----
 * MHD's timeout is an IDLE timeout: a client that sends one header byte
 * every few seconds would hold its connection (and thread) forever. The
 * watchdog shuts down any connection whose request headers are not complete
 * within timeout_s of the connection opening (or of its previous request
 * ending, for keep-alive). shutdown(), not close(): MHD still owns the fd,
 * sees EOF and cleans up; entries leave the list (under cmu) when MHD
 * reports the connection closed, before it closes the fd.
 *
 * The same watchdog looks after connections suspended on a job: a client
 * that hung up cancels its job (a suspended socket is out of the event
 * loop, so MHD would not notice), and a stream quiet for a third of the
 * idle timeout is resumed to send a keep-alive comment. Lock order: cmu,
 * then a job's mu; MHD_resume_connection with neither held. */

void cm_http_conn_detach(cm_http_server *srv, conn *k) {
    pthread_mutex_lock(&srv->cmu);
    job *j = k->j;
    k->j = NULL;
    pthread_mutex_unlock(&srv->cmu);
    cm_job_unref(j);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    cm_http_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn *k = cm_calloc(1, sizeof *k);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!k || !ci) {
            cm_free(k);
            return;
        }
        k->fd = ci->connect_fd;
        k->t0 = cm_now_s();
        pthread_mutex_lock(&srv->cmu);
        k->next = srv->conns;
        if (srv->conns) srv->conns->prev = k;
        srv->conns = k;
        pthread_mutex_unlock(&srv->cmu);
        *socket_context = k;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        conn *k = *socket_context;
        cm_http_conn_detach(srv, k);
        pthread_mutex_lock(&srv->cmu);
        if (k->prev) k->prev->next = k->next;
        else srv->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&srv->cmu);
        cm_free(k);
        *socket_context = NULL;
    }
}

conn *cm_http_conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void cm_http_conn_attach(cm_http_server *srv, struct MHD_Connection *c, job *j) {
    conn *k = cm_http_conn_of(c);
    if (!k) return;
    cm_job_ref(j);
    pthread_mutex_lock(&srv->cmu);
    job *old = k->j;
    k->j = j;
    pthread_mutex_unlock(&srv->cmu);
    cm_job_unref(old);
}

void cm_http_conn_mark(cm_http_server *srv, struct MHD_Connection *c, bool in_request) {
    conn *k = cm_http_conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&srv->cmu);
    k->in_request = in_request;
    k->t0 = cm_now_s();
    pthread_mutex_unlock(&srv->cmu);
}

static void *watchdog(void *arg) {
    cm_http_server *srv = arg;
    double keepalive_s = CM_MAX(0.5, srv->o.timeout_s / 3.0);
    enum { RESUME_MAX = 256 };
    job *wake[RESUME_MAX];
    pthread_mutex_lock(&srv->cmu);
    while (!srv->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&srv->ccv, &srv->cmu, &ts);
        double now = cm_now_s();
        int n_wake = 0;
        for (conn *k = srv->conns; k; k = k->next) {
            if (!k->in_request && now - k->t0 > srv->o.timeout_s) {
                shutdown(k->fd, SHUT_RDWR);
                k->t0 = now + 1e9; /* once */
            }
            job *j = k->j;
            if (!j) continue;
            pthread_mutex_lock(&j->mu);
            bool waiting = j->suspended && j->state != JOB_DONE;
            bool gone = waiting && peer_gone(k->fd);
            bool ka = waiting && !gone && j->stream && now - j->t_suspended > keepalive_s && n_wake < RESUME_MAX;
            if (ka) j->keepalive_due = true;
            pthread_mutex_unlock(&j->mu);
            if (gone) cm_job_cancel(j); /* its end wakes the connection */
            if (ka) {
                cm_job_ref(j);
                wake[n_wake++] = j;
            }
        }
        pthread_mutex_unlock(&srv->cmu);
        for (int i = 0; i < n_wake; i++) {
            cm_job_wake(wake[i]);
            cm_job_unref(wake[i]);
        }
        pthread_mutex_lock(&srv->cmu);
    }
    pthread_mutex_unlock(&srv->cmu);
    return NULL;
}

/* ---- lifecycle ---- */

static char *dup_or_null(const char *s) { return s && *s ? cm_strdup(s) : NULL; }

static void srv_free(cm_http_server *s) {
    cm_metrics_free(s->m);
    cm_ft_free(s->ft);
    cm_free(s->host);
    cm_free(s->api_key);
    cm_free(s->cors);
    cm_free(s->model_id);
    cm_free(s->chat_template);
    for (int i = 0; i < s->n_allow; i++) cm_free(s->allow[i]);
    cm_free(s->allow);
    pthread_rwlock_destroy(&s->rw);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    cm_free(s);
}

int cm_http_start(cm_http_server **out, const cm_http_opts *o, char *err, size_t errlen) {
    *out = NULL;
    cm_http_server *s = cm_calloc(1, sizeof *s);
    if (!s) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    pthread_rwlock_init(&s->rw, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    s->o = *o;
    if (s->o.timeout_s < 1) s->o.timeout_s = 1;
    s->host = dup_or_null(o->host ? o->host : "127.0.0.1");
    s->api_key = dup_or_null(o->api_key);
    s->cors = dup_or_null(o->cors_origin);
    s->model_id = cm_strdup(o->model_id && *o->model_id ? o->model_id : "model");
    s->chat_template = dup_or_null(o->chat_template);
    s->allow = cm_calloc((size_t)o->n_allow_hosts + 1, sizeof *s->allow);
    for (int i = 0; s->allow && i < o->n_allow_hosts; i++) s->allow[s->n_allow++] = cm_strdup(o->allow_hosts[i]);
    s->m = cm_metrics_new(o->tdp_w);
    if (o->finetune && !(s->ft = cm_ft_new())) {
        srv_free(s);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    if (!s->host || !s->model_id || !s->allow || !s->m) {
        srv_free(s);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    if (s->o.n_slots < 1) s->o.n_slots = 1;
    if (s->o.queue_max < 0) s->o.queue_max = 0;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gr = getaddrinfo(s->host, port, &hints, &ai);
    if (gr || !ai) {
        srv_free(s);
        return cm_errf(err, errlen, CM_EINVAL, "cannot resolve host '%s': %s", o->host, gai_strerror(gr));
    }
    /* epoll (or poll where there is none) in a few threads; suspend/resume
     * for connections that wait on a job; ITC so a resume is seen at once. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n_threads = o->n_threads > 0 ? (unsigned)o->n_threads : (unsigned)CM_MAX(2, CM_MIN(4, ncpu));
    s->o.max_conns = cm_http_fit_fd_limit(CM_MAX(o->max_conns, 4));
    unsigned per_ip = o->max_conns_per_ip > 0 ? (unsigned)o->max_conns_per_ip : 0; /* 0: no limit */
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, cm_http_on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                            cm_http_mhd_log, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE,
                            n_threads, MHD_OPTION_THREAD_STACK_SIZE, CM_COMPUTE_STACK, /* embeddings compute here */
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)s->o.max_conns, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CM_MAX(o->timeout_s, 1),
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CM_MAX(o->max_header, (size_t)4096),
                            MHD_OPTION_NOTIFY_COMPLETED, cm_http_on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                            on_connection, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        srv_free(s);
        return cm_errf(err, errlen, CM_EIO, "cannot listen on %s port %d: %s", o->host, o->port, strerror(errno));
    }
    if (pthread_create(&s->wd, NULL, watchdog, s) == 0) s->wd_started = true;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return 0;
}

int cm_http_port(const cm_http_server *s) { return s->port; }

int cm_http_set_engine(cm_http_server *s, cm_engine *e, char *err, size_t errlen) {
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    int n_ctx = s->o.n_ctx > 0 ? s->o.n_ctx : in.n_ctx;
    /* Check the chat template once, with a one-message conversation. */
    cm_buf b;
    cm_buf_init(&b);
    cm_chat_msg probe = {.role = "user", .content = "hi"};
    char msg[512];
    int rc = cm_engine_chat_render(e, s->chat_template, &probe, 1, true, &b, msg, sizeof msg);
    cm_buf_release(&b);
    if (rc && s->chat_template) return cm_errf(err, errlen, rc, "%s", msg);
    if (rc) {
        CM_LOGW("'%s': %s; using chatml", s->model_id, msg); /* as chat and run --chat say it */
        s->chat_template = cm_strdup("chatml");
    }
    cm_queue *sc = cm_queue_new(s, e, s->o.n_slots, s->o.queue_max, n_ctx, s->o.kv_mem, err, errlen);
    if (!sc) return CM_ENOMEM;
    pthread_rwlock_wrlock(&s->rw);
    s->e = e;
    s->n_ctx = n_ctx;
    s->sc = sc;
    pthread_rwlock_unlock(&s->rw);
    return 0;
}

void cm_http_stop(cm_http_server *s) {
    if (!s) return;
    MHD_quiesce_daemon(s->d); /* no new connections */
    pthread_rwlock_wrlock(&s->rw);
    cm_queue *sc = s->sc;
    s->sc = NULL;
    pthread_rwlock_unlock(&s->rw);
    cm_queue_free(sc); /* ends every job, so connection threads finish */
    if (s->wd_started) {
        pthread_mutex_lock(&s->cmu);
        s->wd_stop = true;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        pthread_join(s->wd, NULL);
    }
    MHD_stop_daemon(s->d);
    srv_free(s);
}
