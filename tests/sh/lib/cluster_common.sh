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
. tests/sh/lib/need.sh
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
# Each node plays a machine of its own: CUMULO_HOST_ID=cc-TAG (the planner
# divides a shared host's cores among its members, issue 19), unless
# CC_HOST_ID names one host for all (a test of sharing itself).
cc_start_node() {
    tag=$1
    shift
    rm -f "$TMP/$tag.port"
    case " $* " in *" --port "*) port_opt="" ;; *) port_opt="--port 0" ;; esac
    cc_nsx
    # shellcheck disable=SC2086
    [ -n "$CC_LOG_APPEND" ] || : >"$TMP/$tag.log"
    CUMULO_HOST_ID=${CC_HOST_ID:-cc-$tag} $CC_NSX "$BIN" node $port_opt --port-file "$TMP/$tag.port" --threads 1 --name "$tag" --cache "$TMP/cache-$tag" \
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

# ---- Requests whose text is compared with one machine's greedy text
# (cluster_recover.sh, cluster_deadline.sh, cluster_join.sh). Prompts are
# named by an index (1-4, cycling over CC_PROMPTS) or "long" ($LONG, set by
# the script).
CC_PROMPTS="Once upon a time|The little dog|Lily and Ben|One day"
cc_prompt() { if [ "$1" = long ]; then echo "$LONG"; else echo "$CC_PROMPTS" | cut -d'|' -f$(( ($1 - 1) % 4 + 1 )); fi; }

# cc_want MODEL N_TOK PROMPT...: one machine's greedy text of each PROMPT
# (N_TOK tokens; "long" ${LONG_TOK:-N_TOK}) into $TMP/wantPROMPT.
cc_want() {
    m=$1 n0=$2
    shift 2
    for i in "$@"; do
        n=$n0
        [ "$i" = long ] && n=${LONG_TOK:-$n0}
        "$BIN" run "$m" -p "$(cc_prompt "$i")" -n "$n" --temp 0 --threads 1 --json 2>/dev/null |
            perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' >"$TMP/want$i"
        [ -s "$TMP/want$i" ] || bad "no reference text for prompt $i"
    done
}

# cc_request TAG R PROMPT STREAM [MAX_TOKENS]: a greedy completion request to
# ${CC_HOST:-127.0.0.1}:${CC_PORT:-$SERVE_PORT} (from inside $CC_NS when set),
# in the background, answer in $TMP/TAG.rR.out; CP collects the pids. Tokens:
# MAX_TOKENS or $N_TOK; curl's limit ${CC_REQ_TIME:-120} s.
cc_request() {
    body=$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"stream":%s}' "$(cc_prompt "$3")" "${5:-$N_TOK}" "$4")
    cc_nsx
    $CC_NSX curl -sN --max-time "${CC_REQ_TIME:-120}" "http://${CC_HOST:-127.0.0.1}:${CC_PORT:-$SERVE_PORT}/v1/completions" \
        -H 'Content-Type: application/json' -d "$body" >"$TMP/$1.r$2.out" &
    CP="$CP $!"
}

# cc_check TAG R PROMPT STREAM: request R's text (the concatenation of its SSE
# chunks when STREAM is true) equals $TMP/wantPROMPT, with no error (event).
cc_check() {
    if [ "$4" = true ]; then
        perl -MJSON::PP -ne 'BEGIN { binmode STDOUT, ":utf8" } next unless s/^data: //; chomp; next if $_ eq "[DONE]"; my $j = decode_json($_);
            print STDERR "error event: $_\n" if $j->{error}; print $j->{choices}[0]{text} // ""' \
            <"$TMP/$1.r$2.out" >"$TMP/$1.got$2" 2>"$TMP/$1.err$2"
    else
        perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; my $j = eval { decode_json(<STDIN>) };
            if (!$j || $j->{error}) { print STDERR "error: ", ($j ? encode_json($j) : "not JSON"), "\n"; exit }
            print $j->{choices}[0]{text}' <"$TMP/$1.r$2.out" >"$TMP/$1.got$2" 2>"$TMP/$1.err$2"
    fi
    if cmp -s "$TMP/$1.got$2" "$TMP/want$3" && [ ! -s "$TMP/$1.err$2" ]; then ok; else
        bad "$1 request $2 (prompt $3, stream $4): got $(wc -c <"$TMP/$1.got$2") bytes vs $(wc -c <"$TMP/want$3") wanted;" \
            "$(head -c 200 "$TMP/$1.err$2") $(tail -c 300 "$TMP/$1.r$2.out")"
    fi
}

# cc_same_texts MAX WANT: 4 concurrent non-streaming greedy requests for "Once
# upon a time" (MAX tokens) to 127.0.0.1:$SERVE_PORT; each text must be WANT.
cc_same_texts() {
    CP=""
    for k in 1 2 3 4; do
        curl -s --max-time 60 "http://127.0.0.1:$SERVE_PORT/v1/completions" -H 'Content-Type: application/json' \
            -d '{"prompt":"Once upon a time","max_tokens":'"$1"',"temperature":0}' >"$TMP/r$k.json" &
        CP="$CP $!"
    done
    for p in $CP; do wait "$p"; done
    for k in 1 2 3 4; do
        got=$(perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{choices}[0]{text}' <"$TMP/r$k.json" 2>/dev/null)
        [ -n "$2" ] && [ "$got" = "$2" ] && ok || bad "serve request $k: '$got' vs '$2' ($(head -c 200 "$TMP/r$k.json"))"
    done
}

# cc_ref_case QUANT CASE: llama.cpp's reference case CASE of stories260K-QUANT
# ($SHARED/reference) at most 64 tokens: sets prompt, n, want (llama.cpp's
# ids) and local_ids (one machine's, checked equal to want).
cc_ref_case() {
    ref=$SHARED/reference/stories260K-$1.greedy.json
    prompt=$(cc_jsonget "$ref" '$j->{cases}['"$2"']{prompt}')
    n=$(cc_jsonget "$ref" '$j->{cases}['"$2"']{n_predict}')
    [ "$n" -gt 64 ] && n=64
    want=$(cc_jsonget "$ref" 'join(",", @{$j->{cases}['"$2"']{generated_tokens}}[0..'$((n - 1))'])')
    "$BIN" run "$SHARED/models/stories260K-$1.gguf" -p "$prompt" -n "$n" --temp 0 --threads 1 --json >"$TMP/local.json" 2>/dev/null
    local_ids=$(cc_jsonget "$TMP/local.json" 'join(",", @{$j->{tokens}})')
    [ "$local_ids" = "$want" ] && ok || bad "$1 case $2: single machine differs from llama.cpp"
}
