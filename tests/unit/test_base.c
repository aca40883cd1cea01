/* test_base.c: base (errors, arena, buf, rng), tensor (types, f16/bf16) and
 * os (thread pool, barrier, file map) through their public headers. */
#include "test.h"

#include "base/base.h"
#include "os/os.h"
#include "tensor/tensor.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

static void test_errors(void) {
    char e[64];
    CHECK(cm_errf(e, sizeof e, CM_EFORMAT, "bad '%s'", "x") == CM_EFORMAT);
    CHECK(!strcmp(e, "bad 'x'"));
    CHECK(!strcmp(cm_strerror(CM_ENOENT), "no such file"));
    CHECK(!strcmp(cm_strerror(12345), "unknown error"));
    uint64_t r;
    CHECK(!cm_mul_ok(UINT64_MAX / 2, 3, &r));
    CHECK(cm_mul_ok(1u << 20, 1u << 20, &r) && r == (1ull << 40));
    CHECK(!cm_add_ok(UINT64_MAX, 1, &r));
}

static void test_arena_buf(void) {
    cm_arena a;
    cm_arena_init(&a, 128);
    for (int i = 0; i < 100; i++) {
        char *p = cm_arena_alloc(&a, 100);
        CHECK(p && ((uintptr_t)p & 15) == 0);
        memset(p, i, 100);
    }
    cm_arena_release(&a);
    cm_buf b;
    cm_buf_init(&b);
    for (int i = 0; i < 1000; i++) cm_buf_printf(&b, "%d,", i);
    CHECK(b.len > 3000 && !strncmp(b.data, "0,1,2,", 6));
    cm_buf_release(&b);
}

static void test_rng(void) {
    cm_rng a, b;
    cm_rng_seed(&a, 42);
    cm_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) CHECK(cm_rng_next(&a) == cm_rng_next(&b));
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        float x = cm_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    CHECK(fabs(s / 100000) < 0.02 && fabs(s2 / 100000 - 1) < 0.03);
}

static void test_types(void) {
    CHECK(cm_type_traits_of(CM_TYPE_Q4_K)->type_size == 144);
    CHECK(cm_type_traits_of(4) == NULL); /* removed Q4_2 */
    CHECK(cm_type_traits_of(999) == NULL);
    CHECK(cm_type_from_name("Q6_K") == CM_TYPE_Q6_K);
    CHECK(cm_type_from_name("nope") == -1);
    CHECK(cm_row_size(CM_TYPE_Q8_0, 64) == 68);
    CHECK(cm_row_size(CM_TYPE_Q8_0, 65) == 0);
}

