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
//! | 35 ServiceLB | a new connection to `ClusterIP:port/protocol` -> `group:G`, the Service port's group; a Service port without a ready endpoint is rejected ([`reject_action`]: the switch answers ICMP port unreachable, as kube-proxy's `REJECT`); anything else -> EgressRule |
//!
//! Group G (`type=select`) has a bucket per ready endpoint:
//! `ct(commit,table=40,zone=65520,nat(dst=IP:PORT))`: the connection is
//! committed with its translation and goes on, DNATed, to egress policy
//! (NetworkPolicy applies to the chosen endpoint, as Kubernetes wants),
//! routing, ingress policy and ConntrackCommit, whose own commit in the
//! same zone finds the same connection.
//!
//! ## Session affinity
//!
//! `sessionAffinity: ClientIP`: the group hashes the client address only
//! (`selection_method=hash,fields(ip_src)`), and its buckets do not DNAT
//! but put the endpoint into `reg6`/`reg7[0..15]` and go back to
//! ServiceLB, which learns it ([`learn_action`]: a SessionAffinity (34)
//! flow for the client and frontend, `hard_timeout` = `timeoutSeconds`,
//! refreshed by every new connection) and sends the packet to EndpointDNAT
//! (36), which translates it. The next connection finds the learned flow
//! (ConntrackState resubmits to SessionAffinity, then to ServiceLB) and
//! goes straight to EndpointDNAT; a learned endpoint that is gone is
//! chosen again (EndpointDNAT's priority-100 flow).
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
//! ## From outside the node
//!
//! NodePorts, external and load balancer addresses: the host sends their
//! traffic into the switch through the gateway. It DNATs each NodePort to
//! [`SERVICE_VIP`] (`crate::hostnet::sync_node_ports`) and routes every
//! Service address via [`SERVICE_VIP`] (for which the switch answers ARP
//! with the gateway's MAC, so the packets look routed). ServiceLB sends
//! them to the Service port's groups:
//!
//! | `externalTrafficPolicy` | |
//! |---|---|
//! | Cluster | every endpoint; `reg0[20]` asks ServiceSNAT (57) to SNAT the connection to the gateway address (zone [`HAIRPIN_ZONE`], ports [`SNAT_PORTS`]), so that the answer comes back through this node whichever node the endpoint is on |
//! | Local | this node's endpoints, no SNAT (the client's address is kept); this node's own pods reach every endpoint |
//!
//! NodePort groups ([`GroupKind::NodePort`]) commit with the from-gateway
//! `ct_mark`, so replies go back to the host, which undoes its DNAT.
//! `internalTrafficPolicy: Local` gives the ClusterIP this node's
//! endpoints only. External addresses that belong to the cluster (a node,
//! a pod network) are refused ([`external_ip_allowed`]).
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
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use oxvs_pipeline::names::{
    CONNTRACK_COMMIT, CONNTRACK_STATE, CONNTRACK_ZONE, EGRESS_RULE, ENDPOINT_DNAT,
    L2_FORWARDING_CALC, L3_DEC_TTL, L3_FORWARDING, OUTPUT, SERVICE_LB, SERVICE_SNAT,
    SESSION_AFFINITY,
};
use oxvs_pipeline::regs;

use crate::cookie;
use crate::flows::{mac_str, FlowLine, NodeNet, PodPort, CT_ZONE};
use crate::model::{ClusterState, ObjKey, Protocol};
use crate::priority;

/// The conntrack zone of hairpin SNAT (module doc, "Hairpin") and of the
/// SNAT of traffic from outside (module doc, "From outside the node").
pub const HAIRPIN_ZONE: u16 = 65521;

/// The address hairpin traffic is SNATed to (link-local, never a pod's).
pub const HAIRPIN_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 252);

/// [`HAIRPIN_IP`]'s IPv6 twin: in `fc00::/8` with the L bit clear (no ULA
/// allocation ever uses it), outside every pod's /64, so the pod routes
/// its answer to the gateway.
pub const HAIRPIN_IP6: Ipv6Addr = Ipv6Addr::new(0xfc01, 0, 0, 0, 0, 0, 0xa9fe, 0xa9fc);

/// The host's next hop into the switch for Service addresses, and the
/// address NodePort traffic is DNATed to on the host (module doc, "From
/// outside the node"). Link-local: no pod or node has it.
pub const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 253);

/// [`SERVICE_VIP`]'s IPv6 twin (the host's next hop for IPv6 ClusterIPs;
/// the switch answers Neighbour Discovery for it with the gateway's MAC).
pub const SERVICE_VIP6: Ipv6Addr = Ipv6Addr::new(0xfc01, 0, 0, 0, 0, 0, 0xa9fe, 0xa9fd);

/// The ports traffic from outside is SNATed to on the gateway address:
/// above Linux's default ephemeral range (32768-60999), so a SNATed
/// connection never takes the tuple of one of the host's own connections
/// from that address.
pub const SNAT_PORTS: (u16, u16) = (61000, 65535);

/// Which endpoints a group balances over, and whether its connections are
/// marked as entered from the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupKind {
    /// Every ready endpoint.
    Cluster,
    /// The ready endpoints on this node.
    Local,
    /// Every ready endpoint, for NodePort traffic: the connection is
    /// committed with the from-gateway `ct_mark`, so its replies go back
    /// through the host that DNATed the node's address.
    NodePort,
    /// This node's ready endpoints, for NodePort traffic.
    NodePortLocal,
}

impl GroupKind {
    const ALL: [GroupKind; 4] = [
        GroupKind::Cluster,
        GroupKind::Local,
        GroupKind::NodePort,
        GroupKind::NodePortLocal,
    ];

    fn suffix(self) -> &'static str {
        match self {
            GroupKind::Cluster => "",
            GroupKind::Local => "/local",
            GroupKind::NodePort => "/nodeport",
            GroupKind::NodePortLocal => "/nodeport-local",
        }
    }

    fn local(self) -> bool {
        matches!(self, GroupKind::Local | GroupKind::NodePortLocal)
    }

    fn node_port(self) -> bool {
        matches!(self, GroupKind::NodePort | GroupKind::NodePortLocal)
    }
}

