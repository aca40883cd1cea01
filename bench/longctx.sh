#!/bin/sh
# longctx.sh: decode tokens/s after N tokens of context, cumulo (F16 KV,
# two-pass attention over the transposed cache; and -fa: tiled online-softmax
# attention over K/V rows, model/attn.c) vs llama.cpp built natively
# (llama-batched-bench -npp N -ntg 32 -npl 1, its default flash attention),
# same file, threads and KV type, interleaved A B C A B C. Prints one line per
# run and the CPU / load; the numbers go to bench/README.md by hand.
#
#   sh bench/longctx.sh [DEPTHS] [THREADS] [ROUNDS]     (default "1024 4096" 2 2)
set -eu
cd "$(dirname "$0")/.."
DEPTHS=${1:-"1024 4096"}
T=${2:-2}
ROUNDS=${3:-2}
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
LB=${LLAMA_BATCHED_BENCH:-/work/cache/llamacpp-native/native/bin/llama-batched-bench}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $DEPTHS; do
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        for v in cumulo cumulo-fa llamacpp; do
            case $v in
            cumulo) tg=$(./cumulo bench "$MODEL" --threads "$T" --prompt "$n" --gen 32 --reps 1 --kv-type f16 --json 2>/dev/null |
                perl -ne 'print $1 if /"tg_tokens_per_s":([0-9.]+)/') ;;
            cumulo-fa) tg=$(./cumulo bench "$MODEL" --threads "$T" --prompt "$n" --gen 32 --reps 1 --kv-type f16 -fa --json 2>/dev/null |
                perl -ne 'print $1 if /"tg_tokens_per_s":([0-9.]+)/') ;;
            llamacpp) tg=$("$LB" -m "$MODEL" -t "$T" -c $((n + 64)) -npp "$n" -ntg 32 -npl 1 -ctk f16 -ctv f16 2>/dev/null |
                perl -ne 'if (/^\|\s*\d+\s*\|/) { my @f = split /\s*\|\s*/; print $f[8] }') ;;
            esac
            echo "depth $n round $r $v tg_tok_s ${tg:-?} load $(cut -d' ' -f1 /proc/loadavg)"
        done
        r=$((r + 1))
    done
done
