//! NetworkPolicy conformance on a real 2-node oxvs-lab, in the model of
//! the upstream Kubernetes netpol e2e tests: namespaces x, y, z with pods
//! a, b, c each (`examples/lab/pods.yaml`), serving TCP and UDP on 80 and
//! 81, spread over both nodes. For each case the policies are applied,
//! every pair is probed with real traffic, and the matrix must equal the
//! expected truth table within a few seconds. The same cases run in
//! each of the lab's address families (`up --ip-family`): an IPv4-only
//! lab, a dual-stack one (every table probed over IPv4 and over IPv6)
//! and an IPv6-only one.
//!
//! Expected tables come from `oxvs_agent::policy::allowed`, an interpreter
//! of the API's semantics written apart from the flow code, evaluated on
//! the lab's own manifests (loopback is always allowed: a pod talking to
//! itself never leaves its namespace). A few cases also check hand-written
//! tables, so the interpreter itself is held to the API.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Lab;
use oxvs_agent::model::Protocol;
use oxvs_agent::policy::{allowed, allowed_v6, Endpoint};
use serde_json::Value;

type Matrix = BTreeMap<(String, String), bool>;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
}

/// The address family a matrix is probed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn flag(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

fn probe(lab: &Lab, proto: &str, port: u16, family: Family) -> Matrix {
    let out = lab.ok(&[
        "probe",
        "--protocol",
        proto,
        "--port",
        &port.to_string(),
        "--timeout-ms",
        "600",
        "--ip-family",
        family.flag(),
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).expect("probe --json");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|p| {
            (
                (
                    p["from"].as_str().unwrap_or_default().to_string(),
                    p["to"].as_str().unwrap_or_default().to_string(),
                ),
                p["reachable"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The expected matrix from the lab's manifests.
fn expected(lab: &Lab, keys: &Matrix, proto: Protocol, port: u16, family: Family) -> Matrix {
    let (state, warnings) =
        oxvs_agent::source::load_manifest_dir(&lab.root().join("manifests")).expect("manifests");
    assert!(warnings.is_empty(), "manifest warnings: {warnings:?}");
    keys.keys()
        .map(|(f, t)| {
            let key = |s: &str| {
                let (ns, n) = s.split_once('/').expect("ns/pod");
                Endpoint::Pod((ns.to_string(), n.to_string()))
            };
            let ok = f == t
                || match family {
                    Family::V4 => allowed(&state, key(f), key(t), proto, port),
                    Family::V6 => allowed_v6(&state, key(f), key(t), proto, port),
                };
            ((f.clone(), t.clone()), ok)
        })
        .collect()
}

fn table(m: &Matrix) -> String {
    let pods: Vec<&String> = m
        .keys()
        .map(|(f, _)| f)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut s = format!("{:6}", "-");
    for p in &pods {
        s.push_str(&format!("{p:6}"));
    }
    s.push('\n');
    for f in &pods {
        s.push_str(&format!("{f:6}"));
        for t in &pods {
            let c = match m.get(&((*f).clone(), (*t).clone())) {
                Some(true) => ".",
                Some(false) => "X",
                None => "?",
            };
            s.push_str(&format!("{c:6}"));
        }
        s.push('\n');
    }
    s
}

/// Probes until the matrix equals the expected one (the agents converge
/// within a second; allow 5), and returns it.
fn converge(lab: &Lab, case: &str, proto: &str, port: u16, family: Family) -> Matrix {
    let p = match proto {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        _ => Protocol::Sctp,
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = probe(lab, proto, port, family);
        assert!(
            !got.is_empty(),
            "case {case}: nothing probed over {family:?}"
        );
        let want = expected(lab, &got, p, port, family);
        if got == want {
            return got;
        }
        if Instant::now() > deadline {
            let diff: Vec<String> = got
                .iter()
                .filter(|(k, v)| want.get(*k) != Some(*v))
                .map(|((f, t), v)| format!("{f} -> {t}: got {}, want {}", v, !v))
                .collect();
            panic!(
                "case {case} ({proto}/{port} over {family:?}): the matrix does not follow the policies\n--- got ---\n{}--- want ---\n{}differences: {diff:?}",
                table(&got),
                table(&want)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn column_blocked(m: &Matrix, to_ns: &str) -> bool {
    m.iter()
        .filter(|((f, t), _)| t.starts_with(&format!("{to_ns}/")) && f != t)
        .all(|(_, v)| !v)
}

const DENY_ALL_INGRESS_X: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
";

struct Case {
    name: &'static str,
    yaml: &'static str,
    probes: &'static [(&'static str, u16)],
}

const CASES: &[Case] = &[
    Case { name: "deny-all ingress in x", yaml: DENY_ALL_INGRESS_X, probes: &[("tcp", 80), ("udp", 81)] },
    Case {
        name: "allow-all ingress in x is a union with deny-all",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all-ingress, namespace: x}
spec: {podSelector: {}, ingress: [{}]}
",
        probes: &[("tcp", 80)],
    },
    Case {
        name: "deny-all egress in x (policyTypes Egress)",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-egress, namespace: x}
spec: {podSelector: {}, policyTypes: [Egress]}
",
        probes: &[("tcp", 80)],
    },
    Case {
        name: "namespaceSelector AND podSelector in one peer",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: and-peer, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: [y, z]}]}
      podSelector: {matchLabels: {pod: b}}
",
        probes: &[("tcp", 80)],
    },
    Case {
        name: "two peers are OR; podSelector alone means the policy's namespace",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: or-peers, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
    - podSelector: {matchLabels: {pod: c}}
",
        probes: &[("tcp", 80)],
    },
    Case {
        name: "matchExpressions NotIn, Exists, DoesNotExist",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: exprs, namespace: y}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: NotIn, values: [a]}]}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: ns, operator: Exists}]}
      podSelector: {matchExpressions: [{key: pod, operator: In, values: [a, c]}]}
    - podSelector: {matchExpressions: [{key: nosuch, operator: DoesNotExist}, {key: pod, operator: In, values: [b]}]}
