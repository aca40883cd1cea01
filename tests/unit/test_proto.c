/* test_proto.c: the wire protocol without sockets — header layout against bytes
 * written out by hand from docs/PROTOCOL.md, a round trip of every message,
 * every truncation and random corruptions refused, oversized lengths refused
 * from the header alone, the handshake (same key, wrong key, mode and version
 * mismatches) and sealed frames (replay, reorder, bit flips, downgrades). */
#include "test.h"

#include "base/base.h"
#include "proto/proto.h"

#include <math.h>

static const uint8_t k_key[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                  17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

/* Fixed inputs for the array-carrying messages. */
static int32_t g_pos[8] = {0, 1, 2, 3, 7, 8, 9, 100}, g_seq[8] = {0, 0, 0, 0, 1, 1, 1, 2};
static int32_t g_tok[8] = {1, 15043, 3186, 0, 5, 6, 31999, 2};
static uint8_t g_want[8] = {0, 0, 0, 1, 0, 2, 3, 1}; /* enum cm_want */
static float g_hidden[8 * 5];
static float g_partial[33];
static uint8_t g_blob[300];

/* A valid message of each type (deterministic contents). */
static void sample(unsigned type, cm_msg *m, int variant) {
    memset(m, 0, sizeof *m);
    m->type = type;
    switch (type) {
    case CM_MSG_HELLO: {
        cm_msg_hello *h = &m->u.hello;
        h->proto_version = CM_PROTO_VERSION;
        for (int i = 0; i < 16; i++) h->node_id[i] = (uint8_t)(i * 17 + 3);
        strcpy(h->name, "mac-mini-2 \xc3\xa9");
        h->listen_port = 7070;
        h->roles = CM_ROLE_NODE;
        h->cores = 10;
        strcpy(h->isa, "neon,dotprod,fp16");
        h->mem_total = 16ull << 30;
        h->mem_free = 11ull << 30;
        strcpy(h->os, "darwin");
        strcpy(h->arch, "arm64");
        strcpy(h->version, CM_VERSION);
        h->gflops = 123.5f;
        h->mem_gbs = 42.25f;
        /* issue 19's tail: 0 the host id, 1 also a lease, 2 none (an older peer) */
        h->has_tail = variant != 2;
        if (variant != 2) strcpy(h->host, "mac-mini-2-1a2b3c4d");
        if (variant == 1) {
            h->lease_epoch = 1764670000123ull;
            h->lease_since_ms = 1764669990000ull;
            for (int i = 0; i < 16; i++) h->lease_owner_id[i] = (uint8_t)(200 - i);
            strcpy(h->lease_owner, "vm at 10.0.0.1:51234");
            strcpy(h->lease_model, "llama-3.2-1b-q4_0.gguf");
            /* issue 16: a node with a GPU adds its tail after the lease */
            h->has_gpu = true;
            strcpy(h->gpu_name, "llvmpipe (LLVM 15.0.6, 256 bits)");
            h->gpu_mem = 24ull << 30;
            h->gpu_gbs = 812.5f;
            h->gpu_gflops = 24000.0f;
            h->gpu_layers = 20;
        }
        break;
    }
    case CM_MSG_HEARTBEAT:
        m->u.heartbeat =
            (cm_msg_heartbeat){.epoch = 7, .wall_ms = 1764670000123ull, .mono_ns = 987654321ull, .load = 250};
        if (variant) { /* issue 19: the telemetry tail (1: RAPL; 2: an estimate, load unknown) */
            m->u.heartbeat.has_stats = true;
            m->u.heartbeat.mem_used = 5ull << 30;
            m->u.heartbeat.cpu_load = variant == 1 ? 0.75f : -1.0f;
            m->u.heartbeat.power_w = variant == 1 ? 18.5f : 65.0f;
            m->u.heartbeat.power_src = variant == 1 ? CM_POWER_RAPL : CM_POWER_ESTIMATE;
            m->u.heartbeat.tok_s = 42.5f;
            m->u.heartbeat.ms_per_tok = 3.25f;
        }
        break;
    case CM_MSG_PING:
    case CM_MSG_PONG:
        m->u.ping.id = 42;
        m->u.ping.sent_ns = 123456789;
        m->u.ping.reply_len = type == CM_MSG_PING ? 4096 : 0;
        m->u.ping.data = g_blob;
        m->u.ping.data_len = variant ? 0 : sizeof g_blob;
        break;
    case CM_MSG_ASSIGN: {
        cm_msg_assign *a = &m->u.assign;
        a->epoch = 3;
        for (int i = 0; i < 32; i++) a->model_sha256[i] = (uint8_t)(255 - i);
        strcpy(a->model_name, "stories260K-q8_0.gguf");
        a->flags = CM_ASSIGN_F_OUTPUT;
        a->n_layers = 5;
        a->layer_begin = 3;
        a->layer_end = 5;
        a->head_begin = 0;
        a->head_end = 8;
        a->ffn_begin = 0;
        a->ffn_end = 768;
        a->n_ctx = 512;
        a->n_seq_max = 4;
        a->stage = 1;
        a->n_stages = 2;
        a->hidden_dtype = CM_HIDDEN_Q8;
        strcpy(a->prev, "[fe80::1]:7070");
        a->tp_rank = 1;
        a->tp_size = 2;
        strcpy(a->tp_peers[0], "10.0.0.2:7070");
        strcpy(a->tp_peers[1], "10.0.0.3:7070");
        if (variant >= 2) { /* an expert group (expert parallelism): its members' expert bounds follow */
            a->flags |= CM_ASSIGN_F_EP;
            a->expert_bounds[0] = 0;
            a->expert_bounds[1] = 3;
            a->expert_bounds[2] = 8;
        }
        if (variant == 3) { /* hot-expert replicas: rank 0 also holds 5, rank 1 also 0 and 1 */
            a->flags |= CM_ASSIGN_F_REPLICAS;
            a->n_replicas[0] = 1;
            a->replicas[0][0] = 5;
            a->n_replicas[1] = 2;
            a->replicas[1][0] = 0;
            a->replicas[1][1] = 1;
        }
        if (variant == 4) { /* LoRA adapters: the member's parts, an object of 12345 bytes */
            a->flags |= CM_ASSIGN_F_LORA;
            for (int i = 0; i < 32; i++) a->lora_sha256[i] = (uint8_t)(7 * i + 1);
            a->lora_bytes = 12345;
        }
        break;
    }
    case CM_MSG_READY:
        m->u.ready.epoch = 3;
        m->u.ready.status = variant ? CM_ENOMEM : 0;
        m->u.ready.bytes_missing = 1234567;
        strcpy(m->u.ready.text, variant ? "not enough memory" : "");
        break;
    case CM_MSG_WEIGHTS_REQ:
        memset(m->u.weights_req.tensor_hash, 0xab, 32);
        m->u.weights_req.offset = 1ull << 33;
        m->u.weights_req.len = 1 << 20;
        break;
    case CM_MSG_WEIGHTS_CHUNK:
        memset(m->u.weights_chunk.tensor_hash, 0xcd, 32);
        m->u.weights_chunk.offset = 100;
        m->u.weights_chunk.total = 100 + sizeof g_blob;
        m->u.weights_chunk.data = g_blob;
        m->u.weights_chunk.data_len = sizeof g_blob;
        break;
    case CM_MSG_FORWARD: {
        cm_msg_forward *f = &m->u.forward;
        f->epoch = 9;
        f->request_id = 77;
        f->n_tokens = 8;
        f->pos = g_pos;
        f->seq = g_seq;
        f->want = g_want;
        f->dtype = (uint8_t)(variant % 3);
        if (f->dtype == CM_HIDDEN_TOKENS) f->tokens = g_tok;
        else {
            f->dim = 5;
            f->hidden = g_hidden;
        }
        break;
    }
    case CM_MSG_TOKEN: {
        cm_msg_token *t = &m->u.token;
        t->epoch = 9;
        t->request_id = 77;
        t->seq = 2;
        t->pos = 100;
        t->token = 31999;
        t->logprob = -0.25f;
        t->n_top = variant ? 0 : 3;
        for (int i = 0; i < 3; i++) {
            t->top_token[i] = 31999 - i;
            t->top_logprob[i] = -0.25f * (float)(i + 1);
        }
        break;
    }
    case CM_MSG_SEQ_CONFIG:
        m->u.seq_config = (cm_msg_seq_config){9, 77, 2, 0.8f, 0.95f, 0.05f, 1.1f, 40, 1234, 5};
        break;
    case CM_MSG_SEQ_FREE: m->u.seq_free = (cm_msg_seq_free){9, 77, 2}; break;
    case CM_MSG_ALLREDUCE: {
        cm_msg_allreduce *a = &m->u.allreduce;
        a->epoch = 9;
        a->op_id = 1000;
        a->layer = 4;
        a->point = 1;
        a->step = 2;
        a->elem_offset = 64;
        a->n = 33;
        a->data = g_partial;
        break;
    }
    case CM_MSG_ERROR:
        m->u.error.code = CM_EAUTH;
        strcpy(m->u.error.text, "the peer does not know this cluster's key");
        break;
    case CM_MSG_BYE: strcpy(m->u.bye.text, "node shutting down"); break;
    case CM_MSG_SEQ_START: {
        cm_msg_seq_start *c = &m->u.seq_start;
        *c = (cm_msg_seq_start){.epoch = 9,
                                .request_id = 77,
                                .seq = 2,
                                .temperature = 0.8f,
                                .top_k = 40,
                                .top_p = 0.95f,
                                .min_p = 0.05f,
                                .repeat_penalty = 1.1f,
                                .repeat_last_n = 64,
                                .presence_penalty = 0.5f,
                                .frequency_penalty = -0.25f,
                                .seed = 1234,
                                .n_sampled = variant ? 0 : 0x1234567890abull,
                                .n_probs = 5};
        c->n_hist = variant ? 0 : 8;
        c->hist = variant ? NULL : g_tok;
        break;
    }
    case CM_MSG_OUTPUT: { /* hidden rows (1 or 8 of 5 floats), or one row of "logits" (40 floats) */
        cm_msg_output *o = &m->u.output;
        *o = (cm_msg_output){.epoch = 9,
                             .request_id = 77,
                             .seq = 2,
                             .kind = variant == 2 ? CM_OUTPUT_LOGITS : CM_OUTPUT_HIDDEN,
                             .n_rows = variant == 0 ? 8 : 1,
                             .dim = variant == 2 ? 40 : 5,
                             .pos = g_pos,
                             .data = g_hidden};
        break;
    }
    case CM_MSG_TRAIN: { /* FWD to the last stage (8 rows of 5, targets), a SLICE of 33 floats, a SETUP */
        static const int32_t tgt[8] = {5, -1, 7, 0, 31999, -1, 2, 3};
        cm_msg_train *t = &m->u.train;
        *t = (cm_msg_train){.epoch = 9, .id = 77 + (uint64_t)variant, .key = 0xfedcba9876543210ull};
        if (variant == 0) {
            t->op = CM_TRAIN_FWD, t->flags = CM_TRAIN_F_TARGETS | CM_TRAIN_F_BACKWARD, t->n_rows = 8, t->dim = 5;
            t->f[0] = 1.0f / 37, t->f[1] = 0.1f, t->target = tgt, t->data = g_hidden;
        } else if (variant == 1) {
            t->op = CM_TRAIN_SLICE, t->vec = CM_TRAIN_VEC_G, t->n_rows = 1, t->dim = 33, t->offset = 1u << 20;
            t->data = g_partial;
        } else {
            t->op = CM_TRAIN_SETUP, t->rank = 8, t->targets = 0x7f, t->n_ctx = 256, t->f[0] = 16;
            t->offset = 3; /* windows in flight */
        }
        break;
    }
    case CM_MSG_LINKS_REQ: {
        cm_msg_links_req *q = &m->u.links_req;
        q->id = 0x1234567890ull + (uint64_t)variant;
        q->deadline_ms = variant == 2 ? CM_MSG_LINKS_MAX_MS : 3000;
        q->probe_bytes = variant == 1 ? 0 : 65536;
        q->n_peers = variant == 2 ? CM_MSG_MAX_PEERS : (uint8_t)(1 + variant);
        for (int i = 0; i < q->n_peers; i++) snprintf(q->peers[i], sizeof q->peers[i], "10.78.0.%d:7070", i + 2);
        if (variant == 1) strcpy(q->peers[1], "[fe80::1%eth0]:7070");
        break;
    }
    case CM_MSG_SEQ_LORA: { /* 3 adapters (one off, one negative), none, or the most */
        cm_msg_seq_lora *q = &m->u.seq_lora;
        *q = (cm_msg_seq_lora){.epoch = 9,
                               .seq = 2 + variant,
                               .n = variant == 1   ? 0
                                    : variant == 2 ? CM_MSG_MAX_LORA
                                                   : 3};
        for (uint32_t i = 0; i < q->n; i++) q->scale[i] = i == 1 ? 0.0f : (float)i * 0.25f - 0.5f;
        break;
    }
    case CM_MSG_EXPERT_LOAD: { /* 3 layers x 8 experts from layer 2; one count of 0; the last layer */
        static uint32_t cnt[24];
        for (int i = 0; i < 24; i++) cnt[i] = (uint32_t)(i * 37 + 1);
        cnt[5] = UINT32_MAX;
        cm_msg_expert_load *q = &m->u.expert_load;
        *q = (cm_msg_expert_load){.epoch = 9, .layer_begin = 2, .n_layers = 3, .n_expert = 8, .counts = cnt};
        if (variant == 1) q->layer_begin = 0, q->n_layers = 1, q->n_expert = 1, q->counts = cnt + 23, cnt[23] = 0;
        if (variant == 2) q->layer_begin = 65535, q->n_layers = 1, q->n_expert = 16;
        break;
    }
    case CM_MSG_LINKS: {
        cm_msg_links *q = &m->u.links;
        q->id = 0x1234567890ull + (uint64_t)variant;
        q->n = (uint8_t)(variant == 2 ? 0 : 1 + variant);
        for (int i = 0; i < q->n; i++) {
            snprintf(q->link[i].addr, sizeof q->link[i].addr, "10.78.0.%d:7070", i + 2);
            q->link[i].rtt_s = 1.5e-4f * (float)(i + 1);
            q->link[i].bw = i ? 0 : 1.25e9f;
            q->link[i].status = i ? CM_ETIMEDOUT : 0;
        }
        break;
    }
    }
}

static void init_data(void) {
    cm_rng r;
    cm_rng_seed(&r, 1234);
    for (size_t i = 0; i < CM_ARRAY_LEN(g_hidden); i++) g_hidden[i] = cm_rng_normal(&r) * 3.0f;
    g_hidden[7] = 0; /* a row with a zero and (below) one all-zero row for Q8 */
    for (int j = 0; j < 5; j++) g_hidden[5 * 2 + j] = 0;
    for (size_t i = 0; i < CM_ARRAY_LEN(g_partial); i++) g_partial[i] = cm_rng_normal(&r);
    for (size_t i = 0; i < sizeof g_blob; i++) g_blob[i] = (uint8_t)cm_rng_next(&r);
}

static size_t enc(const cm_msg *m, uint8_t *out, size_t cap) {
    size_t n = 0, n2 = 0;
    char e[256];
    int rc = cm_msg_encode(m, NULL, 0, &n, e, sizeof e);
    CHECKF(rc == 0, "%s: %s", cm_msg_type_name(m->type), e);
    rc = cm_msg_encode(m, out, cap, &n2, e, sizeof e);
    CHECKF(rc == 0 && n2 == n, "%s: %s (%zu vs %zu)", cm_msg_type_name(m->type), e, n, n2);
    return n2;
}

/* The header layout, byte for byte, as PROTOCOL.md states it. */
static void test_header_layout(void) {
    cm_frame_hdr h = {CM_PROTO_VERSION, CM_MSG_FORWARD, 3, 0x0102030405060708ull, 0x00a0b0c0};
    uint8_t b[CM_FRAME_HDR];
    cm_frame_hdr_encode(&h, b);
    const uint8_t want[CM_FRAME_HDR] = {'C',  'M',  'L',  'O', CM_PROTO_VERSION, 12, 3, 0, 8, 7, 6, 5, 4, 3, 2, 1,
                                        0xc0, 0xb0, 0xa0, 0};
    CHECK(!memcmp(b, want, sizeof want));
    cm_frame_hdr d;
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, NULL, 0) == 0);
    CHECK(d.type == CM_MSG_FORWARD && d.seq == h.seq && d.len == h.len && d.flags == 3);
    /* HEARTBEAT payload: epoch u64, wall_ms u64, mono_ns u64, load u32, little-endian. */
    cm_msg m;
    sample(CM_MSG_HEARTBEAT, &m, 0);
    m.u.heartbeat = (cm_msg_heartbeat){.epoch = 0x11, .wall_ms = 0x2233, .mono_ns = 0x44, .load = 0x55667788};
    uint8_t p[64];
    size_t n = enc(&m, p, sizeof p);
    const uint8_t wp[28] = {0x11, 0, 0,    0, 0, 0, 0, 0, 0x33, 0x22, 0,    0,    0,    0,
                            0,    0, 0x44, 0, 0, 0, 0, 0, 0,    0,    0x88, 0x77, 0x66, 0x55};
    CHECK(n == 28 && !memcmp(p, wp, 28));
}

