/*
 * simulate.c: cluster files, model presets and GGUF model shapes for the
 * planner. Parses JSON with cJSON; every number is range-checked, so a bad
 * file is an error message, never a crash or a nonsense plan.
 */
#include "simulate.h"

#include "base/base.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define GB 1e9
#define GIB (1024.0 * 1024.0 * 1024.0)

static bool num(const cJSON *o, const char *key, double lo, double hi, double def, double *out, char *err,
                size_t errlen, int *rc) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        *out = def;
        return true;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        *rc = cm_errf(err, errlen, CM_EINVAL, "cluster file: '%s' must be a number in [%g, %g]", key, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

static int find_node(const cm_plan_cluster *c, const char *name) {
    for (int i = 0; i < c->n_nodes; i++)
        if (!strcmp(c->nodes[i].name, name)) return i;
    return -1;
}

int cm_sim_parse_cluster(const char *json, size_t n, cm_plan_cluster *c, cm_plan_opts *o, char *model_preset,
                         size_t preset_len, char *model_type, size_t type_len, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (model_preset && preset_len) model_preset[0] = 0;
    if (model_type && type_len) model_type[0] = 0;
    cJSON *root = cJSON_ParseWithLength(json, n);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cm_errf(err, errlen, CM_EFORMAT, "cluster file: not a JSON object");
    }
    int rc = 0;
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(root, "nodes");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) < 1) {
        rc = cm_errf(err, errlen, CM_EFORMAT, "cluster file: 'nodes' must be a non-empty array");
        goto out;
    }
    const cJSON *nd;
    cJSON_ArrayForEach(nd, nodes) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(nd, "name");
        if (!cJSON_IsObject(nd) || !cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 50) {
            rc = cm_errf(err, errlen, CM_EFORMAT, "cluster file: every node needs a 'name' (1-50 characters)");
            goto out;
        }
        double count, mem, bw, tf, gmem = 0, gbw = 0, gtf = 0, glay = 0;
        if (!num(nd, "count", 1, CM_PLAN_MAX_NODES, 1, &count, err, errlen, &rc) ||
            !num(nd, "mem_gb", 0.01, 1e6, 16, &mem, err, errlen, &rc) ||
            !num(nd, "mem_bw_gbs", 0.01, 1e5, 100, &bw, err, errlen, &rc) ||
            !num(nd, "tflops", 1e-4, 1e5, 2, &tf, err, errlen, &rc))
            goto out;
        /* "gpu": {"mem_gb", "mem_bw_gbs", "tflops", "layers"} (issue 16: plan.h's GPU node) */
        const cJSON *gpu = cJSON_GetObjectItemCaseSensitive(nd, "gpu");
        if (gpu && (!cJSON_IsObject(gpu) || !num(gpu, "mem_gb", 0.01, 1e6, 8, &gmem, err, errlen, &rc) ||
                    !num(gpu, "mem_bw_gbs", 0.01, 1e5, 200, &gbw, err, errlen, &rc) ||
                    !num(gpu, "tflops", 1e-4, 1e5, 10, &gtf, err, errlen, &rc) ||
                    !num(gpu, "layers", 0, CM_PLAN_MAX_LAYERS, 0, &glay, err, errlen, &rc))) {
            if (!rc) rc = cm_errf(err, errlen, CM_EFORMAT, "cluster file: a node's 'gpu' must be an object");
            goto out;
        }
        for (int k = 0; k < (int)count; k++) {
            if (c->n_nodes >= CM_PLAN_MAX_NODES) {
                rc = cm_errf(err, errlen, CM_ERANGE, "cluster file: more than %d nodes", CM_PLAN_MAX_NODES);
                goto out;
            }
            cm_plan_node *pn = &c->nodes[c->n_nodes++];
            if (count > 1) snprintf(pn->name, sizeof pn->name, "%s%d", name->valuestring, k + 1);
            else snprintf(pn->name, sizeof pn->name, "%s", name->valuestring);
            pn->mem_bytes = (uint64_t)(mem * GIB);
            pn->mem_bw = bw * GB;
            pn->flops = tf * 1e12;
            pn->gpu_mem_bytes = (uint64_t)(gmem * GIB);
            pn->gpu_mem_bw = gbw * GB;
            pn->gpu_flops = gtf * 1e12;
            pn->gpu_layers = (int)glay;
            /* "host": nodes that name the same one share a machine (its
             * cores and memory bandwidth: plan.h) */
            const cJSON *host = cJSON_GetObjectItemCaseSensitive(nd, "host");
            if (cJSON_IsString(host)) snprintf(pn->host, sizeof pn->host, "%.63s", host->valuestring);
        }
    }
    double rtt = 0.5, gbit = 1;
    const cJSON *links = cJSON_GetObjectItemCaseSensitive(root, "links");
    const cJSON *def = links ? cJSON_GetObjectItemCaseSensitive(links, "default") : NULL;
    if (def && (!num(def, "rtt_ms", 0, 1e5, 0.5, &rtt, err, errlen, &rc) ||
                !num(def, "gbit", 1e-6, 1e5, 1, &gbit, err, errlen, &rc)))
        goto out;
    for (int i = 0; i < CM_PLAN_MAX_NODES; i++)
        for (int j = 0; j < CM_PLAN_MAX_NODES; j++) {
            c->rtt_s[i][j] = i == j ? 0 : rtt * 1e-3;
            c->bw[i][j] = gbit * 1e9 / 8;
        }
    const cJSON *pairs = links ? cJSON_GetObjectItemCaseSensitive(links, "pairs") : NULL;
    const cJSON *pr;
    cJSON_ArrayForEach(pr, pairs) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(pr, "a"), *b = cJSON_GetObjectItemCaseSensitive(pr, "b");
        int ia = cJSON_IsString(a) ? find_node(c, a->valuestring) : -1;
        int ib = cJSON_IsString(b) ? find_node(c, b->valuestring) : -1;
        if (ia < 0 || ib < 0 || ia == ib) {
            rc = cm_errf(err, errlen, CM_EFORMAT, "cluster file: a link pair names an unknown node ('%s'-'%s')",
                         cJSON_IsString(a) ? a->valuestring : "?", cJSON_IsString(b) ? b->valuestring : "?");
            goto out;
        }
        double r, g;
        if (!num(pr, "rtt_ms", 0, 1e5, rtt, &r, err, errlen, &rc) ||
            !num(pr, "gbit", 1e-6, 1e5, gbit, &g, err, errlen, &rc))
            goto out;
        c->rtt_s[ia][ib] = c->rtt_s[ib][ia] = r * 1e-3;
        c->bw[ia][ib] = c->bw[ib][ia] = g * 1e9 / 8;
    }
    if (o) {
        double v;
        if (!num(root, "ctx", 16, 1 << 22, o->ctx, &v, err, errlen, &rc)) goto out;
        o->ctx = (int)v;
        if (!num(root, "n_seq", 1, 4096, o->n_seq, &v, err, errlen, &rc)) goto out;
        o->n_seq = (int)v;
        if (!num(root, "prompt_tokens", 1, 1 << 22, o->prompt_tokens, &v, err, errlen, &rc)) goto out;
        o->prompt_tokens = (int)v;
        const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel");
        if (par) {
            int p = cJSON_IsString(par) ? cm_parallel_from_name(par->valuestring) : -1;
            if (p < 0) {
                rc = cm_errf(err, errlen, CM_EINVAL, "cluster file: 'parallel' must be auto, pp, tp, hybrid or ep");
                goto out;
            }
            o->mode = (enum cm_parallel)p;
        }
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model) {
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(model, "preset");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
        if (cJSON_IsString(pre) && model_preset) snprintf(model_preset, preset_len, "%s", pre->valuestring);
        if (cJSON_IsString(ty) && model_type) snprintf(model_type, type_len, "%s", ty->valuestring);
    }
