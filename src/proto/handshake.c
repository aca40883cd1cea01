/*
 * handshake.c: the mutual proof of the cluster key and the derivation of the
 * per-connection traffic keys (docs/PROTOCOL.md, "Handshake"). Pure: payloads
 * in, payloads out; the only outside input is randomness from libsodium.
 * Must never put the cluster key, or anything from which it could be
 * computed without the key, into a payload; must never install keys when a
 * proof failed; secrets are wiped when the handshake ends.
 */
#include "proto.h"

#include "base/base.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#define KDF_CTX "cumulohs" /* crypto_kdf context: exactly 8 bytes */
enum { SUB_C2S = 1, SUB_S2C = 2, SUB_PROOF_S = 3, SUB_PROOF_C = 4 };
static const char k_th_label[] = "cumulo handshake v1";

int cm_hs_init(cm_hs *hs, bool initiator, cm_sec_mode mode, const uint8_t *key, char *err, size_t errlen) {
    memset(hs, 0, sizeof *hs);
    if (sodium_init() < 0) return cm_errf(err, errlen, CM_EIO, "cannot initialise libsodium");
    if ((unsigned)mode >= CM_SEC_COUNT) return cm_errf(err, errlen, CM_EINVAL, "unknown security mode %d", (int)mode);
    if (mode != CM_SEC_INSECURE && !key)
        return cm_errf(err, errlen, CM_EINVAL, "a cluster key is needed (or --insecure)");
    hs->initiator = initiator;
    hs->mode = mode;
    if (key) memcpy(hs->key, key, CM_KEY_BYTES);
    randombytes_buf(hs->nonce, sizeof hs->nonce);
    randombytes_buf(hs->esk, sizeof hs->esk);
    crypto_scalarmult_base(hs->epk, hs->esk);
    return 0;
}

void cm_hs_wipe(cm_hs *hs) { sodium_memzero(hs, sizeof *hs); }

/* version u16, mode u8, reserved u8, nonce[32], epk[32] */
static void put_core(const cm_hs *hs, uint8_t out[CM_HS_INIT_BYTES]) {
    cm_wr_u16(out, CM_PROTO_VERSION);
    out[2] = (uint8_t)hs->mode;
    out[3] = 0;
    memcpy(out + 4, hs->nonce, 32);
    memcpy(out + 36, hs->epk, 32);
}

static const char *mode_words(unsigned m) {
    return m == CM_SEC_INSECURE ? "runs --insecure"
           : m == CM_SEC_AUTH   ? "uses auth-only frames"
                                : "requires the cluster key and encrypted frames";
}

void cm_proto_mismatch_text(char *out, size_t cap, unsigned this_v, unsigned that_v) {
    snprintf(out, cap,
             "protocol version mismatch: that node runs cumulo protocol %u, this node protocol %u: update cumulo "
             "on %s (every node of a cluster must speak the same protocol version)",
             that_v, this_v, this_v < that_v ? "this node" : "that node");
}

/* Checks the version and mode of a peer's INIT/REPLY core. The messages may be
 * relayed to the peer in an ERROR frame, so they name the two sides by role
 * (connecting / listening), never as "this node" and "the peer". */
static int check_core(const cm_hs *hs, const uint8_t *p, char *err, size_t errlen) {
    unsigned v = cm_rd_u16(p), mode = p[2];
    const char *me = hs->initiator ? "the connecting node" : "the listening node";
    if (v != CM_PROTO_VERSION)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "protocol version %u is not supported (%s speaks version %d)", v,
                       me, CM_PROTO_VERSION);
    if (mode >= CM_SEC_COUNT || p[3] != 0)
        return cm_errf(err, errlen, CM_EFORMAT, "handshake with unknown security mode %u", mode);
    if (mode != (unsigned)hs->mode) {
        unsigned conn = hs->initiator ? (unsigned)hs->mode : mode;
        unsigned lis = hs->initiator ? mode : (unsigned)hs->mode;
        return cm_errf(err, errlen, CM_EAUTH,
                       "security mismatch: the connecting node %s, the listening node %s (both "
                       "sides must agree)",
                       mode_words(conn), mode_words(lis));
    }
    return 0;
}

