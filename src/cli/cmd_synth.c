/*
 * cmd_synth.c: `cumulo synth`: write a random-weight model of a given
 * architecture, shape and tensor type (src/synth does the work). For tests,
 * demos and benchmarks without downloads: its output is noise, but its
 * metadata, tensor names, shapes and types are those of a real GGUF, and
 * llama.cpp loads it.
 */
#include "cli.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "os/os.h"
#include "synth/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: cumulo synth --arch ARCH --dim D --layers L --heads H --kv-heads K --ffn F\n"
        "                    --type T --vocab VOCAB.gguf --seed S -o OUT.gguf [options]\n\n"
        "Write a random-weight model with the keys, tensor names, shapes and types a real GGUF\n"
        "of that architecture has (llama.cpp loads it). Deterministic by seed: the same\n"
        "arguments give the same bytes on any machine and thread count.\n\n"
        "  --arch ARCH          llama, qwen2 (QKV bias), qwen3 (Q/K norm), qwen2moe, qwen3moe,\n"
        "                       gemma3 (sliding window, Q/K norm, post-norms, GELU), phi3\n"
        "                       (fused qkv and gate/up) or gpt-oss (experts with biases, sinks,\n"
        "                       YaRN; --type mxfp4: MXFP4 experts, Q8_0 elsewhere)\n"
        "  --experts N          mixture of experts (qwen*moe, gpt-oss; llama with experts = Mixtral)\n"
        "  --experts-used K     experts per token (top-k)\n"
        "  --hot-expert E       skew the router: expert E's row scaled by 40 in every layer (replication tests)\n"
        "  --hot-from L         ... only in layers L and later (a later pipeline stage's hot expert)\n"
        "  --expert-ffn F       width of each expert (qwen*moe, gpt-oss; default --ffn)\n"
        "  --shared-ffn F       width of qwen2moe's shared expert (default --ffn)\n"
        "  --variant V          deepseek2: v3 (q LoRA, sigmoid routing, bias, groups), v3yarn (v3 + YaRN), lite (V2-Lite);\n"
        "                       v3kvb, litekvb: v3 or lite with the unsplit attn_kv_b of older GGUFs\n"
        "  --dim D              embedding size (a multiple of 256 for K-quants, 32 otherwise)\n"
        "  --layers L           transformer blocks\n"
        "  --heads H            attention heads (D/H is the head size)\n"
        "  --kv-heads K         key/value heads (divides H)\n"
        "  --ffn F              feed-forward size (multiple of 256 / 32 like D)\n"
        "  --type T             %s\n"
        "                       (q4_k_m mixes Q4_K and Q6_K the way llama-quantize does,\n"
        "                       q5_k_m Q5_K and Q6_K)\n"
        "  --vocab FILE         GGUF whose tokenizer.* keys are copied (e.g. a ggml-vocab-*.gguf);\n"
        "                       builtin: a small vocabulary of cumulo's own (characters and\n"
        "                       common words; for demos without files, never for references)\n"
        "  --seed S             random seed (default 1)\n"
        "  -o, --output FILE    the model to write\n"
        "  --tied               no output.weight: the head reuses token_embd\n"
        "  --swa N              gemma3, gpt-oss: sliding window of N positions (default 8)\n"
        "  --rope-scaling S     llama3: Llama 3.1 RoPE scaling (writes rope_freqs.weight);\n"
        "                       linear, yarn, none: writes rope.scaling.type and the keys below\n"
        "  --rope-factor F      rope.scaling.factor (with linear or yarn)\n"
        "  --rope-orig-ctx N    rope.scaling.original_context_length\n"
        "  --rope-attn-factor F rope.scaling.attn_factor\n"
        "  --yarn-beta-fast F, --yarn-beta-slow F, --yarn-log-mul F\n"
        "                       rope.scaling.yarn_beta_fast / _slow / yarn_log_multiplier\n"
        "                       (llama.cpp reads these for some architectures only)\n"
        "  --rope-base B        RoPE base (default: llama 10000, llama3 scaling 500000, qwen 1e6)\n"
        "  --ctx N              context_length key (default 4096)\n"
        "  --threads N          threads (default: all CPUs; never changes the output)\n\n"
        "usage: cumulo synth --lora-for MODEL.gguf --rank R [--alpha A] [--strength S] [--only NAME]\n"
        "                    [--seed S] -o ADAPTER.gguf\n"
        "A random LoRA adapter (llama.cpp's adapter GGUF, F32) for every attn_q/k/v/output,\n"
        "ffn_gate/up/down and output weight of MODEL (or those whose name contains NAME);\n"
        "(alpha/rank) B A has S times each weight's RMS (default alpha = rank, S = 0.3).\n",
        cm_synth_type_names());
}

