/*
 * kernels: the numeric primitives of the forward pass, per type and per ISA.
 *
 * Each op has a plain-C scalar reference (the spec, in *_ref.c files) and
 * optional per-ISA versions (*_avx2.c, *_avx512.c, *_neon.c, compiled with
 * their own flags). One dispatch table, filled once at start-up from runtime
 * CPU detection (and capped by CUMULO_ISA=scalar|avx2|avx512|neon), picks
 * them. Kernels never include model, net, proto or cluster code, never
 * allocate, and never touch a socket or file.
 *
 * Activation quantization follows ggml so that dot products agree with
 * llama.cpp: a weight type's dot product takes activations already converted
 * to its vec_dot_type (Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for
 * Q4_1/Q5_1, Q8_K for K-quants, IQ4_XS, IQ2_XXS, IQ3_XXS and IQ1_S, F16 for
 * F16, BF16 for BF16, F32 for F32), converted the way
 * llama.cpp's x86 build converts them (quants_ref.c says exactly how).
 *
 * Usage: k = cm_kernels_get() once; per weight W and activation rows x:
 *   vt = cm_type_traits_of(W->type)->vec_dot_type;
 *   k->from_float[vt](x_j, xq + j * cm_row_size(vt, n), n) for each token j;
 *   cm_matmul_rows(k, W, xq, cm_row_size(vt, n), n_tok, y, ldy, r0, r1) per thread.
 * Tables are immutable after the first cm_kernels_* call; every function is
 * reentrant. Row lengths must be multiples of the type's block size.
 *
 * Batch invariance (a contract of every table): gemm's result for a
 * (row, token) is bit-identical to that table's vec_dot of the same weight
 * row and activation row, for any n_tok, any position of the token in the
 * batch and any row slice [r0, r1). So a request gets the same logits alone,
 * batched with others or after prompt-prefix reuse. An ISA file keeps it by
 * running gemm and vec_dot through one shared tile whose float accumulation
 * order per token does not depend on how many tokens share the pass, or by a
 * gemm that performs that tile's exact operations on repacked operands
 * (tests/unit/test_kernels_invariant.c). Tables of different ISAs may still
 * differ from each other in the last bits (isa.h).
 */
#ifndef CM_KERNELS_H
#define CM_KERNELS_H

#include "../tensor/tensor.h"

#include <stdint.h>

/* s = dot(x[0:n], y[0:n]); x has the weight type, y its vec_dot_type. */
typedef void (*cm_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y);
/* Convert n floats into a type (activations; weights via cm_quantize_rows). */
typedef void (*cm_from_float_fn)(const float *x, void *y, int64_t n);
/* Dequantize n elements. */
typedef void (*cm_to_float_fn)(const void *x, float *y, int64_t n);
/* Matrix x matrix: for rows i in [r0, r1) of W (row stride w_stride bytes,
 * k elements each) and activation rows j in [0, n_tok) (stride x_stride bytes,
 * in vec_dot_type): y[j * ldy + i] = dot(W_i, x_j). NULL = use vec_dot. */
typedef void (*cm_gemm_fn)(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                           int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok);

/* Attention's value side (model/attn.c): acc[0:D] += w[j] * row j of V for
 * j in [0, n), rows of D elements of the table's type at v + j * v_row, in
 * j order per element (a SIMD version may fuse the multiply-add). */
typedef void (*cm_attn_v_fn)(int64_t D, const void *v, size_t v_row, const float *w, int n, float *acc);
/* An F16 V cache's one-query step, as ggml's flash attention: if ms != 1,
 * acc[i] = f16(f32(acc[i]) * ms); then acc[i] = f16(fma(f32(v[i]), w,
 * f32(acc[i]))) (acc and v: D F16 values). Bit-identical on every ISA. */
typedef void (*cm_attn_f16_step_fn)(int64_t D, void *acc, const void *v, float ms, float w);

/* Decode attention over KV blocks (model/attn_split.c), nq queries of one KV
 * head at once. attn_qk: s[r * ld + j] = scale * dot(q_r, K_j) for r in
 * [0, nq), j in [0, n); q: nq rows of D floats (already rounded as K's
 * vec_dot_type would round them), K rows of the table's type at k + j * k_row.
 * attn_vm: acc[r * D + i] += w[r * ld + j] * V_j[i] in j order per element.
 * attn_exp: s[j] = expf(s[j] - m) for j in [0, n), returning their sum. SIMD
 * versions reorder the sums and approximate expf to about 1 ulp: within a
 * table the results depend only on the inputs, never on a thread count. */
