/*
 * test_mdns.c: the mDNS/DNS-SD codec and the responder/browser state
 * machines, without a network (detached handle). Independent reference: a
 * response captured from avahi-daemon 0.8 (compressed names, a dot and a
 * space inside the instance label, AAAA + A + service enumeration), which
 * must decode to exactly what avahi-publish was given.
 */
#include "test.h"

#include "base/base.h"
#include "cluster/mdns.h"

/* avahi-publish -s "Avahi Node.one" _cumulo._tcp 7777 id=feedbeef v=1 caps=cores:8
 * on host cmavahi (10.80.0.2), captured from the wire (fuzz/corpus/mdns/avahi-response-209). */
static const uint8_t k_avahi[] = {
    0x00, 0x00, 0x84, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x0e, 0x41, 0x76, 0x61, 0x68, 0x69, 0x20,
    0x4e, 0x6f, 0x64, 0x65, 0x2e, 0x6f, 0x6e, 0x65, 0x07, 0x5f, 0x63, 0x75, 0x6d, 0x75, 0x6c, 0x6f, 0x04, 0x5f, 0x74,
    0x63, 0x70, 0x05, 0x6c, 0x6f, 0x63, 0x61, 0x6c, 0x00, 0x00, 0x10, 0x80, 0x01, 0x00, 0x00, 0x11, 0x94, 0x00, 0x1d,
    0x0b, 0x69, 0x64, 0x3d, 0x66, 0x65, 0x65, 0x64, 0x62, 0x65, 0x65, 0x66, 0x03, 0x76, 0x3d, 0x31, 0x0c, 0x63, 0x61,
    0x70, 0x73, 0x3d, 0x63, 0x6f, 0x72, 0x65, 0x73, 0x3a, 0x38, 0xc0, 0x1b, 0x00, 0x0c, 0x00, 0x01, 0x00, 0x00, 0x11,
    0x94, 0x00, 0x02, 0xc0, 0x0c, 0xc0, 0x0c, 0x00, 0x21, 0x80, 0x01, 0x00, 0x00, 0x00, 0x78, 0x00, 0x10, 0x00, 0x00,
    0x00, 0x00, 0x1e, 0x61, 0x07, 0x63, 0x6d, 0x61, 0x76, 0x61, 0x68, 0x69, 0xc0, 0x28, 0xc0, 0x76, 0x00, 0x1c, 0x80,
    0x01, 0x00, 0x00, 0x00, 0x78, 0x00, 0x10, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xec, 0x2f, 0x1d, 0xff,
    0xfe, 0x4a, 0x98, 0x06, 0xc0, 0x76, 0x00, 0x01, 0x80, 0x01, 0x00, 0x00, 0x00, 0x78, 0x00, 0x04, 0x0a, 0x50, 0x00,
    0x02, 0x09, 0x5f, 0x73, 0x65, 0x72, 0x76, 0x69, 0x63, 0x65, 0x73, 0x07, 0x5f, 0x64, 0x6e, 0x73, 0x2d, 0x73, 0x64,
    0x04, 0x5f, 0x75, 0x64, 0x70, 0xc0, 0x28, 0x00, 0x0c, 0x00, 0x01, 0x00, 0x00, 0x11, 0x94, 0x00, 0x02, 0xc0, 0x1b,
};

static cm_mdns_msg g_msg, g_msg2;

static void test_names(void) {
    cm_mdns_name a, b, svc;
    CHECK(cm_mdns_name_make(&a, "My Node.x", "_cumulo._tcp.local") == 0);
    CHECK(cm_mdns_name_make(&b, "my node.X", "_CUMULO._tcp.LOCAL") == 0);
    CHECK(cm_mdns_name_eq(&a, &b));
    CHECK(a.len == 1 + 9 + 1 + 7 + 1 + 4 + 1 + 5 + 1);
    CHECK(cm_mdns_name_make(&svc, NULL, CM_MDNS_SERVICE) == 0);
    char label[64], text[300];
    CHECK(cm_mdns_name_split_instance(&a, &svc, label, sizeof label) && !strcmp(label, "My Node.x"));
    CHECK(!cm_mdns_name_split_instance(&svc, &svc, label, sizeof label));
    cm_mdns_name_text(&a, text, sizeof text);
    CHECKF(!strcmp(text, "My Node\\.x._cumulo._tcp.local."), "%s", text);
    char big[80];
    memset(big, 'x', 64);
    big[64] = 0;
    CHECK(cm_mdns_name_make(&a, big, "local") == CM_ERANGE);
    CHECK(cm_mdns_name_make(&a, "", "local") == CM_ERANGE);
    CHECK(cm_mdns_name_make(&a, NULL, "a..b") == CM_ERANGE);
    char longd[400] = "";
    for (int i = 0; i < 5; i++) {
        strcat(longd, big + 4);
        strcat(longd, ".");
    } /* 5 x 60-byte labels */
    strcat(longd, "local");
    CHECK(cm_mdns_name_make(&a, NULL, longd) == CM_ERANGE);
}

