#!/bin/bash
# An idle pod's first TCP burst: a 2-node oxvs-lab with the example pods
# (binaries from BINDIR), 2 s iperf3 streams from x/a to a pod on its node and
# one across, right after another and after 30 s idle; first a stream from each
# of three fresh pods. Prints retransmits, then every port that lost frames
# to an empty fill ring. Root; takes the lab "ib" down at the end.
# usage: bench/scripts/idle-burst.sh BINDIR LABEL [ROUNDS]
B=$1; LABEL=$2; ROUNDS=${3:-3}
cd "$(dirname "$0")/../.."
trap 'target/release/oxvs-lab --name ib down >/dev/null 2>&1' EXIT
L="target/release/oxvs-lab --name ib --bin-dir $B"
$L down >/dev/null 2>&1
$L up --nodes 2 >/dev/null 2>&1 || { echo "up failed"; exit 1; }
$L apply -f examples/lab/pods.yaml >/dev/null 2>&1
$L exec y/b -- iperf3 -s -D -p 5201; $L exec x/b -- iperf3 -s -D -p 5201; sleep 1
for src in x/c z/a z/c; do
  rt=$($L exec $src -- iperf3 -c 10.244.2.2 -t 2 | awk '/sender/{print $7" "$8" retr="$9}')
  echo "$LABEL fresh port $src across: $rt"; sleep 1
done
for r in $(seq 1 $ROUNDS); do
  for dst in 10.244.1.4 10.244.2.2; do
    for w in 0 30; do
      sleep $w
      rt=$($L exec x/a -- iperf3 -c $dst -t 2 | awk '/sender/{print $7" "$8" retr="$9}')
      echo "$LABEL round $r dst $dst idle ${w}s: $rt"; sleep 1
    done
  done
done
target/release/oxvsctl --socket /run/oxvs-lab/ib/node-1/switchd.sock dump-ports | grep -B2 "fill ring empty=[1-9]"
