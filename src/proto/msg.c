/*
 * msg.c: one encoder and one decoder per message payload (docs/PROTOCOL.md,
 * "Messages"). Every field is written and read one at a time, little-endian,
 * through two bounded cursors; a decoder must consume the payload exactly.
 * Must never allocate, never read past n, never trust a count before checking
 * it against a declared maximum with overflow-safe arithmetic, and never pass
 * a semantically impossible message (a layer range past the model, a scale
 * that is not a number) to the layers above.
 */
#include "proto.h"
#include "msg_train.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

/* ---- cursors ---- */

typedef struct wcur {
    uint8_t *p;          /* NULL: measure only */
    size_t cap, len;
    bool over;           /* ran past cap */
    const char *invalid; /* first field that failed validation */
} wcur;

static void w_bytes(wcur *w, const void *src, size_t n) {
    if (w->p && !w->over) {
        if (n > w->cap - w->len) w->over = true;
        else if (n) memcpy(w->p + w->len, src, n);
    }
    w->len += n;
}
static void w_u8(wcur *w, uint8_t v) { w_bytes(w, &v, 1); }
static void w_u16(wcur *w, uint16_t v) { uint8_t b[2]; cm_wr_u16(b, v); w_bytes(w, b, 2); }
static void w_u32(wcur *w, uint32_t v) { uint8_t b[4]; cm_wr_u32(b, v); w_bytes(w, b, 4); }
static void w_u64(wcur *w, uint64_t v) { uint8_t b[8]; cm_wr_u64(b, v); w_bytes(w, b, 8); }
static void w_i32(wcur *w, int32_t v) { w_u32(w, (uint32_t)v); }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static void w_f32(wcur *w, float v) { w_u32(w, f32_bits(v)); }
static void w_check(wcur *w, bool ok, const char *field) {
    if (!ok && !w->invalid) w->invalid = field;
}
/* Strings: u16 length, then the bytes (no NUL); at most max bytes. */
static void w_str(wcur *w, const char *s, size_t max, const char *field) {
    size_t n = strnlen(s, max + 1);
    w_check(w, n <= max, field);
    if (n > max) n = max;
    w_u16(w, (uint16_t)n);
    w_bytes(w, s, n);
}

typedef struct rcur {
    const uint8_t *p;
    size_t n, off;
    const char *bad;    /* first field that failed */
    const char *reason; /* "truncated" / "out of range" */
} rcur;

static void r_fail(rcur *r, const char *field, const char *reason) {
    if (!r->bad) { r->bad = field; r->reason = reason; }
}
static const uint8_t *r_take(rcur *r, size_t k, const char *field) {
    if (r->bad) return NULL;
    if (k > r->n - r->off) { r_fail(r, field, "truncated"); return NULL; }
    const uint8_t *q = r->p + r->off;
    r->off += k;
    return q;
}
static uint8_t r_u8(rcur *r, const char *f) { const uint8_t *q = r_take(r, 1, f); return q ? q[0] : 0; }
static uint16_t r_u16(rcur *r, const char *f) { const uint8_t *q = r_take(r, 2, f); return q ? cm_rd_u16(q) : 0; }
static uint32_t r_u32(rcur *r, const char *f) { const uint8_t *q = r_take(r, 4, f); return q ? cm_rd_u32(q) : 0; }
static uint64_t r_u64(rcur *r, const char *f) { const uint8_t *q = r_take(r, 8, f); return q ? cm_rd_u64(q) : 0; }
static int32_t r_i32(rcur *r, const char *f) { return (int32_t)r_u32(r, f); }
static float r_f32(rcur *r, const char *f) { return bits_f32(r_u32(r, f)); }
static void r_copy(rcur *r, void *dst, size_t k, const char *f) {
    const uint8_t *q = r_take(r, k, f);
    if (q) memcpy(dst, q, k); else memset(dst, 0, k);
}
static void r_check(rcur *r, bool ok, const char *field) {
    if (!ok) r_fail(r, field, "out of range");
}
/* Bytes below 0x20 and DEL are refused: peer strings end up in logs and on terminals. */
static void r_str(rcur *r, char *out, size_t max, const char *field) {
    out[0] = 0;
    uint16_t n = r_u16(r, field);
    if (r->bad) return;
    if (n > max) { r_fail(r, field, "too long"); return; }
    const uint8_t *q = r_take(r, n, field);
    if (!q) return;
    for (size_t i = 0; i < n; i++)
        if (q[i] < 0x20 || q[i] == 0x7f) { r_fail(r, field, "has control characters"); return; }
    memcpy(out, q, n);
    out[n] = 0;
}
/* A view of k elements of size sz, with the product overflow-checked. */
static const uint8_t *r_view(rcur *r, uint64_t k, uint64_t sz, const char *field) {
    uint64_t bytes;
    if (!cm_mul_ok(k, sz, &bytes) || bytes > SIZE_MAX) { r_fail(r, field, "too large"); return NULL; }
    return r_take(r, (size_t)bytes, field);
}

