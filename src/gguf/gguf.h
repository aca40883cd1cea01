/*
 * gguf: parse, validate and write GGUF v2/v3 files. No model knowledge.
 *
 * The reader works over (const uint8_t *p, size_t n) — usually an mmap — and
 * checks every count, string length, array length, offset, alignment and
 * tensor extent against n with overflow-safe arithmetic before use or
 * allocation. Corrupt input is an error code plus a message, never an assert
 * or a crash. A parsed cm_gguf points into the caller's bytes (string values,
 * array elements, tensor data) and owns copies of keys and tensor names.
 * Not thread-safe while parsing; a parsed cm_gguf may be read from any thread.
 */
#ifndef CM_GGUF_H
#define CM_GGUF_H

#include "../base/base.h"
#include "../os/os.h"
#include "../tensor/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGUF metadata value types (file values). */
enum cm_gguf_vtype {
    CM_GGUF_U8 = 0,
    CM_GGUF_I8 = 1,
    CM_GGUF_U16 = 2,
    CM_GGUF_I16 = 3,
    CM_GGUF_U32 = 4,
    CM_GGUF_I32 = 5,
    CM_GGUF_F32 = 6,
    CM_GGUF_BOOL = 7,
    CM_GGUF_STRING = 8,
    CM_GGUF_ARRAY = 9,
    CM_GGUF_U64 = 10,
    CM_GGUF_I64 = 11,
    CM_GGUF_F64 = 12,
    CM_GGUF_VTYPE_COUNT = 13
};
/* "u8", "string", "array", ... or "unknown". */
const char *cm_gguf_vtype_name(uint32_t t);
/* Bytes of one value of a fixed-size type t; 0 for string, array or unknown. */
size_t cm_gguf_vtype_size(uint32_t t);

/* Limits applied before allocation (a hostile header cannot make us allocate
 * more than these, nor more than its own size could describe; real files are
 * far below them). */
#define CM_GGUF_MAX_TENSORS (1u << 20)
#define CM_GGUF_MAX_KV (1u << 20)
#define CM_GGUF_MAX_KEY 65536 /* key length in bytes */
#define CM_GGUF_MAX_STRING (1u << 30)
#define CM_GGUF_MAX_ARRAY (1u << 30) /* elements */
#define CM_GGUF_MAX_DEPTH 4          /* nesting of arrays of arrays */
#define CM_GGUF_MAX_NAME 256         /* tensor names: at most MAX_NAME-1 bytes */
#define CM_GGUF_MAX_ALIGNMENT 65536  /* general.alignment: a power of two <= this */
#define CM_GGUF_DEFAULT_ALIGNMENT 32

typedef struct cm_gguf_str {
    const char *ptr;
    uint64_t len;
} cm_gguf_str; /* NOT NUL-terminated */

typedef struct cm_gguf_kv {
    char *key; /* NUL-terminated copy (never contains NUL itself) */
    enum cm_gguf_vtype type;
    /* arrays only: */
    enum cm_gguf_vtype arr_type;
    uint64_t arr_len;
    const uint8_t *arr_data;     /* first element in the file */
    uint64_t arr_nbytes;         /* bytes of all elements in the file */
    const cm_gguf_str *arr_strs; /* arrays of strings: arr_len entries pointing into the file */
    /* scalars and strings: unsigned ints widened into u64, signed into i64,
     * f32 into f64; strings point into the file. */
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        bool b;
        cm_gguf_str str;
    } v;
} cm_gguf_kv;

typedef struct cm_gguf_tensor_info {
    char *name;              /* NUL-terminated copy */
    uint32_t type;           /* enum cm_type, known to cm_type_traits_of */
    int n_dims;              /* 1..CM_MAX_DIMS */
    int64_t ne[CM_MAX_DIMS]; /* > 0; unused dims are 1; product fits int64 */
    uint64_t offset;         /* relative to the data section; aligned */
    uint64_t nbytes;
    const void *data; /* into the caller's bytes; [data, data+nbytes) is inside them */
} cm_gguf_tensor_info;

