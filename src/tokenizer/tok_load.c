/*
 * tok_load.c: builds a cm_tokenizer from GGUF metadata the way llama.cpp's
 * llama_vocab::load does (defaults, overrides, text-based fix-ups of special
 * tokens), copying everything so the GGUF may be closed afterwards.
 *
 * Every value taken from the file is checked here: array types and lengths,
 * ids in range, duplicate token texts, merge strings. It must never trust a
 * count or an id it has not checked, and never abort on bad data.
 */
#include "tok_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- string hash tables ---- */

static int strtab_init(cm_tok_strtab *h, uint64_t n) {
    uint64_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    h->slots = cm_calloc(cap, sizeof(uint32_t));
    if (!h->slots) return CM_ENOMEM;
    h->mask = cap - 1;
    return 0;
}

cm_token cm_tok_lookup(const cm_tokenizer *t, const char *s, size_t n) {
    if (!t->tok_ht.slots) return CM_TOKEN_NULL;
    uint64_t h = cm_tok_hash(CM_TOK_HASH_SEED, s, n);
    for (uint64_t i = cm_tok_hash_fin(h) & t->tok_ht.mask;; i = (i + 1) & t->tok_ht.mask) {
        uint32_t v = t->tok_ht.slots[i];
        if (!v) return CM_TOKEN_NULL;
        cm_token id = (cm_token)(v - 1);
        if (t->text_len[id] == n && memcmp(t->text_blob + t->text_off[id], s, n) == 0) return id;
    }
}

cm_token cm_tokenizer_find(const cm_tokenizer *t, const char *text, size_t len) { return cm_tok_lookup(t, text, len); }

int32_t cm_tok_merge_rank(const cm_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn) {
    if (!t->merge_ht.slots) return -1;
    uint64_t h = cm_tok_hash(cm_tok_hash(cm_tok_hash(CM_TOK_HASH_SEED, l, ln), " ", 1), r, rn);
    for (uint64_t i = cm_tok_hash_fin(h) & t->merge_ht.mask;; i = (i + 1) & t->merge_ht.mask) {
        uint32_t v = t->merge_ht.slots[i];
        if (!v) return -1;
        const cm_tok_merge *m = &t->merges[v - 1];
        const char *s = t->merge_blob + m->off;
        if (m->len == ln + 1 + rn && m->first_len == ln && memcmp(s, l, ln) == 0 && memcmp(s + ln + 1, r, rn) == 0)
            return (int32_t)(v - 1);
    }
}

/* ---- helpers over the GGUF ---- */

static const cm_gguf_kv *find_array(const cm_gguf *g, const char *key, char *err, size_t errlen, int *rc) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, key);
    *rc = 0;
    if (!kv) return NULL;
    if (kv->type != CM_GGUF_ARRAY) {
        *rc = cm_errf(err, errlen, CM_EFORMAT, "'%s' is not an array", key);
        return NULL;
    }
    return kv;
}

static bool get_id(const cm_gguf *g, const char *key, uint64_t *out) { return cm_gguf_get_u64(g, key, out); }

/* ---- special-token fix-ups by text (llama.cpp recognises these) ---- */

// clang-format off
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<end_of_utterance>", NULL};
static const char *const k_eom_texts[] = {"<|eom_id|>", NULL};
static const char *const k_fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const k_fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                              "<reponame>", NULL};
static const char *const k_fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL};
// clang-format on

static cm_token find_cstr(const cm_tokenizer *t, const char *s) { return cm_tok_lookup(t, s, strlen(s)); }

/* First text of the list present in the vocab (llama.cpp walks a hash map, so
 * its pick among several candidates is unordered; ours is the list order). */
static cm_token detect(cm_tokenizer *t, const char *const *texts) {
    for (int i = 0; texts[i]; i++) {
        cm_token id = find_cstr(t, texts[i]);
        if (id != CM_TOKEN_NULL) return id;
    }
    return CM_TOKEN_NULL;
}

