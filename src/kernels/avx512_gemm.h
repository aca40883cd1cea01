/*
 * avx512_gemm.h: the AVX-512 prefill gemms over packed activations. Not a
 * header in the usual sense: kernels_avx512.c includes it once, after its
 * tiles, under its own ISA flags. Nothing else may include it.
 *
 * Batch invariance (kernels.h) without giving up speed: each gemm here does,
 * for every (row, token), exactly the arithmetic of that type's one-token
 * tile (ztile_* in kernels_avx512.c, which vec_dot runs): the same int32
 * lanes, the same float products of scales, the same FMAs into the same
 * accumulators in the same block order, the same final reduction. What it
 * changes is only where the operands come from. Before the rows are walked,
 * the activations of up to ZPACK bytes' worth of tokens are rewritten once
 * into the layout the tile consumes (q4_0: the 4x128-bit interleave, the
 * offset correction -8*sum(y) as the initial vpdpbusd accumulator and the
 * block scales as f32; q8_0: block pairs, -128*sum(y), scales spread over the
 * lanes; q4_k: contiguous 64-byte y vectors and the bsums pairs; f16:
 * converted to f32), so the inner loop is aligned loads,
 * vpdpbusd/FMA and almost no shuffles, and each unpacked weight vector serves
 * several tokens (and each packed activation vector several rows) from
 * registers. Integer identities used (all exact in int32):
 *   q4_0: sum(q * y) - 8 * sum(y) = sum((q - 8) * y), q the unsigned nibble;
 *   q8_0: sum((x + 128) * y) - 128 * sum(y) = sum(x * y) = sum(|x| * sign(x) y).
 * tests/unit/test_kernels_invariant.c checks every (row, token) bit for bit.
 *
 * The packed buffer lives on the stack (ZPACK bytes): the gemm needs a thread
 * stack of a few hundred KiB, which every thread cumulo starts has (the
 * default 8 MiB). Rows too long for even two tokens fall back to the tiles.
 * Never allocates.
 */

enum {
    ZT = 8,              /* most tokens per register tile */
    ZR = 2,              /* most weight rows per register tile */
    ZRB = 16,            /* weight rows per cache block (stay in L2 across token tiles) */
    ZPF = 4,             /* prefetch the weight row this many rows ahead (as cm_matmul_rows) */
    ZPACK = 160 * 1024,  /* bytes of packed activations per pass */
};

/* The driver: pack as many tokens as fit, then for each ZRB-row block run
 * every TT-token tile over it, RR rows at a time. ROW(k, rows, pk, tb, yv, R,
 * T, out) computes out[r][t] for R rows and T tokens (constants after the
 * switch, so the compiler keeps the R x T accumulators in registers). */
