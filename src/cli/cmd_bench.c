/*
 * cmd_bench.c: `cumulo bench MODEL`: prompt-processing and decode speed of
 * this machine on a GGUF, how close decode comes to the memory-bandwidth
 * roofline, and (--vs-llamacpp) the same numbers for llama.cpp on the same
 * file with the same threads, measured in the same run.
 *
 * Method (bench/README.md says why):
 *   - each rep uses a fresh session (empty KV cache) and a fixed
 *     pseudo-random prompt: BOS + ids drawn by the same generator as
 *     shared/oracle/bench.mjs (seed 12345 + rep), so both engines see the same
 *     tokens; prompt tok/s = prompt / its evaluation time; decode tok/s =
 *     forward passes / time of a greedy generation of gen tokens;
 *   - best of reps; with --vs-llamacpp the reps interleave A B A B so that
 *     both engines sample the same minutes of a noisy shared machine;
 *   - bytes per decoded token: every weight except the token-embedding rows
 *     not looked up (one row is), the output head included (all of
 *     token_embd when the head is tied); of a mixture-of-experts model only
 *     the experts a token uses (expert_used_count of expert_count of each
 *     stacked *_exps tensor);
 *   - read bandwidth: a STREAM-like read over 1 GiB with the same threads,
 *     best of 3 passes, right before and right after the model runs; the
 *     roofline is the larger bandwidth / bytes per token;
 *   - power (os/power.c) over cumulo's decode phases: joules per token and
 *     tokens/s per watt, labelled measured (RAPL) or estimated;
 *   - the llama.cpp anchor: llama-bench built natively for this CPU
 *     (bench/llamacpp.sh; --llamacpp-bench or $CUMULO_LLAMACPP_BENCH), one
 *     `-r 1` run per rep, its prompt test (-p) and decode test (-n) with the
 *     same threads and an F16 KV cache, and its weights where cumulo's are
 *     (read into memory, `-lm none`, or mapped, `-lm mmap`; an older build's
 *     `-mmp 0|1`; one that takes neither runs mapped, its default, and
 *     bench says so); without it node-llama-cpp's prebuilt llama.cpp
 *     (shared/oracle/bench.mjs), labelled as the fallback. The JSON names the
 *     anchor, its load mode and this CPU (vendor, family, model, flags).
 * Timings never gate anything: this prints, it does not assert.
 * Progress goes to stderr; stdout carries the result (one JSON line with --json).
 */
#include "cli.h"

#include "base/base.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "os/os.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const char k_bench_usage[] =
    "usage: cumulo bench MODEL.gguf [options]\n"
    "\n"
    "Prompt-processing and decode tokens/s on this machine (best of reps, fresh KV cache\n"
    "each rep, fixed pseudo-random prompt), weight bytes read per decoded token, this\n"
    "machine's memory read bandwidth measured in the same run, and decode as % of the\n"
    "bandwidth roofline. Progress goes to stderr.\n"
    "\n"
    "  -t, --threads N    compute threads, for cumulo, llama.cpp and the bandwidth kernel\n"
    "                     (default: all CPUs)\n"
    "  --prompt N         prompt tokens (default 128)\n"
    "  --gen N            generated tokens (default 64)\n"
    "  --reps N           repetitions; the best counts (default 3)\n"
    "  --kv-type T        cumulo's KV cache: f32 (default), f16 (llama.cpp's default), q8_0, q4_0;\n"
    "                     -ctk T / -ctv T apart; -fa: tiled attention for f32/f16 too\n"
    "  --mmap             weights in a file mapping (default: read into huge-page memory when\n"
    "                     they fit; also CUMULO_MMAP=1); llama-bench gets the same (-lm mmap\n"
    "                     or -lm none)\n"
    "  --isa ISA          cap cumulo's kernels: scalar, avx2, avx512 or neon (default: best)\n"
    "  --vs-llamacpp      run llama.cpp on the same file, interleaved A B A B, and print the\n"
    "                     ratios cumulo / llama.cpp: llama-bench built for this CPU when given\n"
    "                     (bench/llamacpp.sh builds it), else node-llama-cpp (the fallback)\n"
    "  --llamacpp-bench P that llama-bench (default: $CUMULO_LLAMACPP_BENCH)\n"
    "  --oracle-dir DIR   folder with bench.mjs and node_modules/node-llama-cpp\n"
    "                     (default: $CUMULO_ORACLE_DIR, else /tmp/nlc)\n"
    "  --bw-mib N         size of the bandwidth buffer in MiB (default 1024)\n"
    "  --json             print one JSON line instead of the table (\"tune\": the kernels' knobs)\n"
    "\n"
    "The kernels' knobs (prefetch distances, pass sizes) are chosen per CPU at model load: read\n"
    "from the cache ($CUMULO_TUNE_DIR, else $XDG_CACHE_HOME/cumulo/tune, else ~/.cache/cumulo/tune)\n"
    "or measured on the weights (well under a second) and kept there; CUMULO_TUNE=0 uses the\n"
    "built-in values, CUMULO_TUNE=force measures again. Same results either way.\n"
    "\n"
    "Cluster (with --cluster: power, joules/token and the roofline count this machine only;\n"
    "the bytes on the wire per token are printed either way):\n";

