/*
 * fuzz_mdns.c: libFuzzer target for the mDNS packet codec and the
 * responder/browser state machines. Input: one UDP payload. Checks: parsing
 * never reads out of bounds or loops; whatever parses re-encodes (names
 * uncompressed) and re-parses to the same questions and records; the same
 * bytes fed to an announcing + browsing detached handle never crash and the
 * instance table stays bounded. Seeds: fuzz/corpus/mdns/ (captured avahi and
 * cumulo traffic, hand-made hostile packets).
 */
#include "base/base.h"
#include "cluster/mdns.h"

#include <stdlib.h>
#include <string.h>

static cm_mdns_msg g_a, g_b;
static uint8_t g_out[1 << 17];
static cm_mdns *g_m;

static void check_roundtrip(void) {
    cm_mdns_writer w;
    cm_mdns_writer_init(&w, g_out, sizeof g_out, g_a.id, g_a.flags);
    for (size_t i = 0; i < g_a.nq; i++)
        cm_mdns_write_question(&w, &g_a.q[i].name, g_a.q[i].type, g_a.q[i].unicast_response);
    for (size_t i = 0; i < g_a.nrr; i++) {
        cm_mdns_rr r = g_a.rr[i];
        /* raw rdata of undecoded types may hold compression pointers that only
         * make sense in the original packet: keep it out of the re-parse */
        if (r.type != CM_MDNS_T_A && r.type != CM_MDNS_T_AAAA && r.type != CM_MDNS_T_PTR && r.type != CM_MDNS_T_SRV &&
            r.type != CM_MDNS_T_TXT) {
            r.type = CM_MDNS_T_TXT;
            r.rdata = (const uint8_t *)"\0";
            r.rdlen = 1;
        }
        if (r.type == CM_MDNS_T_TXT && r.rdlen == 0) {
            r.rdata = (const uint8_t *)"\0";
            r.rdlen = 1;
        }
        cm_mdns_write_rr(&w, (enum cm_mdns_section)r.section, &r);
    }
    int len = cm_mdns_writer_finish(&w);
    if (len == CM_ENOSPACE) return; /* uncompressed it may exceed the mDNS size limit */
    if (len < 0 || cm_mdns_parse(g_out, (size_t)len, &g_b, NULL, 0) != 0) abort();
    if (g_b.nq != g_a.nq || g_b.nrr != g_a.nrr) abort();
    for (size_t i = 0; i < g_a.nq; i++)
        if (!cm_mdns_name_eq(&g_a.q[i].name, &g_b.q[i].name) || g_a.q[i].type != g_b.q[i].type) abort();
    for (size_t i = 0; i < g_a.nrr; i++) {
        const cm_mdns_rr *x = &g_a.rr[i], *y = &g_b.rr[i];
        if (!cm_mdns_name_eq(&x->name, &y->name) || x->ttl != y->ttl) abort();
        if (x->type == CM_MDNS_T_SRV && (x->port != y->port || !cm_mdns_name_eq(&x->target, &y->target))) abort();
        if (x->type == CM_MDNS_T_PTR && !cm_mdns_name_eq(&x->target, &y->target)) abort();
        if (x->type == CM_MDNS_T_A && memcmp(x->addr, y->addr, 4)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > CM_MDNS_PKT_MAX) return 0;
    if (cm_mdns_parse(data, size, &g_a, NULL, 0) == 0) {
        check_roundtrip();
        char text[1100], v[64];
        for (size_t i = 0; i < g_a.nrr; i++) {
            cm_mdns_name_text(&g_a.rr[i].name, text, sizeof text);
            if (g_a.rr[i].type == CM_MDNS_T_TXT) cm_mdns_txt_get(g_a.rr[i].rdata, g_a.rr[i].rdlen, "id", v, sizeof v);
        }
    }
    if (!g_m) {
        cm_mdns_open_detached(&g_m);
        cm_mdns_service svc = {.name = "fuzz", .port = 1, .node_id = "f00", .proto_version = 1};
        cm_mdns_announce(g_m, &svc, NULL, 0);
        cm_mdns_browse(g_m, NULL, NULL);
        cm_mdns_step(g_m, 1100); /* once: probe and announce, so queries get answered */
    }
    static const uint8_t src[4] = {10, 0, 0, 9};
    cm_mdns_feed(g_m, data, size, src, size & 1 ? 5353 : 40000);
    if (cm_mdns_instance_count(g_m) > CM_MDNS_MAX_INSTANCES) abort();
    return 0;
}
