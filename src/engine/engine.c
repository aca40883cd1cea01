/*
 * engine.c: the single-machine engine behind engine.h: maps the GGUF, binds
 * the model and tokenizer, owns the compute pool and one forward context,
 * and runs sessions (prefix reuse, chunked prompt evaluation, the sample ->
 * detokenize -> stop-string -> callback loop, timings).
 *
 * Forward passes of all sessions go through one cm_ctx under e->mu, so
 * sessions on several threads take turns. Nothing here allocates per token:
 * logits, pieces and the sampler are sized when a session/generation starts.
 * Sessions decoding at the same time share one forward pass through
 * cm_engine_step (batch.c); a prompt may be evaluated in chunks
 * (cm_session_prompt_begin/step) between such steps.
 */
#include "engine.h"

#include "../cluster/cluster.h"
#include "../gguf/gguf.h"
#include "../kernels/kernels.h"
#include "../model/model.h"
#include "../os/os.h"
#include "../tokenizer/tokenizer.h"

#include "engine_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void fill_default_opts(cm_engine_opts *o) { memset(o, 0, sizeof *o); }

/* This machine's slice of a tensor-parallel group (every layer here), its
 * column slices repacked for the gemv (cm_model_repack_slice; without them
 * they read the file's layout, the same bits, slower). */
static void take_tp_slice(cm_engine *e) {
    e->slice = cm_pipe_tp_slice(e->cl);
    char msg[200];
    if (cm_model_repack_slice(&e->m, e->slice, msg, sizeof msg)) CM_LOGW("tensor parallel: %s", msg);
    cm_engine_gpu_reslice(e); /* the device's copy of the slice too */
}

bool cm_engine_weights_in_memory(const cm_engine_opts *opts, uint64_t file_bytes) {
    /* A tensor-parallel coordinator (one group) reads a slice of every layer
     * per token, as a node of its group does: mapped 4 KiB pages and no
     * repacked rows cost it ~1/4 of its speed (docs/HISTORY.md, 2026-12-03). */
    bool tp = opts && opts->plan.mode_set && opts->plan.mode == CM_PARALLEL_TP;
    if (opts && (opts->mmap || (opts->nodes && *opts->nodes && !tp))) return false;
    return cm_gguf_worth_loading(file_bytes);
}

/* Most prompt tokens per forward pass (the prompt's chunks, eval_upto) when
 * opts give none. A tensor-parallel group meets in two all-reduces per layer
 * and pass, each a lock-step wait for its slowest member: there the largest
 * pass, CM_BATCH_MAX (a 163-token prompt in 1 pass, not 3; the same bits in
 * any chunking: the kernels are batch-invariant, kernels.h). Elsewhere 64: a
 * pipeline's prompt overlaps its stages in such micro-batches. */
static int default_n_batch(const cm_engine_opts *o) {
    if (o->n_batch > 0) return o->n_batch;
    bool tp = o->nodes && *o->nodes && o->plan.mode_set && o->plan.mode == CM_PARALLEL_TP;
    return tp ? CM_BATCH_MAX : 64;
}

