//! NetworkPolicy translation, feature by feature: every scenario is traced
//! through the real node pipeline (node + pod + policy flows) and checked
//! against the expectation written here and against the reference
//! interpreter.

mod policy_support;

use std::collections::BTreeSet;

use oxvs_agent::cookie;
use oxvs_agent::model::*;
use oxvs_agent::policy::{self, allowed, policy_flows, Direction, Endpoint, LocalPod, L4};
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use policy_support::*;

fn ep(ns: &str, name: &str) -> Endpoint {
    Endpoint::Pod((ns.into(), name.into()))
}

fn ext(ip: &str) -> Endpoint {
    Endpoint::External(ip.parse().unwrap())
}

/// Checks that the pipeline delivers the first packet exactly when
/// `expect`, that the interpreter agrees, and that replies always pass.
#[track_caller]
fn check(n: &NodePipe, src: &Endpoint, dst: &Endpoint, l4: L4, expect: bool) {
    let (got, tr) = n.new_conn(src, dst, l4);
    assert_eq!(
        got,
        expect,
        "{src:?} -> {dst:?} {l4:?}: pipeline\n{}\n{tr}",
        n.pf.flows.join("\n")
    );
    assert_eq!(
        n.expected(src, dst, l4),
        expect,
        "{src:?} -> {dst:?} {l4:?}: interpreter (this node's part)"
    );
    let remote = |e: &Endpoint| matches!(e, Endpoint::Pod(_)) && !n.is_local(e);
    if !remote(src) && !remote(dst) {
        assert_eq!(
            policy::allowed_l4(&n.state, src, dst, l4),
            expect,
            "{src:?} -> {dst:?} {l4:?}: interpreter"
        );
    }
    let (rep, tr) = n.reply(src, dst, l4);
    assert!(rep, "reply of {src:?} -> {dst:?} dropped\n{tr}");
}

fn t(port: u16) -> L4 {
    L4::Port(Protocol::Tcp, port)
}

/// Namespaces a (team=a), b (team=b); pods: a/web (app=web, http=8080),
/// a/client (app=client), b/client (app=client), b/other (app=other),
/// a/remote on another node (app=client).
fn base() -> ClusterState {
    let mut s = ClusterState::default();
    add_nodes(&mut s);
    ns(&mut s, "a", &[("team", "a")]);
    ns(&mut s, "b", &[("team", "b")]);
    pod(
        &mut s,
        "a",
        "web",
        "n1",
        "10.244.0.10",
        &[("app", "web")],
        &[("http", 8080, Protocol::Tcp)],
    );
    pod(
        &mut s,
        "a",
        "client",
        "n1",
        "10.244.0.11",
        &[("app", "client")],
        &[],
    );
    pod(
        &mut s,
        "b",
        "client",
        "n1",
        "10.244.0.12",
        &[("app", "client")],
        &[],
    );
    pod(
        &mut s,
        "b",
        "other",
        "n1",
        "10.244.0.13",
        &[("app", "other")],
        &[],
    );
    pod(
        &mut s,
        "a",
        "remote",
        "n2",
        "10.244.1.5",
        &[("app", "client")],
        &[],
    );
    s
}

fn ingress_policy(name: &str, target: &[(&str, &str)], rules: Vec<Rule>) -> NetworkPolicy {
    let mut p = policy("a", name, sel(target));
    p.ingress_isolation = true;
    p.ingress = rules;
    p
}

#[test]
fn no_policy_everything_open() {
    let n = NodePipe::new(base());
    assert!(n.pf.flows.is_empty());
    check(&n, &ep("b", "other"), &ep("a", "web"), t(1), true);
    check(&n, &ext("8.8.8.8"), &ep("a", "web"), L4::Other, true);
    check(
        &n,
        &ep("a", "web"),
        &ext("8.8.8.8"),
        L4::Port(Protocol::Udp, 53),
        true,
    );
}

