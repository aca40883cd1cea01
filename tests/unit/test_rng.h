/*
 * test_rng.h: the kernel tests' xorshift64 generator (deterministic data,
 * the same every run). A file may define TEST_RNG_SEED before including it.
 */
#ifndef CM_TEST_RNG_H
#define CM_TEST_RNG_H

#include <stdint.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#endif

static uint64_t g_rng = TEST_RNG_SEED;
static inline uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
/* uniform in [-1, 1) */
static inline float frand(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

#endif
