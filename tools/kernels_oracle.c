/*
 * kernels_oracle.c: records what llama.cpp's own ggml libraries compute on
 * the seeded inputs of tests/unit/kernels_cases.h, as test data for
 * tests/unit/test_kernels_ggml.c. Not part of the build or of `make test`;
 * run by hand where node-llama-cpp is installed (/work/cache/nlc):
 *
 *   make build/libcumulo.a
 *   cc -std=c11 -O2 -D_GNU_SOURCE -Isrc -Itests/unit tools/kernels_oracle.c build/libcumulo.a -ldl -lm -lpthread -o /tmp/kernels_oracle
 *   /tmp/kernels_oracle /work/cache/nlc/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 > tests/data/kernels_ggml.txt
 *
 * It loads libggml-base.so (reference weight quantizers, ggml_quantize_chunk
 * without an importance matrix) and the libggml-cpu-<variant>.so that ggml's
 * backend scoring would pick on this CPU (activation converters from_float
 * and dot products vec_dot of the x86 build llama.cpp runs), and prints:
 *   # cpu <variant>
 *   Q <type> <dist> <fnv64 of KC_ROWS quantized rows>
 *   A <type> <dist> <fnv64 of KC_ROWS converted rows>
 *   D <type> <dist> <row> <vec_dot result, %a>
 *   T <type> <dist> <fnv64 of the Q rows dequantized by ggml's to_float>
 *   R <type> <fnv64 of kc_fill_blocks' random rows dequantized by to_float>
 *   E <type> <row> <vec_dot of a random-block row, %a>
 * Reads nothing but those libraries; writes only stdout.
 */
#include "kernels_cases.h"

