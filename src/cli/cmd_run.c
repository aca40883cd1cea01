/*
 * cmd_run.c: `cumulo run MODEL -p TEXT`: one-shot generation on this
 * machine. Streams text to stdout and prints prompt/generation speed to
 * stderr; --json prints one JSON object instead (the machine interface of
 * tests and benchmarks). Talks to the inference side only through engine.h.
 * Errors are one line and a non-zero exit; it never crashes on bad input.
 */
#include "cli.h"

#include "base/base.h"
#include "engine/engine.h"
#include "os/os.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_run_usage[] =
    "usage: cumulo run MODEL.gguf [-p TEXT | -f FILE] [options]\n"
    "\n"
    "Generate text from a prompt on this machine: the prompt and the generated text\n"
    "stream to stdout, prompt and generation speed go to stderr.\n"
    "\n"
    "  -p, --prompt TEXT      prompt text (default: empty, i.e. BOS only)\n"
    "  -f, --file FILE        read the prompt from FILE\n"
    "  -n, --n-predict N      tokens to generate (default 128; -1: until EOS or the context is full)\n" CLI_SAMPLING_HELP
    "  --seed S               RNG seed (default: random)\n"
    "  --stop TEXT            stop when TEXT appears (repeatable)\n" CLI_GEN_HELP
    "  --no-bos               do not add the BOS token\n"
    "  --ignore-eos           keep generating past end-of-generation tokens\n"
    "  --chat                 send the prompt as a user message through the model's chat template\n"
    "                         (only the reply is printed)\n"
    "  --chat-template NAME   like --chat, with this template family (chatml, llama3, ...)\n"
    "  --system TEXT          with --chat: a system message before the prompt\n"

    "  --json                 print one JSON object: prompt_tokens, tokens, text, timings\n"
    "  -q, --quiet            only the text on stdout: no cluster tables, no timing line (warnings\n"
    "                         and errors still go to stderr)\n"
    "  --logprobs N           with --json: each generated token's logprob and the N most likely\n"
    "                         tokens' (natural log of the model's softmax; N <= 20)\n"
    "  --streams N            run N copies of the request at once (aggregate tokens/s; a benchmark)\n"
    "\n"
    "Cluster (pipeline: this machine computes the first stage; or tensor parallel):\n";

static cm_session *g_session; /* for SIGINT */

static void on_sigint(int sig) {
    (void)sig;
    if (g_session) cm_session_cancel(g_session);
}

typedef struct run_out {
    bool json;
    cJSON *lp; /* --logprobs: one {id, logprob, top: [[id, logprob], ...]} per token */
    int32_t *ids;
    int n_ids, cap_ids;
    cm_buf text;
} run_out;

static int on_token(void *user, const cm_token_event *ev) {
    run_out *o = user;
    int32_t id = ev->id;
    const char *text = ev->text;
    size_t len = ev->len;
    if (id >= 0 && o->n_ids < o->cap_ids) o->ids[o->n_ids++] = id;
    if (id >= 0 && o->lp && ev->info) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", id);
        cJSON_AddNumberToObject(t, "logprob", ev->info->logprob);
        cJSON *top = cJSON_AddArrayToObject(t, "top");
        for (int i = 0; i < ev->info->n_top; i++) {
            cJSON *pr = cJSON_CreateArray();
            cJSON_AddItemToArray(pr, cJSON_CreateNumber(ev->info->top[i].id));
            cJSON_AddItemToArray(pr, cJSON_CreateNumber(ev->info->top[i].logprob));
            cJSON_AddItemToArray(top, pr);
        }
        cJSON_AddItemToArray(o->lp, t);
    }
    if (o->json) cm_buf_append(&o->text, text, len);
    else if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

static void progress_cb(void *ctx, uint64_t done, uint64_t total) {
    cli_progress *p = ctx;
    if (total == 0) return;
    if (p->total <= 1) p->total = (double)total;
    cli_progress_update(p, (double)done);
}

static void log_none(void *ctx, const char *line) { (void)ctx, (void)line; }

