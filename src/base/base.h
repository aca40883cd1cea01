/*
 * base: error codes, logging, assertions, arenas and small helpers that every
 * module of cumulo uses. It depends on nothing but libc and must never include
 * any other cumulo header.
 *
 * Errors are values: functions return 0 or a negative CM_E* code, and write a
 * one-line, lower-case, problem-first message into a caller-supplied buffer
 * (`char *err, size_t errlen`, which may be NULL/0).
 */
#ifndef CM_BASE_H
#define CM_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_VERSION "0.1.0"

/* The most rows the engine puts in one pass (its n_batch is capped to this)
 * and the most tokens one cluster micro-batch (a FORWARD frame) carries: the
 * fixed row arrays of engine, cluster and cli are sized by it. cm_forward
 * itself takes any n up to its context's max_batch. */
#define CM_BATCH_MAX 256

/* One table of error codes; cm_strerror() names them. */
#define CM_ERRORS(X)                                    \
    X(CM_OK, 0, "ok")                                   \
    X(CM_EINVAL, -1, "invalid argument")                \
    X(CM_ENOMEM, -2, "out of memory")                   \
    X(CM_EIO, -3, "input/output error")                 \
    X(CM_ENOENT, -4, "no such file")                    \
    X(CM_EFORMAT, -5, "malformed data")                 \
    X(CM_EUNSUPPORTED, -6, "unsupported")               \
    X(CM_ERANGE, -7, "value out of range")              \
    X(CM_ETIMEDOUT, -8, "timed out")                    \
    X(CM_ECLOSED, -9, "connection closed")              \
    X(CM_EAUTH, -10, "authentication failed")           \
    X(CM_EPROTO, -11, "protocol error")                 \
    X(CM_EBUSY, -12, "busy")                            \
    X(CM_ECANCELED, -13, "canceled")                    \
    X(CM_ENOSPACE, -14, "no space left (context full)") \
    X(CM_EAGAIN, -15, "try again")                      \
    X(CM_ESTATE, -16, "wrong state")

/* clang-format would indent the member after the X-macro as a continuation. */
// clang-format off
enum cm_err {
#define CM_X_ENUM(name, val, str) name = val,
    CM_ERRORS(CM_X_ENUM)
#undef CM_X_ENUM
    CM_ERR_COUNT_ = 17
};
// clang-format on

/* Static string for an error code; never NULL. */
const char *cm_strerror(int code);

/* printf into err (if non-NULL) and return code. Lets callers write
 *     return cm_errf(err, errlen, CM_EFORMAT, "'%s': truncated header", path);
 */
