/*
 * msg_assign.c: the codecs of ASSIGN (a node's part of the plan) and of the
 * weight transfer it may start (WEIGHTS_REQ, WEIGHTS_CHUNK). Same rules as
 * msg.c: bounded cursors, counts checked before use, no impossible plan
 * (a layer range past the model, a rank outside its group) passed on.
 */
#include "msg_impl.h"

/* KV cache types a node can hold (ggml ids: F32 0, F16 1, Q4_0 2, Q8_0 8). */
static bool kv_types_ok(const cm_msg_assign *a) {
    const uint8_t ok[4] = {0, 1, 2, 8};
    bool k = false, v = false;
    for (int i = 0; i < 4; i++) k |= a->kv_type_k == ok[i], v |= a->kv_type_v == ok[i];
    return k && v && a->kv_rows <= 1;
}

static const char *assign_invalid(const cm_msg_assign *a) {
    if (a->flags & ~(CM_ASSIGN_F_EMBED | CM_ASSIGN_F_OUTPUT | CM_ASSIGN_F_TP_Q8 | CM_ASSIGN_F_EP | CM_ASSIGN_F_TAKE |
                     CM_ASSIGN_F_KV | CM_ASSIGN_F_REPLICAS | CM_ASSIGN_F_HEAD | CM_ASSIGN_F_LORA))
        return "flags";
    if ((a->flags & CM_ASSIGN_F_HEAD) &&
        (a->tp_size < 2 || !(a->flags & CM_ASSIGN_F_OUTPUT) || (a->flags & CM_ASSIGN_F_EP)))
        return "flags";
    if ((a->flags & CM_ASSIGN_F_REPLICAS) && !(a->flags & CM_ASSIGN_F_EP)) return "flags";
    if ((a->flags & CM_ASSIGN_F_TP_Q8) && a->tp_size < 2) return "flags";
    if ((a->flags & CM_ASSIGN_F_EP) && (a->tp_size < 2 || (a->flags & CM_ASSIGN_F_TP_Q8))) return "flags";
    if (a->n_layers == 0 || a->n_layers > 65536) return "n_layers";
    if (a->layer_begin >= a->layer_end || a->layer_end > a->n_layers) return "layer range";
    /* A member of a tensor-parallel group may hold no KV heads (FFN only) or
     * no FFN rows (attention only); a whole-layer stage holds both. */
    bool tp = a->tp_size > 1;
    if (a->head_begin > a->head_end || (!tp && a->head_begin == a->head_end) || a->head_end > 65536)
        return "head range";
    if (a->ffn_begin > a->ffn_end || (!tp && a->ffn_begin == a->ffn_end) || a->ffn_end > (1u << 24)) return "ffn range";
    if (a->n_ctx == 0 || a->n_ctx > (1u << 24) || a->n_seq_max == 0 || a->n_seq_max > 65536) return "kv size";
    if (a->n_stages == 0 || a->stage >= a->n_stages) return "stage";
    if (!(a->flags & CM_ASSIGN_F_EMBED) != !(a->stage == 0 && a->layer_begin == 0)) return "embed";
    if (!(a->flags & CM_ASSIGN_F_OUTPUT) != !(a->stage == a->n_stages - 1 && a->layer_end == a->n_layers))
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

/* Replicas (CM_ASSIGN_F_REPLICAS): per rank at most CM_MSG_MAX_REPLICAS,
 * ascending, each an expert of the model (below the last bound) outside the
 * rank's own bounds; at least one in the group (else the flag is not sent). */
static bool replicas_ok(const cm_msg_assign *a) {
    const unsigned n_expert = a->expert_bounds[a->tp_size];
    unsigned total = 0;
    for (unsigned r = 0; r < a->tp_size; r++) {
        if (a->n_replicas[r] > CM_MSG_MAX_REPLICAS) return false;
        for (unsigned i = 0; i < a->n_replicas[r]; i++) {
            const unsigned e = a->replicas[r][i];
            if (e >= n_expert || (i && e <= a->replicas[r][i - 1])) return false;
            if (e >= a->expert_bounds[r] && e < a->expert_bounds[r + 1]) return false;
        }
        total += a->n_replicas[r];
    }
    return total > 0;
}

bool cm_msg_enc_assign(wcur *w, const cm_msg *m) {
    switch (m->type) {
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
        if (bad) {
            w_check(w, false, bad);
            break;
        }
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
        if (a->flags & CM_ASSIGN_F_REPLICAS) {
            w_check(w, replicas_ok(a), "replicas");
            for (unsigned r = 0; r < a->tp_size; r++) {
                w_u8(w, a->n_replicas[r]);
                for (unsigned i = 0; i < a->n_replicas[r] && i < CM_MSG_MAX_REPLICAS; i++) w_u16(w, a->replicas[r][i]);
            }
        }
        if (a->flags & CM_ASSIGN_F_LORA) {
            w_check(w, a->lora_bytes > 0 && a->lora_bytes <= CM_MSG_MAX_LORA_BYTES, "lora_bytes");
            w_bytes(w, a->lora_sha256, 32);
            w_u32(w, a->lora_bytes);
        }
        break;
    }
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
        if (c->data) w_bytes(w, c->data, c->data_len);
        else w->len += c->data_len;
        break;
    }
    default: return false;
    }
    return true;
}

int cm_msg_dec_assign(rcur *r, unsigned type, cm_msg *m) {
    switch (type) {
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
        if (bad) {
            r_fail(r, bad, "out of range");
            break;
        }
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
        if (a->flags & CM_ASSIGN_F_REPLICAS) {
            for (unsigned k = 0; k < a->tp_size && !r->bad; k++) {
                a->n_replicas[k] = r_u8(r, "n_replicas");
                r_check(r, a->n_replicas[k] <= CM_MSG_MAX_REPLICAS, "n_replicas");
                for (unsigned i = 0; i < a->n_replicas[k] && !r->bad; i++) a->replicas[k][i] = r_u16(r, "replicas");
            }
            if (!r->bad) r_check(r, replicas_ok(a), "replicas");
        }
        if (a->flags & CM_ASSIGN_F_LORA) {
            r_copy(r, a->lora_sha256, 32, "lora_sha256");
            a->lora_bytes = r_u32(r, "lora_bytes");
            r_check(r, a->lora_bytes > 0 && a->lora_bytes <= CM_MSG_MAX_LORA_BYTES, "lora_bytes");
        }
        break;
    }
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
    default: return CM_EUNSUPPORTED;
    }
    return 0;
}
