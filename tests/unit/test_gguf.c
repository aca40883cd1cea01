/*
 * test_gguf.c: the GGUF reader and writer.
 *
 * Real files (stories260K from ../shared) are read and checked against what
 * gguf_info.py reports for them; rewriting them with our writer must give the
 * same bytes (ggml's writer made them, and llama.cpp loads them); a file with
 * every value type must round-trip and read identically in gguf_info.py (an
 * independent reader); and a set of malformed files built here (every
 * truncation, seeded byte flips, huge counts and lengths, bad offsets, shapes,
 * types, alignment, duplicates, versions) must each give an error with a
 * message — never a crash, an overread (ASan) or a leak.
 * Checked once by hand (the oracle is not in CI): stories260K-q4_0 copied by
 * our writer with alignment 64 and 1024 loads in llama.cpp (node-llama-cpp
 * 3.21.1) and gives the same 16 greedy ids as the original file.
 */
#include "gguf/gguf.h"
#include "test.h"

#include <unistd.h>

static char err[512];

/* ---- real files ---- */

typedef struct {
    int calls;
    uint64_t last_done, last_total;
    bool monotonic;
} prog;
static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    prog *p = ctx;
    if (done < p->last_done) p->monotonic = false;
    p->calls++;
    p->last_done = done;
    p->last_total = total;
}

