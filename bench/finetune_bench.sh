#!/bin/sh
# bench/finetune_bench.sh: LoRA training throughput of `cumulo finetune` as a
# share of the kernels' measured matmul peak.
#
#   sh bench/finetune_bench.sh [MODEL.gguf]
#
# MODEL: default the 1B-class synthetic llama of run_table.sh
# (/work/cache/bench-1b/llama1b-q4_0.gguf, else `cumulo synth` makes it: dim
# 2048, 16 layers, 32 heads / 8 KV, ffn 5632, vocabulary 32000, q4_0).
# For each thread count (THREADS, default "1 2") it trains STEPS optimizer
# steps (default 3) of one window of CTX tokens (default 32; rank 8, every
# target, no validation) and takes the steady rate between the first step
# and the last (the first step also pays for the weights' page faults):
# tokens/s. The trainer (src/train/train_model.c) multiplies F32 rows it
# dequantizes 64 at a time with the kernels' F32 gemm, so the peak is that
# gemm's rate measured by bench/kbench.c on a block the size of the
# trainer's (KBENCH_ROWS=32 x 4096 F32 = 512 KiB, cache-resident as the
# trainer's dequantized rows are; KBENCH_TYPES=f32, KBENCH_TOK=CTX; one
# thread, times the thread count for more threads). FLOPs per trained
# token are those the trainer performs: the layers' weight matmuls 3 times
# (forward, the per-layer recomputation, the input gradient W^T dy), the
# output head twice (logits, their input gradient), attention 4 times its
# causal forward, LoRA 4 times its forward. Measurements interleave
# (kbench, train 1, train 2, ...) REPS times (default 2) and each rep's
# ratio uses its own peak; the machine's load shows in the spread.
# The last line is JSON.
set -e
cd "$(dirname "$0")/.."
BIN=${CUMULO:-build/cumulo}
KB=build/bench/kbench
THREADS=${THREADS:-"1 2"}
CTX=${CTX:-32}
STEPS=${STEPS:-3}
REPS=${REPS:-2}
RANK=8
[ -x "$BIN" ] && [ -x "$KB" ] || make -s -j2 cumulo "$KB" >&2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MODEL=${1:-/work/cache/bench-1b/llama1b-q4_0.gguf}
if [ ! -r "$MODEL" ]; then
    MODEL=$TMP/llama1b-q4_0.gguf
    echo "finetune_bench: synthesizing $MODEL" >&2
    "$BIN" synth --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 --type q4_0 \
        --vocab "${CUMULO_SHARED:-../shared}/vocab/ggml-vocab-llama-spm.gguf" --seed 1 -o "$MODEL" >/dev/null
fi
# data: one long example, so every window is a full CTX tokens (a long
# example is cut into pieces of CTX + 1; only its last piece is shorter)
{
    printf '{"text": "'
    i=0
    while [ $i -lt 400 ]; do
        printf 'Story %d: the little robot Pim counted %d stars, then %d moons over the quiet hills of town %d. ' \
            $i $((i * 7 % 13)) $((i * 11 % 17)) $i
        i=$((i + 1))
    done
    printf '"}\n'
} >"$TMP/data.jsonl"
# shape: "16 layers, embedding 2048, 32 heads (8 KV, dim 64), ffn 5632, vocabulary 32000"
shape=$("$BIN" info "$MODEL" 2>/dev/null | sed -n 's/^shape: *//p')
set -- $(echo "$shape" | sed 's/[^0-9 ]//g')
L=$1 E=$2 H=$3 HKV=$4 D=$5 F=$6 V=$7
[ -n "$V" ] || { echo "finetune_bench: cannot read the model's shape from 'cumulo info': '$shape'" >&2; exit 1; }
FLOPS_TOK=$(awk -v L="$L" -v E="$E" -v H="$H" -v K="$HKV" -v D="$D" -v F="$F" -v V="$V" -v T="$CTX" -v r="$RANK" 'BEGIN {
    Q = H * D; KV = K * D
    pl = E * Q + 2 * E * KV + Q * E + 3 * E * F          # weights of one layer
    lora = (E + Q) + 2 * (E + KV) + (Q + E) + 2 * (E + F) + (F + E)
    per = 6 * pl * L + 4 * E * V + 8 * H * D * (T + 1) / 2 * L + 8 * r * lora * L
    printf "%.0f", per }')
peak() { # GFLOP/s of the F32 gemm at CTX tokens, one thread: best ISA's "gemm GB/s" / 4 bytes * 2 flops
    KBENCH_ROWS=32 KBENCH_TYPES=f32 KBENCH_TOK=$CTX KBENCH_REPS=5 "$KB" 2>/dev/null | awk '$1 == "f32" && $2 != "scalar" { if ($5 > b) b = $5 } END { printf "%.2f", b / 2 }'
}
train() { # THREADS -> steady tokens/s between step 1 and the last
    "$BIN" finetune "$MODEL" --data "$TMP/data.jsonl" --out "$TMP/a.gguf" --steps "$STEPS" --batch 1 --ctx "$CTX" \
        --val-split 0 --rank $RANK --threads "$1" 2>"$TMP/ft.log" >/dev/null || { cat "$TMP/ft.log" >&2; return 1; }
    tr '\r' '\n' <"$TMP/ft.log" | awk -v S="$STEPS" '
        / step [0-9]+\/[0-9]+ / { for (i = 1; i <= NF; i++) { if ($i == "step") { split($(i + 1), a, "/"); k = a[1] } if ($i == "tok/s") r[k] = $(i - 1) } }
        END { if (!(1 in r) || !(S in r) || S < 2) { print "nan"; exit }
              n = (S - 1) * '"$CTX"'; t1 = '"$CTX"' / r[1]; tS = S * '"$CTX"' / r[S]; printf "%.3f", n / (tS - t1) }'
}
echo "finetune_bench: $(basename "$MODEL"): $shape; window $CTX tokens, rank $RANK, $STEPS steps"
echo "cpu: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) online; load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%.3f GFLOP per trained token\n" "$(echo "$FLOPS_TOK" | awk '{print $1 / 1e9}')"
printf "%-4s %-7s %12s %14s %14s %9s\n" rep threads "tokens/s" "GFLOP/s" "peak GFLOP/s" "% peak"
json=""
rep=1
while [ $rep -le "$REPS" ]; do
    pk=$(peak)
    for t in $THREADS; do
        tps=$(train "$t")
        line=$(awk -v tps="$tps" -v f="$FLOPS_TOK" -v pk="$pk" -v t="$t" 'BEGIN {
            g = tps * f / 1e9; p = pk * t; printf "%.3f %.2f %.2f %.1f", tps, g, p, 100 * g / p }')
        set -- $line
        printf "%-4s %-7s %12s %14s %14s %8s%%\n" "$rep" "$t" "$1" "$2" "$3" "$4"
        json="$json${json:+,}{\"rep\":$rep,\"threads\":$t,\"tokens_per_s\":$1,\"gflops\":$2,\"peak_gflops\":$3,\"pct_peak\":$4}"
    done
    rep=$((rep + 1))
done
echo "{\"bench\":\"finetune\",\"model\":\"$(basename "$MODEL")\",\"ctx\":$CTX,\"rank\":$RANK,\"flop_per_token\":$FLOPS_TOK,\"runs\":[$json]}"
