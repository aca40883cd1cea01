#!/bin/sh
# tests/sh/cli_options.sh: every command keeps taking the cluster options it
# took before they got one parser (src/cli/clusteropt.c): for each command
# and each of its options, the option (with a value) followed by a bad
# --threads (or --timeout, --ctx, --port) must fail on that last option, not
# with "unknown option"; its --help lists the option; a bad or missing value
# is one line that says what the option needs; and the options a command
# never took are still refused (the sets below are the commands' contracts:
# widen one here when a command learns an option). Parsing only: no model
# loads, no node starts (a command that no longer refuses a bad value may
# start serving: every call has a time limit).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$SHARED/models/stories260K-f32.gguf

# The value each option takes ("" for a flag).
val() {
    case $1 in
    --nodes) echo 127.0.0.1:1 ;;
    --key-file) echo "$TMP/none.key" ;;
    --layers | --groups | --tp-weights) echo 1,1 ;;
    --parallel) echo pp ;;
    --expert-load) echo off ;;
    *) echo "" ;;
    esac
}
# The bad last option of each command and the start of its error.
sentinel() {
    case $1 in
    nodes) echo "--timeout x|option '--timeout': 'x' is not a number" ;;
    plan) echo "--ctx x|option '--ctx': 'x' is not an integer" ;;
    launch) echo "--port x|option '--port': 'x' is not an integer" ;;
    *) echo "--threads x|option '--threads': 'x' is not an integer" ;;
    esac
}
# The positional arguments each command starts with.
pos() {
    case $1 in
    run | chat | serve | bench | finetune) echo "$M" ;;
    launch) echo user@host.invalid ;;
    *) echo "" ;;
    esac
}

ALL="--cluster --nodes --insecure --key-file --take --tp-compress --layers --parallel --groups --tp-weights --expert-load"
TAKES_run="$ALL"
TAKES_chat="--cluster --nodes --insecure --key-file"
TAKES_serve="--nodes --insecure --key-file --take --tp-compress --layers --parallel --groups --tp-weights --expert-load"
TAKES_bench="--cluster --nodes --insecure --key-file --tp-compress --parallel --groups"
TAKES_finetune="--cluster --nodes --insecure --key-file --take --layers --parallel --groups --tp-weights --expert-load"
TAKES_node="--insecure --key-file"
TAKES_nodes="--insecure --key-file --nodes"
TAKES_plan="--insecure --key-file --nodes"
TAKES_launch="--insecure --key-file"
OWN_plan="--parallel" # plan's own: the simulated plan's mode

# run CMD OPT...: the command with its positional arguments, then the options, then its bad last option.
try() {
    cmd=$1
    shift
    s=$(sentinel "$cmd")
    # shellcheck disable=SC2046
    timeout 30 "$BIN" "$cmd" $(pos "$cmd") "$@" ${s%%|*} >"$TMP/o.out" 2>"$TMP/o.err"
}

for cmd in run chat serve bench finetune node nodes plan launch; do
    eval takes=\$TAKES_$cmd
    eval own=\${OWN_$cmd:-}
    s=$(sentinel "$cmd")
    want=${s#*|}
    "$BIN" "$cmd" --help >"$TMP/help.txt" 2>&1 || bad "$cmd --help failed"
    for o in $ALL; do
        v=$(val "$o")
        case " $own " in *" $o "*) continue ;; esac
        case " $takes " in
        *" $o "*)
            # shellcheck disable=SC2086
            try "$cmd" "$o" $v
            st=$?
            [ $st -eq 1 ] && grep -q "$want" "$TMP/o.err" && ok ||
                bad "$cmd no longer takes $o: status $st, $(cat "$TMP/o.err")"
            grep -q -e " $o[ ,]" "$TMP/help.txt" && ok || bad "$cmd --help does not list $o"
            ;;
        *)
            # shellcheck disable=SC2086
            try "$cmd" "$o" $v
            grep -q "unknown option '$o'" "$TMP/o.err" && ok ||
                bad "$cmd now takes $o (or says something else): $(cat "$TMP/o.err")"
            ;;
        esac
    done
    # All of them at once (the order of a real command line).
    args=""
    for o in $takes; do args="$args $o $(val "$o")"; done
    # shellcheck disable=SC2086
    try "$cmd" $args
    grep -q "$want" "$TMP/o.err" && ok || bad "$cmd with all of$args: $(cat "$TMP/o.err")"