/// One Service port the proxy serves, on one of its ClusterIPs (a
/// dual-stack Service port is two of these, one per family).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortFlows {
    pub service: ObjKey,
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: IpAddr,
    pub port: u16,
    /// Its group (and cookie object): the one over every ready endpoint.
    pub group_id: u32,
    /// The ids of its groups by [`GroupKind`] (`ALL` order).
    pub group_ids: [u32; 4],
    /// The ready endpoints of the ClusterIP's family (address, port),
    /// sorted.
    pub endpoints: Vec<(IpAddr, u16)>,
    /// Those on this node.
    pub local_endpoints: Vec<(IpAddr, u16)>,
    /// `sessionAffinity: ClientIP`: its timeout in seconds.
    pub affinity: Option<u32>,
    /// Its NodePort (served on the node's addresses of the ClusterIP's
    /// family).
    pub node_port: Option<u16>,
    /// External and load balancer addresses of the ClusterIP's family.
    pub external_ips: Vec<IpAddr>,
    pub external_local: bool,
    pub internal_local: bool,
}

impl ServicePortFlows {
    fn group(&self, kind: GroupKind) -> u32 {
        self.group_ids[kind as usize]
    }

    /// Whether this is the IPv6 ClusterIP's entry.
    pub fn v6(&self) -> bool {
        self.cluster_ip.is_ipv6()
    }

    fn endpoints_of(&self, kind: GroupKind) -> &[(IpAddr, u16)] {
        match kind.local() {
            true => &self.local_endpoints,
            false => &self.endpoints,
        }
    }
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

/// The Service ports the proxy serves on node `node_name`, with their
/// group ids and ready endpoints: every IPv4 ClusterIP's ports sorted by
/// Service and port, then every IPv6 ClusterIP's (whose group ids are
/// hashed from names of their own, so the IPv4 ones do not depend on
/// them).
pub fn service_ports(state: &ClusterState, node_name: &str) -> Vec<ServicePortFlows> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for v6 in [false, true] {
        for (key, svc) in &state.services {
            let cluster_ip: IpAddr = match (v6, svc.cluster_ip, svc.cluster_ip6) {
                (false, Some(ip), _) => ip.into(),
                (true, _, Some(ip)) => ip.into(),
                _ => continue,
            };
            let endpoints = state.service_endpoints(key);
            for p in &svc.ports {
                let ready = |local: bool| -> Vec<(IpAddr, u16)> {
                    let mut eps: Vec<(IpAddr, u16)> = endpoints
                        .iter()
                        .filter(|e| e.ready && e.ip.is_ipv6() == v6)
                        .filter(|e| !local || e.node_name.as_deref() == Some(node_name))
                        .filter_map(|e| {
                            e.ports
                                .iter()
                                .find(|ep| ep.name == p.name && ep.protocol == p.protocol)
                                .map(|ep| (e.ip, ep.port))
                        })
                        .collect();
                    eps.sort();
                    eps.dedup();
                    eps
                };
                let name = format!(
                    "{}/{}/{}/{}{}",
                    key.0,
                    key.1,
                    p.name,
                    p.protocol.keyword(),
                    if v6 { "/ipv6" } else { "" }
                );
                let mut group_ids = [0u32; 4];
                for kind in GroupKind::ALL {
                    let mut id = fnv1a32(&format!("{name}{}", kind.suffix())) % GROUP_ID_SPACE + 1;
                    while !used.insert(id) {
                        id = id % GROUP_ID_SPACE + 1;
                    }
                    group_ids[kind as usize] = id;
                }
                // External and load balancer addresses of the family.
                let external_ips = svc
                    .external_ips
                    .iter()
                    .copied()
                    .filter(|ip| ip.is_ipv6() == v6 && external_ip_allowed(state, *ip))
                    .collect();
                out.push(ServicePortFlows {
                    service: key.clone(),
                    port_name: p.name.clone(),
                    protocol: p.protocol,
                    cluster_ip,
                    port: p.port,
                    group_id: group_ids[GroupKind::Cluster as usize],
                    group_ids,
                    endpoints: ready(false),
                    local_endpoints: ready(true),
                    affinity: svc.affinity_timeout,
                    node_port: p.node_port,
                    external_ips,
                    external_local: svc.external_local,
                    internal_local: svc.internal_local,
                });
            }
        }
    }
    out
}

/// Whether an external or load balancer address may be taken over by a
/// Service on this node. Not: an address of the cluster's pod networks or
/// nodes (a Service would capture traffic meant for a pod or a node: the
/// "man in the middle" of CVE-2020-8554), nor a special-purpose one
/// (unspecified, loopback, link-local, multicast, broadcast).
pub fn external_ip_allowed(state: &ClusterState, ip: IpAddr) -> bool {
    let special = match ip {
        IpAddr::V4(a) => {
            a.is_unspecified()
                || a.is_loopback()
                || a.is_link_local()
                || a.is_multicast()
                || a.is_broadcast()
        }
        IpAddr::V6(a) => {
            a.is_unspecified()
                || a.is_loopback()
                || a.is_multicast()
                // fe80::/10, and the proxy's own fc01::/64 addresses.
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.segments()[..4] == [0xfc01, 0, 0, 0]
        }
    };
    let cluster = state.nodes.values().any(|n| match ip {
        IpAddr::V4(a) => n.internal_ip == Some(a) || n.pod_cidr.is_some_and(|c| c.contains(&a)),
        IpAddr::V6(a) => n.internal_ip6 == Some(a) || n.pod_cidr6.is_some_and(|c| c.contains(&a)),
    });
    !special && !cluster
}

/// The NodePorts the host must send into the switch over IPv4 (of
/// Services with an IPv4 ClusterIP), sorted.
pub fn node_ports(state: &ClusterState) -> Vec<crate::hostnet::NodePort> {
    node_ports_of(state, false)
}

/// The NodePorts the host must send into the switch over IPv6 (of
/// Services with an IPv6 ClusterIP: a dual-stack Service's NodePort
/// answers on both families), sorted.
pub fn node_ports6(state: &ClusterState) -> Vec<crate::hostnet::NodePort> {
    node_ports_of(state, true)
}

