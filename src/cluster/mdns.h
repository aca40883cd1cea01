/*
 * mdns.h: embedded DNS-SD over multicast DNS (RFC 6762 / RFC 6763) for the
 * service type _cumulo._tcp, with no system daemon. Two halves:
 *
 *  - a pure packet codec (mdns_packet.c) over (const uint8_t *p, size_t n):
 *    bounded, overflow-checked, name compression that cannot loop; fuzzed by
 *    fuzz/fuzz_mdns.c. It never touches a socket or a clock.
 *  - a responder + browser (mdns.c) on every multicast-capable IPv4 interface:
 *    probe (rename "name (2)" on conflict), announce, answer, goodbye; browse
 *    PTR with backoff, resolve SRV/TXT/A, expire by TTL, remove on goodbye.
 *
 * Bytes from the network never abort: they are validated or dropped. The
 * handle is single-threaded: drive it from one thread with cm_mdns_step().
 * NEEDSWORK: IPv6 (ff02::fb) is decoded (AAAA) but not yet sent or joined.
 */
#ifndef CM_MDNS_H
#define CM_MDNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_MDNS_PORT 5353
#define CM_MDNS_GROUP4 "224.0.0.251"
#define CM_MDNS_SERVICE "_cumulo._tcp.local"
#define CM_MDNS_PKT_MAX 9000 /* RFC 6762 §17: never larger than a jumbo frame */
#define CM_MDNS_NAME_WIRE_MAX 255
#define CM_MDNS_LABEL_MAX 63
#define CM_MDNS_MAX_QUESTIONS 32 /* a parsed message keeps at most this many; the rest is ignored */
#define CM_MDNS_MAX_RECORDS 64
#define CM_MDNS_TXT_MAX 512 /* bytes of TXT rdata we store per instance / emit */

/* ------------------------------------------------------------------ codec */

enum cm_mdns_type {
    CM_MDNS_T_A = 1,
    CM_MDNS_T_PTR = 12,
    CM_MDNS_T_TXT = 16,
    CM_MDNS_T_AAAA = 28,
    CM_MDNS_T_SRV = 33,
    CM_MDNS_T_NSEC = 47,
    CM_MDNS_T_ANY = 255,
};
#define CM_MDNS_CLASS_IN 1
#define CM_MDNS_FLAG_QR 0x8000u /* response */
#define CM_MDNS_FLAG_AA 0x0400u
#define CM_MDNS_FLAG_TC 0x0200u

/* A domain name in uncompressed wire form: length-prefixed labels ending with
 * the zero label; len counts every byte including that zero (1..255). Labels
 * may hold any bytes (instance names are UTF-8 and may contain dots). */
typedef struct cm_mdns_name {
    uint8_t len;
    uint8_t b[CM_MDNS_NAME_WIRE_MAX];
} cm_mdns_name;

/* Build a name from an optional raw first label (may contain dots; NULL for
 * none) followed by a dotted ASCII suffix without escapes ("_cumulo._tcp.local").
 * CM_ERANGE when a label is empty or longer than 63 bytes, or the name > 255. */
int cm_mdns_name_make(cm_mdns_name *n, const char *first_label, const char *dotted);
/* Case-insensitive (ASCII) comparison, as DNS requires. */
bool cm_mdns_name_eq(const cm_mdns_name *a, const cm_mdns_name *b);
/* True if n is <one label>.<service>; the label is copied (NUL-terminated) to label. */
bool cm_mdns_name_split_instance(const cm_mdns_name *n, const cm_mdns_name *service, char *label, size_t cap);
/* Printable dotted form; '.' and '\' inside labels and bytes < 0x20 are escaped. */
void cm_mdns_name_text(const cm_mdns_name *n, char *out, size_t cap);

typedef struct cm_mdns_question {
    cm_mdns_name name;
    uint16_t type, klass;
    bool unicast_response; /* QU bit (top bit of class) */
} cm_mdns_question;

enum cm_mdns_section {
    CM_MDNS_SEC_QUESTION,
    CM_MDNS_SEC_ANSWER,
    CM_MDNS_SEC_AUTHORITY,
    CM_MDNS_SEC_ADDITIONAL,
    CM_MDNS_SEC_COUNT
};

