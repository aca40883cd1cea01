/*
 * plan: decide which node computes what — a PURE function from (model shape,
 * cluster description, options) to a plan. It touches no socket, file or
 * clock, so every placement policy is table-tested with imaginary clusters.
 *
 * A plan is a pipeline of stages; each stage is a tensor-parallel group of one
 * or more nodes that all hold a slice of every layer in the stage's range:
 * KV heads [h0,h1) (query heads follow their KV head) and FFN rows [f0,f1).
 *   pipeline only: every group has one member;
 *   tensor only:   one stage holding all layers;
 *   hybrid:        several groups, each over nodes with fast links.
 *
 * Cost model (decode is memory-bound, prefill compute-bound):
 *   layer time on node i with share s   = max(s*layer_bytes/mem_bw_i, s*2*layer_params/flops_i)
 *     (a mixture of experts reads the dense part and used/n_experts of the
 *     experts; an expert-group member the expected used*held/n_experts of them)
 *   expert exchange (expert group, k>1) = max over pairs (rtt/2 + used*held_i/n_experts*dim*4/bw)
 *                                         + overhead, once per layer (replacing both all-reduces)
 *   tensor-parallel layer time          = max over members + 2 all-reduces
 *   all-reduce (direct exchange, k>1)   = max over pairs (rtt/2 + (k-1)*dim*4/bw) + overhead
 *   pipeline hop                        = rtt/2 + n_tok*dim*4/bw + overhead
 *   one stream:  1 / (sum of stage times + hops + token return)
 *   n streams:   min(n / cycle, 1 / slowest stage (with its outgoing hop))
 * Layers are split to minimise the slowest stage's time (the pipeline's
 * throughput bound) subject to memory, so a slower node or one behind a slower
 * link gets fewer layers; within a group, slices follow each member's speed.
 * Shared hosts (issue 19): the k members of a plan on one host (the same
 * cm_plan_node.host) each get 1/k of its flops and memory bandwidth, so
 * three nodes on one machine are not predicted three machines' speed.
 * NEEDSWORK: memory is still counted per node (each offers what it found
 * free); the planner does not yet cap a host's members by the host's memory.
 */
#ifndef CM_PLAN_H
#define CM_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_PLAN_MAX_NODES 16
#define CM_PLAN_MAX_LAYERS 512

/* EP: expert parallelism, one group of every machine (as TP) whose members
 * hold every layer's attention whole and a share of its experts. A model
 * with experts never gets tensor-parallel FFN rows: in any mode, a group of
 * more than one member over a mixture-of-experts model is an expert group. */
enum cm_parallel {
    CM_PARALLEL_AUTO,
    CM_PARALLEL_PP,
    CM_PARALLEL_TP,
    CM_PARALLEL_HYBRID,
    CM_PARALLEL_EP,
    CM_PARALLEL_COUNT
};
const char *cm_parallel_name(enum cm_parallel p);
int cm_parallel_from_name(const char *s); /* -1 if unknown */

/* A node as the planner sees it (measured or declared). */
typedef struct cm_plan_node {
    char name[64];
    uint64_t mem_bytes; /* memory offered for weights + KV + scratch */
    double mem_bw;      /* bytes/s at which it streams weights */
    double flops;       /* FLOP/s for matrix work (prefill) */
    char host[64];      /* host id ("" unknown: a host of its own); members with the same one share
                           its cores and memory bandwidth */
    /* A GPU (issue 16; gpu_mem_bytes 0: none). A pipeline stage's first
     * layers run on it at these speeds, as many as its memory holds (their
     * weights and an F32 KV cache, less reserve_bytes) and at most
     * gpu_layers (0: no limit); a dense model only, and not in a
     * tensor-parallel group (the device takes whole layers). mem_bytes
     * above still holds every layer: the CPU keeps the weights and caches. */
    uint64_t gpu_mem_bytes;
    double gpu_mem_bw, gpu_flops;
    int gpu_layers;
} cm_plan_node;

