/*
 * mdns_browse.c: the DNS-SD browser for _cumulo._tcp: PTR queries with a
 * doubling interval (1 s .. 60 s) and known-answer lists, resolution of
 * SRV/TXT/A(AAAA), refresh at 80% of the SRV TTL, expiry, removal on
 * goodbye, and a table bounded by CM_MDNS_MAX_INSTANCES where a flood of
 * unresolved PTRs can only evict other unresolved entries. It reads only
 * decoded messages (cm_mdns_parse did the bounds checks).
 */
#include "mdns_priv.h"

#include <stdio.h>
#include <string.h>

static void emit(cm_mdns *m, enum cm_mdns_event ev, inst *e) {
    if (m->fn) m->fn(m->ud, ev, &e->pub);
}

static void inst_drop(cm_mdns *m, inst *e) {
    if (e->added) emit(m, CM_MDNS_REMOVE, e);
    memset(e, 0, sizeof *e);
}

static inst *inst_find(cm_mdns *m, const cm_mdns_name *n) {
    for (int i = 0; i < CM_MDNS_MAX_INSTANCES; i++)
        if (m->insts[i].used && cm_mdns_name_eq(&m->insts[i].name, n)) return &m->insts[i];
    return NULL;
}

static inst *inst_new(cm_mdns *m, const cm_mdns_name *n, const uint8_t src[4]) {
    inst *victim = NULL, *own = NULL;
    int n_own = 0;
    for (int i = 0; i < CM_MDNS_MAX_INSTANCES; i++) {
        inst *e = &m->insts[i];
        if (!e->used) {
            if (!victim || victim->used) victim = e;
            continue;
        }
        if (!memcmp(e->src, src, 4)) {
            n_own++;
            if (!own || e->ptr_rx < own->ptr_rx) own = e;
        }
        /* full: evict the oldest instance that never resolved (flood of bare PTRs) */
        if ((!victim || victim->used) && !e->added && (!victim || e->ptr_rx < victim->ptr_rx)) victim = e;
    }
    /* one source announcing many services replaces its own oldest one */
    if (n_own >= MDNS_MAX_PER_SOURCE) victim = own;
    if (!victim) return NULL;
    if (victim->used) inst_drop(m, victim);
    victim->used = true;
    victim->name = *n;
    memcpy(victim->src, src, 4);
    return victim;
}

static void send_query(cm_mdns *m, inst *only) {
    uint64_t t = now_ms();
    for (int i = 0; i < m->nifs; i++) {
        cm_mdns_writer w;
        cm_mdns_rr rr;
        cm_mdns_writer_init(&w, m->tx, sizeof m->tx, 0, 0);
        if (only) {
            cm_mdns_write_question(&w, &only->name, CM_MDNS_T_SRV, false);
            cm_mdns_write_question(&w, &only->name, CM_MDNS_T_TXT, false);
            if (only->target.len) cm_mdns_write_question(&w, &only->target, CM_MDNS_T_A, false);
        } else {
            cm_mdns_write_question(&w, &m->svc, CM_MDNS_T_PTR, false);
            /* known answers (RFC 6762 §7.1): PTRs with more than half their TTL left */
            for (int k = 0; k < CM_MDNS_MAX_INSTANCES; k++) {
                inst *e = &m->insts[k];
                if (!e->used || !e->ptr_exp || e->ptr_exp <= t) continue;
                uint64_t left = (e->ptr_exp - t) / 1000;
                if (left * 2 < e->ptr_ttl) continue;
                memset(&rr, 0, sizeof rr);
                rr.name = m->svc;
                rr.type = CM_MDNS_T_PTR;
                rr.klass = CM_MDNS_CLASS_IN;
                rr.ttl = (uint32_t)left;
                rr.target = e->name;
                cm_mdns_writer save = w;
                cm_mdns_write_rr(&w, CM_MDNS_SEC_ANSWER, &rr);
                if (w.overflow || w.len > 1400) {
                    w = save;
                    break;
                } /* NEEDSWORK: TC + continuation */
            }
        }
        cm_mdns_send_mcast(m, &m->ifs[i], cm_mdns_writer_finish(&w));
    }
}

int cm_mdns_browse(cm_mdns *m, cm_mdns_event_fn fn, void *ud) {
    m->fn = fn;
    m->ud = ud;
    if (!m->browsing) {
        m->browsing = true;
        m->query_ms = 1000;
        m->next_query = now_ms() + rand_ms(m, 20, 120); /* RFC 6762 §5.2 */
    }
    return 0;
}

size_t cm_mdns_instance_count(const cm_mdns *m) {
    size_t n = 0;
    for (int i = 0; i < CM_MDNS_MAX_INSTANCES; i++) n += m->insts[i].added;
    return n;
}

const cm_mdns_instance *cm_mdns_instance_at(const cm_mdns *m, size_t idx) {
    for (int i = 0; i < CM_MDNS_MAX_INSTANCES; i++)
        if (m->insts[i].added && idx-- == 0) return &m->insts[i].pub;
    return NULL;
}

static uint64_t expiry(uint64_t t, uint32_t ttl) { return t + (uint64_t)ttl * 1000u; }

