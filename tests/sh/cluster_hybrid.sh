#!/bin/sh
# tests/sh/cluster_hybrid.sh: hybrid plans (issue 5) on 127.0.0.1 — tensor-
# parallel groups as pipeline stages, run by `cumulo node` processes: the
# coordinator is rank 0 of the first group, a later group's rank 0 relays the
# hidden states to its members and the last group's rank 0 samples. Checks:
#   - 2 groups x 2 stages (4 processes): greedy ids identical to one machine
#     on stories260K F32 (and one machine equal to llama.cpp's reference) and
#     on a synth llama F32 model (equal to llama.cpp's greedy ids recorded in
#     tests/data/synth); next-token probabilities (chosen + top 5 at every
#     step) within 1e-4 of one machine, and on the synth model within 1e-4 of
#     llama.cpp's;
#   - tensor parallel with 3 uneven members and with 4 members: the same
#     probabilities check (ids are checked in cluster_tp.sh);
#   - bytes and exchanges per token: every member of group g sends exactly
#     rows x 2 x layers_g x dim x 4 x (k_g - 1) all-reduce element bytes in
#     2 x layers_g exchanges per evaluation; the hop to stage 1 carries
#     rows x (4 dim + 9) + 61 per frame; --tp-compress sends 34 bytes per 32
#     elements instead (lossy: only the first token's probability is held,
#     within 1e-2);
#   - other group shapes (1,3  3,1  2,1,1), --parallel hybrid (the planner's
#     split), concurrent streams, and `serve --groups 2,2` answering four
#     concurrent completions with one machine's text;
#   - failure: during 4 streams of `serve --groups 2,2`, kill -9 of the last
#     group's rank 0 (the survivor takes the later layers), then of this
#     machine's group member (the coordinator's slice and caches change):
#     each time the coordinator re-plans and every stream equals one machine's.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl
M=$SHARED/models
R=$SHARED/reference
ids() { cc_jsonget "$1" 'join(",", @{$j->{tokens}})'; }

# Largest |p - q| over the chosen token and the top tokens of every step of two
# `run --json --logprobs N` outputs (probabilities, not logs); "x" when the
# steps or the top ids differ.
probdiff() {
    perl -MJSON::PP -e '
        local $/;
        open my $f, "<", $ARGV[0] or exit 2; my $a = decode_json(<$f>)->{logprobs};
        open my $g, "<", $ARGV[1] or exit 2; my $b = decode_json(<$g>)->{logprobs};
        if (!$a || !$b || @$a != @$b || !@$a) { print "x"; exit }
        my $m = 0;
        for my $i (0 .. $#$a) {
            my ($s, $t) = ($a->[$i], $b->[$i]);
            if ($s->{id} != $t->{id} || @{$s->{top}} != @{$t->{top}} || !@{$s->{top}}) { print "x"; exit }
            my $d = abs(exp($s->{logprob}) - exp($t->{logprob}));
            $m = $d if $d > $m;
            for my $k (0 .. $#{$s->{top}}) {
                if ($s->{top}[$k][0] != $t->{top}[$k][0]) { print "x"; exit }
                $d = abs(exp($s->{top}[$k][1]) - exp($t->{top}[$k][1]));
                $m = $d if $d > $m;
            }
        }
        printf "%.3g", $m' "$1" "$2"
}
# probdiff against llama.cpp's recorded distributions (synth reference case 0:
# probs_decode[i] follows the greedy path): the top 5 of each of the first
# min(8, steps) steps.
probdiff_ref() {
    perl -MJSON::PP -e '
        local $/;
        open my $f, "<", $ARGV[0] or exit 2; my $a = decode_json(<$f>)->{logprobs};
        open my $g, "<", $ARGV[1] or exit 2; my $r = decode_json(<$g>)->{cases}[0]{probs_decode};
        my $m = 0;
        for my $i (0 .. 7) {
            my $s = $a->[$i] or last;
            my %p; @p{@{$r->[$i]{ids}}} = @{$r->[$i]{p}};
            for my $t (@{$s->{top}}) {
                if (!exists $p{$t->[0]}) { print "x"; exit }
                my $d = abs(exp($t->[1]) - $p{$t->[0]});
                $m = $d if $d > $m;
            }
        }
        printf "%.3g", $m' "$1" "$2"
}
le() { perl -e 'exit(($ARGV[0] ne "x" && $ARGV[0] <= $ARGV[1]) ? 0 : 1)' "$1" "$2"; }

