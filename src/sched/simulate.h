/*
 * simulate: describe imaginary (or measured) clusters and models for the
 * planner — a cluster file in JSON (`cumulo plan --simulate CLUSTER.json`),
 * model presets for models we do not have on disk, and a model's shape read
 * from a parsed GGUF. Parsing only: no sockets, no clocks; the caller reads
 * the file.
 *
 * Cluster file:
 *   { "name": "4 x Mac mini M4 Pro",
 *     "model": { "preset": "llama-3-70b", "type": "q4_k_m" },      (optional)
 *     "nodes": [ { "name": "mini", "count": 4, "mem_gb": 64,
 *                  "mem_bw_gbs": 273, "tflops": 9 } ],
 *     "links": { "default": { "rtt_ms": 0.1, "gbit": 40 },
 *                "pairs": [ { "a": "mini1", "b": "mini2", "rtt_ms": 1, "gbit": 1 } ] },
 *     "ctx": 4096, "n_seq": 1, "prompt_tokens": 512, "parallel": "auto" }
 * Nodes with "count" > 1 are named name1, name2, ...
 */
#ifndef CM_SIMULATE_H
#define CM_SIMULATE_H

#include "gguf/gguf.h"
#include "sched/plan.h"

#include <stddef.h>

/* Parse a cluster file's text. Fills cluster and (when present) the opts
 * fields and model preset name/type into model_preset/model_type (may be
 * empty strings). */
int cm_sim_parse_cluster(const char *json, size_t n, cm_plan_cluster *c, cm_plan_opts *o, char *model_preset,
                         size_t preset_len, char *model_type, size_t type_len, char *err, size_t errlen);

/* Average bits per weight of a quantization name ("q4_k_m", "q8_0", "f16"...); 0 if unknown. */
double cm_sim_bits_per_weight(const char *type);

/* Fill a model shape from a preset name ("llama-3-70b", ...) and a type. */
int cm_sim_model_preset(const char *preset, const char *type, cm_plan_model *m, char *err, size_t errlen);
/* Names of the presets, comma separated. */
const char *cm_sim_preset_names(void);

/* A real model's shape from its GGUF header (bytes per block from the tensor table). */
int cm_plan_model_from_gguf(const cm_gguf *g, cm_plan_model *m, char *err, size_t errlen);

#endif