static void test_avahi_packet(void) {
    char err[128] = "";
    int rc = cm_mdns_parse(k_avahi, sizeof k_avahi, &g_msg, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    CHECK(g_msg.flags == 0x8400 && g_msg.nq == 0 && g_msg.nrr == 6 && !g_msg.capped);
    cm_mdns_name svc, inst, host, en;
    cm_mdns_name_make(&svc, NULL, CM_MDNS_SERVICE);
    cm_mdns_name_make(&inst, "Avahi Node.one", CM_MDNS_SERVICE);
    cm_mdns_name_make(&host, "cmavahi", "local");
    cm_mdns_name_make(&en, NULL, "_services._dns-sd._udp.local");
    int seen = 0;
    for (size_t i = 0; i < g_msg.nrr; i++) {
        const cm_mdns_rr *r = &g_msg.rr[i];
        char v[64];
        switch (r->type) {
        case CM_MDNS_T_TXT:
            CHECK(cm_mdns_name_eq(&r->name, &inst) && r->cache_flush && r->ttl == 4500);
            CHECK(cm_mdns_txt_get(r->rdata, r->rdlen, "id", v, sizeof v) == 8 && !strcmp(v, "feedbeef"));
            CHECK(cm_mdns_txt_get(r->rdata, r->rdlen, "CAPS", v, sizeof v) > 0 && !strcmp(v, "cores:8"));
            CHECK(cm_mdns_txt_get(r->rdata, r->rdlen, "nope", v, sizeof v) == CM_ENOENT);
            seen |= 1;
            break;
        case CM_MDNS_T_PTR:
            if (cm_mdns_name_eq(&r->name, &svc)) {
                CHECK(cm_mdns_name_eq(&r->target, &inst));
                seen |= 2;
            } else {
                CHECK(cm_mdns_name_eq(&r->name, &en) && cm_mdns_name_eq(&r->target, &svc));
                seen |= 4;
            }
            break;
        case CM_MDNS_T_SRV:
            CHECK(r->port == 7777 && r->priority == 0 && r->weight == 0 && cm_mdns_name_eq(&r->target, &host));
            CHECK(r->ttl == 120);
            seen |= 8;
            break;
        case CM_MDNS_T_A:
            CHECK(cm_mdns_name_eq(&r->name, &host) && !memcmp(r->addr, (uint8_t[]){10, 80, 0, 2}, 4));
            seen |= 16;
            break;
        case CM_MDNS_T_AAAA:
            CHECK(r->addr[0] == 0xfe && r->addr[1] == 0x80);
            seen |= 32;
            break;
        default: CHECKF(0, "unexpected type %u", r->type);
        }
    }
    CHECKF(seen == 63, "seen=%d", seen);
}

/* Every proper prefix of a valid message must be refused; every single-byte
 * corruption must parse or be refused without reading out of bounds (ASan). */
static void test_truncation_and_corruption(void) {
    static uint8_t buf[sizeof k_avahi];
    int bad_prefix = 0, corrupt_ok = 0, corrupt_err = 0, weird = 0;
    for (size_t n = 0; n < sizeof k_avahi; n++) {
        memcpy(buf, k_avahi, n); /* exactly n bytes: ASan sees any overread of the heap copy */
        uint8_t *h = cm_malloc(n ? n : 1);
        memcpy(h, k_avahi, n);
        if (cm_mdns_parse(h, n, &g_msg, NULL, 0) != CM_EFORMAT) bad_prefix++;
        cm_free(h);
    }
    CHECKF(bad_prefix == 0, "%d prefixes accepted", bad_prefix);
    static const uint8_t vals[] = {0x00, 0xff, 0xc0, 0x3f, 0x40, 0x01, 0x80};
    for (size_t i = 0; i < sizeof k_avahi; i++)
        for (size_t v = 0; v < sizeof vals; v++) {
            uint8_t *h = cm_malloc(sizeof k_avahi);
            memcpy(h, k_avahi, sizeof k_avahi);
            h[i] = vals[v];
            int rc = cm_mdns_parse(h, sizeof k_avahi, &g_msg, NULL, 0);
            if (rc == 0) corrupt_ok++;
            else if (rc == CM_EFORMAT) corrupt_err++;
            else weird++;
            cm_free(h);
        }
    CHECK(weird == 0);
    CHECK(corrupt_err > 100 && corrupt_ok > 100); /* both outcomes happen: the test reaches deep code */
}

static int parse_bytes(const uint8_t *p, size_t n, char *err, size_t errlen) {
    uint8_t *h = cm_malloc(n);
    memcpy(h, p, n);
    int rc = cm_mdns_parse(h, n, &g_msg, err, errlen);
    cm_free(h);
    return rc;
}

static void test_compression_loops(void) {
    char err[128];
    /* question name = pointer to itself */
    static const uint8_t self[] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 12, 0, 1};
    CHECK(parse_bytes(self, sizeof self, err, sizeof err) == CM_EFORMAT);
    CHECKF(strstr(err, "backwards") != NULL, "%s", err);
    /* forward pointer */
    static const uint8_t fwd[] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x12, 0, 12, 0, 1, 1, 'a', 0};
    CHECK(parse_bytes(fwd, sizeof fwd, NULL, 0) == CM_EFORMAT);
    /* two names pointing at each other: the second is backwards, the first forwards */
    static const uint8_t mutual[] = {0,    0,    0, 0,  0, 2, 0, 0,   0,    0,    0, 0,  1, 'a',
                                     0xc0, 0x14, 0, 12, 0, 1, 1, 'b', 0xc0, 0x0c, 0, 12, 0, 1};
    CHECK(parse_bytes(mutual, sizeof mutual, NULL, 0) == CM_EFORMAT);
    /* 70 records, each name "a" + pointer to the previous record's name: 70 jumps
     * and > 255 bytes; refused by the jump or the length limit, never looping */
    static uint8_t deep[12 + 70 * 18];
    size_t o = 12, prev = 0;
    memset(deep, 0, 12);
    deep[2] = 0x84;
    deep[7] = 70;
    for (int i = 0; i < 70; i++) {
        size_t start = o;
        deep[o++] = 1;
        deep[o++] = 'a';
        if (i == 0) deep[o++] = 0;
        else {
            deep[o++] = (uint8_t)(0xc0 | (prev >> 8));
            deep[o++] = (uint8_t)prev;
        }
        static const uint8_t tail[] = {0, 1, 0, 1, 0, 0, 0, 120, 0, 4, 10, 0, 0, 1};
        memcpy(deep + o, tail, sizeof tail);
        o += sizeof tail;
        prev = start;
    }
    CHECK(parse_bytes(deep, o, err, sizeof err) == CM_EFORMAT);
    /* reserved label types 0x40/0x80 */
    static const uint8_t resv[] = {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x41, 'a', 0, 0, 12, 0, 1};
    CHECK(parse_bytes(resv, sizeof resv, NULL, 0) == CM_EFORMAT);
    /* huge counts with no body fail fast */
    static const uint8_t huge[] = {0, 0, 0x84, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 12, 0, 1};
    CHECK(parse_bytes(huge, sizeof huge, NULL, 0) == CM_EFORMAT);
    /* wrong rdata sizes */
    static const uint8_t srv3[] = {0, 0, 0x84, 0, 0, 0, 0, 1, 0,   0, 0, 0, 1, 'a',
                                   0, 0, 33,   0, 1, 0, 0, 0, 120, 0, 3, 0, 0, 0};
    CHECK(parse_bytes(srv3, sizeof srv3, NULL, 0) == CM_EFORMAT);
    static const uint8_t a5[] = {0, 0, 0x84, 0, 0, 0, 0, 1,   0, 0, 0, 0, 1, 'a', 0,
                                 0, 1, 0,    1, 0, 0, 0, 120, 0, 5, 1, 2, 3, 4,   5};
    CHECK(parse_bytes(a5, sizeof a5, NULL, 0) == CM_EFORMAT);
    static const uint8_t txt[] = {0, 0, 0x84, 0, 0, 0, 0, 1, 0,   0, 0, 0, 1,   'a',
                                  0, 0, 16,   0, 1, 0, 0, 0, 120, 0, 3, 5, 'a', 'b'};
    CHECK(parse_bytes(txt, sizeof txt, NULL, 0) == CM_EFORMAT);
    /* a PTR whose name runs past its rdlength */
    static const uint8_t ptr[] = {0, 0, 0x84, 0, 0, 0, 0, 1, 0,   0, 0, 0, 1,   'a',
                                  0, 0, 12,   0, 1, 0, 0, 0, 120, 0, 2, 1, 'b', 0};
    CHECK(parse_bytes(ptr, sizeof ptr, NULL, 0) == CM_EFORMAT);
}

