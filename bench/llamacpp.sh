#!/bin/sh
# llamacpp.sh: the speed anchor — llama.cpp built from source for this CPU.
#
# Downloads the llama-cpp-python sdist (its vendor/llama.cpp is a pinned
# llama.cpp), unpacks it once and builds llama-bench and llama-batched-bench
# into a cache outside the repo (never commit it):
#   $CACHE/native   -DGGML_NATIVE=ON                       (everything this CPU has)
#   $CACHE/avx2     -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF  (AVX2-only anchor)
#   $CACHE/noamx    -DGGML_NATIVE=ON with -mno-amx-* (GCC lets explicit -mno-
#                   flags override -march=native's): the anchor on Sapphire-Rapids-class
#                   CPUs, where the native build's AMX matmul segfaults on
#                   quantized models (llama.cpp issue 20824, open; seen on
#                   GenuineIntel family 6 model 167, 2026-12-05)
# Prints the path of the requested build's llama-bench on stdout; progress
# on stderr. A build that is already there is reused (delete the folder to
# rebuild; a build folder missing one of the tools is configured again and
# only that tool compiles). Builds run under `nice` because the machine is shared.
#
#   sh bench/llamacpp.sh                 # native build, prints .../native/bin/llama-bench
#   sh bench/llamacpp.sh avx2            # AVX2-only build
#   sh bench/llamacpp.sh all             # native and avx2
#   sh bench/llamacpp.sh noamx           # native without AMX
#   LLAMACPP_CACHE=/somewhere sh bench/llamacpp.sh
#
# `cumulo bench --vs-llamacpp` runs $CACHE/native/bin/llama-bench when it is
# there (CUMULO_LLAMACPP_BENCH overrides the path) and falls back to
# node-llama-cpp otherwise.
set -eu
VERSION=${LLAMACPP_PY_VERSION:-0.3.36}
CACHE=${LLAMACPP_CACHE:-/work/cache/llamacpp-native}
JOBS=${JOBS:-2}
what=${1:-native}
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

src=$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp
mkdir -p "$CACHE"
if [ ! -f "$src/CMakeLists.txt" ]; then
    tgz=$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz
    if [ ! -f "$tgz" ]; then
        echo "llamacpp.sh: downloading llama-cpp-python==$VERSION sdist" >&2
        pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist" >&2
    fi
    tar xzf "$tgz" -C "$CACHE"
fi
command -v cmake >/dev/null || { echo "llamacpp.sh: cmake is not installed (apt-get install cmake)" >&2; exit 1; }

build() { # build NAME CMAKE-FLAGS...
    name=$1; shift
    dir=$CACHE/$name
    if [ -x "$dir/bin/llama-bench" ] && [ -x "$dir/bin/llama-batched-bench" ] && [ -x "$dir/bin/llama-server" ]; then
        echo "$dir/bin/llama-bench"; return 0
    fi
    echo "llamacpp.sh: building $name ($*) in $dir" >&2
    nice cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON \
        -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$dir/bin" "$@" >&2
    nice cmake --build "$dir" -j "$JOBS" --target llama-bench llama-batched-bench llama-server >&2
    echo "$dir/bin/llama-bench"
}

case $what in
native) build native -DGGML_NATIVE=ON ;;
avx2) build avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX512_VBMI=OFF ;;
noamx) build noamx -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" ;;
all) "$0" native && "$0" avx2 ;;
*) echo "usage: llamacpp.sh [native|avx2|noamx|all]" >&2; exit 2 ;;
esac
