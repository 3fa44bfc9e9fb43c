#!/bin/bash
# bind-time.sh FRAMES N: a fresh oxvs-switchd (--umem-frames FRAMES) in its own netns, N veth ports added one by one; prints the socket step of each add-port (switchd's socket_ms). Root; release build.
F=$1; N=$2; NS=bt$$; S=/tmp/bt$$.sock
ip netns add $NS
cleanup() { ip netns exec $NS pkill -f "oxvs-switchd --socket $S" ; sleep 0.5; ip netns del $NS; rm -f $S /tmp/bt$$.log; }
trap cleanup EXIT
ip netns exec $NS $(cd "$(dirname "$0")/../.." && pwd)/target/release/oxvs-switchd --socket $S --umem-frames $F --log-level debug --ct-state-file '' > /tmp/bt$$.log 2>&1 &
sleep 1
for i in $(seq 1 $N); do ip netns exec $NS ip link add b$i type veth peer name c$i; ip netns exec $NS ip link set b$i up; ip netns exec $NS ip link set c$i up; done
kmem() { awk '/^(VmallocUsed|Slab|MemAvailable):/ {printf "%s %d ", $1, $2/1024} END {print "MiB"}' /proc/meminfo; }
m0=$(kmem)
t0=$(date +%s%N)
for i in $(seq 1 $N); do ip netns exec $NS $(cd "$(dirname "$0")/../.." && pwd)/target/release/oxvsctl --socket $S add-port b$i >/dev/null || echo fail $i; done
t1=$(date +%s%N)
m1=$(kmem)
echo "frames $F ports $N: add-port total $(( (t1-t0)/1000000 )) ms"
echo "  kernel memory before the ports: $m0"
echo "  kernel memory after the ports:  $m1"
grep -o 'socket_ms=[0-9.]*' /tmp/bt$$.log | cut -d= -f2 | sort -n | awk '{a[NR]=$1} END {print "  socket_ms n",NR,"p50",a[int((NR+1)/2)],"p90",a[int(NR*0.9)],"max",a[NR]}'
grep -o 'socket_ms=[0-9.]*' /tmp/bt$$.log | cut -d= -f2 | awk '{if ($1>2) s++; else f++} END {print "  slow(>2ms)",s+0,"fast",f+0}'