# start_node NAME [node options...]: a node on a free port (cluster_common.sh);
# sets PORT_<NAME> and PID_<NAME>.
start_node() {
    name=$1
    shift
    cc_start_node "$name" --no-mdns "$@"
    eval "PORT_$name=$NODE_PORT; PID_$name=$NODE_PID"
}

# The synth model (2 layers, dim 256, 2 KV heads) next to the shared ones, so
# that the nodes find it in --models.
mkdir -p "$TMP/models"
ln -s "$M/stories260K-f32.gguf" "$TMP/models/stories260K-f32.gguf"
ln -s "$M/stories260K-q8_0.gguf" "$TMP/models/stories260K-q8_0.gguf"
SREF=tests/data/synth/llama-f32.json
if ! "$BIN" synth --arch llama --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --ctx 512 --type f32 --seed 1001 \
    --vocab "$SHARED/vocab/ggml-vocab-llama-spm.gguf" -o "$TMP/models/synth.gguf" --threads 1 >/dev/null 2>"$TMP/synth.err"; then
    bad "synth failed: $(tail -2 "$TMP/synth.err")"
fi

for n in a b c; do CUMULO_LOG=info start_node $n --models "$TMP/models"; done
ADDR_a=127.0.0.1:$PORT_a
ADDR_b=127.0.0.1:$PORT_b
ADDR_c=127.0.0.1:$PORT_c
ALL=$ADDR_a,$ADDR_b,$ADDR_c
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && [ -n "$PORT_c" ] && ok || { bad "nodes did not start"; cat "$TMP"/*.log; exit 1; }

# A node logs each assignment ("... (epoch E), rank R of K" at info level) and,
# when the assignment ends (the coordinator leaves, a re-plan replaces it), a
# member of a group (K > 1) prints its traffic: "tensor-parallel rank R of K
# (epoch E), stage S ...". That line comes after the run has exited, later on
# a loaded machine. (A fixed 0.5 s wait, and counting every line with
# "tensor-parallel rank" in it, which the "rank N connected from" lines of
# the run itself satisfy at once, could read the previous run's line.)
# tp_pending NAME: how many of the node's group assignments lack that line.
tp_pending() {
    perl -ne '$a{$1} = 1 if /\(epoch (\d+)\), rank \d+ of (\d+)/ && $2 > 1;
        $d{$1} = 1 if /^(?:tensor|expert)-parallel rank \d+ of \d+ \(epoch (\d+)\), stage/;
        END { print scalar(grep { !$d{$_} } keys %a) }' "$TMP/$1.log"
}
# tp_wait NAME: until every group assignment of the node has its line (up to 10 s).
tp_wait() {
    i=0
    while [ "$(tp_pending "$1")" != 0 ]; do
        i=$((i + 1))
        if [ $i -ge 200 ]; then
            echo "FAIL: node $1: $(tp_pending "$1") group assignment(s) without a traffic line 10 s after the run" >&2
            return 1
        fi
        sleep 0.05
    done
}

# node_tp NAME: "rows ops data_bytes k stage layers" of the node's latest
# group assignment (empty, so the caller's check fails, when it has none or
# its line never came).
node_tp() {
    tp_wait "$1" || return 0
    e=$(perl -ne 'print "$1\n" if /\(epoch (\d+)\), rank \d+ of (\d+)/ && $2 > 1' "$TMP/$1.log" | tail -1)
    [ -n "$e" ] || return 0
    grep "^tensor-parallel rank [0-9]* of [0-9]* (epoch $e), stage" "$TMP/$1.log" | tail -1 |
        sed 's/.*rank [0-9]* of \([0-9]*\) .*stage \([0-9]*\) layers \[\([0-9]*\), \([0-9]*\)): \([0-9]*\) rows, \([0-9]*\) all-reduces, \([0-9]*\) element bytes.*/\5 \6 \7 \1 \2 \4-\3/' | sed 's/ \([0-9]*\)-\([0-9]*\)$/ \1 \2/' |
        perl -ane 'print "$F[0] $F[1] $F[2] $F[3] $F[4] ", $F[5] - $F[6], "\n"'
}

# resync: after a run whose members we do not check, wait until the nodes
# have ended its assignments (their traffic lines are out), so that the next
# run's assignment is each node's latest.
resync() {
    for nd in a b c; do tp_wait $nd || fail=$((fail + 1)); done
}

