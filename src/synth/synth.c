/*
 * synth.c: writes a random-weight GGUF model (see synth.h). Every tensor is
 * produced at write time (cm_gguf_w_tensor_fill): its rows are drawn by a
 * compute pool (F32/F16/BF16 as floats; quantized types directly as blocks
 * of random codes and scales, see direct_row), each row from its own RNG
 * stream seeded by
 * (seed, tensor name, row), so the bytes never depend on the thread count.
 * It must never depend on libm for the values it writes (glibc and macOS
 * round logf/cosf differently; the committed references regenerate models
 * from their seeds on both).
 *
 * Scales. Float values are near-normal (a sum of four uniforms, rescaled to
 * unit variance); quantized ones are uniform codes times block scales, of
 * the same mean and std. A matrix with fan-in n gets std 1/sqrt(n), so every projection
 * of a unit-RMS input has unit-size outputs; the two that write into the
 * residual stream (attn_output, ffn_down) get half the embedding's scale, so
 * the token's own embedding stays visible through the layers. The output
 * head gets std LOGIT_STD/sqrt(n_embd): logits of std ~LOGIT_STD over a 32k
 * vocabulary give a top-1 probability of typically 0.1-0.8 (measured with
 * llama.cpp; neither uniform nor one-hot), and margins between the first two
 * candidates that are mostly large enough for greedy comparisons to mean
 * something. A tied model has one matrix for both roles: its embedding gets
 * the head's scale and the residual writes grow to std ~2 (see below). Norm weights are
 * 1 + 0.05 noise; biases (qwen2) 0.2 noise.
 */
#include "synth.h"

#include "../kernels/kernels.h"
#include "../tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define LOGIT_STD 4.0f
#define NORM_NOISE 0.05f
#define BIAS_STD 0.2f
#define ROWS_PER_CHUNK 16

enum synth_arch { A_LLAMA, A_QWEN2, A_QWEN3, A_QWEN2MOE, A_QWEN3MOE, A_GEMMA3, A_PHI3, A_GPTOSS, A_DEEPSEEK2 };

/* One --type: the file type id llama.cpp records and the weight type. */
typedef struct synth_type {
    const char *name;
    uint32_t ftype;     /* llama_ftype */
    enum cm_type wtype; /* type of the 2-D weights (q4_k_m: the base type) */
    bool mix_q4_k_m;
} synth_type;

static const synth_type k_types[] = {
    {"f32", 0, CM_TYPE_F32, false},
    {"f16", 1, CM_TYPE_F16, false},
    {"bf16", 32, CM_TYPE_BF16, false},
    {"q8_0", 7, CM_TYPE_Q8_0, false},
    {"q4_0", 2, CM_TYPE_Q4_0, false},
    {"q4_1", 3, CM_TYPE_Q4_1, false},
    {"q5_0", 8, CM_TYPE_Q5_0, false},
    {"q5_1", 9, CM_TYPE_Q5_1, false},
    {"q4_k", 14, CM_TYPE_Q4_K, false}, /* llama.cpp calls an all-Q4_K file "Q4_K_S" */
    {"q5_k", 16, CM_TYPE_Q5_K, false}, /* ... and an all-Q5_K one "Q5_K_S" */
    {"q6_k", 18, CM_TYPE_Q6_K, false},
    {"q4_k_m", 15, CM_TYPE_Q4_K, true},
    {"q5_k_m", 17, CM_TYPE_Q5_K, true}, /* the same mix with Q5_K as the base type */
    /* Low-bit types, every 2-D weight in the one type (llama_ftype names:
     * MOSTLY_Q2_K, Q3_K_S, IQ4_NL, IQ4_XS, MXFP4_MOE). */
    {"q2_k", 10, CM_TYPE_Q2_K, false},
    {"q3_k", 11, CM_TYPE_Q3_K, false},
    {"iq4_nl", 25, CM_TYPE_IQ4_NL, false},
    {"iq4_xs", 30, CM_TYPE_IQ4_XS, false},
    {"mxfp4", 38, CM_TYPE_MXFP4, false},
    /* Grid types (MOSTLY_IQ2_XXS, IQ3_XXS, IQ1_S): random blocks only, no quantizer. */
    {"iq2_xxs", 19, CM_TYPE_IQ2_XXS, false},
    {"iq3_xxs", 23, CM_TYPE_IQ3_XXS, false},
    {"iq1_s", 24, CM_TYPE_IQ1_S, false},
};

const char *cm_synth_type_names(void) {
    return "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m q2_k q3_k iq4_nl iq4_xs mxfp4 iq2_xxs iq3_xxs iq1_s";
}

static const synth_type *find_type(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < CM_ARRAY_LEN(k_types); i++)
        if (!strcmp(k_types[i].name, name)) return &k_types[i];
    return NULL;
}

static int find_arch(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "llama")) return A_LLAMA;
    if (!strcmp(name, "qwen2")) return A_QWEN2;
    if (!strcmp(name, "qwen3")) return A_QWEN3;
    if (!strcmp(name, "qwen2moe")) return A_QWEN2MOE;
    if (!strcmp(name, "qwen3moe")) return A_QWEN3MOE;
    if (!strcmp(name, "gemma3")) return A_GEMMA3;
    if (!strcmp(name, "phi3")) return A_PHI3;
    if (!strcmp(name, "gpt-oss")) return A_GPTOSS;
    if (!strcmp(name, "deepseek2")) return A_DEEPSEEK2;
    return -1;
}

/* ---- mixture of experts ---- */

static bool moe_arch(int arch) {
    return arch == A_QWEN2MOE || arch == A_QWEN3MOE || arch == A_GPTOSS || arch == A_DEEPSEEK2;
}

