/*
 * test_ep.c: expert parallelism below the cluster (issue 13).
 *   - the forward-pass contract: members of an in-process expert group (one
 *     thread each, an expert slice each, a gather callback that copies the
 *     other members' expert rows) produce logits with the BITS of one
 *     machine, prefill and decode, for qwen3moe 8x2, qwen3moe 64x8 and
 *     qwen2moe (shared expert), with uneven and empty expert ranges;
 *   - cm_coll_allgather over a real encrypted mesh: uneven parts (one empty,
 *     several pieces long) arrive byte for byte on every member, and the
 *     element bytes counted equal (members - 1) x part bytes per member;
 *   - a hostile member's forged piece (one element off, an all-reduce point
 *     where a gather is due, point 2 flagged Q8_0) fails the op with
 *     CM_EPROTO on every honest member, and none of its bytes land;
 *   - hot-expert replication: a skewed qwen3moe's warm-up counts, the
 *     planner's replicas from them, the group run with the rows of a
 *     replicated expert split among its holders: one machine's bits;
 *   - the gather piece header: point 2 accepted, point 2 with the Q8_0 flag
 *     refused; an expert slice of a dense model or one cutting heads refused.
 */
#include "test.h"

#include "cluster/collective.h"
#include "cluster/ep_gather.h"
#include "fixtures.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "net/net.h"
#include "os/os.h"
#include "sched/plan.h"
#include "synth/synth.h"

#include <pthread.h>
#include <stdlib.h>

static char errbuf[512];
static cm_gguf g_vocab;

typedef struct fx {
    cm_buf file;
    cm_gguf g;
    cm_model m;
} fx;

static int fx_open(fx *f, const char *arch, int experts, int used, int shared, uint64_t seed) {
    memset(f, 0, sizeof *f);
    cm_buf_init(&f->file);
    cm_synth_params sp = {.arch = arch,
                          .n_embd = 256,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .n_ctx = 256,
                          .type = "q8_0",
                          .seed = seed,
                          .n_threads = 2,
                          .n_expert = experts,
                          .n_expert_used = used,
                          .n_ff_exp = 256,
                          .n_ff_shexp = shared};
    if (cm_synth_write(&sp, &g_vocab, NULL, &f->file, errbuf, sizeof errbuf) ||
        cm_gguf_parse(&f->g, (const uint8_t *)f->file.data, f->file.len, errbuf, sizeof errbuf) ||
        cm_model_load(&f->m, &f->g, errbuf, sizeof errbuf)) {
        fprintf(stderr, "  %s: %s\n", arch, errbuf);
        return -1;
    }
    return 0;
}

static void fx_close(fx *f) {
    cm_model_release(&f->m);
    cm_gguf_close(&f->g);
    cm_buf_release(&f->file);
}

#define NTOK 10
#define NDEC 4
#define MAXM 4
static const int32_t k_prompt[NTOK + NDEC] = {1,   450,   4996,  17354, 1701, 432, 12500,
                                              975, 15043, 29892, 920,   338,  263, 2217};

/* ---- an in-process expert group ---- */
typedef struct group {
    int k;
    pthread_barrier_t bar;
    float *y[MAXM];
    const int *bounds;       /* [k + 1] expert bounds */
    const uint32_t *holders; /* replicated experts (NULL: the bounds alone) */
} group;

typedef struct member {
    group *G;
    const cm_model *m;
    int rank;
    float *logits; /* [NTOK + NDEC][V]: the prompt's last row, then each decoded row */
    int rc;
    char err[256];
} member;