#[test]
fn pod_selector_peer_defaults_to_own_namespace() {
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "web",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
                ports: vec![tcp(80)],
            }],
        ),
    );
    let n = NodePipe::new(s);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(80), true);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(81), false);
    check(
        &n,
        &ep("a", "client"),
        &ep("a", "web"),
        L4::Port(Protocol::Udp, 80),
        false,
    );
    check(&n, &ep("a", "client"), &ep("a", "web"), L4::Other, false);
    check(&n, &ep("b", "client"), &ep("a", "web"), t(80), false);
    check(&n, &ep("a", "remote"), &ep("a", "web"), t(80), true);
    check(&n, &ext("10.244.1.99"), &ep("a", "web"), t(80), false);
    // Not selected: open; isolated only for ingress: egress open.
    check(&n, &ep("b", "other"), &ep("a", "client"), t(1), true);
    check(&n, &ep("a", "web"), &ext("1.1.1.1"), t(443), true);
}

#[test]
fn namespace_and_pod_selectors_and_or() {
    // One peer with both selectors (AND) ...
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "and",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(
                    Some(sel(&[("team", "b")])),
                    Some(sel(&[("app", "client")])),
                )],
                ports: vec![],
            }],
        ),
    );
    let n = NodePipe::new(s.clone());
    check(&n, &ep("b", "client"), &ep("a", "web"), t(80), true);
    check(&n, &ep("b", "other"), &ep("a", "web"), t(80), false);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(80), false);
    // ... versus two peers (OR).
    s.policies.clear();
    add_policy(
        &mut s,
        ingress_policy(
            "or",
            &[("app", "web")],
            vec![Rule {
                peers: vec![
                    pods_peer(Some(sel(&[("team", "b")])), None),
                    pods_peer(None, Some(sel(&[("app", "client")]))),
                ],
                ports: vec![],
            }],
        ),
    );
    let n = NodePipe::new(s);
    check(&n, &ep("b", "client"), &ep("a", "web"), t(80), true);
    check(&n, &ep("b", "other"), &ep("a", "web"), t(80), true);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(80), true);
    check(&n, &ep("a", "remote"), &ep("a", "web"), L4::Other, true);
    check(&n, &ext("8.8.8.8"), &ep("a", "web"), t(80), false);
}

#[test]
fn empty_selectors() {
    let mut s = base();
    // Empty namespace selector: every namespace; empty pod selector: every
    // pod of the policy's namespace (the target).
    let mut p = policy("a", "all-ns", LabelSelector::default());
    p.ingress_isolation = true;
    p.ingress = vec![Rule {
        peers: vec![pods_peer(Some(LabelSelector::default()), None)],
        ports: vec![],
    }];
    add_policy(&mut s, p);
    let n = NodePipe::new(s.clone());
    check(&n, &ep("b", "other"), &ep("a", "web"), t(80), true);
    check(&n, &ep("b", "other"), &ep("a", "client"), t(80), true);
    check(&n, &ext("8.8.8.8"), &ep("a", "client"), t(80), false);
    // Deny all ingress (no rules) in namespace a.
    s.policies.clear();
    let mut p = policy("a", "deny", LabelSelector::default());
    p.ingress_isolation = true;
    add_policy(&mut s, p);
    let n = NodePipe::new(s.clone());
    check(&n, &ep("a", "client"), &ep("a", "web"), t(80), false);
    check(&n, &ep("b", "other"), &ep("a", "client"), L4::Other, false);
    check(&n, &ep("a", "client"), &ep("b", "other"), t(80), true);
    // Allow all: one rule without peers and ports.
    s.policies.clear();
    let mut p = policy("a", "allow", LabelSelector::default());
    p.ingress_isolation = true;
    p.ingress = vec![Rule::default()];
    add_policy(&mut s, p);
    let n = NodePipe::new(s);
    check(&n, &ext("8.8.8.8"), &ep("a", "web"), L4::Other, true);
    assert!(
        n.pf.flows.iter().all(|l| !l.contains("conjunction")),
        "a one-dimension rule is plain flows: {:#?}",
        n.pf.flows
    );
}

