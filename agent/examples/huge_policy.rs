//! How long one NetworkPolicy with very many `ipBlock.except` entries takes
//! to translate, and what the per-policy cap makes of it (the figures are
//! in `docs/benchmarks.md`, "A policy with 20 000 excepts").
//!
//! ```sh
//! cargo run --release -p oxvs-agent --example huge_policy
//! ```
//!
//! Cases: the excepts scattered over a /8 (one /32 in every 797 addresses:
//! ~200 000 prefixes, refused by the default cap) and contiguous (20 000
//! consecutive /32s in a /16: the rest is 7 prefixes, realised). For each:
//! `ipblock_prefixes` alone, and the whole translation of a cluster where
//! the policy selects one local pod (`policy_flows_limited` with the
//! default cap), best of 5. For comparison, the former recursive
//! decomposition (every step scanned every except) at 1 000 to 4 000
//! scattered excepts: it grows with the square.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use oxvs_agent::model::{
    ClusterState, LabelSelector, Namespace, NetworkPolicy, Node, Peer, Pod, Rule,
};
use oxvs_agent::policy::{self, prefix, LocalPod};

fn excepts(n: u32, scattered: bool) -> Vec<Ipv4Net> {
    (0..n)
        .map(|i| {
            let a = if scattered {
                0x0a00_0000 | (i * 797)
            } else {
                0xac10_0000 + i
            };
            Ipv4Net::new(Ipv4Addr::from(a), 32).expect("a /32")
        })
        .collect()
}

/// The former algorithm (quadratic), for comparison.
fn recursive(net: Ipv4Net, except: &[Ipv4Net], out: &mut Vec<Ipv4Net>) {
    if except.iter().any(|e| e.contains(&net)) {
        return;
    }
    if !except.iter().any(|e| net.contains(e)) {
        out.push(net);
        return;
    }
    for h in net.subnets(net.prefix_len() + 1).expect("not a /32") {
        recursive(h, except, out);
    }
}

fn best<T>(n: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..n {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        out = Some(r);
    }
    (best, out.expect("n > 0"))
}

fn cluster(cidr: Ipv4Net, except: Vec<Ipv4Net>) -> (ClusterState, Vec<LocalPod>) {
    let mut s = ClusterState::default();
    s.namespaces.insert(
        "test".into(),
        Namespace {
            name: "test".into(),
            labels: BTreeMap::new(),
        },
    );
    s.nodes.insert(
        "n1".into(),
        Node {
            name: "n1".into(),
            pod_cidr: Some("10.244.1.0/24".parse().expect("cidr")),
            internal_ip: Some(Ipv4Addr::new(192, 168, 77, 11)),
            internal_ip6: None,
            pod_cidr6: None,
        },
    );
    s.pods.insert(
        ("test".into(), "a".into()),
        Pod {
            namespace: "test".into(),
            name: "a".into(),
            uid: "uid-a".into(),
            labels: BTreeMap::new(),
            node_name: "n1".into(),
            ip: Some(Ipv4Addr::new(10, 244, 1, 2)),
            host_network: false,
            ports: vec![],
            ip6: None,
        },
    );
    s.policies.insert(
        ("test".into(), "big".into()),
        NetworkPolicy {
            namespace: "test".into(),
            name: "big".into(),
            uid: "uid-big".into(),
            pod_selector: LabelSelector::default(),
            ingress_isolation: true,
            egress_isolation: false,
            ingress: vec![Rule {
                peers: vec![Peer::IpBlock { cidr, except }],
                ports: vec![],
            }],
            egress: vec![],
        },
    );
    let local = vec![LocalPod {
        namespace: "test".into(),
        name: "a".into(),
        ip: Some(Ipv4Addr::new(10, 244, 1, 2)),
        ofport: 3,
        ip6: None,
    }];
    (s, local)
}

fn main() {
    println!(
        "case                      excepts  prefixes  prefixes_ms  translate_ms  flows  refused"
    );
    for (name, cidr, scattered) in [
        ("scattered in 10.0.0.0/8", "10.0.0.0/8", true),
        ("contiguous in 172.16/16", "172.16.0.0/16", false),
    ] {
        let cidr: Ipv4Net = cidr.parse().expect("cidr");
        let ex = excepts(20_000, scattered);
        let (t_prefix, p) = best(5, || prefix::ipblock_prefixes(cidr, &ex));
        let (state, local) = cluster(cidr, ex.clone());
        let addrs = policy::local_node_addresses(&state, &local);
        let (t_all, pf) = best(5, || {
            policy::policy_flows_limited(&state, &local, &addrs, policy::DEFAULT_MAX_POLICY_FLOWS)
        });
        println!(
            "{name:<25} {:>7}  {:>8}  {:>11.1}  {:>12.1}  {:>5}  {}",
            ex.len(),
            p.len(),
            t_prefix.as_secs_f64() * 1e3,
            t_all.as_secs_f64() * 1e3,
            pf.flows.len(),
            pf.refused
                .first()
                .map_or("no".to_string(), |r| format!("yes ({} flows)", r.flows))
        );
    }
    // The manifest source's share: parsing and converting the policy's
    // YAML (as `--manifests` reads it; the API source decodes JSON).
    let yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  namespace: test\n  name: huge\nspec:\n  podSelector: {{}}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - ipBlock:\n        cidr: 10.0.0.0/8\n        except: [{}]\n",
        excepts(20_000, true)
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (t_parse, parsed) = best(3, || oxvs_agent::source::parse_manifest(&yaml, false));
    let objects = parsed.map(|(o, _)| o.len()).unwrap_or(0);
    println!();
    println!(
        "manifest parse + convert of that policy ({} bytes, {objects} object): {:.1} ms",
        yaml.len(),
        t_parse.as_secs_f64() * 1e3
    );
    println!();
    println!("former recursive decomposition, scattered excepts in 10.0.0.0/8:");
    println!("excepts  prefixes  ms");
    for n in [1_000u32, 2_000, 4_000] {
        let ex = excepts(n, true);
        let (t, p) = best(1, || {
            let mut out = Vec::new();
            recursive("10.0.0.0/8".parse().expect("cidr"), &ex, &mut out);
            out
        });
        println!("{n:>7}  {:>8}  {:.1}", p.len(), t.as_secs_f64() * 1e3);
    }
}
