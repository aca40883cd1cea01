/*
 * cmd_serve.c: `cumulo serve MODEL.gguf` — the OpenAI-compatible API and the
 * dashboard on this machine (src/http). Listens first (so /health answers 503
 * while the model loads), then loads the engine and hands it to the server,
 * then waits for SIGINT/SIGTERM and shuts down cleanly: running requests end
 * with an error event, threads are joined, the engine is freed.
 */
#include "cli.h"

#include "engine/engine.h"
#include "http/http.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_serve_usage[] =
    "usage: cumulo serve MODEL.gguf [options]\n"
    "\n"
    "Serve MODEL over an OpenAI-compatible HTTP API (/v1/chat/completions,\n"
    "/v1/completions, /v1/models), with /health, /metrics (Prometheus), /api/cluster\n"
    "and a live dashboard at /. Stops on Ctrl-C / SIGTERM.\n"
    "\n"
    "  --host H           address to listen on (default 127.0.0.1: this machine only)\n"
    "  --port P           port (default 8080; 0 = any free port, printed on stderr)\n"
    "  --api-key K        require 'Authorization: Bearer K' (default: $CUMULO_API_KEY)\n"
    "  --cors ORIGIN      send Access-Control-Allow-Origin: ORIGIN (default: no CORS)\n"
    "  --allow-host NAME  also accept NAME in the Host header (repeatable; IP literals,\n"
    "                     localhost and the --host value are always accepted)\n"
    "  --slots N          requests generating at once, batched together (default 4)\n"
    "  --queue N          requests waiting for a slot; more get 503 (default 16)\n"
    "  --ctx N            context of each slot (default: the model's, at most 4096)\n"
    "  --kv-mem MIB       KV memory of all slots; a request waits until prompt + max_tokens\n"
    "                     fit (default: every slot's context, at most 3/4 of free memory)\n"
    "  --threads N        compute threads (default: all CPUs)\n"
    "  --batch N          most tokens (prompt chunk, or sequences of a decode step) per forward\n"
    "                     pass (default 32; any value gives every request the same bits alone\n"
    "                     or batched, with or without a cached prefix)\n"
    "  --cache-type-k, -ctk T, --cache-type-v, -ctv T\n"
    "                     KV cache types: f32 (default), f16, q8_0, q4_0 (llama.cpp's -ctk/-ctv);\n"
    "                     --kv-type T sets both; per token: see 'cumulo info'\n"
    "  --flash-attn, -fa [on|off]  K/V rows, tiled attention (default; off: f32/f16 V transposed)\n" CLI_GPU_HELP
    "  --lora FILE[:SCALE] apply a LoRA adapter (llama.cpp's adapter GGUF; repeatable, summed;\n"
    "                     with --nodes every node gets its layers' parts)\n"
    "  --mmap             keep the weights in a file mapping (default when alone: read into\n"
    "                     huge-page memory when they fit; with --nodes always mapped; CUMULO_MMAP=1)\n"
    "  --max-body BYTES   largest request body (default 1048576)\n"
    "  --timeout S        idle seconds before a connection is closed (default 10)\n"
    "  --max-conns N      open connections at most (default 4096; idle ones cost no thread)\n"
    "  --max-per-ip N     open connections from one client address at most (default 256; 0: no limit)\n"
    "  --tdp W            watts at full load, for the power estimate without counters (default 65)\n"
    "  --alias NAME       model id in the API (default: the file name without .gguf)\n"
    "  --chat-template F  chat template family (chatml, llama3, ...; default: the model's own,\n"
    "                     or chatml when it has none)\n"
    "\n"
    "Cluster (pipeline: this machine computes the first stage; or tensor parallel):\n"
    "  --nodes LIST       auto (mDNS) or host:port,host:port,... of `cumulo node`s\n"
    "  --layers A,B,...   layers per stage, this machine first (default: the planner's)\n"
    "  --parallel MODE    pp (default): a pipeline; tp: one tensor-parallel group of every machine;\n"
    "                     hybrid: tensor-parallel groups as pipeline stages; auto: the planner's best\n"
    "                     ep: experts of a mixture-of-experts model spread over one group\n"
    "  --groups A,B,...   members per stage, this machine's group first (e.g. 2,2: hybrid)\n"
    "  --tp-weights W,... tp/hybrid: relative speed per machine, this one first (slice sizes)\n"
    "  --tp-compress      all-reduces travel as 8-bit Q8_0 blocks (off by default; not exact)\n"
    "  --take             use nodes that serve another coordinator (it is told and re-plans)\n"
    "  --insecure         no cluster key (the nodes must run --insecure too)\n"
    "  --key-file FILE    cluster key (default $CUMULO_KEY_FILE or ~/.config/cumulo/cluster.key)\n";

