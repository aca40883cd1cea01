/*
 * test_tokenizer_more.h: second half of test_tokenizer.c (included once by
 * it): phi-3 style SPM specials, special-token parsing, streaming, random
 * round trips, API facts and hostile vocabularies.
 */

/* ---- phi-3 style SPM: llama-spm plus control/user-defined tokens, named Phi-3 ---- */

static const struct {
    const char *text;
    int type;
} k_phi3_extra[] = {
    {"<|endoftext|>", 3}, {"<|assistant|>", 4}, {"<|placeholder1|>", 4},
    {"<|system|>", 3},    {"<|end|>", 3},       {"<|user|>", 3},
};

static int make_phi3(cm_buf *out, cm_gguf *g) {
    const cm_gguf_kv *tk = cm_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const cm_gguf_kv *sk = cm_gguf_find_kv(g, "tokenizer.ggml.scores");
    const cm_gguf_kv *yk = cm_gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (!tk || !sk || !yk) return -1;
    uint64_t n = tk->arr_len, m = n + CM_ARRAY_LEN(k_phi3_extra);
    cm_gguf_str *s = malloc(m * sizeof *s);
    float *sc = malloc(m * sizeof *sc);
    int32_t *ty = malloc(m * sizeof *ty);
    for (uint64_t i = 0; i < n; i++) {
        double f;
        int64_t y;
        cm_gguf_arr_str(tk, i, &s[i]);
        cm_gguf_arr_f64(sk, i, &f);
        cm_gguf_arr_i64(yk, i, &y);
        sc[i] = (float)f;
        ty[i] = (int32_t)y;
    }
    for (uint64_t i = n; i < m; i++) {
        s[i].ptr = k_phi3_extra[i - n].text;
        s[i].len = strlen(s[i].ptr);
        sc[i] = 0;
        ty[i] = k_phi3_extra[i - n].type;
    }
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const char *k = g->kv[i].key;
        if (strcmp(k, "tokenizer.ggml.tokens") && strcmp(k, "tokenizer.ggml.scores") &&
            strcmp(k, "tokenizer.ggml.token_type") && strcmp(k, "general.name"))
            cm_gguf_w_copy_kv(w, &g->kv[i]);
    }
    cm_gguf_w_str(w, "general.name", "Phi-3 mini 4k instruct");
    cm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", s, m);
    cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_F32, sc, m);
    cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_I32, ty, m);
    int rc = cm_gguf_writer_write_buf(w, out, g_err, sizeof g_err);
    cm_gguf_writer_free(w);
    free(s);
    free(sc);
    free(ty);
    return rc;
}

