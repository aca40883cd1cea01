#!/bin/sh
# bench/serve_pipeline.sh: a benchmark, not a test. serve_compare.sh over a 3-stage pipeline
# (this serve + 2 `cumulo node`s on loopback, 1 thread each, --layers 6,5,5) beside one process at 1
# thread, 4 and 8 closed-loop users (llama.cpp columns left out).
#
# PIPE_A=/path/to/other/cumulo: instead, two pipelines side by side, that build's serve ("before",
# on its own two nodes) and build/cumulo's ("after", on two more), interleaved per concurrency as
# serve_compare.sh does; ROUNDS (default 1) repeats the whole comparison (A B A B ...).
#   PIPE_A=/work/base/build/cumulo ROUNDS=2 sh bench/serve_pipeline.sh
# CUMULO_PIPE_GROUPS (the serve's micro-batches in flight; default one per set of stages sharing a
# host: 1 here, all on one machine) passes through.
cd "$(dirname "$0")/.." || exit 1
D=$(mktemp -d)
PIPE_A=${PIPE_A-}
ROUNDS=${ROUNDS:-1}
n_nodes=2
[ -n "$PIPE_A" ] && n_nodes=4
pids=""
trap 'kill $pids 2>/dev/null; rm -rf $D' EXIT INT TERM
i=1
while [ $i -le $n_nodes ]; do
  build/cumulo node --port 1900$i --threads 1 --insecure --no-mdns --cache $D/c$i --bind 127.0.0.1 > $D/n$i.log 2>&1 &
  pids="$pids $!"
  i=$((i + 1))
done
sleep 2
L="--insecure --layers 6,5,5"
r=1
while [ $r -le "$ROUNDS" ]; do
  # a port pair per round: the last round's servers may still be shutting down
  export PORT0=$((18500 + 10 * r))
  if [ -n "$PIPE_A" ]; then
    THREADS=1 SLOTS=16 USERS="${USERS:-4 8}" GEN=64 PROMPT=16 REQS=2 LLAMA_SERVER= BATCHED_BENCH= \
      CUMULO_A="$PIPE_A" ARGS_A="--nodes 127.0.0.1:19001,127.0.0.1:19002 $L" \
      CUMULO_B=build/cumulo ARGS_B="--nodes 127.0.0.1:19003,127.0.0.1:19004 $L" \
      sh bench/serve_compare.sh
  else
    THREADS=1 SLOTS=16 USERS="${USERS:-4 8}" GEN=64 PROMPT=16 REQS=2 LLAMA_SERVER= BATCHED_BENCH= \
      CUMULO_A=build/cumulo ARGS_A="--nodes 127.0.0.1:19001,127.0.0.1:19002 $L" \
      sh bench/serve_compare.sh
  fi
  r=$((r + 1))
done
grep -h -i 'stage\|plan' $D/n*.log | head -4