",
        probes: &[("tcp", 80)],
    },
    Case {
        name: "ports: TCP 80 only, by number",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: port-80, namespace: x}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: TCP, port: 80}]}]
",
        probes: &[("tcp", 80), ("tcp", 81), ("udp", 80)],
    },
    Case {
        name: "named port, resolved on the destination pod",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named-port, namespace: z}
spec:
  podSelector: {}
  ingress: [{ports: [{port: serve-81-tcp}]}]
",
        probes: &[("tcp", 80), ("tcp", 81)],
    },
    Case {
        name: "port range with endPort",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: range, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{ports: [{protocol: UDP, port: 80, endPort: 81}]}]
",
        probes: &[("udp", 80), ("udp", 81), ("tcp", 80)],
    },
    Case {
        name: "ipBlock with except: node-1's pods but one",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ipblock, namespace: y}
spec:
  podSelector: {}
  ingress:
  - from: [{ipBlock: {cidr: 10.244.1.0/24, except: [10.244.1.2/32]}}]
",
        probes: &[("tcp", 80)],
    },
    Case {
        // Each block holds its own family only: over IPv4 node-1's pods
        // but one reach y, over IPv6 node-2's pods but one.
        name: "ipBlocks of both families",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ipblock-dual, namespace: y}
spec:
  podSelector: {}
  ingress:
  - from:
    - {ipBlock: {cidr: 10.244.1.0/24, except: [10.244.1.2/32]}}
    - {ipBlock: {cidr: 'fd00:10:244:2::/64', except: ['fd00:10:244:2::3/128']}}
",
        probes: &[("tcp", 80), ("udp", 81)],
    },
    Case {
        name: "egress to namespace y only; replies of allowed connections pass",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{protocol: TCP, port: 80}]}]
",
        probes: &[("tcp", 80), ("tcp", 81)],
    },
    Case {
        name: "several policies, both directions, on one pod",
        yaml: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: in-from-z, namespace: y}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: in-from-x-a, namespace: y}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {pod: a}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out-to-x, namespace: y}
spec:
  podSelector: {matchLabels: {pod: c}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: x}}}]}]
",
        probes: &[("tcp", 80), ("udp", 80)],
    },
];

/// The families a lab of `ip_family` (`up --ip-family`) is probed over:
/// each its pods have addresses of.
fn families_of(ip_family: &str) -> &'static [Family] {
    match ip_family {
        "ipv4" => &[Family::V4],
        "ipv6" => &[Family::V6],
        _ => &[Family::V4, Family::V6],
    }
}

