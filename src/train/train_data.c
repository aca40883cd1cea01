/*
 * train_data.c: JSONL fine-tuning data to a token stream with loss flags,
 * and packing into windows (train_data.h). Input bytes are untrusted: every
 * line is bounded, parsed by cJSON with its length, checked field by field;
 * an error names the line. Never aborts on input.
 */
#include "train_data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

enum { MAX_LINE = 64 << 20, MAX_MSGS = 4096 };

typedef struct sink {
    cm_tdata *d;
    int64_t cap;
    const cm_tokenizer *tok;
} sink;

static int grow(sink *s, int64_t more) {
    if (s->d->n_tok + more <= s->cap) return 0;
    int64_t cap = s->cap ? s->cap : 4096;
    while (cap < s->d->n_tok + more) cap *= 2;
    int32_t *t = cm_realloc(s->d->tok, (size_t)cap * sizeof(int32_t));
    if (t) s->d->tok = t;
    uint8_t *l = cm_realloc(s->d->loss, (size_t)cap);
    if (l) s->d->loss = l;
    if (!t || !l) return CM_ENOMEM;
    s->cap = cap;
    return 0;
}

static int push_tok(sink *s, int32_t id, uint8_t loss) {
    if (grow(s, 1)) return CM_ENOMEM;
    s->d->tok[s->d->n_tok] = id;
    s->d->loss[s->d->n_tok++] = loss;
    return 0;
}

/* Tokenize text (special tokens parsed when special) and append with flag loss. */
static int push_text(sink *s, const char *text, size_t n, bool special, uint8_t loss, char *err, size_t errlen) {
    cm_token *ids = NULL;
    size_t k = 0;
    int rc = cm_tokenizer_encode_alloc(s->tok, text, n, special ? CM_TOK_PARSE_SPECIAL : 0, &ids, &k, err, errlen);
    if (!rc && (rc = grow(s, (int64_t)k)) != 0) cm_errf(err, errlen, rc, "out of memory");
    if (!rc) {
        memcpy(s->d->tok + s->d->n_tok, ids, k * sizeof(int32_t));
        memset(s->d->loss + s->d->n_tok, loss, k);
        s->d->n_tok += (int64_t)k;
    }
    cm_free(ids);
    return rc;
}

/* Tokenize text whole (as inference will see it: SPM's prefix space once,
 * merges across segment borders) and flag each token that overlaps one of
 * the loss ranges [rng[2i], rng[2i + 1]) of text bytes. */
static int push_ranges(sink *s, const char *text, size_t n, bool special, const size_t *rng, int n_rng, char *err,
                       size_t errlen) {
    const int64_t first = s->d->n_tok;
    int rc = push_text(s, text, n, special, 0, err, errlen);
    if (rc) return rc;
    size_t total = 0, len;
    for (int64_t i = first; i < s->d->n_tok; i++) {
        const char *p = cm_tokenizer_piece(s->tok, s->d->tok[i], true, &len);
        total += p ? len : 0;
    }
    const size_t shift = total > n ? total - n : 0; /* SPM's dummy prefix: bytes not in the text */
    size_t at = 0;
    for (int64_t i = first; i < s->d->n_tok; i++) {
        const char *p = cm_tokenizer_piece(s->tok, s->d->tok[i], true, &len);
        size_t b0 = at > shift ? at - shift : 0;
        at += p ? len : 0;
        size_t b1 = at > shift ? at - shift : 0;
        if (b1 == b0) b1 = b0 + 1; /* a token of no bytes belongs where it stands */
        for (int k = 0; k < n_rng; k++)
            if (b0 < rng[2 * k + 1] && b1 > rng[2 * k]) s->d->loss[i] = 1;
    }
    return 0;
}

