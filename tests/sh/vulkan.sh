#!/bin/sh
# vulkan.sh: the Vulkan backend (src/gpu) through the CLI on whatever Vulkan
# device is here (CI: Mesa's lavapipe, which scripts/setup.sh installs):
# `cumulo run --temp 0` on stories260K (F32, Q8_0, Q4_0) gives the CPU's
# greedy ids with all layers and with --gpu-layers 2 on the device, and its
# --json names the device; a missing loader is one warning and the CPU;
# bad option values are one-line errors; `cumulo info --gpu` lists the
# device; bench and serve take --gpu; a mixture of experts (Mixtral,
# qwen2moe's shared expert), gpt-oss and every weight type run on the device
# with the CPU's ids, deepseek2 (latent attention, grouped sigmoid routing)
# too; Q8_0 and Q4_0 KV caches on the device with the CPU's ids; what the
# device does not hold (an f16/q8_0 KV cache) is one warning line and the
# CPU's ids; an injected device loss or full device memory
# (CUMULO_TEST_GPU_FAULT) is an error for that run or request, and a server
# whose device was lost answers the later requests from the CPU. No device:
# a skip with the reason (not n/a: setup installs lavapipe, so under CI=true
# it fails).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
need curl python3
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-../shared}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
ids() { sed -n 's/.*"tokens":\[\([^]]*\)\].*/\1/p' "$1"; }

"$BIN" info --gpu >"$T/info" 2>&1 || bad "info --gpu: $(cat "$T/info")"
if ! grep -q '^gpu 0:' "$T/info"; then
    echo "skip: no Vulkan device: $(cat "$T/info")"
    echo "$pass passed, $fail failed, 1 skipped"
    [ $fail -eq 0 ]
    exit
fi
ok
"$BIN" info --gpu --json | grep -q '"gpus":\[{"index":0,"name":"' && ok || bad "info --gpu --json"
"$BIN" info "$SHARED/models/stories260K-q8_0.gguf" | grep -q '^gpu 0: .* of 5 layers fit' && ok || bad "info MODEL: layers that fit"

for ty in f32 q8_0 q4_0; do
    M=$SHARED/models/stories260K-$ty.gguf
    "$BIN" run "$M" -p "Once upon a time" -n 48 --temp 0 --json >"$T/cpu" 2>"$T/cpu.err" || bad "$ty cpu run: $(cat "$T/cpu.err")"
    cp "$T/cpu" "$T/cpu_$ty"
    grep -q '"device":"cpu"' "$T/cpu" && ok || bad "$ty: cpu run names device cpu"
    for k in all 2; do
        if [ $k = all ]; then set -- --gpu vulkan; else set -- --gpu vulkan --gpu-layers $k; fi
        "$BIN" run "$M" -p "Once upon a time" -n 48 --temp 0 --json "$@" >"$T/gpu" 2>"$T/gpu.err" ||
            bad "$ty gpu ($k layers) run: $(cat "$T/gpu.err")"
        grep -q '"device":"[^"]*"' "$T/gpu" && ! grep -q '"device":"cpu"' "$T/gpu" && ok ||
            bad "$ty ($k layers): --json names the device: $(grep -o '"device":"[^"]*"' "$T/gpu") $(cat "$T/gpu.err")"
        [ -n "$(ids "$T/cpu")" ] && [ "$(ids "$T/cpu")" = "$(ids "$T/gpu")" ] && ok ||
            bad "$ty ($k layers on the GPU): ids differ from the CPU's: cpu [$(ids "$T/cpu")] gpu [$(ids "$T/gpu")]"
    done
done

# No loader: one warning line, the CPU computes, same ids.
M=$SHARED/models/stories260K-q8_0.gguf
CUMULO_VULKAN_LIB=$T/no/libvulkan.so.1 "$BIN" run "$M" -p "Once upon a time" -n 48 --temp 0 --json --gpu vulkan \
    >"$T/nolib" 2>"$T/nolib.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'gpu:' "$T/nolib.err")" -eq 1 ] && grep -q "cannot load the Vulkan loader" "$T/nolib.err" &&
    grep -q '"device":"cpu"' "$T/nolib" && [ "$(ids "$T/nolib")" = "$(ids "$T/cpu_q8_0")" ] && ok ||
    bad "missing loader: rc $rc, $(cat "$T/nolib.err")"