int cm_engine_load(cm_engine **out, const char *path, const cm_engine_opts *opts, char *err, size_t errlen) {
    *out = NULL;
    cm_engine_opts o;
    if (opts) o = *opts;
    else fill_default_opts(&o);
    cm_engine *e = cm_calloc(1, sizeof *e);
    if (!e) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    {
        /* recursive: an interjection (batch.c) runs inside a pass that holds
         * it and may take it again (a grammar's token texts, constrain.c) */
        pthread_mutexattr_t ma;
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&e->mu, &ma);
        pthread_mutexattr_destroy(&ma);
    }
    pthread_mutex_init(&e->lora_mu, NULL);
    struct stat st;
    bool in_memory = stat(path, &st) == 0 && cm_engine_weights_in_memory(&o, (uint64_t)st.st_size);
    /* a tensor-parallel coordinator keeps copies of its slice only (take_tp_slice) */
    const bool tp = in_memory && o.nodes && *o.nodes && o.plan.mode_set && o.plan.mode == CM_PARALLEL_TP;
    int rc = tp          ? cm_model_open_for_slice(&e->g, &e->m, path, o.progress, o.progress_ctx, err, errlen)
             : in_memory ? cm_gguf_load(&e->g, path, o.progress, o.progress_ctx, err, errlen)
                         : cm_gguf_open(&e->g, path, o.progress, o.progress_ctx, err, errlen);
    if (rc) {
        cm_engine_free(e);
        return rc;
    }
    char msg[400];
    if (!tp && (rc = cm_model_load(&e->m, &e->g, msg, sizeof msg))) {
        cm_engine_free(e);
        return cm_errf(err, errlen, rc, "'%s': %s", path, msg);
    }
    if ((rc = cm_tokenizer_new(&e->tok, &e->g, msg, sizeof msg))) {
        cm_engine_free(e);
        return cm_errf(err, errlen, rc, "'%s': %s", path, msg);
    }
    if (cm_tokenizer_n_vocab(e->tok) > e->m.hp.n_vocab) {
        cm_engine_free(e);
        return cm_errf(err, errlen, CM_EFORMAT, "'%s': vocabulary of %d tokens exceeds the embedding's %d rows", path,
                       cm_tokenizer_n_vocab(e->tok), e->m.hp.n_vocab);
    }
    int nt = o.n_threads > 0 ? o.n_threads : cm_cpu_count();
    e->pool = cm_pool_new(nt < 1 ? 1 : nt);
    e->n_ctx = o.n_ctx > 0 ? o.n_ctx : CM_MIN(e->m.hp.n_ctx_train, 4096);
    e->n_batch = default_n_batch(&o);
    e->kv_f16 = o.kv_f16;
    e->kv_k = (enum cm_type)o.kv_type_k;
    e->kv_v = (enum cm_type)o.kv_type_v;
    if (o.kv_f16 && e->kv_k == CM_TYPE_F32 && e->kv_v == CM_TYPE_F32) e->kv_k = e->kv_v = CM_TYPE_F16;
    e->kv_rows = (!o.kv_transposed && e->m.hp.arch != CM_ARCH_DEEPSEEK2) || e->kv_k != e->kv_v ||
                 (e->kv_k != CM_TYPE_F32 && e->kv_k != CM_TYPE_F16);
    if (!cm_kv_type_ok(e->kv_k) || !cm_kv_type_ok(e->kv_v) ||
        (e->kv_rows && (!cm_row_size(e->kv_k, e->m.hp.head_dim) || !cm_row_size(e->kv_v, e->m.hp.head_dim)))) {
        int rc = cm_errf(err, errlen, CM_EINVAL,
                         "kv cache types %s/%s are not usable with head size %d (f32, f16, q8_0, q4_0; "
                         "quantized types need a multiple of 32)",
                         cm_type_name(e->kv_k), cm_type_name(e->kv_v), e->m.hp.head_dim);
        cm_engine_free(e);
        return rc;
    }
    e->max_ctx = CM_MAX(e->n_ctx, CM_MIN(e->m.hp.n_ctx_train, 1 << 20));
    e->local_last = e->m.hp.n_layer;
    e->slice = cm_slice_full(&e->m);
    e->test_cluster_delay_ms = cm_config_get()->test_cluster_delay_ms;
    /* before a cluster opens: every stage gets its layers' parts of the set */
    if (o.n_loras > 0 && (rc = cm_engine_load_loras(e, &o, err, errlen))) {
        cm_engine_free(e);
        return rc;
    }
    if (o.nodes && *o.nodes) {
        if (e->n_batch > CM_BATCH_MAX) e->n_batch = CM_BATCH_MAX;
        cm_pipe_opts po = {.nodes = o.nodes,
                           .insecure = o.insecure,
                           .key_file = o.key_file,
                           .plan = o.plan,
                           .tp_compress = o.tp_compress,
                           .take = o.take,
                           .n_ctx = e->n_ctx,
                           .n_seq_max = o.n_seq > 0 ? o.n_seq : 8,
                           .max_batch = e->n_batch,
                           .kv_type_k = (int)e->kv_k,
                           .kv_type_v = (int)e->kv_v,
                           .kv_rows = e->kv_rows,
                           .lora = e->lora,
                           .log = o.log,
                           .log_ctx = o.log_ctx};
        rc = cm_pipe_open(&e->cl, path, &e->g, &e->m, &po, &e->local_last, msg, sizeof msg);
        if (rc) {
            cm_engine_free(e);
            return cm_errf(err, errlen, rc, "cluster: %s", msg);
        }
        if (e->cl) e->max_ctx = e->n_ctx;                        /* the nodes reserved that much */
        if (e->cl && !cm_engine_downstream(e)) take_tp_slice(e); /* every layer here, on our slice */
        else if (!e->cl) cm_model_repack_slice(&e->m, cm_slice_full(&e->m), msg, sizeof msg); /* alone: all of it */
    }
    e->ctx = e->pool ? cm_ctx_new(&e->m, e->n_batch, e->max_ctx, e->pool, msg, sizeof msg) : NULL;
    if (!e->ctx) {
        cm_engine_free(e);
        return cm_errf(err, errlen, CM_ENOMEM, "'%s': %s", path, e->pool ? msg : "cannot start threads");
    }
    if ((rc = cm_engine_gpu_attach(e, &o, err, errlen))) {
        cm_engine_free(e);
        return rc;
    }
    if (e->lora) cm_ctx_set_lora(e->ctx, e->lora);
    e->name = cm_gguf_get_str(&e->g, "general.name");
    if (!e->name) {
        const char *b = strrchr(path, '/');
        e->name = cm_strdup(b ? b + 1 : path);
    }
    *out = e;
    return 0;
}

