/*
 * batch_pipe.c: decode steps on a pipeline (stage 0 here, a last stage
 * elsewhere samples). The running sessions of a step are split into a few
 * groups (how many: below), and each group is ONE micro-batch carrying a
 * decode row of each of its sessions: stage 0
 * evaluates it as one batched pass here, every stage after it evaluates it
 * as one pass (the weights read once for the group), and the last stage
 * samples every row. The groups are kept in flight: a step first collects
 * the tokens of a group's micro-batch sent by the previous step, takes them,
 * and sends that group's next rows at once, then goes to the next group; so
 * while we wait for one group the others are on the stages after us, and
 * every stage has work at every moment (the pipeline never drains between
 * steps). How many groups: one per set of stages that share a host
 * (cm_pipe_groups: on separate machines every stage works on a group of its
 * own; stages on one host take turns on its cores, where more groups only
 * mean smaller batches and more passes over the weights), unless
 * CUMULO_PIPE_GROUPS says. A session thus has its row in flight between two
 * steps (cm_session.inflight); it stays running until its token is
 * collected.
 *
 * Same bits as one machine: every row is computed as it is alone (the
 * kernels are batch-invariant, kernels.h), each sequence has its own caches
 * and sampler on every stage, and its tokens are taken in order. Must never
 * release or reuse a pipe slot whose answer is still on its way
 * (cm_session_pipe_drain), nor block without the pipe's deadlines.
 */
#include "engine_impl.h"

#include <string.h>

enum { COLLECT_LOST = 2 }; /* collect(): the pipe failed; recover, then resend */

/* A stage failed during a step (cm_pipe_failed): re-plan on the survivors.
 * Every running session then starts over on the new stages at its next
 * evaluation (cm_engine_eval_cluster sees the new generation: SEQ_START with
 * prompt + tokens emitted, recompute from position 0). A token lost in
 * flight was never taken: the client sees a pause, nothing repeated or
 * skipped. When no re-plan is possible, every running session ends with the
 * reason. */
static int step_recover(cm_engine *e, cm_session *const *ss, int n, char *err, size_t errlen) {
    char msg[600] = "";
    int rc = cm_pipe_recover(e->cl, msg, sizeof msg);
    int running = 0;
    for (int i = 0; i < n; i++) {
        if (!cm_session_running(ss[i])) continue;
        if (rc) {
            ss[i]->inflight = 0;
            cm_step_end(ss[i], CM_FINISH_CANCEL);
        } else running++;
    }
    return rc ? cm_errf(err, errlen, rc, "%s", msg) : running;
}

/* The answer to s's row in flight: take its token (or sample its logits,
 * under a grammar). Returns cm_step_take's 1 / 0 / error, or COLLECT_LOST. */
static int collect(cm_engine *e, cm_session *s, char *err, size_t errlen) {
    const bool here = s->inflight == CM_PIPE_WANT_LOGITS; /* the logits came back: sample here */
    const bool lost = s->inflight_gen != cm_pipe_generation(e->cl);
    s->inflight = 0;
    if (lost) return 1; /* a recovery since: the next evaluation recomputes and resends it */
    cm_sample_info info;
    memset(&info, 0, sizeof info);
    int32_t id = -1;
    char msg[256] = "";
    int rc = here ? cm_pipe_output_wait(e->cl, s->slot, msg, sizeof msg)
                  : cm_pipe_recv_token(e->cl, s->slot, &id, &info.logprob, msg, sizeof msg);
    if (!rc && !here && (id < 0 || id >= e->m.hp.n_vocab))
        rc = cm_errf(msg, sizeof msg, CM_EPROTO, "the last stage sent token id %d", id);
    if (rc && cm_pipe_failed(e->cl)) return COLLECT_LOST; /* its token comes after recovery */
    if (rc) {
        cm_step_end(s, CM_FINISH_CANCEL);
        return cm_errf(err, errlen, rc, "%s", msg);
    }
    if (atomic_load(&s->cancel)) { /* canceled while its row was on the way: nothing more streams */
        cm_step_end(s, CM_FINISH_CANCEL);
        return 0;
    }
    if (here) return cm_step_sample(s);
    cm_engine_pipe_top(e, s->slot, &info);
    return cm_step_take(s, id, &info);
}

