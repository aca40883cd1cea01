/*
 * fuzz_frame.c: libFuzzer target for everything a peer's bytes reach before and
 * after authentication: frame headers, cm_frame_open in every session phase and
 * mode (fixed keys, so seeds sealed with them reach the payload), every message
 * codec, and the handshake readers. Oracles besides the sanitizers: an accepted
 * payload must re-encode to the same bytes (where the encoding is canonical),
 * and accessors of decoded views must stay inside the input.
 *
 * Input: byte 0 picks the target (low 2 bits) and the session (bits 2-3);
 * for codecs byte 1 is the message type. Seeds: fuzz/corpus/frame/, written by
 * `CUMULO_FRAME_CORPUS=fuzz/corpus/frame build/tests/test_proto`.
 */
#include "base/base.h"
#include "proto/proto.h"

#include <stdlib.h>
#include <string.h>

/* The same constant as in tests/unit/test_proto.c (seed writer). */
#define FUZZ_KEY_BYTE 0x42

static uint8_t g_out[1 << 16];

static void check_codec(unsigned type, const uint8_t *p, size_t n) {
    cm_msg m;
    char e[256];
    if (cm_msg_decode(type, p, n, &m, e, sizeof e) != 0) return;
    size_t len = 0;
    if (type == CM_MSG_FORWARD) {
        cm_msg_forward *f = &m.u.forward;
        volatile uint32_t sink = 0; /* unsigned: the sum may wrap */
        static float row[CM_MSG_MAX_DIM];
        for (uint32_t i = 0; i < f->n_tokens; i++) {
            sink += (uint32_t)cm_msg_forward_pos(f, i) + (uint32_t)cm_msg_forward_seq(f, i) +
                    (uint32_t)cm_msg_forward_want(f, i);
            if (f->dtype == CM_HIDDEN_TOKENS) sink += (uint32_t)cm_msg_forward_token(f, i);
            else cm_msg_forward_row(f, i, row);
        }
        (void)sink;
        return;
    }
    if (type == CM_MSG_ALLREDUCE) {
        float *out = malloc((size_t)m.u.allreduce.n * sizeof(float));
        if (out) cm_msg_allreduce_get(&m.u.allreduce, out);
        free(out);
        return;
    }
    if (type == CM_MSG_TRAIN) { /* the accessors stay inside the input; then re-encode below */
        const cm_msg_train *t = &m.u.train;
        volatile int32_t sink = 0;
        for (uint32_t i = 0; (t->flags & CM_TRAIN_F_TARGETS) && i < t->n_rows; i++)
            sink += cm_msg_train_target(t, i) & 1;
        (void)sink;
        float *out = malloc((size_t)t->n_rows * t->dim * sizeof(float) + 1);
        if (out) cm_msg_train_get(t, out);
        free(out);
    }
    if (n > sizeof g_out) return;
    if (cm_msg_encode(&m, g_out, sizeof g_out, &len, e, sizeof e) != 0 || len != n || memcmp(g_out, p, n) != 0)
        abort(); /* accepted but not canonical: the decoder let something through */
}

static void fuzz_open(int kind, const uint8_t *p, size_t n) {
    cm_chan s;
    cm_chan_init(&s);
    if (kind > 0) {
        s.established = true;
        s.mode = (cm_sec_mode)(kind - 1);
        memset(s.rx_key, FUZZ_KEY_BYTE, sizeof s.rx_key);
    }
    uint8_t *buf = malloc(n ? n : 1); /* exact size, so ASan sees any over-read */
    if (!buf) return;
    memcpy(buf, p, n);
    cm_frame_hdr h;
    uint8_t *payload;
    char e[256];
    if (cm_frame_open(&s, buf, n, &h, &payload, e, sizeof e) == 0) {
        if (s.rx_seq != 1 || h.len > n) abort();
        if (h.type >= CM_MSG_HELLO) check_codec(h.type, payload, h.len);
    }
    free(buf);
}

static void fuzz_hs(const uint8_t *p, size_t n) {
    static const uint8_t key[32] = {FUZZ_KEY_BYTE};
    cm_hs a;
    char e[256];
    uint8_t out[128];
    size_t len;
    for (int mode = 0; mode < CM_SEC_COUNT; mode++) {
        const uint8_t *k = mode ? key : NULL;
        cm_hs_init(&a, false, (cm_sec_mode)mode, k, e, sizeof e);
        if (cm_hs_read_init(&a, p, n, e, sizeof e) == 0 &&
            cm_hs_write_reply(&a, out, sizeof out, &len, e, sizeof e) == 0)
            if (cm_hs_read_finish(&a, p, n, e, sizeof e) == 0 && mode) abort(); /* a forged proof */
        cm_hs_init(&a, true, (cm_sec_mode)mode, k, e, sizeof e);
        cm_hs_write_init(&a, out, sizeof out, &len, e, sizeof e);
        if (cm_hs_read_reply(&a, p, n, e, sizeof e) == 0 && mode) abort();
        cm_hs_wipe(&a);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned sel = data[0] & 3, kind = (data[0] >> 2) & 3;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    cm_frame_hdr h;
    cm_frame_hdr_decode(p, n, &h, NULL, 0);
    switch (sel) {
    case 0: fuzz_open((int)kind, p, n); break;
    case 1:
        if (n >= 1) check_codec(p[0], p + 1, n - 1);
        break;
    case 2: fuzz_hs(p, n); break;
    default:
        for (unsigned t = CM_MSG_HELLO; t < CM_MSG_COUNT; t++) check_codec(t, p, n);
        break;
    }
    return 0;
}
