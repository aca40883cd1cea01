/*
 * cmd_finetune.c: `cumulo finetune MODEL.gguf --data FILE.jsonl --out
 * ADAPTER.gguf`: LoRA fine-tuning on this machine (src/train/finetune.h)
 * with a progress line (loss, validation loss, tokens/s, time left), the
 * adapter (llama.cpp's LoRA GGUF, for `run --lora` and llama.cpp) and its
 * loss curve ADAPTER.gguf.svg. Errors are one line on stderr, exit 1.
 * With --cluster (the cluster options of `run`), the same run over a
 * pipeline of `cumulo node`s (cluster/train_pipe.h), or --data-parallel N
 * such pipelines (by default as many as the nodes hold the model,
 * finetune_dp.c): the same adapter. A node lost mid-run: re-plan on the
 * survivors and resume from the last checkpoint by itself.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/train_pipe.h"
#include "gguf/gguf.h"
#include "http/http.h"
#include "model/model.h"
#include "os/os.h"
#include "proto/proto.h"
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
    "  --data FILE.jsonl    the training data (required)\n"
    "  -o, --out FILE.gguf  the adapter to write (required)\n"
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
    "  --dashboard PORT     a live page on http://127.0.0.1:PORT/ (0: any free port): the loss curve,\n"
    "                       tokens/s and the machines that train\n"
    "  --dashboard-host H   the address the page listens on (default 127.0.0.1)\n"
    "\nAcross a cluster (pipeline parallel: each node trains its layers' slice of the adapter, and the\n"
    "adapter is the one this machine alone would train, bit for bit; a node lost mid-run: the rest\n"
    "re-plan and the run resumes from its last checkpoint, see --save-every; --parallel pp only):\n"
    "  --data-parallel N      N replicas of the pipeline, each on its own nodes (--nodes lists them\n"
    "                         replica by replica), each taking a share of every step's windows; the\n"
    "                         adapter is still the one this machine alone would train. Default (no\n"
    "                         --layers): as many replicas as the nodes hold the model; 1: one pipeline\n"
    "  --in-flight N          windows down the pipeline at once, a 1F1B schedule (default: the number of\n"
    "                         stages; every stage keeps N windows' activations); the adapter is the same\n";

typedef struct bar {
    bool tty;
    double last;
    double loss0, val0, loss, val; /* first and last (NaN: none yet) */
    char ckpt[4200];               /* the last checkpoint written ("": none yet) */
    struct cm_train_dash *dash;    /* --dashboard, or NULL */
} bar;

static void on_progress(void *user, const cm_finetune_status *st) {
    bar *b = user;
    cli_finetune_dash_progress(b->dash, st);
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
    if (st->saved) snprintf(b->ckpt, sizeof b->ckpt, "%s", st->saved);
}

/* The cluster options (run's but --tp-compress; clusteropt.c) and finetune's own. */
typedef struct clu {
    cli_cluster net; /* net.on: train over the nodes */
    int dp;          /* --data-parallel: replicas (0: one) */
    int inflight;    /* --in-flight: windows down a pipeline at once (0: its stages) */
    int dash_port;   /* --dashboard: the page's port (-1: none) */
    const char *dash_host;
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
            if (*model) return cli_fail("finetune: unexpected argument '%s'; see 'cumulo finetune --help'", a);
            *model = a;
            continue;
        }
        if ((so = cli_cluster_opt(argc, argv, &i, &c->net)) != 0) {
            if (so < 0) return 1;
            continue;
        }
        v = i + 1 < argc ? argv[i + 1] : NULL; /* each option below takes one: a missing one is said once known */
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
        else if (!strcmp(a, "--data-parallel")) {
            if (!cli_int(a, v, 1, CM_PLAN_MAX_NODES, &n)) return 1;
            c->dp = (int)n;
            c->net.on = true;
        } else if (!strcmp(a, "--dashboard")) {
            if (!cli_int(a, v, 0, 65535, &n)) return 1;
            c->dash_port = (int)n;
        } else if (!strcmp(a, "--dashboard-host")) c->dash_host = v;
        else if (!strcmp(a, "--in-flight")) {
            if (!cli_int(a, v, 1, CM_MSG_MAX_TRAIN_INFLIGHT, &n)) return 1;
            c->inflight = (int)n;
            c->net.on = true;
        } else if (!strcmp(a, "--out") || !strcmp(a, "-o")) o->out = v;
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
            if (v && cm_train_targets_parse(v, &o->targets, err, sizeof err)) return cli_fail("finetune: %s", err);
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
        else return cli_fail("finetune: unknown option '%s'; see 'cumulo finetune --help'", a);
        if (!v) return cli_fail("option '%s' needs a value", a);
        i++;
