#!/bin/sh
# http_lora.sh: LoRA adapters chosen per request, llama-server's way
# (src/http/api_lora.c): GET /lora-adapters lists them, POST sets the
# default scales, a request's "lora": [{"id","scale"}] overrides them for
# that request only (adapters not listed: off). On stories260K-q8_0 with two
# random adapters A (every target) and B (FFN only, scale 0.7):
#  1. each request's text (temperature 0) equals `cumulo run` with exactly
#     its adapters (A, B, none, both), also when the three requests run at
#     once (batched decode passes mixing adapter sets);
#  2. a prompt cached under A is not reused for the same prompt without
#     adapters (the slot's KV cache is keyed by the scales);
#  3. POST /lora-adapters changes what requests without "lora" get;
#  4. bad ids, scales and shapes are 400s naming the entry (OpenAI and
#     Anthropic routes), also on a server without adapters.
. "$(dirname "$0")/lib/http_common.sh"
need curl
P="Once upon a time"
"$BIN" synth --lora-for "$MODEL" --rank 4 --alpha 8 --strength 0.1 --seed 9 -o "$TMP/a.gguf" 2>/dev/null || bad "synth a"
"$BIN" synth --lora-for "$MODEL" --rank 8 --alpha 0 --strength 0.1 --seed 8 --only ffn -o "$TMP/b.gguf" 2>/dev/null || bad "synth b"
run() { "$BIN" run "$MODEL" -p "$P" -n 32 --temp 0 --threads 1 "$@" 2>/dev/null; }
run --lora "$TMP/a.gguf" >"$TMP/t_a"
run --lora "$TMP/b.gguf:0.7" >"$TMP/t_b"
run >"$TMP/t_0"
run --lora "$TMP/a.gguf" --lora "$TMP/b.gguf:0.7" >"$TMP/t_ab"
for x in a b ab; do cmp -s "$TMP/t_$x" "$TMP/t_0" && bad "adapter set $x does not change the text"; done

# complete NAME LORA_JSON: /v1/completions at temperature 0; the prompt + text into $TMP/NAME (status in $TMP/NAME.code).
complete() {
    lj=${2:+", \"lora\": $2"}
    curl -s -o "$TMP/$1.body" -w '%{http_code}' --max-time 60 "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"$P\", \"max_tokens\": 32, \"temperature\": 0$lj}" >"$TMP/$1.code"
    printf '%s' "$P" >"$TMP/$1"
    js 'j.choices[0].text' "$TMP/$1.body" >>"$TMP/$1" 2>/dev/null
}
same() { # NAME REF
    if [ "$(cat "$TMP/$1.code")" = 200 ] && [ "$(cat "$TMP/$1")" = "$(cat "$TMP/t_$2")" ]; then ok
    else bad "$1: $(cat "$TMP/$1.code") '$(cat "$TMP/$1")' vs run '$(cat "$TMP/t_$2")'"; fi
}

