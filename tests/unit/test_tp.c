/*
 * test_tp.c: tensor parallelism over real authenticated loopback connections.
 * Every member is a thread with its own listener, cm_coll, cm_ctx and cm_kv
 * over its slice; members meet through cm_coll_mesh_open (encrypted frames).
 *
 * - The collective on random vectors: direct exchange equals the rank-order
 *   sum ((p0+p1)+p2)+... bit for bit on every member, the ring equals its
 *   documented per-chunk order; both checks are shown to be able to fail
 *   (the reverse order gives other bits).
 * - stories260K F32 and a Q8_0 synth model (dims multiples of 256) on 2, 3
 *   (uneven slices from cm_plan with unequal speeds) and 4 members, and a
 *   hybrid of 2 groups x 2 stages: greedy ids equal one machine, every
 *   member's logits are bit-identical, probabilities within 1e-4 (F32) of
 *   one machine; bytes per decode token equal (k-1) x 2 x layers x dim x 4.
 * - A split output head (each member its vocabulary rows, gathered to member
 *   0) gives member 0 the whole head's bits.
 * - A dropped partial makes the comparison fail (the check is not vacuous);
 *   a member out of step or silent gives CM_EPROTO / CM_ETIMEDOUT naming it.
 * - A transport's own all-reduce (cm_coll_native; MPI_Iallreduce in MPI
 *   builds), faked here by one that sums in reverse rank order: used when it
 *   takes the group (its bits, not the exchange's), not when it declines,
 *   not after cm_coll_reset; a failed op fails the collective.
 */
#include "test.h"

#include "cluster/collective.h"
#include "model/model.h"
#include "net/net.h"
#include "sched/plan.h"
#include "sched/simulate.h"
#include "fixtures.h"
#include "tp_model.h"

#include <pthread.h>
#include <stdlib.h>

#define MAXM 4
#define PROMPT 9
#define STEPS 10
static char errbuf[512];
static const uint8_t k_key[CM_KEY_BYTES] = {7, 1, 2, 3};

/* ---- a mesh of k members (listeners made before any thread starts) ---- */
typedef struct mesh {
    int k;
    cm_listener *l[MAXM];
    char addr[MAXM][64];
    const char *addrs[MAXM];
    cm_conn *conns[MAXM][MAXM];
} mesh;

static int mesh_listen(mesh *M, int k) {
    memset(M, 0, sizeof *M);
    M->k = k;
    for (int i = 0; i < k; i++) {
        if (cm_net_listen("127.0.0.1", 0, &M->l[i], errbuf, sizeof errbuf)) return -1;
        snprintf(M->addr[i], sizeof M->addr[i], "127.0.0.1:%u", cm_listener_port(M->l[i]));
        M->addrs[i] = M->addr[i];
    }
    return 0;
}
static int mesh_join(mesh *M, int rank, char *e, size_t el) {
    cm_net_cfg cfg = {.mode = CM_SEC_ENCRYPT};
    memcpy(cfg.key, k_key, sizeof k_key);
    cm_msg_hello h;
    char hname[16];
    snprintf(hname, sizeof hname, "tp%d", rank);
    fx_hello(&h, hname, (uint8_t)(0x40 + rank), CM_ROLE_NODE);
    return cm_coll_mesh_open(rank, M->k, M->l[rank], M->addrs, &cfg, &h, 5000, M->conns[rank], e, el);
}
static void mesh_free(mesh *M) {
    for (int i = 0; i < M->k; i++) {
        cm_coll_mesh_close(M->conns[i], M->k);
        cm_listener_close(M->l[i]);
    }
}

/* ---- the collective alone ---- */
typedef struct vec_member {
    mesh *M;
    int rank, n, ops;
    bool compress;
    int64_t ring_min;
    int mode; /* 0 normal, 1 out of step (other epoch), 2 silent, 3 reset to the same epoch first,
               * 4 leave (close the links) after the first op */
    float *x; /* [ops][n] in: partials, out: sums */
    int rc;
    char err[512];
    cm_coll_stats st;
    int clear_links; /* links that may send their pieces auth-only (loopback, encrypted) */
    uint64_t frames; /* ALLREDUCE frames this member sent over its links (pieces and shared-memory set-up) */
    double secs;     /* wall time of the ops */
} vec_member;

/* 0: run_vec's ops are all-reduces; 1: gathers to member 0, 2: all-gathers,
 * of two parts: [0, n / 3) member 0's, [n / 3, n) member 1's */
static int vec_gather;

static void *vec_main(void *arg) {
    vec_member *v = arg;
    v->rc = mesh_join(v->M, v->rank, v->err, sizeof v->err);
    if (v->rc) return NULL;
    cm_coll_cfg cfg = {.rank = v->rank,
                       .size = v->M->k,
                       .max_n = v->n,
                       .timeout_ms = 800,
                       .ring_min = v->ring_min,
                       .compress = v->compress,
                       .epoch = 3};
    for (int j = 0; j < v->M->k; j++) cfg.peers[j] = v->M->conns[v->rank][j];
    cm_coll *c;
    if ((v->rc = cm_coll_new(&cfg, &c, v->err, sizeof v->err))) return NULL;
    if (v->mode == 1) cm_coll_reset(c, 4);
    if (v->mode == 3) cm_coll_reset(c, 3);
    double t0 = cm_now_s();
    if (v->mode != 2)
        for (int o = 0; o < (v->mode == 4 ? 1 : v->ops) && !v->rc; o++) {
            float *x = v->x + (size_t)o * v->n;
            int64_t part[3] = {0, v->n / 3, v->n};
            v->rc = vec_gather == 1   ? cm_coll_gather(c, x, part, 0, v->err, sizeof v->err)
                    : vec_gather == 2 ? cm_coll_allgather(c, x, part, v->err, sizeof v->err)
                                      : cm_coll_allreduce(c, x, v->n, v->err, sizeof v->err);
        }
    else cm_sleep_ms(1500);
    v->secs = cm_now_s() - t0;
    cm_coll_stats_get(c, &v->st);
    cm_coll_free(c);
    for (int j = 0; j < v->M->k; j++) {
        cm_conn_stats cs;
        if (!v->M->conns[v->rank][j]) continue;
        cm_conn_get_stats(v->M->conns[v->rank][j], CM_MSG_ALLREDUCE, &cs);
        v->frames += cs.tx_frames;
    }
    if (v->mode == 4) {
        cm_coll_mesh_close(v->M->conns[v->rank], v->M->k);
        return NULL;
    }
    /* every link of this mesh may send its pieces auth-only (IP loopback, an
     * encrypted session: cm_conn_set_clear_allreduce says so), and off is off */
    for (int j = 0; j < v->M->k; j++) {
        cm_conn *pc = v->M->conns[v->rank][j];
        if (!pc) continue;
        bool was = cm_conn_set_clear_allreduce(pc, true);
        v->clear_links += was && !cm_conn_set_clear_allreduce(pc, false);
    }
    return NULL;
}

