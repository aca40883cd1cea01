/*
 * cmd_finetune.c: `cumulo finetune MODEL.gguf --data FILE.jsonl --out
 * ADAPTER.gguf`: LoRA fine-tuning on this machine (src/train/finetune.h)
 * with a progress line (loss, validation loss, tokens/s, time left), the
 * adapter (llama.cpp's LoRA GGUF, for `run --lora` and llama.cpp) and its
 * loss curve ADAPTER.gguf.svg. Errors are one line on stderr, exit 1.
 * With --cluster (the cluster options of `run`), the same run over a
 * pipeline of `cumulo node`s (cluster/train_pipe.h): the same adapter.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/train_pipe.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "os/os.h"
#include "sched/plan.h"
#include "train/finetune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *k_help =
    "usage: cumulo finetune MODEL.gguf --data FILE.jsonl --out ADAPTER.gguf [options]\n\n"
    "Train a LoRA adapter for MODEL (dense llama, qwen2, qwen3; any weight type) on FILE, one JSON\n"
    "object a line: {\"text\": ...}, {\"prompt\": ..., \"completion\": ...} (loss on the completion) or\n"
    "{\"messages\": [{\"role\", \"content\"}...]} (the model's chat template; loss on assistant turns).\n"
    "Writes ADAPTER.gguf (load it with `cumulo run --lora` or llama.cpp's --lora) and ADAPTER.gguf.svg.\n\n"
    "  --rank N             LoRA rank (default 8)\n"
    "  --alpha X            LoRA alpha; the update is scaled by alpha/rank (default 2 x rank)\n"
    "  --dropout P          LoRA input dropout (default 0)\n"
    "  --lora-targets LIST  attn_q,attn_k,attn_v,attn_o,ffn_gate,ffn_up,ffn_down, attn, ffn or all (default all)\n"
    "  --lr X               peak learning rate (default 1e-3)\n"
    "  --warmup N           linear warm-up steps, then cosine to lr/10 (default 5%% of the steps)\n"
    "  --weight-decay X     AdamW weight decay (default 0.01)\n"
    "  --batch N            windows per micro-batch (default 4)\n"
    "  --grad-accum N       micro-batches per optimizer step (default 1)\n"
    "  --ctx N              tokens per window; examples are packed into windows (default 256)\n"
    "  --epochs N           passes over the data (default 3, and at least 50 steps)\n"
    "  --steps N            optimizer steps (overrides --epochs)\n"
    "  --seed N             data order, split, init and dropout (default 42)\n"
    "  --val-split F        fraction of examples held out for the eval loss (default 0.1)\n"
    "  --eval-every N       steps between eval losses (default a tenth of the run)\n"
    "  --save-every N       checkpoint every N steps: ADAPTER.gguf.ckpt-STEP.gguf and ADAPTER.gguf\n"
    "  --resume CKPT        continue from a checkpoint (same options and data: bit-identical)\n"
    "  --threads N          threads (default: the CPUs); the adapter is the same for any N\n"
    "  --chat-template NAME render \"messages\" with this family instead of the model's template\n"
    "\nAcross a cluster (pipeline parallel: each node trains its layers' slice of the adapter):\n"
    "  --cluster            use `cumulo node`s (with --nodes, default auto); the adapter is the one\n"
    "                       this machine alone would train, bit for bit\n"
    "  --nodes LIST         auto (mDNS) or host:port,host:port,...\n"
    "  --layers 2,1,2       layers per stage (this machine first); --parallel pp only\n"
    "  --take               use nodes that serve another coordinator\n"
    "  --insecure           no cluster key (the nodes must run --insecure too)\n"
    "  --key-file FILE      cluster key (default $CUMULO_KEY_FILE or ~/.config/cumulo/cluster.key)\n";

typedef struct bar {
    bool tty;
    double last;
    double loss0, val0, loss, val; /* first and last (NaN: none yet) */
} bar;

