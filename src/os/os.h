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

#include <pthread.h>

/* ---- files ---- */
typedef struct cm_mapped_file {
    const uint8_t *data; /* read-only bytes of the file; NULL for an empty file */
    size_t size;
    int fd;
    bool in_memory; /* read into anonymous memory by cm_file_load (else a file mapping) */
} cm_mapped_file;
/* Map a whole file read-only. Errors: CM_ENOENT, CM_EIO (with message). */
int cm_file_map(cm_mapped_file *f, const char *path, char *err, size_t errlen);
/* Read a whole file into anonymous memory from cm_huge_alloc, then make it
 * read-only. For bytes streamed again and again (model weights, once per
 * token): huge pages mean far fewer TLB misses than a file mapping's 4 KiB
 * pages. Costs the file's size in RSS up front (a mapping loads lazily).
 * progress (may be NULL) gets done/total bytes after every chunk read.
 * Errors: CM_ENOENT, CM_EIO, CM_ENOMEM (with message). */
int cm_file_load(cm_mapped_file *f, const char *path, void (*progress)(void *ctx, uint64_t done, uint64_t total),
                 void *progress_ctx, char *err, size_t errlen);
void cm_file_unmap(cm_mapped_file *f); /* either kind; no-op on a zeroed struct */
/* Give back the anonymous memory under [p, p+n) of a file cm_file_load read
 * in: its whole pages there become a private read-only mapping of the
 * file's same bytes, faulted in again only if something reads them (for
 * bytes that another copy serves: the weights' repacked layouts). The
 * address and the bytes read there do not change, as long as the file on
 * disk does not (as for cm_file_map; a file whose size changed since it was
 * read is left alone). Returns the bytes given back (0: not a loaded file,
 * out of its range, or the OS refused). Not thread-safe against a reader of
 * those pages only where the OS's mmap is not (none known). */
size_t cm_file_give_back(const cm_mapped_file *f, const void *p, size_t n);

/* Page-aligned zeroed memory that the OS backs with huge pages where it can
 * (Linux transparent huge pages, 2 MiB aligned; elsewhere plain pages).
 * For large buffers read in streams: weights, the bandwidth probe. NULL when
 * out of memory. Free with cm_huge_free and the same size. */
void *cm_huge_alloc(size_t n);
void cm_huge_free(void *p, size_t n);
/* Read a whole (small) file into a malloc'd NUL-terminated buffer. */
int cm_file_read_all(const char *path, char **out, size_t *len, char *err, size_t errlen);
/* Write atomically (tmp + rename) with the given mode (e.g. 0600). */
int cm_file_write_atomic(const char *path, const void *data, size_t n, int mode, char *err, size_t errlen);
bool cm_file_exists(const char *path);
/* mkdir -p: dir and every missing directory above it, created with mode
 * (existing ones are left as they are). 0, or -1 with errno. With
 * parent_of set, dir is a file's path and only the directories above it
 * are made. */
int cm_mkdir_p(const char *dir, int mode, bool parent_of);

/* ---- clocks ---- */
uint64_t cm_now_ns(void);  /* monotonic */
double cm_now_s(void);     /* monotonic seconds */
uint64_t cm_wall_ms(void); /* unix epoch milliseconds */
void cm_sleep_ms(unsigned ms);
/* Give the CPU to another runnable thread, if any (a spin-wait's manners on
 * a shared machine: returns at once when nothing else wants the core). */
void cm_thread_yield(void);
/* A spin-wait hint to the CPU (x86 pause, arm64 yield; nothing elsewhere). */
static inline void cm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

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
    /* AMX tiles with int8 products, usable by this process: CPUID says
     * AMX-TILE and AMX-INT8, XCR0 enables tile state, and (Linux) the kernel
     * granted this process the tile data (arch_prctl). x86_amx_why says why
     * not when false ("" when true). */
    bool x86_amx_int8;
    const char *x86_amx_why;
} cm_cpu_features;
const cm_cpu_features *cm_cpu_features_get(void); /* detected once; thread-safe after first call */
/* The names of the detected features ("avx2", "avx512vnni", "amx_int8",
 * "dotprod", ...) in one fixed order, at most max of them into names;
 * returns how many. For `info --cpu` and the node caps. */
int cm_cpu_feature_names(const char **names, int max);
/* CUMULO_ISA=scalar|avx2|avx512|neon caps what dispatch may pick (for tests and benchmarks). */
const char *cm_cpu_isa_cap(void);
int cm_cpu_count(void); /* online logical CPUs */
/* This CPU as the kernels' tuning keys it (kernels/tune.h): vendor, family,
 * model and stepping (x86 CPUID; arm64: "arm64"), the detected features
 * (cm_cpu_feature_names), the L2 cache per core and the online CPUs, e.g.
 * "GenuineIntel 6 167 1; avx2 fma ...; l2 2097152; cpus 2". Printable
 * ASCII, at most cap - 1 bytes. */
