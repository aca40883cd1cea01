/*
 * test.h: the one tiny unit-test harness. A test file defines static test
 * functions, runs them with RUN(fn) from main, and ends with TEST_END(),
 * which prints "N passed, N failed" (counted per test function) and returns
 * non-zero on any failure. CHECK never aborts, so one run shows every failure.
 */
#ifndef CM_TEST_H
#define CM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_passed, t_failed, t_cur_failed;
static const char *t_cur_name;

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            t_cur_failed++;                                                                   \
            fprintf(stderr, "  FAIL %s: %s:%d: %s\n", t_cur_name, __FILE__, __LINE__, #cond); \
        }                                                                                     \
    } while (0)

#define CHECKF(cond, ...)                                                                     \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            t_cur_failed++;                                                                   \
            fprintf(stderr, "  FAIL %s: %s:%d: %s: ", t_cur_name, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
        }                                                                                     \
    } while (0)

#define RUN(fn)                                                                 \
    do {                                                                        \
        t_cur_name = #fn;                                                       \
        t_cur_failed = 0;                                                       \
        fn();                                                                   \
        if (t_cur_failed) {                                                     \
            t_failed++;                                                         \
            fprintf(stderr, "not ok %s\n", #fn);                                \
        } else {                                                                \
            t_passed++;                                                         \
            if (getenv("CUMULO_TEST_VERBOSE")) fprintf(stderr, "ok %s\n", #fn); \
        }                                                                       \
    } while (0)

#define TEST_END()                                            \
    do {                                                      \
        printf("%d passed, %d failed\n", t_passed, t_failed); \
        return t_failed ? 1 : 0;                              \
    } while (0)

/* TEST_END for a file whose test functions counted n of them as skipped
 * (they passed nothing): "N passed, N failed, N skipped" when n > 0. */
#define TEST_END_SKIPPED(n)                                                         \
    do {                                                                            \
        if (!(n)) TEST_END();                                                       \
        t_passed -= (n); /* a skip is not a pass */                                 \
        printf("%d passed, %d failed, %d skipped\n", t_passed, t_failed, (int)(n)); \
        return t_failed ? 1 : 0;                                                    \
    } while (0)

/* Path of a file in ../shared (CUMULO_SHARED overrides); static buffer. */
static inline const char *t_shared(const char *rel) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("CUMULO_SHARED");
    char *b = buf[k++ & 3];
    snprintf(b, 1024, "%s/%s", root && *root ? root : "../shared", rel);
    return b;
}

#endif
