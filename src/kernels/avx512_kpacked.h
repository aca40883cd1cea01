/*
 * avx512_kpacked.h: helpers of the avx512 table's gemms over k-quant rows
 * repacked at load (repack.c's "q5_k lanes" and "q6_k lanes"; the table's
 * gemm_packed), which let the file's pages under the copies go back to the
 * OS (cm_repack_give_back) so that the weights are held once. Each gemm
 * reads the repacked rows where it unpacks a row (the same values, so the
 * same bits as over the file's bytes, which are vec_dot's: kernels.h);
 * where a layout's block is needed in the file's form, kp_q5_blk gives it
 * back (a few copies). KP_GEMM is the fallback for what the gemms leave to
 * kernels_avx512.c (rows longer than 16384): rows turned back into the
 * file's bytes, KP_CHUNK bytes of rows at a time (a multiple of 16 rows) in
 * a stack buffer, through that gemm; it packs the tokens once per chunk (at
 * 2048-wide rows and 128 tokens ~1.2-1.5x the file gemm's CPU time), so it
 * serves only those rows. Not a header in the usual sense: included once
 * each by gemm_kq_avx512.c, gemm_kq6_avx512.c, gemm_kq45_amx.c and
 * gemv_kd_avx512.c, under their ISA flags.
 */
#include <string.h>

enum { KP_CHUNK = 16 * CM_REPACK_MAX_K / CM_QK_K * 210 }; /* 16 rows of the longest q6_k row repacked (420 KiB) */

/* Super-block b of a "q5_k lanes" row of nb super-blocks (repack.c: per
 * group of 4 the 4 d, the 4 dmin, the scales as three 4-byte words of each,
 * the 4 qh, the 4 qs; the nb % 4 last as they are) in the file's form. */
static inline __attribute__((always_inline)) void kp_q5_blk(const uint8_t *row, int64_t nb, int64_t b,
                                                            cm_block_q5_k *o) {
    const size_t BS = sizeof(cm_block_q5_k);
    if (b >= nb / 4 * 4) {
        memcpy(o, row + (size_t)b * BS, BS);
        return;
    }
    const uint8_t *g = row + (size_t)(b & ~(int64_t)3) * BS;
    const int j = (int)(b & 3);
    memcpy(&o->d, g + 2 * j, 2);
    memcpy(&o->dmin, g + 8 + 2 * j, 2);
    for (int q = 0; q < 3; q++) memcpy(o->scales + 4 * q, g + 16 + 16 * q + 4 * j, 4);
    memcpy(o->qh, g + 64 + 32 * j, 32);
    memcpy(o->qs, g + 192 + 128 * j, 128);
}

/* NAME(k, w: the repacked rows, w_stride, ...): a cm_gemm_fn over rows of
 * BLOCK, UNROW(nb, src, dst) turning one row back into the file's bytes,
 * INNER: the gemm over the file's layout it runs. */
#define KP_GEMM(NAME, BLOCK, UNROW, INNER)                                                                             \
    static void NAME(int64_t k, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y, int64_t ldy, \
                     int64_t r0, int64_t r1, int64_t n_tok) {                                                          \
        const int64_t nb = k / CM_QK_K;                                                                                \
        const size_t cs = (size_t)nb * sizeof(BLOCK);                                                                  \
        _Alignas(64) uint8_t buf[KP_CHUNK];                                                                            \
        CM_ASSERT(nb >= 1 && 16 * cs <= sizeof buf);                                                                   \
        const int64_t R = (int64_t)(sizeof buf / cs) / 16 * 16;                                                        \
        for (int64_t i0 = r0; i0 < r1; i0 += R) {                                                                      \
            const int64_t n = r1 - i0 < R ? r1 - i0 : R;                                                               \
            for (int64_t r = 0; r < n; r++)                                                                            \
                UNROW(nb, (const uint8_t *)w + (size_t)(i0 + r) * w_stride, (BLOCK *)(void *)(buf + (size_t)r * cs));  \
            INNER(k, buf, cs, x, x_stride, y + i0, ldy, 0, n, n_tok);                                                  \
        }                                                                                                              \
    }