/* deepseek2's MLA shapes (synth.h) */
enum { DS_KV_LORA = 256, DS_Q_LORA = 256, DS_NOPE = 64, DS_ROPE = 32, DS_V = 64 };
static bool ds_lite(const cm_synth_params *p) { return p->variant && !strncmp(p->variant, "lite", 4); }
static bool ds_yarn(const cm_synth_params *p) { return p->variant && !strcmp(p->variant, "v3yarn"); }
/* "v3kvb", "litekvb": the unsplit attn_kv_b layout of GGUFs converted before llama.cpp's MLA support */
static bool ds_kvb(const cm_synth_params *p) {
    return p->variant && (!strcmp(p->variant, "v3kvb") || !strcmp(p->variant, "litekvb"));
}
static int exp_ff(const cm_synth_params *p, int arch) {
    return arch == A_LLAMA || !p->n_ff_exp ? p->n_ff : p->n_ff_exp;
}
static int shexp_ff(const cm_synth_params *p, int arch) {
    if (arch == A_DEEPSEEK2) return exp_ff(p, arch) * (ds_lite(p) ? 2 : 1); /* expert_shared_count experts */
    return arch != A_QWEN2MOE ? 0 : p->n_ff_shexp ? p->n_ff_shexp : p->n_ff;
}

static int moe_check(const cm_synth_params *p, int arch, int bs, char *err, size_t errlen) {
    if (p->n_expert < 0 || p->n_expert > 256 || p->n_expert_used < 0 || p->n_ff_exp < 0 || p->n_ff_shexp < 0)
        return cm_errf(err, errlen, CM_EINVAL, "experts must be in [0, 256], widths non-negative");
    if (p->hot_expert < 0 || p->hot_expert > p->n_expert)
        return cm_errf(err, errlen, CM_EINVAL, "the hot expert %d is not one of the %d experts", p->hot_expert - 1,
                       p->n_expert);
    if (moe_arch(arch) && p->n_expert == 0)
        return cm_errf(err, errlen, CM_EINVAL, "architecture '%s' needs --experts", p->arch);
    if (!moe_arch(arch) && arch != A_LLAMA && p->n_expert)
        return cm_errf(err, errlen, CM_EINVAL,
                       "architecture '%s' has no experts (qwen2moe, qwen3moe, gpt-oss, deepseek2, llama do)", p->arch);
    if (arch == A_DEEPSEEK2 && p->variant && strcmp(p->variant, "v3") && strcmp(p->variant, "lite") && !ds_yarn(p) &&
        !ds_kvb(p))
        return cm_errf(err, errlen, CM_EINVAL, "unknown deepseek2 variant '%s' (v3, v3yarn, lite, v3kvb, litekvb)",
                       p->variant);
    if (arch == A_DEEPSEEK2 && !ds_lite(p) && p->n_expert % 4)
        return cm_errf(err, errlen, CM_EINVAL,
                       "deepseek2 v3 puts the experts in 4 groups: --experts %d is not a multiple of 4", p->n_expert);
    if (arch == A_DEEPSEEK2 && !ds_lite(p) && p->n_expert_used > p->n_expert / 2)
        return cm_errf(err, errlen, CM_EINVAL, "deepseek2 v3 uses 2 of 4 expert groups: --experts-used must be <= %d",
                       p->n_expert / 2);
    if (arch == A_DEEPSEEK2 && (p->n_layer < 2 || p->n_embd % 256))
        return cm_errf(err, errlen, CM_EINVAL, "deepseek2 needs 2+ layers (one dense) and dim a multiple of 256");
    if (!p->n_expert) return 0;
    if (p->n_expert_used < 1 || p->n_expert_used > p->n_expert)
        return cm_errf(err, errlen, CM_EINVAL, "experts used %d must be in [1, %d]", p->n_expert_used, p->n_expert);
    if (exp_ff(p, arch) % bs || shexp_ff(p, arch) % bs)
        return cm_errf(err, errlen, CM_EINVAL, "expert widths must be multiples of %d (got %d, %d)", bs,
                       exp_ff(p, arch), shexp_ff(p, arch));
    return 0;
}

/* llama.cpp's use_more_bits(): the first and last eighth of the layers and
 * every third one in between get more bits in Q4_K_M. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int cm_synth_check(const cm_synth_params *p, char *err, size_t errlen) {
    const synth_type *st = find_type(p->type);
    if (find_arch(p->arch) < 0)
        return cm_errf(
            err, errlen, CM_EINVAL,
            "unknown architecture '%s' (supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, phi3, gpt-oss, deepseek2)",
            p->arch ? p->arch : "");
    if (!st)
        return cm_errf(err, errlen, CM_EINVAL, "unknown type '%s' (supported: %s)", p->type ? p->type : "",
                       cm_synth_type_names());
    if (p->n_embd <= 0 || p->n_layer <= 0 || p->n_head <= 0 || p->n_head_kv <= 0 || p->n_ff <= 0)
        return cm_errf(err, errlen, CM_EINVAL, "dim, layers, heads, kv-heads and ffn must be positive");
    if (p->n_embd > (1 << 16) || p->n_ff > (1 << 18) || p->n_layer > 1024 || p->n_head > 1024)
        return cm_errf(err, errlen, CM_EINVAL, "model shape too large");
    if (p->n_embd % p->n_head)
        return cm_errf(err, errlen, CM_EINVAL, "dim %d is not a multiple of heads %d", p->n_embd, p->n_head);
    if ((p->n_embd / p->n_head) % 2)
        return cm_errf(err, errlen, CM_EINVAL, "head dimension %d must be even (RoPE pairs)", p->n_embd / p->n_head);
    if (p->n_head % p->n_head_kv)
        return cm_errf(err, errlen, CM_EINVAL, "heads %d is not a multiple of kv-heads %d", p->n_head, p->n_head_kv);
    int bs = cm_type_traits_of(st->wtype)->block_size;
    if (st->mix_q4_k_m) bs = CM_QK_K;
    if (p->n_embd % bs || p->n_ff % bs)
        return cm_errf(err, errlen, CM_EINVAL, "type %s needs dim and ffn to be multiples of %d (got %d, %d)", st->name,
                       bs, p->n_embd, p->n_ff);
    if (p->n_ctx < 0) return cm_errf(err, errlen, CM_EINVAL, "context length must be positive");
    if (p->rope_scaling && strcmp(p->rope_scaling, "none") && strcmp(p->rope_scaling, "linear") &&
        strcmp(p->rope_scaling, "yarn"))
        return cm_errf(err, errlen, CM_EINVAL, "unknown rope scaling '%s' (supported: none, linear, yarn, llama3)",
                       p->rope_scaling);
    if (p->rope_scaling && p->rope_llama3)
        return cm_errf(err, errlen, CM_EINVAL, "llama3 rope scaling is written without a scaling type");
    return moe_check(p, find_arch(p->arch), bs, err, errlen);
}

/* ---- deterministic values ---- */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Near-normal values of mean 0 and std 1: the sum of four 16-bit uniforms is
 * exact in integers; centring and scaling is one float multiply, so the
 * value is the same on every IEEE machine. Range +-3.46. */
