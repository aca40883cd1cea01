/*
 * node_stage.c: how `cumulo node` takes a stage (node.c serves the
 * connections and runs it). For an ASSIGN it finds the model by sha256
 * (--models, the pulled models, the cache) or fetches this stage's tensors
 * from the coordinator into the cache, loads the model (mapped, or read into
 * huge-page memory when a slice fits), checks the assignment against it
 * (layers, slice, experts), sizes every buffer of the token loop (KV caches,
 * samplers, hidden-state rows), dials the group's members and the next
 * stage, swaps the stage in under n->mu and answers READY. A newer ASSIGN
 * that arrives while weights stream supersedes the one being loaded. It
 * never keeps a half-loaded stage: any failure frees it and READY carries
 * the reason.
 */
#include "cluster/node_impl.h"
#include "cluster/weights.h"
#include "hub/hub.h"
#include "model/lora.h"

#include "os/os.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void cm_node_stage_free(stage *s) {
    if (!s) return;
    cm_node_gpu_stage_free(s); /* before the model it mirrors */
    cm_node_train_stop(s);     /* before the link to the next stage it reads */
    cm_free(s->lora_sc);
    cm_free((void *)s->lora_row);
    pthread_mutex_destroy(&s->fsend_mu);
    if (s->next) cm_conn_close(s->next, "plan ended");
    for (int i = 0; i < CM_COLL_MAX_MEMBERS; i++)
        if (s->relay[i]) cm_conn_close(s->relay[i], "plan ended");
    if (s->coll) {
        /* The member's traffic, for the operator and the tests (one line). */
        cm_coll_stats st;
        cm_coll_stats_get(s->coll, &st);
        if (s->experts.ep) /* expert group: its exchange traffic (tests/sh/cluster_ep.sh sums these) */
            fprintf(
                stderr,
                "expert-parallel rank %u of %u (epoch %llu), stage %u layers [%u, %u) experts [%d, %d): %llu rows, %llu expert exchanges, %llu element bytes / %llu wire bytes sent\n",
                s->as.tp_rank, s->as.tp_size, (unsigned long long)s->as.epoch, s->as.stage, s->as.layer_begin,
                s->as.layer_end, s->experts.e0, s->experts.e1, (unsigned long long)s->rows,
                (unsigned long long)st.gather_ops, (unsigned long long)st.gather_data_sent,
                (unsigned long long)st.total.wire_sent);
        else
            fprintf(
                stderr,
                "tensor-parallel rank %u of %u (epoch %llu), stage %u layers [%u, %u): %llu rows, %llu all-reduces, %llu element bytes / %llu wire bytes sent\n",
                s->as.tp_rank, s->as.tp_size, (unsigned long long)s->as.epoch, s->as.stage, s->as.layer_begin,
                s->as.layer_end, (unsigned long long)s->rows, (unsigned long long)(st.ops - st.head_ops),
                (unsigned long long)(st.total.data_sent - st.head_data_sent),
                (unsigned long long)(st.total.wire_sent - st.head_wire_sent));
        if (st.head_ops) /* the split head's logits, to rank 0 */
            fprintf(
                stderr,
                "tensor-parallel head, member %u of %u (epoch %llu): %llu gathers to rank 0, %llu element bytes sent\n",
                s->as.tp_rank, s->as.tp_size, (unsigned long long)s->as.epoch, (unsigned long long)st.head_ops,
                (unsigned long long)st.head_data_sent);
        if (cm_config_get()->tp_trace && s->t0_ns) /* where the member's time went (bench/tp_ratio.sh) */
            fprintf(stderr,
                    "tp trace: member %u: %.3f s assigned, %.3f s in FORWARDs (%llu of one row: %.2f ms each, %.2f ms "
                    "CPU, of which all-reduce %.2f ms), %.3f s waiting for FORWARDs (%.1f us from a one-row FORWARD's "
                    "end to the next one's arrival)\n",
                    s->as.tp_rank, (double)(cm_now_ns() - s->t0_ns) * 1e-9, (double)s->fwd_ns * 1e-9,
                    (unsigned long long)s->n_fwd1, s->n_fwd1 ? (double)s->fwd1_ns * 1e-6 / (double)s->n_fwd1 : 0.0,
                    s->n_fwd1 ? (double)s->fwd1_cpu_ns * 1e-6 / (double)s->n_fwd1 : 0.0,
                    s->n_fwd1 ? st.small_busy_s * 1e3 / (double)s->n_fwd1 : 0.0,
                    (double)(cm_now_ns() - s->t0_ns - s->fwd_ns) * 1e-9,
                    s->n_gap1 ? (double)s->gap1_ns * 1e-3 / (double)s->n_gap1 : 0.0);
    }
    if (s->holders) /* one line per assignment (tests/sh/cluster_ep_replicas.sh reads it) */
        fprintf(stderr, "expert-parallel rank %u of %u (epoch %llu): %llu rows of replicated experts computed here\n",
                s->as.tp_rank, s->as.tp_size, (unsigned long long)s->as.epoch, (unsigned long long)s->pack.shared_rows);
    cm_free(s->holders);
    cm_free(s->ep_sent);
    cm_free(s->ep_delta);
    cm_ep_pack_free(&s->pack);
    cm_coll_free(s->coll);
    cm_coll_mesh_close(s->tp, CM_COLL_MAX_MEMBERS);
    for (int i = 0; i < s->n_seq; i++) {
        if (s->kv) cm_kv_release(&s->kv[i]);
        if (s->smp) cm_sampler_free(s->smp[i]);
    }
    cm_free(s->kv);
    cm_free(s->kvp);
    cm_free(s->smp);
    cm_free(s->in);
    cm_free(s->out);
    cm_free(s->logits);
    cm_ctx_free(s->ctx);
    cm_lora_free(s->lora); /* after the context that applied it */
    cm_pool_free(s->pool);
    cm_model_release(&s->m);
    cm_gguf_close(&s->g);
    cm_free(s);
}

