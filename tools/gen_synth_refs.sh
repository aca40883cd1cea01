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
# Each list hands out seeds in its order from its own base, so the committed
# references keep theirs (the test reads every model's seed from its JSON).
VARIANTS="llama llama3 llamatied qwen2 qwen3"
# mixture of experts (seeds from 1061, after the list above)
MOE_VARIANTS="qwen3moe qwen3moe64 qwen2moe mixtral"
# dense architectures added beside the MoE ones (also seeds from 1061)
DENSE2_VARIANTS="gemma3 phi3"
# The low-bit types (added later: seeds from 3000, so the models above keep theirs).
LOWBIT_TYPES="q2_k q3_k iq4_nl iq4_xs mxfp4 iq2_xxs iq3_xxs iq1_s"
LOWBIT_VARIANTS="llama qwen3"
# gpt-oss (seeds from 4000): F32, Q8_0, and mxfp4 = MXFP4 experts + Q8_0 elsewhere like the released files
GPTOSS_TYPES="f32 q8_0 mxfp4"
# deepseek2 (MLA + DeepSeek MoE; seeds from 4000): V3-style and V2-Lite-style
DS_VARIANTS="deepseek2v3 deepseek2lite"
DS_TYPES="f32 f16 q8_0 q4_0 q4_k"
# the unsplit attn_kv_b layout (seeds from 4200)
DS_KVB_VARIANTS="deepseek2v3kvb deepseek2litekvb"
DS_KVB_TYPES="f32 f16 q8_0 q4_k"
# DeepSeek V3's YaRN (seeds from 4100)
DS_YARN_TYPES="f32 q8_0"
# RoPE scalings read from the GGUF (seeds from 4000; their own numbering, other models): YaRN with a short
# original context so that the greedy steps run past it, linear.
ROPE_TYPES="f32 q8_0"
ROPE_VARIANTS="llamayarn qwen3yarn llamalinear"
[ -f "$NLC/node_modules/node-llama-cpp/package.json" ] || { echo "gen_synth_refs: no node-llama-cpp in $NLC" >&2; exit 1; }
make -s cumulo
cp tools/synth_oracle.mjs "$NLC/synth_oracle.mjs"
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
gen() { # gen VARIANT TYPE SEED [KV_TYPE]  (KV_TYPE, e.g. Q8_0: K and V cache type, flash attention)
    v=$1; t=$2; seed=$3; kvt=${4:-}
    name=$v-$t
    [ -n "$kvt" ] && name=$name-kv$(echo "$kvt" | tr 'A-Z' 'a-z')
    echo "$name" | grep -Eq "$ONLY" || return 0
    arch=$v; extra=""; tied=false; scaling=none; ffn=768; nexp=0; nused=0; effn=0; sffn=0
    layers=2; swa=""; dim=256; heads=4; kv=2; variant=""; rope=""
    case $v in
        llama3) arch=llama; extra="--rope-scaling llama3"; scaling=llama3 ;;
        llamatied) arch=llama; extra="--tied"; tied=true ;;
        # YaRN x4 from 16 positions (ramp over rotary pairs 0..4); qwen3: from 32, with an
        # attn_factor and a beta_fast key that llama.cpp does not read for qwen3
        llamayarn) arch=llama; scaling=yarn; rope='"rope_factor":4,"rope_orig_ctx":16'
            extra="--rope-scaling yarn --rope-factor 4 --rope-orig-ctx 16" ;;
        qwen3yarn) arch=qwen3; scaling=yarn; rope='"rope_factor":4,"rope_orig_ctx":32,"rope_attn_factor":0.875,"yarn_beta_fast":8'
            extra="--rope-scaling yarn --rope-factor 4 --rope-orig-ctx 32 --rope-attn-factor 0.875 --yarn-beta-fast 8" ;;
        llamalinear) arch=llama; scaling=linear; rope='"rope_factor":2'; extra="--rope-scaling linear --rope-factor 2" ;;
        # mixture of experts: 8 experts top-2, 64 top-8 (tiny experts), qwen2moe's shared expert, Mixtral
        qwen3moe) nexp=8; nused=2; effn=256 ;;
        qwen3moe64) arch=qwen3moe; nexp=64; nused=8; effn=256 ;;
        qwen2moe) nexp=8; nused=2; effn=256; sffn=512 ;;
        mixtral) arch=llama; nexp=8; nused=2; ffn=256 ;;
        # 6 layers: llama.cpp's rule makes layer 5 global, 0-4 sliding (window 4)
        gemma3) extra="--tied --swa 4"; tied=true; layers=6; swa=',"swa":4' ;;
        # head size 96 like Phi-3-mini's: its q scale 1/sqrt(96) is not a power of 2
        phi3) dim=768; heads=8; kv=4 ;;
        # gpt-oss: 8 experts top 2 with biases, sinks, YaRN; 4 layers alternate sliding (window 4) and full
        gptoss) arch=gpt-oss; nexp=8; nused=2; effn=256; layers=4; extra="--swa 4"; swa=',"swa":4' ;;
        # gpt-oss-20b's routing (32 experts top 4) and head shape (head size 64, 8 query heads per KV head)
        gptoss32) arch=gpt-oss; nexp=32; nused=4; effn=256; layers=4; dim=512; heads=8; kv=1; extra="--swa 4"; swa=',"swa":4' ;;
        # 3 layers: one dense, two MoE; 16 experts top 4 in 4 groups (2 used), or 8 top 2
        deepseek2v3) arch=deepseek2; variant=v3; layers=3; kv=4; nexp=16; nused=4; effn=256 ;;
        deepseek2v3yarn) arch=deepseek2; variant=v3yarn; layers=3; kv=4; nexp=16; nused=4; effn=256 ;;
        deepseek2lite) arch=deepseek2; variant=lite; layers=3; kv=4; nexp=8; nused=2; effn=256 ;;
        # the unsplit attn_kv_b layout of GGUFs converted before llama.cpp's MLA (llama.cpp runs them as MHA)
        deepseek2v3kvb) arch=deepseek2; variant=v3kvb; layers=3; kv=4; nexp=16; nused=4; effn=256 ;;
        deepseek2litekvb) arch=deepseek2; variant=litekvb; layers=3; kv=4; nexp=8; nused=2; effn=256 ;;
    esac
    [ $nexp -gt 0 ] && extra="$extra --experts $nexp --experts-used $nused"
    [ $effn -gt 0 ] && extra="$extra --expert-ffn $effn"
    [ $sffn -gt 0 ] && extra="$extra --shared-ffn $sffn"
    [ -n "$variant" ] && { extra="$extra --variant $variant"; swa=",\"variant\":\"$variant\""; }
    args="--arch $arch --dim $dim --layers $layers --heads $heads --kv-heads $kv --ffn $ffn --ctx 512 --type $t --seed $seed $extra"
    # shellcheck disable=SC2086
    ./cumulo synth $args --vocab "$VOCAB" -o "$TMP/$name.gguf" --threads 2
    moe=""
    [ $nexp -gt 0 ] && moe=$(printf ',"experts":%d,"experts_used":%d,"expert_ffn":%d,"shared_ffn":%d' $nexp $nused $effn $sffn)
    meta=$(printf '{"name":"%s","command":"cumulo synth %s --vocab ggml-vocab-llama-spm.gguf","synth":{"arch":"%s","dim":%d,"layers":%d,"heads":%d,"kv_heads":%d,"ffn":%d,"ctx":512,"type":"%s","seed":%d,"tied":%s,"rope_scaling":"%s"%s%s%s,"vocab":"vocab/ggml-vocab-llama-spm.gguf"}}' \
        "$name" "$args" "$arch" "$dim" "$layers" "$heads" "$kv" "$ffn" "$t" "$seed" "$tied" "$scaling" "$moe" "$swa" "${rope:+,$rope}")
    abs=$(pwd)
    if [ -n "$kvt" ]; then
        (cd "$NLC" && KV_K=$kvt KV_V=$kvt FA=1 node synth_oracle.mjs "$TMP/$name.gguf" "$abs/$OUT/$name.json" "$PROMPTS" 32 16 "$meta")
    else
        (cd "$NLC" && node synth_oracle.mjs "$TMP/$name.gguf" "$abs/$OUT/$name.json" "$PROMPTS" 32 16 "$meta")
    fi
    rm -f "$TMP/$name.gguf"
}
# gen_all VARIANTS TYPES [KV_TYPE]: gen every variant x type, in that order,
# with the seeds after $seed (which it advances).
gen_all() {
    for v in $1; do
        for t in $2; do
            seed=$((seed + 1))
            gen "$v" "$t" "$seed" "${3:-}"
        done
    done
}
seed=1000
gen_all "$VARIANTS" "$TYPES"
for list in "$MOE_VARIANTS" "$DENSE2_VARIANTS"; do
    seed=1060
    gen_all "$list" "$TYPES"
