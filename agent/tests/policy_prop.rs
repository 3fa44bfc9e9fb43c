//! THE policy property: for random small clusters and policies (every
//! feature: selectors with every operator, empty and absent selectors,
//! ipBlocks with exceptions, numbered, named, ranged and protocol-only ports
//! over TCP/UDP/SCTP, several policies, both directions), the first packet
//! of a random connection traced through the real node pipeline is
//! delivered exactly when the reference interpreter allows it, and a reply
//! of any connection always passes.

mod policy_support;

use oxvs_agent::model::*;
use oxvs_agent::policy::{self, Endpoint, L4};
use policy_support::*;
use proptest::prelude::*;

const NAMED: &[(&str, u16, Protocol)] = &[
    ("http", 80, Protocol::Tcp),
    ("http", 8080, Protocol::Tcp),
    ("dns", 53, Protocol::Udp),
    ("sig", 3868, Protocol::Sctp),
    ("http", 53, Protocol::Udp),
];
const PORTS: &[u16] = &[1, 53, 80, 81, 85, 3868, 8080, 8050];
const EXTERNAL: &[&str] = &[
    "8.8.8.8",
    "192.168.1.7",
    "192.168.200.1",
    "10.244.1.200",
    "10.244.0.200",
];
const CIDRS: &[&str] = &[
    "0.0.0.0/0",
    "10.244.0.0/16",
    "10.244.0.0/24",
    "10.244.1.0/24",
    "10.244.0.8/29",
    "192.168.0.0/16",
    "8.8.8.8/32",
];
const EXCEPTS: &[&str] = &[
    "10.244.0.12/30",
    "10.244.0.10/32",
    "192.168.1.0/24",
    "10.244.1.0/25",
    "8.8.8.8/32",
    "10.244.0.0/28",
];

fn labels_s(keys: &'static [&'static str]) -> impl Strategy<Value = Labels> {
    prop::collection::vec(
        (
            prop::sample::select(keys),
            prop::sample::select(&["x", "y"][..]),
        ),
        0..3,
    )
    .prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

fn selector_s(keys: &'static [&'static str]) -> impl Strategy<Value = LabelSelector> {
    let req = (
        prop::sample::select(keys),
        prop::sample::select(
            &[
                SelectorOp::In,
                SelectorOp::NotIn,
                SelectorOp::Exists,
                SelectorOp::DoesNotExist,
            ][..],
        ),
        prop::collection::vec(prop::sample::select(&["x", "y"][..]), 1..3),
    )
        .prop_map(|(k, op, vals)| Requirement {
            key: k.into(),
            op,
            values: match op {
                SelectorOp::In | SelectorOp::NotIn => vals.into_iter().map(String::from).collect(),
                _ => vec![],
            },
        });
    (labels_s(keys), prop::collection::vec(req, 0..2)).prop_map(
        |(match_labels, match_expressions)| LabelSelector {
            match_labels: if match_labels.len() > 1 {
                match_labels.into_iter().take(1).collect()
            } else {
                match_labels
            },
            match_expressions,
        },
    )
}

fn peer_s() -> impl Strategy<Value = Peer> {
    prop_oneof![
        3 => (
            prop::option::of(selector_s(&["team", "env"])),
            prop::option::of(selector_s(&["app", "tier"]))
        )
            .prop_map(|(n, p)| pods_peer(n, p)),
        1 => (
            prop::sample::select(CIDRS),
            prop::collection::vec(prop::sample::select(EXCEPTS), 0..3)
        )
            .prop_map(|(c, ex)| Peer::IpBlock {
                cidr: c.parse().unwrap(),
                except: ex.into_iter().map(|e| e.parse().unwrap()).collect(),
            }),
    ]
}

fn proto_s() -> impl Strategy<Value = Protocol> {
    prop::sample::select(&[Protocol::Tcp, Protocol::Tcp, Protocol::Udp, Protocol::Sctp][..])
}

fn port_s() -> impl Strategy<Value = PolicyPort> {
    let num = prop::sample::select(PORTS);
    prop_oneof![
        proto_s().prop_map(|protocol| PolicyPort {
            protocol,
            port: None,
            end_port: None
        }),
        (proto_s(), num.clone()).prop_map(|(protocol, p)| PolicyPort {
            protocol,
            port: Some(PortRef::Number(p)),
            end_port: None
        }),
        (proto_s(), num, 0u16..9000).prop_map(|(protocol, p, w)| PolicyPort {
            protocol,
            port: Some(PortRef::Number(p)),
            end_port: Some(p.saturating_add(w)),
        }),
        (
            proto_s(),
            prop::sample::select(&["http", "http", "dns", "sig", "none"][..])
        )
            .prop_map(|(protocol, n)| {
                PolicyPort {
                    protocol,
                    port: Some(PortRef::Name(n.into())),
                    end_port: None,
                }
            }),
    ]
}

fn rule_s() -> impl Strategy<Value = Rule> {
    (
        prop::collection::vec(peer_s(), 0..3),
        prop::collection::vec(port_s(), 0..3),
    )
        .prop_map(|(peers, ports)| Rule { peers, ports })
}

#[derive(Clone, Debug)]
struct PodPlan {
    ns: usize,
    labels: Labels,
    local: bool,
    has_ip: bool,
    named: Vec<usize>,
}

fn pod_plan_s() -> impl Strategy<Value = PodPlan> {
    (
        0usize..3,
        labels_s(&["app", "tier"]),
        prop::bool::weighted(0.75),
        prop::bool::weighted(0.95),
        prop::collection::vec(0..NAMED.len(), 0..3),
    )
        .prop_map(|(ns, labels, local, has_ip, named)| PodPlan {
            ns,
            labels,
            local,
            has_ip,
            named,
        })
}

