/*
 * tensor.c: the type table and scalar half/bfloat conversions.
 * Pure functions over values; never touches files or memory it was not given.
 */
#include "tensor.h"

#include <ctype.h>
#include <math.h>

static const cm_type_traits k_traits[CM_TYPE_COUNT] = {
    [CM_TYPE_F32] = {"f32", 1, 4, false, CM_TYPE_F32},
    [CM_TYPE_F16] = {"f16", 1, 2, false, CM_TYPE_F16},
    [CM_TYPE_BF16] = {"bf16", 1, 2, false, CM_TYPE_BF16},
    [CM_TYPE_Q4_0] = {"q4_0", CM_QK4_0, sizeof(cm_block_q4_0), true, CM_TYPE_Q8_0},
    [CM_TYPE_Q4_1] = {"q4_1", CM_QK4_1, sizeof(cm_block_q4_1), true, CM_TYPE_Q8_1},
    [CM_TYPE_Q5_0] = {"q5_0", CM_QK5_0, sizeof(cm_block_q5_0), true, CM_TYPE_Q8_0},
    [CM_TYPE_Q5_1] = {"q5_1", CM_QK5_1, sizeof(cm_block_q5_1), true, CM_TYPE_Q8_1},
    [CM_TYPE_Q8_0] = {"q8_0", CM_QK8_0, sizeof(cm_block_q8_0), true, CM_TYPE_Q8_0},
    [CM_TYPE_Q8_1] = {"q8_1", CM_QK8_1, sizeof(cm_block_q8_1), true, CM_TYPE_Q8_1},
    [CM_TYPE_Q2_K] = {"q2_k", CM_QK_K, sizeof(cm_block_q2_k), true, CM_TYPE_Q8_K},
    [CM_TYPE_Q3_K] = {"q3_k", CM_QK_K, sizeof(cm_block_q3_k), true, CM_TYPE_Q8_K},
    [CM_TYPE_Q4_K] = {"q4_k", CM_QK_K, sizeof(cm_block_q4_k), true, CM_TYPE_Q8_K},
    [CM_TYPE_Q5_K] = {"q5_k", CM_QK_K, sizeof(cm_block_q5_k), true, CM_TYPE_Q8_K},
    [CM_TYPE_Q6_K] = {"q6_k", CM_QK_K, sizeof(cm_block_q6_k), true, CM_TYPE_Q8_K},
    [CM_TYPE_Q8_K] = {"q8_k", CM_QK_K, sizeof(cm_block_q8_k), true, CM_TYPE_Q8_K},
    [CM_TYPE_IQ4_NL] = {"iq4_nl", CM_QK4_NL, sizeof(cm_block_iq4_nl), true, CM_TYPE_Q8_0},
    [CM_TYPE_IQ4_XS] = {"iq4_xs", CM_QK_K, sizeof(cm_block_iq4_xs), true, CM_TYPE_Q8_K},
    [CM_TYPE_MXFP4] = {"mxfp4", CM_QK_MXFP4, sizeof(cm_block_mxfp4), true, CM_TYPE_Q8_0},
    /* Layouts the kernels run but cannot quantize to (dequantizer and dot
     * product only: ggml needs an importance matrix to make them). */
    [CM_TYPE_IQ2_XXS] = {"iq2_xxs", CM_QK_K, sizeof(cm_block_iq2_xxs), true, CM_TYPE_Q8_K},
    /* Known layouts the kernels do not run (yet): named so that a file using
     * them is rejected by name. Sizes are ggml's (ggml-common.h). */
    [CM_TYPE_IQ2_XS] = {"iq2_xs", CM_QK_K, 74, true, CM_TYPE_Q8_K},
    [CM_TYPE_IQ3_XXS] = {"iq3_xxs", CM_QK_K, sizeof(cm_block_iq3_xxs), true, CM_TYPE_Q8_K},
    [CM_TYPE_IQ1_S] = {"iq1_s", CM_QK_K, sizeof(cm_block_iq1_s), true, CM_TYPE_Q8_K},
    [CM_TYPE_IQ3_S] = {"iq3_s", CM_QK_K, 110, true, CM_TYPE_Q8_K},
    [CM_TYPE_IQ2_S] = {"iq2_s", CM_QK_K, 82, true, CM_TYPE_Q8_K},
    [CM_TYPE_IQ1_M] = {"iq1_m", CM_QK_K, 56, true, CM_TYPE_Q8_K},
    [CM_TYPE_TQ1_0] = {"tq1_0", CM_QK_K, 54, true, CM_TYPE_Q8_K},
    [CM_TYPE_TQ2_0] = {"tq2_0", CM_QK_K, 66, true, CM_TYPE_Q8_K},
    [CM_TYPE_NVFP4] = {"nvfp4", 64, 36, true, CM_TYPE_Q8_0},
    [CM_TYPE_I8] = {"i8", 1, 1, false, CM_TYPE_I8},
    [CM_TYPE_I16] = {"i16", 1, 2, false, CM_TYPE_I16},
    [CM_TYPE_I32] = {"i32", 1, 4, false, CM_TYPE_I32},
    [CM_TYPE_I64] = {"i64", 1, 8, false, CM_TYPE_I64},
    [CM_TYPE_F64] = {"f64", 1, 8, false, CM_TYPE_F64},
};

