#!/bin/sh
# tests/sh/http_api.sh: `cumulo serve` through curl on stories260K-q8_0:
# every route; OpenAI shapes; raw SSE framing (data: events, role chunk, one
# finish_reason, usage chunk, [DONE]); at temperature 0 the streamed text
# equals the non-streamed text and equals `cumulo run`; stop strings;
# logprobs; every client mistake gets its 4xx OpenAI error naming the
# parameter (and no 5xx is ever counted); Host-header allow-list; API key
# (flag and CUMULO_API_KEY); CORS only when asked; the embedded dashboard is
# in sync with its HTML.
. "$(dirname "$0")/lib/http_common.sh"
need curl node

start_server a --slots 2 || { bad "server a"; finish; exit 1; }

# ---- routes ----
check "/health 200" [ "$(status "$URL/health")" = 200 ]
check "/health body" grep -q '"status":"ok"' "$TMP/body"
check "/v1/models 200" [ "$(status "$URL/v1/models")" = 200 ]
check "/v1/models id" [ "$(js 'j.data[0].id+"/"+j.object+"/"+j.data[0].object' "$TMP/body")" = "stories260K-q8_0/list/model" ]
curl -s -D "$TMP/hdr" -o "$TMP/index.html" "$URL/"
check "dashboard served" grep -q '<title>cumulo</title>' "$TMP/index.html"
check "dashboard CSP" grep -qi '^Content-Security-Policy:' "$TMP/hdr"
check "no CORS by default" sh -c "! grep -qi '^Access-Control-Allow-Origin' '$TMP/hdr'"
check "/api/cluster 200" [ "$(status "$URL/api/cluster")" = 200 ]
check "/api/cluster node" [ "$(js 'j.nodes.length+"/"+j.nodes[0].role+"/"+j.nodes[0].layers.join("-")+"/"+j.n_layer' "$TMP/body")" = "1/coordinator+worker/0-5/5" ]
check "/api/cluster power label" [ -n "$(js '["measured","estimated"].includes(j.nodes[0].power_source)&&j.nodes[0].power_watts>0?"y":""' "$TMP/body")" ]
# KV memory per token (issue 23): 5 layers x 4 KV heads x (K + V) rows of 8 elements in the type
check "/api/cluster kv per token" [ "$(js 'j.kv_type_k+"/"+j.kv_type_v+"/"+j.kv_bytes_per_token+"/"+(j.n_ctx>0)' "$TMP/body")" = "f32/f32/1280/true" ]
check "/api/cluster memory" [ -n "$(js 'j.nodes[0].memory_total>0&&j.nodes[0].memory_used>0?"y":""' "$TMP/body")" ]
sh tools/embed_dashboard.sh "$TMP/dashboard.c"
check "dashboard.c matches dashboard.html (run tools/embed_dashboard.sh)" cmp -s "$TMP/dashboard.c" src/http/dashboard.c

