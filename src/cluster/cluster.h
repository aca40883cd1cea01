/*
 * cluster: a model spread over machines, pipeline parallel. Two halves:
 *
 *  - the NODE daemon (`cumulo node`, node.c): accepts authenticated
 *    connections, reports its capabilities in HELLO, answers PING, takes an
 *    ASSIGN (epoch, model sha256, layer range, slice, next stage), maps its
 *    weights from a local GGUF with the same sha256, and runs its stage:
 *    hidden states in from the previous stage, out to the next one directly;
 *    the last stage applies the output head, SAMPLES and sends token ids to
 *    the coordinator (no vocabulary-sized data on any link).
 *  - the COORDINATOR pipe (coord.c): connects to the nodes, measures the
 *    links, plans with cm_plan_make, assigns stages, and then carries the
 *    first stage's hidden states to stage 1 and the sampled tokens back to
 *    the sequence waiting for them. The engine (L4) runs the first stage
 *    itself and uses this pipe behind cm_session_*.
 *
 * This header deliberately does not include proto/net: engine.c includes it
 * next to engine.h.
 * Every network wait has a deadline. Nothing here allocates per token.
 */
#ifndef CM_CLUSTER_H
#define CM_CLUSTER_H

#include "base/base.h"
#include "cluster/member.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "sched/plan.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- this machine ---- */

/* Capabilities measured once per process (a few ms of real kernels):
 * compute speed from Q8_0 dot products in cache, memory bandwidth from the
 * same over a buffer far larger than the caches; the environment variable
 * CUMULO_DECLARE_SPEED="GFLOPS,GBS" replaces both (tests that need equally
 * strong machines on one host). Thread-safe. */
typedef struct cm_node_caps {
    int cores;
    char isa[128]; /* "avx512 (avx2,fma,...)": the kernels in use, then the CPU's features */
    uint64_t mem_total, mem_free;
    char os[32], arch[32], version[32];
    double gflops; /* one thread */
    double mem_bw; /* bytes/s, one thread */
    bool declared; /* gflops and mem_bw come from CUMULO_DECLARE_SPEED="GFLOPS,GBS", not measured */
    /* A node's GPU (issue 16; from its HELLO's GPU tail; gpu_name "": none) */
    char gpu_name[128];
    uint64_t gpu_mem;         /* device-local bytes */
    double gpu_bw, gpu_flops; /* its probe's bytes/s and FLOP/s */
    int gpu_layers;           /* the most layers it puts there (0: as many as fit) */
} cm_node_caps;
void cm_node_caps_get(cm_node_caps *c);

/* SHA-256 of a file, hex (65 bytes with NUL). Results are remembered per
 * (path, size, mtime) in this process. */
int cm_file_sha256(const char *path, uint8_t out[32], char *err, size_t errlen);
void cm_sha256_hex(const uint8_t h[32], char out[65]);

/* ---- the node daemon ---- */

typedef struct cm_node_opts {
    const char *bind;        /* NULL / "": every address */
    uint16_t port;           /* 0: a free port (printed, and written to port_file) */
    const char *name;        /* NULL: the host name */
    const char *cache_dir;   /* NULL: ~/.cache/cumulo */
    const char *models_dir;  /* where GGUFs of assigned models are looked for */
    const char *const *join; /* peers to connect to at start (link check), n_join of them */
    int n_join;
    int n_threads;         /* 0: all CPUs */
    bool mmap;             /* keep slices in a file mapping (else read into huge-page memory when they fit) */
    bool insecure;         /* plaintext, no key (both ends must say so) */
    const char *key_file;  /* NULL: cm_net_key_default_path */
    bool mdns;             /* announce _cumulo._tcp */
    const char *port_file; /* write the listening port here once listening */
    const char *gpu;       /* --gpu: a Vulkan device for each stage's first layers (gpu.h's names;
                               NULL: $CUMULO_GPU, else none) */
    int gpu_layers;        /* at most this many of a stage's layers on it (0: as many as fit) */
} cm_node_opts;

/* Run until *stop becomes non-zero (a signal handler or another thread sets
 * it: atomic_int is lock-free, so a handler may store to it). Returns 0 on a
 * clean stop, or an error (cannot listen, no key, ...). */