/* One resource record. Decoded fields by type: PTR -> target; SRV -> priority,
 * weight, port, target; A -> addr[0..4); AAAA -> addr[0..16). rdata/rdlen always
 * point at the raw rdata: INSIDE the parsed packet after cm_mdns_parse (valid as
 * long as that buffer), or at caller memory when encoding (TXT, other types). */
typedef struct cm_mdns_rr {
    cm_mdns_name name;
    uint16_t type, klass;
    bool cache_flush; /* top bit of class */
    uint32_t ttl;
    uint8_t section; /* enum cm_mdns_section */
    cm_mdns_name target;
    uint16_t priority, weight, port;
    uint8_t addr[16];
    const uint8_t *rdata;
    uint16_t rdlen;
} cm_mdns_rr;

typedef struct cm_mdns_msg {
    uint16_t id, flags;
    uint16_t count[CM_MDNS_SEC_COUNT]; /* as declared in the header */
    size_t nq, nrr;                    /* as kept (capped by the MAX constants) */
    bool capped;                       /* some questions/records were not kept */
    cm_mdns_question q[CM_MDNS_MAX_QUESTIONS];
    cm_mdns_rr rr[CM_MDNS_MAX_RECORDS]; /* sections in order */
} cm_mdns_msg;

/* Parse one DNS message. Any bound violation (truncation, label > 63, name >
 * 255, compression pointer not strictly backwards, more than 64 jumps, rdata
 * overrunning, SRV/A/AAAA rdata of the wrong size) is CM_EFORMAT with a
 * message; nothing is read outside p[0..n). m is ~40 KiB: do not put it on a
 * small stack. Thread-safe (no globals). */
int cm_mdns_parse(const uint8_t *p, size_t n, cm_mdns_msg *m, char *err, size_t errlen);

/* Writer: build a message into a caller buffer, sections in order. Any
 * overflow is sticky and reported by cm_mdns_writer_finish (CM_ENOSPACE).
 * Names are written uncompressed (valid, just longer).
 * NEEDSWORK: name compression on encode would shrink announcements ~40%. */
typedef struct cm_mdns_writer {
    uint8_t *p;
    size_t cap, len;
    uint8_t section;
    bool overflow, order_error;
    uint16_t count[CM_MDNS_SEC_COUNT];
} cm_mdns_writer;
void cm_mdns_writer_init(cm_mdns_writer *w, uint8_t *buf, size_t cap, uint16_t id, uint16_t flags);
void cm_mdns_write_question(cm_mdns_writer *w, const cm_mdns_name *name, uint16_t type, bool unicast_response);
/* Writes rr into the given section (>= the current one). rdata comes from the
 * decoded fields for PTR/SRV/A/AAAA and from rr->rdata/rdlen otherwise. */
void cm_mdns_write_rr(cm_mdns_writer *w, enum cm_mdns_section sec, const cm_mdns_rr *rr);
/* Returns the message length (> 0) or CM_ENOSPACE / CM_EINVAL (sections out of order). */
int cm_mdns_writer_finish(cm_mdns_writer *w);

/* TXT rdata helpers. Append "key=value" as one string (CM_ERANGE if > 255 bytes
 * or it does not fit in cap). Lookup: copies the value of key (case-insensitive,
 * first occurrence) to out and returns its length, CM_ENOENT if absent,
 * CM_EFORMAT if the rdata is malformed; a key without '=' gives "". */
int cm_mdns_txt_add(uint8_t *txt, size_t cap, size_t *len, const char *key, const char *value);
int cm_mdns_txt_get(const uint8_t *txt, size_t n, const char *key, char *out, size_t cap);

/* --------------------------------------------------- responder + browser */

typedef struct cm_mdns cm_mdns;

#define CM_MDNS_TXT_EXTRA_MAX 16
typedef struct cm_mdns_service {
    const char *name;                             /* instance label (UTF-8, 1..63 bytes before renames) */
    uint16_t port;                                /* SRV port */
    const char *node_id;                          /* TXT id=<hex> */
    int proto_version;                            /* TXT v= */
    const char *txt_extra[CM_MDNS_TXT_EXTRA_MAX]; /* more "key=value" strings (caps...) */
    size_t n_txt_extra;
    uint32_t ttl_host;  /* SRV, A; 0 -> 120 s (RFC 6762 §10) */
    uint32_t ttl_other; /* PTR, TXT; 0 -> 4500 s */
} cm_mdns_service;

