#!/bin/sh
# longctx.sh: prompt and decode tokens/s at N tokens of context, cumulo vs
# llama.cpp built natively (llama-batched-bench -npp N -ntg 32 -npl 1, its
# default flash attention), same file, threads and KV type (-ctk/-ctv),
# interleaved A B A B. cumulo's variants: `cumulo` (the default layout: the
# transposed cache for f32/f16, two-pass attention, split over KV blocks in
# decode past 512 positions; rows for q8_0/q4_0) and `cumulo-fa` (-fa: K/V
# rows for f16 too, model/attn.c). Prints one line per run and the CPU / load
# before each; the numbers go to bench/README.md by hand.
#
#   sh bench/longctx.sh [DEPTHS] [THREADS] [ROUNDS] [KV_TYPES]
#      defaults: "1024 4096" "2" 2 "f16"; VARIANTS="cumulo llamacpp" (add cumulo-fa)
set -eu
cd "$(dirname "$0")/.."
DEPTHS=${1:-"1024 4096"}
THREADS=${2:-2}
ROUNDS=${3:-2}
KVS=${4:-f16}
VARIANTS=${VARIANTS:-"cumulo llamacpp"}
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
LB=${LLAMA_BATCHED_BENCH:-/work/cache/llamacpp-native/native/bin/llama-batched-bench}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus; model $MODEL"
for n in $DEPTHS; do
    for T in $THREADS; do
        for kv in $KVS; do
            r=1
            while [ "$r" -le "$ROUNDS" ]; do
                for v in $VARIANTS; do
                    l0=$(cut -d' ' -f1 /proc/loadavg)
                    case $v in
                    cumulo | cumulo-fa)
                        fa=""
                        [ "$v" = cumulo-fa ] && fa=-fa
                        out=$(./cumulo bench "$MODEL" --threads "$T" --prompt "$n" --gen 32 --reps 1 -ctk "$kv" -ctv "$kv" \
                            $fa --json 2>/dev/null || true)
                        pp=$(echo "$out" | perl -ne 'print $1 if /"pp_tokens_per_s":([0-9.]+)/')
                        tg=$(echo "$out" | perl -ne 'print $1 if /"tg_tokens_per_s":([0-9.]+)/') ;;
                    llamacpp)
                        out=$("$LB" -m "$MODEL" -t "$T" -c $((n + 64)) -npp "$n" -ntg 32 -npl 1 -ctk "$kv" -ctv "$kv" 2>/dev/null ||
                            true)
                        pp=$(echo "$out" | perl -ne 'if (/^\|\s*\d+\s*\|/) { my @f = split /\s*\|\s*/; print $f[6] }')
                        tg=$(echo "$out" | perl -ne 'if (/^\|\s*\d+\s*\|/) { my @f = split /\s*\|\s*/; print $f[8] }') ;;
                    esac
                    echo "depth $n threads $T kv $kv round $r $v pp_tok_s ${pp:-?} tg_tok_s ${tg:-?} load $l0 $(cut -d' ' -f1 /proc/loadavg)"
                done
                r=$((r + 1))
            done
        done
    done
done