#include <dirent.h>
#include <stdbool.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*from_float_t)(const float *, void *, int64_t);
typedef void (*to_float_t)(const void *, float *, int64_t);
struct type_traits { /* ggml.h, ggml_type_traits */
    const char *type_name;
    int64_t blck_size, blck_size_interleave;
    size_t type_size;
    bool is_quantized;
    to_float_t to_float;
    from_float_t from_float_ref;
};
typedef void (*vec_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
struct type_traits_cpu { /* ggml-cpu.h, ggml_type_traits_cpu */
    from_float_t from_float;
    vec_dot_t vec_dot;
    int vec_dot_type;
    int64_t nrows;
};

static void *must(void *p, const char *what) {
    if (!p) {
        fprintf(stderr, "kernels_oracle: %s: %s\n", what, dlerror());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: kernels_oracle DIR_WITH_LIBGGML\n");
        return 2;
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/libggml-base.so", argv[1]);
    void *base = must(dlopen(path, RTLD_NOW | RTLD_GLOBAL), path);
    size_t (*quantize_chunk)(int, const float *, void *, int64_t, int64_t, int64_t, const float *) =
        (size_t(*)(int, const float *, void *, int64_t, int64_t, int64_t, const float *))must(
            dlsym(base, "ggml_quantize_chunk"), "ggml_quantize_chunk");

    const struct type_traits *(*base_traits)(int) =
        (const struct type_traits *(*)(int))must(dlsym(base, "ggml_get_type_traits"), "ggml_get_type_traits");

    /* The CPU variant ggml would choose: highest ggml_backend_score. */
    DIR *d = opendir(argv[1]);
    if (!d) return 1;
    struct dirent *e;
    int best_score = 0;
    char best[1024] = "";
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "libggml-cpu-", 12) || !strstr(e->d_name, ".so")) continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        int (*score)(void) = (int (*)(void))dlsym(h, "ggml_backend_score");
        const int s = score ? score() : 0;
        if (s > best_score) {
            best_score = s;
            snprintf(best, sizeof best, "%s", e->d_name);
        }
    }
    closedir(d);
    if (!best[0]) return 1;
    snprintf(path, sizeof path, "%s/%s", argv[1], best);
    void *cpu = must(dlopen(path, RTLD_NOW | RTLD_LOCAL), path);
    ((void (*)(void))must(dlsym(cpu, "ggml_cpu_init"), "ggml_cpu_init"))();
    const struct type_traits_cpu *(*traits)(int) =
        (const struct type_traits_cpu *(*)(int))must(dlsym(cpu, "ggml_get_type_traits_cpu"), "traits");
    printf("# cpu %s (score %d)\n", best, best_score);

    static float x[KC_ROWS * KC_N];
    static uint8_t q[KC_ROWS * KC_N * 4], a[KC_ROWS * KC_N * 4];
    static float deq[KC_ROWS * KC_N];
    for (size_t ti = 0; ti < sizeof kc_weight_types / sizeof kc_weight_types[0]; ti++) {
        const int t = kc_weight_types[ti];
        for (int dist = 0; dist < KC_DISTS; dist++) {
            kc_fill(x, 0, t, dist);
            const size_t nq = quantize_chunk(t, x, q, 0, KC_ROWS, KC_N, NULL);
            if (t != CM_TYPE_F32) printf("Q %s %d %016llx\n", cm_type_name(t), dist, (unsigned long long)kc_fnv(q, nq));
            if (base_traits(t)->is_quantized) {
                base_traits(t)->to_float(q, deq, KC_ROWS * KC_N);
                printf("T %s %d %016llx\n", cm_type_name(t), dist, (unsigned long long)kc_fnv(deq, sizeof deq));
            }
            /* dot: weights q, activations of another seed converted by the CPU build */
            const struct type_traits_cpu *tt = traits(t);
            const int vt = tt->vec_dot_type;
            const size_t rs = cm_row_size((enum cm_type)t, KC_N), as = cm_row_size((enum cm_type)vt, KC_N);
            kc_fill(x, 1, t, dist);
            for (int r = 0; r < KC_ROWS; r++) traits(vt)->from_float(x + r * KC_N, a + r * as, KC_N);
            for (int r = 0; r < KC_ROWS; r++) {
                float s;
                tt->vec_dot(KC_N, &s, 0, q + r * rs, 0, a + r * as, 0, 1);
                printf("D %s %d %d %a\n", cm_type_name(t), dist, r, s);
            }
        }
    }
    for (int ti = 0; ti < KC_N_WEIGHT_TYPES + KC_N_BLOCK_TYPES; ti++) {
        const int t = ti < KC_N_WEIGHT_TYPES ? (int)kc_weight_types[ti] : (int)kc_block_types[ti - KC_N_WEIGHT_TYPES];
        const struct type_traits_cpu *tt = traits(t);
        if (!base_traits(t)->is_quantized) continue;
        kc_fill_blocks(q, t, cm_type_traits_of(t));
        base_traits(t)->to_float(q, deq, KC_ROWS * KC_N);
        printf("R %s %016llx\n", cm_type_name(t), (unsigned long long)kc_fnv(deq, sizeof deq));
        const int vt = tt->vec_dot_type;
        const size_t rs = cm_row_size((enum cm_type)t, KC_N), as = cm_row_size((enum cm_type)vt, KC_N);
        kc_fill(x, 1, t, 0);
        for (int r = 0; r < KC_ROWS; r++) traits(vt)->from_float(x + r * KC_N, a + r * as, KC_N);
        for (int r = 0; r < KC_ROWS; r++) {
            float s;
            tt->vec_dot(KC_N, &s, 0, q + r * rs, 0, a + r * as, 0, 1);
            printf("E %s %d %a\n", cm_type_name(t), r, s);
        }
    }
    for (size_t ai = 0; ai < sizeof kc_act_types / sizeof kc_act_types[0]; ai++) {
        const int t = kc_act_types[ai];
        const size_t as = cm_row_size((enum cm_type)t, KC_N);
        for (int dist = 0; dist < KC_DISTS; dist++) {
            kc_fill(x, 2, t, dist);
            for (int r = 0; r < KC_ROWS; r++) traits(t)->from_float(x + r * KC_N, a + r * as, KC_N);
            printf("A %s %d %016llx\n", cm_type_name(t), dist, (unsigned long long)kc_fnv(a, as * KC_ROWS));
        }
    }
    return 0;
}
