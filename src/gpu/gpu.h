/*
 * gpu: a Vulkan compute backend (vk.c: loader, device, buffers, pipelines;
 * vk_model.c, vk_record.c, vk_kv.c, vk_forward.c: a llama model's layers on
 * the device). The Vulkan loader is found at run time (dlopen), so one
 * binary runs on machines without a GPU or driver; the shaders are SPIR-V
 * embedded at build time. The model and
 * cluster code never see it: the engine gives the forward context
 * cm_gpu_offload (model.h's offload hook), which takes a batch's first
 * layers; the CPU continues with the rest.
 *
 * A cm_gpu is one logical device with one queue; calls on it are
 * serialized by its own mutex. Nothing here runs on a machine without a
 * Vulkan driver except the functions that say why not.
 */
#ifndef CM_GPU_H
#define CM_GPU_H

#include "../model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cm_gpu cm_gpu;

typedef struct cm_gpu_info {
    char name[256];     /* "llvmpipe (LLVM 15.0.6, 256 bits)" */
    char kind[16];      /* "discrete", "integrated", "virtual", "cpu", "other" */
    uint64_t mem_bytes; /* the largest device-local heap */
    uint32_t api;       /* VK_MAKE_API_VERSION packed */
} cm_gpu_info;

/* Were the shaders compiled into this binary (glslc at build time)? */
bool cm_gpu_compiled(void);
/* The Vulkan devices: fills up to max entries, returns how many there are
 * (>= 0), or a negative CM_E* code with the reason (no loader, no driver,
 * no shaders compiled in) in err. */
int cm_gpu_list(cm_gpu_info *out, int max, char *err, size_t errlen);

/* Which device a --gpu option names: "none" (or NULL/empty) -> CM_GPU_NONE,
 * "auto" -> CM_GPU_AUTO (the first discrete/integrated/virtual GPU, never a
 * CPU driver), "vulkan" -> CM_GPU_ANY (the first device of any kind, lavapipe
 * included), "N" -> N. CM_EINVAL on anything else. */
enum { CM_GPU_NONE = -1, CM_GPU_AUTO = -2, CM_GPU_ANY = -3 };
int cm_gpu_parse(const char *s, int *index);

/* Open device index (>= 0, CM_GPU_AUTO or CM_GPU_ANY). */
int cm_gpu_open(cm_gpu **out, int index, char *err, size_t errlen);
void cm_gpu_close(cm_gpu *g); /* NULL: no-op */
/* Has the device been lost (a submission said so, or the test hook)? Then
 * every later call on it fails: the caller drops it. */
bool cm_gpu_lost(const cm_gpu *g);
const cm_gpu_info *cm_gpu_info_of(const cm_gpu *g);
/* The matmuls' reduction: subgroupAdd (the subgroup size, where the device
 * has subgroup arithmetic in compute shaders: the default there), or 0: the
 * shared-memory tree (the fallback). cm_gpu_set_subgroup picks one (tests;
 * CM_EUNSUPPORTED for subgroups on a device without them); not while
 * another thread records on g. */
int cm_gpu_subgroup(const cm_gpu *g);
int cm_gpu_set_subgroup(cm_gpu *g, bool on, char *err, size_t errlen);

/* ---- a model's layers on the device (vk_model.c, vk_forward.c, vk_kv.c) ---- */
typedef struct cm_gpu_model cm_gpu_model;

/* Can this model's layers run on the device? False with the reason
 * (architecture, weight type, biases, ...) in why. */
bool cm_gpu_model_supported(const cm_model *m, char *why, size_t whylen);
/* The same for layers [l0, l1) only (a cluster stage's slice of a model). */
bool cm_gpu_model_supported_range(const cm_model *m, int l0, int l1, char *why, size_t whylen);
/* How many of layers [l0, l1) from l0 on the device can run (it takes a
 * batch's first layers): l1 - l0, or fewer with the reason in why. */
int cm_gpu_model_supported_prefix(const cm_model *m, int l0, int l1, char *why, size_t whylen);
/* Upload layers [0, n_layers) of m (clamped to the model's) and reserve
 * activations for max_batch tokens and a cache of n_seq sequences of n_ctx
 * positions. m must outlive the result. */