static void force_control(cm_tokenizer *t, cm_token id) {
    if (id != CM_TOKEN_NULL) t->attr[id] |= CM_TOK_ATTR_CONTROL;
}

static void special_fixups(cm_tokenizer *t, const cm_gguf *g, cm_token fim_pad, cm_token fim_rep, cm_token fim_sep) {
    if (t->eot == CM_TOKEN_NULL) force_control(t, t->eot = detect(t, k_eot_texts));
    if (t->eom == CM_TOKEN_NULL) force_control(t, t->eom = detect(t, k_eom_texts));
    if (fim_pad == CM_TOKEN_NULL) force_control(t, fim_pad = detect(t, k_fim_pad_texts));
    if (fim_rep == CM_TOKEN_NULL) force_control(t, fim_rep = detect(t, k_fim_rep_texts));
    if (fim_sep == CM_TOKEN_NULL) force_control(t, fim_sep = detect(t, k_fim_sep_texts));
    /* The FIM prefix/suffix/middle tokens are also forced to CONTROL by llama.cpp. */
    // clang-format off
    static const char *const fim_other[] = {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
        "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL,
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>",
        "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL,
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
        "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
    // clang-format on
    static const char *const fim_keys[] = {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
                                           "tokenizer.ggml.fim_mid_token_id"};
    static const char *const fim_old_keys[] = {"tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id",
                                               "tokenizer.ggml.middle_token_id"};
    for (int k = 0, j = 0; k < 3; k++) {
        const char *const *list = &fim_other[j];
        while (fim_other[j]) j++;
        j++;
        uint64_t v;
        bool set = (get_id(g, fim_keys[k], &v) || get_id(g, fim_old_keys[k], &v)) && v < (uint64_t)t->n_vocab;
        if (!set) force_control(t, detect(t, list));
    }

    /* Tokens with "unused" in a control token's text are unused. */
    for (cm_token id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & CM_TOK_ATTR_CONTROL)) continue;
        const char *s = t->text_blob + t->text_off[id];
        size_t n = t->text_len[id];
        for (size_t i = 0; i + 6 <= n; i++)
            if (!memcmp(s + i, "unused", 6)) {
                t->attr[id] |= CM_TOK_ATTR_UNUSED;
                break;
            }
    }

    /* End-of-generation set. */
    cm_token fims[3] = {fim_pad, fim_rep, fim_sep};
    for (int i = 0; i < 3; i++)
        if (fims[i] != CM_TOKEN_NULL) t->attr[fims[i]] |= CM_TOK_ATTR_EOG_;
    for (int i = 0; k_eog_texts[i]; i++) {
        cm_token id = find_cstr(t, k_eog_texts[i]);
        if (id == CM_TOKEN_NULL) continue;
        t->attr[id] |= CM_TOK_ATTR_EOG_ | CM_TOK_ATTR_CONTROL;
    }
    /* gpt-oss: these are always rendered. */
    static const char *const render[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (int i = 0; render[i]; i++) {
        cm_token id = find_cstr(t, render[i]);
        if (id != CM_TOKEN_NULL) t->attr[id] = CM_TOK_ATTR_USER_DEFINED | (t->attr[id] & CM_TOK_ATTR_EOG_);
    }
    cm_token ids[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (ids[i] != CM_TOKEN_NULL) t->attr[ids[i]] |= CM_TOK_ATTR_EOG_;
    /* o200k_harmony / solar-open: "<|end|>" is not the end when return+call exist. */
    cm_token end = find_cstr(t, "<|end|>"), ret = find_cstr(t, "<|return|>");
    cm_token call = find_cstr(t, "<|call|>"), calls = find_cstr(t, "<|calls|>"), flush = find_cstr(t, "<|flush|>");
#define EOG(x) ((x) != CM_TOKEN_NULL && (t->attr[x] & CM_TOK_ATTR_EOG_))
    bool has_call = EOG(call) || EOG(calls);
    if (EOG(end) && ((EOG(ret) && has_call) || (has_call && EOG(flush)))) t->attr[end] = CM_TOK_ATTR_USER_DEFINED;
    cm_token tool = find_cstr(t, "<|tool_response>"), s_end = find_cstr(t, "</s>");
    if (EOG(tool) && EOG(s_end)) t->attr[s_end] = CM_TOK_ATTR_NORMAL;
#undef EOG
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const cm_tokenizer *t = ctx;
    cm_token x = *(const cm_token *)a, y = *(const cm_token *)b;
    if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Insertion-free stable sort: a merge sort over the special ids, longest text
 * first, ties by id (llama.cpp's std::sort leaves ties unspecified). */
static void sort_special(cm_tokenizer *t, cm_token *v, cm_token *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_special(t, v, tmp, h);
    sort_special(t, v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_special(&v[j], &v[i], t) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(*v));
}

static bool contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && (hay[i] | 0x20) == (needle[i] | 0x20)) i++;
        if (i == n) return true;
    }
    return false;
}