static const char k_serve_ft_usage[] =
    "\nFine-tuning while serving (OpenAI's fine-tuning jobs API):\n"
    "  --finetune-dir DIR POST /v1/fine_tuning/jobs trains a LoRA adapter on this model with a JSONL\n"
    "                     file of DIR (\"training_file\": its name), one job at a time, while serving;\n"
    "                     the adapter goes to DIR/ftjob-N.gguf, the loss curve to the dashboard\n"
    "  --finetune-threads N  threads a fine-tuning job uses (default 1)\n";

static void log_line(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "%s\n", line);
}

int cmd_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(k_serve_usage, stdout);
        fputs(k_serve_ft_usage, stdout);
        fputs(cli_expert_load_usage, stdout);
        return 0;
    }
    cm_http_opts o;
    cm_http_opts_default(&o);
    const char *model = NULL, *alias = NULL;
    const char *allow[16];
    int n_allow = 0;
    long threads = 0, l;
    long n_batch = 32; /* any value is batch-invariant (kernels.h); larger prefills in fewer passes */
    cli_kv kvo = {0};
    cli_gpu gpuo = {0};
    bool kv_f16 = false, insecure = false, use_mmap = false;
    const char *nodes = NULL, *key_file = NULL;
    cm_plan_request plan = {0};
    cli_loras loras = {0};
    int po;
    bool tp_compress = false, take = false;
    const char *ft_dir = NULL; /* --finetune-dir: POST /v1/fine_tuning/jobs (serve_finetune.c) */
    long ft_threads = 1;
    double d;
    o.api_key = cm_config_get()->api_key;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEXT() (i++, v)
#define NEED()                                                   \
    do {                                                         \
        if (!v) return cli_fail("option '%s' needs a value", a); \
    } while (0)
        if ((po = cli_plan_opt(argc, argv, &i, &plan)) != 0) {
            if (po < 0) return 1;
        } else if ((po = cli_lora_opt(argc, argv, &i, &loras)) != 0) {
            if (po < 0) return 1;
        } else if ((po = cli_kv_opt(argc, argv, &i, &kvo)) != 0) {
            if (po < 0) return 1;
        } else if ((po = cli_gpu_opt(argc, argv, &i, &gpuo)) != 0) {
            if (po < 0) return 1;
        } else if (!strcmp(a, "--host")) {
            NEED();
            o.host = NEXT();
        } else if (!strcmp(a, "--port")) {
            if (!cli_int(a, NEXT(), 0, 65535, &l)) return 1;
            o.port = (int)l;
        } else if (!strcmp(a, "--api-key")) {
            NEED();
            o.api_key = NEXT();
        } else if (!strcmp(a, "--cors")) {
            NEED();
            o.cors_origin = NEXT();
        } else if (!strcmp(a, "--allow-host")) {
            NEED();
            if (n_allow == (int)CM_ARRAY_LEN(allow)) return cli_fail("at most %d --allow-host names", n_allow);
            allow[n_allow++] = NEXT();
        } else if (!strcmp(a, "--slots")) {
            if (!cli_int(a, NEXT(), 1, 256, &l)) return 1;
            o.n_slots = (int)l;
        } else if (!strcmp(a, "--queue")) {
            if (!cli_int(a, NEXT(), 0, 1 << 16, &l)) return 1;
            o.queue_max = (int)l;
        } else if (!strcmp(a, "--ctx")) {
            if (!cli_int(a, NEXT(), 16, 1 << 20, &l)) return 1;
            o.n_ctx = (int)l;
        } else if (!strcmp(a, "--mmap")) use_mmap = true;
        else if (!strcmp(a, "--batch")) {
            if (!cli_int(a, NEXT(), 1, CM_BATCH_MAX, &n_batch)) return 1;
        } else if (!strcmp(a, "--threads")) {
            if (!cli_int(a, NEXT(), 1, 1024, &threads)) return 1;
        } else if (!strcmp(a, "--kv-mem")) {
            if (!cli_int(a, NEXT(), 1, 1L << 24, &l)) return 1;
            o.kv_mem = (uint64_t)l << 20;
        } else if (!strcmp(a, "--max-body")) {
            if (!cli_int(a, NEXT(), 1024, 1L << 30, &l)) return 1;
            o.max_body = (size_t)l;
        } else if (!strcmp(a, "--timeout")) {
            if (!cli_int(a, NEXT(), 1, 3600, &l)) return 1;
            o.timeout_s = (int)l;
        } else if (!strcmp(a, "--max-conns")) {
            if (!cli_int(a, NEXT(), 4, 100000, &l)) return 1;
            o.max_conns = (int)l;
        } else if (!strcmp(a, "--max-per-ip")) {
            if (!cli_int(a, NEXT(), 0, 100000, &l)) return 1;
            o.max_conns_per_ip = (int)l;
        } else if (!strcmp(a, "--tdp")) {
            if (!cli_float(a, NEXT(), 1, 100000, &d)) return 1;
            o.tdp_w = d;
        } else if (!strcmp(a, "--alias")) {
            NEED();
            alias = NEXT();
        } else if (!strcmp(a, "--chat-template")) {
            NEED();
            o.chat_template = NEXT();
        } else if (!strcmp(a, "--nodes")) {
            NEED();
            nodes = NEXT();
        } else if (!strcmp(a, "--tp-compress")) tp_compress = true;
        else if (!strcmp(a, "--take")) take = true;
        else if (!strcmp(a, "--key-file")) {
            NEED();
            key_file = NEXT();
        } else if (!strcmp(a, "--insecure")) insecure = true;
        else if (!strcmp(a, "--finetune-dir")) {
            NEED();
            ft_dir = NEXT();
        } else if (!strcmp(a, "--finetune-threads")) {
            if (!cli_int(a, NEXT(), 1, 1024, &ft_threads)) return 1;
        } else if (a[0] == '-') return cli_fail("unknown option '%s'; see 'cumulo serve --help'", a);
        else if (model) return cli_fail("more than one model given ('%s' and '%s')", model, a);
        else model = a;