/* cm_expert_gather_fn: publish our rows, copy every other member's run. */
static int gather_cb(void *user, float *y, int64_t row_len, const int32_t *rows, int n_expert) {
    member *me = user;
    group *G = me->G;
    G->y[me->rank] = y;
    pthread_barrier_wait(&G->bar);
    for (int r = 0; r < G->k; r++) {
        if (r == me->rank) continue;
        if (G->holders) { /* each expert's share of member r (cm_expert_share) */
            for (int e = 0; e < n_expert; e++) {
                int lo, hi;
                cm_expert_share(G->holders[e], r, rows[e + 1] - rows[e], &lo, &hi);
                const int64_t a = rows[e] + lo;
                memcpy(y + a * row_len, G->y[r] + a * row_len, (size_t)((hi - lo) * row_len) * sizeof(float));
            }
            continue;
        }
        int64_t a = rows[G->bounds[r]], b = rows[G->bounds[r + 1]];
        memcpy(y + a * row_len, G->y[r] + a * row_len, (size_t)((b - a) * row_len) * sizeof(float));
    }
    pthread_barrier_wait(&G->bar); /* nobody writes its rows again before everyone copied */
    (void)n_expert;
    return 0;
}

/* The prompt in one batch (logits of its last row), then NDEC decode steps
 * of the fixed continuation; ep: this member's expert slice. */
static const uint32_t *g_holders; /* run_member: replicated experts (test_ep_replicas) */
static _Thread_local int g_rank;
static int run_member(const cm_model *m, cm_expert_slice ex, cm_expert_gather_fn gather, void *user, float *logits) {
    const cm_slice sl = cm_slice_full(m);
    const int V = m->hp.n_vocab;
    cm_ctx *c = cm_ctx_new(m, NTOK, 64, NULL, errbuf, sizeof errbuf);
    cm_kv kv;
    if (!c || cm_kv_init(&kv, m, 0, m->hp.n_layer, sl, 64, errbuf, sizeof errbuf)) {
        cm_ctx_free(c);
        return -1;
    }
    int rc = 0;
    int32_t pos[NTOK], seq[NTOK] = {0};
    for (int i = 0; i < NTOK; i++) pos[i] = i;
    cm_kv *kvs[1] = {&kv};
    cm_batch b = {.n = NTOK, .tokens = k_prompt, .pos = pos, .seq = seq};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = m->hp.n_layer,
                         .slice = sl,
                         .kvs = kvs,
                         .n_kvs = 1,
                         .experts = ex,
                         .expert_gather = gather,
                         .expert_gather_user = user,
                         .out_logits = logits,
                         .expert_holders = ex.ep ? g_holders : NULL,
                         .expert_rank = g_rank};
    char e[256];
    rc = cm_forward(c, &b, &a, e, sizeof e);
    for (int t = 0; t < NDEC && !rc; t++) {
        int32_t p1 = NTOK + t, s1 = 0;
        cm_batch b1 = {.n = 1, .tokens = k_prompt + NTOK + t, .pos = &p1, .seq = &s1};
        a.out_logits = logits + (size_t)(t + 1) * V;
        rc = cm_forward(c, &b1, &a, e, sizeof e);
    }
    if (rc) snprintf(errbuf, sizeof errbuf, "%s", e);
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return rc;
}

static void *member_main(void *arg) {
    member *me = arg;
    cm_expert_slice ex = {true, me->G->bounds[me->rank], me->G->bounds[me->rank + 1]};
    g_rank = me->rank;
    me->rc = run_member(me->m, ex, gather_cb, me, me->logits);
    return NULL;
}

/* Group of k with expert bounds[k + 1] equals one machine bit for bit. */
static void check_group(const cm_model *m, const float *want, int k, const int *bounds, const char *what) {
    const size_t V = (size_t)m->hp.n_vocab, n = (NDEC + 1) * V;
    group G = {.k = k, .bounds = bounds, .holders = g_holders};
    pthread_barrier_init(&G.bar, NULL, (unsigned)k);
    member mb[MAXM];
    pthread_t th[MAXM];
    for (int r = 0; r < k; r++) {
        mb[r] = (member){.G = &G, .m = m, .rank = r, .logits = malloc(n * sizeof(float))};
        pthread_create(&th[r], NULL, member_main, &mb[r]);
    }
    for (int r = 0; r < k; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < k; r++) {
        CHECKF(mb[r].rc == 0, "%s: member %d failed", what, r);
        if (!mb[r].rc)
            CHECKF(!memcmp(mb[r].logits, want, n * sizeof(float)), "%s: member %d's logits differ from one machine",
                   what, r);
        free(mb[r].logits);
    }
    pthread_barrier_destroy(&G.bar);
}