static bool str_eq(cm_gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

static void check_stories(const char *file, uint64_t nkv, uint32_t wtype, uint64_t data_offset, size_t size) {
    cm_gguf g;
    prog pr = {.monotonic = true};
    int rc = cm_gguf_open(&g, t_shared(file), on_progress, &pr, err, sizeof err);
    CHECKF(rc == 0, "%s: %s", file, err);
    if (rc) return;
    CHECK(g.version == 3);
    CHECKF(g.n_kv == nkv, "%s: %llu kvs", file, (unsigned long long)g.n_kv);
    CHECK(g.n_tensors == 48);
    CHECK(g.alignment == 32);
    CHECKF(g.data_offset == data_offset, "%s: data at %llu", file, (unsigned long long)g.data_offset);
    CHECK(g.size == size);
    CHECK(pr.calls >= 1 && pr.monotonic && pr.last_done == pr.last_total && pr.last_total == size - data_offset);

    char *arch = cm_gguf_get_str(&g, "general.architecture");
    CHECK(arch && strcmp(arch, "llama") == 0);
    cm_free(arch);
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    CHECK(cm_gguf_get_u64(&g, "llama.embedding_length", &u) && u == 64);
    CHECK(cm_gguf_get_u64(&g, "llama.block_count", &u) && u == 5);
    CHECK(cm_gguf_get_u64(&g, "llama.feed_forward_length", &u) && u == 172);
    CHECK(cm_gguf_get_u64(&g, "llama.attention.head_count", &u) && u == 8);
    CHECK(cm_gguf_get_i64(&g, "llama.attention.head_count_kv", &i) && i == 4);
    CHECK(cm_gguf_get_u64(&g, "llama.context_length", &u) && u == 512);
    CHECK(cm_gguf_get_f64(&g, "llama.attention.layer_norm_rms_epsilon", &f) && fabs(f - 1e-5) < 1e-10);
    CHECK(!cm_gguf_get_u64(&g, "general.architecture", &u)); /* wrong type */
    CHECK(!cm_gguf_get_u64(&g, "no.such.key", &u));
    CHECK(cm_gguf_find_kv(&g, "no.such.key") == NULL);
    const cm_gguf_kv *tok = cm_gguf_find_kv(&g, "tokenizer.ggml.tokens");
    cm_gguf_str s;
    CHECK(tok && tok->type == CM_GGUF_ARRAY && tok->arr_type == CM_GGUF_STRING && tok->arr_len == 512);
    CHECK(cm_gguf_arr_str(tok, 0, &s) && str_eq(s, "<unk>"));
    CHECK(cm_gguf_arr_str(tok, 1, &s) && str_eq(s, "<s>"));
    CHECK(cm_gguf_arr_str(tok, 3, &s) && str_eq(s, "<0x00>"));
    CHECK(!cm_gguf_arr_str(tok, 512, &s));
    CHECK(!cm_gguf_arr_i64(tok, 0, &i));
    const cm_gguf_kv *tt = cm_gguf_find_kv(&g, "tokenizer.ggml.token_type");
    CHECK(tt && tt->arr_type == CM_GGUF_I32 && tt->arr_len == 512);
    CHECK(cm_gguf_arr_i64(tt, 0, &i) && i == 2);
    CHECK(cm_gguf_arr_i64(tt, 1, &i) && i == 3);
    CHECK(cm_gguf_arr_i64(tt, 3, &i) && i == 6);
    CHECK(cm_gguf_arr_f64(tt, 3, &f) && f == 6.0);
    CHECK(!cm_gguf_arr_i64(tt, 512, &i));
    const cm_gguf_kv *sc = cm_gguf_find_kv(&g, "tokenizer.ggml.scores");
    CHECK(sc && sc->arr_type == CM_GGUF_F32 && sc->arr_len == 512 && cm_gguf_arr_f64(sc, 0, &f) && f == 0);
    CHECK(cm_gguf_get_u64(&g, "tokenizer.ggml.bos_token_id", &u) && u == 1);
    CHECK(cm_gguf_get_u64(&g, "tokenizer.ggml.eos_token_id", &u) && u == 2);

    const cm_gguf_tensor_info *t = cm_gguf_find_tensor(&g, "token_embd.weight");
    CHECK(t && t->type == wtype && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 && t->offset == 0);
    CHECK(t && t->data == g.base + g.data_offset);
    t = cm_gguf_find_tensor(&g, "blk.0.ffn_down.weight");
    CHECK(t && t->type == CM_TYPE_F32 && t->ne[0] == 172 && t->ne[1] == 64 && t->nbytes == 172 * 64 * 4);
    t = cm_gguf_find_tensor(&g, "output_norm.weight");
    CHECK(t && t->type == CM_TYPE_F32 && t->n_dims == 1 && t->ne[0] == 64 && t->ne[1] == 1);
    CHECK(cm_gguf_find_tensor(&g, "blk.5.attn_q.weight") == NULL);
    uint64_t end = 0;
    for (uint64_t k = 0; k < g.n_tensors; k++) {
        const cm_gguf_tensor_info *x = &g.tensors[k];
        CHECK(cm_gguf_find_tensor(&g, x->name) == x);
        CHECK((const uint8_t *)x->data >= g.base + g.data_offset &&
              (const uint8_t *)x->data + x->nbytes <= g.base + g.size);
        CHECK(x->nbytes == cm_row_size(x->type, x->ne[0]) * (uint64_t)(x->ne[1] * x->ne[2] * x->ne[3]));
        end = CM_MAX(end, g.data_offset + x->offset + x->nbytes);
    }
    CHECK(end == size); /* the last tensor ends the file */
    cm_gguf_close(&g);
    cm_gguf_close(&g); /* twice is harmless */
}

static void test_stories_files(void) {
    check_stories("models/stories260K-f32.gguf", 18, CM_TYPE_F32, 14144, 1185344);
    check_stories("models/stories260K-q8_0.gguf", 19, CM_TYPE_Q8_0, 14176, 489184);
    check_stories("models/stories260K-q4_0.gguf", 19, CM_TYPE_Q4_0, 14176, 370656);
}

/* cm_gguf_load reads the file into (huge-page) memory: the same parse, the
 * same bytes, the whole file reported as read; a missing file is CM_ENOENT. */
static void test_load_in_memory(void) {
    const char *files[] = {"models/stories260K-f32.gguf", "models/stories260K-q4_0.gguf"};
    for (int f = 0; f < 2; f++) {
        cm_gguf m, l;
        prog pr = {.monotonic = true};
        CHECK(cm_gguf_open(&m, t_shared(files[f]), NULL, NULL, err, sizeof err) == 0);
        int rc = cm_gguf_load(&l, t_shared(files[f]), on_progress, &pr, err, sizeof err);
        CHECKF(rc == 0, "%s: %s", files[f], err);
        if (rc) {
            cm_gguf_close(&m);
            continue;
        }
        CHECK(l.file.in_memory && !m.file.in_memory);
        CHECK(l.size == m.size && l.n_tensors == m.n_tensors && l.n_kv == m.n_kv && l.data_offset == m.data_offset);
        CHECK(memcmp(l.base, m.base, m.size) == 0 && l.base != m.base);
        CHECK(((uintptr_t)l.base & 4095) == 0);
        CHECK(pr.calls >= 1 && pr.monotonic && pr.last_done == pr.last_total && pr.last_total == m.size);
        for (uint64_t t = 0; t < m.n_tensors; t++) {
            const cm_gguf_tensor_info *x = &m.tensors[t], *y = cm_gguf_find_tensor(&l, x->name);
            CHECK(y && y->nbytes == x->nbytes && !memcmp(y->data, x->data, (size_t)x->nbytes));
            CHECK(y && (const uint8_t *)y->data >= l.base && (const uint8_t *)y->data + y->nbytes <= l.base + l.size);
        }
        cm_gguf_close(&l);
        cm_gguf_close(&l); /* twice is harmless */
        cm_gguf_close(&m);
    }
    cm_gguf g;
    int rc = cm_gguf_load(&g, "/nonexistent/y.gguf", NULL, NULL, err, sizeof err);
    CHECKF(rc == CM_ENOENT && strstr(err, "y.gguf"), "%d %s", rc, err);
    /* Big enough for huge pages: 2 MiB aligned (Linux), zeroed, freed whole. */
    size_t n = (size_t)5 << 20;
    uint8_t *h = cm_huge_alloc(n);
    CHECK(h != NULL);
    if (h) {
#if defined(__linux__)
        CHECK(((uintptr_t)h & ((2u << 20) - 1)) == 0);
#endif
        CHECK(h[0] == 0 && h[n - 1] == 0);
        memset(h, 7, n);
        cm_huge_free(h, n);
    }
#if defined(__linux__)
    /* A size whose last huge page is at least half used maps it whole, so
     * that a huge page can back the end too (a 4 KiB-page tail streamed
     * several times slower: HISTORY.md, session 22, tp); a shorter tail does
     * not (at most 1 MiB unused). Free unmaps all of it. */
    const size_t sizes[2] = {((size_t)5 << 20) + 4096 + 1, ((size_t)4 << 20) + 4096};
    const unsigned long long spans[2] = {6ull << 20, (4ull << 20) + 4096};
    for (int i = 0; i < 2; i++) {
        n = sizes[i];
        h = cm_huge_alloc(n);
        CHECK(h != NULL);
        if (!h) continue;
        CHECK(h[n - 1] == 0);
        unsigned long long want = (unsigned long long)(uintptr_t)h, lo = 0, hi = 0, a, b;
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "%llx-%llx", &a, &b) == 2 && a <= want && want < b) lo = a, hi = b;
        if (f) fclose(f);
        CHECKF(lo == want && hi - lo == spans[i], "%zu bytes: mapping [%llx, %llx) for %p", n, lo, hi, (void *)h);
        cm_huge_free(h, n);
        bool still = false;
        f = fopen("/proc/self/maps", "r");
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "%llx-%llx", &a, &b) == 2 && a < want + spans[i] && b > want) still = true;
        if (f) fclose(f);
        CHECK(!still);
    }
