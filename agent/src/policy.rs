//! NetworkPolicy (networking.k8s.io/v1) -> flows (pure).
//!
//! [`policy_flows`] turns every NetworkPolicy of a [`ClusterState`] into the
//! flows that enforce it on the pods attached to this node; [`allowed`] is
//! the reference interpreter of the same semantics (see [`eval`] for the
//! exact rules), written independently of the translation and used as the
//! tests' oracle.
//!
//! ## Flow layout
//!
//! Tables follow [`crate::flows`] (which owns their priority-0 defaults and
//! the `+est`/`+rel` bypasses at priority 210); this module adds only:
//!
//! | table | priority | match | actions | cookie |
//! |---|---|---|---|---|
//! | EgressRule 40 | 201 | a one-dimension rule's clause | `load:ID->NXM_NX_REG5[]`, goto EgressMetric | rule |
//! | EgressRule 40 | 200 | clause of rule(s) | `conjunction(ID,k/n)`... | rule (smallest id) |
//! | EgressRule 40 | 200 | `conj_id=ID, ip` | `load:ID->NXM_NX_REG5[]`, goto EgressMetric | rule |
//! | EgressDefaultRule 41 | 200 | `ip, nw_src=POD` (isolated for egress) | drop | isolation |
//! | EgressMetric 45 | 200 | `ip, reg5=ID` | goto L3Forwarding | rule |
//! | IngressRule 70 | 201/200 | as EgressRule, with `NXM_NX_REG3` | goto IngressMetric | rule |
//! | IngressDefaultRule 71 | 200 | `ip, nw_dst=POD` (isolated for ingress) | drop | isolation |
//! | IngressMetric 75 | 200 | `ip, reg3=ID` | goto ConntrackCommit | rule |
//! | IngressRule 70 | 205 | `ip, nw_src=NODE, reg0=0x2/0xf` (from the gateway) | goto IngressMetric | node exemption |
//! | EgressRule 40 | 205 | `ip, nw_dst=NODE` | goto EgressMetric | node exemption |
//!
//! Traffic between a pod and its own node is always allowed (the API says
//! so; kubelet probes depend on it): when some local pod is isolated in a
//! direction, the node's addresses ([`eval::node_addresses`]: the gateway
//! and the InternalIP) skip that direction's rules and isolation drops.
//! Ingress is exempt only for packets that entered from the gateway port:
//! the node's own stack is the only sender the exemption is for, and a
//! node address as the source of a packet from the tunnel or a pod port is
//! a forgery, not the node.
//!
//! A rule is a conjunction of up to three dimensions, each a set of clause
//! flows (one per value): ingress `1` = source prefixes (`nw_src`), `2` =
//! the selected local pods (`nw_dst`), `3` = services (`tcp, tp_dst=...`);
//! egress `1` = the selected local pods (`nw_src`), `2` = destination
//! prefixes (`nw_dst`), `3` = services. A dimension that is "everything"
//! (no peers, no ports) is left out and the rest renumbered; a rule left
//! with one dimension is plain flows at priority 201 (a conjunction needs
//! two). So a rule costs (peers + pods + services) flows, not their product.
//! A rule with an empty dimension (no selected local pod, peers that resolve
//! to nothing, named ports no destination defines) has no flows.
//!
//! Peers resolve to prefixes: pod peers to the `/32` of every matching pod
//! with an IP and without hostNetwork, on every node; an `ipBlock` to
//! disjoint prefixes covering `cidr` minus its `except`s
//! ([`prefix::ipblock_prefixes`]). Services: a protocol alone (`tcp`), a
//! port (`tcp, tp_dst=80`), a range as value/mask pairs
//! ([`prefix::port_masks`]), or a named port: resolved on each destination
//! pod (ingress: the selected pod; egress: the pods of the rule's pod peers,
//! or every pod for a rule without peers) and matched together with that
//! pod's address (`tcp, nw_dst=POD, tp_dst=8080`), or without the address
//! when every destination of the rule resolves it to the same number.
//!
//! Several rules may need the same (table, priority, match): it is one flow,
//! carrying every rule's `conjunction` action (cookie: the smallest id). Two
//! one-dimension rules with the same clause share one flow that loads the
//! smaller id (the metric then counts those packets for that rule).
//!
//! ## Registers
//!
//! [`regs::INGRESS_RULE`] (`reg3`): the ingress rule that allowed the
//! packet; [`regs::EGRESS_RULE`] (`reg5`): the egress rule. 0: none.
//!
//! ## Cookies
//!
//! From [`crate::cookie`]: [`cookie::rule`] (feature
//! [`Feature::PolicyRule`](cookie::Feature::PolicyRule), object: the rule
//! id) on a rule's flows, [`cookie::isolation`] (the isolation drop of the
//! pod on that port) and [`cookie::NODE_EXEMPTION`].
//!
//! ## Rule ids
//!
//! See [`ids`]: a hash of (policy uid, direction, rule index), never 0,
//! collisions resolved in sorted order; the same on every node and across
//! restarts. [`PolicyFlows::rules`] names the policy of every id used.
//!
//! ## Limits
//!
//! The translation is linear in the size of the policies (an `ipBlock`'s
//! `except` list is sorted once and cut into prefixes,
//! [`prefix::ipblock_prefixes`]), but the flows are the switch's memory
//! and every node's realisation time, and a namespace's editor writes the
//! policy. So one policy may add at most a cap of flows on a node
//! ([`policy_flows_limited`], default [`DEFAULT_MAX_POLICY_FLOWS`]),
//! counted before any of its flows is added. A policy over the cap is
//! refused ([`PolicyFlows::refused`], which the agent logs and counts): its
//! rules get no flows, but the pods it selects are still isolated in its
//! directions, so a refused policy can only drop more, never open traffic
//! (fail closed).
//!
//! ## Determinism
//!
//! Flows are produced from ordered maps and sets: equal input gives equal
//! lines in equal order (the agent diffs line sets).

