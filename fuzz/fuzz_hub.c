/*
 * fuzz_hub.c: libFuzzer target for what a Hugging Face Hub (or anything
 * pretending to be one) sends and what a user types: the file listing's JSON
 * and model references (input: a reference, a newline, a listing). Any input: parsing returns 0 or an error with a
 * message; every path accepted is NUL-terminated, shorter than
 * CM_HUB_MAX_PATH and free of ".."; every sha256 is 64 lowercase hex digits
 * or empty; a choice picks valid indexes, in part order for multi-part files.
 */
#include "base/base.h"
#include "hub/hub.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                            \
    do {                                                                      \
        if (!(x)) {                                                           \
            fprintf(stderr, "fuzz_hub: %s failed (line %d)\n", #x, __LINE__); \
            abort();                                                          \
        }                                                                     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *p, size_t n) {
    /* the first line: a reference; the rest: a listing */
    size_t ln = 0;
    while (ln < n && ln < 1500 && p[ln] != '\n' && p[ln]) ln++;
    size_t off = ln < n ? ln + 1 : n, ll = n - off;
    char *text = malloc(ll ? ll : 1);
    REQUIRE(text);
    memcpy(text, p + off, ll);
    cm_hub_file *f = NULL;
    size_t nf = 0;
    char err[512] = "";
    int rc = cm_hub_parse_listing(text, ll, &f, &nf, err, sizeof err);
    REQUIRE(rc == 0 || (rc == CM_EFORMAT && err[0]) || rc == CM_ENOMEM);
    for (size_t i = 0; i < nf; i++) {
        size_t l = strnlen(f[i].path, CM_HUB_MAX_PATH);
        REQUIRE(l > 0 && l < CM_HUB_MAX_PATH && !strstr(f[i].path, ".."));
        size_t h = strnlen(f[i].sha256, sizeof f[i].sha256);
        REQUIRE(h == 0 || h == 64);
        for (size_t k = 0; k < h; k++)
            REQUIRE((f[i].sha256[k] >= '0' && f[i].sha256[k] <= '9') ||
                    (f[i].sha256[k] >= 'a' && f[i].sha256[k] <= 'f'));
    }
    /* the reference, then a choice from the listing */
    char ref[1501];
    memcpy(ref, p, ln);
    ref[ln] = 0;
    cm_hub_ref r;
    rc = cm_hub_parse_ref(ref, &r, err, sizeof err);
    REQUIRE(rc == 0 || (rc == CM_EINVAL && err[0]));
    (void)cm_hub_is_ref(ref);
    if (rc == 0) {
        REQUIRE(strchr(r.repo, '/') && !strstr(r.repo, "..") && !strstr(r.file, ".."));
        size_t pick[CM_HUB_MAX_PARTS], np = 0;
        rc = cm_hub_choose(&r, f, nf, pick, &np, err, sizeof err);
        REQUIRE(rc == 0 || err[0]);
        if (rc == 0) {
            REQUIRE(np >= 1 && np <= CM_HUB_MAX_PARTS);
            for (size_t i = 0; i < np; i++) REQUIRE(pick[i] < nf);
            int k, parts;
            if (np > 1)
                for (size_t i = 0; i < np; i++)
                    REQUIRE(cm_hub_split_name(f[pick[i]].path, &k, &parts) && k == (int)i + 1 && parts == (int)np);
        }
    }
    cm_free(f);
    free(text);
    return 0;
}
