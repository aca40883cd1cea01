/*
 * net: TCP connections between cumulo nodes — connect/listen/accept on IPv4 and
 * IPv6, the authenticated handshake (proto's cm_hs_* driven over a socket), and
 * whole frames sent and received with a deadline on every wait. It moves bytes
 * and messages; it knows nothing of tensors or plans. Also the cluster key file.
 *
 * Blocking with deadlines: every call that waits takes a timeout in
 * milliseconds (> 0) and returns CM_ETIMEDOUT when it runs out; sockets are
 * non-blocking underneath and waits are poll(). A connection that saw a
 * protocol, authentication or mid-frame error is FAILED: every later call
 * returns CM_ESTATE and only cm_conn_close() remains. Refusals are logged
 * (CM_LOGW) with the peer's address and returned in err.
 *
 * Threads: one thread may send while another receives on the same
 * connection; two concurrent senders (or receivers) need the caller's lock.
 */
#ifndef CM_NET_H
#define CM_NET_H

#include "proto/proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_NET_DEFAULT_PORT 7070
#define CM_NET_HANDSHAKE_MS 5000

/* How this node talks to peers. key is ignored in CM_SEC_INSECURE mode. */
typedef struct cm_net_cfg {
    cm_sec_mode mode;
    uint8_t key[CM_KEY_BYTES];
    int handshake_ms; /* whole-handshake deadline; 0 = CM_NET_HANDSHAKE_MS */
    /* A send gives up (CM_ETIMEDOUT, the connection FAILED) when the peer
     * takes no byte for this long, whatever the call's own deadline: a frozen
     * peer with full socket buffers is noticed within it, while a big
     * transfer that keeps moving may take as long as its deadline allows.
     * 0 = only the call's deadline. Connections take it at their handshake. */
    int send_stall_ms;
} cm_net_cfg;

/* Split "host:port", "[v6addr]:port", "v6addr" or "host" (port = default_port).
 * Errors: CM_EINVAL with a message naming s. */
int cm_net_parse_addr(const char *s, uint16_t default_port, char *host, size_t hostcap, uint16_t *port, char *err,
                      size_t errlen);

typedef struct cm_conn cm_conn;
typedef struct cm_listener cm_listener;

/* ---- a second transport (the link seam, docs/DESIGN.md "Transports") ----
 * A provider claims one host name (MPI claims "mpi": "mpi:3" is rank 3).
 * cm_net_connect and cm_net_listen with that host ask it for a connected,
 * or listening, local stream socket instead of TCP; everything above (frames,
 * handshake, deadlines, the cluster code) is the same over either. port is
 * the provider's own number (a rank). NULL: TCP only (the default). Set once,
 * before any thread dials or listens. */
typedef struct cm_net_transport {
    const char *host;
    int (*connect)(void *ctx, uint16_t port, int timeout_ms, int *fd, char *err, size_t errlen);
    int (*listen)(void *ctx, uint16_t port, int *fd, uint16_t *bound, char *err, size_t errlen);
    void *ctx;
} cm_net_transport;
void cm_net_set_transport(const cm_net_transport *t);

/* ---- listening ---- */
/* Listen on host:port (host NULL, "" or "*": every IPv6 and IPv4 address;
 * port 0: a free port, see cm_listener_port). */
int cm_net_listen(const char *host, uint16_t port, cm_listener **out, char *err, size_t errlen);
uint16_t cm_listener_port(const cm_listener *l);
int cm_listener_fd(const cm_listener *l); /* for callers that poll several sockets */
/* Wait up to timeout_ms for a peer; the new connection still needs its handshake. */
int cm_listener_accept(cm_listener *l, int timeout_ms, cm_conn **out, char *err, size_t errlen);
void cm_listener_close(cm_listener *l); /* NULL is a no-op */

/* ---- connections ---- */
enum cm_conn_state {
    CM_CONN_NEW,    /* TCP is up, nothing exchanged */
    CM_CONN_READY,  /* handshake done: keys proven, HELLOs exchanged */
    CM_CONN_FAILED, /* an error left the stream unusable */
    CM_CONN_CLOSED, /* the peer closed or said BYE */
    CM_CONN_STATE_COUNT
};

/* TCP connect to host:port (names resolved with getaddrinfo; every address is
 * tried until one answers) within timeout_ms. Sets TCP_NODELAY. */
int cm_net_connect(const char *host, uint16_t port, int timeout_ms, cm_conn **out, char *err, size_t errlen);

/* Run the handshake (initiator: the side that connected) and exchange HELLOs:
 * on success the connection is READY and *peer (may be NULL) holds the peer's
 * HELLO. Errors: CM_EAUTH (the peer lacks the key, or a --insecure mismatch),
 * CM_EUNSUPPORTED (protocol version), CM_EPROTO, CM_ETIMEDOUT, CM_ECLOSED. */
int cm_conn_handshake(cm_conn *c, bool initiator, const cm_net_cfg *cfg, const cm_msg_hello *mine, cm_msg_hello *peer,
                      char *err, size_t errlen);

/* Encode, seal and send one message within timeout_ms (and within the
 * connection's send stall bound, see cm_net_cfg.send_stall_ms). */
int cm_conn_send(cm_conn *c, const cm_msg *m, int timeout_ms, char *err, size_t errlen);
/* Send an already-encoded payload of the given type. */
int cm_conn_send_payload(cm_conn *c, unsigned type, const uint8_t *payload, size_t n, int timeout_ms, char *err,
                         size_t errlen);