#define ZGEMM(NAME, XB, YB, RR, TT, TOKBYTES, PACK, ROW, FALLBACK)                                 \
    static void gemm_p##NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, \
                             float *y, int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {       \
        const size_t tb = (TOKBYTES);                                                              \
        if (tb == 0 || tb * 2 > ZPACK) {                                                           \
            FALLBACK(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);                          \
            return;                                                                                \
        }                                                                                          \
        _Alignas(64) uint8_t pk[ZPACK];                                                            \
        const int64_t cap = (int64_t)(ZPACK / tb);                                                 \
        for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {                                              \
            const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;                                \
            for (int64_t t = 0; t < nt; t++)                                                       \
                PACK(k, (const YB *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride), pk + (size_t)t * tb); \
            for (int64_t i0 = r0; i0 < r1; i0 += ZRB) {                                            \
                const int64_t i1 = r1 - i0 < ZRB ? r1 : i0 + ZRB;                                  \
                for (int64_t jj = 0; jj < nt; jj += TT) {                                          \
                    const int T = nt - jj < TT ? (int)(nt - jj) : TT;                              \
                    const uint8_t *p = pk + (size_t)jj * tb;                                       \
                    const YB *yv[ZT];                                                              \
                    for (int t = 0; t < T; t++)                                                    \
                        yv[t] = (const YB *)(const void *)((const char *)x + (size_t)(j0 + jj + t) * x_stride); \
                    for (int64_t i = i0; i < i1; i += RR) {                                        \
                        const int R = i1 - i < RR ? (int)(i1 - i) : RR;                            \
                        const XB *wr[ZR];                                                          \
                        for (int r = 0; r < R; r++)                                                \
                            wr[r] = (const XB *)(const void *)((const char *)w + (size_t)(i + r) * w_stride); \
                        if (jj == 0) /* first pass over these rows: they come from DRAM */         \
                            for (int64_t ip = i + ZPF; ip < i + ZPF + R && ip < r1; ip++)          \
                                for (size_t o = 0; o < w_stride; o += 64)                          \
                                    __builtin_prefetch((const char *)w + (size_t)ip * w_stride + o, 0, 0); \
                        float out[ZR][ZT];                                                         \
                        if (R == RR) {                                                             \
                            switch (T) {                                                           \
                            case 8: ROW(k, wr, p, tb, yv, RR, 8 <= TT ? 8 : 1, out); break;        \
                            case 7: ROW(k, wr, p, tb, yv, RR, 7 <= TT ? 7 : 1, out); break;        \
                            case 6: ROW(k, wr, p, tb, yv, RR, 6 <= TT ? 6 : 1, out); break;        \
                            case 5: ROW(k, wr, p, tb, yv, RR, 5 <= TT ? 5 : 1, out); break;        \
                            case 4: ROW(k, wr, p, tb, yv, RR, 4 <= TT ? 4 : 1, out); break;        \
                            case 3: ROW(k, wr, p, tb, yv, RR, 3 <= TT ? 3 : 1, out); break;        \
                            case 2: ROW(k, wr, p, tb, yv, RR, 2 <= TT ? 2 : 1, out); break;        \
                            default: ROW(k, wr, p, tb, yv, RR, 1, out); break;                     \
                            }                                                                      \
                        } else {                                                                   \
                            for (int r = 0; r < R; r++) switch (T) {                                                           \
                                case 8: ROW(k, wr + r, p, tb, yv, 1, 8 <= TT ? 8 : 1, out + r); break;\
                                case 7: ROW(k, wr + r, p, tb, yv, 1, 7 <= TT ? 7 : 1, out + r); break;\
                                case 6: ROW(k, wr + r, p, tb, yv, 1, 6 <= TT ? 6 : 1, out + r); break;\
                                case 5: ROW(k, wr + r, p, tb, yv, 1, 5 <= TT ? 5 : 1, out + r); break;\
                                case 4: ROW(k, wr + r, p, tb, yv, 1, 4 <= TT ? 4 : 1, out + r); break;\
                                case 3: ROW(k, wr + r, p, tb, yv, 1, 3 <= TT ? 3 : 1, out + r); break;\
                                case 2: ROW(k, wr + r, p, tb, yv, 1, 2 <= TT ? 2 : 1, out + r); break;\
                                default: ROW(k, wr + r, p, tb, yv, 1, 1, out + r); break;          \
                                }                                                                  \
                        }                                                                          \
                        for (int r = 0; r < R; r++)                                                \
                            for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i + r] = out[r][t]; \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

/* ---- q4_0: per 8-block group, 448 bytes per token: for each half h (blocks
 * 4h..4h+3) [y low halves 4x16][y high halves 4x16][-8 * sum(y) lanes], then
 * the 8 blocks' dy as f32 and 32 bytes of padding ---- */
enum { PQ4_HALF = 192, PQ4_GROUP = 448 }; /* two halves, then the 8 dy (32 bytes) and 32 of padding */

AI void pack_q4_0(int64_t k, const cm_block_q8_0 *y, uint8_t *d) {
    const int64_t ng = k / CM_QK8_0 / 8;
    const __m512i k8 = _mm512_set1_epi8(8), z = _mm512_setzero_si512();
    for (int64_t g = 0; g < ng; g++, y += 8) {
        for (int h = 0; h < 2; h++, d += PQ4_HALF) {
            const cm_block_q8_0 *yb = y + 4 * h;
            const __m512i lo = ld4x128(yb[0].qs, yb[1].qs, yb[2].qs, yb[3].qs);
            const __m512i hi = ld4x128(yb[0].qs + 16, yb[1].qs + 16, yb[2].qs + 16, yb[3].qs + 16);
            const __m512i sy = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, k8, lo), k8, hi);
            _mm512_store_si512((void *)d, lo);
            _mm512_store_si512((void *)(d + 64), hi);
            _mm512_store_si512((void *)(d + 128), _mm512_sub_epi32(z, sy));
        }
        _mm256_store_ps((void *)d, d8_q8_0(y));
        _mm256_store_ps((void *)(d + 32), _mm256_setzero_ps()); /* padding: keeps groups 64-byte aligned */
        d += PQ4_GROUP - 2 * PQ4_HALF;
    }
}

#define PQ4_HALF_ROW(H, ACC)                                                                       \
    do {                                                                                           \
        __m512i lo[ZR], hi[ZR];                                                                    \
        for (int r = 0; r < R; r++) {                                                              \
            const cm_block_q4_0 *xb = x[r] + 8 * g + 4 * (H);                                      \
            const __m512i q = ld4x128(xb[0].qs, xb[1].qs, xb[2].qs, xb[3].qs);                     \
            lo[r] = _mm512_and_si512(q, m4);                                                       \
            hi[r] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);                                 \
        }                                                                                          \
        const __m512i pidx = _mm512_add_epi32(qidx, _mm512_set1_epi32(4 * (H)));                   \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                      \
            const uint8_t *py = pk + (size_t)t * tb + (size_t)g * PQ4_GROUP + (H) * PQ4_HALF;       \
            const __m512i ylo = _mm512_load_si512((const void *)py), yhi = _mm512_load_si512((const void *)(py + 64)); \
            const __m512i ini = _mm512_load_si512((const void *)(py + 128));                       \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                  \
                const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ini, lo[r], ylo), hi[r], yhi); \
                ACC[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pidx, sc[r][t]), ACC[r][t]); \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* The rows' results for T tokens: out[r][t]. */
