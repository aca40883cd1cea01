/* test_net.c: real TCP on loopback (127.0.0.1 and ::1 only). A server thread
 * accepts, runs the handshake and echoes every frame back; the main thread is
 * an honest client or a hostile one (wrong key, --insecure on one side only,
 * replayed / bit-flipped / reordered / unauthenticated frames written raw, a
 * stall mid-frame, bytes that are not cumulo at all). Refusals must come back
 * as error codes with the peer's address on both sides, and be logged. */
#include "test.h"
#include "fixtures.h"

#include "base/base.h"
#include "net/net.h"
#include "os/os.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static uint8_t k_key[32], k_other[32];

typedef struct srv {
    const char *host;
    cm_listener *l;
    uint16_t port;
    cm_net_cfg cfg;
    int recv_ms;
    int hs_rc;
    char hs_err[600];
    int recv_rc;
    char recv_err[600];
    int n_msgs, quiet;
    unsigned last_type;
    enum cm_conn_state end_state;
    cm_msg_hello peer;
    pthread_t th;
} srv;

static void *srv_main(void *arg) {
    srv *s = arg;
    cm_conn *c = NULL;
    s->hs_rc = cm_listener_accept(s->l, 5000, &c, s->hs_err, sizeof s->hs_err);
    if (s->hs_rc) return NULL;
    cm_msg_hello me;
    fx_hello(&me, "server", 0x55, CM_ROLE_NODE);
    s->hs_rc = cm_conn_handshake(c, false, &s->cfg, &me, &s->peer, s->hs_err, sizeof s->hs_err);
    while (!s->hs_rc) {
        unsigned type;
        const uint8_t *p;
        size_t n;
        s->recv_rc = cm_conn_recv_payload(c, &type, &p, &n, s->recv_ms, s->recv_err, sizeof s->recv_err);
        if (s->recv_rc == CM_ETIMEDOUT && cm_conn_state(c) == CM_CONN_READY && s->quiet < 3) {
            s->quiet++;
            continue;
        }
        if (s->recv_rc) break;
        s->n_msgs++;
        s->last_type = type;
        if (type == CM_MSG_BYE) break;
        /* echo (copy first: the payload view dies with the next call on c) */
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, p, n);
        char e[256];
        int rc = cm_conn_send_payload(c, type, copy, n, 5000, e, sizeof e);
        free(copy);
        if (rc) break;
    }
    s->end_state = cm_conn_state(c);
    cm_conn_close(c, "server done");
    return NULL;
}

