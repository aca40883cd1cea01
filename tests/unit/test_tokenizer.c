/*
 * test_tokenizer.c: the tokenizer against llama.cpp.
 *  - every .inp/.out pair of ../shared/vocab (llama.cpp's own suite), 100%;
 *  - ids and llama_detokenize text that llama.cpp (tools/tok_refs.mjs) gave for
 *    those strings plus tests/data/tokenizer/extra.inp (hand-picked edge cases)
 *    and random.inp (300 seeded random mixes of scripts, spaces, digits,
 *    punctuation, emoji, contractions), for the shipped vocabs
 *    and for every supported pre-tokenizer (a copy of the gpt-2 vocab with
 *    tokenizer.ggml.pre changed, rebuilt here in memory with the GGUF writer);
 *  - a phi-3 style SPM vocab with extra control/user-defined tokens;
 *  - the streaming detokenizer on split multi-byte characters and bad bytes;
 *  - hostile vocabularies (bad types, lengths, ids, merges, mutated bytes).
 */
#include "test.h"

#include "gguf/gguf.h"
#include "os/os.h"
#include "tokenizer/tokenizer.h"

#include <cJSON.h>

static char g_err[512];

/* ---- input helpers ---- */

typedef struct strs {
    char **s;
    size_t *n;
    size_t count;
} strs;

static void strs_free(strs *x) {
    for (size_t i = 0; i < x->count; i++) free(x->s[i]);
    free(x->s);
    free(x->n);
    memset(x, 0, sizeof *x);
}

/* Append the strings of a llama.cpp .inp file (separator-terminated). */
static bool read_inp(const char *path, strs *x) {
    char *buf;
    size_t len;
    if (cm_file_read_all(path, &buf, &len, g_err, sizeof g_err)) {
        fprintf(stderr, "  %s\n", g_err);
        return false;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep), pos = 0;
    for (;;) {
        char *m = memmem(buf + pos, len - pos, sep, sl);
        if (!m) break; /* what follows the last separator is not a case */
        size_t n = (size_t)(m - (buf + pos));
        x->s = realloc(x->s, (x->count + 1) * sizeof *x->s);
        x->n = realloc(x->n, (x->count + 1) * sizeof *x->n);
        x->s[x->count] = malloc(n + 1);
        memcpy(x->s[x->count], buf + pos, n);
        x->s[x->count][n] = 0;
        x->n[x->count++] = n;
        pos += n + sl;
    }
    free(buf);
    return true;
}

static cm_token *parse_ids(const char *line, size_t *n) {
    cm_token *v = malloc(4096 * sizeof *v);
    *n = 0;
    char *end;
    for (;;) {
        long x = strtol(line, &end, 10);
        if (end == line) break;
        v[(*n)++] = (cm_token)x;
        line = end;
    }
    return v;
}