/// Every case of [`CASES`] on a 2-node lab of `ip_family`, each table
/// probed over every family of the lab's pods.
fn conformance(ip_family: &str) {
    let lab = Lab::up_args(&["--nodes", "2", "--ip-family", ip_family]);
    let families = families_of(ip_family);
    let pods = workspace().join("examples/lab/pods.yaml");
    lab.ok(&["apply", "-f", &pods.display().to_string()]);
    for &family in families {
        let open = converge(&lab, "no policy", "tcp", 80, family);
        assert!(
            open.values().all(|v| *v),
            "no policy: all reachable over {family:?}\n{}",
            table(&open)
        );
    }

    for (i, c) in CASES.iter().enumerate() {
        let f = lab.file(&format!("case{i}.yaml"), c.yaml);
        lab.ok(&["apply", "-f", &f]);
        let mut first = None;
        for (proto, port) in c.probes {
            for &family in families {
                let m = converge(&lab, c.name, proto, *port, family);
                first.get_or_insert(m);
            }
        }
        // Hand-checked tables, independent of the interpreter.
        if i == 0 {
            let m = first.as_ref().expect("probed");
            assert!(
                column_blocked(m, "x"),
                "deny-all: nobody reaches x\n{}",
                table(m)
            );
            assert!(m
                .iter()
                .filter(|((_, t), _)| !t.starts_with("x/"))
                .all(|(_, v)| *v));
        }
        if i == 2 {
            let m = first.as_ref().expect("probed");
            for ((f, t), v) in m {
                let want = !f.starts_with("x/") || f == t;
                assert_eq!(*v, want, "deny-all egress: {f} -> {t}\n{}", table(m));
            }
        }
        lab.ok(&["delete", "-f", &f]);
        for &family in families {
            let m = converge(&lab, &format!("{} (deleted)", c.name), "tcp", 80, family);
            assert!(
                m.values().all(|v| *v),
                "after deleting {}: all reachable again over {family:?}\n{}",
                c.name,
                table(&m)
            );
        }
    }
}

/// The IPv4-only lab (the default).
#[test]
fn networkpolicy_conformance_ipv4_only() {
    skip_unless_capable!();
    conformance("ipv4");
}

/// The dual-stack lab: every table over IPv4 and over IPv6.
#[test]
fn networkpolicy_conformance_on_two_nodes() {
    skip_unless_capable!();
    conformance("dual");
}

/// The IPv6-only lab (`up --ip-family ipv6`): every table over IPv6, the
/// pods having no IPv4 address (an IPv4 `ipBlock` then matches nobody).
#[test]
fn networkpolicy_conformance_ipv6_only() {
    skip_unless_capable!();
    conformance("ipv6");
}

#[test]
fn matrix_follows_label_and_policy_changes_within_a_second() {
    skip_unless_capable!();
    let lab = Lab::up(2);
    let pods = workspace().join("examples/lab/pods.yaml");
    lab.ok(&["apply", "-f", &pods.display().to_string()]);
    let allow = lab.file(
        "allow.yaml",
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-from-blue, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: blue}}, podSelector: {matchLabels: {role: client}}}]}]
",
    );
    lab.ok(&["apply", "-f", &allow]);
    let m = converge(
        &lab,
        "allow-from-blue, nobody labelled",
        "tcp",
        80,
        Family::V4,
    );
    assert!(column_blocked(&m, "x"));
    // Label namespace y blue: still nobody (no pod is a client).
    let ns_blue = lab.file(
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: y, labels: {ns: y, team: blue}}\n",
    );
    lab.ok(&["apply", "-f", &ns_blue]);
    let m = converge(&lab, "y is blue", "tcp", 80, Family::V4);
    assert!(column_blocked(&m, "x"));
    // Label pod y/b a client: y/b reaches x, timed.
    let client = lab.file(
        "client.yaml",
        "
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: y, labels: {pod: b, role: client}}
spec:
  containers:
  - name: cont-80-81
    image: oxvs-lab/serve
    ports:
    - {name: serve-80-tcp, containerPort: 80, protocol: TCP}
    - {name: serve-80-udp, containerPort: 80, protocol: UDP}
    - {name: serve-81-tcp, containerPort: 81, protocol: TCP}
    - {name: serve-81-udp, containerPort: 81, protocol: UDP}
",
    );
    let t0 = Instant::now();
    lab.ok(&["apply", "-f", &client]);
    let m = converge(&lab, "y/b is a client", "tcp", 80, Family::V4);
    eprintln!("relabel to matrix: {:?}", t0.elapsed());
    assert!(m[&("y/b".to_string(), "x/a".to_string())]);
    assert!(!m[&("y/a".to_string(), "x/a".to_string())]);
    // Policy updated to any namespace: z's clients too (none), y/b still.
    // Policy deleted: everything open again.
    let t0 = Instant::now();
    lab.ok(&["delete", "-f", &allow]);
    let m = converge(&lab, "policy deleted", "tcp", 80, Family::V4);
    eprintln!("delete to matrix: {:?}", t0.elapsed());
    assert!(m.values().all(|v| *v));
}
