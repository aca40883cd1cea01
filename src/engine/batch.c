/*
 * batch.c: continuous batching for the engine. Several sessions generate at
 * once: every step samples one token per running session and evaluates all
 * of them in a single cm_forward call (one row per sequence, each row with
 * its own KV cache), so the weights stream through the caches once per step
 * instead of once per session. Sessions join and leave between steps.
 *
 * This is the only generation loop: cm_session_generate (run, chat, bench)
 * is cm_session_start, then cm_engine_step on that one session, then
 * cm_session_finish, so a request gives the same text alone or in a crowd.
 * Nothing here allocates per token: the sampler, stop matcher and detokenizer
 * are made in cm_session_start, the logits buffer on the first step.
 */
#include "engine_impl.h"

#include "../sampler/grammar.h"

#include <string.h>

struct cm_step {
    cm_gen_params p;
    cm_sampler *smp;
    cm_stop *stop;
    cm_grammar_state *gs; /* constrain.c; NULL without a grammar */
    cm_detok dt;
    cm_token_cb cb;
    bool cb_stopped;
    void *user;
    int n_gen;
    int stop_hit;
    bool running;
    enum cm_finish fin;
    double t0;
};

void cm_session_step_release(cm_session *s) {
    if (!s->step) return;
    cm_sampler_free(s->step->smp);
    cm_stop_free(s->step->stop);
    cm_grammar_state_free(s->step->gs);
    cm_free(s->step);
    s->step = NULL;
}

int cm_session_start(cm_session *s, const cm_gen_params *p, cm_token_cb cb, void *user, char *err, size_t errlen) {
    cm_engine *e = s->e;
    cm_session_step_release(s);
    /* On a cluster the last token stays pending until its sample (engine_impl.h). */
    if (!s->have_logits || s->n_hist != s->kv.n_past + (cm_engine_downstream(e) ? 1 : 0))
        return cm_errf(err, errlen, CM_ESTATE, "start before a prompt was evaluated");
    struct cm_step *st = cm_calloc(1, sizeof *st);
    if (!st) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    st->p = *p;
    st->p.stops = NULL; /* the matcher keeps its own copies */
    st->smp = cm_sampler_new(&p->sampling, e->m.hp.n_vocab, err, errlen);
    st->stop = st->smp ? cm_stop_new(p->stops, p->n_stops, err, errlen) : NULL;
    int grc = st->stop ? cm_constrain_begin(s, p, &st->gs, err, errlen) : 0;
    if (!st->smp || !st->stop || grc) {
        cm_stop_free(st->stop);
        cm_sampler_free(st->smp);
        cm_free(st);
        return grc ? grc : CM_EINVAL;
    }
    int n_done = cm_engine_downstream(e) ? s->n_hist : s->kv.n_past;
    int from = n_done - (p->sampling.repeat_last_n > 0 ? p->sampling.repeat_last_n : 0);
    for (int i = from < 0 ? 0 : from; i < n_done; i++) cm_sampler_accept(st->smp, s->hist[i]);
    /* The last stage samples: it gets the parameters and the history. */
    if (cm_engine_downstream(e)) {
        int rc = cm_pipe_seq_start(e->cl, s->slot, &p->sampling, s->hist, s->n_hist, 0, err, errlen);
        /* A stage lost since the prefill: the next step recovers and then
         * restarts this sequence like every other (pipe generation). */
        if (rc && cm_pipe_failed(e->cl)) rc = 0;
        if (rc) {
            cm_stop_free(st->stop);
            cm_sampler_free(st->smp);
            cm_free(st);
            return rc;
        }
    }
    bool lstrip = true;
    for (int i = 0; i < n_done; i++)
        if (!cm_tokenizer_is_control(e->tok, s->hist[i])) lstrip = false;
    cm_detok_init(&st->dt, e->tok, false, lstrip);
    st->cb = cb;
    st->user = user;
    st->stop_hit = -1;
    st->running = true;
    st->fin = CM_FINISH_LENGTH;
    st->t0 = cm_now_s();
    atomic_store(&s->cancel, 0);
    s->first_taken = false;
    s->step = st;
    return 0;
}

