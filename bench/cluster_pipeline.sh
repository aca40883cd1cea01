#!/bin/sh
# bench/cluster_pipeline.sh: a benchmark, not a test. A 2-stage pipeline on
# 127.0.0.1 (this process + one `cumulo node`, 1 thread each) with 1, 2 and 4
# concurrent greedy streams: aggregate tokens/s, per-token round trip, the
# link's measured RTT, bytes per token on the hop. Same run, same machine:
# the single-machine numbers are printed beside it. One JSON line per case.
#   sh bench/cluster_pipeline.sh [MODEL.gguf ...]   (default: stories260K-q8_0 and a 24-layer copy)
cd "$(dirname "$0")/.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
N=${BENCH_TOKENS:-128}
TMP=$(mktemp -d)
PID=""
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
export CUMULO_KEY_FILE="$TMP/key"
"$BIN" key >/dev/null 2>&1
models="$*"
if [ -z "$models" ]; then
    CM_TEST_WRITE_DEEP="$TMP/deep24.gguf" build/tests/test_cluster >/dev/null 2>&1
    models="$SHARED/models/stories260K-q8_0.gguf $TMP/deep24.gguf"
fi
"$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/port" --no-mdns --threads 1 --models "$SHARED/models" \
    --cache "$TMP/cache" >"$TMP/node.log" 2>&1 &
PID=$!
while [ ! -s "$TMP/port" ]; do sleep 0.05; done
NODE=127.0.0.1:$(cat "$TMP/port")
for m in $models; do
    name=$(basename "$m" .gguf)
    # an even split, so runs compare (the planner's choice moves with the measured speeds)
    nl=$(case "$name" in deep24) echo 24 ;; *) echo 5 ;; esac)
    split="$(((nl + 1) / 2)),$((nl / 2))"
    for s in 1 2 4; do
        "$BIN" run "$m" -p "Once upon a time" -n "$N" --temp 0 --ignore-eos --threads 1 --streams "$s" --json \
            >"$TMP/local.json" 2>/dev/null
        "$BIN" run "$m" --nodes "$NODE" --layers "$split" -p "Once upon a time" -n "$N" --temp 0 --ignore-eos --threads 1 --streams "$s" \
            --json >"$TMP/cl.json" 2>"$TMP/cl.err"
        perl -MJSON::PP -e '
            local $/; open L, "<", $ARGV[0]; my $l = decode_json(<L>); open C, "<", $ARGV[1]; my $c = decode_json(<C>);
            open E, "<", $ARGV[2]; my $e = <E>; my ($rtt) = $e =~ /rtt ([0-9.]+) ms/; my ($split) = $e =~ /(layers split by --layers \S+)/;
            my $tok = $c->{tokens}; my $s = $ARGV[4];
            printf "{\"model\":\"%s\",\"streams\":%d,\"local_tps\":%.1f,\"cluster_tps\":%.1f,\"ratio\":%.2f,\"ms_per_token_per_stream\":%.3f,\"link_rtt_ms\":%.3f,\"hop_bytes_per_token\":%.1f,\"hop_bytes_per_decode_token\":%d,\"identical\":%s,\"split\":\"%s\"}\n",
                $ARGV[3], $s, $l->{aggregate_tps}, $c->{aggregate_tps}, $c->{aggregate_tps} / ($l->{aggregate_tps} || 1),
                1000 * $c->{seconds} / ($tok / $s || 1), $rtt, $c->{hop_bytes} / ($c->{hop_rows} || 1),
                4 * 64 + 9 + 61, ($c->{identical} && join(",", @{$c->{ids}}) eq join(",", @{$l->{ids}})) ? "true" : "false", $split;
        ' "$TMP/local.json" "$TMP/cl.json" "$TMP/cl.err" "$name" "$s"
    done
done
