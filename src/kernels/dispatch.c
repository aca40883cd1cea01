/*
 * dispatch.c: builds the kernel tables once and picks one for this CPU; runs
 * the row-sliced matrix product the model calls for every weight.
 *
 * Every table starts as the scalar reference; ISA files override what they
 * implement (isa.h). cm_kernels_get() returns the best table the CPU supports,
 * capped by CUMULO_ISA (scalar|avx2|avx512|neon). Tables are filled exactly
 * once (pthread_once) and are read-only afterwards, so any thread may use
 * them. Nothing here allocates.
 */
#include "kernels.h"

#include "base/base.h"
#include "isa.h"
#include "os/os.h"

#include <pthread.h>
#include <string.h>

enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512, ISA_NEON, ISA_COUNT };
static const char *const k_isa_names[ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

static cm_kernels g_tables[ISA_COUNT];
static bool g_have[ISA_COUNT]; /* compiled in and supported by this CPU */
static const cm_kernels *g_best;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const char *g_amx_why = "not built";
static bool g_amx_cpu;                           /* the avx512 table exists and this process may use AMX-INT8 */
static cm_gemm_fn g_gemm_noamx[CM_TYPE_COUNT];   /* the avx512 table's gemms before AMX */
static cm_gemm_fn g_packed_noamx[CM_TYPE_COUNT]; /* and its gemm_packed */

/* What each ISA file may use, from the flags the Makefile compiles it with.
 * A CPU lacking any of them never runs that file. */
static bool cpu_has(int isa, const cm_cpu_features *f) {
    switch (isa) {
    case ISA_SCALAR: return true;
    case ISA_AVX2: return CM_KERNELS_HAVE_X86 && f->x86_avx2 && f->x86_fma && f->x86_f16c;
    case ISA_AVX512:
        return CM_KERNELS_HAVE_X86 && f->x86_avx2 && f->x86_fma && f->x86_f16c && f->x86_avx512f && f->x86_avx512bw &&
               f->x86_avx512vl && f->x86_avx512vnni && f->x86_avx512bf16;
    case ISA_NEON: return CM_KERNELS_HAVE_NEON && f->arm_neon && f->arm_dotprod && f->arm_fp16;
    default: return false;
    }
}

/* Index into k_isa_names, or -1. */
static int isa_index(const char *name) {
    for (int i = 0; i < ISA_COUNT; i++)
        if (name && strcmp(name, k_isa_names[i]) == 0) return i;
    return -1;
}

/* The ISA's rank within its own family (x86: avx2 < avx512; arm: neon);
 * scalar is 0 in every family. */
static int isa_rank(int isa) { return isa == ISA_AVX512 ? 2 : isa == ISA_SCALAR ? 0 : 1; }
static bool isa_same_family(int a, int b) {
    bool ax = a == ISA_AVX2 || a == ISA_AVX512, bx = b == ISA_AVX2 || b == ISA_AVX512;
    return a == ISA_SCALAR || b == ISA_SCALAR || ax == bx;
}

static void build_tables(void) {
    const cm_cpu_features *f = cm_cpu_features_get();
    for (int i = 0; i < ISA_COUNT; i++) {
        cm_kernels_fill_ref(&g_tables[i]);
        cm_kernels_fill_attn_ref(&g_tables[i]);
        g_tables[i].name = k_isa_names[i];
        g_have[i] = cpu_has(i, f);
    }
#if CM_KERNELS_HAVE_X86
    if (g_have[ISA_AVX2]) {
        cm_kernels_fill_avx2(&g_tables[ISA_AVX2]);
        cm_kernels_fill_avx2_own(&g_tables[ISA_AVX2]);
        cm_kernels_fill_lowbit_avx2(&g_tables[ISA_AVX2]);
        cm_kernels_fill_attn_avx2(&g_tables[ISA_AVX2]);
        cm_kernels_fill_attn_tile_avx2(&g_tables[ISA_AVX2]);
    }
    if (g_have[ISA_AVX512]) {
        cm_kernels_fill_avx2(&g_tables[ISA_AVX512]);
        cm_kernels_fill_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_lowbit_avx2(&g_tables[ISA_AVX512]);
        cm_kernels_fill_lowbit_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_kq_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_kq6_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_kq4_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_kd_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_attn_avx2(&g_tables[ISA_AVX512]);
        cm_kernels_fill_attn_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_attn_tile_avx512(&g_tables[ISA_AVX512]);
        cm_kernels_fill_q8lane_avx512(&g_tables[ISA_AVX512]);
        memcpy(g_gemm_noamx, g_tables[ISA_AVX512].gemm, sizeof g_gemm_noamx);
        memcpy(g_packed_noamx, g_tables[ISA_AVX512].gemm_packed, sizeof g_packed_noamx);
        g_amx_cpu = f->x86_amx_int8;
        g_amx_why = !f->x86_amx_int8 ? f->x86_amx_why : cm_config_get()->amx_off ? "CUMULO_AMX=0" : "";
        if (!*g_amx_why) cm_kernels_fill_amx(&g_tables[ISA_AVX512]);
    } else {
        g_amx_why = "no avx512 kernels";
    }
#endif
#if CM_KERNELS_HAVE_NEON
    if (g_have[ISA_NEON]) {
        cm_kernels_fill_neon(&g_tables[ISA_NEON]);
        cm_kernels_fill_lowbit_neon(&g_tables[ISA_NEON]);
        cm_kernels_fill_attn_neon(&g_tables[ISA_NEON]);
    }
#endif

    /* CUMULO_ISA caps the choice: the best ISA we have whose rank does not
     * exceed the cap's within the cap's family. "best" (unset) caps nothing;
     * a cap naming another architecture's ISA leaves only scalar. */
    const char *cap_name = cm_cpu_isa_cap();
    int cap = isa_index(cap_name);
    if (cap < 0 && strcmp(cap_name, "best") != 0)
        CM_LOGW("CUMULO_ISA='%s' is not one of scalar|avx2|avx512|neon; ignoring it", cap_name);
    int best = ISA_SCALAR;
    for (int i = 0; i < ISA_COUNT; i++) {
        if (!g_have[i]) continue;
        if (cap >= 0 && (!isa_same_family(i, cap) || isa_rank(i) > isa_rank(cap))) continue;
        if (isa_rank(i) > isa_rank(best)) best = i;
    }
    g_best = &g_tables[best];
    CM_LOGD("kernels: using '%s' (CUMULO_ISA=%s; avx2 %s, avx512 %s, neon %s; amx %s)", g_best->name, cap_name,
            g_have[ISA_AVX2] ? "yes" : "no", g_have[ISA_AVX512] ? "yes" : "no", g_have[ISA_NEON] ? "yes" : "no",
            *g_amx_why ? g_amx_why : "yes");
}

const cm_kernels *cm_kernels_get(void) {
    pthread_once(&g_once, build_tables);
    return g_best;
}

const cm_kernels *cm_kernels_ref(void) {
    pthread_once(&g_once, build_tables);
    return &g_tables[ISA_SCALAR];
}

const cm_kernels *cm_kernels_for(const char *isa) {
    pthread_once(&g_once, build_tables);
    int i = isa_index(isa);
    return i >= 0 && g_have[i] ? &g_tables[i] : NULL;
}

const char *cm_kernels_amx_why(void) {
    pthread_once(&g_once, build_tables);
    return g_amx_why;
}

cm_gemm_fn cm_kernels_amx_gemm(enum cm_type t, bool amx) {
    cm_gemm_fn a = NULL, p = NULL;
    cm_kernels_amx_path(t, false, 4096, &a, &p);
    return amx ? a : p;
}

int cm_kernels_amx_path(enum cm_type t, bool packed, int64_t k, cm_gemm_fn *amx, cm_gemm_fn *prev) {
    pthread_once(&g_once, build_tables);
    *amx = *prev = NULL;
    if ((unsigned)t >= CM_TYPE_COUNT) return 0;
    *prev = packed ? g_packed_noamx[t] : g_gemm_noamx[t];
    int mintok = 0;
    if (!g_amx_cpu || !*prev) return 0;
#if CM_KERNELS_HAVE_X86
    *amx = cm_kernels_amx_direct(t, packed, k, &mintok);
#endif
    return *amx ? mintok : 0;
}

uint64_t cm_kernels_amx_calls(void) {
#if CM_KERNELS_HAVE_X86
    return g_amx_cpu ? cm_kernels_amx_ncalls() : 0;
#else
    return 0;
#endif
}

bool cm_kernels_supports(enum cm_type t) {
    const cm_kernels *k = cm_kernels_ref();
    const cm_type_traits *tr = cm_type_traits_of((uint32_t)t);
    if (!tr || !k->vec_dot[t] || !k->to_float[t]) return false;
    return k->from_float[tr->vec_dot_type] != NULL;
}

void cm_matmul_rows(const cm_kernels *k, const cm_tensor *W, const void *xq, size_t xq_stride, int64_t n_tok, float *y,
                    int64_t ldy, int64_t r0, int64_t r1) {
    const enum cm_type t = W->type;
    CM_ASSERT((unsigned)t < CM_TYPE_COUNT && k->vec_dot[t]);
    CM_ASSERT(r0 >= 0 && r1 <= W->ne[1] && r0 <= r1 && n_tok >= 0);
    const int64_t n = W->ne[0];
    const void *wp;
    size_t ws;
    /* up to gemm_packed_max tokens, or any number where the copy is the
     * only one resident (the file's pages given back: cm_repack_give_back) */
    if (n_tok > 1 && k->gemm_packed[t] &&
        (wp = n_tok <= k->gemm_packed_max ? cm_repack_find(W, &ws) : cm_repack_find_alone(W, &ws)) != NULL) {
        k->gemm_packed[t](n, wp, ws, xq, xq_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    if (n_tok > 1 && k->gemm[t]) {
        k->gemm[t](n, W->data, W->nb[1], xq, xq_stride, y, ldy, r0, r1, n_tok);
        return;
    }
    if (n_tok == 1 && k->gemv_packed[t] && (wp = cm_repack_find(W, &ws)) != NULL) {
        k->gemv_packed[t](n, wp, ws, xq, xq_stride, y, ldy, r0, r1, 1);
        return;
    }
    if (n_tok == 1 && k->gemv[t]) {
        k->gemv[t](n, W->data, W->nb[1], xq, xq_stride, y, ldy, r0, r1, 1);
        return;
    }
    /* Row-major over weights: each weight row is read once for all tokens.
     * Decode is a stream of weight rows from DRAM: ask for the row PF_AHEAD
     * rows ahead while this one is computed, so several rows' cache lines are
     * in flight at once (the hardware prefetcher alone stalls at each row
     * start on a busy machine). Prefetches never fault, even past the end.
     * Locality 3 (prefetcht0: into L1 and L2): 1.2-1.8x the non-temporal
     * hint's (0) speed by thread CPU time on session 18's Xeon (256 MiB
     * matrices of q4_1, q5_0, q5_1, q2_k, q3_k, iq4_nl, iq4_xs, mxfp4; avx512
     * and avx2 tables; a loaded machine); no prefetch was mixed (0.7-1.6x of
     * hint 0). docs/HISTORY.md, session 18. */
    enum { PF_AHEAD = 4 };
    const size_t rs = W->nb[1], row_bytes = cm_row_size(t, n);
    for (int64_t i = r0; i < r1; i++) {
        const void *w = (const char *)W->data + (size_t)i * rs;
        if (i + PF_AHEAD < r1) {
            const char *pf = (const char *)w + PF_AHEAD * rs;
            for (size_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(pf + o, 0, 3);
        }
        for (int64_t j = 0; j < n_tok; j++)
            k->vec_dot[t](n, &y[j * ldy + i], w, (const char *)xq + (size_t)j * xq_stride);
    }
}

cm_gemv_plan cm_gemv_plan_of(const cm_kernels *k, const cm_tensor *W) {
    const enum cm_type t = W->type;
    CM_ASSERT((unsigned)t < CM_TYPE_COUNT && k->vec_dot[t]);
    cm_gemv_plan p = {.k = k, .W = W};
    if (k->gemv_packed[t] && (p.w = cm_repack_find(W, &p.ws)) != NULL) p.fn = k->gemv_packed[t], p.packed = true;
    else if (k->gemv[t]) p.fn = k->gemv[t], p.w = W->data, p.ws = W->nb[1];
    return p;
}

void cm_gemv_plan_rows(const cm_gemv_plan *p, const void *xq, size_t xq_stride, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    CM_ASSERT(r0 >= 0 && r1 <= p->W->ne[1] && r0 <= r1);
    if (p->fn) p->fn(p->W->ne[0], p->w, p->ws, xq, xq_stride, y, ldy, r0, r1, 1);
    else cm_matmul_rows(p->k, p->W, xq, xq_stride, 1, y, ldy, r0, r1);
}
