#!/bin/sh
# The Service scale benchmark (results in docs/benchmarks.md, section
# "Service scale"): S = 0, 1k, 10k Services with 10 endpoints each, the
# in-pipeline Service proxy against the iptables rules of the real
# kube-proxy (v1.20, iptables mode).
#
#   matrix     in process, per node of a 10-node model: translate, diff, parse,
#              install of the Services' flows and groups; first sync; one
#              Service's endpoints changing; flows, groups, memory per Service
#   datapath   Datapath::process_batch on node-1: established connections and
#              new connections (SYNs from new ports) to ClusterIPs, against
#              the same traffic to pod IPs, at 0, 1k, 10k Services
#   lab        (root) a 2-node oxvs-lab with the real kube-proxy
#              (`up --kube-proxy`): the Services and Endpoints created in the
#              API server, node-1's iptables nat rules counted and timed,
#              kube-proxy's sync time and RSS; then the same Services on a
#              2-node `up --proxy` lab: ServiceLB flows and groups, time to
#              realise, agent and switchd RSS. LAB_SERVICES (default 1000)
#              Services (a comma list runs each on a fresh lab)
#
# Usage: bench/scripts/bench-services-scale.sh [matrix|datapath|lab|all]
# (default all; `lab` is skipped when not root or without the kube-proxy build).
# Env: LAB (lab name prefix, default svcscale), LAB_SERVICES (1000), REPS (3),
# TRIALS (5), SECS (1). JSON: bench/results/service-scale-*.json
set -eu
cd "$(dirname "$0")/../.."
what=${1:-all}
cargo build --release -p oxvs-bench --bin service-bench
B=target/release/service-bench
R=bench/results
mkdir -p "$R"
case $what in matrix|all)
    "$B" matrix --services 0,1000,10000 --endpoints 10 --nodes 10 --reps "${REPS:-3}" \
        --json "$R/service-scale-matrix.json" ;;
esac
case $what in datapath|all)
    echo "load before datapath: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    "$B" datapath --services 0,1000,10000 --trials "${TRIALS:-5}" --secs "${SECS:-1}" \
        --json "$R/service-scale-datapath.json" ;;
esac
case $what in lab|all)
    if [ "$(id -u)" != 0 ]; then
        echo "lab: skipped (needs root)" >&2
        exit 0
    fi
    K8S=${OXVS_K8S_CACHE:-/var/cache/oxvs-k8s}
    if [ ! -x "$K8S/bin/kube-proxy" ]; then
        echo "lab: skipped (no kube-proxy in $K8S/bin: OXVS_K8S_EXTRA_COMPONENTS=kube-proxy ../shared/tools/k8s-local.sh build)" >&2
        exit 0
    fi
    cargo build --release -p oxvs-lab -p oxvs-agent -p oxvs-switch -p oxvs-cni -p oxvsctl
    L=target/release/oxvs-lab
    LAB=${LAB:-svcscale}
    for n in $(echo "${LAB_SERVICES:-1000}" | tr ',' ' '); do
        for mode in kube-proxy proxy; do
            name="$LAB-$n-$(echo $mode | cut -c1-2)"
            "$L" --name "$name" up --nodes 2 --$mode
            trap '"$L" --name "$name" down' EXIT INT TERM
            "$B" lab --mode $mode --lab "$name" --bin-dir target/release --services "$n" \
                --json "$R/service-scale-lab-$mode-$n.json"
            "$L" --name "$name" down
            trap - EXIT INT TERM
        done
    done ;;
esac
