// Shared by every cumulo compute shader: the three storage buffers of the
// one descriptor set layout (vk.c). W: a layer's weights (repacked, words);
// A: activations and per-token metadata (floats, or uints through AU);
// KV: the key/value cache of every sequence slot (floats; a quantized
// cache's rows as words through KVU: kvq.glsl).
layout(std430, binding = 0) readonly buffer Wb { uint W[]; };
layout(std430, binding = 1) buffer Ab { float A[]; };
layout(std430, binding = 1) buffer AUb { uint AU[]; };
layout(std430, binding = 2) buffer KVb { float KV[]; };
layout(std430, binding = 2) buffer KVUb { uint KVU[]; };

// x rounded to F16 (to nearest, ties to even, as the CPU's cm_f32_to_f16)
// and back, in integer steps: packHalf2x16's rounding is the driver's
// choice. Finite inputs only (activations, scales).
float f16r(float x) {
    const uint u = floatBitsToUint(x), sign = u & 0x80000000u;
    uint a = u & 0x7fffffffu;
    if (a < 0x38800000u) { /* an F16 subnormal: multiples of 2^-24 */
        return uintBitsToFloat(sign | floatBitsToUint(roundEven(uintBitsToFloat(a) * 16777216.0) / 16777216.0));
    }
    a = (a + 0x0fffu + ((a >> 13) & 1u)) & 0xffffe000u;
    return uintBitsToFloat(sign | a);
}
