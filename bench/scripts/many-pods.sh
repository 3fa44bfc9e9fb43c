#!/bin/bash
# TCP between pods on a node with many pods: a 1-node oxvs-lab (binaries from
# each BINDIR) with PODS pods at the agent's default MTU (65535), then, one after
# another, iperf3 from pod p1 to p2 (1 stream), p3 to p4 (4 streams) and p5 to
# p6 (1 stream), 4 s each, ROUNDS rounds alternating the bin dirs. Prints the
# rate, the sender's retransmits and the frames the switch dropped meanwhile
# (`oxvsctl dump-ports`: fill ring empty + TX ring full, all ports). Root; the
# labs ("mp0", "mp1", ...) are taken down at the end.
# usage: bench/scripts/many-pods.sh ROUNDS PODS BINDIR [BINDIR...]
ROUNDS=${1:?rounds}; PODS=${2:?pods}; shift 2
cd "$(dirname "$0")/../.."
LAB=target/release/oxvs-lab; CTL=target/release/oxvsctl
manifest=$(mktemp /tmp/many-pods.XXXXXX.yaml)
labs=()
cleanup() { for l in "${labs[@]}"; do $LAB --name "$l" down >/dev/null 2>&1; done; rm -f "$manifest"; }
trap cleanup EXIT
{ printf -- "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: m\n"
  for i in $(seq 1 "$PODS"); do
    printf -- "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p%d\n  namespace: m\nspec:\n  nodeName: node-1\n  containers:\n  - name: c\n    image: oxvs-lab/serve\n" "$i"
  done; } > "$manifest"
i=0
for b in "$@"; do
  l=mp$i; i=$((i + 1)); labs+=("$l")
  $LAB --name $l down >/dev/null 2>&1
  $LAB --name $l --bin-dir "$b" up --nodes 1 >/dev/null 2>&1 || { echo "up failed for $b"; exit 1; }
  $LAB --name $l apply -f "$manifest" >/dev/null 2>&1 || { echo "apply failed for $b"; exit 1; }
done
drops() {
  $CTL --socket /run/oxvs-lab/$1/node-1/switchd.sock dump-ports \
    | grep -o "fill ring empty=[0-9]*\|ring full=[0-9]*" | awk -F= '{s+=$2} END {print s+0}'
}
# pod ip: p<n> is 10.244.1.<n+1> (the lab's IPAM hands them out in order).
stream() { # lab src dst streams
  local l=$1 src=$2 dst=$3 n=$4
  $LAB --name $l exec m/p$dst -- sh -c 'iperf3 -s -D -1 >/dev/null'; sleep 0.3
  local before; before=$(drops $l)
  local r; r=$($LAB --name $l exec m/p$src -- iperf3 -c 10.244.1.$((dst + 1)) -P$n -t 4 -J \
    | python3 -c 'import json,sys; s=json.load(sys.stdin)["end"]["sum_sent"]; print("%.2f Gbit/s retr %d" % (s["bits_per_second"]/1e9, s.get("retransmits",0)))')
  echo "$r dropped $(( $(drops $l) - before ))"
}
for r in $(seq 1 "$ROUNDS"); do
  i=0
  for b in "$@"; do
    l=mp$i; i=$((i + 1))
    echo "$b round $r: p1->p2 x1: $(stream $l 1 2 1) | p3->p4 x4: $(stream $l 3 4 4) | p5->p6 x1: $(stream $l 5 6 1)"
  done
done