static void test_ep_forward_bits(void) {
    static const struct {
        const char *arch;
        int X
        , k, sh;
        int ng;
        int bounds[3][MAXM + 1];
        int kk[3];
    } cases[] = {
        {"qwen3moe", 8, 2, 0, 3, {{0, 2, 5, 8}, {0, 7, 8}, {0, 0, 3, 8}}, {3, 2, 3}},
        {"qwen3moe", 64, 8, 0, 2, {{0, 9, 30, 64}, {0, 16, 32, 48, 64}}, {3, 4}},
        {"qwen2moe", 8, 2, 128, 2, {{0, 3, 8}, {0, 1, 2, 8}}, {2, 3}},
    };
    for (size_t ci = 0; ci < CM_ARRAY_LEN(cases); ci++) {
        fx f;
        if (fx_open(&f, cases[ci].arch, cases[ci].X, cases[ci].k, cases[ci].sh, 40 + ci)) {
            CHECK(0);
            continue;
        }
        const size_t V = (size_t)f.m.hp.n_vocab;
        float *want = malloc((NDEC + 1) * V * sizeof(float));
        CHECKF(run_member(&f.m, (cm_expert_slice){false, 0, 0}, NULL, NULL, want) == 0, "%s", errbuf);
        for (int gi = 0; gi < cases[ci].ng; gi++) {
            char what[96];
            snprintf(what, sizeof what, "%s %dx%d, %d members (group %d)", cases[ci].arch, cases[ci].X, cases[ci].k,
                     cases[ci].kk[gi], gi);
            check_group(&f.m, want, cases[ci].kk[gi], cases[ci].bounds[gi], what);
        }
        /* alone with every expert as an expert slice: no gather needed, same bits */
        cm_expert_slice all = { true, 0, cases[ci].X };
        float *alone = malloc((NDEC + 1) * V * sizeof(float));
        CHECK(run_member(&f.m, all, NULL, NULL, alone) == 0 && !memcmp(alone, want, (NDEC + 1) * V * sizeof(float)));
        /* a part of the experts without a gather: refused, not wrong */
        cm_expert_slice part = all;
        part.e1 = 1;
        CHECK(run_member(&f.m, part, NULL, NULL, alone) == CM_EINVAL && strstr(errbuf, "without an expert gather"));
        /* an expert slice that cuts heads, or runs past the experts */
        cm_slice cut = cm_slice_full(&f.m);
        cut.h1 = 1;
        CHECK(cm_expert_slice_check(&f.m, cut, all, errbuf, sizeof errbuf) == CM_EINVAL);
        cm_expert_slice past = all;
        past.e1 = cases[ci].X
        +1;
        CHECK(cm_expert_slice_check(&f.m, cm_slice_full(&f.m), past, errbuf, sizeof errbuf) == CM_EINVAL);
        CHECK(cm_expert_slice_check(&f.m, cm_slice_full(&f.m), all, errbuf, sizeof errbuf) == 0);
        free(alone);
        free(want);
        fx_close(&f);
    }
    /* a dense model has no expert slices */
    fx d;
    if (fx_open(&d, "qwen3", 0, 0, 0, 7) == 0) {
        cm_expert_slice x = {true, 0, 1};
        CHECK(cm_expert_slice_check(&d.m, cm_slice_full(&d.m), x, errbuf, sizeof errbuf) == CM_EINVAL &&
              strstr(errbuf, "no experts"));
        fx_close(&d);
    } else CHECK(0);
}