/* Shared by run and info: map + load with a progress bar for large files. */
int cli_load_engine_opts(cm_engine **e, const char *path, const cm_engine_opts *in) {
    cli_progress prog;
    cli_progress_start(&prog, "loading", 0);
    cm_engine_opts o = *in;
    cli_check_threads(&o);
    if (o.nodes && !o.log) o.log = cli_log_line;
    /* Pages load lazily unless there is a bar to show (reading them all costs time). */
    if (prog.on) {
        o.progress = progress_cb;
        o.progress_ctx = &prog;
    }
    char err[512];
    if (!(path = cli_model_path(path))) return 1;
    double t0 = cm_now_s();
    int rc = cm_engine_load(e, path, &o, err, sizeof err);
    if (prog.on) cli_progress_end(&prog);
    if (rc) return cli_fail("%s", err);
    if (o.nodes) { /* where a cluster's start-up time goes */
        char line[256];
        bool mdns = !strcmp(o.nodes, "auto");
        snprintf(line, sizeof line, "cluster ready in %.1f s%s", cm_now_s() - t0,
                 mdns ? " (3 s of it finding nodes over mDNS: --nodes HOST:PORT,... skips that)" : "");
        o.log(o.log_ctx, line);
    }
    cli_check_ctx(*e, o.n_ctx);
    return 0;
}

/* --streams: N copies of the request decoded together, the way serve's
 * scheduler decodes its slots: one thread evaluates each prompt, then steps
 * every running session in ONE batched forward pass per token
 * (cm_engine_step; on a cluster, micro-batches through the pipeline). */
typedef struct stream_job {
    cm_session *s;
    run_out out;
    int rc;
    char err[512];
} stream_job;

static int run_streams(cm_engine *e, int n, const int32_t *ptoks, int np, const cm_gen_params *gp, bool json) {
    stream_job *jobs = cm_calloc((size_t)n, sizeof *jobs);
    if (!jobs) return cli_fail("out of memory");
    int cap = gp->n_predict > 0 ? gp->n_predict : 4096, status = 0;
    double t0 = cm_now_s();
    cm_session **ss = cm_calloc((size_t)n, sizeof *ss);
    if (!ss) {
        cm_free(jobs);
        return cli_fail("out of memory");
    }
    for (int i = 0; i < n; i++) {
        stream_job *j = &jobs[i];
        j->out = (run_out){.json = true, .cap_ids = cap};
        j->out.ids = cm_malloc((size_t)cap * sizeof(int32_t));
        cm_buf_init(&j->out.text);
        j->s = ss[i] = cm_session_new(e, 0, j->err, sizeof j->err);
        j->rc = j->s ? 0 : CM_ENOMEM;
        if (!j->rc) j->rc = cm_session_set_prompt(j->s, ptoks, np, j->err, sizeof j->err);
        if (!j->rc) j->rc = cm_session_start(j->s, gp, on_token, &j->out, j->err, sizeof j->err);
    }
    int n_live = 0; /* sessions that started, at the front of ss */
    for (int i = 0; i < n; i++)
        if (!jobs[i].rc) ss[n_live++] = jobs[i].s;
    char serr[512] = "";
    int r = n_live;
    while (r > 0) r = cm_engine_step(e, ss, n_live, serr, sizeof serr);
    if (r < 0 && !status) status = cli_fail("streams: %s", serr);
    long total = 0;
    bool same = true;
    for (int i = 0; i < n; i++) {
        cm_gen_result res;
        if (!jobs[i].rc) cm_session_finish(jobs[i].s, &res);
        cm_session_free(jobs[i].s);
        if (jobs[i].rc && !status) status = cli_fail("stream %d: %s", i, jobs[i].err);
        total += jobs[i].out.n_ids;
        same = same && jobs[i].out.n_ids == jobs[0].out.n_ids &&
               !memcmp(jobs[i].out.ids, jobs[0].out.ids, (size_t)jobs[0].out.n_ids * sizeof(int32_t));
    }
    cm_free(ss);
    double dt = cm_now_s() - t0;
    uint64_t hb = 0, hf = 0, hr = 0;
    bool hop = cm_engine_hop_stats(e, &hb, &hf, &hr);
    if (json) {
        printf("{\"streams\":%d,\"tokens\":%ld,\"seconds\":%.4f,\"aggregate_tps\":%.2f,\"identical\":%s", n, total, dt,
               dt > 0 ? total / dt : 0, same ? "true" : "false");
        if (hop)
            printf(",\"hop_bytes\":%llu,\"hop_frames\":%llu,\"hop_rows\":%llu", (unsigned long long)hb,
                   (unsigned long long)hf, (unsigned long long)hr);
        printf(",\"ids\":[");
        for (int k = 0; k < jobs[0].out.n_ids; k++) printf(k ? ",%d" : "%d", jobs[0].out.ids[k]);
        printf("]}\n");
    } else {
        printf("%d streams: %ld tokens in %.3f s = %.1f tok/s aggregate; outputs %s\n", n, total, dt,
               dt > 0 ? total / dt : 0, same ? "identical" : "DIFFER");
    }
    for (int i = 0; i < n; i++) {
        cm_free(jobs[i].out.ids);
        cm_buf_release(&jobs[i].out.text);
    }
    cm_free(jobs);
    return status;
}