/* Run ops all-reduces of n floats over k members; parts[r][o*n+i] in, out in the same place. */
static void run_vec(int k, int n, int ops, int64_t ring_min, bool compress, const int *modes, vec_member *v,
                    float **parts) {
    mesh M;
    CHECK(mesh_listen(&M, k) == 0);
    pthread_t th[MAXM];
    for (int r = 0; r < k; r++) {
        v[r] = (vec_member){.M = &M,
                            .rank = r,
                            .n = n,
                            .ops = ops,
                            .compress = compress,
                            .ring_min = ring_min,
                            .mode = modes ? modes[r] : 0,
                            .x = parts[r]};
        pthread_create(&th[r], NULL, vec_main, &v[r]);
    }
    for (int r = 0; r < k; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < k; r++)
        CHECKF(v[r].clear_links == k - 1 || v[r].mode == 4, "member %d: %d auth-only links", r, v[r].clear_links);
    mesh_free(&M);
}

static float **random_parts(int k, int n, int ops, uint64_t seed) {
    float **p = calloc((size_t)k, sizeof *p);
    cm_rng r;
    cm_rng_seed(&r, seed);
    for (int m = 0; m < k; m++) {
        p[m] = malloc((size_t)n * (size_t)ops * sizeof(float));
        for (int i = 0; i < n * ops; i++) /* magnitudes spread over 2^-8 .. 2^8: order matters */
            p[m][i] = cm_rng_normal(&r) * ldexpf(1.0f, (int)(cm_rng_next(&r) % 17) - 8);
    }
    return p;
}
static void free_parts(float **p, int k) {
    for (int m = 0; m < k; m++) free(p[m]);
    free(p);
}

/* The ring's order for element i (see collective.h): chunk c starts at rank c. */
static float ring_sum(float *const *orig, int k, int n, int64_t i) {
    int c = 0;
    for (int j = 0; j < k; j++) {
        int64_t b = (n / k) * j + (n % k) * j / k;
        if (b / 32 * 32 <= i) c = j;
    }
    float s = orig[c][i];
    for (int j = 1; j < k; j++) s += orig[(c + j) % k][i];
    return s;
}

static void test_collective_orders(void) {
    for (int k = 2; k <= 4; k++)
        for (int ring = 0; ring < 2; ring++) {
            const int n = 9000, ops = 3; /* > 2 pieces per member and op, a partial last block */
            float **parts = random_parts(k, n, ops, 100 + (uint64_t)k),
                  **orig = random_parts(k, n, ops, 100 + (uint64_t)k);
            vec_member v[MAXM];
            run_vec(k, n, ops, ring ? 64 : -1, false, NULL, v, parts);
            int bad_members = 0, rev_diff = 0, fwd_diff = 0;
            for (int r = 0; r < k; r++) CHECKF(v[r].rc == 0, "k=%d ring=%d member %d: %s", k, ring, r, v[r].err);
            for (int64_t i = 0; i < (int64_t)n * ops; i++) {
                float want;
                if (ring) {
                    float *o2[MAXM];
                    for (int j = 0; j < k; j++) o2[j] = orig[j] + (i / n) * n;
                    want = ring_sum(o2, k, n, i % n);
                } else {
                    want = orig[0][i];
                    for (int j = 1; j < k; j++) want += orig[j][i];
                }
                float rev = orig[k - 1][i];
                for (int j = k - 2; j >= 0; j--) rev += orig[j][i];
                for (int r = 0; r < k; r++) bad_members += memcmp(&parts[r][i], &want, 4) != 0;
                rev_diff += memcmp(&rev, &want, 4) != 0;
                float fwd = orig[0][i];
                for (int j = 1; j < k; j++) fwd += orig[j][i];
                fwd_diff += memcmp(&fwd, &want, 4) != 0;
            }
            CHECKF(bad_members == 0, "k=%d ring=%d: %d elements differ from the fixed order", k, ring, bad_members);
            if (k >= 3) /* the bitwise check can fail: another order gives other bits */
                CHECKF(rev_diff > 0, "k=%d ring=%d: reverse order indistinguishable", k, ring);
            printf("  k=%d %s: %d/%d elements of the reverse order differ, %d of the rank order; "
                   "%llu msgs, %llu data bytes sent by member 0 for %d ops\n",
                   k, ring ? "ring  " : "direct", rev_diff, n * ops, fwd_diff,
                   (unsigned long long)v[0].st.total.msgs_sent, (unsigned long long)v[0].st.total.data_sent, ops);
            free_parts(parts, k);
            free_parts(orig, k);
        }
}

static void test_collective_compress(void) {
    const int k = 3, n = 5000, ops = 2;
    for (int ring = 0; ring < 2; ring++) {
        float **parts = random_parts(k, n, ops, 7), **orig = random_parts(k, n, ops, 7);
        vec_member v[MAXM];
        run_vec(k, n, ops, ring ? 64 : -1, true, NULL, v, parts);
        double maxrel = 0;
        int diff = 0;
        const int nb = (n + 31) / 32; /* blocks per op */
        double bmax[nb * ops];
        memset(bmax, 0, sizeof bmax);
        for (int i = 0; i < n * ops; i++)
            for (int j = 0; j < k; j++)
                bmax[i / n * nb + i % n / 32] = fmax(bmax[i / n * nb + i % n / 32], fabs(orig[j][i]));
        for (int r = 0; r < k; r++) CHECKF(v[r].rc == 0, "member %d: %s", r, v[r].err);
        for (int i = 0; i < n * ops; i++) {
            double exact = 0, scale = bmax[i / n * nb + i % n / 32];
            for (int j = 0; j < k; j++) exact += orig[j][i];
            for (int r = 1; r < k; r++) diff += memcmp(&parts[r][i], &parts[0][i], 4) != 0;
            double e = fabs(parts[0][i] - exact) / (scale > 0 ? scale : 1);
            if (e > maxrel) maxrel = e;
        }
        CHECKF(diff == 0, "compressed %s: %d elements differ between members", ring ? "ring" : "direct", diff);
        /* Each quantization errs by at most half a step plus the f16 rounding of the
         * scale over 127 steps: (0.5 + 127 * 2^-11) / 127 of its block's maximum. Direct
         * quantizes k partials once; the ring quantizes running sums (<= j * amax) k-1
         * times and the result (<= k * amax) once: <= k^2 such errors of amax. */
        double q1 = (0.5 + 127.0 / 2048) / 127, bound = ring ? k * k * q1 : k * q1;
        CHECKF(maxrel <= bound, "compressed %s: error %.4f > %.4f", ring ? "ring" : "direct", maxrel, bound);
        printf("  compressed %s: max error %.4f of the block maximum (bound %.4f); %llu data bytes sent by member 0\n",
               ring ? "ring" : "direct", maxrel, bound, (unsigned long long)v[0].st.total.data_sent);
        free_parts(parts, k);
        free_parts(orig, k);
    }
}

