/*
 * bench/tp_coll_bench.c: a benchmark, not a test (issue 14, item 4). Two
 * members (threads of this process) over an authenticated loopback mesh run
 * OPS all-reduces of N floats (a 64-token prompt chunk of a 2048-wide model
 * by default) and print, per op, each member's wall time and its thread's
 * CPU time (the part a loaded machine does not inflate much: what the
 * all-reduce costs the cores, cipher included), then the cipher's share.
 *   make tp-coll-bench TP_COLL_BENCH_ARGS="131072 200"
 *   build/bench/tp_coll_bench [N] [OPS] [insecure] [direct]
 * insecure: --insecure links; direct: the direct exchange instead of the ring;
 * cold=KIB: between ops each member reads KIB of memory of its own (a decode
 * step's weights stream through the caches like this), and the times are
 * those inside the ops only (what a model's all-reduce costs, cold caches).
 * The links are loopback, so the pieces go auth-only unless
 * CUMULO_TP_ENCRYPT_LOOPBACK=1; run with CUMULO_TP_SPIN_US=0 so that waiting
 * for the other member burns no CPU (else the spin counts as CPU).
 */
#include "cluster/collective.h"
#include "net/net.h"
#include "fixtures.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const uint8_t k_key[CM_KEY_BYTES] = {9, 8, 7};
static int64_t N = 131072;
static int OPS = 200;
static bool insecure, direct;
static long cold_kib; /* cold=KIB: memory read between ops */
static cm_listener *ls[2];
static char addr[2][64];
static const char *addrs[2] = {addr[0], addr[1]};

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct {
    int rank;
    double wall_us, cpu_us, seal_us, open_us;
    int rc;
} member;

static void *run(void *arg) {
    member *me = arg;
    char e[512];
    cm_net_cfg cfg = {.mode = insecure ? CM_SEC_INSECURE : CM_SEC_ENCRYPT};
    memcpy(cfg.key, k_key, sizeof k_key);
    cm_msg_hello h;
    fx_hello(&h, me->rank ? "b" : "a", (uint8_t)(0x50 + me->rank), CM_ROLE_NODE);
    cm_conn *conns[2];
    if ((me->rc = cm_coll_mesh_open(me->rank, 2, ls[me->rank], addrs, &cfg, &h, 5000, conns, e, sizeof e))) {
        fprintf(stderr, "mesh: %s\n", e);
        return NULL;
    }
    cm_coll_cfg cc = {.rank = me->rank, .size = 2, .max_n = N, .ring_min = direct ? -1 : 0, .epoch = 1};
    cc.peers[1 - me->rank] = conns[1 - me->rank];
    cm_coll *c;
    if ((me->rc = cm_coll_new(&cc, &c, e, sizeof e))) return NULL;
    float *x = malloc((size_t)N * sizeof *x);
    for (int64_t i = 0; i < N; i++) x[i] = (float)((i * 7 + me->rank) % 13) * 0.25f;
    for (int w = 0; w < 5; w++) cm_coll_allreduce(c, x, N, e, sizeof e);
    uint64_t s0, o0, s1, o1;
    cm_conn_cipher_ns(conns[1 - me->rank], &s0, &o0);
    size_t cold_n = (size_t)cold_kib * 1024 / sizeof(float);
    float *junk = cold_n ? calloc(cold_n, sizeof *junk) : NULL;
    volatile float sink = 0;
    uint64_t wall = 0, cpu = 0;
    for (int i = 0; i < OPS && !me->rc; i++) {
        for (int64_t j = 0; j < N; j += 997) x[j] = (float)(j % 5); /* keep the values bounded */
        if (junk) {
            float acc = 0;
            for (size_t j = 0; j < cold_n; j += 16) acc += junk[j];
            sink += acc;
        }
        uint64_t t0 = cm_now_ns(), c0 = cpu_ns();
        me->rc = cm_coll_allreduce(c, x, N, e, sizeof e);
        wall += cm_now_ns() - t0;
        cpu += cpu_ns() - c0;
    }
    free(junk);
    me->wall_us = (double)wall * 1e-3 / OPS;
    me->cpu_us = (double)cpu * 1e-3 / OPS;
    cm_conn_cipher_ns(conns[1 - me->rank], &s1, &o1);
    me->seal_us = (double)(s1 - s0) * 1e-3 / OPS;
    me->open_us = (double)(o1 - o0) * 1e-3 / OPS;
    if (me->rc) fprintf(stderr, "all-reduce: %s\n", e);
    cm_coll_free(c);
    cm_coll_mesh_close(conns, 2);
    free(x);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) N = atoll(argv[1]);
    if (argc > 2) OPS = atoi(argv[2]);
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "insecure")) insecure = true;
        if (!strcmp(argv[i], "direct")) direct = true;
        if (!strncmp(argv[i], "cold=", 5)) cold_kib = atol(argv[i] + 5);
    }
    char e[512];
    for (int i = 0; i < 2; i++) {
        if (cm_net_listen("127.0.0.1", 0, &ls[i], e, sizeof e)) return fprintf(stderr, "%s\n", e), 1;
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%u", cm_listener_port(ls[i]));
    }
    member m[2] = {{.rank = 0}, {.rank = 1}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run, &m[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        printf("member %d: %lld floats%s%s%s: %.1f us wall, %.1f us CPU per op (cipher %.1f + %.1f)\n", i, (long long)N,
               insecure ? " insecure" : "", direct ? " direct" : "", cold_kib ? " cold" : "", m[i].wall_us, m[i].cpu_us,
               m[i].seal_us, m[i].open_us);
    for (int i = 0; i < 2; i++) cm_listener_close(ls[i]);
    return m[0].rc || m[1].rc;
}
