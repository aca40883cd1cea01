#!/bin/sh
# tests/sh/http_anthropic.sh: Anthropic's Messages API (POST /v1/messages)
# on stories260K-q8_0, through curl (raw SSE framing: "event: NAME" lines
# whose data's type is NAME, in the exact order message_start,
# content_block_start, ping, content_block_delta..., content_block_stop,
# message_delta, message_stop; the whole-message shape; Anthropic error
# bodies for every client mistake, including the ones the server answers
# before the route runs: 401, 405, 413) and through Anthropic's official SDK
# (tests/js/anthropic_sdk.mjs). At temperature 0 the reply equals
# /v1/chat/completions' for the same conversation (same template, same
# prompt), streamed or not.
. "$(dirname "$0")/lib/http_common.sh"
need curl node

if [ ! -d tests/js/node_modules/@anthropic-ai/sdk ]; then
    (cd tests/js && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { tail -20 "$TMP/npm.log" >&2; bad "npm ci in tests/js failed"; finish; exit 1; }
fi

start_server an --api-key ankey --max-body 65536 --ctx 2048 || { bad "server"; finish; exit 1; }
H='-H x-api-key:ankey'
SYS='"system":"You tell stories."'
MSGS='"messages":[{"role":"user","content":"Tell me about a cat."}]'

# The OpenAI route's text for the same conversation.
check "chat 200" [ "$(status "$URL/v1/chat/completions" -H 'Authorization: Bearer ankey' -d '{"messages":[{"role":"system","content":"You tell stories."},{"role":"user","content":"Tell me about a cat."}],"max_tokens":32,"temperature":0}')" = 200 ]
want=$(js 'j.choices[0].message.content' "$TMP/body")
check "chat text non-empty" [ -n "$want" ]

# ---- whole message ----
check "messages 200" [ "$(status "$URL/v1/messages" $H -d "{\"model\":\"x\",\"max_tokens\":32,\"temperature\":0,$SYS,$MSGS}")" = 200 ]
got=$(js 'j.content[0].text' "$TMP/body")
check "messages text == chat text ('$got' vs '$want')" [ "$got" = "$want" ]
check "message shape" [ "$(js 'j.type+"/"+j.role+"/"+j.id.startsWith("msg_")+"/"+j.content.length+"/"+j.content[0].type+"/"+j.stop_reason+"/"+j.stop_sequence+"/"+j.usage.output_tokens+"/"+(j.usage.input_tokens>0)+"/"+j.model' "$TMP/body")" = "message/assistant/true/1/text/max_tokens/null/32/true/stories260K-q8_0" ]
check "Bearer works too" [ "$(status "$URL/v1/messages" -H 'Authorization: Bearer ankey' -d "{\"model\":\"x\",\"max_tokens\":2,$MSGS}")" = 200 ]

# ---- stream: raw framing and order ----
curl -s -N -D "$TMP/hdr" $H "$URL/v1/messages" -d "{\"model\":\"x\",\"max_tokens\":32,\"temperature\":0,\"stream\":true,$SYS,$MSGS}" >"$TMP/sse"
check "SSE content type" grep -qi '^Content-Type: text/event-stream' "$TMP/hdr"
frame=$(node -e '
const t=require("fs").readFileSync(process.argv[1],"utf8");
const evs=t.split("\n\n");if(evs.pop()!=="")throw "stream does not end with a blank line";
const names=[];let text="",md=null,ms=null;
for(const ev of evs){if(ev.startsWith(":"))continue;
  const m=/^event: ([a-z_]+)\ndata: (.*)$/.exec(ev);if(!m)throw "bad event: "+JSON.stringify(ev);
  const j=JSON.parse(m[2]);if(j.type!==m[1])throw "event "+m[1]+" carries type "+j.type;
  names.push(m[1]);
  if(m[1]==="content_block_delta"){if(j.index!==0||j.delta.type!=="text_delta")throw "delta "+m[2];text+=j.delta.text}
  if(m[1]==="message_delta")md=j;if(m[1]==="message_start")ms=j.message}
const seq=names.filter((n,i)=>!(n==="content_block_delta"&&names[i-1]==="content_block_delta")).join(",");
process.stdout.write(seq+"|"+md.delta.stop_reason+"/"+md.delta.stop_sequence+"/"+md.usage.output_tokens+"|"+ms.id.startsWith("msg_")+"/"+ms.usage.input_tokens+"|"+text)' "$TMP/sse" 2>&1)
check "event order ($frame)" [ "${frame%%|*}" = "message_start,content_block_start,ping,content_block_delta,content_block_stop,message_delta,message_stop" ]
rest=${frame#*|}
check "message_delta ($rest)" [ "${rest%%|*}" = "max_tokens/null/32" ]
check "streamed text == whole text" [ "${frame##*|}" = "$got" ]

# ---- stop_sequences ----
word=$(printf '%s' "$got" | tr ' ' '\n' | sed -n '3,$p' | grep -E '^[a-z]{3,}$' | head -1)
check "a stop word in '$got'" [ -n "$word" ]
status "$URL/v1/messages" $H -d "{\"model\":\"x\",\"max_tokens\":32,\"temperature\":0,\"stop_sequences\":[\" $word\"],$SYS,$MSGS}" >/dev/null
check "stop_sequence reported" [ "$(js 'j.stop_reason+"/"+j.stop_sequence' "$TMP/body")" = "stop_sequence/ $word" ]
check "text ends before the stop sequence" [ "$(js 'j.content[0].text' "$TMP/body")" = "$(printf '%s' "$got" | sed "s/ $word.*//")" ]

# ---- max_tokens past the context is cut to what fits ----
check "huge max_tokens 200" [ "$(status "$URL/v1/messages" $H -d "{\"model\":\"x\",\"max_tokens\":100000000,\"temperature\":0,$MSGS}")" = 200 ]
check "huge max_tokens stops at the context" [ "$(js 'j.stop_reason+"/"+(j.usage.input_tokens+j.usage.output_tokens)' "$TMP/body")" = "max_tokens/$(curl -s $H "$URL/v1/models" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(String(JSON.parse(s).data[0].meta.n_ctx)))')" ]

# ---- Anthropic error bodies ----
# aerr STATUS TYPE REGEX DESCRIPTION curl-args...
aerr() {
    st=$1; ty=$2; re=$3; d=$4; shift 4
    s=$(status "$URL/v1/messages" "$@")
    shape=$(js 'j.type+"/"+j.error.type' "$TMP/body" 2>/dev/null)
    if [ "$s" = "$st" ] && [ "$shape" = "error/$ty" ] && grep -Eq "$re" "$TMP/body"; then ok; else bad "$d: $s $(cat "$TMP/body")"; fi
}
aerr 400 invalid_request_error 'not valid JSON' "bad JSON" $H -d '{'
aerr 400 invalid_request_error 'max_tokens: Field required' "no max_tokens" $H -d "{\"model\":\"x\",$MSGS}"
aerr 400 invalid_request_error 'model: Field required' "no model" $H -d "{\"max_tokens\":4,$MSGS}"
aerr 400 invalid_request_error 'messages: Field required' "no messages" $H -d '{"model":"x","max_tokens":4}'
aerr 400 invalid_request_error 'messages: Field required' "empty messages" $H -d '{"model":"x","max_tokens":4,"messages":[]}'
aerr 400 invalid_request_error 'max_tokens: must be an integer' "max_tokens 0" $H -d "{\"model\":\"x\",\"max_tokens\":0,$MSGS}"
aerr 400 invalid_request_error 'temperature: must be a number from 0 to 1' "temperature 2" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"temperature\":2,$MSGS}"
aerr 400 invalid_request_error 'top_k' "top_k -1" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"top_k\":-1,$MSGS}"
aerr 400 invalid_request_error 'messages.0.role' "role system in messages" $H -d '{"model":"x","max_tokens":4,"messages":[{"role":"system","content":"x"}]}'
aerr 400 invalid_request_error 'must answer a preceding' "tool_result without its tool_use" $H -d '{"model":"x","max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}'
aerr 400 invalid_request_error 'messages.0.content.0.type.*image' "image block" $H -d '{"model":"x","max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}'
aerr 400 invalid_request_error 'system' "system number" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"system\":5,$MSGS}"
aerr 400 invalid_request_error 'stop_sequences' "stop_sequences string" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"stop_sequences\":\"x\",$MSGS}"
aerr 400 invalid_request_error 'server tools' "server tool" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],$MSGS}"
aerr 400 invalid_request_error "'format'" "unsupported input_schema keyword" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"tool_choice\":{\"type\":\"any\"},\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}}],$MSGS}"
aerr 400 invalid_request_error 'prefilled' "prefill with tools" $H -d '{"model":"x","max_tokens":4,"tools":[{"name":"f","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}'
aerr 401 authentication_error 'API key' "no key"  -d "{\"model\":\"x\",\"max_tokens\":4,$MSGS}"
aerr 401 authentication_error 'API key' "wrong key" -H 'x-api-key: nope' -d "{\"model\":\"x\",\"max_tokens\":4,$MSGS}"
aerr 405 invalid_request_error 'use POST' "GET" $H
big=$(head -c 70000 /dev/zero | tr '\0' a)
aerr 413 request_too_large 'larger than' "413" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"system\":\"$big\",$MSGS}"
aerr 400 invalid_request_error 'prompt is too long' "prompt too long" $H -d "{\"model\":\"x\",\"max_tokens\":4,\"system\":\"$(head -c 30000 /dev/zero | tr '\0' a | sed 's/a/a /g' | head -c 60000)\",$MSGS}"
# The OpenAI routes keep their own error shape.
check "OpenAI error shape unchanged" [ "$(status "$URL/v1/chat/completions" -H 'Authorization: Bearer ankey' -d '{')" = 400 ]
check "OpenAI error body" [ "$(js 'typeof j.error.message+"/"+(j.type===undefined)' "$TMP/body")" = "string/true" ]
check "metrics count /v1/messages" sh -c "curl -s -H 'Authorization: Bearer ankey' '$URL/metrics' | grep -q 'route=\"/v1/messages\",status=\"200\"'"

# ---- the official SDK ----
node tests/js/anthropic_sdk.mjs "$URL" ankey "$want" >"$TMP/sdk.out" 2>"$TMP/sdk.err"
rc=$?
cat "$TMP/sdk.err" >&2
line=$(tail -1 "$TMP/sdk.out")
p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
[ "${p:-0}" -ge 27 ] || bad "anthropic_sdk.mjs ran ${p:-0} checks (expected at least 27)"
[ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && bad "anthropic_sdk.mjs exited $rc"
stop_server "$PID"
finish