static void progress_cb(void *ctx, uint64_t done, uint64_t total) {
    cli_progress *p = ctx;
    p->total = (double)total;
    cli_progress_update(p, (double)done);
}

int cmd_synth(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    cm_synth_params p = {.seed = 1};
    const char *vocab_path = NULL, *out_path = NULL;
    long dim = 0, layers = 0, heads = 0, kv = 0, ffn = 0, ctx = 0, threads = 0, seed = 1, swa = 0;
    long n_exp = 0, n_used = 0, ffn_exp = 0, ffn_sh = 0, hot = -1, hot_from = 0;
    double base = 0, alpha = -1, strength = 0.3;
    const char *lora_for = NULL, *only = NULL;
    long rank = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define STR(dst)                                                 \
    do {                                                         \
        if (!v) return cli_fail("option '%s' needs a value", a); \
        dst = v;                                                 \
        i++;                                                     \
    } while (0)
#define INT(dst, lo, hi)                            \
    do {                                            \
        if (!cli_int(a, v, lo, hi, &dst)) return 1; \
        i++;                                        \
    } while (0)
        if (!strcmp(a, "--arch")) STR(p.arch);
        else if (!strcmp(a, "--type")) STR(p.type);
        else if (!strcmp(a, "--variant")) STR(p.variant);
        else if (!strcmp(a, "--vocab")) STR(vocab_path);
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) STR(out_path);
        else if (!strcmp(a, "--dim")) INT(dim, 1, 1 << 16);
        else if (!strcmp(a, "--layers")) INT(layers, 1, 1024);
        else if (!strcmp(a, "--heads")) INT(heads, 1, 1024);
        else if (!strcmp(a, "--kv-heads")) INT(kv, 1, 1024);
        else if (!strcmp(a, "--ffn")) INT(ffn, 1, 1 << 18);
        else if (!strcmp(a, "--ctx")) INT(ctx, 1, 1 << 24);
        else if (!strcmp(a, "--experts")) INT(n_exp, 1, 256);
        else if (!strcmp(a, "--experts-used")) INT(n_used, 1, 256);
        else if (!strcmp(a, "--hot-expert")) INT(hot, 0, 255);
        else if (!strcmp(a, "--hot-from")) INT(hot_from, 0, 1024);
        else if (!strcmp(a, "--expert-ffn")) INT(ffn_exp, 1, 1 << 18);
        else if (!strcmp(a, "--shared-ffn")) INT(ffn_sh, 1, 1 << 18);
        else if (!strcmp(a, "--threads")) INT(threads, 1, 1024);
        else if (!strcmp(a, "--seed")) INT(seed, 0, 0x7fffffffL);
        else if (!strcmp(a, "--tied")) p.tied = true;
        else if (!strcmp(a, "--lora-for")) STR(lora_for);
        else if (!strcmp(a, "--only")) STR(only);
        else if (!strcmp(a, "--rank")) INT(rank, 1, 1024);
        else if (!strcmp(a, "--alpha")) {
            if (!cli_float(a, v, 0, 1e6, &alpha)) return 1;
            i++;
        } else if (!strcmp(a, "--strength")) {
            if (!cli_float(a, v, 0, 1e3, &strength)) return 1;
            i++;
        } else if (!strcmp(a, "--swa")) INT(swa, 1, 1 << 24);
        else if (!strcmp(a, "--rope-base")) {
            if (!cli_float(a, v, 1, 1e9, &base)) return 1;
            i++;
        } else if (!strcmp(a, "--rope-scaling")) {
            const char *s;
            STR(s);
            if (strcmp(s, "llama3") && strcmp(s, "none") && strcmp(s, "linear") && strcmp(s, "yarn"))
                return cli_fail("unknown rope scaling '%s' (supported: llama3, linear, yarn, none)", s);
            p.rope_llama3 = !strcmp(s, "llama3");
            if (!p.rope_llama3) p.rope_scaling = s;
        } else if (!strcmp(a, "--rope-factor") || !strcmp(a, "--rope-attn-factor") || !strcmp(a, "--yarn-beta-fast") ||
                   !strcmp(a, "--yarn-beta-slow") || !strcmp(a, "--yarn-log-mul")) {
            double f;
            if (!cli_float(a, v, 1e-6, 1e6, &f)) return 1;
            i++;
            float *dst = !strcmp(a, "--rope-factor")        ? &p.rope_factor
                         : !strcmp(a, "--rope-attn-factor") ? &p.rope_attn_factor
                         : !strcmp(a, "--yarn-beta-fast")   ? &p.yarn_beta_fast
                         : !strcmp(a, "--yarn-beta-slow")   ? &p.yarn_beta_slow
                                                            : &p.yarn_log_mul;
            *dst = (float)f;
        } else if (!strcmp(a, "--rope-orig-ctx")) {
            long oc;
            if (!cli_int(a, v, 1, 1 << 30, &oc)) return 1;
            i++;
            p.rope_orig_ctx = (int)oc;
        } else return cli_fail("unknown option '%s'; run 'cumulo synth --help'", a);
