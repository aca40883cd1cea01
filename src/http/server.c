/*
 * server.c: libmicrohttpd glue. An event loop (epoll where there is one, a
 * small pool of threads), so an idle or slow connection costs a socket and a
 * few hundred bytes, never a thread: thousands of them cannot lock out
 * /health or a completion. A connection waiting for tokens is suspended (out
 * of the event loop) and resumed by the scheduler when its job makes
 * progress; no callback ever blocks. Limits: connections in all and per
 * client address, an idle timeout, a deadline for request headers
 * (slowloris), a header-size cap, a body-size cap checked before reading
 * the body. Every
 * request passes, in order: Host allow-list (DNS rebinding), route and method,
 * API key, body size; then the route runs. Generation requests become jobs for
 * the scheduler; the connection thread streams the job's SSE bytes or waits
 * for its whole text, and cancels the job when the client hangs up.
 *
 * This file is the request side (routes, checks, responses, jobs, SSE);
 * server_conn.c holds the daemon's lifecycle, the connection list and the
 * watchdog named below.
 *
 * Never answers a client's mistake with a 5xx; never logs request bodies or
 * keys.
 */
#include "server_impl.h"

#include "../sampler/grammar.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct req {
    enum route route;
    cm_buf body;
    bool too_big, responded;
    double t0;
    job *j; /* non-streaming: the job it waits for (a reference) */
} req;

const char *cm_http_model_id(const cm_http_server *s) { return s->model_id; }
cm_engine *cm_http_engine(const cm_http_server *s) { return s->e; }
cm_ft_state *cm_http_ft(const cm_http_server *s) { return s ? s->ft : NULL; }
const cm_http_opts *cm_http_options(const cm_http_server *s) { return &s->o; }
metrics *cm_http_metrics(const cm_http_server *s) { return s->m; }
int cm_http_n_ctx(const cm_http_server *s) { return s->n_ctx; }
void cm_http_conn_limits(const cm_http_server *s, int *all, int *per_ip) {
    *all = s->o.max_conns;
    *per_ip = s->o.max_conns_per_ip;
}
const char *cm_http_chat_template(const cm_http_server *s) { return s->chat_template; }

void cm_http_queue_stats(cm_http_server *s, int *queued, int *active, int *slots) {
    *queued = *active = 0;
    *slots = s->o.n_slots;
    pthread_rwlock_rdlock(&s->rw);
    if (s->sc) cm_queue_stats(s->sc, queued, active, slots);
    pthread_rwlock_unlock(&s->rw);
}

void cm_http_kv_stats_get(cm_http_server *s, cm_http_kv_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&s->rw);
    if (s->sc) cm_queue_kv_stats(s->sc, out);
    pthread_rwlock_unlock(&s->rw);
}

bool cm_http_ready(cm_http_server *s) {
    pthread_rwlock_rdlock(&s->rw);
    bool r = s->sc != NULL;
    pthread_rwlock_unlock(&s->rw);
    return r;
}

void cm_http_opts_default(cm_http_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->n_slots = 4;
    o->queue_max = 16;
    o->max_body = 1 << 20;
    o->max_header = 16 << 10;
    o->max_conns = 4096;
    o->max_conns_per_ip = 256;
    o->timeout_s = 10;
    o->tdp_w = 65;
    o->model_id = "model";
}

/* ---- jobs ---- */

job *cm_job_new(cm_http_server *srv, bool chat) {
    job *j = cm_calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->srv = srv;
    j->fd = -1;
    j->stop_index = -1;
    cm_buf_init(&j->sse);
    cm_buf_init(&j->text);
    cm_buf_init(&j->hout);
    j->created = (long long)(cm_wall_ms() / 1000);
    /* Unique, not secret: a counter mixed with the clock. */
    cm_rng r;
    cm_rng_seed(&r, cm_now_ns() ^ (atomic_fetch_add(&srv->seq, 1) * 0x9E3779B97F4A7C15ull));
    snprintf(j->id, sizeof j->id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)cm_rng_next(&r),
             (unsigned long long)(cm_rng_next(&r) & 0xffffffffu));
    return j;
}

