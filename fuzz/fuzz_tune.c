/*
 * fuzz_tune.c: libFuzzer target for the kernels' tuning file parser
 * (kernels/tune.h, cm_tune_parse). Input: a cache file's bytes. Checks:
 * parsing never reads out of bounds or loops; it returns 0 or CM_EFORMAT;
 * whatever parses holds only candidate values and re-formats and re-parses
 * to the same choice. Seeds: fuzz/corpus/tune/ (a good file, a foreign one).
 */
#include "base/base.h"
#include "kernels/tune.h"

#include <stdlib.h>
#include <string.h>

static const char k_sig[] = "GenuineIntel 6 167 1; avx2 fma avx512f; l2 2097152; cpus 2";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_tune_choice c, back;
    char err[200], text[CM_TUNE_FILE_MAX];
    const int rc = cm_tune_parse(data, size, k_sig, &c, err, sizeof err);
    if (rc != 0 && rc != CM_EFORMAT) abort();
    if (rc) return 0;
    for (int i = 0; i < CM_TUNE_COUNT; i++)
        if (c.set[i] && cm_tune_set(i, c.val[i]) != 0) abort();
    const size_t n = cm_tune_format(k_sig, &c, text, sizeof text);
    if (!n || cm_tune_parse((const uint8_t *)text, n, k_sig, &back, err, sizeof err) != 0) abort();
    if (memcmp(back.set, c.set, sizeof c.set) != 0) abort();
    for (int i = 0; i < CM_TUNE_COUNT; i++)
        if (c.set[i] && back.val[i] != c.val[i]) abort();
    return 0;
}
