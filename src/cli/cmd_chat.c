/*
 * cmd_chat.c: `cumulo chat MODEL`: a conversation in the terminal. Each turn
 * renders the whole history through the model's chat template (or the family
 * named by --chat-template), tokenizes it and hands it to
 * cm_session_set_prompt, which keeps the common prefix already in the KV
 * cache, so a turn evaluates only what is new. The reply streams piece by
 * piece to stdout; banners, notices and --verbose statistics go to stderr, so
 * stdout carries replies only (scriptable: with stdin not a terminal, every
 * line is one user message and every reply ends with a newline).
 *
 * Ctrl-C stops the current reply (the SIGINT handler only calls
 * cm_session_cancel, which is async-signal-safe, and sets a flag); at the
 * prompt it discards the line. Ctrl-D (EOF) quits with status 0.
 * Talks to the inference side only through engine.h. When the model's
 * template is missing or unrecognised it renders ChatML, as `serve` does, and
 * says so on stderr: never silently.
 *
 * NEEDSWORK: a reply ends at an end-of-generation token of the vocabulary;
 * a forced template whose end marker is not one (chatml on a Llama 2 model)
 * runs to -n or the context. Stop strings per family would need the family
 * from engine.h. Input is the terminal's line mode (no arrow-key history).
 */
#include "cli.h"

#include "base/base.h"
#include "engine/engine.h"
#include "os/os.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_chat_usage[] =
    "usage: cumulo chat MODEL.gguf [options]\n"
    "\n"
    "Chat with a model in the terminal. The conversation is rendered with the model's\n"
    "chat template (tokenizer.chat_template) and each turn reuses the KV cache of the\n"
    "previous ones. Ctrl-C stops a reply, Ctrl-D quits; type /help for commands.\n"
    "When stdin is not a terminal, every line is one user message and every reply\n"
    "is printed on stdout followed by a newline.\n"
    "\n"
    "  --system TEXT          system message at the start of the conversation\n"
    "  --chat-template NAME   use this template family instead of the model's\n"
    "                         (chatml works with any model, for testing)\n"
    "  -n, --n-predict N      most tokens per reply (default -1: until end of turn or full context)\n"
    "  --temp T               temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K              top-k (default 40; 0 = off)\n"
    "  --top-p P              top-p (default 0.95; 1 = off)\n"
    "  --min-p P              min-p (default 0.05; 0 = off)\n"
    "  --repeat-penalty R     repetition penalty (default 1.0 = off)\n"
    "  --seed S               RNG seed (default: random); reply k (from 0) samples with S+k\n"
    "  --ctx N                context size (default: the model's, at most 4096)\n"
    "  --threads N            compute threads (default: all CPUs)\n"
    "  --cache-type-k, -ctk T, --cache-type-v, -ctv T\n"
    "                         KV cache types: f32 (default), f16, q8_0, q4_0 (llama.cpp's -ctk/-ctv);\n"
    "                         --kv-type T sets both; per token: see 'cumulo info'\n"
    "  --flash-attn, -fa [on|off]  K/V rows, tiled attention (default; off: f32/f16 V transposed)\n" CLI_GPU_HELP
    "  --mmap                 keep the weights in a file mapping (default: read into huge-page\n"
    "                         memory when they fit, fewer TLB misses per token; also CUMULO_MMAP=1)\n" CLI_LORA_HELP
    "  --ignore-eos           keep generating past end-of-turn tokens\n"
    "  -v, --verbose          after each reply, print token counts, prefix reuse and speed to stderr\n"
    "  --cluster              use `cumulo node`s (with --nodes, default auto), as `cumulo run`\n"
    "  --nodes LIST           auto (mDNS) or host:port,host:port,...\n"
    "  --insecure             no cluster key (the nodes must run --insecure too)\n"
    "  --key-file FILE        cluster key (default $CUMULO_KEY_FILE or ~/.config/cumulo/cluster.key)\n"
    "A full context: before a turn the oldest exchanges after the system message are dropped\n"
    "until the conversation leaves room for a reply (said on stderr); the same on a cluster.\n";

