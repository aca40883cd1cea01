/*
 * test_gguf_bad.c: malformed GGUF input, built here from a small valid file.
 *
 * Every case must return an error code with a message that names the
 * problem — never crash, read past the bytes (each parse gets an exact-size
 * heap copy so ASan sees overreads), or leak (run under `make asan`).
 */
#include "gguf/gguf.h"
#include "test.h"

static char err[512];

/* Parse an exact-size heap copy; walk every accessor on success. */
static int parse_copy(const uint8_t *p, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    if (n) memcpy(c, p, n);
    err[0] = 0;
    cm_gguf g;
    int rc = cm_gguf_parse(&g, c, n, err, sizeof err);
    if (rc == 0) {
        volatile uint64_t sink = 0;
        for (uint64_t i = 0; i < g.n_kv; i++) {
            const cm_gguf_kv *kv = &g.kv[i];
            CHECK(cm_gguf_find_kv(&g, kv->key) == kv);
            uint64_t u;
            int64_t s;
            double f;
            bool b;
            cm_gguf_str st;
            sink += cm_gguf_get_u64(&g, kv->key, &u) + cm_gguf_get_i64(&g, kv->key, &s) +
                    cm_gguf_get_f64(&g, kv->key, &f) + cm_gguf_get_bool(&g, kv->key, &b);
            char *str = cm_gguf_get_str(&g, kv->key);
            cm_free(str);
            for (uint64_t j = 0; kv->type == CM_GGUF_ARRAY && j < kv->arr_len; j++) {
                sink += cm_gguf_arr_i64(kv, j, &s) + cm_gguf_arr_f64(kv, j, &f);
                if (cm_gguf_arr_str(kv, j, &st) && st.len) sink += (uint8_t)st.ptr[st.len - 1];
            }
        }
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const cm_gguf_tensor_info *t = &g.tensors[i];
            CHECK(cm_gguf_find_tensor(&g, t->name) == t);
            CHECK((const uint8_t *)t->data >= c && (const uint8_t *)t->data + t->nbytes <= c + n);
            if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        (void)sink;
    } else {
        CHECKF(err[0] != 0, "rc %d without a message", rc);
        CHECK(rc == CM_EFORMAT || rc == CM_EUNSUPPORTED);
    }
    cm_gguf_close(&g);
    free(c);
    return rc;
}

/* The small valid file every case starts from. */
static const int64_t ne_a[2] = {32, 2}, ne_b[1] = {8};
static uint8_t data_a[36];
static float data_b[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static cm_buf base_file(uint32_t alignment) {
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    if (alignment) cm_gguf_w_u32(w, "general.alignment", alignment);
    cm_gguf_w_str(w, "general.architecture", "llama");
    cm_gguf_w_u32(w, "k.a", 7);
    cm_gguf_w_bool(w, "k.b", true);
    cm_gguf_str toks[3] = {{"<unk>", 5}, {"x", 1}, {"yz", 2}};
    cm_gguf_w_arr_str(w, "k.tokens", toks, 3);
    float sc[2] = {0.5f, -1};
    cm_gguf_w_arr(w, "k.scores", CM_GGUF_F32, sc, 2);
    cm_gguf_w_tensor(w, "t.a", CM_TYPE_Q4_0, 2, ne_a, data_a);
    cm_gguf_w_tensor(w, "t.b", CM_TYPE_F32, 1, ne_b, data_b);
    cm_buf b;
    cm_buf_init(&b);
    CHECK(cm_gguf_writer_write_buf(w, &b, err, sizeof err) == 0);
    cm_gguf_writer_free(w);
    return b;
}

/* Offset just after the length-prefixed string s (a key or tensor name). */
static size_t after(const cm_buf *b, const char *s) {
    size_t n = strlen(s);
    const char *p = memmem(b->data, b->len, s, n);
    CHECKF(p != NULL, "'%s' not in file", s);
    return p ? (size_t)(p - b->data) + n : 0;
}
static void put32(cm_buf *b, size_t at, uint32_t v) { cm_wr_u32((uint8_t *)b->data + at, v); }
static void put64(cm_buf *b, size_t at, uint64_t v) { cm_wr_u64((uint8_t *)b->data + at, v); }

static void test_base_valid(void) {
    cm_buf b = base_file(0);
    CHECKF(parse_copy((uint8_t *)b.data, b.len) == 0, "%s", err);
    cm_buf_release(&b);
}

/* Every prefix of the file (up to the end of the last tensor) is an error. */
static void test_truncations(void) {
    cm_buf b = base_file(0);
    int bad = 0;
    for (size_t n = 0; n < b.len; n++) {
        int rc = parse_copy((uint8_t *)b.data, n);
        if (rc == 0) bad++;
        if (rc == 0 && bad < 4) fprintf(stderr, "  truncation to %zu bytes parsed\n", n);
    }
    CHECKF(bad == 0, "%d truncations accepted (of %zu)", bad, b.len);
    /* A cut in the tensor table names it. */
    size_t at = after(&b, "t.b") + 2;
    CHECK(parse_copy((uint8_t *)b.data, at) == CM_EFORMAT);
    CHECKF(strstr(err, "truncated tensor table (tensor 2 of 2) at byte"), "%s", err);
    CHECK(parse_copy((uint8_t *)b.data, 60) == CM_EFORMAT);
    CHECKF(strstr(err, "cannot fit in a file of 60 bytes"), "%s", err);
    cm_buf_release(&b);
}

/* Seeded random corruption: anything may happen except a crash or overread. */
static void test_byte_flips(void) {
    cm_buf b = base_file(0);
    cm_rng r;
    cm_rng_seed(&r, 1234);
    uint8_t *c = malloc(b.len);
    int ok = 0, failed = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(c, b.data, b.len);
        int flips = 1 + (int)(cm_rng_next(&r) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(cm_rng_next(&r) % b.len);
            uint64_t how = cm_rng_next(&r);
            c[at] = (how & 1) ? (uint8_t)(c[at] ^ (1u << ((how >> 1) & 7))) : (uint8_t)(how >> 8);
        }
        size_t n = (it & 7) == 7 ? (size_t)(cm_rng_next(&r) % b.len) : b.len;
        if (parse_copy(c, n) == 0) ok++;
        else failed++;
    }
    if (getenv("CUMULO_TEST_VERBOSE")) fprintf(stderr, "  byte flips: %d parsed, %d rejected\n", ok, failed);
    CHECK(failed > 0 && ok > 0);
    free(c);
    cm_buf_release(&b);
}

