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

use oxvs_pipeline::names::{CONNTRACK_STATE, EGRESS_RULE, SERVICE_LB};

use crate::cookie;
use crate::flows::{FlowLine, CT_ZONE};
use crate::model::{ClusterState, ObjKey, Protocol};
use crate::priority;

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

/// ConntrackZone with the proxy: NATed connections are translated.
pub fn conntrack_zone_action() -> String {
    format!("ct(table={},zone={CT_ZONE},nat)", CONNTRACK_STATE.id)
}
