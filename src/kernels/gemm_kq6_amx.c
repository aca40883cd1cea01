/*
 * gemm_kq6_amx.c: the avx512 table's q6_k prefill gemm on AMX tiles (Sapphire
 * Rapids and later), bit-identical to that table's vec_dot (ztile_q6_k in
 * kernels_avx512.c).
 *
 * vec_dot's float order: per super-block b in ascending order the exact
 * integer I_b = sum over its 16 groups g of scale_g * sum((q - 32) * y)
 * (|I_b| < 2^28; zq6_sums' 128-bit lane grouping is only a way to form
 * this integer), converted to f32 (round to nearest), then
 * chain (b mod 16) = fma(f32(I_b), d_b * dy_b, chain) (d_b * dy_b one f32
 * product), and the 16 chains summed as _mm512_reduce_add_ps does:
 * c_i + c_(i+8), then + the one 4 apart, then (0 + 2) + (1 + 3).
 *
 * The integer part on tiles: each weight's w = (q - 32) * scale (an int16,
 * -4064..4096) is split as w = 256 * hi + lo with lo = (int8)w and hi =
 * (w + 128) >> 8 (-16..16), both signed bytes, so I_b = 256 * H + L with
 * H = sum(hi * y) and L = sum(lo * y) over all 256 elements: per super-block
 * two int32 accumulators, each four TDPBSSD with K = 64, exact (|L| < 2^22,
 * |256 H| < 2^27) and with no per-group work: the scales ride in the bytes.
 * The epilogue forms I_b = (H << 8) + L per (row, token) and then exactly
 * vec_dot's float operations above, so every result equals vec_dot's bits
 * (kernels.h's batch invariance), tests/unit/test_kernels_amx6.c.
 *
 * Operands: A = 16 weight rows x 64 bytes (lo or hi of one 64-element chunk
 * of one super-block), B = 16 tokens' 64 activation bytes of that chunk in
 * the VNNI layout (row q: 4 bytes 4q..4q+3 of each token), C = 16 rows x 16
 * tokens of int32: the epilogue runs over vectors of 16 tokens. The rows'
 * lo/hi panel is built per call, per 16 rows and per A6_S super-blocks (a
 * 16 KiB piece that stays in L1 while every group of 16 tokens uses it;
 * the whole panel at once, 64 KiB at k = 2048, ran 1.1-1.6x slower: its
 * tile loads missed L1), with no second copy of the weights in memory; each
 * group keeps its 16 chains per row in memory between pieces. The tokens
 * are packed once per pass (a last group of fewer than 16 padded with
 * zeros). The bound is the TDPBSSDs and their tile loads with the
 * epilogue: sharing the weight tiles between two token groups gained
 * nothing. The same gemm reads "q6_k lanes" rows (the table's gemm_packed,
 * a6_panel's lanes: the weights held once, cm_repack_give_back).
 *
 * Tile configuration per thread and per call (loaded here, released on
 * return). Compiled with the AMX flags (Makefile), installed by
 * gemm_amx.c's cm_kernels_fill_amx only when AMX-INT8 is usable and
 * CUMULO_AMX is not 0. Below a6_mintok's tokens, or for rows longer than
 * A6_MAXNB super-blocks, it hands over to the table's gemm it replaced.
 * Stack: ~1.3 MiB at most (compute threads have CM_COMPUTE_STACK, 8 MiB).
 * Never allocates.
 */
#include "amx.h"
#include "isa.h"

#include "base/base.h"

#include <immintrin.h>
#include <string.h>

#define A6I static inline __attribute__((always_inline))

enum {
    A6_MAXNB = 64,        /* longest row, in super-blocks (k <= 16384) */
    A6_PB = 8192,         /* panel bytes per super-block: 4 chunks x (lo, hi) x 16 rows x 64 */
    A6_TB = 4160,         /* packed token bytes per super-block: 4 chunks x 16 x 64, then 16 dy */
    A6_PACK = 768 * 1024, /* packed tokens per pass (one group at least: A6_MAXNB * A6_TB fits) */
    A6_S = 2,             /* super-blocks per panel piece (16 KiB: stays in L1 for every token group) */
    A6_MAXG = 32,         /* token groups per pass (their chains: 16 KiB each) */
};

