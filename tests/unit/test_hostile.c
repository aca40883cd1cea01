/*
 * test_hostile.c (issue 7): hostile peers against the node daemon. Every
 * attack opens its own TCP connection to a `cumulo node` (cm_node_run on a
 * thread here, on 127.0.0.1 with a cluster key) and must be refused, with a
 * log line naming the peer, and with no effect: afterwards an honest peer
 * still completes a handshake and a PING. tests/unit/test_net.c covers the
 * same frames against a bare connection; this covers what the daemon does
 * with them (its accept loop, per-connection threads, message dispatch).
 *
 * Attacks: the wrong key; --insecure against a keyed node; bytes that are not
 * a cumulo frame; an oversized and a truncated handshake frame; a whole
 * session's client bytes (captured through a recording proxy) replayed on a
 * new connection; an authenticated frame replayed on its connection; a frame
 * with a flipped MAC byte; an authenticated frame whose payload is garbage;
 * an oversized authenticated header; ASSIGN from a peer that is not a
 * coordinator; FORWARD without an assignment; TRAIN from a peer that is
 * not the coordinator (SETUP, a BWD, a FWD of another epoch); EXPERT_LOAD
 * sent to a node (ignored), and the coordinator's rule for it
 * (cluster/ep_load.h: only rank 0 of a later stage, its own layers). And a
 * coordinator whose LoRA parts (ASSIGN's CM_ASSIGN_F_LORA) are hostile:
 * bytes that are not the announced object, or another stage's layers: the
 * node answers READY with the reason and keeps no stage; honest parts load.
 *
 * Tool mode, for tests/sh/cluster_hostile.sh: with CM_HOSTILE_ADDR=host:port
 * the same attacks run against that node (a separate process, key from
 * CUMULO_KEY_FILE); the script checks the node's log and that a cluster
 * serving through it is unaffected. Only loopback or test namespaces.
 */
#include "test.h"
#include "fixtures.h"

#include "base/base.h"
#include "cluster/cluster.h"
#include "cluster/ep_load.h"
#include "gguf/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "synth/synth.h"
#include "net/net.h"
#include "os/os.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <errno.h>
#include <sys/stat.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

static char g_host[64] = "127.0.0.1";
static uint16_t g_port;
static uint8_t g_key[CM_KEY_BYTES];
static bool g_tool; /* attacking another process: its log is checked by the caller */

static void hello(cm_msg_hello *h, uint32_t roles) {
    memset(h, 0, sizeof *h);
    h->proto_version = CM_PROTO_VERSION;
    for (int i = 0; i < CM_NODE_ID_BYTES; i++) h->node_id[i] = (uint8_t)(0xa0 + i);
    snprintf(h->name, sizeof h->name, "hostile");
    h->roles = roles;
    h->cores = 1;
    h->mem_total = 1 << 30;
    h->mem_free = 1 << 29;
    snprintf(h->os, sizeof h->os, "linux");
    snprintf(h->arch, sizeof h->arch, "x86_64");
    snprintf(h->version, sizeof h->version, "0");
}

/* A connection with the handshake done in mode/key (NULL on failure; rc and e say why). */
static cm_conn *dial(cm_sec_mode mode, const uint8_t *key, uint32_t roles, int *rc, char *e, size_t el) {
    cm_conn *c = NULL;
    *rc = cm_net_connect(g_host, g_port, 3000, &c, e, el);
    if (*rc) return NULL;
    cm_net_cfg cfg = {.mode = mode, .handshake_ms = 3000};
    if (key) memcpy(cfg.key, key, CM_KEY_BYTES);
    cm_msg_hello me;
    hello(&me, roles);
    *rc = cm_conn_handshake(c, true, &cfg, &me, NULL, e, el);
    if (*rc) {
        cm_conn_close(c, NULL);
        return NULL;
    }
    return c;
}