pub mod eval;
pub mod ids;
pub mod prefix;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use oxvs_pipeline::names::{self, TableDef};
use oxvs_pipeline::regs::{self, RegField};

use crate::cookie;
use crate::flows::FlowLine;
use crate::model::{ClusterState, NetworkPolicy, ObjKey, Peer, Pod, PortRef, Protocol, Rule};
use crate::priority;

pub use eval::{allowed, allowed_l4, allowed_v6, Endpoint, L4};

/// A pod attached to this node (the policies' "applied-to" candidates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPod {
    pub namespace: String,
    pub name: String,
    /// Its IPv4 address: none on an IPv6-only node.
    pub ip: Option<Ipv4Addr>,
    pub ofport: u32,
    /// Its IPv6 address, on a dual-stack or IPv6-only node.
    pub ip6: Option<Ipv6Addr>,
}

impl LocalPod {
    /// Its addresses, IPv4 first.
    fn addresses(&self) -> impl Iterator<Item = IpAddr> {
        self.ip
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.ip6.map(IpAddr::V6))
    }
}

/// Ingress or egress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

/// What a rule id (conjunction id, cookie low bits, reg3/reg5 value) stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleRef {
    pub id: u32,
    pub policy: ObjKey,
    pub uid: String,
    pub direction: Direction,
    /// Index of the rule in `spec.ingress` / `spec.egress`.
    pub index: usize,
}

/// The policy part of a node's flows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyFlows {
    /// Flow lines (tables EgressRule..EgressMetric, IngressRule..IngressMetric).
    pub flows: Vec<String>,
    /// Every rule that has an id, by id.
    pub rules: Vec<RuleRef>,
    /// Policies refused on this node (too many flows), in key order.
    pub refused: Vec<Refusal>,
}

/// The flows one NetworkPolicy may add on one node, unless the agent is
/// told otherwise (`--max-policy-flows`). About a `/8` minus 1 000 scattered
/// exceptions; the policies of the benchmark's app-tier workload need at
/// most a few dozen each.
pub const DEFAULT_MAX_POLICY_FLOWS: usize = 10_000;

