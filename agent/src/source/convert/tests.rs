//! Unit tests of conversion, defaulting and validation (one per rule).

use super::*;
use serde_json::{json, Value};
use std::net::Ipv4Addr;

fn np(spec: Value) -> net::NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": "x", "uid": "u1"},
        "spec": spec,
    }))
    .expect("test NetworkPolicy deserializes")
}

fn ok(spec: Value) -> NetworkPolicy {
    match network_policy(&np(spec)) {
        Ok(p) => p,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Converts and expects exactly one error on `field` whose message
/// contains `msg`; returns the full message.
fn bad(spec: Value, field: &str, msg: &str) -> String {
    let e = match network_policy(&np(spec)) {
        Ok(p) => panic!("expected an error on {field}, got {p:?}"),
        Err(e) => e,
    };
    assert_eq!(e.kind, "NetworkPolicy");
    assert_eq!(e.object, "x/p");
    assert_eq!(e.errors.len(), 1, "{e}");
    assert_eq!(e.errors[0].field, field, "{e}");
    assert!(e.errors[0].message.contains(msg), "{e}");
    e.to_string()
}

fn lbl(kv: &[(&str, &str)]) -> Labels {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ipblock(cidr: &str, except: &[&str]) -> Value {
    json!({"ingress": [{"from": [{"ipBlock": {"cidr": cidr, "except": except}}]}]})
}

// --- defaulting -------------------------------------------------------------

#[test]
fn policy_types_default_ingress_only() {
    let p = ok(json!({"podSelector": {}}));
    assert!(p.ingress_isolation && !p.egress_isolation);
    assert!(p.ingress.is_empty() && p.egress.is_empty());
    assert!(p.pod_selector.is_empty());
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
        ("x", "p", "u1")
    );
}

#[test]
fn policy_types_default_egress_iff_egress_rules() {
    let p = ok(json!({"podSelector": {}, "egress": [{}]}));
    assert!(p.ingress_isolation && p.egress_isolation);
    assert_eq!(p.egress, vec![Rule::default()]);
    // An empty egress list does not add Egress.
    let p = ok(json!({"egress": []}));
    assert!(p.ingress_isolation && !p.egress_isolation);
    // An empty policyTypes list is defaulted like an absent one.
    let p = ok(json!({"policyTypes": [], "egress": [{}]}));
    assert!(p.ingress_isolation && p.egress_isolation);
}

#[test]
fn policy_types_explicit() {
    let p = ok(json!({"policyTypes": ["Egress"], "ingress": [{}]}));
    assert!(!p.ingress_isolation && p.egress_isolation);
    assert_eq!(
        p.ingress.len(),
        1,
        "rules are kept even if their type is not isolated"
    );
    let p = ok(json!({"policyTypes": ["Ingress", "Egress"]}));
    assert!(p.ingress_isolation && p.egress_isolation);
}

#[test]
fn absent_spec_and_pod_selector_default() {
    let p = network_policy(
        &serde_json::from_value(json!({"metadata": {"name": "n"}})).expect("deserializes"),
    )
    .expect("valid");
    assert_eq!(p.namespace, DEFAULT_NAMESPACE);
    assert!(p.pod_selector.is_empty() && p.ingress_isolation && !p.egress_isolation);
}

#[test]
fn port_protocol_defaults_to_tcp() {
    let p =
        ok(json!({"ingress": [{"ports": [{"port": 80}, {"protocol": "UDP", "port": "dns"}, {}]}]}));
    assert_eq!(
        p.ingress[0].ports,
        vec![
            PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(PortRef::Number(80)),
                end_port: None
            },
            PolicyPort {
                protocol: Protocol::Udp,
                port: Some(PortRef::Name("dns".into())),
                end_port: None
            },
            PolicyPort {
                protocol: Protocol::Tcp,
                port: None,
                end_port: None
            },
        ]
    );
}

#[test]
fn full_policy_conversion() {
    let p = ok(json!({
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{
            "from": [
                {"podSelector": {"matchLabels": {"role": "api"}}},
                {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
                 "podSelector": {}},
                {"namespaceSelector": {}},
                {"ipBlock": {"cidr": "10.1.2.3/16", "except": ["10.1.5.0/24"]}},
            ],
            "ports": [{"protocol": "TCP", "port": 5432, "endPort": 5440}],
        }],
        "egress": [{"to": [{"podSelector": {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}}]}],
    }));
    assert_eq!(p.pod_selector.match_labels, lbl(&[("app", "db")]));
    let r = &p.ingress[0];
    assert_eq!(
        r.peers[0],
        Peer::Pods {
            namespace_selector: None,
            pod_selector: Some(LabelSelector {
                match_labels: lbl(&[("role", "api")]),
                match_expressions: vec![]
            })
        }
    );
    assert_eq!(
        r.peers[1],
        Peer::Pods {
            namespace_selector: Some(LabelSelector {
                match_labels: Labels::new(),
                match_expressions: vec![Requirement {
                    key: "team".into(),
                    op: SelectorOp::In,
                    values: vec!["a".into(), "b".into()]
                }]
            }),
            pod_selector: Some(LabelSelector::default()),
        }
    );
    assert_eq!(
        r.peers[2],
        Peer::Pods {
            namespace_selector: Some(LabelSelector::default()),
            pod_selector: None
        }
    );
    assert_eq!(
        r.peers[3],
        Peer::IpBlock {
            cidr: "10.1.0.0/16".parse().expect("cidr"),
            except: vec!["10.1.5.0/24".parse().expect("cidr")]
        },
        "host bits are masked like Go's ParseCIDR"
    );
    assert_eq!(
        r.ports,
        vec![PolicyPort {
            protocol: Protocol::Tcp,
            port: Some(PortRef::Number(5432)),
            end_port: Some(5440)
        }]
    );
    assert!(p.egress_isolation);
    assert_eq!(p.egress[0].peers.len(), 1);
}

