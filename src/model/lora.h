/*
 * lora: llama.cpp LoRA adapters (GGUF, general.type = "adapter",
 * adapter.type = "lora") applied at inference.
 *
 * An adapter file holds, for some weights W of the base model, a pair
 * "<W>.lora_a" with ne = [n_in, rank] and "<W>.lora_b" with ne = [rank,
 * n_out], and the key adapter.lora.alpha. A set of adapters turns each
 * targeted matmul y = W x into
 *
 *     y = W x + sum_i scale_i * B_i (A_i x),  scale_i = user_i * alpha_i / rank_i
 *
 * (scale_i = user_i when alpha is 0 or absent, as llama.cpp does), computed
 * in F32 from the float input of W (before its conversion to W's activation
 * type), the correction added to W x before any bias, adapters in the order
 * they were added. Targets: blk.N.attn_q/attn_k/attn_v/attn_output,
 * blk.N.ffn_gate/ffn_up/ffn_down and output (a model that has output.weight).
 * Other pairs (token_embd, fused attn_qkv, experts) are refused by name; the
 * "*_norm.weight" vectors some converters add are ignored, as llama.cpp
 * ignores them.
 *
 * A cm_lora copies the pairs out of the adapter file as F32 (any weight type
 * is dequantized; adapters are small), so the file may be closed after
 * cm_lora_add. This module never opens files: the caller parses the GGUF.
 * After the last cm_lora_add the set is read-only and may be shared by any
 * number of threads and cm_ctx (cm_ctx_set_lora).
 */
#ifndef CM_LORA_H
#define CM_LORA_H

#include "model.h"

/* The targets: a layer's dense weights in cm_layer_matmuls' order, then the output head. */
enum cm_lora_target {
    CM_LORA_Q,
    CM_LORA_K,
    CM_LORA_V,
    CM_LORA_O,
    CM_LORA_GATE,
    CM_LORA_UP,
    CM_LORA_DOWN,
    CM_LORA_OUTPUT,
    CM_LORA_TARGET_COUNT
};
_Static_assert(CM_LORA_OUTPUT == CM_LAYER_MATMULS, "a layer's LoRA targets are cm_layer_matmuls' tensors");

#define CM_LORA_MAX_RANK 1024 /* larger ranks are refused (the A x product lives on the stack) */

typedef struct cm_lora cm_lora;

/* An empty set for model m (which must outlive it). NULL on out of memory. */
cm_lora *cm_lora_new(const cm_model *m);
void cm_lora_free(cm_lora *l); /* NULL is a no-op */

/* Add the adapter in g with user scale `scale`. Validates everything before
 * keeping anything: on error the set is unchanged. Errors (one line):
 *   CM_EFORMAT "not a LoRA adapter (general.type is 'model', expected 'adapter')",
 *   CM_EUNSUPPORTED "adapter is for architecture 'qwen2', the model is 'llama'",
 *   CM_EFORMAT "tensor 'blk.0.attn_q.weight.lora_a' has shape [32, 4], the model's
 *               'blk.0.attn_q.weight' takes [64, ...] (adapter made for another model?)",
 *   CM_EUNSUPPORTED "adapter tensor 'token_embd.weight.lora_a': cumulo applies LoRA to ...". */
int cm_lora_add(cm_lora *l, const cm_gguf *g, float scale, char *err, size_t errlen);

/* Parse "FILE[:SCALE]" (the CLI's --lora value): the path into path (NUL
 * terminated), the scale (default 1) into *scale. A suffix after the last
 * ':' that is not a number is part of the path. CM_EINVAL when the path
 * does not fit or is empty. */
int cm_lora_spec_parse(const char *spec, char *path, size_t pathlen, float *scale, char *err, size_t errlen);

int cm_lora_count(const cm_lora *l);   /* adapters added */
int cm_lora_n_pairs(const cm_lora *l); /* (A, B) pairs over all adapters */
/* Does any adapter target t of layer il (ignored for CM_LORA_OUTPUT)? */
bool cm_lora_targets(const cm_lora *l, int il, enum cm_lora_target t);

