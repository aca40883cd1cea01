/*
 * gpuopt.c: the GPU options run, chat, serve and bench share: --gpu
 * auto|vulkan|none|N (which Vulkan device; gpu.h) and --gpu-layers/-ngl K
 * (the first K layers on it, the rest on the CPU; alone it means --gpu auto).
 */
#include "cli.h"

#include "engine/engine.h"
#include "gpu/gpu.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

int cli_gpu_opt(int argc, char **argv, int *i, cli_gpu *g) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (strcmp(a, "--gpu") && strcmp(a, "--gpu-layers") && strcmp(a, "-ngl")) return 0;
    if (!v) {
        cli_fail("option '%s' needs a value", a);
        return -1;
    }
    if (!strcmp(a, "--gpu")) {
        int index;
        if (cm_gpu_parse(v, &index)) {
            cli_fail("option '--gpu': '%s' is not auto, vulkan, none or a device number", v);
            return -1;
        }
        g->dev = v;
    } else {
        long l;
        if (!cli_int(a, v, 0, 1 << 20, &l)) return -1;
        g->layers = (int)l;
        g->layers_set = true;
    }
    (*i)++;
    return 1;
}

void cli_gpu_pick(const cli_gpu *g, const char **dev, int *layers) {
    *dev = g->layers_set && g->layers == 0 ? "none" : g->dev;
    *layers = g->layers_set ? g->layers : 0;
}

void cli_gpu_apply(const cli_gpu *g, struct cm_engine_opts *eo) { cli_gpu_pick(g, &eo->gpu, &eo->gpu_layers); }

/* The Vulkan devices, and for a model of n_layer layers of layer_bytes
 * (weights and KV cache at the estimate's context) how many fit in each
 * one's memory. json: an array "gpus" in j; else lines on stdout. */
void cli_gpu_list(cJSON *j, int n_layer, uint64_t layer_bytes) {
    cm_gpu_info gi[8];
    char err[256];
    int n = cm_gpu_list(gi, 8, err, sizeof err);
    cJSON *arr = j ? cJSON_AddArrayToObject(j, "gpus") : NULL;
    if (n <= 0) {
        if (j) cJSON_AddStringToObject(j, "gpu_none", n < 0 ? err : "no Vulkan device");
        else printf("gpu:          none (%s)\n", n < 0 ? err : "no Vulkan device");
        return;
    }
    for (int i = 0; i < n && i < 8; i++) {
        /* NEEDSWORK: a device's free memory (VK_EXT_memory_budget), not its heap's size */
        const int fit = layer_bytes ? (int)CM_MIN((uint64_t)n_layer, gi[i].mem_bytes / layer_bytes) : 0;
        if (arr) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "index", i);
            cJSON_AddStringToObject(o, "name", gi[i].name);
            cJSON_AddStringToObject(o, "kind", gi[i].kind);
            cJSON_AddNumberToObject(o, "memory_bytes", (double)gi[i].mem_bytes);
            if (n_layer) cJSON_AddNumberToObject(o, "layers_fit", fit);
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("gpu %d:        %s (%s, Vulkan %u.%u), %.2f GiB", i, gi[i].name, gi[i].kind, gi[i].api >> 22,
                   (gi[i].api >> 12) & 1023u, gi[i].mem_bytes / 1073741824.0);
            if (n_layer) printf(": %d of %d layers fit", fit, n_layer);
            printf("%s\n", cm_gpu_compiled() ? "" : " (this binary has no shaders: built without glslc)");
        }
    }
}
