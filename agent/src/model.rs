//! The cluster as the agent sees it: the Kubernetes objects that decide a
//! node's flows, reduced to what matters for networking.
//!
//! Sources ([`crate::source`]: the Kubernetes API, or a manifest directory)
//! convert the API objects into these types, after the defaulting the API
//! server applies and validation (an invalid object is rejected by the
//! source with a message naming it; it never reaches the model). The
//! translator ([`crate::policy`], [`crate::flows`]) is a pure function of a
//! [`ClusterState`] snapshot and the node's local facts.
//!
//! Snapshots are immutable values shared as `Arc<ClusterState>`; a source
//! publishes a new one for every change (through a `tokio::sync::watch`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// `(namespace, name)` of a namespaced object.
pub type ObjKey = (String, String);

/// A Namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
}

/// An L4 protocol NetworkPolicy can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The flow-syntax protocol keyword (`tcp`, `udp`, `sctp`).
    pub fn keyword(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The flow keyword of the protocol over IPv6 (`tcp6`, ...).
    pub fn keyword6(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp6",
            Protocol::Udp => "udp6",
            Protocol::Sctp => "sctp6",
        }
    }

    /// Parses the API's spelling (`TCP`, `UDP`, `SCTP`).
    pub fn from_api(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// A container port of a pod (for named ports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub port: u16,
    pub protocol: Protocol,
}

/// A Pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: Labels,
    /// `spec.nodeName` (empty: not scheduled).
    pub node_name: String,
    /// `status.podIP`, once known (the first IPv4 of `status.podIPs`).
    pub ip: Option<Ipv4Addr>,
    /// Its IPv6 address (the first IPv6 of `status.podIPs`): dual-stack.
    pub ip6: Option<Ipv6Addr>,
    pub host_network: bool,
    /// Every container's ports.
    pub ports: Vec<ContainerPort>,
}

impl Pod {
    pub fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }

    /// The number of the container port named `name` for `protocol`.
    pub fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.protocol == protocol && p.name.as_deref() == Some(name))
            .map(|p| p.port)
    }
}

/// A Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// The first IPv4 CIDR of `spec.podCIDR`/`spec.podCIDRs`, if any.
    pub pod_cidr: Option<Ipv4Net>,
    /// The first IPv6 CIDR of `spec.podCIDRs`, if any (dual-stack and
    /// IPv6 nodes).
    pub pod_cidr6: Option<Ipv6Net>,
    /// The first IPv4 `InternalIP` address, if set (the VXLAN underlay
    /// address on an IPv4 underlay).
    pub internal_ip: Option<Ipv4Addr>,
    /// The first IPv6 `InternalIP` address, if set (the underlay address
    /// when the tunnel runs over IPv6).
    pub internal_ip6: Option<Ipv6Addr>,
}

impl Node {
    /// The Node's underlay address of the tunnel's family: its IPv6
    /// InternalIP when the tunnel runs over IPv6, else its IPv4 one.
    pub fn tunnel_ip(&self, ipv6: bool) -> Option<IpAddr> {
        if ipv6 {
            self.internal_ip6.map(IpAddr::V6)
        } else {
            self.internal_ip.map(IpAddr::V4)
        }
    }
}

/// A label selector requirement operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectorOp {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: SelectorOp,
    pub values: Vec<String>,
}

/// A label selector (`matchLabels` AND every `matchExpressions` entry). The
/// empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub match_labels: Labels,
    pub match_expressions: Vec<Requirement>,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector (Kubernetes semantics).
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let have = labels.get(&r.key);
                match r.op {
                    SelectorOp::In => have.is_some_and(|v| r.values.contains(v)),
                    SelectorOp::NotIn => have.is_none_or(|v| !r.values.contains(v)),
                    SelectorOp::Exists => have.is_some(),
                    SelectorOp::DoesNotExist => have.is_none(),
                }
            })
    }

    /// Whether the selector is empty (selects everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

/// A port of a NetworkPolicy rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// One `ports[]` entry: protocol (defaulted to TCP), port (none: every
/// port), `endPort` (only with a numbered port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyPort {
    pub protocol: Protocol,
    pub port: Option<PortRef>,
    pub end_port: Option<u16>,
}

/// One `from[]`/`to[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// `podSelector` and/or `namespaceSelector` (both given = AND).
    /// `namespace_selector: None` means the policy's own namespace;
    /// `pod_selector: None` means every pod of the selected namespaces.
    Pods {
        namespace_selector: Option<LabelSelector>,
        pod_selector: Option<LabelSelector>,
    },
    /// `ipBlock`: `cidr` minus every `except`.
    IpBlock { cidr: Ipv4Net, except: Vec<Ipv4Net> },
    /// An IPv6 `ipBlock`.
    IpBlock6 { cidr: Ipv6Net, except: Vec<Ipv6Net> },
}

/// One ingress or egress rule. Empty `peers`: every peer; empty `ports`:
/// every port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub peers: Vec<Peer>,
    pub ports: Vec<PolicyPort>,
}

/// A NetworkPolicy (networking.k8s.io/v1), after API defaulting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub pod_selector: LabelSelector,
    /// `policyTypes` contains Ingress.
    pub ingress_isolation: bool,
    /// `policyTypes` contains Egress.
    pub egress_isolation: bool,
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

