/*
 * cmd_info.c: `cumulo info MODEL [--ctx N] [--json]`: what a GGUF model is
 * and what running it costs: architecture and shape, parameter count, quant
 * mix, context, and memory needed (mmapped weights + KV cache at ctx).
 * Reads the model through engine.h only; `--cpu` (no model) tells which
 * kernel table this machine and CUMULO_ISA select and the CPU features it
 * was chosen from, so scripts ask the binary instead of repeating the
 * dispatch rules (tests/sh/real_models.sh). Never writes anything but
 * stdout/stderr.
 */
#include "cli.h"

#include "base/base.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "os/os.h"
#include "tensor/tensor.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static const char k_info_usage[] =
    "usage: cumulo info MODEL.gguf [--ctx N] [--kv-type T] [-ctk T] [-ctv T] [--json]\n"
    "       cumulo info --gpu [--json]   (the Vulkan devices only)\n"
    "       cumulo info --cpu [--json]   (this machine's kernel table and CPU features)\n"
    "\n"
    "Print the model's architecture, parameter count, quant mix, context and the\n"
    "memory it needs (weights, mapped from the file, plus the KV cache at --ctx).\n"
    "\n"
    "  --ctx N     context for the KV estimate (default: the model's, at most 4096)\n"
    "  --kv-type T f32 (default), f16, q8_0 or q4_0 KV cache for the estimate\n"
    "  -ctk T, -ctv T  K and V types apart (--cache-type-k, --cache-type-v)\n"
    "  --json      one JSON object instead of text\n"
    "  --gpu       without a model: list the Vulkan devices (a model's info lists them too)\n"
    "  --cpu       without a model: the kernel table cumulo runs here (scalar, avx2, avx512\n"
    "              or neon: the best this CPU supports, capped by CUMULO_ISA) and the CPU\n"
    "              features it was chosen from\n";

static void human(char *b, size_t n, double bytes) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) bytes /= 1024, i++;
    snprintf(b, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

/* KV bytes per position with K and V both of type t (llama.cpp's layout: a
 * row of head_dim elements per layer and KV head, in t's blocks). */
static const enum cm_type kv_types[4] = {CM_TYPE_F32, CM_TYPE_F16, CM_TYPE_Q8_0, CM_TYPE_Q4_0};
static const char *const kv_names[4] = {"f32", "f16", "q8_0", "q4_0"};
static uint64_t kv_per_token(const cm_engine_info *in, enum cm_type t) {
    if (in->head_dim % cm_type_traits_of(t)->block_size) return 0; /* a head not whole blocks: type unusable */
    return 2ull * (uint64_t)in->n_layer * (uint64_t)in->n_head_kv * (uint64_t)cm_row_size(t, in->head_dim);
}

/* `info --cpu`: the kernel table cm_kernels_get() picks (what every matrix
 * product of this process runs), the tables this CPU could run, and the
 * features detected. */
static int cpu_info(bool json) {
    const char *feats[32];
    const int n_feats = cm_cpu_feature_names(feats, (int)CM_ARRAY_LEN(feats));
    static const char *const isas[] = {"scalar", "avx2", "avx512", "neon"};
    const char *kname = cm_kernels_get()->name;
    /* AMX only serves the avx512 table's prefill, with the same bits. */
    const char *amx = strcmp(kname, "avx512") ? "not the avx512 table" : cm_kernels_amx_why();
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "kernels", kname);
        cJSON_AddStringToObject(j, "isa_cap", cm_cpu_isa_cap());
        cJSON_AddBoolToObject(j, "amx", !*amx);
        if (*amx) cJSON_AddStringToObject(j, "amx_off", amx);
        cJSON *t = cJSON_AddArrayToObject(j, "tables");
        for (size_t i = 0; i < CM_ARRAY_LEN(isas); i++)
            if (cm_kernels_for(isas[i])) cJSON_AddItemToArray(t, cJSON_CreateString(isas[i]));
        cJSON_AddStringToObject(j, "arch", cm_arch_name());
        cJSON_AddNumberToObject(j, "cores", cm_cpu_count());
        cJSON *a = cJSON_AddArrayToObject(j, "features");
        for (int i = 0; i < n_feats; i++) cJSON_AddItemToArray(a, cJSON_CreateString(feats[i]));
        cli_json_print(j, false);
        return 0;
    }
    printf("kernels:  %s (CUMULO_ISA=%s; tables this CPU runs:", kname, cm_cpu_isa_cap());
    for (size_t i = 0; i < CM_ARRAY_LEN(isas); i++)
        if (cm_kernels_for(isas[i])) printf(" %s", isas[i]);
    if (*amx) printf(")\namx:      off (%s", amx);
    else
        printf(
            ")\namx:      on (q4_0 and q8_0 prefill in AMX tiles, the same bits as without; CUMULO_AMX=0 to turn off");
    printf(")\ncpu:      %s, %d cores; features:", cm_arch_name(), cm_cpu_count());
    for (int i = 0; i < n_feats; i++) printf(" %s", feats[i]);
    printf("\n");
    return 0;
}

