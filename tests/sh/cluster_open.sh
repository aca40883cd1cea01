#!/bin/sh
# cluster_open.sh: a node lost while `cumulo run --nodes ...` OPENS the
# cluster (its ASSIGN sent, its part loading, before "cluster ready") is left
# out: the coordinator re-plans on the survivors through recovery's path
# (coord_recover.c cm_coord_open_recover) and the run goes on, saying which
# node was left out and why; when the rest cannot hold the model the run
# fails with an error that says what to do. Nodes on 127.0.0.1, each on a
# port of its own choosing (--port 0). The loss is made by a test hook, not
# timed: CUMULO_TEST_OPEN_FAIL makes a node exit (as kill -9 would) or stop
# itself (as SIGSTOP would) when its first ASSIGN arrives. Every text is
# greedy and compared with one machine's `cumulo run`.
#   exit:  pipeline of this machine + 3 nodes (--layers 2,1,1,1), the middle
#          node exits at its ASSIGN: the run finishes on the other two.
#   stop:  the same with the node stopped: left out once silent for the
#          loading bound (10 s: 5 x CUMULO_LOST_MS, at least 10 s).
#   serve: `cumulo serve --nodes` (--layers 2,2,1), a node exits: requests'
#          texts (streamed and not) equal one machine's.
#   tp:    --parallel tp over this machine + 2 nodes, one exits: a group of 2.
#   ep:    --parallel ep on a synthetic qwen3moe, one of 2 nodes exits: an
#          expert group of 2, the lost experts placed on the survivors.
#   nofit: the nodes offer little memory (CUMULO_MEM_OFFER): with one lost
#          the survivor cannot hold the rest; the run fails with the reason
#          and what to do, and names the lost node.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
need curl perl
N_TOK=60
cc_want "$M" $N_TOK 1

# start_node TAG [node options...]: a node on 127.0.0.1; sets NODE_PID, NODE_PORT.
start_node() {
    t=$1
    shift
    CUMULO_LOG=info cc_start_node "$t" --bind 127.0.0.1 --no-mdns "$@"
    [ -n "$NODE_PORT" ] || bad "node $t did not start: $(tail -3 "$TMP/$t.log")"
}
# run_open TAG MODEL NODES [run options...]: one greedy `cumulo run` of prompt
# 1 over NODES; text in $TMP/TAG.got, stderr in $TMP/TAG.log, exit code in RC.
run_open() {
    t=$1 m=$2 nodes=$3
    shift 3
    "$BIN" run "$m" -p "$(cc_prompt 1)" -n $N_TOK --temp 0 --threads 1 --nodes "$nodes" --json "$@" \
        >"$TMP/$t.json" 2>"$TMP/$t.log"
    RC=$?
    perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' \
        <"$TMP/$t.json" >"$TMP/$t.got" 2>/dev/null
}
# check_left_out TAG NODE_TAG PORT WHY: the run finished with one machine's
# text, the node at PORT was lost at its ASSIGN (its hook said so) and was
# left out with WHY, before the cluster was ready, and recovery's re-plan ran.
check_left_out() {
    [ "$RC" -eq 0 ] && ok || bad "$1: run failed ($RC): $(tail -3 "$TMP/$1.log")"
    grep -q 'test hook: .* at the first ASSIGN' "$TMP/$2.log" && ok || bad "$1: the hook did not fire: $(tail -3 "$TMP/$2.log")"
    cmp -s "$TMP/$1.got" "$TMP/want${5:-1}" && ok || bad "$1: text differs: '$(head -c 200 "$TMP/$1.got")'"
    lo=$(grep -n "node 127.0.0.1:$3 ('$2') left out: lost while the cluster opened ($4" "$TMP/$1.log" | head -1 | cut -d: -f1)
    rd=$(grep -n 'cluster ready' "$TMP/$1.log" | head -1 | cut -d: -f1)
    [ -n "$lo" ] && [ -n "$rd" ] && [ "$lo" -lt "$rd" ] && ok ||
        bad "$1: no left-out line before 'cluster ready' (lines '$lo' '$rd'): $(grep -i 'left\|lost\|ready' "$TMP/$1.log" | head -5)"
    grep -q 're-plan (epoch [0-9]*, recovery)' "$TMP/$1.log" && grep -q 'recovered' "$TMP/$1.log" && ok ||
        bad "$1: no re-plan: $(grep -i 'plan\|recover' "$TMP/$1.log" | head -5)"
    echo "$1: $(grep 'left out' "$TMP/$1.log" | head -1)" >&2
}

# ---- exit: the middle node exits at its ASSIGN.
start_node ea; PA=$NODE_PORT
CUMULO_TEST_OPEN_FAIL=exit start_node eb; PB=$NODE_PORT
start_node ec; PC=$NODE_PORT
run_open exit "$M" "127.0.0.1:$PA,127.0.0.1:$PB,127.0.0.1:$PC" --layers 2,1,1,1
check_left_out exit eb "$PB" 'left: '

