/*
 * os: the only place for platform differences (#ifdef lives here and nowhere
 * else): mapped files, clocks, CPU features, memory facts, and the compute
 * thread pool. Linux and macOS, x86-64 and arm64.
 */
#ifndef CM_OS_H
#define CM_OS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- files ---- */
typedef struct cm_mapped_file {
    const uint8_t *data; /* read-only mapping; NULL for an empty file */
    size_t size;
    int fd;
} cm_mapped_file;
/* Map a whole file read-only. Errors: CM_ENOENT, CM_EIO (with message). */
int cm_file_map(cm_mapped_file *f, const char *path, char *err, size_t errlen);
void cm_file_unmap(cm_mapped_file *f); /* no-op on a zeroed struct */
/* Read a whole (small) file into a malloc'd NUL-terminated buffer. */
int cm_file_read_all(const char *path, char **out, size_t *len, char *err, size_t errlen);
/* Write atomically (tmp + rename) with the given mode (e.g. 0600). */
int cm_file_write_atomic(const char *path, const void *data, size_t n, int mode, char *err,
                         size_t errlen);
bool cm_file_exists(const char *path);

/* ---- clocks ---- */
uint64_t cm_now_ns(void);  /* monotonic */
double cm_now_s(void);     /* monotonic seconds */
uint64_t cm_wall_ms(void); /* unix epoch milliseconds */
void cm_sleep_ms(unsigned ms);

/* ---- sockets (the platform bits of TCP; net owns the rest) ---- */
/* Make fd non-blocking and close-on-exec, and make writes to a closed peer
 * fail with EPIPE instead of raising SIGPIPE. 0 or -1 (errno set). */
int cm_sock_prepare(int fd);
/* send() that never raises SIGPIPE: bytes sent, or -1 with errno. */
long cm_sock_send(int fd, const void *p, size_t n);

/* ---- machine facts ---- */
typedef struct cm_cpu_features {
    bool x86_avx2, x86_fma, x86_f16c;
    bool x86_avx512f, x86_avx512bw, x86_avx512vl, x86_avx512vnni, x86_avx512bf16, x86_avxvnni;
    bool arm_neon, arm_dotprod, arm_i8mm, arm_fp16;
} cm_cpu_features;
const cm_cpu_features *cm_cpu_features_get(void); /* detected once; thread-safe after first call */
/* CUMULO_ISA=scalar|avx2|avx512|neon caps what dispatch may pick (for tests and benchmarks). */
const char *cm_cpu_isa_cap(void);
int cm_cpu_count(void);                  /* online logical CPUs */
uint64_t cm_mem_total_bytes(void);
uint64_t cm_mem_available_bytes(void);
const char *cm_os_name(void);            /* "linux" / "darwin" */
const char *cm_arch_name(void);          /* "x86_64" / "arm64" */
/* Peak resident set size of this process in bytes (0 if unknown). */
uint64_t cm_peak_rss_bytes(void);

/* ---- compute thread pool ----
 * One persistent pool per process. cm_pool_run() runs fn(ctx, ith, nth) on nth
 * threads (the caller is thread 0) and returns when all have finished. Inside
 * fn, cm_pool_barrier() synchronises all nth threads. No allocation, no thread
 * creation per call. Not re-entrant: one cm_pool_run at a time per pool. */
typedef struct cm_pool cm_pool;
typedef void (*cm_pool_fn)(void *ctx, int ith, int nth);
cm_pool *cm_pool_new(int n_threads); /* n_threads >= 1 */
void cm_pool_free(cm_pool *p);
int cm_pool_size(const cm_pool *p);
void cm_pool_run(cm_pool *p, cm_pool_fn fn, void *ctx);
void cm_pool_barrier(cm_pool *p);

/* Split [0, n) into nth near-equal parts; part ith is [*begin, *end). */
static inline void cm_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#endif
