#!/bin/sh
# tests/sh/finetune_cluster.sh: `cumulo finetune --cluster` (issue 17):
# pipeline-parallel LoRA training of stories260K (5 layers) over `cumulo
# node` processes on 127.0.0.1, authenticated with the cluster key.
# (a) With the default options, a 2-stage (planner's split) and a 3-stage
#     (--layers 1,3,1) pipeline write the adapter and the loss curve of one
#     machine's run byte for byte, and llama.cpp (node-llama-cpp, the
#     reference tests/data/finetune/zorbix.json of finetune_cli.sh) gives the
#     same greedy ids and probabilities within 2e-5 with it.
# (b) Dropout, gradient accumulation, eval and checkpoints every 3 steps on 3
#     stages: the checkpoints (gathered slices: parameters, both moments,
#     step) and the adapter equal one machine's; --resume on the cluster from
#     one machine's step-3 checkpoint ends with the same bytes. The 1F1B
#     schedule with 1, 3 (the default) and 4 windows in flight: the same
#     bytes; 65 (past CM_MSG_MAX_TRAIN_INFLIGHT) is refused with one line.
# (c) Data parallelism: 2 replicas (each this machine's layers [0, 2) and one
#     node's [2, 5)) split every step's windows, with dropout, accumulation
#     and checkpoints: the checkpoints and the adapter equal one machine's;
#     nodes that do not split into the replicas are one line. Without
#     --layers or --data-parallel, the planner makes the 2 replicas itself
#     (each node holds the model's rest: sched/plan_dp.h), again with one
#     machine's bytes; --data-parallel 1 is one pipeline of 3 stages.
# (d) A tensor-parallel plan is refused with one line; a node killed with -9
#     mid-run: the run re-plans on the survivor, resumes from its last
#     checkpoint by itself and ends with the uninterrupted run's adapter;
#     with 2 data-parallel replicas, the replica that lost its only node is
#     left out and the other ends the run, with that adapter too.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
. tests/sh/lib/finetune_data.sh
M=$SHARED/models/stories260K-f32.gguf
finetune_data >"$TMP/data.jsonl"

