//! Conversion of Kubernetes API objects (`k8s-openapi` types) into the
//! [`crate::model`] types, with the defaulting and validation the API server
//! applies. Pure functions, no I/O.
//!
//! Invariants:
//! - An object that the API server would reject is rejected here with a
//!   [`ConvertError`] naming the object (`Kind ns/name`) and every offending
//!   field path; nothing of it is returned (never half-applied).
//! - Defaulting as in the API server: NetworkPolicy `policyTypes` absent or
//!   empty -> `Ingress`, plus `Egress` iff `spec.egress` is non-empty; port
//!   `protocol` absent -> TCP (also for container ports); `podSelector`
//!   absent -> the empty selector (every pod of the namespace).
//! - Dual-stack: a Pod keeps its first address of each family
//!   (`status.podIPs`), a Node its first pod CIDR of each family and its
//!   first IPv4 `InternalIP` (the underlay is IPv4); an IPv6 `ipBlock` is
//!   [`Peer::IpBlock6`].
//! - A Pod in phase `Succeeded` or `Failed` has no IP in the model: its
//!   address has been released and may belong to another pod already.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::model::{
    ContainerPort, LabelSelector, Labels, Namespace, NetworkPolicy, Node, Peer, Pod, PolicyPort,
    PortRef, Protocol, Requirement, Rule, SelectorOp,
};

/// The namespace of a namespaced object that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// One invalid field of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `spec.ingress[0].from[1].ipBlock.cidr`.
    pub field: String,
    /// What is wrong, with the offending value.
    pub message: String,
}

/// An object rejected by validation: `Kind ns/name: field: message[; ...]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConvertError {
    /// `Pod`, `Namespace`, `Node` or `NetworkPolicy`.
    pub kind: &'static str,
    /// `ns/name` for namespaced objects, `name` otherwise.
    pub object: String,
    /// Every invalid field (at least one).
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.kind, self.object)?;
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

/// Collects field errors while converting one object.
#[derive(Default)]
struct Errs(Vec<FieldError>);

impl Errs {
    fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    fn finish<T>(self, kind: &'static str, object: String, value: T) -> Result<T, ConvertError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConvertError {
                kind,
                object,
                errors: self.0,
            })
        }
    }
}

/// `name` of a cluster-scoped object, or an error if it has none.
fn cluster_name(kind: &'static str, meta: &meta::ObjectMeta) -> Result<String, ConvertError> {
    match meta.name.as_deref() {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Err(ConvertError {
            kind,
            object: "<unnamed>".into(),
            errors: vec![FieldError {
                field: "metadata.name".into(),
                message: "required".into(),
            }],
        }),
    }
}

/// `(namespace, name)` of a namespaced object (namespace defaulted).
fn namespaced_name(
    kind: &'static str,
    meta: &meta::ObjectMeta,
) -> Result<(String, String), ConvertError> {
    let ns = meta
        .namespace
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE)
        .to_string();
    match meta.name.as_deref() {
        Some(n) if !n.is_empty() => Ok((ns, n.to_string())),
        _ => Err(ConvertError {
            kind,
            object: format!("{ns}/<unnamed>"),
            errors: vec![FieldError {
                field: "metadata.name".into(),
                message: "required".into(),
            }],
        }),
    }
}

/// A human name for an object's identity, used in logs by the sources.
pub fn object_name(meta: &meta::ObjectMeta, namespaced: bool) -> String {
    let name = meta.name.as_deref().unwrap_or("<unnamed>");
    if namespaced {
        let ns = meta
            .namespace
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_NAMESPACE);
        format!("{ns}/{name}")
    } else {
        name.to_string()
    }
}

fn labels_of(meta: &meta::ObjectMeta) -> Labels {
    meta.labels.clone().unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Namespace, Node, Pod
// ---------------------------------------------------------------------------

/// Converts a Namespace.
pub fn namespace(ns: &core::Namespace) -> Result<Namespace, ConvertError> {
    let name = cluster_name("Namespace", &ns.metadata)?;
    Ok(Namespace {
        name,
        labels: labels_of(&ns.metadata),
    })
}

/// Parses a CIDR of either family, host bits masked off.
fn parse_any_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("invalid CIDR {s:?}"))
}

