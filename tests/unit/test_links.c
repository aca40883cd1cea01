/*
 * test_links.c: node to node link measurement (LINKS_REQ / LINKS) over real
 * TCP on 127.0.0.1 with two cm_node_run daemons on threads. A node asked to
 * measure a live peer, a closed port and a black hole (a listener that
 * never answers the handshake) answers within the request's deadline: the
 * live peer measured, the others as failures, and the black hole does not
 * starve the peer after it. `cumulo nodes`' probe fills the matrix.
 */
#include "test.h"

#include "cluster/cluster_int.h"
#include "os/os.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256], g_key[300];
static atomic_int g_stop;

typedef struct node_job {
    int i;
    pthread_t th;
    char port_file[300];
    int rc;
} node_job;

static void *node_main(void *arg) {
    node_job *j = arg;
    cm_node_opts o = {.port = 0,
                      .bind = "127.0.0.1",
                      .port_file = j->port_file,
                      .cache_dir = g_dir,
                      .n_threads = 1,
                      .key_file = g_key};
    char name[16], err[300];
    snprintf(name, sizeof name, "l%d", j->i);
    o.name = name;
    j->rc = cm_node_run(&o, &g_stop, err, sizeof err);
    if (j->rc) fprintf(stderr, "node %d: %s\n", j->i, err);
    return NULL;
}

static char g_addr[2][32];

static void test_deadline_and_failures(void) {
    char err[300];
    cm_listener *hole, *tmp;
    CHECK(cm_net_listen("127.0.0.1", 0, &hole, err, sizeof err) == 0);
    CHECK(cm_net_listen("127.0.0.1", 0, &tmp, err, sizeof err) == 0);
    char a_hole[32], a_closed[32];
    snprintf(a_hole, sizeof a_hole, "127.0.0.1:%u", cm_listener_port(hole));
    snprintf(a_closed, sizeof a_closed, "127.0.0.1:%u", cm_listener_port(tmp));
    cm_listener_close(tmp); /* nobody listens there now */
    cm_net_cfg cfg;
    CHECK(cm_cluster_net_cfg(&cfg, false, g_key, err, sizeof err) == 0);
    cm_msg_hello me, peer;
    cm_cluster_hello(&me, "asker", 0, 0);
    cm_conn *c;
    CHECKF(cm_cluster_dial(g_addr[0], &cfg, &me, &c, &peer, err, sizeof err) == 0, "%s", err);
    const char *peers[3] = {a_hole, a_closed, g_addr[1]};
    cm_msg_links l;
    double t0 = cm_now_s();
    int rc = cm_cluster_links_ask(c, peers, 3, 1500, 1 << 16, &l, err, sizeof err);
    double t = cm_now_s() - t0;
    CHECKF(rc == 0, "%s", err);
    CHECKF(t < 1.5 + 0.5, "answered after %.2f s (deadline 1.5 s)", t);
    CHECKF(t > 0.3, "the black hole was given up after %.2f s only", t);
    if (!rc) {
        CHECK(l.n == 3 && !strcmp(l.link[0].addr, a_hole) && !strcmp(l.link[2].addr, g_addr[1]));
        CHECKF(l.link[0].status == CM_ETIMEDOUT, "black hole: %s", cm_strerror(l.link[0].status));
        CHECKF(l.link[1].status < 0, "closed port: %d", l.link[1].status);
        CHECKF(l.link[2].status == 0 && l.link[2].rtt_s > 0 && l.link[2].rtt_s < 1 && l.link[2].bw > 1e5,
               "live peer: status %s, rtt %g, bw %g", cm_strerror(l.link[2].status), l.link[2].rtt_s, l.link[2].bw);
    }
    /* the connection is still in step: a second request works */
    rc = cm_cluster_links_ask(c, peers + 2, 1, 1000, 0, &l, err, sizeof err);
    CHECKF(rc == 0 && l.n == 1 && l.link[0].status == 0 && l.link[0].bw == 0, "%s", err);
    /* bounds are the sender's too */
    CHECK(cm_cluster_links_ask(c, peers, 0, 1000, 0, &l, err, sizeof err) == CM_EINVAL);
    cm_conn_close(c, "done");
    cm_listener_close(hole);
}

static void test_probe_matrix(void) {
    const char *addrs[2] = {g_addr[0], g_addr[1]};
    cm_node_info info[2];
    char err[300];
    CHECK(cm_probe_nodes(addrs, 2, false, g_key, info, err, sizeof err) == 0);
    for (int i = 0; i < 2; i++) {
        CHECK(info[i].status == 0);
        CHECK(!info[i].links[i].asked);
        const cm_node_link *nl = &info[i].links[1 - i];
        CHECKF(nl->asked && nl->status == 0 && nl->rtt_s > 0 && nl->bw > 0, "link %d -> %d: %s", i, 1 - i,
               cm_strerror(nl->status));
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(g_dir, sizeof g_dir, "/tmp/cm_test_links_%d", (int)getpid());
    mkdir(g_dir, 0700);
    snprintf(g_key, sizeof g_key, "%s/key", g_dir);
    uint8_t key[32];
    char err[300];
    cm_net_key_generate(key);
    if (cm_net_key_save(g_key, key, err, sizeof err)) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    node_job jobs[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (node_job){.i = i};
        snprintf(jobs[i].port_file, sizeof jobs[i].port_file, "%s/port%d", g_dir, i);
        pthread_create(&jobs[i].th, NULL, node_main, &jobs[i]);
    }
    for (int i = 0; i < 2; i++) {
        int port = 0;
        for (int t = 0; t < 300 && !port; t++) {
            char *txt = NULL;
            size_t n;
            if (!cm_file_read_all(jobs[i].port_file, &txt, &n, err, sizeof err)) port = atoi(txt);
            cm_free(txt);
            if (!port) cm_sleep_ms(20);
        }
        snprintf(g_addr[i], sizeof g_addr[i], "127.0.0.1:%d", port);
    }
    RUN(test_deadline_and_failures);
    RUN(test_probe_matrix);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(jobs[i].th, NULL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd)) { /* best effort */
    }
    TEST_END();
}
