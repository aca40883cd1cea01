/*
 * test_cluster.c: pipeline parallel in one process over real TCP on
 * 127.0.0.1 — three cm_node_run daemons on threads, and engines that use
 * them through the unchanged engine.h calls. A DEEP model (24 layers, far
 * more than nodes: stories260K's blocks repeated, written with the GGUF
 * writer) must give the same greedy ids on 2, 3 and 4 stages, planned or
 * split unevenly, as on one machine; so must several sessions at once.
 */
#include "test.h"

#include "cluster/cluster.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "net/net.h"
#include "os/os.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEEP_LAYERS 24
#define N_NODES 3
#define N_GEN 40

static char g_dir[256], g_model[300], g_key[300];
static atomic_int g_stop;
static uint16_t g_port[N_NODES];

/* stories260K with its 5 blocks repeated to DEEP_LAYERS. */
static int write_deep(void) {
    cm_gguf src;
    char err[300];
    if (cm_gguf_open(&src, t_shared("models/stories260K-q8_0.gguf"), NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    cm_gguf_writer *w = cm_gguf_writer_new(src.alignment);
    for (uint64_t i = 0; i < src.n_kv; i++) {
        const cm_gguf_kv *kv = &src.kv[i];
        if (!strcmp(kv->key, "llama.block_count")) cm_gguf_w_u32(w, kv->key, DEEP_LAYERS);
        else if (!strcmp(kv->key, "general.name")) cm_gguf_w_str(w, kv->key, "stories260K-deep24");
        else if (strcmp(kv->key, "general.alignment")) cm_gguf_w_copy_kv(w, kv);
    }
    for (uint64_t i = 0; i < src.n_tensors; i++) {
        const cm_gguf_tensor_info *t = &src.tensors[i];
        if (strncmp(t->name, "blk.", 4)) cm_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    for (int l = 0; l < DEEP_LAYERS; l++)
        for (uint64_t i = 0; i < src.n_tensors; i++) {
            const cm_gguf_tensor_info *t = &src.tensors[i];
            int sl;
            char rest[128], name[160];
            if (sscanf(t->name, "blk.%d.%127s", &sl, rest) != 2 || sl != l % 5) continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, rest);
            cm_gguf_w_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
        }
    int rc = cm_gguf_writer_write(w, g_model, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    cm_gguf_writer_free(w);
    cm_gguf_close(&src);
    return rc;
}

typedef struct node_job {
    int i;
    pthread_t th;
    char port_file[300];
    int rc;
} node_job;

static void *node_main(void *arg) {
    node_job *j = arg;
    cm_node_opts o = {.port = 0,
                      .port_file = j->port_file,
                      .models_dir = g_dir,
                      .cache_dir = g_dir,
                      .n_threads = 1,
                      .key_file = g_key};
    char name[16], err[300];
    snprintf(name, sizeof name, "t%d", j->i);
    o.name = name;
    j->rc = cm_node_run(&o, &g_stop, err, sizeof err);
    if (j->rc) fprintf(stderr, "node %d: %s\n", j->i, err);
    return NULL;
}

/* Greedy ids of one prompt through an engine (nodes NULL: one machine). */
static int g_stages; /* stages of the last engine (1: one machine) */

/* A layer split "3,13,1" into a plan request (NULL: none). */
static cm_plan_request split_of(const char *layers) {
    cm_plan_request q = {0};
    for (const char *s = layers; s && *s && q.n_split < CM_PLAN_MAX_NODES;) {
        char *e;
        q.split[q.n_split++] = (int)strtol(s, &e, 10);
        s = *e ? e + 1 : e;
    }
    return q;
}

static int generate(const char *nodes, const char *layers, int n_streams, int32_t out[][N_GEN], int *n_out) {
    cm_engine_opts o = {.n_threads = 1, .n_ctx = 256, .nodes = nodes, .key_file = g_key, .plan = split_of(layers)};
    cm_engine *e;
    char err[512];
    if (cm_engine_load(&e, g_model, &o, err, sizeof err)) {
        fprintf(stderr, "load: %s\n", err);
        return -1;
    }
    cm_engine_info info;
    cm_engine_get_info(e, &info);
    g_stages = info.n_stages;
    int32_t ids[64];
    int np = cm_engine_tokenize(e, "Once upon a time", 16, true, false, ids, 64, err, sizeof err);
    cm_session *s[4] = {0};
    int rc = 0;
    for (int k = 0; k < n_streams && !rc; k++) {
        s[k] = cm_session_new(e, 0, err, sizeof err);
        if (!s[k] || cm_session_set_prompt(s[k], ids, np, err, sizeof err)) rc = -1;
    }
    /* Interleave: each session generates a few tokens in turn, so several
     * sequences are in the pipeline's caches at once. */
    cm_gen_params gp;
    cm_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.ignore_eos = true;
    gp.n_predict = N_GEN / 4;
    for (int round = 0; round < 4 && !rc; round++)
        for (int k = 0; k < n_streams && !rc; k++) {
            cm_gen_result res;
            if (cm_session_generate(s[k], &gp, NULL, NULL, &res, err, sizeof err)) rc = -1;
        }
    for (int k = 0; k < n_streams; k++) {
        if (!rc) {
            int n;
            const int32_t *all = cm_session_tokens(s[k], &n);
            *n_out = n - np;
            memcpy(out[k], all + np, (size_t)(n - np) * sizeof(int32_t));
        }
        cm_session_free(s[k]);
    }
    if (rc) fprintf(stderr, "generate: %s\n", err);
    cm_engine_free(e);
    return rc;
}

static int32_t g_local[4][N_GEN];
static int g_n_local;

static void check_cluster(const char *nodes, const char *layers, int n_streams, int stages) {
    int32_t got[4][N_GEN];
    int n = 0;
    int rc = generate(nodes, layers, n_streams, got, &n);
    CHECKF(rc == 0, "cluster %s (%s) failed", nodes, layers ? layers : "planned");
    if (rc) return;
    CHECK(n == g_n_local);
    CHECKF(g_stages == stages, "%d stages, expected %d", g_stages, stages);
    for (int k = 0; k < n_streams; k++)
        CHECKF(n == g_n_local && !memcmp(got[k], g_local[0], (size_t)n * sizeof(int32_t)),
               "stream %d on %s (%s) differs from one machine", k, nodes, layers ? layers : "planned");
}

static char g_addr[N_NODES][32];

static void test_deep_pipeline(void) {
    char two[80], three[120];
    snprintf(two, sizeof two, "%s,%s", g_addr[0], g_addr[1]);
    snprintf(three, sizeof three, "%s,%s,%s", g_addr[0], g_addr[1], g_addr[2]);
    check_cluster(g_addr[2], NULL, 1, 2);
    check_cluster(two, NULL, 1, 3);
    check_cluster(three, NULL, 1, 4);
    check_cluster(three, "3,13,1,7", 1, 4); /* uneven */
    check_cluster(two, "1,22,1", 3, 3);     /* three sequences in flight */
}

static void test_refusals(void) {
    cm_engine_opts o = {.n_threads = 1, .n_ctx = 64, .key_file = g_key, .plan = split_of("20,20")};
    o.nodes = g_addr[0];
    cm_engine *e = NULL;
    char err[512];
    CHECK(cm_engine_load(&e, g_model, &o, err, sizeof err) == CM_EINVAL && strstr(err, "adds up to 40"));
    o.plan = split_of(NULL);
    o.nodes = "127.0.0.1:1";
    CHECK(cm_engine_load(&e, g_model, &o, err, sizeof err) != 0 && strstr(err, "127.0.0.1:1"));
    o.nodes = g_addr[0];
    o.insecure = true;
    CHECKF(cm_engine_load(&e, g_model, &o, err, sizeof err) == CM_EAUTH, "insecure vs keyed: %s", err);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(g_dir, sizeof g_dir, "/tmp/cm_test_cluster_%d", (int)getpid());
    mkdir(g_dir, 0700);
    snprintf(g_model, sizeof g_model, "%s/deep24.gguf", g_dir);
    snprintf(g_key, sizeof g_key, "%s/key", g_dir);
    /* tests/sh/cluster_netns.sh borrows the deep model: write it and stop. */
    const char *only = getenv("CM_TEST_WRITE_DEEP");
    if (only && *only) {
        snprintf(g_model, sizeof g_model, "%s", only);
        int rc = write_deep();
        rmdir(g_dir);
        return rc ? 1 : 0;
    }
    uint8_t key[32];
    char err[300];
    cm_net_key_generate(key);
    if (cm_net_key_save(g_key, key, err, sizeof err) || write_deep()) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    node_job jobs[N_NODES];
    for (int i = 0; i < N_NODES; i++) {
        jobs[i] = (node_job){.i = i};
        snprintf(jobs[i].port_file, sizeof jobs[i].port_file, "%s/port%d", g_dir, i);
        pthread_create(&jobs[i].th, NULL, node_main, &jobs[i]);
    }
    for (int i = 0; i < N_NODES; i++) {
        for (int t = 0; t < 200 && !g_port[i]; t++) {
            char *txt = NULL;
            size_t n;
            if (!cm_file_read_all(jobs[i].port_file, &txt, &n, err, sizeof err)) g_port[i] = (uint16_t)atoi(txt);
            cm_free(txt);
            if (!g_port[i]) cm_sleep_ms(20);
        }
        snprintf(g_addr[i], sizeof g_addr[i], "127.0.0.1:%u", g_port[i]);
    }
    if (generate(NULL, NULL, 1, g_local, &g_n_local) || g_n_local != N_GEN) {
        fprintf(stderr, "single machine failed\n");
        return 1;
    }
    RUN(test_deep_pipeline);
    RUN(test_refusals);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < N_NODES; i++) pthread_join(jobs[i].th, NULL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd)) { /* best effort */
    }
    TEST_END();
}