void cm_session_pipe_drain(cm_session *s) {
    if (!s->inflight) return;
    cm_engine *e = s->e;
    const bool here = s->inflight == CM_PIPE_WANT_LOGITS;
    s->inflight = 0;
    if (s->inflight_gen != cm_pipe_generation(e->cl)) return;
    int32_t id;
    char msg[256];
    if (here) cm_pipe_output_wait(e->cl, s->slot, msg, sizeof msg);
    else cm_pipe_recv_token(e->cl, s->slot, &id, NULL, msg, sizeof msg);
}

/* Send the pending token of each g[0..m) (running, its pending token the
 * only one not evaluated, its caches of this pipe generation) as ONE
 * micro-batch: a batched pass of stage 0 here, then the rows on. On an
 * error nothing of the group is evaluated here (the caches go back). */
static int launch_group(cm_engine *e, cm_session *const *g, int m, char *err, size_t errlen) {
    int32_t tok[CM_BATCH_MAX], pos[CM_BATCH_MAX], seq[CM_BATCH_MAX], slots[CM_BATCH_MAX];
    uint8_t want[CM_BATCH_MAX];
    cm_kv *kvs[CM_BATCH_MAX];
    const float *ls[CM_BATCH_MAX];
    bool any_lora = false;
    for (int k = 0; k < m; k++) {
        cm_session *s = g[k];
        tok[k] = s->hist[s->n_hist - 1];
        pos[k] = s->kv.n_past;
        seq[k] = k;
        slots[k] = s->slot;
        want[k] = cm_step_grammar(s) ? CM_PIPE_WANT_LOGITS : CM_PIPE_WANT_TOKEN;
        kvs[k] = &s->kv;
        ls[k] = s->lora;
        any_lora |= s->lora != NULL;
        if (cm_step_grammar(s)) cm_pipe_output_expect(e->cl, s->slot, CM_PIPE_OUT_LOGITS, s->logits, s->n_hist - 1, 1);
    }
    cm_batch b = {.n = m, .tokens = tok, .pos = pos, .seq = seq};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = e->local_last,
                         .slice = cm_engine_slice(e),
                         .kvs = kvs,
                         .n_kvs = m,
                         .out_hidden = g[0]->hidden, /* [n_batch][n_embd]; m <= n_batch */
                         .lora_scales = any_lora ? ls : NULL};
    /* Under the lock, as cm_engine_eval_cluster: micro-batches leave in the
     * order the stage-0 caches saw them. */
    pthread_mutex_lock(&e->mu);
    int rc = cm_pipe_stage0(e->cl, tok, pos, slots, m, NULL, &a, err, errlen);
    if (!rc) rc = cm_forward(e->ctx, &b, &a, err, errlen);
    if (!rc) rc = cm_pipe_send_rows(e->cl, slots, g[0]->hidden, pos, want, m, err, errlen);
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        for (int k = 0; k < m; k++) cm_kv_truncate(kvs[k], pos[k]); /* the next stages may not have it */
        return rc;
    }
    const int gen = cm_pipe_generation(e->cl);
    for (int k = 0; k < m; k++) {
        g[k]->inflight = want[k];
        g[k]->inflight_gen = gen;
    }
    if (e->test_cluster_delay_ms) cm_sleep_ms(e->test_cluster_delay_ms);
    return 0;
}

/* One session alone, as a micro-batch of its own: after a recovery (the
 * whole sequence again) or with other rows pending. */
