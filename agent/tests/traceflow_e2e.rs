//! End-to-end traceflow: switchd + agent (with its API socket) in a node
//! namespace, pods made by the real `oxvs-cni`, `oxvsctl traceflow` asking
//! the agent, which asks the switch to trace through the live flows.
//!
//! Skips (passing) when not root / no AF_XDP, like the other e2e tests.

#[path = "../../switch/tests/common/mod.rs"]
mod common;
mod node;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{oxvsctl_bin, workspace_bin, Bg};
use node::{Node, RmDir, GW};
use serde_json::Value;

/// A node whose agent also serves the API socket (and, optionally, reads
/// a manifest directory). Field order = drop order: the agent goes before
/// the node's namespace.
struct ApiNode {
    agent: Bg,
    api: PathBuf,
    node: Node,
}

impl ApiNode {
    fn start(tag: &str, cidr: &str, manifests: Option<&Path>) -> ApiNode {
        let mut node = Node::start(tag, cidr);
        // Restart the agent with the API socket (same state, CNI socket and switch).
        assert!(node.stop_agent(), "agent did not stop on SIGTERM");
        let api = node.dir.join("agent.sock");
        let bin = workspace_bin("oxvs-agent").to_string_lossy().into_owned();
        let (cni, sw, state, api_s) = (
            node.cni_socket(),
            node.sw.sock.to_string_lossy().into_owned(),
            node.dir.join("state").to_string_lossy().into_owned(),
            api.to_string_lossy().into_owned(),
        );
        let mut args: Vec<&str> = vec![
            &bin,
            "--node-name",
            "n1",
            "--pod-cidr",
            cidr,
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
            &api_s,
            "--log-level",
            "oxvs_agent=debug,info",
        ];
        let m;
        if let Some(dir) = manifests {
            m = dir.to_string_lossy().into_owned();
            args.extend_from_slice(&["--manifests", &m]);
        }
        let mut agent = Bg::spawn(Some(&node.ns.name), &args);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = node.cni("STATUS", "", "", "", "", &node.config("1.1.0"));
            if st.ok && api.exists() {
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
        ApiNode { agent, api, node }
    }

    fn traceflow(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let api = self.api.to_string_lossy().into_owned();
        let mut full = vec!["traceflow", "--agent-socket", &api];
        full.extend_from_slice(args);
        let o: Output = Command::new(oxvsctl_bin())
            .args(&full)
            .stdin(Stdio::null())
            .output()
            .expect("run oxvsctl");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn traceflow_json(&self, args: &[&str]) -> (Option<i32>, Value) {
        let api = self.api.to_string_lossy().into_owned();
        let mut all = vec!["--json", "traceflow", "--agent-socket", &api];
        all.extend_from_slice(args);
        let o = Command::new(oxvsctl_bin())
            .args(&all)
            .stdin(Stdio::null())
            .output()
            .expect("run oxvsctl");
        let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        });
        (o.status.code(), v)
    }

    fn tx_packets(&self, ofport: u64) -> u64 {
        let out = self.node.sw.ctl_ok(&["--json", "dump-ports"]);
        let v: Value = serde_json::from_str(&out).expect("dump-ports --json");
        v["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["ofport"].as_u64() == Some(ofport)))
            .and_then(|p| p["stats"]["tx_packets"].as_u64())
            .unwrap_or(0)
    }
}

impl Drop for ApiNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- oxvs-agent (API) log ---\n{}", self.agent.stderr_text());
        }
    }
}

