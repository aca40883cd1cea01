/*
 * pipe_output.c: rows the last stage sends back instead of a token (OUTPUT,
 * docs/PROTOCOL.md), both ends. A FORWARD row whose want is CM_WANT_LOGITS
 * comes back as its logits, so that the coordinator samples it itself (under
 * a grammar: the masks need the token texts, which only the coordinator
 * has, and the sampler state stays where one machine keeps it); a row whose
 * want is CM_WANT_HIDDEN comes back as its final hidden state, before the
 * output norm (the coordinator pools rows into an embedding).
 *
 * Coordinator side: the caller names where the rows go (slot, positions,
 * buffer) before it sends them; the receiver thread (coord.c) copies each
 * OUTPUT's rows into that buffer under p->mu; the caller waits for them with
 * the token deadline. Nothing allocates; rows that nobody expects (a stale
 * epoch, a request canceled meanwhile) are dropped.
 */
#include "cluster/coord_impl.h"

#include <string.h>

_Static_assert((int)CM_PIPE_WANT_TOKEN == (int)CM_WANT_TOKEN && (int)CM_PIPE_WANT_LOGITS == (int)CM_WANT_LOGITS &&
                   (int)CM_PIPE_WANT_HIDDEN == (int)CM_WANT_HIDDEN &&
                   (int)CM_PIPE_OUT_HIDDEN == (int)CM_OUTPUT_HIDDEN && (int)CM_PIPE_OUT_LOGITS == (int)CM_OUTPUT_LOGITS,
               "cluster.h's names of the wire values");

int cm_node_send_hidden(cm_conn *c, pthread_mutex_t *mu, const cm_msg_forward *f, const int8_t *want,
                        const int32_t *pos, const int32_t *seq, float *rows, int n, int dim, char *err, size_t errlen) {
    int32_t opos[CM_BATCH_MAX];
    int k = 0, start = 0; /* compacted rows [start, k) are the current run of one sequence */
    for (int i = 0; i < n && i < CM_BATCH_MAX; i++) {
        if (want[i] != CM_WANT_HIDDEN) continue;
        if (k != i) memmove(rows + (size_t)k * (size_t)dim, rows + (size_t)i * (size_t)dim, (size_t)dim * sizeof *rows);
        opos[k++] = pos[i];
        int j = i + 1;
        while (j < n && want[j] != CM_WANT_HIDDEN) j++;
        if (j < n && seq[j] == seq[i]) continue;
        cm_msg m = {.type = CM_MSG_OUTPUT};
        m.u.output = (cm_msg_output){.epoch = f->epoch,
                                     .request_id = f->request_id,
                                     .seq = seq[i],
                                     .kind = CM_OUTPUT_HIDDEN,
                                     .n_rows = (uint32_t)(k - start),
                                     .dim = (uint32_t)dim,
                                     .pos = opos + start,
                                     .data = rows + (size_t)start * (size_t)dim};
        pthread_mutex_lock(mu);
        int rc = cm_conn_send(c, &m, 30000, err, errlen);
        pthread_mutex_unlock(mu);
        if (rc) return rc;
        start = k;
    }
    return 0;
}

void cm_pipe_output_expect(cm_pipe *p, int slot_i, int kind, float *buf, int pos0, int n_rows) {
    pthread_mutex_lock(&p->mu);
    slot *s = &p->slots[slot_i];
    s->out_buf = buf;
    s->out_kind = kind;
    s->out_pos0 = pos0;
    s->out_rows = n_rows;
    s->out_got = 0;
    pthread_mutex_unlock(&p->mu);
}

void cm_coord_on_output(cm_pipe *p, const cm_msg_output *o) {
    if (o->epoch != atomic_load(&p->epoch) || o->seq >= p->n_seq) return;
    uint32_t want_dim = (uint32_t)(o->kind == CM_OUTPUT_LOGITS ? p->m->hp.n_vocab : p->m->hp.n_embd);
    if (o->dim != want_dim) {
        cm_coord_fatal(p, CM_EPROTO, "the last stage sent %s rows of %u floats (the model has %u)",
                       o->kind == CM_OUTPUT_LOGITS ? "logits" : "hidden", o->dim, want_dim);
        return;
    }
    pthread_mutex_lock(&p->mu);
    slot *s = &p->slots[o->seq];
    for (uint32_t i = 0; i < o->n_rows && s->out_buf && s->out_kind == o->kind; i++) {
        int64_t r = (int64_t)cm_msg_output_pos(o, i) - s->out_pos0;
        if (r < 0 || r >= s->out_rows) continue;
        cm_msg_output_row(o, i, s->out_buf + (size_t)r * o->dim);
        s->out_got++;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int cm_pipe_output_wait(cm_pipe *p, int slot_i, char *err, size_t errlen) {
    uint64_t deadline = cm_now_ns() + (uint64_t)p->timeout_ms * 1000000ull;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    slot *s = &p->slots[slot_i];
    while (!rc && s->out_got < s->out_rows) rc = cm_coord_wait_data(p, deadline, "rows", err, errlen);
    s->out_buf = NULL; /* nothing more is written there */
    s->out_rows = s->out_got = 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}
