/*
 * cmd_plan.c: `cumulo plan` — show how a model would be split across a
 * cluster and what speed the cost model predicts, for the best plan and for
 * the pipeline-only / tensor-only / hybrid alternatives. With --simulate it
 * plans for an imaginary cluster described in a JSON file.
 */
#include "cli.h"
#include "tensor/tensor.h"

#include "base/base.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "os/os.h"
#include "sched/plan.h"
#include "sched/simulate.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: cumulo plan MODEL.gguf --nodes auto|HOST:PORT,... [--key-file F] [--insecure]\n"
            "       cumulo plan [MODEL.gguf] --simulate CLUSTER.json [options]\n"
            "       cumulo plan --preset NAME [--type TYPE] --simulate CLUSTER.json [options]\n\n"
            "Split a model across a cluster and predict its speed (tokens/s, time to first token)\n"
            "for the chosen plan and the alternatives: pipeline only, tensor only, hybrid.\n\n"
            "options:\n"
            "  --nodes LIST        plan for live nodes: connect (mDNS with 'auto'), measure them and\n"
            "                      their links, assign the stages and print the plan the cluster runs\n"
            "  --simulate FILE     imaginary cluster: nodes (memory, bandwidth, compute) and links\n"
            "                      (rtt, Gbit/s); see examples/clusters/*.json\n"
            "  --preset NAME       a model shape without a file (%s)\n"
            "  --type TYPE         its quantization (q4_0, q4_k_m, q8_0, f16, ...; default q4_k_m)\n"
            "  --ctx N             KV cache length per sequence (default: the cluster file's, else 2048)\n"
            "  --seq N             concurrent sequences (default 1)\n"
            "  --parallel MODE     auto (default), pp, tp, hybrid or ep (experts across a group)\n"
            "  -ctk T, -ctv T      KV cache types counted by the planner (f32 default, f16, q8_0, q4_0;\n"
            "                      --kv-type T: both)\n"
            "  --json              machine-readable output\n"
            "\n"
            "Cluster key (with --nodes):\n",
            cm_sim_preset_names());
    cli_cluster_usage(f, CLI_CLUSTER_LINK);
}

static cJSON *plan_json(const cm_plan *p, const cm_plan_cluster *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", cm_parallel_name(p->mode));
    cJSON_AddNumberToObject(o, "tok_s", p->tok_s);
    cJSON_AddNumberToObject(o, "tok_s_aggregate", p->tok_s_aggregate);
    cJSON_AddNumberToObject(o, "ttft_s", p->ttft_s);
    cJSON_AddNumberToObject(o, "bytes_per_token_hop", (double)p->bytes_per_token_hop);
    cJSON_AddNumberToObject(o, "bytes_per_token_tp", (double)p->bytes_per_token_tp);
    cJSON *stages = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < p->n_stages; s++) {
        const cm_plan_stage *st = &p->stages[s];
        cJSON *js = cJSON_CreateObject();
        cJSON_AddNumberToObject(js, "first_layer", st->first_layer);
        cJSON_AddNumberToObject(js, "last_layer", st->last_layer);
        cJSON_AddNumberToObject(js, "compute_s", st->compute_s);
        cJSON_AddNumberToObject(js, "hop_s", st->hop_s);
        cJSON *mem = cJSON_AddArrayToObject(js, "members");
        for (int i = 0; i < st->n_members; i++) {
            const cm_plan_member *mb = &st->members[i];
            cJSON *jm = cJSON_CreateObject();
            cJSON_AddStringToObject(jm, "node", c->nodes[mb->node].name);
            cJSON_AddNumberToObject(jm, "kv_head_begin", mb->kv_head_begin);
            cJSON_AddNumberToObject(jm, "kv_head_end", mb->kv_head_end);
            cJSON_AddNumberToObject(jm, "ffn_begin", mb->ffn_begin);
            cJSON_AddNumberToObject(jm, "ffn_end", mb->ffn_end);
            cJSON_AddNumberToObject(jm, "weight_bytes", (double)mb->weight_bytes);
            cJSON_AddNumberToObject(jm, "kv_bytes", (double)mb->kv_bytes);
            cJSON_AddBoolToObject(jm, "embed", mb->embed);
            cJSON_AddBoolToObject(jm, "head", mb->head);
            cJSON_AddItemToArray(mem, jm);
        }
        cJSON_AddItemToArray(stages, js);
    }
    cJSON_AddStringToObject(o, "why", p->why);
    return o;
}