/// A NetworkPolicy the translator refused on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub policy: ObjKey,
    /// The flows it would have added (clauses shared with other rules
    /// counted once per rule).
    pub flows: usize,
    pub limit: usize,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NetworkPolicy {}/{} needs {} flows on this node, more than the limit of {} \
             (--max-policy-flows): its rules are not installed and the pods it selects \
             stay isolated (what it would allow is dropped); simplify it (fewer ipBlock \
             except entries, fewer peers or ports) or split it",
            self.policy.0, self.policy.1, self.flows, self.limit
        )
    }
}

/// The tables and register of one direction.
struct Stage {
    rule: TableDef,
    default: TableDef,
    metric: TableDef,
    /// Where the metric table continues.
    next: TableDef,
    reg: RegField,
}

fn stage(dir: Direction) -> Stage {
    match dir {
        Direction::Ingress => Stage {
            rule: names::INGRESS_RULE,
            default: names::INGRESS_DEFAULT_RULE,
            metric: names::INGRESS_METRIC,
            next: names::CONNTRACK_COMMIT,
            reg: regs::INGRESS_RULE,
        },
        Direction::Egress => Stage {
            rule: names::EGRESS_RULE,
            default: names::EGRESS_DEFAULT_RULE,
            metric: names::EGRESS_METRIC,
            next: names::L3_FORWARDING,
            reg: regs::EGRESS_RULE,
        },
    }
}

/// A flow's match, structured so that equal matches compare equal.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct FlowMatch {
    conj_id: Option<u32>,
    /// `None`: `ip`.
    proto: Option<Protocol>,
    /// A rule register ([`Stage::reg`]) holding a rule id.
    reg: Option<(Direction, u32)>,
    /// Of the packet's family ([`FlowMatch::v6`]).
    nw_src: Option<IpNet>,
    nw_dst: Option<IpNet>,
    /// `(value, mask)`; mask `0xffff` is an exact port.
    tp_dst: Option<(u16, u16)>,
    /// Only packets that entered from the gateway
    /// ([`regs::FROM_GATEWAY`]): the node's own traffic.
    from_gateway: bool,
    /// An IPv6 flow (`ipv6`, `tcp6`, `ipv6_src`...); else IPv4. Last, so
    /// that IPv4 flows keep their order.
    v6: bool,
}

impl FlowMatch {
    /// Packets from `n` (every address of its family for a `/0`).
    fn src(n: IpNet) -> FlowMatch {
        FlowMatch {
            nw_src: (n.prefix_len() > 0).then_some(n),
            v6: n.addr().is_ipv6(),
            ..FlowMatch::default()
        }
    }

    /// Packets to `n` (every address of its family for a `/0`).
    fn dst(n: IpNet) -> FlowMatch {
        FlowMatch {
            nw_dst: (n.prefix_len() > 0).then_some(n),
            v6: n.addr().is_ipv6(),
            ..FlowMatch::default()
        }
    }

    /// The same match for the other family (a match without addresses).
    fn as_v6(&self) -> FlowMatch {
        FlowMatch {
            v6: true,
            ..self.clone()
        }
    }
}

fn fmt_net(f: &mut fmt::Formatter<'_>, field: &str, n: &IpNet) -> fmt::Result {
    if n.prefix_len() == n.max_prefix_len() {
        write!(f, ", {field}={}", n.addr())
    } else {
        write!(f, ", {field}={n}")
    }
}

impl fmt::Display for FlowMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(id) = self.conj_id {
            write!(f, "conj_id={id}, ")?;
        }
        let (any, keyword, src, dst): (_, fn(Protocol) -> &'static str, _, _) = match self.v6 {
            false => ("ip", Protocol::keyword, "nw_src", "nw_dst"),
            true => ("ipv6", Protocol::keyword6, "ipv6_src", "ipv6_dst"),
        };
        f.write_str(self.proto.map_or(any, keyword))?;
        if let Some((dir, v)) = self.reg {
            write!(f, ", {}", stage(dir).reg.matching(v))?;
        }
        if let Some(n) = &self.nw_src {
            fmt_net(f, src, n)?;
        }
        if let Some(n) = &self.nw_dst {
            fmt_net(f, dst, n)?;
        }
        match self.tp_dst {
            Some((v, 0xffff)) => write!(f, ", tp_dst={v}")?,
            Some((v, m)) => write!(f, ", tp_dst={v:#x}/{m:#x}")?,
            None => {}
        }
        if self.from_gateway {
            write!(f, ", {}", regs::FROM_GATEWAY.matching())?;
        }
        Ok(())
    }
}

