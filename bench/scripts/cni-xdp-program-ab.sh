#!/usr/bin/env bash
# CNI ADD/DEL latency with switchd's own XDP program (one load, a BPF link
# per port) against libxdp's program per port (`--xdp-program libxdp`), and
# the reference bridge + host-local in the same runs: TRIALS (default 3)
# alternating cni-bench runs of each, medians of the per-run p50s.
# The command behind docs/benchmarks.md "One XDP program for every port".
# Root only.
#
# Usage: bench/scripts/cni-xdp-program-ab.sh [TRIALS] [PODS]   (3, 50)
set -Eeuo pipefail
cd "$(dirname "$0")/../.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(id -u)" != 0 ]; then
  echo "cni-xdp-program-ab.sh: needs root (network namespaces, veth, XDP)" >&2
  exit 1
fi
trials=${1:-3}
pods=${2:-50}
cargo build --release -q -p oxvs-bench --bin cni-bench -p oxvs-switch -p oxvs-agent -p oxvs-cni
out=$(mktemp -d /tmp/cni-xdp-ab.XXXXXX)
for t in $(seq 1 "$trials"); do
  for v in switch libxdp; do
    target/release/cni-bench --n "$pods" --concurrency 8 --probe-n 10 \
      --switchd-arg=--xdp-program --switchd-arg="$v" >"$out/$v-$t.txt" 2>&1
    grep -E '^(oxvs|bridge) ' "$out/$v-$t.txt" | sed "s/^/$v trial $t: /"
  done
done
echo
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
echo "variant  plugin  verb  mode         p50 per trial (ms)      median p50  median p99"
for v in switch libxdp; do
  for plugin in oxvs bridge; do
    for verb in ADD DEL; do
      for mode in sequential concurrent; do
        rows=$(cat "$out"/$v-*.txt | awk -v p="$plugin" -v verb="$verb" -v m="$mode" \
          '$1 == p && $2 == verb && $3 == m && $6 ~ /^[0-9.]+$/ { print $6, $8 }')
        [ -n "$rows" ] || continue
        printf '%-8s %-7s %-4s  %-11s  %-22s  %10s  %10s\n' "$v" "$plugin" "$verb" "$mode" \
          "$(echo "$rows" | awk '{ print $1 }' | paste -sd/)" \
          "$(echo "$rows" | awk '{ print $1 }' | median)" \
          "$(echo "$rows" | awk '{ print $2 }' | median)"
      done
    done
  done
done
echo "raw output: $out"