/* Peers of other versions (proto.h): the version byte of any cumulo header;
 * a refusal in the peer's own version whose bytes are the same in every
 * version (the layout a node of version 1 reads: magic, version, type 17,
 * flags 0, seq 0, len; code i32 and a u16-counted text); the words, from
 * both sides, naming both versions and which side to update. */
static void test_version_refusal(void) {
    uint8_t b[CM_FRAME_HDR + 1024];
    unsigned v = 0;
    cm_frame_hdr h = {77, CM_MSG_AUTH_INIT, 0, 0, CM_HS_INIT_BYTES};
    cm_frame_hdr_encode(&h, b);
    CHECK(cm_frame_hdr_version(b, CM_FRAME_HDR, &v) && v == 77);
    CHECK(!cm_frame_hdr_version(b, CM_FRAME_HDR - 1, &v));
    b[0] = 'G';
    CHECK(!cm_frame_hdr_version(b, CM_FRAME_HDR, &v));

    char old_side[300], new_side[300];
    cm_proto_mismatch_text(old_side, sizeof old_side, 1, 2); /* what a node of version 1 is told */
    cm_proto_mismatch_text(new_side, sizeof new_side, 2, 1); /* what the node of version 2 says */
    CHECKF(!strcmp(old_side, "protocol version mismatch: that node runs cumulo protocol 2, this node protocol 1: "
                             "update cumulo on this node (every node of a cluster must speak the same protocol "
                             "version)"),
           "%s", old_side);
    CHECKF(strstr(new_side, "that node runs cumulo protocol 1, this node protocol 2: update cumulo on that node"), "%s",
           new_side);

    size_t n = 0;
    char e[256];
    CHECK(cm_frame_refusal(1, CM_EUNSUPPORTED, old_side, b, sizeof b, &n, e, sizeof e) == 0);
    const size_t tl = strlen(old_side);
    CHECK(n == CM_FRAME_HDR + 4 + 2 + tl);
    static const uint8_t want_hdr[CM_FRAME_HDR - 4] = {'C', 'M', 'L', 'O', 1, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(!memcmp(b, want_hdr, sizeof want_hdr));
    CHECK(cm_rd_u32(b + 16) == n - CM_FRAME_HDR);
    CHECK(cm_rd_u32(b + CM_FRAME_HDR) == (uint32_t)CM_EUNSUPPORTED);
    CHECK(cm_rd_u16(b + CM_FRAME_HDR + 4) == tl && !memcmp(b + CM_FRAME_HDR + 6, old_side, tl));
    cm_msg m;
    CHECK(cm_msg_decode(CM_MSG_ERROR, b + CM_FRAME_HDR, n - CM_FRAME_HDR, &m, e, sizeof e) == 0);
    CHECK(m.u.error.code == CM_EUNSUPPORTED && !strcmp(m.u.error.text, old_side));
    CHECK(cm_frame_refusal(1, CM_EUNSUPPORTED, old_side, b, CM_FRAME_HDR + 10, &n, e, sizeof e) == CM_ERANGE);
    CHECK(cm_frame_refusal(256, CM_EUNSUPPORTED, old_side, b, sizeof b, &n, e, sizeof e) == CM_EINVAL);
}

static void test_header_refusals(void) {
    char w[64];
    cm_frame_hdr h = {CM_PROTO_VERSION, CM_MSG_HEARTBEAT, 0, 0, 28}, d;
    uint8_t b[CM_FRAME_HDR];
    char e[256];
    cm_frame_hdr_encode(&h, b);
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == 0);
    for (size_t n = 0; n < CM_FRAME_HDR; n++) CHECK(cm_frame_hdr_decode(b, n, &d, e, sizeof e) == CM_EFORMAT);
    b[4] = CM_PROTO_VERSION + 1; /* version */
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_EUNSUPPORTED);
    snprintf(w, sizeof w, "protocol version %d", CM_PROTO_VERSION + 1);
    CHECKF(strstr(e, w) != NULL, "%s", e);
    b[4] = CM_PROTO_VERSION;
    b[5] = 200; /* type */
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_EUNSUPPORTED);
    CHECKF(strstr(e, "unknown message type 200") != NULL, "%s", e);
    b[5] = 0;
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_EUNSUPPORTED);
    b[5] = CM_MSG_HEARTBEAT;
    b[0] = 'G'; /* "GET / HTTP/1.1" */
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_EFORMAT);
    b[0] = 'C';
    b[6] = 0x04; /* unknown flag */
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_EFORMAT);
    b[6] = CM_FRAME_F_ENC; /* encryption without MAC */
    CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_EFORMAT);
    b[6] = 0;
    /* Oversized lengths: refused from the header alone, for every type. */
    for (unsigned t = 1; t < CM_MSG_COUNT; t++) {
        h.type = (uint8_t)t;
        h.len = cm_msg_max_payload(t);
        cm_frame_hdr_encode(&h, b);
        CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == 0);
        h.len = cm_msg_max_payload(t) + 1;
        cm_frame_hdr_encode(&h, b);
        CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_ERANGE);
        h.len = UINT32_MAX;
        cm_frame_hdr_encode(&h, b);
        CHECK(cm_frame_hdr_decode(b, sizeof b, &d, e, sizeof e) == CM_ERANGE);
    }
    CHECKF(strstr(e, "exceeds the maximum") != NULL, "%s", e);
    CHECK(!strcmp(cm_msg_type_name(CM_MSG_FORWARD), "FORWARD"));
    CHECK(!strcmp(cm_msg_type_name(999), "unknown"));
}