run_one() { # OUT MODEL PROMPT N ARGS... (ro_*: shell functions share variables)
    ro_out=$1 ro_model=$2 ro_prompt=$3 ro_n=$4
    shift 4
    "$BIN" run "$ro_model" -p "$ro_prompt" -n "$ro_n" --temp 0 --threads 1 --json --logprobs 5 "$@" >"$ro_out.json" 2>"$ro_out.err"
}

# 1. Hybrid 2 x 2 on stories260K F32 and the synth model.
for model in stories260K-f32 synth; do
    MP=$TMP/models/$model.gguf
    "$BIN" info "$MP" --json >"$TMP/info.json" 2>/dev/null
    L=$(cc_jsonget "$TMP/info.json" '$j->{n_layer}')
    D=$(cc_jsonget "$TMP/info.json" '$j->{n_embd}')
    if [ $model = synth ]; then
        prompt="" n=32
    else
        prompt=$(cc_jsonget "$R/stories260K-f32.greedy.json" '$j->{cases}[1]{prompt}') n=40
    fi
    run_one "$TMP/one" "$MP" "$prompt" $n || bad "$model: single machine failed: $(tail -2 "$TMP/one.err")"
    one=$(ids "$TMP/one.json")
    if [ $model = synth ]; then
        want=$(cc_jsonget "$SREF" 'join(",", @{$j->{cases}[0]{greedy}})')
        d=$(probdiff_ref "$TMP/one.json" "$SREF")
    else
        want=$(cc_jsonget "$R/stories260K-f32.greedy.json" 'join(",", @{$j->{cases}[1]{generated_tokens}}[0..'$((n - 1))'])')
        d=0
    fi
    [ -n "$one" ] && [ "$one" = "$want" ] && ok || bad "$model: single machine differs from llama.cpp: $one vs $want"
    for args in "--groups 2,2" "--groups 2,2 --tp-compress"; do
        if ! run_one "$TMP/hy" "$MP" "$prompt" $n --nodes "$ALL" $args; then
            bad "$model $args: run failed: $(tail -3 "$TMP/hy.err")"
            continue
        fi
        line=$(grep '^hybrid: 2 stages of 2 members' "$TMP/hy.err")
        [ -n "$line" ] && ok || bad "$model $args: not 2 groups x 2 stages: $(grep -E 'why|hybrid' "$TMP/hy.err")"
        case $args in
        *compress*) # lossy: ids may part from one machine's; the first step's probability stays close
            same=$(perl -e '@a = split /,/, $ARGV[0]; @b = split /,/, $ARGV[1]; $n = 0; $n++ while $n < @a && $a[$n] == $b[$n]; print $n' "$one" "$(ids "$TMP/hy.json")")
            d0=$(perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or exit 2; my $a = decode_json(<$f>)->{logprobs}[0];
                open my $g, "<", $ARGV[1] or exit 2; my $b = decode_json(<$g>)->{logprobs}[0];
                if (!$a || !$b || $a->{id} != $b->{id}) { print "x"; exit } printf "%.3g", abs(exp($a->{logprob}) - exp($b->{logprob}))' \
                "$TMP/one.json" "$TMP/hy.json")
            le "$d0" 1e-2 && ok || bad "$model $args: first token's probability off by $d0"
            echo "$model $args: first $same of $n ids equal one machine's; first token's probability off by $d0" ;;
        *) [ "$(ids "$TMP/hy.json")" = "$one" ] && ok || bad "$model $args: ids differ from one machine" ;;
        esac
        # Layers of each group, from "(layers [0, 3)), 2 members (layers [3, 5))".
        set -- $(echo "$line" | sed 's/[^[]*\[\([0-9]*\), \([0-9]*\))[^[]*\[\([0-9]*\), \([0-9]*\)).*/\1 \2 \3 \4/')
        L0=$(($2 - $1)) L1=$(($4 - $3))
        [ $((L0 + L1)) -eq "$L" ] && ok || bad "$model: group layers $L0 + $L1 != $L"
        rows=$(cc_jsonget "$TMP/hy.json" '$j->{tp}{rows}')
        ops=$(cc_jsonget "$TMP/hy.json" '$j->{tp}{ops}')
        data=$(cc_jsonget "$TMP/hy.json" '$j->{tp}{data_bytes}')
        wire=$(cc_jsonget "$TMP/hy.json" '$j->{tp}{wire_bytes}')
        evals=$((n + 1)) # the prompt but its last token, then one per sampled token but the last
        [ -z "$prompt" ] && evals=$n # BOS only: nothing before the first sample
        case $args in *compress*) per0=$((2 * L0 * ((D + 31) / 32) * 34)) per1=$((2 * L1 * ((D + 31) / 32) * 34)) ;;
                      *) per0=$((2 * L0 * D * 4)) per1=$((2 * L1 * D * 4)) ;; esac
        [ "$data" = $((rows * per0)) ] && [ "$ops" = $((evals * 2 * L0)) ] && ok ||
            bad "$model $args: group 0 rank 0 sent $data element bytes in $ops exchanges for $rows rows / $evals evaluations, expected rows x $per0 in $evals x $((2 * L0))"
        # Each node: its group (stage), size and layers from its own line.
        stages=""
        for nd in a b c; do
            set -- $(node_tp $nd)
            stages="$stages$5"
            if [ "$5" = 0 ]; then pl=$L0 per=$per0; else pl=$L1 per=$per1; fi
            [ "$1" = "$rows" ] && [ "$4" = 2 ] && [ "$6" = "$pl" ] && [ "$2" = $((evals * 2 * pl)) ] &&
                [ "$3" = $((rows * per)) ] && ok ||
                bad "$model $args: node $nd (stage ${5:-?} of ${6:-?} layers, k ${4:-?}) sent ${3:-?} bytes in ${2:-?} exchanges for ${1:-?} rows, expected rows x $per in $evals x $((2 * pl))"
        done
        [ "$(echo "$stages" | grep -o 0 | wc -l)" = 1 ] && [ "$(echo "$stages" | grep -o 1 | wc -l)" = 2 ] && ok ||
            bad "$model $args: node stages '$stages', expected one in stage 0 and two in stage 1"
        hb=$(cc_jsonget "$TMP/hy.json" '$j->{hop}{bytes}')
        hf=$(cc_jsonget "$TMP/hy.json" '$j->{hop}{frames}')
        hr=$(cc_jsonget "$TMP/hy.json" '$j->{hop}{rows}')
        [ "$hr" = "$rows" ] && [ "$hb" = $((hr * (4 * D + 9) + hf * 61)) ] && ok ||
            bad "$model $args: hop $hb bytes in $hf frames for $hr rows"
        echo "$model $args: groups of layers $L0 + $L1, dim $D: all-reduce per token per member $((data / rows)) element bytes (formula 2 x $L0 x $D x $( case $args in *compress*) echo '34/32' ;; *) echo 4 ;; esac) = $per0) + $((per1)) in group 1, $((wire / rows)) on the wire; $((ops / evals)) + $((2 * L1)) exchanges per token; hop $((hb / hr)) bytes per token"
        case $args in *compress*) continue ;; esac
        d2=$(probdiff "$TMP/one.json" "$TMP/hy.json")
        le "$d2" 1e-4 && ok || bad "$model hybrid: probabilities differ from one machine by $d2"
        if [ $model = synth ]; then
            d3=$(probdiff_ref "$TMP/hy.json" "$SREF")
            le "$d3" 1e-4 && ok || bad "synth hybrid: probabilities differ from llama.cpp by $d3"
            echo "synth: largest probability difference, one machine vs llama.cpp $d, hybrid vs one machine $d2, hybrid vs llama.cpp $d3"
        else
            echo "$model: largest probability difference, hybrid vs one machine $d2"
        fi
    done
    # Tensor parallel, 3 uneven members and 4 members: probabilities.
    for tpa in "--nodes $ADDR_a,$ADDR_b --tp-weights 1,2,1" "--nodes $ALL"; do
        if run_one "$TMP/tp" "$MP" "$prompt" $n --parallel tp $tpa; then
            d2=$(probdiff "$TMP/one.json" "$TMP/tp.json")
            [ "$(ids "$TMP/tp.json")" = "$one" ] && le "$d2" 1e-4 && ok ||
                bad "$model tp $tpa: ids or probabilities differ from one machine ($d2)"
            echo "$model tp $tpa: largest probability difference vs one machine $d2"
        else
            bad "$model tp $tpa: run failed: $(tail -3 "$TMP/tp.err")"
        fi
        resync
    done
