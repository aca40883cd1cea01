/*
 * frame.c: frame headers and the sealing/opening of frames with a session's
 * keys (XChaCha20-Poly1305 IETF, libsodium). Pure functions over caller
 * buffers: no allocation, no I/O. Must never accept a frame whose sequence
 * number is not exactly the next one, nor touch payload bytes before the
 * header (and so the length) has been validated.
 */
#include "proto.h"

#include "base/base.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    uint32_t max;
} k_types[CM_MSG_COUNT] = {[CM_MSG_NONE] = {"none", 0},
#define CM_X_MSG(name, num, max) [num] = {#name, max},
                           CM_MSG_TYPES(CM_X_MSG)
#undef CM_X_MSG
};

const char *cm_msg_type_name(unsigned type) { return type > 0 && type < CM_MSG_COUNT ? k_types[type].name : "unknown"; }

uint32_t cm_msg_max_payload(unsigned type) { return type > 0 && type < CM_MSG_COUNT ? k_types[type].max : 0; }

const char *cm_sec_mode_name(cm_sec_mode m) {
    switch (m) {
    case CM_SEC_INSECURE: return "insecure";
    case CM_SEC_AUTH: return "auth-only";
    case CM_SEC_ENCRYPT: return "encrypted";
    default: return "unknown";
    }
}

void cm_frame_hdr_encode(const cm_frame_hdr *h, uint8_t out[CM_FRAME_HDR]) {
    cm_wr_u32(out, CM_PROTO_MAGIC);
    out[4] = h->version;
    out[5] = h->type;
    cm_wr_u16(out + 6, h->flags);
    cm_wr_u64(out + 8, h->seq);
    cm_wr_u32(out + 16, h->len);
}

int cm_frame_hdr_decode(const uint8_t *p, size_t n, cm_frame_hdr *h, char *err, size_t errlen) {
    if (n < CM_FRAME_HDR)
        return cm_errf(err, errlen, CM_EFORMAT, "truncated frame header (%zu of %d bytes)", n, CM_FRAME_HDR);
    uint32_t magic = cm_rd_u32(p);
    if (magic != CM_PROTO_MAGIC)
        return cm_errf(err, errlen, CM_EFORMAT, "not a cumulo frame (magic 0x%08x; is this the right port?)",
                       (unsigned)magic);
    h->version = p[4];
    h->type = p[5];
    h->flags = cm_rd_u16(p + 6);
    h->seq = cm_rd_u64(p + 8);
    h->len = cm_rd_u32(p + 16);
    if (h->version != CM_PROTO_VERSION)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "frame of protocol version %u (this node speaks version %d)",
                       (unsigned)h->version, CM_PROTO_VERSION);
    if (h->type == 0 || h->type >= CM_MSG_COUNT)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "frame of unknown message type %u", (unsigned)h->type);
    if (h->flags & ~(CM_FRAME_F_MAC | CM_FRAME_F_ENC))
        return cm_errf(err, errlen, CM_EFORMAT, "frame with unknown flags 0x%04x", (unsigned)h->flags);
    if ((h->flags & CM_FRAME_F_ENC) && !(h->flags & CM_FRAME_F_MAC))
        return cm_errf(err, errlen, CM_EFORMAT, "encrypted frame without a MAC");
    if (h->len > k_types[h->type].max)
        return cm_errf(err, errlen, CM_ERANGE, "%s frame of %u bytes exceeds the maximum of %u", k_types[h->type].name,
                       (unsigned)h->len, (unsigned)k_types[h->type].max);
    return 0;
}

bool cm_frame_hdr_version(const uint8_t *p, size_t n, unsigned *version) {
    if (n < CM_FRAME_HDR || cm_rd_u32(p) != CM_PROTO_MAGIC) return false;
    *version = p[4];
    return true;
}