static void on_progress(void *user, const cm_finetune_status *st) {
    bar *b = user;
    const double now = cm_now_s();
    if (isnan(b->loss0)) b->loss0 = st->loss;
    if (isnan(b->val0)) b->val0 = st->val_loss;
    b->loss = st->loss;
    b->val = st->val_loss;
    const bool end = st->step == st->steps, line = st->saved || end || !b->tty;
    if (!line && now - b->last < 0.2) return;
    if (!b->tty && !st->saved && !end && st->step % (st->steps / 20 > 0 ? st->steps / 20 : 1)) return;
    b->last = now;
    const int width = 24, fill = (int)(width * st->step / (st->steps ? st->steps : 1));
    char bars[32];
    for (int i = 0; i < width; i++) bars[i] = i < fill ? '#' : '.';
    bars[width] = 0;
    char val[32] = "";
    if (isfinite(st->val_loss)) snprintf(val, sizeof val, " val %.4f", st->val_loss);
    fprintf(stderr, "%s[%s] step %lld/%lld ep %d loss %.4f%s lr %.2e %.3g tok/s eta %.0fs%s", b->tty ? "\r" : "", bars,
            (long long)st->step, (long long)st->steps, st->epoch + 1, st->loss, val, st->lr, st->tok_per_s, st->eta_s,
            b->tty && !line ? "   " : "\n");
    if (st->saved) fprintf(stderr, "saved %s\n", st->saved);
}

/* --name VALUE options: the next argument or a one-line error. */
static const char *val_of(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_fail("finetune: %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* The cluster options (run's): --cluster, --nodes, --key-file, --insecure, --take, the plan's. */
typedef struct clu {
    bool on, insecure, take;
    const char *nodes, *key_file;
    cm_plan_request plan;
} clu;

static int parse(int argc, char **argv, cm_finetune_opts *o, const char **model, const char **data, const char **tmpl,
                 clu *c) {
    bool alpha_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        double x;
        int so;
        if (a[0] != '-') {
            if (*model) return cli_fail("finetune: unexpected argument '%s'", a);
            *model = a;
            continue;
        }
        if (!strcmp(a, "--cluster") || !strcmp(a, "--insecure") || !strcmp(a, "--take")) {
            *(a[2] == 'c' ? &c->on : a[2] == 'i' ? &c->insecure : &c->take) = true;
            continue;
        }
        if ((so = cli_plan_opt(argc, argv, &i, &c->plan)) != 0) {
            if (so < 0) return 1;
            c->on = true;
            continue;
        }
        if (!(v = val_of(argc, argv, &i))) return 1;
#define INT_OPT(name, lo, hi, field)              \
    else if (!strcmp(a, name)) {                  \
        if (!cli_int(a, v, lo, hi, &n)) return 1; \
        o->field = (int)n;                        \
    }
#define FLT_OPT(name, lo, hi, field)                \
    else if (!strcmp(a, name)) {                    \
        if (!cli_float(a, v, lo, hi, &x)) return 1; \
        o->field = (float)x;                        \
    }
        if (!strcmp(a, "--data")) *data = v;
        else if (!strcmp(a, "--nodes")) c->nodes = v, c->on = true;
        else if (!strcmp(a, "--key-file")) c->key_file = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) o->out = v;
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--chat-template")) *tmpl = v;
        else if (!strcmp(a, "--seed")) {
            if (!cli_int(a, v, 0, 0x7fffffffL, &n)) return 1;
            o->seed = (uint64_t)n;
        } else if (!strcmp(a, "--alpha")) {
            if (!cli_float(a, v, 1e-6, 1e5, &x)) return 1;
            o->alpha = (float)x;
            alpha_set = true;
        } else if (!strcmp(a, "--lora-targets")) {
            char err[256];
            if (cm_train_targets_parse(v, &o->targets, err, sizeof err)) return cli_fail("finetune: %s", err);
        }
        INT_OPT("--rank", 1, CM_LORA_MAX_RANK, rank)
        INT_OPT("--warmup", 0, 100000000, warmup)
        INT_OPT("--batch", 1, 4096, batch)
        INT_OPT("--grad-accum", 1, 4096, grad_accum)
        INT_OPT("--ctx", 2, 65536, n_ctx)
        INT_OPT("--epochs", 1, 1000000, epochs)
        INT_OPT("--steps", 1, 100000000, steps)
        INT_OPT("--eval-every", 1, 100000000, eval_every)
        INT_OPT("--save-every", 1, 100000000, save_every)
        INT_OPT("--threads", 1, 1024, n_threads)
        FLT_OPT("--dropout", 0, 0.95, dropout)
        FLT_OPT("--lr", 1e-9, 10, lr)
        FLT_OPT("--weight-decay", 0, 10, weight_decay)
        FLT_OPT("--val-split", 0, 0.9, val_split)
        else return cli_fail("finetune: unknown option '%s'; see --help", a);
#undef INT_OPT
#undef FLT_OPT
    }
    if (!alpha_set) o->alpha = 2.0f * (float)o->rank;
    if (!*model || !*data || !o->out)
        return cli_fail("finetune: need MODEL, --data FILE.jsonl and --out ADAPTER.gguf; see --help");
    if (cli_plan_check(&c->plan)) return 1;
    return 0;
}

