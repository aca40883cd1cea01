#!/bin/sh
# tests/sh/cluster_gpu.sh: mixed CPU/GPU clusters on 127.0.0.1 (issue 16),
# the GPU being whatever Vulkan device is here (CI: Mesa's lavapipe). A node
# started with --gpu measures its device and reports it in its HELLO:
# `cumulo nodes` shows it (text and --json), the coordinator logs it and
# plans with it. Pipelines with the GPU node given first and last (an
# explicit --layers split, so the device certainly holds layers; the planner
# may order the two nodes either way), with --gpu-layers 1 (one layer on the device, the next on its
# CPU), with the coordinator's own stage on the device too, and the
# planner's own split: the greedy ids equal one CPU machine's and
# llama.cpp's on the stories260K reference prompts (the tolerance rule of a
# cluster: token for token). A tensor-parallel group with the GPU node in it
# gives the same ids with its slice of every layer on the device. A node whose Vulkan loader is
# missing says so in one line and offers no GPU. A node whose GPU is lost
# leaves, and the coordinator re-plans without it. No Vulkan device: a skip
# with the reason (setup installs lavapipe, so under CI=true it fails).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
M=$SHARED/models

"$BIN" info --gpu >"$TMP/info" 2>&1
if ! grep -q '^gpu 0:' "$TMP/info"; then
    echo "skip: no Vulkan device: $(head -1 "$TMP/info")"
    echo "$pass passed, $fail failed, 1 skipped"
    exit 0
fi

# start_node NAME [node options...]: sets PORT_<NAME> and ADDR_<NAME>.
start_node() {
    name=$1
    shift
    cc_start_node "$name" --no-mdns --models "$M" "$@"
    [ -n "$NODE_PORT" ] || { bad "node $name did not start: $(cat "$TMP/$name.log")"; exit 1; }
    eval "PORT_$name=$NODE_PORT; ADDR_$name=127.0.0.1:$NODE_PORT"
}
start_node g --gpu vulkan
start_node h --gpu vulkan --gpu-layers 1
start_node a
export CUMULO_VULKAN_LIB="$TMP/no/libvulkan.so.1"
start_node n --gpu vulkan
unset CUMULO_VULKAN_LIB
ok

# 1. The GPU nodes measured their device; the one without a loader said why, once.
grep -q "cumulo node 'g': GPU '.*' (.*): [0-9.]* GB/s, [0-9.]* GFLOP/s measured" "$TMP/g.log" && ok ||
    bad "node g did not report its GPU: $(cat "$TMP/g.log")"
[ "$(grep -c 'gpu:' "$TMP/n.log")" -eq 1 ] && grep -q "cannot load the Vulkan loader.*the stages run on the CPU" "$TMP/n.log" &&
    ok || bad "node n without a loader: $(cat "$TMP/n.log")"

# 2. cumulo nodes: the GPU in the table and in --json (null for the others)
"$BIN" nodes --no-mdns --nodes "$ADDR_g,$ADDR_a,$ADDR_n" --json >"$TMP/nodes.json" 2>"$TMP/nodes.err" || bad "nodes --json: $(cat "$TMP/nodes.err")"
gname=$(sed -n "s/.*GPU '\(.*\)' (.*/\1/p" "$TMP/g.log" | head -1)
[ "$(cc_jsonget "$TMP/nodes.json" '$j->[0]{gpu}{name}')" = "$gname" ] &&
    [ "$(cc_jsonget "$TMP/nodes.json" '($j->[0]{gpu}{mem} > 0 && $j->[0]{gpu}{gbs} > 0 && $j->[0]{gpu}{gflops} > 0) ? 1 : 0')" = 1 ] &&
    [ "$(cc_jsonget "$TMP/nodes.json" 'defined $j->[1]{gpu} ? 1 : 0')" = 0 ] &&
    [ "$(cc_jsonget "$TMP/nodes.json" 'defined $j->[2]{gpu} ? 1 : 0')" = 0 ] && ok ||
    bad "nodes --json: the GPU of g ('$gname'), none for a and n: $(cat "$TMP/nodes.json")"
"$BIN" nodes --no-mdns --nodes "$ADDR_h,$ADDR_a" >"$TMP/nodes.txt" 2>&1
grep -q "gpu: $gname, [0-9.]* GiB, [0-9.]* GB/s, [0-9.]* GFLOP/s, at most 1 layers" "$TMP/nodes.txt" &&
    [ "$(grep -c 'gpu:' "$TMP/nodes.txt")" -eq 1 ] && ok || bad "nodes: the GPU line of h: $(cat "$TMP/nodes.txt")"