int cm_gpu_model_new(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int n_layers, int max_batch, int n_ctx,
                     int n_seq, char *err, size_t errlen);
/* The same for layers [layer_first, layer_first + n_layers) (clamped): a
 * cluster stage's first layers; it takes a batch whose layer_first is
 * layer_first. */
int cm_gpu_model_new_at(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int layer_first, int n_layers, int max_batch,
                        int n_ctx, int n_seq, char *err, size_t errlen);
/* The same with the K and V cache types the slots hold (cm_gpu_kv_supported;
 * F32 slots hold any of them, as cm_gpu_model_new_at's do; quantized ones
 * take 9/32 (Q8_0) or 5/32 (Q4_0) of the memory). */
int cm_gpu_model_new_kv(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int layer_first, int n_layers, int max_batch,
                        int n_ctx, int n_seq, enum cm_type kv_k, enum cm_type kv_v, char *err, size_t errlen);
/* The same for a tensor-parallel member's slice s of every layer (KV heads
 * [h0, h1), FFN rows [f0, f1); cm_gpu_model_supported_slice): only those
 * rows of Q, K, V, gate and up and those columns of attn_output and
 * ffn_down are uploaded; it takes a batch whose forward args have this
 * slice, computes each layer's two halves there and all-reduces their
 * partial sums through the batch's allreduce (on the host, between two
 * submissions), adding them into the residual as forward.c does. */
int cm_gpu_model_new_slice(cm_gpu_model **out, cm_gpu *g, const cm_model *m, int layer_first, int n_layers,
                           int max_batch, int n_ctx, int n_seq, enum cm_type kv_k, enum cm_type kv_v, cm_slice s,
                           char *err, size_t errlen);
/* Can the device run slice s of layers [l0, l1)? (dense llama-family layers
 * without biases or post norms.) False with the reason. */
bool cm_gpu_model_supported_slice(const cm_model *m, int l0, int l1, cm_slice s, char *why, size_t whylen);
/* Can the device hold this model's KV cache of these types? F32 or F16
 * (both the same), or Q8_0 / Q4_0 for K and V (a head size that is a
 * multiple of 32, not deepseek2's latent cache): quantized on the device
 * as the CPU quantizes (rotated first where it rotates), dequantized in
 * its attention. False with the reason. */
bool cm_gpu_kv_supported(const cm_model *m, enum cm_type kv_k, enum cm_type kv_v, char *why, size_t whylen);
/* Device bytes layer il takes with batches of max_batch tokens, n_ctx
 * positions and n_seq sequences (its repacked weights, its F32 K/V slots
 * and rows), and the fixed part (the other activations): how many layers
 * fit is the caller's sum. */
uint64_t cm_gpu_layer_bytes(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq);
uint64_t cm_gpu_fixed_bytes(const cm_model *m, int max_batch, int n_ctx);
/* cm_gpu_layer_bytes with slots of these K and V cache types (Q8_0/Q4_0 for
 * both: their blocks; else F32), for the KV heads [s.h0, s.h1) of a
 * tensor-parallel slice s (cm_gpu_layer_bytes_kv: every head; the weights
 * are counted whole either way: a slice's are fewer). */
uint64_t cm_gpu_layer_bytes_kv(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq, enum cm_type kv_k,
                               enum cm_type kv_v);
uint64_t cm_gpu_layer_bytes_slice(const cm_model *m, int il, int max_batch, int n_ctx, int n_seq, enum cm_type kv_k,
                                  enum cm_type kv_v, cm_slice s);
/* The one place of the device cache's size: bytes of n_pos positions of one
 * layer's K and V slots for n_kv_heads heads of head_dim, with these cache
 * types (Q8_0 / Q4_0 for both: 9 / 5 words per 32 elements; anything else:
 * F32, as the device holds an F16 cache). The estimates (cumulo info, the
 * planner's GPU node, a node's and a tensor-parallel slice's fitting) all
 * count with it. */
