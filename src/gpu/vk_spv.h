/*
 * vk_spv.h: the compute shaders' SPIR-V, compiled by glslc at build time
 * (scripts/spv2c.sh writes $(BUILD)/gen/vk_spv.c). Without glslc the table
 * is empty and the binary has no GPU backend.
 */
#ifndef CM_VK_SPV_H
#define CM_VK_SPV_H

#include <stddef.h>

typedef struct cm_vk_spv {
    const char *name;         /* "mm_q4_0", "rmsnorm", ... */
    const unsigned int *code; /* SPIR-V words */
    size_t size;              /* bytes */
} cm_vk_spv;

extern const cm_vk_spv cm_vk_spvs[]; /* ends with a NULL name */

#endif