AI void prow_q4_0(int64_t k, const cm_block_q4_0 *const *x, const uint8_t *pk, size_t tb,
                  const cm_block_q8_0 *const *yv, int R, int T, float (*out)[ZT]) {
    const int64_t nb = k / CM_QK4_0, ng = nb / 8;
    __m512 acc0[ZR][ZT], acc1[ZR][ZT];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc0[r][t] = acc1[r][t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i qidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int64_t g = 0; g < ng; g++) {
        __m512 sc[ZR][ZT]; /* dx * dy of the group's 8 blocks (low 256 bits), as the tile computes it */
        for (int r = 0; r < R; r++) {
            const __m256 dx = d8_q4_0(x[r] + 8 * g);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
                sc[r][t] = _mm512_castps256_ps512(_mm256_mul_ps(
                    dx, _mm256_load_ps((const void *)(pk + (size_t)t * tb + (size_t)g * PQ4_GROUP + 2 * PQ4_HALF))));
        }
        PQ4_HALF_ROW(0, acc0);
        PQ4_HALF_ROW(1, acc1);
    }
    for (int r = 0; r < R; r++) {
        float tail[ZT] = {0};
        if (8 * ng < nb) {
            const cm_block_q8_0 *yt[ZT];
            for (int t = 0; t < T; t++) yt[t] = yv[t] + 8 * ng;
            for (int t0 = 0; t0 < T; t0 += TMAX) /* the tile holds at most TMAX tokens */
                tile_q4_0(nb - 8 * ng, x[r] + 8 * ng, yt + t0, T - t0 < TMAX ? T - t0 : TMAX, tail + t0);
        }
        for (int t = 0; t < T; t++) out[r][t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r][t], acc1[r][t])) + tail[t];
    }
}
ZGEMM(q4_0, cm_block_q4_0, cm_block_q8_0, 1, 8, (size_t)(k / CM_QK4_0 / 8) * PQ4_GROUP, pack_q4_0, prow_q4_0,
      gemm_zq4_0)

/* ---- q8_0: per 8-block group and pair p, 192 bytes per token:
 * [y of blocks 2p, 2p+1][-128 * sum(y) lanes][dy per lane] ---- */
enum { PQ8_PAIR = 192, PQ8_GROUP = 768 };

AI __m512i pair_idx(int p) { return _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1); }

