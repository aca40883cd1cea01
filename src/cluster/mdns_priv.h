/*
 * mdns_priv.h: state shared by the files of the mDNS responder/browser
 * (mdns.c: sockets, interfaces, responder, receive loop; mdns_browse.c: the
 * browser). Private to src/cluster/mdns*.c; everyone else uses mdns.h.
 */
#ifndef CM_MDNS_PRIV_H
#define CM_MDNS_PRIV_H

#include "mdns.h"

#include "base/base.h"
#include "os/os.h"

#define MAX_IFS 16
#define RX_PER_STEP 256 /* packets handled before timers get a turn (flood bound) */
#define QUERY_MAX_MS 60000u
#define UNICAST_RATE 20.0 /* replies per second, burst 2x */
#define RESCAN_MS 5000u   /* interfaces come and go (Thunderbolt bridge, DHCP) */

enum { R_PTR, R_SRV, R_TXT, R_A, R_ENUM, R_COUNT };
enum { RS_IDLE, RS_WAIT, RS_PROBING, RS_ANNOUNCING, RS_RUNNING };

typedef struct mif {
    char name[32];
    unsigned index;
    uint8_t addr[4], mask[4];
    uint64_t last_mcast[R_COUNT]; /* ms, per-record rate limit (RFC 6762 §6) */
} mif;

typedef struct inst {
    cm_mdns_instance pub;
    bool used, added, changed;
    cm_mdns_name name, target;
    uint64_t ptr_rx, ptr_exp, srv_exp, txt_exp, a_exp; /* ms; 0 = not known */
    uint32_t ptr_ttl;
    uint64_t next_resolve, refresh_at;
    int tries;
    uint8_t src[4]; /* who announced it (the packet's source address) */
} inst;

struct cm_mdns {
    int fd;
    bool detached;
    char ifaces[256]; /* interface filter, "" = all */
    uint64_t next_scan;
    size_t sent_len;
    mif ifs[MAX_IFS];
    int nifs;
    cm_rng rng;
    cm_mdns_stats st;
    uint8_t rx[CM_MDNS_PKT_MAX], tx[CM_MDNS_PKT_MAX], sent[CM_MDNS_PKT_MAX];
    cm_mdns_msg msg;
    /* responder */
    int rstate, probe_n, announce_n, renames;
    uint64_t next_tx, defend_at;
    int defends;
    char base[CM_MDNS_LABEL_MAX + 1], label[CM_MDNS_LABEL_MAX + 1], host[CM_MDNS_LABEL_MAX + 1];
    cm_mdns_name svc, enum_name, inst_name, host_name;
    uint16_t port;
    uint8_t txt[CM_MDNS_TXT_MAX];
    size_t txt_len;
    uint32_t ttl_host, ttl_other;
    double tokens;
    uint64_t tokens_at;
    /* browser */
    bool browsing;
    cm_mdns_event_fn fn;
    void *ud;
    uint64_t next_query, query_ms;
    inst insts[CM_MDNS_MAX_INSTANCES];
};

static inline uint64_t now_ms(void) { return cm_now_ns() / 1000000u; }
static inline uint64_t rand_ms(cm_mdns *m, unsigned lo, unsigned hi) {
    return lo + cm_rng_next(&m->rng) % (uint64_t)(hi - lo + 1);
}
/* mdns.c */
void cm_mdns_send_mcast(cm_mdns *m, const mif *f, int len);
/* mdns_browse.c */
/* src: the packet's IPv4 source. One source holds at most
 * MDNS_MAX_PER_SOURCE instances: a flood of fake services from one host
 * evicts only its own entries, never another host's. */
#define MDNS_MAX_PER_SOURCE 8
void cm_mdns_browse_response(cm_mdns *m, const cm_mdns_msg *msg, const mif *f, const uint8_t src[4]);
void cm_mdns_browser_timer(cm_mdns *m, uint64_t t);

#endif
