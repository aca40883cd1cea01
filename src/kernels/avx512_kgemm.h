/*
 * avx512_kgemm.h: what is left of the AVX-512 k-quant gemms that unpacked
 * rows once per pass (their gemms are now gemm_kq_avx512.c's, q5_k, and
 * gemm_kq4_avx512.c's and gemm_kq6_avx512.c's): q6_k's scale word order for gemv_fq6_k. Not a
 * header in the usual sense: kernels_avx512.c includes it once, under its
 * own ISA flags. Nothing else may include it.
 */

/* ---- q6_k: the word-pair scale order of gemv_fq6_k (avx512_krepack.h) ---- */
/* word 2l = scale 8c + l/4, word 2l + 1 = scale 8c + 4 + l/4 */
static const uint16_t k_kg6_idx[2][32] = {
    {0, 4, 0, 4, 0, 4, 0, 4, 1, 5, 1, 5, 1, 5, 1, 5, 2, 6, 2, 6, 2, 6, 2, 6, 3, 7, 3, 7, 3, 7, 3, 7},
    {8,  12, 8,  12, 8,  12, 8,  12, 9,  13, 9,  13, 9,  13, 9,  13,
     10, 14, 10, 14, 10, 14, 10, 14, 11, 15, 11, 15, 11, 15, 11, 15}};
