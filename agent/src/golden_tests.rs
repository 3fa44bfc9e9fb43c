//! Golden flow sets: the agent's complete desired flows for a few
//! representative nodes, compared byte for byte with the files in
//! `agent/tests/golden/`.
//!
//! A change that alters any flow the agent installs (text, order, cookie,
//! priority) fails here, which is what a refactoring must not do. When a
//! change of flows is intended, regenerate the files and review their diff:
//!
//! ```text
//! OXVS_BLESS=1 cargo test -p oxvs-agent --lib golden
//! git diff agent/tests/golden/
//! ```
//!
//! Each file holds the flow lines in the order the agent computes them,
//! then the rule ids it uses (`# rule`) and the policies it refused
//! (`# refused`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::desired::{compute, local_pods, pod_ports, Inputs, Tunnel};
use crate::flows::{self, NodeNet, RemoteNode};
use crate::model::*;
use crate::state::{AttachState, Attachment};

fn node() -> NodeNet {
    NodeNet {
        ipv4: Some(crate::flows::NodeNet4 {
            pod_cidr: "10.244.0.0/24".parse().unwrap(),
            gateway_ip: "10.244.0.1".parse().unwrap(),
        }),
        gateway_mac: [0x0a, 0x58, 10, 244, 0, 1],
        gateway_ofport: 2,
        ipv6: None,
    }
}

fn remote(name: &str, cidr: &str, ip: &str) -> RemoteNode {
    RemoteNode {
        name: name.into(),
        pod_cidr: Some(cidr.parse().unwrap()),
        ip: ip.parse().unwrap(),
        pod_cidr6: None,
    }
}

/// A ready attachment of pod `ns/name` on `ofport`.
fn att(ns: &str, name: &str, ip: &str, ofport: Option<u32>, state: AttachState) -> Attachment {
    let ip: Ipv4Addr = ip.parse().unwrap();
    Attachment {
        container_id: format!("c-{ns}-{name}-{ip}"),
        ifname: "eth0".into(),
        netns: "/proc/1/ns/net".into(),
        host_ifname: format!("h-{name}"),
        pod_namespace: ns.into(),
        pod_name: name.into(),
        ipv4: Some(crate::state::PodIpv4 {
            ip,
            prefix_len: 24,
            gateway: "10.244.0.1".parse().unwrap(),
        }),
        mac: flows::mac_str(&flows::pod_mac(ip)),
        mtu: 1450,
        ofport,
        state,
        ipv6: None,
        qdisc: None,
    }
}

/// The IPv6 twin of a lab IPv4 pod address `10.244.N.X`:
/// `fd00:10:244:N::X` (hex).
fn v6_of(ip: Ipv4Addr) -> std::net::Ipv6Addr {
    let o = ip.octets();
    std::net::Ipv6Addr::new(
        0xfd00,
        0x10,
        0x244,
        u16::from(o[2]),
        0,
        0,
        0,
        u16::from(o[3]),
    )
}

/// `a` on a dual-stack node: its IPv6 address is [`v6_of`] its IPv4 one.
fn dual_att(mut a: Attachment) -> Attachment {
    a.ipv6 = Some(crate::state::PodIpv6 {
        ip: v6_of(a.ip4().unwrap()),
        prefix_len: 64,
        gateway: "fd00:10:244::1".parse().unwrap(),
    });
    a
}

/// [`cluster`] made dual-stack: IPv6 pod CIDRs on both nodes, an IPv6
/// address on every pod, and a policy with an IPv6 `ipBlock`.
fn dual_cluster() -> ClusterState {
    let mut s = cluster();
    for n in s.nodes.values_mut() {
        let third = n.pod_cidr.map_or(0, |c| c.network().octets()[2]);
        n.pod_cidr6 = Some(format!("fd00:10:244:{third:x}::/64").parse().unwrap());
    }
    for p in s.pods.values_mut() {
        if !p.host_network {
            p.ip6 = p.ip.map(v6_of);
        }
    }
    let mut v6block = policy("x", "v6block", sel(&[("app", "db")]));
    v6block.ingress_isolation = true;
    v6block.ingress = vec![Rule {
        peers: vec![Peer::IpBlock6 {
            cidr: "fd00:99::/32".parse().unwrap(),
            except: vec!["fd00:99:1::/48".parse().unwrap()],
        }],
        ports: vec![port(Protocol::Tcp, Some(PortRef::Number(5432)), None)],
    }];
    s.policies.insert(v6block.key(), v6block);
    s
}

fn labels(kv: &[(&str, &str)]) -> Labels {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sel(kv: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(kv),
        match_expressions: vec![],
    }
}

