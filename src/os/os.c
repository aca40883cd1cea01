/*
 * os.c: POSIX implementations of files, clocks and machine facts.
 * Platform #ifdefs are allowed here (and only in src/os/).
 */
#include "os.h"

#include "../base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <sys/sysctl.h>
#include <mach/mach.h>
#endif

/* Open a regular file read-only: its fd and size, or an error (f zeroed first). */
static int open_regular(cm_mapped_file *f, const char *path, int *fd_out, size_t *size, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return cm_errf(err, errlen, e == ENOENT ? CM_ENOENT : CM_EIO, "cannot open '%s': %s", path,
                       e == ENOENT ? "no such file" : strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cm_errf(err, errlen, CM_EIO, "cannot open '%s': not a regular file", path);
    }
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return 0;
}

int cm_file_map(cm_mapped_file *f, const char *path, char *err, size_t errlen) {
    int fd;
    int rc = open_regular(f, path, &fd, &f->size, err, errlen);
    if (rc) return rc;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cm_errf(err, errlen, CM_EIO, "cannot map '%s': %s", path, strerror(e));
        }
        f->data = p;
    }
    f->fd = fd;
    return 0;
}

#define CM_HUGE_PAGE ((size_t)2 << 20)

/* The length mapped for n bytes: whole 4 KiB pages, and from 2 MiB on whole
 * huge pages where the last one would be at least half used, so that a huge
 * page backs the end too: a region's last partial huge page is otherwise 4
 * KiB pages, which a gemv streams from memory several times slower (a TP
 * member's share of the 1B model's output head, whose last 1.2 MiB were such
 * pages, ran ~20% slower than the other member's: HISTORY.md, session 22,
 * tp). A shorter tail stays on 4 KiB pages: at most 1 MiB unused per region. */
static size_t huge_len(size_t n) {
    if (n == 0) n = 1;
    size_t len = (n + 4095) & ~(size_t)4095;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const size_t tail = len & (CM_HUGE_PAGE - 1);
    if (len >= CM_HUGE_PAGE && tail >= CM_HUGE_PAGE / 2 && len + CM_HUGE_PAGE > len) len += CM_HUGE_PAGE - tail;
#endif
    return len;
}

