/*
 * constrain.c: grammar-constrained generation for the engine (a request's
 * cm_gen_params.grammar: JSON Schema output, forced tool calls). Before each
 * sample the session's logits are masked to the tokens whose text keeps the
 * grammar alive (cm_grammar_mask); the chosen token's text is then fed to
 * the grammar. The token texts come from one table per engine (bytes of
 * every id as the detokenizer would write them; control tokens never
 * match, end-of-generation ids only when the text is complete), built on
 * first use under the engine lock and kept until the engine is freed.
 *
 * The sampling always happens here, where the token texts are: on this
 * machine, in a tensor-parallel group (rank 0 samples here), and on a
 * pipeline too: a constrained sequence asks the last stage for its logits
 * (CM_PIPE_WANT_LOGITS, batch.c) instead of a sampled token, so it gets the
 * token one machine would.
 */
#include "engine_impl.h"

#include "../sampler/grammar.h"

#include <string.h>

typedef struct gvocab {
    cm_grammar_vocab v;
    uint32_t *off;
    char *bytes;
    bool *eog, *never;
} gvocab;

void cm_engine_gvocab_free(cm_engine *e) {
    gvocab *g = e->gvocab;
    if (!g) return;
    cm_free(g->off);
    cm_free(g->bytes);
    cm_free(g->eog);
    cm_free(g->never);
    cm_free(g);
    e->gvocab = NULL;
}

static const cm_grammar_vocab *vocab(cm_engine *e, char *err, size_t errlen) {
    pthread_mutex_lock(&e->mu);
    gvocab *g = e->gvocab;
    if (g) {
        pthread_mutex_unlock(&e->mu);
        return &g->v;
    }
    int n = e->m.hp.n_vocab, nt = cm_tokenizer_n_vocab(e->tok);
    g = cm_calloc(1, sizeof *g);
    size_t cap = (size_t)n * 8 + 64, len = 0;
    if (g) {
        g->off = cm_malloc(((size_t)n + 1) * sizeof *g->off);
        g->bytes = cm_malloc(cap);
        g->eog = cm_calloc((size_t)n, sizeof *g->eog);
        g->never = cm_calloc((size_t)n, sizeof *g->never);
    }
    if (!g || !g->off || !g->bytes || !g->eog || !g->never) goto oom;
    char piece[256];
    for (int id = 0; id < n; id++) {
        g->off[id] = (uint32_t)len;
        if (id >= nt) {
            g->never[id] = true;
            continue;
        } /* embedding rows past the vocabulary */
        if (cm_tokenizer_is_eog(e->tok, id)) {
            g->eog[id] = true;
            continue;
        }
        if (cm_tokenizer_is_control(e->tok, id)) {
            g->never[id] = true;
            continue;
        }
        int k = cm_engine_token_piece(e, id, piece, sizeof piece);
        if (k <= 0) {
            g->never[id] = true;
            continue;
        }
        if (len + (size_t)k > cap) {
            cap = 2 * cap + (size_t)k;
            char *b = cm_realloc(g->bytes, cap);
            if (!b) goto oom;
            g->bytes = b;
        }
        memcpy(g->bytes + len, piece, (size_t)k);
        len += (size_t)k;
    }
    g->off[n] = (uint32_t)len;
    g->v = (cm_grammar_vocab){.n_vocab = n, .off = g->off, .bytes = g->bytes, .eog = g->eog, .never = g->never};
    e->gvocab = g;
    pthread_mutex_unlock(&e->mu);
    return &g->v;
oom:
    if (g) {
        cm_free(g->off);
        cm_free(g->bytes);
        cm_free(g->eog);
        cm_free(g->never);
        cm_free(g);
    }
    pthread_mutex_unlock(&e->mu);
    cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    return NULL;
}

int cm_constrain_begin(cm_session *s, const cm_gen_params *p, cm_grammar_state **out, char *err, size_t errlen) {
    *out = NULL;
    if (!p->grammar) return 0;
    if (!vocab(s->e, err, errlen)) return CM_ENOMEM;
    *out = cm_grammar_state_new(p->grammar);
    return *out ? 0 : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
}

int cm_constrain_mask(cm_session *s, cm_grammar_state *gs) {
    return cm_grammar_mask(gs, &((gvocab *)s->e->gvocab)->v, s->logits);
}

int cm_constrain_take(cm_session *s, cm_grammar_state *gs, int32_t id) {
    const cm_grammar_vocab *v = &((gvocab *)s->e->gvocab)->v;
    if (id < 0 || id >= v->n_vocab || v->eog[id]) return 0;
    return cm_grammar_accept(gs, v->bytes + v->off[id], v->off[id + 1] - v->off[id]);
}