fn pod(
    ns: &str,
    name: &str,
    node: &str,
    ip: Option<&str>,
    kv: &[(&str, &str)],
    ports: &[(&str, u16, Protocol)],
) -> Pod {
    Pod {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{ns}-{name}"),
        labels: labels(kv),
        node_name: node.into(),
        ip: ip.map(|s| s.parse().unwrap()),
        host_network: false,
        ports: ports
            .iter()
            .map(|(n, port, protocol)| ContainerPort {
                name: Some(n.to_string()),
                port: *port,
                protocol: *protocol,
            })
            .collect(),
        ip6: None,
    }
}

fn policy(ns: &str, name: &str, selector: LabelSelector) -> NetworkPolicy {
    NetworkPolicy {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-np-{ns}-{name}"),
        pod_selector: selector,
        ingress_isolation: false,
        egress_isolation: false,
        ingress: vec![],
        egress: vec![],
    }
}

fn port(protocol: Protocol, p: Option<PortRef>, end_port: Option<u16>) -> PolicyPort {
    PolicyPort {
        protocol,
        port: p,
        end_port,
    }
}

fn pods_peer(ns: Option<LabelSelector>, pods: Option<LabelSelector>) -> Peer {
    Peer::Pods {
        namespace_selector: ns,
        pod_selector: pods,
    }
}

fn block(cidr: &str, except: &[&str]) -> Peer {
    Peer::IpBlock {
        cidr: cidr.parse().unwrap(),
        except: except.iter().map(|e| e.parse().unwrap()).collect(),
    }
}

/// Two namespaces, pods on this node ("n1") and on "n2", and policies
/// with pod and namespace peers, ipBlocks with excepts, numbered, ranged
/// and named ports, one-dimension rules, a deny-all.
fn cluster() -> ClusterState {
    let mut s = ClusterState::default();
    for (name, kv) in [("x", [("team", "x")]), ("y", [("team", "y")])] {
        s.namespaces.insert(
            name.into(),
            Namespace {
                name: name.into(),
                labels: labels(&kv),
            },
        );
    }
    for (name, cidr, ip) in [
        ("n1", "10.244.0.0/24", "192.168.77.11"),
        ("n2", "10.244.1.0/24", "192.168.77.12"),
    ] {
        s.nodes.insert(
            name.into(),
            Node {
                name: name.into(),
                pod_cidr: Some(cidr.parse().unwrap()),
                pod_cidr6: None,
                internal_ip: Some(ip.parse().unwrap()),
                internal_ip6: None,
            },
        );
    }
    let tcp = Protocol::Tcp;
    let mut hostnet = pod("y", "hostnet", "n1", Some("192.168.77.11"), &[], &[]);
    hostnet.host_network = true;
    for p in [
        pod(
            "x",
            "a",
            "n1",
            Some("10.244.0.3"),
            &[("app", "web")],
            &[("http", 8080, tcp)],
        ),
        pod(
            "x",
            "b",
            "n1",
            Some("10.244.0.4"),
            &[("app", "db")],
            &[("db", 5432, tcp)],
        ),
        // Its IP in the snapshot is stale: the attachment's wins.
        pod(
            "x",
            "c",
            "n1",
            Some("10.244.0.99"),
            &[("app", "web")],
            &[("http", 9090, tcp)],
        ),
        pod(
            "x",
            "r",
            "n2",
            Some("10.244.1.3"),
            &[("app", "web")],
            &[("http", 8080, tcp)],
        ),
        pod(
            "y",
            "d",
            "n2",
            Some("10.244.1.4"),
            &[("app", "client")],
            &[],
        ),
        pod("y", "pending", "n2", None, &[("app", "client")], &[]),
        hostnet,
    ] {
        s.pods.insert(p.key(), p);
    }

    let mut web = policy("x", "web-ingress", sel(&[("app", "web")]));
    web.ingress_isolation = true;
    web.ingress = vec![
        Rule {
            peers: vec![pods_peer(Some(sel(&[("team", "y")])), None)],
            ports: vec![
                port(tcp, Some(PortRef::Number(80)), None),
                port(tcp, Some(PortRef::Name("http".into())), None),
                port(tcp, Some(PortRef::Number(8000)), Some(8100)),
            ],
        },
        Rule {
            peers: vec![block("10.0.0.0/8", &["10.1.0.0/16", "10.2.3.0/24"])],
            ports: vec![],
        },
    ];
    let mut db = policy("x", "db-egress", sel(&[("app", "db")]));
    db.egress_isolation = true;
    db.ingress_isolation = true;
    db.egress = vec![
        Rule {
            peers: vec![block("192.168.0.0/16", &["192.168.5.0/24"])],
            ports: vec![
                port(Protocol::Udp, Some(PortRef::Number(53)), None),
                port(Protocol::Sctp, None, None),
            ],
        },
        Rule {
            peers: vec![pods_peer(None, Some(sel(&[("app", "web")])))],
            ports: vec![port(tcp, Some(PortRef::Name("http".into())), None)],
        },
    ];
    // Ingress from anyone on any port: one dimension (the selected pods).
    db.ingress = vec![Rule::default()];
    let mut deny = policy("y", "deny-all", sel(&[]));
    deny.ingress_isolation = true;
    deny.egress_isolation = true;
    for p in [web, db, deny] {
        s.policies.insert(p.key(), p);
    }
    s
}