void *cm_huge_alloc(size_t n) {
    size_t len = huge_len(n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (len >= CM_HUGE_PAGE) {
        size_t big = len + CM_HUGE_PAGE;
        if (big < len) return NULL;
        uint8_t *p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        uint8_t *a = (uint8_t *)(((uintptr_t)p + CM_HUGE_PAGE - 1) & ~(uintptr_t)(CM_HUGE_PAGE - 1));
        if (a > p) munmap(p, (size_t)(a - p)); /* trim the slack on both sides: only [a, a+len) stays */
        size_t tail = (size_t)((p + big) - (a + len));
        if (tail) munmap(a + len, tail);
        (void)madvise(a, len, MADV_HUGEPAGE); /* a hint: plain pages when THP is off */
        return a;
    }
#endif
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void cm_huge_free(void *p, size_t n) {
    if (!p) return;
    munmap(p, huge_len(n));
}

int cm_file_load(cm_mapped_file *f, const char *path, void (*progress)(void *ctx, uint64_t done, uint64_t total),
                 void *progress_ctx, char *err, size_t errlen) {
    int fd;
    size_t size;
    int rc = open_regular(f, path, &fd, &size, err, errlen);
    if (rc) return rc;
    uint8_t *mem = NULL;
    if (size > 0) {
        mem = cm_huge_alloc(size);
        if (!mem) {
            close(fd);
            return cm_errf(err, errlen, CM_ENOMEM, "cannot load '%s': out of memory for %.1f MiB (try --mmap)", path,
                           (double)size / 1048576.0);
        }
        const size_t chunk = (size_t)32 << 20;
        for (size_t done = 0; done < size;) {
            size_t want = CM_MIN(chunk, size - done);
            ssize_t r = pread(fd, mem + done, want, (off_t)done);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                int e = r < 0 ? errno : 0;
                cm_huge_free(mem, size);
                close(fd);
                return cm_errf(err, errlen, CM_EIO, "cannot read '%s' at byte %zu: %s", path, done,
                               e ? strerror(e) : "the file shrank while it was read");
            }
            done += (size_t)r;
            if (progress) progress(progress_ctx, done, size);
        }
        (void)mprotect(mem, (size + 4095) & ~(size_t)4095, PROT_READ); /* weights are never written */
    }
    if (progress && size == 0) progress(progress_ctx, 0, 0);
    f->data = mem;
    f->size = size;
    f->fd = fd;
    f->in_memory = true;
    return 0;
}

void cm_file_unmap(cm_mapped_file *f) {
    if (!f) return;
    if (f->in_memory) cm_huge_free((void *)f->data, f->size);
    else if (f->data && f->size) munmap((void *)f->data, f->size);
    if (f->fd > 0) close(f->fd);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

size_t cm_file_give_back(const cm_mapped_file *f, const void *p, size_t n) {
    if (!f || !f->in_memory || f->fd < 0 || !f->data || !p || !n) return 0;
    const uintptr_t d = (uintptr_t)f->data, b = (uintptr_t)p;
    if (b < d || b - d > f->size || n > f->size - (b - d)) return 0;
    struct stat st;
    if (fstat(f->fd, &st) != 0 || (size_t)st.st_size != f->size) return 0; /* not the bytes read in */
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t pg = ps > 0 ? (uintptr_t)ps : 4096;
    const uintptr_t a = (b + pg - 1) & ~(pg - 1), e = (b + n) & ~(pg - 1); /* whole pages only */
    if (e <= a || (a - d) % pg) return 0; /* data is page-aligned (cm_huge_alloc): file offsets are too */
    void *q = mmap((void *)a, e - a, PROT_READ, MAP_PRIVATE | MAP_FIXED, f->fd, (off_t)(a - d));
    if (q != MAP_FAILED) return (size_t)(e - a);
    /* A failed MAP_FIXED may have unmapped the range: put the bytes back as
     * they were (anonymous, read from the file again). */
    q = mmap((void *)a, e - a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CM_ASSERT(q != MAP_FAILED && "cannot restore the weights' pages");
    for (size_t done = 0; done < e - a;) {
        ssize_t r = pread(f->fd, (uint8_t *)a + done, e - a - done, (off_t)(a - d + done));
        if (r < 0 && errno == EINTR) continue;
        CM_ASSERT(r > 0 && "cannot read the weights' pages back");
        done += (size_t)r;
    }
    (void)mprotect((void *)a, e - a, PROT_READ);
    return 0;
}

int cm_file_read_all(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    *out = NULL;
    if (len) *len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        return cm_errf(err, errlen, e == ENOENT ? CM_ENOENT : CM_EIO, "cannot open '%s': %s", path,
                       e == ENOENT ? "no such file" : strerror(e));
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            return cm_errf(err, errlen, CM_ENOMEM, "out of memory reading '%s'", path);
        }
        size_t r = fread(buf + n, 1, cap - n - 1, fp);
        n += r;
        if (r == 0) break;
        if (n + 1 >= cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return cm_errf(err, errlen, CM_EIO, "cannot read '%s'", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int cm_file_write_atomic(const char *path, const void *data, size_t n, int mode, char *err, size_t errlen) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return cm_errf(err, errlen, CM_EIO, "cannot create '%s': %s", tmp, strerror(errno));
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return cm_errf(err, errlen, CM_EIO, "cannot write '%s': %s", tmp, strerror(e));
        }
        p += w;
        n -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return cm_errf(err, errlen, CM_EIO, "cannot write '%s'", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return cm_errf(err, errlen, CM_EIO, "cannot rename to '%s': %s", path, strerror(e));
    }
    return 0;
}

int cm_mkdir_p(const char *dir, int mode, bool parent_of) {
    char tmp[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(tmp, dir, n + 1);
    if (parent_of) {
        char *slash = strrchr(tmp, '/');
        if (!slash || slash == tmp) return 0;
        *slash = 0;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, (mode_t)mode) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, (mode_t)mode) && errno != EEXIST ? -1 : 0;
}

bool cm_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

uint64_t cm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
double cm_now_s(void) { return (double)cm_now_ns() * 1e-9; }
uint64_t cm_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}
void cm_sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int cm_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

uint64_t cm_mem_total_bytes(void) {
#if defined(__APPLE__)
    uint64_t m = 0;
    size_t len = sizeof m;
    sysctlbyname("hw.memsize", &m, &len, NULL, 0);
    return m;
#else
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
#endif
}

uint64_t cm_mem_available_bytes(void) {
#if defined(__APPLE__)
    mach_port_t host = mach_host_self();
    vm_statistics64_data_t vs;
    mach_msg_type_number_t cnt = HOST_VM_INFO64_COUNT;
    if (host_statistics64(host, HOST_VM_INFO64, (host_info64_t)&vs, &cnt) != KERN_SUCCESS) return 0;
    return ((uint64_t)vs.free_count + vs.inactive_count + vs.purgeable_count) * (uint64_t)vm_page_size;
#else
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, fp)) {
        if (sscanf(line, "MemAvailable: %lu kB", (unsigned long *)&kb) == 1) break;
    }
    fclose(fp);
    return kb * 1024ull;
#endif
}

const char *cm_os_name(void) {
#if defined(__APPLE__)
    return "darwin";
#else
    return "linux";
#endif
}

const char *cm_arch_name(void) {
#if defined(__x86_64__)
    return "x86_64";
#elif defined(__aarch64__)
    return "arm64";
#else
    return "unknown";
#endif
}

uint64_t cm_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#if defined(__APPLE__)
    return (uint64_t)ru.ru_maxrss; /* bytes on macOS */
#else
    return (uint64_t)ru.ru_maxrss * 1024ull; /* kilobytes on Linux */
#endif
}

void cm_host_id(char *out, size_t cap) {
    if (!cap) return;
    out[0] = 0;
    const char *env = cm_config_get()->host_id;
    char raw[128] = "";
    if (env) snprintf(raw, sizeof raw, "%s", env);
    else {
        char host[64] = "";
        if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
        host[sizeof host - 1] = 0;
        char mid[64] = "";
        const char *files[] = {"/etc/machine-id", "/var/lib/dbus/machine-id"};
        for (size_t i = 0; i < 2 && !mid[0]; i++) {
            FILE *f = fopen(files[i], "r");
            if (!f) continue;
            if (!fgets(mid, sizeof mid, f)) mid[0] = 0;
            fclose(f);
        }
        mid[8 < strlen(mid) ? 8 : strcspn(mid, "\r\n")] = 0;
        snprintf(raw, sizeof raw, "%s%s%s", host[0] ? host : "host", mid[0] ? "-" : "", mid);
    }
    size_t k = 0;
    for (const char *p = raw; *p && k + 1 < cap; p++) out[k++] = (*p > 0x20 && *p < 0x7f) ? *p : '_';
    out[k] = 0;
}