static void test_f16(void) {
    /* every half value round-trips through float exactly */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* nan */
        if (cm_f32_to_f16(cm_f16_to_f32((cm_f16)h)) != h) bad++;
    }
    CHECK(bad == 0);
    CHECK(cm_f16_to_f32(0x3c00) == 1.0f);
    CHECK(cm_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(cm_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie -> even */
    CHECK(cm_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02); /* tie -> even (up) */
    CHECK(cm_f32_to_f16(5.9604645e-08f) == 1);          /* smallest subnormal */
    CHECK(cm_bf16_to_f32(cm_f32_to_bf16(1.5f)) == 1.5f);
}

typedef struct {
    _Atomic int64_t sum;
    int64_t parts[8];
    int phases_ok;
} pool_ctx;

static void pool_job(void *vctx, int ith, int nth) {
    pool_ctx *c = vctx;
    int64_t b, e;
    cm_split_range(1000, ith, nth, &b, &e);
    int64_t s = 0;
    for (int64_t i = b; i < e; i++) s += i;
    c->parts[ith] = s;
    atomic_fetch_add(&c->sum, s);
}

static cm_pool *g_pool;
static void barrier_job(void *vctx, int ith, int nth) {
    pool_ctx *c = vctx;
    for (int round = 0; round < 50; round++) {
        c->parts[ith] = round;
        cm_pool_barrier(g_pool);
        int ok = 1;
        for (int j = 0; j < nth; j++) ok &= c->parts[j] == round;
        if (ith == 0 && ok) c->phases_ok++;
        cm_pool_barrier(g_pool);
    }
}

/* cm_pool_loop: loops of several sizes in one run, more of them than
 * CM_POOL_LOOPS (the rest fall back to cm_split_range parts); every unit
 * exactly once. In loop 1 thread 0 starts late (it sleeps), so the others
 * must take units of its part. */
enum { LOOP_N = CM_POOL_LOOPS + 4, LOOP_MAXU = 1000 };
typedef struct {
    _Atomic int count[LOOP_N][LOOP_MAXU];
    _Atomic int by[LOOP_N][LOOP_MAXU]; /* 1 + the thread that took the unit */
    int bad;
} loop_ctx;

static int64_t loop_units(int l) {
    static const int64_t sizes[] = {0, 1000, 1, 3, 7, 100, 999};
    return sizes[l % 7];
}

static void loop_job(void *vctx, int ith, int nth) {
    loop_ctx *c = vctx;
    for (int l = 0; l < LOOP_N; l++) {
        const int64_t n = loop_units(l);
        cm_pool_loop lp;
        cm_pool_loop_begin(&lp, g_pool, n, ith, nth);
        if (l == 1 && ith == 0 && nth > 1) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        int64_t b, e;
        while (cm_pool_loop_next(&lp, &b, &e)) {
            if (b < 0 || e > n || b >= e) c->bad++;
            for (int64_t i = CM_MAX(0, b); i < CM_MIN(n, e); i++) {
                atomic_fetch_add(&c->count[l][i], 1);
                atomic_store(&c->by[l][i], 1 + ith);
            }
        }
    }
}

static void test_pool_loop(void) {
    static loop_ctx c;
    for (int n = 1; n <= 4; n++) {
        cm_pool *p = cm_pool_new(n);
        g_pool = p;
        for (int run = 0; run < (n > 1 ? 3 : 1); run++) {
            memset(&c, 0, sizeof c);
            cm_pool_run(p, loop_job, &c);
            CHECK(c.bad == 0);
            for (int l = 0; l < LOOP_N; l++)
                for (int64_t i = 0; i < loop_units(l); i++)
                    CHECKF(atomic_load(&c.count[l][i]) == 1, "n=%d loop %d unit %lld taken %d times", n, l,
                           (long long)i, atomic_load(&c.count[l][i]));
            if (n > 1) { /* thread 0's part of loop 1, [0, 1000 / n), mostly taken by the others */
                int others = 0;
                for (int64_t i = 0; i < 1000 / n; i++) others += atomic_load(&c.by[1][i]) != 1;
                CHECKF(others > 0, "n=%d: no unit of the sleeping thread's part was taken by another", n);
            }
        }
        cm_pool_free(p);
    }
}

static void test_pool(void) {
    for (int n = 1; n <= 4; n++) {
        cm_pool *p = cm_pool_new(n);
        g_pool = p;
        for (int k = 0; k < 200; k++) {
            pool_ctx c = {0};
            cm_pool_run(p, pool_job, &c);
            CHECK(atomic_load(&c.sum) == 499500);
        }
        pool_ctx c = {0};
        cm_pool_run(p, barrier_job, &c);
        CHECKF(c.phases_ok == 50, "n=%d phases_ok=%d", n, c.phases_ok);
        cm_pool_free(p);
    }
}

static void test_file(void) {
    char err[256];
    cm_mapped_file f;
    CHECK(cm_file_map(&f, "/nonexistent/x.gguf", err, sizeof err) == CM_ENOENT);
    CHECK(strstr(err, "no such file") != NULL);
    const char *path = "/tmp/cumulo-test-base.bin";
    CHECK(cm_file_write_atomic(path, "hello", 5, 0600, err, sizeof err) == 0);
    CHECK(cm_file_map(&f, path, err, sizeof err) == 0 && f.size == 5 && !memcmp(f.data, "hello", 5));
    cm_file_unmap(&f);
    remove(path);
    CHECK(cm_cpu_count() >= 1 && cm_mem_total_bytes() > 0);
}

/* The environment is read once (cm_config_get) and again on reload; every
 * variable of the table is documented in docs/DESIGN.md (run from the
 * repository root, as tests/run.sh does). */
static void test_config(void) {
    setenv("CUMULO_PREFILL_CHUNK", "7", 1);
    setenv("CUMULO_LOST_MS", "150", 1); /* below the floor of 200: ignored */
    setenv("CUMULO_MEM_OFFER", "3K", 1);
    unsetenv("CUMULO_ISA");
    cm_config_reload();
    const cm_config *c = cm_config_get();
    CHECK(c->prefill_chunk == 7 && c->lost_ms == 0 && c->mem_offer == 3072 && !strcmp(c->isa, "best"));
    setenv("CUMULO_LOST_MS", "250", 1);
    unsetenv("CUMULO_PREFILL_CHUNK");
    unsetenv("CUMULO_MEM_OFFER");
    cm_config_reload();
    c = cm_config_get();
    CHECK(c->prefill_chunk == 32 && c->lost_ms == 250 && c->mem_offer == -1);
    unsetenv("CUMULO_LOST_MS");
    cm_config_reload();
    FILE *f = fopen("docs/DESIGN.md", "rb");
    CHECKF(f != NULL, "docs/DESIGN.md: run from the repository root");
    if (!f) return;
    static char doc[1 << 20];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    int nv;
    const cm_config_var *v = cm_config_vars(&nv);
    CHECK(nv > 20);
    for (int i = 0; i < nv; i++) {
        char name[64];
        snprintf(name, sizeof name, "`%s`", v[i].name);
        CHECKF(strstr(doc, name) != NULL, "%s is not in docs/DESIGN.md's configuration table", v[i].name);
    }
}

/* The cache directory chain shared by the models directory (hub) and the
 * kernels' tuning files (model/tune_cache.c). */
static void test_cache_dir(void) {
    char d[64], home[512] = "";
    if (cm_config_get()->home) snprintf(home, sizeof home, "%s", cm_config_get()->home);
    setenv("XDG_CACHE_HOME", "/c", 1);
    setenv("HOME", "/h", 1);
    cm_config_reload();
    CHECK(cm_cache_dir("/x/tune", "tune", d, sizeof d) == 0 && !strcmp(d, "/x/tune"));
    CHECK(cm_cache_dir(NULL, "tune", d, sizeof d) == 0 && !strcmp(d, "/c/cumulo/tune"));
    unsetenv("XDG_CACHE_HOME");
    cm_config_reload();
    CHECK(cm_cache_dir(NULL, "models", d, sizeof d) == 0 && !strcmp(d, "/h/.cache/cumulo/models"));
    CHECK(cm_cache_dir(NULL, "models", d, 23) == CM_ERANGE); /* 23 bytes: one short */
    CHECK(cm_cache_dir(NULL, "models", d, 24) == 0);
    unsetenv("HOME");
    cm_config_reload();
    CHECK(cm_cache_dir(NULL, "models", d, sizeof d) == CM_ENOENT);
    CHECK(cm_cache_dir("/x", "models", d, sizeof d) == 0 && !strcmp(d, "/x"));
    if (home[0]) setenv("HOME", home, 1);
    cm_config_reload();
}

int main(void) {
    RUN(test_config);
    RUN(test_cache_dir);
    RUN(test_errors);
    RUN(test_arena_buf);
    RUN(test_rng);
    RUN(test_types);
    RUN(test_f16);
    RUN(test_pool);
    RUN(test_pool_loop);
    RUN(test_file);
    TEST_END();
}