static void test_collective_failures(void) {
    const int k = 3, n = 300;
    float **parts = random_parts(k, n, 1, 9);
    vec_member v[MAXM];
    int out_of_step[3] = {0, 0, 1};
    run_vec(k, n, 1, -1, false, out_of_step, v, parts);
    CHECKF(v[0].rc == CM_EPROTO && strstr(v[0].err, "member 2 (127.0.0.1:"), "rc %d: %s", v[0].rc, v[0].err);
    printf("  out of step: %s\n", v[0].err);
    int silent[3] = {0, 2, 0};
    run_vec(k, n, 1, -1, false, silent, v, parts);
    CHECKF(v[0].rc == CM_ETIMEDOUT && strstr(v[0].err, "member 1"), "rc %d: %s", v[0].rc, v[0].err);
    printf("  silent: %s\n", v[0].err);
    free_parts(parts, k);
    /* a corrupt header is an error, not a crash */
    uint8_t p[CM_COLL_HDR_BYTES + 8] = {0};
    cm_coll_piece pc;
    p[24] = 3; /* n = 3 but 8 bytes follow */
    CHECK(cm_coll_piece_parse(p, sizeof p, &pc, errbuf, sizeof errbuf) == CM_EFORMAT);
    p[24] = 2;
    CHECK(cm_coll_piece_parse(p, sizeof p, &pc, errbuf, sizeof errbuf) == 0);
    CHECK(cm_coll_piece_parse(p, 10, &pc, errbuf, sizeof errbuf) == CM_EFORMAT);
}

/* Two members on one host (IP loopback): the pieces go through shared memory
 * (coll_shm.h), the sums are the fixed order's bits, and only the two set-up
 * frames cross the link; CUMULO_TP_SHM=0 sends every piece over it with the
 * same bits; a member that leaves fails the other's next op at once, not at
 * the deadline. */
static void test_collective_shm(void) {
    const int k = 2, n = 2048, ops = 40;
    float **orig = random_parts(k, n, ops, 7);
    uint64_t frames[2] = {0, 0};
    for (int off = 0; off < 2; off++) {
        if (off) setenv("CUMULO_TP_SHM", "0", 1);
        cm_config_reload();
        float **parts = random_parts(k, n, ops, 7);
        vec_member v[MAXM];
        run_vec(k, n, ops, 0, false, NULL, v, parts);
        int bad = 0;
        for (int r = 0; r < k; r++) {
            CHECKF(v[r].rc == 0, "shm %s member %d: %s", off ? "off" : "on", r, v[r].err);
            for (int64_t i = 0; i < (int64_t)n * ops; i++) {
                float want = orig[0][i] + orig[1][i];
                bad += memcmp(&parts[r][i], &want, 4) != 0;
            }
            CHECKF(v[r].st.total.msgs_sent == (uint64_t)ops && v[r].st.total.data_sent == (uint64_t)ops * n * 4,
                   "member %d: %llu pieces, %llu bytes counted", r, (unsigned long long)v[r].st.total.msgs_sent,
                   (unsigned long long)v[r].st.total.data_sent);
        }
        CHECKF(bad == 0, "shm %s: %d elements differ from p0 + p1", off ? "off" : "on", bad);
        frames[off] = v[0].frames;
        printf("  shared memory %s: %d ops of %d floats, %llu ALLREDUCE frames over the link, %.1f us per op\n",
               off ? "off" : "on ", ops, n, (unsigned long long)v[0].frames, v[0].secs * 1e6 / ops);
        free_parts(parts, k);
    }
    unsetenv("CUMULO_TP_SHM");
    cm_config_reload();
    CHECKF(frames[0] == 2 && frames[1] == 2u + (uint64_t)ops, "frames over the link: %llu with, %llu without",
           (unsigned long long)frames[0], (unsigned long long)frames[1]);
    /* member 1 leaves after one op: member 0's second op fails on the closed link */
    float **parts = random_parts(k, n, ops, 8);
    vec_member v[MAXM];
    int leave[2] = {0, 4};
    run_vec(k, n, ops, 0, false, leave, v, parts);
    CHECKF(v[0].rc != 0 && v[0].secs < 0.6 && v[0].st.ops == 1, "after the peer left: rc %d in %.3f s, %llu ops: %s",
           v[0].rc, v[0].secs, (unsigned long long)v[0].st.ops, v[0].err);
    printf("  peer left: %s (%.3f s)\n", v[0].err, v[0].secs);
    free_parts(parts, k);
    free_parts(orig, k);

    /* Larger than a slot's piece (what took the ring over the link before:
     * ring_min 64): a prefill-sized all-reduce streams through the regions,
     * then gathers (a split head's, to member 0; an all-gather) of parts of
     * two and of three pieces. Same bits and counts with and without. */
    const int nb = 40000, ob = 3; /* 3 pieces of at most 16384 per op; parts of 13333 and 26667 */
    for (int g = 0; g <= 2; g++) {
        float **o2 = random_parts(k, nb, ob, 21);
        uint64_t fr[2] = {0, 0};
        for (int off = 0; off < 2; off++) {
            if (off) setenv("CUMULO_TP_SHM", "0", 1);
            cm_config_reload();
            float **p2 = random_parts(k, nb, ob, 21);
            vec_gather = g;
            run_vec(k, nb, ob, 64, false, NULL, v, p2);
            vec_gather = 0;
            int bad = 0;
            for (int r = 0; r < k; r++) {
                CHECKF(v[r].rc == 0, "shm %s, %s: member %d: %s", off ? "off" : "on", g ? "gather" : "large", r,
                       v[r].err);
                for (int64_t i = 0; i < (int64_t)nb * ob; i++) {
                    float want = o2[0][i] + o2[1][i];
                    if (g) /* member 1's part from member 1, the rest each member's own */
                        want = (g == 2 || r == 0) && i % nb >= nb / 3 ? o2[1][i] : (g == 2 ? o2[0][i] : o2[r][i]);
                    bad += memcmp(&p2[r][i], &want, 4) != 0;
                }
            }
            uint64_t sent1 = g ? (uint64_t)ob * (nb - nb / 3) * 4 : (uint64_t)ob * nb * 4,
                     sent0 = g == 1   ? 0
                             : g == 2 ? (uint64_t)ob * (nb / 3) * 4
                                      : sent1;
            CHECKF(bad == 0 && v[0].st.total.data_sent == sent0 && v[1].st.total.data_sent == sent1 &&
                       v[0].st.total.data_recv == sent1,
                   "shm %s, %s: %d elements wrong; bytes sent %llu, %llu (want %llu, %llu)", off ? "off" : "on",
                   g == 1 ? "gather"
                   : g    ? "all-gather"
                          : "large",
                   bad, (unsigned long long)v[0].st.total.data_sent, (unsigned long long)v[1].st.total.data_sent,
                   (unsigned long long)sent0, (unsigned long long)sent1);
            fr[off] = v[0].frames + v[1].frames;
            free_parts(p2, k);
        }
        unsetenv("CUMULO_TP_SHM");
        cm_config_reload();
        /* with the regions only the set-up frames (2 each) cross the links */
        CHECKF(fr[0] == 4 && fr[1] > 4 + (uint64_t)ob, "%s: frames over the links %llu with, %llu without",
               g == 1 ? "gather"
               : g    ? "all-gather"
                      : "large",
               (unsigned long long)fr[0], (unsigned long long)fr[1]);
        printf("  shared memory, %d %s of %d floats: %llu frames over the links (%llu without)\n", ob,
               g == 1 ? "gathers"
               : g    ? "all-gathers"
                      : "all-reduces",
               nb, (unsigned long long)fr[0], (unsigned long long)fr[1]);
        free_parts(o2, k);
    }
}