typedef struct bench_opts {
    const char *model, *isa, *oracle_dir, *llama_bench;
    cli_cluster clo; /* --cluster, --nodes, --parallel, --groups, ... (clusteropt.c) */
    int threads, n_prompt, n_gen, reps, bw_mib;
    cli_kv kvo;   /* -ctk/-ctv/--kv-type/-fa (kvopt.c) */
    cli_gpu gpuo; /* --gpu, --gpu-layers (gpuopt.c) */
    bool json, vs, kv_f16, mmap;
    const char *lb_flag; /* llama-bench's load-mode option: "-lm", "-mmp" or NULL (it has none) */
    const char *lb_load; /* the anchor's weights: "none" (in memory), "mmap" or "default" */
} bench_opts;

typedef struct speed {
    double pp, tg; /* tokens/s; 0 = not measured */
} speed;

/* Energy of cumulo's decode phases, summed over reps (os/power.c). */
typedef struct energy {
    cm_power_meter *meter; /* NULL: power unknown */
    double joules, seconds, tokens;
    bool measured;
    const char *source;
} energy;

/* ---- the model's bytes per decoded token ---- */

/* Weight bytes a decode step reads: all tensors, minus the embedding rows
 * not looked up, plus the whole embedding when the output head is tied. */
static int bytes_per_token(const char *path, uint64_t *out, uint64_t *all_weights, char *err, size_t errlen) {
    cm_gguf g;
    int rc = cm_gguf_open(&g, path, NULL, NULL, err, errlen);
    if (rc) return rc;
    uint64_t total = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) total += g.tensors[i].nbytes;
    const cm_gguf_tensor_info *emb = cm_gguf_find_tensor(&g, "token_embd.weight");
    uint64_t per = total;
    if (emb && emb->n_dims >= 2 && emb->ne[1] > 0) {
        uint64_t row = emb->nbytes / (uint64_t)emb->ne[1];
        per = total - emb->nbytes + row;
        if (!cm_gguf_find_tensor(&g, "output.weight")) per += emb->nbytes; /* tied head reads it all */
    }
    char *arch = cm_gguf_get_str(&g, "general.architecture"), key[96];
    uint64_t n_exp = 0, n_used = 0;
    snprintf(key, sizeof key, "%s.expert_count", arch ? arch : "");
    if (cm_gguf_get_u64(&g, key, &n_exp) && n_exp > 0) {
        snprintf(key, sizeof key, "%s.expert_used_count", arch ? arch : "");
        if (cm_gguf_get_u64(&g, key, &n_used) && n_used <= n_exp)
            for (uint64_t i = 0; i < g.n_tensors; i++) {
                const char *nm = g.tensors[i].name;
                size_t l = strlen(nm);
                if (g.tensors[i].n_dims == 3 && l > 12 && !strcmp(nm + l - 12, "_exps.weight"))
                    per -= g.tensors[i].nbytes / n_exp * (n_exp - n_used);
            }
    }
    cm_free(arch);
    *out = per;
    *all_weights = total;
    cm_gguf_close(&g);
    return 0;
}

/* ---- bandwidth ---- */

static double measure_bw(int threads, int mib, const char *when) {
    cm_pool *pool = cm_pool_new(threads);
    if (!pool) return 0;
    double bw = 0;
    fprintf(stderr, "bench: read bandwidth %s (%d MiB, %d thread%s)...", when, mib, threads, threads == 1 ? "" : "s");
    int rc = cm_mem_read_bandwidth(pool, (size_t)mib << 20, 3, &bw);
    cm_pool_free(pool);
    if (rc) fprintf(stderr, " failed: %s\n", cm_strerror(rc));
    else fprintf(stderr, " %.1f GB/s\n", bw / 1e9);
    return rc ? 0 : bw;
}

/* ---- the prompt: the generator of shared/oracle/bench.mjs, in doubles as JavaScript computes it ---- */

static void make_prompt(int32_t *ids, int n, int rep, int32_t bos, int n_vocab) {
    double s = 12345 + rep;
    ids[0] = bos >= 0 ? bos : 1;
    for (int i = 1; i < n; i++) {
        s = fmod(s * 1103515245.0 + 12345.0, 2147483648.0);
        double r = s / 2147483648.0;
        ids[i] = 3 + (int32_t)floor(r * (double)(n_vocab - 3));
    }
}

/* ---- one cumulo rep ---- */