/* y[j * ldy + r] += sum_i scale_i * (B_i (A_i x_j))[row0 + r] for tokens j
 * in [0, n_tok) and rows r in [r0, r1), where x_j = x + j * ldx holds the
 * input columns [col0, col0 + ncols) of W (a tensor-parallel slice of a
 * column-split weight passes its columns: the products are then partial
 * sums like W's own). row0 is the first of W's rows that y's row 0 holds.
 * Thread-safe on a shared set; no allocation. */
void cm_lora_apply(const cm_lora *l, int il, enum cm_lora_target t, const float *x, int64_t ldx, int64_t col0,
                   int64_t ncols, int n_tok, float *y, int64_t ldy, int64_t row0, int64_t r0, int64_t r1);

/* cm_lora_apply with each token row's own adapter scales (serve's
 * per-request adapters): user[j] (NULL: the defaults) holds cm_lora_count
 * user scales, one per adapter in the order added, each replacing that
 * adapter's cm_lora_add scale for row j (the final scale is
 * user * alpha / rank as there, the same bits for the same value); a row
 * whose final scale is 0 is left as it is. user NULL: every row the
 * defaults (= cm_lora_apply). Rows never affect each other. */
void cm_lora_apply_rows(const cm_lora *l, int il, enum cm_lora_target t, const float *x, int64_t ldx, int64_t col0,
                        int64_t ncols, int n_tok, float *y, int64_t ldy, int64_t row0, int64_t r0, int64_t r1,
                        const float *const *user);
/* Can every adapter of l take a row's own scale (cm_lora_apply_rows)? False
 * when some came from version-2 parts (cm_lora_add_parts: final scales
 * only): those always apply their given scale. */
bool cm_lora_rows_ok(const cm_lora *l);
/* Adapter i's default user scale (cm_lora_add's); 0 for parts (they carry final scales) or a bad i. */
float cm_lora_scale(const cm_lora *l, int adapter);

/* A cluster member's part of a set (the coordinator sends it to the node
 * that runs those layers; cluster/coord_lora.c): every pair of layers
 * [layer_begin, layer_end), plus the output head's when output, in the
 * set's order, and of each pair only what a member with slice `slice`
 * (NULL: the whole layers) reads: its rows of B for the row-split weights
 * (attn_q/k/v, ffn_gate/up; the output head's with head_split,
 * cm_slice_head_rows), its columns of A for the column-split ones
 * (attn_output, ffn_down). Bytes: "CMLP", version 3, adapter count, pair
 * count; per pair adapter index, layer, target, rank, n_in, n_out, final
 * scale, alpha (version 3; version 2, still read: a reserved 0), A's
 * column range, B's row range, then those values as
 * little-endian F32. Appends to out; *n_pairs (may be NULL) gets the pairs
 * written. l must hold whole pairs (cm_lora_add). CM_ENOMEM when out could
 * not grow. */
int cm_lora_parts_write(const cm_lora *l, int layer_begin, int layer_end, bool output, const cm_slice *slice,
                        bool head_split, cm_buf *out, int *n_pairs);
/* Add the pairs of a cm_lora_parts_write to l, as adapters after l's own,
 * with the scales as written: on the rows/columns they hold, the same
 * corrections, bit for bit, as the set they came from. Bytes from a peer:
 * bounded and checked against l's model (each pair's weight, shape and
 * ranges) before anything is kept; on error l is unchanged. CM_EFORMAT /
 * CM_ENOMEM. */
int cm_lora_add_parts(cm_lora *l, const uint8_t *p, size_t n, char *err, size_t errlen);
/* Does every pair of l hold what a member with this slice (NULL: whole)
 * reads (cm_lora_apply must never read outside a part)? */
bool cm_lora_covers(const cm_lora *l, const cm_slice *slice, bool head_split);

/* Apply l (NULL: none) in every cm_forward() of c from now on (forward.c).
 * l must outlive its use by c. */
void cm_ctx_set_lora(cm_ctx *c, const cm_lora *l);

#endif