static void fill_normal(cm_rng *r, float *x, int64_t n, float mean, float std) {
    /* sum of 4 U{0..65535}: mean 131070, variance 4 * (65536^2 - 1) / 12 */
    const float k = std * (float)(1.0 / sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0));
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = cm_rng_next(r);
        int32_t s = (int32_t)(u & 0xffff) + (int32_t)((u >> 16) & 0xffff) + (int32_t)((u >> 32) & 0xffff) +
                    (int32_t)(u >> 48) - 131070;
        x[i] = mean + (float)s * k;
    }
}

void cm_synth_llama3_freqs(float *out, int head_dim, float rope_base) {
    const double factor = 8, low = 1, high = 4, old_ctx = 8192;
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < head_dim / 2; i++) {
        double freq = 1.0 / pow((double)rope_base, (double)(2 * i) / head_dim);
        double wavelen = 2 * pi / freq, f;
        if (wavelen < high_wavelen) f = 1;
        else if (wavelen > low_wavelen) f = factor;
        else {
            double smooth = (old_ctx / wavelen - low) / (high - low);
            f = 1 / ((1 - smooth) / factor + smooth);
        }
        out[i] = (float)f;
    }
}

/* ---- tensors ---- */

typedef struct synth_run synth_run;

typedef struct synth_tensor {
    synth_run *run;
    char name[64];
    enum cm_type type;
    int64_t ne0, nrows;
    int64_t ne2; /* 3-D (stacked experts): nrows = ne1 * ne2; 0 = 2-D */
    float mean, std;
    const float *fixed; /* rope_freqs: exact values instead of noise */
    int64_t hot_row;    /* >= 0: this row (an F32 router's expert) scaled by 40 */
    uint64_t seed;
} synth_tensor;

struct synth_run {
    const cm_synth_params *p;
    cm_pool *pool;
    float *scratch; /* [n_threads][ROWS_PER_CHUNK * max_row] */
    int64_t max_row;
    uint64_t done, total;
    /* the job of the current fill */
    const synth_tensor *cur;
    void *dst;
    int qfail;
};

/* ---- weights drawn in the quantized domain ----
 * Drawing floats and running the reference quantizers (the K-quants' scale
 * searches above all) costs ~50 s of CPU for a 1B model; a weight is only
 * noise of a given std, so quantized tensors are drawn as blocks instead:
 * uniformly random codes (random bytes: every code bit is an independent
 * fair bit, whatever the packing) and block scales chosen so that the
 * dequantized values have mean 0 and the tensor's std. A uniform code over
 * n levels has std sqrt((n^2 - 1) / 12). Codes whose range is off-centre
 * (q8_0 -128..127, q4_0 -8..7, q6_K -32..31: mean -1/2) get a random sign
 * on the block scale (q6_K: on each sub-block scale), so no matrix has a
 * common-mode bias; types with a minimum (q4_1, q5_1, q4_K, q5_K) get
 * m = -(n - 1) / 2 * d. K-quant sub-block scales are uniform integers in
 * [K_SC_LO, max] like the varying scales of real weights. */
#define K_SC_LO 16

static float code_std(int levels) { return sqrtf((float)((double)levels * levels - 1) / 12.0f); }

/* rms of the integers lo..hi, exactly summed */
static float int_rms(int lo, int hi) {
    double s = 0;
    for (int i = lo; i <= hi; i++) s += (double)i * i;
    return sqrtf((float)(s / (hi - lo + 1)));
}

static void rand_bytes(cm_rng *r, uint8_t *p, size_t n) {
    while (n) {
        uint64_t u = cm_rng_next(r);
        for (int k = 0; k < 8 && n; k++, n--, u >>= 8) *p++ = (uint8_t)u;
    }
}

static bool direct_type(enum cm_type t) {
    switch (t) {
    case CM_TYPE_Q8_0:
    case CM_TYPE_Q4_0:
    case CM_TYPE_Q4_1:
    case CM_TYPE_Q5_0:
    case CM_TYPE_Q5_1:
    case CM_TYPE_Q4_K:
    case CM_TYPE_Q5_K:
    case CM_TYPE_Q6_K: return true;
    case CM_TYPE_IQ2_XXS:
    case CM_TYPE_IQ3_XXS:
    case CM_TYPE_IQ1_S: return true;
    default: return false;
    }
}

/* a random integer in lo..hi (modulo bias is irrelevant for noise) */
static int rand_int(cm_rng *r, int lo, int hi) { return lo + (int)(cm_rng_next(r) % (uint64_t)(hi - lo + 1)); }

static cm_f16 rand_sign(cm_rng *r, cm_f16 d) { return (cm_f16)(d ^ (cm_rng_next(r) & 1 ? 0x8000u : 0)); }

