# tests/sh/lib/cluster_common.sh: shared by the cluster script tests (not a
# test itself: tests/run.sh only runs tests/sh/*.sh). Source it after `cd` to
# the repository root. It counts checks (ok/bad), makes a temporary folder and
# a cluster key, starts `cumulo node` / `cumulo serve` processes (on loopback,
# or inside a network namespace when CC_NS names one) and waits for their
# ports, and on exit kills every process it started (SIGCONT first, so a
# stopped one dies too) and removes the folder. It never touches a network
# namespace it did not create; scripts that make namespaces clean them up in
# cc_cleanup_hook.
BIN=$(realpath "${CUMULO_BIN:-build/cumulo}")
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
MODELS=$(realpath "$SHARED/models")
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
TMP=$(mktemp -d /tmp/cmcluster.XXXXXX)
chmod 755 "$TMP"
CC_PIDS=""
cc_cleanup_hook() { :; }
cc_cleanup() {
    for p in $CC_PIDS; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    for p in $CC_PIDS; do wait "$p" 2>/dev/null; done
    cc_cleanup_hook
    if [ -n "$CUMULO_KEEP_TMP" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cc_cleanup EXIT
trap 'exit 1' INT TERM HUP

# cc_key FILE: create a fresh cluster key in FILE (mode 0600).
cc_key() { CUMULO_KEY_FILE=$1 "$BIN" key --new --force >/dev/null 2>&1; }
export CUMULO_KEY_FILE="$TMP/cluster.key"
cc_key "$CUMULO_KEY_FILE"

# cc_in_ns CMD...: run CMD inside $CC_NS when it is set. (Not for background
# jobs whose PID matters: `fn &` forks a shell that waits for CMD, so a signal
# to $! would not reach CMD; `ip netns exec` itself execs CMD.)
cc_in_ns() { if [ -n "$CC_NS" ]; then ip netns exec "$CC_NS" "$@"; else "$@"; fi; }
# The prefix that runs a command in $CC_NS (empty: here), for `$CC_NSX cmd &`.
cc_nsx() { CC_NSX=""; [ -n "$CC_NS" ] && CC_NSX="ip netns exec $CC_NS"; }

# cc_wait_grep FILE REGEX [TENTHS]: wait until FILE has a line matching REGEX
# (default 10 s); non-zero when it never does.
cc_wait_grep() {
    k=0
    while ! grep -qE "$2" "$1" 2>/dev/null; do
        k=$((k + 1))
        [ $k -gt "${3:-100}" ] && return 1
        sleep 0.1
    done
}

# cc_start_node TAG [node options...]: `cumulo node` on a free port (--port 0
# unless the options give one), log in $TMP/TAG.log. Sets NODE_PID and
# NODE_PORT (empty when it did not start within 10 s). With CC_NOWAIT set it
# returns at once (several nodes start together; wait for $TMP/TAG.port).
# With CC_LOG_APPEND set, a restarted TAG appends to its log.
cc_start_node() {
    tag=$1
    shift
    rm -f "$TMP/$tag.port"
    case " $* " in *" --port "*) port_opt="" ;; *) port_opt="--port 0" ;; esac
    cc_nsx
    # shellcheck disable=SC2086
    [ -n "$CC_LOG_APPEND" ] || : >"$TMP/$tag.log"
    $CC_NSX "$BIN" node $port_opt --port-file "$TMP/$tag.port" --threads 1 --name "$tag" --cache "$TMP/cache-$tag" \
        "$@" >>"$TMP/$tag.log" 2>&1 &
    NODE_PID=$!
    CC_PIDS="$CC_PIDS $NODE_PID"
    [ -n "$CC_NOWAIT" ] && return 0 # the caller waits for $TMP/TAG.port itself
    k=0
    while [ ! -s "$TMP/$tag.port" ] && [ $k -lt 100 ] && kill -0 "$NODE_PID" 2>/dev/null; do sleep 0.1; k=$((k + 1)); done
    NODE_PORT=$(cat "$TMP/$tag.port" 2>/dev/null)
}

# cc_start_serve TAG MODEL [serve options...]: `cumulo serve` on a free port,
# stderr in $TMP/TAG.log. Sets SERVE_PID and SERVE_PORT (empty on failure,
# after up to 30 s).
cc_start_serve() {
    tag=$1 model=$2
    shift 2
    cc_nsx
    $CC_NSX "$BIN" serve "$model" --port 0 "$@" >"$TMP/$tag.out" 2>"$TMP/$tag.log" &
    SERVE_PID=$!
    CC_PIDS="$CC_PIDS $SERVE_PID"
    SERVE_PORT=""
    k=0
    while ! grep -q 'ready:' "$TMP/$tag.log" 2>/dev/null; do
        k=$((k + 1))
        if [ $k -gt 300 ] || ! kill -0 "$SERVE_PID" 2>/dev/null; then return 1; fi
        sleep 0.1
    done
    SERVE_PORT=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\)\/.*/\1/p' "$TMP/$tag.log" | head -1)
}

# cc_stop PID: SIGTERM (after SIGCONT), then SIGKILL after 3 s.
cc_stop() {
    kill -CONT "$1" 2>/dev/null
    kill "$1" 2>/dev/null || return 0
    k=0
    while kill -0 "$1" 2>/dev/null && [ $k -lt 30 ]; do sleep 0.1; k=$((k + 1)); done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}

# cc_free_port: a TCP port nothing listens on now (for tools that cannot take 0).
cc_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# cc_jsonget FILE PERL-EXPR: evaluate PERL-EXPR with $j = the file's JSON.
cc_jsonget() {
    perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or exit 2; my $j = decode_json(<$f>); print eval $ARGV[1]' "$1" "$2"
}
