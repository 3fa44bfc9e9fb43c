#!/usr/bin/env bash
# Runs the end-to-end datapath harness (bench/src/bin/e2e.rs): oxvs-switchd,
# Open vSwitch afxdp (PMD and non-PMD) and a Linux bridge side by side on
# namespaces, plus TCP over VXLAN across two "nodes". Root only.
#
# Usage: scripts/bench-e2e.sh [e2e options]   e.g.
#   scripts/bench-e2e.sh --duration 5 --json target/e2e.json
# (options: --duration S, --trials N, --rate PPS, --json FILE,
#  --only oxvs,ovs-nonpmd,ovs-pmd,bridge,vxlan-oxvs,vxlan-kernel)
#
# Installs, only if missing, the two Debian packages the harness drives:
#   netsniff-ng   trafgen, the 64-byte UDP generator
#   iperf3        TCP throughput
# Open vSwitch (openvswitch-switch, from scripts/setup.sh) is optional: the
# harness skips it with a reason when it is absent.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

if [ "$(id -u)" != 0 ]; then
  echo "bench-e2e.sh: needs root (network namespaces, XDP)" >&2
  exit 1
fi
missing=()
for p in netsniff-ng iperf3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> install Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

echo "==> build (release): oxvs-switchd, oxvsctl, e2e"
cargo build --release -p oxvs-switch -p oxvsctl -p oxvs-bench --bin oxvs-switchd --bin oxvsctl --bin e2e
exec target/release/e2e "$@"