/* One row of ne0 values of type t, std `std`, mean 0. */
static void direct_row(cm_rng *r, enum cm_type t, void *dst, int64_t ne0, float std) {
    switch (t) {
    case CM_TYPE_Q8_0: {
        const cm_f16 d = cm_f32_to_f16(std / code_std(256));
        cm_block_q8_0 *b = dst;
        for (int64_t i = 0; i < ne0 / CM_QK8_0; i++) {
            b[i].d = rand_sign(r, d);
            rand_bytes(r, (uint8_t *)b[i].qs, sizeof b[i].qs);
        }
        break;
    }
    case CM_TYPE_Q4_0:
    case CM_TYPE_Q5_0: {
        const bool q5 = t == CM_TYPE_Q5_0;
        const cm_f16 d = cm_f32_to_f16(std / code_std(q5 ? 32 : 16));
        for (int64_t i = 0; i < ne0 / 32; i++) {
            if (q5) {
                cm_block_q5_0 *b = (cm_block_q5_0 *)dst + i;
                b->d = rand_sign(r, d);
                rand_bytes(r, b->qh, sizeof b->qh);
                rand_bytes(r, b->qs, sizeof b->qs);
            } else {
                cm_block_q4_0 *b = (cm_block_q4_0 *)dst + i;
                b->d = rand_sign(r, d);
                rand_bytes(r, b->qs, sizeof b->qs);
            }
        }
        break;
    }
    case CM_TYPE_Q4_1:
    case CM_TYPE_Q5_1: {
        const bool q5 = t == CM_TYPE_Q5_1;
        const cm_f16 d = cm_f32_to_f16(std / code_std(q5 ? 32 : 16));
        const cm_f16 m = cm_f32_to_f16(-(q5 ? 15.5f : 7.5f) * cm_f16_to_f32(d));
        for (int64_t i = 0; i < ne0 / 32; i++) {
            if (q5) {
                cm_block_q5_1 *b = (cm_block_q5_1 *)dst + i;
                b->d = d, b->m = m;
                rand_bytes(r, b->qh, sizeof b->qh);
                rand_bytes(r, b->qs, sizeof b->qs);
            } else {
                cm_block_q4_1 *b = (cm_block_q4_1 *)dst + i;
                b->d = d, b->m = m;
                rand_bytes(r, b->qs, sizeof b->qs);
            }
        }
        break;
    }
    case CM_TYPE_Q4_K:
    case CM_TYPE_Q5_K: {
        /* y = d * sc * q - dmin * m with m = sc, dmin = (n - 1) / 2 * d:
         * y = d * sc * (q - (n - 1) / 2), centred. Scales packed as
         * llama.cpp's quantize_row_q4_K_ref does (get_scale_min_k4). */
        const bool q5 = t == CM_TYPE_Q5_K;
        const cm_f16 d = cm_f32_to_f16(std / (code_std(q5 ? 32 : 16) * int_rms(K_SC_LO, 63)));
        const cm_f16 dmin = cm_f32_to_f16((q5 ? 15.5f : 7.5f) * cm_f16_to_f32(d));
        for (int64_t i = 0; i < ne0 / CM_QK_K; i++) {
            uint8_t *scales, sc[8];
            if (q5) {
                cm_block_q5_k *b = (cm_block_q5_k *)dst + i;
                b->d = d, b->dmin = dmin, scales = b->scales;
                rand_bytes(r, b->qh, sizeof b->qh);
                rand_bytes(r, b->qs, sizeof b->qs);
            } else {
                cm_block_q4_k *b = (cm_block_q4_k *)dst + i;
                b->d = d, b->dmin = dmin, scales = b->scales;
                rand_bytes(r, b->qs, sizeof b->qs);
            }
            for (int j = 0; j < 8; j++) sc[j] = (uint8_t)rand_int(r, K_SC_LO, 63);
            memset(scales, 0, CM_K_SCALE_SIZE);
            for (int j = 0; j < 8; j++) {
                const uint8_t ls = sc[j], lm = sc[j];
                if (j < 4) {
                    scales[j] = ls;
                    scales[j + 4] = lm;
                } else {
                    scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                    scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                    scales[j] |= (uint8_t)((lm >> 4) << 6);
                }
            }
        }
        break;
    }
    case CM_TYPE_Q6_K: {
        const cm_f16 d = cm_f32_to_f16(std / (code_std(64) * int_rms(K_SC_LO * 2, 127)));
        cm_block_q6_k *b = dst;
        for (int64_t i = 0; i < ne0 / CM_QK_K; i++) {
            b[i].d = d;
            rand_bytes(r, b[i].ql, sizeof b[i].ql);
            rand_bytes(r, b[i].qh, sizeof b[i].qh);
            for (int j = 0; j < CM_QK_K / 16; j++) {
                const int s = rand_int(r, K_SC_LO * 2, 127);
                b[i].scales[j] = (int8_t)(cm_rng_next(r) & 1 ? -s : s);
            }
        }
        break;
    }
    case CM_TYPE_IQ2_XXS:
    case CM_TYPE_IQ3_XXS:
    case CM_TYPE_IQ1_S: {
        /* Random grid indices, signs and scales (the type has no quantizer);
         * d = 1 first, then the block's rms sets the d that gives it `std`. */
        const size_t bs = cm_type_traits_of(t)->type_size;
        float v[CM_QK_K];
        for (int64_t i = 0; i < ne0 / CM_QK_K; i++) {
            uint8_t *b = (uint8_t *)dst + (size_t)i * bs;
            rand_bytes(r, b, bs);
            b[0] = 0x00, b[1] = 0x3c; /* f16 1.0, little-endian */
            cm_kernels_ref()->to_float[t](b, v, CM_QK_K);
            double s2 = 0;
            for (int j = 0; j < CM_QK_K; j++) s2 += (double)v[j] * v[j];
            const cm_f16 d = cm_f32_to_f16(std / (float)sqrt(s2 / CM_QK_K));
            b[0] = (uint8_t)d, b[1] = (uint8_t)(d >> 8);
        }
        break;
    }
    default: CM_ASSERT(0);
    }
}