/// The attachments of the policy scenarios: x/a, x/b, x/c and y/e
/// (admitted, not yet in the snapshot) ready; one pending; one without a
/// pod name.
fn policy_attachments() -> Vec<Attachment> {
    vec![
        att("x", "a", "10.244.0.3", Some(3), AttachState::Ready),
        att("x", "b", "10.244.0.4", Some(4), AttachState::Ready),
        att("x", "c", "10.244.0.5", Some(5), AttachState::Ready),
        att("y", "e", "10.244.0.6", Some(6), AttachState::Ready),
        att("y", "f", "10.244.0.7", None, AttachState::Pending),
        att("", "", "10.244.0.8", Some(8), AttachState::Ready),
    ]
}

/// The tunnel on port 1 to `remotes`, this node being 192.168.77.11.
fn tunnel(remotes: Vec<RemoteNode>) -> Tunnel {
    Tunnel {
        ofport: 1,
        remotes,
        node_ip: Some("192.168.77.11".parse().unwrap()),
        guard: true,
    }
}

fn scenarios() -> BTreeMap<&'static str, Inputs> {
    let mut m = BTreeMap::new();
    let pods_only = vec![
        att("x", "a", "10.244.0.3", Some(3), AttachState::Ready),
        att("x", "b", "10.244.0.4", Some(4), AttachState::Ready),
    ];
    m.insert(
        "node",
        Inputs {
            node: node(),
            pods: pod_ports(&pods_only),
            tunnel: None,
            state: Arc::new(ClusterState::default()),
            admitted: vec![],
            local: local_pods(&pods_only),
            max_policy_flows: crate::policy::DEFAULT_MAX_POLICY_FLOWS,
            proxy: false,
            node_name: "node-a".into(),
        },
    );
    let remotes = vec![
        remote("n2", "10.244.1.0/24", "192.168.77.12"),
        remote("n3", "10.244.2.0/24", "192.168.77.13"),
        // A remote node claiming this node's pod CIDR: no flows of its own.
        remote("n4", "10.244.0.0/24", "192.168.77.14"),
    ];
    m.insert(
        "tunnel",
        Inputs {
            node: node(),
            pods: pod_ports(&pods_only),
            tunnel: Some(tunnel(remotes.clone())),
            state: Arc::new(ClusterState::default()),
            admitted: vec![],
            local: local_pods(&pods_only),
            max_policy_flows: crate::policy::DEFAULT_MAX_POLICY_FLOWS,
            proxy: false,
            node_name: "node-a".into(),
        },
    );
    let admitted = vec![pod(
        "y",
        "e",
        "n1",
        Some("10.244.0.6"),
        &[("app", "client")],
        &[],
    )];
    for (name, max) in [
        ("policies", crate::policy::DEFAULT_MAX_POLICY_FLOWS),
        ("refused", 12),
    ] {
        let atts = policy_attachments();
        m.insert(
            name,
            Inputs {
                node: node(),
                pods: pod_ports(&atts),
                tunnel: Some(tunnel(remotes[..1].to_vec())),
                state: Arc::new(cluster()),
                admitted: admitted.clone(),
                local: local_pods(&atts),
                max_policy_flows: max,
                proxy: false,
                node_name: "node-a".into(),
            },
        );
    }
    // Dual-stack: the policies' node with IPv6 everywhere.
    let dual_atts: Vec<Attachment> = policy_attachments().into_iter().map(dual_att).collect();
    let mut dual_remotes = remotes[..1].to_vec();
    dual_remotes[0].pod_cidr6 = Some("fd00:10:244:1::/64".parse().unwrap());
    m.insert(
        "dualstack",
        Inputs {
            node: NodeNet {
                ipv6: Some(flows::NodeNet6::of("fd00:10:244::/64".parse().unwrap())),
                ..node()
            },
            pods: pod_ports(&dual_atts),
            tunnel: Some(tunnel(dual_remotes)),
            state: Arc::new(dual_cluster()),
            admitted: vec![],
            local: local_pods(&dual_atts),
            max_policy_flows: crate::policy::DEFAULT_MAX_POLICY_FLOWS,
            proxy: false,
            node_name: "node-a".into(),
        },
    );
    // IPv6-only: the dual-stack node without its IPv4 side, its tunnel
    // over IPv6 to an IPv6-only remote.
    let v6_atts: Vec<Attachment> = dual_atts
        .iter()
        .cloned()
        .map(|mut a| {
            a.ipv4 = None;
            a.mac = flows::mac_str(&flows::pod_mac_of(a.ip4(), a.ip6()));
            a
        })
        .collect();
    let mut v6_state = dual_cluster();
    for n in v6_state.nodes.values_mut() {
        n.pod_cidr = None;
        n.internal_ip6 = n.internal_ip.map(|ip| {
            let o = ip.octets();
            std::net::Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x77, 0, 0, 0, u16::from(o[3]))
        });
        n.internal_ip = None;
    }
    for p in v6_state.pods.values_mut() {
        p.ip = None;
    }
    m.insert(
        "ipv6only",
        Inputs {
            node: NodeNet {
                ipv4: None,
                ipv6: Some(flows::NodeNet6::of("fd00:10:244::/64".parse().unwrap())),
                ..node()
            },
            pods: pod_ports(&v6_atts),
            tunnel: Some(Tunnel {
                ofport: 1,
                remotes: vec![RemoteNode {
                    name: "n2".into(),
                    pod_cidr: None,
                    ip: "fd00:192:168:77::12".parse().unwrap(),
                    pod_cidr6: Some("fd00:10:244:1::/64".parse().unwrap()),
                }],
                node_ip: Some("fd00:192:168:77::11".parse().unwrap()),
                guard: true,
            }),
            state: Arc::new(v6_state),
            admitted: vec![],
            local: local_pods(&v6_atts),
            max_policy_flows: crate::policy::DEFAULT_MAX_POLICY_FLOWS,
            proxy: false,
            node_name: "node-a".into(),
        },
    );
    // The Service proxy: two Services (one with affinity and a named
    // target port), one without a ready endpoint, two local pods (hairpin).
    let mut proxied = ClusterState::default();
    let svc = |name: &str, ip: &str, affinity: bool, ports: Vec<ServicePort>| Service {
        namespace: "shop".into(),
        name: name.into(),
        cluster_ip: Some(ip.parse().unwrap()),
        cluster_ip6: None,
        ports,
        affinity_timeout: affinity.then_some(10_800),
        external_ips: Vec::new(),
        external_local: false,
        internal_local: false,
    };
    let sport = |name: &str, protocol, port| ServicePort {
        name: name.into(),
        protocol,
        port,
        node_port: None,
    };
    let ep = |ip: &str, ready: bool, ports: &[(&str, Protocol, u16)]| Endpoint {
        ip: ip.parse().unwrap(),
        ready,
        node_name: None,
        ports: ports
            .iter()
            .map(|(n, protocol, port)| EndpointPort {
                name: n.to_string(),
                protocol: *protocol,
                port: *port,
            })
            .collect(),
    };
    for s in [
        svc(
            "web",
            "10.96.0.20",
            false,
            vec![
                sport("http", Protocol::Tcp, 80),
                sport("dns", Protocol::Udp, 53),
            ],
        ),
        svc(
            "sticky",
            "10.96.0.21",
            true,
            vec![sport("", Protocol::Tcp, 443)],
        ),
        svc(
            "idle",
            "10.96.0.22",
            false,
            vec![sport("", Protocol::Tcp, 80)],
        ),
        // From outside: a NodePort and an external address, both
        // policies; internalTrafficPolicy: Local.
        Service {
            external_ips: vec!["192.0.2.10".parse().unwrap()],
            ..svc(
                "front",
                "10.96.0.23",
                false,
                vec![ServicePort {
                    node_port: Some(30080),
                    ..sport("", Protocol::Tcp, 80)
                }],
            )
        },
        Service {
            external_ips: vec!["192.0.2.11".parse().unwrap()],
            external_local: true,
            internal_local: true,
            ..svc(
                "front-local",
                "10.96.0.24",
                false,
                vec![ServicePort {
                    node_port: Some(30081),
                    ..sport("", Protocol::Tcp, 80)
                }],
            )
        },
    ] {
        proxied.services.insert(s.key(), s);
    }
    let web_ports = [("http", Protocol::Tcp, 8080), ("dns", Protocol::Udp, 5353)];
    proxied.endpoints.insert(
        ("shop".into(), "web".into()),
        EndpointSet {
            service: ("shop".into(), "web".into()),
            endpoints: vec![
                ep("10.244.0.3", true, &web_ports),
                ep("10.244.1.7", true, &web_ports),
                ep("10.244.1.8", false, &web_ports),
            ],
        },
    );
    proxied.endpoint_slices.insert(
        ("shop".into(), "sticky-abc".into()),
        EndpointSet {
            service: ("shop".into(), "sticky".into()),
            endpoints: vec![ep("10.244.0.4", true, &[("", Protocol::Tcp, 8443)])],
        },
    );
    for name in ["front", "front-local"] {
        proxied.endpoints.insert(
            ("shop".into(), name.into()),
            EndpointSet {
                service: ("shop".into(), name.into()),
                endpoints: vec![
                    Endpoint {
                        node_name: Some("node-a".into()),
                        ..ep("10.244.0.3", true, &[("", Protocol::Tcp, 8080)])
                    },
                    Endpoint {
                        node_name: Some("node-b".into()),
                        ..ep("10.244.1.7", true, &[("", Protocol::Tcp, 8080)])
                    },
                ],
            },
        );
    }
    proxied.endpoints.insert(
        ("shop".into(), "idle".into()),
        EndpointSet {
            service: ("shop".into(), "idle".into()),
            endpoints: vec![ep("10.244.0.5", false, &[("", Protocol::Tcp, 80)])],
        },
    );
    m.insert(
        "proxy",
        Inputs {
            pods: pod_ports(&pods_only),
            state: Arc::new(proxied),
            local: local_pods(&pods_only),
            proxy: true,
            node_name: "node-a".into(),
            ..Inputs::for_node(node())
        },
    );
    m
}

