//! Dual-stack Services through the REAL kube-proxy (v1.20, iptables mode,
//! `IPv6DualStack`) on a 2-node `oxvs-lab up --kube-proxy --ip-family
//! dual`: the API server hands out IPv6 ClusterIPs, each kube-proxy runs
//! an IPv4 and an IPv6 proxier (`iptables`, `ip6tables`) from the
//! EndpointSlices the lab writes per family, and oxvs carries the traffic
//! of both families between pods, the gateway and the host's NAT.
//!
//! One lab (about 30 s). Pods `web/a1` (node-1) and `web/a2` (node-2)
//! serve, `web/c1` and `web/c2` are clients, `dns/d1` (node-2) runs
//! dnsmasq on its IPv6 address. Services: `svc-a1`/`svc-a2`
//! (`RequireDualStack`, a ClusterIP per family), `svc-v6` (IPv6 only,
//! both pods), `svc-empty6` (IPv6, no endpoints), `kube-dns6` (IPv6, the
//! DNS pod). The test waits until both proxiers of both nodes have
//! programmed every port with the expected endpoints, then probes in
//! parallel: pod -> IPv6 ClusterIP, TCP and UDP, backend on the same and
//! the other node; the same Services' IPv4 ClusterIPs; host -> IPv6
//! ClusterIP; a NodePort over IPv6 from outside the cluster (the
//! underlay, to either node's IPv6 address); an IPv6 Service without
//! endpoints refused at once (ip6tables REJECT); DNS over UDP and TCP to an IPv6 ClusterIP; both
//! backends of `svc-v6` answering. Then NetworkPolicy after DNAT over
//! IPv6: deny-all ingress in `web` blocks pod -> IPv6 ClusterIP, allowing
//! the clients lets them through. Finally the IPv6 Service is deleted and
//! its ip6tables rules go.
//!
//! Skips (SKIPPED, passes; fails with `OXVS_TESTS_NO_SKIP=1`) only when
//! not root (or without AF_XDP) or without the kube-proxy build. On
//! failure the table of every path is printed with `ip6tables-save -t nat`
//! and `conntrack -L -f ipv6` of both nodes.

mod common;

use std::time::Instant;

use common::kube::evidence6;
use common::paths::{path, pod, Proto, Report, Want};
use common::{pod_field, Lab, N1_V6, N2_V6};
use oxvs_lab::service::Family;

fn pods_yaml() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: dns}\n",
    );
    y += &pod("web", "a1", "node-1", "{app: a, pod: a1}", true);
    y += &pod("web", "a2", "node-2", "{app: a, pod: a2}", true);
    y += &pod("web", "c1", "node-1", "{role: client}", false);
    y += &pod("web", "c2", "node-2", "{role: client}", false);
    y += &pod("web", "x1", "node-1", "{role: other}", false);
    y += &pod("dns", "d1", "node-2", "{app: dns}", false);
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
  ipFamilyPolicy: RequireDualStack
  clusterIP: 10.96.1.12
  clusterIPs: [10.96.1.12, "fd00:10:96::112"]
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-v6, namespace: web}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::120"
  selector: {app: a}
  ports:
  - {port: 80, targetPort: 8080}
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
---
apiVersion: v1
kind: Service
metadata: {name: svc-np6, namespace: web}
spec:
  type: NodePort
  ipFamilies: [IPv6]
  selector: {pod: a2}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30086}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30086}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns6, namespace: dns}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:96::a"
  selector: {app: dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
"#;

const DENY_ALL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: web}
spec:
  podSelector: {matchLabels: {app: a}}
  policyTypes: [Ingress]
"#;

const ALLOW_CLIENTS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients, namespace: web}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
"#;

/// Both nodes' kube-proxies programmed `want`.
fn wait_rules(lab: &Lab, want: &[(Family, &str, Option<usize>)], what: &str) {
    common::kube::wait_rules(lab, 2, want, what);
}