void cm_engine_free(cm_engine *e) {
    if (!e) return;
    cm_pipe_close(e->cl);
    cm_engine_gpu_release(e);
    cm_ctx_free(e->ctx);
    cm_ctx_free(e->ij_ctx);
    cm_free(e->ij_logits);
    cm_engine_loras_free(e);
    cm_free(e->step_logits);
    cm_engine_gvocab_free(e);
    cm_pool_free(e->pool);
    cm_tokenizer_free(e->tok);
    cm_model_release(&e->m);
    cm_gguf_close(&e->g);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->lora_mu);
    cm_free(e->name);
    cm_free(e);
}

void cm_engine_get_info(const cm_engine *e, cm_engine_info *in) {
    const cm_hparams *hp = &e->m.hp;
    memset(in, 0, sizeof *in);
    in->arch = cm_arch_name_of(hp->arch);
    in->name = e->name;
    in->n_vocab = hp->n_vocab;
    in->n_embd = hp->n_embd;
    in->n_layer = hp->n_layer;
    in->n_head = hp->n_head;
    in->n_head_kv = hp->n_head_kv;
    in->head_dim = hp->head_dim;
    in->n_ff = hp->n_ff;
    in->n_ctx_train = hp->n_ctx_train;
    in->n_ctx = e->n_ctx;
    in->n_threads = cm_pool_size(e->pool);
    in->n_params = e->m.n_params;
    in->weight_bytes = e->m.weight_bytes;
    in->file_bytes = e->g.size;
    in->weights_in_memory = e->g.file.in_memory;
    in->kv_bytes_per_token = cm_kv_bytes_types(&e->m, 0, hp->n_layer, 0, hp->n_head_kv, 1, e->kv_k, e->kv_v);
    in->kv_type_k = cm_type_name(e->kv_k);
    in->kv_type_v = cm_type_name(e->kv_v);
    in->bos = cm_tokenizer_bos(e->tok);
    in->eos = cm_tokenizer_eos(e->tok);
    in->eot = cm_tokenizer_eot(e->tok);
    in->add_bos = cm_tokenizer_add_bos(e->tok);
    in->n_stages = e->cl ? cm_pipe_n_stages(e->cl) : 1;
    in->tp_size = e->cl ? cm_pipe_tp_size(e->cl) : 1;
    in->local_layers = e->local_last;
    if (hp->n_layer > 0 && e->m.layers[0].ffn_down.data) {
        const cm_kernels *k = cm_kernels_get();
        const enum cm_type t = e->m.layers[0].ffn_down.type;
        /* a table whose packed gemm takes every batch (AVX2) has no such bound */
        const bool bound = (unsigned)t < CM_TYPE_COUNT && k->gemm_packed[t] && k->gemm_packed_max < CM_GEMM_PACKED_ALL;
        in->pass_rows_fast = bound ? k->gemm_packed_max : 0;
    }
    in->n_expert = hp->n_expert;
    in->n_expert_used = hp->n_expert_used;
    in->n_ff_exp = hp->n_ff_exp;
    in->n_params_active = e->m.n_params_active;
    in->weight_bytes_active = e->m.weight_bytes_active;
}

const char *cm_engine_plan(const cm_engine *e) { return e->cl ? cm_pipe_plan_text(e->cl) : NULL; }

bool cm_engine_tp_stats(const cm_engine *e, uint64_t *data_sent, uint64_t *wire_sent, uint64_t *ops, uint64_t *rows) {
    /* a group of every machine, or stage 0's group of a hybrid plan */
    if (!e->cl || (cm_engine_downstream(e) && cm_pipe_tp_size(e->cl) <= 1)) return false;
    cm_pipe_tp_stats(e->cl, data_sent, wire_sent, ops, rows);
    return true;
}

cm_slice cm_engine_slice(const cm_engine *e) {
    if (cm_engine_downstream(e)) return cm_pipe_tp_size(e->cl) > 1 ? cm_pipe_tp_slice(e->cl) : cm_slice_full(&e->m);
    return e->slice;
}

void cm_engine_pipe_top(cm_engine *e, int slot, cm_sample_info *info) {
    int32_t ids[CM_SAMPLER_MAX_PROBS];
    float lp[CM_SAMPLER_MAX_PROBS];
    int n = cm_pipe_last_top(e->cl, slot, ids, lp, CM_SAMPLER_MAX_PROBS);
    info->n_top = n;
    for (int i = 0; i < n; i++) info->top[i] = (cm_token_logprob){ids[i], lp[i]};
}