/* th = BLAKE2b-256(label || init || reply-core); prk = BLAKE2b-256_K(th || X25519);
 * subkey i = crypto_kdf(prk, i, "cumulohs"); proof = BLAKE2b-256_{subkey}(th). */
static int derive(cm_hs *hs, const uint8_t peer_epk[32], char *err, size_t errlen) {
    uint8_t th[32], shared[32], prk[32], sub[32];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof th);
    crypto_generichash_update(&st, (const uint8_t *)k_th_label, sizeof k_th_label - 1);
    crypto_generichash_update(&st, hs->init, sizeof hs->init);
    crypto_generichash_update(&st, hs->reply, sizeof hs->reply);
    crypto_generichash_final(&st, th, sizeof th);
    if (crypto_scalarmult(shared, hs->esk, peer_epk) != 0)
        return cm_errf(err, errlen, CM_EAUTH, "handshake with an invalid ephemeral key");
    crypto_generichash_init(&st, hs->key, CM_KEY_BYTES, sizeof prk);
    crypto_generichash_update(&st, th, sizeof th);
    crypto_generichash_update(&st, shared, sizeof shared);
    crypto_generichash_final(&st, prk, sizeof prk);
    crypto_kdf_derive_from_key(hs->k_c2s, 32, SUB_C2S, KDF_CTX, prk);
    crypto_kdf_derive_from_key(hs->k_s2c, 32, SUB_S2C, KDF_CTX, prk);
    crypto_kdf_derive_from_key(sub, 32, SUB_PROOF_S, KDF_CTX, prk);
    crypto_generichash(hs->proof_s, 32, th, sizeof th, sub, sizeof sub);
    crypto_kdf_derive_from_key(sub, 32, SUB_PROOF_C, KDF_CTX, prk);
    crypto_generichash(hs->proof_c, 32, th, sizeof th, sub, sizeof sub);
    sodium_memzero(shared, sizeof shared);
    sodium_memzero(prk, sizeof prk);
    sodium_memzero(sub, sizeof sub);
    hs->keys_ready = true;
    return 0;
}

static int need(size_t cap, size_t n, size_t *len, char *err, size_t errlen) {
    if (cap < n) return cm_errf(err, errlen, CM_ERANGE, "handshake buffer too small");
    *len = n;
    return 0;
}

int cm_hs_write_init(cm_hs *hs, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen) {
    if (!hs->initiator || hs->step != 0) return cm_errf(err, errlen, CM_ESTATE, "handshake: AUTH_INIT out of turn");
    int rc = need(cap, CM_HS_INIT_BYTES, len, err, errlen);
    if (rc) return rc;
    put_core(hs, hs->init);
    memcpy(out, hs->init, CM_HS_INIT_BYTES);
    hs->step = 1;
    return 0;
}

int cm_hs_read_init(cm_hs *hs, const uint8_t *p, size_t n, char *err, size_t errlen) {
    if (hs->initiator || hs->step != 0) return cm_errf(err, errlen, CM_EPROTO, "sent AUTH_INIT out of turn");
    if (n != CM_HS_INIT_BYTES)
        return cm_errf(err, errlen, CM_EFORMAT, "AUTH_INIT of %zu bytes (expected %d)", n, CM_HS_INIT_BYTES);
    int rc = check_core(hs, p, err, errlen);
    if (rc) return rc;
    memcpy(hs->init, p, CM_HS_INIT_BYTES);
    hs->step = 1;
    return 0;
}

