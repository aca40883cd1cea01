/*
 * weights.h: streaming a stage's weights to a node that lacks the model file.
 * Internal to src/cluster (includes net/proto).
 *
 * Objects are content-addressed by SHA-256 in WEIGHTS_REQ / WEIGHTS_CHUNK:
 *   - the MANIFEST of a model, addressed by the model file's sha256:
 *       file_size u64 | data_offset u64 | n_tensors u64 |
 *       the file's bytes [0, data_offset) (GGUF header, metadata, tensor table) |
 *       n_tensors x sha256 of each tensor's bytes (table order);
 *   - each TENSOR, addressed by the sha256 of its bytes;
 *   - the EXPERT MANIFEST (expert parallelism), addressed by
 *     sha256(model sha256 | "cumulo expert slabs 1"): for every stacked
 *     expert tensor (3-D, named *_exps.*; table order) ne[2] x sha256 of
 *     each expert's slab (its nbytes / ne[2] bytes at e * that);
 *   - each expert SLAB, addressed by the sha256 of its bytes, so a member of
 *     an expert group receives and caches only its experts' bytes.
 * The node writes what it receives into a SPARSE copy of the model file in
 * its cache (<cache>/slices/<model sha>.gguf): the header at offset 0, each
 * of its tensors at its own offset, holes elsewhere. So the unchanged GGUF
 * reader and cm_model_load accept it (every descriptor is there), the stage
 * only ever touches its own tensors, and the disk holds only those bytes.
 * Every tensor is verified against the manifest's hash before it counts as
 * present; a restart finds the manifest and verified tensors in the cache and
 * asks for nothing.
 */
#ifndef CM_WEIGHTS_H
#define CM_WEIGHTS_H

#include "net/net.h"
#include "gguf/gguf.h"

#include <pthread.h>

/* Coordinator: answer one WEIGHTS_REQ from g's mapping (the manifest or a
 * tensor), sending on c under send_mu. Hashes are computed on first use. */
int cm_weights_serve(cm_conn *c, pthread_mutex_t *send_mu, const cm_gguf *g, const uint8_t model_sha[32],
                     const cm_msg_weights_req *rq, char *err, size_t errlen);

/* Node: make sure the cache holds the model's manifest and every tensor of
 * layers [layer_begin, layer_end) (plus the token embedding when `embed`,
 * the output head when `last`),
 * fetching what is missing over c (the coordinator's connection; nobody else
 * may receive on it meanwhile; sends under send_mu). Writes the sparse
 * GGUF's path to path. *fetched gets the tensor bytes received. */
/* expert_end > 0: of the stacked expert tensors only the slabs of experts
 * [expert_begin, expert_end) and of the n_extra experts extra[] outside it
 * (hot-expert replicas) (the rest of them stays a hole in the file, never
 * read: the stage runs only those experts); expert_end <= 0: whole tensors. */
/* An ASSIGN that arrives while fetching supersedes this one (the coordinator
 * moved to a newer plan): it is copied to *newer, *superseded set, and the
 * fetch returns CM_ECANCELED (newer/superseded may be NULL: then it is a
 * protocol error as any other message). */
int cm_weights_fetch(cm_conn *c, pthread_mutex_t *send_mu, const char *cache_dir, const uint8_t model_sha[32],
                     int layer_begin, int layer_end, bool embed, bool last, int expert_begin, int expert_end,
                     const uint16_t *extra, int n_extra, char *path, size_t cap, uint64_t *fetched,
                     cm_msg_assign *newer, bool *superseded, char *err, size_t errlen);

/* Any other content-addressed object (a stage's LoRA parts, lora_parts.c):
 * the coordinator answers rq from obj's total bytes (obj NULL: "no such
 * object"); the node fetches exactly size bytes into *out (cm_free) and
 * checks their sha256 against hash. A newer ASSIGN supersedes the fetch as
 * in cm_weights_fetch. */
int cm_weights_send_object(cm_conn *c, pthread_mutex_t *send_mu, const uint8_t *obj, uint64_t total,
                           const cm_msg_weights_req *rq, char *err, size_t errlen);
int cm_weights_fetch_object(cm_conn *c, pthread_mutex_t *send_mu, const uint8_t hash[32], uint64_t size, uint8_t **out,
                            cm_msg_assign *newer, bool *superseded, char *err, size_t errlen);

#endif