/* ---- hot-expert replication (issue 13) ----
 * A qwen3moe 8x2 whose router is skewed (expert HOT's router row scaled by
 * 40, so it wins wherever its logit is positive); a warm-up
 * on one machine counts the routing (cm_ctx_expert_hits); the planner, given
 * those counts and three equal machines, replicates the hot expert; the group
 * run with the plan's holders splits its rows between its holders and gives
 * the logits of one machine, bit for bit. Without the split applied, the
 * replica's rows would be gathered from a member that never computed them. */
#define HOT 0
static void test_ep_replicas(void) {
    /* the share rule itself: contiguous, covering, one token to the last holder */
    int lo, hi, lo2, hi2;
    cm_expert_share(0x5u, 0, 10, &lo, &hi);
    cm_expert_share(0x5u, 2, 10, &lo2, &hi2);
    CHECK(lo == 0 && hi == 5 && lo2 == 5 && hi2 == 10);
    cm_expert_share(0x5u, 1, 10, &lo, &hi);
    CHECK(lo == hi);
    cm_expert_share(0x7u, 0, 1, &lo, &hi);
    cm_expert_share(0x7u, 2, 1, &lo2, &hi2);
    CHECK(lo == hi && lo2 == 0 && hi2 == 1);

    fx f;
    memset(&f, 0, sizeof f);
    cm_buf_init(&f.file);
    cm_synth_params sp = {.arch = "qwen3moe",
                          .n_embd = 256,
                          .n_layer = 2,
                          .n_head = 4,
                          .n_head_kv = 2,
                          .n_ff = 512,
                          .n_ctx = 256,
                          .type = "q8_0",
                          .seed = 77,
                          .n_threads = 2,
                          .n_expert = 8,
                          .n_expert_used = 2,
                          .n_ff_exp = 256};
    if (cm_synth_write(&sp, &g_vocab, NULL, &f.file, errbuf, sizeof errbuf) ||
        cm_gguf_parse(&f.g, (const uint8_t *)f.file.data, f.file.len, errbuf, sizeof errbuf)) {
        CHECKF(0, "%s", errbuf);
        return;
    }
    for (uint64_t i = 0; i < f.g.n_tensors; i++) { /* skew every router (F32 [256, 8], in the file's bytes) */
        const cm_gguf_tensor_info *t = &f.g.tensors[i];
        if (!strstr(t->name, "ffn_gate_inp.weight") || t->type != CM_TYPE_F32) continue;
        float *w = (float *)(uintptr_t)t->data;
        for (int64_t c = 0; c < t->ne[0]; c++) w[HOT * t->ne[0] + c] *= 40.0f;
    }
    if (cm_model_load(&f.m, &f.g, errbuf, sizeof errbuf)) {
        CHECKF(0, "%s", errbuf);
        fx_close(&f);
        return;
    }
    const size_t V = (size_t)f.m.hp.n_vocab;
    float *want = malloc((NDEC + 1) * V * sizeof(float));
    /* warm-up: the prompt on one machine, counting the routing */
    uint64_t hits[8] = {0}, sum = 0;
    {
        cm_ctx *c = cm_ctx_new(&f.m, NTOK, 64, NULL, errbuf, sizeof errbuf);
        cm_kv kv;
        CHECK(c && cm_kv_init(&kv, &f.m, 0, f.m.hp.n_layer, cm_slice_full(&f.m), 64, errbuf, sizeof errbuf) == 0);
        int32_t pos[NTOK], seq[NTOK] = {0};
        for (int i = 0; i < NTOK; i++) pos[i] = i;
        cm_kv *kvs[1] = {&kv};
        cm_batch b = {.n = NTOK, .tokens = k_prompt, .pos = pos, .seq = seq};
        cm_forward_args a = {
            .layer_first = 0, .layer_last = f.m.hp.n_layer, .slice = cm_slice_full(&f.m), .kvs = kvs, .n_kvs = 1};
        CHECKF(cm_forward(c, &b, &a, errbuf, sizeof errbuf) == 0, "%s", errbuf);
        CHECK(cm_ctx_expert_hits(c, hits, 8) == 8);
        cm_kv_release(&kv);
        cm_ctx_free(c);
    }
    int hot = 0;
    for (int e = 0; e < 8; e++) {
        sum += hits[e];
        if (hits[e] > hits[hot]) hot = e;
    }
    printf("# routing of the warm-up: ");
    for (int e = 0; e < 8; e++) printf("%llu ", (unsigned long long)hits[e]);
    printf("(2 layers x %d tokens x top 2)\n", NTOK);
    CHECKF(sum == 2ull * NTOK * 2, "hits sum to %llu", (unsigned long long)sum);
    CHECKF(hot == HOT && hits[HOT] * 8 >= 3 * sum / 2, "expert %d is not the hot one (%llu of %llu)", HOT,
           (unsigned long long)hits[HOT], (unsigned long long)sum);
    /* the planner: three equal machines, the counts */
    cm_plan_model pm;
    cm_plan_model_synthetic_moe(&pm, 2, 256, 4, 2, 8, 2, 256, 0, (int)V, 8.5);
    cm_plan_cluster cl;
    memset(&cl, 0, sizeof cl);
    cl.n_nodes = 3;
    for (int i = 0; i < 3; i++) {
        snprintf(cl.nodes[i].name, sizeof cl.nodes[i].name, "n%d", i);
        cl.nodes[i].mem_bytes = 8ull << 30, cl.nodes[i].mem_bw = 50e9, cl.nodes[i].flops = 1e12;
        for (int j = 0; j < 3; j++) cl.rtt_s[i][j] = 50e-6, cl.bw[i][j] = 1e9;
    }
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    o.mode = CM_PARALLEL_EP;
    o.expert_load = hits;
    cm_plan p;
    char e[512];
    CHECKF(cm_plan_make(&pm, &cl, &o, &p, e, sizeof e) == 0, "%s", e);
    const cm_plan_stage *st = &p.stages[0];
    uint32_t holders[8];
    int bounds[4] = {0}, reps = 0;
    for (int x = 0; x < 8; x++) holders[x] = cm_plan_expert_holders(st, x);
    for (int k = 0; k < st->n_members && k < 3; k++)
        bounds[k + 1] = st->members[k].expert_end, reps += st->members[k].n_replicas;
    CHECKF(p.n_stages == 1 && st->ep && st->n_members == 3, "plan: %s", p.why);
    CHECKF(reps > 0 && (holders[HOT] & (holders[HOT] - 1)), "the hot expert %d has holders 0x%x (%d replicas)", HOT,
           holders[HOT], reps);
    printf("# plan: experts [%d,%d) [%d,%d) [%d,%d), hot expert %d held by 0x%x, %d replica(s)\n", bounds[0], bounds[1],
           bounds[1], bounds[2], bounds[2], bounds[3], HOT, holders[HOT], reps);
    /* the group with those holders: one machine's bits */
    CHECKF(run_member(&f.m, (cm_expert_slice){false, 0, 0}, NULL, NULL, want) == 0, "%s", errbuf);
    g_holders = holders;
    check_group(&f.m, want, 3, bounds, "qwen3moe 8x2, skewed, hot expert replicated");
    g_holders = NULL;
    free(want);
    fx_close(&f);
}