static void test_roundtrip_and_caps(void) {
    uint8_t buf[2048], txt[64];
    size_t tl = 0;
    CHECK(cm_mdns_txt_add(txt, sizeof txt, &tl, "id", "00ff") == 0);
    CHECK(cm_mdns_txt_add(txt, sizeof txt, &tl, "flag", NULL) == 0);
    char big[300];
    memset(big, 'v', 299);
    big[299] = 0;
    CHECK(cm_mdns_txt_add(txt, sizeof txt, &tl, "k", big) == CM_ERANGE);
    char v[16];
    CHECK(cm_mdns_txt_get(txt, tl, "flag", v, sizeof v) == 0 && v[0] == 0);
    CHECK(cm_mdns_txt_get((const uint8_t *)"\x09id", 3, "id", v, sizeof v) == CM_EFORMAT);

    cm_mdns_writer w;
    cm_mdns_writer_init(&w, buf, sizeof buf, 0x1234, CM_MDNS_FLAG_QR | CM_MDNS_FLAG_AA);
    cm_mdns_name svc, inst, host;
    cm_mdns_name_make(&svc, NULL, CM_MDNS_SERVICE);
    cm_mdns_name_make(&inst, "n\xc3\xa9ud", CM_MDNS_SERVICE);
    cm_mdns_name_make(&host, "cm-abc", "local");
    cm_mdns_write_question(&w, &svc, CM_MDNS_T_PTR, true);
    cm_mdns_rr r;
    memset(&r, 0, sizeof r);
    r.name = svc;
    r.type = CM_MDNS_T_PTR;
    r.ttl = 4500;
    r.target = inst;
    cm_mdns_write_rr(&w, CM_MDNS_SEC_ANSWER, &r);
    memset(&r, 0, sizeof r);
    r.name = inst;
    r.type = CM_MDNS_T_SRV;
    r.ttl = 120;
    r.cache_flush = true;
    r.port = 7001;
    r.priority = 3;
    r.weight = 9;
    r.target = host;
    cm_mdns_write_rr(&w, CM_MDNS_SEC_ANSWER, &r);
    memset(&r, 0, sizeof r);
    r.name = inst;
    r.type = CM_MDNS_T_TXT;
    r.ttl = 4500;
    r.rdata = txt;
    r.rdlen = (uint16_t)tl;
    cm_mdns_write_rr(&w, CM_MDNS_SEC_AUTHORITY, &r);
    memset(&r, 0, sizeof r);
    r.name = host;
    r.type = CM_MDNS_T_AAAA;
    r.ttl = 0;
    r.addr[0] = 0xfe;
    r.addr[15] = 7;
    cm_mdns_write_rr(&w, CM_MDNS_SEC_ADDITIONAL, &r);
    int len = cm_mdns_writer_finish(&w);
    CHECK(len > 0);
    char err[128] = "";
    CHECKF(cm_mdns_parse(buf, (size_t)len, &g_msg2, err, sizeof err) == 0, "%s", err);
    CHECK(g_msg2.id == 0x1234 && g_msg2.nq == 1 && g_msg2.nrr == 4);
    CHECK(g_msg2.q[0].unicast_response && g_msg2.q[0].type == CM_MDNS_T_PTR &&
          cm_mdns_name_eq(&g_msg2.q[0].name, &svc));
    CHECK(cm_mdns_name_eq(&g_msg2.rr[0].target, &inst) && !g_msg2.rr[0].cache_flush);
    CHECK(g_msg2.rr[1].port == 7001 && g_msg2.rr[1].priority == 3 && g_msg2.rr[1].weight == 9 &&
          g_msg2.rr[1].cache_flush);
    CHECK(g_msg2.rr[2].section == CM_MDNS_SEC_AUTHORITY && g_msg2.rr[2].rdlen == tl &&
          !memcmp(g_msg2.rr[2].rdata, txt, tl));
    CHECK(g_msg2.rr[3].section == CM_MDNS_SEC_ADDITIONAL && g_msg2.rr[3].ttl == 0 && g_msg2.rr[3].addr[15] == 7);
    for (int n = 0; n < len; n++) CHECK(cm_mdns_parse(buf, (size_t)n, &g_msg, NULL, 0) == CM_EFORMAT);

    /* overflow and order errors are reported, not written past the buffer */
    cm_mdns_writer_init(&w, buf, 40, 0, 0);
    cm_mdns_write_question(&w, &inst, CM_MDNS_T_ANY, false);
    CHECK(cm_mdns_writer_finish(&w) == CM_ENOSPACE);
    cm_mdns_writer_init(&w, buf, sizeof buf, 0, 0);
    cm_mdns_write_rr(&w, CM_MDNS_SEC_ADDITIONAL, &r);
    cm_mdns_write_question(&w, &inst, CM_MDNS_T_ANY, false);
    CHECK(cm_mdns_writer_finish(&w) == CM_EINVAL);

    /* more questions than kept: capped, not an error */
    cm_mdns_writer_init(&w, buf, sizeof buf, 0, 0);
    for (int i = 0; i < 50; i++) cm_mdns_write_question(&w, &host, CM_MDNS_T_A, false);
    len = cm_mdns_writer_finish(&w);
    CHECK(cm_mdns_parse(buf, (size_t)len, &g_msg, NULL, 0) == 0 && g_msg.nq == CM_MDNS_MAX_QUESTIONS && g_msg.capped);
}