if start_server s --slots 4 --lora "$TMP/a.gguf" --lora "$TMP/b.gguf:0.7"; then
    code=$(status "$URL/lora-adapters")
    [ "$code" = 200 ] && [ "$(js 'j.map(a => a.id + ":" + a.scale + ":" + a.path.endsWith(["a.gguf","b.gguf"][a.id])).join(",")' "$TMP/body")" = "0:1:true,1:0.7:true" ] \
        && ok || bad "GET /lora-adapters: $code $(cat "$TMP/body")"
    complete def ""; same def ab
    complete empty "[]"; same empty ab
    complete only_a '[{"id": 0, "scale": 1}]'; same only_a a
    complete only_b '[{"id": 1, "scale": 0.7}]'; same only_b b
    complete none '[{"id": 0, "scale": 0}]'; same none 0
    # three at once: their decode passes mix adapter sets
    complete par_a '[{"id": 0, "scale": 1}]' & p1=$!
    complete par_b '[{"id": 1, "scale": 0.7}]' & p2=$!
    complete par_0 '[{"id": 1, "scale": 0}]' & p3=$!
    wait $p1 $p2 $p3
    same par_a a; same par_b b; same par_0 0
    # cached under A, asked again without adapters (one slot would reuse its prefix): still the plain text
    complete again_a '[{"id": 0, "scale": 1}]'; same again_a a
    complete again_0 '[{"id": 0, "scale": 0}]'; same again_0 0
    # chat completions and Anthropic messages take the field too
    code=$(status "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "lora": [{"id": 1, "scale": 0.5}]}')
    [ "$code" = 200 ] && ok || bad "chat with lora: $code $(cat "$TMP/body")"
    # POST: the defaults (unlisted adapters 0)
    code=$(status "$URL/lora-adapters" -H 'Content-Type: application/json' -d '[{"id": 1, "scale": 0.7}]')
    [ "$code" = 200 ] && [ "$(js 'j.success' "$TMP/body")" = true ] && ok || bad "POST /lora-adapters: $code $(cat "$TMP/body")"
    code=$(status "$URL/lora-adapters")
    [ "$(js 'j.map(a => a.scale).join(",")' "$TMP/body")" = "0,0.7" ] && ok || bad "GET after POST: $(cat "$TMP/body")"
    complete def_b ""; same def_b b
    status "$URL/lora-adapters" -d '[]' >/dev/null
    complete def_0 ""; same def_0 0
    # bad requests: 400 naming the entry
    bad_req() { # ROUTE BODY PATTERN
        code=$(status "$URL$1" -H 'Content-Type: application/json' -d "$2")
        if [ "$code" = 400 ] && grep -Eq "$3" "$TMP/body"; then ok; else bad "$1 $2: $code $(cat "$TMP/body")"; fi
    }
    C='"prompt": "x", "max_tokens": 2'
    bad_req /v1/completions "{$C, \"lora\": [{\"id\": 2, \"scale\": 1}]}" "lora\[0\]\.id' 2 is not an adapter id: this server has 2"
    bad_req /v1/completions "{$C, \"lora\": [{\"id\": 0, \"scale\": 1}, {\"id\": -1, \"scale\": 1}]}" "lora\[1\]\.id' -1 is not an adapter id"
    bad_req /v1/completions "{$C, \"lora\": [{\"id\": 0.5, \"scale\": 1}]}" "lora\[0\]\.id' must be an integer"
    bad_req /v1/completions "{$C, \"lora\": [{\"id\": \"0\", \"scale\": 1}]}" "must be an integer"
    bad_req /v1/completions "{$C, \"lora\": [{\"id\": 0}]}" "lora\[0\]\.scale' must be a number"
    bad_req /v1/completions "{$C, \"lora\": [{\"id\": 0, \"scale\": 1e9}]}" "lora\[0\]\.scale' must be a number"
    bad_req /v1/completions "{$C, \"lora\": {\"id\": 0}}" "'lora' must be an array"
    bad_req /v1/completions "{$C, \"lora\": [3]}" "lora\[0\]' must be an object"
    bad_req /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "lora": [{"id": 9, "scale": 1}]}' "is not an adapter id"
    bad_req /v1/messages '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "lora": [{"id": 9, "scale": 1}]}' '"lora: .lora\[0\]\.id. 9 is not an adapter id'
    bad_req /lora-adapters '{"id": 0}' "'body' must be an array"
    bad_req /lora-adapters '[{"id": 5, "scale": 1}]' "body\[0\]\.id' 5 is not an adapter id"
    bad_req /lora-adapters 'nope' "not valid JSON"
    code=$(status "$URL/lora-adapters" -X DELETE)
    [ "$code" = 405 ] && ok || bad "DELETE /lora-adapters: $code"
    code=$(status "$URL/lora-adapters")
    [ "$(js 'j.map(a => a.scale).join(",")' "$TMP/body")" = "0,0" ] && ok || bad "bad POSTs changed the defaults: $(cat "$TMP/body")"
    kill -0 "$PID" 2>/dev/null && ok || bad "server died"
    stop_server "$PID"
else bad "serve --lora did not start"; fi

if start_server plain; then
    code=$(status "$URL/lora-adapters")
    [ "$code" = 200 ] && [ "$(cat "$TMP/body")" = "[]" ] && ok || bad "GET /lora-adapters without adapters: $code $(cat "$TMP/body")"
    complete p_empty "[]"; same p_empty 0
    code=$(status "$URL/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "x", "max_tokens": 2, "lora": [{"id": 0, "scale": 1}]}')
    [ "$code" = 400 ] && grep -q "this server has no LoRA adapters (start it with --lora FILE.gguf)" "$TMP/body" && ok \
        || bad "lora without adapters: $code $(cat "$TMP/body")"
    stop_server "$PID"
else bad "plain server did not start"; fi
finish
