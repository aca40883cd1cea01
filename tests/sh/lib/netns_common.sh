# tests/sh/lib/netns_common.sh: shared by the script tests that build a
# network of namespaces (not a test itself). Source it after `cd` to the
# repository root; it needs root and `ip netns`.

# nn_bridge BR BRIDGE PEER SUBNET NS...: a bridge BRIDGE in the (existing)
# namespace BR and, for each NS (created here), an eth0 whose peer PEERi (i
# from 1) is a port of the bridge, with address SUBNET.i/24 (SUBNET: the first
# three octets, e.g. 10.77.0); lo is up in each. Failures are counted by bad.
nn_bridge() {
    nn_br=$1 nn_bridge=$2 nn_peer=$3 nn_net=$4
    shift 4
    ip -n "$nn_br" link add "$nn_bridge" type bridge && ip -n "$nn_br" link set "$nn_bridge" up || bad "bridge"
    nn_i=1
    for nn_ns in "$@"; do
        ip netns add "$nn_ns"
        ip -n "$nn_ns" link set lo up
        ip link add name eth0 netns "$nn_ns" type veth peer name "$nn_peer$nn_i" netns "$nn_br"
        ip -n "$nn_br" link set "$nn_peer$nn_i" master "$nn_bridge"
        ip -n "$nn_br" link set "$nn_peer$nn_i" up
        ip -n "$nn_ns" addr add "$nn_net.$nn_i/24" dev eth0
        ip -n "$nn_ns" link set eth0 up
        nn_i=$((nn_i + 1))
    done
}
