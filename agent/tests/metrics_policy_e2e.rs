//! End to end: per-NetworkPolicy-rule counters on the agent's `/metrics`.
//!
//! A node whose agent follows a manifest directory (pods a, b, c in
//! namespace `test`; NetworkPolicy `allow-a` isolates b for ingress and
//! allows it from a). Pinging a -> b must count in
//! `oxvs_networkpolicy_rule_packets_total{policy="allow-a",direction="ingress",rule="0"}`;
//! pinging c -> b is dropped and must count in
//! `oxvs_networkpolicy_denied_packets_total{pod="b",direction="ingress"}`.
//! Skips (passing) when not root / no AF_XDP.

#[path = "../../switch/tests/common/mod.rs"]
mod common;
#[path = "../../switch/tests/metrics_support/mod.rs"]
mod metrics_support;
mod node;

use std::time::{Duration, Instant};

use common::{ping, ping_until_up, workspace_bin, Bg};
use metrics_support::{scrape, Scrape};
use node::{Node, RmDir, GW};

const AGENT: &str = "127.0.0.1:9531";
const CIDR: &str = "10.237.2.0/24";

/// Field order = drop order: the agent goes before the node's namespace.
struct PolicyNode {
    agent: Bg,
    node: Node,
}

impl Drop for PolicyNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- oxvs-agent (manifests) log ---\n{}",
                self.agent.stderr_text()
            );
        }
    }
}

/// Restarts the node's agent on the same state with `--manifests DIR`.
fn start(dir: &std::path::Path) -> PolicyNode {
    let mut node = Node::start("mpol", CIDR);
    assert!(node.stop_agent(), "agent did not stop on SIGTERM");
    let bin = workspace_bin("oxvs-agent").to_string_lossy().into_owned();
    let (cni, sw, state, api, m) = (
        node.cni_socket(),
        node.sw.sock.to_string_lossy().into_owned(),
        node.dir.join("state").to_string_lossy().into_owned(),
        node.dir.join("agent.sock").to_string_lossy().into_owned(),
        dir.to_string_lossy().into_owned(),
    );
    let args = [
        bin.as_str(),
        "--node-name",
        "n1",
        "--pod-cidr",
        CIDR,
        "--cni-socket",
        &cni,
        "--switchd-socket",
        &sw,
        "--state-dir",
        &state,
        "--gateway",
        GW,
        "--mtu",
        "1450",
        "--no-masquerade",
        "--resync-interval",
        "1",
        "--api-socket",
        &api,
        "--manifests",
        &m,
        "--metrics-addr",
        AGENT,
        "--log-level",
        "oxvs_agent=debug,info",
    ];
    let mut agent = Bg::spawn(Some(&node.ns.name), &args);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = node.cni("STATUS", "", "", "", "", &node.config("1.1.0"));
        if st.ok {
            break;
        }
        assert!(agent.running(), "agent exited:\n{}", agent.stderr_text());
        assert!(
            Instant::now() < deadline,
            "agent not ready in 20 s: {st:?}\n{}",
            agent.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    PolicyNode { agent, node }
}

fn pod_yaml(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: test\n  name: {name}\n  labels: {{app: {name}}}\nspec:\n  nodeName: n1\n  containers: [{{name: c, image: x}}]\nstatus:\n  podIP: {ip}\n---\n"
    )
}

/// A Pod as the scheduler leaves it: bound to n1, no address yet.
fn bound_pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: test\n  name: {name}\n  labels: {{app: {name}}}\nspec:\n  nodeName: n1\n  containers: [{{name: c, image: x}}]\n---\n"
    )
}

fn allowed(s: &Scrape) -> f64 {
    s.sum(
        "oxvs_networkpolicy_rule_packets_total",
        &[
            ("namespace", "test"),
            ("policy", "allow-a"),
            ("direction", "ingress"),
            ("rule", "0"),
        ],
    )
}

fn denied(s: &Scrape) -> f64 {
    s.sum(
        "oxvs_networkpolicy_denied_packets_total",
        &[
            ("namespace", "test"),
            ("pod", "b"),
            ("direction", "ingress"),
        ],
    )
}

#[test]
fn policy_rule_and_isolation_counters_move() {
    skip_unless_capable!();
    let dir = std::env::temp_dir().join(common::unique("metrics-manifests"));
    std::fs::create_dir_all(&dir).expect("manifest dir");
    let _rm = RmDir(dir.clone());
    let n = start(&dir);
    // The Pod objects exist before their ADDs (the agent attaches a pod
    // only once it knows it); their addresses are written back after.
    std::fs::write(
        dir.join("cluster.yaml"),
        ["a", "b", "c"].map(bound_pod_yaml).concat(),
    )
    .expect("write manifest");
    let a = n.node.add_pod("a");
    let b = n.node.add_pod("b");
    let c = n.node.add_pod("c");
    let mut manifest = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: test\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nspec:\n  podCIDR: {CIDR}\n---\n"
    );
    for (name, pod) in [("a", &a), ("b", &b), ("c", &c)] {
        manifest.push_str(&pod_yaml(name, &pod.ip));
    }
    manifest.push_str(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  namespace: test\n  name: allow-a\nspec:\n  podSelector: {matchLabels: {app: b}}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {app: a}}\n",
    );
    std::fs::write(dir.join("cluster.yaml"), manifest).expect("write manifest");

    // Wait until the policy is installed: its rule shows up (with 0 packets).
    let deadline = Instant::now() + Duration::from_secs(15);
    let before = loop {
        let s = scrape(&n.node.ns, AGENT);
        if s.parsed
            .find(
                "oxvs_networkpolicy_rule_packets_total",
                &[("policy", "allow-a")],
            )
            .count()
            > 0
            && s.parsed
                .find("oxvs_networkpolicy_denied_packets_total", &[("pod", "b")])
                .count()
                > 0
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the policy's counters never appeared:\n{}",
            s.text
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(before.value("oxvs_networkpolicies", &[]), 1.0);
    assert!(before.value("oxvs_networkpolicy_rules", &[("direction", "ingress")]) >= 1.0);
    assert!(before.value("oxvs_agent_flows", &[("feature", "policy_rule")]) > 0.0);

    let p = ping_until_up(&a.ns, &b.ip, 5);
    assert!(p.ok, "a -> b (allowed) never answered:\n{}", p.output);
    let p = ping(&a.ns, &b.ip, 5, "0.05", &[]);
    assert_eq!(p.received, 5, "a -> b:\n{}", p.output);
    let p = ping(&c.ns, &b.ip, 4, "0.05", &[]);
    assert_eq!(p.received, 0, "c -> b was not dropped:\n{}", p.output);

    let after = scrape(&n.node.ns, AGENT);
    eprintln!(
        "allowed {} -> {}, denied {} -> {}",
        allowed(&before),
        allowed(&after),
        denied(&before),
        denied(&after)
    );
    // A new connection is counted by the rule (replies and later packets of an
    // established connection may skip it, so: at least the first one).
    assert!(allowed(&after) >= allowed(&before) + 1.0, "{}", after.text);
    assert!(denied(&after) >= denied(&before) + 4.0, "{}", after.text);
    assert_eq!(
        after.sum("oxvs_networkpolicy_denied_packets_total", &[("pod", "a")]),
        0.0,
        "a is not isolated:\n{}",
        after.text
    );
}
