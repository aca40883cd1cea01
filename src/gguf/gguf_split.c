/*
 * gguf_split.c: multi-part GGUF files, as the Hub carries big models
 * (NAME-00001-of-0000N.gguf, written by llama.cpp's gguf-split): part 1
 * holds every metadata key plus split.no / split.count / split.tensors.count,
 * each later part only the split.* keys, and every part its own tensors.
 * cm_gguf_merge joins them into one ordinary GGUF (every key of part 1
 * but split.*, every tensor in part order, the bytes copied verbatim), so
 * the rest of cumulo (the loader, the cluster's slices and hashes) only
 * ever sees single files.
 */
#include "gguf.h"

#include <stdio.h>
#include <string.h>

int cm_gguf_split_info(const cm_gguf *g, int *no, int *count) {
    uint64_t c = 0, k = 0;
    if (!cm_gguf_get_u64(g, "split.count", &c) || c <= 1) return 0;
    if (!cm_gguf_get_u64(g, "split.no", &k)) k = 0;
    *no = (int)(k < 65536 ? k : 65535);
    *count = (int)(c < 65536 ? c : 65535);
    return 1;
}

int cm_gguf_merge(const char *const *parts, int n, const char *out, cm_gguf_progress_fn progress, void *progress_ctx,
                  char *err, size_t errlen) {
    if (n < 1 || n > 65535) return cm_errf(err, errlen, CM_EINVAL, "cannot merge %d parts", n);
    cm_gguf *g = cm_calloc((size_t)n, sizeof *g);
    if (!g) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int rc = 0, opened = 0;
    uint64_t total_tensors = 0, bytes = 0;
    for (int i = 0; i < n && !rc; i++, opened++) {
        rc = cm_gguf_open(&g[i], parts[i], NULL, NULL, err, errlen);
        if (rc) break;
        int no = 0, count = 1;
        bool split = cm_gguf_split_info(&g[i], &no, &count);
        if (n > 1 && (!split || count != n || no != i))
            rc = cm_errf(err, errlen, CM_EFORMAT, "'%s' is not part %d of %d (split.no %d, split.count %d)", parts[i],
                         i + 1, n, split ? no + 1 : 1, split ? count : 1);
        total_tensors += g[i].n_tensors;
        for (uint64_t t = 0; t < g[i].n_tensors; t++) bytes += g[i].tensors[t].nbytes;
    }
    uint64_t want = 0;
    if (!rc && n > 1 && cm_gguf_get_u64(&g[0], "split.tensors.count", &want) && want != total_tensors)
        rc = cm_errf(err, errlen, CM_EFORMAT, "the parts hold %llu tensors, part 1 says %llu",
                     (unsigned long long)total_tensors, (unsigned long long)want);
    cm_gguf_writer *w = rc ? NULL : cm_gguf_writer_new(g[0].alignment);
    if (!rc && !w) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    if (!rc) {
        for (uint64_t k = 0; k < g[0].n_kv; k++) {
            const char *key = g[0].kv[k].key;
            if (!strncmp(key, "split.", 6) || !strcmp(key, "general.alignment")) continue;
            cm_gguf_w_copy_kv(w, &g[0].kv[k]);
        }
        /* (the writer adds general.alignment itself when it is not 32) */
        uint64_t done = 0;
        for (int i = 0; i < n; i++)
            for (uint64_t t = 0; t < g[i].n_tensors; t++) {
                const cm_gguf_tensor_info *ti = &g[i].tensors[t];
                cm_gguf_w_tensor(w, ti->name, (enum cm_type)ti->type, ti->n_dims, ti->ne, ti->data);
                done += ti->nbytes;
            }
        if (progress) progress(progress_ctx, 0, bytes);
        rc = cm_gguf_writer_write(w, out, err, errlen);
        if (!rc && progress) progress(progress_ctx, done, bytes);
    }
    cm_gguf_writer_free(w);
    for (int i = 0; i < opened; i++) cm_gguf_close(&g[i]);
    cm_free(g);
    return rc;
}