# ---- greedy: non-streamed == streamed == cumulo run ----
P='Once upon a time'
"$BIN" run "$MODEL" -p "$P" -n 40 --temp 0 --threads 1 --json >"$TMP/run.json" 2>/dev/null
want=$(js 'j.text' "$TMP/run.json")
check "completions 200" [ "$(status "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0}")" = 200 ]
got=$(js 'j.choices[0].text' "$TMP/body")
check "completions text == cumulo run ('$got' vs '$want')" [ "$got" = "$want" ]
check "completions shape" [ "$(js 'j.object+"/"+j.choices[0].finish_reason+"/"+j.usage.completion_tokens+"/"+j.usage.prompt_tokens+"/"+(j.usage.total_tokens==j.usage.prompt_tokens+j.usage.completion_tokens)' "$TMP/body")" = "text_completion/length/40/5/true" ]
curl -s -N "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}" >"$TMP/sse1"
sgot=$(node -e '
const t=require("fs").readFileSync(process.argv[1],"utf8");let s="";
for(const ev of t.split("\n\n")){if(!ev.startsWith("data: ")||ev=="data: [DONE]")continue;const j=JSON.parse(ev.slice(6));s+=j.choices[0].text}
process.stdout.write(s)' "$TMP/sse1")
check "streamed completions == non-streamed" [ "$sgot" = "$got" ]

CHAT='{"messages":[{"role":"system","content":"You tell stories."},{"role":"user","content":"Tell me about a cat."}],"max_tokens":30,"temperature":0'
check "chat 200" [ "$(status "$URL/v1/chat/completions" -d "$CHAT}")" = 200 ]
ctext=$(js 'j.choices[0].message.content' "$TMP/body")
check "chat shape" [ "$(js 'j.object+"/"+j.choices[0].message.role+"/"+j.choices[0].index+"/"+j.id.startsWith("chatcmpl-")' "$TMP/body")" = "chat.completion/assistant/0/true" ]
check "chat text non-empty" [ -n "$ctext" ]
curl -s -N -D "$TMP/sse_hdr" "$URL/v1/chat/completions" -d "$CHAT,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$TMP/sse2"
check "SSE content type" grep -qi '^Content-Type: text/event-stream' "$TMP/sse_hdr"
# Raw framing: every event is exactly "data: <json>\n\n", ending with [DONE].
frame=$(node -e '
const t=require("fs").readFileSync(process.argv[1],"utf8"),want=process.argv[2];
const evs=t.split("\n\n");if(evs.pop()!=="")throw "stream does not end with a blank line";
if(evs.pop()!=="data: [DONE]")throw "last event is not [DONE]";
let text="",fin=0,usage=null;
evs.forEach((ev,i)=>{if(!ev.startsWith("data: ")||ev.includes("\n"))throw "bad event "+i+": "+ev;
  const j=JSON.parse(ev.slice(6));if(j.object!=="chat.completion.chunk")throw "object "+j.object;
  if(!("usage" in j))throw "usage missing (include_usage)";
  if(j.choices.length===0){usage=j.usage;return}
  const c=j.choices[0];if(i===0&&(c.delta.role!=="assistant"||c.delta.content!==""))throw "first chunk is not the role";
  if(c.finish_reason){fin++;if(JSON.stringify(c.delta)!=="{}")throw "finish chunk has content";if(c.finish_reason!=="length")throw c.finish_reason}
  else if(i>0)text+=c.delta.content;});
if(fin!==1)throw "finish_reason chunks: "+fin;if(!usage||usage.completion_tokens!==30||usage.total_tokens!==usage.prompt_tokens+30)throw "usage "+JSON.stringify(usage);
if(text!==want)throw "streamed chat differs: "+JSON.stringify(text)+" vs "+JSON.stringify(want);
process.stdout.write("ok")' "$TMP/sse2" "$ctext" 2>&1)
check "SSE framing + streamed chat == non-streamed: $frame" [ "$frame" = ok ]

# ---- stop strings, logprobs ----
check "stop 200" [ "$(status "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":60,\"temperature\":0,\"stop\":[\".\",\"zzz\"]}")" = 200 ]
check "stop: text cut before '.'" [ "$(js 'j.choices[0].text' "$TMP/body")" = "$(printf '%s' "$want" | sed 's/\..*//')" ]
check "stop: finish_reason stop" [ "$(js 'j.choices[0].finish_reason' "$TMP/body")" = stop ]
check "logprobs 200" [ "$(status "$URL/v1/chat/completions" -d "$CHAT,\"logprobs\":true,\"top_logprobs\":3}")" = 200 ]
check "logprobs shape (one per token, top 3, greedy = top-1, <= 0)" [ "$(js '(c=>(c.length===j.usage.completion_tokens||c.length===j.usage.completion_tokens-1)&&c.every(e=>e.top_logprobs.length===3&&e.logprob<=0&&e.top_logprobs[0].token===e.token&&Array.isArray(e.bytes)))(j.choices[0].logprobs.content)' "$TMP/body")" = true ]
check "completions logprobs 200" [ "$(status "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":5,\"temperature\":0,\"logprobs\":2}")" = 200 ]
check "completions logprobs (legacy shape)" [ "$(js '(l=>l.tokens.length===5&&l.token_logprobs.length===5&&Object.keys(l.top_logprobs[0]).length===2&&l.text_offset[0]===0&&l.tokens.join("")===j.choices[0].text)(j.choices[0].logprobs)' "$TMP/body")" = true ]
check "seeded sampling repeats" [ "$(status "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":20,\"temperature\":1,\"seed\":7}")" = 200 ]
s1=$(js 'j.choices[0].text' "$TMP/body")
status "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":20,\"temperature\":1,\"seed\":7}" >/dev/null
check "same seed, same text" [ "$(js 'j.choices[0].text' "$TMP/body")" = "$s1" ]

# ---- client mistakes: status, type, param ----
# err EXPECTED_STATUS EXPECTED_PARAM_OR_CODE ROUTE BODY
err() {
    st=$(status "$URL$3" -H 'Content-Type: application/json' --data-binary "$4")
    check "$3 $4 -> $st (want $1)" [ "$st" = "$1" ]
    pc=$(js '(j.error.param||"")+"|"+(j.error.code||"")+"|"+typeof j.error.message+"|"+typeof j.error.type' "$TMP/body" 2>/dev/null)
    check "$3 $4 -> error object $pc (want $2)" sh -c "printf '%s' '$pc' | grep -q '$2' && printf '%s' '$pc' | grep -q 'string|string'"
}
err 400 '^|' /v1/chat/completions '{"messages": [1,2'
err 400 '^|' /v1/chat/completions '[1,2,3]'
err 400 '^messages|' /v1/chat/completions '{"model":"stories260K-q8_0"}'
err 400 '^messages\[0\].role|' /v1/chat/completions '{"messages":[{"role":"tool","content":"x"}]}'
err 400 '^messages\[0\].content|' /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}'
err 400 '^n|' /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"n":2}'
err 400 '^temperature|' /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}'
err 400 '^temperature|' /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"temperature":5}'
err 400 '^top_p|' /v1/completions '{"prompt":"x","top_p":1.5}'
err 400 '^max_tokens|' /v1/completions '{"prompt":"x","max_tokens":0}'
err 400 '^stop|' /v1/completions '{"prompt":"x","stop":[1]}'
err 400 '^seed|' /v1/completions '{"prompt":"x","seed":1.5}'
err 400 '^stream_options|' /v1/completions '{"prompt":"x","stream_options":{"include_usage":true}}'
err 400 '^response_format|' /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a+"}}}}'
err 400 '^top_logprobs|' /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}'
err 400 '^prompt|' /v1/completions '{"prompt":[100000]}'
err 400 '^prompt|' /v1/completions '{}'
err 404 '^model|model_not_found' /v1/chat/completions '{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}'
long=$(awk 'BEGIN{for(i=0;i<700;i++)printf "cat "}')
err 400 '^prompt|context_length_exceeded' /v1/completions "{\"prompt\":\"$long\"}"
check "context message names the counts" grep -Eq 'maximum context length is 512 tokens.*resulted in [0-9]{3,} tokens' "$TMP/body"
err 400 '^max_tokens|context_length_exceeded' /v1/completions '{"prompt":"Once","max_tokens":600}'
check "unknown route 404" [ "$(status "$URL/v1/nothing")" = 404 ]
check "404 is an error object" [ "$(js 'j.error.code' "$TMP/body")" = not_found ]
check "GET on a POST route 405" [ "$(curl -s -o /dev/null -D "$TMP/h405" -w '%{http_code}' "$URL/v1/chat/completions")" = 405 ]
check "405 says Allow: POST" grep -qi '^Allow: POST' "$TMP/h405"
check "POST /health 405" [ "$(status "$URL/health" -d '{}')" = 405 ]
head -c 2000000 /dev/zero | tr '\0' 'a' >"$TMP/big"
check "2 MB body 413" [ "$(status "$URL/v1/completions" -H 'Content-Type: application/json' --data-binary @"$TMP/big")" = 413 ]
check "413 is an error object" [ "$(js 'j.error.code' "$TMP/body")" = request_too_large ]
check "2 MB chunked body 413" [ "$(status "$URL/v1/completions" -H 'Transfer-Encoding: chunked' --data-binary @"$TMP/big")" = 413 ]
hdr=$(head -c 40000 /dev/zero | tr '\0' 'h')
st=$(status "$URL/health" -H "X-Big: $hdr")
check "40 KB header refused with 4xx ($st)" sh -c "[ '$st' = 431 ] || [ '$st' = 413 ] || [ '$st' = 400 ]"
check "server still serves" [ "$(status "$URL/health")" = 200 ]

