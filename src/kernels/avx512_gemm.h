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
 * into the layout the tile consumes (q4_0: 16 tokens across the int32 lanes,
 * y + 128 as unsigned bytes, against weight rows unpacked once per pass into
 * signed bytes, see below; q8_0: block pairs, -128*sum(y), scales spread over
 * the lanes; q4_k: contiguous 64-byte y vectors and the bsums pairs; f16:
 * converted to f32), so the inner loop is aligned loads,
 * vpdpbusd/FMA and almost no shuffles, and each unpacked weight vector serves
 * several tokens (and each packed activation vector several rows) from
 * registers. Integer identities used (all exact in int32):
 *   q4_0: sum((y + 128) * (q - 8)) - 128 * sum(q - 8) = sum((q - 8) * y), q the unsigned nibble;
 *   q8_0: sum((x + 128) * y) - 128 * sum(y) = sum(x * y) = sum(|x| * sign(x) y).
 * tests/unit/test_kernels_invariant.c checks every (row, token) bit for bit.
 *
 * The packed buffer lives on the stack (ZPACK bytes): the gemm needs a thread
 * stack of a few hundred KiB, which every thread cumulo starts has (the
 * default 8 MiB). Rows too long for even two tokens (q4_0: one group of 16)
 * fall back to the tiles, as do q4_0 batches of fewer than LQ_MINTOK tokens.
 * Never allocates.
 */

enum {
    ZT = 8,             /* most tokens per register tile */
    ZR = 2,             /* most weight rows per register tile */
    ZRB = 16,           /* weight rows per cache block (stay in L2 across token tiles) */
    ZPF = 4,            /* prefetch the weight row this many rows ahead (as cm_matmul_rows) */
    ZPACK = 160 * 1024, /* bytes of packed activations per pass */
};

/* The driver: pack as many tokens as fit, then for each ZRB-row block run
 * every TT-token tile over it, RR rows at a time. ROW(k, rows, pk, tb, yv, R,
 * T, out) computes out[r][t] for R rows and T tokens (constants after the
 * switch, so the compiler keeps the R x T accumulators in registers). */
