#!/usr/bin/env bash
# Sets up everything and runs every test (what CI runs). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
current=""
trap 'printf "\nFAILED at step: %s\n" "$current" >&2' ERR
current="cargo fmt --check"; printf '\n==> %s\n' "$current"
cargo fmt --all -- --check
current="cargo clippy"; printf '\n==> %s\n' "$current"
cargo clippy --workspace --all-targets -- -D warnings
current="cargo test"; printf '\n==> %s\n' "$current"
cargo test --workspace --release