static bool finite_nonneg(float f) { return isfinite(f) && f >= 0.0f; }

/* ---- per-message validation shared by encoder and decoder ---- */

static const char *hello_invalid(const cm_msg_hello *h) {
    if (h->roles & ~(CM_ROLE_NODE | CM_ROLE_COORDINATOR)) return "roles";
    if (h->cores == 0 || h->cores > 65536) return "cores";
    if (h->mem_free > h->mem_total) return "mem_free";
    if (!finite_nonneg(h->gflops)) return "gflops";
    if (!finite_nonneg(h->mem_gbs)) return "mem_gbs";
    if (h->has_gpu && !h->has_tail) return "has_gpu"; /* the GPU tail follows the host tail */
    if (!finite_nonneg(h->gpu_gbs) || !finite_nonneg(h->gpu_gflops)) return "gpu_gbs/gpu_gflops";
    if (h->gpu_layers > CM_MSG_MAX_GPU_LAYERS) return "gpu_layers";
    return NULL;
}

/* The telemetry tail of a HEARTBEAT (has_stats). */
static const char *stats_invalid(const cm_msg_heartbeat *h) {
    if (!(isfinite(h->cpu_load) && h->cpu_load >= -1 && h->cpu_load <= 1)) return "cpu_load";
    if (!finite_nonneg(h->power_w) || h->power_src >= CM_POWER_SRC_COUNT) return "power";
    if (!finite_nonneg(h->tok_s) || !finite_nonneg(h->ms_per_tok)) return "tok_s/ms_per_tok";
    return NULL;
}

const char *cm_power_src_name(unsigned src) {
    static const char *names[CM_POWER_SRC_COUNT] = {"none", "rapl", "estimate", "counters"};
    return src < CM_POWER_SRC_COUNT ? names[src] : "unknown";
}

/* KV cache types a node can hold (ggml ids: F32 0, F16 1, Q4_0 2, Q8_0 8). */
static bool kv_types_ok(const cm_msg_assign *a) {
    const uint8_t ok[4] = {0, 1, 2, 8};
    bool k = false, v = false;
    for (int i = 0; i < 4; i++) k |= a->kv_type_k == ok[i], v |= a->kv_type_v == ok[i];
    return k && v && a->kv_rows <= 1;
}

static const char *assign_invalid(const cm_msg_assign *a) {
    if (a->flags & ~(CM_ASSIGN_F_EMBED | CM_ASSIGN_F_OUTPUT | CM_ASSIGN_F_TP_Q8 | CM_ASSIGN_F_EP | CM_ASSIGN_F_TAKE | CM_ASSIGN_F_KV))
        return "flags";
    if ((a->flags & CM_ASSIGN_F_TP_Q8) && a->tp_size < 2) return "flags";
    if ((a->flags & CM_ASSIGN_F_EP) && (a->tp_size < 2 || (a->flags & CM_ASSIGN_F_TP_Q8))) return "flags";
    if (a->n_layers == 0 || a->n_layers > 65536) return "n_layers";
    if (a->layer_begin >= a->layer_end || a->layer_end > a->n_layers) return "layer range";
    /* A member of a tensor-parallel group may hold no KV heads (FFN only) or
     * no FFN rows (attention only); a whole-layer stage holds both. */
    bool tp = a->tp_size > 1;
    if (a->head_begin > a->head_end || (!tp && a->head_begin == a->head_end) || a->head_end > 65536) return "head range";
    if (a->ffn_begin > a->ffn_end || (!tp && a->ffn_begin == a->ffn_end) || a->ffn_end > (1u << 24)) return "ffn range";
    if (a->n_ctx == 0 || a->n_ctx > (1u << 24) || a->n_seq_max == 0 || a->n_seq_max > 65536)
        return "kv size";
    if (a->n_stages == 0 || a->stage >= a->n_stages) return "stage";
    if (!(a->flags & CM_ASSIGN_F_EMBED) != !(a->stage == 0 && a->layer_begin == 0)) return "embed";
    if (!(a->flags & CM_ASSIGN_F_OUTPUT) !=
        !(a->stage == a->n_stages - 1 && a->layer_end == a->n_layers))
        return "output";
    if (a->hidden_dtype != CM_HIDDEN_F32 && a->hidden_dtype != CM_HIDDEN_Q8) return "hidden_dtype";
    if (a->tp_size == 0 || a->tp_size > CM_MSG_MAX_TP || a->tp_rank >= a->tp_size) return "tp";
    return NULL;
}

/* Expert bounds (CM_ASSIGN_F_EP): start at 0, never decrease, end above 0
 * (the model's expert count, checked by the node against its model). */
static bool expert_bounds_ok(const cm_msg_assign *a) {
    if (a->expert_bounds[0] != 0 || a->expert_bounds[a->tp_size] == 0) return false;
    for (unsigned i = 0; i < a->tp_size; i++)
        if (a->expert_bounds[i] > a->expert_bounds[i + 1]) return false;
    return true;
}

