#!/bin/bash
# bind-time.sh FRAMES N [SWITCHD-ARG...]: a fresh oxvs-switchd
# (--umem-frames FRAMES, and the extra arguments) in a
# network namespace of its own, N veth ports added one by one with
# oxvsctl; prints the total time, the socket step of each add-port (the
# `socket_ms` of switchd's "AF_XDP socket attempt" line: XDP attach and
# the socket's bind) and the kernel's memory before and after the ports.
# Root; needs a release build (cargo build --release --workspace).
# docs/benchmarks.md, "ADD beyond a few dozen pods: the AF_XDP bind".
set -u
F=${1:-}; N=${2:-}
for v in "$F" "$N"; do
    case "$v" in
        "" | *[!0-9]*) echo "usage: $0 UMEM_FRAMES PORTS [SWITCHD-ARG...]" >&2; exit 2 ;;
    esac
done
shift 2
BIN=$(cd "$(dirname "$0")/../.." && pwd)/target/release
NS=oxbt$$; S=/tmp/oxbt$$.sock; LOG=/tmp/oxbt$$.log
cleanup() {
    pkill -f "oxvs-switchd --socket $S" 2>/dev/null
    sleep 0.5
    ip netns del "$NS" 2>/dev/null
    rm -f "$S" "$LOG"
}
trap cleanup EXIT
ip netns add "$NS" || exit 1
ip netns exec "$NS" "$BIN/oxvs-switchd" --socket "$S" --umem-frames "$F" "$@" \
    --log-level debug --ct-state-file '' > "$LOG" 2>&1 &
for _ in $(seq 50); do [ -S "$S" ] && break; sleep 0.1; done
[ -S "$S" ] || { echo "oxvs-switchd did not start:" >&2; cat "$LOG" >&2; exit 1; }
for i in $(seq 1 "$N"); do
    ip netns exec "$NS" ip link add "b$i" type veth peer name "c$i"
    ip netns exec "$NS" ip link set "b$i" up
    ip netns exec "$NS" ip link set "c$i" up
done
kmem() {
    awk '/^(VmallocUsed|Slab|MemAvailable):/ {printf "%s %d ", $1, $2/1024} END {print "MiB"}' /proc/meminfo
}
m0=$(kmem)
t0=$(date +%s%N)
for i in $(seq 1 "$N"); do
    ip netns exec "$NS" "$BIN/oxvsctl" --socket "$S" add-port "b$i" > /dev/null || echo "add-port b$i failed"
done
t1=$(date +%s%N)
m1=$(kmem)
echo "frames $F ${*:+($*) }ports $N: add-port total $(( (t1 - t0) / 1000000 )) ms"
echo "  kernel memory before the ports: $m0"
echo "  kernel memory after the ports:  $m1"
grep -o 'socket_ms=[0-9.]*' "$LOG" | cut -d= -f2 | sort -n |
    awk '{a[NR]=$1} END {print "  socket_ms n",NR,"p50",a[int((NR+1)/2)],"p90",a[int(NR*0.9)],"max",a[NR]}'
grep -o 'socket_ms=[0-9.]*' "$LOG" | cut -d= -f2 |
    awk '{if ($1>2) s++; else f++} END {print "  slow(>2ms)",s+0,"fast",f+0}'