# ---- DNS rebinding: Host allow-list ----
check "Host evil.example 403" [ "$(status "$URL/v1/models" -H 'Host: evil.example')" = 403 ]
check "403 names the fix" grep -q 'allow-host' "$TMP/body"
check "Host localhost:port ok" [ "$(status "$URL/v1/models" -H "Host: localhost:$PORT")" = 200 ]
check "Host [::1] ok" [ "$(status "$URL/v1/models" -H "Host: [::1]:$PORT")" = 200 ]
check "Host 127.0.0.1 ok" [ "$(status "$URL/v1/models" -H 'Host: 127.0.0.1')" = 200 ]

curl -s "$URL/metrics" >"$TMP/metrics"
check "metrics: requests by route and status" grep -q 'cumulo_requests_total{route="/v1/chat/completions",status="400"}' "$TMP/metrics"
check "metrics: generated tokens" grep -Eq '^cumulo_generated_tokens_total [1-9]' "$TMP/metrics"
check "metrics: prompt tokens" grep -Eq '^cumulo_prompt_tokens_total [1-9]' "$TMP/metrics"
check "metrics: per-node power labelled" grep -Eq '^cumulo_node_power_watts\{node="[^"]+",source="(measured|estimated)"\} [0-9.]+$' "$TMP/metrics"
check "metrics: no server errors for client mistakes" grep -q '^cumulo_errors_total{kind="server"} 0$' "$TMP/metrics"
check "metrics: client errors counted" grep -Eq '^cumulo_errors_total\{kind="client"\} [1-9]' "$TMP/metrics"
stop_server "$PID"

