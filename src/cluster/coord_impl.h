/*
 * coord_impl.h: the coordinator's private state, shared by coord.c (connect,
 * the opening plan, receiver threads), coord_plan.c (the one plan change),
 * coord_data.c (the data path), coord_recover.c (when to re-plan),
 * coord_join.c (nodes found by mDNS later) and coord_links.c (node to node
 * links). Nothing outside these files may include it.
 */
#ifndef CM_COORD_IMPL_H
#define CM_COORD_IMPL_H

#include "cluster/cluster_int.h"
#include "cluster/collective.h"
#include "cluster/ep_gather.h"
#include "cluster/weights.h"

#include "os/os.h"
#include "sched/plan.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct remote {
    char addr[80];
    cm_conn *ctl;
    cm_msg_hello hello;
    double rtt, bw;
    pthread_t rx;
    bool rx_started;
    bool ready;
    atomic_bool loading;       /* ASSIGN sent, READY not yet: loading may outlast the heartbeat bound, and
                              * the node's control thread expects only WEIGHTS_CHUNKs: no heartbeats */
    atomic_bool lost;          /* declared lost: its rx thread has ended */
    char lost_why[200];        /* rx thread, before lost is set: how it was lost (coord_recover.c says it) */
    bool seen_back;            /* coord_recover.c: lost, answered one rejoin check */
    uint64_t refused_until_ns; /* coord_recover.c: not redialled before (it refused its part) */
    bool held_logged;          /* coord_recover.c: said once that another coordinator holds it (issue 19) */
    _Atomic uint64_t last_rx_ns;
    uint64_t last_hb_ns; /* rx thread only */
    int ready_status;
    char ready_text[CM_MSG_TEXT_MAX + 1];
    uint64_t ready_epoch; /* rx thread only: the epoch of its last READY (0: none) */
    cm_pipe *p;
    int n_links; /* node to node links this node measured (LINKS), by peer address */
    struct {
        char addr[80];
        int status;
        double rtt, bw;
    } links[CM_PLAN_MAX_NODES];
    /* coord_links.c, re-measuring while the receiver thread runs: the LINKS
     * answer awaited (id), handed over under p->mu; the node's control
     * thread is busy measuring until quiet_until_ns, so its silence until
     * then is not a loss. */
    uint64_t links_want;
    bool links_got;
    cm_msg_links links_ans;
    _Atomic uint64_t quiet_until_ns;
    atomic_bool released;   /* coord_recover.c: left out of the plan; its rx thread ends without failing the pipe */
    cm_msg_heartbeat stats; /* the node's latest heartbeat with telemetry (issue 19), under p->info_mu */
    uint64_t stats_ns;      /* when it came (0: none yet), under p->info_mu */
} remote;

typedef struct slot {
    bool used;
    uint64_t asked, got; /* samples requested / tokens received */
    int32_t token;
    float logprob;
    int n_top; /* top logprobs of the latest TOKEN */
    int32_t top_id[CM_MSG_MAX_TOP];
    float top_lp[CM_MSG_MAX_TOP];
    /* pipe_output.c: OUTPUT rows awaited (cm_pipe_output_expect), copied
     * in by the receiver thread: positions [out_pos0, out_pos0 + out_rows) */
    float *out_buf;
    int out_kind, out_pos0, out_rows, out_got;
} slot;

