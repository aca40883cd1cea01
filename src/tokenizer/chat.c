/*
 * chat.c: chat-template families: recognition from the template text, and
 * one renderer per family (contract and BOS rule in chat.h).
 *
 * Each renderer follows its family's reference Jinja template step by step;
 * the comment above each one names the models whose template it stands for.
 * Detection reads untrusted bytes (GGUF metadata): it only searches them for
 * fixed substrings and copies at most sizeof(default_system) - 1 bytes.
 * Nothing here evaluates template code.
 */
#include "tokenizer/chat.h"

#include <string.h>

static const char *const family_names[CM_CHAT_FAMILY_COUNT] = {
    [CM_CHAT_CHATML] = "chatml",
    [CM_CHAT_LLAMA2] = "llama2",
    [CM_CHAT_LLAMA3] = "llama3",
    [CM_CHAT_LLAMA31] = "llama3.1",
    [CM_CHAT_MISTRAL] = "mistral",
    [CM_CHAT_MISTRAL_V1] = "mistral-v1",
    [CM_CHAT_MISTRAL_V3] = "mistral-v3",
    [CM_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CM_CHAT_MISTRAL_V7] = "mistral-v7",
    [CM_CHAT_ZEPHYR] = "zephyr",
    [CM_CHAT_PHI3] = "phi3",
    [CM_CHAT_PHI4] = "phi4",
    [CM_CHAT_GEMMA] = "gemma",
    [CM_CHAT_DEEPSEEK] = "deepseek",
    [CM_CHAT_DEEPSEEK2] = "deepseek2",
    [CM_CHAT_DEEPSEEK3] = "deepseek3",
    [CM_CHAT_VICUNA] = "vicuna",
    [CM_CHAT_VICUNA_ORCA] = "vicuna-orca",
    [CM_CHAT_OPENCHAT] = "openchat",
    [CM_CHAT_COMMAND_R] = "command-r",
    [CM_CHAT_GPT_OSS] = "gpt-oss",
};

#define NAMES_LIST                                                                                 \
    "chatml, llama2, llama3, llama3.1, mistral, mistral-v1, mistral-v3, mistral-v3-tekken, "       \
    "mistral-v7, zephyr, phi3, phi4, gemma, deepseek, deepseek2, deepseek3, vicuna, vicuna-orca, " \
    "openchat, command-r, gpt-oss"

const char *cm_chat_template_names(void) { return NAMES_LIST; }

const char *cm_chat_family_name(enum cm_chat_family f) {
    return (unsigned)f < CM_CHAT_FAMILY_COUNT ? family_names[f] : "unknown";
}

/* The deepseek-coder template's own system text, used when none is given. */
static const char deepseek_coder_system[] =
    "You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek "
    "Company, and you only answer questions related to computer science. For politically sensitive "
    "questions, security and privacy issues, and other non-computer science questions, you will "
    "refuse to answer\n";

static void family_defaults(cm_chat_template *t, enum cm_chat_family f) {
    memset(t, 0, sizeof *t);
    t->family = f;
    switch (f) {
    case CM_CHAT_LLAMA2:
    case CM_CHAT_LLAMA3:
    case CM_CHAT_LLAMA31:
    case CM_CHAT_MISTRAL:
    case CM_CHAT_MISTRAL_V1:
    case CM_CHAT_MISTRAL_V3:
    case CM_CHAT_MISTRAL_V3_TEKKEN:
    case CM_CHAT_MISTRAL_V7:
    case CM_CHAT_GEMMA:
    case CM_CHAT_DEEPSEEK:
    case CM_CHAT_DEEPSEEK2:
    case CM_CHAT_DEEPSEEK3:
    case CM_CHAT_OPENCHAT:
    case CM_CHAT_COMMAND_R: t->lead_bos = true; break;
    default: break;
    }
    t->merge_system = f == CM_CHAT_GEMMA || f == CM_CHAT_MISTRAL;
    t->think = f == CM_CHAT_DEEPSEEK3;
}

