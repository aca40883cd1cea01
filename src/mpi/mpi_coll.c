/*
 * mpi_coll.c: the opt-in MPI_Iallreduce tensor-parallel sum (see
 * mpi_coll.h). A compute thread copies its partial into the group's buffer
 * and posts it; the bridge thread runs MPI_Iallreduce(MPI_IN_PLACE, SUM) on
 * it and tests it until done; the compute thread copies the sum back. The
 * buffer is the bridge's while an op runs, so a caller that gives up at its
 * deadline leaves nothing MPI could still write into.
 */
#include "mpi/mpi_coll.h"

#include "base/base.h"
#include "os/os.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { S_IDLE, S_POSTED, S_RUNNING, S_DONE, S_FAILED };

struct cm_mpi_coll {
    MPI_Comm comm;
    int size, wake_fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    bool broken, open, told;
    uint64_t epoch; /* the plan epoch it serves (0: not yet bound) */
    float *buf;
    int64_t cap, n;
    MPI_Request rq;
    char why[MPI_MAX_ERROR_STRING + 1]; /* MPI's error text of a failed op */
    cm_coll_native nat;
};

static int g_open(void *ctx, int rank, int size, int64_t max_n, uint64_t epoch, void **grp) {
    cm_mpi_coll *c = ctx;
    (void)rank;
    int rc = -1;
    pthread_mutex_lock(&c->mu);
    if (!c->broken && !c->open && size == c->size && max_n > 0 && max_n <= INT32_MAX &&
        (!c->epoch || c->epoch == epoch)) {
        c->epoch = epoch;
        if (max_n > c->cap) {
            float *b = realloc(c->buf, (size_t)max_n * sizeof *b);
            if (b) {
                c->buf = b;
                c->cap = max_n;
            }
        }
        if (c->cap >= max_n) {
            c->open = true;
            *grp = c;
            rc = 0;
            if (!c->told)
                CM_LOGI("mpi: tensor-parallel sums by MPI_Iallreduce over the job's %d ranks (--mpi-allreduce: the "
                        "library's order, not bit-identical to one machine)",
                        size);
            c->told = true;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void g_close(void *grp) {
    cm_mpi_coll *c = grp;
    pthread_mutex_lock(&c->mu);
    c->open = false;
    pthread_mutex_unlock(&c->mu);
}

static int g_allreduce(void *grp, float *x, int64_t n, int timeout_ms, char *err, size_t errlen) {
    cm_mpi_coll *c = grp;
    pthread_mutex_lock(&c->mu);
    if (c->broken || c->state != S_IDLE || n > c->cap) {
        pthread_mutex_unlock(&c->mu);
        return cm_errf(err, errlen, CM_ESTATE, "MPI_Iallreduce: %s",
                       c->broken ? "an earlier sum never finished" : "busy or too long");
    }
    memcpy(c->buf, x, (size_t)n * sizeof *x);
    c->n = n;
    c->state = S_POSTED;
    pthread_mutex_unlock(&c->mu);
    if (write(c->wake_fd, "c", 1) < 0) { /* the bridge polls anyway */
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    int w = 0;
    while (c->state != S_DONE && c->state != S_FAILED && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&c->cv, &c->mu, &until);
    int rc = 0;
    if (c->state == S_DONE) {
        memcpy(x, c->buf, (size_t)n * sizeof *x);
        c->state = S_IDLE;
    } else if (c->state == S_FAILED) {
        c->broken = true;
        rc = cm_errf(err, errlen, CM_EIO, "MPI_Iallreduce failed: %s", c->why);
    } else { /* still posted or running: MPI keeps the buffer, we never use it again */
        c->broken = true;
        rc = cm_errf(err, errlen, CM_ETIMEDOUT,
                     "MPI_Iallreduce of %lld floats did not finish within %d ms (a rank lost?)", (long long)n,
                     timeout_ms);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void failed(cm_mpi_coll *c, int mrc) {
    int l = 0;
    char s[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(mrc, s, &l) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", mrc);
    snprintf(c->why, sizeof c->why, "%s", s);
    c->state = S_FAILED;
    pthread_cond_signal(&c->cv);
}

bool cm_mpi_coll_progress(cm_mpi_coll *c) {
    pthread_mutex_lock(&c->mu);
    if (c->state == S_POSTED) {
        int mrc = MPI_Iallreduce(MPI_IN_PLACE, c->buf, (int)c->n, MPI_FLOAT, MPI_SUM, c->comm, &c->rq);
        if (mrc != MPI_SUCCESS) failed(c, mrc);
        else c->state = S_RUNNING;
    }
    if (c->state == S_RUNNING) {
        int done = 0;
        int mrc = MPI_Test(&c->rq, &done, MPI_STATUS_IGNORE);
        if (mrc != MPI_SUCCESS) failed(c, mrc);
        else if (done) {
            c->state = S_DONE;
            pthread_cond_signal(&c->cv);
        }
    }
    bool active = c->state == S_POSTED || c->state == S_RUNNING;
    pthread_mutex_unlock(&c->mu);
    return active;
}

int cm_mpi_coll_new(MPI_Comm comm, int wake_fd, cm_mpi_coll **out, char *err, size_t errlen) {
    *out = NULL;
    cm_mpi_coll *c = cm_calloc(1, sizeof *c);
    if (!c) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (MPI_Comm_dup(comm, &c->comm) != MPI_SUCCESS) { /* (the dup keeps MPI_ERRORS_RETURN) */
        cm_free(c);
        return cm_errf(err, errlen, CM_EIO, "mpi: MPI_Comm_dup for the all-reduce failed");
    }
    MPI_Comm_size(c->comm, &c->size);
    c->wake_fd = wake_fd;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->nat = (cm_coll_native){.open = g_open, .allreduce = g_allreduce, .close = g_close, .ctx = c};
    *out = c;
    return 0;
}

const cm_coll_native *cm_mpi_coll_native(cm_mpi_coll *c) { return &c->nat; }

bool cm_mpi_coll_broken(cm_mpi_coll *c) {
    pthread_mutex_lock(&c->mu);
    bool b = c->broken || c->state == S_POSTED || c->state == S_RUNNING;
    pthread_mutex_unlock(&c->mu);
    return b;
}

void cm_mpi_coll_free(cm_mpi_coll *c, bool free_comm) {
    if (!c) return;
    if (free_comm) MPI_Comm_free(&c->comm);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    if (!c->broken) free(c->buf); /* (a broken op's buffer may still be MPI's) */
    cm_free(c);
}