static void check_forward(const cm_msg_forward *a, const cm_msg_forward *d) {
    CHECK(d->epoch == a->epoch && d->request_id == a->request_id && d->n_tokens == a->n_tokens && d->dim == a->dim &&
          d->dtype == a->dtype);
    for (uint32_t i = 0; i < d->n_tokens; i++) {
        CHECK(cm_msg_forward_pos(d, i) == a->pos[i]);
        CHECK(cm_msg_forward_seq(d, i) == a->seq[i]);
        CHECK(cm_msg_forward_want(d, i) == a->want[i]);
        if (a->dtype == CM_HIDDEN_TOKENS) {
            CHECK(cm_msg_forward_token(d, i) == a->tokens[i]);
            continue;
        }
        float row[5], amax = 0;
        cm_msg_forward_row(d, i, row);
        for (uint32_t j = 0; j < a->dim; j++) amax = fmaxf(amax, fabsf(a->hidden[i * a->dim + j]));
        for (uint32_t j = 0; j < a->dim; j++) {
            float x = a->hidden[i * a->dim + j];
            if (a->dtype == CM_HIDDEN_F32) CHECK(row[j] == x);
            /* Q8: rounding to the nearest of 255 levels errs by at most half a step (+ f32 slack). */
            else CHECKF(fabsf(row[j] - x) <= amax / 127.0f * 0.5f * 1.0001f + 1e-7f, "%g vs %g", row[j], x);
        }
    }
}

static void test_roundtrip_all(void) {
    static uint8_t buf[4096], buf2[4096];
    char e[256];
    for (unsigned t = CM_MSG_HELLO; t < CM_MSG_COUNT; t++) {
        for (int v = 0; v < 3; v++) {
            cm_msg m, d;
            sample(t, &m, v);
            size_t n = enc(&m, buf, sizeof buf);
            int rc = cm_msg_decode(t, buf, n, &d, e, sizeof e);
            CHECKF(rc == 0, "%s: %s", cm_msg_type_name(t), e);
            if (rc) continue;
            if (t == CM_MSG_FORWARD) {
                check_forward(&m.u.forward, &d.u.forward);
                continue;
            }
            if (t == CM_MSG_ALLREDUCE) {
                float out[33];
                cm_msg_allreduce_get(&d.u.allreduce, out);
                CHECK(d.u.allreduce.n == 33 && d.u.allreduce.elem_offset == 64 && d.u.allreduce.layer == 4);
                CHECK(!memcmp(out, g_partial, sizeof out));
                continue;
            }
            /* Everything else: decode then re-encode gives the same bytes. */
            size_t n2 = enc(&d, buf2, sizeof buf2);
            CHECKF(n2 == n && !memcmp(buf, buf2, n), "%s re-encodes differently", cm_msg_type_name(t));
        }
    }
    /* A few fields by name. */
    cm_msg m, d;
    sample(CM_MSG_HELLO, &m, 0);
    size_t n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_HELLO, buf, n, &d, e, sizeof e) == 0);
    CHECK(!strcmp(d.u.hello.name, "mac-mini-2 \xc3\xa9") && d.u.hello.gflops == 123.5f && d.u.hello.mem_gbs == 42.25f &&
          d.u.hello.mem_total == (16ull << 30) && !memcmp(d.u.hello.node_id, m.u.hello.node_id, 16));
    /* SEQ_START carries the count a resumed sampler draws on from. */
    sample(CM_MSG_SEQ_START, &m, 0);
    size_t ns = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_SEQ_START, buf, ns, &d, e, sizeof e) == 0 &&
          d.u.seq_start.n_sampled == 0x1234567890abull && d.u.seq_start.seed == 1234 && d.u.seq_start.n_hist == 8);
    sample(CM_MSG_HELLO, &m, 0);
    memset(m.u.hello.isa, 'a', CM_MSG_ISA_MAX); /* the longest ISA string fits... */
    m.u.hello.isa[CM_MSG_ISA_MAX] = 0;
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_HELLO, buf, n, &d, e, sizeof e) == 0 && strlen(d.u.hello.isa) == CM_MSG_ISA_MAX);
    /* ...one more byte is refused: by the encoder, and by the decoder (the same payload
     * with the isa field grown by hand; it starts after version, id, name, port, roles, cores) */
    size_t off = 2 + 16 + 2 + strlen(m.u.hello.name) + 2 + 4 + 4;
    CHECK(cm_rd_u16(buf + off) == CM_MSG_ISA_MAX);
    static uint8_t grown[4096];
    memcpy(grown, buf, off);
    cm_wr_u16(grown + off, CM_MSG_ISA_MAX + 1);
    memset(grown + off + 2, 'a', CM_MSG_ISA_MAX + 1);
    memcpy(grown + off + 2 + CM_MSG_ISA_MAX + 1, buf + off + 2 + CM_MSG_ISA_MAX, n - off - 2 - CM_MSG_ISA_MAX);
    CHECK(cm_msg_decode(CM_MSG_HELLO, grown, n + 1, &d, e, sizeof e) == CM_EFORMAT);
    CHECKF(strstr(e, "'isa' too long") != NULL, "%s", e);
    grown[off] = CM_MSG_ISA_MAX; /* shrunk back to the original bytes, it decodes again */
    memmove(grown + off + 2 + CM_MSG_ISA_MAX, grown + off + 3 + CM_MSG_ISA_MAX, n - off - 2 - CM_MSG_ISA_MAX);
    CHECK(cm_msg_decode(CM_MSG_HELLO, grown, n, &d, e, sizeof e) == 0);
    memset(m.u.hello.isa, 'a', sizeof m.u.hello.isa); /* no NUL within the maximum */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 0);
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_ASSIGN, buf, n, &d, e, sizeof e) == 0);
    CHECK(!strcmp(d.u.assign.tp_peers[1], "10.0.0.3:7070") && !strcmp(d.u.assign.prev, "[fe80::1]:7070") &&
          d.u.assign.next[0] == 0 && d.u.assign.layer_end == 5);
    sample(CM_MSG_TOKEN, &m, 0);
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_TOKEN, buf, n, &d, e, sizeof e) == 0);
    CHECK(d.u.token.n_top == 3 && d.u.token.top_token[2] == 31997 && d.u.token.top_logprob[2] == -0.75f);
    sample(CM_MSG_PING, &m, 0);
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_PING, buf, n, &d, e, sizeof e) == 0);
    CHECK(d.u.ping.data == buf + 24 && d.u.ping.data_len == sizeof g_blob && d.u.ping.reply_len == 4096);
}

/* Every strict prefix of every payload is refused, and so is any trailing byte. */
static void test_truncation(void) {
    static uint8_t buf[4096];
    char e[256];
    int refused = 0, total = 0;
    for (unsigned t = CM_MSG_HELLO; t < CM_MSG_COUNT; t++) {
        for (int v = 0; v < 3; v++) {
            cm_msg m, d;
            sample(t, &m, v);
            size_t n = enc(&m, buf, sizeof buf);
            /* An optional tail (issue 19: HELLO's host and lease, HEARTBEAT's
             * telemetry) may be absent as a whole: that one prefix is the
             * message of an older peer, and decodes without the tail. */
            size_t base = 0, base_gpu = 0;
            if ((t == CM_MSG_HELLO && m.u.hello.has_tail) || (t == CM_MSG_HEARTBEAT && m.u.heartbeat.has_stats)) {
                cm_msg old = m;
                if (t == CM_MSG_HELLO) old.u.hello.has_tail = old.u.hello.has_gpu = false;
                if (t == CM_MSG_HEARTBEAT) old.u.heartbeat.has_stats = false;
                CHECK(cm_msg_encode(&old, NULL, 0, &base, e, sizeof e) == 0 && base < n);
            }
            if (t == CM_MSG_HELLO && m.u.hello.has_gpu) { /* issue 16: a node without a GPU ends before its tail */
                cm_msg old = m;
                old.u.hello.has_gpu = false;
                CHECK(cm_msg_encode(&old, NULL, 0, &base_gpu, e, sizeof e) == 0 && base < base_gpu && base_gpu < n);
            }
            for (size_t k = 0; k < n; k++) {
                /* copy the prefix into its own allocation so ASan sees any over-read */
                uint8_t *p = malloc(k ? k : 1);
                memcpy(p, buf, k);
                int rc = cm_msg_decode(t, p, k, &d, e, sizeof e);
                free(p);
                if (base_gpu && k == base_gpu) {
                    CHECKF(rc == 0 && d.u.hello.has_tail && !d.u.hello.has_gpu, "HELLO without its GPU tail: rc %d %s",
                           rc, e);
                    continue;
                }
                if (base && k == base) {
                    CHECKF(rc == 0 && !(t == CM_MSG_HELLO ? d.u.hello.has_tail : d.u.heartbeat.has_stats),
                           "%s without its tail: rc %d %s", cm_msg_type_name(t), rc, e);
                    continue;
                }
                total++;
                refused += rc == CM_EFORMAT;
                CHECKF(rc == CM_EFORMAT, "%s truncated to %zu of %zu: rc %d", cm_msg_type_name(t), k, n, rc);
            }
            buf[n] = 0;
            CHECK(cm_msg_decode(t, buf, n + 1, &d, e, sizeof e) == CM_EFORMAT);
        }
    }
    CHECK(refused == total && total > 1000);
    CHECKF(strstr(e, "trailing") != NULL, "%s", e);
}

