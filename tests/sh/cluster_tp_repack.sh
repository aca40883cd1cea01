#!/bin/sh
# tests/sh/cluster_tp_repack.sh: a tensor-parallel member repacks its column
# slices (wo by its heads, ffn_down by its FFN rows: cm_model_repack_slice)
# into the decode gemv's layout, and that changes no bit. Synthetic llama
# models wide enough for the repacked layouts (Q4_0: 16-block groups; Q5_K:
# 4-super-block groups), a group of the coordinator and one node: the
# coordinator's and the node's debug logs must show copies of their slices
# only (no whole-tensor copies kept), and the greedy ids of the
# prompt and decode must equal those of a group where neither member repacks
# (CUMULO_REPACK=0 on both), token for token, one stream and three at once.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
L=2


# slice_check LOG: the member's lines of its slice copies (cm_model_repack_slice):
# each must cover every layer's slice only, no whole copies kept, and cost at
# most the larger of its shares of KV heads and FFN rows (+ 2%) of what the
# whole layers' copies would. Prints "N BAD": lines, and lines that fail.
slice_check() {
    perl -ne 'next unless /slice copies of KV heads \[(\d+), (\d+)\) of (\d+) and FFN rows \[(\d+), (\d+)\) of (\d+): (\d+) bytes of the layers. (\d+) .*whole copies kept: (\d+) bytes/;
              $n++; my $share = ($2 - $1) / $3 > ($5 - $4) / $6 ? ($2 - $1) / $3 : ($5 - $4) / $6;
              $bad++ unless $7 > 0 && $9 == 0 && $7 <= ($share + 0.02) * $8;
              END { print $n + 0, " ", $bad + 0 }' "$1"
}

case_type() { # TYPE DIM FFN
    t=$1
    "$BIN" synth --arch llama --dim "$2" --layers $L --heads 8 --kv-heads 4 --ffn "$3" --type "$t" --vocab "$VOCAB" \
        --seed 7 -o "$TMP/tp-$t.gguf" >/dev/null 2>&1 || {
        bad "$t: synth failed"
        return
    }
    for s in 1 3; do
        for v in on off; do
            env_v=""
            [ $v = off ] && env_v="CUMULO_REPACK=0"
            port=$(cat "$TMP/$v.port")
            # shellcheck disable=SC2086
            env $env_v CUMULO_LOG=debug "$BIN" run "$TMP/tp-$t.gguf" -p "Once upon a time there was" -n 20 --temp 0 \
                --ignore-eos --json --streams "$s" --nodes "127.0.0.1:$port" --parallel tp --threads 1 --tp-weights 1,1 \
                >"$TMP/$t.$s.$v.json" 2>"$TMP/$t.$s.$v.err" || bad "$t streams $s repack $v: run failed: $(tail -2 "$TMP/$t.$s.$v.err")"
        done
        # one stream: its tokens; several: the first one's ids, and "identical" (every stream's equal)
        ids='join ",", @{ ref $j->{tokens} ? $j->{tokens} : $j->{ids} }'
        a=$(cc_jsonget "$TMP/$t.$s.on.json" "$ids")
        b=$(cc_jsonget "$TMP/$t.$s.off.json" "$ids")
        [ $s = 1 ] || [ "$(cc_jsonget "$TMP/$t.$s.on.json" '$j->{identical} ? 1 : 0')" = 1 ] && ok ||
            bad "$t streams $s: the streams' ids differ with repacked slices"
        n=$(echo "$a" | tr ',' '\n' | grep -c .)
        [ -n "$a" ] && [ "$a" = "$b" ] && [ "$n" -ge 20 ] && ok || bad "$t streams $s: ids with repacked slices '$a' vs without '$b'"
    done
    # the coordinator keeps copies of its slice only: no whole-tensor copies beside them
    set -- $(slice_check "$TMP/$t.1.on.err")
    [ "$1" -ge 1 ] && [ "$2" = 0 ] && ok ||
        bad "$t: coordinator slice copies: $1 lines, $2 wrong: $(grep -E 'slice copies|FFN rows' "$TMP/$t.1.on.err" | head -3)"
    echo "$t: coordinator: $(grep -o 'slice copies of KV.*' "$TMP/$t.1.on.err" | head -1)"
    # loaded for a slice (cm_model_open_for_slice): read in, no whole copies made at load
    grep -q "tensor parallel: '.*' read into memory, its slice copied from it" "$TMP/$t.1.on.err" && ok ||
        bad "$t: the coordinator did not load for its slice: $(grep "tensor parallel: '" "$TMP/$t.1.on.err")"
    c=$(grep -c 'repack:' "$TMP/$t.1.off.err")
    [ "$c" = 0 ] && ok || bad "$t: CUMULO_REPACK=0 still repacked ($c lines)"
}

export CUMULO_LOG=debug # the nodes' logs show their slice copies
cc_start_node on --no-mdns --models "$TMP"
export CUMULO_REPACK=0
cc_start_node off --no-mdns --models "$TMP"
unset CUMULO_LOG CUMULO_REPACK
[ -s "$TMP/on.port" ] && [ -s "$TMP/off.port" ] && ok || {
    bad "nodes did not start: $(cat "$TMP"/*.log | tail -5)"
    echo "$pass passed, $fail failed"
    exit 1
}
# FFN widths such that either member's ffn_down slice is wide enough to repack
# whatever split the planner makes of --tp-weights 1,1 (its quantum and the
# head/embedding it counts make it uneven): Q4_0 needs 512 columns, Q5_K 1024 (Q5_K: repacked on
# the avx512 and avx2 tables alike; Q4_K only on avx2)
case_type q4_0 512 3072
case_type q5_k 1024 4096
grep -q "tensor parallel: '.*' read into memory, its slice copied from it" "$TMP/on.log" && ok ||
    bad "the node did not load for its slice: $(grep "tensor parallel: '" "$TMP/on.log" | head -2)"
# the node holding the repacking member made its slice copies too (one line per assignment)
set -- $(slice_check "$TMP/on.log")
[ "$1" -ge 2 ] && [ "$2" = 0 ] && ok || bad "node slice copies: $1 lines, $2 wrong: $(grep 'slice copies' "$TMP/on.log" | head -3)"
c=$(grep -c 'repack:' "$TMP/off.log")
[ "$c" = 0 ] && ok || bad "the CUMULO_REPACK=0 node repacked ($c lines)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