# ---- API key (env and flag), CORS, --allow-host ----
CUMULO_API_KEY=sekrit start_server b --cors http://example.test --allow-host my.box || bad "server b"
check "key: /health open" [ "$(status "$URL/health")" = 200 ]
check "key: missing 401" [ "$(status "$URL/v1/models")" = 401 ]
check "key: 401 object" [ "$(js 'j.error.type+"/"+j.error.code' "$TMP/body")" = authentication_error/invalid_api_key ]
check "key: wrong 401" [ "$(status "$URL/v1/models" -H 'Authorization: Bearer sekriT')" = 401 ]
check "key: prefix 401" [ "$(status "$URL/v1/models" -H 'Authorization: Bearer sekri')" = 401 ]
check "key: metrics 401" [ "$(status "$URL/metrics")" = 401 ]
check "key: chat 401" [ "$(status "$URL/v1/chat/completions" -d '{}')" = 401 ]
check "key: right 200" [ "$(status "$URL/v1/models" -H 'Authorization: Bearer sekrit')" = 200 ]
curl -s -D "$TMP/hc" -o /dev/null -H 'Authorization: Bearer sekrit' "$URL/v1/models"
check "CORS header when asked" grep -qi '^Access-Control-Allow-Origin: http://example.test' "$TMP/hc"
check "CORS preflight 204" [ "$(curl -s -o /dev/null -D "$TMP/hp" -w '%{http_code}' -X OPTIONS "$URL/v1/chat/completions")" = 204 ]
check "preflight allows Authorization" grep -qi '^Access-Control-Allow-Headers: .*Authorization' "$TMP/hp"
check "--allow-host my.box" [ "$(status "$URL/v1/models" -H 'Host: my.box' -H 'Authorization: Bearer sekrit')" = 200 ]
check "other name still 403" [ "$(status "$URL/v1/models" -H 'Host: other.box' -H 'Authorization: Bearer sekrit')" = 403 ]
stop_server "$PID"
start_server c --api-key k2 || bad "server c"
check "--api-key flag 401" [ "$(status "$URL/v1/models")" = 401 ]
check "--api-key flag 200" [ "$(status "$URL/v1/models" -H 'Authorization: Bearer k2')" = 200 ]
stop_server "$PID"
finish
