#version 450
// g[i] = silu(g[i]) * u[i] over n elements; -DGELU: gemma3's gelu(g[i]) *
// u[i] as the CPU's (forward.c: llama.cpp's F16 table): x rounded to F16,
// the tanh form in float with its one fused multiply-add, the result
// rounded to F16; x <= -10 gives 0 and x >= 10 gives x. -DOAI: gpt-oss's
// clamped SwiGLU as the CPU's cm_swiglu_oai (alpha 1.702, limit 7).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
#include "common.glsl"
layout(push_constant) uniform P { uint n, g_off, u_off; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) return;
    const float v = A[p.g_off + i];
#ifdef GELU
    const float h = f16r(v);
    const float ge = f16r(0.5 * h * (1.0 + tanh(0.79788456080286535587989211986876 * h * fma(0.044715 * h, h, 1.0))));
    A[p.g_off + i] = (v <= -10.0 ? 0.0 : v >= 10.0 ? v : ge) * A[p.u_off + i];
#elif defined(OAI)
    const float x = min(v, 7.0), y = clamp(A[p.u_off + i], -7.0, 7.0);
    A[p.g_off + i] = (x / (1.0 + exp(1.702 * (-x)))) * (y + 1.0);
#else
    A[p.g_off + i] = (v / (1.0 + exp(-v))) * A[p.u_off + i];
#endif
}
