#!/bin/sh
# tests/sh/http_cluster_dash.sh: the dashboard of a 3-node cluster. Two
# `cumulo node`s on 127.0.0.1 (a temporary key) and `cumulo serve --nodes`
# make a 3-stage pipeline; /api/cluster lists the 3 machines with layer ranges
# that cover every layer, and headless Chromium (tests/js/dashboard.mjs) sees
# the 3 nodes with those layers and the link between stages, sends a chat
# message and sees the streamed answer; the nodes are shown by their --name.
# Then tests/js/dashboard_layout.mjs checks the layout for 2, 4, 8 and 16
# nodes at 800, 1400 and 1920 px (a made-up /api/cluster of that size on the
# real page). Screenshots: tests/artifacts/dashboard-cluster*.png and
# tests/artifacts/dash-N*-w*.png (ignored by git). Every process is killed on exit (http_common's trap).
. "$(dirname "$0")/lib/http_common.sh"
need node curl

if [ ! -d tests/js/node_modules/playwright-core ]; then
    (cd tests/js && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { tail -20 "$TMP/npm.log" >&2; bad "npm ci in tests/js failed"; finish; exit 1; }
fi
[ -x /usr/bin/chromium ] || { echo "skip: needs /usr/bin/chromium (scripts/setup.sh installs it)"; echo "$pass passed, $fail failed, 1 skipped"; exit 0; }

export CUMULO_KEY_FILE="$TMP/key"
"$BIN" key >/dev/null 2>&1 || { bad "cumulo key"; finish; exit 1; }
NODES=""
for i in 1 2; do
    "$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/p$i" --no-mdns --threads 1 --cache "$TMP/c$i" --name "stage-box-$i" \
        >"$TMP/n$i.log" 2>&1 &
    SERVER_PIDS="$SERVER_PIDS $!"
    k=0
    while [ ! -s "$TMP/p$i" ] && [ $k -lt 100 ]; do sleep 0.05; k=$((k + 1)); done
    [ -s "$TMP/p$i" ] || { bad "node $i did not start: $(tail -3 "$TMP/n$i.log")"; finish; exit 1; }
    NODES="$NODES${NODES:+,}127.0.0.1:$(cat "$TMP/p$i")"
done
start_server cdash --nodes "$NODES" --slots 2 --api-key dashkey || { bad "serve --nodes"; finish; exit 1; }
check "serve planned 3 stages" grep -q 'pp plan, 3 stages' "$TMP/cdash.log"

status "$URL/api/cluster" -H 'Authorization: Bearer dashkey' >"$TMP/st"
check "/api/cluster 200" [ "$(cat "$TMP/st")" = 200 ]
cp "$TMP/body" "$TMP/cluster.json"
check "/api/cluster: 3 nodes, 3 stages" [ "$(js '[j.nodes.length, j.n_stages, j.nodes.map(n=>n.stage).join()]' "$TMP/cluster.json")" = '[3,3,"0,1,2"]' ]
check "/api/cluster: layers contiguous over all layers" [ "$(js 'j.nodes.every((n,i)=>n.layers[0]===(i?j.nodes[i-1].layers[1]:0)&&n.layers[1]>n.layers[0])&&j.nodes[2].layers[1]===j.n_layer&&j.n_layer===5' "$TMP/cluster.json")" = true ]
# Issue 19: remote nodes report live telemetry in their heartbeats (memory,
# load, power labelled); these nodes share this machine, so the cluster's
# watts count it once (power_hosts 1: the coordinator's own reading).
k=0
while [ $k -lt 50 ] && [ "$(js 'j.nodes.slice(1).every(n=>n.memory_source==="live (heartbeat)")' "$TMP/cluster.json")" != true ]; do
    sleep 0.1; k=$((k + 1))
    status "$URL/api/cluster" -H 'Authorization: Bearer dashkey' >/dev/null && cp "$TMP/body" "$TMP/cluster.json"
done
check "/api/cluster: remote nodes by address, live power labelled, memory and load from heartbeats" \
    [ "$(js 'j.nodes.slice(1).map(n=>[n.id,typeof n.power_watts,/^(measured|estimated)$/.test(n.power_source),n.memory_source,typeof n.cpu_load,n.host_id===j.nodes[0].host_id].join()).sort().join(";")' "$TMP/cluster.json")" = \
      "$(echo "$NODES" | tr ',' '\n' | sort | sed 's/$/,number,true,live (heartbeat),number,true/' | paste -sd';')" ]
check "/api/cluster: one shared host counted once in the cluster's watts" \
    [ "$(js '[j.power_hosts, j.power_missing, j.power_watts===j.nodes[0].power_watts].join()' "$TMP/cluster.json")" = "1,0,true" ]
check "/api/cluster: coordinator power labelled" [ "$(js '/^(measured|estimated)$/.test(j.nodes[0].power_source)&&typeof j.nodes[0].power_watts' "$TMP/cluster.json")" = number ]
check "/api/cluster: 2 links, both measured (the second, node to node, by the nodes themselves)" \
    [ "$(js '[j.links.length, typeof j.links[0].latency_ms, typeof j.links[0].bandwidth_mbps, typeof j.links[1].latency_ms, typeof j.links[1].bandwidth_mbps, j.links[0].source, j.links[1].source].join()' "$TMP/cluster.json")" = '2,number,number,number,number,measured at connect,measured node to node' ]

mkdir -p tests/artifacts
echo "# node $(node --version)" >&2
node tests/js/dashboard.mjs "$URL" dashkey tests/artifacts 3 dashboard-cluster >"$TMP/dash.out" 2>"$TMP/dash.err"
rc=$?
cat "$TMP/dash.err" >&2
line=$(tail -1 "$TMP/dash.out")
p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
[ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && bad "dashboard.mjs exited $rc"
check "screenshots saved" sh -c '[ -s tests/artifacts/dashboard-cluster.png ] && [ -s tests/artifacts/dashboard-cluster-chat.png ]'
check "/api/cluster: the nodes' --name" [ "$(js 'j.nodes.slice(1).map(n=>n.name).sort().join()' "$TMP/cluster.json")" = "stage-box-1,stage-box-2" ]

node tests/js/dashboard_layout.mjs "$URL" dashkey tests/artifacts >"$TMP/lay.out" 2>"$TMP/lay.err"
rc=$?
cat "$TMP/lay.err" >&2
line=$(tail -1 "$TMP/lay.out")
p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
[ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && bad "dashboard_layout.mjs exited $rc"
[ "${p:-0}" -ge 100 ] || bad "dashboard_layout.mjs ran only ${p:-0} checks"
finish