int cm_node_run(const cm_node_opts *o, atomic_int *stop, char *err, size_t errlen);

/* ---- discovery and probing (`cumulo nodes`, --nodes auto) ---- */

/* A node to node link, as the first node measured it toward the second. */
typedef struct cm_node_link {
    bool asked;       /* measurement asked for (both nodes reachable) */
    int status;       /* 0 measured; else the CM_E* of the failure (or CM_ETIMEDOUT: no answer in time) */
    double rtt_s, bw; /* round trip; bytes/s from this node toward the other */
} cm_node_link;
#define CM_NODE_LINKS_MAX 16 /* probes of more nodes measure no node to node links */

typedef struct cm_node_info {
    char addr[80]; /* "host:port" as used to connect */
    char name[64];
    bool from_mdns;
    int status; /* 0 reachable; else the CM_E* of the failure */
    char error[200];
    cm_node_caps caps;                     /* from its HELLO (mem_bw: 0, not reported) */
    double rtt_s;                          /* round trip of a small PING */
    double bw;                             /* bytes/s of a 64 KiB PING, one way */
    cm_node_link links[CM_NODE_LINKS_MAX]; /* this node -> node j of the same probe (j indexes out[]) */
    char host[64];                         /* its host id (HELLO; "" from an older node) */
    char serves[400]; /* "" free; else whom it serves (issue 19: its lease, as a coordinator would say it) */
} cm_node_info;

/* Browse mDNS for timeout_s seconds and append what it finds ("addr:port")
 * to addrs (up to max entries, comma separated into buf). Returns the count
 * or an error. */
int cm_discover(double timeout_s, char addrs[][80], int max, char *err, size_t errlen);

/* Connect to each address, handshake, and measure RTT and bandwidth; then
 * (n <= CM_NODE_LINKS_MAX) ask every reachable node to measure its links to
 * the other reachable ones (LINKS_REQ), CM_LINKS_DEADLINE_MS each at most. */
int cm_probe_nodes(const char *const *addrs, int n, bool insecure, const char *key_file, cm_node_info *out, char *err,
                   size_t errlen);

/* ---- the coordinator's pipe ---- */

typedef struct cm_pipe cm_pipe;

typedef void (*cm_pipe_log_fn)(void *ctx, const char *line);

typedef struct cm_pipe_opts {
    const char *nodes;  /* "auto" or "host:port,host:port,..." */
    double auto_wait_s; /* mDNS browse time for "auto" (0: 3 s) */
    bool insecure;
    const char *key_file;
    cm_plan_request plan; /* the shape asked for (mode, layer split, groups, speeds); zero: the planner's pipeline */
    bool tp_compress;     /* all-reduce transfers as 8-bit Q8_0 blocks (--tp-compress) */
    bool take;            /* --take: use nodes that serve another coordinator (it is told and re-plans);
                                without it such nodes are left out (their HELLO shows the lease) */
    int n_ctx;            /* positions per sequence */
    int n_seq_max;        /* concurrent sequences (KV on every node) */
    int kv_type_k, kv_type_v;   /* KV cache types on every node (enum cm_type; 0 = F32) */
    bool kv_rows;               /* K and V rows + tiled attention (model/attn.c; forced for quantized types) */
    int max_batch;              /* most tokens per FORWARD */
    int timeout_ms;             /* deadline for one token to come back (0: 60 s) */
    const struct cm_lora *lora; /* LoRA adapters (model/lora.h; NULL: none): every plan sends each member its
                                   layers' parts (coord_lora.c); must outlive the pipe */
    cm_pipe_log_fn log;         /* progress lines (plan, weights); NULL: none */
    void *log_ctx;
} cm_pipe_opts;

/* Connect, measure, plan, assign and wait until every stage is ready. The
 * coordinator is node 0 of the plan and computes layers [0, *local_last).
 * If the plan keeps every layer on this machine, *out is NULL and
 * *local_last = n_layer (a single-machine engine). g and m must outlive the
 * pipe (weights are streamed from g's mapping). */
int cm_pipe_open(cm_pipe **out, const char *model_path, const cm_gguf *g, const cm_model *m, const cm_pipe_opts *o,
                 int *local_last, char *err, size_t errlen);