#define ZGEMM(NAME, XB, YB, RR, TT, TOKBYTES, PACK, ROW, FALLBACK)                                                \
    static void gemm_p##NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, \
                             int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {                                \
        const size_t tb = (TOKBYTES);                                                                             \
        if (tb == 0 || tb * 2 > ZPACK) {                                                                          \
            FALLBACK(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);                                         \
            return;                                                                                               \
        }                                                                                                         \
        _Alignas(64) uint8_t pk[ZPACK];                                                                           \
        const int64_t cap = (int64_t)(ZPACK / tb);                                                                \
        for (int64_t j0 = 0; j0 < n_tok; j0 += cap) {                                                             \
            const int64_t nt = n_tok - j0 < cap ? n_tok - j0 : cap;                                               \
            for (int64_t t = 0; t < nt; t++)                                                                      \
                PACK(k, (const YB *)(const void *)((const char *)x + (size_t)(j0 + t) * x_stride),                \
                     pk + (size_t)t * tb);                                                                        \
            for (int64_t i0 = r0; i0 < r1; i0 += ZRB) {                                                           \
                const int64_t i1 = r1 - i0 < ZRB ? r1 : i0 + ZRB;                                                 \
                for (int64_t jj = 0; jj < nt; jj += TT) {                                                         \
                    const int T = nt - jj < TT ? (int)(nt - jj) : TT;                                             \
                    const uint8_t *p = pk + (size_t)jj * tb;                                                      \
                    const YB *yv[ZT];                                                                             \
                    for (int t = 0; t < T; t++)                                                                   \
                        yv[t] = (const YB *)(const void *)((const char *)x + (size_t)(j0 + jj + t) * x_stride);   \
                    for (int64_t i = i0; i < i1; i += RR) {                                                       \
                        const int R = i1 - i < RR ? (int)(i1 - i) : RR;                                           \
                        const XB *wr[ZR];                                                                         \
                        for (int r = 0; r < R; r++)                                                               \
                            wr[r] = (const XB *)(const void *)((const char *)w + (size_t)(i + r) * w_stride);     \
                        if (jj == 0) /* first pass over these rows: they come from DRAM */                        \
                            for (int64_t ip = i + ZPF; ip < i + ZPF + R && ip < r1; ip++)                         \
                                for (size_t o = 0; o < w_stride; o += 64)                                         \
                                    __builtin_prefetch((const char *)w + (size_t)ip * w_stride + o, 0, 0);        \
                        float out[ZR][ZT];                                                                        \
                        if (R == RR) {                                                                            \
                            switch (T) {                                                                          \
                            case 8: ROW(k, wr, p, tb, yv, RR, 8 <= TT ? 8 : 1, out); break;                       \
                            case 7: ROW(k, wr, p, tb, yv, RR, 7 <= TT ? 7 : 1, out); break;                       \
                            case 6: ROW(k, wr, p, tb, yv, RR, 6 <= TT ? 6 : 1, out); break;                       \
                            case 5: ROW(k, wr, p, tb, yv, RR, 5 <= TT ? 5 : 1, out); break;                       \
                            case 4: ROW(k, wr, p, tb, yv, RR, 4 <= TT ? 4 : 1, out); break;                       \
                            case 3: ROW(k, wr, p, tb, yv, RR, 3 <= TT ? 3 : 1, out); break;                       \
                            case 2: ROW(k, wr, p, tb, yv, RR, 2 <= TT ? 2 : 1, out); break;                       \
                            default: ROW(k, wr, p, tb, yv, RR, 1, out); break;                                    \
                            }                                                                                     \
                        } else {                                                                                  \
                            for (int r = 0; r < R; r++) switch (T) {                                              \
                                case 8: ROW(k, wr + r, p, tb, yv, 1, 8 <= TT ? 8 : 1, out + r); break;            \
                                case 7: ROW(k, wr + r, p, tb, yv, 1, 7 <= TT ? 7 : 1, out + r); break;            \
                                case 6: ROW(k, wr + r, p, tb, yv, 1, 6 <= TT ? 6 : 1, out + r); break;            \
                                case 5: ROW(k, wr + r, p, tb, yv, 1, 5 <= TT ? 5 : 1, out + r); break;            \
                                case 4: ROW(k, wr + r, p, tb, yv, 1, 4 <= TT ? 4 : 1, out + r); break;            \
                                case 3: ROW(k, wr + r, p, tb, yv, 1, 3 <= TT ? 3 : 1, out + r); break;            \
                                case 2: ROW(k, wr + r, p, tb, yv, 1, 2 <= TT ? 2 : 1, out + r); break;            \
                                default: ROW(k, wr + r, p, tb, yv, 1, 1, out + r); break;                         \
                                }                                                                                 \
                        }                                                                                         \
                        for (int r = 0; r < R; r++)                                                               \
                            for (int t = 0; t < T; t++) y[(j0 + jj + t) * ldy + i + r] = out[r][t];               \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }

/* ---- q4_0: tokens across the lanes (the lane order of ztile_q4_0) ----
 * int32 lane t of a vector is token t of a group of 16. Activations are packed
 * once per pass, per group and block: 8 vectors A[q] whose lane t holds token
 * t's y[4q..4q+3] + 128 (so they are the unsigned vpdpbusd operand), then the
 * 16 tokens' dy as f32 (576 bytes). Weight rows are unpacked once per pass
 * into signed bytes q - 8 (four blocks' low halves, then their high halves;
 * broadcast a dword at a time straight from L1 by
 * vpdpbusd), -128 * sum(q - 8) (the initial accumulator, which removes the
 * +128) and dx as f32. Per block and 2 rows x 16 tokens that is 16 vpdpbusd,
 * then per row one conversion, one scale product and one FMA into chain
 * b mod 8: exactly ztile_q4_0's s_b, d_b = dx * dy and FMA, lane by lane.
 * sum((y + 128) * (q - 8)) - 128 * sum(q - 8) = sum(y * (q - 8)), exact in int32. */
enum { LQ_TOK = 16, LQ_BLOCK = 576, LQ_MINTOK = 6 };
enum { LQ_MAXNB = (ZPACK / LQ_BLOCK) & ~3 }; /* a row longer than this has no room for a group of 16 tokens */

typedef struct lq4_row {
    _Alignas(64) int8_t q[LQ_MAXNB * 32]; /* q - 8, 4 blocks at a time: low halves, high halves (lq4_w) */
    int32_t nc[LQ_MAXNB];                 /* -128 * sum(q - 8) */
    float dx[LQ_MAXNB];
} lq4_row;

AI void lq4_pack(int64_t nb, const cm_block_q8_0 *const *yv, int T, uint8_t *d) {
    for (int64_t b = 0; b < nb; b++, d += LQ_BLOCK) {
        uint32_t *a = (uint32_t *)(void *)d;
        float *dy = (float *)(void *)(d + 512);
        for (int t = 0; t < LQ_TOK; t++) {
            uint32_t v[8] = {0};
            if (t < T) memcpy(v, yv[t][b].qs, 32);
            for (int q = 0; q < 8; q++) a[q * LQ_TOK + t] = v[q] ^ 0x80808080u;
            dy[t] = t < T ? f16f(yv[t][b].d) : 0.0f;
        }
    }
}

/* Block b's q - 8 lives at q + 128 * (b / 4) + 16 * (b % 4) (elements 0..15)
 * and 64 bytes further (16..31): four blocks unpack with one 512-bit and/shift. */
AI const int8_t *lq4_w(const lq4_row *u, int64_t b) { return u->q + 128 * (b >> 2) + 16 * (b & 3); }

AI void lq4_unpack(int64_t nb, const cm_block_q4_0 *x, lq4_row *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), k8 = _mm512_set1_epi8(8), z = _mm512_setzero_si512();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        const __m512i q = ld4x128(x[b].qs, x[b + 1].qs, x[b + 2].qs, x[b + 3].qs);
        const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        _mm512_store_si512((void *)(u->q + 32 * b), _mm512_sub_epi8(lo, k8));
        _mm512_store_si512((void *)(u->q + 32 * b + 64), _mm512_sub_epi8(hi, k8));
        _Alignas(64) int64_t sq[8]; /* sum of q per 8 bytes */
        _mm512_store_si512((void *)sq, _mm512_add_epi64(_mm512_sad_epu8(lo, z), _mm512_sad_epu8(hi, z)));
        for (int i = 0; i < 4; i++) u->nc[b + i] = -128 * ((int32_t)(sq[2 * i] + sq[2 * i + 1]) - 256);
    }
    const __m128i m4x = _mm_set1_epi8(0x0f), k8x = _mm_set1_epi8(8), zx = _mm_setzero_si128();
    for (; b < nb; b++) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)x[b].qs);
        const __m128i lo = _mm_and_si128(q, m4x), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4x);
        int8_t *w = u->q + 128 * (b >> 2) + 16 * (b & 3);
        _mm_store_si128((__m128i *)(void *)w, _mm_sub_epi8(lo, k8x));
        _mm_store_si128((__m128i *)(void *)(w + 64), _mm_sub_epi8(hi, k8x));
        const __m128i sad = _mm_add_epi64(_mm_sad_epu8(lo, zx), _mm_sad_epu8(hi, zx));
        u->nc[b] = -128 * (_mm_cvtsi128_si32(sad) + _mm_extract_epi32(sad, 2) - 256);
    }
    b = 0;
    for (; b + 8 <= nb; b += 8) _mm256_storeu_ps(u->dx + b, d8_q4_0(x + b));
    for (; b < nb; b++) u->dx[b] = f16f(x[b].d);
}