/* Whether the node closes the connection within 3 s (it must, after a refusal). */
static bool closed_by_node(cm_conn *c) {
    int fd = cm_conn_fd(c);
    uint64_t end = cm_now_ns() + 3000000000ull;
    while (cm_now_ns() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        uint8_t b[4096];
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
}

/* A raw TCP connection and some bytes; true when the node then closes it. */
static bool raw_send_expect_close(const void *p, size_t n, bool half_close) {
    cm_conn *c = NULL;
    char e[300];
    if (cm_net_connect(g_host, g_port, 3000, &c, e, sizeof e)) return false;
    bool ok = cm_conn_write_raw(c, p, n, 2000, e, sizeof e) == 0;
    if (half_close) shutdown(cm_conn_fd(c), SHUT_WR);
    ok = ok && closed_by_node(c);
    cm_conn_close(c, NULL);
    return ok;
}

/* A raw TCP connection and some bytes; what the node sends back until it
 * closes the connection (within 3 s), at most cap bytes. */
static size_t raw_send_reply(const void *p, size_t n, uint8_t *out, size_t cap) {
    cm_conn *c = NULL;
    char e[300];
    size_t got = 0;
    if (cm_net_connect(g_host, g_port, 3000, &c, e, sizeof e)) return 0;
    if (cm_conn_write_raw(c, p, n, 2000, e, sizeof e) == 0) {
        const int fd = cm_conn_fd(c);
        const uint64_t end = cm_now_ns() + 3000000000ull;
        while (cm_now_ns() < end && got < cap) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            if (poll(&pf, 1, 100) <= 0) continue;
            ssize_t k = recv(fd, out + got, cap - got, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) break;
            if (k > 0) got += (size_t)k;
        }
    }
    cm_conn_close(c, NULL);
    return got;
}

/* An honest peer still gets in and gets a PONG. */
static bool honest_ping(void) {
    int rc;
    char e[400];
    cm_conn *c = dial(CM_SEC_ENCRYPT, g_key, CM_ROLE_NODE, &rc, e, sizeof e);
    if (!c) {
        fprintf(stderr, "honest peer refused: %s\n", e);
        return false;
    }
    cm_msg m = {.type = CM_MSG_PING}, r;
    m.u.ping.id = 42;
    bool ok = cm_conn_send(c, &m, 2000, e, sizeof e) == 0 && cm_conn_recv(c, &r, 3000, e, sizeof e) == 0 &&
              r.type == CM_MSG_PONG && r.u.ping.id == 42;
    if (!ok) fprintf(stderr, "honest PING failed: %s\n", e);
    cm_conn_close(c, "done");
    return ok;
}

/* ---- attacks before the handshake ---- */

static void test_wrong_key(void) {
    uint8_t other[CM_KEY_BYTES];
    memcpy(other, g_key, sizeof other);
    other[7] ^= 0x40;
    int rc;
    char e[400];
    cm_conn *c = dial(CM_SEC_ENCRYPT, other, CM_ROLE_COORDINATOR, &rc, e, sizeof e);
    CHECKF(!c && rc == CM_EAUTH && strstr(e, "does not know this cluster's key"), "rc %d: %s", rc, e);
    cm_conn_close(c, NULL);
    c = dial(CM_SEC_INSECURE, NULL, CM_ROLE_COORDINATOR, &rc, e, sizeof e);
    CHECKF(!c && rc == CM_EAUTH && strstr(e, "--insecure"), "rc %d: %s", rc, e);
    cm_conn_close(c, NULL);
    CHECK(honest_ping());
}

static void test_not_a_frame(void) {
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(raw_send_expect_close(http, sizeof http - 1, false));
    /* An AUTH_INIT header announcing 4 GiB: refused from the header alone. */
    uint8_t f[CM_FRAME_HDR];
    cm_frame_hdr h = {CM_PROTO_VERSION, CM_MSG_AUTH_INIT, 0, 0, 0xfffffff0u};
    cm_frame_hdr_encode(&h, f);
    CHECK(raw_send_expect_close(f, sizeof f, false));
    /* Another protocol version, older and newer: the node answers in the
     * peer's own version with the reason (what a cumulo of that version
     * shows: "peer ... refused the handshake: <text>"), then closes. */
    for (int d = -1; d <= 1; d += 2) {
        uint8_t init[CM_FRAME_HDR + CM_HS_INIT_BYTES] = {0}, got[2048];
        const unsigned v = (unsigned)(CM_PROTO_VERSION + d);
        h = (cm_frame_hdr){(uint8_t)v, CM_MSG_AUTH_INIT, 0, 0, CM_HS_INIT_BYTES};
        cm_frame_hdr_encode(&h, init);
        cm_wr_u16(init + CM_FRAME_HDR, (uint16_t)v);
        size_t n = raw_send_reply(init, sizeof init, got, sizeof got);
        unsigned gv = 0;
        cm_msg m = {0};
        char e[256] = "", want[300];
        const bool framed = cm_frame_hdr_version(got, n, &gv) && gv == v && got[5] == CM_MSG_ERROR && got[6] == 0 &&
                            got[7] == 0 && cm_rd_u64(got + 8) == 0 && cm_rd_u32(got + 16) == n - CM_FRAME_HDR &&
                            cm_msg_decode(CM_MSG_ERROR, got + CM_FRAME_HDR, n - CM_FRAME_HDR, &m, e, sizeof e) == 0;
        cm_proto_mismatch_text(want, sizeof want, v, CM_PROTO_VERSION);
        CHECKF(framed && m.u.error.code == CM_EUNSUPPORTED && !strcmp(m.u.error.text, want),
               "version %u: %zu bytes back, %s: '%s'", v, n, e, m.u.error.text);
    }
    /* A truncated AUTH_INIT (10 of 68 payload bytes), then the writer closes. */
    uint8_t t[CM_FRAME_HDR + 10] = {0};
    h = (cm_frame_hdr){CM_PROTO_VERSION, CM_MSG_AUTH_INIT, 0, 0, CM_HS_INIT_BYTES};
    cm_frame_hdr_encode(&h, t);
    CHECK(raw_send_expect_close(t, sizeof t, true));
    /* A FORWARD before any handshake. */
    h = (cm_frame_hdr){CM_PROTO_VERSION, CM_MSG_FORWARD, 0, 0, 8};
    uint8_t fw[CM_FRAME_HDR + 8] = {0};
    cm_frame_hdr_encode(&h, fw);
    CHECK(raw_send_expect_close(fw, sizeof fw, false));
    CHECK(honest_ping());
}

