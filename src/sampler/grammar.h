/*
 * grammar: constrained sampling. A context-free grammar over BYTES, built
 * rule by rule (each rule: alternatives, each a sequence of byte sets and
 * references to rules; recursion allowed, except left recursion), and a
 * matcher that follows it incrementally: a token is allowed next when every
 * byte of its text keeps some parse alive. The JSON-schema compiler
 * (json_schema.c) builds grammars with this API; the engine masks logits
 * with cm_grammar_mask before each sample and feeds the chosen token's
 * bytes with cm_grammar_accept.
 *
 * The matcher is a set of parse stacks (llama.cpp's approach): each stack
 * is a chain of continuation positions, the top always a byte set. Stacks
 * live in an arena that is compacted after each accepted token; checking a
 * token uses scratch space above it and gives it back; a computed mask is
 * cached by the state's shape (inside a string every token repeats it), the
 * only allocation after the state is made. Limits: at most CM_GRAMMAR_MAX_STACKS live stacks (a grammar
 * ambiguous enough to exceed them is reported, not followed wrongly), rule
 * nesting at most CM_GRAMMAR_MAX_DEPTH per byte (left recursion is refused
 * by it).
 *
 * Ownership: a cm_grammar is immutable once finished and may be shared by
 * any number of states on any threads; a state is one sequence's, one
 * thread at a time.
 */
#ifndef CM_GRAMMAR_H
#define CM_GRAMMAR_H

#include "base/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_GRAMMAR_MAX_STACKS 512
#define CM_GRAMMAR_MAX_DEPTH 256

typedef struct cm_grammar cm_grammar;

/* ---- building ---- */
cm_grammar *cm_grammar_new(void);    /* NULL: out of memory */
void cm_grammar_free(cm_grammar *g); /* NULL is a no-op */
/* A new rule (no alternatives yet); returns its id, or -1 when out of memory. */
int cm_grammar_rule(cm_grammar *g);
/* Start the next alternative of rule r (its first one is implicit). */
void cm_grammar_alt(cm_grammar *g, int r);
/* Append to rule r's current alternative: the bytes of s, one by one. */
void cm_grammar_lit(cm_grammar *g, int r, const char *s);
/* Append one byte from [lo, hi]. */
void cm_grammar_range(cm_grammar *g, int r, unsigned lo, unsigned hi);
/* Append one byte from a set given as a 256-bit map (bit b of bits[b/64]). */
void cm_grammar_set(cm_grammar *g, int r, const uint64_t bits[4]);
/* Append a reference to rule sub. */
void cm_grammar_ref(cm_grammar *g, int r, int sub);
/* Freeze with root rule root. Checks that every referenced rule has an
 * alternative and that the grammar can start (no left recursion). 0 or
 * CM_EINVAL / CM_ENOMEM with a message. */
int cm_grammar_finish(cm_grammar *g, int root, char *err, size_t errlen);
int cm_grammar_n_rules(const cm_grammar *g);

/* ---- matching ---- */
typedef struct cm_grammar_state cm_grammar_state;
/* A matcher at the start of g (finished). NULL on out of memory. */
cm_grammar_state *cm_grammar_state_new(const cm_grammar *g);
void cm_grammar_state_free(cm_grammar_state *s); /* NULL is a no-op */
/* Would these n bytes keep the parse alive? (n == 0: true.) Never allocates. */
bool cm_grammar_allows(cm_grammar_state *s, const char *p, size_t n);
/* Take n bytes. CM_EINVAL (state unchanged) when they do not fit. */
int cm_grammar_accept(cm_grammar_state *s, const char *p, size_t n);
/* The text so far is a whole sentence of the grammar (the reply may end here). */
bool cm_grammar_complete(const cm_grammar_state *s);
/* Nothing more may follow (complete, and no longer sentence continues it). */
bool cm_grammar_done(const cm_grammar_state *s);

/* Token texts for masking: n_vocab entries, piece i = bytes[off[i] .. off[i+1]);
 * allowed[i] false for ids that never match (control tokens); eog[i] marks ids that end a
 * reply. Owned by the caller; the engine builds one per model. */
typedef struct cm_grammar_vocab {
    int32_t n_vocab;
    const uint32_t *off;
    const char *bytes;
    const bool *eog;
    const bool *never;
} cm_grammar_vocab;
/* Set logits[id] = -inf for every token the grammar does not allow next:
 * a text token whose bytes do not fit, an end-of-reply token unless the
 * text is complete, a never token always. Returns how many remain allowed
 * (0 means the grammar is stuck: the caller ends the reply). */
int cm_grammar_mask(cm_grammar_state *s, const cm_grammar_vocab *v, float *logits);

/* ---- JSON Schema (json_schema.c) ----
 * schema and doc are cJSON trees (void * so this header needs no cJSON);
 * doc is the document "$ref"s resolve in (NULL: schema itself). Returns a
 * rule of g matching one JSON value valid under the schema (NULL schema:
 * any JSON object, for response_format json_object), or a negative code
 * with a message naming the unsupported keyword and its path
 * ("unsupported JSON Schema keyword 'pattern' at /properties/zip"). */
int cm_json_schema_rule(cm_grammar *g, const void *schema, const void *doc, char *err, size_t errlen);
/* Whitespace between JSON tokens: "" | " " | "\n" " "{0,16}. */
int cm_json_ws_rule(cm_grammar *g);
/* A finished grammar for a whole reply: ws value ws. 0 or a code (see above). */
int cm_json_grammar(const void *schema, cm_grammar **out, char *err, size_t errlen);

#endif
