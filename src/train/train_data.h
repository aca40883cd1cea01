/*
 * train_data: fine-tuning data from JSONL bytes into one token stream with
 * a loss flag per token, and the packing of that stream into windows.
 *
 * Each line is one JSON object (blank lines are skipped):
 *   {"text": "..."}                         loss on every token
 *   {"prompt": "...", "completion": "..."}  loss on the completion only
 *   {"messages": [{"role", "content"}...]}  rendered with the model's chat
 *                                           template; loss on the assistant
 *                                           turns only
 * An example is BOS (when the tokenizer adds one) + its tokens + EOS. A bad
 * line is an error naming the line number and what is wrong; the parser is
 * bounded (each line through cJSON_ParseWithLength, lengths capped) and
 * never crashes on any bytes (fuzz/fuzz_finetune.c).
 */
#ifndef CM_TRAIN_DATA_H
#define CM_TRAIN_DATA_H

#include "../base/base.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"

#include <stdint.h>

typedef struct cm_tdata {
    int32_t *tok;  /* [n_tok] the examples one after another */
    uint8_t *loss; /* [n_tok] 1: predicting this token counts in the loss */
    int64_t n_tok;
    int64_t *ex_off; /* [n_ex + 1] example starts in the stream */
    int n_ex;
} cm_tdata;

/* Parse and tokenize n bytes of JSONL (name: for messages, e.g. the file
 * name). tpl/copts: the chat template for "messages" lines (NULL: such
 * lines are an error saying the model has no chat template). Errors:
 * CM_EFORMAT "'data.jsonl' line 7: ...", CM_ENOMEM. On error *d is empty. */
int cm_tdata_parse(cm_tdata *d, const uint8_t *p, size_t n, const char *name, const cm_tokenizer *tok,
                   const cm_chat_template *tpl, const cm_chat_opts *copts, char *err, size_t errlen);
void cm_tdata_release(cm_tdata *d);

/* A window: stream[off, off + len) where len <= n_ctx + 1 (inputs are the
 * first len - 1 tokens, targets the last len - 1). */
typedef struct cm_twin {
    int64_t off;
    int len;
} cm_twin;

/* Pack the examples ex[0..n) (indices into d) into windows of at most
 * n_ctx + 1 tokens: whole examples greedily, an example longer than that
 * cut into pieces. Windows without any loss token are dropped. *out
 * allocated (cm_free). */
int cm_tdata_pack(const cm_tdata *d, const int *ex, int n, int n_ctx, cm_twin **out, int *n_out, char *err,
                  size_t errlen);

/* Inputs and targets of a window (target -1: no loss); returns the number
 * of inputs (len - 1). */
int cm_twin_fill(const cm_tdata *d, cm_twin w, int32_t *tokens, int32_t *target);

#endif
