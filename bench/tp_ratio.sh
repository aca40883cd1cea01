#!/bin/sh
# bench/tp_ratio.sh: a benchmark, not a test (issue 14, item 4). Tensor
# parallel on loopback, 2 processes x 1 thread (this machine as rank 0 and one
# `cumulo node --threads 1`, `run --parallel tp`) against 1 process x 2
# threads: the same model, the same ~150-token prompt, GEN greedy tokens,
# interleaved A B B A (odd reps run the one process first, even reps the TP
# runs first). Prints each rep's prompt and decode tokens/s of both,
# their ratios (TP / one process), the ratios of the best runs, the load
# average, and one JSON line at the end. Nothing is asserted. "ids differ" is
# expected on a random-weight model: a member's partial sums round in other
# last bits than one machine's whole dot products, and such a model has near
# ties (the 1B Q4_0 synth, this prompt: token 14's top two are 0.008 apart in
# logprob); the cluster tests hold ids equal on models above the tie margin.
#   sh bench/tp_ratio.sh MODEL.gguf     (e.g. the 1B Q4_0 of bench/run_table.sh)
# Environment:
#   REPS=3 GEN=64          reps (pairs) and generated tokens
#   TP_WEIGHTS=1,1         --tp-weights of the TP runs (even slices, so runs compare;
#                          empty: the planner's split from measured speeds)
#   VARIANTS="spin0 insecure mmap head0 enc tcp"   extra TP runs in every rep: spinN =
#                          CUMULO_TP_SPIN_US=N on both (spin0: waits sleep at once; the
#                          default spins 500 us on loopback), insecure =
#                          --insecure links (no MAC, no encryption), mmap = CUMULO_MMAP=1 on
#                          both members (weights mapped, not repacked), each with a node of its
#                          own; head0 = CUMULO_TP_HEAD_SPLIT=0 (rank 0 computes the whole head);
#                          enc = CUMULO_TP_ENCRYPT_LOOPBACK=1 on both (all-reduce pieces
#                          encrypted on loopback as before session 16, not auth-only);
#                          tcp = CUMULO_TP_SHM=0 on both (pieces over the loopback link,
#                          not through shared memory as since session 19)
#   TRACE=1                CUMULO_TP_TRACE=1 on both members: the last rep's lines
#                          saying where each member's time went, and the cipher's
#                          share of rank 0's decode token and prompt (wall-clock
#                          timing of each seal and open: a loaded machine inflates it)
cd "$(dirname "$0")/.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
MODEL=$1
[ -n "$MODEL" ] && [ -f "$MODEL" ] || {
    echo "usage: sh bench/tp_ratio.sh MODEL.gguf" >&2
    exit 2
}
REPS=${REPS:-3}
GEN=${GEN:-64}
TP_WEIGHTS=${TP_WEIGHTS-1,1}
TMP=$(mktemp -d)
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
export CUMULO_KEY_FILE="$TMP/key"
"$BIN" key >/dev/null 2>&1
[ -n "$TRACE" ] && export CUMULO_TP_TRACE=1
# ~150 tokens of plain English (the count used is printed: prompt_n)
i=0
while [ $i -lt 7 ]; do
    printf 'The quick brown fox jumps over the lazy dog while the old cat sleeps in the warm afternoon sun. ' >>"$TMP/prompt.txt"
    i=$((i + 1))
done

# start_node NAME [env assignments...] -- [node options...]: a node on 127.0.0.1
# with the model's folder (the whole file, as a member holding it would).
start_node() {
    name=$1
    shift
    envs=""
    while [ "$1" != "--" ]; do
        envs="$envs $1"
        shift
    done
    shift
    env $envs "$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/$name.port" --no-mdns --threads 1 \
        --models "$(dirname "$MODEL")" --cache "$TMP/cache-$name" "$@" >"$TMP/$name.log" 2>&1 &
    PIDS="$PIDS $!"
    n=0
    while [ ! -s "$TMP/$name.port" ] && [ $n -lt 200 ]; do
        sleep 0.05
        n=$((n + 1))
    done
    [ -s "$TMP/$name.port" ] || {
        echo "node $name did not start: $(tail -3 "$TMP/$name.log")" >&2
        exit 1
    }
}

