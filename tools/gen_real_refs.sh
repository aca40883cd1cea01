#!/bin/sh
# gen_real_refs.sh: regenerate tests/data/real/MODEL.json, llama.cpp's
# reference numbers for the real-model test (tests/sh/real_models.sh): for
# every prompt of tests/data/real/prompts.json, the prompt's ids, 64 greedy
# ids, and each step's top-10 probabilities (tools/real_oracle.mjs: F32 KV
# cache, 1 thread); and MODEL.tok.json, the ids of llama.cpp's
# test-tokenizer-0 corpus with the model's vocabulary (tools/real_tok_refs.mjs).
# Run by hand when the prompts change; never in CI (it
# needs node-llama-cpp: see ../shared/oracle/README.md).
#
#   sh tools/gen_real_refs.sh [ORACLE_DIR] MODEL...    MODEL: smollm2 | gemma3-270m | deepseek-r1-7b
set -eu
cd "$(dirname "$0")/.."
NLC=${1:-${TMPDIR:-/tmp}/nlc}
shift
[ -f "$NLC/node_modules/node-llama-cpp/package.json" ] || { echo "gen_real_refs: no node-llama-cpp in $NLC" >&2; exit 1; }
cp tools/real_oracle.mjs tools/real_tok_refs.mjs "$NLC/"
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
abs=$(pwd)
for m in "$@"; do
    path=$(sh scripts/real_models.sh "$m" | tail -1 | cut -d' ' -f2-)
    sum=$(sha256sum "$path" | cut -d' ' -f1)
    meta=$(printf '{"name":"%s","sha256":"%s"}' "$m" "$sum")
    (cd "$NLC" && nice node real_oracle.mjs "$path" "$abs/tests/data/real/$m.json" "$abs/tests/data/real/prompts.json" 64 10 "$meta" &&
        node real_tok_refs.mjs "$path" "$SHARED/vocab/ggml-vocab-llama-spm.gguf.inp" "$abs/tests/data/real/$m.tok.json")
done