int cm_frame_refusal(unsigned version, int32_t code, const char *text, uint8_t *out, size_t cap, size_t *len, char *err,
                     size_t errlen) {
    if (version > 255) return cm_errf(err, errlen, CM_EINVAL, "protocol version %u does not fit a header", version);
    cm_msg m = {.type = CM_MSG_ERROR};
    m.u.error.code = code;
    snprintf(m.u.error.text, sizeof m.u.error.text, "%s", text);
    size_t n;
    if (cap < CM_FRAME_HDR) return cm_errf(err, errlen, CM_ERANGE, "refusal buffer too small");
    int rc = cm_msg_encode(&m, out + CM_FRAME_HDR, cap - CM_FRAME_HDR, &n, err, errlen);
    if (rc) return rc;
    const cm_frame_hdr h = {(uint8_t)version, CM_MSG_ERROR, 0, 0, (uint32_t)n};
    cm_frame_hdr_encode(&h, out);
    *len = CM_FRAME_HDR + n;
    return 0;
}

void cm_chan_init(cm_chan *s) {
    if (sodium_init() < 0) CM_ASSERT(!"libsodium failed to initialise");
    memset(s, 0, sizeof *s);
    s->mode = CM_SEC_INSECURE;
}

void cm_chan_wipe(cm_chan *s) { sodium_memzero(s, sizeof *s); }

static uint16_t session_flags(const cm_chan *s) {
    if (!s->established || s->mode == CM_SEC_INSECURE) return 0;
    return s->mode == CM_SEC_ENCRYPT ? (CM_FRAME_F_MAC | CM_FRAME_F_ENC) : CM_FRAME_F_MAC;
}

size_t cm_chan_overhead(const cm_chan *s) {
    return CM_FRAME_HDR + ((session_flags(s) & CM_FRAME_F_MAC) ? CM_FRAME_MAC : 0);
}

static bool is_hs_type(unsigned t) {
    return t == CM_MSG_AUTH_INIT || t == CM_MSG_AUTH_REPLY || t == CM_MSG_AUTH_FINISH;
}

int cm_chan_check_hdr(const cm_chan *s, const cm_frame_hdr *h, char *err, size_t errlen) {
    const char *tn = cm_msg_type_name(h->type);
    if (!s->established && !is_hs_type(h->type) && h->type != CM_MSG_ERROR)
        return cm_errf(err, errlen, CM_EPROTO, "sent a %s frame before the handshake finished", tn);
    if (s->established && is_hs_type(h->type))
        return cm_errf(err, errlen, CM_EPROTO, "sent a %s frame after the handshake", tn);
    uint16_t want = session_flags(s);
    if (want == (CM_FRAME_F_MAC | CM_FRAME_F_ENC) && h->type == CM_MSG_ALLREDUCE && h->flags == CM_FRAME_F_MAC)
        want = CM_FRAME_F_MAC; /* a sender's auth-only partial sums (cm_chan.tx_clear_allreduce) */
    if (h->flags != want) {
        if ((want & CM_FRAME_F_MAC) && !(h->flags & CM_FRAME_F_MAC))
            return cm_errf(err, errlen, CM_EAUTH, "sent an unauthenticated %s frame", tn);
        return cm_errf(err, errlen, CM_EPROTO, "sent a %s frame with flags 0x%x in a %s session (expected 0x%x)", tn,
                       (unsigned)h->flags, cm_sec_mode_name(s->mode), (unsigned)want);
    }
    if (h->seq != s->rx_seq) {
        if (h->seq < s->rx_seq)
            return cm_errf(err, errlen, CM_EAUTH, "sent a replayed %s frame (seq %llu, expected %llu)", tn,
                           (unsigned long long)h->seq, (unsigned long long)s->rx_seq);
        return cm_errf(err, errlen, CM_EAUTH, "sent an out-of-order %s frame (seq %llu, expected %llu)", tn,
                       (unsigned long long)h->seq, (unsigned long long)s->rx_seq);
    }
    return 0;
}

/* Nonce: the 64-bit sequence number, little-endian, then 16 zero bytes. Keys
 * are fresh per connection and per direction, so no (key, nonce) pair repeats. */
