# tests/sh/lib/need.sh: what a test script cannot run without, said at its
# top. When something is missing the test reports a skip with the reason (a
# "skip:" line and "N passed, N failed, 1 skipped": the form tests/run.sh
# counts) and exits (0, unless checks before it failed); under CI=true that
# skip fails the run, since scripts/setup.sh installs every tool and CI runs
# as root. A missing tool must never end as "0 passed, 0 failed", nor as a
# failure that names something else.

# need_skip REASON...: report the skip and exit.
need_skip() {
    echo "skip: $*"
    echo "${pass:-0} passed, ${fail:-0} failed, 1 skipped"
    [ "${fail:-0}" -eq 0 ]
    exit $?
}

# need TOOL...: each on PATH.
need() {
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 || need_skip "needs $t, which is not installed here (scripts/setup.sh installs it)"
    done
}

# need_netns NAME: root, and the network namespace NAME made (the caller
# deletes it on exit).
need_netns() {
    [ "$(id -u)" = 0 ] || need_skip "needs root (network namespaces)"
    need ip
    need_err=$(ip netns add "$1" 2>&1) || need_skip "cannot make a network namespace: ip netns add $1: $need_err"
}