int cm_engine_forward(cm_engine *e, const cm_batch *b, cm_forward_args *a, cm_session *const *sess, char *err,
                      size_t errlen) {
    a->slice = e->slice;
    if (e->cl) {
        int32_t slots[CM_BATCH_MAX];
        if (b->n > CM_BATCH_MAX) return cm_errf(err, errlen, CM_EINVAL, "batch of %d rows", b->n);
        for (int k = 0; k < a->n_kvs; k++) { /* the group's members apply each sequence's adapter scales */
            int rc = cm_session_lora_sync(sess[k], err, errlen);
            if (rc) return rc;
        }
        for (int i = 0; i < b->n; i++) slots[i] = sess[b->seq[i]]->slot;
        int rc = cm_pipe_stage0(e->cl, b->tokens, b->pos, slots, b->n, b->logits, a, err, errlen);
        if (rc) return rc;
        if (e->test_cluster_delay_ms) cm_sleep_ms(e->test_cluster_delay_ms);
    }
    const float *ls[CM_BATCH_MAX];
    int rc = cm_engine_lora_rows(e, a, sess, ls, CM_BATCH_MAX, err, errlen);
    if (!rc) rc = cm_forward(e->ctx, b, a, err, errlen);
    a->lora_scales = NULL; /* ls dies here */
    return rc;
}

int cm_engine_maintain(cm_engine *e, char *err, size_t errlen) {
    if (!e->cl) return 0;
    int gen = cm_pipe_generation(e->cl);
    uint64_t hits[1024];
    for (int il = 0; e->ctx && il < e->m.hp.n_layer; il++) { /* its replicas may follow them */
        int nx = cm_ctx_expert_hits_layer(e->ctx, il, hits, 1024);
        if (nx <= 0 || nx > 1024) break;
        cm_pipe_expert_observe(e->cl, il, hits, nx);
    }
    int rc = cm_pipe_maintain(e->cl, err, errlen);
    /* a re-formed group gives this machine another slice (sessions re-shape:
     * cm_session_tp_sync; downstream, cm_engine_slice reads it from the plan) */
    if (cm_pipe_generation(e->cl) != gen && !cm_engine_downstream(e)) take_tp_slice(e);
    return rc;
}

bool cm_engine_hop_stats(const cm_engine *e, uint64_t *bytes, uint64_t *frames, uint64_t *rows) {
    if (!cm_engine_downstream(e)) return false;
    cm_pipe_hop_stats(e->cl, bytes, frames, rows);
    return true;
}

/* This machine's counts, plus in a cluster what the later stages reported. */
int cm_engine_expert_hits(const cm_engine *e, uint64_t *hits, int n) {
    return cm_engine_expert_hits_layer(e, -1, hits, n);
}
int cm_engine_expert_hits_layer(const cm_engine *e, int il, uint64_t *hits, int n) {
    int nx = e->ctx ? cm_ctx_expert_hits_layer(e->ctx, il, hits, n) : 0;
    if (e->cl && nx > 0 && n >= nx) cm_pipe_expert_reported(e->cl, il, hits, nx);
    return nx;
}
bool cm_engine_expert_info(const cm_engine *e, cm_engine_experts *out) {
    if (!e->cl) return false;
    cm_pipe_expert_info(e->cl, out);
    return true;
}

int cm_engine_members(const cm_engine *e, cm_engine_member *out, int max) {
    return e->cl ? cm_pipe_members(e->cl, out, max) : 0;
}

int cm_engine_type_usage(const cm_engine *e, cm_type_usage *out, int max) {
    int n = 0;
    for (uint64_t i = 0; i < e->g.n_tensors; i++) {
        const cm_gguf_tensor_info *ti = &e->g.tensors[i];
        const char *name = cm_type_name(ti->type);
        int k = 0;
        while (k < n && k < max && strcmp(out[k].type, name)) k++;
        if (k == n) {
            if (n < max) out[n] = (cm_type_usage){.type = name};
            n++;
        }
        if (k < max) {
            uint64_t ne = 1;
            for (int d = 0; d < ti->n_dims; d++) ne *= (uint64_t)ti->ne[d];
            out[k].n_tensors++;
            out[k].bytes += ti->nbytes;
            out[k].n_elements += ne;
        }
    }
    return n;
}

int cm_engine_tokenize(const cm_engine *e, const char *text, size_t len, bool add_bos, bool parse_special, int32_t *out,
                       int max, char *err, size_t errlen) {
    unsigned flags = (add_bos ? CM_TOK_ADD_SPECIAL : 0) | (parse_special ? CM_TOK_PARSE_SPECIAL : 0);
    size_t n = 0;
    if (!out || max <= 0) { /* only counting: the tokenizer wants a real buffer */
        cm_token *tmp = NULL;
        int rc = cm_tokenizer_encode_alloc(e->tok, text, len, flags, &tmp, &n, err, errlen);
        cm_free(tmp);
        if (rc) return rc;
        return n > (size_t)INT32_MAX ? CM_ERANGE : (int)n;
    }
    int rc = cm_tokenizer_encode(e->tok, text, len, flags, out, (size_t)max, &n, err, errlen);
    if (rc && rc != CM_ERANGE) return rc;
    return n > (size_t)INT32_MAX ? CM_ERANGE : (int)n;
}

