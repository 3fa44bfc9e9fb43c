//! Services through the REAL kube-proxy (v1.20, iptables mode) on a 2-node
//! `oxvs-lab up --kube-proxy`: every path kube-proxy serves, probed with
//! real traffic from pods, node host namespaces and the underlay (the
//! "outside" of the cluster).
//!
//! One lab for everything (about 25 s). The pods (`web` on both nodes: a1
//! and h1 on node-1, a2 on node-2, clients c1 on node-1 and c2 on node-2;
//! `dns/d1` with dnsmasq on node-2) and every Service are applied, the
//! test waits until both kube-proxies have programmed each Service port
//! with the expected number of endpoints (polling `iptables-save` in the
//! node namespaces; no sleeps), then probes all paths in parallel, one
//! thread per probe `setns`-ed into its source namespace:
//!
//! - pod -> ClusterIP, TCP and UDP, backend on the same node and on the
//!   other node (the TCP greeting names the backend pod); hairpin (the pod
//!   is its own only backend); a host-network backend (a selector-less
//!   Service whose Endpoints name node-2's address, a server in node-2's
//!   host namespace) from both nodes;
//! - host (node namespace) -> ClusterIP, local and remote backend;
//! - NodePort, `externalTrafficPolicy: Cluster`, from the other node's host
//!   and from outside (the underlay namespace), TCP and UDP;
//!   `externalTrafficPolicy: Local`: the node with the endpoint answers
//!   with the source kept, the other node does not answer at all;
//! - a Service without endpoints: TCP and UDP refused at once (kube-proxy's
//!   REJECT), not a timeout;
//! - `sessionAffinity: ClientIP`: 12 connections per client land on one
//!   backend, while the same two backends without affinity both answer;
//! - the `kubernetes` Service (the API server outside the pod network);
//! - cluster DNS: dnsmasq in a pod behind ClusterIP 10.96.0.10:53, queried
//!   over UDP and TCP from pods on both nodes;
//!
//! then, in order: NetworkPolicy after DNAT (deny-all ingress in `web`:
//! pod -> ClusterIP fails from both nodes; allowing the clients: they pass,
//! a non-client pod still does not); Endpoints following pods (deleting a2
//! turns its Service into a REJECT); SCTP (the kernel has conntrack and the
//! `sctp` match but no SCTP sockets: the test checks that kube-proxy's
//! SCTP rules load, no SCTP traffic is sent); a malformed Service refused
//! with the field named, an IPv6 Service refused in this IPv4-only lab;
//! `delete -f` of a Service removes its rules.
//!
//! Skips (prints SKIPPED, passes; fails with `OXVS_TESTS_NO_SKIP=1`) only
//! when not root (or without AF_XDP) or when the kube-proxy build
//! (`$OXVS_K8S_CACHE/bin/kube-proxy`, default `/var/cache/oxvs-k8s`) is
//! missing; anything else missing fails (`up
//! --kube-proxy` says what). On failure the table of every path is printed
//! with evidence: `iptables-save -t nat`, `conntrack -L` of both nodes.

mod common;

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use common::paths::{path, pod, Proto, Report, Want};
use common::{lab_bin, Lab};
use oxvs_lab::service::Family;

const N1: &str = "192.168.77.11";
const N2: &str = "192.168.77.12";
const UL: &str = "192.168.77.1";

fn pods_yaml() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: dns}\n",
    );
    y += &pod("web", "a1", "node-1", "{app: a, pod: a1}", true);
    y += &pod("web", "a2", "node-2", "{app: a, pod: a2}", true);
    y += &pod("web", "h1", "node-1", "{pod: h1}", true);
    y += &pod("web", "c1", "node-1", "{role: client}", false);
    y += &pod("web", "c2", "node-2", "{role: client}", false);
    // No declared ports: dnsmasq, not the lab's server, listens on 53.
    y += &pod("dns", "d1", "node-2", "{app: dns}", false);
    y
}

