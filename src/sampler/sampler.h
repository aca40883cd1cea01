/*
 * sampler: turns one row of logits into the next token id, and watches the
 * generated text for stop strings.
 *
 * The chain (fixed order, the same as llama.cpp's default chain without DRY,
 * typical-p, XTC and top-n-sigma, which cumulo does not offer):
 *
 *     penalties -> top-k -> top-p -> min-p -> temperature -> dist
 *
 *   penalties   over the last repeat_last_n accepted tokens; for a token seen
 *               c > 0 times there:
 *                   l = l > 0 ? l / repeat_penalty : l * repeat_penalty
 *                   l = l - c * frequency_penalty - presence_penalty
 *               (1.0 / 0 / 0 switch each part off)
 *   top-k       keep the k largest logits (k <= 0 or k >= n_vocab: off)
 *   top-p       softmax over what is left; keep the smallest prefix (by
 *               probability, descending) whose mass reaches top_p (>= 1: off)
 *   min-p       keep tokens with p >= min_p * p_max (<= 0: off); computed on
 *               the logits before temperature, as llama.cpp does
 *   temperature divide the logits by it
 *   dist        softmax and draw with the sampler's own seeded RNG
 *
 * Each filter keeps at least one token. Ties are broken by the lower token
 * id everywhere, so results do not depend on sort stability.
 * Greedy: temperature <= 0 or top_k == 1 picks the argmax of the penalised
 * logits (the lowest id among equal maxima); no random number is drawn.
 * Same seed + same logits + same accepted tokens => the same ids.
 *
 * The random draw is counter-based: sample number k (counting every
 * cm_sampler_sample call since new/reset, greedy or not) draws a number that
 * is a pure function of (seed, k). A sampler made anywhere else with the same
 * parameters, the same accepted history and cm_sampler_set_pos(k) continues
 * exactly where the first one was after k samples: that is how a stream
 * resumed after a node was lost (the last pipeline stage remade) at
 * temperature > 0 gives the text an undisturbed run gives (DESIGN.md,
 * recovery).
 *
 * Memory: cm_sampler_new sizes everything for n_vocab once; sampling and
 * accepting never allocate. A sampler is not thread-safe: one per sequence.
 * This module never looks at model weights, tokens' text or the network.
 */
#ifndef CM_SAMPLER_H
#define CM_SAMPLER_H

#include "base/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Seed value meaning "pick one from the clock"; cm_sampler_seed() tells which. */
#define CM_SAMPLER_SEED_RANDOM UINT64_MAX
/* Most top logprobs one call reports (OpenAI allows 20). */
#define CM_SAMPLER_MAX_PROBS 32
/* Most end-of-generation ids a sampler remembers. */
#define CM_SAMPLER_MAX_EOG 16

typedef struct cm_sampler_params {
    float temperature;       /* default 0.8; <= 0: greedy */
    int32_t top_k;           /* default 40; <= 0: off; 1: greedy */
    float top_p;             /* default 0.95; >= 1: off */
    float min_p;             /* default 0.05; <= 0: off */
    float repeat_penalty;    /* default 1.0 (off) */
    int32_t repeat_last_n;   /* default 64; 0: penalties off; at most 1<<20 (a caller maps
                              * llama.cpp's -1 "whole context" to its context size) */
    float presence_penalty;  /* default 0 */
    float frequency_penalty; /* default 0 */
    uint64_t seed;           /* default CM_SAMPLER_SEED_RANDOM */
    int32_t n_probs;         /* top logprobs wanted per token, 0..CM_SAMPLER_MAX_PROBS; default 0 */
} cm_sampler_params;

/* llama.cpp's defaults (common_params_sampling), listed above. */
void cm_sampler_params_default(cm_sampler_params *p);

/* Check ranges (temperature finite, top_p in [0,1], n_probs in range, ...).
 * Returns 0 or CM_EINVAL with a message naming the field. */
int cm_sampler_params_check(const cm_sampler_params *p, char *err, size_t errlen);

typedef struct cm_sampler cm_sampler;

/* One {id, logprob} pair for the logprobs output. */
typedef struct cm_token_logprob {
    int32_t id;
    float logprob;
} cm_token_logprob;

/* Optional output of cm_sampler_sample. All logprobs are natural logs of the
 * MODEL's distribution: softmax at temperature 1 over the full vocabulary of
 * the raw logits passed in (before penalties and filters), which is what the
 * OpenAI API reports. top[] is filled only when params.n_probs > 0, sorted by
 * logprob descending (lower id first on ties). */
