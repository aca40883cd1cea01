/*
 * train: LoRA fine-tuning of the dense llama-family models (llama, qwen2,
 * qwen3) on one machine.
 *
 * The base weights stay frozen in the mmap, in whatever type they have: the
 * training forward and backward dequantize rows of them on the fly and
 * compute in F32. Only the LoRA matrices A [rank][n_in] and B [n_out][rank]
 * of the targeted weights (attn_q/k/v/output, ffn_gate/up/down) get
 * gradients; they live in one F32 parameter vector with its gradient and the
 * AdamW moments beside it. Each targeted matmul becomes
 *
 *     y = W x + (alpha / rank) * B (A drop(x))
 *
 * exactly what model/lora.h applies at inference (with no dropout there).
 *
 * The forward pass of a window of T tokens keeps only each layer's input
 * (T x n_embd floats per layer); the backward pass recomputes one layer's
 * intermediates at a time from its input (activation recomputation), so
 * memory is O(n_layer T E + one layer's T x (n_ff + H T)).
 *
 * Deterministic: the same adapter, tokens and dropout key give the same bits
 * on every run and for any thread count (no threads share a sum; dropout masks are a hash of the key
 * and the element's index, so recomputation sees the same mask). Never opens
 * files here: train_data.c, train_io.c do that for the CLI.
 */
#ifndef CM_TRAIN_H
#define CM_TRAIN_H

#include "../base/base.h"
#include "../model/lora.h"
#include "../model/model.h"

#include <stdbool.h>
#include <stdint.h>

/* Bits of cm_tadapter_new's targets: 1u << CM_LORA_Q ... 1u << CM_LORA_DOWN. */
#define CM_TRAIN_TARGETS_ALL 0x7fu

/* Parse "attn_q,attn_k,ffn_down" (also "all", "attn", "ffn") into target
 * bits. CM_EINVAL naming the unknown word. */
int cm_train_targets_parse(const char *s, unsigned *targets, char *err, size_t errlen);

/* One (layer, target) pair: offsets into the adapter's vectors. */
typedef struct cm_tpair {
    int il;
    enum cm_lora_target t;
    int64_t n_in, n_out;
    size_t a, b; /* offsets of A [rank][n_in] and B [n_out][rank] */
} cm_tpair;

/* The trainable adapter: params, grads and AdamW moments, all [n_params]. */
typedef struct cm_tadapter {
    const cm_model *m;
    int rank;
    float alpha, scale; /* scale = alpha / rank */
    unsigned targets;
    int n_pairs;
    int pair0; /* the whole adapter's index of pairs[0] (a slice's first pair; 0 for the whole) */
    cm_tpair *pairs;
    int *slot; /* [n_layer * CM_LORA_OUTPUT]: pair index or -1 */
    size_t n_params;
    float *w, *g, *m1, *m2;
    int64_t step; /* optimizer steps taken */
} cm_tadapter;

/* Is the model one this module trains? CM_EUNSUPPORTED with one line naming
 * the architecture (MoE, MLA, gemma3, phi3's fused weights...). */
int cm_train_check_model(const cm_model *m, char *err, size_t errlen);

/* A new adapter for m (which must outlive it): A ~ U(-1/sqrt(n_in),
 * 1/sqrt(n_in)) from seed (PEFT's default), B = 0, moments 0. */
int cm_tadapter_new(cm_tadapter **out, const cm_model *m, int rank, float alpha, unsigned targets, uint64_t seed,
                    char *err, size_t errlen);
void cm_tadapter_free(cm_tadapter *a); /* NULL is a no-op */
/* A slice for a pipeline stage: the pairs of layers [l0, l1) only, laid out
 * as in the whole adapter (pairs by layer, then target; A then B), so the
 * slice's vectors are the whole adapter's elements [off, off + n) of
 * cm_tadapter_span. Parameters and moments start at 0: the coordinator
 * sends them. */
int cm_tadapter_new_range(cm_tadapter **out, const cm_model *m, int rank, float alpha, unsigned targets, int l0, int l1,
                          char *err, size_t errlen);