out:
    cJSON_Delete(root);
    return rc;
}

static const struct {
    const char *name;
    double bpw;
} k_types[] = {
    {"f32", 32},   {"f16", 16},   {"bf16", 16},     {"q8_0", 8.5},    {"q6_k", 6.5625}, {"q5_k_m", 5.69},
    {"q5_1", 6.0}, {"q5_0", 5.5}, {"q4_k_m", 4.85}, {"q4_k_s", 4.58}, {"q4_1", 5.0},    {"q4_0", 4.5},
};

double cm_sim_bits_per_weight(const char *type) {
    for (size_t i = 0; i < CM_ARRAY_LEN(k_types); i++)
        if (!strcmp(type, k_types[i].name)) return k_types[i].bpw;
    return 0;
}

static const struct {
    const char *name;
    int layers, dim, heads, kv, ffn, vocab;
} k_presets[] = {
    {"llama-2-7b", 32, 4096, 32, 32, 11008, 32000},        {"llama-2-13b", 40, 5120, 40, 40, 13824, 32000},
    {"llama-3-8b", 32, 4096, 32, 8, 14336, 128256},        {"llama-3-70b", 80, 8192, 64, 8, 28672, 128256},
    {"llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256},       {"llama-3.2-3b", 28, 3072, 24, 8, 8192, 128256},
    {"mistral-7b", 32, 4096, 32, 8, 14336, 32768},         {"tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000},
    {"qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064},        {"qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064},
    {"qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064},       {"qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064},
    {"llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256},
};

/* Mixture-of-experts presets (from each model's config.json). attn: the
 * attention parameters of a layer when heads x head_dim do not say it
 * (DeepSeek V3's multi-head latent attention); kv_dim: K+V elements cached
 * per token and layer (MLA caches a 512 + 64 latent). The first `dense`
 * layers have a dense FFN of width dense_ffn instead of experts. */
typedef struct moe_preset_t {
    const char *name;
    int layers, dim, heads, kv, head_dim, experts, used, ffn_exp, ffn_shared, dense, dense_ffn, vocab;
    uint64_t attn;
    int kv_dim;
} moe_preset_t;
static const moe_preset_t k_moe_presets[] = {
    {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 128, 8, 768, 0, 0, 0, 151936, 0, 0},
    {"qwen3-235b-a22b", 94, 4096, 64, 4, 128, 128, 8, 1536, 0, 0, 0, 151936, 0, 0},
    /* MLA: q_a 7168x1536, q_b 1536x(128x192), kv_a 7168x576, kv_b 512x(128x256), o (128x128)x7168 */
    {"deepseek-v3-671b", 61, 7168, 128, 1, 288, 256, 8, 2048, 2048, 3, 18432, 129280,
     7168ull * 1536 + 1536ull * 128 * 192 + 7168ull * 576 + 512ull * 128 * 256 + 128ull * 128 * 7168, 576},
    /* Kimi K2 (deepseek2 architecture, 1T): V3's MLA with 64 heads, 384 experts + 1 shared, 1 dense layer */
    {"kimi-k2", 61, 7168, 64, 1, 288, 384, 8, 2048, 2048, 1, 18432, 163840,
     7168ull * 1536 + 1536ull * 64 * 192 + 7168ull * 576 + 512ull * 64 * 256 + 64ull * 128 * 7168, 576},
    {"gpt-oss-120b", 36, 2880, 64, 8, 64, 128, 4, 2880, 0, 0, 0, 201088, 0, 0},
    {"mixtral-8x7b", 32, 4096, 32, 8, 128, 8, 2, 14336, 0, 0, 0, 32000, 0, 0},
};

const char *cm_sim_preset_names(void) {
    return "llama-2-7b, llama-2-13b, llama-3-8b, llama-3-70b, llama-3.2-1b, llama-3.2-3b, mistral-7b, "
           "tinyllama-1.1b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b, qwen2.5-72b, llama-3.1-405b; "
           "mixture of experts: qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3-671b, kimi-k2, gpt-oss-120b, mixtral-8x7b";
}

/* A MoE preset's shape: per layer the attention (or its override), the
 * router, the experts and a shared expert, or the dense FFN of the first
 * layers. head_dim * 2 * kv = kv_dim when the cache is a latent. */
static void moe_preset(cm_plan_model *m, int i, double bpw) {
    const moe_preset_t *p = &k_moe_presets[i];
    cm_plan_model_synthetic_moe(m, p->layers, p->dim, p->heads, p->kv, p->experts, p->used, p->ffn_exp, p->ffn_shared,
                                p->vocab, bpw);
    m->head_dim = p->kv_dim ? p->kv_dim / 2 : p->head_dim;
    uint64_t attn =
        p->attn ? p->attn
                : (uint64_t)p->dim * (uint64_t)p->head_dim * (2ull * (uint64_t)p->heads + 2ull * (uint64_t)p->kv);
    uint64_t experts = 3ull * (uint64_t)p->dim * (uint64_t)p->ffn_exp * (uint64_t)p->experts;
    uint64_t moe_dense =
        attn + 3ull * (uint64_t)p->dim * (uint64_t)p->ffn_shared + (uint64_t)p->dim * (uint64_t)p->experts;
    for (int l = 0; l < m->n_layers; l++) {
        bool dense = l < p->dense;
        uint64_t d = dense ? attn + 3ull * (uint64_t)p->dim * (uint64_t)p->dense_ffn : moe_dense;
        uint64_t x = dense ? 0 : experts;
        m->layer_params[l] = d + x + 2ull * (uint64_t)p->dim;
        m->layer_expert_params[l] = x;
        m->layer_bytes[l] = (uint64_t)((double)m->layer_params[l] * bpw / 8.0);
        m->layer_expert_bytes[l] = (uint64_t)((double)x * bpw / 8.0);
    }
}

int cm_sim_model_preset(const char *preset, const char *type, cm_plan_model *m, char *err, size_t errlen) {
    double bpw = cm_sim_bits_per_weight(type && *type ? type : "q4_k_m");
    if (bpw <= 0) return cm_errf(err, errlen, CM_EINVAL, "unknown quantization type '%s'", type);
    for (size_t i = 0; i < CM_ARRAY_LEN(k_presets); i++)
        if (!strcmp(preset, k_presets[i].name)) {
            cm_plan_model_synthetic(m, k_presets[i].layers, k_presets[i].dim, k_presets[i].heads, k_presets[i].kv,
                                    k_presets[i].ffn, k_presets[i].vocab, bpw);
            return 0;
        }
    for (size_t i = 0; i < CM_ARRAY_LEN(k_moe_presets); i++)
        if (!strcmp(preset, k_moe_presets[i].name)) {
            moe_preset(m, (int)i, bpw);
            return 0;
        }
    return cm_errf(err, errlen, CM_EINVAL, "unknown model preset '%s' (known: %s)", preset, cm_sim_preset_names());
}

static int64_t hparam(const cm_gguf *g, const char *arch, const char *key, int64_t def) {
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int64_t v;
    return cm_gguf_get_i64(g, full, &v) ? v : def;
}

int cm_plan_model_from_gguf(const cm_gguf *g, cm_plan_model *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    char *arch = cm_gguf_get_str(g, "general.architecture");
    if (!arch) return cm_errf(err, errlen, CM_EFORMAT, "model has no general.architecture");
    m->n_layers = (int)hparam(g, arch, "block_count", 0);
    m->dim = (int)hparam(g, arch, "embedding_length", 0);
    m->n_heads = (int)hparam(g, arch, "attention.head_count", 0);
    m->n_kv_heads = (int)hparam(g, arch, "attention.head_count_kv", m->n_heads);
    m->ffn = (int)hparam(g, arch, "feed_forward_length", 0);
    m->n_experts = (int)hparam(g, arch, "expert_count", 0);
    m->n_experts_used = m->n_experts ? (int)hparam(g, arch, "expert_used_count", 0) : 0;
    if (m->ffn < 1 && m->n_experts) m->ffn = (int)hparam(g, arch, "expert_feed_forward_length", 0);
    m->head_dim = m->n_heads > 0 ? (int)hparam(g, arch, "attention.key_length", m->dim / m->n_heads) : 0;
    /* deepseek2 (MLA): one latent row of key_length values per token and
     * layer is the whole cache, counted as K + V of half that width */
    int head_cols = m->n_kv_heads > 0 && m->n_heads % m->n_kv_heads == 0 ? m->n_heads / m->n_kv_heads * m->head_dim : 0;
    if (!strcmp(arch, "deepseek2")) { /* slices of query heads; the latent row is the cache, on every member */
        const bool mla = hparam(g, arch, "attention.key_length_mla", 0) > 0; /* else the unsplit attn_kv_b */
        m->kv_shared = true;
        m->n_kv_heads = m->n_heads;
        m->head_dim =
            (int)((hparam(g, arch, "attention.kv_lora_rank", 0) + hparam(g, arch, "rope.dimension_count", 0)) / 2);
        head_cols = (int)hparam(g, arch, mla ? "attention.value_length_mla" : "attention.value_length", 0);
    }
    free(arch);
    if (m->n_layers < 1 || m->n_layers > CM_PLAN_MAX_LAYERS || m->dim < 1 || m->n_heads < 1 || m->n_kv_heads < 1 ||
        m->ffn < 1 || m->n_heads % m->n_kv_heads)
        return cm_errf(err, errlen, CM_EFORMAT, "model shape not understood (%d layers, dim %d, %d/%d heads, ffn %d)",
                       m->n_layers, m->dim, m->n_heads, m->n_kv_heads, m->ffn);
    bool has_output = false;
    uint64_t embd = 0, embd_params = 0;
    m->ffn_granule = 1;
    m->head_granule = 1;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *t = &g->tensors[i];
        uint64_t params = 1;
        for (int d = 0; d < t->n_dims; d++) params *= (uint64_t)t->ne[d];
        int layer;
        char rest[128];
        if (sscanf(t->name, "blk.%d.%127s", &layer, rest) == 2) {
            if (layer < 0 || layer >= m->n_layers)
                return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' names a block beyond %d", t->name, m->n_layers);
            m->layer_bytes[layer] += t->nbytes;
            m->layer_params[layer] += params;
            if (strstr(rest, "_exps.")) { /* stacked experts (mixture of experts) */
                m->layer_expert_bytes[layer] += t->nbytes;
                m->layer_expert_params[layer] += params;
            }
            if (!strcmp(rest, "ffn_down.weight")) {
                const cm_type_traits *tr = cm_type_traits_of(t->type);
                if (tr && tr->block_size > m->ffn_granule) m->ffn_granule = tr->block_size;
            }
            if (!strcmp(rest, "attn_output.weight")) {
                /* a KV head owns (n_heads / n_kv_heads) * head_dim columns; a slice
                 * boundary must fall on a block of this tensor's type */
                const cm_type_traits *tr = cm_type_traits_of(t->type);
                int cols = head_cols, g = 1;
                while (tr && cols > 0 && g < m->n_kv_heads && (g * cols) % tr->block_size) g++;
                if (g > m->head_granule) m->head_granule = g;
            }
        } else if (!strcmp(t->name, "token_embd.weight")) {
            embd = t->nbytes;
            embd_params = params;
            if (t->n_dims >= 2) m->n_vocab = (int)t->ne[1];
        } else if (!strcmp(t->name, "output.weight")) {
            has_output = true;
            m->head_bytes += t->nbytes;
            m->head_params += params;
        } else {
            m->head_bytes += t->nbytes; /* output_norm, rope_freqs: small */
        }
    }
    m->embd_bytes = embd;
    if (!has_output) {
        m->head_bytes += embd;
        m->head_params += embd_params;
    }
    return 0;
}