done
seed=3000
gen_all "$LOWBIT_VARIANTS" "$LOWBIT_TYPES"
seed=4000
gen_all gptoss "$GPTOSS_TYPES"
gen gptoss32 mxfp4 4011
seed=4000 # deepseek2's seeds also start at 4001 (another architecture: no clash)
gen_all "$DS_VARIANTS" "$DS_TYPES"
seed=4000 # the RoPE scaling models' seeds also start at 4001
gen_all "$ROPE_VARIANTS" "$ROPE_TYPES"
seed=4100
gen_all deepseek2v3yarn "$DS_YARN_TYPES"
seed=4200
gen_all "$DS_KVB_VARIANTS" "$DS_KVB_TYPES"
# KV cache types (seeds from 4100): llama.cpp with flash attention and a
# Q8_0 / Q4_0 K and V cache (node-llama-cpp's experimentalKvCache*Type).
seed=4100
for kvt in Q8_0 Q4_0 F16; do
    gen_all "llama qwen3" "f32 q8_0" "$kvt"
done
# Other shapes (head sizes 48-256, 6/10 heads, GQA 3/5, one KV head, odd FFN widths), BPE vocabularies and
# prompts of 100-300 ids (past gemma3's and gpt-oss's windows, YaRN's original context); seeds from 7001
# (tools/synth_shapes.txt, the case lines of tools/synth_sweep.sh, which writes only missing references:
# delete a JSON to redo it).
SWEEP_DIR=$OUT SWEEP_CMP=0 sh tools/synth_sweep.sh "$NLC" "$ONLY" tools/synth_shapes.txt