int cmd_info(int argc, char **argv) {
    if (cli_help(argc, argv, k_info_usage, 0)) return 0;
    const char *model = NULL;
    long ctx = 0;
    bool json = false, kv_f16 = false, gpus = false, cpu = false;
    cli_kv kvo = {0};
    int kr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx")) {
            if (!cli_int("--ctx", i + 1 < argc ? argv[++i] : NULL, 1, 1 << 24, &ctx)) return 1;
        } else if ((kr = cli_kv_opt(argc, argv, &i, &kvo)) != 0) {
            if (kr < 0) return 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--gpu")) {
            gpus = true;
        } else if (!strcmp(argv[i], "--cpu")) {
            cpu = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_fail("unknown option '%s'; see 'cumulo info --help'", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return cli_fail("unexpected argument '%s'; see 'cumulo info --help'", argv[i]);
        }
    }
    if (cpu) {
        if (model || gpus) return cli_fail("'--cpu' takes no model and no '--gpu'; see 'cumulo info --help'");
        return cpu_info(json);
    }
    if (!model && gpus) { /* the devices only */
        cJSON *j = json ? cJSON_CreateObject() : NULL;
        cli_gpu_list(j, 0, 0);
        cli_json_print(j, false);
        return 0;
    }
    if (!model) return cli_fail("info needs a MODEL.gguf; see 'cumulo info --help'");
    cm_engine *e;
    cm_engine_opts eo = {.n_threads = 1,
                         .n_ctx = (int)(ctx > (1 << 20) ? (1 << 20) : ctx),
                         .kv_f16 = kv_f16,
                         .mmap = true}; /* facts only: no need to read the weights */
    cli_kv_apply(&kvo, &eo);
    if (cli_load_engine_opts(&e, model, &eo)) return 1;
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    int n_ctx = ctx > 0 ? (int)ctx : in.n_ctx;
    cm_type_usage tu[32];
    int nt = cm_engine_type_usage(e, tu, 32);
    if (nt > 32) nt = 32;
    uint64_t kv = in.kv_bytes_per_token * (uint64_t)n_ctx;
    uint64_t total = in.file_bytes + kv;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "architecture", in.arch);
        cJSON_AddStringToObject(j, "name", in.name);
        cJSON_AddNumberToObject(j, "n_params", (double)in.n_params);
        if (in.n_expert) {
            cJSON_AddNumberToObject(j, "n_expert", in.n_expert);
            cJSON_AddNumberToObject(j, "n_expert_used", in.n_expert_used);
            cJSON_AddNumberToObject(j, "n_ff_exp", in.n_ff_exp);
        }
        cJSON_AddNumberToObject(j, "n_params_active", (double)in.n_params_active);
        cJSON_AddNumberToObject(j, "n_vocab", in.n_vocab);
        cJSON_AddNumberToObject(j, "n_embd", in.n_embd);
        cJSON_AddNumberToObject(j, "n_layer", in.n_layer);
        cJSON_AddNumberToObject(j, "n_head", in.n_head);
        cJSON_AddNumberToObject(j, "n_head_kv", in.n_head_kv);
        cJSON_AddNumberToObject(j, "head_dim", in.head_dim);
        cJSON_AddNumberToObject(j, "n_ff", in.n_ff);
        cJSON_AddNumberToObject(j, "n_ctx_train", in.n_ctx_train);
        cJSON_AddNumberToObject(j, "n_ctx", n_ctx);
        cJSON *q = cJSON_AddArrayToObject(j, "types");
        for (int i = 0; i < nt; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", tu[i].type);
            cJSON_AddNumberToObject(o, "tensors", tu[i].n_tensors);
            cJSON_AddNumberToObject(o, "bytes", (double)tu[i].bytes);
            cJSON_AddNumberToObject(o, "elements", (double)tu[i].n_elements);
            cJSON_AddItemToArray(q, o);
        }
        cJSON_AddNumberToObject(j, "file_bytes", (double)in.file_bytes);
        cJSON_AddNumberToObject(j, "weight_bytes", (double)in.weight_bytes);
        cJSON_AddNumberToObject(j, "weight_bytes_active", (double)in.weight_bytes_active);
        cJSON_AddNumberToObject(j, "kv_bytes", (double)kv);
        cJSON_AddNumberToObject(j, "kv_bytes_per_token", (double)in.kv_bytes_per_token);
        cJSON_AddStringToObject(j, "kv_type_k", in.kv_type_k);
        cJSON_AddStringToObject(j, "kv_type_v", in.kv_type_v);
        if (strcmp(in.arch, "deepseek2")) { /* (its latent cache is not K and V per head) */
            cJSON *kt = cJSON_AddObjectToObject(j, "kv_bytes_per_token_by_type");
            for (int t = 0; t < 4; t++) { /* null: not a cache type for this head size */
                const uint64_t b = kv_per_token(&in, kv_types[t]);
                if (b) cJSON_AddNumberToObject(kt, kv_names[t], (double)b);
                else cJSON_AddNullToObject(kt, kv_names[t]);
            }
        }
        cJSON_AddNumberToObject(j, "memory_bytes", (double)total);
        cli_gpu_list(j, in.n_layer, cm_engine_gpu_layer_bytes(e, n_ctx));
        cli_json_print(j, false);
    } else {
        char b1[32], b2[32], b3[32];
        printf("model:        %s\n", in.name);
        printf("architecture: %s\n", in.arch);
        printf("parameters:   %llu (%.2f M)\n", (unsigned long long)in.n_params, in.n_params / 1e6);
        if (in.n_expert) {
            human(b1, sizeof b1, (double)in.weight_bytes_active);
            printf("experts:      %d, %d used per token (width %d); active per token %llu parameters (%.2f M), %s\n",
                   in.n_expert, in.n_expert_used, in.n_ff_exp, (unsigned long long)in.n_params_active,
                   in.n_params_active / 1e6, b1);
        }
        printf("shape:        %d layers, embedding %d, %d heads (%d KV, dim %d), ffn %d, vocabulary %d\n", in.n_layer,
               in.n_embd, in.n_head, in.n_head_kv, in.head_dim, in.n_ff, in.n_vocab);
        printf("context:      %d trained, %d for this estimate\n", in.n_ctx_train, n_ctx);
        printf("quant mix:\n");
        for (int i = 0; i < nt; i++) {
            human(b1, sizeof b1, (double)tu[i].bytes);
            printf("  %-6s %5d tensors  %12s  %6.2f bits/weight\n", tu[i].type, tu[i].n_tensors, b1,
                   tu[i].n_elements ? 8.0 * (double)tu[i].bytes / (double)tu[i].n_elements : 0.0);
        }
        human(b1, sizeof b1, (double)in.file_bytes);
        human(b2, sizeof b2, (double)kv);
        human(b3, sizeof b3, (double)total);
        printf("memory:       %s weights (mapped) + %s KV cache (K %s, V %s, ctx %d) = %s\n", b1, b2, in.kv_type_k,
               in.kv_type_v, n_ctx, b3);
        if (!strcmp(in.arch, "deepseek2")) { /* one latent row per token and layer, not K and V per head (mla.h) */
            printf("KV cache per token: %llu bytes (multi-head latent attention: kv_lora_rank + rope dims per layer, "
                   "shared by every head)\n",
                   (unsigned long long)in.kv_bytes_per_token);
        } else {
            printf("kv per token:");
            for (int t = 0; t < 4; t++) {
                const uint64_t b = kv_per_token(&in, kv_types[t]);
                human(b1, sizeof b1, (double)b);
                if (b) printf("%s %s %s", t ? "," : "", kv_names[t], b1);
                else
                    printf("%s %s n/a (head size %d is not whole %d-element blocks)", t ? "," : "", kv_names[t],
                           in.head_dim, (int)cm_type_traits_of(kv_types[t])->block_size);
            }
            human(b1, sizeof b1, (double)in.kv_bytes_per_token);
            printf(" (this run: %s)\n", b1);
        }
        cli_gpu_list(NULL, in.n_layer, cm_engine_gpu_layer_bytes(e, n_ctx)); /* (the device's KV of these types) */
    }
    cm_engine_free(e);
    return 0;
}
