/*
 * tensor: element types, their block layouts, and tensor views.
 *
 * Type numbers and block layouts are GGUF's (ggml's) so that a tensor's bytes
 * in the file are used in place. A tensor is a view {type, shape, strides,
 * data}: it never owns its data (weights stay in the mmap).
 * This module must never include anything above L0 (base only).
 */
#ifndef CM_TENSOR_H
#define CM_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* GGUF/ggml type ids. Only the ones with a name below are understood; a
 * name does not mean the kernels support the type (cm_kernels_supports):
 * the GGUF reader knows every layout so that a file it cannot run fails with
 * the type's name, not a number. */
enum cm_type {
    CM_TYPE_F32 = 0,
    CM_TYPE_F16 = 1,
    CM_TYPE_Q4_0 = 2,
    CM_TYPE_Q4_1 = 3,
    CM_TYPE_Q5_0 = 6,
    CM_TYPE_Q5_1 = 7,
    CM_TYPE_Q8_0 = 8,
    CM_TYPE_Q8_1 = 9,
    CM_TYPE_Q2_K = 10,
    CM_TYPE_Q3_K = 11,
    CM_TYPE_Q4_K = 12,
    CM_TYPE_Q5_K = 13,
    CM_TYPE_Q6_K = 14,
    CM_TYPE_Q8_K = 15,
    CM_TYPE_IQ2_XXS = 16,
    CM_TYPE_IQ2_XS = 17,
    CM_TYPE_IQ3_XXS = 18,
    CM_TYPE_IQ1_S = 19,
    CM_TYPE_IQ4_NL = 20,
    CM_TYPE_IQ3_S = 21,
    CM_TYPE_IQ2_S = 22,
    CM_TYPE_IQ4_XS = 23,
    CM_TYPE_I8 = 24,
    CM_TYPE_I16 = 25,
    CM_TYPE_I32 = 26,
    CM_TYPE_I64 = 27,
    CM_TYPE_F64 = 28,
    CM_TYPE_IQ1_M = 29,
    CM_TYPE_BF16 = 30,
    CM_TYPE_TQ1_0 = 34,
    CM_TYPE_TQ2_0 = 35,
    CM_TYPE_MXFP4 = 39,
    CM_TYPE_NVFP4 = 40,
    CM_TYPE_COUNT = 41 /* upper bound of ids we name (table size) */
};

typedef uint16_t cm_f16;  /* IEEE half bits */
typedef uint16_t cm_bf16; /* bfloat16 bits */

#define CM_QK4_0 32
#define CM_QK4_1 32
#define CM_QK5_0 32
#define CM_QK5_1 32
#define CM_QK8_0 32
#define CM_QK8_1 32
#define CM_QK_K 256
#define CM_K_SCALE_SIZE 12
#define CM_QK4_NL 32
#define CM_QK_MXFP4 32

/* Block layouts, byte-identical to GGUF. Fields are only ever read from
 * mmapped data that the GGUF reader has bounds-checked. */
// clang-format off
typedef struct { cm_f16 d; uint8_t qs[CM_QK4_0 / 2]; } cm_block_q4_0;                 /* 18 B */
typedef struct { cm_f16 d, m; uint8_t qs[CM_QK4_1 / 2]; } cm_block_q4_1;              /* 20 B */
typedef struct { cm_f16 d; uint8_t qh[4]; uint8_t qs[CM_QK5_0 / 2]; } cm_block_q5_0;  /* 22 B */
typedef struct { cm_f16 d, m; uint8_t qh[4]; uint8_t qs[CM_QK5_1 / 2]; } cm_block_q5_1; /* 24 B */
typedef struct { cm_f16 d; int8_t qs[CM_QK8_0]; } cm_block_q8_0;                      /* 34 B */
typedef struct { cm_f16 d, s; int8_t qs[CM_QK8_1]; } cm_block_q8_1;                   /* 36 B: s = d * sum(qs) */
// clang-format on
typedef struct {
    cm_f16 d, dmin;
    uint8_t scales[CM_K_SCALE_SIZE];
    uint8_t qs[CM_QK_K / 2];
} cm_block_q4_k; /* 144 B */
typedef struct {
    cm_f16 d, dmin;
    uint8_t scales[CM_K_SCALE_SIZE];
    uint8_t qh[CM_QK_K / 8];
    uint8_t qs[CM_QK_K / 2];
} cm_block_q5_k; /* 176 B */
typedef struct {
    uint8_t ql[CM_QK_K / 2];
    uint8_t qh[CM_QK_K / 4];
    int8_t scales[CM_QK_K / 16];
    cm_f16 d;
} cm_block_q6_k; /* 210 B */
/* Q2_K: 16 sub-blocks of 16, value d*(sc&15)*q - dmin*(sc>>4), q 2 bits.
 * qs: per 128-element half, 32 bytes; element 32k+l of the half is bits
 * 2k..2k+1 of byte l. */
