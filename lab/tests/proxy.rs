//! Services through the in-pipeline proxy (`oxvs-lab up --proxy`, the
//! agents run `--proxy`): no kube-proxy and no API server on the nodes,
//! the switch load-balances ClusterIPs with select groups and
//! `ct(commit,nat(dst=...))`. Real traffic from pods on both nodes:
//!
//! - pod -> ClusterIP, TCP and UDP, backend on the same node and on the
//!   other node (the TCP greeting names the backend pod), a named target
//!   port;
//! - a Service with backends on both nodes: 24 connections reach both;
//!   `sessionAffinity: ClientIP`: 12 connections from one client reach
//!   one backend, learned as a SessionAffinity flow that expires with the
//!   Service's `timeoutSeconds` (2 s); after the learned endpoint goes,
//!   the client is balanced again;
//! - hairpin: a pod reaching itself through its Service, TCP and UDP
//!   (SNATed to the hairpin address so that its answer comes back);
//! - a Service without endpoints: rejected at once (the switch answers
//!   ICMP port unreachable, as kube-proxy's REJECT);
//! - the switch's view: the Service flows and groups on both nodes, the
//!   NATed connection in `dump-conntrack` (reply from the endpoint), no
//!   kube-proxy rules in the node namespaces;
//! - NetworkPolicy after DNAT: deny-all ingress in `web` blocks
//!   pod -> ClusterIP; allowing the clients lets them through;
//! - Endpoints following pods: deleting a2 leaves svc-ab on a1 only, and
//!   svc-a2 without endpoints; the UDP connections translated to a2 are
//!   flushed (as kube-proxy does);
//! - a long-lived TCP connection through the ClusterIP keeps working
//!   while an unrelated endpoint goes, and across a restart of the agent
//!   and of the switch on its client's node (the translation is saved and
//!   restored with the connection table), after which Services still work;
//! - an IPv6 Service is refused in this IPv4-only lab (IPv6 Services:
//!   `lab/tests/proxy_dual_stack.rs`).
//!
//! Skips only when not root or without AF_XDP (SKIPPED; fails with
//! `OXVS_TESTS_NO_SKIP=1`).

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::paths::{path, pod, Proto, Report, Want};
use common::Lab;

fn pods_yaml() -> String {
    let mut y = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n");
    y += &pod("web", "a1", "node-1", "{app: ab, pod: a1}", true);
    y += &pod("web", "a2", "node-2", "{app: ab, pod: a2}", true);
    y += &pod("web", "h1", "node-2", "{pod: h1}", true);
    y += &pod("web", "c1", "node-1", "{role: client}", false);
    y += &pod("web", "c2", "node-2", "{role: client}", false);
    y
}

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
metadata: {name: svc-ab, namespace: web}
spec:
  clusterIP: 10.96.1.13
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-aff, namespace: web}
spec:
  clusterIP: 10.96.1.14
  sessionAffinity: ClientIP
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-aff-short, namespace: web}
spec:
  clusterIP: 10.96.1.17
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 2}}
  selector: {app: ab}
  ports:
  - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-hair, namespace: web}
spec:
  clusterIP: 10.96.1.16
  selector: {pod: h1}
  ports:
  - {name: tcp, port: 80, targetPort: 8080}
  - {name: udp, port: 80, protocol: UDP, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: svc-echo, namespace: web}
spec:
  clusterIP: 10.96.1.15
  selector: {pod: a1}
  ports:
  - {port: 90, targetPort: 9000}
---
apiVersion: v1
kind: Service
metadata: {name: svc-empty, namespace: web}
spec:
  selector: {app: nothing}
  ports:
  - {port: 80}
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

/// A TCP echo server (the lab's own server greets and closes).
const ECHO_SERVER: &str = "import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 9000))
s.listen(8)
def echo(c):
    while True:
        d = c.recv(4096)
        if not d:
            return
        c.sendall(d)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
";

/// What the test shows at the first failure: both switches' Service flows,
/// groups and connections.
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