static int cumulo_rep(cm_engine *e, const bench_opts *o, int rep, speed *sp, energy *en) {
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    char err[512] = "";
    int32_t *ids = cm_malloc((size_t)o->n_prompt * sizeof *ids);
    if (!ids) return cli_fail("out of memory");
    make_prompt(ids, o->n_prompt, rep, in.bos, in.n_vocab);
    cm_session *s = cm_session_new(e, o->n_prompt + o->n_gen + 8, err, sizeof err);
    if (!s) {
        cm_free(ids);
        return cli_fail("cannot start a session: %s", err);
    }
    int status = 1;
    if (cm_session_set_prompt(s, ids, o->n_prompt, err, sizeof err)) {
        cli_fail("prompt evaluation failed: %s", err);
        goto done;
    }
    cm_timings t = cm_session_timings(s);
    sp->pp = t.prompt_s > 0 ? t.n_prompt / t.prompt_s : 0;
    cm_gen_params gp;
    cm_gen_params_default(&gp);
    gp.sampling.temperature = 0; /* greedy */
    gp.ignore_eos = true;
    /* n_gen + 1 samples take n_gen forward passes: the last sample is not evaluated. */
    gp.n_predict = o->n_gen + 1;
    cm_gen_result res;
    cm_power_sample p0 = {0}, p1 = {0};
    if (en->meter) cm_power_read(en->meter, &p0);
    if (cm_session_generate(s, &gp, NULL, NULL, &res, err, sizeof err)) {
        cli_fail("generation failed: %s", err);
        goto done;
    }
    int passes = res.t.n_gen - 1;
    if (en->meter && cm_power_read(en->meter, &p1) == 0 && passes > 0) {
        en->joules += p1.joules - p0.joules;
        en->seconds += res.t.gen_s;
        en->tokens += passes;
        en->measured = p1.measured;
        en->source = p1.source;
    }
    sp->tg = res.t.gen_s > 0 && passes > 0 ? passes / res.t.gen_s : 0;
    status = 0;
done:
    cm_session_free(s);
    cm_free(ids);
    return status;
}

/* ---- llama.cpp through node-llama-cpp ---- */

/* Run argv, collect its stdout (up to cap - 1 bytes); stderr passes through.
 * Returns the exit status, 128 + N when signal N killed it, or -1 when it
 * could not be started. */
static int run_capture(char *const argv[], char *out, size_t cap) {
    int fds[2];
    if (pipe(fds)) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc) {
        close(fds[0]);
        return -1;
    }
    size_t n = 0;
    for (;;) {
        char tmp[4096];
        ssize_t r = read(fds[0], tmp, sizeof tmp);
        if (r <= 0) break;
        size_t k = CM_MIN((size_t)r, cap - 1 - n);
        memcpy(out + n, tmp, k);
        n += k;
    }
    out[n] = 0;
    close(fds[0]);
    int st = 0;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 128;
}

/* Can llama.cpp run here? NULL if so, else why not. */
static const char *oracle_missing(const char *dir, char *why, size_t cap) {
    char p[1024], out[256];
    char *ver[] = {"node", "--version", NULL};
    if (run_capture(ver, out, sizeof out) != 0) return "node is not installed (not on PATH)";
    snprintf(p, sizeof p, "%s/node_modules/node-llama-cpp/package.json", dir);
    if (access(p, R_OK)) {
        snprintf(why, cap, "node-llama-cpp is not installed in '%s' (see shared/oracle/README.md)", dir);
        return why;
    }
    snprintf(p, sizeof p, "%s/bench.mjs", dir);
    if (access(p, R_OK)) {
        snprintf(why, cap, "'%s' is missing (copy shared/oracle/bench.mjs there)", p);
        return why;
    }
    return NULL;
}

static int llamacpp_rep(const bench_opts *o, speed *sp) {
    char script[1024], th[16], np[16], ng[16];
    snprintf(script, sizeof script, "%s/bench.mjs", o->oracle_dir);
    snprintf(th, sizeof th, "%d", o->threads);
    snprintf(np, sizeof np, "%d", o->n_prompt);
    snprintf(ng, sizeof ng, "%d", o->n_gen);
    char *argv[] = {"node", script, (char *)o->model, th, np, ng, "1", NULL};
    static char out[1 << 16];
    int rc = run_capture(argv, out, sizeof out);
    if (rc) return cli_fail("llama.cpp bench failed (node exit %d)", rc);
    /* The result is the last line that parses as JSON with the speeds. */
    char *line = NULL;
    for (char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (*p == '{') line = p;
    cJSON *j = line ? cJSON_Parse(line) : NULL;
    const cJSON *pp = cJSON_GetObjectItem(j, "pp_tokens_per_s"), *tg = cJSON_GetObjectItem(j, "tg_tokens_per_s");
    if (!cJSON_IsNumber(pp) || !cJSON_IsNumber(tg)) {
        cJSON_Delete(j);
        return cli_fail("llama.cpp bench printed no result");
    }
    sp->pp = pp->valuedouble;
    sp->tg = tg->valuedouble;
    cJSON_Delete(j);
    return 0;
}

/* llama-bench -o json: an array of tests; the one with n_gen 0 is the
 * prompt, the one with n_prompt 0 the decode; avg_ts is tokens/s. The load
 * mode it reports ("load_mode", an older build's "use_mmap") goes into
 * load (cap bytes), left as it is when it reports none. */
static int native_rep(const bench_opts *o, speed *sp, char *load, size_t cap) {
    char th[16], np[16], ng[16];
    snprintf(th, sizeof th, "%d", o->threads);
    snprintf(np, sizeof np, "%d", o->n_prompt);
    snprintf(ng, sizeof ng, "%d", o->n_gen);
    bool mapped = !strcmp(o->lb_load, "mmap");
    char *lm = !o->lb_flag ? NULL : !strcmp(o->lb_flag, "-lm") ? (mapped ? "mmap" : "none") : (mapped ? "1" : "0");
    // clang-format off
    char *argv[] = {(char *)o->llama_bench, "-m", (char *)o->model, "-t", th, "-p", np, "-n", ng, "-r", "1",
                    "-ctk", "f16", "-ctv", "f16", "-o", "json", (char *)o->lb_flag, lm, NULL};
    // clang-format on
    static char out[1 << 16];
    int rc = run_capture(argv, out, sizeof out);
    if (rc > 128)
        return cli_fail("llama-bench died of signal %d: '%s' (on an AMX CPU its AMX matmul may crash, "
                        "llama.cpp issue 20824: build the anchor without AMX, sh bench/llamacpp.sh noamx)",
                        rc - 128, o->llama_bench);
    if (rc) return cli_fail("llama-bench failed (exit %d): '%s'", rc, o->llama_bench);
    cJSON *j = cJSON_Parse(strchr(out, '[') ? strchr(out, '[') : out);
    sp->pp = sp->tg = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, j) {
        const cJSON *p = cJSON_GetObjectItem(t, "n_prompt"), *g = cJSON_GetObjectItem(t, "n_gen"),
                    *ts = cJSON_GetObjectItem(t, "avg_ts");
        if (!cJSON_IsNumber(p) || !cJSON_IsNumber(g) || !cJSON_IsNumber(ts)) continue;
        const cJSON *lm = cJSON_GetObjectItem(t, "load_mode"), *um = cJSON_GetObjectItem(t, "use_mmap");
        if (cJSON_IsString(lm)) snprintf(load, cap, "%s", lm->valuestring);
        else if (cJSON_IsBool(um)) snprintf(load, cap, "%s", cJSON_IsTrue(um) ? "mmap" : "none");
        if (g->valuedouble == 0) sp->pp = ts->valuedouble;
        else if (p->valuedouble == 0) sp->tg = ts->valuedouble;
    }
    cJSON_Delete(j);
    return sp->pp > 0 && sp->tg > 0 ? 0 : cli_fail("llama-bench printed no result");
}