fn policy_s() -> impl Strategy<Value = (usize, LabelSelector, bool, bool, Vec<Rule>, Vec<Rule>)> {
    (
        0usize..3,
        prop_oneof![Just(LabelSelector::default()), selector_s(&["app", "tier"])],
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(rule_s(), 0..3),
        prop::collection::vec(rule_s(), 0..3),
    )
}

fn cluster_s() -> impl Strategy<Value = ClusterState> {
    (
        2usize..=3,
        prop::collection::vec(labels_s(&["team", "env"]), 3),
        prop::collection::vec(pod_plan_s(), 3..=6),
        prop::collection::vec(policy_s(), 0..=4),
    )
        .prop_map(|(n_ns, ns_labels, pods, policies)| {
            let mut s = ClusterState::default();
            add_nodes(&mut s);
            for (i, l) in ns_labels.into_iter().take(n_ns).enumerate() {
                let name = format!("ns{i}");
                s.namespaces
                    .insert(name.clone(), Namespace { name, labels: l });
            }
            for (i, p) in pods.into_iter().enumerate() {
                let ns = format!("ns{}", p.ns % n_ns);
                let ip = if p.local {
                    format!("10.244.0.{}", 10 + i)
                } else {
                    format!("10.244.1.{}", 10 + i)
                };
                let mut ports: Vec<ContainerPort> = Vec::new();
                for k in p.named {
                    let (n, port, protocol) = NAMED[k];
                    // A pod names a port once per protocol.
                    if ports
                        .iter()
                        .all(|c| !(c.name.as_deref() == Some(n) && c.protocol == protocol))
                    {
                        ports.push(ContainerPort {
                            name: Some(n.into()),
                            port,
                            protocol,
                        });
                    }
                }
                let pod = Pod {
                    namespace: ns.clone(),
                    name: format!("pod{i}"),
                    uid: format!("uid-pod{i}"),
                    labels: p.labels,
                    node_name: if p.local { "n1" } else { "n2" }.into(),
                    ip: (p.has_ip || p.local).then(|| ip.parse().unwrap()),
                    host_network: false,
                    ports,
                    ip6: None,
                };
                s.pods.insert(pod.key(), pod);
            }
            for (i, (ns, selector, ing, eg, ingress, egress)) in policies.into_iter().enumerate() {
                let mut p = policy(&format!("ns{}", ns % n_ns), &format!("np{i}"), selector);
                // policyTypes after defaulting: Ingress always unless
                // egress-only; Egress if asked or egress rules exist.
                p.ingress_isolation = ing || !eg;
                p.egress_isolation = eg || (!egress.is_empty() && ing);
                p.ingress = ingress;
                p.egress = egress;
                add_policy(&mut s, p);
            }
            s
        })
}

fn endpoints(state: &ClusterState) -> Vec<Endpoint> {
    let mut v: Vec<Endpoint> = state
        .pods
        .values()
        .filter(|p| p.ip.is_some())
        .map(|p| Endpoint::Pod(p.key()))
        .collect();
    v.extend(
        EXTERNAL
            .iter()
            .map(|e| Endpoint::External(e.parse().unwrap())),
    );
    v
}

fn l4_of(proto: usize, port: u16) -> L4 {
    match proto {
        0 | 1 => L4::Port(Protocol::Tcp, port),
        2 => L4::Port(Protocol::Udp, port),
        3 => L4::Port(Protocol::Sctp, port),
        _ => L4::Other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn pipeline_agrees_with_the_interpreter(
        state in cluster_s(),
        packets in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0usize..5, prop::sample::select(PORTS)), 96),
    ) {
        let n = NodePipe::new(state);
        let eps = endpoints(&n.state);
        let mut tried = 0;
        for (si, di, proto, port) in packets {
            let (src, dst) = (si.get(&eps), di.get(&eps));
            if src == dst || (!n.is_local(src) && !n.is_local(dst)) {
                continue;
            }
            tried += 1;
            let l4 = l4_of(proto, port);
            let expect = n.expected(src, dst, l4);
            let (got, tr) = n.new_conn(src, dst, l4); if !expect { eprintln!("DENY"); } else if tr.contains("REG3[]") || tr.contains("REG5[]") { eprintln!("RULEALLOW"); }
            prop_assert_eq!(got, expect, "{:?} -> {:?} {:?}\nstate: {:#?}\nflows:\n{}\n{}",
                src, dst, l4, n.state, n.pf.flows.join("\n"), tr);
            // With every pod concerned local, the node's part is the whole.
            let remote = |e: &Endpoint| matches!(e, Endpoint::Pod(_)) && !n.is_local(e);
            if !remote(src) && !remote(dst) {
                prop_assert_eq!(policy::allowed_l4(&n.state, src, dst, l4), expect);
            }
            let (rep, tr) = n.reply(src, dst, l4);
            prop_assert!(rep, "reply {:?} -> {:?} {:?} dropped\n{}", dst, src, l4, tr);
        }
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        static T: AtomicUsize = AtomicUsize::new(0); static A: AtomicUsize = AtomicUsize::new(0); static F: AtomicUsize = AtomicUsize::new(0);
        T.fetch_add(tried, Relaxed); F.fetch_add(n.pf.flows.len(), Relaxed);
        A.fetch_add(0, Relaxed);
        eprintln!("tried {} flows {} rules {}", T.load(Relaxed), F.load(Relaxed), n.pf.rules.len());
    }

    #[test]
    fn flows_are_deterministic(state in cluster_s()) {
        let local = local_pods(&state);
        let a = policy::policy_flows(&state, &local);
        let b = policy::policy_flows(&state.clone(), &local);
        prop_assert_eq!(&a, &b);
        let mut sorted = a.flows.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), a.flows.len());
    }
}