/* ---- the build ---- */

static int load_vocab(cm_tokenizer *t, const cm_gguf *g, char *err, size_t errlen) {
    int rc;
    const cm_gguf_kv *tok = find_array(g, "tokenizer.ggml.tokens", err, errlen, &rc);
    if (rc) return rc;
    if (!tok) return cm_errf(err, errlen, CM_EFORMAT, "no tokenizer vocabulary (tokenizer.ggml.tokens) in the file");
    if (tok->arr_type != CM_GGUF_STRING)
        return cm_errf(err, errlen, CM_EFORMAT, "tokenizer.ggml.tokens is not an array of strings");
    if (tok->arr_len == 0 || tok->arr_len > (uint64_t)INT32_MAX - 1)
        return cm_errf(err, errlen, CM_EFORMAT, "tokenizer.ggml.tokens has %llu entries",
                       (unsigned long long)tok->arr_len);
    uint64_t n = tok->arr_len;
    t->n_vocab = (int32_t)n;

    const cm_gguf_kv *sc = find_array(g, "tokenizer.ggml.scores", err, errlen, &rc);
    if (rc) return rc;
    if (sc && ((sc->arr_type != CM_GGUF_F32 && sc->arr_type != CM_GGUF_I32) || sc->arr_len < n))
        return cm_errf(err, errlen, CM_EFORMAT, "tokenizer.ggml.scores: wrong type or only %llu of %llu entries",
                       (unsigned long long)sc->arr_len, (unsigned long long)n);
    const cm_gguf_kv *tt = find_array(g, "tokenizer.ggml.token_type", err, errlen, &rc);
    if (rc) return rc;
    if (tt && (tt->arr_type != CM_GGUF_I32 || tt->arr_len < n))
        return cm_errf(err, errlen, CM_EFORMAT, "tokenizer.ggml.token_type: wrong type or only %llu of %llu entries",
                       (unsigned long long)tt->arr_len, (unsigned long long)n);

    t->text_off = cm_calloc(n, sizeof(uint64_t));
    t->text_len = cm_calloc(n, sizeof(uint32_t));
    t->score = cm_calloc(n, sizeof(float));
    t->attr = cm_calloc(n, sizeof(uint32_t));
    if (!t->text_off || !t->text_len || !t->score || !t->attr) return CM_ENOMEM;

    /* Sizes first: one blob for all texts. Empty texts become "[EMPTY_i]" as in llama.cpp. */
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        cm_gguf_str s;
        if (!cm_gguf_arr_str(tok, i, &s))
            return cm_errf(err, errlen, CM_EFORMAT, "unreadable token %llu", (unsigned long long)i);
        uint64_t len = s.len ? s.len : 32;
        if (s.len > UINT32_MAX / 2 || !cm_add_ok(total, len, &total))
            return cm_errf(err, errlen, CM_EFORMAT, "token %llu is too long", (unsigned long long)i);
    }
    t->text_blob = cm_malloc(total + 1);
    if (!t->text_blob) return CM_ENOMEM;
    uint64_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        cm_gguf_str s;
        cm_gguf_arr_str(tok, i, &s);
        t->text_off[i] = off;
        if (s.len) {
            memcpy(t->text_blob + off, s.ptr, s.len);
            t->text_len[i] = (uint32_t)s.len;
        } else {
            t->text_len[i] = (uint32_t)snprintf(t->text_blob + off, 32, "[EMPTY_%llu]", (unsigned long long)i);
        }
        off += t->text_len[i];
        if (t->text_len[i] > t->max_token_len) t->max_token_len = t->text_len[i];

        double f = 0;
        if (sc) {
            if (sc->arr_type == CM_GGUF_F32) cm_gguf_arr_f64(sc, i, &f);
            else {
                int64_t v = 0;
                cm_gguf_arr_i64(sc, i, &v);
                f = (double)v;
            }
        }
        t->score[i] = isnan(f) ? -INFINITY : (float)f; /* NaN would break the merge order */
        uint32_t a = CM_TOK_ATTR_NORMAL;
        if (tt) {
            int64_t ty = 0;
            cm_gguf_arr_i64(tt, i, &ty);
            switch (ty) {
            case 1: a = CM_TOK_ATTR_NORMAL; break;
            case 2: a = CM_TOK_ATTR_UNKNOWN; break;
            case 3: a = CM_TOK_ATTR_CONTROL; break;
            case 4: a = CM_TOK_ATTR_USER_DEFINED; break;
            case 5: a = CM_TOK_ATTR_UNUSED; break;
            case 6: a = CM_TOK_ATTR_BYTE; break;
            default: a = CM_TOK_ATTR_UNDEFINED; break;
            }
        }
        t->attr[i] = a;
    }

    if ((rc = strtab_init(&t->tok_ht, n))) return rc;
    for (uint64_t i = 0; i < n; i++) {
        const char *s = t->text_blob + t->text_off[i];
        uint64_t h = cm_tok_hash(CM_TOK_HASH_SEED, s, t->text_len[i]);
        for (uint64_t j = cm_tok_hash_fin(h) & t->tok_ht.mask;; j = (j + 1) & t->tok_ht.mask) {
            uint32_t v = t->tok_ht.slots[j];
            if (!v) {
                t->tok_ht.slots[j] = (uint32_t)(i + 1);
                break;
            }
            if (t->text_len[v - 1] == t->text_len[i] && !memcmp(t->text_blob + t->text_off[v - 1], s, t->text_len[i]))
                return cm_errf(err, errlen, CM_EFORMAT, "tokens %u and %llu have the same text", v - 1,
                               (unsigned long long)i);
        }
    }
    return 0;
}

