#version 450
// deepseek2's latent attention (src/model/mla.c, attend) of one (token j,
// query head h) per workgroup over the token's slot of the latent cache:
// rows of R = C + nr floats [kv_cmpr | k_pe] (the slot's rows of this
// layer, position t at slot * slot_stride + t * R). The absorbed query is
// [qa (C floats at qa_off + (j * H + h) * C, wk_b . q_nope) | the roped
// q_pe (nr floats at qpe_off + (j * H + h) * ldqpe)]; scores times scale
// (kq_scale) into A's scratch (sc_off, ctx per (token, head)), softmax with
// the max subtracted, then o = sum_t w_t kv_cmpr[t] (C floats at o_off +
// (j * H + h) * C). f16: the query and the weights rounded to F16 as the
// CPU's F16 cache path rounds them.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P {
    uint C, nr, H, ctx, qa_off, qpe_off, ldqpe, o_off, sc_off, meta_off, B, slot_stride, f16;
    float scale;
} p;
shared float red[64];

float q16(float x) { return p.f16 != 0 ? f16r(x) : x; }

void main() {
    const uint h = gl_WorkGroupID.x, j = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint pos = AU[p.meta_off + j], slot = AU[p.meta_off + p.B + j], np = pos + 1, R = p.C + p.nr;
    const uint kb = slot * p.slot_stride, jh = j * p.H + h;
    const uint qa = p.qa_off + jh * p.C, qp = p.qpe_off + jh * p.ldqpe, sb = p.sc_off + jh * p.ctx;
    float mx = -1.0 / 0.0;
    for (uint t = tid; t < np; t += 64) {
        const uint kr = kb + t * R;
        float s = 0.0;
        for (uint d = 0; d < p.C; d++) s += q16(A[qa + d]) * KV[kr + d];
        for (uint d = 0; d < p.nr; d++) s += q16(A[qp + d]) * KV[kr + p.C + d];
        s *= p.scale;
        A[sb + t] = s;
        mx = max(mx, s);
    }
    red[tid] = mx;
    barrier();
    for (uint w = 32; w > 0; w >>= 1) {
        if (tid < w) red[tid] = max(red[tid], red[tid + w]);
        barrier();
    }
    mx = red[0];
    barrier();
    float sum = 0.0;
    for (uint t = tid; t < np; t += 64) {
        const float e = exp(A[sb + t] - mx);
        A[sb + t] = e;
        sum += e;
    }
    red[tid] = sum;
    memoryBarrierBuffer();
    barrier();
    for (uint w = 32; w > 0; w >>= 1) {
        if (tid < w) red[tid] += red[tid + w];
        barrier();
    }
    const float inv = 1.0 / red[0];
    for (uint d = tid; d < p.C; d += 64) {
        float o = 0.0;
        for (uint t = 0; t < np; t++) o += q16(A[sb + t] * inv) * KV[kb + t * R + d];
        A[p.o_off + jh * p.C + d] = o;
    }
}