static bool ids_eq(const cm_token *a, size_t na, const cm_token *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

static void print_ids(const char *what, const cm_token *v, size_t n) {
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* ---- 1. llama.cpp's suite ---- */

static int suite_file(const char *vocab, const char *pair, unsigned flags) {
    char vp[512], ip[512], op[512];
    snprintf(vp, sizeof vp, "vocab/ggml-vocab-%s.gguf", vocab);
    snprintf(ip, sizeof ip, "vocab/ggml-vocab-%s.gguf.inp", pair);
    snprintf(op, sizeof op, "vocab/ggml-vocab-%s.gguf.out", pair);
    cm_tokenizer *t;
    int rc = cm_tokenizer_open(&t, t_shared(vp), g_err, sizeof g_err);
    CHECKF(rc == 0, "%s: %s", vp, g_err);
    if (rc) return -1;
    strs in = {0};
    char *out = NULL;
    size_t outlen;
    CHECK(read_inp(t_shared(ip), &in));
    CHECK(cm_file_read_all(t_shared(op), &out, &outlen, g_err, sizeof g_err) == 0);
    size_t pass = 0;
    char *line = out;
    for (size_t i = 0; i < in.count && line; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        size_t ne, ng;
        cm_token *exp = parse_ids(line, &ne), *got = NULL;
        rc = cm_tokenizer_encode_alloc(t, in.s[i], in.n[i], flags, &got, &ng, g_err, sizeof g_err);
        if (rc == 0 && ids_eq(exp, ne, got, ng)) pass++;
        else {
            fprintf(stderr, "  %s case %zu mismatch: \"%s\"\n", pair, i, in.s[i]);
            print_ids("want", exp, ne);
            print_ids("got ", got, ng);
        }
        free(exp);
        cm_free(got);
        line = nl ? nl + 1 : NULL;
    }
    fprintf(stderr, "  vocab %-10s (%s pairs%s): %zu/%zu\n", vocab, pair,
            flags & CM_TOK_PARSE_SPECIAL ? ", special on" : "", pass, in.count);
    CHECKF(pass == in.count && in.count == 46 - 35 * !strcmp(pair, "tinyllama"), "%s: %zu/%zu", pair, pass, in.count);
    strs_free(&in);
    free(out);
    cm_tokenizer_free(t);
    return 0;
}

static void test_llama_cpp_suite(void) {
    suite_file("llama-spm", "llama-spm", 0);
    suite_file("llama-bpe", "llama-bpe", 0);
    suite_file("qwen2", "qwen2", 0);
    suite_file("gpt-2", "gpt-2", 0);
    suite_file("llama-spm", "tinyllama", CM_TOK_PARSE_SPECIAL);
}

/* ---- 2. committed llama.cpp references ---- */

/* Compare t on (shared inp + extra.inp) against a JSONL of {"ids","detok"}.
 * Returns the number of failures. */
static size_t check_refs(const cm_tokenizer *t, const char *label, const char *shared_inp, const char *jsonl,
                         unsigned flags) {
    strs in = {0};
    CHECK(read_inp(t_shared(shared_inp), &in));
    CHECK(read_inp("tests/data/tokenizer/extra.inp", &in));
    CHECK(read_inp("tests/data/tokenizer/random.inp", &in));
    char *ref;
    size_t reflen;
    int rc = cm_file_read_all(jsonl, &ref, &reflen, g_err, sizeof g_err);
    CHECKF(rc == 0, "%s", g_err);
    if (rc) {
        strs_free(&in);
        return 1;
    }
    size_t pass = 0, dpass = 0, i = 0;
    char *line = ref;
    for (; i < in.count && line && *line; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(line);
        cJSON *ja = cJSON_GetObjectItem(j, "ids"), *jd = cJSON_GetObjectItem(j, "detok");
        size_t ne = (size_t)cJSON_GetArraySize(ja), ng;
        cm_token *exp = malloc((ne + 1) * sizeof *exp), *got = NULL;
        for (size_t k = 0; k < ne; k++) exp[k] = (cm_token)cJSON_GetArrayItem(ja, (int)k)->valuedouble;
        rc = cm_tokenizer_encode_alloc(t, in.s[i], in.n[i], flags, &got, &ng, g_err, sizeof g_err);
        if (rc == 0 && ids_eq(exp, ne, got, ng)) pass++;
        else {
            fprintf(stderr, "  %s case %zu: \"%s\"\n", label, i, in.s[i]);
            print_ids("want", exp, ne);
            print_ids("got ", got, ng);
        }
        /* llama_detokenize of llama.cpp's ids, byte for byte (every input is valid
         * UTF-8, so node's string conversion of the reference loses nothing) */
        cm_buf b;
        cm_buf_init(&b);
        rc = cm_tokenizer_decode(t, exp, ne, 0, &b, g_err, sizeof g_err);
        const char *want = jd ? cJSON_GetStringValue(jd) : NULL;
        if (rc == 0 && want && strlen(want) == b.len && !memcmp(want, b.data ? b.data : "", b.len)) dpass++;
        else
            fprintf(stderr, "  %s case %zu detok: want \"%s\" got \"%s\"\n", label, i, want ? want : "?",
                    b.data ? b.data : "");
        cm_buf_release(&b);
        free(exp);
        cm_free(got);
        cJSON_Delete(j);
        line = nl ? nl + 1 : NULL;
    }
    CHECKF(i == in.count, "%s: %zu references for %zu strings", label, i, in.count);
    fprintf(stderr, "  %-24s %zu/%zu ids, %zu/%zu detok\n", label, pass, in.count, dpass, in.count);
    size_t fails = (in.count - pass) + (in.count - dpass) + (i != in.count);
    strs_free(&in);
    free(ref);
    return fails;
}

static void test_vocab_refs(void) {
    static const char *const vocabs[] = {"llama-spm", "llama-bpe", "qwen2", "gpt-2"};
    for (size_t v = 0; v < CM_ARRAY_LEN(vocabs); v++) {
        char vp[256], ip[256], jp[256], label[64];
        snprintf(vp, sizeof vp, "vocab/ggml-vocab-%s.gguf", vocabs[v]);
        snprintf(ip, sizeof ip, "vocab/ggml-vocab-%s.gguf.inp", vocabs[v]);
        snprintf(jp, sizeof jp, "tests/data/tokenizer/vocab-%s.jsonl", vocabs[v]);
        snprintf(label, sizeof label, "vocab %s", vocabs[v]);
        cm_tokenizer *t;
        int rc = cm_tokenizer_open(&t, t_shared(vp), g_err, sizeof g_err);
        CHECKF(rc == 0, "%s", g_err);
        if (rc) continue;
        CHECK(check_refs(t, label, ip, jp, 0) == 0);
        if (v == 0)
            CHECK(check_refs(t, "vocab llama-spm special", ip, "tests/data/tokenizer/vocab-llama-spm-special.jsonl",
                             CM_TOK_PARSE_SPECIAL) == 0);
        cm_tokenizer_free(t);
    }
}

/* A copy of a parsed GGUF with some string keys replaced (in memory). */
static int rewrite(const cm_gguf *g, const char *const *keys, const char *const *vals, int nrep, cm_buf *out) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        bool skip = false;
        for (int k = 0; k < nrep; k++) skip |= !strcmp(g->kv[i].key, keys[k]);
        if (!skip) cm_gguf_w_copy_kv(w, &g->kv[i]);
    }
    for (int k = 0; k < nrep; k++) cm_gguf_w_str(w, keys[k], vals[k]);
    int rc = cm_gguf_writer_write_buf(w, out, g_err, sizeof g_err);
    cm_gguf_writer_free(w);
    return rc;
}

