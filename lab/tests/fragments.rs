//! IP fragments between pods, through the real switches, on one node and
//! across nodes (each fragment VXLAN-encapsulated): large pings and large
//! UDP datagrams (which the pods' kernels fragment at their MTU) get their
//! answers, and NetworkPolicy decides on the whole datagram's ports: a
//! policy that allows UDP/80 lets a fragmented datagram to port 80 through
//! and keeps the same datagram to port 81 and the big ping out.
//!
//! Root and AF_XDP are required; the test says SKIPPED and passes without
//! them.

mod common;

use common::Lab;

fn ip_of(status: &Value, name: &str) -> String {
    let (ns, pod) = name.split_once('/').expect("ns/name");
    common::pod_ip(status, ns, pod)
}
use serde_json::Value;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: fx, labels: {ns: fx}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: a, namespace: fx, labels: {pod: a}}
  spec:
    nodeName: node-1
    containers:
    - name: c
      ports:
      - {containerPort: 80, protocol: UDP}
      - {containerPort: 81, protocol: UDP}
- apiVersion: v1
  kind: Pod
  metadata: {name: b, namespace: fx, labels: {pod: b}}
  spec:
    nodeName: node-1
    containers:
    - name: c
      ports:
      - {containerPort: 80, protocol: UDP}
      - {containerPort: 81, protocol: UDP}
- apiVersion: v1
  kind: Pod
  metadata: {name: c, namespace: fx, labels: {pod: c}}
  spec:
    nodeName: node-2
    containers:
    - name: c
      ports:
      - {containerPort: 80, protocol: UDP}
      - {containerPort: 81, protocol: UDP}
"#;

/// Only UDP/80 may reach the pods of namespace fx.
const ALLOW_UDP_80: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: udp-80-only, namespace: fx}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - ports:
    - {protocol: UDP, port: 80}
"#;

fn ping(lab: &Lab, from: &str, ip: &str, size: &str) -> bool {
    lab.run(&[
        "exec", from, "--", "ping", "-c", "2", "-W", "2", "-s", size, ip,
    ])
    .status
    .success()
}

#[test]
fn fragments_pass_conntrack_and_policy_on_one_node_and_across_nodes() {
    skip_unless_capable!();
    let lab = Lab::up(2);
    let pods = lab.file("pods.yaml", PODS);
    lab.ok(&["apply", "-f", &pods]);
    let st = lab.status();
    let (b, c) = (ip_of(&st, "fx/b"), ip_of(&st, "fx/c"));

    // No policy: everything answered, same node (b) and across nodes (c).
    for (ip, where_) in [(&b, "same node"), (&c, "across nodes")] {
        assert!(ping(&lab, "fx/a", ip, "3000"), "ping -s 3000 {where_}");
        assert!(ping(&lab, "fx/a", ip, "8000"), "ping -s 8000 {where_}");
        for port in [80, 81] {
            assert_eq!(
                lab.udp_echo("fx/a", ip, port, 4000),
                "4000",
                "4000-byte UDP to port {port}, {where_}"
            );
        }
    }

    // Policy on the whole datagram: UDP/80 allowed, UDP/81 and ICMP not.
    let pol = lab.file("pol.yaml", ALLOW_UDP_80);
    lab.ok(&["apply", "-f", &pol]);
    // `apply` writes the manifest; the agents install the policy a moment
    // later. Wait until a small datagram to the denied port goes unanswered
    // on both nodes (each try is a new connection: a new source port).
    for ip in [&b, &c] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while lab.udp_echo("fx/a", ip, 81, 100) != "timeout" {
            assert!(
                std::time::Instant::now() < deadline,
                "the policy never took effect for {ip}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    for (ip, where_) in [(&b, "same node"), (&c, "across nodes")] {
        assert_eq!(
            lab.udp_echo("fx/a", ip, 80, 4000),
            "4000",
            "allowed port, {where_}"
        );
        assert_eq!(
            lab.udp_echo("fx/a", ip, 81, 4000),
            "timeout",
            "denied port, {where_}"
        );
        assert!(!ping(&lab, "fx/a", ip, "3000"), "ICMP denied, {where_}");
        // Small datagrams agree with the big ones.
        assert_eq!(lab.udp_echo("fx/a", ip, 80, 100), "100");
        assert_eq!(lab.udp_echo("fx/a", ip, 81, 100), "timeout");
    }
}