static cm_gemm_fn g_prev_q6;

/* word i: group i / 8 of a 64-element chunk (plus 4 * chunk) */
static const uint16_t k_a6_sidx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* The panel of rows [0, R) at w (stride ws; lanes past R repeat row R - 1):
 * per super-block, chunk c (elements 64c..) at pb + 2048c: 16 rows x 64 lo
 * bytes, then 16 x 64 hi bytes; dx[16b + n] = f32(d) of row n. The words
 * w = (q - 32) * s of the even and the odd elements come from two maddubs
 * (q unsigned, the scale byte beside a zero; |q * s| < 2^13, no
 * saturation) less 32 s, then lo = the low bytes in place and hi = the high
 * bytes of w + 128. */
static const int8_t k_a6_sperm[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/* lanes: the rows are "q6_k lanes" (repack.c): position 64u + 4L + e holds
 * element 16 s(L) + 4u + e, s(L) = 4 (L % 4) + L / 4, and scales[L] scale
 * s(L), so a 4 x 4 dword transpose per 128-bit lane gives the elements in
 * order and one byte shuffle the scales (gemm_kq6_avx512.c's kq6_unlanes_blk) */
A6I void a6_panel(int64_t nb, int64_t b0, int64_t b1, const uint8_t *w, size_t ws, int R, uint8_t *pb, float *dx,
                  bool lanes) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    static const uint16_t k_shift[2][32] = {
        {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}};
    const __m512i shl = _mm512_loadu_si512(k_shift[0]), shr = _mm512_loadu_si512(k_shift[1]);
    const __m512i sidx = _mm512_loadu_si512(k_a6_sidx), k128 = _mm512_set1_epi16(128);
    const __m512i lob = _mm512_set1_epi16(0x00ff);
    const __mmask64 odd = 0xaaaaaaaaaaaaaaaaull;
    __m512i si[4]; /* the scale words of chunk c */
    for (int c = 0; c < 4; c++) si[c] = _mm512_add_epi16(sidx, _mm512_set1_epi16((short)(4 * c)));
    for (int n = 0; n < 16; n++) {
        const cm_block_q6_k *x = (const cm_block_q6_k *)(const void *)(w + (size_t)(n < R ? n : R - 1) * ws);
        for (int64_t b = b0; b < b1; b++) {
            uint8_t *p = pb + (size_t)(b - b0) * A6_PB + 64 * n;
            /* the row's next piece, after its last one the next panel's first
             * (the hardware prefetcher stops at pages) */
            const char *ahead =
                b + A6_S < nb ? (const char *)(x + b + A6_S) : (const char *)(x + b + A6_S - nb) + 16 * ws;
            for (int o = 0; o < 256; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
            dx[16 * b + n] = _cvtsh_ss(x[b].d);
            __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)x[b].scales);
            __m512i v[4]; /* v[ch]: elements 64ch .. + 63, values 0..63 */
            if (lanes) {
                const __m512i l0 = _mm512_loadu_si512(x[b].ql), l1 = _mm512_loadu_si512(x[b].ql + 64);
                const __m512i h = _mm512_loadu_si512(x[b].qh);
                const __m512i p0 =
                    _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
                const __m512i p1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
                                                   _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
                const __m512i p2 = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(h, m30));
                const __m512i p3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                                   _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
                const __m512i t0 = _mm512_unpacklo_epi32(p0, p1), t1 = _mm512_unpackhi_epi32(p0, p1);
                const __m512i t2 = _mm512_unpacklo_epi32(p2, p3), t3 = _mm512_unpackhi_epi32(p2, p3);
                v[0] = _mm512_unpacklo_epi64(t0, t2);
                v[1] = _mm512_unpackhi_epi64(t0, t2);
                v[2] = _mm512_unpacklo_epi64(t1, t3);
                v[3] = _mm512_unpackhi_epi64(t1, t3);
                sb = _mm_shuffle_epi8(sb, _mm_loadu_si128((const __m128i *)(const void *)k_a6_sperm));
            } else
                for (int c = 0; c < 2; c++) {
                    const __m512i l = _mm512_loadu_si512(x[b].ql + 64 * c);
                    const __m512i h =
                        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(x[b].qh + 32 * c)));
                    v[2 * c] =
                        _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30));
                    v[2 * c + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                   _mm512_and_si512(_mm512_srlv_epi16(h, shr), m30));
                }
            const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sb));
            for (int ch = 0; ch < 4; ch++) {
                const __m512i s = _mm512_permutexvar_epi16(si[ch], sc), s32 = _mm512_slli_epi16(s, 5);
                const __m512i we = _mm512_sub_epi16(_mm512_maddubs_epi16(v[ch], _mm512_and_si512(s, lob)), s32);
                const __m512i wo = _mm512_sub_epi16(_mm512_maddubs_epi16(v[ch], _mm512_slli_epi16(s, 8)), s32);
                _mm512_store_si512((void *)(p + 2048 * ch), _mm512_mask_blend_epi8(odd, we, _mm512_slli_epi16(wo, 8)));
                _mm512_store_si512((void *)(p + 2048 * ch + 1024),
                                   _mm512_mask_blend_epi8(odd, _mm512_srli_epi16(_mm512_add_epi16(we, k128), 8),
                                                          _mm512_add_epi16(wo, k128)));
            }
        }
    }
}

