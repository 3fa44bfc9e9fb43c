//! The agent's API socket (`/run/oxvs/agent.sock`): `info`, `pod` and
//! `traceflow` (wire types in [`oxvs_api::agent`]).
//!
//! ## Traceflow
//!
//! The agent of the source pod's node builds the first packet of the
//! connection (the pod's MAC and IP; destination MAC = the destination
//! pod's when it is attached here and in this node's pod CIDR, else the
//! gateway's, as the pod's routing table would make it; TTL 64; a SYN for
//! TCP, an echo request for ICMP) and asks the switch to `trace` it through
//! the live flows, assuming a new connection at each `ct`. No traffic is
//! sent unless `inject` is set. A trace that leaves through the tunnel is
//! continued by the next node's agent with `from_tunnel`: the packet as
//! this node's switch sent it into the tunnel (MACs, TTL), arriving on that node's
//! tunnel port with the VXLAN metadata (`tun_src`, `tun_dst`).
//!
//! The switch answers with the trace's text and its structure
//! ([`oxvs_api::TraceReport`]); the hop is read from the structure only
//! ([`hop`]): every table lookup of every pass is a step, with the flow
//! that matched and the actions it executed. Each step is annotated from
//! its flow's cookie ([`annotate`], layout in [`crate::cookie`]): the
//! feature in the high 16 bits, the object in the low 48. The verdict comes
//! from the passes' outputs: the first copy sent to a local port
//! (delivered), or to the tunnel (sent to the node with that InternalIP,
//! and the next hop is that copy as it is sent: MACs, addresses, TTL); with
//! none, dropped, by the object of the step the switch says decided (the
//! last lookup, the flow whose output went to a port that does not exist,
//! or a translation error). The text is passed on for people.
//!
//! A switch too old to send the structure (text only) is refused with an
//! error that says so: `docs/operations.md`, "Upgrade", has the order.
//!
//! Everything but the socket and the switch call is a pure function of a
//! [`NodeView`] snapshot, tested with traces of real pipelines.
//!
//! ## Concurrency
//!
//! One task per connection; each request takes a fresh [`NodeView`] (short
//! locks inside [`Agent`]'s getters) and makes one blocking switch call on
//! the blocking pool. Requests never change the agent's state.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;

use oxvs_api::agent::{
    parse_agent_request, AgentRequest, FlowOwner, GatewayInfo, InfoResult, PodInfo, Proto,
    RemoteNodeInfo, TraceStep, TraceflowHop, TraceflowRequest, TunnelArrival, Verdict,
    DEFAULT_SPORT, MAX_AGENT_LINE,
};
use oxvs_api::{
    Client, Request, Response, TraceDropReason, TraceReport, TraceRequest, TraceResult,
};
use oxvs_pipeline::names;

use crate::agent::Agent;
use crate::cookie::{self, Feature};
use crate::flows::{self, NodeNet, RemoteNode};
use crate::model::{ClusterState, Labels};
use crate::policy::{Direction, RuleRef};
use crate::socket_server::{LineProtocol, Requests};
use crate::state::{AttachState, Attachment};

/// Why a request could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("'{0}' is not a pod reference (NAMESPACE/NAME)")]
    BadPodRef(String),
    #[error("'{0}' is neither a pod (NAMESPACE/NAME) nor an IPv4 address")]
    BadDestination(String),
    #[error("pod {0} is not known to node {1} (neither attached here nor in the cluster state)")]
    UnknownPod(String, String),
    #[error("pod {pod} is not attached to node {here}{}: ask the agent of its node", .node.as_ref().map(|n| format!(" (it runs on node {n})")).unwrap_or_default())]
    NotLocal {
        pod: String,
        here: String,
        node: Option<String>,
    },
    #[error("pod {0} has no IP address yet")]
    NoAddress(String),
    #[error("{0} needs a destination port (dport)")]
    NeedsPort(&'static str),
    #[error("icmp has no ports (got sport/dport)")]
    IcmpPorts,
    #[error("node {0} is not ready: {1}")]
    NotReady(String, &'static str),
    #[error("bad MAC address '{0}' in from_tunnel")]
    BadMac(String),
    #[error("the switch: {0}")]
    Switch(String),
}

/// What the API needs to know about the node, taken at once.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    pub node_name: String,
    /// The node's underlay address (for `tun_src` of outgoing hops).
    pub node_ip: Option<IpAddr>,
    pub gateway_name: String,
    pub node: Option<NodeNet>,
    pub tunnel_ofport: Option<u32>,
    pub switchd_socket: PathBuf,
    /// Ready attachments with a port.
    pub attachments: Vec<Attachment>,
    pub cluster: Arc<ClusterState>,
    pub rules: Vec<RuleRef>,
    pub remotes: Vec<RemoteNode>,
}

impl NodeView {
    /// A snapshot of `agent`.
    pub fn of(agent: &Agent) -> NodeView {
        let cfg = agent.config();
        let cluster = agent.cluster();
        let node_ip = agent.node_ip();
        NodeView {
            node_name: cfg.node_name.clone(),
            node_ip,
            gateway_name: cfg.gateway.clone(),
            node: agent.node_net(),
            tunnel_ofport: agent.tunnel_ofport(),
            switchd_socket: cfg.switchd_socket.clone(),
            attachments: agent
                .attachments()
                .into_iter()
                .filter(|a| a.state == AttachState::Ready && a.ofport.is_some())
                .collect(),
            cluster,
            rules: agent.rules(),
            remotes: agent.remotes(),
        }
    }

    fn attachment_of(&self, ns: &str, name: &str) -> Option<&Attachment> {
        self.attachments
            .iter()
            .find(|a| a.pod_namespace == ns && a.pod_name == name)
    }

    fn attachment_on(&self, ofport: u32) -> Option<&Attachment> {
        self.attachments.iter().find(|a| a.ofport == Some(ofport))
    }

    fn attachment_with_ip(&self, ip: Ipv4Addr) -> Option<&Attachment> {
        self.attachments.iter().find(|a| a.ip4() == Some(ip))
    }

    fn node_named_by_ip(&self, ip: IpAddr) -> Option<String> {
        self.remotes
            .iter()
            .find(|r| r.ip == ip)
            .map(|r| r.name.clone())
            .or_else(|| {
                self.cluster
                    .nodes
                    .values()
                    .find(|n| n.tunnel_ip(ip.is_ipv6()) == Some(ip))
                    .map(|n| n.name.clone())
            })
    }