// --- validation: peers --------------------------------------------------------

#[test]
fn empty_peer_is_invalid() {
    let m = bad(
        json!({"ingress": [{"from": [{"podSelector": {}}, {}]}]}),
        "spec.ingress[0].from[1]",
        "must specify a peer",
    );
    assert!(
        m.starts_with("NetworkPolicy x/p: spec.ingress[0].from[1]: "),
        "{m}"
    );
    bad(
        json!({"egress": [{"to": [{}]}]}),
        "spec.egress[0].to[0]",
        "must specify a peer",
    );
}

#[test]
fn ipblock_with_selector_is_invalid() {
    bad(
        json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
        "spec.ingress[0].from[0]",
        "may not specify both",
    );
}

#[test]
fn bad_cidr_is_invalid_and_named() {
    let m = bad(
        json!({"ingress": [{"from": [{"podSelector": {}}, {"ipBlock": {"cidr": "10.0.0/8"}}]}]}),
        "spec.ingress[0].from[1].ipBlock.cidr",
        "invalid CIDR",
    );
    assert_eq!(
        m,
        r#"NetworkPolicy x/p: spec.ingress[0].from[1].ipBlock.cidr: invalid CIDR "10.0.0/8""#
    );
    bad(
        ipblock("10.0.0.0", &[]),
        "spec.ingress[0].from[0].ipBlock.cidr",
        "invalid CIDR",
    );
    bad(
        ipblock("10.0.0.0/33", &[]),
        "spec.ingress[0].from[0].ipBlock.cidr",
        "invalid CIDR",
    );
    bad(
        ipblock("", &[]),
        "spec.ingress[0].from[0].ipBlock.cidr",
        "required",
    );
    bad(
        ipblock("10.0.0.0/8", &["x"]),
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "invalid CIDR",
    );
}

#[test]
fn except_must_be_strict_subset() {
    bad(
        ipblock("10.0.0.0/8", &["11.0.0.0/16"]),
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "strict subset",
    );
    bad(
        ipblock("10.0.0.0/8", &["10.0.0.0/8"]),
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "strict subset",
    );
    bad(
        ipblock("10.0.0.0/16", &["10.0.0.0/8"]),
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "strict subset",
    );
    bad(
        ipblock("10.0.0.0/8", &["fd00::/64"]),
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "strict subset",
    );
    let p = ok(ipblock("10.0.0.0/8", &["10.9.0.0/16", "10.8.0.1/32"]));
    assert_eq!(
        p.ingress[0].peers[0],
        Peer::IpBlock {
            cidr: "10.0.0.0/8".parse().expect("cidr"),
            except: vec![
                "10.9.0.0/16".parse().expect("cidr"),
                "10.8.0.1/32".parse().expect("cidr")
            ]
        }
    );
}

