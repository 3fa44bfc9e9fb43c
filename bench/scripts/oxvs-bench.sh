#!/bin/sh
# The committed oxvs-bench runs: oxvs (interrupt mode, and busy mode as
# oxvs-busy) vs OVS afxdp (non-PMD, PMD: like with like)
# vs Linux bridge vs the kernel XDP redirect (the ceiling; simple only),
# simple forwarding (port 1 <-> 2) and the Antrea-like
# pipeline with $POLICIES NetworkPolicies (generator and sink are two pods
# the policies allow), virtual setup (generator and sink in namespaces,
# AF_XDP copy mode on veth), 64-byte UDP frames, 1 and 1000 flows; then
# pod to pod across two nodes over VXLAN (oxvs-switchd per node vs a
# private OVS userspace instance per node, afxdp PMD, and oxvs busy); then scaling (oxvs with 1
# and 2 datapath threads, and OVS PMD, over 1, 1k, 100k and 1M flows at a
# fixed rate); then multi-queue ports (1, 2, 4 queues). Results:
# bench/results/*.json and SVG plots under bench/results/plots/.
#
# Usage (root): bench/scripts/oxvs-bench.sh [extra oxvs-bench flags]
# Env: DURATION (s per trial, default 3), TRIALS (default 3), RATE (fixed
# rate, pps, default 100000), FLOWS (default 1,1000), POLICIES (default
# 1000), STEPS (search steps, default 6), SWITCHES (default
# oxvs,oxvs-busy,ovs-pmd,ovs-nonpmd,bridge,xdp-redirect), VXLAN_SWITCHES
# (default oxvs,oxvs-busy,ovs-pmd; ovs-nonpmd also runs there), SCALING_FLOWS (default
# 1,1000,100000,1000000), SCALING_THREADS (oxvs, default 1,2), QUEUES
# (the queues part's queue counts, default 1 2 4), ONLY (fixed,
# throughput, vxlan, scaling or queues: run just that part).
set -eu
cd "$(dirname "$0")/../.."
cargo build --release -p oxvs-bench --bin oxvs-bench -p oxvs-switch -p oxvsctl
B=target/release/oxvs-bench
D=${DURATION:-3}
T=${TRIALS:-3}
R=${RATE:-100000}
F=${FLOWS:-1,1000}
P=${POLICIES:-1000}
S=${SWITCHES:-oxvs,oxvs-busy,ovs-pmd,ovs-nonpmd,bridge,xdp-redirect}
O=${ONLY:-all}
mkdir -p bench/results/plots
if [ "$O" = all ] || [ "$O" = fixed ]; then
    "$B" fixed --switches "$S" --pipeline simple,antrea --policies "$P" --rate "$R" --flows "$F" \
        --duration "$D" --trials "$T" \
        --json bench/results/oxvs-bench-fixed.json --plots bench/results/plots/fixed "$@"
fi
if [ "$O" = all ] || [ "$O" = throughput ]; then
    "$B" throughput --switches "$S" --pipeline simple,antrea --policies "$P" --flows "$F" \
        --duration "$D" --trials "$T" --loss 0.1 --steps "${STEPS:-6}" \
        --json bench/results/oxvs-bench-throughput.json --plots bench/results/plots/throughput "$@"
fi
if [ "$O" = all ] || [ "$O" = vxlan ]; then
    VS=${VXLAN_SWITCHES:-oxvs,oxvs-busy,ovs-pmd}
    "$B" fixed --setup virtual-vxlan --switches "$VS" --rate "$R" --flows "$F" --duration "$D" \
        --trials "$T" \
        --json bench/results/oxvs-bench-vxlan-fixed.json --plots bench/results/plots/vxlan-fixed "$@"
    "$B" throughput --setup virtual-vxlan --switches "$VS" --flows "$F" --duration "$D" \
        --trials "$T" --loss 0.1 \
        --steps "${STEPS:-6}" \
        --json bench/results/oxvs-bench-vxlan-throughput.json --plots bench/results/plots/vxlan-throughput "$@"
fi
if [ "$O" = all ] || [ "$O" = scaling ]; then
    "$B" scaling --switches oxvs,ovs-pmd --flows "${SCALING_FLOWS:-1,1000,100000,1000000}" \
        --threads "${SCALING_THREADS:-1,2}" --rate "$R" --duration "$D" --trials "$T" \
        --json bench/results/oxvs-bench-scaling.json --plots bench/results/plots/scaling "$@"
fi
if [ "$O" = all ] || [ "$O" = queues ]; then
    # Multi-queue ports (a socket per queue): oxvs 1 and 2 threads against
    # OVS non-PMD, veths with 1, 2 and 4 queues.
    for q in ${QUEUES:-1 2 4}; do
        "$B" throughput --switches oxvs,ovs-nonpmd --threads 1,2 --queues "$q" --flows 1000 \
            --duration "$D" --trials "$T" --loss 0.1 --steps "${STEPS:-6}" \
            --json "bench/results/oxvs-bench-queues-$q.json" "$@"
    done
fi