typedef struct cm_sample_info {
    float logprob; /* of the chosen token */
    int32_t n_top;
    cm_token_logprob top[CM_SAMPLER_MAX_PROBS];
} cm_sample_info;

/* Allocate a sampler for a vocabulary of n_vocab ids (>= 1). NULL and a
 * message on bad parameters or out of memory. The caller owns the result. */
cm_sampler *cm_sampler_new(const cm_sampler_params *p, int32_t n_vocab, char *err, size_t errlen);
void cm_sampler_free(cm_sampler *s); /* NULL is a no-op */

/* Pick the next token from logits[n_vocab] (not modified). Fills *info when
 * non-NULL. Does NOT record the token: call cm_sampler_accept for that (the
 * caller may accept prompt tokens, or a token it chose itself). Never
 * allocates. Non-finite logits count as -inf; if every logit is -inf or NaN
 * the lowest id is returned. */
int32_t cm_sampler_sample(cm_sampler *s, const float *logits, cm_sample_info *info);

/* Apply only the penalty stage, in place, to logits[n_vocab] as the next
 * cm_sampler_sample would (for showing adjusted scores, and for tests). */
void cm_sampler_penalize(const cm_sampler *s, float *logits);

/* Record a token in the penalty history. Out-of-range ids are ignored. */
void cm_sampler_accept(cm_sampler *s, int32_t id);

/* Forget the history and go back to draw 0 of the original seed, so the
 * sampler behaves as if new. The end-of-generation set is kept. */
void cm_sampler_reset(cm_sampler *s);

/* Samples taken since new/reset: the index of the next draw. */
uint64_t cm_sampler_pos(const cm_sampler *s);
/* Continue as if pos samples had been taken (the penalty history is the
 * caller's, through cm_sampler_accept). O(1); any value is valid. */
void cm_sampler_set_pos(cm_sampler *s, uint64_t pos);

/* The seed in use (the drawn one when the params asked for a random seed). */
uint64_t cm_sampler_seed(const cm_sampler *s);

/* The parameters the sampler was made with (after defaults were resolved). */
const cm_sampler_params *cm_sampler_get_params(const cm_sampler *s);

/* End of generation: the caller (who knows the vocabulary) tells the sampler
 * which ids end a reply (EOS, EOT, <|im_end|>, <|eot_id|>, ...). Replaces the
 * previous set; ids outside the vocabulary are refused with CM_EINVAL; at most
 * CM_SAMPLER_MAX_EOG ids. */
int cm_sampler_set_eog(cm_sampler *s, const int32_t *ids, int n, char *err, size_t errlen);
bool cm_sampler_is_eog(const cm_sampler *s, int32_t id);

/*
 * Stop strings for streamed text.
 *
 * Feed the text of each generated piece. The matcher hands back what is safe
 * to show now and holds back any tail that could still grow into a stop
 * string (and any incomplete UTF-8 sequence at the end, so what it hands back
 * is always whole characters). When a stop string appears, everything before
 * it is handed back, the stop string and anything after it are not, and the
 * matcher reports the match; further feeds hand back nothing. When two stop
 * strings could match, the one that starts first wins (the longer on a tie).
 *
 * Allocates when made and, rarely, when a fed piece is larger than anything
 * seen so far; never per token otherwise. Not thread-safe.
 */
typedef struct cm_stop cm_stop;

/* Copies the n stop strings (each non-empty, NUL-terminated). n may be 0
 * (then the matcher only does the UTF-8 holding). NULL + message on error. */
cm_stop *cm_stop_new(const char *const *stops, int n, char *err, size_t errlen);
void cm_stop_free(cm_stop *m); /* NULL is a no-op */

/* Feed n bytes. On return *emit and *emit_len is the text to show now (valid
 * until the next call on m). Returns the index (>= 0) of the stop string that
 * matched during this call, -1 if none has, or CM_ENOMEM; once a match was
 * reported, later calls return CM_ESTATE and emit nothing. */
int cm_stop_feed(cm_stop *m, const char *piece, size_t n, const char **emit, size_t *emit_len);

/* End of generation without a stop: hand back whatever is held (even an
 * incomplete UTF-8 tail). Emits nothing after a match. */
void cm_stop_flush(cm_stop *m, const char **emit, size_t *emit_len);

/* Back to the state of a new matcher (same stop strings). */
void cm_stop_reset(cm_stop *m);

#endif
