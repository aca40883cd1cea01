/*
 * test_kv_blocks.c: prompt-prefix KV blocks shared copy-on-write
 * (src/model/kv_blocks.c, issue 22).
 *  - 16 sessions take one 1,000-token prefix (cm_session_share_prefix) and
 *    each continues it with a prompt tail of its own: every text and every
 *    token's logprob equals a session that evaluated the whole prompt
 *    itself, in the rows layout (F32 and Q8_0, K and V shared) and the
 *    default transposed F32 layout (K shared, V copied).
 *  - Memory: the process's proportional set size (Pss: a page mapped by k
 *    ranges counts 1/k per range, so it is the physical memory) grows by
 *    about one prefix, not sixteen, and the accounting (private bytes per
 *    session + each store's bytes once) says the same. The identical run
 *    with cm_session_copy_prefix (the copy the shared blocks replace) grows
 *    by sixteen prefixes and fails the same bound: the check can fail.
 *  - Copy on write: sessions truncated into the shared prefix and refilled
 *    with other tokens, or dropped, leave the others' results unchanged;
 *    once every session has let go, the memory is back at the baseline.
 *  Pss is read from /proc/self/smaps_rollup (Linux); elsewhere that part is
 *  a skip.
 */
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "synth/synth.h"
#include "synth_fx.h"
#include "test.h"

#include <unistd.h>

static char errbuf[512];
static int n_skipped;
static const char *g_path;

enum { N = 16, CTX = 2048, PREFIX = 1000, TAIL = 24, GEN = 10 };

static int write_model(const char *path) {
    const cm_synth_params sp = {.arch = "llama",
                                .n_embd = 256,
                                .n_layer = 4,
                                .n_head = 4,
                                .n_head_kv = 4,
                                .n_ff = 512,
                                .n_ctx = CTX,
                                .type = "f32",
                                .seed = 23};
    const int bad = synth_fx_write(&sp, path, errbuf, sizeof errbuf);
    if (bad) fprintf(stderr, "  synth: %s\n", errbuf);
    return bad;
}

/* Proportional set size of this process in bytes, -1 where unknown. */
static long long pss_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Pss: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* ids[0..PREFIX) shared by all; the tail after it differs per seed. */
static void make_prompt(int32_t *ids, int n, int tail_seed) {
    unsigned x = 7;
    for (int i = 0; i < n; i++) {
        if (i == PREFIX) x = 1000u + (unsigned)tail_seed * 7919u;
        x = x * 1664525u + 1013904223u;
        ids[i] = i == 0 ? 1 : 3 + (int32_t)((x >> 9) % 240);
    }
}

typedef struct run {
    int32_t ids[GEN];
    float lp[GEN];
    int n;
} run;

static int on_tok(void *u, const cm_token_event *ev) {
    run *r = u;
    if (ev->id >= 0 && r->n < GEN) {
        r->ids[r->n] = ev->id;
        r->lp[r->n++] = ev->info ? ev->info->logprob : NAN;
    }
    return 0;
}

