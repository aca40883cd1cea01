/*
 * coll_shm.h: a shared-memory path for the all-reduce pieces of two
 * tensor-parallel members on one host (collective.c). On an IP loopback link
 * the bytes never leave the machine, but every piece still costs a TCP send,
 * two receives, a MAC and, while the other member computes, a spin of failed
 * receives; a decode step makes 2 x layers such exchanges. Here each member
 * writes its partial sums into a region of its own that the other maps, and
 * publishes them with a counter; the reader spins on the counter (sleeping on
 * a futex after the link's spin time) and sums straight from the region.
 * Every op of the pair goes this way: all-reduces of any size (a prefill's
 * stream through the two slots piece by piece instead of taking the ring)
 * and gathers (a split head's logits to rank 0, expert all-gathers).
 *
 * Set-up (cm_coll_shm_open, at the first op of a collective, both members at
 * once): each creates a POSIX shared-memory object under a random name
 * (0600: same user only), sends the name over the authenticated connection,
 * opens the other's, says whether it could, and unlinks its own name. Both
 * use the regions only when both opened them; otherwise (another user,
 * another /dev/shm, not Linux, CUMULO_TP_SHM=0) the pieces go over the
 * connection as before. The connection stays the liveness check: a waiting
 * reader polls it, and a peer that closes it or sends a frame fails the op.
 *
 * Wire form of the two set-up frames (ALLREDUCE frames, the piece header of
 * collective.h with point CM_COLL_POINT_SHM; an older member refuses them as
 * a piece of an unknown point): step 1 carries the name (n = its length,
 * 0: no offer), step 2 the answer (n = 1 opened, 0 not).
 */
#ifndef CM_COLL_SHM_H
#define CM_COLL_SHM_H

#include "net/net.h"

#include <stdbool.h>
#include <stdint.h>

#define CM_COLL_POINT_SHM 3u         /* point of the set-up frames */
#define CM_COLL_SHM_MAX_FLOATS 65536 /* largest piece a region holds (larger ops go piece by piece) */
#define CM_COLL_SHM_SLOT_HDR 64      /* bytes before a slot's elements (the 28-byte piece header) */

typedef struct cm_coll_shm cm_coll_shm;

/* The exchange above over peer (epoch and op_id go in the frames' headers).
 * offer: create and offer a region of cap floats per piece. *out is NULL
 * when the regions are not used. Errors (the connection failed, a frame out
 * of sequence): CM_EPROTO, CM_ETIMEDOUT, CM_ECLOSED, ... */
int cm_coll_shm_open(cm_conn *peer, uint64_t epoch, uint64_t op_id, int64_t cap, bool offer, uint64_t spin_ns,
                     int timeout_ms, cm_coll_shm **out, char *err, size_t errlen);
void cm_coll_shm_close(cm_coll_shm *s);        /* NULL is a no-op */
int64_t cm_coll_shm_cap(const cm_coll_shm *s); /* floats per piece both regions hold */

/* The next slot of this member's region (CM_COLL_SHM_SLOT_HDR bytes, then the
 * elements), once the peer has read what was there; NULL on a timeout or a
 * lost peer (err says which). */
uint8_t *cm_coll_shm_tx_slot(cm_coll_shm *s, int timeout_ms, int *rc, char *err, size_t errlen);
void cm_coll_shm_tx_publish(cm_coll_shm *s); /* the slot is written: the peer may read it */
/* The peer's next slot, once published; NULL on a timeout or a lost peer. */
const uint8_t *cm_coll_shm_rx_slot(cm_coll_shm *s, int timeout_ms, int *rc, char *err, size_t errlen);
void cm_coll_shm_rx_done(cm_coll_shm *s); /* read: the peer may reuse the slot */

#endif
