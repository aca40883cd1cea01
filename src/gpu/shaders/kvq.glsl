// A quantized KV cache's rows on the device (kvq.comp writes them, attn.comp
// reads them): a row of D elements (D a multiple of 32, nb = D / 32 blocks)
// is nb words of block scales (F32 holding the F16 value the CPU's block
// has), then the quants: Q8_0 8 words a block (element i of the block in
// byte i % 4 of word i / 4), Q4_0 4 words (element i in nibble i % 8 of
// word i / 8, as q + 8). Types: KVT_F32 0, KVT_F16 1 (floats, the F16 values
// as floats), KVT_Q8_0 2, KVT_Q4_0 3. rw: words of a row.
const uint KVT_F32 = 0u, KVT_F16 = 1u, KVT_Q8_0 = 2u, KVT_Q4_0 = 3u;

// Element d of the row at word r of type t (D elements).
float kv_elem(uint t, uint r, uint D, uint d) {
    if (t < KVT_Q8_0) return KV[r + d];
    const uint nb = D / 32u, b = d / 32u, i = d % 32u;
    const float s = uintBitsToFloat(KVU[r + b]);
    if (t == KVT_Q8_0) {
        const uint w = KVU[r + nb + b * 8u + i / 4u];
        return float(int(w << (24u - 8u * (i % 4u))) >> 24) * s;
    }
    const uint w = KVU[r + nb + b * 4u + i / 8u];
    return float(int((w >> (4u * (i % 8u))) & 15u) - 8) * s;
}
