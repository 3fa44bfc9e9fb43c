//! IPv6-only Services through the REAL kube-proxy (v1.20, iptables mode)
//! on a 2-node `oxvs-lab up --kube-proxy --ip-family ipv6`, as in a
//! single-stack IPv6 cluster: the API server's one ClusterIP range is
//! IPv6 (`fd00:10:96::/108`, the `kubernetes` Service at `fd00:10:96::1`
//! with the underlay bridge's IPv6 address as its endpoint), each
//! kube-proxy runs the IPv6 proxier only (`ip6tables`; its `iptables` nat
//! table has no Service rules) from the IPv6 Endpoints the lab writes,
//! and oxvs carries the traffic between IPv6-only pods and nodes.
//!
//! One lab (about 30 s). Pods `web/a1` (node-1) and `web/a2` (node-2)
//! serve, `web/c1` and `web/c2` are clients, `dns/d1` (node-2) runs
//! dnsmasq on its IPv6 address. Services, none naming a family: `svc-a1`
//! / `svc-a2` (a backend each, TCP and UDP), `svc-ab` (both pods, its
//! ClusterIP allocated by the API server), `svc-empty` (no endpoints),
//! `svc-np` (NodePort 30086), `kube-dns` (`fd00:10:96::a`, the DNS pod).
//! The test checks what the API server made of them (IPv6 ClusterIPs,
//! IPv6 Endpoints), what `apply` refuses (IPv4 families and addresses,
//! `RequireDualStack`, IPv4 Endpoints), waits until both proxiers
//! programmed every port, then probes in parallel: pod -> ClusterIP, TCP
//! and UDP, backend on the same and the other node; `svc-ab` answered by
//! both backends; an AAAA query over UDP and TCP through `kube-dns`; the
//! NodePort from the other node's host and from the underlay over IPv6;
//! `svc-empty` refused at once (ip6tables REJECT); the `kubernetes`
//! Service from a pod on each node. Finally `svc-ab` is deleted and its
//! rules go.
//!
//! Skips (SKIPPED, passes; fails with `OXVS_TESTS_NO_SKIP=1`) only when
//! not root (or without AF_XDP) or without the kube-proxy build. On
//! failure the table of every path is printed with `ip6tables-save -t nat`
//! and `conntrack -L -f ipv6` of both nodes.

mod common;

use std::net::IpAddr;
use std::time::Instant;

use common::kube::{evidence6, in_node, wait_rules};
use common::paths::{path, pod, Proto, Report, Want, DNS_A, DNS_AAAA};
use common::{pod_field, Lab, N1_V6, N2_V6};
use oxvs_lab::service::Family;
use serde_json::Value;

fn pods_yaml() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: dns}\n",
    );
    y += &pod("web", "a1", "node-1", "{app: a, pod: a1}", true);
    y += &pod("web", "a2", "node-2", "{app: a, pod: a2}", true);
    y += &pod("web", "c1", "node-1", "{role: client}", false);
    y += &pod("web", "c2", "node-2", "{role: client}", false);
    y += &pod("dns", "d1", "node-2", "{app: dns}", false);
    y
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: svc-a1, namespace: web}
spec:
  clusterIP: "fd00:10:96::111"
  selector: {pod: a1}
  ports:
  - {name: tcp, port: 80, targetPort: http}
  - {name: udp, port: 80, protocol: UDP, targetPort: http-udp}
---
apiVersion: v1
kind: Service
metadata: {name: svc-a2, namespace: web}
spec:
  clusterIP: "fd00:10:96::112"
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-ab, namespace: web}
spec:
  selector: {app: a}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-empty, namespace: web}
spec:
  clusterIP: "fd00:10:96::130"
  selector: {app: nothing}
  ports:
  - {name: tcp, port: 80}
  - {name: udp, port: 80, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: svc-np, namespace: web}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30086}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30086}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: dns}