fn node_ports_of(state: &ClusterState, v6: bool) -> Vec<crate::hostnet::NodePort> {
    let mut out = Vec::new();
    for (key, svc) in &state.services {
        let has = match v6 {
            false => svc.cluster_ip.is_some(),
            true => svc.cluster_ip6.is_some(),
        };
        if !has {
            continue;
        }
        for p in &svc.ports {
            let (Some(port), Some(protocol)) = (p.node_port, host_protocol(p.protocol)) else {
                continue;
            };
            out.push(crate::hostnet::NodePort {
                protocol,
                port,
                service: format!("{}/{}:{}", key.0, key.1, p.name),
            });
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.protocol == b.protocol && a.port == b.port);
    out
}

fn host_protocol(p: Protocol) -> Option<&'static str> {
    match p {
        Protocol::Tcp => Some("tcp"),
        Protocol::Udp => Some("udp"),
        Protocol::Sctp => Some("sctp"),
    }
}

/// The addresses the host routes into the switch (via [`SERVICE_VIP`]):
/// every IPv4 ClusterIP, external and load balancer address the proxy
/// serves, sorted.
pub fn host_routes(state: &ClusterState) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = Vec::new();
    for svc in state.services.values() {
        let Some(ip) = svc.cluster_ip else {
            continue;
        };
        out.push(ip);
        out.extend(svc.external_ips.iter().filter_map(|ip| match ip {
            IpAddr::V4(a) if external_ip_allowed(state, *ip) => Some(*a),
            _ => None,
        }));
    }
    out.sort();
    out.dedup();
    out
}

/// The IPv6 addresses the host routes into the switch (via
/// [`SERVICE_VIP6`]): every IPv6 ClusterIP, external and load balancer
/// address the proxy serves, sorted.
pub fn host_routes6(state: &ClusterState) -> Vec<Ipv6Addr> {
    let mut out: Vec<Ipv6Addr> = Vec::new();
    for svc in state.services.values() {
        let Some(ip) = svc.cluster_ip6 else {
            continue;
        };
        out.push(ip);
        out.extend(svc.external_ips.iter().filter_map(|ip| match ip {
            IpAddr::V6(a) if external_ip_allowed(state, *ip) => Some(*a),
            _ => None,
        }));
    }
    out.sort();
    out.dedup();
    out
}

/// `ADDR:PORT` as `nat(dst=...)` writes it (an IPv6 address in brackets).
fn nat_target(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The endpoint address in the session affinity registers: `reg6`
/// ([`regs::ENDPOINT_IP`]) for IPv4, `reg8`-`reg11`
/// ([`regs::ENDPOINT_IP6`], most significant word first) for IPv6; as
/// loads or as matches.
fn endpoint_ip_regs(ip: IpAddr, load: bool) -> Vec<String> {
    let put = |f: &regs::RegField, v: u32| if load { f.load(v) } else { f.matching(v) };
    match ip {
        IpAddr::V4(a) => vec![put(&regs::ENDPOINT_IP, u32::from(a))],
        IpAddr::V6(a) => {
            let n = u128::from(a);
            regs::ENDPOINT_IP6
                .iter()
                .enumerate()
                .map(|(i, f)| put(f, (n >> (96 - 32 * i)) as u32))
                .collect()
        }
    }
}

/// Where a ServiceLB flow sends a new connection.
struct Frontend<'a> {
    sp: &'a ServicePortFlows,
    nw_dst: IpAddr,
    tp_dst: u16,
}

impl Frontend<'_> {
    fn flow(&self, priority: u16) -> FlowLine {
        let fl = FlowLine::new(SERVICE_LB, priority, cookie::service(self.sp.group_id))
            .matching("ct_state=+new+trk");
        match self.nw_dst {
            IpAddr::V4(a) => fl
                .matching(self.sp.protocol.keyword())
                .matching(format!("nw_dst={a}")),
            IpAddr::V6(a) => fl
                .matching(self.sp.protocol.keyword6())
                .matching(format!("ipv6_dst={a}")),
        }
        .matching(format!("tp_dst={}", self.tp_dst))
    }
}

/// Collects flows and the groups they use.
#[derive(Default)]
struct Builder {
    flows: Vec<String>,
    groups: Vec<(u32, String)>,
    made: BTreeSet<u32>,
    /// Endpoints of Services with session affinity: their EndpointDNAT
    /// flows.
    dnat: BTreeSet<(Protocol, IpAddr, u16)>,
}

impl Builder {
    /// `flow` to `kind`'s group (made once). Without endpoints: rejected
    /// if the Service port has none at all (as kube-proxy rejects it), else
    /// (none on this node for a `Local` policy) dropped, as kube-proxy
    /// drops it.
    fn send_to_group(&mut self, flow: FlowLine, sp: &ServicePortFlows, kind: GroupKind) {
        if sp.endpoints.is_empty() {
            self.flows.push(flow.action(reject_action()).into());
            return;
        }
        if sp.endpoints_of(kind).is_empty() {
            self.flows.push(flow.drop_packet().into());
            return;
        }
        let id = sp.group(kind);
        if let Some(timeout) = sp.affinity {
            // Session affinity (module doc): a learned endpoint first,
            // then the choice of the group, learned.
            let hit = flow
                .clone()
                .with_priority(flow.priority() + priority::service_lb::AFFINITY_HIT)
                .mark(regs::AFFINITY_HIT)
                .goto(ENDPOINT_DNAT);
            let learn = flow
                .clone()
                .with_priority(flow.priority() + priority::service_lb::AFFINITY_LEARN)
                .mark(regs::AFFINITY_LEARN)
                .action(learn_action(sp, timeout))
                .goto(ENDPOINT_DNAT);
            self.flows.push(hit.into());
            self.flows.push(learn.into());
            for (ip, port) in sp.endpoints_of(kind) {
                self.dnat.insert((sp.protocol, *ip, *port));
            }
        }
        self.flows.push(flow.action(format!("group:{id}")).into());
        if self.made.insert(id) {
            self.groups.push((id, group_line(sp, kind)));
        }
    }

