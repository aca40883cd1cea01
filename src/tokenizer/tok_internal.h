/*
 * tok_internal.h: the private shape of cm_tokenizer, shared by the files of
 * the tokenizer module (tok_load.c, tok_pretok.c, tok_encode.c, tok_decode.c).
 * Nothing outside src/tokenizer/ may include it.
 */
#ifndef CM_TOK_INTERNAL_H
#define CM_TOK_INTERNAL_H

#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define CM_TOK_MAX_REGEX 8

/* Private attribute bit: end of generation. */
#define CM_TOK_ATTR_EOG_ (1u << 20)

/* Open-addressing hash set of strings stored in a blob; slots hold index+1. */
typedef struct cm_tok_strtab {
    uint32_t *slots;
    uint64_t mask; /* capacity - 1 (capacity a power of two) */
} cm_tok_strtab;

typedef struct cm_tok_merge {
    uint64_t off;       /* into merge_blob: "first second" */
    uint32_t len;       /* whole string */
    uint32_t first_len; /* bytes before the separating space */
} cm_tok_merge;

/* Pre-tokenizer: which regexes, and the llama.cpp flags tied to the name. */
typedef struct cm_tok_pre {
    const char *name;
    int n_re;
    const char *re[CM_TOK_MAX_REGEX];
    bool ignore_merges, add_bos, clean_spaces, no_bos;
} cm_tok_pre;

struct cm_tokenizer {
    enum cm_tok_kind kind;
    char pre_name[64];
    const cm_tok_pre *pre; /* BPE only */
    int32_t n_vocab;

    char *text_blob; /* token texts, back to back */
    uint64_t *text_off;
    uint32_t *text_len;
    float *score;
    uint32_t *attr;
    cm_tok_strtab tok_ht;

    char *piece_blob; /* token_to_piece(special=true), back to back */
    uint64_t *piece_off;
    uint32_t *piece_len;
    size_t max_piece_len, max_token_len;

    char *merge_blob;
    cm_tok_merge *merges; /* index = rank */
    uint32_t n_merges;
    cm_tok_strtab merge_ht;

    cm_token *special; /* CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    size_t n_special;

    cm_token bos, eos, eot, eom, unk, sep, pad, nl;
    bool add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;

    pcre2_code *re[CM_TOK_MAX_REGEX];
    int n_re;
};

/* FNV-1a, streamed so a merge key "a b" can be hashed without building it. */
static inline uint64_t cm_tok_hash(uint64_t h, const void *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
#define CM_TOK_HASH_SEED 0xcbf29ce484222325ull
/* FNV's low bits mix poorly; slots come from a finalised hash. */
static inline uint64_t cm_tok_hash_fin(uint64_t h) {
    h ^= h >> 32;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

/* Lookups (tok_load.c). */
cm_token cm_tok_lookup(const cm_tokenizer *t, const char *s, size_t n);
int32_t cm_tok_merge_rank(const cm_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn);

/* Pre-tokenizer (tok_pretok.c). */
const cm_tok_pre *cm_tok_pre_find(const char *name);
int cm_tok_pre_compile(cm_tokenizer *t, char *err, size_t errlen);
void cm_tok_pre_release(cm_tokenizer *t);

/* Growable arrays used by encode (tok_encode.c / tok_pretok.c). */
typedef struct cm_tok_span {
    size_t off, len;
} cm_tok_span;
typedef struct cm_tok_spans {
    cm_tok_span *v;
    size_t n, cap;
} cm_tok_spans;
bool cm_tok_spans_push(cm_tok_spans *s, size_t off, size_t len);
/* Split subject (valid UTF-8) into words with the tokenizer's regexes, as
 * llama.cpp's unicode_regex_split does: each regex splits every piece the
 * previous one left, matches and the gaps between them both become pieces. */
int cm_tok_pre_split(const cm_tokenizer *t, const char *subject, size_t n, cm_tok_spans *out, cm_tok_spans *tmp,
                     char *err, size_t errlen);

/* Lax UTF-8 decoding exactly like llama.cpp's unicode_cpt_from_utf8: returns
 * the code point and advances *i, or returns UINT32_MAX (invalid, advance 1). */
uint32_t cm_tok_utf8_lax(const uint8_t *p, size_t n, size_t *i);
/* Encode cp as UTF-8 into out (4 bytes room); returns length. */
size_t cm_tok_utf8_put(uint32_t cp, char *out);
/* unicode_len_utf8: sequence length from the lead byte's high nibble. */
static inline size_t cm_tok_utf8_len(uint8_t c) {
    static const uint8_t k[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return k[c >> 4];
}

/* GPT-2 byte <-> unicode mapping (tok_decode.c). */
size_t cm_tok_byte_to_utf8(uint8_t b, char out[2]); /* 1 or 2 bytes */
int cm_tok_utf8_to_byte(uint32_t cp);               /* -1 if cp is not in the mapping */

int cm_tok_build_pieces(cm_tokenizer *t, char *err, size_t errlen);

#endif