/* Where is the model with this sha256? --models DIR/<name> (or, without
 * --models, the models `cumulo pull` keeps: DIR/org/repo/<name>), then the
 * cache. */
static int find_model(node *n, const cm_msg_assign *a, char *path, size_t cap, char *err, size_t errlen) {
    char want[65];
    cm_sha256_hex(a->model_sha256, want);
    char cand[9][600], mdir[600];
    int nc = 0;
    const char *dir = n->o->models_dir && *n->o->models_dir ? n->o->models_dir : NULL;
    if (!dir && !cm_models_dir(mdir, sizeof mdir, NULL, 0)) dir = mdir;
    if (dir && *a->model_name) nc = cm_models_find(dir, a->model_name, cand[0], sizeof cand[0], 8);
    snprintf(cand[nc++], sizeof cand[0], "%s/models/%s.gguf", n->cache_dir, want);
    for (int i = 0; i < nc; i++) {
        if (!cm_file_exists(cand[i])) continue;
        uint8_t h[32];
        char e[200];
        if (cm_file_sha256(cand[i], h, e, sizeof e)) continue;
        if (memcmp(h, a->model_sha256, 32)) {
            CM_LOGW("'%s' is not the assigned model (sha256 differs)", cand[i]);
            continue;
        }
        size_t l = strlen(cand[i]);
        if (l >= cap) continue;
        memcpy(path, cand[i], l + 1);
        return 0;
    }
    return cm_errf(err, errlen, CM_ENOENT, "model %.12s... ('%s') is not on this node", want, a->model_name);
}

/* TP group set-up: dial and greet every lower rank (but rank 0 of stage 0:
 * the coordinator, which has no listener, dials every member itself), then
 * wait until the others have greeted us, and make the collective. */
