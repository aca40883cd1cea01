/*
 * cli.h: the subcommands of the cumulo binary and helpers they share
 * (option parsing, one-line errors, progress bars). Every command accepts
 * --help and returns the process exit status.
 */
#ifndef CM_CLI_H
#define CM_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "sched/plan.h"

typedef struct cm_command {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv); /* argv[0] is the command name */
} cm_command;

/* Print "cumulo: <msg>" to stderr and return 1 (use as `return cli_fail(...)`). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A log callback (cm_engine_opts.log, cm_pipe_opts.log): the line on stderr. */
void cli_log_line(void *ctx, const char *line);
/* A --json answer: j on stdout (indented when pretty) and a newline, then
 * j deleted. j NULL (out of memory while building it) prints nothing. */
struct cJSON;
void cli_json_print(struct cJSON *j, bool pretty);
/* True if any argument is -h or --help. */
bool cli_wants_help(int argc, char **argv);
/* When any argument is -h or --help: usage, then the --help lines of the
 * cluster options `cluster` takes (CLI_CLUSTER_* bits, 0: none), on stdout,
 * and true (the command returns 0); else false. */
bool cli_help(int argc, char **argv, const char *usage, unsigned cluster);
/* Parse numbers from option values; on error print a one-line message and return false. */
bool cli_int(const char *opt, const char *val, long lo, long hi, long *out);
bool cli_float(const char *opt, const char *val, double lo, double hi, double *out);
/* The sampling options run and chat share (--temp, --top-k, --top-p, --min-p,
 * --repeat-penalty, --seed): if argv[*i] is one of them, parse its value into
 * s, advance *i past the value and return 1; return 0 if argv[*i] is not one
 * of them, -1 (message printed) if its value is bad. */
struct cm_sampler_params;
int cli_sampling_opt(int argc, char **argv, int *i, struct cm_sampler_params *s);

/* KV cache options (kvopt.c): --cache-type-k/-ctk, --cache-type-v/-ctv,
 * --kv-type (both), --flash-attn/-fa [on|off|auto]; parsed like
 * cli_sampling_opt. cli_kv_apply copies them into engine options (when
 * given: they replace kv_f16). k, v: enum cm_type values, F32 (0) by
 * default. flash: -fa on/auto given; no_flash: -fa off (the transposed
 * F32/F16 layout, engine.h kv_transposed). */
typedef struct cli_kv {
    int k, v;
    bool flash, no_flash, set;
} cli_kv;
struct cm_engine_opts;
int cli_kv_opt(int argc, char **argv, int *i, cli_kv *kv);
void cli_kv_apply(const cli_kv *kv, struct cm_engine_opts *eo);
const char *cli_kv_name(const cli_kv *kv); /* "q8_0" or "K q8_0, V f16" (static buffer) */

/* GPU options (gpuopt.c): --gpu auto|vulkan|none|N, --gpu-layers/-ngl K;
 * parsed like cli_sampling_opt. cli_gpu_apply: into engine options (no
 * --gpu-layers: all layers; -ngl 0: none; no --gpu: $CUMULO_GPU, else none
 * unless K > 0, then auto). */
typedef struct cli_gpu {
    const char *dev;
    int layers;
    bool layers_set;
} cli_gpu;
int cli_gpu_opt(int argc, char **argv, int *i, cli_gpu *g);
void cli_gpu_apply(const cli_gpu *g, struct cm_engine_opts *eo);
/* The same choice for options other than the engine's (a node's): dev
 * ("none" for -ngl 0; NULL: not given) and layers (0: all that fit). */
void cli_gpu_pick(const cli_gpu *g, const char **dev, int *layers);
/* The Vulkan devices (cumulo info): into j as "gpus" (j != NULL) or as lines
 * on stdout, with how many of n_layer layers of layer_bytes fit (n_layer 0:
 * no model). */
struct cJSON;
void cli_gpu_list(struct cJSON *j, int n_layer, uint64_t layer_bytes);
#define CLI_GPU_HELP                                                                                        \
    "  --gpu auto|vulkan|none|N  compute on a Vulkan GPU (auto: the first GPU; vulkan: any device, a CPU\n" \
    "                         driver such as lavapipe too; N: device N of 'cumulo info'); default none\n"   \
    "  --gpu-layers, -ngl K   the first K layers on the GPU, the rest on the CPU (default: all)\n"