#undef INT_OPT
#undef FLT_OPT
    }
    if (!alpha_set) o->alpha = 2.0f * (float)o->rank;
    if (!*model || !*data || !o->out)
        return cli_fail("finetune: need MODEL, --data FILE.jsonl and --out ADAPTER.gguf; see --help");
    if (cli_cluster_check(&c->net)) return 1;
    return 0;
}

/* The exec over the open pipes p[0..n) (n > 1: replicas, data parallel),
 * the run, its traffic added to *sent and *got. */
static int run_pipes(cm_pipe **p, int n, const cm_model *m, const cm_tdata *d, cm_finetune_opts *o, int inflight,
                     uint64_t *sent, uint64_t *got, char *err, size_t errlen) {
    cm_train_pipe *t[CM_PLAN_MAX_NODES] = {0};
    cm_train_dp *dp = NULL;
    int rc = 0;
    for (int r = 0; !rc && r < n; r++)
        rc = cm_train_pipe_new(&t[r], p[r], m, o->n_ctx, o->n_threads, inflight, err, errlen);
    if (!rc && n > 1) rc = cm_train_dp_new(&dp, t, n, m, o->n_ctx, err, errlen);
    if (!rc) {
        const int local_last = cm_train_pipe_local_last(t[0]);
        if (n > 1)
            fprintf(stderr,
                    "finetune: data parallel: %d replicas, each a pipeline of %d stages; this machine trains "
                    "layers [0, %d) of each\n",
                    n, cm_pipe_n_stages(p[0]), local_last);
        else
            fprintf(stderr,
                    "finetune: pipeline of %d stages; this machine trains layers [0, %d); %d windows in flight\n",
                    cm_pipe_n_stages(p[0]), local_last, inflight ? inflight : cm_pipe_n_stages(p[0]));
        o->exec = n > 1 ? cm_train_dp_exec(dp) : cm_train_pipe_exec(t[0]);
        rc = cm_finetune_run(m, d, o, err, errlen);
        o->exec = NULL;
    }
    cm_train_dp_free(dp);
    for (int r = 0; r < n; r++) {
        uint64_t a = 0, b = 0;
        if (t[r]) cm_train_pipe_stats(t[r], &a, &b);
        *sent += a, *got += b;
        cm_train_pipe_free(t[r]);
    }
    return rc;
}

/* The run over the cluster: one pipeline, or c->dp replicas of one, replica
 * r over the r-th equal share of --nodes (coord_train_dp.c). A node lost
 * mid-run: its pipe re-plans on the survivors (cm_pipe_recover; a replica
 * none of whose nodes can take the rest is left out: the math does not
 * depend on how many replicas there are; none left: this machine alone)
 * and the run resumes from the last checkpoint (or the start), losing at
 * most the steps since: a resumed run continues bit for bit (finetune.h). */
