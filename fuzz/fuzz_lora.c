/*
 * fuzz_lora.c: libFuzzer target for LoRA adapter loading (model/lora.h).
 *
 * Any input that parses as GGUF is offered to cm_lora_add against one tiny
 * fixed model (cm_synth_write: llama, dim 32, 1 layer, 4 heads, 2 KV heads,
 * FFN 64, F32, the builtin vocabulary, seed 3; the seed corpus holds
 * adapters for it made by `cumulo synth --lora-for`). It must return 0 or an
 * error with a message, never crash or leak; an accepted adapter is then
 * applied to every target once (arbitrary values must not fault; NaNs are
 * fine), and its parts (cm_lora_parts_write, what a cluster node receives)
 * must be accepted back by cm_lora_add_parts. Any input that is not GGUF is
 * offered to cm_lora_add_parts as a node's parts from a hostile peer (seeds
 * parts_all.bin: the parts of all_rank2.gguf, version 2; parts_all_v3.bin:
 * the same as version 3, with alphas), then applied, with rows' own scales
 * too. Never writes to disk.
 */
#include "gguf/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "synth/synth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                             \
    do {                                                                       \
        if (!(x)) {                                                            \
            fprintf(stderr, "fuzz_lora: %s failed (line %d)\n", #x, __LINE__); \
            abort();                                                           \
        }                                                                      \
    } while (0)

static cm_buf g_vocab_bytes, g_model_bytes;
static cm_gguf g_vocab, g_model_gguf;
static cm_model g_model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[512];
    cm_buf_init(&g_vocab_bytes);
    cm_buf_init(&g_model_bytes);
    REQUIRE(cm_synth_builtin_vocab(&g_vocab_bytes, err, sizeof err) == 0);
    REQUIRE(cm_gguf_parse(&g_vocab, (const uint8_t *)g_vocab_bytes.data, g_vocab_bytes.len, err, sizeof err) == 0);
    cm_synth_params p = {.arch = "llama",
                         .n_embd = 32,
                         .n_layer = 1,
                         .n_head = 4,
                         .n_head_kv = 2,
                         .n_ff = 64,
                         .type = "f32",
                         .seed = 3,
                         .n_threads = 1};
    REQUIRE(cm_synth_write(&p, &g_vocab, NULL, &g_model_bytes, err, sizeof err) == 0);
    REQUIRE(cm_gguf_parse(&g_model_gguf, (const uint8_t *)g_model_bytes.data, g_model_bytes.len, err, sizeof err) == 0);
    REQUIRE(cm_model_load(&g_model, &g_model_gguf, err, sizeof err) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    cm_gguf g;
    /* The parser keeps pointers into the bytes: give it its own aligned copy. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    if (cm_gguf_parse(&g, copy, size, err, sizeof err) == 0) {
        cm_lora *l = cm_lora_new(&g_model);
        REQUIRE(l != NULL);
        err[0] = 0;
        int rc = cm_lora_add(l, &g, 0.5f, err, sizeof err);
        REQUIRE(rc == 0 || (rc < 0 && err[0]));
        REQUIRE(rc != 0 || cm_lora_count(l) == 1);
        if (rc == 0) {
            static float x[2 * 64], y[2 * 512];
            for (int i = 0; i < 2 * 64; i++) x[i] = (float)(i % 7) - 3.0f;
            for (int t = 0; t < CM_LORA_TARGET_COUNT; t++) {
                int64_t n_in = t == CM_LORA_O ? 32 : t == CM_LORA_DOWN ? 64 : 32;
                int64_t n_out = t == CM_LORA_K || t == CM_LORA_V       ? 16
                                : t == CM_LORA_GATE || t == CM_LORA_UP ? 64
                                : t == CM_LORA_OUTPUT                  ? g_model.hp.n_vocab
                                                                       : 32;
                if (n_out > 512) n_out = 512;
                cm_lora_apply(l, 0, (enum cm_lora_target)t, x, 64, 0, n_in, 2, y, 512, 0, 0, n_out);
            }
        }
        if (rc == 0) { /* the cluster's parts of an accepted set round-trip */
            cm_buf b;
            cm_buf_init(&b);
            int n = 0;
            REQUIRE(cm_lora_parts_write(l, 0, 1, true, NULL, false, &b, &n) == 0 && n == cm_lora_n_pairs(l));
            cm_lora *w = cm_lora_new(&g_model);
            REQUIRE(w && cm_lora_add_parts(w, (const uint8_t *)b.data, b.len, err, sizeof err) == 0);
            REQUIRE(cm_lora_n_pairs(w) == n && cm_lora_covers(w, NULL, false));
            cm_lora_free(w);
            const cm_slice sl = {1, 2, 16, 48}; /* a tensor-parallel member's slice of the same */
            cm_buf_clear(&b);
            REQUIRE(cm_lora_parts_write(l, 0, 1, true, &sl, true, &b, &n) == 0);
            w = cm_lora_new(&g_model);
            REQUIRE(w && cm_lora_add_parts(w, (const uint8_t *)b.data, b.len, err, sizeof err) == 0);
            REQUIRE(cm_lora_covers(w, &sl, true));
            cm_lora_free(w);
            cm_buf_release(&b);
        }
        cm_lora_free(l);
        cm_gguf_close(&g);
    } else { /* a node's LoRA parts from a peer */
        cm_lora *l = cm_lora_new(&g_model);
        REQUIRE(l != NULL);
        err[0] = 0;
        int rc = cm_lora_add_parts(l, copy, size, err, sizeof err);
        REQUIRE(rc == 0 || (rc < 0 && err[0]));
        REQUIRE(rc == 0 || cm_lora_n_pairs(l) == 0);
        if (rc == 0 && cm_lora_covers(l, NULL, false)) { /* whole pairs: apply them (the model's shapes) */
            static float x[2 * 64], y[2 * 512];
            for (int i = 0; i < 2 * 64; i++) x[i] = (float)(i % 5) - 2.0f;
            for (int t = 0; t < CM_LORA_O; t++)
                cm_lora_apply(l, 0, (enum cm_lora_target)t, x, 64, 0, 32, 2, y, 512, 0, 0, 16);
            /* version 3 (alphas): rows' own scales too (SEQ_LORA's), any adapter count */
            static float sc[4096];
            for (int a = 0; a < cm_lora_count(l) && a < 4096; a++) sc[a] = (float)(a % 3) - 0.5f;
            const float *rows[2] = {sc, NULL};
            if (cm_lora_rows_ok(l) && cm_lora_count(l) <= 4096)
                for (int t = 0; t < CM_LORA_O; t++)
                    cm_lora_apply_rows(l, 0, (enum cm_lora_target)t, x, 64, 0, 32, 2, y, 512, 0, 0, 16, rows);
        }
        cm_lora_free(l);
    }
    free(copy);
    return 0;
}
