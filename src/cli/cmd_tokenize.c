/*
 * cmd_tokenize.c: `cumulo tokenize MODEL TEXT` and `cumulo detokenize MODEL
 * ID...`: the tokenizer on its own, for people and for scripts (--json).
 * Reads only the vocabulary from MODEL (a vocab-only GGUF works); never
 * touches tensors. Results go to stdout, errors are one line on stderr.
 */
#include "cli.h"

#include "base/base.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* JSON string; bytes that are not valid UTF-8 become U+FFFD (byte tokens). */
static void json_str(cm_buf *b, const char *s, size_t n) {
    cm_buf_puts(b, "\"");
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)s[i];
        if (c == '"' || c == '\\') {
            cm_buf_printf(b, "\\%c", c);
            i++;
            continue;
        }
        if (c < 0x20 || c == 0x7F) {
            cm_buf_printf(b, "\\u%04x", c);
            i++;
            continue;
        }
        if (c < 0x80) {
            cm_buf_append(b, &s[i], 1);
            i++;
            continue;
        }
        size_t l = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        bool ok = l && i + l <= n;
        for (size_t k = 1; ok && k < l; k++) ok = ((uint8_t)s[i + k] & 0xC0) == 0x80;
        if (ok && l > 1) {
            uint8_t d = (uint8_t)s[i + 1];
            ok = !((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) ||
                   (c == 0xF4 && d > 0x8F));
        }
        if (ok) {
            cm_buf_append(b, &s[i], l);
            i += l;
        } else {
            cm_buf_puts(b, "\\ufffd");
            i++;
        }
    }
    cm_buf_puts(b, "\"");
}

static int open_vocab(const char *path, cm_tokenizer **t) {
    char err[512];
    int rc = cm_tokenizer_open(t, path, err, sizeof err);
    if (rc == CM_ENOENT) return cli_fail("cannot open '%s': no such file", path);
    if (rc) return cli_fail("%s", err);
    return 0;
}

static const char k_tokenize_usage[] = "usage: cumulo tokenize MODEL TEXT [--special] [--no-bos] [--json]\n\n"
                                       "Tokenize TEXT with MODEL's vocabulary, as llama.cpp does; prints the ids.\n"
                                       "  --special  recognise special tokens written in TEXT (\"<|im_end|>\")\n"
                                       "  --no-bos   do not add the BOS/EOS tokens the vocabulary asks for\n"
                                       "  --json     print {\"ids\":[...],\"pieces\":[...]} (bytes that are not\n"
                                       "             valid UTF-8 on their own show as U+FFFD in pieces)\n"
                                       "TEXT '-' reads standard input.\n";

int cmd_tokenize(int argc, char **argv) {
    if (cli_help(argc, argv, k_tokenize_usage, 0)) return 0;
    const char *model = NULL, *text = NULL;
    bool special = false, bos = true, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--special")) special = true;
        else if (!strcmp(argv[i], "--no-bos")) bos = false;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1] == '-')
            return cli_fail("tokenize: unknown option '%s'; see --help", argv[i]);
        else if (!model) model = argv[i];
        else if (!text) text = argv[i];
        else return cli_fail("tokenize: unexpected argument '%s'; quote TEXT as one argument", argv[i]);
    }
    if (!model || !text) return cli_fail("tokenize: need MODEL and TEXT; see 'cumulo tokenize --help'");
    cm_buf in;
    cm_buf_init(&in);
    if (!strcmp(text, "-")) {
        char chunk[65536];
        size_t k;
        while ((k = fread(chunk, 1, sizeof chunk, stdin)) > 0) cm_buf_append(&in, chunk, k);
    } else {
        cm_buf_puts(&in, text);
    }
    cm_tokenizer *t;
    if (!(model = cli_model_path(model))) return 1;
    if (open_vocab(model, &t)) {
        cm_buf_release(&in);
        return 1;
    }
    cm_token *ids = NULL;
    size_t n = 0;
    char err[512];
    unsigned flags = (bos ? CM_TOK_ADD_SPECIAL : 0) | (special ? CM_TOK_PARSE_SPECIAL : 0);
    int rc = cm_tokenizer_encode_alloc(t, in.data ? in.data : "", in.len, flags, &ids, &n, err, sizeof err);
    cm_buf_release(&in);
    if (rc) {
        cm_tokenizer_free(t);
        return cli_fail("tokenize: %s", err);
    }
    cm_buf out;
    cm_buf_init(&out);
    if (json) {
        cm_buf_puts(&out, "{\"ids\":[");
        for (size_t i = 0; i < n; i++) cm_buf_printf(&out, "%s%d", i ? "," : "", ids[i]);
        cm_buf_puts(&out, "],\"pieces\":[");
        for (size_t i = 0; i < n; i++) {
            size_t len;
            const char *p = cm_tokenizer_piece(t, ids[i], true, &len);
            if (i) cm_buf_puts(&out, ",");
            json_str(&out, p, len);
        }
        cm_buf_puts(&out, "]}\n");
    } else {
        for (size_t i = 0; i < n; i++) cm_buf_printf(&out, "%s%d", i ? " " : "", ids[i]);
        cm_buf_puts(&out, "\n");
    }
    fwrite(out.data, 1, out.len, stdout);
    cm_buf_release(&out);
    cm_free(ids);
    cm_tokenizer_free(t);
    return 0;
}

static const char k_detokenize_usage[] = "usage: cumulo detokenize MODEL ID... [--special]\n\n"
                                         "Turn token ids back into text with MODEL's vocabulary (llama_detokenize).\n"
                                         "  --special  render control tokens (\"<s>\", \"<|im_end|>\") as text\n";

int cmd_detokenize(int argc, char **argv) {
    if (cli_help(argc, argv, k_detokenize_usage, 0)) return 0;
    const char *model = NULL;
    bool special = false;
    cm_token *ids = cm_malloc((size_t)argc * sizeof *ids);
    size_t n = 0;
    if (!ids) return cli_fail("out of memory");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--special")) {
            special = true;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1] == '-') {
            cm_free(ids);
            return cli_fail("detokenize: unknown option '%s'; see --help", argv[i]);
        }
        if (!model) {
            model = argv[i];
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(argv[i], &end, 10);
        if (errno || end == argv[i] || *end || v < 0 || v > INT32_MAX) {
            cm_free(ids);
            return cli_fail("detokenize: '%s' is not a token id", argv[i]);
        }
        ids[n++] = (cm_token)v;
    }
    if (!model) {
        cm_free(ids);
        return cli_fail("detokenize: need MODEL and token ids; see 'cumulo detokenize --help'");
    }
    cm_tokenizer *t;
    if (!(model = cli_model_path(model))) return 1;
    if (open_vocab(model, &t)) {
        cm_free(ids);
        return 1;
    }
    cm_buf out;
    cm_buf_init(&out);
    char err[512];
    int rc = cm_tokenizer_decode(t, ids, n, special ? CM_TOK_UNPARSE_SPECIAL : 0, &out, err, sizeof err);
    if (!rc) {
        fwrite(out.data ? out.data : "", 1, out.len, stdout);
        fputc('\n', stdout);
    }
    cm_buf_release(&out);
    cm_free(ids);
    cm_tokenizer_free(t);
    return rc ? cli_fail("detokenize: %s", err) : 0;
}