fn render(inp: Inputs) -> String {
    let d = compute(&inp);
    let mut out = String::new();
    for l in &d.lines {
        out.push_str(l);
        out.push('\n');
    }
    for r in &d.rules {
        let _ = writeln!(
            out,
            "# rule {:#x} {}/{} {:?} {} uid={}",
            r.id, r.policy.0, r.policy.1, r.direction, r.index, r.uid
        );
    }
    for r in &d.refused {
        let _ = writeln!(out, "# refused {r}");
    }
    for g in &d.groups {
        let _ = writeln!(out, "# group {g}");
    }
    out
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn desired_flows_match_the_golden_files() {
    let bless = std::env::var_os("OXVS_BLESS").is_some();
    let mut failures = Vec::new();
    for (name, inp) in scenarios() {
        let got = render(inp);
        let path = golden_dir().join(format!("{name}.flows"));
        if bless {
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (OXVS_BLESS=1 cargo test -p oxvs-agent --lib golden)",
                path.display()
            )
        });
        if got != want {
            let first = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            failures.push(format!(
                "{name}: differs from {} at line {}:\n  got:  {}\n  want: {}",
                path.display(),
                first + 1,
                got.lines().nth(first).unwrap_or("<end>"),
                want.lines().nth(first).unwrap_or("<end>"),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(if intended: OXVS_BLESS=1 cargo test -p oxvs-agent --lib golden, then review git diff)",
        failures.join("\n")
    );
}

#[test]
fn golden_scenarios_cover_every_feature() {
    // The files would prove little if a scenario lost its point.
    let all: String = scenarios().into_values().map(render).collect();
    for needle in [
        "ipv6_src=fd00:99:8000::/33",
        "tcp6, tp_dst=5432",
        "nd_target=fd00:10:244::1",
        "ipv6_dst=fd00:10:244:1::/64",
        "conjunction(",
        "conj_id=",
        "tp_dst=0x",
        "nw_dst=10.244.0.3, tp_dst=8080",
        "sctp",
        "priority=201",
        "priority=205",
        "tun_src=",
        "tp_dst=4789",
        "# refused",
        "table=IngressDefaultRule",
        "table=EgressDefaultRule",
        "group:",
        "nat(dst=10.244.1.7:8080)",
        "selection_method=hash,fields(ip_src)",
        "nat(src=169.254.169.252)",
        "nw_dst=10.96.0.22, tp_dst=80, actions=controller(userdata=72.65.6a.65.63.74)",
        "nat(src=10.244.0.1:61000-65535)",
        "nw_src=10.244.0.0/24, actions=group:",
    ] {
        assert!(all.contains(needle), "no golden flow has {needle:?}");
    }
}