int cmd_plan(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *model_path = NULL, *sim = NULL, *preset = NULL, *type = NULL, *par = NULL;
    /* --nodes: live nodes, as serve's (its help line is plan's own); --parallel is the simulation's */
    cli_cluster clo = {.accept = CLI_CLUSTER_KEY | CLI_CLUSTER_NODES};
    long ctx = 0, seq = 0;
    cli_kv kvo = {0};
    int kr;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--simulate")) {
            sim = v;
            i++;
        } else if ((kr = cli_cluster_opt(argc, argv, &i, &clo)) != 0) {
            if (kr < 0) return 1;
        } else if (!strcmp(a, "--preset")) {
            preset = v;
            i++;
        } else if (!strcmp(a, "--type")) {
            type = v;
            i++;
        } else if (!strcmp(a, "--parallel")) {
            par = v;
            i++;
        } else if (!strcmp(a, "--ctx")) {
            if (!cli_int(a, v, 16, 1 << 22, &ctx)) return 1;
            i++;
        } else if (!strcmp(a, "--seq")) {
            if (!cli_int(a, v, 1, 4096, &seq)) return 1;
            i++;
        } else if (!strcmp(a, "--json")) json = true;
        else if ((kr = cli_kv_opt(argc, argv, &i, &kvo)) != 0) {
            if (kr < 0) return 1;
        } else if (a[0] == '-') return cli_fail("unknown option '%s'; see 'cumulo plan --help'", a);
        else if (!model_path) model_path = a;
        else return cli_fail("unexpected argument '%s'; see 'cumulo plan --help'", a);
        if (i >= argc) return cli_fail("option '%s' needs a value", a);
    }
    char err[512];
    if (model_path && !(model_path = cli_model_path(model_path))) return 1;
    if (clo.nodes) {
        if (!model_path) return cli_fail("plan --nodes needs MODEL.gguf");
        /* Live cluster: the same path 'serve' takes (handshake, measurement,
         * plan, assignment), then the plan it settled on. */
        cm_engine_opts eo = {.mmap = true};
        cli_cluster_apply(&clo, &eo);
        eo.n_seq = seq ? (int)seq : 1; /* the KV the plan shows is for --seq sequences (issue 19: not 8 by default) */
        eo.n_ctx = (int)ctx;
        cm_engine *e = NULL;
        if (cm_engine_load(&e, model_path, &eo, err, sizeof err) != 0) return cli_fail("%s", err);
        const char *text = cm_engine_plan(e);
        printf("%s", text ? text : "this machine alone: no node took part\n");
        cm_engine_free(e);
        return 0;
    }
    if (!sim)
        return cli_fail("plan needs --simulate CLUSTER.json or --nodes auto|HOST:PORT,...; see examples/clusters/");
    char *text = NULL;
    size_t len = 0;
    if (cm_file_read_all(sim, &text, &len, err, sizeof err) != 0) return cli_fail("%s", err);
    cm_plan_cluster cl;
    cm_plan_opts o;
    cm_plan_opts_default(&o);
    char fpreset[64], ftype[32];
    int rc = cm_sim_parse_cluster(text, len, &cl, &o, fpreset, sizeof fpreset, ftype, sizeof ftype, err, sizeof err);
    free(text);
    if (rc) return cli_fail("'%s': %s", sim, err);
    if (ctx) o.ctx = (int)ctx;
    if (seq) o.n_seq = (int)seq;
    if (kvo.set) { /* bytes of 32 elements of each type (a block) */
        o.kv_k32_bytes = (int)cm_row_size((enum cm_type)kvo.k, 32);
        o.kv_v32_bytes = (int)cm_row_size((enum cm_type)kvo.v, 32);
    }
    if (par) {
        int p = cm_parallel_from_name(par);
        if (p < 0) return cli_fail("--parallel must be auto, pp, tp, hybrid or ep, not '%s'", par);
        o.mode = (enum cm_parallel)p;
    }
    cm_plan_model m;
    char model_name[300];
    if (model_path) {
        cm_gguf g;
        if (cm_gguf_open(&g, model_path, NULL, NULL, err, sizeof err) != 0) return cli_fail("%s", err);
        rc = cm_plan_model_from_gguf(&g, &m, err, sizeof err);
        cm_gguf_close(&g);
        if (rc) return cli_fail("'%s': %s", model_path, err);
        snprintf(model_name, sizeof model_name, "%s", model_path);
    } else {
        const char *pn = preset ? preset : fpreset[0] ? fpreset : NULL;
        const char *tn = type ? type : ftype[0] ? ftype : "q4_k_m";
        if (!pn) return cli_fail("no model: give MODEL.gguf, --preset NAME, or a \"model\" in the cluster file");
        if (cm_sim_model_preset(pn, tn, &m, err, sizeof err) != 0) return cli_fail("%s", err);
        snprintf(model_name, sizeof model_name, "%s %s (preset)", pn, tn);
    }
    if (kvo.set && (m.head_dim % 32) &&
        (cm_type_traits_of((uint32_t)kvo.k)->block_size > 1 || cm_type_traits_of((uint32_t)kvo.v)->block_size > 1))
        return cli_fail("kv cache types %s/%s are not usable with head size %d (f32, f16, q8_0, q4_0; quantized "
                        "types need a multiple of 32)",
                        cm_type_name((enum cm_type)kvo.k), cm_type_name((enum cm_type)kvo.v), m.head_dim);
    cm_plan best;
    if (cm_plan_make(&m, &cl, &o, &best, err, sizeof err) != 0) return cli_fail("%s", err);
    /* the alternatives, for comparison */
    /* a model with experts: expert groups instead of tensor-parallel FFN rows */
    const enum cm_parallel alts[] = {CM_PARALLEL_PP, m.n_experts > 0 ? CM_PARALLEL_EP : CM_PARALLEL_TP,
                                     CM_PARALLEL_HYBRID};
    cm_plan alt[3];
    int alt_rc[3];
    char alt_err[3][512];
    for (int k = 0; k < 3; k++) {
        cm_plan_opts oa = o;
        oa.mode = alts[k];
        alt_rc[k] = cl.n_nodes < 2 ? CM_EINVAL : cm_plan_make(&m, &cl, &oa, &alt[k], alt_err[k], sizeof alt_err[k]);
        if (cl.n_nodes < 2) snprintf(alt_err[k], sizeof alt_err[k], "needs 2 nodes or more");
    }
    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "model", model_name);
        cJSON_AddItemToObject(root, "plan", plan_json(&best, &cl));
        cJSON *ja = cJSON_AddObjectToObject(root, "alternatives");
        for (int k = 0; k < 3; k++) {
            if (alt_rc[k] == 0) cJSON_AddItemToObject(ja, cm_parallel_name(alts[k]), plan_json(&alt[k], &cl));
            else cJSON_AddStringToObject(ja, cm_parallel_name(alts[k]), alt_err[k]);
        }
        cli_json_print(root, false);
        return 0;
    }
    char buf[8192];
    cm_plan_format(&best, &m, &cl, buf, sizeof buf);
    printf("model: %s (%d layers, dim %d, %d/%d heads)\ncluster: %s, %d nodes; ctx %d x %d sequences\n", model_name,
           m.n_layers, m.dim, m.n_heads, m.n_kv_heads, sim, cl.n_nodes, o.ctx, o.n_seq);
    {
        const int k32 = o.kv_k32_bytes > 0 ? o.kv_k32_bytes : 32 * o.kv_elem_bytes;
        const int v32 = o.kv_v32_bytes > 0 ? o.kv_v32_bytes : 32 * o.kv_elem_bytes;
        const double per_tok = (double)m.n_layers * m.n_kv_heads * ((double)m.head_dim * (k32 + v32) / 32.0);
        printf("kv cache: %s, %.1f KiB per token of context (all layers)\n", kvo.set ? cli_kv_name(&kvo) : "f32",
               per_tok / 1024.0);
    }
    if (m.n_experts > 0) { /* active vs total: what a token reads */
        double tot = 0, act = 0;
        for (int l = 0; l < m.n_layers; l++) {
            tot += (double)m.layer_params[l];
            act += (double)m.layer_params[l] -
                   (double)m.layer_expert_params[l] * (1.0 - (double)m.n_experts_used / m.n_experts);
        }
        tot += (double)m.head_params * 2; /* embedding + head (same shape) */
        act += (double)m.head_params * 2;
        printf("mixture of experts: %d experts, %d used per token; %.1fB parameters, %.1fB active per token\n",
               m.n_experts, m.n_experts_used, tot / 1e9, act / 1e9);
    }
    printf("\n%s\n", buf);
    printf("alternatives (predicted):\n");
    for (int k = 0; k < 3; k++) {
        if (alt_rc[k] == 0)
            printf("  %-7s %7.2f tok/s one stream, %7.2f tok/s aggregate, first token %.3f s, %d stage%s\n",
                   cm_parallel_name(alts[k]), alt[k].tok_s, alt[k].tok_s_aggregate, alt[k].ttft_s, alt[k].n_stages,
                   alt[k].n_stages == 1 ? "" : "s");
        else printf("  %-7s not possible: %s\n", cm_parallel_name(alts[k]), alt_err[k]);
    }
    return 0;
}