/* ------------------------------------------------ state machines, detached */

static const uint8_t k_peer[4] = {10, 0, 0, 9};
static int g_ev[CM_MDNS_EVENT_COUNT];
static cm_mdns_instance g_last;

static void on_ev(void *ud, enum cm_mdns_event ev, const cm_mdns_instance *in) {
    (void)ud;
    g_ev[ev]++;
    g_last = *in;
}

/* A complete announcement of instance `label` (PTR, SRV, TXT, A) with the given TTLs. */
static int make_announce(uint8_t *buf, size_t cap, const char *label, uint16_t port, uint32_t ttl_ptr,
                         uint32_t ttl_host, bool with_srv) {
    cm_mdns_writer w;
    cm_mdns_rr r;
    cm_mdns_name svc, inst, host;
    cm_mdns_name_make(&svc, NULL, CM_MDNS_SERVICE);
    cm_mdns_name_make(&inst, label, CM_MDNS_SERVICE);
    cm_mdns_name_make(&host, "peerhost", "local");
    cm_mdns_writer_init(&w, buf, cap, 0, CM_MDNS_FLAG_QR | CM_MDNS_FLAG_AA);
    memset(&r, 0, sizeof r);
    r.name = svc;
    r.type = CM_MDNS_T_PTR;
    r.ttl = ttl_ptr;
    r.target = inst;
    cm_mdns_write_rr(&w, CM_MDNS_SEC_ANSWER, &r);
    if (with_srv) {
        memset(&r, 0, sizeof r);
        r.name = inst;
        r.type = CM_MDNS_T_SRV;
        r.ttl = ttl_host;
        r.port = port;
        r.target = host;
        cm_mdns_write_rr(&w, CM_MDNS_SEC_ADDITIONAL, &r);
        memset(&r, 0, sizeof r);
        r.name = inst;
        r.type = CM_MDNS_T_TXT;
        r.ttl = ttl_ptr;
        r.rdata = (const uint8_t *)"\x04id=7";
        r.rdlen = 5;
        cm_mdns_write_rr(&w, CM_MDNS_SEC_ADDITIONAL, &r);
        memset(&r, 0, sizeof r);
        r.name = host;
        r.type = CM_MDNS_T_A;
        r.ttl = ttl_host;
        memcpy(r.addr, k_peer, 4);
        cm_mdns_write_rr(&w, CM_MDNS_SEC_ADDITIONAL, &r);
    }
    return cm_mdns_writer_finish(&w);
}

