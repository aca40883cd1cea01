/*
 * tp_model.h: a random-weight llama GGUF made with the GGUF writer, for the
 * tensor-parallel test (small, in memory) and bench/tp_bench (1B-class, on
 * disk). Tensors are produced one at a time at write time (fill callbacks),
 * so a file bigger than memory never sits in memory. Weights are uniform in
 * +-1.7/sqrt(fan_in), norms near 1, from a fixed seed per tensor. No
 * tokenizer: callers feed token ids.
 */
#ifndef TP_MODEL_H
#define TP_MODEL_H

#include "base/base.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct tp_model_spec {
    int E, L, H, HKV, F, V;
    enum cm_type type; /* matrices; norms are F32 */
    uint64_t seed;
} tp_model_spec;

typedef struct tp_tensor_fill {
    int64_t ne0, ne1;
    enum cm_type type;
    float lo, hi;
    uint64_t seed;
} tp_tensor_fill;

static int tp_fill(void *ctx, void *dst, uint64_t nbytes, char *err, size_t errlen) {
    const tp_tensor_fill *t = ctx;
    cm_rng r;
    cm_rng_seed(&r, t->seed);
    float *row = cm_malloc((size_t)t->ne0 * sizeof(float));
    if (!row) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    size_t rs = cm_row_size(t->type, t->ne0);
    for (int64_t i = 0; i < t->ne1; i++) {
        for (int64_t j = 0; j < t->ne0; j++) row[j] = t->lo + (t->hi - t->lo) * cm_rng_uniform(&r);
        if (t->type == CM_TYPE_F32) memcpy((uint8_t *)dst + (size_t)i * rs, row, rs);
        else cm_quantize_rows(t->type, row, (uint8_t *)dst + (size_t)i * rs, 1, t->ne0);
    }
    cm_free(row);
    (void)nbytes;
    return 0;
}

/* Writes the model to path, or (path NULL) appends it to out. */
static int tp_model_write(const tp_model_spec *s, const char *path, cm_buf *out, char *err, size_t errlen) {
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    if (!w) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int D = s->E / s->H, n_t = 3 + 9 * s->L, it = 0;
    tp_tensor_fill *fills = cm_calloc((size_t)n_t, sizeof *fills);
    char(*names)[64] = cm_calloc((size_t)n_t, 64);
    if (!fills || !names) {
        cm_gguf_writer_free(w);
        cm_free(fills);
        cm_free(names);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    cm_gguf_w_str(w, "general.architecture", "llama");
    cm_gguf_w_str(w, "general.name", "tp-synth");
    cm_gguf_w_u32(w, "llama.context_length", 2048);
    cm_gguf_w_u32(w, "llama.embedding_length", (uint32_t)s->E);
    cm_gguf_w_u32(w, "llama.block_count", (uint32_t)s->L);
    cm_gguf_w_u32(w, "llama.feed_forward_length", (uint32_t)s->F);
    cm_gguf_w_u32(w, "llama.attention.head_count", (uint32_t)s->H);
    cm_gguf_w_u32(w, "llama.attention.head_count_kv", (uint32_t)s->HKV);
    cm_gguf_w_u32(w, "llama.rope.dimension_count", (uint32_t)D);
    cm_gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    cm_gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    float aw = 1.7f / sqrtf((float)s->E), ad = 1.7f / sqrtf((float)s->F);
#define ADD(nm, ty, a, b, l, h)                                                                    \
    do {                                                                                           \
        snprintf(names[it], 64, "%s", nm);                                                         \
        fills[it] = (tp_tensor_fill){(a), (b), (ty), (l), (h), s->seed * 1000003u + (uint64_t)it}; \
        int64_t ne[2] = {(a), (b)};                                                                \
        cm_gguf_w_tensor_fill(w, names[it], (ty), (b) > 1 ? 2 : 1, ne, tp_fill, &fills[it]);       \
        it++;                                                                                      \
    } while (0)
    ADD("token_embd.weight", s->type, s->E, s->V, -1.0f, 1.0f);
    ADD("output_norm.weight", CM_TYPE_F32, s->E, 1, 0.8f, 1.2f);
    ADD("output.weight", s->type, s->E, s->V, -3 * aw, 3 * aw);
    for (int l = 0; l < s->L; l++) {
        char n[64];
#define T(x) (snprintf(n, sizeof n, "blk.%d.%s", l, x), n)
        ADD(T("attn_norm.weight"), CM_TYPE_F32, s->E, 1, 0.8f, 1.2f);
        ADD(T("attn_q.weight"), s->type, s->E, s->E, -aw, aw);
        ADD(T("attn_k.weight"), s->type, s->E, s->HKV * D, -aw, aw);
        ADD(T("attn_v.weight"), s->type, s->E, s->HKV * D, -aw, aw);
        ADD(T("attn_output.weight"), s->type, s->E, s->E, -aw, aw);
        ADD(T("ffn_norm.weight"), CM_TYPE_F32, s->E, 1, 0.8f, 1.2f);
        ADD(T("ffn_gate.weight"), s->type, s->E, s->F, -aw, aw);
        ADD(T("ffn_up.weight"), s->type, s->E, s->F, -aw, aw);
        ADD(T("ffn_down.weight"), s->type, s->F, s->E, -ad, ad);
#undef T
    }
#undef ADD
    int rc = path ? cm_gguf_writer_write(w, path, err, errlen) : cm_gguf_writer_write_buf(w, out, err, errlen);
    cm_gguf_writer_free(w);
    cm_free(fills);
    cm_free(names);
    return rc;
}

#endif