typedef struct cm_plan_cluster {
    int n_nodes; /* node 0 is the coordinator: it holds the first stage */
    cm_plan_node nodes[CM_PLAN_MAX_NODES];
    double rtt_s[CM_PLAN_MAX_NODES][CM_PLAN_MAX_NODES]; /* round trip, seconds */
    double bw[CM_PLAN_MAX_NODES][CM_PLAN_MAX_NODES];    /* bytes/s one way */
    /* A link known to be broken (a failed measurement, a cut seen when a
     * re-plan re-measured it), either direction: no plan puts the two nodes
     * in adjacent pipeline stages (stage s's first member -> stage s+1's) or
     * in one tensor-parallel group. Pipeline plans leave a node out rather
     * than use it; zero (the default) is a usable link. */
    bool down[CM_PLAN_MAX_NODES][CM_PLAN_MAX_NODES];
} cm_plan_cluster;

/* The model's shape: what each layer costs. */
typedef struct cm_plan_model {
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn, n_vocab;
    uint64_t layer_bytes[CM_PLAN_MAX_LAYERS]; /* weight bytes of block i */
    uint64_t layer_params[CM_PLAN_MAX_LAYERS];
    uint64_t embd_bytes; /* token embedding: held by the first stage */
    uint64_t head_bytes; /* output norm + output head: held by the last stage
                            (for tied embeddings, the embedding's bytes again) */
    uint64_t head_params;
    int ffn_granule;  /* FFN slice boundaries are multiples of this (ffn_down block size) */
    int head_granule; /* KV-head slice boundaries are multiples of this, so that the
                            attn_output columns of a slice start on a block boundary
                            (cm_slice_check); 0 or 1: any head */
    /* Mixture of experts (0 experts: dense). layer_expert_bytes/params: the
     * stacked experts' share of layer_bytes/params (all n_experts of them);
     * one token reads n_experts_used / n_experts of it. */
    int n_experts, n_experts_used;
    uint64_t layer_expert_bytes[CM_PLAN_MAX_LAYERS];
    uint64_t layer_expert_params[CM_PLAN_MAX_LAYERS];
    /* deepseek2 (MLA): the "KV heads" a slice splits are the query heads,
     * and every member caches the whole latent (2 x head_dim per token and
     * layer), whatever its heads; --parallel tp splits the heads and dense
     * FFN rows and places the experts as an expert group (ep). */
    bool kv_shared;
} cm_plan_model;

typedef struct cm_plan_opts {
    int ctx;                        /* KV length per sequence */
    int n_seq;                      /* concurrent sequences (KV is sized for all of them) */
    int kv_elem_bytes;              /* 4 (f32) or 2 (f16) */
    int kv_k32_bytes, kv_v32_bytes; /* bytes of 32 K / V elements (f32 128, f16 64, q8_0 34, q4_0 18);
                                       0: kv_elem_bytes for both */
    int prompt_tokens;              /* for the time-to-first-token prediction */
    enum cm_parallel mode;          /* AUTO picks the best predicted plan */
    uint64_t reserve_bytes;         /* per node: scratch, buffers, the OS */
    double exchange_overhead_s;     /* software cost of one network exchange */
    int first_stage_layers;         /* > 0: stage 0 holds exactly layers [0, this), its memory not checked
                               (a re-plan after a node is lost keeps the coordinator's layers: its
                               caches rely on them, and it already holds them) */
    bool reorder;                   /* PP: try every order of nodes 1..n-1 (node 0 stays first; up to
                              CM_PLAN_REORDER_MAX nodes) and keep the fastest predicted, so a
                              slow link, also between two nodes, is kept off the busy hops;
                              false: the cluster's order */
    /* Hot experts (replicas.c): expert_load[e] = (token, slot) assignments routed to expert e,
     * all MoE layers summed, measured in a warm-up (model.h's cm_ctx_expert_hits) or reported
     * by nodes. Given, an expert group's members are loaded by it (not uniformly) and the
     * busiest member's hottest experts get replicas on the least busy members that have
     * memory for them, while that lowers the slowest member's time. NULL: uniform, no replicas. */
    const uint64_t *expert_load;
    /* The same counts by layer (expert_load_layers[l * n_experts + e], layers [0, n_load_layers)),
     * when known (a running cluster counts every stage's layers): each expert group's replicas
     * are then chosen from the sum over its stage's layers, not over the whole model, so a
     * later stage's hot expert is replicated in that stage. NULL: expert_load for every group.
     * A member's replicas are one list for all the layers of its stage (ASSIGN carries no more):
     * an expert hot in one layer and cold in another gets the stage's summed verdict. */
    const uint64_t *expert_load_layers;
    int n_load_layers;
    int max_replicas; /* replicas per member (0: CM_PLAN_MAX_REPLICAS; < 0: none, shares only) */
} cm_plan_opts;
#define CM_PLAN_REORDER_MAX 8
#define CM_PLAN_MAX_REPLICAS 8