struct cm_pipe {
    const cm_gguf *g;
    const cm_model *m;
    char model_path[512];
    uint8_t sha[32];
    cm_net_cfg cfg;
    cm_msg_hello hello;
    int n_remote;
    remote r[CM_PLAN_MAX_NODES];
    cm_conn *data; /* to stage 1 */
    pthread_mutex_t send_mu;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    slot *slots;
    int n_seq, n_ctx, max_batch, timeout_ms;
    _Atomic uint64_t epoch;
    uint64_t next_req;
    /* CUMULO_TP_TRACE, a split head: end of the last one-row gather (0: none
     * since), and the time from there to the next one-row FORWARD sent */
    uint64_t tr_gather_end_ns, tr_turn_ns, tr_turns;
    int lost_ms;     /* the loss bound (env CUMULO_LOST_MS) */
    int rejoin_ms;   /* cm_pipe_maintain acts at most this often (env CUMULO_REJOIN_MS) */
    bool no_recover; /* env CUMULO_TEST_NO_RECOVER: recovery refused (a test shows it matters) */
    int generation;  /* bumped by every plan applied after the first */
    int fatal;
    char fatal_text[600];
    atomic_int closing;
    uint64_t rows_sent;
    /* The plan running now: the only record of who runs what (stage 0's
     * first member is this machine; node k >= 1 is r[k - 1]). Written only
     * by cm_coord_apply_plan; n_stages 0 until the first plan is applied. */
    cm_plan plan;
    int pipe_groups;          /* cm_plan_pipe_groups of plan over its nodes' hosts (cm_coord_apply_plan) */
    enum cm_parallel ask;     /* the shape asked for at the start: re-plans ask the planner for it again */
    bool samples_here;        /* the plan is one stage: this machine samples (set at open; re-plans keep it) */
    bool tp_compress;         /* Q8_0 all-reduce transfers in every group */
    bool take;                /* the opening plan's ASSIGNs carry CM_ASSIGN_F_TAKE (--take) */
    int kv_type_k, kv_type_v; /* the nodes' KV cache types (cm_pipe_opts) */
    bool kv_rows;
    cm_conn *tp_conn[CM_COLL_MAX_MEMBERS]; /* to each node's rank (owned) */
    cm_coll *coll;
    int32_t seqbuf[CM_MSG_MAX_TOKENS > 4096 ? 4096 : CM_MSG_MAX_TOKENS];
    uint8_t wantbuf[4096];
    cm_pipe_log_fn log;
    void *log_ctx;
    char plan_text[8192];
    /* The dashboard's copy of the plan, published by cm_coord_apply_plan
     * while an HTTP thread may read it (cm_pipe_members), so both hold
     * info_mu, a lock of its own that the data path never takes. */
    pthread_mutex_t info_mu;
    int n_members;
    cm_cluster_member members[CM_PLAN_MAX_NODES * 2];
    uint64_t next_rejoin_ns; /* coord_recover.c: next redial of lost nodes (cm_pipe_maintain) */
    bool gave_up;            /* coord_recover.c: recovery failed; returning nodes retry it, or the rejoin interval */
    uint64_t gave_up_ns;     /* when it gave up */
    char cause[300];         /* coord_recover.c: the failure that started it */
    uint64_t next_link_check_ns; /* coord_recover.c: next idle re-measure of links marked down */
    bool links_suspect;          /* coord_recover.c: a re-plan failed: re-measure before the next one */
    bool from_mdns;              /* --nodes auto: coord_join.c keeps browsing for new nodes */
    bool join_tried;             /* coord_join.c: browsing started (or failed) */
    struct cm_join *join;        /* coord_join.c: the browser and the addresses it found (owned) */
    struct cm_train_pipe *train; /* coord_train.c: the training that awaits TRAIN answers (not owned), under mu */
    /* Hot-expert replication (--expert-load): the routing counts every plan of an expert group is
     * asked with (owned; NULL: uniform, no replicas); stage 0's holders per expert when its group
     * has replicas (cm_pipe_stage0 fills them from p->plan) and the exchange's scratch. */
    uint64_t *expert_load;
    uint32_t *ep_holders;
    cm_ep_pack ep_pack;
    /* coord_ep.c: the routing this machine counts while serving (cm_pipe_expert_observe, and
     * cm_coord_ep_rebalance on the same idle thread): its latest counts and those at the last
     * look; new assignments per expert between looks (< 0: never, the counts were given). */
    uint64_t *ep_now, *ep_seen;
    int ep_warmup;
    /* Per layer and expert ([n_layer][n_expert], layer-major): this machine's counts (its own
     * context, maintain thread), the later stages' EXPERT_LOAD reports summed (under info_mu),
     * and the measured load by layer every plan is asked with once measured (owned; NULL). */
    uint64_t *ep_local, *ep_remote, *expert_load_layers;
    _Atomic uint64_t ep_reports, ep_refused; /* EXPERT_LOADs taken / refused */
    uint64_t ep_refused_log_ns;              /* the last refusal logged (rx threads, under info_mu) */
    atomic_int ep_load_src;                  /* CM_EXPERT_LOAD_*: what p->expert_load holds */
    atomic_int ep_replans;                   /* plan changes the measured counts made */
    _Atomic uint64_t ep_sent, ep_rows;       /* this machine's expert exchange, every plan: element bytes sent, rows */
    /* coord_lora.c: the LoRA adapters (not owned; NULL: none) and each stage's parts of them, one
     * content-addressed object per layer range a plan used (appended by the plan change, read by the
     * receiver threads under mu, freed only by cm_pipe_close: a fetch in flight never sees them go). */
    const struct cm_lora *lora;
    struct cm_lora_obj *lora_obj;
    int n_lora_obj;
};

