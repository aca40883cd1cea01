/*
 * node_gpu.c: `cumulo node --gpu` (issue 16). At start the node opens the
 * Vulkan device, measures it (cm_gpu_probe: bandwidth and throughput) and
 * adds it to its HELLO, so coordinators plan with it and `cumulo nodes`
 * shows it. Each stage it takes then uploads its first layers, as many as
 * the device memory holds (and at most --gpu-layers), and hands them to
 * the stage's forward context through model.h's offload hook, as the
 * engine does on one machine; the CPU runs the rest, and keeps the caches.
 * Whatever stops it (no loader, driver or device, a model or cache type
 * the shaders do not cover, a tensor-parallel slice) is one warning line
 * and the CPU: the stage is the same either way, only slower; a layer the
 * shaders do not cover is one line and the device keeps those before it.
 */
#include "cluster/node_impl.h"
#include "gpu/gpu.h"

#include "os/os.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void cm_node_gpu_open(node *n) {
    const char *env = cm_config_get()->gpu;
    const char *want = n->o->gpu && *n->o->gpu ? n->o->gpu : env && *env ? env : n->o->gpu_layers > 0 ? "auto" : NULL;
    int index;
    if (cm_gpu_parse(want, &index)) {
        CM_LOGW("gpu: '%s' is not auto, vulkan, none or a device number; the stages run on the CPU", want);
        return;
    }
    if (index == CM_GPU_NONE) return;
    char why[300];
    if (cm_gpu_open(&n->gpu, index, why, sizeof why)) {
        CM_LOGW("gpu: %s; the stages run on the CPU", why);
        return;
    }
    double bw = 0, flops = 0;
    if (cm_gpu_probe(n->gpu, &bw, &flops, why, sizeof why)) {
        CM_LOGW("gpu: the probe failed (%s); the stages run on the CPU", why);
        cm_gpu_close(n->gpu);
        n->gpu = NULL;
        return;
    }
    const cm_gpu_info *gi = cm_gpu_info_of(n->gpu);
    cm_msg_hello *h = &n->hello;
    h->has_gpu = true;
    snprintf(h->gpu_name, sizeof h->gpu_name, "%.*s", CM_MSG_GPU_NAME_MAX, gi->name);
    for (char *p = h->gpu_name; *p; p++) /* a driver's string goes on the wire: no control bytes */
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '_';
    h->gpu_mem = gi->mem_bytes;
    h->gpu_gbs = (float)(bw / 1e9);
    h->gpu_gflops = (float)(flops / 1e9);
    h->gpu_layers = (uint32_t)CM_MIN(CM_MAX(n->o->gpu_layers, 0), (int)CM_MSG_MAX_GPU_LAYERS);
    /* (tests read this line) */
    fprintf(
        stderr,
        "cumulo node '%s': GPU '%s' (%s, %.2f GiB): %.2f GB/s, %.1f GFLOP/s measured; a stage's first %s layers run on it\n",
        h->name, h->gpu_name, gi->kind, (double)gi->mem_bytes / (1 << 30), bw / 1e9, flops / 1e9,
        n->o->gpu_layers > 0 ? "--gpu-layers" : "fitting");
}

void cm_node_gpu_after_error(node *n) {
    if (!cm_gpu_lost(n->gpu)) return;
    /* (tests read this line) */
    fprintf(stderr,
            "cumulo node '%s': GPU '%s' lost; leaving the cluster (its coordinator re-plans without this node)\n",
            n->hello.name, n->hello.gpu_name);
    fflush(NULL);
    _exit(3);
}

void cm_node_gpu_close(node *n) {
    cm_gpu_close(n->gpu);
    n->gpu = NULL;
}

void cm_node_gpu_stage_free(stage *s) {
    if (s->ctx) cm_ctx_set_offload(s->ctx, NULL, NULL);
    cm_gpu_model_free(s->gm);
    s->gm = NULL;
}

void cm_node_gpu_stage(node *n, stage *s) {
    if (!n->gpu) return;
    const cm_msg_assign *a = &s->as;
    const int l0 = (int)a->layer_begin, l1 = (int)a->layer_end;
    char why[300];
    if (a->tp_size > 1 && (a->flags & CM_ASSIGN_F_EP)) {
        CM_LOGW("gpu: an expert group's slice is not on the GPU yet (NEEDSWORK); stage %u runs on the CPU", a->stage);
        return;
    }
    /* a tensor-parallel member: its slice of each layer (cm_gpu_model_new_slice) */
    const bool tp = a->tp_size > 1;
    if (tp && !cm_gpu_model_supported_slice(&s->m, l0, l1, s->slice, why, sizeof why)) {
        CM_LOGW("gpu: %s; stage %u runs on the CPU", why, a->stage);
        return;
    }
    const enum cm_type kvk = (enum cm_type)a->kv_type_k, kvv = (enum cm_type)a->kv_type_v;
    if (!cm_gpu_kv_supported(&s->m, kvk, kvv, why, sizeof why)) {
        CM_LOGW("gpu: %s; stage %u runs on the CPU", why, a->stage);
        return;
    }
    const int kmax = cm_gpu_model_supported_prefix(&s->m, l0, l1, why, sizeof why);
    if (kmax == 0) {
        CM_LOGW("gpu: %s; stage %u runs on the CPU", why, a->stage);
        return;
    }
    if (kmax < l1 - l0) CM_LOGW("gpu: %s; stage %u's layers from %d run on the CPU", why, a->stage, l0 + kmax);
    /* The first layers that fit in 90% of the device memory (the rest is the driver's and the probe's slack). */
    const int n_seq = CM_MAX(s->n_seq, 1), ctx = (int)a->n_ctx;
    const uint64_t mem = cm_gpu_info_of(n->gpu)->mem_bytes, budget = mem / 10 * 9;
    uint64_t used = cm_gpu_fixed_bytes(&s->m, CM_BATCH_MAX, ctx);
    int k = 0;
    while (k < kmax && (n->o->gpu_layers <= 0 || k < n->o->gpu_layers)) {
        const uint64_t b = cm_gpu_layer_bytes_slice(&s->m, l0 + k, CM_BATCH_MAX, ctx, n_seq, kvk, kvv,
                                                    tp ? s->slice : cm_slice_full(&s->m)); /* a slice: its KV heads */
        if (used + b > budget) break;
        used += b;
        k++;
    }
    if (k == 0) {
        CM_LOGW("gpu: not one layer of stage %u fits in the device's %.2f GiB; it runs on the CPU", a->stage,
                (double)mem / (1 << 30));
        return;
    }
    int rc = cm_gpu_model_new_slice(&s->gm, n->gpu, &s->m, l0, k, CM_BATCH_MAX, ctx, n_seq, kvk, kvv,
                                    tp ? s->slice : cm_slice_full(&s->m), why, sizeof why);
    if (rc) {
        CM_LOGW("gpu: %s; stage %u runs on the CPU", why, a->stage);
        return;
    }
    cm_ctx_set_offload(s->ctx, cm_gpu_offload, s->gm);
    /* (tests read this line) */
    fprintf(stderr, "cumulo node '%s': stage %u layers [%d, %d) on GPU '%s', layers [%d, %d) on the CPU%s\n",
            n->hello.name, a->stage, l0, l0 + k, n->hello.gpu_name, l0 + k, l1,
            tp ? " (its tensor-parallel slice)" : "");
}