/* ---- a transport's own all-reduce, faked in-process ---- */
typedef struct fake_lib {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, arrived, gen, fail_op, opens;
    float *slot[MAXM];
} fake_lib;
typedef struct fake_grp {
    fake_lib *lib;
    int rank, op;
} fake_grp;
static fake_lib g_fake;
static fake_grp g_fgrp[MAXM];

static void fake_meet(fake_lib *L) { /* a barrier of L->size threads */
    pthread_mutex_lock(&L->mu);
    int gen = L->gen;
    if (++L->arrived == L->size) {
        L->arrived = 0;
        L->gen++;
        pthread_cond_broadcast(&L->cv);
    }
    while (gen == L->gen) pthread_cond_wait(&L->cv, &L->mu);
    pthread_mutex_unlock(&L->mu);
}
static int fake_open(void *ctx, int rank, int size, int64_t max_n, uint64_t epoch, void **grp) {
    fake_lib *L = ctx;
    (void)max_n;
    (void)epoch;
    if (size != L->size) return -1;
    pthread_mutex_lock(&L->mu);
    L->opens++;
    pthread_mutex_unlock(&L->mu);
    g_fgrp[rank] = (fake_grp){L, rank, 0};
    *grp = &g_fgrp[rank];
    return 0;
}
static int fake_allreduce(void *grp, float *x, int64_t n, int timeout_ms, char *err, size_t errlen) {
    fake_grp *G = grp;
    fake_lib *L = G->lib;
    (void)timeout_ms;
    if (G->op++ == L->fail_op) return cm_errf(err, errlen, CM_EIO, "fake library failed op %d", L->fail_op);
    L->slot[G->rank] = x;
    fake_meet(L);
    float *sum = malloc((size_t)n * sizeof *sum);
    for (int64_t i = 0; i < n; i++) {
        float s = L->slot[L->size - 1][i];
        for (int j = L->size - 2; j >= 0; j--) s += L->slot[j][i];
        sum[i] = s;
    }
    fake_meet(L); /* every member has read every partial */
    memcpy(x, sum, (size_t)n * sizeof *x);
    free(sum);
    return 0;
}
static void fake_close(void *grp) { (void)grp; }

