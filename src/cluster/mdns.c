/*
 * mdns.c: the mDNS handle for _cumulo._tcp (RFC 6762, RFC 6763): one UDP
 * socket bound to 5353, joined to 224.0.0.251 on every multicast-capable IPv4
 * interface (rescanned every 5 s), the receive loop and timers, and the
 * responder: probe (3 x 250 ms, tie-break, rename "name (2)"), announce (3
 * times, 1 s then 2 s apart), answer queries (known-answer suppression,
 * per-record multicast limit, token bucket for unicast), defend an
 * established name, goodbye. The browser lives in mdns_browse.c.
 * Packet bytes are parsed only by cm_mdns_parse; nothing here may abort on them.
 * Single-threaded: all state is touched from cm_mdns_step's caller.
 */
#include "mdns_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t k_group[4] = {224, 0, 0, 251};

/* ------------------------------------------------------------ open/close */

static bool iface_wanted(const char *list, const char *name) {
    if (!list || !*list) return true;
    size_t nl = strlen(name);
    for (const char *s = list; *s;) {
        const char *c = strchr(s, ',');
        size_t l = c ? (size_t)(c - s) : strlen(s);
        if (l == nl && !memcmp(s, name, l)) return true;
        s += l + (c ? 1 : 0);
    }
    return false;
}

/* (Re)list interfaces: join new ones, follow address changes, forget vanished
 * ones. Returns how many were added or changed. */
static int scan_ifaces(cm_mdns *m) {
    cm_netif all[64];
    int n = cm_netif_list(all, 64), changed = 0;
    if (n < 0) return 0;
    bool seen[MAX_IFS] = {false};
    for (int i = 0; i < n; i++) {
        cm_netif *f = &all[i];
        const char *want = m->ifaces[0] ? m->ifaces : NULL;
        /* a named interface is used as it is (lo for one-machine clusters);
         * by default only multicast-capable, non-loopback ones */
        if (!f->up || (want && !iface_wanted(want, f->name))) continue;
        if (!want && (f->loopback || !f->multicast)) continue;
        int k = 0;
        while (k < m->nifs && m->ifs[k].index != f->index) k++;
        if (k < m->nifs) { /* known: one address per interface, first one wins */
            if (seen[k]) continue;
            seen[k] = true;
            if (memcmp(m->ifs[k].addr, f->ipv4, 4)) {
                cm_mcast4_leave(m->fd, k_group, m->ifs[k].addr, m->ifs[k].index);
                cm_mcast4_join(m->fd, k_group, f->ipv4, f->index);
                memcpy(m->ifs[k].addr, f->ipv4, 4);
                memcpy(m->ifs[k].mask, f->mask4, 4);
                changed++;
            }
            continue;
        }
        if (m->nifs >= MAX_IFS || cm_mcast4_join(m->fd, k_group, f->ipv4, f->index) != 0) continue;
        mif *d = &m->ifs[m->nifs];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", f->name);
        d->index = f->index;
        memcpy(d->addr, f->ipv4, 4);
        memcpy(d->mask, f->mask4, 4);
        seen[m->nifs++] = true;
        changed++;
    }
    for (int k = m->nifs - 1; k >= 0; k--) /* vanished (down, renamed, no address) */
        if (!seen[k]) {
            m->ifs[k] = m->ifs[m->nifs - 1];
            seen[k] = seen[m->nifs - 1];
            m->nifs--;
        }
    return changed;
}