static int tp_connect(node *n, stage *s, char *err, size_t errlen) {
    const cm_msg_assign *a = &s->as;
    int me = a->tp_rank, k = a->tp_size;
    int lo = a->stage == 0 ? 1 : 0; /* lowest rank this member dials */
    char e[400];
    for (int j = lo; j < me; j++) {
        cm_msg_hello peer;
        int rc = cm_cluster_dial(a->tp_peers[j], &n->cfg, &n->hello, &s->tp[j], &peer, e, sizeof e);
        if (!rc) rc = cm_coll_mesh_greet(s->tp[j], me, 10000, e, sizeof e);
        if (!rc) rc = cm_tp_greet_epoch(s->tp[j], a->epoch, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "tensor-parallel rank %d at %s: %s", j, a->tp_peers[j], e);
    }
    uint64_t deadline = cm_now_ns() + 30ull * 1000000000ull;
    for (;;) {
        int missing = -1;
        uint64_t newer = 0;
        pthread_mutex_lock(&n->mu);
        for (int j = 0; j < k; j++) {
            /* A member of a newer plan greeted us: ours was re-planned (a
             * member lost while the cluster opened, coord_recover.c) and its
             * ASSIGN waits behind this one: stop waiting for the lost one. */
            if (n->tp_in[j] && n->tp_in_epoch[j] > a->epoch) newer = n->tp_in_epoch[j];
            if (j == me || (j >= lo && j < me)) continue;
            if (!s->tp[j] && n->tp_in[j] && n->tp_in_epoch[j] == a->epoch) {
                s->tp[j] = n->tp_in[j];
                n->tp_in[j] = NULL;
            }
            if (!s->tp[j] && missing < 0) missing = j;
        }
        pthread_mutex_unlock(&n->mu);
        if (missing < 0) break;
        if (newer)
            return cm_errf(err, errlen, CM_ECANCELED,
                           "tensor-parallel rank %d did not connect, and a plan of epoch %llu has begun", missing,
                           (unsigned long long)newer);
        if (cm_now_ns() > deadline || atomic_load(n->stop))
            return cm_errf(err, errlen, CM_ETIMEDOUT, "tensor-parallel rank %d did not connect within 30 s", missing);
        cm_sleep_ms(5);
    }
    cm_coll_cfg cc = {.rank = me,
                      .size = k,
                      .max_n = (int64_t)CM_BATCH_MAX * s->m.hp.n_embd,
                      .timeout_ms = cm_cluster_lost_ms(),
                      .epoch = a->epoch,
                      .compress = (a->flags & CM_ASSIGN_F_TP_Q8) != 0};
    for (int j = 0; j < k; j++) cc.peers[j] = j == me ? NULL : s->tp[j];
    int rc = cm_coll_new(&cc, &s->coll, e, sizeof e);
    return rc ? cm_errf(err, errlen, rc, "all-reduce: %s", e) : 0;
}

/* path: the whole model (from --models or the cache; mapped, since only this
 * stage's layers of it are read, unless the stage is every layer of a
 * tensor-parallel group) or a slice of only this stage's tensors (read into
 * huge-page memory when it fits: every byte is read per token). */