static void test_collective_native(void) {
    const int k = 3, n = 3000, ops = 2;
    g_fake = (fake_lib){.size = k, .fail_op = -1};
    pthread_mutex_init(&g_fake.mu, NULL);
    pthread_cond_init(&g_fake.cv, NULL);
    cm_coll_native nat = {.open = fake_open, .allreduce = fake_allreduce, .close = fake_close, .ctx = &g_fake};
    cm_coll_set_native(&nat);
    /* taken: every member gets the fake's reverse-order bits */
    for (int reset = 0; reset < 2; reset++) {
        float **parts = random_parts(k, n, ops, 55), **orig = random_parts(k, n, ops, 55);
        vec_member v[MAXM];
        int modes[MAXM] = {3 * reset, 3 * reset, 3 * reset};
        run_vec(k, n, ops, -1, false, modes, v, parts);
        int not_rev = 0, not_fwd = 0;
        for (int r = 0; r < k; r++) CHECKF(v[r].rc == 0, "native reset=%d member %d: %s", reset, r, v[r].err);
        for (int64_t i = 0; i < (int64_t)n * ops; i++) {
            float rev = orig[k - 1][i], fwd = orig[0][i];
            for (int j = k - 2; j >= 0; j--) rev += orig[j][i];
            for (int j = 1; j < k; j++) fwd += orig[j][i];
            for (int r = 0; r < k; r++) {
                not_rev += memcmp(&parts[r][i], &rev, 4) != 0;
                not_fwd += memcmp(&parts[r][i], &fwd, 4) != 0;
            }
        }
        if (!reset) {
            CHECKF(not_rev == 0 && not_fwd > 0, "native: %d elements not the fake's order, %d not the rank order",
                   not_rev, not_fwd);
            CHECKF(v[0].st.native_ops == (uint64_t)ops && v[0].st.total.msgs_sent == 0, "native ops %llu, %llu msgs",
                   (unsigned long long)v[0].st.native_ops, (unsigned long long)v[0].st.total.msgs_sent);
        } else { /* after cm_coll_reset: the ordered exchange again */
            CHECKF(not_fwd == 0 && not_rev > 0, "after reset: %d elements not the rank order", not_fwd);
            CHECKF(v[0].st.native_ops == 0, "after reset: %llu native ops", (unsigned long long)v[0].st.native_ops);
        }
        printf("  native %s: %d/%d member-elements differ from the rank order\n",
               reset ? "after reset (exchange)" : "taken", not_fwd, k * n * ops);
        free_parts(parts, k);
        free_parts(orig, k);
    }
    /* declined (a group of 2 of a 3-rank library): the exchange */
    float **parts = random_parts(2, n, 1, 56);
    vec_member v[MAXM];
    int opens = g_fake.opens;
    run_vec(2, n, 1, -1, false, NULL, v, parts);
    CHECKF(v[0].rc == 0 && v[1].rc == 0 && v[0].st.native_ops == 0 && v[0].st.direct_ops == 1, "declined: rc %d %s",
           v[0].rc, v[0].err);
    CHECK(g_fake.opens == opens);
    free_parts(parts, 2);
    /* a failed op fails the collective (and every later op) */
    g_fake.fail_op = 1;
    parts = random_parts(k, n, 3, 57);
    run_vec(k, n, 3, -1, false, NULL, v, parts);
    CHECKF(v[0].rc == CM_EIO && strstr(v[0].err, "fake library failed op 1") && v[0].st.native_ops == 1,
           "failed op: rc %d %s", v[0].rc, v[0].err);
    free_parts(parts, k);
    cm_coll_set_native(NULL);
    pthread_mutex_destroy(&g_fake.mu);
    pthread_cond_destroy(&g_fake.cv);
}

/* ---- models over tensor-parallel groups and pipeline stages ---- */
typedef struct model_h {
    cm_buf bytes;
    cm_gguf g;
    cm_model m;
} model_h;

static int open_stories(model_h *h) {
    memset(h, 0, sizeof *h);
    cm_buf_init(&h->bytes);
    if (cm_gguf_open(&h->g, t_shared("models/stories260K-f32.gguf"), NULL, NULL, errbuf, sizeof errbuf)) return -1;
    return cm_model_load(&h->m, &h->g, errbuf, sizeof errbuf);
}
/* Dims multiples of 256, Q8_0 matrices; 64 attn_output columns per KV head. */
static int make_synth(model_h *h) {
    memset(h, 0, sizeof *h);
    cm_buf_init(&h->bytes);
    tp_model_spec s = {.E = 256, .L = 4, .H = 8, .HKV = 4, .F = 768, .V = 512, .type = CM_TYPE_Q8_0, .seed = 5};
    if (tp_model_write(&s, NULL, &h->bytes, errbuf, sizeof errbuf)) return -1;
    if (cm_gguf_parse(&h->g, (const uint8_t *)h->bytes.data, h->bytes.len, errbuf, sizeof errbuf)) return -1;
    return cm_model_load(&h->m, &h->g, errbuf, sizeof errbuf);
}
static void model_close(model_h *h) {
    cm_model_release(&h->m);
    cm_gguf_close(&h->g);
    cm_buf_release(&h->bytes);
}

typedef struct stage_cfg {
    int lf, ll, k;
    cm_slice sl[MAXM];
} stage_cfg;

typedef struct tp_run {
    const cm_model *m;
    int n_stages;
    stage_cfg st[2];
    bool compress;
    int64_t ring_min;
    int drop_idx;    /* this member zeroes its partial before each all-reduce; -1 none */
    bool head_split; /* one stage: each member computes its rows of the head, member 0 gathers them */
    pthread_barrier_t bar;
    int32_t tokens[PROMPT + STEPS];
    float *hidden; /* [PROMPT][E]: stage 0 -> stage 1 */
    int ids[STEPS];
    float *logits[2 * MAXM]; /* by member index: [STEPS][V] (last stage only) */
    volatile int failed;
    mesh M[2];
} tp_run;

typedef struct tp_member {
    tp_run *R;
    int stage, rank, idx;
    cm_coll *coll;
    bool drop;
    int rc;
    char err[600];
    cm_coll_stats after_prefill, end;
} tp_member;

static int drop_cb(void *user, float *x, int64_t n) {
    tp_member *me = user;
    if (me->drop) memset(x, 0, (size_t)n * sizeof *x);
    return cm_coll_allreduce_cb(me->coll, x, n);
}