/// What a flow does.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Act {
    /// A clause of one or more conjunctions: (id, k, n).
    Conj(BTreeSet<(u32, u8, u8)>),
    /// Rule `id` allowed the packet: load it, go to the metric table.
    Allow { id: u32, reg: RegField, metric: u8 },
    /// Metric flow of rule `id`.
    Count { id: u32, next: u8 },
    /// Isolation drop of the pod on `ofport`.
    Drop { ofport: u32 },
    /// Traffic with the node: skip the rules and drops.
    Exempt { metric: u8 },
}

impl Act {
    fn cookie(&self) -> u64 {
        match self {
            Act::Conj(c) => c
                .first()
                .map_or(cookie::rule(0), |&(id, _, _)| cookie::rule(id)),
            Act::Allow { id, .. } | Act::Count { id, .. } => cookie::rule(*id),
            Act::Drop { ofport } => cookie::isolation(*ofport),
            Act::Exempt { .. } => cookie::NODE_EXEMPTION,
        }
    }

    fn text(&self) -> String {
        match self {
            Act::Conj(c) => c
                .iter()
                .map(|(id, k, n)| format!("conjunction({id},{k}/{n})"))
                .collect::<Vec<_>>()
                .join(","),
            Act::Allow { id, reg, metric } => {
                format!("{},goto_table:{metric}", reg.load(*id))
            }
            Act::Count { next, .. } | Act::Exempt { metric: next } => format!("goto_table:{next}"),
            Act::Drop { .. } => "drop".into(),
        }
    }

    /// Combines two flows that share (table, priority, match).
    fn merge(&mut self, other: Act) {
        match (self, other) {
            (Act::Conj(a), Act::Conj(b)) => a.extend(b),
            (Act::Allow { id, .. }, Act::Allow { id: id2, .. }) => *id = (*id).min(id2),
            (Act::Drop { ofport }, Act::Drop { ofport: p2 }) => *ofport = (*ofport).min(p2),
            // Count flows are unique per id; kinds never share a priority
            // and match (by construction of the priorities and matches).
            _ => {}
        }
    }
}

/// The flows being built: (table, priority, match) -> (table, actions).
#[derive(Default)]
struct FlowSet {
    flows: BTreeMap<(u8, u16, FlowMatch), (TableDef, Act)>,
}

impl FlowSet {
    fn add(&mut self, table: TableDef, priority: u16, m: FlowMatch, act: Act) {
        match self.flows.entry((table.id, priority, m)) {
            std::collections::btree_map::Entry::Occupied(mut e) => e.get_mut().1.merge(act),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert((table, act));
            }
        }
    }

    fn lines(self) -> Vec<String> {
        self.flows
            .into_iter()
            .map(|((_, priority, m), (table, act))| {
                FlowLine::new(table, priority, act.cookie())
                    .matching(m.to_string())
                    .action(act.text())
                    .text()
            })
            .collect()
    }
}

/// A service (proto, ports, and for named ports the destination).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Service {
    proto: Protocol,
    tp_dst: Option<(u16, u16)>,
    dst: Option<IpAddr>,
}

impl Service {
    /// Its match; a service without a destination is of `family`'s...
    /// both families' on a dual-stack node ([`Service::matches`]).
    fn to_match(&self, v6: bool) -> FlowMatch {
        FlowMatch {
            proto: Some(self.proto),
            nw_dst: self.dst.map(IpNet::from),
            tp_dst: self.tp_dst,
            v6: self.dst.map_or(v6, |d| d.is_ipv6()),
            ..FlowMatch::default()
        }
    }

    /// Its clause flows: one, or without a destination on a dual-stack
    /// node, one per family.
    fn matches(&self, dual: bool) -> Vec<FlowMatch> {
        match (self.dst, dual) {
            (None, true) => vec![self.to_match(false), self.to_match(true)],
            _ => vec![self.to_match(false)],
        }
    }
}

/// A policy's selected local pods: (flow address, Pod object), one entry
/// per address of each.
type Selected<'a> = Vec<(IpAddr, &'a Pod)>;