int cm_engine_token_piece(const cm_engine *e, int32_t id, char *buf, size_t cap) {
    size_t n;
    const char *p = cm_tokenizer_piece(e->tok, id, false, &n);
    if (!p) return CM_ERANGE;
    if (n > cap) n = cap;
    memcpy(buf, p, n);
    return (int)n;
}

/* The template a chat is rendered with: the one named, else the one the
 * model's tokenizer.chat_template is recognised as. */
static int chat_template_of(const cm_engine *e, const char *template_name, cm_chat_template *t, char *err,
                            size_t errlen) {
    if (template_name) return cm_chat_template_by_name(t, template_name, err, errlen);
    const cm_gguf_kv *kv = cm_gguf_find_kv(&e->g, "tokenizer.chat_template");
    if (!kv || kv->type != CM_GGUF_STRING)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "the model has no chat template; choose one with --chat-template (%s)",
                       cm_chat_template_names());
    return cm_chat_template_detect(t, kv->v.str.ptr, (size_t)kv->v.str.len, err, errlen);
}

int cm_engine_chat_family(const cm_engine *e, const char *template_name, char *err, size_t errlen) {
    cm_chat_template t;
    int rc = chat_template_of(e, template_name, &t, err, errlen);
    return rc ? rc : (int)t.family;
}

int cm_engine_chat_render(const cm_engine *e, const char *template_name, const cm_chat_msg *msgs, size_t n,
                          bool add_generation_prompt, cm_buf *out, char *err, size_t errlen) {
    cm_chat_template t;
    int rc = chat_template_of(e, template_name, &t, err, errlen);
    if (rc) return rc;
    /* BOS/EOS texts, NUL-terminated copies (vocabulary texts are not). */
    char bos[64] = "", eos[64] = "";
    size_t len;
    const char *p;
    if ((p = cm_tokenizer_text(e->tok, cm_tokenizer_bos(e->tok), &len)) && len < sizeof bos)
        memcpy(bos, p, len), bos[len] = 0;
    if ((p = cm_tokenizer_text(e->tok, cm_tokenizer_eos(e->tok), &len)) && len < sizeof eos)
        memcpy(eos, p, len), eos[len] = 0;
    cm_chat_opts o = {.add_generation_prompt = add_generation_prompt,
                      .tokenizer_adds_bos = cm_tokenizer_add_bos(e->tok),
                      .bos = bos,
                      .eos = eos};
    return cm_chat_render(&t, msgs, n, &o, out, err, errlen);
}

void cm_gen_params_default(cm_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->n_predict = 128;
    cm_sampler_params_default(&p->sampling);
}

const char *cm_finish_name(enum cm_finish f) {
    static const char *const names[CM_FINISH_COUNT] = {"length", "eog", "stop", "cancel", "ctx"};
    return (unsigned)f < CM_FINISH_COUNT ? names[f] : "unknown";
}

/* ---- sessions ---- */

cm_session *cm_session_new(cm_engine *e, int n_ctx, char *err, size_t errlen) {
    if (n_ctx <= 0) n_ctx = e->n_ctx;
    if (n_ctx > e->max_ctx) {
        cm_errf(err, errlen, CM_EINVAL, "context of %d exceeds the engine's maximum of %d", n_ctx, e->max_ctx);
        return NULL;
    }
    cm_session *s = cm_calloc(1, sizeof *s);
    if (!s) {
        cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        return NULL;
    }
    s->e = e;
    s->n_ctx = n_ctx;
    s->slot = -1;
    if (e->cl) {
        s->slot = cm_pipe_seq_acquire(e->cl, err, errlen);
        s->pipe_gen = cm_pipe_generation(e->cl);
        if (s->slot < 0) {
            cm_free(s);
            return NULL;
        }
    }
    if (cm_engine_downstream(e)) {
        s->hidden = cm_malloc((size_t)e->n_batch * (size_t)e->m.hp.n_embd * sizeof(float));
        if (!s->hidden) {
            cm_pipe_seq_release(e->cl, s->slot);
            cm_free(s);
            cm_errf(err, errlen, CM_ENOMEM, "out of memory");
            return NULL;
        }
    }
    if (cm_kv_init_types(&s->kv, &e->m, 0, e->local_last, cm_engine_slice(e), n_ctx, e->kv_k, e->kv_v, e->kv_rows, err,
                         errlen)) {
        if (s->slot >= 0) cm_pipe_seq_release(e->cl, s->slot);
        cm_free(s->hidden);
        cm_free(s);
        return NULL;
    }
    s->hist = cm_calloc((size_t)n_ctx + 1, sizeof *s->hist);
    s->logits = cm_calloc((size_t)e->m.hp.n_vocab, sizeof *s->logits);
    s->piece_cap = cm_detok_max_out(e->tok);
    s->piece = cm_malloc(s->piece_cap);
    if (!s->hist || !s->logits || !s->piece || cm_session_lora_init(s)) {
        cm_session_free(s);
        cm_errf(err, errlen, CM_ENOMEM, "out of memory for a session of %d positions", n_ctx);
        return NULL;
    }
    return s;
}

