#!/usr/bin/env bash
# Installs what oxvs needs to build and test, and builds it (release).
# Idempotent: installs only what is missing. Usage (as root): scripts/setup.sh
#
# With OXVS_SETUP_K8S=1 (scripts/test.sh, i.e. CI, sets it; scripts/demo.sh
# does not, so the quick demo stays quick) it also builds the Kubernetes
# v1.20 components the Kubernetes tests run (kube-apiserver, kubelet,
# kube-proxy, kube-scheduler, kube-controller-manager; deploy/validate and
# lab/tests/kube_proxy.rs) with the shared tools' `k8s-local.sh build`
# (found at $OXVS_SHARED_TOOLS, else ../shared/tools beside this
# repository): about 10 minutes the first time, under a second once cached
# in ${OXVS_K8S_CACHE:-/var/cache/oxvs-k8s}. It installs the packages it
# needs itself (Go, etcd, containerd, runc, busybox-static, umoci, skopeo...).
#
# Debian packages, each for one reason:
#   gcc, libc6-dev      the linker rustc calls (no crate here compiles C)
#   openvswitch-switch  the reference switch for the differential tests
#                       (a yardstick, never a runtime dependency)
#   clang llvm libelf-dev zlib1g-dev pkg-config m4 libpcap-dev
#                       to build xsk-rs (its libxdp/libbpf and XDP programs)
#   iproute2 ethtool    network namespaces, veth, VXLAN for the end-to-end tests
#   iputils-ping python3  traffic in the end-to-end tests (ping; TCP/UDP peers)
#   containernetworking-plugins iptables
#                       the reference CNI plugins (portmap chained after oxvs,
#                       bridge + host-local as the CNI benchmark's yardstick)
#   conntrack           the host's NAT entries of Services (`oxvs-lab up
#                       --kube-proxy` requires it; the deploy e2e test runs
#                       the docs' `conntrack -L`; evidence on failure)
#   dnsmasq-base        the cluster DNS server in a lab pod (kube_proxy test)
#   tcpdump             a capture on the gateway when a Service probe fails
#   strace              delays bind(2) in agent/tests/sockets.rs, which checks
#                       that no socket file is ever open to others
#   curl, ca-certificates  only if Rust is missing: to fetch rustup
# Rust: the stable toolchain via rustup with rustfmt and clippy, if cargo is
# missing (Debian 12's own cargo is too old for this workspace).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
current=""
step() { current="$*"; printf '\n==> %s\n' "$*"; }
trap 'printf "\nFAILED at step: %s\n" "$current" >&2' ERR

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

PKGS=(gcc libc6-dev openvswitch-switch clang llvm libelf-dev zlib1g-dev pkg-config m4 libpcap-dev iproute2 ethtool iputils-ping python3 containernetworking-plugins iptables conntrack dnsmasq-base tcpdump strace)
command -v cargo >/dev/null 2>&1 || PKGS+=(curl ca-certificates)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "install Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
else
  step "Debian packages already installed (${PKGS[*]})"
fi

if ! command -v cargo >/dev/null 2>&1; then
  step "install the Rust toolchain (rustup, stable, with rustfmt and clippy)"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
    sh -s -- -y --profile minimal --default-toolchain stable -c rustfmt -c clippy
  export PATH="$HOME/.cargo/bin:$PATH"
fi
step "check the Rust toolchain"
cargo --version
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "add rustfmt and clippy"
  rustup component add rustfmt clippy
fi

step "build (cargo build --release --workspace)"
cargo build --release --workspace

if [ "${OXVS_SETUP_K8S:-0}" = 1 ]; then
  tools=${OXVS_SHARED_TOOLS:-$(pwd)/../shared/tools}
  step "Kubernetes v1.20 build for the Kubernetes tests ($tools/k8s-local.sh build; ~10 min cold, <1 s cached)"
  if [ ! -f "$tools/k8s-local.sh" ]; then
    echo "OXVS_SETUP_K8S=1 but $tools/k8s-local.sh is missing (set OXVS_SHARED_TOOLS to the shared tools directory)" >&2
    false
  fi
  OXVS_K8S_EXTRA_COMPONENTS="kube-proxy kube-scheduler kube-controller-manager" bash "$tools/k8s-local.sh" build
fi
