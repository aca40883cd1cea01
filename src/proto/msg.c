/*
 * msg.c: one encoder and one decoder per message payload (docs/PROTOCOL.md,
 * "Messages"): the entry points cm_msg_encode / cm_msg_decode and the control
 * messages; ASSIGN and the weight transfer are in msg_assign.c, the token path
 * in msg_data.c, the cursors in msg_impl.h. Every field is written and read one
 * at a time, little-endian, through two bounded cursors; a decoder must consume
 * the payload exactly. Must never allocate, never read past n, never trust a
 * count before checking it against a declared maximum with overflow-safe
 * arithmetic, and never pass a semantically impossible message (a layer range
 * past the model, a scale that is not a number) to the layers above.
 */
#include "msg_impl.h"
#include "msg_train.h"

/* ---- control messages: HELLO, HEARTBEAT, PING/PONG, READY, ERROR, BYE, LINKS, EXPERT_LOAD ---- */

uint32_t cm_msg_expert_load_count(const cm_msg_expert_load *m, uint32_t i) {
    return m->counts ? m->counts[i] : cm_rd_u32(m->counts_le + 4 * (size_t)i);
}

/* The field that breaks EXPERT_LOAD's bounds, or NULL (encoder and decoder). */
static const char *expert_load_invalid(const cm_msg_expert_load *q) {
    if (q->n_expert == 0 || q->n_expert > CM_MSG_MAX_EXPERTS) return "n_expert";
    if (q->n_layers == 0 || (uint32_t)q->n_layers * q->n_expert > CM_MSG_MAX_EXPERT_CELLS) return "n_layers";
    if (q->layer_begin >= 65536u || q->layer_begin + q->n_layers > 65536u) return "layer_begin";
    return NULL;
}

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