bool cm_session_running(const cm_session *s) { return s->step && s->step->running; }
bool cm_step_grammar(const cm_session *s) { return s->step && s->step->gs; }
bool cm_step_quota_done(const cm_session *s) {
    return s->step && s->step->p.n_predict > 0 && s->step->n_gen >= s->step->p.n_predict;
}

/* Pass bytes through the stop matcher to the callback. */
static int step_emit(struct cm_step *st, int32_t id, const char *text, size_t n, const cm_sample_info *info) {
    const char *out = "";
    size_t on = 0;
    int r = cm_stop_feed(st->stop, text, n, &out, &on);
    if (r == CM_ENOMEM) return r;
    if (r >= 0) st->stop_hit = r;
    cm_token_event ev = {.id = id, .text = out, .len = on, .info = info};
    if (st->cb && st->cb(st->user, &ev)) st->cb_stopped = true;
    return 0;
}

/* The session is done: flush held-back text (unless a stop string ended it). */
void cm_step_end(cm_session *s, enum cm_finish fin) {
    struct cm_step *st = s->step;
    st->running = false;
    st->fin = fin;
    if (fin != CM_FINISH_STOP) {
        size_t pn = 0;
        if (cm_detok_flush(&st->dt, s->piece, s->piece_cap, &pn) == 0 && pn) step_emit(st, -1, s->piece, pn, NULL);
        if (st->stop_hit >= 0) st->fin = CM_FINISH_STOP;
        const char *out = "";
        size_t on = 0;
        cm_stop_flush(st->stop, &out, &on);
        cm_token_event ev = {.id = -1, .text = out, .len = on};
        if (on && st->cb) st->cb(st->user, &ev);
    }
    s->have_logits =
        cm_engine_downstream(s->e) ? s->n_hist == s->kv.n_past + 1 : s->have_logits && s->n_hist == s->kv.n_past;
    s->t.n_gen = st->n_gen;
    s->t.gen_s = cm_now_s() - st->t0;
}

int cm_step_sample(cm_session *s) {
    struct cm_step *st = s->step;
    if (atomic_load(&s->cancel)) {
        cm_step_end(s, CM_FINISH_CANCEL);
        return 0;
    }
    if (st->p.n_predict > 0 && st->n_gen >= st->p.n_predict) {
        cm_step_end(s, CM_FINISH_LENGTH);
        return 0;
    }
    /* The chosen token's logprob costs one softmax over the vocabulary (~3%
     * of a 16-sequence step of a 1B model): only when someone reads it. */
    cm_sample_info info;
    /* a grammar that allows nothing more (not even an end) ends the reply */
    if (st->gs && cm_constrain_mask(s, st->gs) == 0) {
        cm_step_end(s, CM_FINISH_EOG);
        return 0;
    }
    int32_t id = cm_sampler_sample(st->smp, s->logits, st->p.skip_logprobs ? NULL : &info);
    if (st->gs && cm_constrain_take(s, st->gs, id)) {
        cm_step_end(s, CM_FINISH_EOG);
        return 0;
    }
    return cm_step_take(s, id, st->p.skip_logprobs ? NULL : &info);
}

/* The rest of a step once the token is known (sampled here, or by the last
 * stage of a cluster): accept, stream, decide. Same return as step_sample.
 * info: NULL when nobody reads it (skip_logprobs). */