static int launch_one(cm_engine *e, cm_session *s, char *err, size_t errlen) {
    const int w = cm_step_grammar(s) ? CM_PIPE_WANT_LOGITS : CM_PIPE_WANT_TOKEN;
    if (s->pipe_gen == cm_pipe_generation(e->cl) && s->kv.n_past >= s->n_hist) /* nothing would be sent */
        return cm_errf(err, errlen, CM_ESTATE, "no pending token to send on slot %d", s->slot);
    if (cm_step_grammar(s)) cm_pipe_output_expect(e->cl, s->slot, CM_PIPE_OUT_LOGITS, s->logits, s->n_hist - 1, 1);
    int rc = cm_engine_eval_cluster(s, s->n_hist, w, err, errlen);
    if (!rc) {
        s->inflight = w;
        s->inflight_gen = cm_pipe_generation(e->cl);
    }
    return rc;
}

int cm_engine_step_pipe(cm_engine *e, cm_session *const *ss, int n, char *err, size_t errlen) {
    const int cap = CM_MIN(e->n_batch, CM_BATCH_MAX);
    int live = 0;
    for (int i = 0; i < n; i++) live += cm_session_running(ss[i]);
    int groups = cm_config_get()->pipe_groups > 0 ? cm_config_get()->pipe_groups : cm_pipe_groups(e->cl);
    if (groups > live) groups = live;
    if (groups < 1) groups = 1;
    int per = (live + groups - 1) / groups;
    if (per > cap) per = cap;
    if (per < 1) per = 1;
    int first_err = 0;
    bool lost = false;
    for (int i = 0; i < n;) {
        /* The next group: collect its answers, then send its next rows. */
        cm_session *g[CM_BATCH_MAX];
        int m = 0;
        for (int taken = 0; i < n && taken < per; i++) {
            cm_session *s = ss[i];
            if (!cm_session_running(s)) continue;
            taken++;
            int r = 1;
            char msg[256] = "";
            if (s->inflight) {
                r = collect(e, s, msg, sizeof msg);
            } else if (atomic_load(&s->cancel)) {
                cm_step_end(s, CM_FINISH_CANCEL);
                r = 0;
            } else if (cm_step_quota_done(s)) {
                cm_step_end(s, CM_FINISH_LENGTH);
                r = 0;
            }
            if (r == COLLECT_LOST) lost = true;
            if (r < 0 && !first_err) {
                first_err = r;
                cm_errf(err, errlen, r, "%s", *msg ? msg : cm_strerror(r));
            }
            if (r == 1 && !lost) g[m++] = s;
        }
        if (lost) continue; /* the rest is collected (answers lost); the recovery resends */
        /* Rows that batch: one pending token, caches of this generation. */
        cm_session *b[CM_BATCH_MAX];
        int nb = 0;
        for (int k = 0; k < m; k++) {
            cm_session *s = g[k];
            char msg[256] = "";
            int rc = cm_session_lora_sync(s, msg, sizeof msg); /* the stages apply its adapter scales */
            if (!rc && s->pipe_gen == cm_pipe_generation(e->cl) && s->n_hist == s->kv.n_past + 1) {
                b[nb++] = s;
                continue;
            }
            if (!rc) rc = launch_one(e, s, msg, sizeof msg);
            if (rc && rc != CM_ECANCELED && cm_pipe_failed(e->cl)) {
                lost = true;
                continue;
            }
            if (rc) {
                cm_step_end(s, CM_FINISH_CANCEL);
                if (!first_err) {
                    first_err = rc;
                    cm_errf(err, errlen, rc, "%s", msg);
                }
            }
        }
        if (!nb || lost) continue;
        char msg[256] = "";
        int rc = launch_group(e, b, nb, msg, sizeof msg);
        if (rc && cm_pipe_failed(e->cl)) {
            lost = true;
            continue;
        }
        if (rc) {
            for (int k = 0; k < nb; k++) cm_step_end(b[k], CM_FINISH_CANCEL);
            if (!first_err) {
                first_err = rc;
                cm_errf(err, errlen, rc, "%s", msg);
            }
        }
    }
    if (lost) return step_recover(e, ss, n, err, errlen);
    if (first_err) return first_err;
    int running = 0;
    for (int i = 0; i < n; i++) running += cm_session_running(ss[i]);
    return running;
}