#undef STR
#undef INT
    }
    if (lora_for) {
        if (!rank) return cli_fail("--lora-for needs --rank R");
        if (!out_path) return cli_fail("missing -o ADAPTER.gguf");
        cm_synth_lora_params lp = {.rank = (int)rank,
                                   .alpha = alpha < 0 ? (float)rank : (float)alpha,
                                   .strength = (float)strength,
                                   .seed = (uint64_t)seed,
                                   .only = only};
        char e2[512];
        cm_gguf mg;
        if (cm_gguf_open(&mg, lora_for, NULL, NULL, e2, sizeof e2)) return cli_fail("%s", e2);
        int rc = cm_synth_lora_write(&lp, &mg, out_path, NULL, e2, sizeof e2);
        cm_gguf_close(&mg);
        if (rc) return cli_fail("%s", e2);
        fprintf(stderr, "wrote '%s' (LoRA rank %d, alpha %g)\n", out_path, lp.rank, lp.alpha);
        return 0;
    }
    if (!p.arch)
        return cli_fail("missing --arch (llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, phi3, gpt-oss or deepseek2)");
    if (!p.type) return cli_fail("missing --type (%s)", cm_synth_type_names());
    if (!dim || !layers || !heads || !ffn) return cli_fail("missing --dim, --layers, --heads or --ffn");
    if (!vocab_path)
        return cli_fail("missing --vocab (a GGUF with a tokenizer, e.g. ggml-vocab-llama-spm.gguf, or builtin)");
    if (!out_path) return cli_fail("missing -o OUT.gguf");
    p.n_embd = (int)dim;
    p.n_layer = (int)layers;
    p.n_head = (int)heads;
    p.n_head_kv = kv ? (int)kv : (int)heads;
    p.n_ff = (int)ffn;
    p.n_expert = (int)n_exp;
    p.n_expert_used = (int)n_used;
    p.hot_expert = (int)hot + 1; /* 0: none */
    p.hot_first_layer = (int)hot_from;
    p.n_ff_exp = (int)ffn_exp;
    p.n_ff_shexp = (int)ffn_sh;
    p.n_ctx = (int)ctx;
    p.n_swa = (int)swa;
    p.n_threads = (int)threads;
    p.seed = (uint64_t)seed;
    p.rope_base = (float)base;
    char err[512];
    if (cm_synth_check(&p, err, sizeof err)) return cli_fail("%s", err);

    cm_gguf vocab;
    memset(&vocab, 0, sizeof vocab);
    cm_buf builtin; /* the bytes vocab points into, for --vocab builtin */
    cm_buf_init(&builtin);
    if (!strcmp(vocab_path, "builtin")) {
        if (cm_synth_builtin_vocab(&builtin, err, sizeof err) ||
            cm_gguf_parse(&vocab, (const uint8_t *)builtin.data, builtin.len, err, sizeof err)) {
            cm_buf_release(&builtin);
            return cli_fail("builtin vocabulary: %s", err);
        }
    } else if (cm_gguf_open(&vocab, vocab_path, NULL, NULL, err, sizeof err)) return cli_fail("%s", err);
    cli_progress bar;
    cli_progress_start(&bar, "synth", 1);
    p.progress = progress_cb;
    p.progress_ctx = &bar;
    double t0 = cm_now_s();
    int rc = cm_synth_write(&p, &vocab, out_path, NULL, err, sizeof err);
    cli_progress_end(&bar);
    cm_gguf_close(&vocab);
    cm_buf_release(&builtin);
    if (rc) return cli_fail("%s", err);
    fprintf(stderr, "wrote '%s' (%s %s, %.1f s)\n", out_path, p.arch, p.type, cm_now_s() - t0);
    return 0;
}
