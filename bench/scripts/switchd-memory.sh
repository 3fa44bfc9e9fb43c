#!/usr/bin/env bash
# oxvs-switchd's memory against its number of AF_XDP ports: the shared UMEM
# of each datapath thread (the default) against a UMEM per port (the old
# default: --umem-sharing port --umem-frames 4096), side by side.
# Root only. See docs/benchmarks.md, "Switch memory per port".
#
# Usage: bench/scripts/switchd-memory.sh [--ports "0 10 50 110"] [--trials N]
#   --ports LIST   port counts to measure (default "0 10 50 110")
#   --trials N     trials per configuration, interleaved (default 3)
#
# Per configuration and port count: a fresh namespace, a release
# oxvs-switchd in it, LIST veth pairs (both ends in the namespace, up),
# every host end added with `oxvsctl add-port`; then switchd's VmRSS (the
# UMEMs are pinned, so they are resident), and the median time of one
# add-port. Prints the median and spread (min-max) of the trials.
# Needs: release binaries in target/release (built with `cargo build
# --release -p oxvs-switch -p oxvsctl` when one is missing). The namespace is
# named oxmem-<pid>-<n> and always deleted (EXIT trap, also on failure).
set -Eeuo pipefail

cd "$(dirname "$0")/../.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

PORTS="0 10 50 110"
TRIALS=3
usage() { sed -n '7,9p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --ports) PORTS=${2:?--ports LIST}; shift 2 ;;
    --trials) TRIALS=${2:?--trials N}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "switchd-memory.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "switchd-memory.sh: needs root" >&2; exit 1; }
[ "$TRIALS" -ge 1 ] 2>/dev/null || { echo "switchd-memory.sh: --trials must be >= 1" >&2; exit 2; }

SWITCHD=target/release/oxvs-switchd
CTL=target/release/oxvsctl
if [ ! -x "$SWITCHD" ] || [ ! -x "$CTL" ]; then
  cargo build --release -p oxvs-switch -p oxvsctl
fi

N=0
NS=
PID=
SOCK=
cleanup() {
  [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null || true
  [ -n "$NS" ] && ip netns del "$NS" 2>/dev/null || true
  [ -n "$SOCK" ] && rm -f "$SOCK" || true
  PID= NS= SOCK=
}
trap cleanup EXIT

# measure CONFIG-ARGS... ; PORTS_N in $1: prints "rss_kib add_ms"
measure() {
  # Runs in a subshell (process substitution): its own trap cleans up.
  trap cleanup EXIT
  local nports=$1; shift
  N=$((N + 1))
  NS=oxmem-$$-$N
  SOCK=/tmp/$NS.sock
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip netns exec "$NS" "$SWITCHD" --socket "$SOCK" --ct-state-file '' \
    --metrics-addr none "$@" >/dev/null 2>&1 &
  PID=$!
  for _ in $(seq 100); do
    "$CTL" --socket "$SOCK" show >/dev/null 2>&1 && break
    sleep 0.05
  done
  local i
  for i in $(seq "$nports"); do
    ip -n "$NS" link add "m$i" type veth peer name "m${i}p"
    ip -n "$NS" link set "m$i" up
    ip -n "$NS" link set "m${i}p" up
  done
  local times=()
  for i in $(seq "$nports"); do
    local t0 t1
    t0=$(date +%s%N)
    "$CTL" --socket "$SOCK" add-port "m$i" >/dev/null
    t1=$(date +%s%N)
    times+=($(( (t1 - t0) / 1000 )))
  done
  sleep 0.5
  local rss
  rss=$(awk '/^VmRSS:/{print $2}' "/proc/$PID/status")
  local med=0
  if [ "${#times[@]}" -gt 0 ]; then
    med=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  fi
  cleanup
  echo "$rss $med"
}

stats() { # values... -> "median (min-max)"
  printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{printf "%s (%s-%s)", a[int((NR+1)/2)], a[1], a[NR]}'
}

declare -A RSS ADD
CONFIGS=("shared" "per-port")
args_of() {
  case "$1" in
    shared) echo "" ;;
    per-port) echo "--umem-sharing port --umem-frames 4096" ;;
  esac
}
for trial in $(seq "$TRIALS"); do
  for n in $PORTS; do
    for c in "${CONFIGS[@]}"; do
      # shellcheck disable=SC2046
      read -r rss add < <(measure "$n" $(args_of "$c"))
      RSS[$c,$n]="${RSS[$c,$n]:-} $rss"
      ADD[$c,$n]="${ADD[$c,$n]:-} $add"
      echo "trial $trial: $c, $n ports: VmRSS ${rss} KiB, add-port median ${add} us" >&2
    done
  done
done

echo "oxvs-switchd memory per AF_XDP port ($(nproc) CPUs, kernel $(uname -r), $TRIALS trials: median (min-max))"
echo "shared = default (one UMEM of 16384 frames per datapath thread, 1 thread)"
echo "per-port = --umem-sharing port --umem-frames 4096 (the former default)"
printf '%-6s %-9s %-28s %-24s\n' ports config "VmRSS MiB" "add-port ms"
for n in $PORTS; do
  for c in "${CONFIGS[@]}"; do
    # shellcheck disable=SC2086
    mib=$(for k in ${RSS[$c,$n]}; do awk -v k="$k" 'BEGIN{printf "%.1f\n", k/1024}'; done)
    # shellcheck disable=SC2086
    ms=$(for u in ${ADD[$c,$n]}; do awk -v u="$u" 'BEGIN{printf "%.1f\n", u/1000}'; done)
    # shellcheck disable=SC2086
    printf '%-6s %-9s %-28s %-24s\n' "$n" "$c" "$(stats $mib)" "$(if [ "$n" = 0 ]; then echo -; else stats $ms; fi)"
  done
done