int cm_mdns_open(cm_mdns **out, const char *ifaces, char *err, size_t errlen) {
    *out = NULL;
    if (ifaces && strlen(ifaces) >= sizeof(((cm_mdns *)0)->ifaces))
        return cm_errf(err, errlen, CM_EINVAL, "interface list too long");
    cm_mdns *m = cm_calloc(1, sizeof *m);
    if (!m) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    cm_rng_seed(&m->rng, cm_now_ns() ^ ((uint64_t)(uintptr_t)m << 16));
    cm_mdns_name_make(&m->svc, NULL, CM_MDNS_SERVICE);
    cm_mdns_name_make(&m->enum_name, NULL, "_services._dns-sd._udp.local");
    snprintf(m->ifaces, sizeof m->ifaces, "%s", ifaces ? ifaces : "");
    m->fd = cm_mcast4_open(CM_MDNS_PORT, err, errlen);
    if (m->fd < 0) {
        int rc = m->fd;
        cm_free(m);
        return rc;
    }
    scan_ifaces(m);
    if (m->nifs == 0) {
        cm_fd_close(m->fd);
        cm_free(m);
        return cm_errf(err, errlen, CM_ENOENT, "no multicast-capable IPv4 interface%s%s", ifaces ? " among " : "",
                       ifaces ? ifaces : "");
    }
    m->tokens = 2 * UNICAST_RATE;
    m->tokens_at = now_ms();
    m->next_scan = now_ms() + RESCAN_MS;
    *out = m;
    return 0;
}

int cm_mdns_open_detached(cm_mdns **out) {
    cm_mdns *m = cm_calloc(1, sizeof *m);
    if (!m) return CM_ENOMEM;
    cm_rng_seed(&m->rng, 42);
    cm_mdns_name_make(&m->svc, NULL, CM_MDNS_SERVICE);
    cm_mdns_name_make(&m->enum_name, NULL, "_services._dns-sd._udp.local");
    m->fd = -1;
    m->detached = true;
    mif *d = &m->ifs[m->nifs++];
    snprintf(d->name, sizeof d->name, "test0");
    d->index = 1;
    memcpy(d->addr, (uint8_t[4]){10, 0, 0, 1}, 4);
    memcpy(d->mask, (uint8_t[4]){255, 255, 255, 0}, 4);
    m->tokens = 2 * UNICAST_RATE;
    m->tokens_at = now_ms();
    *out = m;
    return 0;
}

size_t cm_mdns_last_sent(const cm_mdns *m, const uint8_t **p) {
    *p = m->sent;
    return m->sent_len;
}

void cm_mdns_close(cm_mdns *m) {
    if (!m) return;
    cm_mdns_withdraw(m);
    for (int i = 0; i < m->nifs && !m->detached; i++) cm_mcast4_leave(m->fd, k_group, m->ifs[i].addr, m->ifs[i].index);
    cm_fd_close(m->fd);
    cm_free(m);
}

void cm_mdns_get_stats(const cm_mdns *m, cm_mdns_stats *s) { *s = m->st; }
const char *cm_mdns_current_name(const cm_mdns *m) { return m->label; }
bool cm_mdns_is_announced(const cm_mdns *m) { return m->rstate == RS_ANNOUNCING || m->rstate == RS_RUNNING; }

/* ------------------------------------------------------------ sending */

static bool keep_detached(cm_mdns *m, int len) {
    if (!m->detached) return false;
    memcpy(m->sent, m->tx, (size_t)len);
    m->sent_len = (size_t)len;
    m->st.tx++;
    return true;
}

void cm_mdns_send_mcast(cm_mdns *m, const mif *f, int len) {
    if (len <= 0 || keep_detached(m, len)) return;
    if (cm_udp4_send(m->fd, m->tx, (size_t)len, k_group, CM_MDNS_PORT, f->addr) == 0) m->st.tx++;
}

static void send_unicast(cm_mdns *m, const uint8_t dst[4], uint16_t port, int len) {
    if (len <= 0 || keep_detached(m, len)) return;
    if (cm_udp4_send(m->fd, m->tx, (size_t)len, dst, port, NULL) == 0) m->st.tx++;
}

static mif *iface_of(cm_mdns *m, unsigned ifindex, const uint8_t src[4]) {
    for (int i = 0; i < m->nifs; i++)
        if (ifindex && m->ifs[i].index == ifindex) return &m->ifs[i];
    for (int i = 0; i < m->nifs; i++) { /* unknown index: the interface whose subnet holds src */
        mif *f = &m->ifs[i];
        bool same = true;
        for (int k = 0; k < 4; k++) same &= ((src[k] ^ f->addr[k]) & f->mask[k]) == 0;
        if (same) return f;
    }
    return NULL;
}