    /// EndpointDNAT: the endpoint in `reg6`/`reg7[0..15]`, DNATed (with
    /// the from-gateway mark when the connection entered from the host);
    /// a learned endpoint that is gone: chosen again by ServiceLB.
    fn endpoint_dnat_flows(&mut self) {
        let mut v: Vec<String> = Vec::new();
        for (proto, ip, port) in &self.dnat {
            let target = nat_target(*ip, *port);
            let base = |prio: u16| {
                let keyword = match ip.is_ipv6() {
                    true => proto.keyword6(),
                    false => proto.keyword(),
                };
                let mut fl = FlowLine::new(ENDPOINT_DNAT, prio, cookie::DEFAULTS).matching(keyword);
                for m in endpoint_ip_regs(*ip, false) {
                    fl = fl.matching(m);
                }
                fl.matching(regs::ENDPOINT_PORT.matching(u32::from(*port)))
            };
            v.push(
                base(priority::endpoint_dnat::FROM_GATEWAY)
                    .mark(regs::FROM_GATEWAY)
                    .action(format!(
                        "ct(commit,table={},zone={CT_ZONE},exec({}),nat(dst={target}))",
                        EGRESS_RULE.id,
                        regs::FROM_GATEWAY_CT_MARK.load()
                    ))
                    .into(),
            );
            v.push(
                base(priority::endpoint_dnat::ENDPOINT)
                    .action(format!(
                        "ct(commit,table={},zone={CT_ZONE},nat(dst={target}))",
                        EGRESS_RULE.id
                    ))
                    .into(),
            );
        }
        v.push(
            FlowLine::new(
                ENDPOINT_DNAT,
                priority::endpoint_dnat::STALE,
                cookie::DEFAULTS,
            )
            .mark(regs::AFFINITY_HIT)
            .action(regs::AFFINITY.load(0))
            .action(format!("resubmit(,{})", SERVICE_LB.id))
            .into(),
        );
        v.push(
            FlowLine::new(ENDPOINT_DNAT, priority::DEFAULT, cookie::DEFAULTS)
                .drop_packet()
                .into(),
        );
        self.flows.extend(v);
    }
}

/// The `learn` of a Service port with session affinity: a SessionAffinity
/// flow for this client and frontend (address, port), for `timeout`
/// seconds from the last new connection, that gives the endpoint just
/// chosen (`reg6`, `reg7[0..15]`) and marks the packet [`regs::AFFINITY_HIT`].
/// It carries the Service port's cookie and goes with its ServiceLB flows
/// (`delete_learned`).
fn learn_action(sp: &ServicePortFlows, timeout: u32) -> String {
    let (proto, l4_dst) = match sp.protocol {
        Protocol::Tcp => (6, "NXM_OF_TCP_DST[]"),
        Protocol::Udp => (17, "NXM_OF_UDP_DST[]"),
        Protocol::Sctp => (132, "OXM_OF_SCTP_DST[]"),
    };
    let (eth_type, addrs, ip_regs): (&str, &str, Vec<String>) = match sp.v6() {
        false => (
            "0x800",
            "NXM_OF_IP_SRC[],NXM_OF_IP_DST[]",
            vec![regs::ENDPOINT_IP.nxm()],
        ),
        true => (
            "0x86dd",
            "NXM_NX_IPV6_SRC[],NXM_NX_IPV6_DST[]",
            regs::ENDPOINT_IP6.iter().map(|f| f.nxm()).collect(),
        ),
    };
    let loads: String = ip_regs.iter().map(|r| format!("load:{r}->{r},")).collect();
    format!(
        "learn(table={},hard_timeout={timeout},priority={},delete_learned,cookie={:#x},eth_type={eth_type},nw_proto={proto},{addrs},{l4_dst},{loads}load:{port}->{port},load:{hit:#x}->{aff})",
        SESSION_AFFINITY.id,
        priority::session_affinity::LEARNED,
        cookie::service(sp.group_id),
        port = regs::ENDPOINT_PORT.nxm(),
        hit = regs::AFFINITY_HIT.value,
        aff = regs::AFFINITY.nxm(),
    )
}

/// The proxy's flows and groups for the cluster on this node (see the
/// module doc).
pub fn proxy_flows(state: &ClusterState, node_name: &str, node: &NodeNet) -> ProxyFlows {
    let mut ports = service_ports(state, node_name);
    // IPv6 ClusterIPs on a dual-stack node only.
    ports.retain(|sp| !sp.v6() || node.ipv6.is_some());
    let mut b = Builder::default();
    for sp in &ports {
        let cluster = Frontend {
            sp,
            nw_dst: sp.cluster_ip,
            tp_dst: sp.port,
        };
        let kind = match sp.internal_local {
            true => GroupKind::Local,
            false => GroupKind::Cluster,
        };
        b.send_to_group(cluster.flow(priority::service_lb::SERVICE), sp, kind);
        // Traffic arriving at the node: its NodePort (DNATed to the
        // Service VIP by the host, so only from the gateway) and its
        // external addresses.
        let mut outside: Vec<(Frontend, bool)> = Vec::new();
        if let Some(np) = sp.node_port {
            let f = Frontend {
                sp,
                nw_dst: match sp.v6() {
                    false => SERVICE_VIP.into(),
                    true => SERVICE_VIP6.into(),
                },
                tp_dst: np,
            };
            outside.push((f, true));
        }
        for ip in &sp.external_ips {
            let f = Frontend {
                sp,
                nw_dst: *ip,
                tp_dst: sp.port,
            };
            outside.push((f, false));
        }
        for (f, node_port) in outside {
            let (all, local) = match node_port {
                true => (GroupKind::NodePort, GroupKind::NodePortLocal),
                false => (GroupKind::Cluster, GroupKind::Local),
            };
            let flow = |prio: u16| {
                let fl = f.flow(prio);
                match node_port {
                    true => fl.mark(regs::FROM_GATEWAY),
                    false => fl,
                }
            };
            if sp.external_local {
                // This node's endpoints, the client's address kept; this
                // node's own pods reach every endpoint (as kube-proxy).
                b.send_to_group(flow(priority::service_lb::SERVICE), sp, local);
                let src = match (sp.v6(), &node.ipv4, &node.ipv6) {
                    (false, Some(v4), _) => Some(format!("nw_src={}", v4.pod_cidr)),
                    (true, _, Some(v6)) => Some(format!("ipv6_src={}", v6.pod_cidr)),
                    _ => None,
                };
                if let Some(src) = src {
                    let from_pods = flow(priority::service_lb::FROM_LOCAL_PODS).matching(src);
                    b.send_to_group(from_pods, sp, all);
                }
            } else {
                let f = flow(priority::service_lb::SERVICE);
                let f = match sp.endpoints.is_empty() {
                    true => f,
                    false => f.set_mark(regs::SERVICE_SNAT_MARK),
                };
                b.send_to_group(f, sp, all);
            }
        }
    }
    b.endpoint_dnat_flows();
    b.groups.sort();
    ProxyFlows {
        flows: b.flows,
        groups: b.groups.into_iter().map(|(_, g)| g).collect(),
        ports,
    }
}