/* What a user asks of the planner beyond the defaults (cumulo run, serve and
 * bench: --parallel, --layers, --groups, --tp-weights), parsed once by the
 * CLI and checked there against itself; what depends on the model or the
 * machines found (a split's sum, more members than machines) is checked
 * where the plan is made. All zero: the planner's pipeline. */
typedef struct cm_plan_request {
    bool mode_set; /* mode given; else PP, or HYBRID when groups are given */
    enum cm_parallel mode;
    int n_split; /* layers per stage, this machine's stage first */
    int split[CM_PLAN_MAX_NODES];
    int n_groups; /* members per stage, this machine's group first */
    int groups[CM_PLAN_MAX_NODES];
    int n_weights; /* TP / hybrid: relative speed per machine, this one first */
    double weights[CM_PLAN_MAX_NODES];
    /* Expert groups: routed assignments per expert (--expert-load; cm_plan_opts.expert_load, so
     * hot experts get replicas); NULL: uniform. Not owned: the coordinator copies it at open. */
    const uint64_t *expert_load;
    int n_expert_load;
    /* Without expert_load: the coordinator counts the routing itself (cm_pipe_expert_observe)
     * and, while idle, re-plans the replicas when the counts call for it, once every
     * expert_warmup x n_expert new assignments (0: CM_PIPE_EXPERT_WARMUP; < 0: never,
     * --expert-load off). */
    int expert_warmup;
} cm_plan_request;

/* Defaults: ctx 2048, 1 sequence, f32 KV, 128-token prompt, AUTO, 256 MiB
 * reserve, 30 us per exchange, the cluster's order. */
void cm_plan_opts_default(cm_plan_opts *o);

typedef struct cm_plan_member {
    int node; /* index into the cluster */
    int kv_head_begin, kv_head_end;
    int ffn_begin, ffn_end;
    int expert_begin, expert_end; /* experts [begin, end) of every MoE layer of the stage (all of
                                     them unless the stage is an expert group; ranges follow the
                                     member order, so member k's rows come k-th in the exchange) */
    int n_replicas;               /* hot experts held beyond [expert_begin, expert_end), ascending;
                                 an expert's rows are split among all its holders (model.h's
                                 cm_expert_share) */
    int replicas[CM_PLAN_MAX_REPLICAS];
    double expert_share; /* with cm_plan_opts.expert_load: the fraction of the routed
                                 assignments it computes (0: held / n_experts, uniform) */
    bool embed, head;    /* holds the embedding / the output head */
    uint64_t weight_bytes, kv_bytes;
    double layer_s; /* its decode time for the stage's layers, seconds */
    int gpu_layers; /* the stage's first gpu_layers layers run on its GPU */
} cm_plan_member;

typedef struct cm_plan_stage {
    int first_layer, last_layer; /* [first, last) */
    int n_members;
    bool ep; /* an expert group: members hold attention whole and their experts */
    cm_plan_member members[CM_PLAN_MAX_NODES];
    double compute_s; /* decode: slowest member + all-reduces, per token */
    double hop_s;     /* sending one token's hidden state to the next stage (or the token back) */
} cm_plan_stage;