void cm_session_free(cm_session *s) {
    if (!s) return;
    cm_session_pipe_drain(s); /* never a slot with an answer on its way */
    if (s->slot >= 0) cm_pipe_seq_release(s->e->cl, s->slot);
    cm_free(s->hidden);
    cm_session_step_release(s);
    cm_kv_release(&s->kv);
    cm_free(s->lora);
    cm_free(s->lora_sent);
    cm_free(s->hist);
    cm_free(s->logits);
    cm_free(s->piece);
    cm_free(s);
}

int cm_session_n_ctx(const cm_session *s) { return s->n_ctx; }
int cm_session_n_past(const cm_session *s) { return s->kv.n_past; }
const int32_t *cm_session_tokens(const cm_session *s, int *n) {
    *n = s->n_hist;
    return s->hist;
}
void cm_session_cancel(cm_session *s) { atomic_store(&s->cancel, 1); }
cm_timings cm_session_timings(const cm_session *s) { return s->t; }

/* Cluster: evaluate hist[kv.n_past .. upto) through our layers and send the
 * hidden states on; want (enum cm_want) is what the last stage does after
 * upto - 1 (CM_PIPE_WANT_HIDDEN: after every row). */
int cm_engine_eval_cluster(cm_session *s, int upto, int want, char *err, size_t errlen) {
    cm_engine *e = s->e;
    int32_t pos[CM_BATCH_MAX], seq[CM_BATCH_MAX] = {0};
    int bmax = CM_MIN(e->n_batch, CM_BATCH_MAX);
    cm_kv *kvs[1] = {&s->kv};
    /* After a recovery the new stages know nothing of this sequence:
     * recompute it from position 0 (same bits here, new caches there). */
    if (s->pipe_gen != cm_pipe_generation(e->cl)) {
        cm_slice sl = cm_engine_slice(e);
        if (sl.h0 != s->kv.h0 || sl.h1 != s->kv.h1) { /* our group changed: our KV heads too */
            cm_kv nk;
            int rc =
                cm_kv_init_types(&nk, &e->m, 0, e->local_last, sl, s->n_ctx, e->kv_k, e->kv_v, e->kv_rows, err, errlen);
            if (rc) return rc;
            cm_kv_release(&s->kv);
            s->kv = nk;
        }
        cm_kv_truncate(&s->kv, 0);
        s->pipe_gen = cm_pipe_generation(e->cl);
        int rc = cm_session_seq_restart(s, err, errlen);
        if (rc) return rc;
    }
    int rc0 = cm_session_lora_sync(s, err, errlen); /* the stages apply our adapter scales */
    if (rc0) return rc0;
    const float *ls[1] = {s->lora};
    while (s->kv.n_past < upto) {
        if (atomic_load(&s->cancel)) return cm_errf(err, errlen, CM_ECANCELED, "canceled");
        int nb = CM_MIN(bmax, upto - s->kv.n_past);
        int p0 = s->kv.n_past;
        for (int i = 0; i < nb; i++) pos[i] = p0 + i;
        bool last = p0 + nb == upto;
        cm_batch b = {.n = nb, .tokens = s->hist + p0, .pos = pos, .seq = seq};
        cm_forward_args a = {.layer_first = 0,
                             .layer_last = e->local_last,
                             .slice = cm_engine_slice(e),
                             .kvs = kvs,
                             .n_kvs = 1,
                             .out_hidden = s->hidden,
                             .lora_scales = s->lora ? ls : NULL};
        /* The send stays under the lock so micro-batches leave in the order
         * the stage-0 caches saw them. Hybrid: our group's other members get
         * the token ids first and meet us in the all-reduces. */
        pthread_mutex_lock(&e->mu);
        int32_t slots[256];
        for (int i = 0; i < nb; i++) slots[i] = s->slot;
        int rc = cm_pipe_stage0(e->cl, b.tokens, pos, slots, nb, NULL, &a, err, errlen);
        if (!rc) rc = cm_forward(e->ctx, &b, &a, err, errlen);
        if (!rc)
            rc = cm_pipe_send(e->cl, s->slot, s->hidden, pos, nb, last || want == CM_PIPE_WANT_HIDDEN ? want : 0, err,
                              errlen);
        pthread_mutex_unlock(&e->mu);
        if (rc) {
            cm_kv_truncate(&s->kv, p0); /* the next stages may not have it */
            return rc;
        }
        if (e->test_cluster_delay_ms) cm_sleep_ms(e->test_cluster_delay_ms);
    }
    return 0;
}

