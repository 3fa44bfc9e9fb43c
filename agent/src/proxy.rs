//! The in-pipeline Service proxy (`oxvs-agent --proxy`, instead of
//! kube-proxy): a Service's ClusterIP load-balanced in the switch, the way
//! AntreaProxy does it. Pure: flows and groups from the cluster.
//!
//! ## Flows
//!
//! | table | with the proxy |
//! |---|---|
//! | 30 ConntrackZone | `ct(table=31,zone=65520,nat)`: packets of translated connections are translated (to the endpoint; replies back from the ClusterIP) before anything else looks at them |
//! | 31 ConntrackState | new connections go to ServiceLB (not straight to egress policy) |
//! | 35 ServiceLB | a new connection to `ClusterIP:port/protocol` -> `group:G`, the Service port's group; a Service port without a ready endpoint drops; anything else -> EgressRule |
//!
//! Group G (`type=select`) has a bucket per ready endpoint:
//! `ct(commit,table=40,zone=65520,nat(dst=IP:PORT))`: the connection is
//! committed with its translation and goes on, DNATed, to egress policy
//! (NetworkPolicy applies to the chosen endpoint, as Kubernetes wants),
//! routing, ingress policy and ConntrackCommit, whose own commit in the
//! same zone finds the same connection. `sessionAffinity: ClientIP` hashes
//! the client address only (`selection_method=hash,fields(ip_src)`), so a
//! client keeps its endpoint while the endpoints stay (the Service's
//! `timeoutSeconds` is not applied: a client sticks until its endpoint
//! goes).
//!
//! ## Hairpin
//!
//! A pod that reaches itself through its Service would get its own packet
//! with its own address as source, and answer itself inside its network
//! namespace: the reply would never come back to the switch to be
//! un-DNATed. So, as kube-proxy masquerades hairpin traffic, the switch
//! SNATs it, in a zone of its own ([`HAIRPIN_ZONE`]), to
//! [`HAIRPIN_IP`] (link-local: the pod routes its answer to the gateway,
//! i.e. back to the switch):
//!
//! | table | flow |
//! |---|---|
//! | 30 ConntrackZone | untracked IP to `HAIRPIN_IP` -> `ct(table=30,zone=65521,nat)`: the answer is un-SNATed first, then goes round ConntrackZone again to be un-DNATed |
//! | 50 L3Forwarding | per pod: `nw_src=POD,nw_dst=POD` (after DNAT) -> routed to the pod and `ct(commit,table=55,zone=65521,nat(src=HAIRPIN_IP))` |
//! | 80 ConntrackCommit | packets last tracked in the hairpin zone skip the commit (both zones have the connection already) |
//! | 90 Output | per pod: to its own port -> `in_port` (OpenFlow never outputs to the input port otherwise) |
//!
//! ## Ids
//!
//! A Service port's group id (and the object of its cookie,
//! [`crate::cookie::service`]) is a hash of `namespace/name/port/protocol`,
//! so a restarted agent computes the same ids and `replace-flows` changes
//! nothing; collisions are resolved in a fixed order. A bucket's id is a
//! hash of its endpoint's `IP:port`: the switch's rendezvous choice of
//! bucket depends on bucket ids, so with stable ids an endpoint that goes
//! moves only its own share of new connections (established ones keep
//! their endpoint in conntrack regardless).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use oxvs_pipeline::names::{
    CONNTRACK_COMMIT, CONNTRACK_STATE, CONNTRACK_ZONE, EGRESS_RULE, L3_DEC_TTL, L3_FORWARDING,
    OUTPUT, SERVICE_LB,
};
use oxvs_pipeline::regs;

use crate::cookie;
use crate::flows::{mac_str, FlowLine, NodeNet, PodPort, CT_ZONE};
use crate::model::{ClusterState, ObjKey, Protocol};
use crate::priority;

/// The conntrack zone of hairpin SNAT (module doc, "Hairpin").
pub const HAIRPIN_ZONE: u16 = 65521;

/// The address hairpin traffic is SNATed to (link-local, never a pod's).
pub const HAIRPIN_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 252);

/// One Service port the proxy serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortFlows {
    pub service: ObjKey,
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// Its group (and cookie object).
    pub group_id: u32,
    /// The ready endpoints (address, port), sorted.
    pub endpoints: Vec<(Ipv4Addr, u16)>,
    pub affinity: bool,
}

/// The proxy's flows and groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyFlows {
    pub flows: Vec<String>,
    /// Group lines (`add-group` syntax), by id.
    pub groups: Vec<String>,
    pub ports: Vec<ServicePortFlows>,
}