start_node base --
for v in $VARIANTS; do
    case $v in
    spin[0-9]*) start_node "$v" "CUMULO_TP_SPIN_US=${v#spin}" -- ;;
    insecure) start_node insecure -- --insecure ;;
    mmap) start_node mmap CUMULO_MMAP=1 -- ;;
    enc) start_node enc CUMULO_TP_ENCRYPT_LOOPBACK=1 -- ;;
    tcp) start_node tcp CUMULO_TP_SHM=0 -- ;;
    head0) ;;
    *)
        echo "unknown variant '$v' (spinN, insecure, mmap, head0, enc, tcp)" >&2
        exit 2
        ;;
    esac
done

# one_run OUT [env assignments...] -- [run options...]
one_run() {
    out=$1
    shift
    envs=""
    while [ "$1" != "--" ]; do
        envs="$envs $1"
        shift
    done
    shift
    env $envs "$BIN" run "$MODEL" -f "$TMP/prompt.txt" -n "$GEN" --temp 0 --ignore-eos --json "$@" \
        >"$TMP/$out.json" 2>"$TMP/$out.err" || echo "run $out failed: $(tail -2 "$TMP/$out.err")" >&2
}

tp_args() { # NAME: the run options of a TP run against node NAME
    echo "--nodes 127.0.0.1:$(cat "$TMP/$1.port") --parallel tp --threads 1${TP_WEIGHTS:+ --tp-weights $TP_WEIGHTS}"
}

echo "tensor parallel on loopback: $(basename "$MODEL"), $REPS reps, $GEN tokens, --tp-weights ${TP_WEIGHTS:-(planner)}, $(grep -c ^processor /proc/cpuinfo 2>/dev/null) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
rep=1
tp_runs() { # REP: the TP runs of one rep
    one_run "tp.base.$1" -- $(tp_args base)
    for v in $VARIANTS; do
        case $v in
        spin[0-9]*) one_run "tp.$v.$1" "CUMULO_TP_SPIN_US=${v#spin}" -- $(tp_args "$v") ;;
        insecure) one_run "tp.$v.$1" -- $(tp_args insecure) --insecure ;;
        mmap) one_run "tp.$v.$1" CUMULO_MMAP=1 -- $(tp_args mmap) ;;
        enc) one_run "tp.$v.$1" CUMULO_TP_ENCRYPT_LOOPBACK=1 -- $(tp_args enc) ;;
        tcp) one_run "tp.$v.$1" CUMULO_TP_SHM=0 -- $(tp_args tcp) ;;
        head0) one_run "tp.$v.$1" CUMULO_TP_HEAD_SPLIT=0 -- $(tp_args base) ;;
        esac
    done
}
# A B, then B A: a load that drifts during a rep favours neither side
while [ "$rep" -le "$REPS" ]; do
    if [ $((rep % 2)) -eq 1 ]; then
        one_run "one.$rep" -- --threads 2
        tp_runs "$rep"
    else
        tp_runs "$rep"
        one_run "one.$rep" -- --threads 2
    fi
    rep=$((rep + 1))
done
sleep 0.5 # the nodes print their trace lines when the coordinator leaves

