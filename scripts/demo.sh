#!/bin/sh
# scripts/demo.sh: the README's first command. Streams a story from the default
# model (CUMULO_MODEL, else ../shared/models/stories260K-q8_0.gguf, else a
# synthetic model with a warning that its output is noise).
set -e
cd "$(dirname "$0")/.."
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
MODEL=${CUMULO_MODEL:-$SHARED/models/stories260K-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
    echo "demo: warning: $MODEL not found; using a random-weight synth model (its output is noise)" >&2
    MODEL=build/demo-synth.gguf
    [ -f "$MODEL" ] || ./cumulo synth --arch llama --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --type q8_0 --seed 1 -o "$MODEL"
fi
./cumulo run "$MODEL" -p "Once upon a time" -n 200 --temp 0.8 --seed 7
