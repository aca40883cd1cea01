/*
 * chat: turn a conversation into the prompt text a chat model was trained on.
 *
 * cumulo does not run Jinja. It recognises the FAMILY of a GGUF's
 * tokenizer.chat_template from distinctive substrings (as llama.cpp does),
 * or takes a family by name (--chat-template NAME), and renders the
 * conversation with a hand-written renderer per family. Each renderer
 * reproduces what the family's reference template produces under Jinja
 * (Hugging Face's semantics), checked against llama.cpp's test expectations
 * and against jinja2 renderings of the real templates (tests/data/chat/).
 * Where a template cannot take a system message at all (Gemma, the first
 * Mistral-Instruct, Phi-3-mini), the system text is put in front of the first
 * user message followed by "\n", as llama.cpp does.
 *
 * BOS contract: the rendered text never starts with the BOS token when the
 * tokenizer adds BOS itself (opts.tokenizer_adds_bos, GGUF
 * tokenizer.ggml.add_bos_token); when the tokenizer does not add it and the
 * template starts with bos_token, the text starts with opts.bos. BOS/EOS
 * texts inside the history (Llama 2's "<s>[INST]", "</s>" after a reply) are
 * always written, so the prompt must be tokenized with special-token parsing.
 *
 * Unrecognised templates are an error that lists the names usable with
 * --chat-template, never a silent fallback. Not thread-safe per template
 * struct only because nothing here is shared: all functions are reentrant.
 * This header depends on base only; it never looks at token ids.
 */
#ifndef CM_CHAT_H
#define CM_CHAT_H

#include "base/base.h"

#include <stdbool.h>
#include <stddef.h>

enum cm_chat_family {
    CM_CHAT_CHATML,            /* <|im_start|>role\n...<|im_end|>  (Qwen, OpenHermes, Yi) */
    CM_CHAT_LLAMA2,            /* Llama-2-chat: [INST] <<SYS>>...<</SYS>> ... [/INST] */
    CM_CHAT_LLAMA3,            /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CM_CHAT_LLAMA31,           /* Llama 3.1-3.3: llama3 plus the "Cutting Knowledge Date" system block */
    CM_CHAT_MISTRAL,           /* Mistral-7B-Instruct v0.1/v0.2: [INST] ... [/INST]reply</s> */
    CM_CHAT_MISTRAL_V1,        /* " [INST] ... [/INST] reply</s>", system in the first user turn */
    CM_CHAT_MISTRAL_V3,        /* "[INST] ...[/INST] reply</s>", system in the last user turn */
    CM_CHAT_MISTRAL_V3_TEKKEN, /* "[INST]...[/INST]reply</s>" (Mistral-Nemo) */
    CM_CHAT_MISTRAL_V7,        /* [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST] reply</s> */
    CM_CHAT_ZEPHYR,            /* <|role|>\n...</s>\n */
    CM_CHAT_PHI3,              /* <|role|>\n...<|end|>\n */
    CM_CHAT_PHI4,              /* <|im_start|>role<|im_sep|>...<|im_end|> */
    CM_CHAT_GEMMA,             /* <start_of_turn>user|model\n...<end_of_turn>\n */
    CM_CHAT_DEEPSEEK,          /* deepseek-coder: ### Instruction:\n ... ### Response:\n */
    CM_CHAT_DEEPSEEK2,         /* deepseek-llm chat / V2: User: ...\n\nAssistant: ...<eos> */
    CM_CHAT_DEEPSEEK3,         /* R1 / R1-Distill / V3: <｜User｜>...<｜Assistant｜>... */
    CM_CHAT_VICUNA,            /* USER: ...\nASSISTANT: ...</s>\n */
    CM_CHAT_VICUNA_ORCA,       /* vicuna with "SYSTEM: " */
    CM_CHAT_OPENCHAT,          /* GPT4 Correct User: ...<|end_of_turn|> */
    CM_CHAT_COMMAND_R,         /* <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|> */
    CM_CHAT_GPT_OSS,           /* harmony: <|start|>role<|message|>...<|end|> (llama.cpp's built-in rendering) */
    CM_CHAT_FAMILY_COUNT
};

