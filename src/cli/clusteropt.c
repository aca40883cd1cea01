/*
 * clusteropt.c: the cluster options every command that talks to `cumulo
 * node`s shares (run, chat, serve, bench, finetune, node, nodes, plan,
 * launch): the link (--insecure, --key-file), which nodes (--cluster,
 * --nodes), how to use them (--take, --tp-compress) and the plan's shape
 * (--parallel, --layers, --groups, --tp-weights, --expert-load). One table
 * holds each option's name, the commands' accept bit and its --help lines,
 * so a command's help lists exactly what it parses. Only collects values:
 * the engine and the planner validate node addresses and plans.
 */
#include "cli.h"

#include "engine/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct cluster_opt {
    const char *name;
    unsigned bit;     /* CLI_CLUSTER_*: which commands take it */
    const char *need; /* its value, for "needs ..." (NULL: a flag; plan options say it themselves) */
    const char *help; /* its lines in --help */
} k_opts[] = {
    {"--cluster", CLI_CLUSTER_ON, NULL,
     "  --cluster              use `cumulo node`s: those of --nodes, else auto (found over mDNS)\n"},
    {"--nodes", CLI_CLUSTER_NODES, "auto or HOST:PORT,HOST:PORT,...",
     "  --nodes LIST           auto (mDNS) or host:port,host:port,... of `cumulo node`s\n"},
    {"--layers", CLI_CLUSTER_PLAN, "",
     "  --layers A,B,...       layers per stage, this machine first (default: the planner's)\n"},
    {"--parallel", CLI_CLUSTER_SHAPE, "",
     "  --parallel MODE        pp (default): a pipeline; tp: one tensor-parallel group of this\n"
     "                         machine and every node (each computes a slice of every layer);\n"
     "                         hybrid: tensor-parallel groups as pipeline stages; auto: the planner's best;\n"
     "                         ep: a mixture-of-experts model's experts spread over one group\n"},
    {"--groups", CLI_CLUSTER_SHAPE, "",
     "  --groups A,B,...       members per stage, this machine's group first (e.g. 2,2: hybrid)\n"},
    {"--tp-weights", CLI_CLUSTER_PLAN, "",
     "  --tp-weights W,W,...   tp/hybrid: relative speed per machine, this one first (slice sizes)\n"},
    {"--expert-load", CLI_CLUSTER_PLAN, "",
     "  --expert-load N,N,...  ep: routed assignments per expert (run --json's expert_hits); the hot\n"
     "                         experts get replicas on the least busy members of the expert group\n"
     "  --expert-load auto[:N] (the default) serve counts the routing itself and, while idle, re-plans\n"
     "                         the replicas when the counts call for it (looking after every N new\n"
     "                         assignments per expert, default 64); off: never\n"},
    {"--tp-compress", CLI_CLUSTER_COMPRESS, NULL,
     "  --tp-compress          all-reduces travel as 8-bit Q8_0 blocks (off by default; not exact)\n"},
    {"--take", CLI_CLUSTER_TAKE, NULL,
     "  --take                 use nodes that serve another coordinator (it is told and re-plans)\n"},
    {"--insecure", CLI_CLUSTER_KEY, NULL,
     "  --insecure             no cluster key, plaintext (every peer must run --insecure too)\n"},
    {"--key-file", CLI_CLUSTER_KEY, "a FILE holding the cluster key (see 'cumulo key')",
     "  --key-file FILE        cluster key (default $CUMULO_KEY_FILE or ~/.config/cumulo/cluster.key)\n"},
};

/* "2,1,2" of positive counts (each at most hi) into v; the count, or -1
 * (message printed). */
static int counts(const char *opt, const char *val, long hi, int *v) {
    int n = 0;
    for (const char *s = val ? val : ""; *s;) {
        char *e;
        errno = 0;
        long x = strtol(s, &e, 10);
        if (e == s || errno || x < 1 || x > hi || n == CM_PLAN_MAX_NODES || (*e && *e != ',')) {
            n = 0;
            break;
        }
        v[n++] = (int)x;
        s = *e ? e + 1 : e;
    }
    if (!n)
        cli_fail("option '%s' needs up to %d positive counts like 2,1,2, not '%s'", opt, CM_PLAN_MAX_NODES,
                 val ? val : "");
    return n ? n : -1;
}

