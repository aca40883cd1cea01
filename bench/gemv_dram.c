/*
 * gemv_dram.c: the AVX-512 f16 decode gemv's two token forms, from DRAM.
 * Not built by make (x86-64 with AVX-512 only; a scratch bench kept so the
 * numbers in avx512_gemv.h can be re-measured):
 *
 *   cc -O2 -std=gnu11 -mavx512f -mf16c -mfma -o /tmp/gemv_dram bench/gemv_dram.c
 *   /tmp/gemv_dram K [MiB] [reps]        e.g. 5632 512 5, then 2048, 4096
 *
 * Rows of K fp16 weights filling MiB of huge-page memory (far past the last
 * level cache), one thread, three loops over all of it in turn, best of reps,
 * GB/s of weight bytes by wall time and by this thread's CPU time (steadier
 * on a shared machine): "read" (a plain 512-bit read loop: the roofline),
 * "tok_f32" (the token converted to f32 once, avx512_gemv.h's gvf16_row) and
 * "tok_f16" (the token kept fp16 and converted per row: vec_dot_zf16). Both
 * gemvs do the same two chains of FMAs (same bits). Asserts nothing.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef uint16_t f16;
static double now(int cpu) {
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline __m512 ld16(const f16 *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

static const f16 *g_yh;
static const float *g_yf;

static void tok_f32(int64_t k, const f16 *w, int64_t rows, float *y) {
    for (int64_t i = 0; i < rows; i++) {
        const f16 *x = w + i * k;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t e = 0; e + 32 <= k; e += 32) {
            a0 = _mm512_fmadd_ps(ld16(x + e), _mm512_load_ps(g_yf + e), a0);
            a1 = _mm512_fmadd_ps(ld16(x + e + 16), _mm512_load_ps(g_yf + e + 16), a1);
        }
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}
static void tok_f16(int64_t k, const f16 *w, int64_t rows, float *y) {
    for (int64_t i = 0; i < rows; i++) {
        const f16 *x = w + i * k;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t e = 0; e + 32 <= k; e += 32) {
            a0 = _mm512_fmadd_ps(ld16(x + e), ld16(g_yh + e), a0);
            a1 = _mm512_fmadd_ps(ld16(x + e + 16), ld16(g_yh + e + 16), a1);
        }
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}
static void read_loop(int64_t k, const f16 *w, int64_t rows, float *y) {
    const __m512i *p = (const __m512i *)(const void *)w;
    const int64_t n = rows * k * 2 / 64;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i + 4 <= n; i += 4) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 1));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 2));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 3));
    }
    y[0] = (float)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

int main(int argc, char **argv) {
    const int64_t k = argc > 1 ? atoll(argv[1]) : 5632;
    const size_t bytes = (size_t)(argc > 2 ? atoll(argv[2]) : 512) << 20;
    const int reps = argc > 3 ? atoi(argv[3]) : 5;
    const size_t huge = (size_t)2 << 20;
    const int64_t rows = (int64_t)(bytes / (2 * (size_t)k));
    if (k < 32 || k % 32 || rows < 1) return fprintf(stderr, "usage: gemv_dram K(multiple of 32) [MiB] [reps]\n"), 2;
    uint8_t *m = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    f16 *w = (f16 *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(w, bytes, MADV_HUGEPAGE);
    for (int64_t i = 0; i < rows * k; i++) w[i] = (f16)(0x3000 + ((uint64_t)i * 2654435761u >> 20) % 0x1000);
    float *yf = aligned_alloc(64, (size_t)k * 4), *y = malloc((size_t)rows * 4);
    f16 *yh = aligned_alloc(64, (size_t)k * 2);
    for (int64_t i = 0; i < k; i++) {
        yh[i] = _cvtss_sh((float)(i % 17) / 17.0f - 0.5f, 0);
        yf[i] = _cvtsh_ss(yh[i]);
    }
    g_yh = yh, g_yf = yf;
    struct {
        const char *name;
        void (*f)(int64_t, const f16 *, int64_t, float *);
        double wall, cpu;
    } v[] = {{"read", read_loop, 0, 0}, {"tok_f32", tok_f32, 0, 0}, {"tok_f16", tok_f16, 0, 0}};
    for (int r = 0; r < reps; r++)
        for (int j = 0; j < 3; j++) {
            const double t0 = now(0), c0 = now(1);
            v[j].f(k, w, rows, y);
            const double t1 = now(0), c1 = now(1);
            if (bytes / (t1 - t0) > v[j].wall) v[j].wall = bytes / (t1 - t0);
            if (bytes / (c1 - c0) > v[j].cpu) v[j].cpu = bytes / (c1 - c0);
        }
    printf("k = %lld, %zu MiB, best of %d: GB/s wall / thread CPU time (%% of read, CPU time)\n", (long long)k,
           bytes >> 20, reps);
    for (int j = 0; j < 3; j++)
        printf("%-8s %6.1f %6.1f  %3.0f%%\n", v[j].name, v[j].wall / 1e9, v[j].cpu / 1e9, 100 * v[j].cpu / v[0].cpu);
    return 0;
}