struct cm_engine;
struct cm_engine_opts;
/* Before a load: --threads above this machine's cores becomes the core count,
 * with a warning (more threads than cores only wait on each other). */
void cli_check_threads(struct cm_engine_opts *o);
/* After a load: a warning when n_ctx (0: the default) is past the context
 * the model was trained for. */
void cli_check_ctx(struct cm_engine *e, int n_ctx);
/* What to tell a user whose prompt does not fit n_ctx: "--ctx up to N" only
 * while N (the trained context) is larger, else to shorten the prompt. */
void cli_ctx_advice(struct cm_engine *e, int n_ctx, char *out, size_t cap);
/* The chat template family to render with: tmpl when given; else NULL (the
 * model's own) when the model's template renders, else "chatml" with a
 * one-line warning, the same fallback `serve` makes (and llama.cpp). */
const char *cli_chat_template(struct cm_engine *e, const char *tmpl, const char *model);

/* The cluster options (clusteropt.c), one parser and one --help text for
 * every command that talks to `cumulo node`s. accept (CLI_CLUSTER_* bits,
 * set by the command before parsing) says which options it takes:
 *   KEY       --insecure, --key-file FILE (every command that opens a link)
 *   NODES     --nodes auto|HOST:PORT,... (implies --cluster)
 *   ON        --cluster (the nodes of --nodes, else auto: mDNS)
 *   TAKE      --take;  COMPRESS: --tp-compress
 *   SHAPE     --parallel MODE, --groups A,B,...
 *   PLAN      --layers A,B,..., --tp-weights W,..., --expert-load ...
 *   IMPLY     --parallel, --layers, --groups, --tp-weights imply --cluster
 * cli_cluster_opt: parsed like cli_sampling_opt (1 consumed with its value,
 * 0 not one this command takes, -1 bad value, message printed).
 * cli_cluster_check: after parsing, the checks between options (0, or 1
 * with the message printed). cli_cluster_nodes: what the engine connects
 * to (NULL: this machine alone). cli_cluster_apply: every field into engine
 * options. cli_cluster_usage: the --help lines of the accepted options. */
enum {
    CLI_CLUSTER_KEY = 1u << 0,
    CLI_CLUSTER_NODES = 1u << 1,
    CLI_CLUSTER_ON = 1u << 2,
    CLI_CLUSTER_TAKE = 1u << 3,
    CLI_CLUSTER_COMPRESS = 1u << 4,
    CLI_CLUSTER_SHAPE = 1u << 5,
    CLI_CLUSTER_PLAN = 1u << 6,
    CLI_CLUSTER_IMPLY = 1u << 7,
    /* what each command takes */
    CLI_CLUSTER_LINK = CLI_CLUSTER_KEY, /* node, nodes, plan, launch (their --nodes is their own) */
    CLI_CLUSTER_CHAT = CLI_CLUSTER_KEY | CLI_CLUSTER_NODES | CLI_CLUSTER_ON,
    CLI_CLUSTER_BENCH = CLI_CLUSTER_CHAT | CLI_CLUSTER_COMPRESS | CLI_CLUSTER_SHAPE,
    CLI_CLUSTER_SERVE = CLI_CLUSTER_KEY | CLI_CLUSTER_NODES | CLI_CLUSTER_TAKE | CLI_CLUSTER_COMPRESS |
                        CLI_CLUSTER_SHAPE | CLI_CLUSTER_PLAN,
    CLI_CLUSTER_RUN = CLI_CLUSTER_SERVE | CLI_CLUSTER_ON | CLI_CLUSTER_IMPLY,
    CLI_CLUSTER_FINETUNE = CLI_CLUSTER_RUN & ~CLI_CLUSTER_COMPRESS,
};
typedef struct cli_cluster {
    unsigned accept; /* CLI_CLUSTER_* */
    bool on;         /* use nodes: --cluster, --nodes, or (IMPLY) a plan option */
    bool insecure, take, tp_compress;
    const char *nodes, *key_file; /* as given; NULL: not given */
    cm_plan_request plan;
} cli_cluster;
int cli_cluster_opt(int argc, char **argv, int *i, cli_cluster *c);
int cli_cluster_check(const cli_cluster *c);
const char *cli_cluster_nodes(const cli_cluster *c);
void cli_cluster_apply(const cli_cluster *c, struct cm_engine_opts *eo);
void cli_cluster_usage(FILE *out, unsigned accept);
/* finetune --cluster without --layers or --data-parallel (finetune_dp.c):
 * the replicas of the training pipeline that nodes ("auto": mDNS, or a
 * list) hold (sched/plan_dp.h), windows of n_ctx tokens. Returns their
 * number; when > 1, list holds the nodes replica by replica and why the
 * planner's reason. 1: one pipeline (also when a node cannot be measured). */
