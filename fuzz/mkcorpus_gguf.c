/*
 * mkcorpus_gguf.c: writes the seed corpus of fuzz_gguf into a folder: tiny
 * valid files made with our writer (every value type, nested arrays, several
 * tensor types and alignments, the low-bit types, a small vocabulary) and a
 * few malformed ones.
 * Not built by the Makefile; regenerate by hand:
 *   make build/libcumulo.a && cc -std=c11 -D_GNU_SOURCE -Isrc -o /tmp/mkc fuzz/mkcorpus_gguf.c \
 *     build/libcumulo.a -lm -lpthread && /tmp/mkc fuzz/corpus/gguf
 */
#include "gguf/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static void save(const char *name, const void *p, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

static cm_buf finish(cm_gguf_writer *w) {
    cm_buf b;
    cm_buf_init(&b);
    char err[256];
    if (cm_gguf_writer_write_buf(w, &b, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    cm_gguf_writer_free(w);
    return b;
}

static void save_buf(const char *name, cm_buf *b) { save(name, b->data, b->len); }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mkcorpus_gguf DIR\n");
        return 2;
    }
    dir = argv[1];
    static uint8_t bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 37 + 11);

    cm_buf b = finish(cm_gguf_writer_new(32));
    save_buf("empty_v3.gguf", &b);
    cm_wr_u32((uint8_t *)b.data + 4, 2);
    save_buf("empty_v2.gguf", &b);
    cm_wr_u32((uint8_t *)b.data + 4, 1);
    save_buf("bad_v1.gguf", &b);
    cm_buf_release(&b);

    /* Every value type and two tensors. */
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    cm_gguf_w_str(w, "general.architecture", "llama");
    cm_gguf_w_u8(w, "u8", 200);
    cm_gguf_w_i8(w, "i8", -5);
    cm_gguf_w_u16(w, "u16", 65535);
    cm_gguf_w_i16(w, "i16", -300);
    cm_gguf_w_u32(w, "u32", 7);
    cm_gguf_w_i32(w, "i32", -7);
    cm_gguf_w_u64(w, "u64", UINT64_MAX);
    cm_gguf_w_i64(w, "i64", INT64_MIN);
    cm_gguf_w_f32(w, "f32", 1e-5f);
    cm_gguf_w_f64(w, "f64", 0.5);
    cm_gguf_w_bool(w, "bool", true);
    int32_t ai[4] = {1, -2, 3, -4};
    float af[3] = {0.25f, -1, 3};
    bool ab[2] = {true, false};
    cm_gguf_w_arr(w, "ai32", CM_GGUF_I32, ai, 4);
    cm_gguf_w_arr(w, "af32", CM_GGUF_F32, af, 3);
    cm_gguf_w_arr(w, "abool", CM_GGUF_BOOL, ab, 2);
    cm_gguf_w_arr(w, "au8", CM_GGUF_U8, bytes, 5);
    cm_gguf_str ss[3] = {{"a", 1}, {"", 0}, {"\xe2\x96\x81x", 4}};
    cm_gguf_w_arr_str(w, "astr", ss, 3);
    int64_t ne1[2] = {32, 2}, ne2[1] = {3};
    cm_gguf_w_tensor(w, "q", CM_TYPE_Q8_0, 2, ne1, bytes);
    cm_gguf_w_tensor(w, "f", CM_TYPE_F32, 1, ne2, bytes);
    b = finish(w);
    save_buf("all_types.gguf", &b);
    save("truncated.gguf", b.data, b.len / 2);
    cm_buf c;
    cm_buf_init(&c);
    cm_buf_append(&c, b.data, b.len);
    char *q = memmem(c.data, c.len, "f\1\0\0\0", 5); /* tensor "f": name, n_dims 1 */
    if (q) {
        cm_wr_u64((uint8_t *)q + 5 + 8 + 4, 65);
        save_buf("bad_misaligned.gguf", &c);
    }
    c.data[0] = 'X';
    save_buf("bad_magic.gguf", &c);
    cm_buf_release(&c);
    cm_buf_release(&b);

    /* Several tensor types, alignment 64 then 1. */
    for (int k = 0; k < 2; k++) {
        w = cm_gguf_writer_new(k ? 1 : 64);
        int64_t nk[1] = {256}, nf[2] = {5, 3}, nq[3] = {32, 1, 2};
        cm_gguf_w_tensor(w, "k", CM_TYPE_Q4_K, 1, nk, bytes);
        cm_gguf_w_tensor(w, "h", CM_TYPE_F16, 2, nf, bytes);
        cm_gguf_w_tensor(w, "q4", CM_TYPE_Q4_0, 3, nq, bytes);
        cm_gguf_w_tensor(w, "b", CM_TYPE_BF16, 1, nf, bytes);
        b = finish(w);
        save_buf(k ? "types_align1.gguf" : "types_align64.gguf", &b);
        cm_buf_release(&b);
    }

    /* The low-bit types the kernels run, and one they do not (iq2_xxs). */
    w = cm_gguf_writer_new(32);
    {
        int64_t n256[2] = {256, 2}, n32[2] = {64, 2};
        cm_gguf_w_tensor(w, "q2", CM_TYPE_Q2_K, 2, n256, bytes);
        cm_gguf_w_tensor(w, "q3", CM_TYPE_Q3_K, 2, n256, bytes);
        cm_gguf_w_tensor(w, "nl", CM_TYPE_IQ4_NL, 2, n32, bytes);
        cm_gguf_w_tensor(w, "xs", CM_TYPE_IQ4_XS, 2, n256, bytes);
        cm_gguf_w_tensor(w, "mx", CM_TYPE_MXFP4, 2, n32, bytes);
        cm_gguf_w_tensor(w, "i2", CM_TYPE_IQ2_XXS, 2, n256, bytes);
    }
    b = finish(w);
    save_buf("types_lowbit.gguf", &b);
    cm_buf_release(&b);

    /* A small vocabulary, as a tokenizer reads it. */
    w = cm_gguf_writer_new(32);
    cm_gguf_w_str(w, "tokenizer.ggml.model", "llama");
    cm_gguf_str tok[12];
    float sc[12];
    int32_t tt[12];
    const char *t[12] = {"<unk>",           "<s>", "</s>", "<0x00>", "\xe2\x96\x81", "a", "b", "ab",
                         "\xe2\x96\x81the", "e",   "th",   "he"};
    for (int i = 0; i < 12; i++) {
        tok[i] = (cm_gguf_str){t[i], strlen(t[i])};
        sc[i] = -(float)i;
        tt[i] = i < 3 ? 3 : i == 3 ? 6 : 1;
    }
    cm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, 12);
    cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_F32, sc, 12);
    cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_I32, tt, 12);
    cm_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    b = finish(w);
    save_buf("vocab.gguf", &b);
    cm_buf_release(&b);

    /* Nested arrays (hand-built: the writer only copies them). */
    static const uint8_t nested[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0,   0, 0, 0, 0, 1, 0, 0, 0, 0,
        0,   0,   0,   1,   0, 0, 0, 0, 0, 0, 0, 'n', 9, 0, 0, 0,                  /* key "n", array */
        9,   0,   0,   0,   2, 0, 0, 0, 0, 0, 0, 0,                                /* of 2 arrays */
        0,   0,   0,   0,   2, 0, 0, 0, 0, 0, 0, 0,   1, 2,                        /* [u8 1, 2] */
        8,   0,   0,   0,   1, 0, 0, 0, 0, 0, 0, 0,   1, 0, 0, 0, 0, 0, 0, 0, 'x', /* ["x"] */
    };
    save("nested.gguf", nested, sizeof nested);
    return 0;
}
