//! IPv6 and dual-stack Services through the in-pipeline proxy
//! (`oxvs-lab up --proxy --ip-family dual`, the agents run `--proxy`): the
//! lab, playing the API server, gives each Service a ClusterIP per family
//! it asks for (`spec.clusterIPs`) and writes EndpointSlices per family;
//! the switch load-balances the IPv6 ClusterIPs with select groups and
//! `ct(commit,nat(dst=[ADDR]:PORT))`. Real traffic from pods and hosts:
//!
//! - pod -> IPv6 ClusterIP of a dual-stack Service, TCP and UDP, backend on
//!   the same node and on the other node, and the same Service's IPv4
//!   ClusterIP;
//! - an IPv6-only Service with a backend on each node: 24 connections
//!   reach both; `sessionAffinity: ClientIP` over IPv6: 12 connections
//!   from one client reach one backend (learned with the IPv6 endpoint in
//!   `reg8`-`reg11`);
//! - hairpin over IPv6: a pod reaching itself through its Service (SNATed
//!   to `fc01::a9fe:a9fc`), TCP and UDP;
//! - host -> IPv6 ClusterIP (routed via `fc01::a9fe:a9fd`, for which the
//!   switch answers Neighbour Discovery);
//! - an IPv6 Service without endpoints: refused at once (the switch
//!   answers ICMPv6 port unreachable);
//! - NodePorts over IPv6 from outside (the underlay namespace, to the
//!   nodes' IPv6 addresses): `externalTrafficPolicy: Cluster` on both
//!   nodes (SNATed to the IPv6 gateway), the same dual-stack NodePort over
//!   IPv4, `Local` answered by the node with the endpoint and dropped by
//!   the other;
//! - the switch's view: `tcp6,ipv6_dst=` ServiceLB flows and groups with
//!   bracketed IPv6 NAT targets;
//! - NetworkPolicy after DNAT over IPv6: deny-all ingress blocks
//!   pod -> IPv6 ClusterIP, allowing the clients lets them through;
//! - an IPv6 Service in an IPv4-only lab is refused with the reason (in
//!   `lab/tests/proxy.rs`).
//!
//! Skips only when not root or without AF_XDP (SKIPPED; fails with
//! `OXVS_TESTS_NO_SKIP=1`).

mod common;

use std::time::{Duration, Instant};

use common::paths::{path, pod, Proto, Report, Want};
use common::{Lab, N1_V6, N2_V6};

fn pods_yaml() -> String {
    let mut y = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n");
    y += &pod("web", "a1", "node-1", "{app: ab, pod: a1}", true);
    y += &pod("web", "a2", "node-2", "{app: ab, pod: a2}", true);
    y += &pod("web", "h1", "node-2", "{pod: h1}", true);
    y += &pod("web", "c1", "node-1", "{role: client}", false);
    y += &pod("web", "c2", "node-2", "{role: client}", false);
    y += &pod("web", "x1", "node-1", "{role: other}", false);
    y
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: svc-a1, namespace: web}
spec:
  ipFamilyPolicy: RequireDualStack
  clusterIP: 10.96.1.11
  clusterIPs: [10.96.1.11, "fd00:10:96::111"]
  selector: {pod: a1}
  ports:
  - {name: tcp, port: 80, targetPort: http}
  - {name: udp, port: 80, protocol: UDP, targetPort: http-udp}
---
apiVersion: v1
kind: Service
metadata: {name: svc-a2, namespace: web}
spec:
  ipFamilyPolicy: PreferDualStack
  clusterIP: 10.96.1.12
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-ab6, namespace: web}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::113"
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-aff6, namespace: web}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::114"
  sessionAffinity: ClientIP
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-hair6, namespace: web}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::116"
  selector: {pod: h1}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-np, namespace: web}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30086}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30086}
---
apiVersion: v1
kind: Service
metadata: {name: svc-np-local, namespace: web}
spec:
  type: NodePort
  ipFamilies: [IPv6]
  externalTrafficPolicy: Local
  selector: {pod: a2}
  ports:
  - {port: 80, targetPort: 8080, nodePort: 30087}
---
apiVersion: v1
kind: Service
metadata: {name: svc-empty6, namespace: web}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::130"
  selector: {app: nothing}
  ports:
  - {name: tcp, port: 80}
  - {name: udp, port: 80, protocol: UDP}
"#;

const DENY_ALL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: web}
spec: {podSelector: {matchLabels: {app: ab}}, policyTypes: [Ingress]}
"#;