/* A recording proxy: one client connection relayed to the node; what the
 * client sent is kept, to be replayed whole on a new connection. */
typedef struct proxy {
    int lfd;
    uint16_t port;
    uint8_t sent[8192];
    size_t n_sent;
    pthread_t th;
} proxy;

static void *proxy_main(void *arg) {
    proxy *x = arg;
    int a = accept(x->lfd, NULL, NULL);
    if (a < 0) return NULL;
    int b = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(g_port)};
    inet_pton(AF_INET, g_host, &sa.sin_addr);
    if (connect(b, (struct sockaddr *)&sa, sizeof sa) == 0) {
        for (;;) {
            struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
            if (poll(p, 2, 5000) <= 0) break;
            uint8_t buf[4096];
            if (p[0].revents) {
                ssize_t k = recv(a, buf, sizeof buf, 0);
                if (k <= 0) break;
                if (x->n_sent + (size_t)k <= sizeof x->sent) {
                    memcpy(x->sent + x->n_sent, buf, (size_t)k);
                    x->n_sent += (size_t)k;
                }
                if (send(b, buf, (size_t)k, MSG_NOSIGNAL) != k) break;
            }
            if (p[1].revents) {
                ssize_t k = recv(b, buf, sizeof buf, 0);
                if (k <= 0) break;
                if (send(a, buf, (size_t)k, MSG_NOSIGNAL) != k) break;
            }
        }
    }
    close(a);
    close(b);
    return NULL;
}

