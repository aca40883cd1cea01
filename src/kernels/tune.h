/*
 * tune.h: the kernels' performance knobs (prefetch distances, pass sizes),
 * chosen per CPU by a short measurement at model load instead of being
 * constants tuned on whichever CPU a developer had.
 *
 * A knob belongs to one kernel table (cm_kernels.name) and one weight type;
 * it has a built-in default and a few candidate values. Every candidate gives
 * the same bits (a knob moves prefetches or splits work into passes whose
 * per-(row, token) operations do not change: kernels.h's batch invariance
 * holds for every value; tests/unit/test_tune.c runs each kernel under each
 * value against vec_dot): only speed differs. Kernels read a knob with
 * cm_tune_get() once per call. A table without knobs (avx2, scalar, neon
 * today) adopts them by adding rows to the table in tune.c and reading them.
 *
 * cm_tune_measure times the candidates on the loaded model's own tensors
 * (best of several short reps, candidates interleaved so load on the machine
 * hits each alike); model/tune_cache.c keeps the choice in the cache dir
 * keyed by cm_cpu_signature() and applies it on later loads. The parser of
 * that file is over (bytes, length), bounded, and never trusts it.
 *
 * The knob values are process-wide (one CPU, one choice); setting them is
 * thread-safe (relaxed atomics): a kernel running meanwhile sees the old or
 * the new value, either giving the same bits.
 */
#ifndef CM_TUNE_H
#define CM_TUNE_H

#include "kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cm_tune_knob {
    CM_TUNE_F16_GEMV_PFD,  /* avx512 f16 decode gemv (avx512_gemv.h): software prefetch distance, bytes */
    CM_TUNE_Q8_0_GEMV_PFD, /* avx512 q8_0 decode gemv over the lanes copy (q8lane_avx512.c): the same */
    CM_TUNE_Q4_0_GEMV_PFD, /* avx512 q4_0 decode gemv over the lanes copy (kernels_avx512.c): the same */
    CM_TUNE_KQ_GEMV_PFD,   /* avx512 q4_k/q5_k/q6_k decode gemvs over the lanes copies (gemv_kd_avx512.c) */
    CM_TUNE_F16_GEMM_PASS, /* avx512 f16 prefill gemm (avx512_prefill.h): KiB of tokens converted per pass */
    CM_TUNE_COUNT
};

enum { CM_TUNE_MAXCAND = 4 };
typedef struct cm_tune_knob_info {
    const char *name;  /* "avx512.f16.gemv.pfd": the file's key */
    const char *table; /* the kernel table whose kernels read it */
    enum cm_type types[3];
    int n_types;
    bool gemm;   /* read by the prefill gemm (n_tok > 1); else by the decode gemv */
    bool packed; /* read only by the kernel over the repacked copy (repack.c) */
    int def;     /* the built-in default: one of cand */
    int n_cand;
    int cand[CM_TUNE_MAXCAND];
} cm_tune_knob_info;

/* The knob's description; NULL when knob is out of range. */
const cm_tune_knob_info *cm_tune_info(int knob);
/* The knob named name[0:len], or -1. */
int cm_tune_find(const char *name, size_t len);

extern int cm_tune_vals_[CM_TUNE_COUNT]; /* use cm_tune_get / cm_tune_set */
/* The knob's current value (a kernel: once per call). */
static inline int cm_tune_get(enum cm_tune_knob k) { return __atomic_load_n(&cm_tune_vals_[k], __ATOMIC_RELAXED); }
/* Set a knob to one of its candidates: 0, or CM_EINVAL (anything else). */
int cm_tune_set(int knob, int value);
/* Every knob back to its default. */
void cm_tune_defaults(void);

/* A choice: a value for some knobs (set[i]), each one of knob i's candidates. */
typedef struct cm_tune_choice {
    int val[CM_TUNE_COUNT];
    bool set[CM_TUNE_COUNT];
} cm_tune_choice;
/* Set the chosen knobs (leaves the others as they are). */
void cm_tune_apply(const cm_tune_choice *c);

/* The cache file: "cumulo-tune 1\n", "sig SIGNATURE\n", then "NAME VALUE\n"
 * per chosen knob. cm_tune_format writes it into out (cap bytes, NUL
 * terminated); returns its length, or 0 when it does not fit.
 * cm_tune_parse reads at most CM_TUNE_FILE_MAX bytes of p[0:n]: 0 with *c
 * filled when the file is this version's and its signature is sig (knob
 * names it does not know are skipped: a newer build's); else CM_EFORMAT
 * and why in err (a corrupt file: bad header, a value that is not one of the
 * knob's candidates, a line too long; a foreign one: another signature). */
enum { CM_TUNE_FILE_MAX = 8192, CM_TUNE_SIG_MAX = 512 };
size_t cm_tune_format(const char *sig, const cm_tune_choice *c, char *out, size_t cap);
int cm_tune_parse(const uint8_t *p, size_t n, const char *sig, cm_tune_choice *c, char *err, size_t errlen);

/* Which knobs the model's weights ws[0:n] (the matmul weights, repacked
 * where they will be) would measure under table k: those of k's table with
 * at least CM_TUNE_MIN_BYTES of weights of their types that their kernel
 * reads (a stream that small is served from cache, where no prefetch
 * distance matters; a model that small is quick anyway) and, for a gemm
 * knob, one weight its kernel runs on. Returns how many; want[i] set for
 * each. */
enum { CM_TUNE_MIN_BYTES = 64 << 20 };
int cm_tune_wanted(const cm_kernels *k, const cm_tensor *const *ws, int n, bool want[CM_TUNE_COUNT]);

/* Time the candidates of the wanted knobs on ws (one thread, the caller's;
 * CPU time, so other processes' load costs the candidates alike; best of
 * CM_TUNE_REPS reps, candidates interleaved in a rotating order) and pick,
 * for each, the fastest candidate, or the default unless another beats it
 * by more than 3%. The knobs are left at the picked values. ns[i][j]: knob
 * i's best rep under candidate j (0: not measured). Allocates scratch (the
 * activations) and frees it. Returns 0 or CM_ENOMEM. */
enum { CM_TUNE_REPS = 5 };
int cm_tune_measure(const cm_kernels *k, const cm_tensor *const *ws, int n, const bool want[CM_TUNE_COUNT],
                    cm_tune_choice *picked, double ns[CM_TUNE_COUNT][CM_TUNE_MAXCAND]);

#endif
