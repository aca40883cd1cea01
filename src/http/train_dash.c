/*
 * train_dash.c: the live page of a fine-tuning run (`cumulo finetune
 * --dashboard PORT`, http.h): the loss curve (training and validation),
 * tokens/s, progress and the machines that train, on a small
 * libmicrohttpd server of its own. The trainer pushes points, nodes and a
 * status line under the dashboard's lock; the HTTP threads only read that
 * copy, so a slow or hostile client can never stall training. Safe
 * defaults as the API server's: the caller's host (127.0.0.1 by default),
 * the Host-header check (cm_http_host_ok), GET/HEAD only, a few
 * connections, short timeouts; no CORS.
 */
#include "http.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define MAX_NODES 64
#define MAX_POINTS 100000 /* beyond it, every other point is dropped (the curve keeps its shape) */

struct cm_train_dash {
    struct MHD_Daemon *d;
    char host[256], title[256], status[512];
    int port;
    pthread_mutex_t mu;
    cm_train_dash_point last;
    cm_train_dash_point *pts;
    int n_pts, cap_pts;
    cm_train_dash_node nodes[MAX_NODES];
    int n_nodes;
};

static const char k_page[] =
    "<!doctype html><html><head><meta charset=\"utf-8\"><title>cumulo finetune</title>\n"
    "<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}"
    ".k{color:#666}svg{border:1px solid #ccc;background:#fcfcfc}table{border-collapse:collapse}"
    "td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}"
    "#loss{fill:none;stroke:#1565c0;stroke-width:2}#val{fill:none;stroke:#e65100;stroke-width:2}</style>"
    "</head><body><h1 id=\"title\">cumulo finetune</h1>\n"
    "<p><span id=\"status\"></span></p>\n"
    "<p><span class=\"k\">step</span> <b id=\"step\">-</b> &nbsp; <span class=\"k\">epoch</span> <b id=\"epoch\">-</b>"
    " &nbsp; <span class=\"k\">loss</span> <b id=\"lossv\">-</b> &nbsp; <span class=\"k\">val</span> <b id=\"valv\">-</b>"
    " &nbsp; <span class=\"k\">tokens/s</span> <b id=\"toks\">-</b> &nbsp; <span class=\"k\">lr</span> <b id=\"lr\">-</b>"
    " &nbsp; <span class=\"k\">time left</span> <b id=\"eta\">-</b></p>\n"
    "<svg id=\"curve\" width=\"720\" height=\"300\" viewBox=\"0 0 720 300\">"
    "<polyline id=\"loss\" points=\"\"/><polyline id=\"val\" points=\"\"/>"
    "<text id=\"ymax\" x=\"4\" y=\"14\" font-size=\"11\"></text><text id=\"ymin\" x=\"4\" y=\"294\" font-size=\"11\"></text>"
    "</svg><p class=\"k\">blue: training loss, orange: validation loss</p>\n"
    "<h2 style=\"font-size:16px\">Machines</h2><table><thead><tr><th>machine</th><th>address</th><th>layers</th>"
    "<th>replica</th></tr></thead><tbody id=\"nodes\"></tbody></table>\n"
    "<script>\n"
    "function $(i){return document.getElementById(i)}\n"
    "function f(x,d){return x===null||x===undefined?'-':Number(x).toFixed(d)}\n"
    "function draw(j){\n"
    " $('title').textContent='cumulo finetune: '+j.title; $('status').textContent=j.status;\n"
    " $('step').textContent=j.step+'/'+j.steps; $('epoch').textContent=j.epoch+1;\n"
    " $('lossv').textContent=f(j.loss,4); $('valv').textContent=f(j.val_loss,4);\n"
    " $('toks').textContent=f(j.tok_per_s,1); $('lr').textContent=Number(j.lr).toExponential(2);\n"
    " $('eta').textContent=f(j.eta_s,0)+' s';\n"
    " var p=j.points,lo=1e30,hi=-1e30;\n"
    " p.forEach(function(q){[q[1],q[2]].forEach(function(v){if(v!==null){lo=Math.min(lo,v);hi=Math.max(hi,v)}})});\n"
    " if(hi<=lo){hi=lo+1}\n"
    " var n=Math.max(j.steps,1),X=function(s){return 30+680*s/n},Y=function(v){return 290-280*(v-lo)/(hi-lo)};\n"
    " var a=[],b=[];p.forEach(function(q){a.push(X(q[0]).toFixed(1)+','+Y(q[1]).toFixed(1));\n"
    "  if(q[2]!==null)b.push(X(q[0]).toFixed(1)+','+Y(q[2]).toFixed(1))});\n"
    " $('loss').setAttribute('points',a.join(' ')); $('val').setAttribute('points',b.join(' '));\n"
    " $('ymax').textContent=f(hi,3); $('ymin').textContent=f(lo,3);\n"
    " var t=$('nodes');t.innerHTML='';j.nodes.forEach(function(m){var r=t.insertRow();\n"
    "  [m.local?'this machine':m.name,m.addr||'-','['+m.first_layer+', '+m.last_layer+')',m.replica].forEach(\n"
    "  function(v){r.insertCell().textContent=v})});\n"
    "}\n"
    "function poll(){fetch('/train.json').then(function(r){return r.json()}).then(draw).catch(function(){})\n"
    " .finally(function(){setTimeout(poll,1000)})}\n"
    "poll();\n"
    "</script></body></html>\n";

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static cJSON *num_or_null(double x) { return isfinite(x) ? cJSON_CreateNumber(x) : cJSON_CreateNull(); }

