/*
 * coord_lora.c: LoRA adapters on a cluster, the coordinator's side. Every
 * member of a plan applies the same adapters as one machine would, to its
 * own layers only: for each stage's layer range the coordinator writes that
 * range's pairs of its set (cm_lora_parts_write: the pairs as F32, with the
 * final scales, in the set's order, so the sums are the same bits) into one
 * object addressed by its sha256, names it in the member's ASSIGN
 * (CM_ASSIGN_F_LORA) and serves it over the weight-streaming path
 * (WEIGHTS_REQ / WEIGHTS_CHUNK on the authenticated control link), where
 * the node fetches it, checks the hash and builds its set (node_stage.c).
 * A node never receives another stage's parts, and a tensor-parallel member
 * only its slice of them: its rows of lora_b for the row-split weights
 * (attn_q/k/v, ffn_gate/up, a split output head), its columns of lora_a for
 * the column-split ones (attn_output, ffn_down), the other half whole.
 *
 * The plan change (coord_plan.c) calls cm_coord_lora_prepare before its
 * ASSIGNs, so opening, recovery and every re-plan send the new owners their
 * parts. Objects are never freed before cm_pipe_close: a receiver thread may
 * be serving one while a newer plan is made.
 */
#include "cluster/coord_impl.h"
#include "model/lora.h"

#include <sodium.h>
#include <string.h>

#define LORA_OBJ_MAX 256 /* distinct layer ranges over the pipe's life (NEEDSWORK: drop unused ones) */

typedef struct cm_lora_obj {
    int first, last;
    bool output, sliced, head_split;
    cm_slice slice;
    uint8_t sha[32];
    uint8_t *bytes;
    uint32_t len;
    int n_pairs;
} cm_lora_obj;

/* The parts of member k of stage s: its layers, its slice when it is in a
 * group (a split head's rows too). */
typedef struct part_key {
    int first, last;
    bool output, sliced, head_split;
    cm_slice slice;
} part_key;

static part_key key_of(cm_pipe *p, const cm_plan *pl, int s, int k) {
    const cm_plan_stage *st = &pl->stages[s];
    const cm_plan_member *mb = &st->members[k];
    part_key q = {.first = st->first_layer, .last = st->last_layer, .output = s == pl->n_stages - 1};
    q.sliced = st->n_members > 1;
    if (q.sliced) {
        q.slice = (cm_slice){mb->kv_head_begin, mb->kv_head_end, mb->ffn_begin, mb->ffn_end};
        q.head_split = q.output && cm_pipe_plan_head_split(pl);
    }
    return q;
}

static bool same_key(const cm_lora_obj *o, const part_key *q) {
    return o->first == q->first && o->last == q->last && o->output == q->output && o->sliced == q->sliced &&
           o->head_split == q->head_split &&
           (!q->sliced || (o->slice.h0 == q->slice.h0 && o->slice.h1 == q->slice.h1 && o->slice.f0 == q->slice.f0 &&
                           o->slice.f1 == q->slice.f1));
}

static cm_lora_obj *find(cm_pipe *p, const part_key *q) {
    for (int i = 0; i < p->n_lora_obj; i++)
        if (same_key(&p->lora_obj[i], q)) return &p->lora_obj[i];
    return NULL;
}