/* We sample: after the group was re-formed (cm_pipe_tp_recover) our
 * slice changed and the members know nothing of this sequence: a KV cache of
 * the new slice, empty, so the next evaluation recomputes from position 0. */
int cm_session_tp_sync(cm_session *s, char *err, size_t errlen) {
    cm_engine *e = s->e;
    if (!e->cl || cm_engine_downstream(e) || s->pipe_gen == cm_pipe_generation(e->cl)) return 0;
    cm_kv_release(&s->kv);
    s->have_logits = false;
    int rc = cm_kv_init_types(&s->kv, &e->m, 0, e->local_last, e->slice, s->n_ctx, e->kv_k, e->kv_v, e->kv_rows, err,
                              errlen);
    if (!rc) s->pipe_gen = cm_pipe_generation(e->cl);
    return rc;
}

int cm_engine_tp_recover(cm_engine *e, char *err, size_t errlen) {
    int rc = cm_pipe_tp_recover(e->cl, err, errlen);
    if (!rc) take_tp_slice(e);
    return rc;
}

/* Evaluate hist[kv.n_past .. upto) in chunks; logits of the last one when
 * upto == n_hist. On a cluster the last token stays pending: it is evaluated
 * with the sampling step (the last stage samples; its logits never travel). */
static int eval_upto(cm_session *s, int upto, char *err, size_t errlen);
static int eval_pending(cm_session *s, char *err, size_t errlen) { return eval_upto(s, s->n_hist, err, errlen); }

static int eval_upto(cm_session *s, int upto, char *err, size_t errlen) {
    cm_engine *e = s->e;
    const bool whole = upto >= s->n_hist;
    if (cm_engine_downstream(e)) {
        /* A failure seen since the last step, or during this prefill: recover
         * and evaluate again (the caller's thread is the pipe's only user
         * here; after a re-plan the whole sequence is recomputed). */
        int rc = 0;
        for (int attempt = 0; attempt < 4; attempt++) {
            rc = cm_pipe_failed(e->cl) ? cm_pipe_recover(e->cl, err, errlen) : 0;
            if (!rc) rc = cm_engine_eval_cluster(s, whole ? s->n_hist - 1 : upto, false, err, errlen);
            if (!rc || rc == CM_ECANCELED || !cm_pipe_failed(e->cl)) break;
        }
        s->have_logits = !rc && s->n_hist == s->kv.n_past + 1;
        return rc;
    }
    int32_t pos[CM_BATCH_MAX], seq[CM_BATCH_MAX] = {0};
    int bmax = CM_MIN(e->n_batch, CM_BATCH_MAX);
    cm_kv *kvs[1] = {&s->kv};
    int recoveries = 0;
    int rc = cm_session_tp_sync(s, err, errlen);
    if (rc) return rc;
    if (!whole) s->have_logits = false;
    while (s->kv.n_past < upto) {
        if (atomic_load(&s->cancel)) return cm_errf(err, errlen, CM_ECANCELED, "canceled");
        int nb = CM_MIN(bmax, upto - s->kv.n_past);
        for (int i = 0; i < nb; i++) pos[i] = s->kv.n_past + i;
        bool last = s->kv.n_past + nb == s->n_hist;
        cm_batch b = {.n = nb, .tokens = s->hist + s->kv.n_past, .pos = pos, .seq = seq};
        cm_forward_args a = {.layer_first = 0,
                             .layer_last = e->m.hp.n_layer,
                             .slice = e->slice,
                             .kvs = kvs,
                             .n_kvs = 1,
                             .out_logits = last ? s->logits : NULL};
        pthread_mutex_lock(&e->mu);
        rc = cm_engine_forward(e, &b, &a, &s, err, errlen);
        pthread_mutex_unlock(&e->mu);
        if (rc && e->cl && rc != CM_ECANCELED && recoveries++ < 3) {
            /* A member of the group was lost: re-form it, start over. */
            rc = cm_engine_tp_recover(e, err, errlen);
            if (!rc) rc = cm_session_tp_sync(s, err, errlen);
            if (!rc) continue;
        }
        if (rc) {
            s->have_logits = false;
            return rc;
        }
        s->have_logits = last;
    }
    return 0;
}

int cm_session_recompute(cm_session *s, char *err, size_t errlen) { return eval_pending(s, err, errlen); }

static int check_ids(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->e->m.hp.n_vocab)
            return cm_errf(err, errlen, CM_EINVAL, "token id %d is out of the vocabulary", ids[i]);
    return 0;
}