static void make_nonce(uint64_t seq, uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES]) {
    memset(nonce, 0, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
    cm_wr_u64(nonce, seq);
}

int cm_frame_seal(cm_chan *s, unsigned type, uint8_t *frame, size_t payload_len, size_t cap, size_t *frame_len,
                  char *err, size_t errlen) {
    if (type == 0 || type >= CM_MSG_COUNT)
        return cm_errf(err, errlen, CM_EINVAL, "cannot send a frame of unknown type %u", type);
    if (payload_len > k_types[type].max)
        return cm_errf(err, errlen, CM_ERANGE, "%s payload of %zu bytes exceeds the maximum of %u", k_types[type].name,
                       payload_len, (unsigned)k_types[type].max);
    if (!s->established && !is_hs_type(type) && type != CM_MSG_ERROR)
        return cm_errf(err, errlen, CM_ESTATE, "cannot send %s before the handshake finished", k_types[type].name);
    if (s->established && is_hs_type(type))
        return cm_errf(err, errlen, CM_ESTATE, "cannot send %s after the handshake", k_types[type].name);
    if (s->tx_seq == UINT64_MAX) return cm_errf(err, errlen, CM_ESTATE, "sequence numbers exhausted; reconnect");
    size_t total = cm_chan_overhead(s) + payload_len;
    if (total > cap) return cm_errf(err, errlen, CM_ERANGE, "frame buffer of %zu bytes too small for %zu", cap, total);
    uint16_t flags = session_flags(s);
    if (s->tx_clear_allreduce && type == CM_MSG_ALLREDUCE && flags == (CM_FRAME_F_MAC | CM_FRAME_F_ENC))
        flags = CM_FRAME_F_MAC; /* auth-only (a loopback link's partial sums) */
    cm_frame_hdr h = {CM_PROTO_VERSION, (uint8_t)type, flags, s->tx_seq, (uint32_t)payload_len};
    cm_frame_hdr_encode(&h, frame);
    uint8_t *payload = frame + CM_FRAME_HDR, *mac = payload + payload_len;
    if (h.flags & CM_FRAME_F_MAC) {
        uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
        make_nonce(h.seq, nonce);
        unsigned long long maclen = 0;
        if (h.flags & CM_FRAME_F_ENC) /* AAD: the header; ciphertext replaces the payload */
            crypto_aead_xchacha20poly1305_ietf_encrypt_detached(payload, mac, &maclen, payload, payload_len, frame,
                                                                CM_FRAME_HDR, NULL, nonce, s->tx_key);
        else /* auth-only: empty plaintext (the pointer is a placeholder), AAD = header || payload */
            crypto_aead_xchacha20poly1305_ietf_encrypt_detached(payload, mac, &maclen, payload, 0, frame,
                                                                CM_FRAME_HDR + payload_len, NULL, nonce, s->tx_key);
        CM_ASSERT(maclen == CM_FRAME_MAC);
    }
    s->tx_seq++;
    *frame_len = total;
    return 0;
}

int cm_frame_open(cm_chan *s, uint8_t *frame, size_t n, cm_frame_hdr *h, uint8_t **payload, char *err, size_t errlen) {
    int rc = cm_frame_hdr_decode(frame, n, h, err, errlen);
    if (rc) return rc;
    rc = cm_chan_check_hdr(s, h, err, errlen);
    if (rc) return rc;
    size_t want = CM_FRAME_HDR + (size_t)h->len + ((h->flags & CM_FRAME_F_MAC) ? CM_FRAME_MAC : 0);
    if (n != want)
        return cm_errf(err, errlen, CM_EFORMAT, "%s frame of %zu bytes, header says %zu", cm_msg_type_name(h->type), n,
                       want);
    uint8_t *p = frame + CM_FRAME_HDR;
    if (h->flags & CM_FRAME_F_MAC) {
        uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
        make_nonce(h->seq, nonce);
        const uint8_t *mac = p + h->len;
        int bad;
        if (h->flags & CM_FRAME_F_ENC)
            bad = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(p, NULL, p, h->len, mac, frame, CM_FRAME_HDR,
                                                                      nonce, s->rx_key);
        else
            bad = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(p, NULL, p, 0, mac, frame, CM_FRAME_HDR + h->len,
                                                                      nonce, s->rx_key);
        /* libsodium leaves the buffer untouched when verification fails. */
        if (bad)
            return cm_errf(err, errlen, CM_EAUTH,
                           "sent a %s frame with a bad MAC (seq %llu; forged, corrupted, or "
                           "sealed with another key)",
                           cm_msg_type_name(h->type), (unsigned long long)h->seq);
    }
    s->rx_seq++;
    *payload = p;
    return 0;
}
