#!/usr/bin/env bash
# Installs the system packages oxvs needs to build and test, and builds it.
# Idempotent. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }
fail() { printf '\nFAILED at step: %s\n' "$current" >&2; }
trap fail ERR

# Debian packages: openvswitch-switch is the reference switch for the
# differential tests (a yardstick, never a runtime dependency).
PKGS=(openvswitch-switch)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
current="install system packages (${PKGS[*]})"
if [ ${#missing[@]} -gt 0 ]; then
  step "$current"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
else
  step "system packages already installed"
fi

current="check the Rust toolchain"
step "$current"
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
cargo --version

current="build (release)"
step "$current"
cargo build --release --workspace