static const char k_chat_help[] = "commands:\n"
                                  "  /reset   forget the conversation (the --system message stays)\n"
                                  "  /help    this text\n"
                                  "  /quit    leave (or Ctrl-D)\n"
                                  "Ctrl-C stops a reply; a line ending in '\\' continues on the next line;\n"
                                  "start a message with '//' to send a line that begins with '/'.\n";

static cm_session *volatile g_session; /* what SIGINT cancels */
static volatile sig_atomic_t g_sigint;

static void on_sigint(int sig) {
    (void)sig;
    g_sigint = 1;
    cm_session *s = g_session;
    if (s) cm_session_cancel(s);
}

/* No SA_RESTART: a Ctrl-C at the prompt interrupts the blocking read. */
static void set_sigint(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

typedef struct chat {
    cm_engine *e;
    cm_session *s;
    const char *template_name; /* NULL: the model's */
    cm_chat_msg *msgs;         /* role: a static string; content: owned (cm_malloc) */
    size_t n_msgs, cap_msgs;
    size_t n_fixed; /* leading messages /reset keeps (the system message) */
    cm_buf text;    /* rendered prompt */
    int32_t *ids;
    int cap_ids;
    cm_buf reply;
    bool interactive, verbose;
    bool failed;   /* a turn failed: the exit status is 1 (for scripts) */
    bool at_start; /* no visible reply text shown yet (leading whitespace is not shown) */
    char *line;    /* getline's buffer (malloc'd by libc) */
    size_t line_cap;
    /* gpt-oss (the prompt ends "<|start|>assistant"): the reply shown and
     * kept is its final channel (cm_harmony); hbuf is the filter's output */
    bool harmony;
    cm_harmony hf;
    cm_buf hbuf;
} chat;

static int chat_push(chat *c, const char *role, const char *content, size_t len) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        cm_chat_msg *m = cm_realloc(c->msgs, cap * sizeof *m);
        if (!m) return CM_ENOMEM;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *copy = cm_malloc(len + 1);
    if (!copy) return CM_ENOMEM;
    memcpy(copy, content, len);
    copy[len] = 0;
    c->msgs[c->n_msgs++] = (cm_chat_msg){.role = role, .content = copy};
    return 0;
}

/* Drop messages [from, from + k). */
static void chat_drop(chat *c, size_t from, size_t k) {
    if (k == 0) return;
    for (size_t i = from; i < from + k; i++) cm_free((void *)c->msgs[i].content);
    memmove(c->msgs + from, c->msgs + from + k, (c->n_msgs - from - k) * sizeof *c->msgs);
    c->n_msgs -= k;
}

/* Render the conversation (with the assistant's opening) and tokenize it
 * into c->ids; returns the token count or a negative code (message in err). */
static int chat_tokens(chat *c, char *err, size_t errlen) {
    cm_buf_clear(&c->text);
    int rc = cm_engine_chat_render(c->e, c->template_name, c->msgs, c->n_msgs, true, &c->text, err, errlen);
    if (rc) return rc;
    if (c->text.oom) return cm_errf(err, errlen, CM_ENOMEM, "out of memory rendering the conversation");
    for (;;) {
        int n = cm_engine_tokenize(c->e, c->text.data ? c->text.data : "", c->text.len, true, true, c->ids, c->cap_ids,
                                   err, errlen);
        if (n <= c->cap_ids) return n; /* also errors (< 0) */
        int32_t *p = cm_realloc(c->ids, (size_t)n * sizeof *p);
        if (!p) return cm_errf(err, errlen, CM_ENOMEM, "out of memory for %d prompt tokens", n);
        c->ids = p;
        c->cap_ids = n;
    }
}

