/*
 * avx512_repack.h: the AVX-512 decode gemvs over weights repacked at load
 * (repack.c describes the layouts). Not a header in the usual sense:
 * kernels_avx512.c includes it once, after its tiles, under its own ISA
 * flags. Nothing else may include it.
 *
 * Each row's result is, bit for bit, that table's vec_dot of the file's row
 * (the lane order of ztile_q4_0 / ztile_q8_0: block b's exact integer sum
 * times dx_b * dy_b, FMAed into chain b mod 8, the same tail, the same
 * reduction), so a repacked tensor changes speed and nothing else
 * (tests/unit/test_kernels_repack.c). The token is packed once per call into
 * the lanes layout (int32 lane j = block j of a 16-block group), so each row
 * costs aligned loads, vpdpbusd and two FMAs per 16 blocks. One row per pass:
 * a single sequential stream, which the hardware prefetcher follows best.
 * Never allocates (the packed token is on the stack, under 48 KiB).
 */

/* ---- q4_0 decode gemv over the "q4_0 lanes" repacked rows (repack.c) ----
 * A group of 16 blocks is 4 aligned-free 64-byte loads whose int32 lane j is
 * block j's: low nibbles dotted with the token's y[4q..4q+3] of block j, high
 * nibbles with y[16+4q..], both through vpdpbusd into lanes that start at
 * -8 * sum(y_j) (the token is packed that way once per call: 8 vectors, the
 * offsets, the 16 dy as f32; 640 bytes per group). Lane j then holds block
 * j's exact s_j, and the rest is ztile_q4_0's arithmetic (dx_j * dy_j, the
 * same two FMAs into chains j mod 8, the same remainder and hsum8), so each
 * row equals vec_dot on the file's bytes bit for bit. One row per pass: a
 * single sequential stream, which the hardware prefetcher follows best. */
enum { RQ_GROUP = 640, RQ_MAXG = CM_REPACK_MAX_K / 512 };

AI void rq4_pack(int64_t ng, const cm_block_q8_0 *y, uint8_t *d) {
    const __m512i k8 = _mm512_set1_epi8(8), z = _mm512_setzero_si512();
    /* lane j: the offset of block j's qs in the token */
    const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                            _mm512_set1_epi32((int)sizeof(cm_block_q8_0))),
                                         _mm512_set1_epi32((int)offsetof(cm_block_q8_0, qs)));
    for (int64_t g = 0; g < ng; g++, y += 16, d += RQ_GROUP) {
        __m512i b = z;
        for (int q = 0; q < 8; q++) { /* vector q: y[4q..4q+3] of each block (q >= 4: the high half) */
            const __m512i v = _mm512_i32gather_epi32(idx, (const void *)((const uint8_t *)y + 4 * q), 1);
            _mm512_store_si512((void *)(d + 64 * q), v);
            b = _mm512_dpbusd_epi32(b, k8, v);
        }
        _mm512_store_si512((void *)(d + 512), _mm512_sub_epi32(z, b));
        _mm512_store_ps((void *)(d + 576), d16(d8_q8_0(y), d8_q8_0(y + 8)));
    }
}

AI float rq4_row(int64_t nb, const uint8_t *x, const uint8_t *pk, const cm_block_q8_0 *y) {
    const int64_t ng = nb / 16;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 c = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++, x += 16 * sizeof(cm_block_q4_0), pk += RQ_GROUP) {
        __m512i a = _mm512_load_si512((const void *)(pk + 512)), b = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_loadu_si512(x + 32 + 64 * q);
            a = _mm512_dpbusd_epi32(a, _mm512_and_si512(v, m4), _mm512_load_si512((const void *)(pk + 64 * q)));
            b = _mm512_dpbusd_epi32(b, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                    _mm512_load_si512((const void *)(pk + 256 + 64 * q)));
        }
        const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
        const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)x)),
                                       _mm512_load_ps((const void *)(pk + 576)));
        c = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), c);
        c = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), c);
    }
    const cm_block_q4_0 *xt = (const cm_block_q4_0 *)(const void *)x;
    for (int64_t b = 16 * ng; b < nb; b++, xt++) {
        const __m256i qx = _mm256_sub_epi8(nibbles32(xt->qs), _mm256_set1_epi8(8));
        c = fma_lane(c, (int)(b & 7), hsum_i32(dot_s8s8(qx, ld256(y[b].qs))), f16f(xt->d) * f16f(y[b].d));
    }
    return hsum8(c);
}