fn fnv1a32(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Group ids live in 1..=0x7fff_ffff (well below OpenFlow's reserved range).
const GROUP_ID_SPACE: u32 = 0x7fff_ffff;

/// The Service ports the proxy serves, with their group ids and ready
/// endpoints, sorted by Service and port.
pub fn service_ports(state: &ClusterState) -> Vec<ServicePortFlows> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for (key, svc) in &state.services {
        let Some(cluster_ip) = svc.cluster_ip else {
            continue;
        };
        let endpoints = state.service_endpoints(key);
        for p in &svc.ports {
            let mut eps: Vec<(Ipv4Addr, u16)> = endpoints
                .iter()
                .filter(|e| e.ready)
                .filter_map(|e| {
                    e.ports
                        .iter()
                        .find(|ep| ep.name == p.name && ep.protocol == p.protocol)
                        .map(|ep| (e.ip, ep.port))
                })
                .collect();
            eps.sort();
            eps.dedup();
            let name = format!("{}/{}/{}/{}", key.0, key.1, p.name, p.protocol.keyword());
            let mut id = fnv1a32(&name) % GROUP_ID_SPACE + 1;
            while !used.insert(id) {
                id = id % GROUP_ID_SPACE + 1;
            }
            out.push(ServicePortFlows {
                service: key.clone(),
                port_name: p.name.clone(),
                protocol: p.protocol,
                cluster_ip,
                port: p.port,
                group_id: id,
                endpoints: eps,
                affinity: svc.affinity_timeout.is_some(),
            });
        }
    }
    out
}

/// The proxy's flows and groups for the cluster (see the module doc).
pub fn proxy_flows(state: &ClusterState) -> ProxyFlows {
    let ports = service_ports(state);
    let mut flows: Vec<String> = Vec::new();
    let mut groups: Vec<(u32, String)> = Vec::new();
    for sp in &ports {
        let c = cookie::service(sp.group_id);
        let lb = FlowLine::new(SERVICE_LB, priority::service_lb::SERVICE, c)
            .matching("ct_state=+new+trk")
            .matching(sp.protocol.keyword())
            .matching(format!("nw_dst={}", sp.cluster_ip))
            .matching(format!("tp_dst={}", sp.port));
        if sp.endpoints.is_empty() {
            flows.push(lb.drop_packet().into());
            continue;
        }
        flows.push(lb.action(format!("group:{}", sp.group_id)).into());
        groups.push((sp.group_id, group_line(sp)));
    }
    groups.sort();
    ProxyFlows {
        flows,
        groups: groups.into_iter().map(|(_, g)| g).collect(),
        ports,
    }
}

/// The select group of one Service port.
fn group_line(sp: &ServicePortFlows) -> String {
    let mut g = format!("group_id={},type=select", sp.group_id);
    if sp.affinity {
        g.push_str(",selection_method=hash,fields(ip_src)");
    }
    let mut ids = BTreeSet::new();
    for (ip, port) in &sp.endpoints {
        // Bucket ids stop below OpenFlow 1.5's reserved 0xffffff00.
        let mut id = fnv1a32(&format!("{ip}:{port}")) % 0xffff_ff00;
        while !ids.insert(id) {
            id = (id + 1) % 0xffff_ff00;
        }
        g.push_str(&format!(
            ",bucket=bucket_id:{id},weight:100,actions=ct(commit,table={},zone={CT_ZONE},nat(dst={ip}:{port}))",
            EGRESS_RULE.id
        ));
    }
    g
}

/// The node's hairpin flows (module doc, "Hairpin").
pub fn hairpin_node_flows() -> Vec<String> {
    vec![
        FlowLine::new(
            CONNTRACK_ZONE,
            priority::conntrack_zone::HAIRPIN,
            cookie::DEFAULTS,
        )
        .matching("ct_state=-trk")
        .matching("ip")
        .matching(format!("nw_dst={HAIRPIN_IP}"))
        .action(format!(
            "ct(table={},zone={HAIRPIN_ZONE},nat)",
            CONNTRACK_ZONE.id
        ))
        .into(),
        FlowLine::new(
            CONNTRACK_COMMIT,
            priority::conntrack_commit::HAIRPIN,
            cookie::DEFAULTS,
        )
        .matching("ip")
        .matching(format!("ct_zone={HAIRPIN_ZONE}"))
        .goto(OUTPUT)
        .into(),
    ]
}

/// One local pod's hairpin flows (module doc, "Hairpin").
pub fn hairpin_pod_flows(node: &NodeNet, pod: &PodPort) -> Vec<String> {
    let c = cookie::pod(pod.ofport);
    vec![
        FlowLine::new(L3_FORWARDING, priority::l3_forwarding::HAIRPIN, c)
            .matching("ip")
            .matching(format!("nw_src={}", pod.ip))
            .matching(format!("nw_dst={}", pod.ip))
            .action(format!("set_field:{}->eth_src", mac_str(&node.gateway_mac)))
            .action(format!("set_field:{}->eth_dst", mac_str(&pod.mac)))
            .action(format!(
                "ct(commit,table={},zone={HAIRPIN_ZONE},nat(src={HAIRPIN_IP}))",
                L3_DEC_TTL.id
            ))
            .into(),
        FlowLine::new(OUTPUT, priority::output::HAIRPIN, c)
            .matching(format!("in_port={}", pod.ofport))
            .matching(regs::TARGET_OFPORT.matching(pod.ofport))
            .mark(regs::OFPORT_FOUND_MARK)
            .action("IN_PORT")
            .into(),
    ]
}

/// ConntrackZone with the proxy: NATed connections are translated.
pub fn conntrack_zone_action() -> String {
    format!("ct(table={},zone={CT_ZONE},nat)", CONNTRACK_STATE.id)
}
