#!/usr/bin/env bash
# Two "hosts" on one machine for the MPI tests: the network namespaces
# dcpserve-10.231.7.1 and dcpserve-10.231.7.2, joined by a veth pair, each with only its
# own address. mpirun runs in the first and starts processes in the second through
# scripts/netns-rsh.sh (in place of ssh), and Open MPI's TCP transport carries the
# ranks' traffic over the veth pair. Needs root (ip netns).
#   scripts/netns-two-hosts.sh up     # (re)create them
#   scripts/netns-two-hosts.sh down   # remove them
set -euo pipefail
A=10.231.7.1
B=10.231.7.2
down() {
    ip netns del "dcpserve-$A" 2>/dev/null || true
    ip netns del "dcpserve-$B" 2>/dev/null || true
}
case "${1:-}" in
up)
    down
    ip netns add "dcpserve-$A"
    ip netns add "dcpserve-$B"
    ip link add dcpserve-va type veth peer name dcpserve-vb
    ip link set dcpserve-va netns "dcpserve-$A"
    ip link set dcpserve-vb netns "dcpserve-$B"
    ip -n "dcpserve-$A" addr add "$A/24" dev dcpserve-va
    ip -n "dcpserve-$B" addr add "$B/24" dev dcpserve-vb
    for ns in "dcpserve-$A:dcpserve-va" "dcpserve-$B:dcpserve-vb"; do
        ip -n "${ns%%:*}" link set lo up
        ip -n "${ns%%:*}" link set "${ns##*:}" up
    done
    ;;
down) down ;;
*)
    echo "usage: $0 up|down" >&2
    exit 2
    ;;
esac
