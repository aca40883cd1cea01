/*
 * vk_int.h: vk.c's primitives for vk_model.c and its neighbours (private to
 * src/gpu; still no Vulkan types, so they compile where the Vulkan headers
 * are absent).
 * Recording: cm_vk_begin, then dispatches and copies (each followed by a
 * full barrier), then cm_vk_submit (waits). All under the caller's hold of
 * cm_vk_lock.
 */
#ifndef CM_VK_INT_H
#define CM_VK_INT_H

#include "gpu.h"

typedef struct cm_vk_buf cm_vk_buf;
typedef struct cm_vk_set cm_vk_set;

enum cm_vk_pipe {
    VKP_MM_F32,
    VKP_MM_F16,
    VKP_MM_Q8_0,
    VKP_MM_Q4_0,
    VKP_RMSNORM,
    VKP_ROPE,
    VKP_KVSTORE,
    VKP_ATTN,
    VKP_SILU,
    VKP_Q8ACT,
    VKP_BIAS,
    VKP_MM_Q2_K,
    VKP_MM_Q3_K,
    VKP_MM_Q4_K,
    VKP_MM_Q5_K,
    VKP_MM_Q6_K,
    VKP_Q8KACT,
    VKP_MM_Q5_0,
    VKP_GELU,
    VKP_MM_Q4_1,
    VKP_MM_Q5_1,
    VKP_Q81ACT,
    VKP_MOE_ROUTE,
    VKP_MOE_SUM,
    VKP_MM_MXFP4,
    VKP_MM_IQ4_NL,
    VKP_MM_IQ4_XS,
    VKP_MM_IQ2_XXS,
    VKP_MM_IQ3_XXS,
    VKP_MM_IQ1_S,
    VKP_MM_BF16,
    VKP_SWIGLU_OAI,
    VKP_MLA_ATTN,
    VKP_LATROUND,
    VKP_KVQ,
    VKP_FWHT,
    VKP_COUNT
};
enum cm_vk_mem { CM_VK_DEVICE, CM_VK_HOST }; /* device-local; host-visible (io) */

cm_vk_buf *cm_vk_buf_new(cm_gpu *g, uint64_t bytes, enum cm_vk_mem kind, char *err, size_t errlen);
void cm_vk_buf_free(cm_gpu *g, cm_vk_buf *b);
void *cm_vk_buf_map(cm_vk_buf *b); /* the persistent mapping, or NULL (not host-visible) */
/* Copy n bytes into dst at off (through a staging buffer when dst is not
 * host-visible). Not inside a recording. */
int cm_vk_upload(cm_gpu *g, cm_vk_buf *dst, uint64_t off, const void *src, uint64_t n, char *err, size_t errlen);
/* A descriptor set binding w, a and kv (any may repeat). */
cm_vk_set *cm_vk_set_new(cm_gpu *g, cm_vk_buf *w, cm_vk_buf *a, cm_vk_buf *kv, char *err, size_t errlen);
void cm_vk_set_free(cm_gpu *g, cm_vk_set *s);

void cm_vk_lock(cm_gpu *g);
void cm_vk_unlock(cm_gpu *g);
int cm_vk_begin(cm_gpu *g, char *err, size_t errlen);
void cm_vk_dispatch(cm_gpu *g, enum cm_vk_pipe p, cm_vk_set *s, const void *push, uint32_t push_bytes, uint32_t gx,
                    uint32_t gy);
void cm_vk_copy(cm_gpu *g, cm_vk_buf *src, uint64_t src_off, cm_vk_buf *dst, uint64_t dst_off, uint64_t n);
int cm_vk_submit(cm_gpu *g, char *err, size_t errlen);
uint64_t cm_vk_max_range(const cm_gpu *g); /* the largest storage buffer binding */
/* Before a forward pass's submission: CUMULO_TEST_GPU_FAULT's injected
 * failure (the error a lost device or a full memory gives), or 0. */
int cm_vk_fault(cm_gpu *g, char *err, size_t errlen);

/* A whole weight matrix (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4, IQ4_NL, Q2_K..Q6_K,
 * IQ4_XS, IQ2_XXS, IQ3_XXS, IQ1_S) in the shaders' layout (vk_pack.c): F32/F16/BF16 rows as in the
 * file; Q8_0/Q4_0/Q5_0 (MXFP4, IQ4_NL as Q4_0) all block scales as F32, then the blocks' quants
 * (8 / 4 / 5 words each, Q5_0's qh first; Q4_1/Q5_1 the mins after the scales); the K-quants',
 * IQ4_XS's and the grid types' blocks as in the file, each padded to whole words. A grid type's
 * matrix (a stacked expert tensor: once, before its first expert) starts with its grid,
 * cm_vk_grid_words(type) words written by cm_vk_pack_grid; cm_vk_packed_words does not count it. */
uint64_t cm_vk_packed_words(const cm_tensor *W);
void cm_vk_pack(const cm_tensor *W, uint32_t *dst);
uint32_t cm_vk_grid_words(enum cm_type t); /* 0: not a grid type */
void cm_vk_pack_grid(enum cm_type t, uint32_t *dst);
/* Can the shaders take W (its type and shape)? False with the reason. */
bool cm_vk_type_ok(const cm_tensor *W, char *why, size_t whylen, const char *name);
/* The matmul pipeline of a weight type, and the activations it reads:
 * CM_TYPE_F32 (as they are; F16 and BF16 round them themselves), CM_TYPE_Q8_0 or
 * CM_TYPE_Q8_1 (q8act first) or CM_TYPE_Q8_K (q8kact first); their words
 * per token row; the pipeline converting to them. */
enum cm_vk_pipe cm_vk_mm_pipe(enum cm_type t);
enum cm_type cm_vk_act_type(enum cm_type t);
uint32_t cm_vk_act_words(enum cm_type act, uint32_t K);
enum cm_vk_pipe cm_vk_act_pipe(enum cm_type act);

#endif
