#!/bin/sh
# cluster_cli_edges.sh (issue 19, item 7, the node side): `cumulo nodes`
# exits non-zero when no node answers (none found, or all unreachable) and
# prints a node's whole ISA string (it was cut to 8 characters); `cumulo
# discover` says when it finds nothing, also with --watch and --json (they
# printed nothing, or a bare []), in a network namespace of its own so that
# nodes of other tests on this machine cannot answer; a node logs the stage
# it takes (checked in cluster_lease.sh).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl python3

"$BIN" nodes --no-mdns >"$TMP/n0.out" 2>"$TMP/n0.err"
rc=$?
[ $rc -eq 1 ] && grep -q "no nodes found (mDNS off, no --nodes given)" "$TMP/n0.err" && ok || bad "nodes, none: rc $rc, $(cat "$TMP/n0.err")"
dead=$(cc_free_port)
"$BIN" nodes --no-mdns --nodes "127.0.0.1:$dead" >"$TMP/n1.out" 2>"$TMP/n1.err"
rc=$?
[ $rc -eq 1 ] && grep -q "unreachable" "$TMP/n1.out" && grep -q "none of the 1 node answered" "$TMP/n1.err" && ok ||
    bad "nodes, unreachable: rc $rc, $(cat "$TMP/n1.out" "$TMP/n1.err")"
"$BIN" nodes --no-mdns --nodes "127.0.0.1:$dead" --json >"$TMP/n1.json" 2>/dev/null
rc=$?
[ $rc -eq 1 ] && [ "$(cc_jsonget "$TMP/n1.json" '$j->[0]{reachable} ? 1 : 0')" = 0 ] && ok || bad "nodes --json, unreachable: rc $rc"

cc_start_node na --bind 127.0.0.1 --no-mdns
[ -n "$NODE_PORT" ] || bad "node did not start: $(tail -3 "$TMP/na.log")"
"$BIN" nodes --no-mdns --nodes "127.0.0.1:$NODE_PORT,127.0.0.1:$dead" >"$TMP/n2.out" 2>"$TMP/n2.err"
rc=$?
"$BIN" nodes --no-mdns --nodes "127.0.0.1:$NODE_PORT" --json >"$TMP/n2.json" 2>/dev/null
isa=$(cc_jsonget "$TMP/n2.json" '$j->[0]{isa}')
[ $rc -eq 0 ] && [ ${#isa} -gt 8 ] && grep -qF "$isa" "$TMP/n2.out" && ok ||
    bad "nodes, one up: rc $rc, isa '$isa' not whole in: $(cat "$TMP/n2.out")"

# discover: a namespace with one multicast interface and nobody on it
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
    echo "skip: discover checks need root, unshare and ip" >&2
    echo "$pass passed, $fail failed, 1 skipped"
    [ "$fail" -eq 0 ]
    exit
fi
for mode in "" "--json" "--watch"; do
    timeout 20 unshare -n sh -c 'ip link set lo up && ip link add va type veth peer name vb && ip link set va multicast on up &&
        ip link set vb up && ip addr add 10.99.0.1/24 dev va && exec "$0" discover --timeout 0.5 $1' "$BIN" "$mode" \
        >"$TMP/d.out" 2>"$TMP/d.err"
    rc=$?
    [ $rc -eq 0 ] && grep -q "no nodes found in 0.5 s" "$TMP/d.err" && ok || bad "discover $mode: rc $rc, $(cat "$TMP/d.out" "$TMP/d.err")"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