/* Show (and keep) reply text. */
static void show_piece(chat *c, const char *text, size_t len) {
    cm_buf_append(&c->reply, text, len);
    /* Show the reply without the whitespace models put first (" Hello");
     * the history keeps the exact text, so the next turn's prompt repeats
     * what the cache holds. */
    if (c->at_start)
        while (len && (*text == ' ' || *text == '\n' || *text == '\r' || *text == '\t')) text++, len--;
    if (len) {
        c->at_start = false;
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
}

static int on_piece(void *user, const cm_token_event *ev) {
    chat *c = user;
    if (c->harmony) {
        cm_buf_clear(&c->hbuf);
        cm_harmony_feed(&c->hf, ev->text, ev->len, &c->hbuf);
        show_piece(c, c->hbuf.data ? c->hbuf.data : "", c->hbuf.len);
    } else {
        show_piece(c, ev->text, ev->len);
    }
    /* A Ctrl-C between set_prompt and generate is forgotten by the session
     * (generate clears its cancel flag); the flag here still stops the reply. */
    return g_sigint != 0;
}

/* A turn that cannot go on: one line on stderr, the user's message leaves
 * the history, the chat continues (and exits 1 at the end). */
static int turn_fail(chat *c, const char *msg) {
    fprintf(stderr, "cumulo: %s\n", msg);
    chat_drop(c, c->n_msgs - 1, 1);
    c->failed = true;
    return 0;
}

/* One user turn: add the message, fit the conversation into the context
 * (dropping the oldest exchanges if needed), evaluate what is new, stream
 * the reply and keep it in the history. Returns non-zero only when the
 * program cannot go on (out of memory). */
static int chat_turn(chat *c, const char *msg, size_t len, const cm_gen_params *gp_in, int turn) {
    char err[512];
    if (chat_push(c, "user", msg, len)) return cli_fail("out of memory");
    int n_ctx = cm_session_n_ctx(c->s);
    int room = n_ctx / 8 > 256 ? 256 : n_ctx / 8; /* keep some context for the reply */
    int n, dropped = 0;
    for (;;) {
        n = chat_tokens(c, err, sizeof err);
        if (n < 0) return turn_fail(c, err);
        if (n <= n_ctx - room) break;
        /* Oldest exchange after the fixed messages: user + assistant. */
        if (c->n_msgs - c->n_fixed < 3) {
            char adv[160];
            cli_ctx_advice(c->e, n_ctx, adv, sizeof adv);
            snprintf(err, sizeof err,
                     "this message makes a prompt of %d tokens, more than the context of %d allows (%s)", n, n_ctx,
                     adv);
            return turn_fail(c, err);
        }
        chat_drop(c, c->n_fixed, 2);
        dropped++;
    }
    if (dropped)
        fprintf(stderr, "(dropped the oldest %d exchange%s to fit the context of %d tokens)\n", dropped,
                dropped > 1 ? "s" : "", n_ctx);
    cm_gen_params gp = *gp_in;
    if (gp.sampling.seed != CM_SAMPLER_SEED_RANDOM) gp.sampling.seed += (uint64_t)turn;
    int left = n_ctx - n;
    if (gp.n_predict <= 0 || gp.n_predict > left) gp.n_predict = left;
    g_sigint = 0;
    g_session = c->s;
    int rc = cm_session_set_prompt(c->s, c->ids, n, err, sizeof err);
    cm_timings tp = cm_session_timings(c->s);
    if (rc == CM_ECANCELED || (rc == 0 && g_sigint)) {
        g_session = NULL;
        fprintf(stderr, "(interrupted)\n");
        chat_drop(c, c->n_msgs - 1, 1);
        return 0;
    }
    if (rc) {
        g_session = NULL;
        return turn_fail(c, err);
    }
    cm_buf_clear(&c->reply);
    c->at_start = true;
    static const char harmony_open[] = "<|start|>assistant";
    const size_t hl = sizeof harmony_open - 1;
    c->harmony = c->text.len >= hl && !memcmp(c->text.data + c->text.len - hl, harmony_open, hl);
    if (c->harmony) cm_harmony_init(&c->hf);
    cm_gen_result res;
    rc = cm_session_generate(c->s, &gp, on_piece, c, &res, err, sizeof err);
    g_session = NULL;
    if (c->harmony) {
        cm_buf_clear(&c->hbuf);
        cm_harmony_flush(&c->hf, &c->hbuf);
        show_piece(c, c->hbuf.data ? c->hbuf.data : "", c->hbuf.len);
    }
    if (rc) {
        fputc('\n', stdout);
        fflush(stdout);
        return turn_fail(c, err);
    }
    fputc('\n', stdout);
    fflush(stdout);
    /* A stopped reply stays in the history: the user saw it. */
    if (c->reply.oom || chat_push(c, "assistant", c->reply.data ? c->reply.data : "", c->reply.len))
        return cli_fail("out of memory");
    if (res.finish == CM_FINISH_CANCEL) fprintf(stderr, "(stopped)\n");
    if (res.finish == CM_FINISH_CTX)
        fprintf(stderr, "(the context of %d tokens is full; older exchanges will be dropped, or /reset)\n", n_ctx);
    if (c->verbose) {
        cm_timings t = res.t;
        fprintf(stderr,
                "chat: turn %d: prompt %d tokens, %d reused from the cache, %d evaluated in %.3f s; "
                "reply %d tokens in %.3f s (%.1f tok/s), finish %s\n",
                turn + 1, n, n - tp.n_prompt, tp.n_prompt, tp.prompt_s, t.n_gen, t.gen_s,
                t.gen_s > 0 ? t.n_gen / t.gen_s : 0.0, cm_finish_name(res.finish));
    }
    return 0;
}

/* Read one message (lines ending in '\' continue) into line. Returns 1 with
 * a message, 0 at EOF, -1 when Ctrl-C interrupted the read. */
static int read_message(chat *c, cm_buf *line) {
    cm_buf_clear(line);
    for (;;) {
        if (c->interactive) {
            fputs(line->len ? ". " : "> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        g_sigint = 0;
        ssize_t n = getline(&c->line, &c->line_cap, stdin);
        char *buf = c->line;
        if (n < 0) {
            if (g_sigint || errno == EINTR) {
                clearerr(stdin);
                if (c->interactive) fputs("\n(Ctrl-D quits)\n", stderr);
                return -1;
            }
            return line->len ? 1 : 0; /* EOF after a continued line: send it */
        }
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
        if (n > 0 && buf[n - 1] == '\\') {
            cm_buf_append(line, buf, (size_t)n - 1);
            cm_buf_append(line, "\n", 1);
            continue;
        }
        cm_buf_append(line, buf, (size_t)n);
        return 1;
    }
}

int cmd_chat(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(k_chat_usage, stdout);
        return 0;
    }
    const char *model = NULL, *system = NULL, *tmpl = NULL;
    long n_predict = -1, ctx = 0, threads = 0;
    cli_kv kvo = {0};
    cli_gpu gpuo = {0};
    bool verbose = false, kv_f16 = false, use_mmap = false, cluster = false, insecure = false;
    const char *nodes = NULL, *key_file = NULL;
    cli_loras loras = {0};
    cm_gen_params gp;
    cm_gen_params_default(&gp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEXT() (i++, v)
        int so = cli_gen_opt(argc, argv, &i, &gp.sampling, &loras, &kvo, &gpuo);
        if (so < 0) return 1;
        if (so > 0) continue;
        if (!strcmp(a, "--system")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            system = NEXT();
        } else if (!strcmp(a, "--chat-template")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            tmpl = NEXT();
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!cli_int(a, NEXT(), -1, 1 << 24, &n_predict)) return 1;
        } else if (!strcmp(a, "--ctx")) {
            if (!cli_int(a, NEXT(), 1, 1 << 20, &ctx)) return 1;
        } else if (!strcmp(a, "--threads")) {
            if (!cli_int(a, NEXT(), 1, 1024, &threads)) return 1;
        } else if (!strcmp(a, "--mmap")) {
            use_mmap = true;
        } else if (!strcmp(a, "--cluster")) {
            cluster = true;
        } else if (!strcmp(a, "--insecure")) {
            insecure = true;
        } else if (!strcmp(a, "--nodes") || !strcmp(a, "--key-file")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            if (a[2] == 'n') nodes = NEXT();
            else key_file = NEXT();
        } else if (!strcmp(a, "--ignore-eos")) {
            gp.ignore_eos = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else if (a[0] == '-' && a[1]) {
            return cli_fail("unknown option '%s'; see 'cumulo chat --help'", a);
        } else if (!model) {
            model = a;
        } else {
            return cli_fail("unexpected argument '%s'; see 'cumulo chat --help'", a);
        }
#undef NEXT
    }
    if (!model) return cli_fail("chat needs a MODEL.gguf; see 'cumulo chat --help'");
    char err[512];
    if (tmpl) { /* a bad name fails before the model loads */
        cm_chat_template t;
        if (cm_chat_template_by_name(&t, tmpl, err, sizeof err)) return cli_fail("%s", err);
    }
    gp.n_predict = (int)n_predict;
    if (cm_sampler_params_check(&gp.sampling, err, sizeof err)) return cli_fail("%s", err);

    chat c = {.template_name = tmpl, .interactive = isatty(0), .verbose = verbose};
    cm_buf_init(&c.text);
    cm_buf_init(&c.reply);
    cm_buf_init(&c.hbuf);
    cm_buf line;
    cm_buf_init(&line);
    int status = 1;
    cm_engine_opts eo = {.n_threads = (int)threads,
                         .n_ctx = (int)ctx,
                         .nodes = cluster || nodes ? (nodes ? nodes : "auto") : NULL,
                         .insecure = insecure,
                         .key_file = key_file,
                         .kv_f16 = kv_f16,
                         .mmap = use_mmap,
                         .loras = loras.spec,
                         .n_loras = loras.n};
    cli_kv_apply(&kvo, &eo);
    cli_gpu_apply(&gpuo, &eo);
    if (cli_load_engine_opts(&c.e, model, &eo)) goto done;
    if (system && chat_push(&c, "system", system, strlen(system))) {
        cli_fail("out of memory");
        goto done;
    }
    c.n_fixed = c.n_msgs;
    c.template_name = cli_chat_template(c.e, tmpl, model);
    /* Render the empty conversation once: a model without a usable template
     * fails here, with the names --chat-template takes, before any prompt. */
    if (chat_tokens(&c, err, sizeof err) < 0) {
        const char *base = strrchr(model, '/');
        cli_fail("cannot chat with '%s': %s", base ? base + 1 : model, err);
        goto done;
    }
    c.s = cm_session_new(c.e, (int)ctx, err, sizeof err);
    if (!c.s) {
        cli_fail("%s", err);
        goto done;
    }
    if (c.interactive) {
        cm_engine_info info;
        cm_engine_get_info(c.e, &info);
        fprintf(stderr, "chatting with %s (context %d, template %s); /help for commands, Ctrl-D to quit\n", info.name,
                cm_session_n_ctx(c.s), c.template_name ? c.template_name : "from the model");
    }
    set_sigint(on_sigint);
    int turn = 0;
    for (;;) {
        int r = read_message(&c, &line);
        if (r < 0) continue;
        if (r == 0) break;
        const char *m = line.data ? line.data : "";
        size_t len = line.len;
        if (len == 0) continue;
        if (m[0] == '/' && m[1] != '/') {
            if (!strcmp(m, "/reset")) {
                chat_drop(&c, c.n_fixed, c.n_msgs - c.n_fixed);
                fputs("(conversation cleared)\n", stderr);
            } else if (!strcmp(m, "/help")) {
                fputs(k_chat_help, stderr);
            } else if (!strcmp(m, "/quit") || !strcmp(m, "/exit")) {
                break;
            } else {
                fprintf(stderr, "unknown command '%s'; /help lists them\n", m);
            }
            continue;
        }
        if (m[0] == '/') m++, len--; /* "//text" sends "/text" */
        if (chat_turn(&c, m, len, &gp, turn)) goto done;
        turn++;
    }
    if (c.interactive) fputc('\n', stdout);
    status = c.failed ? 1 : 0;
done:
    set_sigint(SIG_DFL);
    g_session = NULL;
    chat_drop(&c, 0, c.n_msgs);
    cm_free(c.msgs);
    cm_free(c.ids);
    free(c.line);
    cm_buf_release(&c.text);
    cm_buf_release(&c.reply);
    cm_buf_release(&c.hbuf);
    cm_buf_release(&line);
    cm_session_free(c.s);
    cm_engine_free(c.e);
    return status;
}
