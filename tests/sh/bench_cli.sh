#!/bin/sh
# bench_cli.sh: `cumulo bench` as a user meets it: --help, one-line errors,
# and a tiny run whose JSON line carries the fields and the byte count a
# decode step reads (all weights minus the token-embedding rows not looked up,
# the separate output head included). Timings are printed, never asserted.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
need python3
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-../shared}
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
num() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" "$T/json"; }

"$BIN" bench --help >"$T/help" 2>&1 && grep -q -- "--vs-llamacpp" "$T/help" && ok || bad "--help"

expect_err() {
    want=$1; shift
    "$BIN" bench "$@" >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -ne 1 ] || [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -Eq "^cumulo: .*($want)" "$T/err"; then
        bad "bench $*: rc $rc, stderr: $(cat "$T/err")"
    else ok; fi
}
expect_err "no model given"
expect_err "cannot open '$T/none.gguf'" "$T/none.gguf"
expect_err "'foo' is not one of" "$T/none.gguf" --isa foo
expect_err "'0' is not an integer" "$T/none.gguf" --threads 0
expect_err "unknown option '--bogus'" "$T/none.gguf" --bogus

# A small Q8_0 model: vocab 32000 x dim 256, so one token_embd row is 8 blocks x 34 bytes.
"$BIN" synth --arch llama --dim 256 --layers 1 --heads 4 --kv-heads 2 --ffn 512 --type q8_0 \
    --vocab "$VOCAB" --seed 3 -o "$T/m.gguf" >/dev/null 2>&1 || bad "synth"
"$BIN" bench "$T/m.gguf" --threads 2 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --json --vs-llamacpp \
    --oracle-dir "$T/no-oracle" >"$T/json" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$T/json")" -eq 1 ] && ok || bad "json run: rc $rc, $(cat "$T/err")"
grep -q "skipping llama.cpp: node" "$T/err" && grep -q '"llamacpp_skipped"' "$T/json" && ok ||
    bad "missing oracle is skipped with a message: $(cat "$T/err")"
# The native anchor: a stand-in llama-bench that prints llama-bench's JSON (a
# prompt test and a decode test) and records its arguments. make_fake FILE
# HELP REJECT: its --help prints HELP (the load-mode option of one llama.cpp
# version); like llama-bench it exits 1 on an option it does not know (those
# matching the case pattern REJECT).
make_fake() {
    mkdir -p "$(dirname "$1")"
    cat >"$1" <<EOF
#!/bin/sh
case "\$1" in --help) echo "usage: llama-bench [options]"; echo "$2"; exit 0;; esac
for a in "\$@"; do case "\$a" in $3) echo "error: invalid parameter for argument: \$a" >&2; exit 1;; esac; done
echo "\$*" >'$T/lb-args'
echo "llama-bench noise on stdout"
if [ -n "\$FAKE_LOAD_MODE" ]; then lm=", \"load_mode\": \"\$FAKE_LOAD_MODE\""; else lm=""; fi
echo "[{\"n_prompt\": 8, \"n_gen\": 0, \"avg_ts\": 123.5\$lm}, {\"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": 45.25\$lm}]"
EOF
    chmod +x "$1"
}
make_fake "$T/llama-bench" "  -lm, --load-mode <auto|none|mmap|mlock|mmap+mlock|dio> (default: auto)" "-mmp"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 2 --bw-mib 16 --json --vs-llamacpp \
    --llamacpp-bench "$T/llama-bench" --oracle-dir "$T/no-oracle" >"$T/njson" 2>"$T/nerr"; rc=$?
[ $rc -eq 0 ] && grep -q '"anchor":"llama-bench (native build)"' "$T/njson" &&
    grep -q '"pp_tokens_per_s":123.5,"tg_tokens_per_s":45.25' "$T/njson" && ok ||
    bad "native anchor: rc $rc, $(cat "$T/nerr" "$T/njson")"
