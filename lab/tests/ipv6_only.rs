//! IPv6-only pods and nodes on a real 2-node lab (`up --ip-family ipv6`),
//! as an IPv6-only Kubernetes cluster has them:
//!
//! - what Kubernetes and the agents are told is IPv6 only: each Node
//!   object has its IPv6 pod CIDR (`fd00:10:244:N::/64`) and IPv6
//!   InternalIP alone, each agent runs with that CIDR, the node's IPv6
//!   address as `--node-ip` and the IPv6 tunnel's MTU, and a Pod's
//!   `status.podIP`/`podIPs`/`hostIP` are IPv6;
//! - pods have no IPv4 address (inside the pod only `lo` has one), their
//!   IPv6 address is in their node's pod CIDR, and the nodes have no IPv4
//!   address either;
//! - TCP, UDP and ping between pods on one node and across nodes, hosts
//!   to pods, a UDP datagram larger than the tunnel's MTU (fragments)
//!   across nodes, all over the IPv6 tunnel (its port on the node's IPv6
//!   address; the receiving switch classified the packets by their IPv6
//!   outer source);
//! - `oxvsctl traceflow --ipv6` follows a packet through the tunnel into
//!   the other node's pod;
//! - the lab's commands handle pods without IPv4: `probe` defaults to
//!   IPv6 (and refuses IPv4 with a reason), `status`, `exec`, `switch
//!   restart` (its reattach probe over IPv6);
//! - Services in the switch (`up --proxy`): a Service naming no family
//!   gets an IPv6 ClusterIP (as an IPv6-only API server gives it), its
//!   Endpoints list the pods' IPv6 addresses, and pods, hosts and the
//!   outside (NodePorts on the nodes' IPv6 addresses) reach it; an IPv4
//!   Service is refused;
//! - `up` refuses what an IPv6-only lab cannot be: an IPv4 tunnel (the
//!   real kube-proxy in an IPv6-only lab: `tests/kube_proxy_ipv6_only.rs`).
//!
//! Root and AF_XDP are required; the test says SKIPPED and passes without
//! them (the refusals need neither).

mod common;

use std::process::Command;

use common::paths::{self, path, Proto, Report, Want};
use common::{Lab, N1_V6, N2_V6};
use serde_json::{json, Value};

const NODE1_IP6: &str = "fd00:192:168:77::11";
const NODE2_IP6: &str = "fd00:192:168:77::12";

fn evidence(lab: &Lab) -> String {
    paths::switch_evidence(lab, &["node-1", "node-2"], &[&["dump-flows"], &["show"]])
}

/// Pod `name` (namespace `default`) of `status --json`.
fn pod<'a>(st: &'a Value, name: &str) -> &'a Value {
    st["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["namespace"] == "default" && p["name"] == name)
        .unwrap_or_else(|| panic!("no pod {name} in {st}"))
}

fn ping(lab: &Lab, from: &str, ip: &str, size: &str) -> bool {
    let out = lab.run(&[
        "exec", from, "--", "ping", "-6", "-c", "2", "-W", "2", "-s", size, ip,
    ]);
    if !out.status.success() {
        eprintln!("{}", common::show(&["exec", from, "--", "ping", ip], &out));
    }
    out.status.success()
}

/// A manifest the lab wrote (`node_node-1.yaml`, `pod_default_a1.yaml`).
fn manifest(lab: &Lab, file: &str) -> Value {
    oxvs_lab::manifest::read(&lab.root().join("manifests"), file)
        .unwrap_or_else(|e| panic!("{file}: {e:#}"))
}

