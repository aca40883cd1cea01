/*
 * quants_ref.c: scalar reference (the spec) for every type's dequantizer,
 * activation converter and dot product. Being filled in now.
 */
#include "isa.h"

static void f32_to_float(const void *x, float *y, int64_t n) {
    const float *s = x;
    for (int64_t i = 0; i < n; i++) y[i] = s[i];
}
static void f32_from_float(const float *x, void *y, int64_t n) {
    float *d = y;
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
}
static void f32_vec_dot(int64_t n, float *s, const void *x, const void *y) {
    const float *a = x, *b = y;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(a[i] * b[i]);
    *s = (float)sum;
}

void cm_kernels_fill_ref(cm_kernels *k) {
    memset(k, 0, sizeof *k);
    k->name = "scalar";
    k->to_float[CM_TYPE_F32] = f32_to_float;
    k->from_float[CM_TYPE_F32] = f32_from_float;
    k->vec_dot[CM_TYPE_F32] = f32_vec_dot;
}