# run_case NAME NODES [run options...]: the reference case's prompt through a
# cluster; its ids must equal one machine's (cc_ref_case: and llama.cpp's).
run_case() {
    tag=$1 nodes=$2
    shift 2
    k=0
    while :; do
        if ! "$BIN" run "$M/stories260K-$q.gguf" --nodes "$nodes" -p "$prompt" -n "$n" --temp 0 --threads 1 --json "$@" \
            >"$TMP/cl.json" 2>"$TMP/cl.err"; then
            bad "$q case $c, $tag: run failed: $(tail -3 "$TMP/cl.err")"
            return 1
        fi
        # a node still leased to the previous run's coordinator (a loaded
        # machine notices the end late) is left out: run again
        grep -q "not used:" "$TMP/cl.err" || break
        k=$((k + 1))
        [ $k -lt 10 ] || { bad "$q case $c, $tag: a node stayed busy: $(grep 'not used' "$TMP/cl.err")"; return 1; }
        sleep 1
    done
    got=$(cc_jsonget "$TMP/cl.json" 'join(",", @{$j->{tokens}})')
    [ -n "$got" ] && [ "$got" = "$local_ids" ] && ok || bad "$q case $c, $tag: ids differ from one machine: [$got] vs [$local_ids]"
}
# gpu_took NODE NGPU NSTAGE: NODE's log since the mark says it took a stage
# of NSTAGE layers and ran its first NGPU on the device (the planner may
# order the nodes either way: which stage is its choice).
mark() { for t in g h a; do wc -l <"$TMP/$t.log" >"$TMP/$t.mark"; done; }
gpu_took() {
    r=$(tail -n +$(($(cat "$TMP/$1.mark") + 1)) "$TMP/$1.log" |
        sed -n "s/.*stage [0-9]* layers \[\([0-9]*\), \([0-9]*\)) on GPU '.*', layers \[[0-9]*, \([0-9]*\)) on the CPU.*/\1 \2 \3/p" | tail -1)
    set -- "$1" "$2" "$3" $r
    [ $# -eq 6 ] && [ $(($5 - $4)) -eq "$2" ] && [ $(($6 - $4)) -eq "$3" ] && ok ||
        bad "$q case $c: node $1 did not run $2 of its $3 layers on its GPU: $(tail -n +$(($(cat "$TMP/$1.mark") + 1)) "$TMP/$1.log" | tr '\n' '|')"
}

for q in q8_0 f32 q4_0; do
    for c in 0 1 2 3; do
        [ $q = q4_0 ] && [ $c -gt 0 ] && continue # one case: the type's shader
        cc_ref_case "$q" "$c"
        # 3. the GPU node given first, then last (the planner orders the stages: usually a middle
        # stage, then the last, whose output head stays on its CPU)
        mark
        run_case "gpu middle" "$ADDR_g,$ADDR_a" --layers 1,2,2 && gpu_took g 2 2
        mark
        run_case "gpu last" "$ADDR_a,$ADDR_g" --layers 1,2,2 && gpu_took g 2 2
        # 4. --gpu-layers 1: its first layer on the device, the second on the CPU
        mark
        run_case "gpu-layers 1" "$ADDR_h,$ADDR_a" --layers 1,2,2 && gpu_took h 1 2
    done
done

# 5. The coordinator's stage on the device too, and the planner's own split
# (the GPU node is planned with its device: its row in the plan says gpu:K).
q=q8_0
for c in 0 1; do
    cc_ref_case $q $c
    run_case "coordinator on the GPU" "$ADDR_g,$ADDR_a" --layers 2,2,1 --gpu vulkan
    [ "$(cc_jsonget "$TMP/cl.json" '$j->{device} . "," . $j->{gpu_layers}')" = "$gname,2" ] && ok ||
        bad "the coordinator's stage not on the GPU: $(grep -o '"device".*' "$TMP/cl.json")"
    mark
    run_case "planned" "$ADDR_a,$ADDR_g"
    grep -q "node $ADDR_g ('g'): .*; GPU '$gname'" "$TMP/cl.err" && ok || bad "the coordinator did not see g's GPU: $(grep "node $ADDR_g" "$TMP/cl.err")"
    grep -q "g 127.0.0.1:$PORT_g .* gpu:[1-5]\$" "$TMP/cl.err" && [ "$(grep -c ' gpu:[0-9]*$' "$TMP/cl.err")" -eq 1 ] && ok ||
        bad "the plan has no GPU layers on g (or some elsewhere): $(grep -A6 'node *stage' "$TMP/cl.err")"
done

# 6. Tensor-parallel groups with the GPU node in them: its slice of every
# layer (KV heads, FFN rows) on the device, each layer's two partial sums
# all-reduced with the CPU members': one machine's ids (Q8_0 and F32; the
# coordinator and g; the coordinator, g and a); and a coordinator whose own
# slice is on its device.
for q in q8_0 f32; do
    cc_ref_case $q 0
    for nodes in "$ADDR_g" "$ADDR_g,$ADDR_a"; do
        mark
        run_case "tp group ($nodes)" "$nodes" --parallel tp && gpu_took g 5 5
        tail -n +$(($(cat "$TMP/g.mark") + 1)) "$TMP/g.log" | grep -q "on the CPU (its tensor-parallel slice)" && ok ||
            bad "tp ($nodes): node g did not say its slice runs on the GPU: $(tail -5 "$TMP/g.log")"
    done
done
# ... and the coordinator's own slice on the device (a CPU node as the other member)
cc_ref_case q8_0 1
run_case "tp coordinator on the GPU" "$ADDR_a" --parallel tp --gpu vulkan
[ "$(cc_jsonget "$TMP/cl.json" '$j->{device} . "," . $j->{gpu_layers}')" = "$gname,5" ] && ! grep -q 'gpu:.*on the CPU' "$TMP/cl.err" &&
    ok || bad "tp: the coordinator's slice not on the GPU: $(grep -o '"device".*' "$TMP/cl.json") $(grep gpu: "$TMP/cl.err")"
# (the device takes its batches: lost at its 2nd forward pass, it says so; the group recovers with the same ids)
export CUMULO_TEST_GPU_FAULT=lost:2
run_case "tp coordinator's GPU lost" "$ADDR_a" --parallel tp --gpu vulkan
unset CUMULO_TEST_GPU_FAULT
grep -q "gpu: .* was lost; the CPU computes" "$TMP/cl.err" && ok ||
    bad "tp: the coordinator's device did not take its slice's batches: $(tail -3 "$TMP/cl.err")"

# 6b. A member killed mid-run in a group whose coordinator's slice is on its
# device: the group re-forms with new slices, and the coordinator's new slice
# goes to the device too (every batch since its re-upload on the device, none
# left to the CPU); one machine's ids.
start_node k
PID_k=$NODE_PID
cc_ref_case q8_0 0
CUMULO_TEST_CLUSTER_DELAY_MS=60 "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_a,$ADDR_k" -p "$prompt" -n "$n" \
    --temp 0 --threads 1 --json --parallel tp --gpu vulkan >"$TMP/re.json" 2>"$TMP/re.err" &
RUN=$!
cc_wait_grep "$TMP/re.err" 'cluster ready' 300 || bad "tp re-form: the cluster did not start: $(tail -3 "$TMP/re.err")"
sleep 0.5
kill -9 $PID_k
wait $RUN || bad "tp re-form: the run failed: $(tail -3 "$TMP/re.err")"
got=$(cc_jsonget "$TMP/re.json" 'join(",", @{$j->{tokens}})')
[ -n "$got" ] && [ "$got" = "$local_ids" ] && ok || bad "tp re-form: ids differ from one machine: [$got] vs [$local_ids]"
grep -q 'recovered' "$TMP/re.err" && ok ||
    bad "tp re-form: no re-formed group, or its slice not uploaded: $(grep -i 'recover\|gpu' "$TMP/re.err")"
[ "$(cc_jsonget "$TMP/re.json" '$j->{device} . "," . ($j->{gpu_batches} > 0 ? 1 : 0) . "," . $j->{gpu_batches_declined}')" = "$gname,1,0" ] &&
    ok || bad "tp re-form: the coordinator's batches after the re-form not on the device: $(grep -o '"device".*"logprobs\|"device".*"timings' "$TMP/re.json")"

# 7. A node whose GPU is lost (the test hook, at its 4th forward pass) leaves
# the cluster: the coordinator re-plans without it, as for any lost node,
# and the run still gives one machine's ids.
export CUMULO_TEST_GPU_FAULT=lost:4
start_node f --gpu vulkan
unset CUMULO_TEST_GPU_FAULT
cc_ref_case q8_0 0
run_case "gpu lost" "$ADDR_f,$ADDR_a" --layers 1,2,2
grep -q "cumulo node 'f': GPU '.*' lost; leaving the cluster" "$TMP/f.log" && ok || bad "node f did not leave: $(tail -3 "$TMP/f.log")"
grep -q 'recovered' "$TMP/cl.err" && ok || bad "gpu lost: the coordinator did not re-plan: $(tail -5 "$TMP/cl.err")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
