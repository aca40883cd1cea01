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
#      defaults: "1024 4096 16384" "2" 1 "f16"; VARIANTS="cumulo llamacpp" (add cumulo-fa)
#
# Finishing under an outside time limit (a 16k prompt is minutes per run on
# a loaded machine): every result line is also appended to $OUT (default
# bench/results/longctx-DATE.txt, kept with the other results) and a run whose (depth, threads,
# kv, round, variant) is already there is skipped, so calling the script
# again with the same arguments resumes where the last call stopped. Each run
# is limited to RUN_LIMIT seconds (default 1800; its line then says
# "timeout" and counts as done). Depths run shallow to deep, both engines at
# each depth before the next.
set -eu
cd "$(dirname "$0")/.."
DEPTHS=${1:-"1024 4096 16384"}
THREADS=${2:-2}
ROUNDS=${3:-1}
KVS=${4:-f16}
VARIANTS=${VARIANTS:-"cumulo llamacpp"}
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
LB=${LLAMA_BATCHED_BENCH:-/work/cache/llamacpp-native/native/bin/llama-batched-bench}
OUT=${OUT:-bench/results/longctx-$(date -u +%F).txt}
RUN_LIMIT=${RUN_LIMIT:-1800}
mkdir -p "$(dirname "$OUT")"
touch "$OUT"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus; model $MODEL; results also in $OUT"
for n in $DEPTHS; do
    for T in $THREADS; do
        for kv in $KVS; do
            r=1
            while [ "$r" -le "$ROUNDS" ]; do
                for v in $VARIANTS; do
                    key="depth $n threads $T kv $kv round $r $v "
                    if grep -q "^$key" "$OUT"; then
                        echo "done before: $(grep "^$key" "$OUT" | tail -n 1)"
                        continue
                    fi
                    l0=$(cut -d' ' -f1 /proc/loadavg)
                    t0=$(date +%s)
                    rc=0
                    case $v in
                    cumulo | cumulo-fa)
                        fa=""
                        [ "$v" = cumulo-fa ] && fa=-fa
                        out=$(timeout "$RUN_LIMIT" ./cumulo bench "$MODEL" --threads "$T" --prompt "$n" --gen 32 --reps 1 \
                            -ctk "$kv" -ctv "$kv" $fa --json 2>/dev/null) || rc=$?
                        pp=$(echo "$out" | perl -ne 'print $1 if /"pp_tokens_per_s":([0-9.]+)/')
                        tg=$(echo "$out" | perl -ne 'print $1 if /"tg_tokens_per_s":([0-9.]+)/') ;;
                    llamacpp)
                        out=$(timeout "$RUN_LIMIT" "$LB" -m "$MODEL" -t "$T" -c $((n + 64)) -npp "$n" -ntg 32 -npl 1 \
                            -ctk "$kv" -ctv "$kv" 2>/dev/null) || rc=$?
                        pp=$(echo "$out" | perl -ne 'if (/^\|\s*\d+\s*\|/) { my @f = split /\s*\|\s*/; print $f[6] }')
                        tg=$(echo "$out" | perl -ne 'if (/^\|\s*\d+\s*\|/) { my @f = split /\s*\|\s*/; print $f[8] }') ;;
                    esac
                    note=""
                    [ "$rc" = 124 ] && note=" timeout after ${RUN_LIMIT}s"
                    [ "$rc" != 0 ] && [ "$rc" != 124 ] && note=" exit $rc"
                    line="${key}pp_tok_s ${pp:-?} tg_tok_s ${tg:-?} load $l0 $(cut -d' ' -f1 /proc/loadavg)"
                    line="$line $(($(date +%s) - t0))s $(date -u +%FT%TZ)$note"
                    echo "$line"
                    echo "$line" >>"$OUT"
                done
                r=$((r + 1))
            done
        done
    done
done