static bool is_our_addr(const cm_mdns *m, const uint8_t a[4]) {
    for (int i = 0; i < m->nifs; i++)
        if (!memcmp(m->ifs[i].addr, a, 4)) return true;
    return false;
}

/* ------------------------------------------------------------ responder */

static void our_rr(const cm_mdns *m, int kind, const mif *f, cm_mdns_rr *rr) {
    memset(rr, 0, sizeof *rr);
    rr->klass = CM_MDNS_CLASS_IN;
    switch (kind) {
    case R_PTR:
        rr->name = m->svc;
        rr->type = CM_MDNS_T_PTR;
        rr->target = m->inst_name;
        rr->ttl = m->ttl_other;
        break;
    case R_SRV:
        rr->name = m->inst_name;
        rr->type = CM_MDNS_T_SRV;
        rr->port = m->port;
        rr->target = m->host_name;
        rr->ttl = m->ttl_host;
        rr->cache_flush = true;
        break;
    case R_TXT:
        rr->name = m->inst_name;
        rr->type = CM_MDNS_T_TXT;
        rr->rdata = m->txt;
        rr->rdlen = (uint16_t)m->txt_len;
        rr->ttl = m->ttl_other;
        rr->cache_flush = true;
        break;
    case R_A:
        rr->name = m->host_name;
        rr->type = CM_MDNS_T_A;
        memcpy(rr->addr, f->addr, 4);
        rr->ttl = m->ttl_host;
        rr->cache_flush = true;
        break;
    default:
        rr->name = m->enum_name;
        rr->type = CM_MDNS_T_PTR;
        rr->target = m->svc;
        rr->ttl = m->ttl_other;
        break;
    }
}

static int set_names(cm_mdns *m) {
    int rc = cm_mdns_name_make(&m->inst_name, m->label, CM_MDNS_SERVICE);
    if (!rc) rc = cm_mdns_name_make(&m->host_name, m->host, "local");
    return rc;
}

/* "base (n)", cutting base at a UTF-8 boundary so the label stays <= 63 bytes */
static void rename_instance(cm_mdns *m) {
    char suffix[16];
    m->renames++;
    m->st.conflicts++;
    snprintf(suffix, sizeof suffix, " (%d)", m->renames + 1);
    size_t bl = strlen(m->base), room = CM_MDNS_LABEL_MAX - strlen(suffix);
    if (bl > room) {
        bl = room;
        while (bl > 0 && ((unsigned char)m->base[bl] & 0xC0) == 0x80) bl--;
    }
    snprintf(m->label, sizeof m->label, "%.*s%s", (int)bl, m->base, suffix);
    set_names(m);
    CM_LOGI("mdns: name conflict, renaming to '%s'", m->label);
    m->rstate = RS_WAIT;
    /* RFC 6762 §8.1: after 15 conflicts in a row, probe at most once a second... we wait 5 s */
    m->next_tx = now_ms() + (m->renames > 15 ? 5000 : rand_ms(m, 0, 250));
}

static void rename_host(cm_mdns *m) {
    size_t l = strlen(m->host);
    char *dash = strrchr(m->host, '-');
    int k = 2;
    if (dash && dash != m->host && strchr(m->host, '-') != dash) {
        k = atoi(dash + 1) + 1;
        l = (size_t)(dash - m->host);
    }
    char tmp[CM_MDNS_LABEL_MAX + 1];
    snprintf(tmp, sizeof tmp, "%.*s-%d", (int)CM_MIN(l, 50), m->host, k);
    memcpy(m->host, tmp, sizeof tmp);
    m->st.conflicts++;
    set_names(m);
    m->rstate = RS_WAIT;
    m->next_tx = now_ms() + rand_ms(m, 0, 250);
}

