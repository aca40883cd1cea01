/*
 * collective: the all-reduce of a tensor-parallel group over authenticated
 * cm_conn's (a full mesh: every member holds one READY connection to every
 * other). It is the callback cm_forward() calls twice per layer (model.h's
 * cm_allreduce_fn): each member passes its partial sum and gets back the sum
 * over all members, bit-identical on every member.
 *
 * Two algorithms, both with a FIXED reduction order (no result depends on
 * timing, so every member computes the same bits and a rerun repeats them):
 *
 *   direct exchange (small vectors: decode). Each member sends its whole
 *     partial to every other member first, then receives theirs, and sums
 *     x = ((p0 + p1) + p2) + ... in rank order — the order of the in-process
 *     test all-reduce. Per member and op: (k-1) * n elements sent.
 *
 *   ring reduce-scatter + all-gather (large vectors: prefill). The vector is
 *     cut into k chunks (boundaries on multiples of 32 elements); in k-1
 *     steps each member sends a running sum to rank+1 and adds its own part
 *     to what rank-1 sent, so chunk c is summed in the order
 *     ((p_c + p_c+1) + p_c+2) + ... + p_c-1 (ranks mod k), then k-1 steps of
 *     all-gather copy the finished chunk from its owner (rank c-1) to every
 *     member unchanged. The order depends only on (c, k): deterministic and
 *     identical on every member, but (for k >= 3) not the rank order of the
 *     direct exchange. Per member and op: 2 (k-1)/k * n elements sent.
 *
 * Compression (cfg.compress, `--tp-compress`, off by default): elements go
 * as Q8_0 blocks (32 int8 + an f16 scale, 34 bytes per 32 elements). Every
 * member dequantizes ITS OWN contribution too before summing (direct) and the
 * all-gather forwards the owner's blocks byte for byte, so results stay
 * bit-identical across members (they differ from the uncompressed sum by the
 * quantization error, ~0.4% of each block's largest magnitude).
 *
 * Wire: ALLREDUCE messages (docs/PROTOCOL.md): epoch u64, op_id u64,
 * layer u16 (op_id / 2), point u8 (op_id % 2; | 0x80 when the data are Q8_0
 * blocks; 2 for an expert gather piece, cm_coll_allgather), step u8 (0 direct; ring: 0..k-2 reduce-scatter, k-1..2k-3
 * all-gather), elem_offset u32, n u32, then n x f32 (or ceil(n/32) Q8_0
 * blocks). Vectors are sent in pieces of at most CM_COLL_PIECE_FLOATS
 * elements, and a member never has more than two pieces outstanding on a
 * connection before it reads, so a group of single-threaded members cannot
 * deadlock on full socket buffers. Every received piece is checked (type,
 * epoch, op, step, offset, length) before a byte of it is used.
 *
 * Never: allocates in cm_coll_allreduce (buffers are sized by cm_coll_new),
 * waits without a deadline, or owns the connections (the caller closes
 * them). One thread uses a cm_coll at a time; a failed op leaves it FAILED
 * (every later call returns CM_ESTATE) until cm_coll_reset().
 */
#ifndef CM_COLLECTIVE_H
#define CM_COLLECTIVE_H

#include "net/net.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_COLL_MAX_MEMBERS 16     /* = CM_MSG_MAX_TP */
#define CM_COLL_PIECE_FLOATS 16384 /* elements per message (64 KiB of f32) */
/* cm_coll_new raises each peer socket's send and receive buffers to at least
 * this (bytes): two pieces in flight each way must fit whatever the kernel's
 * autotuning has reached (single-threaded members both send before reading). */
#define CM_COLL_SOCK_BUF (512 * 1024)
#define CM_COLL_QK 32           /* elements per Q8_0 block */
#define CM_COLL_HDR_BYTES 28    /* ALLREDUCE header before the elements */
#define CM_COLL_POINT_Q8 0x80u  /* point flag: elements are Q8_0 blocks */
#define CM_COLL_POINT_GATHER 2u /* point of an expert gather piece (never Q8_0) */
#define CM_COLL_DEFAULT_TIMEOUT_MS 10000
#define CM_COLL_DEFAULT_RING_MIN 65536 /* elements (256 KiB of f32) */
#define CM_COLL_SMALL_N 16384          /* stats: ops up to this many elements count as decode-sized */
/* Receives on loopback links spin this long before sleeping in poll()
 * (cm_conn_set_spin); CUMULO_TP_SPIN_US=N sets it for every link (0: off). */
#define CM_COLL_LOOPBACK_SPIN_US 500

