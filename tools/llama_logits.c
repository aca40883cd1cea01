/*
 * llama_logits.c: a second llama.cpp opinion on a real model, for
 * tools/real_spread.sh (how far llama.cpp's own builds and paths disagree
 * with the node-llama-cpp reference in tests/data/real/MODEL.json). Greedy
 * decoding as tools/real_oracle.mjs does it (the prompt as one batch, then one
 * token per decode; F32 KV cache, no flash attention, 1 thread unless
 * $LC_THREADS), every step's full logits appended to OUTDIR/logits.bin, the
 * greedy ids on stdout. With dumpsteps > 0 the F32 tensors of the first
 * dumpsteps decodes (the graph's names: attn_norm-3, kqv_out-3, l_out-3 ...)
 * go to OUTDIR/tNNNNN.bin, listed in OUTDIR/index.txt (step name ne0 ne1 ne2
 * ne3 file), to find the layer where two runs part. Not part of the build or
 * of `make test`: it links a native llama.cpp build's static libraries
 * (bench/llamacpp.sh builds one); written against llama.h only.
 *
 * usage: llama_logits MODEL IDS NGEN OUTDIR [repack=1] [onebyone=0] [dumpsteps=0]
 *   IDS: comma-separated prompt token ids; repack 0: no weight repacking
 *   (llama.cpp's use_extra_bufts off: its plain vec_dot and gemm paths);
 *   onebyone 1: the prompt one token per decode.
 */
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_dir;
static int g_step, g_dumpsteps, g_seq;
static FILE *g_index;

static bool cb(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    if (ask) return g_step < g_dumpsteps;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    size_t n = ggml_nbytes(t);
    void *buf = malloc(n);
    ggml_backend_tensor_get(t, buf, 0, n);
    char fn[512];
    snprintf(fn, sizeof fn, "%s/t%05d.bin", g_dir, g_seq);
    FILE *f = fopen(fn, "wb");
    if (f) {
        fwrite(buf, 1, n, f);
        fclose(f);
    }
    free(buf);
    fprintf(g_index, "%d %s %lld %lld %lld %lld t%05d.bin\n", g_step, t->name, (long long)t->ne[0], (long long)t->ne[1],
            (long long)t->ne[2], (long long)t->ne[3], g_seq);
    g_seq++;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: llama_logits MODEL IDS NGEN OUTDIR [repack] [onebyone] [dumpsteps]\n");
        return 2;
    }
    const char *model = argv[1];
    int ngen = atoi(argv[3]);
    g_dir = argv[4];
    int repack = argc > 5 ? atoi(argv[5]) : 1, onebyone = argc > 6 ? atoi(argv[6]) : 0;
    g_dumpsteps = argc > 7 ? atoi(argv[7]) : 0;
    int nthreads = getenv("LC_THREADS") ? atoi(getenv("LC_THREADS")) : 1;
    llama_token toks[4096];
    int n = 0;
    for (char *s = argv[2]; *s && n < 4096;) {
        toks[n++] = (llama_token)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    char ip[512];
    snprintf(ip, sizeof ip, "%s/index.txt", g_dir);
    g_index = fopen(ip, "w");
    if (!g_index) return fprintf(stderr, "llama_logits: cannot write '%s'\n", ip), 1;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = repack != 0;
    struct llama_model *m = llama_model_load_from_file(model, mp);
    if (!m) return fprintf(stderr, "llama_logits: cannot load '%s'\n", model), 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 1024;
    cp.n_ubatch = 512;
    cp.n_threads = nthreads;
    cp.n_threads_batch = nthreads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.cb_eval = cb;
    cp.cb_eval_user_data = NULL;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) return fprintf(stderr, "llama_logits: cannot make a context\n"), 1;
    const struct llama_vocab *voc = llama_model_get_vocab(m);
    int nv = llama_vocab_n_tokens(voc);
    snprintf(ip, sizeof ip, "%s/logits.bin", g_dir);
    FILE *lf = fopen(ip, "wb");
    if (!lf) return fprintf(stderr, "llama_logits: cannot write '%s'\n", ip), 1;
    int rc;
    if (onebyone) {
        for (int i = 0; i < n; i++) {
            rc = llama_decode(ctx, llama_batch_get_one(&toks[i], 1));
            if (rc) return 3;
            if (i + 1 < n) g_step++;
        }
    } else {
        rc = llama_decode(ctx, llama_batch_get_one(toks, n));
        if (rc) return 3;
    }
    for (int k = 0; k < ngen; k++) {
        float *lg = llama_get_logits_ith(ctx, -1);
        fwrite(lg, sizeof(float), (size_t)nv, lf);
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (lg[i] > lg[best]) best = i;
        printf("%d%s", best, k + 1 < ngen ? "," : "\n");
        fflush(stdout);
        if (k + 1 == ngen) break;
        g_step++;
        llama_token t = best;
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) return 4;
    }
    fclose(lf);
    fclose(g_index);
    llama_free(ctx);
    llama_model_free(m);
    return 0;
}