enum { CM_EXPERT_LOAD_UNIFORM, CM_EXPERT_LOAD_GIVEN, CM_EXPERT_LOAD_MEASURED };

/* Hot-expert replication (coord_ep.c). Keep a copy of the routing counts
 * (one per expert of the model) that every plan of the pipe is asked with. */
int cm_coord_expert_load(cm_pipe *p, const uint64_t *load, int n, char *err, size_t errlen);
/* Stage 0's holders per expert (bit k: member k) when the running plan
 * replicates experts in this machine's group, else NULL. Data path only. */
const uint32_t *cm_coord_ep_holders(cm_pipe *p);
/* The routing settings of the user's request (coord.c, at open): given counts
 * or the warm-up between looks at the measured ones. */
void cm_coord_ep_init(cm_pipe *p, const cm_plan_request *q);
/* Idle (cm_pipe_maintain, nothing else changed): once the measured routing
 * has grown by the warm-up since the last look, hand the counts (halved at
 * each look, plus the new ones) to the re-plan question and, when the answer
 * moves experts or replicas and is predicted faster, apply it through the
 * one plan change. 1 when the plan changed, 0 when not, or an error (the
 * pipe then recovers or stays failed, as cm_pipe_maintain). */
int cm_coord_ep_rebalance(cm_pipe *p, char *err, size_t errlen);
/* An EXPERT_LOAD from node r (its receiver thread, no lock held): taken
 * into p->ep_remote when r is rank 0 of a later stage of the running plan
 * and the counts name that stage's layers and the model's experts; else
 * refused (counted, logged at most once a second). */
void cm_coord_on_expert_load(cm_pipe *p, remote *r, const cm_msg_expert_load *q);
/* The dashboard's copy of member k of stage st's experts (publish_members). */
void cm_coord_member_experts(const cm_plan_stage *st, int k, cm_cluster_member *o);
/* " replicas: rank 1 holds 0, ..." for the plan's stage st ("" without). */
void cm_coord_replicas_text(const cm_plan_stage *st, char *out, size_t n);
/* ASSIGN's REPLICAS of stage st, for every rank (nothing without replicas). */
void cm_coord_fill_replicas(const cm_plan_stage *st, cm_msg_assign *a);

