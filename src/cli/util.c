/*
 * util.c: small helpers shared by the subcommands: one-line errors, number
 * parsing with ranges, progress bars. Never prints to stdout (stdout is for
 * results, so --json output stays clean).
 */
#include "cli.h"

#include "base/base.h"
#include "engine/engine.h"
#include "os/os.h"
#include "sampler/sampler.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cumulo: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

bool cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    return false;
}

void cli_log_line(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

void cli_json_print(cJSON *j, bool pretty) {
    char *s = !j ? NULL : pretty ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    if (s) puts(s);
    cJSON_free(s);
    cJSON_Delete(j);
}

bool cli_help(int argc, char **argv, const char *usage, unsigned cluster) {
    if (!cli_wants_help(argc, argv)) return false;
    fputs(usage, stdout);
    cli_cluster_usage(stdout, cluster);
    return true;
}

bool cli_int(const char *opt, const char *val, long lo, long hi, long *out) {
    if (!val) {
        cli_fail("option '%s' needs a value", opt);
        return false;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi) {
        cli_fail("option '%s': '%s' is not an integer in [%ld, %ld]", opt, val, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *val, double lo, double hi, double *out) {
    if (!val) {
        cli_fail("option '%s' needs a value", opt);
        return false;
    }
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= lo && v <= hi)) {
        cli_fail("option '%s': '%s' is not a number in [%g, %g]", opt, val, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

int cli_sampling_opt(int argc, char **argv, int *i, cm_sampler_params *s) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    double d;
    long l;
    bool ok;
    if (!strcmp(a, "--temp")) {
        if ((ok = cli_float(a, v, 0, 100, &d))) s->temperature = (float)d;
    } else if (!strcmp(a, "--top-k")) {
        if ((ok = cli_int(a, v, 0, 1 << 24, &l))) s->top_k = (int32_t)l;
    } else if (!strcmp(a, "--top-p")) {
        if ((ok = cli_float(a, v, 0, 1, &d))) s->top_p = (float)d;
    } else if (!strcmp(a, "--min-p")) {
        if ((ok = cli_float(a, v, 0, 1, &d))) s->min_p = (float)d;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if ((ok = cli_float(a, v, 0, 100, &d))) s->repeat_penalty = (float)d;
    } else if (!strcmp(a, "--seed")) {
        if ((ok = cli_int(a, v, 0, 0x7fffffffL, &l))) s->seed = (uint64_t)l;
    } else {
        return 0;
    }
    if (!ok) return -1;
    (*i)++;
    return 1;
}

int cli_gen_opt(int argc, char **argv, int *i, cm_sampler_params *s, cli_engine *g) {
    int r = cli_sampling_opt(argc, argv, i, s);
    return r ? r : cli_engine_opt(argc, argv, i, g);
}

int cli_engine_opt(int argc, char **argv, int *i, cli_engine *g) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long l;
    int r = cli_lora_opt(argc, argv, i, &g->loras);
    if (!r) r = cli_kv_opt(argc, argv, i, &g->kv);
    if (!r) r = cli_gpu_opt(argc, argv, i, &g->gpu);
    if (!r) r = cli_cluster_opt(argc, argv, i, &g->net);
    if (r) return r;
    if (!strcmp(a, "--mmap")) {
        g->mmap = true;
        return 1;
    }
    if (!strcmp(a, "--ctx")) {
        if (!cli_int(a, v, 1, 1 << 20, &l)) return -1;
        g->n_ctx = (int)l;
    } else if (!strcmp(a, "--threads")) {
        if (!cli_int(a, v, 1, 1024, &l)) return -1;
        g->n_threads = (int)l;
    } else {
        return 0;
    }
    (*i)++;
    return 1;
}

void cli_engine_apply(const cli_engine *g, cm_engine_opts *eo) {
    eo->n_threads = g->n_threads;
    eo->n_ctx = g->n_ctx;
    eo->mmap = g->mmap;
    eo->loras = g->loras.spec;
    eo->n_loras = g->loras.n;
    cli_kv_apply(&g->kv, eo);
    cli_gpu_apply(&g->gpu, eo);
    cli_cluster_apply(&g->net, eo);
}

void cli_progress_start(cli_progress *p, const char *label, double total) {
    int on = cm_config_get()->progress;
    p->label = label;
    p->total = total > 0 ? total : 1;
    p->last_draw = 0;
    p->t0 = cm_now_s();
    p->base = -1;
    p->bytes = false;
    p->on = on >= 0 ? on != 0 : isatty(2);
}

void cli_progress_update(cli_progress *p, double done) {
    if (!p->on) return;
    double now = cm_now_s();
    if (now - p->last_draw < 0.1 && done < p->total) return;
    p->last_draw = now;
    double f = done / p->total;
    if (f > 1) f = 1;
    int w = 30, k = (int)(f * w);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < k ? '#' : '.';
    bar[w] = 0;
    if (!p->bytes) {
        fprintf(stderr, "\r%s [%s] %3d%%", p->label, bar, (int)(f * 100));
    } else { /* speed over this run's bytes (a resumed download starts at base) */
        if (p->base < 0) {
            p->base = done;
            p->t0 = now;
        }
        double dt = now - p->t0, rate = dt > 0.2 ? (done - p->base) / dt : 0;
        char left[32] = "--:--";
        if (rate > 0) {
            long s = (long)((p->total - done) / rate);
            snprintf(left, sizeof left, "%ld:%02ld", s / 60, s % 60);
        }
        fprintf(stderr, "\r%s [%s] %3d%% %.1f/%.1f MiB %.1f MiB/s %s left ", p->label, bar, (int)(f * 100),
                done / 1048576.0, p->total / 1048576.0, rate / 1048576.0, left);
    }
    fflush(stderr);
}

void cli_progress_end(cli_progress *p) {
    if (!p->on) return;
    cli_progress_update(p, p->total);
    fputc('\n', stderr);
}

int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("cumulo %s (%s %s)\n", CM_VERSION, cm_os_name(), cm_arch_name());
    return 0;
}

const char *cli_chat_template(cm_engine *e, const char *tmpl, const char *model) {
    if (tmpl) return tmpl;
    cm_buf b;
    cm_buf_init(&b);
    cm_chat_msg probe = {.role = "user", .content = "hi"};
    char msg[512];
    int rc = cm_engine_chat_render(e, NULL, &probe, 1, true, &b, msg, sizeof msg);
    cm_buf_release(&b);
    if (!rc) return NULL;
    const char *base = strrchr(model, '/');
    CM_LOGW("'%s': %s; using chatml", base ? base + 1 : model, msg);
    return "chatml";
}

void cli_check_threads(cm_engine_opts *o) {
    int cores = cm_cpu_count();
    if (cores > 0 && o->n_threads > cores) {
        CM_LOGW("--threads %d is more than the %d cores of this machine; using %d", o->n_threads, cores, cores);
        o->n_threads = cores;
    }
}

void cli_check_ctx(cm_engine *e, int n_ctx) {
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    if (n_ctx > 0 && in.n_ctx_train > 0 && n_ctx > in.n_ctx_train)
        CM_LOGW("--ctx %d is past the %d tokens '%s' was trained for; positions beyond %d give degraded output", n_ctx,
                in.n_ctx_train, in.name, in.n_ctx_train);
}

void cli_ctx_advice(cm_engine *e, int n_ctx, char *out, size_t cap) {
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    if (in.n_ctx_train > n_ctx)
        snprintf(out, cap, "use --ctx up to %d, the model's trained context, or a shorter prompt", in.n_ctx_train);
    else snprintf(out, cap, "the model was trained for %d tokens: shorten the prompt", in.n_ctx_train);
}

int cli_self_path(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1); /* Linux */
    if (n > 0) {
        out[n] = 0;
        return 0;
    }
    const char *argv0 = cli_argv0 ? cli_argv0 : "cumulo";
    if (strchr(argv0, '/')) return cap >= PATH_MAX && realpath(argv0, out) ? 0 : -1;
    const char *path = cm_config_get()->path;
    while (path && *path) { /* elsewhere: found on PATH */
        const char *e = strchr(path, ':');
        size_t l = e ? (size_t)(e - path) : strlen(path);
        char cand[PATH_MAX];
        snprintf(cand, sizeof cand, "%.*s/%s", (int)l, path, argv0);
        if (access(cand, X_OK) == 0) return cap >= PATH_MAX && realpath(cand, out) ? 0 : -1;
        path += l + (e ? 1 : 0);
    }
    return -1;
}