uint64_t cm_gpu_kv_bytes(int n_kv_heads, int head_dim, uint64_t n_pos, enum cm_type kv_k, enum cm_type kv_v);
/* A tensor-parallel group re-formed: the same layers, batch, context,
 * sequences and cache types as *gm, slice s (a no-op when *gm holds s).
 * The old upload is freed first (the device need not hold both). 1: a new
 * upload, 0: *gm held s already; on an error (negative) *gm is NULL (the
 * CPU computes) with the reason in err. */
int cm_gpu_model_reslice(cm_gpu_model **gm, cm_slice s, char *err, size_t errlen);
void cm_gpu_model_free(cm_gpu_model *gm); /* NULL: no-op */
int cm_gpu_model_layers(const cm_gpu_model *gm);
/* Batches this upload took (ran its layers) and declined (left to the CPU:
 * another slice, too many rows, the device lost, ...) since it was made. */
void cm_gpu_model_batches(const cm_gpu_model *gm, uint64_t *took, uint64_t *declined);
const char *cm_gpu_model_device(const cm_gpu_model *gm);

/* Run this batch's first layers on the device: x (b->n rows of n_embd, the
 * embeddings) becomes the residual after them, rope holds the CPU's rotation
 * caches (b->n rows of n_rot, forward.c's), and the layers' K and V are
 * written to the sequences' CPU caches too (so prefix reuse, copies and
 * truncation keep working; a cache whose contents the device has not seen
 * is re-uploaded). Returns the number of layers done (0: this batch is not
 * for the device: a slice, an all-reduce, a stage not starting at layer 0,
 * too many sequences, a cache type it does not hold; the CPU does them all),
 * or a negative CM_E* code (device lost, out of device memory) with err. */
int cm_gpu_forward_layers(cm_gpu_model *gm, const cm_batch *b, const cm_forward_args *a, float *x, const float *rope,
                          char *err, size_t errlen);
/* The same as a cm_offload_fn (model.h) with user = the cm_gpu_model:
 * cm_ctx_set_offload(ctx, cm_gpu_offload, gm). */
int cm_gpu_offload(void *gm, const cm_batch *b, const cm_forward_args *a, float *x, const float *rope, char *err,
                   size_t errlen);

/* A short measurement of the device (vk_probe.c, up to 18 MiB of Q8_0 weights): the
 * memory bandwidth a Q8_0 matrix-vector product streams (bytes/s) and the
 * throughput of a 32-token Q8_0 matrix product (FLOP/s). A cluster node
 * reports both; the planner runs its layers at these speeds. */
int cm_gpu_probe(cm_gpu *g, double *bw, double *flops, char *err, size_t errlen);

/* For tests: y[j * rows + i] = dot(W row i, x_j) for W (a whole matrix,
 * F32/F16/BF16/Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/MXFP4/IQ4_NL/Q2_K..Q6_K/IQ4_XS/IQ2_XXS/IQ3_XXS/IQ1_S), n_tok rows of F32 activations; and RMS norm, RoPE
 * (neox or not, cache as forward.c's) and silu(g) * u, each on the device. */
int cm_gpu_test_matmul(cm_gpu *g, const cm_tensor *W, const float *x, int n_tok, float *y, char *err, size_t errlen);
int cm_gpu_test_rmsnorm(cm_gpu *g, const float *x, const float *w, int n, int rows, float eps, float *y, char *err,
                        size_t errlen);
int cm_gpu_test_rope(cm_gpu *g, float *x, const float *cache, int n_rot, int D, int nh, int n_tok, bool neox, char *err,
                     size_t errlen);
/* For tests: how many rows of positions [0, n_past) of a quantized cache
 * kv (every device layer, K and V, each head) differ in the device's slot
 * from the CPU's blocks (0: the same bits), or a negative CM_E* code. */
int cm_gpu_test_kv_diff(cm_gpu_model *gm, const cm_kv *kv, char *err, size_t errlen);
int cm_gpu_test_silu(cm_gpu *g, float *gt, const float *u, int n, char *err, size_t errlen);

#endif
