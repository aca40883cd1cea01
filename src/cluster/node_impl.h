/*
 * node_impl.h: the state of `cumulo node` shared by node.c (serving the
 * connections, running the stage) and node_stage.c (loading a stage for an
 * ASSIGN). Private to those two files.
 */
#ifndef CM_NODE_IMPL_H
#define CM_NODE_IMPL_H

#include "cluster/cluster_int.h"
#include "cluster/collective.h"
#include "cluster/ep_gather.h"
#include "cluster/node_guard.h"

#include <pthread.h>
#include <stdatomic.h>

struct node;

/* One assigned stage: the model part this node runs for one epoch. */
typedef struct stage {
    cm_msg_assign as;
    cm_gguf g;
    cm_model m;
    cm_pool *pool;
    cm_ctx *ctx;
    struct cm_lora *lora;   /* this stage's parts of the coordinator's LoRA adapters (CM_ASSIGN_F_LORA), or NULL */
    float *lora_sc;         /* [n_seq][cm_lora_count]: the sequences' per-request scales (SEQ_LORA), or NULL */
    const float **lora_row; /* [n_seq]: lora_sc's row of a sequence that has them, NULL: the loaded scales */
    cm_kv *kv;              /* [n_seq] */
    cm_kv **kvp;            /* [n_seq] pointers for cm_forward */
    cm_sampler **smp;       /* [n_seq], last stage only */
    int n_seq;
    float *in, *out; /* [CM_BATCH_MAX][n_embd] */
    float *logits;   /* [CM_BATCH_MAX][n_vocab], last stage only */
    int32_t pos[CM_BATCH_MAX], seq[CM_BATCH_MAX], tok[CM_BATCH_MAX];
    int8_t want[CM_BATCH_MAX];
    uint8_t want_u8[CM_BATCH_MAX];
    cm_conn *next;                       /* to the next stage (owned), NULL for the last */
    cm_conn *coord;                      /* the coordinator's connection (not owned) */
    pthread_mutex_t *csend_mu;           /* node.csend_mu: sends on coord */
    cm_slice slice;                      /* this member's part of every layer (full without TP) */
    cm_expert_slice experts;             /* an expert group's member: its experts (zeroed: every expert) */
    uint32_t *holders;                   /* replicated experts (ASSIGN's REPLICAS): [n_expert], bit r = rank r
                                            holds it; NULL: the bounds alone */
    cm_ep_pack pack;                     /* the exchange's scratch with replicas (ep_gather.c) */
    cm_conn *tp[CM_COLL_MAX_MEMBERS];    /* TP group: connection to each other rank (owned) */
    cm_conn *relay[CM_COLL_MAX_MEMBERS]; /* hybrid, rank 0 of a later group: data connection to each member (owned) */
    cm_coll *coll;                       /* TP group's all-reduce, NULL without TP */
    uint64_t rows;                       /* token rows computed */
    uint64_t t0_ns, fwd_ns, fwd1_ns, n_fwd1; /* CUMULO_TP_TRACE: assigned at; time in FORWARDs, in 1-row ones */
    uint64_t fwd1_cpu_ns;                    /* CUMULO_TP_TRACE: this thread's CPU time in 1-row FORWARDs */
    uint64_t fwd1_end_ns, gap1_ns, n_gap1;   /* CUMULO_TP_TRACE: end of the last 1-row FORWARD (0: other); time
                                              * from there to the next 1-row one, received (rank 0's turn) */
    struct cm_gpu_model *gm;                 /* its first layers on the node's GPU (node_gpu.c), or NULL */
    struct cm_node_train *train;             /* LoRA training of this stage's layers (node_train.c), NULL: none */
    /* Training (node_train.c): FWDs go on to next outside n->mu, under fsend_mu; the BWDs
     * the next stage sends back on next are read by the thread brx (started at the first
     * SETUP, joined by cm_node_stage_free, which is never called with n->mu held). */
    /* EXPERT_LOAD (node_ep.c, rank 0 of a later stage): counts of its layers already
     * reported, cumulative [layers][n_expert], the next report's deltas, when the last went */
    uint64_t *ep_sent;
    uint32_t *ep_delta;
    uint64_t ep_report_ns;
    bool ep_failed;
    struct node *node;
    pthread_mutex_t fsend_mu;
    pthread_t brx;
    bool brx_on;
    atomic_bool brx_stop;
} stage;