AI void pack_q8_0(int64_t k, const cm_block_q8_0 *y, uint8_t *d) {
    const int64_t ng = k / CM_QK8_0 / 8;
    const __m512i k128 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    for (int64_t g = 0; g < ng; g++, y += 8) {
        const __m512 dy = _mm512_castps256_ps512(d8_q8_0(y));
        for (int p = 0; p < 4; p++, d += PQ8_PAIR) {
            const __m512i qy = ld2x256(y[2 * p].qs, y[2 * p + 1].qs);
            _mm512_store_si512((void *)d, qy);
            _mm512_store_si512((void *)(d + 64), _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, k128, qy)));
            _mm512_store_ps((void *)(d + 128), _mm512_permutexvar_ps(pair_idx(p), dy));
        }
    }
}

AI void prow_q8_0(int64_t k, const cm_block_q8_0 *const *x, const uint8_t *pk, size_t tb,
                  const cm_block_q8_0 *const *yv, int R, int T, float (*out)[ZT]) {
    const int64_t nb = k / CM_QK8_0, ng = nb / 8;
    __m512 acc[2][ZR][ZT];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[0][r][t] = acc[1][r][t] = _mm512_setzero_ps();
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int64_t g = 0; g < ng; g++) {
        __m512 dx[ZR];
        for (int r = 0; r < R; r++) dx[r] = _mm512_castps256_ps512(d8_q8_0(x[r] + 8 * g));
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            __m512i xu[ZR];
            __m512 dxl[ZR];
            for (int r = 0; r < R; r++) {
                const cm_block_q8_0 *xb = x[r] + 8 * g + 2 * p;
                xu[r] = _mm512_xor_si512(ld2x256(xb[0].qs, xb[1].qs), k128);
                dxl[r] = _mm512_permutexvar_ps(pair_idx(p), dx[r]);
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const uint8_t *py = pk + (size_t)t * tb + (size_t)g * PQ8_GROUP + (size_t)p * PQ8_PAIR;
                const __m512i qy = _mm512_load_si512((const void *)py), ini = _mm512_load_si512((const void *)(py + 64));
                const __m512 dyl = _mm512_load_ps((const void *)(py + 128));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const __m512i s = _mm512_dpbusd_epi32(ini, xu[r], qy);
                    acc[p & 1][r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dxl[r], dyl), acc[p & 1][r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float tail[ZT] = {0};
        if (8 * ng < nb) {
            const cm_block_q8_0 *yt[ZT];
            for (int t = 0; t < T; t++) yt[t] = yv[t] + 8 * ng;
            for (int t0 = 0; t0 < T; t0 += TMAX) /* the tile holds at most TMAX tokens */
                tile_q8_0(nb - 8 * ng, x[r] + 8 * ng, yt + t0, T - t0 < TMAX ? T - t0 : TMAX, tail + t0);
        }
        for (int t = 0; t < T; t++)
            out[r][t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r][t], acc[1][r][t])) + tail[t];
    }
}
ZGEMM(q8_0, cm_block_q8_0, cm_block_q8_0, 2, 4, (size_t)(k / CM_QK8_0 / 8) * PQ8_GROUP, pack_q8_0, prow_q8_0,
      gemm_zq8_0)

/* ---- f16: activations converted to f32 once (the 32-aligned prefix; the
 * tail is read from the f16 row like the tile does) ---- */
AI void pack_f16(int64_t k, const void *y, uint8_t *d) {
    for (int64_t i = 0; i + 16 <= (k & ~(int64_t)31); i += 16) _mm512_store_ps((void *)(d + 4 * i), z_f16(y, i));
}

AI void prow_f16(int64_t k, const void *const *x, const uint8_t *pk, size_t tb, const void *const *yv, int R, int T,
                 float (*out)[ZT]) {
    __m512 a0[ZR][ZT], a1[ZR][ZT];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) a0[r][t] = a1[r][t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512 x0[ZR], x1[ZR];
        for (int r = 0; r < R; r++) {
            x0[r] = z_f16(x[r], i);
            x1[r] = z_f16(x[r], i + 16);
        }
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            const float *py = (const float *)(const void *)(pk + (size_t)t * tb) + i;
            const __m512 y0 = _mm512_load_ps(py), y1 = _mm512_load_ps(py + 16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                a0[r][t] = _mm512_fmadd_ps(x0[r], y0, a0[r][t]);
                a1[r][t] = _mm512_fmadd_ps(x1[r], y1, a1[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[r][t], a1[r][t]));
            for (int64_t j = i; j < k; j++) s += sc_f16(x[r], j) * sc_f16(yv[t], j);
            out[r][t] = s;
        }
}
ZGEMM(f16, void, void, 2, 4, (size_t)(k & ~(int64_t)31) * 4, pack_f16, prow_f16, gemm_zf16)