/* What a renderer needs to know; filled by detect or by_name. Plain data:
 * copy it freely. */
typedef struct cm_chat_template {
    enum cm_chat_family family;
    bool lead_bos;            /* the template starts with bos_token */
    bool merge_system;        /* the template has no system role: merge into the first user turn */
    bool think;               /* deepseek3: the generation prompt opens "<think>\n" */
    char default_system[256]; /* used when the conversation has no system message ("" = none) */
} cm_chat_template;

typedef struct cm_chat_msg {
    /* "system", "user" or "assistant" ("developer" too for gpt-oss). Tool
     * turns, as the official templates write them (the caller formats the
     * content, src/http/tools_render.c): "ipython" (llama3 families: a tool
     * result, its own header turn, content trimmed like every turn) and
     * "tool_calls" / "tool_results" (mistral-v3 and -tekken: the content
     * verbatim, no [INST]; tool_calls followed by EOS). */
    const char *role;
    const char *content;
} cm_chat_msg;

typedef struct cm_chat_opts {
    bool add_generation_prompt; /* end with the opening of the assistant's turn */
    bool tokenizer_adds_bos;    /* see the BOS contract above */
    const char *bos;            /* text of the BOS token, e.g. "<s>"; NULL = "" */
    const char *eos;            /* text of the EOS token, e.g. "</s>"; NULL = "" */
    const char *date;           /* llama3.1 "Today Date"; NULL = "26 Jul 2024" (the template's own default) */
} cm_chat_opts;

/* Recognise the family of a chat template text (n bytes, need not be
 * NUL-terminated; untrusted). CM_EUNSUPPORTED with a message listing the
 * usable names when nothing matches. */
int cm_chat_template_detect(cm_chat_template *t, const char *text, size_t n, char *err, size_t errlen);

/* A family by its --chat-template name (see cm_chat_template_names), with
 * that family's usual flags. CM_EINVAL + the list of names when unknown. */
int cm_chat_template_by_name(cm_chat_template *t, const char *name, char *err, size_t errlen);

/* The --chat-template name of a family; never NULL. */
const char *cm_chat_family_name(enum cm_chat_family f);

/* "chatml, llama2, llama3, ..." : every name accepted by by_name. Static. */
const char *cm_chat_template_names(void);

/* Render msgs[0..n) and append the text to out. Roles other than system,
 * user and assistant are CM_EINVAL; an empty conversation is fine. Returns 0,
 * or CM_ENOMEM when out ran out of memory. */
int cm_chat_render(const cm_chat_template *t, const cm_chat_msg *msgs, size_t n, const cm_chat_opts *opts, cm_buf *out,
                   char *err, size_t errlen);

/* gpt-oss (harmony) replies: the model writes channels,
 *   <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...
 * (a reply ends with <|return|> or <|call|>, end-of-generation tokens that
 * never reach the text). A cm_harmony takes the reply's text as it streams,
 * in pieces split anywhere, and appends to out only the final channel's
 * content: what the API returns as the message. A reply that does not open
 * with a channel header (<|channel|>, <|constrain|> or a header longer than
 * the buffer) passes through unchanged. Plain data, no allocation but out's;
 * one per reply. */
typedef struct cm_harmony {
    int state;     /* header, body, pass */
    bool final;    /* the body being read is the final channel's */
    bool first;    /* no header read yet */
    size_t n;      /* bytes held in buf */
    char buf[256]; /* a header being read, or a possible end marker's start */
} cm_harmony;
void cm_harmony_init(cm_harmony *h);
void cm_harmony_feed(cm_harmony *h, const char *s, size_t n, cm_buf *out);
/* The reply ended: release what was held back (a final body's tail). */
void cm_harmony_flush(cm_harmony *h, cm_buf *out);

#endif
