/*
 * server_impl.h (private to server.c and server_conn.c): the server's state
 * and what its two halves call in each other. server.c answers requests
 * (routes, authentication, responses, jobs, SSE); server_conn.c is the
 * plumbing under it (the daemon's start and stop, the engine's arrival, the
 * list of open connections and the watchdog over them). The rest of
 * src/http sees cm_http_server only through http_impl.h's accessors.
 */
#ifndef CM_HTTP_SERVER_IMPL_H
#define CM_HTTP_SERVER_IMPL_H

#include "http_impl.h"

#include <microhttpd.h>

struct cm_http_server {
    struct MHD_Daemon *d;
    cm_http_opts o;
    char *host, *api_key, *cors, *model_id, *chat_template;
    char **allow;
    int n_allow;
    int port;
    pthread_rwlock_t rw; /* guards e and sc against cm_http_set_engine / stop */
    cm_engine *e;
    cm_queue *sc;
    metrics *m;
    int n_ctx;
    atomic_uint_fast64_t seq;
    /* header deadline */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    struct conn *conns;
    pthread_t wd;
    bool wd_started, wd_stop;
    cm_ft_state *ft; /* fine-tuning jobs (api_finetune.c); NULL without opts.finetune */
};

typedef struct conn conn; /* one open connection (server_conn.c) */

/* server.c: libmicrohttpd's access and completion handlers, and ending a job
 * whose client left (any thread; the job's end wakes its connection). */
enum MHD_Result cm_http_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload, size_t *upload_size, void **con_cls);
void cm_http_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);
void cm_job_cancel(job *j);

/* server_conn.c: c's entry in the connection list (NULL if it has none);
 * dropping its job reference; holding a reference to j so the watchdog can
 * cancel it when the client hangs up; in_request: headers complete (stops
 * the header deadline) or the request ended (restarts it). Any thread. */
conn *cm_http_conn_of(struct MHD_Connection *c);
void cm_http_conn_detach(cm_http_server *srv, conn *k);
void cm_http_conn_attach(cm_http_server *srv, struct MHD_Connection *c, job *j);
void cm_http_conn_mark(cm_http_server *srv, struct MHD_Connection *c, bool in_request);

#endif