#undef NEXT
#undef NEED
    }
    if (!model) return cli_fail("serve needs a model: cumulo serve MODEL.gguf");
    if (!(model = cli_model_path(model))) return 1;
    if (cli_plan_check(&plan)) return 1;
    o.allow_hosts = allow;
    o.n_allow_hosts = n_allow;
    char id[256];
    if (alias) snprintf(id, sizeof id, "%s", alias);
    else {
        const char *b = strrchr(model, '/');
        snprintf(id, sizeof id, "%s", b ? b + 1 : model);
        size_t n = strlen(id);
        if (n > 5 && !strcmp(id + n - 5, ".gguf")) id[n - 5] = 0;
    }
    o.model_id = id;

    /* Signals go to sigwait below, never to a server or compute thread. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    cm_http_server *srv;
    char err[512];
    cli_serve_ft *ft = NULL; /* lives until the process ends: a job's thread may outlast the server */
    if (ft_dir) {
        if (access(ft_dir, R_OK | W_OK | X_OK))
            return cli_fail("--finetune-dir '%s': not a writable directory", ft_dir);
        if (!(ft = cli_serve_ft_new(ft_dir, model, (int)ft_threads))) return cli_fail("out of memory");
        o.finetune = cli_serve_ft_start;
        o.finetune_user = ft;
    }
    if (cm_http_start(&srv, &o, err, sizeof err)) return cli_fail("%s", err);
    cli_serve_ft_attach(ft, srv);
    const char *h = o.host;
    bool v6 = strchr(h, ':') != NULL;
    fprintf(stderr, "cumulo: listening on http://%s%s%s:%d/ (loading '%s')\n", v6 ? "[" : "", h, v6 ? "]" : "",
            cm_http_port(srv), model);
    cm_engine *e = NULL;
    cm_engine_opts eo = {.n_threads = (int)threads,
                         .n_ctx = o.n_ctx,
                         .n_batch = (int)n_batch,
                         .kv_f16 = kv_f16,
                         .nodes = nodes,
                         .insecure = insecure,
                         .key_file = key_file,
                         .plan = plan,
                         .tp_compress = tp_compress,
                         .take = take,
                         .n_seq = (o.n_slots > 0 ? o.n_slots : 4) + 1 /* + 1: embeddings (embed_cluster.c) */,
                         .log = log_line,
                         .mmap = use_mmap,
                         .loras = loras.spec,
                         .n_loras = loras.n};
    cli_kv_apply(&kvo, &eo);
    cli_gpu_apply(&gpuo, &eo);
    cli_check_threads(&eo);
    if (cm_engine_load(&e, model, &eo, err, sizeof err)) {
        cli_serve_ft_attach(ft, NULL);
        cm_http_stop(srv);
        return cli_fail("%s", err);
    }
    cli_check_ctx(e, o.n_ctx);
    if (cm_http_set_engine(srv, e, err, sizeof err)) {
        cli_serve_ft_attach(ft, NULL);
        cm_http_stop(srv);
        cm_engine_free(e);
        return cli_fail("%s", err);
    }
    cm_http_kv_stats kvs;
    cm_http_kv_stats_get(srv, &kvs);
    fprintf(stderr,
            "cumulo: kv cache: budget %.1f MiB for %d slots (one slot's whole context: %.1f MiB; a block of "
            "%d positions: %.1f KiB), committed as written\n",
            (double)kvs.capacity / 1048576.0, o.n_slots, (double)kvs.slot_full / 1048576.0, CM_HTTP_KV_BLOCK,
            (double)kvs.block_bytes / 1024.0);
    fprintf(stderr, "cumulo: ready: model '%s', %d slots, queue %d%s\n", id, o.n_slots, o.queue_max,
            o.api_key && *o.api_key ? ", API key required" : "");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "cumulo: stopping (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    cli_serve_ft_attach(ft, NULL); /* a running job stops reporting; the process ends with it */
    cm_http_stop(srv);
    cm_engine_free(e);
    return 0;
}