AI int32_t ld_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Block b of R rows against one packed group, into chain J of c. */
#define LQ4_BLOCK(B, J)                                                                            \
    do {                                                                                           \
        const uint8_t *pb = pg + (size_t)(B)*LQ_BLOCK;                                             \
        __m512i s0[2], s1[2];                                                                      \
        for (int r = 0; r < R; r++) {                                                              \
            s0[r] = _mm512_set1_epi32(u[r]->nc[B]);                                                \
            s1[r] = _mm512_setzero_si512();                                                        \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                                      \
            const __m512i a0 = _mm512_load_si512((const void *)(pb + 64 * q));                     \
            const __m512i a1 = _mm512_load_si512((const void *)(pb + 64 * (q + 4)));               \
            for (int r = 0; r < R; r++) {                                                          \
                const int8_t *w = lq4_w(u[r], B);                                                  \
                s0[r] = _mm512_dpbusd_epi32(s0[r], a0, _mm512_set1_epi32(ld_i32(w + 4 * q)));      \
                s1[r] = _mm512_dpbusd_epi32(s1[r], a1, _mm512_set1_epi32(ld_i32(w + 64 + 4 * q))); \
            }                                                                                      \
        }                                                                                          \
        const __m512 dy = _mm512_load_ps((const void *)(pb + 512));                                \
        for (int r = 0; r < R; r++)                                                                \
            c[r][J] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0[r], s1[r])),          \
                                      _mm512_mul_ps(_mm512_set1_ps(u[r]->dx[B]), dy), c[r][J]);    \
    } while (0)

/* R (1 or 2) unpacked rows against one packed group of 16 tokens: out[r][t].
 * pf (or NULL): the weight rows to unpack next, fetched into L2 a few lines
 * per 8 blocks (a burst of prefetches at the row start stalls on the miss queue). */