/* Random corruption of payloads: decoding never crashes and what it accepts re-encodes. */
static void test_corruption(void) {
    static uint8_t buf[4096];
    cm_rng r;
    cm_rng_seed(&r, 99);
    char e[256];
    int accepted = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        unsigned t = CM_MSG_HELLO + (unsigned)(cm_rng_next(&r) % (CM_MSG_COUNT - CM_MSG_HELLO));
        cm_msg m, d;
        sample(t, &m, (int)(cm_rng_next(&r) % 3));
        size_t n = enc(&m, buf, sizeof buf);
        int flips = 1 + (int)(cm_rng_next(&r) % 4);
        for (int f = 0; f < flips; f++) buf[cm_rng_next(&r) % n] ^= (uint8_t)(1u << (cm_rng_next(&r) % 8));
        uint8_t *p = malloc(n);
        memcpy(p, buf, n);
        if (cm_msg_decode(t, p, n, &d, e, sizeof e) == 0) accepted++;
        else refused++;
        free(p);
    }
    CHECK(accepted > 0 && refused > 0); /* the corpus exercises both paths */
    /* Counts from a hostile peer are checked before use: a FORWARD claiming the maximum
     * tokens and dimension in a tiny payload is refused without touching memory. */
    cm_msg m, d;
    sample(CM_MSG_FORWARD, &m, 1);
    size_t n = enc(&m, buf, sizeof buf);
    cm_wr_u32(buf + 16, CM_MSG_MAX_TOKENS);
    cm_wr_u32(buf + 20, CM_MSG_MAX_DIM);
    CHECK(cm_msg_decode(CM_MSG_FORWARD, buf, n, &d, e, sizeof e) == CM_EFORMAT);
    cm_wr_u32(buf + 16, 0xffffffffu);
    CHECK(cm_msg_decode(CM_MSG_FORWARD, buf, n, &d, e, sizeof e) == CM_EFORMAT);
    CHECKF(strstr(e, "n_tokens") != NULL, "%s", e);
    /* A string with a control character (log injection) is refused. */
    sample(CM_MSG_HELLO, &m, 0);
    strcpy(m.u.hello.name, "evil\nnode");
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_HELLO, buf, n, &d, e, sizeof e) == CM_EFORMAT);
    CHECKF(strstr(e, "control") != NULL, "%s", e);
}

/* Issue 19: the HEARTBEAT telemetry tail and the HELLO tail (host, lease),
 * byte layout and bounds both ways; ASSIGN's TAKE flag. */
static void test_issue19_fields(void) {
    static uint8_t buf[4096];
    char e[256];
    cm_msg m, d;
    size_t n;
    sample(CM_MSG_HEARTBEAT, &m, 1);
    n = enc(&m, buf, sizeof buf);
    CHECKF(n == 53, "heartbeat with telemetry: %zu bytes",
           n); /* 28 + mem_used 8, cpu_load 4, power_w 4, src 1, tok_s 4, ms 4 */
    CHECK(cm_rd_u64(buf + 28) == (5ull << 30) && buf[44] == CM_POWER_RAPL);
    float f;
    uint32_t u = cm_rd_u32(buf + 40);
    memcpy(&f, &u, 4);
    CHECK(f == 18.5f);
    CHECK(cm_msg_decode(CM_MSG_HEARTBEAT, buf, n, &d, e, sizeof e) == 0 && d.u.heartbeat.has_stats &&
          d.u.heartbeat.power_src == CM_POWER_RAPL && d.u.heartbeat.tok_s == 42.5f &&
          d.u.heartbeat.ms_per_tok == 3.25f && d.u.heartbeat.cpu_load == 0.75f);
    CHECK(!strcmp(cm_power_src_name(CM_POWER_ESTIMATE), "estimate") && !strcmp(cm_power_src_name(9), "unknown"));
    struct {
        int field;
        float v;
        uint8_t src;
    } bad[] = {{0, 1.5f, 1},
               {0, -2.0f, 1},
               {1, -1.0f, 1},
               {1, NAN, 1},
               {2, INFINITY, 1},
               {3, -0.5f, 1},
               {-1, 0, CM_POWER_SRC_COUNT}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sample(CM_MSG_HEARTBEAT, &m, 1);
        cm_msg_heartbeat *h = &m.u.heartbeat;
        if (bad[i].field == 0) h->cpu_load = bad[i].v;
        if (bad[i].field == 1) h->power_w = bad[i].v;
        if (bad[i].field == 2) h->tok_s = bad[i].v;
        if (bad[i].field == 3) h->ms_per_tok = bad[i].v;
        h->power_src = bad[i].src;
        CHECKF(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL, "bad telemetry %zu encoded", i);
        /* the same bytes made by hand are refused by the decoder */
        sample(CM_MSG_HEARTBEAT, &m, 1);
        n = enc(&m, buf, sizeof buf);
        if (bad[i].field >= 0) {
            static const size_t off[] = {36, 40, 45, 49}; /* cpu_load, power_w, tok_s, ms_per_tok */
            memcpy(&u, &bad[i].v, 4);
            cm_wr_u32(buf + off[bad[i].field], u);
        } else buf[44] = bad[i].src;
        CHECKF(cm_msg_decode(CM_MSG_HEARTBEAT, buf, n, &d, e, sizeof e) == CM_EFORMAT, "bad telemetry %zu decoded", i);
    }
    /* HELLO: the lease round trip; a host id with a control character is refused */
    sample(CM_MSG_HELLO, &m, 1);
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_HELLO, buf, n, &d, e, sizeof e) == 0 && d.u.hello.has_tail &&
          !strcmp(d.u.hello.host, "mac-mini-2-1a2b3c4d") && d.u.hello.lease_epoch == 1764670000123ull &&
          !strcmp(d.u.hello.lease_owner, "vm at 10.0.0.1:51234") &&
          !memcmp(d.u.hello.lease_owner_id, m.u.hello.lease_owner_id, 16));
    CHECK(d.u.hello.has_gpu && !strcmp(d.u.hello.gpu_name, "llvmpipe (LLVM 15.0.6, 256 bits)") &&
          d.u.hello.gpu_mem == (24ull << 30) && d.u.hello.gpu_gbs == 812.5f && d.u.hello.gpu_gflops == 24000.0f &&
          d.u.hello.gpu_layers == 20);
    /* the GPU tail's bounds (issue 16) */
    for (int k = 0; k < 3; k++) {
        cm_msg g = m; /* the encoder refuses a NaN speed, too many layers, a GPU without the host tail */
        if (k == 0) g.u.hello.gpu_gbs = NAN;
        if (k == 1) g.u.hello.gpu_layers = CM_MSG_MAX_GPU_LAYERS + 1;
        if (k == 2) g.u.hello.has_tail = false;
        size_t gl = 0;
        CHECKF(cm_msg_encode(&g, buf, sizeof buf, &gl, e, sizeof e) == CM_EINVAL, "bad GPU tail %d encoded", k);
        /* the decoder: a valid tail with the bad field written into its bytes (from the end: gpu_layers 4,
         * gpu_gflops 4, gpu_gbs 4, gpu_mem 8, then gpu_name's last byte) */
        g = m;
        strcpy(g.u.hello.gpu_name, "gpu?");
        CHECK(cm_msg_encode(&g, buf, sizeof buf, &gl, e, sizeof e) == 0);
        const float nan_f = NAN;
        uint32_t u;
        memcpy(&u, &nan_f, 4);
        if (k == 0) cm_wr_u32(buf + gl - 12, u);
        if (k == 1) cm_wr_u32(buf + gl - 4, CM_MSG_MAX_GPU_LAYERS + 1);
        if (k == 2) buf[gl - 21] = 0x07; /* a control character in the name */
        CHECKF(cm_msg_decode(CM_MSG_HELLO, buf, gl, &d, e, sizeof e) == CM_EFORMAT, "bad GPU tail %d decoded", k);
    }
    strcpy(m.u.hello.host, "evil\x1b[2J");
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_HELLO, buf, n, &d, e, sizeof e) == CM_EFORMAT && strstr(e, "'host'"));
    sample(CM_MSG_HELLO, &m, 2); /* an older peer's HELLO: no tail, decodes with an empty host and no lease */
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_HELLO, buf, n, &d, e, sizeof e) == 0 && !d.u.hello.has_tail && !d.u.hello.host[0] &&
          !d.u.hello.lease_epoch);
    /* ASSIGN: TAKE travels; an unknown flag bit is still refused */
    sample(CM_MSG_ASSIGN, &m, 0);
    m.u.assign.flags |= CM_ASSIGN_F_TAKE;
    n = enc(&m, buf, sizeof buf);
    CHECK(cm_msg_decode(CM_MSG_ASSIGN, buf, n, &d, e, sizeof e) == 0 && (d.u.assign.flags & CM_ASSIGN_F_TAKE));
    m.u.assign.flags |= 256u; /* (32 is KV, 64 REPLICAS, 128 HEAD) */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
}

