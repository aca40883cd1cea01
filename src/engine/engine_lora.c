/*
 * engine_lora.c: the engine's LoRA adapters (cm_engine_opts.loras): each
 * "FILE.gguf[:SCALE]" is parsed, validated against the loaded model and
 * copied into one cm_lora set (model/lora.h) that every forward pass of the
 * engine's context applies. Loaded before a cluster opens: the coordinator
 * sends every stage its layers' parts of the set (cluster/coord_lora.c).
 * The adapter files are closed again: the set holds its own F32 copy. Never applies part of a set: any bad adapter fails
 * the whole load.
 */
#include "engine_impl.h"

#include <string.h>

int cm_engine_load_loras(cm_engine *e, const cm_engine_opts *o, char *err, size_t errlen) {
    e->lora = cm_lora_new(&e->m);
    if (!e->lora) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    for (int i = 0; i < o->n_loras; i++) {
        char path[4096], msg[512];
        float scale;
        int rc = cm_lora_spec_parse(o->loras[i], path, sizeof path, &scale, msg, sizeof msg);
        if (rc) return cm_errf(err, errlen, rc, "%s", msg);
        cm_gguf g;
        if ((rc = cm_gguf_open(&g, path, NULL, NULL, msg, sizeof msg))) return cm_errf(err, errlen, rc, "%s", msg);
        rc = cm_lora_add(e->lora, &g, scale, msg, sizeof msg);
        cm_gguf_close(&g);
        if (rc) return cm_errf(err, errlen, rc, "LoRA '%s': %s", path, msg);
    }
    return 0;
}
