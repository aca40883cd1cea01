// The end of mm.comp and mmk.comp: each thread's partial dot products
// (acc[t] for the workgroup's nt tokens) summed over the workgroup's 64
// threads and stored to y[(t0 + t) * ldy + row] (add: added to it).
// -DSUBGROUP (the *_sg pipelines, chosen at run time where the device has
// subgroup arithmetic, vk.c): subgroupAdd within each subgroup, then the
// subgroups' sums in order; else a shared-memory tree. Either is a float
// sum in another order than the CPU's: the same numbers up to rounding.
// (The including shader enables GL_KHR_shader_subgroup_arithmetic.)
shared float red[8 * 64];

void store_rows(const float acc[8], const uint nt, const uint t0, const uint row, const uint tid) {
#ifdef SUBGROUP
    for (uint t = 0; t < 8; t++) {
        const float v = subgroupAdd(acc[t]);
        if (subgroupElect()) red[t * 64 + gl_SubgroupID] = v;
    }
    barrier();
    if (tid < nt) {
        float sum = red[tid * 64];
        for (uint i = 1; i < gl_NumSubgroups; i++) sum += red[tid * 64 + i];
        const uint yi = p.y_off + (t0 + tid) * p.ldy + row;
        A[yi] = (p.add != 0 ? A[yi] : 0.0) + sum;
    }
#else
    for (uint t = 0; t < 8; t++) red[t * 64 + tid] = acc[t];
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
        if (tid < s)
            for (uint t = 0; t < 8; t++) red[t * 64 + tid] += red[t * 64 + tid + s];
        barrier();
    }
    if (tid < nt) {
        const uint yi = p.y_off + (t0 + tid) * p.ldy + row;
        A[yi] = (p.add != 0 ? A[yi] : 0.0) + red[tid * 64];
    }
#endif
}