static int load_merges(cm_tokenizer *t, const cm_gguf *g, char *err, size_t errlen) {
    int rc;
    const cm_gguf_kv *mk = find_array(g, "tokenizer.ggml.merges", err, errlen, &rc);
    if (rc) return rc;
    if (!mk) return cm_errf(err, errlen, CM_EFORMAT, "BPE vocabulary without tokenizer.ggml.merges");
    if (mk->arr_type != CM_GGUF_STRING || mk->arr_len > (uint64_t)INT32_MAX - 1)
        return cm_errf(err, errlen, CM_EFORMAT, "tokenizer.ggml.merges is not an array of strings");
    uint64_t n = mk->arr_len, total = 0;
    for (uint64_t i = 0; i < n; i++) {
        cm_gguf_str s;
        if (!cm_gguf_arr_str(mk, i, &s) || s.len > UINT32_MAX / 2 || !cm_add_ok(total, s.len, &total))
            return cm_errf(err, errlen, CM_EFORMAT, "unreadable merge %llu", (unsigned long long)i);
    }
    t->merge_blob = cm_malloc(total + 1);
    t->merges = cm_calloc(n, sizeof(cm_tok_merge));
    if (!t->merge_blob || !t->merges) return CM_ENOMEM;
    if ((rc = strtab_init(&t->merge_ht, n))) return rc;
    uint64_t off = 0;
    t->n_merges = (uint32_t)n;
    for (uint64_t i = 0; i < n; i++) {
        cm_gguf_str s;
        cm_gguf_arr_str(mk, i, &s);
        cm_tok_merge *m = &t->merges[i];
        m->off = off;
        m->len = (uint32_t)s.len;
        memcpy(t->merge_blob + off, s.ptr, s.len);
        off += s.len;
        /* llama.cpp splits at the first space after position 0; a merge with no
         * such space, or an empty half, can never match a pair: skip it. */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp || (uint64_t)(sp - s.ptr) + 1 >= s.len) continue;
        m->first_len = (uint32_t)(sp - s.ptr);
        const char *key = t->merge_blob + m->off;
        uint64_t h = cm_tok_hash(CM_TOK_HASH_SEED, key, m->len);
        for (uint64_t j = cm_tok_hash_fin(h) & t->merge_ht.mask;; j = (j + 1) & t->merge_ht.mask) {
            uint32_t v = t->merge_ht.slots[j];
            if (!v) {
                t->merge_ht.slots[j] = (uint32_t)(i + 1);
                break;
            }
            const cm_tok_merge *o = &t->merges[v - 1];
            if (o->len == m->len && !memcmp(t->merge_blob + o->off, key, m->len)) break; /* first rank wins */
        }
    }
    return 0;
}

