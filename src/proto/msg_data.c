/*
 * msg_data.c: the codecs of the token path: FORWARD (hidden rows or tokens
 * down the pipeline), OUTPUT, TOKEN, SEQ_CONFIG, SEQ_START, SEQ_FREE and
 * ALLREDUCE, and the accessors of their decoded little-endian views. Same rules
 * as msg.c; a decoded view is read only through the accessors, which assert
 * the index (the decoder already checked every count).
 */
#include "msg_impl.h"

static const char *forward_shape_invalid(const cm_msg_forward *f) {
    if (f->n_tokens == 0 || f->n_tokens > CM_MSG_MAX_TOKENS) return "n_tokens";
    if (f->dtype >= CM_HIDDEN_COUNT) return "dtype";
    if (f->dtype == CM_HIDDEN_TOKENS ? f->dim != 0 : (f->dim == 0 || f->dim > CM_MSG_MAX_DIM)) return "dim";
    return NULL;
}

static const char *output_shape_invalid(const cm_msg_output *o) {
    if (o->seq < 0) return "seq";
    if (o->kind >= CM_OUTPUT_COUNT) return "kind";
    if (o->n_rows == 0 || o->n_rows > CM_MSG_MAX_TOKENS) return "n_rows";
    if (o->dim == 0 || o->dim > CM_MSG_MAX_OUT_DIM) return "dim";
    if ((uint64_t)o->n_rows * (4 + 4ull * o->dim) > cm_msg_max_payload(CM_MSG_OUTPUT) - 32) return "n_rows x dim";
    return NULL;
}

static const char *token_invalid(const cm_msg_token *t) {
    if (t->seq < 0 || t->pos < 0 || t->token < 0) return "seq/pos/token";
    if (isnan(t->logprob) || t->logprob > 0) return "logprob";
    if (t->n_top > CM_MSG_MAX_TOP) return "n_top";
    for (unsigned i = 0; i < t->n_top; i++)
        if (t->top_token[i] < 0 || isnan(t->top_logprob[i]) || t->top_logprob[i] > 0) return "top";
    return NULL;
}

static const char *seq_config_invalid(const cm_msg_seq_config *c) {
    if (c->seq < 0) return "seq";
    if (!finite_nonneg(c->temperature)) return "temperature";
    if (!(c->top_p >= 0 && c->top_p <= 1) || !(c->min_p >= 0 && c->min_p <= 1)) return "top_p/min_p";
    if (!(isfinite(c->repeat_penalty) && c->repeat_penalty > 0)) return "repeat_penalty";
    if (c->top_k < 0) return "top_k";
    if (c->n_top_logprobs > CM_MSG_MAX_TOP) return "n_top_logprobs";
    return NULL;
}

static const char *seq_start_invalid(const cm_msg_seq_start *c) {
    if (c->seq < 0) return "seq";
    if (!isfinite(c->temperature)) return "temperature";
    if (!(c->top_p >= 0 && c->top_p <= 1) || !(c->min_p >= 0 && c->min_p <= 1)) return "top_p/min_p";
    if (!(isfinite(c->repeat_penalty) && c->repeat_penalty > 0)) return "repeat_penalty";
    if (c->repeat_last_n < 0 || c->repeat_last_n > (1 << 20)) return "repeat_last_n";
    if (!isfinite(c->presence_penalty) || !isfinite(c->frequency_penalty)) return "penalties";
    if (c->n_probs > CM_MSG_MAX_TOP) return "n_probs";
    if (c->n_hist > CM_MSG_MAX_HIST) return "n_hist";
    return NULL;
}

