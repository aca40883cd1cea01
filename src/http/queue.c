/*
 * queue.c: the request queue and the slots. One scheduler thread owns the
 * engine's sessions: it moves queued jobs into free slots, then alternates
 * one batched engine step of every running slot (one token each) with one
 * chunk of a newcomer's prompt (chunked prefill, shortest first), and hands tokens
 * to the jobs as they come. New jobs join between steps; a newcomer may take
 * a shared prompt prefix from another slot's KV cache (share_prefix). A job
 * with a short prompt may also join inside a step: between two layers of
 * the pass in flight, its prompt evaluated in a pass of its own and its
 * first token streamed there (interject), so its time to first token does
 * not wait for a long prompt's chunk and the decode rows.
 *
 * Slot choice: among free slots, the one whose session already holds the
 * longest prefix of the new prompt (a continuing conversation reuses its KV
 * cache; the engine evaluates only the new tail). When another slot holds a
 * longer one, the newcomer takes it at admission: the prefix's KV pages are
 * shared copy-on-write (src/model/kv_blocks.c), evaluated and held once.
 *
 * KV memory (paged: a cache's pages are committed as positions are written,
 * src/model/kv_mem.c) is admitted by bytes: a job takes a slot only when the
 * bytes its cache will hold at most (prompt + max tokens, page rounding
 * included) fit the budget beside what the other slots hold or were
 * promised; idle slots' caches (kept for prefix reuse) are given back, least
 * recently used first, to make room; otherwise the job waits at the queue's
 * head (arrival order kept). Running jobs never grow past their promise, so
 * nothing is over-committed and nothing waits forever. A shared prefix's
 * pages are counted once: each slot counts what is its own
 * (cm_session_kv_private), each store is added once, and a job taking a
 * shared prefix is promised its need less the pages it maps. Pages a slot's
 * ended or shortened sequence leaves are kept as its pool (model.h
 * cm_kv_rewind: the next sequence reuses them without first-touch faults),
 * counted as held and given back before any cached prefix is evicted; "in
 * use" counts only positions held. NEEDSWORK: promising
 * the worst case keeps requests without max_tokens from sharing a small
 * budget; preempting (and later recomputing) a stream would let them.
 *
 * Never blocks on a client: jobs are written into under their own lock and
 * their connections (suspended in the server's event loop) are woken to
 * drain them. A canceled job (client gone) is dropped
 * from the queue or stopped at the next step, freeing its slot.
 */
#include "queue_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cm_queue_trace(const char *fmt, ...) {
    char line[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "serve-trace %.4f %s\n", cm_now_s(), line);
}

/* The budget: --kv-mem, else every slot's whole context, at most kv_avail,
 * at least one slot's. Measured again before each admission on the slot
 * being filled: a cluster's re-plan can give this process a different share
 * of the cache (a tensor-parallel coordinator's KV heads), and a slot's
 * session follows it when it next runs, so slots may differ for a while. */
static void kv_budget(cm_queue *s, int k) {
    s->kv.slot_full = cm_session_kv_bytes(s->slots[k].s, cm_session_n_ctx(s->slots[k].s));
    if (s->kv_mem) {
        s->kv.capacity = s->kv_mem;
        return;
    }
    const uint64_t all = s->kv.slot_full * (uint64_t)s->n_slots;
    s->kv.capacity = all < s->kv_avail ? all : s->kv_avail > s->kv.slot_full ? s->kv_avail : s->kv.slot_full;
}

/* Under s->mu, scheduler thread: the bytes slot i holds (shared prefix
 * pages not included; its pool included) or was promised. */
static uint64_t slot_kv(const cm_queue *s, int i) {
    const uint64_t have = cm_session_kv_private(s->slots[i].s, -1) + cm_session_kv_pooled(s->slots[i].s);
    return s->slots[i].j && s->slots[i].resv > have ? s->slots[i].resv : have;
}

/* The shared prefix stores the slots map, each counted once; *mapped: the
 * bytes the slots map from them (what copies would have cost). */
