#!/bin/sh
# finetune_cli.sh: `cumulo finetune` as a user meets it, on stories260K.
# (b) With the default options on 200 lines (tests/sh/lib/finetune_data.sh)
#     the training loss falls below a quarter of its start, the validation
#     loss below half, and greedy text from "Zorbix" with the adapter is the
#     trained line (without it, it is not).
# (c) The adapter in llama.cpp: tests/data/finetune/zorbix.json holds
#     node-llama-cpp's greedy ids and probabilities with the same adapter
#     (tools/gen_finetune_refs.sh; training is deterministic, so retraining
#     here gives it back); `cumulo run --lora` gives the same ids, and each
#     generated step's top-5 probabilities within 2e-5 (test_lora's bound);
#     likewise a qwen3 Q8_0 synthetic model trained on prompt/completion data
#     (tests/data/finetune/qwen3_pc.json), which learns the completion.
# (d) --resume from a checkpoint of step 3 of 6 writes the same adapter
#     bytes as the uninterrupted run (dropout on, grad-accum 2; 1 thread
#     before, 2 after: the thread count never changes the bits); another
#     seed does not. A run killed with -9 after its step-10 checkpoint,
#     resumed from the last checkpoint it left, ends with the uninterrupted
#     run's adapter bytes.
# (e) Bad data lines and unsupported models fail with one line naming the
#     line / the architecture, exit 1.
. "$(dirname "$0")/lib/http_common.sh"
. "$(dirname "$0")/lib/finetune_data.sh"
M=$SHARED/models/stories260K-f32.gguf
finetune_data >"$TMP/data.jsonl"

"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/a.gguf" 2>"$TMP/ft.err" || { cat "$TMP/ft.err" >&2; bad "finetune with defaults"; }
line=$(grep '^finetune: loss' "$TMP/ft.err")
echo "# $line"
set -- $(echo "$line" | sed 's/[^0-9. ]/ /g' | tr -s ' ')
awk -v l0="$1" -v l1="$2" -v v0="$3" -v v1="$4" 'BEGIN { exit !(l1 < l0 / 4 && v1 < v0 / 2) }' && ok || bad "loss did not fall: $line"
grep -q '<polyline' "$TMP/a.gguf.svg" && ok || bad "no loss curve at a.gguf.svg"
gen() { "$BIN" run "$M" -p "Zorbix" -n 24 --temp 0 --threads 1 "$@" 2>/dev/null; }
case "$(gen --lora "$TMP/a.gguf")" in *"Zorbix the robot found a red ball. Zorbix was very happy."*) ok ;; *) bad "greedy with the adapter: $(gen --lora "$TMP/a.gguf")" ;; esac
case "$(gen)" in *"found a red ball"*) bad "the base model already says it" ;; *) ok ;; esac

# (c) llama.cpp's ids and probabilities with the same adapter
# (vs_llamacpp: tests/sh/lib/finetune_data.sh)
res=$(vs_llamacpp "$M" "Zorbix" 24 "$TMP/a.gguf" tests/data/finetune/zorbix.json)
echo "# llama.cpp vs cumulo with the trained stories260K adapter: $res"
case "$res" in ok*) ok ;; *) bad "llama.cpp: $res (regenerate with tools/gen_finetune_refs.sh if training changed on purpose)" ;; esac
"$BIN" synth --arch qwen3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --type q8_0 \
    --vocab "$M" --seed 3 -o "$TMP/qwen3.gguf" 2>/dev/null || bad "synth qwen3"
finetune_pc_data >"$TMP/pc.jsonl"
"$BIN" finetune "$TMP/qwen3.gguf" --data "$TMP/pc.jsonl" --out "$TMP/qwen3_pc.gguf" --steps 20 --lr 5e-3 2>"$TMP/err" || bad "qwen3: $(tail -1 "$TMP/err")"
res=$(vs_llamacpp "$TMP/qwen3.gguf" "the cat" 12 "$TMP/qwen3_pc.gguf" tests/data/finetune/qwen3_pc.json)
echo "# llama.cpp vs cumulo with the trained qwen3 Q8_0 adapter: $res"
case "$res" in ok*) ok ;; *) bad "llama.cpp (qwen3): $res" ;; esac
case "$(js 'j.text' "$TMP/run.json")" in " sat on the mat"*|"sat on the mat"*) ok ;; *) bad "qwen3 did not learn the completion: $(js 'j.text' "$TMP/run.json")" ;; esac

# (d) resume: bit-identical to the uninterrupted run
R="--ctx 32 --batch 2 --grad-accum 2 --steps 6 --dropout 0.1 --val-split 0.2 --save-every 3"
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r1.gguf" $R --threads 1 2>"$TMP/r1.err" || bad "r1: $(tail -1 "$TMP/r1.err")"
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r2.gguf" $R --threads 2 --resume "$TMP/r1.gguf.ckpt-3.gguf" 2>"$TMP/r2.err" || bad "r2: $(tail -1 "$TMP/r2.err")"
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r3.gguf" $R --seed 7 2>/dev/null || bad "r3"
cmp -s "$TMP/r1.gguf" "$TMP/r2.gguf" && ok || bad "resumed adapter differs from the uninterrupted one"
cmp -s "$TMP/r1.gguf.ckpt-6.gguf" "$TMP/r2.gguf.ckpt-6.gguf" && ok || bad "resumed checkpoint differs"
cmp -s "$TMP/r1.gguf" "$TMP/r3.gguf" && bad "another seed gives the same adapter" || ok
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r4.gguf" $R --rank 4 --resume "$TMP/r1.gguf.ckpt-3.gguf" 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "^cumulo: checkpoint .* is of rank 8" "$TMP/err" && ok || bad "resume with another rank: $(cat "$TMP/err")"

