/*
 * amx.h: the AMX tile configuration shared by the AMX gemms (gemm_amx.c,
 * gemm_kq45_amx.c, gemm_kq6_amx.c). Private to the files compiled with
 * -mamx-tile: only they may include it. Configuration is per thread; each
 * gemm loads its own on entry and releases the tiles (_tile_release) before
 * it returns.
 */
#ifndef CM_KERNELS_AMX_H
#define CM_KERNELS_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The 64-byte tile configuration (palette 1). */
typedef struct {
    uint8_t palette, start_row, rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} cm_amx_cfg;

/* Load palette 1 with tiles 0 to 7 of rows[i] rows x colsb[i] bytes; NULL
 * for both: all eight 16 rows x 64 bytes. */
static inline void cm_amx_config(const uint8_t *rows, const uint16_t *colsb) {
    _Alignas(64) cm_amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = rows ? rows[i] : 16, c.colsb[i] = colsb ? colsb[i] : 64;
    _tile_loadconfig(&c);
}

/* AMX gemm calls made by this thread (gemm_amx.c; each AMX gemm adds one
 * per call): tests tell from it which path a batch took. */
extern _Thread_local uint64_t cm_amx_calls;

#endif
