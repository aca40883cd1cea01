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
# qwen3 (q/k norms, NEOX RoPE) on Q8_0 weights, prompt/completion data
./cumulo synth --arch qwen3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --type q8_0 \
    --vocab "$M/stories260K-f32.gguf" --seed 3 -o "$T/qwen3.gguf"
finetune_pc_data >"$T/pc.jsonl"
./cumulo finetune "$T/qwen3.gguf" --data "$T/pc.jsonl" --out "$T/qwen3_pc.gguf" --steps 20 --lr 5e-3
node tools/lora_ref.mjs "$T/qwen3.gguf" "the cat" 12 $O/qwen3_pc.json "$T/qwen3_pc.gguf"