done

# 2. Other shapes: ids equal one machine's (stories260K q8_0).
MQ=$TMP/models/stories260K-q8_0.gguf
run_one "$TMP/oneq" "$MQ" "Once upon a time" 32
oneq=$(ids "$TMP/oneq.json")
for args in "--groups 1,3" "--groups 3,1" "--groups 2,1,1" "--groups 1,1,2" "--parallel hybrid" "--groups 2,2 --layers 1,4"; do
    if run_one "$TMP/sh" "$MQ" "Once upon a time" 32 --nodes "$ALL" $args; then
        [ "$(ids "$TMP/sh.json")" = "$oneq" ] && ok || bad "$args: ids differ from one machine"
        echo "$args: $(grep '^hybrid:' "$TMP/sh.err" | sed 's/; this machine.*//')"
    else
        bad "$args: run failed: $(tail -3 "$TMP/sh.err")"
    fi
    resync
done

# 3. Three concurrent streams over 2 x 2 equal the lone run.
if "$BIN" run "$MQ" --nodes "$ALL" --groups 2,2 -p "Once upon a time" -n 32 --temp 0 --threads 1 --streams 3 --json \
    >"$TMP/st.json" 2>"$TMP/st.err"; then
    [ "$(cc_jsonget "$TMP/st.json" '$j->{identical} ? 1 : 0')" = 1 ] && ok || bad "3 streams gave different outputs"
    [ "$(cc_jsonget "$TMP/st.json" 'join(",", @{$j->{ids}})')" = "$oneq" ] && ok || bad "3 streams differ from the lone run"