/// The action that rejects a packet: to the controller with the reject
/// userdata, which the switch answers itself with an ICMP "port
/// unreachable" (`switch/src/reject.rs`).
pub fn reject_action() -> String {
    let hex: Vec<String> = oxvs_pipeline::flow::REJECT_USERDATA
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("controller(userdata={})", hex.join("."))
}

/// The select group of one Service port for `kind`'s endpoints.
fn group_line(sp: &ServicePortFlows, kind: GroupKind) -> String {
    let mut g = format!("group_id={},type=select", sp.group(kind));
    if sp.affinity.is_some() {
        g.push_str(match sp.v6() {
            false => ",selection_method=hash,fields(ip_src)",
            true => ",selection_method=hash,fields(ipv6_src)",
        });
    }
    let exec = match kind.node_port() {
        true => format!(",exec({})", regs::FROM_GATEWAY_CT_MARK.load()),
        false => String::new(),
    };
    let mut ids = BTreeSet::new();
    for (ip, port) in sp.endpoints_of(kind) {
        // Bucket ids stop below OpenFlow 1.5's reserved 0xffffff00.
        let mut id = fnv1a32(&format!("{ip}:{port}")) % 0xffff_ff00;
        while !ids.insert(id) {
            id = (id + 1) % 0xffff_ff00;
        }
        let actions = match sp.affinity {
            // The endpoint in registers, back to ServiceLB to learn it.
            Some(_) => format!(
                "{},{},{},resubmit(,{})",
                endpoint_ip_regs(*ip, true).join(","),
                regs::ENDPOINT_PORT.load(u32::from(*port)),
                regs::AFFINITY_LEARN.load(),
                SERVICE_LB.id
            ),
            None => format!(
                "ct(commit,table={},zone={CT_ZONE}{exec},nat(dst={}))",
                EGRESS_RULE.id,
                nat_target(*ip, *port)
            ),
        };
        g.push_str(&format!(
            ",bucket=bucket_id:{id},weight:100,actions={actions}"
        ));
    }
    g
}

/// The way in (with the proxy): ConntrackState's new connections look for
/// a learned endpoint first (SessionAffinity, whose learned flows only
/// load registers: hence `resubmit`, which comes back), then meet
/// ServiceLB.
pub fn conntrack_state_default() -> FlowLine {
    FlowLine::new(CONNTRACK_STATE, priority::DEFAULT, cookie::DEFAULTS)
        .action(format!("resubmit(,{})", SESSION_AFFINITY.id))
        .action(format!("resubmit(,{})", SERVICE_LB.id))
}

/// SessionAffinity without a learned flow for the packet: no endpoint known.
pub fn session_affinity_default() -> FlowLine {
    FlowLine::new(SESSION_AFFINITY, priority::DEFAULT, cookie::DEFAULTS)
        .action(regs::AFFINITY.load(0))
}

/// The node's flows for traffic from outside (module doc, "From outside
/// the node"): the switch answers ARP for [`SERVICE_VIP`] with the
/// gateway's MAC (the host routes Service addresses to it), ServiceSNAT
/// SNATs marked connections to the gateway address, and ConntrackZone
/// un-SNATs their replies first.
pub fn outside_node_flows(node: &NodeNet) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    if node.ipv6.is_some() {
        // The host's next hop for IPv6 ClusterIPs.
        v.extend(
            crate::flows::ipv6::nd_answer(cookie::GATEWAY, SERVICE_VIP6, &node.gateway_mac)
                .into_iter()
                .map(String::from),
        );
    }
    let mut families: Vec<(&str, String, String)> = Vec::new();
    if let Some(v4) = &node.ipv4 {
        v.push(crate::flows::arp_answer(cookie::GATEWAY, SERVICE_VIP, &node.gateway_mac).into());
        families.push((
            "ip",
            format!("nw_dst={}", v4.gateway_ip),
            v4.gateway_ip.to_string(),
        ));
    }
    if let Some(v6) = &node.ipv6 {
        families.push((
            "ipv6",
            format!("ipv6_dst={}", v6.gateway_ip),
            format!("[{}]", v6.gateway_ip),
        ));
    }
    for (family, to_gw, gw) in families {
        v.extend([
            FlowLine::new(
                CONNTRACK_ZONE,
                priority::conntrack_zone::SNAT_REPLY,
                cookie::DEFAULTS,
            )
            .matching("ct_state=-trk")
            .matching(family)
            .matching(to_gw)
            .action(format!(
                "ct(table={},zone={HAIRPIN_ZONE},nat)",
                CONNTRACK_ZONE.id
            ))
            .into(),
            // A new connection: marked SNATed in the pod traffic zone,
            // then SNATed.
            FlowLine::new(SERVICE_SNAT, priority::service_snat::SNAT, cookie::DEFAULTS)
                .matching("ct_state=+new+trk")
                .matching(family)
                .matching(format!("ct_zone={CT_ZONE}"))
                .mark(regs::SERVICE_SNAT_MARK)
                .action(format!(
                    "ct(commit,zone={CT_ZONE},exec({}))",
                    regs::SERVICE_SNAT_CT_MARK.load()
                ))
                .action(format!(
                    "ct(commit,table={},zone={HAIRPIN_ZONE},nat(src={gw}:{}-{}))",
                    L2_FORWARDING_CALC.id, SNAT_PORTS.0, SNAT_PORTS.1
                ))
                .into(),
            // Its later packets the client's way: SNATed as the first.
            FlowLine::new(SERVICE_SNAT, priority::service_snat::SNAT, cookie::DEFAULTS)
                .matching("ct_state=-new-rpl+trk")
                .matching(family)
                .matching(format!("ct_zone={CT_ZONE}"))
                .mark(regs::SERVICE_SNAT_CT_MARK)
                .action(format!(
                    "ct(table={},zone={HAIRPIN_ZONE},nat)",
                    L2_FORWARDING_CALC.id
                ))
                .into(),
        ]);
    }
    v.push(
        FlowLine::new(SERVICE_SNAT, priority::DEFAULT, cookie::DEFAULTS)
            .goto(L2_FORWARDING_CALC)
            .into(),
    );
    v
}

