/*
 * tune_cache.c: the kernels' knobs (kernels/tune.h) at model load: this
 * CPU's choice read from the cache dir, or measured on the loaded weights
 * and written there, keyed by cm_cpu_signature(). The file is the user's
 * cache, not trusted: read at most CM_TUNE_FILE_MAX + 1 bytes, parsed by
 * cm_tune_parse; a corrupt or foreign file costs a one-line warning and a
 * new measurement, never a failed load. Writing it may fail (read-only home):
 * a warning, the choice still applies for this process.
 */
#include "model.h"

#include "../kernels/tune.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static cm_model_tune_info g_last; /* under g_mu */

void cm_model_tune_last(cm_model_tune_info *out) {
    pthread_mutex_lock(&g_mu);
    *out = g_last;
    pthread_mutex_unlock(&g_mu);
}

int cm_tune_cache_path(const char *sig, char *out, size_t cap) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the signature: one file per CPU */
    for (const char *p = sig; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    char dir[512];
    const int rc = cm_cache_dir(cm_config_get()->tune_dir, "tune", dir, sizeof dir);
    if (rc) return rc;
    const int w = snprintf(out, cap, "%s/%016llx.tune", dir, (unsigned long long)h);
    return w < 0 || (size_t)w >= cap ? CM_ERANGE : 0;
}

/* The cached choice for sig at path: 0 and *c, or an error (no file: CM_ENOENT, quietly). */
static int read_cache(const char *path, const char *sig, cm_tune_choice *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return CM_ENOENT;
    uint8_t buf[CM_TUNE_FILE_MAX + 1];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char err[160];
    const int rc = cm_tune_parse(buf, n, sig, c, err, sizeof err);
    if (rc) CM_LOGW("ignoring the kernel tuning file '%s': %s; measuring again", path, err);
    return rc;
}

int cm_model_tune(const cm_model *m, bool may_measure) {
    const cm_config *cfg = cm_config_get();
    const cm_kernels *k = cm_kernels_get();
    const uint64_t t0 = cm_now_ns(), c0 = cm_thread_cpu_ns();
    cm_model_tune_info info = {.source = "defaults"};
    const int nmax = m->hp.n_layer * CM_LAYER_MATMULS + 1;
    const cm_tensor **ws = cm_malloc((size_t)nmax * sizeof *ws);
    if (!ws) return CM_ENOMEM;
    int n = 0;
    for (int il = 0; il < m->hp.n_layer && m->layers; il++) {
        const cm_tensor *lw[CM_LAYER_MATMULS];
        cm_layer_matmuls(&m->layers[il], lw);
        for (int i = 0; i < CM_LAYER_MATMULS; i++)
            if (lw[i]->data && lw[i]->ne[1] > 0) ws[n++] = lw[i];
    }
    if (m->output.data) ws[n++] = &m->output;
    bool want[CM_TUNE_COUNT];
    const int nwant = cm_tune_wanted(k, ws, n, want);
    for (int i = 0; i < CM_TUNE_COUNT; i++) info.used[i] = want[i];
    if (cfg->tune_off) {
        cm_tune_defaults();
        info.source = "off";
        cm_free(ws);
        goto done;
    }
    if (nwant == 0) {
        info.source = "none"; /* nothing this model's kernels would read on this table */
        cm_free(ws);
        goto done;
    }
    char sig[CM_TUNE_SIG_MAX];
    cm_cpu_signature(sig, sizeof sig);
    const bool have_path = cm_tune_cache_path(sig, info.path, sizeof info.path) == 0;
    cm_tune_choice cached;
    memset(&cached, 0, sizeof cached);
    bool missing[CM_TUNE_COUNT], any_missing = false;
    if (have_path && !cfg->tune_force && read_cache(info.path, sig, &cached) == 0) cm_tune_apply(&cached);
    else memset(&cached, 0, sizeof cached);
    for (int i = 0; i < CM_TUNE_COUNT; i++) any_missing |= missing[i] = want[i] && !cached.set[i];
    info.choice = cached;
    info.source = "cache";
    if (any_missing && !may_measure) {
        info.source = "defaults"; /* a mapped file: measuring would time page faults */
        for (int i = 0; i < CM_TUNE_COUNT; i++)
            if (missing[i]) (void)cm_tune_set(i, cm_tune_info(i)->def);
    } else if (any_missing) {
        cm_tune_choice got;
        const int rc = cm_tune_measure(k, ws, n, missing, &got, info.ns);
        if (rc == 0) {
            for (int i = 0; i < CM_TUNE_COUNT; i++)
                if (got.set[i]) info.choice.val[i] = got.val[i], info.choice.set[i] = true;
            info.source = "measured";
            for (int i = 0; i < CM_TUNE_COUNT; i++) {
                if (!got.set[i]) continue;
                const cm_tune_knob_info *ki = cm_tune_info(i);
                char line[200];
                size_t o = 0;
                for (int j = 0; j < ki->n_cand && o < sizeof line; j++)
                    o += (size_t)snprintf(line + o, sizeof line - o, " %d:%.3g", ki->cand[j], info.ns[i][j] * 1e-6);
                CM_LOGI("kernel tuning: %s = %d (best ms per rep:%s)", ki->name, got.val[i], line);
            }
            char text[CM_TUNE_FILE_MAX], err[200];
            const size_t len = cm_tune_format(sig, &info.choice, text, sizeof text);
            if (have_path && len &&
                (cm_mkdir_p(info.path, 0755, true) != 0 ||
                 cm_file_write_atomic(info.path, text, len, 0644, err, sizeof err) != 0))
                CM_LOGW("cannot keep the kernel tuning in '%s'; it applies to this run only", info.path);
        }
    }
    cm_free(ws);
    if (!have_path) info.path[0] = 0;
done:
    for (int i = 0; i < CM_TUNE_COUNT; i++) info.value[i] = cm_tune_get((enum cm_tune_knob)i);
    info.ms = (double)(cm_now_ns() - t0) * 1e-6;
    info.cpu_ms = (double)(cm_thread_cpu_ns() - c0) * 1e-6;
    CM_LOGI("kernel tuning (%s table): %s in %.1f ms (%.1f ms CPU)%s%s", k->name, info.source, info.ms, info.cpu_ms,
            info.path[0] ? ", " : "", info.path);
    pthread_mutex_lock(&g_mu);
    g_last = info;
    pthread_mutex_unlock(&g_mu);
    return 0;
}
