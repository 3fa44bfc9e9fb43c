#!/usr/bin/env bash
# IPv4 against IPv6, pod to pod through oxvs, in one run on a fresh
# dual-stack 2-node lab (`oxvs-lab up --ip-family dual`): what the second
# address family costs per packet (extraction, classification, Neighbour
# Discovery, the IPv6 twin flows). Root only. See docs/benchmarks.md,
# "IPv4 and IPv6".
#
# Usage: scripts/bench-dual-stack.sh [--trials N] [--duration S] [--rr-count N] [--underlay LIST] [--json FILE]
#   --trials N      trials per path, interleaved (default 3)
#   --duration S    iperf3 -t S (default 5)
#   --rr-count N    1-byte round trips over one connection (default 2000)
#   --underlay LIST the tunnel's underlay families, comma-separated: ipv4,
#                   ipv6 or ipv4,ipv6 (a lab each, up side by side; default ipv4)
#   --json FILE     every trial plus machine info
#
# Pods (namespace bench): s1 on node-1, s2 on node-2, client cl on node-1.
# Paths from cl: s1 (same node) and s2 (across nodes, VXLAN over the
# lab's underlay), each over IPv4 and over IPv6. Per path and trial: iperf3 TCP,
# one stream (Gbit/s, retransmits) and 1-byte request/response over one
# connection (`bench/scripts/tcp-rr.py rr`: round trips/s, p50 µs).
# Trials are interleaved (every path once, then again), so drift on this
# shared machine hits both families alike. Prints median [min-max].
#
# Needs release binaries (built when missing), iperf3 (installed when
# missing), python3. The lab bds-<pid> is always taken down.
set -Eeuo pipefail

CALLER_PWD=$PWD
cd "$(dirname "$0")/.."
REPO=$PWD
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

TRIALS=3
DURATION=5
RR_COUNT=2000
UNDERLAYS=ipv4
JSON=
usage() { sed -n '8,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) TRIALS=${2:?--trials N}; shift 2 ;;
    --duration) DURATION=${2:?--duration S}; shift 2 ;;
    --rr-count) RR_COUNT=${2:?--rr-count N}; shift 2 ;;
    --underlay) UNDERLAYS=${2:?--underlay LIST}; shift 2 ;;
    --json) JSON=${2:?--json FILE}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-dual-stack.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
for v in TRIALS DURATION RR_COUNT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-dual-stack.sh: $v must be a positive integer, got ${!v}" >&2; exit 2; }
done
IFS=, read -r -a ULS <<<"$UNDERLAYS"
[ ${#ULS[@]} -ge 1 ] || { echo "bench-dual-stack.sh: --underlay: give ipv4, ipv6 or ipv4,ipv6" >&2; exit 2; }
SEEN=
for u in "${ULS[@]}"; do
  case "$u" in ipv4|ipv6) ;; *) echo "bench-dual-stack.sh: --underlay: ipv4 or ipv6, got '$u'" >&2; exit 2 ;; esac
  case " $SEEN " in *" $u "*) echo "bench-dual-stack.sh: --underlay: $u given twice" >&2; exit 2 ;; esac
  SEEN="$SEEN $u"