#[test]
fn ipblock_with_except() {
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "cidr",
            &[("app", "web")],
            vec![Rule {
                peers: vec![Peer::IpBlock {
                    cidr: "192.168.0.0/16".parse().unwrap(),
                    except: vec![
                        "192.168.1.0/24".parse().unwrap(),
                        "192.168.2.128/25".parse().unwrap(),
                    ],
                }],
                ports: vec![tcp(80)],
            }],
        ),
    );
    let n = NodePipe::new(s);
    for (ip, ok) in [
        ("192.168.0.1", true),
        ("192.168.1.1", false),
        ("192.168.1.255", false),
        ("192.168.2.127", true),
        ("192.168.2.128", false),
        ("192.168.255.255", true),
        ("192.169.0.1", false),
    ] {
        check(&n, &ext(ip), &ep("a", "web"), t(80), ok);
    }
    // The peer dimension is disjoint prefixes.
    let srcs: Vec<&String> =
        n.pf.flows
            .iter()
            .filter(|l| l.contains("nw_src=") && l.contains("conjunction"))
            .collect();
    // 192.168.0.0/16 minus 1.0/24 and 2.128/25: 128/17 64/18 32/19 16/20
    // 8/21 4/22 3.0/24 0.0/24 2.0/25.
    assert_eq!(srcs.len(), 9, "{srcs:#?}");
}

#[test]
fn named_ports_resolve_per_destination_pod() {
    let mut s = base();
    pod(
        &mut s,
        "a",
        "web2",
        "n1",
        "10.244.0.20",
        &[("app", "web")],
        &[("http", 9090, Protocol::Tcp)],
    );
    pod(
        &mut s,
        "a",
        "web3",
        "n1",
        "10.244.0.21",
        &[("app", "web")],
        &[],
    );
    pod(
        &mut s,
        "b",
        "api",
        "n2",
        "10.244.1.20",
        &[("app", "api")],
        &[("http", 7070, Protocol::Tcp), ("dns", 5353, Protocol::Udp)],
    );
    let named = |n: &str, p: Protocol| PolicyPort {
        protocol: p,
        port: Some(PortRef::Name(n.into())),
        end_port: None,
    };
    let mut p = ingress_policy(
        "named",
        &[("app", "web")],
        vec![Rule {
            peers: vec![],
            ports: vec![named("http", Protocol::Tcp)],
        }],
    );
    // Egress of a/client: named ports on the destination pods.
    let mut e = policy("a", "egress", sel(&[("app", "client")]));
    e.egress_isolation = true;
    e.egress = vec![
        Rule {
            peers: vec![pods_peer(Some(LabelSelector::default()), None)],
            ports: vec![named("http", Protocol::Tcp), named("dns", Protocol::Udp)],
        },
        // Named port with pods and an ipBlock: only the pods resolve it.
        Rule {
            peers: vec![
                pods_peer(Some(LabelSelector::default()), Some(sel(&[("app", "api")]))),
                Peer::IpBlock {
                    cidr: "8.8.4.0/24".parse().unwrap(),
                    except: vec![],
                },
            ],
            ports: vec![named("http", Protocol::Tcp)],
        },
        // Named port to an ipBlock: nothing.
        Rule {
            peers: vec![Peer::IpBlock {
                cidr: "0.0.0.0/0".parse().unwrap(),
                except: vec![],
            }],
            ports: vec![named("https", Protocol::Tcp)],
        },
    ];
    p.egress = vec![];
    add_policy(&mut s, p);
    add_policy(&mut s, e);
    let n = NodePipe::new(s);
    check(&n, &ext("8.8.8.8"), &ep("a", "web"), t(8080), true);
    check(&n, &ext("8.8.8.8"), &ep("a", "web"), t(9090), false);
    check(&n, &ext("8.8.8.8"), &ep("a", "web2"), t(9090), true);
    check(&n, &ext("8.8.8.8"), &ep("a", "web2"), t(8080), false);
    check(&n, &ext("8.8.8.8"), &ep("a", "web3"), t(8080), false);
    check(&n, &ep("a", "client"), &ep("b", "api"), t(7070), true);
    check(
        &n,
        &ep("a", "client"),
        &ep("b", "api"),
        L4::Port(Protocol::Udp, 5353),
        true,
    );
    check(&n, &ep("a", "client"), &ep("b", "api"), t(5353), false);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(8080), true);
    check(&n, &ep("a", "client"), &ep("a", "web2"), t(8080), false);
    check(&n, &ep("a", "client"), &ext("8.8.8.8"), t(443), false);
    check(&n, &ep("a", "client"), &ext("8.8.8.8"), t(8080), false);
    check(&n, &ep("a", "client"), &ext("8.8.4.4"), t(7070), false);
}

