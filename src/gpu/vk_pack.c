/*
 * vk_pack.c: weight matrices in the layout the matmul shaders read (every
 * read a whole 32-bit word), and which shader and activation format each
 * weight type takes. F32/F16/BF16 keep their rows as in the file. Q8_0/Q4_0
 * keep their block scales apart as F32 (the plain shader, mm.comp); the
 * K-quants (mmk.comp) keep the file's blocks, Q6_K's 210 and Q3_K's 110
 * bytes padded to whole words. Q5_0's 22-byte block is its scale and 5
 * words (qh, then the quants); Q4_1/Q5_1 keep their mins as F32 after all
 * the scales; IQ4_XS and the grid types (IQ2_XXS, IQ3_XXS, IQ1_S) keep their
 * blocks as the K-quants do and go through mmk.comp; a grid type's matrix is
 * preceded by its grid (cm_vk_grid_words). MXFP4 (its E8M0 scale as the
 * CPU's halved float) and IQ4_NL keep Q4_0's layout; the shader maps their
 * nibbles through their tables.
 */
#include "vk_int.h"

#include "../kernels/kernels.h"
#include "../kernels/ref.h"

#include <stdio.h>
#include <string.h>

/* Words of one padded K-quant block; 0 for the other types. */
static uint32_t kblock_words(enum cm_type t) {
    switch (t) {
    case CM_TYPE_Q2_K: return 21;
    case CM_TYPE_Q3_K: return 28;
    case CM_TYPE_Q4_K: return 36;
    case CM_TYPE_Q5_K: return 44;
    case CM_TYPE_Q6_K: return 53;
    case CM_TYPE_IQ4_XS: return 34;
    case CM_TYPE_IQ2_XXS: return 17; /* 66 bytes */
    case CM_TYPE_IQ3_XXS: return 25; /* 98 */
    case CM_TYPE_IQ1_S: return 13;   /* 50 */
    default: return 0;
    }
}

bool cm_vk_type_ok(const cm_tensor *W, char *why, size_t whylen, const char *name) {
    const int64_t K = W->ne[0];
    const enum cm_type t = W->type;
    bool ok = (t == CM_TYPE_F32) || ((t == CM_TYPE_F16 || t == CM_TYPE_BF16) && K % 2 == 0) ||
              ((t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0 || t == CM_TYPE_Q5_0 || t == CM_TYPE_Q4_1 || t == CM_TYPE_Q5_1 ||
                t == CM_TYPE_MXFP4 || t == CM_TYPE_IQ4_NL) &&
               K % 32 == 0) ||
              (kblock_words(t) && K % CM_QK_K == 0);
    if (!ok)
        snprintf(
            why, whylen,
            "%s is %s (the GPU has f32, f16, bf16, q8_0, q4_0, q5_0, q4_1, q5_1, mxfp4, iq4_nl, q2_k..q6_k, iq4_xs, iq2_xxs, iq3_xxs, iq1_s)",
            name, cm_type_name(t));
    else if (W->ne[1] > 65535) {
        snprintf(why, whylen, "%s has %lld rows (at most 65535)", name, (long long)W->ne[1]);
        ok = false;
    }
    return ok;
}

enum cm_vk_pipe cm_vk_mm_pipe(enum cm_type t) {
    switch (t) {
    case CM_TYPE_F32: return VKP_MM_F32;
    case CM_TYPE_F16: return VKP_MM_F16;
    case CM_TYPE_BF16: return VKP_MM_BF16;
    case CM_TYPE_Q8_0: return VKP_MM_Q8_0;
    case CM_TYPE_Q4_0: return VKP_MM_Q4_0;
    case CM_TYPE_Q5_0: return VKP_MM_Q5_0;
    case CM_TYPE_Q4_1: return VKP_MM_Q4_1;
    case CM_TYPE_Q5_1: return VKP_MM_Q5_1;
    case CM_TYPE_MXFP4: return VKP_MM_MXFP4;
    case CM_TYPE_IQ4_NL: return VKP_MM_IQ4_NL;
    case CM_TYPE_Q2_K: return VKP_MM_Q2_K;
    case CM_TYPE_Q3_K: return VKP_MM_Q3_K;
    case CM_TYPE_Q4_K: return VKP_MM_Q4_K;
    case CM_TYPE_Q5_K: return VKP_MM_Q5_K;
    case CM_TYPE_IQ4_XS: return VKP_MM_IQ4_XS;
    case CM_TYPE_IQ2_XXS: return VKP_MM_IQ2_XXS;
    case CM_TYPE_IQ3_XXS: return VKP_MM_IQ3_XXS;
    case CM_TYPE_IQ1_S: return VKP_MM_IQ1_S;
    default: return VKP_MM_Q6_K;
    }
}

enum cm_type cm_vk_act_type(enum cm_type t) {
    return kblock_words(t) ? CM_TYPE_Q8_K
           : t == CM_TYPE_Q8_0 || t == CM_TYPE_Q4_0 || t == CM_TYPE_Q5_0 || t == CM_TYPE_MXFP4 || t == CM_TYPE_IQ4_NL
               ? CM_TYPE_Q8_0
           : t == CM_TYPE_Q4_1 || t == CM_TYPE_Q5_1 ? CM_TYPE_Q8_1
                                                    : CM_TYPE_F32;
}