typedef struct bad_case {
    const char *name;
    int code;
    const char *msg; /* substring of the message */
} bad_case;

static void expect(cm_buf *b, bad_case c) {
    int rc = parse_copy((uint8_t *)b->data, b->len);
    CHECKF(rc == c.code, "%s: rc %d (%s), want %d", c.name, rc, err, c.code);
    CHECKF(strstr(err, c.msg) != NULL, "%s: message '%s' lacks '%s'", c.name, err, c.msg);
    cm_buf_release(b);
}

static void test_malformed(void) {
    cm_buf b;
    size_t at;
#define CASE(name, code, msg, edit)              \
    do {                                         \
        b = base_file(0);                        \
        edit;                                    \
        expect(&b, (bad_case){name, code, msg}); \
    } while (0)
    CASE("magic", CM_EFORMAT, "not a GGUF file", b.data[3] = 'X');
    CASE("v1", CM_EUNSUPPORTED, "GGUF version 1 is not supported", put32(&b, 4, 1));
    CASE("v4", CM_EUNSUPPORTED, "version 4", put32(&b, 4, 4));
    CASE("big-endian", CM_EUNSUPPORTED, "big-endian", put32(&b, 4, 3u << 24));
    CASE("huge n_tensors", CM_EFORMAT, "tensor count 1152921504606846976 over the limit", put64(&b, 8, 1ull << 60));
    CASE("huge n_kv", CM_EFORMAT, "kv count 1099511627776 over the limit", put64(&b, 16, 1ull << 40));
    CASE("n_kv past bytes", CM_EFORMAT, "cannot fit", put64(&b, 16, 1u << 20));
    CASE("n_tensors past bytes", CM_EFORMAT, "cannot fit", put64(&b, 8, 100000));
    CASE("huge key length", CM_EFORMAT, "string length 9223372036854775808 over the limit", put64(&b, 24, 1ull << 63));
    CASE("key length past end", CM_EFORMAT, "truncated key of kv 1 of 5 at byte 24", put64(&b, 24, 60000));
    CASE("huge string value", CM_EFORMAT, "over the limit", at = after(&b, "general.architecture");
         put64(&b, at + 4, 1ull << 40));
    CASE("string value past end", CM_EFORMAT, "truncated value of 'general.architecture'",
         at = after(&b, "general.architecture");
         put64(&b, at + 4, 1u << 20));
    CASE("unknown value type", CM_EFORMAT, "unknown value type 13", at = after(&b, "k.a"); put32(&b, at, 13));
    CASE("bool 2", CM_EFORMAT, "neither 0 nor 1", at = after(&b, "k.b"); b.data[at + 4] = 2);
    CASE("key with NUL", CM_EFORMAT, "NUL", at = after(&b, "k.a"); b.data[at - 1] = 0);
    CASE("duplicate key", CM_EFORMAT, "duplicate key 'k.a'", at = after(&b, "k.b"); b.data[at - 1] = 'a');
    CASE("unknown array type", CM_EFORMAT, "unknown array element type 99", at = after(&b, "k.tokens");
         put32(&b, at + 4, 99));
    CASE("huge array", CM_EFORMAT, "array length 1099511627776 over the limit", at = after(&b, "k.tokens");
         put64(&b, at + 8, 1ull << 40));
    CASE("array past bytes", CM_EFORMAT, "cannot fit", at = after(&b, "k.tokens"); put64(&b, at + 8, 1u << 29));
    CASE("huge string in array", CM_EFORMAT, "string length", at = after(&b, "k.tokens");
         put64(&b, at + 16, 1ull << 62));
    CASE("f32 array past bytes", CM_EFORMAT, "cannot fit", at = after(&b, "k.scores"); put64(&b, at + 8, 1000));
    CASE("long tensor name", CM_EFORMAT, "string length 300 over the limit of 255", at = after(&b, "t.a");
         put64(&b, at - 11, 300));
    CASE("n_dims 5", CM_EFORMAT, "has 5 dimensions", at = after(&b, "t.a"); put32(&b, at, 5));
    CASE("n_dims 0", CM_EFORMAT, "has 0 dimensions", at = after(&b, "t.a"); put32(&b, at, 0));
    CASE("dim 0", CM_EFORMAT, "dimension 1 of size 0", at = after(&b, "t.a"); put64(&b, at + 12, 0));
    CASE("dims overflow", CM_EFORMAT, "too many elements", at = after(&b, "t.a"); put64(&b, at + 4, 1ull << 32);
         put64(&b, at + 12, 1ull << 32));
    CASE("dim over int64", CM_EFORMAT, "too many elements", at = after(&b, "t.b"); put64(&b, at + 4, 1ull << 63));
    CASE("unknown type id", CM_EUNSUPPORTED, "tensor 't.a' has unknown type id 99", at = after(&b, "t.a");
         put32(&b, at + 20, 99));
    CASE("type id 2^31", CM_EUNSUPPORTED, "unknown type id 2147483648", at = after(&b, "t.b");
         put32(&b, at + 12, 1u << 31));
    CASE("row not a block multiple", CM_EFORMAT, "not a multiple of q4_0's block of 32", at = after(&b, "t.a");
         put64(&b, at + 4, 33));
    CASE("duplicate tensor", CM_EFORMAT, "duplicate tensor name 't.a'", at = after(&b, "t.b"); b.data[at - 1] = 'a');
    CASE("offset past end", CM_EFORMAT, "ends past the end of the file", at = after(&b, "t.b");
         put64(&b, at + 16, 1u << 20));
    CASE("offset overflow", CM_EFORMAT, "ends past the end", at = after(&b, "t.b");
         put64(&b, at + 16, UINT64_MAX - 31));
    CASE("misaligned offset", CM_EFORMAT, "offset 65 is not a multiple of the alignment 32", at = after(&b, "t.b");
         put64(&b, at + 16, 65));
    CASE("tensor bigger than file", CM_EFORMAT, "ends past the end", at = after(&b, "t.b");
         put64(&b, at + 4, 1ull << 40));
#undef CASE
#define ACASE(name, msg, v)                               \
    do {                                                  \
        b = base_file(64);                                \
        put32(&b, after(&b, "general.alignment") + 4, v); \
        expect(&b, (bad_case){name, CM_EFORMAT, msg});    \
    } while (0)
    ACASE("alignment 3", "general.alignment 3 is not a power of two", 3);
    ACASE("alignment 0", "general.alignment 0 is not a power of two", 0);
    ACASE("alignment 2^20", "general.alignment 1048576 is not a power of two from 8 to 65536", 1u << 20);
    ACASE("alignment 4", "general.alignment 4 is not a power of two from 8", 4);
    ACASE("alignment 2^31", "is not a power of two", 1u << 31);
#undef ACASE
    b = base_file(64);
    CHECK(parse_copy((uint8_t *)b.data, b.len) == 0);
    put32(&b, after(&b, "general.alignment"), CM_GGUF_I32); /* same size, wrong type */
    expect(&b, (bad_case){"alignment i32", CM_EFORMAT, "general.alignment is a i32, not a u32"});
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    cm_gguf_w_u64(w, "general.alignment", 64);
    cm_buf_init(&b);
    CHECK(cm_gguf_writer_write_buf(w, &b, err, sizeof err) == 0);
    cm_gguf_writer_free(w);
    expect(&b, (bad_case){"alignment u64", CM_EFORMAT, "general.alignment is a u64, not a u32"});
    /* Tiny inputs. */
    cm_gguf g;
    CHECK(cm_gguf_parse(&g, NULL, 0, err, sizeof err) == CM_EFORMAT && strstr(err, "not a GGUF"));
    CHECK(parse_copy((const uint8_t *)"GGU", 3) == CM_EFORMAT);
    CHECK(parse_copy((const uint8_t *)"GGUF\3\0\0\0", 8) == CM_EFORMAT && strstr(err, "truncated header"));
}