typedef struct cm_plan {
    enum cm_parallel mode; /* PP (all groups of one), TP (one group), HYBRID */
    int n_stages;
    cm_plan_stage stages[CM_PLAN_MAX_NODES];
    double tok_s;                 /* one stream, decode */
    double tok_s_aggregate;       /* opts.n_seq streams */
    double ttft_s;                /* prefill of opts.prompt_tokens + first token */
    uint64_t bytes_per_token_hop; /* pipeline: dim*4 */
    uint64_t bytes_per_token_tp;  /* tensor parallel: 2*layers*dim*4 per member */
    uint64_t bytes_per_token_ep;  /* expert groups: all-to-all element bytes of one token, summed over
                                     every member: sum over groups of (k-1)*used*moe layers*dim*4 */
    int kv_ctx, kv_n_seq;         /* the KV cache planned: positions per sequence, sequences */
    uint64_t kv_bytes_total;      /* KV bytes of every member, all sequences */
    char why[1024];
} cm_plan;

/* Make the best plan of the requested mode. Errors: CM_ENOSPACE when the
 * model fits nowhere (message says how much memory is missing), CM_EINVAL for
 * nonsense input. Pure: same input, same output. */
int cm_plan_make(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *out, char *err,
                 size_t errlen);

/* Build a plan for a given grouping: group_of[i] = pipeline position of node
 * i's group (0, 1, ... in order; -1 = node unused). */
int cm_plan_for_groups(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, const int *group_of,
                       cm_plan *out, char *err, size_t errlen);

/* Predict the timings of a filled plan (compute_s, hop_s, tok_s, ...). */
void cm_plan_predict(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p);

/* Shape of a model from hyper-parameters and an average bits-per-weight
 * (for simulating models we do not have on disk, e.g. a 70B Q4_K_M). */
void cm_plan_model_synthetic(cm_plan_model *m, int n_layers, int dim, int n_heads, int n_kv_heads, int ffn, int n_vocab,
                             double bits_per_weight);

/* A mixture-of-experts shape (Qwen3-MoE-like): attention as above, n_expert
 * experts of width ffn_exp per layer of which n_used run per token, a shared
 * expert of width ffn_shared (0: none), the router. */
void cm_plan_model_synthetic_moe(cm_plan_model *m, int n_layers, int dim, int n_heads, int n_kv_heads, int n_expert,
                                 int n_used, int ffn_exp, int ffn_shared, int n_vocab, double bits_per_weight);

/* Replication (replicas.c): the members of expert group st holding expert e
 * (bit k: member k, by its range or a replica); what cm_forward_args.expert_holders
 * takes, per expert. */
uint32_t cm_plan_expert_holders(const cm_plan_stage *st, int e);
/* Each expert group's members' expert_share (the fraction of the routed assignments they
 * compute) under routing counts load[n_experts], keeping the plan's ranges and replicas:
 * what cm_plan_predict reads, so that a running plan is priced under counts measured
 * after it was made. Stages without an expert group are left as they are. */
void cm_plan_expert_shares(cm_plan *p, const uint64_t *load, int n_experts);
/* The same with counts by layer (cm_plan_opts.expert_load_layers): each group priced under the
 * sum over its stage's layers (load, when the stage's layers have no counts; may be NULL). */
void cm_plan_expert_shares_by_layer(cm_plan *p, const uint64_t *load, const uint64_t *load_layers, int n_layers,
                                    int n_experts);

/* Only the routing changed (a running cluster's measured counts, o->expert_load and
 * o->expert_load_layers): place the hot-expert replicas of every expert group of the
 * filled plan p again (its stages, members and expert ranges stay) and predict it. */
void cm_plan_replace_replicas(const cm_plan_model *m, const cm_plan_cluster *c, const cm_plan_opts *o, cm_plan *p);

/* Human-readable plan (multi-line) into buf. */
void cm_plan_format(const cm_plan *p, const cm_plan_model *m, const cm_plan_cluster *c, char *buf, size_t n);

/* Micro-batches a served pipeline keeps in flight by default
 * (src/engine/batch_pipe.c): one per set of stages that share a host.
 * Stages on separate machines work on different micro-batches at once, so
 * one group per stage keeps each busy; stages on one host (a loopback test
 * cluster, two nodes on one machine) take turns on its cores, where another
 * group only splits the batch into smaller passes over the same weights.
 * Stages are joined when any of their members share a host id
 * (cm_plan_node.host; "" is a host of its own), directly or through another
 * stage; the result is the number of such sets, 1..p->n_stages (1 for no
 * stages). Pure. */
int cm_plan_pipe_groups(const cm_plan *p, const cm_plan_cluster *c);

#endif
