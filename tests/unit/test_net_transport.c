/* test_net_transport.c: net's transport seam (issue 18) without MPI. A fake
 * provider claims host "loop": its listener is a Unix socket in a private
 * directory and its dial connects there, as the MPI bridge hands the cluster
 * code local stream sockets. Over it the usual handshake (encrypted, with a
 * key) and frames must work unchanged, the connection must be named
 * "loop:PORT" and the accepted one by the dialer's bound socket name (as the
 * MPI bridge names a rank), the provider must see the port asked for, and with the
 * provider removed "loop" must be an ordinary (unresolvable) host again. */
#include "test.h"
#include "fixtures.h"

#include "base/base.h"
#include "net/net.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char g_dir[32], g_path[64];
static int g_dialed_port = -1, g_listen_port = -1;
static uint8_t k_key[32];

static int loop_listen(void *ctx, uint16_t port, int *fd, uint16_t *bound, char *err, size_t errlen) {
    (void)ctx;
    g_listen_port = port;
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_path);
    if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 4)) {
        if (s >= 0) close(s);
        return cm_errf(err, errlen, CM_EIO, "loop: cannot listen");
    }
    *fd = s;
    *bound = 42;
    return 0;
}

static int loop_connect(void *ctx, uint16_t port, int timeout_ms, int *fd, char *err, size_t errlen) {
    (void)ctx;
    (void)timeout_ms;
    g_dialed_port = port;
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX}, me = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_path);
    snprintf(me.sun_path, sizeof me.sun_path, "%s/loop-r%u:1", g_dir, (unsigned)port); /* the name the server sees */
    if (s >= 0 && bind(s, (struct sockaddr *)&me, sizeof me)) {
        close(s);
        s = -1;
    }
    unlink(me.sun_path);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa)) {
        if (s >= 0) close(s);
        return cm_errf(err, errlen, CM_EIO, "loop: cannot connect");
    }
    *fd = s;
    return 0;
}

typedef struct srv {
    cm_listener *l;
    int rc, n_echoed;
    char err[300], peer[64], peer_host[64];
} srv;

static void *srv_main(void *arg) {
    srv *s = arg;
    cm_conn *c = NULL;
    cm_net_cfg cfg = {.mode = CM_SEC_ENCRYPT, .handshake_ms = 3000};
    memcpy(cfg.key, k_key, 32);
    cm_msg_hello me;
    fx_hello(&me, "server", 0x55, CM_ROLE_NODE);
    s->rc = cm_listener_accept(s->l, 5000, &c, s->err, sizeof s->err);
    if (!s->rc) s->rc = cm_conn_handshake(c, false, &cfg, &me, NULL, s->err, sizeof s->err);
    if (!s->rc) snprintf(s->peer, sizeof s->peer, "%s", cm_conn_peer(c));
    if (!s->rc) cm_conn_peer_host(c, s->peer_host, sizeof s->peer_host);
    while (!s->rc) {
        cm_msg m;
        if (cm_conn_recv(c, &m, 3000, s->err, sizeof s->err) || m.type != CM_MSG_PING) break;
        m.type = CM_MSG_PONG;
        if (cm_conn_send(c, &m, 3000, s->err, sizeof s->err)) break;
        s->n_echoed++;
    }
    cm_conn_close(c, "done");
    return NULL;
}

static void test_seam(void) {
    static const cm_net_transport tr = {.host = "loop", .connect = loop_connect, .listen = loop_listen};
    cm_net_set_transport(&tr);
    char e[300];
    srv s = {0};
    CHECKF(cm_net_listen("loop", 3, &s.l, e, sizeof e) == 0, "%s", e);
    if (!s.l) return;
    CHECK(g_listen_port == 3 && cm_listener_port(s.l) == 42);
    pthread_t th;
    pthread_create(&th, NULL, srv_main, &s);
    cm_conn *c = NULL;
    cm_net_cfg cfg = {.mode = CM_SEC_ENCRYPT, .handshake_ms = 3000};
    memcpy(cfg.key, k_key, 32);
    cm_msg_hello me, peer;
    fx_hello(&me, "client", 0xaa, CM_ROLE_NODE);
    int rc = cm_net_connect("loop", 7, 3000, &c, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    if (!rc) rc = cm_conn_handshake(c, true, &cfg, &me, &peer, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    CHECK(g_dialed_port == 7);
    if (!rc) {
        CHECKF(!strcmp(cm_conn_peer(c), "loop:7"), "peer '%s'", cm_conn_peer(c));
        CHECK(!strcmp(peer.name, "server"));
        static uint8_t big[300000];
        for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7);
        for (int k = 0; k < 3 && !rc; k++) {
            cm_msg m = {.type = CM_MSG_PING};
            m.u.ping.id = (uint64_t)k + 1;
            m.u.ping.data = big;
            m.u.ping.data_len = k == 1 ? sizeof big : 16;
            rc = cm_conn_send(c, &m, 3000, e, sizeof e);
            cm_msg r;
            if (!rc) rc = cm_conn_recv(c, &r, 3000, e, sizeof e);
            CHECKF(rc == 0, "%s", e);
            if (!rc) {
                CHECK(r.type == CM_MSG_PONG && r.u.ping.id == (uint64_t)k + 1 &&
                      r.u.ping.data_len == m.u.ping.data_len);
                CHECK(!memcmp(r.u.ping.data, big, r.u.ping.data_len));
            }
        }
    }
    cm_conn_close(c, "bye");
    pthread_join(th, NULL);
    CHECKF(s.rc == 0, "server: %s", s.err);
    CHECK(s.n_echoed == 3);
    CHECKF(!strcmp(s.peer_host, "loop-r7"), "server's peer host '%s'", s.peer_host); /* per-source limits count this */
    CHECKF(!strcmp(s.peer, "loop-r7:1"), "server's peer '%s'", s.peer);              /* the dialer's bound name */
    cm_listener_close(s.l);
    /* Without the provider "loop" is a host name like any other. */
    cm_net_set_transport(NULL);
    cm_conn *c2 = NULL;
    CHECK(cm_net_connect("loop", 7, 500, &c2, e, sizeof e) != 0 && !c2);
}

int main(void) {
    (void)cm_log_get_level();
    cm_net_key_generate(k_key);
    snprintf(g_dir, sizeof g_dir, "/tmp/cmtr.XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_path, sizeof g_path, "%s/s", g_dir);
    RUN(test_seam);
    unlink(g_path);
    rmdir(g_dir);
    TEST_END();
}