/* Pack T (1..16) tokens at x (stride xs), all nb super-blocks, A6_TB bytes
 * each: per chunk c the 16 x 64 bytes of B (row q: bytes 4q..4q+3 of
 * chunk c of each token, zero past T), then the 16 dy (0 past T). */
static void a6_pack(int64_t nb, const uint8_t *x, size_t xs, int T, uint8_t *d) {
    _Alignas(64) int32_t off[16];
    for (int m = 0; m < 16; m++) off[m] = (int32_t)((size_t)(m < T ? m : 0) * xs);
    const __m512i idx = _mm512_load_si512((const void *)off);
    const __mmask16 mk = (__mmask16)((1u << T) - 1);
    const __m512i z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++, d += A6_TB) {
        const uint8_t *blk = x + (size_t)b * sizeof(cm_block_q8_k);
        for (int q = 0; q < 64; q++) /* chunk q / 16, row q % 16 */
            _mm512_store_si512((void *)(d + 64 * q),
                               _mm512_mask_i32gather_epi32(z, mk, idx, (const void *)(blk + 4 + 4 * q), 1));
        _mm512_store_ps((float *)(void *)(d + 4096),
                        _mm512_castsi512_ps(_mm512_mask_i32gather_epi32(z, mk, idx, (const void *)blk, 1)));
    }
}

/* One super-block's L and H (16 rows x 16 tokens of int32) into cb and
 * cb + 256: xb its packed tokens, wb its panel. */
#define A6_CHUNK(c, tb, tl, th)                      \
    do {                                             \
        _tile_loadd(tb, xb + 1024 * (c), 64);        \
        _tile_loadd(tl, wb + 2048 * (c), 64);        \
        _tile_dpbssd(0, tl, tb);                     \
        _tile_loadd(th, wb + 2048 * (c) + 1024, 64); \
        _tile_dpbssd(1, th, tb);                     \
    } while (0)
A6I void a6_sums(const uint8_t *xb, const uint8_t *wb, int32_t *cb) {
    _tile_zero(0);
    _tile_zero(1);
    A6_CHUNK(0, 2, 4, 6);
    A6_CHUNK(1, 3, 5, 7);
    A6_CHUNK(2, 2, 4, 6);
    A6_CHUNK(3, 3, 5, 7);
    _tile_stored(0, cb, 64);
    _tile_stored(1, cb + 256, 64);
}
#undef A6_CHUNK

/* Super-block b's epilogue: chain cv[n] (row n's 16 tokens) = fma(f32((H
 * << 8) + L), d_n * dy, chain), dy = the tokens' dy. */