static void test_browser(void) {
    cm_mdns *m;
    CHECK(cm_mdns_open_detached(&m) == 0);
    CHECK(cm_mdns_browse(m, on_ev, NULL) == 0);
    memset(g_ev, 0, sizeof g_ev);
    cm_mdns_feed(m, k_avahi, sizeof k_avahi, k_peer, CM_MDNS_PORT);
    CHECK(g_ev[CM_MDNS_ADD] == 1 && cm_mdns_instance_count(m) == 1);
    CHECK(!strcmp(g_last.name, "Avahi Node.one") && !strcmp(g_last.addr, "10.80.0.2") && g_last.port == 7777);
    CHECK(!strcmp(g_last.host, "cmavahi.local."));
    char v[32];
    CHECK(cm_mdns_txt_get(g_last.txt, g_last.txt_len, "id", v, sizeof v) == 8);

    /* responses from a port other than 5353 are not mDNS responses (RFC 6762 §6) */
    static uint8_t buf[4096];
    int len = make_announce(buf, sizeof buf, "other", 1, 4500, 120, true);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, 40000);
    CHECK(cm_mdns_instance_count(m) == 1);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(cm_mdns_instance_count(m) == 2 && g_ev[CM_MDNS_ADD] == 2);
    /* same data again: no event; new port: UPDATE */
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(g_ev[CM_MDNS_ADD] == 2 && g_ev[CM_MDNS_UPDATE] == 0);
    len = make_announce(buf, sizeof buf, "other", 2, 4500, 120, true);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(g_ev[CM_MDNS_UPDATE] == 1 && g_last.port == 2);

    /* goodbye (TTL 0) removes */
    len = make_announce(buf, sizeof buf, "other", 2, 0, 0, false);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(g_ev[CM_MDNS_REMOVE] == 1 && !strcmp(g_last.name, "other") && cm_mdns_instance_count(m) == 1);

    /* one host announcing 1000 services holds 8 entries (it replaces its
     * own oldest), and the other hosts' entries stay */
    char name[32];
    size_t before = cm_mdns_instance_count(m);
    const uint8_t k_flooder[4] = {10, 1, 1, 1};
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "flood%d", i);
        len = make_announce(buf, sizeof buf, name, 9, 4500, 120, true);
        cm_mdns_feed(m, buf, (size_t)len, k_flooder, CM_MDNS_PORT);
    }
    CHECKF(cm_mdns_instance_count(m) == before + 8, "%zu entries", cm_mdns_instance_count(m));
    size_t others = 0;
    for (size_t i = 0; i < cm_mdns_instance_count(m); i++)
        others += strncmp(cm_mdns_instance_at(m, i)->name, "flood", 5) != 0;
    CHECK(before > 0 && others == before);
    /* flood of complete instances from many hosts: the table stays bounded */
    for (int i = 0; i < 1000; i++) {
        const uint8_t src[4] = {10, 2, (uint8_t)(i / 200), (uint8_t)(i % 200 + 1)};
        snprintf(name, sizeof name, "many%d", i);
        len = make_announce(buf, sizeof buf, name, 9, 4500, 120, true);
        cm_mdns_feed(m, buf, (size_t)len, src, CM_MDNS_PORT);
    }
    CHECK(cm_mdns_instance_count(m) == CM_MDNS_MAX_INSTANCES);
    /* bare PTRs cannot evict resolved instances */
    for (int i = 0; i < 300; i++) {
        const uint8_t src[4] = {10, 3, (uint8_t)(i / 200), (uint8_t)(i % 200 + 1)};
        snprintf(name, sizeof name, "bare%d", i);
        len = make_announce(buf, sizeof buf, name, 9, 4500, 120, false);
        cm_mdns_feed(m, buf, (size_t)len, src, CM_MDNS_PORT);
    }
    CHECK(cm_mdns_instance_count(m) == CM_MDNS_MAX_INSTANCES);
    cm_mdns_close(m);

    /* TTL expiry: SRV/A with a 1 s TTL disappear after it */
    CHECK(cm_mdns_open_detached(&m) == 0);
    cm_mdns_browse(m, on_ev, NULL);
    memset(g_ev, 0, sizeof g_ev);
    len = make_announce(buf, sizeof buf, "shortlived", 5, 4500, 1, true);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(g_ev[CM_MDNS_ADD] == 1);
    cm_mdns_step(m, 1300);
    CHECK(g_ev[CM_MDNS_REMOVE] == 1 && cm_mdns_instance_count(m) == 0);
    cm_mdns_stats st;
    cm_mdns_get_stats(m, &st);
    CHECK(st.tx >= 1); /* it sent its PTR query */
    cm_mdns_close(m);
}

