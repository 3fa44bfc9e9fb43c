#!/bin/sh
# The committed NetworkPolicy benchmark run (results in
# docs/benchmarks.md, section "NetworkPolicy realisation"):
#
#   matrix    in process: N = 10, 100, 1000 policies over P = 100, 1000 pods on
#             10 nodes: translate, diff, parse, install per node; flows and
#             memory per policy
#   datapath  Datapath::process_batch pps of one node with 0 vs 1000 policies,
#             EMC hits and megaflow hits (EMC off), same packets
#   lab       (root) end to end on a 2-node oxvs-lab with LAB_PODS real pods
#             (default 40): `oxvs-lab apply -f` of N = 10, 100, 1000 policies
#             until every switch holds the expected flows; agent/switchd RSS
#
# Usage: bench/scripts/bench-policy.sh [matrix|datapath|lab|all] (default all;
# `lab` is skipped when not root). Env: LAB (lab name, default polbench),
# LAB_PODS (40), REPS (3), TRIALS (5), SECS (2). JSON: bench/results/policy-*.json
set -eu
cd "$(dirname "$0")/../.."
what=${1:-all}
cargo build --release -p oxvs-bench --bin policy-bench
B=target/release/policy-bench
mkdir -p bench/results
case $what in matrix|all)
    "$B" matrix --pods 100,1000 --policies 10,100,1000 --nodes 10 --reps "${REPS:-3}" \
        --json bench/results/policy-matrix.json ;;
esac
case $what in datapath|all)
    "$B" datapath --pods 1000 --policies 1000 --nodes 10 --packets 2048 \
        --trials "${TRIALS:-5}" --secs "${SECS:-2}" --json bench/results/policy-datapath.json ;;
esac
case $what in lab|all)
    if [ "$(id -u)" != 0 ]; then
        echo "lab: skipped (needs root)" >&2
        exit 0
    fi
    cargo build --release -p oxvs-lab -p oxvs-agent -p oxvs-switch -p oxvs-cni -p oxvsctl
    L=target/release/oxvs-lab
    LAB=${LAB:-polbench}
    "$L" --name "$LAB" up --nodes 2
    trap '"$L" --name "$LAB" down' EXIT INT TERM
    "$B" lab --lab "$LAB" --bin-dir target/release --pods "${LAB_PODS:-40}" \
        --policies 10,100,1000 --json bench/results/policy-lab.json ;;
esac