static void send_probe(cm_mdns *m) {
    for (int i = 0; i < m->nifs; i++) {
        cm_mdns_writer w;
        cm_mdns_rr rr;
        cm_mdns_writer_init(&w, m->tx, sizeof m->tx, 0, 0);
        cm_mdns_write_question(&w, &m->inst_name, CM_MDNS_T_ANY, m->probe_n == 0);
        cm_mdns_write_question(&w, &m->host_name, CM_MDNS_T_ANY, m->probe_n == 0);
        int kinds[3] = {R_SRV, R_TXT, R_A};
        for (int k = 0; k < 3; k++) {
            our_rr(m, kinds[k], &m->ifs[i], &rr);
            rr.cache_flush = false; /* authority records of a probe carry no flush bit */
            cm_mdns_write_rr(&w, CM_MDNS_SEC_AUTHORITY, &rr);
        }
        cm_mdns_send_mcast(m, &m->ifs[i], cm_mdns_writer_finish(&w));
    }
}

/* One unsolicited response with every record, on every interface; ttl0 = goodbye. */
static void send_announce(cm_mdns *m, bool ttl0) {
    uint64_t t = now_ms();
    for (int i = 0; i < m->nifs; i++) {
        cm_mdns_writer w;
        cm_mdns_rr rr;
        cm_mdns_writer_init(&w, m->tx, sizeof m->tx, 0, CM_MDNS_FLAG_QR | CM_MDNS_FLAG_AA);
        for (int k = 0; k < R_COUNT; k++) {
            if (ttl0 && k == R_ENUM) continue; /* the type stays; other nodes may offer it */
            our_rr(m, k, &m->ifs[i], &rr);
            if (ttl0) rr.ttl = 0;
            cm_mdns_write_rr(&w, CM_MDNS_SEC_ANSWER, &rr);
            m->ifs[i].last_mcast[k] = t;
        }
        cm_mdns_send_mcast(m, &m->ifs[i], cm_mdns_writer_finish(&w));
    }
}

int cm_mdns_announce(cm_mdns *m, const cm_mdns_service *svc, char *err, size_t errlen) {
    if (m->rstate != RS_IDLE) return cm_errf(err, errlen, CM_ESTATE, "already announcing '%s'", m->label);
    if (!svc->name || !*svc->name || strlen(svc->name) > CM_MDNS_LABEL_MAX)
        return cm_errf(err, errlen, CM_EINVAL, "instance name must be 1..63 bytes");
    if (!svc->node_id || !*svc->node_id) return cm_errf(err, errlen, CM_EINVAL, "node id is required");
    snprintf(m->base, sizeof m->base, "%s", svc->name);
    snprintf(m->label, sizeof m->label, "%s", svc->name);
    /* A host label of our own (cm-<id>) so nodes sharing a hostname, or a
     * machine also running avahi, never fight over "<hostname>.local". */
    char idl[13];
    size_t k = 0;
    for (const char *s = svc->node_id; *s && k < 12; s++)
        if ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')) idl[k++] = *s;
    idl[k] = 0;
    snprintf(m->host, sizeof m->host, "cm-%s", k ? idl : "node");
    if (set_names(m)) return cm_errf(err, errlen, CM_EINVAL, "instance name '%s' is not a valid label", svc->name);
    m->port = svc->port;
    m->ttl_host = svc->ttl_host ? svc->ttl_host : 120;
    m->ttl_other = svc->ttl_other ? svc->ttl_other : 4500;
    m->txt_len = 0;
    char v[16];
    snprintf(v, sizeof v, "%d", svc->proto_version);
    int rc = cm_mdns_txt_add(m->txt, sizeof m->txt, &m->txt_len, "id", svc->node_id);
    if (!rc) rc = cm_mdns_txt_add(m->txt, sizeof m->txt, &m->txt_len, "v", v);
    if (!rc) rc = cm_mdns_txt_add(m->txt, sizeof m->txt, &m->txt_len, "ver", CM_VERSION);
    for (size_t i = 0; !rc && i < svc->n_txt_extra && i < CM_MDNS_TXT_EXTRA_MAX; i++) {
        char key[256];
        const char *kv = svc->txt_extra[i], *eq = strchr(kv, '=');
        size_t kl = eq ? (size_t)(eq - kv) : strlen(kv);
        if (kl == 0 || kl >= sizeof key) {
            rc = CM_EINVAL;
            break;
        }
        memcpy(key, kv, kl);
        key[kl] = 0;
        rc = cm_mdns_txt_add(m->txt, sizeof m->txt, &m->txt_len, key, eq ? eq + 1 : NULL);
    }
    if (rc) return cm_errf(err, errlen, CM_ERANGE, "TXT record too large or malformed (max %d bytes)", CM_MDNS_TXT_MAX);
    m->renames = 0;
    m->rstate = RS_WAIT;
    m->next_tx = now_ms() + rand_ms(m, 0, 250); /* RFC 6762 §8.1 */
    return 0;
}