/// Every pod a pod peer of `rule` matches (any node), in key order:
/// first the namespaces each peer selects, then their pods. (Written apart
/// from [`eval`], which is the oracle of the tests.)
fn peer_pods<'a>(state: &'a ClusterState, policy: &NetworkPolicy, rule: &Rule) -> Vec<&'a Pod> {
    let all_ns: BTreeSet<&str> = state
        .namespaces
        .keys()
        .map(String::as_str)
        .chain(state.pods.values().map(|p| p.namespace.as_str()))
        .collect();
    let mut keys: BTreeSet<&ObjKey> = BTreeSet::new();
    for peer in &rule.peers {
        let Peer::Pods {
            namespace_selector,
            pod_selector,
        } = peer
        else {
            continue;
        };
        let namespaces: BTreeSet<&str> = match namespace_selector {
            None => BTreeSet::from([policy.namespace.as_str()]),
            Some(sel) => all_ns
                .iter()
                .copied()
                .filter(|n| sel.matches(&state.namespace_labels(n)))
                .collect(),
        };
        for (key, pod) in &state.pods {
            if namespaces.contains(key.0.as_str())
                && (pod.ip.is_some() || pod.ip6.is_some())
                && !pod.host_network
                && pod_selector.as_ref().is_none_or(|s| s.matches(&pod.labels))
            {
                keys.insert(key);
            }
        }
    }
    keys.into_iter().filter_map(|k| state.pods.get(k)).collect()
}

/// The peer dimension, sorted and without duplicates: `None` = every
/// address.
fn peer_prefixes(rule: &Rule, pods: &[&Pod]) -> Option<Vec<IpNet>> {
    if rule.peers.is_empty() {
        return None;
    }
    let mut set: Vec<IpNet> = pods
        .iter()
        .flat_map(|p| pod_addresses(p))
        .map(IpNet::from)
        .collect();
    for peer in &rule.peers {
        match peer {
            Peer::IpBlock { cidr, except } => set.extend(
                prefix::ipblock_prefixes(*cidr, except)
                    .into_iter()
                    .map(IpNet::V4),
            ),
            Peer::IpBlock6 { cidr, except } => set.extend(
                prefix::ipblock_prefixes6(*cidr, except)
                    .into_iter()
                    .map(IpNet::V6),
            ),
            Peer::Pods { .. } => {}
        }
    }
    set.sort_unstable();
    set.dedup();
    Some(set)
}

/// The service dimension: `None` = every packet. `targets` are the
/// destinations named ports are resolved on (address, pod); `exact` says
/// the rule's destination dimension is exactly `targets`, so a named port
/// every target resolves alike needs no address.
/// A pod's addresses, IPv4 first.
fn pod_addresses(p: &Pod) -> impl Iterator<Item = IpAddr> {
    p.ip.map(IpAddr::V4)
        .into_iter()
        .chain(p.ip6.map(IpAddr::V6))
}

fn services(rule: &Rule, targets: &[(IpAddr, &Pod)], exact: bool) -> Option<BTreeSet<Service>> {
    if rule.ports.is_empty() {
        return None;
    }
    let mut set = BTreeSet::new();
    for pp in &rule.ports {
        let proto = pp.protocol;
        match &pp.port {
            None => {
                set.insert(Service {
                    proto,
                    tp_dst: None,
                    dst: None,
                });
            }
            Some(PortRef::Number(p)) => {
                for (v, m) in prefix::port_masks(*p, pp.end_port.unwrap_or(*p)) {
                    set.insert(Service {
                        proto,
                        tp_dst: (m != 0).then_some((v, m)),
                        dst: None,
                    });
                }
            }
            Some(PortRef::Name(name)) => {
                let resolved: Vec<(IpAddr, Option<u16>)> = targets
                    .iter()
                    .map(|(ip, pod)| (*ip, pod.named_port(name, proto)))
                    .collect();
                let first = resolved.first().and_then(|r| r.1);
                if exact && first.is_some() && resolved.iter().all(|r| r.1 == first) {
                    set.insert(Service {
                        proto,
                        tp_dst: first.map(|n| (n, 0xffff)),
                        dst: None,
                    });
                } else {
                    for (ip, n) in resolved {
                        if let Some(n) = n {
                            set.insert(Service {
                                proto,
                                tp_dst: Some((n, 0xffff)),
                                dst: Some(ip),
                            });
                        }
                    }
                }
            }
        }
    }
    Some(set)
}

