/*
 * synth_vocab.c: a small vocabulary of cumulo's own making, for random-weight
 * models when no tokenizer file is at hand (`cumulo synth --vocab builtin`,
 * the demo without ../shared). A SentencePiece-style ("llama") vocabulary:
 * <unk>, <s>, </s>, single characters, and common words of children's
 * stories with the SentencePiece space mark in front. It has no byte tokens
 * on purpose: a random model samples every token about equally often, and
 * raw bytes (escape sequences, half characters) would garble a terminal;
 * here noise prints as words. Text outside it encodes as characters or
 * <unk>. It is not a real model's vocabulary and must never be used to
 * compare against one.
 */
#include "synth.h"

#include <stdio.h>
#include <string.h>

/* Words, each a token "▁word" (U+2581 then the word). */
static const char *const k_words[] = {
    "the",     "a",       "and",     "to",     "was",     "he",       "she",    "it",      "they",   "of",
    "in",      "on",      "with",    "her",    "his",     "said",     "had",    "that",    "for",    "but",
    "so",      "you",     "is",      "I",      "we",      "not",      "at",     "one",     "day",    "once",
    "upon",    "time",    "there",   "little", "big",     "girl",     "boy",    "dog",     "cat",    "bird",
    "tree",    "park",    "sun",     "ball",   "toy",     "house",    "mom",    "dad",     "friend", "friends",
    "happy",   "sad",     "very",    "saw",    "went",    "played",   "wanted", "loved",   "liked",  "found",
    "looked",  "smiled",  "ran",     "jumped", "named",   "together", "red",    "blue",    "green",  "small",
    "old",     "new",     "good",    "kind",   "fun",     "name",     "Once",   "The",     "One",    "She",
    "He",      "They",    "Lily",    "Ben",    "Tom",     "Sue",      "Max",    "Mia",     "from",   "up",
    "down",    "out",     "into",    "all",    "what",    "when",     "then",   "after",   "every",  "could",
    "would",   "can",     "will",    "do",     "did",     "go",       "see",    "look",    "play",   "help",
    "make",    "made",    "ate",     "cake",   "flower",  "flowers",  "garden", "sky",     "rain",   "water",
    "fish",    "boat",    "car",     "truck",  "book",    "box",      "hat",    "shoe",    "door",   "room",
    "bed",     "night",   "morning", "home",   "school",  "forest",   "river",  "hill",    "rock",   "stick",
    "leaf",    "apple",   "cookie",  "milk",   "bread",   "soup",     "gift",   "bunny",   "bear",   "duck",
    "frog",    "mouse",   "lion",    "owl",    "fox",     "puppy",    "kitten", "baby",    "mommy",  "daddy",
    "grandma", "grandpa", "teacher", "king",   "queen",   "princess", "dragon", "magic",   "star",   "moon",
    "cloud",   "wind",    "snow",    "warm",   "cold",    "soft",     "loud",   "quiet",   "fast",   "slow",
    "bright",  "dark",    "shiny",   "pretty", "funny",   "scared",   "brave",  "proud",   "tired",  "hungry",
    "sorry",   "thank",   "please",  "yes",    "no",      "never",    "always", "again",   "too",    "also",
    "much",    "more",    "some",    "many",   "each",    "other",    "who",    "where",   "why",    "how",
    "because", "while",   "until",   "before", "now",     "here",     "away",   "back",    "around", "over",
    "under",   "near",    "far",     "inside", "outside", "laughed",  "cried",  "shouted", "asked",  "knew",
    "felt",    "thought", "learned", "shared", "gave",    "took",     "came",   "began",   "tried",  "hugged",
    "danced",  "sang",    "climbed", "swam",   "flew",    "hid",      "opened", "closed",  "lived",  "end",
};

/* Single characters (a token each, no space mark): what any text falls back to. */
static const char k_chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()";

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

int cm_synth_builtin_vocab(cm_buf *out, char *err, size_t errlen) {
    enum { N_SPECIAL = 3, N_CHARS = sizeof k_chars - 1, N_WORDS = sizeof k_words / sizeof *k_words };
    enum { N = N_SPECIAL + 1 + N_CHARS + N_WORDS };
    char words[N_WORDS][32];
    cm_gguf_str toks[N];
    float scores[N];
    int32_t types[N];
    char chars[N_CHARS];
    int n = 0;
    const char *special[N_SPECIAL] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < N_SPECIAL; i++) {
        toks[n] = (cm_gguf_str){special[i], strlen(special[i])};
        scores[n] = 0;
        types[n++] = i == 0 ? 2 : 3; /* unknown, control */
    }
    toks[n] = (cm_gguf_str){SPACE_MARK, 3};
    scores[n] = -1;
    types[n++] = 1;
    memcpy(chars, k_chars, N_CHARS);
    for (int i = 0; i < N_CHARS; i++) {
        toks[n] = (cm_gguf_str){&chars[i], 1};
        scores[n] = -2;
        types[n++] = 1;
    }
    /* Words score above characters so that a word that can be formed wins;
     * earlier (more common) words a little above later ones. */
    for (int i = 0; i < N_WORDS; i++) {
        int len = snprintf(words[i], sizeof words[i], SPACE_MARK "%s", k_words[i]);
        toks[n] = (cm_gguf_str){words[i], (uint64_t)len};
        scores[n] = -1.0f - 0.001f * (float)i;
        types[n++] = 1;
    }
    cm_gguf_writer *w = cm_gguf_writer_new(0);
    if (!w) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    cm_gguf_w_str(w, "general.name", "cumulo builtin vocabulary (not a real model's)");
    cm_gguf_w_str(w, "tokenizer.ggml.model", "llama");
    cm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    cm_gguf_w_arr(w, "tokenizer.ggml.scores", CM_GGUF_F32, scores, (uint64_t)n);
    cm_gguf_w_arr(w, "tokenizer.ggml.token_type", CM_GGUF_I32, types, (uint64_t)n);
    cm_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    cm_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    cm_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    cm_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    int rc = cm_gguf_writer_write_buf(w, out, err, errlen);
    cm_gguf_writer_free(w);
    return rc;
}