static int stage_load(node *n, stage *s, const char *path, bool slice_file, char *err, size_t errlen) {
    const cm_msg_assign *a = &s->as;
    char e[400];
    struct stat st;
    /* An expert group's slice file holds only this member's experts (the
     * rest are holes): mapped, so the holes are never read into memory.
     * NEEDSWORK: read just the held ranges into huge pages. */
    /* A TP member over every layer reads a slice of each per token: mapped
     * 4 KiB pages and no repacked rows cost it ~1/4 of its speed (HISTORY.md,
     * 2026-12-03), so it copies its slice (cm_model_open_for_slice: from
     * the mapping when every weight of it repacks, else the whole file read
     * in). NEEDSWORK: plain copies of the slices of the other types. */
    bool tp_all = a->tp_size > 1 && a->layer_begin == 0 && a->layer_end == a->n_layers;
    bool in_memory = (slice_file || tp_all) && !n->o->mmap && !(a->flags & CM_ASSIGN_F_EP) && stat(path, &st) == 0 &&
                     cm_gguf_worth_loading((uint64_t)st.st_size);
    int rc;
    if (in_memory && a->tp_size > 1) { /* copies of its slice only (below), from a mapping where they can be */
        if ((rc = cm_model_open_for_slice(&s->g, &s->m, path, NULL, NULL, e, sizeof e)))
            return cm_errf(err, errlen, rc, "%s", e);
    } else {
        rc = in_memory ? cm_gguf_load(&s->g, path, NULL, NULL, e, sizeof e)
                       : cm_gguf_open(&s->g, path, NULL, NULL, e, sizeof e);
        if (!rc) rc = cm_model_load(&s->m, &s->g, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "'%s': %s", path, e);
    }
    const cm_hparams *hp = &s->m.hp;
    if ((int)a->n_layers != hp->n_layer || (int)a->layer_end > hp->n_layer)
        return cm_errf(err, errlen, CM_EINVAL, "assignment of layers [%u, %u) of %u does not match the model's %d",
                       a->layer_begin, a->layer_end, a->n_layers, hp->n_layer);
    bool tp = a->tp_size > 1;
    s->slice = (cm_slice){(int)a->head_begin, (int)a->head_end, (int)a->ffn_begin, (int)a->ffn_end};
    if (a->flags & CM_ASSIGN_F_EP) { /* expert group: whole layers, our experts (checked by cm_slice_check) */
        if (a->expert_bounds[a->tp_size] != hp->n_expert)
            return cm_errf(err, errlen, CM_EINVAL, "expert bounds end at %u, the model has %d experts",
                           a->expert_bounds[a->tp_size], hp->n_expert);
        s->experts.ep = true;
        s->experts.e0 = a->expert_bounds[a->tp_rank];
        s->experts.e1 = a->expert_bounds[a->tp_rank + 1];
        if ((a->flags & CM_ASSIGN_F_REPLICAS) && !(s->holders = cm_ep_holders_of(a, hp->n_expert)))
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    if (!tp && (a->head_begin != 0 || (int)a->head_end != cm_slice_full(&s->m).h1 || a->ffn_begin != 0 ||
                (int)a->ffn_end != hp->n_ff))
        return cm_errf(err, errlen, CM_EINVAL, "a slice of the layers without a tensor-parallel group");
    if (tp && (a->tp_size > CM_COLL_MAX_MEMBERS || (a->tp_rank == 0 && a->stage == 0)))
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "tensor-parallel rank %u of %u of stage %u (rank 0 of stage 0 is the coordinator)", a->tp_rank,
                       a->tp_size, a->stage);
    if ((rc = cm_slice_check(&s->m, s->slice, e, sizeof e)) ||
        (rc = cm_expert_slice_check(&s->m, s->slice, s->experts, e, sizeof e)))
        return cm_errf(err, errlen, rc, "slice: %s", e);
    if (tp && !s->experts.ep && cm_model_repack_slice(&s->m, s->slice, e, sizeof e)) /* the same bits without */
        CM_LOGW("tensor parallel: %s", e);
    if (a->layer_begin == 0 && !tp)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "the first stage runs on the coordinator");
    int nt = n->o->n_threads > 0 ? n->o->n_threads : cm_cpu_count();
    s->pool = cm_pool_new(nt < 1 ? 1 : nt);
    s->ctx = s->pool ? cm_ctx_new(&s->m, CM_BATCH_MAX, (int)a->n_ctx, s->pool, e, sizeof e) : NULL;
    if (!s->ctx) return cm_errf(err, errlen, CM_ENOMEM, "%s", s->pool ? e : "cannot start threads");
    s->n_seq = (int)a->n_seq_max;
    s->kv = cm_calloc((size_t)s->n_seq, sizeof *s->kv);
    s->kvp = cm_calloc((size_t)s->n_seq, sizeof *s->kvp);
    s->smp = cm_calloc((size_t)s->n_seq, sizeof *s->smp);
    s->in = cm_malloc((size_t)CM_BATCH_MAX * (size_t)hp->n_embd * sizeof(float));
    s->out = cm_malloc((size_t)CM_BATCH_MAX * (size_t)hp->n_embd * sizeof(float));
    /* a group's rank 0 samples; with a split head every member computes its rows of it */
    bool last = (a->flags & CM_ASSIGN_F_OUTPUT) && (a->tp_rank == 0 || (a->flags & CM_ASSIGN_F_HEAD));
    if (last) s->logits = cm_malloc((size_t)CM_BATCH_MAX * (size_t)hp->n_vocab * sizeof(float));
    if (!s->kv || !s->kvp || !s->smp || !s->in || !s->out || (last && !s->logits))
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory for the stage's buffers");
    for (int i = 0; i < s->n_seq; i++) {
        rc = cm_kv_init_types(&s->kv[i], &s->m, (int)a->layer_begin, (int)a->layer_end, s->slice, (int)a->n_ctx,
                              (enum cm_type)a->kv_type_k, (enum cm_type)a->kv_type_v, a->kv_rows, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "KV cache: %s", e);
        s->kvp[i] = &s->kv[i];
    }
    cm_node_gpu_stage(n, s); /* its first layers on the GPU, if the node has one */
    if (tp && (rc = tp_connect(n, s, err, errlen))) return rc;
    if (tp && a->tp_rank == 0)
        for (int j = 1; j < (int)a->tp_size; j++) { /* hybrid: this group's FORWARDs go on to every member */
            cm_msg_hello peer;
            rc = cm_cluster_dial(a->tp_peers[j], &n->cfg, &n->hello, &s->relay[j], &peer, e, sizeof e);
            if (rc)
                return cm_errf(err, errlen, rc, "cannot reach rank %d of this group at %s: %s", j, a->tp_peers[j], e);
        }
    if (a->tp_rank == 0 && !last) {
        if (!*a->next) return cm_errf(err, errlen, CM_EINVAL, "a middle stage without a next stage");
        cm_msg_hello peer;
        rc = cm_cluster_dial(a->next, &n->cfg, &n->hello, &s->next, &peer, e, sizeof e);
        if (rc) return cm_errf(err, errlen, rc, "cannot reach the next stage %s: %s", a->next, e);
    }
    return 0;
}