/* Say BYE to every node (they drop the assignment) and free. NULL: no-op. */
void cm_pipe_close(cm_pipe *p);
/* The plan as printed by `cumulo plan`, plus the measured links. */
const char *cm_pipe_plan_text(const cm_pipe *p);
int cm_pipe_n_stages(const cm_pipe *p);
/* Micro-batches serve keeps in flight on the running plan (batch_pipe.c's
 * default): one per set of stages that share a host (cm_plan_pipe_groups). */
int cm_pipe_groups(const cm_pipe *p);

/* A sequence slot (0..n_seq_max-1) or CM_EBUSY when all are taken. */
int cm_pipe_seq_acquire(cm_pipe *p, char *err, size_t errlen);
/* Tells every stage to drop the slot's KV cache, then frees the slot. */
void cm_pipe_seq_release(cm_pipe *p, int slot);
/* Sampler parameters and penalty history for the slot's next tokens;
 * n_sampled: tokens this generation already took (0 when it starts; after a
 * re-plan, the count so far: the new last stage draws on from there). */
/* Per-request LoRA scales (coord_lora.c): from now on the stages apply the
 * user scales scale[0..n) (n: the adapters loaded, cm_pipe_opts.lora) to
 * slot's rows; SEQ_LORA down the stage chain (and to the first group's
 * members), ahead of the slot's next FORWARD. SEQ_FREE resets the slot to
 * the loaded scales, as does a re-plan (the new stages start there). */
#define CM_PIPE_MAX_LORA 64 /* adapters a SEQ_LORA carries (proto.h CM_MSG_MAX_LORA) */
int cm_pipe_seq_lora(cm_pipe *p, int slot, const float *scale, int n, char *err, size_t errlen);
int cm_pipe_seq_start(cm_pipe *p, int slot, const cm_sampler_params *sp, const int32_t *hist, int n_hist,
                      uint64_t n_sampled, char *err, size_t errlen);
/* What the last stage does after a row: FORWARD's want byte (proto.h's enum
 * cm_want, the same values; this header does not include proto.h), and the
 * kinds of rows it sends back (enum cm_output_kind). */
enum { CM_PIPE_WANT_NONE = 0, CM_PIPE_WANT_TOKEN = 1, CM_PIPE_WANT_LOGITS = 2, CM_PIPE_WANT_HIDDEN = 3 };
enum { CM_PIPE_OUT_HIDDEN = 0, CM_PIPE_OUT_LOGITS = 1 };

/* Send n rows of hidden states (first stage's output) at positions pos[] to
 * stage 1; want (CM_PIPE_WANT_*) says what the last stage does:
 * TOKEN samples after the last row (cm_pipe_recv_token), LOGITS sends the
 * last row's logits back, HIDDEN every row's final hidden state
 * (cm_pipe_output_expect first). The caller must
 * send one slot's rows in order. Thread-safe. */
int cm_pipe_send(cm_pipe *p, int slot, const float *hidden, const int32_t *pos, int n, int want, char *err,
                 size_t errlen);
/* One micro-batch of several sequences (serve's decode groups): row i is
 * slots[i]'s, at pos[i], want[i] (CM_PIPE_WANT_NONE / _TOKEN / _LOGITS) what
 * the last stage does after it; each slot's rows in order, its tokens then
 * come back as cm_pipe_send's (cm_pipe_recv_token per slot). Thread-safe. */
int cm_pipe_send_rows(cm_pipe *p, const int32_t *slots, const float *hidden, const int32_t *pos, const uint8_t *want,
                      int n, char *err, size_t errlen);
/* Rows back from the last stage (pipe_output.c): before sending rows with
 * CM_PIPE_WANT_LOGITS / _HIDDEN, name where they go: n_rows rows of kind
 * (CM_PIPE_OUT_LOGITS: n_vocab floats each; CM_PIPE_OUT_HIDDEN: n_embd) at
 * positions pos0.. into buf; then wait until all came (the token deadline;
 * a pipe failure answers as cm_pipe_recv_token does). One expectation per
 * slot at a time; the wait ends it. */