/* Hand-built files: nested arrays (valid up to the depth limit), empty tensor name. */
static void hb_u32(cm_buf *b, uint32_t v) {
    uint8_t q[4];
    cm_wr_u32(q, v);
    cm_buf_append(b, q, 4);
}
static void hb_u64(cm_buf *b, uint64_t v) {
    uint8_t q[8];
    cm_wr_u64(q, v);
    cm_buf_append(b, q, 8);
}
static void hb_str(cm_buf *b, const char *s) {
    hb_u64(b, strlen(s));
    cm_buf_puts(b, s);
}

/* An array body nested depth levels deep; the innermost holds strings. */
static void nest(cm_buf *b, int depth) {
    if (depth == 1) {
        hb_u32(b, CM_GGUF_STRING);
        hb_u64(b, 2);
        hb_str(b, "ab");
        hb_str(b, "");
        return;
    }
    hb_u32(b, CM_GGUF_ARRAY);
    hb_u64(b, 2);
    nest(b, depth - 1);
    nest(b, depth - 1);
}

static cm_buf nested(int depth) {
    cm_buf b;
    cm_buf_init(&b);
    cm_buf_append(&b, "GGUF", 4);
    hb_u32(&b, 2); /* version 2 has the same layout as 3 */
    hb_u64(&b, 0);
    hb_u64(&b, 1);
    hb_str(&b, "n");
    hb_u32(&b, CM_GGUF_ARRAY);
    nest(&b, depth);
    return b;
}