static uint64_t kv_stores(const cm_queue *s, uint64_t *mapped) {
    uint64_t b = 0, m = 0;
    for (int i = 0; i < s->n_slots; i++) {
        const void *id, *id2;
        const uint64_t sb = cm_session_kv_store(s->slots[i].s, &id);
        m += cm_session_kv_bytes(s->slots[i].s, -1) - cm_session_kv_private(s->slots[i].s, -1);
        bool first = id != NULL;
        for (int k = 0; k < i && first; k++) {
            (void)cm_session_kv_store(s->slots[k].s, &id2);
            first = id2 != id;
        }
        if (first) b += sb;
    }
    if (mapped) *mapped = m;
    return b;
}

static void kv_refresh(cm_queue *s) {
    uint64_t mapped = 0;
    s->kv.shared = kv_stores(s, &mapped);
    s->kv.shared_saved = mapped > s->kv.shared ? mapped - s->kv.shared : 0;
    s->kv.in_use = s->kv.reserved = s->kv.shared;
    s->kv.pooled = 0;
    for (int i = 0; i < s->n_slots; i++) {
        s->kv.in_use += cm_session_kv_private(s->slots[i].s, -1);
        s->kv.pooled += cm_session_kv_pooled(s->slots[i].s);
        s->kv.reserved += slot_kv(s, i);
    }
}

/* Under s->mu: room for need bytes in slot k? The slots' KV pools go back
 * first (pages kept committed for reuse: only page faults to regain them),
 * then idle slots' caches (oldest first; never keep's, the prefix k is to
 * take) until it fits. Slot k's own pages count where they exceed need (its
 * new prompt keeps them, pooled), and go last. 1: fits; 0: wait; -1: never
 * (over the budget). */
static int kv_admit(cm_queue *s, int k, int keep, uint64_t need) {
    kv_budget(s, k);
    if (need > s->kv.capacity) {
        if (s->kv_mem) return -1;
        s->kv.capacity = need; /* the default budget always holds one slot's need */
    }
    bool pools = true;
    for (;;) {
        uint64_t used = kv_stores(s, NULL);
        const uint64_t own = cm_session_kv_private(s->slots[k].s, -1) + cm_session_kv_pooled(s->slots[k].s);
        if (own > need) used += own - need;
        int victim = -1;
        for (int i = 0; i < s->n_slots; i++) {
            if (i == k) continue;
            used += slot_kv(s, i);
            if (!s->slots[i].j && i != keep && cm_session_kv_bytes(s->slots[i].s, -1) &&
                (victim < 0 || s->slots[i].used < s->slots[victim].used))
                victim = i;
        }
        if (used + need <= s->kv.capacity) return 1;
        if (pools) { /* between passes (the scheduler thread): no cache is in one */
            pools = false;
            bool any = false;
            for (int i = 0; i < s->n_slots; i++)
                if (cm_session_kv_pooled(s->slots[i].s)) {
                    cm_session_kv_trim_pool(s->slots[i].s);
                    any = true;
                }
            if (any) {
                s->kv.pool_trims++;
                continue;
            }
        }
        if (victim < 0 && own > need) victim = k; /* its old sequence, past what the job needs (its prefix lost) */
        if (victim < 0) return 0;
        cm_session_kv_drop(s->slots[victim].s);
        s->kv.evictions++;
    }
}

