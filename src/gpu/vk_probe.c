/*
 * vk_probe.c: a short measurement of a Vulkan device for a cluster node's
 * capabilities (cm_gpu_probe): the forward pass's own Q8_0 matrix shader,
 * once as a matrix-vector product (decode: it streams the weights, so its
 * speed is the memory bandwidth the planner charges per layer) and once
 * over 32 tokens (prefill: FLOP/s): up to 18 MiB of Q8_0 weights, a few
 * dispatches in one command buffer, the best of two submissions; zero
 * weights (the timing does not depend on the values). A fraction of a
 * second on lavapipe; on a real GPU a lower bound (submission counts).
 */
#include "vk_int.h"

#include "../os/os.h"

#include <string.h>

enum { PK = 4096, PR = 4096, PTOK = 32, REPS_BW = 8, REPS_MM = 4 };

/* Seconds of the best of two submissions of reps dispatches of the Q8_0 shader over rows R and n tokens. */
static double timed(cm_gpu *g, cm_vk_set *set, uint32_t R, uint32_t n, int reps, uint32_t x_off, uint32_t y_off,
                    char *err, size_t errlen, int *rc) {
    double best = 1e30;
    for (int pass = 0; pass < 2 && !*rc; pass++) {
        cm_vk_lock(g);
        const double t0 = cm_now_s();
        *rc = cm_vk_begin(g, err, errlen);
        if (!*rc) {
            const uint32_t p[12] = {PK, R, n, 0, x_off, PK / 32 * 9, y_off, R, 0, 0, 0, 1};
            for (int r = 0; r < reps; r++) cm_vk_dispatch(g, VKP_MM_Q8_0, set, p, sizeof p, R, (n + 7) / 8);
            *rc = cm_vk_submit(g, err, errlen);
        }
        const double t = cm_now_s() - t0;
        cm_vk_unlock(g);
        if (t < best) best = t;
    }
    return best;
}

/* The work grows (rows, then repetitions) until a submission takes 20 ms
 * or it is all there is: a slow device (lavapipe on a busy CPU) is
 * measured in a fraction of a second, a fast one over every row. */
static double grow(cm_gpu *g, cm_vk_set *set, uint32_t n, uint32_t max_rows, int max_reps, uint32_t *rows, int *reps,
                   uint32_t y_off, char *err, size_t errlen, int *rc) {
    *rows = 16;
    *reps = 1;
    for (;;) {
        const double t = *rc ? 0 : timed(g, set, *rows, n, *reps, 0, y_off, err, errlen, rc);
        if (*rc || t >= 0.02) return t;
        if (*rows < max_rows) *rows *= 2;
        else if (*reps < max_reps) *reps *= 2;
        else return t;
    }
}

int cm_gpu_probe(cm_gpu *g, double *bw, double *flops, char *err, size_t errlen) {
    *bw = *flops = 0;
    const uint64_t w_words = (uint64_t)PR * (PK / 32) * 9, x_words = (uint64_t)PTOK * (PK / 32) * 9;
    const uint64_t a_words = x_words + (uint64_t)PTOK * PR;
    cm_vk_buf *w = cm_vk_buf_new(g, w_words * 4, CM_VK_DEVICE, err, errlen);
    cm_vk_buf *a = w ? cm_vk_buf_new(g, a_words * 4, CM_VK_DEVICE, err, errlen) : NULL;
    cm_vk_buf *kv = a ? cm_vk_buf_new(g, 16, CM_VK_DEVICE, err, errlen) : NULL;
    cm_vk_set *set = kv ? cm_vk_set_new(g, w, a, kv, err, errlen) : NULL;
    void *zero = set ? cm_calloc(w_words, 4) : NULL;
    int rc = zero ? 0 : set ? cm_errf(err, errlen, CM_ENOMEM, "out of memory") : CM_ENOMEM;
    if (!rc) rc = cm_vk_upload(g, w, 0, zero, w_words * 4, err, errlen);
    if (!rc) rc = cm_vk_upload(g, a, 0, zero, a_words * 4, err, errlen);
    cm_free(zero);
    /* warm up (pipeline caches, first touch), then the two measurements */
    if (!rc) timed(g, set, 16, 1, 1, 0, (uint32_t)x_words, err, errlen, &rc);
    uint32_t rows_bw, rows_mm;
    int reps_bw, reps_mm;
    const double t_bw = grow(g, set, 1, PR, REPS_BW, &rows_bw, &reps_bw, (uint32_t)x_words, err, errlen, &rc);
    const double t_mm = grow(g, set, PTOK, PR / 4, REPS_MM, &rows_mm, &reps_mm, (uint32_t)x_words, err, errlen, &rc);
    if (!rc && t_bw > 0 && t_mm > 0) {
        *bw = (double)rows_bw * (PK / 32) * 36 * reps_bw / t_bw;
        *flops = 2.0 * PK * rows_mm * PTOK * reps_mm / t_mm;
    }
    cm_vk_set_free(g, set);
    cm_vk_buf_free(g, kv);
    cm_vk_buf_free(g, a);
    cm_vk_buf_free(g, w);
    return rc;
}