static void test_nested(void) {
    for (int depth = 1; depth <= CM_GGUF_MAX_DEPTH + 1; depth++) {
        cm_buf b = nested(depth);
        int rc = parse_copy((uint8_t *)b.data, b.len);
        if (depth <= CM_GGUF_MAX_DEPTH) {
            CHECKF(rc == 0, "depth %d: %s", depth, err);
            cm_gguf g;
            if (cm_gguf_parse(&g, (uint8_t *)b.data, b.len, err, sizeof err) == 0) {
                const cm_gguf_kv *kv = cm_gguf_find_kv(&g, "n");
                CHECK(kv && kv->arr_len == 2 && kv->arr_nbytes == b.len - 24 - 9 - 4 - 12);
                cm_gguf_str s;
                if (depth == 1) CHECK(cm_gguf_arr_str(kv, 0, &s) && s.len == 2 && !memcmp(s.ptr, "ab", 2));
                else CHECK(kv && kv->arr_type == CM_GGUF_ARRAY && !cm_gguf_arr_str(kv, 0, &s));
                /* copy_kv reproduces it (as version 3) */
                cm_gguf_writer *w = cm_gguf_writer_new(32);
                cm_gguf_w_copy_kv(w, kv);
                cm_buf o;
                cm_buf_init(&o);
                CHECK(cm_gguf_writer_write_buf(w, &o, err, sizeof err) == 0);
                CHECK(o.len >= b.len && memcmp(o.data + 8, b.data + 8, b.len - 8) == 0);
                cm_buf_release(&o);
                cm_gguf_writer_free(w);
            }
            cm_gguf_close(&g);
        } else {
            CHECKF(rc == CM_EFORMAT && strstr(err, "nested deeper"), "depth %d: %s", depth, err);
        }
        cm_buf_release(&b);
    }
    /* An empty tensor name. */
    cm_buf b;
    cm_buf_init(&b);
    cm_buf_append(&b, "GGUF", 4);
    hb_u32(&b, 3);
    hb_u64(&b, 1);
    hb_u64(&b, 0);
    hb_str(&b, "");
    hb_u32(&b, 1);
    hb_u64(&b, 1);
    hb_u32(&b, CM_TYPE_F32);
    hb_u64(&b, 0);
    for (int i = 0; i < 40; i++) cm_buf_append(&b, "", 1);
    expect(&b, (bad_case){"empty tensor name", CM_EFORMAT, "empty tensor name"});
}

int main(void) {
    RUN(test_base_valid);
    RUN(test_truncations);
    RUN(test_byte_flips);
    RUN(test_malformed);
    RUN(test_nested);
    TEST_END();
}
