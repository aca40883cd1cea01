/*
 * tokenizer: text <-> token ids, exactly as llama.cpp does it for the same
 * GGUF vocabulary. Two models: SPM ("llama": Llama 2 style, ▁ for spaces,
 * bigram merges by score, <0xXX> byte fallback) and byte-level BPE ("gpt2":
 * GPT-2 byte-to-unicode mapping, merges ranked by order, a pre-tokenizer of
 * regexes chosen by tokenizer.ggml.pre and run with PCRE2 in UTF+UCP mode).
 *
 * Everything read from the file is validated when the tokenizer is built
 * (ids in range, array types and lengths, merges split like llama.cpp); a
 * hostile vocabulary is an error code and a message, never a crash. The
 * built tokenizer owns copies of all it needs: the cm_gguf may be closed
 * right after cm_tokenizer_new returns. A built tokenizer is immutable and
 * safe to use from several threads at once (each call keeps its own scratch).
 *
 * Not here: chat templates (chat.h, same folder), WPM/UGM/RWKV vocabularies.
 */
#ifndef CM_TOKENIZER_H
#define CM_TOKENIZER_H

#include "../base/base.h"
#include "../gguf/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int32_t cm_token;
#define CM_TOKEN_NULL (-1)

enum cm_tok_kind { CM_TOK_SPM, CM_TOK_BPE, CM_TOK_KIND_COUNT };

/* Token attributes: the bits llama.cpp derives from tokenizer.ggml.token_type
 * plus its text-based fix-ups (EOG tokens forced to CONTROL, phi-3 RSTRIP...). */
enum cm_tok_attr {
    CM_TOK_ATTR_UNDEFINED = 0,
    CM_TOK_ATTR_UNKNOWN = 1 << 0,
    CM_TOK_ATTR_UNUSED = 1 << 1,
    CM_TOK_ATTR_NORMAL = 1 << 2,
    CM_TOK_ATTR_CONTROL = 1 << 3,
    CM_TOK_ATTR_USER_DEFINED = 1 << 4,
    CM_TOK_ATTR_BYTE = 1 << 5,
    CM_TOK_ATTR_LSTRIP = 1 << 7,
    CM_TOK_ATTR_RSTRIP = 1 << 8,
};

typedef struct cm_tokenizer cm_tokenizer;

/* Build a tokenizer from a parsed GGUF (tokenizer.ggml.* keys). Errors:
 * CM_EUNSUPPORTED for an unknown tokenizer.ggml.model or tokenizer.ggml.pre
 * (the message names it), CM_EFORMAT for malformed vocab data, CM_ENOMEM. */
int cm_tokenizer_new(cm_tokenizer **out, const cm_gguf *g, char *err, size_t errlen);
/* Map a GGUF file, build its tokenizer, unmap. Reads only metadata, so a
 * vocab-only GGUF (no tensors) works. */
int cm_tokenizer_open(cm_tokenizer **out, const char *path, char *err, size_t errlen);
void cm_tokenizer_free(cm_tokenizer *t); /* NULL is a no-op */

/* ---- encoding ---- */
enum cm_tok_encode_flags {
    CM_TOK_ADD_SPECIAL = 1 << 0,   /* add BOS/EOS as the vocabulary asks (add_bos/add_eos) */
    CM_TOK_PARSE_SPECIAL = 1 << 1, /* recognise control tokens ("<|im_end|>") in the text;
                                      without it only user-defined tokens are matched and
                                      control tokens are never produced from plain text */
};
/* Tokenize n bytes of text (any bytes; invalid UTF-8 is handled as llama.cpp
 * does). Writes at most cap ids to out and sets *n_out to the full count; if
 * that exceeds cap the result is CM_ERANGE (call again with a bigger buffer).
 * Allocates per-call scratch (not for the token loop). */
int cm_tokenizer_encode(const cm_tokenizer *t, const char *text, size_t n, unsigned flags, cm_token *out, size_t cap,
                        size_t *n_out, char *err, size_t errlen);
/* Same, into a malloc'd array the caller frees with cm_free. */
int cm_tokenizer_encode_alloc(const cm_tokenizer *t, const char *text, size_t n, unsigned flags, cm_token **out,
                              size_t *n_out, char *err, size_t errlen);

/* ---- decoding ---- */
/* The bytes a token stands for (llama_token_to_piece): SPM ▁ -> space and
 * <0xXX> -> the byte, BPE byte-level decode. Control/unknown tokens give ""
 * unless special. The pointer stays valid for the tokenizer's lifetime; no
 * allocation, so this is what the token loop uses. NULL for an id out of range. */
