#!/usr/bin/env bash
# Sets up everything and runs every test: what CI runs (.ci/run).
# Usage (as root, for the Open vSwitch differential tests): scripts/test.sh
#
# Last, it runs the README's other quick-start command, scripts/demo.sh
# (set up again: a no-op by now; the 2-node lab demo, whose matrix after the
# policy is checked against a truth table), so CI runs both commands of the
# quick start on a clean checkout. OXVS_SKIP_DEMO=1 leaves it out.
#
# The differential tests (ctl/tests/ovs_diff.rs) start Open vSwitch
# themselves when it is installed but not running.
#
# A test that cannot run on a machine (not root, no AF_XDP, no Open vSwitch,
# a tool missing, no Kubernetes build) prints SKIPPED and passes; here,
# where setup.sh installs everything and makes the Kubernetes build
# (OXVS_SETUP_K8S=1, ~10 min the first time), OXVS_TESTS_NO_SKIP=1 turns
# every such skip into a failure naming the reason (oxvs-testutil), so CI
# cannot pass a test by not running it.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
current="scripts/setup.sh"
trap 'printf "\nFAILED at step: %s\n" "$current" >&2' ERR
export OXVS_SETUP_K8S=1 OXVS_TESTS_NO_SKIP=1
# The property tests draw their cases from a pinned seed here, so that what
# CI runs is what ran before a change landed (a random draw once failed CI
# on a bug no earlier draw had reached). Exploring new cases is a local
# job: `PROPTEST_RNG_SEED=$RANDOM cargo test --release` (or plain `cargo
# test`, which draws a random seed); for more cases than a test's own
# count, raise its `cases` for the run.
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261204}"
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
step() { current="$*"; printf '\n==> %s\n' "$*"; }

step "cargo fmt --all -- --check"
cargo fmt --all -- --check
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# --release reuses what setup.sh built.
step "cargo test --workspace --release"
cargo test --workspace --release
if [ "${OXVS_SKIP_DEMO:-0}" != 1 ]; then
  step "scripts/demo.sh (the README's quick-start demo)"
  scripts/demo.sh
fi
printf '\nAll tests passed.\n'
