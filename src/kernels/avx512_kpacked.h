/*
 * avx512_kpacked.h: the avx512 table's prefill gemm over a k-quant's rows
 * repacked at load (repack.c's "q5_k lanes", "q6_k lanes"), so that the
 * file's pages under them can go back to the OS (cm_repack_give_back) and
 * the weights are held once. Rows are turned back into the file's bytes,
 * KP_CHUNK bytes of rows at a time (a multiple of 16 rows: the AMX gemms'
 * panel height), in a stack buffer that stays in L2, and run through the
 * table's own gemm over the file's layout (AMX included: the fill runs last,
 * dispatch.c), so every (row, token) is that gemm's bits, which are the
 * table's vec_dot's (kernels.h: any row slice gives the same bits). The
 * conversion reads each weight byte once per call, as the gemms' own row
 * unpacking does once per pass of tokens. Not a header in the usual sense:
 * gemm_kq_avx512.c and gemm_kq6_avx512.c include it once each, under their
 * ISA flags. Stack: KP_CHUNK bytes plus the inner gemm's.
 */
enum { KP_CHUNK = 16 * CM_REPACK_MAX_K / CM_QK_K * 210 }; /* 16 rows of the longest q6_k row repacked (420 KiB) */

/* NAME(k, w: the repacked rows, w_stride, ...): cm_gemm_fn over rows of
 * BLOCK (super-blocks of CM_QK_K), UNROW(nb, src, dst) converting one row
 * back, INNER: the table's gemm over the file's layout */
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