#[test]
fn ipv6_ipblocks_are_kept_per_family() {
    // An IPv6 block is an IPv6 peer (it never widens the rule to "all").
    let p = ok(ipblock("fd00::/8", &["fd00:1::/32"]));
    assert_eq!(
        p.ingress[0].peers,
        vec![Peer::IpBlock6 {
            cidr: "fd00::/8".parse().expect("cidr"),
            except: vec!["fd00:1::/32".parse().expect("cidr")],
        }]
    );
    // Mixed: both stay, each of its family.
    let p = ok(
        json!({"ingress": [{"from": [{"ipBlock": {"cidr": "fd00::/8"}}, {"ipBlock": {"cidr": "192.168.0.0/16"}}]}]}),
    );
    assert_eq!(p.ingress[0].peers.len(), 2);
    assert!(matches!(p.ingress[0].peers[1], Peer::IpBlock { .. }));
    // An invalid IPv6 except is still an error.
    bad(
        ipblock("fd00::/16", &["fe00::/32"]),
        "spec.ingress[0].from[0].ipBlock.except[0]",
        "strict subset",
    );
}

// --- validation: selectors ----------------------------------------------------

#[test]
fn bad_selector_operator() {
    bad(
        json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}}),
        "spec.podSelector.matchExpressions[0].operator",
        "unsupported operator \"Equals\"",
    );
}