void cm_cpu_signature(char *out, size_t cap);
/* Bytes of L2 cache of CPU 0 (Linux sysfs, macOS sysctl), 0 if unknown. */
uint64_t cm_cpu_l2_bytes(void);
/* CPU time the calling thread has used, in ns (0 if unknown). */
uint64_t cm_thread_cpu_ns(void);
uint64_t cm_mem_total_bytes(void);
uint64_t cm_mem_available_bytes(void);
/* A nameless in-memory file of `bytes` (zeros), for pages shared by private
 * mappings (anonfile.c): its descriptor (close it when done), or -1. */
int cm_anon_file(uint64_t bytes);
const char *cm_os_name(void);   /* "linux" / "darwin" */
const char *cm_arch_name(void); /* "x86_64" / "arm64" */
/* Peak resident set size of this process in bytes (0 if unknown). */
uint64_t cm_peak_rss_bytes(void);
/* The host this process runs on, the same for every process of one machine
 * (network namespaces included): $CUMULO_HOST_ID when set (tests that play
 * several machines on one), else "<hostname>-<first 8 of /etc/machine-id>",
 * else the host name. Printable ASCII, at most cap - 1 bytes. */
void cm_host_id(char *out, size_t cap);

/* Measured memory READ bandwidth in bytes/s (membw.c): a STREAM-like sum
 * over `bytes` of memory (make it much larger than the last-level cache,
 * e.g. 1 GiB) split across the pool's threads (NULL = the caller alone),
 * best of `runs` timed passes after one untimed pass that touches the pages.
 * Allocates and frees the buffer itself (not for the token loop). Returns
 * 0 or CM_ENOMEM / CM_EINVAL. Uses the pool: not while it runs other work. */
typedef struct cm_pool cm_pool;
int cm_mem_read_bandwidth(cm_pool *pool, size_t bytes, int runs, double *best_bytes_per_s);

/* ---- compute thread pool ----
 * One persistent pool per process. cm_pool_run() runs fn(ctx, ith, nth) on nth
 * threads (the caller is thread 0) and returns when all have finished. Inside
 * fn, cm_pool_barrier() synchronises all nth threads. No allocation, no thread
 * creation per call. Not re-entrant: one cm_pool_run at a time per pool. */
typedef struct cm_pool cm_pool;
typedef void (*cm_pool_fn)(void *ctx, int ith, int nth);
cm_pool *cm_pool_new(int n_threads); /* n_threads >= 1 */
/* Kernels keep packed activations and unpacked rows on the stack
 * (kernels/gemm_kq*_avx512.c: ~430 KiB), on every pool thread and on the caller, thread 0:
 * a thread that may compute gets CM_COMPUTE_STACK bytes of stack, not the
 * platform's default (512 KiB on macOS, 128 KiB on musl). cm_thread_create is
 * pthread_create with that stack: 0 or its error. */
#define CM_COMPUTE_STACK ((size_t)8 << 20)
int cm_thread_create(pthread_t *th, void *(*fn)(void *), void *arg);
void cm_pool_free(cm_pool *p);
int cm_pool_size(const cm_pool *p);
void cm_pool_run(cm_pool *p, cm_pool_fn fn, void *ctx);
void cm_pool_barrier(cm_pool *p);

/* A shared loop over n_units items inside cm_pool_run's fn: every thread of
 * the run calls cm_pool_loop_begin (the same loops in the same order, each
 * with the same n_units), then cm_pool_loop_next until it returns false;
 * each call gives a range [*begin, *end) of units no other thread gets.
 * Each thread starts on its cm_split_range part and, when done, takes what
 * the others have not reached yet, so a thread slowed down (a busy core,
 * slower memory) does not hold the run back. Which thread computes a unit
 * varies: only for work whose result does not depend on it. Past
 * CM_POOL_LOOPS loops in one run, or with p NULL or nth != the pool's size,
 * each thread gets its cm_split_range part in one piece. A barrier (or the
 * run's end) is still needed before reading the results. */
enum { CM_POOL_LOOPS = 16 };
typedef struct {
    cm_pool *p;
    int loop, ith, nth, k;
    bool shared;
    int64_t n;
} cm_pool_loop;
void cm_pool_loop_begin(cm_pool_loop *l, cm_pool *p, int64_t n_units, int ith, int nth);
bool cm_pool_loop_next(cm_pool_loop *l, int64_t *begin, int64_t *end);

