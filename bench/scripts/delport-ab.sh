#!/bin/bash
# A port's teardown, N ports, timed one by one: del-port then the veth's
# deletion (or, with ORDER veth-first, the other way round); prints per
# port the microseconds of the first step, the second, and both. A switchd
# in its own namespace; BINDIR holds oxvs-switchd and oxvsctl.
# Usage (root): bench/scripts/delport-ab.sh BINDIR N [port-first|veth-first]
set -e
B=$1; N=$2; ORDER=${3:-port-first}
case "$ORDER" in
  veth-first) first=del_link; second=del_port ;;
  port-first) first=del_port; second=del_link ;;
  *) echo "ORDER must be port-first or veth-first, not '$ORDER'" >&2; exit 2 ;;
esac
NS=dpab$$
ip netns add $NS
trap 'ip netns del $NS' EXIT
S=/tmp/$NS.sock
ip netns exec $NS ip link set lo up
ip netns exec $NS $B/oxvs-switchd --socket $S > /tmp/$NS.log 2>&1 &
SW=$!
# Also on failure: switchd stops, the namespace (and its links) goes.
trap 'kill $SW 2>/dev/null; sleep 0.5; ip netns del $NS' EXIT
sleep 1.5
for i in $(seq 1 $N); do
  ip netns exec $NS ip link add dv$i type veth peer name dvp$i
  ip netns exec $NS ip link set dv$i up; ip netns exec $NS ip link set dvp$i up
  ip netns exec $NS $B/oxvsctl --socket $S add-port dv$i >/dev/null
done
sleep 0.5
del_port() { ip netns exec $NS $B/oxvsctl --socket $S del-port "$1"; }
del_link() { ip netns exec $NS ip link del "$1"; }
for i in $(seq 1 $N); do
  t0=$(date +%s%N)
  $first dv$i
  t1=$(date +%s%N)
  $second dv$i
  t2=$(date +%s%N)
  echo "$(( (t1-t0)/1000 )) $(( (t2-t1)/1000 )) $(( (t2-t0)/1000 ))"
done
