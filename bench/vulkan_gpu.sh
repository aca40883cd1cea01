#!/bin/sh
# vulkan_gpu.sh: the GPU table of issue 16 in one run, for the few minutes a
# machine with a GPU is at hand (the H200 device machine: one short prepared
# script). Builds build/cumulo when it is missing (glslc and the Vulkan
# headers needed: scripts/setup.sh), shows the device (vulkaninfo,
# nvidia-smi, `cumulo info --gpu`), writes 1B-class synthetic llama models
# when no model is given (the device machine has no model cache: dim 2048,
# 16 layers, 32/8 heads, ffn 8192, the builtin vocabulary), then for each
# model one `cumulo bench` JSON line with every layer on the first GPU
# (--gpu auto) and one on the CPU (CPU=0 skips it), and the decode speed
# as % of the GPU's memory bandwidth (PEAK_GBS, default 4800: an H200's
# HBM3e) counting the file's bytes once per token. Speed is printed, never
# asserted. llama.cpp's Vulkan llama-bench beside it when LLAMA_BENCH_VK
# names one (the device machine cannot download it).
#   bench/vulkan_gpu.sh [MODEL.gguf ...]      OUT=dir for the models and logs
cd "$(dirname "$0")/.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
OUT=${OUT:-/tmp/cumulo-vkbench}
PEAK_GBS=${PEAK_GBS:-4800}
mkdir -p "$OUT"
if [ ! -x "$BIN" ]; then
    echo "# building $BIN"
    make -j"$(nproc)" cumulo >"$OUT/build.log" 2>&1 || { echo "build failed: $(tail -5 "$OUT/build.log")"; exit 1; }
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
command -v vulkaninfo >/dev/null && vulkaninfo --summary 2>&1 | grep -E 'deviceName|driverName|apiVersion' | head -8
"$BIN" info --gpu || { echo "no Vulkan device here: no table (the reason is above)"; exit 1; }
if [ $# -eq 0 ]; then
    for ty in q4_0 q8_0 q4_k_m; do
        m=$OUT/llama1b-$ty.gguf
        [ -s "$m" ] || timeout 300 "$BIN" synth --arch llama --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 \
            --type "$ty" --vocab builtin --seed 1 -o "$m" >"$OUT/synth.log" 2>&1 ||
            { echo "synth $ty failed: $(tail -3 "$OUT/synth.log")"; continue; }
        set -- "$@" "$m"
    done
fi
for m in "$@"; do
    bytes=$(wc -c <"$m")
    for g in auto none; do
        [ $g = none ] && [ "${CPU:-1}" = 0 ] && continue
        echo "# $(basename "$m") --gpu $g"
        timeout 240 "$BIN" bench "$m" --gpu "$g" --prompt 512 --gen 128 --reps 2 --json >"$OUT/b.json" 2>"$OUT/b.err"
        tail -1 "$OUT/b.json"
        grep -i 'gpu' "$OUT/b.err" | head -3
        tg=$(sed -n 's/.*"tg_tokens_per_s":\([0-9.e+]*\).*/\1/p' "$OUT/b.json" | tail -1)
        [ -n "$tg" ] && [ $g = auto ] &&
            awk -v tg="$tg" -v b="$bytes" -v p="$PEAK_GBS" \
                'BEGIN { printf "#   decode %.1f tok/s x %.0f MB = %.0f GB/s, %.1f%% of %d GB/s\n", tg, b / 1e6, tg * b / 1e9, 100 * tg * b / 1e9 / p, p }'
    done
    if [ -n "$LLAMA_BENCH_VK" ]; then
        echo "# $(basename "$m") llama.cpp Vulkan"
        timeout 240 "$LLAMA_BENCH_VK" -m "$m" -ngl 99 -p 512 -n 128 -r 2 -o json 2>&1 | tail -30
    fi
done