void cm_job_ref(job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void cm_job_wake(job *j) {
    pthread_mutex_lock(&j->mu);
    struct MHD_Connection *c = j->suspended ? j->conn : NULL;
    j->suspended = false;
    pthread_mutex_unlock(&j->mu);
    /* Only the thread that cleared `suspended` resumes, and a suspended
     * connection is never closed, so c is alive here. */
    if (c) MHD_resume_connection(c);
}

/* Under j->mu, from an MHD callback: park the connection until cm_job_wake. */
static void job_suspend(job *j) {
    j->suspended = true;
    j->t_suspended = cm_now_s();
    MHD_suspend_connection(j->conn);
}

void cm_job_unref(job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int r = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (r) return;
    for (int i = 0; i < j->n_stops; i++) cm_free(j->stops[i]);
    cm_free(j->stops);
    cm_free(j->ids);
    cm_free(j->lora);
    cm_free(j->lps);
    cm_free(j->lp_ids);
    cm_grammar_free(j->grammar);
    cm_buf_release(&j->sse);
    cm_buf_release(&j->text);
    cm_buf_release(&j->hout);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    cm_free(j);
}

void cm_job_cancel(job *j) {
    atomic_store(&j->cancel, 1);
    pthread_mutex_lock(&j->mu);
    if (j->sess) cm_session_cancel(j->sess);
    pthread_mutex_unlock(&j->mu);
}

/* ---- responses ---- */

static void common_headers(cm_http_server *srv, struct MHD_Response *r, const char *type) {
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (srv->cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", srv->cors);
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

/* Every answer ends here: r queued with status, released, and counted. */
static enum MHD_Result respond(cm_http_server *srv, struct MHD_Connection *c, req *q, int status,
                               struct MHD_Response *r) {
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    q->responded = true;
    cm_metrics_request(srv->m, q->route, status);
    return ok;
}

/* A response holding a copy of data (n bytes) with the headers every
 * answer has (Retry-After on 503 and 429, the page's CSP on /), or NULL out
 * of memory (the caller answers MHD_NO: libmicrohttpd closes the connection). */
static struct MHD_Response *new_response(cm_http_server *srv, req *q, int status, const char *type, const char *data,
                                         size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return NULL;
    common_headers(srv, r, type);
    if (status == 503 || status == 429) MHD_add_response_header(r, "Retry-After", "1");
    if (q->route == R_ROOT)
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "connect-src 'self'; img-src 'self' data:");
    return r;
}

static enum MHD_Result send_bytes(cm_http_server *srv, struct MHD_Connection *c, req *q, int status, const char *type,
                                  const char *data, size_t n) {
    struct MHD_Response *r = new_response(srv, q, status, type, data, n);
    return r ? respond(srv, c, q, status, r) : MHD_NO;
}

static enum MHD_Result send_buf(cm_http_server *srv, struct MHD_Connection *c, req *q, int status, const char *type,
                                cm_buf *b) {
    enum MHD_Result ok = send_bytes(srv, c, q, status, type, b->data ? b->data : "", b->len);
    cm_buf_release(b);
    return ok;
}

/* e's JSON in the shape of q's API (Anthropic's on /v1/messages), into b (initialised here). */
static void error_body(const req *q, const api_error *e, cm_buf *b) {
    cm_buf_init(b);
    if (q->route == R_MESSAGES) cm_anth_error_json(b, e);
    else cm_api_error_json(b, e);
}

static enum MHD_Result send_error(cm_http_server *srv, struct MHD_Connection *c, req *q, const api_error *e) {
    cm_buf b;
    error_body(q, e, &b);
    return send_buf(srv, c, q, e->status, "application/json", &b);
}

static enum MHD_Result fail(cm_http_server *srv, struct MHD_Connection *c, req *q, int status, const char *type,
                            const char *code, const char *msg) {
    api_error e;
    cm_api_error_set(&e, status, type, NULL, code, "%s", msg);
    return send_error(srv, c, q, &e);
}

/* ---- checks ---- */

static enum route route_of(const char *url) {
    static const struct {
        const char *path;
        enum route r;
    } k[] = {
        {"/", R_ROOT},
        {"/index.html", R_ROOT},
        {"/health", R_HEALTH},
        {"/metrics", R_METRICS},
        {"/api/cluster", R_CLUSTER},
        {"/v1/models", R_MODELS},
        {"/v1/chat/completions", R_CHAT},
        {"/v1/completions", R_COMPLETIONS},
        {"/v1/messages", R_MESSAGES},
        {"/v1/embeddings", R_EMBEDDINGS},
        {"/apply-template", R_APPLY_TEMPLATE},
        {"/lora-adapters", R_LORA},
        {"/v1/fine_tuning/jobs", R_FINETUNE},
        {"/api/train", R_FINETUNE},
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(k); i++)
        if (!strcmp(url, k[i].path)) return k[i].r;
    if (!strncmp(url, "/v1/fine_tuning/jobs/", 21) && url[21] && strlen(url) < 100) return R_FINETUNE;
    return R_OTHER;
}

bool cm_http_host_ok(const char *h, const char *host, char *const *allow, int n_allow) {
    if (!h) return true; /* HTTP/1.0 without Host: not a browser */
    char name[256];
    size_t n = 0;
    if (h[0] == '[') {
        const char *e = strchr(h, ']');
        if (!e || (size_t)(e - h - 1) >= sizeof name) return false;
        n = (size_t)(e - h - 1);
        memcpy(name, h + 1, n);
    } else {
        while (h[n] && h[n] != ':' && n < sizeof name - 1) {
            name[n] = h[n];
            n++;
        }
        if (h[n] && h[n] != ':') return false;
    }
    name[n] = 0;
    if (n && name[n - 1] == '.') name[--n] = 0; /* "localhost." */
    unsigned char a[16];
    if (inet_pton(AF_INET, name, a) == 1 || inet_pton(AF_INET6, name, a) == 1) return true;
    if (!strcasecmp(name, "localhost")) return true;
    if (host && !strcasecmp(name, host)) return true;
    for (int i = 0; i < n_allow; i++)
        if (!strcasecmp(name, allow[i])) return true;
    return false;
}

static bool host_ok(cm_http_server *srv, const char *h) {
    return cm_http_host_ok(h, srv->host, srv->allow, srv->n_allow);
}

static bool key_ok(cm_http_server *srv, struct MHD_Connection *c) {
    if (!srv->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients */
    if (h && !strncasecmp(h, "Bearer ", 7)) h += 7;
    else if (x) h = x;
    else return false;
    size_t a = strlen(h), b = strlen(srv->api_key);
    unsigned char d = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) d |= (unsigned char)(h[i < a ? i : 0] ^ srv->api_key[i]); /* constant time */
    return d == 0;
}

/* ---- generation routes ---- */

/* While a stream waits (queued, or a long prefill) it sends an SSE comment
 * every keep-alive interval: clients ignore it, and it keeps the connection
 * from looking idle to MHD's timeout (which would otherwise close a healthy
 * stream that has not produced its first token yet). */
static const char k_keepalive[] = ": keep-alive\n\n";

/* Never waits: with nothing to send it suspends the connection and returns
 * 0; the scheduler (new bytes, the end) or the watchdog (a keep-alive is due)
 * resumes it, and MHD calls again. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (j->sse_off < j->sse.len) {
        size_t n = CM_MIN(max, j->sse.len - j->sse_off);
        memcpy(buf, j->sse.data + j->sse_off, n);
        j->sse_off += n;
        if (j->sse_off == j->sse.len) {
            cm_buf_clear(&j->sse);
            j->sse_off = 0;
        }
        j->keepalive_due = false;
        if (j->n_gen > 0 && !j->trace_sent && cm_config_get()->serve_trace) {
            j->trace_sent = true;
            fprintf(stderr, "serve-trace %.4f sent %s queued+%.1fms\n", cm_now_s(), j->id,
                    (cm_now_s() - j->t_queued) * 1e3);
        }
        pthread_mutex_unlock(&j->mu);
        return (ssize_t)n;
    }
    if (j->state == JOB_DONE) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (j->keepalive_due && max >= sizeof k_keepalive - 1) {
        j->keepalive_due = false;
        pthread_mutex_unlock(&j->mu);
        memcpy(buf, k_keepalive, sizeof k_keepalive - 1);
        return (ssize_t)(sizeof k_keepalive - 1);
    }
    if (atomic_load(&j->cancel)) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    job_suspend(j);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void sse_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool done = j->state == JOB_DONE;
    pthread_mutex_unlock(&j->mu);
    if (!done) cm_job_cancel(j); /* the client left mid-stream */
    cm_job_unref(j);
}

static enum MHD_Result wait_job(cm_http_server *srv, struct MHD_Connection *c, req *q);

static enum MHD_Result generate(cm_http_server *srv, struct MHD_Connection *c, req *q, bool chat) {
    job *j = cm_job_new(srv, chat);
    if (!j) return fail(srv, c, q, 503, "server_error", NULL, "out of memory");
    api_error ae;
    const char *body = q->body.data ? q->body.data : "";
    if (q->route == R_MESSAGES ? cm_anth_parse_request(srv, body, q->body.len, j, &ae)
                               : cm_api_parse_request(srv, chat, body, q->body.len, j, &ae)) {
        cm_job_unref(j);
        return send_error(srv, c, q, &ae);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->conn = c;
    j->t_queued = cm_now_s();
    if (j->stream) cm_api_stream_role(j);
    pthread_rwlock_rdlock(&srv->rw);
    int rc = srv->sc ? cm_queue_submit(srv->sc, j) : CM_ESTATE;
    pthread_rwlock_unlock(&srv->rw);
    if (rc) {
        cm_job_unref(j);
        return fail(srv, c, q, 503, "server_error", rc == CM_EBUSY ? "queue_full" : "unavailable",
                    rc == CM_EBUSY ? "the server is busy: every slot is generating and the queue is full; retry later"
                                   : "the server is not ready");
    }
    cm_http_conn_attach(srv, c, j);
    if (j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, j, sse_free);
        if (!r) {
            cm_job_cancel(j);
            cm_job_unref(j);
            return MHD_NO;
        }
        common_headers(srv, r, "text/event-stream");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        return respond(srv, c, q, 200, r);
    }
    q->j = j; /* the request's reference now */
    return wait_job(srv, c, q);
}

/* A non-streaming request: suspended until its job is done (the handler
 * runs again on each resume), then the whole answer. */
static enum MHD_Result wait_job(cm_http_server *srv, struct MHD_Connection *c, req *q) {
    job *j = q->j;
    pthread_mutex_lock(&j->mu);
    if (j->state != JOB_DONE) {
        if (atomic_load(&j->cancel)) { /* the client left (see watchdog) */
            pthread_mutex_unlock(&j->mu);
            cm_metrics_request(srv->m, q->route, 499); /* nginx's "client closed request" */
            return MHD_NO;
        }
        job_suspend(j);
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&j->mu);
    q->j = NULL;
    if (atomic_load(&j->cancel)) { /* the client left; nobody reads an answer */
        cm_job_unref(j);
        cm_metrics_request(srv->m, q->route, 499);
        return MHD_NO;
    }
    enum MHD_Result ok;
    if (j->http_status) {
        ok = fail(srv, c, q, j->http_status, "server_error", NULL, j->errmsg);
    } else {
        char *body = cm_api_final_json(j);
        ok = body ? send_bytes(srv, c, q, 200, "application/json", body, strlen(body))
                  : fail(srv, c, q, 503, "server_error", NULL, "out of memory");
        cm_free(body);
    }
    cm_job_unref(j);
    return ok;
}

/* ---- the access handler ---- */

enum MHD_Result cm_http_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    cm_http_server *srv = cls;
    req *q = *con_cls;
    if (!q) {
        q = cm_calloc(1, sizeof *q);
        if (!q) return MHD_NO;
        *con_cls = q;
        cm_http_conn_mark(srv, c, true);
        cm_buf_init(&q->body);
        q->t0 = cm_now_s();
        q->route = route_of(url);
        bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        bool post = !strcmp(method, "POST");
        if (!host_ok(srv, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
            return fail(srv, c, q, 403, "permission_error", "host_not_allowed",
                        "this Host header is not allowed (DNS rebinding protection); start the server with "
                        "--allow-host NAME to accept it");
        if (!strcmp(method, "OPTIONS") && srv->cors && q->route != R_OTHER) {
            struct MHD_Response *r = new_response(srv, q, 204, "text/plain", "", 0);
            if (!r) return MHD_NO;
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    "Authorization, Content-Type, x-api-key, anthropic-version");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
            return respond(srv, c, q, 204, r);
        }
        if (q->route == R_OTHER) return fail(srv, c, q, 404, "invalid_request_error", "not_found", "no such route");
        bool want_post = q->route == R_CHAT || q->route == R_COMPLETIONS || q->route == R_MESSAGES ||
                         q->route == R_EMBEDDINGS || q->route == R_APPLY_TEMPLATE;
        if (q->route == R_LORA || q->route == R_FINETUNE ? !get && !post : want_post ? !post : !get) {
            api_error e;
            cm_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                             "%s is not allowed here; use %s", method, want_post ? "POST" : "GET");
            cm_buf b;
            error_body(q, &e, &b);
            struct MHD_Response *r = new_response(srv, q, 405, "application/json", b.data ? b.data : "", b.len);
            cm_buf_release(&b);
            if (!r) return MHD_NO;
            MHD_add_response_header(r, "Allow", want_post ? "POST" : "GET, HEAD");
            return respond(srv, c, q, 405, r);
        }
        /* The dashboard page itself holds no data (it asks for the key and
         * sends it with its API calls); /health is for load balancers. */
        if (q->route != R_HEALTH && q->route != R_ROOT && !key_ok(srv, c))
            return fail(srv, c, q, 401, "authentication_error", "invalid_api_key",
                        "missing or incorrect API key: send 'Authorization: Bearer KEY'");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || *end || v > srv->o.max_body) q->too_big = true;
        }
        if (q->too_big) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", srv->o.max_body);
            return fail(srv, c, q, 413, "invalid_request_error", "request_too_large", msg);
        }
        return MHD_YES;
    }
    if (q->responded) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->j) return wait_job(srv, c, q);
    if (*upload_size) {
        if (!q->too_big) {
            if (q->body.len + *upload_size > srv->o.max_body) {
                q->too_big = true;
                cm_buf_release(&q->body);
            } else {
                cm_buf_append(&q->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        /* A body that trickles in for too long holds a thread: cut it off. */
        if (cm_now_s() - q->t0 > 3.0 * srv->o.timeout_s)
            return fail(srv, c, q, 408, "invalid_request_error", "request_timeout", "the request body took too long");
        return MHD_YES;
    }
    if (q->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", srv->o.max_body);
        return fail(srv, c, q, 413, "invalid_request_error", "request_too_large", msg);
    }
    bool ready = cm_http_ready(srv);
    cm_buf b;
    cm_buf_init(&b);
    switch (q->route) {
    case R_ROOT:
        return send_bytes(srv, c, q, 200, "text/html; charset=utf-8", (const char *)cm_http_dashboard_html,
                          strlen((const char *)cm_http_dashboard_html));
    case R_HEALTH:
        cm_buf_puts(&b, ready ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}");
        return send_buf(srv, c, q, ready ? 200 : 503, "application/json", &b);
    case R_METRICS:
        cm_metrics_prometheus(srv->m, srv, &b);
        return send_buf(srv, c, q, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
    case R_CLUSTER: cm_metrics_cluster_json(srv->m, srv, &b); return send_buf(srv, c, q, 200, "application/json", &b);
    default: break;
    }
    if (!ready) return fail(srv, c, q, 503, "server_error", "loading", "the model is still loading; retry shortly");
    if (q->route == R_MODELS) {
        cm_api_models_json(srv, &b);
        return send_buf(srv, c, q, 200, "application/json", &b);
    }
    if (q->route == R_FINETUNE) { /* api_finetune.c: jobs and the dashboard's loss curve */
        api_error ae;
        const char *body = q->body.data ? q->body.data : "";
        if (!cm_api_finetune(srv, method, url, body, q->body.len, &b, &ae))
            return send_buf(srv, c, q, 200, "application/json", &b);
        cm_buf_release(&b);
        return send_error(srv, c, q, &ae);
    }
    if (q->route == R_LORA) { /* api_lora.c: GET lists the adapters, POST sets their default scales */
        api_error ae;
        const char *body = q->body.data ? q->body.data : "";
        if (!(strcmp(method, "POST") ? cm_api_lora_list_json(srv, &b, &ae)
                                     : cm_api_lora_set(srv, body, q->body.len, &b, &ae)))
            return send_buf(srv, c, q, 200, "application/json", &b);
        cm_buf_release(&b);
        return send_error(srv, c, q, &ae);
    }
    if (q->route == R_EMBEDDINGS || q->route == R_APPLY_TEMPLATE) {
        api_error ae;
        const char *body = q->body.data ? q->body.data : "";
        if (!(q->route == R_EMBEDDINGS ? cm_api_embeddings(srv, body, q->body.len, &b, &ae)
                                       : cm_api_apply_template(srv, body, q->body.len, &b, &ae)))
            return send_buf(srv, c, q, 200, "application/json", &b);
        cm_buf_release(&b);
        return send_error(srv, c, q, &ae);
    }
    return generate(srv, c, q, q->route == R_CHAT || q->route == R_MESSAGES);
}

void cm_http_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    cm_http_conn_mark(cls, c, false); /* the next request's headers start the clock again */
    conn *k = cm_http_conn_of(c);
    if (k) cm_http_conn_detach(cls, k);
    req *q = *con_cls;
    if (!q) return;
    if (q->j) {
        cm_job_cancel(q->j);
        cm_job_unref(q->j);
    } /* ended before its answer */
    cm_buf_release(&q->body);
    cm_free(q);
    *con_cls = NULL;
}
