/*
 * fuzz_gguf.c: libFuzzer target for the GGUF reader (and, through it, the writer).
 *
 * Any input: cm_gguf_parse must return (0 or an error with a message) without
 * a crash, an overread or a leak. On success every accessor is walked, and
 * the file is rewritten with the writer and parsed again: the writer must
 * accept everything the reader accepted, and the copy must read back equal.
 * Every tensor of a type the kernels run, aligned for it, has its first row
 * (up to 4096 elements) dequantized by the reference: arbitrary block bytes
 * (scales, levels, E8M0 exponents) must never fault or trip UBSan.
 * Never writes to disk.
 */
#include "gguf/gguf.h"
#include "kernels/kernels.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(x)                                                             \
    do {                                                                       \
        if (!(x)) {                                                            \
            fprintf(stderr, "fuzz_gguf: %s failed (line %d)\n", #x, __LINE__); \
            abort();                                                           \
        }                                                                      \
    } while (0)

static volatile uint64_t sink;

static void walk(const cm_gguf *g, const uint8_t *p, size_t n) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cm_gguf_kv *kv = &g->kv[i];
        REQUIRE(cm_gguf_find_kv(g, kv->key) == kv);
        uint64_t u;
        int64_t s;
        double f;
        bool b;
        cm_gguf_str st;
        sink += cm_gguf_get_u64(g, kv->key, &u) + cm_gguf_get_i64(g, kv->key, &s) + cm_gguf_get_f64(g, kv->key, &f) +
                cm_gguf_get_bool(g, kv->key, &b);
        char *str = cm_gguf_get_str(g, kv->key);
        REQUIRE((str != NULL) == (kv->type == CM_GGUF_STRING));
        cm_free(str);
        if (kv->type == CM_GGUF_STRING && kv->v.str.len) sink += (uint8_t)kv->v.str.ptr[kv->v.str.len - 1];
        if (kv->type != CM_GGUF_ARRAY) continue;
        REQUIRE(kv->arr_data >= p && kv->arr_data + kv->arr_nbytes <= p + n);
        for (uint64_t j = 0; j < kv->arr_len; j++) {
            sink += cm_gguf_arr_i64(kv, j, &s) + cm_gguf_arr_f64(kv, j, &f);
            if (cm_gguf_arr_str(kv, j, &st) && st.len) sink += (uint8_t)st.ptr[st.len - 1];
        }
        REQUIRE(!cm_gguf_arr_str(kv, kv->arr_len, &st) && !cm_gguf_arr_f64(kv, kv->arr_len, &f));
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *t = &g->tensors[i];
        REQUIRE(cm_gguf_find_tensor(g, t->name) == t);
        REQUIRE(cm_type_traits_of(t->type) != NULL && t->n_dims >= 1 && t->n_dims <= CM_MAX_DIMS);
        REQUIRE((const uint8_t *)t->data >= p && (const uint8_t *)t->data + t->nbytes <= p + n);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
        /* Kernels read fields in place: only tensors aligned for their type
         * (a file may set general.alignment = 1). */
        if (cm_kernels_supports((enum cm_type)t->type) &&
            (uintptr_t)t->data % cm_type_align((enum cm_type)t->type) == 0) {
            static float row[4096];
            const int bs = cm_type_traits_of(t->type)->block_size;
            int64_t n = t->ne[0] < 4096 ? t->ne[0] : 4096 / bs * bs;
            REQUIRE(cm_row_size((enum cm_type)t->type, n) <= t->nbytes);
            cm_kernels_ref()->to_float[t->type](t->data, row, n);
            if (n) sink += (uint64_t)(row[0] == row[0]);
        }
    }
}

/* Rewrite through the writer; the copy must parse and match. */
static void rewrite(const cm_gguf *g) {
    cm_gguf_writer *w = cm_gguf_writer_new(32);
    REQUIRE(w);
    for (uint64_t i = 0; i < g->n_kv; i++) cm_gguf_w_copy_kv(w, &g->kv[i]);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *t = &g->tensors[i];
        cm_gguf_w_tensor(w, t->name, (enum cm_type)t->type, t->n_dims, t->ne, t->data);
    }
    cm_buf b;
    cm_buf_init(&b);
    char err[256];
    int rc = cm_gguf_writer_write_buf(w, &b, err, sizeof err);
    if (rc) fprintf(stderr, "writer refused what the reader accepted: %s\n", err);
    REQUIRE(rc == 0);
    cm_gguf h;
    rc = cm_gguf_parse(&h, (const uint8_t *)b.data, b.len, err, sizeof err);
    if (rc) fprintf(stderr, "reader refused the writer's copy: %s\n", err);
    REQUIRE(rc == 0);
    REQUIRE(h.n_kv == g->n_kv && h.n_tensors == g->n_tensors && h.alignment == g->alignment);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cm_gguf_kv *a = &g->kv[i], *c = &h.kv[i];
        REQUIRE(strcmp(a->key, c->key) == 0 && a->type == c->type);
        if (a->type == CM_GGUF_ARRAY)
            REQUIRE(a->arr_type == c->arr_type && a->arr_len == c->arr_len && a->arr_nbytes == c->arr_nbytes &&
                    memcmp(a->arr_data, c->arr_data, a->arr_nbytes) == 0);
        else if (a->type == CM_GGUF_STRING)
            REQUIRE(a->v.str.len == c->v.str.len && memcmp(a->v.str.ptr, c->v.str.ptr, a->v.str.len) == 0);
        else if (a->type == CM_GGUF_F32 || a->type == CM_GGUF_F64) REQUIRE(memcmp(&a->v.f64, &c->v.f64, 8) == 0);
        else if (a->type == CM_GGUF_BOOL) REQUIRE(a->v.b == c->v.b);
        else REQUIRE(a->v.u64 == c->v.u64);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor_info *a = &g->tensors[i], *c = &h.tensors[i];
        REQUIRE(strcmp(a->name, c->name) == 0 && a->type == c->type && a->n_dims == c->n_dims &&
                memcmp(a->ne, c->ne, sizeof a->ne) == 0 && a->nbytes == c->nbytes &&
                memcmp(a->data, c->data, a->nbytes) == 0);
    }
    cm_gguf_close(&h);
    cm_buf_release(&b);
    cm_gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cm_gguf g;
    char err[512];
    err[0] = 0;
    int rc = cm_gguf_parse(&g, data, size, err, sizeof err);
    if (rc == 0) {
        walk(&g, data, size);
        rewrite(&g);
    } else {
        REQUIRE(err[0] != 0);
        REQUIRE(rc == CM_EFORMAT || rc == CM_EUNSUPPORTED || rc == CM_ENOMEM);
    }
    cm_gguf_close(&g);
    return 0;
}