/* Q8 row: scale = max|x| / 127, q = round(x / scale). */
static void q8_row(wcur *w, const float *x, uint32_t dim) {
    float amax = 0;
    for (uint32_t j = 0; j < dim; j++) {
        float a = fabsf(x[j]);
        if (!isfinite(a)) {
            w_check(w, false, "hidden (not finite)");
            a = 0;
        }
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    w_f32(w, d);
    for (uint32_t j = 0; j < dim; j++) {
        float v = isfinite(x[j]) ? roundf(x[j] * id) : 0.0f;
        if (v > 127) v = 127;
        if (v < -127) v = -127;
        w_u8(w, (uint8_t)(int8_t)v);
    }
}

static void enc_forward(wcur *w, const cm_msg_forward *f) {
    w_u64(w, f->epoch);
    w_u64(w, f->request_id);
    w_u32(w, f->n_tokens);
    w_u32(w, f->dim);
    w_u8(w, f->dtype);
    const char *bad = forward_shape_invalid(f);
    if (bad) {
        w_check(w, false, bad);
        return;
    }
    /* Too large for a frame: report the size (the caller says CM_ERANGE) without
     * reading arrays that may be shorter than the claimed counts. */
    uint64_t row = f->dtype == CM_HIDDEN_TOKENS ? 4 : f->dtype == CM_HIDDEN_F32 ? 4ull * f->dim : 4ull + f->dim;
    uint64_t body = (uint64_t)f->n_tokens * (9 + row);
    if (w->len + body > cm_msg_max_payload(CM_MSG_FORWARD)) {
        w->len += (size_t)body;
        return;
    }
    bool data_ok =
        f->pos && f->seq && f->want && (f->dtype == CM_HIDDEN_TOKENS ? f->tokens != NULL : f->hidden != NULL);
    w_check(w, data_ok, "arrays");
    if (!data_ok) return;
    for (uint32_t i = 0; i < f->n_tokens; i++) {
        w_check(w, f->pos[i] >= 0, "pos");
        w_i32(w, f->pos[i]);
    }
    for (uint32_t i = 0; i < f->n_tokens; i++) {
        w_check(w, f->seq[i] >= 0, "seq");
        w_i32(w, f->seq[i]);
    }
    for (uint32_t i = 0; i < f->n_tokens; i++) {
        w_check(w, f->want[i] < CM_WANT_COUNT, "want");
        w_u8(w, f->want[i]);
    }
    if (f->dtype == CM_HIDDEN_TOKENS) {
        for (uint32_t i = 0; i < f->n_tokens; i++) {
            w_check(w, f->tokens[i] >= 0, "tokens");
            w_i32(w, f->tokens[i]);
        }
    } else if (f->dtype == CM_HIDDEN_F32) {
        if (!w->p) {
            w->len += (size_t)f->n_tokens * f->dim * 4;
            return;
        }
        for (size_t k = 0; k < (size_t)f->n_tokens * f->dim; k++) w_f32(w, f->hidden[k]);
    } else {
        if (!w->p) {
            w->len += (size_t)f->n_tokens * (4 + (size_t)f->dim);
            return;
        }
        for (uint32_t i = 0; i < f->n_tokens; i++) q8_row(w, f->hidden + (size_t)i * f->dim, f->dim);
    }
}

bool cm_msg_enc_data(wcur *w, const cm_msg *m) {
    switch (m->type) {
    case CM_MSG_FORWARD: enc_forward(w, &m->u.forward); break;
    case CM_MSG_TOKEN: {
        const cm_msg_token *t = &m->u.token;
        const char *bad = token_invalid(t);
        if (bad) {
            w_check(w, false, bad);
            break;
        }
        w_u64(w, t->epoch);
        w_u64(w, t->request_id);
        w_i32(w, t->seq);
        w_i32(w, t->pos);
        w_i32(w, t->token);
        w_f32(w, t->logprob);
        w_u8(w, t->n_top);
        for (unsigned i = 0; i < t->n_top; i++) {
            w_i32(w, t->top_token[i]);
            w_f32(w, t->top_logprob[i]);
        }
        break;
    }
    case CM_MSG_SEQ_CONFIG: {
        const cm_msg_seq_config *c = &m->u.seq_config;
        const char *bad = seq_config_invalid(c);
        if (bad) w_check(w, false, bad);
        w_u64(w, c->epoch);
        w_u64(w, c->request_id);
        w_i32(w, c->seq);
        w_f32(w, c->temperature);
        w_f32(w, c->top_p);
        w_f32(w, c->min_p);
        w_f32(w, c->repeat_penalty);
        w_i32(w, c->top_k);
        w_u64(w, c->seed);
        w_u8(w, c->n_top_logprobs);
        break;
    }
    case CM_MSG_SEQ_LORA: {
        const cm_msg_seq_lora *q = &m->u.seq_lora;
        w_u64(w, q->epoch);
        w_check(w, q->seq >= 0, "seq");
        w_i32(w, q->seq);
        w_check(w, q->n <= CM_MSG_MAX_LORA, "n");
        w_u32(w, q->n);
        for (uint32_t i = 0; i < q->n && i < CM_MSG_MAX_LORA; i++) {
            w_check(w, isfinite(q->scale[i]) && fabsf(q->scale[i]) < 1e6f, "scale");
            w_f32(w, q->scale[i]);
        }
        break;
    }
    case CM_MSG_SEQ_FREE:
        w_u64(w, m->u.seq_free.epoch);
        w_u64(w, m->u.seq_free.request_id);
        w_check(w, m->u.seq_free.seq >= 0, "seq");
        w_i32(w, m->u.seq_free.seq);
        break;
    case CM_MSG_ALLREDUCE: {
        const cm_msg_allreduce *a = &m->u.allreduce;
        uint64_t end;
        w_u64(w, a->epoch);
        w_u64(w, a->op_id);
        w_u16(w, a->layer);
        w_check(w, a->point <= 1, "point");
        w_u8(w, a->point);
        w_u8(w, a->step);
        w_u32(w, a->elem_offset);
        w_check(w, a->n > 0 && a->data && cm_add_ok(a->elem_offset, a->n, &end) && end <= UINT32_MAX, "n");
        w_u32(w, a->n);
        if (!a->data) break;
        if ((uint64_t)a->n * 4 > cm_msg_max_payload(CM_MSG_ALLREDUCE)) {
            w->len += (size_t)a->n * 4;
            break;
        }
        if (!w->p) {
            w->len += (size_t)a->n * 4;
            break;
        }
        for (uint32_t i = 0; i < a->n; i++) w_f32(w, a->data[i]);
        break;
    }
    case CM_MSG_OUTPUT: {
        const cm_msg_output *o = &m->u.output;
        w_u64(w, o->epoch);
        w_u64(w, o->request_id);
        w_i32(w, o->seq);
        w_u8(w, o->kind);
        w_u32(w, o->n_rows);
        w_u32(w, o->dim);
        const char *bad = output_shape_invalid(o);
        if (bad) {
            w_check(w, false, bad);
            break;
        }
        w_check(w, (o->pos || o->pos_le) && (o->data || o->data_le), "arrays");
        if (!(o->pos || o->pos_le) || !(o->data || o->data_le)) break;
        for (uint32_t i = 0; i < o->n_rows; i++) {
            int32_t v = o->pos ? o->pos[i] : (int32_t)cm_rd_u32(o->pos_le + 4 * (size_t)i);
            w_check(w, v >= 0, "pos");
            w_i32(w, v);
        }
        size_t nf = (size_t)o->n_rows * o->dim;
        if (!w->p) {
            w->len += nf * 4;
            break;
        }
        if (!o->data) {
            w_bytes(w, o->data_le, nf * 4);
            break;
        } /* a decoded message re-encodes as is */
        for (size_t k = 0; k < nf; k++) w_f32(w, o->data[k]);
        break;
    }
    case CM_MSG_SEQ_START: {
        const cm_msg_seq_start *c = &m->u.seq_start;
        const char *bad = seq_start_invalid(c);
        if (bad) {
            w_check(w, false, bad);
            break;
        }
        w_u64(w, c->epoch);
        w_u64(w, c->request_id);
        w_i32(w, c->seq);
        w_f32(w, c->temperature);
        w_i32(w, c->top_k);
        w_f32(w, c->top_p);
        w_f32(w, c->min_p);
        w_f32(w, c->repeat_penalty);
        w_i32(w, c->repeat_last_n);
        w_f32(w, c->presence_penalty);
        w_f32(w, c->frequency_penalty);
        w_u64(w, c->seed);
        w_u64(w, c->n_sampled);
        w_u8(w, c->n_probs);
        w_u32(w, c->n_hist);
        /* A decoded message (hist_le) re-encodes as is: stages pass it down the chain. */
        w_check(w, c->n_hist == 0 || c->hist || c->hist_le, "hist");
        for (uint32_t i = 0; i < c->n_hist && (c->hist || c->hist_le); i++) {
            int32_t id = c->hist ? c->hist[i] : (int32_t)cm_rd_u32(c->hist_le + 4 * (size_t)i);
            w_check(w, id >= 0, "hist");
            w_i32(w, id);
        }
        break;
    }
    default: return false;
    }
    return true;
}

static void dec_forward(rcur *r, cm_msg_forward *f) {
    f->epoch = r_u64(r, "epoch");
    f->request_id = r_u64(r, "request_id");
    f->n_tokens = r_u32(r, "n_tokens");
    f->dim = r_u32(r, "dim");
    f->dtype = r_u8(r, "dtype");
    if (r->bad) return;
    const char *bad = forward_shape_invalid(f);
    if (bad) {
        r_fail(r, bad, "out of range");
        return;
    }
    uint32_t n = f->n_tokens;
    f->pos_le = r_view(r, n, 4, "pos");
    f->seq_le = r_view(r, n, 4, "seq");
    f->want_le = r_view(r, n, 1, "want");
    uint64_t row = f->dtype == CM_HIDDEN_TOKENS ? 4 : f->dtype == CM_HIDDEN_F32 ? 4ull * f->dim : 4ull + f->dim;
    f->data_le = r_view(r, n, row, "data");
    if (r->bad) return;
    for (uint32_t i = 0; i < n; i++) {
        if ((int32_t)cm_rd_u32(f->pos_le + 4 * i) < 0) {
            r_fail(r, "pos", "negative");
            return;
        }
        if ((int32_t)cm_rd_u32(f->seq_le + 4 * i) < 0) {
            r_fail(r, "seq", "negative");
            return;
        }
        if (f->want_le[i] >= CM_WANT_COUNT) {
            r_fail(r, "want", "not 0..3");
            return;
        }
        if (f->dtype == CM_HIDDEN_TOKENS && (int32_t)cm_rd_u32(f->data_le + 4 * i) < 0) {
            r_fail(r, "tokens", "negative");
            return;
        }
        if (f->dtype == CM_HIDDEN_Q8 && !finite_nonneg(bits_f32(cm_rd_u32(f->data_le + row * i)))) {
            r_fail(r, "q8 scale", "not a finite non-negative number");
            return;
        }
    }
}

int cm_msg_dec_data(rcur *r, unsigned type, cm_msg *m) {
    switch (type) {
    case CM_MSG_FORWARD: dec_forward(r, &m->u.forward); break;
    case CM_MSG_TOKEN: {
        cm_msg_token *t = &m->u.token;
        t->epoch = r_u64(r, "epoch");
        t->request_id = r_u64(r, "request_id");
        t->seq = r_i32(r, "seq");
        t->pos = r_i32(r, "pos");
        t->token = r_i32(r, "token");
        t->logprob = r_f32(r, "logprob");
        t->n_top = r_u8(r, "n_top");
        r_check(r, t->n_top <= CM_MSG_MAX_TOP, "n_top");
        for (unsigned i = 0; i < t->n_top && !r->bad; i++) {
            t->top_token[i] = r_i32(r, "top_token");
            t->top_logprob[i] = r_f32(r, "top_logprob");
        }
        if (!r->bad) {
            const char *bad = token_invalid(t);
            if (bad) r_fail(r, bad, "out of range");
        }
        break;
    }
    case CM_MSG_SEQ_CONFIG: {
        cm_msg_seq_config *c = &m->u.seq_config;
        c->epoch = r_u64(r, "epoch");
        c->request_id = r_u64(r, "request_id");
        c->seq = r_i32(r, "seq");
        c->temperature = r_f32(r, "temperature");
        c->top_p = r_f32(r, "top_p");
        c->min_p = r_f32(r, "min_p");
        c->repeat_penalty = r_f32(r, "repeat_penalty");
        c->top_k = r_i32(r, "top_k");
        c->seed = r_u64(r, "seed");
        c->n_top_logprobs = r_u8(r, "n_top_logprobs");
        if (!r->bad) {
            const char *bad = seq_config_invalid(c);
            if (bad) r_fail(r, bad, "out of range");
        }
        break;
    }
    case CM_MSG_SEQ_LORA: {
        cm_msg_seq_lora *q = &m->u.seq_lora;
        q->epoch = r_u64(r, "epoch");
        q->seq = r_i32(r, "seq");
        r_check(r, q->seq >= 0, "seq");
        q->n = r_u32(r, "n");
        r_check(r, q->n <= CM_MSG_MAX_LORA, "n");
        for (uint32_t i = 0; i < q->n && !r->bad; i++) {
            q->scale[i] = r_f32(r, "scale");
            r_check(r, isfinite(q->scale[i]) && fabsf(q->scale[i]) < 1e6f, "scale");
        }
        break;
    }
    case CM_MSG_SEQ_FREE:
        m->u.seq_free.epoch = r_u64(r, "epoch");
        m->u.seq_free.request_id = r_u64(r, "request_id");
        m->u.seq_free.seq = r_i32(r, "seq");
        r_check(r, m->u.seq_free.seq >= 0, "seq");
        break;
    case CM_MSG_ALLREDUCE: {
        cm_msg_allreduce *a = &m->u.allreduce;
        uint64_t end = 0;
        a->epoch = r_u64(r, "epoch");
        a->op_id = r_u64(r, "op_id");
        a->layer = r_u16(r, "layer");
        a->point = r_u8(r, "point");
        r_check(r, a->point <= 1, "point");
        a->step = r_u8(r, "step");
        a->elem_offset = r_u32(r, "elem_offset");
        a->n = r_u32(r, "n");
        r_check(r, a->n > 0 && cm_add_ok(a->elem_offset, a->n, &end) && end <= UINT32_MAX, "n");
        a->data_le = r_view(r, a->n, 4, "data");
        break;
    }
    case CM_MSG_OUTPUT: {
        cm_msg_output *o = &m->u.output;
        o->epoch = r_u64(r, "epoch");
        o->request_id = r_u64(r, "request_id");
        o->seq = r_i32(r, "seq");
        o->kind = r_u8(r, "kind");
        o->n_rows = r_u32(r, "n_rows");
        o->dim = r_u32(r, "dim");
        if (r->bad) break;
        {
            const char *bad = output_shape_invalid(o);
            if (bad) {
                r_fail(r, bad, "out of range");
                break;
            }
        }
        o->pos_le = r_view(r, o->n_rows, 4, "pos");
        o->data_le = r_view(r, o->n_rows, 4ull * o->dim, "data");
        for (uint32_t i = 0; i < o->n_rows && !r->bad; i++)
            if ((int32_t)cm_rd_u32(o->pos_le + 4 * (size_t)i) < 0) r_fail(r, "pos", "negative");
        break;
    }
    case CM_MSG_SEQ_START: {
        cm_msg_seq_start *c = &m->u.seq_start;
        c->epoch = r_u64(r, "epoch");
        c->request_id = r_u64(r, "request_id");
        c->seq = r_i32(r, "seq");
        c->temperature = r_f32(r, "temperature");
        c->top_k = r_i32(r, "top_k");
        c->top_p = r_f32(r, "top_p");
        c->min_p = r_f32(r, "min_p");
        c->repeat_penalty = r_f32(r, "repeat_penalty");
        c->repeat_last_n = r_i32(r, "repeat_last_n");
        c->presence_penalty = r_f32(r, "presence_penalty");
        c->frequency_penalty = r_f32(r, "frequency_penalty");
        c->seed = r_u64(r, "seed");
        c->n_sampled = r_u64(r, "n_sampled");
        c->n_probs = r_u8(r, "n_probs");
        c->n_hist = r_u32(r, "n_hist");
        if (r->bad) break;
        {
            const char *bad = seq_start_invalid(c);
            if (bad) {
                r_fail(r, bad, "out of range");
                break;
            }
        }
        c->hist_le = r_view(r, c->n_hist, 4, "hist");
        for (uint32_t i = 0; i < c->n_hist && !r->bad; i++)
            if ((int32_t)cm_rd_u32(c->hist_le + 4 * (size_t)i) < 0) r_fail(r, "hist", "negative");
        break;
    }
    default: return CM_EUNSUPPORTED;
    }
    return 0;
}

/* ---- accessors of decoded views ---- */

int32_t cm_msg_forward_pos(const cm_msg_forward *m, uint32_t i) {
    CM_ASSERT(m->pos_le && i < m->n_tokens);
    return (int32_t)cm_rd_u32(m->pos_le + 4 * (size_t)i);
}
int32_t cm_msg_forward_seq(const cm_msg_forward *m, uint32_t i) {
    CM_ASSERT(m->seq_le && i < m->n_tokens);
    return (int32_t)cm_rd_u32(m->seq_le + 4 * (size_t)i);
}
unsigned cm_msg_forward_want(const cm_msg_forward *m, uint32_t i) {
    CM_ASSERT(m->want_le && i < m->n_tokens);
    return m->want_le[i];
}
int32_t cm_msg_forward_token(const cm_msg_forward *m, uint32_t i) {
    CM_ASSERT(m->data_le && m->dtype == CM_HIDDEN_TOKENS && i < m->n_tokens);
    return (int32_t)cm_rd_u32(m->data_le + 4 * (size_t)i);
}
void cm_msg_forward_row(const cm_msg_forward *m, uint32_t i, float *out) {
    CM_ASSERT(m->data_le && m->dtype != CM_HIDDEN_TOKENS && i < m->n_tokens);
    if (m->dtype == CM_HIDDEN_F32) {
        const uint8_t *q = m->data_le + (size_t)i * m->dim * 4;
        for (uint32_t j = 0; j < m->dim; j++) out[j] = bits_f32(cm_rd_u32(q + 4 * (size_t)j));
    } else {
        const uint8_t *q = m->data_le + (size_t)i * (4 + (size_t)m->dim);
        float d = bits_f32(cm_rd_u32(q));
        for (uint32_t j = 0; j < m->dim; j++) out[j] = d * (float)(int8_t)q[4 + j];
    }
}
int32_t cm_msg_seq_start_hist(const cm_msg_seq_start *m, uint32_t i) {
    CM_ASSERT(m->hist_le && i < m->n_hist);
    return (int32_t)cm_rd_u32(m->hist_le + 4 * (size_t)i);
}
int32_t cm_msg_output_pos(const cm_msg_output *m, uint32_t i) {
    CM_ASSERT(m->pos_le && i < m->n_rows);
    return (int32_t)cm_rd_u32(m->pos_le + 4 * (size_t)i);
}
void cm_msg_output_row(const cm_msg_output *m, uint32_t i, float *out) {
    CM_ASSERT(m->data_le && i < m->n_rows);
    const uint8_t *q = m->data_le + (size_t)i * m->dim * 4;
    for (uint32_t j = 0; j < m->dim; j++) out[j] = bits_f32(cm_rd_u32(q + 4 * (size_t)j));
}
void cm_msg_allreduce_get(const cm_msg_allreduce *m, float *out) {
    CM_ASSERT(m->data_le);
    for (uint32_t i = 0; i < m->n; i++) out[i] = bits_f32(cm_rd_u32(m->data_le + 4 * (size_t)i));
}