typedef struct node {
    const cm_node_opts *o;
    cm_net_cfg cfg;
    cm_msg_hello hello;
    atomic_int *stop;
    pthread_mutex_t mu;       /* stage pointer, compute, sends on next */
    pthread_mutex_t csend_mu; /* sends on connections from a coordinator (never held while computing) */
    stage *st;
    _Atomic uint64_t epoch; /* st's epoch (0: none), for heartbeats */
    cm_node_hb hb;          /* the heartbeat thread (node_guard.c) */
    cm_node_limits lim;     /* connection limits (node_guard.c) */
    cm_node_lease lease;    /* the coordinator this node serves (node_lease.c) */
    struct conn_job *jobs;  /* connection threads, running or ended and not yet joined (accept loop only) */
    char cache_dir[512];
    cm_conn *tp_in[CM_COLL_MAX_MEMBERS];       /* greeted TP connections not yet taken by a stage (under mu) */
    uint64_t tp_in_epoch[CM_COLL_MAX_MEMBERS]; /* the plan epoch each was made for */
    struct cm_gpu *gpu; /* --gpu: the device every stage's first layers run on (node_gpu.c), or NULL */
    /* Training: the connection the latest FWD came on, where BWDs go back (a previous
     * stage's link, or the coordinator's data link), and the lock of those sends (taken
     * after mu, never the other way; held by the connection's thread before it closes). */
    pthread_mutex_t bsend_mu;
    cm_conn *bwd_to;
} node;

/* Free a stage (closing its links; its group traffic goes to stderr in one
 * line). NULL: no-op. (node_stage.c) */
void cm_node_stage_free(stage *s);
/* Tell the coordinator a stage failed, as ERROR (it fails the waiting
 * sequences); s->csend_mu serialises it with the stage's other sends. (node.c) */
void cm_node_report_error(stage *s, int code, const char *text);
/* READY for epoch on c (under n->csend_mu): status 0, or the CM_E* and text
 * of a refusal. (node_stage.c) */
int cm_node_send_ready(node *n, cm_conn *c, uint64_t epoch, int status, uint64_t missing, const char *text);
/* Serve an ASSIGN from the coordinator on c: load the stage (retrying at
 * once with a newer ASSIGN that arrived meanwhile), make it n->st, answer
 * READY. (node_stage.c) */
void cm_node_on_assign(node *n, cm_conn *c, const cm_msg_assign *a);

/* Rank 0 of a later stage of a model with experts: send the coordinator
 * EXPERT_LOAD with the assignments its layers routed since the last report,
 * when there are any and CM_PIPE_HB_MS have passed since (n->mu held; sends
 * under s->csend_mu). Anything else: no-op. (node_ep.c) */
void cm_node_expert_report(stage *s);

/* node_gpu.c (issue 16): open the device --gpu names, measure it and add it
 * to n->hello (anything that stops it: one warning line, the CPU); a
 * stage's first layers on it (after its context and caches exist: a
 * warning and the CPU when they cannot be); and the releases. */
void cm_node_gpu_open(node *n);
void cm_node_gpu_close(node *n);
void cm_node_gpu_stage(node *n, stage *s);
void cm_node_gpu_stage_free(stage *s);
/* After a failed FORWARD: a node whose GPU was lost leaves (exits), so its
 * coordinator re-plans without it as it does for any lost node. */
void cm_node_gpu_after_error(node *n);
/* TRAIN on connection c (is_coord: from the coordinator), pipeline-parallel
 * LoRA training (node_train.c). Takes n->mu itself (never held by the
 * caller); a failure is logged and reported to the coordinator as ERROR. */
void cm_node_on_train(node *n, cm_conn *c, bool is_coord, const cm_msg_train *q);
/* Stop a stage's BWD reader (joins it; n->mu not held) and free its training. */
void cm_node_train_stop(stage *s);
void cm_node_train_free(struct cm_node_train *t); /* NULL: no-op */

#endif