int cm_chat_template_by_name(cm_chat_template *t, const char *name, char *err, size_t errlen) {
    for (int f = 0; f < CM_CHAT_FAMILY_COUNT; f++)
        if (!strcmp(name, family_names[f])) {
            family_defaults(t, (enum cm_chat_family)f);
            return 0;
        }
    if (!strcmp(name, "qwen") || !strcmp(name, "qwen2")) { /* common aliases */
        family_defaults(t, CM_CHAT_CHATML);
        return 0;
    }
    if (!strcmp(name, "llama2-sys")) {
        family_defaults(t, CM_CHAT_LLAMA2);
        return 0;
    }
    return cm_errf(err, errlen, CM_EINVAL, "unknown chat template '%s'; --chat-template takes one of: %s", name,
                   NAMES_LIST);
}

/* Bounded substring search over untrusted bytes. */
static const char *find(const char *h, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0 || m > n) return NULL;
    for (size_t i = 0; i + m <= n; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, m)) return h + i;
    return NULL;
}

/* A ChatML template may carry a default system prompt as a string literal
 * ('<|im_start|>system\nYou are Qwen, ...<|im_end|>'): copy its text when the
 * part between the markers is plain text (not an expression). The "\n" may be
 * a real newline or the two characters \ n of a Jinja string literal. */
static void chatml_default_system(cm_chat_template *t, const char *s, size_t n) {
    static const char head[] = "<|im_start|>system";
    size_t hl = sizeof head - 1;
    const char *p = s, *end = s + n;
    while ((p = find(p, (size_t)(end - p), head)) != NULL) {
        const char *q = p + hl;
        p = q;
        if (end - q >= 2 && q[0] == '\\' && q[1] == 'n') q += 2;
        else if (end - q >= 1 && q[0] == '\n') q += 1;
        else continue;
        const char *stop = find(q, (size_t)(end - q), "<|im_end|>");
        if (!stop) return;
        size_t len = (size_t)(stop - q);
        if (len == 0 || len >= sizeof t->default_system) continue;
        bool plain = true;
        for (const char *c = q; c < stop; c++)
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}' || *c == '+' || *c == '\\' || *c == '\n') {
                plain = false;
                break;
            }
        if (!plain) continue;
        memcpy(t->default_system, q, len);
        t->default_system[len] = 0;
        return;
    }
}