/// Parses an IP address. `Ok(None)` for a valid IPv6 address.
fn parse_any_ip(s: &str) -> Result<IpAddr, String> {
    s.parse::<IpAddr>()
        .map_err(|_| format!("invalid IP address {s:?}"))
}

/// Converts a Node: the first pod CIDR of each family (`spec.podCIDR`,
/// then `spec.podCIDRs`) and the first `InternalIP` address of each family.
pub fn node(node: &core::Node) -> Result<Node, ConvertError> {
    let name = cluster_name("Node", &node.metadata)?;
    let mut errs = Errs::default();
    let mut pod_cidr = None;
    let mut pod_cidr6 = None;
    if let Some(spec) = &node.spec {
        let cidrs = spec
            .pod_cidr
            .iter()
            .map(|c| ("spec.podCIDR".to_string(), c))
            .chain(
                spec.pod_cidrs
                    .iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, c)| (format!("spec.podCIDRs[{i}]"), c)),
            );
        for (field, c) in cidrs {
            if c.is_empty() {
                continue;
            }
            match parse_any_cidr(c) {
                Ok(IpNet::V4(n)) => {
                    pod_cidr.get_or_insert(n);
                }
                Ok(IpNet::V6(n)) => {
                    pod_cidr6.get_or_insert(n);
                }
                Err(m) => errs.push(field, m),
            }
        }
    }
    let mut internal_ip = None;
    let mut internal_ip6 = None;
    if let Some(addrs) = node.status.as_ref().and_then(|s| s.addresses.as_ref()) {
        for (i, a) in addrs.iter().enumerate() {
            if a.type_ != "InternalIP" {
                continue;
            }
            match parse_any_ip(&a.address) {
                Ok(IpAddr::V4(ip)) => {
                    internal_ip.get_or_insert(ip);
                }
                Ok(IpAddr::V6(ip)) => {
                    internal_ip6.get_or_insert(ip);
                }
                Err(m) => errs.push(format!("status.addresses[{i}].address"), m),
            }
        }
    }
    errs.finish(
        "Node",
        name.clone(),
        Node {
            name,
            pod_cidr,
            pod_cidr6,
            internal_ip,
            internal_ip6,
        },
    )
}

fn protocol(field: String, p: Option<&str>, errs: &mut Errs) -> Protocol {
    match p {
        None => Protocol::Tcp,
        Some(s) => Protocol::from_api(s).unwrap_or_else(|| {
            errs.push(
                field,
                format!("unsupported protocol {s:?} (TCP, UDP or SCTP)"),
            );
            Protocol::Tcp
        }),
    }
}

/// Converts a Pod: labels, `spec.nodeName`, the first IPv4 pod IP
/// (`status.podIP`, then `status.podIPs`; none once the pod terminated),
/// `hostNetwork` and every container's ports (protocol defaulted to TCP).
pub fn pod(pod: &core::Pod) -> Result<Pod, ConvertError> {
    let (namespace, name) = namespaced_name("Pod", &pod.metadata)?;
    let mut errs = Errs::default();
    let spec = pod.spec.as_ref();
    let mut ports = Vec::new();
    for (ci, c) in spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        for (pi, p) in c.ports.iter().flatten().enumerate() {
            let f = format!("spec.containers[{ci}].ports[{pi}]");
            let protocol = protocol(format!("{f}.protocol"), p.protocol.as_deref(), &mut errs);
            let port = match u16::try_from(p.container_port) {
                Ok(n) if n != 0 => n,
                _ => {
                    errs.push(
                        format!("{f}.containerPort"),
                        format!("{} is not a valid port number (1-65535)", p.container_port),
                    );
                    0
                }
            };
            let name = p.name.clone().filter(|n| !n.is_empty());
            if let Some(n) = &name {
                if let Err(m) = check_port_name(n) {
                    errs.push(format!("{f}.name"), m);
                }
            }
            ports.push(ContainerPort {
                name,
                port,
                protocol,
            });
        }
    }
    let (mut ip, mut ip6) = (None, None);
    if let Some(status) = &pod.status {
        let ips = status
            .pod_ip
            .iter()
            .map(|s| ("status.podIP".to_string(), s))
            .chain(
                status
                    .pod_ips
                    .iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, p)| (format!("status.podIPs[{i}].ip"), &p.ip)),
            );
        for (field, s) in ips {
            if s.is_empty() {
                continue;
            }
            match s.parse::<IpAddr>() {
                Ok(IpAddr::V4(a)) => {
                    ip.get_or_insert(a);
                }
                Ok(IpAddr::V6(a)) => {
                    ip6.get_or_insert(a);
                }
                Err(_) => errs.push(field, format!("invalid IP address {s:?}")),
            }
        }
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            (ip, ip6) = (None, None);
        }
    }
    let object = format!("{namespace}/{name}");
    errs.finish(
        "Pod",
        object,
        Pod {
            namespace,
            name,
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            labels: labels_of(&pod.metadata),
            node_name: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            ip,
            ip6,
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            ports,
        },
    )
}

