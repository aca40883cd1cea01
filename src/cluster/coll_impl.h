/*
 * coll_impl.h: the collective's state and the helpers its files share
 * (collective.c: set-up, pieces over the links, direct exchange, ring,
 * gathers, mesh; coll_pair.c: a pair's ops through shared memory). Not an
 * interface: collective.h is.
 */
#ifndef CM_COLL_IMPL_H
#define CM_COLL_IMPL_H

#include "cluster/coll_shm.h"
#include "cluster/collective.h"

#include <stdbool.h>
#include <stdint.h>

/* Little-endian hosts copy f32 runs as they are (every machine cumulo runs
 * on so far); others convert byte by byte (and take no shared memory). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CM_COLL_LE 1
#else
#define CM_COLL_LE 0
#endif

struct cm_coll {
    cm_coll_cfg cfg;
    int timeout_ms;
    int64_t ring_min;
    uint64_t op_id;
    bool failed;
    bool gathering; /* the op in progress is an expert gather (point CM_COLL_POINT_GATHER) */
    float *part;    /* [size][max_n]: received partials (direct) */
    float *tmp;     /* [max_n]: own dequantized partial (direct + compress) */
    uint8_t *qall;  /* Q8_0 blocks of the whole vector (compress) */
    cm_coll_stats st;
    uint64_t last_end_ns; /* end of the previous op (gap_s) */
    bool trace;           /* CUMULO_TP_TRACE: print the time line at cm_coll_free */
    /* trace: cipher time, [0] decode-sized all-reduces, [1] larger ones, [2] gathers (head, experts) */
    uint64_t seal_ns[3], open_ns[3];
    double gather_busy_s, gather_wait_s; /* trace: busy_s and wait_s of the gathers */
    /* trace: this thread's CPU time (ns) in the larger all-reduces, and between
     * ops before them (a prompt's compute); the wall time between ops before
     * them (load shows as wall above CPU: spin off, waits do not burn CPU) */
    uint64_t last_end_cpu_ns, big_cpu_ns, big_gap_cpu_ns, big_gap_wall_ns;
    /* trace: the same for the decode-sized all-reduces (CPU inside them, and
     * CPU / wall between ops before them: a decode step's compute) */
    uint64_t small_cpu_ns, small_gap_cpu_ns, small_gap_wall_ns;
    /* two members on one host: pieces through shared memory (coll_shm.h),
     * set up at the first op (shm_tried) */
    cm_coll_shm *shm;
    bool shm_tried;
    const cm_coll_native *nat; /* the transport's all-reduce, or NULL */
    void *ngrp;
    char err[512];
};

/* Fail the collective (c->err names op, peer and detail); returns rc. */
int cm_coll_peer_fail(cm_coll *c, int peer, int rc, const char *what, const char *detail);
/* A piece's header at p (collective.h's wire layout). */
void cm_coll_put_hdr(const cm_coll *c, uint8_t *p, int step, int64_t off, int64_t m, bool q8);
/* Parse the piece (step, off, m) from peer at pl and check it is the one due. */
int cm_coll_check_piece(cm_coll *c, int peer, const uint8_t *pl, size_t len, int step, int64_t off, int64_t m,
                        cm_coll_piece *out);

/* coll_pair.c: set up the regions at a collective's first op (a no-op after;
 * c->shm stays NULL where the pair cannot use them), then the ops through
 * them. */
int cm_coll_shm_setup(cm_coll *c);
int cm_coll_allreduce_shm(cm_coll *c, float *x, int64_t n);
int cm_coll_gather_shm(cm_coll *c, float *x, const int64_t *part, int root);

#endif
