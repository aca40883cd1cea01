/*
 * tok_pretok.c: the BPE pre-tokenizers: which regexes each tokenizer.ggml.pre
 * value means, compiled once per tokenizer with PCRE2 (UTF + UCP), and the
 * split that applies them the way llama.cpp's unicode_regex_split does.
 *
 * The patterns are llama.cpp's with one systematic change: llama.cpp treats
 * every Unicode White_Space character as \s (it collapses non-ASCII spaces to
 * \v before matching), which includes U+0085 NEL; PCRE2's UCP \s does not, so
 * \s is written [\s\x{85}] and \S [^\s\x{85}]. Its non-category regexes see
 * non-ASCII whitespace as \v too, so explicit ranges that span whitespace
 * (U+0800-U+4E00, U+3000) leave it out here. This file must not guess at a
 * pre-tokenizer it does not know: an unknown name is an error upstream.
 *
 * NEEDSWORK: Unicode versions. \p{L}/\p{N}/... come from PCRE2's tables
 * (10.42: Unicode 14) while llama.cpp carries its own (newer) tables, so a
 * character assigned after Unicode 14 may split differently. Every test
 * string agrees; only very new scripts/ideographs could differ.
 * Not supported (an error names them): pre-tokenizers llama.cpp implements
 * with hand-written splitters or other normalisers (kimi-k2, afmoe,
 * superbpe, tiny_aya, gemma4, sarvam-moe, whitespace, chameleon, youtu,
 * jais-2, jina-*, roberta-bpe, modern-bert, granite-embed-multi-*).
 */
#include "tok_internal.h"

#include <string.h>

#define WS "[\\s\\x{85}]"
#define NWS "[^\\s\\x{85}]"
#define WSC "\\s\\x{85}" /* inside a class */
#define CONTR "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WSC "\\p{L}\\p{N}]+|" WS "+(?!" NWS ")"
#define RE_LLAMA3                                                                                              \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WSC "\\p{L}\\p{N}]+[\\r\\n]*|" WS "*[\\r\\n]+|" WS \
          "+(?!" NWS ")|" WS "+"
#define RE_QWEN2                                                                                                     \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WSC "\\p{L}\\p{N}]+[\\r\\n]*|" WS "*[\\r\\n]+|" WS "+(?!" NWS \
          ")|" WS "+"
#define RE_QWEN35                                                                                      \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WSC "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|" WS \
          "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+"
#define RE_MINICPM5                                                                                                   \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^" WSC "\\p{L}\\p{N}]+[\\r\\n]*|" WS "*[\\r\\n]+|" WS "+(?!" NWS \
          ")|" WS "+"
#define RE_SEED_CODER                                                                                                \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^" WSC "\\p{L}\\p{N}\\r\\n]+|" WS "*[\\r\\n]+|" WS "+(?!" NWS \
          ")|" WS "+"
#define RE_BAILING                                                                             \
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WSC \
    "\\p{L}\\p{N}]+[\\r\\n]*|" WS "*[\\r\\n]|" WS "+(?!" NWS ")|" WS "+"
#define RE_EXAONE_MOE                                                                    \
    CONTR "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^" WSC \
          "\\p{L}\\p{N}]+[\\r\\n/]?|" WS "*[\\r\\n]|" WS "+(?!" NWS ")|" WS "+"
/* Upper/lower letter runs: llama.cpp's rewrite, in which any letter that is not
 * a-z counts as "upper" and any that is not A-Z as "lower". */
#define UPPER "(?:(?=\\p{L})[^a-z])"
#define LOWER "(?:(?=\\p{L})[^A-Z])"
#define RE_TEKKEN                                                                                           \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*|\\p{N}| ?[^" WSC \
    "\\p{L}\\p{N}]+[\\r\\n/]*|" WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+"
#define RE_GPT4O                                                                                            \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+" CONTR "?|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*" CONTR \
    "?|\\p{N}{1,3}| ?[^" WSC "\\p{L}\\p{N}]+[\\r\\n/]*|" WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+"
#define RE_DEEPSEEK3_MAIN                                                                                 \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| " \
    "?[\\p{P}\\p{S}]+[\\r\\n]*|" WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+"
#define RE_PORO " ?[^(" WSC "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
/* CJK ranges of the DeepSeek pre-tokenizers; U+0800-U+4E00 minus whitespace. */
#define RE_DS_CJK                                                                                     \
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}" \
    "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_DS_LETTERS                                                                                                     \
    WS "?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-"         \
       "\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-"     \
       "\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-"        \
       "\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"         \
       "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-"        \
       "\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-" \
       "\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"         \
       "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"  \
       "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}"          \
       "\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"          \
       "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-"        \
       "\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"     \
       "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"

