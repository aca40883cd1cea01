/*
 * queue_impl.h: what the scheduler's files share: the slots and the queue
 * (queue.c: admission by KV memory, prefix sharing, the step loop) and the
 * short-request paths (queue_short.c: a short prompt's pass of its own
 * between steps, interjection inside a step, short prompts alone in a mixed
 * pass). Private to those two files; the rest of the http module sees
 * http_impl.h's cm_queue_* only. Every function here runs on the scheduler
 * thread (an interjection runs there too, inside the engine's pass).
 */
#ifndef CM_HTTP_QUEUE_IMPL_H
#define CM_HTTP_QUEUE_IMPL_H

#include "http_impl.h"

typedef struct slot {
    cm_session *s;
    job *j;         /* NULL when free */
    bool started;   /* generating (its prompt fully evaluated) */
    bool begun;     /* prompt set (cm_session_prompt_begin), chunks pending */
    uint64_t order; /* admission order: prefill goes first come, first served */
    uint64_t resv;  /* KV bytes promised to its job (0 when free) */
    uint64_t used;  /* when its job last ended or started: idle caches go back oldest first */
    int shared;     /* prompt tokens taken from another slot at admission (reported at prompt begin) */
} slot;

struct cm_queue {
    cm_http_server *srv;
    cm_engine *e;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool th_started;
    bool stop;
    job *head, *tail;
    int n_queued, queue_max;
    slot *slots;
    int n_slots;
    int n_active;
    unsigned step_delay_ms; /* test hook: CUMULO_TEST_STEP_DELAY_MS slows every step */
    int chunk;              /* prompt tokens evaluated between two decode steps (CUMULO_PREFILL_CHUNK) */
    bool mixed;             /* a prompt chunk rides in the decode pass (CUMULO_MIXED_PASS) */
    bool long_skipped;      /* the last mixed pass left a longer prompt out for short ones (queue_main) */
    int pass_rows_fast;     /* cm_engine_info's: mixed passes stay within it when they can */
    int ij_max;             /* interjections: most prompt tokens of a short request (0: none; interject) */
    bool trace;             /* CUMULO_SERVE_TRACE: a stderr line per pass, admission, interjection */
    double pass_t0;         /* when the pass in flight began (the trace's interjection lines) */
    uint64_t n_admitted;
    cm_http_kv_stats kv; /* the budget and its gauges, refreshed under mu by the scheduler */
    uint64_t kv_mem;     /* --kv-mem, 0: the default budget (kv_budget) */
    uint64_t kv_avail;   /* 3/4 of the memory available at start (the weights loaded) */
};

/* ---- queue.c ---- */
/* CUMULO_SERVE_TRACE: one line, "serve-trace <seconds> <what>", on stderr
 * (bench/serve_probe.sh's TRACE=1 keeps them): where a time to first token
 * went, pass by pass. */
void cm_queue_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Move queued jobs into free slots while their KV memory fits (s->mu held);
 * max_ids > 0: an interjection's admission (cm_queue_short_queued). */
void cm_queue_admit(cm_queue *s, int max_ids);
/* Set a newly admitted slot's prompt (prefix reuse); 0 or an error code. */
int cm_queue_slot_begin(cm_queue *s, slot *sl, char *err, size_t errlen);
/* End a slot's job whose prompt failed or was canceled; frees the slot (s->mu not held). */
void cm_queue_slot_fail(cm_queue *s, slot *sl, int rc, const char *err);
/* A slot's prompt is evaluated: its job starts generating (0, or an error). */
int cm_queue_prompt_done(slot *sl, char *perr, size_t n);

/* ---- queue_short.c ---- */
/* Interjections on (CUMULO_INTERJECT): a short prompt has at most
 * max(16, pass_rows_fast) tokens (s->ij_max; 0 when off or the engine
 * takes none). cm_queue_short_stop turns them off (no pass in flight). */
void cm_queue_short_init(cm_queue *s, int pass_rows_fast);
void cm_queue_short_stop(cm_queue *s);
/* The job admission takes next (s->mu held): the head, or for max_ids > 0
 * the first short one that may pass longer ones; *prev: the job before it. */
job *cm_queue_short_queued(const cm_queue *s, int max_ids, job **prev);
/* Between two steps while streams decode: the newcomers' short prompts in a
 * pass of their own, first tokens streamed; returns the prompts started. */
int cm_queue_short_first(cm_queue *s, cm_session **ss, cm_session **pre, int *pre_slot, int *pre_done);
/* A mixed pass while streams decode: how many of its np prompts (pre_slot,
 * in turn order) it carries (np, or only the short ones that finish whole
 * within budget, one pass at a time). */
int cm_queue_short_pass(cm_queue *s, const int *pre_slot, int np, int budget);

#endif
