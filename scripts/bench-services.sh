#!/usr/bin/env bash
# Pod -> ClusterIP against pod -> pod, same node and across nodes, through the
# REAL kube-proxy (iptables mode) on a fresh 2-node `oxvs-lab up --kube-proxy`,
# or with --proxy through oxvs's own Service proxy (`oxvs-lab up --proxy`:
# `oxvs-agent --proxy`, no kube-proxy). Root only. See docs/benchmarks.md,
# "Services through kube-proxy" and "The Service proxy".
#
# Usage: scripts/bench-services.sh [--proxy] [--trials N] [--duration S] [--json FILE]
#                                  [--rr-count N] [--crr-count N] [--keep-work]
#   --proxy         the Services through oxvs's proxy instead of kube-proxy
#   --trials N      trials per path, interleaved (default 3, at least 1)
#   --duration S    iperf3 -t S (default 5)
#   --json FILE     every trial plus machine info (FILE relative to the
#                   current directory)
#   --rr-count N    1-byte round trips over one connection (default 2000)
#   --crr-count N   new connections, one round trip each (default 500)
#   --keep-work     keep the work directory (raw iperf3/probe output)
#
# Topology (namespace `bench`): servers s1 on node-1 and s2 on node-2, client
# cl on node-1; Services svc-s1 (10.96.100.1) and svc-s2 (10.96.100.2) select
# one server each, ports 5201 (iperf3) and 7000 (echo) with the same
# targetPorts. In each server pod: `iperf3 -s -p 5201` and
# `bench/scripts/tcp-rr.py server --port 7000`, started with `oxvs-lab exec`.
# Paths, all from cl: pod IP / ClusterIP of s1 (same node), of s2 (across
# nodes, VXLAN), plus cl's own loopback for the probes (the tool's floor).
# Per path and trial: iperf3 (Gbit/s, retransmits, the switches' port drops
# from `oxvsctl dump-ports`, CPU of both switchd processes per MiB), RR
# (1-byte ping-pong over one connection, p50/p99) and CRR (new connection + 1-byte round trip + close, one after another:
# connections/s and connect() latency). Trials are interleaved: every path
# once, then every path again. "all CPU" is every CPU's busy time (from
# /proc/stat, so it includes whatever else runs on the machine) per MiB.
#
# Needs: release binaries in target/release (built with `cargo build
# --release --workspace` when one is missing), the Kubernetes build cache
# with kube-proxy (OXVS_K8S_CACHE, default /var/cache/oxvs-k8s), k8s-local.sh
# ($OXVS_SHARED_TOOLS or ../shared/tools), iperf3 (installed if missing),
# python3. The lab is named bsvc-<pid>-<n> and always taken down (EXIT trap,
# also on failure and Ctrl-C).
set -Eeuo pipefail

CALLER_PWD=$PWD
ORIG_ARGS="$*"
cd "$(dirname "$0")/.."
REPO=$PWD
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

TRIALS=3
DURATION=5
JSON=
RR_COUNT=2000
CRR_COUNT=500
KEEP_WORK=0
usage() { sed -n '8,17p' "$0" | sed 's/^# \{0,1\}//'; }
PROXY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) TRIALS=${2:?--trials N}; shift 2 ;;
    --duration) DURATION=${2:?--duration S}; shift 2 ;;
    --json) JSON=${2:?--json FILE}; shift 2 ;;
    --rr-count) RR_COUNT=${2:?--rr-count N}; shift 2 ;;
    --crr-count) CRR_COUNT=${2:?--crr-count N}; shift 2 ;;
    --keep-work) KEEP_WORK=1; shift ;;
    --proxy) PROXY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-services.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