    /// The remote node whose flows carry `cookie`, and its underlay
    /// address (an IPv6 one is not in the cookie: it is found by
    /// comparing).
    fn remote_of_cookie(&self, c: u64) -> (Option<String>, IpAddr) {
        if let Some(ip) = cookie::remote_node_ip(c) {
            return (self.node_named_by_ip(IpAddr::V4(ip)), IpAddr::V4(ip));
        }
        match self.remotes.iter().find(|r| cookie::remote_node(r.ip) == c) {
            Some(r) => (Some(r.name.clone()), r.ip),
            None => (None, IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
        }
    }
}

fn split_pod_ref(s: &str) -> Option<(&str, &str)> {
    let (ns, name) = s.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then_some((ns, name))
}

fn pod_info_of(a: &Attachment, node: &str) -> PodInfo {
    PodInfo {
        namespace: a.pod_namespace.clone(),
        name: a.pod_name.clone(),
        node: node.to_string(),
        ip: a.ip4(),
        ip6: a.ip6(),
        local: true,
        mac: Some(a.mac.clone()),
        ofport: a.ofport,
    }
}

/// `info`.
pub fn info(view: &NodeView) -> InfoResult {
    InfoResult {
        node: view.node_name.clone(),
        pod_cidr: view
            .node
            .as_ref()
            .and_then(|n| n.pod_cidr4())
            .map(|c| c.to_string()),
        pod_cidr6: view
            .node
            .as_ref()
            .and_then(|n| n.pod_cidr6())
            .map(|c| c.to_string()),
        gateway: view.node.as_ref().map(|n| GatewayInfo {
            name: view.gateway_name.clone(),
            ip: n.ipv4.as_ref().map(|v4| v4.gateway_ip),
            ip6: n.ipv6.as_ref().map(|v6| v6.gateway_ip),
            mac: flows::mac_str(&n.gateway_mac),
            ofport: n.gateway_ofport,
        }),
        tunnel_ofport: view.tunnel_ofport,
        switchd_socket: view.switchd_socket.display().to_string(),
        remotes: view
            .remotes
            .iter()
            .map(|r| RemoteNodeInfo {
                name: r.name.clone(),
                pod_cidr: r.pod_cidr.map(|c| c.to_string()),
                pod_cidr6: r.pod_cidr6.map(|c| c.to_string()),
                ip: r.ip,
            })
            .collect(),
        pods: view
            .attachments
            .iter()
            .filter(|a| !a.pod_name.is_empty())
            .map(|a| pod_info_of(a, &view.node_name))
            .collect(),
    }
}

/// `pod`: a local attachment first, else the cluster state.
pub fn pod_info(view: &NodeView, namespace: &str, name: &str) -> Result<PodInfo, ApiError> {
    if let Some(a) = view.attachment_of(namespace, name) {
        return Ok(pod_info_of(a, &view.node_name));
    }
    match view
        .cluster
        .pods
        .get(&(namespace.to_string(), name.to_string()))
    {
        Some(p) => Ok(PodInfo {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            node: p.node_name.clone(),
            ip: p.ip,
            ip6: p.ip6,
            local: false,
            mac: None,
            ofport: None,
        }),
        None => Err(ApiError::UnknownPod(
            format!("{namespace}/{name}"),
            view.node_name.clone(),
        )),
    }
}

fn l4_fields(req: &TraceflowRequest, v6: bool) -> Result<String, ApiError> {
    match req.proto {
        Proto::Icmp => {
            if req.sport.is_some() || req.dport.is_some() {
                return Err(ApiError::IcmpPorts);
            }
            // An echo request.
            Ok(match v6 {
                false => "icmp_type=8,icmp_code=0".into(),
                true => "icmp_type=128,icmp_code=0".into(),
            })
        }
        p => {
            let dport = req.dport.ok_or(ApiError::NeedsPort(p.keyword()))?;
            let sport = req.sport.unwrap_or(DEFAULT_SPORT);
            let mut s = format!("tp_src={sport},tp_dst={dport}");
            if p == Proto::Tcp {
                s.push_str(",tcp_flags=0x2");
            }
            Ok(s)
        }
    }
}

/// The packet spec of the first packet of `req` on this node.
/// Over IPv6 (`req.ipv6`, an IPv6 destination, or a tunnel arrival of
/// IPv6) the packet is the IPv6 one: `tcp6`, `ipv6_src`/`ipv6_dst`, the
/// hop limit in `nw_ttl`.
pub fn build_packet(view: &NodeView, req: &TraceflowRequest) -> Result<String, ApiError> {
    // A tunnel arrival is of its addresses' family, whatever else the
    // request says.
    let v6 = match &req.from_tunnel {
        Some(t) => t.src_ip.is_ipv6(),
        // An IPv6-only node has nothing else.
        None => {
            req.ipv6
                || req.dst.parse::<std::net::Ipv6Addr>().is_ok()
                || view.node.as_ref().is_some_and(|n| n.ipv4.is_none())
        }
    };
    let l4 = l4_fields(req, v6)?;
    let (proto, src_f, dst_f) = match v6 {
        false => (req.proto.keyword(), "nw_src", "nw_dst"),
        true => (req.proto.keyword6(), "ipv6_src", "ipv6_dst"),
    };
    if let Some(t) = &req.from_tunnel {
        let Some(tun) = view.tunnel_ofport else {
            return Err(ApiError::NotReady(
                view.node_name.clone(),
                "it has no tunnel port",
            ));
        };
        for m in [&t.src_mac, &t.dst_mac] {
            if flows::parse_mac(m).is_none() {
                return Err(ApiError::BadMac(m.clone()));
            }
        }
        if t.src_ip.is_ipv6() != t.dst_ip.is_ipv6() {
            return Err(ApiError::BadDestination(format!(
                "{} -> {} (mixed address families)",
                t.src_ip, t.dst_ip
            )));
        }
        if t.tun_src.is_ipv6() != t.tun_dst.is_ipv6() {
            return Err(ApiError::BadDestination(format!(
                "tunnel {} -> {} (mixed address families)",
                t.tun_src, t.tun_dst
            )));
        }
        return Ok(format!(
            "in_port={tun},{proto},{}={},{}={},dl_src={},dl_dst={},{src_f}={},{dst_f}={},nw_ttl={},{l4}",
            flows::tun_field(t.tun_src, "src"),
            t.tun_src,
            flows::tun_field(t.tun_dst, "dst"),
            t.tun_dst,
            t.src_mac,
            t.dst_mac,
            t.src_ip,
            t.dst_ip,
            t.ttl
        ));
    }
    let Some(node) = &view.node else {
        return Err(ApiError::NotReady(
            view.node_name.clone(),
            "its gateway is not discovered yet",
        ));
    };
    let (sns, sname) =
        split_pod_ref(&req.src).ok_or_else(|| ApiError::BadPodRef(req.src.clone()))?;
    let Some(src) = view.attachment_of(sns, sname) else {
        return Err(
            match view.cluster.pods.get(&(sns.to_string(), sname.to_string())) {
                Some(p) => ApiError::NotLocal {
                    pod: req.src.clone(),
                    here: view.node_name.clone(),
                    node: (!p.node_name.is_empty()).then(|| p.node_name.clone()),
                },
                None => ApiError::UnknownPod(req.src.clone(), view.node_name.clone()),
            },
        );
    };
    let src_port = src.ofport.unwrap_or_default();
    if v6 {
        return build_packet6(view, node, req, src, src_port, proto, &l4);
    }
    let no_v4 = |what: &str| ApiError::NoAddress(format!("{what} (no IPv4 address)"));
    let src_ip = src.ip4().ok_or_else(|| no_v4(&req.src))?;
    let dst_ip = match req.dst.parse::<Ipv4Addr>() {
        Ok(ip) => ip,
        Err(_) => {
            let (dns, dname) =
                split_pod_ref(&req.dst).ok_or_else(|| ApiError::BadDestination(req.dst.clone()))?;
            match view.attachment_of(dns, dname) {
                Some(a) => a.ip4().ok_or_else(|| no_v4(&req.dst))?,
                None => pod_info(view, dns, dname)?
                    .ip
                    .ok_or_else(|| ApiError::NoAddress(req.dst.clone()))?,
            }
        }
    };
    let dst_mac = match view.attachment_with_ip(dst_ip) {
        Some(a) if node.holds(dst_ip.into()) && node.holds(src_ip.into()) => a.mac.clone(),
        _ => flows::mac_str(&node.gateway_mac),
    };
    Ok(format!(
        "in_port={src_port},{proto},dl_src={},dl_dst={dst_mac},nw_src={},nw_dst={dst_ip},nw_ttl=64,{l4}",
        src.mac, src_ip
    ))
}

/// [`build_packet`] over IPv6: from the source pod's IPv6 address to the
/// destination pod's (or the IPv6 address given); to a local pod of the
/// same IPv6 subnet by its MAC, else to the gateway's.
fn build_packet6(
    view: &NodeView,
    node: &NodeNet,
    req: &TraceflowRequest,
    src: &Attachment,
    src_port: u32,
    proto: &str,
    l4: &str,
) -> Result<String, ApiError> {
    let no_v6 = |what: &str| ApiError::NoAddress(format!("{what} (no IPv6 address)"));
    let src_ip = src.ipv6.map(|v| v.ip).ok_or_else(|| no_v6(&req.src))?;
    let dst_ip = match req.dst.parse::<std::net::Ipv6Addr>() {
        Ok(ip) => ip,
        Err(_) => {
            let (dns, dname) =
                split_pod_ref(&req.dst).ok_or_else(|| ApiError::BadDestination(req.dst.clone()))?;
            match view.attachment_of(dns, dname) {
                Some(a) => a.ipv6.map(|v| v.ip).ok_or_else(|| no_v6(&req.dst))?,
                None => pod_info(view, dns, dname)?
                    .ip6
                    .ok_or_else(|| no_v6(&req.dst))?,
            }
        }
    };
    let local = node
        .ipv6
        .as_ref()
        .is_some_and(|v6| v6.pod_cidr.contains(&dst_ip) && v6.pod_cidr.contains(&src_ip));
    let dst_mac = match view
        .attachments
        .iter()
        .find(|a| a.ipv6.is_some_and(|v| v.ip == dst_ip))
    {
        Some(a) if local => a.mac.clone(),
        _ => flows::mac_str(&node.gateway_mac),
    };
    Ok(format!(
        "in_port={src_port},{proto},dl_src={},dl_dst={dst_mac},ipv6_src={src_ip},ipv6_dst={dst_ip},nw_ttl=64,{l4}",
        src.mac
    ))
}

fn direction_of_table(table: u8) -> Option<Direction> {
    if (names::EGRESS_RULE.id..=names::EGRESS_METRIC.id).contains(&table) {
        Some(Direction::Egress)
    } else if (names::INGRESS_RULE.id..=names::INGRESS_METRIC.id).contains(&table) {
        Some(Direction::Ingress)
    } else {
        None
    }
}

fn direction_str(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    }
}

