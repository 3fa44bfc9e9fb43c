#!/bin/bash
# Where the CPU goes during one TCP stream of an e2e setup: runs
# `target/release/e2e --only SETUP` (one 14 s stream, pods' offloads on, pod
# MTU 65535 where the setup takes it) and `perf record -a -g` for 8 s in its
# middle, then prints the machine's samples by command and DSO, and the
# inclusive share of the main syscalls and functions (SETUP: vxlan-oxvs,
# vxlan-kernel, oxvs, bridge, ...). Root, perf installed.
# usage: [STREAMS=N] bench/scripts/profile-e2e.sh SETUP OUT   (writes OUT.data, OUT.e2e.txt;
#        N parallel streams, default 1)
setup=$1; out=$2
[ -n "$setup" ] && [ -n "$out" ] || { echo "usage: $0 SETUP OUT" >&2; exit 2; }
cd "$(dirname "$0")/../.." || exit 1
target/release/e2e --only "$setup" --tcp-only --offloads on --mtu 65535 --streams "${STREAMS:-1}" \
    --trials 1 --duration 14 > "$out.e2e.txt" 2>&1 &
e=$!
for _ in $(seq 1 600); do pgrep -f "iperf3 .*-c " >/dev/null && break; sleep 0.1; done
sleep 3
perf record -a -g -o "$out.data" -- sleep 8 > /dev/null 2>&1
wait $e
grep -E "Gbit/s, " "$out.e2e.txt"
echo "## samples by command and DSO (both CPUs = 100 %)"
perf report -i "$out.data" --no-children --sort comm,dso --stdio -g none 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | head -10
echo "## inclusive share (children) of the main syscalls and functions"
perf report -i "$out.data" --children --sort comm,sym --stdio -g none 2>/dev/null \
    | grep -v '^#' | grep -v '^$' \
    | grep -E "__libc_sendto|__libc_sendmsg|__recvmmsg|__poll|handle_softirqs|tcp_v4_rcv|tcp_sendmsg|udp_sendmsg|udp_recvmsg|raw_sendmsg|__xsk_generic_xmit|vxlan_xmit|vxlan_rcv|TcpCut::write|complete_l4|coalesce|verified_payload_sum|memmove|_copy_to_iter|_copy_from_iter" \
    | head -30
