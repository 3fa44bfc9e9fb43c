//! End-to-end tests of `oxvs-lab` through its binary, with real namespaces,
//! the real oxvs-switchd, oxvs-agent and oxvs-cni (built next to
//! `oxvs-lab`: `cargo build --workspace` or `cargo test --workspace`).
//!
//! Every test uses its own lab (name with the pid and a counter), and a
//! [`Lab`] guard runs `down` when it drops, also on failure, printing the
//! node logs when the test panicked. Root and AF_XDP are required; the
//! tests say SKIPPED and pass without them.

mod common;

use std::path::Path;

use common::Lab;
use oxvs_lab::probe::sctp_supported;
use oxvs_lab::procs;
use serde_json::Value;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {ns: x}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {ns: y}}
---
apiVersion: v1
kind: List
items:
"#;

fn pod_yaml(ns: &str, name: &str, node: Option<&str>) -> String {
    let node = node
        .map(|n| format!("    nodeName: {n}\n"))
        .unwrap_or_default();
    format!(
        "- apiVersion: v1
  kind: Pod
  metadata: {{name: {name}, namespace: {ns}, labels: {{pod: {name}}}}}
  spec:
{node}    containers:
    - name: c
      ports:
      - {{containerPort: 80, protocol: TCP}}
      - {{containerPort: 80, protocol: UDP}}
      - {{containerPort: 80, protocol: SCTP}}
"
    )
}

fn all(results: &[Value], want: Option<bool>) -> bool {
    results.iter().all(|r| r["reachable"].as_bool() == want)
}

fn pids(status: &Value) -> Vec<(u32, &'static str)> {
    let mut v = Vec::new();
    for n in status["nodes"].as_array().into_iter().flatten() {
        for (k, needle) in [("switchd", "oxvs-switchd"), ("agent", "oxvs-agent")] {
            if let Some(p) = n[k]["pid"].as_u64() {
                v.push((p as u32, needle));
            }
        }
    }
    for p in status["pods"].as_array().into_iter().flatten() {
        if let Some(pid) = p["server"]["pid"].as_u64() {
            v.push((pid as u32, "oxvs-lab serve"));
        }
    }
    v
}