static void test_encode_bounds(void) {
    cm_msg m;
    size_t n;
    char e[256];
    uint8_t small[8];
    sample(CM_MSG_ASSIGN, &m, 0);
    m.u.assign.layer_end = 6; /* past n_layers */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 0);
    m.u.assign.flags = 0; /* the last stage must own the output head */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 0);
    m.u.assign.flags |= CM_ASSIGN_F_TP_Q8; /* a group's Q8_0 all-reduces: fine with tp_size 2 */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == 0);
    m.u.assign.tp_size = 1; /* ... but not without a group */
    m.u.assign.tp_rank = 0;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 0);
    m.u.assign.flags |= 256; /* unknown flag (16 is TAKE, 32 is KV, 64 REPLICAS, 128 HEAD) */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 0);
    m.u.assign.flags |= CM_ASSIGN_F_HEAD; /* a split head: a group's, with the output */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == 0);
    m.u.assign.flags |= CM_ASSIGN_F_EP; /* ... never an expert group's */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    m.u.assign.flags &= ~CM_ASSIGN_F_EP;
    m.u.assign.tp_size = 1; /* ... nor without a group */
    m.u.assign.tp_rank = 0;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    { /* LoRA parts (CM_ASSIGN_F_LORA): round trip, last on the wire; sizes 1..CM_MSG_MAX_LORA_BYTES */
        uint8_t wire[2048];
        size_t wl;
        cm_msg d;
        sample(CM_MSG_ASSIGN, &m, 4);
        CHECK(cm_msg_encode(&m, wire, sizeof wire, &wl, e, sizeof e) == 0);
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) == 0 && (d.u.assign.flags & CM_ASSIGN_F_LORA) &&
              d.u.assign.lora_bytes == 12345 && !memcmp(d.u.assign.lora_sha256, m.u.assign.lora_sha256, 32));
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl - 1, &d, e, sizeof e) != 0); /* truncated */
        wire[wl - 1] = 0x80;                                                     /* 12345 + 2 GiB: past the bound */
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) != 0 && strstr(e, "lora_bytes"));
        memset(wire + wl - 4, 0, 4); /* 0 bytes */
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) != 0 && strstr(e, "lora_bytes"));
        m.u.assign.lora_bytes = CM_MSG_MAX_LORA_BYTES + 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        m.u.assign.lora_bytes = CM_MSG_MAX_LORA_BYTES;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == 0);
    }
    { /* KV cache types (CM_ASSIGN_F_KV): round trip; a type a node cannot hold is refused */
        uint8_t wire[2048];
        size_t wl;
        cm_msg d;
        sample(CM_MSG_ASSIGN, &m, 2);
        m.u.assign.flags |= CM_ASSIGN_F_KV;
        m.u.assign.kv_type_k = 8; /* Q8_0 */
        m.u.assign.kv_type_v = 2; /* Q4_0 */
        m.u.assign.kv_rows = 1;
        CHECK(cm_msg_encode(&m, wire, sizeof wire, &wl, e, sizeof e) == 0);
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) == 0 && d.u.assign.kv_type_k == 8 &&
              d.u.assign.kv_type_v == 2 && d.u.assign.kv_rows == 1 && d.u.assign.expert_bounds[2] == 8);
        wire[wl - 3] = 12; /* K as Q4_K: not a KV type */
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) != 0 && strstr(e, "kv_type"));
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl - 1, &d, e, sizeof e) != 0); /* truncated */
        m.u.assign.kv_type_v = 3;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    }
    /* expert groups: bounds from 0, non-decreasing, past 0; a group; never Q8_0 */
    sample(CM_MSG_ASSIGN, &m, 2);
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == 0);
    m.u.assign.expert_bounds[1] = 9; /* decreasing */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 2);
    m.u.assign.expert_bounds[0] = 1;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 2);
    m.u.assign.expert_bounds[1] = m.u.assign.expert_bounds[2] = 0;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 2);
    m.u.assign.flags |= CM_ASSIGN_F_TP_Q8;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ASSIGN, &m, 2);
    m.u.assign.tp_size = 1;
    m.u.assign.tp_rank = 0;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    { /* a hostile peer's decreasing bounds on the wire are refused by the decoder */
        uint8_t wire[2048];
        size_t wl;
        sample(CM_MSG_ASSIGN, &m, 2);
        CHECK(cm_msg_encode(&m, wire, sizeof wire, &wl, e, sizeof e) == 0);
        cm_msg d;
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) == 0 && d.u.assign.expert_bounds[1] == 3 &&
              d.u.assign.expert_bounds[2] == 8);
        wire[wl - 4] = 9; /* bounds[1] (u16 LE) = 9 > bounds[2] = 8 */
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) != 0 && strstr(e, "expert_bounds"));
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl - 2, &d, e, sizeof e) != 0); /* truncated bounds */
    }
    { /* hot-expert replicas (CM_ASSIGN_F_REPLICAS): round trip, holders, and every bound */
        uint8_t wire[2048], w2[2048];
        size_t wl, wl2;
        cm_msg d;
        sample(CM_MSG_ASSIGN, &m, 3);
        CHECK(cm_msg_encode(&m, wire, sizeof wire, &wl, e, sizeof e) == 0);
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) == 0 && d.u.assign.n_replicas[0] == 1 &&
              d.u.assign.replicas[0][0] == 5 && d.u.assign.n_replicas[1] == 2 && d.u.assign.replicas[1][1] == 1);
        CHECK(cm_msg_encode(&d, w2, sizeof w2, &wl2, e, sizeof e) == 0 && wl2 == wl && !memcmp(w2, wire, wl));
        CHECK(cm_msg_assign_holds(&d.u.assign, 0, 5) && cm_msg_assign_holds(&d.u.assign, 1, 0) &&
              cm_msg_assign_holds(&d.u.assign, 0, 0) && !cm_msg_assign_holds(&d.u.assign, 1, 2) &&
              !cm_msg_assign_holds(&d.u.assign, 0, 6));
        /* the tail: [1][5 0] [2][0 0][1 0] (rank 0's count and expert, rank 1's) */
        static const struct {
            int at;
            uint8_t v;
        } bad_tail[] = {{2, 0}, {2, 8}, {5, 9}, {7, 1}, {8, 0}};
        for (size_t i = 0; i < CM_ARRAY_LEN(bad_tail); i++) {
            uint8_t b = wire[wl - (size_t)bad_tail[i].at];
            /* equal twice, expert 8 of 8, 9 > 8, own range, a count that shifts the rest */
            wire[wl - (size_t)bad_tail[i].at] = bad_tail[i].v;
            int rc = cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e);
            CHECKF(rc != 0, "hostile replica tail %zu decoded", i);
            wire[wl - (size_t)bad_tail[i].at] = b;
        }
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl - 1, &d, e, sizeof e) != 0); /* truncated */
        CHECK(cm_msg_decode(CM_MSG_ASSIGN, wire, wl, &d, e, sizeof e) == 0);     /* restored */
        m.u.assign.replicas[1][1] = 0; /* the encoder refuses the same: equal twice */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_ASSIGN, &m, 3);
        m.u.assign.replicas[0][0] = 2; /* inside rank 0's own range */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_ASSIGN, &m, 3);
        m.u.assign.n_replicas[0] = m.u.assign.n_replicas[1] = 0; /* the flag with no replica */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_ASSIGN, &m, 3);
        m.u.assign.n_replicas[1] = CM_MSG_MAX_REPLICAS + 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_ASSIGN, &m, 3);
        m.u.assign.flags &= ~CM_ASSIGN_F_EP; /* replicas outside an expert group */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    }
    sample(CM_MSG_TOKEN, &m, 0);
    m.u.token.n_top = CM_MSG_MAX_TOP + 1;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_SEQ_CONFIG, &m, 0);
    m.u.seq_config.temperature = NAN;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_ERROR, &m, 0);
    memset(m.u.error.text, 'x', sizeof m.u.error.text); /* no NUL within the maximum */
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
    sample(CM_MSG_HEARTBEAT, &m, 0);
    CHECK(cm_msg_encode(&m, small, sizeof small, &n, e, sizeof e) == CM_ERANGE);
    /* LINKS_REQ / LINKS: peer counts, deadline, probe size and measurements are bounded
     * both ways (the decoder sees the same payloads grown by hand). */
    {
        static uint8_t lb[4096];
        cm_msg d;
        sample(CM_MSG_LINKS_REQ, &m, 0);
        m.u.links_req.deadline_ms = 0;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_LINKS_REQ, &m, 0);
        m.u.links_req.probe_bytes = CM_MSG_LINKS_MAX_PROBE + 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_LINKS_REQ, &m, 2);
        n = enc(&m, lb, sizeof lb);
        lb[16] = CM_MSG_MAX_PEERS + 1; /* n_peers follows id, deadline_ms, probe_bytes */
        CHECK(cm_msg_decode(CM_MSG_LINKS_REQ, lb, n, &d, e, sizeof e) == CM_EFORMAT);
        lb[16] = 0;
        CHECK(cm_msg_decode(CM_MSG_LINKS_REQ, lb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(lb + 8, CM_MSG_LINKS_MAX_MS + 1);
        lb[16] = CM_MSG_MAX_PEERS;
        CHECK(cm_msg_decode(CM_MSG_LINKS_REQ, lb, n, &d, e, sizeof e) == CM_EFORMAT);
        sample(CM_MSG_LINKS, &m, 0);
        m.u.links.link[0].rtt_s = NAN;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_LINKS, &m, 0);
        m.u.links.link[0].status = 5;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_LINKS, &m, 0);
        n = enc(&m, lb, sizeof lb);
        lb[8] = CM_MSG_MAX_PEERS + 1;
        CHECK(cm_msg_decode(CM_MSG_LINKS, lb, n, &d, e, sizeof e) == CM_EFORMAT);
        lb[8] = 1;
        size_t bwoff = n - 4;               /* the last field: bw of the only entry */
        cm_wr_u32(lb + bwoff, 0xff800000u); /* -inf */
        CHECK(cm_msg_decode(CM_MSG_LINKS, lb, n, &d, e, sizeof e) == CM_EFORMAT);
    }
    /* SEQ_LORA: the adapter count and every scale are bounded both ways (a
     * valid payload with the count grown, a scale made NaN or huge by hand). */
    {
        static uint8_t qb[4096];
        cm_msg d;
        sample(CM_MSG_SEQ_LORA, &m, 0);
        n = enc(&m, qb, sizeof qb);
        CHECK(n == 8 + 4 + 4 + 12);
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == 0 && d.u.seq_lora.n == 3 &&
              d.u.seq_lora.seq == 2 && d.u.seq_lora.scale[0] == -0.5f && d.u.seq_lora.scale[2] == 0.0f);
        m.u.seq_lora.n = CM_MSG_MAX_LORA + 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_SEQ_LORA, &m, 0);
        m.u.seq_lora.scale[2] = NAN;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        m.u.seq_lora.scale[2] = 2e6f;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_SEQ_LORA, &m, 0);
        m.u.seq_lora.seq = -1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_SEQ_LORA, &m, 0);
        n = enc(&m, qb, sizeof qb);
        cm_wr_u32(qb + 8, 0x80000000u); /* seq < 0 */
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(qb + 8, 2);
        cm_wr_u32(qb + 12, CM_MSG_MAX_LORA + 1); /* n over the bound (and over the bytes) */
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(qb + 12, 4); /* one more scale than the payload holds */
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(qb + 12, 3);
        cm_wr_u32(qb + 16 + 4, 0x7fc00000u); /* a NaN scale */
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(qb + 16 + 4, 0x7f800000u); /* +inf */
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == CM_EFORMAT);
        float big = 1e6f;
        uint32_t bits;
        memcpy(&bits, &big, 4);
        cm_wr_u32(qb + 16 + 4, bits); /* |scale| >= 1e6 */
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(qb + 16 + 4, 0);
        CHECK(cm_msg_decode(CM_MSG_SEQ_LORA, qb, n, &d, e, sizeof e) == 0);
    }
    /* EXPERT_LOAD: expert and cell counts and the layer range are bounded both ways
     * (the decoder sees a valid payload with each count grown by hand). */
    {
        static uint8_t xb[4096];
        cm_msg d;
        sample(CM_MSG_EXPERT_LOAD, &m, 0);
        n = enc(&m, xb, sizeof xb);
        CHECK(cm_msg_decode(CM_MSG_EXPERT_LOAD, xb, n, &d, e, sizeof e) == 0 && d.u.expert_load.n_layers == 3 &&
              cm_msg_expert_load_count(&d.u.expert_load, 5) == UINT32_MAX &&
              cm_msg_expert_load_count(&d.u.expert_load, 23) == 23 * 37 + 1);
        m.u.expert_load.n_expert = 0;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        m.u.expert_load.n_expert = CM_MSG_MAX_EXPERTS + 1;
        m.u.expert_load.n_layers = 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        m.u.expert_load.n_expert = 1024;
        m.u.expert_load.n_layers = CM_MSG_MAX_EXPERT_CELLS / 1024 + 1; /* one layer too many */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_EXPERT_LOAD, &m, 0);
        m.u.expert_load.counts = NULL;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_EXPERT_LOAD, &m, 0);
        m.u.expert_load.layer_begin = 65534; /* 3 layers from there pass layer 65535 */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_EXPERT_LOAD, &m, 0);
        n = enc(&m, xb, sizeof xb);
        cm_wr_u32(xb + 8, 65534); /* layer_begin follows epoch */
        CHECK(cm_msg_decode(CM_MSG_EXPERT_LOAD, xb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(xb + 8, 2);
        cm_wr_u16(xb + 14, 0); /* n_expert */
        CHECK(cm_msg_decode(CM_MSG_EXPERT_LOAD, xb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u16(xb + 14, 0xffff);
        CHECK(cm_msg_decode(CM_MSG_EXPERT_LOAD, xb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u16(xb + 14, 1024); /* in bounds, but 16 x 1024 cells claimed in a 96-byte payload */
        cm_wr_u16(xb + 12, 16);
        CHECK(cm_msg_decode(CM_MSG_EXPERT_LOAD, xb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u16(xb + 12, 17); /* 17 x 1024 cells: past the maximum */
        CHECK(cm_msg_decode(CM_MSG_EXPERT_LOAD, xb, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "'n_layers' out of range") != NULL, "%s", e);
    }
    /* A FORWARD larger than its frame maximum is refused at encoding: split the batch. */
    sample(CM_MSG_FORWARD, &m, 1);
    m.u.forward.n_tokens = CM_MSG_MAX_TOKENS;
    m.u.forward.dim = 8192;
    CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_ERANGE);
    sample(CM_MSG_FORWARD, &m, 2);
    float bad[40];
    memcpy(bad, g_hidden, sizeof bad);
    bad[3] = INFINITY;
    m.u.forward.hidden = bad;
    uint8_t buf[512];
    CHECK(cm_msg_encode(&m, buf, sizeof buf, &n, e, sizeof e) == CM_EINVAL); /* Q8 of inf */
    CHECK(cm_msg_decode(CM_MSG_AUTH_INIT, buf, 0, &m, e, sizeof e) == CM_EUNSUPPORTED);
    /* OUTPUT (rows back to the coordinator): rows come back bit for bit; the
     * kind, the counts and their product are bounded both ways, before the
     * arrays are read (a header claiming a vocabulary-wide row of the maximum
     * rows in a tiny payload is refused). */
    {
        cm_msg d;
        static uint8_t ob[1024];
        sample(CM_MSG_OUTPUT, &m, 2);
        n = enc(&m, ob, sizeof ob);
        CHECK(n == 8 + 8 + 4 + 1 + 4 + 4 + 4 + 40 * 4);
        CHECK(cm_msg_decode(CM_MSG_OUTPUT, ob, n, &d, e, sizeof e) == 0);
        float row[40];
        cm_msg_output_row(&d.u.output, 0, row);
        CHECK(!memcmp(row, g_hidden, sizeof row) && cm_msg_output_pos(&d.u.output, 0) == g_pos[0] &&
              d.u.output.kind == CM_OUTPUT_LOGITS && d.u.output.seq == 2);
        ob[20] = CM_OUTPUT_COUNT; /* kind */
        CHECK(cm_msg_decode(CM_MSG_OUTPUT, ob, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "'kind'") != NULL, "%s", e);
        ob[20] = CM_OUTPUT_LOGITS;
        cm_wr_u32(ob + 25, CM_MSG_MAX_OUT_DIM + 1); /* dim */
        CHECK(cm_msg_decode(CM_MSG_OUTPUT, ob, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(ob + 25, CM_MSG_MAX_OUT_DIM);
        cm_wr_u32(ob + 21, CM_MSG_MAX_TOKENS); /* n_rows: 16384 x 2^20 floats is past the frame */
        CHECK(cm_msg_decode(CM_MSG_OUTPUT, ob, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "n_rows x dim") != NULL, "%s", e);
        cm_wr_u32(ob + 21, 1);
        CHECK(cm_msg_decode(CM_MSG_OUTPUT, ob, n, &d, e, sizeof e) == CM_EFORMAT); /* 2^20 floats claimed, 40 sent */
        cm_wr_u32(ob + 25, 0);
        CHECK(cm_msg_decode(CM_MSG_OUTPUT, ob, n, &d, e, sizeof e) == CM_EFORMAT);
        sample(CM_MSG_OUTPUT, &m, 0);
        m.u.output.n_rows = CM_MSG_MAX_TOKENS;
        m.u.output.dim = CM_MSG_MAX_DIM;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_OUTPUT, &m, 1);
        int32_t neg = -1;
        m.u.output.pos = &neg;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        /* FORWARD's want byte: 0..3 (enum cm_want), 4 refused */
        sample(CM_MSG_FORWARD, &m, 0);
        n = enc(&m, ob, sizeof ob);
        size_t woff = 8 + 8 + 4 + 4 + 1 + 8 * 4 * 2; /* the first want byte */
        CHECK(ob[woff + 5] == CM_WANT_LOGITS && ob[woff + 6] == CM_WANT_HIDDEN);
        ob[woff] = CM_WANT_COUNT;
        CHECK(cm_msg_decode(CM_MSG_FORWARD, ob, n, &d, e, sizeof e) == CM_EFORMAT);
    }
    /* TRAIN (issue 17): rows and targets come back bit for bit; every count,
     * the op, the flags and the product rows x dim are bounded both ways,
     * before the arrays are read. */
    {
        cm_msg d;
        static uint8_t tb[1024];
        sample(CM_MSG_TRAIN, &m, 0);
        n = enc(&m, tb, sizeof tb);
        CHECK(n == 88 + 8 * 4 + 8 * 5 * 4);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == 0);
        float rows[40];
        cm_msg_train_get(&d.u.train, rows);
        CHECK(!memcmp(rows, g_hidden, sizeof rows) && cm_msg_train_target(&d.u.train, 1) == -1 &&
              cm_msg_train_target(&d.u.train, 4) == 31999 && d.u.train.f[0] == 1.0f / 37);
        tb[16] = CM_TRAIN_OP_COUNT; /* op */
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "'op'") != NULL, "%s", e);
        tb[16] = CM_TRAIN_FWD;
        tb[17] = 4; /* unknown flag */
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        tb[17] = CM_TRAIN_F_TARGETS;
        cm_wr_u32(tb + 20, CM_MSG_MAX_TOKENS); /* n_rows: 16384 x 65536 floats is past the frame */
        cm_wr_u32(tb + 24, CM_MSG_MAX_DIM);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "n_rows x dim") != NULL, "%s", e);
        cm_wr_u32(tb + 24, 6); /* 8 x 6 floats claimed, 8 x 5 sent */
        cm_wr_u32(tb + 20, 8);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u32(tb + 24, 5);
        cm_wr_u32(tb + 88, (uint32_t)-2); /* a target below -1 */
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        sample(CM_MSG_TRAIN, &m, 0);
        m.u.train.f[1] = NAN;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_TRAIN, &m, 1); /* a SLICE of gradients (data parallelism), and no vector past G */
        n = enc(&m, tb, sizeof tb);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == 0 && d.u.train.vec == CM_TRAIN_VEC_G);
        tb[18] = CM_TRAIN_VEC_COUNT;
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "'vec'") != NULL, "%s", e);
        m.u.train.dim = CM_MSG_MAX_TRAIN_SLICE + 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_TRAIN, &m, 2);
        m.u.train.rank = 0;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        sample(CM_MSG_TRAIN, &m, 2);
        m.u.train.flags = CM_TRAIN_F_BACKWARD; /* flags only on FWD */
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        /* SETUP's windows in flight: 1..CM_MSG_MAX_TRAIN_INFLIGHT, both ways */
        sample(CM_MSG_TRAIN, &m, 2);
        n = enc(&m, tb, sizeof tb);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == 0 && d.u.train.offset == 3);
        cm_wr_u64(tb + 32, 0);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        CHECKF(strstr(e, "in flight") != NULL, "%s", e);
        cm_wr_u64(tb + 32, CM_MSG_MAX_TRAIN_INFLIGHT + 1);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == CM_EFORMAT);
        cm_wr_u64(tb + 32, CM_MSG_MAX_TRAIN_INFLIGHT);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == 0);
        m.u.train.offset = CM_MSG_MAX_TRAIN_INFLIGHT + 1;
        CHECK(cm_msg_encode(&m, NULL, 0, &n, e, sizeof e) == CM_EINVAL);
        /* a BWD carries the last stage's loss back, stage to stage */
        sample(CM_MSG_TRAIN, &m, 0);
        m.u.train.op = CM_TRAIN_BWD, m.u.train.flags = 0, m.u.train.target = NULL, m.u.train.loss = 12.5;
        m.u.train.n_targets = 6, m.u.train.offset = 1234567;
        n = enc(&m, tb, sizeof tb);
        CHECK(cm_msg_decode(CM_MSG_TRAIN, tb, n, &d, e, sizeof e) == 0 && d.u.train.loss == 12.5 &&
              d.u.train.n_targets == 6 && d.u.train.offset == 1234567);
    }
}