static int train_cluster(const char *path, const cm_gguf *g, const cm_model *m, const cm_tdata *d, cm_finetune_opts *o,
                         const clu *c, const cm_pipe_opts *po0, bool *opened, char *err, size_t errlen) {
    char list[4096];
    const char *nodes[CM_PLAN_MAX_NODES * 2];
    const int n_rep = c->dp > 1 ? c->dp : 1;
    int nn = 0, per = 0;
    if (n_rep > 1) {
        if (!c->net.nodes || !strcmp(c->net.nodes, "auto") || strlen(c->net.nodes) >= sizeof list)
            return cm_errf(err, errlen, CM_EINVAL, "--data-parallel needs --nodes host:port,... (replica by replica)");
        strcpy(list, c->net.nodes);
        for (char *q = list, *comma; q; q = comma ? comma + 1 : NULL) {
            if ((comma = strchr(q, ','))) *comma = 0;
            if (*q && nn < (int)(sizeof nodes / sizeof nodes[0])) nodes[nn++] = q;
        }
        if (nn % n_rep)
            return cm_errf(err, errlen, CM_EINVAL, "%d nodes do not split into %d replicas of the same pipeline", nn,
                           n_rep);
        per = nn / n_rep;
    }
    cm_pipe *p[CM_PLAN_MAX_NODES] = {0};
    int np = 0, rc = 0;
    char e[600];
    for (int r = 0; !rc && r < n_rep; r++) {
        char grp[4096] = "";
        for (int i = 0; i < per; i++)
            snprintf(grp + strlen(grp), sizeof grp - strlen(grp), "%s%s", i ? "," : "", nodes[r * per + i]);
        cm_pipe_opts po = *po0;
        if (n_rep > 1) po.nodes = grp;
        int ll = 0; /* (replicas may split differently: each sends the whole adapter's gradients) */
        rc = cm_pipe_open(&p[np], path, g, m, &po, &ll, e, sizeof e);
        if (rc)
            rc = n_rep > 1 ? cm_errf(err, errlen, rc, "cluster (replica %d): %s", r, e)
                           : cm_errf(err, errlen, rc, "cluster: %s", e);
        else if (p[np]) np++;
        else if (n_rep > 1) rc = cm_errf(err, errlen, CM_EINVAL, "replica %d: the plan keeps every layer here", r);
    }
    if (rc) {
        for (int r = 0; r < np; r++) cm_pipe_close(p[r]);
        return rc;
    }
    *opened = true;
    if (np == 0) { /* the plan keeps every layer here */
        fprintf(stderr, "finetune: the plan keeps every layer on this machine\n");
        return cm_finetune_run(m, d, o, err, errlen);
    }
    const bar *b = o->progress_user;
    cli_finetune_dash_pipes(b ? b->dash : NULL, p, np);
    char resume[4200] = "";
    uint64_t sent = 0, got = 0;
    for (int attempt = 0;; attempt++) {
        rc = run_pipes(p, np, m, d, o, c->inflight, &sent, &got, err, errlen);
        bool failed = false;
        for (int r = 0; r < np; r++) failed |= cm_pipe_failed(p[r]);
        if (!rc || !failed || attempt >= CM_PLAN_MAX_NODES) break;
        if (b && b->ckpt[0]) snprintf(resume, sizeof resume, "%s", b->ckpt);
        if (resume[0]) o->resume = resume;
        fprintf(stderr, "finetune: %s; re-planning on the surviving nodes and resuming from %s\n", err,
                o->resume ? o->resume : "the start");
        int kept = 0;
        for (int r = 0; r < np; r++) {
            if (cm_pipe_failed(p[r]) && cm_pipe_recover(p[r], e, sizeof e)) {
                fprintf(stderr, "finetune: no plan on a replica's survivors (%s): it is left out\n", e);
                cm_pipe_close(p[r]);
                continue;
            }
            p[kept++] = p[r];
        }
        np = kept;
        rc = 0;
        cli_finetune_dash_pipes(b ? b->dash : NULL, p, np);
        if (b && b->dash) cm_train_dash_status(b->dash, "resuming after a lost node");
        if (np == 0) {
            fprintf(stderr, "finetune: this machine trains alone\n");
            return cm_finetune_run(m, d, o, err, errlen);
        }
    }
    fprintf(stderr,
            "finetune: %.1f MiB of activations, gradients and parameters sent to the nodes, %.1f MiB "
            "received\n",
            (double)sent / 1048576.0, (double)got / 1048576.0);
    for (int r = 0; r < np; r++) cm_pipe_close(p[r]);
    return rc;
}