/* Regex lists. */
#define L1(a) \
    1, { a }
#define L2(a, b) \
    2, { a, b }
#define L3(a, b, c) \
    3, { a, b, c }
#define L4(a, b, c, d) \
    4, { a, b, c, d }
#define L5(a, b, c, d, e) \
    5, { a, b, c, d, e }
#define L6(a, b, c, d, e, f) \
    6, { a, b, c, d, e, f }

#define P_DEFAULT L4("[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]")
#define P_LLAMA3 L1(RE_LLAMA3)
#define P_QWEN2 L1(RE_QWEN2)
#define P_GPT2 L1(RE_GPT2)
#define P_STARCODER L2("\\p{N}", RE_GPT2)
#define P_FALCON L3("[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]")
#define P_DS_LLM                                                                                             \
    L6("[\\r\\n]", RE_DS_LETTERS,                                                                            \
       WS "?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+", WS "+$", \
       RE_DS_CJK, "\\p{N}+")
#define P_DS_CODER L5("[\\r\\n]", WS "?\\p{L}+", WS "?\\p{P}+", RE_DS_CJK, "\\p{N}")
#define P_DS3 L3("\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+", RE_DEEPSEEK3_MAIN)

/* name, regexes, ignore_merges, add_bos, clean_spaces, no_bos */
static const cm_tok_pre k_pres[] = {
    {"default", P_DEFAULT, false, false, true, false},
    {"llama-bpe", P_LLAMA3, true, true, true, false},
    {"llama3", P_LLAMA3, true, true, true, false},
    {"llama-v3", P_LLAMA3, true, true, true, false},
    {"falcon3", P_LLAMA3, true, true, true, false},
    {"falcon-h1", P_LLAMA3, true, true, true, false},
    {"pixtral", P_LLAMA3, true, true, true, false},
    {"midm-2.0", P_LLAMA3, true, true, true, false},
    {"lfm2", P_LLAMA3, true, true, true, false},
    {"dbrx", P_LLAMA3, false, false, true, false},
    {"smaug-bpe", P_LLAMA3, false, false, true, false},
    {"glm4", P_LLAMA3, false, false, true, true},
    {"chatglm-bpe", P_LLAMA3, false, false, true, true},
    {"deepseek-llm", P_DS_LLM, false, false, false, false},
    {"deepseek-coder", P_DS_CODER, false, false, false, false},
    {"deepseek-v3", P_DS3, false, false, false, false},
    {"hunyuan-dense", P_DS3, false, false, false, false},
    {"joyai-llm", P_DS3, false, false, false, false},
    {"falcon", P_FALCON, false, false, true, false},
    {"mpt", P_GPT2, false, false, true, false},
    {"gpt-2", P_GPT2, false, false, true, false},
    {"phi-2", P_GPT2, false, false, true, false},
    {"gigachat", P_GPT2, false, false, true, false},
    {"a.x-4.0", P_GPT2, false, false, true, false},
    {"mellum", P_GPT2, false, false, true, false},
    {"olmo", P_GPT2, false, false, true, false},
    {"jais", P_GPT2, false, false, true, false},
    {"exaone4", P_GPT2, false, false, true, false},
    {"trillion", P_GPT2, false, false, false, false},
    {"granite-docling", P_GPT2, false, false, false, false},
    {"starcoder", P_STARCODER, false, false, true, false},
    {"refact", P_STARCODER, false, false, true, false},
    {"command-r", P_STARCODER, false, false, false, false},
    {"smollm", P_STARCODER, false, false, false, false},
    {"codeshell", P_STARCODER, false, false, true, false},
    {"exaone", P_STARCODER, false, false, true, false},
    {"minerva-7b", P_STARCODER, false, false, true, false},
    {"mellum2", P_STARCODER, false, false, true, false},
    {"qwen2", P_QWEN2, false, false, false, false},
    {"deepseek-r1-qwen", P_QWEN2, false, false, false, false},
    {"kormo", P_QWEN2, false, false, false, false},
    {"f2llmv2", P_QWEN2, false, false, false, false},
    {"megrez", P_QWEN2, false, false, true, false},
    {"stablelm2", P_QWEN2, false, false, true, false},
    {"hunyuan", P_QWEN2, false, false, false, false},
    {"grok-2", P_QWEN2, false, false, false, false},
    {"solar-open", P_QWEN2, false, false, false, false},
    {"qwen35", L1(RE_QWEN35), false, false, false, false},
    {"minicpm5", L2("\\p{N}{1,3}", RE_MINICPM5), true, false, true, false},
    {"seed-coder", L1(RE_SEED_CODER), false, false, false, false},
    {"bailingmoe", L1(RE_BAILING), false, false, false, false},
    {"bailingmoe2", L1(RE_BAILING), false, false, false, false},
    {"llada-moe", L1(RE_BAILING), false, false, false, false},
    {"exaone-moe", L1(RE_EXAONE_MOE), false, false, true, false},
    {"tekken", L1(RE_TEKKEN), true, true, false, false},
    {"gpt-4o", L1(RE_GPT4O), false, false, false, false},
    {"llama4", L1(RE_GPT4O), false, false, false, false},
    {"kanana2", L1(RE_GPT4O), false, false, false, false},
    {"talkie", L1(RE_GPT4O), false, false, false, false},
    {"minimax-m2", L1(RE_GPT4O), false, false, false, false},
    {"poro-chat", L1(RE_PORO), false, false, false, false},
    {"bloom", L1(RE_PORO), false, false, true, false},
    {"gpt3-finnish", L1(RE_PORO), false, false, true, false},
    {"viking", L2(RE_PORO, "\\p{N}"), false, false, false, false},
};