/* The JSON of /train.json (the caller frees), under d->mu. */
static char *state_json(cm_train_dash *d) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    pthread_mutex_lock(&d->mu);
    const cm_train_dash_point *l = &d->last;
    cJSON_AddStringToObject(o, "title", d->title);
    cJSON_AddStringToObject(o, "status", d->status);
    cJSON_AddNumberToObject(o, "step", (double)l->step);
    cJSON_AddNumberToObject(o, "steps", (double)l->steps);
    cJSON_AddNumberToObject(o, "epoch", l->epoch);
    cJSON_AddItemToObject(o, "loss", num_or_null(d->n_pts ? l->loss : NAN));
    double val = NAN; /* the latest validation loss */
    for (int i = d->n_pts - 1; i >= 0 && !isfinite(val); i--) val = d->pts[i].val_loss;
    cJSON_AddItemToObject(o, "val_loss", num_or_null(val));
    cJSON_AddItemToObject(o, "lr", num_or_null(l->lr));
    cJSON_AddItemToObject(o, "tok_per_s", num_or_null(l->tok_per_s));
    cJSON_AddItemToObject(o, "eta_s", num_or_null(l->eta_s));
    cJSON *pts = cJSON_AddArrayToObject(o, "points");
    for (int i = 0; pts && i < d->n_pts; i++) {
        cJSON *q = cJSON_CreateArray();
        cJSON_AddItemToArray(q, cJSON_CreateNumber((double)d->pts[i].step));
        cJSON_AddItemToArray(q, num_or_null(d->pts[i].loss));
        cJSON_AddItemToArray(q, num_or_null(d->pts[i].val_loss));
        cJSON_AddItemToArray(pts, q);
    }
    cJSON *nodes = cJSON_AddArrayToObject(o, "nodes");
    for (int i = 0; nodes && i < d->n_nodes; i++) {
        const cm_train_dash_node *n = &d->nodes[i];
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "name", n->name);
        cJSON_AddStringToObject(q, "addr", n->addr);
        cJSON_AddNumberToObject(q, "first_layer", n->first_layer);
        cJSON_AddNumberToObject(q, "last_layer", n->last_layer);
        cJSON_AddNumberToObject(q, "replica", n->replica);
        cJSON_AddBoolToObject(q, "local", n->local);
        cJSON_AddItemToArray(nodes, q);
    }
    pthread_mutex_unlock(&d->mu);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version, (void)upload, (void)con_cls;
    cm_train_dash *d = cls;
    static const char k_host[] = "{\"error\":\"Host header not allowed\"}";
    static const char k_method[] = "{\"error\":\"only GET\"}";
    static const char k_none[] = "{\"error\":\"not found\"}";
    if (!cm_http_host_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"), d->host, NULL, 0))
        return answer(c, 403, "application/json", k_host, sizeof k_host - 1);
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        if (*upload_size) *upload_size = 0; /* a body is never read */
        return answer(c, 405, "application/json", k_method, sizeof k_method - 1);
    }
    if (!strcmp(url, "/")) return answer(c, 200, "text/html; charset=utf-8", k_page, sizeof k_page - 1);
    if (!strcmp(url, "/train.json")) {
        char *s = state_json(d);
        if (!s) return MHD_NO;
        enum MHD_Result ok = answer(c, 200, "application/json", s, strlen(s));
        cJSON_free(s);
        return ok;
    }
    return answer(c, 404, "application/json", k_none, sizeof k_none - 1);
}

