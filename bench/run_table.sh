#!/bin/sh
# run_table.sh: the table of issue 3 — cumulo vs llama.cpp on 1B-class
# `cumulo synth` models (llama arch, dim 2048, 16 layers, 32 heads, 8 KV heads,
# FFN 5632, separate output) in Q4_0, Q8_0, Q4_K_M, F16, Q6_K and Q5_K_M, at 1 and 2
# threads, interleaved A B A B with the read bandwidth measured in the same
# run (cumulo bench --vs-llamacpp). Prints a markdown table on stdout, one
# JSON line per row into $OUT/results.jsonl, progress on stderr.
#
# Models are generated into $MODELS (default /tmp/cumulo-bench-1b; never
# commit them) once and reused. The anchor is llama-bench built natively for
# this CPU by bench/llamacpp.sh ($CUMULO_LLAMACPP_BENCH, else that script's
# native build, built on first use: 30+ minutes on 2 cores); ANCHOR=node uses
# node-llama-cpp in $CUMULO_ORACLE_DIR instead (the old, weaker anchor).
# EXTRA="--isa avx2" with CUMULO_LLAMACPP_BENCH=.../avx2/bin/llama-bench gives
# the AVX2-only rows; so does ISA=avx2 (runs cumulo with CUMULO_ISA=avx2 and,
# unless CUMULO_LLAMACPP_BENCH says otherwise, bench/llamacpp.sh's avx2 build).
#
# LLAMACPP_BUILD=noamx picks bench/llamacpp.sh's build without AMX (on CPUs
# where the native build's AMX matmul crashes: llama.cpp issue 20824).
#
#   sh bench/run_table.sh                 # everything (about 20-40 min on 2 cores)
#   TYPES="q4_0 f16" THREADS="2" REPS=3 sh bench/run_table.sh
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
CUMULO=${CUMULO:-$here/cumulo}
SHARED=${CUMULO_SHARED:-$here/../shared}
MODELS=${MODELS:-/tmp/cumulo-bench-1b}
OUT=${OUT:-$MODELS}
TYPES=${TYPES:-q4_0 q8_0 q4_k_m f16 q6_k q5_k_m}
THREADS=${THREADS:-1 2}
REPS=${REPS:-3}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
KV=${KV:-f16}  # llama.cpp (node-llama-cpp) keeps an F16 KV cache by default: same for both
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf

[ -x "$CUMULO" ] || { echo "run_table.sh: build cumulo first (make cumulo)" >&2; exit 1; }
if [ "${ANCHOR:-native}" = native ] && [ -z "${CUMULO_LLAMACPP_BENCH:-}" ]; then
    CUMULO_LLAMACPP_BENCH=$(sh "$here/bench/llamacpp.sh" "${ISA:-${LLAMACPP_BUILD:-native}}")
fi
[ -n "${ISA:-}" ] && export CUMULO_ISA="$ISA"
[ "${ANCHOR:-native}" = native ] && export CUMULO_LLAMACPP_BENCH
[ "${ANCHOR:-native}" = native ] || unset CUMULO_LLAMACPP_BENCH
mkdir -p "$MODELS" "$OUT"
for t in $TYPES; do
    m=$MODELS/llama1b-$t.gguf
    [ -f "$m" ] && continue
    echo "run_table.sh: synthesizing $m" >&2
    "$CUMULO" synth --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 \
        --type "$t" --vocab "$VOCAB" --seed 1 -o "$m" >&2
done

: >"$OUT/results.jsonl"
for t in $TYPES; do
    for th in $THREADS; do
        echo "run_table.sh: $t, $th thread(s)" >&2
        "$CUMULO" bench "$MODELS/llama1b-$t.gguf" --threads "$th" --prompt "$PROMPT" --gen "$GEN" \
            --reps "$REPS" --kv-type "$KV" --vs-llamacpp ${EXTRA:-} --json >>"$OUT/results.jsonl"
    done
done

node "$here/bench/bench_table.js" "$OUT/results.jsonl" "llama1b-"