/// The node's hairpin flows (module doc, "Hairpin"), for IPv6 too on a
/// dual-stack node.
pub fn hairpin_node_flows(node: &NodeNet) -> Vec<String> {
    let mut families = vec![("ip", IpAddr::from(HAIRPIN_IP))];
    if node.ipv6.is_some() {
        families.push(("ipv6", IpAddr::from(HAIRPIN_IP6)));
    }
    let mut v = Vec::new();
    for (family, hairpin) in families {
        let dst = match hairpin {
            IpAddr::V4(a) => format!("nw_dst={a}"),
            IpAddr::V6(a) => format!("ipv6_dst={a}"),
        };
        v.push(
            FlowLine::new(
                CONNTRACK_ZONE,
                priority::conntrack_zone::HAIRPIN,
                cookie::DEFAULTS,
            )
            .matching("ct_state=-trk")
            .matching(family)
            .matching(dst)
            .action(format!(
                "ct(table={},zone={HAIRPIN_ZONE},nat)",
                CONNTRACK_ZONE.id
            ))
            .into(),
        );
        v.push(
            FlowLine::new(
                CONNTRACK_COMMIT,
                priority::conntrack_commit::HAIRPIN,
                cookie::DEFAULTS,
            )
            .matching(family)
            .matching(format!("ct_zone={HAIRPIN_ZONE}"))
            .goto(OUTPUT)
            .into(),
        );
    }
    v
}

/// One local pod's hairpin flows (module doc, "Hairpin"), for its IPv6
/// address too.
pub fn hairpin_pod_flows(node: &NodeNet, pod: &PodPort) -> Vec<String> {
    let c = cookie::pod(pod.ofport);
    let hairpin = |family: &str, [src, dst]: [String; 2], snat: String| -> String {
        FlowLine::new(L3_FORWARDING, priority::l3_forwarding::HAIRPIN, c)
            .matching(family)
            .matching(src)
            .matching(dst)
            .action(format!("set_field:{}->eth_src", mac_str(&node.gateway_mac)))
            .action(format!("set_field:{}->eth_dst", mac_str(&pod.mac)))
            .action(format!(
                "ct(commit,table={},zone={HAIRPIN_ZONE},nat(src={snat}))",
                L3_DEC_TTL.id
            ))
            .into()
    };
    let mut v: Vec<String> = pod
        .ip
        .filter(|_| node.ipv4.is_some())
        .map(|ip| {
            hairpin(
                "ip",
                [format!("nw_src={ip}"), format!("nw_dst={ip}")],
                HAIRPIN_IP.to_string(),
            )
        })
        .into_iter()
        .collect();
    if let Some(ip6) = pod.ip6.filter(|_| node.ipv6.is_some()) {
        v.push(hairpin(
            "ipv6",
            [format!("ipv6_src={ip6}"), format!("ipv6_dst={ip6}")],
            HAIRPIN_IP6.to_string(),
        ));
    }
    v.push(
        FlowLine::new(OUTPUT, priority::output::HAIRPIN, c)
            .matching(format!("in_port={}", pod.ofport))
            .matching(regs::TARGET_OFPORT.matching(pod.ofport))
            .mark(regs::OFPORT_FOUND_MARK)
            .action("IN_PORT")
            .into(),
    );
    v
}