else
    bad "3 streams failed: $(tail -3 "$TMP/st.err")"
fi
resync

# 4. serve --groups 2,2: 4 concurrent completions (cm_engine_step) equal one
# machine's text.
if cc_start_serve serve "$MQ" --host 127.0.0.1 --nodes "$ALL" --groups 2,2 --threads 1 --slots 4 &&
    grep -q '^hybrid: 2 stages of 2 members' "$TMP/serve.log"; then
    ok
    cc_same_texts 32 "$(cc_jsonget "$TMP/oneq.json" '$j->{text}')"
else
    bad "serve --groups 2,2 did not start as 2 groups x 2 stages: $(tail -3 "$TMP/serve.log")"
fi
cc_stop "$SERVE_PID"
resync

# 4b. Streamed weights: three nodes WITHOUT --models (the coordinator streams
# each only its tensors, the first group's member also token_embd) under
# --groups 2,2 and 1,3: ids equal one machine's, twice, and again after a
# restart that finds every tensor in the node caches.
for n in u v w; do start_node $n; done
SALL=127.0.0.1:$PORT_u,127.0.0.1:$PORT_v,127.0.0.1:$PORT_w
stream_hy() { # LABEL
    for model in "$TMP/models/synth.gguf" "$MQ"; do
        run_one "$TMP/so" "$model" "Once upon a time" 24
        for args in "--groups 2,2" "--groups 1,3"; do
            if run_one "$TMP/ss" "$model" "Once upon a time" 24 --nodes "$SALL" $args; then
                [ "$(ids "$TMP/ss.json")" = "$(ids "$TMP/so.json")" ] && ok ||
                    bad "streamed $(basename "$model") $args, $1: ids $(ids "$TMP/ss.json") vs $(ids "$TMP/so.json")"
            else
                bad "streamed $(basename "$model") $args, $1: run failed: $(tail -3 "$TMP/ss.err")"
            fi
        done
    done
}
if [ -n "$PORT_u" ] && [ -n "$PORT_v" ] && [ -n "$PORT_w" ]; then
    stream_hy "run 1"
    stream_hy "run 2"
    kill $PID_u $PID_v $PID_w 2>/dev/null
    wait $PID_u $PID_v $PID_w 2>/dev/null
    rm -f "$TMP/u.port" "$TMP/v.port" "$TMP/w.port"
    for n in u v w; do start_node $n; done
    SALL=127.0.0.1:$PORT_u,127.0.0.1:$PORT_v,127.0.0.1:$PORT_w
    stream_hy "after a restart on the caches"
    kill $PID_u $PID_v $PID_w 2>/dev/null
    wait $PID_u $PID_v $PID_w 2>/dev/null
else
    bad "streamed nodes did not start"
fi