int cmd_run(int argc, char **argv) {
    if (cli_help(argc, argv, k_run_usage, CLI_CLUSTER_RUN)) return 0;
    const char *model = NULL, *prompt = NULL, *file = NULL, *tmpl = NULL, *system = NULL;
    const char *stops[16];
    int n_stops = 0;
    long n_predict = 128, streams = 0, logprobs = 0;
    bool quiet = false;
    bool json = false, no_bos = false, chat = false;
    cli_engine go = {.net = {.accept = CLI_CLUSTER_RUN}};
    cm_gen_params gp;
    cm_gen_params_default(&gp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEXT() (i++, v)
        int so = cli_gen_opt(argc, argv, &i, &gp.sampling, &go);
        if (so < 0) return 1;
        if (so > 0) continue;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            prompt = NEXT();
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            file = NEXT();
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!cli_int(a, NEXT(), -1, 1 << 24, &n_predict)) return 1;
        } else if (!strcmp(a, "--stop")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            if (n_stops == (int)CM_ARRAY_LEN(stops))
                return cli_fail("at most %d --stop strings", (int)CM_ARRAY_LEN(stops));
            if (!*v) return cli_fail("option '--stop' needs a non-empty string");
            stops[n_stops++] = NEXT();
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            gp.ignore_eos = true;
        } else if (!strcmp(a, "--chat")) {
            chat = true;
        } else if (!strcmp(a, "--chat-template")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            tmpl = NEXT();
            chat = true;
        } else if (!strcmp(a, "--system")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            system = NEXT();
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "--logprobs")) {
            if (!cli_int(a, NEXT(), 0, CM_SAMPLER_MAX_PROBS, &logprobs)) return 1;
        } else if (!strcmp(a, "--streams")) {
            if (!cli_int(a, NEXT(), 1, 64, &streams)) return 1;
        } else if (a[0] == '-' && a[1]) {
            return cli_fail("unknown option '%s'; see 'cumulo run --help'", a);
        } else if (!model) {
            model = a;
        } else {
            return cli_fail("unexpected argument '%s'; see 'cumulo run --help'", a);
        }
