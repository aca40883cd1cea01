#!/bin/sh
# scripts/setup.sh: install what cumulo needs to build and test, and nothing
# when it is all there. apt on Debian/Ubuntu (as root or with sudo), brew on macOS.
set -e
# tests/js: the openai SDK and playwright-core from the lockfile (node_modules is git-ignored).
js_deps() {
    js="$(cd "$(dirname "$0")/.." && pwd)/tests/js"
    if command -v npm >/dev/null 2>&1 && { [ ! -d "$js/node_modules/openai" ] || [ ! -d "$js/node_modules/playwright-core" ]; }; then
        echo "setup: npm ci in tests/js"
        (cd "$js" && npm ci --no-audit --no-fund --silent)
    fi
}
need_pc="libmicrohttpd libcjson libsodium libpcre2-8 libuv"
missing=""
command -v cc >/dev/null 2>&1 || missing="$missing cc"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
if command -v pkg-config >/dev/null 2>&1; then
    for p in $need_pc; do pkg-config --exists "$p" || missing="$missing $p"; done
fi
if [ "$(uname -s)" = Linux ]; then
    # test tools: clang+libFuzzer, qemu-user + aarch64 cross compiler, namespaces, avahi, ssh, node,
    # chromium (the dashboard test drives Debian's /usr/bin/chromium), tmux (drives `cumulo chat` in a terminal)
    for c in clang qemu-aarch64 aarch64-linux-gnu-gcc ip tc nft avahi-browse avahi-daemon dbus-daemon sshd node npm chromium tmux; do
        command -v $c >/dev/null 2>&1 || [ -x /usr/sbin/$c ] || missing="$missing $c"
    done
    [ -f /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ] || \
      ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || missing="$missing libfuzzer"
fi
[ -z "$missing" ] && { js_deps; exit 0; }
echo "setup: installing missing:$missing"
if [ "$(uname -s)" = Darwin ]; then
    command -v brew >/dev/null 2>&1 || { echo "setup: install Homebrew first (https://brew.sh), then run make again" >&2; exit 1; }
    brew install pkg-config libmicrohttpd cjson libsodium pcre2 libuv node tmux
    js_deps
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    # Node.js only when there is none: a machine with NodeSource's nodejs (which bundles npm)
    # must not be offered Debian's npm, which conflicts with it.
    node_pkgs=""
    command -v node >/dev/null 2>&1 || node_pkgs="nodejs"
    command -v npm >/dev/null 2>&1 || node_pkgs="$node_pkgs npm"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends build-essential pkg-config \
        libmicrohttpd-dev libcjson-dev libsodium-dev libpcre2-dev libuv1-dev \
        clang libclang-rt-14-dev qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
        iproute2 nftables avahi-utils avahi-daemon dbus openssh-server openssh-client tmux \
        chromium ca-certificates $node_pkgs >/dev/null
    js_deps
    exit 0
fi
echo "setup: no apt-get or brew here; install:$missing by hand" >&2
exit 1
