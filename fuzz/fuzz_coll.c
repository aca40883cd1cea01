/*
 * fuzz_coll.c: libFuzzer target for cm_coll_piece_parse, the parser of an
 * ALLREDUCE piece a tensor-parallel peer sends (header, then f32 elements or
 * Q8_0 blocks). It must never crash, and a piece it accepts must describe
 * exactly the bytes it came with.
 */
#include "cluster/collective.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_coll_piece pc;
    char err[256];
    if (cm_coll_piece_parse(data, size, &pc, err, sizeof err) == 0) {
        size_t want = (pc.point & CM_COLL_POINT_Q8) ? (size_t)(pc.n + 31) / 32 * 34 : (size_t)pc.n * 4;
        if (pc.data_len != want || pc.data != data + CM_COLL_HDR_BYTES || CM_COLL_HDR_BYTES + want != size) abort();
        volatile uint8_t s = 0;
        for (size_t i = 0; i < pc.data_len; i++) s ^= pc.data[i];
        (void)s;
    }
    return 0;
}