/* Which option sets llama-bench's load mode, read from its --help: this
 * llama.cpp's `-lm, --load-mode <auto|none|mmap|...>`, an older one's
 * `-mmp, --mmap <0|1>`, else NULL (it runs with its default, the file
 * mapped). Why it matters: on a VM in session 22 the mapped anchor decoded
 * an F16 model at 2.27 tok/s and the same binary with -lm none at 5.81. */
static const char *native_load_flag(const char *llama_bench) {
    static char help[1 << 16];
    char *argv[] = {(char *)llama_bench, "--help", NULL};
    help[0] = 0;
    run_capture(argv, help, sizeof help);
    return strstr(help, "--load-mode") ? "-lm" : strstr(help, "--mmap") ? "-mmp" : NULL;
}

/* The kernels' knobs the load chose (model/tune_cache.c): where from
 * ("cache", "measured", "defaults", "off", "none"), the ms it cost, each
 * knob's value and, when measured, the best rep per candidate (ms per MiB
 * of weights for a decode gemv's knob, ms per call for a gemm's). */
static cJSON *tune_json(void) {
    cm_model_tune_info t;
    cm_model_tune_last(&t);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "source", t.source ? t.source : "not run");
    cJSON_AddNumberToObject(j, "ms", round(t.ms * 100) / 100);
    cJSON_AddNumberToObject(j, "cpu_ms", round(t.cpu_ms * 100) / 100);
    cJSON *kn = cJSON_AddObjectToObject(j, "knobs"), *ms = NULL;
    for (int i = 0; i < CM_TUNE_COUNT; i++) {
        const cm_tune_knob_info *ki = cm_tune_info(i);
        if (!t.used[i]) continue;
        cJSON_AddNumberToObject(kn, ki->name, t.value[i]);
        if (t.ns[i][0] <= 0) continue;
        if (!ms) ms = cJSON_AddObjectToObject(j, "measured_ms");
        cJSON *c = cJSON_AddObjectToObject(ms, ki->name);
        for (int k = 0; k < ki->n_cand; k++) {
            char v[16];
            snprintf(v, sizeof v, "%d", ki->cand[k]);
            cJSON_AddNumberToObject(c, v, round(t.ns[i][k] * 1e-3) / 1e3);
        }
    }
    return j;
}

/* This CPU as /proc/cpuinfo names it (vendor, family, model, the flags that
 * matter to the kernels), for the JSON; "unknown" where there is no such file. */