typedef void (*cm_attn_qk_fn)(int64_t D, int nq, const float *q, const void *k, size_t k_row, int n, float scale,
                              float *s, int ld);
typedef void (*cm_attn_vm_fn)(int64_t D, int nq, const void *v, size_t v_row, const float *w, int ld, int n,
                              float *acc);
typedef float (*cm_attn_exp_fn)(int n, float *s, float m);
/* Prefill's forms (model/attn_split.c, cm_attn_multi: many queries share
 * each K/V tile), optional, for heads of at most CM_ATTN_MANY_MAXD elements:
 * attn_qk_many gives attn_qk's scores bit for bit (same table, same type).
 * attn_vt_many, over a transposed V (element i of position j at v + i *
 * v_row + j * the type's size; n <= CM_ATTN_MANY_MAXN): acc[r * D + i] +=
 * the sum over the first n & ~15 positions as the same table's attn_qk sums
 * with the weights as its queries and V's element rows as its rows (times a
 * scale of 1), then the last n % 16 positions in order, each product rounded
 * before its add. */
enum { CM_ATTN_MANY_MAXD = 256, CM_ATTN_MANY_MAXN = 256 };

/* Indexed by type id; NULL where the type has no such op. */
typedef struct cm_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "neon" */
    /* weight types: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K
     * IQ4_NL IQ4_XS MXFP4 IQ2_XXS IQ3_XXS IQ1_S */
    cm_vec_dot_fn vec_dot[CM_TYPE_COUNT];
    cm_from_float_fn from_float[CM_TYPE_COUNT]; /* activation types: F32 F16 BF16 Q8_0 Q8_1 Q8_K */
    cm_to_float_fn to_float[CM_TYPE_COUNT];     /* the weight types plus Q8_1 and Q8_K */
    cm_gemm_fn gemm[CM_TYPE_COUNT];             /* optional, per weight type */
    /* Optional decode path (n_tok == 1, x_stride/ldy unused): the rows in
     * whatever order and with whatever prefetching suits this ISA's memory
     * system, each row bit-identical to vec_dot. NULL = vec_dot per row with
     * the driver's software prefetch (cm_matmul_rows). */
    cm_gemm_fn gemv[CM_TYPE_COUNT];
    /* Optional decode path over weights repacked at load (repack.c; w is the
     * repacked copy, same row stride): each row bit-identical to vec_dot on
     * the file's bytes. Non-NULL makes cm_repack_add repack type t. */
    cm_gemm_fn gemv_packed[CM_TYPE_COUNT];
    /* Optional: the table's own repacked layout of type t (nb blocks of a
     * row), which its gemv_packed and gemm_packed read instead of the type's
     * shared one (cm_repack_row); a copy is read only by the table that made
     * it. The avx2 table's q4_k / q5_k / q6_k "pairs" and "q8_0 lanes" (repack.c). */
    void (*repack[CM_TYPE_COUNT])(const void *src, void *dst, int64_t nb);
    cm_attn_v_fn attn_v[CM_TYPE_COUNT]; /* KV cache types F32 F16 Q8_0 Q4_0 (attn_*.c) */
    cm_attn_f16_step_fn attn_f16_step;  /* (attn_*.c) */
    /* q.k of two F16 rows in the lane order of ggml's AVX-512 F16 dot (64
     * lanes of fused multiply-adds, lanes l + l+32, l + l+16, then a halving
     * tree over 16; a tail of < 64 elements added in double). Bit-identical
     * on every ISA. */
    cm_vec_dot_fn attn_f16_dot;
    cm_attn_qk_fn attn_qk[CM_TYPE_COUNT]; /* KV cache types F32 F16 Q8_0 Q4_0 (attn_*.c) */
    cm_attn_vm_fn attn_vm[CM_TYPE_COUNT];
    cm_attn_exp_fn attn_exp;
    cm_attn_qk_fn attn_qk_many[CM_TYPE_COUNT]; /* F32 F16 (attn_tile_*.c) */
    cm_attn_vm_fn attn_vt_many[CM_TYPE_COUNT]; /* F32 F16: the transposed V */
    /* Optional batched decode / small-batch gemm (1 < n_tok <= gemm_packed_max)
     * over the same repacked weights: each (row, token) bit-identical to vec_dot
     * on the file's bytes. Decoding B sequences reads the weights once per step
     * for all B; this makes the work per weight byte not grow with B. */
    cm_gemm_fn gemm_packed[CM_TYPE_COUNT];
    int gemm_packed_max; /* most tokens gemm_packed is used for (beyond: gemm); CM_GEMM_PACKED_ALL: every batch */
} cm_kernels;