static void test_session_replay(void) {
    proxy x = {.lfd = socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    CHECK(bind(x.lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(x.lfd, 1) == 0 &&
          getsockname(x.lfd, (struct sockaddr *)&sa, &sl) == 0);
    x.port = ntohs(sa.sin_port);
    pthread_create(&x.th, NULL, proxy_main, &x);
    /* An honest session through the proxy: handshake, PING, PONG, BYE. */
    cm_conn *c = NULL;
    char e[400];
    int rc = cm_net_connect("127.0.0.1", x.port, 3000, &c, e, sizeof e);
    cm_net_cfg cfg = {.mode = CM_SEC_ENCRYPT, .handshake_ms = 3000};
    memcpy(cfg.key, g_key, sizeof cfg.key);
    cm_msg_hello me;
    hello(&me, CM_ROLE_NODE);
    if (!rc) rc = cm_conn_handshake(c, true, &cfg, &me, NULL, e, sizeof e);
    cm_msg m = {.type = CM_MSG_PING}, r;
    m.u.ping.id = 7;
    if (!rc) rc = cm_conn_send(c, &m, 2000, e, sizeof e);
    if (!rc) rc = cm_conn_recv(c, &r, 3000, e, sizeof e);
    CHECKF(rc == 0 && r.type == CM_MSG_PONG, "honest session through the proxy: %s", e);
    cm_conn_close(c, "done");
    pthread_join(x.th, NULL);
    close(x.lfd);
    CHECK(x.n_sent > CM_FRAME_HDR + CM_HS_INIT_BYTES);
    /* The same bytes again: the node's fresh nonce and ephemeral key make the
     * old proof wrong, so the replayer never gets past AUTH_FINISH. */
    CHECK(raw_send_expect_close(x.sent, x.n_sent, false));
    CHECK(honest_ping());
}

/* ---- attacks inside an authenticated session ---- */

enum frame_attack { REPLAY, BAD_MAC, GARBAGE, OVERSIZED };

static void frame_attack(enum frame_attack a) {
    int rc;
    char e[400];
    cm_conn *c = dial(CM_SEC_ENCRYPT, g_key, CM_ROLE_NODE, &rc, e, sizeof e);
    CHECKF(c != NULL, "%s", e);
    if (!c) return;
    /* PING id 1, no data: 8 + 8 + 4 + 4 bytes */
    uint8_t ping[24] = {1}, f[256];
    size_t n;
    CHECK(cm_conn_seal_raw(c, CM_MSG_PING, ping, sizeof ping, f, sizeof f, &n, e, sizeof e) == 0);
    CHECK(cm_conn_write_raw(c, f, n, 2000, e, sizeof e) == 0);
    cm_msg r;
    CHECKF(cm_conn_recv(c, &r, 3000, e, sizeof e) == 0 && r.type == CM_MSG_PONG, "%s", e);
    if (a == REPLAY) {
        CHECK(cm_conn_write_raw(c, f, n, 2000, e, sizeof e) == 0);
    } else if (a == BAD_MAC) {
        CHECK(cm_conn_seal_raw(c, CM_MSG_PING, ping, sizeof ping, f, sizeof f, &n, e, sizeof e) == 0);
        f[n - 3] ^= 0x20;
        CHECK(cm_conn_write_raw(c, f, n, 2000, e, sizeof e) == 0);
    } else if (a == GARBAGE) {
        /* Correctly sealed, but not a FORWARD: sizes that do not add up. */
        uint8_t junk[40];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
        CHECK(cm_conn_seal_raw(c, CM_MSG_FORWARD, junk, sizeof junk, f, sizeof f, &n, e, sizeof e) == 0);
        CHECK(cm_conn_write_raw(c, f, n, 2000, e, sizeof e) == 0);
    } else {
        /* A FORWARD header announcing more than its maximum (256 MiB). */
        cm_frame_hdr h = {CM_PROTO_VERSION, CM_MSG_FORWARD, CM_FRAME_F_MAC | CM_FRAME_F_ENC, 2, (256u << 20) + 1};
        cm_frame_hdr_encode(&h, f);
        CHECK(cm_conn_write_raw(c, f, CM_FRAME_HDR, 2000, e, sizeof e) == 0);
    }
    CHECK(closed_by_node(c));
    cm_conn_close(c, NULL);
}

static void test_frames(void) {
    frame_attack(REPLAY);
    frame_attack(BAD_MAC);
    frame_attack(GARBAGE);
    frame_attack(OVERSIZED);
    CHECK(honest_ping());
}

/* Well-formed, authenticated, but not allowed: ignored, and the connection
 * stays usable (a member of the cluster may be confused, not hostile). */
static void test_not_allowed(void) {
    int rc;
    char e[400];
    cm_conn *c = dial(CM_SEC_ENCRYPT, g_key, CM_ROLE_NODE, &rc, e, sizeof e);
    CHECKF(c != NULL, "%s", e);
    if (!c) return;
    cm_msg m = {.type = CM_MSG_ASSIGN};
    cm_msg_assign *as = &m.u.assign;
    as->epoch = 1;
    snprintf(as->model_name, sizeof as->model_name, "x.gguf");
    as->flags = CM_ASSIGN_F_OUTPUT;
    as->n_layers = 4;
    as->layer_begin = 2;
    as->layer_end = 4;
    as->head_end = 1;
    as->ffn_end = 1;
    as->n_ctx = 16;
    as->n_seq_max = 1;
    as->stage = 1;
    as->n_stages = 2;
    as->hidden_dtype = CM_HIDDEN_F32;
    as->tp_size = 1;
    CHECKF(cm_conn_send(c, &m, 2000, e, sizeof e) == 0, "%s", e);
    int32_t pos = 0, seq = 0;
    uint8_t want = 1;
    float hid[4] = {1, 2, 3, 4};
    m = (cm_msg){.type = CM_MSG_FORWARD};
    m.u.forward = (cm_msg_forward){.epoch = 1,
                                   .request_id = 1,
                                   .n_tokens = 1,
                                   .dim = 4,
                                   .dtype = CM_HIDDEN_F32,
                                   .pos = &pos,
                                   .seq = &seq,
                                   .want = &want,
                                   .hidden = hid};
    CHECKF(cm_conn_send(c, &m, 2000, e, sizeof e) == 0, "%s", e);
    /* EXPERT_LOAD goes to a coordinator: a node ignores it */
    const uint32_t counts[4] = {1000000, 0, 0, 0};
    m = (cm_msg){.type = CM_MSG_EXPERT_LOAD};
    m.u.expert_load =
        (cm_msg_expert_load){.epoch = 1, .layer_begin = 2, .n_layers = 1, .n_expert = 4, .counts = counts};
    CHECKF(cm_conn_send(c, &m, 2000, e, sizeof e) == 0, "%s", e);
    cm_msg r;
    m = (cm_msg){.type = CM_MSG_PING};
    m.u.ping.id = 9;
    CHECK(cm_conn_send(c, &m, 2000, e, sizeof e) == 0);
    /* The node may answer the FORWARD with nothing (no coordinator to tell). */
    do rc = cm_conn_recv(c, &r, 3000, e, sizeof e);
    while (!rc && r.type != CM_MSG_PONG);
    CHECKF(rc == 0 && r.u.ping.id == 9, "rc %d: %s", rc, e);
    cm_conn_close(c, "done");
    CHECK(honest_ping());
}

/* EXPERT_LOAD at the coordinator (cluster/ep_load.h): the plan's machines
 * are this one (stage 0) and node a (stage 0's group), then b and c (stage
 * 1's group, layers [3, 4)) of a model of 4 layers of 16 experts. Only b,
 * rank 0 of the later stage, speaks for layer 3 and all 16 experts; a
 * stage-0 member, a later rank, a stranger, another stage's layers, layers
 * past the model and another expert count are refused with the reason. */
static void test_expert_load_rule(void) {
    cm_cluster_member mbs[4] = {{.stage = 0, .first_layer = 0, .last_layer = 3, .n_members = 2, .local = true},
                                {.stage = 0, .first_layer = 0, .last_layer = 3, .n_members = 2, .member = 1},
                                {.stage = 1, .first_layer = 3, .last_layer = 4, .n_members = 2},
                                {.stage = 1, .first_layer = 3, .last_layer = 4, .n_members = 2, .member = 1}};
    snprintf(mbs[1].addr, sizeof mbs[1].addr, "10.0.0.2:7070");
    snprintf(mbs[2].addr, sizeof mbs[2].addr, "10.0.0.3:7070");
    snprintf(mbs[3].addr, sizeof mbs[3].addr, "10.0.0.4:7070");
    static const uint32_t counts[2 * 16];
    cm_msg_expert_load q = {.epoch = 5, .layer_begin = 3, .n_layers = 1, .n_expert = 16, .counts = counts};
    char why[200];
    CHECKF(cm_ep_load_check(mbs, 4, "10.0.0.3:7070", &q, 4, 16, why, sizeof why) == 0, "%s", why);
    static const char *const from[] = {"10.0.0.2:7070", "10.0.0.4:7070", "10.0.0.9:7070", ""};
    for (size_t i = 0; i < CM_ARRAY_LEN(from); i++) {
        CHECK(cm_ep_load_check(mbs, 4, from[i], &q, 4, 16, why, sizeof why) == CM_EPROTO);
        CHECKF(strstr(why, "not rank 0 of a later stage") != NULL, "%s", why);
    }
    cm_msg_expert_load bad = q;
    bad.layer_begin = 2, bad.n_layers = 2; /* stage 0's layer 2 too */
    CHECK(cm_ep_load_check(mbs, 4, "10.0.0.3:7070", &bad, 4, 16, why, sizeof why) == CM_EPROTO);
    CHECKF(strstr(why, "layers [2, 4) outside its stage's [3, 4)") != NULL, "%s", why);
    bad = q;
    bad.layer_begin = 4; /* past the stage and the model */
    CHECK(cm_ep_load_check(mbs, 4, "10.0.0.3:7070", &bad, 4, 16, why, sizeof why) == CM_EPROTO);
    mbs[2].last_layer = mbs[3].last_layer = 9; /* a member table past the model still stops at it */
    CHECK(cm_ep_load_check(mbs, 4, "10.0.0.3:7070", &bad, 4, 16, why, sizeof why) == CM_EPROTO);
    mbs[2].last_layer = mbs[3].last_layer = 4;
    bad = q;
    bad.n_expert = 8;
    CHECK(cm_ep_load_check(mbs, 4, "10.0.0.3:7070", &bad, 4, 16, why, sizeof why) == CM_EPROTO);
    CHECKF(strstr(why, "8 experts, the model has 16") != NULL, "%s", why);
    CHECK(cm_ep_load_check(mbs, 4, "10.0.0.3:7070", &q, 4, 0, why, sizeof why) == CM_EPROTO); /* a dense model */
}

/* TRAIN (issue 17) from a peer that is not the coordinator: only a FWD may
 * come from a previous stage, a BWD only on a stage's own link to the next
 * one, and a FWD of another plan's epoch is dropped; each refused and
 * logged with the peer's address, never told to the coordinator, and the
 * connection stays usable. */
static void test_train_not_allowed(void) {
    int rc;
    char e[400];
    cm_conn *c = dial(CM_SEC_ENCRYPT, g_key, CM_ROLE_NODE, &rc, e, sizeof e);
    CHECKF(c != NULL, "%s", e);
    if (!c) return;
    cm_msg m = {.type = CM_MSG_TRAIN};
    m.u.train = (cm_msg_train){.epoch = 1,
                               .id = 1,
                               .op = CM_TRAIN_SETUP,
                               .rank = 4,
                               .targets = 1,
                               .n_ctx = 16,
                               .offset = CM_MSG_MAX_TRAIN_INFLIGHT};
    m.u.train.f[0] = 8;
    CHECKF(cm_conn_send(c, &m, 2000, e, sizeof e) == 0, "%s", e);
    float rows[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tgt[2] = {1, -1};
    m.u.train =
        (cm_msg_train){.epoch = 1, .id = 2, .op = CM_TRAIN_BWD, .n_rows = 2, .dim = 4, .offset = 7, .data = rows};
    CHECKF(cm_conn_send(c, &m, 2000, e, sizeof e) == 0, "%s", e);
    m.u.train = (cm_msg_train){.epoch = 1,
                               .id = 3,
                               .op = CM_TRAIN_FWD,
                               .flags = CM_TRAIN_F_TARGETS | CM_TRAIN_F_BACKWARD,
                               .n_rows = 2,
                               .dim = 4,
                               .offset = 7,
                               .target = tgt,
                               .data = rows};
    CHECKF(cm_conn_send(c, &m, 2000, e, sizeof e) == 0, "%s", e);
    m = (cm_msg){.type = CM_MSG_PING};
    m.u.ping.id = 11;
    CHECK(cm_conn_send(c, &m, 2000, e, sizeof e) == 0);
    cm_msg r;
    do rc = cm_conn_recv(c, &r, 3000, e, sizeof e);
    while (!rc && r.type != CM_MSG_PONG);
    CHECKF(rc == 0 && r.u.ping.id == 11, "rc %d: %s", rc, e);
    cm_conn_close(c, "done");
    CHECK(honest_ping());
}

/* One ASSIGN of stories260K-f32's layers [3, 5) + output with LoRA parts
 * announced as (sha, len) but served as the bytes `serve` (len bytes):
 * the node's READY status and text. */
static int lora_assign(const uint8_t model_sha[32], const cm_hparams *hp, const uint8_t sha[32], uint32_t len,
                       const uint8_t *serve, uint64_t epoch, char *text, size_t tn) {
    int rc;
    char e[400];
    cm_conn *c = dial(CM_SEC_ENCRYPT, g_key, CM_ROLE_COORDINATOR, &rc, e, sizeof e);
    CHECKF(c != NULL, "%s", e);
    if (!c) return -1;
    cm_msg m = {.type = CM_MSG_ASSIGN};
    cm_msg_assign *as = &m.u.assign;
    as->epoch = epoch;
    memcpy(as->model_sha256, model_sha, 32);
    snprintf(as->model_name, sizeof as->model_name, "stories260K-f32.gguf");
    as->flags = CM_ASSIGN_F_OUTPUT | CM_ASSIGN_F_LORA;
    as->n_layers = (uint32_t)hp->n_layer;
    as->layer_begin = 3;
    as->layer_end = (uint32_t)hp->n_layer;
    as->head_end = (uint32_t)hp->n_head_kv;
    as->ffn_end = (uint32_t)hp->n_ff;
    as->n_ctx = 16;
    as->n_seq_max = 1;
    as->stage = 1;
    as->n_stages = 2;
    as->hidden_dtype = CM_HIDDEN_F32;
    as->tp_size = 1;
    memcpy(as->lora_sha256, sha, 32);
    as->lora_bytes = len;
    rc = cm_conn_send(c, &m, 2000, e, sizeof e);
    CHECKF(rc == 0, "%s", e);
    int status = -1;
    for (int i = 0; !rc && i < 100; i++) {
        cm_msg r;
        if ((rc = cm_conn_recv(c, &r, 20000, e, sizeof e))) break;
        if (r.type == CM_MSG_WEIGHTS_REQ) { /* the parts, as we choose to serve them */
            const cm_msg_weights_req *q = &r.u.weights_req;
            cm_msg ch = {.type = CM_MSG_WEIGHTS_CHUNK};
            memcpy(ch.u.weights_chunk.tensor_hash, q->tensor_hash, 32);
            uint64_t n = q->offset < len ? len - q->offset : 0;
            if (n > q->len) n = q->len;
            ch.u.weights_chunk.offset = q->offset < len ? q->offset : 0;
            ch.u.weights_chunk.total = len;
            ch.u.weights_chunk.data = serve + ch.u.weights_chunk.offset;
            ch.u.weights_chunk.data_len = (uint32_t)n;
            rc = cm_conn_send(c, &ch, 2000, e, sizeof e);
        } else if (r.type == CM_MSG_READY) {
            status = r.u.ready.status;
            snprintf(text, tn, "%s", r.u.ready.text);
            break;
        }
    }
    CHECKF(rc == 0, "%s", e);
    cm_conn_close(c, NULL);
    return status;
}

static void test_lora_parts(void) {
    const char *path = t_shared("models/stories260K-f32.gguf");
    cm_gguf g;
    cm_model m;
    char e[400], text[CM_MSG_TEXT_MAX + 1];
    uint8_t model_sha[32], sha[32];
    if (cm_gguf_open(&g, path, NULL, NULL, e, sizeof e) || cm_model_load(&m, &g, e, sizeof e) ||
        cm_file_sha256(path, model_sha, e, sizeof e)) {
        CHECKF(0, "%s", e);
        return;
    }
    cm_buf ab;
    cm_buf_init(&ab);
    cm_synth_lora_params lp = {.rank = 2, .alpha = 4, .strength = 0.1f, .seed = 5};
    cm_gguf ag;
    cm_lora *l = cm_lora_new(&m);
    CHECK(cm_synth_lora_write(&lp, &g, NULL, &ab, e, sizeof e) == 0);
    CHECK(cm_gguf_parse(&ag, (const uint8_t *)ab.data, ab.len, e, sizeof e) == 0);
    CHECK(cm_lora_add(l, &ag, 1.0f, e, sizeof e) == 0);
    cm_buf mine, all;
    cm_buf_init(&mine);
    cm_buf_init(&all);
    CHECK(cm_lora_parts_write(l, 3, m.hp.n_layer, true, NULL, false, &mine, NULL) == 0);
    CHECK(cm_lora_parts_write(l, 0, m.hp.n_layer, true, NULL, false, &all, NULL) == 0);
    /* 1. bytes that are not the announced object */
    crypto_hash_sha256(sha, (const uint8_t *)mine.data, mine.len);
    uint8_t *bad = cm_malloc(mine.len);
    memcpy(bad, mine.data, mine.len);
    bad[100] ^= 1;
    int st = lora_assign(model_sha, &m.hp, sha, (uint32_t)mine.len, bad, 101, text, sizeof text);
    CHECKF(st != 0 && strstr(text, "sha256"), "status %d: %s", st, text);
    /* 2. the announced object, but with another stage's layers */
    crypto_hash_sha256(sha, (const uint8_t *)all.data, all.len);
    st = lora_assign(model_sha, &m.hp, sha, (uint32_t)all.len, (const uint8_t *)all.data, 102, text, sizeof text);
    CHECKF(st != 0 && strstr(text, "outside this stage's layers"), "status %d: %s", st, text);
    /* 3. honest parts: loaded */
    crypto_hash_sha256(sha, (const uint8_t *)mine.data, mine.len);
    st = lora_assign(model_sha, &m.hp, sha, (uint32_t)mine.len, (const uint8_t *)mine.data, 103, text, sizeof text);
    CHECKF(st == 0, "status %d: %s", st, text);
    cm_free(bad);
    cm_buf_release(&mine);
    cm_buf_release(&all);
    cm_lora_free(l);
    cm_gguf_close(&ag);
    cm_buf_release(&ab);
    cm_model_release(&m);
    cm_gguf_close(&g);
    CHECK(honest_ping());
}

/* ---- the node under attack ---- */

static atomic_int g_stop;
static char g_dir[256];
static int g_node_rc;

static void *node_main(void *arg) {
    (void)arg;
    char kf[300], pf[300], err[300];
    snprintf(kf, sizeof kf, "%s/key", g_dir);
    snprintf(pf, sizeof pf, "%s/port", g_dir);
    cm_node_opts o = {.bind = "127.0.0.1",
                      .port_file = pf,
                      .cache_dir = g_dir,
                      .n_threads = 1,
                      .key_file = kf,
                      .name = "target",
                      .models_dir = t_shared("models")}; /* test_lora_parts: stories260K */
    g_node_rc = cm_node_run(&o, &g_stop, err, sizeof err);
    if (g_node_rc) fprintf(stderr, "node: %s\n", err);
    return NULL;
}

int main(void) {
    const char *target = getenv("CM_HOSTILE_ADDR");
    pthread_t th;
    char *log = NULL;
    if (target && *target) {
        g_tool = true;
        char e[300], kp[512];
        if (cm_net_parse_addr(target, 7070, g_host, sizeof g_host, &g_port, e, sizeof e) ||
            cm_net_key_default_path(kp, sizeof kp, e, sizeof e) || cm_net_key_load(kp, g_key, e, sizeof e)) {
            fprintf(stderr, "test_hostile: %s\n", e);
            return 2;
        }
    } else {
        snprintf(g_dir, sizeof g_dir, "/tmp/cumulo-test-hostile-%d", (int)getpid());
        mkdir(g_dir, 0700);
        char kf[300], pf[300], e[300];
        snprintf(kf, sizeof kf, "%s/key", g_dir);
        snprintf(pf, sizeof pf, "%s/port", g_dir);
        cm_net_key_generate(g_key);
        if (cm_net_key_save(kf, g_key, e, sizeof e)) {
            fprintf(stderr, "%s\n", e);
            return 2;
        }
        fx_log_capture_start("hostile");
        pthread_create(&th, NULL, node_main, NULL);
        for (int i = 0; i < 200 && !g_port; i++) {
            char *s = NULL;
            size_t n;
            if (!cm_file_read_all(pf, &s, &n, NULL, 0)) g_port = (uint16_t)atoi(s);
            cm_free(s);
            if (!g_port) cm_sleep_ms(20);
        }
        if (!g_port) {
            log = fx_log_capture_end();
            fprintf(stderr, "the node did not start: %s\n", log ? log : "");
            return 2;
        }
    }
    RUN(test_wrong_key);
    RUN(test_not_a_frame);
    RUN(test_session_replay);
    RUN(test_frames);
    RUN(test_not_allowed);
    RUN(test_train_not_allowed);
    if (!g_tool) RUN(test_lora_parts); /* needs this node's --models (stories260K) */
    if (!g_tool) {
        RUN(test_expert_load_rule); /* the coordinator's side: no node involved */
        atomic_store(&g_stop, 1);
        pthread_join(th, NULL);
        log = fx_log_capture_end();
        /* Every refusal is in the node's log, naming the peer (lines about
         * the node's own address are this client's side of a refusal). */
        static const char *const want[] = {
            "does not know this cluster's key",
            "the connecting node runs --insecure",
            "not a cumulo frame",
            "AUTH_INIT frame of 4294967280 bytes exceeds the maximum of 128",
            "protocol version mismatch: that node runs cumulo protocol",
            "closed the connection during the handshake",
            "sent a FORWARD frame before the handshake finished",
            "sent a replayed PING frame",
            "sent a PING frame with a bad MAC",
            "sent a malformed FORWARD payload",
            "FORWARD frame of 268435457 bytes exceeds the maximum",
            "ASSIGN from 127.0.0.1:",
            "FORWARD without an assignment",
            "TRAIN op 0 from a peer that is not the coordinator",
            "BWDs come back only on the link to the next stage",
            "TRAIN without an assignment",
            "unexpected EXPERT_LOAD from 127.0.0.1:",
        };
        t_cur_name = "node_log";
        t_cur_failed = 0;
        char self[40];
        snprintf(self, sizeof self, "127.0.0.1:%u", g_port);
        for (size_t i = 0; i < CM_ARRAY_LEN(want); i++) {
            bool found = false;
            for (const char *l = log; l && *l && !found;) {
                const char *e = strchr(l, '\n');
                size_t n = e ? (size_t)(e - l) : strlen(l);
                char line[1024];
                snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), l);
                found = strstr(line, want[i]) && strstr(line, "127.0.0.1:") && !strstr(line, self);
                l = e ? e + 1 : l + n;
            }
            CHECKF(found, "the node's log lacks '%s' naming the peer", want[i]);
        }
        CHECK(g_node_rc == 0);
        if (t_cur_failed) {
            t_failed++;
            fprintf(stderr, "node log:\n%s\n", log ? log : "");
        } else t_passed++;
        if (getenv("CM_HOSTILE_SHOW_LOG")) fprintf(stderr, "%s", log ? log : "");
        free(log);
        char p[300];
        snprintf(p, sizeof p, "%s/key", g_dir);
        unlink(p);
        snprintf(p, sizeof p, "%s/port", g_dir);
        unlink(p);
        rmdir(g_dir);
    }
    TEST_END();
}
