/*
 * fixtures.h: small pieces several unit tests (and bench/tp_bench.c) share, so
 * each is written once: a HELLO filled with plausible values, capturing
 * stderr to check what was logged, and an in-process tensor-parallel group
 * whose members are threads summing their partial results under a mutex.
 * Test code only: static functions, included by test files, never by src/.
 */
#ifndef CM_TEST_FIXTURES_H
#define CM_TEST_FIXTURES_H

#include "base/base.h"
#include "os/os.h"
#include "proto/proto.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A HELLO for a test peer: node id all `id`, the given name and roles. */
static inline void fx_hello(cm_msg_hello *h, const char *name, uint8_t id, uint32_t roles) {
    memset(h, 0, sizeof *h);
    h->proto_version = CM_PROTO_VERSION;
    memset(h->node_id, id, sizeof h->node_id);
    snprintf(h->name, sizeof h->name, "%s", name);
    h->roles = roles;
    h->cores = 1;
    snprintf(h->isa, sizeof h->isa, "x");
    h->mem_total = 1ull << 30;
    h->mem_free = 1ull << 29;
    snprintf(h->os, sizeof h->os, "%s", cm_os_name());
    snprintf(h->arch, sizeof h->arch, "%s", cm_arch_name());
    snprintf(h->version, sizeof h->version, "%s", CM_VERSION);
    h->gflops = 1;
}

/* Send stderr to a file while a test runs, then read back what was logged
 * (the caller frees the text; NULL if it could not be read). Not nestable. */
static int fx_saved_fd = -1;
static char fx_log_path[256];
static inline void fx_log_capture_start(const char *tag) {
    snprintf(fx_log_path, sizeof fx_log_path, "/tmp/cumulo-test-%s-%d.log", tag, (int)getpid());
    int fd = open(fx_log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    fflush(stderr);
    fx_saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}
static inline char *fx_log_capture_end(void) {
    fflush(stderr);
    dup2(fx_saved_fd, 2);
    close(fx_saved_fd);
    char *text = NULL;
    size_t n;
    if (cm_file_read_all(fx_log_path, &text, &n, NULL, 0) != 0) text = NULL;
    unlink(fx_log_path);
    return text;
}

/* An in-process all-reduce for tensor-parallel members running as threads:
 * each member publishes its partial sums and waits; the last to arrive sums
 * them in rank order for everyone, so all get identical results. Give
 * cm_forward_args .allreduce = fx_tp_allreduce, .allreduce_user = &a_fx_tp_rank. */
enum { FX_TP_MAX = 4 };
typedef struct fx_tp_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, generation, n_members;
    int calls; /* all-reduces completed */
    float *buf[FX_TP_MAX];
} fx_tp_group;
typedef struct fx_tp_rank {
    fx_tp_group *g;
    int rank;
} fx_tp_rank;

static inline void fx_tp_group_init(fx_tp_group *g, int n_members) {
    memset(g, 0, sizeof *g);
    g->n_members = n_members;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}
static inline void fx_tp_group_destroy(fx_tp_group *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}
static inline int fx_tp_allreduce(void *user, float *x, int64_t n) {
    fx_tp_rank *me = user;
    fx_tp_group *g = me->g;
    pthread_mutex_lock(&g->mu);
    g->buf[me->rank] = x;
    int gen = g->generation;
    if (++g->arrived == g->n_members) {
        for (int64_t i = 0; i < n; i++) {
            float s = g->buf[0][i];
            for (int r = 1; r < g->n_members; r++) s += g->buf[r][i];
            for (int r = 0; r < g->n_members; r++) g->buf[r][i] = s;
        }
        g->arrived = 0;
        g->generation++;
        g->calls++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->generation == gen) pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return 0;
}

#endif
