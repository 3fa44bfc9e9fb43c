//! The node's desired flow set: one pure function of what the agent knows.
//!
//! [`compute`] is the only place the flows a node should have are put
//! together: the node's own flows, each pod's, the tunnel's and its guard,
//! and NetworkPolicy. The agent calls it on every change (`Agent::sync`,
//! on the blocking pool: it is linear in the cluster), the tests call it to
//! get the flows they load into a pipeline (and compare them with the
//! golden files of `agent/tests/golden/`), and the benchmarks call it to
//! realise a synthetic cluster exactly as a node would.
//!
//! [`Inputs`] is everything the flows depend on, owned, so that the agent
//! can clone it out of its locks and move it to another thread. The parts
//! ([`base_flows`], [`policy_flows`]) are public for callers that time them
//! separately; [`compute`] is their concatenation.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use crate::flows::{self, NodeNet, PodPort, RemoteNode};
use crate::model::{ClusterState, Pod};
use crate::policy::{self, LocalPod, PolicyFlows, Refusal, RuleRef};
use crate::state::{AttachState, Attachment};

/// The tunnel port and the nodes behind it.
#[derive(Clone, Debug)]
pub struct Tunnel {
    /// The tunnel's OpenFlow port.
    pub ofport: u32,
    /// The other nodes (already checked: `crate::nodes::check_remotes`).
    pub remotes: Vec<RemoteNode>,
    /// This node's underlay address (the tunnel guard covers it too).
    pub node_ip: Option<IpAddr>,
    /// Install the tunnel guard ([`flows::tunnel_guard_flows`]). The agent
    /// always does; off only to measure what the guard costs.
    pub guard: bool,
}

/// Everything a node's flows are computed from.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub node: NodeNet,
    /// The pods attached to this node's switch, sorted.
    pub pods: Vec<PodPort>,
    /// `None` until the switch has a tunnel port.
    pub tunnel: Option<Tunnel>,
    pub state: Arc<ClusterState>,
    /// Pods read from the source for an ADD that the snapshot lacks yet.
    pub admitted: Vec<Pod>,
    /// The local pods NetworkPolicy applies to, with the address each has
    /// here (authoritative over the snapshot's).
    pub local: Vec<LocalPod>,
    /// The cap on the flows one policy may add ([`policy::policy_flows_limited`]).
    pub max_policy_flows: usize,
    /// Load-balance Services in the switch ([`crate::proxy`]).
    pub proxy: bool,
    /// This node's name (the proxy's local endpoints are those on it).
    pub node_name: String,
}

impl Inputs {
    /// A node with no pod, no tunnel and an empty cluster: the start of
    /// struct-update syntax in tests (`Inputs { pods, ..Inputs::for_node(n) }`).
    pub fn for_node(node: NodeNet) -> Inputs {
        Inputs {
            node,
            pods: Vec::new(),
            tunnel: None,
            state: Arc::new(ClusterState::default()),
            admitted: Vec::new(),
            local: Vec::new(),
            max_policy_flows: policy::DEFAULT_MAX_POLICY_FLOWS,
            proxy: false,
            node_name: String::new(),
        }
    }
}

/// The node's desired flows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredFlows {
    /// Flow lines in `ovs-ofctl` syntax, in a fixed order.
    pub lines: Vec<String>,
    /// Group lines (`add-group` syntax), by id: the proxy's.
    pub groups: Vec<String>,
    /// The proxy's UDP endpoints (address, port), sorted: when one goes,
    /// its connections are flushed (a UDP "connection" would otherwise
    /// keep its dead endpoint until it idles out).
    pub udp_endpoints: Vec<(std::net::IpAddr, u16)>,
    /// Every NetworkPolicy rule that has flows, by id.
    pub rules: Vec<RuleRef>,
    /// Policies refused on this node (too many flows).
    pub refused: Vec<Refusal>,
}

