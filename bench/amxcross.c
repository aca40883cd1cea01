/*
 * amxcross.c: where each AMX prefill gemm starts to win. For every AMX path
 * of the avx512 table (q4_0, q8_0, q4_k, q5_k, q6_k over the file's layout;
 * q4_0, q5_k, q6_k over the repacked one), the AMX gemm for every token
 * count against the table's gemm it takes over from (cm_kernels_amx_path),
 * n_tok = 1..AMXC_MAXTOK, A B A B in one loop, best of AMXC_REPS by this
 * thread's CPU time (steady on a shared machine), on rows x k matrices of
 * random weights (AMXC_SHAPES, "768x2048,2048x768,2048x2048": rows x k).
 * Prints per path and token count both times and prev / amx (> 1: AMX
 * wins), and the table's current first token count. Same bits either way
 * (tests/unit/test_kernels_amx*.c check that); this only times.
 *
 *   make build/bench/amxcross && AMXC_TYPES=q4_0 build/bench/amxcross
 */
#include "base/base.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

static bool wanted(const char *name) {
    const char *f = getenv("AMXC_TYPES");
    if (!f || !*f) return true;
    size_t l = strlen(name);
    for (const char *p = f; (p = strstr(p, name)) != NULL; p += l)
        if ((p == f || p[-1] == ',') && (p[l] == 0 || p[l] == ',')) return true;
    return false;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void run(enum cm_type t, bool packed, int64_t rows, int64_t k, int maxtok, int reps) {
    cm_gemm_fn amx, prev;
    const int mintok = cm_kernels_amx_path(t, packed, k, &amx, &prev);
    if (!amx || !prev) return;
    const cm_kernels *ref = cm_kernels_ref();
    const cm_type_traits *tr = cm_type_traits_of((uint32_t)t);
    const size_t ws = cm_row_size(t, k), as = cm_row_size(tr->vec_dot_type, k);
    float *f = malloc(sizeof(float) * (size_t)k * (size_t)(rows > maxtok ? rows : maxtok));
    uint8_t *w = malloc(ws * (size_t)rows), *x = malloc(as * (size_t)maxtok);
    float *y = malloc(sizeof(float) * (size_t)rows * (size_t)maxtok);
    for (int64_t i = 0; i < k * rows; i++) f[i] = frand();
    cm_quantize_rows(t, f, w, rows, k);
    if (packed) {
        uint8_t *row = malloc(ws);
        for (int64_t r = 0; r < rows; r++) {
            memcpy(row, w + (size_t)r * ws, ws);
            cm_repack_row(t, row, w + (size_t)r * ws, k);
        }
        free(row);
    }
    for (int64_t i = 0; i < k * maxtok; i++) f[i] = frand();
    for (int j = 0; j < maxtok; j++)
        ref->from_float[tr->vec_dot_type](f + (size_t)j * (size_t)k, x + (size_t)j * as, k);
    printf("%s%s %lldx%lld (now AMX from %d tokens)\n  tok   amx ms  prev ms  prev/amx\n", cm_type_name(t),
           packed ? " repacked" : "", (long long)rows, (long long)k, mintok);
    for (int n = 1; n <= maxtok; n++) {
        double ba = 1e9, bp = 1e9;
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_s();
            amx(k, w, ws, x, as, y, rows, 0, rows, n);
            double t1 = cpu_s();
            prev(k, w, ws, x, as, y, rows, 0, rows, n);
            double t2 = cpu_s();
            if (t1 - t0 < ba) ba = t1 - t0;
            if (t2 - t1 < bp) bp = t2 - t1;
        }
        printf("  %3d %8.3f %8.3f %8.2f%s\n", n, 1e3 * ba, 1e3 * bp, bp / ba, n == mintok ? "  <- now" : "");
    }
    fflush(stdout);
    free(f), free(w), free(x), free(y);
}

int main(void) {
    static const struct {
        enum cm_type t;
        bool packed;
    } paths[] = {{CM_TYPE_Q4_0, false}, {CM_TYPE_Q4_0, true}, {CM_TYPE_Q8_0, false}, {CM_TYPE_Q4_K, false},
                 {CM_TYPE_Q5_K, false}, {CM_TYPE_Q5_K, true}, {CM_TYPE_Q6_K, false}, {CM_TYPE_Q6_K, true}};
    const int maxtok = env_int("AMXC_MAXTOK", 32), reps = env_int("AMXC_REPS", 9);
    const char *shapes = getenv("AMXC_SHAPES") ? getenv("AMXC_SHAPES") : "768x2048,2048x768,2048x2048";
    if (*cm_kernels_amx_why() && !cm_kernels_amx_path(CM_TYPE_Q4_0, false, 4096, &(cm_gemm_fn){0}, &(cm_gemm_fn){0})) {
        printf("skip: no AMX-INT8 here (%s)\n", cm_kernels_amx_why());
        return 0;
    }
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        char name[32];
        snprintf(name, sizeof name, "%s%s", cm_type_name(paths[p].t), paths[p].packed ? "p" : "");
        if (!wanted(name)) continue;
        for (const char *s = shapes; s && *s;) {
            long long r = 0, k = 0;
            if (sscanf(s, "%lldx%lld", &r, &k) == 2 && r > 0 && k > 0)
                run(paths[p].t, paths[p].packed, r, k, maxtok, reps);
            s = strchr(s, ',');
            if (s) s++;
        }
    }
    return 0;
}
