#!/bin/sh
# tools/gen_lora_refs.sh: regenerate tests/data/lora/*.json, llama.cpp's greedy
# ids and probabilities for stories260K with random LoRA adapters
# (node-llama-cpp 3.21.1 in $NLC_DIR, default /work/cache/nlc; see
# ../shared/oracle/README.md). The adapters are made by `cumulo synth
# --lora-for`, deterministic by seed; tests/unit/test_lora.c makes the same
# ones in memory (keep the parameters here and there equal).
set -eu
cd "$(dirname "$0")/.."
M=${CUMULO_SHARED:-../shared}/models
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
P="Once upon a time"
./cumulo synth --lora-for "$M/stories260K-f32.gguf" --rank 4 --alpha 8 --strength 0.1 --seed 7 -o "$T/f32_a.gguf"
./cumulo synth --lora-for "$M/stories260K-f32.gguf" --rank 8 --alpha 0 --strength 0.1 --seed 8 --only ffn -o "$T/f32_b.gguf"
./cumulo synth --lora-for "$M/stories260K-q8_0.gguf" --rank 4 --alpha 8 --strength 0.1 --seed 9 -o "$T/q8_a.gguf"
R="node tools/lora_ref.mjs"
O=tests/data/lora
mkdir -p $O
$R "$M/stories260K-f32.gguf" "$P" 32 $O/f32_none.json
$R "$M/stories260K-f32.gguf" "$P" 32 $O/f32_a.json "$T/f32_a.gguf"
$R "$M/stories260K-f32.gguf" "$P" 32 $O/f32_a2.json "$T/f32_a.gguf:1.5"
$R "$M/stories260K-f32.gguf" "$P" 32 $O/f32_ab.json "$T/f32_a.gguf" "$T/f32_b.gguf:0.7"
$R "$M/stories260K-q8_0.gguf" "$P" 32 $O/q8_none.json
$R "$M/stories260K-q8_0.gguf" "$P" 32 $O/q8_a.json "$T/q8_a.gguf"