static int on_token(void *user, const cm_token_event *ev) {
    job *j = user;
    int32_t id = ev->id;
    const char *text = ev->text;
    size_t len = ev->len;
    const cm_sample_info *info = ev->info;
    pthread_mutex_lock(&j->mu);
    if (j->harmony) { /* gpt-oss: the final channel only */
        cm_buf_clear(&j->hout);
        cm_harmony_feed(&j->hf, text, len, &j->hout);
        len = j->hout.len;
        text = len ? j->hout.data : "";
    }
    if (id >= 0) {
        j->n_gen++;
        if (j->n_gen == 1 && cm_config_get()->serve_trace)
            cm_queue_trace("first %s ids=%d queued+%.1fms", j->id, j->n_ids, (cm_now_s() - j->t_queued) * 1e3);
        if (j->logprobs >= 0 && info) {
            if (j->n_lps == j->cap_lps) {
                int nc = j->cap_lps ? 2 * j->cap_lps : 64;
                cm_sample_info *a = cm_realloc(j->lps, (size_t)nc * sizeof *a);
                int32_t *b = a ? cm_realloc(j->lp_ids, (size_t)nc * sizeof *b) : NULL;
                if (a) j->lps = a;
                if (b) {
                    j->lp_ids = b;
                    j->cap_lps = nc;
                }
            }
            if (j->n_lps < j->cap_lps) {
                j->lps[j->n_lps] = *info;
                j->lp_ids[j->n_lps++] = id;
            }
        }
    }
    if (j->stream) {
        if (len || j->n_lps > j->lps_sent) cm_api_stream_delta(j, text, len);
    } else {
        cm_buf_append(&j->text, text, len);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    cm_job_wake(j);
    if (id >= 0) cm_metrics_gen_tokens(cm_http_metrics(j->srv), 1);
    return 0;
}

/* The job is over (finished, failed or canceled): tell its connection. */
static void job_end(job *j, enum cm_finish fin, int status, const char *msg) {
    pthread_mutex_lock(&j->mu);
    if (j->harmony) { /* what the final-channel filter held back */
        cm_buf_clear(&j->hout);
        cm_harmony_flush(&j->hf, &j->hout);
        if (j->hout.len && j->stream) cm_api_stream_delta(j, j->hout.data, j->hout.len);
        else if (j->hout.len) cm_buf_append(&j->text, j->hout.data, j->hout.len);
    }
    j->finish = fin;
    j->sess = NULL;
    if (status) {
        j->http_status = status;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", msg ? msg : "generation failed");
    }
    if (j->stream) cm_api_stream_end(j);
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    cm_job_wake(j);
    if (!status && !atomic_load(&j->cancel)) cm_metrics_tokens(cm_http_metrics(j->srv), j->n_ids, j->n_cached);
    cm_job_unref(j);
}

/* What of j's prompt s's KV cache holds (0 when computed with other LoRA scales). */
static int common_prefix(cm_session *s, const job *j) {
    return cm_session_cached_prefix(s, j->ids, j->n_ids, j->lora, j->n_lora);
}

/* Under s->mu: the free slot sharing the longest prefix with j, or -1; among
 * equals the one caching the least, so other cached conversations survive
 * (the KV budget gives back the least recently used when it must). */
static int pick_slot(cm_queue *s, job *j) {
    int best = -1, best_k = -1, best_np = 0;
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slots[i].j) continue;
        int k = common_prefix(s->slots[i].s, j), np = cm_session_n_past(s->slots[i].s);
        if (k > best_k || (k == best_k && np < best_np)) {
            best = i;
            best_k = k;
            best_np = np;
        }
    }
    return best;
}

/* Shared prompt prefixes across requests: the slot (other than k) whose
 * session has evaluated the longest prefix of j's prompt, longer than slot
 * k's own and than PREFIX_MIN, or -1; *n: its length (the last prompt token
 * is always evaluated). Under s->mu, scheduler thread. */
enum { PREFIX_MIN = 16 }; /* shorter shared prefixes are not worth it */
static int share_source(cm_queue *s, int k, const job *j, int *n) {
    const int own = common_prefix(s->slots[k].s, j);
    int best = -1, best_k = own;
    for (int i = 0; i < s->n_slots; i++) {
        if (i == k) continue;
        int c = common_prefix(s->slots[i].s, j);
        if (c > best_k) {
            best = i;
            best_k = c;
        }
    }
    if (best_k > j->n_ids - 1) best_k = j->n_ids - 1;
    *n = best_k;
    return best >= 0 && best_k >= PREFIX_MIN && best_k > own ? best : -1;
}