/// The clause dimensions of one rule, before they become flows.
struct RulePlan {
    dir: Direction,
    id: u32,
    /// Empty when the rule is over its budget (never emitted then).
    dims: Vec<Vec<FlowMatch>>,
    /// A dual-stack node: the rule's own flows (`conj_id`, metric) exist
    /// for both families.
    dual: bool,
    /// How many flows the rule adds at most (clauses, the `conj_id` flow,
    /// the metric flow; clauses shared with other rules count each time).
    n_flows: usize,
}

/// What the rules of one policy are planned against on this node.
#[derive(Clone, Copy)]
struct PolicyOnNode<'a> {
    state: &'a ClusterState,
    policy: &'a NetworkPolicy,
    /// The local pods it selects.
    selected: &'a Selected<'a>,
    /// A dual-stack node ([`RulePlan::dual`]).
    dual: bool,
}

/// The dimensions of one rule; `None` if it has no flows. A rule that
/// would add more than `budget` flows is counted but not built.
fn plan_rule(
    on: &PolicyOnNode<'_>,
    rule: &Rule,
    dir: Direction,
    id: u32,
    budget: usize,
) -> Option<RulePlan> {
    let PolicyOnNode {
        state,
        policy,
        selected,
        dual,
    } = *on;
    if selected.is_empty() {
        return None;
    }
    let pods = peer_pods(state, policy, rule);
    let peers = peer_prefixes(rule, &pods);
    let applied: BTreeSet<IpNet> = selected.iter().map(|(ip, _)| IpNet::from(*ip)).collect();
    let svc = match dir {
        Direction::Ingress => services(rule, selected, true),
        Direction::Egress => {
            let targets: Vec<(IpAddr, &Pod)> = if rule.peers.is_empty() {
                state
                    .pods
                    .values()
                    .filter(|p| !p.host_network)
                    .flat_map(|p| pod_addresses(p).map(move |ip| (ip, p)))
                    .collect()
            } else {
                pods.iter()
                    .flat_map(|p| pod_addresses(p).map(move |ip| (ip, *p)))
                    .collect()
            };
            let exact =
                !rule.peers.is_empty() && rule.peers.iter().all(|p| matches!(p, Peer::Pods { .. }));
            services(rule, &targets, exact)
        }
    };
    if applied.is_empty()
        || peers.as_ref().is_some_and(Vec::is_empty)
        || svc.as_ref().is_some_and(BTreeSet::is_empty)
    {
        return None;
    }
    let families = 1 + usize::from(dual);
    let svc_flows = svc
        .as_ref()
        .map(|s| s.iter().map(|x| x.matches(dual).len()).sum::<usize>());
    let sizes = [peers.as_ref().map(Vec::len), Some(applied.len()), svc_flows];
    let n_dims = sizes.iter().flatten().count();
    let n_flows = sizes.iter().flatten().sum::<usize>() + families * (usize::from(n_dims > 1) + 1);
    if n_flows > budget {
        return Some(RulePlan {
            dir,
            id,
            dims: Vec::new(),
            dual,
            n_flows,
        });
    }
    let (src, dst) = (FlowMatch::src, FlowMatch::dst);
    let peer_clauses = peers.map(|set| {
        set.iter()
            .map(|n| match dir {
                Direction::Ingress => src(*n),
                Direction::Egress => dst(*n),
            })
            .collect::<Vec<_>>()
    });
    let applied_clauses: Vec<FlowMatch> = applied
        .iter()
        .map(|n| match dir {
            Direction::Ingress => dst(*n),
            Direction::Egress => src(*n),
        })
        .collect();
    let svc_clauses = svc.map(|s| s.iter().flat_map(|x| x.matches(dual)).collect::<Vec<_>>());
    let dims: Vec<Vec<FlowMatch>> = match dir {
        Direction::Ingress => [peer_clauses, Some(applied_clauses), svc_clauses],
        Direction::Egress => [Some(applied_clauses), peer_clauses, svc_clauses],
    }
    .into_iter()
    .flatten()
    .collect();
    Some(RulePlan {
        dir,
        id,
        dims,
        dual,
        n_flows,
    })
}