typedef struct cm_mdns_instance {
    char name[CM_MDNS_LABEL_MAX + 1]; /* instance label */
    char host[256];                   /* SRV target, printable */
    uint16_t port;
    char addr[48]; /* numeric address ("" until resolved) */
    uint8_t txt[CM_MDNS_TXT_MAX];
    size_t txt_len;
    bool has_srv, has_txt;
    char ifname[32]; /* interface it was learned on */
} cm_mdns_instance;

enum cm_mdns_event { CM_MDNS_ADD, CM_MDNS_UPDATE, CM_MDNS_REMOVE, CM_MDNS_EVENT_COUNT };
/* Called from inside cm_mdns_step. ADD once an instance has SRV, TXT and an
 * address; UPDATE when any of them changes; REMOVE on goodbye or TTL expiry
 * (only for instances that were added). inst is valid during the call only. */
typedef void (*cm_mdns_event_fn)(void *ud, enum cm_mdns_event ev, const cm_mdns_instance *inst);

#define CM_MDNS_MAX_INSTANCES 128 /* more distinct instances are ignored (flood bound) */

/* Open the sockets and join 224.0.0.251 on every up, multicast-capable,
 * non-loopback IPv4 interface (or only those in the comma-separated ifaces).
 * Interfaces are listed again every 5 s (new ones joined and announced on).
 * Errors: CM_EIO (socket), CM_ENOENT (no usable interface). */
int cm_mdns_open(cm_mdns **out, const char *ifaces, char *err, size_t errlen);
/* Sends goodbyes if announcing, closes the sockets; NULL is a no-op. */
void cm_mdns_close(cm_mdns *m);

/* Start probing then announcing svc (copied). One service per handle. */
int cm_mdns_announce(cm_mdns *m, const cm_mdns_service *svc, char *err, size_t errlen);
/* Send goodbyes (TTL 0) and stop answering. */
void cm_mdns_withdraw(cm_mdns *m);
/* Current instance label (after renames), "" before cm_mdns_announce. */
const char *cm_mdns_current_name(const cm_mdns *m);
/* True once probing finished and the first announcement went out. */
bool cm_mdns_is_announced(const cm_mdns *m);

/* Start browsing for _cumulo._tcp; fn (may be NULL) receives events. */
int cm_mdns_browse(cm_mdns *m, cm_mdns_event_fn fn, void *ud);
/* Complete instances currently known (ADDed, not yet REMOVEd). */
size_t cm_mdns_instance_count(const cm_mdns *m);
const cm_mdns_instance *cm_mdns_instance_at(const cm_mdns *m, size_t i);

/* Wait up to timeout_ms for packets, handle them, run timers (probes,
 * announcements, queries, expiry). Returns 0 or a negative CM_E* on a socket
 * failure. Call it in a loop. */
int cm_mdns_step(cm_mdns *m, int timeout_ms);

/* Testing and fuzzing without a network: a handle with no socket and one
 * imaginary interface ("test0", 10.0.0.1/24, index 1). cm_mdns_feed handles
 * p[0..n) as if it arrived on test0 from src:sport; what the handle would
 * have sent is kept, the last packet readable with cm_mdns_last_sent. Timers
 * run in cm_mdns_step as usual (it just sleeps instead of polling a socket). */
int cm_mdns_open_detached(cm_mdns **out);
void cm_mdns_feed(cm_mdns *m, const uint8_t *p, size_t n, const uint8_t src[4], uint16_t sport);
size_t cm_mdns_last_sent(const cm_mdns *m, const uint8_t **p);

/* For an event loop (libuv): wait for fd readable or poll_timeout_ms, then call
 * cm_mdns_step(m, 0), which handles what is pending without blocking. */
int cm_mdns_fd(const cm_mdns *m);
int cm_mdns_poll_timeout_ms(const cm_mdns *m);

/* Counters, for tests and `cumulo nodes`. */
typedef struct cm_mdns_stats {
    uint64_t rx, rx_bad, tx, tx_suppressed, conflicts;
} cm_mdns_stats;
void cm_mdns_get_stats(const cm_mdns *m, cm_mdns_stats *s);

#endif