#[test]
fn end_port_ranges_are_masks() {
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "range",
            &[("app", "web")],
            vec![Rule {
                peers: vec![],
                ports: vec![PolicyPort {
                    protocol: Protocol::Tcp,
                    port: Some(PortRef::Number(8000)),
                    end_port: Some(8100),
                }],
            }],
        ),
    );
    let n = NodePipe::new(s);
    let masks: Vec<&String> =
        n.pf.flows
            .iter()
            .filter(|l| l.contains("tp_dst="))
            .collect();
    assert!(
        masks.iter().any(|l| l.contains("tp_dst=0x1f40/0xffc0")),
        "{masks:#?}"
    );
    assert_eq!(masks.len(), policy::prefix::port_masks(8000, 8100).len());
    for (port, ok) in [
        (7999, false),
        (8000, true),
        (8063, true),
        (8064, true),
        (8100, true),
        (8101, false),
    ] {
        check(&n, &ext("8.8.8.8"), &ep("a", "web"), t(port), ok);
    }
}

#[test]
fn sctp_and_protocol_only_ports() {
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "sctp",
            &[("app", "web")],
            vec![Rule {
                peers: vec![],
                ports: vec![
                    PolicyPort {
                        protocol: Protocol::Sctp,
                        port: Some(PortRef::Number(3868)),
                        end_port: None,
                    },
                    PolicyPort {
                        protocol: Protocol::Udp,
                        port: None,
                        end_port: None,
                    },
                ],
            }],
        ),
    );
    let n = NodePipe::new(s);
    assert!(n.pf.flows.iter().any(|l| l.contains("sctp, tp_dst=3868")));
    check(
        &n,
        &ext("8.8.8.8"),
        &ep("a", "web"),
        L4::Port(Protocol::Sctp, 3868),
        true,
    );
    check(
        &n,
        &ext("8.8.8.8"),
        &ep("a", "web"),
        L4::Port(Protocol::Sctp, 3869),
        false,
    );
    check(&n, &ext("8.8.8.8"), &ep("a", "web"), t(3868), false);
    check(
        &n,
        &ext("8.8.8.8"),
        &ep("a", "web"),
        L4::Port(Protocol::Udp, 1),
        true,
    );
    check(
        &n,
        &ext("8.8.8.8"),
        &ep("a", "web"),
        L4::Port(Protocol::Udp, 65535),
        true,
    );
}

#[test]
fn policies_union_and_isolation_per_direction() {
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "p1",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
                ports: vec![tcp(80)],
            }],
        ),
    );
    add_policy(
        &mut s,
        ingress_policy(
            "p2",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(Some(sel(&[("team", "b")])), None)],
                ports: vec![tcp(443)],
            }],
        ),
    );
    // Egress only, for the clients of namespace a: DNS anywhere.
    let mut e = policy("a", "dns", sel(&[("app", "client")]));
    e.egress_isolation = true;
    e.egress = vec![Rule {
        peers: vec![],
        ports: vec![PolicyPort {
            protocol: Protocol::Udp,
            port: Some(PortRef::Number(53)),
            end_port: None,
        }],
    }];
    add_policy(&mut s, e);
    let n = NodePipe::new(s);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(80), false); // client egress: only DNS
    check(&n, &ep("a", "remote"), &ep("a", "web"), t(80), true);
    check(&n, &ep("a", "remote"), &ep("a", "web"), t(443), false);
    check(&n, &ep("b", "other"), &ep("a", "web"), t(443), true);
    check(&n, &ep("b", "other"), &ep("a", "web"), t(80), false);
    check(
        &n,
        &ep("a", "client"),
        &ext("8.8.8.8"),
        L4::Port(Protocol::Udp, 53),
        true,
    );
    check(&n, &ep("a", "client"), &ext("8.8.8.8"), L4::Other, false);
    // Web is isolated for ingress only: egress open; client for egress only.
    check(&n, &ep("a", "web"), &ep("b", "other"), t(1), true);
    check(&n, &ep("b", "other"), &ep("a", "client"), t(1), true);
    let drops: Vec<&String> =
        n.pf.flows
            .iter()
            .filter(|l| l.ends_with("actions=drop"))
            .collect();
    assert_eq!(drops.len(), 2, "{drops:#?}");
    assert!(drops
        .iter()
        .any(|l| l.starts_with("table=IngressDefaultRule") && l.contains("nw_dst=10.244.0.10")));
    assert!(drops
        .iter()
        .any(|l| l.starts_with("table=EgressDefaultRule") && l.contains("nw_src=10.244.0.11")));
}