# its weights in memory as cumulo's (-lm none), and the JSON says so
grep -q -- "-t 1 -p 8 -n 4 -r 1 -ctk f16 -ctv f16 -o json -lm none$" "$T/lb-args" && ok ||
    bad "llama-bench args: $(cat "$T/lb-args")"
grep -q '"weights":"memory",.*"llamacpp_load":"none"' "$T/njson" && ok || bad "no llamacpp_load none: $(cat "$T/njson")"
# cumulo with --mmap: the anchor mapped too (-lm mmap), in the JSON and the table's anchor row
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --mmap --vs-llamacpp \
    --llamacpp-bench "$T/llama-bench" --oracle-dir "$T/no-oracle" >"$T/ntext" 2>"$T/nerr"
grep -q -- "-o json -lm mmap$" "$T/lb-args" && grep -q "^llama.cpp (native, load mmap) .*45.25" "$T/ntext" && ok ||
    bad "--mmap anchor: $(cat "$T/lb-args" "$T/nerr" "$T/ntext")"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --mmap --json --vs-llamacpp \
    --llamacpp-bench "$T/llama-bench" --oracle-dir "$T/no-oracle" >"$T/n3json" 2>"$T/nerr"
grep -q '"weights":"mmap",.*"llamacpp_load":"mmap"' "$T/n3json" && ok || bad "no llamacpp_load mmap: $(cat "$T/n3json")"
# the JSON records the load mode llama-bench reports having run with, when it differs from the one asked for
FAKE_LOAD_MODE=mmap "$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --json --vs-llamacpp \
    --llamacpp-bench "$T/llama-bench" --oracle-dir "$T/no-oracle" >"$T/n3json" 2>"$T/nerr"
grep -q '"llamacpp_load":"mmap"' "$T/n3json" && grep -q "reports load mode 'mmap' (asked for: none)" "$T/nerr" && ok ||
    bad "llama-bench's own load mode: $(cat "$T/nerr" "$T/n3json")"
# an older llama-bench: -mmp 0|1
make_fake "$T/old/llama-bench" "  -mmp, --mmap <0|1>                        (default: 1)" "-lm"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --json --vs-llamacpp \
    --llamacpp-bench "$T/old/llama-bench" --oracle-dir "$T/no-oracle" >"$T/n3json" 2>"$T/nerr"; rc=$?
[ $rc -eq 0 ] && grep -q -- "-o json -mmp 0$" "$T/lb-args" && grep -q '"llamacpp_load":"none"' "$T/n3json" && ok ||
    bad "old llama-bench (-mmp): rc $rc, $(cat "$T/lb-args" "$T/nerr" "$T/n3json")"
# one that knows neither option: its default, said on stderr, in the JSON and in the table
make_fake "$T/bare/llama-bench" "  -r, --repetitions <n>                     (default: 5)" "-lm|-mmp"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --json --vs-llamacpp \
    --llamacpp-bench "$T/bare/llama-bench" --oracle-dir "$T/no-oracle" >"$T/n3json" 2>"$T/nerr"; rc=$?
[ $rc -eq 0 ] && grep -q -- "-o json$" "$T/lb-args" && grep -q '"llamacpp_load":"default"' "$T/n3json" &&
    grep -q "has neither -lm nor -mmp in its --help: it runs with its default.*not like-for-like" "$T/nerr" && ok ||
    bad "llama-bench without a load-mode option: rc $rc, $(cat "$T/lb-args" "$T/nerr" "$T/n3json")"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --vs-llamacpp \
    --llamacpp-bench "$T/bare/llama-bench" --oracle-dir "$T/no-oracle" >"$T/ntext" 2>"$T/nerr"
grep -q "^llama.cpp (native, load default) " "$T/ntext" && ok || bad "default anchor row: $(cat "$T/ntext")"
# bench/llamacpp.sh's build without AMX is named as such in the JSON
mkdir -p "$T/noamx/bin" && cp "$T/llama-bench" "$T/noamx/bin/llama-bench"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --json --vs-llamacpp \
    --llamacpp-bench "$T/noamx/bin/llama-bench" --oracle-dir "$T/no-oracle" >"$T/n2json" 2>"$T/n2err"
