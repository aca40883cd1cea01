/*
 * member.h: one machine of a cluster's plan as the coordinator knows it, the
 * record the dashboard shows (engine.h hands it to http as cm_engine_member).
 * Plain data, no dependencies, so that the engine's public header can carry
 * it without showing the cluster's API.
 */
#ifndef CM_MEMBER_H
#define CM_MEMBER_H

#include <stdbool.h>
#include <stdint.h>

/* Its stage and layers, its tensor-parallel slice, the facts of its HELLO
 * (taken when it connected) and the link this machine measured to it. */
typedef struct cm_cluster_member {
    int stage;                   /* 0: this machine's stage */
    int first_layer, last_layer; /* [first, last) */
    int n_members, member;       /* tensor-parallel group size and index (1, 0: whole layers) */
    int kv_head_begin, kv_head_end, ffn_begin, ffn_end;
    bool local;              /* this machine */
    char addr[80], name[64]; /* addr "" for this machine */
    uint32_t cores;
    uint64_t mem_total, mem_free;    /* bytes, at connect (HELLO) */
    uint64_t weight_bytes, kv_bytes; /* planned for this member */
    double gflops;
    double rtt_s, bw;           /* this machine -> it, measured at connect; 0 for this machine */
    bool link_measured;         /* first member of stage >= 1: the hop into it (previous stage's first */
    double link_rtt_s, link_bw; /* member -> it) was measured (else estimated); its rtt and bytes/s */
    char host[64];              /* its host id (HELLO): members with the same one share a machine */
    /* Live telemetry from its heartbeats (issue 19); live is false when none
     * came in the last 5 s (an older node, or a silent one). */
    bool live;
    double live_age_s;          /* seconds since that heartbeat */
    uint64_t live_mem_used;     /* bytes in use on its machine */
    double live_cpu_load;       /* busy fraction of its CPUs, [0, 1]; < 0 unknown */
    double live_power_w;        /* watts of its machine */
    char live_power_source[16]; /* "rapl", "estimate", "counters" or "none" */
    double live_tok_s;          /* token rows it computed per second, recently */
    double live_ms_per_tok;     /* its stage's time per token row, ms */
    /* An expert group's member: experts [expert_begin, expert_end) and the hot
     * experts it holds beyond them (replicas, ascending); ep false otherwise. */
    bool ep;
    int expert_begin, expert_end;
    int n_replicas;
    int replicas[8];
} cm_cluster_member;

/* Mixture of experts on a cluster: where the expert groups' routing counts
 * come from and what the coordinator did with them (cm_pipe_expert_info). */
typedef struct cm_cluster_experts {
    const char *load; /* "measured" (counted while serving), "given" (--expert-load N,...) or "uniform" */
    int warmup;       /* new assignments per expert between looks at the counts (< 0: never) */
    int replans;      /* plan changes the measured counts made */
    uint64_t exchange_bytes, exchange_rows; /* this machine's expert exchange, every plan: element bytes sent,
                                               token rows through its group */
    uint64_t reports, refused;              /* EXPERT_LOAD reports from the later stages taken / refused */
} cm_cluster_experts;

#endif