static int make_query(uint8_t *buf, size_t cap, uint16_t id, const char *label, uint16_t type, bool qu, bool known) {
    cm_mdns_writer w;
    cm_mdns_name n, inst;
    cm_mdns_name_make(&n, label, label ? CM_MDNS_SERVICE : CM_MDNS_SERVICE);
    cm_mdns_writer_init(&w, buf, cap, id, 0);
    cm_mdns_write_question(&w, &n, type, qu);
    if (known) {
        cm_mdns_rr r;
        memset(&r, 0, sizeof r);
        cm_mdns_name_make(&inst, "node", CM_MDNS_SERVICE);
        r.name = n;
        r.type = CM_MDNS_T_PTR;
        r.ttl = 4000;
        r.target = inst;
        cm_mdns_write_rr(&w, CM_MDNS_SEC_ANSWER, &r);
    }
    return cm_mdns_writer_finish(&w);
}

static bool sent_has(cm_mdns *m, uint16_t type, int section, uint32_t max_ttl) {
    const uint8_t *p;
    size_t n = cm_mdns_last_sent(m, &p);
    if (cm_mdns_parse(p, n, &g_msg2, NULL, 0) != 0) return false;
    for (size_t i = 0; i < g_msg2.nrr; i++)
        if (g_msg2.rr[i].type == type && g_msg2.rr[i].section == section && g_msg2.rr[i].ttl <= max_ttl) return true;
    return false;
}

