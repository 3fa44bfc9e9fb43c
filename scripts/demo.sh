#!/usr/bin/env bash
# The oxvs demo: sets up and builds (scripts/setup.sh), then shows the
# offline tools on the example pipeline examples/antrea-like.flows:
# validating it, dumping it with table names, and tracing packets through it.
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

current="done"
printf '\n\nDemo finished. Next: scripts/test.sh runs every test, including the\n'
printf 'differential tests against Open vSwitch (ctl/tests/ovs_diff.rs).\n'
