/*
 * vk_ops.c: each shader alone on the device, for the tests that hold it
 * against the CPU kernels (tests/unit/test_vulkan.c). Slow by design (fresh
 * buffers per call); never used by the forward pass.
 */
#include "vk_int.h"

#include <string.h>

/* Buffers W (wbytes) and A (a_words floats); KV is a dummy word. */
typedef struct scratch {
    cm_vk_buf *w, *a, *kv;
    cm_vk_set *set;
} scratch;

static void scratch_free(cm_gpu *g, scratch *s) {
    cm_vk_set_free(g, s->set);
    cm_vk_buf_free(g, s->w);
    cm_vk_buf_free(g, s->a);
    cm_vk_buf_free(g, s->kv);
}

static int scratch_new(cm_gpu *g, scratch *s, const void *w, uint64_t wbytes, const float *a, uint64_t a_words,
                       char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    int rc = 0;
    if (!(s->w = cm_vk_buf_new(g, wbytes, CM_VK_DEVICE, err, errlen)) ||
        !(s->a = cm_vk_buf_new(g, a_words * 4, CM_VK_DEVICE, err, errlen)) ||
        !(s->kv = cm_vk_buf_new(g, 16, CM_VK_DEVICE, err, errlen)) ||
        !(s->set = cm_vk_set_new(g, s->w, s->a, s->kv, err, errlen)))
        rc = CM_ENOMEM;
    if (!rc && wbytes) rc = cm_vk_upload(g, s->w, 0, w, wbytes, err, errlen);
    if (!rc) rc = cm_vk_upload(g, s->a, 0, a, a_words * 4, err, errlen);
    if (rc) scratch_free(g, s);
    return rc;
}

/* Run dispatches on s (two at most; np of them) and read A's words [0, n) back into out. */
static int run_two(cm_gpu *g, scratch *s, int np, const enum cm_vk_pipe *p, const void *const *push, const uint32_t *pb,
                   const uint32_t *gx, const uint32_t *gy, float *out, uint64_t n, char *err, size_t errlen) {
    cm_vk_buf *rb = cm_vk_buf_new(g, n * 4, CM_VK_HOST, err, errlen);
    if (!rb) return CM_ENOMEM;
    cm_vk_lock(g);
    int rc = cm_vk_begin(g, err, errlen);
    if (!rc) {
        for (int i = 0; i < np; i++) cm_vk_dispatch(g, p[i], s->set, push[i], pb[i], gx[i], gy[i]);
        cm_vk_copy(g, s->a, 0, rb, 0, n * 4);
        rc = cm_vk_submit(g, err, errlen);
    }
    cm_vk_unlock(g);
    if (!rc) memcpy(out, cm_vk_buf_map(rb), n * 4);
    cm_vk_buf_free(g, rb);
    return rc;
}

static int run_one(cm_gpu *g, scratch *s, enum cm_vk_pipe p, const void *push, uint32_t pb, uint32_t gx, uint32_t gy,
                   float *out, uint64_t n, char *err, size_t errlen) {
    return run_two(g, s, 1, &p, &push, &pb, &gx, &gy, out, n, err, errlen);
}

int cm_gpu_test_matmul(cm_gpu *g, const cm_tensor *W, const float *x, int n_tok, float *y, char *err, size_t errlen) {
    const uint32_t K = (uint32_t)W->ne[0], R = (uint32_t)W->ne[1];
    const enum cm_type act = cm_vk_act_type(W->type);
    const bool q = act != CM_TYPE_F32;
    const uint32_t bs = act == CM_TYPE_Q8_K ? 256 : 32, aw = cm_vk_act_words(act, K);
    const uint64_t gw = cm_vk_grid_words(W->type), words = gw + cm_vk_packed_words(W),
                   nq = q ? (uint64_t)n_tok * aw : 0;
    const uint64_t na = (uint64_t)n_tok * (K + R) + nq; /* x, y, x converted */
    uint32_t *w = cm_calloc(words + 1, 4);
    float *a = cm_calloc(na + 1, sizeof(float));
    int rc = w && a ? 0 : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    scratch s;
    if (!rc) {
        cm_vk_pack_grid(W->type, w);
        cm_vk_pack(W, w + gw);
        memcpy(a, x, (size_t)n_tok * K * sizeof(float));
        rc = scratch_new(g, &s, w, words * 4, a, na, err, errlen);
    }
    if (!rc) {
        const uint32_t yo = (uint32_t)n_tok * K, qo = yo + (uint32_t)n_tok * R;
        const uint32_t pq[5] = {K, (uint32_t)n_tok, 0, K, qo};
        const uint32_t pm[12] = {K, R, (uint32_t)n_tok, 0, q ? qo : 0, aw, yo, R, 0, 0, 0, 1};
        const enum cm_vk_pipe pp[2] = {cm_vk_act_pipe(act), cm_vk_mm_pipe(W->type)};
        const void *push[2] = {pq, pm};
        const uint32_t pb[2] = {sizeof pq, sizeof pm}, gx[2] = {((uint32_t)n_tok * (K / bs) + 63) / 64, R},
                       gy[2] = {1, ((uint32_t)n_tok + 7) / 8};
        rc = q ? run_two(g, &s, 2, pp, push, pb, gx, gy, a, na, err, errlen)
               : run_two(g, &s, 1, pp + 1, push + 1, pb + 1, gx + 1, gy + 1, a, na, err, errlen);
        scratch_free(g, &s);
        if (!rc) memcpy(y, a + yo, (size_t)n_tok * R * sizeof(float));
    }
    cm_free(w);
    cm_free(a);
    return rc;
}