struct cm_gguf;
int cli_finetune_dp(const struct cm_gguf *g, const char *nodes, bool insecure, const char *key_file, bool take,
                    int n_ctx, char *list, size_t cap, char *why, size_t whylen);
/* finetune --dashboard PORT (finetune_dash.c): start the page (a line on
 * stderr with its address; a failure is cli_fail's line and 1), then feed
 * it the progress (a cm_finetune_status) and the machines: this machine
 * alone (its n_layer layers) or the open pipes. NULL dashboard: no-ops. */
struct cm_train_dash;
struct cm_pipe;
int cli_finetune_dash_start(struct cm_train_dash **out, const char *host, int port, const char *title);
void cli_finetune_dash_progress(struct cm_train_dash *d, const void *status);
void cli_finetune_dash_local(struct cm_train_dash *d, int n_layer);
void cli_finetune_dash_pipes(struct cm_train_dash *d, struct cm_pipe *const *p, int np);

/* --lora FILE.gguf[:SCALE] (run, chat, serve; repeatable, summed): parsed
 * like cli_sampling_opt into l (lora_opt.c). */
#define CLI_LORA_MAX 8
typedef struct cli_loras {
    const char *spec[CLI_LORA_MAX];
    int n;
} cli_loras;
int cli_lora_opt(int argc, char **argv, int *i, cli_loras *l);
/* The engine's options run, chat and serve share (util.c): --lora, the KV
 * cache options, --gpu/--gpu-layers, the cluster options (g->net.accept
 * set by the command), --ctx N, --threads N, --mmap; parsed like
 * cli_sampling_opt. cli_engine_apply: g into engine options. cli_gen_opt
 * (run, chat): the sampling options (into s), then the engine's. The help
 * texts: CLI_GEN_HELP, the engine's options but the cluster's
 * (cli_cluster_usage), run's and chat's words (serve words --ctx, --mmap
 * and --lora for its slots and nodes); CLI_SAMPLING_HELP, sampling's but
 * --seed (chat's reply k samples with S+k); CLI_KV_HELP (run, chat, serve). */
typedef struct cli_engine {
    cli_loras loras;
    cli_kv kv;
    cli_gpu gpu;
    cli_cluster net;
    int n_ctx, n_threads; /* 0: the defaults */
    bool mmap;
} cli_engine;
int cli_engine_opt(int argc, char **argv, int *i, cli_engine *g);
void cli_engine_apply(const cli_engine *g, struct cm_engine_opts *eo);
int cli_gen_opt(int argc, char **argv, int *i, struct cm_sampler_params *s, cli_engine *g);
#define CLI_LORA_HELP                                                                            \
    "  --lora FILE[:SCALE]    apply a LoRA adapter (llama.cpp's adapter GGUF) with this scale\n" \
    "                         (default 1); repeat for several (their corrections add up)\n"
#define CLI_KV_HELP                                                                                      \
    "  --cache-type-k, -ctk T, --cache-type-v, -ctv T\n"                                                 \
    "                         KV cache types: f32 (default), f16, q8_0, q4_0 (llama.cpp's -ctk/-ctv);\n" \
    "                         --kv-type T sets both; per token: see 'cumulo info'\n"                     \
    "  --flash-attn, -fa [on|off]  K/V rows, tiled attention (default; off: f32/f16 V transposed)\n"
