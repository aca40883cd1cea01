/*
 * queue_short.c: a short request's time to first token while streams decode
 * (issue 22: p99 TTFT of a short request beside 8 decoding streams and a
 * 2,000-token prompt within 2x idle). Three paths, one rule: a prompt of at
 * most s->ij_max tokens is evaluated in a pass of its rows alone, so its
 * first token waits for its own prompt, not a long prompt's chunk nor the
 * decode rows:
 *   - interject: it arrived during a pass; admitted between two layers and
 *     evaluated there (engine.h cm_engine_set_interject);
 *   - cm_queue_short_first: it is pending between two steps; a pass of its
 *     own before the step's;
 *   - cm_queue_short_pass: in a mixed pass, the short prompts alone, the
 *     longer one skipped one pass at a time at most (never starved).
 * CUMULO_INTERJECT=0 turns the first two off. Must never block on a client
 * or hold s->mu across a forward pass.
 */
#include "queue_impl.h"

#include <stdio.h>

/* The job admit takes next (s->mu held; *prev: the one before it, NULL at
 * the head): the head; for an interjection (max_ids > 0), the first whose
 * prompt has at most max_ids tokens, past longer ones that arrived before
 * it while the free slots hold them all besides (a short request that
 * arrives just behind a long prompt does not wait for the step's end; the
 * long one still takes its slot there). NULL: none. */
job *cm_queue_short_queued(const cm_queue *s, int max_ids, job **prev) {
    job *j = s->head;
    *prev = NULL;
    for (int ahead = 0; j && max_ids > 0 && j->n_ids > max_ids; j = j->next) {
        if (s->n_active + ++ahead + 1 > s->n_slots) return NULL;
        *prev = j;
    }
    return j;
}

/* Interjection (engine.h cm_engine_set_interject), between two layers of a
 * pass of queue_main's step: jobs that arrived with short prompts (at most
 * ij_max tokens) are admitted, their prompts evaluated whole in a pass of
 * their own and their first tokens streamed now, so a short request's first
 * token waits for one layer of the pass in flight plus its own prompt, not
 * for the rest of that pass and a pass beside the decode rows. Longer
 * prompts and jobs behind them wait for the step's end as before. */
static void interject(void *user) {
    cm_queue *s = user;
    pthread_mutex_lock(&s->mu);
    job *prev;
    const bool any = s->n_active < s->n_slots && cm_queue_short_queued(s, s->ij_max, &prev);
    if (any) cm_queue_admit(s, s->ij_max);
    pthread_mutex_unlock(&s->mu);
    if (!any) return;
    enum { MAXP = 8 };
    cm_session *pre[MAXP];
    int ps[MAXP], np = 0, rows = 0;
    char err[256];
    for (int i = 0; i < s->n_slots && np < MAXP; i++) {
        slot *sl = &s->slots[i];
        if (!sl->j || sl->started || sl->begun || sl->j->n_ids > s->ij_max) continue;
        int rc = cm_queue_slot_begin(s, sl, err, sizeof err);
        if (rc) {
            cm_queue_slot_fail(s, sl, rc, err);
            continue;
        }
        const int left = sl->j->n_ids - cm_session_n_past(sl->s);
        if (left < 1 || rows + left > s->ij_max) continue; /* the step's end takes it */
        pre[np] = sl->s;
        ps[np++] = i;
        rows += left;
    }
    if (!np) return;
    const double t0 = cm_now_s();
    const int k = cm_engine_interject_prompts(s->e, pre, np, err, sizeof err);
    if (s->trace)
        cm_queue_trace("interject prompts=%d rows=%d at pass+%.1fms took %.1fms", np, rows, (t0 - s->pass_t0) * 1e3,
                       (cm_now_s() - t0) * 1e3);
    if (k > 0) {
        pthread_mutex_lock(&s->mu);
        s->kv.interjections += (uint64_t)k;
        pthread_mutex_unlock(&s->mu);
    }
    for (int r = 0; r < np; r++) {
        slot *sl = &s->slots[ps[r]];
        if (k < 0) {
            cm_queue_slot_fail(s, sl, k, err);
            continue;
        }
        if (r >= k) continue;
        char perr[256];
        int rc = cm_queue_prompt_done(sl, perr, sizeof perr);
        if (rc) cm_queue_slot_fail(s, sl, rc, perr);
        else cm_session_first_token(sl->s); /* if it ended the job, queue_main's step end finishes it */
    }
}

