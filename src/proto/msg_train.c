/*
 * msg_train.c: TRAIN (proto.h, docs/PROTOCOL.md "TRAIN"), the messages of
 * pipeline-parallel LoRA training. A fixed 88-byte head, then the target
 * ids (F_TARGETS) and the rows of floats. The encoder and the decoder check
 * the same bounds (one function); a decoder never trusts n_rows or dim
 * before the product is bounded in 64 bits against the payload maximum.
 */
#include "msg_train.h"

#include "base/base.h"

#include <math.h>
#include <string.h>

enum { HEAD = 88 };

static float f32_of(const uint8_t *q) {
    uint32_t u = cm_rd_u32(q);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The field that breaks TRAIN's bounds, or NULL. */
static const char *train_invalid(const cm_msg_train *t) {
    if (t->op >= CM_TRAIN_OP_COUNT) return "op";
    if (t->vec >= CM_TRAIN_VEC_COUNT) return "vec";
    if (t->flags & ~(CM_TRAIN_F_TARGETS | CM_TRAIN_F_BACKWARD) || (t->flags && t->op != CM_TRAIN_FWD)) return "flags";
    for (int i = 0; i < 5; i++)
        if (!isfinite(t->f[i])) return "f";
    if (!(isfinite(t->loss) && t->loss >= 0)) return "loss";
    const bool rows = t->op == CM_TRAIN_FWD || t->op == CM_TRAIN_BWD || t->op == CM_TRAIN_ROWS;
    if (rows) {
        if (t->n_rows > CM_MSG_MAX_TOKENS || t->dim > CM_MSG_MAX_DIM) return "n_rows x dim";
        if (t->op != CM_TRAIN_ROWS && (t->n_rows == 0 || t->dim == 0)) return "n_rows x dim";
        if (t->n_targets > CM_MSG_MAX_TOKENS) return "n_targets";
    } else if (t->op == CM_TRAIN_SLICE || t->op == CM_TRAIN_FETCH) {
        if (t->n_rows != (t->op == CM_TRAIN_SLICE) || t->dim == 0 || t->dim > CM_MSG_MAX_TRAIN_SLICE) return "dim";
        if (t->offset > (1ull << 48)) return "offset";
    } else if (t->n_rows || t->dim) {
        return "n_rows x dim";
    }
    if (t->op == CM_TRAIN_SETUP) {
        if (t->rank == 0 || t->rank > CM_MSG_MAX_TRAIN_RANK) return "rank";
        if (!t->targets || t->targets & ~0x7fu) return "targets";
        if (t->n_ctx < 2 || t->n_ctx > 65536) return "n_ctx";
        if (!(t->f[0] > 0)) return "alpha";
        if (t->offset < 1 || t->offset > CM_MSG_MAX_TRAIN_INFLIGHT) return "offset (windows in flight)";
    }
    const uint64_t bytes = HEAD + (uint64_t)t->n_rows * 4u * ((t->flags & CM_TRAIN_F_TARGETS) ? 1u : 0u) +
                           (uint64_t)t->n_rows * t->dim * 4u;
    if (bytes > cm_msg_max_payload(CM_MSG_TRAIN)) return "n_rows x dim";
    return NULL;
}

const char *cm_msg_train_put(const cm_msg_train *t, uint8_t *out, size_t cap, size_t *len, bool *over) {
    *len = 0;
    *over = false;
    const char *bad = train_invalid(t);
    if (bad) return bad;
    const bool tg = t->flags & CM_TRAIN_F_TARGETS;
    const size_t n_data = (size_t)t->n_rows * t->dim;
    if (tg && !t->target && !t->target_le) return "target";
    if (n_data && !t->data && !t->data_le) return "data";
    if (tg)
        for (uint32_t i = 0; i < t->n_rows; i++)
            if ((t->target ? t->target[i] : (int32_t)cm_rd_u32(t->target_le + 4 * (size_t)i)) < -1) return "target";
    *len = HEAD + (tg ? 4 * (size_t)t->n_rows : 0) + 4 * n_data;
    if (!out) return NULL;
    if (*len > cap) {
        *over = true;
        return NULL;
    }
    uint8_t *q = out;
    memset(q, 0, HEAD);
    cm_wr_u64(q, t->epoch);
    cm_wr_u64(q + 8, t->id);
    q[16] = t->op, q[17] = t->flags, q[18] = t->vec;
    cm_wr_u32(q + 20, t->n_rows);
    cm_wr_u32(q + 24, t->dim);
    cm_wr_u32(q + 28, t->n_targets);
    cm_wr_u64(q + 32, t->offset);
    cm_wr_u64(q + 40, t->key);
    for (int i = 0; i < 5; i++) {
        uint32_t u;
        memcpy(&u, &t->f[i], 4);
        cm_wr_u32(q + 48 + 4 * i, u);
    }
    uint64_t lb;
    memcpy(&lb, &t->loss, 8);
    cm_wr_u64(q + 68, lb);
    cm_wr_u32(q + 76, t->rank);
    cm_wr_u32(q + 80, t->targets);
    cm_wr_u32(q + 84, t->n_ctx);
    q += HEAD;
    if (tg) {
        for (uint32_t i = 0; i < t->n_rows; i++, q += 4)
            cm_wr_u32(q, t->target ? (uint32_t)t->target[i] : cm_rd_u32(t->target_le + 4 * (size_t)i));
    }
    if (!t->data) {
        if (n_data) memcpy(q, t->data_le, 4 * n_data); /* a decoded message re-encodes as is */
        return NULL;
    }
    for (size_t k = 0; k < n_data; k++, q += 4) {
        uint32_t u;
        memcpy(&u, &t->data[k], 4);
        cm_wr_u32(q, u);
    }
    return NULL;
}

const char *cm_msg_train_take(const uint8_t *p, size_t n, cm_msg_train *t, size_t *used, const char **reason) {
    memset(t, 0, sizeof *t);
    *used = 0;
    *reason = "truncated";
    if (n < HEAD) return "head";
    t->epoch = cm_rd_u64(p);
    t->id = cm_rd_u64(p + 8);
    t->op = p[16], t->flags = p[17], t->vec = p[18];
    *reason = "out of range";
    if (p[19]) return "reserved";
    t->n_rows = cm_rd_u32(p + 20);
    t->dim = cm_rd_u32(p + 24);
    t->n_targets = cm_rd_u32(p + 28);
    t->offset = cm_rd_u64(p + 32);
    t->key = cm_rd_u64(p + 40);
    for (int i = 0; i < 5; i++) t->f[i] = f32_of(p + 48 + 4 * i);
    uint64_t lb = cm_rd_u64(p + 68);
    memcpy(&t->loss, &lb, 8);
    t->rank = cm_rd_u32(p + 76);
    t->targets = cm_rd_u32(p + 80);
    t->n_ctx = cm_rd_u32(p + 84);
    const char *bad = train_invalid(t); /* bounds n_rows x dim: the sizes below cannot overflow */
    if (bad) return bad;
    const bool tg = t->flags & CM_TRAIN_F_TARGETS;
    const size_t nt = tg ? 4 * (size_t)t->n_rows : 0, nd = 4 * (size_t)t->n_rows * t->dim;
    *reason = "truncated";
    if (n - HEAD < nt + nd) return tg && n - HEAD < nt ? "target" : "data";
    if (tg) t->target_le = p + HEAD;
    if (nd) t->data_le = p + HEAD + nt;
    *reason = "out of range";
    for (uint32_t i = 0; tg && i < t->n_rows; i++)
        if ((int32_t)cm_rd_u32(t->target_le + 4 * (size_t)i) < -1) return "target";
    *used = HEAD + nt + nd;
    *reason = NULL;
    return NULL;
}

int32_t cm_msg_train_target(const cm_msg_train *m, uint32_t i) {
    CM_ASSERT(m->target_le && i < m->n_rows);
    return (int32_t)cm_rd_u32(m->target_le + 4 * (size_t)i);
}

void cm_msg_train_get(const cm_msg_train *m, float *out) {
    const size_t n = (size_t)m->n_rows * m->dim;
    CM_ASSERT(m->data_le || !n);
    for (size_t k = 0; k < n; k++) out[k] = f32_of(m->data_le + 4 * k);
}