#undef NEXT
    }
    if (!model) return cli_fail("run needs a MODEL.gguf; see 'cumulo run --help'");
    if (prompt && file) return cli_fail("give either -p or -f, not both");
    if (system && !chat) return cli_fail("--system needs --chat or --chat-template");
    char *file_text = NULL;
    size_t file_len = 0;
    char err[512];
    cm_chat_template ct;
    if (tmpl && cm_chat_template_by_name(&ct, tmpl, err, sizeof err)) return cli_fail("%s", err);
    if (file) {
        if (cm_file_read_all(file, &file_text, &file_len, err, sizeof err)) return cli_fail("%s", err);
        prompt = file_text;
    }
    if (!prompt) prompt = "";
    size_t plen = file ? file_len : strlen(prompt);
    gp.n_predict = (int)n_predict;
    gp.stops = stops;
    gp.n_stops = n_stops;
    char msg[512];
    if (cm_sampler_params_check(&gp.sampling, msg, sizeof msg)) {
        cm_free(file_text);
        return cli_fail("%s", msg);
    }

    if (cli_cluster_check(&go.net)) {
        cm_free(file_text);
        return 1;
    }
    gp.sampling.n_probs = (int32_t)logprobs;
    gp.skip_logprobs = !(json && logprobs > 0); /* run_out reads info only for --json --logprobs */
    cm_engine *e = NULL;
    cm_engine_opts eo = {.n_seq = streams > 8 ? (int)streams : 8, .log = quiet ? log_none : NULL};
    cli_engine_apply(&go, &eo);
    /* --streams (even 1) reports aggregate numbers instead of the text. */
    if (cli_load_engine_opts(&e, model, &eo)) {
        cm_free(file_text);
        return 1;
    }
    int status = 1;
    cm_session *s = NULL;
    int32_t *ptoks = NULL;
    run_out out = {.json = json, .lp = json && logprobs > 0 ? cJSON_CreateArray() : NULL};
    cm_buf_init(&out.text);
    cm_buf chat_text;
    cm_buf_init(&chat_text);
    if (chat) { /* the prompt becomes the rendered conversation [system,] user */
        cm_chat_msg msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (cm_chat_msg){.role = "system", .content = system};
        msgs[nm++] = (cm_chat_msg){.role = "user", .content = prompt};
        tmpl = cli_chat_template(e, tmpl, model);
        if (cm_engine_chat_render(e, tmpl, msgs, nm, true, &chat_text, err, sizeof err)) {
            cli_fail("%s", err);
            goto done;
        }
        if (chat_text.oom) {
            cli_fail("out of memory");
            goto done;
        }
        prompt = chat_text.data ? chat_text.data : "";
        plen = chat_text.len;
    }
    /* A token covers at least one byte; BOS/EOS and SPM's leading space add a few. */
    int cap = plen > (size_t)(1 << 28) ? (1 << 28) : (int)plen + 8, np = 0;
    for (int pass = 0; pass < 2; pass++) {
        cm_free(ptoks);
        ptoks = cm_malloc((size_t)cap * sizeof *ptoks);
        if (!ptoks) {
            cli_fail("out of memory for a prompt of %zu bytes", plen);
            goto done;
        }
        np = cm_engine_tokenize(e, prompt, plen, !no_bos, chat, ptoks, cap, err, sizeof err);
        if (np < 0) {
            cli_fail("cannot tokenize the prompt: %s", err);
            goto done;
        }
        if (np <= cap) break;
        cap = np;
    }
    if (np > cap) {
        cli_fail("cannot tokenize the prompt");
        goto done;
    }
    if (np == 0) {
        cli_fail("the prompt is empty and --no-bos leaves no token to start from");
        goto done;
    }
    if (streams >= 1) {
        status = run_streams(e, (int)streams, ptoks, np, &gp, json) ? 1 : 0;
        goto done;
    }
    s = cm_session_new(e, go.n_ctx, err, sizeof err);
    if (!s) {
        cli_fail("%s", err);
        goto done;
    }
    if (np > cm_session_n_ctx(s)) {
        char adv[160];
        cli_ctx_advice(e, cm_session_n_ctx(s), adv, sizeof adv);
        cli_fail("prompt of %d tokens does not fit the context of %d (%s)", np, cm_session_n_ctx(s), adv);
        goto done;
    }
    out.cap_ids = n_predict > 0 ? (int)n_predict : cm_session_n_ctx(s);
    out.ids = cm_malloc((size_t)out.cap_ids * sizeof *out.ids + 1);
    if (!out.ids) {
        cli_fail("out of memory");
        goto done;
    }
    if (!json && plen && !chat) { /* echo the prompt, as llama.cpp's CLI does, so the story reads whole */
        fwrite(prompt, 1, plen, stdout);
        fflush(stdout);
    }
    g_session = s;
    signal(SIGINT, on_sigint);
    if (cm_session_set_prompt(s, ptoks, np, err, sizeof err)) {
        cli_fail("%s", err);
        goto done;
    }
    cm_gen_result res;
    if (cm_session_generate(s, &gp, on_token, &out, &res, err, sizeof err)) {
        cli_fail("%s", err);
        goto done;
    }
    signal(SIGINT, SIG_DFL);
    g_session = NULL;
    cm_timings t = cm_session_timings(s);
    double ptps = t.prompt_s > 0 ? t.n_prompt / t.prompt_s : 0, gtps = t.gen_s > 0 ? t.n_gen / t.gen_s : 0;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *pa = cJSON_AddArrayToObject(j, "prompt_tokens");
        for (int i = 0; i < np; i++) cJSON_AddItemToArray(pa, cJSON_CreateNumber(ptoks[i]));
        cJSON *ta = cJSON_AddArrayToObject(j, "tokens");
        for (int i = 0; i < out.n_ids; i++) cJSON_AddItemToArray(ta, cJSON_CreateNumber(out.ids[i]));
        cm_buf_append(&out.text, "", 1);
        cJSON_AddStringToObject(j, "text", out.text.data ? out.text.data : "");
        cJSON_AddStringToObject(j, "finish_reason", cm_finish_name(res.finish));
        int gpu_layers;
        const char *dev = cm_engine_gpu_device(e, &gpu_layers);
        cJSON_AddStringToObject(j, "device", dev ? dev : "cpu"); /* which computed the first layers */
        if (dev) cJSON_AddNumberToObject(j, "gpu_layers", gpu_layers);
        uint64_t took, declined; /* since the device's current upload (a re-formed group's slice) */
        if (cm_engine_gpu_batches(e, &took, &declined)) {
            cJSON_AddNumberToObject(j, "gpu_batches", (double)took);
            cJSON_AddNumberToObject(j, "gpu_batches_declined", (double)declined);
        }
        if (out.lp) {
            cJSON_AddItemToObject(j, "logprobs", out.lp);
            out.lp = NULL;
        }
        cJSON *tj = cJSON_AddObjectToObject(j, "timings");
        cJSON_AddNumberToObject(tj, "prompt_n", t.n_prompt);
        cJSON_AddNumberToObject(tj, "prompt_s", t.prompt_s);
        cJSON_AddNumberToObject(tj, "prompt_tps", ptps);
        cJSON_AddNumberToObject(tj, "gen_n", t.n_gen);
        cJSON_AddNumberToObject(tj, "gen_s", t.gen_s);
        cJSON_AddNumberToObject(tj, "gen_tps", gtps);
        cJSON_AddNumberToObject(tj, "peak_rss_bytes", (double)cm_peak_rss_bytes());
        uint64_t hits[1024] = {0};
        int nx = cm_engine_expert_hits(e, hits, 1024);
        if (nx > 0) { /* routing counts (what --expert-load takes) */
            cJSON *xa = cJSON_AddArrayToObject(j, "expert_hits");
            for (int i = 0; i < nx && i < 1024; i++) cJSON_AddItemToArray(xa, cJSON_CreateNumber((double)hits[i]));
        }
        uint64_t hb, hf, hr;
        if (cm_engine_hop_stats(e, &hb, &hf, &hr)) {
            cJSON *hj = cJSON_AddObjectToObject(j, "hop");
            cJSON_AddNumberToObject(hj, "bytes", (double)hb);
            cJSON_AddNumberToObject(hj, "frames", (double)hf);
            cJSON_AddNumberToObject(hj, "rows", (double)hr);
        }
        uint64_t td, tw, to, tr;
        if (cm_engine_tp_stats(e, &td, &tw, &to, &tr)) {
            cm_engine_info inf;
            cm_engine_get_info(e, &inf);
            cJSON *tj2 = cJSON_AddObjectToObject(j, "tp");
            cJSON_AddNumberToObject(tj2, "size", inf.tp_size);
            cJSON_AddNumberToObject(tj2, "data_bytes", (double)td);
            cJSON_AddNumberToObject(tj2, "wire_bytes", (double)tw);
            cJSON_AddNumberToObject(tj2, "ops", (double)to);
            cJSON_AddNumberToObject(tj2, "rows", (double)tr);
        }
        cli_json_print(j, false);
    } else {
        fputc('\n', stdout);
        fflush(stdout);
        if (!quiet)
            fprintf(stderr,
                    "\nprompt: %d tokens in %.3f s (%.1f tok/s); generation: %d tokens in %.3f s (%.1f tok/s)%s\n",
                    t.n_prompt, t.prompt_s, ptps, t.n_gen, t.gen_s, gtps,
                    res.finish == CM_FINISH_CANCEL ? " (interrupted)"
                    : res.finish == CM_FINISH_CTX  ? " (context full)"
                                                   : "");
    }
    status = 0;
done:
    signal(SIGINT, SIG_DFL);
    g_session = NULL;
    cm_buf_release(&out.text);
    cJSON_Delete(out.lp);
    cm_buf_release(&chat_text);
    cm_free(out.ids);
    cm_free(ptoks);
    cm_session_free(s);
    cm_engine_free(e);
    cm_free(file_text);
    return status;
}
