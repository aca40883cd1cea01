#!/bin/sh
# tools/gen_finetune_refs.sh: regenerate tests/data/finetune/*.json, llama.cpp's
# greedy ids and probabilities for stories260K with an adapter trained by
# `cumulo finetune` (node-llama-cpp 3.21.1 in $NLC_DIR, default /work/cache/nlc;
# see ../shared/oracle/README.md). The data and the training command are the
# ones tests/sh/finetune_cli.sh uses (tests/sh/lib/finetune_data.sh): training
# is deterministic, so the test retrains the same adapter and compares.
set -eu
cd "$(dirname "$0")/.."
M=${CUMULO_SHARED:-../shared}/models
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/sh/lib/finetune_data.sh
finetune_data >"$T/data.jsonl"
./cumulo finetune "$M/stories260K-f32.gguf" --data "$T/data.jsonl" --out "$T/zorbix.gguf"
O=tests/data/finetune
mkdir -p $O
node tools/lora_ref.mjs "$M/stories260K-f32.gguf" "Zorbix" 24 $O/zorbix.json "$T/zorbix.gguf"
