#!/bin/bash
# Does copy-mode AF_XDP honour the TX metadata checksum request
# (XDP_TXMD_FLAGS_CHECKSUM) here? Builds bench/probes/txmd.c, makes a veth pair
# (one end in a new namespace with a UDP listener), and sends the same UDP
# datagram out of an AF_XDP socket on the other end twice: its checksum field
# holding only the pseudo-header sum (what a CHECKSUM_PARTIAL sender leaves),
# once with the request and once without. With the request the receiver takes
# it (the skb is CHECKSUM_PARTIAL); without, the kernel counts a checksum
# error. Root, gcc. Prints the receiver's UDP counters after each send.
set -e
cd "$(dirname "$0")"
tag=txmd$$; ns=$tag-r; a=${tag}A; b=${tag}B
out=$(mktemp -d)
trap 'ip netns del $ns 2>/dev/null; ip link del $a 2>/dev/null; rm -rf "$out"' EXIT
gcc -O2 -o "$out/txmd" txmd.c
ip netns add $ns
ip link add $a type veth peer name $b
ip link set $b netns $ns
ip link set $a up; ip -n $ns link set $b up; ip -n $ns link set lo up
ip -n $ns addr add 10.99.0.2/24 dev $b
mac=$(ip -n $ns -j link show $b | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["address"])')
ip netns exec $ns python3 -c '
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9999)); s.settimeout(4)
n = 0
try:
    while True:
        d = s.recv(2000); n += 1
        print("receiver: got", len(d), "bytes, payload intact:", all(d[i] == (i * 7) & 255 for i in range(len(d))), flush=True)
except OSError:
    print("receiver: datagrams received:", n)' &
sleep 0.5
counters() { ip netns exec $ns nstat -az UdpInDatagrams UdpInCsumErrors | grep -v '^#' | awk '{printf "%s=%s ", $1, $2}'; echo; }
"$out/txmd" $a "$mac" 1; counters
sleep 1   # the first socket's unbind (an RCU grace period) before the next bind
"$out/txmd" $a "$mac" 0; counters
wait
