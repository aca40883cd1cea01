/*
 * fuzz_finetune.c: libFuzzer target for fine-tuning data (train/train_data.h).
 *
 * Any bytes are offered to cm_tdata_parse as a JSONL file, with the builtin
 * vocabulary's tokenizer and the chatml template (so "messages" lines are
 * rendered too). It must return 0 or an error naming a line, never crash or
 * leak; accepted data is then packed into windows of a context taken from
 * the first byte, and every window filled (indices must stay in range).
 * Never writes to disk.
 */
#include "synth/synth.h"
#include "train/train_data.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                                 \
    do {                                                                           \
        if (!(x)) {                                                                \
            fprintf(stderr, "fuzz_finetune: %s failed (line %d)\n", #x, __LINE__); \
            abort();                                                               \
        }                                                                          \
    } while (0)

static cm_buf g_vocab_bytes;
static cm_gguf g_vocab;
static cm_tokenizer *g_tok;
static cm_chat_template g_tpl;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[512];
    cm_buf_init(&g_vocab_bytes);
    REQUIRE(cm_synth_builtin_vocab(&g_vocab_bytes, err, sizeof err) == 0);
    REQUIRE(cm_gguf_parse(&g_vocab, (const uint8_t *)g_vocab_bytes.data, g_vocab_bytes.len, err, sizeof err) == 0);
    REQUIRE(cm_tokenizer_new(&g_tok, &g_vocab, err, sizeof err) == 0);
    REQUIRE(cm_chat_template_by_name(&g_tpl, "chatml", err, sizeof err) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    cm_tdata d;
    cm_chat_opts co = {.tokenizer_adds_bos = true, .bos = "<s>", .eos = "</s>"};
    int rc = cm_tdata_parse(&d, data, size, "fuzz.jsonl", g_tok, &g_tpl, &co, err, sizeof err);
    if (rc) {
        REQUIRE(err[0] != 0);
        return 0;
    }
    REQUIRE(d.n_ex > 0 && d.ex_off[d.n_ex] == d.n_tok);
    const int n_ctx = 2 + (size ? data[0] % 64 : 0);
    int *ex = malloc((size_t)d.n_ex * sizeof(int));
    for (int i = 0; i < d.n_ex; i++) ex[i] = i;
    cm_twin *w = NULL;
    int nw = 0;
    REQUIRE(cm_tdata_pack(&d, ex, d.n_ex, n_ctx, &w, &nw, err, sizeof err) == 0);
    int32_t tok[66], tgt[66];
    for (int i = 0; i < nw; i++) {
        REQUIRE(w[i].len >= 2 && w[i].len <= n_ctx + 1 && w[i].off >= 0 && w[i].off + w[i].len <= d.n_tok);
        REQUIRE(cm_twin_fill(&d, w[i], tok, tgt) == w[i].len - 1);
    }
    free(ex);
    cm_free(w);
    cm_tdata_release(&d);
    return 0;
}