void cm_mdns_withdraw(cm_mdns *m) {
    if (m->rstate == RS_ANNOUNCING || m->rstate == RS_RUNNING) {
        send_announce(m, true);
        if (!m->detached) cm_sleep_ms(50); /* a second goodbye survives one lost packet */
        send_announce(m, true);
    }
    m->rstate = RS_IDLE;
}

static void responder_timer(cm_mdns *m, uint64_t t) {
    if (m->rstate == RS_IDLE || m->rstate == RS_RUNNING || t < m->next_tx) return;
    if (m->rstate == RS_WAIT) {
        m->rstate = RS_PROBING;
        m->probe_n = 0;
    }
    if (m->rstate == RS_PROBING) {
        if (m->probe_n < 3) {
            send_probe(m);
            m->probe_n++;
            m->next_tx = t + 250;
            return;
        }
        m->rstate = RS_ANNOUNCING;
        m->announce_n = 0;
        CM_LOGI("mdns: announcing '%s' on %d interface(s)", m->label, m->nifs);
    }
    send_announce(m, false);
    m->announce_n++;
    m->next_tx = t + 1000u * (1u << (m->announce_n - 1)); /* 1 s, then doubling (§8.3) */
    if (m->announce_n >= 3) m->rstate = RS_RUNNING;
}

/* Canonical rdata for the §8.2 tie-break (uncompressed, so both sides agree). */
static size_t canon_rdata(const cm_mdns_rr *rr, uint8_t *b, size_t cap) {
    size_t n = 0;
    if (rr->type == CM_MDNS_T_SRV) {
        if (cap < 6 + (size_t)rr->target.len) return 0;
        b[0] = (uint8_t)(rr->priority >> 8);
        b[1] = (uint8_t)rr->priority;
        b[2] = (uint8_t)(rr->weight >> 8);
        b[3] = (uint8_t)rr->weight;
        b[4] = (uint8_t)(rr->port >> 8);
        b[5] = (uint8_t)rr->port;
        memcpy(b + 6, rr->target.b, rr->target.len);
        n = 6 + rr->target.len;
    } else if (rr->type == CM_MDNS_T_A) {
        memcpy(b, rr->addr, 4);
        n = 4;
    } else if (rr->type == CM_MDNS_T_PTR) {
        if (cap < rr->target.len) return 0;
        memcpy(b, rr->target.b, rr->target.len);
        n = rr->target.len;
    } else {
        n = CM_MIN((size_t)rr->rdlen, cap);
        if (n) memcpy(b, rr->rdata, n);
    }
    return n;
}

static int rr_cmp(const cm_mdns_rr *a, const cm_mdns_rr *b) {
    if (a->klass != b->klass) return a->klass < b->klass ? -1 : 1;
    if (a->type != b->type) return a->type < b->type ? -1 : 1;
    uint8_t ba[600], bb[600];
    size_t na = canon_rdata(a, ba, sizeof ba), nb = canon_rdata(b, bb, sizeof bb);
    int c = memcmp(ba, bb, CM_MIN(na, nb));
    if (c) return c < 0 ? -1 : 1;
    return na == nb ? 0 : (na < nb ? -1 : 1);
}