/* Slot k takes n prompt tokens from slot src: their KV pages shared
 * copy-on-write (cm_session_share_prefix; evaluated once, held once),
 * copied where they cannot be shared. Between forward passes (scheduler
 * thread), so neither cache is in a pass. Returns the tokens gained (0: none,
 * as on a cluster, where each stage holds its own cache). */
static int share_prefix(cm_queue *s, int k, int src, int n) {
    const int own = common_prefix(s->slots[k].s, s->slots[k].j);
    char e2[160];
    if (cm_session_share_prefix(s->slots[k].s, s->slots[src].s, n, e2, sizeof e2)) return 0;
    return n - own;
}

/* A slot's prompt failed or its job was canceled before generating: end
 * the job and free the slot (s->mu not held). */
void cm_queue_slot_fail(cm_queue *s, slot *sl, int rc, const char *err) {
    /* The prompt was checked against the context already, so this is cancel
     * or a server fault; CM_EAGAIN: the cluster lost nodes it cannot do without. */
    job_end(sl->j, CM_FINISH_CANCEL, rc == CM_ECANCELED ? 0 : rc == CM_EAGAIN ? 503 : 500, err);
    pthread_mutex_lock(&s->mu);
    cm_session_kv_forget(sl->s); /* a canceled prompt's pages: the slot's pool (kv_admit gives it back) */
    sl->j = NULL;
    sl->begun = false;
    s->n_active--;
    pthread_mutex_unlock(&s->mu);
}

/* A slot's prompt is evaluated: its job starts generating (0, or an error). */
int cm_queue_prompt_done(slot *sl, char *perr, size_t n) {
    job *j = sl->j;
    cm_timings t = cm_session_timings(sl->s);
    j->n_cached = j->n_ids - t.n_prompt;   /* prefix reused from the slot's KV cache */
    j->gp.skip_logprobs = j->logprobs < 0; /* on_token reads info only for logprobs */
    int rc = cm_session_start(sl->s, &j->gp, on_token, j, perr, n);
    sl->started = rc == 0;
    return rc;
}

/* Move queued jobs into free slots, in arrival order, while their KV
 * memory fits (s->mu held). max_ids > 0 (an interjection, between two
 * layers of a pass): only jobs whose prompts have at most max_ids tokens
 * (short_queued), and no prefix is shared (the slots it could come from
 * are in the paused pass). */
void cm_queue_admit(cm_queue *s, int max_ids) {
    char err[256];
    s->kv.waiting = 0;
    while (s->head && s->n_active < s->n_slots) {
        job *prev = NULL, *j = cm_queue_short_queued(s, max_ids, &prev);
        if (!j) break;
        int k = atomic_load(&j->cancel) ? -1 : pick_slot(s, j);
        const int n_ctx = cm_session_n_ctx(s->slots[k < 0 ? 0 : k].s);
        const int most = j->gp.n_predict > 0 && j->n_ids + j->gp.n_predict < n_ctx ? j->n_ids + j->gp.n_predict : n_ctx;
        const uint64_t need = k < 0 ? 0 : cm_session_kv_bytes(s->slots[k].s, most);
        int n_sh = 0, src = k < 0 || max_ids > 0 ? -1 : share_source(s, k, j, &n_sh);
        const uint64_t sh = src < 0 ? 0 : cm_session_kv_shareable(s->slots[k].s, n_sh); /* mapped, not held */
        const int fit = k < 0 ? 1 : kv_admit(s, k, src, need - sh);
        if (fit == 0) {
            s->kv.waiting = 1;
            break;
        } /* until running jobs end */
        if (prev) prev->next = j->next;
        else s->head = j->next;
        if (s->tail == j) s->tail = prev;
        s->n_queued--;
        if (k < 0) {
            job_end(j, CM_FINISH_CANCEL, 0, NULL);
            continue;
        }
        if (fit < 0) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "the request needs %.1f MiB of KV cache (%d positions); the server's budget "
                     "(--kv-mem) is %.1f MiB",
                     (double)need / 1048576.0, most, (double)s->kv.capacity / 1048576.0);
            job_end(j, CM_FINISH_CANCEL, 400, msg);
            continue;
        }
        s->slots[k].used = s->n_admitted;
        s->slots[k].j = j;
        if (j->n_lora) /* its adapters' scales (a cache made with others is forgotten); checked when parsed */
            cm_session_set_lora(s->slots[k].s, j->lora, j->n_lora, err, sizeof err);
        s->slots[k].shared = src < 0 ? 0 : share_prefix(s, k, src, n_sh);
        /* the promise: its need less the pages it maps (all of it if the share did not happen) */
        s->slots[k].resv = need - (cm_session_kv_bytes(s->slots[k].s, -1) - cm_session_kv_private(s->slots[k].s, -1));
        s->slots[k].started = false;
        s->slots[k].begun = false;
        s->slots[k].order = s->n_admitted++;
        s->n_active++;
        if (s->trace)
            cm_queue_trace("admit %s ids=%d slot=%d queued+%.1fms%s", j->id, j->n_ids, k,
                           (cm_now_s() - j->t_queued) * 1e3, max_ids > 0 ? " (interjection)" : "");
        pthread_mutex_lock(&j->mu);
        j->state = JOB_RUNNING;
        j->sess = s->slots[k].s;
        pthread_mutex_unlock(&j->mu);
    }
}