int cm_step_take(cm_session *s, int32_t id, const cm_sample_info *info) {
    struct cm_step *st = s->step;
    cm_engine *e = s->e;
    cm_sampler_accept(st->smp, id);
    st->n_gen++;
    if (!st->p.ignore_eos && cm_tokenizer_is_eog(e->tok, id)) {
        cm_step_end(s, CM_FINISH_EOG);
        return 0;
    }
    s->hist[s->n_hist++] = id;
    s->have_logits = false;
    size_t pn = 0;
    int rc = cm_detok_push(&st->dt, id, s->piece, s->piece_cap, &pn);
    if (!rc) rc = step_emit(st, id, s->piece, pn, info);
    if (rc) {
        cm_step_end(s, CM_FINISH_CANCEL);
        return rc;
    }
    if (st->stop_hit >= 0) {
        cm_step_end(s, CM_FINISH_STOP);
        return 0;
    }
    if (st->cb_stopped) {
        cm_step_end(s, CM_FINISH_CANCEL);
        return 0;
    }
    if (st->p.n_predict > 0 && st->n_gen >= st->p.n_predict) {
        cm_step_end(s, CM_FINISH_LENGTH);
        return 0;
    }
    if (s->n_hist >= s->n_ctx) {
        cm_step_end(s, CM_FINISH_CTX);
        return 0;
    }
    if (cm_engine_downstream(e)) s->have_logits = true; /* the new token is pending: ready for the next sample */
    return 1;
}

int cm_session_seq_restart(cm_session *s, char *err, size_t errlen) {
    if (!s->step || !s->step->running) return 0;
    /* n_gen tokens were taken: the new last stage's sampler draws on from
     * there (counter-based draws), so a seeded stream is unchanged. */
    return cm_pipe_seq_start(s->e->cl, s->slot, &s->step->p.sampling, s->hist, s->n_hist, (uint64_t)s->step->n_gen, err,
                             errlen);
}

/* Mixed passes: the last pass of a step also carries up to max tokens of
 * the pending prompts pre[0..n) (in that order; rows after the decode rows,
 * each prompt's tokens in order from its n_past, its own KV cache), so the
 * weights are read once for all. done[k]: prompt tokens of pre[k]
 * evaluated; rc[k]: its error (its slot fails, the step goes on). */
typedef struct step_pre {
    cm_session *const *s;
    int n, max;
    int *done, *rc;
    char err[256];
} step_pre;

static int step_local(cm_engine *e, cm_session *const *ss, int n, step_pre *pre, char *err, size_t errlen);

/* ---- Interjections (engine.h cm_engine_set_interject) ----
 * A pass of a step is paused between two layers (forward.c's
 * between_layers, on this thread, the pool idle, under e->mu) while the
 * caller's function admits short prompts that just arrived and evaluates
 * them whole in a pass of their own on ij_ctx: other sequences' caches,
 * other scratch, the same pool, so the paused pass resumes with nothing of
 * it changed. A newcomer then waits for the layer in flight (1/n_layer of a
 * pass) and its own pass of its own rows, not for the rest of a pass of
 * decode rows and a long prompt's chunk and then a pass beside the decode
 * rows (session 14 measured that floor at 2x an idle server's first token;
 * the running streams pay the newcomer's pass once, as they do now). */
enum { IJ_PROMPTS = 8 }; /* prompts of one interjected pass (rows of logits kept) */

static void ij_between(void *user, int il) {
    cm_engine *e = user;
    (void)il;
    if (e->ij_delay_ms) cm_sleep_ms(e->ij_delay_ms);
    e->ij_in = true;
    e->ij_fn(e->ij_user);
    e->ij_in = false;
}

bool cm_engine_set_interject(cm_engine *e, cm_engine_interject_fn fn, void *user, int max_tokens) {
    if (!fn) {
        e->ij_fn = NULL;
        return true;
    }
    if (e->cl || e->gpu || e->lora || max_tokens < 1 || !e->pool) return false;
    if (!e->ij_ctx) {
        char msg[256];
        const int mt = CM_MIN(max_tokens, CM_BATCH_MAX);
        e->ij_ctx = cm_ctx_new(&e->m, mt, e->max_ctx, e->pool, msg, sizeof msg);
        e->ij_logits = cm_malloc((size_t)IJ_PROMPTS * (size_t)e->m.hp.n_vocab * sizeof(float));
        if (!e->ij_ctx || !e->ij_logits) {
            cm_ctx_free(e->ij_ctx);
            cm_free(e->ij_logits);
            e->ij_ctx = NULL;
            e->ij_logits = NULL;
            return false;
        }
        e->ij_max = mt;
    }
    e->ij_delay_ms = cm_config_get()->test_layer_delay_ms;
    e->ij_fn = fn;
    e->ij_user = user;
    return true;
}

