/*
 * fuzz_tokenizer.c: libFuzzer target for the tokenizer.
 *
 * Byte 0 picks a small in-memory vocabulary (SPM, or byte-level BPE under one
 * of several pre-tokenizers) or, when it is 0xFF, says the rest is a whole
 * GGUF file to build a tokenizer from; byte 1 holds the encode/decode flags;
 * the rest is the text. Encode, decode and stream must return cleanly, ids
 * must be in range, and the stream must only ever emit valid UTF-8.
 * Never writes to disk.
 */
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                                  \
    do {                                                                            \
        if (!(x)) {                                                                 \
            fprintf(stderr, "fuzz_tokenizer: %s failed (line %d)\n", #x, __LINE__); \
            abort();                                                                \
        }                                                                           \
    } while (0)

static const char *const k_pres[] = {"gpt-2",          "llama-bpe", "qwen2",     "deepseek-llm",
                                     "deepseek-coder", "falcon",    "starcoder", "default",
                                     "tekken",         "gpt-4o",    "poro-chat", "deepseek-v3"};
#define N_TOK (1 + (int)(sizeof k_pres / sizeof k_pres[0]))
static cm_tokenizer *g_tok[N_TOK];
static cm_buf g_files[N_TOK];
static cm_gguf g_gguf[N_TOK];

static bool valid_utf8(const char *p, size_t n) {
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
        i += l;
    }
    return true;
}

/* A tiny vocabulary: every byte (as <0xXX> for SPM, GPT-2 mapped for BPE),
 * a few words, specials of every kind, and merges. */
static void build(int which) {
    static const char *const words[] = {
        "<unk>", "<s>", "</s>", "<|im_end|>", "<|user|>",  "\xe2\x96\x81", "\xe2\x96\x81he",
        "he",    "ll",  "llo",  "hello",      "\xc4\xa0h", "\xc4\xa0he",   "\xe4\xb8\xad"};
    static const char *const merges[] = {"h e",        "l l",         "ll o",           "he llo",
                                         "\xc4\xa0 h", "\xc4\xa0h e", "\xe2\x96\x81 he"};
    cm_gguf_str s[300];
    float sc[300];
    int32_t ty[300];
    char bytes[256][8];
    int n = 0;
    bool spm = which == 0;
    for (size_t i = 0; i < sizeof words / sizeof *words; i++, n++) {
        s[n].ptr = words[i];
        s[n].len = strlen(words[i]);
        sc[n] = -(float)n;
        ty[n] = words[i][0] == '<' && words[i][1] != '0' ? (i == 4 ? 4 : 3) : 1;
    }
    for (int b = 0; b < 256; b++, n++) {
        if (spm) snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        else {
            unsigned cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? (unsigned)b
                          : b <= 0x20                                                       ? 256u + (unsigned)b
                          : b <= 0xA0 ? 256u + 33 + (unsigned)(b - 0x7F)
                                      : 256u + 67;
            if (cp < 0x80) {
                bytes[b][0] = (char)cp;
                bytes[b][1] = 0;
            } else {
                bytes[b][0] = (char)(0xC0 | (cp >> 6));
                bytes[b][1] = (char)(0x80 | (cp & 0x3F));
                bytes[b][2] = 0;
            }
        }
        s[n].ptr = bytes[b];
        s[n].len = strlen(bytes[b]);
        sc[n] = -100.0f - (float)b;
        ty[n] = spm ? 6 : 1;
    }
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    cm_gguf_w_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!spm) cm_gguf_w_str(w, "tokenizer.ggml.pre", k_pres[which - 1]);
    cm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", s, (uint64_t)n);
    cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_F32, sc, (uint64_t)n);
    cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_I32, ty, (uint64_t)n);
    cm_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    cm_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (!spm) {
        cm_gguf_str m[8];
        for (int i = 0; i < 7; i++) {
            m[i].ptr = merges[i];
            m[i].len = strlen(merges[i]);
        }
        cm_gguf_w_arr_str(w, "tokenizer.ggml.merges", m, 7);
    }
    char err[256];
    cm_buf_init(&g_files[which]);
    REQUIRE(cm_gguf_writer_write_buf(w, &g_files[which], err, sizeof err) == 0);
    cm_gguf_writer_free(w);
    REQUIRE(cm_gguf_parse(&g_gguf[which], (const uint8_t *)g_files[which].data, g_files[which].len, err, sizeof err) ==
            0);
    int rc = cm_tokenizer_new(&g_tok[which], &g_gguf[which], err, sizeof err);
    if (rc) fprintf(stderr, "fuzz_tokenizer: %s\n", err);
    REQUIRE(rc == 0);
}

static void exercise(const cm_tokenizer *t, const char *text, size_t n, uint8_t fl) {
    char err[256];
    cm_token *ids;
    size_t ni;
    if (cm_tokenizer_encode_alloc(t, text, n, fl & 3, &ids, &ni, err, sizeof err)) return;
    for (size_t i = 0; i < ni; i++) REQUIRE(ids[i] >= 0 && ids[i] < cm_tokenizer_n_vocab(t));
    cm_buf b;
    cm_buf_init(&b);
    REQUIRE(cm_tokenizer_decode(t, ids, ni, (fl >> 2) & 3, &b, err, sizeof err) == 0);
    cm_buf_release(&b);
    cm_detok d;
    cm_detok_init(&d, t, (fl >> 4) & 1, (fl >> 5) & 1);
    size_t cap = cm_detok_max_out(t), k;
    char *out = malloc(cap);
    for (size_t i = 0; i < ni; i++) {
        REQUIRE(cm_detok_push(&d, ids[i], out, cap, &k) == 0);
        REQUIRE(k <= cap && valid_utf8(out, k));
    }
    REQUIRE(cm_detok_flush(&d, out, cap, &k) == 0 && valid_utf8(out, k));
    free(out);
    cm_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    if (!g_tok[0]) {
        cm_log_set_level(CM_LOG_ERROR);
        for (int i = 0; i < N_TOK; i++) build(i);
    }
    if (data[0] == 0xFF) {
        cm_gguf g = {0};
        cm_tokenizer *t = NULL;
        char err[256];
        if (cm_gguf_parse(&g, data + 2, size - 2, err, sizeof err) == 0 &&
            cm_tokenizer_new(&t, &g, err, sizeof err) == 0) {
            static const char sample[] = "Hello world <s> </s> \xe4\xb8\xad \xf0\x9f\x98\x80 it's 12345\n\t x";
            exercise(t, sample, sizeof sample - 1, data[1]);
        }
        cm_tokenizer_free(t);
        cm_gguf_close(&g);
        return 0;
    }
    exercise(g_tok[data[0] % N_TOK], (const char *)data + 2, size - 2, data[1]);
    return 0;
}
