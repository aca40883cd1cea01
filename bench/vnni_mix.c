/*
 * vnni_mix.c: what a non-VNNI instruction costs next to vpdpbusd on this
 * core, for shaping the batched-decode tiles (src/kernels/avx512_bgemm.h).
 * Each line times a loop of 8 independent 512-bit vpdpbusd (the VNNI peak
 * alone: the first line, in GMAC/s) plus the named instructions, and prints
 * ns per vpdpbusd: equal to the first line means those instructions were
 * free (other pipes), higher means they took VNNI issue slots. Not a test;
 * not built by the Makefile (x86-64 with AVX-512 VNNI only):
 *   cc -O2 -mavx512f -mavx512vnni -mavx512bw -mavx512dq -mavx512vl -o /tmp/vnni_mix bench/vnni_mix.c
 * Zen 4 (session 15, one thread, under load): peak 234 GMAC/s (1 vpdpbusd
 * zmm per cycle); each 512-bit vmulps/vfmadd costs a vpdpbusd slot, a 256-bit
 * one half a slot, a zmm store about one; cvtdq2ps, the nibble and/shift,
 * extracts, shuffles and 256-bit broadcast loads (up to 4 per 8) are free,
 * 8 zmm loads per 8 nearly so (6 broadcasts or 6 shuffles per 8: +16%). So
 * a tile that scales each block's exact int32 sum (one f32 multiply and one
 * FMA lane per block per (row, token): kernels.h's bits) tops out near 8 / 10
 * of the peak (~187 GMAC/s), whatever its shape.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

enum { N = 40000000 };
_Alignas(64) static uint8_t buf[4096];

#define VN8                                                                                                       \
    "vpdpbusd %[w],%[y],%[a0]\n vpdpbusd %[w],%[y],%[a1]\n vpdpbusd %[w],%[y],%[a2]\n vpdpbusd %[w],%[y],%[a3]\n" \
    "vpdpbusd %[w],%[y],%[a4]\n vpdpbusd %[w],%[y],%[a5]\n vpdpbusd %[w],%[y],%[a6]\n vpdpbusd %[w],%[y],%[a7]\n"
#define OUTS                                                                                                 \
    [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4), [a5] "+v"(a5), [a6] "+v"(a6), \
        [a7] "+v"(a7), [z0] "+v"(z0), [z1] "+v"(z1), [z2] "+v"(z2), [z3] "+v"(z3)
#define INS [w] "v"(w), [y] "v"(y), [m4] "v"(m4), [m] "v"(m), [p] "r"(buf)
#define T(name, body)                                                                            \
    do {                                                                                         \
        const double t0 = cpu_s();                                                               \
        for (long i = 0; i < N / 8; i++) __asm__ volatile(VN8 body:OUTS:INS : "memory");         \
        const double t = cpu_s() - t0;                                                           \
        printf("%-34s %.3f ns/vpdpbusd  %6.1f GMAC/s\n", name, t / N * 1e9, N * 64.0 / t / 1e9); \
    } while (0)

int main(void) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, z0 = a0,
            z1 = a0, z2 = a0, z3 = a0;
    const __m512i w = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5), m4 = _mm512_set1_epi8(15);
    const __m512 m = _mm512_set1_ps(1.0f);
    T("8 vpdpbusd alone", "");
    T("+ 2 vfmadd zmm", "vfmadd231ps %[m],%[m],%[z0]\n vfmadd231ps %[m],%[m],%[z1]\n");
    T("+ 2 vfmadd ymm", "vfmadd231ps %t[m],%t[m],%t[z0]\n vfmadd231ps %t[m],%t[m],%t[z1]\n");
    T("+ 2 vmulps zmm", "vmulps %[m],%[m],%[z0]\n vmulps %[m],%[m],%[z1]\n");
    T("+ 4 vcvtdq2ps zmm",
      "vcvtdq2ps %[w],%[z0]\n vcvtdq2ps %[w],%[z1]\n vcvtdq2ps %[w],%[z2]\n vcvtdq2ps %[w],%[z3]\n");
    T("+ 2 vpand 1 vpsrlw zmm (nibbles)",
      "vpandd %[m4],%[w],%[z0]\n vpsrlw $4,%[w],%[z1]\n vpandd %[m4],%[z1],%[z1]\n");
    T("+ 4 vshufi64x2", "vshufi64x2 $0x44,%[w],%[y],%[z0]\n vshufi64x2 $0x44,%[w],%[y],%[z1]\n"
                        "vshufi64x2 $0xee,%[w],%[y],%[z2]\n vshufi64x2 $0xee,%[w],%[y],%[z3]\n");
    T("+ 2 vextracti32x8", "vextracti32x8 $1,%[w],%t[z0]\n vextracti32x8 $1,%[w],%t[z1]\n");
    T("+ 8 zmm loads", "vmovdqa64 (%[p]),%[z0]\n vmovdqa64 64(%[p]),%[z1]\n vmovdqa64 128(%[p]),%[z2]\n"
                       "vmovdqa64 192(%[p]),%[z3]\n vmovdqa64 256(%[p]),%[z0]\n vmovdqa64 320(%[p]),%[z1]\n"
                       "vmovdqa64 384(%[p]),%[z2]\n vmovdqa64 448(%[p]),%[z3]\n");
    T("+ 4 vbroadcasti64x4 loads", "vbroadcasti64x4 (%[p]),%[z0]\n vbroadcasti64x4 32(%[p]),%[z1]\n"
                                   "vbroadcasti64x4 64(%[p]),%[z2]\n vbroadcasti64x4 96(%[p]),%[z3]\n");
    T("+ 1 zmm store", "vmovdqa64 %[w],512(%[p])\n");
    volatile int sink = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), a7));
    (void)sink, (void)z0, (void)z1, (void)z2, (void)z3;
    return 0;
}