static void fill_job(void *ctx, int ith, int nth) {
    synth_run *R = ctx;
    const synth_tensor *t = R->cur;
    const size_t row_size = cm_row_size(t->type, t->ne0);
    if (direct_type(t->type) && t->mean == 0 && t->hot_row < 0) {
        int64_t r0, r1;
        cm_split_range(t->nrows, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            cm_rng rng;
            cm_rng_seed(&rng, mix64(t->seed ^ mix64((uint64_t)r)));
            direct_row(&rng, t->type, (char *)R->dst + (size_t)r * row_size, t->ne0, t->std);
        }
        return;
    }
    float *buf = R->scratch + (size_t)ith * ROWS_PER_CHUNK * (size_t)R->max_row;
    int64_t nchunks = (t->nrows + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK, c0, c1;
    cm_split_range(nchunks, ith, nth, &c0, &c1);
    for (int64_t c = c0; c < c1; c++) {
        int64_t r0 = c * ROWS_PER_CHUNK, r1 = CM_MIN(r0 + ROWS_PER_CHUNK, t->nrows);
        for (int64_t r = r0; r < r1; r++) {
            cm_rng rng;
            cm_rng_seed(&rng, mix64(t->seed ^ mix64((uint64_t)r)));
            fill_normal(&rng, buf + (r - r0) * t->ne0, t->ne0, t->mean, t->std);
            if (r == t->hot_row) /* the skewed router's hot expert */
                for (int64_t c = 0; c < t->ne0; c++) buf[(r - r0) * t->ne0 + c] *= 40.0f;
        }
        char *out = (char *)R->dst + (size_t)r0 * row_size;
        if (cm_quantize_rows(t->type, buf, out, r1 - r0, t->ne0) != (size_t)(r1 - r0) * row_size) R->qfail = 1;
    }
}

static int fill_tensor(void *ctx, void *dst, uint64_t nbytes, char *err, size_t errlen) {
    synth_tensor *t = ctx;
    synth_run *R = t->run;
    if (nbytes != cm_row_size(t->type, t->ne0) * (uint64_t)t->nrows)
        return cm_errf(err, errlen, CM_EINVAL, "tensor '%s': size mismatch", t->name);
    if (t->fixed) {
        memcpy(dst, t->fixed, (size_t)nbytes);
    } else {
        R->cur = t;
        R->dst = dst;
        R->qfail = 0;
        cm_pool_run(R->pool, fill_job, R);
        if (R->qfail)
            return cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s': cannot quantize to %s", t->name,
                           cm_type_name(t->type));
    }
    R->done += nbytes;
    if (R->p->progress) R->p->progress(R->p->progress_ctx, R->done, R->total);
    return 0;
}

typedef struct synth_plan {
    synth_tensor *t;
    int n, cap;
} synth_plan;

static synth_tensor *add(synth_plan *P, synth_run *R, const char *name, enum cm_type type, int64_t ne0, int64_t nrows,
                         float mean, float std) {
    CM_ASSERT(P->n < P->cap);
    synth_tensor *t = &P->t[P->n++];
    memset(t, 0, sizeof *t);
    t->run = R;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->ne0 = ne0;
    t->nrows = nrows;
    t->mean = mean;
    t->std = std;
    t->hot_row = -1;
    t->seed = mix64(R->p->seed ^ name_hash(name));
    R->max_row = CM_MAX(R->max_row, ne0);
    R->total += cm_row_size(type, ne0) * (uint64_t)nrows;
    return t;
}