spec:
  clusterIP: "fd00:10:96::a"
  selector: {app: dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
"#;

/// Objects an IPv6-only lab refuses, and what the error must name.
const REFUSED: &[(&str, &str)] = &[
    (
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad4, namespace: web}\nspec:\n  ipFamilies: [IPv4]\n  selector: {app: a}\n  ports: [{port: 80}]\n",
        "spec.ipFamilies[0] IPv4",
    ),
    (
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad4, namespace: web}\nspec:\n  clusterIP: 10.96.1.50\n  selector: {app: a}\n  ports: [{port: 80}]\n",
        "spec.clusterIP",
    ),
    (
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad4, namespace: web}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  selector: {app: a}\n  ports: [{port: 80}]\n",
        "RequireDualStack",
    ),
    (
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad4, namespace: web}\nspec:\n  externalIPs: [192.168.77.200]\n  selector: {app: a}\n  ports: [{port: 80}]\n",
        "spec.externalIPs[0]",
    ),
    (
        "apiVersion: v1\nkind: Service\nmetadata: {name: manual, namespace: web}\nspec:\n  ports: [{port: 80}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: manual, namespace: web}\nsubsets:\n- addresses: [{ip: 10.244.1.5}]\n  ports: [{port: 8080}]\n",
        "subsets[0].addresses[0].ip must be an IPv6",
    ),
];

fn kubectl_json(lab: &Lab, args: &[&str]) -> Value {
    let mut argv = vec!["kubectl", "get"];
    argv.extend_from_slice(args);
    argv.extend(["-o", "json"]);
    let out = lab.ok(&argv);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}:\n{out}"))
}

fn is_v6(s: &Value) -> bool {
    s.as_str()
        .and_then(|s| s.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6())
}