# ---- stop: the node stops itself at its ASSIGN; silence shows the loss.
start_node sa; PA=$NODE_PORT
CUMULO_TEST_OPEN_FAIL=stop start_node sb; SB=$NODE_PID; PB=$NODE_PORT
start_node sc; PC=$NODE_PORT
run_open stop "$M" "127.0.0.1:$PA,127.0.0.1:$PB,127.0.0.1:$PC" --layers 2,1,1,1
check_left_out stop sb "$PB" 'silent for '
kill -9 "$SB" 2>/dev/null

# ---- serve: the same under `cumulo serve --nodes`; two requests' texts.
start_node va; PA=$NODE_PORT
CUMULO_TEST_OPEN_FAIL=exit start_node vb; PB=$NODE_PORT
cc_start_serve sv "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" --layers 2,2,1 --threads 1 --slots 2 ||
    bad "serve: did not start: $(tail -3 "$TMP/sv.log")"
grep -q "node 127.0.0.1:$PB ('vb') left out: lost while the cluster opened (left: " "$TMP/sv.log" && ok ||
    bad "serve: no left-out line: $(grep -i 'left\|lost' "$TMP/sv.log" | head -3)"
CP=""
cc_request sv 1 1 true
cc_request sv 2 1 false
for p in $CP; do wait "$p"; done
cc_check sv 1 1 true
cc_check sv 2 1 false
kill -9 "$SERVE_PID" 2>/dev/null

# ---- tp: a tensor-parallel group of 3 loses a member at open. Members map
# the model from --models (see cluster_recover.sh's tp); TP sums in another
# order than one machine, and "Once upon a time" agrees with every split for
# 100 tokens (cluster_recover.sh).
start_node ta --models "$SHARED/models"; PA=$NODE_PORT
CUMULO_TEST_OPEN_FAIL=exit start_node tb --models "$SHARED/models"; PB=$NODE_PORT
run_open tp "$M" "127.0.0.1:$PA,127.0.0.1:$PB" --parallel tp
check_left_out tp tb "$PB" 'left: '
grep -q 'recovered: tensor-parallel group of 2' "$TMP/tp.log" && ok ||
    bad "tp: no group of 2: $(grep -i 'tensor\|plan' "$TMP/tp.log" | tail -3)"
# The survivor waiting for the lost rank (when it is the higher one, as in the
# order given) stops at the re-plan's greeting, not after its 30 s deadline.
grep -q 'did not connect within 30 s' "$TMP/ta.log" && bad "tp: the survivor waited 30 s for the lost rank" || ok

# ---- ep: an expert group of 3 loses a member at open (cluster_ep_recover.sh's model).
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
MOE=$TMP/moe.gguf
"$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 21 --vocab "$VOCAB" -o "$MOE" 2>/dev/null && ok || bad "synth failed"
"$BIN" run "$MOE" -p "$(cc_prompt 1)" -n $N_TOK --temp 0 --threads 1 --json 2>/dev/null |
    perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' >"$TMP/wantmoe"
[ -s "$TMP/wantmoe" ] && ok || bad "single machine MoE run failed"
export CUMULO_DECLARE_SPEED=50,20 # equal machines (cluster_ep_recover.sh)
start_node pa; PA=$NODE_PORT
CUMULO_TEST_OPEN_FAIL=exit start_node pb; PB=$NODE_PORT
run_open ep "$MOE" "127.0.0.1:$PA,127.0.0.1:$PB" --parallel ep
unset CUMULO_DECLARE_SPEED
check_left_out ep pb "$PB" 'left: ' moe
grep -q 'recovered: expert group of 2' "$TMP/ep.log" && ok ||
    bad "ep: no expert group of 2: $(grep -i 'expert\|plan' "$TMP/ep.log" | tail -3)"

# ---- nofit: 256 MiB reserve + 1.5 MiB per node (cluster_recover.sh's nofit):
# a node holds 2 layers but not the 3 layers + head the survivor would need.
export CUMULO_MEM_OFFER=270008320
start_node na; PA=$NODE_PORT
CUMULO_TEST_OPEN_FAIL=exit start_node nb; PB=$NODE_PORT
unset CUMULO_MEM_OFFER
run_open nofit "$M" "127.0.0.1:$PA,127.0.0.1:$PB" --layers 2,2,1 --ctx 512
[ "$RC" -ne 0 ] && ok || bad "nofit: the run succeeded without room for the model"
grep -q 'test hook: exiting at the first ASSIGN' "$TMP/nb.log" && ok || bad "nofit: the hook did not fire"
grep -q "node 127.0.0.1:$PB ('nb') lost while the cluster opened, and .*no longer fits.*; start it again" "$TMP/nofit.log" && ok ||
    bad "nofit: no clear error: $(tail -3 "$TMP/nofit.log")"
echo "nofit: $(tail -1 "$TMP/nofit.log")" >&2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