static bool enc_control(wcur *w, const cm_msg *m) {
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
        if (p->data) w_bytes(w, p->data, p->data_len);
        else w->len += p->data_len;
        break;
    }
    case CM_MSG_READY:
        w_u64(w, m->u.ready.epoch);
        w_check(w, m->u.ready.status <= 0, "status");
        w_i32(w, m->u.ready.status);
        w_u64(w, m->u.ready.bytes_missing);
        w_str(w, m->u.ready.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_ERROR:
        w_check(w, m->u.error.code < 0, "code");
        w_i32(w, m->u.error.code);
        w_str(w, m->u.error.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_BYE: w_str(w, m->u.bye.text, CM_MSG_TEXT_MAX, "text"); break;
    case CM_MSG_TRAIN: { /* msg_train.c */
        size_t n = 0;
        bool over = false;
        const bool room = w->p && !w->over;
        const char *bad =
            cm_msg_train_put(&m->u.train, room ? w->p + w->len : NULL, room ? w->cap - w->len : 0, &n, &over);
        w_check(w, !bad, bad);
        if (over) w->over = true;
        w->len += n;
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
        for (unsigned i = 0; i < q->n_peers && i < CM_MSG_MAX_PEERS; i++)
            w_str(w, q->peers[i], CM_MSG_ADDR_MAX, "peer");
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
    case CM_MSG_EXPERT_LOAD: {
        const cm_msg_expert_load *q = &m->u.expert_load;
        const char *bad = expert_load_invalid(q);
        w_check(w, !bad, bad);
        w_check(w, bad || q->counts || q->counts_le, "counts");
        if (bad || (!q->counts && !q->counts_le)) break;
        w_u64(w, q->epoch);
        w_u32(w, q->layer_begin);
        w_u16(w, q->n_layers);
        w_u16(w, q->n_expert);
        const uint32_t cells = (uint32_t)q->n_layers * q->n_expert;
        for (uint32_t i = 0; i < cells; i++) w_u32(w, cm_msg_expert_load_count(q, i));
        break;
    }
    default: return false;
    }
    return true;
}

static void encode(wcur *w, const cm_msg *m) {
    if (!enc_control(w, m) && !cm_msg_enc_assign(w, m) && !cm_msg_enc_data(w, m)) w_check(w, false, "type");
}

int cm_msg_encode(const cm_msg *m, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen) {
    const char *tn = cm_msg_type_name(m->type);
    wcur w = {out, out ? cap : 0, 0, false, NULL};
    *len = 0;
    encode(&w, m);
    if (w.invalid) return cm_errf(err, errlen, CM_EINVAL, "cannot encode %s: field '%s' out of range", tn, w.invalid);
    if (w.len > cm_msg_max_payload(m->type))
        return cm_errf(err, errlen, CM_ERANGE, "%s of %zu bytes exceeds the maximum of %u", tn, w.len,
                       (unsigned)cm_msg_max_payload(m->type));
    if (w.over) return cm_errf(err, errlen, CM_ERANGE, "cannot encode %s: %zu bytes do not fit in %zu", tn, w.len, cap);
    *len = w.len;
    return 0;
}

static int dec_control(rcur *r, unsigned type, cm_msg *m) {
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
        if (!r->bad) {
            const char *bad = hello_invalid(h);
            if (bad) r_fail(r, bad, "out of range");
        }
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
        if (!r->bad) {
            const char *bad = stats_invalid(h);
            if (bad) r_fail(r, bad, "out of range");
        }
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
    case CM_MSG_READY:
        m->u.ready.epoch = r_u64(r, "epoch");
        m->u.ready.status = r_i32(r, "status");
        r_check(r, m->u.ready.status <= 0, "status");
        m->u.ready.bytes_missing = r_u64(r, "bytes_missing");
        r_str(r, m->u.ready.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_ERROR:
        m->u.error.code = r_i32(r, "code");
        r_check(r, m->u.error.code < 0, "code");
        r_str(r, m->u.error.text, CM_MSG_TEXT_MAX, "text");
        break;
    case CM_MSG_BYE: r_str(r, m->u.bye.text, CM_MSG_TEXT_MAX, "text"); break;
    case CM_MSG_TRAIN: { /* msg_train.c */
        const char *reason = NULL;
        size_t used = 0;
        const char *bad = cm_msg_train_take(r->p + r->off, r->n - r->off, &m->u.train, &used, &reason);
        if (bad) r_fail(r, bad, reason);
        else r->off += used;
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
    case CM_MSG_EXPERT_LOAD: {
        cm_msg_expert_load *q = &m->u.expert_load;
        q->epoch = r_u64(r, "epoch");
        q->layer_begin = r_u32(r, "layer_begin");
        q->n_layers = r_u16(r, "n_layers");
        q->n_expert = r_u16(r, "n_expert");
        if (r->bad) break;
        const char *bad = expert_load_invalid(q);
        if (bad) {
            r_fail(r, bad, "out of range");
            break;
        }
        q->counts_le = r_view(r, (uint64_t)q->n_layers * q->n_expert, 4, "counts");
        break;
    }
    default: return CM_EUNSUPPORTED;
    }
    return 0;
}

static int decode(rcur *r, unsigned type, cm_msg *m) {
    int rc = dec_control(r, type, m);
    if (rc == CM_EUNSUPPORTED) rc = cm_msg_dec_assign(r, type, m);
    if (rc == CM_EUNSUPPORTED) rc = cm_msg_dec_data(r, type, m);
    return rc;
}

int cm_msg_decode(unsigned type, const uint8_t *p, size_t n, cm_msg *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->type = type;
    const char *tn = cm_msg_type_name(type);
    if (n > cm_msg_max_payload(type) && cm_msg_max_payload(type))
        return cm_errf(err, errlen, CM_ERANGE, "%s payload of %zu bytes exceeds the maximum of %u", tn, n,
                       (unsigned)cm_msg_max_payload(type));
    rcur r = {p, n, 0, NULL, NULL};
    if (decode(&r, type, m) == CM_EUNSUPPORTED)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "no message codec for type %u (%s)", type, tn);
    if (r.bad) return cm_errf(err, errlen, CM_EFORMAT, "malformed %s payload: field '%s' %s", tn, r.bad, r.reason);
    if (r.off != n) return cm_errf(err, errlen, CM_EFORMAT, "malformed %s payload: %zu trailing bytes", tn, n - r.off);
    return 0;
}