AI void lq4_rows(int64_t nb, const lq4_row *const *u, const uint8_t *pg, const char *pf, size_t pf_bytes, int R,
                 float (*out)[LQ_TOK]) {
    __m512 c[2][8];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 8; j++) c[r][j] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        if (pf)
            for (size_t o = (size_t)b * pf_bytes / (size_t)nb; o < (size_t)(b + 8) * pf_bytes / (size_t)nb; o += 64)
                _mm_prefetch(pf + o, _MM_HINT_T1);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) LQ4_BLOCK(b + j, j);
    }
    if (pf)
        for (size_t o = (size_t)b * pf_bytes / (size_t)nb; o < pf_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) if (b + j < nb) LQ4_BLOCK(b + j, j);
    for (int r = 0; r < R; r++) { /* hsum8's tree, for 16 tokens at once */
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c[r][0], c[r][4]), _mm512_add_ps(c[r][2], c[r][6])),
                                       _mm512_add_ps(_mm512_add_ps(c[r][1], c[r][5]), _mm512_add_ps(c[r][3], c[r][7])));
        _mm512_storeu_ps(out[r], s);
    }
}

static void gemm_lq4_0(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    const int64_t nb = k / CM_QK4_0;
    const size_t gb = (size_t)nb * LQ_BLOCK;
    if (n_tok < LQ_MINTOK || nb > LQ_MAXNB || gb > ZPACK) { /* too few tokens to fill lanes, or rows too long */
        gemm_zq4_0(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    _Alignas(64) uint8_t pk[ZPACK];
    lq4_row ur[2];
    const lq4_row *u[2] = {&ur[0], &ur[1]};
    const int64_t gcap = (int64_t)(ZPACK / gb); /* groups of 16 tokens per pass */
    for (int64_t j0 = 0; j0 < n_tok; j0 += gcap * LQ_TOK) {
        const int64_t left = n_tok - j0, ng = (left + LQ_TOK - 1) / LQ_TOK < gcap ? (left + LQ_TOK - 1) / LQ_TOK : gcap;
        for (int64_t g = 0; g < ng; g++) {
            const cm_block_q8_0 *yv[LQ_TOK];
            const int T = left - g * LQ_TOK < LQ_TOK ? (int)(left - g * LQ_TOK) : LQ_TOK;
            for (int t = 0; t < T; t++)
                yv[t] =
                    (const cm_block_q8_0 *)(const void *)((const char *)x + (size_t)(j0 + g * LQ_TOK + t) * x_stride);
            lq4_pack(nb, yv, T, pk + (size_t)g * gb);
        }
        for (int64_t i = r0; i < r1; i += 2) {
            const int R = r1 - i < 2 ? (int)(r1 - i) : 2;
            for (int r = 0; r < R; r++)
                lq4_unpack(nb, (const cm_block_q4_0 *)(const void *)((const char *)w + (size_t)(i + r) * w_stride),
                           &ur[r]);
            /* the next pair's rows (adjacent when w_stride is the row size, as in a GGUF) */
            const int64_t np = r1 - (i + 2) < 2 ? r1 - (i + 2) : 2;
            const char *pf = np > 0 ? (const char *)w + (size_t)(i + 2) * w_stride : NULL;
            const size_t pf_bytes = np > 0 ? (size_t)(np - 1) * w_stride + (size_t)nb * sizeof(cm_block_q4_0) : 0;
            for (int64_t g = 0; g < ng; g++) {
                float out[2][LQ_TOK];
                if (R == 2) lq4_rows(nb, u, pk + (size_t)g * gb, g == 0 ? pf : NULL, pf_bytes, 2, out);
                else lq4_rows(nb, u, pk + (size_t)g * gb, g == 0 ? pf : NULL, pf_bytes, 1, out);
                const int64_t jg = j0 + g * LQ_TOK;
                const int T = n_tok - jg < LQ_TOK ? (int)(n_tok - jg) : LQ_TOK;
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < T; t++) y[(jg + t) * ldy + i + r] = out[r][t];
            }
        }
    }
}

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
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
        acc[0][r][t] = acc[1][r][t] = _mm512_setzero_ps();
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
                const __m512i qy = _mm512_load_si512((const void *)py),
                              ini = _mm512_load_si512((const void *)(py + 64));
                const __m512 dyl = _mm512_load_ps((const void *)(py + 128));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const __m512i s = _mm512_dpbusd_epi32(ini, xu[r], qy);
                    acc[p & 1][r][t] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dxl[r], dyl), acc[p & 1][r][t]);
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
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) a0[r][t] =
        a1[r][t] = _mm512_setzero_ps();
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