const cm_tok_pre *cm_tok_pre_find(const char *name) {
    for (size_t i = 0; i < CM_ARRAY_LEN(k_pres); i++)
        if (!strcmp(k_pres[i].name, name)) return &k_pres[i];
    return NULL;
}

const char *cm_tokenizer_pre_name_at(size_t i) { return i < CM_ARRAY_LEN(k_pres) ? k_pres[i].name : NULL; }

int cm_tok_pre_compile(cm_tokenizer *t, char *err, size_t errlen) {
    for (int i = 0; i < t->pre->n_re; i++) {
        int ec;
        PCRE2_SIZE eo;
        t->re[i] = pcre2_compile((PCRE2_SPTR)t->pre->re[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            CM_ASSERT(!"pre-tokenizer regex must compile"); /* a bug in the table above */
            return cm_errf(err, errlen, CM_EINVAL, "pre-tokenizer '%s' regex %d: %s", t->pre->name, i, (char *)msg);
        }
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
        t->n_re = i + 1;
    }
    return 0;
}

void cm_tok_pre_release(cm_tokenizer *t) {
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    t->n_re = 0;
}

bool cm_tok_spans_push(cm_tok_spans *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        cm_tok_span *v = cm_realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (cm_tok_span){off, len};
    return true;
}

/* One regex over one piece, llama.cpp-style: matches and the gaps between
 * them become pieces; an empty match splits a gap (std::regex_iterator then
 * retries at the same place for a non-empty match before moving on). */
static int split_one(const pcre2_code *re, pcre2_match_data *md, const char *subject, cm_tok_span sp,
                     cm_tok_spans *out) {
    PCRE2_SPTR s = (PCRE2_SPTR)(subject + sp.off);
    size_t n = sp.len, gap = 0, pos = 0;
    uint32_t opts = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, s, n, pos, opts | PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!opts) break;
            /* no non-empty match here: step one character and search on */
            opts = 0;
            if (pos >= n) break;
            pos += CM_MIN(cm_tok_utf8_len(s[pos]), n - pos);
            continue;
        }
        if (rc < 0) return CM_EINVAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a > gap && !cm_tok_spans_push(out, sp.off + gap, a - gap)) return CM_ENOMEM;
        if (b > a) {
            if (!cm_tok_spans_push(out, sp.off + a, b - a)) return CM_ENOMEM;
            gap = pos = b;
            opts = 0;
        } else {
            gap = a;
            pos = a;
            opts = PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
        }
    }
    if (gap < n && !cm_tok_spans_push(out, sp.off + gap, n - gap)) return CM_ENOMEM;
    return 0;
}

int cm_tok_pre_split(const cm_tokenizer *t, const char *subject, size_t n, cm_tok_spans *out, cm_tok_spans *tmp,
                     char *err, size_t errlen) {
    out->n = 0;
    if (!n) return 0;
    if (!cm_tok_spans_push(out, 0, n)) return CM_ENOMEM;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return CM_ENOMEM;
    int rc = 0;
    for (int r = 0; r < t->n_re && !rc; r++) {
        tmp->n = 0;
        for (size_t i = 0; i < out->n && !rc; i++) rc = split_one(t->re[r], md, subject, out->v[i], tmp);
        cm_tok_spans sw = *out;
        *out = *tmp;
        *tmp = sw;
    }
    pcre2_match_data_free(md);
    if (rc == CM_EINVAL) return cm_errf(err, errlen, CM_EINVAL, "pre-tokenizer regex failed on the input");
    return rc;
}
