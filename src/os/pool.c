/*
 * pool.c: the persistent compute thread pool and its barrier.
 *
 * Workers spin briefly on an atomic generation counter (microsecond hand-off
 * between the ops of one forward pass), then yield, then sleep on a condition
 * variable when idle, so an idle server burns no CPU. The barrier is a
 * sense-reversing counter with the same spin-then-yield policy.
 * Shared loops (cm_pool_loop_next) balance a run's work between threads
 * that do not read memory equally fast: one cursor per (loop, owner), each
 * on its own cache line, zeroed after the run by the caller.
 * Must never allocate or create threads in cm_pool_run.
 */
#include "os.h"

#include "../base/base.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SPIN_ITERS 2000
#define YIELD_ITERS 20000
#define LINE 64

/* The shared loop a thread opens next in the current run (cm_pool_loop_begin):
 * every thread of a run opens the same loops in the same order. */
static _Thread_local int tl_loop;

struct cm_pool {
    int n;
    pthread_t *threads;
    _Atomic uint64_t generation; /* bumped for each run */
    _Atomic int remaining;       /* workers still running the current job */
    _Atomic int stop;
    cm_pool_fn fn;
    void *ctx;
    /* barrier */
    _Atomic int bar_count;
    _Atomic int bar_sense;
    /* idle sleeping */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int sleepers;
    /* shared loops: CM_POOL_LOOPS x n cursors, LINE bytes apart */
    unsigned char *cur;
};

static _Atomic int64_t *cursor(cm_pool *p, int loop, int owner) {
    return (_Atomic int64_t *)(void *)(p->cur + ((size_t)loop * (size_t)p->n + (size_t)owner) * LINE);
}

typedef struct {
    cm_pool *p;
    int ith;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    cm_pool *p = wa.p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (atomic_load(&p->stop)) return NULL;
            if (spins < SPIN_ITERS) {
                cpu_relax();
                spins++;
            } else if (spins < YIELD_ITERS) {
                sched_yield();
                spins++;
            } else {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
            }
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        tl_loop = 0;
        p->fn(p->ctx, wa.ith, p->n);
        atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel);
    }
}

cm_pool *cm_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    cm_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->cur = aligned_alloc(LINE, (size_t)CM_POOL_LOOPS * (size_t)n_threads * LINE);
    if (!p->threads || !p->cur) {
        free(p->threads);
        free(p->cur);
        free(p);
        return NULL;
    }
    for (int l = 0; l < CM_POOL_LOOPS; l++)
        for (int o = 0; o < n_threads; o++) atomic_init(cursor(p, l, o), 0);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        CM_ASSERT(wa);
        wa->p = p;
        wa->ith = i;
        if (cm_thread_create(&p->threads[i], worker_main, wa) != 0) {
            free(wa);
            p->n = i; /* run with the threads we got */
            break;
        }
    }
    return p;
}

int cm_thread_create(pthread_t *th, void *(*fn)(void *), void *arg) {
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc) return rc;
    pthread_attr_setstacksize(&attr, CM_COMPUTE_STACK);
    rc = pthread_create(th, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

void cm_pool_free(cm_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->cur);
    free(p);
}

int cm_pool_size(const cm_pool *p) { return p ? p->n : 1; }

void cm_thread_yield(void) { sched_yield(); }

void cm_pool_run(cm_pool *p, cm_pool_fn fn, void *ctx) {
    tl_loop = 0;
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->remaining, p->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->remaining, memory_order_acquire) > 0) {
        if (spins++ < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
    /* every thread is done with the run's loops: ready them for the next */
    for (int l = 0; l < CM_MIN(tl_loop, CM_POOL_LOOPS); l++)
        for (int o = 0; o < p->n; o++) atomic_store_explicit(cursor(p, l, o), 0, memory_order_relaxed);
}

void cm_pool_barrier(cm_pool *p) {
    if (!p || p->n == 1) return;
    int sense = atomic_load_explicit(&p->bar_sense, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == p->n - 1) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&p->bar_sense, !sense, memory_order_release);
        return;
    }
    int spins = 0;
    while (atomic_load_explicit(&p->bar_sense, memory_order_acquire) == sense) {
        if (spins++ < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
}

void cm_pool_loop_begin(cm_pool_loop *l, cm_pool *p, int64_t n_units, int ith, int nth) {
    l->p = p;
    l->loop = tl_loop < CM_POOL_LOOPS ? tl_loop++ : CM_POOL_LOOPS; /* no overflow outside runs */
    l->ith = ith;
    l->nth = nth;
    l->n = n_units;
    l->k = 0;
    /* alone, or past the run's loops: this thread's cm_split_range part, in one piece */
    l->shared = p && nth > 1 && nth == p->n && l->loop < CM_POOL_LOOPS;
}

bool cm_pool_loop_next(cm_pool_loop *l, int64_t *begin, int64_t *end) {
    if (!l->shared) {
        if (l->k++) return false;
        cm_split_range(l->n, l->ith, l->nth, begin, end);
        return *begin < *end;
    }
    /* Owner o's units are its cm_split_range part. The owner takes 3/4 of
     * its part in one piece, then half of what is left each time (each
     * piece is one kernel call, and kernels pack the token per call); the
     * others, done with their own, take one unit at a time. */
    for (; l->k < l->nth; l->k++) {
        const int o = (l->ith + l->k) % l->nth;
        int64_t o0, o1;
        cm_split_range(l->n, o, l->nth, &o0, &o1);
        const int64_t cnt = o1 - o0;
        _Atomic int64_t *c = cursor(l->p, l->loop, o);
        int64_t want = 1;
        if (l->k == 0) {
            const int64_t done = atomic_load_explicit(c, memory_order_relaxed);
            want = done == 0 ? CM_MAX(1, cnt * 3 / 4) : CM_MAX(1, (cnt - done) / 2);
        }
        const int64_t got = atomic_fetch_add_explicit(c, want, memory_order_relaxed);
        if (got < cnt) {
            *begin = o0 + got;
            *end = o0 + CM_MIN(cnt, got + want);
            return true;
        }
    }
    return false;
}