static cJSON *cpu_json(void) {
    static const char *const flags[] = {"avx2",     "fma",         "f16c",        "avx512f",  "avx512bw",
                                        "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8",
                                        "asimd",    "asimddp",     "i8mm",        "fphp",     "sve"};
    cJSON *c = cJSON_CreateObject();
    char vendor[64] = "unknown", name[128] = "unknown", fam[16] = "", model[16] = "", line[8192];
    cJSON *fl = cJSON_CreateArray();
    FILE *f = fopen("/proc/cpuinfo", "r");
    bool got_flags = false;
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1;
        while (*v == ' ') v++;
        v[strcspn(v, "\n")] = 0;
        if (!strncmp(line, "vendor_id", 9) || !strncmp(line, "CPU implementer", 15))
            snprintf(vendor, sizeof vendor, "%s", v);
        else if (!strncmp(line, "model name", 10)) snprintf(name, sizeof name, "%s", v);
        else if (!strncmp(line, "cpu family", 10)) snprintf(fam, sizeof fam, "%s", v);
        else if (!strncmp(line, "model\t", 6) || !strncmp(line, "CPU part", 8)) snprintf(model, sizeof model, "%s", v);
        else if (!got_flags && (!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8))) {
            got_flags = true;
            for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
                size_t n = strlen(flags[i]);
                for (const char *q = v; (q = strstr(q, flags[i])) != NULL; q += n)
                    if ((q == v || q[-1] == ' ') && (q[n] == ' ' || q[n] == 0)) {
                        cJSON_AddItemToArray(fl, cJSON_CreateString(flags[i]));
                        break;
                    }
            }
        }
    }
    if (f) fclose(f);
    cJSON_AddStringToObject(c, "vendor", vendor);
    cJSON_AddStringToObject(c, "name", name);
    cJSON_AddStringToObject(c, "family", fam);
    cJSON_AddStringToObject(c, "model", model);
    cJSON_AddNumberToObject(c, "cpus", cm_cpu_count());
    cJSON_AddItemToObject(c, "flags", fl);
    return c;
}

/* ---- output ---- */

static double ratio(double a, double b) { return a > 0 && b > 0 ? a / b : 0; }

static cJSON *runs_array(const speed *runs, int n, bool tg) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(round((tg ? runs[i].tg : runs[i].pp) * 100) / 100));
    return a;
}

static int parse(int argc, char **argv, bench_opts *o) {
    const cm_config *c = cm_config_get();
    *o = (bench_opts){.threads = 0,
                      .n_prompt = 128,
                      .n_gen = 64,
                      .reps = 3,
                      .bw_mib = 1024,
                      .oracle_dir = c->oracle_dir,
                      .llama_bench = c->llamacpp_bench,
                      .clo = {.accept = CLI_CLUSTER_BENCH}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        int kr;
        if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!cli_int(a, v, 1, 1024, &l)) return 1;
            o->threads = (int)l, i++;
        } else if (!strcmp(a, "--prompt")) {
            if (!cli_int(a, v, 1, 65536, &l)) return 1;
            o->n_prompt = (int)l, i++;
        } else if (!strcmp(a, "--gen")) {
            /* (--prompt: up to 65536 for decode after a long context) */
            if (!cli_int(a, v, 1, 4096, &l)) return 1;
            o->n_gen = (int)l, i++;
        } else if (!strcmp(a, "--reps")) {
            if (!cli_int(a, v, 1, 1000, &l)) return 1;
            o->reps = (int)l, i++;
        } else if (!strcmp(a, "--bw-mib")) {
            if (!cli_int(a, v, 1, 1 << 20, &l)) return 1;
            o->bw_mib = (int)l, i++;
        } else if (!strcmp(a, "--isa")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            if (strcmp(v, "scalar") && strcmp(v, "avx2") && strcmp(v, "avx512") && strcmp(v, "neon"))
                return cli_fail("option '--isa': '%s' is not one of scalar, avx2, avx512, neon", v);
            o->isa = v, i++;
        } else if (!strcmp(a, "--mmap")) {
            o->mmap = true;
        } else if ((kr = cli_kv_opt(argc, argv, &i, &o->kvo)) != 0 ||
                   (kr = cli_gpu_opt(argc, argv, &i, &o->gpuo)) != 0 ||
                   (kr = cli_cluster_opt(argc, argv, &i, &o->clo)) != 0) {
            if (kr < 0) return 1;
        } else if (!strcmp(a, "--oracle-dir")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            o->oracle_dir = v, i++;
        } else if (!strcmp(a, "--llamacpp-bench")) {
            if (!v) return cli_fail("option '%s' needs a value", a);
            o->llama_bench = v, i++;
        } else if (!strcmp(a, "--vs-llamacpp")) {
            o->vs = true;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (a[0] == '-' && a[1]) {
            return cli_fail("unknown option '%s'; run 'cumulo bench --help'", a);
        } else if (!o->model) {
            o->model = a;
        } else {
            return cli_fail("more than one model given ('%s' and '%s')", o->model, a);
        }
    }
    if (!o->model) return cli_fail("no model given; usage: cumulo bench MODEL.gguf [options]");
    if (!(o->model = cli_model_path(o->model))) return 1;
    if (o->n_prompt + o->n_gen + 8 > (1 << 20))
        return cli_fail("--prompt + --gen is too long (at most %d tokens together)", (1 << 20) - 8);
    if (cli_cluster_check(&o->clo)) return 1;
    if (o->threads == 0) o->threads = cm_cpu_count() > 0 ? cm_cpu_count() : 1;
    return 0;
}

/* The JSON's anchor label for a llama-bench binary: bench/llamacpp.sh builds
 * into CACHE/BUILD/bin/, and its builds other than "native" say what they
 * leave out; any other path is taken as a native build. */
static const char *anchor_label(const char *path) {
    static const struct {
        const char *dir, *label;
    } builds[] = {{"/noamx/bin/llama-bench", "llama-bench (native build without AMX)"},
                  {"/avx2/bin/llama-bench", "llama-bench (AVX2-only build)"}};
    size_t n = strlen(path);
    for (size_t i = 0; i < sizeof builds / sizeof builds[0]; i++) {
        size_t m = strlen(builds[i].dir);
        if (n >= m && !strcmp(path + n - m, builds[i].dir)) return builds[i].label;
    }
    return "llama-bench (native build)";
}

