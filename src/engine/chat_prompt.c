/*
 * chat_prompt.c: a conversation -> the prompt text of the model's chat
 * template, for the chat API and `cumulo chat`.
 *
 * NEEDSWORK: the tokenizer module's chat.h (every family llama.cpp knows,
 * checked against jinja2 renderings) replaces this once it lands on main;
 * until then two families are rendered here: Llama 3 when the GGUF's
 * tokenizer.chat_template uses <|start_header_id|>, otherwise ChatML, which
 * is also what llama.cpp's server falls back to for a model with no template.
 * Never executes the template text.
 */
#include "engine_impl.h"

#include <string.h>

static bool role_ok(const char *r) {
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant"));
}

int cm_engine_chat_render(const cm_engine *e, const cm_engine_msg *msgs, int n, cm_buf *out, char *err,
                          size_t errlen) {
    for (int i = 0; i < n; i++)
        if (!role_ok(msgs[i].role) || !msgs[i].content)
            return cm_errf(err, errlen, CM_EINVAL, "message %d: role must be system, user or assistant", i);
    char *tmpl = cm_gguf_get_str(&e->g, "tokenizer.chat_template");
    bool llama3 = tmpl && strstr(tmpl, "<|start_header_id|>");
    cm_free(tmpl);
    if (llama3) {
        /* The tokenizer adds <|begin_of_text|> (add_bos). */
        for (int i = 0; i < n; i++)
            cm_buf_printf(out, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", msgs[i].role,
                          msgs[i].content);
        cm_buf_puts(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else {
        for (int i = 0; i < n; i++)
            cm_buf_printf(out, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
        cm_buf_puts(out, "<|im_start|>assistant\n");
    }
    return out->oom ? cm_errf(err, errlen, CM_ENOMEM, "out of memory") : 0;
}