/* Between two steps, while streams decode: the newcomers' short prompts
 * (at most ij_max tokens in all, as an interjection takes) are evaluated
 * in a pass of their own rows and their first tokens streamed at once,
 * before the step's pass. A short request that arrives between passes (as
 * a client's next request does when its last one just ended there) then
 * waits for its own prompt only, as one that arrives during a pass does
 * (interject); in the step's pass its rows would wait for the decode rows
 * and pay a larger pass (8 decode + 16 prompt rows measured 2x the time of
 * 16 alone on a 2-core Xeon, CUMULO_SERVE_TRACE). The running streams pay
 * one pass of the newcomers' rows per arrival, as for an interjection.
 * Returns the prompts started (0: none; failures end their jobs).
 * NEEDSWORK: a burst of newcomers goes 2 prompts (32 rows) per such pass,
 * the rest with the step's pass, so the last of a burst waits several
 * steps; closed-loop TTFT p50 rose in 5 of 6 pairs of session 17 (HISTORY):
 * one larger pass for a burst may serve it better (not measured quiet). */
int cm_queue_short_first(cm_queue *s, cm_session **ss, cm_session **pre, int *pre_slot, int *pre_done) {
    enum { MAXP = 8 };
    int np = 0, rows = 0;
    for (int i = 0; i < s->n_slots && np < MAXP; i++) {
        const slot *sl = &s->slots[i];
        if (!sl->j || sl->started || !sl->begun) continue;
        const int left = sl->j->n_ids - cm_session_n_past(sl->s);
        if (left < 1 || rows + left > s->ij_max) continue;
        pre[np] = sl->s;
        pre_slot[np++] = i;
        rows += left;
    }
    if (!np) return 0;
    /* The streams' next tokens first: their logits are ready (the last
     * pass), so none waits for this pass to stream it (nor does a prompt
     * that finished there for its first token); the step's pass then
     * evaluates them (first_taken), the same bits as sampled there. */
    for (int i = 0; i < s->n_slots; i++) {
        const slot *sl = &s->slots[i];
        if (sl->j && sl->started && cm_session_running(sl->s)) cm_session_first_token(sl->s);
    }
    char err[256] = "";
    const double t0 = cm_now_s();
    s->pass_t0 = t0;
    const int rc = cm_engine_step_prefill_many(s->e, ss, 0, pre, np, rows, pre_done, err, sizeof err);
    if (s->trace) cm_queue_trace("short-first prompts=%d rows=%d took %.1fms", np, rows, (cm_now_s() - t0) * 1e3);
    int started = 0;
    for (int k = 0; k < np; k++) {
        slot *sl = &s->slots[pre_slot[k]];
        if (pre_done[k] < 0 || rc < 0) {
            cm_queue_slot_fail(s, sl, pre_done[k] < 0 ? pre_done[k] : rc, err);
            continue;
        }
        if (cm_session_n_past(sl->s) != sl->j->n_ids) continue; /* not whole (cannot happen): the step's pass goes on */
        char perr[256];
        const int r2 = cm_queue_prompt_done(sl, perr, sizeof perr);
        if (r2) {
            cm_queue_slot_fail(s, sl, r2, perr);
            continue;
        }
        cm_session_first_token(sl->s); /* if it ended the job, queue_main's step end finishes it */
        started++;
    }
    pthread_mutex_lock(&s->mu);
    s->kv.short_first += (uint64_t)started;
    pthread_mutex_unlock(&s->mu);
    return started;
}

void cm_queue_short_init(cm_queue *s, int pass_rows_fast) {
    /* a short request: a prompt of up to the rows the batched-decode
     * kernels take at their pace (32 with repacked Q4_0), at least 16 */
    const int ij = CM_MAX(16, pass_rows_fast);
    if (cm_config_get()->interject && cm_engine_set_interject(s->e, interject, s, ij)) s->ij_max = ij;
}

void cm_queue_short_stop(cm_queue *s) {
    if (s->ij_max) cm_engine_set_interject(s->e, NULL, NULL, 0);
}

int cm_queue_short_pass(cm_queue *s, const int *pre_slot, int np, int budget) {
    /* Short first, alone: when the prompts with the fewest tokens left
     * finish whole within the budget, this pass carries only them, not a
     * chunk of a longer prompt besides: a pass of fewer rows is sooner
     * over, so a newcomer's first token waits for its own prompt and the
     * decode rows only (the time to first token under load). The longer
     * prompt is skipped one pass at a time at most (its next pass carries
     * it whatever waits), so a stream of short requests slows it by half at
     * worst, never starves it. */
    int n_pass = np, used = 0, whole = 0;
    while (whole < np) {
        const slot *o = &s->slots[pre_slot[whole]];
        const int l = o->j->n_ids - cm_session_n_past(o->s);
        if (used + l > budget) break;
        used += l;
        whole++;
    }
    if (whole > 0 && whole < np && !s->long_skipped) n_pass = whole;
    s->long_skipped = n_pass < np;
    return n_pass;
}