// ---------------------------------------------------------------------------
// Label and name syntax (apimachinery's validation)
// ---------------------------------------------------------------------------

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_label_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: lowercase labels joined by dots, at most 253.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A label key: `[prefix/]name` (a qualified name).
fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(is_dns1123_subdomain);
    if prefix_ok && is_label_name_part(name) {
        Ok(())
    } else {
        Err(format!(
            "invalid label key {k:?} (a qualified name: optional DNS subdomain prefix and '/', \
             then at most 63 alphanumeric, '-', '_' or '.' characters, alphanumeric at both ends)"
        ))
    }
}

/// A label value: empty or a label name part.
fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_label_name_part(v) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value {v:?} (at most 63 alphanumeric, '-', '_' or '.' characters, \
             alphanumeric at both ends)"
        ))
    }
}

/// An IANA service name (a named port): 1-15 of `[a-z0-9-]`, at least one
/// letter, no `-` at either end, no `--`.
fn check_port_name(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 15
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(|c| c.is_ascii_lowercase())
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid port name {s:?} (1-15 lowercase alphanumeric or '-' characters, \
             at least one letter, no '-' at either end or doubled)"
        ))
    }
}

/// Converts and validates a label selector.
fn selector(sel: &meta::LabelSelector, field: &str, errs: &mut Errs) -> LabelSelector {
    let mut out = LabelSelector::default();
    for (k, v) in sel.match_labels.iter().flatten() {
        if let Err(m) = check_label_key(k) {
            errs.push(format!("{field}.matchLabels"), m);
        }
        if let Err(m) = check_label_value(v) {
            errs.push(format!("{field}.matchLabels[{k}]"), m);
        }
        out.match_labels.insert(k.clone(), v.clone());
    }
    for (i, r) in sel.match_expressions.iter().flatten().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        if let Err(m) = check_label_key(&r.key) {
            errs.push(format!("{f}.key"), m);
        }
        let values = r.values.clone().unwrap_or_default();
        let op = match r.operator.as_str() {
            "In" => Some(SelectorOp::In),
            "NotIn" => Some(SelectorOp::NotIn),
            "Exists" => Some(SelectorOp::Exists),
            "DoesNotExist" => Some(SelectorOp::DoesNotExist),
            other => {
                errs.push(
                    format!("{f}.operator"),
                    format!("unsupported operator {other:?} (In, NotIn, Exists or DoesNotExist)"),
                );
                None
            }
        };
        match op {
            Some(SelectorOp::In | SelectorOp::NotIn) if values.is_empty() => errs.push(
                format!("{f}.values"),
                format!("must be non-empty with operator {}", r.operator),
            ),
            Some(SelectorOp::Exists | SelectorOp::DoesNotExist) if !values.is_empty() => errs.push(
                format!("{f}.values"),
                format!("must be empty with operator {}", r.operator),
            ),
            _ => {}
        }
        for (j, v) in values.iter().enumerate() {
            if let Err(m) = check_label_value(v) {
                errs.push(format!("{f}.values[{j}]"), m);
            }
        }
        if let Some(op) = op {
            out.match_expressions.push(Requirement {
                key: r.key.clone(),
                op,
                values,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// NetworkPolicy
// ---------------------------------------------------------------------------

fn port_number(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p != 0)
}

fn policy_port(p: &net::NetworkPolicyPort, field: &str, errs: &mut Errs) -> PolicyPort {
    let protocol = protocol(format!("{field}.protocol"), p.protocol.as_deref(), errs);
    let port = match &p.port {
        None => None,
        Some(IntOrString::Int(n)) => match port_number(*n) {
            Some(n) => Some(PortRef::Number(n)),
            None => {
                errs.push(
                    format!("{field}.port"),
                    format!("{n} is not a valid port number (1-65535)"),
                );
                None
            }
        },
        Some(IntOrString::String(s)) => {
            if let Err(m) = check_port_name(s) {
                errs.push(format!("{field}.port"), m);
            }
            Some(PortRef::Name(s.clone()))
        }
    };
    let mut end_port = None;
    if let Some(e) = p.end_port {
        match &p.port {
            None => errs.push(
                format!("{field}.port"),
                "must be specified when endPort is specified",
            ),
            Some(IntOrString::String(_)) => errs.push(
                format!("{field}.endPort"),
                "may not be specified when port is a named port",
            ),
            Some(IntOrString::Int(start)) => match port_number(e) {
                None => errs.push(
                    format!("{field}.endPort"),
                    format!("{e} is not a valid port number (1-65535)"),
                ),
                Some(_) if e < *start => errs.push(
                    format!("{field}.endPort"),
                    format!("{e} must be greater than or equal to port {start}"),
                ),
                Some(e) => end_port = Some(e),
            },
        }
    }
    PolicyPort {
        protocol,
        port,
        end_port,
    }
}

/// A peer; `None` when it is invalid (the error is recorded).
fn peer(p: &net::NetworkPolicyPeer, field: &str, errs: &mut Errs) -> Option<Peer> {
    let selectors = p.pod_selector.is_some() || p.namespace_selector.is_some();
    match &p.ip_block {
        None if !selectors => {
            errs.push(
                field,
                "must specify a peer (podSelector, namespaceSelector or ipBlock)",
            );
            None
        }
        None => Some(Peer::Pods {
            namespace_selector: p
                .namespace_selector
                .as_ref()
                .map(|s| selector(s, &format!("{field}.namespaceSelector"), errs)),
            pod_selector: p
                .pod_selector
                .as_ref()
                .map(|s| selector(s, &format!("{field}.podSelector"), errs)),
        }),
        Some(_) if selectors => {
            errs.push(
                field,
                "may not specify both ipBlock and another peer (podSelector or namespaceSelector)",
            );
            None
        }
        Some(b) => ip_block(b, &format!("{field}.ipBlock"), errs),
    }
}

fn ip_block(b: &net::IPBlock, field: &str, errs: &mut Errs) -> Option<Peer> {
    if b.cidr.is_empty() {
        errs.push(format!("{field}.cidr"), "required");
        return None;
    }
    let cidr = match b.cidr.parse::<IpNet>() {
        Ok(n) => n.trunc(),
        Err(_) => {
            errs.push(
                format!("{field}.cidr"),
                format!("invalid CIDR {:?}", b.cidr),
            );
            return None;
        }
    };
    let mut except = Vec::new();
    for (i, e) in b.except.iter().flatten().enumerate() {
        let f = format!("{field}.except[{i}]");
        match e.parse::<IpNet>() {
            Err(_) => errs.push(f, format!("invalid CIDR {e:?}")),
            Ok(x) => {
                let x = x.trunc();
                // A strict subset of `cidr`: same family, longer prefix, inside.
                if x.prefix_len() <= cidr.prefix_len() || !cidr.contains(&x.network()) {
                    errs.push(
                        f,
                        format!("{e:?} must be a strict subset of cidr {:?}", b.cidr),
                    );
                } else {
                    except.push(x);
                }
            }
        }
    }
    // `except` holds only nets of `cidr`'s family (checked above).
    match cidr {
        IpNet::V4(cidr) => Some(Peer::IpBlock {
            cidr,
            except: except
                .into_iter()
                .filter_map(|x| match x {
                    IpNet::V4(x) => Some(x),
                    IpNet::V6(_) => None,
                })
                .collect(),
        }),
        IpNet::V6(cidr) => Some(Peer::IpBlock6 {
            cidr,
            except: except
                .into_iter()
                .filter_map(|x| match x {
                    IpNet::V6(x) => Some(x),
                    IpNet::V4(_) => None,
                })
                .collect(),
        }),
    }
}

/// Converts one rule's peers and ports. `None` when every given peer was
/// invalid (the errors are recorded; the rule must not turn into an
/// "every peer" rule).
fn rule(
    peers: Option<&Vec<net::NetworkPolicyPeer>>,
    ports: Option<&Vec<net::NetworkPolicyPort>>,
    field: &str,
    peer_field: &str,
    errs: &mut Errs,
) -> Option<Rule> {
    let given = peers.map_or(0, Vec::len);
    let mut out = Rule::default();
    for (i, p) in peers.into_iter().flatten().enumerate() {
        if let Some(p) = peer(p, &format!("{field}.{peer_field}[{i}]"), errs) {
            out.peers.push(p);
        }
    }
    for (i, p) in ports.into_iter().flatten().enumerate() {
        out.ports
            .push(policy_port(p, &format!("{field}.ports[{i}]"), errs));
    }
    if given > 0 && out.peers.is_empty() {
        return None;
    }
    Some(out)
}

/// Converts a NetworkPolicy (networking.k8s.io/v1) with the API server's
/// defaulting and validation.
pub fn network_policy(np: &net::NetworkPolicy) -> Result<NetworkPolicy, ConvertError> {
    let (namespace, name) = namespaced_name("NetworkPolicy", &np.metadata)?;
    let object = format!("{namespace}/{name}");
    let mut errs = Errs::default();
    let default_spec = net::NetworkPolicySpec::default();
    let spec = np.spec.as_ref().unwrap_or(&default_spec);

    let pod_selector = spec
        .pod_selector
        .as_ref()
        .map(|s| selector(s, "spec.podSelector", &mut errs))
        .unwrap_or_default();

    let mut ingress = Vec::new();
    for (i, r) in spec.ingress.iter().flatten().enumerate() {
        let f = format!("spec.ingress[{i}]");
        if let Some(r) = rule(r.from.as_ref(), r.ports.as_ref(), &f, "from", &mut errs) {
            ingress.push(r);
        }
    }
    let mut egress = Vec::new();
    for (i, r) in spec.egress.iter().flatten().enumerate() {
        let f = format!("spec.egress[{i}]");
        if let Some(r) = rule(r.to.as_ref(), r.ports.as_ref(), &f, "to", &mut errs) {
            egress.push(r);
        }
    }

    let (ingress_isolation, egress_isolation) = match spec.policy_types.as_deref() {
        None | Some([]) => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
        Some(types) => {
            if types.len() > 2 {
                errs.push(
                    "spec.policyTypes",
                    "may not specify more than two policyTypes",
                );
            }
            let (mut i, mut e) = (false, false);
            for (n, t) in types.iter().enumerate() {
                match t.as_str() {
                    "Ingress" => i = true,
                    "Egress" => e = true,
                    other => errs.push(
                        format!("spec.policyTypes[{n}]"),
                        format!("unsupported policy type {other:?} (Ingress or Egress)"),
                    ),
                }
            }
            (i, e)
        }
    };

    errs.finish(
        "NetworkPolicy",
        object,
        NetworkPolicy {
            namespace,
            name,
            uid: np.metadata.uid.clone().unwrap_or_default(),
            pod_selector,
            ingress_isolation,
            egress_isolation,
            ingress,
            egress,
        },
    )
}

mod service;
pub use service::{endpoint_slice, endpoints, service, SERVICE_NAME_LABEL};

#[cfg(test)]
mod tests;
