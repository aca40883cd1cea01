/*
 * finetune_dash.c: `cumulo finetune --dashboard PORT` (cmd_finetune.c):
 * feeds the training dashboard (http.h's cm_train_dash, a page with the
 * loss curve, tokens/s and the machines) from the run's progress callback
 * and the pipes' plans. Never blocks training: every call only copies into
 * the dashboard under its lock.
 */
#include "cli.h"

#include "base/base.h"
#include "cluster/cluster.h"
#include "http/http.h"
#include "train/finetune.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int cli_finetune_dash_start(struct cm_train_dash **out, const char *host, int port, const char *title) {
    char err[300];
    int rc = cm_train_dash_start(out, host, port, title, err, sizeof err);
    if (rc) return cli_fail("finetune: dashboard: %s", err);
    fprintf(stderr, "finetune: dashboard on http://%s:%d/\n", host, cm_train_dash_port(*out));
    cm_train_dash_status(*out, "loading");
    return 0;
}

void cli_finetune_dash_progress(struct cm_train_dash *d, const void *status) {
    if (!d) return;
    const cm_finetune_status *st = status;
    /* the status carries the latest eval at every step: a point gets it only
     * at the step it was computed (one run per process) */
    static double last_val = NAN;
    double val = NAN;
    if (isfinite(st->val_loss) && !(st->val_loss == last_val)) val = last_val = st->val_loss;
    const cm_train_dash_point p = {.step = st->step,
                                   .steps = st->steps,
                                   .epoch = st->epoch,
                                   .loss = st->loss,
                                   .val_loss = val,
                                   .lr = st->lr,
                                   .tok_per_s = st->tok_per_s,
                                   .eta_s = st->eta_s};
    cm_train_dash_point_add(d, &p);
    char s[200];
    snprintf(s, sizeof s, "%s: step %lld of %lld", st->step == st->steps ? "done training" : "training",
             (long long)st->step, (long long)st->steps);
    cm_train_dash_status(d, s);
}

void cli_finetune_dash_local(struct cm_train_dash *d, int n_layer) {
    if (!d) return;
    cm_train_dash_node n = {.first_layer = 0, .last_layer = n_layer, .local = true};
    snprintf(n.name, sizeof n.name, "this machine");
    cm_train_dash_nodes(d, &n, 1);
}

void cli_finetune_dash_pipes(struct cm_train_dash *d, struct cm_pipe *const *p, int np) {
    if (!d) return;
    cm_train_dash_node nodes[64];
    int k = 0;
    for (int r = 0; r < np; r++) {
        cm_cluster_member mem[32];
        const int n = cm_pipe_members(p[r], mem, 32);
        for (int i = 0; i < n && k < 64; i++) {
            if (mem[i].local && r > 0) continue; /* this machine's stage of every replica: one line */
            cm_train_dash_node *o = &nodes[k++];
            *o = (cm_train_dash_node){.first_layer = mem[i].first_layer,
                                      .last_layer = mem[i].last_layer,
                                      .replica = r,
                                      .local = mem[i].local};
            snprintf(o->name, sizeof o->name, "%s", mem[i].local ? "this machine" : mem[i].name);
            snprintf(o->addr, sizeof o->addr, "%s", mem[i].addr);
        }
    }
    cm_train_dash_nodes(d, nodes, k);
}