/* Set a newly admitted slot's prompt (prefix reuse); 0 or an error code. */
int cm_queue_slot_begin(cm_queue *s, slot *sl, char *err, size_t errlen) {
    if (sl->shared > 0) cm_metrics_prefix(cm_http_metrics(s->srv), sl->shared);
    sl->shared = 0;
    int rc = atomic_load(&sl->j->cancel) ? CM_ECANCELED : 0;
    if (!rc && sl->j->n_lora) rc = cm_session_set_lora(sl->s, sl->j->lora, sl->j->n_lora, err, errlen);
    if (!rc) rc = cm_session_prompt_begin(sl->s, sl->j->ids, sl->j->n_ids, err, errlen);
    sl->begun = !rc;
    return rc;
}

static void *queue_main(void *arg) {
    cm_queue *s = arg;
    cm_session **ss = cm_calloc((size_t)s->n_slots, sizeof *ss);
    cm_session **pre = cm_calloc((size_t)s->n_slots, sizeof *pre); /* prompts of a mixed pass, in turn order */
    int *pre_slot = cm_calloc((size_t)s->n_slots, sizeof *pre_slot),
        *pre_done = cm_calloc((size_t)s->n_slots, sizeof *pre_done);
    char err[256];
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        cm_queue_admit(s, 0);
        kv_refresh(s);
        if (!s->n_active) {
            /* Idle: about once a second the engine may take back nodes
             * that returned (cm_engine_maintain; it acts every few seconds
             * at most). Nothing is in flight, as it requires. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT && !s->head && !s->stop) {
                pthread_mutex_unlock(&s->mu);
                if (cm_engine_maintain(s->e, err, sizeof err) < 0) CM_LOGW("cluster: %s", err);
                pthread_mutex_lock(&s->mu);
            }
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        /* Newcomers' prompts are set at once (prefix reuse) and evaluated in
         * chunks of s->chunk tokens, one chunk per iteration, between the
         * decode steps of the running slots: a long prompt delays each
         * running stream's next token by one chunk at most, never by its
         * whole prefill. The prompt with the fewest tokens left goes first
         * (then the oldest), so a short request's first token does not wait
         * for a long prompt. NEEDSWORK: an endless run of short prompts
         * could postpone a long one indefinitely (no aging yet). A canceled
         * job frees its slot before its next chunk. */
        int n = 0, next = -1, next_left = 0;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->j) continue;
            if (!sl->started) {
                int rc = atomic_load(&sl->j->cancel) ? CM_ECANCELED : 0;
                if (!rc && !sl->begun) rc = cm_queue_slot_begin(s, sl, err, sizeof err);
                if (rc) {
                    cm_queue_slot_fail(s, sl, rc, err);
                    continue;
                }
                /* the fewest prompt tokens left first (a short request is not
                 * stuck behind a long prompt's whole prefill), then arrival */
                int left = sl->j->n_ids - cm_session_n_past(sl->s);
                if (next < 0 || left < next_left || (left == next_left && sl->order < s->slots[next].order)) {
                    next = i;
                    next_left = left;
                }
                continue;
            }
            if (atomic_load(&sl->j->cancel)) cm_session_cancel(sl->s);
            ss[n++] = sl->s;
        }
        /* Short newcomers first, in a pass of their own (short_first); they
         * decode in this step's pass with the others (their first token
         * taken). */
        if (n && next >= 0 && s->ij_max && pre && pre_slot && pre_done &&
            cm_queue_short_first(s, ss, pre, pre_slot, pre_done) > 0) {
            n = 0;
            next = -1;
            for (int i = 0; i < s->n_slots; i++) {
                const slot *sl = &s->slots[i];
                if (!sl->j) continue;
                if (sl->started) {
                    ss[n++] = sl->s;
                    continue;
                }
                const int left = sl->j->n_ids - cm_session_n_past(sl->s);
                if (sl->begun &&
                    (next < 0 || left < next_left || (left == next_left && sl->order < s->slots[next].order))) {
                    next = i;
                    next_left = left;
                }
            }
        }
        /* Mixed passes: the pending prompts' chunks ride in the decode step's
         * forward pass (the room n_batch leaves beside the decode rows), so
         * one read of the weights serves all (cm_engine_step_prefill_many;
         * none on a cluster, which keeps the passes apart). s->chunk prompt
         * tokens at most in all, whatever the number of prompts: the bound
         * on how much longer than a plain decode step the running streams
         * wait. The prompts take their turn in the order of the chunk loop
         * below (fewest tokens left, then arrival), so several short ones
         * finish in one pass. */
        int rc = 0, mixed = 0;
        /* With nothing decoding, the pending prompts share passes as well
         * (8 chunks' worth of tokens, as the chunk loop below would spend on
         * one prompt at a time): newcomers that arrive together start
         * decoding together, so the decode steps that follow carry all of
         * them. A cluster evaluates none here (pre_done stays 0) and takes
         * the chunk loop. */
        if (next >= 0 && s->mixed && pre && pre_slot && pre_done) {
            int np = 0;
            for (int i = 0; i < s->n_slots; i++) {
                const slot *o = &s->slots[i];
                if (!o->j || o->started || !o->begun) continue;
                const int l = o->j->n_ids - cm_session_n_past(o->s);
                int at = np++;
                for (; at > 0; at--) { /* insertion by (left, order) */
                    const slot *q = &s->slots[pre_slot[at - 1]];
                    const int lq = q->j->n_ids - cm_session_n_past(q->s);
                    if (lq < l || (lq == l && q->order < o->order)) break;
                    pre_slot[at] = pre_slot[at - 1];
                }
                pre_slot[at] = i;
            }
            for (int k = 0; k < np; k++) pre[k] = s->slots[pre_slot[k]].s;
            /* While streams decode, the prompt rows fill the pass up to the
             * rows the batched-decode kernels take (pass_rows_fast): 8
             * decode rows + 32 prompt rows took the prefill gemm, 1.6x the
             * time of a 32-row pass for 1.25x the rows (bench/bbench.c,
             * 1B Q4_0), so 24 prompt rows then evaluate the prompt faster
             * and end the pass sooner; at least a quarter chunk (else a
             * whole chunk: the pass is past the bound anyway). */
            int budget = n ? s->chunk : 8 * s->chunk;
            if (n && s->pass_rows_fast > 0) {
                const int room = s->pass_rows_fast - n;
                if (room >= (s->chunk + 3) / 4 && room < budget) budget = room;
            }
            /* short prompts alone while streams decode (queue_short.c) */
            const int n_pass = n ? cm_queue_short_pass(s, pre_slot, np, budget) : np;
            for (int k = n_pass; k < np; k++) pre_done[k] = 0;
            s->pass_t0 = cm_now_s();
            rc = cm_engine_step_prefill_many(s->e, ss, n, pre, n_pass, budget, pre_done, err, sizeof err);
            if (s->trace) {
                int rows = 0;
                for (int k = 0; k < n_pass; k++) rows += pre_done[k] > 0 ? pre_done[k] : 0;
                cm_queue_trace("pass decode=%d prompts=%d/%d prompt_rows=%d budget=%d took %.1fms", n, n_pass, np, rows,
                               budget, (cm_now_s() - s->pass_t0) * 1e3);
            }
            for (int k = 0; k < np; k++) {
                slot *sl = &s->slots[pre_slot[k]];
                if (pre_done[k]) mixed = 1;
                if (pre_done[k] < 0) cm_queue_slot_fail(s, sl, pre_done[k], err);
                else if (pre_done[k] > 0 && cm_session_n_past(sl->s) == sl->j->n_ids) {
                    char perr[256];
                    int r2 = cm_queue_prompt_done(sl, perr, sizeof perr);
                    if (r2) cm_queue_slot_fail(s, sl, r2, perr);
                }
            }
        } else if (n) {
            s->pass_t0 = cm_now_s();
            rc = cm_engine_step(s->e, ss, n, err, sizeof err);
            if (s->trace) cm_queue_trace("pass decode=%d took %.1fms", n, (cm_now_s() - s->pass_t0) * 1e3);
        }
        /* Prompt chunks: a budget of s->chunk tokens per iteration (8 chunks
         * when nothing decodes; none after a mixed pass), spent on the
         * prompts with the fewest tokens left first, so a burst of short
         * prompts is admitted in a few iterations rather than one per
         * iteration. */
        for (int budget = mixed ? 0 : n ? s->chunk : 8 * s->chunk; next >= 0 && budget > 0;) {
            slot *sl = &s->slots[next];
            char perr[256];
            const int before = cm_session_n_past(sl->s);
            int left = cm_session_prompt_step(sl->s, budget, perr, sizeof perr);
            budget -= cm_session_n_past(sl->s) - before > 0 ? cm_session_n_past(sl->s) - before : budget;
            if (left == 0) left = cm_queue_prompt_done(sl, perr, sizeof perr);
            if (left < 0) cm_queue_slot_fail(s, sl, left, perr);
            if (left != 0) break; /* a prompt still pending keeps the rest of the budget's turn */
            next = -1;            /* the next prompt with the fewest tokens left */
            for (int i = 0; i < s->n_slots; i++) {
                slot *o = &s->slots[i];
                if (!o->j || o->started || !o->begun) continue;
                int l2 = o->j->n_ids - cm_session_n_past(o->s);
                if (next < 0 || l2 < next_left || (l2 == next_left && o->order < s->slots[next].order)) {
                    next = i;
                    next_left = l2;
                }
            }
        }
        if (s->step_delay_ms) cm_sleep_ms(s->step_delay_ms);
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->j || !sl->started || cm_session_running(sl->s)) continue;
            cm_gen_result res;
            cm_session_finish(sl->s, &res);
            job *j = sl->j;
            j->stop_index = res.stop_index;
            if (res.finish == CM_FINISH_CANCEL) cm_session_kv_forget(sl->s); /* pages pooled for reuse */
            sl->j = NULL;
            sl->resv = 0;
            sl->used = s->n_admitted;
            s->n_active--;
            pthread_mutex_unlock(&s->mu);
            job_end(j, res.finish, rc < 0 ? 500 : 0, rc < 0 ? err : NULL);
            pthread_mutex_lock(&s->mu);
        }
    }
    /* Stopping: end everything still here (s->mu held: no interjection). */
    cm_queue_short_stop(s);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].j) {
            job *j = s->slots[i].j;
            s->slots[i].j = NULL;
            if (cm_session_running(s->slots[i].s)) cm_session_cancel(s->slots[i].s);
            cm_gen_result res;
            if (s->slots[i].started) {
                while (cm_session_running(s->slots[i].s)) cm_engine_step(s->e, &s->slots[i].s, 1, err, sizeof err);
                cm_session_finish(s->slots[i].s, &res);
            }
            job_end(j, CM_FINISH_CANCEL, 503, "the server is shutting down");
        }
    while (s->head) {
        job *j = s->head;
        s->head = j->next;
        job_end(j, CM_FINISH_CANCEL, 503, "the server is shutting down");
    }
    s->n_active = s->n_queued = 0;
    pthread_mutex_unlock(&s->mu);
    cm_free(ss);
    cm_free(pre);
    cm_free(pre_slot);
    cm_free(pre_done);
    return NULL;
}