grep -q '"anchor":"llama-bench (native build without AMX)"' "$T/n2json" && ok ||
    bad "noamx anchor label: $(cat "$T/n2err" "$T/n2json")"
grep -q '"cpu":{"vendor":"[^"]*","name":"[^"]*","family"' "$T/njson" && ok || bad "no cpu in the JSON: $(cat "$T/njson")"
CUMULO_LLAMACPP_BENCH="$T/missing-bench" "$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 \
    --json --vs-llamacpp --oracle-dir "$T/no-oracle" >"$T/mjson" 2>"$T/merr"
grep -q "llama-bench '$T/missing-bench' is not there" "$T/merr" && grep -q '"llamacpp_skipped"' "$T/mjson" && ok ||
    bad "missing llama-bench falls back: $(cat "$T/merr")"
wb=$(num weight_bytes); bpt=$(num bytes_per_token)
row=$((8 * 34)); embd=$((32000 * row))
[ -n "$wb" ] && [ "$bpt" = "$((wb - embd + row))" ] && ok || bad "bytes_per_token $bpt, weights $wb, expected $((wb - embd + row))"
for f in pp_tokens_per_s tg_tokens_per_s read_bw_gbs roofline_tokens_per_s tg_roofline_pct; do
    v=$(num $f)
    awk -v v="$v" 'BEGIN { exit !(v > 0) }' && ok || bad "$f is '$v'"
done
grep -q '"power":"\(measured\|estimated\|unknown\)"' "$T/json" && ok || bad "power label"
# Weights: read into memory by default, mapped with --mmap or CUMULO_MMAP=1 (same tokens either way)
grep -q '"weights":"memory"' "$T/json" && ok || bad "default weights not in memory: $(grep -o '"weights":"[a-z]*"' "$T/json")"
"$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 --json --mmap >"$T/mjson" 2>"$T/merr" &&
    grep -q '"weights":"mmap"' "$T/mjson" && ok || bad "--mmap: $(cat "$T/merr" "$T/mjson")"
CUMULO_MMAP=1 "$BIN" bench "$T/m.gguf" --threads 1 --prompt 8 --gen 4 --reps 1 --bw-mib 16 >"$T/mtext" 2>"$T/merr" &&
    grep -q 'mapped from the file' "$T/mtext" && ok || bad "CUMULO_MMAP=1: $(cat "$T/merr" "$T/mtext")"
grep -q -- '--mmap' "$T/help" && ok || bad "--mmap not in --help"

# --nodes: the same measurement over a one-node cluster on loopback
"$BIN" key --new --file "$T/k" >/dev/null 2>&1
# --port 0 and its port file: the node's own free port (a port picked and
# closed by another process can be taken meanwhile), known once it listens
# (it measures its speed first: ~1.1 s on a loaded 2-core machine; the
# script used to sleep 1 s and rely on the listen backlog)
"$BIN" node --port 0 --port-file "$T/node.port" --no-mdns --key-file "$T/k" >"$T/node.log" 2>&1 &
cnode=$!
i=0
while [ ! -s "$T/node.port" ] && [ $i -lt 300 ] && kill -0 $cnode 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
cport=$(cat "$T/node.port" 2>/dev/null)
[ -n "$cport" ] || bad "bench --nodes: the node did not start: $(tail -3 "$T/node.log")"
timeout 120 "$BIN" bench "$SHARED/models/stories260K-q8_0.gguf" --nodes "127.0.0.1:$cport" --key-file "$T/k" \
    --threads 1 --reps 1 --prompt 16 --gen 8 --bw-mib 16 --json >"$T/cjson" 2>"$T/cerr"; rc=$?
kill $cnode 2>/dev/null; wait $cnode 2>/dev/null
[ $rc -eq 0 ] && grep -q "cluster: 2 stages" "$T/cerr" && grep -q '"tg_tokens_per_s"' "$T/cjson" && ok ||
    bad "bench --nodes: rc $rc, $(cat "$T/cerr")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