/* ---- handshake and sessions, both ends in one process ---- */

typedef struct pair {
    cm_chan c, s;
    int rc_c, rc_s;
    char ec[256], es[256];
} pair;

static void handshake(pair *p, cm_sec_mode mc, const uint8_t *kc, cm_sec_mode ms, const uint8_t *ks) {
    cm_hs hc, hsv;
    uint8_t b1[128], b2[128], b3[128];
    size_t n1, n2, n3;
    memset(p, 0, sizeof *p);
    cm_chan_init(&p->c);
    cm_chan_init(&p->s);
    CHECK(cm_hs_init(&hc, true, mc, kc, NULL, 0) == 0);
    CHECK(cm_hs_init(&hsv, false, ms, ks, NULL, 0) == 0);
    CHECK(cm_hs_write_init(&hc, b1, sizeof b1, &n1, NULL, 0) == 0 && n1 == CM_HS_INIT_BYTES);
    p->rc_s = cm_hs_read_init(&hsv, b1, n1, p->es, sizeof p->es);
    if (p->rc_s) {
        p->rc_c = p->rc_s;
        goto out;
    }
    CHECK(cm_hs_write_reply(&hsv, b2, sizeof b2, &n2, NULL, 0) == 0 && n2 == CM_HS_REPLY_BYTES);
    p->rc_c = cm_hs_read_reply(&hc, b2, n2, p->ec, sizeof p->ec);
    if (mc != CM_SEC_INSECURE && hc.keys_ready) {
        CHECK(cm_hs_write_finish(&hc, b3, sizeof b3, &n3, NULL, 0) == 0);
        p->rc_s = cm_hs_read_finish(&hsv, b3, n3, p->es, sizeof p->es);
        /* the cluster key never appears in what goes on the wire */
        CHECK(!memmem(b1, n1, kc, 32) && !memmem(b2, n2, kc, 32) && !memmem(b3, n3, kc, 32));
    }
    if (!p->rc_c) p->rc_c = cm_hs_finish(&hc, &p->c, p->ec, sizeof p->ec);
    if (!p->rc_s) p->rc_s = cm_hs_finish(&hsv, &p->s, p->es, sizeof p->es);
out:
    cm_hs_wipe(&hc);
    cm_hs_wipe(&hsv);
}

