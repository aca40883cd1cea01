/*
 * train_pipe: pipeline-parallel LoRA training over an open cm_pipe (issue
 * 17), the coordinator's side (coord_train.c; the node's is node_train.c).
 * The plan is the one inference uses (cm_pipe_open plans and assigns it):
 * this machine trains layers [0, local_last), each node its stage's
 * layers, each stage holding its slice of the adapter and of the AdamW
 * moments. Per window the coordinator carries the activations down the
 * stages and the gradients of the stage boundaries back up (TRAIN FWD / BWD
 * / ROWS, docs/PROTOCOL.md), every stage steps its own slice (STEP), and
 * the slices come back into the run's whole adapter before a checkpoint and
 * at the end (FETCH / SLICE). Every stage computes with train.h's stage
 * pieces and the floats cross the links unchanged, so the adapter is the
 * one a single machine trains, bit for bit.
 *
 * A step's windows are queued and flushed with this machine one window
 * ahead: it computes the next window's forward while the nodes work on
 * this one. NEEDSWORK: the coordinator relays every hop (a star, not node
 * to node) and a node holds one window (no full 1F1B with micro-batches in
 * flight on every stage): the nodes take turns. A lost node fails the pipe
 * and the run; cmd_finetune.c then re-plans (cm_pipe_recover) and resumes
 * from the last checkpoint on a new cm_train_pipe.
 */
#ifndef CM_TRAIN_PIPE_H
#define CM_TRAIN_PIPE_H

#include "cluster/cluster.h"
#include "train/finetune.h"

typedef struct cm_train_pipe cm_train_pipe;

/* Training over p (a pipeline: one machine per stage; a tensor-parallel or
 * expert group is refused with one line), windows of up to n_ctx tokens,
 * this machine's layers on n_threads threads, up to inflight windows down
 * the stages at once (1..CM_MSG_MAX_TRAIN_INFLIGHT; 0: the number of
 * stages). p and m must outlive it; only one per pipe, and nothing else
 * may use the pipe meanwhile. */
int cm_train_pipe_new(cm_train_pipe **out, cm_pipe *p, const cm_model *m, int n_ctx, int n_threads, int inflight,
                      char *err, size_t errlen);
void cm_train_pipe_free(cm_train_pipe *t); /* NULL: no-op */
/* The exec for cm_finetune_opts.exec, valid while t lives. */
const cm_train_exec *cm_train_pipe_exec(cm_train_pipe *t);
/* Data parallelism (coord_train_dp.c): replicas are pipelines, each runs
 * some of a step's windows; the coordinator keeps the whole adapter, adds
 * the windows' gradients in window order (as one machine does: train.h's
 * cm_train_back adds each window's gradients at its end), steps it and
 * sends the parameters to every replica. take_grad moves the gradients
 * of the window just run out of every slice into g (the whole adapter's
 * layout; they are cleared there); set_params puts ad's parameters and
 * step into every slice. */
int cm_train_pipe_take_grad(cm_train_pipe *t, float *g, char *err, size_t errlen);
int cm_train_pipe_set_params(cm_train_pipe *t, const cm_tadapter *ad, char *err, size_t errlen);

/* n replicas (pipelines over disjoint nodes, each with its own
 * cm_train_pipe over the same plan shape) as one exec: the adapter is one
 * machine's, bit for bit. reps must outlive it. */
typedef struct cm_train_dp cm_train_dp;
int cm_train_dp_new(cm_train_dp **out, cm_train_pipe *const *reps, int n, const cm_model *m, int n_ctx, char *err,
                    size_t errlen);
void cm_train_dp_free(cm_train_dp *d); /* NULL: no-op */
const cm_train_exec *cm_train_dp_exec(cm_train_dp *d);

/* The layers this machine trains: [0, that). */
int cm_train_pipe_local_last(const cm_train_pipe *t);
/* Float bytes of TRAIN frames sent to and received from the nodes (this
 * machine's own: its FWDs to stage 1 and their BWDs, slices, fetches). */
void cm_train_pipe_stats(const cm_train_pipe *t, uint64_t *sent, uint64_t *received);

#endif
