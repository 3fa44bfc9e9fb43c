//! Cookies: which feature, and which object of it, a flow exists for.
//!
//! Every flow the agent installs carries a cookie laid out as
//!
//! ```text
//!  63        48 47                                   0
//! +------------+--------------------------------------+
//! |  feature   |              object                  |
//! +------------+--------------------------------------+
//! ```
//!
//! The feature ([`Feature`]) says which part of the agent made the flow,
//! the object which Kubernetes or node object it is for (a pod's OpenFlow
//! port, a NetworkPolicy rule id, a remote node's address). `oxvsctl
//! dump-flows` shows them, `oxvsctl traceflow` names the object behind each
//! step from them ([`crate::api::annotate`]), the metrics count flows and
//! packets by them ([`crate::metrics`]), and one `del-flows
//! cookie=0x2000000000005/-1` removes one pod's flows.
//!
//! This module is the only place a feature id or an object number is
//! written: flow builders, readers and tests ask it for cookies.

use std::net::{IpAddr, Ipv4Addr};

/// The feature bits start here.
pub const FEATURE_SHIFT: u32 = 48;
/// The object bits.
pub const OBJECT_MASK: u64 = (1 << FEATURE_SHIFT) - 1;
/// The feature bits.
pub const FEATURE_MASK: u64 = !OBJECT_MASK;

/// The part of the agent a flow belongs to (the high 16 bits of its cookie).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Feature {
    /// `0x0001`: the pipeline's defaults (object 0).
    Pipeline = 0x0001,
    /// `0x0002`: a local pod's flows (object: its OpenFlow port).
    Pod = 0x0002,
    /// `0x0003`: the gateway (object 1), the tunnel (2) and the tunnel
    /// guard's drops (3: unknown outer source, 4: pod to a VXLAN port).
    Node = 0x0003,
    /// `0x0004`: a NetworkPolicy rule (object: the rule id).
    PolicyRule = 0x0004,
    /// `0x0005`: a pod's policy isolation (object: its OpenFlow port;
    /// 0: the node exemption).
    Isolation = 0x0005,
    /// `0x0006`: a remote node's flows (object: its underlay IPv4 address).
    RemoteNode = 0x0006,
    /// `0x0007`: a Service port's flows and group (object: the group id,
    /// [`crate::proxy`]).
    Service = 0x0007,
}

impl Feature {
    /// Every feature, in id order.
    pub const ALL: [Feature; 7] = [
        Feature::Pipeline,
        Feature::Pod,
        Feature::Node,
        Feature::PolicyRule,
        Feature::Isolation,
        Feature::RemoteNode,
        Feature::Service,
    ];

    /// The feature id (the cookie's high 16 bits).
    pub const fn id(self) -> u16 {
        self as u16
    }

    /// The cookie of `object` of this feature (the object's low 48 bits).
    pub const fn cookie(self, object: u64) -> u64 {
        ((self.id() as u64) << FEATURE_SHIFT) | (object & OBJECT_MASK)
    }

    /// The feature of a cookie, if it is one of the agent's.
    pub fn of(cookie: u64) -> Option<Feature> {
        let id = cookie >> FEATURE_SHIFT;
        Feature::ALL.into_iter().find(|f| u64::from(f.id()) == id)
    }

    /// The `feature` label of the agent's flow metrics.
    pub const fn metric_name(self) -> &'static str {
        match self {
            Feature::Pipeline => "pipeline",
            Feature::Pod => "pod",
            Feature::Node => "node",
            Feature::PolicyRule => "policy_rule",
            Feature::Isolation => "policy_isolation",
            Feature::RemoteNode => "remote_node",
            Feature::Service => "service",
        }
    }

    /// The object of `cookie` if it is of this feature.
    pub fn object(self, cookie: u64) -> Option<u64> {
        (cookie >> FEATURE_SHIFT == u64::from(self.id())).then_some(cookie & OBJECT_MASK)
    }
}

/// The object bits of a cookie.
pub const fn object(cookie: u64) -> u64 {
    cookie & OBJECT_MASK
}

/// The pipeline defaults.
pub const DEFAULTS: u64 = Feature::Pipeline.cookie(0);

/// The flows of the Service port whose group is `group_id` ([`crate::proxy`]).
pub const fn service(group_id: u32) -> u64 {
    Feature::Service.cookie(group_id as u64)
}
/// The gateway's flows.
pub const GATEWAY: u64 = Feature::Node.cookie(NODE_GATEWAY);
/// The tunnel port's flows.
pub const TUNNEL: u64 = Feature::Node.cookie(NODE_TUNNEL);
/// The drop of tunnel packets whose outer source is not a known node.
pub const TUNNEL_UNKNOWN_SOURCE: u64 = Feature::Node.cookie(NODE_TUNNEL_UNKNOWN_SOURCE);
/// The drops of pod traffic to a node's tunnel (VXLAN) port.
pub const POD_TO_TUNNEL: u64 = Feature::Node.cookie(NODE_POD_TO_TUNNEL);
/// The node exemptions of policy (isolation of port 0, which is no pod).
pub const NODE_EXEMPTION: u64 = Feature::Isolation.cookie(0);

/// [`Feature::Node`] object: the gateway.
pub const NODE_GATEWAY: u64 = 1;
/// [`Feature::Node`] object: the tunnel.
pub const NODE_TUNNEL: u64 = 2;
/// [`Feature::Node`] object: the tunnel guard's drop of unknown sources.
pub const NODE_TUNNEL_UNKNOWN_SOURCE: u64 = 3;
/// [`Feature::Node`] object: the tunnel guard's drop of pods' datagrams
/// to a VXLAN port.
pub const NODE_POD_TO_TUNNEL: u64 = 4;