perl -MJSON::PP -e '
    my ($dir, $reps, $variants, $load) = @ARGV;
    sub rd { my $f = "$dir/$_[0].json"; open my $h, "<", $f or return undef; local $/; my $j = eval { decode_json(<$h>) }; return $j }
    my @kinds = ("base", split(" ", $variants));
    my (%best, @lines);
    for my $r (1 .. $reps) {
        my $o = rd("one.$r") or next;
        my $ot = $o->{timings};
        $best{one}{p} = $ot->{prompt_tps} if $ot->{prompt_tps} > ($best{one}{p} // 0);
        $best{one}{g} = $ot->{gen_tps} if $ot->{gen_tps} > ($best{one}{g} // 0);
        my $line = sprintf "rep %d: 1 process x 2 threads: prompt %.1f decode %.1f tok/s (prompt_n %d)", $r, $ot->{prompt_tps}, $ot->{gen_tps}, $ot->{prompt_n};
        for my $k (@kinds) {
            my $t = rd("tp.$k.$r") or next;
            my $tt = $t->{timings};
            $best{$k}{p} = $tt->{prompt_tps} if $tt->{prompt_tps} > ($best{$k}{p} // 0);
            $best{$k}{g} = $tt->{gen_tps} if $tt->{gen_tps} > ($best{$k}{g} // 0);
            my $same = join(",", @{$t->{tokens}}) eq join(",", @{$o->{tokens}}) ? "same ids" : "ids differ";
            $line .= sprintf "; tp %s: prompt %.1f decode %.1f (ratios %.3f / %.3f, %s)", $k, $tt->{prompt_tps}, $tt->{gen_tps},
                $tt->{prompt_tps} / ($ot->{prompt_tps} || 1), $tt->{gen_tps} / ($ot->{gen_tps} || 1), $same;
        }
        print "$line\n";
    }
    my %js = (bench => "tp_ratio", reps => $reps + 0, load_average => $load,
              one => {prompt_tps => $best{one}{p}, decode_tps => $best{one}{g}});
    for my $k (@kinds) {
        next unless $best{$k};
        my ($pr, $dr) = ($best{$k}{p} / ($best{one}{p} || 1), $best{$k}{g} / ($best{one}{g} || 1));
        printf "best of %d, tp %s / 1 process x 2 threads: decode ratio %.3f (%.1f / %.1f tok/s), prompt ratio %.3f (%.1f / %.1f tok/s)\n",
            $reps, $k, $dr, $best{$k}{g}, $best{one}{g}, $pr, $best{$k}{p}, $best{one}{p};
        $js{"tp_$k"} = {prompt_tps => $best{$k}{p}, decode_tps => $best{$k}{g}, prompt_ratio => 0 + sprintf("%.3f", $pr),
                        decode_ratio => 0 + sprintf("%.3f", $dr)};
    }
    print JSON::PP->new->canonical->encode(\%js), "\n";
' "$TMP" "$REPS" "$VARIANTS" "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
if [ -n "$TRACE" ]; then
    last=$((REPS))
    for k in base $VARIANTS; do
        echo "trace, tp $k, last rep: rank 0 (this process):"
        grep 'tp trace' "$TMP/tp.$k.$last.err" | sed 's/^/  /'
        # the cipher's share of rank 0's time: its CPU time sealing and opening
        # all-reduce pieces against the run's decode and prompt wall time
        perl -MJSON::PP -e '
            my ($jf, $tf) = @ARGV;
            open my $h, "<", $jf or exit; local $/; my $j = eval { decode_json(<$h>) } or exit; close $h;
            open my $t, "<", $tf or exit; my $tr = <$t>;
            my ($small) = $tr =~ /decode-sized all-reduces (\d+):/ or exit;
            my ($s1, $o1) = $tr =~ /decode-sized all-reduces \d+: [\d.]+ us each \(receiving [\d.]+; cipher ([\d.]+) \+ ([\d.]+)/ or exit;
            my ($big, $s2, $o2) = $tr =~ /larger (\d+): [\d.]+ us each \(receiving [\d.]+; cipher ([\d.]+) \+ ([\d.]+)/ or exit;
            my ($s3, $o3) = $tr =~ /gathers \d+: [\d.]+ us each \(receiving [\d.]+; cipher ([\d.]+) \+ ([\d.]+)/ or exit;
            my $tm = $j->{timings}; my $gen = ($tm->{gen_n} // 0) - 1; $gen = $small / 32 if $gen < 1;
            my $tok_us = 1e6 / ($tm->{gen_tps} || 1), $prompt_us = 1e6 * ($tm->{prompt_n} // 0) / ($tm->{prompt_tps} || 1);
            my $dec = ($s1 + $o1) * $small / $gen + $s3 + $o3;
            printf "  cipher on rank 0: %.0f us per decoded token (%.1f%% of one at %.1f tok/s), %.1f ms per prompt (%.1f%% of it)\n",
                $dec, 100 * $dec / $tok_us, $tm->{gen_tps}, ($s2 + $o2) * $big / 1000, 100 * ($s2 + $o2) * $big / ($prompt_us || 1);
        ' "$TMP/tp.$k.$last.json" "$TMP/tp.$k.$last.err"
        node=$k
        [ "$k" = head0 ] && node=base
        echo "  its node ($node, every rep):"
        grep 'tp trace' "$TMP/$node.log" | sed 's/^/  /'
    done
fi
