//! Nodes joining and leaving a running cluster (a node added later is
//! reachable; a node removed disappears from every other node's flows), on
//! a real oxvs-lab (root + AF_XDP, real binaries).
//!
//! A 2-node lab with a pod on each node; `oxvs-lab node add` makes node-3
//! and a pod is put on it. Then, each within a bound:
//! - the pods on node-1 and node-2 reach node-3's pod and back, TCP and UDP
//!   (probed with real traffic until the matrix is all reachable, <= 5 s);
//! - node-1's and node-2's L3Forwarding tables route node-3's pod CIDR to
//!   its underlay address, and node-1 has the host route to it.
//!
//! `oxvs-lab node remove node-3` is refused while the pod runs; with
//! `--force` the pod and node go, and within 5 s no flow on node-1 or
//! node-2 mentions node-3's pod CIDR, gateway or underlay address, node-1's
//! host route to it is gone, its namespace is gone, and node-1 and node-2
//! still reach each other.

mod common;

use std::time::{Duration, Instant};

use common::{oxvsctl, Lab};
use serde_json::Value;

const POD: &str = "
apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: default, labels: {app: web}}
spec:
  nodeName: NODE
  containers:
  - name: serve
    image: oxvs-lab/serve
    ports: [{containerPort: 80, protocol: TCP}, {containerPort: 80, protocol: UDP}]
";

fn pod_yaml(name: &str, node: &str) -> String {
    POD.replace("NAME", name).replace("NODE", node)
}