#[test]
fn ipv6_only_services_work_through_kube_proxy_and_oxvs() {
    skip_unless_capable!();
    if let Some(why) = common::kube_proxy_build() {
        oxvs_testutil::skip_or_fail(why);
        return;
    }
    let t0 = Instant::now();
    let lab = Lab::up_args(&["--nodes", "2", "--kube-proxy", "--ip-family", "ipv6"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);
    eprintln!(
        "up --kube-proxy --ip-family ipv6: {} ms",
        t0.elapsed().as_millis()
    );

    // The API server is single-stack IPv6: the `kubernetes` Service has an
    // IPv6 ClusterIP and the bridge's IPv6 address as its endpoint.
    let k = kubectl_json(&lab, &["service", "kubernetes"]);
    assert_eq!(k["spec"]["clusterIP"], "fd00:10:96::1", "{k}");
    let ep = kubectl_json(&lab, &["endpoints", "kubernetes"]);
    assert_eq!(
        ep["subsets"][0]["addresses"][0]["ip"], "fd00:192:168:77::1",
        "{ep}"
    );
    // Every kube-proxy runs the IPv6 proxier only.
    for i in 1..=2 {
        let nat6 = in_node(&lab, i, &["ip6tables-save", "-t", "nat"]);
        assert!(
            nat6.contains("default/kubernetes:https") && nat6.contains("-j KUBE-SERVICES"),
            "node-{i}: no IPv6 Service rules:\n{nat6}"
        );
        let nat4 = in_node(&lab, i, &["iptables-save", "-t", "nat"]);
        assert!(
            !nat4.contains("KUBE-SERVICES") && !nat4.contains("KUBE-SVC-"),
            "node-{i}: IPv4 Service rules in an IPv6-only lab:\n{nat4}"
        );
        let filter6 = in_node(&lab, i, &["ip6tables-save", "-t", "filter"]);
        assert!(
            filter6.contains("-A KUBE-FIREWALL") && !filter6.contains("127.0.0.0/8"),
            "node-{i}: kubelet's IPv6 rules:\n{filter6}"
        );
    }

    let out = lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods_yaml())]);
    assert!(out.contains("Pod web/c2 created on node-2"), "{out}");
    let d1 = pod_field(&lab.status(), "dns", "d1", "ip6");
    let dnsmasq = format!(
        "dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --address=/svc.test/{DNS_A} \
         --address=/svc.test/{DNS_AAAA} --listen-address={d1} --bind-interfaces --port=53 \
         --user=root --group=root --pid-file={dir}/dnsmasq.pid --log-facility={dir}/dnsmasq.log",
        dir = lab.dir.path().display()
    );
    lab.ok(&["exec", "dns/d1", "--", "sh", "-c", &dnsmasq]);

    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    for line in [
        "Service web/svc-a1 created",
        "Service web/svc-ab created",
        "Endpoints web/svc-ab: 2 addresses",
        "Endpoints dns/kube-dns: 1 address",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    // The API server gave the Service naming no family an IPv6 ClusterIP
    // of its range; the lab wrote the pods' IPv6 addresses.
    let ab = kubectl_json(&lab, &["service", "-n", "web", "svc-ab"]);
    let ab_ip = ab["spec"]["clusterIP"].as_str().unwrap_or("").to_string();
    assert!(
        is_v6(&ab["spec"]["clusterIP"]) && ab_ip.starts_with("fd00:10:96::"),
        "{ab}"
    );
    let ep = kubectl_json(&lab, &["endpoints", "-n", "web", "svc-ab"]);
    let addrs: Vec<&Value> = ep["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["addresses"].as_array().into_iter().flatten())
        .map(|a| &a["ip"])
        .collect();
    assert!(
        addrs.len() == 2 && addrs.iter().all(|a| is_v6(a)),
        "svc-ab's Endpoints: {ep}"
    );
    let np = kubectl_json(&lab, &["service", "-n", "web", "svc-np"]);
    assert!(is_v6(&np["spec"]["clusterIP"]), "{np}");

    // What an IPv6-only cluster has no room for is refused, naming the field.
    for (i, (yaml, want)) in REFUSED.iter().enumerate() {
        let out = lab.run(&["apply", "-f", &lab.file(&format!("bad{i}.yaml"), yaml)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{want:?}: {}",
            common::show(&["apply", yaml], &out)
        );
    }

    use Family::Ipv6;
    wait_rules(
        &lab,
        2,
        &[
            (Ipv6, "web/svc-a1:tcp", Some(1)),
            (Ipv6, "web/svc-a1:udp", Some(1)),
            (Ipv6, "web/svc-a2:tcp", Some(1)),
            (Ipv6, "web/svc-a2:udp", Some(1)),
            (Ipv6, "web/svc-ab", Some(2)),
            (Ipv6, "web/svc-empty:tcp", Some(0)),
            (Ipv6, "web/svc-empty:udp", Some(0)),
            (Ipv6, "web/svc-np:tcp", Some(1)),
            (Ipv6, "web/svc-np:udp", Some(1)),
            (Ipv6, "dns/kube-dns:dns", Some(1)),
            (Ipv6, "dns/kube-dns:dns-tcp", Some(1)),
            (Family::Ipv4, "web/svc-ab", None),
        ],
        "Services",
    );

    // The host answers a REJECT to a pod only once it knows the pod's
    // neighbour entry (see kube_proxy_dual_stack.rs): each client talks to
    // its gateway first.
    for (pod, gw) in [
        ("web/c1", "fd00:10:244:1::1"),
        ("web/c2", "fd00:10:244:2::1"),
    ] {
        lab.ok(&["exec", pod, "--", "ping", "-6", "-c", "1", "-W", "2", gw]);
    }
    let (c1, c2) = (ns("web-c1"), ns("web-c2"));
    let (n1, n2, ul) = (ns("node-1"), ns("node-2"), ns("ul"));
    let a = |x: &'static str| Want::Answer(vec![x]);
    let any = || Want::Answer(vec![]);
    use Proto::*;
    let (a1, a2, empty, dns) = (
        "fd00:10:96::111",
        "fd00:10:96::112",
        "fd00:10:96::130",
        "fd00:10:96::a",
    );
    let paths = vec![
        path(
            "pod->ClusterIP TCP, same node (c1->a1)",
            &c1,
            (a1, 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "pod->ClusterIP TCP, same node (c2->a2)",
            &c2,
            (a2, 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->ClusterIP TCP, other node (c1->a2)",
            &c1,
            (a2, 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->ClusterIP TCP, other node (c2->a1)",
            &c2,
            (a1, 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "pod->ClusterIP UDP, same node (c1->a1)",
            &c1,
            (a1, 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP UDP, other node (c2->a1)",
            &c2,
            (a1, 80),
            Udp,
            any(),
        ),
        path(
            "pod->ClusterIP UDP, other node (c1->a2)",
            &c1,
            (a2, 80),
            Udp,
            any(),
        ),
        path(
            "allocated ClusterIP, a backend per node: both answer (c1)",
            &c1,
            (ab_ip.as_str(), 80),
            Tcp,
            Want::Spread(16, vec!["web/a1", "web/a2"]),
        ),
        path(
            "allocated ClusterIP, a backend per node: both answer (c2)",
            &c2,
            (ab_ip.as_str(), 80),
            Tcp,
            Want::Spread(16, vec!["web/a1", "web/a2"]),
        ),
        path(
            "host->ClusterIP TCP, remote backend (node-1->a2)",
            &n1,
            (a2, 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "Service without endpoints, TCP: refused",
            &c1,
            (empty, 80),
            Tcp,
            Want::RefusedByHost6,
        ),
        path(
            "Service without endpoints, UDP: refused",
            &c2,
            (empty, 80),
            Udp,
            Want::RefusedByHost6,
        ),
        path(
            "cluster DNS, AAAA over UDP (c1, other node)",
            &c1,
            (dns, 53),
            DnsAaaaUdp,
            any(),
        ),
        path(
            "cluster DNS, AAAA over TCP (c1, other node)",
            &c1,
            (dns, 53),
            DnsAaaaTcp,
            any(),
        ),
        path(
            "cluster DNS, AAAA over UDP (c2, same node)",
            &c2,
            (dns, 53),
            DnsAaaaUdp,
            any(),
        ),
        path(
            "NodePort from another node's host, TCP (node-1 -> node-2, local backend)",
            &n1,
            (N2_V6, 30086),
            Tcp,
            a("web/a2"),
        ),
        path(
            "NodePort from another node's host, TCP (node-2 -> node-1, remote backend)",
            &n2,
            (N1_V6, 30086),
            Tcp,
            a("web/a2"),
        ),
        path(
            "NodePort from the underlay, TCP, backend on the other node",
            &ul,
            (N1_V6, 30086),
            Tcp,
            a("web/a2"),
        ),
        path(
            "NodePort from the underlay, UDP, backend on the other node",
            &ul,
            (N1_V6, 30086),
            Udp,
            any(),
        ),
        path(
            "pod->kubernetes Service (API server outside, c1)",
            &c1,
            ("fd00:10:96::1", 443),
            TcpConnect,
            any(),
        ),
        path(
            "pod->kubernetes Service (API server outside, c2)",
            &c2,
            ("fd00:10:96::1", 443),
            TcpConnect,
            any(),
        ),
    ];
    let mut report = Report::new(evidence6);
    report.check(&lab, "every path", &paths);

    // Deleting a Service takes its ip6tables rules away.
    let svc_ab = SERVICES
        .split("---")
        .find(|d| d.contains("name: svc-ab,"))
        .expect("svc-ab in SERVICES");
    lab.ok(&["delete", "-f", &lab.file("svc-ab.yaml", svc_ab)]);
    wait_rules(&lab, 2, &[(Ipv6, "web/svc-ab", None)], "svc-ab deleted");
    report.finish();
}