done

# The engine's options (cli_engine_opt) and sampling's (cli_gen_opt), the same way.
for cmd in run chat serve; do
    s=$(sentinel "$cmd")
    for o in "--mmap" "--ctx 64" "--lora x.gguf" "--kv-type f16" "-ctk q8_0" "-ctv f16" "-fa" "--gpu none" "-ngl 0" \
        "--temp 0" "--top-k 1" "--top-p 1" "--min-p 0" "--repeat-penalty 1" "--seed 1"; do
        case "$cmd:$o" in serve:--t* | serve:--m*-p* | serve:--r* | serve:--s*) continue ;; esac # no sampling
        # shellcheck disable=SC2086
        try "$cmd" $o
        grep -q "${s#*|}" "$TMP/o.err" && ok || bad "$cmd no longer takes $o: $(cat "$TMP/o.err")"
    done
done

# expect_error NAME PATTERN -- command...: status 1, one line on stderr matching PATTERN.
expect_error() {
    name=$1 pat=$2
    shift 2
    timeout 30 "$@" >"$TMP/e.out" 2>"$TMP/e.err"
    st=$?
    if [ "$st" -ne 1 ] || [ "$(wc -l <"$TMP/e.err")" -ne 1 ] || ! grep -q -e "$pat" "$TMP/e.err"; then
        bad "$name: status $st, stderr: $(cat "$TMP/e.err")"
    else
        ok
    fi
}
for cmd in run chat serve bench finetune; do
    expect_error "$cmd --nodes without a value" "option '--nodes' needs auto or HOST:PORT" "$BIN" "$cmd" "$M" --nodes
    try "$cmd" --nodes "" # taken as before (this machine alone): scripts pass --nodes "$NODES"
    grep -q "option '--threads'" "$TMP/o.err" && ok || bad "$cmd --nodes '': $(cat "$TMP/o.err")"
done
for cmd in run chat serve bench finetune node nodes plan launch; do
    expect_error "$cmd --key-file without a value" "option '--key-file' needs a FILE" "$BIN" "$cmd" --key-file
done
for cmd in run serve bench finetune; do
    expect_error "$cmd --parallel bad" "option '--parallel' needs pp, tp, hybrid, ep or auto, not 'bogus'" \
        "$BIN" "$cmd" "$M" --parallel bogus
    expect_error "$cmd --groups bad" "option '--groups' needs up to .* positive counts" "$BIN" "$cmd" "$M" --groups 2,x
done
for cmd in run serve finetune; do
    more=""
    [ $cmd = finetune ] && more="--data x --out y" # finetune checks these before the plan
    expect_error "$cmd --layers bad" "option '--layers' needs up to .* positive counts like 2,1,2, not '0'" \
        "$BIN" "$cmd" "$M" --layers 0
    expect_error "$cmd --tp-weights bad" "option '--tp-weights' needs positive numbers" "$BIN" "$cmd" "$M" --tp-weights -1
    expect_error "$cmd --expert-load bad" "option '--expert-load' needs one routing count per expert" \
        "$BIN" "$cmd" "$M" --expert-load 1,x
    # shellcheck disable=SC2086
    expect_error "$cmd --layers with tp" "--layers splits a pipeline; it does not go with --parallel tp" \
        "$BIN" "$cmd" "$M" $more --layers 1,1 --parallel tp
done
expect_error "finetune --layers vs --groups" "--layers names 2 stages, --groups 3" \
    "$BIN" finetune "$M" --data x --out y --layers 1,1 --groups 1,1,1
expect_error "run --layers vs --groups" "--layers names 2 stages, --groups 3" "$BIN" run "$M" --layers 1,1 --groups 1,1,1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