/// `oxvsctl dump-flows --names --no-stats [--table T]` on `node`'s switch.
fn flows(lab: &Lab, node: &str, table: Option<&str>) -> String {
    let sock = lab.root().join(node).join("switchd.sock");
    let mut args: Vec<String> = vec![
        "dump-flows".into(),
        "--socket".into(),
        sock.display().to_string(),
        "--names".into(),
        "--no-stats".into(),
    ];
    if let Some(t) = table {
        args.push("--table".into());
        args.push(t.into());
    }
    let out = std::process::Command::new(oxvsctl())
        .args(&args)
        .output()
        .expect("run oxvsctl");
    assert!(
        out.status.success(),
        "oxvsctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn routes(lab: &Lab, node: &str) -> String {
    let ns = format!("{}-{node}", lab.name);
    let out = std::process::Command::new("ip")
        .args(["-n", &ns, "route"])
        .output()
        .expect("ip route");
    assert!(out.status.success(), "ip -n {ns} route: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 100 ms until it returns true or `limit` passes; the time
/// it took.
fn within(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        if f() {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `(from, to) -> reachable` for every pair involving `pods` (`--json`
/// probe, 500 ms timeout).
fn unreachable_pairs(lab: &Lab, proto: &str) -> Vec<String> {
    let out = lab.ok(&[
        "probe",
        "--protocol",
        proto,
        "--port",
        "80",
        "--timeout-ms",
        "500",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).expect("probe --json");
    v.as_array()
        .expect("list")
        .iter()
        .filter(|p| p["reachable"].as_bool() != Some(true))
        .map(|p| format!("{} -> {} ({})", p["from"], p["to"], p["detail"]))
        .collect()
}

#[test]
fn node_added_later_is_reachable_and_a_removed_node_disappears() {
    skip_unless_capable!();
    let lab = Lab::up(2);
    let f = lab.file(
        "pods.yaml",
        &format!(
            "{}---{}",
            pod_yaml("p1", "node-1"),
            pod_yaml("p2", "node-2")
        ),
    );
    lab.ok(&["apply", "-f", &f]);
    within(Duration::from_secs(5), "p1 <-> p2", || {
        unreachable_pairs(&lab, "tcp").is_empty()
    });

    // Add node-3 and a pod on it.
    let t_add = Instant::now();
    let out = lab.ok(&["node", "add"]);
    assert!(out.contains("node-3 added"), "{out}");
    let st = lab.status();
    let n3 = st["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == "node-3")
        .cloned()
        .unwrap_or_else(|| panic!("node-3 not in status: {st}"));
    assert_eq!(n3["podCIDR"], "10.244.3.0/24");
    assert_eq!(n3["ip"], "192.168.77.13");
    assert_eq!(n3["agent"]["running"], true, "{n3}");
    assert_eq!(n3["switchd"]["running"], true, "{n3}");
    assert_eq!(st["healthy"], true, "{st}");
    let f3 = lab.file("p3.yaml", &pod_yaml("p3", "node-3"));
    let out = lab.ok(&["apply", "-f", &f3]);
    assert!(out.contains("on node-3 ip 10.244.3."), "{out}");
    let t_pod = Instant::now();
    let took = within(
        Duration::from_secs(5),
        "every pod reaches p3 and back (TCP)",
        || unreachable_pairs(&lab, "tcp").is_empty(),
    );
    within(
        Duration::from_secs(5),
        "every pod reaches p3 and back (UDP)",
        || unreachable_pairs(&lab, "udp").is_empty(),
    );
    eprintln!(
        "node add: ready in {:?}; p3 reachable from node-1/2 {took:?} after its apply",
        t_pod.duration_since(t_add)
    );
    for node in ["node-1", "node-2"] {
        within(
            Duration::from_secs(5),
            &format!("{node} routes 10.244.3.0/24"),
            || {
                let l3 = flows(&lab, node, Some("L3Forwarding"));
                l3.lines().any(|l| {
                    l.contains("nw_dst=10.244.3.0/24") && l.contains("192.168.77.13->tun_dst")
                })
            },
        );
    }
    assert!(
        routes(&lab, "node-1").contains("10.244.3.0/24 via 10.244.3.1"),
        "node-1 has no host route to node-3's pods:\n{}",
        routes(&lab, "node-1")
    );

    // Remove: refused while p3 runs there, then forced.
    let out = lab.run(&["node", "remove", "node-3"]);
    assert!(
        !out.status.success(),
        "removing a node with pods must be refused"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("default/p3") && err.contains("--force"),
        "{err}"
    );
    assert!(lab.status()["nodes"].as_array().expect("nodes").len() == 3);

    let t_rm = Instant::now();
    let out = lab.ok(&["node", "remove", "node-3", "--force"]);
    let rm_took = t_rm.elapsed();
    assert!(
        out.contains("Pod default/p3 deleted") && out.contains("node-3 removed"),
        "{out}"
    );
    let mentions_node3 = |l: &&str| {
        l.contains("10.244.3.") || l.contains("192.168.77.13") || l.contains("0xc0a84d0d")
    };
    for node in ["node-1", "node-2"] {
        within(
            Duration::from_secs(5),
            &format!("node-3 gone from {node}'s flows"),
            || !flows(&lab, node, None).lines().any(|l| mentions_node3(&l)),
        );
        eprintln!(
            "node remove: took {rm_took:?}; gone from {node}'s flows within {:?} of its start",
            t_rm.elapsed()
        );
    }
    let left: Vec<String> = flows(&lab, "node-1", None)
        .lines()
        .filter(mentions_node3)
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    within(
        Duration::from_secs(5),
        "node-1's host route to 10.244.3.0/24 gone",
        || !routes(&lab, "node-1").contains("10.244.3.0/24"),
    );
    within(
        Duration::from_secs(5),
        "node-2's host route to 10.244.3.0/24 gone",
        || !routes(&lab, "node-2").contains("10.244.3.0/24"),
    );
    let st = lab.status();
    let names: Vec<&str> = st["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["node-1", "node-2"]);
    assert_eq!(st["healthy"], true, "{st}");
    assert!(st["pods"].as_array().expect("pods").len() == 2, "{st}");
    let ns = lab.namespaces();
    assert!(
        !ns.iter()
            .any(|n| n.ends_with("-node-3") || n.ends_with("-p3")),
        "{ns:?}"
    );
    assert!(
        !lab.root().join("manifests/node_node-3.yaml").exists()
            && !lab.root().join("node-3").exists()
    );
    assert!(unreachable_pairs(&lab, "tcp").is_empty());

    // The index is free again: a new node-3 starts clean and is reachable.
    lab.ok(&["node", "add"]);
    lab.ok(&["apply", "-f", &f3]);
    within(
        Duration::from_secs(5),
        "the new node-3's pod is reachable",
        || unreachable_pairs(&lab, "tcp").is_empty(),
    );
}