/* Split [0, n) into nth near-equal parts; part ith is [*begin, *end). */
static inline void cm_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

/* ==== power and CPU load (power.c) — added by the http helper ====
 * A power meter answers "how many watts does this machine draw now" and
 * "how many joules since it was opened", always saying whether the number is
 * MEASURED (Linux RAPL: <root>/intel-rapl:N/energy_uj, summed over top-level
 * packages; root = $CUMULO_POWERCAP_ROOT or /sys/class/powercap) or
 * ESTIMATED (CPU busy fraction from /proc/stat, or load average on macOS,
 * times a TDP in watts). Counter wrap-around uses max_energy_range_uj.
 * NEEDSWORK: macOS power counters (IOReport) are not read yet; macOS is
 * estimated. A meter is used by one thread at a time. */
typedef struct cm_power_meter cm_power_meter;
typedef struct cm_power_sample {
    double watts;       /* average since the previous read (first read: since open) */
    double joules;      /* energy since the meter was opened */
    double cpu_load;    /* busy fraction of all CPUs in [0, 1] over the same interval; -1 unknown */
    bool measured;      /* true: RAPL counters; false: estimate from load x TDP */
    const char *source; /* "rapl" or "estimate" */
} cm_power_sample;
/* tdp_w: watts at full load for the estimate (<= 0: 65). Never fails for
 * lack of counters (it estimates instead); NULL only when out of memory. */
cm_power_meter *cm_power_open(double tdp_w);
void cm_power_close(cm_power_meter *m); /* NULL is a no-op */
/* Read the counters and fill *out. Returns 0, or CM_EIO when a RAPL counter
 * that was readable at open no longer is (the sample is then an estimate). */
int cm_power_read(cm_power_meter *m, cm_power_sample *out);
/* Helpers for benchmarks and the dashboard: joules per token and tokens per
 * watt (= tokens per joule); 0 when the denominator is not positive. */
double cm_power_joules_per_token(double joules, double tokens);
double cm_power_tokens_per_watt(double tokens_per_s, double watts);
/* ==== end power ==== */

/* Shut a socket down both ways (sock.c): a thread blocked reading it wakes
 * with end-of-file, while its owner still closes it. */
void cm_sock_shutdown(int fd);

/* ---- network interfaces and IPv4 multicast UDP (netif.c) ----
 * For mDNS: list interfaces, open a UDP socket bound to a port shared with
 * other responders (avahi, mDNSResponder), join a group per interface, send
 * out of a chosen interface, and learn which interface a datagram came in on.
 * Addresses are 4 bytes in network order; fds are plain POSIX descriptors. */
typedef struct cm_netif {
    char name[32];
    unsigned index;
    uint8_t ipv4[4], mask4[4];
    bool up, loopback, multicast;
} cm_netif;
/* Fill out[0..max) with interfaces that have an IPv4 address; returns the count or CM_EIO. */
int cm_netif_list(cm_netif *out, int max);
/* UDP socket bound to 0.0.0.0:port with address reuse, multicast TTL 255,
 * loopback of our own multicast on, non-blocking; CM_EIO with message. */
int cm_mcast4_open(uint16_t port, char *err, size_t errlen);
int cm_mcast4_join(int fd, const uint8_t group[4], const uint8_t ifaddr[4], unsigned ifindex);
int cm_mcast4_leave(int fd, const uint8_t group[4], const uint8_t ifaddr[4], unsigned ifindex);
/* Send to dst:port; for a multicast dst, out of the interface with address ifaddr. */
int cm_udp4_send(int fd, const void *buf, size_t n, const uint8_t dst[4], uint16_t port, const uint8_t ifaddr[4]);
/* Receive one datagram: bytes (>= 0), CM_EAGAIN when none is waiting, CM_EIO.
 * *ifindex is the arrival interface (0 if unknown). */
long cm_udp4_recv(int fd, void *buf, size_t cap, uint8_t src[4], uint16_t *sport, unsigned *ifindex);
/* Wait until fd is readable: 1 readable, 0 timeout, CM_EIO. EINTR counts as a timeout. */
int cm_fd_wait_readable(int fd, int timeout_ms);
void cm_fd_close(int fd); /* no-op for fd < 0 */

/* ---- optional libraries loaded at run time (dl.c) ---- */
/* The Vulkan loader (libvulkan.so.1; macOS: libvulkan.1.dylib or MoltenVK;
 * CUMULO_VULKAN_LIB overrides), or NULL with the reason in err. */
void *cm_dl_open_vulkan(char *err, size_t errlen);
void *cm_dl_sym(void *lib, const char *name); /* NULL if absent */
void cm_dl_close(void *lib);                  /* NULL: no-op */

#endif