for v in TRIALS DURATION RR_COUNT CRR_COUNT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-services.sh: $v must be a positive integer, got ${!v}" >&2; exit 2; }
done
if [ -n "$JSON" ]; then
  case "$JSON" in /*) ;; *) JSON="$CALLER_PWD/$JSON" ;; esac
fi

die() { echo "bench-services.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, AF_XDP, iptables)"
PY=$(command -v python3) || die "python3 not found"

# --- prerequisites ------------------------------------------------------------
TOOLS=$(realpath -m "${OXVS_SHARED_TOOLS:-$REPO/../shared/tools}")
CACHE=${OXVS_K8S_CACHE:-/var/cache/oxvs-k8s}
BUILD_CMD="OXVS_K8S_EXTRA_COMPONENTS=\"kube-proxy\" $TOOLS/k8s-local.sh build"
[ $PROXY = 1 ] || [ -x "$TOOLS/k8s-local.sh" ] || die "k8s-local.sh not found in $TOOLS (set OXVS_SHARED_TOOLS)"
for b in kube-apiserver kubelet kube-proxy; do
  [ $PROXY = 1 ] && break   # no Kubernetes at all
  [ -x "$CACHE/bin/$b" ] || die "no Kubernetes build with kube-proxy ($CACHE/bin/$b missing); build it once (~10 min cold) with:
    $BUILD_CMD"
done

if ! dpkg-query -W -f='${Status}' iperf3 2>/dev/null | grep -q "install ok installed"; then
  command -v iperf3 >/dev/null || {
    echo "==> install Debian package: iperf3"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends iperf3
  }
fi

BIN=$REPO/target/release
need_build=0
for b in oxvs-lab oxvs-switchd oxvs-agent oxvs-cni oxvsctl; do
  [ -x "$BIN/$b" ] || need_build=1
done
if [ $need_build = 1 ]; then
  echo "==> build (release): cargo build --release --workspace"
  cargo build --release --workspace
fi

HELPER=$REPO/bench/scripts/tcp-rr.py
[ -f "$HELPER" ] || die "$HELPER missing"

# --- lab, with teardown on every exit -----------------------------------------
LAB=bsvc-$$-$((RANDOM % 1000))
WORK=$(mktemp -d /tmp/bench-services.XXXXXX)
RES=$WORK/results
mkdir -p "$RES"
LABCMD=("$BIN/oxvs-lab" --name "$LAB")
LAB_STARTED=0
BG_PIDS=()
NS=bench
PODS=(s1 s2 cl)

# The script's own stdout/stderr, for the traps: a signal can arrive while a
# redirection of a shell function (`lab ... >file`) is in force.
exec 8>&1 9>&2
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  exec 1>&8 2>&9
  set +e
  # Our servers: the pidfiles, then whatever still runs in OUR pods'
  # namespaces (nothing but what this script started runs there: the pods
  # declare no ports, so the lab starts no server in them).
  for f in "$WORK"/*.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  if [ $LAB_STARTED = 1 ]; then
    for p in "${PODS[@]}"; do
      ip netns pids "$LAB-$NS-$p" 2>/dev/null | xargs -r kill 2>/dev/null
    done
  fi
  for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [ $LAB_STARTED = 1 ]; then
    echo "==> oxvs-lab down ($LAB)"
    if ! "${LABCMD[@]}" down >"$WORK/down.log" 2>&1; then
      cat "$WORK/down.log" >&2
      echo "bench-services.sh: 'oxvs-lab --name $LAB down' failed; see above" >&2
      KEEP_WORK=1
      [ $rc = 0 ] && rc=1
    fi
  fi
  if [ $KEEP_WORK = 1 ]; then
    echo "work directory kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'echo "bench-services.sh: interrupted" >&9; exit 130' INT
trap 'exit 143' TERM

lab() { "${LABCMD[@]}" "$@"; }

START_EPOCH=$(date +%s)
echo "==> $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); lab $LAB, $TRIALS trials, iperf3 -t $DURATION"
if [ $PROXY = 1 ]; then MODE_FLAG=--proxy; else MODE_FLAG=--kube-proxy; fi
echo "==> oxvs-lab up --nodes 2 $MODE_FLAG"
LAB_STARTED=1   # down is safe on a half-built lab
lab up --nodes 2 $MODE_FLAG >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2; die "oxvs-lab up failed"; }

cat >"$WORK/bench.yaml" <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: v1
kind: Pod
metadata: {name: s1, namespace: bench, labels: {app: s1}}
spec:
  nodeName: node-1
  containers: [{name: c}]
---
apiVersion: v1
kind: Pod
metadata: {name: s2, namespace: bench, labels: {app: s2}}
spec:
  nodeName: node-2
  containers: [{name: c}]
---
apiVersion: v1
kind: Pod
metadata: {name: cl, namespace: bench, labels: {role: client}}
spec:
  nodeName: node-1
  containers: [{name: c}]
---
apiVersion: v1
kind: Service
metadata: {name: svc-s1, namespace: bench}
spec:
  clusterIP: 10.96.100.1
  selector: {app: s1}
  ports:
  - {name: iperf, port: 5201, targetPort: 5201}
  - {name: rr, port: 7000, targetPort: 7000}
---
apiVersion: v1
kind: Service
metadata: {name: svc-s2, namespace: bench}
spec:
  clusterIP: 10.96.100.2
  selector: {app: s2}
  ports:
  - {name: iperf, port: 5201, targetPort: 5201}
  - {name: rr, port: 7000, targetPort: 7000}
EOF
echo "==> apply pods s1 (node-1), s2 (node-2), cl (node-1); Services svc-s1, svc-s2"
lab apply -f "$WORK/bench.yaml" >"$WORK/apply.log" 2>&1 || { cat "$WORK/apply.log" >&2; die "apply failed"; }
grep -q "Endpoints bench/svc-s1: 1 address" "$WORK/apply.log" &&
  grep -q "Endpoints bench/svc-s2: 1 address" "$WORK/apply.log" || { cat "$WORK/apply.log" >&2; die "Endpoints not written"; }
grep -i "warn" "$WORK/apply.log" >&2 || true

lab status --json >"$WORK/status.json"
read -r S1 S2 SW1 SW2 < <("$PY" - "$WORK/status.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ip = {p["name"]: p["ip"] for p in d["pods"] if p["namespace"] == "bench"}
sw = {n["name"]: n["switchd"]["pid"] for n in d["nodes"]}
print(ip["s1"], ip["s2"], sw["node-1"], sw["node-2"])
EOF
)
SVC1=10.96.100.1
SVC2=10.96.100.2

# --- servers ----------------------------------------------------------------------
start_bg() { # pod name cmd...
  local pod=$1 name=$2; shift 2
  # sh writes its own pid, then execs the server: the pidfile names the server.
  lab exec "$NS/$pod" -- sh -c 'echo $$ > "$0"; exec "$@"' "$WORK/$pod.$name.pid" "$@" \
    >"$WORK/$pod.$name.log" 2>&1 &
  BG_PIDS+=($!)
}
for p in s1 s2; do
  start_bg "$p" iperf iperf3 -s -p 5201
  start_bg "$p" rr "$PY" "$HELPER" server --port 7000
done
start_bg cl rr "$PY" "$HELPER" server --port 7000

# Reachability: the echo port through every path (pod IPs and ClusterIPs:
# kube-proxy's rules and Endpoints in place), retried for up to 15 s.
echo "==> wait until every path answers"
for dst in 127.0.0.1 "$S1" "$SVC1" "$S2" "$SVC2"; do
  ok=0
  for _ in $(seq 1 30); do
    if lab exec "$NS/cl" -- "$PY" "$HELPER" crr --host "$dst" --port 7000 --count 1 >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  [ $ok = 1 ] || { KEEP_WORK=1; die "cl cannot reach $dst:7000 (work directory kept)"; }
done
# iperf3 on 5201 (the Services' targetPort) through every path; also warms up.
for dst in "$S1" "$SVC1" "$S2" "$SVC2"; do
  ok=0
  for _ in $(seq 1 10); do
    if lab exec "$NS/cl" -- iperf3 -c "$dst" -p 5201 -t 1 --connect-timeout 2000 >"$WORK/warmup-$dst.log" 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  [ $ok = 1 ] || { KEEP_WORK=1; cat "$WORK/warmup-$dst.log" >&2; die "iperf3 to $dst:5201 failed"; }
done
POD_MTU=$(lab exec "$NS/cl" -- cat /sys/class/net/eth0/mtu 2>/dev/null || echo null)

# --- measurements -------------------------------------------------------------------
# id|label|destination|iperf (1/0)
PATHS=(
  "pod-same|pod -> pod, same node|$S1|1"
  "svc-same|pod -> ClusterIP, same node|$SVC1|1"
  "pod-cross|pod -> pod, across nodes|$S2|1"
  "svc-cross|pod -> ClusterIP, across nodes|$SVC2|1"
  "loopback|loopback in the client pod (probe floor)|127.0.0.1|0"
)

SWSOCK1=/run/oxvs-lab/$LAB/node-1/switchd.sock
SWSOCK2=/run/oxvs-lab/$LAB/node-2/switchd.sock
swstats() { # both switches' port counters and datapath counters, one JSON line
  printf '{"node1_ports":%s,"node2_ports":%s,"node1_stats":%s,"node2_stats":%s}\n' \
    "$("$BIN/oxvsctl" --socket "$SWSOCK1" --json dump-ports 2>/dev/null || echo null)" \
    "$("$BIN/oxvsctl" --socket "$SWSOCK2" --json dump-ports 2>/dev/null || echo null)" \
    "$("$BIN/oxvsctl" --socket "$SWSOCK1" --json stats 2>/dev/null || echo null)" \
    "$("$BIN/oxvsctl" --socket "$SWSOCK2" --json stats 2>/dev/null || echo null)"
}
ticks() { # utime+stime of a pid, clock ticks (comm has no spaces here)
  awk '{print $14 + $15}' "/proc/$1/stat"
}
cpu_line() { # user nice system idle iowait irq softirq steal
  awk '/^cpu /{print $2, $3, $4, $5, $6, $7, $8, $9; exit}' /proc/stat
}
HZ=$(getconf CLK_TCK)
FAILED=0

run_iperf() { # id trial dst
  local id=$1 t=$2 dst=$3 base="$RES/$1.t$2"
  local a1 a2 b1 b2 c0 c1 rc=0
  swstats >"$base.sw0.json"
  a1=$(ticks "$SW1"); a2=$(ticks "$SW2"); c0=$(cpu_line)
  lab exec "$NS/cl" -- iperf3 -c "$dst" -p 5201 -t "$DURATION" -J --connect-timeout 3000 \
    >"$base.iperf.json" 2>"$base.iperf.err" || rc=$?
  b1=$(ticks "$SW1"); b2=$(ticks "$SW2"); c1=$(cpu_line)
  swstats >"$base.sw1.json"
  "$PY" - "$base.iperf.json" "$HZ" "$a1" "$b1" "$a2" "$b2" "$c0" "$c1" "$base.sw0.json" "$base.sw1.json" >"$base.switchd.json" <<'EOF'
import json, sys
f, hz = sys.argv[1], int(sys.argv[2])
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return {}
s0, s1 = load(sys.argv[9]), load(sys.argv[10])
def ports(snap, node):
    return {p["name"]: p["stats"] for p in ((snap.get(f"node{node}_ports") or {}).get("ports") or [])}
drops, port_delta = 0, {}
for node in (1, 2):
    a, b = ports(s0, node), ports(s1, node)
    for name, st in b.items():
        d = {k: v - a.get(name, {}).get(k, 0) for k, v in st.items()}
        port_delta[f"node-{node}/{name}"] = d
        drops += d.get("rx_dropped", 0) + d.get("tx_dropped", 0)
def dp(node, key):
    x0 = (s0.get(f"node{node}_stats") or {}).get(key)
    x1 = (s1.get(f"node{node}_stats") or {}).get(key)
    return x1 - x0 if x0 is not None and x1 is not None else None
sw_pkts = {f"node-{n}": dp(n, "packets") for n in (1, 2)}
a1, b1, a2, b2 = (int(x) for x in sys.argv[3:7])
c0 = [int(x) for x in sys.argv[7].split()]
c1 = [int(x) for x in sys.argv[8].split()]
try:
    nbytes = json.load(open(f))["end"]["sum_received"]["bytes"]
except Exception:
    nbytes = 0
d = [y - x for x, y in zip(c0, c1)]
names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
dd = dict(zip(names, d))
busy = sum(d) - dd["idle"] - dd["iowait"]
mib = nbytes / 2**20 if nbytes else None
sw_s = ((b1 - a1) + (b2 - a2)) / hz
out = {
    "bytes_received": nbytes,
    "switchd_node1_cpu_s": (b1 - a1) / hz,
    "switchd_node2_cpu_s": (b2 - a2) / hz,
    "switchd_us_per_mib": round(sw_s * 1e6 / mib, 1) if mib else None,
    "machine_cpu_s": {k: v / hz for k, v in dd.items()},
    "machine_busy_us_per_mib": round(busy / hz * 1e6 / mib, 1) if mib else None,
    "switch_port_drops": drops,
    "switch_packets": sw_pkts,
    "switch_packets_per_mib": round(sum(v or 0 for v in sw_pkts.values()) / mib, 1) if mib else None,
    "switch_ports": port_delta,
}
print(json.dumps(out))
EOF
  if [ $rc != 0 ]; then
    FAILED=$((FAILED + 1))
    echo "   ! iperf3 to $dst failed (rc $rc): $(head -c 300 "$base.iperf.err") $(grep -o '"error":.*' "$base.iperf.json" | head -c 300)" >&2
    return 0
  fi
  "$PY" - "$base.iperf.json" "$base.switchd.json" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["end"]
s = json.load(open(sys.argv[2]))
print(f"   iperf3 {e['sum_received']['bits_per_second']/1e9:6.2f} Gbit/s, "
      f"{e['sum_sent'].get('retransmits', 0)} retransmits, switch drops {s['switch_port_drops']}, "
      f"{s['switch_packets_per_mib']} switch pkts/MiB, switchd {s['switchd_us_per_mib']} µs/MiB")
EOF
}

run_probe() { # kind id trial dst count
  local kind=$1 id=$2 t=$3 dst=$4 n=$5 base="$RES/$2.t$3" rc=0
  lab exec "$NS/cl" -- "$PY" "$HELPER" "$kind" --host "$dst" --port 7000 --count "$n" \
    >"$base.$kind.json" 2>"$base.$kind.err" || rc=$?
  if [ $rc != 0 ]; then
    FAILED=$((FAILED + 1))
    echo "   ! $kind to $dst failed (rc $rc): $(head -c 300 "$base.$kind.err")" >&2
    return 0
  fi
  "$PY" - "$base.$kind.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
if j["kind"] == "rr":
    l = j["lat_us"]
    print(f"   rr     p50 {l['p50']} µs, p99 {l['p99']} µs")
else:
    c = j["connect_us"]
    print(f"   crr    {j['per_s']} conn/s, connect p50 {c['p50']} µs, p99 {c['p99']} µs")
EOF
}

LOADS=()
for t in $(seq 1 "$TRIALS"); do
  LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
  echo "==> trial $t/$TRIALS (load $(cut -d' ' -f1-3 /proc/loadavg))"
  for p in "${PATHS[@]}"; do
    IFS='|' read -r id label dst do_iperf <<<"$p"
    echo "-- $label ($dst)"
    [ "$do_iperf" = 1 ] && run_iperf "$id" "$t" "$dst"
    run_probe rr "$id" "$t" "$dst" "$RR_COUNT"
    run_probe crr "$id" "$t" "$dst" "$CRR_COUNT"
  done
done
LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
END_EPOCH=$(date +%s)

# --- report ----------------------------------------------------------------------
"$PY" - "$WORK/meta.json" <<EOF
import json, os, platform, subprocess, sys
def sh(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return None
paths = []
for p in """$(printf '%s\n' "${PATHS[@]}")""".strip().splitlines():
    i, label, dst, ip = p.split("|")
    paths.append({"id": i, "label": label, "destination": dst, "iperf": ip == "1"})
meta = {
    "benchmark": "scripts/bench-services.sh",
    "command": "scripts/bench-services.sh $ORIG_ARGS".strip(),
    "date_utc": subprocess.run(["date", "-u", "-d", "@$START_EPOCH", "+%FT%TZ"], capture_output=True, text=True).stdout.strip(),
    "runtime_s": $END_EPOCH - $START_EPOCH,
    "trials": $TRIALS,
    "iperf_duration_s": $DURATION,
    "rr_round_trips": $RR_COUNT,
    "crr_connections": $CRR_COUNT,
    "lab": "$LAB",
    "machine": {
        "nproc": int(sh("nproc") or 0),
        "kernel": platform.release(),
        "cpu_model": sh("lscpu | sed -n 's/^Model name:[[:space:]]*//p'"),
        "mem_total": sh("awk '/MemTotal/{print \$2\" kB\"}' /proc/meminfo"),
        "os": sh(". /etc/os-release && echo \$PRETTY_NAME"),
        "load1_per_trial_start_and_end": [float(x) for x in "${LOADS[*]}".split()],
    },
    "software": {
        "iperf3": sh("iperf3 --version | head -1"),
        "python": platform.python_version(),
        "kube_proxy": "none" if $PROXY else sh("$CACHE/bin/kube-proxy --version"),
        "git": sh("git -C $REPO rev-parse --short HEAD") + (" (dirty)" if sh("git -C $REPO status --porcelain --untracked-files=no") else ""),
        "oxvs_switchd_mtime": sh("date -u -r $BIN/oxvs-switchd +%FT%TZ"),
    },
    "topology": {
        "client": "bench/cl on node-1", "s1": "$S1 (node-1)", "s2": "$S2 (node-2)",
        "svc-s1": "$SVC1", "svc-s2": "$SVC2", "pod_mtu": "$POD_MTU",
        "kube_proxy": "none: oxvs-agent --proxy (oxvs-lab up --proxy)" if $PROXY else "iptables mode, one per node (oxvs-lab up --kube-proxy)",
        "services": "oxvs proxy" if $PROXY else "kube-proxy",
    },
    "paths": paths,
    "pairs": [["pod -> pod, same node", "pod -> ClusterIP, same node"],
              ["pod -> pod, across nodes", "pod -> ClusterIP, across nodes"]],
    "failures": $FAILED,
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF

echo
if [ $PROXY = 1 ]; then WHO="oxvs's Service proxy"; else WHO=kube-proxy; fi
echo "## Services through $WHO: $(date -u -d "@$START_EPOCH" +%FT%TZ), $(nproc) CPUs, kernel $(uname -r), load $(printf '%s ' "${LOADS[@]}")"
echo "## median [min–max] of $TRIALS trials; iperf3 -t $DURATION; RR $RR_COUNT round trips; CRR $CRR_COUNT connections; runtime $((END_EPOCH - START_EPOCH)) s"
echo
report=("$PY" "$HELPER" report --dir "$RES" --meta "$WORK/meta.json")
[ -n "$JSON" ] && report+=(--json "$JSON")
"${report[@]}"
if [ $FAILED -gt 0 ]; then
  KEEP_WORK=1
  die "$FAILED measurement(s) failed (raw output in $WORK)"
fi