#[test]
fn traceflow_between_two_pods_of_one_node() {
    skip_unless_capable!();
    let n = ApiNode::start("tf1", "10.236.1.0/24", None);
    let _a = n.node.add_pod("a");
    let b = n.node.add_pod("b");

    let (code, out, err) = n.traceflow(&["--src", "test/a", "--dst", "test/b", "--dport", "80"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("Node n1"), "{out}");
    assert!(
        out.contains("SpoofGuard") && out.contains("pod test/a (port"),
        "{out}"
    );
    assert!(
        out.contains("Result: delivered to pod test/b (port"),
        "{out}"
    );
    if std::env::var_os("OXVS_TEST_LOGS").is_some() {
        eprintln!("{out}");
    }

    let (code, v) = n.traceflow_json(&[
        "--src", "test/a", "--dst", &b.ip, "--proto", "udp", "--dport", "53",
    ]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["outcome"], "delivered");
    let hop = &v["hops"][0];
    assert_eq!(hop["verdict"]["kind"], "delivered");
    assert_eq!(hop["verdict"]["to"], "pod test/b");
    assert!(
        hop["packet"].as_str().unwrap_or("").contains(",udp,"),
        "{hop:#}"
    );
    let steps = hop["steps"].as_array().expect("steps");
    assert!(
        steps.iter().any(|s| s["pass"] == 1),
        "conntrack recirculation traced"
    );
    assert!(steps.iter().all(|s| s["annotation"] != ""), "{steps:#?}");

    // The node (gateway) by IP, with ICMP.
    let (code, out, err) =
        n.traceflow(&["--src", "test/b", "--dst", "10.236.1.1", "--proto", "icmp"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("delivered to gateway {GW}")), "{out}");

    // --inject: the packet really reaches b's port.
    let b_port = hop["verdict"]["ofport"].as_u64().expect("b's port");
    let before = n.tx_packets(b_port);
    let (code, out, err) = n.traceflow(&[
        "--src", "test/a", "--dst", "test/b", "--proto", "udp", "--dport", "9", "--inject",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("injected"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(3);
    while n.tx_packets(b_port) <= before {
        assert!(
            Instant::now() < deadline,
            "injected packet never left b's port {b_port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // `info` and `pod` on the API socket.
    let info: oxvs_api::agent::InfoResult = oxvs_api::agent::call_agent(
        &n.api,
        &oxvs_api::agent::AgentRequest::Info,
        Duration::from_secs(10),
    )
    .expect("info");
    assert_eq!(info.node, "n1");
    assert_eq!(info.pod_cidr.as_deref(), Some("10.236.1.0/24"));
    assert_eq!(info.gateway.as_ref().map(|g| g.name.as_str()), Some(GW));
    let mut names: Vec<String> = info
        .pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    names.sort();
    assert_eq!(names, ["test/a", "test/b"]);
    let p: oxvs_api::agent::PodInfo = oxvs_api::agent::call_agent(
        &n.api,
        &oxvs_api::agent::AgentRequest::Pod {
            namespace: "test".into(),
            name: "b".into(),
        },
        Duration::from_secs(10),
    )
    .expect("pod");
    assert!(
        p.local
            && p.ofport == Some(b_port as u32)
            && p.ip.map(|i| i.to_string()) == Some(b.ip.clone()),
        "{p:?}"
    );

    // A pod nobody knows: the agent refuses, naming it (exit 1).
    let (code, out, err) = n.traceflow(&["--src", "test/zz", "--dst", "test/b", "--dport", "80"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("test/zz"), "{err}");
}

/// With a deny-all-ingress policy from a manifest directory, traceflow
/// names the policy. Needs the manifest source and the policy translator;
/// until the agent has them it says so in its log and the case is skipped.
#[test]
fn traceflow_names_the_policy_that_drops() {
    skip_unless_capable!();
    let dir = std::env::temp_dir().join(common::unique("tf-manifests"));
    std::fs::create_dir_all(&dir).expect("manifest dir");
    let _rm = RmDir(dir.clone());
    let n = ApiNode::start("tf2", "10.236.2.0/24", Some(&dir));
    // The Pod objects exist before their ADDs (the agent attaches a pod
    // only once it knows it); their addresses are written back after.
    let bound = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: test\n  name: {name}\n  labels: {{app: {name}}}\nspec:\n  nodeName: n1\n  containers: [{{name: c, image: x}}]\n---\n"
        )
    };
    std::fs::write(dir.join("cluster.yaml"), bound("a") + &bound("b")).expect("write manifest");
    let a = n.node.add_pod("a");
    let b = n.node.add_pod("b");
    let manifest = format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: test
---
apiVersion: v1
kind: Node
metadata:
  name: n1
spec:
  podCIDR: 10.236.2.0/24
---
apiVersion: v1
kind: Pod
metadata:
  namespace: test
  name: a
  labels: {{app: a}}
spec:
  nodeName: n1
  containers: [{{name: c, image: x}}]
status:
  podIP: {}
---
apiVersion: v1
kind: Pod
metadata:
  namespace: test
  name: b
  labels: {{app: b}}
spec:
  nodeName: n1
  containers: [{{name: c, image: x}}]
status:
  podIP: {}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: test
  name: deny-all
spec:
  podSelector: {{}}
  policyTypes: [Ingress]
"#,
        a.ip, b.ip
    );
    std::fs::write(dir.join("cluster.yaml"), manifest).expect("write manifest");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, out, err) =
            n.traceflow(&["--src", "test/a", "--dst", "test/b", "--dport", "80"]);
        if code == Some(4) {
            assert!(
                out.contains(
                    "Result: dropped on node n1 by NetworkPolicy test/deny-all ingress (isolation)"
                ),
                "{out}{err}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the policy never dropped the packet (exit {code:?}):\n{out}{err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Egress from b is not isolated: b -> a is dropped too (a's ingress),
    // but b -> the gateway is delivered.
    let (code, out, err) =
        n.traceflow(&["--src", "test/b", "--dst", "10.236.2.1", "--proto", "icmp"]);
    assert_eq!(code, Some(0), "{out}{err}");
}