#define CLI_SAMPLING_HELP                                              \
    "  --temp T               temperature (default 0.8; 0 = greedy)\n" \
    "  --top-k K              top-k (default 40; 0 = off)\n"           \
    "  --top-p P              top-p (default 0.95; 1 = off)\n"         \
    "  --min-p P              min-p (default 0.05; 0 = off)\n"         \
    "  --repeat-penalty R     repetition penalty (default 1.0 = off)\n"
#define CLI_GEN_HELP                                                                              \
    "  --ctx N                context size (default: the model's, at most 4096)\n"                \
    "  --threads N            compute threads (default: all CPUs)\n" CLI_KV_HELP CLI_GPU_HELP     \
    "  --mmap                 keep the weights in a file mapping (default: read into huge-page\n" \
    "                         memory when they fit, fewer TLB misses per token; also CUMULO_MMAP=1)\n" CLI_LORA_HELP

/* A progress bar on stderr (only when stderr is a terminal, or CUMULO_PROGRESS=1).
 * With `bytes` set (after start) it also shows MiB done, speed and time left. */
typedef struct cli_progress {
    const char *label;
    double total, last_draw, t0, base;
    bool on, bytes;
} cli_progress;
void cli_progress_start(cli_progress *p, const char *label, double total);
void cli_progress_update(cli_progress *p, double done);
void cli_progress_end(cli_progress *p);

int cmd_version(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_info(int argc, char **argv);

/* Load a model through engine.h with a progress bar (cmd_run.c); prints the
 * one-line error itself and returns non-zero on failure. */
struct cm_engine;
struct cm_engine_opts;
int cli_load_engine_opts(struct cm_engine **e, const char *path, const struct cm_engine_opts *o);
int cmd_key(int argc, char **argv);
int cmd_node(int argc, char **argv);
int cmd_nodes(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* `cumulo mpi`: src/mpi/cmd_mpi.c with `make MPI=1`, else cmd_mpi_none.c (says how to get it). */
int cmd_mpi(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_discover(int argc, char **argv);
int cmd_announce(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_models(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_service(int argc, char **argv);
int cmd_finetune(int argc, char **argv);
/* What a fine-tune reads (cmd_finetune.c; serve_finetune.c too): the model
 * at model_path opened, loaded and checked for training, its tokenizer, and
 * the JSONL file data_path parsed (its errors name data_name), "messages"
 * lines with the chat template tmpl (a family name; NULL: the model's). 0,
 * or an error in err with nothing left open; after 0 the caller releases
 * d, tok, m and g. */
struct cm_model;
struct cm_tokenizer;
struct cm_tdata;
int cli_finetune_inputs(const char *model_path, const char *data_path, const char *data_name, const char *tmpl,
                        struct cm_gguf *g, struct cm_model *m, struct cm_tokenizer **tok, struct cm_tdata *d, char *err,
                        size_t errlen);
/* serve --finetune-dir DIR (serve_finetune.c): POST /v1/fine_tuning/jobs
 * trains a LoRA adapter on model_path with a JSONL file of DIR, in the
 * background, on n_threads threads; the adapter goes to DIR/ID.gguf. */
struct cm_http_server;
struct cm_http_ft_request;
typedef struct cli_serve_ft cli_serve_ft;
cli_serve_ft *cli_serve_ft_new(const char *dir, const char *model_path, int n_threads);
void cli_serve_ft_attach(cli_serve_ft *f, struct cm_http_server *srv); /* NULL: the server is going (stop reporting) */
int cli_serve_ft_start(void *user, const struct cm_http_ft_request *r, char *err, size_t errlen);
/* The program's argv[0] (set by main). */
extern const char *cli_argv0;
/* This program's absolute path (/proc/self/exe, else argv[0] resolved
 * against PATH) into out (cap >= PATH_MAX); 0 or -1. */
int cli_self_path(char *out, size_t cap);
/* A MODEL argument as every command takes it: a file, or a pulled model's
 * name (org/repo:QUANT, hf://org/repo/FILE.gguf) turned into its file
 * (src/hub/models.c). Prints the one-line error and returns NULL when it is
 * neither; else a pointer to a static buffer (one model per command). */
const char *cli_model_path(const char *arg);

#endif