const char *cm_tokenizer_piece(const cm_tokenizer *t, cm_token id, bool special, size_t *len);

enum cm_tok_decode_flags {
    CM_TOK_REMOVE_SPECIAL = 1 << 0,  /* drop a leading BOS / trailing EOS the vocab adds */
    CM_TOK_UNPARSE_SPECIAL = 1 << 1, /* render control tokens as their text */
};
/* Whole-sequence detokenize, exactly llama_detokenize: for SPM the first
 * piece loses one leading space (the prefix SPM adds) unless a BOS was
 * removed with CM_TOK_REMOVE_SPECIAL; BPE vocabs with clean_spaces get
 * llama.cpp's " ." / " 's" clean-up. Appends to out (which must be
 * initialised). CM_ERANGE on an id out of range. */
int cm_tokenizer_decode(const cm_tokenizer *t, const cm_token *ids, size_t n, unsigned flags, cm_buf *out, char *err,
                        size_t errlen);

/* Streaming detokenizer: feed tokens one at a time, get only complete, valid
 * UTF-8 back. A multi-byte character split across tokens is held until it is
 * complete; bytes that can never become valid are replaced by U+FFFD as soon
 * as that is certain, and an incomplete tail by U+FFFD at cm_detok_flush.
 * Fixed-size state, no allocation. Not thread-safe (one per sequence). */
typedef struct cm_detok {
    const cm_tokenizer *tok;
    bool special;      /* render control tokens as text */
    bool lstrip_first; /* drop one leading space from the first token's piece */
    bool started;
    uint8_t pend[4]; /* bytes of an incomplete UTF-8 sequence */
    int npend;
} cm_detok;
void cm_detok_init(cm_detok *d, const cm_tokenizer *t, bool special, bool lstrip_first);
/* Largest output one cm_detok_push/flush can produce; size out buffers with it. */
size_t cm_detok_max_out(const cm_tokenizer *t);
/* Feed one token; writes the newly complete text into out (no NUL) and
 * returns its length in *n. CM_ERANGE if id is out of range or cap is below
 * cm_detok_max_out (then nothing is consumed). */
int cm_detok_push(cm_detok *d, cm_token id, char *out, size_t cap, size_t *n);
/* End of stream: an incomplete tail becomes U+FFFD. */
int cm_detok_flush(cm_detok *d, char *out, size_t cap, size_t *n);

/* ---- vocabulary facts ---- */
enum cm_tok_kind cm_tokenizer_kind(const cm_tokenizer *t);
const char *cm_tokenizer_pre_name(const cm_tokenizer *t); /* "llama-bpe", "default" (SPM) ... */
int32_t cm_tokenizer_n_vocab(const cm_tokenizer *t);
cm_token cm_tokenizer_bos(const cm_tokenizer *t); /* CM_TOKEN_NULL when absent */
cm_token cm_tokenizer_eos(const cm_tokenizer *t);
cm_token cm_tokenizer_eot(const cm_tokenizer *t);
cm_token cm_tokenizer_eom(const cm_tokenizer *t);
cm_token cm_tokenizer_unk(const cm_tokenizer *t);
cm_token cm_tokenizer_pad(const cm_tokenizer *t);
cm_token cm_tokenizer_nl(const cm_tokenizer *t);
bool cm_tokenizer_add_bos(const cm_tokenizer *t);
bool cm_tokenizer_add_eos(const cm_tokenizer *t);
/* End of generation: EOS, EOT, EOM and the end tokens llama.cpp recognises by text. */
bool cm_tokenizer_is_eog(const cm_tokenizer *t, cm_token id);
bool cm_tokenizer_is_control(const cm_tokenizer *t, cm_token id);
unsigned cm_tokenizer_attr(const cm_tokenizer *t, cm_token id); /* 0 when out of range */
/* The token's text as stored in the vocabulary (not its piece); NULL if out of range. */
const char *cm_tokenizer_text(const cm_tokenizer *t, cm_token id, size_t *len);
float cm_tokenizer_score(const cm_tokenizer *t, cm_token id);
/* Exact lookup of a token by its vocabulary text; CM_TOKEN_NULL if none. */
cm_token cm_tokenizer_find(const cm_tokenizer *t, const char *text, size_t len);
/* The i-th supported tokenizer.ggml.pre value; NULL past the last. */
const char *cm_tokenizer_pre_name_at(size_t i);

#endif
