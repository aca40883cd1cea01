#!/bin/sh
# bench/serve_pipeline.sh: a benchmark, not a test. serve_compare.sh over a 3-stage pipeline
# (this serve + 2 `cumulo node`s on loopback, 1 thread each, --layers 6,5,5) beside one process at 1
# thread, 4 and 8 closed-loop users (llama.cpp columns left out).
cd "$(dirname "$0")/.." || exit 1
D=$(mktemp -d)
for i in 1 2; do
  ./cumulo node --port 1900$i --threads 1 --insecure --no-mdns --cache $D/c$i --bind 127.0.0.1 > $D/n$i.log 2>&1 &
done
sleep 2
THREADS=1 SLOTS=16 USERS="4 8" GEN=64 PROMPT=16 REQS=2 LLAMA_SERVER= BATCHED_BENCH= \
  CUMULO_A=build/cumulo ARGS_A="--nodes 127.0.0.1:19001,127.0.0.1:19002 --insecure --layers 6,5,5" \
  sh bench/serve_compare.sh
kill $(jobs -p) 2>/dev/null
grep -h -i 'stage\|plan' $D/n*.log | head -4
rm -rf $D