static void srv_start(srv *s, const char *host, cm_sec_mode mode, const uint8_t *key) {
    char e[256];
    memset(s, 0, sizeof *s);
    s->host = host;
    s->cfg.mode = mode;
    if (key) memcpy(s->cfg.key, key, 32);
    s->cfg.handshake_ms = 3000;
    s->recv_ms = 3000;
    s->hs_rc = -999;
    int rc = cm_net_listen(host, 0, &s->l, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    if (rc) return;
    s->port = cm_listener_port(s->l);
    CHECK(s->port != 0);
    pthread_create(&s->th, NULL, srv_main, s);
}

static void srv_join(srv *s) {
    if (!s->l) return;
    pthread_join(s->th, NULL);
    cm_listener_close(s->l);
    s->l = NULL;
}

static int client(const char *host, uint16_t port, cm_sec_mode mode, const uint8_t *key, cm_conn **c,
                  cm_msg_hello *peer, char *e, size_t el) {
    cm_net_cfg cfg = {.mode = mode, .handshake_ms = 3000};
    if (key) memcpy(cfg.key, key, 32);
    int rc = cm_net_connect(host, port, 3000, c, e, el);
    if (rc) return rc;
    cm_msg_hello me;
    fx_hello(&me, "client", 0xaa, CM_ROLE_NODE);
    return cm_conn_handshake(*c, true, &cfg, &me, peer, e, el);
}

static void test_parse_addr(void) {
    char h[64], e[128];
    uint16_t p;
    CHECK(cm_net_parse_addr("10.0.0.2:7071", 7070, h, sizeof h, &p, e, sizeof e) == 0 && !strcmp(h, "10.0.0.2") &&
          p == 7071);
    CHECK(cm_net_parse_addr("mini.local", 7070, h, sizeof h, &p, e, sizeof e) == 0 && !strcmp(h, "mini.local") &&
          p == 7070);
    CHECK(cm_net_parse_addr("[fe80::1]:9", 7070, h, sizeof h, &p, e, sizeof e) == 0 && !strcmp(h, "fe80::1") && p == 9);
    CHECK(cm_net_parse_addr("::1", 7070, h, sizeof h, &p, e, sizeof e) == 0 && !strcmp(h, "::1") && p == 7070);
    CHECK(cm_net_parse_addr("host:0", 7070, h, sizeof h, &p, e, sizeof e) == CM_EINVAL);
    CHECK(cm_net_parse_addr("host:70000", 7070, h, sizeof h, &p, e, sizeof e) == CM_EINVAL);
    CHECK(cm_net_parse_addr("[::1", 7070, h, sizeof h, &p, e, sizeof e) == CM_EINVAL);
    CHECK(cm_net_parse_addr("", 7070, h, sizeof h, &p, e, sizeof e) == CM_EINVAL);
}

/* Honest peers in every mode, over IPv4 and IPv6: HELLOs arrive, messages echo intact. */
static void roundtrip(const char *listen_host, const char *host, cm_sec_mode mode) {
    srv s;
    const uint8_t *key = mode == CM_SEC_INSECURE ? NULL : k_key;
    srv_start(&s, listen_host, mode, key);
    if (!s.l) return;
    cm_conn *c = NULL;
    cm_msg_hello peer;
    char e[600];
    int rc = client(host, s.port, mode, key, &c, &peer, e, sizeof e);
    CHECKF(rc == 0, "%s %s: %s", host, cm_sec_mode_name(mode), e);
    if (rc == 0) {
        CHECK(cm_conn_state(c) == CM_CONN_READY && cm_conn_mode(c) == mode);
        CHECK(!strcmp(peer.name, "server") && peer.node_id[0] == 0x55 && peer.cores == 1);
        /* a FORWARD of 256 x 4096 floats (4 MiB: several rx growth steps) */
        uint32_t nt = 256, dim = 4096;
        int32_t *pos = malloc(nt * 4), *seq = malloc(nt * 4);
        uint8_t *want = calloc(nt, 1);
        float *hid = malloc((size_t)nt * dim * 4), *row = malloc(dim * 4);
        for (uint32_t i = 0; i < nt; i++) {
            pos[i] = (int32_t)i;
            seq[i] = (int32_t)(i % 3);
        }
        want[nt - 1] = 1;
        for (size_t k = 0; k < (size_t)nt * dim; k++) hid[k] = (float)k * 0.001f - 7.0f;
        cm_msg m = {.type = CM_MSG_FORWARD}, r;
        m.u.forward = (cm_msg_forward){.epoch = 4,
                                       .request_id = 99,
                                       .n_tokens = nt,
                                       .dim = dim,
                                       .dtype = CM_HIDDEN_F32,
                                       .pos = pos,
                                       .seq = seq,
                                       .want = want,
                                       .hidden = hid};
        CHECKF(cm_conn_send(c, &m, 5000, e, sizeof e) == 0, "%s", e);
        CHECKF(cm_conn_recv(c, &r, 5000, e, sizeof e) == 0, "%s", e);
        CHECK(r.type == CM_MSG_FORWARD && r.u.forward.n_tokens == nt && r.u.forward.dim == dim);
        if (r.type == CM_MSG_FORWARD) {
            bool same = true;
            for (uint32_t i = 0; i < nt && same; i += 17) {
                cm_msg_forward_row(&r.u.forward, i, row);
                same = !memcmp(row, hid + (size_t)i * dim, dim * 4) && cm_msg_forward_seq(&r.u.forward, i) == seq[i];
            }
            CHECK(same && cm_msg_forward_want(&r.u.forward, nt - 1));
        }
        free(pos);
        free(seq);
        free(want);
        free(hid);
        free(row);
        /* A payload written in place (cm_conn_tx_payload + cm_conn_send_tx, the
         * all-reduce's path) arrives byte for byte; sending more than was
         * prepared is refused. */
        {
            uint64_t seal0, open0, seal1, open1;
            cm_conn_cipher_ns(c, &seal0, &open0);
            uint8_t want_pl[100];
            for (int i = 0; i < 100; i++) want_pl[i] = (uint8_t)(i * 7 + 1);
            uint8_t *tx = cm_conn_tx_payload(c, sizeof want_pl);
            CHECK(tx != NULL);
            if (tx) {
                memcpy(tx, want_pl, sizeof want_pl);
                CHECKF(cm_conn_send_tx(c, CM_MSG_ALLREDUCE, sizeof want_pl, 5000, e, sizeof e) == 0, "%s", e);
                unsigned type = 0;
                const uint8_t *p = NULL;
                size_t n = 0;
                CHECKF(cm_conn_recv_payload(c, &type, &p, &n, 5000, e, sizeof e) == 0, "%s", e);
                CHECK(type == CM_MSG_ALLREDUCE && n == sizeof want_pl && p && !memcmp(p, want_pl, n));
            }
            CHECK(cm_conn_send_tx(c, CM_MSG_ALLREDUCE, (size_t)16 << 20, 5000, e, sizeof e) == CM_EINVAL);
            cm_conn_cipher_ns(c, &seal1, &open1);
            CHECK(seal1 > seal0 && open1 > open0); /* both directions were timed */
        }
        m = (cm_msg){.type = CM_MSG_HEARTBEAT};
        m.u.heartbeat = (cm_msg_heartbeat){.epoch = 4, .wall_ms = cm_wall_ms(), .mono_ns = cm_now_ns(), .load = 10};
        CHECK(cm_conn_send(c, &m, 2000, e, sizeof e) == 0);
        CHECK(cm_conn_recv(c, &r, 2000, e, sizeof e) == 0 && r.type == CM_MSG_HEARTBEAT &&
              r.u.heartbeat.mono_ns == m.u.heartbeat.mono_ns);
        cm_conn_close(c, "client done");
    }
    srv_join(&s);
    CHECKF(s.hs_rc == 0, "server: %s", s.hs_err);
    CHECK(s.n_msgs == 4 && s.last_type == CM_MSG_BYE && s.end_state == CM_CONN_CLOSED);
    CHECK(!strcmp(s.peer.name, "client"));
}

static void test_roundtrip(void) {
    roundtrip("127.0.0.1", "127.0.0.1", CM_SEC_ENCRYPT);
    roundtrip("::1", "::1", CM_SEC_ENCRYPT);
    roundtrip(NULL, "127.0.0.1", CM_SEC_AUTH); /* the any-address listener takes IPv4... */
    roundtrip(NULL, "::1", CM_SEC_INSECURE);   /* ...and IPv6 */
}

static void test_wrong_key(void) {
    srv s;
    srv_start(&s, "127.0.0.1", CM_SEC_ENCRYPT, k_key);
    if (!s.l) return;
    cm_conn *c = NULL;
    char e[600];
    fx_log_capture_start("net");
    int rc = client("127.0.0.1", s.port, CM_SEC_ENCRYPT, k_other, &c, NULL, e, sizeof e);
    srv_join(&s);
    char *log = fx_log_capture_end();
    CHECKF(rc == CM_EAUTH, "client rc %d: %s", rc, e);
    CHECKF(strstr(e, "peer 127.0.0.1:") && strstr(e, " does not know this cluster's key"), "%s", e);
    CHECKF(s.hs_rc == CM_EAUTH && strstr(s.hs_err, "does not know this cluster's key"), "server: %s", s.hs_err);
    CHECKF(log && strstr(log, "does not know this cluster's key (its proof is wrong"), "log: %s", log ? log : "");
    free(log);
    cm_conn_close(c, NULL);
}

static void mismatch(cm_sec_mode sm, const uint8_t *sk, cm_sec_mode cmode, const uint8_t *ck, const char *want) {
    srv s;
    srv_start(&s, "127.0.0.1", sm, sk);
    if (!s.l) return;
    cm_conn *c = NULL;
    char e[600];
    fx_log_capture_start("net");
    int rc = client("127.0.0.1", s.port, cmode, ck, &c, NULL, e, sizeof e);
    srv_join(&s);
    free(fx_log_capture_end());
    CHECKF(rc == CM_EAUTH && strstr(e, "refused the handshake: security mismatch"), "client rc %d: %s", rc, e);
    CHECKF(strstr(e, want) != NULL, "client: %s", e);
    CHECKF(s.hs_rc == CM_EAUTH && strstr(s.hs_err, want), "server: %s", s.hs_err);
    cm_conn_close(c, NULL);
}

static void test_insecure_mismatch(void) {
    mismatch(CM_SEC_ENCRYPT, k_key, CM_SEC_INSECURE, NULL,
             "the connecting node runs --insecure, the listening node requires the cluster key");
    mismatch(CM_SEC_INSECURE, NULL, CM_SEC_ENCRYPT, k_key, "the listening node runs --insecure");
    mismatch(CM_SEC_ENCRYPT, k_key, CM_SEC_AUTH, k_key,
             "the connecting node uses auth-only frames, the listening node requires");
}

enum attack { REPLAY, BITFLIP, REORDER, UNSEALED };

/* One honest frame, then an attack; the server must accept exactly the honest one. */
static void attack(enum attack a, const char *want) {
    srv s;
    srv_start(&s, "127.0.0.1", CM_SEC_ENCRYPT, k_key);
    if (!s.l) return;
    cm_conn *c = NULL;
    char e[600];
    fx_log_capture_start("net");
    int rc = client("127.0.0.1", s.port, CM_SEC_ENCRYPT, k_key, &c, NULL, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    if (rc == 0) {
        uint8_t pl[28] = {0}, f1[128], f2[128];
        size_t n1, n2;
        CHECK(cm_conn_seal_raw(c, CM_MSG_HEARTBEAT, pl, sizeof pl, f1, sizeof f1, &n1, e, sizeof e) == 0);
        CHECK(cm_conn_seal_raw(c, CM_MSG_HEARTBEAT, pl, sizeof pl, f2, sizeof f2, &n2, e, sizeof e) == 0);
        if (a == REORDER) {
            CHECK(cm_conn_write_raw(c, f2, n2, 1000, e, sizeof e) == 0);
        } else {
            CHECK(cm_conn_write_raw(c, f1, n1, 1000, e, sizeof e) == 0);
            cm_msg r;
            CHECK(cm_conn_recv(c, &r, 2000, e, sizeof e) == 0 && r.type == CM_MSG_HEARTBEAT); /* echo */
            if (a == REPLAY) CHECK(cm_conn_write_raw(c, f1, n1, 1000, e, sizeof e) == 0);
            if (a == BITFLIP) {
                f2[CM_FRAME_HDR + 5] ^= 0x01;
                CHECK(cm_conn_write_raw(c, f2, n2, 1000, e, sizeof e) == 0);
            }
            if (a == UNSEALED) {
                cm_frame_hdr h = {CM_PROTO_VERSION, CM_MSG_HEARTBEAT, 0, 1, sizeof pl};
                cm_frame_hdr_encode(&h, f2);
                memcpy(f2 + CM_FRAME_HDR, pl, sizeof pl);
                CHECK(cm_conn_write_raw(c, f2, CM_FRAME_HDR + sizeof pl, 1000, e, sizeof e) == 0);
            }
        }
    }
    srv_join(&s);
    char *log = fx_log_capture_end();
    CHECKF(s.hs_rc == 0, "%s", s.hs_err);
    CHECKF(s.recv_rc == CM_EAUTH && strstr(s.recv_err, "peer 127.0.0.1:") && strstr(s.recv_err, want),
           "server rc %d: %s", s.recv_rc, s.recv_err);
    CHECK(s.n_msgs == (a == REORDER ? 0 : 1)); /* the attack had no effect */
    CHECK(s.end_state == CM_CONN_FAILED);
    CHECKF(log && strstr(log, want), "log lacks '%s': %s", want, log ? log : "");
    free(log);
    cm_conn_close(c, NULL);
}

static void test_hostile_frames(void) {
    attack(REPLAY, "sent a replayed HEARTBEAT frame (seq 3, expected 4)");
    attack(BITFLIP, "sent a HEARTBEAT frame with a bad MAC");
    attack(REORDER, "sent an out-of-order HEARTBEAT frame (seq 4, expected 3)");
    attack(UNSEALED, "sent an unauthenticated HEARTBEAT frame");
}

/* A quiet line is not an error; a peer that stops mid-frame hits the deadline. */
static void test_stall(void) {
    srv s;
    srv_start(&s, "127.0.0.1", CM_SEC_ENCRYPT, k_key);
    if (!s.l) return;
    s.recv_ms = 300;
    cm_conn *c = NULL;
    char e[600];
    fx_log_capture_start("net");
    int rc = client("127.0.0.1", s.port, CM_SEC_ENCRYPT, k_key, &c, NULL, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    if (rc == 0) {
        cm_sleep_ms(450); /* the server sees one quiet timeout and keeps the connection */
        uint8_t pl[28] = {0}, f[128];
        size_t n;
        CHECK(cm_conn_seal_raw(c, CM_MSG_HEARTBEAT, pl, sizeof pl, f, sizeof f, &n, e, sizeof e) == 0);
        CHECK(cm_conn_write_raw(c, f, 30, 1000, e, sizeof e) == 0); /* header + 10 bytes, then silence */
    }
    srv_join(&s);
    free(fx_log_capture_end());
    CHECK(s.quiet >= 1);
    CHECKF(s.recv_rc == CM_ETIMEDOUT && strstr(s.recv_err, "stalled mid-frame (30 bytes received"), "rc %d: %s",
           s.recv_rc, s.recv_err);
    CHECK(s.end_state == CM_CONN_FAILED);
    cm_conn_close(c, NULL);
}

/* A peer that takes no byte: a send gives up after the connection's stall
 * bound (not the call's 20 s deadline); a slow reader that keeps taking
 * bytes lets a transfer run far longer than the stall bound. */
typedef struct sink {
    cm_listener *l;
    int slow; /* 0: read nothing (frozen), else read 16 kB every 20 ms */
    atomic_int done;
    size_t got;
    pthread_t th;
} sink;

static void *sink_main(void *arg) {
    sink *k = arg;
    cm_conn *c = NULL;
    char e[300];
    if (cm_listener_accept(k->l, 5000, &c, e, sizeof e)) return NULL;
    cm_net_cfg cfg = {.mode = CM_SEC_ENCRYPT, .handshake_ms = 3000};
    memcpy(cfg.key, k_key, 32);
    cm_msg_hello me;
    fx_hello(&me, "sink", 0x66, CM_ROLE_NODE);
    if (cm_conn_handshake(c, false, &cfg, &me, NULL, e, sizeof e) == 0) {
        static uint8_t buf[16384];
        while (!atomic_load(&k->done)) {
            if (!k->slow) {
                cm_sleep_ms(10);
                continue;
            }
            if (cm_fd_wait_readable(cm_conn_fd(c), 20) <= 0) continue;
            ssize_t r = recv(cm_conn_fd(c), buf, sizeof buf, 0);
            if (r > 0) k->got += (size_t)r;
            cm_sleep_ms(20);
        }
    }
    cm_conn_close(c, NULL);
    return NULL;
}

static void test_send_stall(void) {
    for (int slow = 0; slow < 2; slow++) {
        setenv("CUMULO_TEST_SOCKBUF", "16384", 1); /* buffers fill after a few kB */
        cm_config_reload();
        sink k = {.slow = slow};
        char e[600];
        int rc = cm_net_listen("127.0.0.1", 0, &k.l, e, sizeof e);
        CHECKF(rc == 0, "%s", e);
        if (rc) {
            unsetenv("CUMULO_TEST_SOCKBUF");
            cm_config_reload();
            return;
        }
        pthread_create(&k.th, NULL, sink_main, &k);
        cm_conn *c = NULL;
        rc = client("127.0.0.1", cm_listener_port(k.l), CM_SEC_ENCRYPT, k_key, &c, NULL, e, sizeof e);
        unsetenv("CUMULO_TEST_SOCKBUF");
        cm_config_reload();
        CHECKF(rc == 0, "%s", e);
        if (rc == 0) {
            cm_conn_set_send_stall(c, 300);
            size_t n = 1u << 20;
            uint8_t *big = calloc(1, n);
            double t0 = cm_now_s();
            fx_log_capture_start("net");
            rc = cm_conn_send_payload(c, CM_MSG_PING, big, n, 20000, e, sizeof e);
            free(fx_log_capture_end());
            double el = cm_now_s() - t0;
            if (!slow) {
                /* frozen: gives up after ~0.3 s without progress, long before 20 s */
                CHECKF(rc == CM_ETIMEDOUT && strstr(e, "took none of our data for 300 ms"), "rc %d: %s", rc, e);
                CHECKF(el < 10, "gave up after %.2f s", el);
                CHECK(cm_conn_state(c) == CM_CONN_FAILED);
            } else {
                /* slow but moving: ~64 reads 20 ms apart, well past the 0.3 s stall bound */
                CHECKF(rc == 0, "rc %d: %s", rc, e);
                CHECKF(el > 0.3, "the slow transfer took only %.2f s: it did not test the stall bound", el);
            }
            printf("  send stall (%s peer): rc %d after %.2f s\n", slow ? "slow" : "frozen", rc, el);
            free(big);
        }
        atomic_store(&k.done, 1);
        pthread_join(k.th, NULL);
        cm_conn_close(c, NULL);
        cm_listener_close(k.l);
    }
}

/* Peers that never speak cumulo, or break the handshake's rules. */
static void raw_peer(const void *bytes, size_t n, int hs_ms, int want_rc, const char *want) {
    srv s;
    srv_start(&s, "127.0.0.1", CM_SEC_ENCRYPT, k_key);
    if (!s.l) return;
    s.cfg.handshake_ms = hs_ms;
    cm_conn *c = NULL;
    char e[600];
    fx_log_capture_start("net");
    int rc = cm_net_connect("127.0.0.1", s.port, 2000, &c, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    if (rc == 0 && n) CHECK(cm_conn_write_raw(c, bytes, n, 1000, e, sizeof e) == 0);
    srv_join(&s);
    free(fx_log_capture_end());
    CHECKF(s.hs_rc == want_rc && strstr(s.hs_err, want), "rc %d: %s", s.hs_rc, s.hs_err);
    cm_conn_close(c, NULL);
}

static void test_foreign_peers(void) {
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_peer(http, sizeof http - 1, 2000, CM_EFORMAT, "not a cumulo frame");
    uint8_t h[CM_FRAME_HDR];
    cm_frame_hdr fh = {CM_PROTO_VERSION, CM_MSG_FORWARD, 0, 0, 100u << 20};
    cm_frame_hdr_encode(&fh, h);
    raw_peer(h, sizeof h, 2000, CM_EPROTO, "sent a FORWARD frame before the handshake finished");
    fh = (cm_frame_hdr){CM_PROTO_VERSION, CM_MSG_AUTH_INIT, 0, 0, 1u << 30};
    cm_frame_hdr_encode(&fh, h);
    raw_peer(h, sizeof h, 2000, CM_ERANGE, "AUTH_INIT frame of 1073741824 bytes exceeds the maximum of 128");
    fh = (cm_frame_hdr){7, CM_MSG_AUTH_INIT, 0, 0, 68};
    cm_frame_hdr_encode(&fh, h);
    raw_peer(h, sizeof h, 2000, CM_EUNSUPPORTED, "that node runs cumulo protocol 7, this node protocol");
    raw_peer(NULL, 0, 300, CM_ETIMEDOUT, "did not finish the handshake within 300 ms");
}

static void test_connect_refused(void) {
    cm_listener *l;
    char e[300];
    CHECK(cm_net_listen("127.0.0.1", 0, &l, e, sizeof e) == 0);
    uint16_t port = cm_listener_port(l);
    cm_listener_close(l); /* nobody listens there now */
    cm_conn *c = NULL;
    CHECK(cm_net_connect("127.0.0.1", port, 1000, &c, e, sizeof e) == CM_EIO && c == NULL);
    CHECKF(strstr(e, "cannot connect to 127.0.0.1 port") != NULL, "%s", e);
    CHECK(cm_net_listen("127.0.0.1", 0, &l, e, sizeof e) == 0);
    CHECK(cm_listener_accept(l, 50, &c, e, sizeof e) == CM_ETIMEDOUT && c == NULL);
    cm_listener_close(l);
}

static void test_key_file(void) {
    char dir[64], path[128], e[300];
    snprintf(dir, sizeof dir, "/tmp/cumulo-key-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/sub/cluster.key", dir);
    uint8_t a[32], b[32];
    cm_net_key_generate(a);
    CHECK(cm_net_key_load(path, b, e, sizeof e) == CM_ENOENT);
    CHECKF(strstr(e, "cumulo key --new") != NULL, "%s", e);
    CHECKF(cm_net_key_save(path, a, e, sizeof e) == 0, "%s", e);
    CHECK(cm_net_key_load(path, b, e, sizeof e) == 0 && !memcmp(a, b, 32));
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 65);
    char fa[17], fb[17];
    cm_net_key_fingerprint(a, fa);
    cm_net_key_fingerprint(k_key, fb);
    CHECK(strlen(fa) == 16 && strcmp(fa, fb) != 0);
    CHECK(cm_net_key_parse("  0011", b, e, sizeof e) == CM_EFORMAT);
    CHECK(cm_net_key_parse("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", b, e, sizeof e) == 0 &&
          b[1] == 0x11);
    CHECK(cm_net_key_parse("00112233445566778899aabbccddeeff00112233445566778899aabbccddeefg", b, e, sizeof e) ==
          CM_EFORMAT);
    setenv("CUMULO_KEY_FILE", "/x/y.key", 1);
    cm_config_reload();
    CHECK(cm_net_key_default_path(path, sizeof path, e, sizeof e) == 0 && !strcmp(path, "/x/y.key"));
    unsetenv("CUMULO_KEY_FILE");
    cm_config_reload();
    setenv("HOME", "/home/u", 1);
    cm_config_reload();
    CHECK(cm_net_key_default_path(path, sizeof path, e, sizeof e) == 0 &&
          !strcmp(path, "/home/u/.config/cumulo/cluster.key"));
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    /* NEEDSWORK: base reads CUMULO_LOG lazily without a lock (a TSan race when two
     * threads log first); read it once here, before any thread starts. */
    (void)cm_log_get_level();
    cm_net_key_generate(k_key);
    cm_net_key_generate(k_other);
    RUN(test_parse_addr);
    RUN(test_roundtrip);
    RUN(test_wrong_key);
    RUN(test_insecure_mismatch);
    RUN(test_hostile_frames);
    RUN(test_stall);
    RUN(test_send_stall);
    RUN(test_foreign_peers);
    RUN(test_connect_refused);
    RUN(test_key_file);
    TEST_END();
}