int cm_train_dash_start(cm_train_dash **out, const char *host, int port, const char *title, char *err, size_t errlen) {
    *out = NULL;
    if (port < 0 || port > 65535) return cm_errf(err, errlen, CM_EINVAL, "dashboard port %d", port);
    cm_train_dash *d = cm_calloc(1, sizeof *d);
    if (!d) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    pthread_mutex_init(&d->mu, NULL);
    snprintf(d->host, sizeof d->host, "%s", host && *host ? host : "127.0.0.1");
    snprintf(d->title, sizeof d->title, "%s", title ? title : "");
    snprintf(d->status, sizeof d->status, "starting");
    d->last.val_loss = d->last.loss = d->last.lr = d->last.tok_per_s = d->last.eta_s = NAN;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gr = getaddrinfo(d->host, ps, &hints, &ai);
    if (gr || !ai) {
        cm_train_dash_stop(d);
        return cm_errf(err, errlen, CM_EINVAL, "cannot resolve host '%s': %s", host, gai_strerror(gr));
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    d->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, d, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 8u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d->d) {
        cm_train_dash_stop(d);
        return cm_errf(err, errlen, CM_EIO, "cannot listen on %s:%d (in use?)", host ? host : "127.0.0.1", port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d->d, MHD_DAEMON_INFO_BIND_PORT);
    d->port = di ? di->port : port;
    *out = d;
    return 0;
}

int cm_train_dash_port(const cm_train_dash *d) { return d->port; }

void cm_train_dash_point_add(cm_train_dash *d, const cm_train_dash_point *p) {
    pthread_mutex_lock(&d->mu);
    d->last = *p;
    if (d->n_pts && d->pts[d->n_pts - 1].step == p->step) { /* an eval after its step: the same point, more */
        const double v = d->pts[d->n_pts - 1].val_loss;
        d->pts[d->n_pts - 1] = *p;
        if (!isfinite(p->val_loss)) d->pts[d->n_pts - 1].val_loss = v;
    } else {
        if (d->n_pts == MAX_POINTS) { /* keep every other point */
            for (int i = 0; i < MAX_POINTS / 2; i++) d->pts[i] = d->pts[2 * i + 1];
            d->n_pts = MAX_POINTS / 2;
        }
        if (d->n_pts == d->cap_pts) {
            const int cap = d->cap_pts ? 2 * d->cap_pts : 256;
            cm_train_dash_point *np = cm_realloc(d->pts, (size_t)cap * sizeof *np);
            if (np) d->pts = np, d->cap_pts = cap;
        }
        if (d->n_pts < d->cap_pts) d->pts[d->n_pts++] = *p; /* out of memory: the point is only not drawn */
    }
    pthread_mutex_unlock(&d->mu);
}

void cm_train_dash_nodes(cm_train_dash *d, const cm_train_dash_node *nodes, int n) {
    pthread_mutex_lock(&d->mu);
    d->n_nodes = n < 0 ? 0 : n > MAX_NODES ? MAX_NODES : n;
    if (d->n_nodes) memcpy(d->nodes, nodes, (size_t)d->n_nodes * sizeof *nodes);
    pthread_mutex_unlock(&d->mu);
}

void cm_train_dash_status(cm_train_dash *d, const char *text) {
    pthread_mutex_lock(&d->mu);
    snprintf(d->status, sizeof d->status, "%s", text ? text : "");
    pthread_mutex_unlock(&d->mu);
}

void cm_train_dash_stop(cm_train_dash *d) {
    if (!d) return;
    if (d->d) MHD_stop_daemon(d->d);
    pthread_mutex_destroy(&d->mu);
    cm_free(d->pts);
    cm_free(d);
}
