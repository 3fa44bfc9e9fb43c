//! Services from outside the node through the in-pipeline proxy (`oxvs-lab
//! up --proxy`: no kube-proxy): NodePorts, external and load balancer
//! addresses, `externalTrafficPolicy` Cluster and Local,
//! `internalTrafficPolicy: Local`, and the node itself reaching a
//! ClusterIP. Real traffic from the underlay namespace (a client outside
//! the cluster), from the nodes' host namespaces and from pods:
//!
//! - NodePort, `externalTrafficPolicy: Cluster` (TCP and UDP), endpoint on
//!   node-1: from outside to either node (node-2 forwards it through the
//!   tunnel, SNATed to its gateway address so the answer comes back), from
//!   the other node's host, from node-1's own host to its own address, and
//!   from a pod on the other node;
//! - NodePort, `externalTrafficPolicy: Local`: the node with the endpoint
//!   answers, with the client's address kept (the endpoint's connection in
//!   the switch's `dump-conntrack` is with the outside client, not SNATed);
//!   the node without endpoint does not answer;
//! - an external address (`spec.externalIPs`), routed by the outside
//!   client to node-1, endpoint on node-2; from a pod directly;
//! - a LoadBalancer Service (`spec.loadBalancerIP`, the lab's load
//!   balancer puts it into `status.loadBalancer.ingress`),
//!   `externalTrafficPolicy: Local`, endpoints on both nodes: the load
//!   balancer address routed to node-2 reaches only node-2's endpoint;
//! - `internalTrafficPolicy: Local`: each node's clients reach only their
//!   own node's endpoint;
//! - a NodePort Service without endpoints: rejected at once (ICMP port
//!   unreachable from the switch, relayed by the host's conntrack to the
//!   outside client), TCP and UDP, from outside, a pod and a node;
//! - node-1's host -> a ClusterIP (the host routes Service addresses into
//!   the switch);
//! - the host side: NodePort DNAT rules in the nodes' `nat` table, routes
//!   for Service addresses; no kube-proxy chain; a deleted Service's rule
//!   and route go; a Service route left by an earlier run of the agent
//!   goes when the agent restarts.
//!
//! Skips only when not root or without AF_XDP (SKIPPED; fails with
//! `OXVS_TESTS_NO_SKIP=1`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::paths::{path, pod, Proto, Report, Want};
use common::Lab;

const N1: &str = "192.168.77.11";
const N2: &str = "192.168.77.12";
const UL: &str = "192.168.77.1";
const EXT_IP: &str = "192.0.2.10";
const LB_IP: &str = "192.0.2.20";

fn pods_yaml() -> String {
    let mut y = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n");
    y += &pod("web", "a1", "node-1", "{app: ab, pod: a1}", true);
    y += &pod("web", "a2", "node-2", "{app: ab, pod: a2}", true);
    y += &pod("web", "c1", "node-1", "{role: client}", false);
    y += &pod("web", "c2", "node-2", "{role: client}", false);
    y
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: np-cluster, namespace: web}
spec:
  type: NodePort
  clusterIP: 10.96.2.11
  selector: {pod: a1}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30080}
---
apiVersion: v1
kind: Service
metadata: {name: np-local, namespace: web}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  clusterIP: 10.96.2.12
  selector: {pod: a1}
  ports:
  - {port: 80, targetPort: 8080, nodePort: 30081}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: web}
spec:
  clusterIP: 10.96.2.13
  externalIPs: [192.0.2.10]
  selector: {pod: a2}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: web}
spec:
  type: LoadBalancer
  loadBalancerIP: 192.0.2.20
  externalTrafficPolicy: Local
  clusterIP: 10.96.2.14
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: np-empty, namespace: web}
spec:
  type: NodePort
  clusterIP: 10.96.2.16
  selector: {app: nothing}
  ports:
  - {name: tcp, port: 80, nodePort: 30082}
  - {name: udp, port: 80, protocol: UDP, nodePort: 30082}
---
apiVersion: v1
kind: Service
metadata: {name: itp, namespace: web}
spec:
  internalTrafficPolicy: Local
  clusterIP: 10.96.2.15
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
"#;

fn run(args: &[&str]) -> String {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_else(|e| format!("cannot run {args:?}: {e}"))
}

/// What the test shows at the first failure: both switches' Service
/// flows, groups and connections, and the hosts' NodePort rules and
/// routes.
fn evidence(lab: &Lab) -> String {
    let nodes = ["node-1", "node-2"];
    let mut s = common::paths::switch_evidence(
        lab,
        &nodes,
        &[
            &["dump-flows", "--table", "35"],
            &["dump-flows", "--table", "57"],
            &["dump-groups"],
            &["dump-conntrack"],
        ],
    );
    for node in nodes {
        let ns = format!("{}-{node}", lab.name);
        s += &format!(
            "--- {node}: iptables-save -t nat ---\n{}",
            run(&["ip", "netns", "exec", &ns, "iptables-save", "-t", "nat"])
        );
        s += &format!(
            "--- {node}: ip route ---\n{}",
            run(&["ip", "-n", &ns, "route"])
        );
    }
    s
}