static int seal(cm_chan *s, unsigned type, const void *payload, size_t n, uint8_t *out, size_t *len) {
    memcpy(out + CM_FRAME_HDR, payload, n);
    return cm_frame_seal(s, type, out, n, n + CM_FRAME_HDR + CM_FRAME_MAC, len, NULL, 0);
}

static void test_handshake(void) {
    uint8_t other[32];
    memcpy(other, k_key, 32);
    other[31] ^= 1;
    pair p;
    handshake(&p, CM_SEC_ENCRYPT, k_key, CM_SEC_ENCRYPT, k_key);
    CHECKF(p.rc_c == 0 && p.rc_s == 0, "%s / %s", p.ec, p.es);
    CHECK(p.c.established && p.s.established && p.c.mode == CM_SEC_ENCRYPT);
    CHECK(!memcmp(p.c.tx_key, p.s.rx_key, 32) && !memcmp(p.c.rx_key, p.s.tx_key, 32));
    CHECK(memcmp(p.c.tx_key, p.c.rx_key, 32) != 0 && memcmp(p.c.tx_key, k_key, 32) != 0);
    pair q;
    handshake(&q, CM_SEC_ENCRYPT, k_key, CM_SEC_ENCRYPT, k_key);
    CHECK(memcmp(p.c.tx_key, q.c.tx_key, 32) != 0); /* fresh keys per connection */
    /* A wrong key: both sides refuse. */
    handshake(&p, CM_SEC_ENCRYPT, other, CM_SEC_ENCRYPT, k_key);
    CHECK(p.rc_c == CM_EAUTH && p.rc_s == CM_EAUTH && !p.c.established && !p.s.established);
    CHECKF(strstr(p.ec, "does not know this cluster's key") != NULL, "%s", p.ec);
    /* --insecure on one side only, either way round; auth-only vs encrypted. */
    handshake(&p, CM_SEC_INSECURE, NULL, CM_SEC_ENCRYPT, k_key);
    CHECK(p.rc_s == CM_EAUTH);
    CHECKF(strstr(p.es, "the connecting node runs --insecure, the listening node requires the cluster key") != NULL,
           "%s", p.es);
    handshake(&p, CM_SEC_ENCRYPT, k_key, CM_SEC_INSECURE, NULL);
    CHECK(p.rc_s == CM_EAUTH);
    CHECKF(
        strstr(
            p.es,
            "the connecting node requires the cluster key and encrypted frames, the listening node runs --insecure") !=
            NULL,
        "%s", p.es);
    handshake(&p, CM_SEC_AUTH, k_key, CM_SEC_ENCRYPT, k_key);
    CHECK(p.rc_s == CM_EAUTH);
    handshake(&p, CM_SEC_INSECURE, NULL, CM_SEC_INSECURE, NULL);
    CHECK(p.rc_c == 0 && p.rc_s == 0 && p.c.established && p.c.mode == CM_SEC_INSECURE);
    CHECK(cm_hs_init(&(cm_hs){0}, true, CM_SEC_ENCRYPT, NULL, NULL, 0) == CM_EINVAL);
    /* Another protocol version in AUTH_INIT is refused with both numbers. */
    cm_hs a, b;
    uint8_t buf[128];
    size_t n;
    char e[256];
    cm_hs_init(&a, true, CM_SEC_ENCRYPT, k_key, NULL, 0);
    cm_hs_init(&b, false, CM_SEC_ENCRYPT, k_key, NULL, 0);
    cm_hs_write_init(&a, buf, sizeof buf, &n, NULL, 0);
    buf[0] = 9;
    CHECK(cm_hs_read_init(&b, buf, n, e, sizeof e) == CM_EUNSUPPORTED);
    CHECKF(strstr(e, "version 9") != NULL, "%s", e);
    CHECK(cm_hs_read_init(&b, buf, n - 1, e, sizeof e) == CM_EFORMAT);
}

/* A loopback link's partial sums: an encrypted session whose sender sets
 * tx_clear_allreduce seals ALLREDUCE frames auth-only (readable, still
 * authenticated: every bit flip refused) and every other type encrypted; the
 * receiver takes an auth-only frame of no other type. */