impl DesiredFlows {
    /// The lines as a flow file (each ends in a newline).
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(self.lines.iter().map(|l| l.len() + 1).sum());
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// Every flow the node should have (pure).
pub fn compute(inp: &Inputs) -> DesiredFlows {
    let mut lines = base_flows(inp);
    let pf = policy_flows(inp);
    lines.extend(pf.flows);
    let mut groups = Vec::new();
    let mut udp_endpoints = Vec::new();
    if inp.proxy {
        let p = crate::proxy::proxy_flows(&inp.state, &inp.node_name, &inp.node);
        udp_endpoints = p
            .ports
            .iter()
            .filter(|sp| sp.protocol == crate::model::Protocol::Udp)
            .flat_map(|sp| sp.endpoints.iter().copied())
            .collect();
        udp_endpoints.sort();
        udp_endpoints.dedup();
        lines.extend(p.flows);
        lines.extend(crate::proxy::hairpin_node_flows(&inp.node));
        lines.extend(crate::proxy::outside_node_flows(&inp.node));
        for pod in &inp.pods {
            lines.extend(crate::proxy::hairpin_pod_flows(&inp.node, pod));
        }
        groups = p.groups;
    }
    DesiredFlows {
        lines,
        groups,
        udp_endpoints,
        rules: pf.rules,
        refused: pf.refused,
    }
}

/// The flows that do not depend on NetworkPolicy: the node's, each pod's,
/// the tunnel's and its guard.
pub fn base_flows(inp: &Inputs) -> Vec<String> {
    let node = &inp.node;
    let mut lines = flows::node_flows(node, inp.proxy);
    for p in &inp.pods {
        lines.extend(flows::pod_flows(node, p));
    }
    if let Some(t) = &inp.tunnel {
        lines.extend(flows::tunnel_flows(node, t.ofport, &t.remotes));
        if t.guard {
            // Every node address of both families, not only the
            // tunnel's: a pod's datagram to another family's VXLAN port
            // (a node on the other underlay family, a node refused here)
            // would leave masqueraded with this node's address.
            let node_ips: Vec<IpAddr> = t
                .remotes
                .iter()
                .map(|r| r.ip)
                .chain(t.node_ip)
                .chain(inp.state.nodes.values().flat_map(|n| {
                    n.internal_ip
                        .map(IpAddr::V4)
                        .into_iter()
                        .chain(n.internal_ip6.map(IpAddr::V6))
                }))
                .collect();
            lines.extend(flows::tunnel_guard_flows(&node_ips, flows::VXLAN_UDP_PORT));
        }
    }
    lines
}

/// The NetworkPolicy flows of the local pods. The cluster seen by the
/// translator is the snapshot plus the admitted pods, with each local pod
/// at the address it has here.
pub fn policy_flows(inp: &Inputs) -> PolicyFlows {
    let state = local_view(inp);
    let node_addrs = policy::local_node_addresses(&state, &inp.local);
    policy::policy_flows_limited(&state, &inp.local, &node_addrs, inp.max_policy_flows)
}

/// The snapshot with the admitted pods and the local pods' addresses
/// (copied only when that changes anything).
fn local_view(inp: &Inputs) -> Cow<'_, ClusterState> {
    let differs = |lp: &LocalPod| {
        inp.state
            .pods
            .get(&(lp.namespace.clone(), lp.name.clone()))
            .is_some_and(|p| {
                (lp.ip.is_some() && p.ip != lp.ip) || (lp.ip6.is_some() && p.ip6 != lp.ip6)
            })
    };
    if inp.admitted.is_empty() && !inp.local.iter().any(differs) {
        return Cow::Borrowed(&inp.state);
    }
    let mut state = (*inp.state).clone();
    for p in &inp.admitted {
        state.pods.insert(p.key(), p.clone());
    }
    for lp in &inp.local {
        if let Some(p) = state.pods.get_mut(&(lp.namespace.clone(), lp.name.clone())) {
            p.ip = lp.ip.or(p.ip);
            p.ip6 = lp.ip6.or(p.ip6);
        }
    }
    Cow::Owned(state)
}

/// The pod ports of the ready attachments, sorted.
pub fn pod_ports(attachments: &[Attachment]) -> Vec<PodPort> {
    let mut v: Vec<PodPort> = attachments
        .iter()
        .filter(|a| a.state == AttachState::Ready)
        .filter_map(|a| {
            Some(PodPort {
                ofport: a.ofport?,
                ip: a.ip4(),
                mac: flows::parse_mac(&a.mac)?,
                ip6: a.ip6(),
            })
        })
        .collect();
    v.sort();
    v
}

/// The local pods of the ready attachments that name their pod, in
/// attachment order.
pub fn local_pods(attachments: &[Attachment]) -> Vec<LocalPod> {
    attachments
        .iter()
        .filter_map(|a| {
            let (Some(ofport), AttachState::Ready) = (a.ofport, a.state) else {
                return None;
            };
            (!a.pod_name.is_empty()).then(|| LocalPod {
                namespace: a.pod_namespace.clone(),
                name: a.pod_name.clone(),
                ip: a.ip4(),
                ofport,
                ip6: a.ip6(),
            })
        })
        .collect()
}

/// The `ofproto/trace`-style trace of packet `spec` (`ovs-ofctl` packet
/// syntax) through the node's desired flows and groups for `inp`, plus
/// `extra` flow lines (a learned flow, say). For tests: panics on bad input.
#[cfg(test)]
pub(crate) fn trace_desired(inp: &Inputs, extra: &str, spec: &str) -> String {
    use oxvs_pipeline::names::TableNames;
    use oxvs_pipeline::parse::{
        parse_flow_file, parse_group_file, parse_packet_spec, ParseContext,
    };
    use oxvs_pipeline::tables::Pipeline;
    use oxvs_pipeline::trace::{trace, TraceOptions};
    use oxvs_pipeline::xlate::XlateEnv;
    let d = compute(inp);
    let ctx = ParseContext::default();
    let mut flows = parse_flow_file(&d.text(), &ctx).expect("desired flows parse");
    flows.extend(parse_flow_file(extra, &ctx).expect("extra flows parse"));
    let groups = parse_group_file(&d.groups.join("\n"), &ctx).expect("groups parse");
    let p = Pipeline::new();
    p.replace_all_with_groups(&flows, Some(&groups), 0)
        .expect("desired flows install");
    let key = parse_packet_spec(spec, &ctx).expect("packet spec parses");
    let opts = TraceOptions {
        names: Some(TableNames::default()),
        ..TraceOptions::default()
    };
    format!(
        "{}",
        trace(&*p.snapshot(), &key, &XlateEnv::default(), &opts)
    )
}