/* ---- cm_coll_allgather over a mesh ---- */
static const uint8_t k_key[CM_KEY_BYTES] = {9, 1, 2, 3};
typedef struct mesh {
    int k;
    cm_listener *l[MAXM];
    char addr[MAXM][64];
    const char *addrs[MAXM];
    cm_conn *conns[MAXM][MAXM];
} mesh;

typedef struct gmember {
    mesh *M;
    int rank;
    int forge; /* a hostile member: 1 its piece one element off, 2 an all-reduce point, 3 point 2 as Q8_0 */
    const int64_t *part;
    float *x;
    int rc;
    char err[512];
    cm_coll_stats st;
    /* replicated experts (ep_gather.c): holders[n_expert], rows[n_expert + 1] of row_len floats */
    const uint32_t *holders;
    const int32_t *rows;
    int n_expert;
    int64_t row_len;
    cm_ep_pack pk;
} gmember;

/* k members' listeners on 127.0.0.1 (ports of the system's choice) and their
 * addresses, for cm_coll_mesh_open. */
static void mesh_listen(mesh *M, int k) {
    memset(M, 0, sizeof *M);
    M->k = k;
    for (int i = 0; i < k; i++) {
        CHECK(cm_net_listen("127.0.0.1", 0, &M->l[i], errbuf, sizeof errbuf) == 0);
        snprintf(M->addr[i], sizeof M->addr[i], "127.0.0.1:%u", cm_listener_port(M->l[i]));
        M->addrs[i] = M->addr[i];
    }
}