int cm_chat_template_detect(cm_chat_template *t, const char *s, size_t n, char *err, size_t errlen) {
#define HAS(x) (find(s, n, (x)) != NULL)
    enum cm_chat_family f = CM_CHAT_FAMILY_COUNT;
    if (!s || n == 0) {
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "the model has no chat template; choose one with --chat-template NAME (%s)", NAMES_LIST);
    }
    if (HAS("[gMASK]")) {
        f = CM_CHAT_FAMILY_COUNT; /* ChatGLM shares <|user|> with zephyr/phi3 but is neither */
    } else if (HAS("<|start|>") && HAS("<|channel|>")) {
        f = CM_CHAT_GPT_OSS; /* before phi3: harmony has <|end|> too */
    } else if (HAS("<|im_start|>") && HAS("<|im_sep|>")) {
        f = CM_CHAT_PHI4;
    } else if (HAS("<|im_start|>")) {
        f = CM_CHAT_CHATML;
    } else if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) {
        f = HAS("Cutting Knowledge Date") ? CM_CHAT_LLAMA31 : CM_CHAT_LLAMA3;
    } else if (HAS("<\xEF\xBD\x9C"
                   "User\xEF\xBD\x9C>") &&
               HAS("<\xEF\xBD\x9C"
                   "Assistant\xEF\xBD\x9C>")) {
        f = CM_CHAT_DEEPSEEK3; /* <｜User｜> with FULLWIDTH VERTICAL LINE */
    } else if (HAS("[SYSTEM_PROMPT]")) {
        f = CM_CHAT_MISTRAL_V7;
    } else if (HAS("[INST]")) {
        if (HAS("<<SYS>>")) f = CM_CHAT_LLAMA2;
        else if (HAS("' [INST] '")) f = CM_CHAT_MISTRAL_V1;
        else if (HAS("[AVAILABLE_TOOLS]") || HAS("[TOOL_CALLS]"))
            f = HAS("\"[INST]\" +") || HAS("'[INST]' +") ? CM_CHAT_MISTRAL_V3_TEKKEN : CM_CHAT_MISTRAL_V3;
        else f = CM_CHAT_MISTRAL;
    } else if (HAS("<start_of_turn>")) {
        f = CM_CHAT_GEMMA;
    } else if (HAS("<|assistant|>") && HAS("<|end|>")) {
        f = CM_CHAT_PHI3;
    } else if (HAS("<|user|>") && HAS("<|assistant|>")) {
        f = CM_CHAT_ZEPHYR;
    } else if (HAS("<|START_OF_TURN_TOKEN|>") && HAS("<|USER_TOKEN|>")) {
        f = CM_CHAT_COMMAND_R;
    } else if (HAS("GPT4 Correct ")) {
        f = CM_CHAT_OPENCHAT;
    } else if (HAS("### Instruction:") && HAS("<|EOT|>")) {
        f = CM_CHAT_DEEPSEEK;
    } else if (HAS("'User: '") && HAS("'Assistant: '")) {
        f = CM_CHAT_DEEPSEEK2;
    } else if (HAS("USER: ") && HAS("ASSISTANT: ")) {
        f = HAS("SYSTEM: ") ? CM_CHAT_VICUNA_ORCA : CM_CHAT_VICUNA;
    }
    if (f == CM_CHAT_FAMILY_COUNT)
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "unrecognised chat template; choose one with --chat-template NAME (%s)", NAMES_LIST);
    family_defaults(t, f);
    /* Where a family's templates differ in these details, the text decides. */
    t->lead_bos = HAS("bos_token");
    switch (f) {
    case CM_CHAT_CHATML: chatml_default_system(t, s, n); break;
    case CM_CHAT_PHI3:
        /* Phi-3-mini/medium pick out 'user' and 'assistant' and drop any
         * other role; Phi-3-small/vision write every role generically. */
        t->merge_system = !HAS("'system'") && !HAS("\"system\"") && (HAS("'user'") || HAS("\"user\""));
        break;
    case CM_CHAT_DEEPSEEK3: t->think = HAS("<think>"); break;
    case CM_CHAT_GPT_OSS:
        t->lead_bos = false; /* llama.cpp's rendering writes no BOS text */
        break;
    default: break;
    }
    return 0;
#undef HAS
}

/* ---- rendering ---- */

typedef struct rctx {
    cm_buf *out;
    size_t start; /* out->len when rendering began */
    const cm_chat_opts *o;
    const char *bos, *eos;
} rctx;

static void put(rctx *c, const char *s) { cm_buf_puts(c->out, s); }
static void putn(rctx *c, const char *s, size_t n) { cm_buf_append(c->out, s, n); }

/* BOS as the template writes it; dropped when it would be the first thing in
 * the text and the tokenizer adds one itself (the contract in chat.h). */
static void put_bos(rctx *c) {
    if (c->out->len == c->start && c->o->tokenizer_adds_bos) return;
    put(c, c->bos);
}

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Python's str.strip() / Jinja's |trim, for ASCII whitespace.
 * NEEDSWORK: Python also strips Unicode spaces (U+00A0, U+3000, ...). */
static void put_trim(rctx *c, const char *s) {
    size_t n = strlen(s), a = 0;
    while (a < n && is_space(s[a])) a++;
    while (n > a && is_space(s[n - 1])) n--;
    putn(c, s + a, n - a);
}

/* Text of the first user turn when the system message has to be merged in. */
static void put_merged(rctx *c, const char *sys, const char *content, bool trim) {
    if (!sys) {
        if (trim) put_trim(c, content);
        else put(c, content);
        return;
    }
    if (!trim) {
        put(c, sys);
        put(c, "\n");
        put(c, content);
        return;
    }
    /* trim applies to the joined text: leading space of sys, trailing of content */
    size_t mark = c->out->len;
    put(c, sys);
    put(c, "\n");
    put(c, content);
    if (c->out->oom) return;
    char *b = c->out->data + mark;
    size_t n = c->out->len - mark, a = 0;
    while (a < n && is_space(b[a])) a++;
    while (n > a && is_space(b[n - 1])) n--;
    memmove(b, b + a, n - a);
    c->out->len = mark + (n - a);
    c->out->data[c->out->len] = 0;
}