/* The split head (cm_head_gather_fn): every member's rows of each logits row to member 0. */
static int head_cb(void *user, float *logits, int n_out) {
    tp_member *me = user;
    const stage_cfg *S = &me->R->st[0];
    int64_t part[MAXM + 1] = {0};
    for (int r = 0, v0; r < S->k; r++) {
        int v1;
        cm_slice_head_rows(me->R->m, S->sl[r], &v0, &v1);
        part[r + 1] = v1;
    }
    for (int i = 0; i < n_out; i++) {
        int rc = cm_coll_gather(me->coll, logits + (size_t)i * me->R->m->hp.n_vocab, part, 0, NULL, 0);
        if (rc) return rc;
    }
    return 0;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void *member_main(void *arg) {
    tp_member *me = arg;
    tp_run *R = me->R;
    const cm_model *m = R->m;
    const stage_cfg *S = &R->st[me->stage];
    int V = m->hp.n_vocab, E = m->hp.n_embd;
    cm_ctx *ctx = NULL;
    cm_kv kv;
    memset(&kv, 0, sizeof kv);
    if (S->k > 1 && (me->rc = mesh_join(&R->M[me->stage], me->rank, me->err, sizeof me->err))) R->failed = 1;
    if (!me->rc && S->k > 1) {
        cm_coll_cfg cfg = {.rank = me->rank,
                           .size = S->k,
                           .max_n = (int64_t)PROMPT * E,
                           .ring_min = R->ring_min,
                           .compress = R->compress,
                           .epoch = 1};
        for (int j = 0; j < S->k; j++) cfg.peers[j] = R->M[me->stage].conns[me->rank][j];
        if ((me->rc = cm_coll_new(&cfg, &me->coll, me->err, sizeof me->err))) R->failed = 1;
    }
    if (!me->rc && (!(ctx = cm_ctx_new(m, PROMPT, 64, NULL, me->err, sizeof me->err)) ||
                    (me->rc = cm_kv_init(&kv, m, S->lf, S->ll, S->sl[me->rank], 64, me->err, sizeof me->err)))) {
        me->rc = me->rc ? me->rc : -1;
        R->failed = 1;
    }
    int32_t pos[PROMPT], seq[PROMPT] = {0};
    cm_kv *kvs[1] = {&kv};
    for (int step = 0; step < STEPS; step++) {
        int n = step == 0 ? PROMPT : 1, p0 = step == 0 ? 0 : PROMPT + step - 1;
        for (int i = 0; i < n; i++) pos[i] = p0 + i;
        for (int s = 0; s < R->n_stages; s++) {
            pthread_barrier_wait(&R->bar);
            if (s != me->stage || R->failed) continue;
            cm_batch b = {.n = n,
                          .tokens = s == 0 ? R->tokens + p0 : NULL,
                          .embd = s == 0 ? NULL : R->hidden,
                          .pos = pos,
                          .seq = seq};
            cm_forward_args a = {.layer_first = S->lf,
                                 .layer_last = S->ll,
                                 .slice = S->sl[me->rank],
                                 .kvs = kvs,
                                 .n_kvs = 1,
                                 .allreduce = me->coll ? drop_cb : NULL,
                                 .allreduce_user = me};
            if (S->ll < m->hp.n_layer && me->rank == 0) a.out_hidden = R->hidden;
            if (S->ll == m->hp.n_layer) a.out_logits = R->logits[me->idx] + (size_t)step * V;
            if (R->head_split && me->coll) {
                cm_slice_head_rows(m, S->sl[me->rank], &a.head_v0, &a.head_v1);
                a.head_gather = head_cb;
                a.head_gather_user = me;
            }
            me->rc = cm_forward(ctx, &b, &a, me->err, sizeof me->err);
            if (me->rc) R->failed = 1;
        }
        pthread_barrier_wait(&R->bar);
        if (me->idx == 0 && !R->failed) { /* member 0 of the last stage is idx 0 of that stage: see run_model */
            int last = R->n_stages - 1, li = 0;
            for (int s = 0; s < last; s++) li += R->st[s].k;
            R->ids[step] = argmax(R->logits[li] + (size_t)step * V, V);
            R->tokens[PROMPT + step] = R->ids[step];
        }
        if (me->coll) {
            if (step == 0) cm_coll_stats_get(me->coll, &me->after_prefill);
            cm_coll_stats_get(me->coll, &me->end);
        }
    }
    cm_kv_release(&kv);
    cm_ctx_free(ctx);
    cm_coll_free(me->coll);
    return NULL;
}

typedef struct run_out {
    int ids[STEPS];
    float *logits[2 * MAXM];
    int n_last, first_last; /* members of the last stage: idx first_last .. */
    tp_member mem[2 * MAXM];
    int total;
} run_out;

static const int32_t k_prompt[PROMPT] = {1, 403, 407, 261, 378, 430, 270, 307, 58};

static int run_model(tp_run *R, run_out *o) {
    int V = R->m->hp.n_vocab, total = 0;
    memset(o, 0, sizeof *o);
    memcpy(R->tokens, k_prompt, sizeof k_prompt);
    R->hidden = calloc((size_t)PROMPT * R->m->hp.n_embd, sizeof(float));
    R->failed = 0;
    for (int s = 0; s < R->n_stages; s++) {
        if (R->st[s].k > 1 && mesh_listen(&R->M[s], R->st[s].k)) return -1;
        total += R->st[s].k;
    }
    o->total = total;
    pthread_barrier_init(&R->bar, NULL, (unsigned)total);
    pthread_t th[2 * MAXM];
    for (int s = 0, idx = 0; s < R->n_stages; s++)
        for (int r = 0; r < R->st[s].k; r++, idx++) {
            R->logits[idx] = calloc((size_t)STEPS * V, sizeof(float));
            o->mem[idx] = (tp_member){.R = R, .stage = s, .rank = r, .idx = idx, .drop = idx == R->drop_idx};
            if (s == R->n_stages - 1 && r == 0) o->first_last = idx;
        }
    /* idx 0 picks the next token from the last stage's member 0 (all threads see it after the barrier) */
    for (int i = 0; i < total; i++) pthread_create(&th[i], NULL, member_main, &o->mem[i]);
    for (int i = 0; i < total; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&R->bar);
    for (int s = 0; s < R->n_stages; s++)
        if (R->st[s].k > 1) mesh_free(&R->M[s]);
    o->n_last = R->st[R->n_stages - 1].k;
    memcpy(o->ids, R->ids, sizeof o->ids);
    memcpy(o->logits, R->logits, sizeof o->logits);
    free(R->hidden);
    int rc = 0;
    for (int i = 0; i < total; i++)
        if (o->mem[i].rc) {
            fprintf(stderr, "  member %d: %s\n", i, o->mem[i].err);
            rc = -1;
        }
    return R->failed ? -1 : rc;
}
static void run_free(run_out *o) {
    for (int i = 0; i < 2 * MAXM; i++) free(o->logits[i]);
}

/* Max |p - p_ref| over all steps and the vocabulary (softmax in double). */
static double prob_diff(const float *a, const float *b, int V) {
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        const float *x = a + (size_t)s * V, *y = b + (size_t)s * V;
        double mx = x[argmax(x, V)], my = y[argmax(y, V)], sx = 0, sy = 0;
        for (int i = 0; i < V; i++) sx += exp(x[i] - mx), sy += exp(y[i] - my);
        for (int i = 0; i < V; i++) worst = fmax(worst, fabs(exp(x[i] - mx) / sx - exp(y[i] - my) / sy));
    }
    return worst;
}