void cm_mdns_browse_response(cm_mdns *m, const cm_mdns_msg *msg, const mif *f, const uint8_t src[4]) {
    uint64_t t = now_ms();
    /* pass 0: PTRs create or remove instances; 1: SRV/TXT; 2: addresses */
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < msg->nrr; i++) {
            const cm_mdns_rr *rr = &msg->rr[i];
            if (rr->klass != CM_MDNS_CLASS_IN) continue;
            if (pass == 0 && rr->type == CM_MDNS_T_PTR && cm_mdns_name_eq(&rr->name, &m->svc)) {
                char label[CM_MDNS_LABEL_MAX + 1];
                if (!cm_mdns_name_split_instance(&rr->target, &m->svc, label, sizeof label)) continue;
                inst *e = inst_find(m, &rr->target);
                if (rr->ttl == 0) {
                    if (e) inst_drop(m, e);
                    continue;
                } /* goodbye */
                if (!e && !(e = inst_new(m, &rr->target, src))) continue;
                memcpy(e->pub.name, label, sizeof label);
                e->ptr_rx = t;
                e->ptr_ttl = rr->ttl;
                e->ptr_exp = expiry(t, rr->ttl);
                if (!e->next_resolve) e->next_resolve = t + 200; /* answers usually carry SRV/TXT/A */
                if (f) snprintf(e->pub.ifname, sizeof e->pub.ifname, "%s", f->name);
            } else if (pass == 1 && (rr->type == CM_MDNS_T_SRV || rr->type == CM_MDNS_T_TXT)) {
                inst *e = inst_find(m, &rr->name);
                if (!e) continue;
                if (rr->ttl == 0) {
                    inst_drop(m, e);
                    continue;
                }
                if (rr->type == CM_MDNS_T_SRV) {
                    if (!e->pub.has_srv || e->pub.port != rr->port || !cm_mdns_name_eq(&e->target, &rr->target)) {
                        if (e->target.len && !cm_mdns_name_eq(&e->target, &rr->target)) e->pub.addr[0] = 0;
                        e->target = rr->target;
                        e->pub.port = rr->port;
                        cm_mdns_name_text(&rr->target, e->pub.host, sizeof e->pub.host);
                        e->pub.has_srv = e->changed = true;
                    }
                    e->srv_exp = expiry(t, rr->ttl);
                    e->refresh_at = t + (uint64_t)rr->ttl * 800u; /* re-query at 80% (§5.2) */
                } else {
                    size_t l = CM_MIN((size_t)rr->rdlen, sizeof e->pub.txt);
                    if (!e->pub.has_txt || l != e->pub.txt_len || memcmp(e->pub.txt, rr->rdata, l)) {
                        if (l) memcpy(e->pub.txt, rr->rdata, l);
                        e->pub.txt_len = l;
                        e->pub.has_txt = e->changed = true;
                    }
                    e->txt_exp = expiry(t, rr->ttl);
                }
            } else if (pass == 2 && (rr->type == CM_MDNS_T_A || rr->type == CM_MDNS_T_AAAA)) {
                for (int k = 0; k < CM_MDNS_MAX_INSTANCES; k++) {
                    inst *e = &m->insts[k];
                    if (!e->used || !e->target.len || !cm_mdns_name_eq(&e->target, &rr->name)) continue;
                    if (rr->ttl == 0) {
                        inst_drop(m, e);
                        continue;
                    }
                    char a[48];
                    if (rr->type == CM_MDNS_T_A)
                        snprintf(a, sizeof a, "%u.%u.%u.%u", rr->addr[0], rr->addr[1], rr->addr[2], rr->addr[3]);
                    else {
                        if (e->pub.addr[0] && !strchr(e->pub.addr, ':')) continue; /* prefer IPv4 */
                        size_t o = 0;
                        for (int j = 0; j < 16; j += 2)
                            o += (size_t)snprintf(a + o, sizeof a - o, "%s%x", j ? ":" : "",
                                                  (rr->addr[j] << 8) | rr->addr[j + 1]);
                    }
                    if (strcmp(a, e->pub.addr)) {
                        memcpy(e->pub.addr, a, sizeof a);
                        e->changed = true;
                    }
                    e->a_exp = expiry(t, rr->ttl);
                }
            }
        }
    }
    for (int k = 0; k < CM_MDNS_MAX_INSTANCES; k++) {
        inst *e = &m->insts[k];
        if (!e->used || !e->changed) continue;
        e->changed = false;
        if (e->pub.has_srv && e->pub.has_txt && e->pub.addr[0]) {
            emit(m, e->added ? CM_MDNS_UPDATE : CM_MDNS_ADD, e);
            e->added = true;
        }
    }
}

void cm_mdns_browser_timer(cm_mdns *m, uint64_t t) {
    if (!m->browsing) return;
    if (t >= m->next_query) {
        send_query(m, NULL);
        m->next_query = t + m->query_ms;
        m->query_ms = CM_MIN(m->query_ms * 2, (uint64_t)QUERY_MAX_MS);
    }
    for (int k = 0; k < CM_MDNS_MAX_INSTANCES; k++) {
        inst *e = &m->insts[k];
        if (!e->used) continue;
        if ((e->ptr_exp && t >= e->ptr_exp) || (e->srv_exp && t >= e->srv_exp) || (e->txt_exp && t >= e->txt_exp) ||
            (e->a_exp && t >= e->a_exp)) {
            inst_drop(m, e);
            continue;
        }
        bool complete = e->pub.has_srv && e->pub.has_txt && e->pub.addr[0];
        if (!complete && e->next_resolve && t >= e->next_resolve) {
            if (e->tries >= 6) {
                inst_drop(m, e);
                continue;
            } /* never resolved: forget it */
            send_query(m, e);
            e->tries++;
            e->next_resolve = t + 1000u * (1u << CM_MIN(e->tries, 4));
        } else if (complete && e->refresh_at && t >= e->refresh_at) {
            send_query(m, e);
            e->refresh_at = t + (e->srv_exp - t) / 2 + 1000;
        }
    }
}