#[test]
fn one_node_lab_runs_pods_probes_execs_deletes_and_goes_down_clean() {
    skip_unless_capable!();
    let lab = Lab::up(1);
    // `up` again: says so, changes nothing.
    assert!(lab.ok(&["up", "--nodes", "1"]).contains("already up"));

    let yaml = format!(
        "{PODS}{}{}{}",
        pod_yaml("x", "a", None),
        pod_yaml("x", "b", Some("node-1")),
        pod_yaml("y", "a", None)
    );
    let f = lab.file("pods.yaml", &yaml);
    let out = lab.ok(&["apply", "-f", &f]);
    assert!(
        out.contains("Pod x/a created on node-1 ip 10.244.1."),
        "{out}"
    );

    // Status: three pods with addresses, everything running.
    let st = lab.status();
    assert_eq!(st["healthy"], true, "{st}");
    let pods = st["pods"].as_array().cloned().unwrap_or_default();
    assert_eq!(pods.len(), 3, "{st}");
    for p in &pods {
        assert_eq!(p["server"]["running"], true, "{p}");
        assert!(
            p["ip"]
                .as_str()
                .is_some_and(|ip| ip.starts_with("10.244.1.")),
            "{p}"
        );
    }
    // The pod's IP went back into its manifest, as the kubelet would.
    let m =
        oxvs_lab::manifest::read(&lab.root().join("manifests"), "pod_x_a.yaml").expect("manifest");
    let xa_ip = pods
        .iter()
        .find(|p| p["namespace"] == "x" && p["name"] == "a")
        .and_then(|p| p["ip"].as_str())
        .expect("x/a has an ip")
        .to_string();
    assert_eq!(m["status"]["podIP"].as_str(), Some(xa_ip.as_str()), "{m}");
    assert_eq!(m["spec"]["nodeName"].as_str(), Some("node-1"), "{m}");

    // TCP and UDP: everyone reaches everyone (no policy).
    let tcp = lab.probe("tcp", 80);
    assert_eq!(tcp.len(), 9);
    assert!(all(&tcp, Some(true)), "{tcp:?}");
    let udp = lab.probe("udp", 80);
    assert!(all(&udp, Some(true)), "{udp:?}");
    // SCTP: reachable where the kernel has it, "unknown" (null) where not.
    let sctp = lab.probe("sctp", 80);
    match sctp_supported() {
        Ok(()) => assert!(all(&sctp, Some(true)), "{sctp:?}"),
        Err(_) => assert!(all(&sctp, None), "{sctp:?}"),
    }
    // Nothing serves TCP 81: the probe says blocked (it can fail).
    let closed = lab.probe("tcp", 81);
    assert!(all(&closed, Some(false)), "{closed:?}");
    // The text form is the truth table.
    let text = lab.ok(&["probe"]);
    assert!(text.contains("-    x/a  x/b  y/a\n"), "{text}");
    assert!(text.contains("\ny/a  .    .    .\n"), "{text}");

    // exec runs in the pod and passes on the exit status.
    let addr = lab.ok(&[
        "exec", "x/a", "--", "ip", "-4", "-o", "addr", "show", "eth0",
    ]);
    assert!(addr.contains(&format!("{xa_ip}/24")), "{addr}");
    // The agent gave the pod's interface a qdisc (`--pod-qdisc auto`:
    // `pfifo_fast` on a lab node, which cannot see the host's
    // `net.core.default_qdisc`), so its veth holds frames back while the
    // switch's ring is full instead of dropping them.
    let qdisc = lab.ok(&["exec", "x/a", "--", "tc", "qdisc", "show", "dev", "eth0"]);
    assert!(
        qdisc.contains("qdisc pfifo_fast ") && qdisc.contains(" root "),
        "{qdisc}"
    );
    let out = lab.run(&["exec", "x/a", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert!(!lab.run(&["exec", "x/nope", "--", "true"]).status.success());

    // Re-apply: unchanged.
    let again = lab.ok(&["apply", "-f", &f]);
    assert!(again.contains("Pod x/a unchanged"), "{again}");

    // Delete x/b: its namespace and manifest go, the others still talk.
    let xb_ns = format!("{}-x-b", lab.name);
    assert!(Path::new("/var/run/netns").join(&xb_ns).exists());
    let one = lab.file(
        "xb.yaml",
        &format!(
            "apiVersion: v1\nkind: List\nitems:\n{}",
            pod_yaml("x", "b", None)
        ),
    );
    assert!(lab.ok(&["delete", "-f", &one]).contains("Pod x/b deleted"));
    assert!(!Path::new("/var/run/netns").join(&xb_ns).exists());
    assert!(!lab.root().join("manifests/pod_x_b.yaml").exists());
    let tcp = lab.probe("tcp", 80);
    assert_eq!(tcp.len(), 4);
    assert!(all(&tcp, Some(true)), "{tcp:?}");
    // Deleting it again reports it missing.
    assert!(!lab.run(&["delete", "-f", &one]).status.success());

    // Down: no namespace, process or state left.
    let procs_before = pids(&lab.status());
    assert_eq!(procs_before.len(), 4, "2 daemons + 2 pod servers");
    lab.ok(&["down"]);
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());
    for (pid, needle) in procs_before {
        assert!(!procs::alive(pid, needle), "{needle} ({pid}) still running");
    }
    assert!(!lab.root().exists());
    assert!(lab.ok(&["down"]).contains("does not exist"));
}

#[test]
fn down_cleans_a_half_broken_lab() {
    skip_unless_capable!();
    let lab = Lab::up(1);
    let f = lab.file("p.yaml", &format!("{PODS}{}", pod_yaml("x", "a", None)));
    lab.ok(&["apply", "-f", &f]);
    let st = lab.status();
    let everything = pids(&st);
    // The agent dies: status says so, `up` refuses, `down` still cleans.
    let agent = st["nodes"][0]["agent"]["pid"].as_u64().expect("agent pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the agent");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let st = lab.status();
    assert_eq!(st["healthy"], false, "{st}");
    assert_eq!(st["nodes"][0]["agent"]["running"], false, "{st}");
    let up = lab.run(&["up", "--nodes", "1"]);
    assert!(!up.status.success());
    assert!(String::from_utf8_lossy(&up.stderr).contains("not healthy"));
    lab.ok(&["down", "--grace", "2"]);
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());
    for (pid, needle) in everything {
        assert!(!procs::alive(pid, needle), "{needle} ({pid}) still running");
    }
    assert!(!lab.root().exists());
}

/// Pods on two nodes reach each other over VXLAN: the agents take the Node
/// objects from the manifest directory and add remote-node flows.
#[test]
fn two_node_lab_cross_node_tcp_all_reachable() {
    skip_unless_capable!();
    let lab = Lab::up(2);
    let yaml = format!(
        "{PODS}{}{}{}{}",
        pod_yaml("x", "a", Some("node-1")),
        pod_yaml("x", "b", Some("node-2")),
        pod_yaml("y", "a", Some("node-1")),
        pod_yaml("y", "b", Some("node-2"))
    );
    let f = lab.file("pods.yaml", &yaml);
    lab.ok(&["apply", "-f", &f]);
    let st = lab.status();
    let nodes: Vec<&str> = st["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["node"].as_str())
        .collect();
    assert_eq!(nodes, vec!["node-1", "node-2", "node-1", "node-2"]);
    // Remote-node flows follow the Node objects: allow them a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut tcp = lab.probe("tcp", 80);
    while !all(&tcp, Some(true)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(300));
        tcp = lab.probe("tcp", 80);
    }
    assert_eq!(tcp.len(), 16);
    assert!(all(&tcp, Some(true)), "{tcp:?}");
    let udp = lab.probe("udp", 80);
    assert!(all(&udp, Some(true)), "{udp:?}");
}