static void log_line(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

/* The run, on this machine or (c->on) over the cluster's pipeline. */
static int train(const char *path, const cm_gguf *g, const cm_model *m, const cm_tdata *d, cm_finetune_opts *o,
                 const clu *c, char *err, size_t errlen) {
    if (!c->on) return cm_finetune_run(m, d, o, err, errlen);
    cm_pipe_opts po = {.nodes = c->nodes ? c->nodes : "auto",
                       .insecure = c->insecure,
                       .key_file = c->key_file,
                       .plan = c->plan,
                       .take = c->take,
                       .n_ctx = o->n_ctx,
                       .n_seq_max = 1,
                       .max_batch = 1,
                       .log = log_line};
    cm_pipe *p = NULL;
    int local_last = 0;
    char e[600];
    int rc = cm_pipe_open(&p, path, g, m, &po, &local_last, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "cluster: %s", e);
    if (!p) { /* the plan keeps every layer here */
        fprintf(stderr, "finetune: the plan keeps every layer on this machine\n");
        return cm_finetune_run(m, d, o, err, errlen);
    }
    cm_train_pipe *t = NULL;
    rc = cm_train_pipe_new(&t, p, m, o->n_ctx, o->n_threads, err, errlen);
    if (!rc) {
        fprintf(stderr, "finetune: pipeline of %d stages; this machine trains layers [0, %d)\n", cm_pipe_n_stages(p),
                local_last);
        o->exec = cm_train_pipe_exec(t);
        rc = cm_finetune_run(m, d, o, err, errlen);
        uint64_t sent, got;
        cm_train_pipe_stats(t, &sent, &got);
        fprintf(stderr, "finetune: %.1f MiB of activations and gradients sent to the nodes, %.1f MiB received\n",
                (double)sent / 1048576.0, (double)got / 1048576.0);
    }
    cm_train_pipe_free(t);
    cm_pipe_close(p);
    return rc;
}

/* The chat template for "messages" lines: --chat-template, else the model's (NULL when it has none). */
static const cm_chat_template *chat_of(const cm_gguf *g, const cm_tokenizer *tok, const char *name, cm_chat_template *t,
                                       cm_chat_opts *co, char *bos, char *eos, char *err, size_t errlen, int *rc) {
    const cm_gguf_kv *kv = cm_gguf_find_kv(g, "tokenizer.chat_template");
    *rc = 0;
    if (name) *rc = cm_chat_template_by_name(t, name, err, errlen);
    else if (!kv || kv->type != CM_GGUF_STRING ||
             cm_chat_template_detect(t, kv->v.str.ptr, (size_t)kv->v.str.len, err, errlen))
        return NULL;
    if (*rc) return NULL;
    size_t len;
    const char *p;
    if ((p = cm_tokenizer_text(tok, cm_tokenizer_bos(tok), &len)) && len < 64) memcpy(bos, p, len), bos[len] = 0;
    if ((p = cm_tokenizer_text(tok, cm_tokenizer_eos(tok), &len)) && len < 64) memcpy(eos, p, len), eos[len] = 0;
    *co = (cm_chat_opts){.tokenizer_adds_bos = cm_tokenizer_add_bos(tok), .bos = bos, .eos = eos};
    return t;
}

int cmd_finetune(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(k_help, stdout);
        return 0;
    }
    cm_finetune_opts o;
    cm_finetune_opts_default(&o);
    o.n_threads = cm_cpu_count() > 0 ? cm_cpu_count() : 1;
    const char *model = NULL, *data = NULL, *tmpl = NULL;
    clu c = {0};
    if (parse(argc, argv, &o, &model, &data, &tmpl, &c)) return 1;
    if (!(model = cli_model_path(model))) return 1;
    char err[1024];
    cm_gguf g;
    cm_model m;
    cm_tokenizer *tok = NULL;
    cm_tdata d = {0};
    int rc = cm_gguf_open(&g, model, NULL, NULL, err, sizeof err);
    if (rc) return cli_fail("%s", err);
    if ((rc = cm_model_load(&m, &g, err, sizeof err))) {
        cm_gguf_close(&g);
        return cli_fail("%s", err);
    }
    char *text = NULL;
    size_t len = 0;
    if (!(rc = cm_train_check_model(&m, err, sizeof err)) && !(rc = cm_tokenizer_new(&tok, &g, err, sizeof err)) &&
        !(rc = cm_file_read_all(data, &text, &len, err, sizeof err))) {
        cm_chat_template t;
        cm_chat_opts co;
        char bos[64] = "", eos[64] = "";
        const cm_chat_template *tp = chat_of(&g, tok, tmpl, &t, &co, bos, eos, err, sizeof err, &rc);
        if (!rc) rc = cm_tdata_parse(&d, (const uint8_t *)text, len, data, tok, tp, &co, err, sizeof err);
    }
    cm_free(text);
    if (!rc && o.n_ctx > m.hp.n_ctx_train && m.hp.n_ctx_train > 0) o.n_ctx = m.hp.n_ctx_train;
    if (!rc) {
        fprintf(stderr,
                "finetune: %d examples, %lld tokens; rank %d, alpha %g, lr %g, ctx %d, batch %d x %d, %d thread%s\n",
                d.n_ex, (long long)d.n_tok, o.rank, o.alpha, o.lr, o.n_ctx, o.batch, o.grad_accum, o.n_threads,
                o.n_threads > 1 ? "s" : "");
        const int force = cm_config_get()->progress; /* -1 unset, 0 off, 1 on */
        bar b = {.tty = force == 1 || (force != 0 && isatty(2)), .loss0 = NAN, .val0 = NAN, .loss = NAN, .val = NAN};
        o.progress = on_progress;
        o.progress_user = &b;
        double t0 = cm_now_s();
        rc = train(model, &g, &m, &d, &o, &c, err, sizeof err);
        if (!rc)
            fprintf(stderr, "finetune: loss %.4f -> %.4f, val %.4f -> %.4f; wrote %s and %s.svg (%.1f s)\n", b.loss0,
                    b.loss, b.val0, b.val, o.out, o.out, cm_now_s() - t0);
    }
    cm_tdata_release(&d);
    cm_tokenizer_free(tok);
    cm_model_release(&m);
    cm_gguf_close(&g);
    return rc ? cli_fail("%s", err) : 0;
}