static void test_responder(void) {
    cm_mdns *m;
    CHECK(cm_mdns_open_detached(&m) == 0);
    cm_mdns_service svc = {.name = "node",
                           .port = 7001,
                           .node_id = "abc123",
                           .proto_version = 1,
                           .txt_extra = {"cores=8"},
                           .n_txt_extra = 1};
    char err[128] = "";
    CHECKF(cm_mdns_announce(m, &svc, err, sizeof err) == 0, "%s", err);
    CHECK(!cm_mdns_is_announced(m));
    cm_mdns_step(m, 1100); /* <= 250 ms wait + 3 probes 250 ms apart, then the first announcement */
    CHECK(cm_mdns_is_announced(m) && !strcmp(cm_mdns_current_name(m), "node"));
    CHECK(sent_has(m, CM_MDNS_T_PTR, CM_MDNS_SEC_ANSWER, 4500) && sent_has(m, CM_MDNS_T_SRV, CM_MDNS_SEC_ANSWER, 120));
    CHECK(sent_has(m, CM_MDNS_T_A, CM_MDNS_SEC_ANSWER, 120) && g_msg2.flags == (CM_MDNS_FLAG_QR | CM_MDNS_FLAG_AA));
    char v[32];
    for (size_t i = 0; i < g_msg2.nrr; i++) {
        if (g_msg2.rr[i].type == CM_MDNS_T_TXT) {
            CHECK(cm_mdns_txt_get(g_msg2.rr[i].rdata, g_msg2.rr[i].rdlen, "id", v, sizeof v) == 6);
            CHECK(cm_mdns_txt_get(g_msg2.rr[i].rdata, g_msg2.rr[i].rdlen, "cores", v, sizeof v) == 1);
            CHECK(cm_mdns_txt_get(g_msg2.rr[i].rdata, g_msg2.rr[i].rdlen, "ver", v, sizeof v) > 0);
        }
        if (g_msg2.rr[i].type == CM_MDNS_T_A) CHECK(!memcmp(g_msg2.rr[i].addr, (uint8_t[]){10, 0, 0, 1}, 4));
    }

    static uint8_t buf[2048];
    cm_mdns_stats st0, st1;
    /* QU PTR query: unicast answer with SRV/TXT/A as additional records */
    cm_mdns_get_stats(m, &st0);
    int len = make_query(buf, sizeof buf, 0, NULL, CM_MDNS_T_PTR, true, false);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    cm_mdns_get_stats(m, &st1);
    CHECK(st1.tx == st0.tx + 1);
    CHECK(sent_has(m, CM_MDNS_T_PTR, CM_MDNS_SEC_ANSWER, 4500) &&
          sent_has(m, CM_MDNS_T_SRV, CM_MDNS_SEC_ADDITIONAL, 120));
    /* known-answer suppression: nothing is sent */
    len = make_query(buf, sizeof buf, 0, NULL, CM_MDNS_T_PTR, true, true);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    cm_mdns_get_stats(m, &st0);
    CHECK(st0.tx == st1.tx);
    /* multicast answer right after an announcement: rate-limited per record (1 s) */
    len = make_query(buf, sizeof buf, 0, NULL, CM_MDNS_T_PTR, false, false);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    cm_mdns_get_stats(m, &st1);
    CHECK(st1.tx == st0.tx);
    /* legacy unicast (source port != 5353): id and question echoed, TTL <= 10 */
    len = make_query(buf, sizeof buf, 0x7777, "node", CM_MDNS_T_SRV, false, false);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, 40000);
    CHECK(sent_has(m, CM_MDNS_T_SRV, CM_MDNS_SEC_ANSWER, 10) && g_msg2.id == 0x7777 && g_msg2.nq == 1);
    /* query flood: unicast replies are token-bucket limited */
    cm_mdns_get_stats(m, &st0);
    for (int i = 0; i < 1000; i++) {
        len = make_query(buf, sizeof buf, (uint16_t)i, "node", CM_MDNS_T_TXT, true, false);
        cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    }
    cm_mdns_get_stats(m, &st1);
    CHECKF(st1.tx - st0.tx <= 50 && st1.tx - st0.tx >= 10, "%llu replies", (unsigned long long)(st1.tx - st0.tx));

    /* a conflicting SRV for our name: rename to "node (2)" and announce again */
    len = make_announce(buf, sizeof buf, "node", 9999, 4500, 120, true);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(!strcmp(cm_mdns_current_name(m), "node (2)") && !cm_mdns_is_announced(m));
    cm_mdns_step(m, 1100);
    CHECK(cm_mdns_is_announced(m));
    /* our own records echoed back are no conflict */
    const uint8_t *p;
    size_t n = cm_mdns_last_sent(m, &p);
    memcpy(buf, p, n);
    cm_mdns_feed(m, buf, n, (const uint8_t[]){10, 0, 0, 1}, CM_MDNS_PORT);
    CHECK(!strcmp(cm_mdns_current_name(m), "node (2)") && cm_mdns_is_announced(m));

    /* goodbye: every record with TTL 0 */
    cm_mdns_withdraw(m);
    CHECK(sent_has(m, CM_MDNS_T_PTR, CM_MDNS_SEC_ANSWER, 0) && sent_has(m, CM_MDNS_T_SRV, CM_MDNS_SEC_ANSWER, 0));
    cm_mdns_close(m);
}