/* gemm_packed_max of a table whose packed gemm takes every batch size: its
 * pace has no row bound (cm_engine_info's pass_rows_fast is then 0). */
enum { CM_GEMM_PACKED_ALL = 1 << 30 };

/* The best table for this CPU (respecting CUMULO_ISA). Thread-safe; never NULL. */
const cm_kernels *cm_kernels_get(void);
/* The scalar reference table (the spec). */
const cm_kernels *cm_kernels_ref(void);
/* A specific ISA's table, or NULL when this CPU/binary lacks it (for tests). */
const cm_kernels *cm_kernels_for(const char *isa);

/* AMX (gemm_amx.c, gemm_kq45_amx.c, gemm_kq6_amx.c): "" when the avx512
 * table's q4_0, q8_0, q4_k, q5_k and q6_k prefill gemms use AMX tiles (from
 * the token count where each wins, cm_kernels_amx_path), else why not ("CUMULO_AMX=0", or what the
 * CPU or OS lacks). Same bits either way (batch invariance). */
const char *cm_kernels_amx_why(void);
/* For tests and kbench: with amx, that AMX gemm of weight type t for every
 * n_tok >= 1 and rows of at most 16384 elements (no hand-over to another
 * gemm), whatever CUMULO_AMX says, or NULL where this CPU, OS or build has
 * no AMX-INT8 or t has none; without, the avx512 table's gemm of t as
 * CUMULO_AMX=0 has it (NULL: no avx512 table, or no gemm). */
cm_gemm_fn cm_kernels_amx_gemm(enum cm_type t, bool amx);
/* For tests and benches: the AMX gemm of type t over the file's layout or
 * (packed) the repacked one (cm_repack_row) for every n_tok (as above) in
 * *amx, the avx512 table's gemm (gemm_packed) it takes over from in *prev
 * (as CUMULO_AMX=0 has it); returns the fewest tokens the table hands to
 * AMX for rows of k elements, 0 (and *amx NULL) where there is no such AMX
 * path here. */
int cm_kernels_amx_path(enum cm_type t, bool packed, int64_t k, cm_gemm_fn *amx, cm_gemm_fn *prev);
/* The AMX gemm calls this thread has made (0 without AMX): which path a
 * batch took, for tests. */
uint64_t cm_kernels_amx_calls(void);

/* Is type t usable as a weight type (has a dot product, a dequantizer and an
 * activation converter for its vec_dot_type)? False for unknown ids. */
bool cm_kernels_supports(enum cm_type t);

/* Quantize nrows rows of n_per_row floats into weight type t with ggml's
 * reference quantizers (no importance matrix), so the bytes equal what
 * llama.cpp writes: F32 (copy), F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4 (not IQ2_XXS, IQ3_XXS,
 * IQ1_S: ggml makes those only with an importance matrix). Used by synth
 * and tests, not in the token loop. Returns
 * bytes written (nrows * cm_row_size(t, n_per_row)), or 0 if t is not one of
 * those or n_per_row is not a multiple of its block size. */
size_t cm_quantize_rows(enum cm_type t, const float *src, void *dst, int64_t nrows, int64_t n_per_row);

/* Matrix-vector / matrix-matrix product for one slice of rows, the op the
 * model calls for every weight: y[j * ldy + i] = dot(W row i, x_j) for i in
 * [r0, r1), j in [0, n_tok). xq holds the activations already converted to
 * W's vec_dot_type (row stride xq_stride). Uses gemm when present and
 * n_tok > 1, gemv when present and n_tok == 1; when W was repacked (below),
 * gemv_packed for one token and gemm_packed for up to gemm_packed_max tokens.
 * Callers split [0, rows) across threads. W->type must be one
 * cm_kernels_supports() accepts (anything else is a programmer error: the
 * loader rejects such files first). */
void cm_matmul_rows(const cm_kernels *k, const cm_tensor *W, const void *xq, size_t xq_stride, int64_t n_tok, float *y,
                    int64_t ldy, int64_t r0, int64_t r1);
/* cm_matmul_rows for one token over many row ranges of the same W (a decode
 * matmul's shared loop, cm_pool_loop): cm_gemv_plan_of looks the repacked
 * copy up once (a read lock and a search per call otherwise), then
 * cm_gemv_plan_rows computes rows [r0, r1) exactly as cm_matmul_rows(k, W,
 * xq, xq_stride, 1, y, ldy, r0, r1) would. */
