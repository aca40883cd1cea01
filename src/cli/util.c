/*
 * util.c: small helpers shared by the subcommands: one-line errors, number
 * parsing with ranges, progress bars. Never prints to stdout (stdout is for
 * results, so --json output stays clean).
 */
#include "cli.h"

#include "base/base.h"
#include "os/os.h"
#include "sampler/sampler.h"

#include <errno.h>
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

bool cli_int(const char *opt, const char *val, long lo, long hi, long *out) {
    if (!val) { cli_fail("option '%s' needs a value", opt); return false; }
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
    if (!val) { cli_fail("option '%s' needs a value", opt); return false; }
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

void cli_progress_start(cli_progress *p, const char *label, double total) {
    const char *e = getenv("CUMULO_PROGRESS");
    p->label = label;
    p->total = total > 0 ? total : 1;
    p->last_draw = 0;
    p->on = e ? atoi(e) != 0 : isatty(2);
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
    fprintf(stderr, "\r%s [%s] %3d%%", p->label, bar, (int)(f * 100));
    fflush(stderr);
}

void cli_progress_end(cli_progress *p) {
    if (!p->on) return;
    cli_progress_update(p, p->total);
    fputc('\n', stderr);
}

int cmd_version(int argc, char **argv) {
    (void)argc; (void)argv;
    printf("cumulo %s (%s %s)\n", CM_VERSION, cm_os_name(), cm_arch_name());
    return 0;
}
