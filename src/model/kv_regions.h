/*
 * kv_regions.h (private to src/model): a KV cache's arrays seen as regions
 * of positions, for the code that manages its pages (kv_mem.c: commit and
 * give back; kv_blocks.c: prefix blocks shared copy-on-write). The layout is
 * model.h's cm_kv; nothing here reads or writes a value.
 */
#ifndef CM_KV_REGIONS_H
#define CM_KV_REGIONS_H

#include "model.h"

/* The regions of one array, in address order: n_reg of stride bytes, each
 * holding position p at p * unit (K rows, V rows, or one element of a
 * transposed V row). rows: one region per (layer, head), positions as rows
 * (few regions: the prefix blocks are shared page by page only there). */
typedef struct region_set {
    uint8_t *base;
    size_t map; /* bytes mapped (0: heap memory) */
    size_t n_reg, stride, unit;
    bool rows;
} region_set;

/* K's regions, then V's (none in deepseek2's latent cache): 1 or 2 sets. */
static inline int cm_kv_regions(const cm_kv *kv, region_set rs[2]) {
    const int D = kv->head_dim;
    const size_t nh = (size_t)(kv->layer_last - kv->layer_first) * (size_t)(kv->latent ? 1 : kv->h1 - kv->h0);
    const size_t k_unit = kv->v_rows ? kv->k_row : cm_row_size(kv->type, D);
    int n = 0;
    rs[n++] = (region_set){(uint8_t *)kv->k, kv->k_map, nh, (size_t)kv->n_ctx * k_unit, k_unit, true};
    if (kv->latent) return n;
    if (kv->v_rows)
        rs[n++] = (region_set){(uint8_t *)kv->v, kv->v_map, nh, (size_t)kv->n_ctx * kv->v_row, kv->v_row, true};
    else {
        const size_t one = cm_row_size(kv->type, 1);
        rs[n++] = (region_set){(uint8_t *)kv->v, kv->v_map, nh * (size_t)D, (size_t)kv->n_ctx * one, one, false};
    }
    return n;
}

#endif