typedef struct {
    uint8_t scales[CM_QK_K / 16];
    uint8_t qs[CM_QK_K / 4];
    cm_f16 d, dmin;
} cm_block_q2_k; /* 84 B */
/* Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (offset 32), value
 * d*(sc-32)*(q - (hmask bit ? 0 : 4)); qs as Q2_K; element e's high bit is
 * bit e/32 of hmask[e%32]. Scales: low nibbles in bytes 0-7 (sub-blocks 0-7
 * low, 8-15 high), top 2 bits in bytes 8-11 (bits 2(j/4).. of byte 8+j%4). */
typedef struct {
    uint8_t hmask[CM_QK_K / 8];
    uint8_t qs[CM_QK_K / 4];
    uint8_t scales[12];
    cm_f16 d;
} cm_block_q3_k; /* 110 B */
/* IQ4_NL: 32 4-bit indices into the non-linear table cm_kvalues_iq4nl. */
typedef struct {
    cm_f16 d;
    uint8_t qs[CM_QK4_NL / 2];
} cm_block_iq4_nl; /* 18 B */
/* IQ4_XS: IQ4_NL over 8 sub-blocks of 32 with 6-bit scales (offset 32): low
 * nibbles in scales_l, top 2 bits of sub-block i at bits 2i.. of scales_h. */
typedef struct {
    cm_f16 d;
    uint16_t scales_h;
    uint8_t scales_l[CM_QK_K / 64];
    uint8_t qs[CM_QK_K / 2];
} cm_block_iq4_xs; /* 136 B */
/* MXFP4 (OCP microscaling): E8M0 exponent e (scale 2^(e-127)) and 32 E2M1
 * values; ggml stores them as doubled integers (cm_kvalues_mxfp4) and
 * halves the scale instead. */
typedef struct {
    uint8_t e;
    uint8_t qs[CM_QK_MXFP4 / 2];
} cm_block_mxfp4; /* 17 B */
/* IQ2_XXS: per 32 elements 8 bytes: 4 grid indices (8 values each from
 * cm_iq2xxs_grid), then a u32 holding 4 x 7 sign bits (8th by parity) and a
 * 4-bit scale in its top bits; value d * (0.5 + s) / 4 * grid * sign. */
typedef struct {
    cm_f16 d;
    uint16_t qs[CM_QK_K / 8];
} cm_block_iq2_xxs; /* 66 B */
/* IQ3_XXS: 64 grid indices (4 values each, cm_iq3xxs_grid), then per 32
 * elements a u32 of 4 x 7 sign bits and a 4-bit scale; d * (0.5 + s) / 2. */
typedef struct {
    cm_f16 d;
    uint8_t qs[3 * CM_QK_K / 8];
} cm_block_iq3_xxs; /* 98 B */
/* IQ1_S: per 32 elements 4 low index bytes (qs) and a u16 qh: 4 x 3 high
 * index bits, a 3-bit scale and a delta sign; value
 * d * (2s + 1) * (grid + delta), grid in {-1, 0, 1} (cm_iq1s_grid). */