typedef struct cm_coll_cfg {
    int rank, size;                      /* 0 <= rank < size <= CM_COLL_MAX_MEMBERS */
    cm_conn *peers[CM_COLL_MAX_MEMBERS]; /* READY connection to each other rank; [rank] unused; not owned */
    int64_t max_n;                       /* largest vector (batch * n_embd) */
    int timeout_ms;                      /* deadline of every wait; 0 = CM_COLL_DEFAULT_TIMEOUT_MS */
    int64_t ring_min;                    /* n >= ring_min uses the ring (not a pair through shared memory,
                                          * coll_shm.h: that takes every size); 0 = default; < 0 = never */
    bool compress;                       /* Q8_0 transfer */
    uint64_t epoch;                      /* plan epoch carried by every message */
} cm_coll_cfg;

/* Counters of one connection (this member's side). wire_* count whole frames
 * (header, payload, MAC); data_* only the element bytes (f32 or Q8_0 blocks). */
typedef struct cm_coll_link_stats {
    uint64_t msgs_sent, msgs_recv;
    uint64_t wire_sent, wire_recv;
    uint64_t data_sent, data_recv;
} cm_coll_link_stats;

typedef struct cm_coll_stats {
    uint64_t ops, direct_ops, ring_ops;
    uint64_t native_ops;                          /* of which by the transport's own all-reduce (cm_coll_native) */
    uint64_t elems;                               /* sum of n over ops */
    uint64_t gather_ops;                          /* of which expert gathers (cm_coll_allgather) */
    uint64_t gather_data_sent;                    /* element bytes this member sent in them */
    uint64_t head_ops;                            /* of which gathers of a split head (cm_coll_gather) */
    uint64_t head_data_sent, head_wire_sent;      /* element and wire bytes this member sent in them */
    double busy_s;                                /* wall time inside cm_coll_allreduce */
    double wait_s;                                /* of which receiving a peer's piece (waiting, reading, opening) */
    double send_s;                                /* of which sending pieces (sealing, writing) */
    double gap_s;                                 /* between the end of one op and the start of the next */
    uint64_t small_ops;                           /* ops of at most CM_COLL_SMALL_N elements (one decoded row) */
    double small_busy_s, small_wait_s;            /* busy_s and wait_s of those */
    cm_coll_link_stats link[CM_COLL_MAX_MEMBERS]; /* by peer rank */
    cm_coll_link_stats total;
} cm_coll_stats;

typedef struct cm_coll cm_coll;

/* Make a collective for this member. Checks the configuration (ranks, every
 * peer present and READY) and sets each peer connection's receive spin
 * (CM_COLL_LOOPBACK_SPIN_US on loopback links, none on others; the
 * environment's CUMULO_TP_SPIN_US for all) and socket buffers
 * (CM_COLL_SOCK_BUF). With CUMULO_TP_TRACE set,
 * cm_coll_free prints where this member's all-reduce time went (one line on
 * stderr). Errors: CM_EINVAL, CM_ENOMEM. */
int cm_coll_new(const cm_coll_cfg *cfg, cm_coll **out, char *err, size_t errlen);
void cm_coll_free(cm_coll *c); /* NULL is a no-op; does not close the connections */
/* The receive spin (µs) a collective gives a link: CUMULO_TP_SPIN_US when
 * set, else CM_COLL_LOOPBACK_SPIN_US on a loopback link and 0 on others. */
int cm_coll_link_spin_us(const cm_conn *conn);

/* Replace x[0..n) by the sum over the group, identically on every member.
 * All members must call it with the same n, in the same sequence of ops.
 * Errors (the message names the peer by rank and address): CM_ETIMEDOUT,
 * CM_ECLOSED, CM_EPROTO (a piece out of sequence or malformed: a lost or
 * stale partial), CM_ERANGE (n > max_n), CM_ESTATE (failed before), or the
 * connection's error. */
int cm_coll_allreduce(cm_coll *c, float *x, int64_t n, char *err, size_t errlen);

/* Expert parallelism: an all-gather of contiguous parts. Member j owns
 * x[part[j], part[j+1]) (part[0] = 0, non-decreasing, part[size] = the
 * vector's length; every member passes the same part[]); on return every
 * member holds every part, byte for byte as its owner sent it. Direct: each
 * member sends its part to every other member, in rounds of one piece
 * (CM_COLL_PIECE_FLOATS elements) per connection, so element bytes sent by
 * the group = (size - 1) * part[size] * 4. Pieces are ALLREDUCE messages with
 * point CM_COLL_POINT_GATHER, step 0, checked like every piece (offset and
 * length must be the sender's next piece). One op of the op sequence: members
 * must call it at the same place. Errors as cm_coll_allreduce. */
int cm_coll_allgather(cm_coll *c, float *x, const int64_t *part, char *err, size_t errlen);

