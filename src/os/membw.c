/*
 * membw.c: this machine's measured memory READ bandwidth, the denominator of
 * the decode roofline (a CPU decoding one token reads every weight once, so
 * tokens/s can never beat bandwidth / bytes per token).
 *
 * STREAM-like: every thread sums 64-bit words of its share of a buffer much
 * larger than the last-level cache, with several independent vector
 * accumulators so that the loop is bound by loads, not by an add chain.
 * 16-byte vectors are baseline on x86-64 (SSE2) and arm64 (NEON), so no ISA
 * flags are needed. A pass that writes the buffer first makes the pages
 * resident; only read passes are timed. Never used in the token loop (it
 * allocates); never run it while the pool does other work.
 */
#include "os.h"

#include "../base/base.h"

#include <string.h>

typedef uint64_t v2u64 __attribute__((vector_size(16)));

static volatile uint64_t g_membw_sink;

typedef struct membw_job {
    uint8_t *buf;
    size_t bytes;
    bool write;
    uint64_t sums[64]; /* one per thread; read afterwards so no pass is optimised away */
} membw_job;

static uint64_t read_sum(const uint8_t *p, size_t n) {
    v2u64 a0 = {0, 0}, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        const v2u64 *v = (const v2u64 *)(const void *)(p + i);
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
        a4 += v[4];
        a5 += v[5];
        a6 += v[6];
        a7 += v[7];
    }
    v2u64 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    uint64_t out[2];
    memcpy(out, &s, sizeof out);
    for (; i < n; i++) out[0] += p[i];
    return out[0] + out[1];
}

static void membw_run(void *ctx, int ith, int nth) {
    membw_job *j = ctx;
    /* Shares on 4 KiB boundaries so threads never split a page or a line. */
    int64_t pages = (int64_t)(j->bytes / 4096), p0, p1;
    cm_split_range(pages, ith, nth, &p0, &p1);
    uint8_t *p = j->buf + (size_t)p0 * 4096;
    size_t n = (size_t)(p1 - p0) * 4096;
    if (j->write) {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = (uint64_t)i * 0x9E3779B97F4A7C15ull;
            memcpy(p + i, &v, 8);
        }
        return;
    }
    j->sums[ith & 63] += read_sum(p, n);
}

int cm_mem_read_bandwidth(cm_pool *pool, size_t bytes, int runs, double *best_bytes_per_s) {
    *best_bytes_per_s = 0;
    if (bytes < (1u << 20) || runs < 1) return CM_EINVAL;
    bytes &= ~(size_t)4095;
    membw_job j = {.bytes = bytes, .write = true};
    j.buf = cm_huge_alloc(bytes); /* the same kind of memory as the weights read in by cm_file_load */
    if (!j.buf) return CM_ENOMEM;
    cm_pool_run(pool, membw_run, &j); /* first touch: resident pages, no page faults when timed */
    j.write = false;
    cm_pool_run(pool, membw_run, &j); /* untimed warm-up read */
    double best = 0;
    for (int r = 0; r < runs; r++) {
        uint64_t t0 = cm_now_ns();
        cm_pool_run(pool, membw_run, &j);
        uint64_t dt = cm_now_ns() - t0;
        double bw = dt ? (double)bytes * 1e9 / (double)dt : 0;
        if (bw > best) best = bw;
    }
    uint64_t sink = 0;
    for (int i = 0; i < 64; i++) sink ^= j.sums[i];
    cm_huge_free(j.buf, bytes);
    g_membw_sink = sink; /* a visible use, so the reads cannot be optimised away */
    *best_bytes_per_s = best;
    return 0;
}
