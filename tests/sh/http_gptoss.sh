#!/bin/sh
# tests/sh/http_gptoss.sh: `cumulo serve` and `cumulo chat` on a synthetic
# gpt-oss model (MXFP4 experts, sinks, sliding-window layers, YaRN) with the
# gpt-oss (harmony) chat format: the chat prompt is llama.cpp's harmony
# rendering (a chat completion equals the completion of that text at
# temperature 0), streamed equals non-streamed, and a reply that is not in
# harmony form (random weights never write <|channel|>) passes the
# final-channel filter unchanged. The filter itself is tested in test_chat.
. "$(dirname "$0")/lib/http_common.sh"
need curl
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
MODEL=$TMP/gptoss.gguf
"$BIN" synth --arch gpt-oss --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --swa 4 --type mxfp4 --seed 4003 --vocab "$VOCAB" -o "$MODEL" 2>/dev/null
check "synth gpt-oss" [ -s "$MODEL" ]
start_server a --chat-template gpt-oss || { bad "server a"; finish; exit 1; }

CHAT='{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me about a cat."}],"max_tokens":24,"temperature":0'
check "chat 200" [ "$(status "$URL/v1/chat/completions" -d "$CHAT}")" = 200 ]
ctext=$(js 'j.choices[0].message.content' "$TMP/body")
check "chat usage" [ "$(js 'j.usage.completion_tokens' "$TMP/body")" = 24 ]
H='<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|>Tell me about a cat.<|end|><|start|>assistant'
check "completion 200" [ "$(status "$URL/v1/completions" -d "{\"prompt\":\"$H\",\"max_tokens\":24,\"temperature\":0}")" = 200 ]
ptext=$(js 'j.choices[0].text' "$TMP/body")
check "chat == completion of the harmony rendering ('$ctext' vs '$ptext')" [ -n "$ctext" ] && [ "$ctext" = "$ptext" ]
curl -s -N "$URL/v1/chat/completions" -d "$CHAT,\"stream\":true}" >"$TMP/sse"
check "streamed chat == non-streamed" [ "$(sse_text "$TMP/sse")" = "$ctext" ]
# cumulo chat: the same prompt, the same reply (leading whitespace not shown)
printf 'Tell me about a cat.\n' | "$BIN" chat "$MODEL" --chat-template gpt-oss --system "Be brief." -n 24 --temp 0 \
    --threads 1 >"$TMP/chat.out" 2>"$TMP/chat.err"
want=$(printf '%s' "$ctext" | sed 's/^[[:space:]]*//')
check "cumulo chat reply == serve's ('$(head -c 80 "$TMP/chat.out")')" [ "$(cat "$TMP/chat.out")" = "$want" ]
finish
