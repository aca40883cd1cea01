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
 * NEEDSWORK: the coordinator relays every hop (a star, not node to node)
 * and a window goes through the stages one at a time (no micro-batches in
 * flight, no 1F1B): stages do not overlap yet. A lost node fails the run
 * (resume it from the last checkpoint with --resume).
 */
#ifndef CM_TRAIN_PIPE_H
#define CM_TRAIN_PIPE_H

#include "cluster/cluster.h"
#include "train/finetune.h"

typedef struct cm_train_pipe cm_train_pipe;

/* Training over p (a pipeline: one machine per stage; a tensor-parallel or
 * expert group is refused with one line), windows of up to n_ctx tokens,
 * this machine's layers on n_threads threads. p and m must outlive it; only
 * one per pipe, and nothing else may use the pipe meanwhile. */
int cm_train_pipe_new(cm_train_pipe **out, cm_pipe *p, const cm_model *m, int n_ctx, int n_threads, char *err,
                      size_t errlen);
void cm_train_pipe_free(cm_train_pipe *t); /* NULL: no-op */
/* The exec for cm_finetune_opts.exec, valid while t lives. */
const cm_train_exec *cm_train_pipe_exec(cm_train_pipe *t);
/* Bytes of TRAIN frames payload sent to and received from the nodes. */
void cm_train_pipe_stats(const cm_train_pipe *t, uint64_t *sent, uint64_t *received);

#endif
