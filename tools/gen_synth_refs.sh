#!/bin/sh
# gen_synth_refs.sh: regenerate tests/data/synth/*.json, the llama.cpp reference
# numbers of the synthetic-model golden test (tests/unit/test_synth_golden.c).
# Run by hand, once, when the model set or the generator changes; never in CI
# (it needs node-llama-cpp: see ../shared/oracle/README.md).
#
#   sh tools/gen_synth_refs.sh [ORACLE_DIR] [NAME_REGEX]
#
# ORACLE_DIR is the folder where node-llama-cpp is installed (default
# $TMPDIR/nlc or /tmp/nlc); synth_oracle.mjs is copied there. For each model
# below (architecture variant x tensor type, small dims, fixed seed), it
# writes the model with `cumulo synth` into a temporary folder, runs
# synth_oracle.mjs on it (1 thread, F32 KV cache) and stores only numbers:
# the synth parameters, greedy ids and top-1 margins for 3 prompts, and the
# top-16 next-token probabilities (+ the rest's sum) at the first 8 positions.
# Models are deleted afterwards; the test regenerates them from their seeds.
set -eu
cd "$(dirname "$0")/.."
NLC=${1:-${TMPDIR:-/tmp}/nlc}
ONLY=${2:-.}
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
OUT=tests/data/synth
PROMPTS="1;1,450,4996,17354,1701,432,12500,975;1,15043,29892,920"
TYPES="f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m"
# New variants go at the END: seeds are handed out in this order, and the
# committed references of the earlier ones keep theirs.
VARIANTS="llama llama3 llamatied qwen2 qwen3 qwen3moe qwen3moe64 qwen2moe mixtral"
[ -f "$NLC/node_modules/node-llama-cpp/package.json" ] || { echo "gen_synth_refs: no node-llama-cpp in $NLC" >&2; exit 1; }
make -s cumulo
cp tools/synth_oracle.mjs "$NLC/synth_oracle.mjs"
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
seed=1000
for v in $VARIANTS; do
    for t in $TYPES; do
        seed=$((seed + 1))
        name=$v-$t
        echo "$name" | grep -Eq "$ONLY" || continue
        arch=$v; extra=""; tied=false; scaling=none; ffn=768; nexp=0; nused=0; effn=0; sffn=0
        case $v in
            llama3) arch=llama; extra="--rope-scaling llama3"; scaling=llama3 ;;
            llamatied) arch=llama; extra="--tied"; tied=true ;;
            # mixture of experts: 8 experts top-2, 64 top-8 (tiny experts), qwen2moe's shared expert, Mixtral
            qwen3moe) nexp=8; nused=2; effn=256 ;;
            qwen3moe64) arch=qwen3moe; nexp=64; nused=8; effn=256 ;;
            qwen2moe) nexp=8; nused=2; effn=256; sffn=512 ;;
            mixtral) arch=llama; nexp=8; nused=2; ffn=256 ;;
        esac
        [ $nexp -gt 0 ] && extra="$extra --experts $nexp --experts-used $nused"
        [ $effn -gt 0 ] && extra="$extra --expert-ffn $effn"
        [ $sffn -gt 0 ] && extra="$extra --shared-ffn $sffn"
        args="--arch $arch --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn $ffn --ctx 512 --type $t --seed $seed $extra"
        # shellcheck disable=SC2086
        ./cumulo synth $args --vocab "$VOCAB" -o "$TMP/$name.gguf" --threads 2
        moe=""
        [ $nexp -gt 0 ] && moe=$(printf ',"experts":%d,"experts_used":%d,"expert_ffn":%d,"shared_ffn":%d' $nexp $nused $effn $sffn)
        meta=$(printf '{"name":"%s","command":"cumulo synth %s --vocab ggml-vocab-llama-spm.gguf","synth":{"arch":"%s","dim":256,"layers":2,"heads":4,"kv_heads":2,"ffn":%d,"ctx":512,"type":"%s","seed":%d,"tied":%s,"rope_scaling":"%s"%s,"vocab":"vocab/ggml-vocab-llama-spm.gguf"}}' \
            "$name" "$args" "$arch" "$ffn" "$t" "$seed" "$tied" "$scaling" "$moe")
        abs=$(pwd)
        (cd "$NLC" && node synth_oracle.mjs "$TMP/$name.gguf" "$abs/$OUT/$name.json" "$PROMPTS" 32 16 "$meta")
        rm -f "$TMP/$name.gguf"
    done
done