static const char *str_field(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* The chat rendering of msgs[0..n), optionally with the assistant prompt. */
static int render(const cm_chat_template *tpl, const cm_chat_opts *co, const cm_chat_msg *m, size_t n, bool gen,
                  cm_buf *out, char *err, size_t errlen) {
    cm_chat_opts o = *co;
    o.add_generation_prompt = gen;
    cm_buf_clear(out);
    return cm_chat_render(tpl, m, n, &o, out, err, errlen);
}

/* {"messages": [...]}: the text before each assistant turn without loss,
 * the turn itself (up to the next rendering's end) with loss, in one text. */
static int do_messages(sink *s, const cJSON *arr, const cm_chat_template *tpl, const cm_chat_opts *co, char *err,
                       size_t errlen) {
    if (!tpl) return cm_errf(err, errlen, CM_EFORMAT, "\"messages\" needs a chat template, and the model has none");
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > MAX_MSGS)
        return cm_errf(err, errlen, CM_EFORMAT, "\"messages\" must hold 1 to %d messages", MAX_MSGS);
    cm_chat_msg *m = cm_calloc((size_t)n, sizeof *m);
    if (!m) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int rc = 0, i = 0, n_asst = 0;
    for (const cJSON *x = arr->child; x && !rc; x = x->next, i++) {
        m[i].role = str_field(x, "role");
        m[i].content = str_field(x, "content");
        if (!cJSON_IsObject(x) || !m[i].role || !m[i].content)
            rc = cm_errf(err, errlen, CM_EFORMAT, "message %d needs string \"role\" and \"content\"", i + 1);
        else if (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") && strcmp(m[i].role, "assistant"))
            rc = cm_errf(err, errlen, CM_EFORMAT, "message %d has role '%.32s' (system, user or assistant)", i + 1,
                         m[i].role);
        else n_asst += !strcmp(m[i].role, "assistant");
    }
    if (!rc && !n_asst) rc = cm_errf(err, errlen, CM_EFORMAT, "\"messages\" has no assistant message to learn");
    cm_buf a, b, f;
    cm_buf_init(&a);
    cm_buf_init(&b);
    cm_buf_init(&f);
    size_t *rng = cm_malloc((size_t)(2 * n) * sizeof(size_t));
    int nr = 0;
    if (!rc && !rng) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (!rc) rc = render(tpl, co, m, (size_t)n, false, &f, err, errlen);
    for (int k = 0; k < n && !rc; k++) {
        if (strcmp(m[k].role, "assistant")) continue;
        /* the turn: from the end of the turns before it with the assistant's opening to its own end */
        if ((rc = render(tpl, co, m, (size_t)k, true, &a, err, errlen)) ||
            (rc = render(tpl, co, m, (size_t)k + 1, false, &b, err, errlen)))
            break;
        if (b.len < a.len || f.len < b.len || memcmp(a.data, f.data, a.len) || memcmp(b.data, f.data, b.len)) {
            rc = cm_errf(err, errlen, CM_EUNSUPPORTED,
                         "the chat template does not render message %d as an extension of the turns before it", k + 1);
            break;
        }
        rng[2 * nr] = a.len;
        rng[2 * nr++ + 1] = b.len;
    }
    if (!rc) rc = push_ranges(s, f.data, f.len, true, rng, nr, err, errlen);
    cm_free(rng);
    cm_buf_release(&f);
    cm_buf_release(&a);
    cm_buf_release(&b);
    cm_free(m);
    return rc;
}

static int do_line(sink *s, const char *line, size_t n, const cm_chat_template *tpl, const cm_chat_opts *co, char *err,
                   size_t errlen) {
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!j) return cm_errf(err, errlen, CM_EFORMAT, "not valid JSON");
    int rc = 0;
    const bool bos = cm_tokenizer_add_bos(s->tok) && cm_tokenizer_bos(s->tok) != CM_TOKEN_NULL;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text"),
                *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt"),
                *co_ = cJSON_GetObjectItemCaseSensitive(j, "completion");
    if (!cJSON_IsObject(j)) rc = cm_errf(err, errlen, CM_EFORMAT, "expected a JSON object");
    else if ((text != NULL) + (msgs != NULL) + (pr != NULL || co_ != NULL) != 1)
        rc = cm_errf(err, errlen, CM_EFORMAT,
                     "expected exactly one of \"text\", \"prompt\"/\"completion\" or \"messages\"");
    else if (text && !cJSON_IsString(text)) rc = cm_errf(err, errlen, CM_EFORMAT, "\"text\" must be a string");
    else if ((pr || co_) && (!cJSON_IsString(pr) || !cJSON_IsString(co_)))
        rc = cm_errf(err, errlen, CM_EFORMAT, "\"prompt\" and \"completion\" must both be strings");
    else if (msgs && !cJSON_IsArray(msgs)) rc = cm_errf(err, errlen, CM_EFORMAT, "\"messages\" must be an array");
    if (!rc && bos) rc = push_tok(s, cm_tokenizer_bos(s->tok), 0); /* the chat rendering leaves BOS to us then */
    if (!rc && text) rc = push_text(s, text->valuestring, strlen(text->valuestring), false, 1, err, errlen);
    if (!rc && pr) { /* one text, so that the tokens at the border are the ones inference will see */
        const size_t np = strlen(pr->valuestring), nc = strlen(co_->valuestring), rng[2] = {np, np + nc};
        char *t = np + nc < (size_t)MAX_LINE ? cm_malloc(np + nc + 1) : NULL;
        if (!t) rc = CM_ENOMEM;
        else {
            memcpy(t, pr->valuestring, np);
            memcpy(t + np, co_->valuestring, nc + 1);
            rc = push_ranges(s, t, np + nc, false, rng, 1, err, errlen);
            cm_free(t);
        }
    }
    if (!rc && msgs) rc = do_messages(s, msgs, tpl, co, err, errlen);
    if (!rc && !msgs && cm_tokenizer_eos(s->tok) != CM_TOKEN_NULL) rc = push_tok(s, cm_tokenizer_eos(s->tok), 1);
    if (rc == CM_ENOMEM) cm_errf(err, errlen, rc, "out of memory");
    cJSON_Delete(j);
    return rc;
}