static int make(cm_pipe *p, const part_key *q, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    bool have = find(p, q) != NULL;
    pthread_mutex_unlock(&p->mu);
    if (have) return 0;
    if (p->n_lora_obj == LORA_OBJ_MAX)
        return cm_errf(err, errlen, CM_ENOMEM, "LoRA: parts for %d members already made", LORA_OBJ_MAX);
    cm_buf b;
    cm_buf_init(&b);
    int n_pairs = 0;
    int rc = cm_lora_parts_write(p->lora, q->first, q->last, q->output, q->sliced ? &q->slice : NULL, q->head_split, &b,
                                 &n_pairs);
    if (!rc && b.len > CM_MSG_MAX_LORA_BYTES)
        rc = cm_errf(err, errlen, CM_ERANGE, "LoRA: the adapters' parts of layers [%d, %d) are %zu bytes (at most %u)",
                     q->first, q->last, b.len, CM_MSG_MAX_LORA_BYTES);
    else if (rc) cm_errf(err, errlen, rc, "LoRA: out of memory for the parts of layers [%d, %d)", q->first, q->last);
    if (rc) {
        cm_buf_release(&b);
        return rc;
    }
    cm_lora_obj o = {.first = q->first,
                     .last = q->last,
                     .output = q->output,
                     .sliced = q->sliced,
                     .head_split = q->head_split,
                     .slice = q->slice,
                     .len = (uint32_t)b.len,
                     .n_pairs = n_pairs};
    o.bytes = (uint8_t *)b.data; /* owned by the object from now on */
    crypto_hash_sha256(o.sha, o.bytes, o.len);
    pthread_mutex_lock(&p->mu);
    if (!p->lora_obj) p->lora_obj = cm_calloc(LORA_OBJ_MAX, sizeof *p->lora_obj);
    if (p->lora_obj) p->lora_obj[p->n_lora_obj++] = o;
    else rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    pthread_mutex_unlock(&p->mu);
    if (rc) cm_free(o.bytes);
    else if (q->sliced)
        cm_coord_log(p,
                     "LoRA: layers [%d, %d)%s, kv heads [%d, %d) ffn rows [%d, %d): %d pairs of %d adapters, %u bytes",
                     q->first, q->last, q->output ? " + output" : "", q->slice.h0, q->slice.h1, q->slice.f0,
                     q->slice.f1, n_pairs, cm_lora_count(p->lora), o.len);
    else
        cm_coord_log(p, "LoRA: layers [%d, %d)%s: %d pairs of %d adapters, %u bytes", q->first, q->last,
                     q->output ? " + output" : "", n_pairs, cm_lora_count(p->lora), o.len);
    return rc;
}

int cm_coord_lora_prepare(cm_pipe *p, const cm_plan *pl, char *err, size_t errlen) {
    if (!p->lora) return 0;
    for (int s = 0; s < pl->n_stages; s++)
        for (int k = 0; k < pl->stages[s].n_members; k++) {
            if (!pl->stages[s].members[k].node) continue; /* this machine applies its own set */
            part_key q = key_of(p, pl, s, k);
            int rc = make(p, &q, err, errlen);
            if (rc) return rc;
        }
    return 0;
}

void cm_coord_lora_fill(cm_pipe *p, const cm_plan *pl, int s, int k, cm_msg_assign *a) {
    if (!p->lora) return;
    part_key q = key_of(p, pl, s, k);
    pthread_mutex_lock(&p->mu);
    const cm_lora_obj *o = find(p, &q);
    if (o) {
        a->flags |= CM_ASSIGN_F_LORA;
        memcpy(a->lora_sha256, o->sha, 32);
        a->lora_bytes = o->len;
    }
    pthread_mutex_unlock(&p->mu);
}

bool cm_coord_lora_serve(cm_pipe *p, remote *r, const cm_msg_weights_req *rq, int *rc, char *err, size_t errlen) {
    if (!p->lora) return false;
    const uint8_t *obj = NULL;
    uint32_t len = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_lora_obj && !obj; i++)
        if (!memcmp(p->lora_obj[i].sha, rq->tensor_hash, 32)) {
            obj = p->lora_obj[i].bytes; /* stays until cm_pipe_close, which joins this thread first */
            len = p->lora_obj[i].len;
        }
    pthread_mutex_unlock(&p->mu);
    if (!obj) return false;
    *rc = cm_weights_send_object(r->ctl, &p->send_mu, obj, len, rq, err, errlen);
    return true;
}

void cm_coord_lora_free(cm_pipe *p) {
    for (int i = 0; i < p->n_lora_obj; i++) cm_free(p->lora_obj[i].bytes);
    cm_free(p->lora_obj);
    p->lora_obj = NULL;
    p->n_lora_obj = 0;
}

_Static_assert(CM_PIPE_MAX_LORA == CM_MSG_MAX_LORA, "SEQ_LORA's bound");

int cm_pipe_seq_lora(cm_pipe *p, int slot, const float *scale, int n, char *err, size_t errlen) {
    if (n < 0 || (unsigned)n > CM_MSG_MAX_LORA)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "%d LoRA adapters: per-request scales take at most %u", n,
                       CM_MSG_MAX_LORA);
    cm_msg m = {.type = CM_MSG_SEQ_LORA};
    m.u.seq_lora = (cm_msg_seq_lora){.epoch = atomic_load(&p->epoch), .seq = slot, .n = (uint32_t)n};
    memcpy(m.u.seq_lora.scale, scale, (size_t)n * sizeof *scale);
    pthread_mutex_lock(&p->send_mu);
    int rc = cm_coord_send_data(p, &m, err, errlen);
    pthread_mutex_unlock(&p->send_mu);
    return rc;
}
