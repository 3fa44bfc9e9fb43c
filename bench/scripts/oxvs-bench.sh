#!/bin/sh
# The committed oxvs-bench run (issue 7): oxvs vs OVS afxdp (PMD, non-PMD)
# vs Linux bridge, simple forwarding pipeline (port 1 <-> 2), virtual setup
# (generator and sink in namespaces, AF_XDP copy mode on veth), 64-byte
# UDP frames. Results: bench/results/*.json and SVG plots.
#
# Usage (root): bench/scripts/oxvs-bench.sh [extra oxvs-bench flags]
# Env: DURATION (s per trial, default 3), TRIALS (default 3), RATE (fixed
# rate, pps, default 100000), FLOWS (default 1000).
set -eu
cd "$(dirname "$0")/../.."
cargo build --release -p oxvs-bench --bin oxvs-bench
cargo build --release -p oxvs-switch -p oxvsctl
B=target/release/oxvs-bench
D=${DURATION:-3}
T=${TRIALS:-3}
R=${RATE:-100000}
F=${FLOWS:-1000}
S=${SWITCHES:-oxvs,ovs-pmd,ovs-nonpmd,bridge}
mkdir -p bench/results/plots
"$B" fixed --switches "$S" --rate "$R" --flows "$F" --duration "$D" --trials "$T" \
    --json bench/results/oxvs-bench-fixed.json --plots bench/results/plots/fixed "$@"
"$B" throughput --switches "$S" --flows "$F" --duration "$D" --trials "$T" --loss 0.1 --steps "${STEPS:-7}" \
    --json bench/results/oxvs-bench-throughput.json --plots bench/results/plots/throughput "$@"