#[test]
fn ipv6_only_pods_on_two_nodes() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--ip-family", "ipv6"]);
    let yaml = [
        paths::pod("default", "a1", "node-1", "{app: a}", true),
        paths::pod("default", "a2", "node-1", "{app: a}", true),
        paths::pod("default", "b1", "node-2", "{app: b}", true),
    ]
    .concat();
    let f = lab.file("pods.yaml", &yaml);
    let applied = lab.ok(&["apply", "-f", &f]);
    assert!(
        applied.contains("Pod default/a1 created on node-1 ip fd00:10:244:1::"),
        "{applied}"
    );
    let st = lab.status();
    assert_eq!(st["ipFamily"], "ipv6", "{st}");

    // The nodes: IPv6 only, in the state and in what Kubernetes sees.
    let nodes = st["nodes"].as_array().expect("nodes");
    for (i, n) in nodes.iter().enumerate() {
        let (idx, ip6) = (i + 1, [NODE1_IP6, NODE2_IP6][i]);
        let cidr = format!("fd00:10:244:{idx}::/64");
        assert!(n["ip"].is_null(), "node-{idx} has an IPv4 address: {n}");
        assert_eq!(n["ip6"], ip6, "{n}");
        assert_eq!(n["internalIPs"], json!([ip6]), "{n}");
        assert_eq!(n["podCIDR"], cidr.as_str(), "{n}");
        assert_eq!(n["podCIDRs"], json!([cidr]), "{n}");
        let node = manifest(&lab, &format!("node_node-{idx}.yaml"));
        assert_eq!(node["spec"]["podCIDR"], cidr.as_str(), "{node}");
        assert_eq!(node["spec"]["podCIDRs"], json!([cidr]), "{node}");
        assert_eq!(
            node["status"]["addresses"],
            json!([
                {"type": "InternalIP", "address": ip6},
                {"type": "Hostname", "address": format!("node-{idx}")},
            ]),
            "{node}"
        );
        // The agent's command line: the IPv6 CIDR and address, nothing IPv4.
        let pid = n["agent"]["pid"].as_u64().expect("agent pid");
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).expect("agent cmdline");
        let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
        for want in [
            format!("--pod-cidr {cidr} "),
            format!("--node-ip {ip6} "),
            "--mtu 1430 ".to_string(),
        ] {
            assert!(
                argv.contains(&want),
                "node-{idx}'s agent lacks {want:?}: {argv}"
            );
        }
        assert_eq!(argv.matches("--pod-cidr").count(), 1, "{argv}");
        assert!(
            !argv.contains("192.168.") && !argv.contains("10.244."),
            "node-{idx}'s agent got an IPv4 address: {argv}"
        );
        // The node itself has no IPv4 address on its underlay link.
        let netns = n["netns"].as_str().expect("node netns");
        let out = Command::new("ip")
            .args(["-n", netns, "-4", "-o", "addr", "show", "dev", "eth0"])
            .output()
            .expect("ip addr");
        let v4 = String::from_utf8_lossy(&out.stdout);
        assert!(v4.trim().is_empty(), "node-{idx}'s eth0 has IPv4: {v4}");
    }

    // The pods: an IPv6 address from their node's CIDR, no IPv4 one.
    let mut ip6 = std::collections::BTreeMap::new();
    for (name, node_idx) in [("a1", 1), ("a2", 1), ("b1", 2)] {
        let p = pod(&st, name);
        assert!(p["ip"].is_null(), "{name} has an IPv4 address: {p}");
        let a = p["ip6"].as_str().expect("ip6").to_string();
        let addr: std::net::Ipv6Addr = a.parse().expect("an IPv6 address");
        let cidr: ipnet::Ipv6Net = format!("fd00:10:244:{node_idx}::/64")
            .parse()
            .expect("cidr");
        assert!(cidr.contains(&addr), "{name}'s {a} not in {cidr}");
        let v4 = lab.ok(&[
            "exec",
            &format!("default/{name}"),
            "--",
            "ip",
            "-4",
            "-o",
            "addr",
        ]);
        for l in v4.lines() {
            assert!(
                l.split_whitespace().nth(1) == Some("lo"),
                "{name} has an IPv4 address besides lo's: {v4}"
            );
        }
        // What the kubelet would have written.
        let m = manifest(&lab, &format!("pod_default_{name}.yaml"));
        assert_eq!(m["status"]["podIP"], a.as_str(), "{m}");
        assert_eq!(m["status"]["podIPs"], json!([{"ip": a}]), "{m}");
        assert_eq!(
            m["status"]["hostIP"],
            [NODE1_IP6, NODE2_IP6][node_idx - 1],
            "{m}"
        );
        ip6.insert(name, a);
    }
    let (a1, a2, b1) = (&ip6["a1"], &ip6["a2"], &ip6["b1"]);
    let netns = |name: &str| pod(&st, name)["netns"].as_str().expect("netns").to_string();
    let (na1, na2, nb1) = (netns("a1"), netns("a2"), netns("b1"));
    let node_ns = |i: usize| nodes[i]["netns"].as_str().expect("node netns").to_string();

    // The tunnel port is on the node's IPv6 address.
    let show = lab.ctl("node-1", &["show"]);
    let local = format!("local=[{NODE1_IP6}]:4789");
    assert!(
        show.lines()
            .any(|l| l.contains("type=vxlan") && l.contains(&local)),
        "node-1's tunnel port {local}:\n{show}"
    );
    let before = lab.flow_packets("node-2", &[&format!("tun_ipv6_src={NODE1_IP6}")]);

    let mut report = Report::new(evidence);
    let ans = |who: &'static str| Want::Answer(vec![who]);
    report.check(
        &lab,
        "IPv6-only",
        &[
            path(
                "a2 -> a1 (same node)",
                &na2,
                (a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "a1 -> b1 (across nodes)",
                &na1,
                (b1, 8080),
                Proto::Tcp,
                ans("default/b1"),
            ),
            path(
                "b1 -> a1 (across nodes)",
                &nb1,
                (a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "a2 -> a1 UDP",
                &na2,
                (a1, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "a1 -> b1 UDP",
                &na1,
                (b1, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "b1 -> a2 UDP",
                &nb1,
                (a2, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "node-1 -> a1 (own node)",
                &node_ns(0),
                (a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "node-2 -> a1 (other node)",
                &node_ns(1),
                (a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "node-1 -> b1 UDP (other node)",
                &node_ns(0),
                (b1, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
        ],
    );
    report.finish();

    // ping, on one node and across nodes, small and fragmented.
    for (to, where_) in [(a1, "same node"), (b1, "across nodes")] {
        assert!(ping(&lab, "default/a2", to, "56"), "ping {to} ({where_})");
        assert!(
            ping(&lab, "default/a2", to, "3000"),
            "ping -s 3000 {to} ({where_})"
        );
    }
    // The pods' routes carry the IPv6 tunnel's MTU (1500 - 70).
    let r = lab.ok(&["exec", "default/a1", "--", "ip", "-6", "route", "get", b1]);
    assert!(r.contains("mtu 1430"), "a1's route to {b1}: {r}");
    // Whole up to the pod MTU (1430 - 48 bytes of headers), fragmented
    // beyond, across nodes.
    for size in [1382, 3000] {
        assert_eq!(
            lab.udp_echo("default/a1", b1, 8080, size),
            size.to_string(),
            "{size} bytes a1 -> {b1}"
        );
    }
    let after = lab.flow_packets("node-2", &[&format!("tun_ipv6_src={NODE1_IP6}")]);
    assert!(
        after > before + 10,
        "node-2 classified node-1's packets by their IPv6 outer source ({before} -> {after}):\n{}",
        evidence(&lab)
    );

    // traceflow follows a1's IPv6 packet through the tunnel into b1.
    let sock = |n: &str| {
        format!(
            "{n}={}",
            lab.root().join(n).join("agent-api.sock").display()
        )
    };
    let out = Command::new(common::oxvsctl())
        .args(["traceflow", "--src", "default/a1", "--dst", "default/b1"])
        .args(["--dport", "8080", "--ipv6", "--agent-socket"])
        .arg(sock("node-1"))
        .arg("--agent-socket")
        .arg(sock("node-2"))
        .output()
        .expect("oxvsctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(NODE2_IP6) && text.contains("pod default/b1"),
        "traceflow through the tunnel to [{NODE2_IP6}] and into b1:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The lab's own commands without IPv4: probe defaults to IPv6 ...
    let m = lab.probe("tcp", 8080);
    assert_eq!(m.len(), 9, "{m:?}");
    assert!(
        m.iter().all(|c| c["reachable"] == true),
        "probe over IPv6: {m:?}"
    );
    // ... and refuses IPv4, saying why.
    let args = ["probe", "--ip-family", "ipv4"];
    let out = lab.run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("IPv6-only") && err.contains("no IPv4 address"),
        "{}",
        common::show(&args, &out)
    );
    let text = lab.ok(&["status"]);
    assert!(
        text.contains(NODE1_IP6) && text.contains("fd00:10:244:2::/64") && text.contains(b1),
        "{text}"
    );
    // switch restart measures its reattach time over IPv6.
    let out = lab.ok(&["switch", "restart", "node-1", "--grace", "5"]);
    assert!(out.contains("reattach time"), "{out}");
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "after switch restart",
        &[
            path("a2 -> a1", &na2, (a1, 8080), Proto::Tcp, ans("default/a1")),
            path("b1 -> a1", &nb1, (a1, 8080), Proto::Tcp, ans("default/a1")),
        ],
    );
    report.finish();

    // A node added later is IPv6-only too, and its pod reaches the others
    // (the old agents route its IPv6 pod CIDR from its Node object).
    let out = lab.ok(&["node", "add"]);
    assert!(
        out.contains("ip fd00:192:168:77::13  podCIDR fd00:10:244:3::/64"),
        "{out}"
    );
    let node = manifest(&lab, "node_node-3.yaml");
    assert_eq!(node["spec"]["podCIDRs"], json!(["fd00:10:244:3::/64"]));
    let f = lab.file(
        "c1.yaml",
        &paths::pod("default", "c1", "node-3", "{app: c}", true),
    );
    lab.ok(&["apply", "-f", &f]);
    let st = lab.status();
    let c1 = pod(&st, "c1");
    assert!(c1["ip"].is_null(), "{c1}");
    let c1_6 = c1["ip6"].as_str().expect("c1's ip6").to_string();
    assert!(c1_6.starts_with("fd00:10:244:3::"), "{c1_6}");
    let nc1 = c1["netns"].as_str().expect("netns").to_string();
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "node-3 added",
        &[
            path(
                "c1 (node-3) -> a1",
                &nc1,
                (a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "b1 -> c1 (node-3)",
                &nb1,
                (&c1_6, 8080),
                Proto::Tcp,
                ans("default/c1"),
            ),
            path(
                "a2 -> c1 (node-3) UDP",
                &na2,
                (&c1_6, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
        ],
    );
    report.finish();
    lab.ok(&["node", "remove", "--force", "node-3"]);
}

/// `up` refuses, before making anything, what an IPv6-only lab cannot be.
#[test]
fn up_refuses_what_an_ipv6_only_lab_cannot_be() {
    /// Takes down whatever a wrongly accepted `up` made (also when the
    /// test fails), before the state directory goes.
    struct Down<'a>(&'a [&'a str]);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Command::new(common::lab_bin())
                .args(self.0)
                .args(["down", "--grace", "1"])
                .env_remove("OXVS_LAB")
                .output();
        }
    }
    let name = format!("t{}-refuse", std::process::id());
    let state_root = tempfile::tempdir().expect("tempdir");
    let root = state_root.path().display().to_string();
    let lab = ["--name", &name, "--state-root", &root];
    let (extra, want) = (
        ["--underlay", "ipv4"],
        "IPv6-only nodes have no IPv4 address",
    );
    let _down = Down(&lab);
    let mut args = lab.to_vec();
    args.extend(["up", "--nodes", "1", "--ip-family", "ipv6"]);
    args.extend_from_slice(&extra);
    let out = Command::new(common::lab_bin())
        .args(&args)
        .env_remove("OXVS_LAB")
        .output()
        .expect("oxvs-lab");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(want),
        "{}",
        common::show(&args, &out)
    );
    assert!(
        !state_root.path().join(&name).exists(),
        "`up {}` made the lab's directory",
        extra.join(" ")
    );
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: svc-a1, namespace: web}
spec:
  selector: {pod: a1}
  ports:
  - {name: tcp, port: 80, targetPort: http}
  - {name: udp, port: 80, protocol: UDP, targetPort: http-udp}
---
apiVersion: v1
kind: Service
metadata: {name: svc-ab, namespace: web}
spec:
  clusterIP: "fd00:10:96::113"
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
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
metadata: {name: svc-empty, namespace: web}
spec:
  clusterIP: "fd00:10:96::130"
  selector: {app: nothing}
  ports:
  - {port: 80}
"#;

/// Waits until both switches have `n` IPv6 Service ports with a group and
/// `empty` rejecting ones in ServiceLB (table 35), and both hosts DNAT
/// `node_ports` (TCP and UDP) into the switch.
fn wait_services6(lab: &Lab, n: usize, empty: usize, node_ports: &[u16]) {
    let t = std::time::Instant::now();
    loop {
        let mut ok = true;
        for (i, node) in [(1, "node-1"), (2, "node-2")] {
            // The host's side of the NodePorts, which the agent writes
            // after the flows: without it the host refuses a probe from
            // outside before the switch sees it.
            let nat6 = common::kube::in_node(lab, i, &["ip6tables-save", "-t", "nat"]);
            ok &= nat6.contains("-j OXVS-NODEPORTS")
                && node_ports.iter().all(|p| {
                    ["tcp", "udp"]
                        .iter()
                        .all(|proto| nat6.contains(&format!("-p {proto} -m {proto} --dport {p} ")))
                });
            let flows = lab.ctl(node, &["dump-flows", "--table", "35"]);
            let v6 = |l: &&str| l.contains("ipv6_dst=fd00:10:96::");
            let count = |what: &str| {
                flows
                    .lines()
                    .filter(v6)
                    .filter(|l| l.contains(what))
                    .count()
            };
            ok &= count("actions=group:") == n && count("actions=controller(") == empty;
        }
        if ok {
            eprintln!("Services programmed after {} ms", t.elapsed().as_millis());
            return;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(15),
            "the agents did not program {n} IPv6 Service ports ({empty} empty) and NodePorts {node_ports:?} within 15 s:\n{}\n{}",
            paths::switch_evidence(
                lab,
                &["node-1", "node-2"],
                &[&["dump-flows", "--table", "35"]]
            ),
            common::kube::evidence6(lab)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn services_in_the_switch_in_an_ipv6_only_lab() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--ip-family", "ipv6", "--proxy"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);
    let mut pods = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n");
    pods += &paths::pod("web", "a1", "node-1", "{app: ab, pod: a1}", true);
    pods += &paths::pod("web", "a2", "node-2", "{app: ab, pod: a2}", true);
    pods += &paths::pod("web", "c1", "node-1", "{role: client}", false);
    pods += &paths::pod("web", "c2", "node-2", "{role: client}", false);
    lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods)]);
    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    assert!(out.contains("Service web/svc-a1 created"), "{out}");
    // svc-a1 tcp+udp, svc-ab, svc-np tcp+udp; svc-empty rejects.
    wait_services6(&lab, 5, 1, &[30086]);

    // What the lab, as an IPv6-only API server and endpoints controller,
    // wrote: svc-a1 named no family and got IPv6, the first free
    // ClusterIP; its Endpoints list a1's IPv6 address.
    let st = lab.status();
    let a1 = common::pod_field(&st, "web", "a1", "ip6");
    let svc = manifest(&lab, "service_web_svc-a1.yaml");
    assert_eq!(svc["spec"]["clusterIP"], "fd00:10:96::a", "{svc}");
    assert_eq!(svc["spec"]["clusterIPs"], json!(["fd00:10:96::a"]), "{svc}");
    assert_eq!(svc["spec"]["ipFamilies"], json!(["IPv6"]), "{svc}");
    let np = manifest(&lab, "service_web_svc-np.yaml");
    assert_eq!(
        np["spec"]["ipFamilies"],
        json!(["IPv6"]),
        "PreferDualStack: {np}"
    );
    let ep = manifest(&lab, "endpoints_web_svc-a1.yaml");
    assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], a1.as_str(), "{ep}");

    let (c1, c2, n1, n2, ul) = (
        ns("web-c1"),
        ns("web-c2"),
        ns("node-1"),
        ns("node-2"),
        ns("ul"),
    );
    let a = |x: &'static str| Want::Answer(vec![x]);
    let any = || Want::Answer(vec![]);
    let svc_a1 = "fd00:10:96::a";
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "IPv6-only Services",
        &[
            path(
                "c1 -> svc-a1 TCP (same node, named port)",
                &c1,
                (svc_a1, 80),
                Proto::Tcp,
                a("web/a1"),
            ),
            path(
                "c2 -> svc-a1 TCP (other node)",
                &c2,
                (svc_a1, 80),
                Proto::Tcp,
                a("web/a1"),
            ),
            path(
                "c1 -> svc-a1 UDP (same node)",
                &c1,
                (svc_a1, 80),
                Proto::Udp,
                any(),
            ),
            path(
                "c2 -> svc-a1 UDP (other node)",
                &c2,
                (svc_a1, 80),
                Proto::Udp,
                any(),
            ),
            path(
                "c1 -> svc-ab TCP x24: both backends",
                &c1,
                ("fd00:10:96::113", 80),
                Proto::Tcp,
                Want::Spread(24, vec!["web/a1", "web/a2"]),
            ),
            path(
                "node-1 host -> svc-a1 (local backend)",
                &n1,
                (svc_a1, 80),
                Proto::Tcp,
                a("web/a1"),
            ),
            path(
                "node-2 host -> svc-a1 (other node)",
                &n2,
                (svc_a1, 80),
                Proto::Tcp,
                a("web/a1"),
            ),
            path(
                "c1 -> svc-empty: refused at once",
                &c1,
                ("fd00:10:96::130", 80),
                Proto::Tcp,
                Want::Refused,
            ),
            path(
                "outside -> node-1 NodePort, TCP (backend on node-2)",
                &ul,
                (N1_V6, 30086),
                Proto::Tcp,
                a("web/a2"),
            ),
            path(
                "outside -> node-2 NodePort, TCP (backend here)",
                &ul,
                (N2_V6, 30086),
                Proto::Tcp,
                a("web/a2"),
            ),
            path(
                "outside -> node-1 NodePort, UDP",
                &ul,
                (N1_V6, 30086),
                Proto::Udp,
                any(),
            ),
        ],
    );
    report.finish();

    // An IPv4 Service has no place in an IPv6-only cluster.
    let v4 = lab.file(
        "v4.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: svc-v4, namespace: web}\nspec: {ipFamilies: [IPv4], selector: {pod: a1}, ports: [{port: 80}]}\n",
    );
    let args = ["apply", "-f", &v4];
    let out = lab.run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("spec.ipFamilies[0] IPv4")
            && err.contains("IPv6-only"),
        "{}",
        common::show(&args, &out)
    );
}