static void *gather_main(void *arg) {
    gmember *v = arg;
    cm_net_cfg cfg = {.mode = CM_SEC_ENCRYPT};
    memcpy(cfg.key, k_key, sizeof k_key);
    cm_msg_hello h;
    char hname[16];
    snprintf(hname, sizeof hname, "ep%d", v->rank);
    fx_hello(&h, hname, (uint8_t)(0x50 + v->rank), CM_ROLE_NODE);
    v->rc = cm_coll_mesh_open(v->rank, v->M->k, v->M->l[v->rank], v->M->addrs, &cfg, &h, 5000, v->M->conns[v->rank],
                              v->err, sizeof v->err);
    if (v->rc) return NULL;
    cm_coll_cfg cc = {.rank = v->rank, .size = v->M->k, .max_n = 256, .timeout_ms = 2000, .epoch = 5};
    for (int j = 0; j < v->M->k; j++) cc.peers[j] = v->M->conns[v->rank][j];
    cm_coll *c;
    if ((v->rc = cm_coll_new(&cc, &c, v->err, sizeof v->err))) return NULL;
    if (v->forge) { /* send one forged piece of our part to every peer, then stay until they judged it */
        int64_t m = CM_MIN(v->part[v->rank + 1] - v->part[v->rank], 64);
        uint8_t pl[CM_COLL_HDR_BYTES + 64 * 4] = {0};
        uint32_t off = (uint32_t)v->part[v->rank] + (v->forge == 1 ? 1 : 0);
        pl[0] = 5; /* epoch 5, op 0 */
        pl[18] = v->forge == 2 ? 0 : v->forge == 3 ? (CM_COLL_POINT_GATHER | CM_COLL_POINT_Q8) : CM_COLL_POINT_GATHER;
        memcpy(pl + 20, &off, 4); /* little-endian host (x86, arm64) */
        uint32_t nn = (uint32_t)m;
        memcpy(pl + 24, &nn, 4);
        for (int j = 0; j < v->M->k; j++)
            if (j != v->rank)
                cm_conn_send_payload(v->M->conns[v->rank][j], CM_MSG_ALLREDUCE, pl, CM_COLL_HDR_BYTES + (size_t)m * 4,
                                     2000, v->err, sizeof v->err);
        cm_sleep_ms(700);
        cm_coll_free(c);
        return NULL;
    }
    for (int op = 0; op < 2 && !v->rc; op++) /* twice: op numbering stays in step */
        v->rc = v->holders ? cm_ep_gather_holders(c, v->rank, v->M->k, v->holders, v->x, v->row_len, v->rows,
                                                  v->n_expert, &v->pk, v->err, sizeof v->err)
                           : cm_coll_allgather(c, v->x, v->part, v->err, sizeof v->err);
    cm_coll_stats_get(c, &v->st);
    cm_coll_free(c);
    return NULL;
}