for n in a b; do cc_start_node $n --no-mdns --models "$SHARED/models"; eval "PORT_$n=$NODE_PORT"; done
A=127.0.0.1:$PORT_a
B=127.0.0.1:$PORT_b
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && ok || { bad "nodes did not start"; cat "$TMP"/*.log; exit 1; }

# (a) defaults: one machine, 2 stages, 3 stages
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/one.gguf" --threads 1 2>"$TMP/one.err" || bad "one machine: $(tail -1 "$TMP/one.err")"
for st in 2 3; do
    if [ $st = 2 ]; then opt="--nodes $A"; else opt="--nodes $A,$B --layers 1,3,1"; fi
    # shellcheck disable=SC2086
    if "$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/c$st.gguf" --threads 1 $opt 2>"$TMP/c$st.err"; then
        grep -q "pipeline of $st stages" "$TMP/c$st.err" && ok || bad "$st stages: not a $st-stage pipeline: $(grep -i 'plan\|stage' "$TMP/c$st.err" | head -3)"
        cmp -s "$TMP/one.gguf" "$TMP/c$st.gguf" && ok || bad "$st stages: the adapter differs from one machine's"
        cmp -s "$TMP/one.gguf.svg" "$TMP/c$st.gguf.svg" && ok || bad "$st stages: the loss curve differs from one machine's"
        echo "# $st stages: $(grep '^finetune: loss' "$TMP/c$st.err"); $(grep 'MiB of activations' "$TMP/c$st.err" | sed 's/^finetune: //')"
    else
        bad "$st stages: $(tail -3 "$TMP/c$st.err")"
    fi
done
res=$(vs_llamacpp "$M" "Zorbix" 24 "$TMP/c3.gguf" tests/data/finetune/zorbix.json)
echo "# llama.cpp vs cumulo with the adapter trained on 3 stages: $res"
case "$res" in ok*) ok ;; *) bad "llama.cpp with the 3-stage adapter: $res" ;; esac

# (b) dropout, accumulation, eval, checkpoints; resume on the cluster
R="--ctx 32 --batch 2 --grad-accum 2 --steps 6 --dropout 0.1 --val-split 0.2 --save-every 3 --threads 1"
C="--nodes $A,$B --layers 2,2,1"
# shellcheck disable=SC2086
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r1.gguf" $R 2>/dev/null || bad "r1"
# shellcheck disable=SC2086
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r2.gguf" $R $C 2>"$TMP/r2.err" || bad "r2: $(tail -1 "$TMP/r2.err")"
for f in gguf gguf.ckpt-3.gguf gguf.ckpt-6.gguf; do
    cmp -s "$TMP/r1.$f" "$TMP/r2.$f" && ok || bad "3 stages with dropout and checkpoints: r2.$f differs from one machine's"
done
# shellcheck disable=SC2086
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/r3.gguf" $R $C --resume "$TMP/r1.gguf.ckpt-3.gguf" 2>"$TMP/r3.err" ||
    bad "resume on the cluster: $(tail -1 "$TMP/r3.err")"
cmp -s "$TMP/r1.gguf" "$TMP/r3.gguf" && ok || bad "resumed on the cluster: the adapter differs"
# the 1F1B schedule: 1 and 4 windows in flight (r2 above: the default, 3 for 3 stages) give the same bytes
grep -q "3 windows in flight" "$TMP/r2.err" && ok || bad "3 stages: not 3 windows in flight by default: $(grep 'pipeline of' "$TMP/r2.err")"
for nf in 1 4; do
    # shellcheck disable=SC2086
    if "$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/f$nf.gguf" $R $C --in-flight $nf 2>"$TMP/f$nf.err"; then
        grep -q "$nf windows in flight" "$TMP/f$nf.err" && ok || bad "--in-flight $nf: $(grep 'pipeline of' "$TMP/f$nf.err")"
        for f in gguf gguf.ckpt-3.gguf gguf.ckpt-6.gguf gguf.svg; do
            cmp -s "$TMP/r1.$f" "$TMP/f$nf.$f" && ok || bad "--in-flight $nf: f$nf.$f differs from one machine's"
        done
    else
        bad "--in-flight $nf: $(tail -1 "$TMP/f$nf.err")"
    fi
done
# shellcheck disable=SC2086
if "$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/f65.gguf" $R $C --in-flight 65 2>"$TMP/f65.err"; then
    bad "--in-flight 65 was accepted"
else
    [ "$(wc -l <"$TMP/f65.err")" -eq 1 ] && grep -q "in-flight" "$TMP/f65.err" && ok || bad "--in-flight 65: $(cat "$TMP/f65.err")"
fi

# (c) data parallelism: 2 replicas of a 2-stage pipeline
# shellcheck disable=SC2086
if "$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/dp.gguf" $R --data-parallel 2 --nodes "$A,$B" --layers 2,3 2>"$TMP/dp.err"; then
    grep -q "data parallel: 2 replicas, each a pipeline of 2 stages" "$TMP/dp.err" && ok || bad "data parallel: $(grep -i 'parallel\|stage' "$TMP/dp.err" | head -3)"
    for f in gguf gguf.ckpt-3.gguf gguf.ckpt-6.gguf; do
        cmp -s "$TMP/r1.$f" "$TMP/dp.$f" && ok || bad "2 data-parallel replicas: dp.$f differs from one machine's"
    done
    cmp -s "$TMP/r1.gguf.svg" "$TMP/dp.gguf.svg" && ok || bad "2 data-parallel replicas: the loss curve differs"
    echo "# 2 replicas: $(grep 'MiB of' "$TMP/dp.err" | sed 's/^finetune: //')"
else
    bad "data parallel: $(tail -3 "$TMP/dp.err")"
fi
for v in auto 1; do
    if [ $v = auto ]; then opt=""; want="the planner chose data parallelism: 2 replicas"; else opt="--data-parallel 1"; want="pipeline of 3 stages"; fi
    # shellcheck disable=SC2086
    if "$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/ap$v.gguf" $R $opt --nodes "$A,$B" 2>"$TMP/ap$v.err"; then
        grep -q "$want" "$TMP/ap$v.err" && ok || bad "--nodes A,B $opt: not '$want': $(grep -i 'parallel\|stage' "$TMP/ap$v.err" | head -3)"
        for f in gguf gguf.ckpt-3.gguf gguf.ckpt-6.gguf gguf.svg; do
            cmp -s "$TMP/r1.$f" "$TMP/ap$v.$f" && ok || bad "--nodes A,B $opt: ap$v.$f differs from one machine's"
        done
        echo "# --nodes A,B $opt: $(grep 'planner chose\|pipeline of' "$TMP/ap$v.err" | sed 's/^finetune: //' | tr '\n' ' ')"
    else
        bad "--nodes A,B $opt: $(tail -3 "$TMP/ap$v.err")"
    fi
done
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/dp1.gguf" --steps 1 --data-parallel 2 --nodes "$A" 2>"$TMP/dp1.err"
[ $? -eq 1 ] && grep -q "^cumulo: .*1 nodes do not split into 2 replicas" "$TMP/dp1.err" && ok || bad "1 node, 2 replicas: $(tail -2 "$TMP/dp1.err")"

# (d) refusals and a lost node
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/tp.gguf" --steps 1 --nodes "$A" --parallel tp 2>"$TMP/tp.err"
[ $? -eq 1 ] && grep -q "^cumulo: .*training runs on a pipeline plan" "$TMP/tp.err" && ok || bad "tensor-parallel plan: $(tail -2 "$TMP/tp.err")"
K="--ctx 32 --batch 2 --steps 200 --save-every 5 --threads 1"
# shellcheck disable=SC2086
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/k.gguf" $K --nodes "$A,$B" --layers 2,2,1 2>"$TMP/k.err" &
kp=$!
i=0; while [ ! -f "$TMP/k.gguf.ckpt-10.gguf" ] && [ $i -lt 600 ] && kill -0 $kp 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
kill -9 "$(echo $CC_PIDS | cut -d' ' -f2)" 2>/dev/null # node b
wait $kp
rc=$?
echo "# node b killed mid-run: exit $rc: $(grep 're-planning' "$TMP/k.err" | head -1)"
echo "# after the loss: $(grep 'pipeline of\|trains alone' "$TMP/k.err" | tail -1)"
[ $rc -eq 0 ] && grep -q "re-planning on the surviving nodes and resuming from $TMP/k.gguf.ckpt-" "$TMP/k.err" && ok || bad "a lost node: exit $rc, $(tail -3 "$TMP/k.err")"
# shellcheck disable=SC2086
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/k2.gguf" $K 2>/dev/null || bad "k2"
cmp -s "$TMP/k.gguf" "$TMP/k2.gguf" && ok || bad "resumed by itself after losing a node: the adapter differs"
cmp -s "$TMP/k.gguf.svg" "$TMP/k2.gguf.svg" && ok || bad "resumed by itself after losing a node: the loss curve differs"
# the same with 2 data-parallel replicas: replica 1's only node lost, replica 0 goes on alone
cc_start_node c --no-mdns --models "$SHARED/models"
C3=127.0.0.1:$NODE_PORT
# shellcheck disable=SC2086
"$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/kd.gguf" $K --data-parallel 2 --nodes "$A,$C3" --layers 2,3 2>"$TMP/kd.err" &
kp=$!
i=0; while [ ! -f "$TMP/kd.gguf.ckpt-10.gguf" ] && [ $i -lt 600 ] && kill -0 $kp 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
kill -9 "$(echo $CC_PIDS | cut -d' ' -f3)" 2>/dev/null # node c
wait $kp
rc=$?
echo "# 2 replicas, node c killed mid-run: exit $rc: $(grep 'left out\|pipeline of' "$TMP/kd.err" | tail -2 | tr '\n' ' ')"
[ $rc -eq 0 ] && grep -q "re-planning on the surviving nodes and resuming from $TMP/kd.gguf.ckpt-" "$TMP/kd.err" && ok || bad "2 replicas, a lost node: exit $rc, $(tail -3 "$TMP/kd.err")"
cmp -s "$TMP/kd.gguf" "$TMP/k2.gguf" && ok || bad "2 replicas, resumed after losing a node: the adapter differs"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