/* ---- q4_k: per super-block, 320 bytes per token: for h = 0, 1 the two
 * vectors ztile_q4_k multiplies the low and high nibbles with
 * ([y 128h..+31 | y 128h+64..+95], [y 128h+32..+63 | y 128h+96..+127]), then
 * the 8 pair sums of bsums (int16, as kmins forms them) and d (f32) ---- */
enum { PQ4K_BLOCK = 320 };

AI void pack_q4_k(int64_t k, const cm_block_q8_k *y, uint8_t *d) {
    for (int64_t b = 0; b < k / CM_QK_K; b++, d += PQ4K_BLOCK) {
        for (int h = 0; h < 2; h++) {
            const int8_t *q = y[b].qs + 128 * h;
            _mm512_store_si512((void *)(d + 128 * h), ld2x256(q, q + 64));
            _mm512_store_si512((void *)(d + 128 * h + 64), ld2x256(q + 32, q + 96));
        }
        const __m256i bs = ld256(y[b].bsums);
        _mm_store_si128((__m128i *)(void *)(d + 256),
                        _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
        _mm_store_si128((__m128i *)(void *)(d + 272), _mm_castps_si128(_mm_set_ss(y[b].d)));
        _mm256_store_si256((__m256i *)(void *)(d + 288), _mm256_setzero_si256());
    }
}

AI void prow_q4_k(int64_t k, const cm_block_q4_k *const *x, const uint8_t *pk, size_t tb,
                  const cm_block_q8_k *const *yv, int R, int T, float (*out)[ZT]) {
    (void)yv;
    __m512 acc[ZR][ZT];
    __m128 accm[ZR][ZT];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            acc[r][t] = _mm512_setzero_ps();
            accm[r][t] = _mm_setzero_ps();
        }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < k / CM_QK_K; b++) {
        __m512i sumi[ZR][ZT];
        __m128i mn16[ZR];
        float d[ZR], dmin[ZR];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            uint8_t sc[8], mn[8];
            kscales(x[r][b].scales, sc, mn);
            mn16[r] = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
            const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
            d[r] = f16f(x[r][b].d);
            dmin[r] = f16f(x[r][b].dmin);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) sumi[r][t] = _mm512_setzero_si512();
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m512i q = _mm512_loadu_si512(x[r][b].qs + 64 * h);
                const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                const __m512i slo = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_q4k_idx[2 * h]), sc16);
                const __m512i shi = _mm512_permutexvar_epi16(_mm512_loadu_si512(k_q4k_idx[2 * h + 1]), sc16);
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                    const uint8_t *py = pk + (size_t)t * tb + (size_t)b * PQ4K_BLOCK + 128 * h;
                    const __m512i plo = _mm512_madd_epi16(_mm512_maddubs_epi16(lo, _mm512_load_si512((const void *)py)), slo);
                    const __m512i phi =
                        _mm512_madd_epi16(_mm512_maddubs_epi16(hi, _mm512_load_si512((const void *)(py + 64))), shi);
                    sumi[r][t] = _mm512_add_epi32(sumi[r][t], _mm512_add_epi32(plo, phi));
                }
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const uint8_t *py = pk + (size_t)t * tb + (size_t)b * PQ4K_BLOCK;
                float yd;
                memcpy(&yd, py + 272, sizeof yd);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r][t]), _mm512_set1_ps(d[r] * yd), acc[r][t]);
                const __m128i mins = _mm_madd_epi16(mn16[r], _mm_load_si128((const __m128i *)(const void *)(py + 256)));
                accm[r][t] = _mm_fmadd_ps(_mm_cvtepi32_ps(mins), _mm_set1_ps(dmin[r] * yd), accm[r][t]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[r][t] = _mm512_reduce_add_ps(acc[r][t]) - hsum4(accm[r][t]);
}
ZGEMM(q4_k, cm_block_q4_k, cm_block_q8_k, 1, 4, (size_t)(k / CM_QK_K) * PQ4K_BLOCK, pack_q4_k, prow_q4_k, gemm_zq4_k)