static void gemv_rq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK4_0, ng = nb / 16;
    CM_ASSERT(ng <= RQ_MAXG);
    _Alignas(64) uint8_t pk[RQ_MAXG * RQ_GROUP];
    rq4_pack(ng, x, pk);
    for (int64_t i = r0; i < r1; i++) y[i] = rq4_row(nb, (const uint8_t *)w + (size_t)i * w_stride, pk, x);
}

/* ---- q8_0 over the "q8_0 lanes" rows: [16 fp16 d][8 x 64 bytes: vector q,
 * lane j = x_j[4q..4q+3] + 128 (unsigned)] per 16 blocks. The token is packed
 * as vector q lane j = y_j[4q..4q+3] (signed), then -128 * sum(y_j) per lane
 * (the accumulator's start, which removes the +128) and the 16 dy as f32
 * (640 bytes per group): sum((x + 128) * y) - 128 * sum(y) = sum(x * y),
 * exact in int32. */
AI void rq8_pack(int64_t ng, const cm_block_q8_0 *y, uint8_t *d) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                            _mm512_set1_epi32((int)sizeof(cm_block_q8_0))),
                                         _mm512_set1_epi32((int)offsetof(cm_block_q8_0, qs)));
    for (int64_t g = 0; g < ng; g++, y += 16, d += RQ_GROUP) {
        __m512i b = z;
        for (int q = 0; q < 8; q++) {
            const __m512i v = _mm512_i32gather_epi32(idx, (const void *)((const uint8_t *)y + 4 * q), 1);
            _mm512_store_si512((void *)(d + 64 * q), v);
            b = _mm512_dpbusd_epi32(b, k128, v);
        }
        _mm512_store_si512((void *)(d + 512), _mm512_sub_epi32(z, b));
        _mm512_store_ps((void *)(d + 576), d16(d8_q8_0(y), d8_q8_0(y + 8)));
    }
}

AI float rq8_row(int64_t nb, const uint8_t *x, const uint8_t *pk, const cm_block_q8_0 *y) {
    const int64_t ng = nb / 16;
    __m256 c = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++, x += 16 * sizeof(cm_block_q8_0), pk += RQ_GROUP) {
        __m512i a = _mm512_load_si512((const void *)(pk + 512)), b = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(x + 32 + 128 * q), _mm512_load_si512((const void *)(pk + 128 * q)));
            b = _mm512_dpbusd_epi32(b, _mm512_loadu_si512(x + 96 + 128 * q),
                                    _mm512_load_si512((const void *)(pk + 64 + 128 * q)));
        }
        const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
        const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)x)),
                                       _mm512_load_ps((const void *)(pk + 576)));
        c = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(d), c);
        c = _mm256_fmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm512_extractf32x8_ps(d, 1), c);
    }
    const cm_block_q8_0 *xt = (const cm_block_q8_0 *)(const void *)x;
    for (int64_t b = 16 * ng; b < nb; b++, xt++)
        c = fma_lane(c, (int)(b & 7), hsum_i32(dot_s8s8(ld256(xt->qs), ld256(y[b].qs))), f16f(xt->d) * f16f(y[b].d));
    return hsum8(c);
}

static void gemv_rq8_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    (void)x_stride, (void)ldy, (void)n_tok;
    const int64_t nb = k / CM_QK8_0, ng = nb / 16;
    CM_ASSERT(ng <= RQ_MAXG);
    _Alignas(64) uint8_t pk[RQ_MAXG * RQ_GROUP];
    rq8_pack(ng, x, pk);
    for (int64_t i = r0; i < r1; i++) y[i] = rq8_row(nb, (const uint8_t *)w + (size_t)i * w_stride, pk, x);
}