/* The exchange with replicated experts (ep_gather.c) over a real mesh: 4
 * experts, member 0 holds [0, 2), 1 [2, 3), 2 [3, 4); expert 0 (7 rows) is
 * also held by 1 and 2, expert 3 (1 row) also by 0. Each member fills only
 * its cm_expert_share of each expert; after the exchange every member holds
 * every row, each row was sent once by its owner, and the rows of replicated
 * experts each computed are counted. */
static void test_gather_replicas(void) {
    enum { K = 3, NX = 4, RL = 1000 };
    const int32_t rows[NX + 1] = {0, 7, 7, 12, 13};
    const uint32_t holders[NX] = {0x7u, 0x1u, 0x2u, 0x5u};
    const int64_t n = (int64_t)rows[NX] * RL;
    mesh M;
    mesh_listen(&M, K);
    float *want = malloc((size_t)n * sizeof(float));
    cm_rng rng;
    cm_rng_seed(&rng, 12);
    for (int64_t i = 0; i < n; i++) want[i] = cm_rng_normal(&rng);
    gmember v[K];
    pthread_t th[K];
    const int own[K] = {2, 7, 4}, shared[K] = {2, 2, 4}; /* rows computed; of them, of replicated experts */
    for (int r = 0; r < K; r++) {
        v[r] = (gmember){.M = &M,
                         .rank = r,
                         .x = malloc((size_t)n * sizeof(float)),
                         .holders = holders,
                         .rows = rows,
                         .n_expert = NX,
                         .row_len = RL};
        for (int64_t i = 0; i < n; i++) v[r].x[i] = -1e30f;
        for (int e = 0; e < NX; e++) {
            int lo, hi;
            cm_expert_share(holders[e], r, rows[e + 1] - rows[e], &lo, &hi);
            for (int64_t i = (int64_t)(rows[e] + lo) * RL; i < (int64_t)(rows[e] + hi) * RL; i++) v[r].x[i] = want[i];
        }
        pthread_create(&th[r], NULL, gather_main, &v[r]);
    }
    for (int r = 0; r < K; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < K; r++) {
        CHECKF(v[r].rc == 0, "member %d: %s", r, v[r].err);
        CHECKF(!memcmp(v[r].x, want, (size_t)n * sizeof(float)), "member %d does not hold every row", r);
        CHECKF(v[r].st.gather_data_sent == 2ull * (K - 1) * (uint64_t)own[r] * RL * 4 &&
                   v[r].pk.shared_rows == 2ull * (uint64_t)shared[r],
               "member %d: %llu bytes sent, %llu rows of replicated experts", r,
               (unsigned long long)v[r].st.gather_data_sent, (unsigned long long)v[r].pk.shared_rows);
        free(v[r].x);
        cm_ep_pack_free(&v[r].pk);
        cm_coll_mesh_close(M.conns[r], K);
        cm_listener_close(M.l[r]);
    }
    free(want);
}

