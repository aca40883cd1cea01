#!/bin/sh
# lora_cli.sh: --lora as a user meets it. `cumulo run --lora` gives llama.cpp's
# greedy ids (tests/data/lora, made by tools/gen_lora_refs.sh with the same
# `cumulo synth --lora-for` adapters) with one adapter, a scale and two
# adapters; `cumulo serve --lora` answers with the same text as run; bad
# adapters (the base model itself, another model's adapter, a missing file)
# fail with one line and exit 1 (--lora on a cluster: cluster_lora.sh).
. "$(dirname "$0")/lib/http_common.sh"
need curl
M32=$SHARED/models/stories260K-f32.gguf
M8=$SHARED/models/stories260K-q8_0.gguf
P="Once upon a time"
"$BIN" synth --lora-for "$M32" --rank 4 --alpha 8 --strength 0.1 --seed 7 -o "$TMP/f32_a.gguf" 2>/dev/null || bad "synth a"
"$BIN" synth --lora-for "$M32" --rank 8 --alpha 0 --strength 0.1 --seed 8 --only ffn -o "$TMP/f32_b.gguf" 2>/dev/null || bad "synth b"
"$BIN" synth --lora-for "$M8" --rank 4 --alpha 8 --strength 0.1 --seed 9 -o "$TMP/q8_a.gguf" 2>/dev/null || bad "synth q8"

# ids MODEL [--lora ...]: the 32 greedy ids of `cumulo run --json`, comma separated.
ids() {
    m=$1; shift
    "$BIN" run "$m" -p "$P" -n 32 --temp 0 --threads 1 --json "$@" 2>"$TMP/run.err" >"$TMP/run.json" || { cat "$TMP/run.err" >&2; return 1; }
    js 'j.tokens.map(t => typeof t === "object" ? t.id : t).join(",")' "$TMP/run.json"
}
ref() { js 'j.generated_tokens.join(",")' "tests/data/lora/$1.json"; }
expect_ids() {
    name=$1; shift
    got=$(ids "$@"); want=$(ref "$name")
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok; else bad "$name: ids $got, llama.cpp $want"; fi
}
expect_ids f32_none "$M32"
expect_ids f32_a "$M32" --lora "$TMP/f32_a.gguf"
expect_ids f32_a2 "$M32" --lora "$TMP/f32_a.gguf:1.5"
expect_ids f32_ab "$M32" --lora "$TMP/f32_a.gguf" --lora "$TMP/f32_b.gguf:0.7"
expect_ids q8_a "$M8" --lora "$TMP/q8_a.gguf"
[ "$(ref f32_none)" != "$(ref f32_a)" ] && ok || bad "the adapter does not change llama.cpp's ids"

# Each bad invocation: exit 1, one line on stderr starting with "cumulo: ".
expect_err() {
    want=$1; shift
    "$BIN" run "$M32" -p "$P" -n 4 --threads 1 "$@" >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ $rc -ne 1 ] || [ "$(wc -l <"$TMP/err")" -ne 1 ] || ! grep -Eq "^cumulo: .*($want)" "$TMP/err"; then
        bad "run $*: rc $rc, stderr: $(cat "$TMP/err")"
    else ok; fi
}
"$BIN" synth --arch llama --dim 32 --layers 1 --heads 4 --ffn 64 --type f32 --vocab builtin --seed 3 -o "$TMP/small.gguf" 2>/dev/null || bad "synth small"
"$BIN" synth --lora-for "$TMP/small.gguf" --rank 2 -o "$TMP/small_lora.gguf" 2>/dev/null || bad "synth small lora"
expect_err "not a LoRA adapter \(general.type is 'missing'" --lora "$M8"
expect_err "takes 64 inputs \(adapter made for another model\?\)" --lora "$TMP/small_lora.gguf"
expect_err "cannot open|no such file" --lora "$TMP/none.gguf"
expect_err "needs FILE.gguf" --lora
"$BIN" run "$TMP/f32_a.gguf" -p "$P" -n 4 >"$TMP/out" 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "^cumulo: .*this is a LoRA adapter, not a model (give it to --lora)" "$TMP/err" && ok || bad "run ADAPTER: $(cat "$TMP/err")"

# phi3 binds attn_q/k/v and ffn_gate/up as row views of fused tensors: an ffn_up adapter is refused.
"$BIN" synth --arch phi3 --dim 32 --layers 1 --heads 4 --ffn 64 --type f32 --vocab builtin --seed 3 -o "$TMP/phi3.gguf" 2>/dev/null || bad "synth phi3"
"$BIN" synth --lora-for "$TMP/phi3.gguf" --rank 2 --only ffn_up -o "$TMP/phi3_up.gguf" 2>/dev/null || bad "synth phi3 lora"
"$BIN" run "$TMP/phi3.gguf" -p "$P" -n 2 --threads 1 --lora "$TMP/phi3_up.gguf" >"$TMP/out" 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "^cumulo: .*'blk.0.ffn_up.weight' is fused or split in this phi3 model" "$TMP/err" && ok || bad "phi3 ffn_up: $(cat "$TMP/err")"

# chat --lora: the adapter changes the reply.
chat() { printf 'Hello\n' | "$BIN" chat "$M32" --chat-template chatml --temp 0 -n 16 --threads 1 "$@" 2>/dev/null; }
c1=$(chat --lora "$TMP/f32_a.gguf"); c0=$(chat)
[ -n "$c1" ] && [ -n "$c0" ] && [ "$c1" != "$c0" ] && ok || bad "chat --lora: '$c1' vs without: '$c0'"

# serve --lora: the same text as run --lora (temperature 0), and not the text without it.
"$BIN" run "$M8" -p "$P" -n 32 --temp 0 --threads 1 --lora "$TMP/q8_a.gguf" 2>/dev/null >"$TMP/run_text"
"$BIN" run "$M8" -p "$P" -n 32 --temp 0 --threads 1 2>/dev/null >"$TMP/run_plain"
if start_server s --lora "$TMP/q8_a.gguf"; then
    code=$(status "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"$P\", \"max_tokens\": 32, \"temperature\": 0}")
    text=$(js 'j.choices[0].text' "$TMP/body")
    [ "$code" = 200 ] && [ "$P$text" = "$(cat "$TMP/run_text")" ] && ok || bad "serve --lora: $code '$text' vs run '$(cat "$TMP/run_text")'"
    [ "$P$text" != "$(cat "$TMP/run_plain")" ] && ok || bad "serve --lora text equals the text without the adapter"
    stop_server "$PID"
else bad "serve --lora did not start"; fi
finish
