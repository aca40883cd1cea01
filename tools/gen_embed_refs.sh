#!/bin/sh
# gen_embed_refs.sh: regenerate tests/data/embed/*.json, llama.cpp's
# embeddings (node-llama-cpp) that tests/sh/http_embed.sh compares
# /v1/embeddings with. Run by hand when the inputs or models change; never
# in CI (it needs node-llama-cpp: ../shared/oracle/README.md).
#   sh tools/gen_embed_refs.sh [ORACLE_DIR]
# Models: stories260K-q8_0 (../shared/models) and a synthetic qwen2 Q8_0
# (made here with `cumulo synth` from its seed, deleted afterwards; the test
# makes it again), and that model declaring each pooling. Inputs: the ids `cumulo tokenize` gives for TEXTS (its
# tokenizer matches llama.cpp's on ../shared/vocab, tested elsewhere).
set -eu
cd "$(dirname "$0")/.."
NLC=${1:-/work/cache/nlc}
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
OUT=tests/data/embed
[ -f "$NLC/node_modules/node-llama-cpp/package.json" ] || { echo "gen_embed_refs: no node-llama-cpp in $NLC" >&2; exit 1; }
make -s cumulo
cp tools/embed_oracle.mjs "$NLC/embed_oracle.mjs"
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SYNTH_ARGS="--arch qwen2 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --ctx 512 --type q8_0 --seed 1040"
# shellcheck disable=SC2086
build/cumulo synth $SYNTH_ARGS --vocab "$SHARED/vocab/ggml-vocab-llama-spm.gguf" -o "$TMP/synth.gguf" --threads 2
ids() { # ids MODEL: a JSON array of the id arrays of the texts
    printf '['
    sep=""
    for t in "Once upon a time" "The cat sat on the mat and looked at the bird." "Lily"; do
        printf '%s[%s]' "$sep" "$(build/cumulo tokenize "$1" "$t" | tr ' ' ',')"
        sep=","
    done
    printf ']'
}
abs=$(pwd)
M=$SHARED/models/stories260K-q8_0.gguf
I1=$(ids "$M")
I2=$(ids "$TMP/synth.gguf")
(cd "$NLC" && node embed_oracle.mjs "$M" "$abs/$OUT/stories260K-q8_0.json" "$I1" '{"model":"stories260K-q8_0.gguf"}')
(cd "$NLC" && node embed_oracle.mjs "$TMP/synth.gguf" "$abs/$OUT/synth-qwen2-q8_0.json" "$I2" \
    "{\"model\":\"synth\",\"synth\":\"cumulo synth $SYNTH_ARGS --vocab ggml-vocab-llama-spm.gguf\"}")
# The same synthetic model declaring its pooling (qwen2.pooling_type 1 mean,
# 2 cls, 3 last; tools/gguf_add_kv.py): llama.cpp pools it itself.
for k in 1 2 3; do
    python3 tools/gguf_add_kv.py "$TMP/synth.gguf" "$TMP/synth$k.gguf" qwen2.pooling_type u32 $k
    (cd "$NLC" && node embed_oracle.mjs "$TMP/synth$k.gguf" "$abs/$OUT/synth-qwen2-q8_0.pooling$k.json" "$I2" \
        "{\"model\":\"synth + qwen2.pooling_type=$k\",\"pooling_type\":$k}" whole)
done