int cm_tdata_parse(cm_tdata *d, const uint8_t *p, size_t n, const char *name, const cm_tokenizer *tok,
                   const cm_chat_template *tpl, const cm_chat_opts *copts, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    sink s = {.d = d, .tok = tok};
    int rc = 0, ex_cap = 0;
    size_t line_no = 0;
    for (size_t i = 0; i < n && !rc;) {
        const uint8_t *nl = memchr(p + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (p + i)) : n - i;
        line_no++;
        const char *line = (const char *)p + i;
        i += len + (nl ? 1 : 0);
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == len) continue;
        char msg[256] = "";
        if (len > MAX_LINE) rc = cm_errf(msg, sizeof msg, CM_EFORMAT, "line is longer than %d bytes", MAX_LINE);
        if (!rc && d->n_ex + 1 >= ex_cap) {
            ex_cap = ex_cap ? ex_cap * 2 : 256;
            int64_t *o = ex_cap < (1 << 28) ? cm_realloc(d->ex_off, (size_t)ex_cap * sizeof(int64_t)) : NULL;
            if (!o) rc = cm_errf(msg, sizeof msg, CM_ENOMEM, "out of memory");
            else d->ex_off = o;
        }
        if (!rc) {
            int64_t start = d->n_tok;
            d->ex_off[d->n_ex] = start;
            rc = do_line(&s, line, len, tpl, copts, msg, sizeof msg);
            if (rc) d->n_tok = start;
            else d->ex_off[++d->n_ex] = d->n_tok;
        }
        if (rc) cm_errf(err, errlen, rc, "'%s' line %zu: %s", name, line_no, msg);
    }
    if (!rc && d->n_ex == 0) rc = cm_errf(err, errlen, CM_EFORMAT, "'%s' holds no examples", name);
    if (rc) cm_tdata_release(d);
    return rc;
}

void cm_tdata_release(cm_tdata *d) {
    cm_free(d->tok);
    cm_free(d->loss);
    cm_free(d->ex_off);
    memset(d, 0, sizeof *d);
}

static bool any_loss(const cm_tdata *d, int64_t off, int len) {
    for (int j = 1; j < len; j++)
        if (d->loss[off + j]) return true;
    return false;
}

typedef struct packer {
    const cm_tdata *d;
    cm_twin *w;
    int n, cap;
} packer;

static int emit(packer *p, int64_t off, int64_t len) {
    if (len < 2 || !any_loss(p->d, off, (int)len)) return 0;
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        cm_twin *w = cm_realloc(p->w, (size_t)cap * sizeof *w);
        if (!w) return CM_ENOMEM;
        p->w = w;
        p->cap = cap;
    }
    p->w[p->n++] = (cm_twin){off, (int)len};
    return 0;
}

int cm_tdata_pack(const cm_tdata *d, const int *ex, int n, int n_ctx, cm_twin **out, int *n_out, char *err,
                  size_t errlen) {
    packer p = {.d = d};
    const int64_t max = (int64_t)n_ctx + 1;
    int64_t off = 0, len = 0; /* the window being filled */
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const int64_t s = d->ex_off[ex[i]], e = d->ex_off[ex[i] + 1];
        if (len > 0 && (len + (e - s) > max || off + len != s)) { /* does not fit, or not next in the stream */
            rc = emit(&p, off, len);
            len = 0;
        }
        if (e - s > max) { /* a long example: pieces of max tokens, each next one starting on the last target */
            for (int64_t o = s; !rc && o + 1 < e; o += max - 1) rc = emit(&p, o, e - o < max ? e - o : max);
            continue;
        }
        if (len == 0) off = s;
        len += e - s;
    }
    if (!rc && len > 0) rc = emit(&p, off, len);
    if (rc) {
        cm_free(p.w);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    *out = p.w;
    *n_out = p.n;
    return 0;
}

int cm_twin_fill(const cm_tdata *d, cm_twin w, int32_t *tokens, int32_t *target) {
    for (int j = 0; j + 1 < w.len; j++) {
        tokens[j] = d->tok[w.off + j];
        target[j] = d->loss[w.off + j + 1] ? d->tok[w.off + j + 1] : -1;
    }
    return w.len - 1;
}
