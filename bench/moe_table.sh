#!/bin/sh
# moe_table.sh: issue 14 item 5 — mixture-of-experts decode and prompt,
# cumulo vs llama.cpp on the same synthetic qwen3moe shaped like
# Qwen3-30B-A3B (dim 2048, 32 heads / 4 KV heads, 128 experts top 8, expert
# width 768) with its 48 layers scaled to LAYERS (default 8: a ~3 GB file in
# Q4_K_M, 0.29 GB read per token) and llama-spm's 32000-token vocabulary
# (Qwen's 151936 would make the head, not the experts, half of a token's
# bytes). `cumulo synth` cannot set the head size apart from dim / heads:
# head_dim is 64 here (Qwen3-30B-A3B: 128; the same Q/K/V bytes and KV bytes
# per token either way). Interleaved A B A B with the read bandwidth measured
# in the same run (cumulo bench --vs-llamacpp); the roofline counts the bytes a
# token reads: attention, router, the 8 experts it uses of each layer, head.
# Prints a markdown table on stdout, one JSON line per row into
# $OUT/results.jsonl, progress on stderr.
#
# Models go to $MODELS (default /tmp/cumulo-bench-moe; never commit them),
# made once by `cumulo synth` (seed 1) and reused. The anchor is llama-bench
# built natively for this CPU ($CUMULO_LLAMACPP_BENCH, else bench/llamacpp.sh's
# $LLAMACPP_BUILD build, default native; noamx on CPUs whose AMX build crashes
# on quantized models, llama.cpp issue 20824). On a machine others share, CHRT=1
# runs each row under `chrt -f 10` (SCHED_FIFO: the run gets the cores).
#
#   sh bench/moe_table.sh                      # q4_k_m and q4_0, 1 and 2 threads
#   TYPES=q4_k_m THREADS=2 REPS=3 LLAMACPP_BUILD=noamx sh bench/moe_table.sh
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
CUMULO=${CUMULO:-$here/cumulo}
SHARED=${CUMULO_SHARED:-$here/../shared}
MODELS=${MODELS:-/tmp/cumulo-bench-moe}
OUT=${OUT:-$MODELS}
TYPES=${TYPES:-q4_k_m q4_0}
THREADS=${THREADS:-1 2}
LAYERS=${LAYERS:-8}
REPS=${REPS:-3}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
KV=${KV:-f16}
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf

[ -x "$CUMULO" ] || { echo "moe_table.sh: build cumulo first (make cumulo)" >&2; exit 1; }
if [ -z "${CUMULO_LLAMACPP_BENCH:-}" ]; then
    CUMULO_LLAMACPP_BENCH=$(sh "$here/bench/llamacpp.sh" "${LLAMACPP_BUILD:-native}")
fi
export CUMULO_LLAMACPP_BENCH
FIFO=
[ "${CHRT:-0}" = 1 ] && FIFO="chrt -f 10"
mkdir -p "$MODELS" "$OUT"
for t in $TYPES; do
    m=$MODELS/qwen3moe-a3b$LAYERS-$t.gguf
    [ -f "$m" ] && continue
    echo "moe_table.sh: synthesizing $m" >&2
    "$CUMULO" synth --arch qwen3moe --dim 2048 --layers "$LAYERS" --heads 32 --kv-heads 4 --ffn 6144 \
        --experts 128 --experts-used 8 --expert-ffn 768 --type "$t" --vocab "$VOCAB" --seed 1 -o "$m" >&2
done

: >"$OUT/results.jsonl"
for t in $TYPES; do
    for th in $THREADS; do
        echo "moe_table.sh: $t, $th thread(s)" >&2
        $FIFO "$CUMULO" bench "$MODELS/qwen3moe-a3b$LAYERS-$t.gguf" --threads "$th" --prompt "$PROMPT" --gen "$GEN" \
            --reps "$REPS" --kv-type "$KV" --vs-llamacpp ${EXTRA:-} --json >>"$OUT/results.jsonl"
    done
done

node "$here/bench/bench_table.js" "$OUT/results.jsonl" "qwen3moe-a3b[0-9]+-" --bytes-per-token