static int build(cm_tokenizer *t, const cm_gguf *g, char *err, size_t errlen) {
    int rc;
    char *model = cm_gguf_get_str(g, "tokenizer.ggml.model");
    char *pre = cm_gguf_get_str(g, "tokenizer.ggml.pre");
    rc = 0;
    if (!model) {
        rc = cm_errf(err, errlen, CM_EFORMAT, "no tokenizer in the file (tokenizer.ggml.model missing)");
    } else if (!strcmp(model, "llama")) {
        t->kind = CM_TOK_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_space_prefix = true;
        t->add_bos = true;
        snprintf(t->pre_name, sizeof t->pre_name, "default");
    } else if (!strcmp(model, "gpt2")) {
        t->kind = CM_TOK_BPE;
        t->bos = 11;
        t->eos = 11;
        const char *p = pre && *pre ? pre : "default";
        if (!pre || !*pre)
            CM_LOGW("tokenizer: no tokenizer.ggml.pre; using the 'default' pre-tokenizer (quality may suffer)");
        t->pre = cm_tok_pre_find(p);
        if (!t->pre)
            rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "unknown pre-tokenizer type '%.64s' (tokenizer.ggml.pre)", p);
        else {
            snprintf(t->pre_name, sizeof t->pre_name, "%s", p);
            t->ignore_merges = t->pre->ignore_merges;
            t->add_bos = t->pre->add_bos;
            t->clean_spaces = t->pre->clean_spaces;
            if (t->pre->no_bos) t->bos = CM_TOKEN_NULL;
        }
    } else {
        rc = cm_errf(err, errlen, CM_EUNSUPPORTED, "unknown tokenizer model '%.64s' (tokenizer.ggml.model)", model);
    }
    cm_free(model);
    cm_free(pre);
    if (rc) return rc;
    bool b;
    if (cm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) t->add_space_prefix = b;

    if ((rc = load_vocab(t, g, err, errlen))) return rc;
    if (t->kind == CM_TOK_BPE && (rc = load_merges(t, g, err, errlen))) return rc;

    /* Special ids: defaults out of range are dropped; file values out of range ignored. */
    struct {
        const char *key;
        cm_token *id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},     {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.eot_token_id", &t->eot},     {"tokenizer.ggml.eom_token_id", &t->eom},
        {"tokenizer.ggml.unknown_token_id", &t->unk}, {"tokenizer.ggml.seperator_token_id", &t->sep},
        {"tokenizer.ggml.padding_token_id", &t->pad},
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(ids); i++) {
        if (*ids[i].id >= t->n_vocab) *ids[i].id = CM_TOKEN_NULL;
        uint64_t v;
        if (!get_id(g, ids[i].key, &v)) continue;
        if (v >= (uint64_t)t->n_vocab)
            CM_LOGW("tokenizer: %s = %llu is out of range; ignored", ids[i].key, (unsigned long long)v);
        else *ids[i].id = (cm_token)v;
    }
    if (cm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) t->add_bos = b;
    if (cm_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b)) t->add_eos = b;
    if (t->add_bos && t->bos == CM_TOKEN_NULL)
        return cm_errf(err, errlen, CM_EFORMAT, "the vocabulary asks for a BOS token but has no valid bos_token_id");
    if (t->add_eos && t->eos == CM_TOKEN_NULL)
        return cm_errf(err, errlen, CM_EFORMAT, "the vocabulary asks for an EOS token but has no valid eos_token_id");

    cm_token fim[3] = {CM_TOKEN_NULL, CM_TOKEN_NULL, CM_TOKEN_NULL};
    static const char *const fim_keys[3] = {"tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
                                            "tokenizer.ggml.fim_sep_token_id"};
    for (int i = 0; i < 3; i++) {
        uint64_t v;
        if (get_id(g, fim_keys[i], &v) && v < (uint64_t)t->n_vocab) fim[i] = (cm_token)v;
    }
    special_fixups(t, g, fim[0], fim[1], fim[2]);

    /* Special tokens cache: what the text partition looks for, longest first. */
    size_t ns = 0;
    for (cm_token id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (CM_TOK_ATTR_CONTROL | CM_TOK_ATTR_USER_DEFINED | CM_TOK_ATTR_UNKNOWN)) ns++;
    t->special = cm_malloc(ns * sizeof(cm_token));
    cm_token *tmp = cm_malloc(ns * sizeof(cm_token));
    if (!t->special || !tmp) {
        cm_free(tmp);
        return CM_ENOMEM;
    }
    for (cm_token id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (CM_TOK_ATTR_CONTROL | CM_TOK_ATTR_USER_DEFINED | CM_TOK_ATTR_UNKNOWN))
            t->special[t->n_special++] = id;
    sort_special(t, t->special, tmp, t->n_special);
    cm_free(tmp);

    if ((rc = cm_tok_build_pieces(t, err, errlen))) return rc;

    /* phi-3: special tokens swallow the whitespace after them. */
    char *name = cm_gguf_get_str(g, "general.name");
    if (name && (contains_ci(name, "phi-3") || contains_ci(name, "phi3"))) {
        for (size_t i = 0; i < t->n_special; i++) t->attr[t->special[i]] |= CM_TOK_ATTR_RSTRIP;
        cm_token x = find_cstr(t, "</s>");
        if (x != CM_TOKEN_NULL) t->attr[x] |= CM_TOK_ATTR_RSTRIP;
        const char *off[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int i = 0; i < 3; i++)
            if ((x = find_cstr(t, off[i])) != CM_TOKEN_NULL) t->attr[x] &= ~(uint32_t)CM_TOK_ATTR_RSTRIP;
    }
    cm_free(name);

    if (t->kind == CM_TOK_BPE && (rc = cm_tok_pre_compile(t, err, errlen))) return rc;

    /* Newline token: SPM <0x0A>, BPE whatever "\n" tokenizes to first. */
    t->nl = t->pad;
    if (t->kind == CM_TOK_SPM) {
        cm_token x = find_cstr(t, "<0x0A>");
        if (x == CM_TOKEN_NULL) x = find_cstr(t, "\n");
        if (x != CM_TOKEN_NULL) t->nl = x;
    } else {
        cm_token ids1[4];
        size_t n1 = 0;
        char e[8];
        int r = cm_tokenizer_encode(t, "\n", 1, 0, ids1, 4, &n1, e, sizeof e);
        if ((r == 0 || r == CM_ERANGE) && n1 > 0) t->nl = ids1[0];
    }
    return 0;
}