"$BIN" run "$M" -p x -n 1 --gpu bogus >"$T/o" 2>"$T/e"; rc=$?
[ $rc -ne 0 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && grep -q "'bogus' is not auto, vulkan, none" "$T/e" && ok || bad "--gpu bogus: $(cat "$T/e")"
"$BIN" run "$M" -p x -n 1 --gpu-layers -1 >"$T/o" 2>"$T/e"; rc=$?
[ $rc -ne 0 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && ok || bad "--gpu-layers -1: $(cat "$T/e")"
# --gpu-layers 0 is none (no warning, the CPU)
"$BIN" run "$M" -p "Once upon a time" -n 8 --temp 0 --json --gpu vulkan --gpu-layers 0 >"$T/o" 2>"$T/e" &&
    grep -q '"device":"cpu"' "$T/o" && ok || bad "--gpu-layers 0: $(cat "$T/e")"

# bench takes --gpu (timings printed, not asserted)
"$BIN" bench "$M" --gpu vulkan --threads 1 --prompt 8 --gen 4 --reps 1 --json >"$T/b" 2>"$T/be"; rc=$?
[ $rc -eq 0 ] && grep -q '"tg_tokens_per_s"' "$T/b" && ok || bad "bench --gpu vulkan: rc $rc, $(cat "$T/be")"

# serve with the device: three concurrent requests (batched sequences, the
# device's slots) give the CPU server's texts.
serve_texts() { # GPU OUT
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$BIN" serve "$M" --port "$port" --gpu "$1" >"$T/serve_$1.log" 2>&1 &
    spid=$!
    i=0
    while [ $i -lt 600 ] && ! grep -q "ready:" "$T/serve_$1.log"; do sleep 0.2; i=$((i + 1)); done
    cpids=""
    for p in "Once upon a time" "The dog" "Lily and Tom"; do
        curl -s -m 300 "localhost:$port/v1/completions" -H 'content-type: application/json' \
            -d "{\"prompt\":\"$p\",\"max_tokens\":24,\"temperature\":0}" >"$T/c_$1_$p" &
        cpids="$cpids $!"
    done
    for c in $cpids; do wait "$c"; done
    kill "$spid"
    wait "$spid" 2>/dev/null
    for p in "Once upon a time" "The dog" "Lily and Tom"; do
        sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$T/c_$1_$p"
        echo # (the body has no final newline)
    done | grep -v '^$' >"$2"
}
serve_texts none "$T/serve_cpu"
serve_texts vulkan "$T/serve_gpu"
[ "$(wc -l <"$T/serve_cpu")" -eq 3 ] && cmp -s "$T/serve_cpu" "$T/serve_gpu" && ok ||
    bad "serve --gpu vulkan: texts differ from the CPU's: $(cat "$T/serve_cpu") // $(cat "$T/serve_gpu")" \
        "(the server's last lines: $(tail -n 3 "$T/serve_vulkan.log"); a reply: $(head -c 300 "$T/c_vulkan_The dog"))"

VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
# Mixtures of experts on the device (router, top-k and the experts there),
# BF16, IQ4_XS and the grid types' weights (mmk.comp; a stacked expert tensor's
# grid once before its experts), and gpt-oss (sinks, alternating sliding
# windows with YaRN, the attention output and router biases, the experts'
# biases and clamped SwiGLU, softmax over the chosen experts; the prompt and
# 16 tokens pass the window of 4): the CPU's greedy ids, --json names the
# device.
for v in "mixtral q8_0 --arch llama --experts 4 --experts-used 2" \
    "qwen2moe q4_k --arch qwen2moe --experts 8 --experts-used 2 --expert-ffn 256 --shared-ffn 512" \
    "iq4_xs iq4_xs --arch llama" "iq3_xxs iq3_xxs --arch llama" "bf16 bf16 --arch llama" \
    "mixtral_iq2 iq2_xxs --arch llama --experts 4 --experts-used 2" \
    "qwen3moe_iq1 iq1_s --arch qwen3moe --experts 8 --experts-used 2 --expert-ffn 256" \
    "gptoss q8_0 --arch gpt-oss --experts 4 --experts-used 2 --expert-ffn 256 --swa 4" \
    "gptoss_mxfp4 mxfp4 --arch gpt-oss --experts 8 --experts-used 4 --expert-ffn 256 --swa 4"; do
    set -- $v
    tag=$1 ty=$2
    shift 2
    "$BIN" synth "$@" --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --type "$ty" --vocab "$VOCAB" --seed 5 \
        -o "$T/$tag.gguf" >/dev/null 2>&1 || bad "synth $tag"
    "$BIN" run "$T/$tag.gguf" -p "Once upon a time" -n 16 --temp 0 --json >"$T/o_cpu" 2>/dev/null
    "$BIN" run "$T/$tag.gguf" -p "Once upon a time" -n 16 --temp 0 --json --gpu vulkan >"$T/o" 2>"$T/e"; rc=$?
    [ $rc -eq 0 ] && ! grep -q 'running on the CPU' "$T/e" && grep -q '"device":"[^"]*"' "$T/o" &&
        ! grep -q '"device":"cpu"' "$T/o" && [ -n "$(ids "$T/o")" ] && [ "$(ids "$T/o")" = "$(ids "$T/o_cpu")" ] && ok ||
        bad "$tag on the GPU: rc $rc, cpu [$(ids "$T/o_cpu")] gpu [$(ids "$T/o")] $(cat "$T/e")"
done

# deepseek2 on the device: the latent attention and its latent cache (V3's
# q LoRA, V2-Lite's one attn_q), the dense first layer, the shared experts,
# V3's sigmoid routing with the selection bias and group-limited top-k (and
# V2-Lite's softmax), with an F32 and an F16 cache: the CPU's greedy ids.
# (F32 and Q8_0 weights here: with Q8_K activations a 1-ulp change of float
# order, such as the subgroup reduction's, flips a near tie of these random
# models within 16 tokens; the K-quants are in the golden suite below, under
# its tolerance rule.)
for v in "lite q8_0 f32 --variant lite --experts 8 --experts-used 2" \
    "v3 f32 f32 --variant v3 --experts 16 --experts-used 4" "v3 q8_0 f16 --variant v3 --experts 16 --experts-used 4"; do
    set -- $v
    tag=ds_$1_$2 ty=$2 kv=$3
    shift 3
    "$BIN" synth --arch deepseek2 "$@" --dim 256 --layers 3 --heads 4 --ffn 512 --expert-ffn 256 --type "$ty" \
        --vocab "$VOCAB" --seed 5 -o "$T/$tag.gguf" >/dev/null 2>&1 || bad "synth $tag"
    "$BIN" run "$T/$tag.gguf" -p "Once upon a time" -n 16 --temp 0 --json --kv-type "$kv" >"$T/o_cpu" 2>/dev/null
    "$BIN" run "$T/$tag.gguf" -p "Once upon a time" -n 16 --temp 0 --json --kv-type "$kv" --gpu vulkan >"$T/o" 2>"$T/e"
    rc=$?
    [ $rc -eq 0 ] && ! grep -q 'running on the CPU' "$T/e" && grep -q '"device":"[^"]*"' "$T/o" && ! grep -q '"device":"cpu"' "$T/o" &&
        [ -n "$(ids "$T/o")" ] && [ "$(ids "$T/o")" = "$(ids "$T/o_cpu")" ] && ok ||
        bad "$tag ($kv cache) on the GPU: rc $rc, cpu [$(ids "$T/o_cpu")] gpu [$(ids "$T/o")] $(cat "$T/e")"
done

# Quantized KV caches on the device (quantized there as the CPU quantizes,
# rotated first where it rotates): Q8_0, Q4_0 and Q8_0 K with Q4_0 V on the
# BF16 model above (head size 64: the rotations) and on the IQ4_XS one
# with 8 heads (head size 32: none): the CPU's ids, no fallback, --json
# names the device.
"$BIN" synth --arch llama --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 512 --type iq4_xs --vocab "$VOCAB" \
    --seed 5 -o "$T/h32.gguf" >/dev/null 2>&1 || bad "synth h32"
for mk in "bf16 --kv-type q8_0" "bf16 --kv-type q4_0" "bf16 -ctk q8_0 -ctv q4_0" "h32 --kv-type q8_0" \
    "h32 -ctk q8_0 -ctv q4_0"; do
    set -- $mk
    tag=$1
    shift
    "$BIN" run "$T/$tag.gguf" -p "Once upon a time" -n 16 --temp 0 --json "$@" >"$T/o_cpu" 2>/dev/null
    "$BIN" run "$T/$tag.gguf" -p "Once upon a time" -n 16 --temp 0 --json "$@" --gpu vulkan >"$T/o" 2>"$T/e"
    rc=$?
    [ $rc -eq 0 ] && ! grep -q 'gpu:.*running on the CPU' "$T/e" && grep -q '"device":"[^"]*"' "$T/o" &&
        ! grep -q '"device":"cpu"' "$T/o" && [ -n "$(ids "$T/o")" ] && [ "$(ids "$T/o")" = "$(ids "$T/o_cpu")" ] && ok ||
        bad "$tag with a $* cache on the GPU: rc $rc, cpu [$(ids "$T/o_cpu")] gpu [$(ids "$T/o")] $(cat "$T/e")"
done
# Not on the device: one warning line, the CPU's ids (an F16 K with a Q8_0
# V: the device holds f32 or f16 caches, or q8_0/q4_0 for both).
"$BIN" run "$T/bf16.gguf" -p "Once upon a time" -n 8 --temp 0 --json -ctk f16 -ctv q8_0 >"$T/o_cpu" 2>/dev/null
"$BIN" run "$T/bf16.gguf" -p "Once upon a time" -n 8 --temp 0 --json -ctk f16 -ctv q8_0 --gpu vulkan >"$T/o" 2>"$T/e"
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'gpu:' "$T/e")" -eq 1 ] && grep -q 'running on the CPU' "$T/e" &&
    grep -q '"device":"cpu"' "$T/o" && [ -n "$(ids "$T/o")" ] && [ "$(ids "$T/o")" = "$(ids "$T/o_cpu")" ] && ok ||
    bad "f16/q8_0 cache not on the GPU: rc $rc, $(cat "$T/e")"

# Faults (the test hook): the device lost at the 3rd forward pass, or its
# memory full at the 1st, fails the run with the reason in one line.
for f in lost:3 oom; do
    CUMULO_TEST_GPU_FAULT=$f "$BIN" run "$M" -p "Once upon a time" -n 8 --temp 0 --gpu vulkan >"$T/o" 2>"$T/e"; rc=$?
    want=$([ $f = oom ] && echo "out of device memory" || echo "device lost")
    [ $rc -ne 0 ] && [ "$(grep -c "$want" "$T/e")" -eq 1 ] && ok || bad "fault $f: rc $rc, $(cat "$T/e")"
done
# serve: the request that finds the device lost fails; the later ones are the CPU's.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
CUMULO_TEST_GPU_FAULT=lost:2 "$BIN" serve "$M" --port "$port" --gpu vulkan >"$T/serve.log" 2>&1 &
spid=$!
i=0
while [ $i -lt 300 ] && ! grep -q "ready:" "$T/serve.log"; do sleep 0.2; i=$((i + 1)); done
req() { curl -s -m 120 -o "$T/body" -w '%{http_code}' "localhost:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}'; }
c1=$(req); b1=$(cat "$T/body")
c2=$(req); t2=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$T/body")
kill "$spid"
wait "$spid" 2>/dev/null
[ "$c1" != 200 ] && echo "$b1" | grep -q "device lost" && [ "$c2" = 200 ] &&
    [ "$t2" = "$(head -1 "$T/serve_cpu")" ] && [ "$(grep -c 'was lost; the CPU computes' "$T/serve.log")" -eq 1 ] && ok ||
    bad "serve after a lost device: $c1 $b1 / $c2 [$t2] vs [$(head -1 "$T/serve_cpu")]: $(grep -i gpu "$T/serve.log")"

# The synthetic golden suite (test_synth_golden: llama.cpp's references with
# its tolerance rule) with its greedy context on the device: F16, Q8_0, Q4_0,
# Q5_0, Q4_1, Q5_1 and the K-quants (Q2_K..Q6_K, Q4_K_M's mix), llama3 rope scaling, a
# tied output, qwen3's Q/K norms, gemma3 (GELU, post norms, sliding window,
# q scale), the mixtures of experts (qwen3moe with 8 and 64 experts,
# qwen2moe's shared expert; Mixtral through the CLI above), MXFP4 and
# deepseek2 (V3 with the unsplit attn_kv_b: its latent rounded to Q8_K;
# V2-Lite's rounded to Q8_0; V3 with YaRN), and Q8_0 / Q4_0 KV caches
# (llama.cpp's flash attention with its rotations: the device's cache).
SG=${CUMULO_TESTBIN:-build/tests}/test_synth_golden
# (every type and gemma3's F32/Q8_0 too: run test_synth_golden with
# CUMULO_GPU=vulkan and a wider CUMULO_SYNTH_ONLY; this list keeps the suite's time)
SEL='^(llama-(f16|q8_0|q4_0|q4_1|q3_k|q4_k_m)|llama-q8_0-kvq8_0|qwen3-q8_0-kvq4_0|llama-f32-kvq4_0|qwen3-f32-kvq8_0|llama3-q4_0|llamatied-f32|qwen3-q4_k|gemma3-q4_k_m|qwen3moe-q4_k|qwen3moe64-q8_0|qwen2moe-q5_0|qwen3-mxfp4|deepseek2v3kvb-q4_k|deepseek2litekvb-q8_0|deepseek2v3yarn-q8_0)\.json$'
NSEL=21
if [ -x "$SG" ]; then
    CUMULO_GPU=vulkan CUMULO_SYNTH_ONLY="$SEL" "$SG" >"$T/sg" 2>&1; rc=$?
    [ $rc -eq 0 ] && grep -q '^1 passed, 0 failed' "$T/sg" && [ "$(grep -c 'gpu: greedy with' "$T/sg")" -eq $NSEL ] && ok ||
        bad "test_synth_golden under CUMULO_GPU=vulkan: rc $rc, $(grep -E 'FAIL|gpu:|passed' "$T/sg" | head -30)"
else
    echo "skip: $SG is not built (make tests): the synthetic golden models on the device not run"
    skipped=1
fi

echo "$pass passed, $fail failed${skipped:+, 1 skipped}"
[ $fail -eq 0 ]