impl NetworkPolicy {
    pub fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// One `spec.ports[]` entry of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// `name` (empty when the Service has one unnamed port).
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// `nodePort`, if allocated (NodePort and LoadBalancer Services only).
    pub node_port: Option<u16>,
}

/// A Service (v1), after API defaulting, as the proxy needs it. A headless
/// Service (`clusterIP: None`) or an `ExternalName` one has no
/// `cluster_ip` and is not proxied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    /// Its IPv4 ClusterIP (`spec.clusterIPs`, `spec.clusterIP`).
    pub cluster_ip: Option<Ipv4Addr>,
    /// Its IPv6 ClusterIP (a dual-stack or IPv6 Service).
    pub cluster_ip6: Option<Ipv6Addr>,
    pub ports: Vec<ServicePort>,
    /// `sessionAffinity: ClientIP`: its `timeoutSeconds` (default 10800).
    pub affinity_timeout: Option<u32>,
    /// Addresses traffic arriving at a node is load-balanced for, besides
    /// the NodePorts: `spec.externalIPs` and the Service's load balancer
    /// addresses (`status.loadBalancer.ingress[].ip`), of both families,
    /// sorted, no duplicates.
    pub external_ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: traffic arriving at a node (its
    /// NodePorts, external and load balancer addresses) goes only to that
    /// node's endpoints, with its client address kept.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`: ClusterIP traffic goes only to
    /// endpoints on the client's node.
    pub internal_local: bool,
}

impl Service {
    pub fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// One port of an endpoint (`ports[]` of an Endpoints subset or an
/// EndpointSlice): the Service port it serves, by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointPort {
    /// The Service port's name (empty for an unnamed one).
    pub name: String,
    pub protocol: Protocol,
    /// The port on the endpoint (a named `targetPort` already resolved).
    pub port: u16,
}

/// One backend address of a Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// Its address (an IPv4 or an IPv6 one: the Service's ClusterIP of the
    /// same family reaches it).
    pub ip: IpAddr,
    /// Whether it may receive traffic (`addresses` of an Endpoints
    /// subset, `conditions.ready` of a slice; unset counts as ready).
    pub ready: bool,
    /// The node it runs on, if known.
    pub node_name: Option<String>,
    pub ports: Vec<EndpointPort>,
}

/// Where a Service's endpoints came from: the Service's Endpoints object,
/// or one EndpointSlice of it (`kubernetes.io/service-name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSet {
    /// The Service's namespace and name.
    pub service: ObjKey,
    pub endpoints: Vec<Endpoint>,
}

/// Everything the agent knows about the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub namespaces: BTreeMap<String, Namespace>,
    pub pods: BTreeMap<ObjKey, Pod>,
    pub nodes: BTreeMap<String, Node>,
    pub policies: BTreeMap<ObjKey, NetworkPolicy>,
    pub services: BTreeMap<ObjKey, Service>,
    /// Endpoints objects, by (namespace, name) (= their Service's).
    pub endpoints: BTreeMap<ObjKey, EndpointSet>,
    /// EndpointSlices, by (namespace, slice name).
    pub endpoint_slices: BTreeMap<ObjKey, EndpointSet>,
}

impl ClusterState {
    /// A Service's endpoints: from its EndpointSlices when it has any (the
    /// API's current source), else from its Endpoints object; sorted and
    /// without duplicates (an address in two slices counts once).
    pub fn service_endpoints(&self, svc: &ObjKey) -> Vec<Endpoint> {
        let mut v: Vec<Endpoint> = self
            .endpoint_slices
            .values()
            .filter(|s| &s.service == svc)
            .flat_map(|s| s.endpoints.iter().cloned())
            .collect();
        if v.is_empty() && !self.endpoint_slices.values().any(|s| &s.service == svc) {
            if let Some(e) = self.endpoints.get(svc) {
                v = e.endpoints.clone();
            }
        }
        v.sort();
        v.dedup_by(|a, b| a.ip == b.ip && a.ports == b.ports);
        v
    }

    /// Labels of namespace `name` (empty if unknown).
    pub fn namespace_labels(&self, name: &str) -> Labels {
        self.namespaces
            .get(name)
            .map(|n| n.labels.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_semantics() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        assert!(LabelSelector::default().matches(&l));
        assert!(LabelSelector::default().matches(&Labels::new()));
        let mut s = LabelSelector {
            match_labels: labels(&[("app", "web")]),
            match_expressions: vec![],
        };
        assert!(s.matches(&l));
        s.match_expressions.push(Requirement {
            key: "tier".into(),
            op: SelectorOp::In,
            values: vec!["back".into(), "front".into()],
        });
        assert!(s.matches(&l));
        s.match_expressions.push(Requirement {
            key: "env".into(),
            op: SelectorOp::NotIn,
            values: vec!["prod".into()],
        });
        assert!(s.matches(&l), "NotIn matches an absent key");
        s.match_expressions.push(Requirement {
            key: "env".into(),
            op: SelectorOp::Exists,
            values: vec![],
        });
        assert!(!s.matches(&l));
        let d = LabelSelector {
            match_labels: Labels::new(),
            match_expressions: vec![Requirement {
                key: "app".into(),
                op: SelectorOp::DoesNotExist,
                values: vec![],
            }],
        };
        assert!(!d.matches(&l));
        assert!(d.matches(&Labels::new()));
    }
}