/* Simultaneous probe tie-break (RFC 6762 §8.2) over the instance's records. */
static void probe_tiebreak(cm_mdns *m, const cm_mdns_msg *msg) {
    const cm_mdns_rr *theirs[8];
    size_t nt = 0;
    for (size_t i = 0; i < msg->nrr && nt < 8; i++)
        if (msg->rr[i].section == CM_MDNS_SEC_AUTHORITY && cm_mdns_name_eq(&msg->rr[i].name, &m->inst_name))
            theirs[nt++] = &msg->rr[i];
    if (!nt) return;
    for (size_t i = 1; i < nt; i++) /* insertion sort: nt <= 8 */
        for (size_t j = i; j > 0 && rr_cmp(theirs[j - 1], theirs[j]) > 0; j--) {
            const cm_mdns_rr *x = theirs[j];
            theirs[j] = theirs[j - 1];
            theirs[j - 1] = x;
        }
    cm_mdns_rr ours[2];
    our_rr(m, R_TXT, &m->ifs[0], &ours[0]); /* TXT (16) sorts before SRV (33) */
    our_rr(m, R_SRV, &m->ifs[0], &ours[1]);
    int c = 0;
    for (size_t i = 0; i < CM_MAX(nt, (size_t)2) && c == 0; i++) {
        if (i >= nt) c = 1;
        else if (i >= 2) c = -1;
        else c = rr_cmp(&ours[i], theirs[i]);
    }
    if (c < 0) { /* we lose: wait a second and probe again (§8.2) */
        CM_LOGI("mdns: lost probe tie-break for '%s'; probing again in 1 s", m->label);
        m->rstate = RS_WAIT;
        m->next_tx = now_ms() + 1000;
    }
}

/* An established name is kept by the first comer: re-announce so a newcomer
 * that missed our probe defence renames. If the other side keeps insisting
 * (two established nodes after a partition heals), the §8.2 ordering picks
 * who yields, so exactly one renames. */
static void defend(cm_mdns *m, const cm_mdns_rr *theirs, const cm_mdns_rr *ours) {
    uint64_t t = now_ms();
    if (t - m->defend_at > 30000) m->defends = 0;
    m->defend_at = t;
    m->st.conflicts++;
    if (++m->defends > 3 && rr_cmp(ours, theirs) < 0) {
        m->defends = 0;
        rename_instance(m);
        return;
    }
    if (t - m->ifs[0].last_mcast[R_SRV] >= 1000 || m->nifs == 0) send_announce(m, false);
}

/* A response carrying our names with different data is a conflict (§9). */
static void check_conflict(cm_mdns *m, const cm_mdns_msg *msg) {
    for (size_t i = 0; i < msg->nrr; i++) {
        const cm_mdns_rr *rr = &msg->rr[i];
        if (rr->ttl == 0) continue;
        if (cm_mdns_name_eq(&rr->name, &m->inst_name)) {
            cm_mdns_rr ours;
            if (rr->type == CM_MDNS_T_SRV) our_rr(m, R_SRV, &m->ifs[0], &ours);
            else if (rr->type == CM_MDNS_T_TXT) our_rr(m, R_TXT, &m->ifs[0], &ours);
            else continue;
            if (rr_cmp(rr, &ours) != 0) {
                if (m->rstate == RS_RUNNING) defend(m, rr, &ours);
                else rename_instance(m);
                return;
            }
        } else if (rr->type == CM_MDNS_T_A && cm_mdns_name_eq(&rr->name, &m->host_name) && !is_our_addr(m, rr->addr)) {
            rename_host(m);
            return;
        }
    }
}

static bool known_answer(const cm_mdns_msg *q, const cm_mdns_rr *ours) {
    for (size_t i = 0; i < q->nrr; i++) {
        const cm_mdns_rr *a = &q->rr[i];
        if (a->section == CM_MDNS_SEC_ANSWER && a->ttl >= ours->ttl / 2 && cm_mdns_name_eq(&a->name, &ours->name) &&
            rr_cmp(a, ours) == 0)
            return true;
    }
    return false;
}