#[test]
fn selector_values_must_match_operator() {
    bad(
        json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}}),
        "spec.podSelector.matchExpressions[0].values",
        "non-empty",
    );
    bad(
        json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "NotIn"}]}}),
        "spec.podSelector.matchExpressions[0].values",
        "non-empty",
    );
    bad(
        json!({"ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}]}]}),
        "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].values",
        "must be empty",
    );
    bad(
        json!({"egress": [{"to": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": ["x"]}]}}]}]}),
        "spec.egress[0].to[0].podSelector.matchExpressions[0].values",
        "must be empty",
    );
}

#[test]
fn selector_keys_and_values_syntax() {
    bad(
        json!({"podSelector": {"matchLabels": {"bad key": "v"}}}),
        "spec.podSelector.matchLabels",
        "invalid label key",
    );
    bad(
        json!({"podSelector": {"matchLabels": {"k": "-v"}}}),
        "spec.podSelector.matchLabels[k]",
        "invalid label value",
    );
    bad(
        json!({"podSelector": {"matchExpressions": [{"key": "Bad_Prefix/x", "operator": "Exists"}]}}),
        "spec.podSelector.matchExpressions[0].key",
        "invalid label key",
    );
    bad(
        json!({"podSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["ok", "not ok"]}]}}),
        "spec.podSelector.matchExpressions[0].values[1]",
        "invalid label value",
    );
    let p = ok(json!({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "web", "e": ""}}}));
    assert_eq!(p.pod_selector.match_labels.len(), 2);
    assert!(
        check_label_key(&format!("{}/a", "x".repeat(254))).is_err(),
        "prefix longer than 253"
    );
    assert!(check_label_key(&"a".repeat(64)).is_err());
    assert!(check_label_key(&"a".repeat(63)).is_ok());
}

// --- validation: ports ----------------------------------------------------------

#[test]
fn port_range_checks() {
    bad(
        json!({"ingress": [{"ports": [{"port": 0}]}]}),
        "spec.ingress[0].ports[0].port",
        "not a valid port number",
    );
    bad(
        json!({"ingress": [{"ports": [{"port": 65536}]}]}),
        "spec.ingress[0].ports[0].port",
        "not a valid port number",
    );
    bad(
        json!({"egress": [{"ports": [{"port": -1}]}]}),
        "spec.egress[0].ports[0].port",
        "not a valid port number",
    );
    let p = ok(json!({"ingress": [{"ports": [{"port": 65535}, {"port": 1}]}]}));
    assert_eq!(p.ingress[0].ports.len(), 2);
}

#[test]
fn unknown_protocol() {
    bad(
        json!({"ingress": [{"ports": [{"protocol": "ICMP"}]}]}),
        "spec.ingress[0].ports[0].protocol",
        "unsupported protocol",
    );
    bad(
        json!({"ingress": [{"ports": [{"protocol": "tcp"}]}]}),
        "spec.ingress[0].ports[0].protocol",
        "unsupported protocol",
    );
    let p = ok(json!({"ingress": [{"ports": [{"protocol": "SCTP"}]}]}));
    assert_eq!(p.ingress[0].ports[0].protocol, Protocol::Sctp);
}

#[test]
fn named_port_syntax() {
    bad(
        json!({"ingress": [{"ports": [{"port": ""}]}]}),
        "spec.ingress[0].ports[0].port",
        "invalid port name",
    );
    for n in [
        "HTTP",
        "-http",
        "http-",
        "ht--tp",
        "1234",
        "a-very-long-port-name",
        "web_x",
    ] {
        bad(
            json!({"ingress": [{"ports": [{"port": n}]}]}),
            "spec.ingress[0].ports[0].port",
            "invalid port name",
        );
    }
    let p = ok(json!({"ingress": [{"ports": [{"port": "h2c-8080"}]}]}));
    assert_eq!(
        p.ingress[0].ports[0].port,
        Some(PortRef::Name("h2c-8080".into()))
    );
}

#[test]
fn end_port_rules() {
    bad(
        json!({"ingress": [{"ports": [{"endPort": 90}]}]}),
        "spec.ingress[0].ports[0].port",
        "must be specified when endPort",
    );
    bad(
        json!({"ingress": [{"ports": [{"port": "http", "endPort": 90}]}]}),
        "spec.ingress[0].ports[0].endPort",
        "named port",
    );
    bad(
        json!({"ingress": [{"ports": [{"port": 80, "endPort": 79}]}]}),
        "spec.ingress[0].ports[0].endPort",
        "greater than or equal",
    );
    bad(
        json!({"ingress": [{"ports": [{"port": 80, "endPort": 70000}]}]}),
        "spec.ingress[0].ports[0].endPort",
        "not a valid port",
    );
    let p = ok(json!({"ingress": [{"ports": [{"port": 80, "endPort": 80}]}]}));
    assert_eq!(p.ingress[0].ports[0].end_port, Some(80));
}

#[test]
fn policy_types_validation() {
    bad(
        json!({"policyTypes": ["Ingress", "Sideways"]}),
        "spec.policyTypes[1]",
        "unsupported policy type",
    );
    bad(
        json!({"policyTypes": ["Ingress", "Egress", "Ingress"]}),
        "spec.policyTypes",
        "more than two",
    );
}

#[test]
fn all_errors_are_reported_and_nothing_is_returned() {
    let e = network_policy(&np(json!({
        "ingress": [{"from": [{}], "ports": [{"port": 0}]}],
        "egress": [{"to": [{"ipBlock": {"cidr": "bad"}}]}],
    })))
    .expect_err("invalid");
    let fields: Vec<_> = e.errors.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.ingress[0].from[0]",
            "spec.ingress[0].ports[0].port",
            "spec.egress[0].to[0].ipBlock.cidr"
        ]
    );
    assert_eq!(e.to_string().matches("; ").count(), 2);
}

#[test]
fn missing_name_is_invalid() {
    let e = network_policy(
        &serde_json::from_value(json!({"metadata": {"namespace": "x"}})).expect("deserializes"),
    )
    .expect_err("no name");
    assert_eq!(
        e.to_string(),
        "NetworkPolicy x/<unnamed>: metadata.name: required"
    );
    let e = namespace(&core::Namespace::default()).expect_err("no name");
    assert_eq!(
        e.to_string(),
        "Namespace <unnamed>: metadata.name: required"
    );
}

// --- Pod, Namespace, Node -------------------------------------------------------

fn pod_of(v: Value) -> Result<Pod, ConvertError> {
    pod(&serde_json::from_value(v).expect("test Pod deserializes"))
}

#[test]
fn pod_conversion() {
    let p = pod_of(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u", "labels": {"app": "web"}},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "a", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 53, "protocol": "UDP"}]},
                {"name": "b"},
                {"name": "c", "ports": [{"containerPort": 9000, "protocol": "SCTP", "name": "s"}]},
            ],
        },
        "status": {"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}], "phase": "Running"},
    }))
    .expect("valid");
    assert_eq!(p.key(), ("shop".to_string(), "web".to_string()));
    assert_eq!(p.uid, "u");
    assert_eq!(p.labels, lbl(&[("app", "web")]));
    assert_eq!(p.node_name, "n1");
    assert_eq!(p.ip, Some(Ipv4Addr::new(10, 0, 0, 5)));
    assert!(!p.host_network);
    assert_eq!(
        p.ports,
        vec![
            ContainerPort {
                name: Some("http".into()),
                port: 80,
                protocol: Protocol::Tcp
            },
            ContainerPort {
                name: None,
                port: 53,
                protocol: Protocol::Udp
            },
            ContainerPort {
                name: Some("s".into()),
                port: 9000,
                protocol: Protocol::Sctp
            },
        ]
    );
    assert_eq!(p.named_port("http", Protocol::Tcp), Some(80));
}

