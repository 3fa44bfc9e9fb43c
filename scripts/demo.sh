#!/usr/bin/env bash
# The oxvs demo: sets up and builds (scripts/setup.sh), then shows the
# offline tools on the example pipeline examples/antrea-like.flows:
# validating it, dumping it with table names, and tracing packets through it;
# then a live oxvs-switchd forwarding between two pods in network namespaces
# (made for the demo, named oxdemo-<pid>-*, removed at the end).
# Idempotent. Usage (as root): scripts/demo.sh
set -Eeuo pipefail
cd "$(dirname "$0")/.."
current="scripts/setup.sh"
trap 'printf "\nFAILED at step: %s\n" "$current" >&2' ERR
scripts/setup.sh

OXVSCTL=target/release/oxvsctl
FLOWS=examples/antrea-like.flows
heading() { current="$*"; printf '\n\n######## %s\n' "$*"; }
run() { printf '\n$ %s\n' "$*"; "$@"; }
# A trace with table names; each pass through the tables ends in a
# "Datapath actions:" line (a ct() recirculates: a second pass follows).
trace() {
  printf '\n$ %s trace --flows %s %s\n' "$OXVSCTL" "$FLOWS" "$*"
  "$OXVSCTL" trace --flows "$FLOWS" --names "$@"
}

heading "1. Validate the example pipeline (syntax, then as one atomic bundle)"
run "$OXVSCTL" check-flows "$FLOWS"

heading "2. The flows as oxvs holds them (dump-flows --names, tables L3Forwarding and IngressRule)"
run "$OXVSCTL" dump-flows --flows "$FLOWS" --names --no-stats --table L3Forwarding
run "$OXVSCTL" dump-flows --flows "$FLOWS" --names --no-stats --table IngressRule

heading "3. Trace: client-1 (port 3) -> web-1 (port 4) TCP 80, a new connection: allowed by the policy"
trace --ct-next trk,new \
  'tcp,in_port=3,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.3,nw_dst=10.244.0.4,nw_ttl=64,tp_src=40000,tp_dst=80'

heading "4. Trace: db-1 (port 5) -> web-1 TCP 80: dropped by NetworkPolicy (db-1 may only send DNS)"
trace --ct-next trk,new \
  'tcp,in_port=5,dl_src=0a:58:0a:f4:00:05,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.5,nw_dst=10.244.0.4,nw_ttl=64,tp_src=40000,tp_dst=80'

heading "5. Trace: client-1 -> 10.244.1.7, a pod on the other node: routed into the tunnel (port 2)"
trace --ct-next trk,new \
  'tcp,in_port=3,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:01,nw_src=10.244.0.3,nw_dst=10.244.1.7,nw_ttl=64,tp_src=40000,tp_dst=443'

heading "6. A live switch: two pods in network namespaces, forwarded by oxvs-switchd over AF_XDP"
SWITCHD=target/release/oxvs-switchd
tag="oxdemo-$$"
node="$tag-node"; pod_a="$tag-a"; pod_b="$tag-b"; sock="/tmp/$tag.sock"
switchd_pid=""
cleanup() {
  [ -n "$switchd_pid" ] && kill "$switchd_pid" 2>/dev/null && wait "$switchd_pid" 2>/dev/null
  for ns in "$pod_a" "$pod_b" "$node"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -f "$sock"
}
trap cleanup EXIT
for ns in "$node" "$pod_a" "$pod_b"; do ip netns add "$ns"; done
# pod X: eth0 in its namespace, the host end pX in the node's namespace.
make_pod() { # ns hostif ip mac
  ip link add "$2" netns "$node" type veth peer name eth0 netns "$1"
  ip -n "$1" link set eth0 address "$4" up
  ip -n "$1" addr add "$3/24" dev eth0
  ip netns exec "$1" ethtool -K eth0 tx off >/dev/null  # AF_XDP sees raw frames
  ip -n "$node" link set "$2" up
}
make_pod "$pod_a" p1 10.10.0.1 02:00:0a:0a:00:01
make_pod "$pod_b" p2 10.10.0.2 02:00:0a:0a:00:02
log="/tmp/$tag-switchd.log"
printf '\n$ ip netns exec %s %s --socket %s 2>%s &\n' "$node" "$SWITCHD" "$sock" "$log"
ip netns exec "$node" "$SWITCHD" --socket "$sock" 2>"$log" &
switchd_pid=$!
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
ctl() { printf '\n$ oxvsctl %s\n' "$*"; "$OXVSCTL" --socket "$sock" "$@"; }
ctl add-port p1 --ofport 1
ctl add-port p2 --ofport 2
ctl add-flows examples/switch-two-pods.flows
ctl show
run ip netns exec "$pod_a" ping -c 3 -i 0.2 10.10.0.2
ctl dump-flows
ctl dump-ports
ctl stats

current="done"
printf '\n\nDemo finished. Next: scripts/test.sh runs every test, including the\n'
printf 'differential tests against Open vSwitch (ctl/tests/ovs_diff.rs).\n'