A6I void a6_fin(int64_t b, const int32_t *cc, const float *dx, const float *dyp, __m512 *cv) {
    const __m512 dy = _mm512_load_ps(dyp);
    _Pragma("GCC unroll 16") for (int n = 0; n < 16; n++) {
        const __m512i I = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)(cc + 256 + 16 * n)), 8),
                                           _mm512_load_si512((const void *)(cc + 16 * n)));
        const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(dx[16 * b + n]), dy);
        cv[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), dd, b < 16 ? _mm512_setzero_ps() : cv[n]);
    }
}

/* out + 16n = row n's 16 results: the chains (ch + 16c) summed as
 * _mm512_reduce_add_ps does (chains past nb are 0, as vec_dot's untouched
 * lanes). */
static void a6_tree(int64_t nb, const __m512 *ch, float *out) {
    const __m512 z = _mm512_setzero_ps();
    for (int n = 0; n < 16; n++) {
        __m512 c[16];
        for (int i = 0; i < 16; i++) c[i] = i < nb ? ch[16 * i + n] : z;
        for (int i = 0; i < 8; i++) c[i] = _mm512_add_ps(c[i], c[i + 8]);
        for (int i = 0; i < 4; i++) c[i] = _mm512_add_ps(c[i], c[i + 4]);
        _mm512_store_ps(out + 16 * n, _mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])));
    }
}

/* Super-blocks [b0, b1) of a panel piece pb against the ngr packed groups
 * of xp (gbytes each): every group's chains (ch + 256g) advanced. Item it =
 * group it / S, super-block b0 + it % S, S = b1 - b0; the sums of the next
 * item are issued before this one's epilogue (two buffers in cb). */
static void a6_piece(int64_t b0, int64_t b1, int64_t ngr, const uint8_t *xp, size_t gbytes, const uint8_t *pb,
                     const float *dx, int32_t *cb, __m512 *ch) {
    const int64_t S = b1 - b0, n_it = ngr * S;
#define A6_XB(it) (xp + (size_t)((it) / S) * gbytes + (size_t)(b0 + (it) % S) * A6_TB)
    int cur = 0;
    a6_sums(A6_XB(0), pb, cb);
    for (int64_t it = 0; it < n_it; it++) {
        if (it + 1 < n_it) a6_sums(A6_XB(it + 1), pb + (size_t)((it + 1) % S) * A6_PB, cb + 512 * (cur ^ 1));
        const int64_t g = it / S, b = b0 + it % S;
        a6_fin(b, cb + 512 * cur, dx, (const float *)(const void *)(A6_XB(it) + 4096), ch + 256 * g + 16 * (b & 15));
        cur ^= 1;
    }
#undef A6_XB
}