/// The cookie of the flows of the pod on `ofport`.
pub const fn pod(ofport: u32) -> u64 {
    Feature::Pod.cookie(ofport as u64)
}

/// The pod port a cookie names, if it is a pod cookie.
pub fn pod_port(cookie: u64) -> Option<u32> {
    Feature::Pod
        .object(cookie)
        .and_then(|o| u32::try_from(o).ok())
}

/// The cookie of the flows of NetworkPolicy rule `id`.
pub const fn rule(id: u32) -> u64 {
    Feature::PolicyRule.cookie(id as u64)
}

/// The rule id a cookie names, if it is a rule cookie.
pub fn rule_id(cookie: u64) -> Option<u32> {
    Feature::PolicyRule
        .object(cookie)
        .and_then(|o| u32::try_from(o).ok())
}

/// The cookie of the isolation drops of the pod on `ofport`.
pub const fn isolation(ofport: u32) -> u64 {
    Feature::Isolation.cookie(ofport as u64)
}

/// The pod port an isolation cookie names (0: the node exemption).
pub fn isolation_port(cookie: u64) -> Option<u32> {
    Feature::Isolation
        .object(cookie)
        .and_then(|o| u32::try_from(o).ok())
}

/// The cookie of a remote node's flows: its underlay address. An IPv4
/// address is the object's low 32 bits; an IPv6 one (a tunnel over IPv6)
/// does not fit and is folded into 47 bits, with the object's top bit
/// set ([`remote_node_ip`] then names no address: the owner is found by
/// comparing cookies).
pub fn remote_node(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(a) => Feature::RemoteNode.cookie(u64::from(u32::from(a))),
        IpAddr::V6(a) => {
            let v = u128::from(a);
            let fold = (v ^ (v >> 47) ^ (v >> 94)) as u64 & IPV6_FOLD_MASK;
            Feature::RemoteNode.cookie(IPV6_FOLD_BIT | fold)
        }
    }
}

/// The object bit of a remote node cookie made from an IPv6 address.
const IPV6_FOLD_BIT: u64 = 1 << 47;
const IPV6_FOLD_MASK: u64 = IPV6_FOLD_BIT - 1;

/// The IPv4 underlay address a remote node's cookie names (its low 32
/// bits); `None` for a cookie folded from an IPv6 address.
pub fn remote_node_ip(cookie: u64) -> Option<Ipv4Addr> {
    Feature::RemoteNode
        .object(cookie)
        .filter(|o| o & IPV6_FOLD_BIT == 0)
        .map(|o| Ipv4Addr::from(u32::try_from(o & 0xffff_ffff).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(DEFAULTS, 0x0001_0000_0000_0000);
        assert_eq!(GATEWAY, 0x0003_0000_0000_0001);
        assert_eq!(TUNNEL, 0x0003_0000_0000_0002);
        assert_eq!(TUNNEL_UNKNOWN_SOURCE, 0x0003_0000_0000_0003);
        assert_eq!(POD_TO_TUNNEL, 0x0003_0000_0000_0004);
        assert_eq!(NODE_EXEMPTION, 0x0005_0000_0000_0000);
        assert_eq!(pod(5), 0x0002_0000_0000_0005);
        assert_eq!(rule(0xa1fb_8dc6), 0x0004_0000_a1fb_8dc6);
        assert_eq!(isolation(4), 0x0005_0000_0000_0004);
        let ip: Ipv4Addr = "192.168.77.12".parse().unwrap();
        assert_eq!(remote_node(ip.into()), 0x0006_0000_c0a8_4d0c);
        assert_eq!(FEATURE_MASK, 0xffff << 48);
    }

    #[test]
    fn round_trips() {
        assert_eq!(pod_port(pod(7)), Some(7));
        assert_eq!(pod_port(GATEWAY), None);
        assert_eq!(rule_id(rule(42)), Some(42));
        assert_eq!(rule_id(isolation(42)), None);
        assert_eq!(isolation_port(isolation(9)), Some(9));
        assert_eq!(isolation_port(NODE_EXEMPTION), Some(0));
        let ip: Ipv4Addr = "10.0.0.1".parse().unwrap();
        assert_eq!(remote_node_ip(remote_node(ip.into())), Some(ip));
        // IPv6 underlay addresses are folded (top object bit set): no
        // IPv4 address read back, and nodes differing only in their
        // prefix or only in their interface id get different cookies.
        let v6 = |s: &str| remote_node(s.parse::<std::net::Ipv6Addr>().unwrap().into());
        let a = v6("fd00:1::1");
        assert_eq!(Feature::of(a), Some(Feature::RemoteNode));
        assert_eq!(remote_node_ip(a), None);
        assert_ne!(a, v6("fd00:2::1"));
        assert_ne!(a, v6("fd00:1::2"));
        assert_ne!(v6("::a00:1"), remote_node(ip.into()));
        for f in Feature::ALL {
            assert_eq!(Feature::of(f.cookie(123)), Some(f));
            assert_eq!(f.object(f.cookie(123)), Some(123));
        }
        assert_eq!(Feature::of(0), None);
        assert_eq!(Feature::of(0x0008 << 48), None);
        assert_eq!(service(0x1234), 0x0007_0000_0000_1234);
    }

    /// The cookie table of `docs/pipeline.md` has a row for every feature.
    #[test]
    fn docs_pipeline_lists_every_feature() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/pipeline.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let table = &doc[doc.find("## Cookies").unwrap()..];
        for f in Feature::ALL {
            let prefix = format!("| `0x{:04x}_", f.id());
            assert!(
                table.contains(&prefix),
                "docs/pipeline.md, \"Cookies\": no row for {f:?} ({prefix}...)"
            );
        }
    }
}
