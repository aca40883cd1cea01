/*
 * pool.c: the persistent compute thread pool and its barrier.
 *
 * Workers spin briefly on an atomic generation counter (microsecond hand-off
 * between the ops of one forward pass), then yield, then sleep on a condition
 * variable when idle, so an idle server burns no CPU. The barrier is a
 * sense-reversing counter with the same spin-then-yield policy.
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
};

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
    if (!p->threads) {
        free(p);
        return NULL;
    }
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
    free(p);
}

int cm_pool_size(const cm_pool *p) { return p ? p->n : 1; }

void cm_thread_yield(void) { sched_yield(); }

void cm_pool_run(cm_pool *p, cm_pool_fn fn, void *ctx) {
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
