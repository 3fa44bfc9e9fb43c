#!/usr/bin/env bash
# Installs what oxvs needs to build and test, and builds it (release).
# Idempotent: installs only what is missing. Usage (as root): scripts/setup.sh
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
#   curl, ca-certificates  only if Rust is missing: to fetch rustup
# Rust: the stable toolchain via rustup with rustfmt and clippy, if cargo is
# missing (Debian 12's own cargo is too old for this workspace).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
current=""
step() { current="$*"; printf '\n==> %s\n' "$*"; }
trap 'printf "\nFAILED at step: %s\n" "$current" >&2' ERR

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

PKGS=(gcc libc6-dev openvswitch-switch clang llvm libelf-dev zlib1g-dev pkg-config m4 libpcap-dev iproute2 ethtool iputils-ping python3 containernetworking-plugins iptables)
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