_Static_assert(sizeof(cm_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(cm_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(cm_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(cm_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(cm_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(cm_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(cm_block_q4_k) == 144, "q4_k layout");
_Static_assert(sizeof(cm_block_q5_k) == 176, "q5_k layout");
_Static_assert(sizeof(cm_block_q6_k) == 210, "q6_k layout");
_Static_assert(sizeof(cm_block_q8_k) == 292, "q8_k layout");
_Static_assert(sizeof(cm_block_q2_k) == 84, "q2_k layout");
_Static_assert(sizeof(cm_block_q3_k) == 110, "q3_k layout");
_Static_assert(sizeof(cm_block_iq4_nl) == 18, "iq4_nl layout");
_Static_assert(sizeof(cm_block_iq4_xs) == 136, "iq4_xs layout");
_Static_assert(sizeof(cm_block_mxfp4) == 17, "mxfp4 layout");
_Static_assert(sizeof(cm_block_iq2_xxs) == 66, "iq2_xxs layout");
_Static_assert(sizeof(cm_block_iq3_xxs) == 98, "iq3_xxs layout");
_Static_assert(sizeof(cm_block_iq1_s) == 50, "iq1_s layout");

/* ggml's kvalues_iq4nl and kvalues_mxfp4 (E2M1 values times two). */
const int8_t cm_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t cm_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

const cm_type_traits *cm_type_traits_of(uint32_t type) {
    if (type >= CM_TYPE_COUNT || !k_traits[type].name) return NULL;
    return &k_traits[type];
}

const char *cm_type_name(uint32_t type) {
    const cm_type_traits *t = cm_type_traits_of(type);
    return t ? t->name : "unknown";
}

int cm_type_from_name(const char *name) {
    for (int i = 0; i < CM_TYPE_COUNT; i++) {
        const char *n = k_traits[i].name;
        if (!n) continue;
        size_t j = 0;
        while (n[j] && name[j] && tolower((unsigned char)name[j]) == n[j]) j++;
        if (!n[j] && !name[j]) return i;
    }
    return -1;
}

size_t cm_type_align(enum cm_type t) {
    switch (t) {
    case CM_TYPE_F32:
    case CM_TYPE_I32:
    case CM_TYPE_Q8_K: return 4;
    case CM_TYPE_I64:
    case CM_TYPE_F64: return 8;
    case CM_TYPE_I8:
    case CM_TYPE_MXFP4: return 1;
    default: return 2; /* every other layout starts with or holds a 16-bit field */
    }
}

size_t cm_row_size(enum cm_type t, int64_t n) {
    const cm_type_traits *tr = cm_type_traits_of(t);
    if (!tr || n < 0 || n % tr->block_size) return 0;
    return (size_t)(n / tr->block_size) * tr->type_size;
}

float cm_f16_to_f32(cm_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                mant <<= 1;
                e++;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

cm_f16 cm_f32_to_f16(float f) {
    /* Round to nearest even, the same result as the F16C instruction. */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (cm_f16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (cm_f16)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* subnormal or zero in half */
        float af;
        memcpy(&af, &ax, 4);
        /* scale so that the half subnormal unit (2^-24) becomes 1, round RNE */
        float v = af * 16777216.0f;
        uint32_t m = (uint32_t)lrintf(v);
        return (cm_f16)(sign | m);
    }
    uint32_t mant = ax & 0x7fffff;
    uint32_t exp = (ax >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (cm_f16)(sign | h);
}

cm_bf16 cm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (cm_bf16)((u >> 16) | 64); /* quiet nan */
    return (cm_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

void cm_tensor_init(cm_tensor *t, enum cm_type type, int n_dims, const int64_t *ne, void *data, const char *name) {
    const cm_type_traits *tr = cm_type_traits_of(type);
    t->type = type;
    t->n_dims = n_dims;
    t->data = data;
    t->name = name;
    for (int i = 0; i < CM_MAX_DIMS; i++) t->ne[i] = i < n_dims ? ne[i] : 1;
    t->nb[0] = tr ? tr->type_size : 0;
    t->nb[1] = cm_row_size(type, t->ne[0]);
    for (int i = 2; i < CM_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

int64_t cm_tensor_nelements(const cm_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

size_t cm_tensor_nbytes(const cm_tensor *t) { return t->nb[3] * (size_t)t->ne[3]; }