static void answer_query(cm_mdns *m, const cm_mdns_msg *q, mif *f, const uint8_t src[4], uint16_t sport) {
    bool want[R_COUNT] = {false}, addl[R_COUNT] = {false}, unicast = false;
    for (size_t i = 0; i < q->nq; i++) {
        const cm_mdns_question *qq = &q->q[i];
        bool any = qq->type == CM_MDNS_T_ANY;
        if (qq->klass != CM_MDNS_CLASS_IN && qq->klass != 255) continue;
        bool hit = false;
        if (cm_mdns_name_eq(&qq->name, &m->svc) && (any || qq->type == CM_MDNS_T_PTR)) {
            want[R_PTR] = hit = true;
            addl[R_SRV] = addl[R_TXT] = addl[R_A] = true; /* RFC 6763 §12.1 */
        }
        if (cm_mdns_name_eq(&qq->name, &m->enum_name) && (any || qq->type == CM_MDNS_T_PTR)) want[R_ENUM] = hit = true;
        if (cm_mdns_name_eq(&qq->name, &m->inst_name)) {
            if (any || qq->type == CM_MDNS_T_SRV) {
                want[R_SRV] = hit = true;
                addl[R_A] = true;
            }
            if (any || qq->type == CM_MDNS_T_TXT) want[R_TXT] = hit = true;
        }
        if (cm_mdns_name_eq(&qq->name, &m->host_name) && (any || qq->type == CM_MDNS_T_A)) want[R_A] = hit = true;
        if (hit && qq->unicast_response) unicast = true;
    }
    bool legacy = sport != CM_MDNS_PORT; /* RFC 6762 §6.7: one-shot resolver */
    bool probe = false;
    for (size_t i = 0; i < q->nrr; i++) probe |= q->rr[i].section == CM_MDNS_SEC_AUTHORITY;
    /* another responder on this host shares port 5353, and a unicast reply
     * reaches only one of the sockets: answer same-host queries by multicast */
    if (unicast && !legacy && is_our_addr(m, src)) unicast = false;
    if (legacy || unicast) {
        uint64_t t = now_ms();
        m->tokens = CM_MIN(2 * UNICAST_RATE, m->tokens + (double)(t - m->tokens_at) * UNICAST_RATE / 1000.0);
        m->tokens_at = t;
    }
    uint64_t t = now_ms();
    cm_mdns_writer w;
    cm_mdns_rr rr;
    cm_mdns_writer_init(&w, m->tx, sizeof m->tx, legacy ? q->id : 0, CM_MDNS_FLAG_QR | CM_MDNS_FLAG_AA);
    if (legacy)
        for (size_t i = 0; i < q->nq; i++) cm_mdns_write_question(&w, &q->q[i].name, q->q[i].type, false);
    int nans = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < R_COUNT; k++) {
            bool in = pass == 0 ? want[k] : (addl[k] && !want[k]);
            if (!in) continue;
            our_rr(m, k, f, &rr);
            if (known_answer(q, &rr)) {
                m->st.tx_suppressed++;
                continue;
            }
            if (!legacy && !unicast && pass == 0) {
                /* §6: once a second per record, four times for probe defence */
                if (t - f->last_mcast[k] < (probe ? 250u : 1000u)) {
                    m->st.tx_suppressed++;
                    continue;
                }
                f->last_mcast[k] = t;
            }
            if (legacy) {
                rr.cache_flush = false;
                rr.ttl = CM_MIN(rr.ttl, 10u);
            }
            cm_mdns_write_rr(&w, pass == 0 ? CM_MDNS_SEC_ANSWER : CM_MDNS_SEC_ADDITIONAL, &rr);
            if (pass == 0) nans++;
        }
    }
    if (nans == 0) return;
    int len = cm_mdns_writer_finish(&w);
    if (legacy || unicast) {
        if (m->tokens < 1.0) {
            m->st.tx_suppressed++;
            return;
        }
        m->tokens -= 1.0;
        send_unicast(m, src, sport, len);
    } else {
        cm_mdns_send_mcast(m, f, len);
    }
}

