/*
 * meta.h (private to src/model): the hyperparameter readers of load.c,
 * shared with the architectures that read keys of their own (mla.c,
 * gptoss.c). A file's bad or out-of-range value is an error naming the key,
 * never an assert.
 */
#ifndef CM_MODEL_META_H
#define CM_MODEL_META_H

#include "model.h"

/* "<arch>.<suffix>" as an integer in [lo, hi]; a missing key gives def
 * (def < 0: required). */
int cm_meta_int(const cm_gguf *g, const char *arch, const char *suffix, long def, long lo, long hi, int *out, char *err,
                size_t errlen);
/* "<arch>.<suffix>" as a float in [lo, hi]; a missing key gives def. */
int cm_meta_float(const cm_gguf *g, const char *arch, const char *suffix, double def, double lo, double hi, float *out,
                  char *err, size_t errlen);

#endif