int cm_node_send_ready(node *n, cm_conn *c, uint64_t epoch, int status, uint64_t missing, const char *text) {
    cm_msg m = {.type = CM_MSG_READY};
    m.u.ready.epoch = epoch;
    m.u.ready.status = status;
    m.u.ready.bytes_missing = missing;
    snprintf(m.u.ready.text, sizeof m.u.ready.text, "%s", text ? text : "");
    char e[200];
    pthread_mutex_lock(&n->csend_mu);
    int rc = cm_conn_send(c, &m, 10000, e, sizeof e);
    pthread_mutex_unlock(&n->csend_mu);
    return rc;
}

/* LoRA (CM_ASSIGN_F_LORA): fetch this stage's parts of the coordinator's
 * adapters (one content-addressed object over the weight path, its sha256
 * checked), make them the stage's set and apply it in every forward pass.
 * The parts hold only this stage's layers, and a group member's only its
 * slice of them (coord_lora.c); the line on stderr says so
 * (tests/sh/cluster_lora.sh reads it). */
static int stage_lora(node *n, cm_conn *c, stage *s, cm_msg_assign *newer, bool *superseded, char *err, size_t errlen) {
    const cm_msg_assign *a = &s->as;
    uint8_t *bytes = NULL;
    char e[400];
    int rc =
        cm_weights_fetch_object(c, &n->csend_mu, a->lora_sha256, a->lora_bytes, &bytes, newer, superseded, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "LoRA parts: %s", e);
    s->lora = cm_lora_new(&s->m);
    rc = s->lora ? cm_lora_add_parts(s->lora, bytes, a->lora_bytes, e, sizeof e)
                 : cm_errf(e, sizeof e, CM_ENOMEM, "out of memory");
    cm_free(bytes);
    if (rc) return cm_errf(err, errlen, rc, "%s", e);
    /* They must hold every row and column this member reads (its slice)... */
    if (!cm_lora_covers(s->lora, &s->slice, (a->flags & CM_ASSIGN_F_HEAD) != 0))
        return cm_errf(err, errlen, CM_EPROTO, "LoRA parts do not hold this member's rows and columns");
    /* ... and be of this stage's layers (or its output head) only. */
    for (int il = 0; il <= s->m.hp.n_layer; il++)
        for (int t = 0; t < CM_LORA_TARGET_COUNT; t++) {
            bool out = t == CM_LORA_OUTPUT;
            if (out != (il == s->m.hp.n_layer) || !cm_lora_targets(s->lora, il, (enum cm_lora_target)t)) continue;
            bool mine =
                out ? (a->flags & CM_ASSIGN_F_OUTPUT) != 0 : il >= (int)a->layer_begin && il < (int)a->layer_end;
            if (!mine)
                return cm_errf(err, errlen, CM_EPROTO, "LoRA parts hold %s, outside this stage's layers [%u, %u)",
                               out ? "the output head" : "another layer", a->layer_begin, a->layer_end);
        }
    cm_ctx_set_lora(s->ctx, s->lora);
    fprintf(stderr,
            "cumulo node '%s': LoRA parts of layers [%u, %u)%s (epoch %llu): %d pairs of %d adapters, %u bytes%s\n",
            n->hello.name, a->layer_begin, a->layer_end, (a->flags & CM_ASSIGN_F_OUTPUT) ? " + output" : "",
            (unsigned long long)a->epoch, cm_lora_n_pairs(s->lora), cm_lora_count(s->lora), a->lora_bytes,
            a->tp_size > 1 ? ", this member's slice" : "");
    return 0;
}