static void continue_with(cm_session *s, const int32_t *ids, int n, run *r) {
    cm_gen_params p;
    cm_gen_params_default(&p);
    p.sampling.temperature = 0;
    p.n_predict = GEN;
    p.ignore_eos = true;
    cm_gen_result res;
    memset(r, 0, sizeof *r);
    CHECKF(cm_session_set_prompt(s, ids, n, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    CHECKF(cm_session_generate(s, &p, on_tok, r, &res, errbuf, sizeof errbuf) == 0, "%s", errbuf);
}

static bool equal(const run *a, const run *b) {
    return a->n == GEN && b->n == GEN && !memcmp(a->ids, b->ids, sizeof a->ids) && !memcmp(a->lp, b->lp, sizeof a->lp);
}

/* What the sessions hold, shared stores counted once. */
static uint64_t accounted(cm_session **ss, int n, uint64_t *stores) {
    const void *seen[N];
    int n_seen = 0;
    uint64_t b = 0;
    *stores = 0;
    for (int i = 0; i < n; i++) {
        b += cm_session_kv_private(ss[i], -1);
        const void *id;
        const uint64_t sb = cm_session_kv_store(ss[i], &id);
        bool dup = !id;
        for (int k = 0; k < n_seen && !dup; k++) dup = seen[k] == id;
        if (!dup) {
            seen[n_seen++] = id;
            *stores += sb;
        }
    }
    return b + *stores;
}

/* 16 sessions on one prefix, shared (share) or copied; every result against
 * a session that evaluated its whole prompt itself. */
static void sixteen(int kv_type, bool flash, bool share, const char *what, bool measure) {
    cm_engine_opts o = {
        .n_threads = 1, .n_ctx = CTX, .kv_type_k = kv_type, .kv_type_v = kv_type, .kv_transposed = !flash};
    cm_engine *e = NULL;
    if (cm_engine_load(&e, g_path, &o, errbuf, sizeof errbuf)) {
        CHECKF(0, "%s: %s", what, errbuf);
        return;
    }
    static int32_t ids[N][PREFIX + TAIL];
    static run ref[N], got[N];
    for (int i = 0; i < N; i++) make_prompt(ids[i], PREFIX + TAIL, i);
    cm_session *r = cm_session_new(e, CTX, errbuf, sizeof errbuf); /* the reference: evaluates its prompts itself */
    for (int i = 0; i < N; i++) continue_with(r, ids[i], PREFIX + TAIL, &ref[i]);
    cm_session *ss[N];
    for (int i = 0; i < N; i++) ss[i] = cm_session_new(e, CTX, errbuf, sizeof errbuf);
    const long long base = pss_bytes(); /* the sessions made, their caches empty */
    CHECK(cm_session_set_prompt(ss[0], ids[0], PREFIX, errbuf, sizeof errbuf) == 0);
    const uint64_t one = cm_session_kv_bytes(ss[0], PREFIX); /* one prefix held */
    for (int i = 1; i < N; i++) {
        int rc = share ? cm_session_share_prefix(ss[i], ss[0], PREFIX, errbuf, sizeof errbuf)
                       : cm_session_copy_prefix(ss[i], ss[0], PREFIX, errbuf, sizeof errbuf);
        CHECKF(rc == 0, "%s: %s", what, errbuf);
    }
    for (int i = 0; i < N; i++) {
        continue_with(ss[i], ids[i], PREFIX + TAIL, &got[i]);
        CHECKF(equal(&ref[i], &got[i]), "%s: session %d differs from its prompt evaluated alone", what, i);
        const cm_timings t = cm_session_timings(ss[i]);
        CHECKF(t.n_prompt == TAIL, "%s: session %d evaluated %d prompt tokens (the prefix is taken, not evaluated)",
               what, i, t.n_prompt);
    }
    uint64_t stores = 0;
    const uint64_t acc = accounted(ss, N, &stores);
    const long long grown = base >= 0 ? pss_bytes() - base : -1;
    /* beside one prefix, each session's own tail and generated tokens and
     * the partial pages at its regions' ends: a page per region and array,
     * twice over (the prefix's last page, the tail's) */
    const uint64_t own = cm_session_kv_bytes(ss[1], PREFIX + TAIL + GEN) - cm_session_kv_bytes(ss[1], PREFIX);
    const uint64_t bound = one + (uint64_t)N * own + (uint64_t)N * cm_session_kv_bytes(ss[1], 1) * 2 + (2u << 20);
    printf("  %s, %s: one prefix %.2f MiB; 16 sessions: accounted %.2f MiB (stores %.2f), Pss +%.2f MiB, bound "
           "%.2f MiB\n",
           what, share ? "shared" : "copied", one / 1048576.0, acc / 1048576.0, stores / 1048576.0, grown / 1048576.0,
           bound / 1048576.0);
    if (measure && share) {
        CHECKF(acc <= bound, "%s: accounted %llu bytes for 16 sessions of one prefix (%llu), bound %llu", what,
               (unsigned long long)acc, (unsigned long long)one, (unsigned long long)bound);
        CHECKF(stores > 0 && stores <= one, "%s: stores hold %llu bytes", what, (unsigned long long)stores);
        if (grown >= 0) {
            CHECKF(grown <= (long long)bound, "%s: Pss grew %lld bytes, bound %llu", what, grown,
                   (unsigned long long)bound);
            CHECKF(grown + (3 << 20) >= (long long)acc && grown <= (long long)acc + (3 << 20),
                   "%s: Pss grew %lld bytes, accounted %llu", what, grown, (unsigned long long)acc);
        }
    }
    if (measure && !share && grown >= 0) /* the copy this replaces: the same bound fails */
        CHECKF(grown > (long long)bound && grown > 8 * (long long)one,
               "%s: copies grew Pss by %lld only: the measurement cannot tell sharing from copying", what, grown);
    if (share) {
        /* copy on write: session 3 rewrites from position 500, session 0
         * (the store's source) from 700, session 5 is dropped; the rest
         * still equal their references, and the rewritten ones theirs */
        int32_t alt[PREFIX + TAIL];
        memcpy(alt, ids[3], sizeof alt);
        for (int k = 500; k < PREFIX + TAIL; k++) alt[k] = 3 + (alt[k] * 31 + k) % 240;
        run a, ra;
        continue_with(ss[3], alt, PREFIX + TAIL, &a);
        continue_with(r, alt, PREFIX + TAIL, &ra);
        CHECKF(equal(&a, &ra), "%s: a session rewritten inside the shared prefix differs", what);
        memcpy(alt, ids[0], sizeof alt);
        for (int k = 700; k < PREFIX + TAIL; k++) alt[k] = 3 + (alt[k] * 17 + k) % 240;
        continue_with(ss[0], alt, PREFIX + TAIL, &a);
        continue_with(r, alt, PREFIX + TAIL, &ra);
        CHECKF(equal(&a, &ra), "%s: the source rewritten inside the shared prefix differs", what);
        cm_session_kv_drop(ss[5]);
        for (int i = 1; i < N; i++) {
            if (i == 3 || i == 5) continue;
            continue_with(ss[i], ids[i], PREFIX + TAIL, &got[i]);
            CHECKF(equal(&ref[i], &got[i]), "%s: session %d changed after others rewrote the shared prefix", what, i);
        }
        /* a fresh share from a session whose store was partly rewritten (session 3: 500 shared) */
        CHECK(cm_session_share_prefix(ss[5], ss[3], 400, errbuf, sizeof errbuf) == 0);
        continue_with(ss[5], ids[5], PREFIX + TAIL, &got[5]);
        CHECKF(equal(&ref[5], &got[5]), "%s: a prefix shared from a rewritten session differs", what);
    }
    for (int i = 0; i < N; i++) cm_session_kv_drop(ss[i]);
    const long long left = base >= 0 ? pss_bytes() - base : -1;
    if (measure && left >= 0) CHECKF(left < (2 << 20), "%s: %lld bytes remain after every session let go", what, left);
    for (int i = 0; i < N; i++) cm_session_free(ss[i]);
    cm_session_free(r);
    cm_engine_free(e);
}

static void test_share_rows_f32(void) {
    if (pss_bytes() < 0) {
        printf("skip: no /proc/self/smaps_rollup: physical memory not checked\n");
        n_skipped++;
    }
    sixteen(CM_TYPE_F32, true, true, "f32 rows", true);
}
static void test_copy_rows_f32(void) { sixteen(CM_TYPE_F32, true, false, "f32 rows", true); }
static void test_share_q8_0(void) { sixteen(CM_TYPE_Q8_0, false, true, "q8_0 rows", false); }
static void test_share_transposed(void) { sixteen(CM_TYPE_F32, false, true, "f32 transposed", false); }

int main(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/cumulo-test-kvblocks-%d.gguf", (int)getpid());
    if (write_model(path)) return 1;
    g_path = path;
    RUN(test_share_rows_f32);
    RUN(test_copy_rows_f32);
    RUN(test_share_q8_0);
    RUN(test_share_transposed);
    unlink(path);
    TEST_END_SKIPPED(n_skipped);
}