int cmd_bench(int argc, char **argv) {
    if (cli_help(argc, argv, k_bench_usage, CLI_CLUSTER_BENCH)) return 0;
    bench_opts o;
    if (parse(argc, argv, &o)) return 1;
    /* The kernel table is chosen once, at the first kernels call: cap it before. */
    if (o.isa && setenv("CUMULO_ISA", o.isa, 1)) return cli_fail("cannot set CUMULO_ISA");
    if (o.isa) cm_config_reload(); /* no thread runs yet */
    if (o.isa && !cm_kernels_for(o.isa)) return cli_fail("this CPU or build has no '%s' kernels", o.isa);

    char err[512] = "";
    uint64_t bpt = 0, wbytes = 0;
    if (bytes_per_token(o.model, &bpt, &wbytes, err, sizeof err)) return cli_fail("%s", err);

    char why[1200];
    const char *skip = NULL, *anchor = NULL;
    if (o.vs && o.llama_bench) {
        if (access(o.llama_bench, X_OK) == 0) anchor = anchor_label(o.llama_bench);
        else
            fprintf(stderr,
                    "bench: llama-bench '%s' is not there (bench/llamacpp.sh builds it); trying node-llama-cpp\n",
                    o.llama_bench);
    }
    if (o.vs && !anchor) {
        skip = oracle_missing(o.oracle_dir, why, sizeof why);
        if (!skip) {
            anchor = "node-llama-cpp (fallback: prebuilt llama.cpp)";
            o.llama_bench = NULL;
        }
    }
    if (skip) fprintf(stderr, "bench: skipping llama.cpp: %s\n", skip);
    bool vs = o.vs && !skip;
    if (vs && o.llama_bench) o.lb_flag = native_load_flag(o.llama_bench);

    double bw_before = measure_bw(o.threads, o.bw_mib, "before");

    cm_engine *e = NULL;
    cm_engine_opts eo = {.n_threads = o.threads,
                         .n_ctx = o.n_prompt + o.n_gen + 8,
                         .n_batch = CM_MIN(o.n_prompt, CM_BATCH_MAX),
                         .kv_f16 = o.kv_f16,
                         .mmap = o.mmap};
    cli_kv_apply(&o.kvo, &eo);
    cli_gpu_apply(&o.gpuo, &eo);
    cli_cluster_apply(&o.clo, &eo);
    if (cm_engine_load(&e, o.model, &eo, err, sizeof err)) return cli_fail("%s", err);
    cm_engine_info in;
    cm_engine_get_info(e, &in);
    /* "avx512+amx" where the q4_0/q8_0 prefill gemms use AMX tiles */
    char kname[48];
    snprintf(kname, sizeof kname, "%s%s", cm_kernels_get()->name,
             !strcmp(cm_kernels_get()->name, "avx512") && !*cm_kernels_amx_why() ? "+amx" : "");
    /* The anchor's weights where cumulo's are (memory unless mapped), when it can be told. */
    o.lb_load = !o.llama_bench || !o.lb_flag ? "default" : in.weights_in_memory ? "none" : "mmap";
    if (vs) {
        fprintf(stderr, "bench: llama.cpp anchor: %s%s%s, load mode %s\n", anchor, o.llama_bench ? " " : "",
                o.llama_bench ? o.llama_bench : "", o.lb_load);
        if (o.llama_bench && !o.lb_flag)
            fprintf(stderr,
                    "bench: llama-bench '%s' has neither -lm nor -mmp in its --help: it runs with its default "
                    "load mode (the file mapped)%s\n",
                    o.llama_bench, in.weights_in_memory ? ", cumulo's weights are in memory: not like-for-like" : "");
    }
    if (in.n_stages > 1 || o.clo.on)
        fprintf(stderr,
                "bench: cluster: %d stage%s, %d layer%s on this machine; power, joules/token and the "
                "roofline count this machine only\n",
                in.n_stages, in.n_stages == 1 ? "" : "s", in.local_layers, in.local_layers == 1 ? "" : "s");
    fprintf(stderr, "bench: %s (%s, %.1f M params, %.2f GB weights), %d thread%s, kernels %s\n", in.name, in.arch,
            in.n_params / 1e6, wbytes / 1e9, o.threads, o.threads == 1 ? "" : "s", kname);
    if (!strcmp(cm_kernels_get()->name, "avx512") && *cm_kernels_amx_why())
        fprintf(stderr, "bench: no AMX: %s\n", cm_kernels_amx_why());
    {
        cm_model_tune_info t;
        cm_model_tune_last(&t);
        char kv[256] = "";
        size_t o2 = 0;
        for (int i = 0; i < CM_TUNE_COUNT && o2 < sizeof kv; i++)
            if (t.used[i]) o2 += (size_t)snprintf(kv + o2, sizeof kv - o2, " %s=%d", cm_tune_info(i)->name, t.value[i]);
        fprintf(stderr, "bench: kernel knobs: %s (%.1f ms)%s\n", t.source ? t.source : "not run", t.ms, kv);
    }

    speed *runs = cm_calloc((size_t)o.reps * 2, sizeof *runs), best = {0, 0}, lbest = {0, 0};
    /* Power of this machine while cumulo decodes: RAPL when readable, else an
     * estimate (CPU load of the whole machine x 65 W), labelled as such. */
    energy en = {.meter = cm_power_open(0)};
    if (!runs) {
        cm_engine_free(e);
        return cli_fail("out of memory");
    }
    speed *lruns = runs + o.reps;
    char lb_seen[32] = ""; /* the load mode llama-bench says it ran with */
    int status = 1;
    for (int r = 0; r < o.reps; r++) {
        if (cumulo_rep(e, &o, r, &runs[r], &en)) goto done;
        best.pp = CM_MAX(best.pp, runs[r].pp);
        best.tg = CM_MAX(best.tg, runs[r].tg);
        fprintf(stderr, "bench: rep %d/%d  cumulo     prompt %8.2f tok/s  decode %7.2f tok/s\n", r + 1, o.reps,
                runs[r].pp, runs[r].tg);
        if (vs) {
            if (o.llama_bench ? native_rep(&o, &lruns[r], lb_seen, sizeof lb_seen) : llamacpp_rep(&o, &lruns[r]))
                goto done;
            lbest.pp = CM_MAX(lbest.pp, lruns[r].pp);
            lbest.tg = CM_MAX(lbest.tg, lruns[r].tg);
            fprintf(stderr, "bench: rep %d/%d  llama.cpp  prompt %8.2f tok/s  decode %7.2f tok/s\n", r + 1, o.reps,
                    lruns[r].pp, lruns[r].tg);
        }
    }
    if (*lb_seen && strcmp(lb_seen, o.lb_load)) {
        fprintf(stderr, "bench: llama-bench reports load mode '%s' (asked for: %s)\n", lb_seen, o.lb_load);
        o.lb_load = lb_seen;
    }
    /* The cluster's traffic from this machine, per token row it evaluated. */
    uint64_t td = 0, tw = 0, top = 0, trows = 0, hb = 0, hf = 0, hrows = 0;
    bool have_tp = cm_engine_tp_stats(e, &td, &tw, &top, &trows);
    bool have_hop = cm_engine_hop_stats(e, &hb, &hf, &hrows);
    if (have_tp && trows == 0) trows = hrows; /* hybrid: rows counted on the hop */
    if (have_tp && trows)
        fprintf(stderr,
                "bench: all-reduce from this machine: %.0f element bytes, %.0f bytes on the wire per token (%s)\n",
                (double)td / (double)trows, (double)tw / (double)trows, o.clo.tp_compress ? "Q8_0" : "f32");
    if (have_hop && hrows)
        fprintf(stderr, "bench: hidden states to stage 1: %.0f bytes on the wire per token\n",
                (double)hb / (double)hrows);
    cm_engine_free(e);
    e = NULL;
    double bw_after = measure_bw(o.threads, o.bw_mib, "after");
    double bw = CM_MAX(bw_before, bw_after);
    double roof = bw > 0 ? bw / (double)bpt : 0;
    double pct = roof > 0 ? 100 * best.tg / roof : 0, lpct = roof > 0 ? 100 * lbest.tg / roof : 0;
    double jpt = en.tokens > 0 ? cm_power_joules_per_token(en.joules, en.tokens) : 0;
    double watts = en.seconds > 0 ? en.joules / en.seconds : 0;
    double tpw = cm_power_tokens_per_watt(best.tg, watts);
    const char *plabel = !en.meter || en.tokens <= 0 ? "unknown" : en.measured ? "measured" : "estimated";
    const char *base = strrchr(o.model, '/');
    base = base ? base + 1 : o.model;

    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "engine", "cumulo");
        cJSON_AddStringToObject(j, "model", base);
        cJSON_AddStringToObject(j, "arch", in.arch);
        cJSON_AddNumberToObject(j, "n_params", (double)in.n_params);
        cJSON_AddStringToObject(j, "kernels", kname);
        cJSON_AddItemToObject(j, "cpu", cpu_json());
        cJSON_AddItemToObject(j, "tune", tune_json());
        cJSON_AddNumberToObject(j, "threads", o.threads);
        cJSON_AddStringToObject(j, "kv_type", o.kvo.set ? cli_kv_name(&o.kvo) : o.kv_f16 ? "f16" : "f32");
        cJSON_AddBoolToObject(j, "flash_attn", !o.kvo.no_flash);
        cJSON_AddNumberToObject(j, "n_prompt", o.n_prompt);
        cJSON_AddNumberToObject(j, "n_gen", o.n_gen);
        cJSON_AddNumberToObject(j, "reps", o.reps);
        cJSON_AddNumberToObject(j, "pp_tokens_per_s", round(best.pp * 100) / 100);
        cJSON_AddNumberToObject(j, "tg_tokens_per_s", round(best.tg * 100) / 100);
        cJSON_AddItemToObject(j, "pp_runs", runs_array(runs, o.reps, false));
        cJSON_AddItemToObject(j, "tg_runs", runs_array(runs, o.reps, true));
        cJSON_AddNumberToObject(j, "weight_bytes", (double)wbytes);
        cJSON_AddStringToObject(j, "weights", in.weights_in_memory ? "memory" : "mmap");
        cJSON_AddNumberToObject(j, "bytes_per_token", (double)bpt);
        cJSON_AddNumberToObject(j, "read_bw_before_gbs", round(bw_before / 1e7) / 100);
        cJSON_AddNumberToObject(j, "read_bw_after_gbs", round(bw_after / 1e7) / 100);
        cJSON_AddNumberToObject(j, "read_bw_gbs", round(bw / 1e7) / 100);
        cJSON_AddNumberToObject(j, "roofline_tokens_per_s", round(roof * 100) / 100);
        cJSON_AddNumberToObject(j, "tg_roofline_pct", round(pct * 10) / 10);
        if (vs) {
            cJSON *l = cJSON_AddObjectToObject(j, "llamacpp");
            cJSON_AddStringToObject(l, "anchor", anchor);
            if (o.llama_bench) cJSON_AddStringToObject(l, "path", o.llama_bench);
            cJSON_AddNumberToObject(l, "pp_tokens_per_s", lbest.pp);
            cJSON_AddNumberToObject(l, "tg_tokens_per_s", lbest.tg);
            cJSON_AddItemToObject(l, "pp_runs", runs_array(lruns, o.reps, false));
            cJSON_AddItemToObject(l, "tg_runs", runs_array(lruns, o.reps, true));
            cJSON_AddNumberToObject(l, "tg_roofline_pct", round(lpct * 10) / 10);
            cJSON_AddNumberToObject(j, "pp_ratio", round(ratio(best.pp, lbest.pp) * 1000) / 1000);
            cJSON_AddNumberToObject(j, "tg_ratio", round(ratio(best.tg, lbest.tg) * 1000) / 1000);
        } else if (o.vs) {
            cJSON_AddStringToObject(j, "llamacpp_skipped", skip);
        }
        if (vs) cJSON_AddStringToObject(j, "llamacpp_load", o.lb_load);
        if (have_tp && trows) {
            cJSON_AddNumberToObject(j, "tp_data_bytes_per_token", round((double)td / (double)trows));
            cJSON_AddNumberToObject(j, "tp_wire_bytes_per_token", round((double)tw / (double)trows));
        }
        if (have_hop && hrows)
            cJSON_AddNumberToObject(j, "hop_wire_bytes_per_token", round((double)hb / (double)hrows));
        cJSON_AddStringToObject(j, "power", plabel);
        if (jpt > 0) {
            cJSON_AddStringToObject(j, "power_source", en.source ? en.source : "");
            cJSON_AddNumberToObject(j, "decode_watts", round(watts * 10) / 10);
            cJSON_AddNumberToObject(j, "joules_per_token", round(jpt * 1000) / 1000);
            cJSON_AddNumberToObject(j, "tokens_per_watt", round(tpw * 1000) / 1000);
        } else {
            cJSON_AddNullToObject(j, "joules_per_token");
        }
        cli_json_print(j, false);
    } else {
        printf("model      %s (%s, %.1f M params), %d thread%s, kernels %s, kv %s\n", base, in.arch, in.n_params / 1e6,
               o.threads, o.threads == 1 ? "" : "s", kname,
               o.kvo.set  ? cli_kv_name(&o.kvo)
               : o.kv_f16 ? "f16"
                          : "f32");
        printf("run        prompt %d tokens, gen %d tokens, best of %d rep%s%s\n", o.n_prompt, o.n_gen, o.reps,
               o.reps == 1 ? "" : "s", vs ? ", cumulo and llama.cpp interleaved" : "");
        printf("%-32s %14s %14s %12s\n", "", "prompt tok/s", "decode tok/s", "% roofline");
        printf("%-32s %14.2f %14.2f %11.1f%%\n", "cumulo", best.pp, best.tg, pct);
        if (vs) {
            char label[64] = "llama.cpp (node, fallback)";
            if (o.llama_bench) snprintf(label, sizeof label, "llama.cpp (native, load %s)", o.lb_load);
            printf("%-32s %14.2f %14.2f %11.1f%%\n", label, lbest.pp, lbest.tg, lpct);
            printf("%-32s %14.3f %14.3f\n", "ratio cumulo / llama.cpp", ratio(best.pp, lbest.pp),
                   ratio(best.tg, lbest.tg));
        } else if (o.vs) {
            printf("llama.cpp  skipped: %s\n", skip);
        }
        printf("weights    %.3f GB read per decoded token (of %.3f GB), %s\n", bpt / 1e9, wbytes / 1e9,
               in.weights_in_memory ? "read into huge-page memory" : "mapped from the file");
        printf("bandwidth  %.1f GB/s read (before %.1f, after %.1f; %d MiB, %d thread%s) -> roofline %.2f tok/s\n",
               bw / 1e9, bw_before / 1e9, bw_after / 1e9, o.bw_mib, o.threads, o.threads == 1 ? "" : "s", roof);
        if (jpt > 0)
            printf("power      %s: %.1f W while cumulo decodes, %.3f J/token, %.3f tokens per W·s%s\n", plabel, watts,
                   jpt, tpw, en.measured ? " (RAPL)" : " (machine-wide CPU load x 65 W, not a measurement)");
        else printf("power      unknown\n");
    }
    status = 0;
done:
    cm_power_close(en.meter);
    cm_engine_free(e);
    cm_free(runs);
    return status;
}