enum role { R_SYSTEM, R_USER, R_ASSISTANT, R_DEVELOPER, R_IPYTHON, R_TOOL_CALLS, R_TOOL_RESULTS };

static int role_of(const char *r) {
    if (!r) return -1;
    if (!strcmp(r, "developer")) return R_DEVELOPER; /* gpt-oss only (cm_chat_render checks) */
    if (!strcmp(r, "system")) return R_SYSTEM;
    if (!strcmp(r, "user")) return R_USER;
    if (!strcmp(r, "assistant")) return R_ASSISTANT;
    if (!strcmp(r, "ipython")) return R_IPYTHON;           /* llama3 families only */
    if (!strcmp(r, "tool_calls")) return R_TOOL_CALLS;     /* mistral v3 families only */
    if (!strcmp(r, "tool_results")) return R_TOOL_RESULTS; /* mistral v3 families only */
    return -1;
}

/* "<|" role "|>\n" content end: the zephyr and phi3 shape. */
static void put_tagged(rctx *c, const char *role, const char *content, const char *end) {
    put(c, "<|");
    put(c, role);
    put(c, "|>\n");
    put(c, content);
    put(c, end);
}

int cm_chat_render(const cm_chat_template *t, const cm_chat_msg *msgs, size_t n, const cm_chat_opts *opts, cm_buf *out,
                   char *err, size_t errlen) {
    rctx C = {out, out->len, opts, opts->bos ? opts->bos : "", opts->eos ? opts->eos : ""};
    rctx *c = &C;
    const char *name = cm_chat_family_name(t->family);
    for (size_t i = 0; i < n; i++) {
        int r = role_of(msgs[i].role);
        if (r == R_DEVELOPER && t->family != CM_CHAT_GPT_OSS) r = -1;
        /* the tool turns of the official templates (see chat.h) */
        if (r == R_IPYTHON && t->family != CM_CHAT_LLAMA3 && t->family != CM_CHAT_LLAMA31) r = -1;
        if ((r == R_TOOL_CALLS || r == R_TOOL_RESULTS) && t->family != CM_CHAT_MISTRAL_V3 &&
            t->family != CM_CHAT_MISTRAL_V3_TEKKEN)
            r = -1;
        if (r < 0 || !msgs[i].content)
            return cm_errf(err, errlen, CM_EINVAL, "message %zu: role '%s' is not system, user or assistant", i,
                           msgs[i].role ? msgs[i].role : "(null)");
    }
    /* Families whose templates take the system message out of the loop. */
    bool sys_first_only = t->merge_system;
    switch (t->family) {
    case CM_CHAT_LLAMA2:
    case CM_CHAT_LLAMA31:
    case CM_CHAT_MISTRAL_V1:
    case CM_CHAT_MISTRAL_V3:
    case CM_CHAT_MISTRAL_V3_TEKKEN:
    case CM_CHAT_COMMAND_R: sys_first_only = true; break;
    default: break;
    }
    const char *sys = NULL;
    size_t first = 0; /* first message of the loop */
    if (sys_first_only) {
        if (n > 0 && role_of(msgs[0].role) == R_SYSTEM) {
            sys = msgs[0].content;
            first = 1;
        }
        for (size_t i = first; i < n; i++)
            if (role_of(msgs[i].role) == R_SYSTEM)
                return cm_errf(err, errlen, CM_EINVAL,
                               "message %zu: the %s chat template takes a system message only first", i, name);
    }
    bool gen = opts->add_generation_prompt;
    if (t->lead_bos && t->family != CM_CHAT_LLAMA2) put_bos(c);

    switch (t->family) {
    /* Qwen2/2.5/3, OpenHermes, Yi. Qwen's templates insert their own system
     * prompt when the conversation has none (default_system). */
    case CM_CHAT_CHATML:
        if (t->default_system[0] && !(n > 0 && role_of(msgs[0].role) == R_SYSTEM)) {
            put(c, "<|im_start|>system\n");
            put(c, t->default_system);
            put(c, "<|im_end|>\n");
        }
        for (size_t i = 0; i < n; i++) {
            put(c, "<|im_start|>");
            put(c, msgs[i].role);
            put(c, "\n");
            put(c, msgs[i].content);
            put(c, "<|im_end|>\n");
        }
        if (gen) put(c, "<|im_start|>assistant\n");
        break;

    /* meta-llama/Llama-2-*-chat: BOS before every user turn, replies between
     * spaces and followed by EOS, text stripped, no generation prompt. */
    case CM_CHAT_LLAMA2:
        for (size_t i = first; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_USER) {
                put_bos(c);
                put(c, "[INST] ");
                if (i == first && sys) {
                    /* '<<SYS>>\n' + sys + '\n<</SYS>>\n\n' + content, then strip() */
                    size_t mark = c->out->len;
                    put(c, "<<SYS>>\n");
                    put(c, sys);
                    put(c, "\n<</SYS>>\n\n");
                    put(c, msgs[i].content);
                    if (c->out->oom) break;
                    while (c->out->len > mark && is_space(c->out->data[c->out->len - 1])) c->out->len--;
                    c->out->data[c->out->len] = 0;
                } else {
                    put_trim(c, msgs[i].content);
                }
                put(c, " [/INST]");
            } else {
                put(c, " ");
                put_trim(c, msgs[i].content);
                put(c, " ");
                put(c, c->eos);
            }
        }
        break;

    /* Meta-Llama-3-*-Instruct; 3.1-3.3 add a dated system block always. */
    case CM_CHAT_LLAMA31:
        put(c, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ");
        put(c, opts->date ? opts->date : "26 Jul 2024");
        put(c, "\n\n");
        if (sys) put_trim(c, sys);
        put(c, "<|eot_id|>");
        /* fall through */
    case CM_CHAT_LLAMA3:
        for (size_t i = first; i < n; i++) {
            put(c, "<|start_header_id|>");
            put(c, msgs[i].role);
            put(c, "<|end_header_id|>\n\n");
            put_trim(c, msgs[i].content);
            put(c, "<|eot_id|>");
        }
        if (gen) put(c, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;

    /* Mistral-7B-Instruct v0.1/v0.2 (no system role: merged). */
    case CM_CHAT_MISTRAL:
        for (size_t i = first; i < n; i++) {
            if (role_of(msgs[i].role) == R_USER) {
                put(c, "[INST] ");
                put_merged(c, i == first ? sys : NULL, msgs[i].content, false);
                put(c, " [/INST]");
            } else {
                put(c, msgs[i].content);
                put(c, c->eos);
            }
        }
        break;

    /* mistralai "v1" (system prompt in the first user turn), "v3" (Mistral
     * v0.3, Large-2407: in the last user turn) and "v3-tekken" (Nemo). */
    case CM_CHAT_MISTRAL_V1:
    case CM_CHAT_MISTRAL_V3:
    case CM_CHAT_MISTRAL_V3_TEKKEN: {
        bool v1 = t->family == CM_CHAT_MISTRAL_V1, tekken = t->family == CM_CHAT_MISTRAL_V3_TEKKEN;
        for (size_t i = first; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_TOOL_CALLS || r == R_TOOL_RESULTS) { /* written by the caller as the template does */
                put(c, msgs[i].content);
                if (r == R_TOOL_CALLS) put(c, c->eos);
                continue;
            }
            if (r == R_USER) {
                put(c, v1 ? " [INST] " : tekken ? "[INST]" : "[INST] ");
                bool with_sys = sys && (v1 ? i == first : i == n - 1);
                if (with_sys) {
                    put(c, sys);
                    put(c, "\n\n");
                }
                put(c, msgs[i].content);
                put(c, v1 ? " [/INST]" : "[/INST]");
            } else {
                if (!tekken) put(c, " ");
                if (t->family == CM_CHAT_MISTRAL_V3) put_trim(c, msgs[i].content);
                else put(c, msgs[i].content);
                put(c, c->eos);
            }
        }
        break;
    }

    /* Mistral-Large-2411 and later ("v7"): the system prompt has its own tags. */
    case CM_CHAT_MISTRAL_V7:
        for (size_t i = 0; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_SYSTEM) {
                put(c, "[SYSTEM_PROMPT] ");
                put(c, msgs[i].content);
                put(c, "[/SYSTEM_PROMPT]");
            } else if (r == R_USER) {
                put(c, "[INST] ");
                put(c, msgs[i].content);
                put(c, "[/INST]");
            } else {
                put(c, " ");
                put(c, msgs[i].content);
                put(c, c->eos);
            }
        }
        break;

    /* HuggingFaceH4/zephyr-7b-*: every turn ends with EOS and a newline; the
     * template writes the generation prompt inside its loop, so only after at
     * least one message. */
    case CM_CHAT_ZEPHYR:
        for (size_t i = 0; i < n; i++) {
            put_tagged(c, msgs[i].role, msgs[i].content, c->eos);
            put(c, "\n");
        }
        if (gen && n > 0) put(c, "<|assistant|>\n");
        break;

    /* microsoft/Phi-3*, Phi-3.5: <|end|> closes a turn. Phi-3-mini/medium have
     * no system role (merged). */
    case CM_CHAT_PHI3:
        for (size_t i = first; i < n; i++) {
            if (t->merge_system && i == first && role_of(msgs[i].role) == R_USER) {
                put(c, "<|user|>\n");
                put_merged(c, sys, msgs[i].content, false);
                put(c, "<|end|>\n");
            } else {
                put_tagged(c, msgs[i].role, msgs[i].content, "<|end|>\n");
            }
        }
        if (gen) put(c, "<|assistant|>\n");
        break;

    /* microsoft/phi-4 */
    case CM_CHAT_PHI4:
        for (size_t i = 0; i < n; i++) {
            put(c, "<|im_start|>");
            put(c, msgs[i].role);
            put(c, "<|im_sep|>");
            put(c, msgs[i].content);
            put(c, "<|im_end|>");
        }
        if (gen) put(c, "<|im_start|>assistant<|im_sep|>");
        break;

    /* google/gemma-*-it: "model" for the assistant, text trimmed, no system
     * role (merged). */
    case CM_CHAT_GEMMA:
        for (size_t i = first; i < n; i++) {
            bool user = role_of(msgs[i].role) == R_USER;
            put(c, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            put_merged(c, user && i == first ? sys : NULL, msgs[i].content, true);
            put(c, "<end_of_turn>\n");
        }
        if (gen) put(c, "<start_of_turn>model\n");
        break;

    /* deepseek-ai/deepseek-coder-*-instruct */
    case CM_CHAT_DEEPSEEK: {
        bool has_sys = false;
        for (size_t i = 0; i < n; i++) has_sys |= role_of(msgs[i].role) == R_SYSTEM;
        if (!has_sys) put(c, deepseek_coder_system);
        for (size_t i = 0; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_SYSTEM) {
                put(c, msgs[i].content);
            } else if (r == R_USER) {
                put(c, "### Instruction:\n");
                put(c, msgs[i].content);
                put(c, "\n");
            } else {
                put(c, "### Response:\n");
                put(c, msgs[i].content);
                put(c, "\n<|EOT|>\n");
            }
        }
        if (gen) put(c, "### Response:\n");
        break;
    }

    /* deepseek-llm-*-chat, DeepSeek-V2 */
    case CM_CHAT_DEEPSEEK2:
        for (size_t i = 0; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_USER) put(c, "User: ");
            else if (r == R_ASSISTANT) put(c, "Assistant: ");
            put(c, msgs[i].content);
            put(c, r == R_ASSISTANT ? c->eos : "\n\n");
        }
        if (gen) put(c, "Assistant:");
        break;

    /* DeepSeek-R1, R1-Distill-Qwen/Llama, V3: the (last) system prompt goes
     * bare right after BOS; earlier replies lose their <think> part. */
    case CM_CHAT_DEEPSEEK3: {
        const char *sp = NULL;
        for (size_t i = 0; i < n; i++)
            if (role_of(msgs[i].role) == R_SYSTEM) sp = msgs[i].content;
        if (sp) put(c, sp);
        for (size_t i = 0; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_USER) {
                put(c, "<\xEF\xBD\x9CUser\xEF\xBD\x9C>");
                put(c, msgs[i].content);
            } else if (r == R_ASSISTANT) {
                const char *content = msgs[i].content, *p = content, *q;
                while ((q = strstr(p, "</think>")) != NULL) p = q + 8;
                put(c, "<\xEF\xBD\x9C"
                       "Assistant\xEF\xBD\x9C>");
                put(c, p);
                put(c, "<\xEF\xBD\x9C"
                       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
            }
        }
        if (gen) {
            put(c, "<\xEF\xBD\x9C"
                   "Assistant\xEF\xBD\x9C>");
            if (t->think) put(c, "<think>\n");
        }
        break;
    }

    /* Vicuna v1.1 and Orca-Vicuna (no templates of their own in their repos;
     * these are the ones llama.cpp recognises). */
    case CM_CHAT_VICUNA:
    case CM_CHAT_VICUNA_ORCA:
        for (size_t i = 0; i < n; i++) {
            int r = role_of(msgs[i].role);
            if (r == R_SYSTEM) {
                if (t->family == CM_CHAT_VICUNA_ORCA) put(c, "SYSTEM: ");
                put(c, msgs[i].content);
                put(c, t->family == CM_CHAT_VICUNA_ORCA ? "\n" : "\n\n");
            } else if (r == R_USER) {
                put(c, "USER: ");
                put(c, msgs[i].content);
                put(c, "\n");
            } else {
                put(c, "ASSISTANT: ");
                put(c, msgs[i].content);
                put(c, "</s>\n");
            }
        }
        if (gen) put(c, "ASSISTANT:");
        break;

    /* openchat/openchat-3.5: "GPT4 Correct " + role.title() + ": " */
    case CM_CHAT_OPENCHAT:
        for (size_t i = 0; i < n; i++) {
            const char *role = msgs[i].role;
            char first_ch = role[0] >= 'a' && role[0] <= 'z' ? (char)(role[0] - 'a' + 'A') : role[0];
            put(c, "GPT4 Correct ");
            putn(c, &first_ch, 1);
            put(c, role + 1);
            put(c, ": ");
            put(c, msgs[i].content);
            put(c, "<|end_of_turn|>");
        }
        if (gen) put(c, "GPT4 Correct Assistant:");
        break;

    /* CohereForAI/c4ai-command-r-* */
    case CM_CHAT_COMMAND_R:
        if (sys) {
            put(c, "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>");
            put(c, sys);
            put(c, "<|END_OF_TURN_TOKEN|>");
        }
        for (size_t i = first; i < n; i++) {
            bool user = role_of(msgs[i].role) == R_USER;
            put(c, user ? "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>" : "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
            put_trim(c, msgs[i].content);
            put(c, "<|END_OF_TURN_TOKEN|>");
        }
        if (gen) put(c, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        break;

    case CM_CHAT_GPT_OSS:
        /* gpt-oss (harmony), as llama.cpp's llm_chat_apply_template writes
         * it: every role verbatim, a past assistant turn ends <|return|>,
         * the generation prompt is "<|start|>assistant" (the model then
         * writes its channel: analysis, then final) */
        for (size_t i = first; i < n; i++) {
            put(c, "<|start|>");
            put(c, msgs[i].role);
            put(c, "<|message|>");
            put(c, msgs[i].content);
            put(c, role_of(msgs[i].role) == R_ASSISTANT ? "<|return|>" : "<|end|>");
        }
        if (gen) put(c, "<|start|>assistant");
        break;

    case CM_CHAT_FAMILY_COUNT:
    default: return cm_errf(err, errlen, CM_EINVAL, "bad chat template family %d", (int)t->family);
    }
    if (out->oom) return cm_errf(err, errlen, CM_ENOMEM, "out of memory rendering the chat");
    return 0;
}