/* One ASSIGN: load (fetching what is missing), then READY. Returns true,
 * without a READY, when a newer ASSIGN arrived while the weights were
 * fetched (a re-plan retried at once): it is in *newer, and the coordinator
 * no longer waits for this epoch. */
static bool assign_once(node *n, cm_conn *c, const cm_msg_assign *a, cm_msg_assign *newer) {
    char err[512] = "", path[600];
    stage *s = cm_calloc(1, sizeof *s);
    if (!s) {
        cm_node_send_ready(n, c, a->epoch, CM_ENOMEM, 0, "out of memory");
        return false;
    }
    s->as = *a;
    s->coord = c;
    s->csend_mu = &n->csend_mu;
    s->node = n;
    pthread_mutex_init(&s->fsend_mu, NULL);
    int rc = find_model(n, a, path, sizeof path, err, sizeof err);
    bool slice_file = rc == CM_ENOENT;
    if (rc == CM_ENOENT) {
        /* Not on disk: fetch this stage's tensors from the coordinator into
         * the cache (nothing when a previous run left them there). */
        uint64_t got = 0;
        bool superseded = false;
        double t0 = cm_now_s();
        rc =
            cm_weights_fetch(c, &n->csend_mu, n->cache_dir, a->model_sha256, (int)a->layer_begin, (int)a->layer_end,
                             a->flags & CM_ASSIGN_F_EMBED, a->flags & CM_ASSIGN_F_OUTPUT,
                             /* an expert group's member: only its experts' slabs */
                             (a->flags & CM_ASSIGN_F_EP) ? a->expert_bounds[a->tp_rank] : 0,
                             (a->flags & CM_ASSIGN_F_EP) ? a->expert_bounds[a->tp_rank + 1] : 0,
                             /* and its hot-expert replicas */
                             a->replicas[a->tp_rank], (a->flags & CM_ASSIGN_F_REPLICAS) ? a->n_replicas[a->tp_rank] : 0,
                             path, sizeof path, &got, newer, &superseded, err, sizeof err);
        if (superseded) {
            CM_LOGW("assignment of epoch %llu superseded while its weights were fetched: %s",
                    (unsigned long long)a->epoch, err);
            cm_node_stage_free(s);
            return true;
        }
        if (!rc)
            CM_LOGI("weights: %llu bytes streamed in %.2f s into '%s'", (unsigned long long)got, cm_now_s() - t0, path);
        if (!rc && (a->flags & CM_ASSIGN_F_EP)) { /* one line per assignment (tests/sh/cluster_ep*.sh read it) */
            char reps[8 * CM_MSG_MAX_REPLICAS + 16] = "";
            int o = 0;
            for (int i = 0; (a->flags & CM_ASSIGN_F_REPLICAS) && i < a->n_replicas[a->tp_rank]; i++)
                o += snprintf(reps + o, sizeof reps - (size_t)o, "%s%u", i ? " " : ", replicas ",
                              a->replicas[a->tp_rank][i]);
            fprintf(stderr,
                    "expert-parallel rank %u of %u (epoch %llu): experts [%u, %u), %llu weight bytes streamed%s\n",
                    a->tp_rank, a->tp_size, (unsigned long long)a->epoch, a->expert_bounds[a->tp_rank],
                    a->expert_bounds[a->tp_rank + 1], (unsigned long long)got, reps);
        }
    }
    if (!rc) rc = stage_load(n, s, path, slice_file, err, sizeof err);
    if (!rc && (a->flags & CM_ASSIGN_F_LORA)) {
        bool superseded = false;
        rc = stage_lora(n, c, s, newer, &superseded, err, sizeof err);
        if (superseded) {
            CM_LOGW("assignment of epoch %llu superseded while its LoRA parts were fetched: %s",
                    (unsigned long long)a->epoch, err);
            cm_node_stage_free(s);
            return true;
        }
    }
    /* Taken over by another coordinator while this one loaded (--take): its
     * stage must not replace the new owner's. */
    if (!rc && !cm_node_lease_holds(&n->lease, c))
        rc = cm_errf(err, sizeof err, CM_EBUSY, "taken over by another coordinator while loading");
    if (rc) {
        CM_LOGW("assignment of epoch %llu refused: %s", (unsigned long long)a->epoch, err);
        cm_node_stage_free(s);
        cm_node_send_ready(n, c, a->epoch, rc, 0, err);
        return false;
    }
    pthread_mutex_lock(&n->mu);
    stage *old = n->st;
    n->st = s;
    atomic_store(&n->epoch, a->epoch);
    pthread_mutex_unlock(&n->mu);
    cm_node_stage_free(old);
    CM_LOGI("stage %u/%u: layers [%u, %u) of '%s' (epoch %llu), rank %u of %u%s%s", a->stage, a->n_stages,
            a->layer_begin, a->layer_end, a->model_name, (unsigned long long)a->epoch, a->tp_rank, a->tp_size,
            *a->next ? ", next " : ", last stage", a->next); /* (tests parse this info line) */
    /* Always said (issue 19): which stage this node now runs, for whom. */
    char owner[CM_MSG_NAME_MAX + 1];
    cm_node_lease_owner(&n->lease, owner, sizeof owner);
    fprintf(stderr,
            "cumulo node '%s': took stage %u of %u, layers [%u, %u) of '%s' for coordinator %s (epoch %llu)%s%s%s\n",
            n->hello.name, a->stage, a->n_stages, a->layer_begin, a->layer_end, a->model_name, owner,
            (unsigned long long)a->epoch, a->tp_size > 1 ? ", tensor-parallel member" : "",
            *a->next ? ", next " : ", last stage", a->next);
    s->t0_ns = cm_now_ns();
    cm_node_send_ready(n, c, a->epoch, 0, 0, "");
    return false;
}

void cm_node_on_assign(node *n, cm_conn *c, const cm_msg_assign *a) {
    cm_msg_assign cur = *a, newer;
    while (assign_once(n, c, &cur, &newer)) cur = newer;
}