/* The same without a copy of the payload: cm_conn_tx_payload returns room
 * for n payload bytes inside c's own frame buffer (NULL when out of memory);
 * the caller writes the payload there and cm_conn_send_tx seals and sends
 * those n bytes (CM_EINVAL when fewer were prepared). Nothing else may send
 * on c in between (the sender's thread owns the buffer, as for every send). */
uint8_t *cm_conn_tx_payload(cm_conn *c, size_t n);
int cm_conn_send_tx(cm_conn *c, unsigned type, size_t n, int timeout_ms, char *err, size_t errlen);

/* Receive, open and decode one message within timeout_ms. Views inside *m (FORWARD
 * data, chunks) point into the connection's buffer and stay valid until the next
 * receive on c. A timeout before the first byte of a frame leaves c usable; a
 * peer that stalls mid-frame fails it. A BYE is returned as a message and marks
 * c CLOSED. CM_ECLOSED when the peer closed the connection. */
int cm_conn_recv(cm_conn *c, cm_msg *m, int timeout_ms, char *err, size_t errlen);
/* The same without decoding: *type, and *payload and *n valid until the next receive. */
int cm_conn_recv_payload(cm_conn *c, unsigned *type, const uint8_t **payload, size_t *n, int timeout_ms, char *err,
                         size_t errlen);

/* Send a BYE with reason (best effort, short deadline) and close. NULL is a no-op. */
void cm_conn_close(cm_conn *c, const char *reason);

/* The no-progress bound of sends on c (ms, 0 = none); set before other
 * threads use c (the handshake sets it from cm_net_cfg.send_stall_ms). */
void cm_conn_set_send_stall(cm_conn *c, int ms);
/* Receives on c that find no bytes poll the socket for up to us microseconds
 * (pausing the CPU between tries; after the first 50 µs also yielding it on
 * each try) before they sleep in poll(): on a loopback
 * or Thunderbolt-class link the reply is microseconds away and a sleep costs
 * a scheduler wake-up (tens to hundreds of µs in a VM). 0 (the default): sleep
 * at once. Set it before another thread receives on c. */
void cm_conn_set_spin(cm_conn *c, int us);
/* CPU time spent so far sealing frames sent on c and opening frames received
 * (nanoseconds; the cipher and MAC, or only the MAC, per the mode). Each
 * counter is written by its direction's thread only: read it there. */
void cm_conn_cipher_ns(const cm_conn *c, uint64_t *seal_ns, uint64_t *open_ns);
/* The peer is this machine: 127.0.0.0/8, ::1, or a local (transport) socket. */
bool cm_conn_is_loopback(const cm_conn *c);
/* Seal this connection's ALLREDUCE frames auth-only (MAC, payload in the
 * clear; every other frame stays encrypted) when on and the peer is on IP
 * loopback (127.0.0.0/8, ::1: not a transport's local socket) in an encrypted
 * session; returns whether it now does. Call it from the sending thread,
 * between frames. Receivers of encrypted sessions accept both forms of
 * ALLREDUCE (proto.h cm_chan). */
bool cm_conn_set_clear_allreduce(cm_conn *c, bool on);

const char *cm_conn_peer(const cm_conn *c); /* "127.0.0.1:7070" / "[::1]:7070" */
/* The peer's address without the port ("127.0.0.1", "::1"), into out. */
void cm_conn_peer_host(const cm_conn *c, char *out, size_t cap);
enum cm_conn_state cm_conn_state(const cm_conn *c);
cm_sec_mode cm_conn_mode(const cm_conn *c);
int cm_conn_fd(const cm_conn *c);

/* Traffic of a connection so far: whole frames as they crossed the wire
 * (header + payload + MAC) and their count, each way, for one message type
 * (0 = all types). Safe from any thread (a relaxed snapshot). */
typedef struct cm_conn_stats {
    uint64_t tx_bytes, tx_frames, rx_bytes, rx_frames;
} cm_conn_stats;
void cm_conn_get_stats(const cm_conn *c, unsigned type, cm_conn_stats *st);

/* For tests of hostile peers: seal a frame with c's session (advancing its
 * send sequence) into out (cap bytes) without sending it, and write raw bytes. */
int cm_conn_seal_raw(cm_conn *c, unsigned type, const uint8_t *payload, size_t n, uint8_t *out, size_t cap, size_t *len,
                     char *err, size_t errlen);
int cm_conn_write_raw(cm_conn *c, const void *p, size_t n, int timeout_ms, char *err, size_t errlen);

/* ---- the cluster key file ----
 * 64 hex digits and a newline, mode 0600. Default path: $CUMULO_KEY_FILE, else
 * $HOME/.config/cumulo/cluster.key, so every process of a user shares it. */
int cm_net_key_default_path(char *out, size_t cap, char *err, size_t errlen);
int cm_net_key_load(const char *path, uint8_t key[CM_KEY_BYTES], char *err, size_t errlen);
/* Write atomically with mode 0600, creating the parent directory (0700). */
int cm_net_key_save(const char *path, const uint8_t key[CM_KEY_BYTES], char *err, size_t errlen);
void cm_net_key_generate(uint8_t key[CM_KEY_BYTES]);
/* Parse 64 hex digits (surrounding whitespace allowed). */
int cm_net_key_parse(const char *hex, uint8_t key[CM_KEY_BYTES], char *err, size_t errlen);
/* A short public name for a key (16 hex digits of a hash), safe to print and
 * compare between machines; it reveals nothing about the key. */
void cm_net_key_fingerprint(const uint8_t key[CM_KEY_BYTES], char out[17]);

#endif
