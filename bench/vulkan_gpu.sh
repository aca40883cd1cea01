#!/bin/sh
# vulkan_gpu.sh: the GPU table of issue 16 in one run, for the few minutes a
# machine with a GPU is at hand: for each model, `cumulo bench` on the CPU and
# with every layer on the first Vulkan GPU (--gpu auto), one JSON line each,
# and `cumulo info --gpu` first. Speed is printed, never asserted. Needs a
# build with glslc and the Vulkan headers (scripts/setup.sh) and a driver.
#   bench/vulkan_gpu.sh [MODEL.gguf ...]   (default: /work/cache/bench-1b/*.gguf)
# NEEDSWORK: not yet run on a real GPU; llama.cpp's Vulkan build beside it
# (LLAMA_BENCH_VK=path/to/llama-bench) is printed when given.
cd "$(dirname "$0")/.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
[ $# -gt 0 ] || set -- /work/cache/bench-1b/*.gguf
"$BIN" info --gpu || exit 1
for m in "$@"; do
    for g in none auto; do
        echo "# $(basename "$m") --gpu $g"
        timeout 300 "$BIN" bench "$m" --gpu "$g" --prompt 512 --gen 128 --reps 2 --json 2>&1 | tail -1
    done
    if [ -n "$LLAMA_BENCH_VK" ]; then
        echo "# $(basename "$m") llama.cpp Vulkan"
        timeout 300 "$LLAMA_BENCH_VK" -m "$m" -ngl 99 -p 512 -n 128 -r 2 -o json 2>&1 | tail -30
    fi
done
