/*
 * gguf: parse, validate and write GGUF v2/v3 files. No model knowledge.
 *
 * The reader works over (const uint8_t *p, size_t n) — usually an mmap — and
 * checks every count, string length, array length, offset, alignment and
 * tensor extent against n with overflow-safe arithmetic before use. Corrupt
 * input is an error code plus a message, never an assert or a crash.
 * A parsed cm_gguf points into the caller's bytes for tensor data and keeps
 * its own copies of keys/strings it needs; it must outlive nothing but them.
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
    CM_GGUF_U8 = 0, CM_GGUF_I8 = 1, CM_GGUF_U16 = 2, CM_GGUF_I16 = 3, CM_GGUF_U32 = 4,
    CM_GGUF_I32 = 5, CM_GGUF_F32 = 6, CM_GGUF_BOOL = 7, CM_GGUF_STRING = 8, CM_GGUF_ARRAY = 9,
    CM_GGUF_U64 = 10, CM_GGUF_I64 = 11, CM_GGUF_F64 = 12, CM_GGUF_VTYPE_COUNT = 13
};

/* Limits applied before allocation (a hostile header cannot make us allocate
 * more than these; real files are far below them). */
#define CM_GGUF_MAX_TENSORS (1u << 20)
#define CM_GGUF_MAX_KV (1u << 20)
#define CM_GGUF_MAX_STRING (1u << 30)
#define CM_GGUF_MAX_ARRAY (1u << 30)
#define CM_GGUF_MAX_NAME 256 /* tensor names, like ggml's GGML_MAX_NAME... but checked */

typedef struct cm_gguf_str { const char *ptr; uint64_t len; } cm_gguf_str; /* NOT NUL-terminated; points into the file */

typedef struct cm_gguf_kv {
    char *key;                 /* NUL-terminated copy */
    enum cm_gguf_vtype type;
    enum cm_gguf_vtype arr_type; /* for arrays */
    uint64_t arr_len;          /* for arrays */
    const uint8_t *arr_data;   /* for arrays: first element in the file */
    union {
        uint64_t u64; int64_t i64; double f64; bool b; cm_gguf_str str;
    } v;                       /* scalars (all ints widened) and strings */
} cm_gguf_kv;

typedef struct cm_gguf_tensor_info {
    char *name;                /* NUL-terminated copy */
    uint32_t type;             /* enum cm_type, validated as known */
    int n_dims;
    int64_t ne[CM_MAX_DIMS];
    uint64_t offset;           /* relative to data section */
    uint64_t nbytes;
    const void *data;          /* pointer into the caller's bytes */
} cm_gguf_tensor_info;

typedef struct cm_gguf {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    cm_gguf_kv *kv;
    cm_gguf_tensor_info *tensors;
    uint32_t alignment;
    uint64_t data_offset;      /* start of the data section in the file */
    const uint8_t *base;       /* the bytes parsed */
    size_t size;
    cm_mapped_file *file;      /* set by cm_gguf_open: owned */
} cm_gguf;

/* Parse GGUF bytes that the caller keeps alive. Returns 0 or CM_EFORMAT /
 * CM_EUNSUPPORTED / CM_ENOMEM with a message ("truncated tensor table at byte 1234"). */
int cm_gguf_parse(cm_gguf *g, const uint8_t *p, size_t n, char *err, size_t errlen);
/* mmap a file and parse it; a progress bar on stderr for large files when show_progress. */
int cm_gguf_open(cm_gguf *g, const char *path, bool show_progress, char *err, size_t errlen);
void cm_gguf_close(cm_gguf *g); /* releases everything; no-op on zeroed struct */

/* Lookups return NULL / false / default when missing or of another type. */
const cm_gguf_kv *cm_gguf_find_kv(const cm_gguf *g, const char *key);
const cm_gguf_tensor_info *cm_gguf_find_tensor(const cm_gguf *g, const char *name);
bool cm_gguf_get_u64(const cm_gguf *g, const char *key, uint64_t *out); /* any integer type >= 0 */
bool cm_gguf_get_i64(const cm_gguf *g, const char *key, int64_t *out);
bool cm_gguf_get_f64(const cm_gguf *g, const char *key, double *out);  /* f32/f64 or integer */
bool cm_gguf_get_bool(const cm_gguf *g, const char *key, bool *out);
/* malloc'd NUL-terminated copy of a string value (NULL if missing). */
char *cm_gguf_get_str(const cm_gguf *g, const char *key);
/* Array element access (bounds-checked; false if out of range / wrong type). */
bool cm_gguf_arr_str(const cm_gguf_kv *kv, uint64_t i, cm_gguf_str *out);
bool cm_gguf_arr_f64(const cm_gguf_kv *kv, uint64_t i, double *out);
bool cm_gguf_arr_i64(const cm_gguf_kv *kv, uint64_t i, int64_t *out);

/* ---- writer ----
 * Build a file in memory-light fashion: add kvs and tensor descriptors, then
 * write; tensor data is supplied by pointer (or by callback for huge tensors). */
typedef struct cm_gguf_writer cm_gguf_writer;
cm_gguf_writer *cm_gguf_writer_new(uint32_t alignment);
void cm_gguf_writer_free(cm_gguf_writer *w);
void cm_gguf_w_u32(cm_gguf_writer *w, const char *key, uint32_t v);
void cm_gguf_w_i32(cm_gguf_writer *w, const char *key, int32_t v);
void cm_gguf_w_u64(cm_gguf_writer *w, const char *key, uint64_t v);
void cm_gguf_w_f32(cm_gguf_writer *w, const char *key, float v);
void cm_gguf_w_bool(cm_gguf_writer *w, const char *key, bool v);
void cm_gguf_w_str(cm_gguf_writer *w, const char *key, const char *v);
/* Arrays: elements copied. For strings, pass an array of (ptr,len). */
void cm_gguf_w_arr(cm_gguf_writer *w, const char *key, enum cm_gguf_vtype t, const void *data, uint64_t n);
void cm_gguf_w_arr_str(cm_gguf_writer *w, const char *key, const cm_gguf_str *s, uint64_t n);
/* Copy a kv verbatim from a parsed file (used to carry a vocabulary over). */
void cm_gguf_w_copy_kv(cm_gguf_writer *w, const cm_gguf_kv *kv);
/* Tensor: data must stay valid until cm_gguf_writer_write returns. */
void cm_gguf_w_tensor(cm_gguf_writer *w, const char *name, enum cm_type type, int n_dims,
                      const int64_t *ne, const void *data);
int cm_gguf_writer_write(cm_gguf_writer *w, const char *path, char *err, size_t errlen);

#endif