static void test_phi3_style_spm(void) {
    cm_gguf g = {0}, c = {0};
    int rc = cm_gguf_open(&g, t_shared("vocab/ggml-vocab-llama-spm.gguf"), NULL, NULL, g_err, sizeof g_err);
    CHECKF(rc == 0, "%s", g_err);
    if (rc) return;
    cm_buf b;
    cm_buf_init(&b);
    CHECK(make_phi3(&b, &g) == 0);
    const char *dump = getenv("CUMULO_TOK_DUMP_PHI3"); /* for regenerating the references */
    if (dump) cm_file_write_atomic(dump, b.data, b.len, 0644, g_err, sizeof g_err);
    cm_tokenizer *t = NULL;
    rc = cm_gguf_parse(&c, (const uint8_t *)b.data, b.len, g_err, sizeof g_err);
    if (!rc) rc = cm_tokenizer_new(&t, &c, g_err, sizeof g_err);
    CHECKF(rc == 0, "%s", g_err);
    if (!rc) {
        CHECK(cm_tokenizer_attr(t, 32005) & CM_TOK_ATTR_RSTRIP);    /* <|user|>: phi-3 rstrip */
        CHECK(!(cm_tokenizer_attr(t, 32000) & CM_TOK_ATTR_RSTRIP)); /* <|endoftext|>: not */
        CHECK(cm_tokenizer_is_eog(t, 32004));                       /* <|end|> */
        strs in = {0};
        CHECK(read_inp("tests/data/tokenizer/phi3.inp", &in));
        for (int special = 0; special < 2; special++) {
            char jp[128];
            snprintf(jp, sizeof jp, "tests/data/tokenizer/phi3%s.jsonl", special ? "-special" : "");
            char *ref;
            size_t reflen;
            CHECK(cm_file_read_all(jp, &ref, &reflen, g_err, sizeof g_err) == 0);
            char *line = ref;
            size_t pass = 0;
            for (size_t i = 0; i < in.count && line; i++) {
                char *nl = strchr(line, '\n');
                if (nl) *nl = 0;
                cJSON *j = cJSON_Parse(line), *ja = cJSON_GetObjectItem(j, "ids");
                size_t ne = (size_t)cJSON_GetArraySize(ja), ng;
                cm_token exp[256], *got;
                for (size_t k = 0; k < ne && k < 256; k++)
                    exp[k] = (cm_token)cJSON_GetArrayItem(ja, (int)k)->valuedouble;
                rc = cm_tokenizer_encode_alloc(t, in.s[i], in.n[i], special ? CM_TOK_PARSE_SPECIAL : 0, &got, &ng,
                                               g_err, sizeof g_err);
                if (!rc && ids_eq(exp, ne, got, ng)) pass++;
                else {
                    fprintf(stderr, "  phi3 special=%d case %zu: \"%s\"\n", special, i, in.s[i]);
                    print_ids("want", exp, ne);
                    print_ids("got ", got, ng);
                }
                cm_free(got);
                cJSON_Delete(j);
                line = nl ? nl + 1 : NULL;
            }
            fprintf(stderr, "  phi-3 style SPM (special %s): %zu/%zu\n", special ? "on" : "off", pass, in.count);
            CHECK(pass == in.count && in.count > 0);
            free(ref);
        }
        strs_free(&in);
    }
    cm_tokenizer_free(t);
    cm_gguf_close(&c);
    cm_gguf_close(&g);
    cm_buf_release(&b);
}

/* ---- special tokens: control tokens never come from plain text ---- */

static void test_special_parsing(void) {
    static const char *const vocabs[] = {"vocab/ggml-vocab-qwen2.gguf", "vocab/ggml-vocab-llama-bpe.gguf",
                                         "vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf"};
    for (size_t v = 0; v < CM_ARRAY_LEN(vocabs); v++) {
        cm_tokenizer *t;
        if (cm_tokenizer_open(&t, t_shared(vocabs[v]), g_err, sizeof g_err)) {
            CHECKF(0, "%s", g_err);
            continue;
        }
        size_t n_ctl = 0, bad = 0, parsed = 0;
        for (cm_token id = 0; id < cm_tokenizer_n_vocab(t); id++) {
            if (!cm_tokenizer_is_control(t, id)) continue;
            n_ctl++;
            size_t len, ng;
            const char *txt = cm_tokenizer_text(t, id, &len);
            char buf[512];
            int k = snprintf(buf, sizeof buf, "x %.*s y%.*s", (int)len, txt, (int)len, txt);
            cm_token *got;
            CHECK(cm_tokenizer_encode_alloc(t, buf, (size_t)k, 0, &got, &ng, g_err, sizeof g_err) == 0);
            for (size_t i = 0; i < ng; i++) bad += cm_tokenizer_is_control(t, got[i]);
            cm_free(got);
            CHECK(cm_tokenizer_encode_alloc(t, txt, len, CM_TOK_PARSE_SPECIAL, &got, &ng, g_err, sizeof g_err) == 0);
            parsed += ng == 1 && got[0] == id;
            cm_free(got);
        }
        fprintf(stderr, "  %s: %zu control tokens, %zu produced from plain text, %zu parsed back\n", vocabs[v], n_ctl,
                bad, parsed);
        CHECK(n_ctl > 0 && bad == 0 && parsed == n_ctl);
        cm_tokenizer_free(t);
    }
}

/* ---- streaming ---- */

