#version 450
// Causal attention of one (token j, q head h) per workgroup over the
// token's slot in the cache: scores into A's scratch (sc_off, ctx per
// (token, head)), softmax with the max subtracted, then the weighted sum of
// V. f16: the query and the weights rounded to F16 (the CPU's F16 cache).
// qscale multiplies the query first (gemma3's attn_q_scale, else 1); swa > 0:
// only the last swa positions (sliding-window layers); sink_off != ~0u:
// gpt-oss's per-head sink logit (W[sink_off + h]) joins the max and the sum.
// kt / vt: the slot's K and V types (kvq.glsl; rows of krw / vrw words: a
// float cache's D); a quantized K's query comes rotated and rounded through
// Q8_0 (fwht.comp), its rows dequantized here as the CPU's to_float.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
#include "kvq.glsl"
layout(push_constant) uniform P {
    uint D, nq, rep, nkv, ctx, ldq, q_off, o_off, sc_off, meta_off, B, layer_base, slot_stride, f16, swa;
    float scale, qscale;
    uint sink_off;
    uint kt, vt, krw, vrw;
} p;
shared float red[64];

void main() {
    const uint h = gl_WorkGroupID.x, j = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint pos = AU[p.meta_off + j], slot = AU[p.meta_off + p.B + j], np = pos + 1;
    const uint lo = p.swa != 0 && np > p.swa ? np - p.swa : 0;
    const uint hk = h / p.rep;
    const uint sb0 = slot * p.slot_stride + p.layer_base;
    const uint kb = sb0 + hk * p.ctx * p.krw;
    const uint vb = sb0 + p.nkv * p.ctx * p.krw + hk * p.ctx * p.vrw;
    const uint qb = p.q_off + j * p.ldq + h * p.D, sb = p.sc_off + (j * p.nq + h) * p.ctx;
    float mx = -1.0 / 0.0;
    for (uint t = lo + tid; t < np; t += 64) {
        float s = 0.0;
        for (uint d = 0; d < p.D; d++) {
            const float q = A[qb + d] * p.qscale;
            s += (p.f16 != 0 ? f16r(q) : q) * kv_elem(p.kt, kb + t * p.krw, p.D, d);
        }
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
    const bool sk = p.sink_off != 0xffffffffu;
    const float sink = sk ? uintBitsToFloat(W[p.sink_off + h]) : 0.0;
    if (sk) mx = max(mx, sink);
    barrier();
    float sum = 0.0;
    for (uint t = lo + tid; t < np; t += 64) {
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
    const float inv = 1.0 / (red[0] + (sk ? exp(sink - mx) : 0.0));
    for (uint d = tid; d < p.D; d += 64) {
        float o = 0.0;
        for (uint t = lo; t < np; t++) {
            const float w = A[sb + t] * inv;
            o += (p.f16 != 0 ? f16r(w) : w) * kv_elem(p.vt, vb + t * p.vrw, p.D, d);
        }
        A[p.o_off + j * p.ldq + h * p.D + d] = o;
    }
}