/// The policies (`namespace/name`) selecting pod `ns/name` in direction `d`.
fn isolating_policies(cluster: &ClusterState, ns: &str, name: &str, d: Direction) -> Vec<String> {
    let labels: Labels = cluster
        .pods
        .get(&(ns.to_string(), name.to_string()))
        .map(|p| p.labels.clone())
        .unwrap_or_default();
    cluster
        .policies
        .values()
        .filter(|p| p.namespace == ns)
        .filter(|p| match d {
            Direction::Ingress => p.ingress_isolation,
            Direction::Egress => p.egress_isolation,
        })
        .filter(|p| p.pod_selector.matches(&labels))
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect()
}

/// The owner of the flow of `step` and a line for people.
pub fn annotate(view: &NodeView, step: &TraceStep) -> (Option<FlowOwner>, String) {
    if !step.matched {
        return (None, "no flow (table miss)".into());
    }
    let c = step.cookie;
    let obj = cookie::object(c);
    let pod_name = |port: u32| {
        view.attachment_on(port)
            .filter(|a| !a.pod_name.is_empty())
            .map(Attachment::pod_ref)
    };
    match Feature::of(c) {
        Some(Feature::Pipeline) => (Some(FlowOwner::Pipeline), "pipeline default".into()),
        Some(Feature::Pod) => {
            let ofport = u32::try_from(obj).unwrap_or(u32::MAX);
            let pod = pod_name(ofport);
            let text = match &pod {
                Some(p) => format!("pod {p} (port {ofport})"),
                None => format!("pod on port {ofport} (not attached now)"),
            };
            (Some(FlowOwner::Pod { ofport, pod }), text)
        }
        Some(Feature::Node) if obj == cookie::NODE_GATEWAY => (
            Some(FlowOwner::Gateway),
            format!("gateway {}", view.gateway_name),
        ),
        Some(Feature::Node) if obj == cookie::NODE_TUNNEL => {
            (Some(FlowOwner::Tunnel), "tunnel".into())
        }
        Some(Feature::Node) if obj == cookie::NODE_TUNNEL_UNKNOWN_SOURCE => (
            Some(FlowOwner::Tunnel),
            "tunnel guard: the outer source is not a known node (dropped)".into(),
        ),
        Some(Feature::Node) if obj == cookie::NODE_POD_TO_TUNNEL => (
            Some(FlowOwner::Tunnel),
            "tunnel guard: pods may not send to a node's VXLAN port (dropped)".into(),
        ),
        Some(Feature::PolicyRule) => {
            let id = u32::try_from(obj).unwrap_or(u32::MAX);
            match view.rules.iter().find(|r| r.id == id) {
                Some(r) => {
                    let policy = format!("{}/{}", r.policy.0, r.policy.1);
                    let dir = direction_str(r.direction);
                    let text = format!("NetworkPolicy {policy} {dir}[{}]", r.index);
                    (
                        Some(FlowOwner::PolicyRule {
                            id,
                            policy: Some(policy),
                            direction: Some(dir.into()),
                            index: Some(r.index),
                        }),
                        text,
                    )
                }
                None => (
                    Some(FlowOwner::PolicyRule {
                        id,
                        policy: None,
                        direction: None,
                        index: None,
                    }),
                    format!("NetworkPolicy rule {id} (unknown to this agent now)"),
                ),
            }
        }
        Some(Feature::Isolation) if obj == 0 => (
            Some(FlowOwner::NodeExemption),
            "pod <-> its own node: always allowed (no policy applies)".into(),
        ),
        Some(Feature::Isolation) => {
            let ofport = u32::try_from(obj).unwrap_or(u32::MAX);
            let dir = direction_of_table(step.table);
            let att = view
                .attachment_on(ofport)
                .filter(|a| !a.pod_name.is_empty());
            let policies = match (att, dir) {
                (Some(a), Some(d)) => {
                    isolating_policies(&view.cluster, &a.pod_namespace, &a.pod_name, d)
                }
                _ => Vec::new(),
            };
            let dir_s = dir.map(direction_str);
            let pod = att.map(Attachment::pod_ref);
            let who = match policies.as_slice() {
                [] => "NetworkPolicy isolation".to_string(),
                [one] => format!("NetworkPolicy {one}"),
                many => format!("NetworkPolicies {}", many.join(", ")),
            };
            let text = match (dir_s, &pod) {
                (Some(d), _) if !policies.is_empty() => format!("{who} {d} (isolation)"),
                (Some(d), Some(p)) => format!("{who} of pod {p} {d}"),
                (_, Some(p)) => format!("{who} of pod {p}"),
                _ => format!("{who} of the pod on port {ofport}"),
            };
            (
                Some(FlowOwner::Isolation {
                    ofport,
                    pod,
                    direction: dir_s.map(str::to_string),
                    policies,
                }),
                text,
            )
        }
        Some(Feature::RemoteNode) => {
            let (node, ip) = view.remote_of_cookie(c);
            let text = match &node {
                Some(n) => format!("remote node {n} ({ip})"),
                None => format!("remote node {ip}"),
            };
            (Some(FlowOwner::RemoteNode { ip, node }), text)
        }
        Some(Feature::Service) => {
            let group_id = u32::try_from(obj).unwrap_or(0);
            let service = crate::proxy::service_ports(&view.cluster, &view.node_name)
                .into_iter()
                .find(|sp| sp.group_id == group_id)
                .map(|sp| {
                    let port = if sp.port_name.is_empty() {
                        sp.port.to_string()
                    } else {
                        format!("{} ({})", sp.port, sp.port_name)
                    };
                    format!(
                        "{}/{} {}:{port}/{} ({} ready endpoints)",
                        sp.service.0,
                        sp.service.1,
                        sp.cluster_ip,
                        sp.protocol.keyword(),
                        sp.endpoints.len()
                    )
                });
            let text = match &service {
                Some(s) => format!("Service {s}"),
                None => format!("Service port of group {group_id}"),
            };
            (Some(FlowOwner::Service { group_id, service }), text)
        }
        _ => (
            Some(FlowOwner::Unknown { cookie: c }),
            format!("cookie {c:#x} (no known feature)"),
        ),
    }
}

