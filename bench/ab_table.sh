#!/bin/sh
# ab_table.sh: before/after of a kernel change against native llama.cpp.
# For each type and thread count, `cumulo bench --vs-llamacpp` (cumulo and
# llama.cpp interleaved A B A B) with the BEFORE binary, then the same with the
# AFTER binary, so the two rows of a type share the same minutes of a shared
# machine; each row's ratio comes from its own interleaved run. One JSON line
# per row into $OUT/ab.jsonl ("which": before|after, "load": /proc/loadavg at
# its start), then a markdown table on stdout. Models as bench/run_table.sh
# makes them (llama1b-TYPE.gguf in $MODELS).
#
#   BEFORE=/tmp/old/build/cumulo AFTER=./cumulo MODELS=/work/cache/bench-1b \
#     TYPES="q8_0 f16" THREADS="1 2" REPS=2 sh bench/ab_table.sh
# ISA=avx2 runs both binaries with CUMULO_ISA=avx2 against bench/llamacpp.sh's
# avx2 build (unless CUMULO_LLAMACPP_BENCH names another).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
BEFORE=${BEFORE:?set BEFORE to the cumulo binary before the change}
AFTER=${AFTER:-$here/cumulo}
MODELS=${MODELS:-/tmp/cumulo-bench-1b}
OUT=${OUT:-/tmp/cumulo-ab}
TYPES=${TYPES:-q4_0 q8_0 q4_k_m f16 q6_k q5_k_m}
THREADS=${THREADS:-1}
REPS=${REPS:-2}
[ -n "${CUMULO_LLAMACPP_BENCH:-}" ] || CUMULO_LLAMACPP_BENCH=$(sh "$here/bench/llamacpp.sh" "${ISA:-native}")
export CUMULO_LLAMACPP_BENCH
[ -n "${ISA:-}" ] && export CUMULO_ISA="$ISA"
mkdir -p "$OUT"
: >"$OUT/ab.jsonl"
for th in $THREADS; do
    for t in $TYPES; do
        for which in before after; do
            bin=$BEFORE
            [ "$which" = after ] && bin=$AFTER
            load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
            echo "ab_table.sh: $which $t, $th thread(s), load $load" >&2
            line=$("$bin" bench "$MODELS/llama1b-$t.gguf" --threads "$th" --prompt 128 --gen 64 --reps "$REPS" \
                --kv-type f16 --vs-llamacpp --json)
            printf '{"which":"%s","load":"%s",%s\n' "$which" "$load" "${line#\{}" >>"$OUT/ab.jsonl"
        done
    done
done
node - "$OUT/ab.jsonl" <<'JS'
const fs = require("fs");
const rows = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map(JSON.parse);
const f = (x, d = 1) => (x === undefined || x === null ? "-" : x.toFixed(d));
console.log("| model | threads | cumulo | load | prompt tok/s cumulo | llama.cpp | ratio | decode tok/s cumulo | llama.cpp | ratio |");
console.log("|---|---|---|---|---|---|---|---|---|---|");
for (const r of rows) {
  const l = r.llamacpp || {};
  const type = r.model.replace(/^llama1b-/, "").replace(/\.gguf$/, "").toUpperCase();
  console.log(`| ${type} | ${r.threads} | ${r.which} | ${r.load} | ${f(r.pp_tokens_per_s)} | ${f(l.pp_tokens_per_s)} | ` +
    `${f(r.pp_ratio, 2)} | ${f(r.tg_tokens_per_s)} | ${f(l.tg_tokens_per_s)} | ${f(r.tg_ratio, 2)} |`);
}
JS