# 5. A member of the last group dies (kill -9 its rank 0, the sampler) while
# 4 streams run: the coordinator re-plans with the planner (this machine keeps
# its layers; the survivors are grouped by the planner) and every streamed
# text equals one machine's: nothing lost, nothing repeated. Then a second
# node of the new plan dies the same way (a member of this machine's group
# when it has one).
N_TOK=100
"$BIN" run "$MQ" -p "Once upon a time" -n $N_TOK --temp 0 --threads 1 --json 2>/dev/null |
    perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{text}' >"$TMP/want"
CUMULO_TEST_STEP_DELAY_MS=15 "$BIN" serve "$MQ" --host 127.0.0.1 --port 0 --nodes "$ALL" --groups 2,2 --threads 1 \
    --slots 4 >"$TMP/fo.out" 2>"$TMP/fo.log" &
SPID=$!
CC_PIDS="$CC_PIDS $SPID"
k=0
while ! grep -q 'ready' "$TMP/fo.log" && [ $k -lt 200 ]; do sleep 0.05; k=$((k + 1)); done
PORT=$(sed -n 's/.*http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/fo.log" "$TMP/fo.out" | head -1)
# victim PATTERN: a node not killed yet whose latest assignment matches (empty: none).
KILLED=""
victim() {
    for nd in a b c; do
        case " $KILLED " in *" $nd "*) continue ;; esac
        grep 'stage [0-9]/[0-9]' "$TMP/$nd.log" | tail -1 | grep -q "$1" && echo $nd
    done | head -1
}
if grep -q 'ready' "$TMP/fo.log" && [ -n "$PORT" ]; then
    ok
    # Phase 1: the last group's rank 0 (the sampler); phase 2: this machine's
    # group member (the coordinator's own slice and caches change).
    for phase in 1 2; do
        if [ $phase = 1 ]; then VICTIM=$(victim 'stage 1/2.*rank 0 of 2'); else
            # A member of this machine's group. The re-plan of phase 1 is the
            # planner's: when it left this machine alone in its stage (its
            # slice and caches changed then), any node still in the plan.
            VICTIM=$(victim 'stage 0/[0-9].*rank [1-9] of')
            [ -n "$VICTIM" ] || VICTIM=$(victim 'stage [0-9]/[0-9]')
        fi
        KILLED="$KILLED $VICTIM"
        [ -n "$VICTIM" ] && ok || { bad "failover phase $phase: no victim in the node logs"; break; }
        CP=""
        for r in 1 2 3 4; do
            curl -sN --max-time 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
                -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":$N_TOK,\"temperature\":0,\"stream\":true}" >"$TMP/fo$r.sse" &
            CP="$CP $!"
        done
        k=0
        while [ $k -lt 200 ]; do
            n=0
            for r in 1 2 3 4; do [ "$(grep -c '^data:' "$TMP/fo$r.sse" 2>/dev/null)" -ge 5 ] && n=$((n + 1)); done
            [ $n -eq 4 ] && break
            sleep 0.05; k=$((k + 1))
        done
        before=$(grep -c 'recovered' "$TMP/fo.log")
        eval "kill -9 \$PID_$VICTIM"
        for p in $CP; do wait "$p"; done
        for r in 1 2 3 4; do
            perl -MJSON::PP -ne 'next unless s/^data: //; chomp; next if $_ eq "[DONE]"; my $j = decode_json($_);
                print STDERR "error event: $_\n" if $j->{error}; print $j->{choices}[0]{text} // ""' \
                <"$TMP/fo$r.sse" >"$TMP/fo$r.got" 2>"$TMP/fo$r.err"
            cmp -s "$TMP/fo$r.got" "$TMP/want" && [ ! -s "$TMP/fo$r.err" ] && ok ||
                bad "failover phase $phase stream $r: $(wc -c <"$TMP/fo$r.got") bytes vs $(wc -c <"$TMP/want"); $(head -c 200 "$TMP/fo$r.err")"
        done
        [ "$(grep -c 'recovered' "$TMP/fo.log")" -gt "$before" ] && ok ||
            bad "failover phase $phase: no recovery in the log: $(grep -i 'lost\|fail\|re-plan' "$TMP/fo.log" | tail -3)"
        echo "failover phase $phase: killed $VICTIM; $(grep -E 're-plan \(' "$TMP/fo.log" | tail -1)"
    done
else
    bad "serve for the failover did not start: $(tail -3 "$TMP/fo.log")"
fi
kill "$SPID" 2>/dev/null
wait "$SPID" 2>/dev/null

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
