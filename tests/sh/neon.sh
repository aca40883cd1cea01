#!/bin/sh
# tests/sh/neon.sh: the NEON kernels' correctness on an x86 machine. Runs
# `make neon-test` (cross-compiled test_kernels_simd under qemu-aarch64):
# once on a CPU with dotprod, where the NEON table must exist and match the
# scalar reference, and once on one without, where dispatch must fall back to
# scalar without executing a NEON-dotprod instruction; and the kernels
# module's own test_kernels (its independent decoders, dispatch) and the batch-invariance test
# test_kernels_invariant on arm64. On an arm64 host the
# ordinary unit-test run already covers NEON natively, so this has nothing to add.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
case "$(uname -m)" in
aarch64 | arm64)
    need_skip "n/a: arm64 host: test_kernels_simd runs NEON natively"
    ;;
esac
pass=0 fail=0
for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "neon: '$tool' not found (make deps installs it)" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
done
if ! make --no-print-directory build-neon/test_kernels_simd build-neon/test_kernels build-neon/test_kernels_invariant >/tmp/cumulo-neon-build.$$ 2>&1; then
    tail -20 /tmp/cumulo-neon-build.$$ >&2
    rm -f /tmp/cumulo-neon-build.$$
    echo "0 passed, 1 failed"
    exit 1
fi
rm -f /tmp/cumulo-neon-build.$$
run() { # name, qemu cpu, expected ISA list[, test binary]
    out=$(CUMULO_EXPECT_ISA=$3 CUMULO_TEST_WRAPPER="qemu-aarch64 -cpu $2" qemu-aarch64 -cpu "$2" "build-neon/${4:-test_kernels_simd}" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q '^[0-9]* passed, 0 failed'; then
        pass=$((pass + 1))
        echo "ok   $1"
    else
        fail=$((fail + 1))
        echo "FAIL $1 (rc $rc)"
        echo "$out" | tail -20 | sed 's/^/     /'
    fi
    echo "$out" | grep '^#' | sed 's/^/     /'
}
run "neon+dotprod (qemu -cpu max)" max neon
run "no dotprod (qemu -cpu cortex-a57): scalar fallback" cortex-a57 ""
run "test_kernels (independent decoders, dispatch) under qemu -cpu max" max neon test_kernels
run "test_kernels_invariant (neon gemm == neon vec_dot, bit for bit) under qemu -cpu max" max neon test_kernels_invariant
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
