/*
 * engine_gpu.c: the engine's GPU (src/gpu): open the device cm_engine_opts
 * names, upload the first gpu_layers layers and hand them to the forward
 * context. Whatever stops it (no loader, no driver, no device, a model the
 * shaders do not cover) is one warning line and the CPU path; only a bad
 * option value is an error.
 */
#include "engine_impl.h"

#include "gpu/gpu.h"

#include <stdlib.h>
#include <string.h>

int cm_engine_gpu_attach(cm_engine *e, const cm_engine_opts *o, char *err, size_t errlen) {
    const char *env = cm_config_get()->gpu; /* the test suites' switch (tests/sh/vulkan.sh) */
    const char *want = o->gpu && *o->gpu ? o->gpu : env && *env ? env : o->gpu_layers > 0 ? "auto" : NULL;
    int index;
    if (cm_gpu_parse(want, &index))
        return cm_errf(err, errlen, CM_EINVAL, "--gpu '%s': expected auto, vulkan, none or a device number", want);
    if (index == CM_GPU_NONE) return 0;
    char why[256];
    int n = o->gpu_layers > 0 ? CM_MIN(o->gpu_layers, e->local_last) : e->local_last;
    const int k = cm_gpu_model_supported_prefix(&e->m, 0, n, why, sizeof why);
    if (k < n) { /* the device takes a batch's first layers: those before the first it cannot run */
        if (k == 0) {
            CM_LOGW("gpu: %s; running on the CPU", why);
            return 0;
        }
        CM_LOGW("gpu: %s; layers %d-%d on the CPU", why, k, e->m.hp.n_layer - 1);
        n = k;
    }
    if (!cm_gpu_kv_supported(&e->m, e->kv_k, e->kv_v, why, sizeof why)) {
        CM_LOGW("gpu: %s; running on the CPU", why);
        return 0;
    }
    /* a tensor-parallel coordinator: its slice of each layer (a re-formed group's new one:
     * cm_engine_gpu_reslice) */
    const cm_slice sl = e->cl && !cm_engine_downstream(e) ? e->slice : cm_slice_full(&e->m);
    if (!cm_gpu_model_supported_slice(&e->m, 0, n, sl, why, sizeof why)) {
        CM_LOGW("gpu: %s; running on the CPU", why);
        return 0;
    }
    int rc = cm_gpu_open(&e->gpu, index, why, sizeof why);
    if (rc) {
        CM_LOGW("gpu: %s; running on the CPU", why);
        return 0;
    }
    const int n_seq = o->n_seq > 0 ? o->n_seq : 4;
    rc = cm_gpu_model_new_slice(&e->gpu_m, e->gpu, &e->m, 0, n, e->n_batch, e->n_ctx, n_seq, e->kv_k, e->kv_v, sl, why,
                                sizeof why);
    if (rc) {
        CM_LOGW("gpu: %s; running on the CPU", why);
        cm_gpu_close(e->gpu);
        e->gpu = NULL;
        return 0;
    }
    cm_ctx_set_offload(e->ctx, cm_gpu_offload, e->gpu_m);
    CM_LOGI("gpu: %d of %d layers on %s", n, e->m.hp.n_layer, cm_gpu_info_of(e->gpu)->name);
    return 0;
}

void cm_engine_gpu_reslice(cm_engine *e) {
    if (!e->gpu_m) return;
    char why[256];
    const cm_slice sl = e->cl && !cm_engine_downstream(e) ? e->slice : cm_slice_full(&e->m);
    const int n = cm_gpu_model_layers(e->gpu_m);
    int rc = CM_EUNSUPPORTED;
    if (cm_gpu_model_supported_slice(&e->m, 0, n, sl, why, sizeof why))
        rc = cm_gpu_model_reslice(&e->gpu_m, sl, why, sizeof why);
    if (rc < 0) {
        CM_LOGW("%s%s; running on the CPU", strncmp(why, "gpu: ", 5) ? "gpu: " : "", why);
        cm_engine_gpu_release(e);
        return;
    }
    if (rc == 0) return; /* the same slice */
    cm_ctx_set_offload(e->ctx, cm_gpu_offload, e->gpu_m);
    CM_LOGI("gpu: the re-formed group's slice (KV heads [%d, %d), FFN rows [%d, %d)) of %d layers on %s", sl.h0, sl.h1,
            sl.f0, sl.f1, n, cm_gpu_info_of(e->gpu)->name);
}

uint64_t cm_engine_gpu_layer_bytes(const cm_engine *e, int n_ctx) {
    const int nl = e->m.hp.n_layer;
    uint64_t sum = 0;
    for (int il = 0; il < nl; il++) sum += cm_gpu_layer_bytes_kv(&e->m, il, e->n_batch, n_ctx, 1, e->kv_k, e->kv_v);
    return nl > 0 ? sum / (uint64_t)nl : 0;
}

bool cm_engine_gpu_batches(const cm_engine *e, uint64_t *took, uint64_t *declined) {
    cm_gpu_model_batches(e ? e->gpu_m : NULL, took, declined);
    return e && e->gpu_m;
}

void cm_engine_gpu_release(cm_engine *e) {
    if (e->ctx) cm_ctx_set_offload(e->ctx, NULL, NULL);
    cm_gpu_model_free(e->gpu_m);
    cm_gpu_close(e->gpu);
    e->gpu_m = NULL;
    e->gpu = NULL;
}

const char *cm_engine_gpu_device(const cm_engine *e, int *layers) {
    if (layers) *layers = e && e->gpu_m ? cm_gpu_model_layers(e->gpu_m) : 0;
    return e && e->gpu_m ? cm_gpu_model_device(e->gpu_m) : NULL;
}
