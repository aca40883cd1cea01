/*
 * ep_gather.c: the expert exchange with replicated experts (ep_gather.h):
 * pack this member's runs, all-gather the packed parts, unpack the others'.
 * The runs of member k are, for every expert e in order, its share
 * cm_expert_share(holders[e], k, ...) of e's rows; every member computes the
 * same shares, so the part sizes agree without a message.
 */
#include "cluster/ep_gather.h"

#include "base/base.h"
#include "model/model.h"

#include <string.h>

void cm_ep_pack_free(cm_ep_pack *pk) {
    cm_free(pk->buf);
    pk->buf = NULL;
    pk->cap = 0;
}

uint32_t *cm_ep_holders_of(const cm_msg_assign *a, int n_expert) {
    uint32_t *h = cm_calloc(n_expert > 0 ? (size_t)n_expert : 1, sizeof *h);
    for (int e = 0; h && e < n_expert; e++)
        for (unsigned r = 0; r < a->tp_size && r < 32; r++)
            if (cm_msg_assign_holds(a, r, (unsigned)e)) h[e] |= 1u << r;
    return h;
}

static int popcount32(uint32_t v) {
    int n = 0;
    for (; v; v &= v - 1) n++;
    return n;
}

int cm_ep_gather_holders(cm_coll *c, int rank, int size, const uint32_t *holders, float *y, int64_t row_len,
                         const int32_t *rows, int n_expert, cm_ep_pack *pk, char *err, size_t errlen) {
    if (size < 1 || size > CM_COLL_MAX_MEMBERS || rank < 0 || rank >= size)
        return cm_errf(err, errlen, CM_EINVAL, "expert gather: rank %d of %d", rank, size);
    const int64_t total = (int64_t)rows[n_expert] * row_len;
    if ((size_t)total > pk->cap) {
        float *nb = cm_malloc((size_t)total * sizeof(float));
        if (!nb) return cm_errf(err, errlen, CM_ENOMEM, "expert gather: out of memory");
        cm_free(pk->buf);
        pk->buf = nb;
        pk->cap = (size_t)total;
    }
    /* part sizes: member k's rows over every expert; pack ours at its offset */
    int64_t part[CM_COLL_MAX_MEMBERS + 1];
    part[0] = 0;
    for (int k = 0; k < size; k++) {
        int64_t at = part[k];
        for (int e = 0; e < n_expert; e++) {
            int lo, hi;
            cm_expert_share(holders[e], k, rows[e + 1] - rows[e], &lo, &hi);
            if (hi <= lo) continue;
            const int64_t n = (int64_t)(hi - lo) * row_len;
            if (k == rank) {
                memcpy(pk->buf + at, y + ((int64_t)rows[e] + lo) * row_len, (size_t)n * sizeof(float));
                if (popcount32(holders[e]) > 1) pk->shared_rows += (uint64_t)(hi - lo);
            }
            at += n;
        }
        part[k + 1] = at;
    }
    if (part[size] != total)
        return cm_errf(err, errlen, CM_EINVAL, "expert gather: the holders leave %lld of %lld rows unowned",
                       (long long)((total - part[size]) / (row_len ? row_len : 1)), (long long)rows[n_expert]);
    int rc = cm_coll_allgather(c, pk->buf, part, err, errlen);
    if (rc) return rc;
    for (int k = 0; k < size; k++) {
        if (k == rank) continue;
        int64_t at = part[k];
        for (int e = 0; e < n_expert; e++) {
            int lo, hi;
            cm_expert_share(holders[e], k, rows[e + 1] - rows[e], &lo, &hi);
            if (hi <= lo) continue;
            const int64_t n = (int64_t)(hi - lo) * row_len;
            memcpy(y + ((int64_t)rows[e] + lo) * row_len, pk->buf + at, (size_t)n * sizeof(float));
            at += n;
        }
    }
    return 0;
}
