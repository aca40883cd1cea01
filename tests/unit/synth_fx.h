/*
 * synth_fx.h: a synthetic model held open for a test (cm_synth_write into a
 * buffer, parsed, loaded) and the logits of every position of a fixed 12-token
 * prompt fed in batches of any size: what test_moe.c and test_gptoss.c share
 * to show that results do not depend on how tokens are batched or threaded.
 * synth_fx_write puts a synthetic model into a file (test_kv_mem.c,
 * test_kv_blocks.c, test_kv_copy.c load it through the engine).
 * Test code only: static functions, included by test files, never by src/.
 */
#ifndef CM_TEST_SYNTH_FX_H
#define CM_TEST_SYNTH_FX_H

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "synth/synth.h"

#include <stdio.h>
#include <string.h>

typedef struct synth_fx {
    cm_buf file;
    cm_gguf g;
    cm_model m;
} synth_fx;

/* Writes the model sp describes (vocabulary from vocab) and loads it; on
 * failure prints "  <what>: <err>" and returns -1 (release with
 * synth_fx_close either way). */
static inline int synth_fx_open(synth_fx *f, const cm_synth_params *sp, const cm_gguf *vocab, const char *what,
                                char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    cm_buf_init(&f->file);
    if (cm_synth_write(sp, vocab, NULL, &f->file, err, errlen) ||
        cm_gguf_parse(&f->g, (const uint8_t *)f->file.data, f->file.len, err, errlen) ||
        cm_model_load(&f->m, &f->g, err, errlen)) {
        fprintf(stderr, "  %s: %s\n", what, err);
        return -1;
    }
    return 0;
}

/* Writes the model sp describes, with cumulo's builtin vocabulary, to the
 * file path (for tests that load it by name through the engine). 0 or -1
 * with err set. */
static inline int synth_fx_write(const cm_synth_params *sp, const char *path, char *err, size_t errlen) {
    cm_buf vb;
    cm_buf_init(&vb);
    cm_gguf voc = {0};
    const int bad = cm_synth_builtin_vocab(&vb, err, errlen) ||
                    cm_gguf_parse(&voc, (const uint8_t *)vb.data, vb.len, err, errlen) ||
                    cm_synth_write(sp, &voc, path, NULL, err, errlen);
    cm_gguf_close(&voc);
    cm_buf_release(&vb);
    return bad ? -1 : 0;
}

static inline void synth_fx_close(synth_fx *f) {
    cm_model_release(&f->m);
    cm_gguf_close(&f->g);
    cm_buf_release(&f->file);
}

#define SYNTH_NTOK 12
static const int32_t synth_prompt[SYNTH_NTOK] = {1, 450, 4996, 17354, 1701, 432, 12500, 975, 15043, 29892, 920, 338};

/* Logits of every position of synth_prompt (out: SYNTH_NTOK x n_vocab), fed
 * in batches of `step` tokens into a cache of kv_type (F32 or F16). */
static inline int synth_run_steps(const cm_model *m, cm_pool *pool, int step, enum cm_type kv_type, float *out,
                                  char *err, size_t errlen) {
    const int V = m->hp.n_vocab;
    cm_ctx *c = cm_ctx_new(m, SYNTH_NTOK, 64, pool, err, errlen);
    cm_kv kv;
    if (!c || cm_kv_init_type(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 64, kv_type, err, errlen)) {
        cm_ctx_free(c);
        return -1;
    }
    int rc = 0;
    for (int done = 0; done < SYNTH_NTOK && !rc; done += step) {
        int nb = CM_MIN(step, SYNTH_NTOK - done);
        int32_t pos[SYNTH_NTOK], seq[SYNTH_NTOK];
        int8_t want[SYNTH_NTOK];
        for (int i = 0; i < nb; i++) pos[i] = done + i, seq[i] = 0, want[i] = 1;
        cm_kv *kvs[1] = {&kv};
        cm_batch b = {.n = nb, .tokens = synth_prompt + done, .pos = pos, .seq = seq, .logits = want};
        cm_forward_args a = {.layer_first = 0,
                             .layer_last = m->hp.n_layer,
                             .slice = cm_slice_full(m),
                             .kvs = kvs,
                             .n_kvs = 1,
                             .out_logits = out + (size_t)done * V};
        rc = cm_forward(c, &b, &a, err, errlen);
    }
    cm_kv_release(&kv);
    cm_ctx_free(c);
    return rc;
}

#endif