/* The run, on this machine or (c->net.on) over the cluster. */
static int train(const char *path, const cm_gguf *g, const cm_model *m, const cm_tdata *d, cm_finetune_opts *o,
                 const clu *c, char *err, size_t errlen) {
    const cli_cluster *net = &c->net;
    if (!net->on) return cm_finetune_run(m, d, o, err, errlen);
    cm_pipe_opts po = {.nodes = cli_cluster_nodes(net),
                       .insecure = net->insecure,
                       .key_file = net->key_file,
                       .plan = net->plan,
                       .take = net->take,
                       .n_ctx = o->n_ctx,
                       .n_seq_max = 1,
                       .max_batch = 1,
                       .log = cli_log_line};
    bool opened = false;
    const cm_plan_request *q = &net->plan;
    if (!c->dp && !q->n_split && !q->n_groups && (!q->mode_set || q->mode == CM_PARALLEL_PP)) {
        /* the planner's data parallelism; replicas that do not open: one pipeline */
        char list[4096], why[256];
        clu ca = *c;
        ca.dp = cli_finetune_dp(g, net->nodes, net->insecure, net->key_file, net->take, o->n_ctx, list, sizeof list,
                                why, sizeof why);
        if (ca.dp > 1) {
            fprintf(stderr, "finetune: the planner chose data parallelism: %s\n", why);
            ca.net.nodes = list;
            int rc = train_cluster(path, g, m, d, o, &ca, &po, &opened, err, errlen);
            if (opened) return rc;
            fprintf(stderr, "finetune: the replicas did not open (%s); one pipeline over every node\n", err);
        }
    }
    return train_cluster(path, g, m, d, o, c, &po, &opened, err, errlen);
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

int cli_finetune_inputs(const char *model_path, const char *data_path, const char *data_name, const char *tmpl,
                        cm_gguf *g, cm_model *m, cm_tokenizer **tok, cm_tdata *d, char *err, size_t errlen) {
    *tok = NULL;
    *d = (cm_tdata){0};
    int rc = cm_gguf_open(g, model_path, NULL, NULL, err, errlen);
    if (rc) return rc;
    if ((rc = cm_model_load(m, g, err, errlen))) {
        cm_gguf_close(g);
        return rc;
    }
    char *text = NULL;
    size_t len = 0;
    if (!(rc = cm_train_check_model(m, err, errlen)) && !(rc = cm_tokenizer_new(tok, g, err, errlen)) &&
        !(rc = cm_file_read_all(data_path, &text, &len, err, errlen))) {
        cm_chat_template t;
        cm_chat_opts co;
        char bos[64] = "", eos[64] = "";
        const cm_chat_template *tp = chat_of(g, *tok, tmpl, &t, &co, bos, eos, err, errlen, &rc);
        if (!rc) rc = cm_tdata_parse(d, (const uint8_t *)text, len, data_name, *tok, tp, &co, err, errlen);
    }
    cm_free(text);
    if (rc) {
        cm_tdata_release(d);
        cm_tokenizer_free(*tok);
        *tok = NULL;
        cm_model_release(m);
        cm_gguf_close(g);
    }
    return rc;
}

int cmd_finetune(int argc, char **argv) {
    if (cli_help(argc, argv, k_help, CLI_CLUSTER_FINETUNE)) return 0;
    cm_finetune_opts o;
    cm_finetune_opts_default(&o);
    o.n_threads = cm_cpu_count() > 0 ? cm_cpu_count() : 1;
    const char *model = NULL, *data = NULL, *tmpl = NULL;
    clu c = {.net = {.accept = CLI_CLUSTER_FINETUNE}, .dash_port = -1};
    if (parse(argc, argv, &o, &model, &data, &tmpl, &c)) return 1;
    if (!(model = cli_model_path(model))) return 1;
    char err[1024];
    cm_gguf g;
    cm_model m;
    cm_tokenizer *tok;
    cm_tdata d;
    int rc = cli_finetune_inputs(model, data, data, tmpl, &g, &m, &tok, &d, err, sizeof err);
    if (rc) return cli_fail("%s", err);
    if (o.n_ctx > m.hp.n_ctx_train && m.hp.n_ctx_train > 0) o.n_ctx = m.hp.n_ctx_train;
    fprintf(stderr,
            "finetune: %d examples, %lld tokens; rank %d, alpha %g, lr %g, ctx %d, batch %d x %d, %d thread%s\n",
            d.n_ex, (long long)d.n_tok, o.rank, o.alpha, o.lr, o.n_ctx, o.batch, o.grad_accum, o.n_threads,
            o.n_threads > 1 ? "s" : "");
    const int force = cm_config_get()->progress; /* -1 unset, 0 off, 1 on */
    bar b = {.tty = force == 1 || (force != 0 && isatty(2)), .loss0 = NAN, .val0 = NAN, .loss = NAN, .val = NAN};
    o.progress = on_progress;
    o.progress_user = &b;
    if (c.dash_port >= 0) {
        const char *base = strrchr(model, '/');
        char title[300];
        snprintf(title, sizeof title, "%s -> %s", base ? base + 1 : model, o.out);
        if (cli_finetune_dash_start(&b.dash, c.dash_host ? c.dash_host : "127.0.0.1", c.dash_port, title))
            rc = CM_EINVAL, snprintf(err, sizeof err, "the dashboard did not start");
        cli_finetune_dash_local(b.dash, m.hp.n_layer);
    }
    double t0 = cm_now_s();
    if (!rc) rc = train(model, &g, &m, &d, &o, &c, err, sizeof err);
    if (!rc)
        fprintf(stderr, "finetune: loss %.4f -> %.4f, val %.4f -> %.4f; wrote %s and %s.svg (%.1f s)\n", b.loss0,
                b.loss, b.val0, b.val, o.out, o.out, cm_now_s() - t0);
    if (b.dash) {
        char s[600];
        snprintf(s, sizeof s, rc ? "failed: %s" : "done: wrote %s", rc ? err : o.out);
        cm_train_dash_status(b.dash, s);
        const unsigned hold = cm_config_get()->test_dash_hold_ms; /* tests: the final page stays up this long */
        if (hold) cm_sleep_ms(hold > 600000 ? 600000 : hold);
        cm_train_dash_stop(b.dash);
    }
    cm_tdata_release(&d);
    cm_tokenizer_free(tok);
    cm_model_release(&m);
    cm_gguf_close(&g);
    return rc ? cli_fail("%s", err) : 0;
}