/* Where layers [l0, l1)'s pairs lie in a's vectors. */
void cm_tadapter_span(const cm_tadapter *a, int l0, int l1, size_t *off, size_t *n);
static inline float *cm_tadapter_a(const cm_tadapter *a, int p) { return a->w + a->pairs[p].a; }
static inline float *cm_tadapter_b(const cm_tadapter *a, int p) { return a->w + a->pairs[p].b; }

/* AdamW (decoupled weight decay) on every parameter with the gradient in
 * a->g; clears a->g. step++ first, bias correction with the new step. */
void cm_tadapter_adamw(cm_tadapter *a, float lr, float beta1, float beta2, float eps, float wd);

/* The workspace for windows of up to n_ctx tokens. pool (not owned; NULL:
 * the caller's thread only) runs the base-weight matmuls; every output has
 * one owner, so the results are the same bits for any number of threads. */
typedef struct cm_trainer cm_trainer;
int cm_trainer_new(cm_trainer **out, const cm_model *m, cm_tadapter *ad, int n_ctx, cm_pool *pool, char *err,
                   size_t errlen);
void cm_trainer_free(cm_trainer *tr);

/* A trainer of layers [l0, l1) only: a pipeline stage (train_pipe.h). ad
 * may be the whole adapter or a slice of cm_tadapter_new_range. */
int cm_trainer_new_range(cm_trainer **out, const cm_model *m, cm_tadapter *ad, int l0, int l1, int n_ctx, cm_pool *pool,
                         char *err, size_t errlen);

/* cm_train_window in stage pieces, the same operations in the same order
 * (a pipeline of stages gives the bits of one trainer):
 *  - cm_train_fwd: T tokens through layers [l0, l1): the first stage embeds
 *    tokens, a later one takes x_in [T][n_embd] (the previous stage's
 *    cm_train_out); layer inputs are kept for the backward;
 *  - cm_train_head (the last stage, l1 = n_layer): loss and, with backward,
 *    its gradient at the last layer's output, as cm_train_window;
 *  - cm_train_back: dy (the next stage's dx; NULL after cm_train_head) back
 *    through the layers, adding to the adapter's gradients; dx [T][n_embd]
 *    gets the gradient at layer l0's input (l0 > 0; may be NULL). */
void cm_train_fwd(cm_trainer *tr, const int32_t *tokens, const float *x_in, int T, float dropout, uint64_t drop_key);
const float *cm_train_out(const cm_trainer *tr); /* [T][n_embd], valid until the next cm_train_fwd */
double cm_train_head(cm_trainer *tr, const int32_t *target, bool backward, float weight, int *n_targets);
void cm_train_back(cm_trainer *tr, const float *dy, float *dx);

/* A window's forward state (its layer inputs, size, dropout), so that a
 * stage can compute another window's forward before this one's backward
 * (coord_train.c overlaps stage 0 with the nodes so). xs: the caller's
 * buffer of cm_train_saved_floats floats. */
typedef struct cm_train_saved {
    float *xs;
    int T;
    float drop;
    uint64_t key;
} cm_train_saved;
size_t cm_train_saved_floats(const cm_trainer *tr);
void cm_train_save(const cm_trainer *tr, cm_train_saved *s);
void cm_train_restore(cm_trainer *tr, const cm_train_saved *s);

/* One window: tokens[0..n) at positions 0..n-1, target[i] the token that
 * should follow tokens[i] (-1: no loss at i). Returns the summed
 * cross-entropy (natural log) over the targets and their count in
 * *n_targets. With backward, adds weight * d(sum loss)/d(params) to ad->g
 * (weight = 1 / targets in the optimizer step, for a mean). dropout in
 * [0, 1): LoRA input dropout with masks from drop_key. */
double cm_train_window(cm_trainer *tr, const int32_t *tokens, const int32_t *target, int n, bool backward, float weight,
                       float dropout, uint64_t drop_key, int *n_targets);

#endif