uint64_t cm_engine_interjected(const cm_engine *e) { return e->ij_prompts; }

int cm_engine_interject_prompts(cm_engine *e, cm_session *const *pre, int n_pre, char *err, size_t errlen) {
    CM_ASSERT(e->ij_in && e->ij_ctx);
    int32_t tok[CM_BATCH_MAX], pos[CM_BATCH_MAX], seq[CM_BATCH_MAX];
    int8_t want[CM_BATCH_MAX];
    cm_kv *kvs[IJ_PROMPTS];
    int n = 0, k = 0;
    for (; k < n_pre && k < IJ_PROMPTS; k++) {
        cm_session *ps = pre[k];
        const int m = ps->n_hist - ps->kv.n_past;
        if (m < 1 || n + m > e->ij_max || atomic_load(&ps->cancel)) break;
        for (int t = 0; t < m; t++) {
            tok[n + t] = ps->hist[ps->kv.n_past + t];
            pos[n + t] = ps->kv.n_past + t;
            seq[n + t] = k;
            want[n + t] = t == m - 1;
        }
        kvs[k] = &ps->kv;
        n += m;
    }
    if (!k) return 0;
    cm_batch b = {.n = n, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = e->m.hp.n_layer,
                         .slice = e->slice,
                         .kvs = kvs,
                         .n_kvs = k,
                         .out_logits = e->ij_logits};
    const double t0 = cm_now_s();
    char msg[256] = "";
    for (int r = 0; r < k; r++) pre[r]->have_logits = false;
    int rc = cm_forward(e->ij_ctx, &b, &a, msg, sizeof msg);
    if (rc) return cm_errf(err, errlen, rc, "forward pass failed: %s", msg);
    const size_t nv = (size_t)e->m.hp.n_vocab;
    for (int r = 0; r < k; r++) {
        memcpy(pre[r]->logits, e->ij_logits + (size_t)r * nv, nv * sizeof(float));
        pre[r]->have_logits = true;
        pre[r]->t.prompt_s += cm_now_s() - t0;
    }
    e->ij_prompts += (uint64_t)k;
    return k;
}

int cm_session_first_token(cm_session *s) {
    if (!s->step || !s->step->running || !s->have_logits || s->first_taken || s->e->cl) return CM_ESTATE;
    const int r = cm_step_sample(s);
    s->first_taken = r == 1;
    return r;
}

int cm_engine_step(cm_engine *e, cm_session *const *ss, int n, char *err, size_t errlen) {
    if (cm_engine_downstream(e)) return cm_engine_step_pipe(e, ss, n, err, errlen);
    return step_local(e, ss, n, NULL, err, errlen);
}

int cm_engine_step_prefill_many(cm_engine *e, cm_session *const *ss, int n, cm_session *const *pre, int n_pre,
                                int max_tokens, int *pre_done, char *err, size_t errlen) {
    for (int k = 0; k < n_pre; k++) pre_done[k] = 0;
    if (cm_engine_downstream(e) || e->cl || n_pre < 1 || max_tokens < 1) return cm_engine_step(e, ss, n, err, errlen);
    int rcs[CM_BATCH_MAX] = {0};
    if (n_pre > CM_BATCH_MAX) n_pre = CM_BATCH_MAX;
    step_pre p = {.s = pre, .n = n_pre, .max = max_tokens, .done = pre_done, .rc = rcs};
    int rc = step_local(e, ss, n, &p, err, errlen);
    bool told = false;
    for (int k = 0; k < n_pre; k++)
        if (rcs[k]) {
            pre_done[k] = rcs[k];
            if (rc >= 0 && !told) cm_errf(err, errlen, rcs[k], "%s", p.err); /* the step went well: err tells pre's */
            told = true;
        }
    return rc;
}