/// Every Service (and the host backend's Endpoints).
const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: svc-a1, namespace: web}
spec:
  clusterIP: 10.96.1.11
  selector: {pod: a1}
  ports:
  - {name: tcp, port: 80, targetPort: http}
  - {name: udp, port: 80, protocol: UDP, targetPort: http-udp}
---
apiVersion: v1
kind: Service
metadata: {name: svc-a2, namespace: web}
spec:
  clusterIP: 10.96.1.12
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-hair, namespace: web}
spec:
  clusterIP: 10.96.1.13
  selector: {pod: h1}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-host, namespace: web}
spec:
  clusterIP: 10.96.1.14
  ports:
  - {name: tcp, port: 80, targetPort: 18080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 18080}
---
apiVersion: v1
kind: Endpoints
metadata: {name: svc-host, namespace: web}
subsets:
- addresses: [{ip: 192.168.77.12, nodeName: node-2}]
  ports:
  - {name: tcp, port: 18080}
  - {name: udp, port: 18080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: svc-np, namespace: web}
spec:
  type: NodePort
  clusterIP: 10.96.1.15
  selector: {app: a}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-local, namespace: web}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  clusterIP: 10.96.1.16
  selector: {pod: a1}
  ports:
  - {port: 80, targetPort: 8080, nodePort: 30081}
---
apiVersion: v1
kind: Service
metadata: {name: svc-empty, namespace: web}
spec:
  clusterIP: 10.96.1.17
  selector: {app: nothing}
  ports:
  - {name: tcp, port: 80}
  - {name: udp, port: 80, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: svc-aff, namespace: web}
spec:
  clusterIP: 10.96.1.18
  sessionAffinity: ClientIP
  selector: {app: a}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: dns}
spec:
  clusterIP: 10.96.0.10
  selector: {app: dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
"#;

const SCTP_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: svc-sctp, namespace: web}
spec:
  clusterIP: 10.96.1.19
  selector: {pod: a1}
  ports:
  - {port: 80, protocol: SCTP, targetPort: 8080}
"#;

const DENY_ALL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: web}
spec: {podSelector: {}, policyTypes: [Ingress]}
"#;