/// ConntrackZone with the proxy: NATed connections are translated.
pub fn conntrack_zone_action() -> String {
    format!("ct(table={},zone={CT_ZONE},nat)", CONNTRACK_STATE.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, EndpointPort, EndpointSet, Node, Service, ServicePort};

    fn state() -> ClusterState {
        let mut st = ClusterState::default();
        for (name, cidr, ip) in [
            ("n1", "10.244.1.0/24", "192.168.77.11"),
            ("n2", "10.244.2.0/24", "192.168.77.12"),
        ] {
            st.nodes.insert(
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
        let svc = Service {
            namespace: "web".into(),
            name: "front".into(),
            cluster_ip: Some("10.96.0.30".parse().unwrap()),
            cluster_ip6: None,
            ports: vec![
                ServicePort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 80,
                    node_port: Some(30080),
                },
                ServicePort {
                    name: "sctp".into(),
                    protocol: Protocol::Sctp,
                    port: 90,
                    node_port: Some(30090),
                },
            ],
            affinity_timeout: None,
            // A pod's address, a node's, loopback: refused; one good.
            external_ips: ["10.244.2.7", "192.168.77.12", "127.0.0.1", "192.0.2.5"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect(),
            external_local: true,
            internal_local: false,
        };
        st.services.insert(svc.key(), svc);
        let ep = |ip: &str, node: &str| Endpoint {
            ip: ip.parse().unwrap(),
            ready: true,
            node_name: Some(node.into()),
            ports: vec![EndpointPort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080,
            }],
        };
        st.endpoints.insert(
            ("web".into(), "front".into()),
            EndpointSet {
                service: ("web".into(), "front".into()),
                endpoints: vec![ep("10.244.1.2", "n1"), ep("10.244.2.2", "n2")],
            },
        );
        st
    }

    fn node() -> NodeNet {
        NodeNet {
            ipv4: Some(crate::flows::NodeNet4 {
                pod_cidr: "10.244.1.0/24".parse().unwrap(),
                gateway_ip: "10.244.1.1".parse().unwrap(),
            }),
            gateway_mac: [0x0a, 0x58, 10, 244, 1, 1],
            gateway_ofport: 2,
            ipv6: None,
        }
    }

    #[test]
    fn external_addresses_of_the_cluster_are_refused() {
        let st = state();
        let ports = service_ports(&st, "n1");
        assert_eq!(
            ports[0].external_ips,
            ["192.0.2.5".parse::<Ipv4Addr>().unwrap()]
        );
        assert_eq!(
            host_routes(&st),
            ["10.96.0.30", "192.0.2.5"]
                .map(|s| s.parse::<Ipv4Addr>().unwrap())
                .to_vec()
        );
        assert!(external_ip_allowed(&st, "203.0.113.9".parse().unwrap()));
        for bad in [
            "10.244.1.200",
            "192.168.77.11",
            "169.254.169.253",
            "224.0.0.1",
            "0.0.0.0",
        ] {
            assert!(!external_ip_allowed(&st, bad.parse().unwrap()), "{bad}");
        }
    }

    /// A trace of `spec` through node n1's flows with `state` and `extra`
    /// flows (a learned one, say).
    fn trace_proxy(state: &ClusterState, extra: &str, spec: &str) -> String {
        let inp = crate::desired::Inputs {
            pods: vec![PodPort {
                ofport: 4,
                ip: Some("10.244.1.3".parse().unwrap()),
                mac: [0x0a, 0x58, 10, 244, 1, 3],
                ip6: None,
            }],
            state: std::sync::Arc::new(state.clone()),
            proxy: true,
            node_name: "n1".into(),
            ..crate::desired::Inputs::for_node(node())
        };
        crate::desired::trace_desired(&inp, extra, spec)
    }

    #[test]
    fn session_affinity_learns_follows_and_forgets_a_gone_endpoint() {
        let mut st = state();
        if let Some(s) = st.services.values_mut().next() {
            s.affinity_timeout = Some(30);
        }
        let syn = "in_port=4,tcp,dl_src=0a:58:0a:f4:01:03,dl_dst=0a:58:0a:f4:01:01,nw_src=10.244.1.3,nw_dst=10.96.0.30,tp_src=40000,tp_dst=80,tcp_flags=+syn";
        // First connection: the group chooses, ServiceLB learns it, and
        // EndpointDNAT translates.
        let t = trace_proxy(&st, "", syn);
        assert!(t.contains("SessionAffinity"), "{t}");
        assert!(
            t.contains("-> table=34") && t.contains("hard=30"),
            "learns:\n{t}"
        );
        assert!(t.contains("EndpointDNAT"), "{t}");
        assert!(t.contains("nat(dst=10.244."), "{t}");
        // A learned endpoint: straight to EndpointDNAT, no group, no learn.
        let learned = "table=34,priority=200,tcp,nw_src=10.244.1.3,nw_dst=10.96.0.30,tp_dst=80 actions=load:0xaf40202->NXM_NX_REG6[],load:0x1f90->NXM_NX_REG7[0..15],load:0x1->NXM_NX_REG7[16..18]\n";
        let t = trace_proxy(&st, learned, syn);
        assert!(!t.contains("group:") && !t.contains("-> table=34"), "{t}");
        assert!(t.contains("nat(dst=10.244.2.2:8080)"), "{t}");
        // A learned endpoint that is gone (10.244.2.99): chosen again,
        // learned anew.
        let stale = learned.replace("0xaf40202", "0xaf40263");
        let t = trace_proxy(&st, &stale, syn);
        assert!(t.contains("group:") && t.contains("-> table=34"), "{t}");
        assert!(!t.contains("10.244.2.99"), "{t}");
    }

    #[test]
    fn node_ports_of_every_protocol_go_to_the_host() {
        let np = node_ports(&state());
        let got: Vec<(&str, u16, &str)> = np
            .iter()
            .map(|p| (p.protocol, p.port, p.service.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("sctp", 30090, "web/front:sctp"),
                ("tcp", 30080, "web/front:http")
            ]
        );
    }

    #[test]
    fn local_traffic_policy_keeps_to_this_nodes_endpoints() {
        let st = state();
        let p = proxy_flows(&st, "n1", &node());
        let sp = &p.ports[0];
        assert_eq!(sp.local_endpoints, [("10.244.1.2".parse().unwrap(), 8080)]);
        assert_eq!(sp.endpoints.len(), 2);
        // NodePort, Local: this node's endpoint, no SNAT mark; from this
        // node's pods: every endpoint.
        let np: Vec<&String> = p
            .flows
            .iter()
            .filter(|f| f.contains("tp_dst=30080"))
            .collect();
        assert_eq!(np.len(), 2, "{np:?}");
        assert!(np.iter().all(|f| !f.contains("REG0[20]")), "{np:?}");
        let local_group = sp.group(GroupKind::NodePortLocal);
        assert!(np
            .iter()
            .any(|f| f.ends_with(&format!("group:{local_group}"))));
        assert!(np.iter().any(|f| f.contains("nw_src=10.244.1.0/24")
            && f.ends_with(&format!("group:{}", sp.group(GroupKind::NodePort)))));
        let g = p
            .groups
            .iter()
            .find(|g| g.starts_with(&format!("group_id={local_group},")))
            .unwrap();
        assert!(
            g.contains("exec(load:0x1->NXM_NX_CT_MARK[0])") && !g.contains("10.244.2.2"),
            "{g}"
        );
        // On a node without endpoints, the Local frontends drop.
        let p2 = proxy_flows(&st, "n3", &node());
        assert!(p2
            .flows
            .iter()
            .any(|f| f.contains("tp_dst=30080") && f.ends_with("actions=drop")));
        // Every flow and group parses.
        let text = format!("{}\n", p.flows.join("\n"));
        let ctx = oxvs_pipeline::parse::ParseContext::default();
        oxvs_pipeline::parse::parse_flow_file(&text, &ctx).expect("flows parse");
        for g in &p.groups {
            oxvs_pipeline::parse::parse_group(g, &ctx).expect("group parses");
        }
    }

    /// [`state`] with `web/front` dual-stack: IPv6 ClusterIP and endpoints
    /// on both nodes.
    fn dual_state() -> ClusterState {
        let mut st = state();
        if let Some(s) = st.services.values_mut().next() {
            s.cluster_ip6 = Some("fd00:10:96::30".parse().unwrap());
        }
        if let Some(e) = st.endpoints.values_mut().next() {
            let mut six: Vec<Endpoint> = e.endpoints.clone();
            for (ep, ip) in six.iter_mut().zip(["fd00:10:244:1::2", "fd00:10:244:2::2"]) {
                ep.ip = ip.parse().unwrap();
            }
            e.endpoints.extend(six);
        }
        st
    }

    fn dual_node() -> NodeNet {
        NodeNet {
            ipv6: Some(crate::flows::NodeNet6::of(
                "fd00:10:244:1::/64".parse().unwrap(),
            )),
            ..node()
        }
    }

    #[test]
    fn an_ipv6_cluster_ip_is_balanced_over_the_ipv6_endpoints() {
        let st = dual_state();
        let ports = service_ports(&st, "n1");
        // IPv4 ports first, with the ids they have without IPv6.
        let v4_only = service_ports(&state(), "n1");
        assert_eq!(ports[..v4_only.len()], v4_only[..]);
        let six: Vec<&ServicePortFlows> = ports.iter().filter(|p| p.v6()).collect();
        assert_eq!(six.len(), 2, "http and sctp over IPv6");
        let http6 = six[0];
        assert_eq!(
            http6.cluster_ip,
            "fd00:10:96::30".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            http6.endpoints,
            [
                ("fd00:10:244:1::2".parse().unwrap(), 8080),
                ("fd00:10:244:2::2".parse().unwrap(), 8080)
            ]
        );
        // The NodePort answers over IPv6 too; the external addresses are
        // IPv4 ones (192.0.2.5) and stay with the IPv4 port.
        assert_eq!(
            (http6.node_port, http6.external_ips.len()),
            (Some(30080), 0)
        );
        assert_eq!(node_ports6(&st).len(), 2, "http and sctp");
        assert!(six
            .iter()
            .all(|p| !v4_only.iter().any(|q| q.group_id == p.group_id)));
        assert_eq!(
            host_routes6(&st),
            ["fd00:10:96::30".parse::<Ipv6Addr>().unwrap()]
        );
        let p = proxy_flows(&st, "n1", &dual_node());
        assert!(p.flows.iter().any(|f| f.contains("tcp6")
            && f.contains("ipv6_dst=fd00:10:96::30")
            && f.contains("tp_dst=80")
            && f.ends_with(&format!("group:{}", http6.group_id))));
        let g = p
            .groups
            .iter()
            .find(|g| g.starts_with(&format!("group_id={},", http6.group_id)))
            .unwrap();
        assert!(
            g.contains("nat(dst=[fd00:10:244:2::2]:8080)") && !g.contains("10.244."),
            "{g}"
        );
        // The NodePort over IPv6 (DNATed by the host to the IPv6 VIP);
        // `externalTrafficPolicy: Local`: this node's pods reach every
        // endpoint.
        let np6: Vec<&String> = p
            .flows
            .iter()
            .filter(|f| f.contains("ipv6_dst=fc01::a9fe:a9fd") && f.contains("tp_dst=30080"))
            .collect();
        assert_eq!(np6.len(), 2, "{np6:?}");
        assert!(
            np6.iter()
                .any(|f| f.contains("ipv6_src=fd00:10:244:1::/64")),
            "{np6:?}"
        );
        // The node's IPv6 flows: hairpin, the VIP answered, SNAT to the
        // IPv6 gateway.
        let node_flows = [
            hairpin_node_flows(&dual_node()),
            outside_node_flows(&dual_node()),
        ]
        .concat();
        assert!(node_flows
            .iter()
            .any(|f| f.contains("ipv6_dst=fc01::a9fe:a9fc")));
        assert!(node_flows
            .iter()
            .any(|f| f.contains("nd_target=fc01::a9fe:a9fd")));
        assert!(node_flows
            .iter()
            .any(|f| f.contains("nat(src=[fd00:10:244:1::1]:61000-65535)")));
        // On an IPv4-only node none of them.
        let v4_node = [hairpin_node_flows(&node()), outside_node_flows(&node())].concat();
        assert!(v4_node.iter().all(|f| !f.contains("fc01::")));
        // Every flow and group parses.
        let text = format!("{}\n{}\n", p.flows.join("\n"), node_flows.join("\n"));
        let ctx = oxvs_pipeline::parse::ParseContext::default();
        oxvs_pipeline::parse::parse_flow_file(&text, &ctx).expect("flows parse");
        for g in &p.groups {
            oxvs_pipeline::parse::parse_group(g, &ctx).expect("group parses");
        }
    }

    #[test]
    fn ipv6_session_affinity_learns_the_endpoint_in_reg8_to_reg11() {
        let mut st = dual_state();
        if let Some(s) = st.services.values_mut().next() {
            s.affinity_timeout = Some(30);
        }
        let inp = crate::desired::Inputs {
            pods: vec![PodPort {
                ofport: 4,
                ip: Some("10.244.1.3".parse().unwrap()),
                mac: [0x0a, 0x58, 10, 244, 1, 3],
                ip6: Some("fd00:10:244:1::3".parse().unwrap()),
            }],
            state: std::sync::Arc::new(st),
            proxy: true,
            node_name: "n1".into(),
            ..crate::desired::Inputs::for_node(dual_node())
        };
        let syn = "in_port=4,tcp6,dl_src=0a:58:0a:f4:01:03,dl_dst=0a:58:0a:f4:01:01,ipv6_src=fd00:10:244:1::3,ipv6_dst=fd00:10:96::30,tp_src=40000,tp_dst=80,tcp_flags=+syn";
        let t = crate::desired::trace_desired(&inp, "", syn);
        assert!(
            t.contains("-> table=34") && t.contains("hard=30"),
            "learns:\n{t}"
        );
        assert!(t.contains("nat(dst=[fd00:10:244:"), "{t}");
        // A learned IPv6 endpoint: straight to EndpointDNAT.
        let learned = "table=34,priority=200,tcp6,ipv6_src=fd00:10:244:1::3,ipv6_dst=fd00:10:96::30,tp_dst=80 actions=load:0xfd000010->NXM_NX_REG8[],load:0x2440002->NXM_NX_REG9[],load:0->NXM_NX_REG10[],load:0x2->NXM_NX_REG11[],load:0x1f90->NXM_NX_REG7[0..15],load:0x1->NXM_NX_REG7[16..18]\n";
        let t = crate::desired::trace_desired(&inp, learned, syn);
        assert!(!t.contains("group:") && !t.contains("-> table=34"), "{t}");
        assert!(t.contains("nat(dst=[fd00:10:244:2::2]:8080)"), "{t}");
    }
}
