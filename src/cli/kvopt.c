/*
 * kvopt.c: the KV cache options run, chat, serve, info, plan and bench
 * share: --cache-type-k/-ctk T, --cache-type-v/-ctv T (llama.cpp's names and
 * types: f32, f16, q8_0, q4_0), --kv-type T (both), --flash-attn/-fa
 * [on|off|auto] (on and auto: the rows layout and tiled attention, every
 * type's default; off: F32/F16 keep V transposed, ggml's non-flash layout).
 */
#include "cli.h"

#include "engine/engine.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

int cli_kv_opt(int argc, char **argv, int *i, cli_kv *kv) {
    const char *a = argv[*i];
    if (!strcmp(a, "--flash-attn") || !strcmp(a, "-fa")) {
        /* llama.cpp's optional value; a bare -fa is on */
        const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
        const bool val = v && (!strcmp(v, "on") || !strcmp(v, "off") || !strcmp(v, "auto"));
        kv->no_flash = val && !strcmp(v, "off");
        kv->flash = !kv->no_flash;
        if (val) (*i)++;
        return 1;
    }
    int which; /* 1 K, 2 V, 3 both */
    if (!strcmp(a, "--cache-type-k") || !strcmp(a, "-ctk")) which = 1;
    else if (!strcmp(a, "--cache-type-v") || !strcmp(a, "-ctv")) which = 2;
    else if (!strcmp(a, "--kv-type")) which = 3;
    else return 0;
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    enum cm_type t;
    if (!v) {
        cli_fail("option '%s' needs a value (f32, f16, q8_0 or q4_0)", a);
        return -1;
    }
    if (cm_kv_type_parse(v, &t)) {
        cli_fail("option '%s': '%s' is not a KV cache type (f32, f16, q8_0, q4_0)", a, v);
        return -1;
    }
    if (which & 1) kv->k = (int)t;
    if (which & 2) kv->v = (int)t;
    kv->set = true;
    (*i)++;
    return 1;
}

void cli_kv_apply(const cli_kv *kv, struct cm_engine_opts *eo) {
    if (kv->set) {
        eo->kv_type_k = kv->k;
        eo->kv_type_v = kv->v;
        eo->kv_f16 = false;
    }
    eo->kv_transposed = kv->no_flash;
}

const char *cli_kv_name(const cli_kv *kv) {
    static char buf[32];
    if (kv->k == kv->v) snprintf(buf, sizeof buf, "%s", cm_type_name((uint32_t)kv->k));
    else snprintf(buf, sizeof buf, "K %s, V %s", cm_type_name((uint32_t)kv->k), cm_type_name((uint32_t)kv->v));
    return buf;
}
