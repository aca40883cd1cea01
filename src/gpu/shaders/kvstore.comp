#version 450
// K and V rows of ntok tokens (nkv heads of D, row stride nkv * D) into the
// cache: slot and position per token from the metadata (AU[meta_off + j]:
// position, AU[meta_off + B + j]: slot). Cache layout per slot and layer:
// [K|V][head][ctx][D]. f16: round to F16 as the CPU's F16 cache does.
// v_off == ~0u: K only (deepseek2's latent rows: [ctx][D] per slot and layer).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint D, nkv, ntok, ctx, k_off, v_off, meta_off, B, layer_base, slot_stride, f16; } p;

void main() {
    const uint id = gl_GlobalInvocationID.x, KS = p.nkv * p.D;
    if (id >= p.ntok * KS) return;
    const uint j = id / KS, hd = id % KS, hk = hd / p.D, d = hd % p.D;
    const uint pos = AU[p.meta_off + j], slot = AU[p.meta_off + p.B + j];
    const uint kb = slot * p.slot_stride + p.layer_base + hk * p.ctx * p.D + pos * p.D + d;
    const uint vb = kb + p.nkv * p.ctx * p.D;
    const float k = A[p.k_off + id], v = p.v_off != 0xffffffffu ? A[p.v_off + id] : 0.0;
    KV[kb] = p.f16 != 0 ? f16r(k) : k;
    if (p.v_off != 0xffffffffu) KV[vb] = p.f16 != 0 ? f16r(v) : v;
}