/* --expert-load off|auto|auto:N|N,N,...: 0 or -1 (message printed). */
static int expert_load(const char *v, cm_plan_request *q) {
    if (!strcmp(v, "off") || !strcmp(v, "auto") || !strncmp(v, "auto:", 5)) {
        long w = !strcmp(v, "off") ? -1 : 0;
        if (!strncmp(v, "auto:", 5)) {
            char *e;
            errno = 0;
            w = strtol(v + 5, &e, 10);
            if (e == v + 5 || *e || errno || w < 1 || w > 1000000) {
                cli_fail("option '--expert-load auto:N' needs N from 1 to 1000000, not '%s'", v + 5);
                return -1;
            }
        }
        q->expert_warmup = (int)w;
        return 0;
    }
    static uint64_t load[1024]; /* outlives the request: the coordinator copies it at open */
    int n = 0;
    for (const char *s = v; *s; n++) {
        char *e;
        errno = 0;
        unsigned long long x = strtoull(s, &e, 10);
        if (n == 1024 || e == s || errno || *s == '-' || (*e && *e != ',')) {
            n = 0;
            break;
        }
        load[n] = x;
        s = *e ? e + 1 : e;
    }
    if (n < 1) {
        cli_fail("option '--expert-load' needs one routing count per expert like 90,3,4,3 (or auto, auto:N, off), "
                 "not '%s'",
                 v);
        return -1;
    }
    q->expert_load = load;
    q->n_expert_load = n;
    return 0;
}

/* The plan's options (name a, value v, maybe NULL): 0 or -1 (message printed). */
static int plan_opt(const char *a, const char *v, cm_plan_request *q) {
    if (!strcmp(a, "--parallel")) {
        int m = v ? cm_parallel_from_name(v) : -1;
        if (m < 0) return cli_fail("option '--parallel' needs pp, tp, hybrid, ep or auto, not '%s'", v ? v : ""), -1;
        q->mode_set = true;
        q->mode = (enum cm_parallel)m;
    } else if (!strcmp(a, "--layers")) {
        if ((q->n_split = counts(a, v, 1 << 20, q->split)) < 0) return -1;
    } else if (!strcmp(a, "--groups")) {
        if ((q->n_groups = counts(a, v, 256, q->groups)) < 0) return -1;
    } else if (!strcmp(a, "--expert-load")) {
        return expert_load(v ? v : "", q);
    } else { /* --tp-weights */
        int n = 0;
        for (const char *s = v ? v : ""; *s && n < CM_PLAN_MAX_NODES; n++) {
            char *e;
            double w = strtod(s, &e);
            if (e == s || !(w > 0) || w > 1e6 || (*e && *e != ',')) {
                n = -1;
                break;
            }
            q->weights[n] = w;
            s = *e ? e + 1 : e;
        }
        if (n < 1) return cli_fail("option '--tp-weights' needs positive numbers like 1,2,1, not '%s'", v ? v : ""), -1;
        q->n_weights = n;
    }
    return 0;
}

int cli_cluster_opt(int argc, char **argv, int *i, cli_cluster *c) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    const struct cluster_opt *o = NULL;
    for (size_t k = 0; k < CM_ARRAY_LEN(k_opts) && !o; k++)
        if ((c->accept & k_opts[k].bit) && !strcmp(a, k_opts[k].name)) o = &k_opts[k];
    if (!o) return 0;
    if (o->bit & (CLI_CLUSTER_SHAPE | CLI_CLUSTER_PLAN)) {
        if (plan_opt(a, v, &c->plan)) return -1;
        if ((c->accept & CLI_CLUSTER_IMPLY) && strcmp(a, "--expert-load")) c->on = true; /* they name nodes */
        (*i)++;
        return 1;
    }
    if (o->need && !v) { /* "" is taken: --nodes "" ran on this machine alone, and scripts pass it */
        cli_fail("option '%s' needs %s", a, o->need);
        return -1;
    }
    if (!strcmp(a, "--cluster")) c->on = true;
    else if (!strcmp(a, "--nodes")) c->nodes = v, c->on = true;
    else if (!strcmp(a, "--key-file")) c->key_file = v;
    else if (!strcmp(a, "--insecure")) c->insecure = true;
    else if (!strcmp(a, "--take")) c->take = true;
    else c->tp_compress = true; /* --tp-compress */
    if (o->need) (*i)++;
    return 1;
}

int cli_cluster_check(const cli_cluster *c) {
    const cm_plan_request *q = &c->plan;
    if (q->mode_set && (q->mode == CM_PARALLEL_TP || q->mode == CM_PARALLEL_EP) && q->n_split)
        return cli_fail("--layers splits a pipeline; it does not go with --parallel %s", cm_parallel_name(q->mode));
    if (q->n_split && q->n_groups && q->n_split != q->n_groups)
        return cli_fail("--layers names %d stages, --groups %d", q->n_split, q->n_groups);
    return 0;
}

const char *cli_cluster_nodes(const cli_cluster *c) { return c->on ? (c->nodes ? c->nodes : "auto") : NULL; }

void cli_cluster_apply(const cli_cluster *c, struct cm_engine_opts *eo) {
    eo->nodes = cli_cluster_nodes(c);
    eo->insecure = c->insecure;
    eo->key_file = c->key_file;
    eo->take = c->take;
    eo->tp_compress = c->tp_compress;
    eo->plan = c->plan;
}

void cli_cluster_usage(FILE *out, unsigned accept) {
    for (size_t k = 0; k < CM_ARRAY_LEN(k_opts); k++)
        if (accept & k_opts[k].bit) fputs(k_opts[k].help, out);
}