uint32_t cm_vk_act_words(enum cm_type act, uint32_t K) {
    return act == CM_TYPE_Q8_K   ? K / 256 * 81
           : act == CM_TYPE_Q8_0 ? K / 32 * 9
           : act == CM_TYPE_Q8_1 ? K / 32 * 10
                                 : K;
}

enum cm_vk_pipe cm_vk_act_pipe(enum cm_type act) {
    return act == CM_TYPE_Q8_K ? VKP_Q8KACT : act == CM_TYPE_Q8_1 ? VKP_Q81ACT : VKP_Q8ACT;
}

uint32_t cm_vk_grid_words(enum cm_type t) {
    return t == CM_TYPE_IQ2_XXS ? 512 : t == CM_TYPE_IQ3_XXS ? 256 : t == CM_TYPE_IQ1_S ? 4096 : 0;
}

void cm_vk_pack_grid(enum cm_type t, uint32_t *dst) {
    if (t == CM_TYPE_IQ3_XXS) memcpy(dst, cm_iq3xxs_grid, sizeof cm_iq3xxs_grid);
    const uint64_t *g = t == CM_TYPE_IQ2_XXS ? cm_iq2xxs_grid : t == CM_TYPE_IQ1_S ? cm_iq1s_grid : NULL;
    for (uint32_t i = 0; g && i < cm_vk_grid_words(t) / 2; i++) {
        dst[2 * i] = (uint32_t)g[i]; /* elements 0-3, then 4-7: the shader's word order on any host */
        dst[2 * i + 1] = (uint32_t)(g[i] >> 32);
    }
}

uint64_t cm_vk_packed_words(const cm_tensor *W) {
    const uint64_t K = (uint64_t)W->ne[0], R = (uint64_t)W->ne[1];
    switch (W->type) {
    case CM_TYPE_F32: return R * K;
    case CM_TYPE_F16:
    case CM_TYPE_BF16: return R * K / 2;
    case CM_TYPE_Q8_0: return R * (K / 32) * 9;
    case CM_TYPE_Q4_0:
    case CM_TYPE_MXFP4:
    case CM_TYPE_IQ4_NL: return R * (K / 32) * 5;
    case CM_TYPE_Q5_0: return R * (K / 32) * 6;
    case CM_TYPE_Q4_1: return R * (K / 32) * 6;
    case CM_TYPE_Q5_1: return R * (K / 32) * 7;
    default: return R * (K / CM_QK_K) * kblock_words(W->type);
    }
}

void cm_vk_pack(const cm_tensor *W, uint32_t *dst) {
    const int64_t K = W->ne[0], R = W->ne[1];
    if (W->type == CM_TYPE_F32 || W->type == CM_TYPE_F16 || W->type == CM_TYPE_BF16) {
        const size_t rs = cm_row_size(W->type, K);
        for (int64_t r = 0; r < R; r++) memcpy((char *)dst + r * rs, (const char *)W->data + r * W->nb[1], rs);
        return;
    }
    const uint32_t kw = kblock_words(W->type);
    if (kw) {
        const int64_t nb = K / CM_QK_K;
        const size_t bsz = cm_type_traits_of(W->type)->type_size;
        for (int64_t r = 0; r < R; r++)
            for (int64_t b = 0; b < nb; b++)
                memcpy(dst + (r * nb + b) * kw, (const char *)W->data + r * W->nb[1] + b * bsz, bsz);
        return;
    }
    const int64_t nb = K / 32;
    /* the quant words after the F16 scale (and Q4_1/Q5_1's F16 min): Q8_0 8, Q4_0/Q4_1 4, Q5_0/Q5_1 5 (qh, then qs) */
    const bool m1 = W->type == CM_TYPE_Q4_1 || W->type == CM_TYPE_Q5_1;
    const int qw = W->type == CM_TYPE_Q8_0 ? 8 : W->type == CM_TYPE_Q5_0 || W->type == CM_TYPE_Q5_1 ? 5 : 4;
    const bool mx = W->type == CM_TYPE_MXFP4; /* a one-byte E8M0 scale */
    const int bsz = (int)cm_type_traits_of(W->type)->type_size, hdr = m1 ? 4 : mx ? 1 : 2;
    float *sc = (float *)dst, *mn = sc + R * nb;
    uint32_t *qs = dst + (m1 ? 2 : 1) * R * nb;
    for (int64_t r = 0; r < R; r++) {
        const uint8_t *row = (const uint8_t *)W->data + r * W->nb[1];
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * bsz;
            uint16_t d;
            memcpy(&d, blk, 2);
            sc[r * nb + b] = mx ? cm_e8m0_to_f32_half(blk[0]) : cm_f16_to_f32(d);
            if (m1) {
                memcpy(&d, blk + 2, 2);
                mn[r * nb + b] = cm_f16_to_f32(d);
            }
            memcpy(qs + (r * nb + b) * qw, blk + hdr, (size_t)qw * 4);
        }
    }
}