/// Adds the flows of a planned rule.
fn emit_rule(out: &mut FlowSet, plan: RulePlan) {
    let RulePlan {
        dir,
        id,
        dims,
        dual,
        ..
    } = plan;
    let st = stage(dir);
    let allow = Act::Allow {
        id,
        reg: st.reg,
        metric: st.metric.id,
    };
    // At most three dimensions.
    let n = dims.len() as u8;
    if n == 1 {
        for m in dims.into_iter().flatten() {
            out.add(st.rule, priority::policy_rule::PLAIN, m, allow.clone());
        }
    } else {
        for (k, dim) in (1u8..).zip(dims) {
            for m in dim {
                out.add(
                    st.rule,
                    priority::policy_rule::CONJUNCTION,
                    m,
                    Act::Conj(BTreeSet::from([(id, k, n)])),
                );
            }
        }
        let m = FlowMatch {
            conj_id: Some(id),
            ..FlowMatch::default()
        };
        if dual {
            out.add(
                st.rule,
                priority::policy_rule::CONJUNCTION,
                m.as_v6(),
                allow.clone(),
            );
        }
        out.add(st.rule, priority::policy_rule::CONJUNCTION, m, allow);
    }
    let m = FlowMatch {
        reg: Some((dir, id)),
        ..FlowMatch::default()
    };
    let count = Act::Count {
        id,
        next: st.next.id,
    };
    if dual {
        out.add(
            st.metric,
            priority::policy_metric::RULE,
            m.as_v6(),
            count.clone(),
        );
    }
    out.add(st.metric, priority::policy_metric::RULE, m, count);
}

/// The flows that enforce every NetworkPolicy of `state` on the `local` pods.
/// The node's own addresses (exempt from policy) are those of the node the
/// local pods' Pod objects name ([`eval::node_addresses`]).
pub fn policy_flows(state: &ClusterState, local: &[LocalPod]) -> PolicyFlows {
    policy_flows_on_node(state, local, &local_node_addresses(state, local))
}

/// The node's own addresses (exempt from policy) for `local`: those of the
/// node the local pods' Pod objects name ([`eval::node_addresses`]).
/// On a dual-stack node, the IPv6 gateway address too.
pub fn local_node_addresses(state: &ClusterState, local: &[LocalPod]) -> Vec<IpAddr> {
    let nodes: BTreeSet<&str> = local
        .iter()
        .filter_map(|lp| state.pods.get(&(lp.namespace.clone(), lp.name.clone())))
        .map(|p| p.node_name.as_str())
        .collect();
    let gateways6 = nodes
        .iter()
        .filter_map(|n| state.nodes.get(*n)?.pod_cidr6)
        .map(|c| IpAddr::V6(crate::flows::ipv6::gateway_of(c)));
    let mut node_addrs: Vec<IpAddr> = nodes
        .iter()
        .flat_map(|n| eval::node_addresses(state, n))
        .map(IpAddr::V4)
        .chain(gateways6)
        .collect();
    node_addrs.sort();
    node_addrs.dedup();
    node_addrs
}

/// [`policy_flows`] with the node's own addresses given: traffic between
/// them and the local pods is never subject to policy.
pub fn policy_flows_on_node(
    state: &ClusterState,
    local: &[LocalPod],
    node_addrs: &[IpAddr],
) -> PolicyFlows {
    policy_flows_limited(state, local, node_addrs, DEFAULT_MAX_POLICY_FLOWS)
}