#endif
    /* The policy: CUMULO_MMAP set means map; an impossible size never fits. */
    CHECK(!cm_gguf_worth_loading((uint64_t)1 << 62) || cm_mem_available_bytes() == 0);
    setenv("CUMULO_MMAP", "1", 1);
    cm_config_reload();
    CHECK(!cm_gguf_worth_loading(4096));
    setenv("CUMULO_MMAP", "0", 1);
    cm_config_reload();
    CHECK(cm_gguf_worth_loading(4096));
    unsetenv("CUMULO_MMAP");
    cm_config_reload();
}

/* Copying every kv and tensor through our writer reproduces the file byte for byte. */
static void test_rewrite_identical(void) {
    const char *files[] = {"models/stories260K-f32.gguf", "models/stories260K-q8_0.gguf",
                           "models/stories260K-q4_0.gguf"};
    for (size_t f = 0; f < CM_ARRAY_LEN(files); f++) {
        cm_gguf g;
        int rc = cm_gguf_open(&g, t_shared(files[f]), NULL, NULL, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        if (rc) continue;
        cm_gguf_writer *w = cm_gguf_writer_new(g.alignment);
        for (uint64_t i = 0; i < g.n_kv; i++) cm_gguf_w_copy_kv(w, &g.kv[i]);
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const cm_gguf_tensor_info *t = &g.tensors[i];
            cm_gguf_w_tensor(w, t->name, (enum cm_type)t->type, t->n_dims, t->ne, t->data);
        }
        cm_buf b;
        cm_buf_init(&b);
        rc = cm_gguf_writer_write_buf(w, &b, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        CHECKF(b.len == g.size && memcmp(b.data, g.base, g.size) == 0, "%s: rewritten %zu bytes vs %zu", files[f],
               b.len, g.size);
        cm_buf_release(&b);
        cm_gguf_writer_free(w);
        cm_gguf_close(&g);
    }
}

/* ---- a file with every value type ---- */

static const float k_f32[6] = {1.5f, -2.25f, 0.0f, 3.0e38f, -1e-30f, 7.0f};
static const int64_t k_ne_q[2] = {64, 3};
static const int64_t k_ne_f[1] = {5};
static uint8_t k_qdata[3 * 2 * 18];

static cm_gguf_writer *build_all(uint32_t alignment) {
    for (size_t i = 0; i < sizeof k_qdata; i++) k_qdata[i] = (uint8_t)(i * 7 + 1);
    cm_gguf_writer *w = cm_gguf_writer_new(alignment);
    cm_gguf_w_str(w, "general.architecture", "llama");
    cm_gguf_w_u8(w, "t.u8", 200);
    cm_gguf_w_i8(w, "t.i8", -5);
    cm_gguf_w_u16(w, "t.u16", 65535);
    cm_gguf_w_i16(w, "t.i16", -32768);
    cm_gguf_w_u32(w, "t.u32", 4000000000u);
    cm_gguf_w_i32(w, "t.i32", -2000000000);
    cm_gguf_w_u64(w, "t.u64", UINT64_MAX);
    cm_gguf_w_i64(w, "t.i64", INT64_MIN);
    cm_gguf_w_f32(w, "t.f32", 3.25f);
    cm_gguf_w_f64(w, "t.f64", -1.0 / 3.0);
    cm_gguf_w_bool(w, "t.true", true);
    cm_gguf_w_bool(w, "t.false", false);
    cm_gguf_w_str(w, "t.str", "h\xc3\xa9llo \xe2\x96\x81world");
    cm_gguf_w_str(w, "t.empty", "");
    uint8_t a_u8[3] = {0, 128, 255};
    int8_t a_i8[3] = {-128, 0, 127};
    uint16_t a_u16[2] = {1, 65535};
    int16_t a_i16[2] = {-300, 300};
    uint32_t a_u32[2] = {7, 4294967295u};
    int32_t a_i32[4] = {2, 3, -1, 6};
    uint64_t a_u64[2] = {0, UINT64_MAX};
    int64_t a_i64[2] = {INT64_MIN, INT64_MAX};
    bool a_b[3] = {true, false, true};
    double a_f64[2] = {0.1, -1e300};
    cm_gguf_w_arr(w, "a.u8", CM_GGUF_U8, a_u8, 3);
    cm_gguf_w_arr(w, "a.i8", CM_GGUF_I8, a_i8, 3);
    cm_gguf_w_arr(w, "a.u16", CM_GGUF_U16, a_u16, 2);
    cm_gguf_w_arr(w, "a.i16", CM_GGUF_I16, a_i16, 2);
    cm_gguf_w_arr(w, "a.u32", CM_GGUF_U32, a_u32, 2);
    cm_gguf_w_arr(w, "a.i32", CM_GGUF_I32, a_i32, 4);
    cm_gguf_w_arr(w, "a.u64", CM_GGUF_U64, a_u64, 2);
    cm_gguf_w_arr(w, "a.i64", CM_GGUF_I64, a_i64, 2);
    cm_gguf_w_arr(w, "a.f32", CM_GGUF_F32, k_f32, 6);
    cm_gguf_w_arr(w, "a.bool", CM_GGUF_BOOL, a_b, 3);
    cm_gguf_w_arr(w, "a.f64", CM_GGUF_F64, a_f64, 2);
    cm_gguf_w_arr(w, "a.empty", CM_GGUF_I32, NULL, 0);
    cm_gguf_str strs[4] = {{"<unk>", 5}, {"", 0}, {"\xe2\x96\x81the", 6}, {"a\0b", 3}};
    cm_gguf_w_arr_str(w, "a.str", strs, 4);
    cm_gguf_w_tensor(w, "t.q", CM_TYPE_Q4_0, 2, k_ne_q, k_qdata);
    cm_gguf_w_tensor(w, "t.f", CM_TYPE_F32, 1, k_ne_f, k_f32);
    return w;
}

static void check_all(const cm_gguf *g, uint32_t alignment) {
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    cm_gguf_str s;
    CHECK(g->version == 3 && g->alignment == alignment && g->n_tensors == 2);
    CHECK(g->n_kv == 28 + (alignment != 32));
    CHECK(cm_gguf_get_u64(g, "t.u8", &u) && u == 200 && cm_gguf_find_kv(g, "t.u8")->type == CM_GGUF_U8);
    CHECK(cm_gguf_get_i64(g, "t.i8", &i) && i == -5 && !cm_gguf_get_u64(g, "t.i8", &u));
    CHECK(cm_gguf_get_u64(g, "t.u16", &u) && u == 65535);
    CHECK(cm_gguf_get_i64(g, "t.i16", &i) && i == -32768);
    CHECK(cm_gguf_get_u64(g, "t.u32", &u) && u == 4000000000u);
    CHECK(cm_gguf_get_i64(g, "t.i32", &i) && i == -2000000000);
    CHECK(cm_gguf_get_u64(g, "t.u64", &u) && u == UINT64_MAX && !cm_gguf_get_i64(g, "t.u64", &i));
    CHECK(cm_gguf_get_i64(g, "t.i64", &i) && i == INT64_MIN);
    CHECK(cm_gguf_get_f64(g, "t.f32", &f) && f == 3.25 && cm_gguf_find_kv(g, "t.f32")->type == CM_GGUF_F32);
    CHECK(cm_gguf_get_f64(g, "t.f64", &f) && f == -1.0 / 3.0);
    CHECK(cm_gguf_get_f64(g, "t.i32", &f) && f == -2000000000.0);
    CHECK(cm_gguf_get_bool(g, "t.true", &b) && b);
    CHECK(cm_gguf_get_bool(g, "t.false", &b) && !b);
    CHECK(!cm_gguf_get_bool(g, "t.u8", &b));
    char *str = cm_gguf_get_str(g, "t.str");
    CHECK(str && strcmp(str, "h\xc3\xa9llo \xe2\x96\x81world") == 0);
    cm_free(str);
    str = cm_gguf_get_str(g, "t.empty");
    CHECK(str && str[0] == 0);
    cm_free(str);
    CHECK(cm_gguf_get_str(g, "t.u8") == NULL);
    const cm_gguf_kv *kv;
    kv = cm_gguf_find_kv(g, "a.u8");
    CHECK(kv && kv->arr_type == CM_GGUF_U8 && kv->arr_len == 3 && cm_gguf_arr_i64(kv, 2, &i) && i == 255);
    kv = cm_gguf_find_kv(g, "a.i8");
    CHECK(kv && cm_gguf_arr_i64(kv, 0, &i) && i == -128 && cm_gguf_arr_i64(kv, 2, &i) && i == 127);
    kv = cm_gguf_find_kv(g, "a.u16");
    CHECK(kv && cm_gguf_arr_i64(kv, 1, &i) && i == 65535);
    kv = cm_gguf_find_kv(g, "a.i16");
    CHECK(kv && cm_gguf_arr_i64(kv, 0, &i) && i == -300 && cm_gguf_arr_f64(kv, 1, &f) && f == 300);
    kv = cm_gguf_find_kv(g, "a.u32");
    CHECK(kv && cm_gguf_arr_i64(kv, 1, &i) && i == 4294967295);
    kv = cm_gguf_find_kv(g, "a.i32");
    CHECK(kv && kv->arr_len == 4 && cm_gguf_arr_i64(kv, 2, &i) && i == -1 && kv->arr_nbytes == 16);
    kv = cm_gguf_find_kv(g, "a.u64");
    CHECK(kv && !cm_gguf_arr_i64(kv, 1, &i) && cm_gguf_arr_f64(kv, 1, &f) && f == 18446744073709551615.0);
    kv = cm_gguf_find_kv(g, "a.i64");
    CHECK(kv && cm_gguf_arr_i64(kv, 0, &i) && i == INT64_MIN && cm_gguf_arr_i64(kv, 1, &i) && i == INT64_MAX);
    kv = cm_gguf_find_kv(g, "a.f32");
    CHECK(kv && kv->arr_len == 6);
    for (int k = 0; k < 6; k++) CHECK(kv && cm_gguf_arr_f64(kv, (uint64_t)k, &f) && f == (double)k_f32[k]);
    CHECK(kv && !cm_gguf_arr_i64(kv, 0, &i));
    kv = cm_gguf_find_kv(g, "a.bool");
    CHECK(kv && kv->arr_type == CM_GGUF_BOOL && kv->arr_len == 3 && kv->arr_data[0] == 1 && kv->arr_data[1] == 0);
    kv = cm_gguf_find_kv(g, "a.f64");
    CHECK(kv && cm_gguf_arr_f64(kv, 0, &f) && f == 0.1 && cm_gguf_arr_f64(kv, 1, &f) && f == -1e300);
    kv = cm_gguf_find_kv(g, "a.empty");
    CHECK(kv && kv->arr_len == 0 && !cm_gguf_arr_i64(kv, 0, &i));
    kv = cm_gguf_find_kv(g, "a.str");
    CHECK(kv && kv->arr_type == CM_GGUF_STRING && kv->arr_len == 4);
    CHECK(cm_gguf_arr_str(kv, 0, &s) && str_eq(s, "<unk>"));
    CHECK(cm_gguf_arr_str(kv, 1, &s) && s.len == 0);
    CHECK(cm_gguf_arr_str(kv, 2, &s) && str_eq(s, "\xe2\x96\x81the"));
    CHECK(cm_gguf_arr_str(kv, 3, &s) && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
    CHECK(!cm_gguf_arr_str(kv, 4, &s) && !cm_gguf_arr_f64(kv, 0, &f));
    const cm_gguf_tensor_info *t = cm_gguf_find_tensor(g, "t.q");
    CHECK(t && t->type == CM_TYPE_Q4_0 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 3 && t->ne[2] == 1 &&
          t->nbytes == sizeof k_qdata && t->offset == 0);
    CHECK(t && memcmp(t->data, k_qdata, sizeof k_qdata) == 0);
    CHECK(t && (g->data_offset % alignment) == 0);
    t = cm_gguf_find_tensor(g, "t.f");
    uint64_t want_off = (sizeof k_qdata + alignment - 1) / alignment * alignment;
    CHECK(t && t->type == CM_TYPE_F32 && t->ne[0] == 5 && t->nbytes == 20 && t->offset == want_off);
    CHECK(t && memcmp(t->data, k_f32, 20) == 0);
}

static void test_roundtrip(void) {
    uint32_t aligns[] = {32, 8, 64, 4096}; /* GGUF requires a multiple of 8 (test_gguf_bad refuses 4) */
    for (size_t a = 0; a < CM_ARRAY_LEN(aligns); a++) {
        cm_gguf_writer *w = build_all(aligns[a]);
        cm_buf b;
        cm_buf_init(&b);
        int rc = cm_gguf_writer_write_buf(w, &b, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        cm_gguf g;
        rc = cm_gguf_parse(&g, (const uint8_t *)b.data, b.len, err, sizeof err);
        CHECKF(rc == 0, "align %u: %s", aligns[a], err);
        if (!rc) check_all(&g, aligns[a]);
        /* And again through copy_kv: the copy must be byte-identical. */
        if (!rc) {
            cm_gguf_writer *w2 = cm_gguf_writer_new(32);
            for (uint64_t i = 0; i < g.n_kv; i++) cm_gguf_w_copy_kv(w2, &g.kv[i]);
            for (uint64_t i = 0; i < g.n_tensors; i++)
                cm_gguf_w_tensor(w2, g.tensors[i].name, (enum cm_type)g.tensors[i].type, g.tensors[i].n_dims,
                                 g.tensors[i].ne, g.tensors[i].data);
            cm_buf b2;
            cm_buf_init(&b2);
            rc = cm_gguf_writer_write_buf(w2, &b2, err, sizeof err);
            CHECKF(rc == 0, "%s", err);
            if (aligns[a] == 32) CHECK(b2.len == b.len && memcmp(b2.data, b.data, b.len) == 0);
            cm_buf_release(&b2);
            cm_gguf_writer_free(w2);
        }
        cm_gguf_close(&g);
        cm_buf_release(&b);
        cm_gguf_writer_free(w);
    }
}

/* Through a file: atomic write, open, and gguf_info.py (an independent reader) agrees. */
static void test_file_and_python(void) {
    char path[256], cmd[1024];
    snprintf(path, sizeof path, "/tmp/cumulo-test-gguf-%ld.gguf", (long)getpid());
    cm_gguf_writer *w = build_all(64);
    int rc = cm_gguf_writer_write(w, path, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    cm_gguf_writer_free(w);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(!cm_file_exists(tmp));
    cm_gguf g;
    rc = cm_gguf_open(&g, path, NULL, NULL, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (!rc) check_all(&g, 64);

    /* gguf_info.py's reader: same counts, same data start, same kvs and tensor table. */
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys,struct; sys.path.insert(0,sys.argv[1]); import gguf_info as G\n"
             "g=G.read(sys.argv[2])\n"
             "print(g[\"version\"],g[\"n_tensors\"],g[\"n_kv\"],g[\"data_start\"],g[\"alignment\"])\n"
             "def f(v):\n"
             " if isinstance(v,tuple): return \"[\"+\",\".join(f(x) for x in v[2])+\"]\"\n"
             " if isinstance(v,float): return struct.pack(\"<d\",v).hex()\n"
             " if isinstance(v,str): return v.encode(\"utf-8\",\"surrogateescape\").hex()\n"
             " return str(int(v))\n"
             "for k,(t,v) in g[\"kv\"].items(): print(k,t,f(v))\n"
             "for n,d,t,o in g[\"tensors\"]: print(n,t,o,*d)' %s %s 2>&1",
             t_shared("tools"), path);
    FILE *fp = rc ? NULL : popen(cmd, "r");
    cm_buf mine;
    cm_buf_init(&mine);
    if (fp) {
        cm_buf py;
        cm_buf_init(&py);
        char line[4096];
        while (fgets(line, sizeof line, fp)) cm_buf_puts(&py, line);
        int st = pclose(fp);
        cm_buf_printf(&mine, "%u %llu %llu %llu %u\n", g.version, (unsigned long long)g.n_tensors,
                      (unsigned long long)g.n_kv, (unsigned long long)g.data_offset, g.alignment);
        for (uint64_t k = 0; k < g.n_kv; k++) {
            const cm_gguf_kv *kv = &g.kv[k];
            cm_buf_printf(&mine, "%s %d ", kv->key, (int)kv->type);
            uint64_t n = kv->type == CM_GGUF_ARRAY ? kv->arr_len : 1;
            if (kv->type == CM_GGUF_ARRAY) cm_buf_puts(&mine, "[");
            for (uint64_t j = 0; j < n; j++) {
                uint32_t et = kv->type == CM_GGUF_ARRAY ? kv->arr_type : kv->type;
                cm_gguf_kv e = *kv;
                if (kv->type == CM_GGUF_ARRAY) { /* one element as a scalar kv */
                    cm_gguf_str s;
                    double d;
                    int64_t i;
                    if (et == CM_GGUF_STRING && cm_gguf_arr_str(kv, j, &s)) e.v.str = s;
                    else if ((et == CM_GGUF_F32 || et == CM_GGUF_F64) && cm_gguf_arr_f64(kv, j, &d)) e.v.f64 = d;
                    else if (et == CM_GGUF_BOOL) e.v.b = kv->arr_data[j];
                    else if (cm_gguf_arr_i64(kv, j, &i)) e.v.i64 = i;
                    else e.v.u64 = UINT64_MAX; /* the one u64 that does not fit */
                }
                if (j) cm_buf_puts(&mine, ",");
                if (et == CM_GGUF_STRING) {
                    for (uint64_t c = 0; c < e.v.str.len; c++)
                        cm_buf_printf(&mine, "%02x", (unsigned char)e.v.str.ptr[c]);
                } else if (et == CM_GGUF_F32 || et == CM_GGUF_F64) {
                    uint8_t q[8];
                    uint64_t bits;
                    memcpy(&bits, &e.v.f64, 8);
                    cm_wr_u64(q, bits);
                    for (int c = 0; c < 8; c++) cm_buf_printf(&mine, "%02x", q[c]);
                } else if (et == CM_GGUF_BOOL) {
                    cm_buf_printf(&mine, "%d", e.v.b ? 1 : 0);
                } else if (et == CM_GGUF_U8 || et == CM_GGUF_U16 || et == CM_GGUF_U32 || et == CM_GGUF_U64) {
                    cm_buf_printf(&mine, "%llu", (unsigned long long)e.v.u64);
                } else {
                    cm_buf_printf(&mine, "%lld", (long long)e.v.i64);
                }
            }
            cm_buf_puts(&mine, kv->type == CM_GGUF_ARRAY ? "]\n" : "\n");
        }
        for (uint64_t k = 0; k < g.n_tensors; k++) {
            const cm_gguf_tensor_info *t = &g.tensors[k];
            cm_buf_printf(&mine, "%s %u %llu", t->name, t->type, (unsigned long long)t->offset);
            for (int d = 0; d < t->n_dims; d++) cm_buf_printf(&mine, " %lld", (long long)t->ne[d]);
            cm_buf_puts(&mine, "\n");
        }
        cm_buf_puts(&mine, "");
        cm_buf_puts(&py, "");
        if (st != 0) fprintf(stderr, "  (python3 or gguf_info.py unavailable: %.200s)\n", py.data);
        CHECKF(st != 0 || (py.len == mine.len && memcmp(py.data, mine.data, py.len) == 0),
               "gguf_info.py reads:\n%s\nwe read:\n%s", py.data, mine.data);
        cm_buf_release(&py);
    }
    cm_buf_release(&mine);
    cm_gguf_close(&g);
    unlink(path);

    /* Errors name the file; a missing file is CM_ENOENT. */
    rc = cm_gguf_open(&g, "/nonexistent/x.gguf", NULL, NULL, err, sizeof err);
    CHECKF(rc == CM_ENOENT && strstr(err, "x.gguf"), "%d %s", rc, err);
    FILE *bad = fopen(path, "wb");
    fputs("GGUF", bad);
    fclose(bad);
    rc = cm_gguf_open(&g, path, NULL, NULL, err, sizeof err);
    CHECKF(rc == CM_EFORMAT && strstr(err, path) && strstr(err, "truncated header"), "%s", err);
    unlink(path);
    w = build_all(32);
    rc = cm_gguf_writer_write(w, "/nonexistent/dir/x.gguf", err, sizeof err);
    CHECKF(rc == CM_EIO && strstr(err, "x.gguf.tmp"), "%s", err);
    cm_gguf_writer_free(w);
}

static int fill_fails(void *ctx, void *dst, uint64_t n, char *e, size_t elen) {
    return cm_errf(e, elen, CM_EIO, "no bytes today");
}
static int fill_ok(void *ctx, void *dst, uint64_t n, char *e, size_t elen) {
    memset(dst, *(const int *)ctx, (size_t)n);
    return 0;
}

static void test_writer_errors(void) {
    int64_t ne[2] = {33, 2}, ne0[1] = {0};
    struct {
        const char *what;
        int code;
    } cases[] = {
        {"duplicate key", CM_EINVAL}, {"duplicate tensor", CM_EINVAL}, {"block", CM_EINVAL}, {"dim 0", CM_EINVAL},
        {"unknown type", CM_EINVAL},  {"alignment", CM_EINVAL},        {"fill", CM_EIO},
    };
    for (size_t c = 0; c < CM_ARRAY_LEN(cases); c++) {
        cm_gguf_writer *w = cm_gguf_writer_new(32);
        cm_gguf_w_u32(w, "a", 1);
        switch (c) {
        case 0: cm_gguf_w_str(w, "a", "x"); break;
        case 1:
            cm_gguf_w_tensor(w, "t", CM_TYPE_F32, 1, ne, k_f32);
            cm_gguf_w_tensor(w, "t", CM_TYPE_F32, 1, ne, k_f32);
            break;
        case 2: cm_gguf_w_tensor(w, "t", CM_TYPE_Q8_0, 2, ne, k_qdata); break;
        case 3: cm_gguf_w_tensor(w, "t", CM_TYPE_F32, 1, ne0, k_f32); break;
        case 4: cm_gguf_w_tensor(w, "t", (enum cm_type)5, 1, ne, k_f32); break;
        case 5: cm_gguf_w_u32(w, "general.alignment", 48); break;
        case 6: cm_gguf_w_tensor_fill(w, "t", CM_TYPE_F32, 1, ne, fill_fails, NULL); break;
        }
        cm_gguf_w_u32(w, "b", 2); /* ignored after an error */
        cm_buf b;
        cm_buf_init(&b);
        err[0] = 0;
        int rc = cm_gguf_writer_write_buf(w, &b, err, sizeof err);
        CHECKF(rc == cases[c].code && err[0] && (b.len == 0 || c == 6), "%s: rc %d '%s'", cases[c].what, rc, err);
        cm_buf_release(&b);
        cm_gguf_writer_free(w);
    }
}

/* Tensors filled at write time, one at a time, through a file. */
static void test_fill(void) {
    int v1 = 0x11, v2 = 0x22;
    int64_t ne1[2] = {64, 4}, ne2[1] = {7};
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    cm_gguf_w_tensor_fill(w, "a", CM_TYPE_Q8_0, 2, ne1, fill_ok, &v1);
    cm_gguf_w_tensor_fill(w, "b", CM_TYPE_F16, 1, ne2, fill_ok, &v2);
    cm_buf b;
    cm_buf_init(&b);
    int rc = cm_gguf_writer_write_buf(w, &b, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    cm_gguf g;
    rc = cm_gguf_parse(&g, (const uint8_t *)b.data, b.len, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    const cm_gguf_tensor_info *t = rc ? NULL : cm_gguf_find_tensor(&g, "a");
    CHECK(t && t->nbytes == 8 * 34 && t->offset == 0);
    for (uint64_t i = 0; t && i < t->nbytes; i++) CHECK(((const uint8_t *)t->data)[i] == 0x11);
    t = rc ? NULL : cm_gguf_find_tensor(&g, "b");
    CHECK(t && t->nbytes == 14 && t->offset == 288);
    for (uint64_t i = 0; t && i < t->nbytes; i++) CHECK(((const uint8_t *)t->data)[i] == 0x22);
    CHECK(b.len == g.data_offset + 288 + 32); /* last tensor padded too, as ggml does */
    cm_gguf_close(&g);
    cm_buf_release(&b);
    cm_gguf_writer_free(w);
}

/* Every ggml layout the reader names, with ggml's block sizes (ggml-common.h,
 * by hand): a tensor's byte size and the file's layout follow from them, and
 * a file one byte short of its last tensor is refused. */
static void test_lowbit_types(void) {
    static const struct {
        enum cm_type t;
        int64_t ne0;
        uint64_t bytes;
    } k[] = {
        {CM_TYPE_Q2_K, 512, 2 * 84},    {CM_TYPE_Q3_K, 512, 2 * 110}, {CM_TYPE_IQ4_NL, 64, 2 * 18},
        {CM_TYPE_IQ4_XS, 512, 2 * 136}, {CM_TYPE_MXFP4, 64, 2 * 17},  {CM_TYPE_IQ2_XXS, 256, 66},
        {CM_TYPE_IQ2_XS, 256, 74},      {CM_TYPE_IQ3_XXS, 256, 98},   {CM_TYPE_IQ1_S, 256, 50},
        {CM_TYPE_IQ3_S, 256, 110},      {CM_TYPE_IQ2_S, 256, 82},     {CM_TYPE_IQ1_M, 256, 56},
        {CM_TYPE_TQ1_0, 256, 54},       {CM_TYPE_TQ2_0, 256, 66},     {CM_TYPE_NVFP4, 128, 2 * 36},
    };
    static uint8_t data[4096];
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    char name[32];
    for (size_t i = 0; i < CM_ARRAY_LEN(k); i++) {
        snprintf(name, sizeof name, "t%zu", i);
        cm_gguf_w_tensor(w, name, k[i].t, 1, &k[i].ne0, data);
    }
    cm_buf b;
    cm_buf_init(&b);
    int rc = cm_gguf_writer_write_buf(w, &b, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    cm_gguf g;
    rc = rc ? rc : cm_gguf_parse(&g, (const uint8_t *)b.data, b.len, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    for (size_t i = 0; rc == 0 && i < CM_ARRAY_LEN(k); i++) {
        snprintf(name, sizeof name, "t%zu", i);
        const cm_gguf_tensor_info *t = cm_gguf_find_tensor(&g, name);
        CHECKF(t && t->type == (uint32_t)k[i].t && t->nbytes == k[i].bytes, "%s: %llu bytes", cm_type_name(k[i].t),
               t ? (unsigned long long)t->nbytes : 0ull);
    }
    if (rc == 0) {
        const cm_gguf_tensor_info *last = &g.tensors[g.n_tensors - 1];
        const size_t need = (size_t)((const uint8_t *)last->data - (const uint8_t *)b.data) + last->nbytes;
        cm_gguf_close(&g);
        cm_gguf h;
        CHECK(cm_gguf_parse(&h, (const uint8_t *)b.data, need - 1, err, sizeof err) != 0);
    }
    cm_buf_release(&b);
    cm_gguf_writer_free(w);
}

int main(void) {
    RUN(test_stories_files);
    RUN(test_load_in_memory);
    RUN(test_rewrite_identical);
    RUN(test_roundtrip);
    RUN(test_file_and_python);
    RUN(test_writer_errors);
    RUN(test_fill);
    RUN(test_lowbit_types);
    TEST_END();
}