#[test]
fn local_pod_without_pod_object_is_not_selected() {
    let mut s = base();
    let mut p = policy("a", "deny", LabelSelector::default());
    p.ingress_isolation = true;
    add_policy(&mut s, p);
    let mut local = local_pods(&s);
    local.push(LocalPod {
        namespace: "a".into(),
        name: "ghost".into(),
        ip: Some("10.244.0.99".parse().unwrap()),
        ofport: 99,
        ip6: None,
    });
    let pf = policy_flows(&s, &local);
    assert!(
        pf.flows.iter().all(|l| !l.contains("10.244.0.99")),
        "{:#?}",
        pf.flows
    );
    assert!(pf.flows.iter().any(|l| l.contains("10.244.0.10")));
}

#[test]
fn output_is_deterministic_and_ids_are_stable() {
    let mut s = base();
    for i in 0..5 {
        add_policy(
            &mut s,
            ingress_policy(
                &format!("p{i}"),
                &[("app", "web")],
                vec![
                    Rule {
                        peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
                        ports: vec![tcp(80 + i)],
                    },
                    Rule {
                        peers: vec![],
                        ports: vec![tcp(1000)],
                    },
                ],
            ),
        );
    }
    let local = local_pods(&s);
    let a = policy_flows(&s, &local);
    let mut rev = local.clone();
    rev.reverse();
    let b = policy_flows(&s.clone(), &rev);
    assert_eq!(a, b);
    let mut sorted = a.flows.clone();
    sorted.sort();
    let mut dedup = sorted.clone();
    dedup.dedup();
    assert_eq!(sorted, dedup, "duplicate lines");
    // Ids: a function of (uid, direction, index), never 0, distinct.
    let ids: BTreeSet<u32> = a.rules.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 10);
    assert!(!ids.contains(&0));
    for r in &a.rules {
        assert_eq!(r.id, policy::ids::rule_hash(&r.uid, r.direction, r.index));
    }
    // Adding an unrelated policy elsewhere changes no id.
    let mut s2 = s.clone();
    add_policy(
        &mut s2,
        ingress_policy("zzz", &[("app", "nothing")], vec![Rule::default()]),
    );
    let c = policy_flows(&s2, &local);
    assert_eq!(a, c);
    // The rules name what they stand for.
    assert!(a
        .rules
        .iter()
        .all(|r| r.direction == Direction::Ingress && r.policy.0 == "a"));
}

#[test]
fn colliding_ids_are_resolved_in_sorted_order() {
    // Same uid twice (invalid, but it forces a collision).
    let mut s = base();
    let mut p1 = ingress_policy("x1", &[("app", "web")], vec![Rule::default()]);
    let mut p2 = ingress_policy("x2", &[("app", "web")], vec![Rule::default()]);
    p1.uid = "same".into();
    p2.uid = "same".into();
    add_policy(&mut s, p1);
    add_policy(&mut s, p2);
    let ids = policy::ids::assign(&s);
    let h = policy::ids::rule_hash("same", Direction::Ingress, 0);
    let k1 = (("a".to_string(), "x1".to_string()), Direction::Ingress, 0);
    let k2 = (("a".to_string(), "x2".to_string()), Direction::Ingress, 0);
    assert_eq!(ids[&k1].id, h);
    assert_eq!(ids[&k2].id, h.wrapping_add(1).max(1));
}

#[test]
fn shared_clauses_are_one_flow_with_several_conjunctions() {
    let mut s = base();
    for name in ["p1", "p2"] {
        add_policy(
            &mut s,
            ingress_policy(
                name,
                &[("app", "web")],
                vec![Rule {
                    peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
                    ports: vec![tcp(if name == "p1" { 80 } else { 81 })],
                }],
            ),
        );
    }
    let n = NodePipe::new(s);
    let to_web: Vec<&String> =
        n.pf.flows
            .iter()
            .filter(|l| l.contains("nw_dst=10.244.0.10") && l.contains("conjunction"))
            .collect();
    assert_eq!(to_web.len(), 1, "{to_web:#?}");
    assert_eq!(to_web[0].matches("conjunction(").count(), 2);
    let from_client: Vec<&String> =
        n.pf.flows
            .iter()
            .filter(|l| l.contains("nw_src=10.244.0.11"))
            .collect();
    assert_eq!(from_client.len(), 1, "{from_client:#?}");
    // No two flows share table, priority and match.
    let flows = parse_flow_file(&n.pf.flows.join("\n"), &ParseContext::default()).unwrap();
    let keys: BTreeSet<String> = flows
        .iter()
        .map(|f| format!("{} {} {:?}", f.table, f.priority, f.matches))
        .collect();
    assert_eq!(keys.len(), flows.len());
    check(&n, &ep("a", "client"), &ep("a", "web"), t(80), true);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(81), true);
    check(&n, &ep("a", "client"), &ep("a", "web"), t(82), false);
}