void cm_pipe_output_expect(cm_pipe *p, int slot, int kind, float *buf, int pos0, int n_rows);
int cm_pipe_output_wait(cm_pipe *p, int slot, char *err, size_t errlen);
/* Wait for the token sampled after the slot's last want_last row. */
int cm_pipe_recv_token(cm_pipe *p, int slot, int32_t *token, float *logprob, char *err, size_t errlen);

/* Failures. The coordinator sends each node a HEARTBEAT every
 * CM_PIPE_HB_MS on its control connection and the node echoes it (and, from
 * then on, sends its own every CM_PIPE_HB_MS from a thread of its own); a node
 * silent for CM_PIPE_LOST_MS (env CUMULO_LOST_MS overrides, >= 200) or whose
 * connection closes is declared lost: the pipe fails (every waiting call
 * returns the reason) until cm_pipe_recover. */
#define CM_PIPE_HB_MS 500
#define CM_PIPE_LOST_MS 2000
/* The data deadline: the longest a cluster connection waits for a frame or
 * to send one when no loss bound applies (a node's next FORWARD, a weight
 * chunk, the coordinator's token wait unless cm_pipe_opts.timeout_ms says). */
#define CM_PIPE_DATA_MS 60000
/* The longest a node may take to load a stage (no READY yet; training's
 * waits). */
#define CM_PIPE_LOAD_MS 600000
/* The silence allowed to a node loading its stage: its own heartbeats keep
 * coming (a thread of their own), so 5 x the loss bound, at least this; a
 * node stopped while the cluster opens is then left out in seconds. */
#define CM_PIPE_LOAD_SILENT_MS 10000
/* The loss bound in force: CM_PIPE_LOST_MS, or env CUMULO_LOST_MS (>= 200).
 * It also bounds every wait on a peer that should answer within it: a send
 * that makes no progress (cm_net_cfg.send_stall_ms of every cluster
 * connection) and a tensor-parallel all-reduce. */
int cm_cluster_lost_ms(void);
/* Whether the pipe has failed (a node lost or reporting an error). */
bool cm_pipe_failed(cm_pipe *p);
/* Re-plan on the surviving nodes under a new epoch (cm_plan_make): this
 * machine keeps its layers, the survivors share the rest by speed and
 * memory, KV counted (loading them from their model file or cache, or
 * streamed from here); a tensor-parallel group is re-formed instead (see
 * cm_pipe_tp_recover). Every slot's state on the nodes is gone: the caller
 * must SEQ_START again and resend each sequence from position 0. 0 when
 * nothing failed or the pipe recovered; otherwise an error with the reason,
 * and the pipe stays failed with it (CM_EAGAIN: the survivors cannot hold
 * the model; else a survivor could not take its part). After a failed
 * recovery later calls answer at once until cm_pipe_maintain sees nodes
 * return. Call only while nothing else uses the pipe (no token awaited). */
int cm_pipe_recover(cm_pipe *p, char *err, size_t errlen);
/* Idle upkeep: call only while nothing uses the pipe, as often as you like
 * (it acts at most every CM_PIPE_REJOIN_MS; env CUMULO_REJOIN_MS). Redials
 * the nodes of the plan that were lost and, with --nodes auto, dials the
 * nodes mDNS found since (browsing starts at the first call; bounded, see
 * coord_impl.h CM_JOIN_*); when some came back or joined it re-plans with
 * the planner on every reachable node (this machine keeps its layers) and
 * switches to that plan unless it is predicted more than 10% slower (a
 * failed pipe switches whenever the plan fits again). A tensor-parallel
 * group and a hybrid plan are re-planned the same way (the caller takes
 * cm_pipe_tp_slice again). Returns 1 when the plan changed (sessions then resend, as
 * after cm_pipe_recover), 0 when not, or an error (the pipe is then failed,
 * as after cm_pipe_recover). */
#define CM_PIPE_REJOIN_MS 5000
int cm_pipe_maintain(cm_pipe *p, char *err, size_t errlen);
/* Tensor parallel: a forward pass (all-reduce) failed. Re-forms the group
 * on the live nodes under a new epoch with the planner's slices (this
 * machine alone, every slice, when none is left); the caller then takes
 * cm_pipe_tp_slice again and recomputes every sequence from position 0 with
 * KV caches of the new slice. Errors as cm_pipe_recover. */