const ALLOW_CLIENTS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients, namespace: web}
spec:
  podSelector: {matchLabels: {app: ab}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
"#;

fn evidence(lab: &Lab) -> String {
    common::paths::switch_evidence(
        lab,
        &["node-1", "node-2"],
        &[
            &["dump-flows", "--table", "35"],
            &["dump-groups"],
            &["dump-conntrack"],
        ],
    )
}

/// Waits until both switches have `n` IPv6 Service ports with a group and
/// `empty` rejecting ones in ServiceLB, and the hosts' NodePort rules
/// (IPv6 for 30086 and 30087, IPv4 for the dual-stack 30086) are in.
fn wait_services6(lab: &Lab, n: usize, empty: usize) {
    let t = Instant::now();
    loop {
        let mut ok = true;
        for node in ["node-1", "node-2"] {
            let flows = lab.ctl(node, &["dump-flows", "--table", "35"]);
            let v6 = |l: &&str| l.contains("ipv6_dst=fd00:10:96::");
            let groups = flows
                .lines()
                .filter(v6)
                .filter(|l| l.contains("actions=group:"))
                .count();
            let rejects = flows
                .lines()
                .filter(v6)
                .filter(|l| l.contains("actions=controller("))
                .count();
            ok &= groups == n && rejects == empty;
            // The host's side of the NodePorts (the agent writes them
            // after the flows): without them the host refuses a probe
            // from outside before the switch sees it.
            let i = if node == "node-1" { 1 } else { 2 };
            let nat6 = common::kube::in_node(lab, i, &["ip6tables-save", "-t", "nat"]);
            let nat4 = common::kube::in_node(lab, i, &["iptables-save", "-t", "nat"]);
            ok &= ["30086", "30087"].iter().all(|p| {
                nat6.contains(&format!("--dport {p}")) && nat6.contains("-j OXVS-NODEPORTS")
            }) && nat4.contains("--dport 30086");
        }
        if ok {
            eprintln!(
                "IPv6 Services programmed after {} ms",
                t.elapsed().as_millis()
            );
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the agents did not program {n} IPv6 Service ports ({empty} empty) within 15 s:\n{}",
            evidence(lab)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ipv6_services_are_load_balanced_in_the_switch() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--proxy", "--ip-family", "dual"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);

    let out = lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods_yaml())]);
    assert!(out.contains("Pod web/c2 created on node-2"), "{out}");
    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    assert!(out.contains("Service web/svc-a1 created"), "{out}");
    // svc-a1 and svc-a2 tcp+udp, svc-ab6, svc-aff6, svc-hair6 tcp+udp,
    // svc-np tcp+udp, svc-np-local; svc-empty6 rejects (tcp+udp).
    wait_services6(&lab, 11, 2);
    // The lab gave svc-a2 (PreferDualStack, no IPv6 address asked) the
    // first free IPv6 ClusterIP, as the API server's allocator would.
    let svc = std::fs::read_to_string(lab.root().join("manifests/service_web_svc-a2.yaml"))
        .expect("svc-a2's manifest");
    assert!(svc.contains("fd00:10:96::a"), "{svc}");
    let groups = lab.ctl("node-1", &["dump-groups"]);
    assert!(groups.contains("nat(dst=[fd00:10:244:"), "{groups}");
    assert!(
        groups.contains("selection_method=hash,fields=ipv6_src"),
        "{groups}"
    );

    let (c1, c2, h1, x1) = (ns("web-c1"), ns("web-c2"), ns("web-h1"), ns("web-x1"));
    let (n1, ul) = (ns("node-1"), ns("ul"));
    let a = |x: &'static str| Want::Answer(vec![x]);
    let any = || Want::Answer(vec![]);
    use Proto::*;
    let a1v6 = "fd00:10:96::111";
    let a2v6 = "fd00:10:96::a";
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "IPv6 ClusterIP",
        &[
            path(
                "c1 -> svc-a1 IPv6 TCP (same node, named port)",
                &c1,
                (a1v6, 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c1 -> svc-a2 IPv6 TCP (other node)",
                &c1,
                (a2v6, 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "c2 -> svc-a1 IPv6 TCP (other node)",
                &c2,
                (a1v6, 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c2 -> svc-a2 IPv6 TCP (same node)",
                &c2,
                (a2v6, 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "c1 -> svc-a1 IPv6 UDP (same node)",
                &c1,
                (a1v6, 80),
                Udp,
                any(),
            ),
            path(
                "c1 -> svc-a2 IPv6 UDP (other node)",
                &c1,
                (a2v6, 80),
                Udp,
                any(),
            ),
            path(
                "c2 -> svc-a1 IPv6 UDP (other node)",
                &c2,
                (a1v6, 80),
                Udp,
                any(),
            ),
            path(
                "c1 -> svc-a2 IPv4 TCP (the dual-stack Service's other family)",
                &c1,
                ("10.96.1.12", 80),
                Tcp,
                a("web/a2"),
            ),
            path("c2 -> svc-a1 IPv4 UDP", &c2, ("10.96.1.11", 80), Udp, any()),
            path(
                "c1 -> svc-ab6 TCP x24: both backends",
                &c1,
                ("fd00:10:96::113", 80),
                Tcp,
                Want::Spread(24, vec!["web/a1", "web/a2"]),
            ),
            path(
                "c2 -> svc-aff6 TCP x12: one backend",
                &c2,
                ("fd00:10:96::114", 80),
                Tcp,
                Want::Sticky(12),
            ),
            path(
                "h1 -> svc-hair6 TCP (hairpin)",
                &h1,
                ("fd00:10:96::116", 80),
                Tcp,
                a("web/h1"),
            ),
            path(
                "h1 -> svc-hair6 UDP (hairpin)",
                &h1,
                ("fd00:10:96::116", 80),
                Udp,
                any(),
            ),
            path(
                "node-1 host -> svc-a2 IPv6 TCP",
                &n1,
                (a2v6, 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "node-1 host -> svc-a1 IPv6 TCP (local backend)",
                &n1,
                (a1v6, 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c1 -> svc-empty6 TCP: refused at once",
                &c1,
                ("fd00:10:96::130", 80),
                Tcp,
                Want::Refused,
            ),
            path(
                "c2 -> svc-empty6 UDP: refused at once",
                &c2,
                ("fd00:10:96::130", 80),
                Udp,
                Want::Refused,
            ),
            path(
                "outside -> node-1 NodePort over IPv6, TCP (backend on node-2)",
                &ul,
                (N1_V6, 30086),
                Tcp,
                a("web/a2"),
            ),
            path(
                "outside -> node-2 NodePort over IPv6, TCP (backend here)",
                &ul,
                (N2_V6, 30086),
                Tcp,
                a("web/a2"),
            ),
            path(
                "outside -> node-1 NodePort over IPv6, UDP",
                &ul,
                (N1_V6, 30086),
                Udp,
                any(),
            ),
            path(
                "outside -> node-1 NodePort over IPv4 (the same Service)",
                &ul,
                ("192.168.77.11", 30086),
                Tcp,
                a("web/a2"),
            ),
            path(
                "outside -> node-2 NodePort over IPv6, Local, backend here",
                &ul,
                (N2_V6, 30087),
                Tcp,
                a("web/a2"),
            ),
            path(
                "outside -> node-1 NodePort over IPv6, Local, no backend here: dropped",
                &ul,
                (N1_V6, 30087),
                Tcp,
                Want::Silent,
            ),
        ],
    );
    // The affinity was learned with the IPv6 endpoint.
    let learned = lab.ctl("node-2", &["dump-flows", "--table", "34"]);
    assert!(
        learned.contains("ipv6_src=") && learned.contains("NXM_NX_REG8[]"),
        "no IPv6 SessionAffinity flow learned:\n{learned}"
    );

    // NetworkPolicy after DNAT, over IPv6.
    lab.ok(&["apply", "-f", &lab.file("deny.yaml", DENY_ALL)]);
    report.converge(
        &lab,
        "deny-all ingress",
        path(
            "deny-all: c1 -> svc-a2 IPv6 (other node)",
            &c1,
            (a2v6, 80),
            Tcp,
            Want::Blocked,
        ),
        vec![path(
            "deny-all: c2 -> svc-a2 IPv6 (same node)",
            &c2,
            (a2v6, 80),
            Tcp,
            Want::Blocked,
        )],
    );
    lab.ok(&["apply", "-f", &lab.file("allow.yaml", ALLOW_CLIENTS)]);
    report.converge(
        &lab,
        "allow the clients",
        path(
            "allow: c1 -> svc-a2 IPv6",
            &c1,
            (a2v6, 80),
            Tcp,
            a("web/a2"),
        ),
        vec![
            path(
                "allow: c2 -> svc-a1 IPv6",
                &c2,
                (a1v6, 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "allow: x1 (not a client) still blocked",
                &x1,
                (a1v6, 80),
                Tcp,
                Want::Blocked,
            ),
        ],
    );
    report.finish();
}
