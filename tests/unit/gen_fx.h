/*
 * gen_fx.h: what one generation produced (its text, how many tokens, the sum
 * of the sampled tokens' logprobs), gathered by a cm_session_generate
 * callback, for tests that compare two generations bit for bit
 * (test_kv_mem.c, test_kv_copy.c). Test code only: static functions,
 * included by test files, never by src/.
 */
#ifndef CM_TEST_GEN_FX_H
#define CM_TEST_GEN_FX_H

#include "base/base.h"
#include "engine/engine.h"

#include <stdbool.h>
#include <string.h>

typedef struct gen_out {
    cm_buf b;
    int n_tok;
    double lp_sum;
} gen_out;

/* cm_session_generate's callback; u is a zeroed gen_out. */
static inline int gen_out_cb(void *u, const cm_token_event *ev) {
    gen_out *o = u;
    if (ev->id >= 0) {
        o->n_tok++;
        if (ev->info) o->lp_sum += ev->info->logprob;
    }
    cm_buf_append(&o->b, ev->text, ev->len);
    return 0;
}

/* The same tokens, text and logprobs, bit for bit. */
static inline bool gen_out_same(const gen_out *a, const gen_out *b) {
    return a->n_tok == b->n_tok && a->b.len == b->b.len && (!a->b.len || !memcmp(a->b.data, b->b.data, a->b.len)) &&
           a->lp_sum == b->lp_sum;
}

#endif