int cm_errf(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Append printf-style text at buf + k (buf holds n bytes): k plus what the
 * text needed, which passes n when it was cut (later calls then append
 * nothing). For a text built in a caller's fixed buffer. */
size_t cm_appendf(char *buf, size_t n, size_t k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Logging to stderr. Level from CUMULO_LOG (error|warning|info|debug; cm_config),
 * default warning; cm_log_set_level overrides it. */
enum cm_log_level { CM_LOG_ERROR, CM_LOG_WARN, CM_LOG_INFO, CM_LOG_DEBUG, CM_LOG_COUNT };
void cm_log(enum cm_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cm_log_set_level(enum cm_log_level lvl);
enum cm_log_level cm_log_get_level(void);
#define CM_LOGE(...) cm_log(CM_LOG_ERROR, __VA_ARGS__)
#define CM_LOGW(...) cm_log(CM_LOG_WARN, __VA_ARGS__)
#define CM_LOGI(...) cm_log(CM_LOG_INFO, __VA_ARGS__)
#define CM_LOGD(...) cm_log(CM_LOG_DEBUG, __VA_ARGS__)

/* The process environment, read once in one place (config.c, whose table
 * names every variable with its default and meaning; docs/DESIGN.md
 * "Configuration" has the same). No other file calls getenv(). Strings are
 * NULL when unset (an empty value counts as unset unless said). */
typedef struct cm_config {
    int log_level;                  /* CUMULO_LOG as enum cm_log_level (default CM_LOG_WARN) */
    const char *isa;                /* CUMULO_ISA; "best" when unset */
    bool mmap;                      /* CUMULO_MMAP set and not "0" */
    bool repack_off;                /* CUMULO_REPACK is "0" */
    bool amx_off;                   /* CUMULO_AMX is "0" */
    bool tune_off;                  /* CUMULO_TUNE is "0" */
    bool tune_force;                /* CUMULO_TUNE is "force" */
    const char *tune_dir;           /* CUMULO_TUNE_DIR (NULL: unset) */
    const char *key_file;           /* CUMULO_KEY_FILE */
    const char *models;             /* CUMULO_MODELS */
    const char *api_key;            /* CUMULO_API_KEY, as set (may be "") */
    int progress;                   /* CUMULO_PROGRESS: -1 unset, else 0 or 1 */
    const char *host_id;            /* CUMULO_HOST_ID */
    const char *declare_speed;      /* CUMULO_DECLARE_SPEED, "GFLOPS,GBS" (parsed by cluster/caps.c) */
    int64_t mem_offer;              /* CUMULO_MEM_OFFER in bytes; -1 unset or not a number */
    int lost_ms;                    /* CUMULO_LOST_MS when >= 200; else 0 (CM_PIPE_LOST_MS) */
    int token_timeout_ms;           /* CUMULO_TOKEN_TIMEOUT_MS when >= 200; else 0 */
    int rejoin_ms;                  /* CUMULO_REJOIN_MS when >= 100; else 0 (CM_PIPE_REJOIN_MS) */
    int prefill_chunk;              /* CUMULO_PREFILL_CHUNK when > 0; else 32 */
    int pipe_groups;                /* CUMULO_PIPE_GROUPS when > 0; else 0 (one per set of stages sharing a host) */
    bool tp_trace;                  /* CUMULO_TP_TRACE set and not "0" */
    int tp_spin_us;                 /* CUMULO_TP_SPIN_US (negative: unset, the link's default) */
    bool tp_head_split_off;         /* CUMULO_TP_HEAD_SPLIT is "0" */
    bool tp_encrypt_loopback;       /* CUMULO_TP_ENCRYPT_LOOPBACK set and not "0" */
    bool tp_shm_off;                /* CUMULO_TP_SHM is "0" */
    bool mixed_pass;                /* CUMULO_MIXED_PASS: not "0" (the default: on) */
    const char *powercap_root;      /* CUMULO_POWERCAP_ROOT; "/sys/class/powercap" */
    const char *proc_stat;          /* CUMULO_PROC_STAT; "/proc/stat" */
    const char *oracle_dir;         /* CUMULO_ORACLE_DIR; "/tmp/nlc" */
    const char *llamacpp_bench;     /* CUMULO_LLAMACPP_BENCH */
    const char *service_root;       /* CUMULO_SERVICE_ROOT as set; "" when unset */
    const char *service_kind;       /* CUMULO_SERVICE_KIND */
    bool test_no_recover;           /* CUMULO_TEST_NO_RECOVER set (even empty) */
    unsigned test_cluster_delay_ms; /* CUMULO_TEST_CLUSTER_DELAY_MS */
    unsigned test_step_delay_ms;    /* CUMULO_TEST_STEP_DELAY_MS */
    unsigned test_layer_delay_ms;   /* CUMULO_TEST_LAYER_DELAY_MS */
    bool interject;                 /* CUMULO_INTERJECT: not "0" (the default: on) */
    bool serve_trace;               /* CUMULO_SERVE_TRACE set and not "0" */
    unsigned test_dash_hold_ms;     /* CUMULO_TEST_DASH_HOLD_MS */
    int test_sockbuf;               /* CUMULO_TEST_SOCKBUF when > 0; else 0 */
    const char *gpu;                /* CUMULO_GPU */
    bool gpu_subgroup;              /* CUMULO_GPU_SUBGROUP: not "0" (the default: on) */
    const char *vulkan_lib;         /* CUMULO_VULKAN_LIB */
    const char *test_gpu_fault;     /* CUMULO_TEST_GPU_FAULT (src/gpu/vk.c) */
    const char *test_open_fail;     /* CUMULO_TEST_OPEN_FAIL (src/cluster/node.c) */
    const char *mpi_spin_ms;        /* CUMULO_MPI_SPIN_MS, as a string (the MPI bridge parses it) */
    const char *mpi_nap_us;         /* CUMULO_MPI_NAP_US, as a string (the MPI bridge parses it) */
    const char *tmpdir;             /* TMPDIR */
    const char *home;               /* HOME */
    const char *xdg_cache_home;     /* XDG_CACHE_HOME */
    const char *xdg_config_home;    /* XDG_CONFIG_HOME */
    const char *sudo_user;          /* SUDO_USER */
    const char *path;               /* PATH, as set */
    const char *hf_endpoint;        /* HF_ENDPOINT; "https://huggingface.co" */
    const char *hf_token;           /* HF_TOKEN */
} cm_config;
/* The configuration, read from the environment at the first call.
 * Thread-safe. */
const cm_config *cm_config_get(void);
/* Read the environment again (tests that setenv() mid-run; `cumulo bench
 * --isa`) and publish it to later cm_config_get() calls. A copy obtained
 * before stays valid until a few more reloads (4) have followed. */
void cm_config_reload(void);
/* cumulo's cache directory for one use (sub: "tune", "models"), into out
 * (cap bytes): override when non-NULL (the variable that names it, e.g.
 * cm_config's tune_dir or models), else $XDG_CACHE_HOME/cumulo/SUB, else
 * $HOME/.cache/cumulo/SUB. 0, CM_ENOENT when none can be formed (no HOME),
 * or CM_ERANGE when the path does not fit. Thread-safe; creates nothing. */
int cm_cache_dir(const char *override, const char *sub, char *out, size_t cap);
/* The table of every variable: name, default, meaning (n: how many). */
typedef struct cm_config_var {
    const char *name, *def, *meaning;
} cm_config_var;
const cm_config_var *cm_config_vars(int *n);

/* Always-on assertion for programmer bugs only. Never use it on bytes that
 * came from a file, a socket or a request: those get validation + an error. */
void cm_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define CM_ASSERT(x) ((x) ? (void)0 : cm_assert_fail(#x, __FILE__, __LINE__))

#define CM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define CM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool cm_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a > UINT64_MAX - b) return false;
    *out = a + b;
    return true;
}
static inline bool cm_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}

/* malloc wrappers: never return NULL for n > 0 unless out of memory;
 * cm_free(NULL) is a no-op. Aligned allocations are 64-byte aligned. */
void *cm_malloc(size_t n);
void *cm_calloc(size_t count, size_t size);
void *cm_realloc(void *p, size_t n);
void *cm_aligned_alloc(size_t n); /* free with cm_aligned_free */
void cm_aligned_free(void *p);
void cm_free(void *p);
char *cm_strdup(const char *s);

/* Arena: bump allocator for per-request / per-session memory. Not thread-safe. */
typedef struct cm_arena {
    struct cm_arena_block *head;
    size_t block_size;
    size_t used_total;
} cm_arena;
void cm_arena_init(cm_arena *a, size_t block_size);
void *cm_arena_alloc(cm_arena *a, size_t n); /* 16-byte aligned; NULL on OOM */
char *cm_arena_strdup(cm_arena *a, const char *s);
void cm_arena_reset(cm_arena *a); /* keeps the first block */
void cm_arena_release(cm_arena *a);

/* Growable byte buffer (for building strings/frames outside hot loops). */
typedef struct cm_buf {
    char *data;
    size_t len, cap;
    bool oom; /* sticky: set when a growth failed */
} cm_buf;
void cm_buf_init(cm_buf *b);
void cm_buf_release(cm_buf *b);
void cm_buf_append(cm_buf *b, const void *p, size_t n);
void cm_buf_puts(cm_buf *b, const char *s);
void cm_buf_printf(cm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cm_buf_clear(cm_buf *b);

/* Deterministic PRNG (xoshiro256**), seeded by splitmix64. */
typedef struct cm_rng {
    uint64_t s[4];
} cm_rng;
void cm_rng_seed(cm_rng *r, uint64_t seed);
uint64_t cm_rng_next(cm_rng *r);
float cm_rng_uniform(cm_rng *r); /* [0, 1) */
float cm_rng_normal(cm_rng *r);  /* N(0, 1) */

/* Little-endian field access for parsers and encoders (no struct memcpy). */
static inline uint16_t cm_rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t cm_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t cm_rd_u64(const uint8_t *p) {
    return (uint64_t)cm_rd_u32(p) | ((uint64_t)cm_rd_u32(p + 4) << 32);
}
static inline void cm_wr_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void cm_wr_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void cm_wr_u64(uint8_t *p, uint64_t v) {
    cm_wr_u32(p, (uint32_t)v);
    cm_wr_u32(p + 4, (uint32_t)(v >> 32));
}

#endif
