#!/bin/sh
# plan_cli.sh: `cumulo plan` on the example cluster files (simulated) and on
# two live nodes on 127.0.0.1 (the plan a real cluster settles on).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
need python3
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-../shared}
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
tmp=$(mktemp -d)
cleanup() { [ -n "$n1" ] && kill $n1 $n2 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

for f in examples/clusters/*.json; do
    out=$("$BIN" plan --simulate "$f" 2>&1)
    if [ $? -eq 0 ] && echo "$out" | grep -q '^mode ' && echo "$out" | grep -q 'alternatives'; then ok; else bad "simulate $f: $out"; fi
    j=$("$BIN" plan --simulate "$f" --json 2>&1)
    echo "$j" | grep -q '"tok_s"' && ok || bad "simulate $f --json: $j"
done
# a model that fits nowhere: the error says how much is missing
cat > "$tmp/small.json" <<'J'
{ "nodes": [ { "name": "tiny", "count": 2, "mem_gb": 4, "mem_bw_gbs": 50, "tflops": 1 } ] }
J
out=$("$BIN" plan --preset llama-3-70b --type q4_k_m --simulate "$tmp/small.json" 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q 'GiB missing' && ok || bad "does not fit: $out"
out=$("$BIN" plan "$SHARED/models/stories260K-f32.gguf" 2>&1)
[ $? -ne 0 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && ok || bad "no --simulate/--nodes: $out"
out=$("$BIN" plan --simulate /nonexistent.json 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q 'no such file' && ok || bad "missing cluster file: $out"

# shared hosts (issue 19): three nodes on one 2-core machine are planned at a
# third of it each (before: each at the whole machine, 38 tok/s predicted,
# 10-16 measured), said in the plan; the KV line says per sequence and in all
cat > "$tmp/shared.json" <<'J'
{ "nodes": [ { "name": "vm", "count": 3, "mem_gb": 20, "mem_bw_gbs": 15, "tflops": 0.06, "host": "vm-1" } ],
  "links": { "rtt_ms": 0.02, "gbit": 40 } }
J
sed 's/, "host": "vm-1"//' "$tmp/shared.json" >"$tmp/separate.json"
sh_out=$("$BIN" plan --preset llama-3.2-1b --type q4_0 --parallel pp --simulate "$tmp/shared.json" 2>&1)
sep_out=$("$BIN" plan --preset llama-3.2-1b --type q4_0 --parallel pp --simulate "$tmp/separate.json" 2>&1)
tsh=$(echo "$sh_out" | sed -n 's/^mode pp; one stream \([0-9.]*\) tok.*/\1/p')
tsep=$(echo "$sep_out" | sed -n 's/^mode pp; one stream \([0-9.]*\) tok.*/\1/p')
awk -v a="$tsh" -v b="$tsep" 'BEGIN { r = a / b; exit !(b > 0 && r > 0.30 && r < 0.37) }' && ok ||
    bad "shared host: $tsh vs $tsep tok/s (want ~1/3): $sh_out"
echo "$sh_out" | grep -q '^shared host vm-1: 3 members (vm1, vm2, vm3) share its cores and memory bandwidth: each planned at 1/3$' && ok ||
    bad "shared host not said: $sh_out"
echo "$sep_out" | grep -q '^shared host' && bad "separate hosts said shared: $sep_out" || ok
kv_out=$("$BIN" plan --preset llama-3.2-1b --type q4_0 --seq 4 --ctx 1024 --simulate "$tmp/separate.json" 2>&1)
echo "$kv_out" | grep -Eq '^kv cache: [0-9.]+ MiB per sequence \(1024 positions\), [0-9.]+ MiB in all for 4 sequences$' && ok ||
    bad "kv per sequence: $kv_out"
per=$(echo "$kv_out" | sed -n 's/^kv cache: \([0-9.]*\) MiB per sequence.*/\1/p')
all=$(echo "$kv_out" | sed -n 's/.*MiB per sequence.*, \([0-9.]*\) MiB in all.*/\1/p')
awk -v p="$per" -v a="$all" 'BEGIN { exit !(p > 0 && a > 3.99 * p && a < 4.01 * p) }' && ok || bad "kv total $all vs 4 x $per"

# KV memory per token by type (issue 23): llama 3.2 1B = 16 layers x 8 KV heads x 64, f16 32 KiB, q8_0 17;
# a head of 8 (stories260K) is not whole Q8_0 blocks: refused as `run` refuses it, not counted as part of one
for kt in "f16 32.0" "q8_0 17.0" "q4_0 9.0"; do
    set -- $kt
    o=$("$BIN" plan --preset llama-3.2-1b --kv-type "$1" --simulate "$tmp/separate.json" 2>&1)
    echo "$o" | grep -q "^kv cache: $1, $2 KiB per token of context" && ok || bad "kv per token $1: $(echo "$o" | head -3)"
done
if o=$("$BIN" plan "$SHARED/models/stories260K-q8_0.gguf" -ctk q8_0 --simulate "$tmp/separate.json" 2>&1); then
    bad "a q8_0 K for a head of 8 was planned: $(echo "$o" | head -3)"
else
    echo "$o" | grep -q 'not usable with head size 8' && ok || bad "head 8 q8_0: $o"
fi

# mixture-of-experts presets (issue 13): active vs total parameters, expert groups among the
# alternatives, the exchange bytes per token = (members - 1) x used x layers x dim x 4
for pr in qwen3-30b-a3b qwen3-235b-a22b gpt-oss-120b mixtral-8x7b; do
    out=$("$BIN" plan --preset $pr --simulate examples/clusters/mac-mini-m4pro-x4-tb5.json 2>&1)
    echo "$out" | grep -q 'B active per token' && echo "$out" | grep -qE '^  ep +[0-9.]+ tok/s' && ok || bad "preset $pr: $out"
done
out=$("$BIN" plan --preset qwen3-235b-a22b --parallel ep --simulate examples/clusters/mac-mini-m4pro-x4-tb5.json 2>&1)
echo "$out" | grep -q "experts: 128, 8 used per token; $((3 * 8 * 94 * 4096 * 4)) bytes of expert exchange" && ok ||
    bad "qwen3-235b-a22b ep: $(echo "$out" | grep -E 'experts|mode')"
out=$("$BIN" plan --preset deepseek-v3-671b --simulate examples/clusters/mac-mini-m4pro-x4-tb5.json 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q 'GiB missing' && ok || bad "deepseek-v3-671b on 4 x 56 GB fits: $out"
# deepseek2 presets (MLA: the cache is one 576-value latent row per token and layer, F32 here:
# 61 x 32768 x 576 x 4 bytes = 4392.0 MiB on every member of an expert group; the first 3 (V3)
# or 1 (Kimi K2) layers are dense and exchange nothing)
for pr in deepseek-v3-671b:58:256 kimi-k2:60:384; do
    name=${pr%%:*} rest=${pr#*:} moe=${pr#*:}; moe=${rest%%:*}; nx=${rest#*:}
    out=$("$BIN" plan --preset "$name" --simulate examples/clusters/mac-studio-m3ultra-x4-tb5.json 2>&1)
    echo "$out" | grep -qE '^  ep +[0-9.]+ tok/s' && echo "$out" | grep -q ' 4392.0M ' &&
        echo "$out" | grep -q "experts: $nx, 8 used per token; $((3 * 8 * moe * 7168 * 4)) bytes of expert exchange" && ok ||
        bad "preset $name on 4 x 480 GB: $out"
done
out=$("$BIN" plan --preset llama-3-70b --parallel ep --simulate examples/clusters/mac-mini-m4pro-x4-tb5.json 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q 'mixture-of-experts' && ok || bad "ep on a dense model: $out"

# live: two nodes on loopback with a temporary key
"$BIN" key --new --file "$tmp/k" >/dev/null 2>&1 || bad "key"
# --port 0 and port files: each node's own free port (a port picked and closed
# by another process can be taken meanwhile), known once it listens (a node
# measures its speed first: ~1.1 s on a loaded 2-core machine; the script
# used to sleep 1 s and rely on the listen backlog)
"$BIN" node --port 0 --port-file "$tmp/n1.port" --no-mdns --key-file "$tmp/k" >"$tmp/n1.log" 2>&1 & n1=$!
"$BIN" node --port 0 --port-file "$tmp/n2.port" --no-mdns --key-file "$tmp/k" >"$tmp/n2.log" 2>&1 & n2=$!
i=0
while { [ ! -s "$tmp/n1.port" ] || [ ! -s "$tmp/n2.port" ]; } && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
p1=$(cat "$tmp/n1.port" 2>/dev/null); p2=$(cat "$tmp/n2.port" 2>/dev/null)
[ -n "$p1" ] && [ -n "$p2" ] || bad "live: the nodes did not start: $(tail -2 "$tmp/n1.log" "$tmp/n2.log")"
out=$(timeout 60 "$BIN" plan "$SHARED/models/stories260K-q8_0.gguf" --nodes "127.0.0.1:$p1,127.0.0.1:$p2" --key-file "$tmp/k" 2>&1)
if [ $? -eq 0 ] && [ "$(echo "$out" | grep -c "127.0.0.1:")" -ge 2 ] && echo "$out" | grep -q 'head'; then ok; else bad "live plan: $out"; fi
# the two nodes and this machine share this host (their HELLOs say so): the plan says it, and the KV is one sequence's
echo "$out" | grep -q '^shared host .*: 3 members (.* (here), .*, .*) share its cores' && ok || bad "live: shared host not said: $out"
echo "$out" | grep -q 'MiB in all for 1 sequence$' && ok || bad "live: kv for one sequence by default: $out"
# every layer is placed once: the stages' ranges cover 0..4
layers=$(echo "$out" | awk '$0 ~ /^vm/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+-[0-9]+$/) { print $i; break } }' | tr '\n' ' ')
echo "$layers" | grep -q '^0-' && echo "$layers" | grep -q -- '-4 $' && ok || bad "layer ranges: $layers"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