# kill -9 mid-run: resuming from the last checkpoint it left gives the uninterrupted run's adapter
K="--ctx 32 --batch 2 --steps 40 --save-every 5 --threads 1"
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/k.gguf" $K 2>/dev/null &
kp=$!
i=0; while [ ! -f "$TMP/k.gguf.ckpt-10.gguf" ] && [ $i -lt 600 ] && kill -0 $kp 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
kill -9 $kp 2>/dev/null && killed=yes || killed=no
wait $kp 2>/dev/null
last=$(ls "$TMP"/k.gguf.ckpt-*.gguf 2>/dev/null | sed 's/.*ckpt-\([0-9]*\).gguf/\1/' | sort -n | tail -1)
echo "# kill -9 mid-run: killed=$killed, last checkpoint at step $last"
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/k.gguf" $K --resume "$TMP/k.gguf.ckpt-$last.gguf" 2>"$TMP/err" || bad "resume after kill: $(tail -1 "$TMP/err")"
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/k2.gguf" $K 2>/dev/null || bad "k2"
[ -n "$last" ] && cmp -s "$TMP/k.gguf" "$TMP/k2.gguf" && ok || bad "resumed after kill -9 at step $last: adapter differs"

# (e) one-line errors
expect_err() {
    want=$1; shift
    "$BIN" finetune "$@" --out "$TMP/x.gguf" --steps 1 >"$TMP/out" 2>"$TMP/err"; rc=$?
    if [ $rc -ne 1 ] || [ "$(grep -c '^cumulo: ' "$TMP/err")" -ne 1 ] || ! grep -Eq "^cumulo: .*($want)" "$TMP/err"; then
        bad "finetune $*: rc $rc, stderr: $(cat "$TMP/err")"
    else ok; fi
}
bad_line() { # N CONTENT WANT: CONTENT as line N of otherwise good data
    n=$1; c=$2; want=$3
    { head -n $((n - 1)) "$TMP/data.jsonl"; printf '%s\n' "$c"; } >"$TMP/bad.jsonl"
    expect_err "'.*bad.jsonl' line $n: $want" "$M" --data "$TMP/bad.jsonl"
}
bad_line 3 '{"text": "unterminated' "not valid JSON"
bad_line 5 '{"text": 5}' '"text" must be a string'
bad_line 2 '{"prompt": "a"}' '"prompt" and "completion" must both be strings'
bad_line 7 '[1, 2]' "expected a JSON object"
bad_line 4 '{"text": "a", "prompt": "b", "completion": "c"}' "expected exactly one of"
bad_line 6 '{"messages": [{"role": "bot", "content": "x"}]}' '"messages" needs a chat template'
{ head -n 8 "$TMP/data.jsonl"; echo '{"messages": [{"role": "bot", "content": "x"}]}'; } >"$TMP/role.jsonl"
expect_err "'.*role.jsonl' line 9: message 1 has role 'bot'" "$M" --data "$TMP/role.jsonl" --chat-template chatml
bad_line 1 '{"messages": "hi"}' '"messages" must be an array'
printf '\000\377{' >"$TMP/bin.jsonl"
expect_err "'.*bin.jsonl' line 1: not valid JSON" "$M" --data "$TMP/bin.jsonl"
printf '\n\n' >"$TMP/empty.jsonl"
expect_err "holds no examples" "$M" --data "$TMP/empty.jsonl"
expect_err "cannot open|no such file" "$M" --data "$TMP/none.jsonl"
expect_err "unknown LoRA target 'attn_x'" "$M" --data "$TMP/data.jsonl" --lora-targets attn_q,attn_x
"$BIN" synth --arch gemma3 --dim 32 --layers 1 --heads 4 --ffn 64 --type f32 --vocab builtin --seed 3 -o "$TMP/g3.gguf" 2>/dev/null || bad "synth gemma3"
expect_err "fine-tuning supports the dense llama, qwen2 and qwen3 architectures, not gemma3" "$TMP/g3.gguf" --data "$TMP/data.jsonl"

# chat data through a named template: loss only on the assistant turns, and it trains
i=0; while [ $i -lt 20 ]; do
    echo '{"messages": [{"role": "user", "content": "Who found the ball?"}, {"role": "assistant", "content": "Zorbix the robot."}]}'
    i=$((i + 1)); done >"$TMP/chat.jsonl"
"$BIN" finetune "$M" --data "$TMP/chat.jsonl" --out "$TMP/c.gguf" --chat-template chatml --steps 3 --ctx 64 2>"$TMP/err" && ok || bad "chat data: $(tail -1 "$TMP/err")"
finish