typedef struct {
    const cm_kernels *k;
    const cm_tensor *W;
    cm_gemm_fn fn; /* NULL: cm_matmul_rows */
    const void *w;
    size_t ws;
    bool packed; /* fn is gemv_packed (on the repacked copy) */
} cm_gemv_plan;
cm_gemv_plan cm_gemv_plan_of(const cm_kernels *k, const cm_tensor *W);
void cm_gemv_plan_rows(const cm_gemv_plan *p, const void *xq, size_t xq_stride, float *y, int64_t ldy, int64_t r0,
                       int64_t r1);

/* ---- weights repacked at load (repack.c) ----
 * cm_repack_add: for each of the n tensors (whole weight matrices, or
 * column views of them: columns on block boundaries, the row stride kept)
 * whose type table k has a gemv_packed for, make a repacked copy, recorded
 * under owner; CUMULO_REPACK=0 turns it off. The copies are found again by
 * address by cm_matmul_rows (row views of what was added included; a column
 * view only when that view itself was added: otherwise it reads the file's
 * bytes). cm_repack_drop frees owner's copies (call it before the tensors'
 * bytes go away). Thread-safe; the copies cost the views' size in memory.
 * Returns 0 or CM_ENOMEM. */
enum { CM_REPACK_MAX_K = 32768 };      /* longest row repacked */
enum { CM_REPACK_MAX_K_Q8_0 = 16384 }; /* longest q8_0 row (the avx2 table's kernels hold a row's token on the stack) */
int cm_repack_add(const void *owner, const cm_kernels *k, const cm_tensor *const *ws, int n, char *err, size_t errlen);
void cm_repack_drop(const void *owner);
/* Bytes of the copy cm_repack_add would make of W under table k (0: none),
 * and bytes of owner's copies now. */
size_t cm_repack_size(const cm_kernels *k, const cm_tensor *W);
size_t cm_repack_bytes(const void *owner);
/* The repacked copy of W's first row, or NULL (not repacked, or a column
 * view that was not added itself); *stride (when not NULL) is the copy's
 * bytes per row: W->nb[1] for whole tensors, less for a column view. */
const void *cm_repack_find(const cm_tensor *W, size_t *stride);
/* The same, only where that copy is the one resident (cm_repack_give_back
 * gave the file's pages under it back): cm_matmul_rows then reads it for
 * every n_tok (gemm_packed beyond gemm_packed_max too). */
const void *cm_repack_find_alone(const cm_tensor *W, size_t *stride);
/* One copy of the weights: for owner's whole-tensor copies of the types
 * whose gemv and gemm both read the repacked layout under table k
 * (gemm_packed set), give the file's pages under them back
 * (cm_file_give_back; f: the file they were read from). The bytes at the
 * tensors' addresses stay the file's (faulted in again if read). Returns
 * the bytes given back. */
struct cm_mapped_file;
size_t cm_repack_give_back(const void *owner, const cm_kernels *k, const struct cm_mapped_file *f);
/* The "q4_0 lanes" layout of nb blocks and the "q4_k lanes" and "q5_k
 * lanes" and "q6_k lanes" layouts of nb super-blocks (repack.c says what
 * they are); cm_repack_row: the layout of one row of ne0 elements of type t
 * (q4_0, q4_k, q5_k or q6_k; f16 is laid out by row pair). */
void cm_repack_q4_0_lanes(const void *src, void *dst, int64_t nb);
void cm_repack_q4_k_lanes(const void *src, void *dst, int64_t nb);
void cm_repack_q5_k_lanes(const void *src, void *dst, int64_t nb);
void cm_repack_q6_k_lanes(const void *src, void *dst, int64_t nb);
void cm_repack_row(enum cm_type t, const void *src, void *dst, int64_t ne0);
/* The avx2 table's "q4_k pairs", "q5_k pairs" and "q6_k pairs" (repack.c),
 * and the layout table k repacks one row of type t in (k->repack[t], else
 * cm_repack_row). */
void cm_repack_q4_k_pairs(const void *src, void *dst, int64_t nb);
void cm_repack_q5_k_pairs(const void *src, void *dst, int64_t nb);
void cm_repack_q6_k_pairs(const void *src, void *dst, int64_t nb);
/* The avx2 table's "q8_0 lanes" (repack.c) of nb blocks. */
void cm_repack_q8_0_lanes(const void *src, void *dst, int64_t nb);
void cm_repack_row_for(const cm_kernels *k, enum cm_type t, const void *src, void *dst, int64_t ne0);
/* The "f16 pairs" layout of two F16 rows a, b (b NULL: zeros) of k
 * elements: 2 row sizes at dst (repack.c says what it is). */
void cm_repack_f16_pair(const void *a, const void *b, void *dst, int64_t k);

#endif