/* Slices of a k-member group from the planner, node i having speed w[i]. */
static void plan_slices(const model_h *h, int k, const double *w, cm_slice *out) {
    cm_plan_model pm;
    CHECK(cm_plan_model_from_gguf(&h->g, &pm, errbuf, sizeof errbuf) == 0);
    cm_plan_cluster c;
    memset(&c, 0, sizeof c);
    c.n_nodes = k;
    int group_of[MAXM];
    for (int i = 0; i < k; i++) {
        snprintf(c.nodes[i].name, sizeof c.nodes[i].name, "n%d", i);
        c.nodes[i].mem_bytes = 8ull << 30;
        c.nodes[i].mem_bw = w[i] * 1e9;
        c.nodes[i].flops = w[i] * 1e11;
        group_of[i] = 0;
        for (int j = 0; j < k; j++) c.rtt_s[i][j] = 1e-4, c.bw[i][j] = 1e9;
    }
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.ctx = 64;
    cm_plan p;
    CHECKF(cm_plan_for_groups(&pm, &c, &o, group_of, &p, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    for (int i = 0; i < k; i++) {
        const cm_plan_member *mb = &p.stages[0].members[i];
        out[mb->node] = (cm_slice){mb->kv_head_begin, mb->kv_head_end, mb->ffn_begin, mb->ffn_end};
    }
}

typedef struct tp_case {
    const char *name;
    int n_stages, k[2];
    bool planned; /* slices from cm_plan with speeds 1, 2, 3, ... */
    bool compress;
    int64_t ring_min; /* 0: prefill uses the ring (small threshold); -1: direct */
} tp_case;

static void check_case(const char *model, model_h *h, const run_out *ref, const tp_case *tc, bool f32) {
    const cm_model *m = &h->m;
    int L = m->hp.n_layer, E = m->hp.n_embd, V = m->hp.n_vocab;
    tp_run R;
    memset(&R, 0, sizeof R);
    R.m = m;
    R.n_stages = tc->n_stages;
    R.compress = tc->compress;
    R.ring_min = tc->ring_min == 0 ? E + 1 : tc->ring_min; /* prefill: ring; decode: direct */
    R.drop_idx = -1;
    for (int s = 0; s < tc->n_stages; s++) {
        stage_cfg *S = &R.st[s];
        S->k = tc->k[s];
        S->lf = tc->n_stages == 1 ? 0 : s == 0 ? 0 : L / 2;
        S->ll = tc->n_stages == 1 ? L : s == 0 ? L / 2 : L;
        if (tc->planned) {
            double w[MAXM] = {1, 2, 3, 4};
            plan_slices(h, S->k, w, S->sl);
        } else { /* even by KV heads and FFN granules of 32 */
            int HKV = m->hp.n_head_kv, F = m->hp.n_ff;
            for (int r = 0; r < S->k; r++)
                S->sl[r] = (cm_slice){HKV * r / S->k, HKV * (r + 1) / S->k, F / 32 * r / S->k * 32,
                                      r == S->k - 1 ? F : F / 32 * (r + 1) / S->k * 32};
        }
        for (int r = 0; r < S->k; r++)
            CHECKF(cm_slice_check(m, S->sl[r], errbuf, sizeof errbuf) == 0, "%s %s: slice %d: %s", model, tc->name, r,
                   errbuf);
    }
    run_out o;
    int rc = run_model(&R, &o);
    CHECKF(rc == 0, "%s %s: run failed", model, tc->name);
    if (rc) {
        run_free(&o);
        return;
    }
    int same_ids = !memcmp(o.ids, ref->ids, sizeof o.ids);
    double pd = prob_diff(o.logits[o.first_last], ref->logits[0], V);
    int ident = 1;
    for (int i = 1; i < o.n_last; i++)
        ident &= !memcmp(o.logits[o.first_last + i], o.logits[o.first_last], (size_t)STEPS * V * sizeof(float));
    if (!tc->compress) {
        CHECKF(same_ids, "%s %s: greedy ids differ from one machine", model, tc->name);
        if (f32) CHECKF(pd <= 1e-4, "%s %s: probabilities differ by %.3g", model, tc->name, pd);
    }
    CHECKF(ident, "%s %s: members of the last stage disagree", model, tc->name);
    char sl[256] = "";
    for (int s = 0; s < tc->n_stages; s++)
        for (int r = 0; r < tc->k[s]; r++) {
            const cm_slice *x = &R.st[s].sl[r];
            snprintf(sl + strlen(sl), sizeof sl - strlen(sl), " h%d-%d/f%d-%d", x->h0, x->h1, x->f0, x->f1);
        }
    printf("  %s %-22s ids %s, max |dp| %.2e, members identical %s;%s\n", model, tc->name,
           same_ids ? "equal" : "DIFFER", pd, ident ? "yes" : "NO", sl);
    /* bytes and exchanges per decode token, per member, against the formula */
    for (int i = 0; i < o.total; i++) {
        const tp_member *mb = &o.mem[i];
        int k = tc->k[mb->stage];
        if (k < 2) continue;
        const stage_cfg *S = &R.st[mb->stage];
        int layers = S->ll - S->lf;
        uint64_t data = (mb->end.total.data_sent - mb->after_prefill.total.data_sent) / (STEPS - 1);
        uint64_t msgs = (mb->end.total.msgs_sent - mb->after_prefill.total.msgs_sent) / (STEPS - 1);
        uint64_t ops = (mb->end.ops - mb->after_prefill.ops) / (STEPS - 1);
        uint64_t wire = (mb->end.total.wire_sent - mb->after_prefill.total.wire_sent) / (STEPS - 1);
        uint64_t formula = (uint64_t)(k - 1) * 2 * layers * E * 4;
        if (tc->compress) formula = (uint64_t)(k - 1) * 2 * layers * ((E + 31) / 32) * 34;
        CHECKF(data == formula && ops == 2u * layers && msgs == (uint64_t)(k - 1) * 2 * layers,
               "%s %s member %d: %llu bytes %llu msgs %llu ops per token, formula %llu", model, tc->name, i,
               (unsigned long long)data, (unsigned long long)msgs, (unsigned long long)ops,
               (unsigned long long)formula);
        if (i == 0 || (tc->n_stages == 2 && mb->rank == 0))
            printf("    member %d: per decode token %llu data bytes sent (formula (k-1)x2x%dx%dx%d = %llu), "
                   "%llu on the wire, %llu messages, %llu all-reduces; prefill: %llu ring + %llu direct ops\n",
                   i, (unsigned long long)data, layers, E, tc->compress ? 34 : 4, (unsigned long long)formula,
                   (unsigned long long)wire, (unsigned long long)msgs, (unsigned long long)ops,
                   (unsigned long long)mb->after_prefill.ring_ops, (unsigned long long)mb->after_prefill.direct_ops);
    }
    run_free(&o);
}

static void model_suite(const char *name, model_h *h, bool f32) {
    tp_run R;
    memset(&R, 0, sizeof R);
    R.m = &h->m;
    R.n_stages = 1;
    R.st[0] = (stage_cfg){0, h->m.hp.n_layer, 1, {cm_slice_full(&h->m)}};
    R.drop_idx = -1;
    run_out ref;
    CHECK(run_model(&R, &ref) == 0);
    static const tp_case cases[] = {
        {"tp2 even, ring prefill", 1, {2, 0}, false, false, 0},
        {"tp3 planned 1:2:3", 1, {3, 0}, true, false, 0},
        {"tp3 planned, direct", 1, {3, 0}, true, false, -1},
        {"tp4 even, ring prefill", 1, {4, 0}, false, false, 0},
        {"hybrid 2x2", 2, {2, 2}, false, false, 0},
        {"tp3 planned, compress", 1, {3, 0}, true, true, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(name, h, &ref, &cases[i], f32);

    /* A dropped partial: the same comparison must fail. */
    tp_run D;
    memset(&D, 0, sizeof D);
    D.m = &h->m;
    D.n_stages = 1;
    D.st[0] = (stage_cfg){0, h->m.hp.n_layer, 2, {{0, 2, 0, 96}, {2, h->m.hp.n_head_kv, 96, h->m.hp.n_ff}}};
    D.ring_min = -1;
    D.drop_idx = 1;
    run_out o;
    CHECK(run_model(&D, &o) == 0);
    double pd = prob_diff(o.logits[0], ref.logits[0], h->m.hp.n_vocab);
    CHECKF(pd > 1e-2, "%s: a dropped partial went unnoticed (max |dp| %.3g)", name, pd);
    printf("  %s dropped partial: max |dp| %.3f, ids %s (the check catches it)\n", name, pd,
           memcmp(o.ids, ref.ids, sizeof o.ids) ? "differ" : "equal");
    run_free(&o);

    /* A split head (CM_ASSIGN_F_HEAD): member 0's logits are the bits of the
     * whole head on member 0 (each logit is one row's dot product); member
     * 1 sends exactly its rows, member 0 nothing. Without the gather, member
     * 0's rows past its own would stay zero and the comparison would fail. */
    D.drop_idx = -1;
    run_out whole, split;
    CHECK(run_model(&D, &whole) == 0);
    D.head_split = true;
    CHECK(run_model(&D, &split) == 0);
    int V = h->m.hp.n_vocab, v0, v1;
    cm_slice_head_rows(&h->m, D.st[0].sl[1], &v0, &v1);
    CHECKF(!memcmp(split.logits[0], whole.logits[0], (size_t)STEPS * V * sizeof(float)) &&
               !memcmp(split.ids, whole.ids, sizeof split.ids),
           "%s: a split head gives other logits than the whole one", name);
    CHECKF(split.mem[1].end.head_data_sent == (uint64_t)STEPS * (uint64_t)(v1 - v0) * 4 &&
               split.mem[0].end.head_data_sent == 0 && v1 == V && v0 > 0,
           "%s: split head: member 1 sent %llu bytes for rows [%d, %d)", name,
           (unsigned long long)split.mem[1].end.head_data_sent, v0, v1);
    printf("  %s split head: member 1 computes vocabulary rows [%d, %d), member 0's logits bit-identical\n", name, v0,
           v1);
    run_free(&whole);
    run_free(&split);
    run_free(&ref);
}

static void test_stories(void) {
    model_h h;
    if (open_stories(&h)) {
        CHECKF(0, "stories260K: %s", errbuf);
        return;
    }
    model_suite("stories260K", &h, true);
    model_close(&h);
}

static void test_synth_q8(void) {
    model_h h;
    if (make_synth(&h)) {
        CHECKF(0, "synth: %s", errbuf);
        return;
    }
    model_suite("synth-q8_0", &h, false);
    model_close(&h);
}

/* The planner only cuts where cm_slice_check allows: Q8_0 attn_output with
 * 16 columns per KV head needs boundaries on even heads, ffn_down rows on 32. */
static void test_plan_legal_slices(void) {
    model_h h;
    memset(&h, 0, sizeof h);
    cm_buf_init(&h.bytes);
    tp_model_spec s = {.E = 64, .L = 1, .H = 8, .HKV = 4, .F = 160, .V = 64, .type = CM_TYPE_Q8_0, .seed = 2};
    CHECK(tp_model_write(&s, NULL, &h.bytes, errbuf, sizeof errbuf) == 0);
    CHECK(cm_gguf_parse(&h.g, (const uint8_t *)h.bytes.data, h.bytes.len, errbuf, sizeof errbuf) == 0);
    CHECKF(cm_model_load(&h.m, &h.g, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    CHECK(cm_slice_check(&h.m, (cm_slice){0, 1, 0, 160}, errbuf, sizeof errbuf) == CM_EINVAL); /* the test can fail */
    const double speeds[3][MAXM] = {{1, 2, 3, 4}, {3, 1, 1, 1}, {1, 1, 1, 5}};
    for (int k = 2; k <= 4; k++)
        for (int v = 0; v < 3; v++) {
            cm_slice sl[MAXM];
            plan_slices(&h, k, speeds[v], sl);
            int heads = 0, rows = 0;
            for (int r = 0; r < k; r++) {
                CHECKF(cm_slice_check(&h.m, sl[r], errbuf, sizeof errbuf) == 0, "k=%d speeds %d member %d: %s", k, v, r,
                       errbuf);
                heads += sl[r].h1 - sl[r].h0;
                rows += sl[r].f1 - sl[r].f0;
                if (r) CHECK(sl[r].h0 == sl[r - 1].h1 && sl[r].f0 == sl[r - 1].f1);
            }
            CHECK(heads == 4 && rows == 160 && sl[0].h0 == 0 && sl[0].f0 == 0);
        }
    model_close(&h);
}

int main(void) {
    RUN(test_plan_legal_slices);
    RUN(test_collective_orders);
    RUN(test_collective_compress);
    RUN(test_collective_failures);
    RUN(test_collective_shm);
    RUN(test_collective_native);
    RUN(test_stories);
    RUN(test_synth_q8);
    TEST_END();
}