int cm_synth_write(const cm_synth_params *p, const cm_gguf *vocab, const char *path, cm_buf *out, char *err,
                   size_t errlen) {
    int rc = cm_synth_check(p, err, errlen);
    if (rc) return rc;
    const synth_type *st = find_type(p->type);
    const int arch = find_arch(p->arch);
    const cm_gguf_kv *toks = cm_gguf_find_kv(vocab, "tokenizer.ggml.tokens");
    if (!toks || toks->type != CM_GGUF_ARRAY || toks->arr_type != CM_GGUF_STRING || toks->arr_len == 0 ||
        toks->arr_len > (1u << 22))
        return cm_errf(err, errlen, CM_EFORMAT, "vocabulary has no tokenizer.ggml.tokens array");
    const int64_t n_vocab = (int64_t)toks->arr_len;
    const int E = p->n_embd, L = p->n_layer, H = p->n_head, HKV = p->n_head_kv, F = p->n_ff;
    const int D = E / H;
    const float rope_base = p->rope_base > 0                    ? p->rope_base
                            : arch == A_GPTOSS                  ? 150000.0f
                            : arch == A_DEEPSEEK2               ? 10000.0f
                            : arch != A_LLAMA && arch != A_PHI3 ? 1e6f
                            : p->rope_llama3                    ? 500000.0f
                                                                : 10000.0f;
    const float eps = arch == A_LLAMA || arch == A_PHI3 || arch == A_GPTOSS ? 1e-5f : 1e-6f;
    const bool gptoss = arch == A_GPTOSS;
    const bool qwen2b = arch == A_QWEN2 || arch == A_QWEN2MOE || gptoss;           /* q/k/v biases */
    const bool qwen3n = arch == A_QWEN3 || arch == A_QWEN3MOE || arch == A_GEMMA3; /* per-head Q/K norms */
    const int X
    = p->n_expert, FX = exp_ff(p, arch), FSH = shexp_ff(p, arch);

    synth_run R = {.p = p};
    synth_plan P = {.cap = 4 + L * 22};
    float *freqs = NULL;
    cm_gguf_writer *w = NULL;
    P.t = cm_calloc((size_t)P.cap, sizeof *P.t);
    if (!P.t) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");

    /* Types per tensor. q4_k_m (and q5_k_m, with Q5_K for Q4_K) follows llama.cpp's llama_tensor_get_type():
     * output (or a tied token_embd, which is the head) Q6_K; attn_v and
     * ffn_down Q6_K in the layers use_more_bits() picks; the rest Q4_K. */
    /* gpt-oss mxfp4: MXFP4 experts, Q8_0 elsewhere, as the released files
     * (llama.cpp's MOSTLY_MXFP4_MOE) */
    const enum cm_type xt = st->wtype;
    const enum cm_type wt = gptoss && xt == CM_TYPE_MXFP4 ? CM_TYPE_Q8_0 : st->wtype;
    const enum cm_type head_t = st->mix_q4_k_m ? CM_TYPE_Q6_K : wt;
    const enum cm_type embd_t = p->tied ? head_t : wt;
    const float head_std = LOGIT_STD / sqrtf((float)E);
    /* gemma3 scales the embeddings by sqrt(n_embd): drawn at 1/sqrt(n_embd),
     * the stream starts at unit size like the other architectures'. */
    const float embd_std = p->tied ? head_std : arch == A_GEMMA3 ? 1.0f / sqrtf((float)E) : 1.0f;
    /* Tied: the embedding must be small to serve as the head, and a token's
     * own embedding would then dominate its own logit (|e|^2 = 16 against
     * logits of std 4: one-hot repeats), so the layers write at std ~2 and
     * the stream is mostly their output. */
    const float res_scale = p->tied ? 2.0f : 0.5f * embd_std;

    if (p->rope_llama3) {
        freqs = cm_malloc(sizeof(float) * (size_t)(D / 2));
        if (!freqs) {
            rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
            goto done;
        }
        cm_synth_llama3_freqs(freqs, D, rope_base);
        add(&P, &R, "rope_freqs.weight", CM_TYPE_F32, D / 2, 1, 0, 0)->fixed = freqs;
    }
    add(&P, &R, "token_embd.weight", embd_t, E, n_vocab, 0, embd_std);
    for (int l = 0; l < L; l++) {
        char n[64];
        const bool more = use_more_bits(l, L);
        /* llama.cpp gives an 8-expert Q4_K_M model Q8_0 attn_k/attn_v and Q5_K attn_output */
        const bool x8 = st->mix_q4_k_m && X
        == 8;
        const enum cm_type v_t = x8 ? CM_TYPE_Q8_0 : st->mix_q4_k_m && more ? CM_TYPE_Q6_K : wt;
        const enum cm_type k_t = x8 ? CM_TYPE_Q8_0 : wt, o_t = x8 ? CM_TYPE_Q5_K : wt;
        const enum cm_type down_t = st->mix_q4_k_m && more ? CM_TYPE_Q6_K : wt;
#define T(suffix, type, ne0, rows, mean, std) \
    (snprintf(n, sizeof n, "blk.%d." suffix, l), add(&P, &R, n, type, ne0, rows, mean, std))
        T("attn_norm.weight", CM_TYPE_F32, E, 1, 1, NORM_NOISE);
        if (arch == A_DEEPSEEK2) { /* MLA; k_b rows are DS_NOPE long: Q8_0 where the type's block is longer */
            const enum cm_type kb_t = DS_NOPE % cm_type_traits_of(wt)->block_size ? CM_TYPE_Q8_0 : wt;
            if (ds_lite(p)) {
                T("attn_q.weight", wt, E, H * (DS_NOPE + DS_ROPE), 0, 1 / sqrtf((float)E));
            } else {
                T("attn_q_a.weight", wt, E, DS_Q_LORA, 0, 1 / sqrtf((float)E));
                T("attn_q_a_norm.weight", CM_TYPE_F32, DS_Q_LORA, 1, 1, NORM_NOISE);
                T("attn_q_b.weight", wt, DS_Q_LORA, H * (DS_NOPE + DS_ROPE), 0, 1 / sqrtf((float)DS_Q_LORA));
            }
            T("attn_kv_a_mqa.weight", wt, E, DS_KV_LORA + DS_ROPE, 0, 1 / sqrtf((float)E));
            T("attn_kv_a_norm.weight", CM_TYPE_F32, DS_KV_LORA, 1, 1, NORM_NOISE);
            if (ds_kvb(p)) { /* per head DS_NOPE key rows then DS_V value rows, each over the latent */
                T("attn_kv_b.weight", wt, DS_KV_LORA, (int64_t)H * (DS_NOPE + DS_V), 0, 1 / sqrtf((float)DS_KV_LORA));
            } else {
                T("attn_k_b.weight", kb_t, DS_NOPE, (int64_t)DS_KV_LORA * H, 0, 1 / sqrtf((float)DS_NOPE))->ne2 = H;
                T("attn_v_b.weight", wt, DS_KV_LORA, (int64_t)DS_V * H, 0, 1 / sqrtf((float)DS_KV_LORA))->ne2 = H;
            }
            T("attn_output.weight", o_t, H * DS_V, E, 0, res_scale / sqrtf((float)(H * DS_V)));
        } else if (arch == A_PHI3) {
            /* fused q, k, v rows; llama.cpp's Q4_K_M makes it Q5_K, its Q5_K_M Q6_K */
            T("attn_qkv.weight", st->mix_q4_k_m ? (wt == CM_TYPE_Q5_K ? CM_TYPE_Q6_K : CM_TYPE_Q5_K) : wt, E,
              (H + 2 * HKV) * D, 0, 1 / sqrtf((float)E));
        } else {
            T("attn_q.weight", wt, E, H * D, 0, 1 / sqrtf((float)E));
            if (qwen2b) T("attn_q.bias", CM_TYPE_F32, H * D, 1, 0, BIAS_STD);
            T("attn_k.weight", k_t, E, HKV * D, 0, 1 / sqrtf((float)E));
            if (qwen2b) T("attn_k.bias", CM_TYPE_F32, HKV * D, 1, 0, BIAS_STD);
            T("attn_v.weight", v_t, E, HKV * D, 0, 1 / sqrtf((float)E));
            if (qwen2b) T("attn_v.bias", CM_TYPE_F32, HKV * D, 1, 0, BIAS_STD);
        }
        if (qwen3n) {
            T("attn_q_norm.weight", CM_TYPE_F32, D, 1, 1, NORM_NOISE);
            T("attn_k_norm.weight", CM_TYPE_F32, D, 1, 1, NORM_NOISE);
        }
        if (arch != A_DEEPSEEK2) T("attn_output.weight", o_t, H * D, E, 0, res_scale / sqrtf((float)(H * D)));
        if (gptoss) {
            T("attn_output.bias", CM_TYPE_F32, E, 1, 0, BIAS_STD);
            T("attn_sinks.weight", CM_TYPE_F32, H, 1, 0, 1);
            T("post_attention_norm.weight", CM_TYPE_F32, E, 1, 1, NORM_NOISE); /* its pre-FFN norm */
        } else {
            T("ffn_norm.weight", CM_TYPE_F32, E, 1, 1, NORM_NOISE);
        }
        if (gptoss) {
            /* gate/up at std 3 so that the clamps at +-7 of its SwiGLU bite
             * now and then; down scaled to keep the stream's size */
            T("ffn_gate_inp.weight", CM_TYPE_F32, E, X, 0, 1 / sqrtf((float)E));
            T("ffn_gate_inp.bias", CM_TYPE_F32, X, 1, 0, BIAS_STD);
            T("ffn_gate_exps.weight", xt, E, (int64_t)FX * X, 0, 3 / sqrtf((float)E))->ne2 = X;
            T("ffn_gate_exps.bias", CM_TYPE_F32, FX, X, 0, BIAS_STD);
            T("ffn_up_exps.weight", xt, E, (int64_t)FX * X, 0, 3 / sqrtf((float)E))->ne2 = X;
            T("ffn_up_exps.bias", CM_TYPE_F32, FX, X, 0, BIAS_STD);
            T("ffn_down_exps.weight", xt, FX, (int64_t)E * X, 0, res_scale / (6 * sqrtf((float)FX)))->ne2 = X;
            T("ffn_down_exps.bias", CM_TYPE_F32, E, X, 0, BIAS_STD);
        } else if (X && !(arch == A_DEEPSEEK2 && l == 0)) { /* deepseek2: layer 0 is dense */
            /* the router in F32 as llama.cpp keeps it; experts stacked [ne0, rows, X] */
            T("ffn_gate_inp.weight", CM_TYPE_F32, E, X, 0, 1 / sqrtf((float)E))->hot_row =
                l >= p->hot_first_layer ? p->hot_expert - 1 : -1;
            T("ffn_gate_exps.weight", wt, E, (int64_t)FX * X, 0, 1 / sqrtf((float)E))->ne2 = X;
            T("ffn_up_exps.weight", wt, E, (int64_t)FX * X, 0, 1 / sqrtf((float)E))->ne2 = X;
            T("ffn_down_exps.weight", down_t, FX, (int64_t)E * X, 0, res_scale / sqrtf((float)FX))->ne2 = X;
            if (arch == A_DEEPSEEK2 && !ds_lite(p)) /* V3's selection bias: visible next to sigmoids of ~0.5 +- 0.2 */
                T("exp_probs_b.bias", CM_TYPE_F32, X, 1, 0, 0.1f);
            if (FSH) {
                if (arch != A_DEEPSEEK2) T("ffn_gate_inp_shexp.weight", CM_TYPE_F32, E, 1, 0, 1 / sqrtf((float)E));
                T("ffn_gate_shexp.weight", wt, E, FSH, 0, 1 / sqrtf((float)E));
                T("ffn_up_shexp.weight", wt, E, FSH, 0, 1 / sqrtf((float)E));
                T("ffn_down_shexp.weight", down_t, FSH, E, 0, res_scale / sqrtf((float)FSH));
            }
        } else if (arch == A_PHI3) { /* fused: gate rows, then up rows */
            T("ffn_up.weight", wt, E, 2 * F, 0, 1 / sqrtf((float)E));
            T("ffn_down.weight", down_t, F, E, 0, res_scale / sqrtf((float)F));
        } else {
            T("ffn_gate.weight", wt, E, F, 0, 1 / sqrtf((float)E));
            T("ffn_up.weight", wt, E, F, 0, 1 / sqrtf((float)E));
            T("ffn_down.weight", down_t, F, E, 0, res_scale / sqrtf((float)F));
        }
        if (arch == A_GEMMA3) {
            /* The post-norms fix each block's output at the RMS of their
             * weights. Tied, the scaled embedding has std LOGIT_STD (16x
             * the head's 0.25): weights of 2 * LOGIT_STD let the 2L blocks
             * outgrow it (else every logit is a one-hot repeat). */
            const float pn = p->tied ? 2 * LOGIT_STD : 1;
            T("post_attention_norm.weight", CM_TYPE_F32, E, 1, pn, pn * NORM_NOISE);
            T("post_ffw_norm.weight", CM_TYPE_F32, E, 1, pn, pn * NORM_NOISE);
        }
#undef T
    }
    add(&P, &R, "output_norm.weight", CM_TYPE_F32, E, 1, 1, NORM_NOISE);
    if (!p->tied) add(&P, &R, "output.weight", head_t, E, n_vocab, 0, head_std);

    w = cm_gguf_writer_new(0);
    if (!w) {
        rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        goto done;
    }
    char key[128];
#define K(fmt) (snprintf(key, sizeof key, "%s." fmt, p->arch), key)
    cm_gguf_w_str(w, "general.architecture", p->arch);
    char name[64];
    /* llama.cpp sets Phi-3 token attributes by general.name ("phi3" in it:
     * it looks up <|endoftext|>, absent from most vocabularies) */
    snprintf(name, sizeof name, "synth-%s-%s", arch == A_PHI3 ? "phi_3" : p->arch, st->name);
    cm_gguf_w_str(w, "general.name", name);
    cm_gguf_w_u32(w, "general.file_type", st->ftype);
    if (wt != CM_TYPE_F32 && wt != CM_TYPE_F16 && wt != CM_TYPE_BF16)
        cm_gguf_w_u32(w, "general.quantization_version", 2);
    cm_gguf_w_u32(w, K("vocab_size"), (uint32_t)n_vocab);
    cm_gguf_w_u32(w, K("context_length"), (uint32_t)(p->n_ctx > 0 ? p->n_ctx : 4096));
    cm_gguf_w_u32(w, K("embedding_length"), (uint32_t)E);
    cm_gguf_w_u32(w, K("block_count"), (uint32_t)L);
    cm_gguf_w_u32(w, K("feed_forward_length"), (uint32_t)F);
    cm_gguf_w_u32(w, K("attention.head_count"), (uint32_t)H);
    /* deepseek2: 1 (the latent), or every head (the unsplit layout's MHA view) */
    cm_gguf_w_u32(w, K("attention.head_count_kv"), (uint32_t)(arch == A_DEEPSEEK2 ? (ds_kvb(p) ? H : 1) : HKV));
    cm_gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), eps);
    if (X) {
        cm_gguf_w_u32(w, K("expert_count"), (uint32_t)X);
        cm_gguf_w_u32(w, K("expert_used_count"), (uint32_t)p->n_expert_used);
        if (moe_arch(arch)) cm_gguf_w_u32(w, K("expert_feed_forward_length"), (uint32_t)FX);
        if (FSH && arch != A_DEEPSEEK2) cm_gguf_w_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)FSH);
    }
    if (arch == A_DEEPSEEK2) { /* MLA (split k_b/v_b, or kvb's unsplit kv_b); DeepSeek's MoE keys */
        const bool lite = ds_lite(p);
        cm_gguf_w_u32(w, K("attention.q_lora_rank"), lite ? 0 : DS_Q_LORA);
        cm_gguf_w_u32(w, K("attention.kv_lora_rank"), DS_KV_LORA);
        if (ds_kvb(p)) { /* the old converter's: the heads' sizes, no *_mla keys */
            cm_gguf_w_u32(w, K("attention.key_length"), DS_NOPE + DS_ROPE);
            cm_gguf_w_u32(w, K("attention.value_length"), DS_V);
        } else {
            cm_gguf_w_u32(w, K("attention.key_length"), DS_KV_LORA + DS_ROPE);
            cm_gguf_w_u32(w, K("attention.value_length"), DS_KV_LORA);
            cm_gguf_w_u32(w, K("attention.key_length_mla"), DS_NOPE + DS_ROPE);
            cm_gguf_w_u32(w, K("attention.value_length_mla"), DS_V);
        }
        cm_gguf_w_u32(w, K("leading_dense_block_count"), 1);
        cm_gguf_w_u32(w, K("expert_shared_count"), lite ? 2 : 1);
        cm_gguf_w_f32(w, K("expert_weights_scale"), lite ? 1.0f : 2.5f);
        cm_gguf_w_bool(w, K("expert_weights_norm"), !lite);
        cm_gguf_w_u32(w, K("expert_gating_func"), lite ? 1 : 2);
        if (!lite) {
            cm_gguf_w_u32(w, K("expert_group_count"), 4);
            cm_gguf_w_u32(w, K("expert_group_used_count"), 2);
        }
        if (ds_yarn(p)) { /* DeepSeek V3's: factor 40 from 4096 positions, mscale_all_dim 1 (written x 0.1) */
            cm_gguf_w_str(w, K("rope.scaling.type"), "yarn");
            cm_gguf_w_f32(w, K("rope.scaling.factor"), 40.0f);
            cm_gguf_w_u32(w, K("rope.scaling.original_context_length"), 4096);
            cm_gguf_w_f32(w, K("rope.scaling.yarn_log_multiplier"), 0.1f);
        }
    }
    if (qwen3n || gptoss) {
        cm_gguf_w_u32(w, K("attention.key_length"), (uint32_t)D);
        cm_gguf_w_u32(w, K("attention.value_length"), (uint32_t)D);
    }
    /* gemma3: a short window so that short prompts cross it; llama.cpp's
     * rule makes every 6th layer global (no pattern key is written). */
    if (arch == A_GEMMA3 || gptoss)
        cm_gguf_w_u32(w, K("attention.sliding_window"), (uint32_t)(p->n_swa > 0 ? p->n_swa : 8));
    if (gptoss) { /* the released files' YaRN (factor 32 over 4096 positions); no pattern key: llama.cpp's 2 */
        cm_gguf_w_str(w, K("rope.scaling.type"), "yarn");
        cm_gguf_w_f32(w, K("rope.scaling.factor"), 32.0f);
        cm_gguf_w_u32(w, K("rope.scaling.original_context_length"), 4096);
    }
    cm_gguf_w_f32(w, K("rope.freq_base"), rope_base);
    cm_gguf_w_u32(w, K("rope.dimension_count"), (uint32_t)(arch == A_DEEPSEEK2 ? DS_ROPE : D));
    if (p->rope_scaling) {
        cm_gguf_w_str(w, K("rope.scaling.type"), p->rope_scaling);
        if (p->rope_factor > 0) cm_gguf_w_f32(w, K("rope.scaling.factor"), p->rope_factor);
        if (p->rope_orig_ctx > 0)
            cm_gguf_w_u32(w, K("rope.scaling.original_context_length"), (uint32_t)p->rope_orig_ctx);
        if (p->rope_attn_factor > 0) cm_gguf_w_f32(w, K("rope.scaling.attn_factor"), p->rope_attn_factor);
        if (p->yarn_beta_fast > 0) cm_gguf_w_f32(w, K("rope.scaling.yarn_beta_fast"), p->yarn_beta_fast);
        if (p->yarn_beta_slow > 0) cm_gguf_w_f32(w, K("rope.scaling.yarn_beta_slow"), p->yarn_beta_slow);
        if (p->yarn_log_mul > 0) cm_gguf_w_f32(w, K("rope.scaling.yarn_log_multiplier"), p->yarn_log_mul);
    }