/// [`policy_flows_on_node`] with the cap on the flows one policy may add
/// on this node: a policy that would add more than `max_flows` is refused
/// ([`PolicyFlows::refused`]); its rules get no flows, the pods it selects
/// stay isolated.
pub fn policy_flows_limited(
    state: &ClusterState,
    local: &[LocalPod],
    node_addrs: &[IpAddr],
    max_flows: usize,
) -> PolicyFlows {
    let ids = ids::assign(state);
    // A dual-stack node: rules' own flows and port-only clauses exist for
    // both families.
    let dual = local.iter().any(|lp| lp.ip6.is_some());
    let mut refused = Vec::new();
    let mut out = FlowSet::default();
    let mut used: BTreeMap<u32, RuleRef> = BTreeMap::new();
    // Isolated local pods per direction: ip -> ofport.
    let mut isolated: BTreeMap<(Direction, IpAddr), u32> = BTreeMap::new();
    for (key, policy) in &state.policies {
        let selected: Vec<(IpAddr, &Pod, u32)> = local
            .iter()
            .filter_map(|lp| {
                let pod = state.pods.get(&(lp.namespace.clone(), lp.name.clone()))?;
                let selected = pod.namespace == policy.namespace
                    && !pod.host_network
                    && policy.pod_selector.matches(&pod.labels);
                selected.then_some((lp, pod))
            })
            .flat_map(|(lp, pod)| lp.addresses().map(move |ip| (ip, pod, lp.ofport)))
            .collect();
        if selected.is_empty() {
            continue;
        }
        let sel: Selected<'_> = selected.iter().map(|(ip, pod, _)| (*ip, *pod)).collect();
        let mut plans: Vec<(RulePlan, &RuleRef)> = Vec::new();
        let mut n = 0usize;
        for (dir, isolates, rules) in [
            (
                Direction::Ingress,
                policy.ingress_isolation,
                &policy.ingress,
            ),
            (Direction::Egress, policy.egress_isolation, &policy.egress),
        ] {
            if !isolates {
                // Rules of a direction the policy does not isolate have no
                // effect (the API ignores them).
                continue;
            }
            for (ip, _, ofport) in &selected {
                let e = isolated.entry((dir, *ip)).or_insert(*ofport);
                *e = (*e).min(*ofport);
            }
            for (index, rule) in rules.iter().enumerate() {
                let Some(r) = ids.get(&(key.clone(), dir, index)) else {
                    continue;
                };
                let budget = max_flows.saturating_sub(n);
                let on = PolicyOnNode {
                    state,
                    policy,
                    selected: &sel,
                    dual,
                };
                if let Some(plan) = plan_rule(&on, rule, dir, r.id, budget) {
                    n = n.saturating_add(plan.n_flows);
                    plans.push((plan, r));
                }
            }
        }
        // The cap is checked before any flow of the policy is added: a
        // refused policy adds no rule flows, but its pods stay isolated
        // (fail closed: what it would allow is dropped, never opened).
        if n > max_flows {
            refused.push(Refusal {
                policy: key.clone(),
                flows: n,
                limit: max_flows,
            });
            continue;
        }
        for (plan, r) in plans {
            used.insert(r.id, r.clone());
            emit_rule(&mut out, plan);
        }
    }
    let directions: BTreeSet<Direction> = isolated.keys().map(|(d, _)| *d).collect();
    for dir in directions {
        let st = stage(dir);
        for addr in node_addrs {
            let net = IpNet::from(*addr);
            let m = match dir {
                // From the node: only what entered from the gateway (the
                // node's own stack). A packet from the tunnel or a pod port
                // that merely carries a node address as source is not the
                // node, and policy applies to it.
                Direction::Ingress => FlowMatch {
                    from_gateway: true,
                    ..FlowMatch::src(net)
                },
                Direction::Egress => FlowMatch::dst(net),
            };
            out.add(
                st.rule,
                priority::policy_rule::NODE_EXEMPTION,
                m,
                Act::Exempt {
                    metric: st.metric.id,
                },
            );
        }
    }
    for ((dir, ip), ofport) in isolated {
        let st = stage(dir);
        let net = IpNet::from(ip);
        let m = match dir {
            Direction::Ingress => FlowMatch::dst(net),
            Direction::Egress => FlowMatch::src(net),
        };
        out.add(
            st.default,
            priority::policy_default_rule::ISOLATION,
            m,
            Act::Drop { ofport },
        );
    }
    PolicyFlows {
        flows: out.lines(),
        rules: used.into_values().collect(),
        refused,
    }
}