static bool valid_utf8(const char *p, size_t n) {
    cm_detok d; /* a stream over raw bytes would do; check by hand instead */
    (void)d;
    for (size_t i = 0; i < n;) {
        uint8_t b = (uint8_t)p[i];
        size_t l = b < 0x80                 ? 1
                   : b >= 0xC2 && b <= 0xDF ? 2
                   : b >= 0xE0 && b <= 0xEF ? 3
                   : b >= 0xF0 && b <= 0xF4 ? 4
                                            : 0;
        if (!l || i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if (((uint8_t)p[i + k] & 0xC0) != 0x80) return false;
        uint8_t c = l > 1 ? (uint8_t)p[i + 1] : 0x80;
        if ((b == 0xE0 && c < 0xA0) || (b == 0xED && c > 0x9F) || (b == 0xF0 && c < 0x90) || (b == 0xF4 && c > 0x8F))
            return false;
        i += l;
    }
    return true;
}

/* Stream ids through a detok, returning everything it emitted (flushed). */
static size_t stream_all(const cm_tokenizer *t, const cm_token *ids, size_t n, bool lstrip, char *out, size_t out_cap,
                         size_t *chunks) {
    cm_detok d;
    cm_detok_init(&d, t, false, lstrip);
    size_t cap = cm_detok_max_out(t), o = 0, k;
    char *tmp = malloc(cap);
    *chunks = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(cm_detok_push(&d, ids[i], tmp, cap, &k) == 0);
        CHECK(valid_utf8(tmp, k));
        if (o + k > out_cap) {
            CHECK(!"stream output overflows the test buffer");
            break;
        }
        memcpy(out + o, tmp, k);
        o += k;
        *chunks += k > 0;
    }
    CHECK(cm_detok_flush(&d, tmp, cap, &k) == 0);
    if (o + k > out_cap) k = 0;
    memcpy(out + o, tmp, k);
    free(tmp);
    return o + k;
}

static void test_stream(void) {
    cm_tokenizer *t;
    if (cm_tokenizer_open(&t, t_shared("vocab/ggml-vocab-llama-spm.gguf"), g_err, sizeof g_err)) {
        CHECKF(0, "%s", g_err);
        return;
    }
#define BYTE(x) (3 + (x))
    char out[256];
    size_t n, chunks;
    cm_token zh[] = {BYTE(0xE4), BYTE(0xB8), BYTE(0xAD)}; /* 中 as three byte tokens */
    cm_detok d;
    cm_detok_init(&d, t, false, false);
    char buf[1024];
    CHECK(cm_detok_push(&d, zh[0], buf, sizeof buf, &n) == 0 && n == 0);
    CHECK(cm_detok_push(&d, zh[1], buf, sizeof buf, &n) == 0 && n == 0);
    CHECK(cm_detok_push(&d, zh[2], buf, sizeof buf, &n) == 0 && n == 3 && !memcmp(buf, "\xe4\xb8\xad", 3));
    CHECK(cm_detok_push(&d, zh[0], buf, 2, &n) == CM_ERANGE); /* buffer below cm_detok_max_out */
    CHECK(cm_detok_push(&d, -1, buf, sizeof buf, &n) == CM_ERANGE);
    cm_token emoji[] = {BYTE(0xF0), BYTE(0x9F), BYTE(0x98), BYTE(0x80), 15043}; /* 😀 then ▁Hello */
    n = stream_all(t, emoji, 5, false, out, sizeof out, &chunks);
    CHECK(n == 10 && !memcmp(out, "\xf0\x9f\x98\x80 Hello", 10) && chunks == 2);
    cm_token bad1[] = {BYTE(0xFF), BYTE(0x41)}; /* invalid byte, then 'A' */
    n = stream_all(t, bad1, 2, false, out, sizeof out, &chunks);
    CHECK(n == 4 && !memcmp(out,
                            "\xef\xbf\xbd"
                            "A",
                            4));
    cm_token bad2[] = {BYTE(0xE4), BYTE(0xB8), 15043}; /* truncated 中 then ▁Hello */
    n = stream_all(t, bad2, 3, false, out, sizeof out, &chunks);
    CHECK(n == 9 && !memcmp(out, "\xef\xbf\xbd Hello", 9));
    cm_token bad3[] = {BYTE(0xE4), BYTE(0xB8)}; /* truncated at the end: U+FFFD at flush */
    n = stream_all(t, bad3, 2, false, out, sizeof out, &chunks);
    CHECK(n == 3 && !memcmp(out, "\xef\xbf\xbd", 3) && chunks == 0);
    cm_token bad4[] = {BYTE(0xED), BYTE(0xA0), BYTE(0x80)}; /* a surrogate: three U+FFFD */
    n = stream_all(t, bad4, 3, false, out, sizeof out, &chunks);
    CHECK(n == 9 && !memcmp(out, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9));
    cm_token hi[] = {15043, 3186}; /* ▁Hello ▁world, first space stripped */
    n = stream_all(t, hi, 2, true, out, sizeof out, &chunks);
    CHECK(n == 11 && !memcmp(out, "Hello world", 11));
    cm_tokenizer_free(t);

    /* BPE: emoji split across byte-level tokens, streamed whole */
    if (cm_tokenizer_open(&t, t_shared("vocab/ggml-vocab-gpt-2.gguf"), g_err, sizeof g_err)) {
        CHECKF(0, "%s", g_err);
        return;
    }
    const char *s = "a \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xe4\xb8\xad\xe6\x96\x87 b";
    cm_token *ids;
    size_t ni;
    CHECK(cm_tokenizer_encode_alloc(t, s, strlen(s), 0, &ids, &ni, g_err, sizeof g_err) == 0);
    n = stream_all(t, ids, ni, false, out, sizeof out, &chunks);
    CHECK(n == strlen(s) && !memcmp(out, s, n));
    CHECKF(chunks < ni, "%zu chunks from %zu tokens: split characters must be held", chunks, ni);
    cm_free(ids);
    cm_tokenizer_free(t);
}