#undef K
    /* The vocabulary, verbatim. */
    for (uint64_t i = 0; i < vocab->n_kv; i++)
        if (!strncmp(vocab->kv[i].key, "tokenizer.", 10)) cm_gguf_w_copy_kv(w, &vocab->kv[i]);
    for (int i = 0; i < P.n; i++) {
        const synth_tensor *t = &P.t[i];
        int64_t ne[3] = {t->ne0, t->ne2 ? t->nrows / t->ne2 : t->nrows, t->ne2};
        cm_gguf_w_tensor_fill(w, t->name, t->type, t->ne2 ? 3 : t->nrows > 1 ? 2 : 1, ne, fill_tensor, &P.t[i]);
    }

    int nth = p->n_threads > 0 ? p->n_threads : cm_cpu_count();
    if (nth < 1) nth = 1;
    R.pool = cm_pool_new(nth);
    R.scratch = cm_malloc(sizeof(float) * (size_t)nth * ROWS_PER_CHUNK * (size_t)R.max_row);
    if (!R.pool || !R.scratch) {
        rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        goto done;
    }
    rc = path ? cm_gguf_writer_write(w, path, err, errlen) : cm_gguf_writer_write_buf(w, out, err, errlen);
done:
    cm_gguf_writer_free(w);
    if (R.pool) cm_pool_free(R.pool);
    cm_free(R.scratch);
    cm_free(freqs);
    cm_free(P.t);
    return rc;
}