static void test_clear_allreduce(void) {
    pair p;
    handshake(&p, CM_SEC_ENCRYPT, k_key, CM_SEC_ENCRYPT, k_key);
    CHECK(p.rc_c == 0 && p.rc_s == 0);
    p.s.rx_seq = p.c.tx_seq;
    p.c.rx_seq = p.s.tx_seq;
    p.c.tx_clear_allreduce = true;
    const char sums[] = "partial sums of a hidden state, layer 3";
    uint8_t f[128], save[128], *pl;
    size_t n;
    cm_frame_hdr h;
    char e[256];
    CHECK(seal(&p.c, CM_MSG_ALLREDUCE, sums, sizeof sums, f, &n) == 0);
    CHECK(memmem(f, n, sums, sizeof sums) != NULL && n == CM_FRAME_HDR + sizeof sums + CM_FRAME_MAC);
    int refused = 0;
    for (size_t bit = 0; bit < n * 8; bit++) {
        memcpy(save, f, n);
        save[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        refused += cm_frame_open(&p.s, save, n, &h, &pl, e, sizeof e) != 0;
    }
    CHECK(refused == (int)(n * 8));
    CHECKF(cm_frame_open(&p.s, f, n, &h, &pl, e, sizeof e) == 0, "%s", e);
    CHECK(h.type == CM_MSG_ALLREDUCE && h.flags == CM_FRAME_F_MAC && !memcmp(pl, sums, sizeof sums));
    /* other types stay encrypted */
    CHECK(seal(&p.c, CM_MSG_BYE, sums, sizeof sums, f, &n) == 0);
    CHECK(memmem(f, n, sums, sizeof sums) == NULL);
    CHECKF(cm_frame_open(&p.s, f, n, &h, &pl, e, sizeof e) == 0, "%s", e);
    CHECK(!memcmp(pl, sums, sizeof sums));
    /* an auth-only frame of another type, with the right key, is refused */
    cm_chan a = p.c;
    a.mode = CM_SEC_AUTH;
    CHECK(seal(&a, CM_MSG_FORWARD, sums, sizeof sums, f, &n) == 0);
    CHECK(cm_frame_open(&p.s, f, n, &h, &pl, e, sizeof e) == CM_EPROTO);
    CHECKF(strstr(e, "flags 0x1") != NULL, "%s", e);
    /* off: ALLREDUCE encrypted like the rest */
    p.c.tx_clear_allreduce = false;
    CHECK(seal(&p.c, CM_MSG_ALLREDUCE, sums, sizeof sums, f, &n) == 0);
    CHECK(memmem(f, n, sums, sizeof sums) == NULL);
    /* an auth-only session never takes an encrypted ALLREDUCE */
    pair q;
    handshake(&q, CM_SEC_AUTH, k_key, CM_SEC_AUTH, k_key);
    q.s.rx_seq = q.c.tx_seq;
    cm_chan x = q.c;
    x.mode = CM_SEC_ENCRYPT;
    CHECK(seal(&x, CM_MSG_ALLREDUCE, sums, sizeof sums, f, &n) == 0);
    CHECK(cm_frame_open(&q.s, f, n, &h, &pl, e, sizeof e) == CM_EPROTO);
    cm_chan_wipe(&p.c);
    cm_chan_wipe(&p.s);
    cm_chan_wipe(&a);
    cm_chan_wipe(&q.c);
    cm_chan_wipe(&q.s);
    cm_chan_wipe(&x);
}

static void test_sealed_frames(void) {
    for (int mode = CM_SEC_INSECURE; mode < CM_SEC_COUNT; mode++) {
        pair p;
        const uint8_t *k = mode == CM_SEC_INSECURE ? NULL : k_key;
        handshake(&p, (cm_sec_mode)mode, k, (cm_sec_mode)mode, k);
        p.s.rx_seq = p.c.tx_seq; /* line the counters up as a real connection would */
        p.c.rx_seq = p.s.tx_seq;
        const char secret[] = "the quick brown fox: hidden state bytes";
        uint8_t f1[128], f2[128], f3[128], save[128];
        size_t n1, n2, n3;
        cm_frame_hdr h;
        uint8_t *pl;
        char e[256];
        CHECK(seal(&p.c, CM_MSG_BYE, secret, sizeof secret, f1, &n1) == 0);
        CHECK(seal(&p.c, CM_MSG_BYE, secret, sizeof secret, f2, &n2) == 0);
        CHECK(seal(&p.c, CM_MSG_BYE, secret, sizeof secret, f3, &n3) == 0);
        bool visible = memmem(f1, n1, secret, sizeof secret) != NULL;
        CHECK(visible == (mode != CM_SEC_ENCRYPT)); /* encrypted: nothing readable on the wire */
        CHECK(n1 == CM_FRAME_HDR + sizeof secret + (mode == CM_SEC_INSECURE ? 0 : CM_FRAME_MAC));
        memcpy(save, f1, n1);
        CHECK(cm_frame_open(&p.s, f1, n1, &h, &pl, e, sizeof e) == 0);
        CHECK(h.len == sizeof secret && !memcmp(pl, secret, sizeof secret));
        /* replay of frame 1 */
        CHECK(cm_frame_open(&p.s, save, n1, &h, &pl, e, sizeof e) == CM_EAUTH);
        CHECKF(strstr(e, "replayed") != NULL, "%s", e);
        /* frame 3 before frame 2 */
        memcpy(save, f3, n3);
        CHECK(cm_frame_open(&p.s, save, n3, &h, &pl, e, sizeof e) == CM_EAUTH);
        CHECKF(strstr(e, "out-of-order") != NULL, "%s", e);
        if (mode != CM_SEC_INSECURE) {
            /* every single-bit flip of frame 2 is refused, and the session is unchanged */
            int refused = 0;
            for (size_t bit = 0; bit < n2 * 8; bit++) {
                memcpy(save, f2, n2);
                save[bit / 8] ^= (uint8_t)(1u << (bit % 8));
                refused += cm_frame_open(&p.s, save, n2, &h, &pl, e, sizeof e) != 0;
            }
            CHECK(refused == (int)(n2 * 8));
            memcpy(save, f2, n2);
            save[CM_FRAME_HDR + 3] ^= 0x10;
            CHECK(cm_frame_open(&p.s, save, n2, &h, &pl, e, sizeof e) == CM_EAUTH);
            CHECKF(strstr(e, "bad MAC") != NULL, "%s", e);
            /* forging the seq to skip the check does not help: seq is in the nonce and AAD */
            memcpy(save, f3, n3);
            cm_wr_u64(save + 8, p.s.rx_seq);
            CHECK(cm_frame_open(&p.s, save, n3, &h, &pl, e, sizeof e) == CM_EAUTH);
            /* a downgrade: the same payload without MAC is refused */
            cm_chan plain;
            cm_chan_init(&plain);
            plain.established = true;
            plain.tx_seq = p.s.rx_seq;
            CHECK(seal(&plain, CM_MSG_BYE, secret, sizeof secret, save, &n1) == 0);
            CHECK(cm_frame_open(&p.s, save, n1, &h, &pl, e, sizeof e) == CM_EAUTH);
            CHECKF(strstr(e, "unauthenticated") != NULL, "%s", e);
            /* truncations of a sealed frame */
            for (size_t k2 = 0; k2 < n2; k2++) {
                memcpy(save, f2, n2);
                CHECK(cm_frame_open(&p.s, save, k2, &h, &pl, e, sizeof e) != 0);
            }
        }
        memcpy(save, f2, n2);
        CHECKF(cm_frame_open(&p.s, save, n2, &h, &pl, e, sizeof e) == 0, "%s", e);
        CHECK(cm_frame_open(&p.s, f3, n3, &h, &pl, e, sizeof e) == 0);
        CHECK(p.s.rx_seq == p.c.tx_seq);
        /* handshake messages are refused once established */
        CHECK(seal(&p.s, CM_MSG_AUTH_INIT, secret, 4, save, &n1) == CM_ESTATE);
        cm_chan_wipe(&p.c);
        cm_chan_wipe(&p.s);
    }
    /* before the handshake only AUTH_* and ERROR may be sent or accepted */
    cm_chan s, r;
    cm_chan_init(&s);
    cm_chan_init(&r);
    uint8_t f[64], *pl;
    size_t n;
    cm_frame_hdr h;
    char e[256];
    CHECK(seal(&s, CM_MSG_FORWARD, "x", 1, f, &n) == CM_ESTATE);
    s.established = true;
    CHECK(seal(&s, CM_MSG_FORWARD, "x", 1, f, &n) == 0);
    CHECK(cm_frame_open(&r, f, n, &h, &pl, e, sizeof e) == CM_EPROTO);
    CHECKF(strstr(e, "before the handshake") != NULL, "%s", e);
}

/* Seeds for fuzz/fuzz_frame.c (see its header for the input format). */
static void seed(const char *dir, const char *name, uint8_t sel, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write '%s'\n", path);
        exit(1);
    }
    fputc(sel, f);
    fwrite(p, 1, n, f);
    fclose(f);
}

static int write_corpus(const char *dir) {
    static uint8_t buf[4096], frame[4200];
    char name[64];
    for (unsigned t = CM_MSG_HELLO; t < CM_MSG_COUNT; t++) {
        for (int v = 0; v < 3; v++) {
            cm_msg m;
            sample(t, &m, v);
            size_t n = enc(&m, buf + 1, sizeof buf - 1);
            buf[0] = (uint8_t)t;
            snprintf(name, sizeof name, "msg-%s-%d", cm_msg_type_name(t), v);
            seed(dir, name, 1, buf, n + 1);
            if (v) continue;
            snprintf(name, sizeof name, "all-%s", cm_msg_type_name(t));
            seed(dir, name, 3, buf + 1, n);
            for (int mode = 0; mode < CM_SEC_COUNT; mode++) { /* kinds 1..3 of the fuzz target */
                cm_chan s;
                cm_chan_init(&s);
                s.established = true;
                s.mode = (cm_sec_mode)mode;
                memset(s.tx_key, 0x42, 32); /* FUZZ_KEY_BYTE */
                size_t fl;
                memcpy(frame + CM_FRAME_HDR, buf + 1, n);
                if (cm_frame_seal(&s, t, frame, n, sizeof frame, &fl, NULL, 0)) return 1;
                snprintf(name, sizeof name, "frame-%s-%s", cm_sec_mode_name((cm_sec_mode)mode), cm_msg_type_name(t));
                seed(dir, name, (uint8_t)((mode + 1) << 2), frame, fl);
            }
        }
    }
    for (int v = 3; v <= 4; v++) { /* ASSIGN with hot-expert replicas (variant 3), with LoRA parts (4) */
        cm_msg m;
        sample(CM_MSG_ASSIGN, &m, v);
        size_t n = enc(&m, buf + 1, sizeof buf - 1);
        buf[0] = (uint8_t)CM_MSG_ASSIGN;
        snprintf(name, sizeof name, "msg-ASSIGN-%d", v);
        seed(dir, name, 1, buf, n + 1);
    }
    cm_hs a, b;
    size_t n, fl;
    cm_hs_init(&a, true, CM_SEC_ENCRYPT, k_key, NULL, 0);
    cm_hs_init(&b, false, CM_SEC_ENCRYPT, k_key, NULL, 0);
    cm_hs_write_init(&a, buf, sizeof buf, &n, NULL, 0);
    seed(dir, "hs-init", 2, buf, n);
    cm_chan s;
    cm_chan_init(&s);
    memcpy(frame + CM_FRAME_HDR, buf, n);
    cm_frame_seal(&s, CM_MSG_AUTH_INIT, frame, n, sizeof frame, &fl, NULL, 0);
    seed(dir, "frame-handshake-AUTH_INIT", 0, frame, fl);
    cm_hs_read_init(&b, buf, n, NULL, 0);
    cm_hs_write_reply(&b, buf, sizeof buf, &n, NULL, 0);
    seed(dir, "hs-reply", 2, buf, n);
    return 0;
}

int main(void) {
    init_data();
    if (getenv("CUMULO_FRAME_CORPUS")) return write_corpus(getenv("CUMULO_FRAME_CORPUS"));
    RUN(test_header_layout);
    RUN(test_header_refusals);
    RUN(test_version_refusal);
    RUN(test_roundtrip_all);
    RUN(test_truncation);
    RUN(test_corruption);
    RUN(test_encode_bounds);
    RUN(test_issue19_fields);
    RUN(test_handshake);
    RUN(test_sealed_frames);
    RUN(test_clear_allreduce);
    TEST_END();
}