int cm_tokenizer_new(cm_tokenizer **out, const cm_gguf *g, char *err, size_t errlen) {
    *out = NULL;
    cm_tokenizer *t = cm_calloc(1, sizeof *t);
    if (!t) return cm_errf(err, errlen, CM_ENOMEM, "out of memory building the tokenizer");
    t->bos = t->eos = t->eot = t->eom = t->unk = t->sep = t->pad = t->nl = CM_TOKEN_NULL;
    int rc = build(t, g, err, errlen);
    if (rc) {
        if (rc == CM_ENOMEM) cm_errf(err, errlen, CM_ENOMEM, "out of memory building the tokenizer");
        cm_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int cm_tokenizer_open(cm_tokenizer **out, const char *path, char *err, size_t errlen) {
    cm_gguf g;
    memset(&g, 0, sizeof g);
    *out = NULL;
    int rc = cm_gguf_open(&g, path, NULL, NULL, err, errlen);
    if (rc) return rc;
    rc = cm_tokenizer_new(out, &g, err, errlen);
    cm_gguf_close(&g);
    return rc;
}

void cm_tokenizer_free(cm_tokenizer *t) {
    if (!t) return;
    cm_tok_pre_release(t);
    cm_free(t->text_blob);
    cm_free(t->text_off);
    cm_free(t->text_len);
    cm_free(t->score);
    cm_free(t->attr);
    cm_free(t->tok_ht.slots);
    cm_free(t->piece_blob);
    cm_free(t->piece_off);
    cm_free(t->piece_len);
    cm_free(t->merge_blob);
    cm_free(t->merges);
    cm_free(t->merge_ht.slots);
    cm_free(t->special);
    cm_free(t);
}

/* ---- facts ---- */
enum cm_tok_kind cm_tokenizer_kind(const cm_tokenizer *t) { return t->kind; }
const char *cm_tokenizer_pre_name(const cm_tokenizer *t) { return t->pre_name; }
int32_t cm_tokenizer_n_vocab(const cm_tokenizer *t) { return t->n_vocab; }
cm_token cm_tokenizer_bos(const cm_tokenizer *t) { return t->bos; }
cm_token cm_tokenizer_eos(const cm_tokenizer *t) { return t->eos; }
cm_token cm_tokenizer_eot(const cm_tokenizer *t) { return t->eot; }
cm_token cm_tokenizer_eom(const cm_tokenizer *t) { return t->eom; }
cm_token cm_tokenizer_unk(const cm_tokenizer *t) { return t->unk; }
cm_token cm_tokenizer_pad(const cm_tokenizer *t) { return t->pad; }
cm_token cm_tokenizer_nl(const cm_tokenizer *t) { return t->nl; }
bool cm_tokenizer_add_bos(const cm_tokenizer *t) { return t->add_bos; }
bool cm_tokenizer_add_eos(const cm_tokenizer *t) { return t->add_eos; }
bool cm_tokenizer_is_eog(const cm_tokenizer *t, cm_token id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & CM_TOK_ATTR_EOG_);
}
bool cm_tokenizer_is_control(const cm_tokenizer *t, cm_token id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & CM_TOK_ATTR_CONTROL);
}
unsigned cm_tokenizer_attr(const cm_tokenizer *t, cm_token id) {
    return id >= 0 && id < t->n_vocab ? t->attr[id] & ~CM_TOK_ATTR_EOG_ : 0;
}
const char *cm_tokenizer_text(const cm_tokenizer *t, cm_token id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->text_len[id];
    return t->text_blob + t->text_off[id];
}
float cm_tokenizer_score(const cm_tokenizer *t, cm_token id) {
    return id >= 0 && id < t->n_vocab ? t->score[id] : 0.0f;
}
