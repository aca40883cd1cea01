/*
 * proto: the cumulo wire protocol as pure functions over bytes — frame headers,
 * sealing/opening of frames (libsodium AEAD), the key-proving handshake, and one
 * codec per message type. No sockets, no files, no clocks: everything here can be
 * fed arbitrary bytes by a fuzzer. docs/PROTOCOL.md is the prose version of this
 * header; keep the two in step.
 *
 * Decoders never trust a length: every count is bounded by a declared maximum and
 * checked with overflow-safe arithmetic before it is used, and a frame's declared
 * payload length is checked against its type's maximum before anyone allocates.
 * Decoders never allocate: variable-length fields are views into the caller's
 * buffer (valid as long as that buffer is).
 */
#ifndef CM_PROTO_H
#define CM_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Both ends of a connection speak exactly one version (docs/PROTOCOL.md,
 * "Versioning"). 2: session 16's auth-only ALLREDUCE frames on IP loopback
 * and 16384-element all-reduce pieces; 3: session 19's shared-memory set-up
 * frames (ALLREDUCE point 3) at a loopback pair's first op; 4: session 20's
 * pair takes every op through the shared memory (prefill-sized all-reduces,
 * the split head's gather) where version 3 sent them as frames. */
#define CM_PROTO_VERSION 4
#define CM_PROTO_MAGIC 0x4F4C4D43u /* "CMLO" on the wire */
#define CM_FRAME_HDR 20            /* magic4 version1 type1 flags2 seq8 len4 */
#define CM_FRAME_MAC 16            /* Poly1305 tag, present when CM_FRAME_F_MAC */
#define CM_KEY_BYTES 32            /* the cluster key */
#define CM_NODE_ID_BYTES 16

/* Frame flags. A session demands exactly the flags of its mode. */
#define CM_FRAME_F_MAC 0x0001u /* a 16-byte tag follows the payload */
#define CM_FRAME_F_ENC 0x0002u /* the payload is ciphertext */

/* Message types: number, name, maximum payload bytes (checked before allocation). */
#define CM_MSG_TYPES(X)                                   \
    X(AUTH_INIT, 1, 128)                                  \
    X(AUTH_REPLY, 2, 160)                                 \
    X(AUTH_FINISH, 3, 64)                                 \
    X(HELLO, 4, 1024)                                     \
    X(HEARTBEAT, 5, 64)                                   \
    X(PING, 6, (16u << 20) + 64)                          \
    X(PONG, 7, (16u << 20) + 64)                          \
    X(ASSIGN, 8, 4096)                                    \
    X(READY, 9, 1024)                                     \
    X(WEIGHTS_REQ, 10, 128)                               \
    X(WEIGHTS_CHUNK, 11, (16u << 20) + 128)               \
    X(FORWARD, 12, 256u << 20)                            \
    X(TOKEN, 13, 1024)                                    \
    X(SEQ_CONFIG, 14, 256)                                \
    X(SEQ_FREE, 15, 64)                                   \
    X(ALLREDUCE, 16, 256u << 20)                          \
    X(ERROR, 17, 1024)                                    \
    X(BYE, 18, 512)                                       \
    X(SEQ_START, 19, 128 + 4u * CM_MSG_MAX_HIST)          \
    X(LINKS_REQ, 20, 2048)                                \
    X(LINKS, 21, 2048)                                    \
    X(OUTPUT, 22, 256u << 20)                             \
    X(TRAIN, 23, 256u << 20)                              \
    X(EXPERT_LOAD, 24, 16 + 4u * CM_MSG_MAX_EXPERT_CELLS) \
    X(SEQ_LORA, 25, 32 + 4u * CM_MSG_MAX_LORA)

/* clang-format would indent the member after the X-macro as a continuation. */
// clang-format off
enum cm_msg_type {
    CM_MSG_NONE = 0,
#define CM_X_MSG(name, num, max) CM_MSG_##name = num,
    CM_MSG_TYPES(CM_X_MSG)
#undef CM_X_MSG
    CM_MSG_COUNT
};
// clang-format on

/* "FORWARD"; "unknown" for a number outside the table. */
const char *cm_msg_type_name(unsigned type);
/* Maximum payload bytes for a type; 0 for an unknown type. */
uint32_t cm_msg_max_payload(unsigned type);

/* ---------------------------------------------------------------- frames */

typedef struct cm_frame_hdr {
    uint8_t version, type;
    uint16_t flags;
    uint64_t seq;
    uint32_t len; /* payload bytes on the wire (the MAC is not counted) */
} cm_frame_hdr;

/* Decode and validate the CM_FRAME_HDR bytes at p: magic, version, known type,
 * known flags, len <= the type's maximum. Needs n >= CM_FRAME_HDR. Errors:
 * CM_EFORMAT (magic/flags/truncated), CM_EUNSUPPORTED (version, type), CM_ERANGE (len). */
int cm_frame_hdr_decode(const uint8_t *p, size_t n, cm_frame_hdr *h, char *err, size_t errlen);
void cm_frame_hdr_encode(const cm_frame_hdr *h, uint8_t out[CM_FRAME_HDR]);

/* Peers of other versions. What a refusal needs never changes from one
 * version to the next: the header's layout and magic, ERROR's type number
 * (17) and payload (cm_msg_error), and a listener's first frame being in
 * plaintext with sequence number 0. So a node can always tell a peer of
 * another version why it refuses it, in that peer's own version. */

/* The version byte of the frame header at p, whatever the version (true), or
 * false when n < CM_FRAME_HDR or the magic is not cumulo's. */
bool cm_frame_hdr_version(const uint8_t *p, size_t n, unsigned *version);
/* A whole plaintext ERROR frame {code, text} with sequence number 0 and
 * protocol `version`'s header, for a peer of that version before any
 * handshake: *len bytes at out. CM_ERANGE when cap is too small. */
int cm_frame_refusal(unsigned version, int32_t code, const char *text, uint8_t *out, size_t cap, size_t *len, char *err,
                     size_t errlen);
/* The words for two protocol versions that differ, from the side of the
 * node that speaks `this_v` (the other speaks `that_v`): "protocol version
 * mismatch: that node runs cumulo protocol 1, this node protocol 2: update
 * cumulo on that node (...)". A refusal sent to a peer is written from the
 * peer's side (this_v = the peer's version): the peer shows it as it is. */
void cm_proto_mismatch_text(char *out, size_t cap, unsigned this_v, unsigned that_v);

/* Security of a connection. Both ends must use the same mode. */
typedef enum cm_sec_mode {
    CM_SEC_INSECURE = 0, /* no key, no MAC, plaintext: only with an explicit --insecure */
    CM_SEC_AUTH = 1,     /* every frame authenticated (MAC), payload in the clear */
    CM_SEC_ENCRYPT = 2,  /* every frame authenticated and encrypted (the default) */
    CM_SEC_COUNT
} cm_sec_mode;
const char *cm_sec_mode_name(cm_sec_mode m); /* "insecure" / "auth-only" / "encrypted" */

/* The per-connection frame state: one direction's key and sequence each way.
 * Starts in the handshake phase (plaintext frames, AUTH_* and ERROR only);
 * cm_hs_finish() moves it to the established phase in the negotiated mode.
 * Sending and receiving touch disjoint fields, so one thread may seal while
 * another opens; two concurrent sealers (or openers) need a lock. */
typedef struct cm_chan {
    cm_sec_mode mode;
    bool established;
    uint64_t tx_seq, rx_seq; /* next sequence number to send / to accept */
    uint8_t tx_key[32], rx_key[32];
    /* An ENCRYPT session seals ALLREDUCE frames auth-only (MAC over header and
     * payload, payload in the clear): the sender's choice on a loopback link,
     * where only the host's root could read them (cm_conn_set_clear_allreduce).
     * The receiver of an ENCRYPT session accepts either form of ALLREDUCE, and
     * only of ALLREDUCE; every other frame stays encrypted. */
    bool tx_clear_allreduce;
} cm_chan;

void cm_chan_init(cm_chan *s); /* handshake phase, seq 0 both ways; initialises libsodium */
void cm_chan_wipe(cm_chan *s); /* zero the keys */
/* Bytes a frame adds around its payload in this session (header + MAC). */
size_t cm_chan_overhead(const cm_chan *s);

/* Check a decoded header against the session before reading (or allocating
 * for) its payload: the type is allowed in this phase, the flags match the
 * mode, and seq is exactly the next one expected (replays and reordering fail
 * here). Errors: CM_EPROTO, CM_EAUTH. */
int cm_chan_check_hdr(const cm_chan *s, const cm_frame_hdr *h, char *err, size_t errlen);

/* Seal the payload already placed at frame + CM_FRAME_HDR (payload_len bytes):
 * writes the header, encrypts in place when the mode says so, appends the MAC,
 * advances tx_seq. cap is the size of frame; *frame_len gets the bytes to send.
 * Errors: CM_ERANGE (too large for the type or cap), CM_EINVAL, CM_ESTATE. */
int cm_frame_seal(cm_chan *s, unsigned type, uint8_t *frame, size_t payload_len, size_t cap, size_t *frame_len,
                  char *err, size_t errlen);

/* Open one whole frame (n must be exactly its wire size): checks the header
 * (cm_chan_check_hdr), verifies the MAC and decrypts in place, advances rx_seq.
 * *payload points into frame. On any error the session is unchanged.
 * Errors: CM_EFORMAT, CM_EUNSUPPORTED, CM_ERANGE, CM_EPROTO, CM_EAUTH (bad MAC). */
int cm_frame_open(cm_chan *s, uint8_t *frame, size_t n, cm_frame_hdr *h, uint8_t **payload, char *err, size_t errlen);

/* ------------------------------------------------------------- handshake
 *
 * initiator (client)                         responder (server)
 *   AUTH_INIT  {version, mode, nonce_c, epk_c}  ->
 *                      <-  AUTH_REPLY {version, mode, nonce_s, epk_s, proof_s}
 *   AUTH_FINISH {proof_c}                        ->
 * Both derive the traffic keys from the cluster key, the X25519 shared secret
 * and a hash of the transcript; proofs are keyed hashes of the transcript, so
 * a peer without the key cannot produce one and learns nothing from seeing one.
 * In CM_SEC_INSECURE mode only INIT and REPLY are exchanged (mode agreement).
 * The whole derivation is spelled out in docs/PROTOCOL.md.
 */
#define CM_HS_INIT_BYTES 68
#define CM_HS_REPLY_BYTES 100
#define CM_HS_FINISH_BYTES 32

typedef struct cm_hs {
    bool initiator;
    cm_sec_mode mode;
    int step;
    uint8_t key[CM_KEY_BYTES];
    uint8_t esk[32], epk[32], nonce[32];
    uint8_t init[CM_HS_INIT_BYTES], reply[CM_HS_INIT_BYTES]; /* transcript (reply sans proof) */
    uint8_t k_c2s[32], k_s2c[32], proof_s[32], proof_c[32];
    bool keys_ready, peer_ok; /* peer_ok: the peer's proof checked out */
} cm_hs;

/* key may be NULL only for CM_SEC_INSECURE. Draws the nonce and ephemeral key. */
int cm_hs_init(cm_hs *hs, bool initiator, cm_sec_mode mode, const uint8_t *key, char *err, size_t errlen);
/* Initiator: the AUTH_INIT payload (CM_HS_INIT_BYTES). */
int cm_hs_write_init(cm_hs *hs, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen);
/* Responder: check AUTH_INIT (version, mode agreement). On CM_EAUTH/CM_EUNSUPPORTED
 * the message is meant for the peer too (send it in an ERROR frame). */
int cm_hs_read_init(cm_hs *hs, const uint8_t *p, size_t n, char *err, size_t errlen);
/* Responder: the AUTH_REPLY payload (derives the keys). */
int cm_hs_write_reply(cm_hs *hs, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen);
/* Initiator: check AUTH_REPLY and derive the keys. Returns CM_EAUTH when the
 * responder's proof is wrong; cm_hs_write_finish still works then, so the
 * responder learns of the mismatch too. */
int cm_hs_read_reply(cm_hs *hs, const uint8_t *p, size_t n, char *err, size_t errlen);
/* Initiator: the AUTH_FINISH payload (CM_HS_FINISH_BYTES). */
int cm_hs_write_finish(cm_hs *hs, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen);
/* Responder: check the initiator's proof. CM_EAUTH when wrong. */
int cm_hs_read_finish(cm_hs *hs, const uint8_t *p, size_t n, char *err, size_t errlen);
/* Both: install the traffic keys in s (which keeps its sequence numbers) and
 * wipe the handshake secrets. */
int cm_hs_finish(cm_hs *hs, cm_chan *s, char *err, size_t errlen);
void cm_hs_wipe(cm_hs *hs);

/* -------------------------------------------------------------- messages */

#define CM_MSG_NAME_MAX 63                /* node and model names */
#define CM_MSG_ISA_MAX 127                /* "avx2,fma,f16c,avx512f,..." */
#define CM_MSG_SHORT_MAX 31               /* os, arch, version strings */
#define CM_MSG_ADDR_MAX 63                /* "host:port" / "[v6]:port" */
#define CM_MSG_TEXT_MAX 511               /* ERROR / READY / BYE messages */
#define CM_MSG_MAX_TOP 20                 /* top logprobs per TOKEN */
#define CM_MSG_MAX_TP 16                  /* tensor-parallel group size */
#define CM_MSG_MAX_REPLICAS 8             /* hot experts replicated onto one member of an expert group */
#define CM_MSG_MAX_TOKENS 16384u          /* tokens per FORWARD micro-batch */
#define CM_MSG_MAX_DIM 65536u             /* hidden size */
#define CM_MSG_MAX_HIST 4096u             /* penalty-history tokens per SEQ_START */
#define CM_MSG_MAX_CHUNK (16u << 20)      /* WEIGHTS_CHUNK / PING data bytes */
#define CM_MSG_MAX_PEERS 15               /* peers named in one LINKS_REQ / LINKS */
#define CM_MSG_LINKS_MAX_MS 30000u        /* a LINKS_REQ's deadline */
#define CM_MSG_LINKS_MAX_PROBE (1u << 20) /* bandwidth probe bytes per peer */
#define CM_MSG_MAX_OUT_DIM (1u << 20)     /* floats per OUTPUT row (a vocabulary's logits) */
#define CM_MSG_GPU_NAME_MAX 127           /* a GPU's name in HELLO */
#define CM_MSG_MAX_GPU_LAYERS 65535u      /* HELLO's gpu_layers */
#define CM_MSG_MAX_EXPERTS 1024u          /* experts per layer in EXPERT_LOAD */
#define CM_MSG_MAX_EXPERT_CELLS 16384u    /* layers x experts in one EXPERT_LOAD (64 KiB of counts) */

typedef struct cm_msg_hello {
    uint16_t proto_version;
    uint8_t node_id[CM_NODE_ID_BYTES]; /* random, chosen once per node process */
    char name[CM_MSG_NAME_MAX + 1];
    uint16_t listen_port; /* where this node accepts peers (0: none) */
    uint32_t roles;       /* CM_ROLE_* bits */
    uint32_t cores;
    char isa[CM_MSG_ISA_MAX + 1]; /* "avx2,fma,f16c" */
    uint64_t mem_total, mem_free; /* bytes */
    char os[CM_MSG_SHORT_MAX + 1], arch[CM_MSG_SHORT_MAX + 1];
    char version[CM_MSG_SHORT_MAX + 1]; /* cumulo version */
    float gflops;                       /* measured compute speed, >= 0, finite */
    float mem_gbs;                      /* measured memory bandwidth, GB/s, >= 0, finite */
    /* Optional tail (issue 19; absent in an older peer's HELLO, decoded as
     * zeros): the host this process runs on (nodes with the same host id
     * share its cores and memory bandwidth: the planner divides them), and
     * the node's lease: the coordinator it serves now (lease_epoch 0: none).
     * On the wire only when has_tail (every HELLO of this version sets it). */
    bool has_tail;
    char host[CM_MSG_NAME_MAX + 1];
    uint64_t lease_epoch, lease_since_ms;     /* the owner's plan epoch; unix ms the lease began */
    uint8_t lease_owner_id[CM_NODE_ID_BYTES]; /* the owning coordinator's node id */
    char lease_owner[CM_MSG_NAME_MAX + 1];    /* its name */
    char lease_model[CM_MSG_NAME_MAX + 1];    /* the model it runs here */
    /* Optional GPU tail (issue 16; on the wire only when has_gpu, after the
     * tail above, which it needs): the Vulkan device the node runs its
     * stage's first layers on, as its start-up probe measured it. */
    bool has_gpu;
    char gpu_name[CM_MSG_GPU_NAME_MAX + 1];
    uint64_t gpu_mem;          /* device-local bytes */
    float gpu_gbs, gpu_gflops; /* measured: finite, >= 0 */
    uint32_t gpu_layers;       /* the most layers it puts there (--gpu-layers; 0: as many as fit) */
} cm_msg_hello;
#define CM_ROLE_NODE 1u
#define CM_ROLE_COORDINATOR 2u

typedef struct cm_msg_heartbeat {
    uint64_t epoch;   /* the plan epoch the sender acts on */
    uint64_t wall_ms; /* sender's wall clock, unix ms */
    uint64_t mono_ns; /* sender's monotonic clock (echo it to measure RTT) */
    uint32_t load;    /* busy threads x 100 / cores, for the dashboard */
    /* Optional telemetry tail (issue 19): on the wire only when has_stats;
     * nodes send it in their own heartbeats. */
    bool has_stats;
    uint64_t mem_used; /* bytes in use on the machine */
    float cpu_load;    /* busy fraction of all CPUs [0, 1]; < 0: unknown (sent as -1) */
    float power_w;     /* finite, >= 0 */
    uint8_t power_src; /* enum cm_power_src */
    float tok_s;       /* token rows this node computed per second, recently; finite, >= 0 */
    float ms_per_tok;  /* its stage's compute time per token row, ms; finite, >= 0 */
} cm_msg_heartbeat;
/* How a node's watts were obtained. */
enum cm_power_src {
    CM_POWER_NONE = 0,
    CM_POWER_RAPL = 1,
    CM_POWER_ESTIMATE = 2,
    CM_POWER_COUNTERS = 3,
    CM_POWER_SRC_COUNT
};
const char *cm_power_src_name(unsigned src); /* "none" / "rapl" / "estimate" / "counters" */

/* PING carries data (upload bandwidth) and asks for reply_len bytes back in the
 * PONG (download bandwidth); id and sent_ns are echoed for RTT. */
typedef struct cm_msg_ping {
    uint64_t id, sent_ns;
    uint32_t reply_len; /* PING only: bytes wanted in the PONG (<= CM_MSG_MAX_CHUNK) */
    const uint8_t *data;
    uint32_t data_len; /* <= CM_MSG_MAX_CHUNK */
} cm_msg_ping;

/* ASSIGN: the coordinator gives one node its part of plan `epoch`. */
#define CM_ASSIGN_F_EMBED 1u  /* first stage: embeds token ids */
#define CM_ASSIGN_F_OUTPUT 2u /* last stage: output head + sampling */
#define CM_ASSIGN_F_TP_Q8 4u  /* tensor-parallel group: all-reduce transfers as Q8_0 (tp_size > 1 only) */
#define CM_ASSIGN_F_TAKE 16u  /* take the node over from the coordinator that holds its lease (--take) */
#define CM_ASSIGN_F_EP \
    8u /* expert group (expert parallelism; tp_size > 1, not with TP_Q8): every
                                   member holds whole layers but only its experts; expert_bounds follow */
#define CM_ASSIGN_F_KV \
    32u /* KV cache types follow (after expert_bounds): kv_type_k, kv_type_v, kv_rows
                                   (u8 each); without it: F32 K and V, transposed V */
#define CM_ASSIGN_F_REPLICAS \
    64u /* with EP only: hot-expert replicas follow (after the KV types): per rank, the experts it holds
                                   beyond its bounds; a replicated expert's rows are split among its holders */
#define CM_ASSIGN_F_HEAD \
    128u /* one tensor-parallel group (tp_size > 1, with OUTPUT, not EP): every member computes
                                   its rows of the output head (cm_slice_head_rows) for the FORWARD rows
                                   marked CM_WANT_LOGITS and sends them to rank 0 (cm_coll_gather) */
#define CM_ASSIGN_F_LORA \
    256u /* LoRA adapters: this member's layers' parts of them follow as one object (lora_sha256,
                                   lora_bytes; last on the wire) that the node fetches with WEIGHTS_REQ */
/* A member's parts of the adapters (ASSIGN's lora_bytes): a rank-64 adapter on
 * every target of a 7B model is ~20 MB per layer. */
#define CM_MSG_MAX_LORA_BYTES (2048u << 20)
typedef struct cm_msg_assign {
    uint64_t epoch;
    uint8_t model_sha256[32];
    char model_name[CM_MSG_NAME_MAX + 1]; /* file name hint for --models DIR */
    uint32_t flags;
    uint32_t n_layers;               /* of the whole model */
    uint32_t layer_begin, layer_end; /* [begin, end) */
    uint32_t head_begin, head_end;   /* attention heads [begin, end) of n_heads */
    uint32_t ffn_begin, ffn_end;     /* FFN rows [begin, end) of n_ff */
    uint32_t n_ctx, n_seq_max;       /* KV cache the node must reserve */
    uint16_t stage, n_stages;
    uint8_t hidden_dtype;                              /* CM_HIDDEN_F32 or CM_HIDDEN_Q8 between stages */
    char prev[CM_MSG_ADDR_MAX + 1];                    /* "" for the first stage */
    char next[CM_MSG_ADDR_MAX + 1];                    /* "" for the last stage */
    uint8_t tp_rank, tp_size;                          /* tensor-parallel group (1 = none) */
    char tp_peers[CM_MSG_MAX_TP][CM_MSG_ADDR_MAX + 1]; /* tp_size entries, rank order */
    /* CM_ASSIGN_F_EP only (after tp_peers on the wire: tp_size + 1 u16):
     * rank r holds experts [expert_bounds[r], expert_bounds[r + 1]) of every
     * MoE layer; bounds[0] = 0, non-decreasing, the last = n_expert. */
    uint16_t expert_bounds[CM_MSG_MAX_TP + 1];
    /* CM_ASSIGN_F_KV only: ggml type ids F32 0, F16 1, Q4_0 2, Q8_0 8; kv_rows
     * 0/1 (K and V rows and tiled attention, model/attn.c) */
    uint8_t kv_type_k, kv_type_v, kv_rows;
    /* CM_ASSIGN_F_REPLICAS only (last on the wire): per rank r < tp_size, n_replicas[r] u8
     * (<= CM_MSG_MAX_REPLICAS) then that many u16 experts, ascending, each below the last bound and
     * outside [bounds[r], bounds[r + 1]); at least one replica in the group. */
    uint8_t n_replicas[CM_MSG_MAX_TP];
    uint16_t replicas[CM_MSG_MAX_TP][CM_MSG_MAX_REPLICAS];
    /* CM_ASSIGN_F_LORA only (after the replicas): the sha256 of the bytes of
     * cm_lora_parts_write for this member's layers (its address for
     * WEIGHTS_REQ) and their size, 1..CM_MSG_MAX_LORA_BYTES. */
    uint8_t lora_sha256[32];
    uint32_t lora_bytes;
} cm_msg_assign;
/* Does rank r of the expert group of a hold expert e (its bounds, or a replica)? */
static inline bool cm_msg_assign_holds(const cm_msg_assign *a, unsigned r, unsigned e) {
    if (e >= a->expert_bounds[r] && e < a->expert_bounds[r + 1]) return true;
    for (unsigned i = 0; (a->flags & CM_ASSIGN_F_REPLICAS) && i < a->n_replicas[r]; i++)
        if (a->replicas[r][i] == e) return true;
    return false;
}

/* READY: a node answers ASSIGN (status 0: loaded; else a CM_E* code + text). */
typedef struct cm_msg_ready {
    uint64_t epoch;
    int32_t status;
    uint64_t bytes_missing; /* weight bytes the node still needs streamed */
    char text[CM_MSG_TEXT_MAX + 1];
} cm_msg_ready;

/* Content-addressed weights: tensor_hash = sha256 of the tensor's bytes. */
typedef struct cm_msg_weights_req {
    uint8_t tensor_hash[32];
    uint64_t offset;
    uint32_t len; /* <= CM_MSG_MAX_CHUNK */
} cm_msg_weights_req;
typedef struct cm_msg_weights_chunk {
    uint8_t tensor_hash[32];
    uint64_t offset, total; /* offset + data_len <= total */
    const uint8_t *data;
    uint32_t data_len; /* <= CM_MSG_MAX_CHUNK */
} cm_msg_weights_chunk;

enum cm_hidden_dtype { CM_HIDDEN_TOKENS = 0, CM_HIDDEN_F32 = 1, CM_HIDDEN_Q8 = 2, CM_HIDDEN_COUNT };

/* FORWARD: one micro-batch for the next stage. TOKENS carries token ids (to the
 * first stage, dim 0); F32 carries n_tokens x dim floats; Q8 carries per token
 * a f32 scale + dim int8 (x = scale * q). want[i] = 1 asks for output at token i.
 * Encoding reads the typed pointers; decoding fills the *_le views (little-endian
 * bytes inside the frame) — read them with the accessors below. */
typedef struct cm_msg_forward {
    uint64_t epoch, request_id;
    uint32_t n_tokens, dim;
    uint8_t dtype;
    const int32_t *pos, *seq, *tokens;                  /* encode: n_tokens each (tokens: TOKENS only) */
    const uint8_t *want;                                /* encode: n_tokens */
    const float *hidden;                                /* encode: n_tokens x dim (F32/Q8) */
    const uint8_t *pos_le, *seq_le, *want_le, *data_le; /* decode views */
} cm_msg_forward;
int32_t cm_msg_forward_pos(const cm_msg_forward *m, uint32_t i);
int32_t cm_msg_forward_seq(const cm_msg_forward *m, uint32_t i);
unsigned cm_msg_forward_want(const cm_msg_forward *m, uint32_t i); /* an enum cm_want */
int32_t cm_msg_forward_token(const cm_msg_forward *m, uint32_t i); /* TOKENS only */
/* FORWARD's want byte per row: what the last stage does after it. */
enum cm_want {
    CM_WANT_NONE = 0,   /* nothing (a prompt row) */
    CM_WANT_TOKEN = 1,  /* sample with the sequence's sampler, send a TOKEN */
    CM_WANT_LOGITS = 2, /* send this row's logits back (OUTPUT, CM_OUTPUT_LOGITS): the coordinator samples */
    CM_WANT_HIDDEN = 3, /* send this row's final hidden state back (OUTPUT, CM_OUTPUT_HIDDEN) */
    CM_WANT_COUNT
};
/* Row i (dim floats) of a decoded F32/Q8 FORWARD into out. */
void cm_msg_forward_row(const cm_msg_forward *m, uint32_t i, float *out);

/* TOKEN: the last stage's sampled token for one sequence. */
typedef struct cm_msg_token {
    uint64_t epoch, request_id;
    int32_t seq, pos, token;
    float logprob;
    uint8_t n_top; /* <= CM_MSG_MAX_TOP */
    int32_t top_token[CM_MSG_MAX_TOP];
    float top_logprob[CM_MSG_MAX_TOP];
} cm_msg_token;

/* SEQ_CONFIG: sampling parameters of a sequence, sent to the last stage. */
typedef struct cm_msg_seq_config {
    uint64_t epoch, request_id;
    int32_t seq;
    float temperature, top_p, min_p, repeat_penalty;
    int32_t top_k;
    uint64_t seed;
    uint8_t n_top_logprobs; /* <= CM_MSG_MAX_TOP */
} cm_msg_seq_config;

/* SEQ_START: a sequence starts generating: the full sampler parameters and
 * the tail of its history for the penalties. Sent by the coordinator down the
 * stage chain (so it reaches the last stage in order with the sequence's
 * FORWARDs); the last stage (re)makes the sequence's sampler from it. */
typedef struct cm_msg_seq_start {
    uint64_t epoch, request_id;
    int32_t seq;
    float temperature;                         /* finite; <= 0: greedy */
    int32_t top_k;                             /* <= 0: off */
    float top_p, min_p;                        /* [0, 1] */
    float repeat_penalty;                      /* finite, > 0 */
    int32_t repeat_last_n;                     /* [0, 1 << 20] */
    float presence_penalty, frequency_penalty; /* finite */
    uint64_t seed;
    uint64_t n_sampled;     /* tokens this generation already sampled: the sampler resumes at that
                                 * draw (0 for a new generation; > 0 when a re-plan restarts it) */
    uint8_t n_probs;        /* top logprobs wanted per TOKEN, <= CM_MSG_MAX_TOP */
    uint32_t n_hist;        /* <= CM_MSG_MAX_HIST */
    const int32_t *hist;    /* encode: n_hist token ids (>= 0), oldest first */
    const uint8_t *hist_le; /* decode view (also encoded from when hist is NULL) */
} cm_msg_seq_start;
int32_t cm_msg_seq_start_hist(const cm_msg_seq_start *m, uint32_t i);

/* OUTPUT: rows the last stage sends back to the coordinator instead of a
 * TOKEN, for FORWARD rows whose want asked for them: the logits (the
 * coordinator samples them under a grammar) or the final hidden state
 * before the output norm (the coordinator pools it into an embedding). One
 * sequence per message; rows in the order of their FORWARD. */
enum cm_output_kind { CM_OUTPUT_HIDDEN = 0, CM_OUTPUT_LOGITS = 1, CM_OUTPUT_COUNT };
typedef struct cm_msg_output {
    uint64_t epoch, request_id;      /* request_id: the FORWARD's */
    int32_t seq;                     /* >= 0 */
    uint8_t kind;                    /* enum cm_output_kind */
    uint32_t n_rows;                 /* 1..CM_MSG_MAX_TOKENS */
    uint32_t dim;                    /* 1..CM_MSG_MAX_OUT_DIM; n_rows * dim * 4 within the payload maximum */
    const int32_t *pos;              /* encode: n_rows positions (>= 0) */
    const float *data;               /* encode: n_rows x dim floats */
    const uint8_t *pos_le, *data_le; /* decode views (also encoded from when pos / data are NULL) */
} cm_msg_output;
int32_t cm_msg_output_pos(const cm_msg_output *m, uint32_t i);
void cm_msg_output_row(const cm_msg_output *m, uint32_t i, float *out); /* dim floats */

/* TRAIN: pipeline-parallel LoRA training (issue 17), one op per message.
 * The coordinator's control connection to each stage's node carries SETUP,
 * SLICE, FETCH, STEP and an eval's ROWS; the activations and their gradients
 * go stage to stage on the links the inference pipeline opens (the
 * coordinator's data link to stage 1, each node's link to the next stage):
 *   SETUP  coord -> node: make the stage's adapter slice (its layers) and
 *          trainer: rank, targets, alpha (f[0]), n_ctx; key = optimizer
 *          step; offset = the windows in flight (1..CM_MSG_MAX_TRAIN_INFLIGHT):
 *          a stage keeps that many windows' forward state;
 *   SLICE  both ways: dim floats (n_rows = 1) of the slice's vector vec at
 *          element offset (coord -> node after SETUP: the state to start
 *          from; node -> coord: the answer to a FETCH); key = the step;
 *   FETCH  coord -> node: send back dim floats of vec from offset (a SLICE;
 *          of G: the window's gradients, cleared once sent);
 *   FWD    stage -> next stage: window number offset, n_rows x dim
 *          activations (the sender's output), dropout key (key), weight
 *          f[0], dropout f[1]; F_TARGETS: n_rows target ids follow (relayed
 *          to the last stage: loss); F_BACKWARD: a training window (the last
 *          stage runs its backward at once, the others keep its state);
 *   BWD    stage -> previous stage, on the link its FWD came: the gradient
 *          of the receiver's output for window offset; loss and n_targets
 *          from the last stage;
 *   ROWS   node -> coord: the last stage's answer to an eval FWD (no rows;
 *          loss and n_targets), by the FWD's id;
 *   STEP   coord -> node: AdamW on the slice: lr, beta1, beta2, eps, wd in f[0..4].
 * A node trains only layers it was ASSIGNed (a pipeline stage, no group). */
enum cm_train_op {
    CM_TRAIN_SETUP = 0,
    CM_TRAIN_SLICE = 1,
    CM_TRAIN_FETCH = 2,
    CM_TRAIN_FWD = 3,
    CM_TRAIN_BWD = 4,
    CM_TRAIN_ROWS = 5,
    CM_TRAIN_STEP = 6,
    CM_TRAIN_OP_COUNT
};
/* G: the gradients the windows since the last FETCH of G added (data
 * parallelism takes them per window: a FETCH of G clears what it sent). */
enum cm_train_vec {
    CM_TRAIN_VEC_W = 0,
    CM_TRAIN_VEC_M1 = 1,
    CM_TRAIN_VEC_M2 = 2,
    CM_TRAIN_VEC_G = 3,
    CM_TRAIN_VEC_COUNT
};
#define CM_TRAIN_F_TARGETS 1u
#define CM_TRAIN_F_BACKWARD 2u
#define CM_MSG_MAX_TRAIN_RANK 1024u
#define CM_MSG_MAX_TRAIN_SLICE (CM_MSG_MAX_CHUNK / 4) /* floats per SLICE / FETCH */
#define CM_MSG_MAX_TRAIN_INFLIGHT 64u                 /* SETUP: windows in flight */
typedef struct cm_msg_train {
    uint64_t epoch, id;
    uint8_t op;                         /* enum cm_train_op */
    uint8_t flags;                      /* CM_TRAIN_F_*, FWD only */
    uint8_t vec;                        /* enum cm_train_vec: SLICE, FETCH */
    uint32_t n_rows, dim;               /* FWD/BWD/ROWS: rows (<= CM_MSG_MAX_TOKENS) of dim (<= CM_MSG_MAX_DIM) floats;
                                   SLICE: 1 x dim (<= CM_MSG_MAX_TRAIN_SLICE); FETCH: 0 x dim; else 0 x 0 */
    uint32_t n_targets;                 /* ROWS, BWD: targets the last stage counted (<= n_rows of its FWD) */
    uint64_t offset;                    /* SLICE, FETCH: element; FWD, BWD: window number; SETUP: windows in flight */
    uint64_t key;                       /* FWD: dropout key; SETUP, SLICE: the optimizer step */
    float f[5];                         /* per op, above; finite */
    double loss;                        /* ROWS, BWD: summed loss (finite, >= 0) */
    uint32_t rank, targets, n_ctx;      /* SETUP: 1..CM_MSG_MAX_TRAIN_RANK, bits 0..6 (not 0), 2..65536 */
    const int32_t *target;              /* encode: n_rows ids (>= -1), F_TARGETS only */
    const float *data;                  /* encode: n_rows x dim floats */
    const uint8_t *target_le, *data_le; /* decode views (also encoded from when target / data are NULL) */
} cm_msg_train;
int32_t cm_msg_train_target(const cm_msg_train *m, uint32_t i);
void cm_msg_train_get(const cm_msg_train *m, float *out); /* n_rows x dim floats */

/* SEQ_LORA: a sequence's LoRA adapter scales (serve's per-request
 * adapters): scale[a] replaces adapter a's load-time user scale for the
 * sequence's rows from now on (until SEQ_FREE or another SEQ_LORA), on every
 * stage. Sent by the coordinator down the stage chain before the
 * sequence's FORWARDs (each stage applies it and passes it on), so it
 * reaches every stage in order with them. n: the adapters of the ASSIGN's
 * LoRA parts; each scale finite, |scale| < 1e6. */
#define CM_MSG_MAX_LORA 64u
typedef struct cm_msg_seq_lora {
    uint64_t epoch;
    int32_t seq;
    uint32_t n; /* <= CM_MSG_MAX_LORA */
    float scale[CM_MSG_MAX_LORA];
} cm_msg_seq_lora;

typedef struct cm_msg_seq_free {
    uint64_t epoch, request_id;
    int32_t seq;
} cm_msg_seq_free;

/* ALLREDUCE: a segment of a tensor-parallel partial sum (n floats at elem_offset
 * of the op's vector). op_id numbers the collectives of an epoch; step is the
 * ring step (0 for a direct exchange). */
typedef struct cm_msg_allreduce {
    uint64_t epoch, op_id;
    uint16_t layer;
    uint8_t point; /* 0: after attn_output, 1: after ffn_down */
    uint8_t step;
    uint32_t elem_offset, n;
    const float *data;      /* encode: n floats */
    const uint8_t *data_le; /* decode view */
} cm_msg_allreduce;
void cm_msg_allreduce_get(const cm_msg_allreduce *m, float *out); /* n floats */

/* LINKS_REQ: measure your links to these peers (handshake, RTT and
 * bandwidth toward each, as the requester measures its own) and answer with
 * LINKS within deadline_ms; a peer not measured by then is reported with
 * CM_ETIMEDOUT. LINKS: one entry per peer of the request, in its order. */
typedef struct cm_msg_links_req {
    uint64_t id;          /* echoed in LINKS */
    uint32_t deadline_ms; /* 1..CM_MSG_LINKS_MAX_MS, for the whole answer */
    uint32_t probe_bytes; /* bandwidth probe per peer, <= CM_MSG_LINKS_MAX_PROBE (0: RTT only) */
    uint8_t n_peers;      /* 1..CM_MSG_MAX_PEERS */
    char peers[CM_MSG_MAX_PEERS][CM_MSG_ADDR_MAX + 1]; /* "host:port" */
} cm_msg_links_req;
typedef struct cm_msg_link {
    char addr[CM_MSG_ADDR_MAX + 1]; /* the peer, as named in the request */
    int32_t status;                 /* 0 measured, else a CM_E* code (unreachable, refused, timed out) */
    float rtt_s;                    /* round trip of an empty PING, seconds (finite, >= 0) */
    float bw;                       /* bytes/s from the reporting node to the peer (finite, >= 0; 0: not measured) */
} cm_msg_link;
typedef struct cm_msg_links {
    uint64_t id;
    uint8_t n; /* <= CM_MSG_MAX_PEERS */
    cm_msg_link link[CM_MSG_MAX_PEERS];
} cm_msg_links;

/* EXPERT_LOAD (issue 13): a stage node tells the coordinator how many
 * (token, slot) assignments its router sent to each expert of each of its
 * MoE layers since its previous EXPERT_LOAD of the same plan (a delta), so
 * that the coordinator's counts, and the re-plan that places hot-expert
 * replicas by them, cover the layers of every stage, not only its own.
 * Sent by rank 0 of each later stage about every CM_PIPE_HB_MS while it
 * computes; a stage whose layers x experts exceed CM_MSG_MAX_EXPERT_CELLS
 * sends one message per run of layers. The coordinator refuses one from a
 * node that is not rank 0 of a later stage of the running plan, or naming
 * layers outside that stage or another expert count (cluster/ep_load.h),
 * and drops one of an earlier epoch. */
typedef struct cm_msg_expert_load {
    uint64_t epoch;
    uint32_t layer_begin;        /* counts of layers [layer_begin, layer_begin + n_layers), < 65536 */
    uint16_t n_layers, n_expert; /* >= 1; n_expert <= CM_MSG_MAX_EXPERTS; product <= CM_MSG_MAX_EXPERT_CELLS */
    const uint32_t *counts;      /* encode: n_layers x n_expert, layer-major */
    const uint8_t *counts_le;    /* decode view (also encoded from when counts is NULL) */
} cm_msg_expert_load;
/* Count i (layer i / n_expert, expert i % n_expert) of a decoded or encoded message. */
uint32_t cm_msg_expert_load_count(const cm_msg_expert_load *m, uint32_t i);

typedef struct cm_msg_error {
    int32_t code; /* a CM_E* value */
    char text[CM_MSG_TEXT_MAX + 1];
} cm_msg_error;

typedef struct cm_msg_bye {
    char text[CM_MSG_TEXT_MAX + 1];
} cm_msg_bye;

/* Any message. AUTH_* payloads are handled by cm_hs_*, not by cm_msg_*. */
typedef struct cm_msg {
    unsigned type; /* enum cm_msg_type */
    union {
        cm_msg_hello hello;
        cm_msg_heartbeat heartbeat;
        cm_msg_ping ping; /* PING and PONG */
        cm_msg_assign assign;
        cm_msg_ready ready;
        cm_msg_weights_req weights_req;
        cm_msg_weights_chunk weights_chunk;
        cm_msg_forward forward;
        cm_msg_token token;
        cm_msg_seq_config seq_config;
        cm_msg_seq_free seq_free;
        cm_msg_seq_start seq_start;
        cm_msg_seq_lora seq_lora;
        cm_msg_allreduce allreduce;
        cm_msg_links_req links_req;
        cm_msg_links links;
        cm_msg_output output;
        cm_msg_train train;
        cm_msg_expert_load expert_load;
        cm_msg_error error;
        cm_msg_bye bye;
    } u;
} cm_msg;

/* Encode m's payload into out (cap bytes); out == NULL only measures.
 * *len gets the payload size. Errors: CM_EINVAL (a field out of its bounds,
 * unknown type), CM_ERANGE (cap too small). */
int cm_msg_encode(const cm_msg *m, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen);
/* Decode a payload of the given type. Views point into p. Errors: CM_EFORMAT
 * (truncated, trailing bytes, a bound violated), CM_EUNSUPPORTED (type). */
int cm_msg_decode(unsigned type, const uint8_t *p, size_t n, cm_msg *m, char *err, size_t errlen);

#endif