#[test]
fn flow_count_is_a_sum_not_a_product() {
    let mut s = ClusterState::default();
    ns(&mut s, "a", &[]);
    for i in 0..10u8 {
        pod(
            &mut s,
            "a",
            &format!("web{i}"),
            "n1",
            &format!("10.244.0.{}", 10 + i),
            &[("app", "web")],
            &[],
        );
        pod(
            &mut s,
            "a",
            &format!("cl{i}"),
            "n2",
            &format!("10.244.1.{}", 10 + i),
            &[("app", "client")],
            &[],
        );
    }
    add_policy(
        &mut s,
        ingress_policy(
            "big",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
                ports: (0..5).map(|i| tcp(80 + i)).collect(),
            }],
        ),
    );
    let n = NodePipe::new(s);
    // 10 sources + 10 destinations + 5 services + conj_id + metric; 10 drops.
    assert_eq!(
        n.pf.flows.len(),
        10 + 10 + 5 + 1 + 1 + 10,
        "{:#?}",
        n.pf.flows
    );
    check(&n, &ep("a", "cl3"), &ep("a", "web7"), t(84), true);
    check(&n, &ep("a", "cl3"), &ep("a", "web7"), t(85), false);
}

#[test]
fn cookies_name_rules_and_pods() {
    let mut s = base();
    add_policy(
        &mut s,
        ingress_policy(
            "web",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(None, None)],
                ports: vec![tcp(80)],
            }],
        ),
    );
    let n = NodePipe::new(s);
    let flows = parse_flow_file(&n.pf.flows.join("\n"), &ParseContext::default()).unwrap();
    let id = n.pf.rules[0].id;
    let web_port = n.local.iter().find(|l| l.name == "web").unwrap().ofport;
    assert_eq!(n.pf.rules.len(), 1);
    for f in &flows {
        match cookie::rule_id(f.cookie) {
            Some(x) => assert_eq!(x, id),
            None if f.cookie == cookie::NODE_EXEMPTION => {}
            None => assert_eq!(cookie::isolation_port(f.cookie), Some(web_port), "{f:?}"),
        }
    }
    let metric = format!(
        "table=IngressMetric, priority=200, cookie={:#x}, ip, reg3={id:#x}, actions=goto_table:80",
        cookie::rule(id)
    );
    assert!(n.pf.flows.contains(&metric), "{:#?}", n.pf.flows);
}

#[test]
fn traffic_with_the_own_node_is_always_allowed() {
    let mut s = base();
    let mut p = policy("a", "deny-all", LabelSelector::default());
    p.ingress_isolation = true;
    p.egress_isolation = true;
    add_policy(&mut s, p);
    let n = NodePipe::new(s);
    for node_ip in ["10.244.0.1", "192.168.77.11"] {
        check(&n, &ext(node_ip), &ep("a", "web"), t(8080), true);
        check(&n, &ep("a", "web"), &ext(node_ip), t(10250), true);
    }
    // The node's addresses as the source of a packet from the tunnel are
    // not the node (only the gateway port is): policy applies.
    for node_ip in ["10.244.0.1", "192.168.77.11"] {
        let web = n.ip_of(&ep("a", "web"));
        let spec = n.spec_from(node_ip.parse().unwrap(), web, t(8080), 40000, true);
        let (out, trace) = n.delivered(
            &spec,
            web,
            oxvs_pipeline::field::ct_state::TRK | oxvs_pipeline::field::ct_state::NEW,
        );
        assert!(
            !out,
            "a tunnel packet from {node_ip} passed as the node\n{trace}"
        );
        // ... while the same packet from a pod address of the remote node
        // reaches the policy's drop, not the Classifier's: the tunnel
        // itself is open to the known node.
        assert!(trace.contains("IngressDefaultRule"), "{trace}");
    }
    // Not the other node, nor the pods of this node's other namespaces.
    check(&n, &ext("192.168.77.12"), &ep("a", "web"), t(8080), false);
    check(&n, &ext("10.244.1.1"), &ep("a", "web"), t(8080), false);
    check(&n, &ep("b", "other"), &ep("a", "web"), t(8080), false);
    check(&n, &ep("a", "web"), &ep("b", "other"), t(8080), false);
    let ex: Vec<&String> =
        n.pf.flows
            .iter()
            .filter(|l| l.contains(&format!("cookie={:#x},", cookie::NODE_EXEMPTION)))
            .collect();
    assert_eq!(ex.len(), 4, "{ex:#?}");
}

