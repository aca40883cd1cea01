/*
 * coord_impl.h: the coordinator's private state, shared by coord.c (connect,
 * plan, assign, the data path), coord_tp.c (one tensor-parallel group) and
 * coord_recover.c (re-planning after a node is lost). Nothing outside these
 * three files may include it.
 */
#ifndef CM_COORD_IMPL_H
#define CM_COORD_IMPL_H

#include "cluster/cluster_int.h"
#include "cluster/collective.h"
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
    atomic_bool loading;     /* ASSIGN sent, READY not yet: loading may outlast the heartbeat bound, and
                              * the node's control thread expects only WEIGHTS_CHUNKs: no heartbeats */
    atomic_bool lost;        /* declared lost: its rx thread has ended */
    bool seen_back;          /* coord_recover.c: lost, answered one rejoin check */
    _Atomic uint64_t last_rx_ns;
    uint64_t last_hb_ns;     /* rx thread only */
    int ready_status;
    char ready_text[CM_MSG_TEXT_MAX + 1];
    cm_pipe *p;
    int n_links;             /* node to node links this node measured (LINKS), by peer address */
    struct { char addr[80]; int status; double rtt, bw; } links[CM_PLAN_MAX_NODES];
    /* coord_links.c, re-measuring while the receiver thread runs: the LINKS
     * answer awaited (id), handed over under p->mu; the node's control
     * thread is busy measuring until quiet_until_ns, so its silence until
     * then is not a loss. */
    uint64_t links_want;
    bool links_got;
    cm_msg_links links_ans;
    _Atomic uint64_t quiet_until_ns;
    atomic_bool released;    /* coord_recover.c: left out of the plan; its rx thread ends without failing the pipe */
} remote;

typedef struct slot {
    bool used;
    uint64_t asked, got; /* samples requested / tokens received */
    int32_t token;
    float logprob;
    int n_top;                       /* top logprobs of the latest TOKEN */
    int32_t top_id[CM_MSG_MAX_TOP];
    float top_lp[CM_MSG_MAX_TOP];
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
    int stage_remote[CM_PLAN_MAX_NODES]; /* stage s (>= 1) runs on r[stage_remote[s]] */
    int lost_ms;
    int generation; /* bumped by every successful cm_pipe_recover */
    int fatal;
    char fatal_text[600];
    atomic_int closing;
    int n_stages, local_last;
    uint64_t rows_sent;
    bool tp;                           /* one TP group: this machine is rank 0 */
    bool grouped;                      /* some stage is a TP group (tp, or hybrid) */
    bool tp_compress;                  /* Q8_0 all-reduce transfers in every group */
    int tp_size;                       /* members of this machine's group (stage 0) */
    int s0_remote[CM_COLL_MAX_MEMBERS]; /* stage-0 rank r (>= 1) is r[s0_remote[r]] */
    cm_plan *tp_plan;                  /* grouped plans: the plan running now (owned; re-planning starts from it) */
    cm_slice tp_slice;
    cm_conn *tp_conn[CM_COLL_MAX_MEMBERS]; /* to each node's rank (owned) */
    cm_coll *coll;
    int32_t seqbuf[CM_MSG_MAX_TOKENS > 4096 ? 4096 : CM_MSG_MAX_TOKENS];
    uint8_t wantbuf[4096];
    cm_pipe_log_fn log;
    void *log_ctx;
    char plan_text[8192];
    /* The dashboard's copy of the plan: rewritten by a re-plan while an HTTP
     * thread reads it (cm_pipe_members), so both hold info_mu, a lock of its
     * own that the data path never takes. */
    pthread_mutex_t info_mu;
    int n_members;
    cm_pipe_member_info members[CM_PLAN_MAX_NODES * 2];
    uint64_t next_rejoin_ns; /* coord_recover.c: next redial of lost nodes (cm_pipe_maintain) */
    bool gave_up;            /* coord_recover.c: recovery failed; returning nodes retry it, or the rejoin interval */
    uint64_t gave_up_ns;     /* when it gave up */
    char cause[300];         /* coord_recover.c: the failure that started it */
    uint64_t next_link_check_ns; /* coord_recover.c: next idle re-measure of links marked down */
    bool links_suspect;          /* coord_recover.c: a re-plan failed: re-measure before the next one */
};

/* A line into the caller's log callback (the plan, failures, re-plans). */
void cm_coord_log(cm_pipe *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Record the first failure and wake every waiter. */
void cm_coord_fatal(cm_pipe *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Start the receiver thread of every node that has none. */
void cm_coord_start_rx(cm_pipe *p);
/* ASSIGN stage s of n_st: layers [lb[s], le[s]) on r[rid[s]] (stage 0 is
 * this machine). */
int cm_coord_assign_stage(cm_pipe *p, int s, int n_st, const int *rid, const int *lb, const int *le, char *err,
                          size_t errlen);
/* Send a sequence message down the data path (every TP member, or stage 1);
 * caller holds send_mu. A failure marks the pipe failed. */
int cm_coord_send_data(cm_pipe *p, const cm_msg *m, char *err, size_t errlen);
/* The planner's view of this machine (node 0) and every known node (node
 * i + 1 is r[i], lost or not), and the dashboard's record of a plan in
 * those indices (coord.c, for coord_recover.c). */
void cm_coord_make_cluster(cm_pipe *p, cm_plan_cluster *c);
void cm_coord_record_members(cm_pipe *p, const cm_plan *plan);
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
/* Open a plan with tensor-parallel groups (one group of every machine, or
 * hybrid: groups as pipeline stages), this machine rank 0 of stage 0. */
int cm_coord_tp_open(cm_pipe *p, const cm_plan *plan, char *err, size_t errlen);
/* The plan of --groups "2,2" (members per stage, this machine's group first;
 * --layers may split the layers between the groups). */
int cm_coord_plan_groups(cm_pipe *p, const cm_pipe_opts *o, const cm_plan_opts *po, const cm_plan_model *pm,
                         const cm_plan_cluster *pc, cm_plan *plan, char *err, size_t errlen);
/* Re-plan a plan with tensor-parallel groups after a loss (called by
 * cm_pipe_recover); CM_EAGAIN when it cannot. */
int cm_coord_tp_recover(cm_pipe *p, char *err, size_t errlen);
/* Send a sequence message to the other members of this machine's group (on
 * their control connections); caller holds send_mu. */
int cm_coord_send_group0(cm_pipe *p, const cm_msg *m, char *err, size_t errlen);

#endif