/* The same, but only member root ends with every part (the others send
 * theirs to it alone and keep their x as it was): tensor parallelism's split
 * output head, whose logits only the sampling member needs. One op of the
 * op sequence, like cm_coll_allgather. Errors as cm_coll_allreduce, and
 * CM_EINVAL for a root out of range. */
int cm_coll_gather(cm_coll *c, float *x, const int64_t *part, int root, char *err, size_t errlen);

/* cm_allreduce_fn for cm_forward_args (user = the cm_coll). On error the
 * message is kept: cm_coll_error(). */
int cm_coll_allreduce_cb(void *user, float *x, int64_t n);
const char *cm_coll_error(const cm_coll *c);

/* A new epoch (after a re-plan, or to recover from FAILED): op numbering
 * restarts at 0, counters are kept. The caller must have drained or
 * replaced the connections. */
void cm_coll_reset(cm_coll *c, uint64_t epoch);
void cm_coll_stats_get(const cm_coll *c, cm_coll_stats *s);
void cm_coll_stats_clear(cm_coll *c);
bool cm_coll_uses_ring(const cm_coll *c, int64_t n); /* which algorithm an n takes */

/* Element bytes one member sends for one op of n elements (the cost model
 * and the tests use it): direct (k-1)*n*4, ring 2*(sum of the chunks it
 * sends)*4; with compression 34 bytes per 32 elements (per piece, rounded up). */
uint64_t cm_coll_data_bytes(const cm_coll *c, int64_t n);

/* Parse an ALLREDUCE payload header (untrusted bytes). Checks that the
 * element bytes that follow match n and the Q8 flag exactly. */
typedef struct cm_coll_piece {
    uint64_t epoch, op_id;
    uint16_t layer;
    uint8_t point, step;
    uint32_t elem_offset, n;
    const uint8_t *data;
    size_t data_len;
} cm_coll_piece;
int cm_coll_piece_parse(const uint8_t *p, size_t n, cm_coll_piece *out, char *err, size_t errlen);

/* ---- a transport's own all-reduce (issue 18) ----
 * A transport may offer its library's all-reduce (MPI_Iallreduce under
 * `cumulo mpi --mpi-allreduce`). cm_coll_new offers it every new group
 * (this member's rank, the size, the largest vector, the plan epoch); when
 * open() returns 0 with a group, every cm_coll_allreduce of that collective
 * goes to allreduce() instead of the ordered exchange. Its summation order
 * is the library's: NOT bit-identical to one machine or to the exchange, and
 * every member must still get the same bits (the provider's promise). Expert
 * gathers stay on the exchange. After a failed op or a cm_coll_reset the
 * collective falls back to the exchange for good. Set before any cm_coll_new. */
typedef struct cm_coll_native {
    int (*open)(void *ctx, int rank, int size, int64_t max_n, uint64_t epoch, void **grp);
    int (*allreduce)(void *grp, float *x, int64_t n, int timeout_ms, char *err, size_t errlen);
    void (*close)(void *grp);
    void *ctx;
} cm_coll_native;
void cm_coll_set_native(const cm_coll_native *nat); /* NULL: none (the default) */
bool cm_coll_is_native(const cm_coll *c);

/* ---- a full mesh on loopback or a LAN ----
 * Member `rank` of `size` connects to every lower rank (at addrs[j],
 * "host:port") and accepts one connection from every higher rank on l, runs
 * the handshake with cfg/mine on each, and tells the acceptor its rank in a
 * PING (id = CM_COLL_MESH_ID + rank). Lower ranks never wait for higher
 * ones, so members may start in any order. conns[size] gets one READY
 * connection per other rank (conns[rank] = NULL). On error every connection
 * made so far is closed. */
#define CM_COLL_MESH_ID 0x636f6c6c00000000ull /* "coll" */
int cm_coll_mesh_open(int rank, int size, cm_listener *l, const char *const *addrs, const cm_net_cfg *cfg,
                      const cm_msg_hello *mine, int timeout_ms, cm_conn **conns, char *err, size_t errlen);
void cm_coll_mesh_close(cm_conn **conns, int size);
/* The two halves of the rank greeting, for a node daemon whose own accept
 * loop receives the TP connections: after the handshake the connecting
 * member calls cm_coll_mesh_greet(conn, its rank); the accepting side passes
 * the first message it receives to cm_coll_mesh_rank_of(), which returns the
 * peer's rank, or -1 when the message is not a greeting (an ordinary peer). */
int cm_coll_mesh_greet(cm_conn *c, int rank, int timeout_ms, char *err, size_t errlen);
int cm_coll_mesh_rank_of(const cm_msg *m);

#endif
