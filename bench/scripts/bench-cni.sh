#!/usr/bin/env bash
# CNI ADD/DEL latency of oxvs against the reference bridge + host-local
# plugins (bench/src/bin/cni-bench.rs). This is the command line that made
# the numbers in docs/benchmarks.md ("CNI ADD/DEL latency"). Root only.
#
# Usage: bench/scripts/bench-cni.sh [cni-bench options]
#   default: --n 100 --concurrency 8 --json target/cni-bench.json
#   (options: --n PODS, --concurrency C, --probe-n K, --json FILE,
#    --bin-dir DIR, --cni-path DIR, --keep-logs)
#
# Installs, only if missing, the Debian package with the reference plugins
# (containernetworking-plugins: /usr/lib/cni/bridge, host-local).
set -Eeuo pipefail
cd "$(dirname "$0")/../.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

if [ "$(id -u)" != 0 ]; then
  echo "bench-cni.sh: needs root (network namespaces, veth, XDP)" >&2
  exit 1
fi
if ! dpkg-query -W -f='${Status}' containernetworking-plugins 2>/dev/null | grep -q "install ok installed"; then
  echo "==> install Debian package: containernetworking-plugins"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends containernetworking-plugins
fi

echo "==> build (release): oxvs-cni, oxvs-agent, oxvs-switchd, cni-bench"
cargo build --release -p oxvs-cni -p oxvs-agent -p oxvs-switch -p oxvs-bench \
  --bin oxvs-cni --bin oxvs-agent --bin oxvs-switchd --bin cni-bench

if [ $# -eq 0 ]; then
  set -- --n 100 --concurrency 8 --json target/cni-bench.json
fi
exec target/release/cni-bench "$@"