#[test]
fn pod_defaults_and_ip_selection() {
    let p = pod_of(json!({"metadata": {"name": "a"}})).expect("valid");
    assert_eq!(
        (
            p.namespace.as_str(),
            p.node_name.as_str(),
            p.ip,
            p.host_network
        ),
        ("default", "", None, false)
    );
    // IPv6 primary: the first IPv4 of podIPs.
    let p = pod_of(
        json!({"metadata": {"name": "a"}, "spec": {"hostNetwork": true, "containers": []},
        "status": {"podIP": "fd00::1", "podIPs": [{"ip": "fd00::1"}, {"ip": "10.1.1.1"}]}}),
    )
    .expect("valid");
    assert_eq!(p.ip, Some(Ipv4Addr::new(10, 1, 1, 1)));
    assert!(p.host_network);
    // IPv6 only: no IP.
    let p =
        pod_of(json!({"metadata": {"name": "a"}, "status": {"podIP": "fd00::1"}})).expect("valid");
    assert_eq!(p.ip, None);
    // Terminated: the IP is released.
    for phase in ["Succeeded", "Failed"] {
        let p = pod_of(
            json!({"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.1", "phase": phase}}),
        )
        .expect("valid");
        assert_eq!(p.ip, None, "{phase}");
    }
}

#[test]
fn pod_validation() {
    let e = pod_of(
        json!({"metadata": {"name": "a", "namespace": "n"}, "status": {"podIP": "10.0.0.300"}}),
    )
    .expect_err("bad ip");
    assert_eq!(
        e.to_string(),
        r#"Pod n/a: status.podIP: invalid IP address "10.0.0.300""#
    );
    let e = pod_of(json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "ports": [
        {"containerPort": 0}, {"containerPort": 80, "protocol": "HTTP"}, {"containerPort": 81, "name": "Bad"}]}]}}))
    .expect_err("bad ports");
    let fields: Vec<_> = e.errors.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.containers[0].ports[0].containerPort",
            "spec.containers[0].ports[1].protocol",
            "spec.containers[0].ports[2].name"
        ]
    );
}

#[test]
fn namespace_conversion() {
    let n = namespace(
        &serde_json::from_value(json!({"metadata": {"name": "shop", "labels": {"team": "a"}}}))
            .expect("ns"),
    )
    .expect("valid");
    assert_eq!(
        n,
        Namespace {
            name: "shop".into(),
            labels: lbl(&[("team", "a")])
        }
    );
}

fn node_of(v: Value) -> Result<Node, ConvertError> {
    node(&serde_json::from_value(v).expect("test Node deserializes"))
}

#[test]
fn node_conversion() {
    let n = node_of(json!({"metadata": {"name": "n1"},
        "spec": {"podCIDR": "10.10.1.0/24", "podCIDRs": ["10.10.1.0/24", "fd00:1::/64"]},
        "status": {"addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "fd00::9"},
                                 {"type": "InternalIP", "address": "192.168.1.10"}, {"type": "ExternalIP", "address": "1.2.3.4"}]}}))
    .expect("valid");
    assert_eq!(
        n,
        Node {
            name: "n1".into(),
            pod_cidr: Some("10.10.1.0/24".parse().expect("cidr")),
            pod_cidr6: Some("fd00:1::/64".parse().expect("cidr")),
            internal_ip: Some(Ipv4Addr::new(192, 168, 1, 10)),
            internal_ip6: Some("fd00::9".parse().expect("ip")),
        }
    );
    // IPv6 first, IPv4 second; host bits masked off.
    let n = node_of(json!({"metadata": {"name": "n2"}, "spec": {"podCIDR": "fd00:2::5/64", "podCIDRs": ["fd00:2::5/64", "10.10.2.0/24"]}}))
        .expect("valid");
    assert_eq!(n.pod_cidr, Some("10.10.2.0/24".parse().expect("cidr")));
    assert_eq!(n.pod_cidr6, Some("fd00:2::/64".parse().expect("cidr")));
    assert_eq!(n.internal_ip, None);
    let n = node_of(json!({"metadata": {"name": "n3"}})).expect("valid");
    assert_eq!((n.pod_cidr, n.pod_cidr6, n.internal_ip), (None, None, None));
}

#[test]
fn node_validation() {
    let e = node_of(json!({"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.10.1.0"}}))
        .expect_err("bad cidr");
    assert_eq!(
        e.to_string(),
        r#"Node n1: spec.podCIDR: invalid CIDR "10.10.1.0""#
    );
    let e = node_of(
        json!({"metadata": {"name": "n1"}, "spec": {"podCIDRs": ["10.10.1.0/24", "fd00::/129"]}}),
    )
    .expect_err("bad v6 cidr");
    assert_eq!(
        e.to_string(),
        r#"Node n1: spec.podCIDRs[1]: invalid CIDR "fd00::/129""#
    );
    let e = node_of(json!({"metadata": {"name": "n1"}, "status": {"addresses": [{"type": "InternalIP", "address": "x"}]}}))
        .expect_err("bad ip");
    assert_eq!(e.errors[0].field, "status.addresses[0].address");
}