/* ---- random round trips: pieces give the text back ---- */

static size_t rand_text(cm_rng *r, char *out, bool valid) {
    static const uint32_t pool[] = {' ',    ' ',     ' ',    '\n',   '\t',   'a',    'Z',      '0',    '7',
                                    '\'',   '.',     '!',    0x85,   0xA0,   0xE9,   0x301,    0x3000, 0x4E2D,
                                    0xAC00, 0x1F600, 0x200D, 0xFE0F, 0x0627, 0x0915, 0x10FFFD, 0xFFFD};
    size_t n = 0, len = 1 + cm_rng_next(r) % 40;
    for (size_t i = 0; i < len; i++) {
        if (!valid && cm_rng_next(r) % 8 == 0) {
            out[n++] = (char)(cm_rng_next(r) & 0xFF);
            continue;
        }
        uint32_t cp =
            cm_rng_next(r) % 3 ? pool[cm_rng_next(r) % CM_ARRAY_LEN(pool)] : 0x20 + (uint32_t)(cm_rng_next(r) % 0x5F);
        if (cp < 0x80) out[n++] = (char)cp;
        else if (cp < 0x800) {
            out[n++] = (char)(0xC0 | (cp >> 6));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[n++] = (char)(0xE0 | (cp >> 12));
            out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[n++] = (char)(0xF0 | (cp >> 18));
            out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return n;
}

static void test_roundtrip_random(void) {
    static const char *const vocabs[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                                         "vocab/ggml-vocab-llama-bpe.gguf", "vocab/ggml-vocab-qwen2.gguf"};
    cm_rng r;
    cm_rng_seed(&r, 42);
    for (size_t v = 0; v < CM_ARRAY_LEN(vocabs); v++) {
        cm_tokenizer *t;
        if (cm_tokenizer_open(&t, t_shared(vocabs[v]), g_err, sizeof g_err)) {
            CHECKF(0, "%s", g_err);
            continue;
        }
        bool spm = cm_tokenizer_kind(t) == CM_TOK_SPM;
        size_t ok = 0, N = 300;
        for (size_t it = 0; it < N; it++) {
            char text[256], back[4096], streamed[4096];
            bool valid = it % 3 != 0;
            size_t n = rand_text(&r, text, valid), ni, chunks;
            cm_token *ids;
            int rc = cm_tokenizer_encode_alloc(t, text, n, 0, &ids, &ni, g_err, sizeof g_err);
            CHECKF(rc == 0, "%s", g_err);
            if (rc) continue;
            size_t m = 0;
            for (size_t i = 0; i < ni; i++) {
                size_t len;
                const char *p = cm_tokenizer_piece(t, ids[i], false, &len);
                memcpy(back + m, p, len);
                m += len;
            }
            size_t sn = stream_all(t, ids, ni, spm, streamed, sizeof streamed, &chunks);
            CHECK(valid_utf8(streamed, sn));
            if (valid) {
                /* SPM pieces carry the space prefix; the stream strips it */
                bool eq =
                    spm ? m == n + 1 && back[0] == ' ' && !memcmp(back + 1, text, n) : m == n && !memcmp(back, text, n);
                eq = eq && sn == n && !memcmp(streamed, text, n);
                ok += eq;
                if (!eq) fprintf(stderr, "  %s: round trip failed for \"%.*s\"\n", vocabs[v], (int)n, text);
            } else {
                ok++;
            }
            cm_free(ids);
        }
        fprintf(stderr, "  %s: %zu/%zu random round trips\n", vocabs[v], ok, N);
        CHECK(ok == N);
        cm_tokenizer_free(t);
    }
}

/* ---- API facts ---- */

static void test_api(void) {
    cm_tokenizer *t;
    if (cm_tokenizer_open(&t, t_shared("vocab/ggml-vocab-llama-spm.gguf"), g_err, sizeof g_err)) {
        CHECKF(0, "%s", g_err);
        return;
    }
    CHECK(cm_tokenizer_kind(t) == CM_TOK_SPM && cm_tokenizer_n_vocab(t) == 32000);
    CHECK(cm_tokenizer_bos(t) == 1 && cm_tokenizer_eos(t) == 2 && cm_tokenizer_unk(t) == 0 && cm_tokenizer_nl(t) == 13);
    CHECK(cm_tokenizer_add_bos(t) && !cm_tokenizer_add_eos(t));
    CHECK(cm_tokenizer_is_eog(t, 2) && !cm_tokenizer_is_eog(t, 1) && cm_tokenizer_is_control(t, 1));
    cm_token ids[4];
    size_t n;
    CHECK(cm_tokenizer_encode(t, "", 0, CM_TOK_ADD_SPECIAL, ids, 4, &n, g_err, sizeof g_err) == 0 && n == 1 &&
          ids[0] == 1);
    CHECK(cm_tokenizer_encode(t, "", 0, 0, ids, 4, &n, g_err, sizeof g_err) == 0 && n == 0);
    CHECK(cm_tokenizer_encode(t, "Hello", 5, CM_TOK_ADD_SPECIAL, ids, 4, &n, g_err, sizeof g_err) == 0 && n == 2 &&
          ids[0] == 1 && ids[1] == 15043);
    CHECK(cm_tokenizer_encode(t, "Hello world", 11, CM_TOK_ADD_SPECIAL, ids, 2, &n, g_err, sizeof g_err) == CM_ERANGE &&
          n == 3);
    size_t len;
    CHECK(cm_tokenizer_piece(t, 1, false, &len) && len == 0);
    const char *pc = cm_tokenizer_piece(t, 1, true, &len);
    CHECK(pc && len == 3 && !memcmp(pc, "<s>", 3));
    CHECK(cm_tokenizer_piece(t, -1, true, &len) == NULL && cm_tokenizer_piece(t, 32000, true, &len) == NULL);
    CHECK(cm_tokenizer_find(t, "\xe2\x96\x81Hello", 8) == 15043 && cm_tokenizer_find(t, "zzzzqqq", 7) == CM_TOKEN_NULL);
    /* llama_detokenize: the SPM prefix space goes when nothing precedes it... */
    cm_buf b;
    cm_buf_init(&b);
    cm_token hw[] = {1, 15043, 3186};
    CHECK(cm_tokenizer_decode(t, hw + 1, 2, 0, &b, g_err, sizeof g_err) == 0 && !strcmp(b.data, "Hello world"));
    /* ...but not after a BOS (the BOS takes the strip, as in llama.cpp) */
    cm_buf_clear(&b);
    CHECK(cm_tokenizer_decode(t, hw, 3, 0, &b, g_err, sizeof g_err) == 0 && !strcmp(b.data, " Hello world"));
    cm_buf_clear(&b);
    CHECK(cm_tokenizer_decode(t, hw, 3, CM_TOK_UNPARSE_SPECIAL, &b, g_err, sizeof g_err) == 0 &&
          !strcmp(b.data, "<s> Hello world"));
    cm_buf_clear(&b);
    cm_token oob = 99999;
    CHECK(cm_tokenizer_decode(t, &oob, 1, 0, &b, g_err, sizeof g_err) == CM_ERANGE);
    cm_buf_release(&b);
    cm_tokenizer_free(t);

    if (cm_tokenizer_open(&t, t_shared("vocab/ggml-vocab-llama-bpe.gguf"), g_err, sizeof g_err)) {
        CHECKF(0, "%s", g_err);
        return;
    }
    CHECK(cm_tokenizer_kind(t) == CM_TOK_BPE && !strcmp(cm_tokenizer_pre_name(t), "llama-bpe"));
    CHECK(cm_tokenizer_add_bos(t) && cm_tokenizer_bos(t) == 128000 && cm_tokenizer_eot(t) == 128009);
    CHECK(cm_tokenizer_is_eog(t, 128009) && cm_tokenizer_is_eog(t, 128001) && cm_tokenizer_nl(t) == 198);
    CHECK(cm_tokenizer_encode(t, "Hello", 5, CM_TOK_ADD_SPECIAL, ids, 4, &n, g_err, sizeof g_err) == 0 && n == 2 &&
          ids[0] == 128000 && ids[1] == 9906);
    cm_tokenizer_free(t);

    CHECK(cm_tokenizer_open(&t, "/nonexistent/x.gguf", g_err, sizeof g_err) == CM_ENOENT && !t);
    cm_tokenizer_free(NULL);
}

/* ---- hostile vocabularies ---- */

typedef struct vspec {
    const char *model, *pre;
    const char *const *toks;
    int ntok;
    int scores; /* 0 none, 1 f32, 2 short, 3 u8 */
    int types;  /* 0 none, 1 ok, 2 f32, 3 short */
    const char *const *merges;
    int nmerge;
    int64_t bos;
    bool add_bos, tokens_not_array;
} vspec;

static int build_vocab(const vspec *v, cm_buf *out) {
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (v->model) cm_gguf_w_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre) cm_gguf_w_str(w, "tokenizer.ggml.pre", v->pre);
    cm_gguf_str s[64];
    float f[64];
    int32_t y[64];
    uint8_t u8[64];
    for (int i = 0; i < v->ntok; i++) {
        s[i].ptr = v->toks[i];
        s[i].len = strlen(v->toks[i]);
        f[i] = (float)-i;
        u8[i] = 1;
        y[i] = !strncmp(v->toks[i], "<0x", 3) ? 6 : v->toks[i][0] == '<' ? 3 : 1;
    }
    if (v->tokens_not_array) cm_gguf_w_str(w, "tokenizer.ggml.tokens", "abc");
    else cm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", s, (uint64_t)v->ntok);
    if (v->scores == 1) cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_F32, f, (uint64_t)v->ntok);
    if (v->scores == 2) cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_F32, f, (uint64_t)v->ntok - 1);
    if (v->scores == 3) cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_U8, u8, (uint64_t)v->ntok);
    if (v->types == 1) cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_I32, y, (uint64_t)v->ntok);
    if (v->types == 2) cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_F32, f, (uint64_t)v->ntok);
    if (v->types == 3) cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_I32, y, (uint64_t)v->ntok - 1);
    if (v->merges) {
        cm_gguf_str m[16];
        for (int i = 0; i < v->nmerge; i++) {
            m[i].ptr = v->merges[i];
            m[i].len = strlen(v->merges[i]);
        }
        cm_gguf_w_arr_str(w, "tokenizer.ggml.merges", m, (uint64_t)v->nmerge);
    }
    if (v->bos >= 0) cm_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->add_bos) cm_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    int rc = cm_gguf_writer_write_buf(w, out, g_err, sizeof g_err);
    cm_gguf_writer_free(w);
    return rc;
}