done
if [ -n "$JSON" ]; then
  case "$JSON" in /*) ;; *) JSON="$CALLER_PWD/$JSON" ;; esac
fi
die() { echo "bench-dual-stack.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, AF_XDP)"
PY=$(command -v python3) || die "python3 not found"
if ! command -v iperf3 >/dev/null; then
  echo "==> install Debian package: iperf3"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iperf3
fi
BIN=$REPO/target/release
for b in oxvs-lab oxvs-switchd oxvs-agent oxvs-cni oxvsctl; do
  [ -x "$BIN/$b" ] || { echo "==> build (release)"; cargo build --release --workspace; break; }
done
HELPER=$REPO/bench/scripts/tcp-rr.py

WORK=$(mktemp -d /tmp/bench-dual-stack.XXXXXX)
LABS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  for l in "${LABS[@]}"; do
    for p in s1 s2 cl; do ip netns pids "$l-bench-$p" 2>/dev/null | xargs -r kill 2>/dev/null; done
  done
  wait 2>/dev/null
  for l in "${LABS[@]}"; do
    "$BIN/oxvs-lab" --name "$l" down >"$WORK/down-$l.log" 2>&1 || { cat "$WORK/down-$l.log" >&2; rc=1; }
  done
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "==> $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); underlays ${ULS[*]}, $TRIALS trials, iperf3 -t $DURATION"
cat >"$WORK/pods.yaml" <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: v1
kind: Pod
metadata: {name: s1, namespace: bench}
spec: {nodeName: node-1, containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: s2, namespace: bench}
spec: {nodeName: node-2, containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: cl, namespace: bench}
spec: {nodeName: node-1, containers: [{name: c}]}
EOF
PATHS=()
for u in "${ULS[@]}"; do
  LAB=bds-$$-${u#ip}
  lab() { "$BIN/oxvs-lab" --name "$LAB" "$@"; }
  LABS+=("$LAB")
  lab up --nodes 2 --ip-family dual --underlay "$u" >"$WORK/up-$LAB.log" 2>&1 || { cat "$WORK/up-$LAB.log" >&2; die "oxvs-lab up ($u underlay) failed"; }
  lab apply -f "$WORK/pods.yaml" >"$WORK/apply-$LAB.log" 2>&1 || { cat "$WORK/apply-$LAB.log" >&2; die "apply failed"; }
  lab status --json >"$WORK/status-$LAB.json"
  read -r S1 S16 S2 S26 < <("$PY" - "$WORK/status-$LAB.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
p = {x["name"]: x for x in d["pods"] if x["namespace"] == "bench"}
print(p["s1"]["ip"], p["s1"]["ip6"], p["s2"]["ip"], p["s2"]["ip6"])
EOF
)
  for p in s1 s2; do
    lab exec "bench/$p" -- iperf3 -s -p 5201 >"$WORK/$LAB-$p.iperf.log" 2>&1 &
    lab exec "bench/$p" -- "$PY" "$HELPER" server --port 7000 --dual >"$WORK/$LAB-$p.rr.log" 2>&1 &
  done
  echo "==> $LAB ($u underlay): wait until every path answers (and warm up)"
  for dst in "$S1" "$S16" "$S2" "$S26"; do
    ok=0
    for _ in $(seq 1 20); do
      if lab exec bench/cl -- iperf3 -c "$dst" -p 5201 -t 1 --connect-timeout 2000 >/dev/null 2>&1 &&
         lab exec bench/cl -- "$PY" "$HELPER" rr --host "$dst" --port 7000 --count 10 --warmup 1 >/dev/null 2>&1; then
        ok=1; break
      fi
      sleep 0.5
    done
    [ $ok = 1 ] || die "cl cannot reach $dst ($u underlay)"
  done
  if [ ${#ULS[@]} = 1 ]; then
    PATHS+=(
      "v4-same|IPv4, same node|$S1|$LAB"
      "v6-same|IPv6, same node|$S16|$LAB"
      "v4-cross|IPv4, across nodes|$S2|$LAB"
      "v6-cross|IPv6, across nodes|$S26|$LAB"
    )
  else
    # Same-node paths do not touch the underlay: measured once.
    if [ ${#PATHS[@]} = 0 ]; then
      PATHS+=(
        "v4-same|IPv4, same node|$S1|$LAB"
        "v6-same|IPv6, same node|$S16|$LAB"
      )
    fi
    PATHS+=(
      "v4-cross-$u|IPv4, across nodes, $u underlay|$S2|$LAB"
      "v6-cross-$u|IPv6, across nodes, $u underlay|$S26|$LAB"
    )
  fi
done

for t in $(seq 1 "$TRIALS"); do
  for p in "${PATHS[@]}"; do
    IFS='|' read -r id label dst LAB <<<"$p"
    lab() { "$BIN/oxvs-lab" --name "$LAB" "$@"; }
    lab exec bench/cl -- iperf3 -c "$dst" -p 5201 -t "$DURATION" -J --connect-timeout 3000 \
      >"$WORK/$id.t$t.iperf.json" 2>/dev/null || die "iperf3 to $dst failed (trial $t)"
    lab exec bench/cl -- "$PY" "$HELPER" rr --host "$dst" --port 7000 --count "$RR_COUNT" \
      >"$WORK/$id.t$t.rr.json" || die "rr to $dst failed (trial $t)"
    echo "    trial $t $label done"
  done
done

ULS="$UNDERLAYS" "$PY" - "$WORK" "$TRIALS" "$DURATION" "$RR_COUNT" "${JSON:-}" "${PATHS[@]}" <<'EOF'
import json, os, platform, statistics, sys
work, trials, duration, rr_count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
paths = [p.split("|")[:3] for p in sys.argv[6:]]
def med(v, f):
    return f"{f(statistics.median(v))} [{f(min(v))}-{f(max(v))}]"
rows, doc = [], {"what": "IPv4 against IPv6 pod to pod through oxvs (scripts/bench-dual-stack.sh)",
                 "trials": trials, "iperf3_seconds": int(duration), "rr_round_trips": int(rr_count),
                 "underlays": os.environ.get("ULS", "ipv4").split(","),
                 "kernel": platform.release(), "cpus": os.cpu_count(), "paths": {}}
for pid, label, dst in paths:
    gbps, retr, rps, p50 = [], [], [], []
    for t in range(1, trials + 1):
        j = json.load(open(f"{work}/{pid}.t{t}.iperf.json"))
        s = j["end"]["sum_sent"]
        gbps.append(s["bits_per_second"] / 1e9)
        retr.append(s.get("retransmits", 0))
        r = json.load(open(f"{work}/{pid}.t{t}.rr.json"))
        rps.append(r["per_s"]); p50.append(r["lat_us"]["p50"])
    doc["paths"][pid] = {"label": label, "destination": dst, "gbit_s": gbps, "retransmits": retr,
                         "rr_per_s": rps, "rr_p50_us": p50}
    rows.append((label, med(gbps, lambda x: f"{x:.2f}"), med(retr, lambda x: f"{int(x)}"),
                 med(rps, lambda x: f"{x:,.0f}"), med(p50, lambda x: f"{x:.0f}")))
print(f"\n{trials} trials, median [min-max]; iperf3 -t {duration}, one stream; RR {rr_count} round trips\n")
print("| path | TCP Gbit/s | retransmits | RR/s | RR p50 µs |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    print("| " + " | ".join(r) + " |")
if out:
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nwrote {out}")
EOF