static uint64_t next_deadline(const cm_mdns *m) {
    uint64_t d = UINT64_MAX;
    if (m->rstate != RS_IDLE && m->rstate != RS_RUNNING) d = m->next_tx;
    if (m->browsing) {
        d = CM_MIN(d, m->next_query);
        for (int k = 0; k < CM_MDNS_MAX_INSTANCES; k++) {
            const inst *e = &m->insts[k];
            if (!e->used) continue;
            uint64_t c[6] = {e->ptr_exp, e->srv_exp, e->txt_exp, e->a_exp, e->next_resolve, e->refresh_at};
            for (int j = 0; j < 6; j++)
                if (c[j]) d = CM_MIN(d, c[j]);
        }
    }
    return d;
}

/* ------------------------------------------------------------ receive */

static void handle_packet(cm_mdns *m, size_t n, const uint8_t src[4], uint16_t sport, unsigned ifindex) {
    cm_mdns_msg *msg = &m->msg;
    if (cm_mdns_parse(m->rx, n, msg, NULL, 0) != 0) {
        m->st.rx_bad++;
        return;
    }
    mif *f = iface_of(m, ifindex, src);
    if (!f) return; /* not from a link we serve */
    if (msg->flags & CM_MDNS_FLAG_QR) {
        if (sport != CM_MDNS_PORT) return; /* RFC 6762 §6: responses come from 5353 */
        if (m->rstate != RS_IDLE) check_conflict(m, msg);
        if (m->browsing) cm_mdns_browse_response(m, msg, f, src);
    } else {
        if (m->rstate == RS_PROBING) probe_tiebreak(m, msg);
        else if (m->rstate == RS_ANNOUNCING || m->rstate == RS_RUNNING) answer_query(m, msg, f, src, sport);
    }
}

void cm_mdns_feed(cm_mdns *m, const uint8_t *p, size_t n, const uint8_t src[4], uint16_t sport) {
    n = CM_MIN(n, sizeof m->rx);
    memcpy(m->rx, p, n);
    m->st.rx++;
    handle_packet(m, n, src, sport, m->ifs[0].index);
}

int cm_mdns_fd(const cm_mdns *m) { return m->fd; }

int cm_mdns_poll_timeout_ms(const cm_mdns *m) {
    uint64_t d = next_deadline(m), t = now_ms();
    if (!m->detached) d = CM_MIN(d, m->next_scan);
    return d <= t ? 0 : (int)CM_MIN(d - t, (uint64_t)60000);
}

int cm_mdns_step(cm_mdns *m, int timeout_ms) {
    uint64_t end = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        uint64_t t = now_ms();
        if (!m->detached && t >= m->next_scan) {
            m->next_scan = t + RESCAN_MS;
            /* NEEDSWORK: RFC 6762 §8 wants a probe on a new interface; we announce */
            if (scan_ifaces(m) > 0) {
                if (m->rstate == RS_ANNOUNCING || m->rstate == RS_RUNNING) {
                    m->rstate = RS_ANNOUNCING;
                    m->announce_n = 0;
                    m->next_tx = t;
                }
                if (m->browsing) {
                    m->query_ms = 1000;
                    m->next_query = t + rand_ms(m, 20, 120);
                }
            }
        }
        responder_timer(m, t);
        cm_mdns_browser_timer(m, t);
        uint64_t d = CM_MIN(end, next_deadline(m));
        int wait = d > t ? (int)CM_MIN(d - t, (uint64_t)1000) : 0;
        int r = 0;
        if (m->detached) cm_sleep_ms((unsigned)wait);
        else r = cm_fd_wait_readable(m->fd, wait);
        if (r < 0) return r;
        for (int i = 0; r > 0 && i < RX_PER_STEP; i++) {
            uint8_t src[4];
            uint16_t sport;
            unsigned ifindex;
            long k = cm_udp4_recv(m->fd, m->rx, sizeof m->rx, src, &sport, &ifindex);
            if (k == CM_EAGAIN) break;
            if (k < 0) return (int)k;
            m->st.rx++;
            handle_packet(m, (size_t)k, src, sport, ifindex);
        }
        if (now_ms() >= end) return 0;
    }
}