/// The steps of `trace`, every pass in order (not annotated yet), and
/// where each pass's steps start.
fn steps_of(trace: &TraceReport) -> (Vec<TraceStep>, Vec<usize>) {
    let mut steps = Vec::new();
    let mut starts = Vec::new();
    for (pass, p) in trace.passes.iter().enumerate() {
        starts.push(steps.len());
        for l in &p.steps {
            let mut actions: Vec<String> = l.actions.iter().map(|a| a.action.clone()).collect();
            if actions.is_empty() {
                // A miss, or a flow without actions (the trace says `drop`).
                actions.push("drop".into());
            }
            steps.push(TraceStep {
                pass,
                table: l.table,
                table_name: l.table_name.clone(),
                matched: l.flow.is_some(),
                priority: l.flow.as_ref().map(|f| f.priority),
                cookie: l.flow.as_ref().map_or(0, |f| f.cookie),
                matches: l
                    .flow
                    .as_ref()
                    .map(|f| f.matches.clone())
                    .unwrap_or_default(),
                actions,
                owner: None,
                annotation: String::new(),
            });
        }
    }
    (steps, starts)
}

/// The hop of the switch's trace of `packet` (`text` and its structure
/// `trace`): steps annotated, verdict, next hop.
pub fn hop(
    view: &NodeView,
    packet: &str,
    text: &str,
    trace: &TraceReport,
    injected: bool,
) -> TraceflowHop {
    let (mut steps, starts) = steps_of(trace);
    for s in &mut steps {
        let (owner, ann) = annotate(view, s);
        s.owner = owner;
        s.annotation = ann;
    }
    let mut allowed_by: Vec<String> = Vec::new();
    for s in &steps {
        if matches!(s.owner, Some(FlowOwner::PolicyRule { .. }))
            && !allowed_by.contains(&s.annotation)
        {
            allowed_by.push(s.annotation.clone());
        }
    }
    let mut next = None;
    let verdict = match trace.first_output() {
        Some((_, out)) if Some(out.port) == view.tunnel_ofport => {
            let tun_dst = out.tunnel.as_ref().map(|t| t.dst);
            let node = tun_dst.and_then(|ip| view.node_named_by_ip(ip));
            let h = &out.headers;
            if let (Some(tun_dst), Some(tun_src), Some(src_ip), Some(dst_ip)) =
                (tun_dst, view.node_ip, h.nw_src, h.nw_dst)
            {
                next = Some(TunnelArrival {
                    from_node: view.node_name.clone(),
                    tun_src,
                    tun_dst,
                    src_mac: h.dl_src.clone(),
                    dst_mac: h.dl_dst.clone(),
                    src_ip,
                    dst_ip,
                    ttl: h.nw_ttl,
                });
            }
            Verdict::Tunnel {
                ofport: out.port,
                tun_dst,
                node,
            }
        }
        Some((_, out)) => {
            let port = out.port;
            let to = if view.node.as_ref().map(|n| n.gateway_ofport) == Some(port) {
                format!("gateway {}", view.gateway_name)
            } else if let Some(a) = view.attachment_on(port) {
                format!("pod {}", a.pod_ref())
            } else {
                format!("port {port}")
            };
            Verdict::Delivered { ofport: port, to }
        }
        None => {
            // The step that decided: the switch's word for the last pass
            // that dropped, else the last step.
            let drop = trace.last_drop();
            let decided = drop
                .and_then(|(pass, d)| {
                    // Only a step of that pass (the answer is not trusted).
                    let step = d.step.filter(|&i| i < trace.passes[pass].steps.len())?;
                    Some(starts.get(pass)? + step)
                })
                .and_then(|i| steps.get(i))
                .or(steps.last());
            let by = match (drop.map(|(_, d)| d), decided) {
                (Some(d), _) if d.reason == TraceDropReason::Error => {
                    format!("a translation error ({})", d.detail)
                }
                (Some(d), Some(s))
                    if matches!(
                        d.reason,
                        TraceDropReason::NonexistentPort | TraceDropReason::OutputSkipped
                    ) =>
                {
                    format!("{}: {}", s.annotation, d.detail)
                }
                (_, Some(s)) => s.annotation.clone(),
                (_, None) => "nothing (the trace has no steps)".into(),
            };
            Verdict::Dropped {
                by,
                table: decided.map(|s| s.table),
                table_name: decided.and_then(|s| s.table_name.clone()),
            }
        }
    };
    TraceflowHop {
        node: view.node_name.clone(),
        packet: packet.to_string(),
        text: text.to_string(),
        steps,
        datapath_actions: trace
            .passes
            .iter()
            .map(|p| p.datapath_actions.clone())
            .collect(),
        verdict,
        allowed_by,
        next,
        injected,
    }
}

async fn traceflow(agent: &Agent, req: TraceflowRequest) -> Result<TraceflowHop, ApiError> {
    let view = NodeView::of(agent);
    let packet = build_packet(&view, &req)?;
    let path = view.switchd_socket.clone();
    let timeout = agent.config().switch_timeout;
    let treq = Request::Trace(TraceRequest {
        spec: Some(packet.clone()),
        ct_next: vec!["trk,new".into()],
        names: true,
        inject: req.inject,
        ..TraceRequest::default()
    });
    let r: TraceResult = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(&path)?;
        c.set_timeout(timeout);
        c.call_as::<TraceResult>(&treq)
    })
    .await
    .map_err(|e| ApiError::Switch(format!("internal task failed: {e}")))?
    .map_err(|e| ApiError::Switch(e.to_string()))?;
    hop_of(&view, &packet, &r)
}

/// [`hop`] of the switch's answer; refused when it has no structure (a
/// switch older than this agent, which sends the text only).
pub fn hop_of(view: &NodeView, packet: &str, r: &TraceResult) -> Result<TraceflowHop, ApiError> {
    match &r.trace {
        Some(trace) => Ok(hop(view, packet, &r.text, trace, r.injected)),
        None => Err(ApiError::Switch(
            "it sent the trace as text only: oxvs-switchd is older than this agent; \
             upgrade it (docs/operations.md, \"Upgrade\")"
                .into(),
        )),
    }
}

/// Answers one request line.
pub async fn handle_line(agent: &Agent, line: &str) -> Response {
    let req = match parse_agent_request(line) {
        Ok(r) => r,
        Err(e) => return Response::error(e),
    };
    let op = req.op();
    let r = match req {
        AgentRequest::Info => Ok(Response::ok(&info(&NodeView::of(agent)))),
        AgentRequest::Pod { namespace, name } => {
            pod_info(&NodeView::of(agent), &namespace, &name).map(|p| Response::ok(&p))
        }
        AgentRequest::Traceflow(t) => traceflow(agent, t).await.map(|h| Response::ok(&h)),
    };
    r.unwrap_or_else(|e| {
        tracing::debug!(op, error = %e, "API request refused");
        Response::error(e.to_string())
    })
}

/// The API socket's protocol, served by [`crate::socket_server`]: any
/// number of request lines per connection, each answered by one
/// [`Response`] line ([`handle_line`]).
pub struct ApiSocket;

impl LineProtocol for ApiSocket {
    type State = Agent;
    const NAME: &'static str = "api";
    const MAX_LINE: usize = MAX_AGENT_LINE;
    const REQUESTS: Requests = Requests::Many;

