#!/bin/bash
# One TCP stream across nodes and what it costs the switches: a 2-node
# oxvs-lab with the example pods (binaries from BINDIR), TRIALS iperf3
# streams of SECONDS from x/a (node-1) to x/b (node-2), each with the CPU
# time both switchds used during it (/proc/PID/stat, user and system). Prints
# per trial the Gbit/s, the retransmits and the switches' CPU milliseconds per
# GB carried. Root; takes the lab "tc" down at the end.
# usage: bench/scripts/tunnel-cpu.sh BINDIR LABEL [TRIALS] [SECONDS]
B=$1; LABEL=$2; TRIALS=${3:-3}; SECS=${4:-6}
cd "$(dirname "$0")/../.." || exit 1
trap 'target/release/oxvs-lab --name tc down >/dev/null 2>&1' EXIT
L="target/release/oxvs-lab --name tc --bin-dir $B"
$L down >/dev/null 2>&1
$L up --nodes 2 >/dev/null 2>&1 || { echo "up failed"; exit 1; }
$L apply -f examples/lab/pods.yaml >/dev/null 2>&1
$L exec x/b -- iperf3 -s -D -p 5201; sleep 1
pids=$(pgrep -f "oxvs-switchd --socket /run/oxvs-lab/tc/")
hz=$(getconf CLK_TCK)
# user and system ticks of every switchd, summed
ticks() { for p in $pids; do cut -d' ' -f14,15 /proc/$p/stat; done | awk '{u+=$1; s+=$2} END {print u, s}'; }
for t in $(seq 1 "$TRIALS"); do
  read -r u0 s0 < <(ticks)
  out=$($L exec x/a -- iperf3 -c 10.244.2.2 -t "$SECS" -f g)
  read -r u1 s1 < <(ticks)
  echo "$out" | awk -v l="$LABEL" -v t="$t" -v du=$((u1 - u0)) -v ds=$((s1 - s0)) -v hz="$hz" '
    /sender/ { gb = $5; if ($6 == "MBytes") gb /= 1024; rate = $7; retr = $9 }
    END { ms = (du + ds) * 1000 / hz;
          printf "%s trial %d: %.2f Gbit/s, %d retransmits, switches %.0f ms CPU (%.0f%% user) = %.0f ms per GB\n",
                 l, t, rate, retr, ms, 100 * du / (du + ds + 1e-9), ms / gb }'
  sleep 1
done