int cm_hs_write_reply(cm_hs *hs, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen) {
    if (hs->initiator || hs->step != 1) return cm_errf(err, errlen, CM_ESTATE, "handshake: AUTH_REPLY out of turn");
    int rc = need(cap, CM_HS_REPLY_BYTES, len, err, errlen);
    if (rc) return rc;
    put_core(hs, hs->reply);
    if (hs->mode != CM_SEC_INSECURE) {
        rc = derive(hs, hs->init + 36, err, errlen);
        if (rc) return rc;
    }
    memcpy(out, hs->reply, CM_HS_INIT_BYTES);
    if (hs->keys_ready) memcpy(out + CM_HS_INIT_BYTES, hs->proof_s, 32);
    else memset(out + CM_HS_INIT_BYTES, 0, 32);
    hs->step = 2;
    return 0;
}

int cm_hs_read_reply(cm_hs *hs, const uint8_t *p, size_t n, char *err, size_t errlen) {
    if (!hs->initiator || hs->step != 1) return cm_errf(err, errlen, CM_EPROTO, "sent AUTH_REPLY out of turn");
    if (n != CM_HS_REPLY_BYTES)
        return cm_errf(err, errlen, CM_EFORMAT, "AUTH_REPLY of %zu bytes (expected %d)", n, CM_HS_REPLY_BYTES);
    int rc = check_core(hs, p, err, errlen);
    if (rc) return rc;
    memcpy(hs->reply, p, CM_HS_INIT_BYTES);
    hs->step = 2;
    if (hs->mode == CM_SEC_INSECURE) return 0;
    rc = derive(hs, p + 36, err, errlen);
    if (rc) return rc;
    if (sodium_memcmp(hs->proof_s, p + CM_HS_INIT_BYTES, 32) != 0)
        return cm_errf(err, errlen, CM_EAUTH,
                       "the peer does not know this cluster's key (its proof is wrong; check "
                       "that both nodes use the same key file)");
    hs->peer_ok = true;
    return 0;
}

int cm_hs_write_finish(cm_hs *hs, uint8_t *out, size_t cap, size_t *len, char *err, size_t errlen) {
    if (!hs->initiator || hs->step != 2 || !hs->keys_ready)
        return cm_errf(err, errlen, CM_ESTATE, "handshake: AUTH_FINISH out of turn");
    int rc = need(cap, CM_HS_FINISH_BYTES, len, err, errlen);
    if (rc) return rc;
    memcpy(out, hs->proof_c, 32);
    hs->step = 3;
    return 0;
}

int cm_hs_read_finish(cm_hs *hs, const uint8_t *p, size_t n, char *err, size_t errlen) {
    if (hs->initiator || hs->step != 2 || !hs->keys_ready)
        return cm_errf(err, errlen, CM_EPROTO, "sent AUTH_FINISH out of turn");
    if (n != CM_HS_FINISH_BYTES)
        return cm_errf(err, errlen, CM_EFORMAT, "AUTH_FINISH of %zu bytes (expected %d)", n, CM_HS_FINISH_BYTES);
    if (sodium_memcmp(hs->proof_c, p, 32) != 0)
        return cm_errf(err, errlen, CM_EAUTH,
                       "the peer does not know this cluster's key (its proof is wrong; check "
                       "that both nodes use the same key file)");
    hs->step = 3;
    hs->peer_ok = true;
    return 0;
}

int cm_hs_finish(cm_hs *hs, cm_chan *s, char *err, size_t errlen) {
    bool done = hs->mode == CM_SEC_INSECURE ? hs->step >= 2 : (hs->step == 3 && hs->keys_ready && hs->peer_ok);
    if (!done) {
        cm_hs_wipe(hs);
        return cm_errf(err, errlen, CM_ESTATE, "handshake not complete");
    }
    s->mode = hs->mode;
    if (hs->mode != CM_SEC_INSECURE) {
        memcpy(s->tx_key, hs->initiator ? hs->k_c2s : hs->k_s2c, 32);
        memcpy(s->rx_key, hs->initiator ? hs->k_s2c : hs->k_c2s, 32);
    }
    s->established = true;
    cm_hs_wipe(hs);
    return 0;
}