    fn busy(max_connections: usize) -> String {
        Response::busy(format!(
            "busy: the oxvs agent serves {max_connections} API connections already (--api-max-connections); retry"
        ))
        .to_line()
    }

    fn refused(why: &str) -> String {
        Response::error(why).to_line()
    }

    async fn handle(agent: &Agent, line: &str) -> String {
        handle_line(agent, line).await.to_line()
    }
}

/// The pure parts, with traces of real pipelines (in-process, no switch).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LabelSelector, NetworkPolicy, Node, Pod};
    use oxvs_pipeline::names::TableNames;
    use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
    use oxvs_pipeline::tables::Pipeline;
    use oxvs_pipeline::trace::{trace, TraceOptions};
    use oxvs_pipeline::xlate::XlateEnv;

    const TUN: u32 = 9;

    fn node_net() -> NodeNet {
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

    fn att(name: &str, ofport: u32, last: u8) -> Attachment {
        let ip = Ipv4Addr::new(10, 244, 0, last);
        Attachment {
            container_id: format!("c-{name}"),
            ifname: "eth0".into(),
            netns: String::new(),
            host_ifname: format!("veth{name}"),
            pod_namespace: "x".into(),
            pod_name: name.into(),
            ipv4: Some(crate::state::PodIpv4 {
                ip,
                prefix_len: 24,
                gateway: "10.244.0.1".parse().unwrap(),
            }),
            mac: flows::mac_str(&flows::pod_mac(ip)),
            mtu: 1450,
            ofport: Some(ofport),
            state: AttachState::Ready,
            ipv6: None,
            qdisc: None,
        }
    }

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn policy(name: &str, selector: Labels, ingress: bool, egress: bool) -> NetworkPolicy {
        NetworkPolicy {
            namespace: "x".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            pod_selector: LabelSelector {
                match_labels: selector,
                match_expressions: vec![],
            },
            ingress_isolation: ingress,
            egress_isolation: egress,
            ingress: vec![],
            egress: vec![],
        }
    }

    fn pod(name: &str, node: &str, ip: &str, l: Labels) -> Pod {
        Pod {
            namespace: "x".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: l,
            node_name: node.into(),
            ip: Some(ip.parse().unwrap()),
            host_network: false,
            ports: vec![],
            ip6: None,
        }
    }

    fn view() -> NodeView {
        let mut c = ClusterState::default();
        for p in [
            pod("a", "n1", "10.244.0.3", labels(&[("app", "a")])),
            pod("b", "n1", "10.244.0.4", labels(&[("app", "b")])),
            pod("r", "n2", "10.244.1.7", labels(&[("app", "r")])),
        ] {
            c.pods.insert(p.key(), p);
        }
        for p in [
            policy("deny-all", Labels::new(), true, false),
            policy("allow-a", labels(&[("app", "b")]), true, false),
            policy("egress-only", Labels::new(), false, true),
            policy("other-app", labels(&[("app", "zzz")]), true, false),
        ] {
            c.policies.insert(p.key(), p);
        }
        for (n, ip, cidr) in [
            ("n1", "192.168.77.11", "10.244.0.0/24"),
            ("n2", "192.168.77.12", "10.244.1.0/24"),
        ] {
            c.nodes.insert(
                n.into(),
                Node {
                    name: n.into(),
                    pod_cidr: Some(cidr.parse().unwrap()),
                    pod_cidr6: None,
                    internal_ip: Some(ip.parse().unwrap()),
                    internal_ip6: None,
                },
            );
        }
        NodeView {
            node_name: "n1".into(),
            node_ip: Some("192.168.77.11".parse().unwrap()),
            gateway_name: "oxvs-gw0".into(),
            node: Some(node_net()),
            tunnel_ofport: Some(TUN),
            switchd_socket: "/run/oxvs/switchd.sock".into(),
            attachments: vec![att("a", 3, 3), att("b", 4, 4)],
            cluster: Arc::new(c),
            rules: vec![RuleRef {
                id: 7,
                policy: ("x".into(), "allow-a".into()),
                uid: "uid-allow-a".into(),
                direction: Direction::Ingress,
                index: 0,
            }],
            remotes: vec![RemoteNode {
                name: "n2".into(),
                pod_cidr: Some("10.244.1.0/24".parse().unwrap()),
                ip: "192.168.77.12".parse().unwrap(),
                pod_cidr6: None,
            }],
        }
    }

    /// The node's flows plus hand-written policy flows in the translator's
    /// cookie layout: rule 7 allows a -> b tcp/80; b is isolated for ingress.
    fn flows_text(with_policy: bool) -> String {
        let v = view();
        let node = node_net();
        let mut text = crate::desired::compute(&crate::desired::Inputs {
            pods: crate::desired::pod_ports(&v.attachments),
            tunnel: Some(crate::desired::Tunnel {
                ofport: TUN,
                remotes: v.remotes.clone(),
                node_ip: None,
                guard: false,
            }),
            ..crate::desired::Inputs::for_node(node)
        })
        .text();
        if with_policy {
            let to_b = oxvs_pipeline::regs::TARGET_OFPORT.matching(4);
            text.push_str(&format!("table=IngressRule, priority=200, cookie={:#x}, tcp, {to_b}, nw_src=10.244.0.3, tp_dst=80, actions=goto_table:IngressMetric\n", cookie::rule(7)));
            text.push_str(&format!(
                "table=IngressDefaultRule, priority=200, cookie={:#x}, ip, {to_b}, actions=drop\n",
                cookie::isolation(4)
            ));
        }
        text
    }

    /// The switch's answer for `spec`: the trace through the node's flows
    /// (as `trace` makes it: text and structure from one report).
    fn run_trace(spec: &str, with_policy: bool) -> TraceResult {
        trace_flows(&flows_text(with_policy), spec)
    }

    /// Traces `spec` through the flows `text` (first packet of a new
    /// connection).
    fn trace_flows(text: &str, spec: &str) -> TraceResult {
        let flows = parse_flow_file(text, &ParseContext::default()).unwrap();
        let p = Pipeline::new();
        p.replace_all(&flows, 0).unwrap();
        let key = parse_packet_spec(spec, &ParseContext::default()).unwrap();
        let opts = TraceOptions {
            names: Some(TableNames::default()),
            ct_next: vec![
                oxvs_pipeline::field::ct_state::TRK | oxvs_pipeline::field::ct_state::NEW,
            ],
            ..TraceOptions::default()
        };
        let env = XlateEnv::with_ports(vec![2, 3, 4, TUN]);
        TraceResult::from_report(&trace(&*p.snapshot(), &key, &env, &opts), false)
    }

    fn hop_for(v: &NodeView, spec: &str, r: &TraceResult) -> TraceflowHop {
        hop_of(v, spec, r).unwrap()
    }

    fn req(src: &str, dst: &str, proto: Proto, dport: Option<u16>) -> TraceflowRequest {
        TraceflowRequest {
            src: src.into(),
            dst: dst.into(),
            proto,
            sport: None,
            dport,
            inject: false,
            from_tunnel: None,
            ipv6: false,
        }
    }

    /// The hop of `r` on `v` through the flows `text`.
    fn traceflow_through(v: &NodeView, text: &str, r: &TraceflowRequest) -> TraceflowHop {
        let spec = build_packet(v, r).unwrap();
        hop_for(v, &spec, &trace_flows(text, &spec))
    }

    fn traceflow_hop(r: &TraceflowRequest, with_policy: bool) -> TraceflowHop {
        let v = view();
        let spec = build_packet(&v, r).unwrap();
        hop_for(&v, &spec, &run_trace(&spec, with_policy))
    }

    /// Steps come from the switch's structure: each lookup with its own
    /// actions (a resubmitted table's actions are not its caller's), misses
    /// and flows without actions say `drop`, passes are numbered.
    #[test]
    fn steps_are_read_from_the_structure() {
        let flows = parse_flow_file(
            "table=0, priority=10, cookie=0x2000000000003, in_port=3, ip actions=resubmit(,5),load:0x1->NXM_NX_REG0[],goto_table:10
             table=5, priority=7, ip actions=load:0x2->NXM_NX_REG1[]
             table=10, priority=1, cookie=0x1000000000000, ip actions=ct(table=20,zone=1)
             table=20, priority=5, ct_state=+new+trk, ip actions=drop",
            &ParseContext::default(),
        )
        .unwrap();
        let p = Pipeline::new();
        p.replace_all(&flows, 0).unwrap();
        let key = parse_packet_spec("in_port=3,ip", &ParseContext::default()).unwrap();
        let opts = TraceOptions {
            names: Some(TableNames::default()),
            ..TraceOptions::default()
        };
        let env = XlateEnv::with_ports(vec![2, 3, 4, TUN]);
        let r = TraceResult::from_report(&trace(&*p.snapshot(), &key, &env, &opts), false);
        let h = hop_for(&view(), "in_port=3,ip", &r);
        let at: Vec<(usize, u8, bool)> = h
            .steps
            .iter()
            .map(|s| (s.pass, s.table, s.matched))
            .collect();
        assert_eq!(
            at,
            vec![(0, 0, true), (0, 5, true), (0, 10, true), (1, 20, true)],
            "{}",
            h.text
        );
        let s0 = &h.steps[0];
        assert_eq!(s0.table_name.as_deref(), Some("Classifier"));
        assert_eq!((s0.priority, s0.cookie), (Some(10), 0x2000000000003));
        assert_eq!(s0.matches, "ip,in_port=3");
        assert_eq!(s0.annotation, "pod x/a (port 3)");
        assert_eq!(
            s0.actions,
            vec![
                "resubmit(,5)",
                "load:0x1->NXM_NX_REG0[]",
                "goto_table:SpoofGuard"
            ],
            "{}",
            h.text
        );
        assert_eq!(h.steps[1].actions, vec!["load:0x2->NXM_NX_REG1[]"]);
        assert_eq!((h.steps[1].cookie, h.steps[1].priority), (0, Some(7)));
        assert_eq!(h.steps[3].actions, vec!["drop"]);
        assert_eq!(h.datapath_actions.len(), 2);
        assert_eq!(
            h.verdict,
            Verdict::Dropped {
                by: "cookie 0x0 (no known feature)".into(),
                table: Some(20),
                table_name: Some("ARPResponder".into()),
            },
            "{}",
            h.text
        );
    }

    /// An output to a port the switch does not have sends nothing: the
    /// packet is dropped by the flow that sent it there, and the hop says
    /// why. A switch that sends only text is refused with a reason.
    #[test]
    fn outputs_to_missing_ports_drop_and_text_only_switches_are_refused() {
        let flows = parse_flow_file(
            "table=0, priority=10, cookie=0x2000000000003, in_port=3, ip actions=output:7",
            &ParseContext::default(),
        )
        .unwrap();
        let p = Pipeline::new();
        p.replace_all(&flows, 0).unwrap();
        let key = parse_packet_spec("in_port=3,ip", &ParseContext::default()).unwrap();
        let env = XlateEnv::with_ports(vec![2, 3, 4, TUN]);
        let r = TraceResult::from_report(
            &trace(&*p.snapshot(), &key, &env, &TraceOptions::default()),
            false,
        );
        let v = view();
        let h = hop_for(&v, "in_port=3,ip", &r);
        assert_eq!(
            h.verdict,
            Verdict::Dropped {
                by: "pod x/a (port 3): output to nonexistent port 7".into(),
                table: Some(0),
                table_name: None,
            },
            "{}",
            h.text
        );
        assert!(h.text.contains(" >> Nonexistent output port"), "{}", h.text);
        assert_eq!(h.datapath_actions, vec!["drop".to_string()]);
        let old = TraceResult { trace: None, ..r };
        let e = hop_of(&v, "in_port=3,ip", &old).unwrap_err().to_string();
        assert!(e.contains("older than this agent"), "{e}");
    }

    #[test]
    fn packets_are_built_as_the_pod_would_send_them() {
        let v = view();
        let p = build_packet(&v, &req("x/a", "x/b", Proto::Tcp, Some(80))).unwrap();
        assert_eq!(p, "in_port=3,tcp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.3,nw_dst=10.244.0.4,nw_ttl=64,tp_src=49152,tp_dst=80,tcp_flags=0x2");
        // Remote pod (by name, from the cluster) and an outside IP: via the gateway MAC.
        let p = build_packet(&v, &req("x/a", "x/r", Proto::Udp, Some(53))).unwrap();
        assert!(
            p.contains("dl_dst=0a:58:0a:f4:00:01,nw_src=10.244.0.3,nw_dst=10.244.1.7"),
            "{p}"
        );
        let p = build_packet(&v, &req("x/a", "8.8.8.8", Proto::Icmp, None)).unwrap();
        assert!(
            p.ends_with("nw_dst=8.8.8.8,nw_ttl=64,icmp_type=8,icmp_code=0"),
            "{p}"
        );
        for (r, want) in [
            (
                req("x/r", "x/a", Proto::Tcp, Some(80)),
                "not attached to node n1 (it runs on node n2)",
            ),
            (
                req("x/zz", "x/a", Proto::Tcp, Some(80)),
                "not known to node n1",
            ),
            (req("a", "x/a", Proto::Tcp, Some(80)), "not a pod reference"),
            (req("x/a", "nowhere", Proto::Tcp, Some(80)), "neither a pod"),
            (
                req("x/a", "x/zz", Proto::Tcp, Some(80)),
                "x/zz is not known",
            ),
            (
                req("x/a", "x/b", Proto::Sctp, None),
                "sctp needs a destination port",
            ),
            (req("x/a", "x/b", Proto::Icmp, Some(1)), "icmp has no ports"),
        ] {
            let e = build_packet(&v, &r).unwrap_err().to_string();
            assert!(e.contains(want), "{r:?}: {e}");
        }
        let mut not_ready = view();
        not_ready.node = None;
        let e = build_packet(&not_ready, &req("x/a", "x/b", Proto::Tcp, Some(80))).unwrap_err();
        assert!(e.to_string().contains("gateway is not discovered"), "{e}");
    }

    /// Over IPv6 (dual-stack): the pods' IPv6 addresses, `tcp6`, an echo
    /// request of ICMPv6; an IPv6 destination implies it; a pod without an
    /// IPv6 address is refused with the reason.
    #[test]
    fn ipv6_packets_on_a_dual_stack_node() {
        let mut v = view();
        if let Some(n) = v.node.as_mut() {
            n.ipv6 = Some(crate::flows::NodeNet6::of(
                "fd00:10:244::/64".parse().unwrap(),
            ));
        }
        for a in &mut v.attachments {
            let last = a.ip4().unwrap().octets()[3];
            a.ipv6 = Some(crate::state::PodIpv6 {
                ip: format!("fd00:10:244::{last:x}").parse().unwrap(),
                prefix_len: 64,
                gateway: "fd00:10:244::1".parse().unwrap(),
            });
        }
        let mut r = req("x/a", "x/b", Proto::Tcp, Some(80));
        r.ipv6 = true;
        assert_eq!(
            build_packet(&v, &r).unwrap(),
            "in_port=3,tcp6,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,ipv6_src=fd00:10:244::3,ipv6_dst=fd00:10:244::4,nw_ttl=64,tp_src=49152,tp_dst=80,tcp_flags=0x2"
        );
        let p = build_packet(&v, &req("x/a", "2001:db8::1", Proto::Icmp, None)).unwrap();
        assert!(
            p.contains("icmp6,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:01,ipv6_src=fd00:10:244::3,ipv6_dst=2001:db8::1")
                && p.ends_with("icmp_type=128,icmp_code=0"),
            "{p}"
        );
        // A tunnel arrival is of its own family, whatever `ipv6` says (found
        // by the fuzz harness: an IPv6 spec with IPv4 addresses).
        let mut r = req("x/r", "x/a", Proto::Tcp, Some(80));
        r.ipv6 = true;
        r.from_tunnel = Some(TunnelArrival {
            from_node: "n2".into(),
            tun_src: "192.168.77.12".parse().unwrap(),
            tun_dst: "192.168.77.11".parse().unwrap(),
            src_mac: "aa:bb:cc:dd:ee:ff".into(),
            dst_mac: "0a:58:0a:f4:00:01".into(),
            src_ip: "10.244.1.7".parse().unwrap(),
            dst_ip: "10.244.0.3".parse().unwrap(),
            ttl: 63,
        });
        let p = build_packet(&v, &r).unwrap();
        assert!(
            p.contains(",tcp,") && p.contains("nw_src=10.244.1.7"),
            "{p}"
        );
        // The remote pod r has no IPv6 address in the cluster.
        let mut r = req("x/a", "x/r", Proto::Tcp, Some(80));
        r.ipv6 = true;
        let e = build_packet(&v, &r).unwrap_err().to_string();
        assert!(e.contains("no IPv6 address"), "{e}");
        // The packet traces through the dual-stack pipeline to b.
        let flows = crate::desired::compute(&crate::desired::Inputs {
            pods: crate::desired::pod_ports(&v.attachments),
            ..crate::desired::Inputs::for_node(v.node.clone().unwrap())
        })
        .text();
        let mut r = req("x/a", "x/b", Proto::Tcp, Some(80));
        r.ipv6 = true;
        let h = traceflow_through(&v, &flows, &r);
        assert!(
            matches!(h.verdict, Verdict::Delivered { ofport: 4, .. }),
            "{:?}\n{}",
            h.verdict,
            h.text
        );
    }

    #[test]
    fn pod_to_local_pod_is_delivered_and_every_step_is_annotated() {
        let h = traceflow_hop(&req("x/a", "x/b", Proto::Tcp, Some(80)), false);
        assert_eq!(
            h.verdict,
            Verdict::Delivered {
                ofport: 4,
                to: "pod x/b".into()
            },
            "{}",
            h.text
        );
        assert_eq!(h.datapath_actions.len(), 2, "{}", h.text);
        assert!(h.next.is_none());
        let first = &h.steps[0];
        assert_eq!((first.pass, first.table), (0, 0));
        assert_eq!(first.annotation, "pod x/a (port 3)");
        assert!(
            first.actions.iter().any(|a| a.starts_with("goto_table")),
            "{first:?}"
        );
        // Pass 1 resumes after conntrack, ends in Output.
        assert!(h.steps.iter().any(|s| s.pass == 1 && s.table == 31));
        let last = h.steps.last().unwrap();
        assert_eq!(last.table_name.as_deref(), Some("Output"));
        assert_eq!(last.annotation, "pipeline default");
        assert!(h
            .steps
            .iter()
            .all(|s| s.matched && !s.annotation.is_empty()));
        assert!(
            h.steps.iter().any(|s| s.annotation == "pod x/b (port 4)"),
            "{:#?}",
            h.steps
        );
        assert!(h.allowed_by.is_empty());
        if std::env::var_os("SHOW_TRACE").is_some() {
            eprintln!("{}\n{:#?}", h.text, h.steps);
        }
    }

    #[test]
    fn policy_steps_name_the_policy() {
        let h = traceflow_hop(&req("x/a", "x/b", Proto::Tcp, Some(80)), true);
        assert!(
            matches!(h.verdict, Verdict::Delivered { ofport: 4, .. }),
            "{}",
            h.text
        );
        assert_eq!(
            h.allowed_by,
            vec!["NetworkPolicy x/allow-a ingress[0]".to_string()]
        );
        let rule = h
            .steps
            .iter()
            .find(|s| Feature::of(s.cookie) == Some(Feature::PolicyRule))
            .unwrap();
        assert_eq!(
            rule.owner,
            Some(FlowOwner::PolicyRule {
                id: 7,
                policy: Some("x/allow-a".into()),
                direction: Some("ingress".into()),
                index: Some(0)
            })
        );
        // Port 81: no rule allows it; b's ingress isolation drops it.
        let h = traceflow_hop(&req("x/a", "x/b", Proto::Tcp, Some(81)), true);
        let Verdict::Dropped { by, table, .. } = &h.verdict else {
            panic!("not dropped: {:?}\n{}", h.verdict, h.text);
        };
        assert_eq!(
            by,
            "NetworkPolicies x/allow-a, x/deny-all ingress (isolation)"
        );
        assert_eq!(*table, Some(names::INGRESS_DEFAULT_RULE.id));
        assert_eq!(
            h.verdict.describe(),
            "dropped by NetworkPolicies x/allow-a, x/deny-all ingress (isolation) in table 71 (IngressDefaultRule)"
        );
        assert!(h.allowed_by.is_empty());
        // a is selected only by deny-all (allow-a selects app=b).
        let mut v = view();
        v.attachments[1].ofport = Some(4);
        let step = TraceStep {
            pass: 1,
            table: names::INGRESS_DEFAULT_RULE.id,
            table_name: None,
            matched: true,
            priority: Some(200),
            cookie: 0x5000000000003,
            matches: String::new(),
            actions: vec![],
            owner: None,
            annotation: String::new(),
        };
        assert_eq!(
            annotate(&v, &step).1,
            "NetworkPolicy x/deny-all ingress (isolation)"
        );
        let egress = TraceStep {
            table: names::EGRESS_DEFAULT_RULE.id,
            ..step.clone()
        };
        assert_eq!(
            annotate(&v, &egress).1,
            "NetworkPolicy x/egress-only egress (isolation)"
        );
        let gone = TraceStep {
            cookie: 0x5000000000063,
            ..step
        };
        assert_eq!(
            annotate(&v, &gone).1,
            "NetworkPolicy isolation of the pod on port 99"
        );
    }

    /// The real translator's flows ([`crate::policy::policy_flows`]): the
    /// annotations name its rules and isolation drops.
    #[test]
    fn the_translators_flows_are_named() {
        use crate::model::{Peer, PolicyPort, Protocol, Rule};
        use crate::policy::{policy_flows, LocalPod};
        let mut v = view();
        let mut c = (*v.cluster).clone();
        c.policies.clear();
        c.policies.insert(
            ("x".into(), "deny-all".into()),
            policy("deny-all", Labels::new(), true, false),
        );
        let mut allow = policy("allow-a", labels(&[("app", "b")]), true, false);
        allow.ingress = vec![Rule {
            peers: vec![Peer::Pods {
                namespace_selector: None,
                pod_selector: Some(LabelSelector {
                    match_labels: labels(&[("app", "a")]),
                    match_expressions: vec![],
                }),
            }],
            ports: vec![PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(crate::model::PortRef::Number(80)),
                end_port: None,
            }],
        }];
        c.policies.insert(allow.key(), allow);
        let local: Vec<LocalPod> = v
            .attachments
            .iter()
            .map(|a| LocalPod {
                namespace: a.pod_namespace.clone(),
                name: a.pod_name.clone(),
                ip: a.ip4(),
                ofport: a.ofport.unwrap(),
                ip6: None,
            })
            .collect();
        let pf = policy_flows(&c, &local);
        assert!(!pf.flows.is_empty());
        v.cluster = Arc::new(c);
        v.rules = pf.rules.clone();
        let mut text = flows_text(false);
        for l in &pf.flows {
            text.push_str(l);
            text.push('\n');
        }
        let flows = parse_flow_file(&text, &ParseContext::default()).unwrap();
        let p = Pipeline::new();
        p.replace_all(&flows, 0).unwrap();
        let run = |r: &TraceflowRequest| {
            let spec = build_packet(&v, r).unwrap();
            let key = parse_packet_spec(&spec, &ParseContext::default()).unwrap();
            let opts = TraceOptions {
                names: Some(TableNames::default()),
                ..TraceOptions::default()
            };
            let env = XlateEnv::with_ports(vec![2, 3, 4, TUN]);
            let r = TraceResult::from_report(&trace(&*p.snapshot(), &key, &env, &opts), false);
            hop_for(&v, &spec, &r)
        };
        let h = run(&req("x/a", "x/b", Proto::Tcp, Some(80)));
        assert!(
            matches!(h.verdict, Verdict::Delivered { ofport: 4, .. }),
            "{}",
            h.text
        );
        assert_eq!(
            h.allowed_by,
            vec!["NetworkPolicy x/allow-a ingress[0]".to_string()],
            "{}",
            h.text
        );
        let h = run(&req("x/a", "x/b", Proto::Tcp, Some(81)));
        assert_eq!(
            h.verdict,
            Verdict::Dropped {
                by: "NetworkPolicies x/allow-a, x/deny-all ingress (isolation)".into(),
                table: Some(names::INGRESS_DEFAULT_RULE.id),
                table_name: Some("IngressDefaultRule".into()),
            },
            "{}",
            h.text
        );
        let h = run(&req("x/b", "x/a", Proto::Udp, Some(53)));
        let Verdict::Dropped { by, .. } = &h.verdict else {
            panic!("{}", h.text);
        };
        assert_eq!(by, "NetworkPolicy x/deny-all ingress (isolation)");
        // The node is exempt: b -> gateway passes, and says why.
        let h = run(&req("x/b", "10.244.0.1", Proto::Icmp, None));
        assert!(
            matches!(h.verdict, Verdict::Delivered { ofport: 2, .. }),
            "{}",
            h.text
        );
        // The node -> isolated b: exempt, and the step says why.
        let spec = "in_port=2,tcp,dl_src=0a:58:0a:f4:00:01,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.1,nw_dst=10.244.0.4,nw_ttl=64,tp_src=5000,tp_dst=81";
        let key = parse_packet_spec(spec, &ParseContext::default()).unwrap();
        let opts = TraceOptions {
            names: Some(TableNames::default()),
            ..TraceOptions::default()
        };
        let env = XlateEnv::with_ports(vec![2, 3, 4, TUN]);
        let r = TraceResult::from_report(&trace(&*p.snapshot(), &key, &env, &opts), false);
        let h = hop_for(&v, spec, &r);
        assert!(
            matches!(h.verdict, Verdict::Delivered { ofport: 4, .. }),
            "{}",
            h.text
        );
        assert!(
            h.steps
                .iter()
                .any(|s| s.owner == Some(FlowOwner::NodeExemption)),
            "{}",
            h.text
        );
    }

    #[test]
    fn spoofed_or_unknown_traffic_is_dropped_by_the_deciding_flow() {
        let v = view();
        // A packet from a port nobody owns: the Classifier's default drop.
        let spec = "in_port=7,tcp,nw_src=10.244.0.3,nw_dst=10.244.0.4,tp_dst=80";
        let h = hop_for(&v, spec, &run_trace(spec, false));
        assert_eq!(
            h.verdict,
            Verdict::Dropped {
                by: "pipeline default".into(),
                table: Some(0),
                table_name: Some("Classifier".into())
            },
            "{}",
            h.text
        );
        // A spoofed source: SpoofGuard's default drop.
        let spec =
            "in_port=3,tcp,dl_src=0a:58:0a:f4:00:03,nw_src=10.244.0.9,nw_dst=10.244.0.4,tp_dst=80";
        let h = hop_for(&v, spec, &run_trace(spec, false));
        assert!(
            matches!(
                &h.verdict,
                Verdict::Dropped {
                    table: Some(10),
                    ..
                }
            ),
            "{:?}",
            h.verdict
        );
    }

    #[test]
    fn remote_pods_go_through_the_tunnel_and_continue_on_the_next_node() {
        let h = traceflow_hop(&req("x/a", "x/r", Proto::Tcp, Some(80)), false);
        assert_eq!(
            h.verdict,
            Verdict::Tunnel {
                ofport: TUN,
                tun_dst: Some("192.168.77.12".parse().unwrap()),
                node: Some("n2".into())
            },
            "{}",
            h.text
        );
        assert!(h
            .steps
            .iter()
            .any(|s| s.annotation == "remote node n2 (192.168.77.12)"));
        let next = h.next.clone().expect("next hop");
        assert_eq!(next.ttl, 63);
        assert_eq!(next.src_mac, "0a:58:0a:f4:00:01");
        assert_eq!(next.dst_mac, "aa:bb:cc:dd:ee:ff");
        assert_eq!(next.tun_src, "192.168.77.11".parse::<Ipv4Addr>().unwrap());
        assert_eq!(next.dst_ip, "10.244.1.7".parse::<Ipv4Addr>().unwrap());
        // The same node playing the receiver: a packet from n2's pod to x/b
        // arriving on the tunnel is delivered to b.
        let v = view();
        let mut r = req("x/r", "x/b", Proto::Tcp, Some(80));
        r.from_tunnel = Some(TunnelArrival {
            from_node: "n2".into(),
            tun_src: "192.168.77.12".parse().unwrap(),
            tun_dst: "192.168.77.11".parse().unwrap(),
            src_mac: "0a:58:0a:f4:01:01".into(),
            dst_mac: "aa:bb:cc:dd:ee:ff".into(),
            src_ip: "10.244.1.7".parse().unwrap(),
            dst_ip: "10.244.0.4".parse().unwrap(),
            ttl: 63,
        });
        let spec = build_packet(&v, &r).unwrap();
        assert!(
            spec.starts_with("in_port=9,tcp,tun_src=192.168.77.12,tun_dst=192.168.77.11,"),
            "{spec}"
        );
        let h = hop_for(&v, &spec, &run_trace(&spec, false));
        assert_eq!(
            h.verdict,
            Verdict::Delivered {
                ofport: 4,
                to: "pod x/b".into()
            },
            "{}",
            h.text
        );
        assert_eq!(h.steps[0].annotation, "remote node n2 (192.168.77.12)");
        if let Some(t) = r.from_tunnel.as_mut() {
            t.src_mac = "nope".into();
        }
        assert!(build_packet(&v, &r)
            .unwrap_err()
            .to_string()
            .contains("bad MAC"));
    }

    #[test]
    fn info_and_pod() {
        let v = view();
        let i = info(&v);
        assert_eq!(i.node, "n1");
        assert_eq!(i.pod_cidr.as_deref(), Some("10.244.0.0/24"));
        assert_eq!(i.gateway.as_ref().map(|g| g.ofport), Some(2));
        assert_eq!(i.tunnel_ofport, Some(TUN));
        assert_eq!(i.pods.len(), 2);
        assert_eq!(i.remotes[0].name, "n2");
        let p = pod_info(&v, "x", "b").unwrap();
        assert!(p.local && p.ofport == Some(4) && p.node == "n1");
        let p = pod_info(&v, "x", "r").unwrap();
        assert!(!p.local && p.node == "n2" && p.ofport.is_none());
        assert!(pod_info(&v, "x", "nope").is_err());
    }
}