typedef struct cm_gguf {
    uint32_t version; /* 2 or 3 */
    uint64_t n_kv, n_tensors;
    cm_gguf_kv *kv;
    cm_gguf_tensor_info *tensors;
    uint32_t alignment;
    uint64_t data_offset; /* start of the data section in the file */
    const uint8_t *base;  /* the bytes parsed */
    size_t size;
    cm_mapped_file file; /* set by cm_gguf_open: owned */
    /* private */
    cm_arena arena_;
    uint32_t *kv_hash_, *t_hash_;
    uint64_t kv_hcap_, t_hcap_;
} cm_gguf;

/* Parse GGUF bytes that the caller keeps alive as long as g. Returns 0 or
 * CM_EFORMAT / CM_EUNSUPPORTED / CM_ENOMEM with a message, e.g.
 * "truncated tensor table (tensor 3 of 291) at byte 1234". On error g is
 * left released (cm_gguf_close is still allowed). */
int cm_gguf_parse(cm_gguf *g, const uint8_t *p, size_t n, char *err, size_t errlen);

/* Called with done/total in bytes while cm_gguf_open reads the data region
 * (done == total on the last call). Must not fail; may draw a bar. */
typedef void (*cm_gguf_progress_fn)(void *ctx, uint64_t done, uint64_t total);
/* mmap a file and parse it; messages are prefixed "'path': ". With a
 * progress callback, every page of the tensor data is also read once (which
 * brings the file into the page cache and turns an unreadable file into a
 * visible wait instead of a stall later); without one, pages load lazily. */
int cm_gguf_open(cm_gguf *g, const char *path, cm_gguf_progress_fn progress, void *progress_ctx, char *err,
                 size_t errlen);
/* Whether a file of file_bytes, every byte of which is streamed per token,
 * should be read in with cm_gguf_load: unless $CUMULO_MMAP is set (not "0"),
 * when the file plus a margin (1/8 + 256 MiB) fits in the memory available
 * now; a mapping is the better choice for a file that only just fits. */
bool cm_gguf_worth_loading(uint64_t file_bytes);
/* The same, reading the whole file into huge-page memory (cm_file_load)
 * instead of mapping it: for a model whose every weight is read per token.
 * progress then reports the whole file's bytes as they are read. */
int cm_gguf_load(cm_gguf *g, const char *path, cm_gguf_progress_fn progress, void *progress_ctx, char *err,
                 size_t errlen);
void cm_gguf_close(cm_gguf *g); /* releases everything; no-op on a zeroed struct */

/* Lookups (hashed, O(1)); return NULL / false when missing or of another type. */
const cm_gguf_kv *cm_gguf_find_kv(const cm_gguf *g, const char *key);
const cm_gguf_tensor_info *cm_gguf_find_tensor(const cm_gguf *g, const char *name);
bool cm_gguf_get_u64(const cm_gguf *g, const char *key, uint64_t *out); /* any integer >= 0 */
bool cm_gguf_get_i64(const cm_gguf *g, const char *key, int64_t *out);  /* any integer that fits */
bool cm_gguf_get_f64(const cm_gguf *g, const char *key, double *out);   /* f32/f64 or integer */
bool cm_gguf_get_bool(const cm_gguf *g, const char *key, bool *out);
/* malloc'd NUL-terminated copy of a string value (NULL if missing / not a
 * string / out of memory); free with cm_free. Stops at an embedded NUL. */
char *cm_gguf_get_str(const cm_gguf *g, const char *key);
/* Array element access, O(1) (bounds-checked; false if out of range / wrong
 * type). arr_i64: integer elements (u64 > INT64_MAX fails); arr_f64: float or
 * integer elements. */
bool cm_gguf_arr_str(const cm_gguf_kv *kv, uint64_t i, cm_gguf_str *out);
bool cm_gguf_arr_f64(const cm_gguf_kv *kv, uint64_t i, double *out);
bool cm_gguf_arr_i64(const cm_gguf_kv *kv, uint64_t i, int64_t *out);

/* ---- writer ----
 * Add kvs and tensor descriptors (in file order), then write a GGUF v3 file
 * laid out as ggml lays it out (tensor offsets contiguous, each padded to the
 * alignment), so llama.cpp loads it. The w_* calls never fail on their own:
 * a bad argument (duplicate key or tensor name, bad shape, unknown type,
 * out of memory) is remembered and returned by cm_gguf_writer_write*.
 * Writing "general.alignment" (u32, power of two) sets the alignment; an
 * alignment other than 32 without such a key gets one added. Keys and string
 * values are copied; tensor data is only referenced. One thread at a time. */