static void a6_gemm(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                    int64_t r0, int64_t r1, int64_t n_tok, bool lanes) {
    const int64_t nb = k / CM_QK_K;
    _Alignas(64) uint8_t pb[A6_S * A6_PB], xp[A6_PACK];
    _Alignas(64) float dx[A6_MAXNB * 16], out[256];
    _Alignas(64) int32_t cb[1024];
    _Alignas(64) __m512 ch[A6_MAXG * 256];
    const size_t gbytes = (size_t)nb * A6_TB;
    int64_t gcap = (int64_t)(A6_PACK / gbytes); /* groups of 16 tokens per pass */
    cm_amx_calls++;
    if (gcap > A6_MAXG) gcap = A6_MAXG;
    _Alignas(64) int32_t col[16];
    for (int n = 0; n < 16; n++) col[n] = 16 * n;
    const __m512i cidx = _mm512_load_si512((const void *)col);
    /* Eight tiles of 16 rows x 64 bytes: 0 and 1 C (L and H), 2 and 3 B (tokens, even and odd
     * chunks), 4 and 5 A lo, 6 and 7 A hi. */
    cm_amx_config(NULL, NULL);
    for (int64_t j0 = 0; j0 < n_tok; j0 += 16 * gcap) {
        const int64_t ntp = n_tok - j0 < 16 * gcap ? n_tok - j0 : 16 * gcap, ngr = (ntp + 15) / 16;
        for (int64_t g = 0; g < ngr; g++) {
            const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
            a6_pack(nb, (const uint8_t *)x + (size_t)(j0 + 16 * g) * x_stride, x_stride, T, xp + (size_t)g * gbytes);
        }
        for (int64_t i = r0; i < r1; i += 16) {
            const int R = r1 - i < 16 ? (int)(r1 - i) : 16;
            const __mmask16 mk = (__mmask16)((1u << R) - 1);
            for (int64_t b0 = 0; b0 < nb; b0 += A6_S) {
                const int64_t b1 = b0 + A6_S < nb ? b0 + A6_S : nb;
                if (lanes) a6_panel(nb, b0, b1, (const uint8_t *)w + (size_t)i * w_stride, w_stride, R, pb, dx, true);
                else a6_panel(nb, b0, b1, (const uint8_t *)w + (size_t)i * w_stride, w_stride, R, pb, dx, false);
                a6_piece(b0, b1, ngr, xp, gbytes, pb, dx, cb, ch);
            }
            for (int64_t g = 0; g < ngr; g++) {
                const int T = ntp - 16 * g < 16 ? (int)(ntp - 16 * g) : 16;
                a6_tree(nb, ch + 256 * g, out);
                for (int m = 0; m < T; m++) /* token m: column m of out */
                    _mm512_mask_storeu_ps(y + (j0 + 16 * g + m) * ldy + i, mk, _mm512_i32gather_ps(cidx, out + m, 4));
            }
        }
    }
    _tile_release();
}

/* The fewest tokens (rows of nb super-blocks) taken from the replaced gemm
 * (bench/amxcross.c, thread CPU time, best of 5, 1 thread, Xeon family 6
 * model 167, HISTORY.md session 21): AMX / avx512 1.01-1.04x at 7 for k
 * 768, 1.06-1.09x at 10 for k 1024 and 2048, 1.13x at 6 for k 8192; over
 * "q6_k lanes" 1.12x at 9 for k 768, 1.05-1.06x at 11 for k 1024 and
 * 2048, 1.09x at 7 for k 8192. */
static int a6_mintok(bool lanes, int64_t nb) {
    if (nb <= 3) return lanes ? 9 : 7;
    if (nb >= 32) return lanes ? 7 : 6;
    return lanes ? 11 : 10;
}

static void gemm_xq6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < a6_mintok(false, k / CM_QK_K) || k / CM_QK_K > A6_MAXNB) {
        g_prev_q6(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    a6_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

/* The same over "q6_k lanes" (the table's gemm_packed, which it replaces:
 * the file's pages under the copy are given back, cm_repack_give_back). */
static cm_gemm_fn g_prev_pq6;
static void gemm_xpq6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok < a6_mintok(true, k / CM_QK_K) || k / CM_QK_K > A6_MAXNB) {
        g_prev_pq6(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    a6_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

/* The AMX path for every n_tok (tests and kbench; rows up to A6_MAXNB super-blocks). */
static void gemm_aq6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) a6_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, false);
}

void cm_kernels_fill_amx6(cm_kernels *k) {
    g_prev_q6 = k->gemm[CM_TYPE_Q6_K];
    CM_ASSERT(g_prev_q6);
    k->gemm[CM_TYPE_Q6_K] = gemm_xq6_k;
    if (k->gemm_packed[CM_TYPE_Q6_K]) {
        g_prev_pq6 = k->gemm_packed[CM_TYPE_Q6_K];
        k->gemm_packed[CM_TYPE_Q6_K] = gemm_xpq6_k;
    }
}

static void gemm_apq6_k(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, int64_t n_tok) {
    if (n_tok > 0 && r1 > r0) a6_gemm(k, w, w_stride, x, x_stride, y, ldy, r0, r1, n_tok, true);
}

cm_gemm_fn cm_kernels_amx6_direct(bool packed, int64_t k, int *mintok) {
    *mintok = a6_mintok(packed, k / CM_QK_K);
    return packed ? gemm_apq6_k : gemm_aq6_k;
}
