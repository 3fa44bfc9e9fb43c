//! Shared helpers of the policy tests: cluster builders and a one-node
//! pipeline (the real node, pod and policy flows) to trace packets through.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::Arc;

use oxvs_agent::desired::{self, Inputs, Tunnel};
use oxvs_agent::flows::{self, NodeNet, PodPort, RemoteNode};
use oxvs_agent::model::*;
use oxvs_agent::policy::{policy_flows, Endpoint, LocalPod, PolicyFlows, L4};
use oxvs_pipeline::field::ct_state;
use oxvs_pipeline::odp::DpAction;
use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
use oxvs_pipeline::tables::{Pipeline, TableSet};
use oxvs_pipeline::trace::{trace, TraceOptions};
use oxvs_pipeline::xlate::XlateEnv;

pub const GW_PORT: u32 = 2;
pub const TUNNEL_PORT: u32 = 1;

/// The other node: pods of "n2" are in its pod CIDR, behind the tunnel.
pub fn remote_node() -> RemoteNode {
    RemoteNode {
        name: "n2".into(),
        pod_cidr: Some("10.244.1.0/24".parse().unwrap()),
        ip: "192.168.77.12".parse().unwrap(),
        pod_cidr6: None,
    }
}

pub fn node() -> NodeNet {
    NodeNet {
        ipv4: Some(oxvs_agent::flows::NodeNet4 {
            pod_cidr: "10.244.0.0/24".parse().unwrap(),
            gateway_ip: "10.244.0.1".parse().unwrap(),
        }),
        gateway_mac: [0x0a, 0x58, 10, 244, 0, 1],
        gateway_ofport: GW_PORT,
        ipv6: None,
    }
}

