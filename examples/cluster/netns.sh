#!/bin/sh
# Network namespaces for the cluster examples: one per server, each with
# the address of its server ID (10.77.0.N/24) and the MAC 02:77:00:00:00:0N
# on a veth `eth0` joined to a bridge in a hub namespace. As root:
#
#   examples/cluster/netns.sh up 3      # namespaces uc-s1 … uc-s3
#   ip netns exec uc-s1 uniplaned --cluster examples/cluster/three-servers.toml &
#   …
#   examples/cluster/netns.sh down 3
set -eu
n=${2:-2}
case "${1:-}" in
up)
    ip netns add uc-hub
    ip -n uc-hub link add br0 type bridge
    ip -n uc-hub link set br0 up
    i=1
    while [ "$i" -le "$n" ]; do
        ip netns add "uc-s$i"
        ip link add eth0 netns "uc-s$i" type veth peer name "s$i" netns uc-hub
        ip -n uc-hub link set "s$i" master br0
        ip -n uc-hub link set "s$i" up
        ip -n "uc-s$i" link set eth0 address "02:77:00:00:00:0$i"
        ip -n "uc-s$i" addr add "10.77.0.$i/24" dev eth0
        ip -n "uc-s$i" link set eth0 up
        ip -n "uc-s$i" link set lo up
        i=$((i + 1))
    done
    ;;
down)
    i=1
    while [ "$i" -le "$n" ]; do
        ip netns del "uc-s$i" 2>/dev/null || true
        i=$((i + 1))
    done
    ip netns del uc-hub 2>/dev/null || true
    ;;
*)
    echo "usage: $0 up|down [SERVERS]" >&2
    exit 2
    ;;
esac
