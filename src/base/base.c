/*
 * base.c: error strings, logging, allocation wrappers, arena, buffer, RNG.
 * Must never depend on any other cumulo module.
 */
#include "base.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cm_strerror(int code) {
    switch (code) {
#define CM_X_CASE(name, val, str) \
    case val: return str;
        CM_ERRORS(CM_X_CASE)
#undef CM_X_CASE
    }
    return "unknown error";
}

int cm_errf(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

size_t cm_appendf(char *buf, size_t n, size_t k, const char *fmt, ...) {
    if (k < n) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(buf + k, n - k, fmt, ap);
        va_end(ap);
        if (w > 0) k += (size_t)w;
    }
    return k;
}

/* Set by cm_log_set_level (-1: CUMULO_LOG's, cm_config); atomic because any
 * thread may log first. */
static _Atomic int g_log_level = -1;

enum cm_log_level cm_log_get_level(void) {
    int lvl = atomic_load(&g_log_level);
    return (enum cm_log_level)(lvl >= 0 ? lvl : cm_config_get()->log_level);
}

void cm_log_set_level(enum cm_log_level lvl) { atomic_store(&g_log_level, (int)lvl); }

void cm_log(enum cm_log_level lvl, const char *fmt, ...) {
    static const char *names[CM_LOG_COUNT] = {"error", "warning", "info", "debug"};
    if ((int)lvl > (int)cm_log_get_level()) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cumulo: %s: %s\n", names[lvl], line);
}

void cm_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "cumulo: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    abort();
}

void *cm_malloc(size_t n) { return malloc(n ? n : 1); }
void *cm_calloc(size_t count, size_t size) { return calloc(count ? count : 1, size ? size : 1); }
void *cm_realloc(void *p, size_t n) { return realloc(p, n ? n : 1); }
void cm_free(void *p) { free(p); }
void *cm_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}
void cm_aligned_free(void *p) { free(p); }
char *cm_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

struct cm_arena_block {
    struct cm_arena_block *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

void cm_arena_init(cm_arena *a, size_t block_size) {
    a->head = NULL;
    a->block_size = block_size ? block_size : 65536;
    a->used_total = 0;
}

void *cm_arena_alloc(cm_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct cm_arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > a->block_size ? n : a->block_size;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used_total += n;
    return p;
}

char *cm_arena_strdup(cm_arena *a, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cm_arena_alloc(a, n);
    if (d) memcpy(d, s, n);
    return d;
}

void cm_arena_reset(cm_arena *a) {
    struct cm_arena_block *b = a->head;
    if (!b) return;
    while (b->next) {
        struct cm_arena_block *n = b->next;
        b->next = n->next;
        free(n);
    }
    b->used = 0;
    a->used_total = 0;
}

void cm_arena_release(cm_arena *a) {
    struct cm_arena_block *b = a->head;
    while (b) {
        struct cm_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->used_total = 0;
}

void cm_buf_init(cm_buf *b) { memset(b, 0, sizeof *b); }
void cm_buf_release(cm_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}
void cm_buf_clear(cm_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

static bool buf_reserve(cm_buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->oom = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void cm_buf_append(cm_buf *b, const void *p, size_t n) {
    if (!n) return;
    if (!buf_reserve(b, n)) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void cm_buf_puts(cm_buf *b, const char *s) { cm_buf_append(b, s, strlen(s)); }

void cm_buf_printf(cm_buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && buf_reserve(b, (size_t)n)) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void cm_rng_seed(cm_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t cm_rng_next(cm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float cm_rng_uniform(cm_rng *r) { return (float)(cm_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float cm_rng_normal(cm_rng *r) {
    float u1 = cm_rng_uniform(r), u2 = cm_rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
