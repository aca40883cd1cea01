#!/bin/sh
# real_spread.sh: llama.cpp against llama.cpp on a real model. Runs
# tools/llama_logits.c, linked to a llama.cpp build of bench/llamacpp.sh
# (native or avx2), on every prompt of tests/data/real/MODEL.json and prints
# tools/real_spread.py's comparison with that reference (node-llama-cpp's
# prebuilt llama.cpp): the spread between two builds of llama.cpp itself,
# which tests/sh/real_models.sh's bounds are measured against. By hand only
# (a benchmark-like measurement, minutes of CPU); never in CI.
#
#   sh tools/real_spread.sh MODEL [BUILD [REPACK]]
#     MODEL: smollm2 | gemma3-270m; BUILD: native (default) | avx2;
#     REPACK: 1 (llama.cpp's default weight repacking) | 0
#   AT=CASE:STEP sh tools/real_spread.sh ...   # one step of one case
#     teacher-forced: llama.cpp gets the prompt and the reference's first STEP
#     greedy ids, one token per decode (ONEBYONE=0: as one batch), so a step
#     where cumulo parts from the reference is compared on the same prefix
set -eu
cd "$(dirname "$0")/.."
model=$1 build=${2:-native} repack=${3:-1}
CACHE=${LLAMACPP_CACHE:-/work/cache/llamacpp-native}
src=$CACHE/llama_cpp_python-${LLAMACPP_PY_VERSION:-0.3.36}/vendor/llama.cpp
lib=$CACHE/$build
[ -f "$lib/src/libllama.a" ] || { echo "real_spread: no llama.cpp build in $lib (sh bench/llamacpp.sh $build)" >&2; exit 1; }
ref=tests/data/real/$model.json
path=$(sh scripts/real_models.sh "$model" | tail -1 | cut -d' ' -f2-)
out=${TMPDIR:-/tmp}/real_spread.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
cc -O2 -c tools/llama_logits.c -I"$src/include" -I"$src/ggml/include" -o "$out/llama_logits.o"
c++ -o "$out/llama_logits" "$out/llama_logits.o" "$lib/src/libllama.a" "$lib/ggml/src/libggml.a" \
    "$lib/ggml/src/libggml-cpu.a" "$lib/ggml/src/libggml-base.a" -fopenmp -lpthread -lm
at=${AT:+${AT#*:}}
cases=${AT:+${AT%%:*}}
for c in ${cases:-$(python3 -c "import json,sys; print(' '.join(c['name'] for c in json.load(open(sys.argv[1]))['cases']))" "$ref")}; do
    ids=$(python3 -c "import json,sys; c=[c for c in json.load(open(sys.argv[1]))['cases'] if c['name']==sys.argv[2]][0]; k=int(sys.argv[3]); print(','.join(map(str,c['prompt']+c['greedy'][:k])), len(c['greedy'])-k)" "$ref" "$c" "${at:-0}")
    mkdir -p "$out/$c"
    # shellcheck disable=SC2086
    set -- $ids
    "$out/llama_logits" "$path" "$1" "$2" "$out/$c" "$repack" "${at:+${ONEBYONE:-1}}" >/dev/null 2>"$out/$c/err" ||
        { echo "real_spread: $c: $(tail -2 "$out/$c/err")" >&2; exit 1; }
done
echo "# $model: llama.cpp $build build, repack $repack${AT:+, teacher-forced to $AT, one by one ${ONEBYONE:-1}}, against $ref"
python3 tools/real_spread.py "$ref" "$out" "${at:-0}"