/* A line into the caller's log callback (the plan, failures, re-plans). */
void cm_coord_log(cm_pipe *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Record the first failure and wake every waiter. */
void cm_coord_fatal(cm_pipe *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* One turn of a wait for the last stage's token or rows (p->mu held):
 * the pipe's failure, or past deadline the pipe failed with "no WHAT from
 * the last stage...", or 0 after up to 50 ms (look again). coord_data.c. */
int cm_coord_wait_data(cm_pipe *p, uint64_t deadline, const char *what, char *err, size_t errlen);
/* Up to 50 ms of waiting for a broadcast on p->cv (p->mu held): the tick
 * of every coordinator wait that also watches a deadline. coord_data.c. */
void cm_coord_wait_tick(cm_pipe *p);
/* Start the receiver thread of every node that has none. */
void cm_coord_start_rx(cm_pipe *p);
/* Leave the running plan's links: the data connection to stage 1 (which
 * drops what it has of the old plan) and this machine's all-reduce mesh
 * (closing it wakes members blocked in an all-reduce with us, so that they
 * can answer). coord_plan.c. */
void cm_coord_leave_plan(cm_pipe *p);
/* THE plan change, one transaction for opening, recovering, maintaining
 * and rejoining alike (coord_plan.c): a new epoch; the old data and
 * all-reduce links dropped; every member but this machine sent its ASSIGN
 * (one builder); this machine's group mesh dialled; READY awaited from every
 * member (one deadline: 600 s when opening, 120 s later); stage 0's
 * all-reduce made and stage 1 dialled; then the plan becomes p->plan, the
 * dashboard's copy and the plan text are published and, on a re-plan, the
 * live nodes the plan does not use are released and the generation is
 * bumped. plan is in the pipe's node indices (0 this machine, k r[k-1]);
 * stage 0 must start on this machine and, once a plan ran, keep its layers
 * [0, local_last). A failure after the epoch changed leaves the pipe failed
 * with the reason ("re-plan: ..."), never half-switched. why names the
 * cause in the log ("recovery", "nodes back or new"). */
int cm_coord_apply_plan(cm_pipe *p, const cm_plan *plan, const char *why, char *err, size_t errlen);
/* What a re-plan asks the planner (coord_plan.c): the shape asked at the
 * start (p->ask) on this machine and the live nodes (the running plan's
 * nodes first, in its order), this machine keeping its layers [0,
 * local_last) unless the plan is one group. A hybrid ask that has no hybrid
 * answer (too few nodes left) takes the pipeline. out is in the pipe's node
 * indices; *cur_score (may be NULL) is the running plan's predicted speed
 * on the same view, *score the answer's. CM_EAGAIN when nothing fits. */
int cm_coord_replan(cm_pipe *p, cm_plan *out, double *score, double *cur_score, char *err, size_t errlen);
/* The opening plan tried failed with rc/err (coord_recover.c): when a node
 * was lost meanwhile (killed, silent, closed while it loaded its part), it
 * is left out, said in a line, and the failure is recovered like one after
 * the cluster was ready (tried becomes the running record, cm_coord_replan
 * on the survivors, cm_coord_apply_plan): 0 with the pipe running. Else an
 * error: rc when no node was lost, or one saying that the rest cannot hold
 * the model and what to do. */
int cm_coord_open_recover(cm_pipe *p, const cm_plan *tried, int rc, char *err, size_t errlen);
/* What the measured routing asks (coord_plan.c): the running plan with the
 * hot-expert replicas of its expert groups placed again under the pipe's
 * counts (cm_plan_replace_replicas: stages, members and expert ranges kept;
 * a count of routing says nothing about where stages belong), *score its
 * predicted speed and *cur_score the running plan's under the same counts,
 * on the same view. */
int cm_coord_replan_replicas(cm_pipe *p, cm_plan *out, double *score, double *cur_score, char *err, size_t errlen);
/* Layers [0, local_last) that this machine's stage holds (0 before a plan). */
static inline int cm_coord_local_last(const cm_pipe *p) { return p->plan.n_stages ? p->plan.stages[0].last_layer : 0; }
/* The node running member k of stage s; NULL for this machine. */
static inline remote *cm_coord_member(cm_pipe *p, int s, int k) {
    int nd = p->plan.stages[s].members[k].node;
    return nd ? &p->r[nd - 1] : NULL;
}
/* Nodes used by a plan (members of every stage). */
static inline int cm_coord_plan_members(const cm_plan *pl) {
    int n = 0;
    for (int s = 0; s < pl->n_stages; s++) n += pl->stages[s].n_members;
    return n;
}
/* The silence allowed to a node loading its part (no READY yet): 5 x the
 * loss bound, at least CM_PIPE_LOAD_SILENT_MS (its own heartbeats keep
 * coming while it loads). */
static inline uint64_t cm_coord_load_silent_ms(const cm_pipe *p) {
    return CM_MAX(5ull * (uint64_t)p->lost_ms, (uint64_t)CM_PIPE_LOAD_SILENT_MS);
}
static inline bool cm_coord_alive(const remote *r) { return r->ctl && r->rx_started && !atomic_load(&r->lost); }
/* Send a sequence message down the data path (every TP member, or stage 1);
 * caller holds send_mu. A failure marks the pipe failed. */
int cm_coord_send_data(cm_pipe *p, const cm_msg *m, char *err, size_t errlen);
/* The planner's view of this machine (node 0) and every known node (node
 * i + 1 is r[i], lost or not) (coord.c). */
void cm_coord_make_cluster(cm_pipe *p, cm_plan_cluster *c);
/* Whether the link from plan node i to plan node j was measured (rtt, bw
 * set either way: an estimate when not). */
bool cm_coord_node_link(const cm_pipe *p, int i, int j, double *rtt, double *bw);
/* Ask every node to measure its links to the other nodes (coord_links.c;
 * before the receiver threads start). Never fails: a link not measured
 * falls back to an estimate, and the plan text says which. */
void cm_coord_measure_links(cm_pipe *p);
/* The link from r[a] to r[b] as r[a] measured it: 1 measured (rtt, bw set),
 * 0 not measured, < 0 r[a] could not reach r[b] (the CM_E* code). */
int cm_coord_link(const cm_pipe *p, int a, int b, double *rtt, double *bw);
/* With the receiver threads running: re-measure the links between live
 * nodes (every pair, or only_down: the pairs marked unreachable) and record
 * them; a pair that cannot connect is marked unreachable both ways (the
 * planner never makes it adjacent: cm_plan_cluster.down), one that connects
 * again is cleared. Each node asked is busy for at most CM_LINKS_RECHECK_MS.
 * Returns how many pairs changed state (down <-> up). Never fails the pipe. */
int cm_coord_recheck_links(cm_pipe *p, bool only_down);
/* Whether some pair of live nodes is marked unreachable. */
bool cm_coord_any_link_down(const cm_pipe *p);
#define CM_LINKS_RECHECK_MS 1200
/* The links the planner used, as a matrix (appended to the plan text). */
void cm_coord_links_text(const cm_pipe *p, char *buf, size_t n);
/* Send a sequence message to the other members of this machine's group (on
 * their control connections); caller holds send_mu. */
int cm_coord_send_group0(cm_pipe *p, const cm_msg *m, char *err, size_t errlen);
/* pipe_output.c: an OUTPUT from the last stage (receiver thread, p->mu not held). */
void cm_coord_on_output(cm_pipe *p, const cm_msg_output *o);
/* coord_train.c: a TRAIN answer from node r (receiver thread, p->mu not held). */
void cm_coord_on_train(cm_pipe *p, remote *r, const cm_msg_train *q);

/* Nodes found by mDNS after the start (coord_join.c). Called by
 * cm_pipe_maintain (idle) with --nodes auto: starts browsing the first time,
 * then dials up to CM_JOIN_DIALS new addresses (handshake with the cluster
 * key, links measured) and adds those that answer as remotes (up to
 * CM_PLAN_MAX_NODES - 1 in all); returns how many were added. Addresses
 * that fail are logged once and tried again after CM_JOIN_RETRY_MS. */
#define CM_JOIN_TABLE 32     /* addresses found by mDNS waiting to be dialled or refused */
#define CM_JOIN_DIALS 4      /* dials per idle call */
#define CM_JOIN_DIAL_MS 1000 /* connect + handshake bound (and the links measurement's) */
#define CM_JOIN_RETRY_MS 30000
int cm_coord_join_poll(cm_pipe *p);
/* Stop browsing and free (cm_pipe_close). */
void cm_coord_join_stop(cm_pipe *p);

/* LoRA on a cluster (coord_lora.c). Before the ASSIGNs of plan pl: make
 * the parts object of every member (its layers, and its slice in a group)
 * that has none yet (a no-op without adapters). Fill a's CM_ASSIGN_F_LORA
 * fields for member k of stage s of pl. Answer a WEIGHTS_REQ from node r
 * when it names a parts object: true (sent, or failed with err), false when
 * it is not one. Free the objects (cm_pipe_close). */
int cm_coord_lora_prepare(cm_pipe *p, const cm_plan *pl, char *err, size_t errlen);
void cm_coord_lora_fill(cm_pipe *p, const cm_plan *pl, int s, int k, cm_msg_assign *a);
bool cm_coord_lora_serve(cm_pipe *p, remote *r, const cm_msg_weights_req *rq, int *rc, char *err, size_t errlen);
void cm_coord_lora_free(cm_pipe *p);

/* One tensor-parallel group that splits the output head (CM_ASSIGN_F_HEAD):
 * every member computes its vocabulary rows, rank 0 gathers (coord_data.c). */
bool cm_pipe_plan_head_split(const cm_plan *plan);

#endif