cm_queue *cm_queue_new(cm_http_server *srv, cm_engine *e, int n_slots, int queue_max, int n_ctx, uint64_t kv_mem,
                       char *err, size_t errlen) {
    cm_queue *s = cm_calloc(1, sizeof *s);
    if (!s) {
        cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        return NULL;
    }
    s->srv = srv;
    s->e = e;
    s->n_slots = n_slots;
    s->queue_max = queue_max;
    s->step_delay_ms = cm_config_get()->test_step_delay_ms;
    s->chunk = cm_config_get()->prefill_chunk;
    s->mixed = cm_config_get()->mixed_pass;
    s->trace = cm_config_get()->serve_trace;
    {
        cm_engine_info in;
        cm_engine_get_info(e, &in);
        s->pass_rows_fast = in.n_stages > 1 || in.tp_size > 1 ? 0 : in.pass_rows_fast;
        cm_queue_short_init(s, in.pass_rows_fast);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->slots = cm_calloc((size_t)n_slots, sizeof *s->slots);
    if (!s->slots) {
        cm_queue_free(s);
        cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n_slots; i++) {
        s->slots[i].s = cm_session_new(e, n_ctx, err, errlen);
        if (!s->slots[i].s) {
            cm_queue_free(s);
            return NULL;
        }
    }
    s->kv_mem = kv_mem;
    s->kv_avail = cm_mem_available_bytes() / 4 * 3;
    kv_budget(s, 0);
    s->kv.block_bytes = cm_session_kv_bytes(s->slots[0].s, CM_HTTP_KV_BLOCK);
    {
        cm_engine_info in;
        cm_engine_get_info(e, &in);
        if (in.kv_bytes_per_token) s->kv.block_bytes = in.kv_bytes_per_token * CM_HTTP_KV_BLOCK;
    }
    if (cm_thread_create(&s->th, queue_main, s) == 0) s->th_started = true;
    else {
        cm_queue_free(s);
        cm_errf(err, errlen, CM_ENOMEM, "cannot start the scheduler thread");
        return NULL;
    }
    return s;
}

int cm_queue_submit(cm_queue *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->stop) rc = CM_ESTATE;
    /* Free slots take a job at once; only jobs beyond them wait in the queue. */
    else if (s->n_queued >= s->queue_max + (s->n_slots - s->n_active)) rc = CM_EBUSY;
    else {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        j->next = NULL;
        if (s->tail) s->tail->next = j;
        else s->head = j;
        s->tail = j;
        s->n_queued++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void cm_queue_stats(cm_queue *s, int *queued, int *active, int *slots) {
    pthread_mutex_lock(&s->mu);
    *queued = s->n_queued;
    *active = s->n_active;
    *slots = s->n_slots;
    pthread_mutex_unlock(&s->mu);
}

void cm_queue_kv_stats(cm_queue *s, cm_http_kv_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->kv;
    pthread_mutex_unlock(&s->mu);
}

void cm_queue_free(cm_queue *s) {
    if (!s) return;
    if (s->th_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    cm_queue_short_stop(s);
    for (int i = 0; s->slots && i < s->n_slots; i++) cm_session_free(s->slots[i].s);
    cm_free(s->slots);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    cm_free(s);
}