int cm_session_prompt_begin(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen) {
    atomic_store(&s->cancel, 0);
    memset(&s->t, 0, sizeof s->t);
    if (n < 1) return cm_errf(err, errlen, CM_EINVAL, "empty prompt");
    if (n > s->n_ctx)
        return cm_errf(err, errlen, CM_ENOSPACE, "prompt of %d tokens does not fit the context of %d", n, s->n_ctx);
    int rc = check_ids(s, ids, n, err, errlen);
    if (!rc) rc = cm_session_tp_sync(s, err, errlen); /* after a re-formed group nothing is cached */
    if (rc) return rc;
    /* Keep the common prefix already in the cache; always re-evaluate at
     * least the last token so its logits are fresh. */
    int keep = 0;
    while (keep < s->kv.n_past && keep < n - 1 && s->hist[keep] == ids[keep]) keep++;
    cm_kv_rewind(&s->kv, keep); /* the pages past keep stay for the new tokens (model.h: the pool) */
    memcpy(s->hist + keep, ids + keep, (size_t)(n - keep) * sizeof *ids);
    s->n_hist = n;
    s->have_logits = false;
    s->t.n_prompt = n - keep;
    return 0;
}

int cm_session_prompt_step(cm_session *s, int max_tokens, char *err, size_t errlen) {
    const int end = cm_engine_downstream(s->e) ? s->n_hist - 1 : s->n_hist; /* a cluster keeps the last token pending */
    int upto = max_tokens > 0 && s->kv.n_past + max_tokens < end ? s->kv.n_past + max_tokens : s->n_hist;
    double t0 = cm_now_s();
    int rc = eval_upto(s, upto, err, errlen);
    s->t.prompt_s += cm_now_s() - t0;
    if (rc) return rc;
    return end - s->kv.n_past > 0 ? end - s->kv.n_past : 0;
}

int cm_session_set_prompt(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen) {
    int rc = cm_session_prompt_begin(s, ids, n, err, errlen);
    return rc ? rc : cm_session_prompt_step(s, 0, err, errlen);
}

int cm_session_append(cm_session *s, const int32_t *ids, int n, char *err, size_t errlen) {
    atomic_store(&s->cancel, 0);
    memset(&s->t, 0, sizeof s->t);
    if (n < 1) return 0;
    /* A token sampled last time but not yet evaluated stays in the history
     * and is evaluated with these. */
    if (n > s->n_ctx - s->n_hist)
        return cm_errf(err, errlen, CM_ENOSPACE, "%d more tokens do not fit the context (%d of %d used)", n, s->n_hist,
                       s->n_ctx);
    int rc = check_ids(s, ids, n, err, errlen);
    if (rc) return rc;
    memcpy(s->hist + s->n_hist, ids, (size_t)n * sizeof *ids);
    s->n_hist += n;
    double t0 = cm_now_s();
    rc = eval_pending(s, err, errlen);
    s->t.n_prompt = n;
    s->t.prompt_s = cm_now_s() - t0;
    return rc;
}

/* One generation loop for every caller: start, then step this one session
 * until it ends, then finish (batch.c). A session alone thus gets exactly
 * what it gets in serve's crowd, by construction. */
int cm_session_generate(cm_session *s, const cm_gen_params *p, cm_token_cb cb, void *user, cm_gen_result *res,
                        char *err, size_t errlen) {
    cm_engine *e = s->e;
    memset(res, 0, sizeof *res);
    res->stop_index = -1;
    atomic_store(&s->cancel, 0);
    if (err && errlen) err[0] = 0;
    if (s->n_hist >
        s->kv.n_past + (cm_engine_downstream(e) ? 1 : 0)) { /* continuing: evaluate the last sampled token */
        int r = eval_pending(s, err, errlen);
        if (r) return r;
    }
    if (!s->have_logits) return cm_errf(err, errlen, CM_ESTATE, "generate before a prompt was evaluated");
    int rc = cm_session_start(s, p, cb, user, err, errlen);
    if (rc) return rc;
    cm_session *one[1] = {s};
    while (cm_session_running(s) && rc >= 0) rc = cm_engine_step(e, one, 1, err, errlen);
    if (cm_session_running(s)) { /* an error that did not end it: end it now */
        cm_session_cancel(s);
        cm_engine_step(e, one, 1, NULL, 0);
    }
    cm_session_finish(s, res);
    if (rc == CM_ECANCELED) { /* canceled while evaluating: a canceled generation, not a failure */
        res->finish = CM_FINISH_CANCEL;
        rc = 0;
    }
    if (rc > 0) rc = 0;
    if (rc && err && !*err) cm_errf(err, errlen, rc, "generation failed: %s", cm_strerror(rc));
    return rc;
}