#[test]
fn interpreter_basics() {
    let mut s = base();
    let mut e = policy("b", "deny-egress", LabelSelector::default());
    e.egress_isolation = true;
    add_policy(&mut s, e);
    assert!(!allowed(
        &s,
        ep("b", "other"),
        ep("a", "web"),
        Protocol::Tcp,
        80
    ));
    assert!(allowed(
        &s,
        ep("a", "client"),
        ep("b", "other"),
        Protocol::Tcp,
        80
    ));
    assert!(!allowed(
        &s,
        ep("a", "nope"),
        ep("b", "other"),
        Protocol::Tcp,
        80
    ));
}

/// One policy may add at most a cap of flows on a node: over it, the
/// policy is refused (named, with its count), none of its rule flows is
/// installed, the pods it selects stay isolated (so what it would allow is
/// dropped: fail closed), and other policies are untouched. At exactly
/// the cap it is realised.
#[test]
fn a_policy_over_the_cap_is_refused_and_fails_closed() {
    let mut s = base();
    let scattered: Vec<ipnet::Ipv4Net> = (0..100u32)
        .map(|i| ipnet::Ipv4Net::new((0x0a00_0000 | (i * 40_009)).into(), 32).unwrap())
        .collect();
    add_policy(
        &mut s,
        ingress_policy(
            "wide",
            &[("app", "web")],
            vec![Rule {
                peers: vec![Peer::IpBlock {
                    cidr: "10.0.0.0/8".parse().unwrap(),
                    except: scattered,
                }],
                ports: vec![],
            }],
        ),
    );
    add_policy(
        &mut s,
        ingress_policy(
            "small",
            &[("app", "web")],
            vec![Rule {
                peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
                ports: vec![tcp(80)],
            }],
        ),
    );
    let local = local_pods(&s);
    let addrs = policy::local_node_addresses(&s, &local);
    let pf = policy::policy_flows_limited(&s, &local, &addrs, 500);
    assert_eq!(pf.refused.len(), 1, "{:?}", pf.refused);
    let r = &pf.refused[0];
    assert_eq!(r.policy, ("a".to_string(), "wide".to_string()));
    assert_eq!(r.limit, 500);
    assert!(r.flows > 500, "{r:?}");
    let msg = r.to_string();
    assert!(
        msg.contains("a/wide") && msg.contains("--max-policy-flows"),
        "{msg}"
    );
    // No flow of the refused policy, the other one's rule, the isolation.
    // (Pods are in 10.244.0.0/16; the refused block's prefixes elsewhere.)
    let wide = |l: &String| l.contains("nw_src=10.") && !l.contains("nw_src=10.244.");
    assert!(!pf.flows.iter().any(wide), "{:#?}", pf.flows);
    assert!(
        pf.rules.iter().all(|r| r.policy.1 == "small"),
        "{:?}",
        pf.rules
    );
    assert!(pf.flows.iter().any(|l| l.contains("tp_dst=80")));
    let web = s.pods[&("a".to_string(), "web".to_string())].ip.unwrap();
    assert!(
        pf.flows
            .iter()
            .any(|l| l.contains("IngressDefaultRule") && l.contains(&format!("nw_dst={web},"))),
        "web is not isolated:\n{}",
        pf.flows.join("\n")
    );
    // At exactly its count the policy is realised.
    let at = policy::policy_flows_limited(&s, &local, &addrs, r.flows);
    assert!(at.refused.is_empty(), "{:?}", at.refused);
    assert!(at.flows.iter().any(wide));
    assert!(at.rules.iter().any(|x| x.policy.1 == "wide"));
}