/// Waits until both switches have `n` Service ports with a group (and
/// `empty` without endpoints) in ServiceLB.
fn wait_services(lab: &Lab, n: usize, empty: usize) {
    let t = Instant::now();
    loop {
        let mut ok = true;
        for node in ["node-1", "node-2"] {
            let flows = lab.ctl(node, &["dump-flows", "--table", "35"]);
            let groups = flows
                .lines()
                .filter(|l| l.contains("actions=group:"))
                .count();
            let drops = flows
                .lines()
                .filter(|l| l.contains("nw_dst=10.96.") && l.contains("actions=controller("))
                .count();
            ok &= groups == n && drops == empty;
        }
        if ok {
            eprintln!("Services programmed after {} ms", t.elapsed().as_millis());
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the agents did not program {n} Service ports ({empty} empty) within 15 s:\n{}",
            evidence(lab)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn services_are_load_balanced_in_the_switch() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--proxy"]);
    let ns = |s: &str| format!("{}-{s}", lab.name);

    let out = lab.ok(&["apply", "-f", &lab.file("pods.yaml", &pods_yaml())]);
    assert!(out.contains("Pod web/c2 created on node-2"), "{out}");
    let out = lab.ok(&["apply", "-f", &lab.file("services.yaml", SERVICES)]);
    for line in [
        "Service web/svc-a1 created",
        "Endpoints web/svc-ab: 2 addresses",
        "Endpoints web/svc-empty: 0 addresses",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    // svc-a1 tcp+udp, svc-a2 tcp+udp, svc-ab, svc-aff, svc-aff-short,
    // svc-hair tcp+udp, svc-echo; svc-empty rejects.
    wait_services(&lab, 10, 1);
    // The lab allocated svc-empty's ClusterIP (the first free from .10).
    let flows = lab.ctl("node-1", &["dump-flows", "--table", "35"]);
    assert!(
        flows
            .contains("nw_dst=10.96.0.10,tp_dst=80 actions=controller(userdata=72.65.6a.65.63.74)"),
        "{flows}"
    );

    let (c1, c2, h1) = (ns("web-c1"), ns("web-c2"), ns("web-h1"));
    let a = |x: &'static str| Want::Answer(vec![x]);
    use Proto::*;
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "ClusterIP",
        &[
            path(
                "c1 -> svc-a1 TCP (same node, named port)",
                &c1,
                ("10.96.1.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c1 -> svc-a2 TCP (other node)",
                &c1,
                ("10.96.1.12", 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "c2 -> svc-a1 TCP (other node)",
                &c2,
                ("10.96.1.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c2 -> svc-a2 TCP (same node)",
                &c2,
                ("10.96.1.12", 80),
                Tcp,
                a("web/a2"),
            ),
            path(
                "c1 -> svc-a1 UDP (same node)",
                &c1,
                ("10.96.1.11", 80),
                Udp,
                Want::Answer(vec![]),
            ),
            path(
                "c1 -> svc-a2 UDP (other node)",
                &c1,
                ("10.96.1.12", 80),
                Udp,
                Want::Answer(vec![]),
            ),
            path(
                "c2 -> svc-a1 UDP (other node)",
                &c2,
                ("10.96.1.11", 80),
                Udp,
                Want::Answer(vec![]),
            ),
            path(
                "c1 -> svc-ab TCP x24: both backends",
                &c1,
                ("10.96.1.13", 80),
                Tcp,
                Want::Spread(24, vec!["web/a1", "web/a2"]),
            ),
            path(
                "c2 -> svc-aff TCP x12: one backend",
                &c2,
                ("10.96.1.14", 80),
                Tcp,
                Want::Sticky(12),
            ),
            path(
                "c1 -> svc-aff-short TCP x6: one backend",
                &c1,
                ("10.96.1.17", 80),
                Tcp,
                Want::Sticky(6),
            ),
            path(
                "c1 -> svc-empty TCP: rejected at once",
                &c1,
                ("10.96.0.10", 80),
                Tcp,
                Want::Refused,
            ),
            path(
                "h1 -> svc-hair TCP (hairpin)",
                &h1,
                ("10.96.1.16", 80),
                Tcp,
                a("web/h1"),
            ),
            path(
                "h1 -> svc-hair UDP (hairpin)",
                &h1,
                ("10.96.1.16", 80),
                Udp,
                Want::Answer(vec![]),
            ),
            path(
                "c1 -> svc-hair TCP (other node)",
                &c1,
                ("10.96.1.16", 80),
                Tcp,
                a("web/h1"),
            ),
        ],
    );

    // Session affinity is learned: node-1 has a SessionAffinity flow for
    // c1 and svc-aff-short, with the Service's timeout, which expires
    // (the keeper checks once a second).
    let c1_ip = common::pod_ip(&lab.status(), "web", "c1");
    let learned = |lab: &Lab| {
        lab.ctl("node-1", &["dump-flows", "--table", "34"])
            .lines()
            .filter(|l| {
                l.contains(&format!("nw_src={c1_ip},nw_dst=10.96.1.17,"))
                    && l.contains("hard_timeout=2,")
                    && l.contains("load:")
            })
            .count()
    };
    assert_eq!(
        learned(&lab),
        1,
        "no learned affinity flow for c1 on node-1:\n{}",
        lab.ctl("node-1", &["dump-flows", "--table", "34"])
    );
    let t = Instant::now();
    while learned(&lab) > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(6),
            "c1's affinity flow outlived its 2 s timeout:\n{}",
            lab.ctl("node-1", &["dump-flows", "--table", "34"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "c1's affinity flow expired {} ms after the check",
        t.elapsed().as_millis()
    );
    // A learned flow is the switch's, not drift: c2's svc-aff flow (3 h
    // timeout) is still on node-2 after the agent's resync (every 5 s)
    // compared its flows with the switch's.
    std::thread::sleep(Duration::from_millis(5500));
    let c2_ip = common::pod_ip(&lab.status(), "web", "c2");
    let t34 = lab.ctl("node-2", &["dump-flows", "--table", "34"]);
    assert!(
        t34.contains(&format!("nw_src={c2_ip},nw_dst=10.96.1.14,")),
        "c2's learned svc-aff flow is gone from node-2:\n{t34}"
    );

    // The switch's view: the connection is NATed, nothing of kube-proxy.
    let ct = lab.ctl("node-1", &["dump-conntrack"]);
    assert!(
        ct.lines()
            .any(|l| l.contains("dst=10.96.1.11,") && l.contains("reply=(src=10.244.")),
        "no NATed connection to svc-a1 on node-1:\n{ct}"
    );
    for node in ["node-1", "node-2"] {
        let nat = std::process::Command::new("ip")
            .args(["netns", "exec", &ns(node), "iptables-save", "-t", "nat"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(
            !nat.contains("KUBE-SERVICES"),
            "kube-proxy rules on {node}:\n{nat}"
        );
    }

    // A connection through the ClusterIP that lives across the changes
    // below: an echo server in a1 (`down` kills it with the pod).
    let script = lab.file("echo.py", ECHO_SERVER);
    lab.ok(&[
        "exec",
        "web/a1",
        "--",
        "sh",
        "-c",
        &format!("python3 {script} >/dev/null 2>&1 &"),
    ]);
    let mut long = LongConn::open(&c2, "10.96.1.15:90");
    long.check("just opened");

    // NetworkPolicy applies to the endpoint after DNAT.
    lab.ok(&["apply", "-f", &lab.file("deny.yaml", DENY_ALL)]);
    report.converge(
        &lab,
        "deny-all ingress",
        path(
            "c1 -> svc-a1 TCP blocked",
            &c1,
            ("10.96.1.11", 80),
            Tcp,
            Want::Blocked,
        ),
        vec![path(
            "c2 -> svc-a2 TCP blocked",
            &c2,
            ("10.96.1.12", 80),
            Tcp,
            Want::Blocked,
        )],
    );
    lab.ok(&["apply", "-f", &lab.file("allow.yaml", ALLOW_CLIENTS)]);
    report.converge(
        &lab,
        "allow clients to a1",
        path(
            "c1 -> svc-a1 TCP allowed",
            &c1,
            ("10.96.1.11", 80),
            Tcp,
            a("web/a1"),
        ),
        vec![
            path(
                "c2 -> svc-a1 TCP allowed",
                &c2,
                ("10.96.1.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c2 -> svc-a2 TCP still blocked",
                &c2,
                ("10.96.1.12", 80),
                Tcp,
                Want::Blocked,
            ),
        ],
    );
    lab.ok(&["delete", "-f", &lab.file("deny.yaml", DENY_ALL)]);
    lab.ok(&["delete", "-f", &lab.file("allow.yaml", ALLOW_CLIENTS)]);

    // Endpoints follow pods: a2 goes, and with it the UDP connections
    // node-1 translated to it (c1 -> svc-a2 above).
    let a2 = common::pod_ip(&lab.status(), "web", "a2");
    let udp_to_a2 = |ct: &str| {
        ct.lines()
            .filter(|l| l.starts_with("udp,") && l.contains(&format!("reply=(src={a2},")))
            .count()
    };
    let ct = lab.ctl("node-1", &["dump-conntrack"]);
    assert!(
        udp_to_a2(&ct) > 0,
        "no UDP connection to a2 on node-1:\n{ct}"
    );
    let out = lab.ok(&[
        "delete",
        "-f",
        &lab.file(
            "a2.yaml",
            &pod("web", "a2", "node-2", "{app: ab, pod: a2}", true),
        ),
    ]);
    assert!(out.contains("Endpoints web/svc-ab: 1 address"), "{out}");
    wait_services(&lab, 8, 3);
    // Each Endpoints object is its own update (in Kubernetes too): wait
    // until no group on either node still has a2.
    let t = Instant::now();
    for node in ["node-1", "node-2"] {
        while lab
            .ctl(node, &["dump-groups"])
            .contains(&format!("nat(dst={a2}:"))
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "a group on {node} still sends to the deleted a2:\n{}",
                evidence(&lab)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let t = Instant::now();
    while udp_to_a2(&lab.ctl("node-1", &["dump-conntrack"])) > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "node-1 kept UDP connections to the deleted endpoint a2:\n{}",
            lab.ctl("node-1", &["dump-conntrack"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Converged when svc-ab answers from a1 (at most 8 s), then checked.
    report.converge(
        &lab,
        "a2 deleted",
        path(
            "c1 -> svc-ab TCP: a1",
            &c1,
            ("10.96.1.13", 80),
            Tcp,
            a("web/a1"),
        ),
        vec![
            path(
                "c1 -> svc-ab TCP x12: a1 only",
                &c1,
                ("10.96.1.13", 80),
                Tcp,
                Want::Spread(12, vec!["web/a1"]),
            ),
            path(
                "c1 -> svc-aff TCP x6: a1 (a learned a2 is chosen again)",
                &c1,
                ("10.96.1.14", 80),
                Tcp,
                Want::Spread(6, vec!["web/a1"]),
            ),
            path(
                "c2 -> svc-aff TCP x6: a1 (a learned a2 is chosen again)",
                &c2,
                ("10.96.1.14", 80),
                Tcp,
                Want::Spread(6, vec!["web/a1"]),
            ),
            path(
                "c2 -> svc-a2 TCP: no endpoint, rejected",
                &c2,
                ("10.96.1.12", 80),
                Tcp,
                Want::Refused,
            ),
        ],
    );
    long.check("after the policy changes and a2's deletion");

    // A rolling update of the network on the client's node: the agent,
    // then the switch restart. The long connection's translation (made on
    // node-2, where its client is) is saved and restored with the
    // connection table, the agent's Service flows and groups converge
    // without a change, and new connections are balanced as before.
    lab.ok(&["agent", "restart", "node-2"]);
    long.check("after node-2's agent restarted");
    let out = lab.ok(&["switch", "restart", "node-2"]);
    assert!(out.contains("conntrack state restored"), "{out}");
    long.check("after node-2's switch restarted");
    wait_services(&lab, 8, 3);
    report.check(
        &lab,
        "after node-2's restarts",
        &[
            path(
                "c2 -> svc-a1 TCP (other node)",
                &c2,
                ("10.96.1.11", 80),
                Tcp,
                a("web/a1"),
            ),
            path(
                "c2 -> svc-a1 UDP (other node)",
                &c2,
                ("10.96.1.11", 80),
                Udp,
                Want::Answer(vec![]),
            ),
            path(
                "c2 -> svc-ab TCP x6: a1",
                &c2,
                ("10.96.1.13", 80),
                Tcp,
                Want::Spread(6, vec!["web/a1"]),
            ),
        ],
    );
    // An IPv6 Service in this IPv4-only lab: refused with the reason.
    let v6 = lab.file(
        "v6.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: v6, namespace: web}\nspec: {ipFamilyPolicy: RequireDualStack, ports: [{port: 80}]}\n",
    );
    let out = lab.run(&["apply", "-f", &v6]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("IPv4-only") && err.contains("--ip-family dual"),
        "{err}"
    );
    report.finish();
}

/// A TCP connection held open through a ClusterIP from a pod.
struct LongConn {
    stream: TcpStream,
}

impl LongConn {
    /// Connects from pod namespace `netns` (the server may still be
    /// starting: retried for 5 s).
    fn open(netns: &str, dst: &str) -> LongConn {
        let netns = netns.to_string();
        let dst: std::net::SocketAddr = dst.parse().expect("addr");
        // Connect from the pod's namespace in a thread of its own; the
        // socket keeps its namespace after the thread ends.
        let stream = std::thread::spawn(move || {
            common::paths::enter(&netns).expect("enter the client pod");
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match TcpStream::connect_timeout(&dst, Duration::from_secs(2)) {
                    Ok(s) => return s,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("connect {dst}: {e}; retrying");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => panic!("connect {dst} through the ClusterIP: {e}"),
                }
            }
        })
        .join()
        .expect("connect thread");
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        LongConn { stream }
    }

    /// The connection still carries data both ways.
    fn check(&mut self, when: &str) {
        let msg = format!("still there {when}?\n");
        self.stream
            .write_all(msg.as_bytes())
            .unwrap_or_else(|e| panic!("{when}: write: {e}"));
        let mut got = vec![0u8; msg.len()];
        self.stream
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("{when}: read the echo: {e}"));
        assert_eq!(got, msg.as_bytes(), "{when}: the echo");
    }
}