int cm_engine_step_prefill(cm_engine *e, cm_session *const *ss, int n, cm_session *pre, int max_tokens, int *pre_done,
                           char *err, size_t errlen) {
    return cm_engine_step_prefill_many(e, ss, n, &pre, pre ? 1 : 0, max_tokens, pre_done, err, errlen);
}

static int step_local(cm_engine *e, cm_session *const *ss, int n, step_pre *pre, char *err, size_t errlen) {
    int nb = e->n_batch;
    int nv = e->m.hp.n_vocab;
    /* Under e->mu: cm_session_generate steps one session from each caller's
     * thread (e.g. two chats of one engine), so several steps may run at once. */
    pthread_mutex_lock(&e->mu);
    if (!e->step_logits) e->step_logits = cm_malloc((size_t)nb * (size_t)nv * sizeof(float));
    pthread_mutex_unlock(&e->mu);
    if (!e->step_logits) return cm_errf(err, errlen, CM_ENOMEM, "out of memory for %d rows of logits", nb);
    /* Rows are collected and evaluated in chunks of at most n_batch sequences. */
    cm_session *rows[CM_BATCH_MAX];
    cm_kv *kvs[CM_BATCH_MAX];
    int32_t tok[CM_BATCH_MAX], pos[CM_BATCH_MAX], seq[CM_BATCH_MAX];
    int8_t want[CM_BATCH_MAX];
    for (int k = 0; pre && k < pre->n; k++)
        if (atomic_load(&pre->s[k]->cancel)) pre->rc[k] = cm_errf(pre->err, sizeof pre->err, CM_ECANCELED, "canceled");
    /* n_batch bounds the rows of one pass; further sessions go in more passes
     * of the same step. (With n_batch within the kernels' exact tile, every
     * row gets the bits it would get alone: see engine.h.) */
    int cap = CM_MIN(nb, CM_BATCH_MAX);
    int running = 0, first_err = 0;
    int i = 0;
    while (i < n || pre) {
        int nr = 0;
        for (; i < n && nr < cap; i++) {
            cm_session *s = ss[i];
            if (!cm_session_running(s)) continue;
            if (e->cl && s->pipe_gen != cm_pipe_generation(e->cl)) {
                /* The group was re-formed while this session waited in
                 * another pass of the step: recompute before sampling. */
                char m2[256];
                int r2 = cm_session_tp_sync(s, m2, sizeof m2);
                if (!r2) r2 = cm_session_recompute(s, m2, sizeof m2);
                if (r2) {
                    cm_step_end(s, CM_FINISH_CANCEL);
                    if (!first_err) {
                        first_err = r2;
                        cm_errf(err, errlen, r2, "%s", m2);
                    }
                    continue;
                }
            }
            int r = s->first_taken ? 1 : cm_step_sample(s); /* cm_session_first_token sampled it */
            s->first_taken = false;
            if (r < 0 && !first_err) {
                first_err = r;
                cm_errf(err, errlen, r, "generation failed: %s", cm_strerror(r));
            }
            if (r != 1) continue;
            rows[nr] = s;
            kvs[nr] = &s->kv;
            tok[nr] = s->hist[s->n_hist - 1];
            pos[nr] = s->kv.n_past;
            seq[nr] = nr;
            want[nr] = 1;
            nr++;
        }
        /* The last pass takes the prompt chunks in the room the decode rows
         * leave, at most pre->max tokens in all (the bound on what a
         * decode step waits for), the prompts in the order given: tokens of
         * one sequence each, in order from its n_past; logits of a prompt's
         * last row only when that ends it (those rows follow the decode
         * rows' logits in batch order: lrows). */
        int np = 0, nk = nr, n_out = nr;
        int pk[CM_BATCH_MAX], pn[CM_BATCH_MAX], n_pk = 0; /* the prompts in this pass and their tokens */
        cm_session *lrows[CM_BATCH_MAX];
        for (int r = 0; r < nr; r++) lrows[r] = rows[r];
        step_pre *pp = i >= n ? pre : NULL;
        for (int k = 0; pp && k < pp->n && nr + np < cap && np < pp->max; k++) {
            cm_session *ps = pp->s[k];
            if (pp->rc[k]) continue;
            const int m = CM_MIN(CM_MIN(cap - nr - np, pp->max - np), ps->n_hist - ps->kv.n_past);
            if (m <= 0) continue;
            const bool last = ps->kv.n_past + m == ps->n_hist;
            for (int t = 0; t < m; t++) {
                tok[nr + np + t] = ps->hist[ps->kv.n_past + t];
                pos[nr + np + t] = ps->kv.n_past + t;
                seq[nr + np + t] = nk;
                want[nr + np + t] = last && t == m - 1;
            }
            if (last) lrows[n_out++] = ps;
            rows[nk] = ps;
            kvs[nk++] = &ps->kv;
            ps->have_logits = false;
            pk[n_pk] = k;
            pn[n_pk++] = m;
            np += m;
        }
        if (pp) pre = NULL; /* one pass at most */
        if (!nr && !np) continue;
        cm_batch b = {.n = nr + np, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
        cm_forward_args a = {.layer_first = 0,
                             .layer_last = e->m.hp.n_layer,
                             .slice = e->slice,
                             .kvs = kvs,
                             .n_kvs = nk,
                             .out_logits = e->step_logits};
        if (e->ij_fn && !e->ij_in && !e->cl) {
            a.between_layers = ij_between;
            a.between_layers_user = e;
        }
        const double t0 = cm_now_s();
        pthread_mutex_lock(&e->mu);
        char msg[256] = "";
        int rc = cm_engine_forward(e, &b, &a, rows, msg, sizeof msg);
        for (int r = 0; r < n_out && !rc; r++) /* the shared rows, copied out before another step may write them */
            memcpy(lrows[r]->logits, e->step_logits + (size_t)r * (size_t)nv, (size_t)nv * sizeof(float));
        pthread_mutex_unlock(&e->mu);
        for (int q = 0; q < n_pk; q++) {
            cm_session *ps = pp->s[pk[q]];
            ps->t.prompt_s += cm_now_s() - t0;
            if (rc) pp->rc[pk[q]] = cm_errf(pp->err, sizeof pp->err, rc, "%s", msg);
            else {
                pp->done[pk[q]] = pn[q];
                ps->have_logits = ps->kv.n_past == ps->n_hist;
            }
        }
        if (rc && e->cl && rc != CM_ECANCELED) {
            /* A member of the group was lost: re-form the group,
             * then each row recomputes prompt + tokens emitted (its
             * new token was streamed already and is the last one evaluated:
             * nothing repeats). Sessions not in this pass resync at their
             * next evaluation (cm_session_tp_sync). */
            rc = cm_engine_tp_recover(e, msg, sizeof msg);
            for (int r = 0; r < nr; r++) {
                cm_session *s = rows[r];
                int r2 = rc ? rc : cm_session_tp_sync(s, msg, sizeof msg);
                if (!r2) r2 = cm_session_recompute(s, msg, sizeof msg);
                if (r2) {
                    cm_step_end(s, CM_FINISH_CANCEL);
                    if (!rc) rc = r2;
                    continue;
                }
                running++;
            }
            if (rc && !first_err) {
                first_err = rc;
                cm_errf(err, errlen, rc, "%s", msg);
            }
            continue;
        }
        for (int r = 0; r < nr; r++) {
            cm_session *s = rows[r];
            if (rc) {
                cm_step_end(s, CM_FINISH_CANCEL);
                continue;
            }
            s->have_logits = true;
            running++;
        }
        if (rc && !first_err) {
            first_err = rc;
            cm_errf(err, errlen, rc, "forward pass failed: %s", msg);
        }
    }
    return first_err ? first_err : running;
}

int cm_session_finish(cm_session *s, cm_gen_result *res) {
    memset(res, 0, sizeof *res);
    res->stop_index = -1;
    if (!s->step || s->step->running) return CM_ESTATE;
    res->finish = s->step->fin;
    res->t = s->t;
    res->stop_index = s->step->stop_hit;
    cm_session_step_release(s);
    return 0;
}