typedef struct {
    cm_f16 d;
    uint8_t qs[CM_QK_K / 8];
    uint16_t qh[CM_QK_K / 32];
} cm_block_iq1_s; /* 50 B */
typedef struct {
    float d;
    int8_t qs[CM_QK_K];
    int16_t bsums[CM_QK_K / 16];
} cm_block_q8_k; /* 292 B */

/* Format data of the non-linear 4-bit types (equal to ggml's tables). */
extern const int8_t cm_kvalues_iq4nl[16];
extern const int8_t cm_kvalues_mxfp4[16];

/* MXFP4's E8M0 scale, halved (the values are doubled): 2^(e-128) as a float,
 * exact for every e (e < 2 gives the subnormals 2^-128 and 2^-127). */
static inline float cm_e8m0_to_f32_half(uint8_t e) {
    uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Static facts about a type. */
typedef struct cm_type_traits {
    const char *name; /* "q4_0"; NULL for ids we do not know */
    int block_size;   /* elements per block (1 for plain types) */
    size_t type_size; /* bytes per block */
    bool quantized;
    enum cm_type vec_dot_type; /* activation type of this type's dot product */
} cm_type_traits;

/* Traits for a type id; returns NULL for unknown ids (including ids >= COUNT). */
const cm_type_traits *cm_type_traits_of(uint32_t type);
const char *cm_type_name(uint32_t type); /* "q4_0" or "unknown" */
/* Parse "q4_0", "Q4_0", "f16", ... Returns -1 if unknown. */
int cm_type_from_name(const char *name);
/* The alignment a tensor's data must have for the kernels to read it (its
 * widest field: 4 for f32/i32/q8_k, 1 for byte-only blocks like mxfp4, else
 * 2). GGUF lets a file choose general.alignment = 1, so a reader's tensor may
 * lack it: callers check before handing data to a kernel. */
size_t cm_type_align(enum cm_type t);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size. */
size_t cm_row_size(enum cm_type t, int64_t n);

/* Half/bfloat conversions (exact round-to-nearest-even, like ggml's scalar path). */
float cm_f16_to_f32(cm_f16 h);
cm_f16 cm_f32_to_f16(float f);
static inline float cm_bf16_to_f32(cm_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
cm_bf16 cm_f32_to_bf16(float f);

/* A view of a tensor. ne[0] is the row length (contiguous); nb[] byte strides.
 * For quantized types nb[0] is the block size in bytes and ne[0] must be a
 * multiple of the block size. */
#define CM_MAX_DIMS 4
typedef struct cm_tensor {
    enum cm_type type;
    int n_dims;
    int64_t ne[CM_MAX_DIMS];
    size_t nb[CM_MAX_DIMS];
    void *data;
    const char *name;
} cm_tensor;

/* Fill a contiguous view. */
void cm_tensor_init(cm_tensor *t, enum cm_type type, int n_dims, const int64_t *ne, void *data, const char *name);
int64_t cm_tensor_nelements(const cm_tensor *t);
size_t cm_tensor_nbytes(const cm_tensor *t);
/* Pointer to row i of a 2-D view (i in [0, ne[1])). */
static inline void *cm_tensor_row(const cm_tensor *t, int64_t i) { return (char *)t->data + (size_t)i * t->nb[1]; }
/* Rows [r0, r1) of a 2-D view; columns [c0, c1) of every row (c0 on a block
 * boundary, the row stride kept). An absent tensor (no data) stays absent. */
static inline cm_tensor cm_tensor_rows(const cm_tensor *w, int64_t r0, int64_t r1) {
    cm_tensor t = *w;
    if (w->data) t.data = (char *)w->data + (size_t)r0 * w->nb[1];
    t.ne[1] = r1 - r0;
    return t;
}
static inline cm_tensor cm_tensor_cols(const cm_tensor *w, int64_t c0, int64_t c1) {
    cm_tensor t = *w;
    if (w->data) t.data = (char *)w->data + cm_row_size(w->type, c0);
    t.ne[0] = c1 - c0;
    return t;
}

#endif
