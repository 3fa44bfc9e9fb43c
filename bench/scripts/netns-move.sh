#!/bin/bash
# netns-move.sh N: what a pool of veths made (and their ports bound) ahead
# of the pods would cost at ADD. Times, N times each, the one netlink
# request (RTM_NEWLINK, as `strace -T` sees the `sendmsg`) that
#   create: makes a veth pair with its peer directly in a pod's
#           namespace, named eth0 (what the agent's ADD does), and
#   move:   moves the peer of a veth made beforehand into a pod's
#           namespace, renaming it eth0 (what a pool would do at ADD).
# Every pair lives in namespaces of its own, removed on exit.
# (`ip -n` hides the socket's protocol from strace, which then prints
# RTM_NEWLINK as type 0x10.) Root; needs strace.
# docs/benchmarks.md, "ADD beyond a few dozen pods: the AF_XDP bind".
set -u
N=${1:-}
case "$N" in "" | *[!0-9]*) echo "usage: $0 N" >&2; exit 2 ;; esac
command -v strace > /dev/null || { echo "SKIPPED: no strace" >&2; exit 0; }
H=oxnm$$
cleanup() {
    for i in $(seq 1 "$N"); do
        ip netns del "${H}c$i" 2>/dev/null
        ip netns del "${H}m$i" 2>/dev/null
    done
    ip netns del "${H}h" 2>/dev/null
}
trap cleanup EXIT
ip netns add "${H}h" || exit 1
# The time of the first RTM_NEWLINK `sendmsg` of an `ip` command, in ms.
newlink_ms() {
    strace -T -e trace=sendmsg "$@" 2>&1 >/dev/null |
        awk '/nlmsg_type=(RTM_NEWLINK|0x10 )/ { if (match($0, /<[0-9.]+>$/)) { print substr($0, RSTART + 1, RLENGTH - 2) * 1000; exit } }'
}
create=() move=()
for i in $(seq 1 "$N"); do
    ip netns add "${H}c$i" && ip netns add "${H}m$i" || exit 1
    create+=("$(newlink_ms ip -n "${H}h" link add "c$i" type veth peer name eth0 netns "${H}c$i")")
    ip -n "${H}h" link add "m$i" type veth peer name "p$i" || exit 1
    ip -n "${H}h" link set "m$i" up
    move+=("$(newlink_ms ip -n "${H}h" link set dev "p$i" netns "${H}m$i" name eth0)")
done
stats() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
        printf "n %d p50 %.3f min %.3f max %.3f ms\n", NR, v[int((NR + 1) / 2)], v[1], v[NR] }'
}
echo "create (peer made in the pod namespace): $(stats "${create[@]}")"
echo "move (an existing peer moved there and renamed): $(stats "${move[@]}")"