static void test_pre_tokenizers(void) {
    cm_gguf g = {0};
    int rc = cm_gguf_open(&g, t_shared("vocab/ggml-vocab-gpt-2.gguf"), NULL, NULL, g_err, sizeof g_err);
    CHECKF(rc == 0, "%s", g_err);
    if (rc) return;
    size_t names_done = 0;
    for (size_t k = 0; cm_tokenizer_pre_name_at(k); k++) {
        const char *const nm[1] = {cm_tokenizer_pre_name_at(k)};
        char jp[256], label[64];
        snprintf(jp, sizeof jp, "tests/data/tokenizer/pre-%s.jsonl", *nm);
        snprintf(label, sizeof label, "pre %s", *nm);
        CHECKF(cm_file_exists(jp), "no llama.cpp reference for pre-tokenizer '%s'", *nm);
        if (!cm_file_exists(jp)) continue;
        const char *key = "tokenizer.ggml.pre";
        cm_buf b;
        cm_buf_init(&b);
        CHECK(rewrite(&g, &key, nm, 1, &b) == 0);
        cm_gguf c = {0};
        cm_tokenizer *t = NULL;
        rc = cm_gguf_parse(&c, (const uint8_t *)b.data, b.len, g_err, sizeof g_err);
        if (!rc) rc = cm_tokenizer_new(&t, &c, g_err, sizeof g_err);
        CHECKF(rc == 0, "%s: %s", *nm, g_err);
        if (!rc) {
            CHECK(!strcmp(cm_tokenizer_pre_name(t), *nm));
            CHECKF(check_refs(t, label, "vocab/ggml-vocab-gpt-2.gguf.inp", jp, 0) == 0, "%s", *nm);
            names_done++;
        }
        cm_tokenizer_free(t);
        cm_gguf_close(&c);
        cm_buf_release(&b);
    }
    fprintf(stderr, "  %zu pre-tokenizers checked against llama.cpp\n", names_done);
    CHECK(names_done >= 10);

    /* unknown names are errors that name them */
    const char *key = "tokenizer.ggml.pre", *bad = "no-such-pre";
    cm_buf b;
    cm_buf_init(&b);
    CHECK(rewrite(&g, &key, &bad, 1, &b) == 0);
    cm_gguf c = {0};
    cm_tokenizer *t = NULL;
    CHECK(cm_gguf_parse(&c, (const uint8_t *)b.data, b.len, g_err, sizeof g_err) == 0);
    CHECK(cm_tokenizer_new(&t, &c, g_err, sizeof g_err) == CM_EUNSUPPORTED && strstr(g_err, "'no-such-pre'"));
    cm_gguf_close(&c);
    cm_buf_release(&b);
    cm_gguf_close(&g);
}

#include "test_tokenizer_more.h"

int main(void) {
    RUN(test_llama_cpp_suite);
    RUN(test_vocab_refs);
    RUN(test_pre_tokenizers);
    RUN(test_phi3_style_spm);
    RUN(test_special_parsing);
    RUN(test_stream);
    RUN(test_roundtrip_random);
    RUN(test_api);
    RUN(test_hostile);
    TEST_END();
}