const ALLOW_CLIENTS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients, namespace: web}
spec:
  podSelector: {matchLabels: {pod: a1}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
"#;

// ------------------------------------------------------------ the rules

/// Waits until both kube-proxies programmed `want` (Service port ->
/// endpoints; `None`: no rule at all) in their IPv4 proxier.
fn wait_rules(lab: &Lab, want: &[(&str, Option<usize>)], what: &str) {
    let want: Vec<(Family, &str, Option<usize>)> =
        want.iter().map(|(s, n)| (Family::Ipv4, *s, *n)).collect();
    common::kube::wait_rules(lab, 2, &want, what);
}

fn evidence(lab: &Lab) -> String {
    let mut s = String::new();
    for i in 1..=2 {
        let ns = format!("{}-node-{i}", lab.name);
        for argv in [
            vec!["conntrack", "-L"],
            vec!["iptables-save", "-t", "nat"],
            // ICMP errors the host sent, and those its rate limit ate.
            vec![
                "nstat",
                "-az",
                "IcmpOutDestUnreachs",
                "IcmpOutRedirects",
                "IcmpOutRateLimitHost",
            ],
        ] {
            let out = Command::new("ip")
                .args(["netns", "exec", &ns])
                .args(&argv)
                .output();
            let text = out
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            s += &format!("--- node-{i}: {} ---\n{text}", argv.join(" "));
        }
    }
    s
}

/// A server in node-2's host namespace: the host-network backend. It
/// listens on the node's address only: a UDP server on every address would
/// answer a pod on its own node from the gateway's address (the source
/// the route to the pod picks), which conntrack cannot match to the DNATed
/// request, as with any multi-homed UDP server.
struct HostServer(Child);

impl HostServer {
    fn start(ns: &str) -> HostServer {
        let mut c = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(lab_bin())
            .args([
                "serve",
                "--address",
                N2,
                "--id",
                "host/node-2",
                "--tcp",
                "18080",
                "--udp",
                "18080",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the host server");
        let mut line = [0u8; 5];
        let ok = c
            .stdout
            .as_mut()
            .is_some_and(|o| o.read_exact(&mut line).is_ok() && &line == b"ready");
        assert!(ok, "the host server did not say ready");
        HostServer(c)
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pod_ip(lab: &Lab, key: &str) -> String {
    lab.status()["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or("")
            ) == key
        })
        .and_then(|p| p["ip"].as_str())
        .unwrap_or_else(|| panic!("no ip for {key}"))
        .to_string()
}

#[test]
fn every_kube_proxy_path_works_through_oxvs() {
    skip_unless_capable!();
    if let Some(why) = common::kube_proxy_build() {
        oxvs_testutil::skip_or_fail(why);
        return;
    }
    let t0 = Instant::now();
    let lab = Lab::up_args(&["--nodes", "2", "--kube-proxy"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);
    eprintln!("up --kube-proxy: {} ms", t0.elapsed().as_millis());

    let out = lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods_yaml())]);
    assert!(out.contains("Pod web/c2 created on node-2"), "{out}");
    let d1 = pod_ip(&lab, "dns/d1");
    let dnsmasq = format!(
        "dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --address=/svc.test/10.1.2.3 \
         --listen-address={d1} --bind-interfaces --port=53 --user=root --group=root \
         --pid-file={dir}/dnsmasq.pid --log-facility={dir}/dnsmasq.log",
        dir = lab.dir.path().display()
    );
    lab.ok(&["exec", "dns/d1", "--", "sh", "-c", &dnsmasq]);
    let _host = HostServer::start(&ns("node-2"));

    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    for line in [
        "Service web/svc-a1 created",
        "Endpoints web/svc-host created",
        "Endpoints web/svc-np: 2 addresses",
        "Endpoints web/svc-empty: 0 addresses",
        "Endpoints dns/kube-dns: 1 address",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    let st = lab.status();
    assert_eq!(st["healthy"], true, "{st}");
    for n in st["nodes"].as_array().into_iter().flatten() {
        assert_eq!(n["kubeProxy"]["running"], true, "{n}");
    }
    let svcs = st["kube"]["services"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let np = svcs
        .iter()
        .find(|s| s["name"] == "svc-np")
        .unwrap_or_else(|| panic!("svc-np not in status: {st}"));
    assert_eq!(
        np["ports"],
        serde_json::json!(["80:30080/TCP", "80:30080/UDP"]),
        "{np}"
    );
    assert_eq!(np["endpoints"], 2, "{np}");

    wait_rules(
        &lab,
        &[
            ("web/svc-a1:tcp", Some(1)),
            ("web/svc-a1:udp", Some(1)),
            ("web/svc-a2:tcp", Some(1)),
            ("web/svc-a2:udp", Some(1)),
            ("web/svc-hair:tcp", Some(1)),
            ("web/svc-hair:udp", Some(1)),
            ("web/svc-host:tcp", Some(1)),
            ("web/svc-host:udp", Some(1)),
            ("web/svc-np:tcp", Some(2)),
            ("web/svc-np:udp", Some(2)),
            ("web/svc-local", Some(1)),
            ("web/svc-empty:tcp", Some(0)),
            ("web/svc-empty:udp", Some(0)),
            ("web/svc-aff", Some(2)),
            ("dns/kube-dns:dns", Some(1)),
            ("dns/kube-dns:dns-tcp", Some(1)),
        ],
        "Services",
    );

    let (c1, c2, h1) = (ns("web-c1"), ns("web-c2"), ns("web-h1"));
    let (n1, n2, ul) = (ns("node-1"), ns("node-2"), ns("ul"));
    let a = |x: &'static str| Want::Answer(vec![x]);
    let any = || Want::Answer(vec![]);
    let a12 = || Want::Answer(vec!["web/a1", "web/a2"]);
    use Proto::*;
    let paths = vec![
        path(
            "pod->ClusterIP TCP, backend same node (c1->a1)",
            &c1,
            ("10.96.1.11", 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "pod->ClusterIP TCP, backend same node (c2->a2)",
            &c2,
            ("10.96.1.12", 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->ClusterIP TCP, backend other node (c1->a2)",
            &c1,
            ("10.96.1.12", 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->ClusterIP TCP, backend other node (c2->a1)",
            &c2,
            ("10.96.1.11", 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "pod->ClusterIP UDP, backend same node (c1->a1)",
            &c1,
            ("10.96.1.11", 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP UDP, backend same node (c2->a2)",
            &c2,
            ("10.96.1.12", 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP UDP, backend other node (c1->a2)",
            &c1,
            ("10.96.1.12", 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP UDP, backend other node (c2->a1)",
            &c2,
            ("10.96.1.11", 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP TCP, hairpin (h1->h1)",
            &h1,
            ("10.96.1.13", 80),
            Tcp,
            a("web/h1"),
        ),
        path(
            "pod->ClusterIP UDP, hairpin (h1->h1)",
            &h1,
            ("10.96.1.13", 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP TCP, host-network backend other node (c1->node-2)",
            &c1,
            ("10.96.1.14", 80),
            Tcp,
            a("host/node-2"),
        ),
        path(
            "pod->ClusterIP UDP, host-network backend other node (c1->node-2)",
            &c1,
            ("10.96.1.14", 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP TCP, host-network backend own node (c2->node-2)",
            &c2,
            ("10.96.1.14", 80),
            Tcp,
            a("host/node-2"),
        ),
        path(
            "pod->ClusterIP UDP, host-network backend own node (c2->node-2)",
            &c2,
            ("10.96.1.14", 80),
            Udp,
            any(),
        ),
        path(
            "host->ClusterIP TCP, local backend (node-1->a1)",
            &n1,
            ("10.96.1.11", 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "host->ClusterIP TCP, remote backend (node-1->a2)",
            &n1,
            ("10.96.1.12", 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "host->ClusterIP UDP, remote backend (node-2->a1)",
            &n2,
            ("10.96.1.11", 80),
            Udp,
            any(),
        ),
        path(
            "host->ClusterIP UDP, local backend (node-2->a2)",
            &n2,
            ("10.96.1.12", 80),
            Udp,
            any(),
        ),
        path(
            "NodePort Cluster TCP, other node's host -> node-1",
            &n2,
            (N1, 30080),
            Tcp,
            a12(),
        ),
        path(
            "NodePort Cluster TCP, other node's host -> node-2",
            &n1,
            (N2, 30080),
            Tcp,
            a12(),
        ),
        path(
            "NodePort Cluster TCP, outside -> node-1",
            &ul,
            (N1, 30080),
            Tcp,
            a12(),
        ),
        path(
            "NodePort Cluster TCP, outside -> node-2",
            &ul,
            (N2, 30080),
            Tcp,
            a12(),
        ),
        path(
            "NodePort Cluster UDP, outside -> node-1",
            &ul,
            (N1, 30080),
            Udp,
            any(),
        ),
        path(
            "NodePort Cluster UDP, other node's host -> node-2",
            &n1,
            (N2, 30080),
            Udp,
            any(),
        ),
        path(
            "NodePort Local TCP, outside -> node with the endpoint",
            &ul,
            (N1, 30081),
            Tcp,
            a("web/a1"),
        ),
        path(
            "NodePort Local TCP, outside -> node without endpoint",
            &ul,
            (N2, 30081),
            Tcp,
            Want::Silent,
        ),
        path(
            "NodePort Local TCP, other node's host -> node with it",
            &n2,
            (N1, 30081),
            Tcp,
            a("web/a1"),
        ),
        path(
            "no endpoints TCP: rejected (pod on node-1)",
            &c1,
            ("10.96.1.17", 80),
            Tcp,
            Want::Refused,
        ),
        path(
            "no endpoints TCP: rejected (pod on node-2)",
            &c2,
            ("10.96.1.17", 80),
            Tcp,
            Want::Refused,
        ),
        path(
            "no endpoints UDP: rejected (pod on node-1)",
            &c1,
            ("10.96.1.17", 80),
            Udp,
            Want::Refused,
        ),
        path(
            "no endpoints TCP: rejected (host node-1)",
            &n1,
            ("10.96.1.17", 80),
            Tcp,
            Want::Refused,
        ),
        path(
            "sessionAffinity ClientIP: c1 sticks to one backend",
            &c1,
            ("10.96.1.18", 80),
            Tcp,
            Want::Sticky(12),
        ),
        path(
            "sessionAffinity ClientIP: c2 sticks to one backend",
            &c2,
            ("10.96.1.18", 80),
            Tcp,
            Want::Sticky(12),
        ),
        path(
            "no affinity: c1 reaches both backends",
            &c1,
            ("10.96.1.15", 80),
            Tcp,
            Want::Spread(24, vec!["web/a1", "web/a2"]),
        ),
        path(
            "pod->kubernetes Service (API server outside)",
            &c1,
            ("10.96.0.1", 443),
            TcpConnect,
            any(),
        ),
        path(
            "cluster DNS over UDP from node-1 (c1)",
            &c1,
            ("10.96.0.10", 53),
            DnsUdp,
            any(),
        ),
        path(
            "cluster DNS over TCP from node-1 (c1)",
            &c1,
            ("10.96.0.10", 53),
            DnsTcp,
            any(),
        ),
        path(
            "cluster DNS over UDP from node-2 (c2, same node)",
            &c2,
            ("10.96.0.10", 53),
            DnsUdp,
            any(),
        ),
        path(
            "cluster DNS over TCP from node-2 (c2, same node)",
            &c2,
            ("10.96.0.10", 53),
            DnsTcp,
            any(),
        ),
    ];
    let mut report = Report::new(evidence);
    report.check(&lab, "every path", &paths);

    // NodePort Local keeps the client's address: in node-1's conntrack the
    // outside client's connection is answered to the client itself.
    let ct = Command::new("ip")
        .args([
            "netns",
            "exec",
            &n1,
            "conntrack",
            "-L",
            "-p",
            "tcp",
            "--dport",
            "30081",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let kept = ct.lines().any(|l| {
        let dsts: Vec<&str> = l
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("dst="))
            .collect();
        let srcs: Vec<&str> = l
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("src="))
            .collect();
        srcs.first() == Some(&UL) && dsts.get(1) == Some(&UL)
    });
    assert!(
        kept,
        "NodePort Local must not SNAT the client (reply to {UL}):\n{ct}"
    );

    // NetworkPolicy applies to the backend after DNAT.
    lab.ok(&["apply", "-f", &lab.file("deny.yaml", DENY_ALL)]);
    report.converge(
        &lab,
        "deny-all ingress in web",
        path(
            "pod->ClusterIP blocked (c1->svc-a1, same node)",
            &c1,
            ("10.96.1.11", 80),
            Tcp,
            Want::Blocked,
        ),
        vec![
            path(
                "pod->ClusterIP blocked (c2->svc-a1, other node)",
                &c2,
                ("10.96.1.11", 80),
                Tcp,
                Want::Blocked,
            ),
            path(
                "pod->ClusterIP blocked (c1->svc-a2, other node)",
                &c1,
                ("10.96.1.12", 80),
                Tcp,
                Want::Blocked,
            ),
        ],
    );
    lab.ok(&["apply", "-f", &lab.file("allow.yaml", ALLOW_CLIENTS)]);
    report.converge(
        &lab,
        "allow clients into a1",
        path(
            "pod->ClusterIP allowed (c1->svc-a1, same node)",
            &c1,
            ("10.96.1.11", 80),
            Tcp,
            a("web/a1"),
        ),
        vec![
            path(
                "pod->ClusterIP allowed (c2->svc-a1, other node)",
                &c2,
                ("10.96.1.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "pod->ClusterIP still blocked (h1 not a client)",
                &h1,
                ("10.96.1.11", 80),
                Tcp,
                Want::Blocked,
            ),
            path(
                "pod->ClusterIP still blocked (c1->svc-a2)",
                &c1,
                ("10.96.1.12", 80),
                Tcp,
                Want::Blocked,
            ),
        ],
    );
    let policies = format!("{}\n---\n{}", DENY_ALL, ALLOW_CLIENTS);
    lab.ok(&["delete", "-f", &lab.file("policies.yaml", &policies)]);

    // The lab keeps Endpoints in step with the pods: a2 goes, svc-a2 rejects.
    let out = lab.ok(&[
        "delete",
        "-f",
        &lab.file(
            "a2.yaml",
            &pod("web", "a2", "node-2", "{app: a, pod: a2}", true),
        ),
    ]);
    assert!(out.contains("Endpoints web/svc-a2: 0 addresses"), "{out}");
    assert!(out.contains("Endpoints web/svc-np: 1 address"), "{out}");
    wait_rules(
        &lab,
        &[("web/svc-a2:tcp", Some(0)), ("web/svc-np:tcp", Some(1))],
        "a2 deleted",
    );
    report.check(
        &lab,
        "after a2 is deleted",
        &[
            path(
                "no endpoints any more: rejected (c1->svc-a2)",
                &c1,
                ("10.96.1.12", 80),
                Tcp,
                Want::Refused,
            ),
            path(
                "NodePort Cluster, one backend left",
                &ul,
                (N2, 30080),
                Tcp,
                a("web/a1"),
            ),
        ],
    );

    // SCTP: kube-proxy's rules load (nft compat has the sctp match and
    // conntrack); no SCTP traffic (this kernel has no SCTP sockets).
    lab.ok(&["apply", "-f", &lab.file("sctp.yaml", SCTP_SERVICE)]);
    wait_rules(&lab, &[("web/svc-sctp", Some(1))], "SCTP Service");
    let nat = Command::new("ip")
        .args(["netns", "exec", &n1, "iptables-save", "-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        nat.lines()
            .any(|l| l.contains("-d 10.96.1.19/32 -p sctp") && l.contains("-j KUBE-SVC-")),
        "no SCTP ClusterIP rule:\n{nat}"
    );
    assert!(
        nat.lines()
            .any(|l| l.contains("-p sctp") && l.contains("DNAT --to-destination")),
        "no SCTP DNAT rule:\n{nat}"
    );

    // A malformed Service: refused with the field named, nothing applied.
    let bad = lab.file(
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: web}\nspec: {ports: [{port: http}]}\n",
    );
    let out = lab.run(&["apply", "-f", &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("spec.ports[0].port"),
        "{err}"
    );
    // An IPv6 Service in this IPv4-only lab: refused with the reason (the
    // API server without dual-stack would silently drop `ipFamilies`).
    let v6 = lab.file(
        "v6.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: v6, namespace: web}\nspec: {ipFamilies: [IPv6], ports: [{port: 80}]}\n",
    );
    let out = lab.run(&["apply", "-f", &v6]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("IPv4-only") && err.contains("--ip-family dual"),
        "{err}"
    );

    // delete -f: the Service and its rules go.
    let out = lab.ok(&["delete", "-f", &lab.file("sctp-del.yaml", SCTP_SERVICE)]);
    assert!(out.contains("Service web/svc-sctp deleted"), "{out}");
    wait_rules(&lab, &[("web/svc-sctp", None)], "SCTP Service deleted");
    eprintln!("total (before down): {} ms", t0.elapsed().as_millis());
    report.finish();
}