#[test]
fn dual_stack_services_work_through_kube_proxy_and_oxvs() {
    skip_unless_capable!();
    if let Some(why) = common::kube_proxy_build() {
        oxvs_testutil::skip_or_fail(why);
        return;
    }
    let t0 = Instant::now();
    let lab = Lab::up_args(&["--nodes", "2", "--kube-proxy", "--ip-family", "dual"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);
    eprintln!(
        "up --kube-proxy --ip-family dual: {} ms",
        t0.elapsed().as_millis()
    );

    let out = lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods_yaml())]);
    assert!(out.contains("Pod web/c2 created on node-2"), "{out}");
    let d1 = pod_field(&lab.status(), "dns", "d1", "ip6");
    let dnsmasq = format!(
        "dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --address=/svc.test/10.1.2.3 \
         --listen-address={d1} --bind-interfaces --port=53 --user=root --group=root \
         --pid-file={dir}/dnsmasq.pid --log-facility={dir}/dnsmasq.log",
        dir = lab.dir.path().display()
    );
    lab.ok(&["exec", "dns/d1", "--", "sh", "-c", &dnsmasq]);

    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    for line in [
        "Service web/svc-a1 created",
        "Service web/svc-v6 created",
        "Endpoints web/svc-v6",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    // The API server gave the dual-stack Service both ClusterIPs.
    let svc = lab.ok(&[
        "kubectl", "get", "service", "-n", "web", "svc-a1", "-o", "json",
    ]);
    let svc: serde_json::Value = serde_json::from_str(&svc).expect("kubectl JSON");
    assert_eq!(
        svc["spec"]["clusterIPs"],
        serde_json::json!(["10.96.1.11", "fd00:10:96::111"]),
        "{svc}"
    );
    assert_eq!(
        svc["spec"]["ipFamilies"],
        serde_json::json!(["IPv4", "IPv6"]),
        "{svc}"
    );

    use Family::{Ipv4, Ipv6};
    wait_rules(
        &lab,
        &[
            (Ipv4, "web/svc-a1:tcp", Some(1)),
            (Ipv6, "web/svc-a1:tcp", Some(1)),
            (Ipv6, "web/svc-a1:udp", Some(1)),
            (Ipv4, "web/svc-a2:tcp", Some(1)),
            (Ipv6, "web/svc-a2:tcp", Some(1)),
            (Ipv6, "web/svc-a2:udp", Some(1)),
            (Ipv6, "web/svc-v6", Some(2)),
            (Ipv4, "web/svc-v6", None),
            (Ipv6, "web/svc-empty6:tcp", Some(0)),
            (Ipv6, "web/svc-empty6:udp", Some(0)),
            (Ipv6, "web/svc-np6:tcp", Some(1)),
            (Ipv6, "web/svc-np6:udp", Some(1)),
            (Ipv6, "dns/kube-dns6:dns", Some(1)),
            (Ipv6, "dns/kube-dns6:dns-tcp", Some(1)),
        ],
        "Services",
    );

    // The host answers a REJECT to a pod only once it knows the pod's
    // neighbour entry; a first packet meets neighbour discovery and its
    // ICMPv6 error may be lost (the SYN is refused at its retransmission,
    // a second later). Each client talks to its gateway first, as any pod
    // that has sent traffic has.
    for (pod, gw) in [
        ("web/c1", "fd00:10:244:1::1"),
        ("web/c2", "fd00:10:244:2::1"),
    ] {
        lab.ok(&["exec", pod, "--", "ping", "-6", "-c", "1", "-W", "2", gw]);
    }
    let (c1, c2, x1) = (ns("web-c1"), ns("web-c2"), ns("web-x1"));
    let (n1, n2, ul) = (ns("node-1"), ns("node-2"), ns("ul"));
    let a = |x: &'static str| Want::Answer(vec![x]);
    let any = || Want::Answer(vec![]);
    use Proto::*;
    let a1v6 = "fd00:10:96::111";
    let a2v6 = "fd00:10:96::112";
    let paths = vec![
        path(
            "pod->IPv6 ClusterIP TCP, same node (c1->a1)",
            &c1,
            (a1v6, 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "pod->IPv6 ClusterIP TCP, same node (c2->a2)",
            &c2,
            (a2v6, 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->IPv6 ClusterIP TCP, other node (c1->a2)",
            &c1,
            (a2v6, 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->IPv6 ClusterIP TCP, other node (c2->a1)",
            &c2,
            (a1v6, 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "pod->IPv6 ClusterIP UDP, same node (c1->a1)",
            &c1,
            (a1v6, 80),
            Udp,
            any(),
        ),
        path(
            "pod->IPv6 ClusterIP UDP, other node (c2->a1)",
            &c2,
            (a1v6, 80),
            Udp,
            any(),
        ),
        path(
            "pod->IPv6 ClusterIP UDP, other node (c1->a2)",
            &c1,
            (a2v6, 80),
            Udp,
            any(),
        ),
        path(
            "pod->IPv4 ClusterIP of a dual-stack Service (c1->a2)",
            &c1,
            ("10.96.1.12", 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "pod->IPv4 ClusterIP of a dual-stack Service (c2->a1)",
            &c2,
            ("10.96.1.11", 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "host->IPv6 ClusterIP TCP, local backend (node-1->a1)",
            &n1,
            (a1v6, 80),
            Tcp,
            a("web/a1"),
        ),
        path(
            "host->IPv6 ClusterIP TCP, remote backend (node-1->a2)",
            &n1,
            (a2v6, 80),
            Tcp,
            a("web/a2"),
        ),
        path(
            "host->IPv6 ClusterIP UDP, remote backend (node-2->a1)",
            &n2,
            (a1v6, 80),
            Udp,
            any(),
        ),
        path(
            "IPv6 Service without endpoints, TCP: refused",
            &c1,
            ("fd00:10:96::130", 80),
            Tcp,
            Want::RefusedByHost6,
        ),
        path(
            "IPv6 Service without endpoints, UDP: refused",
            &c2,
            ("fd00:10:96::130", 80),
            Udp,
            Want::RefusedByHost6,
        ),
        path(
            "DNS over UDP to an IPv6 ClusterIP (c1, other node)",
            &c1,
            ("fd00:10:96::a", 53),
            DnsUdp,
            any(),
        ),
        path(
            "DNS over TCP to an IPv6 ClusterIP (c2, same node)",
            &c2,
            ("fd00:10:96::a", 53),
            DnsTcp,
            any(),
        ),
        path(
            "NodePort over IPv6 from outside, TCP, backend on the other node",
            &ul,
            (N1_V6, 30086),
            Tcp,
            a("web/a2"),
        ),
        path(
            "NodePort over IPv6 from outside, TCP, backend on this node",
            &ul,
            (N2_V6, 30086),
            Tcp,
            a("web/a2"),
        ),
        path(
            "NodePort over IPv6 from outside, UDP, backend on the other node",
            &ul,
            (N1_V6, 30086),
            Udp,
            any(),
        ),
        path(
            "IPv6-only Service with a backend per node: both answer (c1)",
            &c1,
            ("fd00:10:96::120", 80),
            Tcp,
            Want::Spread(16, vec!["web/a1", "web/a2"]),
        ),
    ];
    let mut report = Report::new(evidence6);
    report.check(&lab, "every path", &paths);

    // NetworkPolicy after kube-proxy's DNAT, over IPv6: the policy sees
    // the pod's IPv6 address as the source and the backend's as the
    // destination.
    lab.ok(&["apply", "-f", &lab.file("deny.yaml", DENY_ALL)]);
    report.converge(
        &lab,
        "deny-all ingress",
        path(
            "deny-all: c1->IPv6 ClusterIP (a2, other node)",
            &c1,
            (a2v6, 80),
            Tcp,
            Want::Blocked,
        ),
        vec![path(
            "deny-all: c2->IPv6 ClusterIP (a2, same node)",
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
            "allow clients: c1->IPv6 ClusterIP (a2)",
            &c1,
            (a2v6, 80),
            Tcp,
            a("web/a2"),
        ),
        vec![
            path(
                "allow clients: c2->IPv6 ClusterIP (a1)",
                &c2,
                (a1v6, 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "allow clients: x1 (not a client) still blocked",
                &x1,
                (a1v6, 80),
                Tcp,
                Want::Blocked,
            ),
        ],
    );

    // Deleting the IPv6 Service takes its ip6tables rules away.
    let svc_v6 = SERVICES
        .split("---")
        .find(|d| d.contains("name: svc-v6,"))
        .expect("svc-v6 in SERVICES");
    lab.ok(&["delete", "-f", &lab.file("svc-v6.yaml", svc_v6)]);
    wait_rules(&lab, &[(Ipv6, "web/svc-v6", None)], "svc-v6 deleted");
    let slices = lab.ok(&[
        "kubectl",
        "get",
        "endpointslices",
        "-n",
        "web",
        "-o",
        "name",
    ]);
    assert!(
        !slices.contains("svc-v6"),
        "svc-v6's EndpointSlices are left:\n{slices}"
    );
    assert!(slices.contains("svc-a1-ipv6-0"), "{slices}");
    report.finish();
}
