/*
 * serve_finetune.c: `cumulo serve --finetune-dir DIR`: the fine-tuning
 * jobs of the API (http/api_finetune.c) run here, one at a time, on a
 * thread of their own: the served model's file is opened again (the pages
 * are shared with the engine's), the JSONL file DIR/NAME parsed as
 * `cumulo finetune` parses it, and cm_finetune_run writes the adapter to
 * DIR/ID[-SUFFIX].gguf (and its .svg), reporting every step to the server
 * (the job's status and the dashboard's loss curve). Only plain file names
 * of DIR are accepted (no path, no dot files), so a client never names any
 * other file. The run is not cancelled at shutdown (training has no cancel
 * point): the server is detached first, the process ends with the thread.
 */
#include "cli.h"

#include "gguf/gguf.h"
#include "http/http.h"
#include "model/model.h"
#include "os/os.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/finetune.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct cli_serve_ft {
    char dir[2048], model[2048];
    int n_threads;
    pthread_mutex_t mu; /* srv */
    cm_http_server *srv;
    pthread_t th;
    bool started;
    cm_http_ft_request req;
    char data[2400], out[2400];
};

cli_serve_ft *cli_serve_ft_new(const char *dir, const char *model_path, int n_threads) {
    cli_serve_ft *f = cm_calloc(1, sizeof *f);
    if (!f) return NULL;
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    snprintf(f->model, sizeof f->model, "%s", model_path);
    f->n_threads = n_threads > 0 ? n_threads : 1;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

void cli_serve_ft_attach(cli_serve_ft *f, cm_http_server *srv) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->srv = srv;
    pthread_mutex_unlock(&f->mu);
}

/* A plain file name: letters, digits, '.', '_', '-', not starting with '.'. */
static bool plain_name(const char *s) {
    if (!*s || *s == '.') return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '_' || *s == '-'))
            return false;
    return true;
}

static void on_progress(void *user, const cm_finetune_status *st) {
    cli_serve_ft *f = user;
    pthread_mutex_lock(&f->mu);
    if (f->srv)
        cm_http_ft_progress(f->srv, f->req.id, (long long)st->step, (long long)st->steps, st->loss, st->val_loss,
                            st->tok_per_s, (long long)st->n_train_tok);
    pthread_mutex_unlock(&f->mu);
}

static void *run(void *arg) {
    cli_serve_ft *f = arg;
    const cm_http_ft_request *r = &f->req;
    char err[1024] = "";
    cm_gguf g;
    cm_model m;
    cm_tokenizer *tok;
    cm_tdata d;
    int rc = cli_finetune_inputs(f->model, f->data, r->training_file, NULL, &g, &m, &tok, &d, err, sizeof err);
    if (!rc) {
        cm_finetune_opts o;
        cm_finetune_opts_default(&o);
        o.n_threads = f->n_threads;
        if (r->rank) o.rank = r->rank, o.alpha = 2.0f * (float)r->rank;
        if (r->n_ctx) o.n_ctx = r->n_ctx;
        if (o.n_ctx > m.hp.n_ctx_train && m.hp.n_ctx_train > 0) o.n_ctx = m.hp.n_ctx_train;
        if (r->batch_size) o.batch = r->batch_size;
        if (r->n_epochs) o.epochs = r->n_epochs;
        if (r->steps) o.steps = r->steps;
        if (r->lr_multiplier > 0) o.lr *= (float)r->lr_multiplier;
        o.out = f->out;
        o.progress = on_progress;
        o.progress_user = f;
        rc = cm_finetune_run(&m, &d, &o, err, sizeof err);
        cm_tdata_release(&d);
        cm_tokenizer_free(tok);
        cm_model_release(&m);
        cm_gguf_close(&g);
    }
    pthread_mutex_lock(&f->mu);
    if (f->srv) cm_http_ft_end(f->srv, r->id, rc, f->out, err);
    pthread_mutex_unlock(&f->mu);
    fprintf(stderr, "serve: fine-tuning job %s %s%s\n", r->id, rc ? "failed: " : "wrote ", rc ? err : f->out);
    return NULL;
}

int cli_serve_ft_start(void *user, const cm_http_ft_request *r, char *err, size_t errlen) {
    cli_serve_ft *f = user;
    if (!plain_name(r->training_file))
        return cm_errf(err, errlen, CM_EINVAL,
                       "'training_file' must be a plain file name in the server's fine-tuning directory "
                       "(letters, digits, '.', '_', '-'), not '%.100s'",
                       r->training_file);
    if (r->suffix[0] && !plain_name(r->suffix))
        return cm_errf(err, errlen, CM_EINVAL, "'suffix' may hold letters, digits, '.', '_' and '-' only");
    char data[sizeof f->data];
    snprintf(data, sizeof data, "%s/%s", f->dir, r->training_file);
    if (access(data, R_OK))
        return cm_errf(err, errlen, CM_ENOENT, "training file '%.100s' is not in the server's fine-tuning directory",
                       r->training_file);
    if (f->started) pthread_join(f->th, NULL); /* the last job reported its end (the API saw it not running) */
    f->started = false;
    f->req = *r;
    snprintf(f->data, sizeof f->data, "%s", data);
    snprintf(f->out, sizeof f->out, "%s/%s%s%s.gguf", f->dir, r->id, r->suffix[0] ? "-" : "", r->suffix);
    if (pthread_create(&f->th, NULL, run, f)) return cm_errf(err, errlen, CM_ENOMEM, "cannot start a thread");
    f->started = true;
    fprintf(stderr, "serve: fine-tuning job %s on %s -> %s\n", r->id, data, f->out);
    return 0;
}