int cm_gpu_test_rmsnorm(cm_gpu *g, const float *x, const float *w, int n, int rows, float eps, float *y, char *err,
                        size_t errlen) {
    const uint64_t words = 2 * (uint64_t)n * rows;
    float *a = cm_calloc(words, sizeof(float));
    if (!a) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    memcpy(a, x, (size_t)n * rows * sizeof(float));
    scratch s;
    int rc = scratch_new(g, &s, w, (uint64_t)n * 4, a, words, err, errlen);
    if (!rc) {
        struct {
            uint32_t n, x_off, ldx, y_off, ldy, w_off;
            float eps;
            uint32_t add;
        } p = {(uint32_t)n, 0, (uint32_t)n, (uint32_t)(n * rows), (uint32_t)n, 0, eps, 0};
        rc = run_one(g, &s, VKP_RMSNORM, &p, sizeof p, (uint32_t)rows, 1, a, words, err, errlen);
        scratch_free(g, &s);
        if (!rc) memcpy(y, a + (size_t)n * rows, (size_t)n * rows * sizeof(float));
    }
    cm_free(a);
    return rc;
}

int cm_gpu_test_rope(cm_gpu *g, float *x, const float *cache, int n_rot, int D, int nh, int n_tok, bool neox, char *err,
                     size_t errlen) {
    const uint64_t nx = (uint64_t)n_tok * nh * D, words = nx + (uint64_t)n_tok * n_rot;
    float *a = cm_calloc(words, sizeof(float));
    if (!a) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    memcpy(a, x, nx * 4);
    memcpy(a + nx, cache, (size_t)n_tok * n_rot * 4);
    scratch s;
    int rc = scratch_new(g, &s, NULL, 0, a, words, err, errlen);
    if (!rc) {
        const uint32_t p[8] = {(uint32_t)n_rot,    (uint32_t)D,  (uint32_t)nh, (uint32_t)n_tok, 0,
                               (uint32_t)(nh * D), (uint32_t)nx, neox};
        rc = run_one(g, &s, VKP_ROPE, p, sizeof p, ((uint32_t)(n_tok * nh * (n_rot / 2)) + 63) / 64, 1, a, words, err,
                     errlen);
        scratch_free(g, &s);
        if (!rc) memcpy(x, a, nx * 4);
    }
    cm_free(a);
    return rc;
}

int cm_gpu_test_silu(cm_gpu *g, float *gt, const float *u, int n, char *err, size_t errlen) {
    float *a = cm_calloc(2 * (size_t)n, sizeof(float));
    if (!a) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    memcpy(a, gt, (size_t)n * 4);
    memcpy(a + n, u, (size_t)n * 4);
    scratch s;
    int rc = scratch_new(g, &s, NULL, 0, a, 2 * (uint64_t)n, err, errlen);
    if (!rc) {
        const uint32_t p[3] = {(uint32_t)n, 0, (uint32_t)n};
        rc = run_one(g, &s, VKP_SILU, p, sizeof p, ((uint32_t)n + 63) / 64, 1, a, (uint64_t)n, err, errlen);
        scratch_free(g, &s);
        if (!rc) memcpy(gt, a, (size_t)n * 4);
    }
    cm_free(a);
    return rc;
}
