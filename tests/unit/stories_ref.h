/*
 * stories_ref.h: llama.cpp's teacher-forced probabilities for stories260K
 * (shared/reference/stories260K-<type>.probs.txt: 32 positions, 512 ids each)
 * and the max-abs error of ours against them in one batch, for the CPU golden
 * test (test_golden.c) and the GPU one (test_vulkan.c), so both measure the
 * same thing the same way. Test code only: included by test files after test.h.
 */
#ifndef CM_TEST_STORIES_REF_H
#define CM_TEST_STORIES_REF_H

#include "test.h"

#include "model/model.h"
#include "os/os.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct stories_probs {
    int n;            /* positions read (32 for a whole file) */
    int in[32];       /* the token fed at each position */
    float p[32][512]; /* llama.cpp's probabilities after it */
} stories_probs;

static inline int stories_probs_load(stories_probs *P, const char *name, char *err, size_t errlen) {
    char path[256], *txt;
    size_t len;
    snprintf(path, sizeof path, "reference/stories260K-%s.probs.txt", name);
    if (cm_file_read_all(t_shared(path), &txt, &len, err, errlen)) return -1;
    P->n = 0;
    for (char *line = txt; line && *line;) {
        char *nl = strchr(line, '\n'), *e;
        if (nl) *nl = 0;
        if (*line != '#' && *line) {
            int pos = (int)strtol(line, &e, 10);
            if (pos >= 0 && pos < 32) {
                P->in[pos] = (int)strtol(e, &e, 10);
                for (int v = 0; v < 512; v++) P->p[pos][v] = strtof(e, &e);
                P->n++;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    cm_free(txt);
    return 0;
}

/* The 32 reference positions through c (a context of m for 32 tokens; set
 * its offload first to test a device) in one batch, all rows' logits: the
 * largest |probability - llama.cpp's|; 1 when the forward pass fails. */
/* The same over a cache of K/V type t in the transposed layout or as rows
 * (the engine's default since session 15: model.h cm_kv_init_types). */
static inline double stories_probs_err_kv(cm_ctx *c, const cm_model *m, const stories_probs *P, enum cm_type t,
                                          bool rows, char *err, size_t errlen) {
    cm_kv kv;
    if (!c || cm_kv_init_types(&kv, m, 0, m->hp.n_layer, cm_slice_full(m), 512, t, t, rows, err, errlen)) return 1;
    static float logits[32 * 512];
    int32_t ids[32], pos[32], seq[32];
    int8_t want[32];
    for (int i = 0; i < 32; i++) ids[i] = P->in[i], pos[i] = i, seq[i] = 0, want[i] = 1;
    cm_kv *kvs[1] = {&kv};
    cm_batch b = {.n = 32, .tokens = ids, .pos = pos, .seq = seq, .logits = want};
    cm_forward_args a = {.layer_first = 0,
                         .layer_last = m->hp.n_layer,
                         .slice = cm_slice_full(m),
                         .kvs = kvs,
                         .n_kvs = 1,
                         .out_logits = logits};
    double worst = 1;
    if (cm_forward(c, &b, &a, err, errlen) == 0) {
        worst = 0;
        for (int r = 0; r < 32; r++) {
            double mx = logits[r * 512], s = 0, p[512];
            for (int v = 1; v < 512; v++) mx = fmax(mx, logits[r * 512 + v]);
            for (int v = 0; v < 512; v++) s += (p[v] = exp(logits[r * 512 + v] - mx));
            for (int v = 0; v < 512; v++) worst = fmax(worst, fabs(p[v] / s - P->p[r][v]));
        }
    }
    cm_kv_release(&kv);
    return worst;
}

static inline double stories_probs_err(cm_ctx *c, const cm_model *m, const stories_probs *P, char *err, size_t errlen) {
    return stories_probs_err_kv(c, m, P, CM_TYPE_F32, false, err, errlen);
}

#endif