int cm_pipe_tp_recover(cm_pipe *p, char *err, size_t errlen);
/* Bumped by every re-plan: a session whose generation differs must resend. */
int cm_pipe_generation(const cm_pipe *p);

/* Traffic on the hop coordinator -> stage 1 (FORWARD frames only) and the
 * number of hidden-state rows carried. */
void cm_pipe_hop_stats(const cm_pipe *p, uint64_t *bytes, uint64_t *frames, uint64_t *rows);

/* ---- this machine's stage, whatever the plan's shape ----
 * Stage 0 runs here: layers [0, local_last) on the slice cm_pipe_tp_slice of
 * a group of cm_pipe_tp_size members (1: whole layers, alone). Who samples
 * is the one question the engine asks about the plan's shape:
 * cm_pipe_samples_here is true when the plan is one stage (one group of
 * every machine): this machine computes every layer and samples itself;
 * false when its output goes to stage 1 (cm_pipe_send) and the last stage
 * samples (cm_pipe_recv_token). The answer is fixed for the pipe's life (a
 * re-plan keeps the shape's kind: cm_coord_replan), so any thread may ask. */
bool cm_pipe_samples_here(const cm_pipe *p);
int cm_pipe_tp_size(const cm_pipe *p);
cm_slice cm_pipe_tp_slice(const cm_pipe *p);
/* This member's all-reduce traffic: element bytes and whole frames sent,
 * operations, and token rows sent to the members. */
void cm_pipe_tp_stats(const cm_pipe *p, uint64_t *data_sent, uint64_t *wire_sent, uint64_t *ops, uint64_t *rows);
/* Stage 0's one contract, whatever the plan's shape: call before this
 * machine's forward pass over n rows (token ids, positions, sequence slots),
 * under the caller's lock that orders the rows. The other members of its
 * group get the token ids (they embed them and meet us in the
 * all-reduces), and a->allreduce / allreduce_user become the group's
 * all-reduce, or NULL when this machine is alone in its stage; in an expert
 * group, a->experts / expert_gather become this machine's experts and the
 * group's exchange of expert rows. The slice is cm_pipe_tp_slice's. A failure fails the pipe.
 * With a->out_logits set (logits: the batch's row flags, NULL = the last row)
 * in one tensor-parallel group, the head is split: a->head_v0/v1 become this
 * machine's vocabulary rows and a->head_gather the gather of the others'
 * (CM_ASSIGN_F_HEAD; CUMULO_TP_HEAD_SPLIT=0: the whole head here). */
int cm_pipe_stage0(cm_pipe *p, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                   const int8_t *logits, cm_forward_args *a, char *err, size_t errlen);
/* Top logprobs the last stage sent with the slot's latest token (n <= max). */
int cm_pipe_last_top(cm_pipe *p, int slot, int32_t *ids, float *logprobs, int max);

/* The machines of the plan (cluster/member.h), for the dashboard: fills up
 * to max entries, stage order; returns how many there are. Thread-safe
 * against a re-plan. */
int cm_pipe_members(const cm_pipe *p, cm_cluster_member *out, int max);

/* Mixture of experts (coord_ep.c). The engine hands the routing counts of
 * its context, layer il's n counts (cm_ctx_expert_hits_layer: every
 * assignment, cumulative; every layer, those it does not compute are 0)
 * while idle, before cm_pipe_maintain, which adds the later stages'
 * EXPERT_LOAD reports and re-plans the expert groups' replicas when the
 * counts call for it (see cm_plan_request.expert_warmup). Same thread as
 * cm_pipe_maintain. */
#define CM_PIPE_EXPERT_WARMUP 64
void cm_pipe_expert_observe(cm_pipe *p, int il, const uint64_t *hits, int n);
/* Add the counts the later stages reported for layer il (< 0: every layer
 * summed) to hits[0, n) (n must be the model's experts); any thread. */
void cm_pipe_expert_reported(const cm_pipe *p, int il, uint64_t *hits, int n);
/* What the routing counts are and did; any thread. */
void cm_pipe_expert_info(const cm_pipe *p, cm_cluster_experts *out);

#endif