static void test_probe_tiebreak(void) {
    /* a simultaneous probe for our name with lexicographically later data wins:
     * we must not finish probing on schedule (we back off 1 s) */
    cm_mdns *m;
    CHECK(cm_mdns_open_detached(&m) == 0);
    cm_mdns_service svc = {.name = "tie", .port = 1, .node_id = "aa", .proto_version = 1};
    CHECK(cm_mdns_announce(m, &svc, NULL, 0) == 0);
    cm_mdns_step(m, 300); /* first probe out */
    static uint8_t buf[1024];
    cm_mdns_writer w;
    cm_mdns_name inst, host;
    cm_mdns_name_make(&inst, "tie", CM_MDNS_SERVICE);
    cm_mdns_name_make(&host, "zzz", "local");
    cm_mdns_writer_init(&w, buf, sizeof buf, 0, 0);
    cm_mdns_write_question(&w, &inst, CM_MDNS_T_ANY, false);
    cm_mdns_rr r;
    memset(&r, 0, sizeof r);
    r.name = inst;
    r.type = CM_MDNS_T_SRV;
    r.ttl = 120;
    r.port = 65535;
    r.priority = 65535;
    r.target = host;
    cm_mdns_write_rr(&w, CM_MDNS_SEC_AUTHORITY, &r);
    int len = cm_mdns_writer_finish(&w);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    cm_mdns_step(m, 700);
    CHECK(!cm_mdns_is_announced(m));
    cm_mdns_step(m, 1500);
    CHECK(cm_mdns_is_announced(m) && !strcmp(cm_mdns_current_name(m), "tie"));
    cm_mdns_close(m);
}

static void test_defend_established(void) {
    /* once established (three announcements out), a conflicting response makes
     * us defend the name, not yield it; only a peer that keeps insisting and
     * wins the §8.2 ordering makes us rename */
    cm_mdns *m;
    CHECK(cm_mdns_open_detached(&m) == 0);
    cm_mdns_service svc = {.name = "keep", .port = 7001, .node_id = "abc", .proto_version = 1};
    CHECK(cm_mdns_announce(m, &svc, NULL, 0) == 0);
    cm_mdns_step(m, 1100 + 3100 + 1000); /* and 1 s more: the per-record limit allows a defence */
    CHECK(cm_mdns_is_announced(m));
    static uint8_t buf[2048];
    int len = make_announce(buf, sizeof buf, "keep", 9999, 4500, 120, true);
    cm_mdns_stats st0, st1;
    cm_mdns_get_stats(m, &st0);
    cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    cm_mdns_get_stats(m, &st1);
    CHECK(!strcmp(cm_mdns_current_name(m), "keep") && cm_mdns_is_announced(m));
    CHECK(st1.tx == st0.tx + 1 && sent_has(m, CM_MDNS_T_SRV, CM_MDNS_SEC_ANSWER, 120));
    for (int i = 0; i < 3; i++) cm_mdns_feed(m, buf, (size_t)len, k_peer, CM_MDNS_PORT);
    CHECK(!strcmp(cm_mdns_current_name(m), "keep (2)")); /* our port 7001 sorts before 9999: we yield */
    cm_mdns_close(m);
}

int main(void) {
    RUN(test_names);
    RUN(test_avahi_packet);
    RUN(test_truncation_and_corruption);
    RUN(test_compression_loops);
    RUN(test_roundtrip_and_caps);
    RUN(test_browser);
    RUN(test_responder);
    RUN(test_probe_tiebreak);
    RUN(test_defend_established);
    TEST_END();
}