static void test_allgather(void) {
    enum { K = 3 };
    const int64_t part[K + 1] = {0, 0, 5000, 5000 + 9001}; /* empty, 2 pieces, 3 pieces */
    const int64_t n = part[K];
    mesh M;
    mesh_listen(&M, K);
    float *want = malloc((size_t)n * sizeof(float));
    cm_rng rng;
    cm_rng_seed(&rng, 11);
    for (int64_t i = 0; i < n; i++) want[i] = cm_rng_normal(&rng);
    gmember v[K];
    pthread_t th[K];
    for (int r = 0; r < K; r++) {
        v[r] = (gmember){.M = &M, .rank = r, .part = part, .x = malloc((size_t)n * sizeof(float))};
        for (int64_t i = 0; i < n; i++) v[r].x[i] = i >= part[r] && i < part[r + 1] ? want[i] : -1e30f;
        pthread_create(&th[r], NULL, gather_main, &v[r]);
    }
    for (int r = 0; r < K; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < K; r++) {
        CHECKF(v[r].rc == 0, "member %d: %s", r, v[r].err);
        CHECKF(!memcmp(v[r].x, want, (size_t)n * sizeof(float)), "member %d does not hold every part", r);
        uint64_t own = (uint64_t)(part[r + 1] - part[r]) * 4;
        CHECKF(v[r].st.gather_ops == 2 && v[r].st.gather_data_sent == 2 * (K - 1) * own,
               "member %d: %llu gathers, %llu bytes sent", r, (unsigned long long)v[r].st.gather_ops,
               (unsigned long long)v[r].st.gather_data_sent);
        free(v[r].x);
        cm_coll_mesh_close(M.conns[r], K);
        cm_listener_close(M.l[r]);
    }
    free(want);
    /* a hostile member (the last, whose part every peer expects first): its
     * forged piece fails the op with CM_EPROTO on every honest member, and no
     * byte of it lands */
    for (int forge = 1; forge <= 3; forge++) {
        mesh_listen(&M, K);
        for (int r = 0; r < K; r++) {
            v[r] = (gmember){.M = &M,
                             .rank = r,
                             .part = part,
                             .forge = r == K - 1 ? forge : 0,
                             .x = calloc((size_t)n, sizeof(float))};
            pthread_create(&th[r], NULL, gather_main, &v[r]);
        }
        for (int r = 0; r < K; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < K - 1; r++) {
            CHECKF(v[r].rc == CM_EPROTO, "forged piece %d: member %d got %d (%s)", forge, r, v[r].rc, v[r].err);
            bool clean = true;
            for (int64_t i = part[K - 1]; i < n; i++) clean = clean && v[r].x[i] == 0.0f;
            CHECKF(clean, "forged piece %d: member %d took bytes of it", forge, r);
        }
        for (int r = 0; r < K; r++) {
            free(v[r].x);
            cm_coll_mesh_close(M.conns[r], K);
            cm_listener_close(M.l[r]);
        }
    }
    /* parts out of order: refused before a byte is sent */
    cm_coll_cfg cc = {.rank = 0, .size = 1, .max_n = 16};
    cm_coll *c;
    CHECK(cm_coll_new(&cc, &c, errbuf, sizeof errbuf) == 0);
    const int64_t bad[2] = {3, 1};
    float x[4];
    CHECK(cm_coll_allgather(c, x, bad, errbuf, sizeof errbuf) == CM_ERANGE);
    cm_coll_free(c);
}

static void test_gather_piece_header(void) {
    uint8_t p[CM_COLL_HDR_BYTES + 8] = {0};
    p[18] = CM_COLL_POINT_GATHER;
    p[24] = 2; /* n = 2 */
    cm_coll_piece pc;
    CHECK(cm_coll_piece_parse(p, sizeof p, &pc, errbuf, sizeof errbuf) == 0 && pc.point == CM_COLL_POINT_GATHER);
    p[18] = CM_COLL_POINT_GATHER | CM_COLL_POINT_Q8;
    CHECK(cm_coll_piece_parse(p, sizeof p, &pc, errbuf, sizeof errbuf) == CM_EFORMAT);
    p[18] = 3;
    CHECK(cm_coll_piece_parse(p, sizeof p, &pc, errbuf, sizeof errbuf) == CM_EFORMAT);
}

int main(void) {
    if (cm_gguf_open(&g_vocab, t_shared("vocab/ggml-vocab-llama-spm.gguf"), NULL, NULL, errbuf, sizeof errbuf)) {
        fprintf(stderr, "%s\n", errbuf);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_ep_forward_bits);
    RUN(test_ep_replicas);
    RUN(test_allgather);
    RUN(test_gather_replicas);
    RUN(test_gather_piece_header);
    cm_gguf_close(&g_vocab);
    TEST_END();
}