static const char *forward_shape_invalid(const cm_msg_forward *f) {
    if (f->n_tokens == 0 || f->n_tokens > CM_MSG_MAX_TOKENS) return "n_tokens";
    if (f->dtype >= CM_HIDDEN_COUNT) return "dtype";
    if (f->dtype == CM_HIDDEN_TOKENS ? f->dim != 0 : (f->dim == 0 || f->dim > CM_MSG_MAX_DIM))
        return "dim";
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
        if (!isfinite(a)) { w_check(w, false, "hidden (not finite)"); a = 0; }
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

/* ---- encode ---- */

static void enc_forward(wcur *w, const cm_msg_forward *f) {
    w_u64(w, f->epoch);
    w_u64(w, f->request_id);
    w_u32(w, f->n_tokens);
    w_u32(w, f->dim);
    w_u8(w, f->dtype);
    const char *bad = forward_shape_invalid(f);
    if (bad) { w_check(w, false, bad); return; }
    /* Too large for a frame: report the size (the caller says CM_ERANGE) without
     * reading arrays that may be shorter than the claimed counts. */
    uint64_t row = f->dtype == CM_HIDDEN_TOKENS ? 4 : f->dtype == CM_HIDDEN_F32 ? 4ull * f->dim
                                                                               : 4ull + f->dim;
    uint64_t body = (uint64_t)f->n_tokens * (9 + row);
    if (w->len + body > cm_msg_max_payload(CM_MSG_FORWARD)) { w->len += (size_t)body; return; }
    bool data_ok = f->pos && f->seq && f->want &&
                   (f->dtype == CM_HIDDEN_TOKENS ? f->tokens != NULL : f->hidden != NULL);
    w_check(w, data_ok, "arrays");
    if (!data_ok) return;
    for (uint32_t i = 0; i < f->n_tokens; i++) { w_check(w, f->pos[i] >= 0, "pos"); w_i32(w, f->pos[i]); }
    for (uint32_t i = 0; i < f->n_tokens; i++) { w_check(w, f->seq[i] >= 0, "seq"); w_i32(w, f->seq[i]); }
    for (uint32_t i = 0; i < f->n_tokens; i++) { w_check(w, f->want[i] < CM_WANT_COUNT, "want"); w_u8(w, f->want[i]); }
    if (f->dtype == CM_HIDDEN_TOKENS) {
        for (uint32_t i = 0; i < f->n_tokens; i++) { w_check(w, f->tokens[i] >= 0, "tokens"); w_i32(w, f->tokens[i]); }
    } else if (f->dtype == CM_HIDDEN_F32) {
        if (!w->p) { w->len += (size_t)f->n_tokens * f->dim * 4; return; }
        for (size_t k = 0; k < (size_t)f->n_tokens * f->dim; k++) w_f32(w, f->hidden[k]);
    } else {
        if (!w->p) { w->len += (size_t)f->n_tokens * (4 + (size_t)f->dim); return; }
        for (uint32_t i = 0; i < f->n_tokens; i++) q8_row(w, f->hidden + (size_t)i * f->dim, f->dim);
    }
}

static void encode(wcur *w, const cm_msg *m) {
    switch (m->type) {
    case CM_MSG_HELLO: {
        const cm_msg_hello *h = &m->u.hello;
        w_u16(w, h->proto_version);
        w_bytes(w, h->node_id, CM_NODE_ID_BYTES);
        w_str(w, h->name, CM_MSG_NAME_MAX, "name");
        w_u16(w, h->listen_port);
        w_u32(w, h->roles);
        w_u32(w, h->cores);
        w_str(w, h->isa, CM_MSG_ISA_MAX, "isa");
        w_u64(w, h->mem_total);
        w_u64(w, h->mem_free);
        w_str(w, h->os, CM_MSG_SHORT_MAX, "os");
        w_str(w, h->arch, CM_MSG_SHORT_MAX, "arch");
        w_str(w, h->version, CM_MSG_SHORT_MAX, "version");
        w_f32(w, h->gflops);
        w_f32(w, h->mem_gbs);
        if (h->has_tail) { /* issue 19 */
            w_str(w, h->host, CM_MSG_NAME_MAX, "host");
            w_u64(w, h->lease_epoch);
            w_u64(w, h->lease_since_ms);
            w_bytes(w, h->lease_owner_id, CM_NODE_ID_BYTES);
            w_str(w, h->lease_owner, CM_MSG_NAME_MAX, "lease_owner");
            w_str(w, h->lease_model, CM_MSG_NAME_MAX, "lease_model");
        }
        if (h->has_tail && h->has_gpu) { /* issue 16 */
            w_str(w, h->gpu_name, CM_MSG_GPU_NAME_MAX, "gpu_name");
            w_u64(w, h->gpu_mem);
            w_f32(w, h->gpu_gbs);
            w_f32(w, h->gpu_gflops);
            w_u32(w, h->gpu_layers);
        }
        const char *bad = hello_invalid(h);
        if (bad) w_check(w, false, bad);
        break;
    }
    case CM_MSG_HEARTBEAT: {
        const cm_msg_heartbeat *h = &m->u.heartbeat;
        w_u64(w, h->epoch);
        w_u64(w, h->wall_ms);
        w_u64(w, h->mono_ns);
        w_u32(w, h->load);
        if (!h->has_stats) break;
        const char *bad = stats_invalid(h);
        if (bad) w_check(w, false, bad);
        w_u64(w, h->mem_used);
        w_f32(w, h->cpu_load);
        w_f32(w, h->power_w);
        w_u8(w, h->power_src);
        w_f32(w, h->tok_s);
        w_f32(w, h->ms_per_tok);
        break;
    }
    case CM_MSG_PING:
    case CM_MSG_PONG: {
        const cm_msg_ping *p = &m->u.ping;
        w_u64(w, p->id);
        w_u64(w, p->sent_ns);
        if (m->type == CM_MSG_PING) {
            w_check(w, p->reply_len <= CM_MSG_MAX_CHUNK, "reply_len");
            w_u32(w, p->reply_len);
        }
        w_check(w, p->data_len <= CM_MSG_MAX_CHUNK && (p->data || !p->data_len), "data");
        w_u32(w, p->data_len);
        if (p->data) w_bytes(w, p->data, p->data_len); else w->len += p->data_len;
        break;
    }
    case CM_MSG_ASSIGN: {
        const cm_msg_assign *a = &m->u.assign;
        w_u64(w, a->epoch);
        w_bytes(w, a->model_sha256, 32);
        w_str(w, a->model_name, CM_MSG_NAME_MAX, "model_name");
        w_u32(w, a->flags);
        w_u32(w, a->n_layers);
        w_u32(w, a->layer_begin);
        w_u32(w, a->layer_end);
        w_u32(w, a->head_begin);
        w_u32(w, a->head_end);
        w_u32(w, a->ffn_begin);
        w_u32(w, a->ffn_end);
        w_u32(w, a->n_ctx);
        w_u32(w, a->n_seq_max);
        w_u16(w, a->stage);
        w_u16(w, a->n_stages);
        w_u8(w, a->hidden_dtype);
        w_str(w, a->prev, CM_MSG_ADDR_MAX, "prev");
        w_str(w, a->next, CM_MSG_ADDR_MAX, "next");
        w_u8(w, a->tp_rank);
        w_u8(w, a->tp_size);
        const char *bad = assign_invalid(a);
        if (bad) { w_check(w, false, bad); break; }
        for (unsigned i = 0; i < a->tp_size; i++) w_str(w, a->tp_peers[i], CM_MSG_ADDR_MAX, "tp_peers");
        if (a->flags & CM_ASSIGN_F_EP) {
            w_check(w, expert_bounds_ok(a), "expert_bounds");
            for (unsigned i = 0; i <= a->tp_size; i++) w_u16(w, a->expert_bounds[i]);
        }
        if (a->flags & CM_ASSIGN_F_KV) {
            w_check(w, kv_types_ok(a), "kv_type");
            w_u8(w, a->kv_type_k);
            w_u8(w, a->kv_type_v);
            w_u8(w, a->kv_rows);
        }
        break;
    }
    case CM_MSG_READY:
        w_u64(w, m->u.ready.epoch);
        w_check(w, m->u.ready.status <= 0, "status");
        w_i32(w, m->u.ready.status);
        w_u64(w, m->u.ready.bytes_missing);
        w_str(w, m->u.ready.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_WEIGHTS_REQ:
        w_bytes(w, m->u.weights_req.tensor_hash, 32);
        w_u64(w, m->u.weights_req.offset);
        w_check(w, m->u.weights_req.len > 0 && m->u.weights_req.len <= CM_MSG_MAX_CHUNK, "len");
        w_u32(w, m->u.weights_req.len);
        break;
    case CM_MSG_WEIGHTS_CHUNK: {
        const cm_msg_weights_chunk *c = &m->u.weights_chunk;
        uint64_t end;
        w_bytes(w, c->tensor_hash, 32);
        w_u64(w, c->offset);
        w_u64(w, c->total);
        w_check(w, c->data_len <= CM_MSG_MAX_CHUNK && (c->data || !c->data_len), "data");
        w_check(w, cm_add_ok(c->offset, c->data_len, &end) && end <= c->total, "offset");
        w_u32(w, c->data_len);
        if (c->data) w_bytes(w, c->data, c->data_len); else w->len += c->data_len;
        break;
    }
    case CM_MSG_FORWARD: enc_forward(w, &m->u.forward); break;
    case CM_MSG_TOKEN: {
        const cm_msg_token *t = &m->u.token;
        const char *bad = token_invalid(t);
        if (bad) { w_check(w, false, bad); break; }
        w_u64(w, t->epoch);
        w_u64(w, t->request_id);
        w_i32(w, t->seq);
        w_i32(w, t->pos);
        w_i32(w, t->token);
        w_f32(w, t->logprob);
        w_u8(w, t->n_top);
        for (unsigned i = 0; i < t->n_top; i++) { w_i32(w, t->top_token[i]); w_f32(w, t->top_logprob[i]); }
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
        w_check(w, a->n > 0 && a->data && cm_add_ok(a->elem_offset, a->n, &end) && end <= UINT32_MAX,
                "n");
        w_u32(w, a->n);
        if (!a->data) break;
        if ((uint64_t)a->n * 4 > cm_msg_max_payload(CM_MSG_ALLREDUCE)) { w->len += (size_t)a->n * 4; break; }
        if (!w->p) { w->len += (size_t)a->n * 4; break; }
        for (uint32_t i = 0; i < a->n; i++) w_f32(w, a->data[i]);
        break;
    }
    case CM_MSG_ERROR:
        w_check(w, m->u.error.code < 0, "code");
        w_i32(w, m->u.error.code);
        w_str(w, m->u.error.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_BYE: w_str(w, m->u.bye.text, CM_MSG_TEXT_MAX, "text"); break;
    case CM_MSG_OUTPUT: {
        const cm_msg_output *o = &m->u.output;
        w_u64(w, o->epoch);
        w_u64(w, o->request_id);
        w_i32(w, o->seq);
        w_u8(w, o->kind);
        w_u32(w, o->n_rows);
        w_u32(w, o->dim);
        const char *bad = output_shape_invalid(o);
        if (bad) { w_check(w, false, bad); break; }
        w_check(w, (o->pos || o->pos_le) && (o->data || o->data_le), "arrays");
        if (!(o->pos || o->pos_le) || !(o->data || o->data_le)) break;
        for (uint32_t i = 0; i < o->n_rows; i++) {
            int32_t v = o->pos ? o->pos[i] : (int32_t)cm_rd_u32(o->pos_le + 4 * (size_t)i);
            w_check(w, v >= 0, "pos");
            w_i32(w, v);
        }
        size_t nf = (size_t)o->n_rows * o->dim;
        if (!w->p) { w->len += nf * 4; break; }
        if (!o->data) { w_bytes(w, o->data_le, nf * 4); break; } /* a decoded message re-encodes as is */
        for (size_t k = 0; k < nf; k++) w_f32(w, o->data[k]);
        break;
    }
    case CM_MSG_TRAIN: { /* msg_train.c */
        size_t n = 0;
        bool over = false;
        const bool room = w->p && !w->over;
        const char *bad = cm_msg_train_put(&m->u.train, room ? w->p + w->len : NULL, room ? w->cap - w->len : 0, &n, &over);
        w_check(w, !bad, bad);
        if (over) w->over = true;
        w->len += n;
        break;
    }
    case CM_MSG_SEQ_START: {
        const cm_msg_seq_start *c = &m->u.seq_start;
        const char *bad = seq_start_invalid(c);
        if (bad) { w_check(w, false, bad); break; }
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
    case CM_MSG_LINKS_REQ: {
        const cm_msg_links_req *q = &m->u.links_req;
        w_check(w, q->deadline_ms >= 1 && q->deadline_ms <= CM_MSG_LINKS_MAX_MS, "deadline_ms");
        w_check(w, q->probe_bytes <= CM_MSG_LINKS_MAX_PROBE, "probe_bytes");
        w_check(w, q->n_peers >= 1 && q->n_peers <= CM_MSG_MAX_PEERS, "n_peers");
        w_u64(w, q->id);
        w_u32(w, q->deadline_ms);
        w_u32(w, q->probe_bytes);
        w_u8(w, q->n_peers);
        for (unsigned i = 0; i < q->n_peers && i < CM_MSG_MAX_PEERS; i++) w_str(w, q->peers[i], CM_MSG_ADDR_MAX, "peer");
        break;
    }
    case CM_MSG_LINKS: {
        const cm_msg_links *q = &m->u.links;
        w_check(w, q->n <= CM_MSG_MAX_PEERS, "n");
        w_u64(w, q->id);
        w_u8(w, q->n);
        for (unsigned i = 0; i < q->n && i < CM_MSG_MAX_PEERS; i++) {
            const cm_msg_link *l = &q->link[i];
            w_check(w, l->status <= 0, "status");
            w_check(w, finite_nonneg(l->rtt_s), "rtt_s");
            w_check(w, finite_nonneg(l->bw), "bw");
            w_str(w, l->addr, CM_MSG_ADDR_MAX, "addr");
            w_i32(w, l->status);
            w_f32(w, l->rtt_s);
            w_f32(w, l->bw);
        }
        break;
    }
    default: w_check(w, false, "type"); break;
    }
}

int cm_msg_encode(const cm_msg *m, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen) {
    const char *tn = cm_msg_type_name(m->type);
    wcur w = {out, out ? cap : 0, 0, false, NULL};
    *len = 0;
    encode(&w, m);
    if (w.invalid)
        return cm_errf(err, errlen, CM_EINVAL, "cannot encode %s: field '%s' out of range", tn,
                       w.invalid);
    if (w.len > cm_msg_max_payload(m->type))
        return cm_errf(err, errlen, CM_ERANGE, "%s of %zu bytes exceeds the maximum of %u", tn,
                       w.len, (unsigned)cm_msg_max_payload(m->type));
    if (w.over)
        return cm_errf(err, errlen, CM_ERANGE, "cannot encode %s: %zu bytes do not fit in %zu", tn,
                       w.len, cap);
    *len = w.len;
    return 0;
}

/* ---- decode ---- */

static void dec_forward(rcur *r, cm_msg_forward *f) {
    f->epoch = r_u64(r, "epoch");
    f->request_id = r_u64(r, "request_id");
    f->n_tokens = r_u32(r, "n_tokens");
    f->dim = r_u32(r, "dim");
    f->dtype = r_u8(r, "dtype");
    if (r->bad) return;
    const char *bad = forward_shape_invalid(f);
    if (bad) { r_fail(r, bad, "out of range"); return; }
    uint32_t n = f->n_tokens;
    f->pos_le = r_view(r, n, 4, "pos");
    f->seq_le = r_view(r, n, 4, "seq");
    f->want_le = r_view(r, n, 1, "want");
    uint64_t row = f->dtype == CM_HIDDEN_TOKENS ? 4 : f->dtype == CM_HIDDEN_F32 ? 4ull * f->dim
                                                                               : 4ull + f->dim;
    f->data_le = r_view(r, n, row, "data");
    if (r->bad) return;
    for (uint32_t i = 0; i < n; i++) {
        if ((int32_t)cm_rd_u32(f->pos_le + 4 * i) < 0) { r_fail(r, "pos", "negative"); return; }
        if ((int32_t)cm_rd_u32(f->seq_le + 4 * i) < 0) { r_fail(r, "seq", "negative"); return; }
        if (f->want_le[i] >= CM_WANT_COUNT) { r_fail(r, "want", "not 0..3"); return; }
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

static int decode(rcur *r, unsigned type, cm_msg *m) {
    switch (type) {
    case CM_MSG_HELLO: {
        cm_msg_hello *h = &m->u.hello;
        h->proto_version = r_u16(r, "proto_version");
        r_copy(r, h->node_id, CM_NODE_ID_BYTES, "node_id");
        r_str(r, h->name, CM_MSG_NAME_MAX, "name");
        h->listen_port = r_u16(r, "listen_port");
        h->roles = r_u32(r, "roles");
        h->cores = r_u32(r, "cores");
        r_str(r, h->isa, CM_MSG_ISA_MAX, "isa");
        h->mem_total = r_u64(r, "mem_total");
        h->mem_free = r_u64(r, "mem_free");
        r_str(r, h->os, CM_MSG_SHORT_MAX, "os");
        r_str(r, h->arch, CM_MSG_SHORT_MAX, "arch");
        r_str(r, h->version, CM_MSG_SHORT_MAX, "version");
        h->gflops = r_f32(r, "gflops");
        h->mem_gbs = r_f32(r, "mem_gbs");
        if (!r->bad && r->off < r->n) { /* the tail (issue 19); an older peer ends here */
            h->has_tail = true;
            r_str(r, h->host, CM_MSG_NAME_MAX, "host");
            h->lease_epoch = r_u64(r, "lease_epoch");
            h->lease_since_ms = r_u64(r, "lease_since_ms");
            r_copy(r, h->lease_owner_id, CM_NODE_ID_BYTES, "lease_owner_id");
            r_str(r, h->lease_owner, CM_MSG_NAME_MAX, "lease_owner");
            r_str(r, h->lease_model, CM_MSG_NAME_MAX, "lease_model");
        }
        if (!r->bad && r->off < r->n) { /* the GPU tail (issue 16); a node without a GPU ends here */
            h->has_gpu = true;
            r_str(r, h->gpu_name, CM_MSG_GPU_NAME_MAX, "gpu_name");
            h->gpu_mem = r_u64(r, "gpu_mem");
            h->gpu_gbs = r_f32(r, "gpu_gbs");
            h->gpu_gflops = r_f32(r, "gpu_gflops");
            h->gpu_layers = r_u32(r, "gpu_layers");
        }
        if (!r->bad) { const char *bad = hello_invalid(h); if (bad) r_fail(r, bad, "out of range"); }
        break;
    }
    case CM_MSG_HEARTBEAT: {
        cm_msg_heartbeat *h = &m->u.heartbeat;
        h->epoch = r_u64(r, "epoch");
        h->wall_ms = r_u64(r, "wall_ms");
        h->mono_ns = r_u64(r, "mono_ns");
        h->load = r_u32(r, "load");
        if (r->bad || r->off == r->n) break; /* no telemetry tail */
        h->has_stats = true;
        h->mem_used = r_u64(r, "mem_used");
        h->cpu_load = r_f32(r, "cpu_load");
        h->power_w = r_f32(r, "power_w");
        h->power_src = r_u8(r, "power_src");
        h->tok_s = r_f32(r, "tok_s");
        h->ms_per_tok = r_f32(r, "ms_per_tok");
        if (!r->bad) { const char *bad = stats_invalid(h); if (bad) r_fail(r, bad, "out of range"); }
        break;
    }
    case CM_MSG_PING:
    case CM_MSG_PONG: {
        cm_msg_ping *p = &m->u.ping;
        p->id = r_u64(r, "id");
        p->sent_ns = r_u64(r, "sent_ns");
        if (type == CM_MSG_PING) {
            p->reply_len = r_u32(r, "reply_len");
            r_check(r, p->reply_len <= CM_MSG_MAX_CHUNK, "reply_len");
        }
        p->data_len = r_u32(r, "data_len");
        r_check(r, p->data_len <= CM_MSG_MAX_CHUNK, "data_len");
        p->data = r_view(r, p->data_len, 1, "data");
        break;
    }
    case CM_MSG_ASSIGN: {
        cm_msg_assign *a = &m->u.assign;
        a->epoch = r_u64(r, "epoch");
        r_copy(r, a->model_sha256, 32, "model_sha256");
        r_str(r, a->model_name, CM_MSG_NAME_MAX, "model_name");
        a->flags = r_u32(r, "flags");
        a->n_layers = r_u32(r, "n_layers");
        a->layer_begin = r_u32(r, "layer_begin");
        a->layer_end = r_u32(r, "layer_end");
        a->head_begin = r_u32(r, "head_begin");
        a->head_end = r_u32(r, "head_end");
        a->ffn_begin = r_u32(r, "ffn_begin");
        a->ffn_end = r_u32(r, "ffn_end");
        a->n_ctx = r_u32(r, "n_ctx");
        a->n_seq_max = r_u32(r, "n_seq_max");
        a->stage = r_u16(r, "stage");
        a->n_stages = r_u16(r, "n_stages");
        a->hidden_dtype = r_u8(r, "hidden_dtype");
        r_str(r, a->prev, CM_MSG_ADDR_MAX, "prev");
        r_str(r, a->next, CM_MSG_ADDR_MAX, "next");
        a->tp_rank = r_u8(r, "tp_rank");
        a->tp_size = r_u8(r, "tp_size");
        if (r->bad) break;
        const char *bad = assign_invalid(a);
        if (bad) { r_fail(r, bad, "out of range"); break; }
        for (unsigned i = 0; i < a->tp_size; i++) r_str(r, a->tp_peers[i], CM_MSG_ADDR_MAX, "tp_peers");
        if (a->flags & CM_ASSIGN_F_EP) {
            for (unsigned i = 0; i <= a->tp_size; i++) a->expert_bounds[i] = r_u16(r, "expert_bounds");
            r_check(r, expert_bounds_ok(a), "expert_bounds");
        }
        if (a->flags & CM_ASSIGN_F_KV) {
            a->kv_type_k = r_u8(r, "kv_type_k");
            a->kv_type_v = r_u8(r, "kv_type_v");
            a->kv_rows = r_u8(r, "kv_rows");
            r_check(r, kv_types_ok(a), "kv_type");
        }
        break;
    }
    case CM_MSG_READY:
        m->u.ready.epoch = r_u64(r, "epoch");
        m->u.ready.status = r_i32(r, "status");
        r_check(r, m->u.ready.status <= 0, "status");
        m->u.ready.bytes_missing = r_u64(r, "bytes_missing");
        r_str(r, m->u.ready.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_WEIGHTS_REQ:
        r_copy(r, m->u.weights_req.tensor_hash, 32, "tensor_hash");
        m->u.weights_req.offset = r_u64(r, "offset");
        m->u.weights_req.len = r_u32(r, "len");
        r_check(r, m->u.weights_req.len > 0 && m->u.weights_req.len <= CM_MSG_MAX_CHUNK, "len");
        break;
    case CM_MSG_WEIGHTS_CHUNK: {
        cm_msg_weights_chunk *c = &m->u.weights_chunk;
        uint64_t end = 0;
        r_copy(r, c->tensor_hash, 32, "tensor_hash");
        c->offset = r_u64(r, "offset");
        c->total = r_u64(r, "total");
        c->data_len = r_u32(r, "data_len");
        r_check(r, c->data_len <= CM_MSG_MAX_CHUNK, "data_len");
        r_check(r, cm_add_ok(c->offset, c->data_len, &end) && end <= c->total, "offset");
        c->data = r_view(r, c->data_len, 1, "data");
        break;
    }
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
        if (!r->bad) { const char *bad = token_invalid(t); if (bad) r_fail(r, bad, "out of range"); }
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
        if (!r->bad) { const char *bad = seq_config_invalid(c); if (bad) r_fail(r, bad, "out of range"); }
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
    case CM_MSG_ERROR:
        m->u.error.code = r_i32(r, "code");
        r_check(r, m->u.error.code < 0, "code");
        r_str(r, m->u.error.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_BYE: r_str(r, m->u.bye.text, CM_MSG_TEXT_MAX, "text"); break;
    case CM_MSG_OUTPUT: {
        cm_msg_output *o = &m->u.output;
        o->epoch = r_u64(r, "epoch");
        o->request_id = r_u64(r, "request_id");
        o->seq = r_i32(r, "seq");
        o->kind = r_u8(r, "kind");
        o->n_rows = r_u32(r, "n_rows");
        o->dim = r_u32(r, "dim");
        if (r->bad) break;
        { const char *bad = output_shape_invalid(o); if (bad) { r_fail(r, bad, "out of range"); break; } }
        o->pos_le = r_view(r, o->n_rows, 4, "pos");
        o->data_le = r_view(r, o->n_rows, 4ull * o->dim, "data");
        for (uint32_t i = 0; i < o->n_rows && !r->bad; i++)
            if ((int32_t)cm_rd_u32(o->pos_le + 4 * (size_t)i) < 0) r_fail(r, "pos", "negative");
        break;
    }
    case CM_MSG_TRAIN: { /* msg_train.c */
        const char *reason = NULL;
        size_t used = 0;
        const char *bad = cm_msg_train_take(r->p + r->off, r->n - r->off, &m->u.train, &used, &reason);
        if (bad) r_fail(r, bad, reason);
        else r->off += used;
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
        { const char *bad = seq_start_invalid(c); if (bad) { r_fail(r, bad, "out of range"); break; } }
        c->hist_le = r_view(r, c->n_hist, 4, "hist");
        for (uint32_t i = 0; i < c->n_hist && !r->bad; i++)
            if ((int32_t)cm_rd_u32(c->hist_le + 4 * (size_t)i) < 0) r_fail(r, "hist", "negative");
        break;
    }
    case CM_MSG_LINKS_REQ: {
        cm_msg_links_req *q = &m->u.links_req;
        q->id = r_u64(r, "id");
        q->deadline_ms = r_u32(r, "deadline_ms");
        r_check(r, q->deadline_ms >= 1 && q->deadline_ms <= CM_MSG_LINKS_MAX_MS, "deadline_ms");
        q->probe_bytes = r_u32(r, "probe_bytes");
        r_check(r, q->probe_bytes <= CM_MSG_LINKS_MAX_PROBE, "probe_bytes");
        q->n_peers = r_u8(r, "n_peers");
        r_check(r, q->n_peers >= 1 && q->n_peers <= CM_MSG_MAX_PEERS, "n_peers");
        for (unsigned i = 0; i < q->n_peers && !r->bad; i++) r_str(r, q->peers[i], CM_MSG_ADDR_MAX, "peer");
        break;
    }
    case CM_MSG_LINKS: {
        cm_msg_links *q = &m->u.links;
        q->id = r_u64(r, "id");
        q->n = r_u8(r, "n");
        r_check(r, q->n <= CM_MSG_MAX_PEERS, "n");
        for (unsigned i = 0; i < q->n && !r->bad; i++) {
            cm_msg_link *l = &q->link[i];
            r_str(r, l->addr, CM_MSG_ADDR_MAX, "addr");
            l->status = r_i32(r, "status");
            r_check(r, l->status <= 0, "status");
            l->rtt_s = r_f32(r, "rtt_s");
            r_check(r, finite_nonneg(l->rtt_s), "rtt_s");
            l->bw = r_f32(r, "bw");
            r_check(r, finite_nonneg(l->bw), "bw");
        }
        break;
    }
    default: return CM_EUNSUPPORTED;
    }
    return 0;
}

int cm_msg_decode(unsigned type, const uint8_t *p, size_t n, cm_msg *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->type = type;
    const char *tn = cm_msg_type_name(type);
    if (n > cm_msg_max_payload(type) && cm_msg_max_payload(type))
        return cm_errf(err, errlen, CM_ERANGE, "%s payload of %zu bytes exceeds the maximum of %u",
                       tn, n, (unsigned)cm_msg_max_payload(type));
    rcur r = {p, n, 0, NULL, NULL};
    if (decode(&r, type, m) == CM_EUNSUPPORTED)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "no message codec for type %u (%s)", type, tn);
    if (r.bad)
        return cm_errf(err, errlen, CM_EFORMAT, "malformed %s payload: field '%s' %s", tn, r.bad,
                       r.reason);
    if (r.off != n)
        return cm_errf(err, errlen, CM_EFORMAT, "malformed %s payload: %zu trailing bytes", tn,
                       n - r.off);
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