typedef struct cm_gguf_writer cm_gguf_writer;
cm_gguf_writer *cm_gguf_writer_new(uint32_t alignment); /* 0 = 32; NULL on OOM */
void cm_gguf_writer_free(cm_gguf_writer *w);            /* NULL is a no-op */
void cm_gguf_w_u8(cm_gguf_writer *w, const char *key, uint8_t v);
void cm_gguf_w_i8(cm_gguf_writer *w, const char *key, int8_t v);
void cm_gguf_w_u16(cm_gguf_writer *w, const char *key, uint16_t v);
void cm_gguf_w_i16(cm_gguf_writer *w, const char *key, int16_t v);
void cm_gguf_w_u32(cm_gguf_writer *w, const char *key, uint32_t v);
void cm_gguf_w_i32(cm_gguf_writer *w, const char *key, int32_t v);
void cm_gguf_w_u64(cm_gguf_writer *w, const char *key, uint64_t v);
void cm_gguf_w_i64(cm_gguf_writer *w, const char *key, int64_t v);
void cm_gguf_w_f32(cm_gguf_writer *w, const char *key, float v);
void cm_gguf_w_f64(cm_gguf_writer *w, const char *key, double v);
void cm_gguf_w_bool(cm_gguf_writer *w, const char *key, bool v);
void cm_gguf_w_str(cm_gguf_writer *w, const char *key, const char *v);
void cm_gguf_w_strn(cm_gguf_writer *w, const char *key, const char *v, uint64_t len);
/* Arrays of a fixed-size type t (U8..F64 except STRING/ARRAY): data is a C
 * array of the matching type (uint8_t, int8_t, ..., float, bool, double). */
void cm_gguf_w_arr(cm_gguf_writer *w, const char *key, enum cm_gguf_vtype t, const void *data, uint64_t n);
void cm_gguf_w_arr_str(cm_gguf_writer *w, const char *key, const cm_gguf_str *s, uint64_t n);
/* Copy a kv verbatim from a parsed file (any type, nested arrays included). */
void cm_gguf_w_copy_kv(cm_gguf_writer *w, const cm_gguf_kv *kv);
/* Tensor whose bytes (cm_row_size(type, ne[0]) * ne[1] * ...) are at data,
 * which must stay valid until cm_gguf_writer_write* returns. */
void cm_gguf_w_tensor(cm_gguf_writer *w, const char *name, enum cm_type type, int n_dims, const int64_t *ne,
                      const void *data);
/* Tensor whose bytes are produced at write time, one tensor at a time (for
 * files bigger than memory): fill writes exactly nbytes into dst. */
typedef int (*cm_gguf_fill_fn)(void *ctx, void *dst, uint64_t nbytes, char *err, size_t errlen);
void cm_gguf_w_tensor_fill(cm_gguf_writer *w, const char *name, enum cm_type type, int n_dims, const int64_t *ne,
                           cm_gguf_fill_fn fill, void *ctx);
/* ---- multi-part files (gguf_split.c) ----
 * A part of a file split by llama.cpp's gguf-split carries split.count > 1:
 * returns 1 and sets *no (0-based) and *count; 0 for an ordinary file. */
int cm_gguf_split_info(const cm_gguf *g, int *no, int *count);
/* Join parts[0..n) (in order: part 1 first) into one GGUF at out (written
 * atomically): part 1's keys without split.*, every part's tensors in
 * order, bytes copied verbatim. Checks that each is the part it should be
 * and that the tensor count matches split.tensors.count. Needs the space
 * of the whole model at out. progress (may be NULL) gets bytes. */
int cm_gguf_merge(const char *const *parts, int n, const char *out, cm_gguf_progress_fn progress, void *progress_ctx,
                  char *err, size_t errlen);

/* Write to path atomically (PATH.tmp, fsync, rename). 0 or a CM_E* code. */
int cm_gguf_writer_write(cm_gguf_writer *w, const char *path, char *err, size_t errlen);
/* Append the whole file to out (tests, fuzzing, small files). */
int cm_gguf_writer_write_buf(cm_gguf_writer *w, cm_buf *out, char *err, size_t errlen);

#endif