/// Waits until both switches have the flows of every Service (the load
/// balancer address among them: the lab's load balancer gave it) and both
/// hosts have the NodePort rules.
fn wait_programmed(lab: &Lab) {
    let t = Instant::now();
    loop {
        let mut ok = true;
        for node in ["node-1", "node-2"] {
            let flows = lab.ctl(node, &["dump-flows", "--table", "35"]);
            // Every Service with its endpoints: only np-empty's four
            // frontends reject (a Service seen before its Endpoints
            // rejects too, for a moment).
            let rejects = flows.lines().filter(|l| l.contains("controller(")).count();
            ok &= flows.contains(&format!("nw_dst={LB_IP}"))
                && flows.contains(&format!("nw_dst={EXT_IP}"))
                && flows.contains("tp_dst=30081")
                && flows.contains("nw_dst=10.96.2.15")
                && rejects == 4;
            let ns = format!("{}-{node}", lab.name);
            let nat = run(&["ip", "netns", "exec", &ns, "iptables-save", "-t", "nat"]);
            ok &= nat.contains("--dport 30081") && nat.contains("-j OXVS-NODEPORTS");
        }
        if ok {
            eprintln!("Services programmed after {} ms", t.elapsed().as_millis());
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the agents did not program the Services within 15 s:\n{}",
            evidence(lab)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn services_are_reached_from_outside_the_node() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--proxy"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);
    let (n1, n2, ul) = (ns("node-1"), ns("node-2"), ns("ul"));
    let (c1, c2) = (ns("web-c1"), ns("web-c2"));

    lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods_yaml())]);
    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    assert!(out.contains("Service web/lb created"), "{out}");
    // The outside client routes the external address to node-1, the load
    // balancer address to node-2 (a load balancer that knows where the
    // endpoints are, as externalTrafficPolicy: Local wants).
    for (ip, via) in [(EXT_IP, N1), (LB_IP, N2)] {
        let out = run(&["ip", "-n", &ul, "route", "replace", ip, "via", via]);
        assert!(out.trim().is_empty(), "route {ip} via {via}: {out}");
    }
    wait_programmed(&lab);

    let a = |x: &'static str| Want::Answer(vec![x]);
    use Proto::*;
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "from outside",
        &[
            path(
                "NodePort Cluster TCP, outside -> node-1 (endpoint here)",
                &ul,
                (N1, 30080),
                Tcp,
                a("web/a1"),
            ),
            path(
                "NodePort Cluster TCP, outside -> node-2 (endpoint on node-1)",
                &ul,
                (N2, 30080),
                Tcp,
                a("web/a1"),
            ),
            path(
                "NodePort Cluster UDP, outside -> node-2",
                &ul,
                (N2, 30080),
                Udp,
                Want::Answer(vec![]),
            ),
            path(
                "NodePort Cluster TCP, node-2's host -> node-1",
                &n2,
                (N1, 30080),
                Tcp,
                a("web/a1"),
            ),
            path(
                "NodePort Cluster TCP, node-1's host -> its own address",
                &n1,
                (N1, 30080),
                Tcp,
                a("web/a1"),
            ),
            path(
                "NodePort Cluster TCP, pod c2 -> node-2",
                &c2,
                (N2, 30080),
                Tcp,
                a("web/a1"),
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
                "NodePort Local TCP, pod c2 -> its own node (any endpoint)",
                &c2,
                (N2, 30081),
                Tcp,
                a("web/a1"),
            ),
            path(
                "externalIP TCP, outside -> via node-1 (endpoint on node-2)",
                &ul,
                (EXT_IP, 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "externalIP TCP, pod c1 -> it",
                &c1,
                (EXT_IP, 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "LoadBalancer Local TCP x8, outside -> via node-2: node-2's endpoint",
                &ul,
                (LB_IP, 80),
                Tcp,
                Want::Spread(8, vec!["web/a2"]),
            ),
            path(
                "internalTrafficPolicy Local x8, c1: node-1's endpoint only",
                &c1,
                ("10.96.2.15", 80),
                Tcp,
                Want::Spread(8, vec!["web/a1"]),
            ),
            path(
                "internalTrafficPolicy Local x8, c2: node-2's endpoint only",
                &c2,
                ("10.96.2.15", 80),
                Tcp,
                Want::Spread(8, vec!["web/a2"]),
            ),
            path(
                "no endpoints: NodePort TCP, outside -> node-1, rejected",
                &ul,
                (N1, 30082),
                Tcp,
                Want::Refused,
            ),
            path(
                "no endpoints: NodePort UDP, outside -> node-2, rejected",
                &ul,
                (N2, 30082),
                Udp,
                Want::Refused,
            ),
            path(
                "no endpoints: ClusterIP UDP, pod c1, rejected",
                &c1,
                ("10.96.2.16", 80),
                Udp,
                Want::Refused,
            ),
            path(
                "no endpoints: ClusterIP TCP, node-2's host, rejected",
                &n2,
                ("10.96.2.16", 80),
                Tcp,
                Want::Refused,
            ),
            path(
                "node-1's host -> ClusterIP (endpoint on node-1)",
                &n1,
                ("10.96.2.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "node-2's host -> ClusterIP (endpoint on node-1)",
                &n2,
                ("10.96.2.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "node-2's host -> ClusterIP UDP (endpoint on node-1)",
                &n2,
                ("10.96.2.11", 80),
                Udp,
                Want::Answer(vec![]),
            ),
        ],
    );

    // The rejections were the switch's (a host without the NodePort rule
    // would refuse the TCP connection itself): the reject flows counted them.
    for (node, proto) in [("node-1", "tcp"), ("node-2", "udp")] {
        let flows = lab.ctl(node, &["dump-flows", "--table", "35"]);
        let hit = flows.lines().any(|l| {
            l.contains(&format!(",{proto},"))
                && l.contains("tp_dst=30082")
                && l.contains("controller(userdata=72.65.6a.65.63.74)")
                && !l.contains("n_packets=0,")
        });
        assert!(hit, "no {proto} rejection counted on {node}:\n{flows}");
    }

    // externalTrafficPolicy: Local keeps the client's address: node-1's
    // switch has the outside client's connection to the NodePort,
    // answered to the client itself; with Cluster, the connection is
    // SNATed to node-2's gateway address in the SNAT zone.
    let ct1 = lab.ctl("node-1", &["dump-conntrack"]);
    let local_kept = ct1.lines().any(|l| {
        l.starts_with(&format!("tcp,orig=(src={UL},dst=169.254.169.253,"))
            && l.contains("dport=30081)")
            && l.contains(&format!(",dst={UL},"))
            && l.contains("zone=65520")
    });
    assert!(
        local_kept,
        "NodePort Local must keep the client's address:\n{ct1}"
    );
    let ct2 = lab.ctl("node-2", &["dump-conntrack"]);
    let snat = ct2.lines().any(|l| {
        l.starts_with(&format!("tcp,orig=(src={UL},"))
            && l.contains("dst=10.244.2.1,")
            && l.contains("zone=65521")
    });
    assert!(
        snat,
        "NodePort Cluster from outside must be SNATed to node-2's gateway address:\n{ct2}"
    );
    // The host side: the NodePorts and Service routes, no kube-proxy.
    let nat = run(&["ip", "netns", "exec", &n1, "iptables-save", "-t", "nat"]);
    for want in [
        "-A OXVS-NODEPORTS -p tcp -m tcp --dport 30080",
        "-A OXVS-NODEPORTS -p udp -m udp --dport 30080",
        "-j DNAT --to-destination 169.254.169.253",
    ] {
        assert!(nat.contains(want), "{want:?} not in:\n{nat}");
    }
    assert!(!nat.contains("KUBE-SERVICES"), "{nat}");
    let routes = run(&["ip", "-n", &n1, "route"]);
    for want in [
        "10.96.2.11 via 169.254.169.253 dev oxvs-gw0",
        "192.0.2.20 via 169.254.169.253 dev oxvs-gw0",
        "169.254.169.253 dev oxvs-gw0",
    ] {
        assert!(routes.contains(want), "{want:?} not in:\n{routes}");
    }

    // A Service deleted: its NodePort rule, route and flows go.
    lab.ok(&[
        "delete",
        "-f",
        &lab.file(
            "np-local.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: np-local, namespace: web}\nspec:\n  ports:\n  - {port: 80}\n",
        ),
    ]);
    let t = Instant::now();
    loop {
        let nat = run(&["ip", "netns", "exec", &n1, "iptables-save", "-t", "nat"]);
        let routes = run(&["ip", "-n", &n1, "route"]);
        if !nat.contains("--dport 30081") && !routes.contains("10.96.2.12 ") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "np-local's NodePort rule or route is still there:\n{nat}\n{routes}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    report.check(
        &lab,
        "after np-local is deleted",
        &[
            path(
                "NodePort Local TCP, outside -> node-1: gone",
                &ul,
                (N1, 30081),
                Tcp,
                Want::Blocked,
            ),
            path(
                "NodePort Cluster TCP, outside -> node-2: still there",
                &ul,
                (N2, 30080),
                Tcp,
                a("web/a1"),
            ),
        ],
    );
    // A Service route a previous run of the agent left (its Service
    // deleted while the agent was down): removed when the agent starts.
    let out = run(&[
        "ip",
        "-n",
        &n1,
        "route",
        "add",
        "10.96.9.9",
        "via",
        "169.254.169.253",
        "dev",
        "oxvs-gw0",
        "onlink",
    ]);
    assert!(out.trim().is_empty(), "add a stale route: {out}");
    lab.ok(&["agent", "restart", "node-1"]);
    let t = Instant::now();
    while run(&["ip", "-n", &n1, "route"]).contains("10.96.9.9 ") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the restarted agent kept a Service route no Service has:\n{}",
            run(&["ip", "-n", &n1, "route"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    report.check(
        &lab,
        "after node-1's agent restarted",
        &[path(
            "NodePort Cluster TCP, outside -> node-1",
            &ul,
            (N1, 30080),
            Tcp,
            a("web/a1"),
        )],
    );
    report.finish();
}