/// Nodes "n1" (this one: gateway 10.244.0.1, InternalIP 192.168.77.11)
/// and "n2" (the remote one).
pub fn add_nodes(state: &mut ClusterState) {
    for (name, cidr, ip) in [
        ("n1", "10.244.0.0/24", "192.168.77.11"),
        ("n2", "10.244.1.0/24", "192.168.77.12"),
    ] {
        state.nodes.insert(
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
}

pub fn labels(kv: &[(&str, &str)]) -> Labels {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn sel(kv: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(kv),
        match_expressions: vec![],
    }
}

pub fn ns(state: &mut ClusterState, name: &str, kv: &[(&str, &str)]) {
    state.namespaces.insert(
        name.into(),
        Namespace {
            name: name.into(),
            labels: labels(kv),
        },
    );
}

pub fn pod(
    state: &mut ClusterState,
    ns: &str,
    name: &str,
    node: &str,
    ip: &str,
    kv: &[(&str, &str)],
    ports: &[(&str, u16, Protocol)],
) {
    let p = Pod {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{ns}-{name}"),
        labels: labels(kv),
        node_name: node.into(),
        ip: Some(ip.parse().unwrap()),
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
    };
    state.pods.insert(p.key(), p);
}

pub fn policy(ns: &str, name: &str, selector: LabelSelector) -> NetworkPolicy {
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

pub fn add_policy(state: &mut ClusterState, p: NetworkPolicy) {
    state.policies.insert(p.key(), p);
}

pub fn tcp(port: u16) -> PolicyPort {
    PolicyPort {
        protocol: Protocol::Tcp,
        port: Some(PortRef::Number(port)),
        end_port: None,
    }
}

pub fn pods_peer(ns: Option<LabelSelector>, pods: Option<LabelSelector>) -> Peer {
    Peer::Pods {
        namespace_selector: ns,
        pod_selector: pods,
    }
}

/// Local pods: every pod of `state` on node "n1", ports from 3 in key order.
pub fn local_pods(state: &ClusterState) -> Vec<LocalPod> {
    state
        .pods
        .values()
        .filter(|p| p.node_name == "n1")
        .zip(3u32..)
        .map(|(p, ofport)| LocalPod {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            ip: p.ip,
            ofport,
            ip6: None,
        })
        .collect()
}

/// The whole flow text of node "n1": node, pod and tunnel flows (the
/// agent's [`desired::base_flows`], without the tunnel guard) and `pf`.
pub fn node_text(local: &[LocalPod], pf: &PolicyFlows) -> String {
    let pods: Vec<PodPort> = local
        .iter()
        .map(|l| PodPort {
            ofport: l.ofport,
            ip: l.ip,
            mac: flows::pod_mac_of(l.ip, l.ip6),
            ip6: None,
        })
        .collect();
    let base = desired::base_flows(&Inputs {
        pods,
        tunnel: Some(Tunnel {
            ofport: TUNNEL_PORT,
            remotes: vec![remote_node()],
            node_ip: None,
            guard: false,
        }),
        ..Inputs::for_node(node())
    });
    let mut text = String::new();
    for l in base.iter().chain(&pf.flows) {
        text.push_str(l);
        text.push('\n');
    }
    text
}

/// A loaded node pipeline.
pub struct NodePipe {
    pub state: ClusterState,
    pub local: Vec<LocalPod>,
    pub pf: PolicyFlows,
    pub tables: Arc<TableSet>,
}

impl NodePipe {
    pub fn new(state: ClusterState) -> NodePipe {
        let local = local_pods(&state);
        let pf = policy_flows(&state, &local);
        let text = node_text(&local, &pf);
        let flows = parse_flow_file(&text, &ParseContext::default())
            .unwrap_or_else(|e| panic!("flows do not parse: {e}\n{text}"));
        let p = Pipeline::new();
        p.replace_all(&flows, 0)
            .unwrap_or_else(|e| panic!("flows do not load: {e}\n{text}"));
        NodePipe {
            state,
            local,
            pf,
            tables: p.snapshot(),
        }
    }

    fn local_of(&self, ip: Ipv4Addr) -> Option<&LocalPod> {
        self.local.iter().find(|l| l.ip == Some(ip))
    }

    pub fn ip_of(&self, e: &Endpoint) -> Ipv4Addr {
        match e {
            Endpoint::Pod(k) => self.state.pods[k].ip.unwrap(),
            Endpoint::External(ip) => *ip,
        }
    }

    /// The packet spec of a first packet from `src` to `dst`: from a local
    /// pod's port, from the tunnel (the other node's pod CIDR) or from the
    /// gateway (anything else).
    pub fn spec(&self, src: Ipv4Addr, dst: Ipv4Addr, l4: L4, sport: u16) -> String {
        let from_tunnel = self.local_of(src).is_none()
            && remote_node().pod_cidr.is_some_and(|c| c.contains(&src));
        self.spec_from(src, dst, l4, sport, from_tunnel)
    }

    /// [`spec`](Self::spec), from the tunnel (sent by the remote node) if
    /// `from_tunnel`, whatever the source address.
    pub fn spec_from(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        l4: L4,
        sport: u16,
        from_tunnel: bool,
    ) -> String {
        let gw_mac = flows::mac_str(&node().gateway_mac);
        let (in_port, dl_src) = match self.local_of(src) {
            _ if from_tunnel => (
                format!("{TUNNEL_PORT},tun_src={}", remote_node().ip),
                "02:00:00:00:00:01".into(),
            ),
            Some(l) => (
                l.ofport.to_string(),
                flows::mac_str(&flows::pod_mac_of(l.ip, l.ip6)),
            ),
            None => (GW_PORT.to_string(), gw_mac.clone()),
        };
        let dl_dst = match self.local_of(dst) {
            Some(l) => flows::mac_str(&flows::pod_mac_of(l.ip, l.ip6)),
            None => gw_mac,
        };
        let l4 = match l4 {
            L4::Port(p, port) => format!("{},tp_src={sport},tp_dst={port}", p.keyword()),
            L4::Other => "icmp,icmp_type=8,icmp_code=0".into(),
        };
        format!("in_port={in_port},{l4},dl_src={dl_src},dl_dst={dl_dst},nw_src={src},nw_dst={dst},nw_ttl=64")
    }

    /// Whether the packet `spec` reaches the port of `dst` (the tunnel for
    /// the other node's pod CIDR, else the gateway for a non-local address), with conntrack answering `ct` after `ct()`.
    pub fn delivered(&self, spec: &str, dst: Ipv4Addr, ct: u32) -> (bool, String) {
        let out_port = match self.local_of(dst) {
            Some(l) => l.ofport,
            None if remote_node().pod_cidr.is_some_and(|c| c.contains(&dst)) => TUNNEL_PORT,
            None => GW_PORT,
        };
        let key = parse_packet_spec(spec, &ParseContext::default())
            .unwrap_or_else(|e| panic!("bad spec {spec}: {e}"));
        let opts = TraceOptions {
            ct_next: vec![ct],
            names: Some(Default::default()),
            ..TraceOptions::default()
        };
        let report = trace(&*self.tables, &key, &XlateEnv::default(), &opts);
        let out = report
            .passes
            .iter()
            .any(|p| p.actions.contains(&DpAction::Output(out_port)));
        (out, format!("{report}"))
    }

    /// New connection: delivered?
    pub fn new_conn(&self, src: &Endpoint, dst: &Endpoint, l4: L4) -> (bool, String) {
        let (s, d) = (self.ip_of(src), self.ip_of(dst));
        self.delivered(
            &self.spec(s, d, l4, 40000),
            d,
            ct_state::TRK | ct_state::NEW,
        )
    }

    /// A reply of a connection from `src` to `dst`: delivered?
    pub fn reply(&self, src: &Endpoint, dst: &Endpoint, l4: L4) -> (bool, String) {
        let (s, d) = (self.ip_of(src), self.ip_of(dst));
        let l4r = match l4 {
            L4::Port(p, _) => L4::Port(p, 40000),
            L4::Other => L4::Other,
        };
        let sport = match l4 {
            L4::Port(_, port) => port,
            L4::Other => 0,
        };
        self.delivered(
            &self.spec(d, s, l4r, sport),
            s,
            ct_state::TRK | ct_state::EST | ct_state::RPL,
        )
    }
}

impl NodePipe {
    /// Whether `e` is a pod attached to this node.
    pub fn is_local(&self, e: &Endpoint) -> bool {
        match e {
            Endpoint::Pod(k) => self
                .local
                .iter()
                .any(|l| l.namespace == k.0 && l.name == k.1),
            Endpoint::External(_) => false,
        }
    }

    /// What this node must do, by the interpreter: the egress of `src` if
    /// it is a local pod, AND the ingress of `dst` if it is a local pod
    /// (a remote pod's own policies are its node's business).
    pub fn expected(&self, src: &Endpoint, dst: &Endpoint, l4: L4) -> bool {
        let pod = |e: &Endpoint| match e {
            Endpoint::Pod(k) => self.state.pods.get(k),
            Endpoint::External(_) => None,
        };
        let (s_ip, d_ip) = (self.ip_of(src), self.ip_of(dst));
        let (s_pod, d_pod) = (pod(src), pod(dst));
        let egress = !self.is_local(src)
            || s_pod.is_some_and(|s| {
                oxvs_agent::policy::eval::egress_allowed(&self.state, s, d_ip, d_pod, l4)
            });
        let ingress = !self.is_local(dst)
            || d_pod.is_some_and(|d| {
                oxvs_agent::policy::eval::ingress_allowed(&self.state, d, s_ip, s_pod, l4)
            });
        egress && ingress
    }
}