/* Build, parse, make a tokenizer; exercise it if it was accepted. */
static int try_vocab(const uint8_t *p, size_t n, cm_rng *r) {
    cm_gguf g = {0};
    cm_tokenizer *t = NULL;
    int rc = cm_gguf_parse(&g, p, n, g_err, sizeof g_err);
    if (!rc) rc = cm_tokenizer_new(&t, &g, g_err, sizeof g_err);
    if (!rc) {
        for (int k = 0; k < 20; k++) {
            char text[256];
            size_t tn = rand_text(r, text, k & 1), ni, ch;
            cm_token *ids;
            if (cm_tokenizer_encode_alloc(t, text, tn, k % 4, &ids, &ni, g_err, sizeof g_err) == 0) {
                cm_buf b;
                cm_buf_init(&b);
                cm_tokenizer_decode(t, ids, ni, k % 4, &b, g_err, sizeof g_err);
                cm_buf_release(&b);
                size_t cap = (ni + 1) * cm_detok_max_out(t);
                char *sb = malloc(cap);
                stream_all(t, ids, ni, k & 1, sb, cap, &ch);
                free(sb);
                cm_free(ids);
            }
        }
    }
    cm_tokenizer_free(t);
    cm_gguf_close(&g);
    return rc;
}

static void test_hostile(void) {
    // clang-format off
    static const char *const spm_toks[] = {"<unk>", "<s>", "</s>", "<0x41>", "<0x0A>", "\xe2\x96\x81", "a", "b", "ab",
                                           ("\xe2\x96\x81" "ab"), ""};
    static const char *const bpe_toks[] = {"a", "b", "c", "ab", "abc", "\xc4\xa0", ("\xc4\xa0" "a"), "<|endoftext|>"};
    // clang-format on
    static const char *const merges[] = {"a b", "ab c", "\xc4\xa0 a", "malformed", "x", " lead", "b ", ""};
    static const char *const dup[] = {"a", "b", "a"};
    cm_rng r;
    cm_rng_seed(&r, 7);
    enum cm_log_level lvl = cm_log_get_level();
    cm_log_set_level(CM_LOG_ERROR); /* bad ids in these vocabs warn by design */
    struct {
        vspec v;
        int want;
        const char *msg;
    } cases[] = {
        {{"llama", NULL, spm_toks, 11, 1, 1, NULL, 0, -1, false, false}, 0, NULL},
        {{"gpt2", "gpt-2", bpe_toks, 8, 0, 1, merges, 8, -1, false, false}, 0, NULL},
        {{"bert", NULL, spm_toks, 11, 1, 1, NULL, 0, -1, false, false}, CM_EUNSUPPORTED, "'bert'"},
        {{"gpt2", "klingon", bpe_toks, 8, 0, 1, merges, 8, -1, false, false}, CM_EUNSUPPORTED, "'klingon'"},
        {{NULL, NULL, spm_toks, 11, 1, 1, NULL, 0, -1, false, false}, CM_EFORMAT, "tokenizer.ggml.model"},
        {{"llama", NULL, spm_toks, 11, 1, 1, NULL, 0, -1, false, true}, CM_EFORMAT, "not an array"},
        {{"llama", NULL, spm_toks, 11, 2, 1, NULL, 0, -1, false, false}, CM_EFORMAT, "scores"},
        {{"llama", NULL, spm_toks, 11, 3, 1, NULL, 0, -1, false, false}, CM_EFORMAT, "scores"},
        {{"llama", NULL, spm_toks, 11, 1, 2, NULL, 0, -1, false, false}, CM_EFORMAT, "token_type"},
        {{"llama", NULL, spm_toks, 11, 1, 3, NULL, 0, -1, false, false}, CM_EFORMAT, "token_type"},
        {{"gpt2", "gpt-2", bpe_toks, 8, 0, 1, NULL, 0, -1, false, false}, CM_EFORMAT, "merges"},
        {{"gpt2", "gpt-2", dup, 3, 0, 0, merges, 8, -1, false, false}, CM_EFORMAT, "same text"},
        {{"llama", NULL, spm_toks, 11, 1, 1, NULL, 0, 1000, false, false}, 0, NULL}, /* bad bos id: default kept */
        {{"gpt2", "gpt-2", bpe_toks, 8, 0, 1, merges, 8, 1000, true, false},
         CM_EFORMAT,
         "BOS"}, /* default 11 out of range */
        {{"llama", NULL, spm_toks, 0, 0, 0, NULL, 0, -1, false, false}, CM_EFORMAT, "tokens"},
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
        cm_buf b;
        cm_buf_init(&b);
        CHECK(build_vocab(&cases[i].v, &b) == 0);
        g_err[0] = 0;
        int rc = try_vocab((const uint8_t *)b.data, b.len, &r);
        CHECKF(rc == cases[i].want && (!cases[i].msg || strstr(g_err, cases[i].msg)), "case %zu: rc %d (%s)", i, rc,
               g_err);
        cm_buf_release(&b);
    }

    /* the accepted tiny vocabs behave */
    cm_buf b;
    cm_buf_init(&b);
    CHECK(build_vocab(&cases[1].v, &b) == 0);
    cm_gguf g = {0};
    cm_tokenizer *t = NULL;
    CHECK(cm_gguf_parse(&g, (const uint8_t *)b.data, b.len, g_err, sizeof g_err) == 0);
    CHECK(cm_tokenizer_new(&t, &g, g_err, sizeof g_err) == 0);
    if (t) {
        cm_token ids[16];
        size_t n;
        CHECK(cm_tokenizer_encode(t, "abc a", 5, 0, ids, 16, &n, g_err, sizeof g_err) == 0 && n == 2 && ids[0] == 4 &&
              ids[1] == 6);
        CHECK(cm_tokenizer_bos(t) == CM_TOKEN_NULL); /* default 11 is out of range */
    }
    cm_tokenizer_free(t);
    cm_gguf_close(&g);
    cm_buf_clear(&b);
    CHECK(build_vocab(&cases[0].v, &b) == 0);
    t = NULL;
    CHECK(cm_gguf_parse(&g, (const uint8_t *)b.data, b.len, g_err, sizeof g_err) == 0);
    CHECK(cm_tokenizer_new(&t, &g, g_err, sizeof g_err) == 0);
    if (t) {
        cm_token ids[16];
        size_t n, len;
        CHECK(cm_tokenizer_encode(t, "ab A", 4, 0, ids, 16, &n, g_err, sizeof g_err) == 0 && n == 3 && ids[0] == 9 &&
              ids[1] == 5 && ids[2] == 3);
        CHECK(cm_tokenizer_encode(t, "z", 1, 0, ids, 16, &n, g_err, sizeof g_err) == CM_EFORMAT); /* no <0x7A> */
        const char *txt = cm_tokenizer_text(t, 10, &len);
        CHECK(txt && len == 10 && !memcmp(txt, "[EMPTY_10]", 10));
    }
    cm_tokenizer_free(t);
    cm_gguf_close(&g);

    /* mutated bytes: whatever parses must build or fail cleanly, and then work */
    size_t accepted = 0;
    for (int base = 0; base < 2; base++) {
        cm_buf_clear(&b);
        CHECK(build_vocab(&cases[base].v, &b) == 0);
        uint8_t *m = malloc(b.len);
        for (int it = 0; it < 400; it++) {
            memcpy(m, b.data, b.len);
            int flips = 1 + (int)(cm_rng_next(&r) % 4);
            for (int k = 0; k < flips; k++) m[cm_rng_next(&r) % b.len] = (uint8_t)cm_rng_next(&r);
            accepted += try_vocab(m, b.len, &r) == 0;
        }
        free(m);
    }
    fprintf(stderr, "  %zu of 800 mutated vocabularies accepted (and exercised)\n", accepted);
    cm_buf_release(&b);
    cm_log_set_level(lvl);
}
